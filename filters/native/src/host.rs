//! The core's host traits ([`graceful_core::shared::host`]) over the
//! dynamic-module ABI.
//!
//! Metric values are the module's: [`METRICS`], one set of SC atomics per
//! process (Envoy's stats are such atomics too), which every filter reads.
//! Each change is mirrored to the contract's Envoy stat through what the
//! hook has: its stream (worker hooks) or its config (main-thread hooks).
//! A hook with neither (a stream destroyed without `stream_complete`, an
//! upstream filter, whose stats would live in the cluster's scope) owes
//! the change; the next hook of the metric's filter that can write pays it.
//!
//! | change | through a stream | through a config |
//! |---|---|---|
//! | counter +n | counter +n | counter +n |
//! | gauge ±n | gauge ±n (exact under races) | gauge = value (the ABI has no config-level gauge add) |
//! | gauge = v | gauge = v | gauge = v |

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering::SeqCst};

use graceful_core::shared::headers::CONTENT_TYPE;
use graceful_core::shared::host::{
    Attribute, CallResponse, HeaderScan, Host, HttpCall, Level, LocalReply, Map, Stream,
};
use graceful_core::shared::keys::Owner;
use graceful_core::shared::metrics::{AtomicMetrics, Kind, Metric};
use graceful_core::shared::store::{SharedStore, SyncStore};

use crate::abi::{self, HeaderType};

/// The process's shared data (the wasm build's `vm_id: graceful`).
pub static STORE: SyncStore = SyncStore::new();
/// Every metric's value.
pub static METRICS: AtomicMetrics = AtomicMetrics::new();

const COUNT: usize = Metric::ALL.len();
#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicI64 = AtomicI64::new(0);
#[allow(clippy::declare_interior_mutable_const)]
const NO: AtomicBool = AtomicBool::new(false);
/// Deltas not yet mirrored, by metric.
static OWED_DELTA: [AtomicI64; COUNT] = [ZERO; COUNT];
/// Gauges set and not yet mirrored, by metric.
static OWED_SET: [AtomicBool; COUNT] = [NO; COUNT];
/// Something is owed to a metric of this filter (by [`owner_index`]): one
/// load per mirrored change when nothing is.
static OWED_BY: [AtomicBool; 3] = [NO; 3];

fn owner_index(o: Owner) -> usize {
    match o {
        Owner::Provider => 0,
        Owner::Drain => 1,
        Owner::Consumer => 2,
    }
}

/// The Envoy stat ids one config defined: its filter's metrics.
pub struct Ids([Option<usize>; COUNT]);

impl Ids {
    pub fn define(envoy: abi::Config<'_>, filter: Owner) -> Ids {
        let mut ids = [None; COUNT];
        for m in Metric::defined_by(filter, false) {
            ids[m.index()] = match m.kind() {
                Kind::Counter => envoy.define_counter(m.name()),
                Kind::Gauge => envoy.define_gauge(m.name()),
            };
        }
        Ids(ids)
    }

    /// No stats: an upstream filter's would live in its cluster's scope,
    /// where the contract's are process-wide; its changes are owed.
    pub const NONE: Ids = Ids([None; COUNT]);
}

/// Where a hook writes Envoy stats.
#[derive(Clone, Copy)]
enum Sink<'a> {
    Stream(abi::Stream<'a>),
    Config(abi::Config<'a>),
    None,
}

/// A hook's host: its stream (if a stream hook), else its config (if a
/// main-thread config hook), and its config's stat ids.
pub struct Native<'a> {
    sink: Sink<'a>,
    ids: &'a Ids,
}

