//! `graceful_consumer`: the consumer's outbound sidecar filter.
//!
//! Per stream: drop any override header the client sent, count the request
//! in the outbound in-flight counter, and, while the target cluster has live
//! tombstones, name the acceptable hosts in the override header that
//! Envoy's `override_host` policy reads. On the response: a closing mark
//! (headers or trailers) or a connect failure tombstones the host that
//! answered; an answer from a new instance at a tombstoned address readmits
//! it. Tombstones are one shared-data value, so every worker steers by them.
//!
//! One VM copy per `membership_refresh` (a lease) refreshes the membership
//! of clusters with tombstones from Envoy's admin and probes tombstoned
//! hosts for a new instance.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use graceful_core::config::ConsumerConfig;
use graceful_core::steering::{
    admin_clusters_path, plan, probe_observation, probe_targets, ClusterSet, Member, Membership,
    Observed, Plan, Steering, ADDRESS_HEADER, CLUSTERS_KEY, MEMBERS_KEY, OBSERVED_KEY,
    REFRESH_LEASE_KEY,
};
use graceful_core::store::{self, add_bounded, take_lease, update, SharedStore};
use graceful_core::tombstone::{
    Cause, Change, Observation, Tombstones, Ttls, TOMBSTONES_GEN_KEY, TOMBSTONES_KEY,
};
use graceful_core::traffic::{self, OUTBOUND_KEY};
use graceful_host::{
    header, now_us, property, property_u64, remove_header, replace_header, HostStore, Metric,
};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> {
        Box::new(ConsumerRoot { shared: None, upstream: false, admin_call: None, admin_wanted: Vec::new(), probes: HashMap::new() })
    });
}}

/// Legacy response-flag bits (Envoy `stream_info.h`): upstream connection
/// failure and upstream connection termination.
const FLAG_UF: u64 = 0x20;
const FLAG_UC: u64 = 0x40;
const MEMBERS_GEN_KEY: &str = "graceful.v1.consumer.members.gen";
const OBSERVED_GEN_KEY: &str = "graceful.v1.consumer.observed.gen";
const CALL_TIMEOUT: Duration = Duration::from_secs(1);
/// A repeated closing mark extends a tombstone only when that adds at
/// least this much life: otherwise every marked response would be a write.
const EXTEND_GRANULARITY_US: u64 = 1_000_000;
/// Most admin `/clusters` bytes read.
const MAX_ADMIN_BODY: usize = 4 << 20;

