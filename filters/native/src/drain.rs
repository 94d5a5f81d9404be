//! graceful_drain natively: the same endpoints and gate as the wasm filter
//! (`filters/drain`), with the module's threads in place of VM ticks.
//!
//! | event | thread | does |
//! |---|---|---|
//! | `config_new` | main | parses the config, starts the timer thread |
//! | every 50 ms | timer thread | commits a tick to the main thread (config scheduler) |
//! | tick | main | evaluates the gate (`graceful_core::drain`), mirrors phase and gate to their gauges, wakes due long-polls, polls the admin's `/ready` once a second while serving |
//! | endpoint request | worker | answers at once, or holds a `drained?wait=` long-poll with a scheduler of its own stream |
//! | woken long-poll | worker | answers `drained` with the status now |
//! | stream destroyed | worker | frees its long-poll slot and its scheduler |
//! | `config_destroy` | main | stops and joins the timer thread |
//!
//! A held long-poll's scheduler is committed and deleted under one lock,
//! so a tick never commits a scheduler its stream has deleted.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use graceful_core::config::DrainConfig;
use graceful_core::drain::{raise_phase, DrainCopy, Evaluation};
use graceful_core::endpoints::{is_endpoint_path, route, Endpoint, Reply, Route, Stamp, Waiters};
use graceful_core::gate::{Stat, Stats};
use graceful_core::headers::{
    ADMIN_AUTHORITY, AUTHORITY, CONTENT_TYPE, FORWARDED_FOR, METHOD, PATH, STATUS,
};
use graceful_core::keys::{self, Owner};
use graceful_core::net::trusted_peer_ip;
use graceful_core::record::{self, Phase};
use graceful_core::store::{self, add_bounded, take_lease};

use crate::abi::{
    self, ConfigScheduler, SchedulerPtr, Stream, CONTINUE, REQUEST_HEADERS, STOP_ITERATION,
};
use crate::{lock, log, now_us, COUNTS, PHASE, STORE};

/// How often the gate is evaluated and due long-polls answered.
const TICK: Duration = Duration::from_millis(50);
const ADMIN_POLL_INTERVAL_US: u64 = 1_000_000;
const ADMIN_POLL_TIMEOUT_MS: u64 = 1000;
/// The config scheduler's only event.
const EVENT_TICK: u64 = 1;
/// A held long-poll's stream scheduler's only event.
const EVENT_ANSWER: u64 = 1;

struct Metrics {
    phase: Option<usize>,
    gate: Option<usize>,
    forced: Option<usize>,
    callback_failed: Option<usize>,
}

/// The held long-polls: the core's deadlines, and each stream's scheduler
/// (as an address: it is only passed back to Envoy).
#[derive(Default)]
struct Held {
    waiters: Waiters,
    schedulers: HashMap<u32, usize>,
}

#[derive(Default)]
struct Calls {
    admin: Option<u64>,
    callback: Option<u64>,
    admin_warned: bool,
}

pub struct Config {
    envoy: abi::Config,
    config: DrainConfig,
    metrics: Metrics,
    copy: Mutex<DrainCopy>,
    held: Mutex<Held>,
    calls: Mutex<Calls>,
    stop: Arc<AtomicBool>,
    timer: Mutex<Option<JoinHandle<()>>>,
    _scheduler: Arc<ConfigScheduler>,
}

static NEXT_WAITER: AtomicU32 = AtomicU32::new(1);

impl Config {
    pub fn new(envoy: abi::Config, json: &[u8]) -> Result<Config, String> {
        let config = DrainConfig::from_json(json).map_err(|e| e.to_string())?;
        store::ensure_all(&STORE, &keys::initial_values(Owner::Drain))
            .map_err(|(key, e)| format!("cannot initialise shared data {key:?}: {e:?}"))?;
        let metrics = Metrics {
            phase: envoy.define_gauge("graceful_drain_phase"),
            gate: envoy.define_gauge(Stat::Gate.name()),
            forced: envoy.define_counter("graceful_drain_forced"),
            callback_failed: envoy.define_counter("graceful_drain_callback_failed"),
        };
        let scheduler = Arc::new(envoy.scheduler());
        let stop = Arc::new(AtomicBool::new(false));
        let timer = {
            let (scheduler, stop) = (scheduler.clone(), stop.clone());
            std::thread::Builder::new()
                .name("graceful-drain".into())
                .spawn(move || {
                    while !stop.load(SeqCst) {
                        std::thread::sleep(TICK);
                        scheduler.commit(EVENT_TICK);
                    }
                })
                .map_err(|e| format!("cannot start the drain timer: {e}"))?
        };
        Ok(Config {
            envoy,
            config,
            metrics,
            copy: Mutex::new(DrainCopy::default()),
            held: Mutex::new(Held::default()),
            calls: Mutex::new(Calls::default()),
            stop,
            timer: Mutex::new(Some(timer)),
            _scheduler: scheduler,
        })
    }

