//! Envoy Gateway's translation, rebuilt for `examples/envoy-gateway`: no
//! Kubernetes and no Envoy Gateway run here, so this does, in a few lines
//! each, what Envoy Gateway's translator does with the example's policies
//! (each function names the file of envoyproxy/gateway it follows, as of
//! v1.9): the listener's wasm filter from the EnvoyExtensionPolicy, the
//! route's retries and the cluster's load balancing from the
//! BackendTrafficPolicy, the EnvoyPatchPolicy's JSON patches applied to the
//! cluster ([`apply_patch_policy`], on [`json_patch`]), and an Envoy config
//! shaped as a gateway's around them ([`gateway_config`]). For backends with
//! no sidecar ([`FrontExample`], `front-drain.yaml`): the Gateway's HTTP
//! listener, named as Envoy Gateway names it ([`xds_listener_name`]), with
//! its HCM in `default_filter_chain`, patched by the control port's
//! EnvoyPatchPolicy ([`apply_patches`] with [`LISTENER_TYPE`]).
//! `tests/examples_envoy_gateway.rs` hands the result to a real Envoy.
//!
//! What differs from a gateway: the module is read from `dist/` (Envoy
//! Gateway serves the same bytes from its own HTTP server), and the config
//! is served over ADS ([`over_xds`]) by a stand-in, not Envoy Gateway.

pub mod json_patch;

use std::fs;
use std::path::Path;

use graceful_core::consumer::config::ConsumerConfig;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::support::envoy::{repo_root, wasm_dir};

/// The EnvoyExtensionPolicy and the BackendTrafficPolicy, as users apply them.
pub const EXAMPLE: &str = "examples/envoy-gateway/extension-policy.yaml";
/// The EnvoyPatchPolicy, the optional alternative to the BackendTrafficPolicy's override.
pub const PATCH: &str = "examples/envoy-gateway/envoy-patch-policy.yaml";
/// Backends with no sidecar: the EnvoyExtensionPolicy with `front`, the
/// control port's EnvoyPatchPolicy, the headless Service of the proxy pods
/// and a backend Deployment with its Service.
pub const FRONT: &str = "examples/envoy-gateway/front-drain.yaml";
/// The xDS type of the resources the EnvoyPatchPolicy patches.
pub const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// The xDS type of the listener the control port's EnvoyPatchPolicy patches.
pub const LISTENER_TYPE: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
/// The name of the Gateway's HTTP listener (`spec.listeners[].name`) the
/// examples assume.
pub const HTTP_SECTION: &str = "http";
/// The Gateway listener's port the examples assume.
pub const HTTP_PORT: u32 = 80;
/// The labels Envoy Gateway puts on a Gateway's proxy pods, whose values
/// are the Gateway's name and namespace (internal/gatewayapi/translator.go,
/// `OwningGatewayNameLabel`, `OwningGatewayNamespaceLabel`); its own
/// Service selects the pods by them and by [`ENVOY_APP_LABELS`]
/// (internal/infrastructure/kubernetes/proxy/resource_provider.go,
/// `Service()`, `stableSelector()`).
pub const OWNING_GATEWAY_NAME: &str = "gateway.envoyproxy.io/owning-gateway-name";
pub const OWNING_GATEWAY_NAMESPACE: &str = "gateway.envoyproxy.io/owning-gateway-namespace";
/// internal/infrastructure/kubernetes/proxy/resource.go, `EnvoyAppLabel`.
pub const ENVOY_APP_LABELS: [(&str, &str); 3] = [
    ("app.kubernetes.io/name", "envoy"),
    ("app.kubernetes.io/component", "proxy"),
    ("app.kubernetes.io/managed-by", "envoy-gateway"),
];
/// The cluster Envoy Gateway's bootstrap points at the proxy's admin
/// (internal/xds/bootstrap/bootstrap.yaml.tpl, 127.0.0.1:19000).
pub const ADMIN_CLUSTER: &str = "prometheus_stats";

// ---------------------------------------------------------------------------
// The documents

/// Every YAML document of `path` (from the repository root, or absolute),
/// as JSON values.
fn documents(path: &str) -> Vec<Value> {
    let text = fs::read_to_string(repo_root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| {
            let yaml = serde_yaml::Value::deserialize(d).unwrap_or_else(|e| panic!("{path}: {e}"));
            serde_json::to_value(yaml).unwrap_or_else(|e| panic!("{path}: {e}"))
        })
        .collect()
}

/// The one document of kind `kind`.
fn one(docs: &[Value], kind: &str) -> Value {
    let found: Vec<&Value> = docs.iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "exactly one {kind} expected");
    found[0].clone()
}

/// The string `v`; panics naming `what` if it is not one.
pub fn str_field<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what}: expected a string, got {v}"))
}

/// The three policies of the example, as a user would apply them.
#[derive(Debug, Clone)]
pub struct Example {
    /// EnvoyExtensionPolicy: the filter.
    pub eep: Value,
    /// BackendTrafficPolicy: override_host and retries.
    pub btp: Value,
    /// EnvoyPatchPolicy: the optional alternative to the BTP's override.
    pub epp: Value,
}

