//! `graceful-hook`: the Kubernetes preStop hook and exec readiness probe of
//! a pod whose sidecar runs graceful_drain, as one static binary with no
//! shell, no curl and no libc of the image's (distroless proxies, `FROM
//! scratch` apps). `graceful-hook install DIR` copies it into a volume the
//! pod's containers share.
//!
//! ```text
//! graceful-hook ready   [--admin URL]...             exec readiness probe
//! graceful-hook prestop [--admin URL]... [WAIT]      preStop through Envoy's admin
//! graceful-hook prestop http://SIDECAR:PORT [WAIT]   preStop through graceful_drain's listener
//! graceful-hook install DIR                          copy this binary to DIR/graceful-hook
//! graceful-hook front [--resolve NAME:PORT]... [--front http://IP:PORT]... [--wait 25s] [--settle 0s] [--source IP]
//!                                                    preStop of a backend with no sidecar
//! ```
//!
//! `front` is the acknowledged drain behind fronts that run
//! graceful_consumer's `front` section: see [`front`] for its
//! table.
//!
//! Through the admin (Istio's sidecar, where no hook reaches a listener):
//! `POST /healthcheck/fail` starts closing (graceful_drain polls the admin
//! through its `admin_cluster`), and the `graceful_drain_phase` gauge (0
//! serving, 1 closing, 2 drained) says when the gate passed. Each `--admin`
//! is tried in order and the first that accepts a connection is used; the
//! default is Istio's two spellings of the admin, `http://127.0.0.1:15000`
//! and `http://[::1]:15000` (IPv6-only and IPv6-first dual-stack pods get
//! the latter, `pkg/bootstrap/config.go`).
//!
//! Both fail open, with one line saying why: no admin accepts a connection
//! (no sidecar was injected: the namespace is not labelled, an ambient
//! namespace), the admin answers but graceful_drain is not loaded (no
//! gauge), or the admin's answer cannot be read. A shutdown helper never
//! keeps a pod from becoming ready and never holds one that has nothing
//! to drain.
//!
//! | command | the phase reads | exit |
//! |---|---|---|
//! | `ready` | 0, or no gauge, or no admin, or unreadable | 0 (ready) |
//! | `ready` | Envoy's own `/ready` says it is still starting (`PRE_INITIALIZING`, `INITIALIZING`: its listeners and filters are not up, so no gauge yet) | 1 (not ready yet) |
//! | `ready --require-admin` | no admin, or an admin that does not answer (Envoy in the same container, not up yet) | 1 |
//! | `ready` | 1 or 2 | 1 (not ready: closing) |
//! | `prestop` | 2 (drained) | 0, says whether a timeout forced it |
//! | `prestop` | no gauge, or no admin | 0 at once |
//! | `prestop` | not 2 within WAIT (default 25s) | 1 |
//! | `prestop URL` | `drained` answers 200 | 0 |
//! | `prestop URL` | any other answer (429, 503, garbage): asks again until WAIT | 1 at WAIT |
//! | `prestop URL` | nothing listens at URL | 0 at once |
//! | `front` | every front told acknowledged | 0 |
//! | `front` | not all by `--wait` | 1, naming each front that did not |
//! | `front` | no front answered (nothing listens, DNS empty) | 0 at once |

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use graceful_core::shared::duration::{format_duration, parse_duration};

pub mod front;
pub use front::{Front, Resolve, SystemResolver};

/// Where Istio's bootstrap puts Envoy's admin (`{{ .localhost }}`).
pub const DEFAULT_ADMINS: [&str; 2] = ["http://127.0.0.1:15000", "http://[::1]:15000"];

/// graceful_drain_phase: 0 serving, 1 closing, 2 drained.
const DRAINED: u64 = 2;
const DEFAULT_WAIT: Duration = Duration::from_secs(25);
/// One admin request's budget: the admin answers in milliseconds; a probe
/// has its own timeout (1 s by default) to stay under.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(800);
const POLL: Duration = Duration::from_millis(200);

/// What a command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hook {
    Ready {
        admins: Vec<String>,
        /// Not ready while no admin answers: where Envoy runs in the same
        /// container (Docker, Compose), nothing else says it is up yet.
        require_admin: bool,
    },
    PrestopAdmin {
        admins: Vec<String>,
        wait: Duration,
    },
    /// graceful_drain's own endpoints on a listener the hook can reach.
    PrestopSidecar {
        base: String,
        wait: Duration,
    },
    Install {
        dir: String,
    },
    /// The acknowledged drain of a backend with no sidecar.
    Front(Front),
}

