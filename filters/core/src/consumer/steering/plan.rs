//! Which hosts requests to a cluster may go to while it has live
//! tombstones or a member the admin lists `DRAINING`, and the override
//! header of one request.

use std::collections::{HashMap, HashSet};

use super::Member;
use crate::consumer::config::SlowStart;
use crate::consumer::tombstone::{Cause, Tombstone, Tombstones, Ttls};
use crate::shared::duration::micros;

/// Most hosts named in one override header: enough for the first attempt
/// and retries; past the list Envoy uses the fallback policy.
pub const MAX_OVERRIDE_HOSTS: usize = 8;

/// A host's full weight in rotation slots: a warming host's share moves in
/// steps of 1/`FULL_WEIGHT` of a full one (5%).
pub const FULL_WEIGHT: u8 = 20;

/// What to do with one request's host selection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Steering {
    /// No live tombstone concerns this cluster: the load balancer decides.
    LeaveAlone,
    /// Put this list in the override header.
    Steer(String),
    /// Every known usable member is tombstoned, and none is a last resort
    /// ([`plan()`]): the load balancer decides.
    NoneLeft,
}

/// Which hosts requests to a cluster may go to, worked out once per change
/// of tombstones or membership (a request then only rotates the list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// No live tombstone concerns this cluster: the load balancer decides.
    LeaveAlone,
    Hosts {
        /// The hosts requests go to: those not tombstoned, in member order;
        /// with none of those, the last resort (see [`plan()`]); empty when
        /// there is neither.
        hosts: Vec<String>,
        /// Tombstoned members tried beside the acceptable hosts, longest
        /// confirmed first: those on trial as a restarted generation
        /// ([`Tombstones::vouch`]), then, below the panic floor, those
        /// whose last word was a refused connection (never a closing
        /// answer). Each is tried first in a list of its own, the
        /// acceptable hosts after it, so a refusal is retried on an
        /// acceptable host.
        trial: Vec<String>,
        /// Each host's weight in slots of [`FULL_WEIGHT`], in `hosts`'
        /// order, while one of them is warming up (`readmit_slow_start`);
        /// empty: all full.
        weights: Vec<u8>,
    },
}

impl Plan {
    /// A plan of these hosts and no trial.
    pub fn hosts<S: Into<String>>(hosts: impl IntoIterator<Item = S>) -> Plan {
        Plan::Hosts {
            hosts: hosts.into_iter().map(Into::into).collect(),
            trial: Vec::new(),
            weights: Vec::new(),
        }
    }

    /// The steering for one request; `rotation` spreads the first pick
    /// (pass a per-request counter). The request path keeps the plan's
    /// [`Rotations`] instead.
    pub fn steering(&self, rotation: usize) -> Steering {
        match self {
            Plan::LeaveAlone => Steering::LeaveAlone,
            Plan::Hosts { .. } => match Rotations::of(self).list(rotation) {
                Some(list) => Steering::Steer(list.to_string()),
                None => Steering::NoneLeft,
            },
        }
    }
}

/// A plan's override lists, one per rotation, as slices of prepared
/// strings: a steered request takes its list without allocating or joining.
///
/// Requests rotate over the acceptable hosts and the trial hosts alike, so
/// each listed host is first for an equal share of requests: an acceptable
/// host's list is the acceptable hosts from it on; a trial host's is that
/// host, then acceptable hosts only (a list never names two trial hosts, so
/// one retry of a refused connection reaches an acceptable host).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rotations {
    /// The acceptable hosts joined by commas, then the first `per_list - 1`
    /// again, so that every rotation's list is contiguous.
    ring: String,
    /// Where each host of `ring` starts, then one past the end plus one
    /// (as if a comma followed the last).
    starts: Vec<usize>,
    hosts: usize,
    per_list: usize,
    /// One list per trial host.
    trial: Vec<String>,
    /// With weights: which list each rotation takes (an acceptable host's
    /// index, or `hosts` + a trial host's), each host as often as its
    /// weight, spread evenly; empty: every list in turn.
    order: Vec<u32>,
}

