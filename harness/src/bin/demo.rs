//! `make demo`: the matrix of scenarios × approaches
//! (`graceful_harness::products::demo::matrix`), each cell a rolling restart of
//! providers (or a scale-down) under load on real Envoy. Prints a line per cell and at the
//! end the matrix as a Markdown table (docs/benchmarks/demo.md's), writes
//! `target/demo/report.json` (scenario `today`'s graceful and `sleep_3s`
//! runs as `graceful` and `baseline`, every cell in `matrix`),
//! `target/demo/chart.svg` (the matrix) and `target/demo/providers.svg`
//! (requests per second per provider in `today`'s cells); exits 1 if a
//! `graceful` or `graceful_no_admin` cell failed a request outside the
//! `killed` scenario (where what was in flight on the killed provider
//! cannot be saved).
//!
//! Flags: `--scenarios a,b` (all: today, istio_long, no_retry_post,
//! slow_registry, killed, keepalive_clients, scale_down, behind_gateway,
//! behind_gateway_scale_down), `--approaches a,b`
//! (all that apply: graceful, graceful_no_admin (`today` and `scale_down`:
//! the consumer on the contract's default config, no `admin_cluster`),
//! graceful_close_off (`keepalive_clients`), sleep_3s, sleep_15s,
//! registry_only, plain; behind fronts: graceful, sleep_5s, sleep_15s,
//! draining_only, no_hook),
//! `--protocols http1,http2,grpc`
//! (scenario `today` runs each, the second and third with `graceful` and
//! `sleep_3s` unless `--approaches` is given; the others the first),
//! `--rate N` (500),
//! `--restarts N` (2; not in `scale_down`, where three of four providers
//! leave at once and none comes back), `--warmup S` (2), `--settle S` (3), `--duration S`
//! (each cell's load runs at least S seconds), `--no-baseline` (only
//! `graceful`).

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use graceful_harness::products::demo::matrix::{self, Approach, DRAIN_CONFIG, SCENARIOS};
use graceful_harness::products::demo::report::{matrix_chart, matrix_table, Cell, Report};
use graceful_harness::products::demo::{run, DemoConfig};
use graceful_harness::support::load::{Protocol, Sample};
use graceful_harness::support::run_report::chart;

struct Plan {
    config: DemoConfig,
    scenarios: Vec<&'static matrix::Scenario>,
    approaches: Option<Vec<String>>,
    protocols: Vec<Protocol>,
}

fn parse() -> Result<Plan, String> {
    let mut plan = Plan {
        config: DemoConfig {
            restarts: 2,
            warmup: Duration::from_secs(2),
            settle: Duration::from_secs(3),
            drain_config: DRAIN_CONFIG.into(),
            ..DemoConfig::default()
        },
        scenarios: SCENARIOS.iter().collect(),
        approaches: None,
        protocols: vec![Protocol::Http1, Protocol::Http2, Protocol::Grpc],
    };
    let config = &mut plan.config;
    let mut args = std::env::args().skip(1);
    let secs = |v: Option<String>| -> Result<Duration, String> {
        let v = v.ok_or("missing value")?;
        v.parse::<f64>()
            .map(Duration::from_secs_f64)
            .map_err(|e| format!("{v:?}: {e}"))
    };
    let list = |v: Option<String>| -> Result<Vec<String>, String> {
        Ok(v.ok_or("missing value")?
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect())
    };
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--scenarios" => {
                plan.scenarios = list(args.next())?
                    .iter()
                    .map(|n| matrix::scenario(n).ok_or_else(|| format!("unknown scenario {n:?}")))
                    .collect::<Result<_, _>>()?;
            }
            "--approaches" => plan.approaches = Some(list(args.next())?),
            "--protocols" | "--protocol" => {
                plan.protocols = list(args.next())?
                    .iter()
                    .map(|p| p.parse())
                    .collect::<Result<_, _>>()?;
            }
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
            "--no-baseline" => plan.approaches = Some(vec!["graceful".into()]),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if !(1..=3).contains(&config.restarts) || config.rate == 0 {
        return Err("--restarts must be 1 to 3 and --rate above 0".into());
    }
    if plan.protocols.is_empty() || plan.scenarios.is_empty() {
        return Err("no protocol or no scenario to run".into());
    }
    Ok(plan)
}

/// Whether a cell runs: the approaches asked for; without `--approaches`,
/// every approach on the first protocol and, on the others of `today`,
/// the filters with the short sleep only (the run fits in ~10 min).
fn wanted(plan: &Plan, approach: &Approach, first_protocol: bool) -> bool {
    match &plan.approaches {
        Some(wanted) => wanted.contains(&approach.name()),
        None => {
            first_protocol
                || ["graceful", "graceful_close_off", "sleep_3s"]
                    .contains(&approach.name().as_str())
        }
    }
}

