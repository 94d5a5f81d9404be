//! Real Envoy (`--concurrency 2`) running `envoy/provider-sidecar.yaml`:
//! graceful_drain + graceful_provider in front of the test upstream.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use graceful_core::drain::status::Status;
use graceful_harness::support::client::{self, abort_after, load, Conn};
use graceful_harness::support::envoy::{
    eventually, listener_stats, refusing_port, wait_for, Envoy, EnvoySpec,
};
use graceful_harness::support::mesh::{self, status_of};
use graceful_harness::support::native::Delivery;
use graceful_harness::support::upstream::{Counters, Upstream};
use graceful_harness::support::wall_step::WallStep;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

const CLOSING: &str = "x-graceful-closing";
const INSTANCE: &str = "x-graceful-instance";

/// Test timings: short waits, and a step timeout long enough that the slow
/// requests below never force the gate.
const DRAIN_CONFIG: &str = r#"{"consumer_update_wait":"1s","quiet_window":"500ms","step_timeout":"20s","timeout":"60s","admin_cluster":"envoy_admin"}"#;
const QUIET_WINDOW: Duration = Duration::from_millis(500);

struct Sidecar {
    envoy: Envoy,
    inbound: SocketAddr,
    _upstream: Upstream,
}

async fn sidecar(
    name: &str,
    drain_config: &str,
    provider_config: &str,
) -> (Sidecar, Arc<Counters>) {
    sidecar_with(name, drain_config, provider_config, |spec| spec).await
}

/// [`sidecar`], its spec edited by `edit` before it starts.
async fn sidecar_with(
    name: &str,
    drain_config: &str,
    provider_config: &str,
    edit: impl FnOnce(EnvoySpec) -> EnvoySpec,
) -> (Sidecar, Arc<Counters>) {
    let upstream = Upstream::start().await;
    let counters = upstream.counters.clone();
    let spec = EnvoySpec::new(name, "provider-sidecar.yaml")
        .set("LISTEN_ADDRESS", "127.0.0.1")
        .set("INBOUND_PORT", 0)
        .set("APP_PORT", upstream.addr.port())
        .set("DRAIN_CONFIG", drain_config)
        .set("PROVIDER_CONFIG", provider_config);
    let envoy = edit(spec).start().await;
    let inbound = envoy.listener("inbound").await;
    (
        Sidecar {
            envoy,
            inbound,
            _upstream: upstream,
        },
        counters,
    )
}

async fn status(s: &Sidecar) -> Status {
    mesh::status(s.inbound).await
}

/// A sidecar `name` with drain config `cfg`, a request of `delay_ms` in
/// flight on it (counted), then closing started: the sidecar, that
/// request, and when closing started.
async fn closing_with_one_in_flight(
    name: &str,
    cfg: &str,
    delay_ms: u64,
) -> (
    Sidecar,
    tokio::task::JoinHandle<Result<client::Response, String>>,
    Instant,
) {
    let (s, _) = sidecar(name, cfg, "{}").await;
    let inbound = s.inbound;
    let request =
        tokio::spawn(async move { client::get(inbound, &format!("/delay/{delay_ms}")).await });
    eventually(
        "request in flight counted",
        Duration::from_secs(5),
        || async { (status(&s).await.inflight_inbound == 1).then_some(()) },
    )
    .await;
    let started = Instant::now();
    mesh::start_closing(s.inbound).await;
    (s, request, started)
}