impl Rotations {
    /// The rotations of `plan` (none for `LeaveAlone` or no acceptable
    /// host).
    pub fn of(plan: &Plan) -> Rotations {
        let Plan::Hosts {
            hosts,
            trial,
            weights,
        } = plan
        else {
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
        let mut rotations = Rotations {
            ring,
            starts,
            hosts: hosts.len(),
            per_list,
            trial: Vec::new(),
            order: Vec::new(),
        };
        // Without an acceptable host there is nothing to retry on: no trial.
        if rotations.hosts > 0 {
            rotations.trial = trial
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let after = rotations
                        .acceptable_list(i, MAX_OVERRIDE_HOSTS - 1)
                        .unwrap_or_default();
                    format!("{t},{after}")
                })
                .collect();
        }
        if !weights.is_empty() && rotations.hosts > 0 {
            let full = std::iter::repeat_n(FULL_WEIGHT, rotations.trial.len());
            let all: Vec<u8> = (0..hosts.len())
                .map(|i| weights.get(i).copied().unwrap_or(FULL_WEIGHT))
                .chain(full)
                .collect();
            rotations.order = spread(&all);
        }
        rotations
    }

    /// The override list of request `rotation`: a trial host's list or
    /// `per_list` acceptable hosts from the rotation's one on; None when
    /// there is no acceptable host to list.
    pub fn list(&self, rotation: usize) -> Option<&str> {
        if self.hosts == 0 {
            return None;
        }
        let slot = if self.order.is_empty() {
            rotation % (self.hosts + self.trial.len())
        } else {
            let at = self.order.get(rotation % self.order.len())?;
            usize::try_from(*at).ok()?
        };
        match slot.checked_sub(self.hosts) {
            Some(t) => self.trial.get(t).map(String::as_str),
            None => self.acceptable_list(slot, self.per_list),
        }
    }

    /// `len` (at most `per_list`) acceptable hosts from the `first`-th on.
    fn acceptable_list(&self, first: usize, len: usize) -> Option<&str> {
        let first = first % self.hosts.max(1);
        let start = *self.starts.get(first)?;
        let end = self
            .starts
            .get(first + len.min(self.per_list))?
            .checked_sub(1)?;
        self.ring.get(start..end)
    }
}

/// Rotation slots for weights (each at most [`FULL_WEIGHT`]): index `i`
/// appears `weights[i]` times, spread over [`FULL_WEIGHT`] rounds
/// (Bresenham: in round `r`, each index whose weight's share reaches a new
/// whole slot), so a host of weight 2 is first once in every 10 rounds,
/// not twice in a row.
fn spread(weights: &[u8]) -> Vec<u32> {
    let full = u32::from(FULL_WEIGHT);
    let mut order = Vec::with_capacity(weights.iter().map(|w| usize::from(*w)).sum());
    for round in 0..full {
        for (i, w) in weights.iter().enumerate() {
            let w = u32::from(*w).min(full);
            if (round + 1) * w / full > round * w / full {
                order.push(u32::try_from(i).unwrap_or(u32::MAX));
            }
        }
    }
    order
}

/// What shapes a plan beside membership and tombstones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// The tombstone TTLs. (Plans order tombstones by the confirmation
    /// time each stores, not by expiry: a refusal extends a closing
    /// host's expiry by the failure TTL without confirming it closing.)
    pub ttls: Ttls,
    /// Percent of the usable members steering keeps listing with hosts
    /// that only refused connections (the consumer's `panic_threshold`;
    /// 0: no floor).
    pub panic_threshold: u8,
    /// How a readmitted host ramps up (`readmit_slow_start`); None:
    /// warming entries are ignored.
    pub slow_start: Option<SlowStart>,
    /// A member listed `DRAINING` steers its cluster (the front role only:
    /// a sidecar consumer leaves such a cluster to the balancer, the
    /// member folded into unusable, as before the front existed).
    pub steer_draining: bool,
}