    /// The main thread's tick (see the module table).
    pub fn tick(&self) {
        let now = now_us();
        let result = lock(&self.copy).advance(&STORE, &COUNTS, &PHASE, &self.config, now);
        self.envoy.gauge_set(self.metrics.phase, PHASE.value());
        self.envoy
            .gauge_set(self.metrics.gate, COUNTS.get(Stat::Gate).unwrap_or(0));
        let eval = match result {
            Ok((eval, passed)) => {
                if let Some(p) = passed {
                    if p.forced() {
                        self.envoy.counter_add(self.metrics.forced, 1);
                        log::warn(&p.line());
                    } else {
                        log::info(&p.line());
                    }
                    self.call_on_drained(&eval.status(now).to_json());
                }
                eval
            }
            Err(e) => {
                log::warn(&format!("drain gate not evaluated this tick: {e:?}"));
                return;
            }
        };
        {
            let mut held = lock(&self.held);
            let due = held.waiters.take_due(eval.rec.phase == Phase::Drained, now);
            for id in due {
                let _ = add_bounded(&STORE, keys::WAITERS.name, -1, u64::MAX);
                if let Some(&s) = held.schedulers.get(&id) {
                    // SAFETY: the stream deletes its scheduler only under
                    // this lock, after removing it from the map.
                    #[allow(unsafe_code)]
                    unsafe {
                        abi::scheduler_commit(s as SchedulerPtr, EVENT_ANSWER)
                    };
                }
            }
        }
        if eval.rec.phase == Phase::Serving {
            self.poll_admin(now);
        }
    }

    fn call_on_drained(&self, body: &str) {
        let Some(cb) = &self.config.on_drained else {
            return;
        };
        let headers = [
            (METHOD, "POST"),
            (PATH, cb.path.as_str()),
            (AUTHORITY, cb.cluster.as_str()),
            (CONTENT_TYPE, "application/json"),
        ];
        let timeout = u64::try_from(cb.timeout.as_millis()).unwrap_or(u64::MAX);
        match self
            .envoy
            .callout(&cb.cluster, &headers, body.as_bytes(), timeout)
        {
            Ok(id) => lock(&self.calls).callback = Some(id),
            Err(r) => {
                self.envoy.counter_add(self.metrics.callback_failed, 1);
                log::warn(&format!(
                    "on_drained callback to cluster {:?} not sent (init result {r})",
                    cb.cluster
                ));
            }
        }
    }

    fn poll_admin(&self, now: u64) {
        let Some(cluster) = &self.config.admin_cluster else {
            return;
        };
        let mut calls = lock(&self.calls);
        if calls.admin.is_some() {
            return;
        }
        if !take_lease(&STORE, keys::ADMIN_LEASE.name, now, ADMIN_POLL_INTERVAL_US).unwrap_or(false)
        {
            return;
        }
        let headers = [
            (METHOD, "GET"),
            (PATH, "/ready"),
            (AUTHORITY, ADMIN_AUTHORITY),
        ];
        match self
            .envoy
            .callout(cluster, &headers, &[], ADMIN_POLL_TIMEOUT_MS)
        {
            Ok(id) => calls.admin = Some(id),
            Err(r) => {
                if !std::mem::replace(&mut calls.admin_warned, true) {
                    log::warn(&format!(
                        "admin poll to cluster {cluster:?} not sent (init result {r}): is the cluster defined?"
                    ));
                }
            }
        }
    }

