//! `graceful-entrypoint`: PID 1 of a container, for platforms without
//! preStop hooks (Docker, Compose, Nomad, ECS): they send SIGTERM, wait a
//! grace period, then SIGKILL. Two shapes: a container that runs an Envoy
//! sidecar with graceful_drain and the app behind it, and a backend with no
//! sidecar behind front Envoys that run graceful_consumer's `front` section
//! (`envoy/front-proxy.yaml`; `docs/design/front-proxy-drain.md`, §5).
//!
//! ```text
//! graceful-entrypoint [--drain URL] [--wait 30s] [--stop-timeout 10s] \
//!     -- envoy -c /etc/envoy.yaml --- demo-app --listen 0.0.0.0:8080
//! graceful-entrypoint --front http://front1:19091 [--front URL]... [--front-resolve NAME:PORT]... \
//!     [--wait 30s] [--stop-timeout 10s] -- demo-app --listen 0.0.0.0:8080
//! ```
//!
//! Starts each command (`---` separates them) and then, on SIGTERM or
//! SIGINT, with a sidecar (no `--front`):
//!
//! | step | what | on failure |
//! |---|---|---|
//! | 1 | `POST URL/graceful/closing` (URL defaults to `http://127.0.0.1:15006`, an allowed source) | logged; step 2 still waits |
//! | 2 | `GET URL/graceful/drained?wait=WAIT`: the gate's long-poll, asked again until WAIT whatever an answer says | not drained by then: exit 1 after step 3 |
//! | 3 | SIGTERM to each command in the order given (Envoy first: once it is gone nothing reaches the app; then the app), each SIGKILLed after `--stop-timeout` | exit 1 |
//! | 4 | exit 0 if the gate passed quiet; 1 with one line saying why if it was forced, ran out, or a command had to be killed | |
//!
//! With no sidecar (`--front URL` and `--front-resolve NAME:PORT`, each
//! repeatable, at least one; not with `--drain`), the fronts' control
//! listeners (port 19091 in `envoy/front-proxy.yaml`), which must see this
//! container's own address as the caller (one Compose network: they do):
//!
//! | step | what | on failure |
//! |---|---|---|
//! | 0 | once the commands have run 0.5 s: `POST /graceful/front/serving` to each front (every address of each NAME), so a container restarted on its address gets its share back at once instead of after the front's `closing_ttl` | logged; a front that does not answer has nothing to lift |
//! | 1 | on SIGTERM: `graceful-hook front`'s sequence (the same code, its library): `POST /graceful/front/closing` to every front, long-polls of `GET /graceful/front/drained` until each acknowledged (its requests to us ended), names re-resolved every second; its one line on stdout (`graceful-hook front: 2 of 2 fronts acknowledged in 2.6s (...)`) | not every front by WAIT: the line names each, exit 1 after step 2; no front answered at all: at once (fail open) |
//! | 2 | SIGTERM to each command in the order given, each SIGKILLed after `--stop-timeout` | exit 1 |
//! | 3 | exit 0 if every front told acknowledged (or none answered); 1 with one line saying why otherwise | |
//!
//! A command that exits on its own stops the others; the entrypoint then
//! exits with its code (1 if it died by a signal). Set the platform's grace
//! period above `WAIT` + `--stop-timeout` (Compose: `stop_grace_period`).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

const USAGE: &str = "usage: graceful-entrypoint [--drain http://127.0.0.1:15006] [--wait 30s] [--stop-timeout 10s] -- CMD [ARGS..] [--- CMD [ARGS..]]..\n       graceful-entrypoint --front http://FRONT:19091 [--front URL].. [--front-resolve NAME:PORT].. [--wait 30s] [--stop-timeout 10s] -- CMD [ARGS..] [--- CMD [ARGS..]]..";

const DEFAULT_DRAIN: &str = "http://127.0.0.1:15006";
/// How long the commands run before step 0 tells the fronts `serving`.
const SERVING_AFTER: Duration = Duration::from_millis(500);

