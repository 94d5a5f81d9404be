//! `make demo`'s `behind_gateway` scenarios: backends with no sidecar
//! behind two front replicas (`envoy/front-proxy.yaml`, as an Envoy
//! Gateway's proxy or an edge Envoy runs), under load through both.
//!
//! Topology, all on this machine: two loads → two fronts (127.0.0.1, their
//! config over one delta ADS stream each from `tools/xds_server.py`, a
//! stand-in speaking Envoy Gateway's protocol, not Envoy Gateway) → demo
//! apps on 127.0.0.21, .22, ... (a pod's own address each, no sidecar).
//! The stand-in registry pushes each endpoint change as Envoy Gateway does,
//! `registry_lag` after the pod's change: a new pod `HEALTHY` once ready, a
//! terminating one `DRAINING` (`getIREndpointsFromEndpointSlice`), a gone
//! one removed.
//!
//! | step | rolling restart (`behind_gateway`) | scale-down 3 → 1 (`behind_gateway_scale_down`) |
//! |---|---|---|
//! | surge | a new backend on a new address, pushed `HEALTHY` | none |
//! | terminating | the old one, pushed `DRAINING` after the lag; its preStop runs | two at once, each as on the left |
//! | preStop | by approach, below | same |
//! | then | SIGTERM to the app (it finishes what it has in flight, at most 10 s), removed after the lag | same |
//!
//! | approach | fronts | the backend's preStop |
//! |---|---|---|
//! | `graceful` | the filters | `graceful-hook front` to both fronts' control listeners: returns once both acknowledged |
//! | `no_hook` | the filters | none: the fronts learn from the `DRAINING` push only |
//! | `sleep_5s`, `sleep_15s` | plain Envoy | a fixed sleep |
//! | `draining_only` | plain Envoy | none: Envoy Gateway's `DRAINING` push is all there is |
//!
//! Every request's start, end and backend come from the fronts' access logs.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use serde_json::{json, Value};

use super::{port_free_on, spawn_demo_app, unix_ms, DemoConfig, Mode};
use crate::support::envoy::{eventually, load_assignment, terminate, Envoy, EnvoySpec};
use crate::support::load::{Load, Sample};
use crate::support::run_report::{ProviderEvents, RunReport};
use crate::support::upstream::hook_binary;
use crate::support::xds::{self, AdsConfig, XdsServer};

/// The fronts' template (`envoy/`).
const TEMPLATE: &str = "front-proxy.yaml";
/// The cluster the fronts balance over.
const CLUSTER: &str = "backends";
/// Front replicas.
const FRONTS: usize = 2;
/// The hook's own deadline, as the shipped examples set it.
const HOOK_WAIT: &str = "25s";

/// One backend: a demo app on an address of its own.
struct Backend {
    /// 1-based; the app answers `x-served-by: p<index>`.
    index: usize,
    addr: SocketAddr,
    app: Option<Child>,
}

/// The registry stand-in: every endpoint with its EDS health, each change
/// pushed `lag` after it was asked for.
#[derive(Clone)]
struct Registry {
    xds: Arc<Mutex<XdsServer>>,
    /// Each front's own listeners and clusters, by node id.
    nodes: Value,
    endpoints: Arc<Mutex<Vec<(SocketAddr, &'static str)>>>,
    lag: Duration,
}

impl Registry {
    fn push(&self, endpoints: &[(SocketAddr, &'static str)]) {
        let resources =
            json!({xds::ENDPOINTS: [load_assignment(CLUSTER, &[(0, "", endpoints.to_vec())])]});
        if let Ok(mut xds) = self.xds.lock() {
            xds.push_with_nodes(&resources, &self.nodes);
        }
    }

    /// After the lag: `addr` listed with `health`, or removed (None).
    fn later(&self, addr: SocketAddr, health: Option<&'static str>) {
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(me.lag).await;
            let Ok(mut endpoints) = me.endpoints.lock() else {
                return;
            };
            endpoints.retain(|(a, _)| *a != addr);
            if let Some(health) = health {
                endpoints.push((addr, health));
                endpoints.sort();
            }
            me.push(&endpoints);
        });
    }
}

/// One front replica.
struct Front {
    envoy: Envoy,
    public: SocketAddr,
    control: SocketAddr,
    access_log: PathBuf,
}

/// A request as a front's access log has it: start and end in unix ms, the
/// backend of its last attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Logged {
    pub start_ms: u64,
    pub end_ms: u64,
    pub upstream: Option<SocketAddr>,
}

