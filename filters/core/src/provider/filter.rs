//! graceful_provider's callbacks, for both deliveries.
//!
//! Per stream: admit (count in the in-flight gauge, or reject with a local
//! 503 once the drain gate has passed: [`crate::shared::gate`]), mark the response
//! while the instance is closing (headers, and gRPC trailers), and count
//! the stream out exactly once when it ends.
//!
//! | callback | reads | writes |
//! |---|---|---|
//! | request headers | the phase gauge until this copy knows of the closing, from then on the gate gauge (with `reject_when_drained`: no gate is up while serving, [`crate::shared::gate`]); `upgrade` (with `long_lived_upgrades`, on a request its headers do not end), `:path` (with `long_lived_paths`); once closing, `source.address` and the consumer header; the clock (a request's start, for the drain report's durations) | in flight +1, started +1; or rejected +1 and the marked 503; a long-lived stream leaves the in-flight count at once and is kept by this copy (at most [`MAX_LONG_LIVED`]) |
//! | response headers | the phase gauge until this copy knows of the closing | instance header; the closing mark while closing (closing_marked +1 once); this copy now knows of the closing |
//! | response trailers | the phase gauge until this copy knows of the closing | the closing mark while closing |
//! | tick (every [`TICK`]) | the clock; gate gauge (with kept streams) | refreshes this copy's coarse clock; merges this copy's report records into shared data (the drain report, through [`crate::drain::PendingReport`]) and learns the longest request from it; once the gate passed, wakes every kept long-lived stream |
//! | woken long-lived stream | nothing | the marked 503 (gRPC UNAVAILABLE); Envoy resets a stream whose headers went out |
//! | stream end | the clock, for a sampled stream, one after closing, or one whose coarse duration could be the longest | in flight −1 if counted; a kept stream is forgotten; a recorded stream's peer and duration go to the copy's pending report |
//!
//! A long-lived stream (a WebSocket, a gRPC stream the app never ends)
//! would hold the drain gate until its `timeout` and then be cut by the
//! process exit; kept out of the count, it is ended when the gate passes,
//! with a status its client retries.
//!
//! The report costs an ordinary request one clock read (its start); the
//! phase read that tells it whether the request started after closing is
//! admission's. The report's longest request is exact (every request counts)
//! without a second read per request: each copy keeps a coarse clock, the
//! latest time it read (at each request start and each tick, so at most
//! [`TICK`] old while ticks run on time), and a request whose coarse
//! duration plus [`COARSE_SLACK`] is shorter than the longest the copy knows
//! of cannot be the longest, so it ends without a clock read. Every other
//! request reads the clock at its end: the one in [`SAMPLE_EVERY`] sampled
//! for the percentiles, those after closing, and any that could be the
//! longest (every request while the longest seen is under
//! [`COARSE_SLACK`]). A request is missed only if its copy read no clock for
//! longer than [`COARSE_SLACK`] (a tick over 100 ms late on an idle copy);
//! a duration read is exact to the clock's microsecond.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::drain::{without_query, PeerId, PendingReport, Waiters, SAMPLE_EVERY};
use crate::provider::config::ProviderConfig;
use crate::shared::gate::{self, Admission, PhaseSeen};
use crate::shared::headers::{IMMEDIATE_HC_FAIL, PATH, UPGRADE};
use crate::shared::host::{
    Action, Attribute, Host, HostMetrics, Level, LocalReply, Map, StateCell, Stream,
};
use crate::shared::instance;
use crate::shared::keys::{self, Owner};
use crate::shared::metrics::Metric;

/// How often each copy looks whether the gate passed, to end its kept
/// long-lived streams (they end at most this late), and merges its report
/// records.
pub const TICK: Duration = Duration::from_millis(100);
/// Most long-lived streams one copy keeps; more are counted in flight as
/// any request (they hold the gate, as before).
pub const MAX_LONG_LIVED: usize = 1024;
/// How much older than now a copy's coarse clock may be without a request
/// being missed from the report's longest: twice the tick that refreshes it.
pub const COARSE_SLACK: Duration = Duration::from_millis(2 * TICK.as_millis() as u64);

/// One copy's state (a VM copy's; the native config's): its kept
/// long-lived streams and its report records not merged yet. `W` wakes a
/// kept stream (nothing in a VM, whose tick answers through the stream's
/// context id; the stream's scheduler natively).
#[derive(Debug)]
pub struct ProviderCopy<W = ()> {
    kept: Waiters<W>,
    report: PendingReport,
}

impl<W> Default for ProviderCopy<W> {
    fn default() -> Self {
        ProviderCopy {
            kept: Waiters::default(),
            report: PendingReport::default(),
        }
    }
}

impl<W> ProviderCopy<W> {
    /// Long-lived streams kept.
    pub fn len(&self) -> usize {
        self.kept.len()
    }

    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }

    /// Forgets stream `id` (it ended); true if it was kept.
    pub fn release(&mut self, id: u32) -> bool {
        self.kept.release(id)
    }
}

