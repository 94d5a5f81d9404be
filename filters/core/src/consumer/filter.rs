//! graceful_consumer's callbacks, for both deliveries. What it decides
//! lives in [`crate::consumer::decisions`]; this reads what those decisions ask of the
//! host (attributes, headers, the clock), carries out what they return
//! (metrics, log lines, header writes, HTTP calls) and counts the request
//! in the outbound in-flight gauge.
//!
//! | callback | listener instance | upstream instance (one stream per attempt) |
//! |---|---|---|
//! | request headers | drops a client's override header and `consumer_header`; in flight +1, started +1; steers (the override header, steered +1) | drops the override header; sets `consumer_header` to this Envoy's instance id |
//! | response headers, trailers | observes the answer (closing mark, connect-failure 503, membership, readmission) | observes closing marks |
//! | stream end | in flight −1 if counted | an attempt with no response and a transport failure reason: connect failure |
//! | tick | notices unannounced writes; refreshes membership and probes tombstoned hosts (one copy per `membership_refresh`, by lease) | none |
//! | call answered | admin `/clusters` or a probe's answer | none |
//! | request headers, `front.serve_endpoints` | first, [`ConsumerFilter::front_request_headers`]: a `/graceful/front/` endpoint is answered or held, and goes no further | none |
//! | tick, `front` | then [`ConsumerFilter::front_tick`]: the host table refreshed, long-polls answered, one copy per `front.poll` (by lease) reads the admin's view and `rq_active` | none |
//! | call answered, `front` | first, [`ConsumerFilter::front_call_answered`]: the front's `/clusters` answer | none |
//! | a held front long-poll woken, its stream ended | [`ConsumerFilter::front_answer_woken`], [`ConsumerFilter::front_release`] | none |
//! | request headers, `front` | before steering: in the grace count's slot ([`crate::consumer::front::grace::enter`]: epoch read, slot +1) | the watch: the generation read, and while an announced tombstone may be live or a member is listed `DRAINING`, `upstream.address`; an attempt at such a host goes on (no local reply: Envoy would not retry it), counted late if the host is acknowledged |
//! | response headers or stream end, `front` | out of its slot, once | as without `front` |
//! | tick, `front` | (above) | wasm: every `front.poll`, [`ConsumerFilter::upstream_tick`]: its caches follow the listener's writes across stats scopes |
//!
//! The front rows are [`crate::consumer::front::serve`]'s (its own table
//! says what each does); the configuration creates the front's shared keys
//! for the listener instance only, which alone serves the endpoints and
//! polls; the upstream instance with `front` watches attempts at closing hosts.

use std::cell::{Cell, RefCell, RefMut};
use std::collections::HashMap;

use crate::consumer::config::ConsumerConfig;
use crate::consumer::decisions::{
    Call, CallKind, Consumer, Effect, Exchange, Part, Response, MAX_ADMIN_BODY,
};
use crate::consumer::front::grace;
use crate::shared::headers;
use crate::shared::host::{
    Action, Attribute, CallResponse, Host, HttpCall, Map, StateCell, Stream,
};
use crate::shared::keys::{self, Owner};
use crate::shared::metrics::Metric;

/// One configured consumer (a listener's, or a cluster's upstream filter).
pub struct ConsumerFilter {
    config: ConsumerConfig,
    upstream: bool,
    /// A probe that got no answer at all tombstones its host as a connect
    /// failure. The native module sets this: its upstream filter cannot
    /// see why a probe's attempt ended, where the wasm build's sees the
    /// attempt fail (`attempt_done`).
    probe_failure_is_connect_failure: bool,
    /// This Envoy's identity for `consumer_header`: the process's instance
    /// id (the one its graceful_provider stamps, when it has one).
    identity: String,
}

/// One copy's state: the core's consumer, and the cluster of each probe
/// in flight.
pub struct ConsumerCopy {
    core: Consumer,
    probe_clusters: HashMap<u32, String>,
}

impl ConsumerCopy {
    pub fn core(&self) -> &Consumer {
        &self.core
    }

