//! The docker harness on a real Docker engine: `envoy/docker-compose.yaml`
//! with the image `make images` builds (nothing pulled). Containers with
//! their own addresses on a compose network; `docker stop` (SIGTERM, then
//! the grace period) is the shutdown signal, turned into the graceful
//! sequence by graceful-entrypoint.
//!
//! The front shape too: `envoy/docker-compose-front.yaml`, two front Envoys
//! before three backends with no sidecar, each the demo app under
//! `graceful-entrypoint --front` (`a_docker_stop_behind_the_fronts_...`).
//!
//! Without an engine (a laptop without Docker) each test says so in one line
//! and passes; on CI (`CI` set) a missing engine fails instead.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use graceful_harness::platform::compose::{IMAGE, PROJECT};
use graceful_harness::platform::docker::{
    self, consumer_stat, container, docker, fronts_acknowledged, inspect, FrontPlan, Rolling,
    CONSUMER, FRONT,
};
use graceful_harness::support::client::Conn;
use graceful_harness::support::envoy::eventually;
use graceful_harness::support::load::Sample;

/// Whether a Docker engine answers; on CI it must.
fn engine() -> bool {
    match docker::engine() {
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
        let h = Harness { _turn: turn };
        docker::up().await.unwrap_or_else(|e| panic!("{e}"));
        h
    }

    async fn healthy(&self, service: &str) {
        docker::healthy(service, Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", docker::logs());
        }
        let _ = docker::down();
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
                let mut conn = Conn::http1(CONSUMER).await.ok();
                while !stop.load(SeqCst) {
                    let Some(c) = conn.as_mut() else {
                        failed.fetch_add(1, SeqCst);
                        conn = Conn::http1(CONSUMER).await.ok();
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
                            conn = Conn::http1(CONSUMER).await.ok();
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
    let mut conn = Conn::http1(CONSUMER).await.unwrap();
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

    // The rolling restart `make harness-demo` runs: open-loop load from the
    // host, each provider stopped (SIGTERM, 45 s grace) and started again.
    let (report, samples, stopped) = docker::rolling_restart(Rolling::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    println!("{}", report.line("docker"));
    assert_eq!(stopped.len(), 3, "every provider restarted");
    for (s, ev) in stopped.iter().zip(&report.events) {
        for line in [
            "SIGTERM: closing",
            "graceful-entrypoint: closing",
            "drained after",
            "exit 0",
        ] {
            assert!(
                s.log.contains(line),
                "{}: no {line:?} in its log:\n{}",
                s.service,
                s.log
            );
        }
        assert!(
            !s.log.contains("FORCED"),
            "{}: the gate was forced:\n{}",
            s.service,
            s.log
        );
        assert_eq!(s.exit_code, "0", "{}: exit code", s.service);
        assert!(
            s.consumer_saw,
            "{}: the consumer never evicted it while it closed",
            s.service
        );
        assert!(
            ev.drained_ms <= ev.down_ms && ev.down_ms < ev.up_ms,
            "{}: events out of order: {ev:?}",
            s.service
        );
        assert_eq!(
            ev.after_closing, 0,
            "{}: served requests sent after the consumer learnt it was closing",
            s.service
        );
    }
    assert_eq!(report.failed, 0, "failed requests during the rolling stop");
    assert!(report.requests >= 1000, "only {} requests", report.requests);
    // Every provider served before, and again after, its restart.
    for i in 1..=3u8 {
        assert!(
            samples
                .iter()
                .any(|s| s.served_by == i && s.due_ms > report.events[usize::from(i) - 1].up_ms),
            "p{i} served no request after its restart"
        );
    }
    assert_eq!(
        report.consumer_inflight_end,
        Some(0),
        "consumer in flight after the load"
    );

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

/// A wasm counter of the consumer (`wasmcustom.NAME`), 0 if unreadable.
async fn consumer_counter(name: &str) -> u64 {
    consumer_stat(&format!("wasmcustom.{name}"))
        .await
        .unwrap_or(0)
}

/// Requests that `p{i}` served, out of `n` through the consumer.
async fn served_by(i: usize, n: usize) -> usize {
    let Ok(mut conn) = Conn::http1(CONSUMER).await else {
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
    let evictions = consumer_counter("graceful_consumer_evictions").await;
    let id = container("provider1");
    docker(&["kill", &id]).unwrap_or_else(|e| panic!("{e}"));
    eventually(
        "the consumer evicts the killed provider",
        Duration::from_secs(10),
        || async {
            (consumer_counter("graceful_consumer_evictions").await > evictions).then_some(())
        },
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
    let evictions = consumer_counter("graceful_consumer_evictions").await;
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
        || async {
            (consumer_counter("graceful_consumer_evictions").await > evictions).then_some(())
        },
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

/// The examples' hooks run from `graceful-wasm/graceful-hook`, an image
/// holding that one binary (`FROM scratch`: no shell, no libc): it must run
/// there as it runs in a distroless proxy, and with no admin to reach (no
/// network here) say so in one line and fail open. Then `install` copies it
/// out, as the examples' init container does.
#[test]
fn the_hook_image_runs_with_nothing_else_in_it() {
    if !engine() {
        return;
    }
    const HOOK_IMAGE: &str = "graceful-wasm/graceful-hook:latest";
    let ready = std::process::Command::new("docker")
        .args(["run", "--rm", "--network", "none", HOOK_IMAGE, "ready"])
        .output()
        .unwrap_or_else(|e| panic!("docker run: {e}"));
    let said = String::from_utf8_lossy(&ready.stderr);
    assert!(
        ready.status.success() && said.contains("no Envoy admin at") && said.contains(": ready"),
        "{HOOK_IMAGE} ready: {:?} {said}",
        ready.status
    );
    let dir = graceful_harness::support::envoy::repo_root()
        .join(format!("target/e2e/hook-install-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mount = format!("{}:/graceful", dir.display());
    let install = std::process::Command::new("docker")
        .args(["run", "--rm", "--network", "none", "-v", &mount, HOOK_IMAGE])
        .args(["install", "/graceful"])
        .output()
        .unwrap_or_else(|e| panic!("docker run: {e}"));
    assert!(
        install.status.success(),
        "install: {}",
        String::from_utf8_lossy(&install.stderr)
    );
    let copied = std::fs::metadata(dir.join("graceful-hook"))
        .unwrap_or_else(|e| panic!("the installed hook: {e}"));
    assert!(
        copied.len() > 100_000,
        "a whole binary: {} bytes",
        copied.len()
    );
}

/// The front shape up for one test (its turn taken from the mesh's tests:
/// both load this machine), always taken down again, with every container's
/// log printed if the test failed.
struct FrontHarness {
    _turn: std::sync::MutexGuard<'static, ()>,
}

impl FrontHarness {
    async fn up() -> FrontHarness {
        let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        docker(&["image", "inspect", IMAGE])
            .unwrap_or_else(|e| panic!("no image {IMAGE}: run `make images` ({e})"));
        let h = FrontHarness { _turn: turn };
        docker::front_up().await.unwrap_or_else(|e| panic!("{e}"));
        h
    }
}

impl Drop for FrontHarness {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", docker::front_logs());
        }
        let _ = FRONT.down();
    }
}

/// Requests each backend served among `samples` due in `[from, to)` ms.
fn shares(samples: &[Vec<Sample>], from: u64, to: u64) -> [u64; 3] {
    let mut n = [0; 3];
    for s in samples.iter().flatten() {
        if s.due_ms >= from && s.due_ms < to {
            if let Some(slot) = usize::from(s.served_by)
                .checked_sub(1)
                .and_then(|i| n.get_mut(i))
            {
                *slot += 1;
            }
        }
    }
    n
}

/// The front shape (design §8: "docker stop of a backend under load loses
/// nothing and waits for no sleep"): load through both fronts and slow
/// requests in flight, `docker stop` of backend 1 (grace period 45 s, its
/// entrypoint's --wait 20 s). Its entrypoint tells both fronts and waits
/// for both to acknowledge; the stop takes about as long as its last request
/// needed, well under any wait; nothing fails; the other two take its
/// share; started again, it tells the fronts it serves and gets requests
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_docker_stop_behind_the_fronts_loses_nothing_and_waits_for_no_sleep() {
    if !engine() {
        return;
    }
    let harness = FrontHarness::up().await;
    let plan = FrontPlan::default();
    let run = docker::stop_backend_under_load(1, plan)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let p = usize::from(run.index) - 1;

    let all: Vec<&Sample> = run.samples.iter().flatten().collect();
    let failed = all.iter().filter(|s| !s.ok).count();
    let slow_failed = run.slow.iter().filter(|s| s.status != 200).count();
    // The slow requests the stopped backend was serving when the stop began.
    let slow_there: Vec<_> = run
        .slow
        .iter()
        .filter(|s| usize::from(s.served_by) == p + 1)
        .collect();
    let last_there_ms = slow_there.iter().map(|s| s.ended_ms).max();
    let before = shares(&run.samples, 0, run.closing_ms);
    let after = shares(&run.samples, run.down_ms, run.started_ms);
    let after_total: u64 = after.iter().sum();
    let served_after_down = run
        .samples
        .iter()
        .flatten()
        .filter(|s| usize::from(s.served_by) == p + 1 && s.due_ms >= run.closing_ms + 500)
        .filter(|s| s.due_ms < run.started_ms)
        .count();
    println!(
        "front shape: {} requests through 2 fronts, {failed} failed; {} slow ({} ms) requests, {slow_failed} failed, {} at {}; \
         docker stop of {} took {} ms (its last slow request ended {} ms after the stop began); shares before {before:?}, \
         between stop and start {after:?}; served again {} ms after docker start",
        all.len(),
        run.slow.len(),
        plan.slow.as_millis(),
        slow_there.len(),
        run.service,
        run.service,
        run.stop_took.as_millis(),
        last_there_ms.map_or("-".to_string(), |t| t.saturating_sub(run.closing_ms).to_string()),
        run.back_ms - run.started_ms,
    );
    let graceful_lines = |log: &str| {
        log.lines()
            .filter(|l| l.contains("graceful"))
            .collect::<Vec<_>>()
            .join(" | ")
    };
    println!("{} stopped: {}", run.service, graceful_lines(&run.log));
    println!(
        "{} started: {}",
        run.service,
        graceful_lines(&run.restart_log)
    );

    // Nothing lost: the load's requests and the slow ones.
    assert_eq!(failed, 0, "failed requests through the fronts");
    assert!(all.len() >= 1000, "only {} requests", all.len());
    assert_eq!(slow_failed, 0, "slow requests failed: {:?}", run.slow);

    // The entrypoint told both fronts and both acknowledged; exit 0.
    for line in [
        "SIGTERM: telling the fronts http://front1:19091, http://front2:19091",
        "graceful-hook front: 2 of 2 fronts acknowledged in ",
        "stopped (exit status: 0)",
        "graceful-entrypoint: exit 0",
    ] {
        assert!(
            run.log.contains(line),
            "{}: no {line:?} in its log:\n{}",
            run.service,
            run.log
        );
    }
    assert_eq!(fronts_acknowledged(&run.log), Some((2, 2)), "{}", run.log);
    assert_eq!(run.exit_code, "0", "{}: exit code", run.service);

    // No sleep: the stop took what its last request needed, far below its
    // wait (20 s) and grace period (45 s).
    assert!(
        run.stop_took < Duration::from_secs(10),
        "docker stop took {:?}",
        run.stop_took
    );
    if let Some(last) = last_there_ms {
        // A slow request was in flight there: the fronts acknowledged only
        // once it ended, so the stop outlasted it.
        let needed = Duration::from_millis(last.saturating_sub(run.closing_ms));
        assert!(
            run.stop_took + Duration::from_millis(300) >= needed,
            "the stop ({:?}) returned before its last request ended ({needed:?})",
            run.stop_took
        );
        assert!(
            run.stop_took < needed + Duration::from_secs(3),
            "the stop ({:?}) waited well past its last request ({needed:?})",
            run.stop_took
        );
    }

    // Before, all three served; once it was closing, the other two took
    // its share (nothing of the load reached it from 500 ms after the stop
    // began until it was started again).
    assert!(before.iter().all(|&n| n > 50), "shares before: {before:?}");
    assert_eq!(served_after_down, 0, "served after its closing: {after:?}");
    for (i, &n) in after.iter().enumerate() {
        if i != p {
            assert!(
                n * 100 >= after_total * 35 && n * 100 <= after_total * 65,
                "p{}: {n} of {after_total} after the stop: {after:?}",
                i + 1
            );
        }
    }

    // Started again: it told both fronts it serves, and gets requests.
    assert_eq!(
        run.restart_log.matches(": serving: 202").count(),
        2,
        "{}: serving told to both fronts after docker start:\n{}",
        run.service,
        run.restart_log
    );
    assert!(
        run.back_ms - run.started_ms < 10_000,
        "served again only {} ms after docker start",
        run.back_ms - run.started_ms
    );

    drop(harness);
    let left = FRONT.leftovers();
    assert!(left.is_empty(), "left after down: {left:?}");
}
