//! What README.md shows a new reader, run:
//!
//! - its minimal Envoy config is `examples/minimal/envoy.yaml`, quoted
//!   verbatim, and that file runs on real Envoy: one request crosses all
//!   three filters (graceful_consumer on the outbound listener, then
//!   graceful_drain and graceful_provider on the inbound one, then the app),
//!   and one shutdown goes through it (closing mark, tombstone, drained, the
//!   marked 503);
//! - pasted into a new directory with the built filters (`dist/` under it),
//!   it starts with what `make minimal` runs, and the request `make minimal`
//!   prints crosses all three filters; Ctrl-C stops it;
//! - the output it prints for `make try` is what `make try` prints;
//! - it stays at most 300 lines;
//! - its front door names both shapes (sidecar, fronts) and the
//!   `behind_gateway` table is the committed run's.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use graceful_harness::support::client::{self, Response};
use graceful_harness::support::envoy::{
    envoy_binary, eventually, repo_root, scratch_path, wasm_dir, Envoy, EnvoySpec,
};
use graceful_harness::support::mesh::status_of;
use graceful_harness::support::native::Delivery;
use graceful_harness::support::upstream::{demo_app_binary, Upstream};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

const README: &str = "README.md";
const MINIMAL_CONFIG: &str = "examples/minimal/envoy.yaml";
/// Documents that print `make try`'s output literally.
const TRY_OUTPUT_DOCS: &[&str] = &["README.md", "examples/provider-sidecar/README.md"];

/// What the test replaces in the minimal config to run it beside other
/// tests: each literal, how many times the file has it, and the placeholder
/// it becomes. The README tells a reader what these are (the ports, and the
/// `.wasm` paths relative to the repository root).
const SUBSTITUTIONS: &[(&str, usize, &str)] = &[
    ("port_value: 9901}", 2, "port_value: ${ADMIN_PORT}}"),
    ("port_value: 15006}", 2, "port_value: ${INBOUND_PORT}}"),
    ("port_value: 15001}", 1, "port_value: ${OUTBOUND_PORT}}"),
    ("port_value: 8080}", 1, "port_value: ${APP_PORT}}"),
    ("filename: dist/", 4, "filename: ${WASM_DIR}/"),
];

