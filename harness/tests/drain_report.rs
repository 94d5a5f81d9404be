//! The drain report on real Envoy: `envoy/provider-sidecar.yaml`
//! (graceful_drain + graceful_provider, `--concurrency 2`) behind
//! `envoy/consumer-sidecar.yaml` (graceful_consumer), with plain clients
//! calling the provider directly from other loopback addresses, as callers
//! without the filter do.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use graceful_harness::support::client::{self, Conn};
use graceful_harness::support::envoy::eventually;
use graceful_harness::support::mesh::{self, ConsumerSidecar, ProviderSidecar};
use graceful_harness::support::upstream::Upstream;
use serde_json::Value;

const CONSUMER_HEADER: &str = "x-graceful-consumer";

async fn provider(name: &str, drain_config: &str) -> ProviderSidecar {
    ProviderSidecar::start(name, loopback(0, 0, 1), drain_config, "{}").await
}

/// `GET /graceful/report`: 200 with JSON.
async fn report(p: &ProviderSidecar) -> Value {
    let r = client::get(p.inbound, "/graceful/report").await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("content-type").as_deref(),
        Some("application/json")
    );
    serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("report JSON {:?}: {e}", r.text()))
}

fn loopback(a: u8, b: u8, c: u8) -> IpAddr {
    IpAddr::from([127, a, b, c])
}

/// Sends GET `path` from `source` every `every` until `stop`, a fresh
/// connection whenever Envoy closes one; counts the answers.
fn plain_client(
    to: SocketAddr,
    source: IpAddr,
    every: Duration,
    stop: Arc<AtomicBool>,
    headers: &'static [(&'static str, &'static str)],
) -> (Arc<AtomicU64>, tokio::task::JoinHandle<()>) {
    let answered = Arc::new(AtomicU64::new(0));
    let count = answered.clone();
    let task = tokio::spawn(async move {
        let mut conn: Option<Conn> = None;
        while !stop.load(SeqCst) {
            if conn.as_ref().is_none_or(Conn::is_closed) {
                conn = Conn::http1_from(to, source).await.ok();
            }
            if let Some(c) = conn.as_mut() {
                match c.send("GET", "/", headers, Bytes::new()).await {
                    Ok(r) => {
                        count.fetch_add(1, SeqCst);
                        if r.header("connection").as_deref() == Some("close") {
                            conn = None;
                        }
                    }
                    Err(_) => conn = None,
                }
            }
            tokio::time::sleep(every).await;
        }
    });
    (answered, task)
}

