//! The front-proxy role on real Envoy (`docs/design/front-proxy-drain.md`,
//! §8): two front replicas, each an Envoy (`--concurrency 2`) on
//! `envoy/front-proxy.yaml` (`envoy/native/front-proxy.yaml` with
//! `GRACEFUL_DELIVERY=native`), in front of three backends with no sidecar,
//! each a demo app on a loopback address of its own (127.0.0.2, .3 and .4,
//! one port: pods), listed by file-based EDS. Load goes through both fronts;
//! a backend leaves by `graceful-hook front --source <its address>`, the
//! preStop of a backend with no sidecar, speaking to both fronts' control
//! listeners as that backend.
//!
//! Every wait has a deadline; the windows load runs for are measurement
//! windows, not synchronisation. A failing test prints both fronts' Envoy
//! logs, and the hook's output in its assertion.

use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::time::{Duration, Instant};

use graceful_harness::support::client::{self, Response};
use graceful_harness::support::envoy::{
    envoy_binary, envoy_minor, eventually, native_module, repo_root, scratch_path, wasm_dir,
    write_eds_health,
};
use graceful_harness::support::front::{
    eds_for, find_str, from, hook_args, json, native_file, run_hook, until_known, Backends,
    FrontProxy, CLOSING, CLUSTER, DRAINED, SERVING, STATUS,
};
use graceful_harness::support::load::{Load, Protocol, Sample};

/// The backends' addresses: p1, p2, p3.
const IPS: [Ipv4Addr; 3] = [
    Ipv4Addr::new(127, 0, 0, 2),
    Ipv4Addr::new(127, 0, 0, 3),
    Ipv4Addr::new(127, 0, 0, 4),
];
/// Requests per second through each front ("a few hundred" in all).
const RATE: u32 = 150;
/// Client connections per front.
const CONNS: usize = 6;
/// How long load runs to measure shares, before a closing and after an
/// acknowledgement.
const WINDOW: Duration = Duration::from_secs(2);
/// The slow request in flight at a closing.
const SLOW_MS: u64 = 3000;

/// Two fronts over three backends, each front knowing every backend.
struct Setup {
    backends: Backends,
    fronts: [FrontProxy; 2],
    /// The EDS file both fronts read.
    eds: std::path::PathBuf,
}

impl Setup {
    async fn start(name: &str) -> Setup {
        let backends = Backends::start(&IPS).await;
        let eds = scratch_path(&format!("{name}-eds"), "yaml");
        eds_for(&eds, &backends);
        let (n1, n2) = (format!("{name}-front1"), format!("{name}-front2"));
        let (a, b) = tokio::join!(
            FrontProxy::start(&n1, &eds, 3),
            FrontProxy::start(&n2, &eds, 3),
        );
        let setup = Setup {
            backends,
            fronts: [a, b],
            eds,
        };
        for front in &setup.fronts {
            // A request routed to the cluster makes graceful_consumer read
            // membership from the admin; until then a backend is no member.
            let warm = client::load(front.public, 2, 6, "/").await;
            assert!(warm.iter().all(|r| r.status == 200), "{warm:?}");
            for ip in IPS {
                until_known(front, IpAddr::V4(ip)).await;
            }
        }
        setup
    }

    fn ip(&self, i: usize) -> IpAddr {
        self.backends.ip(i)
    }

    fn loads(&self, epoch: Instant) -> Vec<Load> {
        self.fronts
            .iter()
            .map(|f| Load::start(f.public, Protocol::Http1, RATE, CONNS, epoch))
            .collect()
    }
}

async fn stop_all(loads: Vec<Load>) -> Vec<Vec<Sample>> {
    let mut out = Vec::new();
    for l in loads {
        out.push(l.stop().await);
    }
    out
}

