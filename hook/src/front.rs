//! `graceful-hook front`: the preStop of a backend with no sidecar, behind
//! fronts whose graceful_consumer serves the `front` endpoints
//! (`docs/design/front-proxy-drain.md`, §4 and §5): the **acknowledged
//! drain**.
//!
//! ```text
//! graceful-hook front [--resolve NAME:PORT]... [--front http://IP:PORT]... [--wait 25s] [--settle 0s] [--source IP]
//! ```
//!
//! Every address of each `NAME` (a headless Service selecting the fronts'
//! pods), re-resolved every second while it waits, and each `--front` is
//! told `POST /graceful/front/closing`, then long-polled with
//! `GET /graceful/front/drained?wait=` (at most 10 s a poll), all of them
//! at once, one thread each. It returns when every front it knows of has
//! acknowledged, or at `--wait`, with one line on stdout.
//!
//! | a front | is |
//! |---|---|
//! | answers the first `closing` 202 | told: polled until it acknowledges |
//! | answers the first `closing` 403 (`not_a_member`) | done there: it sends us nothing |
//! | accepts no connection at the first try | none there |
//! | answers `closing` anything else (404 where no endpoints are served, 429, 503) | asked again; never acknowledged until it says 202 |
//! | answers `drained` 200 | acknowledged (the figures of its JSON printed, whatever it has) |
//! | answers `drained` 503 | not yet: polled again |
//! | answers `drained` 403, 404, 409 or a JSON `"state": "serving"` | it does not know of the closing (restarted): told again |
//! | stops answering once told (killed mid-drain) | waited for until `--wait`, named |
//! | appears at a later resolution | told and polled |
//! | leaves DNS before it acknowledged | dropped, named `left` (its requests end with it) |
//!
//! | outcome | exit |
//! |---|---|
//! | every front told acknowledged (403s and fronts that are none there do not count) | 0 |
//! | `--wait` passed first | 1 (the kubelet records `FailedPreStopHook`; SIGTERM follows either way) |
//! | no front answered at all (nothing listens, DNS empty) | 0 at once: fail open |
//!
//! A resolution that cannot be answered (`Try again`, `Temporary failure`,
//! `Non-recoverable`: a DNS server down) keeps the name's last addresses:
//! a front is dropped only when DNS says it is gone. Resolution runs on its
//! own thread, so a resolver that holds a question never holds the hook
//! past `--wait` (then exit 1: nothing is known either way). `--settle D` adds a
//! fixed wait after, for fronts that cannot acknowledge (a waypoint).
//!
//! `--source IP` sends every request from that local address (the client
//! socket is bound to it before it connects), for a host with several
//! addresses where the front must see the one it knows the host by; the
//! default is the system's choice. Fronts of the other address family are
//! then unreachable from it. An address this host does not have ends the
//! run at once, exit 1, naming it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use graceful_core::shared::duration::{format_duration, parse_duration};
use serde_json::Value;

use crate::{authority, http, request_on, Failure, REQUEST_TIMEOUT};

const DEFAULT_WAIT: Duration = Duration::from_secs(25);
/// The longest `drained?wait=` asked: a front holds a poll at most 60 s.
const LONG_POLL: Duration = Duration::from_secs(10);
/// A long poll's answer may come this long after its wait.
const LONG_POLL_SLACK: Duration = Duration::from_secs(2);
const CLOSING: &str = "/graceful/front/closing";
const DRAINED: &str = "/graceful/front/drained";

/// What `graceful-hook front` is asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Front {
    /// `NAME:PORT`, each re-resolved every second.
    pub resolve: Vec<String>,
    /// `http://HOST:PORT`, each resolved once.
    pub fronts: Vec<String>,
    pub wait: Duration,
    pub settle: Duration,
    /// The local address every request leaves from (`--source`); None:
    /// the system's choice.
    pub source: Option<IpAddr>,
}

/// Parses the arguments after `front`; each error names its flag.
pub(crate) fn parse(rest: &[String]) -> Result<Front, String> {
    let mut front = Front {
        resolve: Vec::new(),
        fronts: Vec::new(),
        wait: DEFAULT_WAIT,
        settle: Duration::ZERO,
        source: None,
    };
    let (mut wait, mut settle) = (None, None);
    let mut it = rest.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .filter(|v| !v.starts_with("--"))
                .ok_or_else(|| match flag.as_str() {
                    "--resolve" => "--resolve needs NAME:PORT".to_string(),
                    "--front" => "--front needs a URL (http://IP:PORT)".to_string(),
                    "--source" => "--source needs an IP address".to_string(),
                    f => format!("{f} needs a duration (\"25s\")"),
                })
        };
        match flag.as_str() {
            "--resolve" => {
                let v = value()?;
                name_port(v).map_err(|e| format!("--resolve {e}"))?;
                front.resolve.push(v.clone());
            }
            "--front" => {
                let v = value()?;
                authority(v).map_err(|e| format!("--front {e}"))?;
                front.fronts.push(v.clone());
            }
            "--source" => {
                let v = value()?;
                let ip = v
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse::<IpAddr>()
                    .map_err(|_| format!("--source {v:?}: expected an IP address"))?;
                if front.source.replace(ip).is_some() {
                    return Err("--source given twice".into());
                }
            }
            "--wait" | "--settle" => {
                let v = value()?;
                let d = parse_duration(v).map_err(|e| format!("{flag}: {e}"))?;
                let slot = if flag == "--wait" {
                    &mut wait
                } else {
                    &mut settle
                };
                if slot.replace(d).is_some() {
                    return Err(format!("{flag} given twice"));
                }
            }
            f if f.starts_with("--") => return Err(format!("unknown flag {f} for front")),
            other => return Err(format!("front takes flags only, not {other:?}")),
        }
    }
    if front.resolve.is_empty() && front.fronts.is_empty() {
        return Err(
            "front needs at least one --resolve NAME:PORT or --front http://IP:PORT".into(),
        );
    }
    front.wait = wait.unwrap_or(DEFAULT_WAIT);
    front.settle = settle.unwrap_or(Duration::ZERO);
    Ok(front)
}

/// `NAME:PORT` (or `[IPv6]:PORT`), a port other than 0.
fn name_port(text: &str) -> Result<(), String> {
    let bad = || format!("{text:?}: expected NAME:PORT (a headless Service and the fronts' port)");
    let (name, port) = text.rsplit_once(':').ok_or_else(bad)?;
    let port_ok = port.parse::<u16>().is_ok_and(|p| p != 0);
    if name.is_empty() || name.contains('/') || !port_ok {
        return Err(bad());
    }
    Ok(())
}