fn read(path: &str) -> String {
    std::fs::read_to_string(repo_root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every fenced code block of a Markdown text: its info string and body.
fn fenced_blocks(markdown: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(String, String)> = None;
    for line in markdown.lines() {
        match open.as_mut() {
            None => {
                if let Some(info) = line.strip_prefix("```") {
                    open = Some((info.trim().to_string(), String::new()));
                }
            }
            Some((_, body)) => {
                if line.trim_end() == "```" {
                    blocks.extend(open.take());
                } else {
                    body.push_str(line);
                    body.push('\n');
                }
            }
        }
    }
    blocks
}

/// The first line where two texts differ, for a readable failure.
fn first_difference(a: &str, b: &str) -> String {
    let (mut la, mut lb) = (a.lines(), b.lines());
    for n in 1.. {
        match (la.next(), lb.next()) {
            (None, None) => return "none (trailing newline?)".into(),
            (x, y) if x != y => return format!("line {n}: {x:?} against {y:?}"),
            _ => {}
        }
    }
    unreachable!()
}

/// The README is the front door: what it is, the commands, the minimal
/// config, where to go next. Everything else is in the book (docs/).
const README_MOST_LINES: usize = 300;

#[test]
fn the_readme_stays_short() {
    let lines = read(README).lines().count();
    assert!(
        (1..=README_MOST_LINES).contains(&lines),
        "{README} has {lines} lines, at most {README_MOST_LINES}: move the detail into the book (docs/) and link it"
    );
}

#[test]
fn the_readme_quotes_the_minimal_config_verbatim() {
    let file = read(MINIMAL_CONFIG);
    let yaml: Vec<String> = fenced_blocks(&read(README))
        .into_iter()
        .filter(|(info, _)| info == "yaml")
        .map(|(_, body)| body)
        .collect();
    assert!(
        yaml.contains(&file),
        "{README} must quote {MINIMAL_CONFIG} verbatim in a ```yaml block; closest differs at {}",
        yaml.iter()
            .map(|b| first_difference(b, &file))
            .next()
            .unwrap_or_else(|| "(no ```yaml block)".into())
    );
}

/// The minimal config with the test's ports and `.wasm` folder, written
/// where Envoy can read it.
fn minimal_config_template() -> String {
    let mut text = read(MINIMAL_CONFIG);
    for (literal, times, placeholder) in SUBSTITUTIONS {
        assert_eq!(
            text.matches(literal).count(),
            *times,
            "{MINIMAL_CONFIG}: expected {literal:?} {times} times (the README says what to replace)"
        );
        text = text.replace(literal, placeholder);
    }
    let path = scratch_path("readme-minimal", "yaml");
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    path.display().to_string()
}

async fn get(at: SocketAddr, path: &str) -> Response {
    client::get(at, path)
        .await
        .unwrap_or_else(|e| panic!("GET {path} on {at}: {e}"))
}

/// A filter's metric summed over the stats scopes Envoy puts it in (a
/// cluster's upstream filter writes under `cluster.<name>.` before 1.39).
async fn metric(envoy: &Envoy, name: &str) -> u64 {
    envoy.custom_stat_scopes(name).await.iter().sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_minimal_config_runs_all_three_filters_through_one_shutdown() {
    let app = Upstream::start().await;
    // The README's config points the consumer's cluster at the inbound
    // listener (and the admin cluster at the admin): those ports are
    // picked, and picked again if Envoy lost one; the outbound listener
    // binds a port of its own.
    let mut spec = EnvoySpec::new("readme_minimal", &minimal_config_template())
        .pick_port("INBOUND_PORT")
        .set("OUTBOUND_PORT", 0)
        .set("APP_PORT", app.addr.port());
    // The README's config is the wasm one, whatever GRACEFUL_DELIVERY says.
    spec.delivery = Delivery::Wasm;
    let envoy = spec.start().await;
    let inbound = envoy.listener("inbound").await;
    let outbound = envoy.listener("outbound").await;

    // Serving: a request through the outbound listener reaches the app through
    // the inbound one; graceful_provider stamps its instance id, no mark.
    let r = get(outbound, "/").await;
    assert_eq!(r.status, 200, "GET / through the consumer: {r:?}");
    assert!(
        r.header("x-graceful-instance")
            .is_some_and(|id| id.len() == 16),
        "graceful_provider's instance id on the answer: {r:?}"
    );
    assert_eq!(r.header("x-graceful-closing"), None, "{r:?}");
    assert_eq!(app.requests(), 1, "the app served the request");
    let ready = get(inbound, "/graceful/ready").await;
    assert_eq!(
        (ready.status, ready.text().trim()),
        (200, "SERVING"),
        "graceful_drain's readiness"
    );
    let counted: HashMap<&str, u64> = HashMap::from([
        (
            "graceful_consumer_started",
            metric(&envoy, "graceful_consumer_started").await,
        ),
        (
            "graceful_provider_started",
            metric(&envoy, "graceful_provider_started").await,
        ),
    ]);
    assert!(
        counted.values().all(|n| *n >= 1),
        "each filter counted the request: {counted:?}"
    );

    // Closing (what a preStop hook sends): the next answer through the
    // consumer carries the mark, and graceful_consumer tombstones the host.
    let r = client::post(inbound, "/graceful/closing").await.unwrap();
    assert_eq!(r.status, 202, "POST /graceful/closing: {r:?}");
    let r = get(outbound, "/").await;
    assert_eq!(
        (r.status, r.header("x-graceful-closing").as_deref()),
        (200, Some("true")),
        "a closing provider's answer through the consumer: {r:?}"
    );
    eventually(
        "graceful_consumer to tombstone the closing provider",
        Duration::from_secs(5),
        || async { (metric(&envoy, "graceful_consumer_evictions").await >= 1).then_some(()) },
    )
    .await;

    // The preStop's long-poll: the gate passes quiet after the default
    // consumer_update_wait (3 s); then graceful_provider answers new
    // requests with the marked 503 and the app sees none of them.
    let r = get(inbound, "/graceful/drained?wait=10s").await;
    let st = status_of(&r);
    assert_eq!(
        (r.status, st.phase.as_str(), st.forced),
        (200, "drained", false),
        "the drain gate: {st:?}"
    );
    let served = app.requests();
    let r = get(outbound, "/").await;
    assert_eq!(
        (r.status, r.header("x-graceful-closing").as_deref()),
        (503, Some("true")),
        "after the gate, through the consumer: {r:?}"
    );
    assert_eq!(
        app.requests(),
        served,
        "no request reached the app after the gate"
    );
    assert!(
        metric(&envoy, "graceful_provider_rejected").await >= 1,
        "graceful_provider counted its rejection"
    );
}

/// What `make minimal` runs, as its recipe in the Makefile says: the script,
/// then its arguments (Envoy, the demo app, the config).
const MAKE_MINIMAL: &str =
    "examples/minimal/run.sh $(ENVOY) target/debug/demo-app examples/minimal/envoy.yaml";

/// The README's minimal config as a reader takes it: its `yaml` block
/// written to `envoy.yaml` in a new directory, the built filters copied into
/// `dist/` there, started by the command `make minimal` runs with that
/// directory as the working one. It runs in a network namespace of its own
/// where this machine can make one (root), so its fixed ports (9901, 15001,
/// 15006, 8080) meet no other test's; elsewhere on the machine's own.
#[test]
fn the_pasted_minimal_config_starts_with_make_minimals_command_and_serves_through_all_three_filters(
) {
    let readme = read(README);
    let sh: String = fenced_blocks(&readme)
        .into_iter()
        .filter(|(info, _)| info == "sh")
        .map(|(_, body)| body)
        .collect();
    assert!(
        sh.lines().any(|l| l.starts_with("make minimal ")),
        "{README} documents `make minimal` in a ```sh block"
    );
    let makefile = read("Makefile");
    let recipe = makefile
        .split("\nminimal:")
        .nth(1)
        .unwrap_or_else(|| panic!("the Makefile has no `minimal` target"));
    assert!(
        recipe
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with('\t'))
            .any(|l| l.trim() == MAKE_MINIMAL),
        "make minimal runs `{MAKE_MINIMAL}`: the command this test runs"
    );

    let dir = scratch_path("readme-pasted", "d");
    std::fs::create_dir_all(dir.join("dist")).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let pasted = fenced_blocks(&readme)
        .into_iter()
        .find(|(info, body)| info == "yaml" && body.starts_with("# graceful-wasm, minimal"))
        .map(|(_, body)| body)
        .unwrap_or_else(|| panic!("{README}: no ```yaml block with the minimal config"));
    std::fs::write(dir.join("envoy.yaml"), pasted).unwrap_or_else(|e| panic!("{e}"));
    for f in [
        "graceful_provider.wasm",
        "graceful_drain.wasm",
        "graceful_consumer.wasm",
    ] {
        std::fs::copy(wasm_dir().join(f), dir.join("dist").join(f))
            .unwrap_or_else(|e| panic!("{f}: {e}"));
    }

    let mut run = Minimal::start(&dir);
    let printed = run.printed.clone();
    let command = |needle: &str| -> String {
        printed
            .lines()
            .find(|l| l.trim_start().starts_with("curl") && l.contains(needle))
            .and_then(|l| l.split(" # ").next())
            .map(|c| c.trim().to_string())
            .unwrap_or_else(|| {
                panic!("make minimal prints no curl command for {needle}:\n{printed}")
            })
    };
    let through = command("localhost:15001/");
    let closing = command("/graceful/closing");

    // The request it prints: graceful_consumer (outbound), graceful_drain and
    // graceful_provider (inbound), the app.
    let r = run.curl(&through);
    assert_eq!(r.status, 200, "`{through}`: {r:?}");
    assert!(
        r.header("x-graceful-instance")
            .is_some_and(|id| id.len() == 16),
        "graceful_provider's instance id on the answer: {r:?}"
    );
    assert_eq!(r.header("x-graceful-closing"), None, "{r:?}");
    for metric in ["graceful_consumer_started", "graceful_provider_started"] {
        assert!(
            run.metric(metric) >= 1,
            "{metric}: each filter counted the request"
        );
    }
    let ready = run.curl("curl -si localhost:15001/graceful/ready");
    assert_eq!(
        (ready.status, ready.body.trim()),
        (200, "SERVING"),
        "graceful_drain's readiness, through the consumer: {ready:?}"
    );

    // The shutdown it prints: the next answer through the consumer carries
    // the mark, and graceful_consumer tombstones the host.
    let r = run.curl(&closing);
    assert_eq!(r.status, 202, "`{closing}`: {r:?}");
    let r = run.curl(&through);
    assert_eq!(
        (r.status, r.header("x-graceful-closing")),
        (200, Some("true")),
        "a closing provider's answer through the consumer: {r:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while run.metric("graceful_consumer_evictions") < 1 {
        assert!(
            Instant::now() < deadline,
            "graceful_consumer tombstoned the closing provider"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // Ctrl-C: the terminal's SIGINT to the whole process group stops both
    // (the app and Envoy exit 0 on it; the script waits for both).
    let status = run.interrupt();
    assert!(
        matches!(status.code(), Some(0 | 130)),
        "make minimal's command after Ctrl-C: {status}; stderr:\n{}",
        run.stderr()
    );
    graceful_harness::support::tested_with::record("examples/minimal/README.md");
}

/// One answer as `curl -si` prints it.
#[derive(Debug)]
struct Curled {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Curled {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn parse(out: &str) -> Curled {
        let (head, body) = out
            .replace("\r\n", "\n")
            .split_once("\n\n")
            .map(|(h, b)| (h.to_string(), b.to_string()))
            .unwrap_or((out.to_string(), String::new()));
        let mut lines = head.lines();
        let status = lines
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        Curled {
            status,
            headers,
            body,
        }
    }
}

/// `make minimal`'s command running in a directory: the script, the app and
/// Envoy in one process group (as a terminal starts them), killed when
/// dropped.
struct Minimal {
    child: Child,
    /// The network namespace it runs in, when it has one of its own.
    netns: Option<PathBuf>,
    printed: String,
    log: PathBuf,
}

/// Whether this machine lets a test make a network namespace (root).
fn netns_available() -> bool {
    Command::new("unshare")
        .args(["--net", "true"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Minimal {
    fn start(dir: &Path) -> Minimal {
        let script = repo_root().join("examples/minimal/run.sh");
        let args = [
            script.display().to_string(),
            envoy_binary().display().to_string(),
            demo_app_binary().display().to_string(),
            "envoy.yaml".to_string(),
        ];
        let isolated = netns_available();
        let mut cmd = if isolated {
            let mut c = Command::new("unshare");
            c.args([
                "--net",
                "--",
                "sh",
                "-c",
                "ip link set lo up && exec \"$@\"",
                "sh",
            ]);
            c.args(&args);
            c
        } else {
            let mut c = Command::new(&args[0]);
            c.args(&args[1..]);
            c
        };
        let log = dir.join("stderr.log");
        let err = std::fs::File::create(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        let mut child = cmd
            .current_dir(dir)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", args[0]));
        let netns = isolated.then(|| PathBuf::from(format!("/proc/{}/ns/net", child.id())));
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().map(BufReader::new);
        std::thread::spawn(move || {
            for line in stdout
                .into_iter()
                .flat_map(|s| s.lines())
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut run = Minimal {
            child,
            netns,
            printed: String::new(),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !run.printed.contains("Ctrl-C stops both") {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    run.printed.push_str(&line);
                    run.printed.push('\n');
                }
                Err(_) => panic!(
                    "make minimal's command did not say it was up within 60 s; printed:\n{}\nstderr:\n{}",
                    run.printed,
                    run.stderr()
                ),
            }
        }
        run
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Runs a printed `curl` command where the config runs (its namespace).
    fn curl(&self, command: &str) -> Curled {
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net={}", ns.display())).arg("sh");
                c
            }
            None => Command::new("sh"),
        };
        // -i for the status and headers whatever the printed flags are.
        let command = command.replacen("curl ", "curl -i --max-time 15 ", 1);
        let out = cmd
            .args(["-c", &command])
            .output()
            .unwrap_or_else(|e| panic!("{command}: {e}"));
        assert!(
            out.status.success(),
            "`{command}`: {}\n{}\nstderr of make minimal's command:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            self.stderr()
        );
        Curled::parse(&String::from_utf8_lossy(&out.stdout))
    }

    /// A filter's metric from Envoy's admin, summed over the scopes Envoy
    /// puts it in.
    fn metric(&self, name: &str) -> u64 {
        let r = self.curl(&format!(
            "curl -s 'localhost:9901/stats?filter=wasmcustom.{name}$'"
        ));
        r.body
            .lines()
            .filter_map(|l| l.split_once(": "))
            .filter(|(k, _)| k.ends_with(&format!("wasmcustom.{name}")))
            .filter_map(|(_, v)| v.trim().parse::<u64>().ok())
            .sum()
    }

    /// SIGINT to the process group, as Ctrl-C in a terminal: the script
    /// stops the app and Envoy, waits for both, and exits.
    fn interrupt(&mut self) -> ExitStatus {
        let pgid = Pid::from_raw(self.child.id() as i32);
        killpg(pgid, Signal::SIGINT).unwrap_or_else(|e| panic!("SIGINT: {e}"));
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = self.child.try_wait().unwrap_or_else(|e| panic!("{e}")) {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "make minimal's command still runs 15 s after Ctrl-C; stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Minimal {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = killpg(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

#[test]
fn make_try_prints_what_the_docs_show() {
    let out = Command::new(env!("CARGO_BIN_EXE_walkthrough"))
        .output()
        .unwrap_or_else(|e| panic!("walkthrough: {e}"));
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "make try's walkthrough failed:\n{printed}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for doc in TRY_OUTPUT_DOCS {
        let shown: Vec<String> = fenced_blocks(&read(doc))
            .into_iter()
            .map(|(_, body)| body)
            .filter(|body| body.contains("1. GET /"))
            .collect();
        assert_eq!(
            shown.len(),
            1,
            "{doc}: expected one block of make try's output"
        );
        assert!(
            shown[0] == printed,
            "{doc} shows make try's output otherwise; first difference at {}\nprinted:\n{printed}",
            first_difference(&shown[0], &printed)
        );
    }
}

/// The README's front door says which shape a reader needs (sidecar, or
/// fronts before backends with no sidecar) and links the front guide; the
/// `behind_gateway` table in the benchmarks page is the committed run's
/// (`docs/demo-report-behind-gateway.json`), row by row.
#[test]
fn the_front_door_names_both_shapes_and_the_behind_gateway_table_is_the_committed_run() {
    let readme = read(README);
    let chooser = readme
        .split("\n\n")
        .find(|p| p.starts_with("**Which shape you need.**"))
        .unwrap_or_else(|| panic!("{README}: no \"Which shape you need\" paragraph"));
    for needle in [
        "sidecar",
        "no sidecar",
        "graceful-hook front",
        "docs/deploy/front-proxy.md",
    ] {
        assert!(
            chooser.contains(needle),
            "the chooser lacks {needle:?}: {chooser}"
        );
    }
    let report: serde_json::Value =
        serde_json::from_str(&read("docs/demo-report-behind-gateway.json"))
            .unwrap_or_else(|e| panic!("docs/demo-report-behind-gateway.json: {e}"));
    let page = read("docs/benchmarks/demo.md");
    let cells = report["matrix"].as_array().map_or(&[][..], Vec::as_slice);
    assert_eq!(cells.len(), 10, "five approaches, two shapes");
    for cell in cells {
        let shape = match cell["scenario"].as_str() {
            Some("behind_gateway") => "rolling",
            Some("behind_gateway_scale_down") => "scale-down 3 → 1",
            other => panic!("not a behind_gateway cell: {other:?}"),
        };
        let run = cell;
        let row = format!(
            "| {shape} | {} | {} | {} | {} |",
            cell["approach"].as_str().unwrap_or(""),
            run["requests"],
            run["failed"],
            run["after_closing"]
        );
        assert!(
            page.contains(&row),
            "docs/benchmarks/demo.md lacks the committed row {row}"
        );
    }
}
