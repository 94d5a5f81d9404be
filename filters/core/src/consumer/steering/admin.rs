//! Where the consumer reads membership from Envoy's admin, and how it reads
//! each answer.
//!
//! `/clusters?format=json&filter=` lists just the clusters routed to, with
//! each host's health flags; Envoy before 1.38 ignores `filter` (envoy PR
//! 43407) and lists every cluster: 7.2 MB and about 0.3 s of the main
//! thread's CPU at 1,000 clusters of 10 hosts (Envoy 1.36.4, measured).
//! `/config_dump?include_eds` with `name_regex` and a mask of the endpoint
//! configs is filtered on every Envoy from 1.36 on and costs about what the
//! filtered `/clusters` costs, but it names each cluster by its EDS service
//! name, which some control planes set apart from the cluster's name
//! (Istio and Envoy Gateway do not). So the refresh asks `/clusters` first,
//! and turns to the config dump only when the answer shows the filter was
//! ignored (a cluster not asked for, or an answer too big to read); the
//! choice is shared ([`keys::ADMIN_SOURCE`]) so one answer per Envoy pays
//! for learning it. Where the whole answer takes longer than the call's
//! timeout (1 s: some 5,000 clusters of 10 hosts on 1.36, at 0.18 s per
//! 1,000), no answer arrives to show it, and each refresh would cost the
//! main thread the whole answer again; so [`CLUSTERS_UNANSWERED_TURN`]
//! refreshes in a row with no answer turn to the config dump too.
//!
//! The dump's `name_regex` is an RE2 regex that Envoy refuses (400) past
//! `re2.max_program_size.error_level`: 100 in plain Envoy, about two
//! Istio-style cluster names; Istio sets 32768 and Envoy Gateway
//! 4294967295 in their bootstraps, and the shipped consumer sidecars set
//! 32768 as Istio does. The refusal is logged with Envoy's own words.
//!
//! | source | answer | next source |
//! |---|---|---|
//! | `Clusters` | only clusters asked for | `Clusters` |
//! | `Clusters` | a cluster not asked for, or over [`MAX_ADMIN_BODY`] bytes | `ConfigDump` |
//! | `Clusters` | none in time (no `:status`, or 504), the [`CLUSTERS_UNANSWERED_TURN`]th refresh in a row | `ConfigDump` |
//! | `Clusters` | none in time, fewer in a row; or another refusal | `Clusters` |
//! | `ConfigDump` | any | `ConfigDump` (for the Envoy's life) |

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};

use serde::Deserialize;

use super::membership::{host_address, Member, Membership, MAX_CLUSTERS, MAX_MEMBERS};
use crate::shared::keys;
use crate::shared::store::SharedStore;

/// Most admin answer bytes read.
pub const MAX_ADMIN_BODY: usize = 4 << 20;

/// `/clusters` refreshes in a row that got no answer in time before the
/// consumer reads the config dump instead: more than one, so that a main
/// thread busy once does not turn an Envoy whose filter works.
pub const CLUSTERS_UNANSWERED_TURN: u8 = 3;

/// The admin endpoint membership is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminSource {
    /// `/clusters?format=json&filter=`.
    Clusters,
    /// `/config_dump?include_eds&mask=...&name_regex=`.
    ConfigDump,
}

/// What one admin answer said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminAnswer {
    pub membership: Membership,
    /// The answer listed clusters that were not asked for: this Envoy
    /// ignores `/clusters`'s filter.
    pub unfiltered: bool,
}

impl AdminSource {
    /// The source this Envoy's consumers use: `/clusters` unless an answer
    /// showed its filter ignored.
    pub fn shared(store: &dyn SharedStore) -> AdminSource {
        match store.get(keys::ADMIN_SOURCE.name) {
            Ok(Some((b, _))) if b.as_slice() == [1] => AdminSource::ConfigDump,
            _ => AdminSource::Clusters,
        }
    }

