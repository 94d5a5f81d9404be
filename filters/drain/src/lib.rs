//! `graceful_drain`: the control surface. Starts closing (`POST` from an
//! allowed source, or Envoy's own `/healthcheck/fail` seen through the admin
//! cluster), answers readiness, status and gRPC health, and evaluates the
//! drain gate on every tick of every VM copy. A pass puts up the gate stat
//! the provider reads on every request ([`graceful_core::gate`]: safe
//! without CAS), then is written to the shared instance record with CAS, so
//! exactly one copy reports it and counts it, however many tick at once.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use graceful_core::config::DrainConfig;
use graceful_core::drain::{raise_phase, DrainCopy, Evaluation, Passed};
use graceful_core::endpoints::{is_endpoint_path, route, Endpoint, Reply, Route, Stamp, Waiters};
use graceful_core::gate::Stat;
use graceful_core::headers::{
    ADMIN_AUTHORITY, AUTHORITY, CONTENT_TYPE, FORWARDED_FOR, METHOD, PATH, STATUS,
};
use graceful_core::keys::{self, Owner};
use graceful_core::net::trusted_peer_ip;
use graceful_core::record::{self, InstanceRecord, Phase};
use graceful_core::store::{self, add_bounded, take_lease, UpdateError};
use graceful_guest::{header, now_us, property, send_reply, GuestStats, HostStore, Metric};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, MapType};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> {
        Box::new(DrainRoot { shared: None, admin_call: None, callback_call: None, admin_warned: false })
    });
}}

/// How often every VM copy evaluates the gate and answers due long-polls:
/// the gate passes at most this late.
const TICK: Duration = Duration::from_millis(50);
/// How often one copy of the process asks the admin for `/ready`.
const ADMIN_POLL_INTERVAL: Duration = Duration::from_secs(1);
const ADMIN_POLL_TIMEOUT: Duration = Duration::from_secs(1);

struct Shared {
    config: DrainConfig,
    phase: Metric,
    /// The in-flight and started stats of both filters, and the gate.
    stats: GuestStats,
    /// This copy's last start seen and its 1 in the gate.
    copy: RefCell<DrainCopy>,
    forced: Metric,
    callback_failed: Metric,
    /// Long-polls held by this VM copy.
    waiters: RefCell<Waiters>,
}

impl Shared {
    /// Evaluates the gate now and reports a pass if this copy made it.
    fn advance(&self, now: u64) -> Result<(Evaluation, Option<Passed>), UpdateError> {
        let (eval, passed) = self.copy.borrow_mut().advance(
            &HostStore,
            &self.stats,
            &self.phase,
            &self.config,
            now,
        )?;
        if let Some(p) = &passed {
            if p.forced() {
                self.forced.add(1);
                log::warn!("{}", p.line());
            } else {
                log::info!("{}", p.line());
            }
        }
        Ok((eval, passed))
    }

    fn look(&self, rec: InstanceRecord, now: u64) -> Evaluation {
        self.copy.borrow_mut().look(&self.stats, rec, now)
    }
}

/// Sends one of the filter's answers, stamped with the instance id the
/// provider published and the address this request reached: a consumer's
/// probe uses both to tell a restarted instance from the closing one.
fn send(reply: &Reply) -> bool {
    let address = property(&["destination", "address"]).and_then(|a| String::from_utf8(a).ok());
    let stamp = Stamp::read(&HostStore, address);
    send_reply(
        reply.status,
        &stamp.headers(reply),
        reply.body.as_bytes(),
        reply.grpc_status,
    )
}

struct DrainRoot {
    shared: Option<Rc<Shared>>,
    /// Token of the admin `/ready` call in flight, if any.
    admin_call: Option<u32>,
    /// Token of the `on_drained` call in flight, if any.
    callback_call: Option<u32>,
    /// A failed admin poll was logged already.
    admin_warned: bool,
}

impl Context for DrainRoot {
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
        // A failed or timed-out call arrives with no headers: no :status.
        let status = header(MapType::HttpCallResponseHeaders, STATUS);
        if self.admin_call == Some(token) {
            self.admin_call = None;
            let body = hostcalls::get_buffer(
                proxy_wasm::types::BufferType::HttpCallResponseBody,
                0,
                body_size.min(64),
            )
            .ok()
            .flatten()
            .unwrap_or_default();
            // /ready is 503 during Envoy's own start-up too (PRE_INITIALIZING,
            // INITIALIZING): only DRAINING, i.e. /healthcheck/fail, closes.
            if status.as_deref() == Some(b"503") && body.starts_with(b"DRAINING") {
                match record::start_closing(&HostStore, now_us()) {
                    Ok((_, true)) => {
                        raise_phase(&shared.phase, Phase::Closing);
                        log::info!(
                            "closing started: Envoy admin /ready says DRAINING (/healthcheck/fail)"
                        );
                    }
                    Ok((_, false)) => {}
                    Err(e) => log::error!("cannot start closing: {e:?}"),
                }
            }
        } else if self.callback_call == Some(token) {
            self.callback_call = None;
            let ok = status.as_deref().is_some_and(|s| s.first() == Some(&b'2'));
            if !ok {
                shared.callback_failed.add(1);
                log::warn!(
                    "on_drained callback failed: status {}",
                    status.map_or("none (no answer)".into(), |s| String::from_utf8_lossy(&s)
                        .into_owned())
                );
            }
        }
    }
}

