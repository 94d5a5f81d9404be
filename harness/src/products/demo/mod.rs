//! The main job: a rolling shutdown of providers under load (or a
//! scale-down), on real Envoy, with and without the filters.
//!
//! Topology, all on this machine: the load generator → a consumer sidecar
//! (127.0.0.1) → `providers` provider sidecars (127.0.0.11, .12, ...) → as
//! many demo apps (`examples/demo-app`, one per provider address). The
//! sidecars get their config over real xDS streams (`tools/xds_server.py`,
//! a stand-in for istiod: listeners over LDS, the filters' config over
//! ECDS), and the consumer the providers as EDS pushes from a stand-in
//! registry that applies every change `registry_lag` after the readiness
//! probe saw it (the registry is always behind, as Kubernetes endpoints and
//! EDS are).
//!
//! One provider at a time goes down the way Kubernetes takes a pod down, and
//! comes back with a new instance id on the same address; or, in a
//! scale-down (`scale_down_by`), that many go down at once and do not come
//! back, as an autoscaler or `kubectl scale` takes pods away:
//!
//! | step | graceful run | baseline run (plain Envoy) |
//! |---|---|---|
//! | preStop starts | `POST /graceful/closing` | `POST /healthcheck/fail` on the admin |
//! | readiness | `/graceful/ready` 503 → registry drops it after the lag | `/healthz` 503 → same |
//! | preStop waits | `GET /graceful/drained?wait=60s` | a fixed sleep |
//! | then | SIGTERM to Envoy and the app | same |
//! | back (not in a scale-down) | new processes; readiness 200 → registry re-adds it after the lag | same |

pub mod fronts;
pub mod matrix;
pub mod report;

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::future::join_all;

use crate::support::client::{self, GrpcEvent, GrpcStream, H2Conn};
use crate::support::envoy::{candidate_port, repo_root, terminate, Envoy, EnvoySpec};
use crate::support::load::{Load, Protocol, Sample, Shape};
use crate::support::procfs::rss_kb;
use crate::support::run_report::{ProviderEvents, RunReport};
use crate::support::upstream::demo_app_binary;
use crate::support::xds::{self, AdsConfig, XdsServer};
use serde_json::{json, Value};

/// `HealthCheckResponse { status: SERVING }`, as the demo app's `Watch`
/// sends it.
const HEALTH_SERVING: [u8; 2] = [0x08, 0x01];

/// Which sidecars run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// graceful_consumer, graceful_provider and graceful_drain.
    Graceful,
    /// Plain Envoy: the same routes, retries and load, no filters.
    Baseline,
    /// Plain Envoy and no preStop at all: the registry drops the provider
    /// (after its lag) while Envoy and the app get SIGTERM at once.
    RegistryOnly,
    /// With the filters, but the provider's Envoy and app die by SIGKILL
    /// with no warning (a node failure): the registry drops it after its lag.
    Killed,
    /// Plain Envoy, and the provider dies by SIGKILL as in [`Mode::Killed`].
    KilledBaseline,
    /// Backends with no sidecar behind fronts with the filters
    /// ([`fronts`]): each backend's preStop is `graceful-hook front`.
    FrontHook,
    /// The fronts with the filters, no preStop: they learn from Envoy
    /// Gateway's `DRAINING` push only.
    FrontNoHook,
    /// Plain fronts, the backend's preStop a fixed sleep (`baseline_sleep`).
    FrontSleep,
    /// Plain fronts, no preStop: Envoy Gateway's `DRAINING` push alone.
    FrontDrainingOnly,
}

/// The consumer's retry policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// The shipped consumer sidecar's: connect failures, refused streams,
    /// resets and 503, 2 retries, other hosts.
    Shipped,
    /// Istio's default route policy (`pilot/pkg/networking/core/route/retry`):
    /// `connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes`
    /// with no status code listed (a 503 is not retried), no reset, 2
    /// retries, `previous_hosts`, 5 host selection attempts.
    Istio,
    /// None: what a non-idempotent call gets.
    Never,
}

