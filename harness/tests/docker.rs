//! The docker harness on a real Docker engine: `envoy/docker-compose.yaml`
//! with the image `make images` builds (nothing pulled). Containers with
//! their own addresses on a compose network; `docker stop` (SIGTERM, then
//! the grace period) is the shutdown signal, turned into the graceful
//! sequence by graceful-entrypoint.
//!
//! Without an engine (a laptop without Docker) each test says so in one line
//! and passes; on CI (`CI` set) a missing engine fails instead.

use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use graceful_harness::client::Conn;
use graceful_harness::compose::{IMAGE, PROJECT};
use graceful_harness::envoy::{eventually, repo_root};

const CONSUMER: ([u8; 4], u16) = ([127, 0, 0, 1], 15001);

/// Runs a command; its stdout and stderr, or an error naming it.
fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("{program} {}: {}", args.join(" "), text.trim()))
    }
}

fn docker(args: &[&str]) -> Result<String, String> {
    run("docker", args)
}

/// Whether a Docker engine answers; on CI it must.
fn engine() -> bool {
    match docker(&["info", "--format", "{{.ServerVersion}}"]) {
        Ok(_) => true,
        Err(why) if std::env::var_os("CI").is_none() => {
            eprintln!(
                "skipped: no Docker engine answers ({})",
                why.lines().next().unwrap_or("")
            );
            false
        }
        Err(why) => panic!("CI must run the docker suite: {why}"),
    }
}

/// `docker compose` if the CLI has the plugin, else docker-compose.
fn compose(args: &[&str]) -> Result<String, String> {
    let file = repo_root().join("envoy/docker-compose.yaml");
    let file = file.display().to_string();
    let plugin = Command::new("docker")
        .args(["compose", "version"])
        .output()
        .is_ok_and(|o| o.status.success());
    let (program, mut all): (&str, Vec<&str>) = if plugin {
        ("docker", vec!["compose"])
    } else {
        ("docker-compose", vec![])
    };
    all.extend(["-p", PROJECT, "-f", &file]);
    all.extend(args);
    run(program, &all)
}

/// The container of a compose service (either Compose's naming).
fn container(service: &str) -> String {
    docker(&[
        "ps",
        "-aq",
        "--filter",
        &format!("label=com.docker.compose.project={PROJECT}"),
        "--filter",
        &format!("label=com.docker.compose.service={service}"),
    ])
    .unwrap_or_default()
    .trim()
    .to_string()
}

fn inspect(id: &str, format: &str) -> String {
    docker(&["inspect", "-f", format, id])
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// One harness at a time: it has one project name and fixed host ports.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The harness up for one test, always taken down again (with every
/// container's log printed if the test failed).
struct Harness {
    _turn: std::sync::MutexGuard<'static, ()>,
}

impl Harness {
    async fn up() -> Harness {
        let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        docker(&["image", "inspect", IMAGE])
            .unwrap_or_else(|e| panic!("no image {IMAGE}: run `make images` ({e})"));
        let _ = compose(&["down", "--volumes", "--remove-orphans"]);
        compose(&["up", "-d"]).unwrap_or_else(|e| panic!("{e}"));
        let h = Harness { _turn: turn };
        for i in 1..=3 {
            h.healthy(&format!("provider{i}")).await;
        }
        eventually("the consumer answers", Duration::from_secs(30), || async {
            let mut c = Conn::http1(SocketAddr::from(CONSUMER)).await.ok()?;
            (c.get("/").await.ok()?.status == 200).then_some(())
        })
        .await;
        h
    }

    async fn healthy(&self, service: &str) {
        let id = container(service);
        assert!(!id.is_empty(), "no container for {service}");
        eventually(
            &format!("{service} healthy"),
            Duration::from_secs(60),
            || {
                let id = id.clone();
                async move { (inspect(&id, "{{.State.Health.Status}}") == "healthy").then_some(()) }
            },
        )
        .await;
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for service in ["provider1", "provider2", "provider3", "consumer"] {
                let id = container(service);
                if let Ok(log) = docker(&["logs", "--tail", "60", &id]) {
                    eprintln!("---- {service} ----\n{log}");
                }
            }
        }
        let _ = compose(&["down", "--volumes", "--remove-orphans"]);
    }
}

