//! Which hosts requests to a cluster may go to while it has live
//! tombstones, and the override header of one request.

use std::collections::{HashMap, HashSet};

use super::Member;
use crate::tombstone::{Cause, Tombstone, Tombstones, Ttls};

/// Most hosts named in one override header: enough for the first attempt
/// and retries; past the list Envoy uses the fallback policy.
pub const MAX_OVERRIDE_HOSTS: usize = 8;

/// What to do with one request's host selection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Steering {
    /// No live tombstone concerns this cluster: the load balancer decides.
    LeaveAlone,
    /// Put this list in the override header.
    Steer(String),
    /// Every known usable member is tombstoned: nothing better to offer,
    /// the load balancer decides.
    NoneLeft,
}

/// Which hosts requests to a cluster may go to, worked out once per change
/// of tombstones or membership (a request then only rotates the list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// No live tombstone concerns this cluster: the load balancer decides.
    LeaveAlone,
    /// The acceptable hosts, in member order; empty when every known usable
    /// member is tombstoned.
    Hosts(Vec<String>),
}

impl Plan {
    /// The steering for one request; `rotation` spreads the first pick
    /// (pass a per-request counter). The request path keeps the plan's
    /// [`Rotations`] instead.
    pub fn steering(&self, rotation: usize) -> Steering {
        match self {
            Plan::LeaveAlone => Steering::LeaveAlone,
            Plan::Hosts(_) => match Rotations::of(self).list(rotation) {
                Some(list) => Steering::Steer(list.to_string()),
                None => Steering::NoneLeft,
            },
        }
    }
}

/// A plan's override lists, one per rotation, as slices of one string: a
/// steered request takes its list without allocating or joining.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rotations {
    /// The hosts joined by commas, then the first `per_list - 1` again, so
    /// that every rotation's list is contiguous.
    ring: String,
    /// Where each host of `ring` starts, then one past the end plus one
    /// (as if a comma followed the last).
    starts: Vec<usize>,
    hosts: usize,
    per_list: usize,
}

impl Rotations {
    /// The rotations of `plan` (none for `LeaveAlone` or no hosts).
    pub fn of(plan: &Plan) -> Rotations {
        let Plan::Hosts(hosts) = plan else {
            return Rotations::default();
        };
        let per_list = hosts.len().min(MAX_OVERRIDE_HOSTS);
        let mut ring = String::new();
        let mut starts = Vec::with_capacity(hosts.len() + per_list);
        for host in hosts
            .iter()
            .chain(hosts.iter().take(per_list.saturating_sub(1)))
        {
            if !ring.is_empty() {
                ring.push(',');
            }
            starts.push(ring.len());
            ring.push_str(host);
        }
        starts.push(ring.len() + 1);
        Rotations {
            ring,
            starts,
            hosts: hosts.len(),
            per_list,
        }
    }

    /// The override list of request `rotation`: `per_list` hosts from the
    /// rotation's one on; None when there is no host to list.
    pub fn list(&self, rotation: usize) -> Option<&str> {
        if self.hosts == 0 {
            return None;
        }
        let first = rotation % self.hosts;
        let start = *self.starts.get(first)?;
        let end = self.starts.get(first + self.per_list)?.checked_sub(1)?;
        self.ring.get(start..end)
    }
}

/// What shapes a plan beside membership and tombstones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// The tombstone TTLs: a tombstone's closing (or failure) was last
    /// confirmed at its expiry minus its cause's TTL.
    pub ttls: Ttls,
    /// Percent of the usable members steering keeps listing (the
    /// consumer's `panic_threshold`; 0: no floor).
    pub panic_threshold: u8,
}

impl Rules {
    /// How many hosts a plan lists at least, of `usable` members.
    fn floor(&self, usable: usize) -> usize {
        (usable * usize::from(self.panic_threshold)).div_ceil(100)
    }

    /// When the host's closing (or connect failure) was last confirmed.
    fn confirmed_us(&self, t: &Tombstone) -> u64 {
        let ttl = match t.cause {
            Cause::Closing => self.ttls.closing,
            Cause::ConnectFailure => self.ttls.failure,
        };
        t.expires_us
            .saturating_sub(u64::try_from(ttl.as_micros()).unwrap_or(u64::MAX))
    }
}

