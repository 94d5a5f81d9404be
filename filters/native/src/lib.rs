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
//! | proxy-wasm shared data | [`host::STORE`], a mutex-guarded map with the same CAS semantics |
//! | metrics read through hostcalls (`graceful_provider_inflight`, `graceful_drain_phase`, ...) | [`host::METRICS`], SC atomics; the Envoy stats are kept as mirrors |
//! | a tick in every VM copy | one timer thread per drain or consumer config, waking the main thread through a config scheduler |
//! | a long-poll answered from the tick with `set_effective_context` | the tick commits the stream's own scheduler; the answer is sent on its worker |
//!
//! Each filter's callbacks are the core's (`graceful_core::<room>::filter`), over
//! the host in `host.rs`; `provider.rs`, `drain.rs` and `consumer.rs` hold
//! only what is this delivery's.
//!
//! Every hook catches panics and fails open (`hooks.rs`): the request goes
//! on as if the filter were not there; a copy of a filter's state a panic
//! left is rebuilt, never reused (`copies.rs`).
//!
//! The module runs only on the Envoy whose dynamic-module ABI it was built
//! against (`envoy_version.rs`). [`abi`] is public for its `compile_fail`
//! examples (`cargo test -p graceful-native --doc`), which show that the
//! safe handles refuse what would read memory Envoy freed.

pub mod abi;
mod clock;
mod consumer;
mod copies;
mod drain;
mod envoy_version;
#[cfg(test)]
mod fake_envoy;
#[cfg(test)]
mod glue_tests;
mod hooks;
mod host;
mod provider;
mod timer;
