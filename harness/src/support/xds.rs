//! Config over a real xDS stream: `tools/xds_server.py`, a stand-in for a
//! mesh's control plane (istiod, Envoy Gateway) that speaks its protocol
//! (ADS over gRPC, state of the world or delta) from a snapshot file; each
//! [`XdsServer::push`] is a new version on every open stream. Not istiod:
//! the resources are Envoy's own, written by the test.
//!
//! [`AdsConfig`] turns a rendered sidecar config into what such a control
//! plane sends: the bootstrap keeps the static clusters (or, with
//! [`AdsConfig::clusters_over_cds`], only those a bootstrap has) and gets
//! its listeners over LDS, and the HTTP filters it names get their config
//! over ECDS (Istio's way with wasm filters).

use std::fs;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::process::{Child, Command};

use crate::support::envoy::{in_localities, load_assignment, repo_root, scratch_path, EnvoySpec};
use crate::support::native::Delivery;

pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
pub const EXTENSION_CONFIG: &str = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig";
pub const ENDPOINTS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// The config source istiod and Envoy Gateway both give what they serve:
/// ADS, waiting for the answer however long it takes
/// (`initial_fetch_timeout: 0s`; istiod's `defaultConfigSource` in
/// `pilot/pkg/networking/core/extension/extensionfilter.go` and the EDS
/// config of `cluster_builder.go`, Envoy Gateway's `makeConfigSource` in
/// `internal/xds/translator/listener.go` and its bootstrap's LDS and CDS).
pub fn ads_source() -> Value {
    json!({"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"})
}

/// A cluster's endpoints as EDS sends them (one locality, priority 0).
pub fn cluster_load_assignment(cluster: &str, endpoints: &[SocketAddr]) -> Value {
    load_assignment(cluster, &in_localities(&[(0, "", endpoints)]))
}

/// The Python with grpcio and xds-protos (`make xds-tools`), or
/// `GRACEFUL_XDS_PYTHON`.
pub fn python() -> PathBuf {
    std::env::var_os("GRACEFUL_XDS_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv/xds/bin/python"))
}

/// A running `tools/xds_server.py`. Killed on drop.
pub struct XdsServer {
    /// Held for its `kill_on_drop`.
    _child: Child,
    /// The address it binds.
    pub ip: IpAddr,
    pub port: u16,
    snapshot: PathBuf,
    log: PathBuf,
    version: u64,
}

impl XdsServer {
    /// Starts the server on 127.0.0.1 (serving nothing until the first
    /// push).
    pub async fn start(name: &str) -> XdsServer {
        XdsServer::start_at(name, None, IpAddr::V4(Ipv4Addr::LOCALHOST)).await
    }

    /// Starts the server inside network namespace `netns` (a node's, where
    /// its pods reach it), bound to `ip`.
    pub async fn start_in(name: &str, netns: &str, ip: IpAddr) -> XdsServer {
        XdsServer::start_at(name, Some(netns), ip).await
    }

    async fn start_at(name: &str, netns: Option<&str>, ip: IpAddr) -> XdsServer {
        let snapshot = scratch_path(&format!("{name}-xds-snapshot"), "json");
        let port_file = scratch_path(&format!("{name}-xds-port"), "txt");
        let log = scratch_path(&format!("{name}-xds"), "log");
        let out = fs::File::create(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        let err = out.try_clone().unwrap_or_else(|e| panic!("{e}"));
        let mut command = match netns {
            Some(netns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", netns]).arg(python());
                c
            }
            None => Command::new(python()),
        };
        let mut child = command
            .arg(repo_root().join("tools/xds_server.py"))
            .arg("--listen")
            .arg(ip.to_string())
            .arg("--snapshot")
            .arg(&snapshot)
            .arg("--port-file")
            .arg(&port_file)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run {} ({e}): run `make xds-tools` first",
                    python().display()
                )
            });
        let deadline = Instant::now() + Duration::from_secs(30);
        let port = loop {
            if let Some(port) = fs::read_to_string(&port_file)
                .ok()
                .and_then(|p| p.trim().parse().ok())
            {
                break port;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "xds_server.py exited ({status}):\n{}",
                    fs::read_to_string(&log).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "xds_server.py not serving in 30 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        XdsServer {
            _child: child,
            ip,
            port,
            snapshot,
            log,
            version: 0,
        }
    }

    /// Where it serves.
    pub fn address(&self) -> SocketAddr {
        SocketAddr::new(self.ip, self.port)
    }

    /// Serves `resources` (type URL → resources) as the next version;
    /// returns it.
    pub fn push(&mut self, resources: &Value) -> u64 {
        self.push_with_nodes(resources, &json!({}))
    }

    /// [`XdsServer::push`], each proxy also served its own resources:
    /// `nodes` maps a node id to resources as `resources` holds them.
    pub fn push_with_nodes(&mut self, resources: &Value, nodes: &Value) -> u64 {
        self.version += 1;
        let doc =
            json!({"version": self.version.to_string(), "resources": resources, "nodes": nodes});
        let tmp = self.snapshot.with_extension("tmp");
        fs::write(&tmp, doc.to_string()).unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
        fs::rename(&tmp, &self.snapshot)
            .unwrap_or_else(|e| panic!("{}: {e}", self.snapshot.display()));
        self.version
    }

    /// What the server logged: one line per response sent and per NACK.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// A sidecar config split the way a control plane sends it.
