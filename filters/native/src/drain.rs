//! graceful_drain natively: the callbacks of
//! [`graceful_core::drain::filter`] over the module's host, with the
//! module's threads in place of VM ticks.
//!
//! | event | thread | does |
//! |---|---|---|
//! | `config_new` | main | configures, starts the timer thread |
//! | every 50 ms | timer thread | commits a tick to the main thread (config scheduler) |
//! | tick | main | the core's tick; wakes a due long-poll by committing its stream's scheduler |
//! | endpoint request | worker | answers at once, or holds a `drained?wait=` long-poll with a scheduler of its own stream |
//! | woken long-poll | worker | answers `drained` with the status now |
//! | stream destroyed | worker | frees its long-poll slot and its scheduler |
//! | `config_destroy` | main | stops and joins the timer thread |
//!
//! A held long-poll's scheduler is committed (by the tick) and deleted (by
//! its stream) under the state's lock, so a tick never commits a scheduler
//! its stream has deleted.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::Mutex;

use graceful_core::drain::filter::{Drain, DrainCopy, TICK};
use graceful_core::shared::host::StateCell;
use graceful_core::shared::keys::Owner;

use crate::abi::{self, SchedulerPtr, Stream};
use crate::hooks::code;
use crate::host::{CalloutAnswer, Ids, Native};
use crate::timer::Timer;

/// A held long-poll's stream scheduler's only event.
const EVENT_ANSWER: u64 = 1;

static NEXT_WAITER: AtomicU32 = AtomicU32::new(1);

pub struct Config {
    envoy: abi::Config,
    drain: Drain,
    ids: Ids,
    /// The long-polls' wake handles are their streams' schedulers (as
    /// addresses: they are only passed back to Envoy).
    state: Mutex<DrainCopy<usize>>,
    _timer: Timer,
}

impl Config {
    pub fn new(envoy: abi::Config, json: &[u8]) -> Result<Config, String> {
        let ids = Ids::define(envoy, Owner::Drain);
        let drain = Drain::configure(&Native::config(envoy, &ids), json)?;
        Ok(Config {
            envoy,
            drain,
            ids,
            state: Mutex::new(DrainCopy::default()),
            _timer: Timer::start(envoy, "graceful-drain", TICK)?,
        })
    }

    /// The main thread's tick.
    pub fn tick(&self) {
        let h = Native::config(self.envoy, &self.ids);
        self.drain.tick(&self.state, &h, |_, &scheduler| {
            // SAFETY: the stream deletes its scheduler only under this
            // lock, after the tick took it from the waiters or it left them.
            #[allow(unsafe_code)]
            unsafe {
                abi::scheduler_commit(scheduler as SchedulerPtr, EVENT_ANSWER)
            };
        });
    }

    /// An answer to one of the config's callouts (main thread).
    pub fn callout_done(&self, id: u64, answer: &CalloutAnswer) {
        let h = Native::config(self.envoy, &self.ids);
        let token = u32::try_from(id).unwrap_or(u32::MAX);
        self.drain.call_answered(&self.state, &h, token, answer);
    }
}

/// One stream's state, in cells (hooks of one stream may nest).
#[derive(Default)]
pub struct DrainStream {
    /// A held long-poll: its id and its stream's scheduler.
    waiting: Cell<Option<(u32, usize)>>,
}

impl DrainStream {
    pub fn request_headers(&self, c: &Config, s: Stream) -> u32 {
        let hold = || {
            let id = NEXT_WAITER.fetch_add(1, SeqCst);
            let scheduler = s.scheduler() as usize;
            self.waiting.set(Some((id, scheduler)));
            (id, scheduler)
        };
        code(
            c.drain
                .request_headers(&c.state, &Native::stream(s, &c.ids), hold),
        )
    }

    /// The tick woke this stream: its long-poll, or its kept gRPC health
    /// `Watch` at closing.
    pub fn scheduled(&self, c: &Config, s: Stream) {
        if let Some((id, _)) = self.waiting.get() {
            c.drain
                .answer_woken(&c.state, &Native::stream(s, &c.ids), id);
        }
    }

    /// The stream is gone: a long-poll not answered yet frees its slot; its
    /// scheduler is deleted either way.
    pub fn destroy(&self, c: &Config) {
        let Some((id, scheduler)) = self.waiting.take() else {
            return;
        };
        c.state.with(|st| {
            c.drain.release(st, &Native::detached(&c.ids), id);
            // SAFETY: under the lock the tick commits under, and no longer
            // among the waiters: nobody uses it after this.
            #[allow(unsafe_code)]
            unsafe {
                abi::scheduler_delete(scheduler as SchedulerPtr)
            };
        });
    }
}
