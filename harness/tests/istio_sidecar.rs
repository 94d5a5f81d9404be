//! The Istio example on Envoy configured like Istio's sidecar (not Istio:
//! see `graceful_harness::platform::istio` for what is kept and what differs).
//!
//! Each pod is a network namespace with Istio's iptables capture
//! (`graceful_harness::platform::netns`), its sidecar runs as uid 1337 with the
//! listeners, admin, clusters and retry policy Istio gives it, and the
//! filters are the example's WasmPlugins translated as istiod translates
//! them. A provider is shut down through the example's own preStop hooks
//! and readiness probe, read from `examples/istio/provider.yaml` and run
//! inside its pod, while a consumer pod calls the provider Service.
//!
//! Every sidecar that runs gets its config as istiod sends it: over a delta
//! ADS stream from a stand-in on the node ([`ControlPlane`]), listeners,
//! service clusters, endpoints and the WasmPlugins (ECDS), over IPv6 for
//! the IPv6-only pod; the registry's changes are EDS pushes. Only the
//! tests that ask `envoy --mode validate` about a config read it from a
//! file.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use graceful_core::shared::duration::parse_duration;
use graceful_harness::platform::istio;
use graceful_harness::platform::netns::{self, Node, Pod};
use graceful_harness::support::client;
use graceful_harness::support::envoy::{
    envoy_binary, eventually, in_localities, load_assignment, repo_root, wasm_dir, write_eds,
};
use graceful_harness::support::load::{Load, Protocol, Sample};
use graceful_harness::support::logged::LoggedProcess;
use graceful_harness::support::upstream::{demo_app_binary, hook_binary};
use graceful_harness::support::xds::{self, XdsServer};
use serde_json::{json, Value};

const SERVICE: &str = "provider.default.svc.cluster.local";
const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const APP_PORT: u16 = 8080;

/// Whether this machine can make pods; in CI it must.
fn pods_available() -> bool {
    match netns::available() {
        Ok(()) => true,
        Err(why) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: the Istio-shaped suite needs network namespaces: {why}");
            false
        }
        Err(why) => panic!("CI must run the Istio-shaped suite: {why}"),
    }
}

/// A process in a pod, killed on drop; its output goes to a log printed
/// when the test fails.
type Proc = LoggedProcess;

/// The kubelet's SIGTERM after the hooks, and how long it waits. (`ip
/// netns exec` replaces itself with the program, and setpriv too, so a
/// process's pid is the program's.)
const TERMINATE_GRACE: Duration = Duration::from_secs(15);

/// The sidecar runs as uid 1337 and opens its log (/dev/stdout) itself.
fn chown_proxy(path: &Path) {
    std::os::unix::fs::chown(path, Some(netns::PROXY_UID), Some(netns::PROXY_UID))
        .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
}

fn run_dir(name: &str) -> PathBuf {
    let dir = repo_root()
        .join("target/e2e")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    chown_proxy(&dir);
    dir
}

fn write_config(dir: &Path, name: &str, config: &Value) -> PathBuf {
    let path = dir.join(format!("{name}.json"));
    let text = serde_json::to_string_pretty(config).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    path
}

fn sidecar(pod: &Pod, config: &Path, dir: &Path) -> Proc {
    let mut cmd = pod.proxy_command(&envoy_binary().display().to_string());
    cmd.arg("-c")
        .arg(config)
        .args(["--concurrency", "2", "--disable-hot-restart"])
        .args(["--log-format", "[%Y-%m-%d %T.%e][%t][%l][%n] %v"])
        .args(["--file-flush-interval-msec", "100"]);
    Proc::spawn(&format!("{}-envoy", pod.name), cmd, dir, chown_proxy)
}

fn app(pod: &Pod, name: &str, dir: &Path) -> Proc {
    let mut cmd = pod.command(&demo_app_binary().display().to_string());
    cmd.args(["--listen", &format!("0.0.0.0:{APP_PORT}"), "--name", name]);
    Proc::spawn(&format!("{}-app", pod.name), cmd, dir, chown_proxy)
}

/// The provider Deployment's pod template from the example.
fn provider_pod_spec() -> Value {
    istio::of_kind("Deployment")
        .into_iter()
        .find(|d| d["metadata"]["name"] == "provider")
        .map(|d| d["spec"]["template"].clone())
        .unwrap_or_else(|| panic!("examples/istio/provider.yaml has no provider Deployment"))
}

fn container<'a>(template: &'a Value, name: &str) -> &'a Value {
    template["spec"]["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no container {name} in the provider pod"))
}

fn exec_command(container: &Value, what: &str, pointer: &str) -> Vec<String> {
    let command: Vec<String> = container
        .pointer(pointer)
        .and_then(Value::as_array)
        .map(|c| {
            c.iter()
                .filter_map(|a| a.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    assert!(!command.is_empty(), "{what}: no exec command at {pointer}");
    command
}

/// A container's exec command run inside `pod`: the demo image's
/// `demo-app` and the shared volume's `/graceful/graceful-hook` (what the
/// example's init container installs) are the built binaries, istio-proxy's
/// commands run as its uid.
fn in_pod(pod: &Pod, container: &str, command: &[String]) -> Command {
    let program = match command[0].as_str() {
        "demo-app" => demo_app_binary().display().to_string(),
        "/graceful/graceful-hook" => hook_binary().display().to_string(),
        other => other.to_string(),
    };
    let mut cmd = if container == "istio-proxy" {
        pod.proxy_command(&program)
    } else {
        pod.command(&program)
    };
    cmd.args(&command[1..]);
    cmd
}

/// A sidecar's Prometheus listener's whole answer, None if it did not
/// answer.
/// The version of the ECDS config named `name` a sidecar's Envoy applied,
/// as its admin (inside `pod`) dumps it (over delta xDS, the resource's
/// own version).
fn ecds_version(pod: &Pod, name: &str) -> Option<String> {
    let name = name.to_string();
    netns::spawn_in(&pod.netns, move || {
        Box::pin(async move {
            let r = client::get(
                SocketAddr::from(([127, 0, 0, 1], istio::ADMIN_PORT)),
                "/config_dump?resource=ecds_filters",
            )
            .await
            .ok()?;
            let dump: Value = serde_json::from_str(&r.text()).ok()?;
            dump["configs"]
                .as_array()?
                .iter()
                .find(|c| c["ecds_filter"]["name"] == name.as_str())
                .and_then(|c| Some(c["version_info"].as_str()?.to_string()))
        })
    })
    .join()
    .unwrap_or_else(|_| panic!("pod thread"))
}

async fn prometheus_text(pod_ip: Ipv4Addr) -> Option<String> {
    let r = client::get(
        SocketAddr::from((pod_ip, istio::PROMETHEUS_PORT)),
        "/stats/prometheus",
    )
    .await
    .ok()?;
    Some(r.text())
}

/// A metric from a sidecar's Prometheus listener (what a scraper on the
/// node reads): `name` without labels, None if absent.
async fn prometheus(pod_ip: Ipv4Addr, name: &str) -> Option<u64> {
    prometheus_text(pod_ip).await?.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let value = rest.strip_prefix("{}").unwrap_or(rest).trim();
        value.parse::<f64>().ok().map(|v| v as u64)
    })
}

/// A filter's counter summed over every stats scope it appears in on the
/// Prometheus listener: the root (`name`) and each cluster's, where Envoy
/// 1.36 puts the metrics of a cluster's upstream wasm filters
/// (`envoy_cluster_wasmcustom_<name>{...}`; 1.40 puts them at the root).
async fn prometheus_all_scopes(pod_ip: Ipv4Addr, name: &str) -> u64 {
    let text = prometheus_text(pod_ip).await.unwrap_or_default();
    let scoped = format!("_wasmcustom_{name}");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let (metric, value) = line.rsplit_once(' ')?;
            let bare = metric.split('{').next()?;
            (bare == name || bare.ends_with(&scoped)).then(|| value.parse::<f64>().ok())?
        })
        .map(|v| v as u64)
        .sum()
}