    /// Records that this Envoy ignores `/clusters`'s filter (written whole,
    /// never read-modify-written: every writer writes the same byte).
    pub fn share(self, store: &dyn SharedStore) -> bool {
        let byte = match self {
            AdminSource::Clusters => 0,
            AdminSource::ConfigDump => 1,
        };
        store.set(keys::ADMIN_SOURCE.name, &[byte], 0).is_ok()
    }

    /// The admin path that lists just `clusters`.
    pub fn path(self, clusters: &[&str]) -> String {
        match self {
            AdminSource::Clusters => admin_clusters_path(clusters),
            AdminSource::ConfigDump => format!(
                "/config_dump?include_eds&mask=dynamic_endpoint_configs,static_endpoint_configs&name_regex={}",
                name_regex(clusters)
            ),
        }
    }

    /// Reads an answer of this source, keeping the clusters in `wanted`
    /// (at most [`MAX_CLUSTERS`], [`MAX_MEMBERS`] hosts each). Hosts
    /// without an IP socket address are skipped.
    pub fn read(self, body: &[u8], wanted: &[&str]) -> Result<AdminAnswer, String> {
        let mut unfiltered = false;
        let mut clusters = Vec::new();
        let mut keep = |name: String, members: Vec<Member>| {
            if !wanted.contains(&name.as_str()) {
                unfiltered = true;
            } else if clusters.len() < MAX_CLUSTERS {
                clusters.push((name, members));
            }
        };
        match self {
            AdminSource::Clusters => {
                let parsed: AdminClusters =
                    serde_json::from_slice(body).map_err(|e| e.to_string())?;
                for c in parsed.cluster_statuses {
                    let members = c
                        .host_statuses
                        .iter()
                        .filter_map(|h| {
                            let health = &h.health_status;
                            let eds = health.eds_health_status.as_deref();
                            member(
                                h.address.as_ref(),
                                health.usable(),
                                is_draining(eds),
                                h.priority,
                            )
                        })
                        .take(MAX_MEMBERS)
                        .collect();
                    keep(c.name, members);
                }
            }
            AdminSource::ConfigDump => {
                let parsed: ConfigDump = serde_json::from_slice(body).map_err(|e| e.to_string())?;
                for dump in parsed.configs {
                    for c in dump
                        .dynamic_endpoint_configs
                        .into_iter()
                        .chain(dump.static_endpoint_configs)
                    {
                        let assignment = c.endpoint_config;
                        let members = assignment
                            .endpoints
                            .iter()
                            .flat_map(|l| l.lb_endpoints.iter().map(move |e| (l.priority, e)))
                            .filter_map(|(priority, e)| {
                                let status = e.health_status.as_deref();
                                member(
                                    e.endpoint.address.as_ref(),
                                    eds_status_usable(status),
                                    is_draining(status),
                                    priority,
                                )
                            })
                            .take(MAX_MEMBERS)
                            .collect();
                        keep(assignment.cluster_name, members);
                    }
                }
            }
        }
        Ok(AdminAnswer {
            membership: Membership::from_clusters(clusters),
            unfiltered,
        })
    }
}

/// A host of either answer as a member; None without an IP socket
/// address.
fn member(
    address: Option<&AdminAddress>,
    usable: bool,
    draining: bool,
    priority: u32,
) -> Option<Member> {
    let sock = address?.socket_address.as_ref()?;
    Some(Member {
        address: host_address(&sock.address, sock.port_value)?,
        usable,
        draining,
        seen_s: 0,
        priority: u8::try_from(priority).unwrap_or(u8::MAX),
    })
}

/// Whether an EDS health status (as either answer spells it; absent is
/// `UNKNOWN`, which proto3 JSON leaves out) lets Envoy's load balancer
/// pick the host.
fn eds_status_usable(status: Option<&str>) -> bool {
    matches!(status, None | Some("HEALTHY" | "DEGRADED" | "UNKNOWN"))
}

/// Whether an EDS health status (either answer's spelling) is `DRAINING`:
/// kept apart from `usable` (a `DRAINING` member is not usable either), as
/// the control plane's word that the host is leaving (Envoy Gateway's for
/// a terminating endpoint).
fn is_draining(status: Option<&str>) -> bool {
    status == Some("DRAINING")
}