pub struct AdsConfig {
    /// The bootstrap: admin, static clusters, the `xds` cluster and ADS.
    pub bootstrap: Value,
    /// The listeners, each with `@type`, served over LDS.
    pub listeners: Vec<Value>,
    /// The named HTTP filters' configs (`TypedExtensionConfig`), over ECDS.
    pub extensions: Vec<Value>,
    /// The clusters served over CDS (none unless
    /// [`AdsConfig::clusters_over_cds`]).
    pub clusters: Vec<Value>,
    /// The route configurations served over RDS (none unless
    /// [`AdsConfig::routes_over_rds`]).
    pub routes: Vec<Value>,
    /// For the native delivery: the directory Envoy must search for the
    /// module (`ENVOY_DYNAMIC_MODULES_SEARCH_PATH`), see [`by_module_name`].
    pub module_search_path: Option<PathBuf>,
}

/// The protos the stand-in serves with (xds-protos 1.85.0, the newest on
/// PyPI) predate `dynamic_module_config.module` and `metrics_namespace`:
/// a native filter names its module the older way (`name`, looked up as
/// `lib<name>.so` in `ENVOY_DYNAMIC_MODULES_SEARCH_PATH`) and its stats keep
/// Envoy's default namespace (`dynamicmodulescustom`). Returns the module's
/// directory.
fn by_module_name(typed_config: &mut Value) -> Option<PathBuf> {
    let module = typed_config.get_mut("dynamic_module_config")?;
    let file = PathBuf::from(
        module
            .get("module")?
            .get("local")?
            .get("filename")?
            .as_str()?,
    );
    let name = file.file_stem()?.to_str()?.strip_prefix("lib")?.to_string();
    let map = module.as_object_mut()?;
    map.remove("module");
    map.remove("metrics_namespace");
    map.insert("name".into(), json!(name));
    file.parent().map(PathBuf::from)
}

impl AdsConfig {
    /// Splits `rendered` (a sidecar config, YAML): its listeners over LDS
    /// from an ADS server on 127.0.0.1:`port`, its EDS clusters' endpoints
    /// over EDS (a file source becomes ADS), and the HTTP filters named in
    /// `over_ecds` that it has over ECDS (each keeps its place and its
    /// `disabled`).
    pub fn split(rendered: &str, node: &str, port: u16, over_ecds: &[&str]) -> AdsConfig {
        let bootstrap: Value =
            serde_yaml::from_str(rendered).unwrap_or_else(|e| panic!("rendered config: {e}"));
        AdsConfig::split_to(
            bootstrap,
            node,
            SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            over_ecds,
        )
    }