impl Retry {
    /// The consumer template's placeholders for this policy.
    fn values(self) -> [(&'static str, &'static str); 4] {
        match self {
            Retry::Shipped => [
                (
                    "RETRY_ON",
                    "connect-failure,refused-stream,reset,retriable-status-codes",
                ),
                ("RETRIABLE_STATUS_CODES", "[503]"),
                ("RETRIES", "2"),
                ("HOST_SELECTION_ATTEMPTS", "3"),
            ],
            Retry::Istio => [
                (
                    "RETRY_ON",
                    "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes",
                ),
                ("RETRIABLE_STATUS_CODES", "[]"),
                ("RETRIES", "2"),
                ("HOST_SELECTION_ATTEMPTS", "5"),
            ],
            Retry::Never => [
                ("RETRY_ON", "connect-failure"),
                ("RETRIABLE_STATUS_CODES", "[]"),
                ("RETRIES", "0"),
                ("HOST_SELECTION_ATTEMPTS", "1"),
            ],
        }
    }
}

impl Mode {
    /// Whether the sidecars run the filters.
    pub fn graceful(self) -> bool {
        matches!(
            self,
            Mode::Graceful | Mode::Killed | Mode::FrontHook | Mode::FrontNoHook
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::Graceful => "graceful",
            Mode::Baseline => "baseline",
            Mode::RegistryOnly => "registry_only",
            Mode::Killed => "killed",
            Mode::KilledBaseline => "killed_baseline",
            Mode::FrontHook => "front_hook",
            Mode::FrontNoHook => "front_no_hook",
            Mode::FrontSleep => "front_sleep",
            Mode::FrontDrainingOnly => "front_draining_only",
        }
    }
}

/// What one run does. [`DemoConfig::default`] is `make demo`'s.
#[derive(Debug, Clone)]
pub struct DemoConfig {
    pub protocol: Protocol,
    /// Requests per second, open loop.
    pub rate: u32,
    /// Client connections the load uses.
    pub connections: usize,
    /// Provider sidecars (and apps) at the start (1 to 200).
    pub providers: usize,
    /// How many providers go down and come back, in turn, round and round
    /// (ignored in a scale-down).
    pub restarts: usize,
    /// A scale-down: this many providers (the first ones) go down at once
    /// and do not come back (1 to `providers - 1`); 0, the rolling restart
    /// of `restarts` instead.
    pub scale_down_by: usize,
    pub registry_lag: Duration,
    /// Load before the first shutdown.
    pub warmup: Duration,
    /// Load between a provider coming back and the next shutdown.
    pub settle: Duration,
    /// Load after the last provider came back.
    pub tail: Duration,
    /// The load runs at least this long (the tail is stretched to reach it).
    pub min_duration: Duration,
    /// The apps' answer latency.
    pub app_latency: Duration,
    /// graceful_drain's configuration on the providers.
    pub drain_config: String,
    /// graceful_consumer's configuration.
    pub consumer_config: String,
    /// The baseline's preStop sleep between `/healthcheck/fail` and SIGTERM.
    pub baseline_sleep: Duration,
    /// The consumer's retry policy.
    pub retry: Retry,
    /// What the load asks.
    pub shape: Shape,
    /// Where logs, the xDS snapshot and access logs go.
    pub work_dir: PathBuf,
    /// The load reaches the providers through an L4 balancer
    /// (`envoy/l4-balancer.yaml`) instead of a consumer sidecar.
    pub balancer: bool,
    /// Fields merged into the consumer's `providers` cluster, as a control
    /// plane translates a DestinationRule (`outlier_detection`,
    /// `common_lb_config`); null: none.
    pub providers_cluster: Value,
    /// Backends with no sidecar behind two fronts ([`fronts`]) instead of
    /// providers behind sidecars.
    pub fronts: bool,
}

impl Default for DemoConfig {
    fn default() -> Self {
        DemoConfig {
            protocol: Protocol::Http1,
            rate: 500,
            connections: 16,
            providers: 3,
            restarts: 3,
            scale_down_by: 0,
            registry_lag: Duration::from_secs(2),
            warmup: Duration::from_secs(3),
            settle: Duration::from_secs(4),
            tail: Duration::from_secs(3),
            min_duration: Duration::ZERO,
            app_latency: Duration::from_millis(5),
            drain_config: r#"{"admin_cluster":"envoy_admin"}"#.into(),
            consumer_config: r#"{"admin_cluster":"envoy_admin"}"#.into(),
            baseline_sleep: Duration::from_secs(3),
            retry: Retry::Shipped,
            shape: Shape::default(),
            work_dir: repo_root().join("target/demo"),
            balancer: false,
            providers_cluster: Value::Null,
            fronts: false,
        }
    }
}