/// Requests through the consumer on `conns` connections until `stop`;
/// counts answers and failures (anything but a 200, or an error).
fn load(
    conns: usize,
    stop: Arc<AtomicBool>,
) -> (
    Vec<tokio::task::JoinHandle<()>>,
    Arc<AtomicU64>,
    Arc<AtomicU64>,
) {
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let tasks = (0..conns)
        .map(|_| {
            let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
            tokio::spawn(async move {
                let mut conn = Conn::http1(SocketAddr::from(CONSUMER)).await.ok();
                while !stop.load(SeqCst) {
                    let Some(c) = conn.as_mut() else {
                        failed.fetch_add(1, SeqCst);
                        conn = Conn::http1(SocketAddr::from(CONSUMER)).await.ok();
                        continue;
                    };
                    match c.get("/").await {
                        Ok(r) if r.status == 200 => {
                            ok.fetch_add(1, SeqCst);
                        }
                        Ok(r) => {
                            eprintln!("failed: {} {:?}", r.status, r.text());
                            failed.fetch_add(1, SeqCst);
                        }
                        Err(e) => {
                            eprintln!("failed: {e}");
                            failed.fetch_add(1, SeqCst);
                            conn = Conn::http1(SocketAddr::from(CONSUMER)).await.ok();
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        })
        .collect();
    (tasks, ok, failed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_docker_stop_of_every_provider_loses_no_request() {
    if !engine() {
        return;
    }
    let harness = Harness::up().await;

    // Up: requests through the consumer reach all three providers.
    let mut conn = Conn::http1(SocketAddr::from(CONSUMER)).await.unwrap();
    let mut served_by = std::collections::BTreeSet::new();
    for _ in 0..60 {
        let r = conn.get("/").await.unwrap();
        assert_eq!(r.status, 200);
        served_by.insert(r.header("x-served-by").unwrap_or_default());
    }
    assert_eq!(
        served_by.into_iter().collect::<Vec<_>>(),
        ["p1", "p2", "p3"],
        "every provider serves"
    );

    let stop = Arc::new(AtomicBool::new(false));
    let (tasks, ok, failed) = load(8, stop.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 1..=3 {
        let service = format!("provider{i}");
        let id = container(&service);
        let before = ok.load(SeqCst);
        // SIGTERM, and a grace period far beyond the drain.
        docker(&["stop", "-t", "45", &id]).unwrap_or_else(|e| panic!("{e}"));
        let log = docker(&["logs", &id]).unwrap_or_default();
        for line in [
            "SIGTERM: closing",
            "graceful-entrypoint: closing",
            "drained after",
            "exit 0",
        ] {
            assert!(
                log.contains(line),
                "{service}: no {line:?} in its log:\n{log}"
            );
        }
        assert!(
            !log.contains("FORCED"),
            "{service}: the gate was forced:\n{log}"
        );
        assert_eq!(
            inspect(&id, "{{.State.ExitCode}}"),
            "0",
            "{service}: exit code"
        );
        docker(&["start", &id]).unwrap_or_else(|e| panic!("{e}"));
        harness.healthy(&service).await;
        assert!(
            ok.load(SeqCst) > before + 100,
            "{service}: the load kept going"
        );
    }
    stop.store(true, SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    let (ok, failed) = (ok.load(SeqCst), failed.load(SeqCst));
    println!("rolling docker stop of 3 providers: {ok} requests, {failed} failed");
    assert_eq!(failed, 0, "failed requests during the rolling stop");
    assert!(ok >= 500, "only {ok} requests");

    // Down leaves nothing behind.
    drop(harness);
    let project = format!("label=com.docker.compose.project={PROJECT}");
    for kind in [&["ps", "-a"][..], &["network", "ls"], &["volume", "ls"]] {
        let mut args = kind.to_vec();
        args.extend(["-q", "--filter", &project]);
        let left = docker(&args).unwrap();
        assert!(left.trim().is_empty(), "{} left: {left}", kind[0]);
    }
}

/// A counter of the consumer's admin (`wasmcustom.NAME`), from the host.
async fn consumer_stat(name: &str) -> u64 {
    let admin = SocketAddr::from(([127, 0, 0, 1], 9902));
    let Ok(r) =
        graceful_harness::client::get(admin, &format!("/stats?filter=^wasmcustom.{name}$")).await
    else {
        return 0;
    };
    r.text()
        .lines()
        .find_map(|l| l.split_once(": ").and_then(|(_, v)| v.trim().parse().ok()))
        .unwrap_or(0)
}

/// Requests that `p{i}` served, out of `n` through the consumer.
async fn served_by(i: usize, n: usize) -> usize {
    let Ok(mut conn) = Conn::http1(SocketAddr::from(CONSUMER)).await else {
        return 0;
    };
    let mut count = 0;
    for _ in 0..n {
        if let Ok(r) = conn.get("/").await {
            if r.header("x-served-by").as_deref() == Some(format!("p{i}").as_str()) {
                count += 1;
            }
        }
    }
    count
}

/// The engine's faults: a provider killed with SIGKILL under load, and one
/// cut off from the network while the consumer keeps sending. Failures stay
/// within what was in flight on that provider, the consumer evicts it, and
/// it serves again once it is back (a killed one with a new instance id).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_or_disconnected_provider_costs_at_most_its_requests_in_flight() {
    if !engine() {
        return;
    }
    let harness = Harness::up().await;
    let stop = Arc::new(AtomicBool::new(false));
    let (tasks, ok, failed) = load(8, stop.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;

    // SIGKILL: no drain, the in-flight requests on it are lost at most.
    let evictions = consumer_stat("graceful_consumer_evictions").await;
    let id = container("provider1");
    docker(&["kill", &id]).unwrap_or_else(|e| panic!("{e}"));
    eventually(
        "the consumer evicts the killed provider",
        Duration::from_secs(10),
        || async { (consumer_stat("graceful_consumer_evictions").await > evictions).then_some(()) },
    )
    .await;
    let failed_kill = failed.load(SeqCst);
    let before = ok.load(SeqCst);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(ok.load(SeqCst) > before + 100, "the others kept serving");
    assert_eq!(
        failed.load(SeqCst),
        failed_kill,
        "no failure after the eviction"
    );
    docker(&["start", &id]).unwrap_or_else(|e| panic!("{e}"));
    harness.healthy("provider1").await;
    eventually(
        "the restarted provider serves again",
        Duration::from_secs(30),
        || async { (served_by(1, 30).await > 0).then_some(()) },
    )
    .await;

    // Cut off the network: connections to it fail; it is evicted, then
    // used again once reconnected.
    let evictions = consumer_stat("graceful_consumer_evictions").await;
    let id = container("provider2");
    let network = format!("{PROJECT}_mesh");
    let ip = inspect(
        &id,
        &format!("{{{{(index .NetworkSettings.Networks \"{network}\").IPAddress}}}}"),
    );
    assert!(!ip.is_empty(), "provider2 address on {network}");
    docker(&["network", "disconnect", &network, &id]).unwrap_or_else(|e| panic!("{e}"));
    eventually(
        "the consumer evicts the cut-off provider",
        Duration::from_secs(20),
        || async { (consumer_stat("graceful_consumer_evictions").await > evictions).then_some(()) },
    )
    .await;
    docker(&["network", "connect", "--ip", &ip, &network, &id]).unwrap_or_else(|e| panic!("{e}"));
    eventually(
        "the reconnected provider serves again",
        Duration::from_secs(30),
        || async { (served_by(2, 30).await > 0).then_some(()) },
    )
    .await;

    stop.store(true, SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    let (ok, failed) = (ok.load(SeqCst), failed.load(SeqCst));
    let failed_cut = failed - failed_kill;
    println!(
        "kill and network cut under load: {ok} requests, {failed} failed ({failed_kill} around the kill, {failed_cut} around the cut)"
    );
    // A kill: at most the requests in flight there (8 connections; the
    // reset ones are mostly retried). A cut: the requests in flight there
    // get no answer (504 at the route timeout), and a new connection to it
    // times out instead of being refused (503) until the consumer's
    // tombstone steers every worker away: at most one of each per
    // connection.
    assert!(failed_kill <= 8, "{failed_kill} failed around the kill");
    assert!(failed_cut <= 16, "{failed_cut} failed around the cut");
    drop(harness);
}