pub const USAGE: &str = "usage: graceful-hook ready [--admin URL]... [--require-admin]\n       graceful-hook prestop [--admin URL]... [WAIT]\n       graceful-hook prestop http://SIDECAR:PORT [WAIT]\n       graceful-hook install DIR\n       graceful-hook front [--resolve NAME:PORT]... [--front http://IP:PORT]... [--wait 25s] [--settle 0s] [--source IP]";

/// Parses the arguments after the program name.
pub fn parse(args: &[String]) -> Result<Hook, String> {
    let (command, rest) = args.split_first().ok_or("no command")?;
    if command == "front" {
        return front::parse(rest).map(Hook::Front);
    }
    let mut admins = Vec::new();
    let mut positional = Vec::new();
    let mut require_admin = false;
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        if a == "--require-admin" && command == "ready" {
            require_admin = true;
        } else if a == "--admin" {
            let url = it.next().ok_or("--admin needs a URL")?;
            authority(url)?;
            admins.push(url.clone());
        } else if a.starts_with("--") {
            return Err(format!("unknown flag {a}"));
        } else {
            positional.push(a.clone());
        }
    }
    let wait = |text: Option<&String>| match text {
        None => Ok(DEFAULT_WAIT),
        Some(t) => parse_duration(t).map_err(|e| format!("WAIT: {e}")),
    };
    let defaults = |admins: Vec<String>| {
        if admins.is_empty() {
            DEFAULT_ADMINS.iter().map(|a| a.to_string()).collect()
        } else {
            admins
        }
    };
    match command.as_str() {
        "ready" if positional.is_empty() => Ok(Hook::Ready {
            admins: defaults(admins),
            require_admin,
        }),
        "prestop" if admins.is_empty() && positional.first().is_some_and(|p| p.contains("://")) => {
            authority(&positional[0])?;
            if positional.len() > 2 {
                return Err("prestop takes a URL and at most a WAIT".into());
            }
            Ok(Hook::PrestopSidecar {
                base: positional[0].clone(),
                wait: wait(positional.get(1))?,
            })
        }
        "prestop" if positional.len() <= 1 => Ok(Hook::PrestopAdmin {
            admins: defaults(admins),
            wait: wait(positional.first())?,
        }),
        "install" if admins.is_empty() && positional.len() == 1 => Ok(Hook::Install {
            dir: positional[0].clone(),
        }),
        "ready" | "prestop" | "install" => Err(format!("bad arguments for {command}")),
        other => Err(format!("unknown command {other:?}")),
    }
}

/// Runs a parsed hook; its lines start with the command (`ready:`,
/// `prestop:`, `install:`; `front`'s with `graceful-hook front:`).
pub fn run(hook: &Hook) -> ExitCode {
    match hook {
        Hook::Ready {
            admins,
            require_admin,
        } => ready(admins, *require_admin),
        Hook::PrestopAdmin { admins, wait } => prestop_admin(admins, *wait),
        Hook::PrestopSidecar { base, wait } => prestop_sidecar(base, *wait),
        Hook::Install { dir } => install(dir),
        Hook::Front(args) => front::front(args),
    }
}

/// `http://HOST:PORT` without the scheme; IPv6 in brackets.
fn authority(url: &str) -> Result<&str, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url}: the URL must start with http://"))?;
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() || rest.contains('/') {
        return Err(format!("{url}: expected http://HOST:PORT"));
    }
    Ok(rest)
}

/// Why an admin request failed: nothing listens there, or something does
/// and its answer was not usable.
#[derive(Debug)]
enum Failure {
    Unreachable(String),
    Answer(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Unreachable(why) | Failure::Answer(why) => f.write_str(why),
        }
    }
}

/// One HTTP/1.1 request on a fresh connection, its answer read within
/// `read_budget`: (status, body).
fn http(
    method: &str,
    url: &str,
    path: &str,
    read_budget: Duration,
) -> Result<(u16, String), Failure> {
    let authority = authority(url).map_err(Failure::Unreachable)?;
    let addrs: Vec<SocketAddr> = authority
        .to_socket_addrs()
        .map_err(|e| Failure::Unreachable(format!("{authority}: {e}")))?
        .collect();
    let stream = addrs
        .iter()
        .find_map(|a| TcpStream::connect_timeout(a, REQUEST_TIMEOUT).ok())
        .ok_or_else(|| Failure::Unreachable(format!("{authority}: no connection")))?;
    request_on(stream, method, authority, path, read_budget)
}

