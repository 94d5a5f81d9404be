//! graceful_consumer's `.wasm` on the test host: a tombstone written by one
//! worker steers the others, expires at exactly its TTL, is cleared by a
//! new instance id (in a response or a probe), membership comes from a
//! scripted admin answer, a client cannot steer hosts itself, and the
//! outbound requests are counted in Envoy stats for the drain gate.

use std::collections::BTreeSet;
use std::time::Duration;

use graceful_core::consumer::decisions::OBSERVE_EVERY;
use graceful_core::consumer::tombstone::{Cause, Change, Observation, Tombstone, Tombstones, Ttls};
use graceful_core::shared::store::SharedStore;
use graceful_emulated_host::{CallAnswer, Filter, Host, SharedData, StreamId, Vm};

const OVERRIDE: &str = "x-graceful-override-host";
const A: &str = "10.0.0.1:8080";
const B: &str = "10.0.0.2:8080";
const C: &str = "10.0.0.3:8080";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Main-thread copy plus two workers.
fn process(config: &str) -> (Host, Vm, Vm) {
    let mut host = Host::new();
    host.start_vm(Filter::Consumer, config);
    let w0 = host.start_vm(Filter::Consumer, config);
    let w1 = host.start_vm(Filter::Consumer, config);
    (host, w0, w1)
}

/// The app sends a request to cluster `providers` through worker `vm`.
fn send(host: &mut Host, vm: Vm, extra: &[(&str, &str)]) -> StreamId {
    let s = host.stream(vm);
    host.set_cluster(s, "providers");
    let mut headers = vec![
        (":method", "GET"),
        (":path", "/"),
        (":authority", "providers"),
    ];
    headers.extend_from_slice(extra);
    host.request_headers(s, &headers, true);
    s
}

/// `upstream` answers stream `s` with these headers; the stream ends.
fn answer(host: &mut Host, s: StreamId, upstream: &str, headers: &[(&str, &str)]) {
    host.set_upstream(s, upstream);
    host.response_headers(s, headers, true);
    host.log(s);
}

/// One full exchange with `upstream`, instance `id`, optionally closing.
fn exchange(host: &mut Host, vm: Vm, upstream: &str, id: &str, closing: bool) -> StreamId {
    let s = send(host, vm, &[]);
    let mut headers = vec![(":status", "200"), ("x-graceful-instance", id)];
    if closing {
        headers.push(("x-graceful-closing", "true"));
    }
    answer(host, s, upstream, &headers);
    s
}

/// `vm` sees each of `members` answer. Without live tombstones a VM copy
/// records who answered for its first response and then one in
/// OBSERVE_EVERY, so each member answers that many times.
fn learn(host: &mut Host, vm: Vm, members: &[(&str, &str)]) {
    for (addr, id) in members {
        for _ in 0..OBSERVE_EVERY {
            exchange(host, vm, addr, id, false);
        }
    }
}

fn tombstones(host: &Host) -> Vec<Tombstone> {
    host.shared_data(graceful_core::shared::keys::TOMBSTONES.name)
        .map(|b| {
            Tombstones::decode(&b)
                .expect("decodable")
                .entries()
                .to_vec()
        })
        .unwrap_or_default()
}

/// The override list a new request from `vm` gets (None: left alone).
fn steering(host: &mut Host, vm: Vm) -> Option<Vec<String>> {
    let s = send(host, vm, &[]);
    let list = host.request_header(s, OVERRIDE);
    host.reset(s);
    list.map(|l| l.split(',').map(str::to_string).collect())
}

fn set(list: &[String]) -> BTreeSet<&str> {
    list.iter().map(String::as_str).collect()
}