    pub fn core_mut(&mut self) -> &mut Consumer {
        &mut self.core
    }
}

/// One stream's state, in cells (the native module may run one of a
/// stream's callbacks inside another).
#[derive(Debug, Default)]
pub struct ConsumerStream {
    /// In the outbound in-flight gauge: leaves it once.
    counted: Cell<bool>,
    /// Response headers arrived.
    answered: Cell<bool>,
    /// The grace count's slot this request is in (listener instance,
    /// `front`): leaves it once.
    awaiting: Cell<Option<Metric>>,
    lazy: RefCell<Lazy>,
}

/// What a stream read from the host, at most once per stream (an
/// attribute lookup is among the dearer hostcalls).
#[derive(Debug, Default)]
struct Lazy {
    cluster: Option<String>,
    address: Option<Option<String>>,
}

impl ConsumerStream {
    pub fn answered(&self) -> bool {
        self.answered.get()
    }

    /// The host's side of this stream for the core (the clock read once
    /// per callback). A nested callback that finds it borrowed panics,
    /// which the native hook catches (fail open).
    fn view<'a, S: Stream>(&'a self, s: &'a S) -> View<'a, S> {
        View {
            s,
            lazy: self.lazy.borrow_mut(),
            now: None,
        }
    }
}

struct View<'a, S> {
    s: &'a S,
    lazy: RefMut<'a, Lazy>,
    now: Option<u64>,
}

impl<S: Stream> Exchange for View<'_, S> {
    fn cluster(&mut self) -> String {
        let s = self.s;
        self.lazy
            .cluster
            .get_or_insert_with(|| s.attribute_text(Attribute::ClusterName).unwrap_or_default())
            .clone()
    }

    fn address(&mut self) -> Option<String> {
        let s = self.s;
        self.lazy
            .address
            .get_or_insert_with(|| s.attribute_text(Attribute::UpstreamAddress))
            .clone()
    }

    fn response_flags(&mut self) -> Option<u64> {
        self.s.response_flags()
    }

    fn now(&mut self) -> u64 {
        *self.now.get_or_insert_with(|| self.s.now_us())
    }
}

/// What an answer to a call knows of its stream: the cluster and the time.
pub struct Fixed {
    pub cluster: String,
    pub now: u64,
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

/// Whether an attempt that got no response headers failed to connect: a
/// refused connection leaves a transport failure reason; a timed-out one
/// (a host cut off the network) leaves none, but the pool answered it with
/// no connection. An attempt cancelled while it waited (its client left)
/// has no answer from the pool and says nothing about the host.
fn failed_to_connect(s: &impl Stream) -> bool {
    let refused = s
        .attribute(Attribute::UpstreamTransportFailureReason)
        .is_some_and(|r| !r.is_empty());
    refused
        || (s.attribute(Attribute::UpstreamPoolAnswered).is_some()
            && s.attribute(Attribute::UpstreamLocalAddress).is_none())
}

/// Carries out the core's effects, in order.
pub(crate) fn carry_out(h: &(impl Host + ?Sized), effects: Vec<Effect>) {
    for effect in effects {
        match effect {
            Effect::Set(metric, value) => h.metric_set(metric, value),
            Effect::Add(metric, n) => h.metric_add(metric, i64::try_from(n).unwrap_or(i64::MAX)),
            Effect::Log(level, line) => h.log(level, &line),
        }
    }
}

impl ConsumerFilter {
    /// Parses `json`, creates the consumer's shared keys and checks that
    /// Envoy keeps the stats the outbound count and the change signal live
    /// in: one its stats_matcher rejects reads 0, which would hide every
    /// request from the drain gate and every other copy's writes from this
    /// one. (Probing the signal bumps it: every copy then looks at shared
    /// data once, harmless.)
    pub fn configure(h: &impl Host, json: &[u8], upstream: bool) -> Result<ConsumerFilter, String> {
        let config = ConsumerConfig::from_json(json).map_err(|e| e.to_string())?;
        crate::initial::create_keys(h, Owner::Consumer)?;
        if config.front.is_some() && !upstream {
            crate::initial::create_keys_with(h, Owner::Consumer, Some(keys::FRONT_FIELD))?;
        }
        let rejected: Vec<&str> = [Metric::ConsumerInflight, Metric::ConsumerGeneration]
            .into_iter()
            .filter(|m| !h.metric_is_kept(*m))
            .map(Metric::name)
            .collect();
        if let Some(line) = crate::consumer::decisions::stats_refused(&rejected) {
            return Err(line);
        }
        Ok(ConsumerFilter {
            config,
            upstream,
            probe_failure_is_connect_failure: false,
            identity: crate::shared::instance::agreed_instance_id(h),
        })
    }

