//! Hostile and malformed input against the real `.wasm` filters in a real
//! Envoy (`--concurrency 2`): clients sending the filters' own headers,
//! forged `x-forwarded-for` over IPv6, more long-polls than `max_waiters`,
//! header blocks at Envoy's size and count limits. After each, Envoy must
//! still serve on both workers, no wasm VM may have crashed or reloaded,
//! and the log must hold no panic.
//!
//! Envoy's defaults bound what reaches a filter: `max_request_headers_kb`
//! 60 (the whole header block) and `max_headers_count` 100. Requests just
//! under them reach the filters; requests at them get 431 from Envoy's
//! codec. Both kinds are sent.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use graceful_harness::support::client::{self, Conn, Response};
use graceful_harness::support::envoy::{eventually, Envoy};
use graceful_harness::support::mesh::{
    status, status_of, ConsumerSidecar, ProviderSidecar, CLOSING,
};
use graceful_harness::support::native::Delivery;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const INSTANCE: &str = "x-graceful-instance";
const OVERRIDE: &str = "x-graceful-override-host";
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

/// Fails on any line showing a panic, a wasm trap or a critical error.
fn assert_log_clean(envoy: &Envoy) {
    let log = envoy.log();
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
    assert_log_clean(&p.envoy);
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
        assert_eq!(r.status, 403, "x-forwarded-for {xff:?}: {}", r.text());
    }
    assert_eq!(status(p.inbound).await.phase, "serving");
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
        assert_eq!(r.status, 403, "x-forwarded-for {xff:?}: {}", r.text());
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
    assert_log_clean(&p.envoy);
}

/// A `drained?wait=` long-poll on a raw connection, held until dropped.
async fn hold_long_poll(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /graceful/drained?wait=60s HTTP/1.1\r\nhost: test\r\n\r\n")
        .await
        .unwrap();
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_answers_429_past_max_waiters_and_frees_slots_when_clients_leave() {
    const MAX: usize = 3;
    let cfg = format!(r#"{{"max_waiters":{MAX}}}"#);
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
    // 20 more at once, on fresh connections (so on both workers): each is
    // refused at once, none is held.
    let started = Instant::now();
    let extra: Vec<_> = (0..20)
        .map(|_| {
            let addr = p.inbound;
            tokio::spawn(async move { client::get(addr, "/graceful/drained?wait=60s").await })
        })
        .collect();
    for t in extra {
        let r = t.await.unwrap().unwrap();
        assert_eq!(r.status, 429, "{}", r.text());
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "429s must come at once, took {:?}",
        started.elapsed()
    );
    assert_eq!(active().await, Some(MAX as u64), "the held ones stay held");
    // Envoy stays healthy meanwhile: other endpoints and the app answer.
    assert_eq!(status(p.inbound).await.phase, "serving");
    assert_serves_on_both_workers(&p.envoy, p.inbound, "/graceful/ready", 200).await;
    // Clients that leave free their slots: a new long-poll is held again
    // (it runs out and answers 503, not 429).
    drop(held);
    eventually(
        "abandoned long-polls released",
        Duration::from_secs(10),
        || async { (active().await == Some(0)).then_some(()) },
    )
    .await;
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
    assert_log_clean(&p.envoy);
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

fn provider_hostile_requests() -> Vec<Hostile> {
    let near = "a".repeat(NEAR_LIMIT);
    let past = "a".repeat(PAST_LIMIT);
    let xff_near = "10.0.0.1, ".repeat(NEAR_LIMIT / 10) + "127.0.0.1";
    let mut list = vec![
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
    ];
    // Through to the app the block stays under the test app's own HTTP/2
    // bound (16 KiB); answered by graceful_drain it may be larger.
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
    assert_log_clean(&p.envoy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn it_keeps_consumer_steering_immune_to_request_headers_and_huge_answers() {
    let cfg = r#"{"admin_cluster":"envoy_admin","tombstone_ttl":"60s","membership_refresh":"200ms","probe_path":""}"#;
    let m = ConsumerSidecar::start("hostile-consumer", cfg, 2).await;
    let health = vm_health(&m.envoy).await;
    let a = m.ups[0].addr.to_string();
    let near = "a".repeat(NEAR_LIMIT);
    let override_list = format!("{a},").repeat(NEAR_LIMIT / (a.len() + 1));
    // Requests that claim closing, a new instance, or pick a host: none of
    // it is an answer from a provider, so nothing is evicted or steered.
    let requests = vec![
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
            one(INSTANCE, near.clone()),
            200,
        ),
        hostile(
            "58 KiB override list naming a",
            "GET",
            "/",
            one(OVERRIDE, override_list.clone()),
            200,
        ),
        hostile(
            "90 override headers naming a",
            "GET",
            "/",
            repeated(OVERRIDE, &a, MANY),
            200,
        ),
        hostile(
            "100 override headers",
            "GET",
            "/",
            repeated(OVERRIDE, &a, TOO_MANY),
            431,
        ),
        hostile(
            "61 KiB header",
            "GET",
            "/",
            one("x-big", "a".repeat(PAST_LIMIT)),
            431,
        ),
    ];
    send_to_both_workers(&m.envoy, m.outbound, &requests).await;
    assert_eq!(m.stat("graceful_consumer_evictions").await, 0);
    let c = m.counts();
    assert!(
        c[1] > 0 && c[2] > 0 && c[0] < c.iter().sum::<u64>(),
        "clients picked host a through the override header: {c:?}"
    );

    // Answers at the size limit: host a turns closing with a 50 KiB
    // instance id. It is evicted (once), its id stored bounded, and a
    // client claiming a new instance in requests cannot bring it back.
    // (Once membership is known: see `until_membership_refreshed`.)
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
    assert_log_clean(&m.envoy);
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
    assert_log_clean(&p.envoy);
}
