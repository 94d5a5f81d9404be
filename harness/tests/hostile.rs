//! Hostile and malformed input against the real `.wasm` filters in a real
//! Envoy (`--concurrency 2`): clients sending the filters' own headers,
//! forged `x-forwarded-for` over IPv6, more long-polls than `max_waiters`,
//! a caller outside `allowed_sources` holding 1,000 long-polls while the
//! pod's preStop runs (on loopback, and in the Kubernetes example's pod),
//! a client forging the consumer identity toward a destination the
//! consumer does not steer, header blocks at Envoy's size and count limits.
//! After each, Envoy must still serve on both workers, no wasm VM may have
//! crashed or reloaded, and the log must hold no panic.
//!
//! Envoy's defaults bound what reaches a filter: `max_request_headers_kb`
//! 60 (the whole header block) and `max_headers_count` 100. Requests just
//! under them reach the filters; requests at them get 431 from Envoy's
//! codec. Both kinds are sent.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use graceful_harness::platform::netns::{self, Node, Pod};
use graceful_harness::support::client::{self, Conn, Response};
use graceful_harness::support::envoy::{
    envoy_binary, eventually, native_module, repo_root, scratch_path, wasm_dir, write_eds, Envoy,
    EnvoySpec,
};
use graceful_harness::support::logged::LoggedProcess;
use graceful_harness::support::mesh::{
    status, status_of, ConsumerSidecar, ProviderSidecar, CLOSING,
};
use graceful_harness::support::native::{to_native, Delivery};
use graceful_harness::support::render::render;
use graceful_harness::support::upstream::{demo_app_binary, hook_binary};
use serde_yaml::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const INSTANCE: &str = "x-graceful-instance";
/// The address graceful_drain stamps on its answers.
const ADDRESS: &str = "x-graceful-address";
const OVERRIDE: &str = "x-graceful-override-host";
const CONSUMER_HEADER: &str = "x-graceful-consumer";
/// `allowed_sources` narrowed to one address per family, so that a second
/// loopback address stands for any other pod on the service port.
const ONLY_127_0_0_1: &str = r#""allowed_sources":["127.0.0.1/32","::1/128"]"#;
/// A caller outside [`ONLY_127_0_0_1`].
const OUTSIDER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
/// The long-polls the outsider holds.
const OUTSIDER_LONG_POLLS: usize = 1000;
/// What "at once" means for an answer that is never held (a held one
/// waits for the gate, or its `wait=` of an hour).
const AT_ONCE: Duration = Duration::from_secs(10);
const LOCALHOST_V4: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const LOCALHOST_V6: IpAddr = IpAddr::V6(Ipv6Addr::LOCALHOST);
/// A header value that keeps the whole block just under Envoy's 60 KiB.
const NEAR_LIMIT: usize = 58 * 1024;
/// A header value past Envoy's 60 KiB on its own.
const PAST_LIMIT: usize = 61 * 1024;
/// Repeated names that, with the request's own headers, stay under
/// Envoy's 100 headers (and the test app's, after Envoy adds its own).
const MANY: usize = 90;
/// Repeated names at Envoy's 100-header bound (plus `host`: past it).
const TOO_MANY: usize = 100;

async fn provider(name: &str, listen: IpAddr, drain_config: &str) -> ProviderSidecar {
    ProviderSidecar::start(name, listen, drain_config, "{}").await
}

/// Every value of a response header, as text.
fn all(r: &Response, name: &str) -> Vec<String> {
    r.headers
        .get_all(name)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect()
}

async fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
    Conn::http1(addr)
        .await
        .unwrap()
        .send(method, path, headers, Bytes::new())
        .await
        .unwrap_or_else(|e| panic!("{method} {}: {e}", &path[..path.len().min(60)]))
}

