//! Plugin configuration: JSON in two steps. First serde reads it into DTOs
//! that deny unknown fields (a typo must not silently fall back to a default);
//! then validation turns each DTO into the typed config the filters run on,
//! naming the field on every error. Empty configuration means all defaults.
//!
//! One file per filter (`provider.rs`, `drain.rs`, `consumer.rs`: its DTO, its
//! defaults, its validation); this one holds what they share: the error
//! type, reading bytes into a DTO, and the validators for header names,
//! durations, cluster names and URL paths. Every public item is re-exported
//! here, so users name `graceful_core::config::DrainConfig` and never the
//! file it lives in.

use std::fmt;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::duration::parse_duration;

mod consumer;
mod drain;
mod provider;

pub use consumer::{
    ConsumerConfig, DEFAULT_CLOSING_HEADERS, DEFAULT_FAILURE_TOMBSTONE_TTL, DEFAULT_MAX_TOMBSTONES,
    DEFAULT_MEMBERSHIP_REFRESH, DEFAULT_OVERRIDE_HOST_HEADER, DEFAULT_PROBE_PATH,
    DEFAULT_TOMBSTONE_TTL, MAX_MAX_TOMBSTONES,
};
pub use drain::{
    CloseConnections, DrainConfig, OnDrained, Paths, DEFAULT_ALLOWED_SOURCES,
    DEFAULT_CONSUMER_UPDATE_WAIT, DEFAULT_MAX_WAITERS, DEFAULT_ON_DRAINED_PATH,
    DEFAULT_ON_DRAINED_TIMEOUT, DEFAULT_QUIET_WINDOW, DEFAULT_STEP_TIMEOUT, DEFAULT_TIMEOUT,
    MAX_MAX_WAITERS, MAX_ON_DRAINED_TIMEOUT,
};
pub use provider::{
    LongLivedPath, ProviderConfig, DEFAULT_CLOSING_HEADER, DEFAULT_INSTANCE_HEADER,
    MAX_LONG_LIVED_PATHS,
};

/// A refused configuration: which field, and why. Displayed as one log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted path of the field (`paths.drained`, `allowed_sources[1]`);
    /// empty when the error is about the document as a whole.
    pub field: String,
    pub reason: String,
}

impl ConfigError {
    fn new(field: &str, reason: impl Into<String>) -> Self {
        ConfigError {
            field: field.to_string(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Reasons can quote the input (serde names an unknown key as
        // written), so control characters are escaped: one line, always.
        let (field, reason) = (one_line(&self.field), one_line(&self.reason));
        if field.is_empty() {
            write!(f, "invalid configuration: {reason}")
        } else {
            write!(f, "invalid configuration: field \"{field}\": {reason}")
        }
    }
}

fn one_line(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

impl std::error::Error for ConfigError {}

/// Step one: bytes to DTO. Empty or all-whitespace input gives the DTO's
/// default (every field unset). Before serde sees the document, it is read
/// as a JSON value and checked as a whole:
///
/// - the document, and the fields `objects` names (nested sections), must
///   be objects: serde would also read a struct from a JSON array;
/// - no value anywhere may be `null`. Absent means default; an explicit
///   `null` would otherwise reach serde as "absent" for every `Option`
///   field and be silently ignored, which the contract forbids. Checking
///   it here, once, spares every DTO field its own rule.
fn read_dto<T: DeserializeOwned + Default>(
    bytes: &[u8],
    objects: &[&str],
) -> Result<T, ConfigError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    let value: Value = match serde_json::from_slice(bytes) {
        Ok(value) => value,
        // Not JSON: the typed read says where and why (with the field's
        // path when it has one). It cannot accept what the untyped read
        // refused, but if it did, the document is still refused.
        Err(syntax) => {
            return Err(match read_typed::<T>(bytes) {
                Err(err) => err,
                Ok(_) => ConfigError::new("", syntax.to_string()),
            })
        }
    };
    let Some(map) = value.as_object() else {
        return Err(ConfigError::new(
            "",
            "the configuration must be a JSON object",
        ));
    };
    for field in objects {
        if map.get(*field).is_some_and(|v| !v.is_object()) {
            return Err(ConfigError::new(field, "must be a JSON object"));
        }
    }
    if let Some(path) = null_path(&value) {
        // The document is an object, so the path starts with ".key".
        let field = path.strip_prefix('.').unwrap_or(&path);
        let reason = if field.ends_with(']') {
            "invalid type: null"
        } else {
            "invalid type: null (leave the field out for its default)"
        };
        return Err(ConfigError::new(field, reason));
    }
    read_typed(bytes)
}

/// Where the first `null` in `value` is (in the map's key order), as a
/// path relative to `value` (`.paths.ready`, `.allowed_sources[1]`): the
/// form serde_path_to_error writes, so a field is named the same way
/// whichever check refused it. Depth is bounded by serde_json's recursion
/// limit, which the value was parsed under.
fn null_path(value: &Value) -> Option<String> {
    match value {
        Value::Null => Some(String::new()),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| Some(format!("[{i}]{}", null_path(item)?))),
        Value::Object(map) => map
            .iter()
            .find_map(|(key, item)| Some(format!(".{key}{}", null_path(item)?))),
        _ => None,
    }
}

/// Bytes to DTO with serde, naming the field of the first error.
fn read_typed<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ConfigError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let dto: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { String::new() } else { path };
        ConfigError {
            field,
            reason: e.into_inner().to_string(),
        }
    })?;
    de.end().map_err(|e| ConfigError::new("", e.to_string()))?;
    Ok(dto)
}

