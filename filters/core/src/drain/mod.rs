//! graceful_drain: [`filter`] (its callbacks), [`config`], [`record`] (the
//! instance record and the shutdown state machine), [`gate_copy`] (one copy's
//! evaluation of the gate), [`endpoints`] and [`status`] (what its
//! endpoints answer) and [`report`] (the drain report).
//!
//! The facade below is all a sibling room may import: graceful_provider
//! keeps long-lived streams with [`Waiters`] and feeds the report's samples
//! ([`PendingReport`]); graceful_consumer's tests read a peer identity.

pub mod config;
pub mod endpoints;
pub mod filter;
pub mod gate_copy;
pub mod record;
pub mod report;
pub mod status;

pub use endpoints::{without_query, Waiters};
pub use report::durations::SAMPLE_EVERY;
pub use report::peers::{is_consumer_identity, PeerId};
pub use report::{Inputs, PendingReport};
