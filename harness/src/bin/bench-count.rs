//! `make bench-count`: Envoy's instructions per request for each set of
//! `make bench`, counted under callgrind (see
//! `graceful_harness::products::bench_count`). Writes
//! `bench/results/count.json` and prints the table docs/benchmarks/count.md quotes.
//!
//! Flags: `--sets a,b` (default: none, consumer, consumer_100_tombstones
//! and their native sets), `--window S` per counted window (10), `--mesh`:
//! each set in `make bench-mesh`'s mesh of 1,000 clusters of 10 endpoints
//! (default sets: none, consumer, consumer_100_tombstones), written to
//! `bench/results/count-mesh.json`.

use std::process::ExitCode;
use std::time::Duration;

use graceful_harness::products::bench::{filter_sets, start_upstream};
use graceful_harness::products::bench_count::{count_mesh_set, count_set, Counted};
use graceful_harness::products::bench_mesh::write_cds;
use graceful_harness::support::envoy::repo_root;

const DEFAULT_SETS: &str =
    "none,consumer,consumer_100_tombstones,consumer_native,consumer_100_tombstones_native";
const DEFAULT_MESH_SETS: &str = "none,consumer,consumer_100_tombstones";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let mut wanted: Option<String> = None;
    let mut window = Duration::from_secs(10);
    let mut mesh = false;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--mesh" {
            mesh = true;
            continue;
        }
        match (flag.as_str(), args.next()) {
            ("--sets", Some(v)) => wanted = Some(v),
            ("--window", Some(v)) if v.parse::<u64>().is_ok_and(|s| s > 0) => {
                window = Duration::from_secs(v.parse().unwrap_or(10));
            }
            _ => {
                eprintln!("usage: bench-count [--sets a,b] [--window S] [--mesh]");
                return ExitCode::from(2);
            }
        }
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