#[derive(Debug)]
struct Options {
    drain: String,
    /// `--front` and `--front-resolve`, as `graceful-hook front` takes them
    /// (its `--wait` is ours): Some for a backend with no sidecar.
    front: Option<graceful_hook::Front>,
    wait: Duration,
    stop_timeout: Duration,
    commands: Vec<Vec<String>>,
}

/// `25s`, `1500ms` or `2m`.
fn parse_duration(text: &str) -> Option<Duration> {
    let at = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(at);
    let n: u64 = number.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => Some(Duration::from_secs(n.checked_mul(60)?)),
        _ => None,
    }
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        drain: DEFAULT_DRAIN.into(),
        front: None,
        wait: Duration::from_secs(30),
        stop_timeout: Duration::from_secs(10),
        commands: Vec::new(),
    };
    // graceful-hook front's own arguments, checked by its own parser.
    let mut front_args: Vec<String> = vec!["front".into()];
    let mut drain_given = false;
    let mut i = 0;
    while i < args.len() {
        let flag = args[i].as_str();
        if flag == "--" {
            i += 1;
            break;
        }
        let value = args
            .get(i + 1)
            .ok_or_else(|| format!("{flag} needs a value"))?;
        match flag {
            "--drain" => {
                if !value.starts_with("http://") {
                    return Err(format!("--drain {value:?}: must start with http://"));
                }
                o.drain = value.trim_end_matches('/').to_string();
                drain_given = true;
            }
            "--front" => front_args.extend(["--front".into(), value.clone()]),
            "--front-resolve" => front_args.extend(["--resolve".into(), value.clone()]),
            "--wait" => {
                o.wait = parse_duration(value)
                    .ok_or_else(|| format!("--wait {value:?}: e.g. 30s, 1500ms, 2m"))?
            }
            "--stop-timeout" => {
                o.stop_timeout = parse_duration(value)
                    .ok_or_else(|| format!("--stop-timeout {value:?}: e.g. 10s"))?
            }
            other => return Err(format!("unknown flag {other:?}")),
        }
        i += 2;
    }
    if args[i..].is_empty() {
        return Err("no command after --".into());
    }
    for part in args[i..].split(|a| a == "---") {
        if part.is_empty() {
            return Err("an empty command".into());
        }
        o.commands.push(part.to_vec());
    }
    if o.commands.is_empty() {
        return Err("no command after --".into());
    }
    if front_args.len() > 1 {
        if drain_given {
            return Err(
                "--drain with --front: a container has a sidecar (--drain) or none (--front)"
                    .into(),
            );
        }
        match graceful_hook::parse(&front_args) {
            Ok(graceful_hook::Hook::Front(mut front)) => {
                front.wait = o.wait;
                o.front = Some(front);
            }
            // Its messages name its flags: --resolve is our --front-resolve.
            Err(e) => return Err(e.replace("--resolve", "--front-resolve")),
            Ok(other) => return Err(format!("not a front: {other:?}")),
        }
    }
    Ok(o)
}

/// One HTTP/1.1 request on a fresh connection: (status, body).
async fn http(
    method: &str,
    base: &str,
    path: &str,
    timeout: Duration,
) -> Result<(u16, String), String> {
    let authority = base.strip_prefix("http://").unwrap_or(base);
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(authority)
            .await
            .map_err(|e| format!("{authority}: {e}"))?;
        let request = format!(
            "{method} {path} HTTP/1.1\r\nhost: {authority}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        );
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        // Up to the end of the body its content-length names: Envoy keeps
        // a `connection: close` connection open for about a second after
        // the answer, so reading to the end would wait for that.
        let mut answer = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            if answer_complete(&answer) {
                break;
            }
            let n = stream.read(&mut chunk).await.map_err(|e| e.to_string())?;
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&chunk[..n]);
        }
        let answer = String::from_utf8_lossy(&answer).into_owned();
        let status = answer
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("no status in {answer:?}"))?;
        let body = answer
            .split_once("\r\n\r\n")
            .map_or("", |(_, b)| b)
            .to_string();
        Ok((status, body))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("no answer from {authority} within {timeout:?}"))?
}

