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
//! A held long-poll's scheduler is owned by the copy: the tick takes it
//! out to commit it, or the stream's destruction releases it; either drops
//! (deletes) it, once.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

use graceful_core::drain::filter::{Drain, DrainCopy, TICK};
use graceful_core::shared::host::StateCell;
use graceful_core::shared::keys::Owner;

use crate::abi::{self, Stream, StreamScheduler, CONTINUE};
use crate::copies::Guarded;
use crate::hooks::{code, Event};
use crate::host::{CalloutAnswer, Ids, Native};
use crate::timer::Timer;

/// A held long-poll's stream scheduler's only event.
const EVENT_ANSWER: u64 = 1;

static NEXT_WAITER: AtomicU32 = AtomicU32::new(1);

pub struct Config {
    drain: Drain,
    ids: Ids,
    /// The config's one copy (rebuilt after a panic, `copies.rs`); its
    /// long-polls' wake handles are their streams' schedulers.
    copy: Guarded<DrainCopy<StreamScheduler>>,
    _timer: Timer,
}

impl Config {
    pub fn new(envoy: &abi::Config<'_>, json: &[u8]) -> Result<Config, String> {
        let ids = Ids::define(envoy, Owner::Drain);
        let drain = Drain::configure(&Native::config(envoy, &ids), json)?;
        Ok(Config {
            drain,
            ids,
            copy: Guarded::new(DrainCopy::default),
            _timer: Timer::start(envoy, "graceful-drain", TICK)?,
        })
    }

    /// The main thread's tick. The woken streams' schedulers are dropped
    /// (deleted) after their commit.
    pub fn tick(&self, envoy: &abi::Config<'_>) {
        let h = Native::config(envoy, &self.ids);
        self.drain.tick(&self.copy, &h, |_, scheduler| {
            scheduler.commit(EVENT_ANSWER)
        });
    }

    /// An answer to one of the config's callouts (main thread).
    pub fn callout_done(&self, envoy: &abi::Config<'_>, id: u64, answer: &CalloutAnswer) {
        let h = Native::config(envoy, &self.ids);
        let token = u32::try_from(id).unwrap_or(u32::MAX);
        self.drain.call_answered(&self.copy, &h, token, answer);
    }
}

/// One stream's state, in cells (hooks of one stream may nest).
#[derive(Default)]
pub struct DrainStream {
    /// A held long-poll's id.
    waiting: Cell<Option<u32>>,
}

impl DrainStream {
    /// One of the stream's hooks: its request, or the tick waking its
    /// long-poll (or its kept gRPC health `Watch` at closing).
    pub fn on(&self, c: &Config, s: Stream<'_>, event: Event) -> u32 {
        let h = Native::stream(s, &c.ids);
        match event {
            Event::RequestHeaders { .. } => {
                let hold = || {
                    let id = NEXT_WAITER.fetch_add(1, SeqCst);
                    self.waiting.set(Some(id));
                    (id, h.scheduler())
                };
                code(c.drain.request_headers(&c.copy, &h, hold))
            }
            Event::Scheduled => {
                if let Some(id) = self.waiting.get() {
                    c.drain.answer_woken(&c.copy, &h, id);
                }
                CONTINUE
            }
            _ => CONTINUE,
        }
    }

    /// The stream is gone: a long-poll not answered yet frees its slot
    /// (and its scheduler).
    pub fn destroy(&self, c: &Config) {
        let Some(id) = self.waiting.take() else {
            return;
        };
        c.copy
            .with(|st| c.drain.release(st, &Native::detached(&c.ids), id));
    }
}
