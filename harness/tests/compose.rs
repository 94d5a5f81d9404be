//! The docker harness cannot run here (no Docker engine), so this checks what
//! can be checked without one: the committed files are what the generator
//! writes from the templates (one source of truth), and the compose file
//! parses and refers to files and addresses that exist. `make test` also runs
//! `envoy --mode validate` on the rendered configs in envoy/compose/.

use std::collections::HashSet;

use graceful_harness::platform::compose;
use graceful_harness::support::envoy::repo_root;
use serde_yaml::Value;

#[test]
fn it_keeps_the_docker_harness_generated_from_the_templates() {
    let stale = compose::stale(&repo_root()).unwrap();
    assert!(
        stale.is_empty(),
        "out of date, run `make compose`: {stale:?}"
    );
}

#[test]
fn it_writes_a_compose_file_that_parses_and_refers_to_what_exists() {
    let root = repo_root();
    let text = std::fs::read_to_string(root.join("envoy/docker-compose.yaml")).unwrap();
    let doc: Value = serde_yaml::from_str(&text).unwrap();
    let services = doc["services"].as_mapping().expect("services");
    let names: HashSet<&str> = services.keys().filter_map(Value::as_str).collect();
    let want: HashSet<&str> = ["provider1", "provider2", "provider3", "consumer"].into();
    assert_eq!(names, want);
    let mut addresses = HashSet::new();
    for (name, svc) in services {
        let name = name.as_str().unwrap();
        assert!(
            svc["image"].as_str().is_some_and(|i| !i.is_empty()),
            "{name}: image"
        );
        let ip = svc["networks"]["mesh"]["ipv4_address"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: address"));
        assert!(
            ip.starts_with("172.28.0.") && addresses.insert(ip.to_string()),
            "{name}: {ip}"
        );
        for dep in svc["depends_on"].as_sequence().into_iter().flatten() {
            assert!(
                names.contains(dep.as_str().unwrap()),
                "{name} depends on unknown {dep:?}"
            );
        }
        let image = svc["image"].as_str().unwrap();
        assert!(
            image.contains("graceful-wasm/sidecar:local") && image.starts_with("${"),
            "{name}: the locally built image, overridable: {image}"
        );
        if name.starts_with("provider") {
            let entrypoint = svc["entrypoint"][0].as_str().unwrap_or_default();
            assert_eq!(entrypoint, "/usr/local/bin/graceful-entrypoint", "{name}");
            assert!(
                svc["stop_grace_period"].as_str().is_some(),
                "{name}: grace period"
            );
            assert!(
                svc["healthcheck"]["test"].as_sequence().is_some(),
                "{name}: healthcheck"
            );
        }
        let command: Vec<&str> = svc["command"]
            .as_sequence()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let config = command
            .iter()
            .position(|a| *a == "-c")
            .map(|i| command[i + 1])
            .unwrap();
        let local = root.join(config.trim_start_matches("/work/"));
        assert!(local.exists(), "{name}: {config} is not generated");
        for volume in svc["volumes"].as_sequence().unwrap() {
            let host = volume.as_str().unwrap().split(':').next().unwrap();
            assert!(
                root.join("envoy").join(host).exists() || host == "../dist",
                "{name}: volume {host}"
            );
        }
    }
}
