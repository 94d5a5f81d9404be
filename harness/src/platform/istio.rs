//! Envoy configured the way Istio configures a sidecar, for the
//! Istio-shaped suite (`tests/istio_sidecar.rs`). Not Istio: no istiod,
//! no pilot-agent, no xDS. What it keeps is what the examples depend on:
//!
//! - the listeners: `virtualInbound` on 15006 (an `original_dst` listener
//!   whose filter chains match the destination port, with the
//!   `virtualInbound-blackhole` chain for connections made to 15006
//!   itself), `virtualOutbound` on 15001 (`use_original_dst`, handing each
//!   connection to the bind-less listener of its service port), the
//!   Prometheus listener on 15090 and the readiness listener on 15021;
//! - the admin on 127.0.0.1:15000 and the bootstrap's `prometheus_stats`
//!   cluster pointing at it;
//! - the inbound cluster reaching the app from 127.0.0.6, the outbound
//!   cluster named `outbound|PORT||HOST` with Istio's default retry
//!   policy;
//! - the WasmPlugins of `examples/istio/` translated as istiod translates
//!   them ([`wasm_filters`]): name `NAMESPACE.NAME`, `root_id` =
//!   `pluginName`, the `pluginConfig` as JSON in a `StringValue`, no
//!   `vm_id`, `failStrategy` as the failure policy, ordered by phase and
//!   priority; the module is the local file the agent would have fetched;
//! - the example's EnvoyFilter cluster patch merged with Istio's merge
//!   rules ([`merge_patch`]), and its outbound LISTENER patch;
//! - the listeners' `traffic_direction` (what `drain_listeners?inboundonly`
//!   selects by).
//!
//! - with [`over_xds`], the config as istiod delivers it: delta ADS from a
//!   stand-in, listeners, service clusters, endpoints and the WasmPlugins'
//!   ECDS over it.
//!
//! Where it differs: the readiness listener answers `/healthz/ready` with
//! a direct 200 (pilot-agent's job), Envoy reaches the control plane
//! directly (not through pilot-agent's socket), there is no mTLS.

use serde_json::{json, Value};

use crate::support::envoy::repo_root;

/// The admin address Istio gives the sidecar. Istio's fixed ports, kept:
/// each pod runs in a network namespace of its own (its own address), so
/// they cannot collide with another test's, and they are what Istio's
/// config (and a reader comparing with a real mesh) expects.
pub const ADMIN_PORT: u16 = 15000;
pub const INBOUND_PORT: u16 = 15006;
pub const OUTBOUND_PORT: u16 = 15001;
pub const PROMETHEUS_PORT: u16 = 15090;
pub const HEALTH_PORT: u16 = 15021;
/// The namespace the example resources are applied in.
pub const NAMESPACE: &str = "default";

/// Every YAML document of `examples/istio/FILE`, as JSON values.
pub fn documents(file: &str) -> Vec<Value> {
    use serde::Deserialize;
    let path = repo_root().join("examples/istio").join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| {
            let yaml = serde_yaml::Value::deserialize(d)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            serde_json::to_value(yaml).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        })
        .filter(|d| !d.is_null())
        .collect()
}

/// The documents of kind `kind` across the example's files.
pub fn of_kind(kind: &str) -> Vec<Value> {
    ["wasmplugins.yaml", "provider.yaml", "consumer.yaml"]
        .iter()
        .flat_map(|f| documents(f))
        .filter(|d| d["kind"] == kind)
        .collect()
}

/// Which side of the sidecar a WasmPlugin's `match[].mode` selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Inbound (`SERVER`).
    Server,
    /// Outbound (`CLIENT`).
    Client,
}

fn plugin_applies(plugin: &Value, app: &str, side: Side) -> bool {
    let spec = &plugin["spec"];
    let selected = spec["selector"]["matchLabels"]["app"] == app;
    let modes: Vec<&str> = spec["match"]
        .as_array()
        .map(|m| m.iter().filter_map(|t| t["mode"].as_str()).collect())
        .unwrap_or_default();
    let wanted = match side {
        Side::Server => "SERVER",
        Side::Client => "CLIENT",
    };
    selected
        && (modes.is_empty() || modes.contains(&"CLIENT_AND_SERVER") || modes.contains(&wanted))
}

/// Istio's phase order: AUTHN, then AUTHZ, then STATS; unspecified last.
fn phase_rank(phase: &Value) -> u8 {
    match phase.as_str() {
        Some("AUTHN") => 0,
        Some("AUTHZ") => 1,
        Some("STATS") => 2,
        _ => 3,
    }
}

