//! The manifests under examples/ cannot be applied here (no cluster), so
//! they are checked for what can be checked: every YAML document parses and
//! names a kind, and the Kubernetes Deployment wires the endpoints the
//! filters serve.

use serde::Deserialize;
use serde_yaml::Value;

fn documents(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(graceful_host_tests::envoy::repo_root().join(path)).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{path}: {e}")))
        .collect()
}

#[test]
fn it_parses_every_example_manifest() {
    for path in [
        "examples/kubernetes/provider.yaml",
        "examples/istio/wasmplugins.yaml",
        "examples/envoy-gateway/extension-policy.yaml",
    ] {
        let docs = documents(path);
        assert!(!docs.is_empty(), "{path}");
        for d in docs {
            assert!(
                d["kind"].as_str().is_some() && d["apiVersion"].as_str().is_some(),
                "{path}: {d:?}"
            );
        }
    }
}

#[test]
fn it_wires_readiness_and_prestop_to_the_drain_endpoints() {
    let docs = documents("examples/kubernetes/provider.yaml");
    let pod = &docs[0]["spec"]["template"]["spec"];
    let envoy = pod["containers"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "envoy")
        .unwrap();
    assert_eq!(
        envoy["readinessProbe"]["httpGet"]["path"].as_str(),
        Some("/graceful/ready")
    );
    let hook = envoy["lifecycle"]["preStop"]["httpGet"]["path"]
        .as_str()
        .unwrap();
    assert!(hook.starts_with("/graceful/drained?wait="), "{hook}");
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    assert!(
        grace > 25,
        "grace period {grace}s must exceed the 25s drain timeout"
    );
}