/// The consumer's retries to `cluster` from its Prometheus listener.
/// Envoy's default tag extractor cuts a cluster name at its first dot, so
/// the line for `outbound|80||provider.default...` is found by its parts.
async fn retries_of(pod_ip: Ipv4Addr, cluster: &str) -> u64 {
    let Some(text) = prometheus_text(pod_ip).await else {
        return 0;
    };
    let head = cluster.split('.').next().unwrap_or(cluster);
    let lines: Vec<String> = text
        .lines()
        .filter(|l| l.contains("upstream_rq_retry{") && l.contains(&format!("\"{head}\"")))
        .map(String::from)
        .collect();
    assert_eq!(lines.len(), 1, "one retry line for {cluster}: {lines:?}");
    lines[0]
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no value in {}", lines[0]))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Load from a pod to the provider Service (its ClusterIP, captured to the
/// pod's sidecar): 200 req/s on 8 keep-alive connections, on a thread of
/// its own inside the pod's namespace, until [`Running::stop`].
struct Running {
    stop: std::sync::mpsc::Sender<()>,
    load: std::thread::JoinHandle<Vec<Sample>>,
}

impl Running {
    fn start(netns: &str, epoch: Instant) -> Running {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let load = netns::spawn_in(netns, move || {
            Box::pin(async move {
                let load = Load::start(SocketAddr::from((VIP, 80)), Protocol::Http1, 200, 8, epoch);
                while stopped.try_recv().is_err() {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                load.stop().await
            })
        });
        Running { stop, load }
    }

    /// Every request's sample, ordered by due time.
    fn stop(self) -> Vec<Sample> {
        let _ = self.stop.send(());
        self.load.join().unwrap_or_else(|_| panic!("load thread"))
    }
}

struct Provider {
    pod: Pod,
    envoy: Proc,
    app: Proc,
}

/// The pods' control plane: `tools/xds_server.py` on the node, a stand-in
/// for istiod that speaks its protocol (delta ADS), serving each sidecar
/// what [`istio::over_xds`] makes of its config and every sidecar the
/// provider Service's endpoints. Not istiod: the resources are Envoy's own,
/// built by `platform::istio`.
struct ControlPlane {
    xds: XdsServer,
    /// Node id → what that sidecar is served.
    sidecars: serde_json::Map<String, Value>,
    /// The `ClusterLoadAssignment`s every sidecar is served.
    endpoints: Vec<Value>,
}

impl ControlPlane {
    /// On the node's IPv4 address.
    fn start(node: &Node) -> ControlPlane {
        ControlPlane::start_at(node, IpAddr::V4(node.ip()))
    }

    /// On `ip`, one of the node's addresses.
    fn start_at(node: &Node, ip: IpAddr) -> ControlPlane {
        let xds = runtime().block_on(XdsServer::start_in(
            &format!("istio-{}", node.netns),
            &node.netns,
            ip,
        ));
        ControlPlane {
            xds,
            sidecars: serde_json::Map::new(),
            endpoints: Vec::new(),
        }
    }

    /// Serves `config` to the sidecar of its node id (a restarted pod's
    /// replaces the one before); returns the bootstrap to start it with.
    fn serve_sidecar(&mut self, dir: &Path, name: &str, config: &Value) -> PathBuf {
        let ads = istio::over_xds(config, self.xds.address());
        let node = config["node"]["id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        self.sidecars.insert(node, ads.resources());
        self.push();
        write_config(dir, name, &ads.bootstrap)
    }

    /// Sends `assignment` (a `ClusterLoadAssignment`) as its cluster's
    /// endpoints: istiod's push after the registry changed.
    fn set_endpoints(&mut self, assignment: Value) {
        self.endpoints
            .retain(|a| a["cluster_name"] != assignment["cluster_name"]);
        self.endpoints.push(assignment);
        self.push();
    }

    /// istiod's ECDS push of the WasmPlugins of sidecar `node` with their
    /// settings unchanged in other bytes (each plugin's configuration
    /// re-serialised), as a change to a WasmPlugin that leaves its
    /// settings alone makes istiod push. Once per sidecar (a second
    /// re-serialisation is the same bytes). Returns the names pushed: those
    /// with settings.
    fn repush_wasm_plugins(&mut self, node: &str) -> (Vec<String>, u64) {
        let served = self
            .sidecars
            .get_mut(node)
            .unwrap_or_else(|| panic!("no sidecar {node}"));
        let mut names = Vec::new();
        for ext in served[xds::EXTENSION_CONFIG]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            let name = ext["name"].as_str().unwrap_or_default().to_string();
            // A plugin without settings has no configuration to touch.
            let Some(value) = ext.pointer_mut("/typed_config/config/configuration/value") else {
                continue;
            };
            if let Some(text) = value.as_str() {
                let settings: Value =
                    serde_json::from_str(text).unwrap_or_else(|e| panic!("{name}: {e}"));
                *value = json!(serde_json::to_string_pretty(&settings).unwrap_or_default());
                names.push(name);
            }
        }
        (names, self.push())
    }

    /// Serves what it holds as the next version; returns it.
    fn push(&mut self) -> u64 {
        let shared = json!({ xds::ENDPOINTS: self.endpoints });
        self.xds
            .push_with_nodes(&shared, &Value::Object(self.sidecars.clone()))
    }
}

impl Drop for ControlPlane {
    /// On a failure, what it sent and what was refused (NACKs).
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("the control plane's log:\n{}", self.xds.log());
        }
    }
}

fn start_provider(pod: Pod, n: usize, dir: &Path, control: &mut ControlPlane) -> Provider {
    let config = istio::provider_sidecar(&pod.ip.to_string(), APP_PORT, &wasm_dir(), "/dev/stdout");
    let path = control.serve_sidecar(dir, &format!("{}-{n}", pod.name), &config);
    let app = app(&pod, &pod.name, dir);
    let envoy = sidecar(&pod, &path, dir);
    Provider { pod, envoy, app }
}

fn samples_of(samples: &[Sample], served_by: u8) -> usize {
    samples.iter().filter(|s| s.served_by == served_by).count()
}

/// Three provider pods and a consumer pod on one node, their sidecars
/// configured like Istio's over their [`ControlPlane`], the providers in
/// the consumer's EDS.
struct Mesh {
    node: Node,
    consumer_pod: Pod,
    providers: Vec<Provider>,
    control: ControlPlane,
    cluster: String,
    endpoints: Vec<SocketAddr>,
    consumer_envoy: Proc,
    /// The consumer's sidecar runs graceful_consumer (its metric says it
    /// loaded); else its Envoy's own `server.live` does.
    consumer_filtered: bool,
}

impl Mesh {
    /// `upstream_instance`: also run graceful_consumer as an upstream
    /// filter of the outbound cluster, delivered as the example's
    /// `graceful-consumer-upstream` EnvoyFilter does (ECDS).
    fn start(dir: &Path, upstream_instance: bool) -> Mesh {
        let ecds_dir = dir.to_path_buf();
        Mesh::start_with(dir, move |config, cluster| {
            if upstream_instance {
                istio::deliver_upstream_instance(config, cluster, &wasm_dir(), &ecds_dir);
            }
        })
    }

    /// [`Mesh::start`], with `shape` applied to the consumer's config (its
    /// outbound cluster's name given) before it starts.
    fn start_with(dir: &Path, shape: impl FnOnce(&mut Value, &str)) -> Mesh {
        let mut node = Node::new();
        let mut control = ControlPlane::start(&node);
        let consumer_pod = node.pod("c", 2);
        // Pod names double as the apps' names: p1..p3 (x-served-by).
        let providers: Vec<Provider> = (1..=3u8)
            .map(|i| {
                let pod = node.pod(&format!("p{i}"), 10 + i);
                pod.capture_like_istio();
                start_provider(pod, 0, dir, &mut control)
            })
            .collect();
        consumer_pod.capture_like_istio();
        let cluster = format!("outbound|80||{SERVICE}");
        let endpoints: Vec<SocketAddr> = providers
            .iter()
            .map(|p| SocketAddr::from((p.pod.ip, APP_PORT)))
            .collect();
        control.set_endpoints(xds::cluster_load_assignment(&cluster, &endpoints));
        // The cluster's EDS source is the file path's place; over_xds makes
        // it istiod's ADS.
        let mut consumer_config = istio::consumer_sidecar(
            &consumer_pod.ip.to_string(),
            SERVICE,
            &VIP.to_string(),
            80,
            &dir.join("eds.yaml").display().to_string(),
            &wasm_dir(),
            "/dev/stdout",
        );
        shape(&mut consumer_config, &cluster);
        let consumer_filtered = consumer_config
            .to_string()
            .contains("\"root_id\":\"graceful_consumer\"");
        let consumer_path = control.serve_sidecar(dir, "consumer", &consumer_config);
        let consumer_envoy = sidecar(&consumer_pod, &consumer_path, dir);
        let mesh = Mesh {
            node,
            consumer_pod,
            providers,
            control,
            cluster,
            endpoints,
            consumer_envoy,
            consumer_filtered,
        };
        mesh.wait_filters();
        mesh
    }