/// One configured provider.
pub struct Provider {
    config: ProviderConfig,
    instance_id: String,
    /// This copy has seen the closing (the phase gauge, read at each
    /// request and response until then; the phase never returns to
    /// serving): from then on every request is recorded for the report and
    /// every response marked without reading it again.
    knows_closing: AtomicBool,
    /// Requests admitted by this copy, for sampling durations while
    /// serving. Atomics, not the copy's cell: natively every worker
    /// thread shares one provider, and these are touched per request.
    admitted: AtomicU32,
    /// A report merge failed and was logged (once per copy).
    merge_warned: AtomicBool,
    /// The coarse clock: the latest time this copy read (µs).
    clock_us: AtomicU64,
    /// The longest request this copy knows of (its own, and the shared one
    /// at its last merge), µs: shorter ones need no clock read at their end.
    longest_us: AtomicU64,
}

/// What a stream records for the report.
#[derive(Debug)]
struct Recording {
    /// The caller, once closing.
    peer: Option<PeerId>,
    /// When the stream started (µs).
    start_us: u64,
    /// Its duration goes to the report (not for a long-lived stream or a
    /// local reply).
    timed: bool,
    /// Sampled for the percentiles (always after closing).
    sampled: bool,
    after_closing: bool,
}

/// One stream's state. Cells, not `&mut`: the native module may run one of
/// a stream's callbacks inside another (a local reply runs the response
/// ones).
#[derive(Debug, Default)]
pub struct ProviderStream {
    /// Its request headers came through this filter. A response to a
    /// request that never did is a filter's before it (graceful_drain's
    /// own answers, its 403 above all): neither stamped nor marked here, on
    /// either delivery (a wasm context never entered gets no response
    /// callback; the native module's filter does).
    saw_request: Cell<bool>,
    /// In the in-flight count: leaves it once.
    counted: Cell<bool>,
    /// The closing mark was counted for this response.
    marked: Cell<bool>,
    /// Answered with the drained 503 (it carries the mark).
    rejected: Cell<bool>,
    /// Rejected while the gate held admission shut before its pass
    /// (`longest_request`): a late arrival, for the drain report.
    refused_late: Cell<bool>,
    /// Kept as a long-lived stream under this id.
    kept: Cell<Option<u32>>,
    recording: RefCell<Option<Recording>>,
}

impl Provider {
    /// Parses `json`, creates the provider's shared keys, agrees on the
    /// instance id and publishes it for graceful_drain. Err: the reason
    /// to refuse the config (the glue names the filter).
    pub fn configure(h: &impl Host, json: &[u8]) -> Result<Provider, String> {
        let config = ProviderConfig::from_json(json).map_err(|e| e.to_string())?;
        // Configured before any worker serves, so the record exists before
        // the first admission (no first-write race).
        crate::initial::create_keys(h, Owner::Provider)?;
        // A stat Envoy's stats_matcher rejects counts nothing: the gate
        // would pass with requests in flight. Refuse rather than pretend.
        if !h.metric_is_kept(Metric::ProviderInflight) {
            return Err(format!(
                "Envoy does not keep the stat {} (reads 0 after +1): its stats_matcher must keep the wasmcustom.graceful_ stats",
                Metric::ProviderInflight.name()
            ));
        }
        let instance_id = match &config.instance_id {
            Some(id) => id.clone(),
            None => crate::shared::instance::agreed_instance_id(h),
        };
        // Published for graceful_drain, which stamps its own answers with it
        // (every copy writes the same value, so racing writes agree).
        if let Some(header) = &config.instance_header {
            let _ = h.store().set(
                keys::IDENTITY.name,
                &instance::encode_identity(header, &instance_id),
                0,
            );
        }
        Ok(Provider {
            config,
            instance_id,
            knows_closing: AtomicBool::new(false),
            admitted: AtomicU32::new(0),
            merge_warned: AtomicBool::new(false),
            clock_us: AtomicU64::new(0),
            longest_us: AtomicU64::new(0),
        })
    }

    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// Whether the request is a long-lived stream (the reads the config
    /// asks for, no more). A request whose headers end it is not upgrading:
    /// Envoy's codecs pass an upgrade on with its stream open (HTTP/1.1's
    /// server codec raises an upgrade's headers with `end_stream` false,
    /// `handling_upgrade_` in `http1/codec_impl.cc`; an HTTP/2 extended
    /// CONNECT is a tunnel), so most requests skip the `upgrade` read.
    fn is_long_lived(&self, s: &impl Stream, ends_in_headers: bool) -> bool {
        let cfg = &self.config;
        if cfg.long_lived_upgrades
            && !ends_in_headers
            && s.header(Map::RequestHeaders, UPGRADE)
                .is_some_and(|u| !u.is_empty())
        {
            return true;
        }
        if cfg.long_lived_paths.is_empty() {
            return false;
        }
        s.header(Map::RequestHeaders, PATH).is_some_and(|path| {
            let path = without_query(&path);
            cfg.long_lived_paths.iter().any(|p| p.matches(path))
        })
    }

