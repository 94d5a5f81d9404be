//! `examples/envoy-gateway` against real Envoy 1.40. No Kubernetes runs
//! here: `graceful_harness::platform::envoy_gateway` does what Envoy
//! Gateway's translator does with the documents (each step names the file
//! of envoyproxy/gateway it follows, as of v1.9), and the tests hand the
//! result to Envoy:
//!
//! - the fields a user gets wrong are checked on the documents themselves,
//!   the plugin configuration by graceful_consumer's own parser;
//! - the listener, route and cluster Envoy Gateway generates from them
//!   (the EnvoyExtensionPolicy's wasm filter, the BackendTrafficPolicy's
//!   load balancer and retries, or instead the EnvoyPatchPolicy's JSON patch
//!   applied to the cluster Envoy Gateway generates) pass
//!   `envoy --mode validate`, and the patch's documented limit is rejected
//!   with Envoy's message;
//! - that Envoy, started for real in front of two test upstreams, steers
//!   every request away from the one that answered `x-graceful-closing`,
//!   and without override_host on the cluster it does not;
//! - backends with no sidecar (`front-drain.yaml`): the documents agree
//!   with one another, with the example and with Envoy Gateway's names; the
//!   Gateway's listener patched by the control port's EnvoyPatchPolicy
//!   passes `envoy --mode validate`, and started for real the control port
//!   answers the front endpoints (403 to an address that is no member, 202
//!   to a member's) while the public port routes the same paths to the
//!   backend, never to the filter.
//!
//! What differs from a gateway: see `platform::envoy_gateway`.

use std::fs;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;

use graceful_core::consumer::config::ConsumerConfig;
use graceful_core::shared::duration::parse_duration;
use graceful_harness::platform::envoy_gateway::{
    self, apply_patch_policy, apply_patches, json_patch::apply_operation, listener_mut, str_field,
    Example, FrontExample, ADMIN_CLUSTER, CLUSTER_TYPE, ENVOY_APP_LABELS, EXAMPLE, FRONT,
    LISTENER_TYPE, OWNING_GATEWAY_NAME, OWNING_GATEWAY_NAMESPACE,
};
use graceful_harness::support::client::{load, Conn, Response};
use graceful_harness::support::envoy::{
    candidate_port, envoy_binary, eventually, listener_stats, load_assignment, repo_root,
    scratch_path, write_eds, Envoy, EnvoySpec,
};
use graceful_harness::support::upstream::{hook_binary, AppConfig, Upstream};
use graceful_harness::support::xds::{self, XdsServer};
use serde_json::{json, Value};

const GATEWAY_API: &str = "gateway.networking.k8s.io";
const EG_API: &str = "gateway.envoyproxy.io/v1alpha1";
/// What Envoy 1.40 prints when a cluster has both (observed).
const ENVOY_LB_CONFLICT: &str = "load_balancing_policy cannot be combined with partial fields (zone_aware_lb_config, locality_weighted_lb_config, consistent_hashing_lb_config) of common_lb_config";

// ---------------------------------------------------------------------------
// Envoy

/// `envoy --mode validate` on `config`; (accepted, what Envoy printed).
fn validate(name: &str, config: &Value) -> (bool, String) {
    let path = scratch_path(name, "yaml");
    fs::write(
        &path,
        serde_json::to_string_pretty(config).unwrap_or_default(),
    )
    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let binary = envoy_binary();
    let out = Command::new(&binary)
        .args(["--mode", "validate", "--log-level", "warn", "-c"])
        .arg(&path)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {} ({e}): run `make envoy` first",
                binary.display()
            )
        });
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), printed)
}

fn assert_accepted(name: &str, config: &Value) {
    let (ok, printed) = validate(name, config);
    assert!(ok, "envoy --mode validate rejected {name}:\n{printed}");
    assert!(printed.contains("OK"), "{name}: {printed}");
}

fn scratch_eds(name: &str, cluster: &str, endpoints: &[SocketAddr]) -> std::path::PathBuf {
    let eds = scratch_path(&format!("{name}-eds"), "yaml");
    write_eds(&eds, cluster, endpoints);
    eds
}

/// The override_host policy at the top of a cluster's load balancing.
fn override_host_of(cluster: &Value) -> &Value {
    let policies = &cluster["load_balancing_policy"]["policies"];
    assert_eq!(policies.as_array().map(Vec::len), Some(1), "{policies}");
    let top = &policies[0]["typed_extension_config"];
    assert_eq!(
        top["name"], "envoy.load_balancing_policies.override_host",
        "{top}"
    );
    &top["typed_config"]
}

// ---------------------------------------------------------------------------
// The tests

