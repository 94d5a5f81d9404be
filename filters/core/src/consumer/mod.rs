//! The consumer filter's decisions, over [`SharedStore`] and a small view
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
//! What is read only when something is happening, and why skipping it
//! otherwise is safe:
//!
//! - **Shared data** is read only when `graceful_consumer_generation` moved
//!   since this VM copy last looked. Every write another copy must see (the
//!   tombstones, the admin membership, the observed membership) bumps that
//!   counter *after* the shared-data write (the [`Effect::Add`] of
//!   [`Counter::Generation`] the write returns; Envoy counters are
//!   process-wide atomics, so a reader that sees the bump sees the write).
//!   The counter is read before any shared data, so a copy that saw it
//!   unchanged has every write made before that read. A tombstone written
//!   by one worker therefore steers every worker from its next request.
//!   When it moved, the generation key beside each value ([`crate::keys`])
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
//!   may be live (the plan is kept until a generation moves or a tombstone
//!   in it expires, so a steered request costs a rotation, not a scan).
//! - **`upstream.address`, the cluster, the clock** on a response only for
//!   a closing mark; a 503 (then `response.flags` first, for a connect
//!   failure); a response while tombstones may be live (is it a tombstoned
//!   host answering with a new instance id? A steered request normally went
//!   to one that is not, but `override_host` falls back to its own pick
//!   when the listed hosts are unavailable: the check is a lookup in the
//!   cached list once the address is read); or a sampled membership
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
//!   that is [`crate::steering::SEEN_REFRESH_US`] old), and steering lists
//!   the members seen within [`crate::steering::OBSERVED_WINDOW_US`], so an
//!   address that left the cluster leaves the list. Once the
//!   admin's membership is known, one response in [`OBSERVE_EVERY`] is
//!   observed (it registers the route's cluster for the refresh), and
//!   every response while tombstones may be live. What steering cannot
//!   see without an admin: a host the balancer has not picked yet (one
//!   added to the cluster while steering pins requests elsewhere).
//! - **The upstream instance** reads `upstream.address` only when an
//!   attempt answered closing, or in `on_done` when it got no response
//!   headers and Envoy recorded a transport failure.
//!
//! The outbound in-flight count is Envoy stats, not shared data: the gauge
//! `graceful_consumer_inflight` (+1 in request headers, −1 in `on_done`,
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

mod refresh;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

pub use refresh::{Call, CallKind, CALL_TIMEOUT, MAX_ADMIN_BODY};

use crate::config::ConsumerConfig;
use crate::instance;
use crate::keys;
use crate::steering::{
    plan, ClusterSet, Member, Membership, Observed, Plan, Rules, Steering, MAX_MEMBERS,
};
use crate::store::{self, add_bounded, update, SharedStore};
use crate::tombstone::{Change, Observation, Tombstones, Ttls};

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
    /// The clock, µs since the epoch.
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
        for (name, value) in pairs {
            if !status_seen && name == crate::headers::STATUS.as_bytes() {
                status_seen = true;
                seen.status_503 = value == b"503";
            }
            if !instance_seen && instance_header.is_some_and(|h| name.eq_ignore_ascii_case(h)) {
                instance_seen = true;
                seen.instance = instance_id(Some(value.to_vec()));
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

/// Gauges the consumer sets (`graceful_consumer_inflight` is the glue's:
/// +1 and −1 per stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gauge {
    /// `graceful_consumer_tombstones`: live tombstones.
    Tombstones,
    /// `graceful_consumer_tombstone_bytes`: size of the shared list (shows
    /// it stays bounded).
    TombstoneBytes,
}

/// Counters the consumer adds to (`graceful_consumer_steered` and
/// `graceful_consumer_started` are the glue's: it counts header writes the
/// host accepted, and streams).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    Evictions,
    Readmitted,
    /// `graceful_consumer_generation`: bumped after every shared write the
    /// other VM copies must see (see the module doc).
    Generation,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Debug,
    Info,
    Warn,
}

/// Something for the glue to do, in order: a metric change or a log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    Set(Gauge, u64),
    Add(Counter, u64),
    Log(Level, String),
}

