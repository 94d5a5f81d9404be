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
//! | gauge ±n | gauge ±n | gauge ±n |
//! | gauge = v | gauge = v | gauge = v |
//!
//! A gauge that changes by deltas (the in-flight counts, tombstones) is
//! mirrored by deltas only, from every thread: Envoy's gauge is then the
//! sum of the same deltas as the module's atomic, whatever the order.
//! Setting it from the module's count instead (once done from the main
//! thread) races a worker's add between the read and the set, and the two
//! drift apart for good. Only a gauge the filters set (the drain phase)
//! is mirrored by value.

use std::cell::RefCell;
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
    pub fn define(envoy: &abi::Config<'_>, filter: Owner) -> Ids {
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

/// Where a hook writes Envoy stats. The stream is in a cell: the core's
/// callbacks take the host by shared reference, and a header change
/// borrows it mutably (never while a listing of it is being read).
enum Sink<'a> {
    Stream(RefCell<abi::Stream<'a>>),
    Config(&'a abi::Config<'a>),
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
            sink: Sink::Stream(RefCell::new(s)),
            ids,
        }
    }

    /// Main thread only: calls and config-level stats.
    pub fn config(c: &'a abi::Config<'a>, ids: &'a Ids) -> Native<'a> {
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

    fn abi_stream(&self) -> Option<&RefCell<abi::Stream<'a>>> {
        match &self.sink {
            Sink::Stream(s) => Some(s),
            _ => None,
        }
    }

    /// The stream's worker (0-based); None in a config hook.
    pub fn worker_index(&self) -> Option<u32> {
        Some(self.abi_stream()?.borrow().worker_index())
    }

    /// A scheduler of this hook's stream (of none in a config hook).
    pub fn scheduler(&self) -> abi::StreamScheduler {
        self.abi_stream()
            .map_or_else(abi::StreamScheduler::none, |s| s.borrow().scheduler())
    }

    /// A bytes value of the stream's filter state, copied.
    pub fn filter_state(&self, key: &str) -> Option<Vec<u8>> {
        self.abi_stream()?.borrow().filter_state(key)
    }

    /// Sets a bytes value of the stream's filter state; false if refused.
    pub fn set_filter_state(&self, key: &str, value: &[u8]) -> bool {
        self.abi_stream()
            .is_some_and(|s| s.borrow().set_filter_state(key, value))
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

    /// A delta, as a delta (the module doc: never a set from the count).
    fn write_delta(&self, id: usize, m: Metric, delta: i64) {
        match (&self.sink, m.kind()) {
            (Sink::Stream(s), Kind::Counter) => {
                s.borrow().counter_add(Some(id), delta.unsigned_abs())
            }
            (Sink::Stream(s), Kind::Gauge) => s.borrow().gauge_add(Some(id), delta),
            (Sink::Config(c), Kind::Counter) => c.counter_add(Some(id), delta.unsigned_abs()),
            (Sink::Config(c), Kind::Gauge) => c.gauge_add(Some(id), delta),
            (Sink::None, _) => {}
        }
    }

    /// A set gauge's value (the drain phase's: never one changed by deltas).
    fn write_value(&self, id: usize, m: Metric) {
        let v = METRICS.value(m);
        match &self.sink {
            Sink::Stream(s) => s.borrow().gauge_set(Some(id), v),
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
        let Sink::Config(c) = &self.sink else {
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
        self.abi_stream()?.borrow().header(header_type(map), name)
    }

    /// The listing holds the stream mutably: a scan that called back into
    /// this host would panic (caught at the hook), never read a map that
    /// changed under it.
    fn scan_headers(&self, map: Map, scan: &mut HeaderScan) -> bool {
        let Some(s) = self.abi_stream() else {
            return false;
        };
        s.borrow_mut()
            .with_headers(header_type(map), |pairs| scan(pairs));
        true
    }

    fn set_header(&self, map: Map, name: &str, value: &str) -> bool {
        self.abi_stream()
            .is_some_and(|s| s.borrow_mut().set_header(header_type(map), name, value))
    }

    fn remove_header(&self, map: Map, name: &str) -> bool {
        self.abi_stream()
            .is_some_and(|s| s.borrow_mut().remove_header(header_type(map), name))
    }

    /// One listing (Envoy's pointers into the map, no copy) instead of a
    /// removal per name: clients seldom send the headers removed here.
    fn remove_headers(&self, map: Map, names: &[&str]) {
        let Some(s) = self.abi_stream() else {
            return;
        };
        // Which names are there; the map is not changed while listed.
        let mut present = [false; 4];
        let mut s = s.borrow_mut();
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
        s.borrow_mut()
            .send_response(reply.status, &headers, reply.body, reply.details);
        true
    }

    fn attribute(&self, attribute: Attribute) -> Option<Vec<u8>> {
        let s = self.abi_stream()?.borrow();
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
        self.abi_stream()?
            .borrow()
            .attribute_int(abi::ATTR_RESPONSE_FLAGS)
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

#[cfg(test)]
#[allow(unsafe_code, clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::fake_envoy::{self, FakeConfig, FakeStream};

    /// The provider's stat ids, defined in `fake`'s config hook.
    fn provider_ids(fake: &FakeConfig) -> Ids {
        // SAFETY: a live fake config, the hook's only handle.
        unsafe { abi::Config::in_hook(fake.ptr(), |c| Ids::define(&c, Owner::Provider)) }
    }

    /// The in-flight count changed in a main-thread config hook (a tick).
    fn on_main_thread(fake: &FakeConfig, ids: &Ids, delta: i64) {
        // SAFETY: a live fake config, the hook's only handle.
        unsafe {
            abi::Config::in_hook(fake.ptr(), |c| {
                Native::config(&c, ids).metric_add(Metric::ProviderInflight, delta)
            })
        }
    }

    /// The in-flight count changed in a worker's stream hook.
    fn on_worker(s: &FakeStream, ids: &Ids, delta: i64) {
        // SAFETY: a live fake stream, the hook's only handle.
        unsafe {
            abi::Stream::in_hook(s.ptr(), |s| {
                Native::stream(s, ids).metric_add(Metric::ProviderInflight, delta)
            })
        }
    }

    fn count() -> i64 {
        i64::try_from(METRICS.value(Metric::ProviderInflight)).unwrap()
    }

    #[test]
    fn a_gauge_changed_on_the_main_thread_moves_by_deltas_never_set_from_the_count() {
        let _world = fake_envoy::world();
        let fake = FakeConfig::default();
        let ids = provider_ids(&fake);
        let id = fake.id_of(Metric::ProviderInflight.name()).unwrap();
        on_main_thread(&fake, &ids, 1);
        on_main_thread(&fake, &ids, -1);
        let ops: Vec<_> = fake
            .stats
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, i, _)| *i == id)
            .copied()
            .collect();
        assert!(
            !ops.iter().any(|(op, ..)| *op == "gauge="),
            "set from the count on the main thread: a worker's add can fall between the read and the set: {ops:?}"
        );
        assert!(
            ops.ends_with(&[("gauge+", id, 1), ("gauge-", id, 1)]),
            "{ops:?}"
        );
    }

    #[test]
    fn a_workers_add_between_the_main_threads_read_and_its_write_is_not_lost() {
        let _world = fake_envoy::world();
        let fake = FakeConfig::default();
        let ids = std::sync::Arc::new(provider_ids(&fake));
        let id = fake.id_of(Metric::ProviderInflight.name()).unwrap();
        let (gauge_before, count_before) = (fake_envoy::gauge(id), count());
        // A request starts on a worker while the main thread's change is
        // on its way to Envoy.
        let worker_ids = ids.clone();
        fake_envoy::during_next_config_gauge_write(move || {
            on_worker(&FakeStream::on_worker(0), &worker_ids, 1)
        });
        on_main_thread(&fake, &ids, 1);
        if let Some(missed) = fake_envoy::take_during_write() {
            missed();
        }
        assert_eq!(count() - count_before, 2);
        assert_eq!(
            fake_envoy::gauge(id) - gauge_before,
            2,
            "Envoy's gauge drifted from the module's count for good"
        );
        on_main_thread(&fake, &ids, -2);
        assert_eq!(count(), count_before);
    }

    #[test]
    fn envoys_gauge_moves_exactly_as_the_count_under_racing_workers_and_main_thread() {
        let _world = fake_envoy::world();
        let fake = FakeConfig::default();
        let ids = provider_ids(&fake);
        let id = fake.id_of(Metric::ProviderInflight.name()).unwrap();
        let (gauge_before, count_before) = (fake_envoy::gauge(id), count());
        std::thread::scope(|scope| {
            for worker in 0..2 {
                let ids = &ids;
                scope.spawn(move || {
                    let s = FakeStream::on_worker(worker);
                    for i in 0..3000 {
                        on_worker(&s, ids, 1);
                        if i % 3 != 0 {
                            on_worker(&s, ids, -1);
                        }
                    }
                });
            }
            for _ in 0..3000 {
                on_main_thread(&fake, &ids, 1);
                on_main_thread(&fake, &ids, -1);
            }
        });
        assert_eq!(count() - count_before, 2000, "the module's count");
        assert_eq!(
            fake_envoy::gauge(id) - gauge_before,
            count() - count_before,
            "Envoy's gauge drifted from the module's count"
        );
        // Back where it was, for the other tests.
        for _ in 0..2000 {
            on_main_thread(&fake, &ids, -1);
        }
        assert_eq!(count(), count_before);
    }
}
