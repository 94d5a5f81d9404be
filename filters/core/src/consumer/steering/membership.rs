//! Cluster membership: Envoy's admin view (with health, [`super::admin`]), the
//! addresses that answered as every VM copy saw them (shared), and this
//! copy's own recent answers.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// Encoding version of [`Membership`] values (2: a last-seen time per
/// member; 3: its priority). A member's first byte, once its usable bit,
/// is now a set of flags with `DRAINING` beside it: a value with no
/// `DRAINING` member is written as before, and one with is unreadable to a
/// build from before, as a new version would be (every copy in one Envoy
/// runs one build), so the version stays.
const VERSION: u8 = 3;
/// A member's flag bits.
const FLAG_USABLE: u8 = 1;
const FLAG_DRAINING: u8 = 2;

/// Bounds on what membership keeps.
pub const MAX_CLUSTERS: usize = 64;
pub const MAX_MEMBERS: usize = 1024;
/// How long an address that answered counts as a member, without admin:
/// an address that left the cluster stops being listed this long after its
/// last answer.
pub const OBSERVED_WINDOW_US: u64 = 60_000_000;
/// A member's last-seen time in the shared observed membership is written
/// again once it is this old (the writes per host stay rare).
pub const SEEN_REFRESH_US: u64 = 15_000_000;

/// A cluster member as the admin reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub address: String,
    /// Healthy (or degraded) per EDS and not failing health or outlier
    /// checks: Envoy's own load balancer would pick it.
    pub usable: bool,
    /// The admin lists it EDS `DRAINING` (so not `usable` either): the
    /// control plane is taking it away. Its cluster is steered while it is
    /// listed ([`super::plan()`]); the front-proxy role reads it as the
    /// host closing.
    pub draining: bool,
    /// When it last answered, in seconds on the host's monotonic clock, for observed
    /// membership; 0 for the admin's (its listing is the registry's).
    pub seen_s: u32,
    /// Its EDS priority as the admin lists it (0 first; Istio's locality
    /// failover and `trafficDistribution` put other zones and regions at
    /// 1, 2, ...); 0 for observed members, whose priority nobody says.
    /// Kept to 255.
    pub priority: u8,
}

/// µs on the host's monotonic clock as the seconds a member's `seen_s` holds.
fn seconds(us: u64) -> u32 {
    u32::try_from(us / 1_000_000).unwrap_or(u32::MAX)
}

/// Members of the clusters that have tombstones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Membership {
    clusters: Vec<(String, Vec<Member>)>,
}

/// `ip:port` the way Envoy prints host addresses (`[v6]:port`).
pub(super) fn host_address(ip: &str, port: u16) -> Option<String> {
    let ip: IpAddr = ip.parse().ok()?;
    Some(SocketAddr::new(ip, port).to_string())
}

/// The IP of a member's `ip:port` address, IPv4 mapped into IPv6: the
/// key the front-proxy role knows a host by (`consumer::front::host_ip`,
/// not imported so that steering stays below the front in the import
/// graph). None for anything but an `ip:port`.
pub fn member_ip(address: &str) -> Option<Ipv6Addr> {
    let socket: SocketAddr = address.parse().ok()?;
    Some(match socket.ip() {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    })
}

impl Membership {
    /// Every cluster known and its members, in the order read.
    pub fn clusters(&self) -> impl Iterator<Item = (&str, &[Member])> {
        self.clusters
            .iter()
            .map(|(name, members)| (name.as_str(), members.as_slice()))
    }

    /// Some member of some cluster is listed `DRAINING`.
    pub fn any_draining(&self) -> bool {
        self.clusters
            .iter()
            .any(|(_, members)| members.iter().any(|m| m.draining))
    }

    /// No cluster known.
    pub fn is_empty(&self) -> bool {
        self.clusters.is_empty()
    }

    /// Members of `cluster`, if known.
    pub fn cluster(&self, cluster: &str) -> Option<&[Member]> {
        self.clusters
            .iter()
            .find(|(name, _)| name == cluster)
            .map(|(_, m)| m.as_slice())
    }

    /// Members of `cluster` that answered within [`OBSERVED_WINDOW_US`] of
    /// `now_us` (observed membership), if the cluster is known.
    pub fn seen_within_window(&self, cluster: &str, now_us: u64) -> Option<Vec<Member>> {
        let oldest = seconds(now_us.saturating_sub(OBSERVED_WINDOW_US));
        let members = self.cluster(cluster)?;
        Some(
            members
                .iter()
                .filter(|m| m.seen_s > oldest)
                .cloned()
                .collect(),
        )
    }

