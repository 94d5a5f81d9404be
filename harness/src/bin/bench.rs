//! `make bench`: the filters' cost against plain Envoy, and what they buy in
//! a rolling shutdown. Writes `bench/results/latest.json` and
//! `bench/results/chart.svg`.
//!
//! Flags: `--duration S` per wrk run (10), `--rounds N` (3), `--quick`
//! (cost only: no churn, no shutdown runs), `--sets a,b` (only these sets,
//! and `none`, the baseline), `--pair a:b` (repeatable: the CPU per request
//! set `a` added over set `b`, round by round, and its median). Odd rounds
//! measure the sets in reverse order, so a drift during a round weighs on
//! both ends of it alike.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use graceful_harness::products::bench::{
    chart, dead_hosts, filter_sets, parse_or_exit, round_order, start_proxy, start_upstream,
    unqueued, wrk, wrk_with_cpu, FilterSet, Paired, SetResult, WrkResult,
};
use graceful_harness::products::bench_count::committed_counts;
use graceful_harness::products::demo::{run, DemoConfig, Mode};
use graceful_harness::support::envoy::refusing_port;
use graceful_harness::support::procfs::rss_kb;
use graceful_harness::support::run_report::RunReport;
use serde::Serialize;

const CONNECTIONS: u32 = 16;
/// Provider restarts in the soak (each provider goes down 12 times).
const SOAK_RESTARTS: usize = 36;

#[derive(Serialize)]
struct Churn {
    hosts: usize,
    max_tombstones: u64,
    /// (evictions, live tombstones, tombstone value bytes, Envoy RSS KiB) per step.
    samples: Vec<(u64, u64, u64, u64)>,
}

#[derive(Serialize)]
struct Results {
    /// Per set: Envoy's worker instructions per request, from the committed
    /// `bench/results/count.json` (`make bench-count`): the figure that
    /// holds on a shared host, quoted before the µs measured here.
    instructions_per_request: std::collections::BTreeMap<String, u64>,
    envoy: &'static str,
    load: String,
    rounds: usize,
    duration_s: u64,
    sets: Vec<(String, SetResult)>,
    /// Per set: throughput / no-filter throughput.
    throughput_ratio: serde_json::Map<String, serde_json::Value>,
    /// Per set: Envoy CPU per request added over the no-filter run, µs.
    cpu_us_added: serde_json::Map<String, serde_json::Value>,
    /// Per set: p99 latency added over the no-filter run, µs (saturated).
    p99_added_us: serde_json::Map<String, serde_json::Value>,
    /// Per set: p50 and p99 latency added over the no-filter run on one
    /// connection (no queueing), µs.
    unqueued_p50_added_us: serde_json::Map<String, serde_json::Value>,
    unqueued_p99_added_us: serde_json::Map<String, serde_json::Value>,
    /// The `--pair` comparisons.
    paired: Vec<Paired>,
    churn: Option<Churn>,
    shutdown: Vec<(String, RunReport)>,
    soak: Option<RunReport>,
}

async fn churn() -> Churn {
    // A cluster of 10,000 hosts that refuse connections: every request
    // tombstones one the consumer has not seen (no retries, no live member
    // to steer to, so round robin walks them all).
    let set = filter_sets()
        .into_iter()
        .find(|s| s.name == "consumer")
        .unwrap_or_else(|| panic!("consumer set"));
    let hosts = dead_hosts(10_000, refusing_port());
    let (envoy, addr) = start_proxy(&set, &hosts[..1], &hosts[1..]).await;
    let mut samples = Vec::new();
    let stat = |name: &'static str| {
        let envoy = &envoy;
        async move { envoy.stat(&format!("wasmcustom.{name}")).await.unwrap_or(0) }
    };
    for _ in 0..5 {
        let mut conns = Vec::new();
        for _ in 0..8 {
            conns.push(tokio::spawn(async move {
                let mut c = graceful_harness::support::client::Conn::http1(addr)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                for _ in 0..250 {
                    let _ = c.get("/").await;
                }
            }));
        }
        for c in conns {
            let _ = c.await;
        }
        samples.push((
            stat("graceful_consumer_evictions").await,
            stat("graceful_consumer_tombstones").await,
            stat("graceful_consumer_tombstone_bytes").await,
            rss_kb(envoy.pid()),
        ));
    }
    Churn {
        hosts: hosts.len(),
        max_tombstones: 1024,
        samples,
    }
}

