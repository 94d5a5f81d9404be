//! graceful_consumer natively: the same decisions as the wasm filter
//! (`graceful_core::consumer`), with the module's statics in place of VM
//! copies.
//!
//! | wasm build | native build |
//! |---|---|
//! | one `Consumer` per VM copy (a worker's, the main thread's) | one per worker (by `worker_index`) and one for the main thread, each behind its own (uncontended) lock |
//! | change signal: the `graceful_consumer_generation` counter | [`GENERATION`], an atomic (the counter is kept as its mirror) |
//! | outbound in flight: Envoy gauge and counter | `COUNTS` atomics, mirrored |
//! | membership refresh and probes on each VM's tick, one copy by lease | a timer thread waking the main thread every `membership_refresh`; calls are the config's callouts |
//! | `graceful_consumer` with VM configuration `upstream` | `filter_name: graceful_consumer:upstream` |
//! | an attempt that failed to connect: `on_done` with a transport failure reason | an attempt that ended without response headers (below) |
//! | a probe that could not connect: its attempt's `on_done` | the probe callout's answer carries no `:status` |
//!
//! Envoy 1.40 calls no hook with a filter pointer when an upstream filter's
//! attempt ends without response headers (`stream_complete` is not called
//! for upstream filters; `destroy` has no filter pointer), so the upstream
//! instance cannot ask why the attempt ended. It reads the attempt's host
//! and request id (`x-request-id`) when the attempt starts. At `destroy`,
//! an attempt that got no response headers while its request is still
//! alive failed: refused, reset before headers, or out of per-try time, and
//! the request goes on to a retry or a local reply. Its host is tombstoned
//! for `failure_tombstone_ttl` as a connect failure. An attempt whose
//! request is over was cancelled with it (the client went away): nothing.
//! Which requests are alive the listener instance keeps per worker (the
//! ids of its streams from request headers to `stream_complete`): Envoy
//! completes a cancelled downstream stream before it deletes the attempt,
//! and deletes a failed attempt (deferred) while its request waits. A
//! request without an id counts as alive (the wasm-equivalent answer for
//! a refusal; a cancel then tombstones, readmitted by the next probe).
//!
//! Steering writes the same `override_host_header` as the wasm build, for
//! Envoy's `override_host` load-balancing policy. ABI v0.2.0 also has
//! `set_upstream_override_host`, which the native build does not use: it
//! takes one host per stream, where steering names an ordered list of
//! acceptable hosts for the policy to choose from (one host, if
//! unavailable, leaves the choice to the fallback policy, which may pick
//! the tombstoned host); the header keeps one cluster config for both.

use std::cell::{Cell, RefCell, RefMut};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use graceful_core::config::ConsumerConfig;
use graceful_core::consumer::{
    Call, CallKind, Consumer, Counter, Effect, Exchange, Gauge, Level, Part, Response,
    MAX_ADMIN_BODY,
};
use graceful_core::gate::{Stat, Stats};
use graceful_core::headers;
use graceful_core::keys::{self, Owner};
use graceful_core::store;

use crate::abi::{
    self, ConfigScheduler, Stream, CONTINUE, REQUEST_HEADERS, RESPONSE_HEADERS, RESPONSE_TRAILERS,
};
use crate::{lock, log, now_us, COUNTS, STORE};

/// The change signal: bumped after every shared write the other copies
/// must see (see `graceful_core::consumer`).
pub static GENERATION: AtomicU64 = AtomicU64::new(0);

const EVENT_TICK: u64 = 1;

/// The request header both instances key a request by.
const REQUEST_ID: &str = "x-request-id";

thread_local! {
    /// The request ids of this worker's listener-instance streams that are
    /// under way (see the module doc). Bounded by the streams in flight.
    static LIVE: std::cell::RefCell<std::collections::HashSet<Vec<u8>>> =
        std::cell::RefCell::new(std::collections::HashSet::new());
}

fn request_is_live(id: &[u8]) -> bool {
    LIVE.with(|l| l.borrow().contains(id))
}

/// Metric changes made by the upstream instance, owed to the listener
/// instance's stats. A config's stats live in its scope: the upstream
/// instance's under `cluster.<name>.`, where the wasm build's (and the
/// contract's) are process-wide. So the upstream instance writes none of
/// its own; the listener instance writes these on its next stream hook or
/// tick (one atomic load per hook when nothing is owed).
struct Owed {
    dirty: AtomicBool,
    evictions: AtomicU64,
    readmitted: AtomicU64,
    generation: AtomicU64,
    /// Latest gauge values, plus one (0: none owed).
    tombstones: AtomicU64,
    tombstone_bytes: AtomicU64,
}

