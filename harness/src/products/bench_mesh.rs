//! `make bench-mesh`: what graceful_consumer costs in a large mesh, where a
//! sidecar without `Sidecar` scoping has a cluster per service: 1,000
//! clusters of 10 endpoints each (from a CDS file, as istiod would push
//! them), three of them routed to and answering (they stand for the few
//! services an app calls; the rest are never called), beside the bench's
//! own `upstream` cluster. Measured on each Envoy given, each set in turn in
//! every round (the medians are over rounds):
//!
//! - the main thread's CPU while no request flows (Envoy's admin and every
//!   wasm root context run there): the membership refresh's cost, per
//!   second and per refresh (the admin's requests counted by its
//!   `http.admin.downstream_rq_total`);
//! - the proxy's resident size after the refreshes (the wasm VMs and what
//!   they hold);
//! - the latency of the admin request the refresh makes, from outside over
//!   one connection (both sources: `/clusters` filtered and the config
//!   dump, see `graceful_core::consumer::steering::admin`);
//! - CPU per request at saturation through the `upstream` cluster, with no
//!   tombstone and with 100 live ones.

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};

use super::bench::{
    dead_hosts, filter_sets, median, prepare_proxy_within, proxy_spec, round_order, routes, wrk,
    wrk_with_cpu, FilterSet, Paired, WrkResult,
};
use crate::support::client;
use crate::support::envoy::{refusing_port, wait_for, Envoy, START_DEADLINE};
use crate::support::procfs::{rss_kb, thread_cpu_us};
use graceful_core::consumer::steering::AdminSource;

/// Clusters in the mesh, and endpoints in each.
pub const MESH_CLUSTERS: usize = 1000;
pub const ENDPOINTS_PER_CLUSTER: usize = 10;
/// Mesh clusters routed to (`/svc0`, `/svc1`, ...).
pub const ROUTED: usize = 3;
/// How long the idle window lasts.
const IDLE: Duration = Duration::from_secs(20);
/// wrk's connections at saturation.
const CONNECTIONS: u32 = 16;

/// The mesh cluster `i`'s name, as Istio names an outbound cluster.
pub fn mesh_cluster(i: usize) -> String {
    format!("outbound|80||svc{i}.default.svc.cluster.local")
}

/// Writes the CDS file: the routed clusters' endpoints are `upstream`, the
/// others' addresses nothing is asked of.
pub fn write_cds(dir: &Path, upstream: &[SocketAddr]) -> PathBuf {
    let resources: Vec<Value> = (0..MESH_CLUSTERS)
        .map(|c| {
            let endpoints: Vec<Value> = (0..ENDPOINTS_PER_CLUSTER)
                .map(|e| {
                    let (ip, port) = if c < ROUTED {
                        let a = upstream[e % upstream.len()];
                        (a.ip().to_string(), a.port())
                    } else {
                        (format!("10.{}.{}.{}", 1 + c / 250, c % 250, e + 1), 8080)
                    };
                    json!({"endpoint": {"address": {"socket_address": {"address": ip, "port_value": port}}}})
                })
                .collect();
            let name = mesh_cluster(c);
            json!({
                "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
                "name": name,
                "type": "STATIC",
                "connect_timeout": "1s",
                "lb_policy": "LEAST_REQUEST",
                "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": endpoints}]},
            })
        })
        .collect();
    let path = dir.join("cds.json");
    let body = json!({"version_info": "1", "resources": resources});
    fs::write(&path, body.to_string()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    path
}

/// The sets measured: plain Envoy, the consumer (with `admin_cluster`),
/// and the consumer with 100 live tombstones.
pub fn mesh_sets() -> Vec<FilterSet> {
    filter_sets()
        .into_iter()
        .filter(|s| ["none", "consumer", "consumer_100_tombstones"].contains(&s.name))
        .collect()
}

/// One set on one Envoy, one round.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MeshRound {
    /// Main-thread CPU while idle, ms per second.
    pub main_ms_per_s: f64,
    /// Admin requests per second while idle (the refreshes).
    pub admin_rq_per_s: f64,
    pub rss_kb: u64,
    pub cpu_us_per_request: f64,
    pub rps: f64,
}

/// A set's medians over rounds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MeshResult {
    pub set: String,
    pub main_ms_per_s: f64,
    pub admin_rq_per_s: f64,
    pub rss_kb: f64,
    pub cpu_us_per_request: f64,
    pub rps: f64,
    pub rounds: Vec<MeshRound>,
}

/// The admin request's latency from outside, both sources.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AdminLatency {
    pub clusters_bytes: usize,
    pub clusters_ms: f64,
    pub config_dump_bytes: usize,
    pub config_dump_ms: f64,
}