/// The command line.
struct Flags {
    duration: Duration,
    rounds: usize,
    quick: bool,
    only: Option<Vec<String>>,
    pairs: Vec<(String, String)>,
}

/// The flags, or the message for a bad command line.
fn parse_flags(mut args: impl Iterator<Item = String>) -> Result<Flags, String> {
    let mut flags = Flags {
        duration: Duration::from_secs(10),
        rounds: 3,
        quick: false,
        only: None,
        pairs: Vec::new(),
    };
    while let Some(flag) = args.next() {
        if flag == "--quick" {
            flags.quick = true;
            continue;
        }
        if flag == "--pair" {
            match args.next().as_deref().and_then(|v| v.split_once(':')) {
                Some((a, b)) => flags.pairs.push((a.to_string(), b.to_string())),
                None => return Err("bench: --pair takes SET:AGAINST".into()),
            }
            continue;
        }
        if flag == "--sets" {
            flags.only = args
                .next()
                .map(|v| v.split(',').map(str::to_string).collect());
            continue;
        }
        match (
            flag.as_str(),
            args.next().and_then(|v| v.parse::<u64>().ok()),
        ) {
            ("--duration", Some(s)) => flags.duration = Duration::from_secs(s),
            ("--rounds", Some(n)) => flags.rounds = n as usize,
            _ => return Err(
                "usage: bench [--duration S] [--rounds N] [--quick] [--sets a,b] [--pair a:b]..."
                    .into(),
            ),
        }
    }
    Ok(flags)
}

/// What the rounds measured, per set in `sets` order.
struct Measured {
    saturated: Vec<Vec<WrkResult>>,
    unqueued: Vec<Vec<WrkResult>>,
    rss: Vec<u64>,
}

/// One set in one round: saturated, then on one connection; Envoy's RSS.
async fn measure_set(
    set: &FilterSet,
    round: usize,
    upstream_addrs: &[SocketAddr],
    duration: Duration,
) -> Result<(WrkResult, WrkResult, u64), String> {
    // Tombstoned hosts must be members of the cluster for steering to
    // be needed: add that many hosts that refuse connections.
    let dead = dead_hosts(set.tombstones, refusing_port());
    let (proxy, addr) = start_proxy(set, upstream_addrs, &dead).await;
    // Warm the connections, the JIT and the caches; not measured.
    wrk(addr, CONNECTIONS, Duration::from_secs(2))?;
    let saturated = wrk_with_cpu(proxy.pid(), addr, CONNECTIONS, duration)?;
    let one = unqueued(proxy.pid(), addr, duration)?;
    if saturated.non_2xx > 0 || one.non_2xx > 0 {
        // A failed request costs what a failure costs: the set
        // would not measure what it is named for.
        return Err(format!(
            "{} answered {} requests with other than 2xx",
            set.name,
            saturated.non_2xx + one.non_2xx
        ));
    }
    println!(
        "round {} {:<26} {:>9.0} req/s  p50 {:>6.0} us  p99 {:>6.0} us  CPU {:>5.1} us/request",
        round + 1,
        set.name,
        saturated.rps,
        saturated.p50_us,
        saturated.p99_us,
        saturated.cpu_us_per_request
    );
    println!(
        "        one connection             p50 {:>6.0} us  p99 {:>6.0} us",
        one.p50_us, one.p99_us
    );
    Ok((saturated, one, rss_kb(proxy.pid())))
}

/// Every round, each in its order of the sets.
async fn measure_rounds(
    sets: &[FilterSet],
    upstream_addrs: &[SocketAddr],
    flags: &Flags,
) -> Result<Measured, String> {
    let mut m = Measured {
        saturated: vec![Vec::new(); sets.len()],
        unqueued: vec![Vec::new(); sets.len()],
        rss: vec![0; sets.len()],
    };
    for round in 0..flags.rounds {
        for i in round_order(round, sets.len()) {
            let (saturated, one, rss) =
                measure_set(&sets[i], round, upstream_addrs, flags.duration).await?;
            m.saturated[i].push(saturated);
            m.unqueued[i].push(one);
            m.rss[i] = m.rss[i].max(rss);
        }
    }
    Ok(m)
}