/// The module a WasmPlugin's `url` names, as the local file pilot-agent
/// would have written after fetching it: `oci://REGISTRY/graceful_drain:TAG`
/// is `graceful_drain.wasm` in `wasm_dir`.
fn local_module(url: &str, wasm_dir: &std::path::Path) -> String {
    let last = url.rsplit('/').next().unwrap_or(url);
    let name = last.split([':', '@']).next().unwrap_or(last);
    wasm_dir.join(format!("{name}.wasm")).display().to_string()
}

/// The HTTP filters istiod would put on `side` of a pod labelled
/// `app: APP`, in order, from the example's WasmPlugins.
pub fn wasm_filters(app: &str, side: Side, wasm_dir: &std::path::Path) -> Vec<Value> {
    let mut plugins: Vec<Value> = of_kind("WasmPlugin")
        .into_iter()
        .filter(|p| plugin_applies(p, app, side))
        .collect();
    // Within a phase, higher priority first.
    plugins.sort_by_key(|p| {
        (
            phase_rank(&p["spec"]["phase"]),
            std::cmp::Reverse(p["spec"]["priority"].as_i64().unwrap_or(0)),
        )
    });
    plugins
        .iter()
        .map(|p| {
            let spec = &p["spec"];
            let name = format!(
                "{}.{}",
                p["metadata"]["namespace"].as_str().unwrap_or(NAMESPACE),
                p["metadata"]["name"].as_str().unwrap_or_default()
            );
            let url = spec["url"].as_str().unwrap_or_default();
            let mut config = json!({
                "name": name,
                "root_id": spec["pluginName"],
                "vm_config": {
                    "runtime": "envoy.wasm.runtime.v8",
                    "code": {"local": {"filename": local_module(url, wasm_dir)}},
                },
            });
            if let Some(plugin_config) = spec["pluginConfig"].as_object().filter(|c| !c.is_empty())
            {
                config["configuration"] = json!({
                    "@type": "type.googleapis.com/google.protobuf.StringValue",
                    "value": Value::Object(plugin_config.clone()).to_string(),
                });
            }
            let policy = match spec["failStrategy"].as_str() {
                Some("FAIL_OPEN") => Some("FAIL_OPEN"),
                Some("FAIL_RELOAD") => Some("FAIL_RELOAD"),
                Some("FAIL_CLOSE") => Some("FAIL_CLOSED"),
                _ => None,
            };
            if let Some(policy) = policy {
                config["failure_policy"] = json!(policy);
            }
            json!({
                "name": name,
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
                    "config": config,
                },
            })
        })
        .collect()
}

/// What Istio 1.30 on makes of the same WasmPlugins: each is translated
/// into a TrafficExtension named `NAME~istio-translated-wasmplugin`
/// (`pilot/pkg/config/kube/extensions/translate.go`, `syntheticMarker`), so
/// the filter and its plugin are named `NAMESPACE.NAME~istio-translated-wasmplugin`
/// where 1.28 and 1.29 say `NAMESPACE.NAME`. Renames every filter of `config`
/// that [`wasm_filters`] named; returns how many.
pub fn use_traffic_extension_names(config: &mut Value) -> usize {
    const MARKER: &str = "~istio-translated-wasmplugin";
    let plugins: Vec<String> = of_kind("WasmPlugin")
        .iter()
        .map(|p| {
            format!(
                "{}.{}",
                p["metadata"]["namespace"].as_str().unwrap_or(NAMESPACE),
                p["metadata"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect();
    let mut renamed = 0;
    for_each_object(config, |map| {
        let named = map
            .get("name")
            .and_then(Value::as_str)
            .is_some_and(|n| plugins.iter().any(|p| p == n))
            && map.contains_key("typed_config");
        if named {
            let name = format!("{}{MARKER}", map["name"].as_str().unwrap_or_default());
            map.insert("name".into(), json!(name));
            if let Some(inner) = map
                .get_mut("typed_config")
                .and_then(|t| t.get_mut("config"))
                .and_then(Value::as_object_mut)
            {
                inner.insert("name".into(), json!(name));
            }
            renamed += 1;
        }
    });
    renamed
}

/// Merges `patch` into `target` the way an EnvoyFilter `MERGE` does
/// (Istio's `pkg/proto/merge`): messages merge field by field, lists
/// append, map entries (`typed_extension_protocol_options`, ...) and
/// scalars are replaced. On JSON, maps and messages look alike: the map
/// fields a cluster patch could touch are listed.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    merge_at(target, patch, "");
}

const MAP_FIELDS: &[&str] = &[
    "typed_extension_protocol_options",
    "filter_metadata",
    "typed_filter_metadata",
];

fn merge_at(target: &mut Value, patch: &Value, field: &str) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) if !p.contains_key("@type") => {
            for (k, v) in p {
                if MAP_FIELDS.contains(&field) {
                    t.insert(k.clone(), v.clone());
                } else {
                    merge_at(t.entry(k.clone()).or_insert(Value::Null), v, k);
                }
            }
        }
        (Value::Array(t), Value::Array(p)) => t.extend(p.iter().cloned()),
        (t, p) => *t = p.clone(),
    }
}

