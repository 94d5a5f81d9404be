//! The manifests under examples/ cannot be applied here (no cluster), so
//! they are checked for what can be checked without one:
//!
//! - every YAML document under examples/ parses and names a kind and an
//!   apiVersion;
//! - every document of a built-in Kubernetes API group validates strictly
//!   (unknown fields refused) with `kubernetes-validate` against several
//!   Kubernetes versions (the Envoy Gateway front-drain backend and Services
//!   among them); documents of other groups (Istio, Envoy Gateway, Gateway
//!   API) are listed, not validated by it; every Istio WasmPlugin (the
//!   ambient waypoint's among them) is held to the fields and values of
//!   istio/api's `WasmPlugin` instead;
//! - the Kubernetes example wires readiness and both preStop hooks to the
//!   endpoints graceful_drain serves, on the port its Envoy config listens on,
//!   each hook from an address graceful_drain answers: an `exec` hook inside
//!   the pod over loopback (the default `allowed_sources`), never an `httpGet`
//!   to an endpoint but readiness (kubelet calls from the node's address,
//!   which gets 403, and a failed preStop is followed by SIGTERM at once);
//! - its numbers hold together: graceful_drain's `timeout` (read from the
//!   Envoy config the README renders), each preStop hook's wait and
//!   `terminationGracePeriodSeconds`.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use graceful_core::drain::config::DrainConfig;
use graceful_core::shared::duration::parse_duration;
use graceful_harness::support::envoy::repo_root;
use serde_yaml::Value;

const KUBERNETES_MANIFEST: &str = "examples/kubernetes/provider.yaml";
/// Envoy Gateway's backends with no sidecar: a Deployment and two Services
/// (validated here), its policies (checked in examples_envoy_gateway.rs).
const FRONT_DRAIN: &str = "examples/envoy-gateway/front-drain.yaml";
/// The WasmPlugin for an ambient waypoint (checked below with the others).
const WAYPOINT_PLUGIN: &str = "examples/istio/waypoint-wasmplugin.yaml";
const KUBERNETES_README: &str = "examples/kubernetes/README.md";
const DRAIN_CONFIG_FILE: &str = "examples/kubernetes/drain-config.json";
const ENVOY_TEMPLATE: &str = "envoy/provider-sidecar.yaml";

/// The README renders the Envoy config with these values; the test renders it
/// the same way (the drain config with its newlines removed, as `tr -d` does).
const README_DRAIN_CONFIG: &str =
    r#"DRAIN_CONFIG="$(tr -d '\n' < examples/kubernetes/drain-config.json)""#;
const RENDER_VALUES: &[(&str, &str)] = &[("APP_PORT", "8080"), ("WASM_DIR", "dist")];

/// Time the app and Envoy get to exit after SIGTERM, once their preStop hooks
/// have returned, before the grace period ends. After an unforced gate nothing
/// is in flight, so both exit at once; this is headroom, not a wait.
const SIGTERM_MARGIN: Duration = Duration::from_secs(5);

/// Kubernetes versions every built-in document is validated against, besides
/// the newest the installed kubernetes-validate ships.
const KUBERNETES_VERSIONS: &[&str] = &["1.29", "1.31", "1.33", "1.35"];

/// API groups served by the Kubernetes API server itself ("" is the core
/// group, `apiVersion: v1`). Their schemas ship with kubernetes-validate.
const BUILT_IN_GROUPS: &[&str] = &[
    "",
    "admissionregistration.k8s.io",
    "apiextensions.k8s.io",
    "apiregistration.k8s.io",
    "apps",
    "autoscaling",
    "batch",
    "certificates.k8s.io",
    "coordination.k8s.io",
    "discovery.k8s.io",
    "events.k8s.io",
    "flowcontrol.apiserver.k8s.io",
    "networking.k8s.io",
    "node.k8s.io",
    "policy",
    "rbac.authorization.k8s.io",
    "resource.k8s.io",
    "scheduling.k8s.io",
    "storage.k8s.io",
];

/// Custom resources' groups (by suffix): not validated by kubernetes-validate,
/// which has no schema for them. A group in neither list fails the test, so a
/// typo in a built-in group cannot slip through unvalidated.
const CUSTOM_GROUP_SUFFIXES: &[&str] = &[
    ".istio.io",                 // WasmPlugin, EnvoyFilter, ...
    ".envoyproxy.io",            // Envoy Gateway's EnvoyExtensionPolicy, ...
    "gateway.networking.k8s.io", // Gateway API (a CRD, despite the k8s.io)
    ".x-k8s.io",
    "monitoring.coreos.com", // the prometheus-operator's PrometheusRule
    "argoproj.io",           // Argo Rollouts' AnalysisTemplate: checked below
];

/// One YAML document of a file under examples/.
struct Doc {
    /// Repository-relative path of its file.
    path: String,
    /// Position in the file, from 0 (documents that are only comments skipped).
    index: usize,
    /// Its text as written (what kubernetes-validate reads).
    text: String,
    value: Value,
}

