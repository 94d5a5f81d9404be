//! `graceful_consumer`: the consumer's outbound sidecar filter, as
//! proxy-wasm callbacks. What it decides lives in
//! [`graceful_core::consumer`]; this file reads what those decisions ask of
//! the host (properties, headers, the clock), carries out what they return
//! (metrics, log lines, header writes, HTTP calls) and counts the request
//! in the outbound in-flight gauge. What each callback reads, and why that
//! is enough, is the per-request protocol in [`graceful_core::consumer`].

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use graceful_core::config::ConsumerConfig;
use graceful_core::consumer::{
    self, Call, CallKind, Consumer, Counter, Effect, Exchange, Gauge, Level, Part, Response,
    MAX_ADMIN_BODY,
};
use graceful_core::headers;
use graceful_core::keys::{self, Owner};
use graceful_core::store;
use graceful_guest::{
    header, header_map_bytes, map_pairs, now_us, property, property_u64, remove_header,
    replace_header, HostStore, Metric,
};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> {
        Box::new(ConsumerRoot { shared: None, upstream: false })
    });
}}

struct Metrics {
    tombstones: Metric,
    tombstone_bytes: Metric,
    evictions: Metric,
    steered: Metric,
    readmitted: Metric,
    /// Outbound requests in flight (+1 at request headers, −1 at done), and
    /// requests started: read by graceful_drain's gate.
    inflight: Metric,
    started: Metric,
    /// The change signal: bumped after every shared write the other VM
    /// copies must see; read on every request.
    generation: Metric,
}

struct Shared {
    core: RefCell<Consumer>,
    metrics: Metrics,
}

impl Shared {
    fn carry_out(&self, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Set(gauge, value) => match gauge {
                    Gauge::Tombstones => &self.metrics.tombstones,
                    Gauge::TombstoneBytes => &self.metrics.tombstone_bytes,
                }
                .set(value),
                Effect::Add(counter, n) => match counter {
                    Counter::Evictions => &self.metrics.evictions,
                    Counter::Readmitted => &self.metrics.readmitted,
                    Counter::Generation => &self.metrics.generation,
                }
                .add(i64::try_from(n).unwrap_or(i64::MAX)),
                Effect::Log(Level::Debug, line) => log::debug!("{line}"),
                Effect::Log(Level::Info, line) => log::info!("{line}"),
                Effect::Log(Level::Warn, line) => log::warn!("{line}"),
            }
        }
    }
}

/// The host's side of one stream, read lazily: a property lookup is among
/// the dearer hostcalls. The cluster and the address are read at most once
/// per stream, the clock once per callback.
struct View<'a> {
    cluster: &'a mut Option<String>,
    address: &'a mut Option<Option<String>>,
    now: Option<u64>,
}

impl Exchange for View<'_> {
    fn cluster(&mut self) -> String {
        self.cluster
            .get_or_insert_with(|| {
                // `xds.cluster_name` is the route's, readable in both phases.
                property(&["xds", "cluster_name"])
                    .and_then(|c| String::from_utf8(c).ok())
                    .unwrap_or_default()
            })
            .clone()
    }

    fn address(&mut self) -> Option<String> {
        self.address
            .get_or_insert_with(|| {
                property(&["upstream", "address"]).and_then(|a| String::from_utf8(a).ok())
            })
            .clone()
    }

    fn response_flags(&mut self) -> Option<u64> {
        property_u64(&["response", "flags"])
    }

    fn now(&mut self) -> u64 {
        *self.now.get_or_insert_with(now_us)
    }
}

/// The longest tick period of the listener instance's copies.
const TICK_AT_MOST: Duration = Duration::from_millis(100);

struct ConsumerRoot {
    shared: Option<Rc<Shared>>,
    /// `vm_config.configuration` was `upstream`.
    upstream: bool,
}

impl ConsumerRoot {
    fn dispatch(&mut self, shared: &Shared, calls: Vec<Call>) {
        for call in calls {
            let headers = call.header_pairs();
            match self.dispatch_http_call(&call.cluster, headers, None, vec![], call.timeout) {
                Ok(token) => shared.core.borrow_mut().sent(token, call),
                Err(status) => shared.carry_out(vec![call.not_sent(&format!("{status:?}"))]),
            }
        }
    }
}

