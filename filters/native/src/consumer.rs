//! graceful_consumer natively: the callbacks of
//! [`graceful_core::consumer::filter`] over the module's host, with the
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
//! | `front`: a `FrontCopy` per VM copy, held long-polls answered from its tick through their context | one `FrontCopy` for the config (workers answer endpoints, the main thread ticks), each held long-poll woken by committing its stream's scheduler; the timer ticks every `front.poll` at most |
//!
//! Envoy 1.40 calls no hook with a filter pointer when an upstream filter's
//! attempt ends without response headers (`stream_complete` is not called
//! for upstream filters; `destroy` has no filter pointer), so the upstream
//! instance cannot ask why the attempt ended. It reads the attempt's host
//! and its request's stream token when the attempt starts: a number unique
//! in the process that the listener instance put in the request's filter
//! state ([`STREAM_TOKEN`]; an upstream filter reads its request's stream
//! info), not a request header an app may share between requests. At `destroy`,
//! an attempt that got no response headers while its request is still
//! alive failed: refused, reset before headers, or out of per-try time, and
//! the request goes on to a retry or a local reply. Its host is tombstoned
//! for `failure_tombstone_ttl` as a connect failure. An attempt whose
//! request is over was cancelled with it (the client went away): nothing.
//! Which requests are alive the listener instance keeps per worker (the
//! tokens of its streams from request headers to `stream_complete`): Envoy
//! completes a cancelled downstream stream before it deletes the attempt,
//! and deletes a failed attempt (deferred) while its request waits. Two
//! requests that share an `x-request-id` (propagated, a fan-out) have two
//! tokens: one's end says nothing about the other's attempts. An attempt
//! without a token (no listener instance on its request) counts as alive
//! (the wasm-equivalent answer for a refusal; a cancel then tombstones,
//! readmitted by the next probe). The listener instance writes tokens only
//! once an upstream instance is configured in the process (before that no
//! attempt can ask: a request without one costs no filter-state write).
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
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use graceful_core::consumer::filter::{ConsumerCopy, ConsumerFilter, ConsumerStream as Core};
use graceful_core::consumer::front::FrontCopy;
use graceful_core::shared::host::{Attribute, StateCell, Stream as _};
use graceful_core::shared::keys::Owner;

use crate::abi::{self, Stream, StreamScheduler, CONTINUE};
use crate::copies::{Guarded, PerWorker, WorkerOf};
use crate::hooks::{code, Event};
use crate::host::{CalloutAnswer, Ids, Native};
use crate::timer::Timer;

/// The filter-state key of a request's stream token (module doc).
pub const STREAM_TOKEN: &str = "graceful.consumer.stream";

/// The next stream token: unique in the process (2^64 streams).
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

/// A held front long-poll's stream scheduler's only event.
const EVENT_ANSWER: u64 = 1;

/// The next front long-poll id.
static NEXT_WAITER: AtomicU32 = AtomicU32::new(1);

/// An upstream instance has been configured in this process: from then on
/// the listener instance's streams carry tokens (never cleared: a config
/// replaced keeps its attempts until they end). A worker that reads it
/// late writes no token for a stream or two: their attempts count as alive.
static UPSTREAM_CONFIGURED: AtomicBool = AtomicBool::new(false);

/// Hashes a stream token with one multiplication: tokens are our own
/// sequential numbers, not input anyone else chooses, so SipHash's
/// flood resistance buys nothing here.
#[derive(Default)]
struct TokenHasher(u64);

impl Hasher for TokenHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(FIBONACCI);
        }
    }

    fn write_u64(&mut self, token: u64) {
        // The high bits pick the bucket group and the control byte.
        self.0 = token.wrapping_mul(FIBONACCI);
    }
}

/// 2^64 / φ, odd: spreads sequential tokens over the high bits.
const FIBONACCI: u64 = 0x9E37_79B9_7F4A_7C15;

type Tokens = HashSet<u64, BuildHasherDefault<TokenHasher>>;

thread_local! {
    /// The tokens of this worker's listener-instance streams that are under
    /// way (see the module doc). Bounded by the streams in flight.
    static LIVE: RefCell<Tokens> = RefCell::new(Tokens::default());
}

