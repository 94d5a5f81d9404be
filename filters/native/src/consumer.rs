//! graceful_consumer natively: the callbacks of
//! [`graceful_core::filter::consumer`] over the module's host, with the
//! module's statics in place of VM copies.
//!
//! | wasm build | native build |
//! |---|---|
//! | one copy per VM (a worker's, the main thread's) | one per worker (by `worker_index`) and one for the main thread, each behind its own (uncontended) lock |
//! | change signal: the `graceful_consumer_generation` counter | the module's atomic of that metric (the counter is its mirror) |
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

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::sync::Mutex;

use graceful_core::filter::consumer::{ConsumerCopy, ConsumerFilter, ConsumerStream as Core};
use graceful_core::filter::host::{Attribute, Map, Stream as _};
use graceful_core::keys::Owner;

use crate::abi::{self, Stream};
use crate::hooks::code;
use crate::host::{CalloutAnswer, Ids, Native};
use crate::timer::Timer;

/// The request header both instances key a request by.
const REQUEST_ID: &str = "x-request-id";

thread_local! {
    /// The request ids of this worker's listener-instance streams that are
    /// under way (see the module doc). Bounded by the streams in flight.
    static LIVE: RefCell<HashSet<Vec<u8>>> = RefCell::new(HashSet::new());
}

pub struct Config {
    envoy: abi::Config,
    filter: ConsumerFilter,
    ids: Ids,
    /// One per worker, then the main thread's.
    copies: Vec<Mutex<ConsumerCopy>>,
    /// Membership refreshes and probes are the listener instance's.
    _timer: Option<Timer>,
}

impl Config {
    pub fn new(envoy: abi::Config, json: &[u8], upstream: bool) -> Result<Config, String> {
        let ids = if upstream {
            Ids::NONE
        } else {
            Ids::define(envoy, Owner::Consumer)
        };
        let filter = ConsumerFilter::configure(&Native::config(envoy, &ids), json, upstream)?
            .with_probe_failure_as_connect_failure();
        let workers = usize::try_from(abi::concurrency()).unwrap_or(1).max(1);
        let copies = (0..=workers)
            .map(|_| Mutex::new(filter.new_copy()))
            .collect();
        let timer = if upstream {
            None
        } else {
            let period = filter.config().membership_refresh;
            Some(Timer::start(envoy, "graceful-consumer", period)?)
        };
        Ok(Config {
            envoy,
            filter,
            ids,
            copies,
            _timer: timer,
        })
    }

    /// A worker's copy (an index past the workers: the main thread's).
    fn copy(&self, worker: usize) -> &Mutex<ConsumerCopy> {
        &self.copies[worker.min(self.copies.len().saturating_sub(1))]
    }

    /// The membership timer's tick, on the main thread.
    pub fn tick(&self) {
        let h = Native::config(self.envoy, &self.ids);
        self.filter.tick(self.copy(usize::MAX), &h);
    }

    /// An answer to a membership refresh or a probe (main thread).
    pub fn callout_done(&self, id: u64, answer: &CalloutAnswer) {
        let h = Native::config(self.envoy, &self.ids);
        let token = u32::try_from(id).unwrap_or(u32::MAX);
        self.filter
            .call_answered(self.copy(usize::MAX), &h, token, answer);
    }
}

/// One stream's state, in cells (hooks of one stream may nest).
#[derive(Default)]
pub struct ConsumerStream {
    core: Core,
    /// Upstream instance: this attempt, for `destroy`.
    attempt: RefCell<Option<Attempt>>,
    /// Listener instance: this request's id while it is in `LIVE`.
    live: RefCell<Option<Vec<u8>>>,
    /// The worker the stream runs on, once asked.
    worker: Cell<Option<usize>>,
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

    pub fn request_headers(&self, c: &Config, s: Stream) -> u32 {
        let h = Native::stream(s, &c.ids);
        let next = c
            .filter
            .request_headers(c.copy(self.worker(s)), &self.core, &h);
        if c.filter.config().evict_on_connect_failure {
            let request_id = h.header(Map::RequestHeaders, REQUEST_ID);
            if c.filter.is_upstream() {
                self.attempt_started(&h, self.worker(s), request_id);
            } else if let Some(id) = request_id {
                LIVE.with(|l| l.borrow_mut().insert(id.clone()));
                *self.live.borrow_mut() = Some(id);
            }
        }
        code(next)
    }

    /// Upstream instance: notes this attempt's host, worker and cluster
    /// for [`ConsumerStream::destroy`].
    fn attempt_started(&self, h: &Native, worker: usize, request_id: Option<Vec<u8>>) {
        if let Some(address) = h.attribute_text(Attribute::UpstreamAddress) {
            let cluster = h.attribute_text(Attribute::ClusterName).unwrap_or_default();
            *self.attempt.borrow_mut() = Some(Attempt {
                address,
                cluster,
                worker,
                request_id,
            });
        }
    }

    pub fn response_headers(&self, c: &Config, s: Stream) -> u32 {
        let h = Native::stream(s, &c.ids);
        code(
            c.filter
                .response_headers(c.copy(self.worker(s)), &self.core, &h),
        )
    }

    pub fn response_trailers(&self, c: &Config, s: Stream) -> u32 {
        let h = Native::stream(s, &c.ids);
        code(
            c.filter
                .response_trailers(c.copy(self.worker(s)), &self.core, &h),
        )
    }

    /// The listener instance's stream is over. (Envoy does not call this
    /// for upstream filters.)
    pub fn stream_complete(&self, c: &Config, s: Stream) {
        self.leave_live();
        c.filter.stream_end(&self.core, &Native::stream(s, &c.ids));
    }

    /// The stream's filter is destroyed: a stream not completed leaves the
    /// count (the drain gate must not wait for it); an upstream attempt
    /// that got no response headers tombstones its host (module doc).
    pub fn destroy(&self, c: &Config) {
        self.leave_live();
        let h = Native::detached(&c.ids);
        c.filter.stream_end(&self.core, &h);
        let Some(a) = self.attempt.take() else {
            return;
        };
        if self.core.answered() {
            return;
        }
        // Cancelled with its request: says nothing about the host.
        let live = |id: &[u8]| LIVE.with(|l| l.borrow().contains(id));
        if a.request_id.as_deref().is_some_and(|id| !live(id)) {
            return;
        }
        c.filter
            .connect_failed(c.copy(a.worker), &h, a.cluster, &a.address);
    }

    fn leave_live(&self) {
        if let Some(id) = self.live.take() {
            LIVE.with(|l| l.borrow_mut().remove(&id));
        }
    }
}
