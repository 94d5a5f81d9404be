//! Steering one request: the override list from the cached plan, worked out
//! again only when tombstones or membership changed.

use super::{Consumer, Exchange};
use crate::consumer::steering::{plan, Member, Membership, Plan, Rotations, Rules};
use crate::shared::keys;
use crate::shared::store::SharedStore;

/// A steering plan and what it was worked out from.
pub(super) struct CachedPlan {
    /// Generations of the tombstones, admin membership and observed
    /// membership it was made from (the last None where the admin's
    /// membership lists the cluster).
    gens: (Option<u64>, Option<u64>, Option<u64>),
    cluster: String,
    /// The first expiry of a tombstone it depends on.
    until_us: u64,
    rotations: Rotations,
    /// Every host it lists is tombstoned (the last resort: no acceptable
    /// host), so an answer from a new instance there vouches for the
    /// generation ([`crate::consumer::tombstone::Tombstones::vouch`]).
    last_resort: bool,
}

impl Consumer {
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
    ) -> Option<&str> {
        self.sync(signal);
        self.refresh_tombstones(store);
        // Past this, one tombstone at least is live (the clock is before
        // the latest expiry in the list: no count of the live ones needed),
        // or the admin lists a member `DRAINING`.
        if !self.may_be_live(x) && !self.admin_lists_draining() {
            return None;
        }
        let now = x.now();
        let cluster = x.cluster();
        self.register_cluster(store, &cluster);
        self.rotation = self.rotation.wrapping_add(1);
        let rotation = self.rotation;
        self.rotations(store, &cluster, now)?.list(rotation)
    }

    /// Members of `cluster` to steer among: the admin's view when known,
    /// else the addresses that answered on any copy (a copy that has served
    /// nothing yet still steers from the first tombstone).
    fn members(&mut self, store: &dyn SharedStore, cluster: &str, now: u64) -> Vec<Member> {
        if self.config.admin_cluster.is_some() {
            self.refresh_members(store);
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

    /// The override lists for requests to `cluster`: the plan is worked
    /// out again only when tombstones or membership changed, or a
    /// tombstone in it expired.
    fn rotations(
        &mut self,
        store: &dyn SharedStore,
        cluster: &str,
        now: u64,
    ) -> Option<&Rotations> {
        let (members_gen, admin_lists) = if self.config.admin_cluster.is_some() {
            self.refresh_members(store);
            let lists = self.members.value.cluster(cluster).is_some();
            (self.members.gen, lists)
        } else {
            (None, false)
        };
        // Where the admin lists the cluster, its membership is the plan's
        // only source (see `members`): the observed membership, written as
        // answering hosts are seen again (about 10 times a second under
        // load), must not make every copy plan again.
        let observed_gen = if admin_lists {
            None
        } else {
            self.shared_observed.refresh(
                store,
                keys::OBSERVED_GEN.name,
                keys::OBSERVED.name,
                Membership::decode,
            );
            self.shared_observed.gen
        };
        let gens = (self.tombstones.gen, members_gen, observed_gen);
        let fresh = self.plan.as_ref().is_some_and(|cached| {
            cached.gens == gens && cached.cluster == cluster && now < cached.until_us
        });
        if !fresh {
            let members = self.members(store, cluster, now);
            let rules = self.rules();
            let (plan, until_us) = plan(&members, &self.tombstones.value, cluster, now, &rules);
            let last_resort = match &plan {
                Plan::Hosts { hosts, .. } => {
                    !hosts.is_empty()
                        && hosts
                            .iter()
                            .all(|h| self.tombstones.value.get_live(h, now).is_some())
                }
                Plan::LeaveAlone => false,
            };
            self.plans_made += 1;
            self.plan = Some(CachedPlan {
                gens,
                cluster: cluster.to_string(),
                until_us,
                rotations: Rotations::of(&plan),
                last_resort,
            });
        }
        self.plan.as_ref().map(|cached| &cached.rotations)
    }

    /// What shapes this copy's plans beside membership and tombstones.
    pub(super) fn rules(&self) -> Rules {
        Rules {
            ttls: self.ttls,
            panic_threshold: self.config.panic_threshold,
            slow_start: self.config.readmit_slow_start,
            steer_draining: self.config.front.is_some(),
        }
    }

    /// Whether the admin's membership, as this copy last read it, lists a
    /// member `DRAINING`: then its cluster is steered with no tombstone
    /// live ([`plan()`]). Reads nothing: a request's reads stay what they
    /// were, and the membership is read again where it was (a response's
    /// observation, the refresh, the front's calls), so a change reaches
    /// steering a response later. Once steering, the plan reads it anyway.
    pub(super) fn admin_lists_draining(&self) -> bool {
        // The front role's only: a sidecar consumer leaves it to the balancer.
        self.config.front.is_some() && self.config.admin_cluster.is_some() && self.members_draining
    }

    /// Whether the plan this copy steers `cluster` by is a last resort.
    pub(super) fn steers_last_resort(&self, cluster: &str) -> bool {
        self.plan
            .as_ref()
            .is_some_and(|p| p.last_resort && p.cluster == cluster)
    }
}