async fn inflight_gauge_is_zero(envoy: &Envoy) {
    eventually(
        "graceful_provider_inflight back to 0",
        Duration::from_secs(10),
        || async {
            (envoy.stat("wasmcustom.graceful_provider_inflight").await == Some(0)).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn it_marks_counts_and_drains_under_load() {
    let (s, upstream) = sidecar("drain-under-load", DRAIN_CONFIG, "{}").await;

    // Serving: every response names the instance, the same id on both
    // workers, and none is marked closing.
    let responses = load(s.inbound, 8, 40, "/delay/2").await;
    assert_eq!(responses.len(), 320);
    let ids: std::collections::HashSet<_> = responses.iter().map(|r| r.header(INSTANCE)).collect();
    assert_eq!(ids.len(), 1, "one instance id across workers: {ids:?}");
    let instance_id = ids
        .into_iter()
        .next()
        .flatten()
        .expect("instance header present");
    assert!(responses
        .iter()
        .all(|r| r.status == 200 && r.header(CLOSING).is_none()));

    // Client aborts in the middle of slow requests must not leak a count.
    let aborts: Vec<_> = (0..10)
        .map(|_| {
            tokio::spawn(abort_after(
                s.inbound,
                "/delay/3000",
                Duration::from_millis(150),
            ))
        })
        .collect();
    for a in aborts {
        a.await.unwrap().unwrap();
    }
    inflight_gauge_is_zero(&s.envoy).await;
    assert_eq!(status(&s).await.inflight_inbound, 0);
    let served_before = upstream.requests.load(SeqCst);
    assert!(
        served_before >= 330,
        "the upstream saw the load: {served_before}"
    );

    // Readiness flips with closing; closing answers 202 with the status.
    assert_eq!(
        client::get(s.inbound, "/graceful/ready")
            .await
            .unwrap()
            .status,
        200
    );
    let closing = client::post(s.inbound, "/graceful/closing").await.unwrap();
    assert_eq!(closing.status, 202, "{}", closing.text());
    assert_eq!(status_of(&closing).phase, "closing");
    let ready = client::get(s.inbound, "/graceful/ready").await.unwrap();
    assert_eq!(
        (ready.status, ready.text().as_str()),
        (503, "NOT_SERVING\n")
    );
    let long_poll = tokio::spawn(client::get(s.inbound, "/graceful/drained?wait=30s"));

    // Closing: every response is marked, on both workers.
    let responses = load(s.inbound, 8, 25, "/delay/2").await;
    assert!(
        responses.iter().all(|r| r.status == 200),
        "still serving while closing"
    );
    let unmarked = responses
        .iter()
        .filter(|r| r.header(CLOSING).as_deref() != Some("true"))
        .count();
    assert_eq!(unmarked, 0, "responses without the closing mark");
    assert!(responses
        .iter()
        .all(|r| r.header(INSTANCE).as_deref() == Some(instance_id.as_str())));

    // Slow requests in flight hold the gate, whatever the clock says; a
    // quick request sent near their end restarts the quiet window.
    let slow: Vec<_> = (0..2)
        .map(|_| tokio::spawn(client::get(s.inbound, "/delay/1500")))
        .collect();
    let inbound = s.inbound;
    let late = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let sent = Instant::now();
        (sent, client::get(inbound, "/").await)
    });
    eventually(
        "2 slow requests counted",
        Duration::from_secs(5),
        || async { (status(&s).await.inflight_inbound >= 2).then_some(()) },
    )
    .await;
    let mut polls_while_slow = 0;
    while !slow.iter().all(|t| t.is_finished()) {
        let r = client::get(s.inbound, "/graceful/drained").await.unwrap();
        if !slow.iter().all(|t| t.is_finished()) {
            assert_eq!(
                r.status,
                503,
                "drained while slow requests in flight: {}",
                r.text()
            );
            polls_while_slow += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        polls_while_slow >= 5,
        "polled only {polls_while_slow} times during the slow requests"
    );
    for t in slow {
        let r = t.await.unwrap().unwrap();
        assert_eq!(
            (r.status, r.header(CLOSING).as_deref()),
            (200, Some("true"))
        );
    }
    let (late_sent, late_response) = late.await.unwrap();
    let late_response = late_response.unwrap();
    assert_eq!(
        (
            late_response.status,
            late_response.header(CLOSING).as_deref()
        ),
        (200, Some("true"))
    );

    // No 200 from drained before the quiet window after the late request.
    let drained = eventually(
        "drained after the quiet window",
        Duration::from_secs(10),
        || async {
            let r = client::get(s.inbound, "/graceful/drained").await.unwrap();
            if r.status == 200 {
                return Some(r);
            }
            assert_eq!(r.status, 503);
            None
        },
    )
    .await;
    let waited = late_sent.elapsed();
    assert!(
        waited >= QUIET_WINDOW,
        "drained {waited:?} after a request, window {QUIET_WINDOW:?}"
    );
    let st = status_of(&drained);
    assert!(st.drained && !st.forced && st.phase == "drained", "{st:?}");
    assert_eq!(st.inflight_inbound, 0);

    // The long-poll resolved with the gate.
    let lp = long_poll.await.unwrap().unwrap();
    assert_eq!(lp.status, 200, "{}", lp.text());
    assert!(status_of(&lp).drained);

    // After the gate: a local 503 carrying the closing mark; the app never sees it.
    let served = upstream.requests.load(SeqCst);
    let rejected = client::get(s.inbound, "/anything").await.unwrap();
    assert_eq!(rejected.status, 503);
    assert_eq!(rejected.header(CLOSING).as_deref(), Some("true"));
    assert_eq!(
        rejected.header(INSTANCE).as_deref(),
        Some(instance_id.as_str())
    );
    assert_eq!(upstream.requests.load(SeqCst), served);

    inflight_gauge_is_zero(&s.envoy).await;
    assert!(s.envoy.stat("wasmcustom.graceful_provider_rejected").await >= Some(1));
    assert!(
        s.envoy
            .stat("wasmcustom.graceful_provider_closing_marked")
            .await
            >= Some(203)
    );
    assert_eq!(
        s.envoy.stat("wasmcustom.graceful_drain_phase").await,
        Some(2)
    );
    assert_eq!(
        s.envoy.stat("wasmcustom.graceful_drain_forced").await,
        Some(0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_marks_grpc_trailers_and_answers_grpc_health() {
    // The marks on one HTTP/2 connection across closing: with
    // close_connections on (the default with admin_cluster), Envoy sends
    // this connection GOAWAY some 100-200 ms after closing, and a later
    // request here would race it (CI saw "channel closed" once, native).
    // Telling connections has its own tests below.
    let config = DRAIN_CONFIG.replace('}', r#","close_connections":"off"}"#);
    let (s, _) = sidecar("grpc", &config, "{}").await;
    let mut h2 = Conn::http2(s.inbound).await.unwrap();

    // Serving: health is the app's own answer; no marks anywhere.
    let health = h2.grpc("/grpc.health.v1.Health/Check", b"").await.unwrap();
    assert_eq!(health.grpc_status().as_deref(), Some("0"));
    assert_eq!(
        &health.body[5..],
        &[0x08, 0x01],
        "the app's SERVING message"
    );
    let r = h2.grpc("/grpc/trailers", b"hi").await.unwrap();
    assert_eq!(r.grpc_status().as_deref(), Some("0"));
    assert_eq!(r.trailer(CLOSING), None);

    mesh::start_closing(s.inbound).await;

    // Upstream trailers get the mark next to grpc-status.
    let r = h2.grpc("/grpc/trailers", b"hi").await.unwrap();
    assert_eq!(r.header(CLOSING).as_deref(), Some("true"));
    assert_eq!(
        r.trailer(CLOSING).as_deref(),
        Some("true"),
        "trailers: {:?}",
        r.trailers
    );
    assert_eq!(r.trailer("grpc-status").as_deref(), Some("0"));
    // No upstream trailers (not valid gRPC): the mark is in the headers;
    // the filter makes no trailers up (that would need its body callback,
    // entered for every chunk of every response).
    let r = h2.grpc("/grpc/no-trailers", b"hi").await.unwrap();
    assert_eq!(r.header(CLOSING).as_deref(), Some("true"));
    assert_eq!(r.trailer(CLOSING), None, "trailers: {:?}", r.trailers);
    assert_eq!(&r.body[5..], b"hello", "body intact");

    // Closing: health is answered by the filter, UNAVAILABLE / NOT_SERVING.
    let health = h2.grpc("/grpc.health.v1.Health/Check", b"").await.unwrap();
    assert_eq!(health.grpc_status().as_deref(), Some("14"), "{health:?}");
    assert_eq!(
        health.header("grpc-message").as_deref(),
        Some("NOT_SERVING")
    );

    // HTTP/1.1 on the same listener still gets the header mark.
    let r = client::get(s.inbound, "/").await.unwrap();
    assert_eq!(r.header(CLOSING).as_deref(), Some("true"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_starts_closing_on_envoy_healthcheck_fail() {
    let (s, _) = sidecar("healthcheck-fail", DRAIN_CONFIG, "{}").await;
    // Envoy answers /ready 503 while it starts up; the filter must not take
    // that for a shutdown. By now it is LIVE: still serving.
    assert_eq!(status(&s).await.phase, "serving");
    assert_eq!(s.envoy.admin_post("/healthcheck/fail").await.status, 200);
    eventually(
        "readiness NOT_SERVING after /healthcheck/fail",
        Duration::from_secs(10),
        || async {
            (client::get(s.inbound, "/graceful/ready").await.ok()?.status == 503).then_some(())
        },
    )
    .await;
    assert_eq!(status(&s).await.phase, "closing");
    let r = client::get(s.inbound, "/").await.unwrap();
    assert_eq!(r.header(CLOSING).as_deref(), Some("true"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_forces_the_gate_at_step_timeout_while_requests_keep_arriving_and_counts_it() {
    let cfg = r#"{"consumer_update_wait":"200ms","quiet_window":"100ms","step_timeout":"500ms","timeout":"60s"}"#;
    let (s, slow, started) = closing_with_one_in_flight("step-timeout", cfg, 4000).await;
    // A caller that ignores the mark keeps arriving every 20 ms: arrivals
    // never stop, so step_timeout ends the wait.
    let inbound = s.inbound;
    let keep_calling = tokio::spawn(async move {
        while started.elapsed() < Duration::from_millis(2500) {
            let _ = client::get(inbound, "/").await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let r = client::get(s.inbound, "/graceful/drained?wait=10s")
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(r.status, 200, "{}", r.text());
    let st = status_of(&r);
    assert!(st.forced && st.inflight_inbound >= 1, "{st:?}");
    assert!(
        took >= Duration::from_millis(700),
        "forced before wait + step: {took:?}"
    );
    assert!(
        took < Duration::from_millis(3500),
        "forced long after wait + step: {took:?}"
    );
    assert_eq!(
        s.envoy.stat("wasmcustom.graceful_drain_forced").await,
        Some(1),
        "counted once, not per VM"
    );
    assert_eq!(
        s.envoy
            .stat("wasmcustom.graceful_drain_passed_step_timeout")
            .await,
        Some(1)
    );
    keep_calling.await.unwrap();
    // The in-flight request is not cut by the gate; it finishes and is counted out.
    assert_eq!(slow.await.unwrap().unwrap().status, 200);
    inflight_gauge_is_zero(&s.envoy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_longest_request_a_request_in_flight_after_arrivals_stopped_is_waited_for() {
    // wait + step_timeout = 700 ms; the request takes 2.5 s and nothing
    // else arrives: with longest_request set the gate waits for it
    // (timeout is the bound), quiet.
    let cfg = r#"{"consumer_update_wait":"200ms","quiet_window":"100ms","step_timeout":"500ms","timeout":"60s","longest_request":"5s"}"#;
    let (s, slow, started) = closing_with_one_in_flight("step-arrivals-stopped", cfg, 2500).await;
    let r = client::get(s.inbound, "/graceful/drained?wait=10s")
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(r.status, 200, "{}", r.text());
    let st = status_of(&r);
    assert!(!st.forced && st.inflight_inbound == 0, "{st:?}");
    assert!(
        took >= Duration::from_millis(2000),
        "passed before the request ended: {took:?}"
    );
    assert_eq!(slow.await.unwrap().unwrap().status, 200);
    assert_eq!(
        s.envoy.stat("wasmcustom.graceful_drain_forced").await,
        Some(0)
    );
}

/// What one late caller got back while the provider was closing.
#[derive(Debug, Default)]
struct LateCalls {
    admitted_marked: u64,
    refused_marked: u64,
    other: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_longest_request_late_callers_are_refused_and_the_long_request_completes() {
    // wait + step_timeout = 2 s; a 10 s request in flight at closing and a
    // caller that missed the mark sending one request every 100 ms: past
    // 2 s the caller gets the marked 503 (admission stopped), the long
    // request completes, and the gate passes quiet after it.
    let cfg = r#"{"consumer_update_wait":"1s","quiet_window":"500ms","step_timeout":"1s","longest_request":"10s"}"#;
    let (s, long, started) = closing_with_one_in_flight("longest-late-callers", cfg, 10000).await;
    let inbound = s.inbound;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = stop.clone();
    let late_caller = tokio::spawn(async move {
        let mut got = LateCalls::default();
        let mut every = tokio::time::interval(Duration::from_millis(100));
        while !stopped.load(SeqCst) {
            every.tick().await;
            let r = client::request(
                inbound,
                "GET",
                "/",
                &[("x-graceful-consumer", "late-caller")],
            )
            .await;
            match r {
                Ok(r) if r.header(CLOSING).as_deref() == Some("true") && r.status == 200 => {
                    got.admitted_marked += 1
                }
                Ok(r) if r.header(CLOSING).as_deref() == Some("true") && r.status == 503 => {
                    got.refused_marked += 1
                }
                Ok(r) => got
                    .other
                    .push(format!("{} {:?}", r.status, r.header(CLOSING))),
                Err(e) => got.other.push(e.to_string()),
            }
        }
        got
    });
    let long = long.await.unwrap().unwrap();
    let long_took = started.elapsed();
    let r = client::get(s.inbound, "/graceful/drained?wait=20s")
        .await
        .unwrap();
    let drained_at = started.elapsed();
    stop.store(true, SeqCst);
    let calls = late_caller.await.unwrap();
    assert_eq!(long.status, 200, "the long request is not cut");
    assert_eq!(r.status, 200, "{}", r.text());
    let st = status_of(&r);
    assert!(!st.forced && st.inflight_inbound == 0, "{st:?}");
    assert!(
        drained_at >= long_took,
        "passed at {drained_at:?}, before the long request ended at {long_took:?}"
    );
    assert!(
        calls.other.is_empty(),
        "unmarked or failed answers: {calls:?}"
    );
    assert!(
        calls.admitted_marked >= 5 && calls.refused_marked >= 40,
        "served marked until wait + step_timeout, then refused: {calls:?}"
    );
    // The report counts the refusals and names the caller; the provider's
    // copies merge their callers on their ticks.
    let report = eventually(
        "refusals merged into the report",
        Duration::from_secs(5),
        || async {
            let r = client::get(inbound, "/graceful/report").await.ok()?;
            let report: serde_json::Value = serde_json::from_slice(&r.body).ok()?;
            (report["refused_late"].as_u64()? >= calls.refused_marked.saturating_sub(10))
                .then_some(report)
        },
    )
    .await;
    assert_eq!(
        (report["forced"].clone(), report["forced_by"].clone()),
        (false.into(), serde_json::Value::Null),
        "{report:#}"
    );
    let refused = report["refused_late"].as_u64().unwrap_or(0);
    assert!(
        refused <= calls.refused_marked,
        "{refused} refused, the caller saw {calls:?}"
    );
    let peers = report["peers"].as_array().cloned().unwrap_or_default();
    let caller = peers.iter().find(|p| p["consumer"] == "late-caller");
    assert_eq!(
        caller.map(|p| p["refused_late"].clone()),
        Some(refused.into()),
        "the late caller carries every refusal: {report:#}"
    );
    assert_eq!(
        s.envoy.stat("wasmcustom.graceful_drain_forced").await,
        Some(0)
    );
    inflight_gauge_is_zero(&s.envoy).await;
    println!(
        "longest_request 10s: long request 200 after {long_took:?}, gate passed quiet at {drained_at:?}; late caller: {} marked 200, {} marked 503, report refused_late {refused}",
        calls.admitted_marked, calls.refused_marked
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_refuses_closing_from_sources_outside_allowed_sources() {
    let cfg = r#"{"allowed_sources":["10.0.0.0/8"]}"#;
    let (s, _) = sidecar("allowed-sources", cfg, "{}").await;
    let r = client::request(
        s.inbound,
        "POST",
        "/graceful/closing",
        &[("x-forwarded-for", "10.1.2.3")],
    )
    .await
    .unwrap();
    assert_eq!(
        r.status, 403,
        "a forwarded-for header is not the source address"
    );
    // Loopback is outside these sources too: status answers it 403, the
    // phase gauge says serving.
    let r = client::get(s.inbound, "/graceful/status").await.unwrap();
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(
        s.envoy.stat("wasmcustom.graceful_drain_phase").await,
        Some(0)
    );
    assert_eq!(
        client::get(s.inbound, "/graceful/ready")
            .await
            .unwrap()
            .status,
        200
    );
    // Wrong method and bad wait are answered, never forwarded.
    let r = client::get(s.inbound, "/graceful/closing").await.unwrap();
    assert_eq!(
        (r.status, r.header("allow").as_deref()),
        (405, Some("POST"))
    );
    assert_eq!(
        client::get(s.inbound, "/graceful/drained?wait=soon")
            .await
            .unwrap()
            .status,
        400
    );
}

async fn refused(name: &str, drain_config: &str, provider_config: &str, expect: &[&str]) {
    // Envoy must refuse the config: nothing is served, nothing bound here.
    let mut envoy = EnvoySpec::new(name, "provider-sidecar.yaml")
        .set("LISTEN_ADDRESS", "127.0.0.1")
        .set("INBOUND_PORT", 0)
        .set("APP_PORT", refusing_port())
        .set("DRAIN_CONFIG", drain_config)
        .set("PROVIDER_CONFIG", provider_config)
        .spawn();
    let status = envoy.wait_exit(Duration::from_secs(60)).await;
    let log = envoy.log();
    assert!(
        status.is_some_and(|s| !s.success()),
        "envoy must refuse to start ({status:?}); log:\n{log}"
    );
    for needle in expect {
        assert!(
            log.contains(needle),
            "log should contain {needle:?}; log:\n{log}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_refuses_bad_config_and_names_the_field() {
    refused(
        "bad-provider",
        "{}",
        r#"{"closing_header": ""}"#,
        &[
            r#"invalid configuration: field "closing_header": header name is empty"#,
            &Delivery::from_env().refusal("graceful_provider"),
        ],
    )
    .await;
    refused(
        "bad-drain-duration",
        r#"{"quiet_window": "5"}"#,
        "{}",
        &[
            r#"field "quiet_window": invalid duration "5": missing unit"#,
            &Delivery::from_env().refusal("graceful_drain"),
        ],
    )
    .await;
    refused(
        "bad-drain-unknown",
        r#"{"quiet_windw": "5s"}"#,
        "{}",
        &["unknown field `quiet_windw`"],
    )
    .await;
    refused(
        "bad-drain-close-connections",
        r#"{"close_connections": "healthcheck_fail"}"#,
        "{}",
        &[
            r#"field "close_connections": needs admin_cluster"#,
            &Delivery::from_env().refusal("graceful_drain"),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_keeps_request_bodies_and_methods_intact() {
    // The filters sit on every request: a POST with a body passes unchanged.
    let (s, upstream) = sidecar("passthrough", DRAIN_CONFIG, r#"{"instance_id":"pod-a"}"#).await;
    let mut conn = Conn::http1(s.inbound).await.unwrap();
    let r = conn
        .send(
            "POST",
            "/echo",
            &[("content-type", "text/plain")],
            Bytes::from_static(b"payload"),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header(INSTANCE).as_deref(),
        Some("pod-a"),
        "configured instance_id wins"
    );
    assert_eq!(upstream.requests.load(SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_drains_through_the_kubernetes_prestop_hook_of_the_examples() {
    // `demo-app prestop` (graceful-hook's code, which examples/kubernetes
    // runs as both preStop hooks): it must start closing and return only
    // once the gate has passed.
    let cfg = r#"{"consumer_update_wait":"1s","quiet_window":"200ms"}"#;
    let (s, _) = sidecar("prestop", cfg, "{}").await;
    let bin = graceful_harness::support::upstream::demo_app_binary();
    let started = Instant::now();
    let out = tokio::process::Command::new(&bin)
        .args(["prestop", &format!("http://{}", s.inbound), "10s"])
        .output()
        .await
        .unwrap_or_else(|e| panic!("{}: {e} (build it: cargo build -p demo-app)", bin.display()));
    assert!(
        out.status.success(),
        "prestop failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "returned before consumer_update_wait"
    );
    let st = status(&s).await;
    assert!(st.drained && !st.forced, "{st:?}");
}

/// The gate protocol on real Envoy: with no quiet window and no wait, every
/// tick of both workers' drain copies whose look sees nothing in flight
/// tries to pass while requests keep arriving on both workers. The pass
/// must be unforced, every request admitted before it must have ended (the
/// app's count no longer moves once the gate reads drained), and every
/// later request gets the marked 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn it_never_admits_a_request_after_an_unforced_pass_under_racing_load() {
    let config =
        r#"{"consumer_update_wait":"0s","quiet_window":"0s","step_timeout":"30s","timeout":"60s"}"#;
    let (s, upstream) = sidecar("gate-race", config, "{}").await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let addr = s.inbound;
    let workers: Vec<_> = (0..6)
        .map(|_| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut conn = Conn::http1(addr).await.unwrap();
                let mut seen = Vec::new();
                while !stop.load(SeqCst) {
                    // When it was sent: one sent after the client had the
                    // drained answer reached Envoy after the pass. (Its
                    // arrival time would not do: a response Envoy sent
                    // before the pass may be read after the drained answer
                    // on another connection.)
                    let sent = Instant::now();
                    let r = conn.get("/").await.unwrap();
                    seen.push((sent, r.status, r.header(CLOSING)));
                    if r.header("connection").as_deref() == Some("close") {
                        conn = Conn::http1(addr).await.unwrap();
                    }
                    tokio::time::sleep(Duration::from_micros(300)).await;
                }
                seen
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let closing = client::post(s.inbound, "/graceful/closing").await.unwrap();
    assert_eq!(closing.status, 202, "{}", closing.text());
    let drained = client::get(s.inbound, "/graceful/drained?wait=30s")
        .await
        .unwrap();
    let drained_seen = Instant::now();
    assert_eq!(drained.status, 200, "{}", drained.text());
    let st = status_of(&drained);
    assert!(
        !st.forced,
        "the pass must be the protocol's, not a timeout: {st:?}"
    );
    let served_at_pass = upstream.requests.load(SeqCst);
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, SeqCst);
    let mut after = 0;
    let mut rejected_before = 0;
    let mut total = 0;
    for w in workers {
        for (at, status, closing) in w.await.unwrap() {
            total += 1;
            assert!(
                status == 200 || (status == 503 && closing.as_deref() == Some("true")),
                "status {status} closing {closing:?}"
            );
            if at > drained_seen {
                after += 1;
                assert_eq!(status, 503, "sent after the drained answer, and served");
            } else if status == 503 {
                rejected_before += 1;
            }
        }
    }
    assert_eq!(
        upstream.requests.load(SeqCst),
        served_at_pass,
        "the app saw a request after the gate read drained"
    );
    assert!(after >= 50, "only {after} requests after the pass");
    println!(
        "{total} requests; pass at closing + {} ms; {rejected_before} rejected before the drained answer arrived, {after} after",
        st.closing_for_ms.unwrap_or(0)
    );
    inflight_gauge_is_zero(&s.envoy).await;
    assert_eq!(
        s.envoy.stat("wasmcustom.graceful_drain_forced").await,
        Some(0)
    );
    assert!(s.envoy.stat("wasmcustom.graceful_drain_gate").await >= Some(1));
}

/// Closing lasts while the connection tests look (the gate cannot pass
/// before `consumer_update_wait`).
const LONG_CLOSING: &str = r#"{"consumer_update_wait":"20s","quiet_window":"500ms","step_timeout":"20s","timeout":"60s","admin_cluster":"envoy_admin"}"#;

/// One GET on a raw keep-alive HTTP/1.1 connection that never closes it
/// itself (as a client that ignores `connection: close` does): the
/// response head, lower-cased.
async fn raw_get(stream: &mut tokio::net::TcpStream) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: test\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let done = |buf: &[u8]| {
        let text = String::from_utf8_lossy(buf).to_ascii_lowercase();
        let end = text.find("\r\n\r\n")?;
        let head = text[..end].to_string();
        let body = buf.len() - end - 4;
        let length = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|n| n.trim().parse::<usize>().ok());
        match length {
            Some(n) => (body >= n).then_some(head),
            None => text.ends_with("0\r\n\r\n").then_some(head),
        }
    };
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk))
            .await
            .expect("an answer within 10 s")
            .unwrap();
        assert!(n > 0, "connection closed before an answer");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(head) = done(&buf) {
            return head;
        }
    }
}

/// What clients that never read the closing mark saw after
/// `POST /graceful/closing`, each on a connection opened while serving.
#[derive(Debug)]
struct Told {
    /// The first response of a raw keep-alive connection to say
    /// `connection: close`, after closing started.
    raw_close_after: Option<Duration>,
    /// After that response, Envoy ended the raw connection (the client
    /// never closes it): when, after closing started.
    raw_ended_after: Option<Duration>,
    /// hyper's HTTP/1.1 connection got `connection: close` and ended.
    hyper_http1_ended: bool,
    /// An HTTP/2 connection sending a request every 100 ms met GOAWAY.
    goaway_after: Option<Duration>,
}

async fn told_after_closing(s: &Sidecar, look: Duration) -> Told {
    use tokio::io::AsyncReadExt;
    let mut raw = tokio::net::TcpStream::connect(s.inbound).await.unwrap();
    let mut h1 = Conn::http1(s.inbound).await.unwrap();
    let mut h2 = client::H2Conn::connect(s.inbound).await.unwrap();
    // Serving: keep-alive is kept.
    for _ in 0..2 {
        let head = raw_get(&mut raw).await;
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert!(!head.contains("connection: close"), "serving: {head}");
        let r = h1.get("/").await.unwrap();
        assert_eq!((r.status, r.header("connection")), (200, None));
        assert_eq!(h2.get("/").await, Ok(200));
    }
    mesh::start_closing(s.inbound).await;
    let t0 = Instant::now();
    let raw_side = async {
        while t0.elapsed() < look {
            let head = raw_get(&mut raw).await;
            assert!(head.contains(&format!("{CLOSING}: true")), "{head}");
            if head.contains("connection: close") {
                let told = t0.elapsed();
                let mut rest = [0u8; 64];
                let read = tokio::time::timeout(Duration::from_secs(15), raw.read(&mut rest)).await;
                let ended = matches!(read, Ok(Ok(0)) | Ok(Err(_)));
                return (Some(told), ended.then(|| t0.elapsed()));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (None, None)
    };
    let h1_side = async {
        while t0.elapsed() < look {
            let r = h1.get("/").await.unwrap();
            if r.header("connection").as_deref() == Some("close") {
                return wait_for(
                    "hyper's HTTP/1.1 connection to end",
                    Duration::from_secs(5),
                    || async { h1.is_closed().then_some(()) },
                )
                .await
                .is_ok();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    };
    let h2_side = async {
        while t0.elapsed() < look {
            match h2.get("/").await {
                Ok(status) => assert_eq!(status, 200),
                Err(e) if e.starts_with(client::GOAWAY) => return Some(t0.elapsed()),
                Err(e) => panic!("HTTP/2 request: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    };
    let ((raw_close_after, raw_ended_after), hyper_http1_ended, goaway_after) =
        tokio::join!(raw_side, h1_side, h2_side);
    Told {
        raw_close_after,
        raw_ended_after,
        hyper_http1_ended,
        goaway_after,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn it_tells_keep_alive_and_http2_clients_to_leave_once_closing() {
    let (s, _) = sidecar("close-connections", LONG_CLOSING, "{}").await;
    let told = told_after_closing(&s, Duration::from_secs(3)).await;
    println!("{told:?}");
    let log = || s.envoy.log();
    assert!(
        told.raw_close_after
            .is_some_and(|t| t < Duration::from_secs(2)),
        "a keep-alive response says connection: close within 2 s: {told:?}\n{}",
        log()
    );
    // Envoy ends it after its drain_timeout (5 s) even for a client that
    // keeps it open.
    assert!(
        told.raw_ended_after
            .is_some_and(|t| t < Duration::from_secs(10)),
        "Envoy ends the raw connection: {told:?}"
    );
    assert!(told.hyper_http1_ended, "{told:?}");
    assert!(
        told.goaway_after
            .is_some_and(|t| t < Duration::from_secs(3)),
        "HTTP/2 GOAWAY within 3 s: {told:?}\n{}",
        log()
    );
    // New connections are still accepted and served (marked) until drained.
    for conn in [Conn::http1(s.inbound).await, Conn::http2(s.inbound).await] {
        let r = conn.unwrap().get("/").await.unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.header(CLOSING).as_deref(), Some("true"));
    }
    assert_eq!(status(&s).await.phase, "closing");
    assert!(
        log().contains("connections told to close: admin POST /healthcheck/fail: 200"),
        "{}",
        log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_close_connections_off_keep_alive_and_http2_clients_are_not_told() {
    let config = LONG_CLOSING.replace('}', r#","close_connections":"off"}"#);
    let (s, _) = sidecar("close-connections-off", &config, "{}").await;
    let told = told_after_closing(&s, Duration::from_secs(2)).await;
    assert_eq!(
        (
            told.raw_close_after,
            told.hyper_http1_ended,
            told.goaway_after
        ),
        (None, false, None),
        "{told:?}"
    );
    assert_eq!(status(&s).await.phase, "closing");
}

/// Envoy Gateway's shape: listeners of drain type MODIFY_ONLY, which
/// `/healthcheck/fail` does not drain, and `--drain-strategy immediate`.
/// `drain_listeners` starts Envoy's drain sequence on the inbound listener
/// instead, and the clients are told as with `healthcheck_fail` on a
/// DEFAULT listener; `healthcheck_fail` there tells them nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn drain_listeners_tells_clients_where_healthcheck_fail_cannot() {
    for (mode, told) in [("drain_listeners", true), ("healthcheck_fail", false)] {
        let config = LONG_CLOSING.replace('}', &format!(r#","close_connections":"{mode}"}}"#));
        let (s, _) = sidecar_with(&format!("close-{mode}"), &config, "{}", |spec| {
            spec.set("INBOUND_DRAIN_TYPE", "MODIFY_ONLY")
                .arg("--drain-strategy")
                .arg("immediate")
        })
        .await;
        let seen = told_after_closing(&s, Duration::from_secs(2)).await;
        println!("{mode} on a MODIFY_ONLY listener: {seen:?}");
        assert_eq!(
            (
                seen.raw_close_after.is_some(),
                seen.hyper_http1_ended,
                seen.goaway_after.is_some()
            ),
            (told, told, told),
            "{mode}: {seen:?}\n{}",
            s.envoy.log()
        );
        if told {
            assert!(seen
                .raw_close_after
                .is_some_and(|t| t < Duration::from_secs(2)));
            assert!(seen
                .goaway_after
                .is_some_and(|t| t < Duration::from_secs(2)));
            // skip_exit: the listener still takes new connections.
            let r = Conn::http1(s.inbound)
                .await
                .unwrap()
                .get("/")
                .await
                .unwrap();
            assert_eq!(r.header(CLOSING).as_deref(), Some("true"));
        }
        assert!(
            s.envoy
                .log()
                .contains("connections told to close: admin POST"),
            "{}",
            s.envoy.log()
        );
    }
}

const WATCH: &str = "/grpc.health.v1.Health/Watch";

/// A gRPC health `Watch` held since serving is told of the closing within
/// 2 s: gRPC's client-side health checking takes a Watch that ends with a
/// status other than OK or UNIMPLEMENTED (here a reset, as Envoy ends a
/// stream whose headers went out) for not serving. A Watch opened after
/// closing is answered NOT_SERVING by the filter, and the held one never
/// holds the gate: it passes unforced.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn it_tells_a_grpc_health_watch_of_the_closing_and_the_watch_holds_no_gate() {
    use client::{GrpcEvent, H2Conn};
    let (s, _) = sidecar("grpc-watch", DRAIN_CONFIG, "{}").await;
    let mut h2 = H2Conn::connect(s.inbound).await.unwrap();
    let mut watch = h2.grpc_stream(WATCH).await.unwrap();
    // HealthCheckResponse { status: SERVING }, from the app.
    assert_eq!(
        watch.next(Duration::from_secs(5)).await,
        Ok(GrpcEvent::Message(vec![0x08, 0x01]))
    );
    assert!(
        watch.next(Duration::from_millis(500)).await.is_err(),
        "the app holds the Watch open"
    );
    mesh::start_closing(s.inbound).await;
    let t0 = Instant::now();
    let end = watch.next(Duration::from_secs(2)).await;
    let told = t0.elapsed();
    println!("held Watch after closing, at {told:?}: {end:?}");
    let failed = match &end {
        Ok(GrpcEvent::Reset(_)) => true,
        Ok(GrpcEvent::Ended {
            status: Some(code), ..
        }) => code != "0" && code != "12",
        _ => false,
    };
    assert!(failed, "the Watch ends, not OK: {end:?}\n{}", s.envoy.log());
    // A new Watch: NOT_SERVING from the filter, the app never asked.
    let mut fresh = H2Conn::connect(s.inbound).await.unwrap();
    let mut late = fresh.grpc_stream(WATCH).await.unwrap();
    assert_eq!(
        late.next(Duration::from_secs(2)).await,
        Ok(GrpcEvent::Ended {
            status: Some("14".into()),
            message: Some("NOT_SERVING".into())
        })
    );
    // Nothing else in flight: the gate passes, unforced.
    let drained = mesh::until_drained(s.inbound, Duration::from_secs(10)).await;
    assert!(!drained.forced, "{drained:?}");
}

/// A gRPC server stream the app never ends. Configured as long-lived it
/// leaves the in-flight count, the gate passes unforced with it open, and
/// it ends within a tick of the pass (a reset: its headers went out; a
/// gRPC client reads the stream as failed, not OK). Not configured, it
/// holds the gate until the step timeout forces it (the old behaviour).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_lived_stream_does_not_hold_the_gate_and_ends_at_drained() {
    use client::{GrpcEvent, H2Conn};
    let drain = r#"{"consumer_update_wait":"1s","quiet_window":"500ms","step_timeout":"2s","timeout":"60s","admin_cluster":"envoy_admin"}"#;
    for (provider, long_lived) in [(r#"{"long_lived_paths":["/grpc/*"]}"#, true), ("{}", false)] {
        let (s, _) = sidecar(&format!("long-lived-{long_lived}"), drain, provider).await;
        let mut h2 = H2Conn::connect(s.inbound).await.unwrap();
        let mut held = h2.grpc_stream("/grpc/hold").await.unwrap();
        assert_eq!(
            held.next(Duration::from_secs(5)).await,
            Ok(GrpcEvent::Message(b"hello".to_vec()))
        );
        held_through_closing(&s, "gRPC stream", long_lived).await;
        if long_lived {
            let end = held.next(Duration::from_secs(2)).await;
            println!("the held stream after the pass: {end:?}");
            let failed = match &end {
                Ok(GrpcEvent::Reset(_)) => true,
                Ok(GrpcEvent::Ended {
                    status: Some(code), ..
                }) => code != "0",
                _ => false,
            };
            assert!(failed, "{end:?}\n{}", s.envoy.log());
            assert!(s
                .envoy
                .log()
                .contains("drained: ending 1 long-lived stream(s)"));
        }
    }
}

/// A WebSocket through the sidecar (a real client, tokio-tungstenite, over
/// the shipped `upgrade_configs`) is a long-lived stream by default: it
/// echoes, leaves the in-flight count, does not hold the gate, and is
/// closed at drained. With `long_lived_upgrades: false` it holds the gate
/// until the step timeout forces it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_does_not_hold_the_gate_and_is_closed_at_drained() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let drain = r#"{"consumer_update_wait":"1s","quiet_window":"300ms","step_timeout":"2s","timeout":"60s"}"#;
    for (provider, long_lived) in [("{}", true), (r#"{"long_lived_upgrades":false}"#, false)] {
        let (s, _) = sidecar(&format!("websocket-{long_lived}"), drain, provider).await;
        let tcp = tokio::net::TcpStream::connect(s.inbound).await.unwrap();
        let (mut ws, answer) =
            tokio_tungstenite::client_async(format!("ws://{}/ws", s.inbound), tcp)
                .await
                .unwrap_or_else(|e| panic!("WebSocket handshake: {e}\n{}", s.envoy.log()));
        assert_eq!(answer.status(), 101);
        ws.send(Message::text("hi")).await.unwrap();
        let echo = tokio::time::timeout(Duration::from_secs(5), ws.next()).await;
        assert!(
            matches!(&echo, Ok(Some(Ok(m))) if m.to_text().ok() == Some("hi")),
            "{echo:?}"
        );
        let t0 = held_through_closing(&s, "WebSocket", long_lived).await;
        if long_lived {
            // Closed at drained (the provider's 100 ms tick): the client's
            // next read ends, however the close is framed.
            let end = tokio::time::timeout(Duration::from_secs(2), ws.next()).await;
            println!(
                "the WebSocket after the pass, at {:?}: {end:?}",
                t0.elapsed()
            );
            let closed = match &end {
                Ok(None) | Ok(Some(Err(_))) => true,
                Ok(Some(Ok(m))) => m.is_close(),
                Err(_) => false,
            };
            assert!(closed, "{end:?}\n{}", s.envoy.log());
            assert!(s
                .envoy
                .log()
                .contains("drained: ending 1 long-lived stream(s)"));
        }
    }
}

/// With one stream held open: it is out of the in-flight count if
/// long-lived; then closing, and the gate passes unforced if it is
/// long-lived, forced (by the step timeout) if not. When closing started.
async fn held_through_closing(s: &Sidecar, what: &str, long_lived: bool) -> Instant {
    let inflight = s.envoy.stat("wasmcustom.graceful_provider_inflight").await;
    assert_eq!(
        inflight,
        Some(u64::from(!long_lived)),
        "{what}, long-lived {long_lived}"
    );
    mesh::start_closing(s.inbound).await;
    let t0 = Instant::now();
    let drained = mesh::until_drained(s.inbound, Duration::from_secs(15)).await;
    println!(
        "{what}, long-lived {long_lived}: gate passed at {:?}, forced {}",
        t0.elapsed(),
        drained.forced
    );
    assert_eq!(drained.forced, !long_lived, "{what}: {drained:?}");
    t0
}

/// Once the gate has passed, a new gRPC call is refused as the contract
/// says: UNAVAILABLE (14), the closing mark beside it, on both deliveries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_drained_a_grpc_call_gets_unavailable_with_the_mark() {
    let drain = r#"{"consumer_update_wait":"0s","quiet_window":"100ms","step_timeout":"3s","timeout":"10s","admin_cluster":"envoy_admin"}"#;
    let (s, _) = sidecar("drained-grpc", drain, "{}").await;
    mesh::start_closing(s.inbound).await;
    mesh::until_drained(s.inbound, Duration::from_secs(10)).await;
    let mut h2 = Conn::http2(s.inbound).await.unwrap();
    let r = h2.grpc("/echo.Echo/Say", b"hi").await.unwrap();
    assert_eq!(r.grpc_status().as_deref(), Some("14"), "{r:?}");
    assert_eq!(r.header(CLOSING).as_deref(), Some("true"), "{r:?}");
}

/// The filters' clock on real Envoy is one clock for the process: closing
/// starts on whichever worker took the POST (its VM copy writes the start
/// time into shared data), and every status answer, from either worker's
/// copy, measures `closing_for_ms` from it within the test's own bounds
/// over a second. A clock per VM copy, or none (0), would be off by far.
/// That it is the monotonic one is source (README: Shared data) and the
/// emulator's `abi_clock`: no test here may step this machine's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_worker_measures_closing_on_one_clock() {
    let (s, _) = sidecar("one-clock", LONG_CLOSING, "{}").await;
    let before = Instant::now();
    mesh::start_closing(s.inbound).await;
    let after = Instant::now();
    let mut answers = 0;
    while answers < 40 || before.elapsed() < Duration::from_secs(1) {
        // A new connection each time: the kernel spreads them over the
        // workers (SO_REUSEPORT).
        let sent = Instant::now();
        let st = status(&s).await;
        let got = Instant::now();
        let low = sent.duration_since(after).as_millis() as u64;
        let high = got.duration_since(before).as_millis() as u64 + 1;
        let closing_for_ms = st.closing_for_ms.unwrap_or(u64::MAX);
        assert!(
            (low..=high).contains(&closing_for_ms),
            "closing for {closing_for_ms} ms, the test saw {low}..{high} ms"
        );
        answers += 1;
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let listener = listener_stats(s.inbound.ip());
    for worker in 0..2 {
        let accepted = s
            .envoy
            .stat(&format!("{listener}.worker_{worker}.downstream_cx_total"))
            .await;
        assert!(
            accepted >= Some(5),
            "worker {worker} accepted {accepted:?} of {answers} connections"
        );
    }
}

/// How far ahead of this machine's wall clock Envoy's is, in s, as its
/// access log shows the start of a request to `path` (the sidecar's log
/// lines begin with the start time, s since the epoch); None before the
/// line is written.
fn wall_offset_s(s: &Sidecar, path: &str) -> Option<i64> {
    let log = s.envoy.log();
    let line = log
        .lines()
        .rev()
        .find(|l| l.ends_with(&format!(" {path}")))?;
    let start: f64 = line.split_whitespace().next()?.parse().ok()?;
    let ours = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs_f64();
    Some((start - ours).round() as i64)
}

/// Envoy's wall clock offset, from a request of its own.
async fn envoy_wall_offset_s(s: &Sidecar, probe: &str) -> i64 {
    client::get(s.inbound, probe).await.unwrap();
    eventually(
        "the probe in the access log",
        Duration::from_secs(5),
        || async { wall_offset_s(s, probe) },
    )
    .await
}

/// A step of Envoy's wall clock by an hour, forward or back, mid-drain
/// changes nothing: `closing_for_ms` stays within the test's own bounds,
/// the gate passes quiet after `consumer_update_wait` and the quiet window
/// after the last request, and the report's durations are the test's. On
/// the wall clock a step forward forced the gate at once (`timeout` 60 s
/// had passed) and a step back held it an hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wall_clock_step_of_an_hour_either_way_mid_drain_changes_nothing() {
    for step_s in [3600_i64, -3600] {
        let wall = WallStep::new("wall-step");
        let (s, _) = sidecar_with("wall-step", DRAIN_CONFIG, "{}", |spec| wall.preload(spec)).await;
        let offset = envoy_wall_offset_s(&s, "/wall-before").await;
        assert!(
            offset.abs() <= 2,
            "Envoy's wall clock {offset} s off before the step"
        );

        let before = Instant::now();
        mesh::start_closing(s.inbound).await;
        let after = Instant::now();
        // A request before the step and one after: the quiet window runs
        // from the later one.
        client::get(s.inbound, "/").await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let hour = Duration::from_secs(3600);
        if step_s > 0 {
            wall.ahead(hour);
        } else {
            wall.behind(hour);
        }
        // The step is in place for the request after (its start in the
        // access log, an hour off); that request is the last.
        let last_request = Instant::now();
        let offset = envoy_wall_offset_s(&s, "/wall-after").await;
        assert!(
            (offset - step_s).abs() <= 2,
            "Envoy's wall clock {offset} s off after the step"
        );

        let sent = Instant::now();
        let st = status(&s).await;
        let (low, high) = (
            sent.duration_since(after).as_millis() as u64,
            before.elapsed().as_millis() as u64 + 1,
        );
        let closing_for_ms = st.closing_for_ms.unwrap_or(u64::MAX);
        assert!(
            (low..=high).contains(&closing_for_ms),
            "step {step_s} s: closing for {closing_for_ms} ms, the test saw {low}..{high} ms"
        );

        let drained = mesh::until_drained(s.inbound, Duration::from_secs(10)).await;
        let since_closing = before.elapsed();
        assert!(!drained.forced, "step {step_s} s: {drained:?}");
        assert!(
            last_request.elapsed() >= QUIET_WINDOW,
            "step {step_s} s: drained {:?} after the last request",
            last_request.elapsed()
        );
        let report: serde_json::Value = serde_json::from_slice(
            &client::get(s.inbound, "/graceful/report")
                .await
                .unwrap()
                .body,
        )
        .unwrap();
        let drained_after_ms = report["drained_after_ms"].as_u64().unwrap_or(u64::MAX);
        assert!(
            (1000..=since_closing.as_millis() as u64 + 1).contains(&drained_after_ms),
            "step {step_s} s: {report}"
        );
        assert_eq!(report["forced"], false, "step {step_s} s: {report}");
        let longest = report["request_ms"]["max"].as_f64().unwrap_or(f64::MAX);
        assert!(longest < 5_000.0, "step {step_s} s: {report}");
        println!(
            "wall clock stepped {step_s:+} s mid-drain: passed quiet {drained_after_ms} ms after closing"
        );
    }
}
