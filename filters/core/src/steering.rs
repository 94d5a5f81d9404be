//! Steering a consumer's requests away from tombstoned hosts.
//!
//! Envoy's `override_host` load-balancing policy can pin a request to hosts
//! named in a header, in order (each retry takes the next), but it cannot
//! exclude one and it ignores health (envoy-facts §6.1). So while a cluster
//! has live tombstones, the filter names the hosts to use: the cluster's
//! known, usable members minus the tombstoned ones, rotated for balance.
//! Members come from Envoy's admin `/clusters` (with health) when an admin
//! cluster is configured, else from the addresses that recently answered.
//!
//! A tombstoned host that restarts keeps its address but gets a new instance
//! id. To notice without sending it real traffic, the filter probes it: a
//! request to graceful_drain's readiness endpoint pinned to that address.
//! The answer counts only if it names the probed address (graceful_drain
//! echoes the address it was reached at), since override_host falls back to
//! another host when the address is no longer in the cluster.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use serde::Deserialize;

use crate::tombstone::{Observation, Tombstone, Tombstones};

/// Shared-data key of the admin membership of the clusters routed to.
pub const MEMBERS_KEY: &str = "graceful.v1.consumer.members";
/// Shared-data key of the addresses that answered, per cluster, as all VM
/// copies saw them (the membership used without an admin cluster).
pub const OBSERVED_KEY: &str = "graceful.v1.consumer.observed";
/// Lease: one VM copy per interval refreshes membership and sends probes.
pub const REFRESH_LEASE_KEY: &str = "graceful.v1.consumer.refresh_lease";
/// Response header in which graceful_drain echoes the address (`ip:port`)
/// it was reached at.
pub const ADDRESS_HEADER: &str = "x-graceful-address";
/// Most hosts named in one override header: enough for the first attempt
/// and retries; past the list Envoy uses the fallback policy.
pub const MAX_OVERRIDE_HOSTS: usize = 8;
/// Bounds on what membership keeps.
pub const MAX_CLUSTERS: usize = 64;
pub const MAX_MEMBERS: usize = 1024;
/// How long an address that answered counts as a member, without admin.
pub const OBSERVED_WINDOW_US: u64 = 120_000_000;
/// Most probes sent per refresh.
pub const MAX_PROBES: usize = 16;

const VERSION: u8 = 1;

/// A cluster member as the admin reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub address: String,
    /// Healthy (or degraded) per EDS and not failing health or outlier
    /// checks: Envoy's own load balancer would pick it.
    pub usable: bool,
}

/// Members of the clusters that have tombstones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Membership {
    clusters: Vec<(String, Vec<Member>)>,
}

#[derive(Deserialize)]
struct AdminClusters {
    #[serde(default)]
    cluster_statuses: Vec<AdminCluster>,
}

#[derive(Deserialize)]
struct AdminCluster {
    name: String,
    #[serde(default)]
    host_statuses: Vec<AdminHost>,
}

#[derive(Deserialize)]
struct AdminHost {
    address: Option<AdminAddress>,
    #[serde(default)]
    health_status: AdminHealth,
}

#[derive(Deserialize)]
struct AdminAddress {
    socket_address: Option<AdminSocketAddress>,
}