/// One request on a connected `stream` (`connection: close`), its answer
/// read to its end within `read_budget`: (status, body).
pub(crate) fn request_on(
    mut stream: TcpStream,
    method: &str,
    authority: &str,
    path: &str,
    read_budget: Duration,
) -> Result<(u16, String), Failure> {
    let answer = (|| -> std::io::Result<Vec<u8>> {
        stream.set_read_timeout(Some(read_budget))?;
        stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
        let request = format!(
            "{method} {path} HTTP/1.1\r\nhost: {authority}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes())?;
        // Up to the end of the answer's body, not to the connection's end:
        // Envoy keeps a connection it answered with `connection: close`
        // open for its delayed_close_timeout (1 s by default), longer than
        // a request's budget.
        let mut answer = Vec::new();
        let mut buf = [0u8; 4096];
        while !answer_complete(&answer) {
            let n = stream.read(&mut buf)?;
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&buf[..n]);
        }
        Ok(answer)
    })()
    .map_err(|e| Failure::Answer(format!("{authority}: {e}")))?;
    let answer = String::from_utf8_lossy(&answer);
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| Failure::Answer(format!("{authority}: no HTTP status in the answer")))?;
    let body = answer
        .split_once("\r\n\r\n")
        .map_or("", |(_, body)| body)
        .to_string();
    Ok((status, body))
}

/// Whether `answer` holds a whole HTTP/1.1 answer: its head and as many
/// body bytes as its `content-length` says. Without one the body ends with
/// the connection.
fn answer_complete(answer: &[u8]) -> bool {
    let Some(head_end) = answer.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&answer[..head_end]);
    let length = head.lines().skip(1).find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse::<usize>().ok())?
    });
    length.is_some_and(|n| answer.len() - (head_end + 4) >= n)
}

/// A custom stat of the filters as Envoy's admin lists it
/// (`wasmcustom.NAME: VALUE`); None when absent (the filter is not loaded).
fn admin_stat(admin: &str, name: &str) -> Result<Option<u64>, Failure> {
    let stat = format!("wasmcustom.{name}");
    let (status, body) = http(
        "GET",
        admin,
        &format!("/stats?filter=^{stat}$"),
        REQUEST_TIMEOUT,
    )?;
    if status != 200 {
        return Err(Failure::Answer(format!("admin /stats answered {status}")));
    }
    Ok(read_stat(&body, &stat))
}