impl<'a> Native<'a> {
    pub fn stream(s: abi::Stream<'a>, ids: &'a Ids) -> Native<'a> {
        Native {
            sink: Sink::Stream(s),
            ids,
        }
    }

    /// Main thread only: calls and config-level stats.
    pub fn config(c: abi::Config<'a>, ids: &'a Ids) -> Native<'a> {
        Native {
            sink: Sink::Config(c),
            ids,
        }
    }

    /// A hook with no pointer to write with: every change is owed.
    pub fn detached(ids: &'a Ids) -> Native<'a> {
        Native {
            sink: Sink::None,
            ids,
        }
    }

    fn abi_stream(&self) -> Option<abi::Stream<'a>> {
        match self.sink {
            Sink::Stream(s) => Some(s),
            _ => None,
        }
    }

    /// The Envoy id of `m` if this hook can write it now.
    fn writable(&self, m: Metric) -> Option<usize> {
        if matches!(self.sink, Sink::None) {
            return None;
        }
        self.ids.0[m.index()]
    }

    fn owe(m: Metric, delta: Option<i64>) {
        match delta {
            Some(d) => {
                OWED_DELTA[m.index()].fetch_add(d, SeqCst);
            }
            None => OWED_SET[m.index()].store(true, SeqCst),
        }
        OWED_BY[owner_index(m.owner())].store(true, SeqCst);
    }

    /// Pays what is owed to the metrics of `filter` this hook can write.
    fn settle(&self, filter: Owner) {
        // A load first: every mirrored change passes here, and a swap on
        // every one would make the flag's cache line bounce between workers.
        let owed = &OWED_BY[owner_index(filter)];
        if !owed.load(SeqCst) || !owed.swap(false, SeqCst) {
            return;
        }
        let mut left = false;
        for m in Metric::ALL.into_iter().filter(|m| m.owner() == filter) {
            let Some(id) = self.writable(m) else {
                left |= OWED_SET[m.index()].load(SeqCst) || OWED_DELTA[m.index()].load(SeqCst) != 0;
                continue;
            };
            if OWED_SET[m.index()].swap(false, SeqCst) {
                self.write_value(id, m);
            }
            let d = OWED_DELTA[m.index()].swap(0, SeqCst);
            if d != 0 {
                self.write_delta(id, m, d);
            }
        }
        if left {
            owed.store(true, SeqCst);
        }
    }

    fn write_delta(&self, id: usize, m: Metric, delta: i64) {
        match (self.sink, m.kind()) {
            (Sink::Stream(s), Kind::Counter) => s.counter_add(Some(id), delta.unsigned_abs()),
            (Sink::Stream(s), Kind::Gauge) => s.gauge_add(Some(id), delta),
            (Sink::Config(c), Kind::Counter) => c.counter_add(Some(id), delta.unsigned_abs()),
            (Sink::Config(_), Kind::Gauge) => self.write_value(id, m),
            (Sink::None, _) => {}
        }
    }

    fn write_value(&self, id: usize, m: Metric) {
        let v = METRICS.value(m);
        match self.sink {
            Sink::Stream(s) => s.gauge_set(Some(id), v),
            Sink::Config(c) => c.gauge_set(Some(id), v),
            Sink::None => {}
        }
    }
}

fn header_type(map: Map) -> HeaderType {
    match map {
        Map::RequestHeaders => abi::REQUEST_HEADERS,
        Map::ResponseHeaders => abi::RESPONSE_HEADERS,
        Map::ResponseTrailers => abi::RESPONSE_TRAILERS,
    }
}

impl Host for Native<'_> {
    fn store(&self) -> &dyn SharedStore {
        &STORE
    }

    fn now_us(&self) -> u64 {
        crate::clock::monotonic_us()
    }

    fn wall_clock_us(&self) -> u64 {
        crate::clock::wall_clock_us()
    }

    fn log(&self, level: Level, line: &str) {
        let level = match level {
            Level::Debug => abi::LOG_DEBUG,
            Level::Info => abi::LOG_INFO,
            Level::Warn => abi::LOG_WARN,
            Level::Error => abi::LOG_ERROR,
        };
        abi::log(level, line);
    }

    fn metric_add(&self, m: Metric, delta: i64) {
        METRICS.metric_add(m, delta);
        match self.writable(m) {
            Some(id) => {
                self.settle(m.owner());
                self.write_delta(id, m, delta);
            }
            None => Native::owe(m, Some(delta)),
        }
    }

    fn metric_set(&self, m: Metric, value: u64) {
        METRICS.metric_set(m, value);
        match self.writable(m) {
            Some(id) => {
                self.settle(m.owner());
                self.write_value(id, m);
            }
            None => Native::owe(m, None),
        }
    }

    fn metric_get(&self, m: Metric) -> Option<u64> {
        Some(METRICS.value(m))
    }

    /// The values are the module's atomics, whatever Envoy keeps.
    fn metric_is_kept(&self, _m: Metric) -> bool {
        true
    }

    /// A config callout: main thread only, so a stream hook cannot call.
    /// Callout ids count up from 1 per config: a u32 lasts.
    fn dispatch(&self, call: &HttpCall) -> Result<u32, String> {
        let Sink::Config(c) = self.sink else {
            return Err("calls are made from the main thread only".into());
        };
        let timeout_ms = u64::try_from(call.timeout.as_millis()).unwrap_or(u64::MAX);
        c.callout(call.cluster, call.headers, call.body, timeout_ms)
            .map(|id| u32::try_from(id).unwrap_or(u32::MAX))
            .map_err(|r| format!("init result {r}"))
    }
}