#[derive(Deserialize)]
struct AdminSocketAddress {
    address: String,
    #[serde(default)]
    port_value: u16,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct AdminHealth {
    eds_health_status: Option<String>,
    failed_active_health_check: bool,
    failed_outlier_check: bool,
    pending_dynamic_removal: bool,
    excluded_via_immediate_hc_fail: bool,
    active_hc_timeout: bool,
}

impl AdminHealth {
    fn usable(&self) -> bool {
        let eds_ok = matches!(
            self.eds_health_status.as_deref(),
            None | Some("HEALTHY" | "DEGRADED" | "UNKNOWN")
        );
        eds_ok
            && !self.failed_active_health_check
            && !self.failed_outlier_check
            && !self.pending_dynamic_removal
            && !self.excluded_via_immediate_hc_fail
            && !self.active_hc_timeout
    }
}

/// `ip:port` the way Envoy prints host addresses (`[v6]:port`).
fn host_address(ip: &str, port: u16) -> Option<String> {
    let ip: IpAddr = ip.parse().ok()?;
    Some(SocketAddr::new(ip, port).to_string())
}

impl Membership {
    /// Members of `cluster`, if known.
    pub fn cluster(&self, cluster: &str) -> Option<&[Member]> {
        self.clusters
            .iter()
            .find(|(name, _)| name == cluster)
            .map(|(_, m)| m.as_slice())
    }

    /// Adds `address` to `cluster` as a usable member; false if it was
    /// there. Bounded: past [`MAX_CLUSTERS`] new clusters are not kept, and
    /// past [`MAX_MEMBERS`] a cluster forgets its oldest member.
    pub fn add_member(&mut self, cluster: &str, address: &str) -> bool {
        if cluster.len() > 255 || address.len() > 255 {
            return false;
        }
        let index = match self.clusters.iter().position(|(n, _)| n == cluster) {
            Some(i) => i,
            None if self.clusters.len() < MAX_CLUSTERS => {
                self.clusters.push((cluster.to_string(), Vec::new()));
                self.clusters.len() - 1
            }
            None => return false,
        };
        let Some((_, members)) = self.clusters.get_mut(index) else {
            return false;
        };
        if members.iter().any(|m| m.address == address) {
            return false;
        }
        if members.len() >= MAX_MEMBERS {
            members.remove(0);
        }
        members.push(Member {
            address: address.to_string(),
            usable: true,
        });
        true
    }

    /// Reads Envoy's `/clusters?format=json`, keeping the clusters in
    /// `wanted` (at most [`MAX_CLUSTERS`], [`MAX_MEMBERS`] hosts each).
    /// Hosts without an IP socket address are skipped.
    pub fn from_admin_json(body: &[u8], wanted: &[&str]) -> Result<Membership, String> {
        let parsed: AdminClusters = serde_json::from_slice(body).map_err(|e| e.to_string())?;
        let mut clusters = Vec::new();
        for c in parsed.cluster_statuses {
            if !wanted.contains(&c.name.as_str()) || clusters.len() >= MAX_CLUSTERS {
                continue;
            }
            let members: Vec<Member> = c
                .host_statuses
                .iter()
                .filter_map(|h| {
                    let sock = h.address.as_ref()?.socket_address.as_ref()?;
                    Some(Member {
                        address: host_address(&sock.address, sock.port_value)?,
                        usable: h.health_status.usable(),
                    })
                })
                .take(MAX_MEMBERS)
                .collect();
            clusters.push((c.name, members));
        }
        Ok(Membership { clusters })
    }

    /// Layout: version u8, cluster count u16 LE, then per cluster: name
    /// (u8 length + bytes), host count u16 LE, per host: usable u8,
    /// address (u8 length + bytes).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![VERSION];
        let clusters: Vec<_> = self
            .clusters
            .iter()
            .filter(|(n, _)| n.len() <= 255)
            .take(MAX_CLUSTERS)
            .collect();
        out.extend_from_slice(&(clusters.len() as u16).to_le_bytes());
        for (name, members) in clusters {
            out.push(name.len() as u8);
            out.extend_from_slice(name.as_bytes());
            let members: Vec<_> = members
                .iter()
                .filter(|m| m.address.len() <= 255)
                .take(MAX_MEMBERS)
                .collect();
            out.extend_from_slice(&(members.len() as u16).to_le_bytes());
            for m in members {
                out.push(u8::from(m.usable));
                out.push(m.address.len() as u8);
                out.extend_from_slice(m.address.as_bytes());
            }
        }
        out
    }