/// Every cell of the plan, run in turn, each printed as it ends.
async fn run_cells(plan: &Plan) -> Vec<(Cell, Vec<Sample>)> {
    let mut cells = Vec::new();
    for scenario in &plan.scenarios {
        // Each protocol where it is what differs: `today`, and callers
        // holding their own connections (HTTP/2 is told by GOAWAY).
        let protocols = if scenario.name == "today" || scenario.balancer {
            plan.protocols.clone()
        } else {
            plan.protocols[..1].to_vec()
        };
        println!("== {}: {}", scenario.name, scenario.what);
        for (i, protocol) in protocols.into_iter().enumerate() {
            for approach in Approach::all_for(scenario) {
                if !wanted(plan, &approach, i == 0) {
                    continue;
                }
                let (config, mode) = matrix::cell(&plan.config, scenario, approach, protocol);
                let (report, samples) = run(&config, mode).await;
                let name = format!("{} {:?}", approach.name(), protocol).to_lowercase();
                println!("{}", report.line(&name));
                for ev in &report.events {
                    if let Some(r) = &ev.drain_report {
                        println!("  p{} drain report: {r}", ev.provider);
                    }
                }
                cells.push((
                    Cell {
                        scenario: scenario.name.into(),
                        approach: approach.name(),
                        run: report,
                    },
                    samples,
                ));
            }
        }
    }
    cells
}

/// report.json, chart.svg (the matrix) and providers.svg (requests per
/// second per provider for `today`'s cells of the first protocol: where
/// the traffic went around each shutdown) into `dir`.
fn write_outputs(
    dir: &Path,
    cells: &[(Cell, Vec<Sample>)],
    report: &Report,
    first: Protocol,
) -> std::io::Result<()> {
    let chart_cells: Vec<(&Cell, &[_])> = cells.iter().map(|(c, s)| (c, s.as_slice())).collect();
    let svg = matrix_chart(&chart_cells);
    let today: Vec<(&str, &_, &[_])> = cells
        .iter()
        .filter(|(c, _)| c.scenario == "today" && c.run.protocol == first)
        .map(|(c, s)| (c.approach.as_str(), &c.run, s.as_slice()))
        .collect();
    let providers_svg = chart(&today);
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join("report.json"),
        serde_json::to_string_pretty(report).unwrap_or_default(),
    )?;
    std::fs::write(dir.join("chart.svg"), svg)?;
    std::fs::write(dir.join("providers.svg"), providers_svg)
}

/// The cells where the filters lost a request: any failed request of
/// `graceful` or `graceful_no_admin` outside `killed`.
fn lost_requests(cells: &[(Cell, Vec<Sample>)]) -> Vec<String> {
    cells
        .iter()
        .filter(|(c, _)| {
            ["graceful", "graceful_no_admin"].contains(&c.approach.as_str())
                && c.scenario != "killed"
                && c.run.failed > 0
        })
        .map(|(c, _)| {
            format!(
                "{} {} {:?}: {} failed",
                c.scenario, c.approach, c.run.protocol, c.run.failed
            )
        })
        .collect()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let plan = match parse() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("demo: {e}");
            return ExitCode::from(2);
        }
    };
    let started = Instant::now();
    let cells = run_cells(&plan).await;
    let first = plan.protocols[0];
    let top = |approach: &str| {
        cells
            .iter()
            .find(|(c, _)| {
                c.scenario == "today" && c.approach == approach && c.run.protocol == first
            })
            .map(|(c, _)| c.run.clone())
    };
    let report = Report {
        graceful: top("graceful"),
        baseline: top("sleep_3s"),
        matrix: cells.iter().map(|(c, _)| c.clone()).collect(),
    };
    let dir = &plan.config.work_dir;
    if let Err(e) = write_outputs(dir, &cells, &report, first) {
        eprintln!("demo: cannot write the report: {e}");
        return ExitCode::FAILURE;
    }
    println!("\n{}", matrix_table(&report.matrix));
    println!(
        "{} cells in {:.0} s; report: {}  chart: {}",
        cells.len(),
        started.elapsed().as_secs_f64(),
        dir.join("report.json").display(),
        dir.join("chart.svg").display()
    );
    let lost = lost_requests(&cells);
    if !lost.is_empty() {
        eprintln!(
            "demo: FAILED: the filters lost requests: {}",
            lost.join("; ")
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
