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
//! Shared values are decoded once per change, found by a generation
//! counter beside each ([`crate::keys`]), so a request reads 8 bytes when
//! nothing changed; the steering plan is kept until a generation moves or a
//! tombstone in it expires, so a steered request costs a rotation, not a
//! scan. A write that another copy must see bumps its generation; a bump
//! that fails is logged once per VM copy and otherwise ignored (fail open:
//! the other copies see the change at the next bump).
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
use crate::steering::{plan, ClusterSet, Member, Membership, Observed, Plan, Steering};
use crate::store::{self, add_bounded, update, SharedStore};
use crate::tombstone::{Change, Observation, Tombstones, Ttls};

/// Legacy response-flag bits (Envoy `stream_info.h`): upstream connection
/// failure and upstream connection termination.
pub const FLAG_UF: u64 = 0x20;
pub const FLAG_UC: u64 = 0x40;

/// What the glue reads from the host for one stream, asked for only when a
/// decision needs it (property and header lookups are hostcalls).
pub trait Exchange {
    /// The route's cluster (`xds.cluster_name`), empty if unknown. The
    /// glue reads it once per stream.
    fn cluster(&mut self) -> String;
    /// A header (or trailer) of the response part being observed.
    fn header(&mut self, name: &str) -> Option<Vec<u8>>;
    /// Envoy's `response.flags`.
    fn response_flags(&mut self) -> Option<u64>;
}

/// Gauges the consumer sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gauge {
    /// `graceful_consumer_tombstones`: live tombstones.
    Tombstones,
    /// `graceful_consumer_tombstone_bytes`: size of the shared list (shows
    /// it stays bounded).
    TombstoneBytes,
    /// `graceful_consumer_inflight`: the shared outbound count.
    Inflight,
}

/// Counters the consumer adds to (`graceful_consumer_steered` is the
/// glue's: it counts header writes the host accepted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    Evictions,
    Readmitted,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Debug,
    Info,
    Warn,
}

/// Something for the glue to do: a metric change or a log line.
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

/// A shared-data value decoded once per change of its generation counter.
struct Cached<T> {
    gen: Option<u64>,
    value: T,
}

impl<T: Default> Cached<T> {
    fn new() -> Self {
        Cached {
            gen: None,
            value: T::default(),
        }
    }