    /// Whether `address` in `cluster` was seen within [`SEEN_REFRESH_US`]
    /// of `now_us`: nothing worth writing.
    pub fn seen_lately(&self, cluster: &str, address: &str, now_us: u64) -> bool {
        let fresh = seconds(now_us.saturating_sub(SEEN_REFRESH_US));
        self.cluster(cluster)
            .is_some_and(|m| m.iter().any(|m| m.address == address && m.seen_s > fresh))
    }

    /// Notes that `address` in `cluster` answered at `now_us`: adds it as a
    /// usable member, or moves its last-seen time; false when that changed
    /// nothing worth a write (a member seen within [`SEEN_REFRESH_US`]).
    /// Bounded: past [`MAX_CLUSTERS`] new clusters are not kept, and past
    /// [`MAX_MEMBERS`] a cluster forgets the member seen longest ago.
    pub fn saw(&mut self, cluster: &str, address: &str, now_us: u64) -> bool {
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
        let now_s = seconds(now_us);
        if let Some(m) = members.iter_mut().find(|m| m.address == address) {
            let stale = m.seen_s <= seconds(now_us.saturating_sub(SEEN_REFRESH_US));
            if stale {
                m.seen_s = now_s;
            }
            return stale;
        }
        if members.len() >= MAX_MEMBERS {
            if let Some(oldest) = members
                .iter()
                .enumerate()
                .min_by_key(|(_, m)| m.seen_s)
                .map(|(i, _)| i)
            {
                members.remove(oldest);
            }
        }
        members.push(Member {
            address: address.to_string(),
            usable: true,
            draining: false,
            seen_s: now_s,
            priority: 0,
        });
        true
    }

    /// The clusters and their members, for the admin answers' readers.
    pub(super) fn from_clusters(clusters: Vec<(String, Vec<Member>)>) -> Membership {
        Membership { clusters }
    }

    /// Layout: version u8, cluster count u16 LE, then per cluster: name
    /// (u8 length + bytes), host count u16 LE, per host: flags u8 (1
    /// usable, 2 draining),
    /// priority u8, last seen u32 LE (seconds), address (u8 length +
    /// bytes). Sized first: one allocation, however many members.
    pub fn encode(&self) -> Vec<u8> {
        let size = 3 + self
            .encodable_clusters()
            .map(|(name, members)| {
                3 + name.len()
                    + encodable_members(members)
                        .map(|m| 7 + m.address.len())
                        .sum::<usize>()
            })
            .sum::<usize>();
        let mut out = Vec::with_capacity(size);
        out.push(VERSION);
        out.extend_from_slice(&(self.encodable_clusters().count() as u16).to_le_bytes());
        for (name, members) in self.encodable_clusters() {
            out.push(name.len() as u8);
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(&(encodable_members(members).count() as u16).to_le_bytes());
            for m in encodable_members(members) {
                let draining = if m.draining { FLAG_DRAINING } else { 0 };
                out.push(u8::from(m.usable) | draining);
                out.push(m.priority);
                out.extend_from_slice(&m.seen_s.to_le_bytes());
                out.push(m.address.len() as u8);
                out.extend_from_slice(m.address.as_bytes());
            }
        }
        out
    }

    /// The clusters [`Membership::encode`] writes: named in at most 255
    /// bytes, the first [`MAX_CLUSTERS`].
    fn encodable_clusters(&self) -> impl Iterator<Item = &(String, Vec<Member>)> {
        self.clusters
            .iter()
            .filter(|(n, _)| n.len() <= 255)
            .take(MAX_CLUSTERS)
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
                let flags = *take(1)?.first()?;
                if flags & !(FLAG_USABLE | FLAG_DRAINING) != 0 {
                    return None;
                }
                let priority = *take(1)?.first()?;
                let seen_s = u32::from_le_bytes(take(4)?.try_into().ok()?);
                let len = usize::from(*take(1)?.first()?);
                let address = String::from_utf8(take(len)?.to_vec()).ok()?;
                members.push(Member {
                    address,
                    usable: flags & FLAG_USABLE != 0,
                    draining: flags & FLAG_DRAINING != 0,
                    seen_s,
                    priority,
                });
            }
            clusters.push((name, members));
        }
        take(0)?;
        rest.is_empty().then_some(Membership { clusters })
    }
}