/// The EnvoyFilters of `consumer.yaml`: steering (always applied by
/// [`consumer_sidecar`]) and the upstream instance
/// ([`deliver_upstream_instance`]).
pub const STEERING: &str = "graceful-consumer-steering";
pub const UPSTREAM_INSTANCE: &str = "graceful-consumer-upstream";

/// The CLUSTER patches (match and value) of the example's EnvoyFilter
/// named `envoy_filter`.
pub fn cluster_patches(envoy_filter: &str) -> Vec<(Value, Value)> {
    of_kind("EnvoyFilter")
        .iter()
        .filter(|f| f["metadata"]["name"] == envoy_filter)
        .flat_map(|f| {
            f["spec"]["configPatches"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter(|p| p["applyTo"] == "CLUSTER")
        .map(|p| (p["match"].clone(), p["patch"]["value"].clone()))
        .collect()
}

/// The example's EnvoyFilter LISTENER patches for the sidecars' outbound
/// listeners (context `SIDECAR_OUTBOUND`), their values merged into
/// `listener` as istiod merges them.
fn patch_outbound_listener(mut listener: Value) -> Value {
    let patches = of_kind("EnvoyFilter").into_iter().flat_map(|f| {
        f["spec"]["configPatches"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    });
    for p in patches.filter(|p| p["applyTo"] == "LISTENER") {
        let context = p["match"]["context"].as_str();
        let name = p["match"]["listener"]["name"].as_str();
        if matches!(context, Some("SIDECAR_OUTBOUND" | "ANY") | None)
            && name.is_none_or(|n| listener["name"] == n)
            && p["patch"]["operation"] == "MERGE"
        {
            merge_patch(&mut listener, &p["patch"]["value"]);
        }
    }
    listener
}

/// Whether a CLUSTER patch's `match` selects the outbound cluster
/// `outbound|PORT||HOST` of a sidecar, as istiod matches it (context,
/// service, port; a field left out matches any).
fn patch_matches(matcher: &Value, cluster_name: &str) -> bool {
    let mut parts = cluster_name.split('|');
    let (Some("outbound"), Some(port), Some(_subset), Some(host)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let service = matcher["cluster"]["service"].as_str();
    let wanted_port = matcher["cluster"]["portNumber"].as_u64();
    matches!(
        matcher["context"].as_str(),
        Some("SIDECAR_OUTBOUND" | "ANY") | None
    ) && service.is_none_or(|s| s == host)
        && wanted_port.is_none_or(|p| Some(p) == port.parse().ok())
}

/// The cluster named `name` among `config`'s static clusters.
fn cluster_mut<'a>(config: &'a mut Value, name: &str) -> &'a mut Value {
    config
        .pointer_mut("/static_resources/clusters")
        .and_then(Value::as_array_mut)
        .and_then(|cs| cs.iter_mut().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no cluster {name} in the config"))
}

fn socket(address: &str, port: u16) -> Value {
    json!({"socket_address": {"address": address, "port_value": port}})
}

fn static_cluster(name: &str, address: &str, port: u16) -> Value {
    json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "0.250s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": socket(address, port)}}
        ]}]},
    })
}

fn hcm(
    stat_prefix: &str,
    route_config: Value,
    http_filters: Vec<Value>,
    access_log: &str,
) -> Value {
    let mut filters = http_filters;
    filters.push(json!({
        "name": "envoy.filters.http.router",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
    }));
    json!({
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": stat_prefix,
            "codec_type": "AUTO",
            "use_remote_address": false,
            "access_log": [{
                "name": "envoy.access_loggers.file",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                    "path": access_log,
                    "log_format": {"text_format_source": {"inline_string":
                        "%START_TIME(%s.%3f)% %RESPONSE_CODE% %RESPONSE_FLAGS% %UPSTREAM_HOST% attempts=%UPSTREAM_REQUEST_ATTEMPT_COUNT% %REQ(:PATH)%\n"}},
                },
            }],
            "route_config": route_config,
            "http_filters": filters,
        },
    })
}

