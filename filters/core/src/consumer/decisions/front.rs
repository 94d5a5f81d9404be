//! The front-proxy role's side of the consumer's decisions
//! (docs/design/front-proxy-drain.md §1–§3): what the front endpoints and
//! the front tick (`crate::consumer::filter`) ask of the tombstones, the
//! admin's membership and the steering plan.
//!
//! None of it is on the request path: each call checks the generation keys
//! of what it reads whatever the change signal says (a control request or
//! a tick may come to a copy whose signal has not been synced).

use std::collections::HashMap;
use std::net::Ipv6Addr;

use super::{tombstone_gauges, Consumer, Effect, Exchange, Level};
use crate::consumer::steering::{member_ip, plan, rq_active_by_ip, Membership, Plan};
use crate::consumer::tombstone::{Cause, Change, Tombstones};
use crate::shared::keys;
use crate::shared::metrics::Metric;
use crate::shared::store::{update, SharedStore};

/// What the admin's membership and the steering plans say of one host IP
/// (every member at it, in every cluster the admin lists).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FrontHostView {
    /// Some member at the IP is in the admin's membership.
    pub listed: bool,
    /// Some member at the IP is listed `DRAINING` (EDS health).
    pub draining: bool,
    /// Every member at the IP is listed `HEALTHY` (neither DRAINING nor
    /// otherwise unusable).
    pub healthy: bool,
    /// Every cluster with a member at the IP has an acceptable host known
    /// (one not tombstoned, not closing, not DRAINING), so a plan lists it
    /// and not this IP's members. True when the IP is not listed at all
    /// (no plan can pick what Envoy no longer has: the front then rests on
    /// its guard, §3).
    pub steerable: bool,
}

/// The members at `ip` in `membership`: (cluster, `ip:port`), in the
/// order listed.
fn members_at(membership: &Membership, ip: Ipv6Addr) -> Vec<(String, String)> {
    membership
        .clusters()
        .flat_map(|(cluster, members)| {
            members
                .iter()
                .filter(move |m| member_ip(&m.address) == Some(ip))
                .map(move |m| (cluster.to_string(), m.address.clone()))
        })
        .collect()
}

impl Consumer {
    /// The admin's membership and the tombstones as shared data holds them
    /// now (generation keys read whatever the signal).
    fn front_sync(&mut self, store: &dyn SharedStore) {
        self.members.stale();
        self.refresh_members(store);
        self.tombstones.stale();
        self.refresh_tombstones(store);
    }

    /// The members (cluster, `ip:port` address) at `ip` in the admin's
    /// membership as this copy last read it; empty: not a member (the
    /// front's `closing` then answers 403 `not_a_member`).
    pub fn front_members_at(
        &mut self,
        store: &dyn SharedStore,
        ip: Ipv6Addr,
    ) -> Vec<(String, String)> {
        self.members.stale();
        self.refresh_members(store);
        members_at(&self.members.value, ip)
    }

    /// Tombstones every member at `ip` with the announced cause (lifted by
    /// no answer) until `now_us + ttl_us`, in one shared-data write, and
    /// returns the effects (the generation bump among them). Err: the
    /// write failed (the caller answers 503 and writes nothing else).
    /// Ok(empty): nothing to write (no member at `ip`, or each announced
    /// already until then, within a second).
    pub fn announce_closing(
        &mut self,
        store: &dyn SharedStore,
        ip: Ipv6Addr,
        now_us: u64,
        ttl_us: u64,
    ) -> Result<Vec<Effect>, String> {
        let members = self.front_members_at(store, ip);
        if members.is_empty() {
            return Ok(Vec::new());
        }
        let until_us = now_us.saturating_add(ttl_us);
        let max = self.config.max_tombstones as usize;
        let evicted = self.write_tombstones(store, now_us, |list| {
            let (mut changed, mut evicted) = (0u64, 0u64);
            for (cluster, address) in &members {
                match list.announce(cluster, address, now_us, until_us, max) {
                    Change::Unchanged => {}
                    Change::Evicted => {
                        changed += 1;
                        evicted += 1;
                    }
                    _ => changed += 1,
                }
            }
            (changed > 0).then_some(evicted)
        })?;
        let Some(evicted) = evicted else {
            return Ok(Vec::new());
        };
        let mut effects = self.tombstones_written(store, now_us);
        if evicted > 0 {
            effects.push(Effect::Add(Metric::ConsumerEvictions, evicted));
        }
        let addresses: Vec<&str> = members.iter().map(|(_, a)| a.as_str()).collect();
        effects.push(Effect::Log(
            Level::Info,
            format!(
                "tombstoned {} for {} s: the host announced closing (no answer lifts it)",
                addresses.join(", "),
                ttl_us / 1_000_000
            ),
        ));
        Ok(effects)
    }

