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
//!
//! With the `schema` feature (off in the filters' builds; `make schema`
//! turns it on), each DTO also derives its JSON Schema, and each shared
//! validator here has beside it the schema of what it accepts (a "kind":
//! [`HeaderName`], [`ClusterName`], [`UrlPath`], ...), so a rule and its
//! schema are written in one place and tested together (tools/check_schema.py).

use std::fmt;
use std::time::Duration;

#[cfg(feature = "schema")]
use std::borrow::Cow;

#[cfg(feature = "schema")]
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::shared::duration::parse_duration;
#[cfg(feature = "schema")]
use crate::shared::duration::{duration_pattern, zero_duration_pattern};

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

/// A rule the parser enforces that JSON Schema cannot state (a comparison
/// across fields, a sum, a byte count, the JSON text as written). Each is
/// listed by name in the schema (`x-parser-only-rules`) and so in
/// docs/configuration.md, and tools/check_schema.py holds a config for each
/// that the parser refuses and the schema accepts: the gaps are exactly these.
#[cfg(feature = "schema")]
#[derive(Debug, Clone, Copy)]
pub(crate) struct ParserOnlyRule {
    pub name: &'static str,
    pub rule: &'static str,
}

/// Every filter's: serde refuses a key given twice.
#[cfg(feature = "schema")]
pub(crate) const DUPLICATE_KEYS: ParserOnlyRule = ParserOnlyRule {
    name: "no_duplicate_keys",
    rule: "A key given twice in one object is refused. A JSON Schema validator sees the document once parsed, when one of the two is left.",
};

/// Where a config has counts: serde reads them from whole numbers only.
#[cfg(feature = "schema")]
pub(crate) const WHOLE_NUMBERS: ParserOnlyRule = ParserOnlyRule {
    name: "counts_written_whole",
    rule: "A count must be written as a whole number (`64`): `64.0` or `6.4e1` is refused, though JSON Schema counts it an integer.",
};

/// Where a config has durations: [`parse_duration`]'s bound.
#[cfg(feature = "schema")]
pub(crate) const DURATION_AT_MOST_24H: ParserOnlyRule = ParserOnlyRule {
    name: "duration_at_most_24h",
    rule: "A duration is at most 24h (`\"25h\"` and `\"23h61m\"` are refused): a pattern can check its form but not its sum.",
};

/// Where a config names clusters: [`cluster_name`]'s bound is in bytes.
#[cfg(feature = "schema")]
pub(crate) const CLUSTER_NAME_BYTES: ParserOnlyRule = ParserOnlyRule {
    name: "cluster_name_at_most_256_bytes",
    rule: "A cluster name is at most 256 bytes of UTF-8; the schema's `maxLength` counts characters, so a longer name of non-ASCII characters passes it.",
};

/// What makes a config schema: JSON Schema 2020-12, the value forms as
/// named definitions (`$defs`), the rules every DTO shares applied to the
/// whole (no `null` anywhere, see [`read_dto`]; descriptions written as
/// paragraphs, a doc comment's line breaks joined; no `format`, where
/// schemars names Rust's integer widths, which no validator knows), and the
/// parser's rules the schema cannot state, listed by name.
#[cfg(feature = "schema")]
pub(crate) fn json_schema_of<T: JsonSchema>(parser_only: &[ParserOnlyRule]) -> Value {
    let mut settings = schemars::generate::SchemaSettings::draft2020_12();
    settings
        .transforms
        .push(Box::new(schemars::transform::RecursiveTransform(
            no_null_no_format,
        )));
    let mut schema = settings.into_generator().into_root_schema_for::<T>();
    let rules: Vec<Value> = parser_only
        .iter()
        .map(|r| serde_json::json!({"name": r.name, "rule": r.rule}))
        .collect();
    schema.insert("x-parser-only-rules".into(), Value::Array(rules));
    schema.to_value()
}