impl Context for ConsumerRoot {
    fn on_http_call_response(
        &mut self,
        token: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        let map = MapType::HttpCallResponseHeaders;
        let status = header(map, headers::STATUS);
        let kind = shared.core.borrow_mut().answer_for(token);
        match kind {
            Some(CallKind::Admin { wanted }) => {
                let body = || {
                    hostcalls::get_buffer(
                        BufferType::HttpCallResponseBody,
                        0,
                        body_size.min(MAX_ADMIN_BODY),
                    )
                    .ok()
                    .flatten()
                    .unwrap_or_default()
                };
                let (effects, calls) = shared.core.borrow_mut().admin_answered(
                    &HostStore,
                    &wanted,
                    status.as_deref(),
                    body,
                    now_us(),
                );
                shared.carry_out(effects);
                self.dispatch(&shared, calls);
            }
            Some(CallKind::Probe { address }) => {
                let answered_at = header(map, headers::ADDRESS);
                let instance_header = shared.core.borrow().config().instance_header.clone();
                let instance = instance_header.and_then(|h| header(map, &h));
                let effects = shared.core.borrow_mut().probe_answered(
                    &HostStore,
                    &address,
                    status.as_deref(),
                    answered_at.as_deref(),
                    instance,
                    now_us,
                );
                shared.carry_out(effects);
            }
            None => {}
        }
    }
}

impl RootContext for ConsumerRoot {
    /// The VM configuration says where the filter sits: empty for the
    /// listener's filter chain, `upstream` for the cluster's upstream filters
    /// (one stream per attempt: it only observes, so retries hide nothing).
    /// A separate VM configuration also gives the upstream instance a VM of
    /// its own, which it needs: the downstream instance's probes go through
    /// the cluster, and a VM entered again from its own root callback traps.
    fn on_vm_start(&mut self, size: usize) -> bool {
        let vm_config = hostcalls::get_buffer(BufferType::VmConfiguration, 0, size)
            .ok()
            .flatten()
            .unwrap_or_default();
        match consumer::upstream_from_vm_config(&vm_config) {
            Ok(upstream) => self.upstream = upstream,
            Err(line) => {
                log::error!("{line}");
                return false;
            }
        }
        true
    }

    fn on_configure(&mut self, _size: usize) -> bool {
        let config = match ConsumerConfig::from_json(&graceful_guest::plugin_configuration()) {
            Ok(c) => c,
            Err(e) => {
                log::error!("graceful_consumer: {e}");
                return false;
            }
        };
        // Every key a stream or tick updates is created here, before any
        // stream runs: Envoy ignores CAS on a missing key, so two workers
        // creating one at once would both succeed and one change be lost
        // (see graceful_core::store::ensure_all).
        if let Err((key, e)) = store::ensure_all(&HostStore, &keys::initial_values(Owner::Consumer))
        {
            log::error!("graceful_consumer: cannot initialise shared data {key:?}: {e:?}");
            return false;
        }
        // Membership refreshes and probes are the downstream instance's: an
        // upstream instance taking the refresh lease would skip a refresh.
        // Its copies tick at most every 100 ms (the lease keeps refreshes
        // to one per membership_refresh): a tick announces the upstream
        // instance's writes where its stats scope is not this one (Envoy
        // 1.36, see Consumer::notice_unannounced).
        if !self.upstream {
            graceful_guest::set_tick_period(config.membership_refresh.min(TICK_AT_MOST));
        }
        let metrics = Metrics {
            tombstones: Metric::gauge("graceful_consumer_tombstones"),
            tombstone_bytes: Metric::gauge("graceful_consumer_tombstone_bytes"),
            evictions: Metric::counter("graceful_consumer_evictions"),
            steered: Metric::counter("graceful_consumer_steered"),
            readmitted: Metric::counter("graceful_consumer_readmitted"),
            inflight: Metric::gauge("graceful_consumer_inflight"),
            started: Metric::counter("graceful_consumer_started"),
            generation: Metric::counter("graceful_consumer_generation"),
        };
        // The outbound count and the change signal are Envoy stats: one that
        // Envoy's stats_matcher rejects is a null stat reading 0, which would
        // hide every request from the drain gate and every other copy's
        // writes from this one. The signal is probed with a bump (every
        // copy then looks at shared data once: harmless).
        let mut rejected = Vec::new();
        if !metrics.inflight.gauge_is_kept() {
            rejected.push("graceful_consumer_inflight");
        }
        metrics.generation.add(1);
        if metrics.generation.get().unwrap_or(0) == 0 {
            rejected.push("graceful_consumer_generation");
        }
        if let Some(line) = consumer::stats_refused(&rejected) {
            log::error!("{line}");
            return false;
        }
        self.shared = Some(Rc::new(Shared {
            core: RefCell::new(Consumer::new(config, self.upstream)),
            metrics,
        }));
        true
    }

