//! `demo-app --listen 127.0.0.1:8080 [--name p1] [--latency-ms 5]`
//!
//! Serves until SIGTERM or SIGINT, then stops accepting, lets in-flight
//! requests finish (at most 10 s) and exits 0, as a well-behaved app does.
//!
//! `demo-app prestop http://127.0.0.1:15006 [WAIT]` is a Kubernetes preStop
//! hook for images without curl: `POST /graceful/closing` on the sidecar,
//! then `GET /graceful/drained?wait=WAIT` (default 25s); exits 0 once drained.
//!
//! `demo-app prestop --admin http://127.0.0.1:15000 [WAIT]` is the same hook
//! for sidecars whose listeners a hook cannot reach (Istio's): it starts
//! closing with Envoy's `POST /healthcheck/fail` (graceful_drain polls the
//! admin through its `admin_cluster`) and waits until the admin's
//! `graceful_drain_phase` gauge says drained (2). `demo-app ready --admin
//! URL` is the matching exec readiness probe: it fails once closing. Both
//! fail open when graceful_drain is not loaded (no gauge): a shutdown helper
//! never holds a pod.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use demo_app::{App, AppConfig};

fn usage() -> ExitCode {
    eprintln!("usage: demo-app --listen ADDR:PORT [--name NAME] [--latency-ms MS]");
    eprintln!("       demo-app prestop http://SIDECAR:PORT [WAIT]");
    eprintln!("       demo-app prestop --admin http://127.0.0.1:ADMIN_PORT [WAIT]");
    eprintln!("       demo-app ready --admin http://127.0.0.1:ADMIN_PORT");
    ExitCode::from(2)
}

/// One HTTP/1.1 request on a fresh connection; returns the status code.
async fn http(method: &str, base: &str, path: &str) -> Result<u16, String> {
    http_text(method, base, path)
        .await
        .map(|(status, _)| status)
}

/// One HTTP/1.1 request on a fresh connection; returns the status code and
/// the body.
async fn http_text(method: &str, base: &str, path: &str) -> Result<(u16, String), String> {
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
    let answer = String::from_utf8_lossy(&answer);
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status in {answer:?}"))?;
    let body = answer
        .split_once("\r\n\r\n")
        .map_or("", |(_, body)| body)
        .to_string();
    Ok((status, body))
}

/// A custom stat of the filters as Envoy's admin lists it
/// (`wasmcustom.NAME: VALUE`); None when absent (the filter is not loaded).
async fn admin_stat(admin: &str, name: &str) -> Result<Option<u64>, String> {
    let stat = format!("wasmcustom.{name}");
    let (status, body) = http_text("GET", admin, &format!("/stats?filter=^{stat}$")).await?;
    if status != 200 {
        return Err(format!("admin /stats answered {status}"));
    }
    Ok(body.lines().find_map(|line| {
        let (k, v) = line.split_once(": ")?;
        (k == stat).then(|| v.trim().parse().ok()).flatten()
    }))
}

/// graceful_drain_phase: 0 serving, 1 closing, 2 drained.
const DRAINED: u64 = 2;

async fn prestop_admin(admin: &str, wait: &str) -> ExitCode {
    let Some(wait) = parse_wait(wait) else {
        eprintln!("prestop: bad wait {wait:?} (e.g. 25s)");
        return ExitCode::from(2);
    };
    match http("POST", admin, "/healthcheck/fail").await {
        Ok(200) => eprintln!("prestop: closing (POST /healthcheck/fail)"),
        Ok(status) => eprintln!("prestop: /healthcheck/fail answered {status}"),
        Err(e) => eprintln!("prestop: /healthcheck/fail: {e}"),
    }
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match admin_stat(admin, "graceful_drain_phase").await {
            Ok(Some(DRAINED)) => {
                let forced = admin_stat(admin, "graceful_drain_forced").await;
                let forced = matches!(forced, Ok(Some(n)) if n > 0);
                eprintln!(
                    "prestop: drained{}",
                    if forced { " (forced by a timeout)" } else { "" }
                );
                return ExitCode::SUCCESS;
            }
            Ok(None) => {
                eprintln!(
                    "prestop: graceful_drain is not loaded (no graceful_drain_phase): not waiting"
                );
                return ExitCode::SUCCESS;
            }
            Ok(Some(_)) => {}
            Err(e) => eprintln!("prestop: {e}"),
        }
        if tokio::time::Instant::now() >= deadline {
            eprintln!("prestop: not drained after {wait:?}");
            return ExitCode::FAILURE;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn ready_admin(admin: &str) -> ExitCode {
    match admin_stat(admin, "graceful_drain_phase").await {
        Ok(Some(0)) => ExitCode::SUCCESS,
        Ok(None) => {
            eprintln!("ready: graceful_drain is not loaded (no graceful_drain_phase): ready");
            ExitCode::SUCCESS
        }
        Ok(Some(phase)) => {
            eprintln!("ready: NOT_SERVING (graceful_drain_phase {phase})");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("ready: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `25s`, `1500ms` or `2m`.
fn parse_wait(text: &str) -> Option<Duration> {
    let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit())?);
    let n: u64 = number.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => Some(Duration::from_secs(n * 60)),
        _ => None,
    }
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
    let arg = |i: usize| args.get(i).map(String::as_str);
    match (arg(1), arg(2), arg(3)) {
        (Some("prestop"), Some("--admin"), Some(admin)) => {
            return prestop_admin(admin, arg(4).unwrap_or("25s")).await;
        }
        (Some("ready"), Some("--admin"), Some(admin)) => return ready_admin(admin).await,
        (Some("prestop"), Some(base), _) => return prestop(base, arg(3).unwrap_or("25s")).await,
        (Some("prestop" | "ready"), _, _) => return usage(),
        _ => {}
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