static OWED: Owed = Owed {
    dirty: AtomicBool::new(false),
    evictions: AtomicU64::new(0),
    readmitted: AtomicU64::new(0),
    generation: AtomicU64::new(0),
    tombstones: AtomicU64::new(0),
    tombstone_bytes: AtomicU64::new(0),
};

struct Metrics {
    tombstones: Option<usize>,
    tombstone_bytes: Option<usize>,
    evictions: Option<usize>,
    steered: Option<usize>,
    readmitted: Option<usize>,
    inflight: Option<usize>,
    started: Option<usize>,
    generation: Option<usize>,
}

/// Where an effect's metric change is written: through a stream (worker
/// hooks) or the config (main thread).
#[derive(Clone, Copy)]
enum Sink {
    Stream(Stream),
    Config(abi::Config),
}

pub struct Config {
    envoy: abi::Config,
    upstream: bool,
    config: ConsumerConfig,
    metrics: Metrics,
    /// One per worker, then the main thread's.
    copies: Vec<Mutex<Consumer>>,
    /// The cluster of each probe in flight (by callout id).
    probe_clusters: Mutex<Vec<(u64, String)>>,
    stop: Arc<AtomicBool>,
    timer: Mutex<Option<JoinHandle<()>>>,
    _scheduler: Option<Arc<ConfigScheduler>>,
}

impl Config {
    pub fn new(envoy: abi::Config, json: &[u8], upstream: bool) -> Result<Config, String> {
        let config = ConsumerConfig::from_json(json).map_err(|e| e.to_string())?;
        store::ensure_all(&STORE, &keys::initial_values(Owner::Consumer))
            .map_err(|(key, e)| format!("cannot initialise shared data {key:?}: {e:?}"))?;
        let metrics = Metrics {
            tombstones: envoy.define_gauge("graceful_consumer_tombstones"),
            tombstone_bytes: envoy.define_gauge("graceful_consumer_tombstone_bytes"),
            evictions: envoy.define_counter("graceful_consumer_evictions"),
            steered: envoy.define_counter("graceful_consumer_steered"),
            readmitted: envoy.define_counter("graceful_consumer_readmitted"),
            inflight: envoy.define_gauge(Stat::OutboundInflight.name()),
            started: envoy.define_counter(Stat::OutboundStarted.name()),
            generation: envoy.define_counter("graceful_consumer_generation"),
        };
        let workers = usize::try_from(abi::concurrency()).unwrap_or(1).max(1);
        let copies = (0..=workers)
            .map(|_| Mutex::new(Consumer::new(config.clone(), upstream)))
            .collect();
        // Membership refreshes and probes are the listener instance's.
        let (stop, timer, scheduler) = (Arc::new(AtomicBool::new(false)), None, None);
        let mut c = Config {
            envoy,
            upstream,
            config,
            metrics,
            copies,
            probe_clusters: Mutex::new(Vec::new()),
            stop,
            timer: Mutex::new(timer),
            _scheduler: scheduler,
        };
        if !upstream {
            let scheduler = Arc::new(envoy.scheduler());
            let (s, stop, period) = (
                scheduler.clone(),
                c.stop.clone(),
                c.config.membership_refresh,
            );
            let t = std::thread::Builder::new()
                .name("graceful-consumer".into())
                .spawn(move || {
                    while !stop.load(SeqCst) {
                        std::thread::sleep(period);
                        s.commit(EVENT_TICK);
                    }
                })
                .map_err(|e| format!("cannot start the membership timer: {e}"))?;
            c.timer = Mutex::new(Some(t));
            c._scheduler = Some(scheduler);
        }
        Ok(c)
    }

