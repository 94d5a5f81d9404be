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
//!   dump, see `graceful_core::steering::admin`);
//! - CPU per request at saturation through the `upstream` cluster, with no
//!   tombstone and with 100 live ones.

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};

use super::bench::{
    dead_hosts, filter_sets, median, prepare_proxy, proxy_spec, routes, wrk, wrk_with_cpu,
    FilterSet,
};
use crate::support::client;
use crate::support::envoy::{free_port, wait_for, Envoy};
use crate::support::procfs::{rss_kb, thread_cpu_us};
use graceful_core::steering::AdminSource;

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

/// Starts `set` on `binary` with the mesh, warms it (every routed cluster
/// answered, so the consumer refreshes them), and measures one round.
pub async fn mesh_round(
    binary: &Path,
    set: &FilterSet,
    cds: &Path,
    upstream: &[SocketAddr],
    duration: Duration,
) -> Result<(MeshRound, Envoy, SocketAddr), String> {
    let dead = dead_hosts(set.tombstones, free_port());
    let (spec, addr) = proxy_spec(set, upstream, &dead);
    let mut spec = spec
        .set("ROUTES", mesh_routes())
        .set("VALIDATE_CLUSTERS", false)
        .set(
            "DYNAMIC_RESOURCES",
            json!({"cds_config": {"resource_api_version": "V3", "path_config_source": {"path": cds.display().to_string()}}}),
        );
    spec.binary = Some(binary.to_path_buf());
    let envoy = spec.start().await;
    // Every mesh cluster is in: CDS lands after the listener may be ready.
    wait_for(
        &format!("{}: the mesh's {MESH_CLUSTERS} clusters", set.name),
        Duration::from_secs(60),
        || async {
            (stat(&envoy, "cluster_manager.active_clusters").await >= MESH_CLUSTERS as u64)
                .then_some(())
        },
    )
    .await?;
    let (envoy, addr) = prepare_proxy(envoy, addr, set).await;
    let mut conn = client::Conn::http1(addr).await?;
    for _ in 0..4 {
        for i in 0..ROUTED {
            let r = conn.get(&format!("/svc{i}")).await?;
            if r.status != 200 {
                return Err(format!("/svc{i} answered {}", r.status));
            }
        }
    }
    drop(conn);
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