/// Where the fronts' addresses come from: the system's resolver in the
/// binary, a stand-in in tests.
pub trait Resolve: Send + Sync {
    /// Every address `NAME:PORT` has now: `Ok` and empty when the name has
    /// none (NXDOMAIN, a headless Service with no ready pod); `Err` when the
    /// question could not be answered (the name's last addresses are kept).
    fn resolve(&self, name_port: &str) -> Result<Vec<SocketAddr>, String>;
}

/// std's `ToSocketAddrs` (getaddrinfo): every A and AAAA record.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, name_port: &str) -> Result<Vec<SocketAddr>, String> {
        match name_port.to_socket_addrs() {
            Ok(addrs) => Ok(addrs.collect()),
            // EAI_AGAIN and EAI_FAIL, as glibc and musl word them: no
            // answer, not an answer of none.
            Err(e) => {
                let text = e.to_string();
                let unanswered = ["Temporary failure", "Try again", "Non-recoverable"]
                    .iter()
                    .any(|w| text.contains(w));
                if unanswered {
                    Err(text)
                } else {
                    Ok(Vec::new())
                }
            }
        }
    }
}

/// How often names are resolved and a front asked at most.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub(crate) resolve_every: Duration,
    /// The least time between two requests to one front (a 503 or a
    /// refused connection is not asked again at once).
    pub(crate) poll: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            resolve_every: Duration::from_secs(1),
            poll: Duration::from_millis(200),
        }
    }
}

/// Tells every front, waits for their acknowledgements, prints one line,
/// then settles.
pub(crate) fn front(args: &Front) -> ExitCode {
    let (code, line) = front_with(args, Arc::new(SystemResolver), Timing::default());
    let settling = if args.settle.is_zero() {
        String::new()
    } else {
        format!("; settling {}", format_duration(args.settle))
    };
    println!("{line}{settling}");
    std::thread::sleep(args.settle);
    code
}

/// One acknowledgement's figures, as far as the front's JSON has them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Figures {
    inflight_at_closing: Option<u64>,
    steered_after_ms: Option<u64>,
    last_active_ms: Option<u64>,
    late: Option<u64>,
}

impl Figures {
    /// From any JSON object (the keys found at any depth); none from a body
    /// that is not JSON.
    fn read(body: &str) -> Figures {
        let Ok(json) = serde_json::from_str::<Value>(body.trim()) else {
            return Figures::default();
        };
        let count = |key: &str| find(&json, key).and_then(as_count);
        Figures {
            inflight_at_closing: count("inflight_at_closing"),
            steered_after_ms: count("steered_after_ms"),
            last_active_ms: count("last_active_ms"),
            late: count("late"),
        }
    }
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if let Some(n) = self.inflight_at_closing {
            parts.push(format!("{n} in flight at closing"));
        }
        if let Some(ms) = self.steered_after_ms {
            parts.push(format!("steered at {}", millis(ms)));
        }
        if let Some(ms) = self.last_active_ms {
            parts.push(format!("last ended at {}", millis(ms)));
        }
        if let Some(n) = self.late.filter(|n| *n > 0) {
            parts.push(format!("{n} late"));
        }
        if parts.is_empty() {
            f.write_str("acknowledged")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}

/// The first value under `key`, depth first.
fn find<'a>(json: &'a Value, key: &str) -> Option<&'a Value> {
    match json {
        Value::Object(map) => map
            .get(key)
            .or_else(|| map.values().find_map(|v| find(v, key))),
        Value::Array(items) => items.iter().find_map(|v| find(v, key)),
        _ => None,
    }
}

/// A count written as an integer, a float or a string (`"3"`, as Envoy's
/// admin writes its stats).
fn as_count(v: &Value) -> Option<u64> {
    v.as_u64()
        .or_else(|| {
            v.as_f64()
                .filter(|f| f.is_finite() && *f >= 0.0)
                .map(|f| f.round() as u64)
        })
        .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
}

fn json_str(body: &str, key: &str) -> Option<String> {
    let json = serde_json::from_str::<Value>(body.trim()).ok()?;
    find(&json, key)?.as_str().map(str::to_string)
}

fn millis(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms}ms")
    } else {
        format!("{:.1}s", ms as f64 / 1000.0)
    }
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Not told yet: the first `closing` is under way, or the front answered
    /// it neither 202 nor 403.
    Telling,
    Told,
    Acknowledged(Figures),
    /// 403 to the first `closing`: the front sends us nothing.
    Refused(String),
    /// Nothing accepted a connection at the first try.
    NoneThere,
}

impl State {
    fn done(&self) -> bool {
        matches!(
            self,
            State::Acknowledged(_) | State::Refused(_) | State::NoneThere
        )
    }
}

#[derive(Debug)]
struct Entry {
    state: State,
    /// The worker that owns it: a front that leaves and comes back gets a
    /// new one.
    worker: u64,
    told_at: Option<Duration>,
    last_answer: Option<Duration>,
    /// The last answer that was not the one hoped for, for the summary.
    said: Option<String>,
    left: bool,
}

#[derive(Debug, Default)]
struct Table {
    fronts: BTreeMap<SocketAddr, Entry>,
    /// Each name's last answered addresses (kept over an unanswered
    /// resolution), or why there are none.
    names: BTreeMap<String, Result<Vec<SocketAddr>, String>>,
    /// `--front`s resolved once; a name that has no address is in `names`.
    fixed: BTreeSet<SocketAddr>,
    rounds: u64,
    workers: u64,
    finished: bool,
}

#[derive(Debug)]
struct Shared {
    table: Mutex<Table>,
    changed: Condvar,
    start: Instant,
    deadline: Instant,
    timing: Timing,
    /// `--source`: where every request leaves from.
    source: Option<IpAddr>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits up to `d` or until the run finishes; false once it has.
    fn pause(&self, d: Duration) -> bool {
        let until = Instant::now() + d;
        let mut table = self.lock();
        loop {
            let now = Instant::now();
            if table.finished || now >= self.deadline {
                return false;
            }
            if now >= until {
                return true;
            }
            table = self
                .changed
                .wait_timeout(table, until.min(self.deadline) - now)
                .map_or_else(|e| e.into_inner().0, |(t, _)| t);
        }
    }
}

/// What one exchange with a front means.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Next {
    Told,
    Refused(String),
    NoneThere,
    Acknowledged(Figures),
    /// It does not know of the closing: tell it again.
    TellAgain(String),
    /// Ask again; `Some` says why it is noteworthy.
    Again(Option<String>),
}

