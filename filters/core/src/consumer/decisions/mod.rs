//! The consumer filter's decisions, over [`SharedStore`](crate::shared::store::SharedStore) and a small view
//! of one stream ([`Exchange`]), so they run and are tested natively; the
//! proxy-wasm glue reads what the view asks for and carries out the
//! [`Effect`]s, header writes and [`Call`]s that come back.
//!
//! Per stream (see [`Consumer::steer`], [`Consumer::observe_response`],
//! [`Consumer::connect_failed`]): while the target cluster has live
//! tombstones, name the acceptable hosts for Envoy's `override_host`
//! policy; on the response, a closing mark or a connect failure tombstones
//! the host that answered, and an answer from a new instance at a
//! tombstoned address readmits it. Every worker steers by the same shared
//! tombstones.
//!
//! # The per-request protocol
//!
//! Envoy charges about 1 µs per VM entry and 0.1–2.3 µs per hostcall (a
//! call that returns data makes the host call back into the guest to
//! allocate), so what a request reads is the filter's cost. An ordinary
//! request (no live tombstone) through the listener's instance:
//!
//! | callback | hostcalls |
//! |---|---|
//! | request headers | remove the client's override header; `graceful_consumer_inflight` +1; `graceful_consumer_started` +1; read `graceful_consumer_generation` |
//! | response headers | one `get_header_map_pairs`, scanned in the guest ([`Response::scan`]) for the closing headers, `:status` and the instance header; without the admin's membership, `upstream.address` and the clock too (a membership observation) |
//! | done | `graceful_consumer_inflight` −1 |
//!
//! The upstream instance (one stream per attempt) removes the override
//! header in request headers and reads the response's pairs; nothing else
//! unless something happens.
//!
//! The front role (`front` configured) adds, per request: in the listener
//! instance, the grace count (`graceful_front_epoch` read and a slot +1 in
//! request headers, the slot −1 at response headers or the end:
//! `front/grace.rs`); in the upstream instance, the watch
//! ([`Consumer::watched`]): `graceful_consumer_generation` read, and
//! `upstream.address` and the clock only while the cached tombstones may
//! hold a live announced entry (their latest expiry, as for the clock
//! below) or the admin's membership lists a member `DRAINING`; an attempt
//! at such a host reads the front's table (is the host acknowledged? then
//! it is late, one write). A sidecar consumer pays none of it.
//!
//! What is read only when something is happening, and why skipping it
//! otherwise is safe:
//!
//! - **Shared data** is read only when `graceful_consumer_generation` moved
//!   since this VM copy last looked. Every write another copy must see (the
//!   tombstones, the admin membership, the observed membership) bumps that
//!   counter *after* the shared-data write (the [`Effect::Add`] of
//!   [`Metric::ConsumerGeneration`] the write returns; Envoy counters are
//!   process-wide atomics, so a reader that sees the bump sees the write).
//!   The counter is read before any shared data, so a copy that saw it
//!   unchanged has every write made before that read. A tombstone written
//!   by one worker therefore steers every worker from its next request.
//!   When it moved, the generation key beside each value ([`crate::shared::keys`])
//!   says which value to decode again, as before. The counter counts bumps
//!   exactly, so when it moved by just this copy's own bumps no other copy
//!   wrote, and nothing is read (this copy keeps its own writes: it decodes
//!   its tombstone writes at once and reads the membership it wrote when
//!   steering next needs it). If the counter cannot be read, every request
//!   checks the generation keys (the old protocol).
//! - **The clock** is read only while the cached tombstone list may hold a
//!   live entry: the list's latest expiry, once passed, stays passed (a
//!   tombstone never comes back to life without a write, which bumps the
//!   generation and is decoded again).
//! - **The route's cluster** and the steering plan only while tombstones
//!   may be live, or the admin's membership lists a member `DRAINING`
//!   (a flag worked out once per change of that membership; such a
//!   cluster is steered with no tombstone) (the plan is kept until a generation it was made from
//!   moves or a tombstone in it expires, so a steered request costs a
//!   rotation, not a scan; where the admin lists the cluster, observed
//!   membership is not one of those generations).
//! - **`upstream.address`, the cluster, the clock** on a response only for
//!   a closing mark; a 503 (then `response.flags` first, for a connect
//!   failure); a response while tombstones may be live (is it a tombstoned
//!   host answering with a new instance id? A steered request normally went
//!   to one that is not, but `override_host` falls back to its own pick
//!   when the listed hosts are unavailable: the check is a lookup in the
//!   cached list once the address is read), unless it carries no instance
//!   id (then it can readmit nothing) and the admin's membership lists the
//!   route's cluster (then answers do not shape the plan): such a steered
//!   answer is taken as an ordinary one; or a sampled membership
//!   observation.
//! - **Membership observations**: while steering would take membership
//!   from observations (no `admin_cluster`, or none of its answers read
//!   yet), every response is one, so the observed set holds every host the
//!   balancer picked, whichever copy it answered, and a steered request
//!   never narrows below it (sampling them once piled a worker's traffic
//!   onto the one host it had seen). An address this copy recorded less
//!   than [`RECORD_EVERY_US`] ago costs the `upstream.address` read and the
//!   clock; the cluster is read to record it. The shared observed
//!   membership keeps when each member last answered (written again once
//!   that is [`crate::consumer::steering::SEEN_REFRESH_US`] old), and steering lists
//!   the members seen within [`crate::consumer::steering::OBSERVED_WINDOW_US`], so an
//!   address that left the cluster leaves the list. Once the
//!   admin's membership is known, one response in [`OBSERVE_EVERY`] is
//!   observed (it registers the route's cluster for the refresh), and
//!   every response while tombstones may be live, but for a steered
//!   answer without an instance id to a cluster the admin lists (sampled
//!   as an ordinary one: the plan takes that cluster's members from the
//!   admin). What steering cannot
//!   see without an admin: a host the balancer has not picked yet (one
//!   added to the cluster while steering pins requests elsewhere).
//! - **The upstream instance** reads `upstream.address` only when an
//!   attempt answered closing, or at its end (`on_delete`) when it got no response
//!   headers and Envoy recorded a transport failure.
//!
//! The outbound in-flight count is Envoy stats, not shared data: the gauge
//! `graceful_consumer_inflight` (+1 in request headers, −1 at the stream's end,
//! exactly once per counted stream) and the counter
//! `graceful_consumer_started`, both process-wide atomics that graceful_drain
//! on the same Envoy reads with `get_metric` for its gate (in flight) and
//! quiet window (a start moved it). The glue refuses to configure if
//! Envoy's `stats_matcher` rejects them (a rejected stat reads 0).
//!
//! A write that another copy must see bumps its generation; a bump that
//! fails is logged once per VM copy and otherwise ignored (fail open: the
//! other copies see the change at the next bump).
//!
//! One VM copy per `membership_refresh` (a lease) refreshes membership from
//! the admin and probes tombstoned hosts (`refresh.rs`).
//!
//! The parts: `signal.rs` (the change signal and the cached shared
//! values), `steer.rs` (a request's override list from the cached plan),
//! `observe.rs` (what a response says: tombstone writes, readmissions,
//! observed membership), `refresh.rs` (the periodic work).