impl Doc {
    fn api_version(&self) -> &str {
        self.value["apiVersion"].as_str().unwrap_or_default()
    }
    fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or_default()
    }
    fn group(&self) -> &str {
        self.api_version().rsplit_once('/').map_or("", |(g, _)| g)
    }
    fn label(&self) -> String {
        format!(
            "{}#{} {} {}/{}",
            self.path,
            self.index,
            self.api_version(),
            self.kind(),
            self.value["metadata"]["name"].as_str().unwrap_or("?")
        )
    }
}

/// Every `.yaml`/`.yml` file under examples/, repository-relative, sorted.
/// YAML under examples/ that is an Envoy config, not a Kubernetes
/// manifest: harness/tests/readme.rs runs it on real Envoy instead.
const ENVOY_CONFIGS: &[&str] = &["examples/minimal/envoy.yaml"];
/// YAML under examples/ that is a Prometheus rule file or its unit tests,
/// not a Kubernetes manifest: `make rules-check` runs promtool on them.
const PROMETHEUS_FILES: &[&str] = &[
    "examples/prometheus/rules.yaml",
    "examples/prometheus/rules_test.yaml",
];

/// Every Kubernetes manifest under examples/ (the Envoy configs and
/// Prometheus files there excepted, each of which must exist, so the
/// exception cannot go stale).
fn example_yaml_files() -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if name.starts_with('.') || name == "target" {
                continue;
            }
            if path.is_dir() {
                walk(&path, out);
            } else if name.ends_with(".yaml") || name.ends_with(".yml") {
                out.push(path);
            }
        }
    }
    let root = repo_root();
    let mut found = Vec::new();
    walk(&root.join("examples"), &mut found);
    let mut files: Vec<String> = found
        .iter()
        .map(|p| {
            p.strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    for config in ENVOY_CONFIGS.iter().chain(PROMETHEUS_FILES) {
        assert!(
            files.iter().any(|f| f == config),
            "{config}: listed as not a Kubernetes manifest under examples/, not found"
        );
    }
    files.retain(|f| {
        !ENVOY_CONFIGS.contains(&f.as_str()) && !PROMETHEUS_FILES.contains(&f.as_str())
    });
    files.sort();
    files
}

/// The documents of one file, split at `---` lines so that each keeps its
/// own text. The split is checked against serde_yaml's own reading.
fn documents(path: &str) -> Vec<Doc> {
    let text =
        std::fs::read_to_string(repo_root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut chunks = vec![String::new()];
    for line in text.lines() {
        let line = match line.strip_prefix("---") {
            Some(rest) if rest.is_empty() || rest.starts_with([' ', '\t']) => {
                chunks.push(String::new());
                rest.trim_start()
            }
            _ => line,
        };
        let last = chunks.last_mut().unwrap();
        last.push_str(line);
        last.push('\n');
    }
    let mut docs = Vec::new();
    for chunk in chunks {
        let value: Value = serde_yaml::from_str(&chunk)
            .unwrap_or_else(|e| panic!("{path}, document {}: {e}", docs.len()));
        if value.is_null() {
            continue; // comments only
        }
        docs.push(Doc {
            path: path.to_string(),
            index: docs.len(),
            text: chunk,
            value,
        });
    }
    let whole: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap_or_else(|e| panic!("{path}: {e}")))
        .filter(|v: &Value| !v.is_null())
        .collect();
    assert!(
        docs.iter().map(|d| &d.value).eq(whole.iter()),
        "{path}: splitting at `---` lines found {} documents, serde_yaml {} (or different ones)",
        docs.len(),
        whole.len()
    );
    docs
}

fn all_documents() -> Vec<Doc> {
    example_yaml_files()
        .iter()
        .flat_map(|f| documents(f))
        .collect()
}

#[test]
fn it_parses_every_example_manifest() {
    let files = example_yaml_files();
    assert!(
        files.iter().any(|f| f == KUBERNETES_MANIFEST),
        "{KUBERNETES_MANIFEST} not found among {files:?}"
    );
    for dir in [
        "examples/kubernetes/",
        "examples/istio/",
        "examples/envoy-gateway/",
    ] {
        assert!(
            files.iter().any(|f| f.starts_with(dir)),
            "no YAML file under {dir}: found {files:?}"
        );
    }
    for path in &files {
        let docs = documents(path);
        assert!(!docs.is_empty(), "{path}: no document");
        for d in &docs {
            assert!(
                !d.kind().is_empty() && !d.api_version().is_empty(),
                "{}: a document without kind or apiVersion: {:?}",
                d.label(),
                d.value
            );
        }
    }
}

/// `$GRACEFUL_KUBERNETES_VALIDATE`, else the one `make test-tools` installs
/// into `.venv/`, else `kubernetes-validate` on PATH.
fn kubernetes_validate() -> PathBuf {
    if let Some(p) = std::env::var_os("GRACEFUL_KUBERNETES_VALIDATE") {
        return PathBuf::from(p);
    }
    let local = repo_root().join(".venv/bin/kubernetes-validate");
    if local.exists() {
        return local;
    }
    PathBuf::from("kubernetes-validate")
}

fn run(tool: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(tool)
        .args(args)
        .env("COLUMNS", "200")
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e} (install it: cd {} && make test-tools)",
                tool.display(),
                repo_root().display()
            )
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The newest Kubernetes version the installed kubernetes-validate ships
/// schemas for: its default (`--help`: "Defaults to 1.37.0").
fn newest_shipped_version(tool: &Path) -> String {
    let (_, help) = run(tool, &["--help"]);
    let after = help
        .split_once("Defaults to ")
        .unwrap_or_else(|| panic!("no default version in {}'s help:\n{help}", tool.display()))
        .1;
    let version: String = after
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let mut parts = version.trim_end_matches('.').split('.');
    format!("{}.{}", parts.next().unwrap(), parts.next().unwrap_or("0"))
}

