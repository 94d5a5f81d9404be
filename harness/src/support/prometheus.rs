//! A real Prometheus (Debian's `prometheus` package, `make test-tools`)
//! scraping Envoys' `/stats/prometheus` every second and evaluating
//! `examples/prometheus/rules.yaml` every second: what the rules are
//! checked against beside real shutdowns (`harness/tests/prometheus.rs`).

use std::fs;
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::support::client;
use crate::support::envoy::{candidate_port, lost_a_port, repo_root, scratch_path};
use crate::support::logged::LoggedProcess;

/// The scrape's relabelling the rules file asks of a native module's
/// Envoy (its stats keep Envoy's prefix there: see rules.yaml's header).
const RELABEL: &str = "  metric_relabel_configs:\n  - source_labels: [__name__]\n    regex: envoy_wasmcustom_(graceful_.*)\n    target_label: __name__\n    replacement: $1\n";

/// One scrape target: its admin address and the labels a Kubernetes
/// scrape would give it.
pub struct Target<'a> {
    pub admin: SocketAddr,
    pub labels: &'a [(&'a str, &'a str)],
}

pub struct Prometheus {
    /// Killed on drop; its log printed if the test fails.
    process: LoggedProcess,
    pub addr: SocketAddr,
}

impl Prometheus {
    /// Starts Prometheus on `targets` with the repository's rules; returns
    /// once it answers ready.
    pub async fn start(name: &str, targets: &[Target<'_>]) -> Prometheus {
        let dir = scratch_path(&format!("{name}-prometheus"), "d");
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let rules = repo_root().join("examples/prometheus/rules.yaml");
        let mut config = format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nrule_files: ['{}']\nscrape_configs:\n- job_name: envoy\n  metrics_path: /stats/prometheus\n{RELABEL}  static_configs:\n",
            rules.display()
        );
        for t in targets {
            let labels: Vec<String> = t
                .labels
                .iter()
                .map(|(k, v)| format!("{k}: '{v}'"))
                .collect();
            config.push_str(&format!(
                "  - targets: ['{}']\n    labels: {{{}}}\n",
                t.admin,
                labels.join(", ")
            ));
        }
        let config_path = dir.join("prometheus.yml");
        fs::write(&config_path, config).unwrap_or_else(|e| panic!("{e}"));
        // Prometheus cannot say which port it bound for `:0`: a picked
        // port, and a new one when Prometheus exits because it was taken.
        for _ in 0..8 {
            let addr = SocketAddr::from(([127, 0, 0, 1], candidate_port()));
            // `make test-tools` installs it (Debian's prometheus).
            let mut cmd = Command::new("prometheus");
            cmd.arg(format!("--config.file={}", config_path.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("data").display()
                ))
                .arg(format!("--web.listen-address={addr}"));
            let mut p = Prometheus {
                process: LoggedProcess::spawn("prometheus", cmd, &dir, |_| {}),
                addr,
            };
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            let ready = loop {
                if client::get(p.addr, "/-/ready")
                    .await
                    .is_ok_and(|r| r.status == 200)
                {
                    break true;
                }
                let exited = p.process.child.try_wait().ok().flatten().is_some();
                if exited && lost_a_port(&p.process.log()) {
                    break false;
                }
                assert!(
                    !exited && std::time::Instant::now() < deadline,
                    "Prometheus not ready within 30 s (exited: {exited})"
                );
                tokio::time::sleep(Duration::from_millis(25)).await;
            };
            if ready {
                return p;
            }
            eprintln!("Prometheus: {addr} was taken; starting it again on another port");
            let _ = p.process.child.wait();
        }
        panic!("Prometheus lost its port 8 times");
    }

    /// `GET` an API path; the JSON's `data`.
    async fn api(&self, path: &str) -> Value {
        let r = client::get(self.addr, path)
            .await
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(r.status, 200, "{path}: {:?}", r.text());
        let v: Value = serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("{path}: {e}"));
        v["data"].clone()
    }

    /// A query's series (`data.result`): each one's labels, and the series
    /// itself for its value or values.
    async fn series(&self, path: &str) -> Vec<(Value, Value)> {
        let data = self.api(path).await;
        data["result"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| (s["metric"].clone(), s.clone()))
            .collect()
    }

    /// An instant query's samples: (labels, value).
    pub async fn query(&self, expr: &str) -> Vec<(Value, f64)> {
        let path = format!("/api/v1/query?query={}", percent_encode(expr));
        self.series(&path)
            .await
            .into_iter()
            .map(|(labels, s)| {
                let value = s["value"][1]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(f64::NAN);
                (labels, value)
            })
            .collect()
    }

    /// A range query from `start` to `end` (Unix seconds) every `step_s`:
    /// per series, its labels and (time, value) points.
    pub async fn query_range(
        &self,
        expr: &str,
        start: f64,
        end: f64,
        step_s: f64,
    ) -> Vec<(Value, Vec<(f64, f64)>)> {
        let path = format!(
            "/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step={step_s}",
            percent_encode(expr)
        );
        self.series(&path)
            .await
            .into_iter()
            .map(|(labels, s)| {
                let points = s["values"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|p| {
                        let t = p[0].as_f64()?;
                        let v = p[1].as_str()?.parse().ok()?;
                        Some((t, v))
                    })
                    .collect();
                (labels, points)
            })
            .collect()
    }

    /// Every alert pending or firing: (its labels, its state).
    pub async fn alerts(&self) -> Vec<(Value, String)> {
        let data = self.api("/api/v1/alerts").await;
        data["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| {
                (
                    a["labels"].clone(),
                    a["state"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }

    pub fn log_text(&self) -> String {
        self.process.log()
    }
}

/// A query string's percent-encoding (everything but unreserved bytes).
fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The metric names a `/stats/prometheus` answer lists.
pub fn metric_names(exposition: &str) -> Vec<String> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_a_query_and_reads_an_exposition() {
        assert_eq!(
            percent_encode("a{b=\"c\"} > 0"),
            "a%7Bb%3D%22c%22%7D%20%3E%200"
        );
        let text = "# TYPE x counter\nx{} 1\ny{a=\"b\"} 2\nz 3\n";
        assert_eq!(metric_names(text), ["x", "y", "z"]);
    }
}