/// Per-IP requests in flight (each host's `rq_active` stat, summed over
/// the clusters and ports at the IP, IPv4 mapped) from a
/// `/clusters?format=json` answer. Every IP listed has an entry: Envoy
/// leaves a zero stat out (1.40), or lists its name without a value
/// (proto3 JSON omits a zero `uint64`), so absent reads 0. None when the
/// body is not a `/clusters` answer (no `cluster_statuses`: a config dump
/// or an error would otherwise read as every host gone), or an `rq_active`
/// value is not a count (a host must never read 0 by mistake: 0 is what
/// lets a front acknowledge a drain).
pub fn rq_active_by_ip(body: &[u8]) -> Option<HashMap<Ipv6Addr, u32>> {
    let parsed: StatsClusters = serde_json::from_slice(body).ok()?;
    let mut active: HashMap<Ipv6Addr, u32> = HashMap::new();
    for host in parsed
        .cluster_statuses
        .iter()
        .flat_map(|c| &c.host_statuses)
    {
        let Some(ip) = host
            .address
            .as_ref()
            .and_then(|a| a.socket_address.as_ref())
            .and_then(|s| s.address.parse::<IpAddr>().ok())
        else {
            continue;
        };
        let mut count: u64 = 0;
        for stat in host.stats.iter().filter(|s| s.name == "rq_active") {
            count = count.saturating_add(stat_value(stat.value.as_ref())?);
        }
        let ip = match ip {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        let sum = active.entry(ip).or_insert(0);
        *sum = sum.saturating_add(u32::try_from(count).unwrap_or(u32::MAX));
    }
    Some(active)
}

/// A stat's value as proto3 JSON writes a `uint64` (a decimal string), or
/// a number; absent is 0. None for anything else.
fn stat_value(value: Option<&serde_json::Value>) -> Option<u64> {
    match value {
        None | Some(serde_json::Value::Null) => Some(0),
        Some(serde_json::Value::String(s)) => s.parse().ok(),
        Some(serde_json::Value::Number(n)) => n.as_u64(),
        Some(_) => None,
    }
}

/// The admin path that lists just `clusters` from `/clusters`.
pub fn admin_clusters_path(clusters: &[&str]) -> String {
    format!("/clusters?format=json&filter={}", name_regex(clusters))
}

/// A regex matching exactly `clusters` (names escaped), percent-encoded
/// for a query.
fn name_regex(clusters: &[&str]) -> String {
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
    let mut query = String::new();
    for b in regex.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            query.push(char::from(b));
        } else {
            query.push_str(&format!("%{b:02X}"));
        }
    }
    query
}

impl Membership {
    /// Reads Envoy's `/clusters?format=json`, keeping the clusters in
    /// `wanted` (at most [`MAX_CLUSTERS`], [`MAX_MEMBERS`] hosts each).
    /// Hosts without an IP socket address are skipped.
    pub fn from_admin_json(body: &[u8], wanted: &[&str]) -> Result<Membership, String> {
        AdminSource::Clusters
            .read(body, wanted)
            .map(|answer| answer.membership)
    }
}

#[derive(Deserialize)]
/// `/clusters?format=json`.
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
    /// Absent (proto3 JSON) for priority 0.
    #[serde(default)]
    priority: u32,
}

/// `/clusters?format=json` as [`rq_active_by_ip`] reads it: the clusters
/// required (see there), each host's address and stats.
#[derive(Deserialize)]
struct StatsClusters {
    cluster_statuses: Vec<StatsCluster>,
}

#[derive(Deserialize)]
struct StatsCluster {
    #[serde(default)]
    host_statuses: Vec<StatsHost>,
}

#[derive(Deserialize)]
struct StatsHost {
    address: Option<AdminAddress>,
    /// `envoy.admin.v3.SimpleMetric`s: `type` (absent for a counter),
    /// `value` (a `uint64`, absent at 0), `name`.
    #[serde(default)]
    stats: Vec<HostStat>,
}