impl DrainRoot {
    /// POSTs the status JSON to the app's shutdown hook, once: only the copy
    /// whose write passed the gate calls this.
    fn call_on_drained(&mut self, shared: &Shared, body: &str) {
        let Some(cb) = &shared.config.on_drained else {
            return;
        };
        let headers = vec![
            (METHOD, "POST"),
            (PATH, cb.path.as_str()),
            (AUTHORITY, cb.cluster.as_str()),
            (CONTENT_TYPE, "application/json"),
        ];
        match self.dispatch_http_call(
            &cb.cluster,
            headers,
            Some(body.as_bytes()),
            vec![],
            cb.timeout,
        ) {
            Ok(token) => self.callback_call = Some(token),
            Err(status) => {
                shared.callback_failed.add(1);
                log::warn!(
                    "on_drained callback to cluster {:?} not sent: {status:?}",
                    cb.cluster
                );
            }
        }
    }

    fn poll_admin(&mut self, shared: &Shared, now: u64) {
        let Some(cluster) = &shared.config.admin_cluster else {
            return;
        };
        if self.admin_call.is_some() {
            return;
        }
        let interval = u64::try_from(ADMIN_POLL_INTERVAL.as_micros()).unwrap_or(u64::MAX);
        if !take_lease(&HostStore, keys::ADMIN_LEASE.name, now, interval).unwrap_or(false) {
            return;
        }
        let headers = vec![
            (METHOD, "GET"),
            (PATH, "/ready"),
            (AUTHORITY, ADMIN_AUTHORITY),
        ];
        match self.dispatch_http_call(cluster, headers, None, vec![], ADMIN_POLL_TIMEOUT) {
            Ok(token) => self.admin_call = Some(token),
            Err(status) => {
                // Once per VM copy: a missing cluster would otherwise log
                // every second for the life of the process.
                if !std::mem::replace(&mut self.admin_warned, true) {
                    log::warn!("admin poll to cluster {cluster:?} not sent ({status:?}): is the cluster defined?");
                }
            }
        }
    }
}