#[cfg(feature = "schema")]
fn no_null_no_format(schema: &mut Schema) {
    let Some(object) = schema.as_object_mut() else {
        return;
    };
    // An `Option` field's schema allows null; read_dto refuses it.
    if let Some(Value::Array(types)) = object.get_mut("type") {
        types.retain(|t| t != "null");
        if let [only] = types.as_slice() {
            let only = only.clone();
            object.insert("type".into(), only);
        }
    }
    if let Some(Value::Array(branches)) = object.get_mut("anyOf") {
        branches.retain(|b| b.get("type").is_none_or(|t| t != "null"));
        if let [only] = branches.as_slice() {
            let Value::Object(only) = only.clone() else {
                return;
            };
            object.remove("anyOf");
            object.extend(only);
        }
    }
    // A DTO's own default is "unset" (None); a field's real default, where it
    // has one, is given with `extend("default" = ...)`.
    if object.get("default").is_some_and(Value::is_null) {
        object.remove("default");
    }
    object.remove("format");
    if let Some(Value::String(text)) = object.get_mut("description") {
        *text = text
            .split("\n\n")
            .map(|paragraph| paragraph.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect::<Vec<_>>()
            .join("\n\n");
    }
}

/// A JSON Schema character class (`[...]`) of the ASCII bytes `allowed`
/// accepts, written as ranges.
#[cfg(feature = "schema")]
pub(crate) fn ascii_class(allowed: impl Fn(u8) -> bool) -> String {
    let escaped = |b: u8| match b {
        b'\\' | b']' | b'[' | b'^' | b'-' => format!("\\{}", b as char),
        0x20..=0x7e => (b as char).to_string(),
        _ => format!("\\u{b:04x}"),
    };
    let mut class = String::from("[");
    let mut b = 0u8;
    while b < 0x80 {
        if !allowed(b) {
            b += 1;
            continue;
        }
        let start = b;
        while b < 0x7f && allowed(b + 1) {
            b += 1;
        }
        class.push_str(&escaped(start));
        if b > start {
            if b > start + 1 {
                class.push('-');
            }
            class.push_str(&escaped(b));
        }
        b += 1;
    }
    class.push(']');
    class
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
    if name.len() > MAX_HEADER_NAME_BYTES {
        return Err(ConfigError::new(field, "header name longer than 256 bytes"));
    }
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

const MAX_HEADER_NAME_BYTES: usize = 256;

/// A byte of an RFC 9110 token, what a header name is made of.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// [`header_name`]'s form, for the schema.
#[cfg(feature = "schema")]
pub(crate) struct HeaderName;

#[cfg(feature = "schema")]
impl JsonSchema for HeaderName {
    fn schema_name() -> Cow<'static, str> {
        "header_name".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": format!("^{}+$", ascii_class(is_tchar)),
            "maxLength": MAX_HEADER_NAME_BYTES,
            "description": "An HTTP header name (an RFC 9110 token): 1 to 256 letters, digits and the symbols `` !#$%&'*+-.^_`|~ ``, so no pseudo-header such as `:status`. Matched case-insensitively and stored lower case.",
        })
    }
}

/// [`optional_header_name`]'s form, for the schema.
#[cfg(feature = "schema")]
pub(crate) struct OptionalHeaderName;

#[cfg(feature = "schema")]
impl JsonSchema for OptionalHeaderName {
    fn schema_name() -> Cow<'static, str> {
        "optional_header_name".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": format!("^{}*$", ascii_class(is_tchar)),
            "maxLength": MAX_HEADER_NAME_BYTES,
            "description": "A header name as in header_name, or `\"\"` to turn the feature off.",
        })
    }
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

/// [`duration`]'s form, for the schema.
#[cfg(feature = "schema")]
pub(crate) struct DurationText;

#[cfg(feature = "schema")]
impl JsonSchema for DurationText {
    fn schema_name() -> Cow<'static, str> {
        "duration".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": duration_pattern(),
            "description": DURATION_FORM,
        })
    }
}

#[cfg(feature = "schema")]
const DURATION_FORM: &str = "A duration: a string of numbers, each with a unit (`ms`, `s`, `m` or `h`), summed: `\"250ms\"`, `\"3s\"`, `\"1m30s\"`, `\"1.5s\"`. No sign, no spaces; a fraction's digits past the microsecond are dropped; at most 24h. `\"0s\"` is allowed where zero makes sense.";