#[test]
fn it_validates_every_kubernetes_document_strictly() {
    let mut built_in = Vec::new();
    let mut custom = Vec::new();
    for d in all_documents() {
        if BUILT_IN_GROUPS.contains(&d.group()) {
            built_in.push(d);
        } else if CUSTOM_GROUP_SUFFIXES.iter().any(|s| d.group().ends_with(s)) {
            custom.push(d);
        } else {
            panic!(
                "{}: API group {:?} is neither built into Kubernetes nor a known custom resource group; \
                 add it to BUILT_IN_GROUPS (validated) or CUSTOM_GROUP_SUFFIXES (not validated here)",
                d.label(),
                d.group()
            );
        }
    }
    // What the examples are known to hold, so that a walker or split gone
    // wrong cannot pass by validating nothing.
    let has = |docs: &[Doc], path: &str, kind: &str| {
        docs.iter()
            .any(|d| d.kind() == kind && (path.is_empty() || d.path == path))
    };
    for kind in ["Deployment", "Service"] {
        assert!(
            has(&built_in, KUBERNETES_MANIFEST, kind),
            "no {kind} from {KUBERNETES_MANIFEST} among the documents to validate"
        );
    }
    for kind in ["Deployment", "Service"] {
        assert!(
            has(&built_in, FRONT_DRAIN, kind),
            "no {kind} from {FRONT_DRAIN} among the documents to validate"
        );
    }
    for (path, kind) in [
        (FRONT_DRAIN, "EnvoyExtensionPolicy"),
        (FRONT_DRAIN, "EnvoyPatchPolicy"),
        (WAYPOINT_PLUGIN, "WasmPlugin"),
    ] {
        assert!(
            has(&custom, path, kind),
            "no {kind} from {path} among the custom resources"
        );
    }
    for kind in ["WasmPlugin", "EnvoyExtensionPolicy"] {
        assert!(
            has(&custom, "", kind),
            "no {kind} among the custom resources: {:?}",
            custom.iter().map(Doc::label).collect::<Vec<_>>()
        );
    }

    // One file per built-in document (its own text), plus a canary with an
    // unknown field that strict validation must refuse.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("examples-validate");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    for d in &built_in {
        let name = format!("{}-{}.yaml", d.path.replace('/', "_"), d.index);
        let file = dir.join(&name).to_string_lossy().into_owned();
        std::fs::write(&file, &d.text).unwrap();
        files.insert(file, d.label());
    }
    let canary = dir.join("canary.yaml").to_string_lossy().into_owned();
    std::fs::write(
        &canary,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: canary}\ndta: {a: b}\n",
    )
    .unwrap();

    let tool = kubernetes_validate();
    let mut versions: Vec<String> = KUBERNETES_VERSIONS.iter().map(|v| v.to_string()).collect();
    let newest = newest_shipped_version(&tool);
    if !versions.contains(&newest) {
        versions.push(newest);
    }
    for version in &versions {
        let mut args = vec!["--strict", "-k", version.as_str()];
        args.extend(files.keys().map(String::as_str));
        args.push(&canary);
        let (_, output) = run(&tool, &args);
        let listing = files
            .iter()
            .map(|(f, l)| format!("  {f}: {l}"))
            .collect::<Vec<_>>()
            .join("\n");
        let fail = |why: String| -> ! {
            panic!(
                "kubernetes-validate --strict -k {version}: {why}\nfiles:\n{listing}\noutput:\n{output}"
            )
        };
        for line in output.lines() {
            let bad = line.starts_with("WARN")
                || line.starts_with("FATAL")
                || (line.starts_with("ERROR") && !line.contains(&canary))
                || line.starts_with("Traceback");
            if bad {
                fail(format!("{line:?}"));
            }
        }
        for (file, label) in &files {
            let passed = format!("INFO {file} passed for resource ");
            let against = format!(" against version {version}");
            if !output
                .lines()
                .any(|l| l.starts_with(&passed) && l.ends_with(&against))
            {
                fail(format!("{label} did not pass against {version}"));
            }
        }
        if !output.lines().any(|l| {
            l.starts_with(&format!("ERROR {canary} did not validate")) && l.contains("dta")
        }) {
            fail("the canary with an unknown field was not refused: is --strict in effect?".into());
        }
    }
    eprintln!(
        "validated strictly against Kubernetes {}: {}",
        versions.join(", "),
        built_in
            .iter()
            .map(Doc::label)
            .collect::<Vec<_>>()
            .join("; ")
    );
    eprintln!(
        "not validated here (custom resources): {}",
        custom.iter().map(Doc::label).collect::<Vec<_>>().join("; ")
    );
    graceful_harness::support::tested_with::record("examples/kubernetes/README.md");
}

