//! The shared-data store behind a small trait, so the bookkeeping that must be
//! exact across Envoy's worker threads is tested natively, races included.
//!
//! Semantics follow proxy-wasm-cpp-host (what Envoy 1.40 runs):
//! - every successful set gets a fresh, non-zero CAS from one global counter;
//! - a set with a non-zero CAS that differs from the stored one fails with
//!   [`StoreError::CasMismatch`]; CAS 0 is unconditional;
//! - **a set on a key that does not exist never mismatches**, whatever CAS it
//!   carries, so "absent" must not be used as a value that two writers race on;
//! - nothing is ever deleted: keys live as long as the VM id's namespace.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::{Mutex, MutexGuard};

/// What a store operation can fail with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// Someone else wrote the key since we read it: read again and retry.
    CasMismatch,
    /// The host refused for another reason (status code as the host gave it).
    Host(u32),
}

/// A value and the CAS it was stored with.
pub type Versioned = (Vec<u8>, u32);

/// Process-wide key/value store with compare-and-swap (proxy-wasm shared data).
pub trait SharedStore {
    /// The value and its CAS, or None if the key was never set.
    fn get(&self, key: &str) -> Result<Option<Versioned>, StoreError>;
    /// Stores `value` if `cas` is 0 or matches the stored CAS (see module docs).
    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError>;
}

/// An in-memory store with the host's exact CAS semantics, for tests and the
/// emulated host. Not thread-safe: tests interleave "workers" explicitly.
#[derive(Default)]
pub struct MemStore {
    entries: RefCell<HashMap<String, Versioned>>,
    next_cas: Cell<u32>,
}

impl MemStore {
    pub fn new() -> Self {
        Self::default()
    }
}

impl SharedStore for MemStore {
    fn get(&self, key: &str) -> Result<Option<Versioned>, StoreError> {
        Ok(self.entries.borrow().get(key).cloned())
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        let mut entries = self.entries.borrow_mut();
        if let Some((_, stored)) = entries.get(key) {
            if cas != 0 && cas != *stored {
                return Err(StoreError::CasMismatch);
            }
        }
        // Wrapping skips 0: the host never hands out a zero CAS.
        let next = self.next_cas.get().wrapping_add(1).max(1);
        self.next_cas.set(next);
        entries.insert(key.to_string(), (value.to_vec(), next));
        Ok(())
    }
}

/// Shared data with proxy-wasm-cpp-host's semantics (see
/// `graceful_core::shared::store`): a fresh non-zero CAS per successful set, a
/// mismatching non-zero CAS fails, CAS 0 and a missing key always succeed.
pub struct SyncStore {
    entries: Mutex<Option<HashMap<String, Versioned>>>,
    next_cas: AtomicU32,
}

impl SyncStore {
    pub const fn new() -> SyncStore {
        SyncStore {
            entries: Mutex::new(None),
            next_cas: AtomicU32::new(0),
        }
    }

    /// The map, locked. No caller's code runs under this lock ([`update`]'s
    /// change runs between a `get` and a `set`), and no operation can panic
    /// once it has changed anything: a read clones, a write prepares its key
    /// and value first, then compares and makes one insert. So a panic that
    /// poisoned the lock (inside the map's own code, before any change)
    /// left the map whole: its poison is cleared, and the map kept. Unlike
    /// a copy of a filter's state, the map cannot be rebuilt: it is the
    /// shared data every copy is rebuilt from. What spans several keys is
    /// made to survive a writer that stops between two of them (a wasm VM
    /// can trap there too).
    fn entries(&self) -> MutexGuard<'_, Option<HashMap<String, Versioned>>> {
        self.entries.lock().unwrap_or_else(|poisoned| {
            self.entries.clear_poison();
            poisoned.into_inner()
        })
    }
}

impl Default for SyncStore {
    fn default() -> Self {
        SyncStore::new()
    }
}

