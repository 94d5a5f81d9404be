//! graceful_drain's callbacks, for both deliveries: the endpoints, the
//! tick, and the answers to its two HTTP calls.
//!
//! | event | does |
//! |---|---|
//! | request headers, not an endpoint | nothing (one header read) |
//! | any endpoint but `ready` and gRPC health, from a source outside `allowed_sources` | 403, never held (a refused `closing` is logged) |
//! | `closing` (allowed source) | starts closing, raises the phase, answers 202 with the status |
//! | `ready`, gRPC health `Check` | answers from the record (gRPC health while serving: the app's) |
//! | gRPC health `Watch` | while serving, the app's, and this copy keeps the stream (at most [`MAX_WATCHES`]); once closing, answered `NOT_SERVING` |
//! | tick, closing, kept `Watch` streams | wakes each: answered `NOT_SERVING`, which Envoy turns into a reset once the app's headers went out (the client's health check sees the stream fail); so none holds the gate |
//! | `report` | the drain report ([`crate::drain::report`]) from shared data |
//! | `status`, `drained` | evaluates the gate ([`crate::drain::gate_copy::GateCopy::advance`]) and answers; `drained?wait=` holds the stream until drained or its wait runs out |
//! | tick (every [`TICK`]) | evaluates the gate; sends `on_drained` for a pass this copy made (on the tick or in an endpoint); wakes due long-polls; while serving, polls the admin's `/ready` (one copy per [`ADMIN_POLL_INTERVAL`], by lease) |
//! | admin answer 503 `DRAINING` | starts closing (Envoy's `/healthcheck/fail`) |
//! | closing started by this copy, `close_connections` on | at its next tick, POSTs the mode's admin path ([`CloseConnections::admin_path`]), so Envoy tells keep-alive and HTTP/2 clients to leave; a failed answer is tried again [`CLOSE_RETRY`] later, until closing ends with the process |
//! | tick, closing or drained, once per [`REPORT_INTERVAL`] | reads the report's peers: sets `graceful_drain_late_peers` |
//! | `on_drained` answer not 2xx | `graceful_drain_callback_failed` +1 |
//! | a held stream ends | frees its long-poll slot |
//!
//! A pass is logged and counted once, by the copy whose write passed the
//! gate: the pass line, the outcome counter (`graceful_drain_passed_*`),
//! which timeout forced it ([`keys::PASSED_BY`]) and the report as one
//! line; that copy alone calls `on_drained`.

use std::time::Duration;

use crate::drain::config::{CloseConnections, DrainConfig};
use crate::drain::endpoints::{is_endpoint_path, route, Endpoint, Reply, Route, Stamp, Waiters};
use crate::drain::gate_copy::{raise_phase, Evaluation, GateCopy};
use crate::drain::record::{self, GatePass, Phase};
use crate::drain::report::{Inputs, Report};
use crate::shared::duration::micros;
use crate::shared::headers::{
    ADMIN_AUTHORITY, AUTHORITY, CONTENT_TYPE, FORWARDED_FOR, METHOD, PATH, STATUS,
};
use crate::shared::host::{
    Action, Attribute, CallResponse, Host, HostMetrics, HttpCall, Level, LocalReply, Map,
    StateCell, Stream,
};
use crate::shared::keys::{self, Owner};
use crate::shared::metrics::Metric;
use crate::shared::net::trusted_peer_ip;
use crate::shared::store::{add_bounded, take_lease, update, UpdateError};

/// How often every copy evaluates the gate and answers due long-polls:
/// the gate passes at most this late.
pub const TICK: Duration = Duration::from_millis(50);
/// How often one copy of the process asks the admin for `/ready`.
pub const ADMIN_POLL_INTERVAL: Duration = Duration::from_secs(1);
pub const ADMIN_POLL_TIMEOUT: Duration = Duration::from_secs(1);
/// Most gRPC health `Watch` streams one copy keeps to end at closing; more
/// go to the app unkept (the process exit ends them).
pub const MAX_WATCHES: usize = 1024;
/// How long after a failed `close_connections` call the next is sent.
pub const CLOSE_RETRY: Duration = Duration::from_secs(1);
pub const CLOSE_CALL_TIMEOUT: Duration = Duration::from_secs(1);
/// Most bytes of a call's answer the drain reads (`DRAINING`).
pub const MAX_ANSWER_BODY: usize = 64;
/// How often a copy refreshes `graceful_drain_late_peers` while closing.
pub const REPORT_INTERVAL: Duration = Duration::from_secs(1);