/// A port free on every provider address. Known before the providers
/// start, not bound by them at 0: each provider has a loopback address of
/// its own (127.0.0.11 up, a pod's), the registry lists it, and a restart
/// comes back at the same address; a candidate is below the ephemeral
/// range, where only explicit binds meet, and nothing else binds these
/// addresses.
fn port_free_on(ips: &[Ipv4Addr]) -> u16 {
    for _ in 0..50 {
        let port = candidate_port();
        if ips.iter().all(|ip| TcpListener::bind((*ip, port)).is_ok()) {
            return port;
        }
    }
    panic!("no port free on {ips:?}");
}

/// A demo app on `addr` answering as `name` after `latency`, its output
/// in `log`.
fn spawn_demo_app(log: &Path, addr: SocketAddr, name: &str, latency: Duration) -> Child {
    let out = std::fs::File::create(log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    let err = out.try_clone().unwrap_or_else(|e| panic!("{e}"));
    let bin = demo_app_binary();
    Command::new(&bin)
        .args(["--listen", &addr.to_string(), "--name", name])
        .args(["--latency-ms", &latency.as_millis().to_string()])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {} ({e}): build it with `cargo build -p demo-app`",
                bin.display()
            )
        })
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(0))
}

/// The registry stand-in: the endpoints the consumer gets over its xDS
/// stream ([`XdsServer`], pushed as EDS), each change `lag` after it was
/// asked for.
#[derive(Clone)]
struct Registry {
    xds: Arc<Mutex<XdsServer>>,
    /// What the stream carries besides the endpoints (the consumer's
    /// listener and filter config).
    resources: Value,
    members: Arc<Mutex<Vec<SocketAddr>>>,
    lag: Duration,
}

impl Registry {
    fn new(xds: XdsServer, resources: Value, members: Vec<SocketAddr>, lag: Duration) -> Registry {
        let registry = Registry {
            xds: Arc::new(Mutex::new(xds)),
            resources,
            members: Arc::new(Mutex::new(Vec::new())),
            lag,
        };
        registry.push(&members);
        if let Ok(mut m) = registry.members.lock() {
            *m = members;
        }
        registry
    }

    /// One push: the endpoints `members`, with the rest of the config.
    fn push(&self, members: &[SocketAddr]) {
        let mut resources = self.resources.clone();
        resources[xds::ENDPOINTS] = json!([xds::cluster_load_assignment("providers", members)]);
        if let Ok(mut xds) = self.xds.lock() {
            xds.push(&resources);
        }
    }

    fn later(&self, addr: SocketAddr, present: bool) {
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(me.lag).await;
            // Pushed under the lock: changes that fall due together (a
            // scale-down) are pushed in order, the last holding them all.
            let Ok(mut m) = me.members.lock() else { return };
            m.retain(|a| *a != addr);
            if present {
                m.push(addr);
                m.sort();
            }
            me.push(&m);
        });
    }
}

struct Provider {
    index: usize,
    inbound: SocketAddr,
    app_addr: SocketAddr,
    envoy: Option<Envoy>,
    /// The control plane stand-in of its current generation's Envoy.
    xds: Option<XdsServer>,
    app: Option<Child>,
    generation: u32,
    /// Access log of each generation (instance) of this provider.
    access_logs: Vec<PathBuf>,
}

struct Run<'a> {
    config: &'a DemoConfig,
    mode: Mode,
    dir: PathBuf,
    epoch: Instant,
    epoch_unix_ms: u64,
}

