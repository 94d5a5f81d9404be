//! Faults on real Envoy (`--concurrency 2`): what each costs, and that
//! nothing leaks. Every test proves load ran with a request counter.

use std::net::SocketAddr;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use graceful_core::drain::status::Status;
use graceful_harness::products::demo::{run, DemoConfig, Mode};
use graceful_harness::support::client::{self, abort_after, Conn};
use graceful_harness::support::envoy::{eventually, Envoy, EnvoySpec};
use graceful_harness::support::load::Protocol;
use graceful_harness::support::mesh::status;
use graceful_harness::support::upstream::Upstream;

async fn provider(name: &str, drain_config: &str, app: &Upstream) -> (Envoy, SocketAddr) {
    let envoy = EnvoySpec::new(name, "provider-sidecar.yaml")
        .set("LISTEN_ADDRESS", "127.0.0.1")
        .set("INBOUND_PORT", 0)
        .set("APP_PORT", app.addr.port())
        .set("DRAIN_CONFIG", drain_config)
        .set("ACCESS_LOG", "/dev/null")
        .start()
        .await;
    let inbound = envoy.listener("inbound").await;
    (envoy, inbound)
}

async fn inflight_settles_at_zero(envoy: &Envoy, addr: SocketAddr) {
    eventually(
        "in-flight count back to 0",
        Duration::from_secs(10),
        || async {
            let gauge = envoy.stat("wasmcustom.graceful_provider_inflight").await;
            (gauge == Some(0) && status(addr).await.inflight_inbound == 0).then_some(())
        },
    )
    .await;
}

/// `POST /graceful/closing` (the preStop hook) and its 202.
async fn start_closing(addr: SocketAddr) {
    let status = client::post(addr, "/graceful/closing")
        .await
        .unwrap()
        .status;
    assert_eq!(status, 202, "POST /graceful/closing");
}