/// One configured drain.
pub struct Drain {
    config: DrainConfig,
}

/// One copy's state (a VM copy's; the native config's): its part in the
/// gate, its held streams and its calls. `W` is what wakes a held
/// long-poll (see [`Waiters`]).
#[derive(Debug)]
pub struct DrainCopy<W = ()> {
    gate: GateCopy,
    waiters: Waiters<W>,
    /// gRPC health `Watch` streams held by the app since serving.
    watches: Waiters<W>,
    /// Woken `Watch` streams not answered yet.
    ending_watches: Vec<u32>,
    /// Token of the admin `/ready` call in flight.
    admin_call: Option<u32>,
    /// Token of the `on_drained` call in flight.
    callback_call: Option<u32>,
    /// A failed admin poll was logged already (once per copy: a missing
    /// cluster would otherwise log every second for the life of the process).
    admin_warned: bool,
    /// The status JSON of a pass this copy made and has not told
    /// `on_drained` of yet.
    callback_owed: Option<String>,
    /// This copy started closing and has not had the admin's 2xx to its
    /// `close_connections` call yet.
    close_owed: bool,
    /// Token of the `close_connections` call in flight.
    close_call: Option<u32>,
    /// The earliest time (µs) the next `close_connections` call is sent.
    close_not_before: u64,
    /// A failed `close_connections` call was logged already (once per copy).
    close_warned: bool,
    /// When this copy last set `graceful_drain_late_peers` (µs).
    late_peers_at: u64,
}

impl<W> Default for DrainCopy<W> {
    fn default() -> Self {
        DrainCopy {
            gate: GateCopy::default(),
            waiters: Waiters::default(),
            watches: Waiters::default(),
            ending_watches: Vec::new(),
            admin_call: None,
            callback_call: None,
            admin_warned: false,
            callback_owed: None,
            close_owed: false,
            close_call: None,
            close_not_before: 0,
            close_warned: false,
            late_peers_at: 0,
        }
    }
}

impl<W> DrainCopy<W> {
    /// Long-polls held.
    pub fn held(&self) -> usize {
        self.waiters.len()
    }
}

/// What a stream's request gets.
enum Answer {
    Now(Reply),
    /// Held until the tick wakes it.
    Held,
    /// Not the filter's: the request goes on to the app.
    App,
}

/// Logs `notice` (info) unless this Envoy logged the same one already:
/// every VM copy configures, and a line per copy would bury it. A store
/// that fails logs it anyway (a notice is cheap to repeat).
fn log_notice_once(h: &(impl Host + ?Sized), notice: &str) {
    let hash = crate::shared::store::fnv1a(notice.as_bytes());
    let mine = update(h.store(), keys::CONFIG_NOTICE.name, |bytes| {
        match bytes.and_then(crate::shared::store::read_u64) {
            Some(seen) if seen == hash => (None, false),
            _ => (Some(hash.to_le_bytes().to_vec()), true),
        }
    });
    if mine.unwrap_or(true) {
        h.log(Level::Info, notice);
    }
}

impl Drain {
    /// Parses `json` and creates the drain's shared keys (every key a
    /// stream or tick updates exists before any stream runs).
    pub fn configure(h: &impl Host, json: &[u8]) -> Result<Drain, String> {
        let config = DrainConfig::from_json(json).map_err(|e| e.to_string())?;
        crate::initial::create_keys(h, Owner::Drain)?;
        if let Some(notice) = config.unreachable_timeout() {
            log_notice_once(h, &notice);
        }
        Ok(Drain { config })
    }

