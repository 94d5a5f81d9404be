//! The delivery a run uses: the wasm plugins (`dist/*.wasm`, the default)
//! or the native dynamic module (`dist/libgraceful.so`). One source of
//! truth for both: the shipped templates name the wasm plugins, and
//! [`to_native`] rewrites a rendered config so every graceful wasm filter
//! becomes the dynamic-module filter of the same name with the same JSON
//! configuration. `GRACEFUL_DELIVERY=native` makes every suite run so.

use std::path::Path;

use serde_yaml::{Mapping, Value};

/// How the filters reach Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    Wasm,
    Native,
}

impl Delivery {
    /// `GRACEFUL_DELIVERY` (`wasm` or `native`; unset: wasm). Anything else
    /// is refused, naming the variable.
    pub fn from_env() -> Delivery {
        match std::env::var("GRACEFUL_DELIVERY").as_deref() {
            Err(_) | Ok("") | Ok("wasm") => Delivery::Wasm,
            Ok("native") => Delivery::Native,
            Ok(other) => {
                panic!("GRACEFUL_DELIVERY={other:?}: expected \"wasm\" or \"native\"")
            }
        }
    }

    /// What Envoy logs when a filter's config is refused.
    pub fn refusal(self, filter: &str) -> String {
        match self {
            Delivery::Wasm => format!("Unable to create Wasm plugin {filter}"),
            Delivery::Native => "Failed to initialize dynamic module".to_string(),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Delivery::Wasm => "wasm",
            Delivery::Native => "native",
        }
    }
}

const WASM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
const MODULE_TYPE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter";
/// The filters the module implements (its `filter_name`s).
pub const FILTERS: [&str; 3] = ["graceful_provider", "graceful_consumer", "graceful_drain"];
/// The metrics namespace the module's stats are put under: the wasm
/// build's, so both deliveries publish `wasmcustom.graceful_*` and one
/// dashboard, alert or `stats_matcher` fits both.
pub const METRICS_NAMESPACE: &str = "wasmcustom";

fn key(k: &str) -> Value {
    Value::String(k.into())
}

fn get<'a>(m: &'a Mapping, path: &[&str]) -> Option<&'a Value> {
    let (first, rest) = path.split_first()?;
    let v = m.get(key(first))?;
    if rest.is_empty() {
        Some(v)
    } else {
        get(v.as_mapping()?, rest)
    }
}

/// The dynamic-module `typed_config` for one graceful wasm `typed_config`,
/// or None if `wasm` is not one of ours. A wasm filter whose VM
/// configuration is `upstream` (graceful_consumer as an upstream filter)
/// keeps that as the `filter_name`'s suffix: `graceful_consumer:upstream`.
fn module_config(wasm: &Mapping, module: &Path) -> Option<Value> {
    let config = get(wasm, &["config"])?.as_mapping()?;
    let root_id = get(config, &["root_id"])?.as_str()?;
    if !FILTERS.contains(&root_id) {
        return None;
    }
    let json = get(config, &["configuration", "value"])
        .and_then(Value::as_str)
        .unwrap_or("{}");
    let upstream = get(config, &["vm_config", "configuration", "value"])
        .and_then(Value::as_str)
        .is_some_and(|v| v.trim() == "upstream");
    let filter_name = if upstream {
        format!("{root_id}:upstream")
    } else {
        root_id.to_string()
    };
    let yaml = format!(
        r#""@type": {MODULE_TYPE}
dynamic_module_config:
  module: {{local: {{filename: {module}}}}}
  do_not_close: true
  metrics_namespace: {METRICS_NAMESPACE}
filter_name: {filter_name}
filter_config:
  "@type": type.googleapis.com/google.protobuf.StringValue
  value: {json}
"#,
        module = serde_json::to_string(&module.display().to_string()).unwrap_or_default(),
        json = serde_json::to_string(json).unwrap_or_default(),
    );
    serde_yaml::from_str(&yaml).ok()
}

fn rewrite(v: &mut Value, module: &Path, count: &mut usize) {
    match v {
        Value::Mapping(m) => {
            if let Some(Value::Mapping(tc)) = m.get(key("typed_config")) {
                if get(tc, &["@type"]).and_then(Value::as_str) == Some(WASM_TYPE) {
                    if let Some(native) = module_config(tc, module) {
                        m.insert(key("typed_config"), native);
                        *count += 1;
                    }
                }
            }
            for (_, child) in m.iter_mut() {
                rewrite(child, module, count);
            }
        }
        Value::Sequence(items) => {
            for item in items {
                rewrite(item, module, count);
            }
        }
        _ => {}
    }
}

