//! The shared validators and error type of [`crate::shared::config`], tested
//! through every filter's config; above the rooms because it names all three.

use crate::consumer::config::*;
use crate::drain::config::*;
use crate::provider::config::*;
use crate::shared::config::*;

fn provider_err(json: &str) -> ConfigError {
    ProviderConfig::from_json(json.as_bytes()).unwrap_err()
}

fn drain_err(json: &str) -> ConfigError {
    DrainConfig::from_json(json.as_bytes()).unwrap_err()
}

#[test]
fn errors_stay_one_line_whatever_the_input_holds() {
    // Found by fuzzing: serde quotes an unknown key as written.
    let err = DrainConfig::from_json(b"\t{\"hdg\\ne=e{\"hdg\\ne=ee_e_he").unwrap_err();
    assert!(!err.to_string().contains('\n'), "{err}");
    let err = ProviderConfig::from_json(br#"{"a\nb\u0007": 1}"#).unwrap_err();
    let text = err.to_string();
    assert!(!text.chars().any(char::is_control), "{text}");
    assert!(text.contains(r"a\nb\u{7}"), "{text}");
}

#[test]
fn sections_must_be_objects() {
    for (json, field) in [
        (r#"{"paths":[]}"#, "paths"),
        (r#"{"on_drained":["app"]}"#, "on_drained"),
    ] {
        let err = drain_err(json);
        assert_eq!(err.field, field, "{json}: {err}");
        assert!(err.reason.contains("JSON object"), "{err}");
    }
}

#[test]
fn explicit_null_is_a_wrong_type_not_a_default() {
    let err = provider_err(r#"{"closing_header":null}"#);
    assert_eq!(err.field, "closing_header");
    assert!(err.reason.contains("invalid type: null"), "{err}");
    let err = DrainConfig::from_json(br#"{"paths":{"ready":null}}"#).unwrap_err();
    assert_eq!(err.field, "paths.ready");
    let err = ConsumerConfig::from_json(br#"{"max_tombstones":null}"#).unwrap_err();
    assert_eq!(err.field, "max_tombstones");
}

#[test]
fn malformed_documents_are_refused() {
    for bad in [
        "{",
        "[]",
        "null",
        "\"x\"",
        "{} {}",
        "{\"closing_header\":\"a\",}",
        "\u{feff}{}",
    ] {
        assert!(
            ProviderConfig::from_json(bad.as_bytes()).is_err(),
            "{bad:?}"
        );
        assert!(DrainConfig::from_json(bad.as_bytes()).is_err(), "{bad:?}");
    }
    assert!(ProviderConfig::from_json(b"\xff\xfe").is_err());
}

#[test]
fn errors_display_as_one_line_naming_the_field() {
    let err = drain_err(r#"{"quiet_window":"fast"}"#);
    let line = err.to_string();
    assert!(!line.contains('\n'));
    assert!(
        line.starts_with("invalid configuration: field \"quiet_window\": "),
        "{line}"
    );
    assert!(line.contains("\"fast\""), "{line}");
}

/// Every value field the three DTOs read: an explicit `null` is refused
/// and named, in nested sections too. (The sections themselves, `paths`
/// and `on_drained`, are refused as not objects: see below.)
#[test]
fn null_is_refused_in_every_field_and_named() {
    let provider = [
        "closing_header",
        "instance_header",
        "instance_id",
        "immediate_health_check_fail",
        "reject_when_drained",
        "long_lived_paths",
        "long_lived_upgrades",
        "consumer_header",
    ];
    let drain = [
        "consumer_update_wait",
        "quiet_window",
        "step_timeout",
        "timeout",
        "allowed_sources",
        "admin_cluster",
        "max_waiters",
        "close_connections",
        "max_report_peers",
    ];
    let consumer = [
        "closing_headers",
        "instance_header",
        "tombstone_ttl",
        "evict_on_connect_failure",
        "failure_tombstone_ttl",
        "override_host_header",
        "admin_cluster",
        "membership_refresh",
        "max_tombstones",
        "probe_path",
        "consumer_header",
    ];
    let null_in = |field: &str| format!(r#"{{"{field}":null}}"#);
    let mut cases: Vec<(String, String, ConfigError)> = Vec::new();
    for field in provider {
        let json = null_in(field);
        cases.push((json.clone(), field.into(), provider_err(&json)));
    }
    for field in drain {
        let json = null_in(field);
        cases.push((json.clone(), field.into(), drain_err(&json)));
    }
    for field in ["path", "timeout"] {
        let json = format!(r#"{{"on_drained":{{"cluster":"app","{field}":null}}}}"#);
        cases.push((
            json.clone(),
            format!("on_drained.{field}"),
            drain_err(&json),
        ));
    }
    for (field, _) in crate::drain::config::Paths::default().named() {
        let json = format!(r#"{{"paths":{{"{field}":null}}}}"#);
        cases.push((json.clone(), format!("paths.{field}"), drain_err(&json)));
    }
    for field in consumer {
        let json = null_in(field);
        let err = ConsumerConfig::from_json(json.as_bytes()).unwrap_err();
        cases.push((json, field.into(), err));
    }
    assert_eq!(cases.len(), 37);
    for (json, field, err) in cases {
        assert_eq!(err.field, field, "{json}: {err}");
        assert_eq!(
            err.reason, "invalid type: null (leave the field out for its default)",
            "{json}"
        );
        assert!(
            err.to_string()
                .starts_with(&format!("invalid configuration: field \"{field}\": ")),
            "{err}"
        );
    }
}

#[test]
fn null_is_refused_wherever_it_is() {
    let cases = [
        (
            r#"{"allowed_sources":["10.0.0.0/8",null]}"#,
            "allowed_sources[1]",
        ),
        (r#"{"on_drained":{"cluster":null}}"#, "on_drained.cluster"),
        // Before the unknown-field check: null is refused whatever the key.
        (r#"{"closng":null}"#, "closng"),
    ];
    for (json, field) in cases {
        let err = drain_err(json);
        assert_eq!(err.field, field, "{json}: {err}");
        assert!(
            err.reason.starts_with("invalid type: null"),
            "{json}: {err}"
        );
    }
    let err = ConsumerConfig::from_json(br#"{"closing_headers":[null]}"#).unwrap_err();
    assert_eq!(
        (err.field.as_str(), err.reason.as_str()),
        ("closing_headers[0]", "invalid type: null")
    );
    // A section written as null is refused as a section that is not an object.
    for (json, field) in [
        (r#"{"paths":null}"#, "paths"),
        (r#"{"on_drained":null}"#, "on_drained"),
    ] {
        let err = drain_err(json);
        assert_eq!(err.field, field, "{json}: {err}");
        assert!(err.reason.contains("JSON object"), "{json}: {err}");
    }
}

/// Every default the schema states is the parser's: writing it out gives the
/// same config as leaving the field out (nested sections' fields too).
#[cfg(feature = "schema")]
#[test]
fn the_schemas_defaults_are_the_parsers() {
    use serde_json::{json, Map, Value};

    fn same_as_absent<C: PartialEq + std::fmt::Debug>(
        schema: &Value,
        parse: impl Fn(&[u8]) -> Result<C, ConfigError>,
    ) -> usize {
        let mut checked = 0;
        let properties = schema["properties"].as_object().unwrap();
        for (name, property) in properties {
            let mut cases: Vec<(Value, Value)> = Vec::new();
            if let Some(default) = property.get("default") {
                cases.push((json!({}), json!({ name: default })));
            }
            if let Some(fields) = property["properties"].as_object() {
                // A section: its required fields given, each default written out.
                let mut base = Map::new();
                for required in property["required"].as_array().into_iter().flatten() {
                    let required = required.as_str().unwrap();
                    let form = fields[required]["$ref"].as_str().unwrap_or_default();
                    // A cluster's name, or a duration's.
                    let value = if form.ends_with("duration") {
                        "1s"
                    } else {
                        "app"
                    };
                    base.insert(required.into(), json!(value));
                }
                for (field, sub) in fields {
                    if let Some(default) = sub.get("default") {
                        let mut written = base.clone();
                        written.insert(field.clone(), default.clone());
                        cases.push((json!({ name: base }), json!({ name: written })));
                    }
                }
            }
            for (absent, written) in cases {
                let absent_config = parse(absent.to_string().as_bytes()).unwrap();
                let written_config = parse(written.to_string().as_bytes()).unwrap();
                assert_eq!(absent_config, written_config, "{written}");
                checked += 1;
            }
        }
        checked
    }

    // The consumer's `front` requires `admin_cluster`: every case names one.
    let consumer = |bytes: &[u8]| {
        let mut v: Value = serde_json::from_slice(bytes).unwrap();
        v["admin_cluster"] = json!("admin");
        ConsumerConfig::from_json(v.to_string().as_bytes())
    };
    let checked = same_as_absent(&ProviderConfig::json_schema(), ProviderConfig::from_json)
        + same_as_absent(&DrainConfig::json_schema(), DrainConfig::from_json)
        + same_as_absent(&ConsumerConfig::json_schema(), consumer);
    // 7 provider fields, 7 drain fields and 9 under its sections, 11 consumer
    // fields and 7 under its sections.
    assert_eq!(checked, 41);
}