pub struct Config {
    /// Shared with the copies, which a panic rebuilds from it.
    filter: Arc<ConsumerFilter>,
    ids: Ids,
    /// One per worker, then the main thread's.
    copies: PerWorker<ConsumerCopy>,
    /// The front role's one copy (rebuilt after a panic, `copies.rs`): its
    /// long-polls' wake handles are their streams' schedulers, owned here.
    front: Guarded<FrontCopy<StreamScheduler>>,
    /// Membership refreshes and probes are the listener instance's.
    _timer: Option<Timer>,
}

impl Config {
    pub fn new(envoy: &abi::Config<'_>, json: &[u8], upstream: bool) -> Result<Config, String> {
        let ids = if upstream {
            Ids::NONE
        } else {
            Ids::define(envoy, Owner::Consumer)
        };
        let filter = Arc::new(
            ConsumerFilter::configure(&Native::config(envoy, &ids), json, upstream)?
                .with_probe_failure_as_connect_failure(),
        );
        let fresh = filter.clone();
        let copies = PerWorker::new(envoy.concurrency(), move || fresh.new_copy());
        let timer = if upstream {
            UPSTREAM_CONFIGURED.store(true, Relaxed);
            None
        } else {
            // With `front`, every `front.poll` at most: the poll's lease and
            // the held long-polls' answers wait for a tick (the membership
            // refresh keeps to its own period by lease).
            let mut period = filter.config().membership_refresh;
            if let Some(front) = &filter.config().front {
                period = period.min(front.poll);
            }
            Some(Timer::start(envoy, "graceful-consumer", period)?)
        };
        Ok(Config {
            filter,
            ids,
            copies,
            front: Guarded::new(FrontCopy::default),
            _timer: timer,
        })
    }

    /// The timer's tick, on the main thread: the consumer's, then the
    /// front's (a woken long-poll's scheduler is dropped, deleted, after
    /// its commit).
    pub fn tick(&self, envoy: &abi::Config<'_>) {
        let h = Native::config(envoy, &self.ids);
        let copy = self.copies.main_thread();
        self.filter.tick(copy, &h);
        self.filter
            .front_tick(&self.front, copy, &h, |_, scheduler| {
                scheduler.commit(EVENT_ANSWER)
            });
    }

    /// An answer to a membership refresh, a probe or the front's
    /// `/clusters` call (main thread).
    pub fn callout_done(&self, envoy: &abi::Config<'_>, id: u64, answer: &CalloutAnswer) {
        let h = Native::config(envoy, &self.ids);
        let token = u32::try_from(id).unwrap_or(u32::MAX);
        let copy = self.copies.main_thread();
        if !self
            .filter
            .front_call_answered(&self.front, copy, &h, token, answer)
        {
            self.filter.call_answered(copy, &h, token, answer);
        }
    }
}

/// One stream's state, in cells (hooks of one stream may nest).
#[derive(Default)]
pub struct ConsumerStream {
    core: Core,
    /// Upstream instance: this attempt, for `destroy`.
    attempt: RefCell<Option<Attempt>>,
    /// Listener instance: this stream's token while it is in `LIVE`.
    live: Cell<Option<u64>>,
    /// The worker the stream runs on, once asked.
    worker: WorkerOf,
    /// A held front long-poll's id.
    waiting: Cell<Option<u32>>,
}

/// An upstream attempt: where it went, for which request.
struct Attempt {
    address: String,
    cluster: String,
    worker: usize,
    stream_token: Option<u64>,
}

