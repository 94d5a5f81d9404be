//! `demo-app --listen 127.0.0.1:8080 [--name p1] [--latency-ms 5]`
//!
//! Serves until SIGTERM or SIGINT, then stops accepting, lets in-flight
//! requests finish (at most 10 s) and exits 0, as a well-behaved app does.
//!
//! `demo-app prestop ...` and `demo-app ready ...` are `graceful-hook`'s
//! preStop hook and readiness probe (the same code, `graceful_hook`), for
//! the demo image, which has no other binary: `demo-app prestop
//! http://127.0.0.1:15006 [WAIT]` through graceful_drain's listener,
//! `demo-app prestop [--admin URL]... [WAIT]` and `demo-app ready [--admin
//! URL]...` through Envoy's admin (Istio's sidecar).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use demo_app::{App, AppConfig};

fn usage() -> ExitCode {
    eprintln!("usage: demo-app --listen ADDR:PORT [--name NAME] [--latency-ms MS]");
    eprintln!("       demo-app prestop|ready ...: graceful-hook's commands (below)");
    eprintln!("{}", graceful_hook::USAGE);
    ExitCode::from(2)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if matches!(args.first().map(String::as_str), Some("prestop" | "ready")) {
        // The image has no other hook binary: the same code as graceful-hook.
        return match graceful_hook::parse(&args) {
            Ok(hook) => tokio::task::spawn_blocking(move || graceful_hook::run(&hook))
                .await
                .unwrap_or(ExitCode::FAILURE),
            Err(e) => {
                eprintln!("demo-app: {e}");
                usage()
            }
        };
    }
    let mut config = AppConfig::default();
    let mut listen: Option<SocketAddr> = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let Some(value) = args.next() else {
            return usage();
        };
        match flag.as_str() {
            "--listen" => match value.parse() {
                Ok(a) => listen = Some(a),
                Err(_) => return usage(),
            },
            "--name" => config.name = value,
            "--latency-ms" => match value.parse() {
                Ok(ms) => config.latency = Duration::from_millis(ms),
                Err(_) => return usage(),
            },
            _ => return usage(),
        }
    }
    let Some(listen) = listen else { return usage() };
    let app = match App::start_with(listen, config).await {
        Ok(app) => app,
        Err(e) => {
            eprintln!("demo-app: cannot listen on {listen}: {e}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!("demo-app: listening on {}", app.addr);
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("demo-app: no SIGTERM handler: {e}");
            return ExitCode::FAILURE;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    let served = app.requests();
    app.shutdown(Duration::from_secs(10)).await;
    eprintln!("demo-app: stopped after {served} requests");
    ExitCode::SUCCESS
}