    /// Every sidecar up with its filters loaded, as a scraper on the node
    /// sees it.
    fn wait_filters(&self) {
        let mut pods: Vec<(Ipv4Addr, &'static str)> = self
            .providers
            .iter()
            .map(|p| (p.pod.ip, "graceful_drain_phase"))
            .collect();
        pods.push((
            self.consumer_pod.ip,
            if self.consumer_filtered {
                "graceful_consumer_tombstones"
            } else {
                "envoy_server_live"
            },
        ));
        let node = self.node.netns.clone();
        netns::spawn_in(&node, move || {
            Box::pin(async move {
                for (ip, metric) in pods {
                    eventually(
                        &format!("{ip}: {metric} on :15090"),
                        Duration::from_secs(60),
                        || async move { prometheus(ip, metric).await },
                    )
                    .await;
                }
            })
        })
        .join()
        .unwrap_or_else(|_| panic!("the sidecars did not come up"));
    }
}

/// The kubelet's view: the pod address on the app port reaches the
/// sidecar's inbound chain, where graceful_drain answers readiness to
/// every caller and every other endpoint only to allowed_sources
/// (loopback by default): the node's address gets 403.
async fn assert_the_node_gets_readiness_alone(pod_ip: Ipv4Addr) {
    let at_pod = SocketAddr::from((pod_ip, APP_PORT));
    let ready = client::get(at_pod, "/graceful/ready")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((ready.status, ready.text().trim()), (200, "SERVING"));
    for (method, path) in [
        ("GET", "/graceful/status"),
        ("GET", "/graceful/report"),
        ("POST", "/graceful/closing"),
        ("GET", "/graceful/drained?wait=30s"),
    ] {
        let r = client::request(at_pod, method, path, &[])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.status, 403, "{method} {path} from the node: {}", r.text());
    }
}

/// Why the example's hooks use the admin: inside the pod (not uid 1337),
/// 15006 is the blackhole chain and the pod's own address is the app.
fn assert_the_admin_is_the_pods_way_in(pod: &Pod) {
    let pod_ip = pod.ip;
    let inside = netns::spawn_in(&pod.netns, move || {
        Box::pin(async move {
            let direct = client::get(
                SocketAddr::from(([127, 0, 0, 1], istio::INBOUND_PORT)),
                "/graceful/status",
            )
            .await;
            let own_ip =
                client::get(SocketAddr::from((pod_ip, APP_PORT)), "/graceful/status").await;
            let admin = client::get(
                SocketAddr::from(([127, 0, 0, 1], istio::ADMIN_PORT)),
                "/ready",
            )
            .await;
            (
                direct.map(|r| r.status),
                own_ip.map(|r| r.text()),
                admin.map(|r| r.status),
            )
        })
    })
    .join()
    .unwrap_or_else(|_| panic!("pod thread"));
    assert!(
        inside.0.is_err(),
        "127.0.0.1:15006 from the pod should be blackholed: {:?}",
        inside.0
    );
    assert_eq!(
        inside.1.as_deref().map(str::trim).ok(),
        Some("ok"),
        "the pod's own address should reach the app, not the sidecar"
    );
    assert_eq!(
        inside.2.ok(),
        Some(200),
        "the admin should answer inside the pod"
    );
}

/// Every provider serves through the consumer first.
async fn consumer_serving(consumer_ip: Ipv4Addr, epoch: Instant) {
    eventually(
        "the consumer reaches three members",
        Duration::from_secs(20),
        || async {
            (prometheus(consumer_ip, "graceful_consumer_tombstones")
                .await
                .is_some()
                && epoch.elapsed() > Duration::from_secs(2))
            .then_some(())
        },
    )
    .await;
}