/// Stats whose names match `regex` (Envoy's `/stats?filter=`), by name.
async fn stats(envoy: &Envoy, regex: &str) -> Vec<(String, u64)> {
    let r = client::get(envoy.admin, &format!("/stats?filter={regex}"))
        .await
        .unwrap();
    r.text()
        .lines()
        .filter_map(|line| {
            let (k, v) = line.split_once(": ")?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

/// Connections accepted by each worker on the listener that is not the
/// admin's: `listener.<addr>_<port>.worker_<n>.downstream_cx_total`.
async fn worker_connections(envoy: &Envoy) -> [u64; 2] {
    let mut out = [0; 2];
    for (name, v) in stats(envoy, r"^listener\..*\.worker_[01]\.downstream_cx_total$").await {
        if name.starts_with("listener.admin.") {
            continue;
        }
        let worker = usize::from(name.contains(".worker_1."));
        out[worker] += v;
    }
    out
}

/// What tells that a wasm VM crashed: Envoy reloads it (FAIL_RELOAD) and
/// creates a new one.
#[derive(Debug, PartialEq, Eq)]
struct VmHealth {
    reloads: u64,
    created: u64,
}

async fn vm_health(envoy: &Envoy) -> VmHealth {
    // The native module has no VM to crash or reload: a panic there is
    // caught at the hook and logged, which `assert_log_clean` looks for.
    if Delivery::from_env() == Delivery::Native {
        return VmHealth {
            reloads: 0,
            created: 1,
        };
    }
    let all = stats(envoy, r"^wasm\.").await;
    let sum = |pred: &dyn Fn(&str) -> bool| {
        all.iter()
            .filter(|(k, _)| pred(k))
            .map(|(_, v)| v)
            .sum::<u64>()
    };
    let health = VmHealth {
        reloads: sum(&|k| k.ends_with(".vm_reload") || k.ends_with(".vm_reload_failure")),
        created: sum(&|k| k.ends_with(".created")),
    };
    assert!(
        health.created > 0,
        "no wasm VM stats: {all:?} (has Envoy renamed them?)"
    );
    health
}

/// Fails on any line of an Envoy log showing a panic, a wasm trap or a
/// critical error.
fn assert_log_clean(log: &str) {
    for needle in [
        "panicked",
        "failing open",
        "][critical][",
        "failed: Uncaught",
        "Wasm VM failed",
        "wasm vm failed",
    ] {
        assert!(
            !log.contains(needle),
            "envoy log contains {needle:?}:\n{}",
            log.lines()
                .filter(|l| l.contains(needle))
                .take(5)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// Envoy writes its log every 100 ms: poll for a line.
async fn log_eventually_contains(envoy: &Envoy, needle: &str) {
    eventually(
        &format!("{needle:?} in the envoy log"),
        Duration::from_secs(5),
        || async { envoy.log().contains(needle).then_some(()) },
    )
    .await;
}

/// Sends 40 requests for `path`, each on a fresh connection (Envoy's
/// workers share the accepted connections), expecting `expect` for every
/// one, and checks that both workers took some of them: both still serve.
async fn assert_serves_on_both_workers(envoy: &Envoy, addr: SocketAddr, path: &str, expect: u16) {
    let before = worker_connections(envoy).await;
    for i in 0..40 {
        let r = send(addr, "GET", path, &[]).await;
        assert_eq!(r.status, expect, "request {i} after the hostile input");
    }
    let after = worker_connections(envoy).await;
    assert_eq!(
        (after[0] - before[0]) + (after[1] - before[1]),
        40,
        "one connection per request: {before:?} -> {after:?}"
    );
    assert!(
        after[0] > before[0] && after[1] > before[1],
        "both workers must serve after the hostile input: {before:?} -> {after:?}"
    );
}

/// A refusal to a caller outside `allowed_sources`: 403 with the bare
/// word, and nothing that names the instance or the address it reached.
fn assert_bare_403(r: &Response, what: &str) {
    assert_eq!((r.status, r.text().as_str()), (403, "forbidden"), "{what}");
    assert!(
        all(r, INSTANCE).is_empty(),
        "{what}: the instance id went out"
    );
    assert!(all(r, ADDRESS).is_empty(), "{what}: the address went out");
}

/// The provider's instance id, from a clean request.
async fn instance_id(addr: SocketAddr) -> String {
    let r = client::get(addr, "/").await.unwrap();
    assert_eq!(r.status, 200);
    r.header(INSTANCE).expect("instance header")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_ignores_the_filters_own_headers_when_clients_send_them() {
    let p = provider("hostile-own-headers", LOCALHOST_V4, "{}").await;
    let id = instance_id(p.inbound).await;
    let forged: &[(&str, &str)] = &[
        (CLOSING, "true"),
        (CLOSING, "TRUE"),
        ("closing", "true"),
        (INSTANCE, "forged-instance"),
        (OVERRIDE, "127.0.0.1:1"),
    ];
    let health = vm_health(&p.envoy).await;
    // Serving: a client claiming "closing" neither starts closing nor gets
    // a marked answer, and cannot choose the instance id it sees.
    for path in ["/", "/graceful/ready", "/graceful/status"] {
        for _ in 0..5 {
            let r = send(p.inbound, "GET", path, forged).await;
            assert_eq!(r.status, 200, "{path}: {}", r.text());
            assert!(all(&r, CLOSING).is_empty(), "{path}: marked closing");
            if path == "/" {
                assert_eq!(all(&r, INSTANCE), vec![id.clone()], "{path}");
            }
        }
    }
    let s = status(p.inbound).await;
    assert_eq!((s.phase.as_str(), s.drained), ("serving", false));
    // Closing: a client's "false" cannot remove the mark, nor its own id
    // replace the instance's; each header comes exactly once.
    let r = client::post(p.inbound, "/graceful/closing").await.unwrap();
    assert_eq!(r.status, 202, "{}", r.text());
    let r = send(
        p.inbound,
        "GET",
        "/",
        &[(CLOSING, "false"), (INSTANCE, "forged-instance")],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(all(&r, CLOSING), vec!["true".to_string()]);
    assert_eq!(all(&r, INSTANCE), vec![id]);
    assert_eq!(vm_health(&p.envoy).await, health, "a wasm VM was reloaded");
    assert_log_clean(&p.envoy.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_takes_only_the_ipv6_peer_as_the_closing_source_never_forwarded_for() {
    // ::1 is not allowed here; forged headers name allowed addresses.
    let cfg = r#"{"allowed_sources":["127.0.0.0/8","10.0.0.0/8"]}"#;
    let p = provider("hostile-ipv6-refused", LOCALHOST_V6, cfg).await;
    let forged = [
        None,
        Some("127.0.0.1"),
        Some("10.1.2.3"),
        Some("::1"),
        Some("10.9.9.9, 127.0.0.1"),
        Some("[::1]:4242"),
        Some("127.0.0.1:4242"),
    ];
    for xff in forged {
        let headers: Vec<(&str, &str)> = xff.map(|x| ("x-forwarded-for", x)).into_iter().collect();
        let r = send(p.inbound, "POST", "/graceful/closing", &headers).await;
        assert_bare_403(&r, &format!("x-forwarded-for {xff:?}"));
    }
    // [::1] is outside these sources for every endpoint but readiness: the
    // phase is read from Envoy's admin.
    assert_bare_403(
        &send(p.inbound, "GET", "/graceful/status", &[]).await,
        "GET /graceful/status",
    );
    assert_eq!(
        p.envoy.stat("wasmcustom.graceful_drain_phase").await,
        Some(0)
    );
    assert_eq!(
        client::get(p.inbound, "/graceful/ready")
            .await
            .unwrap()
            .status,
        200
    );
    // The refusal names the real IPv6 peer.
    log_eventually_contains(&p.envoy, "closing refused: source [::1]:").await;
    drop(p);

    // Default allowed_sources include ::1/128. A forwarded-for entry that
    // Envoy reads as an IP replaces the source (port 0): refused, even
    // naming an allowed address.
    let p = provider("hostile-ipv6-allowed", LOCALHOST_V6, "{}").await;
    for xff in ["::1", "127.0.0.1", "10.1.2.3, ::1"] {
        let r = send(
            p.inbound,
            "POST",
            "/graceful/closing",
            &[("x-forwarded-for", xff)],
        )
        .await;
        assert_bare_403(&r, &format!("x-forwarded-for {xff:?}"));
    }
    assert_eq!(status(p.inbound).await.phase, "serving");
    // An entry Envoy cannot read as an IP leaves the real peer, [::1],
    // as the source: allowed, whatever the header claims.
    let r = send(
        p.inbound,
        "POST",
        "/graceful/closing",
        &[("x-forwarded-for", "[::1]:4242")],
    )
    .await;
    assert_eq!(r.status, 202, "from [::1] itself: {}", r.text());
    assert_eq!(status_of(&r).phase, "closing");
    log_eventually_contains(&p.envoy, "closing started by POST from ::1").await;
    // The IPv6 data path marks responses like the IPv4 one.
    let r = client::get(p.inbound, "/").await.unwrap();
    assert_eq!(
        (r.status, r.header(CLOSING).as_deref()),
        (200, Some("true"))
    );
    assert_serves_on_both_workers(&p.envoy, p.inbound, "/", 200).await;
    assert_log_clean(&p.envoy.log());
}

/// A `drained?wait=` long-poll on a raw connection, held until dropped.
async fn hold_long_poll(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /graceful/drained?wait=60s HTTP/1.1\r\nhost: test\r\n\r\n")
        .await
        .unwrap();
    s
}

/// `n` requests at once, each on a fresh connection from `source` (None:
/// this thread's own address): each answer's status, counted, and the
/// slowest answer's time. The connections stay open, returned: a caller
/// holding them.
async fn at_once_from(
    addr: SocketAddr,
    source: Option<IpAddr>,
    method: &'static str,
    path: &'static str,
    n: usize,
) -> (BTreeMap<u16, usize>, Duration, Vec<Conn>) {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            tokio::spawn(async move {
                let mut conn = match source {
                    Some(ip) => Conn::http1_from(addr, ip).await,
                    None => Conn::http1(addr).await,
                }
                .unwrap_or_else(|e| panic!("{e}"));
                let started = Instant::now();
                let r = conn
                    .send(method, path, &[], Bytes::new())
                    .await
                    .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
                (r.status, started.elapsed(), conn)
            })
        })
        .collect();
    let mut statuses = BTreeMap::new();
    let mut slowest = Duration::ZERO;
    let mut held = Vec::new();
    for t in tasks {
        let (status, took, conn) = t.await.unwrap();
        *statuses.entry(status).or_insert(0) += 1;
        slowest = slowest.max(took);
        held.push(conn);
    }
    (statuses, slowest, held)
}

/// [`at_once_from`] with [`OUTSIDER_LONG_POLLS`] `drained?wait=1h`
/// long-polls, asserting that every one got 403 at once; the connections.
async fn outsider_long_polls(addr: SocketAddr, source: Option<IpAddr>, when: &str) -> Vec<Conn> {
    let (statuses, slowest, held) = at_once_from(
        addr,
        source,
        "GET",
        "/graceful/drained?wait=1h",
        OUTSIDER_LONG_POLLS,
    )
    .await;
    eprintln!(
        "{when}: {OUTSIDER_LONG_POLLS} long-polls from {}: {statuses:?}, the slowest answered in {slowest:?}",
        source.map_or("this address".to_string(), |s| s.to_string())
    );
    assert_eq!(
        statuses,
        BTreeMap::from([(403, OUTSIDER_LONG_POLLS)]),
        "{when}: every long-poll from outside allowed_sources gets 403"
    );
    assert!(
        slowest < AT_ONCE,
        "{when}: 403 must come at once, took {slowest:?}"
    );
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_answers_429_only_to_allowed_callers_past_max_waiters_and_never_holds_outsiders() {
    const MAX: usize = 3;
    let cfg = format!(r#"{{"max_waiters":{MAX},{ONLY_127_0_0_1}}}"#);
    let p = provider("hostile-waiters", LOCALHOST_V4, &cfg).await;
    let health = vm_health(&p.envoy).await;
    let active = || async { p.envoy.stat("http.inbound.downstream_rq_active").await };

    let mut held = Vec::new();
    for i in 0..MAX {
        held.push(hold_long_poll(p.inbound).await);
        eventually(
            &format!("{} long-polls held", i + 1),
            Duration::from_secs(10),
            || async { (active().await == Some(i as u64 + 1)).then_some(()) },
        )
        .await;
    }
    // 20 more allowed ones at once, on fresh connections (so on both
    // workers): each is refused with 429 at once, none is held.
    let (statuses, slowest, _) =
        at_once_from(p.inbound, None, "GET", "/graceful/drained?wait=60s", 20).await;
    assert_eq!(
        statuses,
        BTreeMap::from([(429, 20)]),
        "allowed callers past max_waiters"
    );
    assert!(
        slowest < AT_ONCE,
        "429s must come at once, took {slowest:?}"
    );
    // A caller outside allowed_sources gets 403, never 429: it is not
    // counted against the slots, and is never held.
    let (statuses, slowest, _outsider) = at_once_from(
        p.inbound,
        Some(OUTSIDER),
        "GET",
        "/graceful/drained?wait=60s",
        20,
    )
    .await;
    assert_eq!(
        statuses,
        BTreeMap::from([(403, 20)]),
        "outsiders while the slots are full"
    );
    assert!(
        slowest < AT_ONCE,
        "403s must come at once, took {slowest:?}"
    );
    assert_eq!(active().await, Some(MAX as u64), "the held ones stay held");
    // Envoy stays healthy meanwhile: other endpoints and the app answer.
    assert_eq!(status(p.inbound).await.phase, "serving");
    assert_serves_on_both_workers(&p.envoy, p.inbound, "/graceful/ready", 200).await;
    // Clients that leave free their slots; an outsider is still never held
    // with every slot free.
    drop(held);
    eventually(
        "abandoned long-polls released",
        Duration::from_secs(10),
        || async { (active().await == Some(0)).then_some(()) },
    )
    .await;
    let (statuses, _, _outsider) = at_once_from(
        p.inbound,
        Some(OUTSIDER),
        "GET",
        "/graceful/drained?wait=60s",
        20,
    )
    .await;
    assert_eq!(
        statuses,
        BTreeMap::from([(403, 20)]),
        "outsiders with the slots free"
    );
    assert_eq!(active().await, Some(0), "no outsider is held");
    // An allowed long-poll is held again (it runs out and answers 503, not
    // 429).
    let started = Instant::now();
    let r = client::get(p.inbound, "/graceful/drained?wait=300ms")
        .await
        .unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "held for its wait"
    );
    assert_eq!(vm_health(&p.envoy).await, health, "a wasm VM was reloaded");
    assert_log_clean(&p.envoy.log());
}

/// A preStop hook run as the kubelet runs an exec hook: a process, its exit
/// code and what it said, and when it exited.
struct HookRun {
    ok: bool,
    said: String,
    exited: Instant,
}

async fn run_hook(mut cmd: tokio::process::Command) -> HookRun {
    let out = cmd.stdin(Stdio::null()).output().await.unwrap_or_else(|e| {
        panic!("the preStop hook: {e} (build it: cargo build -p graceful-hook)")
    });
    HookRun {
        ok: out.status.success(),
        said: String::from_utf8_lossy(&out.stderr).into_owned(),
        exited: Instant::now(),
    }
}

/// When the drain gate passed, from `/graceful/report` read now from an
/// allowed source: `closing_for_ms` - `drained_after_ms` before the answer
/// came (never earlier than the pass, up to the ms both are cut to).
fn gate_passed_at(report: &Response, read_at: Instant) -> Instant {
    let v: serde_json::Value = serde_json::from_slice(&report.body)
        .unwrap_or_else(|e| panic!("report JSON {:?}: {e}", report.text()));
    let ms = |k: &str| {
        v[k].as_u64()
            .unwrap_or_else(|| panic!("report without {k}: {v}"))
    };
    read_at - Duration::from_millis(ms("closing_for_ms") - ms("drained_after_ms"))
}

/// How much later `b` is than `a`, in ms (negative when earlier).
fn ms_after(b: Instant, a: Instant) -> i64 {
    if b >= a {
        (b - a).as_millis() as i64
    } else {
        -((a - b).as_millis() as i64)
    }
}

/// A caller outside `allowed_sources` on the service port: it holds 1,000
/// `drained?wait=1h` long-polls (each 403 at once), cannot read the status
/// or the report, cannot start closing; readiness answers it. The pod's
/// preStop (`graceful-hook prestop URL WAIT`, as the shipped hooks run it)
/// meanwhile starts closing and returns 0 only once the gate has passed,
/// after a request in flight at closing has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_never_holds_an_outsider_and_the_prestop_returns_only_once_drained() {
    let cfg = format!(
        r#"{{"consumer_update_wait":"1s","quiet_window":"200ms","step_timeout":"30s","timeout":"60s",{ONLY_127_0_0_1}}}"#
    );
    let p = provider("hostile-outsider", LOCALHOST_V4, &cfg).await;
    let health = vm_health(&p.envoy).await;
    let addr = p.inbound;
    let from_outside = |method: &'static str, path: &'static str| async move {
        Conn::http1_from(addr, OUTSIDER)
            .await
            .unwrap()
            .send(method, path, &[], Bytes::new())
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    };
    // Serving: the outsider reads nothing but readiness, and cannot close.
    for (method, path) in [
        ("GET", "/graceful/status"),
        ("GET", "/graceful/report"),
        ("GET", "/graceful/drained"),
        ("POST", "/graceful/closing"),
    ] {
        let r = from_outside(method, path).await;
        assert_eq!(
            r.status,
            403,
            "{method} {path} from {OUTSIDER}: {}",
            r.text()
        );
        assert!(!r.text().contains("phase"), "{path}: {}", r.text());
    }
    let r = from_outside("GET", "/graceful/ready").await;
    assert_eq!((r.status, r.text().trim()), (200, "SERVING"));
    assert_eq!(
        status(addr).await.phase,
        "serving",
        "the outsider's POST closed"
    );

    // A request in flight at closing: the gate cannot pass before it ends.
    let slow = tokio::spawn(async move {
        let r = client::get(addr, "/delay/3000").await;
        (r.map(|r| r.status), Instant::now())
    });
    eventually(
        "the slow request in flight",
        Duration::from_secs(10),
        || async { (status(addr).await.inflight_inbound == 1).then_some(()) },
    )
    .await;
    let held = outsider_long_polls(addr, Some(OUTSIDER), "serving").await;
    assert_eq!(
        p.envoy.stat("http.inbound.downstream_rq_active").await,
        Some(1),
        "only the slow request is active: no long-poll of the outsider is held"
    );

    // The preStop, as the examples run it, while the outsider keeps its
    // connections and sends 1,000 more long-polls.
    let mut hook = tokio::process::Command::new(hook_binary());
    hook.args(["prestop", &format!("http://{addr}"), "30s"]);
    let hook = tokio::spawn(run_hook(hook));
    eventually(
        "readiness 503 for the outsider",
        Duration::from_secs(10),
        || async {
            let r = from_outside("GET", "/graceful/ready").await;
            (r.status == 503).then(|| assert_eq!(r.text().trim(), "NOT_SERVING"))
        },
    )
    .await;
    let held_closing = outsider_long_polls(addr, Some(OUTSIDER), "closing").await;
    for (method, path) in [("GET", "/graceful/status"), ("GET", "/graceful/report")] {
        assert_eq!(
            from_outside(method, path).await.status,
            403,
            "{path} while closing"
        );
    }
    let run = hook.await.unwrap();
    let report_read = Instant::now();
    let report = client::get(addr, "/graceful/report").await.unwrap();
    let passed = gate_passed_at(&report, report_read);
    let (slow_status, slow_ended) = slow.await.unwrap();
    let st = status(addr).await;
    eprintln!(
        "preStop returned {} ms after the gate passed (report), {} ms after the request in flight ended; said: {}",
        ms_after(run.exited, passed),
        ms_after(run.exited, slow_ended),
        run.said.trim()
    );
    assert_eq!(slow_status, Ok(200), "the request in flight at closing");
    assert!(
        run.ok && run.said.contains("prestop: drained"),
        "the preStop: {}",
        run.said
    );
    assert!(st.drained && !st.forced, "{st:?}");
    assert!(
        run.exited >= slow_ended,
        "the preStop returned {} ms before the request in flight ended",
        ms_after(slow_ended, run.exited)
    );
    // The report's times are whole ms: allow the pass to read 2 ms late.
    assert!(
        ms_after(run.exited, passed) >= -2,
        "the preStop returned {} ms before the gate passed",
        ms_after(passed, run.exited)
    );
    drop((held, held_closing));
    assert_eq!(vm_health(&p.envoy).await, health, "a wasm VM was reloaded");
    assert_log_clean(&p.envoy.log());
}

const KUBERNETES_MANIFEST: &str = "examples/kubernetes/provider.yaml";
const KUBERNETES_DRAIN_CONFIG: &str = "examples/kubernetes/drain-config.json";
/// Where the kubelet's node sits: the pods' bridge gateway.
const NODE_IP: Ipv4Addr = Ipv4Addr::new(netns::SUBNET[0], netns::SUBNET[1], netns::SUBNET[2], 1);

/// Whether this machine can make pods (network namespaces); in CI it must.
fn pods_available() -> bool {
    match netns::available() {
        Ok(()) => true,
        Err(why) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: the Kubernetes example's pod needs network namespaces: {why}");
            false
        }
        Err(why) => panic!("CI must run the Kubernetes example's pod: {why}"),
    }
}

/// The Kubernetes example's pod template (`spec.template.spec`).
fn kubernetes_pod() -> Value {
    let path = repo_root().join(KUBERNETES_MANIFEST);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let deployment = serde_yaml::Deserializer::from_str(&text)
        .map(|d| {
            serde::Deserialize::deserialize(d)
                .unwrap_or_else(|e| panic!("{KUBERNETES_MANIFEST}: {e}"))
        })
        .find(|d: &Value| d["kind"] == "Deployment")
        .unwrap_or_else(|| panic!("{KUBERNETES_MANIFEST}: no Deployment"));
    deployment["spec"]["template"]["spec"].clone()
}

fn kubernetes_container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["containers"]
        .as_sequence()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("{KUBERNETES_MANIFEST}: no container {name}"))
}

fn strings(v: &Value, what: &str) -> Vec<String> {
    let list: Vec<String> = v
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(String::from))
        .collect();
    assert!(!list.is_empty(), "{KUBERNETES_MANIFEST}: no {what}");
    list
}

/// A container's command as the pod runs it: `graceful-hook` (from the
/// volume the init container fills) and `demo-app` (the app's image) are
/// the built binaries.
fn in_kubernetes_pod(pod: &Pod, command: &[String]) -> std::process::Command {
    let program = match command[0].rsplit('/').next() {
        Some("graceful-hook") => hook_binary(),
        Some("demo-app") => demo_app_binary(),
        _ => PathBuf::from(&command[0]),
    };
    let mut cmd = pod.command(&program.display().to_string());
    cmd.args(&command[1..]);
    cmd
}

/// A process inside a pod, killed on drop; its output in a log printed
/// when the test fails.
type PodProcess = LoggedProcess;

/// What the Kubernetes example's manifest says the pod is.
struct KubernetesExample {
    /// Envoy's container port, which its readiness probe reads too.
    port: u16,
    probe_path: String,
    app_args: Vec<String>,
    /// Each container's preStop exec command, by container.
    hooks: Vec<(String, Vec<String>)>,
}

impl KubernetesExample {
    fn read() -> KubernetesExample {
        let spec = kubernetes_pod();
        let envoy_spec = kubernetes_container(&spec, "envoy");
        let port = envoy_spec["ports"][0]["containerPort"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .expect("envoy's containerPort");
        let probe = &envoy_spec["readinessProbe"]["httpGet"];
        let probe_path = probe["path"]
            .as_str()
            .expect("envoy's readiness httpGet path")
            .to_string();
        assert_eq!(probe["port"].as_u64(), Some(u64::from(port)));
        let hooks = ["app", "envoy"]
            .iter()
            .map(|c| {
                let command =
                    &kubernetes_container(&spec, c)["lifecycle"]["preStop"]["exec"]["command"];
                (
                    c.to_string(),
                    strings(command, &format!("{c}'s preStop exec command")),
                )
            })
            .collect();
        KubernetesExample {
            port,
            probe_path,
            app_args: strings(&kubernetes_container(&spec, "app")["args"], "app args"),
            hooks,
        }
    }
}

/// The README's render into `dir`: APP_PORT=8080, the drain config
/// without newlines; the wasm files where this run keeps them.
fn kubernetes_envoy_config(dir: &Path) -> PathBuf {
    let drain_config = std::fs::read_to_string(repo_root().join(KUBERNETES_DRAIN_CONFIG))
        .unwrap_or_else(|e| panic!("{KUBERNETES_DRAIN_CONFIG}: {e}"))
        .replace('\n', "");
    let values = HashMap::from([
        ("APP_PORT".to_string(), "8080".to_string()),
        ("WASM_DIR".to_string(), wasm_dir().display().to_string()),
        ("DRAIN_CONFIG".to_string(), drain_config),
    ]);
    let template =
        std::fs::read_to_string(repo_root().join("envoy/provider-sidecar.yaml")).unwrap();
    let mut config = render(&template, &values).unwrap_or_else(|e| panic!("{e}"));
    if Delivery::from_env() == Delivery::Native {
        config = to_native(&config, &native_module())
            .unwrap_or_else(|e| panic!("{e}"))
            .0;
    }
    let config_path = dir.join("envoy.yaml");
    std::fs::write(&config_path, config).unwrap();
    config_path
}

/// The pod's app and Envoy, returned once loopback inside the pod (an
/// allowed source) reads the status serving.
fn start_kubernetes_pod(
    pod: &Pod,
    example: &KubernetesExample,
    config_path: &Path,
    dir: &Path,
) -> (PodProcess, PodProcess) {
    let app = PodProcess::spawn(
        "app",
        in_kubernetes_pod(
            pod,
            &[vec!["demo-app".to_string()], example.app_args.clone()].concat(),
        ),
        dir,
        |_| {},
    );
    let mut envoy_cmd = pod.command(&envoy_binary().display().to_string());
    envoy_cmd
        .arg("-c")
        .arg(config_path)
        .args(["--concurrency", "2", "--disable-hot-restart"])
        .args(["--log-format", "[%Y-%m-%d %T.%e][%t][%l][%n] %v"])
        .args(["--file-flush-interval-msec", "100"]);
    let envoy = PodProcess::spawn("envoy", envoy_cmd, dir, |_| {});
    let inside = SocketAddr::from((Ipv4Addr::LOCALHOST, example.port));
    netns::run_in(&pod.netns, move || {
        Box::pin(async move {
            eventually(
                "the pod's Envoy serving",
                Duration::from_secs(60),
                || async {
                    let r = client::get(inside, "/graceful/status").await.ok()?;
                    (r.status == 200 && status_of(&r).phase == "serving").then_some(())
                },
            )
            .await;
        })
    });
    (app, envoy)
}

/// The kubelet's view, from the node's address: readiness answers,
/// nothing else does.
async fn assert_the_node_reads_readiness_alone(service: SocketAddr, probe_path: &str) {
    let r = client::get(service, probe_path).await.unwrap();
    assert_eq!(
        (r.status, r.text().trim()),
        (200, "SERVING"),
        "readiness from {NODE_IP}"
    );
    for (method, path) in [
        ("GET", "/graceful/status"),
        ("GET", "/graceful/report"),
        ("POST", "/graceful/closing"),
        ("GET", "/graceful/drained?wait=30s"),
    ] {
        let r = client::request(service, method, path, &[]).await.unwrap();
        assert_bare_403(&r, &format!("{method} {path} from the node {NODE_IP}"));
    }
}

/// Inside the pod (`netns`), from a blocking thread: `f` on loopback.
async fn in_pod_netns<T: Send + 'static, F>(
    netns: String,
    f: impl FnOnce() -> F + Send + 'static,
) -> T
where
    F: std::future::Future<Output = T> + 'static,
{
    tokio::task::spawn_blocking(move || netns::run_in(&netns, move || Box::pin(f())))
        .await
        .unwrap()
}

/// Each hook's run, and the gate's pass read inside the pod: every hook
/// returned 0 saying drained, after the request in flight at closing
/// ended and not before the gate passed.
fn assert_hooks_waited(runs: &[(String, HookRun)], passed: Instant, slow_ended: Instant) {
    for (c, run) in runs {
        eprintln!(
            "kubernetes example, {c} preStop: exit {}, {} ms after the gate passed, {} ms after the request in flight ended; said: {}",
            if run.ok { 0 } else { 1 },
            ms_after(run.exited, passed),
            ms_after(run.exited, slow_ended),
            run.said.trim()
        );
        assert!(
            run.ok && run.said.contains("prestop: drained"),
            "{c}'s preStop: {}",
            run.said
        );
        assert!(
            run.exited >= slow_ended,
            "{c}'s preStop returned before the request in flight ended"
        );
        assert!(
            ms_after(run.exited, passed) >= -2,
            "{c}'s preStop returned before the gate passed"
        );
    }
}

/// The shutdown as the node sees it: the readiness probe and 1,000
/// outsider long-polls before and during it, a slow request in flight at
/// closing, both preStop hooks run in the pod at once; then the gate read
/// inside the pod.
async fn drain_seen_from_the_node(
    service: SocketAddr,
    probe_path: String,
    pod_netns: String,
    commands: Vec<(String, std::process::Command)>,
) {
    let inside = SocketAddr::from((Ipv4Addr::LOCALHOST, service.port()));
    assert_the_node_reads_readiness_alone(service, &probe_path).await;
    let slow = tokio::spawn(async move {
        let r = client::get(service, "/delay/4000").await;
        (r.map(|r| r.status), Instant::now())
    });
    in_pod_netns(pod_netns.clone(), move || async move {
        eventually(
            "the slow request in flight",
            Duration::from_secs(10),
            || async { (status(inside).await.inflight_inbound == 1).then_some(()) },
        )
        .await;
    })
    .await;
    let held = outsider_long_polls(service, None, "the node, serving").await;

    // Pod deletion: both containers' preStop hooks at once.
    let hooks: Vec<_> = commands
        .into_iter()
        .map(|(c, cmd)| {
            (
                c,
                tokio::spawn(run_hook(tokio::process::Command::from(cmd))),
            )
        })
        .collect();
    eventually(
        "the kubelet's readiness probe failing",
        Duration::from_secs(10),
        || async {
            let r = client::get(service, &probe_path).await.ok()?;
            (r.status == 503).then(|| assert_eq!(r.text().trim(), "NOT_SERVING"))
        },
    )
    .await;
    let held_closing = outsider_long_polls(service, None, "the node, closing").await;
    let mut runs = Vec::new();
    for (c, hook) in hooks {
        runs.push((c, hook.await.unwrap()));
    }
    let (slow_status, slow_ended) = slow.await.unwrap();
    assert_eq!(slow_status, Ok(200), "the request in flight at closing");
    // Inside the pod (loopback): the gate, and when it passed.
    let (read_at, report, st) = in_pod_netns(pod_netns, move || async move {
        let read_at = Instant::now();
        let report = client::get(inside, "/graceful/report").await.unwrap();
        (read_at, report, status(inside).await)
    })
    .await;
    let passed = gate_passed_at(&report, read_at);
    assert!(st.drained && !st.forced, "{st:?}");
    assert_hooks_waited(&runs, passed, slow_ended);
    drop((held, held_closing));
}

/// The Kubernetes example's pod, as its manifest and README say, in a
/// network namespace standing for the pod: Envoy with the config the
/// README renders (its `drain-config.json`, every other default), the app
/// with its own arguments, and both containers' preStop commands run
/// inside the pod as written. The node (the kubelet's address, outside
/// the default `allowed_sources`) holds 1,000 `drained?wait=1h` long-polls
/// on the service port before and during the shutdown: each gets 403 at
/// once; the kubelet's readiness probe reads 200, then 503 once closing;
/// both hooks return 0 only once the gate has passed, after a request in
/// flight at closing has ended.
#[test]
fn it_drains_the_kubernetes_examples_pod_while_the_node_holds_1000_long_polls() {
    if !pods_available() {
        return;
    }
    let example = KubernetesExample::read();
    let dir = repo_root()
        .join("target/e2e")
        .join(format!("hostile-kubernetes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let config_path = kubernetes_envoy_config(&dir);

    let mut node = Node::new();
    let pod = node.pod("k8s", 20);
    let (_app, envoy) = start_kubernetes_pod(&pod, &example, &config_path, &dir);
    let service = SocketAddr::from((pod.ip, example.port));
    let pod_netns = pod.netns.clone();
    let commands: Vec<(String, std::process::Command)> = example
        .hooks
        .iter()
        .map(|(c, command)| (c.clone(), in_kubernetes_pod(&pod, command)))
        .collect();
    let probe_path = example.probe_path.clone();
    netns::run_in(&node.netns.clone(), move || {
        Box::pin(drain_seen_from_the_node(
            service, probe_path, pod_netns, commands,
        ))
    });
    assert_log_clean(&envoy.log());
    drop(pod);
}

/// A stand-in destination that answers 200 to everything (HTTP/1.1 and
/// HTTP/2) and records, per request, its path and every value of
/// [`CONSUMER_HEADER`] it carried.
type Seen = Arc<Mutex<Vec<(String, Vec<String>)>>>;

async fn recording_destination() -> (SocketAddr, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let record = record.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let values = req
                            .headers()
                            .get_all(CONSUMER_HEADER)
                            .iter()
                            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                            .collect();
                        record
                            .lock()
                            .unwrap()
                            .push((req.uri().path().to_string(), values));
                        async {
                            Ok::<_, std::convert::Infallible>(hyper::Response::new(
                                http_body_util::Full::new(Bytes::from_static(b"ok\n")),
                            ))
                        }
                    },
                );
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            });
        }
    });
    (addr, seen)
}