#[derive(Deserialize)]
struct HostStat {
    #[serde(default)]
    name: String,
    #[serde(default)]
    value: Option<serde_json::Value>,
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
        eds_status_usable(self.eds_health_status.as_deref())
            && !self.failed_active_health_check
            && !self.failed_outlier_check
            && !self.pending_dynamic_removal
            && !self.excluded_via_immediate_hc_fail
            && !self.active_hc_timeout
    }
}

/// `/config_dump?include_eds` masked to the endpoint configs. `configs`
/// is required: Envoy always sends it, and an answer without it is not a
/// dump (read as one, it would empty the membership).
#[derive(Deserialize)]
struct ConfigDump {
    configs: Vec<EndpointsDump>,
}

#[derive(Deserialize)]
struct EndpointsDump {
    #[serde(default)]
    dynamic_endpoint_configs: Vec<EndpointConfig>,
    #[serde(default)]
    static_endpoint_configs: Vec<EndpointConfig>,
}

#[derive(Deserialize)]
struct EndpointConfig {
    endpoint_config: ClusterLoadAssignment,
}

#[derive(Deserialize)]
struct ClusterLoadAssignment {
    /// The cluster's EDS service name, else its name.
    cluster_name: String,
    #[serde(default)]
    endpoints: Vec<LocalityEndpoints>,
}

#[derive(Deserialize)]
struct LocalityEndpoints {
    #[serde(default)]
    lb_endpoints: Vec<LbEndpoint>,
    #[serde(default)]
    priority: u32,
}

#[derive(Deserialize)]
struct LbEndpoint {
    endpoint: DumpedEndpoint,
    /// Envoy dumps the host's coarse health (EDS, active and outlier
    /// checks together); proto3 JSON leaves out `UNKNOWN`.
    #[serde(default)]
    health_status: Option<String>,
}

#[derive(Deserialize)]
struct DumpedEndpoint {
    address: Option<AdminAddress>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::store::MemStore;