/// True once `answer` holds its headers and as many body bytes as its
/// `content-length` says (without one, the answer ends with the
/// connection).
fn answer_complete(answer: &[u8]) -> bool {
    let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&answer[..end]).to_ascii_lowercase();
    head.lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .is_some_and(|len| answer.len() >= end + 4 + len)
}

fn log(line: &str) {
    eprintln!("graceful-entrypoint: {line}");
}

/// SIGTERM to one child (std and tokio can only SIGKILL).
fn terminate(child: &Child) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        // SAFETY: kill(2) with a pid this process spawned and has not
        // reaped (tokio reaps on wait): no memory is touched.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
}

/// Steps 1–2: true when the gate passed quiet.
async fn drain(o: &Options) -> bool {
    let started = Instant::now();
    log(&format!("SIGTERM: closing through {}", o.drain));
    match http(
        "POST",
        &o.drain,
        "/graceful/closing",
        Duration::from_secs(5),
    )
    .await
    {
        Ok((202, _)) => log("closing"),
        Ok((status, body)) => log(&format!(
            "POST /graceful/closing answered {status}: {}",
            body.trim()
        )),
        Err(e) => log(&format!("POST /graceful/closing: {e}")),
    }
    // The gate's long poll, asked again until this deadline whatever an
    // answer says (a 429 or 503 is a reason to poll again, never to stop
    // early): the orchestrator's grace period is what ends it.
    let deadline = started + o.wait;
    let mut last = String::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let wait_ms = left.as_millis().max(1);
        let path = format!("/graceful/drained?wait={wait_ms}ms");
        let said = match http("GET", &o.drain, &path, left + Duration::from_secs(5)).await {
            Ok((200, body)) => {
                let forced = serde_json::from_str::<serde_json::Value>(body.trim())
                    .ok()
                    .and_then(|v| v.get("forced").and_then(serde_json::Value::as_bool))
                    .unwrap_or(true);
                let ms = started.elapsed().as_millis();
                if forced {
                    log(&format!("drained after {ms} ms, FORCED: a drain timeout passed the gate with requests in flight"));
                } else {
                    log(&format!("drained after {ms} ms"));
                }
                return !forced;
            }
            Ok((status, body)) => format!("answer {status}: {}", body.trim()),
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            log(&format!("NOT DRAINED after {}s ({said})", o.wait.as_secs()));
            return false;
        }
        if said != last {
            log(&format!("drained not yet ({said}): asking again"));
            last = said;
        }
        tokio::time::sleep(Duration::from_millis(200).min(left)).await;
    }
}

/// No sidecar, step 1: `graceful-hook front`'s run (it prints its one
/// line); true when every front told acknowledged, or none answered.
async fn tell_fronts(front: &graceful_hook::Front) -> bool {
    let named: Vec<&str> = front
        .fronts
        .iter()
        .chain(&front.resolve)
        .map(String::as_str)
        .collect();
    log(&format!(
        "SIGTERM: telling the fronts {} (waiting {}s at most)",
        named.join(", "),
        front.wait.as_secs_f64()
    ));
    let hook = graceful_hook::Hook::Front(front.clone());
    tokio::task::spawn_blocking(move || graceful_hook::run(&hook) == ExitCode::SUCCESS)
        .await
        .unwrap_or(false)
}

/// Every front's base URL for step 0: each `--front`, and every address
/// each `--front-resolve` name has now.
async fn front_urls(front: &graceful_hook::Front) -> Vec<String> {
    let mut urls: Vec<String> = front
        .fronts
        .iter()
        .map(|u| u.trim_end_matches('/').to_string())
        .collect();
    for name in &front.resolve {
        match tokio::net::lookup_host(name.as_str()).await {
            Ok(addrs) => urls.extend(addrs.map(|a| format!("http://{a}"))),
            Err(e) => log(&format!("serving: {name}: {e}")),
        }
    }
    urls
}

