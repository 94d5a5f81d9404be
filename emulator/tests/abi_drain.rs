//! graceful_drain's `.wasm` (with graceful_provider behind it, as in
//! `envoy/provider-sidecar.yaml`) on the test host: every gate transition at
//! its exact virtual time, long-polls resolved by ticks, the admin poll,
//! allowed sources, gRPC health and the `on_drained` callback.
//!
//! Every drain VM copy ticks every 50 ms from t = 0 (when they configure),
//! so ticks fall on multiples of 50 ms; closing starts at t = 100 ms.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use graceful_core::drain::record::{self, InstanceRecord, Phase};
use graceful_core::drain::status::Status;
use graceful_emulated_host::{Action, CallAnswer, CallState, Filter, Host, Level, StreamId, Vm};

const WAITERS: &str = "graceful.v1.drain.waiters";
const PHASE: &str = "graceful_drain_phase";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// One Envoy process: drain and provider on the main thread and on two
/// workers; `w[i]` is worker i's chain (drain first).
struct Proc {
    host: Host,
    drains: Vec<Vm>,
    w: [[Vm; 2]; 2],
}

fn process(drain_config: &str) -> Proc {
    let mut host = Host::new();
    let main_drain = host.start_vm(Filter::Drain, drain_config);
    host.start_vm(Filter::Provider, r#"{"instance_id":"pod-1"}"#);
    let mut w = Vec::new();
    let mut drains = vec![main_drain];
    for _ in 0..2 {
        let d = host.start_vm(Filter::Drain, drain_config);
        let p = host.start_vm(Filter::Provider, r#"{"instance_id":"pod-1"}"#);
        drains.push(d);
        w.push([d, p]);
    }
    Proc {
        host,
        drains,
        w: [w[0], w[1]],
    }
}

const CONFIG: &str =
    r#"{"consumer_update_wait":"1s","quiet_window":"500ms","step_timeout":"3s","timeout":"60s"}"#;

fn request(host: &mut Host, chain: &[Vm], method: &str, path: &str) -> StreamId {
    let s = host.stream_through(chain);
    host.request_headers(
        s,
        &[(":method", method), (":path", path), (":authority", "svc")],
        true,
    );
    s
}

/// The status JSON of an endpoint's answer.
fn status_of(host: &Host, s: StreamId) -> Status {
    let reply = host.local_reply(s).expect("answered by the filter");
    serde_json::from_slice(&reply.body)
        .unwrap_or_else(|e| panic!("status JSON {:?}: {e}", reply.text()))
}

fn record(host: &Host) -> InstanceRecord {
    host.with_store(|s| record::read(s).unwrap())
}

/// The provider's in-flight gauge (every worker moves it).
fn inflight(host: &Host) -> i64 {
    host.metric("graceful_provider_inflight")
}

fn closing_at(p: &mut Proc, at: Duration) {
    p.host.advance_to(at);
    let s = request(&mut p.host, &p.w[0], "POST", "/graceful/closing");
    assert_eq!(p.host.local_reply(s).unwrap().status, 202);
    p.host.log(s);
}

/// µs since the epoch at `elapsed` since the host started.
fn at_us(host: &Host, elapsed: Duration) -> u64 {
    host.now_us() - host.elapsed().as_micros() as u64 + elapsed.as_micros() as u64
}

#[test]
fn it_passes_the_gate_at_consumer_update_wait_on_the_first_tick_after() {
    let mut p = process(CONFIG);
    assert_eq!(p.host.tick_period(p.drains[1]), Some(ms(50)));
    p.host.advance_to(ms(100));
    let s = request(&mut p.host, &p.w[1], "POST", "/graceful/closing");
    let st = status_of(&p.host, s);
    assert_eq!((st.phase.as_str(), st.closing_for_ms), ("closing", Some(0)));
    assert_eq!(p.host.metric(PHASE), 1);

    p.host.advance_to(ms(1050));
    assert_eq!(record(&p.host).phase, Phase::Closing, "950 ms closing");
    p.host.advance_to(ms(1100));
    let r = record(&p.host);
    assert_eq!((r.phase, r.forced), (Phase::Drained, false));
    assert_eq!(
        r.drained_at_us,
        r.closing_since_us + 1_000_000,
        "exactly 1 s"
    );
    assert_eq!(p.host.metric(PHASE), 2);
    assert_eq!(p.host.metric("graceful_drain_forced"), 0);
    // Three copies tick; exactly one made the pass and said so.
    assert_eq!(
        p.host
            .logs_containing("drain gate passed after 1000 ms closing: quiet"),
        vec!["drain gate passed after 1000 ms closing: quiet"]
    );
    let s = request(&mut p.host, &p.w[0], "GET", "/graceful/drained");
    let st = status_of(&p.host, s);
    assert!(st.drained && !st.forced && st.phase == "drained", "{st:?}");
}

#[test]
fn it_passes_the_gate_at_exactly_consumer_update_wait_when_asked() {
    // No ticks: the drained endpoint evaluates the gate itself, to the µs.
    let mut p = process(CONFIG);
    for vm in p.drains.clone() {
        p.host.hold_ticks(vm, true);
    }
    closing_at(&mut p, ms(100));
    p.host.advance(ms(1000) - Duration::from_micros(1));
    let s = request(&mut p.host, &p.w[0], "GET", "/graceful/drained");
    assert_eq!(p.host.local_reply(s).unwrap().status, 503);
    assert!(!status_of(&p.host, s).drained);
    p.host.advance(Duration::from_micros(1));
    let s = request(&mut p.host, &p.w[1], "GET", "/graceful/drained");
    assert_eq!(p.host.local_reply(s).unwrap().status, 200);
    assert_eq!(status_of(&p.host, s).closing_for_ms, Some(1000));
}

#[test]
fn it_restarts_the_quiet_window_on_a_late_request() {
    let mut p = process(CONFIG);
    closing_at(&mut p, ms(100));
    // A request starts 900 ms into closing and ends 50 ms later, marked.
    p.host.advance_to(ms(1000));
    let late = request(&mut p.host, &p.w[1], "GET", "/work");
    assert!(p.host.reached_upstream(late));
    assert_eq!(inflight(&p.host), 1);
    p.host.advance_to(ms(1050));
    p.host.response_headers(late, &[(":status", "200")], true);
    assert_eq!(
        p.host
            .response_header(late, "x-graceful-closing")
            .as_deref(),
        Some("true")
    );
    p.host.log(late);

    // consumer_update_wait is over at 1.1 s, but a request started
    // recently. The drain copies see a start on the first tick after it
    // (1.05 s: the start counter moved), so the window ends 500 ms after
    // that, at 1.55 s: never sooner than 500 ms after the real start.
    p.host.advance_to(ms(1200));
    let s = request(&mut p.host, &p.w[0], "GET", "/graceful/status");
    let st = status_of(&p.host, s);
    assert_eq!(
        (st.inflight_inbound, st.last_request_ms_ago, st.drained),
        (0, Some(150), false)
    );
    p.host.advance_to(ms(1500));
    assert_eq!(record(&p.host).phase, Phase::Closing);
    p.host.advance_to(ms(1550));
    let r = record(&p.host);
    assert_eq!((r.phase, r.forced), (Phase::Drained, false));
    assert_eq!(r.drained_at_us, at_us(&p.host, ms(1550)));
}

#[test]
fn it_forces_the_gate_at_step_timeout_while_requests_keep_arriving() {
    let mut p = process(
        r#"{"consumer_update_wait":"1s","quiet_window":"500ms","step_timeout":"2s","timeout":"60s"}"#,
    );
    p.host.advance_to(ms(50));
    let slow = request(&mut p.host, &p.w[0], "GET", "/slow");
    closing_at(&mut p, ms(100));
    // A caller that ignores the mark: a short request every 200 ms.
    let mut t = 200;
    while t < 3100 {
        p.host.advance_to(ms(t));
        let s = request(&mut p.host, &p.w[1], "GET", "/");
        p.host.response_headers(s, &[(":status", "204")], true);
        p.host.log(s);
        t += 200;
    }
    // Forced at closing + consumer_update_wait + step_timeout = 3.1 s.
    p.host.advance_to(ms(3050));
    assert_eq!(record(&p.host).phase, Phase::Closing);
    p.host.advance_to(ms(3100));
    let r = record(&p.host);
    assert_eq!(
        (r.phase, r.forced, inflight(&p.host)),
        (Phase::Drained, true, 1)
    );
    assert_eq!(r.drained_at_us, at_us(&p.host, ms(3100)));
    assert_eq!(
        p.host.metric("graceful_drain_forced"),
        1,
        "once per shutdown, not per VM copy"
    );
    assert!(p.host.logs_at_least(Level::Error).is_empty());
    let warned = p.host.logs_at(Level::Warn);
    assert_eq!(
        warned,
        vec!["drain gate forced after 3000 ms closing by step_timeout: 1 inbound, 0 outbound still in flight"]
    );
    let s = request(&mut p.host, &p.w[1], "GET", "/graceful/drained");
    let st = status_of(&p.host, s);
    assert!(
        st.drained && st.forced && st.inflight_inbound == 1,
        "{st:?}"
    );

    // The gate does not cut the request in flight; new ones get the 503.
    let after = request(&mut p.host, &p.w[1], "GET", "/new");
    assert_eq!(p.host.response(after).status(), 503);
    assert_eq!(
        p.host
            .response_header(after, "x-graceful-closing")
            .as_deref(),
        Some("true")
    );
    p.host.response_headers(slow, &[(":status", "200")], true);
    p.host.log(slow);
    p.host.log(after);
    assert_eq!(inflight(&p.host), 0);
}

#[test]
fn a_request_in_flight_is_cut_at_step_timeout_without_longest_request() {
    // The contract's meaning: after consumer_update_wait, step_timeout is
    // the most time spent waiting for quiet, in flight or not.
    let mut p = process(
        r#"{"consumer_update_wait":"1s","quiet_window":"500ms","step_timeout":"2s","timeout":"10s"}"#,
    );
    p.host.advance_to(ms(50));
    let _slow = request(&mut p.host, &p.w[0], "GET", "/slow");
    closing_at(&mut p, ms(100));
    p.host.advance_to(ms(3050));
    assert_eq!(record(&p.host).phase, Phase::Closing);
    p.host.advance_to(ms(3150));
    let r = record(&p.host);
    assert_eq!((r.phase, r.forced), (Phase::Drained, true));
}

#[test]
fn with_longest_request_a_request_in_flight_after_arrivals_stopped_holds_the_gate_until_the_timeout(
) {
    let mut p = process(
        r#"{"consumer_update_wait":"1s","quiet_window":"500ms","step_timeout":"2s","timeout":"10s","longest_request":"6s"}"#,
    );
    p.host.advance_to(ms(50));
    let slow = request(&mut p.host, &p.w[0], "GET", "/slow");
    closing_at(&mut p, ms(100));
    // Past consumer_update_wait + step_timeout (3.1 s), nothing arrives:
    // the request in flight is waited for ...
    p.host.advance_to(ms(9000));
    assert_eq!(record(&p.host).phase, Phase::Closing);
    // ... and ends: a quiet pass.
    p.host.response_headers(slow, &[(":status", "200")], true);
    p.host.log(slow);
    p.host.advance_to(ms(9100));
    let r = record(&p.host);
    assert_eq!((r.phase, r.forced), (Phase::Drained, false));
    assert_eq!(p.host.metric("graceful_drain_forced"), 0);
    // Another one that never ends: the overall timeout is the bound.
    let mut p = process(
        r#"{"consumer_update_wait":"1s","quiet_window":"500ms","step_timeout":"2s","timeout":"10s","longest_request":"6s"}"#,
    );
    p.host.advance_to(ms(50));
    let _stuck = request(&mut p.host, &p.w[0], "GET", "/slow");
    closing_at(&mut p, ms(100));
    p.host.advance_to(ms(10_050));
    assert_eq!(record(&p.host).phase, Phase::Closing);
    p.host.advance_to(ms(10_100));
    let r = record(&p.host);
    assert_eq!((r.phase, r.forced), (Phase::Drained, true));
    assert_eq!(p.host.logs_containing("closing by timeout").len(), 1);
}

#[test]
fn it_forces_the_gate_at_the_overall_timeout_under_steady_traffic() {
    let mut p = process(
        r#"{"consumer_update_wait":"1s","quiet_window":"500ms","step_timeout":"10s","timeout":"2s"}"#,
    );
    closing_at(&mut p, ms(100));
    // A short request every 200 ms: never 500 ms of quiet, never one left
    // in flight at a tick.
    let mut t = 120;
    while t < 2100 {
        p.host.advance_to(ms(t));
        let s = request(&mut p.host, &p.w[(t / 200 % 2) as usize], "GET", "/");
        p.host.response_headers(s, &[(":status", "204")], true);
        p.host.log(s);
        t += 200;
    }
    p.host.advance_to(ms(2050));
    assert_eq!(record(&p.host).phase, Phase::Closing);
    p.host.advance_to(ms(2100));
    let r = record(&p.host);
    assert_eq!(
        (r.phase, r.forced, inflight(&p.host)),
        (Phase::Drained, true, 0)
    );
    assert_eq!(r.drained_at_us, at_us(&p.host, ms(2100)));
    assert_eq!(p.host.logs_containing("closing by timeout").len(), 1);
    assert_eq!(p.host.metric("graceful_drain_forced"), 1);
}

#[test]
fn it_resolves_drained_long_polls_on_ticks() {
    let mut p = process(
        r#"{"consumer_update_wait":"1s","quiet_window":"500ms","step_timeout":"3s","timeout":"60s","max_waiters":2}"#,
    );
    closing_at(&mut p, ms(100));
    p.host.advance_to(ms(200));
    let long = request(&mut p.host, &p.w[0], "GET", "/graceful/drained?wait=10s");
    assert_eq!(p.host.local_reply(long), None, "held");
    let short = request(&mut p.host, &p.w[1], "GET", "/graceful/drained?wait=230ms");
    assert_eq!(p.host.local_reply(short), None, "held");
    assert_eq!(p.host.shared_data(WAITERS).unwrap(), 2u64.to_le_bytes());
    // Held long-polls are the drain filter's own: the provider behind it
    // never counted them.
    assert_eq!(inflight(&p.host), 0);

    // Past max_waiters: 429 at once.
    let third = request(&mut p.host, &p.w[1], "GET", "/graceful/drained?wait=10s");
    assert_eq!(p.host.local_reply(third).unwrap().status, 429);
    p.host.log(third);

    // The short wait runs out at 430 ms: answered 503 on the 450 ms tick.
    p.host.advance_to(ms(400));
    assert_eq!(p.host.local_reply(short), None);
    p.host.advance_to(ms(450));
    assert_eq!(p.host.response(short).status(), 503);
    assert!(!status_of(&p.host, short).drained);
    p.host.log(short);
    assert_eq!(p.host.shared_data(WAITERS).unwrap(), 1u64.to_le_bytes());

    // A client that gives up frees its slot.
    let gone = request(&mut p.host, &p.w[1], "GET", "/graceful/drained?wait=10s");
    assert_eq!(p.host.shared_data(WAITERS).unwrap(), 2u64.to_le_bytes());
    p.host.reset(gone);
    assert_eq!(p.host.shared_data(WAITERS).unwrap(), 1u64.to_le_bytes());

    // The gate passes on the 1.1 s tick: the long one is answered then.
    p.host.advance_to(ms(1050));
    assert_eq!(p.host.local_reply(long), None);
    p.host.advance_to(ms(1100));
    let r = p.host.response(long);
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.header("content-type").as_deref(),
        Some("application/json")
    );
    let st = status_of(&p.host, long);
    assert!(st.drained && st.closing_for_ms == Some(1000), "{st:?}");
    assert_eq!(
        p.host.local_reply(gone),
        None,
        "nobody answers a gone stream"
    );
    p.host.log(long);
    assert_eq!(p.host.shared_data(WAITERS).unwrap(), 0u64.to_le_bytes());
    assert!(!p.host.trace().contains("TRAP"));
}

#[test]
fn it_answers_a_long_poll_from_the_vm_copy_that_holds_it() {
    let mut p = process(CONFIG);
    let d0 = p.w[0][0];
    p.host.hold_ticks(d0, true);
    closing_at(&mut p, ms(100));
    let poll = request(&mut p.host, &p.w[0], "GET", "/graceful/drained?wait=10s");
    // Another copy passes the gate at 1.1 s; worker 0 is not ticking.
    p.host.advance_to(ms(1200));
    assert_eq!(record(&p.host).phase, Phase::Drained);
    assert_eq!(
        p.host.local_reply(poll),
        None,
        "only its own copy can answer"
    );
    // Worker 0 ticks again from 1.2 s: first tick at 1.25 s answers it.
    p.host.hold_ticks(d0, false);
    p.host.advance_to(ms(1249));
    assert_eq!(p.host.local_reply(poll), None);
    p.host.advance_to(ms(1250));
    assert_eq!(p.host.response(poll).status(), 200);
}

#[test]
fn it_refuses_closing_from_sources_outside_allowed_sources() {
    let mut p = process(r#"{"allowed_sources":["10.0.0.0/8"]}"#);
    let post = |p: &mut Proc, source: &str, xff: Option<&str>| {
        let s = p.host.stream_through(&p.w[0]);
        p.host.set_source(s, source);
        let mut headers = vec![(":method", "POST"), (":path", "/graceful/closing")];
        if let Some(xff) = xff {
            headers.push(("x-forwarded-for", xff));
        }
        p.host.request_headers(s, &headers, true);
        let status = p.host.local_reply(s).unwrap().status;
        p.host.log(s);
        status
    };
    assert_eq!(post(&mut p, "192.168.1.5:40000", None), 403);
    assert_eq!(
        post(&mut p, "127.0.0.1:40000", None),
        403,
        "loopback is not listed"
    );
    // Port 0: Envoy took the address from x-forwarded-for. Not trusted.
    assert_eq!(post(&mut p, "10.1.2.3:0", Some("10.1.2.3")), 403);
    assert_eq!(record(&p.host).phase, Phase::Serving);
    assert_eq!(
        p.host
            .logs_containing("closing refused: source 192.168.1.5:40000")
            .len(),
        1
    );
    assert_eq!(post(&mut p, "10.1.2.3:5555", Some("192.168.0.1")), 202);
    assert_eq!(record(&p.host).phase, Phase::Closing);

    // allowed_sources: [] allows nobody.
    let mut p = process(r#"{"allowed_sources":[]}"#);
    assert_eq!(post(&mut p, "127.0.0.1:40000", None), 403);
}

#[test]
fn it_answers_grpc_health_from_the_app_while_serving_then_not_serving() {
    let mut p = process(CONFIG);
    let check = |p: &mut Proc| {
        let s = p.host.stream_through(&p.w[0]);
        let action = p.host.request_headers(
            s,
            &[
                (":method", "POST"),
                (":path", "/grpc.health.v1.Health/Check"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ],
            false,
        );
        (s, action)
    };
    // Serving: forwarded; the app's bytes come back untouched.
    let (s, action) = check(&mut p);
    assert_eq!(action, Action::Continue);
    p.host.request_body(s, b"\0\0\0\0\0", true);
    p.host.response_headers(
        s,
        &[(":status", "200"), ("content-type", "application/grpc")],
        false,
    );
    p.host.response_body(s, b"\0\0\0\0\x02\x08\x01", false);
    p.host.response_trailers(s, &[("grpc-status", "0")]);
    let r = p.host.response(s);
    assert_eq!(
        r.body, b"\0\0\0\0\x02\x08\x01",
        "HealthCheckResponse {{ status: SERVING }}"
    );
    assert_eq!(r.trailer("grpc-status").as_deref(), Some("0"));
    p.host.log(s);

    closing_at(&mut p, ms(100));
    let (s, action) = check(&mut p);
    assert_eq!(action, Action::Pause);
    let reply = p.host.local_reply(s).unwrap();
    assert_eq!((reply.status, reply.grpc_status), (503, Some(14)));
    assert_eq!(reply.body, b"NOT_SERVING");
    // On the wire: trailers-only, status in headers, no message.
    let r = p.host.response(s);
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.header("content-type").as_deref(),
        Some("application/grpc")
    );
    assert_eq!(r.header("grpc-status").as_deref(), Some("14"));
    assert_eq!(r.header("grpc-message").as_deref(), Some("NOT_SERVING"));
    assert!(r.body.is_empty() && r.trailers.is_none());
    p.host.log(s);
    assert_eq!(inflight(&p.host), 0);
}

#[test]
fn it_starts_closing_when_the_admin_says_draining() {
    let mut p = process(
        r#"{"consumer_update_wait":"1s","quiet_window":"500ms","step_timeout":"3s","timeout":"60s","admin_cluster":"envoy_admin"}"#,
    );
    let ready = Rc::new(RefCell::new((503, "PRE_INITIALIZING\n")));
    let answer = ready.clone();
    p.host.respond("envoy_admin", move |call| {
        assert_eq!(call.path(), "/ready");
        let (status, body) = *answer.borrow();
        Some(CallAnswer::new(
            status,
            &[("content-type", "text/plain")],
            body,
        ))
    });
    // First tick (50 ms): one copy takes the lease and asks; start-up 503
    // is not a shutdown.
    p.host.advance_to(ms(50));
    assert_eq!(p.host.http_calls().len(), 1);
    p.host.advance_to(ms(1000));
    assert_eq!(
        p.host.http_calls().len(),
        1,
        "one poll per second per process"
    );
    assert_eq!(record(&p.host).phase, Phase::Serving);
    *ready.borrow_mut() = (200, "LIVE\n");
    p.host.advance_to(ms(1050));
    assert_eq!(p.host.http_calls().len(), 2);
    assert_eq!(record(&p.host).phase, Phase::Serving);
    // /healthcheck/fail: the next poll (2.05 s) starts closing.
    *ready.borrow_mut() = (503, "DRAINING\n");
    p.host.advance_to(ms(2000));
    assert_eq!(record(&p.host).phase, Phase::Serving);
    p.host.advance_to(ms(2050));
    let r = record(&p.host);
    assert_eq!(r.phase, Phase::Closing);
    assert_eq!(r.closing_since_us, at_us(&p.host, ms(2050)));
    assert_eq!(
        p.host
            .logs_containing("closing started: Envoy admin /ready says DRAINING")
            .len(),
        1
    );
    // Closing: no more polling.
    p.host.advance_to(ms(5000));
    assert_eq!(p.host.http_calls().len(), 3);
    assert!(p
        .host
        .http_calls()
        .iter()
        .all(|c| matches!(c.state, CallState::Answered(_))));
}

#[test]
fn it_calls_on_drained_once_and_counts_its_failure() {
    let config = r#"{"consumer_update_wait":"1s","quiet_window":"500ms","step_timeout":"3s","timeout":"60s",
        "on_drained":{"cluster":"app","path":"/bye","timeout":"2s"}}"#;
    let mut p = process(config);
    p.host.add_cluster("app");
    closing_at(&mut p, ms(100));
    p.host.advance_to(ms(1100));
    let calls = p.host.http_calls();
    assert_eq!(calls.len(), 1, "one call for the process: {calls:?}");
    let call = &calls[0];
    assert_eq!(call.header(":method").as_deref(), Some("POST"));
    assert_eq!(call.path(), "/bye");
    assert_eq!(
        call.header("content-type").as_deref(),
        Some("application/json")
    );
    let st: Status = serde_json::from_slice(&call.body).unwrap();
    assert!(st.drained && !st.forced, "{st:?}");
    // Unanswered: it times out 2 s later and is counted, the gate unaffected.
    p.host.advance_to(ms(3099));
    assert_eq!(p.host.metric("graceful_drain_callback_failed"), 0);
    p.host.advance_to(ms(3100));
    assert_eq!(p.host.http_calls()[0].state, CallState::Failed);
    assert_eq!(p.host.metric("graceful_drain_callback_failed"), 1);
    assert_eq!(
        p.host
            .logs_containing("on_drained callback failed: status none (no answer)")
            .len(),
        1
    );

    // A 2xx answer is success; a 500 is counted.
    for (status, failed) in [(204, 0), (500, 1)] {
        let mut p = process(config);
        p.host.respond("app", move |_| {
            Some(CallAnswer::new(status, &[("x", "y")], ""))
        });
        closing_at(&mut p, ms(100));
        p.host.advance_to(ms(1100));
        assert_eq!(p.host.http_calls().len(), 1);
        assert_eq!(p.host.metric("graceful_drain_callback_failed"), failed);
    }
}

#[test]
fn it_answers_readiness_status_and_bad_requests() {
    let mut p = process(CONFIG);
    let answer = |p: &mut Proc, method: &str, path: &str| {
        let s = request(&mut p.host, &p.w[1], method, path);
        let r = p.host.response(s);
        p.host.log(s);
        r
    };
    let r = answer(&mut p, "GET", "/graceful/ready");
    assert_eq!((r.status(), r.body.as_slice()), (200, &b"SERVING\n"[..]));
    // Stamped for consumers' probes: the provider's instance id and the
    // address the request reached.
    assert_eq!(r.header("x-graceful-instance").as_deref(), Some("pod-1"));
    assert_eq!(
        r.header("x-graceful-address").as_deref(),
        Some("127.0.0.1:10000")
    );
    let r = answer(&mut p, "GET", "/graceful/closing");
    assert_eq!(
        (r.status(), r.header("allow").as_deref()),
        (405, Some("POST"))
    );
    let r = answer(&mut p, "POST", "/graceful/ready");
    assert_eq!(
        (r.status(), r.header("allow").as_deref()),
        (405, Some("GET, HEAD"))
    );
    assert_eq!(
        answer(&mut p, "GET", "/graceful/drained?wait=soon").status(),
        400
    );
    assert_eq!(
        answer(&mut p, "GET", "/graceful/drained?wait=2h").status(),
        400
    );
    let r = answer(&mut p, "GET", "/graceful/status");
    let st: Status = serde_json::from_slice(&r.body).unwrap();
    assert_eq!((st.phase.as_str(), st.closing_for_ms), ("serving", None));
    closing_at(&mut p, ms(100));
    let r = answer(&mut p, "GET", "/graceful/ready");
    assert_eq!(
        (r.status(), r.body.as_slice()),
        (503, &b"NOT_SERVING\n"[..])
    );
    // None of these reached the app or the provider's count.
    assert_eq!(inflight(&p.host), 0);
    assert_eq!(p.host.metric("graceful_provider_started"), 0);
}

#[test]
fn it_copes_with_clusters_that_do_not_exist() {
    // Envoy refuses calls to unknown clusters (BadArgument): the admin poll
    // warns once per VM copy, the on_drained callback counts as failed, and
    // the gate is not held up by either.
    let mut p = process(
        r#"{"consumer_update_wait":"1s","quiet_window":"500ms","step_timeout":"3s","timeout":"60s",
            "admin_cluster":"missing_admin","on_drained":{"cluster":"missing_app"}}"#,
    );
    p.host.advance_to(ms(3000));
    let warned = p
        .host
        .logs_containing("admin poll to cluster \"missing_admin\" not sent");
    // Three polls (1 per second); the main copy ticks first and takes the
    // lease each time, and warns only the first time.
    assert_eq!(warned.len(), 1, "{warned:?}");
    let refused = p
        .host
        .trace()
        .matches("proxy_http_call(\"missing_admin\"")
        .count();
    assert_eq!(refused, 3, "one poll per second");
    assert!(p.host.http_calls().is_empty());
    closing_at(&mut p, ms(3100));
    p.host.advance_to(ms(4100));
    assert_eq!(record(&p.host).phase, Phase::Drained);
    assert_eq!(p.host.metric("graceful_drain_callback_failed"), 1);
    assert_eq!(
        p.host
            .logs_containing("on_drained callback to cluster \"missing_app\" not sent")
            .len(),
        1
    );
}

/// The gate protocol with both filters' `.wasm` at one virtual instant, in
/// both orders: a request counted before a worker's tick holds the gate;
/// a request after the pass is rejected; the gate stat keeps exactly one 1
/// per passing copy and none from attempts that backed off.
#[test]
fn a_request_and_a_gate_attempt_at_the_same_instant_in_either_order() {
    let mut p = process(
        r#"{"consumer_update_wait":"0s","quiet_window":"0s","step_timeout":"30s","timeout":"60s"}"#,
    );
    for vm in p.drains.clone() {
        p.host.hold_ticks(vm, true);
    }
    closing_at(&mut p, ms(100));
    // The POST itself made no pass: closing had only just started.
    assert_eq!(record(&p.host).phase, Phase::Closing);

    // Worker 0 admits a request; worker 1's copy ticks at the same instant.
    let held = request(&mut p.host, &p.w[0], "GET", "/work");
    assert!(p.host.reached_upstream(held));
    p.host.tick(p.drains[2]);
    assert_eq!(record(&p.host).phase, Phase::Closing, "one in flight");
    assert_eq!(
        p.host.metric("graceful_drain_gate"),
        0,
        "the look saw it: no attempt"
    );

    // It ends; a tick at that same instant on the other worker: the look
    // sees it ended (started moved since this copy last looked: quiet for
    // a zero window), the attempt's second look agrees, and it passes.
    p.host.response_headers(held, &[(":status", "200")], true);
    p.host.log(held);
    p.host.tick(p.drains[1]);
    let r = record(&p.host);
    assert_eq!((r.phase, r.forced), (Phase::Drained, false));
    assert_eq!(p.host.metric("graceful_drain_gate"), 1);

    // The next request, same instant, either worker: the marked 503.
    for w in 0..2 {
        let late = request(&mut p.host, &p.w[w], "GET", "/late");
        assert!(!p.host.reached_upstream(late));
        assert_eq!(p.host.response(late).status(), 503);
        p.host.log(late);
    }
    // Other copies' ticks find it drained: no second 1, no second report.
    p.host.tick(p.drains[2]);
    p.host.tick(p.drains[0]);
    assert_eq!(p.host.metric("graceful_drain_gate"), 1);
    assert_eq!(
        p.host.logs_containing("drain gate passed").len(),
        1,
        "{:?}",
        p.host.logs()
    );
    assert_eq!(inflight(&p.host), 0);
    assert_eq!(p.host.metric("graceful_provider_rejected"), 2);
}