impl SharedStore for SyncStore {
    fn get(&self, key: &str) -> Result<Option<Versioned>, StoreError> {
        Ok(self.entries().as_ref().and_then(|m| m.get(key).cloned()))
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        // Prepared before the lock: under it, only the compare and the insert.
        let (key, value) = (key.to_string(), value.to_vec());
        let mut entries = self.entries();
        let map = entries.get_or_insert_with(HashMap::new);
        if let Some((_, stored)) = map.get(&key) {
            if cas != 0 && cas != *stored {
                return Err(StoreError::CasMismatch);
            }
        }
        // Wrapping skips 0: a zero CAS means "unconditional".
        let mut next = self.next_cas.fetch_add(1, SeqCst).wrapping_add(1);
        if next == 0 {
            next = self.next_cas.fetch_add(1, SeqCst).wrapping_add(1);
        }
        map.insert(key, (value, next));
        Ok(())
    }
}

/// How many times a read-modify-write is retried on CAS mismatch before it
/// gives up. Every mismatch means another worker's write succeeded, so the
/// system as a whole always progresses; losing this many times in a row needs
/// that many concurrent writers on one key, far beyond Envoy's worker counts.
pub const MAX_CAS_ATTEMPTS: usize = 32;

/// Why a read-modify-write gave up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpdateError {
    /// [`MAX_CAS_ATTEMPTS`] mismatches in a row.
    Contended,
    Host(u32),
}

/// Reads `key`, applies `change` and writes the result back with CAS,
/// retrying on mismatch at most [`MAX_CAS_ATTEMPTS`] times. `change` receives
/// the current bytes (None if the key was never set) and returns the new
/// value, or None to leave the key as it is, plus anything the caller wants
/// back. It may run several times, so it must be pure.
pub fn update<T>(
    store: &dyn SharedStore,
    key: &str,
    mut change: impl FnMut(Option<&[u8]>) -> (Option<Vec<u8>>, T),
) -> Result<T, UpdateError> {
    for _ in 0..MAX_CAS_ATTEMPTS {
        let current = store.get(key).map_err(UpdateError::from)?;
        let (bytes, cas) = match &current {
            Some((bytes, cas)) => (Some(bytes.as_slice()), *cas),
            // Absent key: the host ignores CAS, so this write is unconditional.
            // Callers initialise their keys from the root context before any
            // stream runs (see `ensure`) so that this branch is not raced.
            None => (None, 0),
        };
        let (value, out) = change(bytes);
        let Some(value) = value else { return Ok(out) };
        match store.set(key, &value, cas) {
            Ok(()) => return Ok(out),
            Err(StoreError::CasMismatch) => continue,
            Err(e) => return Err(UpdateError::from(e)),
        }
    }
    Err(UpdateError::Contended)
}

/// Writes `initial` under `key` only if the key has never been set. Run from
/// the root context at configure time: Envoy configures the main-thread VM
/// before any worker VM serves a stream, so no counting write can race it.
pub fn ensure(store: &dyn SharedStore, key: &str, initial: &[u8]) -> Result<(), StoreError> {
    if store.get(key)?.is_none() {
        store.set(key, initial, 0)?;
    }
    Ok(())
}

/// [`ensure`] for each `(key, initial)` in turn, from `on_configure`: every
/// key that streams or ticks update must exist before they run. The first
/// failure comes back with its key.
pub fn ensure_all<'a>(
    store: &dyn SharedStore,
    keys: &'a [(&'a str, Vec<u8>)],
) -> Result<(), (&'a str, StoreError)> {
    for (key, initial) in keys {
        ensure(store, key, initial).map_err(|e| (*key, e))?;
    }
    Ok(())
}

/// Adds `delta` to the little-endian u64 counter at `key`, unless the result
/// would exceed `max`: then nothing is written and None comes back. The
/// counter never goes below zero. A missing or malformed value counts as 0.
pub fn add_bounded(
    store: &dyn SharedStore,
    key: &str,
    delta: i64,
    max: u64,
) -> Result<Option<u64>, UpdateError> {
    update(store, key, |bytes| {
        let current = bytes.and_then(read_u64).unwrap_or(0);
        let next = current.saturating_add_signed(delta);
        if delta > 0 && next > max {
            (None, None)
        } else {
            (Some(next.to_le_bytes().to_vec()), Some(next))
        }
    })
}