    /// This worker's consumer (an index past the workers: the main thread's).
    fn copy(&self, worker: usize) -> std::sync::MutexGuard<'_, Consumer> {
        let last = self.copies.len().saturating_sub(1);
        lock(&self.copies[worker.min(last)])
    }

    fn main_copy(&self) -> std::sync::MutexGuard<'_, Consumer> {
        self.copy(usize::MAX)
    }

    fn carry_out(&self, sink: Sink, effects: Vec<Effect>) {
        for effect in effects {
            if self.upstream {
                self.owe(effect);
                continue;
            }
            match effect {
                Effect::Set(gauge, value) => {
                    let id = match gauge {
                        Gauge::Tombstones => self.metrics.tombstones,
                        Gauge::TombstoneBytes => self.metrics.tombstone_bytes,
                    };
                    match sink {
                        Sink::Stream(s) => s.gauge_set(id, value),
                        Sink::Config(c) => c.gauge_set(id, value),
                    }
                }
                Effect::Add(counter, n) => {
                    let id = match counter {
                        Counter::Evictions => self.metrics.evictions,
                        Counter::Readmitted => self.metrics.readmitted,
                        Counter::Generation => {
                            GENERATION.fetch_add(n, SeqCst);
                            self.metrics.generation
                        }
                    };
                    match sink {
                        Sink::Stream(s) => s.counter_add(id, n),
                        Sink::Config(c) => c.counter_add(id, n),
                    }
                }
                Effect::Log(Level::Debug, line) => log::debug(&line),
                Effect::Log(Level::Info, line) => log::info(&line),
                Effect::Log(Level::Warn, line) => log::warn(&line),
            }
        }
    }

    /// An upstream instance's effect: the signal moves now, the stats are
    /// owed to the listener instance.
    fn owe(&self, effect: Effect) {
        match effect {
            Effect::Set(Gauge::Tombstones, v) => OWED.tombstones.store(v + 1, SeqCst),
            Effect::Set(Gauge::TombstoneBytes, v) => OWED.tombstone_bytes.store(v + 1, SeqCst),
            Effect::Add(Counter::Evictions, n) => {
                OWED.evictions.fetch_add(n, SeqCst);
            }
            Effect::Add(Counter::Readmitted, n) => {
                OWED.readmitted.fetch_add(n, SeqCst);
            }
            Effect::Add(Counter::Generation, n) => {
                GENERATION.fetch_add(n, SeqCst);
                OWED.generation.fetch_add(n, SeqCst);
            }
            Effect::Log(Level::Debug, line) => return log::debug(&line),
            Effect::Log(Level::Info, line) => return log::info(&line),
            Effect::Log(Level::Warn, line) => return log::warn(&line),
        }
        OWED.dirty.store(true, SeqCst);
    }

    /// Writes what the upstream instance owes (listener instance only).
    fn settle(&self, sink: Sink) {
        if self.upstream || !OWED.dirty.swap(false, SeqCst) {
            return;
        }
        let counters = [
            (&OWED.evictions, self.metrics.evictions),
            (&OWED.readmitted, self.metrics.readmitted),
            (&OWED.generation, self.metrics.generation),
        ];
        for (owed, id) in counters {
            let n = owed.swap(0, SeqCst);
            if n > 0 {
                match sink {
                    Sink::Stream(s) => s.counter_add(id, n),
                    Sink::Config(c) => c.counter_add(id, n),
                }
            }
        }
        let gauges = [
            (&OWED.tombstones, self.metrics.tombstones),
            (&OWED.tombstone_bytes, self.metrics.tombstone_bytes),
        ];
        for (owed, id) in gauges {
            if let Some(v) = owed.swap(0, SeqCst).checked_sub(1) {
                match sink {
                    Sink::Stream(s) => s.gauge_set(id, v),
                    Sink::Config(c) => c.gauge_set(id, v),
                }
            }
        }
    }

    fn dispatch(&self, copy: &mut Consumer, calls: Vec<Call>) {
        for call in calls {
            let headers = call.header_pairs();
            let timeout = u64::try_from(call.timeout.as_millis()).unwrap_or(u64::MAX);
            match self.envoy.callout(&call.cluster, &headers, &[], timeout) {
                // Callout ids count up from 1 per config: a u32 lasts.
                Ok(id) => {
                    if matches!(call.kind, CallKind::Probe { .. }) {
                        lock(&self.probe_clusters).push((id, call.cluster.clone()));
                    }
                    copy.sent(u32::try_from(id).unwrap_or(u32::MAX), call)
                }
                Err(r) => {
                    let e = call.not_sent(&format!("init result {r}"));
                    self.carry_out(Sink::Config(self.envoy), vec![e]);
                }
            }
        }
    }

    /// The membership timer's tick, on the main thread.
    pub fn tick(&self) {
        self.settle(Sink::Config(self.envoy));
        let mut copy = self.main_copy();
        let (effects, calls) = copy.on_tick(&STORE, now_us());
        self.carry_out(Sink::Config(self.envoy), effects);
        self.dispatch(&mut copy, calls);
    }

    /// An answer to a membership refresh or a probe (main thread).
    pub fn callout_done(&self, id: u64, headers: &[(Vec<u8>, Vec<u8>)], body: &[u8]) {
        let find = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name.as_bytes()))
                .map(|(_, v)| v.clone())
        };
        let status = find(headers::STATUS);
        let mut copy = self.main_copy();
        match copy.answer_for(u32::try_from(id).unwrap_or(u32::MAX)) {
            Some(CallKind::Admin { wanted }) => {
                let (effects, calls) = copy.admin_answered(
                    &STORE,
                    &wanted,
                    status.as_deref(),
                    || body.to_vec(),
                    now_us(),
                );
                self.carry_out(Sink::Config(self.envoy), effects);
                self.dispatch(&mut copy, calls);
            }
            Some(CallKind::Probe { address }) => {
                let cluster = {
                    let mut p = lock(&self.probe_clusters);
                    let i = p.iter().position(|(i, _)| *i == id);
                    i.map(|i| p.swap_remove(i).1).unwrap_or_default()
                };
                if status.is_none() && self.config.evict_on_connect_failure {
                    // No answer at all: the probe could not reach it.
                    let mut x = Fixed {
                        cluster,
                        now: now_us(),
                    };
                    let effects = copy.connect_failed(&STORE, &mut x, &address);
                    self.carry_out(Sink::Config(self.envoy), effects);
                    return;
                }
                let answered_at = find(headers::ADDRESS);
                let instance = self.config.instance_header.as_deref().and_then(find);
                let effects = copy.probe_answered(
                    &STORE,
                    &address,
                    status.as_deref(),
                    answered_at.as_deref(),
                    instance,
                    now_us,
                );
                self.carry_out(Sink::Config(self.envoy), effects);
            }
            None => {}
        }
    }

    /// How many bytes of a callout's body the answer may need.
    pub fn max_body(&self) -> usize {
        MAX_ADMIN_BODY
    }
}

