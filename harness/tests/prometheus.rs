//! The Prometheus rules (`examples/prometheus/rules.yaml`) beside real
//! shutdowns: a real Prometheus scrapes two provider sidecars' Envoys every
//! second; one drains quiet, the other is forced by `step_timeout` with a
//! request still in flight. The forced-drain alert fires for the second and
//! never for the first. Every metric the rules and their unit tests name is
//! one a real Envoy's `/stats/prometheus` lists, and every query of the
//! Grafana dashboard (`examples/grafana/graceful-wasm.json`) returns series
//! from the run.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use graceful_harness::support::client::{self, Conn};
use graceful_harness::support::envoy::{eventually, repo_root};
use graceful_harness::support::mesh::{self, ConsumerSidecar, ProviderSidecar};
use graceful_harness::support::prometheus::{metric_names, Prometheus, Target};

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// The filters' metric names the rules files mention (not the recording
/// rules' own names, which hold a `:`).
fn names_in_rules() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for file in ["rules.yaml", "rules_test.yaml"] {
        let path = repo_root().join("examples/prometheus").join(file);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
        for (at, _) in text.match_indices("graceful_") {
            if text[..at].ends_with(|c: char| c == ':' || c.is_ascii_alphanumeric()) {
                continue;
            }
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            // Config fields and the product's name, not metrics.
            if name.starts_with("graceful_drain_")
                || name.starts_with("graceful_provider_")
                || name.starts_with("graceful_consumer_")
            {
                names.insert(name);
            }
        }
    }
    names
}