/// The preStop long-poll: the gate passes within 10 s.
async fn wait_drained(addr: SocketAddr) {
    let r = client::get(addr, "/graceful/drained?wait=10s")
        .await
        .unwrap();
    assert_eq!(r.status, 200, "GET /graceful/drained?wait=10s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_bounds_failures_when_a_provider_is_killed_under_load() {
    // No preStop, no closing: SIGKILL of a provider's Envoy and app while
    // the consumer sends 200 requests/s. Its upstream instance tombstones the
    // dead host on the first refused connection, retries carry the requests
    // that met it; only requests in flight at the kill can fail.
    let config = DemoConfig {
        protocol: Protocol::Http1,
        rate: 200,
        connections: 8,
        restarts: 1,
        warmup: Duration::from_millis(1500),
        settle: Duration::from_secs(1),
        tail: Duration::from_secs(1),
        work_dir: graceful_harness::support::envoy::repo_root().join("target/e2e/killed"),
        ..DemoConfig::default()
    };
    let (report, samples) = run(&config, Mode::Killed).await;
    eprintln!("{}", report.line("killed"));
    let expected = u64::from(config.rate) * report.duration_ms / 1000;
    assert!(
        report.requests * 10 >= expected * 9,
        "load ran: {} of about {expected}",
        report.requests
    );
    assert!(
        samples
            .iter()
            .any(|s| s.served_by == 1 && s.due_ms > report.events[0].up_ms),
        "p1 came back"
    );
    assert!(
        report.failed <= config.connections as u64,
        "{} failed: more than the {} requests that can be in flight",
        report.failed,
        config.connections
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_forces_the_gate_when_the_app_dies_behind_a_live_sidecar() {
    let app = Upstream::start().await;
    let cfg = r#"{"consumer_update_wait":"500ms","quiet_window":"300ms","step_timeout":"1s","timeout":"20s"}"#;
    let (envoy, addr) = provider("app-dies", cfg, &app).await;
    let slow: Vec<_> = (0..3)
        .map(|_| tokio::spawn(client::get(addr, "/delay/5000")))
        .collect();
    eventually("slow requests counted", Duration::from_secs(5), || async {
        (status(addr).await.inflight_inbound == 3).then_some(())
    })
    .await;
    // The app dies: its connections close, new ones are refused.
    drop(app);
    for s in slow {
        let r = s.await.unwrap().unwrap();
        assert_eq!(
            r.status, 503,
            "in-flight requests end with the router's 503"
        );
    }
    inflight_settles_at_zero(&envoy, addr).await;
    // Traffic keeps arriving (every request a 503 from the router), so the
    // quiet window never holds: step_timeout forces the gate and says so.
    start_closing(addr).await;
    let started = Instant::now();
    let keep_calling = tokio::spawn(async move {
        let mut n = 0u32;
        while started.elapsed() < Duration::from_millis(2500) {
            let _ = client::get(addr, "/").await;
            n += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        n
    });
    let drained = client::get(addr, "/graceful/drained?wait=10s")
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(drained.status, 200, "{}", drained.text());
    let st: Status = serde_json::from_slice(&drained.body).unwrap();
    assert!(st.forced, "forced: {st:?}");
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_secs(5),
        "forced after {took:?}"
    );
    assert!(keep_calling.await.unwrap() > 10, "requests kept arriving");
    inflight_settles_at_zero(&envoy, addr).await;
    assert_eq!(
        envoy.stat("wasmcustom.graceful_drain_forced").await,
        Some(1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_keeps_counts_exact_through_resets_and_aborts_while_closing() {
    let app = Upstream::start().await;
    let cfg = r#"{"consumer_update_wait":"30s","timeout":"60s"}"#;
    let (envoy, addr) = provider("resets", cfg, &app).await;
    start_closing(addr).await;
    let mut tasks = Vec::new();
    for i in 0..40 {
        tasks.push(tokio::spawn(async move {
            match i % 3 {
                // The upstream resets mid-body, after the headers went out.
                0 => {
                    let _ = client::get(addr, "/reset-after/100").await;
                }
                // The client goes away mid-request.
                1 => abort_after(addr, "/delay/2000", Duration::from_millis(100))
                    .await
                    .unwrap(),
                // HTTP/2: the client cancels a stream (drops the request).
                _ => {
                    let mut c = Conn::http2(addr).await.unwrap();
                    let _ = tokio::time::timeout(Duration::from_millis(100), c.get("/delay/2000"))
                        .await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(
        app.requests() >= 40,
        "the upstream saw the requests: {}",
        app.requests()
    );
    inflight_settles_at_zero(&envoy, addr).await;
    let r = client::get(addr, "/").await.unwrap();
    assert_eq!(
        (r.status, r.header("x-graceful-closing").as_deref()),
        (200, Some("true"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_forces_the_gate_at_the_overall_timeout() {
    let app = Upstream::start().await;
    let cfg = r#"{"consumer_update_wait":"500ms","step_timeout":"10s","timeout":"1500ms"}"#;
    let (envoy, addr) = provider("timeout", cfg, &app).await;
    let slow = tokio::spawn(client::get(addr, "/delay/6000"));
    eventually("slow request counted", Duration::from_secs(5), || async {
        (status(addr).await.inflight_inbound == 1).then_some(())
    })
    .await;
    let started = Instant::now();
    start_closing(addr).await;
    let r = client::get(addr, "/graceful/drained?wait=10s")
        .await
        .unwrap();
    let took = started.elapsed();
    let st: Status = serde_json::from_slice(&r.body).unwrap();
    assert!(
        r.status == 200 && st.forced && st.inflight_inbound == 1,
        "{st:?}"
    );
    assert!(
        took >= Duration::from_millis(1450),
        "forced before the timeout: {took:?}"
    );
    assert!(
        took < Duration::from_secs(4),
        "forced long after the 1.5s timeout (step was 10s): {took:?}"
    );
    assert_eq!(
        envoy.stat("wasmcustom.graceful_drain_forced").await,
        Some(1)
    );
    assert_eq!(
        slow.await.unwrap().unwrap().status,
        200,
        "the gate never cuts a request"
    );
    inflight_settles_at_zero(&envoy, addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_calls_the_shutdown_hook_exactly_once_and_survives_a_failing_one() {
    // on_drained POSTs the status JSON to the app once the gate passes.
    let app = Upstream::start().await;
    let cfg = r#"{"consumer_update_wait":"300ms","quiet_window":"100ms","on_drained":{"cluster":"app","path":"/shutdown"}}"#;
    let (envoy, addr) = provider("on-drained", cfg, &app).await;
    for _ in 0..20 {
        assert_eq!(client::get(addr, "/").await.unwrap().status, 200);
    }
    start_closing(addr).await;
    wait_drained(addr).await;
    eventually(
        "the app got the shutdown call",
        Duration::from_secs(5),
        || async { (app.counters.shutdown_calls.load(SeqCst) == 1).then_some(()) },
    )
    .await;
    // Every VM copy keeps ticking past the gate: still exactly one call.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        app.counters.shutdown_calls.load(SeqCst),
        1,
        "called once, not once per VM copy or tick"
    );
    let body = app.counters.last_shutdown_body.lock().unwrap().clone();
    let st: Status = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert!(st.drained && st.phase == "drained", "{st:?}");
    assert_eq!(
        envoy
            .stat("wasmcustom.graceful_drain_callback_failed")
            .await,
        Some(0)
    );

    // A hook that cannot be reached is counted and does not hold the gate.
    let cfg = r#"{"consumer_update_wait":"300ms","quiet_window":"100ms","on_drained":{"cluster":"no_such_cluster"}}"#;
    let (envoy, addr) = provider("on-drained-fails", cfg, &app).await;
    start_closing(addr).await;
    wait_drained(addr).await;
    eventually(
        "the failed callback counted",
        Duration::from_secs(5),
        || async {
            (envoy
                .stat("wasmcustom.graceful_drain_callback_failed")
                .await
                == Some(1))
            .then_some(())
        },
    )
    .await;
}