impl Example {
    /// Reads [`EXAMPLE`] and [`PATCH`]; panics if a policy is missing or doubled.
    pub fn load() -> Example {
        Example::load_from(&repo_root())
    }

    /// [`Example::load`] from a copy of the repository's files under `root`
    /// (the README's renaming applied to a copy, say).
    pub fn load_from(root: &Path) -> Example {
        let docs = documents(&root.join(EXAMPLE).display().to_string());
        assert_eq!(
            docs.len(),
            2,
            "{EXAMPLE}: EnvoyExtensionPolicy and BackendTrafficPolicy"
        );
        let patch = documents(&root.join(PATCH).display().to_string());
        assert_eq!(patch.len(), 1, "{PATCH}: one EnvoyPatchPolicy");
        Example {
            eep: one(&docs, "EnvoyExtensionPolicy"),
            btp: one(&docs, "BackendTrafficPolicy"),
            epp: one(&patch, "EnvoyPatchPolicy"),
        }
    }

    /// The namespace all three are applied in.
    pub fn namespace(&self) -> &str {
        str_field(
            &self.eep["metadata"]["namespace"],
            "EnvoyExtensionPolicy namespace",
        )
    }

    /// The HTTPRoute the EnvoyExtensionPolicy attaches to.
    pub fn route(&self) -> &str {
        str_field(
            &self.eep["spec"]["targetRefs"][0]["name"],
            "EnvoyExtensionPolicy targetRefs[0].name",
        )
    }

    /// The plugin configuration, parsed as the filter parses it.
    pub fn consumer_config(&self) -> ConsumerConfig {
        let config = &self.eep["spec"]["wasm"][0]["config"];
        ConsumerConfig::from_json(config.to_string().as_bytes())
            .unwrap_or_else(|e| panic!("EnvoyExtensionPolicy wasm[0].config: {e}"))
    }

    /// The Gateway the EnvoyPatchPolicy attaches to.
    pub fn gateway(&self) -> &str {
        str_field(
            &self.epp["spec"]["targetRef"]["name"],
            "EnvoyPatchPolicy targetRef.name",
        )
    }

    /// The name of the Gateway's HTTP listener in xDS (the name scheme
    /// Envoy Gateway v1.9 uses by default).
    pub fn http_listener(&self) -> String {
        xds_listener_name(
            self.namespace(),
            self.gateway(),
            HTTP_SECTION,
            HTTP_PORT,
            false,
        )
    }

    /// The same example with the EnvoyExtensionPolicy of `front-drain.yaml`
    /// in place of its own (the same name: applying that file replaces it).
    pub fn with_front(&self, front: &FrontExample) -> Example {
        Example {
            eep: front.eep.clone(),
            ..self.clone()
        }
    }
}

/// `front-drain.yaml`, as a user would apply it beside the [`Example`].
#[derive(Debug, Clone)]
pub struct FrontExample {
    /// EnvoyExtensionPolicy: the example's, with `front`.
    pub eep: Value,
    /// EnvoyPatchPolicy: the control port on the Gateway's HTTP listener.
    pub epp: Value,
    /// The headless Service selecting the Gateway's proxy pods.
    pub fronts: Value,
    /// The backend with no sidecar, and its Service.
    pub deployment: Value,
    pub service: Value,
}

impl FrontExample {
    /// Reads [`FRONT`]; panics if a document is missing or doubled.
    pub fn load() -> FrontExample {
        FrontExample::load_from(&repo_root())
    }