impl Drop for Config {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
        if let Some(t) = lock(&self.timer).take() {
            let _ = t.join();
        }
    }
}

/// What a probe's answer knows: its cluster and the time.
struct Fixed {
    cluster: String,
    now: u64,
}

impl Exchange for Fixed {
    fn cluster(&mut self) -> String {
        self.cluster.clone()
    }

    fn address(&mut self) -> Option<String> {
        None
    }

    fn response_flags(&mut self) -> Option<u64> {
        None
    }

    fn now(&mut self) -> u64 {
        self.now
    }
}

/// The host's side of one stream, read lazily (at most once per stream,
/// the clock once per hook).
struct View<'a> {
    stream: Stream,
    lazy: RefMut<'a, Lazy>,
    now: Option<u64>,
}

impl Exchange for View<'_> {
    fn cluster(&mut self) -> String {
        let s = self.stream;
        self.lazy
            .cluster
            .get_or_insert_with(|| {
                s.cluster_name()
                    .or_else(|| {
                        s.attribute_string(abi::ATTR_XDS_CLUSTER_NAME)
                            .map(|c| String::from_utf8_lossy(&c).into_owned())
                    })
                    .unwrap_or_default()
            })
            .clone()
    }

    fn address(&mut self) -> Option<String> {
        let s = self.stream;
        self.lazy
            .address
            .get_or_insert_with(|| {
                s.attribute_string(abi::ATTR_UPSTREAM_ADDRESS)
                    .and_then(|a| String::from_utf8(a).ok())
            })
            .clone()
    }

    fn response_flags(&mut self) -> Option<u64> {
        self.stream.attribute_int(abi::ATTR_RESPONSE_FLAGS)
    }

    fn now(&mut self) -> u64 {
        *self.now.get_or_insert_with(now_us)
    }
}

/// One stream's state, in cells (see `ProviderStream`): a nested hook
/// that finds `lazy` borrowed panics, which the hook catches (fail open).
#[derive(Default)]
pub struct ConsumerStream {
    counted: Cell<bool>,
    answered: Cell<bool>,
    /// What the stream read from Envoy once.
    lazy: RefCell<Lazy>,
    /// Upstream instance: this attempt, for `destroy`.
    attempt: RefCell<Option<Attempt>>,
    /// Listener instance: this request's id while it is in `LIVE`.
    live: RefCell<Option<Vec<u8>>>,
    /// The worker the stream runs on, once asked.
    worker: Cell<Option<usize>>,
}

#[derive(Default)]
struct Lazy {
    /// The route's cluster, once read.
    cluster: Option<String>,
    /// `upstream.address`, once read.
    address: Option<Option<String>>,
}

/// An upstream attempt: where it went, for which request.
struct Attempt {
    address: String,
    cluster: String,
    worker: usize,
    request_id: Option<Vec<u8>>,
}

impl ConsumerStream {
    /// The stream's worker index (asked of Envoy once per stream).
    fn worker(&self, s: Stream) -> usize {
        if let Some(w) = self.worker.get() {
            return w;
        }
        let w = usize::try_from(s.worker_index()).unwrap_or(usize::MAX);
        self.worker.set(Some(w));
        w
    }

