//! Plugin configuration: JSON in two steps. First serde reads it into DTOs
//! that deny unknown fields (a typo must not silently fall back to a default);
//! then validation turns each DTO into the typed config the filters run on,
//! naming the field on every error. Empty configuration means all defaults.
//!
//! One file per filter (`provider.rs`, `drain.rs`, `consumer.rs`: its DTO, its
//! defaults, its validation); this one holds what they share: the error
//! type, reading bytes into a DTO, and the validators for header names,
//! durations, cluster names and URL paths. Every public item is re-exported
//! here, so users name `graceful_core::drain::config::DrainConfig` and never the
//! file it lives in.

use std::fmt;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::shared::duration::parse_duration;

/// Default name of the header carrying an instance id (graceful_provider
/// writes it, graceful_consumer reads it).
pub const DEFAULT_INSTANCE_HEADER: &str = "x-graceful-instance";

/// Default name of the header carrying a consumer's identity
/// (graceful_consumer writes it, graceful_provider reads it).
pub const DEFAULT_CONSUMER_HEADER: &str = "x-graceful-consumer";

/// A refused configuration: which field, and why. Displayed as one log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted path of the field (`paths.drained`, `allowed_sources[1]`);
    /// empty when the error is about the document as a whole.
    pub field: String,
    pub reason: String,
}

impl ConfigError {
    pub(crate) fn new(field: &str, reason: impl Into<String>) -> Self {
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
pub(crate) fn read_dto<T: DeserializeOwned + Default>(
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
pub(crate) fn optional_header_name(
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
pub(crate) fn header_name(field: &str, name: &str) -> Result<String, ConfigError> {
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

pub(crate) fn duration(
    field: &str,
    text: Option<&str>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    match text {
        None => Ok(default),
        Some(t) => parse_duration(t).map_err(|e| ConfigError::new(field, e.to_string())),
    }
}

pub(crate) fn cluster_name(field: &str, name: &str) -> Result<String, ConfigError> {
    if name.is_empty() {
        return Err(ConfigError::new(field, "cluster name is empty"));
    }
    if name.len() > 256 || name.chars().any(char::is_control) {
        return Err(ConfigError::new(field, "not a usable Envoy cluster name"));
    }
    Ok(name.to_string())
}

pub(crate) fn url_path(field: &str, path: &str) -> Result<String, ConfigError> {
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