impl Rules {
    /// How many hosts a plan lists at least, of `usable` members, where
    /// enough of them only refused connections.
    fn floor(&self, usable: usize) -> usize {
        (usable * usize::from(self.panic_threshold)).div_ceil(100)
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
/// (`override_host` itself ignores priorities: the list must).
///
/// The panic floor: when that leaves fewer than `panic_threshold` percent
/// of the usable members (rounded up) but at least one, the plan also
/// tries the tombstoned members whose tombstone comes from a refused
/// connection alone (never one whose last answer said closing: once
/// drained, such a host answers a 503 that a caller's retry policy may not
/// retry, and while it is sent requests its drain cannot pass), confirmed
/// longest ago first, up to the floor. A refused connection is retried by
/// every shipped retry policy (Istio's included), and a trial host is
/// always followed by acceptable hosts ([`Rotations`]), so a trial costs a
/// retry, never a request; an answer readmits the host at once.
///
/// The last resort: with no acceptable host at all, the plan lists every
/// tombstoned member but those confirmed last (the host, or hosts at the
/// same moment, whose mark or refusal is the newest). The balancer would
/// pick among all of them alike; the ones confirmed longest ago are the
/// likeliest to have restarted (a whole generation back on the same
/// addresses, unprobed), and any answer of a new instance readmits it, so
/// the plan has acceptable hosts again after a few answers, while the host
/// that just said closing gets none. With one such moment only (every
/// tombstone confirmed together, or a single member), the balancer decides.
/// Confirmation times are the ones each tombstone stores, so no pair of
/// TTLs can make a host that just said closing look old.
///
/// `DRAINING` members and announced tombstones (the front-proxy role):
/// with [`Rules::steer_draining`], a member the admin lists `DRAINING`
/// steers its cluster as a live tombstone does; with or without it, it is
/// never listed (it is not usable: neither an
/// acceptable host, nor tried below the floor, nor a last resort). An
/// announced tombstone is a tombstone whose host said it is closing: never
/// tried below the floor or on trial, listed only in a last resort, as a
/// closing mark's is.
///
/// A restarted generation: once a last resort's request reaches a new
/// instance where a host said closing, the rest of that last resort is on
/// trial ([`Tombstones::vouch`]): each is tried as a refused host below the
/// floor is (first in a list of its own, acceptable hosts after it), until
/// its own answer readmits it or says closing again. Without that, the
/// first readmitted host took every request until the others' TTLs ran out
/// (on one connection, every one: a last resort's first answer is the only
/// one before the plan changes).
pub fn plan(
    members: &[Member],
    tombstones: &Tombstones,
    cluster: &str,
    now_us: u64,
    rules: &Rules,
) -> (Plan, u64) {
    let (dead, until, dead_concern) = dead_hosts(members, tombstones, cluster, now_us);
    let (warming, until, warming_concern) =
        warming_hosts(members, tombstones, &dead, cluster, now_us, until, rules);
    // Left alone, the balancer keeps a `DRAINING` host out only until panic
    // engages for another reason, then picks it (envoy#46800).
    let draining_concern = rules.steer_draining && members.iter().any(|m| m.draining);
    if !(dead_concern || warming_concern || draining_concern) {
        return (Plan::LeaveAlone, until);
    }
    let tombstone_of = |address: &str| dead.get(address).copied();
    // The first priority with a usable member that is not tombstoned; with
    // none, the first with a usable member (the plan is then empty).
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
    let (acceptable, tombstoned): (Vec<&str>, Vec<&str>) =
        usable.iter().partition(|a| tombstone_of(a).is_none());
    let confirmed = |a: &str| tombstone_of(a).map_or(0, |t| t.confirmed_us);
    if acceptable.is_empty() {
        let newest = tombstoned.iter().map(|a| confirmed(a)).max().unwrap_or(0);
        let last_resort = tombstoned
            .into_iter()
            .filter(|a| confirmed(a) < newest)
            .map(str::to_string);
        return (Plan::hosts(last_resort), until);
    }
    // A restarted generation's hosts on trial: each until it answers.
    let mut vouched: Vec<(u64, &str)> = tombstoned
        .iter()
        .filter_map(|a| {
            let t = tombstone_of(a)?;
            t.trial
                .is_some_and(|from| from <= now_us)
                .then_some((t.confirmed_us, *a))
        })
        .collect();
    vouched.sort_unstable();
    let mut trial: Vec<String> = vouched.into_iter().map(|(_, a)| a.to_string()).collect();
    let floor = rules.floor(usable.len());
    if acceptable.len() < floor {
        let mut refused: Vec<(u64, &str)> = tombstoned
            .into_iter()
            .filter_map(|a| {
                let t = tombstone_of(a)?;
                (t.cause == Cause::ConnectFailure).then_some((t.confirmed_us, a))
            })
            .collect();
        refused.sort_unstable();
        trial.extend(
            refused
                .into_iter()
                .take(floor - acceptable.len())
                .map(|(_, a)| a.to_string()),
        );
    }
    let weights = weights_of(&acceptable, &warming);
    (
        Plan::Hosts {
            hosts: acceptable.into_iter().map(str::to_string).collect(),
            trial,
            weights,
        },
        until,
    )
}

/// [`plan()`]'s first step: the live tombstones by address (the first entry
/// for an address stands, as a scan would find it), the earliest moment one
/// of them changes the plan (its expiry, or a trial still to start), and
/// whether any concerns `cluster` (its own, or one of `members`).
///
/// Linear in members + tombstones: a plan is worked out again on every
/// tombstone write, and a mesh cluster of 1,024 members beside 1,024
/// tombstones made a member-by-tombstone scan a million comparisons.
fn dead_hosts<'t>(
    members: &[Member],
    tombstones: &'t Tombstones,
    cluster: &str,
    now_us: u64,
) -> (HashMap<&'t str, &'t Tombstone>, u64, bool) {
    let mut dead: HashMap<&str, &Tombstone> = HashMap::new();
    let mut until = u64::MAX;
    let mut concerned = false;
    for t in tombstones.live(now_us) {
        until = until.min(t.expires_us);
        // A trial still to start changes the plan when it starts.
        if let Some(from) = t.trial.filter(|&f| f > now_us) {
            until = until.min(from);
        }
        concerned |= t.cluster == cluster;
        // The first entry for an address stands, as a scan would find it.
        dead.entry(t.address.as_str()).or_insert(t);
    }
    concerned |= members
        .iter()
        .any(|m| dead.contains_key(m.address.as_str()));
    (dead, until, concerned)
}

/// [`plan()`]'s second step: readmitted hosts ramping up (not tombstoned
/// again) and their weight in slots, `until` brought forward to the end of
/// their window or the next step of their weight, and whether any concerns
/// `cluster`. Readmitted hosts keep their cluster steered until their window
/// ends; the plan is made again at each step of their weight.
fn warming_hosts<'t>(
    members: &[Member],
    tombstones: &'t Tombstones,
    dead: &HashMap<&str, &Tombstone>,
    cluster: &str,
    now_us: u64,
    mut until: u64,
    rules: &Rules,
) -> (HashMap<&'t str, u8>, u64, bool) {
    let mut warming: HashMap<&str, u8> = HashMap::new();
    let mut concerned = false;
    if let Some(ss) = &rules.slow_start {
        let step = micros(ss.window / u32::from(FULL_WEIGHT)).max(50_000);
        for w in tombstones.warming(now_us) {
            if dead.contains_key(w.address.as_str()) {
                continue;
            }
            let elapsed = std::time::Duration::from_micros(now_us.saturating_sub(w.since_us));
            let slots = (ss.weight(elapsed) * f64::from(FULL_WEIGHT)).round();
            // At least one slot: a share below 5% is 5%.
            let slots = (slots as u8).clamp(1, FULL_WEIGHT);
            if warming.insert(w.address.as_str(), slots).is_none() {
                until = until.min(w.until_us).min(now_us.saturating_add(step));
                concerned |= w.cluster == cluster;
            }
        }
        concerned |= members
            .iter()
            .any(|m| warming.contains_key(m.address.as_str()));
    }
    (warming, until, concerned)
}