fn after_closing(first: bool, answer: &Result<(u16, String), Failure>) -> Next {
    match answer {
        Ok((202, _)) => Next::Told,
        Ok((403, body)) => {
            let why = json_str(body, "refused").unwrap_or_else(|| "refused".into());
            if first {
                Next::Refused(why)
            } else {
                // Told before, or asked again: a restarted front whose
                // membership is not loaded yet (§6) closes us afresh later.
                Next::Again(Some(format!("closing answered 403 {why}")))
            }
        }
        Ok((status, _)) => Next::Again(Some(format!("closing answered {status}"))),
        Err(Failure::Unreachable(_)) if first => Next::NoneThere,
        Err(e) => Next::Again(Some(format!("closing: {e}"))),
    }
}

fn says_serving(body: &str) -> bool {
    json_str(body, "state").is_some_and(|s| s == "serving")
}

fn after_drained(answer: &Result<(u16, String), Failure>) -> Next {
    match answer {
        Ok((_, body)) if says_serving(body) => Next::TellAgain("it says serving".into()),
        Ok((200, body)) => Next::Acknowledged(Figures::read(body)),
        Ok((503, _)) => Next::Again(None),
        Ok((status @ (403 | 404 | 409), _)) => {
            Next::TellAgain(format!("drained answered {status}"))
        }
        Ok((status, _)) => Next::Again(Some(format!("drained answered {status}"))),
        Err(e) => Next::Again(Some(format!("drained: {e}"))),
    }
}

/// Tells one front and polls it until it acknowledges, the run ends, or
/// the front leaves (its entry then has another worker or `left`).
fn tell_and_wait(shared: Arc<Shared>, addr: SocketAddr, worker: u64) {
    let url = format!("http://{addr}");
    let mut first = true;
    let mut told = false;
    loop {
        let asked = Instant::now();
        let left = shared.deadline.saturating_duration_since(asked);
        let answer = if told {
            let wait = LONG_POLL.min(left);
            let path = format!("{DRAINED}?wait={}", format_duration(wait));
            exchange(shared.source, "GET", &url, &path, wait + LONG_POLL_SLACK)
        } else {
            exchange(shared.source, "POST", &url, CLOSING, REQUEST_TIMEOUT)
        };
        let next = if told {
            after_drained(&answer)
        } else {
            after_closing(first, &answer)
        };
        first = false;
        {
            let mut table = shared.lock();
            if table.finished {
                return;
            }
            let at = shared.start.elapsed();
            let Some(entry) = table
                .fronts
                .get_mut(&addr)
                .filter(|e| e.worker == worker && !e.left)
            else {
                return;
            };
            if answer.is_ok() {
                entry.last_answer = Some(at);
            }
            let stop = match next {
                Next::Told => {
                    told = true;
                    entry.told_at.get_or_insert(at);
                    entry.state = State::Told;
                    false
                }
                Next::Refused(why) => {
                    entry.state = State::Refused(why);
                    true
                }
                Next::NoneThere => {
                    entry.state = State::NoneThere;
                    true
                }
                Next::Acknowledged(figures) => {
                    entry.state = State::Acknowledged(figures);
                    true
                }
                Next::TellAgain(why) => {
                    eprintln!("graceful-hook front: {addr}: {why}: telling it again");
                    told = false;
                    entry.state = State::Telling;
                    entry.said = Some(why);
                    false
                }
                Next::Again(why) => {
                    if why.is_some() {
                        entry.said = why;
                    }
                    false
                }
            };
            shared.changed.notify_all();
            if stop {
                return;
            }
        }
        let since = asked.elapsed();
        if !shared.pause(shared.timing.poll.saturating_sub(since)) {
            return;
        }
    }
}

/// One request to a front: [`http`] from the system's choice of address,
/// or from `source`.
fn exchange(
    source: Option<IpAddr>,
    method: &str,
    url: &str,
    path: &str,
    read_budget: Duration,
) -> Result<(u16, String), Failure> {
    match source {
        None => http(method, url, path, read_budget),
        Some(ip) => http_from(ip, method, url, path, read_budget),
    }
}

/// A TCP socket bound to `source` (any port), not connected yet.
fn bound_socket(source: IpAddr) -> std::io::Result<socket2::Socket> {
    let local = SocketAddr::new(source, 0);
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(local),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.bind(&local.into())?;
    Ok(socket)
}

/// [`http`], its connection bound to `source` before it connects: the
/// same request (`connection: close`) and the same reading of the answer
/// (to its `content-length`). Only the front's addresses of `source`'s
/// family are tried.
fn http_from(
    source: IpAddr,
    method: &str,
    url: &str,
    path: &str,
    read_budget: Duration,
) -> Result<(u16, String), Failure> {
    let authority = authority(url).map_err(Failure::Unreachable)?;
    let addrs: Vec<SocketAddr> = authority
        .to_socket_addrs()
        .map_err(|e| Failure::Unreachable(format!("{authority}: {e}")))?
        .filter(|a| a.is_ipv4() == source.is_ipv4())
        .collect();
    let connect = |addr: &SocketAddr| -> std::io::Result<TcpStream> {
        let socket = bound_socket(source)?;
        socket.connect_timeout(&(*addr).into(), REQUEST_TIMEOUT)?;
        Ok(socket.into())
    };
    let stream = addrs
        .iter()
        .find_map(|a| connect(a).ok())
        .ok_or_else(|| Failure::Unreachable(format!("{authority}: no connection from {source}")))?;
    request_on(stream, method, authority, path, read_budget)
}