#[test]
fn it_steers_every_worker_by_a_tombstone_one_worker_wrote() {
    let (mut host, w0, w1) = process(r#"{"tombstone_ttl":"5s","probe_path":""}"#);
    // Each worker learns the members from answers it sees.
    for vm in [w0, w1] {
        learn(&mut host, vm, &[(A, "a1"), (B, "b1"), (C, "c1")]);
    }
    assert_eq!(
        steering(&mut host, w1),
        None,
        "no tombstone: the LB decides"
    );

    // Worker 0 sees A answer closing.
    host.advance(ms(10));
    exchange(&mut host, w0, A, "a1", true);
    assert_eq!(host.metric("graceful_consumer_evictions"), 1);
    assert_eq!(host.metric("graceful_consumer_tombstones"), 1);
    let t = tombstones(&host);
    assert_eq!(t.len(), 1);
    assert_eq!((t[0].address.as_str(), t[0].instance.as_str()), (A, "a1"));
    assert_eq!(
        (t[0].cluster.as_str(), t[0].cause),
        ("providers", Cause::Closing)
    );
    assert_eq!(t[0].expires_us, host.now_us() + 5_000_000);

    // Worker 1 never saw the mark, yet steers away from A, rotating.
    let first = steering(&mut host, w1).expect("steered");
    let second = steering(&mut host, w1).expect("steered");
    assert_eq!(set(&first), BTreeSet::from([B, C]));
    assert_eq!(set(&second), BTreeSet::from([B, C]));
    assert_ne!(first[0], second[0], "rotated for balance");
    assert_eq!(host.metric("graceful_consumer_steered"), 2);
    // A repeated mark on worker 1 writes nothing new.
    exchange(&mut host, w1, A, "a1", true);
    assert_eq!(host.metric("graceful_consumer_evictions"), 1);
}

#[test]
fn it_expires_a_tombstone_at_exactly_its_ttl() {
    let (mut host, w0, w1) = process(r#"{"tombstone_ttl":"5s","probe_path":""}"#);
    learn(&mut host, w1, &[(A, "a1"), (B, "b1")]);
    host.advance(ms(250));
    exchange(&mut host, w0, A, "a1", true);
    host.advance(Duration::from_secs(5) - Duration::from_micros(1));
    assert_eq!(steering(&mut host, w1), Some(vec![B.to_string()]));
    host.advance(Duration::from_micros(1));
    assert_eq!(steering(&mut host, w1), None, "expired at eviction + 5 s");
}

#[test]
fn it_readmits_an_address_that_answers_with_a_new_instance_id() {
    let (mut host, w0, w1) = process(r#"{"tombstone_ttl":"30s","probe_path":""}"#);
    learn(&mut host, w1, &[(A, "a1"), (B, "b1")]);
    exchange(&mut host, w0, A, "a1", true);
    // The same instance answering without the mark stays tombstoned.
    exchange(&mut host, w1, A, "a1", false);
    assert_eq!(tombstones(&host).len(), 1);
    assert!(steering(&mut host, w1).is_some());
    // A restarted instance on the same address clears it at once.
    exchange(&mut host, w1, A, "a2", false);
    assert_eq!(host.metric("graceful_consumer_readmitted"), 1);
    assert!(tombstones(&host).is_empty());
    assert_eq!(steering(&mut host, w0), None);
    // And when that one closes in turn, it is evicted again.
    exchange(&mut host, w0, A, "a2", true);
    assert_eq!(host.metric("graceful_consumer_evictions"), 2);
    assert_eq!(tombstones(&host)[0].instance, "a2");
}

#[test]
fn it_evicts_on_a_closing_trailer_and_on_the_dubbo_header() {
    let (mut host, w0, _) = process(r#"{"probe_path":""}"#);
    let s = send(&mut host, w0, &[]);
    host.set_upstream(s, A);
    host.response_headers(
        s,
        &[(":status", "200"), ("content-type", "application/grpc")],
        false,
    );
    host.response_body(s, b"\0\0\0\0\0", false);
    host.response_trailers(s, &[("grpc-status", "0"), ("x-graceful-closing", "True")]);
    host.log(s);
    let s = send(&mut host, w0, &[]);
    answer(&mut host, s, B, &[(":status", "200"), ("closing", "TRUE")]);
    let evicted: BTreeSet<String> = tombstones(&host).into_iter().map(|t| t.address).collect();
    assert_eq!(evicted, BTreeSet::from([A.to_string(), B.to_string()]));
}

#[test]
fn it_removes_an_override_header_a_client_sent() {
    let (mut host, w0, _) = process(r#"{"probe_path":""}"#);
    let s = send(
        &mut host,
        w0,
        &[
            (OVERRIDE, "10.9.9.9:80"),
            ("X-Graceful-Override-Host", "10.9.9.8:80"),
        ],
    );
    assert!(host.request_headers_map(s).get_all(OVERRIDE).is_empty());
    host.reset(s);
    // With a tombstone, the filter's own list replaces the client's.
    learn(&mut host, w0, &[(A, "a1"), (B, "b1")]);
    exchange(&mut host, w0, A, "a1", true);
    let s = send(&mut host, w0, &[(OVERRIDE, "10.9.9.9:80")]);
    assert_eq!(
        host.request_headers_map(s).get_all(OVERRIDE),
        vec![B.as_bytes()]
    );
}

fn admin_json() -> String {
    let host = |ip: &str, health: &str| {
        format!(
            r#"{{"address":{{"socket_address":{{"address":"{ip}","port_value":8080}}}},"health_status":{health}}}"#
        )
    };
    format!(
        r#"{{"cluster_statuses":[{{"name":"providers","host_statuses":[{},{},{},{},{}]}},{{"name":"other","host_statuses":[{}]}}]}}"#,
        host("10.0.0.1", r#"{"eds_health_status":"HEALTHY"}"#),
        host("10.0.0.2", r#"{"eds_health_status":"HEALTHY"}"#),
        host(
            "10.0.0.3",
            r#"{"eds_health_status":"HEALTHY","failed_active_health_check":true}"#
        ),
        host("10.0.0.4", r#"{"eds_health_status":"UNHEALTHY"}"#),
        host("10.0.0.5", r#"{"eds_health_status":"DEGRADED"}"#),
        host("10.9.0.1", r#"{"eds_health_status":"HEALTHY"}"#),
    )
}

#[test]
fn it_learns_membership_from_a_scripted_admin_answer() {
    let (mut host, w0, w1) = process(
        r#"{"tombstone_ttl":"30s","admin_cluster":"envoy_admin","membership_refresh":"1s","probe_path":""}"#,
    );
    host.respond("envoy_admin", |_| {
        Some(CallAnswer::new(
            200,
            &[("content-type", "application/json")],
            admin_json(),
        ))
    });
    // Ticks every 100 ms; the lease keeps refreshes to one per second, the
    // first taken at the first tick (100 ms).
    assert_eq!(host.tick_period(w0), Some(ms(100)));
    // Nothing tombstoned: nobody asks the admin.
    host.advance(ms(2500));
    assert!(host.http_calls().is_empty());

    exchange(&mut host, w0, A, "a1", true);
    // Worker 1 has seen no answer at all: without the admin it could not
    // steer. The next refresh (3.1 s) asks for just the clusters concerned.
    assert_eq!(steering(&mut host, w1), None, "no members known yet");
    host.advance_to(ms(3100));
    let calls: Vec<_> = host
        .http_calls()
        .into_iter()
        .filter(|c| c.cluster == "envoy_admin")
        .collect();
    assert_eq!(calls.len(), 1, "one refresh per interval per process");
    assert_eq!(
        calls[0].path(),
        "/clusters?format=json&filter=%5E%28providers%29%24"
    );
    // Usable members minus the tombstoned one: B and the degraded .5; not
    // the failed-health-check .3 nor the EDS-unhealthy .4.
    let list = steering(&mut host, w1).expect("steered");
    assert_eq!(set(&list), BTreeSet::from([B, "10.0.0.5:8080"]));
}

#[test]
fn it_probes_a_tombstoned_host_and_readmits_its_new_instance() {
    let (mut host, w0, w1) = process(r#"{"tombstone_ttl":"30s","membership_refresh":"1s"}"#);
    host.add_cluster("providers");
    learn(&mut host, w1, &[(A, "a1"), (B, "b1")]);
    host.advance_to(ms(500));
    exchange(&mut host, w0, A, "a1", true);
    let expires = tombstones(&host)[0].expires_us;

    // 1.1 s (the lease, first taken at the first tick, 100 ms): one probe,
    // pinned to A through its cluster.
    host.advance_to(ms(1100));
    let probes = host.pending_calls();
    assert_eq!(probes.len(), 1, "{probes:?}");
    let p = &probes[0];
    assert_eq!(
        (p.cluster.as_str(), p.path()),
        ("providers", "/graceful/ready".into())
    );
    assert_eq!(p.header(OVERRIDE).as_deref(), Some(A));
    // Its Host is the address: a cluster name may be no valid Host (Istio's
    // `outbound|80||svc`).
    assert_eq!(p.header(":authority").as_deref(), Some(A));
    // Answered by another host (A left the cluster, override fell back):
    // says nothing about A.
    host.answer_call(
        p.id,
        CallAnswer::new(
            200,
            &[("x-graceful-address", B), ("x-graceful-instance", "b1")],
            "SERVING\n",
        ),
    );
    assert_eq!(tombstones(&host).len(), 1);

    // 2.1 s: A, still the closing instance: the tombstone lasts longer.
    host.advance_to(ms(2100));
    let p = host.pending_calls().remove(0);
    host.answer_call(
        p.id,
        CallAnswer::new(
            503,
            &[("x-graceful-address", A), ("x-graceful-instance", "a1")],
            "",
        ),
    );
    assert_eq!(tombstones(&host)[0].expires_us, expires + 1_600_000);

    // 3.1 s: no answer; the probe times out 1 s later, nothing changes.
    host.advance_to(ms(4100));
    assert_eq!(tombstones(&host).len(), 1);

    // A new instance answers at A: readmitted.
    host.advance_to(ms(5100));
    let p = host.pending_calls().pop().expect("a probe");
    host.answer_call(
        p.id,
        CallAnswer::new(
            200,
            &[("x-graceful-address", A), ("x-graceful-instance", "a2")],
            "",
        ),
    );
    assert!(tombstones(&host).is_empty());
    assert_eq!(host.metric("graceful_consumer_readmitted"), 1);
    assert_eq!(steering(&mut host, w1), None);
}

#[test]
fn it_tombstones_a_host_that_refused_the_connection() {
    let (mut host, w0, _) = process(r#"{"probe_path":""}"#);
    // The router's 503 for a refused connection: flag UF, host known.
    let s = send(&mut host, w0, &[]);
    host.set_response_flags(s, 0x20);
    answer(&mut host, s, A, &[(":status", "503")]);
    let t = tombstones(&host);
    assert_eq!((t.len(), t[0].cause), (1, Cause::ConnectFailure));
    assert_eq!(
        t[0].expires_us,
        host.now_us() + 5_000_000,
        "failure_tombstone_ttl"
    );
    // No healthy upstream (UH): no host to blame. The app's own 503: none.
    let s = send(&mut host, w0, &[]);
    host.set_response_flags(s, 0x2);
    host.response_headers(s, &[(":status", "503")], true);
    host.log(s);
    let s = send(&mut host, w0, &[]);
    answer(&mut host, s, B, &[(":status", "503")]);
    assert_eq!(tombstones(&host).len(), 1);

    let (mut host, w0, _) = process(r#"{"probe_path":"","evict_on_connect_failure":false}"#);
    let s = send(&mut host, w0, &[]);
    host.set_response_flags(s, 0x40);
    answer(&mut host, s, A, &[(":status", "503")]);
    assert!(tombstones(&host).is_empty());
}

/// Another worker's eviction of `address`, written between this worker's
/// read-modify-write of the tombstones and its write (as `Shared::apply`
/// would). The first read is the worker's cache check; the second is the
/// update's.
fn evicted_by_another_worker(address: &'static str, now_us: u64) -> impl FnMut(&SharedData) {
    let mut reads = 0;
    move |store| {
        reads += 1;
        if reads < 2 {
            return;
        }
        let (bytes, cas) = store
            .get(graceful_core::shared::keys::TOMBSTONES.name)
            .unwrap()
            .expect("created at configure");
        let mut list = Tombstones::decode(&bytes).expect("decodable");
        let ttls = Ttls {
            closing: Duration::from_secs(30),
            failure: Duration::from_secs(5),
            warming: None,
        };
        let obs = Observation::ConnectFailure {
            cluster: "providers",
            address,
        };
        assert_eq!(list.observe(&obs, &ttls, now_us, 64), Change::Evicted);
        store
            .set(
                graceful_core::shared::keys::TOMBSTONES.name,
                &list.encode(),
                cas,
            )
            .unwrap();
    }
}

#[test]
fn it_counts_one_eviction_when_two_workers_see_the_first_failure_at_once() {
    // The process's first tombstone: the key exists from configure, so the
    // worker that loses the race re-reads instead of overwriting (a missing
    // key has no CAS to lose on), and counts no eviction of its own.
    let (mut host, w0, _) = process(r#"{"probe_path":""}"#);
    let now = host.now_us();
    host.race_after_read(
        graceful_core::shared::keys::TOMBSTONES.name,
        2,
        evicted_by_another_worker(A, now),
    );
    let s = send(&mut host, w0, &[]);
    host.set_response_flags(s, 0x20);
    answer(&mut host, s, A, &[(":status", "503")]);
    assert_eq!(host.trace().matches("-> CasMismatch").count(), 1);
    assert_eq!(tombstones(&host).len(), 1);
    assert_eq!(
        host.metric("graceful_consumer_evictions"),
        0,
        "the other worker evicted A and counted it"
    );

    // Two different hosts at once: both tombstones are kept.
    let (mut host, w0, _) = process(r#"{"probe_path":""}"#);
    let now = host.now_us();
    host.race_after_read(
        graceful_core::shared::keys::TOMBSTONES.name,
        2,
        evicted_by_another_worker(B, now),
    );
    let s = send(&mut host, w0, &[]);
    host.set_response_flags(s, 0x20);
    answer(&mut host, s, A, &[(":status", "503")]);
    let kept: BTreeSet<String> = tombstones(&host).into_iter().map(|t| t.address).collect();
    assert_eq!(kept, BTreeSet::from([A.to_string(), B.to_string()]));
    assert_eq!(host.metric("graceful_consumer_evictions"), 1);
}

#[test]
fn it_counts_outbound_requests_in_envoy_stats_for_the_drain_gate() {
    // graceful_drain on the same Envoy reads the in-flight gauge and the
    // started counter (get_metric): process-wide stats every copy updates.
    let (mut host, w0, w1) = process(r#"{"probe_path":""}"#);
    let started = host.metric("graceful_consumer_started");
    let a = send(&mut host, w0, &[]);
    host.advance(ms(7));
    let b = send(&mut host, w1, &[]);
    // At once, not on a tick.
    assert_eq!(host.metric("graceful_consumer_inflight"), 2);
    assert_eq!(host.metric("graceful_consumer_started"), started + 2);
    host.reset(a);
    assert_eq!(host.metric("graceful_consumer_inflight"), 1);
    answer(&mut host, b, B, &[(":status", "200")]);
    assert_eq!(host.metric("graceful_consumer_inflight"), 0);
    assert_eq!(host.metric("graceful_consumer_started"), started + 2);
    // Shared data carries no outbound count any more.
    assert_eq!(host.shared_data("graceful.v1.traffic.outbound"), None);
}

#[test]
fn it_moves_the_change_signal_after_each_shared_write() {
    let (mut host, w0, w1) = process(r#"{"probe_path":"","tombstone_ttl":"5s"}"#);
    learn(&mut host, w1, &[(A, "a1"), (B, "b1")]);
    let before = host.metric("graceful_consumer_generation");
    exchange(&mut host, w0, A, "a1", true);
    assert!(
        host.metric("graceful_consumer_generation") > before,
        "a tombstone moves it"
    );
    // The trace shows the order: the shared write, then the bump.
    let trace = host.trace();
    let write = trace.rfind("proxy_set_shared_data(\"graceful.v1.consumer.tombstones\"");
    let bump = trace.rfind("graceful_consumer_generation += 1");
    assert!(write.is_some() && bump > write, "{trace}");
    // And the other worker steers from its next request.
    assert_eq!(steering(&mut host, w1), Some(vec![B.to_string()]));
}

#[test]
fn with_the_admin_membership_an_answer_from_a_tombstoned_host_still_readmits_a_new_instance() {
    // A steered answer without an instance id skips the address (it can
    // readmit nothing); one with an instance id must still be asked about,
    // for `override_host` falls back to its own pick when the listed hosts
    // are unavailable.
    let (mut host, w0, w1) = process(
        r#"{"tombstone_ttl":"30s","admin_cluster":"envoy_admin","membership_refresh":"1s","probe_path":""}"#,
    );
    // The answer of an Envoy that honours `/clusters`'s filter: only the
    // cluster asked for.
    let json = admin_json();
    let only_providers = format!("{}]}}", &json[..json.find(r#",{"name":"other""#).unwrap()]);
    host.respond("envoy_admin", move |_| {
        Some(CallAnswer::new(
            200,
            &[("content-type", "application/json")],
            only_providers.clone(),
        ))
    });
    // Worker 1's first answer is always observed (a sample).
    exchange(&mut host, w1, B, "b1", false);
    exchange(&mut host, w0, A, "a1", true);
    host.advance_to(ms(1100));
    let list = steering(&mut host, w1).expect("steered");
    assert_eq!(set(&list), BTreeSet::from([B, "10.0.0.5:8080"]));
    // The fallback picked A; it answers without an instance id: nothing to
    // readmit, and the address is not read.
    let s = send(&mut host, w1, &[]);
    let mark = host.trace().len();
    answer(&mut host, s, A, &[(":status", "200")]);
    let trace = &host.trace()[mark..];
    assert!(
        !trace.contains("proxy_get_property(upstream.address"),
        "{trace}"
    );
    assert_eq!(tombstones(&host).len(), 1);
    // The closing instance answering unmarked changes nothing either.
    exchange(&mut host, w1, A, "a1", false);
    assert_eq!(tombstones(&host).len(), 1);
    // A new instance there is readmitted at once.
    exchange(&mut host, w1, A, "a2", false);
    assert_eq!(host.metric("graceful_consumer_readmitted"), 1);
    assert!(tombstones(&host).is_empty());
    assert_eq!(steering(&mut host, w0), None);
}