/// A shared-data value decoded once per change, found by a generation
/// counter so a request reads 8 bytes when nothing changed.
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

    fn refresh(&mut self, gen_key: &str, key: &str, decode: fn(&[u8]) -> Option<T>) -> &T {
        let gen = HostStore
            .get(gen_key)
            .ok()
            .flatten()
            .and_then(|(b, _)| store::read_u64(&b))
            .unwrap_or(0);
        if self.gen != Some(gen) {
            self.value = HostStore
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

/// Every shared-data key the consumer updates, with the value it starts
/// from (each decodes as "nothing yet", as a missing key did).
fn initial_shared_data() -> [(&'static str, Vec<u8>); 9] {
    let zero = || 0u64.to_le_bytes().to_vec();
    [
        (OUTBOUND_KEY, traffic::Traffic::default().encode().to_vec()),
        (TOMBSTONES_KEY, Tombstones::default().encode()),
        (TOMBSTONES_GEN_KEY, zero()),
        (MEMBERS_KEY, Membership::default().encode()),
        (MEMBERS_GEN_KEY, zero()),
        (OBSERVED_KEY, Membership::default().encode()),
        (OBSERVED_GEN_KEY, zero()),
        (CLUSTERS_KEY, ClusterSet::default().encode()),
        (REFRESH_LEASE_KEY, zero()),
    ]
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

struct Metrics {
    tombstones: Metric,
    /// Size of the shared tombstone value: shows it stays bounded.
    tombstone_bytes: Metric,
    evictions: Metric,
    steered: Metric,
    readmitted: Metric,
    inflight: Metric,
}

struct Shared {
    config: ConsumerConfig,
    /// Runs as an upstream HTTP filter of the cluster (one stream per
    /// attempt), chosen by the VM configuration `upstream`.
    upstream: bool,
    ttls: Ttls,
    metrics: Metrics,
    tombstones: RefCell<Cached<Tombstones>>,
    members: RefCell<Cached<Membership>>,
    /// Addresses that answered, as every copy saw them (without admin).
    shared_observed: RefCell<Cached<Membership>>,
    /// Addresses this copy saw answer (and told the others about).
    observed: RefCell<Observed>,
    /// Clusters this VM copy has already added to the shared cluster set.
    registered: RefCell<Vec<String>>,
    /// The last steering plan, valid while tombstones and membership keep
    /// their generations and no tombstone in it expires.
    plan: RefCell<Option<CachedPlan>>,

    rotation: RefCell<usize>,
}

impl Shared {
    /// Applies an observation to the shared tombstones. Reads the cached
    /// list first so the common cases (an answer from a host that is not
    /// tombstoned, a closing mark already recorded) cost no write.
    fn apply(&self, obs: &Observation, now: u64) {
        let max = self.config.max_tombstones as usize;
        {
            let mut cache = self.tombstones.borrow_mut();
            let current = cache.refresh(TOMBSTONES_GEN_KEY, TOMBSTONES_KEY, Tombstones::decode);
            if !worth_writing(current, obs, &self.ttls, now) {
                return;
            }
        }
        let result = update(&HostStore, TOMBSTONES_KEY, |bytes| {
            let mut list = bytes.and_then(Tombstones::decode).unwrap_or_default();
            let change = list.observe(obs, &self.ttls, now, max);
            let live = list.live_count(now);
            let value = (change != Change::Unchanged).then(|| list.encode());
            let size = value.as_ref().map_or(0, Vec::len);
            (value, (change, live, size))
        });
        let (change, live, size) = match result {
            Ok(r) => r,
            Err(e) => {
                log::warn!("tombstones not updated: {e:?}");
                return;
            }
        };
        if change == Change::Unchanged {
            return;
        }
        let _ = add_bounded(&HostStore, TOMBSTONES_GEN_KEY, 1, u64::MAX);
        self.metrics.tombstones.set(live as u64);
        self.metrics.tombstone_bytes.set(size as u64);
        match (change, obs) {
            (
                Change::Evicted,
                Observation::Closing {
                    address, instance, ..
                },
            ) => {
                self.metrics.evictions.add(1);
                log::info!(
                    "tombstoned {address} (instance {}) for {:?}: closing mark",
                    instance.unwrap_or("unknown"),
                    self.ttls.closing
                );
            }
            (Change::Evicted, Observation::ConnectFailure { address, .. }) => {
                self.metrics.evictions.add(1);
                log::info!(
                    "tombstoned {address} for {:?}: connect failure",
                    self.ttls.failure
                );
            }
            (Change::Readmitted, Observation::Answered { address, instance }) => {
                self.metrics.readmitted.add(1);
                log::info!(
                    "readmitted {address}: new instance {}",
                    instance.unwrap_or("unknown")
                );
            }
            _ => {}
        }
    }

    /// Members of `cluster` to steer among: the admin's view when known,
    /// else the addresses that answered on any copy (a copy that has served
    /// nothing yet still steers from the first tombstone).
    fn members(&self, cluster: &str, now: u64) -> Vec<Member> {
        if self.config.admin_cluster.is_some() {
            let mut cache = self.members.borrow_mut();
            if let Some(m) = cache
                .refresh(MEMBERS_GEN_KEY, MEMBERS_KEY, Membership::decode)
                .cluster(cluster)
            {
                return m.to_vec();
            }
        }
        let mut cache = self.shared_observed.borrow_mut();
        match cache
            .refresh(OBSERVED_GEN_KEY, OBSERVED_KEY, Membership::decode)
            .cluster(cluster)
        {
            Some(m) => m.to_vec(),
            None => self.observed.borrow().members(cluster, now),
        }
    }

    /// The steering for one request to `cluster`: the plan is worked out
    /// again only when tombstones or membership changed, or a tombstone in
    /// it expired, so a steered request costs a rotation, not a scan.
    fn steering(&self, cluster: &str, now: u64, rotation: usize) -> Steering {
        let members_gen = self.config.admin_cluster.as_ref().and_then(|_| {
            let mut cache = self.members.borrow_mut();
            cache.refresh(MEMBERS_GEN_KEY, MEMBERS_KEY, Membership::decode);
            cache.gen
        });
        let observed_gen = {
            let mut cache = self.shared_observed.borrow_mut();
            cache.refresh(OBSERVED_GEN_KEY, OBSERVED_KEY, Membership::decode);
            cache.gen
        };
        let gens = (self.tombstones.borrow().gen, members_gen, observed_gen);
        if let Some(cached) = self.plan.borrow().as_ref() {
            if cached.gens == gens && cached.cluster == cluster && now < cached.until_us {
                return cached.plan.steering(rotation);
            }
        }
        let members = self.members(cluster, now);
        let (plan, until_us) = plan(&members, &self.tombstones.borrow().value, cluster, now);
        let steering = plan.steering(rotation);
        *self.plan.borrow_mut() = Some(CachedPlan {
            gens,
            cluster: cluster.to_string(),
            until_us,
            plan,
        });
        steering
    }

    /// True if `address` has a live tombstone (from the cached list: one
    /// 8-byte read when nothing changed).
    fn is_tombstoned(&self, address: &str, now: u64) -> bool {
        let mut cache = self.tombstones.borrow_mut();
        let list = cache.refresh(TOMBSTONES_GEN_KEY, TOMBSTONES_KEY, Tombstones::decode);
        list.get_live(address, now).is_some()
    }

    /// Notes that `address` answered; tells the other copies the first time
    /// this copy sees it (writes are as rare as new hosts).
    fn answered(&self, cluster: &str, address: &str, now: u64) {
        if !self.observed.borrow_mut().record(cluster, address, now) {
            return;
        }
        let added = update(&HostStore, OBSERVED_KEY, |bytes| {
            let mut m = bytes.and_then(Membership::decode).unwrap_or_default();
            let new = m.add_member(cluster, address);
            (new.then(|| m.encode()), new)
        });
        if added == Ok(true) {
            let _ = add_bounded(&HostStore, OBSERVED_GEN_KEY, 1, u64::MAX);
        }
    }
}

/// False when applying `obs` to `current` could not change anything.
fn worth_writing(current: &Tombstones, obs: &Observation, ttls: &Ttls, now: u64) -> bool {
    match obs {
        Observation::Answered { address, instance } => current
            .get_live(address, now)
            .is_some_and(|t| instance.is_some_and(|i| t.instance.is_empty() || t.instance != i)),
        Observation::Closing {
            address, instance, ..
        } => current.get_live(address, now).is_none_or(|t| {
            // A closing mark on a connect-failure tombstone changes its cause.
            let new_instance =
                instance.is_some_and(|i| t.instance != i) || t.cause != Cause::Closing;
            let ttl = u64::try_from(ttls.closing.as_micros()).unwrap_or(u64::MAX);
            new_instance
                || now.saturating_add(ttl) > t.expires_us.saturating_add(EXTEND_GRANULARITY_US)
        }),
        Observation::ConnectFailure { address, .. } => {
            current.get_live(address, now).is_none_or(|t| {
                let ttl = u64::try_from(ttls.failure.as_micros()).unwrap_or(u64::MAX);
                now.saturating_add(ttl) > t.expires_us.saturating_add(EXTEND_GRANULARITY_US)
            })
        }
    }
}

fn is_true(value: &[u8]) -> bool {
    // Duplicate headers may arrive joined with commas.
    value
        .split(|&b| b == b',')
        .any(|v| v.trim_ascii().eq_ignore_ascii_case(b"true"))
}

fn instance_of(map: MapType, name: Option<&str>) -> Option<String> {
    let id = header(map, name?)?;
    graceful_core::instance::is_valid(&id).then(|| String::from_utf8_lossy(&id).into_owned())
}

struct ConsumerRoot {
    shared: Option<Rc<Shared>>,
    /// `vm_config.configuration` was `upstream`.
    upstream: bool,
    admin_call: Option<u32>,
    /// The clusters asked of the admin in the call in flight.
    admin_wanted: Vec<String>,
    /// Probe calls in flight: token → probed address.
    probes: HashMap<u32, String>,
}

impl ConsumerRoot {
    fn refresh(&mut self, shared: &Shared, now: u64) {
        let tombstones = {
            let mut cache = shared.tombstones.borrow_mut();
            cache
                .refresh(TOMBSTONES_GEN_KEY, TOMBSTONES_KEY, Tombstones::decode)
                .clone()
        };
        shared
            .metrics
            .tombstones
            .set(tombstones.live_count(now) as u64);
        if let Some(admin) = &shared.config.admin_cluster {
            // Membership of every cluster routed to, not only those with
            // tombstones: a new tombstone then steers from its first moment.
            let mut clusters = HostStore
                .get(CLUSTERS_KEY)
                .ok()
                .flatten()
                .and_then(|(b, _)| ClusterSet::decode(&b))
                .unwrap_or_default();
            for t in tombstones.live(now) {
                clusters.insert(&t.cluster);
            }
            let names: Vec<&str> = clusters.names().collect();
            if self.admin_call.is_none() && !names.is_empty() {
                let path = admin_clusters_path(&names);
                let headers = vec![
                    (":method", "GET"),
                    (":path", path.as_str()),
                    (":authority", "envoy-admin"),
                ];
                match self.dispatch_http_call(admin, headers, None, vec![], CALL_TIMEOUT) {
                    Ok(token) => {
                        self.admin_call = Some(token);
                        self.admin_wanted = names.iter().map(|n| n.to_string()).collect();
                    }
                    Err(status) => {
                        log::warn!("membership refresh from {admin:?} not sent: {status:?}")
                    }
                }
            }
        }
        if shared.config.admin_cluster.is_none() {
            self.probe(shared, &tombstones, &Membership::default(), now);
        }
        // With an admin cluster, probes follow its answer, so they see the
        // membership as it is now (a restarted host is probed as soon as
        // the registry has it back).
    }

    /// Probes each live tombstone still in its cluster for a new instance.
    fn probe(
        &mut self,
        shared: &Shared,
        tombstones: &Tombstones,
        membership: &Membership,
        now: u64,
    ) {
        let Some(probe_path) = &shared.config.probe_path else {
            return;
        };
        for t in probe_targets(tombstones, membership, now) {
            if self.probes.values().any(|a| a == &t.address) {
                continue;
            }
            let headers = vec![
                (":method", "GET"),
                (":path", probe_path.as_str()),
                // The host's own address: a cluster name is no valid Host
                // (Istio's `outbound|80||svc` has `|`, and the provider's
                // sidecar answers such a probe 400).
                (":authority", t.address.as_str()),
                (
                    shared.config.override_host_header.as_str(),
                    t.address.as_str(),
                ),
            ];
            match self.dispatch_http_call(&t.cluster, headers, None, vec![], CALL_TIMEOUT) {
                Ok(token) => {
                    self.probes.insert(token, t.address.clone());
                }
                Err(status) => log::debug!("probe of {} not sent: {status:?}", t.address),
            }
        }
    }
}

impl Context for ConsumerRoot {
    fn on_http_call_response(
        &mut self,
        token: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        let status = header(MapType::HttpCallResponseHeaders, ":status");
        if self.admin_call == Some(token) {
            self.admin_call = None;
            let now = now_us();
            let tombstones = shared.tombstones.borrow().value.clone();
            if status.as_deref() != Some(b"200") {
                log::warn!(
                    "membership refresh failed: status {:?}",
                    status.map(|s| String::from_utf8_lossy(&s).into_owned())
                );
                let last_known = shared.members.borrow().value.clone();
                self.probe(&shared, &tombstones, &last_known, now);
                return;
            }
            let body = hostcalls::get_buffer(
                BufferType::HttpCallResponseBody,
                0,
                body_size.min(MAX_ADMIN_BODY),
            )
            .ok()
            .flatten()
            .unwrap_or_default();
            let wanted: Vec<&str> = self.admin_wanted.iter().map(String::as_str).collect();
            let membership = match Membership::from_admin_json(&body, &wanted) {
                Ok(m) => {
                    // Written only when it changed: every change makes each
                    // worker decode it again.
                    let changed = shared.members.borrow_mut().refresh(
                        MEMBERS_GEN_KEY,
                        MEMBERS_KEY,
                        Membership::decode,
                    ) != &m;
                    if changed && HostStore.set(MEMBERS_KEY, &m.encode(), 0).is_ok() {
                        let _ = add_bounded(&HostStore, MEMBERS_GEN_KEY, 1, u64::MAX);
                    }
                    m
                }
                Err(e) => {
                    log::warn!("membership refresh: unreadable /clusters answer: {e}");
                    shared.members.borrow().value.clone()
                }
            };
            self.probe(&shared, &tombstones, &membership, now);
        } else if let Some(address) = self.probes.remove(&token) {
            let answered_at = header(MapType::HttpCallResponseHeaders, ADDRESS_HEADER);
            let instance = instance_of(
                MapType::HttpCallResponseHeaders,
                shared.config.instance_header.as_deref(),
            );
            if let Some(obs) = probe_observation(
                &address,
                status.as_deref(),
                answered_at.as_deref(),
                instance.as_deref(),
            ) {
                shared.apply(&obs, now_us());
            }
        }
    }
}

impl RootContext for ConsumerRoot {
    /// The VM configuration says where the filter sits: empty for the
    /// listener's filter chain, `upstream` for the cluster's upstream filters
    /// (one stream per attempt: it only observes, so retries hide nothing).
    /// A separate VM configuration also gives the upstream instance a VM of
    /// its own, which it needs: the downstream instance's probes go through
    /// the cluster, and a VM entered again from its own root callback traps.
    fn on_vm_start(&mut self, size: usize) -> bool {
        let vm_config = hostcalls::get_buffer(BufferType::VmConfiguration, 0, size)
            .ok()
            .flatten()
            .unwrap_or_default();
        match vm_config.trim_ascii() {
            b"" => self.upstream = false,
            b"upstream" => self.upstream = true,
            other => {
                log::error!(
                    "graceful_consumer: invalid vm_config.configuration {:?}: empty, or \"upstream\" for an upstream filter",
                    String::from_utf8_lossy(other)
                );
                return false;
            }
        }
        true
    }

    fn on_configure(&mut self, _size: usize) -> bool {
        let config = match ConsumerConfig::from_json(&graceful_host::plugin_configuration()) {
            Ok(c) => c,
            Err(e) => {
                log::error!("graceful_consumer: {e}");
                return false;
            }
        };
        // Every key a stream or tick updates is created here, before any
        // stream runs: Envoy ignores CAS on a missing key, so two workers
        // creating one at once would both succeed and one change be lost
        // (see graceful_core::store::ensure_all).
        if let Err((key, e)) = store::ensure_all(&HostStore, &initial_shared_data()) {
            log::error!("graceful_consumer: cannot initialise shared data {key:?}: {e:?}");
            return false;
        }
        // Membership refreshes and probes are the downstream instance's: an
        // upstream instance taking the refresh lease would skip a refresh.
        if !self.upstream {
            graceful_host::set_tick_period(config.membership_refresh);
        }
        self.shared = Some(Rc::new(Shared {
            upstream: self.upstream,
            ttls: Ttls {
                closing: config.tombstone_ttl,
                failure: config.failure_tombstone_ttl,
            },
            config,
            metrics: Metrics {
                tombstones: Metric::gauge("graceful_consumer_tombstones"),
                tombstone_bytes: Metric::gauge("graceful_consumer_tombstone_bytes"),
                evictions: Metric::counter("graceful_consumer_evictions"),
                steered: Metric::counter("graceful_consumer_steered"),
                readmitted: Metric::counter("graceful_consumer_readmitted"),
                inflight: Metric::gauge("graceful_consumer_inflight"),
            },
            tombstones: RefCell::new(Cached::new()),
            members: RefCell::new(Cached::new()),
            shared_observed: RefCell::new(Cached::new()),
            observed: RefCell::new(Observed::default()),
            registered: RefCell::new(Vec::new()),
            plan: RefCell::new(None),

            rotation: RefCell::new(0),
        }));
        true
    }

    fn on_tick(&mut self) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        let now = now_us();
        // The outbound gauge follows the shared count here, not per request:
        // exact, and two hostcalls a request cheaper.
        if let Ok(t) = traffic::read(&HostStore, OUTBOUND_KEY) {
            shared.metrics.inflight.set(t.inflight);
        }
        let interval =
            u64::try_from(shared.config.membership_refresh.as_micros()).unwrap_or(u64::MAX);
        if take_lease(&HostStore, REFRESH_LEASE_KEY, now, interval).unwrap_or(false) {
            self.refresh(&shared, now);
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(ConsumerStream {
            shared: self.shared.clone(),
            counted: false,
            cluster: None,
            attempt: None,
            answered: false,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct ConsumerStream {
    shared: Option<Rc<Shared>>,
    /// In the outbound in-flight count; leaves it in `on_done`.
    counted: bool,
    /// The route's cluster, once read (`xds.cluster_name` is the route's,
    /// readable in both phases).
    cluster: Option<String>,
    /// As an upstream filter: the host this attempt goes to.
    attempt: Option<String>,
    /// Response headers arrived for this stream.
    answered: bool,
}

impl ConsumerStream {
    /// Adds the route's cluster to the shared set the membership refresh
    /// reads, once per VM copy and cluster.
    fn register_cluster(&mut self, shared: &Shared) {
        if shared.config.admin_cluster.is_none() {
            return;
        }
        let cluster = self.cluster().to_string();
        if cluster.is_empty() || shared.registered.borrow().contains(&cluster) {
            return;
        }
        let added = update(&HostStore, CLUSTERS_KEY, |bytes| {
            let mut set = bytes.and_then(ClusterSet::decode).unwrap_or_default();
            let new = set.insert(&cluster);
            (new.then(|| set.encode()), ())
        });
        if added.is_ok() {
            shared.registered.borrow_mut().push(cluster);
        }
    }

    /// The route's cluster, read once per stream and only when needed (a
    /// property lookup is among the dearer hostcalls).
    fn cluster(&mut self) -> &str {
        if self.cluster.is_none() {
            let name = property(&["xds", "cluster_name"]).and_then(|c| String::from_utf8(c).ok());
            self.cluster = Some(name.unwrap_or_default());
        }
        self.cluster.as_deref().unwrap_or_default()
    }

    fn steer(&mut self, shared: &Shared, now: u64) {
        let any_live = {
            let mut cache = shared.tombstones.borrow_mut();
            let live = cache
                .refresh(TOMBSTONES_GEN_KEY, TOMBSTONES_KEY, Tombstones::decode)
                .live_count(now);
            live > 0
        };
        if !any_live {
            return;
        }
        self.register_cluster(shared);
        let cluster = self.cluster().to_string();
        let rotation = {
            let mut r = shared.rotation.borrow_mut();
            *r = r.wrapping_add(1);
            *r
        };
        let decision = shared.steering(&cluster, now, rotation);
        match decision {
            Steering::Steer(list) => {
                if replace_header(
                    MapType::HttpRequestHeaders,
                    &shared.config.override_host_header,
                    &list,
                ) {
                    shared.metrics.steered.add(1);
                }
            }
            // Every known member is tombstoned: nothing better to offer.
            Steering::NoneLeft | Steering::LeaveAlone => {}
        }
    }

    fn observe_response(&mut self, shared: &Shared, map: MapType) {
        let Some(address) =
            property(&["upstream", "address"]).and_then(|a| String::from_utf8(a).ok())
        else {
            return;
        };
        let now = now_us();
        let closing = shared
            .config
            .closing_headers
            .iter()
            .any(|h| header(map, h).is_some_and(|v| is_true(&v)));
        if closing {
            let instance = instance_of(map, shared.config.instance_header.as_deref());
            let cluster = self.cluster().to_string();
            let obs = Observation::Closing {
                cluster: &cluster,
                address: &address,
                instance: instance.as_deref(),
            };
            shared.apply(&obs, now);
            return;
        }
        if map != MapType::HttpResponseHeaders {
            return;
        }
        let failed = !shared.upstream
            && shared.config.evict_on_connect_failure
            && header(map, ":status").as_deref() == Some(b"503")
            && property_u64(&["response", "flags"]).is_some_and(|f| f & (FLAG_UF | FLAG_UC) != 0);
        if failed {
            let cluster = self.cluster().to_string();
            shared.apply(
                &Observation::ConnectFailure {
                    cluster: &cluster,
                    address: &address,
                },
                now,
            );
            return;
        }
        // What answered is membership (used until the admin's is known, and
        // always without an admin cluster); the cluster goes in the shared
        // set the admin refresh reads.
        let cluster = self.cluster().to_string();
        shared.answered(&cluster, &address, now);
        self.register_cluster(shared);
        // Readmission is only a question for a tombstoned address.
        if shared.is_tombstoned(&address, now) {
            let instance = instance_of(map, shared.config.instance_header.as_deref());
            shared.apply(
                &Observation::Answered {
                    address: &address,
                    instance: instance.as_deref(),
                },
                now,
            );
        }
    }
}

impl Context for ConsumerStream {
    /// Envoy calls `on_done` once when it destroys the filter of every
    /// stream, downstream and upstream (`on_log` never reaches an upstream
    /// filter, and is one more VM entry per stream: the module does not
    /// export it). Downstream: the request leaves the outbound count. As an
    /// upstream filter: an attempt that ends without response headers and
    /// with a transport failure reason could not connect, even if a retry
    /// then succeeded.
    fn on_done(&mut self) -> bool {
        if std::mem::take(&mut self.counted) {
            if let Err(e) = traffic::record_end(&HostStore, OUTBOUND_KEY) {
                log::error!("outbound in-flight count not decremented: {e:?}");
            }
        }
        let Some(shared) = self.shared.clone() else {
            return true;
        };
        if !shared.upstream || self.answered || !shared.config.evict_on_connect_failure {
            return true;
        }
        let Some(address) = self.attempt.take() else {
            return true;
        };
        let failed_to_connect =
            property(&["upstream", "transport_failure_reason"]).is_some_and(|r| !r.is_empty());
        if failed_to_connect {
            let cluster = self.cluster().to_string();
            shared.apply(
                &Observation::ConnectFailure {
                    cluster: &cluster,
                    address: &address,
                },
                now_us(),
            );
        }
        true
    }
}

impl HttpContext for ConsumerStream {
    fn on_http_request_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.clone() else {
            return Action::Continue;
        };
        // No client may steer hosts: whatever it sent in the override
        // header is dropped before anything else. (As an upstream filter the
        // header has done its work: dropping it keeps it from the provider.)
        remove_header(
            MapType::HttpRequestHeaders,
            &shared.config.override_host_header,
        );
        if shared.upstream {
            // One stream per attempt, after host selection (envoy-facts §6.2):
            // note where it goes; counting and steering are the downstream
            // filter's.
            self.attempt =
                property(&["upstream", "address"]).and_then(|a| String::from_utf8(a).ok());
            return Action::Continue;
        }
        let now = now_us();
        match traffic::record_start(&HostStore, OUTBOUND_KEY, now) {
            Ok(_) => self.counted = true,
            Err(e) => log::warn!("outbound request not counted: {e:?}"),
        }
        self.steer(&shared, now);
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        self.answered = true;
        if let Some(shared) = self.shared.clone() {
            self.observe_response(&shared, MapType::HttpResponseHeaders);
        }
        Action::Continue
    }

    fn on_http_response_trailers(&mut self, _trailers: usize) -> Action {
        if let Some(shared) = self.shared.clone() {
            self.observe_response(&shared, MapType::HttpResponseTrailers);
        }
        Action::Continue
    }
}