/// Requests each backend served among `samples` (by `x-served-by: pN`).
fn served(samples: &[Sample]) -> [u64; 3] {
    let mut n = [0; 3];
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

/// Requests each backend served among `responses` (by `x-served-by: pN`).
fn served_responses(responses: &[Response]) -> [u64; 3] {
    let mut n = [0; 3];
    for r in responses {
        let i = r
            .header("x-served-by")
            .and_then(|p| p.strip_prefix('p').and_then(|i| i.parse::<usize>().ok()));
        if let Some(slot) = i.and_then(|i| i.checked_sub(1)).and_then(|i| n.get_mut(i)) {
            *slot += 1;
        }
    }
    n
}

/// Each of `among` (0-based) served between two thirds and four thirds of
/// an even share of `split`, the others none.
fn assert_shared(what: &str, split: [u64; 3], among: &[usize]) {
    let total: u64 = split.iter().sum();
    assert!(total > 0, "{what}: no requests");
    let even = total as f64 / among.len() as f64;
    for (i, &n) in split.iter().enumerate() {
        if among.contains(&i) {
            assert!(
                (n as f64) >= even * 2.0 / 3.0 && (n as f64) <= even * 4.0 / 3.0,
                "{what}: p{} served {n} of {total}, an even share is {even:.0}: {split:?}",
                i + 1
            );
        } else {
            assert_eq!(n, 0, "{what}: p{} served {n}: {split:?}", i + 1);
        }
    }
}

fn ms_since(epoch: Instant, at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(epoch).as_millis()).unwrap_or(u64::MAX)
}

/// Sends `/delay/{ms}` through `front` (no other load running) until one
/// lands on backend `on`; the others that landed elsewhere run on and must
/// succeed too. Returns when it was sent and its task (the answer and when
/// it came).
async fn slow_request_on(
    s: &Setup,
    front: usize,
    on: usize,
    ms: u64,
) -> (
    Instant,
    tokio::task::JoinHandle<(Result<Response, String>, Instant)>,
    Vec<tokio::task::JoinHandle<(Result<Response, String>, Instant)>>,
) {
    let addr = s.fronts[front].public;
    let mut elsewhere = Vec::new();
    for _ in 0..12 {
        let before = s.backends.counts();
        let sent = Instant::now();
        let task = tokio::spawn(async move {
            let r = client::get(addr, &format!("/delay/{ms}")).await;
            (r, Instant::now())
        });
        let landed = eventually(
            "the slow request reached a backend",
            Duration::from_secs(5),
            || {
                let before = before.clone();
                async move {
                    let now = s.backends.counts();
                    (0..3).find(|&i| now[i] > before[i])
                }
            },
        )
        .await;
        if landed == on {
            return (sent, task, elsewhere);
        }
        elsewhere.push(task);
    }
    panic!("no slow request reached p{} in 12 tries", on + 1);
}

