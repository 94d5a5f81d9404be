//! Scale-downs on real Envoy: of three or four providers, all but one leave
//! at once and do not come back, as an autoscaler or `kubectl scale
//! --replicas=1` takes pods away, under Istio's default retry policy (a
//! marked 503 from a drained provider is not retried). It is `make demo`'s
//! `scale_down` scenario, shortened, with a registry slower than the drain
//! (the leaving providers are gone while it still lists them), with
//! graceful_consumer with and without `admin_cluster` and graceful_drain on
//! the contract's defaults (`{}`).
//!
//! Each run asserts: no request failed; no leaving provider received a
//! request the consumer started after it had seen that provider's first
//! closing answer (the load numbers its requests, so the consumer's and the
//! providers' access logs name the same request; those already routed then
//! are allowed, at most one per client connection); every drain passed
//! quiet; and the load was shared among all providers before and among
//! those remaining after.

use std::time::Duration;

use graceful_harness::products::demo::matrix::{cell, scenario, Approach};
use graceful_harness::products::demo::{run, DemoConfig, Mode};
use graceful_harness::support::envoy::repo_root;
use graceful_harness::support::load::{Protocol, Sample};

/// Slower than a drain on the defaults (3 s `consumer_update_wait`, then
/// quiet) and the exit: only steering keeps requests off the gone
/// providers meanwhile.
const REGISTRY_LAG: Duration = Duration::from_secs(4);

/// The `scale_down` cell of `approach`, `providers` of which all but one
/// leave.
fn scale_down_cell(providers: usize, approach: Approach) -> (DemoConfig, Mode) {
    let base = DemoConfig {
        rate: 200,
        connections: 8,
        warmup: Duration::from_millis(1500),
        tail: Duration::from_secs(1),
        drain_config: "{}".into(),
        work_dir: repo_root().join(format!(
            "target/e2e/scale-down-{providers}-to-1-{}",
            approach.name()
        )),
        ..DemoConfig::default()
    };
    let scale_down = scenario("scale_down").unwrap_or_else(|| panic!("no scale_down scenario"));
    let (mut config, mode) = cell(&base, scale_down, approach, Protocol::Http1);
    config.providers = providers;
    config.scale_down_by = providers - 1;
    config.registry_lag = REGISTRY_LAG;
    (config, mode)
}

/// Requests each provider (1-based index) served among `samples`.
fn served(samples: &[Sample], providers: usize) -> Vec<u64> {
    let mut n = vec![0; providers];
    for s in samples {
        if let Some(slot) = usize::from(s.served_by)
            .checked_sub(1)
            .and_then(|i| n.get_mut(i))
        {
            *slot += 1;
        }
    }
    n
}

/// Each of `among` (1-based) served at least two thirds of an even share of
/// `split`'s requests, and the others none.
fn assert_shared(what: &str, split: &[u64], among: &[usize]) {
    let total: u64 = split.iter().sum();
    let least = total * 2 / (3 * among.len() as u64);
    for (i, &n) in split.iter().enumerate() {
        if among.contains(&(i + 1)) {
            assert!(
                n >= least.max(1),
                "{what}: p{} served {n}, fewer than {least}: {split:?}",
                i + 1
            );
        } else {
            assert_eq!(n, 0, "{what}: p{} served {n}: {split:?}", i + 1);
        }
    }
}

async fn scale_down_to_one(providers: usize, approach: Approach) {
    let (config, mode) = scale_down_cell(providers, approach);
    let label = format!("{providers} -> 1, {}", approach.name());
    scale_down_run(providers, &label, config, mode).await;
}

