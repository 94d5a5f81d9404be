//! `make harness-demo`: the docker harness on a real engine. Starts the
//! compose project (`make images` built what it runs), runs an open-loop
//! load through the consumer container from the host, restarts each
//! provider container with `docker stop` / `docker start`
//! (graceful-entrypoint turns the SIGTERM into closing, drained, exit), and
//! reports like `make demo`: a line, `target/harness-demo/report.json` and
//! `target/harness-demo/chart.svg`. Takes the project down at the end (also
//! on failure, after printing every container's log). Exits 1 if a request
//! failed, a provider's drain was forced or a container exited non-zero.
//!
//! Flags: `--rate N` (200), `--conns N` (8), `--warmup S` (2), `--settle S`
//! (2), `--keep` (leave the project up).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use graceful_harness::platform::docker::{self, Rolling};
use graceful_harness::support::envoy::repo_root;
use graceful_harness::support::run_report::chart;

fn parse() -> Result<(Rolling, bool), String> {
    let mut plan = Rolling::default();
    let mut keep = false;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag}: missing value"));
        let secs = |v: String| {
            v.parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(Duration::from_secs_f64)
                .ok_or(format!("{flag}: {v:?} is not a number of seconds"))
        };
        match flag.as_str() {
            "--rate" => plan.rate = value()?.parse().map_err(|e| format!("--rate: {e}"))?,
            "--conns" => plan.conns = value()?.parse().map_err(|e| format!("--conns: {e}"))?,
            "--warmup" => plan.warmup = secs(value()?)?,
            "--settle" => plan.settle = secs(value()?)?,
            "--keep" => keep = true,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if plan.rate == 0 || plan.conns == 0 {
        return Err("--rate and --conns must be above 0".into());
    }
    Ok((plan, keep))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let (plan, keep) = match parse() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("harness-demo: {e}");
            return ExitCode::from(2);
        }
    };
    match docker::engine() {
        Ok(version) => println!("Docker engine {version}"),
        Err(e) => {
            eprintln!("harness-demo: no Docker engine answers: {e}");
            return ExitCode::from(2);
        }
    }
    let outcome = async {
        docker::up().await?;
        println!(
            "up: 3 providers healthy, the consumer answers on {}",
            docker::CONSUMER
        );
        docker::rolling_restart(plan).await
    }
    .await;
    let (report, samples, stopped) = match outcome {
        Ok(r) => r,
        Err(e) => {
            eprintln!("harness-demo: {e}\n{}", docker::logs());
            let _ = docker::down();
            return ExitCode::FAILURE;
        }
    };
    let mut problems = Vec::new();
    for (s, ev) in stopped.iter().zip(&report.events) {
        let entrypoint: Vec<&str> = s
            .log
            .lines()
            .filter(|l| l.starts_with("graceful-entrypoint:"))
            .collect();
        println!(
            "{}: docker stop took {} ms (closing -> drained {} ms), exit {}; back healthy after {} ms; {}",
            s.service,
            ev.down_ms - ev.closing_ms,
            ev.drained_ms - ev.closing_ms,
            s.exit_code,
            ev.up_ms - ev.down_ms,
            entrypoint.join(" | ")
        );
        if s.exit_code != "0" {
            problems.push(format!("{} exited {}", s.service, s.exit_code));
        }
        if s.log.contains("FORCED") {
            problems.push(format!("{}: the drain was forced", s.service));
        }
    }
    println!("{}", report.line("docker"));
    if report.failed > 0 {
        problems.push(format!("{} requests failed", report.failed));
    }
    let dir: PathBuf = repo_root().join("target/harness-demo");
    let written = std::fs::create_dir_all(&dir)
        .and_then(|()| {
            std::fs::write(
                dir.join("report.json"),
                serde_json::to_string_pretty(&report).unwrap_or_default(),
            )
        })
        .and_then(|()| {
            std::fs::write(
                dir.join("chart.svg"),
                chart(&[("docker", &report, &samples)]),
            )
        });
    match written {
        Ok(()) => println!(
            "report: {}  chart: {}",
            dir.join("report.json").display(),
            dir.join("chart.svg").display()
        ),
        Err(e) => problems.push(format!("cannot write the report: {e}")),
    }
    if keep {
        println!("left up (--keep): make down removes it");
    } else if let Err(e) = docker::down() {
        problems.push(e);
    }
    if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!("harness-demo: FAILED: {}", problems.join("; "));
        ExitCode::FAILURE
    }
}