    /// [`FrontExample::load`] from a copy under `root`.
    pub fn load_from(root: &Path) -> FrontExample {
        let docs = documents(&root.join(FRONT).display().to_string());
        assert_eq!(docs.len(), 5, "{FRONT}: five documents");
        let services: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "Service").collect();
        assert_eq!(services.len(), 2, "{FRONT}: two Services");
        let (fronts, service): (Vec<&Value>, Vec<&Value>) = services
            .into_iter()
            .partition(|s| s["spec"]["clusterIP"] == "None");
        assert_eq!(
            (fronts.len(), service.len()),
            (1, 1),
            "{FRONT}: one headless Service (the proxy pods) and one for the backend"
        );
        FrontExample {
            eep: one(&docs, "EnvoyExtensionPolicy"),
            epp: one(&docs, "EnvoyPatchPolicy"),
            fronts: fronts[0].clone(),
            deployment: one(&docs, "Deployment"),
            service: service[0].clone(),
        }
    }

    /// The public listener's plugin configuration, parsed as the filter parses it.
    pub fn public_config(&self) -> ConsumerConfig {
        let config = &self.eep["spec"]["wasm"][0]["config"];
        ConsumerConfig::from_json(config.to_string().as_bytes())
            .unwrap_or_else(|e| panic!("{FRONT}: EnvoyExtensionPolicy wasm[0].config: {e}"))
    }

    /// The entries of the EnvoyPatchPolicy, in order.
    pub fn entries(&self) -> Vec<Value> {
        self.epp["spec"]["jsonPatches"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The one entry whose operation is `op` (and, for `replace`, whose
    /// path ends with `suffix`).
    pub fn entry(&self, op: &str, suffix: &str) -> Value {
        let found: Vec<Value> = self
            .entries()
            .into_iter()
            .filter(|e| {
                e["operation"]["op"] == op
                    && e["operation"]["path"]
                        .as_str()
                        .is_some_and(|p| p.ends_with(suffix))
            })
            .collect();
        assert_eq!(
            found.len(),
            1,
            "{FRONT}: one `{op}` entry ending {suffix:?}"
        );
        found[0]["operation"].clone()
    }

    /// The control listener's plugin configuration (entry `replace
    /// .../configuration/value`), as JSON.
    pub fn control_config_json(&self) -> Value {
        let op = self.entry("replace", "/configuration/value");
        let text = str_field(&op["value"], "the control configuration");
        serde_json::from_str(text)
            .unwrap_or_else(|e| panic!("{FRONT}: the control configuration is not JSON: {e}"))
    }

    /// The control listener's plugin configuration, parsed as the filter parses it.
    pub fn control_config(&self) -> ConsumerConfig {
        ConsumerConfig::from_json(self.control_config_json().to_string().as_bytes())
            .unwrap_or_else(|e| panic!("{FRONT}: the control configuration: {e}"))
    }

    /// The control port: the added address's, which the filter chain matches.
    pub fn control_port(&self) -> u16 {
        let op = self.entry("add", "/additional_addresses/-");
        let port = op["value"]["address"]["socket_address"]["port_value"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or_else(|| panic!("{FRONT}: no control port in {op}"));
        let chain = self.entry("add", "/filter_chains/0");
        assert_eq!(
            chain["value"]["filter_chain_match"]["destination_port"],
            u64::from(port),
            "{FRONT}: the filter chain matches the added address's port"
        );
        port
    }

    /// The EnvoyPatchPolicy with the control port made `port` (the address
    /// and the chain's match), for a test that cannot bind the example's.
    pub fn epp_on_port(&self, port: u16) -> Value {
        let from = self.control_port();
        let mut epp = self.epp.clone();
        for e in epp["spec"]["jsonPatches"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            let value = &mut e["operation"]["value"];
            if value["address"]["socket_address"]["port_value"] == u64::from(from) {
                value["address"]["socket_address"]["port_value"] = json!(port);
            }
            if value["filter_chain_match"]["destination_port"] == u64::from(from) {
                value["filter_chain_match"]["destination_port"] = json!(port);
            }
        }
        epp
    }
}

// ---------------------------------------------------------------------------
// What Envoy Gateway generates from them

/// internal/gatewayapi/helpers.go, irRouteDestinationName: the xDS cluster
/// of one rule of an HTTPRoute.
pub fn rule_cluster(namespace: &str, route: &str, rule: usize) -> String {
    format!("httproute/{namespace}/{route}/rule/{rule}")
}

/// internal/xds/translator/listener.go, xdsListenerName: a Gateway
/// listener's xDS listener, `<namespace>/<gateway>/<listener>` (the IR
/// listener's name), or `tcp-<port>` with the v2 naming scheme
/// (`xdsNameSchemeV2`).
pub fn xds_listener_name(
    namespace: &str,
    gateway: &str,
    section: &str,
    port: u32,
    v2: bool,
) -> String {
    if v2 {
        format!("tcp-{port}")
    } else {
        format!("{namespace}/{gateway}/{section}")
    }
}

/// internal/gatewayapi/envoyextensionpolicy.go, irConfigNameForWasm: the
/// name of the policy's wasm filter, also its vm_id (so its shared-data
/// namespace).
pub fn wasm_name(eep: &Value, index: usize) -> String {
    let ns = str_field(&eep["metadata"]["namespace"], "namespace");
    let name = str_field(&eep["metadata"]["name"], "name");
    format!("envoyextensionpolicy/{ns}/{name}/wasm/{index}")
}

/// internal/xds/translator/wasm.go (buildHCMWasmFilter, wasmConfig,
/// patchRoute): the filter goes in the listener disabled and is enabled by
/// the route's typed_per_filter_config. Returns (filter name, filter).
pub fn wasm_filter(eep: &Value, module: &Path) -> (String, Value) {
    let wasm = &eep["spec"]["wasm"][0];
    let name = wasm_name(eep, 0);
    let filter_name = format!("envoy.filters.http.wasm/{name}");
    let filter = json!({
        "name": filter_name,
        "disabled": true,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "name": wasm.get("name").cloned().unwrap_or_else(|| json!(name)),
                "root_id": wasm["rootID"],
                "fail_open": wasm["failOpen"].as_bool().unwrap_or(false),
                // The config's JSON, as a string.
                "configuration": {
                    "@type": "type.googleapis.com/google.protobuf.StringValue",
                    "value": wasm["config"].to_string(),
                },
                "vm_config": {
                    "vm_id": name,
                    "runtime": "envoy.wasm.runtime.v8",
                    // Envoy Gateway: remote, from its wasm HTTP server.
                    "code": {"local": {"filename": module.display().to_string()}},
                },
            },
        },
    });
    (filter_name, filter)
}

/// One entry of a `load_balancing_policy.policies` list.
pub fn lb_policy(short: &str, type_name: &str, extra: Value) -> Value {
    let mut typed = json!({
        "@type": format!("type.googleapis.com/envoy.extensions.load_balancing_policies.{short}.v3.{type_name}")
    });
    if let (Some(t), Some(e)) = (typed.as_object_mut(), extra.as_object()) {
        t.extend(e.clone());
    }
    json!({"typed_extension_config": {
        "name": format!("envoy.load_balancing_policies.{short}"),
        "typed_config": typed,
    }})
}

/// A BackendTrafficPolicy `loadBalancer.type` as Envoy's policy names it.
pub fn lb_names(kind: &str) -> (&'static str, &'static str) {
    match kind {
        "LeastRequest" => ("least_request", "LeastRequest"),
        "RoundRobin" => ("round_robin", "RoundRobin"),
        "Random" => ("random", "Random"),
        other => panic!("load balancer type {other} is not modelled here"),
    }
}

/// internal/xds/translator/cluster.go (buildXdsCluster, buildLocalityLbConfig,
/// buildEndpointOverrideLoadBalancingPolicy, buildFallbackLoadBalancingPolicy):
/// the cluster's load_balancing_policy for a BackendTrafficPolicy's
/// `loadBalancer` (None: no policy, least request). With `endpointOverride`
/// the fallback carries no locality settings.
pub fn load_balancing_policy(load_balancer: Option<&Value>) -> Value {
    let kind = load_balancer
        .and_then(|lb| lb["type"].as_str())
        .unwrap_or("LeastRequest");
    let (short, type_name) = lb_names(kind);
    match load_balancer.map(|lb| &lb["endpointOverride"]) {
        Some(eo) if !eo.is_null() => {
            let sources: Vec<Value> = eo["extractFrom"]
                .as_array()
                .unwrap_or_else(|| panic!("endpointOverride.extractFrom: {eo}"))
                .iter()
                .map(|s| json!({"header": s["header"]}))
                .collect();
            json!({"policies": [lb_policy("override_host", "OverrideHost", json!({
                "override_host_sources": sources,
                "fallback_policy": {"policies": [lb_policy(short, type_name, json!({}))]},
            }))]})
        }
        _ => json!({"policies": [lb_policy(short, type_name, json!({
            "locality_lb_config": {"locality_weighted_lb_config": {}}
        }))]}),
    }
}

/// The cluster Envoy Gateway v1.5+ generates for an HTTPRoute rule
/// (internal/xds/translator/cluster.go buildXdsCluster; compare
/// testdata/out/xds-ir/http-route.clusters.yaml), endpoints from `eds`.
pub fn cluster(name: &str, eds: &Path, load_balancing_policy: Value) -> Value {
    json!({
        "name": name,
        "type": "EDS",
        "connect_timeout": "10s",
        "dns_lookup_family": "V4_PREFERRED",
        "per_connection_buffer_limit_bytes": 32768,
        "ignore_health_on_host_removal": true,
        "common_lb_config": {},
        "circuit_breakers": {"thresholds": [{"max_retries": 1024}]},
        "eds_cluster_config": {
            "service_name": name,
            "eds_config": {
                "resource_api_version": "V3",
                "path_config_source": {"path": eds.display().to_string()},
            },
        },
        "load_balancing_policy": load_balancing_policy,
    })
}

/// The same cluster as Envoy Gateway v1.4 and earlier generated it: the
/// legacy `lb_policy` enum, locality settings in `common_lb_config`
/// (testdata/out/xds-ir/http-route.clusters.yaml at v1.4.0).
pub fn cluster_v1_4(name: &str, eds: &Path) -> Value {
    let mut c = cluster(name, eds, json!(null));
    if let Some(map) = c.as_object_mut() {
        map.remove("load_balancing_policy");
        map.insert("lb_policy".into(), json!("LEAST_REQUEST"));
        map.insert(
            "common_lb_config".into(),
            json!({"locality_weighted_lb_config": {}}),
        );
    }
    c
}

/// internal/xds/translator/route.go, buildRetryPolicy: a BackendTrafficPolicy's
/// `retry` on the route.
pub fn retry_policy(btp: &Value) -> Value {
    let retry = &btp["spec"]["retry"];
    let retry_on = match retry["retryOn"]["triggers"].as_array() {
        Some(t) => t
            .iter()
            .map(|t| str_field(t, "retryOn.triggers[]"))
            .collect::<Vec<_>>()
            .join(","),
        None => {
            "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes".into()
        }
    };
    json!({
        "retry_on": retry_on,
        "retriable_status_codes": retry["retryOn"].get("httpStatusCodes").cloned().unwrap_or(json!([503])),
        "num_retries": retry["numRetries"].as_u64().unwrap_or(2),
        "retry_host_predicate": [{
            "name": "envoy.retry_host_predicates.previous_hosts",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"},
        }],
        "host_selection_retry_max_attempts": 5,
    })
}

/// An Envoy config shaped as a gateway's: one listener with the policy's
/// wasm filter before the router, the route to `cluster` with the filter
/// enabled and the retries, and the bootstrap's admin cluster.
pub fn gateway_config(ex: &Example, cluster: Value, admin_port: u16, listen_port: u16) -> Value {
    let module = wasm_dir().join("graceful_consumer.wasm");
    let (filter_name, filter) = wasm_filter(&ex.eep, &module);
    let cluster_name = str_field(&cluster["name"], "cluster name").to_string();
    let mut per_filter = serde_json::Map::new();
    per_filter.insert(
        filter_name,
        json!({"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "config": {}}),
    );
    let listener = ex.http_listener();
    json!({
        "node": {"id": "envoy-gateway-example", "cluster": "envoy-gateway-example"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {
            "listeners": [{
                "name": listener,
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen_port}},
                // listener.go, addHCMToXDSListener: a plain HTTP listener's
                // HCM is the default filter chain, named as the listener
                // (httpListenerDefaultFilterChainName).
                "default_filter_chain": {"name": listener, "filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "http-10080",
                        "use_remote_address": true,
                        "route_config": {
                            "name": listener,
                            "virtual_hosts": [{
                                "name": format!("{listener}/*"),
                                "domains": ["*"],
                                "routes": [{
                                    "name": format!("{cluster_name}/match/0/*"),
                                    "match": {"prefix": "/"},
                                    "route": {"cluster": cluster_name, "retry_policy": retry_policy(&ex.btp)},
                                    "typed_per_filter_config": per_filter,
                                }],
                            }],
                        },
                        "http_filters": [
                            filter,
                            {"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}},
                        ],
                    },
                }]},
            }],
            "clusters": [
                cluster,
                {
                    "name": ADMIN_CLUSTER,
                    "type": "STATIC",
                    "connect_timeout": "0.250s",
                    "lb_policy": "ROUND_ROBIN",
                    "load_assignment": {"cluster_name": ADMIN_CLUSTER, "endpoints": [{"lb_endpoints": [
                        {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}}}
                    ]}]},
                },
            ],
        },
    })
}