#[test]
fn it_has_the_fields_envoy_gateway_and_the_filter_expect() {
    let ex = Example::load();
    let route = ex.route().to_string();
    let ns = ex.namespace().to_string();
    let cluster = envoy_gateway::rule_cluster(&ns, &route, 0);

    for (what, doc) in [
        ("EnvoyExtensionPolicy", &ex.eep),
        ("BackendTrafficPolicy", &ex.btp),
        ("EnvoyPatchPolicy", &ex.epp),
    ] {
        assert_eq!(doc["apiVersion"], EG_API, "{what}");
        assert_eq!(
            doc["metadata"]["namespace"],
            ns.as_str(),
            "{what}: one namespace for all"
        );
    }

    // EnvoyExtensionPolicy (api/v1alpha1/wasm_types.go).
    let refs = ex.eep["spec"]["targetRefs"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(refs.len(), 1, "one HTTPRoute");
    assert_eq!(refs[0]["group"], GATEWAY_API);
    assert_eq!(refs[0]["kind"], "HTTPRoute");
    let wasm = ex.eep["spec"]["wasm"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(wasm.len(), 1, "one wasm extension");
    let w = &wasm[0];
    assert_eq!(
        w["code"]["type"], "Image",
        "code.type: Image (HTTP would want a URL of the .wasm)"
    );
    let url = str_field(&w["code"]["image"]["url"], "code.image.url");
    // Envoy Gateway adds oci:// itself (internal/gatewayapi/envoyextensionpolicy.go);
    // its documented form is registry/image:tag.
    assert!(
        !url.contains("://"),
        "image url {url:?}: registry/image:tag, no scheme"
    );
    let (repo, tag) = url
        .rsplit_once(':')
        .filter(|(repo, _)| repo.contains('/'))
        .unwrap_or_else(|| {
            panic!("image url {url:?} has no tag (Envoy Gateway would pull :latest)")
        });
    assert!(
        repo.ends_with("/graceful_consumer") && !tag.is_empty() && !tag.contains('/'),
        "image url {url:?}: `make push` pushes $REGISTRY/graceful_consumer:$TAG"
    );
    assert_eq!(
        w["failOpen"], true,
        "failOpen: true, or a fetch failure answers 500 on the route"
    );
    // rootID is the plugin's root_id: the module registers graceful_consumer.
    assert_eq!(w["rootID"], "graceful_consumer");
    assert!(
        w["config"].is_object(),
        "config: graceful_consumer's JSON object"
    );
    let config = ex.consumer_config();
    assert_eq!(
        config.admin_cluster.as_deref(),
        Some(ADMIN_CLUSTER),
        "admin_cluster: the bootstrap's cluster at the proxy's admin"
    );

    // BackendTrafficPolicy (api/v1alpha1/loadbalancer_types.go, retry_types.go).
    assert_eq!(
        ex.btp["spec"]["targetRefs"], ex.eep["spec"]["targetRefs"],
        "the same HTTPRoute"
    );
    let lb = &ex.btp["spec"]["loadBalancer"];
    assert_eq!(
        lb["endpointOverride"]["extractFrom"],
        json!([{"header": config.override_host_header}]),
        "endpointOverride reads graceful_consumer's override_host_header"
    );
    envoy_gateway::lb_names(str_field(&lb["type"], "loadBalancer.type"));
    let triggers = &ex.btp["spec"]["retry"]["retryOn"]["triggers"];
    for t in ["connect-failure", "retriable-status-codes"] {
        assert!(
            triggers
                .as_array()
                .is_some_and(|a| a.iter().any(|x| x == t)),
            "retry on {t}: {triggers}"
        );
    }
    assert_eq!(
        ex.btp["spec"]["retry"]["retryOn"]["httpStatusCodes"],
        json!([503])
    );

    // EnvoyPatchPolicy (api/v1alpha1/envoypatchpolicy_types.go): attached
    // to the Gateway, each entry a JSON patch of the route's cluster.
    assert_eq!(ex.epp["spec"]["type"], "JSONPatch");
    let target = &ex.epp["spec"]["targetRef"];
    assert_eq!(target["group"], GATEWAY_API);
    assert_eq!(target["kind"], "Gateway");
    assert!(target["name"].as_str().is_some_and(|n| !n.is_empty()));
    let entries = ex.epp["spec"]["jsonPatches"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(entries.len(), 3);
    for e in &entries {
        assert_eq!(e["type"], CLUSTER_TYPE);
        assert_eq!(
            e["name"],
            cluster.as_str(),
            "the cluster of rule 0 of HTTPRoute {route}"
        );
    }
    let oh = &entries[0]["operation"]["value"]["typed_extension_config"]["typed_config"];
    assert_eq!(
        oh["override_host_sources"],
        json!([{"header": config.override_host_header}])
    );

    // The EDIT HERE block names what the documents use.
    let header = fs::read_to_string(repo_root().join(EXAMPLE)).unwrap();
    let block: String = header
        .lines()
        .skip_while(|l| !l.contains("EDIT HERE"))
        .skip(1)
        .take_while(|l| !l.starts_with("# ----"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(!block.is_empty(), "{EXAMPLE}: no EDIT HERE block");
    let gateway = str_field(&target["name"], "targetRef.name");
    let registry = repo.trim_end_matches("/graceful_consumer");
    for name in [registry, ns.as_str(), route.as_str(), gateway, tag] {
        assert!(
            block.contains(name),
            "EDIT HERE block does not list {name:?}:\n{block}"
        );
    }
}

#[test]
fn it_rejects_a_config_field_the_filter_does_not_have() {
    // With failOpen a wrong field would silently turn the filter off on a
    // gateway; the check above parses the config with the filter's parser,
    // which refuses it (the same parser runs in on_configure).
    let ex = Example::load();
    let mut config = ex.eep["spec"]["wasm"][0]["config"].clone();
    config["tombstone_tll"] = json!("30s");
    let err = ConsumerConfig::from_json(config.to_string().as_bytes())
        .err()
        .unwrap_or_else(|| panic!("a misspelt field must be refused"));
    assert_eq!(err.field, "tombstone_tll", "{err}");
}

#[test]
fn envoy_accepts_the_gateway_envoy_gateway_generates_from_the_example() {
    let ex = Example::load();
    let name = envoy_gateway::rule_cluster(ex.namespace(), ex.route(), 0);
    let eds = scratch_eds("eg-validate", &name, &["127.0.0.1:18081".parse().unwrap()]);
    // `envoy --mode validate` binds nothing: any ports will do.
    let (admin, listen) = (9901, 10080);

    // extension-policy.yaml as applied: the BTP's endpointOverride.
    let btp_lb = envoy_gateway::load_balancing_policy(Some(&ex.btp["spec"]["loadBalancer"]));
    let cluster = envoy_gateway::cluster(&name, &eds, btp_lb);
    let oh = override_host_of(&cluster);
    assert_eq!(
        oh["override_host_sources"][0]["header"],
        ex.consumer_config().override_host_header
    );
    assert_accepted(
        "eg-btp",
        &envoy_gateway::gateway_config(&ex, cluster.clone(), admin, listen),
    );

    // Envoy Gateway v1.5-v1.7 also set the legacy lb_policy (CLUSTER_PROVIDED
    // with endpointOverride): Envoy ignores it next to load_balancing_policy.
    let mut legacy = cluster;
    legacy["lb_policy"] = json!("CLUSTER_PROVIDED");
    assert_accepted(
        "eg-btp-v1.6",
        &envoy_gateway::gateway_config(&ex, legacy, admin, listen),
    );

    // envoy-patch-policy.yaml instead, on the clusters Envoy Gateway
    // generates without endpointOverride: its default, and zone-aware
    // routing (BackendTrafficPolicy zoneAware.preferLocal), whose settings
    // the patch keeps.
    let zone_aware = json!({"policies": [envoy_gateway::lb_policy("least_request", "LeastRequest", json!({
        "locality_lb_config": {"zone_aware_lb_config": {"min_cluster_size": 6}}
    }))]});
    for (label, generated) in [
        ("default", envoy_gateway::load_balancing_policy(None)),
        ("zone-aware", zone_aware),
    ] {
        let mut cluster = envoy_gateway::cluster(&name, &eds, generated.clone());
        let errors = apply_patch_policy(&ex.epp, &mut cluster);
        assert!(errors.is_empty(), "{label}: {errors:?}");
        let oh = override_host_of(&cluster);
        assert_eq!(
            oh["override_host_sources"],
            json!([{"header": ex.consumer_config().override_host_header}])
        );
        assert_eq!(
            oh["fallback_policy"], generated,
            "{label}: Envoy Gateway's own policy, unchanged, is the fallback"
        );
        assert_accepted(
            &format!("eg-epp-{label}"),
            &envoy_gateway::gateway_config(&ex, cluster, admin, listen),
        );
    }
}

#[test]
fn envoy_rejects_the_patch_on_a_cluster_with_common_lb_config_locality() {
    let ex = Example::load();
    let name = envoy_gateway::rule_cluster(ex.namespace(), ex.route(), 0);
    let eds = scratch_eds("eg-reject", &name, &["127.0.0.1:18081".parse().unwrap()]);
    // `envoy --mode validate` binds nothing: any ports will do.
    let (admin, listen) = (9901, 10080);

    // Envoy Gateway v1.4's shape: the first entry still applies (its path
    // is created), the move and the remove find nothing and fail, and the
    // cluster Envoy gets has both.
    let mut cluster = envoy_gateway::cluster_v1_4(&name, &eds);
    let errors = apply_patch_policy(&ex.epp, &mut cluster);
    assert_eq!(
        errors.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        vec![1, 2],
        "entries 2 and 3 fail: {errors:?}"
    );
    override_host_of(&cluster);
    let (ok, printed) = validate(
        "eg-epp-v1.4",
        &envoy_gateway::gateway_config(&ex, cluster, admin, listen),
    );
    assert!(
        !ok,
        "Envoy accepted load_balancing_policy next to common_lb_config locality:\n{printed}"
    );
    assert!(printed.contains(ENVOY_LB_CONFLICT), "{printed}");

    // The same for zone-aware settings in common_lb_config.
    let mut cluster =
        envoy_gateway::cluster(&name, &eds, envoy_gateway::load_balancing_policy(None));
    assert!(apply_patch_policy(&ex.epp, &mut cluster).is_empty());
    cluster["common_lb_config"] = json!({"zone_aware_lb_config": {"min_cluster_size": 6}});
    let (ok, printed) = validate(
        "eg-epp-zone-aware-common",
        &envoy_gateway::gateway_config(&ex, cluster, admin, listen),
    );
    assert!(!ok && printed.contains(ENVOY_LB_CONFLICT), "{printed}");
}

/// A gateway-shaped Envoy in front of two test upstreams (instances a1
/// and b1), its cluster built by `cluster`.
/// A gateway's Envoy configured as Envoy Gateway configures it, over a
/// delta ADS stream from the stand-in (`envoy_gateway::over_xds`).
struct Gateway {
    envoy: Envoy,
    /// The gateway's control plane, and what it serves but endpoints.
    xds: XdsServer,
    resources: Value,
    listener: SocketAddr,
    cluster: String,
    ups: Vec<Upstream>,
}

/// What a [`Gateway`] runs besides its cluster.
struct Shape {
    /// The policies as applied.
    ex: Example,
    /// One upstream at each address (instances a1, b1).
    ips: [Ipv4Addr; 2],
    /// An EnvoyPatchPolicy for the Gateway's HTTP listener, applied to the
    /// listener as Envoy Gateway serves it (its routes over RDS).
    listener_patch: Option<Value>,
}

impl Shape {
    /// `extension-policy.yaml` (and `envoy-patch-policy.yaml`), both
    /// upstreams on 127.0.0.1.
    fn example() -> Shape {
        Shape {
            ex: Example::load(),
            ips: [Ipv4Addr::LOCALHOST; 2],
            listener_patch: None,
        }
    }
}

impl Gateway {
    async fn start(name: &str, cluster: impl FnOnce(&Example, &str, &Path) -> Value) -> Gateway {
        Gateway::start_shaped(name, Shape::example(), cluster).await
    }

    async fn start_shaped(
        name: &str,
        shape: Shape,
        cluster: impl FnOnce(&Example, &str, &Path) -> Value,
    ) -> Gateway {
        let ex = shape.ex;
        let mut ups = Vec::new();
        for (id, ip) in ["a1", "b1"].into_iter().zip(shape.ips) {
            let u = Upstream::start_with(SocketAddr::from((ip, 0)), AppConfig::default())
                .await
                .unwrap_or_else(|e| panic!("upstream on {ip}: {e}"));
            u.set_instance(id);
            ups.push(u);
        }
        let cluster_name = envoy_gateway::rule_cluster(ex.namespace(), ex.route(), 0);
        let addrs: Vec<SocketAddr> = ups.iter().map(|u| u.addr).collect();
        let mut xds = XdsServer::start(name).await;
        // The bootstrap is written where the spec will read its "template"
        // (an absolute path replaces envoy/); it has no placeholders.
        let config_path = scratch_path(name, "yaml");
        let spec = EnvoySpec::new(name, &config_path.display().to_string());
        let admin: u16 = spec
            .value("ADMIN_PORT")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no admin port"));
        // The listener binds a port of its own (read back below); the
        // admin's is picked: its cluster points at it.
        let listen = 0;
        // The cluster's EDS source is the file path's place; over_xds
        // makes it Envoy Gateway's ADS.
        let eds = scratch_path(&format!("{name}-eds"), "yaml");
        let config =
            envoy_gateway::gateway_config(&ex, cluster(&ex, &cluster_name, &eds), admin, listen);
        let ads = envoy_gateway::over_xds(&config, xds.address());
        let mut resources = ads.resources();
        if let Some(epp) = &shape.listener_patch {
            let listener = listener_mut(&mut resources[xds::LISTENER], &ex.http_listener());
            let errors = apply_patches(epp, LISTENER_TYPE, listener);
            assert!(errors.is_empty(), "the listener patch: {errors:?}");
        }
        let mut first = resources.clone();
        first[xds::ENDPOINTS] = json!([xds::cluster_load_assignment(&cluster_name, &addrs)]);
        xds.push(&first);
        fs::write(
            &config_path,
            serde_json::to_string_pretty(&ads.bootstrap).unwrap_or_default(),
        )
        .unwrap_or_else(|e| panic!("{}: {e}", config_path.display()));
        let envoy = spec.start().await;
        let listener = envoy.listener(&ex.http_listener()).await;
        let gw = Gateway {
            envoy,
            xds,
            resources,
            listener,
            cluster: cluster_name,
            ups,
        };
        let members = format!("cluster.{}.membership_total", gw.cluster);
        eventually(
            "both upstreams in the cluster",
            Duration::from_secs(10),
            || async { (gw.envoy.stat(&members).await == Some(2)).then_some(()) },
        )
        .await;
        gw
    }

    fn counts(&self) -> Vec<u64> {
        self.ups.iter().map(Upstream::app_requests).collect()
    }

    /// `per_connection` requests on each of `connections`: every one a 200,
    /// and every upstream served some.
    async fn warm(&self, connections: usize, per_connection: usize) {
        let warm = load(self.listener, connections, per_connection, "/").await;
        assert!(warm.iter().all(|r| r.status == 200));
        assert!(
            self.counts().iter().all(|&c| c > 0),
            "every upstream served: {:?}",
            self.counts()
        );
    }

    /// Makes upstream 0 answer closing, then sends requests on one
    /// connection until the first closing-marked answer (every one a 200);
    /// returns the upstreams' counts then.
    async fn close_first_until_marked(&self) -> Vec<u64> {
        self.ups[0].set_closing(true);
        let mut conn = Conn::http1(self.listener)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        for _ in 0..200 {
            let r = conn.get("/").await.unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(r.status, 200);
            if r.header("x-graceful-closing").as_deref() == Some("true") {
                return self.counts();
            }
        }
        panic!("no closing-marked answer: {:?}", self.counts());
    }

    /// Envoy Gateway's push after the backend's EndpointSlice changed:
    /// `endpoints` with their EDS health status (`DRAINING` for a pod
    /// that is terminating or not ready; "" for the others, which Envoy
    /// Gateway leaves `UNKNOWN`).
    fn push_endpoints(&mut self, endpoints: &[(SocketAddr, &str)]) {
        let mut resources = self.resources.clone();
        resources[xds::ENDPOINTS] = json!([load_assignment(
            &self.cluster,
            &[(0, "", endpoints.to_vec())]
        )]);
        self.xds.push(&resources);
    }

    /// Waits for a stat of the gateway's Envoy to reach `want`.
    async fn until_stat(&self, stat: &str, want: u64) {
        eventually(
            &format!("{stat} = {want}"),
            Duration::from_secs(10),
            || async { (self.envoy.stat(stat).await == Some(want)).then_some(()) },
        )
        .await;
    }

    /// Waits for graceful_consumer's next read of the members from the
    /// admin (through the bootstrap's cluster), which follows a push.
    async fn until_members_read(&self) {
        let stat = format!("cluster.{ADMIN_CLUSTER}.upstream_rq_completed");
        let before = self.envoy.stat(&stat).await.unwrap_or(0);
        eventually(
            "a read of the members from the admin",
            Duration::from_secs(10),
            || async { (self.envoy.stat(&stat).await.unwrap_or(0) > before).then_some(()) },
        )
        .await;
    }

    /// Accepted connections per worker on the listener.
    async fn worker_connections(&self) -> Vec<u64> {
        let prefix = listener_stats(self.listener.ip());
        let mut out = Vec::new();
        for w in 0..2 {
            let stat = format!("{prefix}.worker_{w}.downstream_cx_total");
            out.push(self.envoy.stat(&stat).await.unwrap_or(0));
        }
        out
    }

    /// Warms up (both upstreams serve, the admin has been read), makes
    /// upstream a1 close, sends requests until the first marked answer,
    /// then batches of 200 on 8 connections until both workers served some.
    /// Returns the upstreams' counts at the mark and after, the requests
    /// sent after the mark, and the admin reads.
    async fn close_one_and_send(&self) -> (Vec<u64>, Vec<u64>, u64, u64) {
        self.warm(4, 10).await;
        // graceful_consumer reads the members of the clusters it routes to
        // from the admin, through the bootstrap's cluster.
        let admin_reads = format!("cluster.{ADMIN_CLUSTER}.upstream_rq_200");
        let admin_calls = eventually(
            &format!("a /clusters answer through {ADMIN_CLUSTER}"),
            Duration::from_secs(5),
            || async { self.envoy.stat(&admin_reads).await.filter(|&n| n > 0) },
        )
        .await;

        let at_mark = self.close_first_until_marked().await;
        // The kernel spreads new connections over the workers by hash: a
        // batch of 8 can all land on one (seen once in CI), so batches go
        // on, a bounded number, until each worker has taken some.
        let cx_before = self.worker_connections().await;
        let mut cx_after = cx_before.clone();
        let mut sent = 0;
        for _ in 0..10 {
            let after = load(self.listener, 8, 25, "/").await;
            assert!(after.iter().all(|r| r.status == 200));
            sent += after.len() as u64;
            cx_after = self.worker_connections().await;
            if cx_after[0] > cx_before[0] && cx_after[1] > cx_before[1] {
                break;
            }
        }
        assert!(
            cx_after[0] > cx_before[0] && cx_after[1] > cx_before[1],
            "both workers served: {cx_before:?} -> {cx_after:?}"
        );
        assert!(self.envoy.custom_stat("graceful_consumer_evictions").await >= 1);
        let steered = self.envoy.custom_stat("graceful_consumer_steered").await;
        assert!(steered >= sent, "steered {steered} of {sent}");
        let log = self.envoy.log();
        assert!(
            !log.contains("membership refresh"),
            "admin refresh failed:\n{log}"
        );
        (at_mark, self.counts(), sent, admin_calls)
    }

    /// After the first marked answer, every request goes to the other
    /// upstream, on both workers.
    async fn assert_steers_away_from_a_closing_upstream(&self) {
        let (at_mark, now, sent, admin_calls) = self.close_one_and_send().await;
        assert_eq!(
            now[0], at_mark[0],
            "requests reached the closing upstream: {at_mark:?} -> {now:?}"
        );
        assert!(sent >= 200, "{sent} sent");
        assert_eq!(now[1] - at_mark[1], sent, "{at_mark:?} -> {now:?}");
        eprintln!(
            "{}: {sent} of {sent} requests after the mark steered off the closing upstream: {at_mark:?} -> {now:?} ({admin_calls} admin reads through {ADMIN_CLUSTER})",
            self.cluster
        );
    }
}

impl Drop for Gateway {
    /// On a failure, what the control plane sent and what was refused.
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("the control plane's log:\n{}", self.xds.log());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn it_steers_away_from_a_closing_backend_with_the_backend_traffic_policy() {
    let gw = Gateway::start("eg-steer-btp", |ex, name, eds| {
        envoy_gateway::cluster(
            name,
            eds,
            envoy_gateway::load_balancing_policy(Some(&ex.btp["spec"]["loadBalancer"])),
        )
    })
    .await;
    gw.assert_steers_away_from_a_closing_upstream().await;
    graceful_harness::support::tested_with::record("examples/envoy-gateway/README.md");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn it_steers_away_from_a_closing_backend_with_the_patch_policy() {
    let gw = Gateway::start("eg-steer-epp", |ex, name, eds| {
        let mut cluster =
            envoy_gateway::cluster(name, eds, envoy_gateway::load_balancing_policy(None));
        let errors = apply_patch_policy(&ex.epp, &mut cluster);
        assert!(errors.is_empty(), "{errors:?}");
        cluster
    })
    .await;
    gw.assert_steers_away_from_a_closing_upstream().await;
}

#[test]
fn the_json_patch_subset_follows_rfc_6902() {
    let mut doc = json!({"a": {"b": [1, 2]}, "x~/y": 0});
    apply_operation(
        &mut doc,
        &json!({"op": "add", "path": "/a/b/1", "value": 9}),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    apply_operation(
        &mut doc,
        &json!({"op": "add", "path": "/a/b/-", "value": 3}),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(doc["a"]["b"], json!([1, 9, 2, 3]));
    apply_operation(
        &mut doc,
        &json!({"op": "replace", "path": "/x~0~1y", "value": 1}),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(doc["x~/y"], 1);
    apply_operation(
        &mut doc,
        &json!({"op": "move", "from": "/a/b/0", "path": "/c"}),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (doc["c"].clone(), doc["a"]["b"].clone()),
        (json!(1), json!([9, 2, 3]))
    );
    apply_operation(&mut doc, &json!({"op": "remove", "path": "/a/b/2"}))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(doc["a"]["b"], json!([9, 2]));
    // Envoy Gateway creates missing parents on add, nothing else.
    apply_operation(
        &mut doc,
        &json!({"op": "add", "path": "/n/p/0", "value": "v"}),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(doc["n"], json!({"p": ["v"]}));
    for bad in [
        json!({"op": "remove", "path": "/a/b/5"}),
        json!({"op": "replace", "path": "/nope", "value": 1}),
        json!({"op": "move", "from": "/nope", "path": "/c"}),
        json!({"op": "add", "path": "/a/b/7", "value": 1}),
        json!({"op": "add", "path": "a", "value": 1}),
    ] {
        let mut d = doc.clone();
        assert!(apply_operation(&mut d, &bad).is_err(), "{bad}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_override_host_the_closing_backend_keeps_getting_requests() {
    // What the example's steering part is for: the cluster as Envoy
    // Gateway generates it with neither the BackendTrafficPolicy's
    // endpointOverride nor the patch. The filter tombstones and writes
    // the header, Envoy's least request ignores it.
    let gw = Gateway::start("eg-no-override", |_, name, eds| {
        envoy_gateway::cluster(name, eds, envoy_gateway::load_balancing_policy(None))
    })
    .await;
    let (at_mark, now, sent, _) = gw.close_one_and_send().await;
    assert!(
        now[0] > at_mark[0],
        "the closing upstream got no request, yet nothing steers: {at_mark:?} -> {now:?}"
    );
    eprintln!(
        "{}: without override_host the closing upstream still got {} of {sent}",
        gw.cluster,
        now[0] - at_mark[0]
    );
}

/// A rolling update as Envoy Gateway pushes it over its delta ADS stream:
/// the new pod's endpoint is added (surge), the old pod starts closing and
/// its endpoint is sent `DRAINING` once it is terminating
/// (`getIREndpointsFromEndpointSlice`, route.go; cluster.go), then removed.
/// Every push carries only the endpoints; no request fails, none reaches
/// the old pod after its first closing mark, and the two others share the
/// load once the new one is a member.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_update_over_envoy_gateways_pushes_fails_nothing_and_shares_the_load() {
    let mut gw = Gateway::start("eg-rolling", |ex, name, eds| {
        envoy_gateway::cluster(
            name,
            eds,
            envoy_gateway::load_balancing_policy(Some(&ex.btp["spec"]["loadBalancer"])),
        )
    })
    .await;
    let (old, kept) = (gw.ups[0].addr, gw.ups[1].addr);
    let new = Upstream::start().await;
    new.set_instance("a2");
    let new_addr = new.addr;
    gw.ups.push(new);
    let members = format!("cluster.{}.membership_total", gw.cluster);
    let healthy = format!("cluster.{}.membership_healthy", gw.cluster);

    // Surge: the new pod is ready.
    gw.push_endpoints(&[(old, ""), (kept, ""), (new_addr, "")]);
    gw.until_stat(&members, 3).await;
    gw.warm(6, 20).await;

    // The old pod's preStop: it answers closing.
    let at_mark = gw.close_first_until_marked().await;

    // Terminating: Envoy Gateway sends it DRAINING.
    gw.push_endpoints(&[(old, "DRAINING"), (kept, ""), (new_addr, "")]);
    gw.until_stat(&healthy, 2).await;
    gw.until_members_read().await;
    let before = gw.counts();
    let draining = load(gw.listener, 8, 25, "/").await;
    let after_draining = gw.counts();

    // Gone: the pod's endpoint is removed.
    gw.push_endpoints(&[(kept, ""), (new_addr, "")]);
    gw.until_stat(&members, 2).await;
    gw.until_members_read().await;
    let gone = load(gw.listener, 8, 25, "/").await;
    let after_gone = gw.counts();

    let share = |from: &[u64], to: &[u64], sent: usize| {
        let got: Vec<u64> = from.iter().zip(to).map(|(a, b)| b - a).collect();
        eprintln!("{sent} requests: {got:?} (old, kept, new)");
        assert_eq!(got[0], 0, "the closing pod got requests: {got:?}");
        assert_eq!(got[1] + got[2], sent as u64, "{got:?}");
        // Shared, not piled on one: each of the two takes at least a quarter.
        for (i, n) in got.iter().enumerate().skip(1) {
            assert!(*n * 4 >= sent as u64, "pod {i} took {n} of {sent}: {got:?}");
        }
    };
    for (what, batch) in [("DRAINING", &draining), ("removed", &gone)] {
        let failed = batch.iter().filter(|r| r.status != 200).count();
        assert_eq!(failed, 0, "{what}: {failed} of {} failed", batch.len());
    }
    assert_eq!(gw.counts()[0], at_mark[0], "the closing pod after its mark");
    share(&before, &after_draining, draining.len());
    share(&after_draining, &after_gone, gone.len());

    // Delta: after the first answer, each push sent the endpoints alone.
    let log = gw.xds.log();
    let sent: Vec<&str> = log.lines().filter(|l| l.contains(" sent delta ")).collect();
    let endpoints_only = sent
        .iter()
        .filter(|l| l.contains("ClusterLoadAssignment version"))
        .count();
    let others_after_first = sent
        .iter()
        .filter(|l| !l.contains("ClusterLoadAssignment") && !l.contains(" version 1:"))
        .count();
    assert_eq!(endpoints_only, 4, "one EDS answer per push:\n{log}");
    assert_eq!(
        others_after_first, 0,
        "a push resent more than endpoints:\n{log}"
    );
}

// ---------------------------------------------------------------------------
// Backends with no sidecar: front-drain.yaml

/// The front endpoints (design §4), each as a backend's hook calls it.
const FRONT_ENDPOINTS: [(&str, &str); 4] = [
    ("POST", "/graceful/front/closing"),
    ("GET", "/graceful/front/drained?wait=1s"),
    ("POST", "/graceful/front/serving"),
    ("GET", "/graceful/front/status"),
];
/// Where Envoy Gateway runs a Gateway's proxy pods: its own namespace
/// (the Helm chart's), unless GatewayNamespace mode puts them beside the
/// Gateway.
const PROXY_NAMESPACE: &str = "envoy-gateway-system";
/// Time the backend's app gets to exit after SIGTERM, once the hook has
/// returned, within the grace period.
const APP_EXIT: Duration = Duration::from_secs(5);

/// The named container of a pod template.
fn container<'a>(list: &'a Value, name: &str) -> &'a Value {
    list.as_array()
        .and_then(|l| l.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no container {name} in {list}"))
}

/// The value after `flag` in a command line.
fn flag<'a>(command: &'a [&'a str], flag: &str) -> &'a str {
    command
        .iter()
        .position(|a| *a == flag)
        .and_then(|i| command.get(i + 1))
        .copied()
        .unwrap_or_else(|| panic!("{flag} missing from {command:?}"))
}

#[test]
fn front_drain_agrees_with_the_example_envoy_gateway_and_the_filter() {
    let front = FrontExample::load();
    let command = check_front(&Example::load(), &front);

    // The built hook takes the command as written (its wait shortened, in
    // case this host's DNS is slow to say no); resolving finds no front
    // here (no cluster DNS), so it returns at once: fail open.
    let mut args = command[1..].to_vec();
    if let Some(i) = args.iter().position(|a| a == "--wait") {
        args[i + 1] = "5s".into();
    }
    let hook = hook_binary();
    let out = Command::new(&hook)
        .args(&args)
        .output()
        .unwrap_or_else(|e| panic!("{} ({e}): cargo build -p graceful-hook", hook.display()));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("no front answered"),
        "{:?}: {}{said}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The README's renaming (its `cp` and `sed` lines, run by `sh` on a copy
/// of the folder) leaves the documents agreeing with one another under the
/// new names.
#[test]
fn the_readmes_renaming_keeps_front_drain_consistent() {
    let readme = fs::read_to_string(repo_root().join("examples/envoy-gateway/README.md")).unwrap();
    let lines: Vec<&str> = readme.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with("cp -r examples/envoy-gateway my-gateway"))
        .unwrap_or_else(|| panic!("README.md: no `cp -r examples/envoy-gateway my-gateway`"));
    let script: Vec<&str> = lines[start..]
        .iter()
        .take_while(|l| !l.starts_with("```"))
        .copied()
        .collect();
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("eg-renamed-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let copied = dir.join("examples/envoy-gateway");
    fs::create_dir_all(dir.join("examples")).unwrap();
    let cp = Command::new("cp")
        .arg("-r")
        .arg(repo_root().join("examples/envoy-gateway"))
        .arg(&copied)
        .status()
        .unwrap();
    assert!(cp.success());
    let out = Command::new("sh")
        .arg("-ec")
        .arg(script.join("\n"))
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The renamed folder in the example's place.
    fs::remove_dir_all(&copied).unwrap();
    fs::rename(dir.join("my-gateway"), &copied).unwrap();
    let ex = Example::load_from(&dir);
    let front = FrontExample::load_from(&dir);
    assert_eq!(
        (ex.namespace(), ex.route(), ex.gateway()),
        ("my-ns", "my-route", "my-gateway")
    );
    assert_eq!(ex.http_listener(), "my-ns/my-gateway/http");
    check_front(&ex, &front);
    let _ = fs::remove_dir_all(&dir);
}

/// What must agree in `front-drain.yaml` (or its renamed copy): with the
/// example, with Envoy Gateway's names, and within itself. Returns the
/// backend's preStop command.
fn check_front(ex: &Example, front: &FrontExample) -> Vec<String> {
    let ns = ex.namespace().to_string();

    // The EnvoyExtensionPolicy is the example's (the same name: it replaces
    // it) with `front: {}`.
    let mut expected = ex.eep.clone();
    expected["spec"]["wasm"][0]["config"]["front"] = json!({});
    assert_eq!(
        front.eep, expected,
        "{FRONT}'s EnvoyExtensionPolicy is {EXAMPLE}'s with `front: {{}}`, nothing else"
    );
    let public = front.public_config();
    let public_front = public
        .front
        .unwrap_or_else(|| panic!("{FRONT}: the public config has no front role"));
    assert!(
        !public_front.serve_endpoints,
        "the public listener must not answer the front endpoints"
    );
    assert_eq!(public.admin_cluster.as_deref(), Some(ADMIN_CLUSTER));

    // The control configuration is the same with serve_endpoints.
    let mut control_json = ex.eep["spec"]["wasm"][0]["config"].clone();
    control_json["front"] = json!({"serve_endpoints": true});
    assert_eq!(
        front.control_config_json(),
        control_json,
        "the copy's configuration is the policy's with front.serve_endpoints: true"
    );
    let control = front.control_config();
    assert!(control.front.is_some_and(|f| f.serve_endpoints));
    assert_eq!(
        control.front.map(|f| f.limits()),
        public.front.map(|f| f.limits()),
        "one table, one set of limits"
    );

    // The EnvoyPatchPolicy: the Gateway's HTTP listener, as Envoy Gateway
    // names it; the filter it copies is the policy's own.
    assert_eq!(front.epp["apiVersion"], EG_API);
    assert_eq!(front.epp["metadata"]["namespace"], ns.as_str());
    assert_eq!(front.epp["spec"]["type"], "JSONPatch");
    assert_eq!(
        front.epp["spec"]["targetRef"], ex.epp["spec"]["targetRef"],
        "the Gateway {EXAMPLE}'s patch names"
    );
    let listener = ex.http_listener();
    for e in front.entries() {
        assert_eq!(e["type"], LISTENER_TYPE, "{e}");
        assert_eq!(e["name"], listener.as_str(), "{e}");
    }
    let filter_name = format!(
        "envoy.filters.http.wasm/{}",
        envoy_gateway::wasm_name(&front.eep, 0)
    );
    let test = front.entry("test", "/name");
    assert_eq!(test["value"], filter_name.as_str());
    let copy = front.entry("copy", "/http_filters/0");
    assert_eq!(
        format!("{}/name", str_field(&copy["from"], "copy.from")),
        str_field(&test["path"], "test.path"),
        "the test entry checks the filter the copy takes"
    );
    assert!(str_field(&copy["from"], "from").starts_with("/default_filter_chain/"));
    let port = front.control_port();

    // The headless Service: every proxy pod of that Gateway, by the labels
    // Envoy Gateway gives them, on the control port.
    let fronts = &front.fronts;
    assert_eq!(fronts["metadata"]["namespace"], PROXY_NAMESPACE);
    assert_eq!(
        fronts["spec"]["clusterIP"], "None",
        "headless: one address per pod"
    );
    let selector = &fronts["spec"]["selector"];
    assert_eq!(selector[OWNING_GATEWAY_NAME], ex.gateway());
    assert_eq!(selector[OWNING_GATEWAY_NAMESPACE], ns.as_str());
    for (k, v) in ENVOY_APP_LABELS {
        assert_eq!(selector[k], v, "{k}");
    }
    assert_eq!(fronts["spec"]["ports"][0]["port"], u64::from(port));

    // The backend: no sidecar, the hook installed by an init container into
    // an emptyDir the app mounts, preStop `graceful-hook front` resolving
    // the headless Service on the control port, within the grace period.
    let pod = &front.deployment["spec"]["template"]["spec"];
    let containers = pod["containers"].as_array().cloned().unwrap_or_default();
    assert_eq!(containers.len(), 1, "the app alone: no sidecar");
    let app = container(&pod["containers"], "app");
    let init = container(&pod["initContainers"], "graceful-hook");
    let volume = str_field(&init["volumeMounts"][0]["name"], "init volume");
    let dir = str_field(&init["volumeMounts"][0]["mountPath"], "init mountPath");
    assert_eq!(init["command"], json!(["/graceful-hook", "install", dir]));
    assert!(
        pod["volumes"].as_array().is_some_and(|v| v
            .iter()
            .any(|v| v["name"] == volume && v["emptyDir"].is_object())),
        "an emptyDir named {volume}"
    );
    let mount = app["volumeMounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["name"] == volume))
        .unwrap_or_else(|| panic!("the app does not mount {volume}"));
    let command: Vec<&str> = app["lifecycle"]["preStop"]["exec"]["command"]
        .as_array()
        .map(|c| c.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert_eq!(
        command.first().copied(),
        Some(
            format!(
                "{}/graceful-hook",
                str_field(&mount["mountPath"], "mountPath")
            )
            .as_str()
        )
    );
    assert_eq!(command.get(1), Some(&"front"));
    let fqdn = format!(
        "{}.{}.svc.cluster.local:{port}",
        str_field(&fronts["metadata"]["name"], "name"),
        PROXY_NAMESPACE
    );
    assert_eq!(flag(&command, "--resolve"), fqdn);
    let wait = parse_duration(flag(&command, "--wait")).unwrap_or_else(|e| panic!("{e}"));
    let grace = Duration::from_secs(
        pod["terminationGracePeriodSeconds"]
            .as_u64()
            .unwrap_or_else(|| panic!("no terminationGracePeriodSeconds")),
    );
    assert!(
        grace >= wait + APP_EXIT,
        "the grace period ({grace:?}) counts the hook's wait ({wait:?}) and the app's exit ({APP_EXIT:?})"
    );
    // The backend's Service selects it, on the app's port.
    assert_eq!(
        front.service["spec"]["selector"],
        front.deployment["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(
        front.service["spec"]["ports"][0]["targetPort"],
        app["ports"][0]["containerPort"]
    );
    command.iter().map(|a| a.to_string()).collect()
}

/// The gateway's config with `front-drain.yaml` applied: the policy's
/// filter with `front`, the listener patched for the control port.
fn front_config(front: &FrontExample, epp: &Value, eds: &Path) -> (Example, Value) {
    let ex = Example::load().with_front(front);
    let name = envoy_gateway::rule_cluster(ex.namespace(), ex.route(), 0);
    let cluster = envoy_gateway::cluster(
        &name,
        eds,
        envoy_gateway::load_balancing_policy(Some(&ex.btp["spec"]["loadBalancer"])),
    );
    let mut config = envoy_gateway::gateway_config(&ex, cluster, 9901, 10080);
    let listener = listener_mut(
        &mut config["static_resources"]["listeners"],
        &ex.http_listener(),
    );
    let errors = apply_patches(epp, LISTENER_TYPE, listener);
    assert!(errors.is_empty(), "{errors:?}");
    (ex, config)
}

#[test]
fn envoy_accepts_the_gateways_listener_with_the_control_port() {
    let front = FrontExample::load();
    let ex = Example::load();
    let name = envoy_gateway::rule_cluster(ex.namespace(), ex.route(), 0);
    let eds = scratch_eds(
        "eg-front-validate",
        &name,
        &["127.0.0.1:18081".parse().unwrap()],
    );
    let (_, config) = front_config(&front, &front.epp, &eds);
    assert_accepted("eg-front", &config);

    // Envoy loads the copy's configuration too: a control configuration
    // the filter refuses fails the listener, naming the field.
    let mut bad = front.epp.clone();
    for e in bad["spec"]["jsonPatches"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        let op = &mut e["operation"];
        if op["path"]
            .as_str()
            .is_some_and(|p| p.ends_with("/configuration/value"))
        {
            op["value"] = json!(r#"{"front":{"serve_endpoints":true}}"#);
        }
    }
    let (_, config) = front_config(&front, &bad, &eds);
    let (ok, printed) = validate("eg-front-no-admin", &config);
    assert!(!ok, "front without admin_cluster was accepted:\n{printed}");
    assert!(printed.contains("admin_cluster"), "{printed}");
}

/// One request from `from` on a fresh connection.
async fn ask(addr: SocketAddr, from: IpAddr, method: &str, path: &str) -> Response {
    let mut conn = Conn::http1_from(addr, from)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    conn.send(method, path, &[], Bytes::new())
        .await
        .unwrap_or_else(|e| panic!("{method} {path} from {from}: {e}"))
}

/// Slow requests (1.5 s) through the public port, one more at a time,
/// until one is in flight at upstream `index`; each task gives its answer
/// and when it ended.
async fn slow_requests_until_one_reaches(
    gw: &Gateway,
    index: usize,
) -> Vec<tokio::task::JoinHandle<(Response, Instant)>> {
    let before = gw.ups[index].app_requests();
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let listener = gw.listener;
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::http1(listener)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let r = conn
                .get("/delay/1500")
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            (r, Instant::now())
        }));
        tokio::time::sleep(Duration::from_millis(50)).await;
        if gw.ups[index].app_requests() > before {
            return tasks;
        }
    }
    panic!("20 slow requests and none reached upstream {index}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_control_port_answers_the_front_endpoints_and_the_public_port_routes_them() {
    let front = FrontExample::load();
    // The example's port may be taken here: the same patch on a port of
    // this test's.
    let port = candidate_port();
    let closing = Ipv4Addr::new(127, 0, 0, 3);
    let outsider = IpAddr::from([127, 0, 0, 2]);
    let shape = Shape {
        ex: Example::load().with_front(&front),
        ips: [closing, Ipv4Addr::LOCALHOST],
        listener_patch: Some(front.epp_on_port(port)),
    };
    let gw = Gateway::start_shaped("eg-front", shape, |ex, name, eds| {
        envoy_gateway::cluster(
            name,
            eds,
            envoy_gateway::load_balancing_policy(Some(&ex.btp["spec"]["loadBalancer"])),
        )
    })
    .await;
    let control = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    gw.warm(4, 10).await;
    gw.until_members_read().await;

    // The public port: each endpoint, even from a member's address, is a
    // request like any other, answered by a backend through the route.
    let before: u64 = gw.ups.iter().map(Upstream::requests).sum();
    for (method, path) in FRONT_ENDPOINTS {
        let r = ask(gw.listener, IpAddr::V4(closing), method, path).await;
        assert_eq!(
            (r.status, r.text().as_str()),
            (200, "ok\n"),
            "{method} {path} on the public port"
        );
        assert!(
            r.header("x-graceful-instance").is_some(),
            "{method} {path} on the public port was not answered by a backend"
        );
    }
    let after: u64 = gw.ups.iter().map(Upstream::requests).sum();
    assert!(after >= before + 4, "{before} -> {after}");
    // Nor did the filter act on them: the member is still sent requests.
    let still = gw.ups[0].app_requests();
    gw.warm(4, 25).await;
    assert!(
        gw.ups[0].app_requests() > still,
        "a closing on the public port was acted on"
    );
    let r = ask(
        control,
        IpAddr::V4(closing),
        "GET",
        "/graceful/front/status",
    )
    .await;
    assert_eq!(r.status, 200, "status: {}", r.text());
    assert!(
        r.text().contains(r#""state":"serving""#),
        "the front's table took a public-port request: {}",
        r.text()
    );

    // The control port: its route is a 404, never a backend.
    let r = ask(control, IpAddr::V4(closing), "GET", "/").await;
    assert_eq!(r.status, 404);
    assert!(r.header("x-graceful-instance").is_none());

    // An address that is no member is refused.
    for (method, path) in [FRONT_ENDPOINTS[0], FRONT_ENDPOINTS[3]] {
        let r = ask(control, outsider, method, path).await;
        assert_eq!(
            r.status,
            403,
            "{method} {path} from {outsider}: {}",
            r.text()
        );
    }
    let r = ask(control, outsider, "POST", "/graceful/front/closing").await;
    assert!(r.text().contains("not_a_member"), "{}", r.text());

    // A member's own address is told 202 while a slow request to it is
    // in flight: from then on the public port sends it nothing, and the
    // front acknowledges once that request has ended.
    let slow = slow_requests_until_one_reaches(&gw, 0).await;
    let at_closing = gw.ups[0].app_requests();
    let r = ask(
        control,
        IpAddr::V4(closing),
        "POST",
        "/graceful/front/closing",
    )
    .await;
    assert_eq!(r.status, 202, "closing from {closing}: {}", r.text());
    eprintln!(
        "closing from {closing} on the control port: 202 {}",
        r.text()
    );
    let sent = load(gw.listener, 4, 25, "/").await;
    assert!(sent.iter().all(|r| r.status == 200));
    assert_eq!(
        gw.ups[0].app_requests(),
        at_closing,
        "requests reached the closing backend"
    );
    let r = ask(
        control,
        IpAddr::V4(closing),
        "GET",
        "/graceful/front/drained?wait=10s",
    )
    .await;
    let drained_at = Instant::now();
    assert_eq!(r.status, 200, "drained: {}", r.text());
    eprintln!("drained?wait=10s from {closing}: 200 {}", r.text());
    let status: Value = serde_json::from_str(&r.text()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(status["state"], "acknowledged", "{status}");
    assert!(
        status["inflight_at_closing"].as_u64() >= Some(1),
        "{status}"
    );
    let mut waited_for = 0;
    for task in slow {
        let (r, ended) = task.await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.status, 200, "a slow request failed");
        if r.header("x-graceful-instance").as_deref() == Some("a1") {
            assert!(
                ended <= drained_at,
                "acknowledged while a request to the backend was in flight"
            );
            waited_for += 1;
        }
    }
    assert!(waited_for >= 1);

    // The backend's hook, run from its address as the example runs it,
    // returns 0 at once: the front has acknowledged.
    let out = Command::new(hook_binary())
        .args(["front", "--front", &format!("http://{control}")])
        .args(["--source", &closing.to_string(), "--wait", "10s"])
        .output()
        .unwrap_or_else(|e| panic!("graceful-hook ({e}): cargo build -p graceful-hook"));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && said.contains("1 of 1"),
        "{:?}: {said}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", said.trim());

    // Its `serving` lifts it: the backend is sent requests again.
    let r = ask(
        control,
        IpAddr::V4(closing),
        "POST",
        "/graceful/front/serving",
    )
    .await;
    assert_eq!(r.status, 202, "serving: {}", r.text());
    eventually(
        "requests reach the backend again",
        Duration::from_secs(10),
        || async {
            let _ = load(gw.listener, 2, 10, "/").await;
            (gw.ups[0].app_requests() > at_closing).then_some(())
        },
    )
    .await;
}
