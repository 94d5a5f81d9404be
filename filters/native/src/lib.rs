//! graceful-native: graceful_provider, graceful_consumer and graceful_drain as one Envoy
//! dynamic module (`dist/libgraceful.so`, ABI v0.2.0, Envoy 1.40). The
//! same core decides everything (`graceful_core`: the JSON configs, the
//! gate protocol, the instance record, the endpoints' answers); this crate
//! is the glue to Envoy's C ABI.
//!
//! Where the wasm build needs Envoy's help, the native one has it for free:
//! Envoy loads one copy of a module per process, so its statics are shared
//! by every worker thread.
//!
//! | wasm build | native build |
//! |---|---|
//! | proxy-wasm shared data | [`STORE`], a mutex-guarded map with the same CAS semantics |
//! | the gate stats (`graceful_provider_inflight`, ...), read through hostcalls | [`COUNTS`], SC atomics; the Envoy stats are kept as mirrors |
//! | `graceful_drain_phase` read on every response | [`PHASE`], an atomic; mirrored to the gauge |
//! | a tick in every VM copy | one timer thread per drain config, waking the main thread through a config scheduler |
//! | a long-poll answered from the tick with `set_effective_context` | the tick commits the stream's own scheduler; the answer is sent on its worker |
//!
//! Every hook catches panics and fails open (`hooks.rs`): the request goes
//! on as if the filter were not there.

mod abi;
mod consumer;
mod drain;
mod hooks;
mod log;
mod provider;

use graceful_core::drain::AtomicPhase;
use graceful_core::gate::AtomicStats;
use graceful_core::store::SyncStore;

/// The process's shared data (the wasm build's `vm_id: graceful`).
pub static STORE: SyncStore = SyncStore::new();
/// The drain gate's stats.
pub static COUNTS: AtomicStats = AtomicStats::new();
/// `graceful_drain_phase`.
pub static PHASE: AtomicPhase = AtomicPhase::new();

/// Takes a lock whatever a panic (caught at a hook) left: every change the
/// module makes under a lock is one step, so the data is whole.
pub fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The wall clock in µs since the Unix epoch.
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Entropy for instance ids: std's per-process random hasher keys.
pub fn entropy() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(now_us());
    h.finish()
}