/// One line of the fronts' public access log format:
/// `START(s.ms) CODE FLAGS UPSTREAM attempts=N override=H PATH DURATION`.
pub fn logged_line(line: &str) -> Option<Logged> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let start: f64 = fields.first()?.parse().ok()?;
    let duration: u64 = fields.last()?.parse().ok()?;
    let start_ms = (start * 1000.0).round() as u64;
    Some(Logged {
        start_ms,
        end_ms: start_ms + duration,
        upstream: fields.get(3).and_then(|h| h.parse().ok()),
    })
}

fn logged(paths: &[PathBuf]) -> Vec<Logged> {
    paths
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .flat_map(|text| text.lines().filter_map(logged_line).collect::<Vec<_>>())
        .collect()
}

struct Run<'a> {
    config: &'a DemoConfig,
    mode: Mode,
    dir: PathBuf,
    epoch: Instant,
    epoch_unix_ms: u64,
    port: u16,
}

impl Run<'_> {
    fn ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(0)
    }

    fn start_backend(&self, index: usize) -> Backend {
        let addr = SocketAddr::from((Ipv4Addr::new(127, 0, 0, 20 + index as u8), self.port));
        let app = spawn_demo_app(
            &self.dir.join(format!("app-p{index}.log")),
            addr,
            &format!("p{index}"),
            self.config.app_latency,
        );
        Backend {
            index,
            addr,
            app: Some(app),
        }
    }

    /// The front config as Envoy Gateway would send it, with the filters
    /// or without (plain Envoy: every graceful filter taken out).
    fn front_ads(&self, spec: &EnvoySpec, node: &str, xds_port: u16) -> AdsConfig {
        let mut bootstrap: Value = serde_yaml::from_str(&spec.rendered())
            .unwrap_or_else(|e| panic!("rendered {TEMPLATE}: {e}"));
        if !self.mode.graceful() {
            strip_graceful_filters(&mut bootstrap);
        }
        // No filter over ECDS: both listeners name their graceful_consumer
        // alike, with different configs (Envoy Gateway sends them inline).
        let mut ads = AdsConfig::split_to(
            bootstrap,
            node,
            SocketAddr::from((Ipv4Addr::LOCALHOST, xds_port)),
            &[],
        );
        ads.delta_through("xds_cluster");
        ads
    }

    async fn start_fronts(&self, backends: &[Backend]) -> (Vec<Front>, Registry) {
        let name = self.mode.name();
        let xds = XdsServer::start(&format!("{name}-fronts-{}", std::process::id())).await;
        let mut nodes = json!({});
        let mut specs = Vec::new();
        for i in 1..=FRONTS {
            let access_log = self.dir.join(format!("access-front{i}.log"));
            let spec = EnvoySpec::new(&format!("{name}-front{i}"), TEMPLATE)
                .set("NODE_ID", format!("front{i}"))
                .set("LISTEN_ADDRESS", "127.0.0.1")
                .set("PUBLIC_PORT", 0)
                .set("CONTROL_ADDRESS", "0.0.0.0")
                .set("CONTROL_PORT", 0)
                .set("ACCESS_LOG", access_log.display());
            let node = format!("front{i}");
            let ads = self.front_ads(&spec, &node, xds.port);
            // Each replica its own listeners (their access logs differ).
            nodes[node] = ads.resources();
            specs.push((ads.spec(spec), access_log));
        }
        let endpoints: Vec<(SocketAddr, &'static str)> =
            backends.iter().map(|b| (b.addr, "HEALTHY")).collect();
        let registry = Registry {
            xds: Arc::new(Mutex::new(xds)),
            nodes,
            endpoints: Arc::new(Mutex::new(endpoints.clone())),
            lag: self.config.registry_lag,
        };
        registry.push(&endpoints);
        let mut fronts = Vec::new();
        for (spec, access_log) in specs {
            let envoy = spec.start().await;
            fronts.push(Front {
                public: envoy.listener("public").await,
                control: envoy.listener("front_control").await,
                envoy,
                access_log,
            });
        }
        for f in &fronts {
            wait_healthy(f, backends.len() as u64).await;
        }
        (fronts, registry)
    }

    /// Backend `b` leaves as the approach says; the moments of it.
    async fn shut_down(&self, b: &mut Backend, fronts: &[Front], registry: &Registry) -> Leaving {
        let mut ev = ProviderEvents {
            provider: b.index,
            ..Default::default()
        };
        ev.closing_ms = self.ms();
        // The kubelet marks the endpoint terminating as the preStop starts;
        // Envoy Gateway pushes it DRAINING.
        registry.later(b.addr, Some("DRAINING"));
        let mut summary = None;
        match self.mode {
            Mode::FrontHook => {
                let out = run_front_hook(fronts, b.addr.ip()).await;
                summary = Some(out);
            }
            Mode::FrontSleep => tokio::time::sleep(self.config.baseline_sleep).await,
            _ => {}
        }
        ev.drained_ms = self.ms();
        if let Some(mut app) = b.app.take() {
            terminate(&mut app, Duration::from_secs(15)).await;
        }
        ev.down_ms = self.ms();
        registry.later(b.addr, None);
        Leaving {
            ev,
            addr: b.addr,
            hook_summary: summary,
        }
    }
}