    /// Evaluates the gate now; a pass this copy made is logged, counted if
    /// forced, and owed to `on_drained`.
    fn advance<W>(
        &self,
        c: &mut DrainCopy<W>,
        h: &(impl Host + ?Sized),
        now: u64,
    ) -> Result<Evaluation, UpdateError> {
        let m = HostMetrics(h);
        let (eval, passed) = c.gate.advance(h.store(), &m, &m, &self.config, now)?;
        if let Some(stopped) = eval.stopped_admitting {
            let timeout_ms = self.config.gate.timeout.as_millis() as u64;
            h.log(Level::Warn, &stopped.line(timeout_ms));
        }
        if let Some(p) = passed {
            let outcome = match p.why {
                GatePass::Quiet => Metric::DrainPassedQuiet,
                GatePass::StepTimeout => Metric::DrainPassedStepTimeout,
                GatePass::Timeout => Metric::DrainPassedTimeout,
            };
            h.metric_add(outcome, 1);
            // Written whole, once: only this copy's write passed the gate.
            let _ = h.store().set(keys::PASSED_BY.name, &[p.why.to_byte()], 0);
            if p.forced() {
                h.metric_add(Metric::DrainForced, 1);
                h.log(Level::Warn, &p.line());
            } else {
                h.log(Level::Info, &p.line());
            }
            match self.report(h, now) {
                Ok(report) => {
                    if let Some(ms) = report.drained_after_ms {
                        h.metric_set(Metric::DrainDrainedAfterMs, ms);
                    }
                    h.log(Level::Info, &format!("drain report: {}", report.to_json()))
                }
                Err(e) => h.log(Level::Warn, &format!("drain report not read: {e}")),
            }
            if self.config.on_drained.is_some() {
                c.callback_owed = Some(eval.status(now).to_json());
            }
        }
        Ok(eval)
    }

    /// The drain report now, from shared data.
    fn report(&self, h: &(impl Host + ?Sized), now: u64) -> Result<Report, String> {
        let inputs = Inputs::read(h.store()).map_err(|e| format!("{e:?}"))?;
        let max = self.config.max_report_peers as usize;
        Ok(Report::build(&inputs, &self.config.gate, max, now))
    }

    /// Sets `graceful_drain_late_peers` from the report's peers, at most
    /// once per [`REPORT_INTERVAL`] per copy, once closing.
    fn count_late_peers<W>(&self, copy: &impl StateCell<DrainCopy<W>>, h: &impl Host, now: u64) {
        let due = copy.with(|c| {
            let due = now >= c.late_peers_at.saturating_add(micros(REPORT_INTERVAL));
            if due {
                c.late_peers_at = now;
            }
            due
        });
        if due {
            if let Ok(inputs) = Inputs::read(h.store()) {
                h.metric_set(
                    Metric::DrainLatePeers,
                    Report::late_peers(&inputs, &self.config.gate),
                );
            }
        }
    }

    /// The record with the traffic now, no gate evaluation.
    fn look<W>(
        &self,
        c: &mut DrainCopy<W>,
        h: &(impl Host + ?Sized),
        now: u64,
    ) -> Result<Evaluation, String> {
        let rec = record::read(h.store()).map_err(|e| format!("{e:?}"))?;
        Ok(c.gate.look(&HostMetrics(h), rec, now))
    }

    /// A request's headers. `waiter` gives the stream's long-poll id and
    /// its wake handle, asked only when the stream is held.
    pub fn request_headers<W>(
        &self,
        copy: &impl StateCell<DrainCopy<W>>,
        s: &impl Stream,
        waiter: impl FnOnce() -> (u32, W),
    ) -> Action {
        // Most requests are the app's: one header read tells.
        let Some(path) = s.header(Map::RequestHeaders, PATH) else {
            return Action::Continue;
        };
        if !is_endpoint_path(&self.config.paths, &path) {
            return Action::Continue;
        }
        let Some(method) = s.header(Map::RequestHeaders, METHOD) else {
            return Action::Continue;
        };
        let reply = match route(&self.config.paths, &method, &path) {
            Route::Pass => return Action::Continue,
            Route::Endpoint(endpoint) => match self.answer(copy, s, endpoint, waiter) {
                Answer::Now(reply) => reply,
                Answer::Held => return Action::Stop,
                Answer::App => return Action::Continue,
            },
            Route::MethodNotAllowed(allow) => Reply::method_not_allowed(allow),
            Route::BadRequest(reason) => Reply::bad_request(&reason),
        };
        send(s, &reply);
        Action::Stop
    }