    /// A request's headers; `ends_in_headers`: they end the request (the
    /// host's `end_of_stream`). `waiter` gives the stream's id and its wake
    /// handle, asked only when it is kept as a long-lived stream.
    pub fn request_headers<W>(
        &self,
        st: &ProviderStream,
        s: &impl Stream,
        copy: &impl StateCell<ProviderCopy<W>>,
        ends_in_headers: bool,
        waiter: impl FnOnce() -> (u32, W),
    ) -> Action {
        st.saw_request.set(true);
        match gate::admit(
            &HostMetrics(s),
            self.config.reject_when_drained,
            &self.knows_closing,
        ) {
            Admission::Admitted => {
                // Admitted as any request (counted before the gate is
                // read), then a long-lived one leaves the count at once.
                let long_lived = self.is_long_lived(s, ends_in_headers)
                    && copy.with(|c| c.len()) < MAX_LONG_LIVED;
                if long_lived {
                    let (id, wake) = waiter();
                    copy.with(|c| c.kept.hold(id, wake, u64::MAX));
                    st.kept.set(Some(id));
                    gate::finish(&HostMetrics(s));
                } else {
                    st.counted.set(true);
                }
                self.begin_recording(st, s, !long_lived);
                Action::Continue
            }
            Admission::Rejected => {
                s.metric_add(Metric::ProviderRejected, 1);
                // Drained: closing for sure, and this caller is still
                // sending.
                self.knows_closing.store(true, Relaxed);
                st.rejected.set(true);
                st.refused_late.set(gate::refused_late(&HostMetrics(s)));
                self.begin_recording(st, s, false);
                if self.send_drained(s) {
                    Action::Stop
                } else {
                    // A refused reply lets the request through (fail open).
                    Action::Continue
                }
            }
        }
    }

    /// Decides what this stream records for the report: from closing on,
    /// its caller; its duration if `timed` (sampled for the percentiles:
    /// every one from closing on, one in [`SAMPLE_EVERY`] while serving).
    fn begin_recording(&self, st: &ProviderStream, s: &impl Stream, timed: bool) {
        // Admission read the phase until this copy knew: a request that
        // starts after closing is recorded, even the first (a consumer
        // told by its answer sends no second one).
        let after_closing = self.knows_closing.load(Relaxed);
        let sampled = after_closing || {
            let n = self.admitted.fetch_add(1, Relaxed).wrapping_add(1);
            timed && n.is_multiple_of(SAMPLE_EVERY)
        };
        if !timed && !after_closing {
            return;
        }
        let peer = after_closing.then(|| {
            let source = s.attribute(Attribute::SourceAddress);
            let consumer = self
                .config
                .consumer_header
                .as_deref()
                .and_then(|h| s.header(Map::RequestHeaders, h));
            PeerId::new(source.as_deref(), consumer.as_deref())
        });
        st.recording.replace(Some(Recording {
            peer,
            start_us: self.read_clock(s),
            timed,
            sampled,
            after_closing,
        }));
    }

    /// Reads the clock, moving this copy's coarse clock with it.
    fn read_clock(&self, h: &(impl Host + ?Sized)) -> u64 {
        let now = h.now_us();
        self.clock_us.fetch_max(now, Relaxed);
        now
    }

    /// A timed stream's duration (µs), if it goes to the report: read for a
    /// sampled stream, else only if its coarse duration could make it the
    /// longest this copy knows of (see the module doc).
    fn duration_of(&self, r: &Recording, h: &(impl Host + ?Sized)) -> Option<u64> {
        if !r.timed {
            return None;
        }
        if !r.sampled {
            let coarse = self.clock_us.load(Relaxed).saturating_sub(r.start_us);
            let slack = COARSE_SLACK.as_micros() as u64;
            if coarse.saturating_add(slack) < self.longest_us.load(Relaxed) {
                return None;
            }
        }
        let took = self.read_clock(h).saturating_sub(r.start_us);
        self.longest_us.fetch_max(took, Relaxed);
        Some(took)
    }