/// `config` (a [`gateway_config`]) as Envoy Gateway delivers it to its
/// proxy, whose ADS server is `xds`: the bootstrap holds the admin,
/// `prometheus_stats` and `xds_cluster` with delta ADS and LDS and CDS
/// over it (internal/xds/bootstrap/bootstrap.yaml.tpl); the listener comes
/// over LDS with its routes over RDS (`makeConfigSource`), the route's
/// cluster over CDS and its endpoints over EDS (cluster.go: ADS). The
/// stand-in serving it is `tools/xds_server.py`, not Envoy Gateway.
pub fn over_xds(config: &Value, xds: std::net::SocketAddr) -> crate::support::xds::AdsConfig {
    use crate::support::xds::AdsConfig;
    let node = str_field(&config["node"]["id"], "node id").to_string();
    let mut ads = AdsConfig::split_to(config.clone(), &node, xds, &[]);
    ads.clusters_over_cds(&[ADMIN_CLUSTER]);
    let source = crate::support::xds::ads_source();
    ads.routes_over_rds(&source);
    ads.delta_through("xds_cluster");
    // The split's look for `filter_chains` leaves a `null` where the
    // listener has none; Envoy Gateway's listener (protojson) has no
    // member there, which a patch adding `/filter_chains/0` relies on.
    for listener in &mut ads.listeners {
        if let Some(map) = listener.as_object_mut() {
            map.retain(|_, v| !v.is_null());
        }
    }
    ads
}