fn tcp_proxy(stat_prefix: &str, cluster: &str) -> Value {
    json!({
        "name": "envoy.filters.network.tcp_proxy",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": stat_prefix,
            "cluster": cluster,
        },
    })
}

/// The listeners and clusters every Istio sidecar has from its bootstrap:
/// the admin, `prometheus_stats`, 15090 and 15021.
fn bootstrap(node_id: &str, listeners: Vec<Value>, clusters: Vec<Value>) -> Value {
    let mut all_listeners = vec![
        json!({
            "name": "prometheus",
            "address": socket("0.0.0.0", PROMETHEUS_PORT),
            "filter_chains": [{"filters": [hcm(
                "stats",
                json!({"virtual_hosts": [{"name": "prometheus", "domains": ["*"], "routes": [
                    {"match": {"prefix": "/stats/prometheus"}, "route": {"cluster": "prometheus_stats"}}
                ]}]}),
                vec![],
                "/dev/null",
            )]}],
        }),
        json!({
            "name": "health",
            "address": socket("0.0.0.0", HEALTH_PORT),
            "filter_chains": [{"filters": [hcm(
                "agent",
                // Stand-in for pilot-agent's readiness answer.
                json!({"virtual_hosts": [{"name": "health", "domains": ["*"], "routes": [
                    {"match": {"prefix": "/healthz/ready"}, "direct_response": {"status": 200}}
                ]}]}),
                vec![],
                "/dev/null",
            )]}],
        }),
    ];
    all_listeners.extend(listeners);
    let mut all_clusters = vec![static_cluster("prometheus_stats", "127.0.0.1", ADMIN_PORT)];
    all_clusters.extend(clusters);
    json!({
        "node": {"id": node_id, "cluster": node_id},
        "admin": {"address": socket("127.0.0.1", ADMIN_PORT)},
        "static_resources": {"listeners": all_listeners, "clusters": all_clusters},
        "stats_config": stats_config(),
    })
}

/// What Istio's bootstrap makes of `{{ .localhost }}` on a pod whose
/// addresses are all IPv6, or an IPv6-first dual-stack pod with
/// `ISTIO_DUAL_STACK` (`pkg/bootstrap/config.go`, `toTemplateParams`):
/// `::1`, for the admin and for `prometheus_stats` alike.
pub fn on_ipv6_loopback(config: &mut Value) {
    config["admin"]["address"] = socket("::1", ADMIN_PORT);
    *cluster_mut(config, "prometheus_stats") =
        static_cluster("prometheus_stats", "::1", ADMIN_PORT);
}

/// Istio's default `stats_matcher`: only these stats are real, every other
/// name is a null stat that reads 0 (`tools/packaging/common/envoy_bootstrap.json`
/// and `pkg/bootstrap/config.go`'s required inclusions, with no proxy
/// config extras). The filters' counts live in `wasmcustom.*` stats, kept
/// by the `wasm` prefix; the suite running under it shows they still count.
/// Plus `cluster.outbound`, which the suite's pods ask for the way a user
/// does (`proxyStatsMatcher.inclusionPrefixes` in `proxy.istio.io/config`),
/// to read the consumer's retry counts.
fn stats_config() -> Value {
    let prefixes = [
        "cluster.outbound",
        "reporter=",
        "cluster_manager",
        "listener_manager",
        "server",
        "cluster.xds-grpc",
        "wasm",
        "component",
        "istio",
    ];
    let suffixes = [
        "rbac.allowed",
        "rbac.denied",
        "shadow_allowed",
        "shadow_denied",
        "downstream_cx_active",
    ];
    let mut patterns: Vec<Value> = prefixes.iter().map(|p| json!({"prefix": p})).collect();
    patterns.extend(suffixes.iter().map(|s| json!({"suffix": s})));
    patterns.push(json!({"safe_regex": {"regex": r"vhost\..*\.route\..*"}}));
    json!({"stats_matcher": {"inclusion_list": {"patterns": patterns}}})
}

