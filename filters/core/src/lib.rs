//! Core of graceful-wasm: everything the three filters decide, with no
//! proxy-wasm dependency so it runs and is tested natively. The filter
//! crates (`filters/provider`, `filters/drain`, `filters/consumer`) and the
//! native module (`filters/native`) are glue: they read what Envoy gives
//! them, call in here, and carry out the answer.
//!
//! One room per filter, each holding its config, state, behaviour and
//! tests, and one room for what they all use (docs/architecture.md says
//! what each room may import; `tools/check_core_layout.py` in `make lint`
//! enforces it):
//! - [`provider`]: graceful_provider (admission, the closing mark, the
//!   report's samples).
//! - [`drain`]: graceful_drain (the instance record, the gate's evaluation,
//!   the endpoints and their status JSON).
//! - [`consumer`]: graceful_consumer (tombstones, steering, the decisions
//!   per stream and per tick).
//! - [`shared`]: host traits and the mock host, shared data (store, keys),
//!   the metrics registry and the gate's stats protocol, durations, net,
//!   headers, the instance id, the config error type and validators.
//! - [`initial`]: what each shared-data key starts as; it names every
//!   room's codec, so it sits above the rooms.

#[cfg(test)]
mod config_tests;
pub mod consumer;
pub mod drain;
pub mod initial;
pub mod provider;
pub mod shared;
pub mod version;
