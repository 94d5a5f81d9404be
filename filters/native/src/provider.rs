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
//! | tick | main | the core's tick: merges the drain report's records into shared data; once drained, wakes each kept long-lived stream by committing its stream's scheduler |
//! | request headers | worker | admits; a long-lived stream is kept with a scheduler of its own |
//! | woken long-lived stream | worker | the drained answer (Envoy resets a stream whose headers went out) |
//! | stream destroyed | worker | leaves the count, frees a kept stream's scheduler |
//!
//! A kept stream's scheduler is committed (by the tick) and deleted (by
//! its stream) under the kept list's lock, so a tick never commits a
//! scheduler its stream has deleted.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::Mutex;

use graceful_core::provider::filter::{Provider, ProviderCopy, ProviderStream, TICK};
use graceful_core::shared::host::StateCell;
use graceful_core::shared::keys::Owner;

use crate::abi::{self, SchedulerPtr, Stream};
use crate::hooks::code;
use crate::host::{Ids, Native};
use crate::timer::Timer;

/// A kept stream's scheduler's only event.
const EVENT_END: u64 = 1;

static NEXT_KEPT: AtomicU32 = AtomicU32::new(1);

pub struct Config {
    envoy: abi::Config,
    provider: Provider,
    ids: Ids,
    /// The kept long-lived streams (their wake handles are their streams'
    /// schedulers, as addresses: they are only passed back to Envoy) and the
    /// report records not merged yet, for every worker thread.
    copy: Mutex<ProviderCopy<usize>>,
    _timer: Timer,
}

/// One stream's state: the core's, and a kept stream's id and scheduler.
#[derive(Default)]
pub struct NativeProviderStream {
    core: ProviderStream,
    kept: Cell<Option<(u32, usize)>>,
}

impl Config {
    pub fn new(envoy: abi::Config, json: &[u8]) -> Result<Config, String> {
        let ids = Ids::define(envoy, Owner::Provider);
        let provider = Provider::configure(&Native::config(envoy, &ids), json)?;
        Ok(Config {
            envoy,
            provider,
            ids,
            copy: Mutex::new(ProviderCopy::default()),
            _timer: Timer::start(envoy, "graceful-provider", TICK)?,
        })
    }

    /// The main thread's tick.
    pub fn tick(&self) {
        let h = Native::config(self.envoy, &self.ids);
        self.provider.tick(&self.copy, &h, |_, &scheduler| {
            // SAFETY: the stream deletes its scheduler only under this
            // lock, after the tick took it from the kept list or it left it.
            #[allow(unsafe_code)]
            unsafe {
                abi::scheduler_commit(scheduler as SchedulerPtr, EVENT_END)
            };
        });
    }

    pub fn request_headers(&self, st: &NativeProviderStream, s: Stream) -> u32 {
        let keep = || {
            let id = NEXT_KEPT.fetch_add(1, SeqCst);
            let scheduler = s.scheduler() as usize;
            st.kept.set(Some((id, scheduler)));
            (id, scheduler)
        };
        code(self.provider.request_headers(
            &st.core,
            &Native::stream(s, &self.ids),
            &self.copy,
            keep,
        ))
    }

    pub fn response_headers(&self, st: &NativeProviderStream, s: Stream) -> u32 {
        code(
            self.provider
                .response_headers(&st.core, &Native::stream(s, &self.ids)),
        )
    }

    pub fn response_trailers(&self, st: &NativeProviderStream, s: Stream) -> u32 {
        code(
            self.provider
                .response_trailers(&st.core, &Native::stream(s, &self.ids)),
        )
    }

    /// The tick woke this kept long-lived stream: the gate has passed.
    pub fn scheduled(&self, st: &NativeProviderStream, s: Stream) {
        if st.kept.get().is_some() {
            self.provider.answer_woken(&Native::stream(s, &self.ids));
        }
    }

    pub fn stream_complete(&self, st: &NativeProviderStream, s: Stream) {
        self.provider
            .stream_end(&st.core, &Native::stream(s, &self.ids), &self.copy);
    }

    /// The stream is gone: it leaves the count (if `stream_complete` did
    /// not run), and a kept stream's scheduler is deleted.
    pub fn destroy(&self, st: &NativeProviderStream) {
        let h = Native::detached(&self.ids);
        if let Some((id, scheduler)) = st.kept.take() {
            self.copy.with(|c| {
                c.release(id);
                // SAFETY: under the lock the tick commits under, and no
                // longer in the kept list: nobody uses it after this.
                #[allow(unsafe_code)]
                unsafe {
                    abi::scheduler_delete(scheduler as SchedulerPtr)
                };
            });
        }
        self.provider.stream_end(&st.core, &h, &self.copy);
    }
}