    /// The tick: merges this copy's report records; once the gate has
    /// passed, every kept long-lived stream is due (`wake` is called for
    /// each under the copy's lock) and returned.
    pub fn tick<W>(
        &self,
        copy: &impl StateCell<ProviderCopy<W>>,
        h: &impl Host,
        mut wake: impl FnMut(u32, &W),
    ) -> Vec<(u32, W)> {
        self.read_clock(h);
        let pending = copy.with(|c| std::mem::take(&mut c.report));
        if !pending.is_empty() {
            match pending.merge_into(h.store()) {
                Ok(longest) => {
                    self.longest_us.fetch_max(longest, Relaxed);
                }
                Err(e) => {
                    if !self.merge_warned.swap(true, Relaxed) {
                        h.log(
                            Level::Warn,
                            &format!(
                                "drain report records dropped (shared data: {e:?}); logged once"
                            ),
                        );
                    }
                }
            }
        }
        if copy.with(|c| c.is_empty()) {
            return Vec::new();
        }
        let passed = h.metric_get(Metric::DrainGate).is_some_and(|g| g > 0);
        let due = copy.with(|c| {
            let due = c.kept.take_due(passed, 0);
            for (id, w) in &due {
                wake(*id, w);
            }
            due
        });
        if !due.is_empty() {
            h.log(
                Level::Info,
                &format!("drained: ending {} long-lived stream(s)", due.len()),
            );
        }
        due
    }

    /// A kept long-lived stream woken at drained: the marked 503 (a gRPC
    /// client reads UNAVAILABLE). Once the app's headers went out Envoy
    /// turns it into a reset (RST_STREAM; gRPC reads INTERNAL): neither
    /// ABI can end a downstream stream with trailers or REFUSED_STREAM
    /// (the connection manager resets downstream streams as LocalReset
    /// whatever reason a dynamic module gives: tried on 1.40).
    pub fn answer_woken(&self, s: &impl Stream) {
        self.send_drained(s);
    }

    /// The marked 503 of a drained instance; false if the host refused it.
    fn send_drained(&self, s: &impl Stream) -> bool {
        let mut headers = vec![(self.config.closing_header.as_str(), "true")];
        if self.config.immediate_health_check_fail {
            headers.push((IMMEDIATE_HC_FAIL, "true"));
        }
        if let Some(h) = &self.config.instance_header {
            headers.push((h.as_str(), self.instance_id.as_str()));
        }
        s.send_reply(&LocalReply {
            status: 503,
            headers: &headers,
            body: b"instance is shutting down\n",
            // UNAVAILABLE, for a gRPC request only (the contract's
            // `grpc-status: 14`): a client retries it elsewhere.
            grpc_status: Some(14),
            details: "graceful_provider_drained",
        })
    }

    /// Whether the instance is closing now. Unreadable reads as serving: an
    /// unmarked response is harmless, a false mark would evict a healthy
    /// instance.
    fn closing_now(&self, s: &impl Host) -> bool {
        gate::phase_seen(&HostMetrics(s), &self.knows_closing) == PhaseSeen::Closing
    }

    fn note_marked(st: &ProviderStream, s: &impl Host) {
        if !st.marked.replace(true) {
            s.metric_add(Metric::ProviderClosingMarked, 1);
        }
    }

    pub fn response_headers(&self, st: &ProviderStream, s: &impl Stream) -> Action {
        if !st.saw_request.get() {
            return Action::Continue;
        }
        let cfg = &self.config;
        if let Some(h) = &cfg.instance_header {
            s.set_header(Map::ResponseHeaders, h, &self.instance_id);
        }
        if self.closing_now(s) {
            let mut ok = s.set_header(Map::ResponseHeaders, &cfg.closing_header, "true");
            if cfg.immediate_health_check_fail {
                ok &= s.set_header(Map::ResponseHeaders, IMMEDIATE_HC_FAIL, "true");
            }
            if ok {
                Self::note_marked(st, s);
            }
        }
        Action::Continue
    }

    /// Marks the trailers of a response if the instance is closing now:
    /// any response with trailers (gRPC, or HTTP with chunked trailers,
    /// where the mark is as harmless as in headers). A gRPC response always
    /// ends in trailers, or is trailers-only (headers, marked above); one
    /// that ends in its body instead is not valid gRPC, and carries the mark
    /// in its headers only: creating trailers there would need the body
    /// callback, entered for every chunk of every response.
    pub fn response_trailers(&self, st: &ProviderStream, s: &impl Stream) -> Action {
        if st.saw_request.get()
            && self.closing_now(s)
            && s.set_header(Map::ResponseTrailers, &self.config.closing_header, "true")
        {
            Self::note_marked(st, s);
        }
        Action::Continue
    }