    /// The value, decoded again only if the generation moved. Unreadable
    /// or foreign bytes read as "nothing yet" (the filter fails open).
    fn refresh(
        &mut self,
        store: &dyn SharedStore,
        gen_key: &str,
        key: &str,
        decode: fn(&[u8]) -> Option<T>,
    ) -> &T {
        let gen = store
            .get(gen_key)
            .ok()
            .flatten()
            .and_then(|(b, _)| store::read_u64(&b))
            .unwrap_or(0);
        if self.gen != Some(gen) {
            self.value = store
                .get(key)
                .ok()
                .flatten()
                .and_then(|(b, _)| decode(&b))
                .unwrap_or_default();
            self.gen = Some(gen);
        }
        &self.value
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
    tombstones: Cached<Tombstones>,
    members: Cached<Membership>,
    /// Addresses that answered, as every copy saw them (without admin).
    shared_observed: Cached<Membership>,
    /// Addresses this copy saw answer (and told the others about).
    observed: Observed,
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
            tombstones: Cached::new(),
            members: Cached::new(),
            shared_observed: Cached::new(),
            observed: Observed::default(),
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

    /// The override header value for a request, or None to leave the load
    /// balancer alone (no live tombstone for the cluster, or every known
    /// member tombstoned: nothing better to offer). The glue sets it and
    /// counts `steered` if the host took it.
    pub fn steer(
        &mut self,
        store: &dyn SharedStore,
        x: &mut dyn Exchange,
        now: u64,
    ) -> Option<String> {
        let any_live = self
            .tombstones
            .refresh(
                store,
                keys::TOMBSTONES_GEN.name,
                keys::TOMBSTONES.name,
                Tombstones::decode,
            )
            .live_count(now)
            > 0;
        if !any_live {
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

    /// What a response's headers or trailers say about the host at
    /// `address` that sent them.
    pub fn observe_response(
        &mut self,
        store: &dyn SharedStore,
        x: &mut dyn Exchange,
        address: &str,
        part: Part,
        now: u64,
    ) -> Vec<Effect> {
        let closing = self
            .config
            .closing_headers
            .iter()
            .any(|h| x.header(h).is_some_and(|v| is_true(&v)));
        if closing {
            let instance = self.instance_of(x);
            let cluster = x.cluster();
            let obs = Observation::Closing {
                cluster: &cluster,
                address,
                instance: instance.as_deref(),
            };
            return self.apply(store, &obs, now);
        }
        if part != Part::Headers {
            return Vec::new();
        }
        // A local 503 for a connect failure: as an upstream filter no such
        // reply is seen (the attempt ends instead, see `connect_failed`).
        let failed = !self.upstream
            && self.config.evict_on_connect_failure
            && x.header(crate::headers::STATUS).as_deref() == Some(b"503")
            && x.response_flags()
                .is_some_and(|f| f & (FLAG_UF | FLAG_UC) != 0);
        if failed {
            let cluster = x.cluster();
            let obs = Observation::ConnectFailure {
                cluster: &cluster,
                address,
            };
            return self.apply(store, &obs, now);
        }
        // What answered is membership (used until the admin's is known, and
        // always without an admin cluster); the cluster goes in the shared
        // set the admin refresh reads.
        let cluster = x.cluster();
        let mut effects = self.answered(store, &cluster, address, now);
        self.register_cluster(store, &cluster);
        // Readmission is only a question for a tombstoned address.
        if self.is_tombstoned(store, address, now) {
            let instance = self.instance_of(x);
            let obs = Observation::Answered {
                address,
                instance: instance.as_deref(),
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
        now: u64,
    ) -> Vec<Effect> {
        let cluster = x.cluster();
        let obs = Observation::ConnectFailure {
            cluster: &cluster,
            address,
        };
        self.apply(store, &obs, now)
    }

    fn instance_of(&self, x: &mut dyn Exchange) -> Option<String> {
        instance_id(x.header(self.config.instance_header.as_deref()?))
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

    /// Bumps a generation counter; a failure is logged once per VM copy.
    fn bump(&mut self, store: &dyn SharedStore, gen_key: &str) -> Option<Effect> {
        let e = add_bounded(store, gen_key, 1, u64::MAX).err()?;
        if std::mem::replace(&mut self.bump_warned, true) {
            return None;
        }
        Some(Effect::Log(
            Level::Warn,
            format!(
                "{gen_key} not bumped ({e:?}): other VM copies keep their cached value until the next change (logged once per VM copy)"
            ),
        ))
    }

    /// Applies an observation to the shared tombstones. Reads the cached
    /// list first so the common cases (an answer from a host that is not
    /// tombstoned, a closing mark already recorded) cost no write.
    fn apply(&mut self, store: &dyn SharedStore, obs: &Observation, now: u64) -> Vec<Effect> {
        let max = self.config.max_tombstones as usize;
        let current = self.tombstones.refresh(
            store,
            keys::TOMBSTONES_GEN.name,
            keys::TOMBSTONES.name,
            Tombstones::decode,
        );
        if !current.worth_writing(obs, &self.ttls, now) {
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
        let mut effects: Vec<Effect> = self
            .bump(store, keys::TOMBSTONES_GEN.name)
            .into_iter()
            .collect();
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
            if let Some(m) = self
                .members
                .refresh(
                    store,
                    keys::MEMBERS_GEN.name,
                    keys::MEMBERS.name,
                    Membership::decode,
                )
                .cluster(cluster)
            {
                return m.to_vec();
            }
        }
        match self
            .shared_observed
            .refresh(
                store,
                keys::OBSERVED_GEN.name,
                keys::OBSERVED.name,
                Membership::decode,
            )
            .cluster(cluster)
        {
            Some(m) => m.to_vec(),
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
        let (plan, until_us) = plan(&members, &self.tombstones.value, cluster, now);
        let steering = plan.steering(rotation);
        self.plan = Some(CachedPlan {
            gens,
            cluster: cluster.to_string(),
            until_us,
            plan,
        });
        steering
    }

    /// True if `address` has a live tombstone (from the cached list: one
    /// 8-byte read when nothing changed).
    fn is_tombstoned(&mut self, store: &dyn SharedStore, address: &str, now: u64) -> bool {
        self.tombstones
            .refresh(
                store,
                keys::TOMBSTONES_GEN.name,
                keys::TOMBSTONES.name,
                Tombstones::decode,
            )
            .get_live(address, now)
            .is_some()
    }

    /// Notes that `address` answered; tells the other copies the first time
    /// this copy sees it (writes are as rare as new hosts).
    fn answered(
        &mut self,
        store: &dyn SharedStore,
        cluster: &str,
        address: &str,
        now: u64,
    ) -> Vec<Effect> {
        if !self.observed.record(cluster, address, now) {
            return Vec::new();
        }
        let added = update(store, keys::OBSERVED.name, |bytes| {
            let mut m = bytes.and_then(Membership::decode).unwrap_or_default();
            let new = m.add_member(cluster, address);
            (new.then(|| m.encode()), new)
        });
        if added == Ok(true) {
            return self
                .bump(store, keys::OBSERVED_GEN.name)
                .into_iter()
                .collect();
        }
        Vec::new()
    }
}