/// `envoy/consumer-sidecar.yaml` rendered as [`ConsumerSidecar`] renders
/// it, plus what the shipped config leaves out: a second destination on
/// the same listener (`/egress/` to cluster `egress`, as an external API
/// or any service the consumer does not steer), a cluster without the
/// upstream instance. Written as a config of its own; the spec runs it.
fn consumer_with_egress(name: &str, providers_eds: &Path, egress: SocketAddr) -> EnvoySpec {
    let spec = EnvoySpec::new(name, "consumer-sidecar.yaml")
        .set("OUTBOUND_PORT", 0)
        .set("EDS_PATH", providers_eds.display())
        .set("CONSUMER_CONFIG", r#"{"admin_cluster": "envoy_admin"}"#);
    let template =
        std::fs::read_to_string(repo_root().join("envoy/consumer-sidecar.yaml")).unwrap();
    let rendered = render(&template, &spec.values).unwrap_or_else(|e| panic!("{e}"));
    let mut config: Value = serde_yaml::from_str(&rendered).unwrap();
    let egress_route: Value =
        serde_yaml::from_str(r#"{match: {prefix: "/egress/"}, route: {cluster: egress}}"#).unwrap();
    let hcm = &mut config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"];
    let routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
        .as_sequence_mut()
        .expect("the outbound routes");
    routes.insert(0, egress_route);
    let egress_cluster: Value = serde_yaml::from_str(&format!(
        r#"{{name: egress, type: STATIC, connect_timeout: 1s,
            load_assignment: {{cluster_name: egress, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: "{}", port_value: {}}}}}}}}}]}}]}}}}"#,
        egress.ip(),
        egress.port()
    ))
    .unwrap();
    config["static_resources"]["clusters"]
        .as_sequence_mut()
        .expect("the clusters")
        .push(egress_cluster);
    let path = scratch_path(&format!("{name}-config"), "yaml");
    std::fs::write(&path, serde_yaml::to_string(&config).unwrap()).unwrap();
    EnvoySpec {
        template: path.display().to_string(),
        ..spec
    }
}