pub mod front;
mod observe;
mod refresh;
mod signal;
pub use signal::SIGNAL_HINTS;
mod steer;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

pub use crate::consumer::steering::MAX_ADMIN_BODY;
pub use refresh::{Call, CallKind, CALL_TIMEOUT};
use signal::Cached;
use steer::CachedPlan;

use crate::consumer::config::ConsumerConfig;
use crate::consumer::steering::{AdminSource, Membership, Observed};
use crate::consumer::tombstone::{Tombstones, Ttls};
use crate::shared::instance;
use crate::shared::metrics::Metric;

/// Legacy response-flag bits (Envoy `stream_info.h`): upstream connection
/// failure and upstream connection termination.
pub const FLAG_UF: u64 = 0x20;
pub const FLAG_UC: u64 = 0x40;

/// Once the admin's membership is known and without live tombstones, one
/// response in this many (after each VM copy's first) is observed.
pub const OBSERVE_EVERY: u64 = 64;
/// An address this VM copy recorded answering is recorded again after this
/// long (in between, an observation reads only its address and the clock).
pub const RECORD_EVERY_US: u64 = 5_000_000;

/// What the glue reads from the host for one stream, asked for only when a
/// decision needs it (property lookups and the clock are hostcalls). The
/// glue reads each at most once per stream (the clock once per callback).
pub trait Exchange {
    /// The route's cluster (`xds.cluster_name`), empty if unknown.
    fn cluster(&mut self) -> String;
    /// The host that answered (`upstream.address`), None if unknown.
    fn address(&mut self) -> Option<String>;
    /// Envoy's `response.flags`.
    fn response_flags(&mut self) -> Option<u64>;
    /// The host's monotonic clock, µs ([`crate::shared::host::Host::now_us`]).
    fn now(&mut self) -> u64;
}

/// What one response part's headers (or trailers) say, from one read of
/// the whole map.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Response {
    /// A closing header said `true`.
    pub closing: bool,
    /// `:status` was 503.
    pub status_503: bool,
    /// The first value of the instance header, if a valid instance id.
    pub instance: Option<String>,
    /// [`crate::shared::headers::SIGNAL`] is present.
    pub signal: bool,
}