    /// None for anything [`Membership::encode`] did not write.
    pub fn decode(bytes: &[u8]) -> Option<Membership> {
        let (&version, mut rest) = bytes.split_first()?;
        if version != VERSION {
            return None;
        }
        let mut take = |n: usize| -> Option<&[u8]> {
            if rest.len() < n {
                return None;
            }
            let (head, tail) = rest.split_at(n);
            rest = tail;
            Some(head)
        };
        let n_clusters = u16::from_le_bytes(take(2)?.try_into().ok()?);
        let mut clusters = Vec::new();
        for _ in 0..n_clusters {
            let len = usize::from(*take(1)?.first()?);
            let name = String::from_utf8(take(len)?.to_vec()).ok()?;
            let n_hosts = u16::from_le_bytes(take(2)?.try_into().ok()?);
            let mut members = Vec::new();
            for _ in 0..n_hosts {
                let usable = match take(1)?.first()? {
                    0 => false,
                    1 => true,
                    _ => return None,
                };
                let len = usize::from(*take(1)?.first()?);
                let address = String::from_utf8(take(len)?.to_vec()).ok()?;
                members.push(Member { address, usable });
            }
            clusters.push((name, members));
        }
        take(0)?;
        rest.is_empty().then_some(Membership { clusters })
    }
}

/// Shared-data key of the clusters the consumer has routed to, so the
/// membership refresh knows them before any of their hosts is tombstoned
/// (a tombstone then steers from its first moment, with health known).
pub const CLUSTERS_KEY: &str = "graceful.v1.consumer.clusters";

/// The clusters routed to (at most [`MAX_CLUSTERS`], names of at most 255
/// bytes; past the bound new ones are not tracked and fall back to the
/// addresses that answered).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterSet {
    names: Vec<String>,
}

impl ClusterSet {
    pub fn contains(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }

    /// Adds `name`; false if it was there, too long, or the set is full.
    pub fn insert(&mut self, name: &str) -> bool {
        if name.is_empty()
            || name.len() > 255
            || self.names.len() >= MAX_CLUSTERS
            || self.contains(name)
        {
            return false;
        }
        self.names.push(name.to_string());
        true
    }

    /// Layout: version u8, then per name: u8 length + bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![VERSION];
        for n in &self.names {
            out.push(n.len() as u8);
            out.extend_from_slice(n.as_bytes());
        }
        out
    }

    /// None for anything [`ClusterSet::encode`] did not write.
    pub fn decode(bytes: &[u8]) -> Option<ClusterSet> {
        let (&version, mut rest) = bytes.split_first()?;
        if version != VERSION {
            return None;
        }
        let mut set = ClusterSet::default();
        while let Some((&len, tail)) = rest.split_first() {
            let name = std::str::from_utf8(tail.get(..usize::from(len))?).ok()?;
            if !set.insert(name) {
                return None;
            }
            rest = tail.get(usize::from(len)..)?;
        }
        Some(set)
    }
}

/// The admin path that lists just `clusters` (Envoy's `filter` is a regex
/// on the cluster name; names are escaped, the query percent-encoded).
pub fn admin_clusters_path(clusters: &[&str]) -> String {
    let mut regex = String::from("^(");
    for (i, name) in clusters.iter().enumerate() {
        if i > 0 {
            regex.push('|');
        }
        for c in name.chars() {
            if "\\.^$|?*+()[]{}".contains(c) {
                regex.push('\\');
            }
            regex.push(c);
        }
    }
    regex.push_str(")$");
    let mut path = String::from("/clusters?format=json&filter=");
    for b in regex.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            path.push(char::from(b));
        } else {
            path.push_str(&format!("%{b:02X}"));
        }
    }
    path
}

/// Addresses that answered recently, per cluster: this VM copy's own view,
/// used when no admin cluster is configured. Bounded in clusters and hosts.
#[derive(Debug, Default)]
pub struct Observed {
    clusters: HashMap<String, Vec<(String, u64)>>,
}

