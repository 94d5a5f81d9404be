//! graceful_consumer: [`filter`] (its callbacks), [`config`],
//! [`decisions`] (what it decides per stream and per tick), [`steering`]
//! (cluster membership, each request's plan, probes), [`tombstone`]
//! (the hosts it must not send new requests to) and [`front`] (the
//! front-proxy role's per-host state: not wired to a config or the glue
//! yet).
//!
//! Its facade for sibling rooms is empty: no other room needs it.

pub mod config;
pub mod decisions;
pub mod filter;
pub mod front;
pub mod steering;
pub mod tombstone;