#[test]
fn the_shipped_front_configs_are_current_and_envoy_accepts_them() {
    let root = repo_root();
    let (path, text) = native_file().unwrap();
    let on_disk = std::fs::read_to_string(root.join(&path)).unwrap_or_default();
    assert!(
        on_disk == text,
        "{} is stale: run `make native-configs`",
        path.display()
    );
    wasm_dir(); // fails with "run make build" if missing
                // The template with its defaults, as `make render` writes it.
    let wasm = graceful_harness::support::render::render(
        &std::fs::read_to_string(root.join("envoy/front-proxy.yaml")).unwrap(),
        &Default::default(),
    )
    .unwrap();
    let scratch = scratch_path("front-proxy-defaults", "yaml");
    std::fs::write(&scratch, wasm).unwrap();
    let mut configs = vec![scratch];
    // The native module runs on the Envoy whose ABI it is built for (1.40).
    if envoy_minor() >= (1, 40) {
        native_module();
        configs.push(root.join(&path));
    }
    for config in configs {
        let out = Command::new(envoy_binary())
            .current_dir(&root)
            .args(["--mode", "validate", "-l", "warn", "-c"])
            .arg(&config)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && said.contains("OK"),
            "{}: {said}",
            config.display()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn closing_a_backend_under_load_loses_nothing_and_is_acknowledged() {
    let s = Setup::start("front-close-one").await;
    let x = 1; // p2, at 127.0.0.3
    let epoch = Instant::now();

    // Before: all three share the load of both fronts.
    let warm = s.loads(epoch);
    tokio::time::sleep(WINDOW).await;
    let warm: Vec<Sample> = stop_all(warm).await.concat();
    let before = served(&warm);
    assert!(warm.iter().all(|r| r.ok), "a warm request failed");
    assert_shared("before the closing", before, &[0, 1, 2]);

    // A slow request through front 1 to p2, in flight at the closing.
    let (slow_sent, slow, elsewhere) = slow_request_on(&s, 0, x, SLOW_MS).await;
    let loads = s.loads(epoch);
    let hook = run_hook(&hook_args(&[&s.fronts[0], &s.fronts[1]], s.ip(x), "25s")).await;
    let acked = hook.ended;
    let at_ack = s.backends.counts();
    tokio::time::sleep(WINDOW).await;
    let samples = stop_all(loads).await;
    let at_end = s.backends.counts();
    let (slow_answer, slow_ended) = slow.await.unwrap();
    for t in elsewhere {
        let (r, _) = t.await.unwrap();
        assert_eq!(r.map(|r| r.status), Ok(200), "a slow request elsewhere");
    }

    let said = format!("hook: {hook:?}");
    assert_eq!(hook.code, Some(0), "{said}");
    assert!(
        hook.line
            .starts_with("graceful-hook front: 2 of 2 fronts acknowledged in "),
        "{said}"
    );
    let all: Vec<Sample> = samples.concat();
    let failed = all.iter().filter(|r| !r.ok).count();
    assert_eq!(failed, 0, "{failed} of {} requests failed", all.len());
    let slow_answer = slow_answer.unwrap();
    assert_eq!(slow_answer.status, 200, "the slow request");
    assert_eq!(slow_answer.header("x-served-by").as_deref(), Some("p2"));
    assert!(
        slow_ended <= acked,
        "acknowledged {:?} before the slow request in flight ended",
        slow_ended - acked
    );
    assert!(
        hook.took() + (hook.started - slow_sent) >= Duration::from_millis(SLOW_MS),
        "{said}"
    );
    // Nothing reached p2 after the acknowledgement: not by its own count,
    // nor by any answer to a request due after it.
    assert_eq!(
        at_end[x], at_ack[x],
        "p2 served requests after the acknowledgement: {at_ack:?} -> {at_end:?}"
    );
    let ack_ms = ms_since(epoch, acked);
    let after: Vec<Sample> = all.iter().filter(|r| r.due_ms >= ack_ms).copied().collect();
    let after_split = served(&after);
    assert_shared("after the acknowledgement", after_split, &[0, 2]);
    assert!(
        after.len() as f64 >= f64::from(RATE) * 2.0 * 1.5,
        "{}",
        after.len()
    );
    // Each front's own account: acknowledged, nothing seen at p2 since;
    // front 1 had the slow request in flight at the closing and saw it end
    // before it acknowledged.
    let mut figures = Vec::new();
    for (i, f) in s.fronts.iter().enumerate() {
        let r = from(f.control, s.ip(x), "GET", STATUS, &[]).await;
        let st = json(&r);
        assert_eq!(
            find_str(&st, "state"),
            Some("acknowledged"),
            "front {}: {r:?}",
            i + 1
        );
        assert_eq!(st["late"], 0, "front {}: {r:?}", i + 1);
        figures.push(st);
    }
    let front1 = &figures[0];
    assert!(
        front1["inflight_at_closing"].as_u64() >= Some(1),
        "{front1}"
    );
    let last = front1["last_active_ms"].as_u64().unwrap_or(0);
    let slow_left = Duration::from_millis(SLOW_MS).saturating_sub(hook.started - slow_sent);
    assert!(
        Duration::from_millis(last) + Duration::from_millis(300) >= slow_left,
        "front 1 saw its last request end at {last} ms, the slow one had {slow_left:?} left: {front1}"
    );
    assert!(
        front1["acknowledged_after_ms"].as_u64() >= Some(last),
        "{front1}"
    );
    eprintln!(
        "closing p2: {} requests, {failed} failed; before {before:?}, after the acknowledgement {after_split:?}; \
         slow request ended {:?} after the hook started, the hook returned after {:?}; {}; fronts' status: {} | {}",
        all.len(),
        slow_ended.saturating_duration_since(hook.started),
        hook.took(),
        hook.line,
        figures[0],
        figures[1]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn closing_another_host_or_from_outside_is_refused() {
    let s = Setup::start("front-refused").await;
    let mut shares = Vec::new();
    let (f1, f2) = (&s.fronts[0], &s.fronts[1]);
    let outside = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let (p1, p2) = (s.ip(0), s.ip(1));

    // From an address that is no member: 403, nothing changes.
    for f in [f1, f2] {
        let r = from(f.control, outside, "POST", CLOSING, &[]).await;
        assert_eq!(r.status, 403, "{r:?}");
        assert_eq!(
            find_str(&json(&r), "refused"),
            Some("not_a_member"),
            "{r:?}"
        );
    }
    shares.push(share("front 1 after an outsider's closing", f1, &[0, 1, 2]).await);

    // A member naming another host: 403 by `?host=`.
    let r = from(f2.control, p1, "POST", &format!("{CLOSING}?host={p2}"), &[]).await;
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(
        find_str(&json(&r), "refused"),
        Some("not_your_address"),
        "{r:?}"
    );
    shares.push(share("front 2 after ?host=", f2, &[0, 1, 2]).await);

    // ... and by `x-forwarded-for`: the front takes the connection's
    // address, so p1 closes itself and p2 stays.
    let p2_text = p2.to_string();
    let forged = [("x-forwarded-for", p2_text.as_str())];
    let r = from(f1.control, p1, "POST", CLOSING, &forged).await;
    assert_eq!(r.status, 202, "{r:?}");
    let r = from(f1.control, p2, "GET", STATUS, &[]).await;
    assert_eq!(find_str(&json(&r), "state"), Some("serving"), "p2: {r:?}");
    let r = from(
        f1.control,
        p1,
        "GET",
        &format!("{DRAINED}?wait=10s"),
        &forged,
    )
    .await;
    assert_eq!(r.status, 200, "p1's acknowledgement: {r:?}");
    shares.push(share("front 1 with p1 closed", f1, &[1, 2]).await);
    // Front 2 was told nothing.
    shares.push(share("front 2, told nothing", f2, &[0, 1, 2]).await);

    // The public listener answers none of the endpoints: each reaches a
    // backend, from a member's address or not, and closes nothing.
    for source in [p2, outside] {
        for (method, path) in [
            ("POST", CLOSING.to_string()),
            ("GET", format!("{DRAINED}?wait=1s")),
            ("POST", SERVING.to_string()),
            ("GET", STATUS.to_string()),
        ] {
            let r = from(f2.public, source, method, &path, &[]).await;
            assert_eq!(r.status, 200, "{method} {path} from {source}: {r:?}");
            assert!(
                r.header("x-served-by").is_some() && r.text() == "ok\n",
                "{method} {path} from {source} on the public listener was answered by the front: {r:?}"
            );
        }
    }
    let r = from(f2.control, p2, "GET", STATUS, &[]).await;
    assert_eq!(find_str(&json(&r), "state"), Some("serving"), "p2: {r:?}");
    shares.push(share("front 2 after the public listener's calls", f2, &[0, 1, 2]).await);

    // p1 says it is serving again: front 1 sends it its share.
    let r = from(f1.control, p1, "POST", SERVING, &[]).await;
    assert_eq!(r.status, 202, "{r:?}");
    shares.push(share("front 1 after p1's serving", f1, &[0, 1, 2]).await);
    eprintln!("refused and forged closings, 600 requests each: {shares:?}");
}

/// 600 requests through `front`'s public listener (6 connections): each
/// of `among` gets an even share and the others none ([`assert_shared`]).
async fn share(
    what: &'static str,
    front: &FrontProxy,
    among: &[usize],
) -> (&'static str, [u64; 3]) {
    let split = served_responses(&client::load(front.public, 6, 100, "/").await);
    assert_shared(what, split, among);
    (what, split)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_of_three_closing_send_everything_to_the_third() {
    let s = Setup::start("front-two-of-three").await;
    let epoch = Instant::now();
    let loads = s.loads(epoch);
    let fronts = [&s.fronts[0], &s.fronts[1]];
    let (args_a, args_b) = (
        hook_args(&fronts, s.ip(0), "25s"),
        hook_args(&fronts, s.ip(1), "25s"),
    );
    let (a, b) = tokio::join!(run_hook(&args_a), run_hook(&args_b));
    let both = a.ended.max(b.ended);
    let at_ack = s.backends.counts();
    tokio::time::sleep(WINDOW).await;
    let all: Vec<Sample> = stop_all(loads).await.concat();
    let at_end = s.backends.counts();

    for h in [&a, &b] {
        assert_eq!(h.code, Some(0), "{h:?}");
        assert!(
            h.line
                .starts_with("graceful-hook front: 2 of 2 fronts acknowledged in "),
            "{h:?}"
        );
    }
    let failed = all.iter().filter(|r| !r.ok).count();
    assert_eq!(failed, 0, "{failed} of {} requests failed", all.len());
    assert_eq!(
        (at_end[0], at_end[1]),
        (at_ack[0], at_ack[1]),
        "p1 or p2 served after both acknowledgements: {at_ack:?} -> {at_end:?}"
    );
    let both_ms = ms_since(epoch, both);
    let after: Vec<Sample> = all
        .iter()
        .filter(|r| r.due_ms >= both_ms)
        .copied()
        .collect();
    let split = served(&after);
    assert_shared("after both acknowledgements", split, &[2]);
    assert!(
        after.len() as f64 >= f64::from(RATE) * 2.0 * 1.5,
        "{}",
        after.len()
    );
    eprintln!(
        "two of three closing: {} requests, {failed} failed; after both acknowledgements {split:?}; \
         p1's hook {:?}, p2's {:?}: {} | {}",
        all.len(),
        a.took(),
        b.took(),
        a.line,
        b.line
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_front_killed_mid_drain_is_named_at_the_deadline() {
    let s = Setup::start("front-killed").await;
    let x = 0; // p1, at 127.0.0.2
               // A request through front 2 to p1 longer than the hook's wait: front 2
               // cannot acknowledge before it is killed.
    let (_, slow, elsewhere) = slow_request_on(&s, 1, x, 10_000).await;
    let epoch = Instant::now();
    let loads = s.loads(epoch);
    let wait = Duration::from_secs(5);
    let args = hook_args(&[&s.fronts[0], &s.fronts[1]], s.ip(x), "5s");
    let hook = tokio::spawn(async move { run_hook(&args).await });
    let killed = &s.fronts[1];
    eventually(
        "front 2 accepted p1's closing",
        Duration::from_secs(5),
        || async {
            let r = from(killed.control, s.ip(x), "GET", STATUS, &[]).await;
            find_str(&json(&r), "state")
                .is_some_and(|st| st != "serving")
                .then_some(())
        },
    )
    .await;
    let pid = nix::unistd::Pid::from_raw(i32::try_from(killed.envoy.pid()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    let killed_at = Instant::now();
    let hook = hook.await.unwrap();
    let at_hook = s.backends.counts();
    tokio::time::sleep(WINDOW).await;
    let mut samples = stop_all(loads).await;
    let at_end = s.backends.counts();
    let through_other = samples.swap_remove(0);
    let (died, _) = slow.await.unwrap();
    for t in elsewhere {
        // Those through front 2 died with it too.
        let _ = t.await;
    }

    let said = format!("hook: {hook:?}");
    assert_eq!(hook.code, Some(1), "{said}");
    assert!(
        hook.line
            .starts_with("graceful-hook front: 1 of 2 fronts acknowledged by the 5s deadline; "),
        "{said}"
    );
    assert!(
        hook.line
            .contains(&format!("{} never acknowledged", killed.control)),
        "{said}"
    );
    assert!(hook.took() >= wait, "{said}");
    assert!(hook.took() < wait + Duration::from_millis(2500), "{said}");
    assert!(
        died.is_err() || died.is_ok_and(|r| r.status != 200),
        "the slow request died with its front"
    );
    // Nothing lost through the other front, and nothing of it to p1 after
    // the hook returned.
    let failed = through_other.iter().filter(|r| !r.ok).count();
    assert_eq!(
        failed,
        0,
        "{failed} of {} requests through front 1 failed",
        through_other.len()
    );
    assert_eq!(
        at_end[x], at_hook[x],
        "p1 served after the hook returned: {at_hook:?} -> {at_end:?}"
    );
    let hook_ms = ms_since(epoch, hook.ended);
    let after: Vec<Sample> = through_other
        .iter()
        .filter(|r| r.due_ms >= hook_ms)
        .copied()
        .collect();
    assert_shared("front 1 after the hook", served(&after), &[1, 2]);
    eprintln!(
        "front killed {:?} after the hook started; front 1: {} requests, {failed} failed, after the hook {:?}; \
         the hook returned after {:?}: {}",
        killed_at - hook.started,
        through_other.len(),
        served(&after),
        hook.took(),
        hook.line
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backend_listed_draining_closes_on_every_front_and_is_acknowledged() {
    let s = Setup::start("front-draining").await;
    // p3, at 127.0.0.4: the control plane lists it DRAINING, as Envoy
    // Gateway sends a terminating pod. No request from p3 yet.
    let x = 2;
    let listed: Vec<_> = s
        .backends
        .addrs()
        .into_iter()
        .enumerate()
        .map(|(i, a)| (a, if i == x { "DRAINING" } else { "HEALTHY" }))
        .collect();
    write_eds_health(&s.eds, CLUSTER, &listed);
    // Envoy 1.36 and 1.37: graceful_consumer reads membership from
    // /config_dump, which lists an EDS DRAINING host as UNHEALTHY (its
    // coarse health; seen on 1.36.4 and 1.40.0, over file-based EDS and
    // delta ADS), so the front cannot tell DRAINING there: p3's own
    // closing is what closes it (the hook below, either way).
    let sees_draining = envoy_minor() >= (1, 38);
    let mut seen = Vec::new();
    for f in &s.fronts {
        if !sees_draining {
            break;
        }
        let st = eventually(
            &format!("envoy {}: p3 closing by DRAINING", f.envoy.name),
            Duration::from_secs(10),
            || async {
                // Membership is read from the admin as requests need it.
                let _ = client::get(f.public, "/").await;
                let r = from(f.control, s.ip(x), "GET", STATUS, &[]).await;
                let st = json(&r);
                let draining = st["source"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|v| v == "draining"));
                (draining && st["state"] != "serving").then_some(st)
            },
        )
        .await;
        seen.push(st);
    }
    let split = [
        share("front 1 with p3 DRAINING", &s.fronts[0], &[0, 1]).await,
        share("front 2 with p3 DRAINING", &s.fronts[1], &[0, 1]).await,
    ];
    // p3's preStop then finds both fronts closing it already.
    let hook = run_hook(&hook_args(&[&s.fronts[0], &s.fronts[1]], s.ip(x), "10s")).await;
    assert_eq!(hook.code, Some(0), "{hook:?}");
    assert!(
        hook.line
            .starts_with("graceful-hook front: 2 of 2 fronts acknowledged in "),
        "{hook:?}"
    );
    eprintln!(
        "p3 DRAINING: fronts' status before the hook [{}] (Envoy {:?}: DRAINING {}seen by the front); \
         shares {split:?}; the hook returned after {:?}: {}",
        seen.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(" | "),
        envoy_minor(),
        if sees_draining { "" } else { "not " },
        hook.took(),
        hook.line
    );
}