/// Runs a scale-down cell and asserts what every one must show (module
/// doc); its report.
async fn scale_down_run(
    providers: usize,
    label: &str,
    config: DemoConfig,
    mode: Mode,
) -> graceful_harness::support::run_report::RunReport {
    let label = label.to_string();
    let (report, samples) = run(&config, mode).await;
    eprintln!("{}", report.line(&label));
    for ev in &report.events {
        eprintln!(
            "  p{}: closing at {} ms, seen by the consumer at {} ms, drained at {} ms, gone at {} ms; \
             {} requests after it was seen ({:?} started after), drain report forced_by {}",
            ev.provider,
            ev.closing_ms,
            ev.seen_ms,
            ev.drained_ms,
            ev.down_ms,
            ev.after_closing,
            ev.started_after_seen,
            ev.drain_report.as_ref().map_or("-".into(), |r| r["forced_by"].to_string()),
        );
    }
    let logs = config.work_dir.display();
    let expected = u64::from(config.rate) * report.duration_ms / 1000;
    assert!(
        report.requests * 10 >= expected * 9,
        "{label}: {} requests, expected about {expected}",
        report.requests
    );
    assert_eq!(report.failed, 0, "{label}: failed requests (logs: {logs})");
    assert_eq!(report.events.len(), providers - 1, "{label}");
    for ev in &report.events {
        // Exact: the requests the consumer started after it had seen this
        // provider closing, found by number in the provider's access log.
        assert_eq!(
            ev.started_after_seen,
            Some(0),
            "{label}: p{} received requests started after the consumer saw it closing (logs: {logs})",
            ev.provider
        );
        // The rest of those it received after that moment were routed
        // before it: at most one in flight per client connection.
        assert!(
            ev.after_closing <= config.connections as u64,
            "{label}: p{} received {} requests after it was seen closing (logs: {logs})",
            ev.provider,
            ev.after_closing
        );
        let r = ev
            .drain_report
            .as_ref()
            .unwrap_or_else(|| panic!("{label}: no drain report from p{}", ev.provider));
        assert_eq!(r["phase"], "drained", "{label}: p{}: {r}", ev.provider);
        assert_eq!(
            r["forced"], false,
            "{label}: p{} was forced: {r}",
            ev.provider
        );
        assert!(r["forced_by"].is_null(), "{label}: p{}: {r}", ev.provider);
    }
    assert_eq!(report.consumer_inflight_end, Some(0), "{label}");
    // Before the first closing, every provider took its share; after the
    // consumer had seen the last leaving one, the remaining ones took it
    // all (50 ms spare: `seen_ms` is read from the consumer's log, on the
    // wall clock, and due times from the load's monotonic clock).
    let first_closing = report
        .events
        .iter()
        .map(|e| e.closing_ms)
        .min()
        .unwrap_or(0);
    let last_seen = report.events.iter().map(|e| e.seen_ms).max().unwrap_or(0);
    let before: Vec<Sample> = samples
        .iter()
        .copied()
        .filter(|s| s.due_ms < first_closing)
        .collect();
    let after: Vec<Sample> = samples
        .iter()
        .copied()
        .filter(|s| s.due_ms > last_seen + 50)
        .collect();
    let all: Vec<usize> = (1..=providers).collect();
    let remaining: Vec<usize> = (providers..=providers).collect();
    assert_shared(
        &format!("{label}, before closing"),
        &served(&before, providers),
        &all,
    );
    assert_shared(
        &format!("{label}, after the last mark was seen"),
        &served(&after, providers),
        &remaining,
    );
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_scales_three_providers_down_to_one_without_a_failed_request_with_admin() {
    scale_down_to_one(3, Approach::Graceful).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_scales_three_providers_down_to_one_without_a_failed_request_without_admin() {
    scale_down_to_one(3, Approach::GracefulNoAdmin).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_scales_four_providers_down_to_one_without_a_failed_request_with_admin() {
    scale_down_to_one(4, Approach::Graceful).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_scales_four_providers_down_to_one_without_a_failed_request_without_admin() {
    scale_down_to_one(4, Approach::GracefulNoAdmin).await;
}

/// What istiod writes on the consumer's outbound cluster for a
/// DestinationRule `outlierDetection: {consecutive5xxErrors: 1, interval:
/// 1s, baseEjectionTime: 30s, maxEjectionPercent: 100}`
/// (`applyOutlierDetection`, `pilot/pkg/networking/core/cluster_traffic_policy.go`):
/// the most eager ejection a user can ask for, success-rate ejection off,
/// and the panic threshold at `minHealthPercent` (0 unless set): Envoy
/// never balances onto ejected hosts, it answers 503 when all are.
fn istio_eager_outlier_detection() -> serde_json::Value {
    serde_json::json!({
        "outlier_detection": {
            "consecutive_5xx": 1,
            "enforcing_consecutive_5xx": 100,
            "consecutive_gateway_failure": 0,
            "enforcing_consecutive_gateway_failure": 0,
            "enforcing_success_rate": 0,
            "interval": "1s",
            "base_ejection_time": "30s",
            "max_ejection_percent": 100,
        },
        "common_lb_config": {"healthy_panic_threshold": {"value": 0}},
    })
}

// Outlier detection on the same hosts as steering, with the panic threshold
// at 0: an ejection of the one host left would fail every request. The
// leaving hosts may be ejected (the consumer's probes meet their drained
// 503s, then refused connections: each a 5xx to Envoy), which changes
// nothing, steering already sends them none; the host left never is: no
// request failed and it served everything after the last mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_scales_four_providers_down_to_one_beside_istio_outlier_detection() {
    let (mut config, mode) = scale_down_cell(4, Approach::Graceful);
    config.providers_cluster = istio_eager_outlier_detection();
    config.work_dir = repo_root().join("target/e2e/scale-down-4-to-1-outlier-detection");
    let report = scale_down_run(4, "4 -> 1, graceful, outlier detection", config, mode).await;
    let ejections = report
        .outlier_ejections
        .unwrap_or_else(|| panic!("no outlier detection stats: was it configured?"));
    assert!(
        ejections <= 3,
        "{ejections} ejections: more than the leaving hosts"
    );
}