impl Run<'_> {
    fn ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(0)
    }

    fn start_app(&self, p: &Provider) -> Child {
        spawn_demo_app(
            &self
                .dir
                .join(format!("app-p{}-{}.log", p.index, p.generation)),
            p.app_addr,
            &format!("p{}", p.index),
            self.config.app_latency,
        )
    }

    async fn start_provider_envoy(&self, p: &mut Provider) -> Envoy {
        let template = if self.mode.graceful() {
            "provider-sidecar.yaml"
        } else {
            "baseline-provider-sidecar.yaml"
        };
        let access_log = self
            .dir
            .join(format!("access-p{}-{}.log", p.index, p.generation));
        p.access_logs.push(access_log.clone());
        let mut spec = EnvoySpec::new(
            &format!("{}-p{}-{}", self.name(), p.index, p.generation),
            template,
        )
        .set("LISTEN_ADDRESS", p.inbound.ip())
        .set("INBOUND_PORT", p.inbound.port())
        .set("APP_ADDRESS", p.app_addr.ip())
        .set("APP_PORT", p.app_addr.port())
        .set("DRAIN_CONFIG", &self.config.drain_config)
        .set("PROVIDER_CONFIG", "{}")
        .set("ACCESS_LOG", access_log.display());
        spec.concurrency = 1;
        // Its listener and filters over a real xDS stream, as from istiod
        // (a control plane of its own: each sidecar's config is its own).
        let mut xds = XdsServer::start(&format!(
            "{}-p{}-{}-{}",
            self.name(),
            p.index,
            p.generation,
            std::process::id()
        ))
        .await;
        let ads = AdsConfig::split(
            &spec.rendered(),
            &format!("p{}", p.index),
            xds.port,
            &["graceful_drain", "graceful_provider"],
        );
        xds.push(&ads.resources());
        p.xds = Some(xds);
        ads.spec(spec).start().await
    }

    fn name(&self) -> &'static str {
        self.mode.name()
    }

    fn ready_path(&self) -> &'static str {
        if self.mode.graceful() {
            "/graceful/ready"
        } else {
            "/healthz"
        }
    }

    /// The readiness probe: polls until it answers `want`, then has the
    /// registry follow (after its lag).
    fn kubelet(&self, p: &Provider, want: u16, registry: &Registry) {
        let (addr, path, registry) = (p.inbound, self.ready_path(), registry.clone());
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline {
                if client::get(addr, path)
                    .await
                    .is_ok_and(|r| r.status == want)
                {
                    registry.later(addr, want == 200);
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }

    /// Provider `p` leaves as the run's mode says: its preStop, the
    /// registry following, SIGTERM; the moments up to its exit.
    async fn shut_down(&self, p: &mut Provider, registry: &Registry) -> ProviderEvents {
        let mut ev = ProviderEvents {
            provider: p.index,
            ..Default::default()
        };
        ev.access_log = p.access_logs.last().cloned().unwrap_or_default();
        // Callers without graceful_consumer: a gRPC client watching the
        // provider's health (as gRPC's client-side health checking does)
        // since serving.
        let watch = if self.config.balancer {
            Some(self.watch(p).await)
        } else {
            None
        };
        ev.closing_ms = self.ms();
        let epoch = self.epoch;
        let watcher = watch.map(|(conn, mut watch)| {
            tokio::spawn(async move {
                let _conn = conn;
                loop {
                    match watch.next(Duration::from_secs(120)).await {
                        Ok(GrpcEvent::Message(m)) if m == HEALTH_SERVING => continue,
                        _ => return epoch.elapsed().as_millis() as u64,
                    }
                }
            })
        });
        match self.mode {
            Mode::Graceful => {
                let r = client::post(p.inbound, "/graceful/closing")
                    .await
                    .unwrap_or_else(|e| panic!("closing p{}: {e}", p.index));
                assert_eq!(r.status, 202, "closing p{}: {}", p.index, r.text());
                self.kubelet(p, 503, registry);
                let r = client::get(p.inbound, "/graceful/drained?wait=60s")
                    .await
                    .unwrap_or_else(|e| panic!("drained p{}: {e}", p.index));
                assert_eq!(r.status, 200, "drained p{}: {}", p.index, r.text());
                ev.drain_report = client::get(p.inbound, "/graceful/report")
                    .await
                    .ok()
                    .and_then(|r| serde_json::from_slice(&r.body).ok());
            }
            Mode::Baseline => {
                if let Some(envoy) = &p.envoy {
                    assert_eq!(envoy.admin_post("/healthcheck/fail").await.status, 200);
                }
                self.kubelet(p, 503, registry);
                tokio::time::sleep(self.config.baseline_sleep).await;
            }
            Mode::RegistryOnly => registry.later(p.inbound, false),
            Mode::Killed | Mode::KilledBaseline => {
                registry.later(p.inbound, false);
                // Dropping them sends SIGKILL.
                drop(p.envoy.take());
                if let Some(mut app) = p.app.take() {
                    let _ = app.kill();
                    let _ = app.wait();
                }
            }
            // Run by `fronts`, never here.
            Mode::FrontHook | Mode::FrontNoHook | Mode::FrontSleep | Mode::FrontDrainingOnly => {}
        }
        ev.drained_ms = self.ms();
        // Kubernetes sends SIGTERM to every container of the pod at once.
        let grace = Duration::from_secs(10);
        let (envoy, app) = (p.envoy.take(), p.app.take());
        let stop_envoy = async {
            if let Some(mut e) = envoy {
                e.terminate(grace).await;
            }
        };
        let stop_app = async {
            if let Some(mut a) = app {
                terminate(&mut a, grace).await;
            }
        };
        tokio::join!(stop_envoy, stop_app);
        ev.down_ms = self.ms();
        if let Some(watcher) = watcher {
            // The exit ends it at the latest.
            let told = tokio::time::timeout(Duration::from_secs(10), watcher).await;
            ev.watch_told_ms = told
                .ok()
                .and_then(Result::ok)
                .map(|t| t.saturating_sub(ev.closing_ms));
        }
        ev
    }

    /// Provider `p` comes back after [`Run::shut_down`]: a new instance on
    /// the same address, ready, then re-added by the registry after its lag.
    async fn come_back(&self, p: &mut Provider, registry: &Registry, ev: &mut ProviderEvents) {
        p.generation += 1;
        p.app = Some(self.start_app(p));
        let envoy = self.start_provider_envoy(p).await;
        p.envoy = Some(envoy);
        crate::support::envoy::eventually(
            "new instance ready",
            Duration::from_secs(30),
            || async {
                client::get(p.inbound, self.ready_path())
                    .await
                    .ok()
                    .filter(|r| r.status == 200)
                    .map(|_| ())
            },
        )
        .await;
        ev.up_ms = self.ms();
        self.kubelet(p, 200, registry);
    }

    /// A gRPC health `Watch` on provider `p`, once it has said SERVING.
    async fn watch(&self, p: &Provider) -> (H2Conn, GrpcStream) {
        let mut conn = H2Conn::connect(p.inbound)
            .await
            .unwrap_or_else(|e| panic!("watch p{}: {e}", p.index));
        let mut watch = conn
            .grpc_stream("/grpc.health.v1.Health/Watch")
            .await
            .unwrap_or_else(|e| panic!("watch p{}: {e}", p.index));
        let first = watch.next(Duration::from_secs(10)).await;
        assert_eq!(
            first,
            Ok(GrpcEvent::Message(HEALTH_SERVING.to_vec())),
            "watch p{}",
            p.index
        );
        (conn, watch)
    }

    /// The consumer saw provider `p` closing: its first tombstone for the
    /// provider's address at or after `closing_ms`, from the consumer's log.
    fn seen_ms(&self, consumer_log: &str, p: &Provider, closing_ms: u64) -> Option<u64> {
        let needle = format!("tombstoned {} ", p.inbound);
        consumer_log
            .lines()
            .filter(|l| l.contains(&needle))
            .filter_map(|l| log_time_ms(l).map(|t| t.saturating_sub(self.epoch_unix_ms)))
            .find(|&t| t + 5 >= closing_ms)
    }
}

/// Unix ms of an Envoy log line `[YYYY-MM-DD HH:MM:SS.mmm]...` (UTC).
fn log_time_ms(line: &str) -> Option<u64> {
    let ts = line.strip_prefix('[')?.get(..23)?;
    let num = |r: std::ops::Range<usize>| ts.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, s, ms) = (num(11..13)?, num(14..16)?, num(17..19)?, num(20..23)?);
    // Days from civil (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (mo + if mo > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(((days * 24 + h) * 60 + mi) * 60 + s)
        .ok()
        .map(|secs| secs * 1000 + u64::try_from(ms).unwrap_or(0))
}