    /// An answer to one of the config's callouts (main thread).
    pub fn callout_done(&self, id: u64, headers: &[(Vec<u8>, Vec<u8>)], body: &[u8]) {
        let status = headers
            .iter()
            .find(|(k, _)| k.as_slice() == STATUS.as_bytes())
            .map(|(_, v)| v.clone());
        let mut calls = lock(&self.calls);
        if calls.admin == Some(id) {
            calls.admin = None;
            drop(calls);
            // /ready is 503 during Envoy's start-up too: only DRAINING,
            // i.e. /healthcheck/fail, closes.
            if status.as_deref() == Some(b"503") && body.starts_with(b"DRAINING") {
                match record::start_closing(&STORE, now_us()) {
                    Ok((_, true)) => {
                        raise_phase(&PHASE, Phase::Closing);
                        log::info(
                            "closing started: Envoy admin /ready says DRAINING (/healthcheck/fail)",
                        );
                    }
                    Ok((_, false)) => {}
                    Err(e) => log::error(&format!("cannot start closing: {e:?}")),
                }
            }
        } else if calls.callback == Some(id) {
            calls.callback = None;
            let ok = status.as_deref().is_some_and(|s| s.first() == Some(&b'2'));
            if !ok {
                self.envoy.counter_add(self.metrics.callback_failed, 1);
                log::warn(&format!(
                    "on_drained callback failed: status {}",
                    status.map_or("none (no answer)".into(), |s| String::from_utf8_lossy(&s)
                        .into_owned())
                ));
            }
        }
    }