    fn answer<W>(
        &self,
        copy: &impl StateCell<DrainCopy<W>>,
        s: &impl Stream,
        endpoint: Endpoint,
        waiter: impl FnOnce() -> (u32, W),
    ) -> Answer {
        let now = s.now_us();
        // Readiness and gRPC health answer everyone (kubelet, consumers'
        // health checks); every other endpoint only `allowed_sources`, and
        // a caller outside them is never held, so no caller of the service
        // port can fill the waiter slots a pod's own preStop needs, read
        // the report, or start closing.
        let open_to_all = matches!(
            endpoint,
            Endpoint::Ready | Endpoint::GrpcHealth | Endpoint::GrpcHealthWatch
        );
        let source = if open_to_all {
            None
        } else {
            match self.allowed_source(s, endpoint == Endpoint::Closing) {
                Ok(ip) => ip,
                Err(refused) => return Answer::Now(refused),
            }
        };
        Answer::Now(match endpoint {
            Endpoint::Closing => self.start_closing(copy, s, now, source),
            Endpoint::Ready => match record::read(s.store()) {
                Ok(rec) => Reply::ready(rec.phase),
                Err(e) => Reply::unavailable(&format!("{e:?}")),
            },
            Endpoint::Status => match copy.with(|c| self.advance(c, s, now)) {
                Ok(eval) => Reply::status(&eval.status(now)),
                Err(e) => Reply::unavailable(&format!("{e:?}")),
            },
            Endpoint::Drained { wait } => match copy.with(|c| self.advance(c, s, now)) {
                Ok(eval) if eval.rec.phase == Phase::Drained || wait.is_none() => {
                    Reply::drained(&eval.status(now))
                }
                Ok(_) => match self.hold(copy, s, now, wait.unwrap_or_default(), waiter) {
                    Some(reply) => reply,
                    None => return Answer::Held,
                },
                Err(e) => Reply::unavailable(&format!("{e:?}")),
            },
            Endpoint::GrpcHealthWatch => return self.watch(copy, s, waiter),
            Endpoint::Report => match self.report(s, now) {
                Ok(report) => Reply::report(&report.to_json()),
                Err(e) => Reply::unavailable(&e),
            },
            Endpoint::GrpcHealth => match record::read(s.store()) {
                // While serving, the app's own health service answers.
                Ok(rec) if rec.phase == Phase::Serving => return Answer::App,
                _ => Reply::grpc_not_serving(),
            },
        })
    }

    /// A gRPC health `Watch`: while serving, the app answers and this copy
    /// keeps the stream to end at closing; once closing, `NOT_SERVING`.
    fn watch<W>(
        &self,
        copy: &impl StateCell<DrainCopy<W>>,
        s: &impl Stream,
        waiter: impl FnOnce() -> (u32, W),
    ) -> Answer {
        match record::read(s.store()) {
            Ok(rec) if rec.phase == Phase::Serving => {
                if copy.with(|c| c.watches.len()) < MAX_WATCHES {
                    let (id, wake) = waiter();
                    copy.with(|c| c.watches.hold(id, wake, u64::MAX));
                }
                Answer::App
            }
            // Unreadable state fails open: the app answers.
            Err(_) => Answer::App,
            Ok(_) => Answer::Now(Reply::grpc_not_serving()),
        }
    }

    /// The request's source if it is in `allowed_sources` (the peer;
    /// `x-forwarded-for` only as [`trusted_peer_ip`] allows); else the 403
    /// to answer. A refused `closing` is logged (it is an attempt to shut
    /// the pod down); other refused reads are not, so a caller cannot fill
    /// the log either.
    fn allowed_source(
        &self,
        s: &impl Stream,
        closing: bool,
    ) -> Result<Option<std::net::IpAddr>, Reply> {
        let source = s.attribute(Attribute::SourceAddress);
        let xff = s.header(Map::RequestHeaders, FORWARDED_FOR);
        let ip = source
            .as_deref()
            .and_then(|a| trusted_peer_ip(a, xff.as_deref()));
        if ip.is_some_and(|ip| self.config.allowed_sources.iter().any(|r| r.contains(ip))) {
            return Ok(ip);
        }
        if closing {
            s.log(
                Level::Warn,
                &format!(
                    "closing refused: source {} not trusted or not in allowed_sources",
                    source.map_or("unknown".into(), |a| String::from_utf8_lossy(&a)
                        .into_owned())
                ),
            );
        }
        Err(Reply::forbidden())
    }

