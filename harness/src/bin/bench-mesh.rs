//! `make bench-mesh`: graceful_consumer in a sidecar with 1,000 clusters of
//! 10 endpoints, on each Envoy named in `BENCH_MESH_ENVOYS`
//! (`version=path,...`), beside plain Envoy in the same run. Writes
//! `bench/results/mesh.json` and prints the table docs/benchmarks/mesh.md quotes.
//!
//! Flags: `--rounds N` (3), `--duration S` per wrk run (5); `--paired N`
//! (0) rounds of the per-request cost with the sets' proxies side by side
//! (see `mesh_paired`), `--paired-duration S` per paired wrk run (3);
//! `--out PATH` (`bench/results/mesh.json`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use graceful_harness::products::bench::{
    median, parse_or_exit, start_upstream, FilterSet, WrkResult,
};
use graceful_harness::products::bench_mesh::{
    admin_latency, mesh_paired, mesh_pairs, mesh_result, mesh_round, mesh_sets, paired_proxies,
    write_cds, AdminLatency, MeshEnvoy, MeshRound, PairedProxy, SetRounds, ENDPOINTS_PER_CLUSTER,
    MESH_CLUSTERS,
};
use graceful_harness::support::envoy::repo_root;

/// The command line.
struct Flags {
    rounds: usize,
    duration: Duration,
    paired_rounds: usize,
    paired_duration: Duration,
    out: PathBuf,
}

/// The flags, or the message for a bad command line.
fn parse_flags(mut args: impl Iterator<Item = String>) -> Result<Flags, String> {
    let mut flags = Flags {
        rounds: 3,
        duration: Duration::from_secs(5),
        paired_rounds: 0,
        paired_duration: Duration::from_secs(3),
        out: repo_root().join("bench/results/mesh.json"),
    };
    while let Some(flag) = args.next() {
        if flag == "--out" {
            match args.next() {
                Some(path) => flags.out = PathBuf::from(path),
                None => return Err("bench-mesh: --out takes a path".into()),
            }
            continue;
        }
        match (
            flag.as_str(),
            args.next().and_then(|v| v.parse::<u64>().ok()),
        ) {
            ("--rounds", Some(n)) => flags.rounds = n as usize,
            ("--duration", Some(s)) => flags.duration = Duration::from_secs(s),
            ("--paired", Some(n)) => flags.paired_rounds = n as usize,
            ("--paired-duration", Some(s)) if s > 0 => {
                flags.paired_duration = Duration::from_secs(s)
            }
            _ => return Err("usage: bench-mesh [--rounds N] [--duration S] [--paired N] [--paired-duration S] [--out PATH]".into()),
        }
    }
    Ok(flags)
}

/// The Envoys `BENCH_MESH_ENVOYS` names (`version=path,...`).
fn envoys() -> Vec<(String, PathBuf)> {
    std::env::var("BENCH_MESH_ENVOYS")
        .unwrap_or_default()
        .split(',')
        .filter_map(|e| e.split_once('='))
        .map(|(v, p)| (v.to_string(), PathBuf::from(p)))
        .collect()
}

/// What one Envoy's runs share: the mesh's clusters and the upstream.
struct Mesh<'a> {
    version: &'a str,
    binary: &'a Path,
    cds: &'a Path,
    upstream_addrs: &'a [SocketAddr],
}

/// Every round of every set on one Envoy, and the admin's latency (read
/// once, from the first `consumer` run).
async fn measure_rounds(
    mesh: &Mesh<'_>,
    sets: &[FilterSet],
    flags: &Flags,
) -> Result<(Vec<Vec<MeshRound>>, AdminLatency), String> {
    let version = mesh.version;
    let mut by_set: Vec<Vec<MeshRound>> = vec![Vec::new(); sets.len()];
    let mut admin = None;
    for round in 0..flags.rounds {
        for (i, set) in sets.iter().enumerate() {
            let (r, envoy, _) = mesh_round(
                mesh.binary,
                set,
                mesh.cds,
                mesh.upstream_addrs,
                flags.duration,
            )
            .await
            .map_err(|e| format!("{version} {}: {e}", set.name))?;
            println!(
                "{version} round {} {:<24} main thread {:>6.2} ms/s  admin {:>4.1} rq/s  RSS {:>6.1} MiB  CPU {:>5.1} us/request  {:>6.0} req/s",
                round + 1,
                set.name,
                r.main_ms_per_s,
                r.admin_rq_per_s,
                r.rss_kb as f64 / 1024.0,
                r.cpu_us_per_request,
                r.rps
            );
            if admin.is_none() && set.name == "consumer" {
                admin = Some(
                    admin_latency(&envoy)
                        .await
                        .map_err(|e| format!("admin latency: {e}"))?,
                );
            }
            by_set[i].push(r);
        }
    }
    Ok((by_set, admin.unwrap_or_default()))
}

/// The paired rounds on one Envoy (none without `--paired`), each
/// proxy's printed.
async fn measure_paired(
    mesh: &Mesh<'_>,
    proxies: &[PairedProxy],
    flags: &Flags,
) -> Result<Vec<Vec<WrkResult>>, String> {
    let version = mesh.version;
    if flags.paired_rounds == 0 {
        return Ok(Vec::new());
    }
    let paired_by_set = mesh_paired(
        mesh.binary,
        proxies,
        mesh.cds,
        mesh.upstream_addrs,
        flags.paired_rounds,
        flags.paired_duration,
    )
    .await
    .map_err(|e| format!("{version} paired: {e}"))?;
    for (proxy, rounds) in proxies.iter().zip(&paired_by_set) {
        let cpu: Vec<String> = rounds
            .iter()
            .map(|r| format!("{:.1}", r.cpu_us_per_request))
            .collect();
        println!(
            "{version} paired {:<34} CPU us/request by round: {}",
            proxy.label,
            cpu.join(" ")
        );
    }
    Ok(paired_by_set)
}