// ---------------------------------------------------------------------------
// What Envoy Gateway does with the EnvoyPatchPolicy

/// Applies the EnvoyPatchPolicy's entries for `cluster` the way Envoy
/// Gateway does: one entry at a time, each on the result of the previous
/// ones; an entry that fails is skipped (its error goes to the policy's
/// status) and the others still apply. Returns the errors, by entry index.
pub fn apply_patch_policy(epp: &Value, cluster: &mut Value) -> Vec<(usize, String)> {
    apply_patches(epp, CLUSTER_TYPE, cluster)
}

/// [`apply_patch_policy`] for a resource of any xDS type `type_url` (its
/// `name` matched against each entry's), as internal/xds/translator/
/// jsonpatch.go, processJSONPatches, applies each entry: on the resource
/// as it stands after the previous ones, skipped on an error. What this
/// does not check: Envoy Gateway's protojson round trip and proto
/// validation of each step (the harness hands the result to Envoy instead).
pub fn apply_patches(epp: &Value, type_url: &str, resource: &mut Value) -> Vec<(usize, String)> {
    let name = str_field(&resource["name"], "resource name").to_string();
    let mut errors = Vec::new();
    let entries = epp["spec"]["jsonPatches"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for (i, entry) in entries.iter().enumerate() {
        if entry["type"] != type_url || entry["name"] != name.as_str() {
            continue;
        }
        let mut next = resource.clone();
        match json_patch::apply_operation(&mut next, &entry["operation"]) {
            Ok(()) => *resource = next,
            Err(e) => errors.push((i, e)),
        }
    }
    errors
}

/// The listener named `name` in `config` (a [`gateway_config`]'s static
/// listeners, or the `listeners` of an [`over_xds`]).
pub fn listener_mut<'a>(listeners: &'a mut Value, name: &str) -> &'a mut Value {
    listeners
        .as_array_mut()
        .and_then(|l| l.iter_mut().find(|l| l["name"] == name))
        .unwrap_or_else(|| panic!("no listener {name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An EnvoyExtensionPolicy with one wasm extension.
    fn eep(wasm: Value) -> Value {
        json!({
            "metadata": {"namespace": "shop", "name": "graceful"},
            "spec": {"wasm": [wasm]},
        })
    }

    fn policy_names(lb: &Value) -> Vec<&str> {
        lb["policies"]
            .as_array()
            .map(|p| {
                p.iter()
                    .filter_map(|e| e["typed_extension_config"]["name"].as_str())
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn the_http_listener_is_named_and_shaped_as_envoy_gateway_does() {
        assert_eq!(
            xds_listener_name("shop", "gw", "http", 80, false),
            "shop/gw/http"
        );
        assert_eq!(xds_listener_name("shop", "gw", "http", 80, true), "tcp-80");
        let ex = Example::load();
        assert_eq!(ex.http_listener(), "default/eg/http");
        let config = gateway_config(&ex, json!({"name": "c"}), 1, 2);
        let l = &config["static_resources"]["listeners"][0];
        assert_eq!(l["name"], "default/eg/http");
        assert!(l.get("filter_chains").is_none(), "{l}");
        let chain = &l["default_filter_chain"];
        assert_eq!(chain["name"], "default/eg/http");
        let hcm = &chain["filters"][0]["typed_config"];
        assert_eq!(hcm["use_remote_address"], true);
        assert_eq!(
            hcm["http_filters"][0]["name"],
            format!("envoy.filters.http.wasm/{}", wasm_name(&ex.eep, 0))
        );
    }

    /// The Gateway's listener with `front-drain.yaml`'s policies, and the
    /// patch's errors.
    fn front_listener(insert_first: Option<Value>) -> (Value, Value, Vec<(usize, String)>) {
        let front = FrontExample::load();
        let ex = Example::load().with_front(&front);
        let mut config = gateway_config(&ex, json!({"name": "c"}), 1, 2);
        let listener = listener_mut(
            &mut config["static_resources"]["listeners"],
            &ex.http_listener(),
        );
        if let Some(filter) = insert_first {
            let op = json!({"op": "add", "path": "/default_filter_chain/filters/0/typed_config/http_filters/0", "value": filter});
            json_patch::apply_operation(listener, &op).unwrap();
        }
        let public = listener["default_filter_chain"].clone();
        let errors = apply_patches(&front.epp, LISTENER_TYPE, listener);
        (listener.clone(), public, errors)
    }

    #[test]
    fn the_front_patch_copies_the_listeners_own_filter_onto_the_control_port() {
        let front = FrontExample::load();
        let (listener, public, errors) = front_listener(None);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            listener["default_filter_chain"], public,
            "the public chain is left as it was"
        );
        assert_eq!(
            listener["additional_addresses"],
            json!([{"address": {"socket_address": {"address": "0.0.0.0", "port_value": 19091}}}])
        );
        let chains = listener["filter_chains"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(chains.len(), 1, "{listener}");
        assert_eq!(
            chains[0]["filter_chain_match"],
            json!({"destination_port": 19091})
        );
        let hcm = &chains[0]["filters"][0]["typed_config"];
        let filters = hcm["http_filters"].as_array().cloned().unwrap_or_default();
        let names: Vec<&str> = filters.iter().filter_map(|f| f["name"].as_str()).collect();
        let original = &public["filters"][0]["typed_config"]["http_filters"][0];
        assert_eq!(
            names,
            [
                str_field(&original["name"], "name"),
                "envoy.filters.http.router"
            ]
        );
        let copy = &filters[0];
        assert_eq!(copy["disabled"], false, "on, with no route to enable it");
        let (c, o) = (
            &copy["typed_config"]["config"],
            &original["typed_config"]["config"],
        );
        // One VM: the same vm_id, code and root; its own configuration.
        assert_eq!(c["vm_config"], o["vm_config"]);
        for same in ["name", "root_id", "fail_open"] {
            assert_eq!(c[same], o[same], "{same}");
        }
        assert_eq!(
            c["configuration"]["@type"],
            "type.googleapis.com/google.protobuf.StringValue"
        );
        let control: Value =
            serde_json::from_str(str_field(&c["configuration"]["value"], "value")).unwrap();
        assert_eq!(control, front.control_config_json());
        assert_eq!(control["front"]["serve_endpoints"], true);
        // The route there is a 404, whatever the path.
        let routes = &hcm["route_config"]["virtual_hosts"][0]["routes"];
        assert_eq!(
            routes,
            &json!([{"match": {"prefix": "/"}, "direct_response": {"status": 404}}])
        );
        assert_eq!(hcm["use_remote_address"], true);
        assert_eq!(hcm["xff_num_trusted_hops"], 0);
        assert!(hcm.get("original_ip_detection_extensions").is_none());
    }

    #[test]
    fn another_filter_before_it_fails_the_test_entry_and_the_copy_stays_off() {
        // Another policy's filter first (CORS sorts before wasm,
        // httpfilters.go): the copy takes it, the two replaces find no
        // wasm config to change, and the status names entry 0.
        let cors = json!({"name": "envoy.filters.http.cors", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors"}});
        let (listener, _, errors) = front_listener(Some(cors));
        assert_eq!(
            errors.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            [0, 4, 5],
            "{errors:?}"
        );
        let copied = &listener["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"][0];
        assert_eq!(copied["name"], "envoy.filters.http.cors");
    }

    #[test]
    fn names_follow_envoy_gateway() {
        assert_eq!(
            rule_cluster("shop", "cart", 2),
            "httproute/shop/cart/rule/2"
        );
        let policy = eep(json!({}));
        assert_eq!(
            wasm_name(&policy, 0),
            "envoyextensionpolicy/shop/graceful/wasm/0"
        );
    }

    #[test]
    fn the_wasm_filter_is_disabled_on_the_listener_and_carries_the_config_as_a_string() {
        let policy = eep(json!({
            "rootID": "graceful_consumer",
            "failOpen": true,
            "config": {"admin_cluster": ADMIN_CLUSTER},
        }));
        let (name, filter) = wasm_filter(&policy, Path::new("/m/graceful_consumer.wasm"));
        let vm_id = "envoyextensionpolicy/shop/graceful/wasm/0";
        assert_eq!(name, format!("envoy.filters.http.wasm/{vm_id}"));
        assert_eq!(filter["name"], name.as_str());
        assert_eq!(filter["disabled"], true);
        let config = &filter["typed_config"]["config"];
        assert_eq!(config["name"], vm_id, "no name: the filter's");
        assert_eq!(config["root_id"], "graceful_consumer");
        assert_eq!(config["fail_open"], true);
        assert_eq!(
            config["configuration"]["value"],
            r#"{"admin_cluster":"prometheus_stats"}"#
        );
        assert_eq!(config["vm_config"]["vm_id"], vm_id);
        assert_eq!(
            config["vm_config"]["code"]["local"]["filename"],
            "/m/graceful_consumer.wasm"
        );
        // A named extension keeps its name; failOpen defaults to false.
        let (_, named) = wasm_filter(
            &eep(json!({"name": "mine", "rootID": "r"})),
            Path::new("/m"),
        );
        assert_eq!(named["typed_config"]["config"]["name"], "mine");
        assert_eq!(named["typed_config"]["config"]["fail_open"], false);
    }

    #[test]
    fn without_a_load_balancer_the_cluster_gets_least_request_with_locality_weights() {
        let lb = load_balancing_policy(None);
        assert_eq!(
            policy_names(&lb),
            ["envoy.load_balancing_policies.least_request"]
        );
        let typed = &lb["policies"][0]["typed_extension_config"]["typed_config"];
        assert_eq!(
            typed["@type"],
            "type.googleapis.com/envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest"
        );
        assert_eq!(
            typed["locality_lb_config"],
            json!({"locality_weighted_lb_config": {}})
        );
        let round_robin = load_balancing_policy(Some(&json!({"type": "RoundRobin"})));
        assert_eq!(
            policy_names(&round_robin),
            ["envoy.load_balancing_policies.round_robin"]
        );
    }

    #[test]
    fn an_endpoint_override_puts_override_host_over_a_fallback_without_locality() {
        let lb = load_balancing_policy(Some(&json!({
            "type": "Random",
            "endpointOverride": {"extractFrom": [{"header": "x-one"}, {"header": "x-two"}]},
        })));
        assert_eq!(
            policy_names(&lb),
            ["envoy.load_balancing_policies.override_host"]
        );
        let oh = &lb["policies"][0]["typed_extension_config"]["typed_config"];
        assert_eq!(
            oh["override_host_sources"],
            json!([{"header": "x-one"}, {"header": "x-two"}])
        );
        let fallback = &oh["fallback_policy"];
        assert_eq!(
            policy_names(fallback),
            ["envoy.load_balancing_policies.random"]
        );
        let typed = &fallback["policies"][0]["typed_extension_config"]["typed_config"];
        assert!(typed.get("locality_lb_config").is_none(), "{typed}");
    }

    #[test]
    #[should_panic(expected = "ConsistentHash is not modelled here")]
    fn an_unmodelled_load_balancer_is_refused() {
        lb_names("ConsistentHash");
    }

    #[test]
    fn the_cluster_has_eds_from_the_file_and_the_policy_given() {
        let lb = load_balancing_policy(None);
        let c = cluster(
            "httproute/shop/cart/rule/0",
            Path::new("/e/eds.yaml"),
            lb.clone(),
        );
        assert_eq!(c["name"], "httproute/shop/cart/rule/0");
        assert_eq!(c["type"], "EDS");
        assert_eq!(c["eds_cluster_config"]["service_name"], c["name"]);
        assert_eq!(
            c["eds_cluster_config"]["eds_config"]["path_config_source"]["path"],
            "/e/eds.yaml"
        );
        assert_eq!(c["load_balancing_policy"], lb);
        assert_eq!(c["common_lb_config"], json!({}));
        assert!(c.get("lb_policy").is_none());

        let old = cluster_v1_4("httproute/shop/cart/rule/0", Path::new("/e/eds.yaml"));
        assert!(old.get("load_balancing_policy").is_none(), "{old}");
        assert_eq!(old["lb_policy"], "LEAST_REQUEST");
        assert_eq!(
            old["common_lb_config"],
            json!({"locality_weighted_lb_config": {}})
        );
        assert_eq!(old["eds_cluster_config"], c["eds_cluster_config"]);
    }

    #[test]
    fn retries_come_from_the_backend_traffic_policy_or_envoy_gateways_defaults() {
        let defaults = retry_policy(&json!({"spec": {}}));
        assert_eq!(
            defaults["retry_on"],
            "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
        );
        assert_eq!(defaults["retriable_status_codes"], json!([503]));
        assert_eq!(defaults["num_retries"], 2);
        assert_eq!(
            defaults["retry_host_predicate"][0]["name"],
            "envoy.retry_host_predicates.previous_hosts"
        );
        assert_eq!(defaults["host_selection_retry_max_attempts"], 5);

        let set = retry_policy(&json!({"spec": {"retry": {
            "numRetries": 4,
            "retryOn": {"triggers": ["reset", "connect-failure"], "httpStatusCodes": [502, 503]},
        }}}));
        assert_eq!(set["retry_on"], "reset,connect-failure");
        assert_eq!(set["retriable_status_codes"], json!([502, 503]));
        assert_eq!(set["num_retries"], 4);
    }

    /// An EnvoyPatchPolicy with these (type, name, operation) entries.
    fn epp(entries: &[(&str, &str, Value)]) -> Value {
        let patches: Vec<Value> = entries
            .iter()
            .map(|(t, n, op)| json!({"type": t, "name": n, "operation": op}))
            .collect();
        json!({"spec": {"jsonPatches": patches}})
    }

    #[test]
    fn patches_apply_entry_by_entry_to_the_named_cluster_and_a_failed_entry_is_skipped() {
        let mut c = json!({"name": "c", "a": {"b": 1}});
        let errors = apply_patch_policy(
            &epp(&[
                (
                    CLUSTER_TYPE,
                    "c",
                    json!({"op": "add", "path": "/x", "value": 1}),
                ),
                (
                    CLUSTER_TYPE,
                    "other",
                    json!({"op": "add", "path": "/y", "value": 1}),
                ),
                (
                    "type.googleapis.com/envoy.config.listener.v3.Listener",
                    "c",
                    json!({"op": "add", "path": "/z", "value": 1}),
                ),
                // Fails half-way (the value is taken, its destination is
                // missing): the cluster keeps what it had.
                (
                    CLUSTER_TYPE,
                    "c",
                    json!({"op": "move", "from": "/a/b", "path": "/n/b"}),
                ),
                // Sees the result of the first entry.
                (
                    CLUSTER_TYPE,
                    "c",
                    json!({"op": "replace", "path": "/x", "value": 2}),
                ),
            ]),
            &mut c,
        );
        assert_eq!(
            errors.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            [3],
            "{errors:?}"
        );
        assert_eq!(c, json!({"name": "c", "a": {"b": 1}, "x": 2}));
        assert!(apply_patch_policy(&json!({}), &mut c).is_empty());
    }

    #[test]
    fn the_example_patch_puts_override_host_over_envoy_gateways_own_policy() {
        let ex = Example::load();
        let name = rule_cluster(ex.namespace(), ex.route(), 0);
        let eds = Path::new("/e/eds.yaml");
        let generated = load_balancing_policy(None);
        let mut c = cluster(&name, eds, generated.clone());
        let errors = apply_patch_policy(&ex.epp, &mut c);
        assert!(errors.is_empty(), "{errors:?}");
        let lb = &c["load_balancing_policy"];
        assert_eq!(
            policy_names(lb),
            ["envoy.load_balancing_policies.override_host"]
        );
        let oh = &lb["policies"][0]["typed_extension_config"]["typed_config"];
        assert_eq!(
            oh["override_host_sources"],
            json!([{"header": ex.consumer_config().override_host_header}])
        );
        assert_eq!(oh["fallback_policy"], generated);
        // The BackendTrafficPolicy's endpointOverride builds the same top.
        let btp = load_balancing_policy(Some(&ex.btp["spec"]["loadBalancer"]));
        assert_eq!(
            btp["policies"][0]["typed_extension_config"]["typed_config"]["override_host_sources"],
            oh["override_host_sources"]
        );

        // On Envoy Gateway v1.4's cluster the move and the remove find nothing.
        let mut old = cluster_v1_4(&name, eds);
        let errors = apply_patch_policy(&ex.epp, &mut old);
        assert_eq!(
            errors.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            [1, 2],
            "{errors:?}"
        );
    }
}