    /// A 1.36.4 answer, cut to two hosts (one marked unhealthy by hand).
    const DUMP: &str = r#"{"configs": [{"@type": "type.googleapis.com/envoy.admin.v3.EndpointsConfigDump",
      "static_endpoint_configs": [{"endpoint_config": {"@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment", "cluster_name": "admin",
        "endpoints": [{"locality": {}, "lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 19000}}, "health_check_config": {}}, "health_status": "HEALTHY", "load_balancing_weight": 1}], "load_balancing_weight": 0}], "policy": {"overprovisioning_factor": 140}}}],
      "dynamic_endpoint_configs": [{"endpoint_config": {"@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment", "cluster_name": "outbound|80||svc7.default.svc.cluster.local",
        "endpoints": [{"locality": {}, "lb_endpoints": [
          {"endpoint": {"address": {"socket_address": {"address": "10.1.7.1", "port_value": 8080}}, "health_check_config": {}}, "health_status": "HEALTHY", "load_balancing_weight": 1},
          {"endpoint": {"address": {"socket_address": {"address": "10.1.7.2", "port_value": 8080}}, "health_check_config": {}}, "health_status": "UNHEALTHY", "load_balancing_weight": 1}],
          "load_balancing_weight": 0},
          {"priority": 1, "lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": "fd00::3", "port_value": 8080}}}}]}],
        "policy": {"overprovisioning_factor": 140}}}]}]}"#;

    const SVC: &str = "outbound|80||svc7.default.svc.cluster.local";

    #[test]
    fn reads_the_config_dump_with_coarse_health_and_priority_over_every_locality() {
        let answer = AdminSource::ConfigDump
            .read(DUMP.as_bytes(), &[SVC])
            .unwrap();
        assert!(answer.unfiltered, "the admin cluster was not asked for");
        assert_eq!(answer.membership.cluster("admin"), None);
        let got: Vec<(&str, bool, u8)> = answer
            .membership
            .cluster(SVC)
            .unwrap()
            .iter()
            .map(|m| (m.address.as_str(), m.usable, m.priority))
            .collect();
        assert_eq!(
            got,
            [
                ("10.1.7.1:8080", true, 0),
                ("10.1.7.2:8080", false, 0),
                ("[fd00::3]:8080", true, 1)
            ]
        );
        let only = AdminSource::ConfigDump
            .read(DUMP.as_bytes(), &[SVC, "admin"])
            .unwrap();
        assert!(!only.unfiltered);
        assert!(only.membership.cluster("admin").is_some());
    }

    #[test]
    fn draining_is_kept_apart_from_usable_in_either_answer() {
        let dump = DUMP.replace(
            r#""health_status": "UNHEALTHY""#,
            r#""health_status": "DRAINING""#,
        );
        let answer = AdminSource::ConfigDump
            .read(dump.as_bytes(), &[SVC])
            .unwrap();
        let got: Vec<(&str, bool, bool)> = answer
            .membership
            .cluster(SVC)
            .unwrap()
            .iter()
            .map(|m| (m.address.as_str(), m.usable, m.draining))
            .collect();
        assert_eq!(
            got,
            [
                ("10.1.7.1:8080", true, false),
                ("10.1.7.2:8080", false, true),
                ("[fd00::3]:8080", true, false)
            ]
        );
        let answer = AdminSource::Clusters
            .read(CLUSTERS.as_bytes(), &["svc"])
            .unwrap();
        let draining: Vec<(&str, bool)> = answer
            .membership
            .cluster("svc")
            .unwrap()
            .iter()
            .map(|m| (m.address.as_str(), m.draining))
            .collect();
        assert_eq!(
            draining,
            [
                ("10.0.0.1:8080", false),
                ("10.0.0.2:8080", true),
                ("10.0.0.2:9090", false),
                ("[fd00::3]:8080", false)
            ]
        );
    }

    /// A `/clusters?format=json` answer shaped as Envoy 1.40 writes it
    /// (stats cut to a few; `rq_active` is a gauge, its `value` a proto3
    /// `uint64` string, absent at 0): 10.0.0.1 with 3 in flight, 10.0.0.2
    /// `DRAINING` with 1 on one port and 2 on another port in a second
    /// cluster (one listed with a zero stat's name and no value), fd00::3
    /// with none, and a pipe (no IP).
    const CLUSTERS: &str = r#"{"cluster_statuses":[
      {"name":"svc","added_via_api":true,"host_statuses":[
        {"address":{"socket_address":{"address":"10.0.0.1","port_value":8080}},
         "stats":[{"value":"3","name":"cx_active","type":"GAUGE"},{"value":"7","name":"rq_total"},{"value":"3","name":"rq_active","type":"GAUGE"}],
         "health_status":{"eds_health_status":"HEALTHY"},"weight":1,"locality":{}},
        {"address":{"socket_address":{"address":"10.0.0.2","port_value":8080}},
         "stats":[{"name":"rq_error"},{"value":"1","name":"rq_active","type":"GAUGE"}],
         "health_status":{"eds_health_status":"DRAINING"},"weight":1,"locality":{}},
        {"address":{"socket_address":{"address":"10.0.0.2","port_value":9090}},
         "stats":[{"value":2,"name":"rq_active","type":"GAUGE"}],
         "health_status":{"eds_health_status":"HEALTHY"}},
        {"address":{"socket_address":{"address":"fd00::3","port_value":8080}},
         "stats":[{"value":"12","name":"rq_total"},{"name":"rq_active","type":"GAUGE"}],
         "health_status":{"eds_health_status":"HEALTHY"}},
        {"address":{"pipe":{"path":"/tmp/x"}},"stats":[{"value":"9","name":"rq_active","type":"GAUGE"}]}
      ]},
      {"name":"other","host_statuses":[
        {"address":{"socket_address":{"address":"::ffff:10.0.0.1","port_value":80}}}
      ]}
    ]}"#;

    fn v4(a: u8, b: u8, c: u8, d: u8) -> Ipv6Addr {
        std::net::Ipv4Addr::new(a, b, c, d).to_ipv6_mapped()
    }

    #[test]
    fn rq_active_sums_per_ip_and_an_absent_stat_reads_0() {
        let active = rq_active_by_ip(CLUSTERS.as_bytes()).unwrap();
        let fd00: Ipv6Addr = "fd00::3".parse().unwrap();
        let want: HashMap<Ipv6Addr, u32> = [(v4(10, 0, 0, 1), 3), (v4(10, 0, 0, 2), 3), (fd00, 0)]
            .into_iter()
            .collect();
        assert_eq!(
            active, want,
            "10.0.0.1 in `other` too (IPv4 mapped), with nothing in flight there"
        );
        assert_eq!(
            rq_active_by_ip(br#"{"cluster_statuses":[]}"#),
            Some(HashMap::new())
        );
    }

    #[test]
    fn rq_active_of_anything_but_a_clusters_answer_is_none() {
        let bad_value = CLUSTERS.replace(
            r#"{"value":"3","name":"rq_active""#,
            r#"{"value":"three","name":"rq_active""#,
        );
        let negative = CLUSTERS.replace(
            r#"{"value":2,"name":"rq_active""#,
            r#"{"value":-2,"name":"rq_active""#,
        );
        for bad in [
            &b""[..],
            b"{",
            b"\xff",
            b"{}",
            b"[]",
            br#"{"cluster_statuses":7}"#,
            DUMP.as_bytes(),
            bad_value.as_bytes(),
            negative.as_bytes(),
            br#"{"cluster_statuses":[{"host_statuses":[{"stats":[{"name":"rq_active","value":{}}],"address":{"socket_address":{"address":"10.0.0.1","port_value":1}}}]}]}"#,
        ] {
            assert_eq!(rq_active_by_ip(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn a_clusters_answer_with_a_cluster_not_asked_for_is_unfiltered() {
        let body = br#"{"cluster_statuses":[{"name":"svc","host_statuses":[]},{"name":"admin"}]}"#;
        let answer = AdminSource::Clusters.read(body, &["svc"]).unwrap();
        assert!(answer.unfiltered);
        assert!(answer.membership.cluster("svc").is_some());
        assert!(
            !AdminSource::Clusters
                .read(body, &["svc", "admin"])
                .unwrap()
                .unfiltered
        );
    }

    #[test]
    fn garbage_is_an_error_for_either_source() {
        for (source, wrong) in [
            (AdminSource::Clusters, &br#"{"cluster_statuses":7}"#[..]),
            (AdminSource::ConfigDump, br#"{"configs":7}"#),
            (AdminSource::ConfigDump, br#"{"cluster_statuses":[]}"#),
        ] {
            for bad in [&b""[..], b"{", b"\xff", wrong] {
                assert!(source.read(bad, &["svc"]).is_err(), "{source:?} {bad:?}");
            }
            let empty = match source {
                AdminSource::Clusters => br#"{}"#.as_slice(),
                AdminSource::ConfigDump => br#"{"configs":[{"@type":"type.googleapis.com/envoy.admin.v3.EndpointsConfigDump"}]}"#,
            };
            let empty = source.read(empty, &["svc"]).unwrap();
            assert_eq!(empty.membership, Membership::default());
            assert!(!empty.unfiltered);
        }
    }

    #[test]
    fn paths_escape_names() {
        assert_eq!(
            AdminSource::Clusters.path(&["svc"]),
            "/clusters?format=json&filter=%5E%28svc%29%24"
        );
        assert_eq!(
            admin_clusters_path(&["a.b", "c|d"]),
            "/clusters?format=json&filter=%5E%28a%5C.b%7Cc%5C%7Cd%29%24"
        );
        assert_eq!(
            AdminSource::ConfigDump.path(&["svc"]),
            "/config_dump?include_eds&mask=dynamic_endpoint_configs,static_endpoint_configs&name_regex=%5E%28svc%29%24"
        );
    }

    #[test]
    fn the_source_is_shared_and_starts_as_clusters() {
        let store = MemStore::new();
        assert_eq!(AdminSource::shared(&store), AdminSource::Clusters);
        assert!(AdminSource::ConfigDump.share(&store));
        assert_eq!(AdminSource::shared(&store), AdminSource::ConfigDump);
    }
}