/// What leaves the pod: a request to a destination the consumer does not
/// steer carries no consumer identity, neither this Envoy's nor the one a
/// client forged; a request to the steered `providers` cluster carries
/// this Envoy's, never the client's. Fresh connections, so both workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_sends_the_consumer_identity_only_to_the_steered_cluster_and_no_forged_one() {
    let (provider, at_provider) = recording_destination().await;
    let (egress, at_egress) = recording_destination().await;
    let eds = scratch_path("hostile-identity-eds", "yaml");
    write_eds(&eds, "providers", &[provider]);
    let spec = consumer_with_egress("hostile-identity", &eds, egress);
    let envoy = spec.start().await;
    let outbound = envoy.listener("outbound").await;
    let health = vm_health(&envoy).await;
    let before = worker_connections(&envoy).await;
    for i in 0..20 {
        for (path, forged) in [
            ("/egress/api", None),
            ("/egress/api", Some("forged-by-client")),
            ("/app", None),
            ("/app", Some("forged-by-client")),
        ] {
            let headers: Vec<(&str, &str)> =
                forged.map(|f| (CONSUMER_HEADER, f)).into_iter().collect();
            let r = send(outbound, "GET", path, &headers).await;
            assert_eq!(r.status, 200, "{path} ({i}): {}", r.text());
        }
    }
    let after = worker_connections(&envoy).await;
    assert!(
        after[0] > before[0] && after[1] > before[1],
        "both workers sent: {before:?} -> {after:?}"
    );
    let at_egress = at_egress.lock().unwrap().clone();
    let at_provider = at_provider.lock().unwrap().clone();
    assert_eq!(at_egress.len(), 40, "{at_egress:?}");
    assert!(
        at_egress
            .iter()
            .all(|(path, values)| path == "/egress/api" && values.is_empty()),
        "the egress destination saw an identity: {:?}",
        at_egress
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .take(3)
            .collect::<Vec<_>>()
    );
    let app: Vec<&Vec<String>> = at_provider
        .iter()
        .filter(|(p, _)| p == "/app")
        .map(|(_, v)| v)
        .collect();
    assert_eq!(app.len(), 40, "{at_provider:?}");
    let identity = app[0].first().cloned().unwrap_or_default();
    eprintln!("egress: {} requests, none with {CONSUMER_HEADER}; providers: {} requests, each with {CONSUMER_HEADER}: {identity}", at_egress.len(), app.len());
    assert!(
        !identity.is_empty() && identity != "forged-by-client",
        "the steered cluster's identity: {identity:?}"
    );
    assert!(
        app.iter().all(|values| values == &&vec![identity.clone()]),
        "one identity, once, on every request to the steered cluster: {app:?}"
    );
    assert_eq!(vm_health(&envoy).await, health, "a wasm VM was reloaded");
    assert_log_clean(&envoy.log());
}