/// The readiness probe fails within 10 s of the hooks' start.
fn wait_unready(hooks: &Hooks, pod: &Pod) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while hooks.ready(pod).0 {
        assert!(
            Instant::now() < deadline,
            "readiness still passes 10 s after the hooks started"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// While it is closing, istiod pushes its WasmPlugins again (same
/// settings): Envoy builds the filters' configs anew; the phase, the
/// in-flight count and the gate must not notice. The push's version,
/// once the pod's Envoy applied it.
fn repush_mid_drain(control: &mut ControlPlane, pod: &Pod) -> u64 {
    let node = format!(
        "sidecar~{}~provider.{}~{}.svc.cluster.local",
        pod.ip,
        istio::NAMESPACE,
        istio::NAMESPACE
    );
    let applied = ecds_version(pod, "default.graceful-drain");
    assert!(
        applied.is_some(),
        "p1's Envoy lists graceful-drain's ECDS config"
    );
    let (repushed, version) = control.repush_wasm_plugins(&node);
    // graceful_provider's WasmPlugin has no settings: its config has no
    // other bytes to be sent in.
    assert_eq!(repushed, ["default.graceful-drain"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while ecds_version(pod, &repushed[0]) == applied {
        assert!(
            Instant::now() < deadline,
            "p1's Envoy did not apply the pushed WasmPlugin (push {version}) in 10 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    version
}

/// The first provider's pod comes back at the same address as a new pod
/// (a new instance id), and the registry lists it again: the new
/// provider, when it was listed, and the consumer's readmissions.
fn come_back_first(
    rt: &tokio::runtime::Runtime,
    mesh: (&mut Vec<Provider>, &mut ControlPlane, &Path),
    (cluster, endpoints): (&str, &[SocketAddr]),
    consumer_ip: Ipv4Addr,
) -> (Provider, Instant, u64) {
    let (providers, control, dir) = mesh;
    let p1 = providers.remove(0);
    let p1_ip = p1.pod.ip;
    let pod = p1.pod;
    drop((p1.envoy, p1.app));
    let restarted = start_provider(pod, 1, dir, control);
    rt.block_on(async {
        eventually(
            "the restarted provider's filters",
            Duration::from_secs(60),
            || async { prometheus(p1_ip, "graceful_drain_phase").await },
        )
        .await;
    });
    control.set_endpoints(xds::cluster_load_assignment(cluster, endpoints));
    let back = Instant::now();
    let readmitted = rt.block_on(async {
        eventually(
            "the consumer readmits the restarted provider",
            Duration::from_secs(20),
            || async {
                prometheus(consumer_ip, "graceful_consumer_readmitted")
                    .await
                    .filter(|n| *n >= 1)
            },
        )
        .await
    });
    (restarted, back, readmitted)
}

/// What the drain through the example's hooks came to.
struct HooksDrain {
    samples: Vec<Sample>,
    /// From the load's start.
    closing_ms: u64,
    back_ms: u64,
    drained_after: Duration,
    /// Each hook's exit and what it said: the app's, then istio-proxy's.
    app_hook: (bool, String),
    proxy_hook: (bool, String),
    evictions: u64,
    steered: u64,
    readmitted: u64,
    /// The WasmPlugin push mid-drain.
    version: u64,
}

impl HooksDrain {
    fn print_and_assert(&self) {
        let samples = &self.samples;
        let failed = samples.iter().filter(|s| !s.ok).count();
        let marked = samples.iter().filter(|s| s.marked).count();
        let p1_after_back = samples
            .iter()
            .filter(|s| s.served_by == 1 && s.due_ms > self.back_ms)
            .count();
        let (app_said, proxy_said) = (&self.app_hook.1, &self.proxy_hook.1);
        eprintln!(
            "istio-shaped: {} requests, {failed} failed, {marked} marked, p1 {} p2 {} p3 {}, drained after {:?}, evictions {}, steered {}, readmitted {}, p1 after return {p1_after_back}, graceful-drain's WasmPlugin pushed mid-drain (version {})",
            samples.len(),
            samples_of(samples, 1),
            samples_of(samples, 2),
            samples_of(samples, 3),
            self.drained_after,
            self.evictions,
            self.steered,
            self.readmitted,
            self.version,
        );
        eprintln!("app hook: {app_said}istio-proxy hook: {proxy_said}");
        assert!(
            samples.len() > 1000,
            "the load ran: {} requests",
            samples.len()
        );
        assert_eq!(failed, 0, "no request may fail during the shutdown");
        assert!(
            self.app_hook.0 && self.proxy_hook.0,
            "hooks: app succeeded {} istio-proxy succeeded {}",
            self.app_hook.0,
            self.proxy_hook.0
        );
        assert!(
            app_said.contains("prestop: drained") && !app_said.contains("forced"),
            "app hook: {app_said}"
        );
        assert!(
            proxy_said.contains("prestop: drained"),
            "istio-proxy hook: {proxy_said}"
        );
        assert!(
            samples
                .iter()
                .any(|s| s.served_by == 1 && s.due_ms < self.closing_ms),
            "p1 served before closing"
        );
        assert!(marked > 0, "the consumer saw closing marks");
        assert!(
            self.evictions >= 1,
            "the consumer evicted p1 (evictions {})",
            self.evictions
        );
        assert!(p1_after_back > 0, "the restarted p1 serves again");
    }
}

fn ms_since(epoch: Instant, at: Instant) -> u64 {
    u64::try_from(at.duration_since(epoch).as_millis()).unwrap_or(0)
}

#[test]
fn it_drains_a_provider_through_the_istio_examples_hooks_with_istios_retry_policy() {
    if !pods_available() {
        return;
    }
    let dir = run_dir("istio");
    let Mesh {
        node,
        consumer_pod,
        mut providers,
        mut control,
        cluster,
        endpoints,
        consumer_envoy,
        ..
    } = Mesh::start(&dir, false);
    let hooks = Hooks::of_example();

    node.enter();
    let rt = runtime();
    rt.block_on(assert_the_node_gets_readiness_alone(providers[0].pod.ip));
    assert_the_admin_is_the_pods_way_in(&providers[0].pod);
    // The readiness probe passes while serving.
    assert!(
        hooks.ready(&providers[0].pod).0,
        "readiness should pass while serving"
    );

    // Load from the consumer pod to the Service: captured to 15001.
    let epoch = Instant::now();
    let load = Running::start(&consumer_pod.netns, epoch);
    rt.block_on(consumer_serving(consumer_pod.ip, epoch));

    // Pod deletion: the hooks of both containers start at once.
    let closing_at = Instant::now();
    let app_child = hooks.start(&providers[0].pod, "app");
    let proxy_child = hooks.start(&providers[0].pod, "istio-proxy");
    wait_unready(&hooks, &providers[0].pod);
    let version = repush_mid_drain(&mut control, &providers[0].pod);
    // The registry drops the pod (Kubernetes at deletion, here once it is
    // closing, so the consumer meets it closing first); istiod's push
    // reaches the consumer a moment later.
    std::thread::sleep(Duration::from_millis(1500));
    control.set_endpoints(xds::cluster_load_assignment(&cluster, &endpoints[1..]));
    let app_hook = finished(app_child);
    let proxy_hook = finished(proxy_child);
    let drained_after = closing_at.elapsed();
    // Then SIGTERM: Envoy and the app stop.
    providers[0].envoy.terminate(TERMINATE_GRACE);
    providers[0].app.terminate(TERMINATE_GRACE);

    let (restarted, back, readmitted) = come_back_first(
        &rt,
        (&mut providers, &mut control, &dir),
        (&cluster, &endpoints),
        consumer_pod.ip,
    );
    std::thread::sleep(Duration::from_secs(2));
    let samples = load.stop();
    let (evictions, steered) = rt.block_on(async {
        (
            prometheus(consumer_pod.ip, "graceful_consumer_evictions")
                .await
                .unwrap_or(0),
            prometheus(consumer_pod.ip, "graceful_consumer_steered")
                .await
                .unwrap_or(0),
        )
    });
    HooksDrain {
        samples,
        closing_ms: ms_since(epoch, closing_at),
        back_ms: ms_since(epoch, back),
        drained_after,
        app_hook,
        proxy_hook,
        evictions,
        steered,
        readmitted,
        version,
    }
    .print_and_assert();
    let _ = (consumer_envoy, restarted);
    graceful_harness::support::tested_with::record("examples/istio/README.md");
}

/// The numbers of the example that must agree, read from where they are.
#[test]
fn it_relates_the_grace_period_hooks_and_drain_timeout_of_the_istio_example() {
    let template = provider_pod_spec();
    let grace = template["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap_or_else(|| panic!("no terminationGracePeriodSeconds"));
    let drain = istio::of_kind("WasmPlugin")
        .into_iter()
        .find(|p| p["spec"]["pluginName"] == "graceful_drain")
        .unwrap_or_else(|| panic!("no graceful_drain WasmPlugin"));
    let timeout_text = drain["spec"]["pluginConfig"]["timeout"]
        .as_str()
        .unwrap_or("60s");
    let timeout =
        parse_duration(timeout_text).unwrap_or_else(|e| panic!("timeout {timeout_text:?}: {e:?}"));
    let app_hook = exec_command(
        container(&template, "app"),
        "app preStop",
        "/lifecycle/preStop/exec/command",
    );
    let app_wait = parse_duration(app_hook.last().map_or("", String::as_str))
        .unwrap_or_else(|e| panic!("the app hook's wait: {e:?}"));
    let proxy_hook = exec_command(
        container(&template, "istio-proxy"),
        "istio-proxy preStop",
        "/lifecycle/preStop/exec/command",
    );
    let proxy_wait = parse_duration(proxy_hook.last().map_or("", String::as_str))
        .unwrap_or_else(|e| panic!("the istio-proxy hook's wait: {e:?}"));
    let annotation = template["metadata"]["annotations"]["proxy.istio.io/config"]
        .as_str()
        .unwrap_or("{}");
    let proxy_config: Value =
        serde_json::from_str(annotation).unwrap_or_else(|e| panic!("{annotation}: {e}"));
    // Istio's default terminationDrainDuration is 5s.
    let termination_drain = parse_duration(
        proxy_config["terminationDrainDuration"]
            .as_str()
            .unwrap_or("5s"),
    )
    .unwrap_or_else(|e| panic!("terminationDrainDuration: {e:?}"));
    // Closing starts at graceful_drain's next admin poll (once a second)
    // after the hook's POST /healthcheck/fail, so the forced gate can pass
    // up to `timeout` + 1 s after the hooks started.
    let latest_gate = timeout + Duration::from_secs(1);
    for (what, wait) in [("app", app_wait), ("istio-proxy", proxy_wait)] {
        assert!(
            wait > latest_gate,
            "the {what} hook waits {wait:?}, not more than graceful_drain's timeout {timeout:?} + 1 s admin poll: it could give up before the forced gate"
        );
    }
    let longest = app_wait.max(proxy_wait);
    let needed = longest + termination_drain + Duration::from_secs(5);
    assert!(
        Duration::from_secs(grace) >= needed,
        "terminationGracePeriodSeconds {grace} < longest hook {longest:?} + terminationDrainDuration {termination_drain:?} + 5 s for SIGTERM"
    );
}

/// The EnvoyFilter's cluster patch, merged into an Istio-shaped outbound
/// cluster as Istio merges it: Envoy accepts it; with the locality LB
/// config Istio adds for `distribute` or failover, Envoy refuses it (the
/// case the README tells users to keep the patch away from).
#[test]
fn it_accepts_the_steering_patch_and_refuses_it_beside_locality_lb() {
    let patches = istio::cluster_patches(istio::STEERING);
    assert_eq!(
        patches.len(),
        1,
        "one CLUSTER patch in the example: {patches:?}"
    );
    let (matcher, value) = &patches[0];
    assert_eq!(matcher["context"], "SIDECAR_OUTBOUND");
    assert_eq!(matcher["cluster"]["service"], SERVICE);
    let dir = run_dir("istio-patch");
    let validate = |cluster: Value, name: &str| {
        let config = serde_json::json!({
            "node": {"id": "sidecar~10.66.0.2~consumer.default~default.svc.cluster.local", "cluster": "consumer.default"},
            "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
            "static_resources": {"clusters": [cluster]},
        });
        let path = write_config(&dir, name, &config);
        Command::new(envoy_binary())
            .args(["--mode", "validate", "-c"])
            .arg(&path)
            .output()
            .unwrap_or_else(|e| panic!("envoy: {e}"))
    };
    let eds = dir.join("eds.yaml");
    write_eds(&eds, "x", &[]);
    let name = format!("outbound|80||{SERVICE}");
    let mut plain = istio::outbound_cluster(&name, &eds.display().to_string());
    istio::merge_patch(&mut plain, value);
    assert!(plain["load_balancing_policy"].is_object(), "{plain}");
    let out = validate(plain.clone(), "patched");
    assert!(
        out.status.success(),
        "envoy refused the patched cluster: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // What istiod makes of the cluster with locality.yaml's DestinationRule
    // (outlier detection, a panic threshold, no locality-weighted config):
    // accepted beside the patch.
    let mut failover = serde_json::json!({"static_resources": {"clusters": [plain.clone()]}});
    istio::apply_locality_failover(&mut failover, &name);
    let failover = failover["static_resources"]["clusters"][0].clone();
    assert!(failover["outlier_detection"].is_object(), "{failover}");
    let out = validate(failover, "failover");
    assert!(
        out.status.success(),
        "envoy refused the patched cluster with locality.yaml's failover: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut locality = plain;
    locality["common_lb_config"]["locality_weighted_lb_config"] = serde_json::json!({});
    let out = validate(locality, "locality");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success(),
        "envoy accepted load_balancing_policy beside locality_weighted_lb_config"
    );
    assert!(
        said.contains("cannot be combined with partial fields"),
        "{said}"
    );
}

/// The WasmPlugins as a cluster applies them: FAIL_OPEN everywhere (a
/// fetch failure must not become deny-all), plugin names the modules'
/// root ids, configs the filters accept, drain before provider.
#[test]
fn it_translates_the_wasmplugins_as_istiod_does_and_they_configure() {
    let plugins = istio::of_kind("WasmPlugin");
    assert_eq!(plugins.len(), 3, "three WasmPlugins");
    for p in &plugins {
        let spec = &p["spec"];
        assert_eq!(
            spec["failStrategy"], "FAIL_OPEN",
            "{}",
            p["metadata"]["name"]
        );
        let url = spec["url"].as_str().unwrap_or_default();
        let name = spec["pluginName"].as_str().unwrap_or_default();
        assert!(url.starts_with("oci://REGISTRY/"), "{url}");
        assert!(
            url.contains(&format!("/{name}:")),
            "{url} should name the module {name} (make push)"
        );
    }
    let server = istio::wasm_filters("provider", istio::Side::Server, &wasm_dir());
    let names: Vec<&str> = server
        .iter()
        .filter_map(|f| f["typed_config"]["config"]["root_id"].as_str())
        .collect();
    assert_eq!(names, ["graceful_drain", "graceful_provider"]);
    let client_side = istio::wasm_filters("consumer", istio::Side::Client, &wasm_dir());
    assert_eq!(client_side.len(), 1);
    for f in server.iter().chain(&client_side) {
        let config = &f["typed_config"]["config"];
        assert!(
            config["vm_config"].get("vm_id").is_none(),
            "istiod sets no vm_id"
        );
        assert_eq!(config["failure_policy"], "FAIL_OPEN");
    }
    // Envoy runs each filter's configuration check.
    let dir = run_dir("istio-validate");
    let eds = dir.join("eds.yaml");
    write_eds(&eds, &format!("outbound|80||{SERVICE}"), &[]);
    for (name, config) in [
        (
            "provider",
            istio::provider_sidecar("10.66.0.11", APP_PORT, &wasm_dir(), "/dev/null"),
        ),
        (
            "consumer",
            istio::consumer_sidecar(
                "10.66.0.2",
                SERVICE,
                &VIP.to_string(),
                80,
                &eds.display().to_string(),
                &wasm_dir(),
                "/dev/null",
            ),
        ),
    ] {
        let path = write_config(&dir, name, &config);
        let out = Command::new(envoy_binary())
            .args(["--mode", "validate", "-c"])
            .arg(&path)
            .output()
            .unwrap_or_else(|e| panic!("envoy: {e}"));
        assert!(
            out.status.success(),
            "{name}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Waits until the sidecar's Envoy (its admin, from inside the pod) holds
/// no open connection to `host`, or panics after `deadline`: `/clusters`
/// lists each host's `cx_active`.
async fn no_connection_to(host: SocketAddr, deadline: Duration) {
    let line = format!("::{host}::cx_active::");
    let admin = SocketAddr::from(([127, 0, 0, 1], istio::ADMIN_PORT));
    eventually(
        &format!("the sidecar holds no connection to {host}"),
        deadline,
        || {
            let line = &line;
            async move {
                let r = client::get(admin, "/clusters").await.ok()?;
                let active: Vec<u64> = r
                    .text()
                    .lines()
                    .filter_map(|l| l.split_once(line.as_str())?.1.trim().parse().ok())
                    .collect();
                assert!(!active.is_empty(), "/clusters lists {host}");
                active.iter().all(|&n| n == 0).then_some(())
            }
        },
    )
    .await
}

/// What one kill costs, seen from the consumer.
#[derive(Debug)]
struct KillRun {
    requests: usize,
    failed: usize,
    retries: u64,
    evictions: u64,
}

/// Load from the consumer pod to the Service for `duration` (captured to
/// 15001), at 200 req/s over 8 connections; every sample.
fn load_for(consumer: &Pod, duration: Duration) -> Vec<Sample> {
    netns::spawn_in(&consumer.netns, move || {
        Box::pin(async move {
            let load = Load::start(
                SocketAddr::from((VIP, 80)),
                Protocol::Http1,
                200,
                8,
                Instant::now(),
            );
            tokio::time::sleep(duration).await;
            load.stop().await
        })
    })
    .join()
    .unwrap_or_else(|_| panic!("load thread"))
}

/// SIGKILL of one provider's sidecar and app (an OOM kill or a node loss)
/// while nothing is in flight on it, then load for 5 s before the registry
/// drops it, with Istio's default retry policy: what the consumer pays.
/// (With a request in flight, its reset reaches the listener's filter as a
/// UC local reply and evicts the host; `faults.rs` covers that case.)
fn kill_run(name: &str, upstream_instance: bool) -> KillRun {
    let dir = run_dir(name);
    let mut mesh = Mesh::start(&dir, upstream_instance);
    // Warm: every provider has served through the consumer.
    let warm = load_for(&mesh.consumer_pod, Duration::from_secs(2));
    assert!(
        (1..=3).all(|p| samples_of(&warm, p) > 0),
        "all providers served"
    );
    let victim = &mut mesh.providers[1];
    let _ = victim.envoy.child.kill();
    let _ = victim.app.child.kill();
    let _ = victim.envoy.child.wait();
    let _ = victim.app.child.wait();
    // The kill closes the pooled keep-alive connections to the pod; a
    // request written onto one before the consumer's Envoy reads that close
    // is reset after it was sent, which Istio's policy does not retry. That
    // is the in-flight case (`faults.rs`), not this one: wait until the
    // consumer's Envoy holds no connection to the pod.
    let victim_addr = SocketAddr::from((victim.pod.ip, APP_PORT));
    netns::spawn_in(&mesh.consumer_pod.netns, move || {
        Box::pin(async move { no_connection_to(victim_addr, Duration::from_secs(10)).await })
    })
    .join()
    .unwrap_or_else(|_| {
        panic!("the consumer's Envoy still holds a connection to {victim_addr} 10 s after the kill")
    });
    // The registry lags a killed pod by seconds (kubelet, then istiod).
    let samples = load_for(&mesh.consumer_pod, Duration::from_secs(5));
    let consumer_ip = mesh.consumer_pod.ip;
    let cluster = mesh.cluster.clone();
    let (retries, evictions) = netns::spawn_in(&mesh.node.netns, move || {
        Box::pin(async move {
            (
                retries_of(consumer_ip, &cluster).await,
                prometheus_all_scopes(consumer_ip, "graceful_consumer_evictions").await,
            )
        })
    })
    .join()
    .unwrap_or_else(|_| panic!("node thread"));
    KillRun {
        requests: samples.len(),
        failed: samples.iter().filter(|s| !s.ok).count(),
        retries,
        evictions,
    }
}

/// A WasmPlugin is always a listener filter: without the example's
/// `graceful-consumer-upstream` EnvoyFilter the listener's instance sees
/// only each request's final answer, so a refused connection that a retry
/// hid never tombstones the host, and every request that picks the dead
/// host pays a failed attempt until the registry drops it. Measured beside
/// the upstream instance that EnvoyFilter delivers (over ECDS).
#[test]
fn it_measures_what_the_upstream_instance_buys_when_a_provider_is_killed() {
    if !pods_available() {
        return;
    }
    let without = kill_run("istio-kill-listener-only", false);
    let with = kill_run("istio-kill-upstream", true);
    eprintln!("SIGKILL of one of three providers (idle), then 200 req/s for 5 s before the registry drops it, Istio's default retry policy:");
    eprintln!("  WasmPlugin only (listener instance): {without:?}");
    eprintln!("  with graceful-consumer-upstream:     {with:?}");
    for run in [&without, &with] {
        assert!(
            run.requests > 800,
            "the load ran (5 s at 200 req/s): {run:?}"
        );
    }
    assert!(
        without.failed == 0 && with.failed == 0,
        "nothing was in flight at the kill: {without:?} {with:?}"
    );
    assert_eq!(
        without.evictions, 0,
        "retries hide every refused attempt from the listener's filter: {without:?}"
    );
    assert!(
        without.retries > 50,
        "every request that picks the dead host pays a retry: {without:?}"
    );
    assert!(
        with.evictions >= 1,
        "the upstream instance evicts the killed host: {with:?}"
    );
    assert!(
        with.retries <= 10,
        "then steers every request away: {with:?}"
    );
}

/// The example's readiness probe and preStop hooks, run as the kubelet runs
/// them in the pod.
struct Hooks {
    ready: Vec<String>,
    app: Vec<String>,
    proxy: Vec<String>,
}

impl Hooks {
    fn of_example() -> Hooks {
        let template = provider_pod_spec();
        let app = container(&template, "app");
        Hooks {
            ready: exec_command(app, "app readiness", "/readinessProbe/exec/command"),
            app: exec_command(app, "app preStop", "/lifecycle/preStop/exec/command"),
            proxy: exec_command(
                container(&template, "istio-proxy"),
                "istio-proxy preStop",
                "/lifecycle/preStop/exec/command",
            ),
        }
    }

    /// The readiness probe's verdict and what it said.
    fn ready(&self, pod: &Pod) -> (bool, String) {
        let out = in_pod(pod, "app", &self.ready)
            .output()
            .unwrap_or_else(|e| panic!("readiness probe: {e}"));
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn start(&self, pod: &Pod, container: &str) -> Child {
        let command = if container == "app" {
            &self.app
        } else {
            &self.proxy
        };
        in_pod(pod, container, command)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{container} hook: {e}"))
    }
}

/// A hook's exit and what it said.
fn finished(child: Child) -> (bool, String) {
    let out = child.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A provider pod of its own: the app and a sidecar configured like
/// Istio's over `control`, `shape` applied to the pod and its config
/// first; returned once
/// the sidecar's admin answers on `admin` (`127.0.0.1`, or `::1` where the
/// bootstrap puts it on IPv6 pods) with graceful_drain serving, or just
/// answering `/ready` where `shape` took graceful_drain out.
fn lone_provider(
    node: &mut Node,
    name: &str,
    host: u8,
    dir: &Path,
    admin: std::net::IpAddr,
    control: &mut ControlPlane,
    shape: impl FnOnce(&Pod, &mut Value),
) -> (Pod, Proc, Proc) {
    let pod = node.pod(name, host);
    let mut config =
        istio::provider_sidecar(&pod.ip.to_string(), APP_PORT, &wasm_dir(), "/dev/stdout");
    shape(&pod, &mut config);
    let drains = config
        .to_string()
        .contains("\"root_id\":\"graceful_drain\"");
    let path = control.serve_sidecar(dir, name, &config);
    let app = app(&pod, name, dir);
    let envoy = sidecar(&pod, &path, dir);
    netns::spawn_in(&pod.netns, move || {
        Box::pin(async move {
            let admin = SocketAddr::from((admin, istio::ADMIN_PORT));
            let what = format!("{admin}: the sidecar's admin");
            eventually(&what, Duration::from_secs(30), || async move {
                if drains {
                    let r = client::get(admin, "/stats?filter=^wasmcustom.graceful_drain_phase$")
                        .await
                        .ok()?;
                    r.text().contains("graceful_drain_phase: 0").then_some(())
                } else {
                    client::get(admin, "/ready")
                        .await
                        .ok()
                        .filter(|r| r.status == 200)
                        .map(|_| ())
                }
            })
            .await;
        })
    })
    .join()
    .unwrap_or_else(|_| panic!("{name}: the sidecar did not come up"));
    (pod, app, envoy)
}

/// An IPv6-only pod: its only address is IPv6, and its sidecar's admin and
/// `prometheus_stats` are on `[::1]:15000`, where Istio's bootstrap puts
/// them there (and on IPv6-first dual-stack pods with `ISTIO_DUAL_STACK`).
/// The example's probe and hooks find that admin after `127.0.0.1:15000`
/// refuses, start closing through it and wait for drained.
#[test]
fn it_closes_and_drains_an_ipv6_only_pod_through_its_admin_on_ipv6_loopback() {
    if !pods_available() {
        return;
    }
    let dir = run_dir("istio-ipv6");
    let mut node = Node::new();
    // The pod reaches its control plane over IPv6 too, on the node's
    // address in the pod's prefix.
    node.add_ipv6("fd00:10:66::1/64");
    let mut control = ControlPlane::start_at(&node, "fd00:10:66::1".parse().unwrap());
    let (pod, _app, _envoy) = lone_provider(
        &mut node,
        "p6",
        61,
        &dir,
        std::net::Ipv6Addr::LOCALHOST.into(),
        &mut control,
        |pod, config| {
            pod.make_ipv6_only("fd00:10:66::61/64");
            istio::on_ipv6_loopback(config);
        },
    );
    let v4_refused = netns::spawn_in(&pod.netns, || {
        Box::pin(async { std::net::TcpStream::connect(("127.0.0.1", istio::ADMIN_PORT)).is_err() })
    })
    .join()
    .unwrap_or_else(|_| panic!("pod thread"));
    assert!(v4_refused, "nothing listens on 127.0.0.1:15000 in this pod");

    let hooks = Hooks::of_example();
    let (ready, said) = hooks.ready(&pod);
    assert!(ready, "readiness should pass while serving: {said}");
    let app_hook = hooks.start(&pod, "app");
    let proxy_hook = hooks.start(&pod, "istio-proxy");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (ready, said) = hooks.ready(&pod);
        if !ready {
            assert!(said.contains("NOT_SERVING"), "readiness: {said}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "readiness still passes 10 s after the hooks started"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (app_ok, app_said) = finished(app_hook);
    let (proxy_ok, proxy_said) = finished(proxy_hook);
    eprintln!("ipv6-only pod, app hook: {app_said}istio-proxy hook: {proxy_said}");
    assert!(app_ok && proxy_ok, "both hooks succeed");
    assert!(
        app_said.contains("closing (POST http://[::1]:15000/healthcheck/fail)")
            || proxy_said.contains("closing (POST http://[::1]:15000/healthcheck/fail)"),
        "closing started through the IPv6 admin: {app_said} {proxy_said}"
    );
    for said in [&app_said, &proxy_said] {
        assert!(
            said.contains("prestop: drained") && !said.contains("forced"),
            "drained, quiet: {said}"
        );
    }
}

/// A pod of the example's Deployment where no sidecar was injected (the
/// namespace is not labelled for injection, or is an ambient one): the
/// readiness probe passes and the preStop hook returns at once, each with
/// one line saying why. A shutdown helper never holds a pod.
#[test]
fn it_neither_blocks_nor_holds_a_pod_without_a_sidecar_or_without_graceful_drain() {
    if !pods_available() {
        return;
    }
    let dir = run_dir("istio-no-sidecar");
    let mut node = Node::new();
    let mut control = ControlPlane::start(&node);
    let pod = node.pod("bare", 62);
    let _app = app(&pod, "bare", &dir);
    let hooks = Hooks::of_example();
    let (ready, said) = hooks.ready(&pod);
    let no_admin = "no Envoy admin at http://127.0.0.1:15000 or http://[::1]:15000";
    assert!(ready, "ready without a sidecar: {said}");
    assert!(
        said.contains(no_admin) && said.lines().count() == 1,
        "one line saying why: {said}"
    );
    let started = Instant::now();
    let (ok, said) = finished(hooks.start(&pod, "app"));
    let took = started.elapsed();
    eprintln!("no sidecar: readiness and preStop said: {said}");
    assert!(ok, "the hook succeeds: {said}");
    assert!(
        said.contains(no_admin) && said.contains("not waiting") && said.lines().count() == 1,
        "one line saying why: {said}"
    );
    assert!(
        took < Duration::from_secs(3),
        "returned at once, not after {took:?}"
    );

    // A sidecar without graceful_drain (the WasmPlugin did not select the
    // pod, or its module failed to load): the admin answers, the gauge is
    // absent: ready, and the hook returns at once, each saying so.
    let (pod, _app2, _envoy) = lone_provider(
        &mut node,
        "nodrain",
        64,
        &dir,
        std::net::Ipv4Addr::LOCALHOST.into(),
        &mut control,
        |_, config| {
            let removed = istio::remove_http_filters(config, |f| {
                f.to_string().contains("envoy.wasm.runtime")
            });
            assert_eq!(removed, 2, "graceful_drain and graceful_provider removed");
        },
    );
    let (ready, said) = hooks.ready(&pod);
    assert!(
        ready && said.contains("graceful_drain is not loaded") && said.lines().count() == 1,
        "ready without graceful_drain, one line: {said}"
    );
    let started = Instant::now();
    let (ok, said) = finished(hooks.start(&pod, "app"));
    eprintln!("no graceful_drain: preStop said: {said}");
    assert!(
        ok && said.contains("graceful_drain is not loaded") && said.contains("not waiting"),
        "{said}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "returned at once"
    );
}

/// Topology-aware routing: the provider Service sets
/// `trafficDistribution: PreferClose` and the example's
/// `locality.yaml` DestinationRule applies, so istiod gives the consumer's
/// outbound cluster outlier detection and EDS priorities by zone (the
/// consumer's zone, p1 and p2, at 0; p3's at 1) and no
/// `locality_weighted_lb_config`, which Envoy would refuse beside the
/// EnvoyFilter's `override_host` (see
/// `it_accepts_the_steering_patch_and_refuses_it_beside_locality_lb`).
/// Envoy keeps the traffic in the zone; while p1 is closing, steering must
/// too: every request to p2, none to p3, where a list of every other
/// member would send p3 about half.
#[test]
fn it_keeps_steering_in_the_consumers_zone_under_istios_locality_failover() {
    if !pods_available() {
        return;
    }
    let dir = run_dir("istio-zones");
    let mut mesh = Mesh::start_with(&dir, |config, cluster| {
        istio::apply_locality_failover(config, cluster);
    });
    mesh.control.set_endpoints(load_assignment(
        &mesh.cluster,
        &in_localities(&[
            (0, "z1", &mesh.endpoints[..2]),
            (1, "z2", &mesh.endpoints[2..]),
        ]),
    ));
    let consumer_ip = mesh.consumer_pod.ip;
    let p1_pod = mesh.providers[0].pod.netns.clone();
    let node = mesh.node.netns.clone();
    let epoch = Instant::now();
    // The first second is left out below: the consumer's Envoy reads the
    // priorities written just now.
    let load = Running::start(&mesh.consumer_pod.netns, epoch);
    // 3 s in the zone, then p1 starts closing (its admin, as the hooks do).
    std::thread::sleep(Duration::from_secs(3));
    let closing_at = Instant::now();
    netns::spawn_in(&p1_pod, || {
        Box::pin(async {
            client::post(
                SocketAddr::from(([127, 0, 0, 1], istio::ADMIN_PORT)),
                "/healthcheck/fail",
            )
            .await
            .map(|r| r.status)
        })
    })
    .join()
    .unwrap_or_else(|_| panic!("p1 thread"))
    .unwrap_or_else(|e| panic!("p1's admin: {e}"));
    let tombstoned_at = netns::spawn_in(&node, move || {
        Box::pin(async move {
            eventually(
                "the consumer tombstones p1",
                Duration::from_secs(10),
                || async {
                    prometheus(consumer_ip, "graceful_consumer_evictions")
                        .await
                        .filter(|n| *n >= 1)
                },
            )
            .await;
            Instant::now()
        })
    })
    .join()
    .unwrap_or_else(|_| panic!("node thread"));
    std::thread::sleep(Duration::from_secs(3));
    let samples = load.stop();
    let ms = |t: Instant| u64::try_from(t.duration_since(epoch).as_millis()).unwrap_or(0);
    // The first second is the consumer's Envoy reading the priorities.
    let before: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.due_ms > 1000 && s.due_ms < ms(closing_at))
        .collect();
    // A request in flight when the tombstone was written may still land on
    // p1: from 100 ms after, steering decides.
    let steered: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.due_ms > ms(tombstoned_at) + 100)
        .collect();
    let share = |set: &[&Sample], p: u8| set.iter().filter(|s| s.served_by == p).count();
    eprintln!(
        "zones: before closing p1 {} p2 {} p3 {}; steered p1 {} p2 {} p3 {}; failed {}",
        share(&before, 1),
        share(&before, 2),
        share(&before, 3),
        share(&steered, 1),
        share(&steered, 2),
        share(&steered, 3),
        samples.iter().filter(|s| !s.ok).count(),
    );
    assert!(before.len() > 200 && steered.len() > 200, "the load ran");
    assert_eq!(share(&before, 3), 0, "Envoy keeps traffic in priority 0");
    assert!(
        share(&before, 1) > before.len() / 4 && share(&before, 2) > before.len() / 4,
        "both hosts of the zone serve"
    );
    assert_eq!(share(&steered, 3), 0, "steering keeps traffic in the zone");
    assert_eq!(share(&steered, 1), 0, "nothing to the closing host");
    assert_eq!(share(&steered, 2), steered.len(), "every request to p2");
    assert!(samples.iter().all(|s| s.ok), "no request failed");
    let _ = mesh;
}

/// Istio 1.30 and later translate a WasmPlugin into a TrafficExtension
/// named `NAME~istio-translated-wasmplugin`, and the filters with it. Nothing
/// of the example depends on those names (the EnvoyFilter patches only the
/// cluster; the filters share data by `vm_id`, which Istio leaves empty):
/// a provider whose sidecar has the 1.30 names drains through the hooks.
#[test]
fn it_drains_with_the_filter_names_of_istio_1_30() {
    if !pods_available() {
        return;
    }
    let dir = run_dir("istio-1-30-names");
    let mut node = Node::new();
    let mut control = ControlPlane::start(&node);
    let (pod, _app, _envoy) = lone_provider(
        &mut node,
        "p30",
        63,
        &dir,
        std::net::Ipv4Addr::LOCALHOST.into(),
        &mut control,
        |_, config| {
            assert_eq!(
                istio::use_traffic_extension_names(config),
                2,
                "graceful_drain and graceful_provider renamed"
            );
            let text = config.to_string();
            assert!(
                text.contains("default.graceful-drain~istio-translated-wasmplugin"),
                "{text}"
            );
        },
    );
    let hooks = Hooks::of_example();
    let (ready, said) = hooks.ready(&pod);
    assert!(ready, "readiness while serving: {said}");
    let (ok, said) = finished(hooks.start(&pod, "app"));
    assert!(
        ok && said.contains("prestop: drained") && !said.contains("forced"),
        "{said}"
    );
    let (ready, said) = hooks.ready(&pod);
    assert!(
        !ready && said.contains("NOT_SERVING"),
        "not ready once drained: {said}"
    );
}

/// One provider's shutdown through the example's hooks, seen by a consumer
/// whose sidecar has no graceful_consumer, while its endpoints lag the pod
/// by `lag` (istiod batches pushes up to `PILOT_DEBOUNCE_MAX`, 10 s by
/// default): (requests, failed, marked) from the hooks' start on.
fn plain_consumer_run(dir: &Path, lag: Duration, retry_503: bool) -> (usize, usize, usize) {
    let mut mesh = Mesh::start_with(dir, |config, _| {
        assert_eq!(
            istio::without_consumer_filter(config),
            1,
            "graceful_consumer removed"
        );
        if retry_503 {
            assert!(istio::retry_503(config) > 0, "a retry policy changed");
        }
    });
    let epoch = Instant::now();
    let load = Running::start(&mesh.consumer_pod.netns, epoch);
    std::thread::sleep(Duration::from_secs(2));
    let hooks = Hooks::of_example();
    let closing_at = Instant::now();
    let app_hook = hooks.start(&mesh.providers[0].pod, "app");
    let proxy_hook = hooks.start(&mesh.providers[0].pod, "istio-proxy");
    std::thread::sleep(lag);
    mesh.control.set_endpoints(xds::cluster_load_assignment(
        &mesh.cluster,
        &mesh.endpoints[1..],
    ));
    let (app_ok, app_said) = finished(app_hook);
    let (proxy_ok, _) = finished(proxy_hook);
    assert!(app_ok && proxy_ok, "the hooks: {app_said}");
    std::thread::sleep(Duration::from_secs(1));
    let samples = load.stop();
    let from = u64::try_from(closing_at.duration_since(epoch).as_millis()).unwrap_or(0);
    let after: Vec<&Sample> = samples.iter().filter(|s| s.due_ms >= from).collect();
    (
        after.len(),
        after.iter().filter(|s| !s.ok).count(),
        after.iter().filter(|s| s.marked).count(),
    )
}

/// What a consumer without graceful_consumer (the ingress gateway, another
/// namespace) meets when a provider shuts down through the example: its
/// sidecar keeps sending to the closing pod until its endpoints change.
/// The closing marks do nothing there; under its steady traffic the gate
/// passes at `consumer_update_wait` + `step_timeout` (3 s + 3 s, forced),
/// and from then every request to the pod is the provider's 503, which
/// Istio's default retry policy does not retry. Endpoints that change
/// before that: nothing fails. Later (a slow push): failures, unless the
/// route retries 503 (a VirtualService `retryOn` with `503`).
#[test]
fn it_measures_what_a_consumer_without_graceful_consumer_meets() {
    if !pods_available() {
        return;
    }
    let early = plain_consumer_run(&run_dir("istio-plain-early"), Duration::from_secs(2), false);
    let late = plain_consumer_run(&run_dir("istio-plain-late"), Duration::from_secs(10), false);
    let retried = plain_consumer_run(&run_dir("istio-plain-retry"), Duration::from_secs(10), true);
    eprintln!(
        "consumer without graceful_consumer, (requests, failed, marked) from the hooks' start:\n  endpoints after 2 s:  {early:?}\n  endpoints after 10 s: {late:?}\n  after 10 s, 503 retried: {retried:?}"
    );
    for (what, run) in [("early", early), ("late", late), ("retried", retried)] {
        assert!(run.0 > 500, "{what}: the load ran: {run:?}");
    }
    assert_eq!(early.1, 0, "endpoints before the gate: nothing fails");
    assert!(
        late.1 > 0,
        "endpoints after the gate: the provider's 503s reach the client"
    );
    assert_eq!(retried.1, 0, "a route that retries 503 loses nothing");
}

/// The example's hooks start closing with `POST /healthcheck/fail` on the
/// pod's admin. Envoy then drains every listener of drain type DEFAULT
/// (`drainClose()`), where Istio's own shutdown drains only inbound
/// (`drain_listeners?inboundonly`). The example's EnvoyFilter
/// `graceful-outbound-drain-type` makes the outbound listeners MODIFY_ONLY.
/// Measured on the consumer pod (a pod that calls out, shutting down
/// through the same hooks): its app's calls through its own sidecar keep
/// their keep-alive connections once the admin says fail. (Without the
/// patch: every answer said `connection: close`; 0 of 705 failed, as the
/// client honoured it.)
#[test]
fn it_keeps_a_pods_outbound_calls_on_their_connections_after_healthcheck_fail() {
    if !pods_available() {
        return;
    }
    let dir = run_dir("istio-outbound-fail");
    let mesh = Mesh::start(&dir, false);
    let epoch = Instant::now();
    let netns = mesh.consumer_pod.netns.clone();
    let load = Running::start(&netns, epoch);
    let probe = |netns: String| {
        netns::spawn_in(&netns, || {
            Box::pin(async {
                // Two requests on one keep-alive connection: the first's
                // `connection` header, and whether the second could follow.
                let mut c = client::Conn::http1(SocketAddr::from((VIP, 80))).await?;
                let first = c.get("/").await?;
                let second = c.get("/").await;
                Ok::<_, String>((first.header("connection"), second.is_ok()))
            })
        })
        .join()
        .unwrap_or_else(|_| panic!("probe thread"))
        .unwrap_or_else(|e| panic!("probe: {e}"))
    };
    std::thread::sleep(Duration::from_secs(2));
    let before = probe(netns.clone());
    let failed_at = Instant::now();
    let status = netns::spawn_in(&netns, || {
        Box::pin(async {
            client::post(
                SocketAddr::from(([127, 0, 0, 1], istio::ADMIN_PORT)),
                "/healthcheck/fail",
            )
            .await
            .map(|r| r.status)
        })
    })
    .join()
    .unwrap_or_else(|_| panic!("admin thread"));
    assert_eq!(status, Ok(200), "the consumer pod's admin");
    std::thread::sleep(Duration::from_millis(500));
    let after = probe(netns.clone());
    std::thread::sleep(Duration::from_secs(3));
    let samples = load.stop();
    let from = u64::try_from(failed_at.duration_since(epoch).as_millis()).unwrap_or(0);
    let (before_fail, after_fail): (Vec<&Sample>, Vec<&Sample>) =
        samples.iter().partition(|s| s.due_ms < from);
    let failed = |set: &[&Sample]| set.iter().filter(|s| !s.ok).count();
    eprintln!(
        "outbound after /healthcheck/fail: a keep-alive connection's first answer says connection: {:?} (before: {:?}), a second request on it {}; load: {} requests before, {} failed; {} after, {} failed",
        after.0,
        before.0,
        if after.1 { "succeeded" } else { "found it closed" },
        before_fail.len(),
        failed(&before_fail),
        after_fail.len(),
        failed(&after_fail),
    );
    assert_eq!(before, (None, true), "keep-alive before");
    assert_eq!(
        after,
        (None, true),
        "after /healthcheck/fail the MODIFY_ONLY outbound listener keeps the connection"
    );
    assert!(after_fail.len() > 400, "the load ran on");
    assert_eq!(
        failed(&after_fail),
        0,
        "the app's outbound calls lose nothing"
    );
    let _ = mesh;
}

/// The upstream instance's EnvoyFilter restates what the consumer's
/// WasmPlugin says (the module, the plugin's config, fail-open), plus what
/// makes it the upstream instance: a user who edits one must edit the
/// other, and this says where they drifted.
#[test]
fn it_keeps_the_upstream_instance_in_step_with_the_consumer_wasmplugin() {
    let plugin = istio::of_kind("WasmPlugin")
        .into_iter()
        .find(|p| p["spec"]["pluginName"] == "graceful_consumer")
        .unwrap_or_else(|| panic!("no graceful_consumer WasmPlugin"));
    let filter = istio::of_kind("EnvoyFilter")
        .into_iter()
        .find(|f| f["metadata"]["name"] == istio::UPSTREAM_INSTANCE)
        .unwrap_or_else(|| panic!("no EnvoyFilter {}", istio::UPSTREAM_INSTANCE));
    assert_eq!(
        filter["spec"]["workloadSelector"]["labels"], plugin["spec"]["selector"]["matchLabels"],
        "the same pods"
    );
    let extension = filter["spec"]["configPatches"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["applyTo"] == "EXTENSION_CONFIG"))
        .map(|p| p["patch"]["value"]["typed_config"]["config"].clone())
        .unwrap_or_else(|| panic!("no EXTENSION_CONFIG patch"));
    assert_eq!(
        extension["vm_config"]["code"]["remote"]["http_uri"]["uri"], plugin["spec"]["url"],
        "the same module"
    );
    assert_eq!(extension["root_id"], plugin["spec"]["pluginName"]);
    assert_eq!(extension["failure_policy"], "FAIL_OPEN");
    assert_eq!(plugin["spec"]["failStrategy"], "FAIL_OPEN");
    assert_eq!(extension["vm_config"]["configuration"]["value"], "upstream");
    let configured: Value = serde_json::from_str(
        extension["configuration"]["value"]
            .as_str()
            .unwrap_or_else(|| panic!("no configuration string")),
    )
    .unwrap_or_else(|e| panic!("configuration: {e}"));
    assert_eq!(
        configured, plugin["spec"]["pluginConfig"],
        "the same plugin config"
    );
}
