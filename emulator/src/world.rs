//! The state one emulated Envoy process holds: the clock, the shared-data
//! namespace, metrics, logs, the trace, every VM copy's contexts, streams
//! and HTTP calls. One `World` per [`Host`](super::Host), shared by its VM
//! copies through an `Rc<RefCell<_>>` (everything runs on the test's thread).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::time::Duration;

use super::headers::HeaderMap;
use super::shared::SharedData;

/// A proxy-wasm log level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
    Critical,
}

impl Level {
    pub(crate) fn from_abi(v: i32) -> Option<Level> {
        Some(match v {
            0 => Level::Trace,
            1 => Level::Debug,
            2 => Level::Info,
            3 => Level::Warn,
            4 => Level::Error,
            5 => Level::Critical,
            _ => return None,
        })
    }
}

/// One `proxy_log` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// Which VM copy logged it (`"drain#1"`).
    pub vm: String,
    pub level: Level,
    pub message: String,
}

/// A local reply as the filter asked for it (`send_local_response`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u32,
    /// The filter's own headers, before Envoy adds `content-type` and the like.
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    /// The gRPC status the filter gave; None for the SDK's "let Envoy derive
    /// it" (-1).
    pub grpc_status: Option<u32>,
    pub details: String,
    /// Which VM copy sent it.
    pub vm: String,
}

impl LocalReply {
    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The value of one of the filter's headers.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.text(name)
    }
}

/// A response as the client would receive it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Response {
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    /// None when the response had no trailers (a map exists only if the
    /// upstream sent trailers or a filter added them at the end of the body).
    pub trailers: Option<HeaderMap>,
}

impl Response {
    /// `:status` as a number (0 if absent or not a number).
    pub fn status(&self) -> u32 {
        self.headers
            .text(":status")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.text(name)
    }

    /// A trailer as text.
    pub fn trailer(&self, name: &str) -> Option<String> {
        self.trailers.as_ref().and_then(|t| t.text(name))
    }
}

/// What became of an HTTP call a filter dispatched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallState {
    /// Waiting for the test (or a scripted answer, or the timeout).
    Pending,
    /// Answered with this status.
    Answered(u32),
    /// Failed (timeout or [`Host::fail_call`](super::Host::fail_call)):
    /// delivered with no headers, like Envoy does.
    Failed,
    /// The dispatching context went away first: Envoy cancels such calls.
    Cancelled,
}

/// An HTTP call made with `proxy_http_call`.
#[derive(Debug, Clone)]
pub struct HttpCall {
    /// Index in [`Host::http_calls`](super::Host::http_calls); pass it to
    /// `answer_call` / `fail_call`.
    pub id: usize,
    /// VM copy that made it.
    pub vm: String,
    pub cluster: String,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    pub timeout: Duration,
    /// Virtual time since the host started.
    pub sent_at: Duration,
    pub state: CallState,
    pub(crate) vm_index: usize,
    pub(crate) context_id: u32,
    pub(crate) token: u32,
}

impl HttpCall {
    /// `:path` of the call.
    pub fn path(&self) -> String {
        self.headers.text(":path").unwrap_or_default()
    }

    /// A request header of the call.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.text(name)
    }
}

/// A scripted or test-given answer to an HTTP call.
#[derive(Debug, Clone, Default)]
pub struct CallAnswer {
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    pub trailers: HeaderMap,
}

impl CallAnswer {
    /// An answer with this status, extra headers and body.
    pub fn new<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        status: u32,
        headers: &[(K, V)],
        body: impl Into<Vec<u8>>,
    ) -> CallAnswer {
        let mut map = HeaderMap::from_pairs(&[(":status", status.to_string())]);
        for (k, v) in headers {
            map.add(k.as_ref(), v.as_ref());
        }
        CallAnswer {
            headers: map,
            body: body.into(),
            trailers: HeaderMap::default(),
        }
    }
}

/// A function that answers HTTP calls to one cluster as they are made.
pub type Responder = Box<dyn FnMut(&HttpCall) -> Option<CallAnswer>>;

/// A write by "another worker", injected between a VM's read of a key and
/// its compare-and-swap.
pub(crate) struct Race {
    pub key: String,
    pub remaining: usize,
    pub write: Box<dyn FnMut(&SharedData)>,
}

/// Metric kinds, numbered as in the ABI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MetricKind {
    Counter,
    Gauge,
    Histogram,
}