impl Stream for Native<'_> {
    fn header(&self, map: Map, name: &str) -> Option<Vec<u8>> {
        self.abi_stream()?.header(header_type(map), name)
    }

    fn scan_headers(&self, map: Map, scan: &mut HeaderScan) -> bool {
        let Some(s) = self.abi_stream() else {
            return false;
        };
        s.with_headers(header_type(map), |pairs| scan(pairs));
        true
    }

    fn set_header(&self, map: Map, name: &str, value: &str) -> bool {
        self.abi_stream()
            .is_some_and(|s| s.set_header(header_type(map), name, value))
    }

    fn remove_header(&self, map: Map, name: &str) -> bool {
        self.abi_stream()
            .is_some_and(|s| s.remove_header(header_type(map), name))
    }

    /// One listing (Envoy's pointers into the map, no copy) instead of a
    /// removal per name: clients seldom send the headers removed here.
    fn remove_headers(&self, map: Map, names: &[&str]) {
        let Some(s) = self.abi_stream() else {
            return;
        };
        // Which names are there; the map is not changed while listed.
        let mut present = [false; 4];
        s.with_headers(header_type(map), |pairs| {
            for (name, _) in pairs {
                for (i, wanted) in names.iter().take(present.len()).enumerate() {
                    present[i] |= name.eq_ignore_ascii_case(wanted.as_bytes());
                }
            }
        });
        for (i, name) in names.iter().enumerate() {
            if present.get(i).is_none_or(|p| *p) {
                s.remove_header(header_type(map), name);
            }
        }
    }

    /// The native local reply derives no grpc-status from the HTTP status
    /// (a gRPC caller reads 0, OK): a reply to a gRPC request carries its
    /// own, as proxy-wasm's `grpc_status` does (Envoy uses that one only
    /// for a gRPC request too).
    fn send_reply(&self, reply: &LocalReply) -> bool {
        let Some(s) = self.abi_stream() else {
            return false;
        };
        let mut headers = reply.headers.to_vec();
        // The request's content type is read only for a reply that names a
        // gRPC status.
        let grpc_status = reply
            .grpc_status
            .filter(|_| {
                self.header(Map::RequestHeaders, CONTENT_TYPE)
                    .is_some_and(|t| t.starts_with(b"application/grpc"))
            })
            .map(|c| c.to_string());
        let message = String::from_utf8_lossy(reply.body);
        if let Some(code) = &grpc_status {
            headers.push(("grpc-status", code));
            headers.push(("grpc-message", &message));
        }
        s.send_response(reply.status, &headers, reply.body, reply.details);
        true
    }

    fn attribute(&self, attribute: Attribute) -> Option<Vec<u8>> {
        let s = self.abi_stream()?;
        match attribute {
            Attribute::SourceAddress => s.attribute_string(abi::ATTR_SOURCE_ADDRESS),
            Attribute::DestinationAddress => s.attribute_string(abi::ATTR_DESTINATION_ADDRESS),
            Attribute::UpstreamAddress => s.attribute_string(abi::ATTR_UPSTREAM_ADDRESS),
            Attribute::ClusterName => s
                .cluster_name()
                .map(String::into_bytes)
                .or_else(|| s.attribute_string(abi::ATTR_XDS_CLUSTER_NAME)),
            // Not in ABI v0.2.0: the native consumer finds failed attempts
            // at their destruction instead (see consumer.rs).
            Attribute::UpstreamTransportFailureReason
            | Attribute::UpstreamLocalAddress
            | Attribute::UpstreamPoolAnswered => None,
        }
    }

    fn response_flags(&self) -> Option<u64> {
        self.abi_stream()?.attribute_int(abi::ATTR_RESPONSE_FLAGS)
    }
}

/// The answer to a config callout, copied out of the hook's buffers.
pub struct CalloutAnswer<'a> {
    pub headers: &'a [(Vec<u8>, Vec<u8>)],
    pub body: &'a [u8],
}

impl CallResponse for CalloutAnswer<'_> {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v.clone())
    }

    fn body(&self, max: usize) -> Vec<u8> {
        self.body[..self.body.len().min(max)].to_vec()
    }
}
