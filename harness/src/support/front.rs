//! The front-proxy role on real Envoy (`docs/design/front-proxy-drain.md`):
//! replicas of `envoy/front-proxy.yaml` in front of backends with no
//! sidecar (each a demo app on a loopback address of its own, as a pod has
//! its own IP), the front endpoints spoken from a backend's address, and
//! `graceful-hook front` run as a backend's preStop would run it. Also the
//! shipped native form of the config (`envoy/native/front-proxy.yaml`).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::support::client::{self, Conn, Response};
use crate::support::envoy::{candidate_port, eventually, write_eds, Envoy, EnvoySpec};
use crate::support::native::native_form;
use crate::support::upstream::{hook_binary, AppConfig, Upstream};

/// The template in `envoy/`.
pub const TEMPLATE: &str = "front-proxy.yaml";
/// The front endpoints, under graceful_consumer's `/graceful` prefix.
pub const CLOSING: &str = "/graceful/front/closing";
pub const DRAINED: &str = "/graceful/front/drained";
pub const SERVING: &str = "/graceful/front/serving";
pub const STATUS: &str = "/graceful/front/status";
/// The cluster the fronts balance over.
pub const CLUSTER: &str = "backends";

/// `envoy/native/front-proxy.yaml`, as `make native-configs` writes it
/// ([`native_form`]); (path, text). Its three graceful filters (public,
/// front_control, upstream) must all be rewritten.
pub fn native_file() -> Result<(PathBuf, String), String> {
    let (path, text, n) = native_form(TEMPLATE)?;
    if n != 3 {
        return Err(format!(
            "envoy/{TEMPLATE}: {n} graceful filters rewritten, expected 3 (public, front_control, upstream)"
        ));
    }
    Ok((path, text))
}

/// A port free on every one of `ips` now, below the ephemeral range: the
/// backends' common port (each backend has an address of its own, as pods
/// do, all serving on one port).
pub fn port_free_on(ips: &[Ipv4Addr]) -> u16 {
    for _ in 0..50 {
        let port = candidate_port();
        if ips.iter().all(|ip| TcpListener::bind((*ip, port)).is_ok()) {
            return port;
        }
    }
    panic!("no port free on {ips:?}");
}

/// Backends with no sidecar: one demo app per address, all on one port,
/// named `p1`, `p2`, ... in order (`x-served-by`).
pub struct Backends {
    pub apps: Vec<Upstream>,
}

impl Backends {
    pub async fn start(ips: &[Ipv4Addr]) -> Backends {
        let port = port_free_on(ips);
        let mut apps = Vec::new();
        for (i, ip) in ips.iter().enumerate() {
            let config = AppConfig {
                name: format!("p{}", i + 1),
                latency: Duration::ZERO,
            };
            let app = Upstream::start_with(SocketAddr::from((*ip, port)), config)
                .await
                .unwrap_or_else(|e| panic!("backend at {ip}:{port}: {e}"));
            apps.push(app);
        }
        Backends { apps }
    }

    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.apps.iter().map(|a| a.addr).collect()
    }

    pub fn ip(&self, i: usize) -> IpAddr {
        self.apps[i].addr.ip()
    }

    /// Requests each app has served (not `/graceful/` ones), in order.
    pub fn counts(&self) -> Vec<u64> {
        self.apps.iter().map(Upstream::app_requests).collect()
    }
}

/// One front replica: `envoy/front-proxy.yaml` on loopback, its listeners
/// at ports of Envoy's choosing.
pub struct FrontProxy {
    pub envoy: Envoy,
    /// What clients reach.
    pub public: SocketAddr,
    /// `front_control`: where backends speak the front endpoints.
    pub control: SocketAddr,
}

impl FrontProxy {
    /// The shipped config (its default plugin configurations) over the
    /// EDS file `eds`, returned once Envoy has `members` hosts in
    /// `backends`.
    pub async fn start(name: &str, eds: &Path, members: u64) -> FrontProxy {
        FrontProxy::start_spec(FrontProxy::spec(name, eds), members).await
    }

    /// The spec [`FrontProxy::start`] runs, for a test to change first.
    pub fn spec(name: &str, eds: &Path) -> EnvoySpec {
        EnvoySpec::new(name, TEMPLATE)
            .set("LISTEN_ADDRESS", "127.0.0.1")
            .set("PUBLIC_PORT", 0)
            .set("CONTROL_ADDRESS", "127.0.0.1")
            .set("CONTROL_PORT", 0)
            .set("EDS_PATH", eds.display())
    }

    pub async fn start_spec(spec: EnvoySpec, members: u64) -> FrontProxy {
        let envoy = spec.start().await;
        let front = FrontProxy {
            public: envoy.listener("public").await,
            control: envoy.listener("front_control").await,
            envoy,
        };
        front.wait_members(members).await;
        front
    }

    /// Waits until `backends` has `n` members.
    pub async fn wait_members(&self, n: u64) {
        let stat = format!("cluster.{CLUSTER}.membership_total");
        eventually(
            &format!("envoy {}: {n} members in {CLUSTER}", self.envoy.name),
            Duration::from_secs(10),
            || async { (self.envoy.stat(&stat).await == Some(n)).then_some(()) },
        )
        .await;
    }

