//! Shared data: the emulator's own key/value store, written from
//! proxy-wasm-cpp-host's `SharedData` (what Envoy 1.40 runs), not taken
//! from `graceful-core`, so the ABI suites check the core's CAS handling
//! against an independent model. The rules:
//!
//! - every successful write gets a fresh, non-zero CAS from one counter
//!   for the whole process (every key, every VM copy), starting at 1 and
//!   skipping 0 when it wraps;
//! - a write with a non-zero CAS that differs from the stored one is
//!   refused ([`StoreError::CasMismatch`]) and changes nothing; CAS 0 is
//!   unconditional;
//! - a write to a key that does not exist never mismatches, whatever CAS it
//!   carries;
//! - there is no delete: an empty value is a value like any other, kept with
//!   its CAS (the hostcall hands it back as "no bytes").
//!
//! One namespace per [`Host`](crate::Host) (one Envoy process, one
//! `vm_id`). Also here: the [`Host`](crate::Host) methods that read and
//! write it from a test, and the injected compare-and-swap races.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use graceful_core::shared::store::{SharedStore, StoreError, Versioned};

use crate::world::{show, Race};
use crate::Host;

/// The process's shared-data namespace. The suites read and write it
/// through `graceful_core`'s [`SharedStore`] trait (so they can use the
/// core's decoders), but the rules are this type's own.
#[derive(Debug)]
pub struct SharedData {
    entries: RefCell<HashMap<String, (Vec<u8>, u32)>>,
    /// The CAS the next successful write gets (cpp-host's `cas_`).
    next_cas: Cell<u32>,
}

impl Default for SharedData {
    fn default() -> Self {
        SharedData::new()
    }
}

impl SharedData {
    /// An empty namespace; the first write gets CAS 1.
    pub fn new() -> SharedData {
        SharedData {
            entries: RefCell::new(HashMap::new()),
            next_cas: Cell::new(1),
        }
    }

    /// cpp-host's `nextCas`: hands out the counter and moves it on,
    /// skipping 0.
    fn next_cas(&self) -> u32 {
        let cas = self.next_cas.get();
        let mut next = cas.wrapping_add(1);
        if next == 0 {
            next = 1;
        }
        self.next_cas.set(next);
        cas
    }

    /// The value under `key` and its CAS, None if never written.
    pub fn read(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        self.entries.borrow().get(key).cloned()
    }

    /// True if `key` was ever written.
    pub fn contains(&self, key: &str) -> bool {
        self.entries.borrow().contains_key(key)
    }

    /// cpp-host's `SharedData::set`: see the module docs.
    pub fn write(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        let mut entries = self.entries.borrow_mut();
        match entries.get_mut(key) {
            Some(entry) => {
                if cas != 0 && cas != entry.1 {
                    return Err(StoreError::CasMismatch);
                }
                *entry = (value.to_vec(), self.next_cas());
            }
            None => {
                let cas = self.next_cas();
                entries.insert(key.to_string(), (value.to_vec(), cas));
            }
        }
        Ok(())
    }
}

impl SharedStore for SharedData {
    fn get(&self, key: &str) -> Result<Option<Versioned>, StoreError> {
        Ok(self.read(key))
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        self.write(key, value, cas)
    }
}

impl Host {
    /// The shared-data value under `key`, None if never set.
    pub fn shared_data(&self, key: &str) -> Option<Vec<u8>> {
        self.world.borrow().store.read(key).map(|(v, _)| v)
    }

    /// Writes a shared-data value unconditionally, as some other writer in
    /// the process could (e.g. to plant garbage).
    pub fn set_shared_data(&mut self, key: &str, value: &[u8]) {
        let mut w = self.world.borrow_mut();
        w.note("host", format!("shared data {key:?} = {}", show(value)));
        let _ = w.store.write(key, value, 0);
    }

    /// Runs `f` on the shared-data store (e.g. with `graceful_core`'s
    /// decoders, or to set up a record).
    pub fn with_store<R>(&self, f: impl FnOnce(&SharedData) -> R) -> R {
        f(&self.world.borrow().store)
    }