/// The response part being observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Headers,
    Trailers,
}

/// A shared-data value decoded once per change of its generation key,
/// whose generation key is read only when the change signal moved (or
/// when a caller outside the request path asks for a check).
struct Cached<T> {
    gen: Option<u64>,
    /// The generation key was read since the change signal last moved.
    checked: bool,
    value: T,
}

impl<T: Default> Cached<T> {
    fn new() -> Self {
        Cached {
            gen: None,
            checked: false,
            value: T::default(),
        }
    }

    /// Makes the next [`Cached::refresh`] read the generation key.
    fn stale(&mut self) {
        self.checked = false;
    }

    /// Reads the generation key unless checked since the signal moved, and
    /// decodes the value again if it moved; true if it did. Unreadable or
    /// foreign bytes read as "nothing yet" (the filter fails open).
    fn refresh(
        &mut self,
        store: &dyn SharedStore,
        gen_key: &str,
        key: &str,
        decode: fn(&[u8]) -> Option<T>,
    ) -> bool {
        if self.checked {
            return false;
        }
        self.checked = true;
        let gen = store
            .get(gen_key)
            .ok()
            .flatten()
            .and_then(|(b, _)| store::read_u64(&b))
            .unwrap_or(0);
        if self.gen == Some(gen) {
            return false;
        }
        self.value = store
            .get(key)
            .ok()
            .flatten()
            .and_then(|(b, _)| decode(&b))
            .unwrap_or_default();
        self.gen = Some(gen);
        true
    }
}

/// A steering plan and what it was worked out from.
struct CachedPlan {
    /// Generations of the tombstones, admin membership and observed
    /// membership it was made from.
    gens: (Option<u64>, Option<u64>, Option<u64>),
    cluster: String,
    /// The first expiry of a tombstone it depends on.
    until_us: u64,
    plan: Plan,
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
    members: Cached<Membership>,
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
    rotation: usize,
    /// The admin `/clusters` call in flight and the clusters it asked for.
    admin_call: Option<u32>,
    admin_wanted: Vec<String>,
    /// Probe calls in flight: token → probed address.
    probes: HashMap<u32, String>,
    /// A failed generation bump was logged already (once per VM copy: a
    /// store that refuses writes would otherwise log on every change).
    bump_warned: bool,
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
        "graceful_consumer: Envoy drops the stat(s) {}: the outbound in-flight count and the change signal live in them, so Envoy's stats_matcher must keep the wasmcustom.graceful_ stats (e.g. an inclusion_list prefix wasmcustom.graceful_)",
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
    instance::is_valid(&id).then(|| String::from_utf8_lossy(&id).into_owned())
}

fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Consumer {
    pub fn new(config: ConsumerConfig, upstream: bool) -> Consumer {
        Consumer {
            ttls: Ttls {
                closing: config.tombstone_ttl,
                failure: config.failure_tombstone_ttl,
            },
            config,
            upstream,
            signal: None,
            own_bumps: 0,
            tombstones: Cached::new(),
            live_until: 0,
            members: Cached::new(),
            shared_observed: Cached::new(),
            observed: Observed::default(),
            responses: 0,
            recorded: HashMap::new(),
            registered: Vec::new(),
            plan: None,
            rotation: 0,
            admin_call: None,
            admin_wanted: Vec::new(),
            probes: HashMap::new(),
            bump_warned: false,
        }
    }

    pub fn config(&self) -> &ConsumerConfig {
        &self.config
    }

    pub fn is_upstream(&self) -> bool {
        self.upstream
    }

    /// Takes the change signal (`graceful_consumer_generation`, read before
    /// any shared data): if it moved, or cannot be read, the cached values
    /// check their generation keys when next used.
    pub fn sync(&mut self, signal: Option<u64>) {
        let own = std::mem::take(&mut self.own_bumps);
        let unchanged = self.signal.and_then(|s| s.checked_add(own));
        if signal.is_some() && signal == unchanged {
            self.signal = signal;
            return;
        }
        self.signal = signal;
        self.tombstones.stale();
        self.members.stale();
        self.shared_observed.stale();
    }

    /// Tells this copy's stats scope of a tombstone write whose bump it
    /// has not seen, so its other copies read the list at their next
    /// request: on Envoy 1.36 the upstream instance's stats live in the
    /// cluster's scope (`cluster.<name>.wasmcustom.*`), so its bumps never
    /// move the listener's signal (on 1.40 both share one scope). The glue
    /// calls this on every tick with the signal just read; a copy whose
    /// signal moved reads the list when next used anyway. Returns the bump
    /// to carry out, if any.
    pub fn notice_unannounced(
        &mut self,
        store: &dyn SharedStore,
        signal: Option<u64>,
    ) -> Vec<Effect> {
        let unmoved =
            signal.is_some() && self.signal.and_then(|s| s.checked_add(self.own_bumps)) == signal;
        self.sync(signal);
        if !unmoved {
            return Vec::new();
        }
        let before = self.tombstones.gen;
        self.tombstones.stale();
        self.refresh_tombstones(store);
        if self.tombstones.gen != before {
            return self.announce();
        }
        Vec::new()
    }

    /// Moves the change signal for a write another instance made (its
    /// generation key moved already).
    fn announce(&mut self) -> Vec<Effect> {
        self.own_bumps = self.own_bumps.saturating_add(1);
        vec![Effect::Add(Counter::Generation, 1)]
    }

    /// Brings the cached tombstones up to date (reads only if stale).
    fn refresh_tombstones(&mut self, store: &dyn SharedStore) {
        let changed = self.tombstones.refresh(
            store,
            keys::TOMBSTONES_GEN.name,
            keys::TOMBSTONES.name,
            Tombstones::decode,
        );
        if changed {
            self.live_until = self
                .tombstones
                .value
                .entries()
                .iter()
                .map(|t| t.expires_us)
                .max()
                .unwrap_or(0);
        }
    }

    /// Whether the cached list may hold a live tombstone; reads the clock
    /// only if it has an entry not yet seen expired.
    fn may_be_live(&mut self, x: &mut dyn Exchange) -> bool {
        if self.live_until == 0 {
            return false;
        }
        if x.now() >= self.live_until {
            self.live_until = 0;
            return false;
        }
        true
    }

    /// The override header value for a request, or None to leave the load
    /// balancer alone (no live tombstone for the cluster, or every known
    /// member tombstoned: nothing better to offer). `signal` is
    /// `graceful_consumer_generation` as just read. The glue sets the
    /// header and counts `steered` if the host took it.
    pub fn steer(
        &mut self,
        store: &dyn SharedStore,
        x: &mut dyn Exchange,
        signal: Option<u64>,
    ) -> Option<String> {
        self.sync(signal);
        self.refresh_tombstones(store);
        if !self.may_be_live(x) {
            return None;
        }
        let now = x.now();
        if self.tombstones.value.live_count(now) == 0 {
            return None;
        }
        let cluster = x.cluster();
        self.register_cluster(store, &cluster);
        self.rotation = self.rotation.wrapping_add(1);
        match self.steering(store, &cluster, now, self.rotation) {
            Steering::Steer(list) => Some(list),
            Steering::NoneLeft | Steering::LeaveAlone => None,
        }
    }

    /// What a response's headers or trailers (`seen`, scanned by
    /// [`Response::scan`]) say about the host that sent them.
    pub fn observe_response(
        &mut self,
        store: &dyn SharedStore,
        x: &mut dyn Exchange,
        seen: &Response,
        part: Part,
    ) -> Vec<Effect> {
        if seen.closing {
            let Some(address) = x.address() else {
                return Vec::new();
            };
            let cluster = x.cluster();
            let obs = Observation::Closing {
                cluster: &cluster,
                address: &address,
                instance: seen.instance.as_deref(),
            };
            let now = x.now();
            return self.apply(store, &obs, now);
        }
        // As an upstream filter only closing marks are observed: connect
        // failures end the attempt instead (`connect_failed`), and the
        // listener's instance sees the final answer.
        if part != Part::Headers || self.upstream {
            return Vec::new();
        }
        // A local 503 for a connect failure.
        if seen.status_503
            && self.config.evict_on_connect_failure
            && x.response_flags()
                .is_some_and(|f| f & (FLAG_UF | FLAG_UC) != 0)
        {
            let Some(address) = x.address() else {
                return Vec::new();
            };
            let cluster = x.cluster();
            let obs = Observation::ConnectFailure {
                cluster: &cluster,
                address: &address,
            };
            let now = x.now();
            return self.apply(store, &obs, now);
        }
        // While tombstones may be live every response is observed (the
        // address is read anyway), and asked whether it is a tombstoned host
        // answering with a new instance id: usually not (a steered request
        // went to a host that is not tombstoned), a lookup in the cached
        // list.
        let live = self.may_be_live(x);
        if !(live || self.observes_membership(store)) {
            return Vec::new();
        }
        let Some(address) = x.address() else {
            return Vec::new();
        };
        let now = x.now();
        if !live && self.recorded_lately(&address, now) {
            return Vec::new();
        }
        // What answered is membership (used until the admin's is known, and
        // always without an admin cluster); the cluster goes in the shared
        // set the admin refresh reads.
        let cluster = x.cluster();
        let mut effects = self.answered(store, &cluster, &address, now);
        self.register_cluster(store, &cluster);
        if live && self.is_tombstoned(&address, now) {
            let obs = Observation::Answered {
                address: &address,
                instance: seen.instance.as_deref(),
            };
            effects.extend(self.apply(store, &obs, now));
        }
        effects
    }

    /// As an upstream filter, whether an attempt that ended is worth asking
    /// the host about: one that got no response headers may have failed to
    /// connect, even if a retry then succeeded.
    pub fn attempt_may_have_failed(&self, answered: bool) -> bool {
        self.upstream && !answered && self.config.evict_on_connect_failure
    }

    /// An attempt to `address` failed to connect (a transport failure
    /// reason and no response).
    pub fn connect_failed(
        &mut self,
        store: &dyn SharedStore,
        x: &mut dyn Exchange,
        address: &str,
    ) -> Vec<Effect> {
        let cluster = x.cluster();
        let obs = Observation::ConnectFailure {
            cluster: &cluster,
            address,
        };
        let now = x.now();
        self.apply(store, &obs, now)
    }

    /// Adds the route's cluster to the shared set the membership refresh
    /// reads, once per VM copy and cluster.
    fn register_cluster(&mut self, store: &dyn SharedStore, cluster: &str) {
        if self.config.admin_cluster.is_none()
            || cluster.is_empty()
            || self.registered.iter().any(|c| c == cluster)
        {
            return;
        }
        let added = update(store, keys::CLUSTERS.name, |bytes| {
            let mut set = bytes.and_then(ClusterSet::decode).unwrap_or_default();
            let new = set.insert(cluster);
            (new.then(|| set.encode()), ())
        });
        if added.is_ok() {
            self.registered.push(cluster.to_string());
        }
    }

    /// Bumps a generation key, then the change signal (whatever the key's
    /// bump did: the other copies then at least look); a failure is logged
    /// once per VM copy.
    fn bump(&mut self, store: &dyn SharedStore, gen_key: &str) -> Vec<Effect> {
        let mut effects = Vec::new();
        if let Err(e) = add_bounded(store, gen_key, 1, u64::MAX) {
            if !std::mem::replace(&mut self.bump_warned, true) {
                effects.push(Effect::Log(
                    Level::Warn,
                    format!(
                        "{gen_key} not bumped ({e:?}): other VM copies keep their cached value until the next change (logged once per VM copy)"
                    ),
                ));
            }
        }
        effects.extend(self.announce());
        effects
    }

    /// Applies an observation to the shared tombstones. Reads the list's
    /// generation first (always: this is not the request path) so the
    /// common cases (an answer from a host that is not tombstoned, a
    /// closing mark already recorded) cost no write.
    fn apply(&mut self, store: &dyn SharedStore, obs: &Observation, now: u64) -> Vec<Effect> {
        let max = self.config.max_tombstones as usize;
        let before = self.tombstones.gen;
        self.tombstones.stale();
        self.refresh_tombstones(store);
        if !self.tombstones.value.worth_writing(obs, &self.ttls, now) {
            // Recorded already, by a write this copy had not read: most
            // often the upstream instance's, a moment ago on this very
            // response, whose bump may not reach this scope (see
            // `notice_unannounced`). One bump more, so this scope's other
            // copies steer from their next request.
            if !self.upstream && self.tombstones.gen != before {
                return self.announce();
            }
            return Vec::new();
        }
        let ttls = self.ttls;
        let result = update(store, keys::TOMBSTONES.name, |bytes| {
            let mut list = bytes.and_then(Tombstones::decode).unwrap_or_default();
            let change = list.observe(obs, &ttls, now, max);
            let live = list.live_count(now);
            let value = (change != Change::Unchanged).then(|| list.encode());
            let size = value.as_ref().map_or(0, Vec::len);
            (value, (change, live, size))
        });
        let (change, live, size) = match result {
            Ok(r) => r,
            Err(e) => {
                return vec![Effect::Log(
                    Level::Warn,
                    format!("tombstones not updated: {e:?}"),
                )]
            }
        };
        if change == Change::Unchanged {
            return Vec::new();
        }
        let mut effects = self.bump(store, keys::TOMBSTONES_GEN.name);
        // This copy knows its own write at once (its next response may be a
        // readmission question): two reads, on a path as rare as writes.
        self.tombstones.stale();
        self.refresh_tombstones(store);
        effects.push(Effect::Set(Gauge::Tombstones, live as u64));
        effects.push(Effect::Set(Gauge::TombstoneBytes, size as u64));
        let line = match (change, obs) {
            (
                Change::Evicted,
                Observation::Closing {
                    address, instance, ..
                },
            ) => Some((
                Counter::Evictions,
                format!(
                    "tombstoned {address} (instance {}) for {:?}: closing mark",
                    instance.unwrap_or("unknown"),
                    self.ttls.closing
                ),
            )),
            (Change::Evicted, Observation::ConnectFailure { address, .. }) => Some((
                Counter::Evictions,
                format!(
                    "tombstoned {address} for {:?}: connect failure",
                    self.ttls.failure
                ),
            )),
            (Change::Readmitted, Observation::Answered { address, instance }) => Some((
                Counter::Readmitted,
                format!(
                    "readmitted {address}: new instance {}",
                    instance.unwrap_or("unknown")
                ),
            )),
            _ => None,
        };
        if let Some((counter, line)) = line {
            effects.push(Effect::Add(counter, 1));
            effects.push(Effect::Log(Level::Info, line));
        }
        effects
    }

    /// Members of `cluster` to steer among: the admin's view when known,
    /// else the addresses that answered on any copy (a copy that has served
    /// nothing yet still steers from the first tombstone).
    fn members(&mut self, store: &dyn SharedStore, cluster: &str, now: u64) -> Vec<Member> {
        if self.config.admin_cluster.is_some() {
            self.members.refresh(
                store,
                keys::MEMBERS_GEN.name,
                keys::MEMBERS.name,
                Membership::decode,
            );
            if let Some(m) = self.members.value.cluster(cluster) {
                return m.to_vec();
            }
        }
        self.shared_observed.refresh(
            store,
            keys::OBSERVED_GEN.name,
            keys::OBSERVED.name,
            Membership::decode,
        );
        match self.shared_observed.value.seen_within_window(cluster, now) {
            Some(m) => m,
            None => self.observed.members(cluster, now),
        }
    }

    /// The steering for one request to `cluster`: the plan is worked out
    /// again only when tombstones or membership changed, or a tombstone in
    /// it expired.
    fn steering(
        &mut self,
        store: &dyn SharedStore,
        cluster: &str,
        now: u64,
        rotation: usize,
    ) -> Steering {
        let members_gen = if self.config.admin_cluster.is_some() {
            self.members.refresh(
                store,
                keys::MEMBERS_GEN.name,
                keys::MEMBERS.name,
                Membership::decode,
            );
            self.members.gen
        } else {
            None
        };
        self.shared_observed.refresh(
            store,
            keys::OBSERVED_GEN.name,
            keys::OBSERVED.name,
            Membership::decode,
        );
        let gens = (self.tombstones.gen, members_gen, self.shared_observed.gen);
        if let Some(cached) = &self.plan {
            if cached.gens == gens && cached.cluster == cluster && now < cached.until_us {
                return cached.plan.steering(rotation);
            }
        }
        let members = self.members(store, cluster, now);
        let rules = Rules {
            ttls: self.ttls,
            panic_threshold: self.config.panic_threshold,
        };
        let (plan, until_us) = plan(&members, &self.tombstones.value, cluster, now, &rules);
        let steering = plan.steering(rotation);
        self.plan = Some(CachedPlan {
            gens,
            cluster: cluster.to_string(),
            until_us,
            plan,
        });
        steering
    }

    /// Whether this response is a membership observation: every one while
    /// steering would take membership from observations (no admin cluster,
    /// or none of its answers read yet), so the observed set holds every
    /// host the balancer picks; else one in [`OBSERVE_EVERY`], which only
    /// registers the route's cluster for the admin refresh.
    fn observes_membership(&mut self, store: &dyn SharedStore) -> bool {
        let sampled = self.responses.is_multiple_of(OBSERVE_EVERY);
        self.responses = self.responses.wrapping_add(1);
        sampled || !self.admin_membership_known(store)
    }

    /// An admin cluster is configured and its membership has been read.
    fn admin_membership_known(&mut self, store: &dyn SharedStore) -> bool {
        if self.config.admin_cluster.is_none() {
            return false;
        }
        self.members.refresh(
            store,
            keys::MEMBERS_GEN.name,
            keys::MEMBERS.name,
            Membership::decode,
        );
        !self.members.value.is_empty()
    }

    /// True when this copy recorded `address` answering less than
    /// [`RECORD_EVERY_US`] before `now`: an observation of a known host
    /// then skips the cluster read and the record (it costs the address
    /// and the clock).
    fn recorded_lately(&mut self, address: &str, now: u64) -> bool {
        if let Some(at) = self.recorded.get_mut(address) {
            if now.saturating_sub(*at) < RECORD_EVERY_US {
                return true;
            }
            *at = now;
            return false;
        }
        if self.recorded.len() >= MAX_MEMBERS {
            self.recorded.clear();
        }
        self.recorded.insert(address.to_string(), now);
        false
    }

    /// True if `address` has a live tombstone in the cached list.
    fn is_tombstoned(&self, address: &str, now: u64) -> bool {
        self.tombstones.value.get_live(address, now).is_some()
    }

    /// Notes that `address` answered; tells the other copies when the
    /// shared membership lacks it or last saw it over [`SEEN_REFRESH_US`]
    /// ago (writes are as rare as new hosts, and one per host per refresh).
    fn answered(
        &mut self,
        store: &dyn SharedStore,
        cluster: &str,
        address: &str,
        now: u64,
    ) -> Vec<Effect> {
        self.observed.record(cluster, address, now);
        self.shared_observed.refresh(
            store,
            keys::OBSERVED_GEN.name,
            keys::OBSERVED.name,
            Membership::decode,
        );
        if self
            .shared_observed
            .value
            .seen_lately(cluster, address, now)
        {
            return Vec::new();
        }
        let changed = update(store, keys::OBSERVED.name, |bytes| {
            let mut m = bytes.and_then(Membership::decode).unwrap_or_default();
            let changed = m.saw(cluster, address, now);
            (changed.then(|| m.encode()), changed)
        });
        if changed == Ok(true) {
            // Read again when steering next needs it (this copy's own write
            // does not make its signal move).
            self.shared_observed.stale();
            return self.bump(store, keys::OBSERVED_GEN.name);
        }
        Vec::new()
    }
}
