//! Real Envoy (`--concurrency 2`) running `envoy/consumer-sidecar.yaml`:
//! graceful_consumer in front of a `providers` cluster fed by file-based EDS,
//! with test upstreams standing in for provider sidecars.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use graceful_harness::support::client::{self, load, Conn, Response};
use graceful_harness::support::envoy::{
    envoy_minor, eventually, listener_stats, refusing_port, wait_for, write_eds, write_eds_health,
};
use graceful_harness::support::mesh::{ConsumerSidecar, CLOSING};
use graceful_harness::support::upstream::{Counters, Upstream};

const OVERRIDE: &str = "x-graceful-override-host";

/// One of Envoy's own stats, which must exist: a missing one (renamed,
/// dropped by a stats matcher, a listener not up) fails the test instead
/// of reading as 0 and passing a bound.
async fn envoy_stat(m: &ConsumerSidecar, name: &str) -> u64 {
    m.envoy
        .stat(name)
        .await
        .unwrap_or_else(|| panic!("Envoy has no stat {name}"))
}

/// One of the filter's metrics where a 0 would pass an assertion: it must
/// exist (in some scope; [`ConsumerSidecar::stat`] checks that too).
async fn filter_stat(m: &ConsumerSidecar, name: &str) -> u64 {
    let scopes = m.envoy.custom_stat_scopes(name).await;
    assert!(!scopes.is_empty(), "Envoy has no stat wasmcustom.{name}");
    m.stat(name).await
}

/// Accepted connections per worker on the sidecar's outbound listener.
async fn worker_connections(m: &ConsumerSidecar) -> Vec<u64> {
    let prefix = listener_stats(m.outbound.ip());
    let mut out = Vec::new();
    for w in 0..2 {
        out.push(envoy_stat(m, &format!("{prefix}.worker_{w}.downstream_cx_total")).await);
    }
    out
}