    /// Injects a compare-and-swap race: for the next `times` reads of `key`
    /// by any VM copy, `write` runs right after the read, as if another
    /// worker wrote in between; the reader's CAS then mismatches.
    pub fn race_after_read(
        &mut self,
        key: &str,
        times: usize,
        write: impl FnMut(&SharedData) + 'static,
    ) {
        self.world.borrow_mut().races.push(Race {
            key: key.to_string(),
            remaining: times,
            write: Box::new(write),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cas(store: &SharedData, key: &str) -> u32 {
        store
            .read(key)
            .map(|(_, cas)| cas)
            .unwrap_or_else(|| panic!("{key} missing"))
    }

    #[test]
    fn every_write_gets_a_fresh_nonzero_cas_from_one_counter() {
        let s = SharedData::new();
        s.write("a", b"1", 0).unwrap();
        assert_eq!(cas(&s, "a"), 1);
        s.write("b", b"1", 0).unwrap();
        assert_eq!(cas(&s, "b"), 2, "one counter for every key");
        s.write("a", b"2", 1).unwrap();
        assert_eq!(cas(&s, "a"), 3);
        s.write("a", b"2", 0).unwrap();
        assert_eq!(cas(&s, "a"), 4, "same bytes, fresh CAS");
        assert_eq!(s.read("a"), Some((b"2".to_vec(), 4)));
    }

    #[test]
    fn a_differing_nonzero_cas_mismatches_and_changes_nothing() {
        let s = SharedData::new();
        s.write("k", b"old", 0).unwrap();
        assert_eq!(s.write("k", b"new", 7), Err(StoreError::CasMismatch));
        assert_eq!(s.read("k"), Some((b"old".to_vec(), 1)));
        // The refused write took no CAS.
        s.write("other", b"x", 0).unwrap();
        assert_eq!(cas(&s, "other"), 2);
    }

    #[test]
    fn the_stored_cas_or_zero_succeeds() {
        let s = SharedData::new();
        s.write("k", b"v1", 0).unwrap();
        let c = cas(&s, "k");
        s.write("k", b"v2", c).unwrap();
        assert_eq!(
            s.write("k", b"v3", c),
            Err(StoreError::CasMismatch),
            "now stale"
        );
        s.write("k", b"v3", 0).unwrap();
        assert_eq!(s.read("k").map(|(v, _)| v), Some(b"v3".to_vec()));
    }

    #[test]
    fn a_write_to_a_missing_key_never_mismatches() {
        let s = SharedData::new();
        for (i, c) in [0u32, 1, 42, u32::MAX].into_iter().enumerate() {
            let key = format!("k{i}");
            assert!(!s.contains(&key));
            s.write(&key, b"v", c).unwrap();
            assert_eq!(s.read(&key).map(|(v, _)| v), Some(b"v".to_vec()));
        }
    }

    #[test]
    fn no_delete_an_empty_value_is_kept_with_its_cas() {
        let s = SharedData::new();
        s.write("k", b"v", 0).unwrap();
        s.write("k", b"", 0).unwrap();
        assert!(s.contains("k"));
        assert_eq!(s.read("k"), Some((Vec::new(), 2)));
        assert_eq!(
            s.write("k", b"w", 1),
            Err(StoreError::CasMismatch),
            "still guarded"
        );
        assert_eq!(s.get("never").unwrap(), None);
    }

    #[test]
    fn the_counter_skips_zero_when_it_wraps() {
        let s = SharedData::new();
        s.next_cas.set(u32::MAX);
        s.write("a", b"", 0).unwrap();
        assert_eq!(cas(&s, "a"), u32::MAX);
        s.write("a", b"", 0).unwrap();
        assert_eq!(cas(&s, "a"), 1);
    }

    #[test]
    fn the_core_trait_sees_the_same_rules() {
        let s = SharedData::new();
        let store: &dyn SharedStore = &s;
        store.set("k", b"v", 9).unwrap();
        assert_eq!(store.get("k").unwrap(), Some((b"v".to_vec(), 1)));
        assert_eq!(store.set("k", b"w", 9), Err(StoreError::CasMismatch));
    }
}