/// One Envoy's result: the rounds of every set, then the paired ones.
async fn measure_envoy(
    mesh: &Mesh<'_>,
    sets: &[FilterSet],
    flags: &Flags,
) -> Result<MeshEnvoy, String> {
    let (by_set, admin) = measure_rounds(mesh, sets, flags).await?;
    let proxies = paired_proxies();
    let paired_by_set = measure_paired(mesh, &proxies, flags).await?;
    let paired = mesh_pairs(&proxies, &paired_by_set);
    let paired_rounds = proxies
        .iter()
        .zip(paired_by_set)
        .map(|(p, rounds)| SetRounds {
            set: p.label.clone(),
            rounds,
        })
        .collect();
    Ok(MeshEnvoy {
        paired,
        paired_rounds,
        envoy: mesh.version.to_string(),
        sets: sets
            .iter()
            .zip(by_set)
            .map(|(s, r)| mesh_result(s.name, r))
            .collect(),
        admin,
    })
}

/// The tables docs/benchmarks/mesh.md quotes: each set's medians, then
/// the admin's answers.
fn print_tables(results: &[MeshEnvoy], rounds: usize) {
    println!(
        "\n{MESH_CLUSTERS} clusters x {ENDPOINTS_PER_CLUSTER} endpoints, {rounds} rounds (medians):\n"
    );
    println!("| Envoy | set | main thread idle, ms/s | admin requests/s | refresh, ms of main thread each | RSS MiB | CPU µs/request | vs `none` | vs `consumer` |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for e in results {
        let named = |name: &str| {
            e.sets
                .iter()
                .find(|s| s.set == name)
                .cloned()
                .unwrap_or_default()
        };
        let (none, consumer) = (named("none"), named("consumer"));
        for s in &e.sets {
            let per_refresh = if s.set != "none" && s.admin_rq_per_s > 0.0 {
                format!(
                    "{:.2}",
                    (s.main_ms_per_s - none.main_ms_per_s) / s.admin_rq_per_s
                )
            } else {
                String::new()
            };
            println!(
                "| {} | `{}` | {:.2} | {:.2} | {} | {:.1} | {:.1} | {:+.1} | {} |",
                e.envoy,
                s.set,
                s.main_ms_per_s,
                s.admin_rq_per_s,
                per_refresh,
                s.rss_kb / 1024.0,
                s.cpu_us_per_request,
                s.cpu_us_per_request - none.cpu_us_per_request,
                if s.set == "consumer_100_tombstones" {
                    format!("{:+.1}", s.cpu_us_per_request - consumer.cpu_us_per_request)
                } else {
                    String::new()
                }
            );
        }
    }
    println!("\n| Envoy | `/clusters?filter=` bytes | ms | `/config_dump` bytes | ms |");
    println!("|---|---:|---:|---:|---:|");
    for e in results {
        println!(
            "| {} | {} | {:.2} | {} | {:.2} |",
            e.envoy,
            e.admin.clusters_bytes,
            e.admin.clusters_ms,
            e.admin.config_dump_bytes,
            e.admin.config_dump_ms
        );
    }
}

/// The paired table: each pair's median difference, range and rounds above 0.
fn print_paired(results: &[MeshEnvoy], paired_rounds: usize) {
    println!(
        "\nCPU per request added, paired: the median of {paired_rounds} rounds' differences (the range; rounds above 0)\n"
    );
    println!("| Envoy | set | over | median µs | range µs | rounds above 0 |");
    println!("|---|---|---|---:|---:|---:|");
    for e in results {
        for p in &e.paired {
            let d = &p.cpu_us_added_per_round;
            let low = d.iter().copied().fold(f64::INFINITY, f64::min);
            let high = d.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            println!(
                "| {} | `{}` | `{}` | {:+.1} | {:+.1} to {:+.1} | {}/{} |",
                e.envoy,
                p.set,
                p.against,
                median(d.iter().copied()),
                low,
                high,
                d.iter().filter(|x| **x > 0.0).count(),
                d.len()
            );
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let flags = parse_or_exit(parse_flags(std::env::args().skip(1)));
    let envoys = envoys();
    if envoys.is_empty() {
        eprintln!("bench-mesh: BENCH_MESH_ENVOYS names no Envoy (version=path,...)");
        return ExitCode::from(2);
    }
    let (_upstream, upstream_addrs) = start_upstream().await;
    let dir = repo_root().join("target/bench/mesh");
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("bench-mesh: {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    let cds = write_cds(&dir, &upstream_addrs);
    let sets = mesh_sets();
    let mut results = Vec::new();
    for (version, binary) in &envoys {
        let mesh = Mesh {
            version,
            binary,
            cds: &cds,
            upstream_addrs: &upstream_addrs,
        };
        match measure_envoy(&mesh, &sets, &flags).await {
            Ok(r) => results.push(r),
            Err(e) => {
                eprintln!("bench-mesh: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if flags.rounds > 0 {
        print_tables(&results, flags.rounds);
    }
    if flags.paired_rounds > 0 {
        print_paired(&results, flags.paired_rounds);
    }
    let json = serde_json::to_string_pretty(&results).unwrap_or_default();
    if let Err(e) = std::fs::write(&flags.out, json) {
        eprintln!("bench-mesh: {}: {e}", flags.out.display());
        return ExitCode::FAILURE;
    }
    println!("\nwrote {}", flags.out.display());
    ExitCode::SUCCESS
}