/// A provider pod's sidecar: the app on `app_port` behind `virtualInbound`
/// with the WasmPlugins of pods labelled `app: provider`.
pub fn provider_sidecar(
    pod_ip: &str,
    app_port: u16,
    wasm_dir: &std::path::Path,
    access_log: &str,
) -> Value {
    let inbound_cluster = format!("inbound|{app_port}||");
    let route = json!({
        "name": format!("inbound|{app_port}||"),
        "virtual_hosts": [{"name": format!("inbound|http|{app_port}"), "domains": ["*"], "routes": [{
            "name": "default",
            "match": {"prefix": "/"},
            "route": {
                "cluster": inbound_cluster,
                "timeout": "0s",
                "retry_policy": {"retry_on": "reset-before-request", "num_retries": 2},
            },
        }]}],
    });
    let virtual_inbound = json!({
        "name": "virtualInbound",
        "address": socket("0.0.0.0", INBOUND_PORT),
        "traffic_direction": "INBOUND",
        "listener_filters": [{
            "name": "envoy.filters.listener.original_dst",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst"},
        }],
        "filter_chains": [
            {
                "name": "virtualInbound-blackhole",
                "filter_chain_match": {"destination_port": INBOUND_PORT},
                "filters": [tcp_proxy("BlackHoleCluster", "BlackHoleCluster")],
            },
            {
                "name": format!("0.0.0.0_{app_port}"),
                "filter_chain_match": {"destination_port": app_port},
                "filters": [hcm(
                    &format!("inbound_0.0.0.0_{app_port}"),
                    route,
                    wasm_filters("provider", Side::Server, wasm_dir),
                    access_log,
                )],
            },
            {
                "name": "virtualInbound-catchall-http",
                "filters": [tcp_proxy("InboundPassthroughCluster", "InboundPassthroughCluster")],
            },
        ],
    });
    let original_dst = |name: &str| {
        json!({
            "name": name,
            "type": "ORIGINAL_DST",
            "lb_policy": "CLUSTER_PROVIDED",
            "connect_timeout": "10s",
            // Istio's inbound clusters reach the app from 127.0.0.6, which
            // the capture rules return unredirected.
            "upstream_bind_config": {"source_address": {"address": "127.0.0.6", "port_value": 0}},
        })
    };
    bootstrap(
        &format!("sidecar~{pod_ip}~provider.{NAMESPACE}~{NAMESPACE}.svc.cluster.local"),
        vec![virtual_inbound],
        vec![
            original_dst(&inbound_cluster),
            original_dst("InboundPassthroughCluster"),
            json!({"name": "BlackHoleCluster", "type": "STATIC", "connect_timeout": "10s"}),
        ],
    )
}

/// The outbound cluster Istio builds for `outbound|PORT||HOST` (the fields
/// that matter beside the patch: EDS, least request, the circuit breakers
/// istiod opens wide), before any EnvoyFilter.
pub fn outbound_cluster(name: &str, eds_path: &str) -> Value {
    json!({
        "name": name,
        "type": "EDS",
        "connect_timeout": "10s",
        "lb_policy": "LEAST_REQUEST",
        "eds_cluster_config": {
            "service_name": name,
            "eds_config": {"resource_api_version": "V3", "path_config_source": {"path": eds_path}},
        },
        "circuit_breakers": {"thresholds": [{
            "max_connections": 4294967295u32,
            "max_pending_requests": 4294967295u32,
            "max_requests": 4294967295u32,
            "max_retries": 4294967295u32,
            "track_remaining": true,
        }]},
        "common_lb_config": {},
        "metadata": {"filter_metadata": {"istio": {"services": [{"host": name.rsplit('|').next().unwrap_or(name), "name": "provider", "namespace": NAMESPACE}]}}},
    })
}

/// Istio's default route retry policy (`pilot/pkg/networking/core/route/retry`):
/// `retriable-status-codes` with no codes listed, so a 503 is not retried.
pub fn default_retry_policy() -> Value {
    json!({
        "retry_on": "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes",
        "num_retries": 2,
        "retry_host_predicate": [{
            "name": "envoy.retry_host_predicates.previous_hosts",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"},
        }],
        "host_selection_retry_max_attempts": 5,
    })
}

/// Calls `f` on every JSON object in `value`, nested ones included (the
/// rendered configs' filters and policies sit at several depths).
pub fn for_each_object(value: &mut Value, mut f: impl FnMut(&mut serde_json::Map<String, Value>)) {
    let mut visit = vec![value];
    while let Some(v) = visit.pop() {
        match v {
            Value::Object(map) => {
                f(map);
                visit.extend(map.values_mut());
            }
            Value::Array(items) => visit.extend(items.iter_mut()),
            _ => {}
        }
    }
}