    /// Removes the announced tombstones of every member at `ip` (the host
    /// said `serving`, or came back), in one write; Ok(empty) when there
    /// were none. Any announced tombstone at the IP is lifted, listed or
    /// not (a host that left membership and came back may be listed at
    /// another port).
    pub fn lift_announced(
        &mut self,
        store: &dyn SharedStore,
        ip: Ipv6Addr,
        now_us: u64,
    ) -> Result<Vec<Effect>, String> {
        self.tombstones.stale();
        self.refresh_tombstones(store);
        let at_ip = |address: &str| member_ip(address) == Some(ip);
        // Nothing to lift in the list as just read: no write.
        let any = self
            .tombstones
            .value
            .live(now_us)
            .any(|t| t.cause == Cause::Announced && at_ip(&t.address));
        if !any {
            return Ok(Vec::new());
        }
        let lifted = self.write_tombstones(store, now_us, |list| {
            let n = list.lift_announced(now_us, at_ip);
            (n > 0).then_some(n)
        })?;
        let Some(n) = lifted else {
            return Ok(Vec::new());
        };
        let mut effects = self.tombstones_written(store, now_us);
        effects.push(Effect::Add(Metric::ConsumerReadmitted, n as u64));
        effects.push(Effect::Log(
            Level::Info,
            format!("readmitted {n} member(s) at {ip}: the host said it is serving"),
        ));
        Ok(effects)
    }

    /// How the admin's membership and the plans see each IP asked about
    /// (after syncing this copy's caches with shared data).
    pub fn front_view(
        &mut self,
        store: &dyn SharedStore,
        ips: &[Ipv6Addr],
        now_us: u64,
    ) -> HashMap<Ipv6Addr, FrontHostView> {
        self.front_sync(store);
        let rules = self.rules();
        let mut views: HashMap<Ipv6Addr, FrontHostView> = ips
            .iter()
            .map(|ip| {
                let view = FrontHostView {
                    healthy: true,
                    steerable: true,
                    ..FrontHostView::default()
                };
                (*ip, view)
            })
            .collect();
        for (cluster, members) in self.members.value.clusters() {
            // A plan only for a cluster with a member asked about.
            let mut plan_of_cluster: Option<Plan> = None;
            for m in members {
                let Some(view) = member_ip(&m.address).and_then(|ip| views.get_mut(&ip)) else {
                    continue;
                };
                view.listed = true;
                view.draining |= m.draining;
                view.healthy &= m.usable && !m.draining;
                let p = plan_of_cluster.get_or_insert_with(|| {
                    plan(members, &self.tombstones.value, cluster, now_us, &rules).0
                });
                view.steerable &= steers_away_from(p, &self.tombstones.value, &m.address, now_us);
            }
        }
        for view in views.values_mut() {
            view.healthy &= view.listed;
        }
        views
    }

    /// The upstream instance's watch with `front` (design §3's fence, which
    /// cannot answer: see `ConsumerFilter::request_headers`): the attempt's
    /// host when it has a live announced tombstone or is listed `DRAINING`,
    /// else None. `upstream.address` and the clock are read only
    /// while the cached tombstones may hold a live announced entry or the
    /// admin's membership lists a member `DRAINING`; shared data only when
    /// `signal` moved (the per-request protocol).
    pub fn watched(
        &mut self,
        store: &dyn SharedStore,
        x: &mut dyn Exchange,
        signal: Option<u64>,
    ) -> Option<String> {
        self.sync(signal);
        self.refresh_tombstones(store);
        if self.config.admin_cluster.is_some() {
            self.refresh_members(store);
        }
        let draining = self.admin_lists_draining();
        if !self.may_be_announced(x) && !draining {
            return None;
        }
        let address = x.address()?;
        let now = x.now();
        let announced = self
            .tombstones
            .value
            .get_live(&address, now)
            .is_some_and(|t| t.cause == Cause::Announced);
        let listed_draining = draining
            && self
                .members
                .value
                .clusters()
                .any(|(_, ms)| ms.iter().any(|m| m.draining && m.address == address));
        (announced || listed_draining).then_some(address)
    }