/// The plan for `cluster` at `now_us`, and until when it holds (the next
/// expiry of a tombstone it depends on).
///
/// The hosts are the usable members minus the tombstoned ones, of the
/// first priority that has any left: Envoy sends a cluster's traffic to
/// its priority 0 while those hosts are healthy, and Istio's locality
/// failover and `trafficDistribution` put the consumer's own zone there,
/// so steering keeps traffic where the balancer would have kept it
/// (`override_host` itself ignores priorities: the list must). When that
/// leaves fewer than the panic floor (`panic_threshold` percent of the
/// usable members, rounded up) but at least one, the plan also lists the
/// tombstoned members whose closing was confirmed longest ago, up to the
/// floor: like Envoy's `healthy_panic_threshold`, so that when a whole
/// generation restarts on the same addresses and its new instances cannot
/// be probed, the few hosts left do not take the whole load until the
/// others' tombstones expire. A listed host that still answers closing
/// confirms its tombstone again (a write: every copy plans again) and the
/// next longest-confirmed one takes its place; one that answers with a new
/// instance id is readmitted. With none left at all, the balancer decides.
pub fn plan(
    members: &[Member],
    tombstones: &Tombstones,
    cluster: &str,
    now_us: u64,
    rules: &Rules,
) -> (Plan, u64) {
    // Linear in members + tombstones: a plan is worked out again on every
    // tombstone write, and a mesh cluster of 1,024 members beside 1,024
    // tombstones made a member-by-tombstone scan a million comparisons.
    let mut dead: HashMap<&str, &Tombstone> = HashMap::new();
    let mut until = u64::MAX;
    let mut concerned = false;
    for t in tombstones.live(now_us) {
        until = until.min(t.expires_us);
        concerned |= t.cluster == cluster;
        // The first entry for an address stands, as a scan would find it.
        dead.entry(t.address.as_str()).or_insert(t);
    }
    concerned |= members
        .iter()
        .any(|m| dead.contains_key(m.address.as_str()));
    if !concerned {
        return (Plan::LeaveAlone, until);
    }
    let tombstone_of = |address: &str| dead.get(address).copied();
    // The first priority with a usable member that is not tombstoned; with
    // none, the first with a usable member (the panic floor below decides).
    let first_with = |acceptable_only: bool| {
        members
            .iter()
            .filter(|m| m.usable && !(acceptable_only && tombstone_of(&m.address).is_some()))
            .map(|m| m.priority)
            .min()
    };
    let priority = first_with(true).or_else(|| first_with(false));
    let mut listed: HashSet<&str> = HashSet::new();
    let usable: Vec<&str> = members
        .iter()
        .filter(|m| m.usable && Some(m.priority) == priority && listed.insert(&m.address))
        .map(|m| m.address.as_str())
        .collect();
    let (mut acceptable, mut tombstoned): (Vec<&str>, Vec<&str>) =
        usable.iter().partition(|a| tombstone_of(a).is_none());
    let floor = rules.floor(usable.len());
    if !acceptable.is_empty() && acceptable.len() < floor {
        tombstoned.sort_by_key(|a| (tombstone_of(a).map_or(0, |t| rules.confirmed_us(t)), *a));
        acceptable.extend(tombstoned.into_iter().take(floor - acceptable.len()));
    }
    (
        Plan::Hosts(acceptable.into_iter().map(str::to_string).collect()),
        until,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::steering::testing::{members, tombstoned, RULES, TTLS};
    use crate::tombstone::Observation;

    /// One request's steering: the plan and one rotation of it.
    fn steer(
        members: &[Member],
        tombstones: &Tombstones,
        cluster: &str,
        now_us: u64,
        rotation: usize,
    ) -> Steering {
        plan(members, tombstones, cluster, now_us, &RULES)
            .0
            .steering(rotation)
    }

    #[test]
    fn leaves_the_balancer_alone_without_tombstones() {
        let m = members(&["a:1", "b:1"]);
        assert_eq!(
            steer(&m, &Tombstones::default(), "svc", 0, 0),
            Steering::LeaveAlone
        );
        assert_eq!(
            steer(&m, &tombstoned(&["z:1"]), "other", 0, 0),
            Steering::LeaveAlone,
            "another cluster's host"
        );
    }

    #[test]
    fn names_every_other_member_rotating_the_first() {
        let m = members(&["a:1", "b:1", "c:1"]);
        let t = tombstoned(&["b:1"]);
        assert_eq!(
            steer(&m, &t, "svc", 0, 0),
            Steering::Steer("a:1,c:1".into())
        );
        assert_eq!(
            steer(&m, &t, "svc", 0, 1),
            Steering::Steer("c:1,a:1".into())
        );
        assert_eq!(
            steer(&m, &t, "svc", 0, 2),
            Steering::Steer("a:1,c:1".into())
        );
    }

    /// Members at `priority`, as the admin lists a cluster whose EDS puts
    /// the consumer's zone at 0 and another zone at 1 (Istio's locality
    /// failover, `trafficDistribution: PreferClose`).
    fn at(priority: u8, addrs: &[&str]) -> Vec<Member> {
        members(addrs)
            .into_iter()
            .map(|m| Member { priority, ..m })
            .collect()
    }

    #[test]
    fn keeps_to_the_first_priority_that_has_hosts_left() {
        let mut m = at(0, &["a:1", "b:1", "c:1"]);
        m.extend(at(1, &["x:1", "y:1"]));
        let rules = Rules {
            panic_threshold: 0,
            ..RULES
        };
        let hosts = |t: &Tombstones| plan(&m, t, "svc", 0, &rules).0;
        assert_eq!(
            hosts(&tombstoned(&["b:1"])),
            Plan::Hosts(vec!["a:1".into(), "c:1".into()]),
            "the zone's other hosts, not the other zone's"
        );
        assert_eq!(
            hosts(&tombstoned(&["x:1"])),
            Plan::Hosts(vec!["a:1".into(), "b:1".into(), "c:1".into()]),
            "a tombstone in another priority: the first priority as it is"
        );
        assert_eq!(
            hosts(&tombstoned(&["a:1", "b:1", "c:1"])),
            Plan::Hosts(vec!["x:1".into(), "y:1".into()]),
            "the whole zone tombstoned: the next priority, as Envoy fails over"
        );
        assert_eq!(
            hosts(&tombstoned(&["a:1", "b:1", "c:1", "x:1", "y:1"])),
            Plan::Hosts(vec![]),
            "none left anywhere: the balancer decides"
        );
        // The panic floor counts the first priority's hosts.
        let t = tombstoned(&["a:1", "b:1"]);
        let Plan::Hosts(listed) = plan(&m, &t, "svc", 0, &RULES).0 else {
            panic!("steered");
        };
        assert_eq!(listed.len(), 2, "half of 3, rounded up: {listed:?}");
        assert!(listed.iter().all(|h| !h.starts_with(['x', 'y'])));
    }

    #[test]
    fn stops_steering_when_tombstones_expire() {
        let m = members(&["a:1", "b:1"]);
        let t = tombstoned(&["b:1"]);
        assert_eq!(steer(&m, &t, "svc", 30_000_000, 0), Steering::LeaveAlone);
    }

    #[test]
    fn skips_unusable_members_and_says_when_none_is_left() {
        let mut m = members(&["a:1", "b:1", "c:1"]);
        m[0].usable = false;
        let t = tombstoned(&["b:1"]);
        assert_eq!(steer(&m, &t, "svc", 0, 0), Steering::Steer("c:1".into()));
        assert_eq!(
            steer(&m, &tombstoned(&["b:1", "c:1"]), "svc", 0, 0),
            Steering::NoneLeft
        );
        assert_eq!(
            steer(&[], &t, "svc", 0, 0),
            Steering::NoneLeft,
            "tombstone for this cluster, no members known"
        );
    }

    #[test]
    fn a_plan_holds_until_the_next_tombstone_expiry() {
        let m = members(&["a:1", "b:1"]);
        let mut t = tombstoned(&["b:1"]);
        t.observe(
            &Observation::Closing {
                cluster: "svc",
                address: "c:1",
                instance: None,
            },
            &TTLS,
            5_000_000,
            64,
        );
        let (p, until) = plan(&m, &t, "svc", 0, &RULES);
        assert_eq!(p, Plan::Hosts(vec!["a:1".into()]));
        assert_eq!(until, 30_000_000, "b:1's tombstone expires first");
        assert_eq!(
            plan(&m, &Tombstones::default(), "svc", 0, &RULES),
            (Plan::LeaveAlone, u64::MAX)
        );
    }

    #[test]
    fn every_rotation_is_the_hosts_from_its_first_on_wrapping_around() {
        for n in [1, 2, 3, 7, 8, 9, 20] {
            let hosts: Vec<String> = (0..n).map(|i| format!("10.0.{i}.1:80")).collect();
            let r = Rotations::of(&Plan::Hosts(hosts.clone()));
            for rotation in 0..2 * n + 3 {
                let want: Vec<&str> = hosts
                    .iter()
                    .cycle()
                    .skip(rotation % n)
                    .take(n.min(MAX_OVERRIDE_HOSTS))
                    .map(String::as_str)
                    .collect();
                assert_eq!(
                    r.list(rotation),
                    Some(want.join(",").as_str()),
                    "{n} hosts, rotation {rotation}"
                );
            }
        }
        assert_eq!(Rotations::of(&Plan::Hosts(vec![])).list(3), None);
        assert_eq!(Rotations::of(&Plan::LeaveAlone).list(0), None);
    }

    #[test]
    fn the_list_is_bounded() {
        let addrs: Vec<String> = (0..20).map(|i| format!("10.0.0.{i}:80")).collect();
        let refs: Vec<&str> = addrs.iter().map(String::as_str).collect();
        let t = tombstoned(&["10.0.0.0:80"]);
        match steer(&members(&refs), &t, "svc", 0, 0) {
            Steering::Steer(list) => assert_eq!(list.split(',').count(), MAX_OVERRIDE_HOSTS),
            other => panic!("{other:?}"),
        }
    }

    /// Tombstones for `addrs`, the i-th confirmed closing at i seconds.
    fn confirmed_in_turn(addrs: &[&str]) -> Tombstones {
        let mut t = Tombstones::default();
        for (i, a) in addrs.iter().enumerate() {
            t.observe(
                &Observation::Closing {
                    cluster: "svc",
                    address: a,
                    instance: Some("old"),
                },
                &TTLS,
                i as u64 * 1_000_000,
                64,
            );
        }
        t
    }

    #[test]
    fn below_the_panic_floor_the_longest_confirmed_tombstones_are_listed_too() {
        let m = members(&["a:1", "b:1", "c:1", "d:1", "e:1", "f:1"]);
        let now = 20_000_000;
        // Four of six closing, confirmed in turn: two left, the floor is 3.
        let t = confirmed_in_turn(&["c:1", "a:1", "d:1", "b:1"]);
        let (p, _) = plan(&m, &t, "svc", now, &RULES);
        assert_eq!(
            p,
            Plan::Hosts(vec!["e:1".into(), "f:1".into(), "c:1".into()]),
            "c:1 confirmed its closing first"
        );
        // c:1 answers closing again: it is the latest confirmed now.
        let mut t = t;
        t.observe(
            &Observation::Closing {
                cluster: "svc",
                address: "c:1",
                instance: Some("old"),
            },
            &TTLS,
            now,
            64,
        );
        let (p, _) = plan(&m, &t, "svc", now, &RULES);
        assert_eq!(
            p,
            Plan::Hosts(vec!["e:1".into(), "f:1".into(), "a:1".into()])
        );
    }

    #[test]
    fn at_the_panic_floor_or_with_it_off_only_acceptable_hosts_are_listed() {
        let m = members(&["a:1", "b:1", "c:1", "d:1", "e:1", "f:1"]);
        let half = confirmed_in_turn(&["a:1", "b:1", "c:1"]);
        assert_eq!(
            plan(&m, &half, "svc", 0, &RULES).0,
            Plan::Hosts(vec!["d:1".into(), "e:1".into(), "f:1".into()]),
            "3 of 6 is not below 50%"
        );
        let off = Rules {
            panic_threshold: 0,
            ..RULES
        };
        let five = confirmed_in_turn(&["a:1", "b:1", "c:1", "d:1", "e:1"]);
        assert_eq!(
            plan(&m, &five, "svc", 0, &off).0,
            Plan::Hosts(vec!["f:1".into()])
        );
        let all = Rules {
            panic_threshold: 100,
            ..RULES
        };
        assert_eq!(
            plan(&m, &five, "svc", 10_000_000, &all).0,
            Plan::Hosts(
                ["f:1", "a:1", "b:1", "c:1", "d:1", "e:1"]
                    .map(String::from)
                    .to_vec()
            ),
            "100%: every usable member, longest confirmed first after the acceptable"
        );
    }

    #[test]
    fn the_panic_floor_counts_usable_members_only_and_never_fills_an_empty_plan() {
        let mut m = members(&["a:1", "b:1", "c:1", "d:1"]);
        m[3].usable = false;
        // Usable a, b, c; b and c tombstoned: one left, floor 2.
        let t = confirmed_in_turn(&["c:1", "b:1"]);
        assert_eq!(
            plan(&m, &t, "svc", 5_000_000, &RULES).0,
            Plan::Hosts(vec!["a:1".into(), "c:1".into()])
        );
        let every = confirmed_in_turn(&["a:1", "b:1", "c:1"]);
        assert_eq!(
            steer(&m, &every, "svc", 5_000_000, 0),
            Steering::NoneLeft,
            "none left: the balancer spreads over all"
        );
    }

    #[test]
    fn a_connect_failure_is_confirmed_at_its_own_ttl() {
        let m = members(&["a:1", "b:1", "c:1", "d:1", "e:1"]);
        let mut t = confirmed_in_turn(&["a:1", "b:1"]);
        // Refused at 3 s: confirmed later than a:1 (0 s) and b:1 (1 s),
        // though its tombstone expires first.
        t.observe(
            &Observation::ConnectFailure {
                cluster: "svc",
                address: "c:1",
            },
            &TTLS,
            3_000_000,
            64,
        );
        // Acceptable d, e (2 of 5), floor 3: a:1 is listed.
        assert_eq!(
            plan(&m, &t, "svc", 4_000_000, &RULES).0,
            Plan::Hosts(vec!["d:1".into(), "e:1".into(), "a:1".into()])
        );
    }
}