pub(crate) struct Metric {
    pub name: String,
    pub kind: MetricKind,
    /// Counter total or gauge value (i64 so a double decrement shows as a
    /// negative gauge instead of a wrapped u64).
    pub value: i64,
    pub samples: Vec<u64>,
    /// A null stat: reads 0, whatever is added or set.
    pub null: bool,
}

/// Which VM callback is running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Callback {
    Initialize,
    ContextCreate,
    VmStart,
    Configure,
    Tick,
    RequestHeaders,
    RequestBody,
    RequestTrailers,
    ResponseHeaders,
    ResponseBody,
    ResponseTrailers,
    Log,
    Done,
    Delete,
    HttpCallResponse,
}

/// The VM call in progress on one VM copy.
pub(crate) struct Active {
    pub callback: Callback,
    /// `proxy_set_effective_context` moves this; hostcalls act on it.
    pub effective: u32,
    /// The answer being delivered (on_http_call_response only).
    pub call_answer: Option<CallAnswer>,
}

/// A context of a VM copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ctx {
    Root,
    /// Filter `filter` of stream `stream`'s chain.
    Stream {
        stream: usize,
        filter: usize,
    },
}

pub(crate) struct VmState {
    pub name: String,
    /// Name prefix of this module's copies (`drain`).
    pub short: String,
    /// The plugin name (`graceful_drain`).
    pub plugin: String,
    pub plugin_config: Vec<u8>,
    pub vm_config: Vec<u8>,
    /// Live contexts (created and not yet deleted).
    pub contexts: BTreeMap<u32, Ctx>,
    pub next_context_id: u32,
    pub active: Option<Active>,
    pub tick_period_ms: u32,
    pub next_tick_ns: Option<u64>,
    pub ticks_held: bool,
    /// A VM that failed to start, or trapped: Envoy stops using it.
    pub dead: bool,
    pub next_token: u32,
    /// Bytes written to WASI stdout/stderr not yet ended by a newline.
    pub stdio: Vec<u8>,
}

/// Which header maps and buffers one filter of a stream may touch now.
/// Envoy hands a filter its request headers during `decodeHeaders` only
/// (and keeps them while it is paused there), its response headers during
/// `encodeHeaders`, and so on; outside, the maps are gone (BadArgument).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Open {
    pub request_headers: bool,
    pub request_body: bool,
    pub request_trailers: bool,
    pub response_headers: bool,
    pub response_body: bool,
    pub response_trailers: bool,
    /// The body callback in progress is the last one (trailers may be
    /// created now).
    pub end_of_stream: bool,
    /// `on_log`: maps readable, not writable.
    pub log: bool,
}

pub(crate) struct Slot {
    pub vm: usize,
    pub context_id: u32,
    /// `proxy_on_context_create` ran.
    pub created: bool,
    /// `proxy_on_delete` ran.
    pub deleted: bool,
    pub open: Open,
}

pub(crate) struct Stream {
    pub chain: Vec<Slot>,
    pub properties: BTreeMap<String, Vec<u8>>,
    pub request_headers: Option<HeaderMap>,
    pub request_body: Vec<u8>,
    pub request_trailers: Option<HeaderMap>,
    pub response_headers: Option<HeaderMap>,
    pub response_body: Vec<u8>,
    pub response_trailers: Option<HeaderMap>,
    /// Everything the upstream's and local reply's bodies carried.
    pub response_body_total: Vec<u8>,
    pub local_reply: Option<LocalReply>,
    pub grpc: bool,
    /// The request went through every filter (the router got it).
    pub reached_upstream: bool,
    /// Index of the filter that stopped the request, if one did.
    pub stopped_at: Option<usize>,
    pub response_started: bool,
    pub response_complete: bool,
    pub ended: bool,
}

/// Work Envoy does after a VM call returns (never inside it).
pub(crate) enum Deferred {
    /// Deliver the local reply of `stream`, sent by filter `filter`.
    LocalReply { stream: usize, filter: usize },
    /// Offer a new HTTP call to the scripted responders.
    CallMade { call: usize },
}

/// Ring buffer of trace lines: the last ones matter when a test fails.
pub(crate) struct Trace {
    pub lines: VecDeque<String>,
    pub dropped: usize,
}

const TRACE_LINES: usize = 4000;
const TRACE_VALUE: usize = 96;

impl Trace {
    pub fn push(&mut self, line: String) {
        if self.lines.len() == TRACE_LINES {
            self.lines.pop_front();
            self.dropped += 1;
        }
        self.lines.push_back(line);
    }
}