    /// [`Consumer::notice_unannounced`] for the watch: the admin's
    /// membership too (its `DRAINING` members), whose writes are the
    /// listener instance's.
    pub fn notice_unannounced_front(
        &mut self,
        store: &dyn SharedStore,
        signal: Option<u64>,
    ) -> Vec<Effect> {
        let mut effects = self.notice_unannounced(store, signal);
        if self.config.admin_cluster.is_some() {
            let before = self.members.gen;
            self.members.stale();
            self.refresh_members(store);
            if self.members.gen != before && effects.is_empty() {
                effects = self.announce();
            }
        }
        effects
    }

    /// IPs of members the admin lists `DRAINING` (the front's closing by
    /// the control plane), after syncing caches.
    pub fn front_draining(&mut self, store: &dyn SharedStore) -> Vec<Ipv6Addr> {
        self.members.stale();
        self.refresh_members(store);
        let mut ips: Vec<Ipv6Addr> = self
            .members
            .value
            .clusters()
            .flat_map(|(_, members)| members.iter())
            .filter(|m| m.draining)
            .filter_map(|m| member_ip(&m.address))
            .collect();
        ips.sort_unstable();
        ips.dedup();
        ips
    }

    /// One read-modify-write of the shared tombstones: `change` edits the
    /// list as stored and returns Some to write it (None: nothing to
    /// write), which is returned.
    fn write_tombstones<R>(
        &mut self,
        store: &dyn SharedStore,
        now_us: u64,
        mut change: impl FnMut(&mut Tombstones) -> Option<R>,
    ) -> Result<Option<R>, String> {
        let max = self.config.max_tombstones as usize;
        let written = update(store, keys::TOMBSTONES.name, |bytes| {
            let mut list = bytes.and_then(Tombstones::decode).unwrap_or_default();
            match change(&mut list) {
                Some(r) => {
                    list.compact(now_us, max);
                    (Some(list.encode()), Some(r))
                }
                None => (None, None),
            }
        });
        written.map_err(|e| format!("tombstones not updated: {e:?}"))
    }

    /// After a tombstone write of this copy: the generation bumped (every
    /// worker steers from its next request), this copy's cache read again
    /// at once, the gauges set; as [`Consumer::apply`] does for a closing
    /// mark.
    fn tombstones_written(&mut self, store: &dyn SharedStore, now_us: u64) -> Vec<Effect> {
        let mut effects = self.bump(store, keys::TOMBSTONES_GEN.name);
        self.tombstones.stale();
        self.refresh_tombstones(store);
        effects.extend(tombstone_gauges(&self.tombstones.value, now_us));
        effects
    }
}

/// Whether `plan` sends no request to `address`: it lists an acceptable
/// host (one not tombstoned at `now_us`), and neither its hosts nor its
/// trial hosts are `address`. A last resort (only tombstoned hosts) is
/// not: past its list the balancer picks, and may pick `address`.
fn steers_away_from(plan: &Plan, tombstones: &Tombstones, address: &str, now_us: u64) -> bool {
    match plan {
        Plan::LeaveAlone => false,
        Plan::Hosts { hosts, trial, .. } => {
            hosts
                .iter()
                .any(|h| tombstones.get_live(h, now_us).is_none())
                && !hosts.iter().chain(trial).any(|h| h == address)
        }
    }
}

/// Per-IP `rq_active` (summed over clusters and ports) from an admin
/// `/clusters?format=json` answer; an IP listed with no `rq_active` stat
/// reads 0 (Envoy omits zero stats). None: not a `/clusters` JSON answer.
pub fn parse_rq_active(body: &[u8]) -> Option<HashMap<Ipv6Addr, u32>> {
    rq_active_by_ip(body)
}