/// No sidecar, step 0: `POST /graceful/front/serving` to every front, one
/// line each. A front lifts only the caller's own closing, so this is
/// harmless on a first start (nothing to lift).
async fn serving(front: &graceful_hook::Front) {
    for url in front_urls(front).await {
        let said = match http(
            "POST",
            &url,
            "/graceful/front/serving",
            Duration::from_secs(2),
        )
        .await
        {
            Ok((status, body)) => {
                let body = body.trim();
                if body.is_empty() || body.len() > 120 {
                    format!("{status}")
                } else {
                    format!("{status} {body}")
                }
            }
            // Nothing listens (a front not up yet): nothing to lift there.
            Err(e) => format!("no answer ({e})"),
        };
        log(&format!("{url}: serving: {said}"));
    }
}

/// Step 3: true when every command stopped within the timeout.
async fn stop_all(children: &mut [(String, Child)], timeout: Duration) -> bool {
    let mut clean = true;
    for (name, child) in children.iter_mut() {
        if matches!(child.try_wait(), Ok(Some(_))) {
            continue;
        }
        terminate(child);
        match tokio::time::timeout(timeout, child.wait()).await {
            Ok(Ok(status)) => log(&format!("{name} stopped ({status})")),
            Ok(Err(e)) => {
                log(&format!("{name}: {e}"));
                clean = false;
            }
            Err(_) => {
                log(&format!("{name} still running after {timeout:?}: killed"));
                let _ = child.kill().await;
                clean = false;
            }
        }
    }
    clean
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let o = match parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("graceful-entrypoint: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        log("cannot install signal handlers");
        return ExitCode::from(2);
    };
    let mut children: Vec<(String, Child)> = Vec::new();
    for command in &o.commands {
        match Command::new(&command[0]).args(&command[1..]).spawn() {
            Ok(child) => children.push((command[0].clone(), child)),
            Err(e) => {
                log(&format!("cannot start {}: {e}", command[0]));
                stop_all(&mut children, o.stop_timeout).await;
                return ExitCode::from(1);
            }
        }
    }
    log(&format!(
        "started {}",
        o.commands
            .iter()
            .map(|c| c[0].as_str())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    // Either a signal, or a command exiting on its own.
    let exited = async {
        loop {
            for (i, (_, child)) in children.iter_mut().enumerate() {
                if let Ok(Some(status)) = child.try_wait() {
                    return (i, status);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    // No sidecar, step 0: tell the fronts this address serves again; then
    // nothing more until a signal.
    let step0 = async {
        if let Some(front) = &o.front {
            tokio::time::sleep(SERVING_AFTER).await;
            serving(front).await;
        }
        std::future::pending::<()>().await
    };
    let outcome = tokio::select! {
        _ = step0 => None,
        _ = term.recv() => None,
        _ = int.recv() => None,
        (i, status) = exited => Some((i, status)),
    };
    if let Some((i, status)) = outcome {
        let name = children[i].0.clone();
        log(&format!(
            "{name} exited on its own ({status}): stopping the others"
        ));
        stop_all(&mut children, o.stop_timeout).await;
        return ExitCode::from(
            status
                .code()
                .and_then(|c| u8::try_from(c).ok())
                .filter(|&c| c != 0)
                .unwrap_or(1),
        );
    }
    let quiet = match &o.front {
        Some(front) => tell_fronts(front).await,
        None => drain(&o).await,
    };
    // Envoy first (it takes no new requests once gone), then the app.
    let stopped = stop_all(&mut children, o.stop_timeout).await;
    match (quiet, stopped) {
        (true, true) => {
            log("exit 0");
            ExitCode::SUCCESS
        }
        (false, _) if o.front.is_some() => {
            log("exit 1: not every front acknowledged (see the line above)");
            ExitCode::from(1)
        }
        (false, _) => {
            log("exit 1: the drain gate did not pass quiet (see above)");
            ExitCode::from(1)
        }
        (true, false) => {
            log("exit 1: a command had to be killed");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn an_answer_is_complete_at_its_content_length() {
        assert!(!answer_complete(
            b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n"
        ));
        assert!(!answer_complete(
            b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nab"
        ));
        assert!(answer_complete(
            b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nabcd"
        ));
        assert!(
            !answer_complete(b"HTTP/1.1 200 OK\r\n\r\nabcd"),
            "no length: to the connection's end"
        );
    }

    #[test]
    fn it_parses_flags_and_commands() {
        let o = parse(&args(
            "--wait 5s --drain http://h:1/ -- envoy -c x --- app --listen y",
        ))
        .unwrap();
        assert_eq!(o.wait, Duration::from_secs(5));
        assert_eq!(o.drain, "http://h:1");
        assert_eq!(o.commands, vec![args("envoy -c x"), args("app --listen y")]);
    }

    #[test]
    fn with_no_sidecar_it_takes_fronts_and_names_to_resolve() {
        let o = parse(&args(
            "--front http://front1:19091 --wait 20s --front http://10.0.0.2:19091/ --front-resolve fronts:19091 -- demo-app --listen 0.0.0.0:8080",
        ))
        .unwrap();
        let front = o.front.expect("the front shape");
        assert_eq!(
            front.fronts,
            ["http://front1:19091", "http://10.0.0.2:19091/"]
        );
        assert_eq!(front.resolve, ["fronts:19091"]);
        assert_eq!(
            front.wait,
            Duration::from_secs(20),
            "the entrypoint's --wait"
        );
        assert_eq!(front.settle, Duration::ZERO);
        assert_eq!(front.source, None);
        assert_eq!(o.commands, vec![args("demo-app --listen 0.0.0.0:8080")]);
        // Whatever the order of --wait and the fronts.
        let o = parse(&args("--front-resolve fronts:19091 --wait 7s -- app")).unwrap();
        let front = o.front.unwrap();
        assert!(front.fronts.is_empty());
        assert_eq!(front.wait, Duration::from_secs(7));
        // The default wait, and no front: the sidecar shape.
        let front = parse(&args("--front http://f:1 -- app"))
            .unwrap()
            .front
            .unwrap();
        assert_eq!(front.wait, Duration::from_secs(30));
        let o = parse(&args("-- envoy --- app")).unwrap();
        assert!(o.front.is_none());
        assert_eq!(o.drain, DEFAULT_DRAIN);
    }

    #[test]
    fn it_refuses_bad_fronts_and_names_the_flag() {
        let e = parse(&args("--front front1:19091 -- a")).unwrap_err();
        assert!(e.starts_with("--front ") && e.contains("http://"), "{e}");
        let e = parse(&args("--front http://f:1/graceful -- a")).unwrap_err();
        assert!(e.starts_with("--front "), "{e}");
        let e = parse(&args("--front-resolve fronts -- a")).unwrap_err();
        assert!(
            e.starts_with("--front-resolve ") && e.contains("NAME:PORT"),
            "{e}"
        );
        let e = parse(&args("--front-resolve fronts:0 -- a")).unwrap_err();
        assert!(e.starts_with("--front-resolve "), "{e}");
        let e = parse(&args("--front-resolve :19091 -- a")).unwrap_err();
        assert!(e.starts_with("--front-resolve "), "{e}");
        let e = parse(&args(
            "--drain http://127.0.0.1:15006 --front http://f:1 -- a",
        ))
        .unwrap_err();
        assert!(e.contains("--drain with --front"), "{e}");
        let e = parse(&args("--front")).unwrap_err();
        assert!(e.contains("--front needs a value"), "{e}");
        assert!(parse(&args("--front http://f:1 --"))
            .unwrap_err()
            .contains("no command"));
    }

    #[test]
    fn it_refuses_bad_input_and_names_it() {
        assert!(parse(&args("--wait soon -- a"))
            .unwrap_err()
            .contains("--wait"));
        assert!(parse(&args("--drain h:1 -- a"))
            .unwrap_err()
            .contains("--drain"));
        assert!(parse(&args("--")).unwrap_err().contains("no command"));
        assert!(parse(&args("-- a ---")).unwrap_err().contains("empty"));
        assert!(parse(&args("-- --- b")).unwrap_err().contains("empty"));
        assert!(parse(&args("--bogus 1 -- a"))
            .unwrap_err()
            .contains("--bogus"));
    }
}