/// One hostile request and the status Envoy must answer it with.
struct Hostile {
    what: &'static str,
    method: &'static str,
    path: String,
    headers: Vec<(String, String)>,
    http2: bool,
    expect: u16,
}

fn hostile(
    what: &'static str,
    method: &'static str,
    path: &str,
    headers: Vec<(String, String)>,
    expect: u16,
) -> Hostile {
    Hostile {
        what,
        method,
        path: path.to_string(),
        headers,
        http2: false,
        expect,
    }
}

fn repeated(name: &str, value: &str, n: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|_| (name.to_string(), value.to_string()))
        .collect()
}

fn one(name: &str, value: String) -> Vec<(String, String)> {
    vec![(name.to_string(), value)]
}

/// Sends `h` on a fresh connection; a transport error counts as the
/// status 0 (Envoy may close a connection it refuses).
async fn send_hostile(addr: SocketAddr, h: &Hostile) -> u16 {
    let headers: Vec<(&str, &str)> = h
        .headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let conn = if h.http2 {
        Conn::http2(addr).await
    } else {
        Conn::http1(addr).await
    };
    match conn
        .unwrap()
        .send(h.method, &h.path, &headers, Bytes::new())
        .await
    {
        Ok(r) => r.status,
        Err(_) => 0,
    }
}

