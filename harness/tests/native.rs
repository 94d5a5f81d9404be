//! The native module (`dist/libgraceful.so`, `make native`) itself: the ABI
//! version Envoy reports, the shipped native configs, refused configs, and
//! a panic in a hook failing open. The behaviour suites (provider_drain,
//! consumer, faults, hostile, demo) run on it with `GRACEFUL_DELIVERY=native`
//! (`make e2e-native`).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use graceful_harness::support::client::Conn;
use graceful_harness::support::envoy::{
    envoy_binary, envoy_version, free_port, native_module, repo_root, EnvoySpec,
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
        .set("INBOUND_PORT", free_port())
        .set("APP_PORT", upstream.addr.port())
        .start()
        .await;
    let log = envoy.log();
    // Before ABI 1.0 a version is only kept compatible with the next one:
    // a mismatch is a module built for another Envoy minor (Envoy still
    // loads it, with a warning; this fails instead).
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
    let port = free_port();
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
        .set("INBOUND_PORT", port)
        .set("APP_PORT", upstream.addr.port())
        .start()
        .await;
    let mut conn = Conn::http1(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .unwrap();
    for _ in 0..20 {
        let r = conn.get("/").await.unwrap();
        assert_eq!(r.status, 200, "the request went on past the panic");
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

/// On an Envoy that lacks a callback the module calls (1.38: no
/// config-level metric callbacks), Envoy refuses the module, and the one
/// line before its refusal names the callback and the Envoy it needs.
#[test]
fn an_envoy_that_lacks_its_callbacks_refuses_it_with_one_line_naming_the_version() {
    let Some(old) = std::env::var_os("GRACEFUL_ENVOY_TOO_OLD_FOR_NATIVE") else {
        panic!("set GRACEFUL_ENVOY_TOO_OLD_FOR_NATIVE to an Envoy 1.38 binary (make e2e does)");
    };
    native_module();
    let out = Command::new(old)
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
    assert!(
        ours[0].contains("lacks envoy_dynamic_module_callback_")
            && ours[0].contains("needs Envoy 1.39 or later"),
        "{}",
        ours[0]
    );
    assert!(
        said.contains("Failed to initialize dynamic module"),
        "{said}"
    );
}
