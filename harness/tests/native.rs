//! The native module (`dist/libgraceful.so`, `make native`) itself: the ABI
//! version Envoy reports, its refusal of an Envoy of another ABI (1.39), the
//! shipped native configs, refused configs, and
//! a panic in a hook failing open, and the consumer telling two requests
//! that share an `x-request-id` apart. The behaviour suites (provider_drain,
//! consumer, faults, hostile, demo) run on it with `GRACEFUL_DELIVERY=native`
//! (`make e2e-native`).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;

use graceful_harness::support::client::Conn;
use graceful_harness::support::envoy::{
    envoy_binary, envoy_version, native_module, repo_root, EnvoySpec,
};
use graceful_harness::support::native::shipped_files;
use graceful_harness::support::upstream::Upstream;

/// What Envoy logs when the module's ABI version is its own.
const MATCHED: &str = "Dynamic module ABI version v0.2.0 matched.";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_reports_the_abi_version_the_module_was_built_for() {
    let upstream = Upstream::start().await;
    let envoy = EnvoySpec::new("native-abi", "provider-sidecar.yaml")
        .native(None)
        .set("LISTEN_ADDRESS", "127.0.0.1")
        .set("INBOUND_PORT", 0)
        .set("APP_PORT", upstream.addr.port())
        .start()
        .await;
    let log = envoy.log();
    // Envoy's abi.h promises only an exact match: a mismatch is a module
    // built for another Envoy minor (Envoy alone would load it with a
    // warning; the module refuses it, and this fails too).
    assert!(
        log.contains(MATCHED) && !log.contains("is deprecated"),
        "the module is built for ABI v0.2.0 (Envoy 1.40's abi.h); this Envoy ({}) did not confirm it: rebuild filters/native against its abi.h. Log:\n{log}",
        envoy_version()
    );
}

#[test]
fn the_shipped_native_configs_are_current_and_envoy_accepts_them() {
    let root = repo_root();
    let files = shipped_files().unwrap();
    assert_eq!(files.len(), 2);
    native_module(); // fails with "run make native" if missing
    for (path, text) in files {
        let on_disk = std::fs::read_to_string(root.join(&path)).unwrap_or_default();
        assert!(
            on_disk == text,
            "{} is stale: run `make native-configs`",
            path.display()
        );
        let (ok, said) = validate(&path, "warn");
        assert!(ok && said.contains("OK"), "{}: {said}", path.display());
    }
}

/// `envoy --mode validate -l LEVEL` on `path`, from the repository root (as
/// the shipped files say: `dist/libgraceful.so`): success and its output.
fn validate(path: &std::path::Path, level: &str) -> (bool, String) {
    let out = Command::new(envoy_binary())
        .current_dir(repo_root())
        .args(["--mode", "validate", "-l", level, "-c"])
        .arg(path)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), said)
}

/// `envoy --mode validate` on the native provider config with `edit`
/// applied: its exit status and log.
fn validate_edited(name: &str, edit: impl Fn(String) -> String) -> (bool, String) {
    let root = repo_root();
    let text = std::fs::read_to_string(root.join("envoy/native/provider-sidecar.yaml")).unwrap();
    let dir = root.join("target/e2e");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}-{}.yaml", std::process::id()));
    std::fs::write(&path, edit(text)).unwrap();
    validate(&path, "info")
}

