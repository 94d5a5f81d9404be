//! graceful_provider natively: the callbacks of
//! [`graceful_core::provider::filter`] over the module's host. A stream
//! Envoy destroys without `stream_complete` leaves the in-flight count at
//! its destruction (the gate must not wait for it forever); its gauge
//! change is owed to the next stream (see `host.rs`).
//!
//! | event | thread | does |
//! |---|---|---|
//! | `config_new` | main | configures, starts the timer thread |
//! | every [`TICK`] | timer thread | commits a tick to the main thread (config scheduler) |
//! | tick | main | the core's tick on every worker's copy in turn: merges its drain report records into shared data; once drained, wakes each long-lived stream it keeps by committing its stream's scheduler |
//! | request headers | worker | admits; a long-lived stream is kept, with a scheduler of its own, in its worker's copy |
//! | woken long-lived stream | worker | the drained answer (Envoy resets a stream whose headers went out) |
//! | stream destroyed | worker | leaves the count, frees a kept stream's scheduler |
//!
//! State is per worker, as the wasm build's VM copies: one copy per worker
//! (by `worker_index`) and one for the main thread, each behind its own
//! lock, which only its worker and the tick take (no process-wide lock on
//! the request path), rebuilt after a panic (`copies.rs`). A kept stream's
//! scheduler is owned by the copy that keeps it: the tick takes it out to
//! commit it, or the stream's destruction releases it; either drops
//! (deletes) it, once.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

use graceful_core::provider::filter::{Provider, ProviderCopy, ProviderStream, TICK};
use graceful_core::shared::host::StateCell;
use graceful_core::shared::keys::Owner;

use crate::abi::{self, Stream, StreamScheduler, CONTINUE};
use crate::copies::{PerWorker, WorkerOf};
use crate::hooks::{code, Event};
use crate::host::{Ids, Native};
use crate::timer::Timer;

/// A kept stream's scheduler's only event.
const EVENT_END: u64 = 1;

static NEXT_KEPT: AtomicU32 = AtomicU32::new(1);

pub struct Config {
    provider: Provider,
    ids: Ids,
    /// One per worker, then the main thread's: each worker's kept
    /// long-lived streams (each woken by its stream's scheduler, which the
    /// copy owns: deleted when the stream leaves the copy or the tick has
    /// woken it) and report records not merged yet.
    copies: PerWorker<ProviderCopy<StreamScheduler>>,
    _timer: Timer,
}

/// One stream's state: the core's, a kept stream's id, and its worker
/// (whose copy holds what it keeps and records).
#[derive(Default)]
pub struct NativeProviderStream {
    core: ProviderStream,
    kept: Cell<Option<u32>>,
    worker: WorkerOf,
}

impl Config {
    pub fn new(envoy: &abi::Config<'_>, json: &[u8]) -> Result<Config, String> {
        let ids = Ids::define(envoy, Owner::Provider);
        let provider = Provider::configure(&Native::config(envoy, &ids), json)?;
        Ok(Config {
            provider,
            ids,
            copies: PerWorker::new(envoy.concurrency(), ProviderCopy::default),
            _timer: Timer::start(envoy, "graceful-provider", TICK)?,
        })
    }

    /// The main thread's tick, over every worker's copy. The woken
    /// streams' schedulers are dropped (deleted) after their commit.
    pub fn tick(&self, envoy: &abi::Config<'_>) {
        let h = Native::config(envoy, &self.ids);
        for copy in self.copies.iter() {
            self.provider
                .tick(copy, &h, |_, scheduler| scheduler.commit(EVENT_END));
        }
    }

    /// One of the stream's hooks.
    pub fn on(&self, st: &NativeProviderStream, s: Stream<'_>, event: Event) -> u32 {
        let h = Native::stream(s, &self.ids);
        match event {
            Event::RequestHeaders { end_of_stream } => {
                let keep = || {
                    let id = NEXT_KEPT.fetch_add(1, SeqCst);
                    st.kept.set(Some(id));
                    (id, h.scheduler())
                };
                code(self.provider.request_headers(
                    &st.core,
                    &h,
                    self.copies.of_stream(&st.worker, &h),
                    end_of_stream,
                    keep,
                ))
            }
            Event::ResponseHeaders => code(self.provider.response_headers(&st.core, &h)),
            Event::ResponseTrailers => code(self.provider.response_trailers(&st.core, &h)),
            // The tick woke this kept long-lived stream: the gate has passed.
            Event::Scheduled => {
                if st.kept.get().is_some() {
                    self.provider.answer_woken(&h);
                }
                CONTINUE
            }
            Event::StreamComplete => {
                self.provider
                    .stream_end(&st.core, &h, self.copies.of_stream(&st.worker, &h));
                CONTINUE
            }
        }
    }

    /// The stream is gone: it leaves the count (if `stream_complete` did
    /// not run), and a kept stream leaves its copy (which deletes its
    /// scheduler, if the tick has not woken it already).
    pub fn destroy(&self, st: &NativeProviderStream) {
        let h = Native::detached(&self.ids);
        let copy = self.copies.of(st.worker.known());
        if let Some(id) = st.kept.take() {
            copy.with(|c| c.release(id));
        }
        self.provider.stream_end(&st.core, &h, copy);
    }
}