/// `NAME: VALUE` in an admin `/stats` text answer.
fn read_stat(body: &str, stat: &str) -> Option<u64> {
    body.lines().find_map(|line| {
        let (k, v) = line.split_once(": ")?;
        (k == stat).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The first admin that accepts a connection, with its phase reading.
fn find_admin(admins: &[String]) -> Option<(String, Result<Option<u64>, Failure>)> {
    admins
        .iter()
        .find_map(|a| match admin_stat(a, "graceful_drain_phase") {
            Err(Failure::Unreachable(_)) => None,
            read => Some((a.clone(), read)),
        })
}

fn no_admin(admins: &[String]) -> String {
    format!(
        "no Envoy admin at {} (no sidecar in this pod?)",
        admins.join(" or ")
    )
}

/// Envoy's start-up state when its admin's `/ready` says it is still
/// starting (503 `PRE_INITIALIZING` or `INITIALIZING`); None otherwise
/// (`LIVE`, `DRAINING`, or an answer not to act on).
fn starting(status: u16, body: &str) -> Option<&str> {
    let state = body.trim();
    (status == 503 && matches!(state, "PRE_INITIALIZING" | "INITIALIZING")).then_some(state)
}

fn ready(admins: &[String], require_admin: bool) -> ExitCode {
    let found = find_admin(admins);
    // An Envoy still starting has no listener and no filter yet: the
    // missing gauge says nothing about graceful_drain, and traffic sent now
    // is refused. Not ready until it is up (Istio's own probe waits for it
    // too); an unreadable /ready fails open below.
    if let Some((admin, _)) = &found {
        if let Ok((status, body)) = http("GET", admin, "/ready", REQUEST_TIMEOUT) {
            if let Some(state) = starting(status, &body) {
                eprintln!("ready: Envoy at {admin} is {state}: not ready yet");
                return ExitCode::FAILURE;
            }
        }
    }
    match found {
        None if require_admin => {
            eprintln!(
                "ready: no Envoy admin at {} yet: not ready",
                admins.join(" or ")
            );
            ExitCode::FAILURE
        }
        None => {
            eprintln!("ready: {}: ready", no_admin(admins));
            ExitCode::SUCCESS
        }
        Some((_, Ok(Some(0)))) => ExitCode::SUCCESS,
        Some((admin, Ok(None))) => {
            eprintln!(
                "ready: graceful_drain is not loaded (no graceful_drain_phase at {admin}): ready"
            );
            ExitCode::SUCCESS
        }
        Some((_, Ok(Some(phase)))) => {
            eprintln!("ready: NOT_SERVING (graceful_drain_phase {phase})");
            ExitCode::FAILURE
        }
        // Envoy in the same container (--require-admin): an admin that
        // takes the connection but does not answer is an Envoy busy
        // starting (its main thread compiles the filters).
        Some((admin, Err(e))) if require_admin => {
            eprintln!("ready: {admin}: {e}: not ready yet");
            ExitCode::FAILURE
        }
        Some((admin, Err(e))) => {
            eprintln!("ready: {admin}: {e}: ready (failing open)");
            ExitCode::SUCCESS
        }
    }
}

fn prestop_admin(admins: &[String], wait: Duration) -> ExitCode {
    let admin = match find_admin(admins) {
        None => {
            eprintln!("prestop: {}: not waiting", no_admin(admins));
            return ExitCode::SUCCESS;
        }
        Some((admin, Ok(None))) => {
            eprintln!(
                "prestop: graceful_drain is not loaded (no graceful_drain_phase at {admin}): not waiting"
            );
            return ExitCode::SUCCESS;
        }
        Some((admin, _)) => admin,
    };
    match http("POST", &admin, "/healthcheck/fail", REQUEST_TIMEOUT) {
        Ok((200, _)) => eprintln!("prestop: closing (POST {admin}/healthcheck/fail)"),
        Ok((status, _)) => eprintln!("prestop: /healthcheck/fail answered {status}"),
        Err(e) => eprintln!("prestop: /healthcheck/fail: {e}"),
    }
    let deadline = Instant::now() + wait;
    loop {
        match admin_stat(&admin, "graceful_drain_phase") {
            Ok(Some(DRAINED)) => {
                let forced =
                    matches!(admin_stat(&admin, "graceful_drain_forced"), Ok(Some(n)) if n > 0);
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
        if Instant::now() >= deadline {
            eprintln!("prestop: not drained after {wait:?}");
            return ExitCode::FAILURE;
        }
        std::thread::sleep(POLL);
    }
}

/// Starts closing, then waits for the gate until its own deadline
/// whatever an answer says: a 429 (every waiter slot held), a 503 (the
/// long poll's own wait ran out, or a proxy answered for the sidecar) or a
/// broken answer is a reason to ask again, never to exit early. Only
/// nothing listening at all (no sidecar, or one already gone) ends it at
/// once: there is nothing to drain through it.
fn prestop_sidecar(base: &str, wait: Duration) -> ExitCode {
    prestop_sidecar_with(base, wait, POLL)
}

fn prestop_sidecar_with(base: &str, wait: Duration, poll: Duration) -> ExitCode {
    let deadline = Instant::now() + wait;
    let mut closing = false;
    let mut last_said = String::new();
    // One line per change of answer, not one per poll.
    let mut say = |line: String| {
        if line != last_said {
            eprintln!("{line}");
            last_said = line;
        }
    };
    loop {
        if !closing {
            match http("POST", base, "/graceful/closing", REQUEST_TIMEOUT) {
                Ok((202, _)) => {
                    eprintln!("prestop: closing (POST {base}/graceful/closing)");
                    closing = true;
                }
                Ok((status, _)) => say(format!("prestop: closing answered {status}")),
                Err(Failure::Unreachable(e)) => {
                    eprintln!("prestop: {e}: nothing to drain, not waiting");
                    return ExitCode::SUCCESS;
                }
                Err(e) => say(format!("prestop: closing: {e}")),
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            eprintln!("prestop: not drained after {}", format_duration(wait));
            return ExitCode::FAILURE;
        }
        // The gate's long poll: 200 once the gate passes, 503 at its wait.
        let path = format!("/graceful/drained?wait={}", format_duration(left));
        match http("GET", base, &path, left + Duration::from_secs(5)) {
            Ok((200, _)) => {
                eprintln!("prestop: drained");
                return ExitCode::SUCCESS;
            }
            Ok((status, _)) => say(format!("prestop: drained answered {status}: asking again")),
            Err(Failure::Unreachable(e)) => {
                eprintln!("prestop: {e}: the sidecar is gone, not waiting");
                return ExitCode::SUCCESS;
            }
            Err(e) => say(format!("prestop: drained: {e}: asking again")),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        std::thread::sleep(poll.min(left));
    }
}

/// Copies the running binary to `DIR/graceful-hook` (an image without `cp`
/// can still hand it to the pod's other containers through a volume).
fn install(dir: &str) -> ExitCode {
    let to = std::path::Path::new(dir).join("graceful-hook");
    let copied = std::env::current_exe().and_then(|from| std::fs::copy(from, &to));
    match copied {
        Ok(_) => {
            eprintln!("install: {}", to.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("install: {}: {e}", to.display());
            ExitCode::FAILURE
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
    fn it_parses_each_command_with_istios_admins_by_default() {
        let defaults: Vec<String> = DEFAULT_ADMINS.iter().map(|a| a.to_string()).collect();
        assert_eq!(
            parse(&args("ready")),
            Ok(Hook::Ready {
                admins: defaults.clone(),
                require_admin: false
            })
        );
        assert_eq!(
            parse(&args("prestop 30s")),
            Ok(Hook::PrestopAdmin {
                admins: defaults,
                wait: Duration::from_secs(30)
            })
        );
        assert_eq!(
            parse(&args(
                "prestop --admin http://[::1]:9901 --admin http://127.0.0.1:9901"
            )),
            Ok(Hook::PrestopAdmin {
                admins: vec!["http://[::1]:9901".into(), "http://127.0.0.1:9901".into()],
                wait: DEFAULT_WAIT
            })
        );
        assert_eq!(
            parse(&args("prestop http://127.0.0.1:15006 1m")),
            Ok(Hook::PrestopSidecar {
                base: "http://127.0.0.1:15006".into(),
                wait: Duration::from_secs(60)
            })
        );
        assert_eq!(
            parse(&args("install /graceful")),
            Ok(Hook::Install {
                dir: "/graceful".into()
            })
        );
    }

    #[test]
    fn it_refuses_bad_arguments_and_names_them() {
        for (line, says) in [
            ("", "no command"),
            ("sleep 5", "unknown command"),
            ("ready --admin", "--admin needs a URL"),
            ("ready --admin 127.0.0.1:15000", "must start with http://"),
            (
                "ready --admin http://127.0.0.1:15000/stats",
                "expected http://HOST:PORT",
            ),
            ("ready --verbose", "unknown flag"),
            ("prestop --require-admin", "unknown flag"),
            ("ready 5s", "bad arguments for ready"),
            ("prestop 5", "WAIT"),
            ("prestop http://127.0.0.1:15006 5s extra", "at most a WAIT"),
            ("install", "bad arguments for install"),
        ] {
            let e = parse(&args(line)).expect_err(line);
            assert!(e.contains(says), "{line:?}: {e}");
        }
    }

    #[test]
    fn it_reads_a_stat_line_and_nothing_else() {
        let body = "wasmcustom.graceful_drain_phase_x: 7\nwasmcustom.graceful_drain_phase: 2\n";
        assert_eq!(read_stat(body, "wasmcustom.graceful_drain_phase"), Some(2));
        assert_eq!(read_stat("", "wasmcustom.graceful_drain_phase"), None);
        assert_eq!(
            read_stat(
                "wasmcustom.graceful_drain_phase: x",
                "wasmcustom.graceful_drain_phase"
            ),
            None
        );
    }

    #[test]
    fn it_fails_open_when_no_admin_listens() {
        // A port nothing listens on, on both loopbacks.
        let free = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(1);
        let admins = vec![
            format!("http://127.0.0.1:{free}"),
            format!("http://[::1]:{free}"),
        ];
        assert!(find_admin(&admins).is_none());
        assert_eq!(ready(&admins, false), ExitCode::SUCCESS);
        assert_eq!(ready(&admins, true), ExitCode::FAILURE);
        let started = Instant::now();
        assert_eq!(
            prestop_admin(&admins, Duration::from_secs(30)),
            ExitCode::SUCCESS
        );
        assert!(started.elapsed() < Duration::from_secs(5), "did not wait");
    }

    /// A stand-in for graceful_drain's listener: answers each request with
    /// the next status of `drained` for `GET /graceful/drained` (the last
    /// one over and over) and 202 for `POST /graceful/closing`; returns its
    /// URL and the paths it was asked, in order.
    fn sidecar(drained: Vec<u16>) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = asked.clone();
        std::thread::spawn(move || {
            let mut answers = drained.into_iter().peekable();
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                let mut buf = [0u8; 1024];
                let n = conn.read(&mut buf).unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).to_string();
                let line = head.lines().next().unwrap_or("").to_string();
                log.lock().unwrap().push(line.clone());
                let status = if line.starts_with("POST /graceful/closing") {
                    202
                } else if answers.len() > 1 {
                    answers.next().unwrap()
                } else {
                    *answers.peek().unwrap()
                };
                let _ = conn.write_all(
                    format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\n\r\n").as_bytes(),
                );
            }
        });
        (url, asked)
    }

    #[test]
    fn the_sidecar_prestop_asks_again_after_429_and_503_until_drained() {
        let (url, asked) = sidecar(vec![429, 429, 503, 200]);
        let status = prestop_sidecar_with(&url, Duration::from_secs(30), Duration::from_millis(10));
        assert_eq!(status, ExitCode::SUCCESS);
        let asked = asked.lock().unwrap().clone();
        assert_eq!(asked.len(), 5, "{asked:?}");
        assert!(asked[0].starts_with("POST /graceful/closing"), "{asked:?}");
        assert!(
            asked[1..]
                .iter()
                .all(|l| l.starts_with("GET /graceful/drained?wait=")),
            "{asked:?}"
        );
    }

    #[test]
    fn the_sidecar_prestop_holds_until_its_own_deadline_whatever_it_is_told() {
        let (url, asked) = sidecar(vec![429]);
        let wait = Duration::from_millis(600);
        let started = Instant::now();
        let status = prestop_sidecar_with(&url, wait, Duration::from_millis(10));
        assert_eq!(status, ExitCode::FAILURE, "never drained");
        assert!(
            started.elapsed() >= wait,
            "returned after {:?}, before its {wait:?}",
            started.elapsed()
        );
        assert!(asked.lock().unwrap().len() > 3, "asked again and again");
    }

    #[test]
    fn the_sidecar_prestop_does_not_wait_where_nothing_listens() {
        let free = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(1);
        let started = Instant::now();
        let status = prestop_sidecar(&format!("http://127.0.0.1:{free}"), Duration::from_secs(30));
        assert_eq!(status, ExitCode::SUCCESS);
        assert!(started.elapsed() < Duration::from_secs(5), "did not wait");
    }

    /// Envoy keeps a connection it answered with `connection: close` open
    /// for its delayed_close_timeout (1 s): the answer ends at its body.
    #[test]
    fn it_reads_an_answer_to_its_content_length_on_a_connection_kept_open() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            let Ok((mut conn, _)) = listener.accept() else {
                return;
            };
            let mut buf = [0u8; 1024];
            let _ = conn.read(&mut buf);
            let _ = conn.write_all(
                b"HTTP/1.1 202 Accepted\r\ncontent-length: 4\r\nconnection: close\r\n\r\nbody",
            );
            std::thread::sleep(Duration::from_secs(3));
        });
        let started = Instant::now();
        let answer = http("POST", &url, "/graceful/closing", REQUEST_TIMEOUT);
        assert_eq!(answer.ok(), Some((202, "body".to_string())));
        assert!(
            started.elapsed() < REQUEST_TIMEOUT,
            "{:?}",
            started.elapsed()
        );
        assert!(!answer_complete(
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nbod"
        ));
        assert!(!answer_complete(b"HTTP/1.1 200 OK\r\n"));
        assert!(answer_complete(
            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
        ));
    }

    #[test]
    fn an_envoy_still_starting_is_told_from_live_and_draining() {
        assert_eq!(
            starting(503, "PRE_INITIALIZING\n"),
            Some("PRE_INITIALIZING")
        );
        assert_eq!(starting(503, "INITIALIZING\n"), Some("INITIALIZING"));
        for (status, body) in [
            (200, "LIVE\n"),
            (503, "DRAINING\n"),
            (503, ""),
            (404, "INITIALIZING"),
        ] {
            assert_eq!(starting(status, body), None, "{status} {body:?}");
        }
    }
}