/// Each set's result, with what it adds over the first (`none`).
fn set_results(sets: &[FilterSet], m: Measured) -> Vec<(String, SetResult)> {
    let mut results: Vec<(String, SetResult)> = sets
        .iter()
        .zip(m.saturated.into_iter().zip(m.unqueued))
        .zip(&m.rss)
        .map(|((set, (rounds, unqueued)), rss)| {
            (
                set.name.to_string(),
                SetResult::from_rounds(rounds, unqueued, *rss),
            )
        })
        .collect();
    let base = results[0].1.clone();
    for (_, r) in &mut results {
        r.throughput_ratio = r.rps / base.rps;
        r.p99_added_us = r.p99_us - base.p99_us;
        r.cpu_us_added = r.cpu_us_per_request - base.cpu_us_per_request;
        r.unqueued_p50_added_us = r.unqueued_p50_us - base.unqueued_p50_us;
        r.unqueued_p99_added_us = r.unqueued_p99_us - base.unqueued_p99_us;
    }
    results
}

/// One figure per set, for reading latest.json at a glance.
fn summary(
    results: &[(String, SetResult)],
    figure: fn(&SetResult) -> f64,
    decimals: i32,
) -> serde_json::Map<String, serde_json::Value> {
    let scale = 10f64.powi(decimals);
    results
        .iter()
        .map(|(name, r)| {
            (
                name.clone(),
                serde_json::json!((figure(r) * scale).round() / scale),
            )
        })
        .collect()
}

/// The committed instruction counts, per set, and the file they are from.
fn committed() -> (PathBuf, BTreeMap<String, u64>) {
    let count_json = graceful_harness::support::envoy::repo_root().join("bench/results/count.json");
    let counts = committed_counts(&count_json).unwrap_or_else(|e| {
        eprintln!("bench: no counts to quote ({e}): run make bench-count");
        Default::default()
    });
    (count_json, counts)
}

/// The table of every set, counts first: they hold on a shared host,
/// where the µs after them move.
fn print_table(results: &[(String, SetResult)], count_json: &Path, counts: &BTreeMap<String, u64>) {
    let count_none = counts.get("none").copied();
    let count_text = |name: &str| -> (String, String) {
        match (counts.get(name).copied(), count_none) {
            (Some(n), Some(base)) => (n.to_string(), format!("{:+}", n as i64 - base as i64)),
            (Some(n), None) => (n.to_string(), String::new()),
            _ => ("-".into(), "-".into()),
        }
    };
    println!(
        "\ninstructions per request: {} (make bench-count)",
        count_json.display()
    );
    println!(
        "\n{:<26} {:>10} {:>10} {:>8} {:>7} {:>8} {:>9} {:>9} {:>9} {:>14} {:>14} {:>9}",
        "set",
        "instr/req",
        "instr +",
        "req/s",
        "ratio",
        "CPU us",
        "CPU +us",
        "p99 us",
        "p99 +us",
        "1-conn p50 +us",
        "1-conn p99 +us",
        "RSS KiB"
    );
    for (name, r) in results {
        let (count, count_added) = count_text(name);
        println!(
            "{:<26} {:>10} {:>10} {:>8.0} {:>7.3} {:>8.1} {:>9.1} {:>9.0} {:>9.0} {:>14.0} {:>14.0} {:>9}",
            name,
            count,
            count_added,
            r.rps,
            r.throughput_ratio,
            r.cpu_us_per_request,
            r.cpu_us_added,
            r.p99_us,
            r.p99_added_us,
            r.unqueued_p50_added_us,
            r.unqueued_p99_added_us,
            r.rss_kb
        );
    }
}

fn print_paired(paired: &[Paired]) {
    for p in paired {
        let rounds: Vec<String> = p
            .cpu_us_added_per_round
            .iter()
            .map(|d| format!("{d:+.1}"))
            .collect();
        println!(
            "\n{} over {}, CPU per request, round by round: {} us; median {:+.1} us",
            p.set,
            p.against,
            rounds.join(" "),
            p.cpu_us_added_median
        );
    }
}