/// `config` (a rendered Envoy config, YAML) with every graceful wasm
/// filter replaced by the dynamic module at `module`; the number replaced.
pub fn to_native(config: &str, module: &Path) -> Result<(String, usize), String> {
    let mut doc: Value = serde_yaml::from_str(config).map_err(|e| format!("config: {e}"))?;
    let mut count = 0;
    rewrite(&mut doc, module, &mut count);
    let text = serde_yaml::to_string(&doc).map_err(|e| e.to_string())?;
    Ok((text, count))
}

/// The shipped native configs: `envoy/native/<template>` is the wasm
/// template rendered with its defaults and rewritten to the module at
/// `dist/libgraceful.so` (relative to Envoy's working directory, as the
/// wasm configs' `dist/*.wasm` are). `make native-configs` writes them;
/// `make test` checks they are current and validates them.
pub const SHIPPED: [&str; 2] = ["provider-sidecar.yaml", "consumer-sidecar.yaml"];

pub fn shipped_files() -> Result<Vec<(std::path::PathBuf, String)>, String> {
    SHIPPED
        .iter()
        .map(|name| {
            let (path, text, n) = native_form(name)?;
            if n == 0 {
                return Err(format!("envoy/{name}: no graceful filter to rewrite"));
            }
            Ok((path, text))
        })
        .collect()
}

/// `envoy/<name>` rendered with its defaults and every graceful wasm filter
/// made the native module at `dist/libgraceful.so`, as `make
/// native-configs` writes it: (its path under `envoy/native/`, its text, how
/// many filters were rewritten).
pub fn native_form(name: &str) -> Result<(std::path::PathBuf, String, usize), String> {
    let root = crate::support::envoy::repo_root();
    let template = std::fs::read_to_string(root.join("envoy").join(name))
        .map_err(|e| format!("envoy/{name}: {e}"))?;
    let rendered = crate::support::render::render(&template, &Default::default())
        .map_err(|e| format!("envoy/{name}: {e}"))?;
    let (yaml, n) = to_native(&rendered, Path::new("dist/libgraceful.so"))?;
    let text = format!(
        "# Generated by `make native-configs` from envoy/{name}: do not edit.\n\
         # envoy/{name} with every graceful wasm filter replaced by the native\n\
         # module dist/libgraceful.so (`make native`), same JSON configs and\n\
         # defaults. Run from the repository root:\n\
         #   envoy -c envoy/native/{name}\n{yaml}"
    );
    Ok((std::path::PathBuf::from("envoy/native").join(name), text, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    const WASM: &str = r#"
http_filters:
- name: graceful_drain
  disabled: true
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
    config:
      name: graceful_drain
      root_id: graceful_drain
      configuration:
        "@type": type.googleapis.com/google.protobuf.StringValue
        value: '{"admin_cluster": "envoy_admin"}'
      vm_config:
        vm_id: graceful
        code: {local: {filename: dist/graceful_drain.wasm}}
- name: other
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
    config: {root_id: someone_elses}
- name: graceful_consumer
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
    config:
      root_id: graceful_consumer
      vm_config:
        configuration: {"@type": type.googleapis.com/google.protobuf.StringValue, value: upstream}
"#;

    #[test]
    fn it_replaces_only_the_graceful_filters_and_keeps_their_json() {
        let (text, n) = to_native(WASM, Path::new("/x/libgraceful.so")).unwrap();
        assert_eq!(n, 2);
        let doc: Value = serde_yaml::from_str(&text).unwrap();
        let filters = doc["http_filters"].as_sequence().unwrap();
        let drain = &filters[0];
        assert_eq!(drain["disabled"], Value::Bool(true));
        let tc = &drain["typed_config"];
        assert_eq!(tc["@type"].as_str(), Some(MODULE_TYPE));
        assert_eq!(tc["filter_name"].as_str(), Some("graceful_drain"));
        assert_eq!(
            tc["filter_config"]["value"].as_str(),
            Some(r#"{"admin_cluster": "envoy_admin"}"#)
        );
        assert_eq!(
            tc["dynamic_module_config"]["module"]["local"]["filename"].as_str(),
            Some("/x/libgraceful.so")
        );
        assert_eq!(
            tc["dynamic_module_config"]["metrics_namespace"].as_str(),
            Some("wasmcustom")
        );
        assert_eq!(
            filters[1]["typed_config"]["@type"].as_str(),
            Some(WASM_TYPE)
        );
        assert_eq!(
            filters[2]["typed_config"]["filter_name"].as_str(),
            Some("graceful_consumer:upstream")
        );
        assert_eq!(
            filters[2]["typed_config"]["filter_config"]["value"].as_str(),
            Some("{}")
        );
    }
}