/// A duration that must be above 0s (a TTL, a timeout, the longest
/// request: "0s" would say nothing), for the schema.
#[cfg(feature = "schema")]
pub(crate) struct PositiveDurationText;

#[cfg(feature = "schema")]
impl JsonSchema for PositiveDurationText {
    fn schema_name() -> Cow<'static, str> {
        "positive_duration".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": duration_pattern(),
            "not": {"pattern": zero_duration_pattern()},
            "description": format!("{DURATION_FORM} Here it must be above 0s."),
        })
    }
}

pub(crate) fn cluster_name(field: &str, name: &str) -> Result<String, ConfigError> {
    if name.is_empty() {
        return Err(ConfigError::new(field, "cluster name is empty"));
    }
    if name.len() > MAX_CLUSTER_NAME_BYTES || name.chars().any(char::is_control) {
        return Err(ConfigError::new(field, "not a usable Envoy cluster name"));
    }
    Ok(name.to_string())
}

const MAX_CLUSTER_NAME_BYTES: usize = 256;

/// [`cluster_name`]'s form, for the schema. Its bound is in bytes, which
/// `maxLength` (characters) weighs only for ASCII names.
#[cfg(feature = "schema")]
pub(crate) struct ClusterName;

#[cfg(feature = "schema")]
impl JsonSchema for ClusterName {
    fn schema_name() -> Cow<'static, str> {
        "cluster_name".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            // char::is_control is Unicode's Cc: U+0000-U+001F, U+007F-U+009F.
            "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]+$",
            "maxLength": MAX_CLUSTER_NAME_BYTES,
            "description": "The name of a cluster in the Envoy configuration: 1 to 256 bytes, no control characters.",
        })
    }
}

pub(crate) fn url_path(field: &str, path: &str) -> Result<String, ConfigError> {
    if !path.starts_with('/') {
        return Err(ConfigError::new(
            field,
            format!("path {path:?} must start with '/'"),
        ));
    }
    if path.len() > MAX_URL_PATH_BYTES || !path.bytes().all(is_path_byte) {
        return Err(ConfigError::new(
            field,
            format!("path {path:?} must be printable ASCII without spaces, '?' or '#'"),
        ));
    }
    Ok(path.to_string())
}

pub(crate) const MAX_URL_PATH_BYTES: usize = 256;

/// Printable ASCII but space, and no query or fragment.
fn is_path_byte(b: u8) -> bool {
    b > b' ' && b < 0x7f && b != b'?' && b != b'#'
}

/// The JSON Schema pattern of [`url_path`]; `tail` follows the path (a
/// long-lived path's optional `*`).
#[cfg(feature = "schema")]
pub(crate) fn url_path_pattern(tail: &str) -> String {
    format!("^/{}*{tail}$", ascii_class(is_path_byte))
}

/// [`url_path`]'s form, for the schema.
#[cfg(feature = "schema")]
pub(crate) struct UrlPath;

#[cfg(feature = "schema")]
impl JsonSchema for UrlPath {
    fn schema_name() -> Cow<'static, str> {
        "url_path".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": url_path_pattern(""),
            "maxLength": MAX_URL_PATH_BYTES,
            "description": URL_PATH_FORM,
        })
    }
}

#[cfg(feature = "schema")]
const URL_PATH_FORM: &str = "A URL path: starts with `/`; at most 256 printable ASCII characters, no spaces, no `?` or `#`.";

/// A path field where `""` turns the feature off, for the schema.
#[cfg(feature = "schema")]
pub(crate) struct OptionalUrlPath;

#[cfg(feature = "schema")]
impl JsonSchema for OptionalUrlPath {
    fn schema_name() -> Cow<'static, str> {
        "optional_url_path".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "anyOf": [
                {"const": ""},
                {"pattern": url_path_pattern(""), "maxLength": MAX_URL_PATH_BYTES},
            ],
            "description": format!("{URL_PATH_FORM} Or `\"\"` to turn the feature off."),
        })
    }
}