/// Resolves every name each `resolve_every` (the `--front`s once), adding
/// and dropping fronts, until the run finishes.
fn resolving(shared: Arc<Shared>, args: Front, resolver: Arc<dyn Resolve>) {
    let mut fixed: Vec<(String, Result<Vec<SocketAddr>, String>)> = args
        .fronts
        .iter()
        .filter_map(|url| authority(url).ok())
        .map(|a| {
            let addrs = match a.parse::<SocketAddr>() {
                Ok(addr) => Ok(vec![addr]),
                Err(_) => resolver.resolve(a),
            };
            (a.to_string(), addrs)
        })
        .collect();
    loop {
        let round_start = Instant::now();
        let answers: Vec<_> = args
            .resolve
            .iter()
            .map(|name| (name.clone(), resolver.resolve(name)))
            .collect();
        let mut spawn = Vec::new();
        {
            let mut table = shared.lock();
            if table.finished {
                return;
            }
            for (name, addrs) in fixed.drain(..) {
                match addrs {
                    Ok(addrs) if !addrs.is_empty() => table.fixed.extend(addrs),
                    Ok(_) => {
                        table.names.insert(name, Ok(Vec::new()));
                    }
                    Err(e) => {
                        table.names.insert(name, Err(e));
                    }
                }
            }
            for (name, answer) in answers {
                let keep = answer.is_err()
                    && matches!(table.names.get(&name), Some(Ok(a)) if !a.is_empty());
                if !keep {
                    table.names.insert(name, answer);
                }
            }
            let mut now: BTreeSet<SocketAddr> = table.fixed.clone();
            for addrs in table.names.values().filter_map(|a| a.as_ref().ok()) {
                now.extend(addrs.iter().copied());
            }
            let first_round = table.rounds == 0;
            let mut workers = table.workers;
            for (addr, entry) in table.fronts.iter_mut() {
                if !now.contains(addr) && !entry.left && !entry.state.done() {
                    eprintln!("graceful-hook front: {addr} left DNS: dropped");
                    entry.left = true;
                }
            }
            for addr in now {
                let fresh = table.fronts.get(&addr).is_none_or(|e| e.left);
                if fresh {
                    if !first_round {
                        eprintln!("graceful-hook front: {addr} appeared: telling it");
                    }
                    workers += 1;
                    table.fronts.insert(
                        addr,
                        Entry {
                            state: State::Telling,
                            worker: workers,
                            told_at: None,
                            last_answer: None,
                            said: None,
                            left: false,
                        },
                    );
                    spawn.push((addr, workers));
                }
            }
            table.workers = workers;
            table.rounds += 1;
            shared.changed.notify_all();
        }
        for (addr, worker) in spawn {
            let s = shared.clone();
            let started = std::thread::Builder::new()
                .name(format!("front {addr}"))
                .spawn(move || tell_and_wait(s, addr, worker));
            if let Err(e) = started {
                let mut table = shared.lock();
                if let Some(entry) = table.fronts.get_mut(&addr) {
                    entry.said = Some(format!("no thread to ask it: {e}"));
                }
            }
        }
        let since = round_start.elapsed();
        if !shared.pause(shared.timing.resolve_every.saturating_sub(since)) {
            return;
        }
    }
}

/// The run itself, its resolver and timing given: the exit and the line.
pub(crate) fn front_with(
    args: &Front,
    resolver: Arc<dyn Resolve>,
    timing: Timing,
) -> (ExitCode, String) {
    if let Some(ip) = args.source {
        // Not an address of this host: every request would fail the same
        // way, and the fronts would never hear of the closing.
        if let Err(e) = bound_socket(ip) {
            return (
                ExitCode::FAILURE,
                format!(
                    "graceful-hook front: --source {ip} cannot be bound ({e}): returned at once"
                ),
            );
        }
    }
    let start = Instant::now();
    let shared = Arc::new(Shared {
        table: Mutex::new(Table::default()),
        changed: Condvar::new(),
        start,
        deadline: start + args.wait,
        timing,
        source: args.source,
    });
    let s = shared.clone();
    let a = args.clone();
    if let Err(e) = std::thread::Builder::new()
        .name("front resolver".into())
        .spawn(move || resolving(s, a, resolver))
    {
        return (
            ExitCode::SUCCESS,
            format!("graceful-hook front: no thread to resolve the fronts ({e}): returned at once"),
        );
    }
    let mut table = shared.lock();
    loop {
        let waiting = table.fronts.values().any(|e| !e.left && !e.state.done());
        if table.rounds > 0 && !waiting {
            break;
        }
        let now = Instant::now();
        if now >= shared.deadline {
            break;
        }
        table = shared
            .changed
            .wait_timeout(table, shared.deadline - now)
            .map_or_else(|e| e.into_inner().0, |(t, _)| t);
    }
    table.finished = true;
    shared.changed.notify_all();
    if table.rounds == 0 {
        // The resolver never answered (a DNS server that holds every
        // question): nothing is known either way.
        return (
            ExitCode::FAILURE,
            format!(
                "graceful-hook front: no resolution of {} answered by the {} deadline",
                args.resolve
                    .iter()
                    .chain(&args.fronts)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
                format_duration(args.wait)
            ),
        );
    }
    summary(&table, start.elapsed(), args.wait)
}