impl RootContext for DrainRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let config = match DrainConfig::from_json(&graceful_guest::plugin_configuration()) {
            Ok(c) => c,
            Err(e) => {
                log::error!("graceful_drain: {e}");
                return false;
            }
        };
        // Every key a stream or tick updates exists before any stream runs:
        // Envoy ignores CAS on a missing key, so two workers creating one at
        // once would both succeed and one change be lost (a waiter slot not
        // counted, the admin lease taken twice).
        if let Err((key, e)) = store::ensure_all(&HostStore, &keys::initial_values(Owner::Drain)) {
            log::error!("graceful_drain: cannot initialise shared data {key:?}: {e:?}");
            return false;
        }
        self.shared = Some(Rc::new(Shared {
            config,
            phase: Metric::gauge("graceful_drain_phase"),
            stats: GuestStats::define(&[
                Stat::Inflight,
                Stat::Started,
                Stat::Gate,
                Stat::OutboundInflight,
                Stat::OutboundStarted,
            ]),
            copy: RefCell::new(DrainCopy::default()),
            forced: Metric::counter("graceful_drain_forced"),
            callback_failed: Metric::counter("graceful_drain_callback_failed"),
            waiters: RefCell::new(Waiters::default()),
        }));
        graceful_guest::set_tick_period(TICK);
        true
    }

    fn on_tick(&mut self) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        let now = now_us();
        let eval = match shared.advance(now) {
            Ok((eval, passed)) => {
                if passed.is_some() {
                    let body = eval.status(now).to_json();
                    self.call_on_drained(&shared, &body);
                }
                eval
            }
            Err(e) => {
                log::warn!("drain gate not evaluated this tick: {e:?}");
                return;
            }
        };
        let due = shared
            .waiters
            .borrow_mut()
            .take_due(eval.rec.phase == Phase::Drained, now);
        if !due.is_empty() {
            let reply = Reply::drained(&eval.status(now));
            for context_id in due {
                let _ = add_bounded(&HostStore, keys::WAITERS.name, -1, u64::MAX);
                // The stream may have gone meanwhile: then the host refuses
                // the context and there is nobody to answer.
                if hostcalls::set_effective_context(context_id).is_ok() {
                    send(&reply);
                }
            }
        }
        if eval.rec.phase == Phase::Serving {
            self.poll_admin(&shared, now);
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(DrainStream {
            shared: self.shared.clone(),
            context_id,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct DrainStream {
    shared: Option<Rc<Shared>>,
    context_id: u32,
}

impl DrainStream {
    fn answer(&self, shared: &Shared, endpoint: Endpoint) -> Action {
        let now = now_us();
        let reply = match endpoint {
            Endpoint::Closing => self.start_closing(shared, now),
            Endpoint::Ready => match record::read(&HostStore) {
                Ok(rec) => Reply::ready(rec.phase),
                Err(e) => Reply::unavailable(&format!("{e:?}")),
            },
            Endpoint::Status => match shared.advance(now) {
                Ok((eval, _)) => Reply::status(&eval.status(now)),
                Err(e) => Reply::unavailable(&format!("{e:?}")),
            },
            Endpoint::Drained { wait } => match shared.advance(now) {
                Ok((eval, _)) if eval.rec.phase == Phase::Drained || wait.is_none() => {
                    Reply::drained(&eval.status(now))
                }
                Ok(_) => match self.hold(shared, now, wait.unwrap_or_default()) {
                    Some(reply) => reply,
                    None => return Action::Pause,
                },
                Err(e) => Reply::unavailable(&format!("{e:?}")),
            },
            Endpoint::GrpcHealth => match record::read(&HostStore) {
                // While serving, the app's own health service answers.
                Ok(rec) if rec.phase == Phase::Serving => return Action::Continue,
                _ => Reply::grpc_not_serving(),
            },
        };
        send(&reply);
        Action::Pause
    }

    fn start_closing(&self, shared: &Shared, now: u64) -> Reply {
        let source = property(&["source", "address"]);
        let xff = header(MapType::HttpRequestHeaders, FORWARDED_FOR);
        let ip = source
            .as_deref()
            .and_then(|s| trusted_peer_ip(s, xff.as_deref()));
        let allowed =
            ip.is_some_and(|ip| shared.config.allowed_sources.iter().any(|c| c.contains(ip)));
        if !allowed {
            log::warn!(
                "closing refused: source {} not trusted or not in allowed_sources",
                source.map_or("unknown".into(), |s| String::from_utf8_lossy(&s)
                    .into_owned())
            );
            return Reply::forbidden();
        }
        match record::start_closing(&HostStore, now) {
            Ok((rec, started)) => {
                if started {
                    raise_phase(&shared.phase, Phase::Closing);
                    log::info!(
                        "closing started by POST from {}",
                        ip.map_or(String::new(), |ip| ip.to_string())
                    );
                }
                Reply::closing(&shared.look(rec, now).status(now))
            }
            Err(e) => Reply::unavailable(&format!("{e:?}")),
        }
    }

    /// Holds a long-poll until the gate passes or `wait` runs out; returns
    /// the reply to send at once when it cannot be held.
    fn hold(&self, shared: &Shared, now: u64, wait: Duration) -> Option<Reply> {
        match add_bounded(
            &HostStore,
            keys::WAITERS.name,
            1,
            u64::from(shared.config.max_waiters),
        ) {
            Ok(Some(_)) => {
                let deadline =
                    now.saturating_add(u64::try_from(wait.as_micros()).unwrap_or(u64::MAX));
                shared.waiters.borrow_mut().hold(self.context_id, deadline);
                None
            }
            Ok(None) => Some(Reply::too_many_waiters()),
            Err(e) => Some(Reply::unavailable(&format!("{e:?}"))),
        }
    }
}

impl Context for DrainStream {}

impl HttpContext for DrainStream {
    fn on_http_request_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.clone() else {
            return Action::Continue;
        };
        // Most requests are the app's: one hostcall tells.
        let Some(path) = header(MapType::HttpRequestHeaders, PATH) else {
            return Action::Continue;
        };
        if !is_endpoint_path(&shared.config.paths, &path) {
            return Action::Continue;
        }
        let Some(method) = header(MapType::HttpRequestHeaders, METHOD) else {
            return Action::Continue;
        };
        let reply = match route(&shared.config.paths, &method, &path) {
            Route::Pass => return Action::Continue,
            Route::Endpoint(endpoint) => return self.answer(&shared, endpoint),
            Route::MethodNotAllowed(allow) => Reply::method_not_allowed(allow),
            Route::BadRequest(reason) => Reply::bad_request(&reason),
        };
        send(&reply);
        Action::Pause
    }

    fn on_log(&mut self) {
        // A long-poll whose client went away before the gate passed: free
        // its slot. Answered ones were already released by the tick.
        let Some(shared) = &self.shared else { return };
        if shared.waiters.borrow_mut().release(self.context_id) {
            let _ = add_bounded(&HostStore, keys::WAITERS.name, -1, u64::MAX);
        }
    }
}
