//! Core of graceful-wasm: everything the three filters decide, with no
//! proxy-wasm dependency so it runs and is tested natively.
//!
//! - [`config`]: plugin configuration, parsed and validated.
//! - [`record`]: the instance record and the shutdown state machine.
//! - [`traffic`]: in-flight counters.
//! - [`store`]: the shared-data trait with the host's CAS semantics.
//! - [`status`], [`endpoints`]: what the drain filter answers.

pub mod config;
pub mod duration;
pub mod endpoints;
pub mod instance;
pub mod net;
pub mod record;
pub mod status;
pub mod steering;
pub mod store;
pub mod tombstone;
pub mod traffic;
