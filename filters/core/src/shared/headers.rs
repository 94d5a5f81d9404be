//! Every header name the filters read or write that is not configurable.
//! The configurable ones have their defaults in [`crate::shared::config`] (listed
//! here for reference, not moved): [`crate::provider::config::DEFAULT_CLOSING_HEADER`],
//! [`crate::provider::config::DEFAULT_INSTANCE_HEADER`],
//! [`crate::consumer::config::DEFAULT_CLOSING_HEADERS`] and
//! [`crate::consumer::config::DEFAULT_OVERRIDE_HOST_HEADER`].

/// Response header in which graceful_drain echoes the address (`ip:port`)
/// it was reached at, so a consumer's probe can tell the probed host from a
/// fallback that override_host chose instead.
pub const ADDRESS: &str = "x-graceful-address";
/// Response header the consumer's upstream instance adds for a while after
/// it wrote a tombstone, and the listener instance removes: on Envoy 1.36
/// to 1.38 the upstream instance's change signal lives in the cluster's
/// stats scope, so the listener would learn of the write only at its next
/// tick. Seeing it makes the listener look at the shared tombstones at once
/// (so a forged one costs a shared-data read, nothing more).
pub const SIGNAL: &str = "x-graceful-consumer-signal";
/// Envoy's own mark for active health checkers (it evicts a host only
/// with active health checking configured on the cluster), added
/// while closing when `immediate_health_check_fail` is set.
pub const IMMEDIATE_HC_FAIL: &str = "x-envoy-immediate-health-check-fail";
/// The client's address chain, read to find the trusted peer of a closing
/// request (see [`crate::shared::net::trusted_peer_ip`]).
pub const FORWARDED_FOR: &str = "x-forwarded-for";
pub const CONTENT_TYPE: &str = "content-type";

/// HTTP/2 pseudo-headers, as proxy-wasm exposes them for every protocol.
pub const STATUS: &str = ":status";
pub const PATH: &str = ":path";
pub const METHOD: &str = ":method";
/// An upgrade request's (WebSocket; Envoy shows an HTTP/2 extended CONNECT
/// to filters in this form too).
pub const UPGRADE: &str = "upgrade";
pub const AUTHORITY: &str = ":authority";

/// The `:authority` of calls to Envoy's admin through an admin cluster.
pub const ADMIN_AUTHORITY: &str = "envoy-admin";