/// The names a scrape stores: Envoy's, after the relabelling rules.yaml
/// asks for (a native module's stats keep Envoy's `envoy_wasmcustom_`).
async fn scraped(admin: std::net::SocketAddr) -> BTreeSet<String> {
    let r = client::get(admin, "/stats/prometheus").await.unwrap();
    assert_eq!(r.status, 200);
    metric_names(&r.text())
        .into_iter()
        .map(|n| match n.strip_prefix("envoy_wasmcustom_") {
            Some(plain) if plain.starts_with("graceful_") => plain.to_string(),
            _ => n,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_forced_drain_alert_fires_for_a_forced_pass_and_not_for_a_quiet_one() {
    let drain = r#"{"consumer_update_wait":"1s","quiet_window":"300ms","step_timeout":"1s","timeout":"30s"}"#;
    let quiet = ProviderSidecar::start("prom-quiet", LOOPBACK, drain, "{}").await;
    let forced = ProviderSidecar::start("prom-forced", LOOPBACK, drain, "{}").await;
    let consumer = ConsumerSidecar::start("prom-consumer", "{}", 2).await;

    // Every name the rules use is one Envoy exposes, from one filter or another.
    let mut exposed = scraped(quiet.envoy.admin).await;
    exposed.extend(scraped(consumer.envoy.admin).await);
    let used = names_in_rules();
    assert!(used.len() >= 8, "read the rules' metrics: {used:?}");
    let missing: Vec<&String> = used.difference(&exposed).collect();
    assert!(
        missing.is_empty(),
        "named in the rules, not in /stats/prometheus: {missing:?}"
    );

    let prom = Prometheus::start(
        "rules",
        &[
            Target {
                admin: quiet.envoy.admin,
                labels: &[
                    ("namespace", "shop"),
                    ("app", "cart"),
                    ("pod", "cart-quiet"),
                ],
            },
            Target {
                admin: forced.envoy.admin,
                labels: &[
                    ("namespace", "shop"),
                    ("app", "checkout"),
                    ("pod", "checkout-forced"),
                ],
            },
            Target {
                admin: consumer.envoy.admin,
                labels: &[("namespace", "shop"), ("app", "web"), ("pod", "web-a")],
            },
        ],
    )
    .await;
    let run_start = unix_now();
    // Both scraped while serving (a counter's increase needs its 0).
    eventually("both targets scraped", Duration::from_secs(30), || async {
        let up = prom.query("graceful_drain_passed_quiet == 0").await;
        (up.len() == 2).then_some(())
    })
    .await;

    // Quiet: nothing in flight.
    mesh::start_closing(quiet.inbound).await;
    // Forced: a request outlasting consumer_update_wait + step_timeout.
    let inbound = forced.inbound;
    let slow = tokio::spawn(async move {
        let mut c = Conn::http1(inbound).await.unwrap();
        c.get("/delay/4000").await.unwrap()
    });
    eventually(
        "the slow request in flight",
        Duration::from_secs(10),
        || async { (mesh::status(forced.inbound).await.inflight_inbound == 1).then_some(()) },
    )
    .await;
    mesh::start_closing(forced.inbound).await;
    let q = mesh::until_drained(quiet.inbound, Duration::from_secs(20)).await;
    assert!(!q.forced, "{q:?}");
    let f = mesh::until_drained(forced.inbound, Duration::from_secs(20)).await;
    assert!(f.forced, "{f:?}");

    let firing = eventually(
        "GracefulDrainForcedByStepTimeout firing",
        Duration::from_secs(30),
        || async {
            let alerts = prom.alerts().await;
            alerts
                .iter()
                .any(|(labels, state)| {
                    labels["alertname"] == "GracefulDrainForcedByStepTimeout" && state == "firing"
                })
                .then_some(alerts)
        },
    )
    .await;
    eprintln!("alerts: {firing:?}");
    let forced_alerts: Vec<&serde_json::Value> = firing
        .iter()
        .filter(|(l, _)| {
            l["alertname"]
                .as_str()
                .is_some_and(|n| n.starts_with("GracefulDrainForced"))
        })
        .map(|(l, _)| l)
        .collect();
    assert!(
        forced_alerts.iter().all(|l| l["pod"] == "checkout-forced"),
        "a forced-drain alert for the quiet pass: {forced_alerts:?}"
    );
    // Prometheus saw the quiet pass too, so its silence means something.
    let passed = prom
        .query(r#"graceful_drain_passed_quiet{pod="cart-quiet"}"#)
        .await;
    assert_eq!(passed.len(), 1, "{passed:?}");
    assert_eq!(passed[0].1, 1.0, "the quiet pass scraped");
    // The recording rule reads each workload's drain time: the forced one
    // 2 s after closing, the quiet one 1 s (consumer_update_wait).
    let drained = eventually(
        "both passes' drain times recorded",
        Duration::from_secs(30),
        || async {
            let d = prom
                .query("namespace_app:graceful_drain_drained_after_seconds:max")
                .await;
            (d.len() == 2 && d.iter().all(|(_, v)| *v > 0.0)).then_some(d)
        },
    )
    .await;
    for (labels, seconds) in &drained {
        let want = if labels["app"] == "checkout" {
            2.0..4.0
        } else {
            1.0..2.0
        };
        assert!(want.contains(seconds), "{labels}: {seconds}");
    }
    // A forced pass cuts nothing itself: the request ends when it is done.
    let answer = slow.await.unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    // The AnalysisTemplate's queries, its args filled in: the workload whose
    // shutdown was forced fails the analysis, the quiet one passes.
    let template: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo_root().join("examples/argo-rollouts/analysis-template.yaml"))
            .unwrap(),
    )
    .unwrap();
    let metrics = template["spec"]["metrics"]
        .as_sequence()
        .cloned()
        .unwrap_or_default();
    assert!(metrics.len() >= 2, "read the template's metrics");
    for m in &metrics {
        let name = m["name"].as_str().unwrap_or_default();
        let query = m["provider"]["prometheus"]["query"]
            .as_str()
            .unwrap_or_default();
        assert_eq!(
            m["successCondition"].as_str(),
            Some("result[0] == 0"),
            "{name}: the condition this test reads"
        );
        for (app, passes) in [("cart", true), ("checkout", name != "forced-drains")] {
            let q = query
                .replace("{{args.namespace}}", "shop")
                .replace("{{args.app}}", app);
            let result = prom.query(&q).await;
            assert_eq!(result.len(), 1, "{name} for {app}: {result:?}");
            assert_eq!(result[0].1 == 0.0, passes, "{name} for {app}: {result:?}");
        }
    }
    // The dashboard's queries, its variables at "All".
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("examples/grafana/graceful-wasm.json")).unwrap(),
    )
    .unwrap();
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| {
            t["expr"]
                .as_str()
                .map(|e| e.replace("$namespace", ".*").replace("$app", ".*"))
        })
        .collect();
    assert!(exprs.len() >= 6, "read the dashboard's queries: {exprs:?}");
    let dir = std::env::var_os("GRACEFUL_CHART_DIR");
    for expr in &exprs {
        let got = eventually(expr, Duration::from_secs(30), || async {
            let got = prom.query(expr).await;
            (!got.is_empty()).then_some(got)
        })
        .await;
        eprintln!("{expr}: {got:?}");
    }
    if let Some(dir) = dir {
        draw_dashboard(&prom, &dashboard, run_start, &std::path::PathBuf::from(dir)).await;
    }
    assert!(
        !prom.log_text().contains("level=error"),
        "{}",
        prom.log_text()
    );
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// `dashboard.svg` in `dir`: each panel of the dashboard, its queries run
/// over the test's run (`make dashboard-chart`).
async fn draw_dashboard(
    prom: &Prometheus,
    dashboard: &serde_json::Value,
    start: f64,
    dir: &std::path::Path,
) {
    use graceful_harness::support::panels_chart::{panels_chart, PanelData};
    let end = unix_now();
    let mut panels = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        let mut series = Vec::new();
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap_or_default();
            let expr = expr.replace("$namespace", ".*").replace("$app", ".*");
            let legend = target["legendFormat"].as_str().unwrap_or_default();
            for (labels, points) in prom.query_range(&expr, start, end, 1.0).await {
                let mut name = legend.to_string();
                if let Some(map) = labels.as_object() {
                    for (k, v) in map {
                        name =
                            name.replace(&format!("{{{{{k}}}}}"), v.as_str().unwrap_or_default());
                    }
                }
                let points = points.into_iter().map(|(t, v)| (t - start, v)).collect();
                series.push((name, points));
            }
        }
        panels.push(PanelData {
            title: panel["title"].as_str().unwrap_or_default().to_string(),
            series,
        });
    }
    let svg = panels_chart(
        "The dashboard's panels over a real run: one shutdown quiet (cart), one forced by step_timeout (checkout)",
        &panels,
        end - start,
    );
    let path = dir.join("dashboard.svg");
    std::fs::write(&path, svg).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    eprintln!("wrote {}", path.display());
}