#[test]
fn a_bad_config_or_an_unknown_filter_name_is_refused_with_the_reason() {
    let (ok, log) = validate_edited("native-bad-field", |t| {
        t.replacen("value: '{}'", r#"value: '{"closing_header": ""}'"#, 1)
    });
    assert!(!ok, "a bad provider config must be refused:\n{log}");
    for needle in [
        r#"graceful_provider: invalid configuration: field "closing_header": header name is empty"#,
        "Failed to initialize dynamic module",
    ] {
        assert!(log.contains(needle), "no {needle:?} in:\n{log}");
    }
    let (ok, log) = validate_edited("native-bad-name", |t| {
        t.replacen(
            "filter_name: graceful_provider",
            "filter_name: graceful_provder",
            1,
        )
    });
    assert!(!ok, "an unknown filter_name must be refused:\n{log}");
    assert!(
        log.contains(r#"unknown filter_name "graceful_provder""#),
        "{log}"
    );
}

fn panic_probe_module() -> PathBuf {
    let module = repo_root().join("target/native-panic-probe/native/libgraceful.so");
    assert!(
        module.exists(),
        "{} missing: run `make native-panic-probe`",
        module.display()
    );
    module
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_a_hook_is_caught_and_the_request_goes_on() {
    let module = panic_probe_module();
    let upstream = Upstream::start().await;
    // The provider sidecar with a filter that panics in its request hook
    // ahead of graceful_provider.
    let root = repo_root();
    let template = std::fs::read_to_string(root.join("envoy/provider-sidecar.yaml")).unwrap();
    let probe = r#"          - name: panic_probe
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter
              dynamic_module_config: {module: {local: {filename: MODULE}}, do_not_close: true}
              filter_name: graceful_panic_probe
          - name: graceful_provider
"#
    .replace("MODULE", &module.display().to_string());
    let template = template.replacen("          - name: graceful_provider\n", &probe, 1);
    assert!(template.contains("graceful_panic_probe"));
    let path = root.join(format!(
        "target/e2e/panic-probe-{}.yaml",
        std::process::id()
    ));
    std::fs::create_dir_all(root.join("target/e2e")).unwrap();
    std::fs::write(&path, template).unwrap();
    let envoy = EnvoySpec::new("native-panic", &path.display().to_string())
        .native(Some(module))
        .set("LISTEN_ADDRESS", "127.0.0.1")
        .set("INBOUND_PORT", 0)
        .set("APP_PORT", upstream.addr.port())
        .start()
        .await;
    let mut conn = Conn::http1(envoy.listener("inbound").await).await.unwrap();
    // The probe panics in the request hook of a request with its header;
    // a live probe stream marks its response, a dead one (it panicked) does
    // nothing more. Panicking requests alternate with plain ones.
    let probe = [("x-graceful-panic-probe", "1")];
    for i in 0..20 {
        let panics = i % 2 == 0;
        let r = conn
            .send("GET", "/", if panics { &probe } else { &[] }, Bytes::new())
            .await
            .unwrap();
        assert_eq!(r.status, 200, "request {i} went on past the panic");
        let alive = r.header("x-graceful-panic-probe-alive");
        if panics {
            assert_eq!(
                alive, None,
                "request {i}: a filter that panicked was reused"
            );
        } else {
            assert_eq!(
                alive.as_deref(),
                Some("true"),
                "request {i} after a panicking one: the config was dropped with the stream"
            );
        }
    }
    assert_eq!(upstream.app_requests(), 20);
    // Logged once per process, not per request.
    graceful_harness::support::envoy::eventually(
        "the caught panic in the log",
        Duration::from_secs(5),
        || async { envoy.log().contains("failing open").then_some(()) },
    )
    .await;
    assert_eq!(envoy.log().matches("failing open").count(), 1);
    // graceful_provider still counted every request in and out.
    assert_eq!(
        envoy
            .stat("wasmcustom.graceful_provider_inflight")
            .await
            .unwrap_or(u64::MAX),
        0
    );
}

/// On an Envoy of another dynamic-module ABI (1.39.3 has v0.1.0, and
/// every callback the module calls: it loaded there before, with only
/// Envoy's warning), the module refuses to load, and the one line before
/// Envoy's refusal names both versions: the ABI it was built for and the
/// Envoy and ABI it found.
#[test]
fn an_envoy_of_another_abi_refuses_it_with_one_line_naming_both_versions() {
    let Some(other) = std::env::var_os("GRACEFUL_ENVOY_TOO_OLD_FOR_NATIVE") else {
        panic!("set GRACEFUL_ENVOY_TOO_OLD_FOR_NATIVE to an Envoy 1.39 binary (make e2e does)");
    };
    native_module();
    let version = Command::new(&other).arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&version.stdout).into_owned();
    let Some(found) = version.split('/').find(|part| part.starts_with("1.")) else {
        panic!("no version in {version:?}");
    };
    assert_ne!(
        found.get(..5),
        Some("1.40."),
        "{found} is the Envoy the module is built for"
    );
    let out = Command::new(&other)
        .current_dir(repo_root())
        .args(["--mode", "validate", "-l", "warn", "-c"])
        .arg("envoy/native/provider-sidecar.yaml")
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    let ours: Vec<&str> = said
        .lines()
        .filter(|l| l.starts_with("graceful:"))
        .collect();
    assert_eq!(ours.len(), 1, "{said}");
    for needle in [
        "built for dynamic-module ABI v0.2.0 (Envoy 1.40)",
        &format!("found Envoy {found} (dynamic-module ABI v0.1.0)"),
        "refused",
    ] {
        assert!(ours[0].contains(needle), "no {needle:?} in {}", ours[0]);
    }
    assert!(
        said.contains("Failed to initialize dynamic module"),
        "{said}"
    );
    assert!(
        !said.contains("is deprecated"),
        "Envoy compared the versions, so the module said yes: {said}"
    );
}

/// A listener of the consumer sidecar's shape with the native
/// `graceful_consumer` at `membership_refresh: 1h`, as an LDS file's
/// answer; `version` names the listener's stat prefix, so each version is
/// a change Envoy applies by replacing the listener.
fn consumer_lds(module: &std::path::Path, port: u16, version: u32) -> String {
    format!(
        r#"version_info: "{version}"
resources:
- "@type": type.googleapis.com/envoy.config.listener.v3.Listener
  name: outbound
  address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
  filter_chains:
  - filters:
    - name: envoy.filters.network.http_connection_manager
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
        stat_prefix: outbound_v{version}
        route_config:
          virtual_hosts:
          - name: all
            domains: ["*"]
            routes: [{{match: {{prefix: /}}, direct_response: {{status: 200}}}}]
        http_filters:
        - name: graceful_consumer
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter
            dynamic_module_config: {{module: {{local: {{filename: {module}}}}}, do_not_close: true, metrics_namespace: wasmcustom}}
            filter_name: graceful_consumer
            filter_config:
              "@type": type.googleapis.com/google.protobuf.StringValue
              value: '{{"membership_refresh": "1h"}}'
        - name: envoy.filters.http.router
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#,
        module = module.display()
    )
}

/// The consumer's membership timer threads running in Envoy `pid` (Linux
/// truncates a thread's name to 15 bytes).
fn consumer_timers(pid: u32) -> usize {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "graceful-consum")
        .count()
}

/// A listener update destroys the old listener's consumer config on the
/// main thread. Its timer thread stops at once, not after its period
/// (`membership_refresh: 1h`): the old listener is removed, its timer is
/// gone, and the admin (served by the main thread) answers all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_update_destroys_an_hourly_consumer_config_without_blocking_the_main_thread() {
    use graceful_harness::support::client;
    use graceful_harness::support::envoy::eventually;
    use std::time::Instant;

    let root = repo_root();
    let module = native_module();
    // Port 0: Envoy binds one, and keeps it for the listener's update.
    let port = 0;
    let dir = root.join(format!("target/e2e/native-lds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lds = dir.join("lds.yaml");
    std::fs::write(&lds, consumer_lds(&module, port, 1)).unwrap();
    let bootstrap = dir.join("bootstrap.yaml");
    std::fs::write(
        &bootstrap,
        format!(
            "node: {{id: consumer, cluster: consumer}}\n\
             admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: ${{ADMIN_PORT}}}}}}}}\n\
             dynamic_resources:\n  lds_config:\n    resource_api_version: V3\n    path_config_source: {{path: {}}}\n",
            lds.display()
        ),
    )
    .unwrap();
    let mut spec = EnvoySpec::new("native-lds", &bootstrap.display().to_string()).native(None);
    // The replaced listener drains for a second, then is destroyed.
    spec = spec.arg("--drain-time-s").arg("1");
    let envoy = spec.start().await;
    eventually("the consumer's timer", Duration::from_secs(10), || async {
        (consumer_timers(envoy.pid()) == 1).then_some(())
    })
    .await;

    // Version 2, moved in whole (Envoy watches the path for a move).
    let next = dir.join("lds.yaml.next");
    std::fs::write(&next, consumer_lds(&module, port, 2)).unwrap();
    std::fs::rename(&next, &lds).unwrap();
    let began = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut answers = 0u32;
    let removed_after = loop {
        let asked = Instant::now();
        let ready = client::get(envoy.admin, "/ready").await;
        let took = asked.elapsed();
        assert!(ready.is_ok_and(|r| r.status == 200), "the admin answers");
        slowest = slowest.max(took);
        answers += 1;
        let modified = envoy.stat("listener_manager.listener_modified").await;
        let draining = envoy
            .stat("listener_manager.total_listeners_draining")
            .await;
        if modified == Some(1) && draining == Some(0) && consumer_timers(envoy.pid()) == 1 {
            break began.elapsed();
        }
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "the old listener not removed with its timer in 30 s (modified {modified:?}, draining {draining:?}, timers {})",
            consumer_timers(envoy.pid())
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    eprintln!(
        "listener replaced and the old one removed {removed_after:?} after the update; \
         the admin answered {answers} times, the slowest in {slowest:?}"
    );
    // The old timer slept its period in the thread Drop joined: the main
    // thread blocked for up to an hour and the admin stopped answering. A
    // generous bound for a shared machine; the measured value is printed.
    assert!(
        slowest < Duration::from_millis(500),
        "slowest admin answer {slowest:?}"
    );
    // The new listener's consumer is in place and serves.
    let mut conn = Conn::http1(envoy.listener("outbound").await).await.unwrap();
    assert_eq!(conn.get("/").await.unwrap().status, 200);
}

/// Two requests that share an `x-request-id` (an app propagates it, a
/// fan-out shares it), one whose attempt fails at its host and one to a
/// slow host that the client cancels: the failing host is tombstoned, the
/// slow one is not (the consumer tells attempts apart per request stream,
/// not by the header). The failing host holds the attempt's connection
/// until the other request was cancelled, then closes it before any
/// answer, and the retry is answered by the cluster's other host (priority
/// 1, `previous_priorities`): the client sees a 200, so only the upstream
/// instance can tell, and its failure comes after the cancelled request
/// with the same id ended (keyed by the header, that end made it look
/// cancelled too). One Envoy worker: both requests on it.
/// (The wasm build tombstones an attempt that failed to connect, not one
/// whose connection closed unanswered.) `envoy/consumer-sidecar.yaml` plus
/// two routes to two clusters, both with
/// the upstream instance and the override_host policy of the shipped
/// `providers` cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_requests_sharing_an_id_one_failed_one_cancelled_tombstone_only_the_failing_host() {
    use graceful_harness::support::envoy::{eventually, scratch_path, write_eds};
    use graceful_harness::support::render::render;
    use serde_yaml::Value;
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::io::AsyncWriteExt;

    let slow = Upstream::start().await;
    let fallback = Upstream::start().await;
    // Accepts and holds connections until released, then closes them
    // unanswered.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let failing = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let holder = tokio::spawn({
        let accepted = accepted.clone();
        async move {
            let mut held = Vec::new();
            let mut released = released;
            loop {
                tokio::select! {
                    conn = listener.accept() => {
                        if let Ok((c, _)) = conn {
                            held.push(c);
                            accepted.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    _ = &mut released => break,
                }
            }
            // Closed without an answer: the attempt ends before headers.
            drop(listener);
            drop(held);
        }
    });
    let eds = scratch_path("shared-id-eds", "yaml");
    write_eds(&eds, "providers", &[slow.addr]);
    let cfg = r#"{"admin_cluster":"envoy_admin","failure_tombstone_ttl":"60s","membership_refresh":"200ms"}"#;
    let spec = EnvoySpec::new("shared-id", "consumer-sidecar.yaml")
        .set("OUTBOUND_PORT", 0)
        .set("EDS_PATH", eds.display())
        .set("CONSUMER_CONFIG", cfg);
    let template =
        std::fs::read_to_string(repo_root().join("envoy/consumer-sidecar.yaml")).unwrap();
    let rendered = render(&template, &spec.values).unwrap_or_else(|e| panic!("{e}"));
    let mut config: Value = serde_yaml::from_str(&rendered).unwrap();
    let hcm = &mut config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"];
    let routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
        .as_sequence_mut()
        .expect("the outbound routes");
    let shipped_route = routes[0].clone();
    for (prefix, cluster) in [("/failing", "failing"), ("/delay/", "slow")] {
        let mut route = shipped_route.clone();
        route["match"] = serde_yaml::from_str(&format!("{{prefix: \"{prefix}\"}}")).unwrap();
        route["route"]["cluster"] = cluster.into();
        // A retry goes to the next priority (the failing cluster's fallback).
        route["route"]["retry_policy"]["retry_priority"] = serde_yaml::from_str(
            r#"{name: envoy.retry_priorities.previous_priorities, typed_config: {"@type": type.googleapis.com/envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig, update_frequency: 1}}"#,
        )
        .unwrap();
        routes.insert(0, route);
    }
    let endpoint = |priority: u32, addr: SocketAddr| {
        format!(
            r#"{{priority: {priority}, lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: "{}", port_value: {}}}}}}}}}]}}"#,
            addr.ip(),
            addr.port()
        )
    };
    let clusters = config["static_resources"]["clusters"]
        .as_sequence_mut()
        .expect("the clusters");
    let shipped_cluster = clusters[0].clone();
    assert_eq!(shipped_cluster["name"], "providers");
    for (name, endpoints) in [
        (
            "failing",
            format!("{}, {}", endpoint(0, failing), endpoint(1, fallback.addr)),
        ),
        ("slow", endpoint(0, slow.addr)),
    ] {
        let mut cluster = shipped_cluster.clone();
        let map = cluster.as_mapping_mut().expect("a cluster");
        map.remove("eds_cluster_config");
        map.insert("name".into(), name.into());
        map.insert("type".into(), "STATIC".into());
        map.insert(
            "load_assignment".into(),
            serde_yaml::from_str(&format!(
                "{{cluster_name: {name}, endpoints: [{endpoints}]}}"
            ))
            .unwrap(),
        );
        clusters.push(cluster);
    }
    let path = scratch_path("shared-id-config", "yaml");
    std::fs::write(&path, serde_yaml::to_string(&config).unwrap()).unwrap();
    let envoy = EnvoySpec {
        template: path.display().to_string(),
        // One worker: both requests on it, where attempts told apart by
        // the header would collide.
        concurrency: 1,
        ..spec
    }
    .native(None)
    .start()
    .await;
    let outbound = envoy.listener("outbound").await;
    let id = "shared-by-both";

    // The slow request, under way at the slow host.
    let mut cancelled = tokio::net::TcpStream::connect(outbound).await.unwrap();
    cancelled
        .write_all(
            format!("GET /delay/10000 HTTP/1.1\r\nhost: test\r\nx-request-id: {id}\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    eventually(
        "the slow request at its host",
        Duration::from_secs(10),
        || async { (envoy.stat("cluster.slow.upstream_rq_active").await == Some(1)).then_some(()) },
    )
    .await;
    // The failing one, with the same id, while the slow one is under way.
    let failing_request = tokio::spawn(async move {
        let mut conn = Conn::http1(outbound).await.unwrap();
        conn.send(
            "GET",
            "/failing",
            &[("x-request-id", id)],
            Default::default(),
        )
        .await
    });
    eventually(
        "the failing request's attempt at its host",
        Duration::from_secs(10),
        || async { (accepted.load(Ordering::SeqCst) >= 1).then_some(()) },
    )
    .await;
    // The client gives up on the slow one.
    drop(cancelled);
    eventually(
        "the cancelled request ended",
        Duration::from_secs(10),
        || async {
            (envoy.stat("cluster.slow.upstream_rq_active").await == Some(0)
                && envoy
                    .stat("http.outbound.downstream_cx_destroy_remote_active_rq")
                    .await
                    >= Some(1))
            .then_some(())
        },
    )
    .await;
    // Then the failing host closes the attempt's connection unanswered.
    release.send(()).unwrap();
    holder.await.unwrap();
    let r = failing_request.await.unwrap().unwrap();
    assert_eq!(r.status, 200, "the retry at the fallback host answers");
    assert_eq!(fallback.app_requests(), 1);
    // A membership tick after both: the listener's gauge is current.
    let ticks = "cluster.envoy_admin.upstream_rq_completed";
    let before = envoy.stat(ticks).await.unwrap_or(0);
    eventually(
        "two membership refreshes",
        Duration::from_secs(10),
        || async { (envoy.stat(ticks).await.unwrap_or(0) >= before + 2).then_some(()) },
    )
    .await;
    let log = envoy.log();
    assert_eq!(
        envoy.custom_stat("graceful_consumer_tombstones").await,
        1,
        "only the failing host:\n{log}"
    );
    assert!(log.contains(&format!("tombstoned {failing}")), "{log}");
    assert!(
        !log.contains(&format!("tombstoned {}", slow.addr)),
        "the cancelled request's host was tombstoned:\n{log}"
    );
}