/// Removes the HTTP filters `unwanted` picks from every filter chain of
/// `config`; returns how many.
pub fn remove_http_filters(config: &mut Value, unwanted: impl Fn(&Value) -> bool) -> usize {
    let mut removed = 0;
    for_each_object(config, |map| {
        if let Some(Value::Array(filters)) = map.get_mut("http_filters") {
            let before = filters.len();
            filters.retain(|f| !unwanted(f));
            removed += before - filters.len();
        }
    });
    removed
}

/// A consumer without graceful_consumer (an ingress gateway, a namespace
/// the WasmPlugin does not select): removes it from every filter chain of
/// `config`; returns how many were removed.
pub fn without_consumer_filter(config: &mut Value) -> usize {
    remove_http_filters(config, |f| {
        f.pointer("/typed_config/config/root_id") == Some(&json!("graceful_consumer"))
    })
}

/// What istiod makes of a VirtualService whose `retries.retryOn` adds
/// `503` to Istio's default (`pilot/pkg/networking/core/route/retry/retry.go`
/// reads a number in `retryOn` as a retriable status code): the routes of
/// `config` retry a 503 on another host. Returns how many policies changed.
pub fn retry_503(config: &mut Value) -> usize {
    let mut changed = 0;
    for_each_object(config, |map| {
        if let Some(policy) = map.get_mut("retry_policy").and_then(Value::as_object_mut) {
            if policy.get("retry_host_predicate").is_some() {
                policy.insert("retriable_status_codes".into(), json!([503]));
                changed += 1;
            }
        }
    });
    changed
}

/// A consumer pod's sidecar calling `service_host` on `service_port`
/// (its ClusterIP `vip`): `virtualOutbound` hands the app's captured
/// connections to the `0.0.0.0_PORT` listener, whose route goes to the
/// outbound cluster, with the EnvoyFilter's patches merged into it.
pub fn consumer_sidecar(
    pod_ip: &str,
    service_host: &str,
    vip: &str,
    service_port: u16,
    eds_path: &str,
    wasm_dir: &std::path::Path,
    access_log: &str,
) -> Value {
    let cluster_name = format!("outbound|{service_port}||{service_host}");
    let mut cluster = outbound_cluster(&cluster_name, eds_path);
    for (matcher, value) in cluster_patches(STEERING) {
        if patch_matches(&matcher, &cluster_name) {
            merge_patch(&mut cluster, &value);
        }
    }
    let short = service_host.split('.').next().unwrap_or(service_host);
    let mut domains: Vec<String> = [service_host.to_string(), short.to_string(), vip.to_string()]
        .iter()
        .flat_map(|d| [d.clone(), format!("{d}:{service_port}")])
        .collect();
    // The Host the tests' HTTP clients send (`client::Conn`), standing for
    // `provider`.
    domains.push("test".into());
    let route = json!({
        "name": service_port.to_string(),
        "virtual_hosts": [{
            "name": format!("{service_host}:{service_port}"),
            "domains": domains,
            "routes": [{
                "name": "default",
                "match": {"prefix": "/"},
                "route": {"cluster": cluster_name, "timeout": "0s", "retry_policy": default_retry_policy()},
            }],
        }],
    });
    let service_listener = json!({
        "name": format!("0.0.0.0_{service_port}"),
        "address": socket("0.0.0.0", service_port),
        "traffic_direction": "OUTBOUND",
        "bind_to_port": false,
        "filter_chains": [{"filters": [hcm(
            &format!("outbound_0.0.0.0_{service_port}"),
            route,
            wasm_filters("consumer", Side::Client, wasm_dir),
            access_log,
        )]}],
    });
    let virtual_outbound = json!({
        "name": "virtualOutbound",
        "address": socket("0.0.0.0", OUTBOUND_PORT),
        "traffic_direction": "OUTBOUND",
        "use_original_dst": true,
        "filter_chains": [{"name": "virtualOutbound-catchall-tcp", "filters": [tcp_proxy("PassthroughCluster", "PassthroughCluster")]}],
    });
    bootstrap(
        &format!("sidecar~{pod_ip}~consumer.{NAMESPACE}~{NAMESPACE}.svc.cluster.local"),
        vec![
            patch_outbound_listener(virtual_outbound),
            patch_outbound_listener(service_listener),
        ],
        vec![
            cluster,
            json!({"name": "PassthroughCluster", "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED", "connect_timeout": "10s"}),
        ],
    )
}