    /// [`AdsConfig::split`] of a config already parsed, for an ADS server
    /// at `xds`.
    pub fn split_to(
        mut bootstrap: Value,
        node: &str,
        xds: SocketAddr,
        over_ecds: &[&str],
    ) -> AdsConfig {
        let statics = &mut bootstrap["static_resources"];
        let mut listeners = match statics["listeners"].take() {
            Value::Array(l) => l,
            other => panic!("no static listeners: {other}"),
        };
        if let Some(map) = statics.as_object_mut() {
            map.remove("listeners");
        }
        let mut extensions = Vec::new();
        let mut module_search_path = None;
        for listener in &mut listeners {
            listener["@type"] = json!(LISTENER);
            for chain in listener["filter_chains"]
                .as_array_mut()
                .into_iter()
                .flatten()
            {
                for filter in chain["filters"].as_array_mut().into_iter().flatten() {
                    let http_filters = filter
                        .get_mut("typed_config")
                        .and_then(|t| t.get_mut("http_filters"))
                        .and_then(Value::as_array_mut);
                    for http_filter in http_filters.into_iter().flatten() {
                        let name = http_filter["name"].as_str().unwrap_or_default().to_string();
                        if !over_ecds.contains(&name.as_str()) {
                            // Served inline over LDS: in the stand-in's
                            // protos too (a config Envoy Gateway sends).
                            if let Some(dir) = by_module_name(&mut http_filter["typed_config"]) {
                                module_search_path = Some(dir);
                            }
                            continue;
                        }
                        let mut typed_config = http_filter["typed_config"].take();
                        if let Some(dir) = by_module_name(&mut typed_config) {
                            module_search_path = Some(dir);
                        }
                        let type_url = typed_config["@type"].clone();
                        extensions.push(json!({
                            "@type": EXTENSION_CONFIG,
                            "name": name,
                            "typed_config": typed_config,
                        }));
                        if let Some(map) = http_filter.as_object_mut() {
                            map.remove("typed_config");
                        }
                        http_filter["config_discovery"] = json!({
                            "config_source": {"ads": {}, "resource_api_version": "V3"},
                            "type_urls": [type_url],
                        });
                    }
                }
            }
        }
        bootstrap["node"] = json!({"id": node, "cluster": node});
        bootstrap["static_resources"]["clusters"]
            .as_array_mut()
            .unwrap_or_else(|| panic!("no static clusters"))
            .push(json!({
                "name": "xds",
                "type": "STATIC",
                "connect_timeout": "1s",
                "typed_extension_protocol_options": {
                    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                        "explicit_http_config": {"http2_protocol_options": {}},
                    }
                },
                "load_assignment": {"cluster_name": "xds", "endpoints": [{"lb_endpoints": [
                    {"endpoint": {"address": {"socket_address": {
                        "address": xds.ip().to_string(), "port_value": xds.port()}}}}
                ]}]},
            }));
        bootstrap["dynamic_resources"] = json!({
            "ads_config": {
                "api_type": "GRPC",
                "transport_api_version": "V3",
                "grpc_services": [{"envoy_grpc": {"cluster_name": "xds"}}],
                "set_node_on_first_message_only": true,
            },
            "lds_config": {"ads": {}, "resource_api_version": "V3"},
        });
        for cluster in bootstrap["static_resources"]["clusters"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            if let Some(eds) = cluster
                .get_mut("eds_cluster_config")
                .and_then(|e| e.get_mut("eds_config"))
            {
                *eds = json!({"ads": {}, "resource_api_version": "V3"});
            }
        }
        AdsConfig {
            bootstrap,
            listeners,
            extensions,
            clusters: Vec::new(),
            routes: Vec::new(),
            module_search_path,
        }
    }

    /// Moves every static cluster but `xds` and those named in `keep` to
    /// CDS (over ADS), as a mesh's control plane serves a proxy's service
    /// clusters while its bootstrap holds only its own.
    pub fn clusters_over_cds(&mut self, keep: &[&str]) {
        let statics = match self.bootstrap["static_resources"]["clusters"].take() {
            Value::Array(c) => c,
            other => panic!("no static clusters: {other}"),
        };
        let (kept, served): (Vec<Value>, Vec<Value>) = statics.into_iter().partition(|c| {
            let name = c["name"].as_str().unwrap_or_default();
            name == "xds" || keep.contains(&name)
        });
        self.bootstrap["static_resources"]["clusters"] = Value::Array(kept);
        self.clusters = served
            .into_iter()
            .map(|mut c| {
                c["@type"] = json!(CLUSTER);
                c
            })
            .collect();
        self.bootstrap["dynamic_resources"]["cds_config"] =
            json!({"ads": {}, "resource_api_version": "V3"});
    }

    /// Delta ADS (`DELTA_GRPC`, istiod's and Envoy Gateway's default)
    /// through the bootstrap's cluster named `cluster` (each control plane
    /// names its own), with LDS, and CDS where clusters are served, from
    /// [`ads_source`].
    pub fn delta_through(&mut self, cluster: &str) {
        let dynamic = &mut self.bootstrap["dynamic_resources"];
        dynamic["ads_config"]["api_type"] = json!("DELTA_GRPC");
        dynamic["ads_config"]["grpc_services"] = json!([{"envoy_grpc": {"cluster_name": cluster}}]);
        dynamic["lds_config"] = ads_source();
        if dynamic.get("cds_config").is_some() {
            dynamic["cds_config"] = ads_source();
        }
        for c in self.bootstrap["static_resources"]["clusters"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            if c["name"] == "xds" {
                c["name"] = json!(cluster);
                c["load_assignment"]["cluster_name"] = json!(cluster);
            }
        }
    }

    /// Moves each served listener's inline `route_config` to RDS, fetched
    /// from `source` by name: in its `filter_chains` and in its
    /// `default_filter_chain` (where Envoy Gateway puts a plain HTTP
    /// listener's HCM: `makeConfigSource`, `routeConfigName`).
    pub fn routes_over_rds(&mut self, source: &Value) {
        let mut routes = Vec::new();
        for listener in self.listeners.iter_mut().filter_map(Value::as_object_mut) {
            let mut chains: Vec<&mut Value> = Vec::new();
            for (key, value) in listener.iter_mut() {
                match key.as_str() {
                    "filter_chains" => chains.extend(value.as_array_mut().into_iter().flatten()),
                    "default_filter_chain" => chains.push(value),
                    _ => {}
                }
            }
            for chain in chains {
                for filter in chain["filters"].as_array_mut().into_iter().flatten() {
                    let Some(hcm) = filter
                        .get_mut("typed_config")
                        .and_then(Value::as_object_mut)
                    else {
                        continue;
                    };
                    let Some(mut route) = hcm.remove("route_config") else {
                        continue;
                    };
                    let name = route["name"].clone();
                    route["@type"] = json!(ROUTE);
                    routes.push(route);
                    hcm.insert(
                        "rds".into(),
                        json!({"config_source": source, "route_config_name": name}),
                    );
                }
            }
        }
        self.routes = routes;
    }

    /// Moves the listeners named in `keep` back to the bootstrap's static
    /// listeners, where a mesh's bootstrap has some of its own.
    pub fn static_listeners(&mut self, keep: &[&str]) {
        let (kept, served): (Vec<Value>, Vec<Value>) = self
            .listeners
            .drain(..)
            .partition(|l| keep.contains(&l["name"].as_str().unwrap_or_default()));
        self.listeners = served;
        self.bootstrap["static_resources"]["listeners"] = Value::Array(
            kept.into_iter()
                .map(|mut l| {
                    if let Some(map) = l.as_object_mut() {
                        map.remove("@type");
                    }
                    l
                })
                .collect(),
        );
    }

    /// The resources to push: listeners, extension configs and, when some
    /// are served, clusters and routes.
    pub fn resources(&self) -> Value {
        let mut resources = json!({LISTENER: self.listeners, EXTENSION_CONFIG: self.extensions});
        if !self.clusters.is_empty() {
            resources[CLUSTER] = json!(self.clusters);
        }
        if !self.routes.is_empty() {
            resources[ROUTE] = json!(self.routes);
        }
        resources
    }

    /// `spec` running this config's bootstrap (the delivery is in it
    /// already; a native module is found by name, see [`by_module_name`]).
    pub fn spec(&self, spec: EnvoySpec) -> EnvoySpec {
        let bootstrap = serde_json::to_string_pretty(&self.bootstrap).unwrap_or_default();
        let mut spec = spec.with_config(bootstrap);
        spec.delivery = Delivery::Wasm;
        match &self.module_search_path {
            Some(dir) => spec.env("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", dir.display()),
            None => spec,
        }
    }

    /// The extension config of filter `name`.
    pub fn extension_mut(&mut self, name: &str) -> &mut Value {
        self.extensions
            .iter_mut()
            .find(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("no extension config {name}"))
    }
}
