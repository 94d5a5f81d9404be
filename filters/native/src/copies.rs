//! The filters' state as the native module keeps it: the wasm build's VM
//! copies become copies behind locks, one per worker (by `worker_index`)
//! and one for the main thread ([`PerWorker`]), or one per config (the
//! drain's), each a [`Guarded`]: no process-wide lock on the request path.
//!
//! A panic while a copy's lock is held (caught at the hook, `hooks.rs`)
//! may leave the copy half changed. The lock is then poisoned, and the
//! next user of the copy drops it and starts again from a fresh one: the
//! config's initial copy, which reads what the workers share (the gate,
//! tombstones, counts) from the shared store again. A copy that saw a
//! panic is never used again, as the stream's filter that panicked is not.
//!
//! | copy | event | next |
//! |---|---|---|
//! | whole | a change under its lock, finished | whole |
//! | whole | a panic under its lock | poisoned |
//! | poisoned | its next use (any thread) | dropped (what it owned too: a kept stream's scheduler is deleted), a fresh copy in its place, used |

use std::cell::Cell;
#[cfg(test)]
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

use graceful_core::shared::host::StateCell;

use crate::host::Native;

/// How a copy is made afresh (the config's initial copy).
type Fresh<T> = Arc<dyn Fn() -> T + Send + Sync>;

/// A copy behind its own lock, rebuilt after a panic (module doc).
pub struct Guarded<T> {
    state: Mutex<T>,
    fresh: Fresh<T>,
    /// Copies dropped after a panic.
    #[cfg(test)]
    rebuilt: AtomicU32,
}

impl<T> Guarded<T> {
    pub fn new(fresh: impl Fn() -> T + Send + Sync + 'static) -> Guarded<T> {
        Guarded::from_fresh(Arc::new(fresh))
    }

    fn from_fresh(fresh: Fresh<T>) -> Guarded<T> {
        Guarded {
            state: Mutex::new(fresh()),
            fresh,
            #[cfg(test)]
            rebuilt: AtomicU32::new(0),
        }
    }

    /// How many times a poisoned copy was dropped for a fresh one.
    #[cfg(test)]
    pub fn rebuilt(&self) -> u32 {
        self.rebuilt.load(Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, T> {
        match self.state.lock() {
            Ok(state) => state,
            Err(poisoned) => {
                let mut state = poisoned.into_inner();
                // The panicked copy is dropped here, a fresh one in its place.
                *state = (self.fresh)();
                self.state.clear_poison();
                #[cfg(test)]
                self.rebuilt.fetch_add(1, Relaxed);
                state
            }
        }
    }
}

impl<T> StateCell<T> for Guarded<T> {
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let mut state = self.lock();
        let out = f(&mut state);
        #[cfg(test)]
        inject::after_change();
        out
    }
}

/// One copy per worker of `concurrency`, then the main thread's.
pub struct PerWorker<T> {
    copies: Vec<Guarded<T>>,
}

impl<T> PerWorker<T> {
    pub fn new(concurrency: u32, fresh: impl Fn() -> T + Send + Sync + 'static) -> PerWorker<T> {
        let workers = usize::try_from(concurrency).unwrap_or(1).max(1);
        let fresh: Fresh<T> = Arc::new(fresh);
        PerWorker {
            copies: (0..=workers)
                .map(|_| Guarded::from_fresh(fresh.clone()))
                .collect(),
        }
    }

    /// Worker `worker`'s copy; any index past the workers is the main
    /// thread's.
    pub fn of(&self, worker: usize) -> &Guarded<T> {
        &self.copies[worker.min(self.copies.len().saturating_sub(1))]
    }

    /// The copy of the worker of the stream `h` is a hook of (asked of
    /// Envoy once per stream, kept in `worker`).
    pub fn of_stream(&self, worker: &WorkerOf, h: &Native) -> &Guarded<T> {
        self.of(worker.get(h))
    }

