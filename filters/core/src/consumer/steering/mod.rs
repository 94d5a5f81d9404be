//! Steering a consumer's requests away from tombstoned hosts, in four
//! parts:
//!
//! - [`membership`]: who is in a cluster: Envoy's admin (with health, read
//!   as [`admin`] says) when an admin cluster is configured, else the
//!   addresses that recently answered ([`Observed`] per VM copy,
//!   [`Membership`] shared).
//! - [`clusters`]: the set of clusters routed to, so membership is known
//!   before their first tombstone.
//! - [`plan`](mod@plan): which hosts a request may go to, and its override header.
//! - [`probe`]: noticing that a tombstoned host restarted.
//!
//! Envoy's `override_host` load-balancing policy can pin a request to hosts
//! named in a header, in order (each retry takes the next), but it cannot
//! exclude one and it ignores health (both observed on Envoy 1.40). So while a cluster
//! has live tombstones, the filter names the hosts to use: the cluster's
//! known, usable members minus the tombstoned ones, rotated for balance.
//!
//! A tombstoned host that restarts keeps its address but gets a new instance
//! id. To notice without sending it real traffic, the filter probes it: a
//! request to graceful_drain's readiness endpoint pinned to that address.
//! The answer counts only if it names the probed address (graceful_drain
//! echoes the address it was reached at), since override_host falls back to
//! another host when the address is no longer in the cluster.

pub mod admin;
pub mod clusters;
pub mod membership;
pub mod plan;
pub mod probe;

pub use admin::{
    admin_clusters_path, rq_active_by_ip, AdminAnswer, AdminSource, CLUSTERS_UNANSWERED_TURN,
    MAX_ADMIN_BODY,
};
pub use clusters::ClusterSet;
pub use membership::{
    member_ip, Member, Membership, Observed, MAX_CLUSTERS, MAX_MEMBERS, OBSERVED_WINDOW_US,
    SEEN_REFRESH_US,
};
pub use plan::{plan, Plan, Rotations, Rules, Steering, MAX_OVERRIDE_HOSTS};
pub use probe::{probe_observation, probe_targets, ADDRESS_HEADER, MAX_PROBES};

/// Encoding version of [`ClusterSet`] values.
const VERSION: u8 = 1;

#[cfg(test)]
pub(crate) mod testing {
    use super::{Member, Rules};
    use crate::consumer::tombstone::{Observation, Tombstones, Ttls};
    use std::time::Duration;

    pub const TTLS: Ttls = Ttls {
        closing: Duration::from_secs(30),
        failure: Duration::from_secs(5),
        warming: None,
    };

    /// The consumer's defaults.
    pub const RULES: Rules = Rules {
        ttls: TTLS,
        panic_threshold: 50,
        slow_start: None,
        steer_draining: false,
    };

    pub fn members(addrs: &[&str]) -> Vec<Member> {
        addrs
            .iter()
            .map(|a| Member {
                address: a.to_string(),
                usable: true,
                draining: false,
                seen_s: 0,
                priority: 0,
            })
            .collect()
    }

    pub fn tombstoned(addrs: &[&str]) -> Tombstones {
        let mut t = Tombstones::default();
        for a in addrs {
            t.observe(
                &Observation::Closing {
                    cluster: "svc",
                    address: a,
                    instance: Some("i"),
                },
                &TTLS,
                0,
                64,
            );
        }
        t
    }
}