    fn look(&self, now: u64) -> Result<Evaluation, String> {
        let rec = record::read(&STORE).map_err(|e| format!("{e:?}"))?;
        Ok(lock(&self.copy).look(&COUNTS, rec, now))
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

/// Sends one of the filter's answers, stamped with the instance id the
/// provider published and the address this request reached (a consumer's
/// probe tells a restarted instance from the closing one by both).
fn send(s: Stream, reply: &Reply) {
    let address = s
        .attribute_string(abi::ATTR_DESTINATION_ADDRESS)
        .and_then(|a| String::from_utf8(a).ok());
    let stamp = Stamp::read(&STORE, address);
    let mut headers = stamp.headers(reply);
    // The native local reply derives no grpc-status from the HTTP status
    // (it sends 0): a gRPC answer carries its own.
    let grpc_status = reply.grpc_status.map(|c| c.to_string());
    if let Some(code) = &grpc_status {
        headers.push(("grpc-status", code));
        headers.push(("grpc-message", reply.body.as_str()));
    }
    s.send_response(
        reply.status,
        &headers,
        reply.body.as_bytes(),
        "graceful_drain",
    );
}

/// What an endpoint request gets.
enum Answer {
    Now(Reply),
    /// A long-poll held until the tick wakes it.
    Held,
    /// Not the filter's to answer: the request goes on to the app.
    App,
}

/// One stream's state, in a cell (see `ProviderStream`).
#[derive(Default)]
pub struct DrainStream {
    /// A held long-poll: its id in the config's `held`.
    waiting: Cell<Option<u32>>,
}

impl DrainStream {
    pub fn request_headers(&self, c: &Config, s: Stream) -> u32 {
        // Most requests are the app's: one header read tells.
        let Some(path) = s.header(REQUEST_HEADERS, PATH) else {
            return CONTINUE;
        };
        if !is_endpoint_path(&c.config.paths, &path) {
            return CONTINUE;
        }
        let Some(method) = s.header(REQUEST_HEADERS, METHOD) else {
            return CONTINUE;
        };
        let reply = match route(&c.config.paths, &method, &path) {
            Route::Pass => return CONTINUE,
            Route::Endpoint(endpoint) => match self.answer(c, s, endpoint) {
                Answer::Now(reply) => reply,
                Answer::Held => return STOP_ITERATION,
                Answer::App => return CONTINUE,
            },
            Route::MethodNotAllowed(allow) => Reply::method_not_allowed(allow),
            Route::BadRequest(reason) => Reply::bad_request(&reason),
        };
        send(s, &reply);
        STOP_ITERATION
    }

    fn answer(&self, c: &Config, s: Stream, endpoint: Endpoint) -> Answer {
        let now = now_us();
        Answer::Now(match endpoint {
            Endpoint::Closing => self.start_closing(c, s, now),
            Endpoint::Ready => match record::read(&STORE) {
                Ok(rec) => Reply::ready(rec.phase),
                Err(e) => Reply::unavailable(&format!("{e:?}")),
            },
            Endpoint::Status => match c.look(now) {
                Ok(eval) => Reply::status(&eval.status(now)),
                Err(e) => Reply::unavailable(&e),
            },
            Endpoint::Drained { wait } => match c.look(now) {
                Ok(eval) if eval.rec.phase == Phase::Drained || wait.is_none() => {
                    Reply::drained(&eval.status(now))
                }
                Ok(_) => match self.hold(c, s, now, wait.unwrap_or_default()) {
                    Some(reply) => reply,
                    None => return Answer::Held,
                },
                Err(e) => Reply::unavailable(&e),
            },
            Endpoint::GrpcHealth => match record::read(&STORE) {
                // While serving, the app's own health service answers.
                Ok(rec) if rec.phase == Phase::Serving => return Answer::App,
                _ => Reply::grpc_not_serving(),
            },
        })
    }

    fn start_closing(&self, c: &Config, s: Stream, now: u64) -> Reply {
        let source = s.attribute_string(abi::ATTR_SOURCE_ADDRESS);
        let xff = s.header(REQUEST_HEADERS, FORWARDED_FOR);
        let ip = source
            .as_deref()
            .and_then(|a| trusted_peer_ip(a, xff.as_deref()));
        let allowed = ip.is_some_and(|ip| c.config.allowed_sources.iter().any(|r| r.contains(ip)));
        if !allowed {
            log::warn(&format!(
                "closing refused: source {} not trusted or not in allowed_sources",
                source.map_or("unknown".into(), |a| String::from_utf8_lossy(&a)
                    .into_owned())
            ));
            return Reply::forbidden();
        }
        match record::start_closing(&STORE, now) {
            Ok((rec, started)) => {
                if started {
                    raise_phase(&PHASE, Phase::Closing);
                    log::info(&format!(
                        "closing started by POST from {}",
                        ip.map_or(String::new(), |ip| ip.to_string())
                    ));
                }
                Reply::closing(&lock(&c.copy).look(&COUNTS, rec, now).status(now))
            }
            Err(e) => Reply::unavailable(&format!("{e:?}")),
        }
    }

    /// Holds a long-poll until the gate passes or `wait` runs out; the
    /// reply to send at once when it cannot be held.
    fn hold(&self, c: &Config, s: Stream, now: u64, wait: Duration) -> Option<Reply> {
        match add_bounded(
            &STORE,
            keys::WAITERS.name,
            1,
            u64::from(c.config.max_waiters),
        ) {
            Ok(Some(_)) => {
                let id = NEXT_WAITER.fetch_add(1, SeqCst);
                let deadline =
                    now.saturating_add(u64::try_from(wait.as_micros()).unwrap_or(u64::MAX));
                let scheduler = s.scheduler();
                let mut held = lock(&c.held);
                held.waiters.hold(id, deadline);
                held.schedulers.insert(id, scheduler as usize);
                self.waiting.set(Some(id));
                None
            }
            Ok(None) => Some(Reply::too_many_waiters()),
            Err(e) => Some(Reply::unavailable(&format!("{e:?}"))),
        }
    }

    /// The tick woke this stream's long-poll: answer with the status now.
    pub fn scheduled(&self, c: &Config, s: Stream) {
        if self.waiting.get().is_none() {
            return;
        }
        let now = now_us();
        let reply = match c.look(now) {
            Ok(eval) => Reply::drained(&eval.status(now)),
            Err(e) => Reply::unavailable(&e),
        };
        send(s, &reply);
    }

    /// The stream is gone: a long-poll not answered yet frees its slot; its
    /// scheduler is deleted either way.
    pub fn destroy(&self, c: &Config) {
        let Some(id) = self.waiting.take() else {
            return;
        };
        let mut held = lock(&c.held);
        if held.waiters.release(id) {
            let _ = add_bounded(&STORE, keys::WAITERS.name, -1, u64::MAX);
        }
        if let Some(s) = held.schedulers.remove(&id) {
            // SAFETY: removed from the map under the lock the tick commits
            // under, so nobody uses it after this.
            #[allow(unsafe_code)]
            unsafe {
                abi::scheduler_delete(s as SchedulerPtr)
            };
        }
    }
}
