//! Which hosts requests to a cluster may go to while it has live
//! tombstones, and the override header of one request.

use super::Member;
use crate::tombstone::{Tombstone, Tombstones};

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
    /// (pass a per-request counter).
    pub fn steering(&self, rotation: usize) -> Steering {
        match self {
            Plan::LeaveAlone => Steering::LeaveAlone,
            Plan::Hosts(hosts) if hosts.is_empty() => Steering::NoneLeft,
            Plan::Hosts(hosts) => {
                let start = rotation % hosts.len();
                let list: Vec<&str> = hosts
                    .iter()
                    .cycle()
                    .skip(start)
                    .take(hosts.len().min(MAX_OVERRIDE_HOSTS))
                    .map(String::as_str)
                    .collect();
                Steering::Steer(list.join(","))
            }
        }
    }
}

/// The plan for `cluster` at `now_us`, and until when it holds (the next
/// expiry of a tombstone it depends on).
pub fn plan(
    members: &[Member],
    tombstones: &Tombstones,
    cluster: &str,
    now_us: u64,
) -> (Plan, u64) {
    let dead: Vec<&Tombstone> = tombstones.live(now_us).collect();
    let until = dead.iter().map(|t| t.expires_us).min().unwrap_or(u64::MAX);
    let concerned = dead
        .iter()
        .any(|t| t.cluster == cluster || members.iter().any(|m| m.address == t.address));
    if !concerned {
        return (Plan::LeaveAlone, until);
    }
    let mut acceptable: Vec<String> = Vec::new();
    for m in members {
        if m.usable
            && !dead.iter().any(|t| t.address == m.address)
            && !acceptable.contains(&m.address)
        {
            acceptable.push(m.address.clone());
        }
    }
    (Plan::Hosts(acceptable), until)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::steering::testing::{members, tombstoned, TTLS};
    use crate::tombstone::Observation;

    /// One request's steering: the plan and one rotation of it.
    fn steer(
        members: &[Member],
        tombstones: &Tombstones,
        cluster: &str,
        now_us: u64,
        rotation: usize,
    ) -> Steering {
        plan(members, tombstones, cluster, now_us)
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
        let (p, until) = plan(&m, &t, "svc", 0);
        assert_eq!(p, Plan::Hosts(vec!["a:1".into()]));
        assert_eq!(until, 30_000_000, "b:1's tombstone expires first");
        assert_eq!(
            plan(&m, &Tombstones::default(), "svc", 0),
            (Plan::LeaveAlone, u64::MAX)
        );
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
}
