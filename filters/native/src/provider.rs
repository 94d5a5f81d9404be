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
//! the request path). A kept stream's scheduler is owned by the copy that
//! keeps it: the tick takes it out to commit it, or the stream's
//! destruction releases it; either drops (deletes) it, once.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::Mutex;

use graceful_core::provider::filter::{Provider, ProviderCopy, ProviderStream, TICK};
use graceful_core::shared::host::StateCell;
use graceful_core::shared::keys::Owner;

use crate::abi::{self, Stream, StreamScheduler};
use crate::hooks::code;
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
    copies: Vec<Mutex<ProviderCopy<StreamScheduler>>>,
    _timer: Timer,
}

/// One stream's state: the core's, a kept stream's id, and its worker
/// (whose copy holds what it keeps and records).
#[derive(Default)]
pub struct NativeProviderStream {
    core: ProviderStream,
    kept: Cell<Option<u32>>,
    worker: Cell<Option<usize>>,
}

impl NativeProviderStream {
    /// The stream's worker index (asked of Envoy once per stream).
    fn worker(&self, s: Stream<'_>) -> usize {
        if let Some(w) = self.worker.get() {
            return w;
        }
        let w = usize::try_from(s.worker_index()).unwrap_or(usize::MAX);
        self.worker.set(Some(w));
        w
    }

    /// The worker known from an earlier hook; a stream that never asked
    /// kept and recorded nothing: the main thread's copy.
    fn known_worker(&self) -> usize {
        self.worker.get().unwrap_or(usize::MAX)
    }
}

impl Config {
    pub fn new(envoy: abi::Config<'_>, json: &[u8]) -> Result<Config, String> {
        let ids = Ids::define(envoy, Owner::Provider);
        let provider = Provider::configure(&Native::config(envoy, &ids), json)?;
        Ok(Config {
            provider,
            ids,
            copies: copies(envoy.concurrency()),
            _timer: Timer::start(envoy, "graceful-provider", TICK)?,
        })
    }

    /// A worker's copy (an index past the workers: the main thread's).
    fn copy(&self, worker: usize) -> &Mutex<ProviderCopy<StreamScheduler>> {
        copy_of(&self.copies, worker)
    }

    /// The main thread's tick, over every worker's copy. The woken
    /// streams' schedulers are dropped (deleted) after their commit.
    pub fn tick(&self, envoy: abi::Config<'_>) {
        let h = Native::config(envoy, &self.ids);
        for copy in &self.copies {
            self.provider
                .tick(copy, &h, |_, scheduler| scheduler.commit(EVENT_END));
        }
    }

    pub fn request_headers(
        &self,
        st: &NativeProviderStream,
        s: Stream<'_>,
        ends_in_headers: bool,
    ) -> u32 {
        let keep = || {
            let id = NEXT_KEPT.fetch_add(1, SeqCst);
            st.kept.set(Some(id));
            (id, s.scheduler())
        };
        code(self.provider.request_headers(
            &st.core,
            &Native::stream(s, &self.ids),
            self.copy(st.worker(s)),
            ends_in_headers,
            keep,
        ))
    }

    pub fn response_headers(&self, st: &NativeProviderStream, s: Stream<'_>) -> u32 {
        code(
            self.provider
                .response_headers(&st.core, &Native::stream(s, &self.ids)),
        )
    }

    pub fn response_trailers(&self, st: &NativeProviderStream, s: Stream<'_>) -> u32 {
        code(
            self.provider
                .response_trailers(&st.core, &Native::stream(s, &self.ids)),
        )
    }

    /// The tick woke this kept long-lived stream: the gate has passed.
    pub fn scheduled(&self, st: &NativeProviderStream, s: Stream<'_>) {
        if st.kept.get().is_some() {
            self.provider.answer_woken(&Native::stream(s, &self.ids));
        }
    }

    pub fn stream_complete(&self, st: &NativeProviderStream, s: Stream<'_>) {
        self.provider.stream_end(
            &st.core,
            &Native::stream(s, &self.ids),
            self.copy(st.worker(s)),
        );
    }

    /// The stream is gone: it leaves the count (if `stream_complete` did
    /// not run), and a kept stream leaves its copy (which deletes its
    /// scheduler, if the tick has not woken it already).
    pub fn destroy(&self, st: &NativeProviderStream) {
        let h = Native::detached(&self.ids);
        let copy = self.copy(st.known_worker());
        if let Some(id) = st.kept.take() {
            copy.with(|c| c.release(id));
        }
        self.provider.stream_end(&st.core, &h, copy);
    }
}

/// One copy per worker of `concurrency`, then the main thread's.
fn copies<W>(concurrency: u32) -> Vec<Mutex<ProviderCopy<W>>> {
    let workers = usize::try_from(concurrency).unwrap_or(1).max(1);
    (0..=workers)
        .map(|_| Mutex::new(ProviderCopy::default()))
        .collect()
}

/// Worker `worker`'s copy; any index past the workers is the main thread's.
fn copy_of<W>(copies: &[Mutex<ProviderCopy<W>>], worker: usize) -> &Mutex<ProviderCopy<W>> {
    &copies[worker.min(copies.len().saturating_sub(1))]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_worker_has_its_own_copy_and_the_main_thread_the_last() {
        let copies = copies::<()>(3);
        assert_eq!(copies.len(), 4);
        let at = |w: usize| std::ptr::from_ref(copy_of(&copies, w));
        let distinct: std::collections::HashSet<_> = (0..4).map(at).collect();
        assert_eq!(distinct.len(), 4, "workers share a copy");
        assert_eq!(at(usize::MAX), at(3), "past the workers: the main thread's");
        assert_eq!(at(7), at(3));
    }

    #[test]
    fn a_worker_holding_its_copy_does_not_block_another_worker() {
        let copies = copies::<()>(2);
        let _held = copy_of(&copies, 0).lock();
        assert!(copy_of(&copies, 1).try_lock().is_ok());
        assert!(copy_of(&copies, usize::MAX).try_lock().is_ok());
    }

    #[test]
    fn no_concurrency_still_has_a_worker_copy_and_the_main_threads() {
        assert_eq!(copies::<()>(0).len(), 2);
    }
}