/// A rolling shutdown per mode, then the soak.
async fn shutdown_runs() -> (Vec<(String, RunReport)>, RunReport) {
    let mut shutdown = Vec::new();
    let config = DemoConfig {
        work_dir: graceful_harness::support::envoy::repo_root().join("target/bench"),
        ..DemoConfig::default()
    };
    for mode in [Mode::Graceful, Mode::Baseline, Mode::RegistryOnly] {
        let (report, _) = run(&config, mode).await;
        println!("{}", report.line(mode.name()));
        shutdown.push((mode.name().to_string(), report));
    }
    // The soak: an hour of rollouts compressed into minutes, providers
    // closing and coming back round and round under load.
    let soak_config = DemoConfig {
        restarts: SOAK_RESTARTS,
        rate: 300,
        settle: Duration::from_millis(500),
        warmup: Duration::from_secs(2),
        drain_config:
            r#"{"admin_cluster":"envoy_admin","consumer_update_wait":"1s","quiet_window":"200ms"}"#
                .into(),
        work_dir: graceful_harness::support::envoy::repo_root().join("target/bench-soak"),
        ..DemoConfig::default()
    };
    let (report, _) = run(&soak_config, Mode::Graceful).await;
    println!(
        "{}; consumer RSS {} -> {} KiB, outbound in flight at the end {:?}",
        report.line("soak"),
        report.consumer_rss_kb[0],
        report.consumer_rss_kb[1],
        report.consumer_inflight_end
    );
    (shutdown, report)
}

/// latest.json and chart.svg into bench/results.
fn write_results(out: &Results, svg: String) -> std::io::Result<()> {
    let dir = graceful_harness::support::envoy::repo_root().join("bench/results");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("latest.json"),
        serde_json::to_string_pretty(out).unwrap_or_default(),
    )?;
    std::fs::write(dir.join("chart.svg"), svg)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let flags = parse_or_exit(parse_flags(std::env::args().skip(1)));
    let (upstream, upstream_addrs) = start_upstream().await;
    let sets: Vec<_> = filter_sets()
        .into_iter()
        .filter(|s| {
            s.name == "none"
                || flags
                    .only
                    .as_ref()
                    .is_none_or(|o| o.iter().any(|n| n == s.name))
        })
        .collect();
    for (a, b) in &flags.pairs {
        for name in [a, b] {
            if !sets.iter().any(|s| s.name == name.as_str()) {
                eprintln!("bench: --pair names {name}, which is not a measured set");
                return ExitCode::from(2);
            }
        }
    }
    let measured = match measure_rounds(&sets, &upstream_addrs, &flags).await {
        Ok(m) => m,
        Err(e) => {
            eprintln!("bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    drop(upstream);
    let rounds_of = |name: &str| {
        sets.iter()
            .position(|s| s.name == name)
            .map(|i| measured.saturated[i].clone())
            .unwrap_or_default()
    };
    let paired: Vec<Paired> = flags
        .pairs
        .iter()
        .filter_map(|(a, b)| Paired::new(a, &rounds_of(a), b, &rounds_of(b)))
        .collect();
    let results = set_results(&sets, measured);
    let (count_json, counts) = committed();
    print_table(&results, &count_json, &counts);
    print_paired(&paired);
    let churn = if flags.quick {
        None
    } else {
        Some(churn().await)
    };
    if let Some(c) = &churn {
        println!(
            "\nchurn of {} hosts: (evictions, live tombstones, tombstone bytes, RSS KiB) {:?}",
            c.hosts, c.samples
        );
    }
    let (shutdown, soak) = if flags.quick {
        (Vec::new(), None)
    } else {
        let (shutdown, soak) = shutdown_runs().await;
        (shutdown, Some(soak))
    };
    let chart_rows: Vec<(&str, &SetResult)> =
        results.iter().map(|(n, r)| (n.as_str(), r)).collect();
    let svg = chart(&chart_rows);
    let out = Results {
        instructions_per_request: results
            .iter()
            .filter_map(|(name, _)| Some((name.clone(), counts.get(name).copied()?)))
            .collect(),
        envoy: "1.40.0",
        load: format!("wrk -t1 -c{CONNECTIONS}, HTTP/1.1 keep-alive, Envoy --concurrency 1, direct_response upstream"),
        rounds: flags.rounds,
        duration_s: flags.duration.as_secs(),
        throughput_ratio: summary(&results, |r| r.throughput_ratio, 3),
        cpu_us_added: summary(&results, |r| r.cpu_us_added, 0),
        p99_added_us: summary(&results, |r| r.p99_added_us, 0),
        unqueued_p50_added_us: summary(&results, |r| r.unqueued_p50_added_us, 0),
        unqueued_p99_added_us: summary(&results, |r| r.unqueued_p99_added_us, 0),
        sets: results,
        paired,
        churn,
        shutdown,
        soak,
    };
    if let Err(e) = write_results(&out, svg) {
        eprintln!("bench: cannot write results: {e}");
        return ExitCode::FAILURE;
    }
    println!("\nresults: bench/results/latest.json  chart: bench/results/chart.svg");
    ExitCode::SUCCESS
}
