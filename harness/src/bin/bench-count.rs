//! `make bench-count`: Envoy's instructions per request for each set of
//! `make bench`, counted under callgrind (see
//! `graceful_harness::products::bench_count`). Writes
//! `bench/results/count.json` and prints the table docs/benchmarks/count.md quotes.
//!
//! Flags: `--sets a,b` (default: the floors none, wasm_header, lua_header
//! and native_floor, then provider_drain, consumer, all_closing and
//! consumer_100_tombstones and their native sets: what issue 40 reads), `--window S` per counted window (10), `--mesh`:
//! each set in `make bench-mesh`'s mesh of 1,000 clusters of 10 endpoints
//! (default sets: none, consumer, consumer_100_tombstones), written to
//! `bench/results/count-mesh.json`. `--prices`: what Envoy charges per call
//! of each kind, from the floor's priced builds in target/bench/prices/
//! (`make bench-prices`), written to `bench/results/prices.json`.

use std::process::ExitCode;
use std::time::Duration;

use graceful_harness::products::bench::{filter_sets, price_set, start_upstream};
use graceful_harness::products::bench_count::{count_mesh_set, count_set, Counted};
use graceful_harness::products::bench_mesh::write_cds;
use graceful_harness::support::envoy::repo_root;

const DEFAULT_SETS: &str = "none,wasm_header,lua_header,native_floor,\
provider_drain,consumer,all_closing,consumer_100_tombstones,\
provider_drain_native,consumer_native,all_closing_native,consumer_100_tombstones_native";
const DEFAULT_MESH_SETS: &str = "none,consumer,consumer_100_tombstones";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let mut wanted: Option<String> = None;
    let mut window = Duration::from_secs(10);
    let mut mesh = false;
    let mut prices = false;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--mesh" {
            mesh = true;
            continue;
        }
        if flag == "--prices" {
            prices = true;
            continue;
        }
        match (flag.as_str(), args.next()) {
            ("--sets", Some(v)) => wanted = Some(v),
            ("--window", Some(v)) if v.parse::<u64>().is_ok_and(|s| s > 0) => {
                window = Duration::from_secs(v.parse().unwrap_or(10));
            }
            _ => {
                eprintln!("usage: bench-count [--sets a,b] [--window S] [--mesh] [--prices]");
                return ExitCode::from(2);
            }
        }
    }
    if prices {
        return count_prices(window).await;
    }
    let wanted = wanted.unwrap_or_else(|| {
        if mesh {
            DEFAULT_MESH_SETS
        } else {
            DEFAULT_SETS
        }
        .to_string()
    });
    let all = filter_sets();
    let mut sets = Vec::new();
    for name in wanted.split(',').filter(|n| !n.is_empty()) {
        match all.iter().find(|s| s.name == name) {
            Some(s) => sets.push(s.clone()),
            None => {
                eprintln!("bench-count: no set {name}");
                return ExitCode::from(2);
            }
        }
    }
    let dir = repo_root().join("target/bench/count");
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("bench-count: {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    let (_upstream, upstream) = start_upstream().await;
    let cds = mesh.then(|| write_cds(&dir, &upstream));
    let mut counted: Vec<Counted> = Vec::new();
    for set in &sets {
        let result = match &cds {
            Some(cds) => count_mesh_set(set, cds, &upstream, &dir, window).await,
            None => count_set(set, &upstream, &dir, window).await,
        };
        match result {
            Ok(c) => {
                println!(
                    "{:<32} {:>6} requests  worker {:>8} instructions/request ({:>9}/s idle)  main {:>11}/s idle {:>11}/s loaded",
                    c.set, c.requests, c.worker_per_request, c.worker_idle_per_s, c.main_idle_per_s, c.main_loaded_per_s
                );
                counted.push(c);
            }
            Err(e) => {
                eprintln!("bench-count: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let base = counted
        .iter()
        .find(|c| c.set == "none")
        .map(|c| c.worker_per_request);
    println!("\n| set | worker instructions per request | over `none` |\n|---|---:|---:|");
    for c in &counted {
        let over = base.map_or(String::new(), |b| {
            format!("{:+}", c.worker_per_request as i64 - b as i64)
        });
        println!("| `{}` | {} | {over} |", c.set, c.worker_per_request);
    }
    let path = repo_root().join(if mesh {
        "bench/results/count-mesh.json"
    } else {
        "bench/results/count.json"
    });
    let json = serde_json::json!({
        "envoy": graceful_harness::support::envoy::envoy_binary().display().to_string(),
        "mesh": mesh.then_some("1,000 clusters of 10 endpoints (make bench-mesh's), 3 routed"),
        "window_s": window.as_secs(),
        "load": "wrk -t1 -c16, HTTP/1.1 keep-alive, Envoy --concurrency 1 under callgrind",
        "sets": counted,
    });
    let text = match serde_json::to_string_pretty(&json) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("bench-count: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = std::fs::write(&path, text + "\n") {
        eprintln!("bench-count: {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    println!("\nresults: {}", path.display());
    ExitCode::SUCCESS
}

/// The calls `make bench-prices` prices, in the order of its table: each
/// is target/bench/prices/<name>.wasm, the floor making [`PRICED_CALLS`]
/// more of it per response (`entry`: one more exported callback).
const PRICES: [(&str, &str); 12] = [
    (
        "entry",
        "a VM entry: one more exported callback (proxy_on_request_headers), doing nothing",
    ),
    ("metric_add", "proxy_increment_metric"),
    ("metric_get", "proxy_get_metric"),
    ("clock", "proxy_get_current_time_nanoseconds"),
    (
        "header_remove",
        "proxy_remove_header_map_value, a header that is not there",
    ),
    (
        "header_absent",
        "proxy_get_header_map_value, a header that is not there",
    ),
    ("header_replace", "proxy_replace_header_map_value"),
    (
        "header_present",
        "proxy_get_header_map_value, a header that is there (returns data)",
    ),
    (
        "header_map",
        "proxy_get_header_map_pairs, the response's headers (returns data)",
    ),
    (
        "property",
        "proxy_get_property upstream.address (returns data)",
    ),
    (
        "guest_ops",
        "100 iterations of a multiply-add loop in the guest",
    ),
    (
        "guest_alloc",
        "a 64-byte allocation and its free, in the guest",
    ),
];
/// How many more of its call each priced build makes per response (the
/// floor's `CALLS`); one for `entry`.
const PRICED_CALLS: u64 = 10;

async fn count_prices(window: Duration) -> ExitCode {
    let code = repo_root().join("target/bench/prices");
    let dir = repo_root().join("target/bench/count");
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("bench-count: {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    let (_upstream, upstream) = start_upstream().await;
    let count = |name: &str| {
        let set = price_set(&code.join(format!("{name}.wasm")));
        let upstream = upstream.clone();
        let dir = dir.clone();
        async move { count_set(&set, &upstream, &dir, window).await }
    };
    let floor = match count("floor").await {
        Ok(c) => c.worker_per_request,
        Err(e) => {
            eprintln!("bench-count: the floor: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("floor: {floor} instructions per request\n");
    println!("| call | instructions per call | what it is |\n|---|---:|---|");
    let mut rows = Vec::new();
    for (name, what) in PRICES {
        let counted = match count(name).await {
            Ok(c) => c.worker_per_request,
            Err(e) => {
                eprintln!("bench-count: {name}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let calls = if name == "entry" { 1 } else { PRICED_CALLS };
        let each = (counted as i64 - floor as i64) / calls as i64;
        println!("| `{name}` | {each} | {what} |");
        rows.push(serde_json::json!({"call": name, "what": what, "per_request": counted, "calls": calls, "per_call": each}));
    }
    let json = serde_json::json!({
        "envoy": graceful_harness::support::envoy::envoy_binary().display().to_string(),
        "window_s": window.as_secs(),
        "load": "wrk -t1 -c16, HTTP/1.1 keep-alive, Envoy --concurrency 1 under callgrind",
        "floor_per_request": floor,
        "prices": rows,
    });
    let path = repo_root().join("bench/results/prices.json");
    let written = serde_json::to_string_pretty(&json)
        .map_err(|e| e.to_string())
        .and_then(|text| std::fs::write(&path, text + "\n").map_err(|e| e.to_string()));
    if let Err(e) = written {
        eprintln!("bench-count: {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    println!("\nresults: {}", path.display());
    ExitCode::SUCCESS
}