/// Requests on `conns` connections until `stop` says so or `deadline`;
/// returns (responses, failures).
async fn load_until(
    addr: SocketAddr,
    conns: usize,
    deadline: Duration,
    stop: impl Fn() -> bool + Send + Sync + 'static,
) -> (u64, u64) {
    let stop = std::sync::Arc::new(stop);
    let end = Instant::now() + deadline;
    let tasks: Vec<_> = (0..conns)
        .map(|_| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut conn = Conn::http1(addr).await.unwrap();
                let (mut ok, mut failed) = (0, 0);
                while Instant::now() < end && !stop() {
                    match conn.get("/").await {
                        Ok(r) if r.status == 200 => ok += 1,
                        Ok(r) => {
                            eprintln!("failed: {} {:?} {:?}", r.status, r.headers, r.text());
                            failed += 1
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
                (ok, failed)
            })
        })
        .collect();
    let mut total = (0, 0);
    for t in tasks {
        let (ok, failed) = t.await.unwrap();
        total = (total.0 + ok, total.1 + failed);
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn it_steers_both_workers_away_from_a_closing_host_for_the_ttl() {
    let ttl = Duration::from_secs(3);
    let cfg = r#"{"admin_cluster":"envoy_admin","tombstone_ttl":"3s","membership_refresh":"200ms","probe_path":""}"#;
    let m = ConsumerSidecar::start("steer", cfg, 2).await;
    let warm = load(m.outbound, 6, 10, "/").await;
    assert!(warm.iter().all(|r| r.status == 200));
    m.until_membership_refreshed().await;
    assert!(
        m.counts().iter().all(|&c| c > 5),
        "round robin reached all three: {:?}",
        m.counts()
    );

    m.ups[0].set_closing(true);
    let marked_at = m.until_marked().await;
    let at_mark = m.counts();
    let cx_before = worker_connections(&m).await;

    // Continuous load from 8 connections (both workers) until the first new
    // request reaches the closing host.
    let a = m.ups[0].counters.clone();
    let a_at_mark = at_mark[0];
    // The kernel spreads new connections over the workers' listeners by
    // hash: 8 all landed on one worker once (a 1-in-128 chance); with 24
    // that is 1 in 8 million.
    let (ok, failed) = load_until(m.outbound, 24, ttl + Duration::from_secs(5), move || {
        a.app_requests.load(std::sync::atomic::Ordering::SeqCst) > a_at_mark
    })
    .await;
    let back_after = marked_at.elapsed();
    let after = m.counts();
    assert_eq!(failed, 0);
    assert!(
        after[0] > a_at_mark,
        "traffic returns after the TTL: {after:?}"
    );
    assert!(
        back_after >= ttl - Duration::from_millis(200),
        "closing host got a request {back_after:?} after the mark, TTL {ttl:?}"
    );
    assert!(
        back_after < ttl + Duration::from_secs(3),
        "tombstone outlived its TTL: {back_after:?}"
    );
    assert!(
        after[1] - at_mark[1] > 50 && after[2] - at_mark[2] > 50,
        "the others shared the load: {at_mark:?} -> {after:?}"
    );
    assert!(ok > 100);
    let cx_after = worker_connections(&m).await;
    assert!(
        cx_after[0] > cx_before[0] && cx_after[1] > cx_before[1],
        "both workers served the steered load: {cx_before:?} -> {cx_after:?}"
    );
    // Once for the mark, once more when traffic came back and met the mark.
    assert_eq!(m.stat("graceful_consumer_evictions").await, 2);
    // Every request while the tombstone lived was steered; the few sent
    // after it expired (until one reached the host) were not.
    let steered = m.stat("graceful_consumer_steered").await;
    assert!(
        steered + 50 >= ok && steered > 100,
        "steered {steered} of {ok}"
    );
    eprintln!(
        "steered {ok} requests, closing host back after {back_after:?}: {at_mark:?} -> {after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn it_readmits_a_new_instance_at_the_same_address_at_once() {
    let cfg =
        r#"{"admin_cluster":"envoy_admin","tombstone_ttl":"60s","membership_refresh":"200ms"}"#;
    let m = ConsumerSidecar::start("readmit", cfg, 2).await;
    load(m.outbound, 4, 10, "/").await;
    m.until_membership_refreshed().await;
    m.ups[0].set_closing(true);
    m.until_marked().await;
    let at_mark = m.counts()[0];
    // Still the old instance, still closing: probes keep it out.
    let (_, failed) = load_until(m.outbound, 4, Duration::from_secs(1), || false).await;
    assert_eq!(failed, 0);
    assert_eq!(m.counts()[0], at_mark, "no request to the tombstoned host");
    // It restarts: same address, new instance id.
    m.ups[0].set_closing(false);
    m.ups[0].set_instance("a2");
    let restarted = Instant::now();
    let a = m.ups[0].counters.clone();
    load_until(m.outbound, 4, Duration::from_secs(10), move || {
        a.app_requests.load(std::sync::atomic::Ordering::SeqCst) > at_mark
    })
    .await;
    let took = restarted.elapsed();
    assert!(m.counts()[0] > at_mark, "readmitted");
    assert!(
        took < Duration::from_secs(5),
        "readmission took {took:?} with a 60s TTL"
    );
    assert_eq!(m.stat("graceful_consumer_readmitted").await, 1);
    eventually(
        "tombstones gauge back to 0",
        Duration::from_secs(5),
        || async { (filter_stat(&m, "graceful_consumer_tombstones").await == 0).then_some(()) },
    )
    .await;
}

/// The slow-start window the readmission suite configures.
const RAMP: Duration = Duration::from_secs(6);
/// How long load runs after a readmission: the window and some after.
const RAMP_RUN: Duration = Duration::from_secs(9);
/// Share samples: one per this much load.
const RAMP_BUCKET: Duration = Duration::from_millis(500);

/// Host 0 closes, then a new instance answers at its address; once it is
/// readmitted, load runs for [`RAMP_RUN`]: its share of the requests per
/// [`RAMP_BUCKET`] (at the bucket's middle, seconds since readmission).
async fn readmitted_share(name: &str, extra: &str) -> Vec<(f64, f64)> {
    let cfg = format!(
        r#"{{"admin_cluster":"envoy_admin","tombstone_ttl":"60s","membership_refresh":"200ms"{extra}}}"#
    );
    let m = ConsumerSidecar::start(name, &cfg, 2).await;
    load(m.outbound, 4, 10, "/").await;
    m.until_membership_refreshed().await;
    m.ups[0].set_closing(true);
    m.until_marked().await;
    m.ups[0].set_closing(false);
    m.ups[0].set_instance("a2");
    // A probe readmits it (no request reaches it before: none is sent).
    eventually("readmitted", Duration::from_secs(10), || async {
        (m.stat("graceful_consumer_readmitted").await == 1).then_some(())
    })
    .await;
    let start = Instant::now();
    let traffic = tokio::spawn(load_until(m.outbound, 4, RAMP_RUN, || false));
    let mut shares = Vec::new();
    let mut last = m.counts();
    let mut at = start;
    while start.elapsed() < RAMP_RUN {
        // A fixed sampling period: this measures, it waits for nothing.
        at += RAMP_BUCKET;
        tokio::time::sleep_until(at.into()).await;
        let now = m.counts();
        let served: Vec<u64> = now.iter().zip(&last).map(|(n, l)| n - l).collect();
        let total: u64 = served.iter().sum();
        assert!(total > 20, "load ran: {served:?}");
        let mid = (at - start).as_secs_f64() - RAMP_BUCKET.as_secs_f64() / 2.0;
        shares.push((mid, served[0] as f64 / total as f64));
        last = now;
    }
    let (ok, failed) = traffic.await.unwrap();
    assert_eq!(failed, 0);
    assert!(ok > 1000, "{ok} requests");
    shares
}

/// The mean share over samples between `from` and `to` seconds.
fn mean_share(shares: &[(f64, f64)], from: f64, to: f64) -> f64 {
    let inside: Vec<f64> = shares
        .iter()
        .filter(|(t, _)| (from..to).contains(t))
        .map(|(_, s)| *s)
        .collect();
    assert!(!inside.is_empty(), "no sample in {from}..{to}: {shares:?}");
    inside.iter().sum::<f64>() / inside.len() as f64
}

/// With `readmit_slow_start` a readmitted instance's share follows Envoy's
/// ramp (three hosts, window 6 s, 10% floor: 5% at first, 20% half way,
/// a third once the window ends); without it, a third at once. Writes
/// `slow-start.svg` into `GRACEFUL_CHART_DIR` when that is set
/// (`make slow-start-chart`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_readmitted_instance_ramps_up_over_the_slow_start_window_and_at_once_without() {
    let off = readmitted_share("ramp-off", "").await;
    let on = readmitted_share("ramp-on", r#","readmit_slow_start":{"window":"6s"}"#).await;
    eprintln!("on: {on:.3?}\noff: {off:.3?}");
    let first_on = mean_share(&on, 0.0, 1.0);
    let half_way = mean_share(&on, 2.5, 3.5);
    let after_on = mean_share(&on, 7.0, 9.0);
    assert!(
        first_on < 0.12,
        "first second with slow start: {first_on:.3}"
    );
    assert!(
        (0.12..0.3).contains(&half_way),
        "half way through the window: {half_way:.3} (Envoy's ramp: 0.2)"
    );
    assert!(after_on > 0.25, "after the window: {after_on:.3}");
    let first_off = mean_share(&off, 0.0, 1.0);
    assert!(first_off > 0.25, "first second without: {first_off:.3}");
    if let Some(dir) = std::env::var_os("GRACEFUL_CHART_DIR") {
        let ss = graceful_core::consumer::config::SlowStart {
            window: RAMP,
            aggression: 1.0,
            min_weight_percent: 10,
        };
        let expected: Vec<(f64, f64)> = (0..=90)
            .map(|i| {
                let t = f64::from(i) / 10.0;
                let w = ss.weight(Duration::from_secs_f64(t));
                (t, w / (w + 2.0))
            })
            .collect();
        use graceful_harness::support::share_chart::{share_chart, ShareSeries};
        let (major, minor) = envoy_minor();
        let delivery = match graceful_harness::support::native::Delivery::from_env() {
            graceful_harness::support::native::Delivery::Wasm => "wasm",
            graceful_harness::support::native::Delivery::Native => "native",
        };
        let title = format!(
            "A readmitted instance's share of requests (one of three hosts): Envoy {major}.{minor}, {delivery}"
        );
        let svg = share_chart(
            &title,
            &[
                ShareSeries {
                    label: "readmit_slow_start window 6s",
                    color: "#1f77b4",
                    points: &on,
                },
                ShareSeries {
                    label: "without (the default)",
                    color: "#d62728",
                    points: &off,
                },
            ],
            ("Envoy's slow_start_config ramp, expected", &expected),
            RAMP_RUN.as_secs_f64(),
            ("window ends", RAMP.as_secs_f64()),
        );
        let path = std::path::Path::new(&dir).join("slow-start.svg");
        std::fs::write(&path, svg).unwrap();
        eprintln!("wrote {}", path.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn it_keeps_a_tombstoned_host_out_while_the_registry_flaps() {
    let cfg =
        r#"{"admin_cluster":"envoy_admin","tombstone_ttl":"5s","membership_refresh":"200ms"}"#;
    let m = ConsumerSidecar::start("late-eds", cfg, 2).await;
    load(m.outbound, 4, 10, "/").await;
    m.until_membership_refreshed().await;
    m.ups[0].set_closing(true);
    let marked_at = m.until_marked().await;
    let at_mark = m.counts()[0];
    // The instance stops marking (drained, not restarted: same id).
    m.ups[0].set_closing(false);
    // The registry flaps while load runs: dropped, re-added (a late update
    // resurrecting it), five times over.
    let all: Vec<SocketAddr> = m.ups.iter().map(|u| u.addr).collect();
    let until =
        Duration::from_secs(5).saturating_sub(marked_at.elapsed() + Duration::from_millis(300));
    let traffic = tokio::spawn(load_until(m.outbound, 6, until, || false));
    for _ in 0..5 {
        write_eds(&m.eds, "providers", &all[1..]);
        m.wait_members(2).await;
        write_eds(&m.eds, "providers", &all);
        m.wait_members(3).await;
    }
    let (ok, failed) = traffic.await.unwrap();
    assert_eq!(failed, 0);
    assert!(ok > 50);
    assert_eq!(
        m.counts()[0],
        at_mark,
        "re-added host got traffic within its tombstone's life"
    );
    // After the TTL it is back.
    let a = m.ups[0].counters.clone();
    load_until(m.outbound, 4, Duration::from_secs(8), move || {
        a.app_requests.load(std::sync::atomic::Ordering::SeqCst) > at_mark
    })
    .await;
    assert!(m.counts()[0] > at_mark, "traffic returns after the TTL");
}

/// Two live test upstreams (instances b1 and c1) beside a failing host.
async fn live_upstreams() -> Vec<Upstream> {
    let mut ups = Vec::new();
    for id in ["b1", "c1"] {
        let u = Upstream::start().await;
        u.set_instance(id);
        ups.push(u);
    }
    ups
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn it_evicts_a_host_that_refuses_connections_for_the_failure_ttl() {
    // No retries, so a connect failure reaches the filter as a local reply
    // (with retries Envoy carries the request elsewhere and the filter sees
    // only the final answer).
    let cfg = r#"{"admin_cluster":"envoy_admin","failure_tombstone_ttl":"2s","membership_refresh":"200ms"}"#;
    let ups = live_upstreams().await;
    let dead = SocketAddr::from(([127, 0, 0, 1], refusing_port()));
    let endpoints = [dead, ups[0].addr, ups[1].addr];
    let m = ConsumerSidecar::with_endpoints("refused", cfg, 0, ups, &endpoints).await;
    let conns = 4;
    let started = Instant::now();
    let (ok, failed) = load_until(m.outbound, conns, Duration::from_secs(5), || false).await;
    let secs = started.elapsed().as_secs_f64();
    // Without eviction a third of the requests would fail. With it, only
    // the requests in flight when the host was first picked: the consumer's
    // probes then meet the refusal too and keep the tombstone alive for as
    // long as the host refuses (longer than the 2 s failure TTL).
    assert!(ok > 200, "load ran: {ok} ok in {secs:.1}s");
    assert!(failed >= 1, "the dead host was tried");
    assert!(
        failed <= conns as u64,
        "{failed} failures in {secs:.1}s ({ok} ok)"
    );
    assert_eq!(m.stat("graceful_consumer_evictions").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn it_ignores_override_headers_sent_by_clients() {
    let cfg = r#"{"admin_cluster":"envoy_admin","tombstone_ttl":"60s","membership_refresh":"200ms","probe_path":""}"#;
    let m = ConsumerSidecar::start("forged-override", cfg, 2).await;
    let a = m.ups[0].addr.to_string();
    let mut conn = Conn::http1(m.outbound).await.unwrap();
    for _ in 0..60 {
        let r = conn
            .send("GET", "/", &[(OVERRIDE, a.as_str())], Default::default())
            .await
            .unwrap();
        assert_eq!(r.status, 200);
    }
    let c = m.counts();
    assert!(
        c[0] < 40 && c[1] > 10 && c[2] > 10,
        "a client picked the host: {c:?}"
    );
    // With the host tombstoned, a client naming it still cannot reach it.
    m.ups[0].set_closing(true);
    m.until_marked().await;
    let at_mark = m.counts()[0];
    for _ in 0..60 {
        let r = conn
            .send("GET", "/", &[(OVERRIDE, a.as_str())], Default::default())
            .await
            .unwrap();
        assert_eq!(r.status, 200);
    }
    assert_eq!(m.counts()[0], at_mark);
    let r = client::request(m.outbound, "GET", "/", &[(CLOSING, "true")])
        .await
        .unwrap();
    assert_eq!(r.status, 200, "a closing header in a request means nothing");
    assert_eq!(m.stat("graceful_consumer_evictions").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn it_keeps_tombstone_memory_bounded_while_10000_hosts_churn() {
    // 10,000 endpoints that refuse connections (loopback, nothing listening),
    // no retries: every request evicts a host the consumer has not seen.
    let port = refusing_port();
    let endpoints: Vec<SocketAddr> = (0..10_000u32)
        .map(|i| SocketAddr::from(([127, 1, (i / 250) as u8, (i % 250 + 1) as u8], port)))
        .collect();
    let cfg = r#"{"failure_tombstone_ttl":"60s","max_tombstones":64,"probe_path":""}"#;
    let m = ConsumerSidecar::with_endpoints("churn", cfg, 0, Vec::new(), &endpoints).await;
    let mut samples = Vec::new();
    for round in 0..5 {
        let rs = load(m.outbound, 8, 250, "/").await;
        assert!(rs.iter().all(|r| r.status == 503), "every host refuses");
        let evictions = m.stat("graceful_consumer_evictions").await;
        let live = m.stat("graceful_consumer_tombstones").await;
        let bytes = m.stat("graceful_consumer_tombstone_bytes").await;
        samples.push((evictions, live, bytes));
        assert!(live <= 64, "round {round}: {live} tombstones kept");
        assert!(
            bytes <= 64 * 64,
            "round {round}: tombstone value {bytes} bytes"
        );
    }
    let (evictions, _, bytes) = samples[samples.len() - 1];
    // Each worker's round robin starts at a random host. Usually the two
    // walks are far apart and all 10,000 hosts are evicted; when one walk
    // trails the other by less than max_tombstones, it meets hosts still
    // tombstoned, so at least one worker's 5,000 are new.
    assert!(
        evictions >= 4_900,
        "thousands of distinct hosts evicted: {evictions}"
    );
    eprintln!("(evictions, live tombstones, tombstone bytes) per 2,000 requests: {samples:?}");
    assert!(bytes > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn it_evicts_a_refusing_host_even_when_retries_hide_the_failure() {
    // With retries, the client never sees the refused connection; the
    // upstream instance of the filter (one per attempt) still does.
    let cfg = r#"{"admin_cluster":"envoy_admin","failure_tombstone_ttl":"3s","membership_refresh":"200ms"}"#;
    let ups = live_upstreams().await;
    let dead = SocketAddr::from(([127, 0, 0, 1], refusing_port()));
    let endpoints = [dead, ups[0].addr, ups[1].addr];
    let m = ConsumerSidecar::with_endpoints("refused-retried", cfg, 2, ups, &endpoints).await;
    let (ok, failed) = load_until(m.outbound, 4, Duration::from_secs(2), || false).await;
    assert_eq!(failed, 0, "retries carried every request");
    assert!(ok > 200, "load ran: {ok}");
    assert_eq!(
        m.stat("graceful_consumer_evictions").await,
        1,
        "evicted on its first refused connection"
    );
    // Only the requests that picked the dead host before its first refusal
    // came back met it (and were retried): a few on each worker, as many
    // as were sent in those milliseconds (seen: 1 to 6 on 4 connections).
    // Once it is tombstoned no request is sent its way. (Its refused
    // connections go on: the consumer's probes, which keep the tombstone
    // alive while it refuses.)
    let retries = "cluster.providers.upstream_rq_retry";
    let retried = envoy_stat(&m, retries).await;
    assert!(
        retried <= 16,
        "{retried} requests retried off the dead host, of {ok}"
    );
    let (more, failed) = load_until(m.outbound, 4, Duration::from_secs(1), || false).await;
    let retried_after = envoy_stat(&m, retries).await - retried;
    eprintln!(
        "{retried} requests retried off the dead host, of {ok}; then {retried_after} of {more}"
    );
    assert_eq!(failed, 0);
    assert!(more > 100, "load ran: {more}");
    assert_eq!(
        retried_after, 0,
        "requests sent to the tombstoned host: {retried_after} of {more}"
    );
}

#[test]
fn it_refuses_to_start_when_the_stats_matcher_drops_its_stats() {
    // The outbound count (graceful_consumer_inflight) and the change signal
    // (graceful_consumer_generation) are Envoy stats; one that the
    // stats_matcher rejects is a null stat reading 0, so the filter refuses
    // to configure, saying so, and Envoy does not start with it.
    let wasm = graceful_harness::support::envoy::wasm_dir().join("graceful_consumer.wasm");
    for dropped in ["graceful_consumer_inflight", "graceful_consumer_generation"] {
        let config = serde_json::json!({
            "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
            "stats_config": {"stats_matcher": {"exclusion_list": {"patterns": [{"prefix": format!("wasmcustom.{dropped}")}]}}},
            "static_resources": {"listeners": [{
                "name": "l",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "l",
                        "route_config": {"virtual_hosts": [{"name": "a", "domains": ["*"], "routes": [{"match": {"prefix": "/"}, "direct_response": {"status": 200}}]}]},
                        "http_filters": [
                            {"name": "graceful_consumer", "typed_config": {
                                "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
                                "config": {
                                    "name": "graceful_consumer",
                                    "root_id": "graceful_consumer",
                                    "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": "{}"},
                                    "vm_config": {"vm_id": "graceful", "runtime": "envoy.wasm.runtime.v8", "code": {"local": {"filename": wasm.display().to_string()}}}
                                }
                            }},
                            {"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
                        ]
                    }
                }]}]
            }]}
        });
        let path = graceful_harness::support::envoy::scratch_path(
            &format!("stats-matcher-{dropped}"),
            "json",
        );
        std::fs::write(&path, config.to_string()).unwrap();
        let mut child =
            std::process::Command::new(graceful_harness::support::envoy::envoy_binary())
                .arg("-c")
                .arg(&path)
                .args(["--concurrency", "1", "--disable-hot-restart"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("Envoy started with {dropped} dropped by its stats_matcher");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let out = child.wait_with_output().unwrap();
        let log = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!status.success(), "{log}");
        let line = log
            .lines()
            .find(|l| l.contains("graceful_consumer: Envoy drops the stat(s)"))
            .unwrap_or_else(|| panic!("no refusal line:\n{log}"));
        assert!(
            line.contains(dropped)
                && line.contains("stats_matcher")
                && line.contains("wasmcustom.graceful_"),
            "{line}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn it_tombstones_no_host_when_clients_cancel_slow_requests() {
    // Clients that give up on slow requests (a gRPC deadline, a user
    // closing the page) say nothing about the host: it stays in rotation.
    let cfg = r#"{"admin_cluster":"envoy_admin","failure_tombstone_ttl":"60s","membership_refresh":"200ms"}"#;
    let m = ConsumerSidecar::start("cancels", cfg, 2).await;
    load(m.outbound, 4, 10, "/").await;
    m.until_membership_refreshed().await;
    let cancels: Vec<_> = (0..12)
        .map(|_| {
            tokio::spawn(graceful_harness::support::client::abort_after(
                m.outbound,
                "/delay/2000",
                Duration::from_millis(150),
            ))
        })
        .collect();
    for c in cancels {
        c.await.unwrap().unwrap();
    }
    // Every host still takes its share.
    let before = m.counts();
    let rs = load(m.outbound, 6, 30, "/").await;
    assert!(rs.iter().all(|r| r.status == 200));
    let after = m.counts();
    for i in 0..3 {
        assert!(
            after[i] > before[i] + 20,
            "host {i} left out after the cancels: {before:?} -> {after:?}"
        );
    }
    assert_eq!(filter_stat(&m, "graceful_consumer_evictions").await, 0);
    assert_eq!(filter_stat(&m, "graceful_consumer_steered").await, 0);
}

// Sharing the load while hosts close. A tombstone must steer requests to the
// other usable hosts, all of them, whatever the source of membership: each
// scenario runs with membership from Envoy's admin (`with_admin`) and with
// membership learnt from answers only (`without_admin`, the default).

/// Where the consumer learns a cluster's members.
#[derive(Clone, Copy, Debug)]
enum Membership {
    Admin,
    Observed,
}

impl Membership {
    /// The consumer's configuration: the membership source and `extra`.
    fn config(self, extra: &[(&str, &str)]) -> String {
        let mut cfg = serde_json::Map::new();
        if let Membership::Admin = self {
            cfg.insert("admin_cluster".into(), "envoy_admin".into());
            cfg.insert("membership_refresh".into(), "200ms".into());
        }
        for (field, value) in extra {
            cfg.insert((*field).into(), (*value).into());
        }
        serde_json::Value::Object(cfg).to_string()
    }

    fn label(self) -> &'static str {
        match self {
            Membership::Admin => "admin",
            Membership::Observed => "observed",
        }
    }
}

/// Two tests of one scenario, `$scenario::with_admin` and
/// `$scenario::without_admin`: the async fn `$scenario(Membership)`.
macro_rules! with_and_without_admin {
    ($scenario:ident) => {
        mod $scenario {
            use super::Membership;

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn with_admin() {
                super::$scenario(Membership::Admin).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn without_admin() {
                super::$scenario(Membership::Observed).await
            }
        }
    };
}

const INSTANCE: &str = "x-graceful-instance";
/// Connections of the continuous load (the kernel spreads them over both
/// workers by hash).
const CONNS: usize = 8;
/// One measured split: 90 requests, 10 on each of 9 connections.
const SPLIT: (usize, usize) = (9, 10);
/// How long a host that was seen closing goes on draining under load before
/// it restarts (the scenario's timing, not a wait for anything).
const DRAIN: Duration = Duration::from_millis(500);

/// Host `host`'s instance id in its `generation` (1 at start).
fn instance(host: usize, generation: u32) -> String {
    format!("h{host}.{generation}")
}

/// The host an instance id names.
fn host_of(instance: &str) -> Option<usize> {
    instance.strip_prefix('h')?.split('.').next()?.parse().ok()
}

/// `n` hosts (instances h0.1 ...) behind the consumer sidecar, warmed up by
/// a short load (`n` requests on each of 6 connections: a worker's round
/// robin reaches every host); with the admin, also until its membership was
/// read.
async fn share_mesh(
    scenario: &str,
    membership: Membership,
    extra: &[(&str, &str)],
    n: usize,
) -> ConsumerSidecar {
    let name = format!("{scenario}-{}", membership.label());
    let m = ConsumerSidecar::with_instances(
        &name,
        &membership.config(extra),
        2,
        (0..n).map(|h| instance(h, 1)),
    )
    .await;
    let warm = load(m.outbound, 6, n, "/").await;
    assert!(warm.iter().all(|r| r.status == 200));
    if let Membership::Admin = membership {
        m.until_membership_refreshed().await;
    }
    m
}

/// App requests per host between two [`ConsumerSidecar::counts`].
fn split(before: &[u64], after: &[u64]) -> Vec<u64> {
    before.iter().zip(after).map(|(b, a)| a - b).collect()
}

/// 90 requests on 9 connections (every answer 200); the app requests per
/// host they made.
async fn measure_split(m: &ConsumerSidecar) -> Vec<u64> {
    let before = m.counts();
    let rs = load(m.outbound, SPLIT.0, SPLIT.1, "/").await;
    let after = m.counts();
    let failed: Vec<_> = rs.iter().filter(|r| r.status != 200).collect();
    assert!(failed.is_empty(), "failed requests: {failed:?}");
    split(&before, &after)
}

/// Sets `host` closing and sends requests on one connection, nothing else
/// in flight, until its instance answers closing; returns the app requests
/// it had then (exact: no request can reach it unseen).
async fn mark(m: &ConsumerSidecar, host: usize) -> u64 {
    m.ups[host].set_closing(true);
    let before = m.counts();
    let mut conn = Conn::http1(m.outbound).await.unwrap();
    for _ in 0..200 {
        let r = conn.get("/").await.unwrap();
        assert_eq!(r.status, 200, "{r:?}");
        let marked = r.header(CLOSING).as_deref() == Some("true");
        if marked && r.header(INSTANCE).as_deref().and_then(host_of) == Some(host) {
            return m.ups[host].app_requests();
        }
    }
    panic!(
        "host {host} never answered closing in 200 requests, which went {:?}",
        split(&before, &m.counts())
    )
}

/// Marks `closing` hosts one after another ([`mark`]), then sends 90
/// requests. Returns their split and, per closing host, the app requests
/// it got from its mark on.
async fn close_and_split(m: &ConsumerSidecar, closing: &[usize]) -> (Vec<u64>, Vec<u64>) {
    let mut at_mark = Vec::new();
    for &h in closing {
        at_mark.push(mark(m, h).await);
    }
    let split = measure_split(m).await;
    let since_mark = closing
        .iter()
        .zip(at_mark)
        .map(|(&h, at)| m.ups[h].app_requests() - at)
        .collect();
    (split, since_mark)
}

/// The closing hosts got no request from their marks on, and each of the
/// others at least two thirds of an even share of the 90.
fn assert_left_to_the_others(split: &[u64], closing: &[usize], since_mark: &[u64]) {
    assert!(
        since_mark.iter().all(|&n| n == 0),
        "closing hosts {closing:?} got requests after their mark was seen: {since_mark:?}"
    );
    let others = (split.len() - closing.len()) as u64;
    let least = (SPLIT.0 * SPLIT.1) as u64 * 2 / (3 * others);
    for (h, &n) in split.iter().enumerate() {
        assert!(
            closing.contains(&h) || n >= least,
            "host {h} got fewer than {least} of 90: {split:?}"
        );
    }
}

/// Hosts 0 .. `closing` of `n` close: the others share the load.
async fn closing_hosts_leave_the_load_to_the_others(
    scenario: &str,
    membership: Membership,
    n: usize,
    closing: usize,
) {
    let m = share_mesh(scenario, membership, &[], n).await;
    let closing: Vec<usize> = (0..closing).collect();
    let (split, since_mark) = close_and_split(&m, &closing).await;
    eprintln!(
        "{scenario} ({membership:?}): hosts {closing:?} closing; 90 requests split {split:?}; \
         app requests to the closing hosts after their mark {since_mark:?}"
    );
    assert_left_to_the_others(&split, &closing, &since_mark);
    if let Membership::Admin = membership {
        assert_admin_source(&m.envoy.log());
    }
}

/// Envoy before 1.38 ignores `/clusters`'s filter: the consumer said so
/// and turned to the config dump (whose membership the split above used);
/// a later Envoy never made it turn.
fn assert_admin_source(log: &str) {
    let turned = log.contains("membership is read from /config_dump from now on");
    let minor = envoy_minor();
    assert_eq!(
        turned,
        minor < (1, 38),
        "Envoy {minor:?}: turned to the config dump {turned}; log:\n{log}"
    );
}

async fn it_shares_the_load_when_one_of_three_hosts_closes(membership: Membership) {
    closing_hosts_leave_the_load_to_the_others("share-1-of-3", membership, 3, 1).await;
}
with_and_without_admin!(it_shares_the_load_when_one_of_three_hosts_closes);

async fn it_shares_the_load_when_three_of_six_hosts_close(membership: Membership) {
    closing_hosts_leave_the_load_to_the_others("share-3-of-6", membership, 6, 3).await;
}
with_and_without_admin!(it_shares_the_load_when_three_of_six_hosts_close);

// Scale-downs by more than half (the panic floor, 50 by default, lists no
// host whose last answer said closing): the hosts left take every request.
async fn it_leaves_the_load_to_the_one_host_left_when_two_of_three_close(membership: Membership) {
    closing_hosts_leave_the_load_to_the_others("share-2-of-3", membership, 3, 2).await;
}
with_and_without_admin!(it_leaves_the_load_to_the_one_host_left_when_two_of_three_close);

async fn it_leaves_the_load_to_the_two_hosts_left_when_four_of_six_close(membership: Membership) {
    closing_hosts_leave_the_load_to_the_others("share-4-of-6", membership, 6, 4).await;
}
with_and_without_admin!(it_leaves_the_load_to_the_two_hosts_left_when_four_of_six_close);

async fn it_still_answers_from_several_hosts_when_every_host_closes(membership: Membership) {
    let m = share_mesh("share-all-closing", membership, &[], 3).await;
    // Host 0 closes with two hosts open: they take its load.
    let (first, since_mark) = close_and_split(&m, &[0]).await;
    // Then the two others: each request still answered, by several hosts.
    // (Host 0 is no longer checked: with no host open the balancer picks
    // among all of them.)
    let (split, _) = close_and_split(&m, &[1, 2]).await;
    eprintln!(
        "share-all-closing ({membership:?}): host 0 closing, 90 requests split {first:?}, app \
         requests to it after its mark {since_mark:?}; then every host closing, 90 requests \
         split {split:?}"
    );
    assert_left_to_the_others(&first, &[0], &since_mark);
    assert!(
        split.iter().filter(|&&c| c > 0).count() >= 2,
        "all 90 requests went to one host: {split:?}"
    );
}
with_and_without_admin!(it_still_answers_from_several_hosts_when_every_host_closes);

/// A host's first closing mark as the load saw it.
#[derive(Clone, Debug)]
struct Seen {
    at: Instant,
    /// The instance that answered closing.
    instance: String,
    /// Requests answered per connection at that moment: the ones in flight
    /// then may still reach the host.
    done: Vec<u64>,
}

/// What the load saw, per connection and per host (the host is told by the
/// instance id the app stamps on every answer).
#[derive(Clone)]
struct Watched {
    /// Per connection: requests answered.
    done: Vec<u64>,
    /// Per host: answers.
    served: Vec<u64>,
    /// Per host: its first closing mark.
    seen: Vec<Option<Seen>>,
    /// Per host: requests that began after its mark was seen and that its
    /// marked instance answered anyway.
    late: Vec<u64>,
    failed: u64,
    /// Every answer a host's instance stamped, in the order they came back:
    /// when, and which host.
    answers: Vec<(Instant, usize)>,
}

impl Watched {
    fn record(&mut self, conn: usize, started: Instant, r: &Response) {
        self.done[conn] += 1;
        if r.status != 200 {
            eprintln!("failed: {} {:?} {:?}", r.status, r.headers, r.text());
            self.failed += 1;
            return;
        }
        let Some(id) = r.header(INSTANCE) else {
            return;
        };
        let Some(host) = host_of(&id).filter(|&h| h < self.served.len()) else {
            return;
        };
        self.served[host] += 1;
        self.answers.push((Instant::now(), host));
        match &self.seen[host] {
            Some(seen) if seen.instance == id && started > seen.at => self.late[host] += 1,
            Some(_) => {}
            None if r.header(CLOSING).as_deref() == Some("true") => {
                self.seen[host] = Some(Seen {
                    at: Instant::now(),
                    instance: id,
                    done: self.done.clone(),
                })
            }
            None => {}
        }
    }
}

/// Continuous load on `conns` keep-alive HTTP/1.1 connections, every
/// answer watched, until [`Traffic::stop`] (or dropped: a test that failed).
struct Traffic {
    watched: Arc<Mutex<Watched>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Traffic {
    fn start(addr: SocketAddr, hosts: usize, conns: usize) -> Traffic {
        let watched = Arc::new(Mutex::new(Watched {
            done: vec![0; conns],
            served: vec![0; hosts],
            seen: vec![None; hosts],
            late: vec![0; hosts],
            failed: 0,
            answers: Vec::new(),
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..conns)
            .map(|c| {
                let (watched, stop) = (watched.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut conn = Conn::http1(addr).await.unwrap();
                    while !stop.load(Ordering::SeqCst) {
                        let started = Instant::now();
                        let r = conn.get("/").await.unwrap_or_else(|e| panic!("{e}"));
                        watched.lock().unwrap().record(c, started, &r);
                    }
                })
            })
            .collect();
        Traffic {
            watched,
            stop,
            tasks,
        }
    }

    fn watched<T>(&self, f: impl FnOnce(&Watched) -> T) -> T {
        f(&self.watched.lock().unwrap())
    }

    /// Sets `host` closing, waits until the load saw it answer so and every
    /// request in flight at that moment was answered, and lets it drain
    /// under load until [`DRAIN`] after it was seen. Returns the app
    /// requests it got from then to the end of the drain.
    async fn close_and_drain(&self, m: &ConsumerSidecar, host: usize) -> u64 {
        let before = self.watched(|w| w.served.clone());
        m.ups[host].set_closing(true);
        let seen = wait_for(
            &format!("host {host} seen answering closing"),
            Duration::from_secs(5),
            || async { self.watched(|w| w.seen[host].clone()) },
        )
        .await
        .unwrap_or_else(|e| {
            let served = self.watched(|w| split(&before, &w.served));
            panic!("{e}; answers per host meanwhile: {served:?}")
        });
        eventually(
            "the requests in flight at the mark answered",
            Duration::from_secs(10),
            || async {
                self.watched(|w| w.done.iter().zip(&seen.done).all(|(d, s)| d > s))
                    .then_some(())
            },
        )
        .await;
        let at_settled = m.ups[host].app_requests();
        tokio::time::sleep_until((seen.at + DRAIN).into()).await;
        m.ups[host].app_requests() - at_settled
    }

    async fn stop(mut self) -> Watched {
        self.stop.store(true, Ordering::SeqCst);
        for t in std::mem::take(&mut self.tasks) {
            t.await.unwrap();
        }
        self.watched(Watched::clone)
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The load's share per host is measured over windows this long.
const WINDOW: Duration = Duration::from_millis(500);

/// App requests per host in each [`WINDOW`], sampled while the load runs
/// (and printed as they come, so a failing run shows them too).
struct Windows {
    samples: Arc<Mutex<Vec<Vec<u64>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Windows {
    fn start(m: &ConsumerSidecar, label: String) -> Windows {
        let counters: Vec<Arc<Counters>> = m.ups.iter().map(|u| u.counters.clone()).collect();
        let samples = Arc::new(Mutex::new(Vec::new()));
        let record = samples.clone();
        let task = tokio::spawn(async move {
            let count = || -> Vec<u64> {
                counters
                    .iter()
                    .map(|c| c.app_requests.load(Ordering::SeqCst))
                    .collect()
            };
            let mut last = count();
            let mut tick = tokio::time::interval(WINDOW);
            tick.tick().await;
            loop {
                tick.tick().await;
                let now = count();
                let window = split(&last, &now);
                let mut record = record.lock().unwrap();
                eprintln!("{label} window {}: {window:?}", record.len());
                record.push(window);
                last = now;
            }
        });
        Windows { samples, task }
    }

    fn stop(self) -> Vec<Vec<u64>> {
        self.samples.lock().unwrap().clone()
    }
}

impl Drop for Windows {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Consecutive answers a host's share is judged over, and the longest one
/// host may take more than half of them through a full restart.
const RUN: usize = 36;
const HOLD: Duration = Duration::from_secs(2);

/// The longest stretch in which one host took more than half of every
/// [`RUN`] consecutive answers (`answers` in order, as
/// [`Watched::answers`]): the host, the time from the first answer of the
/// stretch's first run to the last of its last, and its runs. None if no
/// host ever took more than half of a run.
fn longest_hold(answers: &[(Instant, usize)], hosts: usize) -> Option<(usize, Duration, usize)> {
    let mut counts = vec![0usize; hosts];
    let mut longest: Option<(usize, Duration, usize)> = None;
    // The stretch under way: its host, where it began, its runs.
    let mut current: Option<(usize, Instant, usize)> = None;
    for (i, &(at, host)) in answers.iter().enumerate() {
        counts[host] += 1;
        if i >= RUN {
            counts[answers[i - RUN].1] -= 1;
        }
        let Some(first) = (i + 1).checked_sub(RUN).map(|f| answers[f].0) else {
            continue;
        };
        let majority = counts.iter().position(|&n| n * 2 > RUN);
        current = match (current, majority) {
            (Some((h, from, runs)), Some(m)) if h == m => Some((h, from, runs + 1)),
            (_, Some(m)) => Some((m, first, 1)),
            (_, None) => None,
        };
        if let Some((h, from, runs)) = current {
            let held = at - from;
            if longest.is_none_or(|(_, d, _)| held > d) {
                longest = Some((h, held, runs));
            }
        }
    }
    longest
}

/// How a full restart sees each host closing.
#[derive(Clone, Copy)]
enum Seeing {
    /// Through the continuous load on this many connections, which never
    /// pauses.
    UnderLoad(usize),
    /// With [`mark`] (one connection, nothing else in flight); the host then
    /// drains under load.
    OneAtATime,
}

/// Sets `host` closing, sees it answer so with [`mark`], and lets it drain
/// for [`DRAIN`] under load; returns the app requests it got from its mark
/// to the end of the drain.
async fn mark_and_drain(m: &ConsumerSidecar, host: usize) -> u64 {
    let at_mark = mark(m, host).await;
    let load = Traffic::start(m.outbound, m.ups.len(), CONNS);
    tokio::time::sleep(DRAIN).await;
    assert_eq!(load.stop().await.failed, 0);
    m.ups[host].app_requests() - at_mark
}

/// Six hosts restarted one after another on their addresses: each set
/// closing, seen closing, drains for [`DRAIN`] under load, then answers as a
/// new instance (not closing, id `h<n>.2`); load goes on after the last.
struct FullRestart {
    m: ConsumerSidecar,
    label: String,
    traffic: Traffic,
    windows: Windows,
    /// Per host: app requests its old instance got from its mark (once the
    /// requests in flight then were answered) to its restart.
    while_closing: Vec<u64>,
    /// When the last host restarted.
    done: Instant,
}

impl FullRestart {
    async fn run(
        scenario: &str,
        membership: Membership,
        extra: &[(&str, &str)],
        seeing: Seeing,
    ) -> FullRestart {
        let m = share_mesh(scenario, membership, extra, 6).await;
        let label = format!("{scenario} ({membership:?})");
        let windows = Windows::start(&m, label.clone());
        let under_load = match seeing {
            Seeing::UnderLoad(conns) => Some(Traffic::start(m.outbound, m.ups.len(), conns)),
            Seeing::OneAtATime => None,
        };
        let mut while_closing = Vec::new();
        for (h, up) in m.ups.iter().enumerate() {
            while_closing.push(match &under_load {
                Some(traffic) => traffic.close_and_drain(&m, h).await,
                None => mark_and_drain(&m, h).await,
            });
            up.set_closing(false);
            up.set_instance(&instance(h, 2));
        }
        let traffic = under_load.unwrap_or_else(|| Traffic::start(m.outbound, m.ups.len(), CONNS));
        FullRestart {
            m,
            label,
            traffic,
            windows,
            while_closing,
            done: Instant::now(),
        }
    }

    /// Stops the load; checks that every request succeeded and that no old
    /// instance got a request once its mark was seen. Returns the windows
    /// and every answer in order ([`Watched::answers`]).
    async fn finish(self) -> (Vec<Vec<u64>>, Vec<(Instant, usize)>) {
        let windows = self.windows.stop();
        let watched = self.traffic.stop().await;
        let late = &watched.late;
        eprintln!(
            "{}: answers per host {:?}; app requests to each old instance from its mark to its \
             restart {:?}, answers from it to requests sent after the mark {late:?}; \
             windows of {WINDOW:?}: {windows:?}",
            self.label, watched.served, self.while_closing
        );
        assert_eq!(watched.failed, 0);
        assert!(
            self.while_closing.iter().all(|&n| n == 0),
            "closing hosts got requests while others were open: {:?}",
            self.while_closing
        );
        assert!(
            late.iter().all(|&n| n == 0),
            "closing hosts answered requests sent after their mark: {late:?}"
        );
        (windows, watched.answers)
    }
}

/// The load counts as spread over a host when, over the last [`SPAN`] (at
/// least), the host took at least a twelfth of the requests (half an even
/// share of six).
const SPAN: Duration = Duration::from_millis(150);

/// The hosts that took at least a twelfth of `requests` (none of too few
/// requests to tell).
fn spread_over(requests: &[u64]) -> usize {
    let total: u64 = requests.iter().sum();
    if total < 30 {
        return 0;
    }
    requests.iter().filter(|&&n| n * 12 >= total).count()
}

async fn it_spreads_the_load_within_1s_of_a_full_restart_with_probes(membership: Membership) {
    let restart = FullRestart::run("restart-probed", membership, &[], Seeing::OneAtATime).await;
    let base = restart.m.counts();
    // Counts since the last restart, and the requests per host over the
    // last span when the poll stopped.
    let history = Mutex::new(vec![(restart.done, base.clone())]);
    let last_span = Mutex::new(Vec::new());
    let reached = wait_for(
        "the load spread over 5 of the 6 hosts",
        Duration::from_secs(10),
        || async {
            let now = (Instant::now(), restart.m.counts());
            let mut history = history.lock().unwrap();
            let recent = history
                .iter()
                .rev()
                .find(|(at, _)| now.0 - *at >= SPAN)?
                .clone();
            let span = split(&recent.1, &now.1);
            let spread = spread_over(&span) >= 5;
            *last_span.lock().unwrap() = span;
            history.push(now);
            spread.then(|| restart.done.elapsed())
        },
    )
    .await;
    let since = split(&base, &restart.m.counts());
    let span = last_span.into_inner().unwrap();
    let label = restart.label.clone();
    restart.finish().await;
    eprintln!(
        "{label}: after the last restart: {reached:?}; requests per host over the last \
         {SPAN:?} then {span:?}, since the restart {since:?}"
    );
    let took = reached.unwrap_or_else(|e| panic!("{e}: last {SPAN:?} {span:?}, since {since:?}"));
    // Spread is seen over a span of SPAN, so it is confirmed up to SPAN
    // after it happened: a spread at 1 s is seen at 1 s + SPAN (a run on
    // CI saw it at 1.0018 s when this bound left the span out).
    assert!(
        took <= Duration::from_secs(1) + SPAN,
        "the load took {took:?} to spread over 5 hosts (seen over {SPAN:?}): {span:?}"
    );
}
with_and_without_admin!(it_spreads_the_load_within_1s_of_a_full_restart_with_probes);

/// The largest share one host took of a window's requests, in percent.
fn largest_share(windows: &[Vec<u64>]) -> u64 {
    windows
        .iter()
        .filter_map(|w| {
            let total: u64 = w.iter().sum();
            (total > 0).then(|| w.iter().max().copied().unwrap_or(0) * 100 / total)
        })
        .max()
        .unwrap_or(0)
}

// Unprobed, only answers can readmit a restarted instance, and no host whose
// last answer said closing is sent a request while another is open: the
// last host open takes the load while the one before it drains (half a
// second here: no answer can tell the restarted ones meanwhile), and once
// it closes too, the last resort (every tombstone but the one confirmed
// last) reaches a restarted instance, whose answer readmits it and puts
// the rest of the last resort on trial, each from its last mark plus the
// time that host took to come back, and each readmitted by its own first
// answer (docs/filters/consumer.md, "When tombstones leave few hosts").
// Besides what `finish` asserts (nothing failed, no old instance answered
// a request sent after its mark), no host takes more than half of [`RUN`]
// consecutive answers for over [`HOLD`]. On one connection the last
// resort's first answer is the only one before the plan changes: without
// the trial, that host took every request from then on (3.5 s to the end
// of the load, wasm and native).

/// The unprobed full restart under load on `conns` connections.
async fn full_restart_without_probes(scenario: &str, membership: Membership, conns: usize) {
    let restart = FullRestart::run(
        scenario,
        membership,
        &[("probe_path", "")],
        Seeing::UnderLoad(conns),
    )
    .await;
    let done = restart.done;
    // The load goes on for six more windows after the last restart.
    tokio::time::sleep(WINDOW * 6).await;
    let label = restart.label.clone();
    let (windows, answers) = restart.finish().await;
    let after = &windows[windows.len().saturating_sub(5)..];
    let serving = after
        .last()
        .map_or(0, |w| w.iter().filter(|&&n| n > 0).count());
    let hold = longest_hold(&answers, 6);
    let since_restart = answers.iter().filter(|(at, _)| *at > done).count();
    let after_hold = longest_hold(&answers[answers.len() - since_restart..], 6);
    eprintln!(
        "{label}: {} answers, {since_restart} after the last restart; longest stretch with one \
         host over half of {RUN} consecutive answers (host, time, runs): {hold:?}, after the \
         last restart {after_hold:?}; largest share of a window {}% during the restart, {}% \
         after it, with {serving} of 6 hosts serving",
        answers.len(),
        largest_share(&windows[..windows.len() - after.len()]),
        largest_share(after)
    );
    // The bound means something only over a load that went on through the
    // whole restart and after it.
    assert!(
        since_restart >= 10 * RUN,
        "{since_restart} answers after the last restart"
    );
    if let Some((host, held, runs)) = hold {
        assert!(
            held <= HOLD,
            "host {host} took more than half of every {RUN} consecutive answers for {held:?} \
             ({runs} runs); windows of {WINDOW:?}: {windows:?}"
        );
    }
}

async fn it_spreads_the_load_through_a_full_restart_without_probes(membership: Membership) {
    full_restart_without_probes("restart-unprobed", membership, CONNS).await;
}
with_and_without_admin!(it_spreads_the_load_through_a_full_restart_without_probes);

async fn it_spreads_the_load_through_a_full_restart_without_probes_on_one_connection(
    membership: Membership,
) {
    full_restart_without_probes("restart-unprobed-1", membership, 1).await;
}
with_and_without_admin!(
    it_spreads_the_load_through_a_full_restart_without_probes_on_one_connection
);

/// A listener whose accept queue is full and never drained: the kernel
/// drops further SYNs, so a connection to it times out (what a host cut
/// off the network does) instead of being refused.
async fn silent_host() -> (
    tokio::net::TcpListener,
    Vec<std::net::TcpStream>,
    SocketAddr,
) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
    let listener = socket.listen(0).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut held = Vec::new();
    // Fill the queue until a connection attempt no longer completes.
    for _ in 0..8 {
        let attempt = tokio::time::timeout(
            Duration::from_millis(300),
            tokio::net::TcpStream::connect(addr),
        )
        .await;
        match attempt {
            Ok(Ok(s)) => held.push(s.into_std().unwrap()),
            Ok(Err(e)) => panic!("connect to the silent host: {e}"),
            Err(_) => return (listener, held, addr),
        }
    }
    panic!("the accept queue never filled: connections to {addr} still complete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_evicts_a_host_whose_connections_time_out_even_when_retries_hide_it() {
    // A host cut off the network refuses nothing: its connections time out
    // (Envoy's connect_timeout, 1 s here), each attempt is retried
    // elsewhere, and no response says anything. The upstream instance of
    // the filter still sees the attempt end with no connection.
    let cfg = r#"{"admin_cluster":"envoy_admin","failure_tombstone_ttl":"3s","membership_refresh":"200ms"}"#;
    let ups = live_upstreams().await;
    let (_listener, _held, silent) = silent_host().await;
    let endpoints = [silent, ups[0].addr, ups[1].addr];
    let m = ConsumerSidecar::with_endpoints("timed-out-retried", cfg, 2, ups, &endpoints).await;
    let (ok, failed) = load_until(m.outbound, 4, Duration::from_secs(4), || false).await;
    let timeouts = envoy_stat(&m, "cluster.providers.upstream_cx_connect_timeout").await;
    let evictions = m.stat("graceful_consumer_evictions").await;
    eprintln!("{ok} ok, {failed} failed, {timeouts} connect timeouts, {evictions} evictions");
    assert!(timeouts >= 1, "a connection to the silent host timed out");
    assert_eq!(failed, 0, "retries carried every request");
    // Evicted on its first timed-out connection. The consumer's probes to
    // it end at their own timeout, before the connect timeout: cancelled
    // attempts, which renew nothing, so the tombstone lapses after
    // `failure_tombstone_ttl` (3 s here) and the host is tried, and
    // evicted, again (seen near the end of the 4 s load on 1.36).
    assert!(
        (1..=2).contains(&evictions),
        "{evictions} evictions of the silent host"
    );
    // Only requests sent before the tombstone reached their worker waited
    // for the silent host (and were retried): each worker's pool times out
    // on its own, and the other worker's listener sees the tombstone at
    // its next answer or tick, so a connection may meet it twice (seen: 5
    // of 4 connections on 1.36). Then none was sent its way (the later
    // timeouts are the consumer's probes), and the load went on at speed.
    let retried = envoy_stat(&m, "cluster.providers.upstream_rq_retry").await;
    assert!(
        retried <= 8,
        "{retried} requests retried off the silent host, of {ok}"
    );
    assert!(ok > 1000, "load ran: {ok}");
}

// A control plane that keeps a terminating endpoint as `DRAINING` (Envoy
// Gateway; Istio for persistent sessions): Envoy's balancer leaves it out,
// but `override_host` ignores health, so steering must leave it out too,
// next to a host that said it is closing. The admin's membership carries
// EDS health; membership learnt from answers cannot, and steers to the
// DRAINING host as to any other (docs/filters/consumer.md, "How it
// steers"): its share is asserted here so that a change shows.
async fn it_steers_nothing_to_a_host_the_control_plane_sends_draining(membership: Membership) {
    let m = share_mesh("draining", membership, &[], 4).await;
    let endpoints: Vec<(SocketAddr, &str)> = m
        .ups
        .iter()
        .enumerate()
        .map(|(h, u)| (u.addr, if h == 1 { "DRAINING" } else { "HEALTHY" }))
        .collect();
    write_eds_health(&m.eds, "providers", &endpoints);
    eventually(
        "Envoy applied the DRAINING endpoint",
        Duration::from_secs(10),
        || async {
            (m.envoy.stat("cluster.providers.membership_healthy").await == Some(3)).then_some(())
        },
    )
    .await;
    // Envoy's own balancer, before any tombstone: nothing to host 1.
    let unsteered = measure_split(&m).await;
    assert_eq!(
        unsteered[1], 0,
        "Envoy balanced onto DRAINING: {unsteered:?}"
    );
    if let Membership::Admin = membership {
        m.until_membership_refreshed().await;
    }
    let draining_before = m.ups[1].app_requests();
    let (split, since_mark) = close_and_split(&m, &[0]).await;
    let to_draining = m.ups[1].app_requests() - draining_before;
    eprintln!(
        "draining ({membership:?}): host 1 DRAINING, unsteered split {unsteered:?}; host 0 \
         closing, 90 requests split {split:?}, {to_draining} to the DRAINING host in all"
    );
    match membership {
        Membership::Admin => {
            assert_eq!(to_draining, 0, "the DRAINING host got requests: {split:?}");
            assert_left_to_the_others(&split, &[0, 1], &[since_mark[0], to_draining]);
        }
        Membership::Observed => {
            assert_left_to_the_others(&split, &[0], &since_mark);
            assert!(
                split[1] > 0,
                "learnt from answers, yet the DRAINING host was left out: {split:?}"
            );
        }
    }
}
with_and_without_admin!(it_steers_nothing_to_a_host_the_control_plane_sends_draining);