/// App requests in an access log that started at or after `since_unix_ms`
/// (the filters' own endpoints and health checks excluded).
fn arrivals_since(access_log: &Path, since_unix_ms: u64) -> u64 {
    let text = std::fs::read_to_string(access_log).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut parts = l.split_whitespace();
            let start: f64 = parts.next()?.parse().ok()?;
            let path = parts.nth(2)?;
            let app = !path.starts_with("/graceful/") && path != "/healthz";
            (app && (start * 1000.0) as u64 >= since_unix_ms).then_some(())
        })
        .count() as u64
}

/// A numbered request's sequence number (`?seq=N`, see [`Shape::numbered`])
/// and the start of its access log line (Unix ms): the first and last
/// fields of the consumer's and the providers' formats.
fn numbered_line(line: &str) -> Option<(u64, u64)> {
    let start: f64 = line.split_whitespace().next()?.parse().ok()?;
    let seq = line.split_whitespace().last()?.split_once("?seq=")?.1;
    Some((seq.parse().ok()?, (start * 1000.0).round() as u64))
}

/// When the consumer started each numbered request (Unix ms), from its
/// access log.
fn numbered_starts(consumer_access_log: &Path) -> HashMap<u64, u64> {
    std::fs::read_to_string(consumer_access_log)
        .unwrap_or_default()
        .lines()
        .filter_map(numbered_line)
        .collect()
}