    fn on_tick(&mut self) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        let signal = shared.metrics.generation.get();
        let mut core = shared.core.borrow_mut();
        let mut effects = core.notice_unannounced(&HostStore, signal);
        let (more, calls) = core.on_tick(&HostStore, now_us());
        drop(core);
        effects.extend(more);
        shared.carry_out(effects);
        self.dispatch(&shared, calls);
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(ConsumerStream {
            shared: self.shared.clone(),
            counted: false,
            cluster: None,
            address: None,
            answered: false,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct ConsumerStream {
    shared: Option<Rc<Shared>>,
    /// In the outbound in-flight gauge; leaves it in `on_done`.
    counted: bool,
    /// The route's cluster, once read.
    cluster: Option<String>,
    /// `upstream.address`, once read.
    address: Option<Option<String>>,
    /// Response headers arrived for this stream.
    answered: bool,
}

impl ConsumerStream {
    fn view(&mut self) -> View<'_> {
        View {
            cluster: &mut self.cluster,
            address: &mut self.address,
            now: None,
        }
    }

    /// One read of the whole map, scanned in the guest; the rest only if
    /// the core asks.
    fn observe_response(&mut self, shared: &Shared, map: MapType, part: Part) {
        let Some(bytes) = header_map_bytes(map) else {
            return;
        };
        let mut core = shared.core.borrow_mut();
        let seen = Response::scan(core.config(), map_pairs(&bytes));
        let effects = core.observe_response(&HostStore, &mut self.view(), &seen, part);
        drop(core);
        shared.carry_out(effects);
    }
}

impl Context for ConsumerStream {
    /// Envoy calls `on_done` once when it destroys the filter of every
    /// stream, downstream and upstream (`on_log` never reaches an upstream
    /// filter, and is one more VM entry per stream: the module does not
    /// export it). Downstream: the request leaves the in-flight gauge. As an
    /// upstream filter: an attempt that ends without response headers and
    /// with a transport failure reason could not connect, even if a retry
    /// then succeeded; only then is `upstream.address` read.
    fn on_done(&mut self) -> bool {
        let Some(shared) = self.shared.clone() else {
            return true;
        };
        if std::mem::take(&mut self.counted) {
            shared.metrics.inflight.add(-1);
        }
        if !shared.core.borrow().attempt_may_have_failed(self.answered) {
            return true;
        }
        let failed_to_connect =
            property(&["upstream", "transport_failure_reason"]).is_some_and(|r| !r.is_empty());
        if !failed_to_connect {
            return true;
        }
        let mut view = self.view();
        let Some(address) = view.address() else {
            return true;
        };
        let effects = shared
            .core
            .borrow_mut()
            .connect_failed(&HostStore, &mut view, &address);
        shared.carry_out(effects);
        true
    }
}

impl HttpContext for ConsumerStream {
    fn on_http_request_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.clone() else {
            return Action::Continue;
        };
        let mut core = shared.core.borrow_mut();
        // No client may steer hosts: whatever it sent in the override
        // header is dropped before anything else. (As an upstream filter the
        // header has done its work: dropping it keeps it from the provider.)
        remove_header(
            MapType::HttpRequestHeaders,
            &core.config().override_host_header,
        );
        if core.is_upstream() {
            // One stream per attempt: counting and steering are the
            // downstream filter's; the host is read only if the attempt
            // answers closing or fails (`on_done`).
            return Action::Continue;
        }
        // Counted exactly once: `on_done` takes it out. (The gauge is real:
        // on_configure refused a rejected one.)
        shared.metrics.inflight.add(1);
        self.counted = true;
        shared.metrics.started.add(1);
        let signal = shared.metrics.generation.get();
        let steer = core.steer(&HostStore, &mut self.view(), signal);
        if let Some(list) = steer {
            if replace_header(
                MapType::HttpRequestHeaders,
                &core.config().override_host_header,
                &list,
            ) {
                shared.metrics.steered.add(1);
            }
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        self.answered = true;
        if let Some(shared) = self.shared.clone() {
            self.observe_response(&shared, MapType::HttpResponseHeaders, Part::Headers);
        }
        Action::Continue
    }

    fn on_http_response_trailers(&mut self, _trailers: usize) -> Action {
        if let Some(shared) = self.shared.clone() {
            self.observe_response(&shared, MapType::HttpResponseTrailers, Part::Trailers);
        }
        Action::Continue
    }
}