    /// See the field.
    pub fn with_probe_failure_as_connect_failure(mut self) -> ConsumerFilter {
        self.probe_failure_is_connect_failure = true;
        self
    }

    pub fn config(&self) -> &ConsumerConfig {
        &self.config
    }

    /// The identity this Envoy's requests carry in `consumer_header`.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn is_upstream(&self) -> bool {
        self.upstream
    }

    /// A copy's state (one per VM copy; natively one per worker).
    pub fn new_copy(&self) -> ConsumerCopy {
        ConsumerCopy {
            core: Consumer::new(self.config.clone(), self.upstream),
            probe_clusters: HashMap::new(),
        }
    }

    pub fn request_headers(
        &self,
        copy: &impl StateCell<ConsumerCopy>,
        st: &ConsumerStream,
        s: &impl Stream,
    ) -> Action {
        // No client may steer hosts: whatever it sent in the override header
        // is dropped before anything else. (As an upstream filter the header
        // has done its work: dropping it keeps it from the provider.)
        // Who is calling, for the providers' drain reports. Only the
        // upstream instance names this Envoy: it runs on the clusters
        // graceful_consumer steers (configured on them, beside
        // override_host), so the identity never goes to a destination
        // outside them. The listener instance drops a client's value, so
        // no forged identity travels either.
        let override_header = self.config.override_host_header.as_str();
        match (&self.config.consumer_header, self.upstream) {
            (Some(h), true) => {
                s.remove_header(Map::RequestHeaders, override_header);
                s.set_header(Map::RequestHeaders, h, &self.identity);
            }
            (Some(h), false) => s.remove_headers(Map::RequestHeaders, &[override_header, h]),
            (None, _) => {
                s.remove_header(Map::RequestHeaders, override_header);
            }
        }
        if self.upstream {
            // One stream per attempt: counting and steering are the
            // listener instance's; the watch is this one's.
            if self.config.front.is_some() {
                return self.watch(copy, st, s);
            }
            return Action::Continue;
        }
        if self.config.front.is_some() {
            // Before the generation read that steers it (grace.rs: why).
            st.awaiting
                .set(grace::enter(&crate::shared::host::HostMetrics(s)));
        }
        // Counted exactly once: `stream_end` takes it out. (The gauge is
        // real: configure refused a rejected one.)
        s.metric_add(Metric::ConsumerInflight, 1);
        st.counted.set(true);
        s.metric_add(Metric::ConsumerStarted, 1);
        let signal = s.metric_get(Metric::ConsumerGeneration);
        // The list is a slice of the copy's cached plan: set while it is
        // borrowed, no copy of it made.
        let steered = copy.with(|c| {
            c.core
                .steer(s.store(), &mut st.view(s), signal)
                .is_some_and(|list| {
                    s.set_header(Map::RequestHeaders, &self.config.override_host_header, list)
                })
        });
        if steered {
            s.metric_add(Metric::ConsumerSteered, 1);
        }
        Action::Continue
    }

    pub fn response_headers(
        &self,
        copy: &impl StateCell<ConsumerCopy>,
        st: &ConsumerStream,
        s: &impl Stream,
    ) -> Action {
        st.answered.set(true);
        self.grace_leave(st, s);
        self.observe(copy, st, s, Map::ResponseHeaders, Part::Headers);
        if self.upstream && copy.with(|c| c.core.take_signal_hint()) {
            s.set_header(Map::ResponseHeaders, headers::SIGNAL, "1");
        }
        Action::Continue
    }