/// The numbered requests a provider received (its access log) that the
/// consumer started after `seen_unix_ms`, in whole ms as both logs have
/// it: a request started in that very ms counts as routed before.
fn started_after(access_log: &Path, started: &HashMap<u64, u64>, seen_unix_ms: u64) -> u64 {
    std::fs::read_to_string(access_log)
        .unwrap_or_default()
        .lines()
        .filter_map(numbered_line)
        .filter(|(seq, _)| started.get(seq).is_some_and(|&at| at > seen_unix_ms))
        .count() as u64
}

impl Run<'_> {
    /// The providers, one per address in `ips`, each app and sidecar started.
    async fn start_providers(
        &self,
        ips: &[Ipv4Addr],
        inbound_port: u16,
        app_port: u16,
    ) -> Vec<Provider> {
        let mut providers: Vec<Provider> = ips
            .iter()
            .enumerate()
            .map(|(i, ip)| Provider {
                index: i + 1,
                inbound: SocketAddr::from((*ip, inbound_port)),
                app_addr: SocketAddr::from((*ip, app_port)),
                envoy: None,
                xds: None,
                app: None,
                generation: 0,
                access_logs: Vec::new(),
            })
            .collect();
        for p in &mut providers {
            p.app = Some(self.start_app(p));
            let envoy = self.start_provider_envoy(p).await;
            p.envoy = Some(envoy);
        }
        providers
    }

    /// The consumer's sidecar, its config over a real xDS stream as from
    /// istiod: listener (LDS), graceful_consumer's config (ECDS), the
    /// providers (EDS, from the registry); returned once it sees them all.
    async fn start_consumer(&self, providers: &[Provider], access_log: &Path) -> (Envoy, Registry) {
        let (config, name) = (self.config, self.name());
        let template = if config.balancer {
            "l4-balancer.yaml"
        } else if self.mode.graceful() {
            "consumer-sidecar.yaml"
        } else {
            "baseline-consumer-sidecar.yaml"
        };
        let mut consumer = EnvoySpec::new(&format!("{name}-consumer"), template)
            .set("OUTBOUND_PORT", 0)
            .set("CONSUMER_CONFIG", &config.consumer_config)
            .set("ACCESS_LOG", access_log.display());
        for (placeholder, value) in config.retry.values() {
            consumer = consumer.set(placeholder, value);
        }
        let xds = XdsServer::start(&format!("{name}-{}", std::process::id())).await;
        let mut ads = AdsConfig::split(
            &consumer.rendered(),
            "consumer",
            xds.port,
            &["graceful_consumer"],
        );
        if let Some(fields) = config.providers_cluster.as_object() {
            let clusters = ads.bootstrap["static_resources"]["clusters"].as_array_mut();
            let providers_cluster = clusters
                .into_iter()
                .flatten()
                .find(|c| c["name"] == "providers")
                .unwrap_or_else(|| panic!("{template}: no providers cluster"));
            for (field, value) in fields {
                providers_cluster[field] = value.clone();
            }
        }
        let registry = Registry::new(
            xds,
            ads.resources(),
            providers.iter().map(|p| p.inbound).collect(),
            config.registry_lag,
        );
        let consumer = ads.spec(consumer).start().await;
        crate::support::envoy::eventually(
            &format!("consumer sees {} providers", config.providers),
            Duration::from_secs(20),
            || async {
                (consumer.stat("cluster.providers.membership_healthy").await
                    == Some(config.providers as u64))
                .then_some(())
            },
        )
        .await;
        (consumer, registry)
    }

    /// The shutdowns under load: `scale_down_by` providers at once, gone
    /// from the consumer's membership; else `restarts` in turn, each back.
    async fn shut_downs(
        &self,
        providers: &mut [Provider],
        registry: &Registry,
        consumer: &Envoy,
    ) -> Vec<ProviderEvents> {
        let config = self.config;
        if config.scale_down_by > 0 {
            let leaving = providers.iter_mut().take(config.scale_down_by);
            let events = join_all(leaving.map(|p| self.shut_down(p, registry))).await;
            // The load goes on until the consumer's Envoy has the registry's
            // update (a registry slower than the drain drops them after they
            // are gone), then for the tail.
            let remaining = (config.providers - config.scale_down_by) as u64;
            crate::support::envoy::eventually(
                "the registry drops the leaving providers",
                config.registry_lag + Duration::from_secs(30),
                || async {
                    (consumer.stat("cluster.providers.membership_total").await == Some(remaining))
                        .then_some(())
                },
            )
            .await;
            return events;
        }
        let mut events = Vec::new();
        for i in 0..config.restarts {
            // Providers go down in turn, round and round for long runs (a soak).
            let n = providers.len();
            let p = &mut providers[i % n];
            let mut ev = self.shut_down(p, registry).await;
            self.come_back(p, registry, &mut ev).await;
            events.push(ev);
            // Wait for the registry to carry the new instance, then let it settle.
            tokio::time::sleep(config.registry_lag + config.settle).await;
        }
        events
    }

    /// The consumer's outbound requests in flight once all have ended: it
    /// must come to 0 (the gauge is refreshed every `membership_refresh`,
    /// 1 s: give it 3). Plain Envoy has no such gauge: None.
    async fn inflight_end(&self, consumer: &Envoy) -> Option<u64> {
        if !self.mode.graceful() || self.config.balancer {
            return None;
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            // The native module over the stand-in's stream keeps Envoy's
            // default stats namespace (crate::support::xds::by_module_name).
            let n = match consumer.stat("wasmcustom.graceful_consumer_inflight").await {
                Some(n) => Some(n),
                None => {
                    consumer
                        .stat("dynamicmodulescustom.graceful_consumer_inflight")
                        .await
                }
            };
            if n == Some(0) || Instant::now() >= deadline {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// When the consumer saw each provider closing, and the requests that
    /// reached it after that, from the logs.
    fn note_seen(
        &self,
        events: &mut [ProviderEvents],
        providers: &[Provider],
        consumer_log: &str,
        consumer_access_log: &Path,
    ) {
        // Numbered requests: when the consumer started each one.
        let started = if self.config.shape.numbered {
            Some(numbered_starts(consumer_access_log))
        } else {
            None
        };
        for ev in events {
            let p = &providers[ev.provider - 1];
            ev.seen_ms = match self.mode {
                Mode::Graceful => self
                    .seen_ms(consumer_log, p, ev.closing_ms)
                    .unwrap_or(ev.closing_ms),
                _ => ev.closing_ms,
            };
            let seen_unix_ms = self.epoch_unix_ms + ev.seen_ms;
            ev.after_closing = arrivals_since(&ev.access_log, seen_unix_ms);
            ev.started_after_seen = started
                .as_ref()
                .map(|started| started_after(&ev.access_log, started, seen_unix_ms));
        }
    }
}

/// Every sample of the load, as `samples.csv` in `dir`.
fn write_samples(dir: &Path, samples: &[Sample]) {
    let csv: String = std::iter::once("due_ms,latency_us,ok,served_by,marked,long\n".to_string())
        .chain(samples.iter().map(|s| {
            format!(
                "{},{},{},{},{},{}\n",
                s.due_ms,
                s.latency_us,
                u8::from(s.ok),
                s.served_by,
                u8::from(s.marked),
                u8::from(s.long)
            )
        }))
        .collect();
    let _ = std::fs::write(dir.join("samples.csv"), csv);
}

/// Each provider's sidecar and app, stopped.
fn stop_providers(providers: &mut [Provider]) {
    for p in providers {
        drop(p.envoy.take());
        if let Some(mut app) = p.app.take() {
            let _ = app.kill();
            let _ = app.wait();
        }
    }
}

/// Runs the scenario once and reports it, with the samples for the chart.
pub async fn run(config: &DemoConfig, mode: Mode) -> (RunReport, Vec<Sample>) {
    if config.fronts {
        return fronts::run(config, mode).await;
    }
    let name = mode.name();
    let dir = config
        .work_dir
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut r = Run {
        config,
        mode,
        dir: dir.clone(),
        epoch: Instant::now(),
        epoch_unix_ms: unix_ms(),
    };

    assert!(
        (1..=200).contains(&config.providers) && config.scale_down_by < config.providers,
        "{} providers, {} leaving at once",
        config.providers,
        config.scale_down_by
    );
    let ips: Vec<Ipv4Addr> = (11..)
        .take(config.providers)
        .map(|i| Ipv4Addr::new(127, 0, 0, i))
        .collect();
    let inbound_port = port_free_on(&ips);
    let app_port = port_free_on(&ips);
    let mut providers = r.start_providers(&ips, inbound_port, app_port).await;
    let consumer_access_log = dir.join("access-consumer.log");
    let (consumer, registry) = r.start_consumer(&providers, &consumer_access_log).await;

    // Time zero is when the load starts: the chart and the events count from it.
    r.epoch = Instant::now();
    r.epoch_unix_ms = unix_ms();
    let load = Load::start_shaped(
        consumer.only_listener().await,
        config.protocol,
        config.rate,
        config.connections,
        r.epoch,
        config.shape,
    );
    tokio::time::sleep(config.warmup).await;
    let rss_start = rss_kb(consumer.pid());
    let mut events = r.shut_downs(&mut providers, &registry, &consumer).await;
    let remaining = config.min_duration.saturating_sub(r.epoch.elapsed());
    tokio::time::sleep(config.tail.max(remaining)).await;
    let samples = load.stop().await;
    let duration_ms = r.ms();
    write_samples(&dir, &samples);

    let rss_end = rss_kb(consumer.pid());
    let inflight_end = r.inflight_end(&consumer).await;
    let retries = consumer
        .stat("cluster.providers.upstream_rq_retry")
        .await
        .unwrap_or(0);
    let outlier_ejections = consumer
        .stat("cluster.providers.outlier_detection.ejections_enforced_total")
        .await;
    let consumer_log = consumer.log();
    r.note_seen(&mut events, &providers, &consumer_log, &consumer_access_log);
    drop(consumer);
    stop_providers(&mut providers);
    let mut report = RunReport::new(
        &samples,
        events,
        retries,
        config.protocol,
        config.rate,
        duration_ms,
    );
    report.consumer_rss_kb = [rss_start, rss_end];
    report.consumer_inflight_end = inflight_end;
    report.outlier_ejections = outlier_ejections;
    (report, samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_time_reads_envoy_timestamps_as_utc() {
        assert_eq!(
            log_time_ms("[1970-01-01 00:00:01.250][1][info] x"),
            Some(1250)
        );
        assert_eq!(
            log_time_ms("[2026-11-30 03:24:13.996][29419][warning]"),
            Some(1_796_009_053_996)
        );
        assert_eq!(log_time_ms("garbage"), None);
    }

    #[test]
    fn numbered_lines_are_read_from_both_access_log_formats() {
        let consumer = "1796009053.996 200 - 127.0.0.11:8080 attempts=1 override=- /?seq=42";
        let provider = "1796009054.001 200 - /delay/2000?seq=43";
        assert_eq!(numbered_line(consumer), Some((42, 1_796_009_053_996)));
        assert_eq!(numbered_line(provider), Some((43, 1_796_009_054_001)));
        assert_eq!(numbered_line("1796009054.001 200 - /graceful/ready"), None);
        let shape = Shape {
            numbered: true,
            ..Shape::default()
        };
        assert_eq!(shape.path(7), ("/?seq=7".to_string(), false));
    }
}
