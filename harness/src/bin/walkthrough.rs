//! `make try`: starts a real Envoy (2 workers) with graceful_drain and
//! graceful_provider in front of a test app, walks through one shutdown, and
//! prints what each step answered. The output is fixed, so the examples'
//! README can show it literally.

use std::process::ExitCode;
use std::time::Duration;

use graceful_core::drain::status::Status;
use graceful_harness::support::client::{self, Response};
use graceful_harness::support::envoy::EnvoySpec;
use graceful_harness::support::upstream::Upstream;

const DRAIN_CONFIG: &str =
    r#"{"consumer_update_wait":"1s","quiet_window":"500ms","admin_cluster":"envoy_admin"}"#;
const PROVIDER_CONFIG: &str = r#"{"instance_id":"demo-1"}"#;

fn marks(r: &Response) -> String {
    let closing = r
        .header("x-graceful-closing")
        .map_or("no closing mark".into(), |v| {
            format!("x-graceful-closing: {v}")
        });
    let instance = r
        .header("x-graceful-instance")
        .unwrap_or_else(|| "-".into());
    format!("{}, x-graceful-instance: {instance}, {closing}", r.status)
}

fn phase(r: &Response) -> String {
    match serde_json::from_slice::<Status>(&r.body) {
        Ok(s) => format!(
            "{} phase={} drained={} forced={}",
            r.status, s.phase, s.drained, s.forced
        ),
        Err(_) => format!("{} {}", r.status, r.text().trim()),
    }
}

fn step(n: u32, what: &str, answer: String) {
    println!("{n}. {what:<34} -> {answer}");
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let app = Upstream::start().await;
    let envoy = EnvoySpec::new("walkthrough", "provider-sidecar.yaml")
        .set("LISTEN_ADDRESS", "127.0.0.1")
        .set("INBOUND_PORT", 0)
        .set("APP_PORT", app.addr.port())
        .set("DRAIN_CONFIG", DRAIN_CONFIG)
        .set("PROVIDER_CONFIG", PROVIDER_CONFIG)
        .start()
        .await;
    let at = envoy.listener("inbound").await;
    println!("Envoy 1.40, 2 workers, envoy/provider-sidecar.yaml: graceful_drain + graceful_provider -> test app");
    println!("drain config: {DRAIN_CONFIG}");
    let run = async {
        step(1, "GET /", marks(&client::get(at, "/").await?));
        let r = client::get(at, "/graceful/ready").await?;
        step(
            2,
            "GET /graceful/ready",
            format!("{} {}", r.status, r.text().trim()),
        );
        step(
            3,
            "POST /graceful/closing",
            phase(&client::post(at, "/graceful/closing").await?),
        );
        let r = client::get(at, "/graceful/ready").await?;
        step(
            4,
            "GET /graceful/ready",
            format!("{} {}", r.status, r.text().trim()),
        );
        step(5, "GET /", marks(&client::get(at, "/").await?));
        step(
            6,
            "GET /graceful/drained",
            phase(&client::get(at, "/graceful/drained").await?),
        );
        step(
            7,
            "GET /graceful/drained?wait=10s",
            phase(&client::get(at, "/graceful/drained?wait=10s").await?),
        );
        step(8, "GET /", marks(&client::get(at, "/").await?));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut stats = Vec::new();
        for name in [
            "graceful_provider_inflight",
            "graceful_provider_closing_marked",
            "graceful_provider_rejected",
            "graceful_drain_phase",
            "graceful_drain_forced",
        ] {
            let v = envoy
                .stat(&format!("wasmcustom.{name}"))
                .await
                .map_or("?".into(), |v| v.to_string());
            stats.push(format!("{name}={v}"));
        }
        step(9, "admin /stats", stats.join(" "));
        Ok::<(), String>(())
    };
    match run.await {
        Ok(()) => {
            println!("app requests served: {}", app.requests());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("walkthrough failed: {e}\n{}", envoy.log());
            ExitCode::FAILURE
        }
    }
}
