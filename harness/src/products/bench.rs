//! `make bench`: what the filters cost, measured side by side with plain
//! Envoy in one run so that machine noise cancels.
//!
//! The Envoy under test (`envoy/bench-proxy.yaml`, `--concurrency 1`) runs
//! one filter set at a time in front of an upstream that costs almost
//! nothing (`envoy/bench-upstream.yaml`: Envoy's own `direct_response` on four
//! listeners). `wrk` (HTTP/1.1 keep-alive, 16 connections, one thread)
//! drives it to saturation for throughput; then wrk over one connection
//! measures latency without queueing. Every set is measured in each round,
//! rounds interleaved, and each set's numbers are the median over rounds;
//! ratios are against the no-filter set of the same run.

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};

use crate::support::client;
use crate::support::envoy::{eventually, wasm_dir, Envoy, EnvoySpec};
use crate::support::procfs::cpu_us;

/// What a bench binary's flag parser made of its arguments; on a usage
/// error, the message on stderr and exit status 2.
pub fn parse_or_exit<T>(parsed: Result<T, String>) -> T {
    parsed.unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    })
}

/// A filter chain to measure.
#[derive(Debug, Clone)]
pub struct FilterSet {
    pub name: &'static str,
    pub filters: Vec<Value>,
    /// Start closing before measuring (every response marked).
    pub closing: bool,
    /// Tombstones to create before measuring (every request steered).
    pub tombstones: usize,
}

fn wasm(name: &str, config: &str) -> Value {
    wasm_module(
        &wasm_dir().join(format!("{name}.wasm")),
        name,
        "graceful",
        config,
    )
}

/// `BENCH_BEFORE`: a directory with the three `.wasm` of an earlier build,
/// measured beside this one in the same run (`*_before` sets), so a change's
/// effect is read with the same noise on both sides.
pub fn before_dir() -> Option<std::path::PathBuf> {
    std::env::var_os("BENCH_BEFORE")
        .filter(|d| !d.is_empty())
        .map(std::path::PathBuf::from)
}

fn wasm_before(dir: &std::path::Path, name: &str, config: &str) -> Value {
    wasm_module(&dir.join(format!("{name}.wasm")), name, "graceful", config)
}

fn wasm_module(code: &std::path::Path, name: &str, vm_id: &str, config: &str) -> Value {
    json!({
        "name": name,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "name": name,
                "root_id": name,
                "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": config},
                "vm_config": {"vm_id": vm_id, "runtime": "envoy.wasm.runtime.v8", "code": {"local": {"filename": code.display().to_string()}}}
            }
        }
    })
}

/// The floor: `bench/wasm-header`, a Rust proxy-wasm filter that only adds a
/// response header (built by `make bench`). Each copy gets its own VM, as
/// each of our three filters has.
fn wasm_header(copy: usize) -> Value {
    let code = crate::support::envoy::repo_root().join("target/bench/bench_wasm_header.wasm");
    let name = format!("wasm_header_{copy}");
    wasm_module(&code, &name, &name, "")
}

/// `make bench-prices`: the floor built to make one kind of call ten times
/// more per response (`code`, one of target/bench/prices/), alone before
/// the router as `wasm_header` is.
pub fn price_set(code: &std::path::Path) -> FilterSet {
    FilterSet {
        name: "wasm_header",
        filters: vec![
            wasm_module(code, "wasm_header_1", "wasm_header_1", ""),
            router(),
        ],
        closing: false,
        tombstones: 0,
    }
}

/// A graceful filter as the native module (`dist/libgraceful.so`), with the
/// same JSON config as its wasm set.
fn native(name: &str, config: &str) -> Value {
    native_module(&wasm_dir().join("libgraceful.so"), name, config)
}

/// The native floor: the module built with a filter that does nothing in
/// any hook (`make bench-floors`), what Envoy charges any filter of this
/// module per stream.
fn native_floor() -> Value {
    let module = crate::support::envoy::repo_root().join("target/bench/libgraceful_floor.so");
    native_module(&module, "graceful_bench_floor", "")
}