/// Bytes for a trace line: text quoted (control bytes escaped), binary
/// values (shared-data records) in hex; long values cut short.
pub(crate) fn show(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(TRACE_VALUE)];
    let printable = cut
        .iter()
        .filter(|b| b.is_ascii_graphic() || **b == b' ')
        .count();
    let mut s = String::new();
    if cut.len() >= 8 && printable * 2 < cut.len() {
        s.push_str("0x");
        for b in cut {
            let _ = write!(s, "{b:02x}");
        }
    } else {
        s.push('"');
        for chunk in cut.utf8_chunks() {
            for c in chunk.valid().chars() {
                if c.is_control() {
                    let _ = write!(s, "\\x{:02x}", c as u32);
                } else {
                    s.push(c);
                }
            }
            for b in chunk.invalid() {
                let _ = write!(s, "\\x{b:02x}");
            }
        }
        s.push('"');
    }
    if bytes.len() > TRACE_VALUE {
        let _ = write!(s, "…({} bytes)", bytes.len());
    }
    s
}

pub(crate) struct World {
    /// The monotonic clock when the host was created.
    pub start_ns: u64,
    /// The monotonic clock: what ticks and timeouts are due on, what
    /// [`advance`](crate::Host::advance) moves.
    pub now_ns: u64,
    /// The wall clock when the host was created; it moves with the
    /// monotonic clock, plus every step.
    pub wall_start_ns: u64,
    /// The wall clock's steps so far, signed.
    pub wall_step_ns: i128,
    pub store: SharedData,
    pub races: Vec<Race>,
    pub metrics: Vec<Metric>,
    /// Stat names Envoy would turn into null stats (its `stats_matcher`).
    pub rejected_stats: Vec<String>,
    pub logs: Vec<LogLine>,
    pub trace: Trace,
    pub vms: Vec<VmState>,
    pub streams: Vec<Stream>,
    pub calls: Vec<HttpCall>,
    pub clusters: BTreeSet<String>,
    pub responders: Vec<(String, Responder)>,
    pub deferred: VecDeque<Deferred>,
    pub rng: u64,
}

impl World {
    pub fn new(start_ns: u64, wall_start_ns: u64) -> World {
        World {
            start_ns,
            now_ns: start_ns,
            wall_start_ns,
            wall_step_ns: 0,
            store: SharedData::new(),
            races: Vec::new(),
            metrics: Vec::new(),
            rejected_stats: Vec::new(),
            logs: Vec::new(),
            trace: Trace {
                lines: VecDeque::new(),
                dropped: 0,
            },
            vms: Vec::new(),
            streams: Vec::new(),
            calls: Vec::new(),
            clusters: BTreeSet::new(),
            responders: Vec::new(),
            deferred: VecDeque::new(),
            rng: 0x9e37_79b9_7f4a_7c15,
        }
    }

    /// Virtual time since the host started.
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.now_ns - self.start_ns)
    }

    /// The wall clock in ns since the Unix epoch (0 if stepped before it).
    pub fn wall_ns(&self) -> u64 {
        let ns = i128::from(self.wall_start_ns)
            + i128::from(self.now_ns - self.start_ns)
            + self.wall_step_ns;
        u64::try_from(ns.max(0)).unwrap_or(u64::MAX)
    }

    /// Appends a trace line stamped with the virtual time.
    pub fn note(&mut self, who: &str, line: impl AsRef<str>) {
        let t = self.elapsed();
        let line = format!(
            "[t+{}.{:06}s] {who:<12} {}",
            t.as_secs(),
            t.subsec_micros(),
            line.as_ref()
        );
        self.trace.push(line);
    }

    /// Deterministic pseudo-random bytes (xorshift64*), for WASI `random_get`.
    pub fn random(&mut self, out: &mut [u8]) {
        for b in out {
            let mut x = self.rng;
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            self.rng = x;
            *b = (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8;
        }
    }

    /// The context a hostcall of VM `vm` acts on (the effective one).
    pub fn current_ctx(&self, vm: usize) -> Option<(u32, Ctx)> {
        let state = self.vms.get(vm)?;
        let id = state.active.as_ref()?.effective;
        Some((id, *state.contexts.get(&id)?))
    }

    pub fn active(&self, vm: usize) -> Option<&Active> {
        self.vms.get(vm)?.active.as_ref()
    }
}