/// Everything measured on one Envoy.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MeshEnvoy {
    pub envoy: String,
    pub sets: Vec<MeshResult>,
    pub admin: AdminLatency,
    /// The per-request cost, set against set round by round
    /// ([`mesh_paired`]); empty when no paired rounds were asked for.
    pub paired: Vec<Paired>,
    /// Each set's paired rounds, which `paired` differences.
    pub paired_rounds: Vec<SetRounds>,
}

/// One set's wrk runs of the paired rounds, in order.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SetRounds {
    pub set: String,
    pub rounds: Vec<WrkResult>,
}

/// The routes: `/svcN` to mesh cluster N, then the bench's own.
fn mesh_routes() -> Value {
    let mut list: Vec<Value> = (0..ROUTED)
        .map(|i| json!({"match": {"prefix": format!("/svc{i}")}, "route": {"cluster": mesh_cluster(i)}}))
        .collect();
    if let Value::Array(rest) = routes() {
        list.extend(rest);
    }
    Value::Array(list)
}

/// A stat of the proxy, 0 if absent.
async fn stat(envoy: &Envoy, name: &str) -> u64 {
    envoy.stat(name).await.unwrap_or(0)
}

/// Starts `set` on `binary` with the mesh and warms it: every mesh
/// cluster in, every routed cluster answered (so the consumer refreshes
/// their membership), the set's tombstones made. `deadline` bounds the
/// start and the clusters' arrival each (longer under callgrind).
pub async fn start_mesh_proxy(
    binary: &Path,
    set: &FilterSet,
    cds: &Path,
    upstream: &[SocketAddr],
    deadline: Duration,
) -> Result<(Envoy, SocketAddr), String> {
    let dead = dead_hosts(set.tombstones, refusing_port());
    let mut spec = proxy_spec(set, upstream, &dead)
        .set("ROUTES", mesh_routes())
        .set("VALIDATE_CLUSTERS", false)
        .set(
            "DYNAMIC_RESOURCES",
            json!({"cds_config": {"resource_api_version": "V3", "path_config_source": {"path": cds.display().to_string()}}}),
        );
    spec.binary = Some(binary.to_path_buf());
    spec.start_deadline = deadline;
    let envoy = spec.start().await;
    // Every mesh cluster is in: CDS lands after the listener may be ready.
    wait_for(
        &format!("{}: the mesh's {MESH_CLUSTERS} clusters", set.name),
        deadline,
        || async {
            (stat(&envoy, "cluster_manager.active_clusters").await >= MESH_CLUSTERS as u64)
                .then_some(())
        },
    )
    .await?;
    let (envoy, addr) = prepare_proxy_within(envoy, set, deadline).await;
    let mut conn = client::Conn::http1(addr).await?;
    for _ in 0..4 {
        for i in 0..ROUTED {
            let r = conn.get(&format!("/svc{i}")).await?;
            if r.status != 200 {
                return Err(format!("/svc{i} answered {}", r.status));
            }
        }
    }
    Ok((envoy, addr))
}

/// Starts `set` on `binary` with the mesh ([`start_mesh_proxy`]) and
/// measures one round.
pub async fn mesh_round(
    binary: &Path,
    set: &FilterSet,
    cds: &Path,
    upstream: &[SocketAddr],
    duration: Duration,
) -> Result<(MeshRound, Envoy, SocketAddr), String> {
    let (envoy, addr) = start_mesh_proxy(binary, set, cds, upstream, START_DEADLINE).await?;
    // Two refreshes since the clusters were registered.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let pid = envoy.pid();
    let admin_before = stat(&envoy, "http.admin.downstream_rq_total").await;
    let cpu_before = thread_cpu_us(pid, pid);
    let started = Instant::now();
    tokio::time::sleep(IDLE).await;
    let cpu_after = thread_cpu_us(pid, pid);
    let seconds = started.elapsed().as_secs_f64();
    // Less the two stat reads of this window.
    let admin_rq = stat(&envoy, "http.admin.downstream_rq_total")
        .await
        .saturating_sub(admin_before)
        .saturating_sub(2);
    let rss = rss_kb(pid);
    wrk(addr, CONNECTIONS, Duration::from_secs(2))?;
    let r = wrk_with_cpu(pid, addr, CONNECTIONS, duration)?;
    if r.non_2xx > 0 {
        return Err(format!(
            "{}: {} requests answered other than 2xx",
            set.name, r.non_2xx
        ));
    }
    Ok((
        MeshRound {
            main_ms_per_s: cpu_after.saturating_sub(cpu_before) as f64 / 1000.0 / seconds,
            admin_rq_per_s: admin_rq as f64 / seconds,
            rss_kb: rss,
            cpu_us_per_request: r.cpu_us_per_request,
            rps: r.rps,
        },
        envoy,
        addr,
    ))
}