impl Response {
    /// Scans a header map's pairs for what the consumer looks at: the first
    /// value of each closing header (a closing mark if it says `true`), the
    /// first `:status` and the first instance header: what Envoy's
    /// single-value lookup returns for duplicated headers. Names compare
    /// case-insensitively.
    pub fn scan<'a>(
        config: &ConsumerConfig,
        pairs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    ) -> Response {
        let instance_header = config.instance_header.as_deref().map(str::as_bytes);
        let mut seen = Response::default();
        let (mut status_seen, mut instance_seen) = (false, false);
        // Closing headers already seen (the first 64 configured; any later
        // one counts at every occurrence).
        let mut closing_seen: u64 = 0;
        // The lengths of the names looked for, one bit each (63: 63 bytes
        // or more): most of a response's headers are passed over on their
        // length alone, without a comparison.
        let length_bit = |n: usize| 1u64 << n.min(63);
        let mut lengths = length_bit(crate::shared::headers::STATUS.len())
            | length_bit(crate::shared::headers::SIGNAL.len())
            | instance_header.map_or(0, |h| length_bit(h.len()));
        for h in &config.closing_headers {
            lengths |= length_bit(h.len());
        }
        for (name, value) in pairs {
            if lengths & length_bit(name.len()) == 0 {
                continue;
            }
            if !status_seen && name == crate::shared::headers::STATUS.as_bytes() {
                status_seen = true;
                seen.status_503 = value == b"503";
            }
            if name.eq_ignore_ascii_case(crate::shared::headers::SIGNAL.as_bytes()) {
                seen.signal = true;
            }
            if !instance_seen && instance_header.is_some_and(|h| name.eq_ignore_ascii_case(h)) {
                instance_seen = true;
                seen.instance = instance_of(value);
            }
            let closing = config
                .closing_headers
                .iter()
                .position(|h| name.eq_ignore_ascii_case(h.as_bytes()));
            if let Some(i) = closing {
                let bit = u32::try_from(i)
                    .ok()
                    .and_then(|i| 1u64.checked_shl(i))
                    .unwrap_or(0);
                if closing_seen & bit == 0 {
                    closing_seen |= bit;
                    seen.closing |= is_true(value);
                }
            }
        }
        seen
    }
}

/// A log line's level: the hosts' one.
pub use crate::shared::host::Level;

/// Something for the glue to do, in order: a metric change or a log line.
/// The decisions set `graceful_consumer_tombstones` and
/// `graceful_consumer_tombstone_bytes` and add to
/// `graceful_consumer_evictions`, `graceful_consumer_readmitted` and
/// `graceful_consumer_generation`; the consumer's other metrics are the
/// glue's (in flight and started per stream, steered per header write the
/// host accepted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Sets a gauge.
    Set(Metric, u64),
    /// Adds to a counter.
    Add(Metric, u64),
    Log(Level, String),
}

/// The response part being observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Headers,
    Trailers,
}

/// One VM copy's consumer state: caches of shared values, this copy's own
/// observations, and (on the root) the calls in flight.
pub struct Consumer {
    config: ConsumerConfig,
    /// Runs as an upstream HTTP filter of the cluster (one stream per
    /// attempt): it only observes, and connect failures come from
    /// [`Consumer::connect_failed`].
    upstream: bool,
    ttls: Ttls,
    /// `graceful_consumer_generation` when this copy last synced its
    /// caches (None: never, or unreadable).
    signal: Option<u64>,
    /// Bumps of the signal this copy made since it last looked: the signal
    /// at `signal + own_bumps` means no other copy wrote (the counter is an
    /// exact count), and this copy keeps its own writes in its caches.
    own_bumps: u64,
    tombstones: Cached<Tombstones>,
    /// The latest expiry in the cached tombstone list; 0 once the clock
    /// has passed it (nothing in the list can be live until it changes).
    live_until: u64,
    /// The latest expiry of an announced tombstone in the cached list; 0
    /// once passed (the watch reads no address until a write).
    announced_until: u64,
    members: Cached<Membership>,
    /// The cached admin membership lists a member `DRAINING` (worked out
    /// once per change of it: such a cluster is steered).
    members_draining: bool,
    /// Addresses that answered, as every copy saw them (without admin).
    shared_observed: Cached<Membership>,
    /// Addresses this copy saw answer (and told the others about).
    observed: Observed,
    /// Responses seen, for sampling membership observations.
    responses: u64,
    /// Addresses this copy recorded answering, and when (bounded: cleared
    /// at [`MAX_MEMBERS`]).
    recorded: HashMap<String, u64>,
    /// Clusters this VM copy has already added to the shared cluster set.
    registered: Vec<String>,
    /// The last steering plan, valid while tombstones and membership keep
    /// their generations and no tombstone in it expires.
    plan: Option<CachedPlan>,
    /// Plans this copy worked out (a test reads it: a plan is linear in
    /// members and tombstones, worked out once per change, not per request).
    plans_made: u64,
    rotation: usize,
    /// The admin `/clusters` call in flight and the clusters it asked for.
    admin_call: Option<u32>,
    admin_wanted: Vec<String>,
    /// How the admin call in flight reads its answer.
    admin_source: AdminSource,
    /// `/clusters` refreshes in a row that got no answer in time
    /// (see [`CLUSTERS_UNANSWERED_TURN`](crate::consumer::steering::admin::CLUSTERS_UNANSWERED_TURN)).
    clusters_unanswered: u8,
    /// Probe calls in flight: token → probed address.
    probes: HashMap<u32, String>,
    /// A failed generation bump was logged already (once per VM copy: a
    /// store that refuses writes would otherwise log on every change).
    bump_warned: bool,
    /// Upstream responses of this copy still to carry
    /// [`headers::SIGNAL`](crate::shared::headers::SIGNAL) since its last
    /// tombstone write.
    signal_hints_left: u8,
    /// The tombstones' generation this copy last announced for a
    /// [`crate::shared::headers::SIGNAL`] it saw.
    signalled_gen: Option<u64>,
}

