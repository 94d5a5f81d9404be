//! What a host does for a filter, as small traits: the one surface the
//! filters' callbacks ([`crate::provider`], [`crate::drain`],
//! [`crate::consumer`]) are written against. The proxy-wasm glue
//! (`filters/guest`) and the native module (`filters/native`) each
//! implement them once; unit tests use `shared::mock`.
//!
//! [`Host`] is what any callback can do (shared data, the clocks, metrics,
//! the log, HTTP calls); [`Stream`] adds what a stream's callbacks can do
//! (its headers, its attributes, a local reply).

use std::cell::RefCell;
use std::time::Duration;

use crate::shared::metrics::{Metric, Metrics, PhaseGauge};
use crate::shared::store::SharedStore;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

/// What any callback can ask of the host.
pub trait Host {
    /// The process's shared data (the wasm build's `vm_id`).
    fn store(&self) -> &dyn SharedStore;
    /// The process's monotonic clock in µs, from an arbitrary start (0 if
    /// unavailable): every duration, expiry and time the filters keep (the
    /// gate, the quiet window, tombstone TTLs, the report), so a step of the
    /// wall clock (NTP, an operator) changes none. One clock for the whole
    /// process, every VM copy and thread (times in shared data are compared
    /// across them); shared data never leaves the process, so neither do
    /// these values (docs/design/shared-data.md).
    fn now_us(&self) -> u64;
    /// The wall clock, µs since the Unix epoch (0 if unavailable): only for
    /// what must differ between processes (the instance id's seed), never
    /// for a duration.
    fn wall_clock_us(&self) -> u64;
    fn log(&self, level: Level, line: &str);
    fn metric_add(&self, metric: Metric, delta: i64);
    fn metric_set(&self, metric: Metric, value: u64);
    /// The current value; None if this host cannot read it.
    fn metric_get(&self, metric: Metric) -> Option<u64>;
    /// Whether the metric counts (configure time): Envoy's `stats_matcher`
    /// turns a rejected stat into one that reads 0 whatever is added, which
    /// a host that reads its counts from Envoy stats cannot work with.
    fn metric_is_kept(&self, metric: Metric) -> bool;
    /// Sends an HTTP call; its answer comes back to the filter's
    /// `call_answered` with the token. Err: the host's reason.
    fn dispatch(&self, call: &HttpCall) -> Result<u32, String>;
}

/// An HTTP call to a cluster.
#[derive(Debug, Clone, Copy)]
pub struct HttpCall<'a> {
    pub cluster: &'a str,
    pub headers: &'a [(&'a str, &'a str)],
    /// Empty: no body.
    pub body: &'a [u8],
    pub timeout: Duration,
}

/// One header: name and value.
pub type Pair<'a> = (&'a [u8], &'a [u8]);

/// What reads a header map: every pair, in order.
pub type HeaderScan<'s> = dyn FnMut(&mut dyn Iterator<Item = Pair<'_>>) + 's;

/// A header map of the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Map {
    RequestHeaders,
    ResponseHeaders,
    ResponseTrailers,
}

/// An Envoy attribute a filter reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Attribute {
    /// `source.address` (`ip:port`).
    SourceAddress,
    /// `destination.address`: the address the request reached.
    DestinationAddress,
    /// `upstream.address`: the host that answered.
    UpstreamAddress,
    /// The route's cluster (`xds.cluster_name`).
    ClusterName,
    /// `upstream.transport_failure_reason` (empty: none). Envoy sets it for
    /// a refused connection, not for one that timed out.
    UpstreamTransportFailureReason,
    /// `upstream.local_address`: present once the attempt has a connection.
    UpstreamLocalAddress,
    /// `upstream.cx_pool_ready_duration`: present once the connection pool
    /// answered the attempt, with a connection or a failure; absent for one
    /// cancelled while it waited (its request was reset).
    UpstreamPoolAnswered,
}

/// A local reply.
#[derive(Debug, Clone, Copy)]
pub struct LocalReply<'a> {
    pub status: u32,
    pub headers: &'a [(&'a str, &'a str)],
    pub body: &'a [u8],
    /// For a gRPC request: the grpc-status of the trailers-only reply.
    pub grpc_status: Option<i32>,
    /// Envoy's response code details where the host records them.
    pub details: &'static str,
}

/// What a stream's callbacks can ask of the host, besides [`Host`].
pub trait Stream: Host {
    fn header(&self, map: Map, name: &str) -> Option<Vec<u8>>;
    /// Runs `scan` over every pair of `map`, in order, from one read of the
    /// whole map, borrowed where the host can; false (and `scan` not run)
    /// if the map is not available.
    fn scan_headers(&self, map: Map, scan: &mut HeaderScan) -> bool;
    /// Sets a header, replacing any value; false if the host refused.
    fn set_header(&self, map: Map, name: &str, value: &str) -> bool;
    fn remove_header(&self, map: Map, name: &str) -> bool;
    /// Removes every value of each of `names` from `map`, as
    /// [`Stream::remove_header`] of each does. A host where one listing of
    /// the map costs less than a removal of a header that is not there
    /// (natively: a removal builds a lower-cased copy of the name and
    /// searches the map) lists it and removes only the names present.
    fn remove_headers(&self, map: Map, names: &[&str]) {
        for name in names {
            self.remove_header(map, name);
        }
    }
    /// Sends a local reply; false if the host refused (the stream was
    /// answered already). Natively the host adds `grpc-status` and
    /// `grpc-message` (the body) for a gRPC reply: Envoy derives none there.
    fn send_reply(&self, reply: &LocalReply) -> bool;
    fn attribute(&self, attribute: Attribute) -> Option<Vec<u8>>;
    /// `response.flags`.
    fn response_flags(&self) -> Option<u64>;

    fn attribute_text(&self, attribute: Attribute) -> Option<String> {
        String::from_utf8(self.attribute(attribute)?).ok()
    }
}

/// An HTTP call's answer, read lazily.
pub trait CallResponse {
    /// A header of the answer (`:status` is absent when the call failed).
    fn header(&self, name: &str) -> Option<Vec<u8>>;
    /// Up to `max` bytes of the body.
    fn body(&self, max: usize) -> Vec<u8>;
}

/// A filter's mutable state as its delivery keeps it: in a `RefCell` per
/// wasm VM copy (a panic there traps the VM: its state is never used
/// again), and natively in a cell shared by the module's threads that
/// rebuilds the state after a panic (`filters/native/src/copies.rs`). A
/// bare `Mutex` is deliberately not one: its poison would only be ignored,
/// and a panic halfway through a change would leave every later caller on
/// the half-changed state.
pub trait StateCell<T> {
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R;
}

impl<T> StateCell<T> for RefCell<T> {
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut self.borrow_mut())
    }
}

/// [`Metrics`] and the [`PhaseGauge`] over a host's metrics.
pub struct HostMetrics<'a, H: ?Sized>(pub &'a H);

impl<H: Host + ?Sized> Metrics for HostMetrics<'_, H> {
    fn add(&self, metric: Metric, delta: i64) {
        self.0.metric_add(metric, delta);
    }

    fn get(&self, metric: Metric) -> Option<u64> {
        self.0.metric_get(metric)
    }
}

impl<H: Host + ?Sized> PhaseGauge for HostMetrics<'_, H> {
    fn get(&self) -> Option<u64> {
        self.0.metric_get(Metric::DrainPhase)
    }

    fn set(&self, value: u64) {
        self.0.metric_set(Metric::DrainPhase, value);
    }
}

/// What a stream callback tells the host to do with the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Continue,
    /// Answered locally, or held: the stream goes no further for now.
    Stop,
}