    pub fn main_thread(&self) -> &Guarded<T> {
        self.of(usize::MAX)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Guarded<T>> {
        self.copies.iter()
    }
}

/// A stream's worker, asked of Envoy once per stream.
#[derive(Default)]
pub struct WorkerOf(Cell<Option<usize>>);

impl WorkerOf {
    /// The worker of the stream `h` is a hook of (the main thread's copy
    /// for a hook without a stream).
    pub fn get(&self, h: &Native) -> usize {
        if let Some(w) = self.0.get() {
            return w;
        }
        let w = h
            .worker_index()
            .map_or(usize::MAX, |w| usize::try_from(w).unwrap_or(usize::MAX));
        self.0.set(Some(w));
        w
    }

    /// The worker known from an earlier hook; a stream that never asked
    /// kept and recorded nothing: the main thread's copy.
    pub fn known(&self) -> usize {
        self.0.get().unwrap_or(usize::MAX)
    }
}

/// Tests only: a panic in the middle of a change, as a bug in the core
/// would cause one.
#[cfg(test)]
pub mod inject {
    use std::cell::Cell;

    thread_local! {
        /// Uses of a copy on this thread until the injected panic; 0: none.
        static USES_LEFT: Cell<u32> = const { Cell::new(0) };
    }

    /// The `n`th use of a copy from now on this thread (1: the next)
    /// panics once it has changed the copy, before its lock is released.
    pub fn panic_in_use(n: u32) {
        USES_LEFT.with(|c| c.set(n));
    }

    #[allow(clippy::panic)]
    pub(super) fn after_change() {
        let now = USES_LEFT.with(|c| {
            let left = c.get();
            c.set(left.saturating_sub(1));
            left == 1
        });
        if now {
            panic!("a panic injected in the middle of a change");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    #[test]
    fn each_worker_has_its_own_copy_and_the_main_thread_the_last() {
        let copies = PerWorker::new(3, || ());
        assert_eq!(copies.iter().count(), 4);
        let at = |w: usize| std::ptr::from_ref(copies.of(w));
        let distinct: std::collections::HashSet<_> = (0..4).map(at).collect();
        assert_eq!(distinct.len(), 4, "workers share a copy");
        assert_eq!(at(usize::MAX), at(3), "past the workers: the main thread's");
        assert_eq!(at(7), at(3));
        assert_eq!(std::ptr::from_ref(copies.main_thread()), at(3));
    }

    #[test]
    fn a_worker_holding_its_copy_does_not_block_another_worker() {
        let copies = PerWorker::new(2, || ());
        let _held = copies.of(0).lock();
        assert!(copies.of(1).state.try_lock().is_ok());
        assert!(copies.main_thread().state.try_lock().is_ok());
    }

    #[test]
    fn no_concurrency_still_has_a_worker_copy_and_the_main_threads() {
        assert_eq!(PerWorker::new(0, || ()).iter().count(), 2);
    }

    #[test]
    fn a_copy_a_panic_left_half_changed_is_dropped_and_rebuilt_not_reused() {
        let copy = Guarded::new(|| vec![1, 2]);
        copy.with(|v| v.push(3));
        let panicked = catch_unwind(AssertUnwindSafe(|| {
            copy.with(|v| {
                v.clear(); // half of a change
                #[allow(clippy::panic)]
                {
                    panic!("on purpose");
                }
            })
        }));
        assert!(panicked.is_err());
        assert_eq!(
            copy.with(|v| v.clone()),
            [1, 2],
            "the half-changed copy was reused"
        );
        assert_eq!(copy.rebuilt(), 1);
        assert_eq!(copy.with(|v| v.len()), 2);
        assert_eq!(copy.rebuilt(), 1, "a whole copy is kept");
    }

    #[test]
    fn the_injected_panic_comes_in_the_nth_use_on_its_thread_only() {
        let copy = Guarded::new(|| 0u32);
        inject::panic_in_use(2);
        copy.with(|n| *n += 1);
        let second = catch_unwind(AssertUnwindSafe(|| copy.with(|n| *n += 1)));
        assert!(second.is_err());
        assert_eq!(copy.with(|n| *n), 0, "rebuilt from the initial copy");
        copy.with(|n| *n += 1);
        assert_eq!(copy.with(|n| *n), 1, "one injection only");
    }
}
