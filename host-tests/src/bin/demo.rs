//! `make demo`: the rolling shutdown of three providers under load, with the
//! graceful-wasm filters and then without (plain Envoy), on real Envoy.
//! Writes `target/demo/report.json` and `target/demo/chart.svg`; exits 1 if
//! the run with the filters failed a request.
//!
//! Flags: `--protocol http1|http2|grpc` (http1), `--rate N` requests/s (500),
//! `--restarts N` (3), `--warmup S`, `--settle S` seconds (3, 4),
//! `--duration S` (the load runs at least S seconds),
//! `--registry-lag S` (2), `--baseline-sleep S` (3), `--no-baseline`.

use std::process::ExitCode;
use std::time::Duration;

use graceful_host_tests::demo::report::{chart, Report};
use graceful_host_tests::demo::{run, DemoConfig, Mode};

fn parse(config: &mut DemoConfig, baseline: &mut bool) -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let secs = |v: Option<String>| -> Result<Duration, String> {
        let v = v.ok_or("missing value")?;
        v.parse::<f64>()
            .map(Duration::from_secs_f64)
            .map_err(|e| format!("{v:?}: {e}"))
    };
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--protocol" => config.protocol = args.next().ok_or("missing value")?.parse()?,
            "--rate" => {
                config.rate = args
                    .next()
                    .ok_or("missing value")?
                    .parse()
                    .map_err(|e| format!("--rate: {e}"))?
            }
            "--restarts" => {
                config.restarts = args
                    .next()
                    .ok_or("missing value")?
                    .parse()
                    .map_err(|e| format!("--restarts: {e}"))?
            }
            "--warmup" => config.warmup = secs(args.next())?,
            "--settle" => config.settle = secs(args.next())?,
            "--duration" => config.min_duration = secs(args.next())?,
            "--registry-lag" => config.registry_lag = secs(args.next())?,
            "--baseline-sleep" => config.baseline_sleep = secs(args.next())?,
            "--no-baseline" => *baseline = false,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if !(1..=3).contains(&config.restarts) || config.rate == 0 {
        return Err("--restarts must be 1 to 3 and --rate above 0".into());
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let mut config = DemoConfig::default();
    let mut with_baseline = true;
    if let Err(e) = parse(&mut config, &mut with_baseline) {
        eprintln!("demo: {e}");
        return ExitCode::from(2);
    }
    println!(
        "demo: {:?} load at {} req/s; {} provider restart(s); registry lag {:?}",
        config.protocol, config.rate, config.restarts, config.registry_lag
    );
    let (graceful, graceful_samples) = run(&config, Mode::Graceful).await;
    println!("{}", graceful.line("graceful"));
    let baseline = if with_baseline {
        let (b, samples) = run(&config, Mode::Baseline).await;
        println!("{}", b.line("baseline"));
        Some((b, samples))
    } else {
        None
    };
    let mut runs = vec![("graceful", &graceful, graceful_samples.as_slice())];
    if let Some((b, s)) = &baseline {
        runs.push(("baseline", b, s.as_slice()));
    }
    let svg = chart(&runs);
    let report = Report {
        graceful: graceful.clone(),
        baseline: baseline.as_ref().map(|(b, _)| b.clone()),
    };
    let dir = &config.work_dir;
    let written = std::fs::create_dir_all(dir)
        .and_then(|()| {
            std::fs::write(
                dir.join("report.json"),
                serde_json::to_string_pretty(&report).unwrap_or_default(),
            )
        })
        .and_then(|()| std::fs::write(dir.join("chart.svg"), svg));
    if let Err(e) = written {
        eprintln!("demo: cannot write the report: {e}");
        return ExitCode::FAILURE;
    }
    println!(
        "report: {}  chart: {}",
        dir.join("report.json").display(),
        dir.join("chart.svg").display()
    );
    if graceful.failed > 0 {
        eprintln!(
            "demo: FAILED: {} requests failed with the filters",
            graceful.failed
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