    fn start_closing<W>(
        &self,
        copy: &impl StateCell<DrainCopy<W>>,
        s: &impl Stream,
        now: u64,
        ip: Option<std::net::IpAddr>,
    ) -> Reply {
        match record::start_closing(s.store(), now) {
            Ok((rec, started)) => {
                if started {
                    copy.with(|c| c.close_owed = true);
                    raise_phase(&HostMetrics(s), Phase::Closing);
                    s.log(
                        Level::Info,
                        &format!(
                            "closing started by POST from {}",
                            ip.map_or(String::new(), |ip| ip.to_string())
                        ),
                    );
                }
                let eval = copy.with(|c| c.gate.look(&HostMetrics(s), rec, now));
                Reply::closing(&eval.status(now))
            }
            Err(e) => Reply::unavailable(&format!("{e:?}")),
        }
    }

    /// Holds a long-poll until the gate passes or `wait` runs out; the
    /// reply to send at once when it cannot be held.
    fn hold<W>(
        &self,
        copy: &impl StateCell<DrainCopy<W>>,
        s: &impl Stream,
        now: u64,
        wait: Duration,
        waiter: impl FnOnce() -> (u32, W),
    ) -> Option<Reply> {
        let max = u64::from(self.config.max_waiters);
        match add_bounded(s.store(), keys::WAITERS.name, 1, max) {
            Ok(Some(_)) => {
                let (id, wake) = waiter();
                let deadline = now.saturating_add(micros(wait));
                copy.with(|c| c.waiters.hold(id, wake, deadline));
                None
            }
            Ok(None) => Some(Reply::too_many_waiters()),
            Err(e) => Some(Reply::unavailable(&format!("{e:?}"))),
        }
    }

    /// A woken stream's answer: a kept `Watch` is told `NOT_SERVING`; a
    /// long-poll gets `drained` with the status now.
    pub fn answer_woken<W>(&self, copy: &impl StateCell<DrainCopy<W>>, s: &impl Stream, id: u32) {
        let watch = copy.with(|c| {
            let before = c.ending_watches.len();
            c.ending_watches.retain(|w| *w != id);
            c.ending_watches.len() != before
        });
        if watch {
            send(s, &Reply::grpc_not_serving());
            return;
        }
        let now = s.now_us();
        let reply = match copy.with(|c| self.look(c, s, now)) {
            Ok(eval) => Reply::drained(&eval.status(now)),
            Err(e) => Reply::unavailable(&e),
        };
        send(s, &reply);
    }

    /// A stream with long-poll `id` ended: a poll not answered yet frees its
    /// slot. Takes the copy locked: the native module deletes the
    /// stream's wake handle under the same lock.
    pub fn release<W>(&self, c: &mut DrainCopy<W>, h: &(impl Host + ?Sized), id: u32) {
        if c.waiters.release(id) {
            let _ = add_bounded(h.store(), keys::WAITERS.name, -1, u64::MAX);
        }
        c.watches.release(id);
        c.ending_watches.retain(|w| *w != id);
    }

    /// The tick (see the module table). `wake` is called for each due
    /// long-poll under the copy's lock; the due ones are returned too.
    pub fn tick<W>(
        &self,
        copy: &impl StateCell<DrainCopy<W>>,
        h: &impl Host,
        mut wake: impl FnMut(u32, &W),
    ) -> Vec<(u32, W)> {
        let now = h.now_us();
        let eval = match copy.with(|c| self.advance(c, h, now)) {
            Ok(eval) => eval,
            Err(e) => {
                h.log(
                    Level::Warn,
                    &format!("drain gate not evaluated this tick: {e:?}"),
                );
                return Vec::new();
            }
        };
        if let Some(body) = copy.with(|c| c.callback_owed.take()) {
            self.call_on_drained(copy, h, &body);
        }
        let drained = eval.rec.phase == Phase::Drained;
        let closing = eval.rec.phase != Phase::Serving;
        let (due, ended) = copy.with(|c| {
            let mut due = c.waiters.take_due(drained, now);
            for (id, w) in &due {
                let _ = add_bounded(h.store(), keys::WAITERS.name, -1, u64::MAX);
                wake(*id, w);
            }
            let watches = c.watches.take_due(closing, now);
            for (id, w) in &watches {
                c.ending_watches.push(*id);
                wake(*id, w);
            }
            let ended = watches.len();
            due.extend(watches);
            (due, ended)
        });
        if ended > 0 {
            h.log(
                Level::Info,
                &format!("closing: telling {ended} gRPC health Watch stream(s) NOT_SERVING"),
            );
        }
        if eval.rec.phase == Phase::Serving {
            self.poll_admin(copy, h, now);
        } else {
            self.count_late_peers(copy, h, now);
        }
        self.close_connections(copy, h, now);
        due
    }

