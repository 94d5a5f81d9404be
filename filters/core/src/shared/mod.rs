//! What every filter room uses and no filter owns. A module here imports
//! only other modules here, never a filter room.
//!
//! | module | holds |
//! |---|---|
//! | [`host`] | the host traits every filter's callbacks are written over; `mock` implements them for unit tests |
//! | [`store`] | the shared-data trait with the host's CAS semantics |
//! | [`keys`] | every shared-data key and its encoding |
//! | [`metrics`] | every Envoy metric the filters define, and the `Metrics` and `PhaseGauge` traits over them |
//! | [`gate`] | admission, the in-flight counts and the drain gate's protocol without compare-and-swap |
//! | [`instance`] | the instance id, one per Envoy process |
//! | [`config`] | the config error type, reading JSON into a DTO, the shared validators |
//! | [`duration`] | durations written with a unit (`"250ms"`, `"1m30s"`) |
//! | [`net`] | CIDR ranges and `ip:port` source addresses |
//! | [`headers`] | every header name the filters use that is not configurable |

pub mod config;
pub mod duration;
pub mod gate;
pub mod headers;
pub mod host;
pub mod instance;
pub mod keys;
pub mod metrics;
#[cfg(test)]
pub mod mock;
pub mod net;
pub mod store;