/// The refresh's admin request for the routed clusters and `upstream`,
/// timed from outside: 20 in a row over one connection, the median.
pub async fn admin_latency(envoy: &Envoy) -> Result<AdminLatency, String> {
    let mut names: Vec<String> = (0..ROUTED).map(mesh_cluster).collect();
    names.push("upstream".into());
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut out = AdminLatency::default();
    let mut conn = client::Conn::http1(envoy.admin).await?;
    for source in [AdminSource::Clusters, AdminSource::ConfigDump] {
        let path = source.path(&names);
        let mut times = Vec::new();
        let mut bytes = 0;
        for _ in 0..20 {
            let t = Instant::now();
            let r = conn.get(&path).await?;
            times.push(t.elapsed().as_secs_f64() * 1000.0);
            let members = source.read(&r.body, &names).map_err(|e| {
                format!(
                    "{path}: {e}: {} {:?}",
                    r.status,
                    r.text().chars().take(300).collect::<String>()
                )
            })?;
            for name in &names {
                if members
                    .membership
                    .cluster(name)
                    .is_none_or(|m| m.is_empty())
                {
                    return Err(format!("{path}: no members of {name} in {}", r.text()));
                }
            }
            bytes = r.body.len();
        }
        let ms = median(times.into_iter());
        match source {
            AdminSource::Clusters => (out.clusters_bytes, out.clusters_ms) = (bytes, ms),
            AdminSource::ConfigDump => (out.config_dump_bytes, out.config_dump_ms) = (bytes, ms),
        }
    }
    Ok(out)
}

/// Medians over `rounds` of one set.
pub fn mesh_result(set: &str, rounds: Vec<MeshRound>) -> MeshResult {
    MeshResult {
        set: set.into(),
        main_ms_per_s: median(rounds.iter().map(|r| r.main_ms_per_s)),
        admin_rq_per_s: median(rounds.iter().map(|r| r.admin_rq_per_s)),
        rss_kb: median(rounds.iter().map(|r| r.rss_kb as f64)),
        cpu_us_per_request: median(rounds.iter().map(|r| r.cpu_us_per_request)),
        rps: median(rounds.iter().map(|r| r.rps)),
        rounds,
    }
}

/// One proxy of the paired rounds: `set` in the mesh, or (to tell what the
/// mesh adds from what this host's speed that hour does) the same set with
/// the bench's cluster only, as `make bench` runs it.
#[derive(Debug, Clone)]
pub struct PairedProxy {
    pub label: String,
    pub set: FilterSet,
    pub in_mesh: bool,
}

/// The proxies of the paired rounds: [`mesh_sets`] in the mesh, then the
/// consumer with and without tombstones on the bench's cluster only
/// (labelled `..., no mesh`).
pub fn paired_proxies() -> Vec<PairedProxy> {
    let sets = mesh_sets();
    let in_mesh = sets.iter().map(|s| PairedProxy {
        label: s.name.to_string(),
        set: s.clone(),
        in_mesh: true,
    });
    let no_mesh = sets
        .iter()
        .filter(|s| s.name != "none")
        .map(|s| PairedProxy {
            label: format!("{}, no mesh", s.name),
            set: s.clone(),
            in_mesh: false,
        });
    in_mesh.chain(no_mesh).collect()
}

/// The per-request cost at mesh scale, paired: every proxy started once
/// and kept up side by side, then in each of `rounds` rounds each saturated
/// in turn (the order reversed every other round) for a warm-up second and
/// `duration` measured. The rounds' differences are taken a few seconds
/// apart, so a host whose speed drifts over minutes (as this one's plain
/// Envoy did, by 66 µs per request between the minors of one run) moves
/// both sides of a difference alike; the medians of those differences are
/// what can resolve a few µs. Returns each proxy's rounds, in `proxies`'
/// order.
pub async fn mesh_paired(
    binary: &Path,
    proxies: &[PairedProxy],
    cds: &Path,
    upstream: &[SocketAddr],
    rounds: usize,
    duration: Duration,
) -> Result<Vec<Vec<WrkResult>>, String> {
    let mut started = Vec::new();
    for p in proxies {
        started.push(if p.in_mesh {
            start_mesh_proxy(binary, &p.set, cds, upstream, START_DEADLINE).await?
        } else {
            let dead = dead_hosts(p.set.tombstones, refusing_port());
            let mut spec = proxy_spec(&p.set, upstream, &dead);
            spec.binary = Some(binary.to_path_buf());
            let envoy = spec.start().await;
            prepare_proxy_within(envoy, &p.set, START_DEADLINE).await
        });
    }
    let mut by_proxy: Vec<Vec<WrkResult>> = vec![Vec::new(); proxies.len()];
    for round in 0..rounds {
        for i in round_order(round, proxies.len()) {
            let (envoy, addr) = &started[i];
            wrk(*addr, CONNECTIONS, Duration::from_secs(1))?;
            let r = wrk_with_cpu(envoy.pid(), *addr, CONNECTIONS, duration)?;
            if r.non_2xx > 0 || r.requests == 0 {
                return Err(format!(
                    "{} paired round {}: {} requests, {} other than 2xx",
                    proxies[i].label,
                    round + 1,
                    r.requests,
                    r.non_2xx
                ));
            }
            by_proxy[i].push(r);
        }
    }
    Ok(by_proxy)
}