/// The one line, and the exit: 0 when every front told acknowledged.
fn summary(table: &Table, elapsed: Duration, wait: Duration) -> (ExitCode, String) {
    let label = |addr: &SocketAddr| {
        let shared_ip = table.fronts.keys().filter(|a| a.ip() == addr.ip()).count() > 1;
        if shared_ip {
            addr.to_string()
        } else {
            addr.ip().to_string()
        }
    };
    let since = |entry: &Entry| {
        let told = entry.told_at.map_or_else(
            || "never told".to_string(),
            |t| format!("told at {}", secs(t)),
        );
        let last = entry.last_answer.map_or_else(
            || "no answer".to_string(),
            |t| format!("last answer {}", secs(t)),
        );
        let said = entry
            .said
            .as_ref()
            .filter(|_| !matches!(entry.state, State::Told))
            .map_or_else(String::new, |s| format!(", {s}"));
        format!("{told}, {last}{said}")
    };
    let mut expected = 0;
    let mut acked = 0;
    let mut missing = Vec::new();
    let mut details = Vec::new();
    for (addr, entry) in &table.fronts {
        let name = label(addr);
        match &entry.state {
            _ if entry.left => details.push(format!("{name}: left ({})", since(entry))),
            State::Refused(why) => {
                details.push(format!("{name}: 403 {why}, sends us nothing"));
            }
            State::NoneThere => details.push(format!("{name}: none there")),
            State::Acknowledged(figures) => {
                expected += 1;
                acked += 1;
                details.push(format!("{name}: {figures}"));
            }
            State::Telling | State::Told => {
                expected += 1;
                missing.push(format!("{name} never acknowledged ({})", since(entry)));
            }
        }
    }
    for (name, answer) in &table.names {
        match answer {
            Ok(a) if a.is_empty() => details.push(format!("{name}: no address")),
            Err(e) => details.push(format!("{name}: {e}")),
            Ok(_) => {}
        }
    }
    let ever_answered = table
        .fronts
        .values()
        .any(|e| e.last_answer.is_some() && !matches!(e.state, State::Refused(_)));
    let refused = table
        .fronts
        .values()
        .any(|e| matches!(e.state, State::Refused(_)));
    let details_in = |details: &[String]| {
        if details.is_empty() {
            String::new()
        } else {
            format!(" ({})", details.join("; "))
        }
    };
    let line = if expected == 0 && !ever_answered && !refused {
        format!(
            "graceful-hook front: no front answered: returned at once{}",
            details_in(&details)
        )
    } else if expected == 0 && !ever_answered {
        format!(
            "graceful-hook front: no front sends us requests: returned at once{}",
            details_in(&details)
        )
    } else if missing.is_empty() {
        format!(
            "graceful-hook front: {acked} of {expected} fronts acknowledged in {}{}",
            secs(elapsed),
            details_in(&details)
        )
    } else {
        let mut parts = vec![format!(
            "graceful-hook front: {acked} of {expected} fronts acknowledged by the {} deadline",
            format_duration(wait)
        )];
        parts.extend(missing.iter().cloned());
        parts.extend(details);
        parts.join("; ")
    };
    let code = if missing.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    };
    (code, line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::atomic::{AtomicBool, Ordering};

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    /// Fast timing for tests: names resolved every 100 ms, fronts asked
    /// again after 20 ms.
    const FAST: Timing = Timing {
        resolve_every: Duration::from_millis(100),
        poll: Duration::from_millis(20),
    };

    /// A resolver stand-in: the test adds and removes addresses mid-run.
    #[derive(Debug, Default)]
    struct Names(Mutex<BTreeMap<String, Vec<SocketAddr>>>);

    impl Names {
        fn set(&self, name: &str, addrs: Vec<SocketAddr>) {
            self.0.lock().unwrap().insert(name.into(), addrs);
        }
    }

    impl Resolve for Names {
        fn resolve(&self, name_port: &str) -> Result<Vec<SocketAddr>, String> {
            Ok(self
                .0
                .lock()
                .unwrap()
                .get(name_port)
                .cloned()
                .unwrap_or_default())
        }
    }

    #[derive(Debug, Clone, Copy)]
    struct Script {
        /// Its answer to `closing`: 202, or 403 (`not_a_member`).
        closing: u16,
        /// How long after `closing` it acknowledges; None: never.
        ack_after: Option<Duration>,
        /// Its listener closes once it answered `closing` (killed mid-drain).
        killed_after_closing: bool,
        /// Its first `drained` says `"state": "serving"`, as a restarted
        /// front would: it forgets the closing.
        forgets_once: bool,
    }

    const ACKS: Script = Script {
        closing: 202,
        ack_after: Some(Duration::ZERO),
        killed_after_closing: false,
        forgets_once: false,
    };

    /// A stand-in for one front's control listener answering §4's API, a
    /// plain HTTP/1.1 server on threads (the front side, graceful_consumer's
    /// `front` section, is not built yet): `closing` with the scripted
    /// status, `drained?wait=` held until the scripted acknowledgement
    /// (200 with figures) or the wait (503), 409 `serving` before any
    /// `closing`.
    struct StandIn {
        addr: SocketAddr,
        url: String,
        asked: Arc<Mutex<Vec<String>>>,
        /// The source address of each connection, in order.
        peers: Arc<Mutex<Vec<IpAddr>>>,
    }

    impl StandIn {
        /// None where `ip` cannot be bound (no IPv6 here).
        fn start(ip: &str, script: Script) -> Option<StandIn> {
            let listener = TcpListener::bind((ip, 0)).ok()?;
            let addr = listener.local_addr().ok()?;
            let asked = Arc::new(Mutex::new(Vec::new()));
            let log = asked.clone();
            let peers = Arc::new(Mutex::new(Vec::new()));
            let peer_log = peers.clone();
            let closed_at: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
            let forgot = Arc::new(AtomicBool::new(false));
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    let Ok(mut conn) = conn else { return };
                    if let Ok(peer) = conn.peer_addr() {
                        peer_log.lock().unwrap().push(peer.ip());
                    }
                    let line = request_line(&mut conn);
                    log.lock().unwrap().push(line.clone());
                    if line.starts_with("POST /graceful/front/closing ") {
                        if script.closing == 202 {
                            closed_at.lock().unwrap().get_or_insert_with(Instant::now);
                            respond(&mut conn, 202, r#"{"state":"closing"}"#);
                        } else {
                            respond(&mut conn, 403, r#"{"refused":"not_a_member"}"#);
                        }
                        if script.killed_after_closing {
                            return; // the listener closes with the thread
                        }
                    } else if line.starts_with("GET /graceful/front/drained?wait=") {
                        let closed_at = closed_at.clone();
                        let forgot = forgot.clone();
                        std::thread::spawn(move || {
                            drained(conn, &line, script, &closed_at, &forgot);
                        });
                    } else {
                        respond(&mut conn, 404, "");
                    }
                }
            });
            Some(StandIn {
                addr,
                url: format!("http://{addr}"),
                asked,
                peers,
            })
        }

        fn closings(&self) -> usize {
            self.asked
                .lock()
                .unwrap()
                .iter()
                .filter(|l| l.starts_with("POST /graceful/front/closing"))
                .count()
        }
    }

    fn drained(
        mut conn: TcpStream,
        line: &str,
        script: Script,
        closed_at: &Mutex<Option<Instant>>,
        forgot: &AtomicBool,
    ) {
        let wait = line
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.split_once("wait="))
            .and_then(|(_, w)| parse_duration(w).ok())
            .unwrap_or(Duration::ZERO);
        let Some(closed) = *closed_at.lock().unwrap() else {
            return respond(&mut conn, 409, r#"{"state":"serving"}"#);
        };
        if script.forgets_once && !forgot.swap(true, Ordering::SeqCst) {
            *closed_at.lock().unwrap() = None;
            return respond(&mut conn, 503, r#"{"state":"serving"}"#);
        }
        let asked = Instant::now();
        match script.ack_after.map(|d| closed + d) {
            Some(ack) if ack <= asked + wait => {
                std::thread::sleep(ack.saturating_duration_since(asked));
                let ms = ack.duration_since(closed).as_millis();
                let body = format!(
                    r#"{{"state":"acknowledged","inflight_at_closing":3,"steered_after_ms":2,"last_active_ms":{ms},"late":0}}"#
                );
                respond(&mut conn, 200, &body);
            }
            _ => {
                std::thread::sleep(wait);
                respond(&mut conn, 503, r#"{"state":"steered"}"#);
            }
        }
    }

    fn request_line(conn: &mut TcpStream) -> String {
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match conn.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        String::from_utf8_lossy(&head)
            .lines()
            .next()
            .unwrap_or("")
            .to_string()
    }

    fn respond(conn: &mut TcpStream, status: u16, body: &str) {
        let _ = conn.write_all(
            format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        );
    }

    /// A port nothing listens on.
    fn free_port(ip: &str) -> u16 {
        TcpListener::bind((ip, 0))
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(1)
    }

    fn ask(resolve: &[&str], fronts: &[&StandIn], wait: Duration) -> Front {
        Front {
            resolve: resolve.iter().map(|r| r.to_string()).collect(),
            fronts: fronts.iter().map(|f| f.url.clone()).collect(),
            wait,
            settle: Duration::ZERO,
            source: None,
        }
    }

    fn no_names() -> Arc<dyn Resolve> {
        Arc::new(Names::default())
    }

    /// Polls `cond` until it holds or 10 s pass.
    fn until(what: &str, cond: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "never: {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn front_parses_its_flags() {
        assert_eq!(
            parse(&args(
                "--resolve fronts.edge.svc:19091 --front http://10.0.1.4:19091 --front http://[fd00::4]:19091 --wait 40s --settle 2s"
            )),
            Ok(Front {
                resolve: vec!["fronts.edge.svc:19091".into()],
                fronts: vec!["http://10.0.1.4:19091".into(), "http://[fd00::4]:19091".into()],
                wait: Duration::from_secs(40),
                settle: Duration::from_secs(2),
                source: None,
            })
        );
        assert_eq!(
            crate::parse(&args("front --resolve fronts:19091")),
            Ok(crate::Hook::Front(Front {
                resolve: vec!["fronts:19091".into()],
                fronts: vec![],
                wait: DEFAULT_WAIT,
                settle: Duration::ZERO,
                source: None,
            }))
        );
    }

    #[test]
    fn front_refuses_bad_flags_and_names_them() {
        for (line, says) in [
            ("front", "at least one --resolve"),
            ("front --wait 5s", "at least one --resolve"),
            ("front --resolve", "--resolve needs NAME:PORT"),
            (
                "front --resolve fronts",
                "--resolve \"fronts\": expected NAME:PORT",
            ),
            ("front --resolve fronts:http", "--resolve"),
            ("front --resolve :19091", "--resolve"),
            ("front --resolve fronts:0", "--resolve"),
            ("front --front", "--front needs a URL"),
            (
                "front --front 10.0.1.4:19091",
                "--front 10.0.1.4:19091: the URL must start",
            ),
            (
                "front --front http://10.0.1.4:19091/x",
                "--front http://10.0.1.4:19091/x: expected",
            ),
            ("front --front http://a:1 --wait", "--wait needs a duration"),
            (
                "front --front http://a:1 --wait 25",
                "--wait: invalid duration",
            ),
            (
                "front --front http://a:1 --settle soon",
                "--settle: invalid duration",
            ),
            (
                "front --front http://a:1 --wait 1s --wait 2s",
                "--wait given twice",
            ),
            (
                "front --front http://a:1 --admin http://b:2",
                "unknown flag --admin",
            ),
            ("front --front http://a:1 25s", "flags only"),
            ("front --resolve --wait 5s", "--resolve needs NAME:PORT"),
            (
                "front --front http://a:1 --source",
                "--source needs an IP address",
            ),
            (
                "front --front http://a:1 --source pod.local",
                "--source \"pod.local\": expected an IP address",
            ),
            (
                "front --front http://a:1 --source 10.0.0.1 --source 10.0.0.2",
                "--source given twice",
            ),
        ] {
            let e = crate::parse(&args(line)).expect_err(line);
            assert!(e.contains(says), "{line:?}: {e}");
        }
    }

    #[test]
    fn source_is_parsed_as_an_ip_of_either_family() {
        let parsed = |line: &str| parse(&args(line)).map(|f| f.source);
        assert_eq!(
            parsed("--front http://a:1 --source 127.0.0.3"),
            Ok(Some("127.0.0.3".parse().unwrap()))
        );
        assert_eq!(
            parsed("--source fd00::4 --front http://a:1"),
            Ok(Some("fd00::4".parse().unwrap()))
        );
        assert_eq!(
            parsed("--front http://a:1 --source [fd00::4]"),
            Ok(Some("fd00::4".parse().unwrap()))
        );
        assert_eq!(parsed("--front http://a:1"), Ok(None));
    }

    #[test]
    fn every_request_leaves_from_the_source_address() {
        // 127.0.0.0/8 is all loopback on Linux: 127.0.0.3 is an address of
        // this host that the system never picks to reach 127.0.0.1.
        let front = StandIn::start(
            "127.0.0.1",
            Script {
                ack_after: Some(Duration::from_millis(100)),
                ..ACKS
            },
        )
        .unwrap();
        let source: IpAddr = "127.0.0.3".parse().unwrap();
        let mut asked = ask(&[], &[&front], Duration::from_secs(10));
        asked.source = Some(source);
        let (code, line) = front_with(&asked, no_names(), FAST);
        assert_eq!(code, ExitCode::SUCCESS, "{line}");
        assert!(line.contains("1 of 1 fronts acknowledged"), "{line}");
        let peers = front.peers.lock().unwrap().clone();
        assert!(peers.len() >= 2, "closing and drained: {peers:?}");
        assert!(peers.iter().all(|p| *p == source), "{peers:?}");
        // Without it, the system's choice: 127.0.0.1 to 127.0.0.1.
        let other = StandIn::start("127.0.0.1", ACKS).unwrap();
        let (code, line) = front_with(
            &ask(&[], &[&other], Duration::from_secs(10)),
            no_names(),
            FAST,
        );
        assert_eq!(code, ExitCode::SUCCESS, "{line}");
        let peers = other.peers.lock().unwrap().clone();
        assert!(
            !peers.is_empty() && peers.iter().all(|p| *p == IpAddr::from([127, 0, 0, 1])),
            "{peers:?}"
        );
    }

    #[test]
    fn a_source_this_host_does_not_have_ends_it_at_once_naming_it() {
        let front = StandIn::start("127.0.0.1", ACKS).unwrap();
        let mut asked = ask(&[], &[&front], Duration::from_secs(30));
        // TEST-NET-1 (RFC 5737): no host has it.
        asked.source = Some("192.0.2.7".parse().unwrap());
        let started = Instant::now();
        let (code, line) = front_with(&asked, no_names(), FAST);
        assert_eq!(code, ExitCode::FAILURE, "{line}");
        assert!(started.elapsed() < Duration::from_millis(900));
        assert!(
            line.starts_with("graceful-hook front: --source 192.0.2.7 cannot be bound ("),
            "{line}"
        );
        assert_eq!(front.closings(), 0, "told nothing");
    }

    #[test]
    fn a_front_of_the_other_family_is_none_there_from_the_source() {
        let Some(v6) = StandIn::start("::1", ACKS) else {
            return; // no IPv6 here
        };
        let v4 = StandIn::start("127.0.0.1", ACKS).unwrap();
        let mut asked = ask(&[], &[&v6, &v4], Duration::from_secs(10));
        asked.source = Some("127.0.0.3".parse().unwrap());
        let (code, line) = front_with(&asked, no_names(), FAST);
        assert_eq!(code, ExitCode::SUCCESS, "{line}");
        assert!(line.contains("1 of 1 fronts acknowledged"), "{line}");
        assert!(line.contains("::1: none there"), "{line}");
        assert_eq!(v6.closings(), 0);
    }

    #[test]
    fn all_fronts_acknowledge_and_it_returns_when_the_last_does() {
        let quick = Script {
            ack_after: Some(Duration::from_millis(300)),
            ..ACKS
        };
        let slow = Script {
            ack_after: Some(Duration::from_millis(1200)),
            ..ACKS
        };
        let a = StandIn::start("127.0.0.1", quick).unwrap();
        let b = StandIn::start("::1", slow)
            .or_else(|| StandIn::start("127.0.0.1", slow))
            .unwrap();
        // One by --front, one by a name.
        let names = Arc::new(Names::default());
        names.set("fronts.edge.svc:19091", vec![b.addr]);
        let started = Instant::now();
        let (code, line) = front_with(
            &ask(&["fronts.edge.svc:19091"], &[&a], Duration::from_secs(20)),
            names,
            FAST,
        );
        let took = started.elapsed();
        assert_eq!(code, ExitCode::SUCCESS, "{line}");
        assert!(
            took >= Duration::from_millis(1200),
            "before the last: {took:?}"
        );
        assert!(took < Duration::from_millis(1200 + 2500), "{took:?}");
        assert!(
            line.starts_with("graceful-hook front: 2 of 2 fronts acknowledged in "),
            "{line}"
        );
        assert!(
            line.contains("3 in flight at closing, steered at 2ms, last ended at 1.2s"),
            "{line}"
        );
        assert!(line.contains("last ended at 300ms"), "{line}");
        assert_eq!((a.closings(), b.closings()), (1, 1));
    }

    #[test]
    fn a_front_killed_mid_drain_is_waited_for_until_the_deadline_and_named() {
        let a = StandIn::start("127.0.0.1", ACKS).unwrap();
        let killed = StandIn::start(
            "127.0.0.1",
            Script {
                killed_after_closing: true,
                ack_after: None,
                ..ACKS
            },
        )
        .unwrap();
        let wait = Duration::from_millis(1500);
        let started = Instant::now();
        let (code, line) = front_with(&ask(&[], &[&a, &killed], wait), no_names(), FAST);
        let took = started.elapsed();
        assert_eq!(code, ExitCode::FAILURE, "{line}");
        assert!(took >= wait, "{took:?}");
        assert!(took < wait + Duration::from_secs(2), "{took:?}");
        assert!(
            line.starts_with(
                "graceful-hook front: 1 of 2 fronts acknowledged by the 1500ms deadline; "
            ),
            "{line}"
        );
        assert!(
            line.contains(&format!(
                "{} never acknowledged (told at 0.0s, last answer 0.0s",
                killed.addr
            )),
            "{line}"
        );
        assert_eq!(killed.closings(), 1);
    }

    #[test]
    fn where_no_front_listens_it_returns_at_once() {
        let names = Arc::new(Names::default());
        names.set("fronts.edge.svc:19091", vec![]);
        let args = Front {
            resolve: vec!["fronts.edge.svc:19091".into()],
            fronts: vec![
                format!("http://127.0.0.1:{}", free_port("127.0.0.1")),
                format!("http://[::1]:{}", free_port("::1")),
            ],
            wait: Duration::from_secs(30),
            settle: Duration::ZERO,
            source: None,
        };
        let started = Instant::now();
        let (code, line) = front_with(&args, names, Timing::default());
        let took = started.elapsed();
        assert_eq!(code, ExitCode::SUCCESS, "{line}");
        assert!(took < Duration::from_millis(900), "{took:?}");
        assert!(
            line.starts_with("graceful-hook front: no front answered: returned at once"),
            "{line}"
        );
        assert!(line.contains("fronts.edge.svc:19091: no address"), "{line}");
        assert!(line.contains("::1: none there"), "{line}");
    }

    #[test]
    fn settle_adds_a_fixed_wait_even_where_no_front_answered() {
        let args = Front {
            resolve: vec![],
            fronts: vec![format!("http://127.0.0.1:{}", free_port("127.0.0.1"))],
            wait: Duration::from_secs(30),
            settle: Duration::from_millis(400),
            source: None,
        };
        let started = Instant::now();
        assert_eq!(front(&args), ExitCode::SUCCESS);
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(400), "{took:?}");
        assert!(took < Duration::from_millis(400 + 900), "{took:?}");
    }

    /// A resolver that never answers: each question is held.
    #[derive(Debug)]
    struct Hangs;

    impl Resolve for Hangs {
        fn resolve(&self, _: &str) -> Result<Vec<SocketAddr>, String> {
            std::thread::sleep(Duration::from_secs(30));
            Err("held".into())
        }
    }

    #[test]
    fn a_resolver_that_never_answers_ends_at_the_deadline_and_says_so() {
        let wait = Duration::from_millis(300);
        let started = Instant::now();
        let (code, line) = front_with(&ask(&["fronts:19091"], &[], wait), Arc::new(Hangs), FAST);
        assert_eq!(code, ExitCode::FAILURE, "{line}");
        assert!(started.elapsed() < wait + Duration::from_secs(1));
        assert_eq!(
            line,
            "graceful-hook front: no resolution of fronts:19091 answered by the 300ms deadline"
        );
    }

    #[test]
    fn a_front_that_appears_at_a_later_resolution_is_told_and_waited_for() {
        let first = StandIn::start(
            "127.0.0.1",
            Script {
                ack_after: Some(Duration::from_millis(1500)),
                ..ACKS
            },
        )
        .unwrap();
        let late = StandIn::start(
            "127.0.0.1",
            Script {
                ack_after: Some(Duration::from_millis(1000)),
                ..ACKS
            },
        )
        .unwrap();
        let names = Arc::new(Names::default());
        names.set("fronts:19091", vec![first.addr]);
        let resolver: Arc<dyn Resolve> = names.clone();
        let hook = std::thread::spawn(move || {
            let args = ask(&["fronts:19091"], &[], Duration::from_secs(20));
            let started = Instant::now();
            let (code, line) = front_with(&args, resolver, FAST);
            (code, line, started.elapsed())
        });
        until("the first front is told", || first.closings() == 1);
        names.set("fronts:19091", vec![first.addr, late.addr]);
        let told_late = Instant::now();
        let (code, line, _) = hook.join().unwrap();
        assert_eq!(code, ExitCode::SUCCESS, "{line}");
        assert!(
            told_late.elapsed() >= Duration::from_millis(1000),
            "did not wait for the late front: {line}"
        );
        assert_eq!(late.closings(), 1);
        assert!(line.contains("2 of 2 fronts acknowledged"), "{line}");
        assert!(line.contains(&format!("{}: ", late.addr)), "{line}");
    }

    #[test]
    fn a_front_that_leaves_dns_is_dropped_and_named_left() {
        let stays = StandIn::start(
            "127.0.0.1",
            Script {
                ack_after: Some(Duration::from_millis(300)),
                ..ACKS
            },
        )
        .unwrap();
        let leaves = StandIn::start(
            "127.0.0.1",
            Script {
                ack_after: None,
                ..ACKS
            },
        )
        .unwrap();
        let names = Arc::new(Names::default());
        names.set("fronts:19091", vec![stays.addr, leaves.addr]);
        let resolver: Arc<dyn Resolve> = names.clone();
        let hook = std::thread::spawn(move || {
            front_with(
                &ask(&["fronts:19091"], &[], Duration::from_secs(20)),
                resolver,
                FAST,
            )
        });
        until("both fronts are told", || {
            stays.closings() == 1 && leaves.closings() == 1
        });
        names.set("fronts:19091", vec![stays.addr]);
        let (code, line) = hook.join().unwrap();
        assert_eq!(code, ExitCode::SUCCESS, "{line}");
        assert!(line.contains("1 of 1 fronts acknowledged"), "{line}");
        assert!(
            line.contains(&format!("{}: left (told at 0.0s", leaves.addr)),
            "{line}"
        );
    }

    #[test]
    fn a_403_front_counts_as_done() {
        let refuses = StandIn::start(
            "127.0.0.1",
            Script {
                closing: 403,
                ..ACKS
            },
        )
        .unwrap();
        let acks = StandIn::start(
            "127.0.0.1",
            Script {
                ack_after: Some(Duration::from_millis(200)),
                ..ACKS
            },
        )
        .unwrap();
        let (code, line) = front_with(
            &ask(&[], &[&refuses, &acks], Duration::from_secs(20)),
            no_names(),
            FAST,
        );
        assert_eq!(code, ExitCode::SUCCESS, "{line}");
        assert!(line.contains("1 of 1 fronts acknowledged"), "{line}");
        assert!(
            line.contains(&format!(
                "{}: 403 not_a_member, sends us nothing",
                refuses.addr
            )),
            "{line}"
        );
        // Only 403s: nothing to wait for, at once.
        let started = Instant::now();
        let (code, line) = front_with(
            &ask(&[], &[&refuses], Duration::from_secs(20)),
            no_names(),
            FAST,
        );
        assert_eq!(code, ExitCode::SUCCESS, "{line}");
        assert!(started.elapsed() < Duration::from_millis(900));
        assert!(
            line.starts_with("graceful-hook front: no front sends us requests: returned at once"),
            "{line}"
        );
        assert_eq!(refuses.closings(), 2, "never asked again after a 403");
    }

    #[test]
    fn a_front_that_forgot_the_closing_is_told_again() {
        let forgets = StandIn::start(
            "127.0.0.1",
            Script {
                ack_after: Some(Duration::from_millis(100)),
                forgets_once: true,
                ..ACKS
            },
        )
        .unwrap();
        let (code, line) = front_with(
            &ask(&[], &[&forgets], Duration::from_secs(20)),
            no_names(),
            FAST,
        );
        assert_eq!(code, ExitCode::SUCCESS, "{line}");
        assert_eq!(forgets.closings(), 2, "told again");
        assert!(line.contains("1 of 1 fronts acknowledged"), "{line}");
    }

    #[test]
    fn a_front_without_the_endpoints_is_never_acknowledged() {
        // A listener that answers everything 404 (the control chain's
        // direct_response with no front filter in it).
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                request_line(&mut conn);
                respond(&mut conn, 404, "");
            }
        });
        let args = Front {
            resolve: vec![],
            fronts: vec![url],
            wait: Duration::from_millis(500),
            settle: Duration::ZERO,
            source: None,
        };
        let (code, line) = front_with(&args, no_names(), FAST);
        assert_eq!(code, ExitCode::FAILURE, "{line}");
        assert!(
            line.contains("127.0.0.1 never acknowledged (never told, last answer"),
            "{line}"
        );
        assert!(line.contains("closing answered 404"), "{line}");
    }

    #[test]
    fn acknowledgement_figures_are_read_from_whatever_json_there_is() {
        let f = Figures::read(
            r#"{"host":{"inflight_at_closing":"3","steered_after_ms":2.0,"last_active_ms":5100,"late":1}}"#,
        );
        assert_eq!(
            f.to_string(),
            "3 in flight at closing, steered at 2ms, last ended at 5.1s, 1 late"
        );
        assert_eq!(Figures::read("ok").to_string(), "acknowledged");
        assert_eq!(
            Figures::read(r#"{"state":"acknowledged"}"#).to_string(),
            "acknowledged"
        );
        assert!(says_serving(r#"{"entries":[{"state":"serving"}]}"#));
        assert!(!says_serving(r#"{"state":"steered"}"#));
        assert_eq!(
            after_drained(&Ok((200, r#"{"state":"serving"}"#.into()))),
            Next::TellAgain("it says serving".into())
        );
        assert_eq!(
            after_drained(&Ok((409, String::new()))),
            Next::TellAgain("drained answered 409".into())
        );
        assert_eq!(after_drained(&Ok((503, String::new()))), Next::Again(None));
        assert_eq!(
            after_closing(false, &Ok((403, r#"{"refused":"not_a_member"}"#.into()))),
            Next::Again(Some("closing answered 403 not_a_member".into()))
        );
        assert_eq!(
            after_closing(true, &Err(Failure::Unreachable("refused".into()))),
            Next::NoneThere
        );
        assert_eq!(
            after_closing(false, &Err(Failure::Unreachable("refused".into()))),
            Next::Again(Some("closing: refused".into()))
        );
    }
}
