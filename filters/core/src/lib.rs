//! Core of graceful-wasm: everything the three filters decide, with no
//! proxy-wasm dependency so it runs and is tested natively. The filter
//! crates (`filters/provider`, `filters/drain`, `filters/consumer`) are
//! glue: they read what Envoy gives them, call in here, and carry out the
//! answer.
//!
//! Configuration and text formats:
//! - [`config`]: the three plugin configurations, parsed and validated (one
//!   file per filter, the shared error type and validators in `config/mod.rs`).
//! - [`duration`]: durations written with a unit (`"250ms"`, `"1m30s"`).
//! - [`net`]: CIDR ranges and `ip:port` source addresses.
//! - [`headers`]: every header name the filters use that is not configurable.
//!
//! Shared data (state every VM copy of an Envoy process sees):
//! - [`store`]: the shared-data trait with the host's CAS semantics.
//! - [`keys`]: every shared-data key and its encoding; [`initial`]: what
//!   each starts as.
//! - [`record`]: the instance record (phase, closing and drained times) and
//!   the shutdown state machine with its drain gate.
//! - [`instance`]: the instance id, one per Envoy process.
//! - [`tombstone`]: the hosts a consumer must not send new requests to.
//!
//! Envoy stats (process-wide atomics, the cheapest shared state):
//! - [`gate`]: admission, the in-flight counts and the drain gate's
//!   protocol without compare-and-swap.
//!
//! Metrics:
//! - [`metrics`]: every Envoy metric the filters define (name, kind,
//!   writer, readers).
//!
//! What each filter decides:
//! - [`drain`]: one graceful_drain copy's evaluation of the gate.
//! - [`status`], [`endpoints`]: what graceful_drain's endpoints answer.
//! - [`report`]: the drain report (who kept sending after closing, request
//!   durations, recommended settings).
//! - [`consumer`]: graceful_consumer's decisions per stream and per tick.
//! - [`steering`]: steering requests away from tombstoned hosts (cluster
//!   membership, the routed clusters, each request's plan, probes of
//!   tombstoned hosts).
//!
//! The filters' callbacks, once for both deliveries:
//! - [`filter`]: each filter over small host traits ([`filter::host`]),
//!   which the wasm glue and the native module implement.

pub mod config;
pub mod consumer;
pub mod drain;
pub mod duration;
pub mod endpoints;
pub mod filter;
pub mod gate;
pub mod headers;
pub mod initial;
pub mod instance;
pub mod keys;
pub mod metrics;
pub mod net;
pub mod record;
pub mod report;
pub mod status;
pub mod steering;
pub mod store;
pub mod tombstone;