fn native_module(module: &std::path::Path, name: &str, config: &str) -> Value {
    json!({
        "name": name,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter",
            "dynamic_module_config": {
                "module": {"local": {"filename": module.display().to_string()}},
                "do_not_close": true,
                "metrics_namespace": crate::support::native::METRICS_NAMESPACE
            },
            "filter_name": name,
            "filter_config": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": config}
        }
    })
}

fn router() -> Value {
    json!({"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}})
}

/// What a user might write instead: a Lua filter that only adds a header.
fn lua_header() -> Value {
    json!({
        "name": "envoy.filters.http.lua",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
            "default_source_code": {"inline_string": "function envoy_on_response(h) h:headers():add('x-lua', 'true') end"}
        }
    })
}

/// The gate must not pass while a set is measured (the provider would start
/// rejecting): closing waits an hour.
const DRAIN_CONFIG: &str =
    r#"{"consumer_update_wait":"1h","timeout":"2h","admin_cluster":"envoy_admin"}"#;
const CONSUMER_CONFIG: &str =
    r#"{"admin_cluster":"envoy_admin","failure_tombstone_ttl":"1h","tombstone_ttl":"1h"}"#;
/// The contract's default membership source: no admin cluster, so every
/// answer is a membership observation.
const CONSUMER_NO_ADMIN_CONFIG: &str = r#"{"failure_tombstone_ttl":"1h","tombstone_ttl":"1h"}"#;

/// The routes of every set: those of the shipped provider sidecar, where
/// graceful_drain is enabled on its own endpoints only (a set that lists it
/// with `"disabled": true`, as the sidecar does, runs it there alone).
pub fn routes() -> Value {
    let drain_enabled = json!({"graceful_drain": {"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "config": {}}});
    json!([
        {"match": {"prefix": "/graceful/"}, "route": {"cluster": "upstream"}, "typed_per_filter_config": drain_enabled},
        {"match": {"path": "/grpc.health.v1.Health/Check"}, "route": {"cluster": "upstream"}, "typed_per_filter_config": drain_enabled},
        {"match": {"path": "/grpc.health.v1.Health/Watch"}, "route": {"cluster": "upstream", "timeout": "0s"}, "typed_per_filter_config": drain_enabled},
        {"match": {"prefix": "/"}, "route": {"cluster": "upstream"}}
    ])
}

/// A set of `filters` with nothing set up before measuring.
fn set(name: &'static str, filters: Vec<Value>) -> FilterSet {
    FilterSet {
        name,
        filters,
        closing: false,
        tombstones: 0,
    }
}

/// The sets `make bench` measures, in order: the wasm filters, the native
/// module's, then (with `BENCH_BEFORE`) an earlier build's.
pub fn filter_sets() -> Vec<FilterSet> {
    let mut sets = wasm_sets();
    sets.extend(native_sets());
    if let Some(dir) = before_dir() {
        sets.extend(before_sets(&dir));
    }
    sets
}

/// The wasm filters' sets, beside plain Envoy and the header-only floors.
fn wasm_sets() -> Vec<FilterSet> {
    // As the shipped provider sidecar runs it: app requests never enter it.
    let drain = || {
        let mut f = wasm("graceful_drain", DRAIN_CONFIG);
        f["disabled"] = json!(true);
        f
    };
    let drain_every_route = || wasm("graceful_drain", DRAIN_CONFIG);
    let provider = || wasm("graceful_provider", "{}");
    let consumer = || wasm("graceful_consumer", CONSUMER_CONFIG);
    vec![
        set("none", vec![router()]),
        set("provider_drain", vec![drain(), provider(), router()]),
        set(
            "provider_drain_every_route",
            vec![drain_every_route(), provider(), router()],
        ),
        set("consumer", vec![consumer(), router()]),
        set(
            "consumer_no_admin",
            vec![
                wasm("graceful_consumer", CONSUMER_NO_ADMIN_CONFIG),
                router(),
            ],
        ),
        set("all", vec![drain(), provider(), consumer(), router()]),
        set("lua_header", vec![lua_header(), router()]),
        set("wasm_header", vec![wasm_header(1), router()]),
        set(
            "wasm_header_x3",
            vec![wasm_header(1), wasm_header(2), wasm_header(3), router()],
        ),
        FilterSet {
            closing: true,
            ..set(
                "all_closing",
                vec![drain(), provider(), consumer(), router()],
            )
        },
        FilterSet {
            tombstones: 100,
            ..set(
                "all_100_tombstones",
                vec![drain(), provider(), consumer(), router()],
            )
        },
        FilterSet {
            tombstones: 100,
            ..set("consumer_100_tombstones", vec![consumer(), router()])
        },
    ]
}

/// The native module: the same filters and configs, one set per wasm
/// set that a platform team compares.
fn native_sets() -> Vec<FilterSet> {
    let native_drain = || {
        let mut f = native("graceful_drain", DRAIN_CONFIG);
        f["disabled"] = json!(true);
        f
    };
    let native_provider = || native("graceful_provider", "{}");
    let native_consumer = || native("graceful_consumer", CONSUMER_CONFIG);
    let native_all = || {
        vec![
            native_drain(),
            native_provider(),
            native_consumer(),
            router(),
        ]
    };
    vec![
        set("native_floor", vec![native_floor(), router()]),
        set(
            "provider_drain_native",
            vec![native_drain(), native_provider(), router()],
        ),
        set("consumer_native", vec![native_consumer(), router()]),
        set(
            "consumer_no_admin_native",
            vec![
                native("graceful_consumer", CONSUMER_NO_ADMIN_CONFIG),
                router(),
            ],
        ),
        set("all_native", native_all()),
        FilterSet {
            closing: true,
            ..set("all_closing_native", native_all())
        },
        FilterSet {
            tombstones: 100,
            ..set(
                "consumer_100_tombstones_native",
                vec![native_consumer(), router()],
            )
        },
    ]
}

/// `BENCH_BEFORE`'s build, measured beside this one.
fn before_sets(dir: &std::path::Path) -> Vec<FilterSet> {
    let drain = || {
        let mut f = wasm_before(dir, "graceful_drain", DRAIN_CONFIG);
        f["disabled"] = json!(true);
        f
    };
    let provider = || wasm_before(dir, "graceful_provider", "{}");
    let consumer = || wasm_before(dir, "graceful_consumer", CONSUMER_CONFIG);
    vec![
        set("provider_drain_before", vec![drain(), provider(), router()]),
        set("consumer_before", vec![consumer(), router()]),
        set(
            "all_before",
            vec![drain(), provider(), consumer(), router()],
        ),
        FilterSet {
            tombstones: 100,
            ..set("consumer_100_tombstones_before", vec![consumer(), router()])
        },
    ]
}

/// One wrk run's numbers.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct WrkResult {
    pub rps: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub requests: u64,
    pub non_2xx: u64,
    /// CPU time the Envoy under test spent per request during the run, µs
    /// (user + system, from /proc): what a request costs, whatever else
    /// the machine was doing.
    pub cpu_us_per_request: f64,
}

fn micros(text: &str) -> Option<f64> {
    let (num, unit) = text.split_at(text.find(|c: char| c.is_ascii_alphabetic())?);
    let v: f64 = num.parse().ok()?;
    Some(match unit {
        "us" => v,
        "ms" => v * 1000.0,
        "s" => v * 1_000_000.0,
        _ => return None,
    })
}

/// Reads wrk's `--latency` report.
pub fn parse_wrk(out: &str) -> Option<WrkResult> {
    let mut r = WrkResult::default();
    for line in out.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["50%", v] => r.p50_us = micros(v)?,
            ["99%", v] => r.p99_us = micros(v)?,
            ["Requests/sec:", v] => r.rps = v.parse().ok()?,
            [n, "requests", "in", ..] => r.requests = n.parse().ok()?,
            ["Non-2xx", "or", "3xx", "responses:", n] => r.non_2xx = n.parse().ok()?,
            _ => {}
        }
    }
    (r.rps > 0.0).then_some(r)
}

/// Runs wrk against `addr` for `duration`.
pub fn wrk(addr: SocketAddr, connections: u32, duration: Duration) -> Result<WrkResult, String> {
    let out = Command::new("wrk")
        .args([
            "-t1",
            &format!("-c{connections}"),
            &format!("-d{}s", duration.as_secs()),
            "--latency",
        ])
        .arg(format!("http://{addr}/"))
        .output()
        .map_err(|e| format!("wrk: {e} (make bench installs it: apt-get install wrk)"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse_wrk(&text).ok_or_else(|| {
        format!(
            "unreadable wrk output:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// wrk against the Envoy `pid` listening on `addr`, with the CPU time that
/// Envoy spent per request.
pub fn wrk_with_cpu(
    pid: u32,
    addr: SocketAddr,
    connections: u32,
    duration: Duration,
) -> Result<WrkResult, String> {
    let before = cpu_us(pid);
    let mut r = wrk(addr, connections, duration)?;
    let used = cpu_us(pid).saturating_sub(before);
    r.cpu_us_per_request = used as f64 / r.requests.max(1) as f64;
    Ok(r)
}

/// The upstream Envoy and its four listener addresses.
pub async fn start_upstream() -> (Envoy, Vec<SocketAddr>) {
    // Every address, so that other loopback addresses reach it too
    // ([`live_aliases`]); each listener at the port Envoy binds for it.
    let mut spec =
        EnvoySpec::new("bench-upstream", "bench-upstream.yaml").set("LISTEN_ADDRESS", "0.0.0.0");
    for i in 1..=4 {
        spec = spec.set(&format!("PORT_{i}"), 0);
    }
    spec.concurrency = 1;
    let envoy = spec.start().await;
    let mut addrs = Vec::new();
    for i in 1..=4 {
        addrs.push(envoy.listener(&format!("upstream_{i}")).await);
    }
    (envoy, addrs)
}

fn endpoints(addrs: &[SocketAddr]) -> String {
    let list: Vec<Value> = addrs
        .iter()
        .map(|a| json!({"endpoint": {"address": {"socket_address": {"address": a.ip().to_string(), "port_value": a.port()}}}}))
        .collect();
    Value::Array(list).to_string()
}

/// Live members every set's cluster has beside the upstream's 4 addresses.
pub const LIVE_ALIASES: usize = 100;

/// `n` more addresses of the upstream's listeners: other loopback
/// addresses at their ports (the upstream listens on every address).
pub fn live_aliases(upstream: &[SocketAddr], n: usize) -> Vec<SocketAddr> {
    (0..n)
        .filter_map(|i| {
            let port = upstream.get(i % upstream.len().max(1))?.port();
            Some(SocketAddr::from((
                [127, 1, (i / 250) as u8, (i % 250 + 1) as u8],
                port,
            )))
        })
        .collect()
}

/// Addresses nothing listens on: connections to them are refused at once
/// (`port`: [`crate::support::envoy::refusing_port`]).
pub fn dead_hosts(n: usize, port: u16) -> Vec<SocketAddr> {
    (0..n)
        .map(|i| SocketAddr::from(([127, 0, 2 + (i / 250) as u8, (i % 250 + 1) as u8], port)))
        .collect()
}

/// A proxy Envoy running `set` in front of `upstream` (plus `extra` hosts
/// in its cluster), ready and prepared (closing started, tombstones made).
pub async fn start_proxy(
    set: &FilterSet,
    upstream: &[SocketAddr],
    extra: &[SocketAddr],
) -> (Envoy, SocketAddr) {
    let envoy = proxy_spec(set, upstream, extra).start().await;
    prepare_proxy(envoy, set).await
}

/// The proxy's spec, before [`start_proxy`] starts it (the mesh bench adds
/// to it); its listener `proxy` binds a port of its own.
pub fn proxy_spec(set: &FilterSet, upstream: &[SocketAddr], extra: &[SocketAddr]) -> EnvoySpec {
    // 104 live members in every set: with 100 tombstoned beside them, below
    // half the members, the panic floor lists none of them again and every
    // request is steered to a live host (with 4 live hosts and 100 dead,
    // the floor named dead ones and nearly every request failed); and the
    // sets without tombstones balance over the same hosts, so the
    // difference is the steering.
    let live = live_aliases(upstream, LIVE_ALIASES);
    let hosts: Vec<SocketAddr> = upstream.iter().chain(&live).chain(extra).copied().collect();
    let mut spec = EnvoySpec::new(&format!("bench-{}", set.name), "bench-proxy.yaml")
        .set("LISTEN_PORT", 0)
        .set("HTTP_FILTERS", Value::Array(set.filters.clone()))
        .set("ROUTES", routes())
        .set("ENDPOINTS", endpoints(&hosts));
    spec.concurrency = 1;
    spec
}

/// Starts closing and makes tombstones as `set` says, then waits until the
/// proxy answers; the proxy and its listener's address.
pub async fn prepare_proxy(envoy: Envoy, set: &FilterSet) -> (Envoy, SocketAddr) {
    prepare_proxy_within(envoy, set, Duration::from_secs(60)).await
}

/// [`prepare_proxy`], with `deadline` for the tombstones and for the first
/// answer each (under callgrind a mesh's main thread, run in turn with the
/// worker, makes both slower).
pub async fn prepare_proxy_within(
    envoy: Envoy,
    set: &FilterSet,
    deadline: Duration,
) -> (Envoy, SocketAddr) {
    let addr = envoy.listener("proxy").await;
    if set.closing {
        let r = client::post(addr, "/graceful/closing")
            .await
            .unwrap_or_else(|e| panic!("closing: {e}"));
        assert_eq!(r.status, 202, "{}", r.text());
    }
    if set.tombstones > 0 {
        // Round robin walks the dead hosts; each refused connection
        // tombstones one (no retries in the bench route).
        let want = set.tombstones as u64;
        let mut conn = client::Conn::http1(addr)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let until = Instant::now() + deadline;
        while envoy
            .stat("wasmcustom.graceful_consumer_tombstones")
            .await
            .unwrap_or(0)
            < want
        {
            for _ in 0..50 {
                let _ = conn.get("/").await;
            }
            assert!(Instant::now() < until, "could not make {want} tombstones");
        }
    }
    // Every VM copy compiled and warm before measuring (any answer will do:
    // the churn proxy's hosts all refuse).
    eventually("proxy answers", deadline, || async {
        client::get(addr, "/").await.ok().map(|_| ())
    })
    .await;
    (envoy, addr)
}

/// Latency without queueing: wrk over one connection, one request at a
/// time. At 16 connections Envoy is saturated and a request's latency is
/// mostly its wait behind the others; here it is what the request itself
/// costs, so the difference between sets is what the filters add to it.
pub fn unqueued(pid: u32, addr: SocketAddr, duration: Duration) -> Result<WrkResult, String> {
    wrk_with_cpu(pid, addr, 1, duration)
}

/// One set's numbers over the rounds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SetResult {
    pub rps: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Resident size of the proxy Envoy after the run, KiB.
    pub rss_kb: u64,
    pub non_2xx: u64,
    pub rounds: Vec<WrkResult>,
    /// Envoy CPU per request at saturation, µs (median over rounds), and
    /// that minus the no-filter set's.
    pub cpu_us_per_request: f64,
    pub cpu_us_added: f64,
    /// rps / the no-filter set's rps.
    pub throughput_ratio: f64,
    /// p99 minus the no-filter set's p99, µs (at saturation).
    pub p99_added_us: f64,
    /// One connection, no queueing ([`unqueued`]): medians over the rounds.
    pub unqueued_p50_us: f64,
    pub unqueued_p99_us: f64,
    pub unqueued_rounds: Vec<WrkResult>,
    /// Unqueued p50 and p99 minus the no-filter set's, µs.
    pub unqueued_p50_added_us: f64,
    pub unqueued_p99_added_us: f64,
}

impl SetResult {
    pub fn from_rounds(rounds: Vec<WrkResult>, unqueued: Vec<WrkResult>, rss_kb: u64) -> SetResult {
        SetResult {
            unqueued_p50_us: median(unqueued.iter().map(|r| r.p50_us)),
            unqueued_p99_us: median(unqueued.iter().map(|r| r.p99_us)),
            unqueued_rounds: unqueued,
            unqueued_p50_added_us: 0.0,
            unqueued_p99_added_us: 0.0,
            rps: median(rounds.iter().map(|r| r.rps)),
            cpu_us_per_request: median(rounds.iter().map(|r| r.cpu_us_per_request)),
            cpu_us_added: 0.0,
            p50_us: median(rounds.iter().map(|r| r.p50_us)),
            p99_us: median(rounds.iter().map(|r| r.p99_us)),
            non_2xx: rounds.iter().map(|r| r.non_2xx).sum(),
            rss_kb,
            rounds,
            throughput_ratio: 0.0,
            p99_added_us: 0.0,
        }
    }
}

/// The order `n` sets are measured in, in round `round`: as listed, then
/// reversed every other round, so no set always runs first (just after a
/// start) or last (after the others warmed the host).
pub fn round_order(round: usize, n: usize) -> Vec<usize> {
    if round.is_multiple_of(2) {
        (0..n).collect()
    } else {
        (0..n).rev().collect()
    }
}

/// The median (the mean of the middle two for an even count): one round
/// disturbed by something else on the machine does not move it.
pub fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// One set against another, round by round: the CPU per request `set`
/// added over `against` in each round (both measured moments apart), and
/// the median of those differences. A difference of medians compares
/// rounds that ran minutes apart; on a shared host the paired one is what
/// can resolve a few µs.
#[derive(Debug, Clone, Serialize)]
pub struct Paired {
    pub set: String,
    pub against: String,
    pub cpu_us_added_per_round: Vec<f64>,
    pub cpu_us_added_median: f64,
}

impl Paired {
    /// `None` when the two sets do not have the same number of rounds (or
    /// none): nothing to pair.
    pub fn new(set: &str, a: &[WrkResult], against: &str, b: &[WrkResult]) -> Option<Paired> {
        if a.is_empty() || a.len() != b.len() {
            return None;
        }
        let diffs: Vec<f64> = a
            .iter()
            .zip(b)
            .map(|(x, y)| x.cpu_us_per_request - y.cpu_us_per_request)
            .collect();
        Some(Paired {
            set: set.to_string(),
            against: against.to_string(),
            cpu_us_added_median: median(diffs.iter().copied()),
            cpu_us_added_per_round: diffs,
        })
    }
}

/// A horizontal bar chart per set: throughput ratio (wrk, saturated) and
/// Envoy CPU time added per request.
pub fn chart(sets: &[(&str, &SetResult)]) -> String {
    let (w, row, left) = (900.0, 26.0, 170.0);
    let h = 60.0 + row * sets.len() as f64;
    let half = (w - left - 40.0) / 2.0;
    let max_added = sets
        .iter()
        .map(|(_, r)| r.cpu_us_added.abs())
        .fold(10.0f64, f64::max);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{left}\" y=\"20\" font-weight=\"bold\">throughput vs no filters</text>\n<text x=\"{}\" y=\"20\" font-weight=\"bold\">Envoy CPU added per request (µs)</text>\n",
        left + half + 20.0
    );
    for (i, (name, r)) in sets.iter().enumerate() {
        let y = 40.0 + row * i as f64;
        let tw = half * r.throughput_ratio.clamp(0.0, 1.2) / 1.2;
        let pw = (half - 20.0) * r.cpu_us_added.max(0.0) / max_added;
        svg.push_str(&format!(
            "<text x=\"5\" y=\"{:.1}\">{name}</text>\n<rect x=\"{left}\" y=\"{y:.1}\" width=\"{tw:.1}\" height=\"16\" fill=\"#1f77b4\"/>\n<text x=\"{:.1}\" y=\"{:.1}\">{:.0}%</text>\n<rect x=\"{:.1}\" y=\"{y:.1}\" width=\"{pw:.1}\" height=\"16\" fill=\"#ff7f0e\"/>\n<text x=\"{:.1}\" y=\"{:.1}\">{:+.0}</text>\n",
            y + 12.0,
            left + tw + 4.0,
            y + 12.0,
            r.throughput_ratio * 100.0,
            left + half + 20.0,
            left + half + 24.0 + pw,
            y + 12.0,
            r.cpu_us_added
        ));
    }
    let x90 = left + half * 0.9 / 1.2;
    svg.push_str(&format!(
        "<line x1=\"{x90:.1}\" y1=\"30\" x2=\"{x90:.1}\" y2=\"{h}\" stroke=\"#d62728\" stroke-dasharray=\"4 3\"/>\n<text x=\"{:.1}\" y=\"{}\" fill=\"#d62728\" font-size=\"10\">90% target</text>\n</svg>\n",
        x90 + 2.0,
        h - 4.0
    ));
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    const WRK: &str = "Running 10s test @ http://127.0.0.1:1/
  1 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   402.27us  100.00us   3.00ms   90.00%
    Req/Sec    39.71k     1.23k   41.00k    80.00%
  Latency Distribution
     50%  380.00us
     75%  420.00us
     90%  500.00us
     99%    1.20ms
  397123 requests in 10.00s, 30.30MB read
  Non-2xx or 3xx responses: 7
Requests/sec:  39712.30
Transfer/sec:      3.03MB
";

    #[test]
    fn every_other_round_runs_the_sets_in_reverse() {
        assert_eq!(round_order(0, 3), [0, 1, 2]);
        assert_eq!(round_order(1, 3), [2, 1, 0]);
        assert_eq!(round_order(2, 3), [0, 1, 2]);
        assert!(round_order(5, 0).is_empty());
    }

    #[test]
    fn reads_wrk_reports() {
        let r = parse_wrk(WRK).unwrap();
        assert_eq!(
            (r.p50_us, r.p99_us, r.requests, r.non_2xx),
            (380.0, 1200.0, 397_123, 7)
        );
        assert!((r.rps - 39712.3).abs() < 0.01);
        assert!(parse_wrk("garbage").is_none());
    }

    #[test]
    fn pairs_rounds_and_takes_the_median_of_their_differences() {
        let run = |cpu: f64| WrkResult {
            cpu_us_per_request: cpu,
            ..WrkResult::default()
        };
        let a = [run(110.0), run(300.0), run(104.0)];
        let b = [run(100.0), run(290.0), run(101.0)];
        let p = Paired::new("a", &a, "b", &b).unwrap_or_else(|| panic!("paired"));
        assert_eq!(p.cpu_us_added_per_round, vec![10.0, 10.0, 3.0]);
        assert_eq!(p.cpu_us_added_median, 10.0);
        assert!(Paired::new("a", &a, "b", &b[..2]).is_none());
        assert!(Paired::new("a", &[], "b", &[]).is_none());
    }

    #[test]
    fn median_ignores_one_disturbed_round() {
        assert_eq!(median([6000.0, 1500.0, 6200.0].into_iter()), 6000.0);
        assert_eq!(median([1.0, 3.0].into_iter()), 2.0);
        assert_eq!(median(std::iter::empty()), 0.0);
    }

    #[test]
    fn filter_sets_end_in_the_router() {
        for set in filter_sets() {
            let last = set.filters.last().unwrap();
            assert_eq!(last["name"], "envoy.filters.http.router", "{}", set.name);
        }
    }
}