/// Header blocks just under Envoy's bounds (they reach the filters) and
/// at them (Envoy's codec answers 431), over HTTP/1.1.
fn provider_hostile_http1() -> Vec<Hostile> {
    let near = "a".repeat(NEAR_LIMIT);
    let past = "a".repeat(PAST_LIMIT);
    let xff_near = "10.0.0.1, ".repeat(NEAR_LIMIT / 10) + "127.0.0.1";
    vec![
        hostile(
            "58 KiB instance header",
            "GET",
            "/",
            one(INSTANCE, near.clone()),
            200,
        ),
        hostile(
            "58 KiB closing header",
            "GET",
            "/",
            one(CLOSING, near.clone()),
            200,
        ),
        hostile("61 KiB header", "GET", "/", one("x-big", past.clone()), 431),
        hostile(
            "58 KiB query on drained",
            "GET",
            &format!("/graceful/drained?pad={near}"),
            vec![],
            503,
        ),
        hostile(
            "58 KiB wait value",
            "GET",
            &format!("/graceful/drained?wait={}s", "9".repeat(NEAR_LIMIT)),
            vec![],
            400,
        ),
        hostile(
            "58 KiB path to the app",
            "GET",
            &format!("/{near}"),
            vec![],
            200,
        ),
        hostile(
            "58 KiB forwarded-for on closing",
            "POST",
            "/graceful/closing",
            one("x-forwarded-for", xff_near),
            403,
        ),
        hostile(
            "58 KiB method-less junk header on ready",
            "GET",
            "/graceful/ready",
            one(OVERRIDE, near.clone()),
            200,
        ),
        hostile(
            "90 closing headers",
            "GET",
            "/",
            repeated(CLOSING, "true", MANY),
            200,
        ),
        hostile(
            "90 instance headers",
            "GET",
            "/graceful/status",
            repeated(INSTANCE, "forged", MANY),
            200,
        ),
        hostile(
            "90 forwarded-for on closing",
            "POST",
            "/graceful/closing",
            repeated("x-forwarded-for", "127.0.0.1", MANY),
            403,
        ),
        hostile(
            "100 closing headers",
            "GET",
            "/",
            repeated(CLOSING, "true", TOO_MANY),
            431,
        ),
        // Envoy folds repeated x-forwarded-for into one header (it is
        // one of its inline headers), so 100 of them stay under the
        // count bound and reach the filter: refused all the same.
        hostile(
            "100 forwarded-for on closing",
            "POST",
            "/graceful/closing",
            repeated("x-forwarded-for", "127.0.0.1", TOO_MANY),
            403,
        ),
    ]
}