impl Observed {
    /// Notes that `address` in `cluster` answered at `now_us`; true if this
    /// copy had not seen it answer within the window (worth telling the
    /// others).
    pub fn record(&mut self, cluster: &str, address: &str, now_us: u64) -> bool {
        if !self.clusters.contains_key(cluster) {
            if self.clusters.len() >= MAX_CLUSTERS {
                // Forget the cluster that answered least recently.
                let stalest = self
                    .clusters
                    .iter()
                    .min_by_key(|(_, hosts)| hosts.iter().map(|h| h.1).max().unwrap_or(0))
                    .map(|(name, _)| name.clone());
                if let Some(name) = stalest {
                    self.clusters.remove(&name);
                }
            }
            self.clusters.insert(cluster.to_string(), Vec::new());
        }
        let Some(hosts) = self.clusters.get_mut(cluster) else {
            return false;
        };
        if let Some(h) = hosts.iter_mut().find(|h| h.0 == address) {
            let stale = now_us.saturating_sub(h.1) >= OBSERVED_WINDOW_US;
            h.1 = now_us;
            return stale;
        }
        hosts.retain(|h| now_us.saturating_sub(h.1) < OBSERVED_WINDOW_US);
        if hosts.len() >= MAX_MEMBERS {
            if let Some(oldest) = hosts
                .iter()
                .enumerate()
                .min_by_key(|(_, h)| h.1)
                .map(|(i, _)| i)
            {
                hosts.swap_remove(oldest);
            }
        }
        hosts.push((address.to_string(), now_us));
        hosts.sort();
        true
    }

    /// Addresses of `cluster` that answered within the window, sorted.
    pub fn members(&self, cluster: &str, now_us: u64) -> Vec<Member> {
        self.clusters.get(cluster).map_or_else(Vec::new, |hosts| {
            hosts
                .iter()
                .filter(|h| now_us.saturating_sub(h.1) < OBSERVED_WINDOW_US)
                .map(|h| Member {
                    address: h.0.clone(),
                    usable: true,
                })
                .collect()
        })
    }
}

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

/// The steering decision for a request to `cluster` (the plan and one
/// rotation of it).
pub fn steer(
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

/// Live tombstones worth probing: a cluster to send through, and, when the
/// cluster's membership is known, the address still a member (otherwise
/// override_host would send the probe elsewhere).
pub fn probe_targets<'a>(
    tombstones: &'a Tombstones,
    membership: &Membership,
    now_us: u64,
) -> Vec<&'a Tombstone> {
    tombstones
        .live(now_us)
        .filter(|t| !t.cluster.is_empty())
        .filter(|t| {
            membership
                .cluster(&t.cluster)
                .is_none_or(|m| m.iter().any(|m| m.address == t.address))
        })
        .take(MAX_PROBES)
        .collect()
}