    /// Per-host requests in flight in `backends`, as the admin's
    /// `/clusters?format=json` lists them (`rq_active`; absent reads 0).
    pub async fn rq_active(&self) -> HashMap<SocketAddr, u64> {
        let r = client::get(self.envoy.admin, "/clusters?format=json")
            .await
            .unwrap_or_else(|e| panic!("envoy {}: /clusters: {e}", self.envoy.name));
        let json: serde_json::Value = serde_json::from_slice(&r.body)
            .unwrap_or_else(|e| panic!("/clusters JSON: {e}: {}", r.text()));
        let mut out = HashMap::new();
        let clusters = json["cluster_statuses"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for c in clusters.iter().filter(|c| c["name"] == CLUSTER) {
            for h in c["host_statuses"].as_array().into_iter().flatten() {
                let socket = &h["address"]["socket_address"];
                let (Some(ip), Some(port)) = (
                    socket["address"]
                        .as_str()
                        .and_then(|a| a.parse::<IpAddr>().ok()),
                    socket["port_value"]
                        .as_u64()
                        .and_then(|p| u16::try_from(p).ok()),
                ) else {
                    continue;
                };
                let active = h["stats"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|s| s["name"] == "rq_active")
                    .and_then(|s| {
                        s["value"]
                            .as_str()
                            .and_then(|v| v.parse().ok())
                            .or(s["value"].as_u64())
                    })
                    .unwrap_or(0);
                out.insert(SocketAddr::new(ip, port), active);
            }
        }
        out
    }
}

/// One request to a front's control listener from `source` (a backend's
/// address), on a connection of its own.
pub async fn from(
    control: SocketAddr,
    source: IpAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Response {
    let mut conn = Conn::http1_from(control, source)
        .await
        .unwrap_or_else(|e| panic!("connect {control} from {source}: {e}"));
    conn.send(method, path, headers, Bytes::new())
        .await
        .unwrap_or_else(|e| panic!("{method} {path} from {source}: {e}"))
}

/// The JSON of an answer (null where it is none).
pub fn json(r: &Response) -> serde_json::Value {
    serde_json::from_slice(&r.body).unwrap_or(serde_json::Value::Null)
}

/// The first string under `key` at any depth of `v`.
pub fn find_str<'a>(v: &'a serde_json::Value, key: &str) -> Option<&'a str> {
    match v {
        serde_json::Value::Object(m) => m
            .get(key)
            .and_then(serde_json::Value::as_str)
            .or_else(|| m.values().find_map(|x| find_str(x, key))),
        serde_json::Value::Array(a) => a.iter().find_map(|x| find_str(x, key)),
        _ => None,
    }
}

/// Waits until `front` knows `source` as a member (its `status` answers
/// it 200: the admin's membership is loaded), so that a `closing` from it
/// is not refused as `not_a_member`.
pub async fn until_known(front: &FrontProxy, source: IpAddr) {
    eventually(
        &format!("envoy {}: {source} known as a member", front.envoy.name),
        Duration::from_secs(15),
        || async {
            let r = from(front.control, source, "GET", STATUS, &[]).await;
            (r.status == 200).then_some(())
        },
    )
    .await;
}

/// What one `graceful-hook front` run did.
#[derive(Debug)]
pub struct HookRun {
    pub code: Option<i32>,
    /// Its one line (stdout).
    pub line: String,
    pub stderr: String,
    pub started: Instant,
    /// When it exited: after the last acknowledgement, or at its deadline.
    pub ended: Instant,
}

impl HookRun {
    pub fn took(&self) -> Duration {
        self.ended - self.started
    }
}

/// Runs `graceful-hook front ARGS` (the debug build, or `GRACEFUL_HOOK`)
/// to its end.
pub async fn run_hook(args: &[String]) -> HookRun {
    let bin = hook_binary();
    let started = Instant::now();
    let out = tokio::process::Command::new(&bin)
        .arg("front")
        .args(args)
        .output()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e} (build it: cargo build -p graceful-hook)",
                bin.display()
            )
        });
    HookRun {
        code: out.status.code(),
        line: String::from_utf8_lossy(&out.stdout).trim().to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        started,
        ended: Instant::now(),
    }
}

/// The hook's arguments: every front's control listener, from `source`,
/// waiting at most `wait`.
pub fn hook_args(fronts: &[&FrontProxy], source: IpAddr, wait: &str) -> Vec<String> {
    let mut args = Vec::new();
    for f in fronts {
        args.push("--front".to_string());
        args.push(format!("http://{}", f.control));
    }
    args.extend([
        "--source".to_string(),
        source.to_string(),
        "--wait".to_string(),
        wait.to_string(),
    ]);
    args
}

/// An EDS file listing `backends` in [`CLUSTER`].
pub fn eds_for(path: &Path, backends: &Backends) {
    write_eds(path, CLUSTER, &backends.addrs());
}