/// The tombstone gauges for the list as a copy now holds it: live entries
/// and the encoded size.
fn tombstone_gauges(list: &Tombstones, now_us: u64) -> [Effect; 2] {
    [
        Effect::Set(Metric::ConsumerTombstones, list.live_count(now_us) as u64),
        Effect::Set(Metric::ConsumerTombstoneBytes, list.encode().len() as u64),
    ]
}

/// Where the filter sits, from `vm_config.configuration`: empty for the
/// listener's filter chain (false), `upstream` for the cluster's upstream
/// filters (true). Anything else is refused with the log line to write.
pub fn upstream_from_vm_config(vm_config: &[u8]) -> Result<bool, String> {
    match vm_config.trim_ascii() {
        b"" => Ok(false),
        b"upstream" => Ok(true),
        other => Err(format!(
            "graceful_consumer: invalid vm_config.configuration {:?}: empty, or \"upstream\" for an upstream filter",
            String::from_utf8_lossy(other)
        )),
    }
}

/// The configure-time log line when Envoy does not keep the stats the
/// outbound count lives in (`rejected`: their names), None if it does.
pub fn stats_refused(rejected: &[&str]) -> Option<String> {
    if rejected.is_empty() {
        return None;
    }
    Some(format!(
        "Envoy drops the stat(s) {}: the outbound in-flight count and the change signal live in them, so Envoy's stats_matcher must keep the wasmcustom.graceful_ stats (e.g. an inclusion_list prefix wasmcustom.graceful_)",
        rejected.join(", ")
    ))
}

/// True for a header value of `true` (case-insensitive). Duplicate headers
/// may arrive joined with commas: any `true` among them counts.
pub fn is_true(value: &[u8]) -> bool {
    value
        .split(|&b| b == b',')
        .any(|v| v.trim_ascii().eq_ignore_ascii_case(b"true"))
}

/// An instance id as a header carried it, if it is a valid one.
pub fn instance_id(raw: Option<Vec<u8>>) -> Option<String> {
    let id = raw?;
    // Valid means visible ASCII: UTF-8 already, kept without a copy.
    instance::is_valid(&id)
        .then(|| String::from_utf8(id).ok())
        .flatten()
}

/// [`instance_id`] of borrowed bytes: checked before the one copy made.
fn instance_of(value: &[u8]) -> Option<String> {
    if !instance::is_valid(value) {
        return None;
    }
    std::str::from_utf8(value).ok().map(str::to_owned)
}

impl Consumer {
    pub fn new(config: ConsumerConfig, upstream: bool) -> Consumer {
        Consumer {
            ttls: Ttls {
                closing: config.tombstone_ttl,
                failure: config.failure_tombstone_ttl,
                warming: config.readmit_slow_start.map(|s| s.window),
            },
            config,
            upstream,
            signal: None,
            own_bumps: 0,
            tombstones: Cached::new(),
            live_until: 0,
            announced_until: 0,
            members: Cached::new(),
            members_draining: false,
            shared_observed: Cached::keeping_bytes(),
            observed: Observed::default(),
            responses: 0,
            recorded: HashMap::new(),
            registered: Vec::new(),
            plan: None,
            plans_made: 0,
            rotation: 0,
            admin_call: None,
            admin_wanted: Vec::new(),
            admin_source: AdminSource::Clusters,
            clusters_unanswered: 0,
            probes: HashMap::new(),
            bump_warned: false,
            signal_hints_left: 0,
            signalled_gen: None,
        }
    }

    pub fn config(&self) -> &ConsumerConfig {
        &self.config
    }

    pub fn is_upstream(&self) -> bool {
        self.upstream
    }
}