/// The Envoy config the README's commands produce: the template rendered
/// with the README's values and examples/kubernetes/drain-config.json.
fn rendered_envoy_config() -> Value {
    let root = repo_root();
    let readme = std::fs::read_to_string(root.join(KUBERNETES_README)).unwrap();
    assert!(
        readme.contains(README_DRAIN_CONFIG),
        "{KUBERNETES_README} must render the Envoy config with {README_DRAIN_CONFIG} (the test renders it so)"
    );
    for (k, v) in RENDER_VALUES {
        assert!(
            readme.contains(&format!("{k}={v}")),
            "{KUBERNETES_README} must render with {k}={v} (the test renders it so)"
        );
    }
    let drain = std::fs::read_to_string(root.join(DRAIN_CONFIG_FILE)).unwrap();
    let mut values: HashMap<String, String> = RENDER_VALUES
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    values.insert("DRAIN_CONFIG".into(), drain.replace('\n', ""));
    let template = std::fs::read_to_string(root.join(ENVOY_TEMPLATE)).unwrap();
    let text = graceful_harness::support::render::render(&template, &values).unwrap();
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("rendered {ENVOY_TEMPLATE}: {e}"))
}

fn named<'a>(list: &'a Value, name: &str) -> &'a Value {
    list.as_sequence()
        .unwrap_or_else(|| panic!("not a list: {list:?}"))
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("nothing named {name:?} in {list:?}"))
}

/// What the Kubernetes example's pod depends on in its Envoy config.
struct Sidecar {
    drain: DrainConfig,
    listen_address: String,
    listen_port: u64,
    /// `address:port` of the `app` cluster.
    app: String,
    /// The wasm files the config loads (relative to Envoy's working dir).
    wasm_files: Vec<String>,
}