impl ConsumerStream {
    /// One of the stream's hooks.
    pub fn on(&self, c: &Config, s: Stream<'_>, event: Event) -> u32 {
        let h = Native::stream(s, &c.ids);
        match event {
            Event::RequestHeaders { .. } => self.request_headers(c, &h),
            Event::ResponseHeaders => code(c.filter.response_headers(
                c.copies.of_stream(&self.worker, &h),
                &self.core,
                &h,
            )),
            Event::ResponseTrailers => code(c.filter.response_trailers(
                c.copies.of_stream(&self.worker, &h),
                &self.core,
                &h,
            )),
            // The listener instance's stream is over. (Envoy does not call
            // this for upstream filters.)
            Event::StreamComplete => {
                self.leave_live();
                c.filter.stream_end(&self.core, &h);
                CONTINUE
            }
            // The tick woke this stream's front long-poll.
            Event::Scheduled => {
                if let Some(id) = self.waiting.get() {
                    c.filter.front_answer_woken(&c.front, &h, id);
                }
                CONTINUE
            }
        }
    }

    fn request_headers(&self, c: &Config, h: &Native) -> u32 {
        let copy = c.copies.of_stream(&self.worker, h);
        let hold = || {
            let id = NEXT_WAITER.fetch_add(1, Relaxed);
            self.waiting.set(Some(id));
            (id, h.scheduler())
        };
        if let Some(next) = c.filter.front_request_headers(&c.front, copy, h, hold) {
            return code(next);
        }
        let next = c
            .filter
            .request_headers(c.copies.of_stream(&self.worker, h), &self.core, h);
        if c.filter.config().evict_on_connect_failure {
            if c.filter.is_upstream() {
                let token = h.filter_state(STREAM_TOKEN).and_then(|b| token_of(&b));
                self.attempt_started(h, self.worker.get(h), token);
            } else if self.live.get().is_none() && UPSTREAM_CONFIGURED.load(Relaxed) {
                let token = NEXT_TOKEN.fetch_add(1, Relaxed);
                if h.set_filter_state(STREAM_TOKEN, &token.to_le_bytes()) {
                    LIVE.with(|l| l.borrow_mut().insert(token));
                    self.live.set(Some(token));
                }
            }
        }
        code(next)
    }

    /// Upstream instance: notes this attempt's host, worker and cluster
    /// for [`ConsumerStream::destroy`].
    fn attempt_started(&self, h: &Native, worker: usize, stream_token: Option<u64>) {
        if let Some(address) = h.attribute_text(Attribute::UpstreamAddress) {
            let cluster = h.attribute_text(Attribute::ClusterName).unwrap_or_default();
            *self.attempt.borrow_mut() = Some(Attempt {
                address,
                cluster,
                worker,
                stream_token,
            });
        }
    }

    /// The stream's filter is destroyed: a stream not completed leaves the
    /// count (the drain gate must not wait for it); an upstream attempt
    /// that got no response headers tombstones its host (module doc).
    pub fn destroy(&self, c: &Config) {
        self.leave_live();
        let h = Native::detached(&c.ids);
        // A front long-poll not answered yet frees its slot and scheduler.
        if let Some(id) = self.waiting.take() {
            c.front.with(|f| c.filter.front_release(f, &h, id));
        }
        c.filter.stream_end(&self.core, &h);
        let Some(a) = self.attempt.take() else {
            return;
        };
        if self.core.answered() {
            return;
        }
        // Cancelled with its request: says nothing about the host.
        let live = |token: u64| LIVE.with(|l| l.borrow().contains(&token));
        if a.stream_token.is_some_and(|token| !live(token)) {
            return;
        }
        c.filter
            .connect_failed(c.copies.of(a.worker), &h, a.cluster, &a.address);
    }

    fn leave_live(&self) {
        if let Some(token) = self.live.take() {
            LIVE.with(|l| l.borrow_mut().remove(&token));
        }
    }
}

/// Forgets that an upstream instance was configured (glue tests only: they
/// take turns, `fake_envoy::world`).
#[cfg(test)]
pub fn forget_upstream_instances() {
    UPSTREAM_CONFIGURED.store(false, Relaxed);
}

/// A stream token as [`ConsumerStream::request_headers`] wrote it.
fn token_of(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_token_reads_back_as_written_and_nothing_else_reads_as_one() {
        let token = NEXT_TOKEN.fetch_add(1, Relaxed);
        assert_eq!(token_of(&token.to_le_bytes()), Some(token));
        assert_eq!(token_of(b""), None);
        assert_eq!(token_of(b"a request id"), None);
    }
}