    fn view(&self, stream: Stream) -> View<'_> {
        View {
            stream,
            lazy: self.lazy.borrow_mut(),
            now: None,
        }
    }

    pub fn request_headers(&self, c: &Config, s: Stream) -> u32 {
        // No client may steer: its override header is dropped first (as an
        // upstream filter the header has done its work).
        s.remove_header(REQUEST_HEADERS, &c.config.override_host_header);
        if c.upstream {
            self.attempt_started(c, s);
            return CONTINUE;
        }
        COUNTS.add(Stat::OutboundInflight, 1);
        s.gauge_add(c.metrics.inflight, 1);
        self.counted.set(true);
        if c.config.evict_on_connect_failure {
            if let Some(id) = s.header(REQUEST_HEADERS, REQUEST_ID) {
                LIVE.with(|l| l.borrow_mut().insert(id.clone()));
                *self.live.borrow_mut() = Some(id);
            }
        }
        COUNTS.add(Stat::OutboundStarted, 1);
        s.counter_add(c.metrics.started, 1);
        let signal = Some(GENERATION.load(SeqCst));
        let worker = self.worker(s);
        let steer = c.copy(worker).steer(&STORE, &mut self.view(s), signal);
        if let Some(list) = steer {
            if s.set_header(REQUEST_HEADERS, &c.config.override_host_header, &list) {
                s.counter_add(c.metrics.steered, 1);
            }
        }
        CONTINUE
    }

    /// Upstream instance: notes this attempt's host, worker and cluster
    /// for [`ConsumerStream::destroy`].
    fn attempt_started(&self, c: &Config, s: Stream) {
        if !c.config.evict_on_connect_failure {
            return;
        }
        let worker = self.worker(s);
        let request_id = s.header(REQUEST_HEADERS, REQUEST_ID);
        let mut view = self.view(s);
        if let Some(address) = view.address() {
            let cluster = view.cluster();
            *self.attempt.borrow_mut() = Some(Attempt {
                address,
                cluster,
                worker,
                request_id,
            });
        }
    }

    /// The stream's filter is destroyed: an upstream attempt that got no
    /// response headers tombstones its host (see the module doc).
    pub fn destroy(&self, c: &Config) {
        let Some(a) = self.attempt.take() else {
            return;
        };
        if self.answered.get() {
            return;
        }
        // Cancelled with its request: says nothing about the host.
        if a.request_id
            .as_deref()
            .is_some_and(|id| !request_is_live(id))
        {
            return;
        }
        let mut x = Fixed {
            cluster: a.cluster,
            now: now_us(),
        };
        let effects = c.copy(a.worker).connect_failed(&STORE, &mut x, &a.address);
        c.carry_out(Sink::Config(c.envoy), effects);
    }

    fn observe(&self, c: &Config, s: Stream, map: abi::HeaderType, part: Part) {
        let seen = s.with_headers(map, |pairs| Response::scan(&c.config, pairs));
        let worker = self.worker(s);
        let effects = c
            .copy(worker)
            .observe_response(&STORE, &mut self.view(s), &seen, part);
        c.carry_out(Sink::Stream(s), effects);
    }

    pub fn response_headers(&self, c: &Config, s: Stream) -> u32 {
        self.answered.set(true);
        self.observe(c, s, RESPONSE_HEADERS, Part::Headers);
        c.settle(Sink::Stream(s));
        CONTINUE
    }

    pub fn response_trailers(&self, c: &Config, s: Stream) -> u32 {
        self.observe(c, s, RESPONSE_TRAILERS, Part::Trailers);
        CONTINUE
    }

    /// The listener instance's stream is over: it leaves the outbound
    /// count. (Envoy does not call this for upstream filters.)
    pub fn stream_complete(&self, c: &Config, s: Stream) {
        self.leave_live();
        c.settle(Sink::Stream(s));
        if self.counted.take() {
            COUNTS.add(Stat::OutboundInflight, -1);
            s.gauge_add(c.metrics.inflight, -1);
        }
    }
}

impl ConsumerStream {
    fn leave_live(&self) {
        if let Some(id) = self.live.take() {
            LIVE.with(|l| l.borrow_mut().remove(&id));
        }
    }
}

impl Drop for ConsumerStream {
    /// Destroyed without `stream_complete`: leave the count (the drain gate
    /// must not wait for it).
    fn drop(&mut self) {
        self.leave_live();
        if self.counted.take() {
            COUNTS.add(Stat::OutboundInflight, -1);
        }
    }
}