/// A header field where `""` turns the feature off: absent, the default.
fn optional_header_name(
    field: &str,
    value: Option<&str>,
    default: &str,
) -> Result<Option<String>, ConfigError> {
    match value {
        Some("") => Ok(None),
        other => header_name(field, other.unwrap_or(default)).map(Some),
    }
}

/// A header name as Envoy stores it (lower case). Refuses empty names,
/// pseudo-headers and characters outside the RFC 9110 token set.
fn header_name(field: &str, name: &str) -> Result<String, ConfigError> {
    if name.is_empty() {
        return Err(ConfigError::new(field, "header name is empty"));
    }
    if name.len() > 256 {
        return Err(ConfigError::new(field, "header name longer than 256 bytes"));
    }
    let is_tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if !name.bytes().all(is_tchar) {
        return Err(ConfigError::new(
            field,
            format!(
                "{name:?} is not a valid header name (letters, digits and !#$%&'*+-.^_`|~ only)"
            ),
        ));
    }
    Ok(name.to_ascii_lowercase())
}

fn duration(field: &str, text: Option<&str>, default: Duration) -> Result<Duration, ConfigError> {
    match text {
        None => Ok(default),
        Some(t) => parse_duration(t).map_err(|e| ConfigError::new(field, e.to_string())),
    }
}

fn cluster_name(field: &str, name: &str) -> Result<String, ConfigError> {
    if name.is_empty() {
        return Err(ConfigError::new(field, "cluster name is empty"));
    }
    if name.len() > 256 || name.chars().any(char::is_control) {
        return Err(ConfigError::new(field, "not a usable Envoy cluster name"));
    }
    Ok(name.to_string())
}

fn url_path(field: &str, path: &str) -> Result<String, ConfigError> {
    if !path.starts_with('/') {
        return Err(ConfigError::new(
            field,
            format!("path {path:?} must start with '/'"),
        ));
    }
    if path.len() > 256
        || path
            .bytes()
            .any(|b| b <= b' ' || b >= 0x7f || b == b'?' || b == b'#')
    {
        return Err(ConfigError::new(
            field,
            format!("path {path:?} must be printable ASCII without spaces, '?' or '#'"),
        ));
    }
    Ok(path.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        for (field, _) in crate::config::Paths::default().named() {
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
}