/// What a probe's answer says about the probed host: None unless it came
/// from the probed address and names an instance. 200 means that instance
/// serves; 503 that it is closing.
pub fn probe_observation<'a>(
    probed: &'a str,
    status: Option<&[u8]>,
    answered_at: Option<&[u8]>,
    instance: Option<&'a str>,
) -> Option<Observation<'a>> {
    if answered_at? != probed.as_bytes() {
        return None;
    }
    let instance = Some(instance?);
    match status? {
        b"200" => Some(Observation::Answered {
            address: probed,
            instance,
        }),
        b"503" => Some(Observation::Closing {
            cluster: "",
            address: probed,
            instance,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tombstone::{Change, Ttls};
    use std::time::Duration;

    const TTLS: Ttls = Ttls {
        closing: Duration::from_secs(30),
        failure: Duration::from_secs(5),
    };

    fn members(addrs: &[&str]) -> Vec<Member> {
        addrs
            .iter()
            .map(|a| Member {
                address: a.to_string(),
                usable: true,
            })
            .collect()
    }

    fn tombstoned(addrs: &[&str]) -> Tombstones {
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

    const ADMIN: &str = r#"{"cluster_statuses":[
      {"name":"svc","host_statuses":[
        {"address":{"socket_address":{"address":"127.0.0.1","port_value":18081}},"health_status":{"eds_health_status":"HEALTHY"}},
        {"address":{"socket_address":{"address":"127.0.0.2","port_value":18082}},"health_status":{"eds_health_status":"DRAINING"}},
        {"address":{"socket_address":{"address":"::1","port_value":18083}},"health_status":{"eds_health_status":"HEALTHY","failed_active_health_check":true}},
        {"address":{"pipe":{"path":"/x"}},"health_status":{}},
        {"address":{"socket_address":{"address":"127.0.0.4","port_value":18084}}}
      ]},
      {"name":"other","host_statuses":[{"address":{"socket_address":{"address":"10.0.0.1","port_value":1}}}]}
    ]}"#;

    #[test]
    fn reads_admin_membership_with_health() {
        let m = Membership::from_admin_json(ADMIN.as_bytes(), &["svc"]).unwrap();
        assert_eq!(m.cluster("other"), None, "only wanted clusters kept");
        let svc = m.cluster("svc").unwrap();
        let got: Vec<(&str, bool)> = svc.iter().map(|m| (m.address.as_str(), m.usable)).collect();
        assert_eq!(
            got,
            [
                ("127.0.0.1:18081", true),
                ("127.0.0.2:18082", false),
                ("[::1]:18083", false),
                ("127.0.0.4:18084", true)
            ]
        );
        assert_eq!(Membership::decode(&m.encode()), Some(m));
    }

    #[test]
    fn admin_garbage_is_an_error_not_a_panic() {
        for bad in [&b""[..], b"{", b"{\"cluster_statuses\":7}", b"\xff"] {
            assert!(
                Membership::from_admin_json(bad, &["svc"]).is_err(),
                "{bad:?}"
            );
        }
        assert_eq!(
            Membership::from_admin_json(b"{}", &["svc"]).unwrap(),
            Membership::default()
        );
        // serde reads a struct from an array too: nothing in it, nothing kept.
        assert_eq!(
            Membership::from_admin_json(b"[]", &["svc"]).unwrap(),
            Membership::default()
        );
    }

    #[test]
    fn membership_decode_refuses_truncation() {
        let m = Membership::from_admin_json(ADMIN.as_bytes(), &["svc", "other"]).unwrap();
        let bytes = m.encode();
        assert_eq!(Membership::decode(&bytes), Some(m));
        for cut in 0..bytes.len() {
            assert_eq!(Membership::decode(&bytes[..cut]), None, "cut at {cut}");
        }
    }

    #[test]
    fn cluster_set_is_bounded_and_round_trips() {
        let mut set = ClusterSet::default();
        assert!(set.insert("svc"));
        assert!(!set.insert("svc"), "once");
        assert!(!set.insert(""), "no empty name");
        assert!(!set.insert(&"x".repeat(256)), "no overlong name");
        for i in 0..100 {
            set.insert(&format!("c{i}"));
        }
        assert_eq!(set.names().count(), MAX_CLUSTERS);
        assert_eq!(ClusterSet::decode(&set.encode()), Some(set.clone()));
        let bytes = set.encode();
        assert_eq!(ClusterSet::decode(&bytes[..bytes.len() - 1]), None);
        assert_eq!(ClusterSet::decode(&[2]), None);
        assert_eq!(
            ClusterSet::decode(&[1, 1, b'a', 1, b'a']),
            None,
            "duplicates are foreign"
        );
    }

    #[test]
    fn admin_path_escapes_names() {
        assert_eq!(
            admin_clusters_path(&["svc"]),
            "/clusters?format=json&filter=%5E%28svc%29%24"
        );
        assert_eq!(
            admin_clusters_path(&["a.b", "c|d"]),
            "/clusters?format=json&filter=%5E%28a%5C.b%7Cc%5C%7Cd%29%24"
        );
    }

    #[test]
    fn shared_observed_membership_is_bounded() {
        let mut m = Membership::default();
        assert!(m.add_member("svc", "a:1"));
        assert!(!m.add_member("svc", "a:1"));
        for i in 0..2000 {
            m.add_member("svc", &format!("h{i}:1"));
        }
        let svc = m.cluster("svc").unwrap();
        assert_eq!(svc.len(), MAX_MEMBERS);
        assert_eq!(
            svc.last().unwrap().address,
            "h1999:1",
            "the oldest members went first"
        );
        for c in 0..100 {
            m.add_member(&format!("c{c}"), "x:1");
        }
        assert_eq!(Membership::decode(&m.encode()), Some(m));
    }

    #[test]
    fn observed_members_expire_and_stay_bounded() {
        let mut o = Observed::default();
        assert!(o.record("svc", "b:1", 0));
        assert!(o.record("svc", "a:1", 10));
        assert!(
            !o.record("svc", "a:1", 20),
            "seen within the window: nothing new to tell"
        );
        let addrs: Vec<String> = o
            .members("svc", 30)
            .into_iter()
            .map(|m| m.address)
            .collect();
        assert_eq!(addrs, ["a:1", "b:1"]);
        assert_eq!(
            o.members("svc", OBSERVED_WINDOW_US + 5).len(),
            1,
            "b:1 left the window"
        );
        for i in 0..3000 {
            o.record("svc", &format!("h{i}:1"), 100 + i);
        }
        assert_eq!(o.members("svc", 4000).len(), MAX_MEMBERS);
        for c in 0..100 {
            o.record(&format!("c{c}"), "x:1", 5000 + c);
        }
        assert!(o.clusters.len() <= MAX_CLUSTERS);
    }

    #[test]
    fn probes_go_to_live_tombstones_still_in_the_cluster() {
        let t = tombstoned(&["a:1", "b:1"]);
        let none = Membership::default();
        assert_eq!(
            probe_targets(&t, &none, 0).len(),
            2,
            "unknown membership: probe all"
        );
        let m = Membership::from_admin_json(
            br#"{"cluster_statuses":[{"name":"svc","host_statuses":[{"address":{"socket_address":{"address":"127.0.0.1","port_value":1}}}]}]}"#,
            &["svc"],
        )
        .unwrap();
        assert!(
            probe_targets(&t, &m, 0).is_empty(),
            "neither address is a member"
        );
        assert!(probe_targets(&t, &none, 30_000_000).is_empty(), "expired");
    }

    #[test]
    fn probe_answers_count_only_from_the_probed_address() {
        let ok = probe_observation("a:1", Some(b"200"), Some(b"a:1"), Some("new"));
        assert_eq!(
            ok,
            Some(Observation::Answered {
                address: "a:1",
                instance: Some("new")
            })
        );
        assert_eq!(
            probe_observation("a:1", Some(b"200"), Some(b"b:1"), Some("new")),
            None,
            "fallback host answered"
        );
        assert_eq!(
            probe_observation("a:1", Some(b"200"), None, Some("new")),
            None
        );
        assert_eq!(
            probe_observation("a:1", Some(b"200"), Some(b"a:1"), None),
            None
        );
        assert_eq!(
            probe_observation("a:1", None, Some(b"a:1"), Some("new")),
            None,
            "no answer"
        );
        assert_eq!(
            probe_observation("a:1", Some(b"404"), Some(b"a:1"), Some("new")),
            None
        );
        let closing = probe_observation("a:1", Some(b"503"), Some(b"a:1"), Some("old"));
        assert!(matches!(closing, Some(Observation::Closing { .. })));
        let mut t = tombstoned(&["a:1"]);
        assert_eq!(t.observe(&ok.unwrap(), &TTLS, 1, 64), Change::Readmitted);
    }
}
