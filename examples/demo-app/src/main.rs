//! `demo-app --listen 127.0.0.1:8080 [--name p1] [--latency-ms 5]`
//!
//! Serves until SIGTERM or SIGINT, then stops accepting, lets in-flight
//! requests finish (at most 10 s) and exits 0, as a well-behaved app does.
//!
//! `demo-app prestop http://127.0.0.1:15006 [WAIT]` is a Kubernetes preStop
//! hook for images without curl: `POST /graceful/closing` on the sidecar,
//! then `GET /graceful/drained?wait=WAIT` (default 25s); exits 0 once drained.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use demo_app::{App, AppConfig};

fn usage() -> ExitCode {
    eprintln!("usage: demo-app --listen ADDR:PORT [--name NAME] [--latency-ms MS]");
    eprintln!("       demo-app prestop http://SIDECAR:PORT [WAIT]");
    ExitCode::from(2)
}

/// One HTTP/1.1 request on a fresh connection; returns the status code.
async fn http(method: &str, base: &str, path: &str) -> Result<u16, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let authority = base
        .strip_prefix("http://")
        .ok_or("the URL must start with http://")?;
    let authority = authority.trim_end_matches('/');
    let mut stream = tokio::net::TcpStream::connect(authority)
        .await
        .map_err(|e| format!("{authority}: {e}"))?;
    let request = format!("{method} {path} HTTP/1.1\r\nhost: {authority}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .await
        .map_err(|e| e.to_string())?;
    let head = String::from_utf8_lossy(&answer);
    head.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))
}

async fn prestop(base: &str, wait: &str) -> ExitCode {
    match http("POST", base, "/graceful/closing").await {
        Ok(202) => {}
        Ok(status) => eprintln!("prestop: closing answered {status}"),
        Err(e) => eprintln!("prestop: closing: {e}"),
    }
    match http("GET", base, &format!("/graceful/drained?wait={wait}")).await {
        Ok(200) => ExitCode::SUCCESS,
        Ok(status) => {
            eprintln!("prestop: drained answered {status}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("prestop: drained: {e}");
            ExitCode::FAILURE
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("prestop") {
        let Some(base) = args.get(2) else {
            return usage();
        };
        return prestop(base, args.get(3).map_or("25s", String::as_str)).await;
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