    /// POSTs the status JSON to the app's shutdown hook, once: only the copy
    /// whose write passed the gate owes it.
    fn call_on_drained<W>(&self, copy: &impl StateCell<DrainCopy<W>>, h: &impl Host, body: &str) {
        let Some(cb) = &self.config.on_drained else {
            return;
        };
        let headers = [
            (METHOD, "POST"),
            (PATH, cb.path.as_str()),
            (AUTHORITY, cb.cluster.as_str()),
            (CONTENT_TYPE, "application/json"),
        ];
        let call = HttpCall {
            cluster: &cb.cluster,
            headers: &headers,
            body: body.as_bytes(),
            timeout: cb.timeout,
        };
        match h.dispatch(&call) {
            Ok(token) => copy.with(|c| c.callback_call = Some(token)),
            Err(reason) => {
                h.metric_add(Metric::DrainCallbackFailed, 1);
                h.log(
                    Level::Warn,
                    &format!(
                        "on_drained callback to cluster {:?} not sent: {reason}",
                        cb.cluster
                    ),
                );
            }
        }
    }

    /// Asks Envoy's admin to tell the clients' connections to leave, if
    /// this copy owes it (it started closing) and no call is in flight.
    fn close_connections<W>(&self, copy: &impl StateCell<DrainCopy<W>>, h: &impl Host, now: u64) {
        let (Some(cluster), Some(path)) = (
            &self.config.admin_cluster,
            self.config.close_connections.admin_path(),
        ) else {
            return;
        };
        let due =
            copy.with(|c| c.close_owed && c.close_call.is_none() && now >= c.close_not_before);
        if !due {
            return;
        }
        match admin_call(h, cluster, "POST", path, CLOSE_CALL_TIMEOUT) {
            Ok(token) => copy.with(|c| c.close_call = Some(token)),
            Err(reason) => {
                // No such cluster: it will not appear while closing.
                copy.with(|c| c.close_owed = false);
                h.log(
                    Level::Warn,
                    &format!("connections not told to close: POST {path} to cluster {cluster:?} not sent ({reason})"),
                );
            }
        }
    }

    fn poll_admin<W>(&self, copy: &impl StateCell<DrainCopy<W>>, h: &impl Host, now: u64) {
        let Some(cluster) = &self.config.admin_cluster else {
            return;
        };
        if copy.with(|c| c.admin_call.is_some()) {
            return;
        }
        let interval = micros(ADMIN_POLL_INTERVAL);
        if !take_lease(h.store(), keys::ADMIN_LEASE.name, now, interval).unwrap_or(false) {
            return;
        }
        match admin_call(h, cluster, "GET", "/ready", ADMIN_POLL_TIMEOUT) {
            Ok(token) => copy.with(|c| c.admin_call = Some(token)),
            Err(reason) => {
                if !copy.with(|c| std::mem::replace(&mut c.admin_warned, true)) {
                    h.log(
                        Level::Warn,
                        &format!("admin poll to cluster {cluster:?} not sent ({reason}): is the cluster defined?"),
                    );
                }
            }
        }
    }

