//! Each filter's callbacks, written once over the host traits of [`host`]:
//! the proxy-wasm glue (`filters/{provider,drain,consumer}`, over
//! `filters/guest`) and the native module (`filters/native`) implement
//! those traits and forward Envoy's callbacks here. What is truly one
//! delivery's stays in it: the native module's timer threads, schedulers,
//! per-worker copies and request ids; the wasm build's VM contexts.
//!
//! | module | filter | state |
//! |---|---|---|
//! | [`provider`] | graceful_provider | [`provider::Provider`] per config, [`provider::ProviderStream`] per stream |
//! | [`drain`] | graceful_drain | [`drain::Drain`] per config, [`drain::DrainState`] per VM copy (native: per config) |
//! | [`consumer`] | graceful_consumer | [`consumer::ConsumerFilter`] per config, [`crate::consumer::Consumer`] per VM copy (native: per worker), [`consumer::ConsumerStream`] per stream |
//!
//! Unit tests run every callback against [`mock`], a host that records
//! what a filter asked of it.

pub mod consumer;
pub mod drain;
pub mod host;
#[cfg(test)]
pub mod mock;
pub mod provider;

/// Entropy for instance ids: std's per-process random hasher keys (seeded
/// from the OS natively, from WASI `random_get` in a VM), mixed with `seed`.
pub fn entropy(seed: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(seed);
    h.finish()
}

/// The process's instance id, agreed with every other VM copy (and filter)
/// through shared data at configure time; if the store refuses, this copy's
/// own, logged.
pub fn agreed_instance_id(h: &impl host::Host) -> String {
    // The wall clock: a monotonic one may read alike in two processes.
    let now = h.wall_clock_us();
    let candidate = crate::instance::generate(now, entropy(now));
    match crate::instance::agree(h.store(), &candidate) {
        Ok(id) => id,
        Err(e) => {
            h.log(
                host::Level::Warn,
                &format!("instance id not shared ({e:?}); using {candidate}"),
            );
            candidate
        }
    }
}
