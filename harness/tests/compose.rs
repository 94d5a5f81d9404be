//! What can be checked of the docker harness without a Docker engine
//! (`tests/docker.rs` runs it on one): the committed files are what the
//! generator writes from the templates (one source of truth), and both
//! compose files (the mesh, and the front shape) parse and refer to files
//! and addresses that exist. `make test` also runs
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

/// The front shape (`envoy/docker-compose-front.yaml`): backends with no
/// sidecar, each the demo app alone under `graceful-entrypoint --front`
/// naming every front's control listener, and fronts whose configs list the
/// backends' addresses and bind the control listener to the front's own
/// address on the compose network, never published.
#[test]
fn its_front_shape_tells_every_front_from_every_backend() {
    let root = repo_root();
    let text = std::fs::read_to_string(root.join(compose::FRONT_FILE)).unwrap();
    let doc: Value = serde_yaml::from_str(&text).unwrap();
    let services = doc["services"].as_mapping().expect("services");
    let names: HashSet<&str> = services.keys().filter_map(Value::as_str).collect();
    let want: HashSet<&str> = ["backend1", "backend2", "backend3", "front1", "front2"].into();
    assert_eq!(names, want);
    assert_eq!(
        doc["networks"]["edge"]["ipam"]["config"][0]["subnet"].as_str(),
        Some(compose::FRONT_SUBNET)
    );
    let strings = |v: &Value| -> Vec<String> {
        v.as_sequence()
            .unwrap_or_else(|| panic!("a list: {v:?}"))
            .iter()
            .map(|s| s.as_str().unwrap().to_string())
            .collect()
    };
    let ip = |name: &str| -> String {
        services[name]["networks"]["edge"]["ipv4_address"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: address"))
            .to_string()
    };
    let mut addresses = HashSet::new();
    for name in &names {
        assert!(
            ip(name).starts_with("172.29.0.") && addresses.insert(ip(name)),
            "{name}: {}",
            ip(name)
        );
        let image = services[*name]["image"].as_str().unwrap();
        assert!(
            image.contains(compose::IMAGE) && image.starts_with("${"),
            "{name}: the locally built image, overridable: {image}"
        );
    }
    let eds = std::fs::read_to_string(root.join("envoy/compose/backends-eds.yaml")).unwrap();
    for i in 1..=3 {
        let name = format!("backend{i}");
        let svc = &services[name.as_str()];
        let entrypoint = strings(&svc["entrypoint"]);
        assert_eq!(
            entrypoint[0], "/usr/local/bin/graceful-entrypoint",
            "{name}"
        );
        assert!(!entrypoint.contains(&"--drain".to_string()), "{name}");
        for front in ["front1", "front2"] {
            let url = format!("http://{front}:{}", compose::FRONT_CONTROL_PORT);
            assert!(
                entrypoint
                    .windows(2)
                    .any(|w| w[0] == "--front" && w[1] == url),
                "{name} tells {url}: {entrypoint:?}"
            );
        }
        let wait = entrypoint
            .windows(2)
            .find(|w| w[0] == "--wait")
            .map(|w| w[1].clone())
            .unwrap();
        assert_eq!(wait, compose::BACKEND_WAIT);
        assert_eq!(entrypoint.last().map(String::as_str), Some("--"));
        let grace = svc["stop_grace_period"].as_str().unwrap();
        let secs = |d: &str| d.trim_end_matches('s').parse::<u64>().unwrap();
        assert!(
            secs(grace) >= secs(&wait) + 10,
            "{name}: grace {grace} well above the wait {wait}"
        );
        let command = strings(&svc["command"]);
        assert_eq!(
            command[..3],
            ["/usr/local/bin/demo-app", "--listen", "0.0.0.0:8080"],
            "{name}: the app alone, no Envoy"
        );
        assert!(!command.iter().any(|a| a.contains("envoy")), "{name}");
        assert!(
            svc["ports"].is_null(),
            "{name}: reached through the fronts only"
        );
        assert!(
            eds.contains(&format!("address: {}, port_value: 8080", ip(&name))),
            "{name} in the fronts' EDS"
        );
    }
    assert_eq!(eds.matches("- endpoint:").count(), 3);
    for i in 1..=2 {
        let name = format!("front{i}");
        let svc = &services[name.as_str()];
        let command = strings(&svc["command"]);
        let config = format!("/work/envoy/compose/front-{i}.yaml");
        assert_eq!(command[..2], ["-c".to_string(), config.clone()], "{name}");
        let rendered =
            std::fs::read_to_string(root.join(config.trim_start_matches("/work/"))).unwrap();
        assert!(
            rendered.contains(&format!(
                "socket_address: {{address: \"{}\", port_value: {}}}",
                ip(&name),
                compose::FRONT_CONTROL_PORT
            )),
            "{name}: front_control bound to its own address"
        );
        assert!(
            rendered.contains("path: envoy/compose/backends-eds.yaml"),
            "{name}"
        );
        let ports = strings(&svc["ports"]);
        let (public, admin) = compose::front_host_ports(i);
        assert_eq!(
            ports,
            [format!("{public}:10000"), format!("127.0.0.1:{admin}:9903")],
            "{name}: the public listener and the admin on loopback, never the control port"
        );
        for volume in strings(&svc["volumes"]) {
            let host = volume.split(':').next().unwrap().to_string();
            assert!(
                root.join("envoy").join(&host).exists() || host == "../dist",
                "{name}: volume {host}"
            );
        }
    }
}