    /// The answer to one of the drain's calls (a failed or timed-out call
    /// has no `:status`).
    pub fn call_answered<W>(
        &self,
        copy: &impl StateCell<DrainCopy<W>>,
        h: &impl Host,
        token: u32,
        answer: &impl CallResponse,
    ) {
        let status = answer.header(STATUS);
        let (admin, callback, close) = copy.with(|c| {
            let admin = c.admin_call == Some(token);
            let callback = c.callback_call == Some(token);
            let close = c.close_call == Some(token);
            if admin {
                c.admin_call = None;
            }
            if callback {
                c.callback_call = None;
            }
            if close {
                c.close_call = None;
            }
            (admin, callback, close)
        });
        if close {
            self.close_answered(copy, h, status.as_deref());
            return;
        }
        if admin {
            // /ready is 503 during Envoy's own start-up too (PRE_INITIALIZING,
            // INITIALIZING): only DRAINING, i.e. /healthcheck/fail, closes.
            if status.as_deref() == Some(b"503")
                && answer.body(MAX_ANSWER_BODY).starts_with(b"DRAINING")
            {
                match record::start_closing(h.store(), h.now_us()) {
                    Ok((_, true)) => {
                        // Envoy fails its health check already; a drain of
                        // the listeners is still this copy's to start.
                        if self.config.close_connections == CloseConnections::DrainListeners {
                            copy.with(|c| c.close_owed = true);
                        }
                        raise_phase(&HostMetrics(h), Phase::Closing);
                        h.log(
                            Level::Info,
                            "closing started: Envoy admin /ready says DRAINING (/healthcheck/fail)",
                        );
                    }
                    Ok((_, false)) => {}
                    Err(e) => h.log(Level::Error, &format!("cannot start closing: {e:?}")),
                }
            }
        } else if callback {
            let ok = status.as_deref().is_some_and(|s| s.first() == Some(&b'2'));
            if !ok {
                h.metric_add(Metric::DrainCallbackFailed, 1);
                h.log(
                    Level::Warn,
                    &format!(
                        "on_drained callback failed: status {}",
                        status.map_or("none (no answer)".into(), |s| String::from_utf8_lossy(&s)
                            .into_owned())
                    ),
                );
            }
        }
    }
}

impl Drain {
    /// The admin's answer to the `close_connections` call: a 2xx settles it;
    /// anything else is tried again [`CLOSE_RETRY`] later, logged once.
    fn close_answered<W>(
        &self,
        copy: &impl StateCell<DrainCopy<W>>,
        h: &impl Host,
        status: Option<&[u8]>,
    ) {
        let path = self
            .config
            .close_connections
            .admin_path()
            .unwrap_or_default();
        let ok = status.is_some_and(|s| s.first() == Some(&b'2'));
        let status = status.map_or("none (no answer)".into(), |s| {
            String::from_utf8_lossy(s).into_owned()
        });
        let now = h.now_us();
        let first_failure = copy.with(|c| {
            if ok {
                c.close_owed = false;
                false
            } else {
                c.close_not_before = now.saturating_add(micros(CLOSE_RETRY));
                !std::mem::replace(&mut c.close_warned, true)
            }
        });
        if ok {
            h.log(
                Level::Info,
                &format!("connections told to close: admin POST {path}: {status}"),
            );
        } else if first_failure {
            h.log(
                Level::Warn,
                &format!("connections not told to close yet: admin POST {path}: status {status}; trying again every {CLOSE_RETRY:?}"),
            );
        }
    }
}

/// Sends a request without a body to Envoy's admin through `cluster`: its
/// call token, or why it was not sent.
fn admin_call(
    h: &impl Host,
    cluster: &str,
    method: &str,
    path: &str,
    timeout: Duration,
) -> Result<u32, String> {
    let headers = [(METHOD, method), (PATH, path), (AUTHORITY, ADMIN_AUTHORITY)];
    h.dispatch(&HttpCall {
        cluster,
        headers: &headers,
        body: &[],
        timeout,
    })
}

/// Sends one of the filter's answers, stamped with the instance id the
/// provider published and the address this request reached: a consumer's
/// probe tells a restarted instance from the closing one by both.
fn send(s: &impl Stream, reply: &Reply) {
    let stamp = Stamp::read(s.store(), s.attribute_text(Attribute::DestinationAddress));
    s.send_reply(&LocalReply {
        status: reply.status,
        headers: &stamp.headers(reply),
        body: reply.body.as_bytes(),
        grpc_status: reply.grpc_status,
        details: "graceful_drain",
    });
}

#[cfg(test)]
#[path = "filter_tests.rs"]
mod tests;