/// What istiod makes of the example's `locality.yaml` DestinationRule on
/// the consumer's outbound `cluster` (`cluster_traffic_policy.go`):
/// `applyOutlierDetection` turns `outlierDetection` into Envoy's
/// `outlier_detection` (a threshold of 0 enforces nothing; success rate
/// enforcement always 0) and sets `healthy_panic_threshold` to
/// `minHealthPercent` (0); `localityLbSetting: {enabled: true}` without
/// `failover`, `failoverPriority` or `distribute` sets no
/// `locality_weighted_lb_config` (`applyLocalityLoadBalancer`). The EDS
/// priorities by zone it also brings are the test's to write
/// (`write_eds_localities`). Panics if the file asks for more than that.
pub fn apply_locality_failover(config: &mut Value, cluster: &str) {
    let rule = documents("locality.yaml")
        .into_iter()
        .find(|d| d["kind"] == "DestinationRule")
        .unwrap_or_else(|| panic!("examples/istio/locality.yaml has no DestinationRule"));
    let policy = &rule["spec"]["trafficPolicy"];
    assert_eq!(
        policy["loadBalancer"]["localityLbSetting"],
        json!({"enabled": true}),
        "locality.yaml: anything beyond enabled brings back locality_weighted_lb_config"
    );
    let outlier = &policy["outlierDetection"];
    assert!(
        outlier.is_object(),
        "locality.yaml: failover needs outlierDetection"
    );
    let mut envoy_outlier = json!({"enforcing_success_rate": 0});
    for (field, threshold, enforcing) in [
        (
            "consecutive5xxErrors",
            "consecutive_5xx",
            "enforcing_consecutive_5xx",
        ),
        (
            "consecutiveGatewayErrors",
            "consecutive_gateway_failure",
            "enforcing_consecutive_gateway_failure",
        ),
    ] {
        if let Some(v) = outlier[field].as_u64() {
            envoy_outlier[threshold] = json!(v);
            envoy_outlier[enforcing] = json!(if v > 0 { 100 } else { 0 });
        }
    }
    let target = cluster_mut(config, cluster);
    target["outlier_detection"] = envoy_outlier;
    target["common_lb_config"]["healthy_panic_threshold"] = json!({"value": 0});
}