/// Each acceptable host's weight in slots (full unless ramping up); empty
/// when every one is full.
fn weights_of(acceptable: &[&str], warming: &HashMap<&str, u8>) -> Vec<u8> {
    let weights: Vec<u8> = acceptable
        .iter()
        .map(|a| warming.get(a).copied().unwrap_or(FULL_WEIGHT))
        .collect();
    if weights.iter().all(|w| *w == FULL_WEIGHT) {
        Vec::new()
    } else {
        weights
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumer::config::SlowStart;
    use crate::consumer::steering::testing::{members, tombstoned, RULES, TTLS};
    use crate::consumer::tombstone::Observation;

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
            Plan::hosts(["a:1", "c:1"]),
            "the zone's other hosts, not the other zone's"
        );
        assert_eq!(
            hosts(&tombstoned(&["x:1"])),
            Plan::hosts(["a:1", "b:1", "c:1"]),
            "a tombstone in another priority: the first priority as it is"
        );
        assert_eq!(
            hosts(&tombstoned(&["a:1", "b:1", "c:1"])),
            Plan::hosts(["x:1", "y:1"]),
            "the whole zone tombstoned: the next priority, as Envoy fails over"
        );
        assert_eq!(
            hosts(&tombstoned(&["a:1", "b:1", "c:1", "x:1", "y:1"])),
            Plan::hosts(Vec::<String>::new()),
            "none left anywhere: the balancer decides"
        );
        // The panic floor counts the first priority's hosts: of a, b, c
        // with a and b refused, one is tried (half of 3, rounded up, is 2).
        let t = refused_in_turn(&["a:1", "b:1"]);
        assert_eq!(
            plan(&m, &t, "svc", 0, &RULES).0,
            Plan::Hosts {
                hosts: vec!["c:1".into()],
                trial: vec!["a:1".into()],
                weights: Vec::new(),
            },
            "the other zone is neither tried nor listed"
        );
    }

    /// The front role's rules: `DRAINING` members steer their cluster.
    const FRONT: Rules = Rules {
        steer_draining: true,
        ..RULES
    };

    /// `addrs` as members, those in `draining` listed `DRAINING` (so not
    /// usable), as the admin reads them.
    fn with_draining(addrs: &[&str], draining: &[&str]) -> Vec<Member> {
        members(addrs)
            .into_iter()
            .map(|m| {
                let d = draining.contains(&m.address.as_str());
                Member {
                    usable: !d,
                    draining: d,
                    ..m
                }
            })
            .collect()
    }

    #[test]
    fn a_draining_member_steers_its_cluster_and_is_never_listed() {
        let m = with_draining(&["a:1", "b:1", "c:1"], &["b:1"]);
        assert_eq!(
            plan(&m, &Tombstones::default(), "svc", 0, &FRONT),
            (Plan::hosts(["a:1", "c:1"]), u64::MAX),
            "no tombstone, yet steered: held until membership changes"
        );
        assert_eq!(
            plan(
                &members(&["a:1", "b:1"]),
                &Tombstones::default(),
                "svc",
                0,
                &FRONT
            )
            .0,
            Plan::LeaveAlone,
            "without one, the balancer decides as before"
        );
        // A sidecar consumer (no front): left to the balancer as before,
        // the member unusable; steered by a tombstone, never listed.
        assert_eq!(
            plan(&m, &Tombstones::default(), "svc", 0, &RULES).0,
            Plan::LeaveAlone
        );
        assert_eq!(
            plan(&m, &tombstoned(&["a:1"]), "svc", 0, &RULES).0,
            Plan::hosts(["c:1"])
        );
        // Below the panic floor, with the rest refused: a refused host is
        // tried, the draining one never.
        let m = with_draining(&["a:1", "b:1", "c:1", "d:1"], &["d:1"]);
        let t = refused_in_turn(&["b:1", "c:1"]);
        let every = Rules {
            panic_threshold: 100,
            ..FRONT
        };
        assert_eq!(
            plan(&m, &t, "svc", 1_500_000, &every).0,
            tried(&["a:1"], &["b:1", "c:1"])
        );
        // Every member draining: nothing acceptable and no last resort, so
        // the balancer decides (as when every host closed at once).
        let all = with_draining(&["a:1", "b:1"], &["a:1", "b:1"]);
        assert_eq!(
            plan(&all, &Tombstones::default(), "svc", 0, &FRONT)
                .0
                .steering(0),
            Steering::NoneLeft
        );
    }

    /// `addrs` announced closing in turn, the i-th at i seconds, for 120 s.
    fn announced_in_turn(addrs: &[&str]) -> Tombstones {
        let mut t = Tombstones::default();
        for (i, a) in addrs.iter().enumerate() {
            let at = i as u64 * 1_000_000;
            t.announce("svc", a, at, at + 120_000_000, 64);
        }
        t
    }

    #[test]
    fn an_announced_host_is_never_listed_while_an_acceptable_host_is_known() {
        let m = members(&["a:1", "b:1", "c:1", "d:1"]);
        for threshold in [0, 50, 100] {
            let rules = Rules {
                panic_threshold: threshold,
                ..RULES
            };
            let t = announced_in_turn(&["a:1", "b:1", "c:1"]);
            assert_eq!(
                plan(&m, &t, "svc", 3_000_000, &rules).0,
                Plan::hosts(["d:1"]),
                "panic_threshold {threshold}"
            );
        }
        // Announced after refusing: its refusal no longer gets it tried.
        let mut t = refused_in_turn(&["a:1", "b:1", "c:1"]);
        t.announce("svc", "a:1", 3_000_000, 123_000_000, 64);
        let every = Rules {
            panic_threshold: 100,
            ..RULES
        };
        assert_eq!(
            plan(&m, &t, "svc", 3_500_000, &every).0,
            tried(&["d:1"], &["b:1", "c:1"])
        );
        // No acceptable host: the last resort, as for closing marks.
        let t = announced_in_turn(&["a:1", "b:1", "c:1", "d:1"]);
        assert_eq!(
            plan(&m, &t, "svc", 3_000_000, &RULES).0,
            Plan::hosts(["a:1", "b:1", "c:1"])
        );
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
        assert_eq!(p, Plan::hosts(["a:1"]));
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
            let r = Rotations::of(&Plan::hosts(hosts.clone()));
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
        assert_eq!(
            Rotations::of(&Plan::hosts(Vec::<String>::new())).list(3),
            None
        );
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

    /// Tombstones for `addrs`, the i-th observed as `obs` says at i seconds.
    fn in_turn<'a>(addrs: &[&'a str], obs: impl Fn(&'a str) -> Observation<'a>) -> Tombstones {
        let mut t = Tombstones::default();
        for (i, a) in addrs.iter().enumerate() {
            t.observe(&obs(a), &TTLS, i as u64 * 1_000_000, 64);
        }
        t
    }

    /// Tombstones for `addrs`, the i-th confirmed closing at i seconds.
    fn confirmed_in_turn(addrs: &[&str]) -> Tombstones {
        in_turn(addrs, |address| Observation::Closing {
            cluster: "svc",
            address,
            instance: Some("old"),
        })
    }

    /// Tombstones for `addrs`, the i-th a connection refused at i seconds.
    fn refused_in_turn(addrs: &[&str]) -> Tombstones {
        in_turn(addrs, |address| Observation::ConnectFailure {
            cluster: "svc",
            address,
        })
    }

    /// A plan with trial hosts.
    fn tried(acceptable: &[&str], trial: &[&str]) -> Plan {
        Plan::Hosts {
            hosts: acceptable.iter().map(|a| a.to_string()).collect(),
            trial: trial.iter().map(|a| a.to_string()).collect(),
            weights: Vec::new(),
        }
    }

    #[test]
    fn no_share_of_hosts_closing_lists_a_host_whose_last_answer_said_closing() {
        // Scale-downs by more than half: 2 of 3, 3 of 4, 5 of 6 closing,
        // the floor at 0, 50 and 100 percent.
        for (n, closing) in [(3, 2), (4, 3), (6, 5), (6, 4)] {
            let addrs: Vec<String> = (0..n).map(|i| format!("10.0.0.{i}:80")).collect();
            let refs: Vec<&str> = addrs.iter().map(String::as_str).collect();
            let t = confirmed_in_turn(&refs[..closing]);
            for threshold in [0, 50, 100] {
                let rules = Rules {
                    panic_threshold: threshold,
                    ..RULES
                };
                assert_eq!(
                    plan(&members(&refs), &t, "svc", 20_000_000, &rules).0,
                    Plan::hosts(refs[closing..].iter().copied()),
                    "{closing} of {n} closing, panic_threshold {threshold}"
                );
            }
        }
    }

    #[test]
    fn below_the_panic_floor_hosts_that_only_refused_are_tried_longest_confirmed_first() {
        let m = members(&["a:1", "b:1", "c:1", "d:1", "e:1", "f:1"]);
        let now = 4_000_000;
        // Four of six refused in turn: two left, the floor is 3.
        let t = refused_in_turn(&["c:1", "a:1", "d:1", "b:1"]);
        let (p, _) = plan(&m, &t, "svc", now, &RULES);
        assert_eq!(p, tried(&["e:1", "f:1"], &["c:1"]), "c:1 refused first");
        // c:1 refuses again: it is the latest confirmed now.
        let mut t = t;
        t.observe(
            &Observation::ConnectFailure {
                cluster: "svc",
                address: "c:1",
            },
            &TTLS,
            now,
            64,
        );
        let (p, _) = plan(&m, &t, "svc", now, &RULES);
        assert_eq!(p, tried(&["e:1", "f:1"], &["a:1"]));
        // a:1 then answers closing: never tried again; d:1 is next.
        t.observe(
            &Observation::Closing {
                cluster: "svc",
                address: "a:1",
                instance: Some("old"),
            },
            &TTLS,
            now,
            64,
        );
        let (p, _) = plan(&m, &t, "svc", now, &RULES);
        assert_eq!(p, tried(&["e:1", "f:1"], &["d:1"]));
    }

    #[test]
    fn a_closing_host_that_then_refuses_is_still_never_tried() {
        // A refusal is not an answer: the host said closing last.
        let m = members(&["a:1", "b:1", "c:1"]);
        let mut t = confirmed_in_turn(&["a:1", "b:1"]);
        t.observe(
            &Observation::ConnectFailure {
                cluster: "svc",
                address: "a:1",
            },
            &TTLS,
            5_000_000,
            64,
        );
        assert_eq!(
            plan(&m, &t, "svc", 5_000_000, &RULES).0,
            Plan::hosts(["c:1"])
        );
    }

    #[test]
    fn at_the_panic_floor_or_with_it_off_only_acceptable_hosts_are_listed() {
        let m = members(&["a:1", "b:1", "c:1", "d:1", "e:1", "f:1"]);
        let half = refused_in_turn(&["a:1", "b:1", "c:1"]);
        assert_eq!(
            plan(&m, &half, "svc", 0, &RULES).0,
            Plan::hosts(["d:1", "e:1", "f:1"]),
            "3 of 6 is not below 50%"
        );
        let off = Rules {
            panic_threshold: 0,
            ..RULES
        };
        let five = refused_in_turn(&["a:1", "b:1", "c:1", "d:1", "e:1"]);
        assert_eq!(plan(&m, &five, "svc", 0, &off).0, Plan::hosts(["f:1"]));
        let all = Rules {
            panic_threshold: 100,
            ..RULES
        };
        assert_eq!(
            plan(&m, &five, "svc", 4_500_000, &all).0,
            tried(&["f:1"], &["a:1", "b:1", "c:1", "d:1", "e:1"]),
            "100%: every refused member, longest confirmed first"
        );
    }

    #[test]
    fn the_panic_floor_counts_usable_members_only_and_never_fills_an_empty_plan() {
        let mut m = members(&["a:1", "b:1", "c:1", "d:1"]);
        m[3].usable = false;
        // Usable a, b, c; b and c refused: one left, floor 2.
        let t = refused_in_turn(&["c:1", "b:1"]);
        assert_eq!(
            plan(&m, &t, "svc", 1_500_000, &RULES).0,
            tried(&["a:1"], &["c:1"])
        );
        let every = refused_in_turn(&["a:1", "b:1", "c:1"]);
        assert_eq!(
            plan(&m, &every, "svc", 2_500_000, &RULES).0,
            Plan::hosts(["a:1", "b:1"]),
            "none acceptable: the last resort, not a trial"
        );
    }

    #[test]
    fn with_no_acceptable_host_the_last_resort_is_every_tombstone_but_the_newest() {
        let m = members(&["a:1", "b:1", "c:1", "d:1"]);
        // A whole generation restarted in turn, unprobed: a, b, c said
        // closing long ago; d, the last, just now.
        let t = confirmed_in_turn(&["a:1", "b:1", "c:1", "d:1"]);
        assert_eq!(
            plan(&m, &t, "svc", 3_000_000, &RULES).0,
            Plan::hosts(["a:1", "b:1", "c:1"]),
            "d:1 just said closing: not listed"
        );
        // Everyone closing at once: no tombstone older than another, the
        // balancer decides.
        let together = tombstoned(&["a:1", "b:1", "c:1", "d:1"]);
        assert_eq!(
            steer(&m, &together, "svc", 0, 0),
            Steering::NoneLeft,
            "every tombstone confirmed at the same moment"
        );
        // One acceptable host again (a:1 answered as a new instance): no
        // host that said closing is listed any more.
        let mut t = t;
        t.observe(
            &Observation::Answered {
                address: "a:1",
                instance: Some("new"),
            },
            &TTLS,
            3_000_000,
            64,
        );
        assert_eq!(
            plan(&m, &t, "svc", 3_000_000, &RULES).0,
            Plan::hosts(["a:1"])
        );
    }

    #[test]
    fn the_last_resort_orders_by_stored_confirmation_whatever_the_ttls() {
        let m = members(&["a:1", "b:1", "c:1"]);
        let at = |s: u64| s * 1_000_000;
        let closing = |address| Observation::Closing {
            cluster: "svc",
            address,
            instance: Some("old"),
        };
        let refused = |address| Observation::ConnectFailure {
            cluster: "svc",
            address,
        };
        // A failure TTL above the closing one: a, which said closing
        // first, then refused (it exited), expires last; c said closing
        // last. Expiry minus the cause's TTL made a the newest.
        let ttls = Ttls {
            closing: std::time::Duration::from_secs(30),
            failure: std::time::Duration::from_secs(60),
            warming: None,
        };
        let rules = Rules { ttls, ..RULES };
        let mut t = Tombstones::default();
        t.observe(&closing("a:1"), &ttls, at(0), 64);
        t.observe(&refused("a:1"), &ttls, at(1), 64);
        t.observe(&closing("b:1"), &ttls, at(2), 64);
        t.observe(&closing("c:1"), &ttls, at(3), 64);
        assert!(t.get_live("a:1", at(3)).unwrap().expires_us > at(33));
        assert_eq!(
            plan(&m, &t, "svc", at(3), &rules).0,
            Plan::hosts(["a:1", "b:1"]),
            "c:1 just said closing"
        );
        // The other way round: a closing mark on a longer refusal's
        // tombstone keeps its expiry, and is still the newest confirmation.
        let ttls = Ttls {
            closing: std::time::Duration::from_secs(5),
            failure: std::time::Duration::from_secs(30),
            warming: None,
        };
        let rules = Rules { ttls, ..RULES };
        let mut t = Tombstones::default();
        t.observe(&refused("a:1"), &ttls, at(0), 64);
        t.observe(&closing("b:1"), &ttls, at(1), 64);
        t.observe(&closing("c:1"), &ttls, at(2), 64);
        t.observe(&closing("a:1"), &ttls, at(3), 64);
        assert_eq!(
            plan(&m, &t, "svc", at(3), &rules).0,
            Plan::hosts(["b:1", "c:1"]),
            "a:1 just said closing"
        );
    }

    #[test]
    fn hosts_on_trial_are_tried_beside_acceptable_ones_longest_confirmed_first() {
        let m = members(&["a:1", "b:1", "c:1", "d:1"]);
        let mut t = confirmed_in_turn(&["a:1", "b:1", "c:1", "d:1"]);
        // b:1, last confirmed at 1 s, answered a last resort as a new
        // instance at 4 s: a (confirmed before it) is on trial at once, c
        // from 2 s + the 3 s b took, d (the newest) not at all.
        t.observe(
            &Observation::Answered {
                address: "b:1",
                instance: Some("new"),
            },
            &TTLS,
            4_000_000,
            64,
        );
        assert_eq!(t.vouch("svc", 1_000_000, 4_000_000), 2);
        let rules = Rules {
            panic_threshold: 0,
            ..RULES
        };
        assert_eq!(
            plan(&m, &t, "svc", 4_000_000, &rules),
            (tried(&["b:1"], &["a:1"]), 5_000_000),
            "made again when c:1's trial starts"
        );
        assert_eq!(
            plan(&m, &t, "svc", 5_000_000, &rules).0,
            tried(&["b:1"], &["a:1", "c:1"])
        );
    }

    #[test]
    fn a_refusal_is_confirmed_at_its_own_ttl() {
        let m = members(&["a:1", "b:1", "c:1", "d:1", "e:1"]);
        let mut t = refused_in_turn(&["a:1", "b:1"]);
        // c:1 closing at 0 s, so its 30 s tombstone outlives a:1's and
        // b:1's 5 s ones: confirmation, not expiry, orders the trial.
        t.observe(
            &Observation::Closing {
                cluster: "svc",
                address: "c:1",
                instance: None,
            },
            &TTLS,
            0,
            64,
        );
        // Acceptable d, e (2 of 5), floor 3: a:1 (refused at 0 s) is tried.
        assert_eq!(
            plan(&m, &t, "svc", 1_500_000, &RULES).0,
            tried(&["d:1", "e:1"], &["a:1"])
        );
    }

    #[test]
    fn a_trial_host_is_first_in_a_list_of_its_own_then_acceptable_hosts_only() {
        let acceptable: Vec<String> = (0..10).map(|i| format!("10.0.0.{i}:80")).collect();
        let trial: Vec<String> = (0..3).map(|i| format!("10.0.1.{i}:80")).collect();
        let r = Rotations::of(&Plan::Hosts {
            hosts: acceptable.clone(),
            trial: trial.clone(),
            weights: Vec::new(),
        });
        let mut first = std::collections::HashMap::new();
        for rotation in 0..13 * 4 {
            let list = r.list(rotation).unwrap_or_default();
            let hosts: Vec<&str> = list.split(',').collect();
            assert!(hosts.len() <= MAX_OVERRIDE_HOSTS, "{list}");
            assert!(
                hosts[1..].iter().all(|h| acceptable.iter().any(|a| a == h)),
                "rotation {rotation}: after the first, acceptable hosts only: {list}"
            );
            *first.entry(hosts[0].to_string()).or_insert(0) += 1;
        }
        // Each of the 13 listed hosts is first for an equal share.
        assert_eq!(first.len(), 13, "{first:?}");
        assert!(first.values().all(|&n| n == 4), "{first:?}");
        // One acceptable host: a trial list is the trial host, then it.
        let one = Rotations::of(&tried(&["a:1"], &["t:1", "u:1"]));
        let lists: Vec<&str> = (0..3).filter_map(|r| one.list(r)).collect();
        assert_eq!(lists, ["a:1", "t:1,a:1", "u:1,a:1"]);
        // No acceptable host: nothing to retry on, no list.
        assert_eq!(Rotations::of(&tried(&[], &["t:1"])).list(0), None);
    }

    /// How often each host is first over `n` rotations of `plan`.
    fn first_shares(plan: &Plan, n: usize) -> std::collections::HashMap<String, f64> {
        let r = Rotations::of(plan);
        let mut firsts = std::collections::HashMap::new();
        for rotation in 0..n {
            let first = r.list(rotation).unwrap_or_default().split(',').next();
            *firsts
                .entry(first.unwrap_or_default().to_string())
                .or_insert(0.0) += 1.0 / n as f64;
        }
        firsts
    }

    #[test]
    fn a_readmitted_host_ramps_up_over_the_slow_start_window() {
        let m = members(&["a:1", "b:1", "c:1"]);
        let ss = SlowStart {
            window: std::time::Duration::from_secs(10),
            aggression: 1.0,
            min_weight_percent: 10,
        };
        let rules = Rules {
            slow_start: Some(ss),
            ..RULES
        };
        let ttls = Ttls {
            warming: Some(ss.window),
            ..TTLS
        };
        let mut t = tombstoned(&["a:1"]);
        t.observe(
            &Observation::Answered {
                address: "a:1",
                instance: Some("new"),
            },
            &ttls,
            0,
            64,
        );
        // (seconds in, a:1's weight in slots of 20 beside two full hosts)
        for (s, slots) in [(0u64, 2.0), (2, 4.0), (5, 10.0), (9, 18.0)] {
            let now = s * 1_000_000;
            let (p, until) = plan(&m, &t, "svc", now, &rules);
            let share = first_shares(&p, 4_200)["a:1"];
            let want = slots / (slots + 40.0);
            assert!(
                (share - want).abs() < 0.01,
                "{s}s in: a:1 first for {share:.3}, want {want:.3}"
            );
            assert!(until <= now + 500_000, "made again at the next step");
        }
        assert_eq!(
            plan(&m, &t, "svc", 10_000_000, &rules).0,
            Plan::LeaveAlone,
            "the window over: the balancer decides"
        );
        // Without slow start the same list leaves the balancer alone.
        assert_eq!(plan(&m, &t, "svc", 0, &RULES).0, Plan::LeaveAlone);
        // A host of weight 2 in 42 slots is never first twice in a row.
        let r = Rotations::of(&plan(&m, &t, "svc", 0, &rules).0);
        let firsts: Vec<&str> = (0..42)
            .filter_map(|i| r.list(i)?.split(',').next())
            .collect();
        assert!(
            firsts.windows(2).all(|w| !(w[0] == "a:1" && w[1] == "a:1")),
            "{firsts:?}"
        );
    }

    #[test]
    fn a_warming_host_keeps_the_trial_hosts_share_equal_to_a_full_one() {
        let r = Rotations::of(&Plan::Hosts {
            hosts: vec!["a:1".into(), "b:1".into()],
            trial: vec!["t:1".into()],
            weights: vec![FULL_WEIGHT, 5],
        });
        let shares = first_shares(
            &Plan::Hosts {
                hosts: vec!["a:1".into(), "b:1".into()],
                trial: vec!["t:1".into()],
                weights: vec![FULL_WEIGHT, 5],
            },
            450,
        );
        assert!((shares["a:1"] - 20.0 / 45.0).abs() < 1e-9, "{shares:?}");
        assert!((shares["t:1"] - 20.0 / 45.0).abs() < 1e-9, "{shares:?}");
        assert!((shares["b:1"] - 5.0 / 45.0).abs() < 1e-9, "{shares:?}");
        assert_eq!(r.list(0).map(|l| l.split(',').count()), Some(2));
    }
}