/// The same over HTTP/2: through to the app the block stays under the
/// test app's own HTTP/2 bound (16 KiB); answered by graceful_drain it may
/// be larger.
fn provider_hostile_http2() -> Vec<Hostile> {
    let near = "a".repeat(NEAR_LIMIT);
    let mut list = Vec::new();
    let mut h2 = hostile(
        "HTTP/2: 90 closing headers of 100 bytes to the app",
        "GET",
        "/",
        repeated(CLOSING, &"t".repeat(100), MANY),
        200,
    );
    h2.http2 = true;
    list.push(h2);
    let mut h2 = hostile(
        "HTTP/2: 90 closing headers of 600 bytes on status",
        "GET",
        "/graceful/status",
        repeated(CLOSING, &"t".repeat(600), MANY),
        200,
    );
    h2.http2 = true;
    list.push(h2);
    let mut h2 = hostile(
        "HTTP/2: 58 KiB instance header on drained",
        "GET",
        "/graceful/drained",
        one(INSTANCE, near),
        503,
    );
    h2.http2 = true;
    list.push(h2);
    list
}

fn provider_hostile_requests() -> Vec<Hostile> {
    let mut list = provider_hostile_http1();
    list.extend(provider_hostile_http2());
    list
}

/// Sends each request on a fresh connection, the set four times over so
/// that both workers get it; every answer must be the expected one, and
/// both workers must have taken connections.
async fn send_to_both_workers(envoy: &Envoy, addr: SocketAddr, requests: &[Hostile]) {
    let before = worker_connections(envoy).await;
    let mut wrong = Vec::new();
    for _ in 0..4 {
        for h in requests {
            let got = send_hostile(addr, h).await;
            if got != h.expect {
                wrong.push(format!("{}: {got}, expected {}", h.what, h.expect));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "unexpected answers:\n{}",
        wrong.join("\n")
    );
    let after = worker_connections(envoy).await;
    assert!(
        after[0] > before[0] && after[1] > before[1],
        "hostile input reached both workers: {before:?} -> {after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_survives_60_kib_headers_and_100_repeated_names_and_serves_on_both_workers() {
    let p = provider("hostile-headers", LOCALHOST_V4, "{}").await;
    let health = vm_health(&p.envoy).await;
    let requests = provider_hostile_requests();
    send_to_both_workers(&p.envoy, p.inbound, &requests).await;
    // None of it started closing or left a request counted.
    assert_eq!(status(p.inbound).await.phase, "serving");
    eventually(
        "graceful_provider_inflight back to 0",
        Duration::from_secs(10),
        || async {
            (p.envoy.stat("wasmcustom.graceful_provider_inflight").await == Some(0)).then_some(())
        },
    )
    .await;
    assert_serves_on_both_workers(&p.envoy, p.inbound, "/", 200).await;
    assert_serves_on_both_workers(&p.envoy, p.inbound, "/graceful/ready", 200).await;
    assert_eq!(vm_health(&p.envoy).await, health, "a wasm VM was reloaded");
    assert_log_clean(&p.envoy.log());
}

/// Requests to the consumer that claim closing, a new instance for host
/// `a`, or pick `a`, at and under Envoy's bounds.
fn consumer_hostile_requests(a: &str) -> Vec<Hostile> {
    let near = "a".repeat(NEAR_LIMIT);
    let override_list = format!("{a},").repeat(NEAR_LIMIT / (a.len() + 1));
    vec![
        hostile(
            "closing in a request",
            "GET",
            "/",
            one(CLOSING, "true".into()),
            200,
        ),
        hostile(
            "90 closing headers",
            "GET",
            "/",
            repeated(CLOSING, "true", MANY),
            200,
        ),
        hostile(
            "90 dubbo closing headers",
            "GET",
            "/",
            repeated("closing", "true", MANY),
            200,
        ),
        hostile(
            "58 KiB instance header",
            "GET",
            "/",
            one(INSTANCE, near),
            200,
        ),
        hostile(
            "58 KiB override list naming a",
            "GET",
            "/",
            one(OVERRIDE, override_list),
            200,
        ),
        hostile(
            "90 override headers naming a",
            "GET",
            "/",
            repeated(OVERRIDE, a, MANY),
            200,
        ),
        // The sidecar registers the override header inline (bootstrap
        // `inline_headers`): Envoy folds its repeats into one entry, so
        // 100 of them are under its 100-header bound and answered, the
        // folded value dropped as one (the counts below: not steered).
        hostile(
            "100 override headers naming a (folded into one)",
            "GET",
            "/",
            repeated(OVERRIDE, a, TOO_MANY),
            200,
        ),
        hostile(
            "61 KiB header",
            "GET",
            "/",
            one("x-big", "a".repeat(PAST_LIMIT)),
            431,
        ),
    ]
}

/// Answers at the size limit: host a turns closing with a 50 KiB
/// instance id; it is evicted once. (Once membership is known: see
/// `until_membership_refreshed`.)
async fn evict_on_a_huge_closing_answer(m: &ConsumerSidecar) {
    m.until_membership_refreshed().await;
    m.ups[0].set_instance(&"i".repeat(50 * 1024));
    m.ups[0].set_closing(true);
    let mut marked = false;
    for _ in 0..200 {
        let r = client::get(m.outbound, "/").await.unwrap();
        assert_eq!(r.status, 200);
        if r.header(CLOSING).as_deref() == Some("true") {
            marked = true;
            break;
        }
    }
    assert!(marked, "no closing answer from host a: {:?}", m.counts());
    eventually("host a evicted", Duration::from_secs(5), || async {
        (m.stat("graceful_consumer_evictions").await == 1).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn it_keeps_consumer_steering_immune_to_request_headers_and_huge_answers() {
    let cfg = r#"{"admin_cluster":"envoy_admin","tombstone_ttl":"60s","membership_refresh":"200ms","probe_path":""}"#;
    let m = ConsumerSidecar::start("hostile-consumer", cfg, 2).await;
    let health = vm_health(&m.envoy).await;
    let a = m.ups[0].addr.to_string();
    // Requests that claim closing, a new instance, or pick a host: none of
    // it is an answer from a provider, so nothing is evicted or steered.
    let requests = consumer_hostile_requests(&a);
    send_to_both_workers(&m.envoy, m.outbound, &requests).await;
    assert_eq!(m.stat("graceful_consumer_evictions").await, 0);
    let c = m.counts();
    assert!(
        c[1] > 0 && c[2] > 0 && c[0] < c.iter().sum::<u64>(),
        "clients picked host a through the override header: {c:?}"
    );

    // Host a is evicted (once) by a closing answer with a 50 KiB id, its
    // id stored bounded, and a client claiming a new instance in requests
    // cannot bring it back.
    evict_on_a_huge_closing_answer(&m).await;
    let at_mark = m.counts()[0];
    for _ in 0..40 {
        let r = send(
            m.outbound,
            "GET",
            "/",
            &[
                (INSTANCE, "new-instance"),
                (OVERRIDE, a.as_str()),
                (CLOSING, "false"),
            ],
        )
        .await;
        assert_eq!(r.status, 200);
    }
    assert_eq!(m.counts()[0], at_mark, "a tombstoned host got requests");
    assert_eq!(m.stat("graceful_consumer_readmitted").await, 0);
    assert_eq!(m.stat("graceful_consumer_evictions").await, 1);
    assert_serves_on_both_workers(&m.envoy, m.outbound, "/", 200).await;
    assert_eq!(m.counts()[0], at_mark, "a tombstoned host got requests");
    assert_eq!(vm_health(&m.envoy).await, health, "a wasm VM was reloaded");
    assert_log_clean(&m.envoy.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_answers_raw_garbage_on_the_wire_and_keeps_serving() {
    // Bytes no HTTP client would send: Envoy's codec refuses them before
    // any filter; what matters is that the filters' VMs are untouched.
    let p = provider("hostile-wire", LOCALHOST_V4, "{}").await;
    let health = vm_health(&p.envoy).await;
    let junk: Vec<Vec<u8>> = vec![
        b"\x00\xff\xfe garbage\r\n\r\n".to_vec(),
        b"GET /graceful/closing HTTP/1.1\r\nhost: t\r\nx-graceful-closing: \xff\xfe\r\n\r\n".to_vec(),
        b"POST /graceful/closing HTTP/1.1\r\nhost: t\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n".to_vec(),
        b"GET /graceful/ready HTTP/1.1\r\nhost: t\r\nx-graceful-instance\r\n\r\n".to_vec(),
        format!("GET /{} HTTP/1.1\r\nhost: t\r\n\r\n", "x".repeat(PAST_LIMIT)).into_bytes(),
    ];
    for _ in 0..4 {
        for bytes in &junk {
            let mut s = TcpStream::connect(p.inbound).await.unwrap();
            let _ = s.write_all(bytes).await;
            let mut answer = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut answer)).await;
            let head = String::from_utf8_lossy(&answer[..answer.len().min(12)]).into_owned();
            assert!(
                answer.is_empty() || head.starts_with("HTTP/1.1 4"),
                "{:?} answered {head:?}",
                String::from_utf8_lossy(&bytes[..bytes.len().min(40)])
            );
        }
    }
    assert_eq!(status(p.inbound).await.phase, "serving");
    assert_serves_on_both_workers(&p.envoy, p.inbound, "/", 200).await;
    assert_eq!(vm_health(&p.envoy).await, health, "a wasm VM was reloaded");
    assert_log_clean(&p.envoy.log());
}