/// A lease for work that one VM copy of the process should do at a time
/// (ticks fire in every worker's VM and on the main thread). The caller that
/// finds the lease due moves its due time `interval` ahead and gets true.
pub fn take_lease(
    store: &dyn SharedStore,
    key: &str,
    now_us: u64,
    interval_us: u64,
) -> Result<bool, UpdateError> {
    update(store, key, |bytes| {
        let due = bytes.and_then(read_u64).unwrap_or(0);
        if now_us < due {
            (None, false)
        } else {
            (
                Some(now_us.saturating_add(interval_us).to_le_bytes().to_vec()),
                true,
            )
        }
    })
}

/// Reads an 8-byte little-endian u64; None for any other length.
/// FNV-1a of `bytes`: a hash stable across VM copies, workers and builds,
/// for values kept in shared data (a dropped peer, a logged notice).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

pub fn read_u64(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

impl From<StoreError> for UpdateError {
    fn from(e: StoreError) -> UpdateError {
        match e {
            StoreError::Host(code) => UpdateError::Host(code),
            StoreError::CasMismatch => UpdateError::Contended,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ensure_all_creates_missing_keys_and_keeps_existing_ones() {
        let store = MemStore::new();
        store.set("a", b"kept", 0).unwrap();
        let keys = [("a", b"new".to_vec()), ("b", b"initial".to_vec())];
        ensure_all(&store, &keys).unwrap();
        assert_eq!(store.get("a").unwrap().unwrap().0, b"kept");
        assert_eq!(store.get("b").unwrap().unwrap().0, b"initial");
    }

    #[test]
    fn set_on_existing_key_checks_cas() {
        let store = MemStore::new();
        store.set("k", b"a", 0).unwrap();
        let (_, cas) = store.get("k").unwrap().unwrap();
        store.set("k", b"b", cas).unwrap();
        assert_eq!(store.set("k", b"c", cas), Err(StoreError::CasMismatch));
        assert_eq!(store.get("k").unwrap().unwrap().0, b"b");
    }

    #[test]
    fn set_on_absent_key_ignores_cas_like_the_host() {
        let store = MemStore::new();
        store.set("k", b"a", 12345).unwrap();
        assert_eq!(store.get("k").unwrap().unwrap().0, b"a");
    }

    #[test]
    fn cas_values_are_never_zero_and_always_change() {
        let store = MemStore::new();
        let mut seen = Vec::new();
        for _ in 0..5 {
            store.set("k", b"x", 0).unwrap();
            seen.push(store.get("k").unwrap().unwrap().1);
        }
        assert!(seen.iter().all(|&c| c != 0));
        seen.dedup();
        assert_eq!(seen.len(), 5);
    }

    #[test]
    fn ensure_writes_once() {
        let store = MemStore::new();
        ensure(&store, "k", b"first").unwrap();
        ensure(&store, "k", b"second").unwrap();
        assert_eq!(store.get("k").unwrap().unwrap().0, b"first");
    }

    /// A store that never lets a CAS write through: every set mismatches.
    struct AlwaysContended(MemStore);
    impl SharedStore for AlwaysContended {
        fn get(&self, key: &str) -> Result<Option<Versioned>, StoreError> {
            self.0.get(key)
        }
        fn set(&self, _: &str, _: &[u8], _: u32) -> Result<(), StoreError> {
            Err(StoreError::CasMismatch)
        }
    }

    #[test]
    fn update_gives_up_after_bounded_attempts() {
        let store = AlwaysContended(MemStore::new());
        let mut calls = 0;
        let got = update(&store, "k", |_| {
            calls += 1;
            (Some(vec![1]), ())
        });
        assert_eq!(got, Err(UpdateError::Contended));
        assert_eq!(calls, MAX_CAS_ATTEMPTS);
    }

    #[test]
    fn update_that_returns_none_writes_nothing() {
        let store = MemStore::new();
        store.set("k", b"v", 0).unwrap();
        let cas = store.get("k").unwrap().unwrap().1;
        update(&store, "k", |_| (None, ())).unwrap();
        assert_eq!(store.get("k").unwrap().unwrap().1, cas);
    }

    #[test]
    fn add_bounded_counts_and_refuses_past_the_bound() {
        let store = MemStore::new();
        assert_eq!(add_bounded(&store, "n", 1, 2), Ok(Some(1)));
        assert_eq!(add_bounded(&store, "n", 1, 2), Ok(Some(2)));
        assert_eq!(add_bounded(&store, "n", 1, 2), Ok(None));
        assert_eq!(add_bounded(&store, "n", -1, 2), Ok(Some(1)));
        assert_eq!(
            add_bounded(&store, "n", -5, 2),
            Ok(Some(0)),
            "never below zero"
        );
    }

    #[test]
    fn lease_goes_to_one_caller_per_interval() {
        let store = MemStore::new();
        assert_eq!(take_lease(&store, "l", 1_000, 500), Ok(true));
        assert_eq!(
            take_lease(&store, "l", 1_000, 500),
            Ok(false),
            "a second copy at the same time"
        );
        assert_eq!(take_lease(&store, "l", 1_499, 500), Ok(false));
        assert_eq!(take_lease(&store, "l", 1_500, 500), Ok(true));
    }
}

#[cfg(test)]
mod sync_store_tests {
    use super::*;

    #[test]
    fn the_store_has_the_hosts_cas_semantics() {
        let s = SyncStore::new();
        assert_eq!(s.get("k"), Ok(None));
        // A missing key never mismatches, whatever CAS is given.
        s.set("k", b"a", 77).unwrap();
        let (v, cas) = s.get("k").unwrap().unwrap();
        assert_eq!(v, b"a");
        assert_ne!(cas, 0);
        assert_eq!(s.set("k", b"b", cas + 1), Err(StoreError::CasMismatch));
        s.set("k", b"b", cas).unwrap();
        let (v, cas2) = s.get("k").unwrap().unwrap();
        assert_eq!((v.as_slice(), cas2 != cas), (&b"b"[..], true));
        // CAS 0 is unconditional.
        s.set("k", b"c", 0).unwrap();
        assert_eq!(s.get("k").unwrap().unwrap().0, b"c");
    }

    #[test]
    fn a_panic_in_an_updates_change_leaves_the_store_unchanged_and_unpoisoned() {
        let s = SyncStore::new();
        s.set("n", &7u64.to_le_bytes(), 0).unwrap();
        let before = s.get("n").unwrap();
        let panicked = std::panic::catch_unwind(|| {
            update(&s, "n", |_| -> (Option<Vec<u8>>, ()) {
                panic!("on purpose")
            })
        });
        assert!(panicked.is_err());
        assert!(
            !s.entries.is_poisoned(),
            "the change ran under the store's lock"
        );
        assert_eq!(s.get("n").unwrap(), before);
    }

    #[test]
    fn a_lock_poisoned_by_a_panic_before_any_change_keeps_the_whole_map() {
        let s = SyncStore::new();
        s.set("n", b"kept", 0).unwrap();
        let _ = std::panic::catch_unwind(|| {
            let _held = s.entries.lock().unwrap();
            panic!("on purpose, holding the lock, before any change");
        });
        assert!(s.entries.is_poisoned());
        assert_eq!(s.get("n").unwrap().unwrap().0, b"kept");
        assert!(!s.entries.is_poisoned(), "the poison is cleared once seen");
        let (_, cas) = s.get("n").unwrap().unwrap();
        s.set("n", b"next", cas).unwrap();
        assert_eq!(s.get("n").unwrap().unwrap().0, b"next");
    }

    #[test]
    fn racing_read_modify_writes_lose_nothing() {
        // Four threads in a tight loop may exhaust the CAS attempts (an
        // honest "contended"); every add that succeeded must be counted.
        let s = std::sync::Arc::new(SyncStore::new());
        crate::shared::store::ensure(&*s, "n", &0u64.to_le_bytes()).unwrap();
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    (0..500)
                        .filter(|_| {
                            crate::shared::store::add_bounded(&*s, "n", 1, u64::MAX).is_ok()
                        })
                        .count() as u64
                })
            })
            .collect();
        let done: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        let (v, _) = s.get("n").unwrap().unwrap();
        assert!(done > 0);
        assert_eq!(crate::shared::store::read_u64(&v), Some(done));
    }
}