    pub fn response_trailers(
        &self,
        copy: &impl StateCell<ConsumerCopy>,
        st: &ConsumerStream,
        s: &impl Stream,
    ) -> Action {
        self.observe(copy, st, s, Map::ResponseTrailers, Part::Trailers);
        Action::Continue
    }

    /// One read of the whole map, scanned here; the rest only if the core
    /// asks.
    fn observe(
        &self,
        copy: &impl StateCell<ConsumerCopy>,
        st: &ConsumerStream,
        s: &impl Stream,
        map: Map,
        part: Part,
    ) {
        let mut seen = None;
        s.scan_headers(map, &mut |pairs| {
            seen = Some(Response::scan(&self.config, pairs))
        });
        let Some(seen) = seen else {
            return;
        };
        let mut effects = copy.with(|c| {
            c.core
                .observe_response(s.store(), &mut st.view(s), &seen, part)
        });
        if seen.signal && !self.upstream {
            // The upstream instance wrote a tombstone: look now, and move
            // this scope's signal for every copy if the list moved.
            s.remove_header(map, headers::SIGNAL);
            let signal = s.metric_get(Metric::ConsumerGeneration);
            effects.extend(copy.with(|c| c.core.signalled(s.store(), signal)));
        }
        carry_out(s, effects);
    }

    /// The stream is over: it leaves the outbound count, once.
    pub fn stream_end(&self, st: &ConsumerStream, h: &impl Host) {
        if st.counted.take() {
            h.metric_add(Metric::ConsumerInflight, -1);
        }
        self.grace_leave(st, h);
    }

    /// Out of the grace count's slot, once.
    fn grace_leave(&self, st: &ConsumerStream, h: &(impl Host + ?Sized)) {
        if let Some(gauge) = st.awaiting.take() {
            grace::leave(&crate::shared::host::HostMetrics(h), gauge);
        }
    }

    /// The upstream instance's watch (design §3's fence, as far as Envoy
    /// allows it): an attempt at a host closing (announced, or listed
    /// `DRAINING`) goes on, and one at a host the front acknowledged counts
    /// as late. It does not answer the attempt itself: a local reply from
    /// an upstream filter goes to the client, never to the route's retry
    /// policy (Envoy's upstream filter manager hands it to the router's
    /// downstream callbacks; measured on 1.40: the 503 reached the client,
    /// `upstream_rq_retry` 0), so a fence's 503 would turn a request the
    /// closing host still serves into an error.
    fn watch(
        &self,
        copy: &impl StateCell<ConsumerCopy>,
        st: &ConsumerStream,
        s: &impl Stream,
    ) -> Action {
        let signal = s.metric_get(Metric::ConsumerGeneration);
        let mut view = st.view(s);
        let Some(address) = copy.with(|c| c.core.watched(s.store(), &mut view, signal)) else {
            return Action::Continue;
        };
        let now = view.now();
        drop(view);
        self.front_attempt_seen(s, &address, now);
        Action::Continue
    }

    /// As an upstream filter, an attempt ended: one that got no response
    /// headers and could not connect tombstones its host, even if a retry
    /// then succeeded; only then is `upstream.address` read.
    pub fn attempt_done(
        &self,
        copy: &impl StateCell<ConsumerCopy>,
        st: &ConsumerStream,
        s: &impl Stream,
    ) {
        if !copy.with(|c| c.core.attempt_may_have_failed(st.answered.get())) {
            return;
        }
        if !failed_to_connect(s) {
            return;
        }
        let mut view = st.view(s);
        let Some(address) = view.address() else {
            return;
        };
        let effects = copy.with(|c| c.core.connect_failed(s.store(), &mut view, &address));
        carry_out(s, effects);
    }

    /// An attempt to `address` of `cluster` failed to connect, as the
    /// delivery found out (natively: at the attempt's destruction).
    pub fn connect_failed(
        &self,
        copy: &impl StateCell<ConsumerCopy>,
        h: &impl Host,
        cluster: String,
        address: &str,
    ) {
        let mut x = Fixed {
            cluster,
            now: h.now_us(),
        };
        let effects = copy.with(|c| c.core.connect_failed(h.store(), &mut x, address));
        carry_out(h, effects);
    }

