//! The main job, shortened for `make test`: one provider of three goes down
//! and comes back under load, with the filters, on real Envoy (a consumer
//! sidecar and three provider sidecars). `make demo` runs the full version
//! next to the baseline.

use std::time::Duration;

use graceful_harness::products::demo::{run, DemoConfig, Mode};
use graceful_harness::support::load::Protocol;

fn short(protocol: Protocol) -> DemoConfig {
    DemoConfig {
        protocol,
        rate: 200,
        connections: 8,
        restarts: 1,
        warmup: Duration::from_millis(1500),
        settle: Duration::from_secs(1),
        tail: Duration::from_millis(1500),
        drain_config: r#"{"admin_cluster":"envoy_admin","consumer_update_wait":"1s"}"#.into(),
        work_dir: graceful_harness::support::envoy::repo_root()
            .join(format!("target/e2e/demo-{protocol:?}")),
        ..DemoConfig::default()
    }
}

async fn restart_without_failures(protocol: Protocol) {
    let config = short(protocol);
    let (report, samples) = run(&config, Mode::Graceful).await;
    eprintln!("{}", report.line(&format!("{protocol:?}")));
    // The load really ran: about rate × duration requests, all three
    // providers served, and the restarted one served again afterwards.
    let expected = u64::from(config.rate) * report.duration_ms / 1000;
    assert!(
        report.requests * 10 >= expected * 9,
        "{} requests, expected about {expected}",
        report.requests
    );
    for p in 1..=3u8 {
        assert!(
            samples.iter().any(|s| s.served_by == p),
            "provider p{p} served nothing"
        );
    }
    let ev = &report.events[0];
    assert!(
        samples
            .iter()
            .any(|s| s.served_by == 1 && s.due_ms > ev.up_ms),
        "the restarted provider got traffic back: {ev:?}"
    );
    assert_eq!(
        report.failed,
        0,
        "failed requests: {}",
        report.line("graceful")
    );
    // Requests racing the very moment the tombstone is written may still
    // reach the provider: at most one per client connection.
    assert!(
        report.after_closing <= config.connections as u64,
        "{}",
        report.line("graceful")
    );
    // Every outbound request was counted out (exactly: one more or less
    // and this is not 0).
    assert_eq!(
        report.consumer_inflight_end,
        Some(0),
        "graceful_consumer_inflight after the load"
    );
    assert!(
        report.drain_ms[0] >= 1000,
        "the gate waited consumer_update_wait: {:?}",
        report.drain_ms
    );
    // The shutdown's report: drained as measured, and a recommendation
    // with its basis (who called after closing depends on timing here;
    // drain_report.rs pins that).
    let r = ev
        .drain_report
        .as_ref()
        .expect("the graceful run reads the report");
    assert_eq!(r["phase"], "drained", "{r}");
    assert!(r["drained_after_ms"].as_u64() >= Some(1000), "{r}");
    assert_eq!(r["forced"], false, "{r}");
    assert!(r["recommended"]["basis"]["timeout"].is_string(), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_restarts_a_provider_under_http1_load_without_a_failed_request() {
    restart_without_failures(Protocol::Http1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_restarts_a_provider_under_http2_load_without_a_failed_request() {
    restart_without_failures(Protocol::Http2).await;
}

/// `make demo`'s matrix, shortened: with the filters, no scenario loses a
/// request (Istio's retry policy with long requests, unretried POSTs, a
/// registry slower than a short sleep); a SIGKILLed provider costs at most
/// what was in flight on it. And the matrix has teeth: plain Envoy with no
/// preStop loses unretried POSTs. (`scale_down` is scale_down.rs's.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_loses_no_request_in_any_scenario_of_the_matrix_with_the_filters() {
    use graceful_harness::products::demo::matrix::{
        cell, scenario, Approach, DRAIN_CONFIG, SCENARIOS,
    };
    let base = DemoConfig {
        drain_config: DRAIN_CONFIG.into(),
        rate: 200,
        ..short(Protocol::Http1)
    };
    let mut lines = Vec::new();
    // Behind fronts: the test below.
    for s in SCENARIOS
        .iter()
        .filter(|s| s.scale_down_by == 0 && !s.fronts)
    {
        let (config, mode) = cell(&base, s, Approach::Graceful, Protocol::Http1);
        let (report, _) = run(&config, mode).await;
        let line = report.line(&format!("{} graceful", s.name));
        eprintln!("{line}");
        if s.killed {
            // Istio's policy retries no reset: a request in flight on the
            // killed provider fails; nothing after it.
            assert!(report.failed <= config.connections as u64, "{line}");
        } else {
            assert_eq!(report.failed, 0, "{line}");
        }
        if s.shape.long_every > 0 {
            assert!(report.long_requests > 0, "the long requests ran: {line}");
        }
        if s.balancer {
            // Its health watcher is told of each closing within 2 s, long
            // before the provider is gone.
            assert_eq!(report.watch_told_ms.len(), report.events.len(), "{line}");
            assert!(report.watch_told_ms.iter().all(|&t| t <= 2_000), "{line}");
        }
        lines.push(line);
    }
    let post = scenario("no_retry_post").unwrap_or_else(|| panic!("no_retry_post"));
    let (config, mode) = cell(&base, post, Approach::RegistryOnly, Protocol::Http1);
    let (report, _) = run(&config, mode).await;
    let line = report.line("no_retry_post registry_only");
    eprintln!("{line}");
    assert!(
        report.failed > 0,
        "plain Envoy without a preStop loses POSTs: {line}"
    );
}

/// `behind_gateway`, shortened: two fronts with the filters in front of
/// three backends with no sidecar, each backend's preStop `graceful-hook
/// front`. A rolling restart (with a surge) and a scale-down 3 → 1 lose
/// nothing; no request starts at a backend after its preStop returned (both
/// fronts acknowledged); the preStop returns after the last request to the
/// backend ended (5% of requests take 2-5 s: those in flight at closing are
/// waited for, not cut), and within 1 s of it, or of the slowest request
/// in flight at the closing on any backend (the grace count waits for the
/// first byte of those: one could still be retried onto the backend). Plain
/// fronts with Envoy Gateway's `DRAINING` alone lose requests in the same
/// run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_fronts_nothing_is_lost_and_each_backend_leaves_at_its_acknowledgement() {
    use graceful_harness::products::demo::matrix::{cell, scenario, Approach};
    let base = DemoConfig {
        rate: 200,
        connections: 80,
        ..short(Protocol::Http1)
    };
    for name in ["behind_gateway", "behind_gateway_scale_down"] {
        let s = scenario(name).unwrap_or_else(|| panic!("no scenario {name}"));
        let (config, mode) = cell(&base, s, Approach::Graceful, Protocol::Http1);
        let (report, samples) = run(&config, mode).await;
        let line = report.line(&format!("{name} graceful"));
        eprintln!("{line}");
        assert_eq!(report.failed, 0, "{line}");
        assert!(report.long_requests > 0, "the long requests ran: {line}");
        let expected = if s.scale_down_by > 0 {
            s.scale_down_by
        } else {
            config.restarts
        };
        assert_eq!(report.events.len(), expected, "{line}");
        for ev in &report.events {
            assert_eq!(
                ev.started_after_seen,
                Some(0),
                "started after the acknowledgement: {ev:?}"
            );
            let last = ev
                .last_request_end_ms
                .unwrap_or_else(|| panic!("no request reached p{}: {ev:?}", ev.provider));
            // The slowest request in flight anywhere at the closing, as the
            // client saw it end.
            let slowest = samples
                .iter()
                .map(|s| (s.due_ms, s.due_ms + s.latency_us / 1000))
                .filter(|&(due, end)| due <= ev.closing_ms && end >= ev.closing_ms)
                .map(|(_, end)| end)
                .max()
                .unwrap_or(0);
            // Whole ms in the access log: its last request may read 2 ms late.
            assert!(
                last <= ev.drained_ms + 2 && ev.drained_ms <= last.max(slowest) + 1_000,
                "p{}: preStop returned at {} ms, its last request ended at {last} ms, the slowest in flight at closing at {slowest} ms",
                ev.provider,
                ev.drained_ms
            );
        }
    }
    let s = scenario("behind_gateway").unwrap_or_else(|| panic!("behind_gateway"));
    let (config, mode) = cell(&base, s, Approach::DrainingOnly, Protocol::Http1);
    let (report, _) = run(&config, mode).await;
    let line = report.line("behind_gateway draining_only");
    eprintln!("{line}");
    assert!(
        report.failed > 0,
        "DRAINING alone, no preStop, loses requests: {line}"
    );
}