fn sidecar() -> Sidecar {
    let config = rendered_envoy_config();
    let listener = named(&config["static_resources"]["listeners"], "inbound");
    let hcm = &listener["filter_chains"][0]["filters"][0]["typed_config"];
    let filters = &hcm["http_filters"];
    let drain_json = named(filters, "graceful_drain")["typed_config"]["config"]["configuration"]
        ["value"]
        .as_str()
        .expect("graceful_drain's configuration value");
    let drain = DrainConfig::from_json(drain_json.as_bytes()).unwrap_or_else(|e| {
        panic!("graceful_drain refuses {DRAIN_CONFIG_FILE} as rendered ({drain_json}): {e}")
    });
    let wasm_files = ["graceful_drain", "graceful_provider"]
        .iter()
        .map(|f| {
            named(filters, f)["typed_config"]["config"]["vm_config"]["code"]["local"]["filename"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let socket = &listener["address"]["socket_address"];
    let app = &named(&config["static_resources"]["clusters"], "app")["load_assignment"]
        ["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"];
    Sidecar {
        drain,
        listen_address: socket["address"].as_str().unwrap().to_string(),
        listen_port: socket["port_value"].as_u64().unwrap(),
        app: format!(
            "{}:{}",
            app["address"].as_str().unwrap(),
            app["port_value"].as_u64().unwrap()
        ),
        wasm_files,
    }
}

/// The pod template of the Kubernetes example's Deployment.
fn pod() -> Value {
    let docs = documents(KUBERNETES_MANIFEST);
    let deployment = docs
        .iter()
        .find(|d| d.kind() == "Deployment")
        .expect("a Deployment");
    deployment.value["spec"]["template"]["spec"].clone()
}

fn containers(pod: &Value) -> Vec<Value> {
    pod["containers"].as_sequence().unwrap().clone()
}

/// A preStop hook that starts closing and waits on graceful_drain's
/// drained endpoint: `graceful-hook prestop URL WAIT` (or `demo-app
/// prestop`, the same code), run inside the pod.
#[derive(Debug)]
struct Hook {
    /// How long it waits for drained.
    wait: Duration,
    /// The program it runs.
    program: String,
    /// The host and port it calls from inside the pod.
    host: IpAddr,
    port: u64,
}

/// The hook's programs: graceful-hook from a volume, or the demo image's own.
const HOOK_PROGRAMS: &[&str] = &["graceful-hook", "demo-app"];

/// A container's preStop hook, or why it cannot wait for the gate. An
/// `httpGet` hook is refused: kubelet sends it from the node's address,
/// outside `allowed_sources`, so every endpoint but readiness answers it
/// 403, and a failed preStop is followed by SIGTERM at once.
fn prestop(container: &Value, drain: &DrainConfig) -> Result<Hook, String> {
    let name = container["name"].as_str().unwrap_or("?");
    let hook = &container["lifecycle"]["preStop"];
    if let Some(path) = hook["httpGet"]["path"].as_str() {
        let endpoint = path.split('?').next().unwrap_or(path);
        return Err(if endpoint == drain.paths.ready {
            format!("container {name}: preStop httpGet {path:?} only reads readiness; it never waits for drained")
        } else {
            format!(
                "container {name}: preStop httpGet {path:?} comes from the node's address, outside allowed_sources {:?}: \
                 graceful_drain answers it 403 (only {} answers every caller), and a failed preStop is followed by SIGTERM at once; \
                 use an exec hook (graceful-hook prestop URL WAIT) that calls over loopback",
                drain.allowed_sources, drain.paths.ready
            )
        });
    }
    let command: Vec<&str> = hook["exec"]["command"]
        .as_sequence()
        .ok_or_else(|| format!("container {name}: no preStop exec hook"))?
        .iter()
        .map(|a| a.as_str().unwrap_or_default())
        .collect();
    let shape =
        || format!("container {name}: preStop {command:?} is not `graceful-hook prestop URL WAIT`");
    command
        .first()
        .map(|p| p.rsplit('/').next().unwrap_or(p))
        .filter(|p| HOOK_PROGRAMS.contains(p))
        .ok_or_else(shape)?;
    let [_, "prestop", url, wait] = command[..] else {
        return Err(shape());
    };
    let (host, port) = url
        .strip_prefix("http://")
        .and_then(|a| a.trim_end_matches('/').rsplit_once(':'))
        .ok_or_else(|| format!("container {name}: preStop URL {url:?} is not http://HOST:PORT"))?;
    let host: IpAddr = host
        .trim_matches(['[', ']'])
        .parse()
        .map_err(|e| format!("container {name}: preStop URL {url:?}: {e}"))?;
    if !drain.allowed_sources.iter().any(|c| c.contains(host)) {
        return Err(format!(
            "container {name}: preStop calls {host}, so it calls from there, outside allowed_sources {:?}: it would get 403",
            drain.allowed_sources
        ));
    }
    Ok(Hook {
        wait: parse_duration(wait)
            .map_err(|e| format!("container {name}: preStop wait {wait:?}: {e}"))?,
        program: command[0].to_string(),
        host,
        port: port
            .parse()
            .map_err(|e| format!("container {name}: preStop URL {url:?}: {e}"))?,
    })
}

/// [`prestop`], failing the test with its reason.
fn prestop_hook(container: &Value, drain: &DrainConfig) -> Hook {
    prestop(container, drain).unwrap_or_else(|why| panic!("{why}"))
}

/// `program` (an absolute path in `container`) is what an init container
/// installs: `graceful-hook install DIR` from the graceful-hook image, into
/// an `emptyDir` volume the init container mounts at `DIR` and `container`
/// where `program` lies.
fn assert_installed(pod: &Value, container: &Value, program: &str) {
    let name = container["name"].as_str().unwrap_or("?");
    let dir = Path::new(program)
        .parent()
        .unwrap_or_else(|| panic!("{name}: {program}"));
    assert_eq!(
        Path::new(program).file_name().and_then(|f| f.to_str()),
        Some("graceful-hook"),
        "{name}: {program} is not what `graceful-hook install` writes"
    );
    let mount_of = |c: &Value, at: Option<&Path>| -> Option<String> {
        c["volumeMounts"].as_sequence()?.iter().find_map(|m| {
            let path = Path::new(m["mountPath"].as_str()?);
            (at.is_none_or(|at| at == path)).then(|| m["name"].as_str().map(String::from))?
        })
    };
    let volume = mount_of(container, Some(dir))
        .unwrap_or_else(|| panic!("{name}: no volume mounted at {}", dir.display()));
    assert!(
        pod["volumes"].as_sequence().is_some_and(|vs| vs
            .iter()
            .any(|v| v["name"] == volume.as_str() && v["emptyDir"].is_mapping())),
        "{name}: volume {volume} is not an emptyDir of the pod"
    );
    let installs = pod["initContainers"]
        .as_sequence()
        .into_iter()
        .flatten()
        .any(|init| {
            let command: Vec<&str> = init["command"]
                .as_sequence()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let [bin, "install", at] = command[..] else {
                return false;
            };
            bin.ends_with("/graceful-hook")
                && init["image"]
                    .as_str()
                    .is_some_and(|i| i.starts_with("graceful-wasm/graceful-hook:"))
                && init["volumeMounts"].as_sequence().is_some_and(|ms| {
                    ms.iter()
                        .any(|m| m["name"] == volume.as_str() && m["mountPath"] == at)
                })
        });
    assert!(
        installs,
        "{name}: no init container runs `graceful-hook install` into volume {volume} ({program})"
    );
}

#[test]
fn it_wires_readiness_and_prestop_to_the_drain_endpoints() {
    let sidecar = sidecar();
    let pod = pod();
    let containers = containers(&pod);
    let envoy = named(&pod["containers"], "envoy");
    let app = named(&pod["containers"], "app");

    // Readiness: graceful_drain's ready endpoint, on the inbound listener,
    // which listens on the pod IP (kubelet probes and runs httpGet hooks
    // against the pod IP, not localhost).
    assert_eq!(sidecar.drain.paths.ready, "/graceful/ready");
    assert_eq!(
        envoy["readinessProbe"]["httpGet"]["path"].as_str(),
        Some(sidecar.drain.paths.ready.as_str())
    );
    assert_eq!(
        envoy["readinessProbe"]["httpGet"]["port"].as_u64(),
        Some(sidecar.listen_port)
    );
    assert_eq!(sidecar.listen_address, "0.0.0.0");
    assert_eq!(
        envoy["ports"][0]["containerPort"].as_u64(),
        Some(sidecar.listen_port)
    );

    // Every container has a hook that starts closing and waits for the gate
    // on the listener's port, over loopback (one without would get SIGTERM
    // at once and drop requests still in flight); the program it runs is in
    // its image or in a volume an init container fills.
    for c in &containers {
        let hook = prestop_hook(c, &sidecar.drain);
        let name = c["name"].as_str().unwrap_or("?");
        assert_eq!(hook.port, sidecar.listen_port, "{name}'s preStop port");
        assert!(hook.host.is_loopback(), "{name}'s preStop: {hook:?}");
        if hook.program.starts_with('/') {
            assert_installed(&pod, c, &hook.program);
        } else {
            assert_eq!(
                c["image"]
                    .as_str()
                    .map(|i| i.starts_with("graceful-wasm/demo-app:")),
                Some(true),
                "{name}: {} is only in the demo image",
                hook.program
            );
        }
    }

    // The app listens where the sidecar's `app` cluster sends.
    let args: Vec<&str> = app["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let listen = args
        .iter()
        .position(|a| *a == "--listen")
        .map(|i| args[i + 1]);
    assert_eq!(
        listen,
        Some(sidecar.app.as_str()),
        "app --listen vs the app cluster"
    );

    // The wasm files the config loads lie in the graceful-wasm mount, seen
    // from Envoy's working directory; the config file in envoy-config's.
    let mount = |volume: &str| {
        envoy["volumeMounts"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|m| m["name"] == volume)
            .and_then(|m| m["mountPath"].as_str())
            .unwrap_or_else(|| panic!("envoy mounts no {volume}"))
            .to_string()
    };
    let workdir = Path::new(envoy["workingDir"].as_str().expect("envoy's workingDir"));
    for file in &sidecar.wasm_files {
        let at = workdir.join(file);
        assert_eq!(
            at.parent(),
            Some(Path::new(&mount("graceful-wasm"))),
            "{file} from {} is not in the graceful-wasm mount",
            workdir.display()
        );
    }
    let envoy_args = envoy["args"].as_sequence().unwrap();
    let config_at = envoy_args
        .iter()
        .position(|a| a == "-c")
        .and_then(|i| envoy_args[i + 1].as_str())
        .expect("envoy -c");
    assert_eq!(
        Path::new(config_at).parent(),
        Some(Path::new(&mount("envoy-config")))
    );

    // `:latest` or untagged images default to imagePullPolicy Always, which
    // a locally built, loaded image never satisfies.
    let init = pod["initContainers"]
        .as_sequence()
        .cloned()
        .unwrap_or_default();
    for c in containers.iter().chain(&init) {
        let image = c["image"].as_str().unwrap();
        let tag = image
            .rsplit_once(':')
            .map(|(_, t)| t)
            .filter(|t| !t.contains('/'));
        if matches!(tag, None | Some("latest")) {
            assert_eq!(
                c["imagePullPolicy"].as_str(),
                Some("IfNotPresent"),
                "container {}: image {image} needs imagePullPolicy IfNotPresent",
                c["name"].as_str().unwrap_or("?")
            );
        }
    }
}

/// The check above must refuse what used to be shipped: Envoy's preStop as
/// an `httpGet` long-poll (kubelet calls from the node's address, which
/// gets 403 at once, and SIGTERM follows a failed hook), and an exec hook
/// calling the pod's own address rather than loopback.
#[test]
fn it_refuses_a_prestop_httpget_to_an_endpoint_but_readiness_and_a_hook_off_loopback() {
    let sidecar = sidecar();
    let pod = pod();
    let envoy = named(&pod["containers"], "envoy");
    assert!(prestop(envoy, &sidecar.drain).is_ok());
    let with_hook = |hook: &str| {
        let mut c = envoy.clone();
        c["lifecycle"]["preStop"] = serde_yaml::from_str(hook).unwrap();
        prestop(&c, &sidecar.drain)
    };
    for path in [
        "/graceful/drained?wait=30s",
        "/graceful/closing",
        "/graceful/status",
    ] {
        let why =
            with_hook(&format!("{{httpGet: {{path: {path:?}, port: 15006}}}}")).expect_err(path);
        assert!(why.contains("403") && why.contains("exec hook"), "{why}");
    }
    let why = with_hook(r#"{httpGet: {path: "/graceful/ready", port: 15006}}"#).unwrap_err();
    assert!(why.contains("never waits for drained"), "{why}");
    let why = with_hook(
        r#"{exec: {command: ["/graceful/graceful-hook", "prestop", "http://10.1.2.3:15006", "30s"]}}"#,
    )
    .unwrap_err();
    assert!(why.contains("outside allowed_sources"), "{why}");
    let why = with_hook(r#"{exec: {command: ["/bin/sleep", "30"]}}"#).unwrap_err();
    assert!(
        why.contains("is not `graceful-hook prestop URL WAIT`"),
        "{why}"
    );
}

#[test]
fn it_relates_the_grace_period_the_hook_waits_and_the_drain_timeout() {
    let sidecar = sidecar();
    let timeout = sidecar.drain.gate.timeout;
    let pod = pod();
    let grace = Duration::from_secs(
        pod["terminationGracePeriodSeconds"]
            .as_u64()
            .expect("terminationGracePeriodSeconds is set"),
    );
    let mut longest: Option<(String, Duration)> = None;
    for c in containers(&pod) {
        let name = c["name"].as_str().unwrap().to_string();
        let wait = prestop_hook(&c, &sidecar.drain).wait;
        // The gate passes, forced, `timeout` after closing started: a hook
        // that gives up before then lets Kubernetes stop its container while
        // requests may still be in flight.
        assert!(
            wait >= timeout,
            "container {name}: preStop waits {wait:?} on drained, less than graceful_drain's timeout \
             {timeout:?} ({DRAIN_CONFIG_FILE}): the hook would return before the forced gate"
        );
        if longest.as_ref().is_none_or(|(_, w)| wait > *w) {
            longest = Some((name, wait));
        }
    }
    let (name, wait) = longest.expect("containers with preStop hooks");
    // Kubernetes counts the preStop hooks inside the grace period (hooks of
    // different containers run at the same time), sends SIGTERM when each
    // returns, and SIGKILLs what still runs when it ends.
    assert!(
        grace > wait + SIGTERM_MARGIN,
        "terminationGracePeriodSeconds {}s must exceed the longest preStop wait ({name}: {wait:?}) \
         + {SIGTERM_MARGIN:?} for the containers to exit on SIGTERM (drain timeout {timeout:?})",
        grace.as_secs()
    );
    eprintln!(
        "drain timeout {timeout:?} <= longest preStop wait {wait:?} ({name}); grace period {grace:?} > {wait:?} + {SIGTERM_MARGIN:?}"
    );
}

/// The fields of Argo Rollouts' `AnalysisTemplate` (argoproj.io/v1alpha1)
/// that the example uses, as its CRD defines them
/// (`manifests/crds/analysis-template-crd.yaml`, Argo Rollouts v1.10, read
/// there; the CRD is not copied here): a field the CRD does not define, or
/// one of the wrong type, fails to read.
mod argo {
    use serde::Deserialize;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct AnalysisTemplate {
        pub api_version: String,
        pub kind: String,
        pub metadata: Metadata,
        pub spec: Spec,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Metadata {
        pub name: String,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Spec {
        pub args: Vec<Arg>,
        pub metrics: Vec<Metric>,
    }

    /// `name` required; `value` a string.
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Arg {
        pub name: String,
        pub value: Option<String>,
    }

    /// `name` and `provider` required; `interval` a duration string;
    /// `failureLimit` an integer or a string.
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct Metric {
        pub name: String,
        pub interval: Option<String>,
        pub success_condition: Option<String>,
        pub failure_condition: Option<String>,
        pub failure_limit: Option<serde_yaml::Value>,
        pub provider: Provider,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Provider {
        pub prometheus: Prometheus,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Prometheus {
        pub address: String,
        pub query: String,
    }
}

#[test]
fn the_analysis_template_reads_as_argo_rollouts_defines_it_and_every_arg_it_uses_is_declared() {
    let path = "examples/argo-rollouts/analysis-template.yaml";
    let docs = documents(path);
    assert_eq!(docs.len(), 1, "{path}");
    let t: argo::AnalysisTemplate = serde_yaml::from_value(docs[0].value.clone())
        .unwrap_or_else(|e| panic!("{path}: not an AnalysisTemplate as its CRD defines it: {e}"));
    assert_eq!(
        (t.api_version.as_str(), t.kind.as_str()),
        ("argoproj.io/v1alpha1", "AnalysisTemplate")
    );
    assert!(!t.metadata.name.is_empty());
    let declared: Vec<&str> = t.spec.args.iter().map(|a| a.name.as_str()).collect();
    for a in &t.spec.args {
        assert!(
            a.value.as_deref() != Some(""),
            "args.{}: an empty default",
            a.name
        );
    }
    assert!(t.spec.metrics.len() >= 2, "{path}: its metrics");
    for m in &t.spec.metrics {
        assert!(
            m.success_condition.is_some() || m.failure_condition.is_some(),
            "{}",
            m.name
        );
        if let Some(limit) = &m.failure_limit {
            assert!(
                limit.is_u64() || limit.is_string(),
                "{}: failureLimit {limit:?}",
                m.name
            );
        }
        for text in [&m.provider.prometheus.address, &m.provider.prometheus.query] {
            for (at, _) in text.match_indices("{{args.") {
                let name = text[at + 7..].split("}}").next().unwrap_or_default();
                assert!(
                    declared.contains(&name),
                    "{}: args.{name} is not declared",
                    m.name
                );
            }
        }
        assert!(
            m.interval
                .as_deref()
                .is_some_and(|i| parse_duration(i).is_ok()),
            "{}",
            m.name
        );
    }
}

/// istio/api `extensions/v1alpha1/wasm.proto`, `WasmPlugin`: its fields as
/// the CRD names them, and the values of its enums.
const WASMPLUGIN_FIELDS: &[&str] = &[
    "selector",
    "targetRef",
    "targetRefs",
    "url",
    "sha256",
    "imagePullPolicy",
    "imagePullSecret",
    "verificationKey",
    "pluginConfig",
    "pluginName",
    "phase",
    "priority",
    "failStrategy",
    "vmConfig",
    "match",
    "type",
];
const WASMPLUGIN_ENUMS: &[(&str, &[&str])] = &[
    (
        "imagePullPolicy",
        &["UNSPECIFIED_POLICY", "IfNotPresent", "Always"],
    ),
    ("phase", &["UNSPECIFIED_PHASE", "AUTHN", "AUTHZ", "STATS"]),
    ("failStrategy", &["FAIL_CLOSE", "FAIL_OPEN", "FAIL_RELOAD"]),
    ("type", &["UNSPECIFIED_PLUGIN_TYPE", "HTTP", "NETWORK"]),
];

/// kubernetes-validate has no schema for Istio's CRDs: every WasmPlugin is
/// held here to the fields and values istio/api defines, to its "at most
/// one of the selector and targetRefs", and to the attachments `targetRefs`
/// takes (a Gateway of the Gateway API in the same namespace, which is how
/// a waypoint is reached; a waypoint ignores `selector` policies).
#[test]
fn every_wasmplugin_has_only_the_fields_istio_defines() {
    let plugins: Vec<Doc> = all_documents()
        .into_iter()
        .filter(|d| d.kind() == "WasmPlugin")
        .collect();
    assert!(
        plugins.iter().any(|d| d.path == WAYPOINT_PLUGIN),
        "no WasmPlugin from {WAYPOINT_PLUGIN}"
    );
    for d in &plugins {
        let label = d.label();
        assert_eq!(d.api_version(), "extensions.istio.io/v1alpha1", "{label}");
        let spec = d.value["spec"]
            .as_mapping()
            .unwrap_or_else(|| panic!("{label}: no spec"));
        for key in spec.keys() {
            let key = key.as_str().unwrap_or_default();
            assert!(
                WASMPLUGIN_FIELDS.contains(&key),
                "{label}: spec.{key} is not a WasmPlugin field"
            );
        }
        for (field, values) in WASMPLUGIN_ENUMS {
            if let Some(v) = spec.get(*field) {
                let v = v.as_str().unwrap_or_default();
                assert!(
                    values.contains(&v),
                    "{label}: {field}: {v:?} is none of {values:?}"
                );
            }
        }
        let attached = ["selector", "targetRef", "targetRefs"]
            .iter()
            .filter(|f| spec.contains_key(**f))
            .count();
        assert!(
            attached <= 1,
            "{label}: at most one of selector and targetRefs"
        );
        let url = d.value["spec"]["url"].as_str().unwrap_or_default();
        assert!(
            ["oci://", "http://", "https://", "file://"]
                .iter()
                .any(|s| url.starts_with(s)),
            "{label}: url {url:?}"
        );
        let name = d.value["spec"]["pluginName"].as_str().unwrap_or_default();
        assert!(!name.is_empty() && name.len() <= 256, "{label}: pluginName");
        if let Some(refs) = d.value["spec"]["targetRefs"].as_sequence() {
            assert!(!refs.is_empty() && refs.len() <= 16, "{label}: targetRefs");
            for r in refs {
                assert_eq!(r["kind"].as_str(), Some("Gateway"), "{label}: {r:?}");
                assert_eq!(
                    r["group"].as_str(),
                    Some("gateway.networking.k8s.io"),
                    "{label}: {r:?}"
                );
                assert!(r["name"].as_str().is_some_and(|n| !n.is_empty()), "{label}");
            }
        }
    }
    // The waypoint's: attached by targetRefs, an HTTP filter, no `match`
    // (a waypoint's traffic has no sidecar direction), no front section.
    let waypoint = plugins
        .iter()
        .find(|d| d.path == WAYPOINT_PLUGIN)
        .map(|d| &d.value["spec"])
        .unwrap_or_else(|| panic!("{WAYPOINT_PLUGIN}"));
    assert!(waypoint["targetRefs"].is_sequence());
    assert_eq!(waypoint["type"].as_str(), Some("HTTP"));
    assert!(waypoint.get("match").is_none() && waypoint.get("selector").is_none());
    assert_eq!(waypoint["pluginName"].as_str(), Some("graceful_consumer"));
    assert_eq!(waypoint["failStrategy"].as_str(), Some("FAIL_OPEN"));
    assert!(
        waypoint["pluginConfig"].get("front").is_none(),
        "a waypoint cannot serve the front endpoints: it never sees a pod's address"
    );
}