fn peer<'a>(report: &'a Value, address: &str, consumer: Option<&str>) -> &'a Value {
    report["peers"]
        .as_array()
        .and_then(|peers| {
            peers.iter().find(|p| {
                p["address"] == address
                    && match consumer {
                        Some("*") => p["consumer"].is_string(),
                        Some(c) => p["consumer"] == c,
                        None => p["consumer"].is_null(),
                    }
            })
        })
        .unwrap_or_else(|| panic!("no peer {address} {consumer:?} in {report:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn it_names_a_graceful_consumer_and_a_plain_client_that_ignores_the_mark() {
    // The plain client never stops, so the gate is forced by step_timeout.
    let p = provider(
        "report-forced",
        r#"{"consumer_update_wait":"1s","quiet_window":"300ms","step_timeout":"1500ms","timeout":"30s","admin_cluster":"envoy_admin"}"#,
    )
    .await;
    let other = Upstream::start().await;
    other.set_instance("b1");
    let other_addr = other.addr;
    let consumer = ConsumerSidecar::with_endpoints(
        "report-consumer",
        "{}",
        2,
        vec![other],
        &[p.inbound, other_addr],
    )
    .await;
    let before = report(&p).await;
    assert_eq!(before["phase"], "serving");
    assert_eq!(before["peers"], serde_json::json!([]));

    // Serving: both callers send, the consumer reaching both providers.
    // Its app forges the identity header, which graceful_consumer replaces.
    let forged: &'static [(&'static str, &'static str)] = &[(CONSUMER_HEADER, "forged-by-app")];
    let mut warm = Conn::http1(consumer.outbound).await.unwrap();
    for _ in 0..20 {
        let r = warm.send("GET", "/", forged, Bytes::new()).await.unwrap();
        assert_eq!(r.status, 200);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let plain_ip = loopback(0, 0, 2);
    let (plain_answers, plain) = plain_client(
        p.inbound,
        plain_ip,
        Duration::from_millis(40),
        stop.clone(),
        &[],
    );
    eventually(
        "the plain client is served",
        Duration::from_secs(10),
        || async { (plain_answers.load(SeqCst) >= 5).then_some(()) },
    )
    .await;

    mesh::start_closing(p.inbound).await;
    // The consumer's calls from now on (one in flight at the closing would
    // be told by its answer and leave nothing after it to report).
    let through_consumer = {
        let stop = stop.clone();
        tokio::spawn(async move {
            while !stop.load(SeqCst) {
                let r = warm.send("GET", "/", forged, Bytes::new()).await.unwrap();
                assert_eq!(r.status, 200, "through the consumer: {r:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    // One long request after closing: the recommended timeout covers it.
    let inbound = p.inbound;
    let slow = tokio::spawn(async move {
        let mut c = Conn::http1_from(inbound, loopback(0, 0, 3)).await.unwrap();
        c.get("/delay/1200").await.unwrap()
    });
    let drained = mesh::until_drained(p.inbound, Duration::from_secs(30)).await;
    assert!(drained.forced, "{drained:?}");
    // A few of the plain client's requests meet the drained 503.
    let at_pass = plain_answers.load(SeqCst);
    eventually(
        "the plain client answered after the pass",
        Duration::from_secs(10),
        || async { (plain_answers.load(SeqCst) >= at_pass + 5).then_some(()) },
    )
    .await;
    stop.store(true, SeqCst);
    through_consumer.await.unwrap();
    plain.await.unwrap();
    assert_eq!(slow.await.unwrap().status, 200);

    let report = eventually(
        "the report holds the last merges",
        Duration::from_secs(5),
        || async {
            // Until a merge brought the plain client's requests after the
            // pass: the provider's copies merge on their ticks.
            let r = report(&p).await;
            let plain_last = r["peers"]
                .as_array()?
                .iter()
                .find(|p| p["address"] == "127.0.0.2")?["last_ms"]
                .as_u64()?;
            (r["peers"].as_array()?.len() >= 2 && plain_last > r["drained_after_ms"].as_u64()?)
                .then_some(r)
        },
    )
    .await;
    // docs/drain-report.md quotes this (`--nocapture`).
    eprintln!("drain report: {report:#}");
    assert_eq!(report["phase"], "drained", "{report:#}");
    assert_eq!(report["forced"], true);
    assert_eq!(report["forced_by"], "step_timeout");
    let after = report["drained_after_ms"].as_u64().unwrap();
    assert!((2_400..10_000).contains(&after), "{report:#}");

    let via_consumer = peer(&report, "127.0.0.1", Some("*"));
    let id = via_consumer["consumer"].as_str().unwrap();
    assert!(
        id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "the consumer Envoy's instance id, not the app's forged value: {id}"
    );
    let plain_peer = peer(&report, "127.0.0.2", None);
    for p in [via_consumer, plain_peer] {
        assert!(p["requests"].as_u64().unwrap() >= 1, "{p}");
        assert_eq!(
            p["marked"], p["requests"],
            "every answer after closing is marked: {p}"
        );
    }
    // The consumer stopped once told; the plain client kept on past the pass.
    let consumer_last = via_consumer["last_ms"].as_u64().unwrap();
    let plain_last = plain_peer["last_ms"].as_u64().unwrap();
    assert!(consumer_last < 1_000, "{report:#}");
    assert!(plain_last > after, "{report:#}");
    assert!(plain_peer["requests"].as_u64().unwrap() >= 20, "{report:#}");
    assert_eq!(report["peers"][0]["address"], "127.0.0.2", "largest first");
    let total: u64 = report["peers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["requests"].as_u64().unwrap())
        .sum();
    assert_eq!(report["requests_after_closing"], total, "{report:#}");
    assert_eq!(report["last_request_after_closing_ms"], plain_last);

    let longest = report["request_ms"]["max"].as_f64().unwrap();
    assert!(longest >= 1_200.0, "{report:#}");
    let rec = &report["recommended"];
    let ms = |field: &str| {
        graceful_core::shared::duration::parse_duration(rec[field].as_str().unwrap())
            .unwrap()
            .as_millis() as f64
    };
    assert!(
        ms("timeout") >= ms("consumer_update_wait") + ms("step_timeout") + longest,
        "the recommended timeout covers the longest request: {rec:#}"
    );
    // step_timeout decided this pass: it is recommended, and says so.
    let step_basis = rec["basis"]["step_timeout"].as_str().unwrap();
    assert!(step_basis.ends_with("it forced this pass"), "{step_basis}");
    let basis = rec["basis"]["consumer_update_wait"].as_str().unwrap();
    assert!(
        basis.contains("127.0.0.2"),
        "names the caller that kept sending: {basis}"
    );
    assert!(rec["grace_period_seconds"].as_u64().unwrap() >= 2, "{rec}");
    assert_eq!(
        p.envoy
            .custom_stat("graceful_drain_passed_step_timeout")
            .await,
        1
    );
    assert_eq!(p.envoy.custom_stat("graceful_drain_passed_quiet").await, 0);
    eventually("late peers counted", Duration::from_secs(5), || async {
        (p.envoy.custom_stat("graceful_drain_late_peers").await >= 1).then_some(())
    })
    .await;
    let log = p.envoy.log();
    let line = log
        .lines()
        .find(|l| l.contains("drain report: {"))
        .unwrap_or_else(|| panic!("no report line in the log:\n{log}"));
    assert!(line.contains(r#""forced_by":"step_timeout""#), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_quiet_pass_says_so_and_1000_callers_and_forged_names_keep_it_bounded() {
    let p = provider(
        "report-bounded",
        // A quiet window longer than any pause between the batches on a
        // loaded host: the gate passes only once every caller is done.
        r#"{"consumer_update_wait":"1s","quiet_window":"2s","step_timeout":"30s","timeout":"60s"}"#,
    )
    .await;
    mesh::start_closing(p.inbound).await;
    // 1,000 distinct callers, one request each from its own address.
    let inbound = p.inbound;
    let mut sent = 0u64;
    for batch in 0..20u16 {
        let calls: Vec<_> = (0..50u16)
            .map(|i| {
                let n = batch * 50 + i;
                let source = loopback(1, (n / 250) as u8, (n % 250) as u8 + 1);
                tokio::spawn(async move {
                    let mut c = Conn::http1_from(inbound, source).await.unwrap();
                    c.get("/").await.unwrap().status
                })
            })
            .collect();
        for c in calls {
            assert_eq!(c.await.unwrap(), 200);
            sent += 1;
        }
    }
    // Forged identities: broken ones count as none (one caller), valid
    // ones are callers like any other and fall under the same bound.
    let forged: [&str; 4] = [
        r#""},{"requests":999999,"x":""#,
        "with space",
        "semi;colon=1",
        &"x".repeat(300),
    ];
    let mut c = Conn::http1_from(inbound, loopback(0, 0, 9)).await.unwrap();
    for value in forged {
        let r = c
            .send("GET", "/", &[(CONSUMER_HEADER, value)], Bytes::new())
            .await
            .unwrap();
        assert_eq!(r.status, 200);
        sent += 1;
    }
    let mut c = Conn::http1_from(inbound, loopback(0, 0, 10)).await.unwrap();
    for i in 0..40 {
        let name = format!("forged-{i}");
        let r = c
            .send(
                "GET",
                "/",
                &[(CONSUMER_HEADER, name.as_str())],
                Bytes::new(),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 200);
        sent += 1;
    }
    let drained = mesh::until_drained(p.inbound, Duration::from_secs(30)).await;
    assert!(!drained.forced, "{drained:?}");
    let report = eventually("every request merged", Duration::from_secs(5), || async {
        let r = report(&p).await;
        (r["requests_after_closing"].as_u64()? == sent).then_some(r)
    })
    .await;
    assert_eq!(report["phase"], "drained");
    assert_eq!(report["forced"], false);
    assert!(report["forced_by"].is_null(), "{report:#}");
    let peers = report["peers"].as_array().unwrap();
    assert_eq!(peers.len(), 32, "max_report_peers' default");
    // 1,000 + the broken-names caller + 40 forged names, less those shown.
    assert_eq!(report["peers_dropped"], 1_000 + 1 + 40 - 32, "{report:#}");
    assert!(
        peers.iter().all(|p| p.as_object().unwrap().len() == 6),
        "{report:#}"
    );
    let broken = peer(&report, "127.0.0.9", None);
    assert_eq!(broken["requests"], 4, "{report:#}");
    assert_eq!(peers[0], *broken, "largest first: {report:#}");
    let body = serde_json::to_string(&report).unwrap();
    assert!(body.len() < 16 * 1024, "{} bytes", body.len());
    assert_eq!(p.envoy.custom_stat("graceful_drain_passed_quiet").await, 1);
    assert!(p.envoy.log().contains(r#""forced_by":null"#));
}

/// The issue's case: rare long requests while serving (three 1.5 s among
/// many short ones, none of them likely sampled), then a shutdown with a
/// long request in flight at closing and no more arrivals. The report's
/// max covers every one of them; the gate waits for the one in flight past
/// `consumer_update_wait` + `step_timeout` (`longest_request` is set and
/// arrivals had stopped) and passes quiet; the recommended budgets cover
/// the longest and the drain config takes them as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rare_long_requests_while_serving_are_in_the_max_and_the_budgets_cover_them() {
    let p = provider(
        "report-long",
        r#"{"consumer_update_wait":"1s","quiet_window":"300ms","step_timeout":"1s","timeout":"30s","longest_request":"3s"}"#,
    )
    .await;
    let inbound = p.inbound;
    let long = |path: &'static str| {
        tokio::spawn(async move {
            let mut c = Conn::http1_from(inbound, loopback(0, 0, 4)).await.unwrap();
            c.get(path).await.unwrap().status
        })
    };
    let longs: Vec<_> = (0..3).map(|_| long("/delay/1500")).collect();
    // Many short requests around them, on both workers' connections.
    let shorts: Vec<_> = (0..4)
        .map(|n| {
            tokio::spawn(async move {
                let mut c = Conn::http1_from(inbound, loopback(0, 0, 5 + n))
                    .await
                    .unwrap();
                for _ in 0..100 {
                    assert_eq!(c.get("/").await.unwrap().status, 200);
                }
            })
        })
        .collect();
    for t in shorts {
        t.await.unwrap();
    }
    for t in longs {
        assert_eq!(t.await.unwrap(), 200);
    }
    let serving = eventually(
        "the serving requests merged",
        Duration::from_secs(5),
        || async {
            let r = report(&p).await;
            (r["request_ms"]["max"].as_f64()? >= 1_500.0).then_some(r)
        },
    )
    .await;
    assert_eq!(serving["phase"], "serving");
    let serving_max = serving["request_ms"]["max"].as_f64().unwrap();
    assert!(serving_max < 2_500.0, "{serving:#}");

    // In flight at closing: 2.5 s, longer than wait + step_timeout (2 s).
    let in_flight = long("/delay/2500");
    eventually(
        "the long request counted",
        Duration::from_secs(5),
        || async {
            let r = client::get(p.inbound, "/graceful/status").await.ok()?;
            let st: Value = serde_json::from_slice(&r.body).ok()?;
            (st["inflight_inbound"] == 1).then_some(())
        },
    )
    .await;
    let closing = std::time::Instant::now();
    mesh::start_closing(p.inbound).await;
    let drained = mesh::until_drained(p.inbound, Duration::from_secs(30)).await;
    let took = closing.elapsed();
    assert_eq!(in_flight.await.unwrap(), 200);
    assert!(
        !drained.forced,
        "arrivals had stopped: step_timeout does not cut the request in flight: {drained:?}"
    );
    assert!(took >= Duration::from_millis(2_300), "{took:?}");

    let report = eventually("the last merge", Duration::from_secs(5), || async {
        let r = report(&p).await;
        (r["request_ms"]["max"].as_f64()? >= 2_500.0).then_some(r)
    })
    .await;
    eprintln!("drain report: {report:#}");
    assert_eq!(report["phase"], "drained");
    assert!(report["forced_by"].is_null(), "{report:#}");
    let longest = report["request_ms"]["max"].as_f64().unwrap();
    assert!((2_500.0..4_000.0).contains(&longest), "{report:#}");
    let rec = &report["recommended"];
    let ms = |field: &str| {
        graceful_core::shared::duration::parse_duration(rec[field].as_str().unwrap())
            .unwrap()
            .as_millis() as f64
    };
    assert!(
        ms("timeout") >= ms("consumer_update_wait") + ms("step_timeout") + longest,
        "the recommended timeout covers the longest request: {rec:#}"
    );
    assert!(
        ms("longest_request") >= longest,
        "the recommended longest_request covers the longest request: {rec:#}"
    );
    for key in [
        "consumer_update_wait",
        "step_timeout",
        "timeout",
        "longest_request",
        "grace_period_seconds",
    ] {
        let basis = rec["basis"][key].as_str().unwrap_or_default();
        assert!(!basis.is_empty(), "{key}: {rec:#}");
    }
    // The drain config takes the recommendation as it is.
    let recommended = serde_json::json!({
        "consumer_update_wait": rec["consumer_update_wait"],
        "step_timeout": rec["step_timeout"],
        "timeout": rec["timeout"],
        "longest_request": rec["longest_request"],
    });
    graceful_core::drain::config::DrainConfig::from_json(recommended.to_string().as_bytes())
        .unwrap_or_else(|e| panic!("{e}: {rec:#}"));
    assert!(
        rec["basis"]["timeout"]
            .as_str()
            .unwrap()
            .contains("since the provider started"),
        "the basis names the window: {rec:#}"
    );
    assert_eq!(p.envoy.custom_stat("graceful_drain_passed_quiet").await, 1);
}