/// The pairs a mesh run reports: the consumer over plain Envoy, and 100
/// live tombstones over the ordinary consumer, in the mesh and on the
/// bench's cluster only.
pub const MESH_PAIRS: [(&str, &str); 3] = [
    ("consumer", "none"),
    ("consumer_100_tombstones", "consumer"),
    ("consumer_100_tombstones, no mesh", "consumer, no mesh"),
];

/// The [`Paired`] differences of [`MESH_PAIRS`] from `mesh_paired`'s rounds.
pub fn mesh_pairs(proxies: &[PairedProxy], by_proxy: &[Vec<WrkResult>]) -> Vec<Paired> {
    let rounds_of = |label: &str| {
        proxies
            .iter()
            .position(|p| p.label == label)
            .and_then(|i| by_proxy.get(i))
            .map_or(&[][..], Vec::as_slice)
    };
    MESH_PAIRS
        .iter()
        .filter_map(|(a, b)| Paired::new(a, rounds_of(a), b, rounds_of(b)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rounds(cpu: &[f64]) -> Vec<WrkResult> {
        cpu.iter()
            .map(|&c| WrkResult {
                cpu_us_per_request: c,
                requests: 1,
                ..WrkResult::default()
            })
            .collect()
    }

    #[test]
    fn pairs_each_round_with_the_same_rounds_set_it_is_measured_against() {
        let sets = paired_proxies();
        let labels: Vec<&str> = sets.iter().map(|p| p.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "none",
                "consumer",
                "consumer_100_tombstones",
                "consumer, no mesh",
                "consumer_100_tombstones, no mesh"
            ]
        );
        assert_eq!(
            sets.iter().map(|p| p.in_mesh).collect::<Vec<_>>(),
            [true, true, true, false, false]
        );
        // The host slowed by 50 µs in round 2: a median of each set's own
        // rounds would say nothing; the rounds' differences stay put.
        let by_set = vec![
            rounds(&[40.0, 90.0, 41.0]),
            rounds(&[50.0, 100.0, 52.0]),
            rounds(&[53.0, 104.0, 54.0]),
            rounds(&[45.0, 95.0, 47.0]),
            rounds(&[46.0, 97.0, 48.0]),
        ];
        let pairs = mesh_pairs(&sets, &by_set);
        assert_eq!(pairs.len(), 3);
        assert_eq!(
            (pairs[0].set.as_str(), pairs[0].against.as_str()),
            ("consumer", "none")
        );
        assert_eq!(pairs[0].cpu_us_added_median, 10.0);
        assert_eq!(
            (pairs[1].set.as_str(), pairs[1].against.as_str()),
            ("consumer_100_tombstones", "consumer")
        );
        assert_eq!(pairs[1].cpu_us_added_per_round, [3.0, 4.0, 2.0]);
        assert_eq!(pairs[1].cpu_us_added_median, 3.0);
        assert_eq!(pairs[2].set, "consumer_100_tombstones, no mesh");
        assert_eq!(pairs[2].cpu_us_added_per_round, [1.0, 2.0, 1.0]);
    }

    #[test]
    fn pairs_nothing_where_a_set_was_not_measured_or_rounds_differ() {
        let sets = paired_proxies();
        assert!(mesh_pairs(&sets, &[]).is_empty());
        let uneven = vec![rounds(&[1.0]), rounds(&[2.0, 3.0]), rounds(&[4.0, 5.0])];
        let pairs = mesh_pairs(&sets, &uneven);
        assert_eq!(
            pairs.len(),
            1,
            "only the tombstones against the consumer pair up"
        );
        assert_eq!(pairs[0].cpu_us_added_median, 2.0);
    }
}