/// Delivers the upstream instance as the example's EnvoyFilter
/// `graceful-consumer-upstream` does on Istio: its CLUSTER patch merged
/// into `cluster` (matched as [`consumer_sidecar`] matches), and its
/// EXTENSION_CONFIG value served over ECDS. Stand-ins, named: the ECDS
/// answer is a file in `dir` (`path_config_source`) where istiod serves it
/// over ADS under the same name, and its `oci://` module is the local
/// `.wasm` where pilot-agent would have written the fetched one
/// (`pkg/wasm/convert.go`). Panics if the example's shape changed.
pub fn deliver_upstream_instance(
    config: &mut Value,
    cluster: &str,
    wasm_dir: &std::path::Path,
    dir: &std::path::Path,
) {
    let filter = of_kind("EnvoyFilter")
        .into_iter()
        .find(|f| f["metadata"]["name"] == UPSTREAM_INSTANCE)
        .unwrap_or_else(|| panic!("consumer.yaml has no EnvoyFilter {UPSTREAM_INSTANCE}"));
    let patches = filter["spec"]["configPatches"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let extension = patches
        .iter()
        .find(|p| p["applyTo"] == "EXTENSION_CONFIG" && p["patch"]["operation"] == "ADD")
        .map(|p| p["patch"]["value"].clone())
        .unwrap_or_else(|| panic!("{UPSTREAM_INSTANCE}: no EXTENSION_CONFIG ADD"));
    let name = extension["name"].as_str().unwrap_or_default().to_string();
    // What pilot-agent hands Envoy: the fetched module as a local file.
    let mut typed = extension["typed_config"].clone();
    let vm = &mut typed["config"]["vm_config"];
    let url = vm["code"]["remote"]["http_uri"]["uri"]
        .as_str()
        .unwrap_or_else(|| panic!("{UPSTREAM_INSTANCE}: no remote code uri"))
        .to_string();
    vm["code"] = json!({"local": {"filename": local_module(&url, wasm_dir)}});
    let ecds = dir.join(format!("{name}.ecds.json"));
    let answer = json!({
        "version_info": "1",
        "resources": [{
            "@type": "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig",
            "name": name,
            "typed_config": typed,
        }],
    });
    std::fs::write(&ecds, answer.to_string()).unwrap_or_else(|e| panic!("{}: {e}", ecds.display()));
    let target = cluster_mut(config, cluster);
    let mut applied = 0;
    for p in patches.iter().filter(|p| p["applyTo"] == "CLUSTER") {
        if patch_matches(&p["match"], cluster) {
            merge_patch(target, &p["patch"]["value"]);
            applied += 1;
        }
    }
    assert_eq!(applied, 1, "{UPSTREAM_INSTANCE}: one CLUSTER patch");
    // istiod's ADS for this name: the file.
    let mut sources = 0;
    for_each_object(target, |map| {
        if map.get("name").and_then(Value::as_str) == Some(name.as_str()) {
            if let Some(source) = map
                .get_mut("config_discovery")
                .and_then(|d| d.get_mut("config_source"))
            {
                assert!(source["ads"].is_object(), "the example asks istiod (ads)");
                *source = json!({
                    "resource_api_version": "V3",
                    "path_config_source": {"path": ecds.display().to_string()},
                });
                sources += 1;
            }
        }
    });
    assert_eq!(
        sources, 1,
        "{UPSTREAM_INSTANCE}: one filter discovered by name"
    );
}

/// The type of a WasmPlugin's filter config, and the one istiod adds to
/// its ECDS `type_urls` (a deny-all RBAC when a module cannot be fetched).
const WASM_FILTER_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
const RBAC_FILTER_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC";

/// `config` (a sidecar's, as [`provider_sidecar`] or [`consumer_sidecar`]
/// build it) as istiod delivers it to a proxy whose ADS server is `xds`:
/// the bootstrap holds the admin, the Prometheus and readiness listeners,
/// `prometheus_stats` and `xds-grpc`
/// (`tools/packaging/common/envoy_bootstrap.json`: delta ADS, the
/// default since `ISTIO_DELTA_XDS`; LDS and CDS with no initial fetch
/// timeout); the listeners come over LDS, the service clusters over CDS
/// and their endpoints over EDS, and each WasmPlugin's filter over ECDS
/// with istiod's config source and type URLs
/// (`toEnvoyHTTPTrafficExtension`). An EXTENSION_CONFIG the config reads
/// from a file ([`deliver_upstream_instance`]) is served over ECDS too, as
/// istiod serves an EnvoyFilter's. The stand-in serving it is
/// `tools/xds_server.py`, not istiod.
pub fn over_xds(config: &Value, xds: std::net::SocketAddr) -> crate::support::xds::AdsConfig {
    use crate::support::xds::{ads_source, AdsConfig};
    let node = config["node"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("a sidecar config without node.id"))
        .to_string();
    let mut wasm_names = Vec::new();
    let mut bootstrap = config.clone();
    for_each_object(&mut bootstrap, |map| {
        if let Some(Value::Array(filters)) = map.get("http_filters") {
            for f in filters {
                if f["typed_config"]["@type"] == WASM_FILTER_TYPE {
                    if let Some(name) = f["name"].as_str() {
                        wasm_names.push(name.to_string());
                    }
                }
            }
        }
    });
    let names: Vec<&str> = wasm_names.iter().map(String::as_str).collect();
    let mut ads = AdsConfig::split_to(bootstrap, &node, xds, &names);
    ads.clusters_over_cds(&["prometheus_stats"]);
    ads.static_listeners(&["prometheus", "health"]);
    ads.delta_through("xds-grpc");
    for listener in &mut ads.listeners {
        for_each_object(listener, |map| {
            let name = map.get("name").and_then(Value::as_str).unwrap_or_default();
            if names.contains(&name) && map.contains_key("config_discovery") {
                map.insert(
                    "config_discovery".into(),
                    json!({"config_source": ads_source(),
                           "type_urls": [WASM_FILTER_TYPE, RBAC_FILTER_TYPE]}),
                );
            }
        });
    }
    let mut from_files = Vec::new();
    for cluster in &mut ads.clusters {
        for_each_object(cluster, |map| {
            if let Some(eds) = map.get_mut("eds_config") {
                *eds = ads_source();
            }
            let Some(source) = map
                .get_mut("config_discovery")
                .and_then(|d| d.get_mut("config_source"))
            else {
                return;
            };
            if let Some(path) = source["path_config_source"]["path"].as_str() {
                let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
                let answer: Value =
                    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
                from_files.extend(answer["resources"].as_array().cloned().unwrap_or_default());
                *source = ads_source();
            }
        });
    }
    ads.extensions.extend(from_files);
    ads
}