/// The members [`Membership::encode`] writes of a cluster: addresses of at
/// most 255 bytes, the first [`MAX_MEMBERS`].
fn encodable_members(members: &[Member]) -> impl Iterator<Item = &Member> {
    members
        .iter()
        .filter(|m| m.address.len() <= 255)
        .take(MAX_MEMBERS)
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
                    draining: false,
                    seen_s: seconds(h.1),
                    priority: 0,
                })
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

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
        let got: Vec<(&str, bool, bool)> = svc
            .iter()
            .map(|m| (m.address.as_str(), m.usable, m.draining))
            .collect();
        assert_eq!(
            got,
            [
                ("127.0.0.1:18081", true, false),
                ("127.0.0.2:18082", false, true),
                ("[::1]:18083", false, false),
                ("127.0.0.4:18084", true, false)
            ]
        );
        assert!(m.any_draining());
        assert_eq!(Membership::decode(&m.encode()), Some(m));
    }

    #[test]
    fn a_value_written_before_draining_is_read_the_same_and_unknown_flags_are_refused() {
        // One cluster "s", one member: usable, priority 2, seen at 7 s,
        // as a build from before the draining flag wrote it.
        let mut before = vec![3, 1, 0, 1, b's', 1, 0, 1, 2, 7, 0, 0, 0, 3];
        before.extend_from_slice(b"a:1");
        let m = Membership::decode(&before).unwrap();
        assert_eq!(
            m.cluster("s"),
            Some(
                &[Member {
                    address: "a:1".into(),
                    usable: true,
                    draining: false,
                    seen_s: 7,
                    priority: 2,
                }][..]
            )
        );
        assert_eq!(m.encode(), before, "written the same");
        let mut draining = before.clone();
        draining[7] = 2;
        let read = Membership::decode(&draining).unwrap();
        let member = &read.cluster("s").unwrap()[0];
        assert_eq!((member.usable, member.draining), (false, true));
        assert_eq!(read.encode(), draining);
        let mut unknown = before;
        unknown[7] = 4;
        assert_eq!(Membership::decode(&unknown), None);
    }

    #[test]
    fn member_ips_are_ipv4_mapped() {
        let mapped = Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped();
        assert_eq!(member_ip("10.0.0.1:80"), Some(mapped));
        assert_eq!(member_ip("[::ffff:10.0.0.1]:80"), Some(mapped));
        assert_eq!(member_ip("[fd00::3]:8080"), "fd00::3".parse().ok());
        for bad in ["10.0.0.1", "host:80", "", "[fd00::3]"] {
            assert_eq!(member_ip(bad), None, "{bad}");
        }
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
    fn shared_observed_membership_is_bounded() {
        const T: u64 = 1_000_000_000_000_000;
        let mut m = Membership::default();
        assert!(m.saw("svc", "a:1", T));
        assert!(!m.saw("svc", "a:1", T), "seen lately: nothing to write");
        for i in 0..2000u64 {
            m.saw("svc", &format!("h{i}:1"), T + (i + 1) * 1_000_000);
        }
        let svc = m.cluster("svc").unwrap();
        assert_eq!(svc.len(), MAX_MEMBERS);
        assert_eq!(
            svc.last().unwrap().address,
            "h1999:1",
            "the members seen longest ago went first"
        );
        assert!(svc.iter().all(|m| m.address != "a:1"));
        for c in 0..100 {
            m.saw(&format!("c{c}"), "x:1", T);
        }
        assert_eq!(Membership::decode(&m.encode()), Some(m));
    }

    #[test]
    fn observed_members_leave_the_window_and_are_seen_again() {
        const T: u64 = 1_000_000_000_000_000;
        let mut m = Membership::default();
        m.saw("svc", "a:1", T);
        m.saw("svc", "b:1", T + 30 * 1_000_000);
        let within = |m: &Membership, at: u64| -> Vec<String> {
            m.seen_within_window("svc", at)
                .unwrap()
                .into_iter()
                .map(|m| m.address)
                .collect()
        };
        assert_eq!(within(&m, T + 59 * 1_000_000), ["a:1", "b:1"]);
        assert_eq!(
            within(&m, T + 61 * 1_000_000),
            ["b:1"],
            "a:1 last answered over a minute ago"
        );
        assert!(m.seen_lately("svc", "b:1", T + 40 * 1_000_000));
        assert!(!m.seen_lately("svc", "b:1", T + 46 * 1_000_000));
        assert!(
            !m.saw("svc", "b:1", T + 40 * 1_000_000),
            "within the refresh: unchanged"
        );
        assert!(m.saw("svc", "a:1", T + 61 * 1_000_000), "seen again");
        assert_eq!(within(&m, T + 62 * 1_000_000), ["a:1", "b:1"]);
        assert_eq!(m.seen_within_window("other", T), None);
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
}