    /// The stream is over: it leaves the in-flight count, exactly once
    /// however often the host says so, and what it recorded goes to the
    /// copy's pending report.
    pub fn stream_end<W>(
        &self,
        st: &ProviderStream,
        h: &(impl Host + ?Sized),
        copy: &impl StateCell<ProviderCopy<W>>,
    ) {
        if st.counted.take() {
            gate::finish(&HostMetrics(h));
        }
        if let Some(id) = st.kept.take() {
            copy.with(|c| c.release(id));
        }
        if let Some(r) = st.recording.take() {
            let took = self.duration_of(&r, h);
            let marked = st.marked.get() || st.rejected.get();
            if r.peer.is_none() && took.is_none() {
                return;
            }
            copy.with(|c| {
                if let Some(peer) = r.peer {
                    c.report
                        .peers
                        .add(peer, marked, st.refused_late.get(), r.start_us);
                }
                match took {
                    Some(us) if r.sampled => c.report.durations.add(us, r.after_closing),
                    Some(us) => c.report.durations.note_longest(us),
                    None => {}
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::shared::mock::MockHost;

    fn copy() -> RefCell<ProviderCopy> {
        RefCell::new(ProviderCopy::default())
    }

    fn provider(h: &MockHost, json: &str) -> Provider {
        match Provider::configure(h, json.as_bytes()) {
            Ok(p) => p,
            Err(e) => panic!("configure: {e}"),
        }
    }

    #[test]
    fn it_admits_counts_and_counts_out_once() {
        let h = MockHost::new();
        let p = provider(&h, "");
        let st = ProviderStream::default();
        assert_eq!(
            p.request_headers(&st, &h, &copy(), true, || (1, ())),
            Action::Continue
        );
        assert_eq!(h.metric(Metric::ProviderInflight), 1);
        assert_eq!(h.metric(Metric::ProviderStarted), 1);
        p.stream_end(&st, &h, &copy());
        p.stream_end(&st, &h, &copy());
        assert_eq!(h.metric(Metric::ProviderInflight), 0);
        assert!(h.replies().is_empty());
    }

    #[test]
    fn once_the_gate_passed_it_rejects_with_the_marked_503() {
        let h = MockHost::new();
        let p = provider(
            &h,
            r#"{"instance_id": "pod-a", "immediate_health_check_fail": true}"#,
        );
        // Drained, as graceful_drain leaves it: the phase, then the gate.
        h.metric_set(Metric::DrainPhase, 2);
        h.metric_set(Metric::DrainGate, 1);
        let st = ProviderStream::default();
        assert_eq!(
            p.request_headers(&st, &h, &copy(), true, || (1, ())),
            Action::Stop
        );
        let replies = h.replies();
        assert_eq!(replies.len(), 1);
        let r = &replies[0];
        assert_eq!(r.status, 503);
        assert_eq!(r.details, "graceful_provider_drained");
        assert_eq!(r.body, b"instance is shutting down\n");
        for (k, v) in [
            ("x-graceful-closing", "true"),
            (IMMEDIATE_HC_FAIL, "true"),
            ("x-graceful-instance", "pod-a"),
        ] {
            assert!(r.headers.contains(&(k.into(), v.into())), "{k}: {r:?}");
        }
        assert_eq!(h.metric(Metric::ProviderRejected), 1);
        assert_eq!(h.metric(Metric::ProviderInflight), 0);
        p.stream_end(&st, &h, &copy());
        assert_eq!(h.metric(Metric::ProviderInflight), 0);
    }

    #[test]
    fn a_refused_reply_lets_the_request_through() {
        let h = MockHost::new();
        let p = provider(&h, "");
        // Drained, as graceful_drain leaves it: the phase, then the gate.
        h.metric_set(Metric::DrainPhase, 2);
        h.metric_set(Metric::DrainGate, 1);
        h.refuse_replies();
        assert_eq!(
            p.request_headers(&ProviderStream::default(), &h, &copy(), true, || (1, ())),
            Action::Continue
        );
    }

    #[test]
    fn it_marks_headers_and_trailers_only_while_closing_and_counts_once() {
        let h = MockHost::new();
        let p = provider(&h, r#"{"immediate_health_check_fail": true}"#);
        let st = ProviderStream::default();
        p.request_headers(&st, &h, &copy(), true, || (1, ()));
        p.response_headers(&st, &h);
        let id = p.instance_id().to_string();
        assert_eq!(
            h.header_text(Map::ResponseHeaders, "x-graceful-instance"),
            Some(id)
        );
        assert_eq!(
            h.header_text(Map::ResponseHeaders, "x-graceful-closing"),
            None
        );
        h.metric_set(Metric::DrainPhase, 1);
        let st = ProviderStream::default();
        p.request_headers(&st, &h, &copy(), true, || (1, ()));
        p.response_headers(&st, &h);
        p.response_trailers(&st, &h);
        assert_eq!(
            h.header_text(Map::ResponseHeaders, "x-graceful-closing")
                .as_deref(),
            Some("true")
        );
        assert_eq!(
            h.header_text(Map::ResponseHeaders, IMMEDIATE_HC_FAIL)
                .as_deref(),
            Some("true")
        );
        assert_eq!(
            h.header_text(Map::ResponseTrailers, "x-graceful-closing")
                .as_deref(),
            Some("true")
        );
        assert_eq!(h.metric(Metric::ProviderClosingMarked), 1);
    }

    #[test]
    fn a_reply_to_a_request_it_never_saw_is_neither_stamped_nor_marked() {
        // graceful_drain's own answers (its 403 to an outsider above all)
        // reach the native provider's response hooks without its request
        // hook having run: they leave as drain wrote them.
        let h = MockHost::new();
        let p = provider(&h, "");
        h.metric_set(Metric::DrainPhase, 1);
        let st = ProviderStream::default();
        p.response_headers(&st, &h);
        p.response_trailers(&st, &h);
        for name in ["x-graceful-instance", "x-graceful-closing"] {
            assert_eq!(h.header_text(Map::ResponseHeaders, name), None, "{name}");
        }
        assert_eq!(
            h.header_text(Map::ResponseTrailers, "x-graceful-closing"),
            None
        );
        assert_eq!(h.metric(Metric::ProviderClosingMarked), 0);
    }

    #[test]
    fn every_copy_agrees_on_one_instance_id_and_publishes_it() {
        let h = MockHost::new();
        let a = provider(&h, r#"{"instance_header": "x-i"}"#);
        let b = provider(&h, r#"{"instance_header": "x-i"}"#);
        assert_eq!(a.instance_id(), b.instance_id());
        let published = h.store().get(keys::IDENTITY.name).ok().flatten();
        let decoded = published.and_then(|(v, _)| instance::decode_identity(&v));
        assert_eq!(decoded, Some(("x-i".into(), a.instance_id().into())));
    }

    #[test]
    fn it_refuses_a_config_whose_in_flight_stat_envoy_drops_naming_it() {
        let h = MockHost::new();
        h.drop_metric(Metric::ProviderInflight);
        let err = Provider::configure(&h, b"").err().unwrap_or_default();
        assert!(err.contains("graceful_provider_inflight"), "{err}");
        let h = MockHost::new();
        let err = Provider::configure(&h, br#"{"reject_when_drained": 3}"#)
            .err()
            .unwrap_or_default();
        assert!(err.contains("reject_when_drained"), "{err}");
    }

    #[test]
    fn a_store_that_refuses_the_id_is_logged_and_a_local_id_used() {
        let h = MockHost::new();
        h.refuse_writes_to(keys::INSTANCE_ID.name);
        let p = provider(&h, "");
        assert!(instance::is_valid(p.instance_id().as_bytes()));
        assert_eq!(h.logs_containing("instance id not shared").len(), 1);
    }

    /// A request on `path` with `upgrade`, through `copy` as stream `id`.
    fn open(
        p: &Provider,
        h: &MockHost,
        copy: &RefCell<ProviderCopy>,
        path: &str,
        upgrade: Option<&str>,
        id: u32,
    ) -> ProviderStream {
        let mut headers = vec![(":method", "GET"), (":path", path)];
        if let Some(u) = upgrade {
            headers.push(("upgrade", u));
        }
        h.set_map(Map::RequestHeaders, &headers);
        let st = ProviderStream::default();
        assert_eq!(
            p.request_headers(&st, h, copy, upgrade.is_none(), || (id, ())),
            Action::Continue
        );
        st
    }

    #[test]
    fn long_lived_streams_leave_the_count_and_end_once_the_gate_passed() {
        let h = MockHost::new();
        let p = provider(&h, r#"{"long_lived_paths": ["/events", "/stream/*"]}"#);
        let copy = copy();
        let ws = open(&p, &h, &copy, "/chat", Some("websocket"), 1);
        let events = open(&p, &h, &copy, "/events?since=3", None, 2);
        let stream = open(&p, &h, &copy, "/stream/a", None, 3);
        let plain = open(&p, &h, &copy, "/eventsx", None, 4);
        // Only the plain request holds the gate; every one was a start.
        assert_eq!(h.metric(Metric::ProviderInflight), 1);
        assert_eq!(h.metric(Metric::ProviderStarted), 4);
        assert_eq!(copy.borrow().len(), 3);
        // One ends by itself; nothing is due before the gate passes.
        p.stream_end(&stream, &h, &copy);
        assert!(p.tick(&copy, &h, |_, _| {}).is_empty());
        // Drained, as graceful_drain leaves it: the phase, then the gate.
        h.metric_set(Metric::DrainPhase, 2);
        h.metric_set(Metric::DrainGate, 1);
        let mut woken = Vec::new();
        let due = p.tick(&copy, &h, |id, _| woken.push(id));
        assert_eq!((due.len(), woken), (2, vec![1, 2]));
        assert!(p.tick(&copy, &h, |_, _| {}).is_empty(), "once");
        p.answer_woken(&h);
        let r = &h.replies()[0];
        assert_eq!((r.status, r.details), (503, "graceful_provider_drained"));
        assert!(r
            .headers
            .contains(&("x-graceful-closing".into(), "true".into())));
        for st in [&ws, &events, &plain] {
            p.stream_end(st, &h, &copy);
        }
        assert_eq!(h.metric(Metric::ProviderInflight), 0);
        assert!(copy.borrow().is_empty());
    }

    #[test]
    fn an_upgrade_header_on_a_request_its_headers_end_is_an_ordinary_request() {
        // Envoy raises an upgrade with its stream open: one whose headers
        // end it upgrades nothing, and is counted as any request.
        let h = MockHost::new();
        let p = provider(&h, "");
        let copy = copy();
        h.set_map(
            Map::RequestHeaders,
            &[
                (":method", "GET"),
                (":path", "/chat"),
                ("upgrade", "websocket"),
            ],
        );
        let st = ProviderStream::default();
        assert_eq!(
            p.request_headers(&st, &h, &copy, true, || (1, ())),
            Action::Continue
        );
        assert_eq!(h.metric(Metric::ProviderInflight), 1);
        assert!(copy.borrow().is_empty(), "not kept");
        p.stream_end(&st, &h, &copy);
        assert_eq!(h.metric(Metric::ProviderInflight), 0);
    }

    #[test]
    fn without_the_config_upgrades_and_paths_are_ordinary_requests() {
        let h = MockHost::new();
        let p = provider(&h, r#"{"long_lived_upgrades": false}"#);
        let copy = copy();
        let _ws = open(&p, &h, &copy, "/chat", Some("websocket"), 1);
        let _empty = open(&p, &h, &copy, "/x", Some(""), 2);
        assert_eq!(h.metric(Metric::ProviderInflight), 2);
        assert!(copy.borrow().is_empty());
        // The default: upgrades are long-lived, an empty upgrade is not.
        let p = provider(&h, "");
        let _ws = open(&p, &h, &copy, "/chat", Some("websocket"), 3);
        let _empty = open(&p, &h, &copy, "/x", Some(""), 4);
        assert_eq!(h.metric(Metric::ProviderInflight), 3);
        assert_eq!(copy.borrow().len(), 1);
    }

    #[test]
    fn past_the_bound_a_long_lived_stream_is_counted_as_any_request() {
        let h = MockHost::new();
        let p = provider(&h, "");
        let copy = copy();
        for id in 0..MAX_LONG_LIVED as u32 + 2 {
            let _open = open(&p, &h, &copy, "/ws", Some("websocket"), id);
        }
        assert_eq!(copy.borrow().len(), MAX_LONG_LIVED);
        assert_eq!(h.metric(Metric::ProviderInflight), 2);
    }

    #[test]
    fn while_serving_it_times_one_request_in_sample_every_and_names_nobody() {
        let h = MockHost::new();
        let p = provider(&h, "");
        let copy = copy();
        for _ in 0..(SAMPLE_EVERY * 3) {
            let st = open(&p, &h, &copy, "/x", None, 1);
            h.advance(Duration::from_millis(2));
            p.stream_end(&st, &h, &copy);
        }
        assert!(p.tick(&copy, &h, |_, _| {}).is_empty());
        let inputs = crate::drain::Inputs::read(h.store()).unwrap();
        let s = inputs.durations.summary();
        assert_eq!((s.count, s.p50_us), (3, 2_000));
        assert_eq!(inputs.peers, Default::default());
    }

    /// Runs `copy`'s ticks every [`TICK`] for `d`, as the host does.
    fn run_for(p: &Provider, h: &MockHost, copy: &RefCell<ProviderCopy>, d: Duration) {
        let mut left = d;
        while left > Duration::ZERO {
            let step = left.min(TICK);
            h.advance(step);
            p.tick(copy, h, |_, _| {});
            left -= step;
        }
    }

    #[test]
    fn the_longest_request_is_exact_though_only_one_in_sample_every_is_sampled() {
        let h = MockHost::new();
        let p = provider(&h, "");
        let copy = copy();
        // While serving: short requests, and at three unsampled places a
        // long one overlapping them (1.5 s, then 1.5 s, then 1,623.4 ms).
        let longs = [1_500_000u64, 1_500_000, 1_623_400];
        for (i, long_us) in longs.into_iter().enumerate() {
            let long = open(&p, &h, &copy, "/slow", None, 100 + i as u32);
            assert!(
                !(p.admitted.load(Relaxed)).is_multiple_of(SAMPLE_EVERY),
                "the long request is not sampled"
            );
            for _ in 0..(SAMPLE_EVERY + 3) {
                let st = open(&p, &h, &copy, "/x", None, 1);
                h.advance(Duration::from_micros(700));
                p.stream_end(&st, &h, &copy);
            }
            let spent = (SAMPLE_EVERY as u64 + 3) * 700;
            run_for(&p, &h, &copy, Duration::from_micros(long_us - spent));
            p.stream_end(&long, &h, &copy);
            p.tick(&copy, &h, |_, _| {});
        }
        let s = crate::drain::Inputs::read(h.store())
            .unwrap()
            .durations
            .summary();
        assert_eq!(s.max_us, 1_623_400, "exact, to the microsecond");
        assert_eq!(s.p99_us, 700, "the long ones were not sampled");
        // A short request after that ends without making a new longest,
        // and a request in flight at closing that ends after it counts.
        let in_flight = open(&p, &h, &copy, "/slow", None, 200);
        run_for(&p, &h, &copy, Duration::from_millis(300));
        h.metric_set(Metric::DrainPhase, 1);
        run_for(&p, &h, &copy, Duration::from_millis(1_500));
        p.stream_end(&in_flight, &h, &copy);
        p.tick(&copy, &h, |_, _| {});
        let s = crate::drain::Inputs::read(h.store())
            .unwrap()
            .durations
            .summary();
        assert_eq!(s.max_us, 1_800_000);
    }

    #[test]
    fn a_copy_learns_the_longest_from_shared_data_at_its_merge() {
        let h = MockHost::new();
        let (a, b) = (provider(&h, ""), provider(&h, ""));
        let (ca, cb) = (copy(), copy());
        let long = open(&a, &h, &ca, "/slow", None, 1);
        run_for(&a, &h, &ca, Duration::from_secs(2));
        a.stream_end(&long, &h, &ca);
        a.tick(&ca, &h, |_, _| {});
        assert_eq!(a.longest_us.load(Relaxed), 2_000_000);
        assert_eq!(b.longest_us.load(Relaxed), 0);
        // b merges a request of its own: it now knows a's longest too.
        let st = open(&b, &h, &cb, "/x", None, 1);
        b.stream_end(&st, &h, &cb);
        b.tick(&cb, &h, |_, _| {});
        assert_eq!(b.longest_us.load(Relaxed), 2_000_000);
    }

    #[test]
    fn once_it_knows_of_the_closing_it_records_every_caller_and_the_drained_ones() {
        let h = MockHost::new();
        let p = provider(&h, "");
        let copy = copy();
        h.set_attribute(Attribute::SourceAddress, "10.0.0.5:41000");
        // In flight at closing: answered marked, but it started before.
        let before = open(&p, &h, &copy, "/x", None, 1);
        h.metric_set(Metric::DrainPhase, 1);
        p.response_headers(&before, &h);
        p.stream_end(&before, &h, &copy);
        h.set_map(
            Map::RequestHeaders,
            &[(":path", "/x"), ("x-graceful-consumer", "c-7")],
        );
        for _ in 0..3 {
            let st = ProviderStream::default();
            p.request_headers(&st, &h, &copy, true, || (1, ()));
            h.advance(Duration::from_millis(5));
            p.response_headers(&st, &h);
            p.stream_end(&st, &h, &copy);
        }
        // Drained (the phase, then the gate, as graceful_drain leaves it):
        // the rejected request is recorded too, marked.
        h.metric_set(Metric::DrainPhase, 2);
        h.metric_set(Metric::DrainGate, 1);
        h.set_attribute(Attribute::SourceAddress, "[fd00::1]:41000");
        h.set_map(Map::RequestHeaders, &[(":path", "/x")]);
        let st = ProviderStream::default();
        assert_eq!(
            p.request_headers(&st, &h, &copy, true, || (1, ())),
            Action::Stop
        );
        p.stream_end(&st, &h, &copy);
        p.tick(&copy, &h, |_, _| {});
        let table = crate::drain::Inputs::read(h.store()).unwrap().peers;
        assert_eq!(table.requests, 4);
        let lines: Vec<(String, Option<String>, u64, u64)> = table
            .peers
            .iter()
            .map(|(peer, c)| {
                let address = peer.address.map(|a| a.to_string()).unwrap_or_default();
                (address, peer.consumer.clone(), c.requests, c.marked)
            })
            .collect();
        assert_eq!(
            lines,
            [
                ("10.0.0.5".into(), Some("c-7".into()), 3, 3),
                ("fd00::1".into(), None, 1, 1)
            ]
        );
        let s = crate::drain::Inputs::read(h.store())
            .unwrap()
            .durations
            .summary();
        assert_eq!((s.count, s.max_us), (3, 5_000));
    }

    #[test]
    fn the_first_request_after_closing_is_recorded_before_any_response() {
        let h = MockHost::new();
        let p = provider(&h, r#"{"consumer_header": ""}"#);
        let copy = copy();
        h.set_attribute(Attribute::SourceAddress, "10.0.0.5:41000");
        h.metric_set(Metric::DrainPhase, 1);
        h.set_map(
            Map::RequestHeaders,
            &[(":path", "/x"), ("x-graceful-consumer", "c-7")],
        );
        let st = ProviderStream::default();
        p.request_headers(&st, &h, &copy, true, || (1, ()));
        p.stream_end(&st, &h, &copy);
        p.tick(&copy, &h, |_, _| {});
        let table = crate::drain::Inputs::read(h.store()).unwrap().peers;
        // consumer_header "" reads no header: the caller is its address.
        assert_eq!(table.peers.len(), 1);
        assert_eq!(table.peers[0].0.consumer, None);
        assert_eq!(table.peers[0].1.marked, 0, "no response went out");
    }
}