    /// The periodic work: notices writes whose bump this copy has not seen
    /// (see [`Consumer::notice_unannounced`]), refreshes membership and
    /// probes tombstoned hosts.
    pub fn tick(&self, copy: &impl StateCell<ConsumerCopy>, h: &impl Host) {
        let signal = h.metric_get(Metric::ConsumerGeneration);
        let now = h.now_us();
        let (effects, calls) = copy.with(|c| {
            let mut effects = c.core.notice_unannounced(h.store(), signal);
            let (more, calls) = c.core.tick(h.store(), now);
            effects.extend(more);
            (effects, calls)
        });
        carry_out(h, effects);
        self.dispatch(copy, h, calls);
    }

    /// The upstream instance's tick, with `front` (wasm: every
    /// `front.poll`): the watch's caches follow the listener's writes where
    /// the two instances' change signals live in different stats scopes
    /// (Envoy 1.36 to 1.38: see [`Consumer::notice_unannounced`]). No
    /// refresh, no probe: those are the listener instance's.
    pub fn upstream_tick(&self, copy: &impl StateCell<ConsumerCopy>, h: &impl Host) {
        let signal = h.metric_get(Metric::ConsumerGeneration);
        let effects = copy.with(|c| c.core.notice_unannounced_front(h.store(), signal));
        carry_out(h, effects);
    }

    fn dispatch(&self, copy: &impl StateCell<ConsumerCopy>, h: &impl Host, calls: Vec<Call>) {
        for call in calls {
            let request = HttpCall {
                cluster: &call.cluster,
                headers: &call.header_pairs(),
                body: &[],
                timeout: call.timeout,
            };
            match h.dispatch(&request) {
                Ok(token) => copy.with(|c| {
                    if matches!(call.kind, CallKind::Probe { .. }) {
                        c.probe_clusters.insert(token, call.cluster.clone());
                    }
                    c.core.sent(token, call);
                }),
                Err(reason) => carry_out(h, vec![call.not_sent(&reason)]),
            }
        }
    }

    /// An answer to a membership refresh or a probe (a failed call has no
    /// `:status`).
    pub fn call_answered(
        &self,
        copy: &impl StateCell<ConsumerCopy>,
        h: &impl Host,
        token: u32,
        answer: &impl CallResponse,
    ) {
        let status = answer.header(headers::STATUS);
        let kind = copy.with(|c| {
            let cluster = c.probe_clusters.remove(&token);
            c.core.answer_for(token).map(|k| (k, cluster))
        });
        match kind {
            Some((CallKind::Admin { wanted, source }, _)) => {
                let now = h.now_us();
                let (effects, calls) = copy.with(|c| {
                    c.core.admin_answered(
                        h.store(),
                        &wanted,
                        source,
                        status.as_deref(),
                        || answer.body(MAX_ADMIN_BODY),
                        now,
                    )
                });
                carry_out(h, effects);
                self.dispatch(copy, h, calls);
            }
            Some((CallKind::Probe { address }, cluster)) => {
                if status.is_none()
                    && self.probe_failure_is_connect_failure
                    && self.config.evict_on_connect_failure
                {
                    // No answer at all: the probe could not reach it.
                    self.connect_failed(copy, h, cluster.unwrap_or_default(), &address);
                    return;
                }
                let answered_at = answer.header(headers::ADDRESS);
                let instance = self
                    .config
                    .instance_header
                    .as_deref()
                    .and_then(|n| answer.header(n));
                let effects = copy.with(|c| {
                    c.core.probe_answered(
                        h.store(),
                        &address,
                        status.as_deref(),
                        answered_at.as_deref(),
                        instance,
                        || h.now_us(),
                    )
                });
                carry_out(h, effects);
            }
            None => {}
        }
    }
}

#[cfg(test)]
#[path = "filter_tests.rs"]
mod tests;