/// A backend's shutdown as measured.
struct Leaving {
    ev: ProviderEvents,
    addr: SocketAddr,
    hook_summary: Option<String>,
}

/// Takes every graceful filter out of a front config: plain Envoy.
fn strip_graceful_filters(config: &mut Value) {
    fn strip(filters: &mut Value) {
        if let Some(list) = filters.as_array_mut() {
            list.retain(|f| {
                !f["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("graceful"))
            });
        }
    }
    for listener in config["static_resources"]["listeners"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        for chain in listener["filter_chains"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            for filter in chain["filters"].as_array_mut().into_iter().flatten() {
                strip(&mut filter["typed_config"]["http_filters"]);
            }
        }
    }
    for cluster in config["static_resources"]["clusters"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        // get_mut: indexing a missing key would insert it.
        if let Some(filters) = cluster
            .get_mut("typed_extension_protocol_options")
            .and_then(|o| o.get_mut("envoy.extensions.upstreams.http.v3.HttpProtocolOptions"))
            .and_then(|o| o.get_mut("http_filters"))
        {
            strip(filters);
        }
    }
}

/// Waits until a front has `n` healthy members in `backends`.
async fn wait_healthy(front: &Front, n: u64) {
    let stat = format!("cluster.{CLUSTER}.membership_healthy");
    eventually(
        &format!("{}: {n} healthy in {CLUSTER}", front.envoy.name),
        Duration::from_secs(20),
        || async { (front.envoy.stat(&stat).await == Some(n)).then_some(()) },
    )
    .await;
}

/// Waits until a front has `n` members in `backends`.
async fn wait_total(front: &Front, n: u64, deadline: Duration) {
    let stat = format!("cluster.{CLUSTER}.membership_total");
    eventually(
        &format!("{}: {n} members in {CLUSTER}", front.envoy.name),
        deadline,
        || async { (front.envoy.stat(&stat).await == Some(n)).then_some(()) },
    )
    .await;
}

/// `graceful-hook front` as the backend at `ip` runs it in its preStop;
/// its one-line summary.
async fn run_front_hook(fronts: &[Front], ip: IpAddr) -> String {
    let mut args = vec!["front".to_string()];
    for f in fronts {
        // The control listener is bound on every address: the hook reaches
        // it from the backend's own.
        args.push("--front".into());
        args.push(format!("http://{ip}:{}", f.control.port()));
    }
    args.extend([
        "--source".into(),
        ip.to_string(),
        "--wait".into(),
        HOOK_WAIT.into(),
    ]);
    let out = tokio::process::Command::new(hook_binary())
        .args(&args)
        .output()
        .await
        .unwrap_or_else(|e| {
            panic!("graceful-hook front: {e}: build it with `cargo build -p graceful-hook`")
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .find(|l| l.starts_with("graceful-hook front:"))
        .unwrap_or(text.trim())
        .to_string()
}

/// What the fronts' logs say of one backend's shutdown: requests that
/// reached it after its closing, those started after its preStop returned
/// (the acknowledgement, with the hook), and when its last request ended.
fn note_requests(
    ev: &mut ProviderEvents,
    addr: SocketAddr,
    requests: &[Logged],
    epoch_unix_ms: u64,
) {
    let closing = epoch_unix_ms + ev.closing_ms;
    let acknowledged = epoch_unix_ms + ev.drained_ms;
    let at: Vec<&Logged> = requests
        .iter()
        .filter(|r| r.upstream == Some(addr))
        .collect();
    ev.after_closing = at.iter().filter(|r| r.start_ms >= closing).count() as u64;
    ev.seen_ms = ev.closing_ms;
    ev.started_after_seen = Some(at.iter().filter(|r| r.start_ms > acknowledged).count() as u64);
    ev.last_request_end_ms = at
        .iter()
        .map(|r| r.end_ms.saturating_sub(epoch_unix_ms))
        .max();
}

/// The shutdowns: a rolling restart with a surge, or `scale_down_by` at once.
async fn shut_downs(
    r: &Run<'_>,
    backends: &mut Vec<Backend>,
    fronts: &[Front],
    registry: &Registry,
) -> Vec<Leaving> {
    let config = r.config;
    if config.scale_down_by > 0 {
        let leaving = backends.iter_mut().take(config.scale_down_by);
        let out = join_all(leaving.map(|b| r.shut_down(b, fronts, registry))).await;
        let left = (config.providers - config.scale_down_by) as u64;
        for f in fronts {
            wait_total(f, left, config.registry_lag + Duration::from_secs(30)).await;
        }
        return out;
    }
    let mut out = Vec::new();
    for i in 0..config.restarts {
        // Surge: the new pod first, on an address of its own.
        let new = r.start_backend(backends.len() + 1);
        wait_serving(new.addr).await;
        registry.later(new.addr, Some("HEALTHY"));
        let live = backends.iter().filter(|b| b.app.is_some()).count() as u64 + 1;
        backends.push(new);
        for f in fronts {
            wait_healthy(f, live).await;
        }
        let old = backends
            .iter_mut()
            .find(|b| b.app.is_some())
            .unwrap_or_else(|| panic!("restart {i}: no backend left"));
        out.push(r.shut_down(old, fronts, registry).await);
        tokio::time::sleep(config.registry_lag + config.settle).await;
    }
    out
}

/// Polls a new backend until it answers.
async fn wait_serving(addr: SocketAddr) {
    eventually(
        &format!("backend {addr} serving"),
        Duration::from_secs(20),
        || async {
            crate::support::client::get(addr, "/")
                .await
                .ok()
                .map(|_| ())
        },
    )
    .await;
}

/// Runs one `behind_gateway` cell and reports it, with the samples.
pub async fn run(config: &DemoConfig, mode: Mode) -> (RunReport, Vec<Sample>) {
    let dir = config
        .work_dir
        .join(format!("{}-{}", mode.name(), std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let pool: Vec<Ipv4Addr> = (21..=21 + (config.providers + config.restarts) as u8)
        .map(|i| Ipv4Addr::new(127, 0, 0, i))
        .collect();
    let mut r = Run {
        config,
        mode,
        dir,
        epoch: Instant::now(),
        epoch_unix_ms: unix_ms(),
        port: port_free_on(&pool),
    };
    let mut backends: Vec<Backend> = (1..=config.providers).map(|i| r.start_backend(i)).collect();
    for b in &backends {
        wait_serving(b.addr).await;
    }
    let (fronts, registry) = r.start_fronts(&backends).await;

    r.epoch = Instant::now();
    r.epoch_unix_ms = unix_ms();
    let per_front = (config.rate / FRONTS as u32).max(1);
    let loads: Vec<Load> = fronts
        .iter()
        .map(|f| {
            Load::start_shaped(
                f.public,
                config.protocol,
                per_front,
                (config.connections / FRONTS).max(1),
                r.epoch,
                config.shape,
            )
        })
        .collect();
    tokio::time::sleep(config.warmup).await;
    let leaving = shut_downs(&r, &mut backends, &fronts, &registry).await;
    tokio::time::sleep(config.tail).await;
    let mut samples: Vec<Sample> = join_all(loads.into_iter().map(Load::stop))
        .await
        .into_iter()
        .flatten()
        .collect();
    samples.sort_by_key(|s| s.due_ms);
    let duration_ms = r.ms();
    let mut retries = 0;
    for f in &fronts {
        retries += f
            .envoy
            .stat(&format!("cluster.{CLUSTER}.upstream_rq_retry"))
            .await
            .unwrap_or(0);
    }
    let logs: Vec<PathBuf> = fronts.iter().map(|f| f.access_log.clone()).collect();
    drop(fronts);
    let requests = logged(&logs);
    let events = leaving
        .into_iter()
        .map(|mut l| {
            note_requests(&mut l.ev, l.addr, &requests, r.epoch_unix_ms);
            let ev = &l.ev;
            println!(
                "  p{}: closing at {} ms, preStop returned at {} ms, last request ended at {} ms, {} started after the preStop returned{}",
                ev.provider,
                ev.closing_ms,
                ev.drained_ms,
                ev.last_request_end_ms.map_or("-".into(), |t| t.to_string()),
                ev.started_after_seen.unwrap_or(0),
                l.hook_summary.as_ref().map_or(String::new(), |s| format!("; {s}"))
            );
            l.ev
        })
        .collect();
    for b in &mut backends {
        if let Some(mut app) = b.app.take() {
            let _ = app.kill();
            let _ = app.wait();
        }
    }
    let report = RunReport::new(
        &samples,
        events,
        retries,
        config.protocol,
        config.rate,
        duration_ms,
    );
    (report, samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_public_access_log_line_is_read() {
        let line = "1765000000.250 200 - 127.0.0.22:4000 attempts=1 override=- /x 12";
        assert_eq!(
            logged_line(line),
            Some(Logged {
                start_ms: 1_765_000_000_250,
                end_ms: 1_765_000_000_262,
                upstream: Some("127.0.0.22:4000".parse().unwrap()),
            })
        );
        let local = "1765000000.250 503 UH - attempts=1 override=- /x 0";
        assert_eq!(logged_line(local).and_then(|l| l.upstream), None);
        assert_eq!(logged_line("garbage"), None);
    }

    #[test]
    fn plain_fronts_keep_no_graceful_filter() {
        let mut config = json!({"static_resources": {
            "listeners": [{"filter_chains": [{"filters": [{"typed_config": {"http_filters": [
                {"name": "graceful_consumer"}, {"name": "envoy.filters.http.router"}]}}]}]}],
            "clusters": [{"name": "admin"}, {"typed_extension_protocol_options": {
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {"http_filters": [
                    {"name": "graceful_consumer_upstream"}, {"name": "envoy.filters.http.upstream_codec"}]}}}]
        }});
        strip_graceful_filters(&mut config);
        let text = config.to_string();
        assert!(!text.contains("graceful"), "{text}");
        assert!(
            text.contains("router") && text.contains("upstream_codec"),
            "{text}"
        );
        assert_eq!(
            config["static_resources"]["clusters"][0],
            json!({"name": "admin"})
        );
    }
}
