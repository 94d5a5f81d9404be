//! `graceful_provider`'s configuration (the provider's inbound sidecar).

#[cfg(feature = "schema")]
use std::borrow::Cow;

#[cfg(feature = "schema")]
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::Deserialize;

#[cfg(feature = "schema")]
use crate::shared::config::{
    ascii_class, json_schema_of, url_path_pattern, HeaderName, OptionalHeaderName, ParserOnlyRule,
    DUPLICATE_KEYS, MAX_URL_PATH_BYTES,
};
use crate::shared::config::{header_name, optional_header_name, read_dto, url_path, ConfigError};

/// Defaults fixed by the public contract.
pub const DEFAULT_CLOSING_HEADER: &str = "x-graceful-closing";
pub use crate::shared::config::{DEFAULT_CONSUMER_HEADER, DEFAULT_INSTANCE_HEADER};
/// Most entries in `long_lived_paths`.
pub const MAX_LONG_LIVED_PATHS: usize = 32;

/// A path whose requests are long-lived streams: exact, or every path
/// under a prefix (written with a trailing `*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LongLivedPath {
    Exact(String),
    Prefix(String),
}

impl LongLivedPath {
    /// Whether `path` (query excluded) is this one.
    pub fn matches(&self, path: &[u8]) -> bool {
        match self {
            LongLivedPath::Exact(p) => p.as_bytes() == path,
            LongLivedPath::Prefix(p) => path.starts_with(p.as_bytes()),
        }
    }
}

/// Validated configuration of `graceful_provider`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderConfig {
    /// Lower-case header name set to `true` on responses while closing.
    pub closing_header: String,
    /// Lower-case header name carrying the instance id; None turns it off.
    pub instance_header: Option<String>,
    /// Fixed instance id; None derives one per Envoy process at VM start.
    pub instance_id: Option<String>,
    pub immediate_health_check_fail: bool,
    pub reject_when_drained: bool,
    /// Requests on these paths are long-lived streams: not in the in-flight
    /// count, ended when the gate passes.
    pub long_lived_paths: Vec<LongLivedPath>,
    /// Upgraded requests (WebSocket, over HTTP/1.1 or HTTP/2) are
    /// long-lived streams too.
    pub long_lived_upgrades: bool,
    /// Lower-case request header naming the caller (graceful_consumer's
    /// `consumer_header`), read for the drain report only once closing;
    /// None: callers are named by address only.
    pub consumer_header: Option<String>,
}

/// The configuration as written. Its doc comments and `schemars`
/// attributes are the JSON Schema's descriptions, defaults and forms
/// (schema/graceful_provider.schema.json, docs/configuration.md).
#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(
    feature = "schema",
    schemars(
        title = "graceful_provider",
        description = "The configuration of graceful_provider, on the inbound listener of a provider's sidecar: it counts the requests in flight, marks responses while the instance is closing and refuses new requests once the drain gate has passed. The header values it writes replace any the app sent."
    )
)]
struct ProviderDto {
    /// While the instance is closing, every response carries this header with value `true`. gRPC
    /// responses also carry it in their trailers (any response with trailers does), trailers-only
    /// responses in headers; a response that ends in its body without trailers (not valid gRPC)
    /// carries it in headers only, as the filter does not enter the VM for body chunks.
    #[cfg_attr(feature = "schema", schemars(with = "HeaderName", extend("default" = DEFAULT_CLOSING_HEADER)))]
    closing_header: Option<String>,
    /// Every response carries the instance id in this header; `""` turns it off. Must differ from
    /// `closing_header`.
    #[cfg_attr(feature = "schema", schemars(with = "OptionalHeaderName", extend("default" = DEFAULT_INSTANCE_HEADER)))]
    instance_header: Option<String>,
    /// Lets consumers tell a restarted instance on the same address from the old one. Unset: one
    /// random 16-hex-digit id per Envoy process, agreed by all VM copies through shared data; set
    /// it (e.g. to the pod UID) to make it stable and meaningful.
    #[cfg_attr(feature = "schema", schemars(with = "InstanceIdText", extend("x-default" = "derived at VM start, unique per Envoy process")))]
    instance_id: Option<String>,
    /// While closing, also add `x-envoy-immediate-health-check-fail: true` (for consumer clusters
    /// with active health checking).
    #[cfg_attr(feature = "schema", schemars(extend("default" = false)))]
    immediate_health_check_fail: Option<bool>,
    /// Once the drain gate has passed, new requests get a local 503 carrying the closing and
    /// instance headers (`grpc-status: 14` for gRPC requests), so the consumer retries elsewhere.
    #[cfg_attr(feature = "schema", schemars(extend("default" = true)))]
    reject_when_drained: Option<bool>,
    /// Requests on these paths are long-lived streams: admitted as any request, then out of the
    /// in-flight count, and ended once the gate passes. Exact paths, or a prefix written with a
    /// trailing `*` (`"/events/*"`: so no exact path ends in `*`); each starts with `/`; at most
    /// 32.
    #[cfg_attr(feature = "schema", schemars(with = "Vec<LongLivedPath>", length(max = MAX_LONG_LIVED_PATHS), extend("default" = [])))]
    long_lived_paths: Option<Vec<String>>,
    /// Upgraded requests (WebSocket over HTTP/1.1, and over HTTP/2, which Envoy shows filters as an
    /// upgrade) are long-lived streams too.
    #[cfg_attr(feature = "schema", schemars(extend("default" = true)))]
    long_lived_upgrades: Option<bool>,
    /// The request header naming the caller (graceful_consumer's `consumer_header`), read once
    /// closing for the drain report; `""`: callers are named by address only.
    #[cfg_attr(feature = "schema", schemars(with = "OptionalHeaderName", extend("default" = DEFAULT_CONSUMER_HEADER)))]
    consumer_header: Option<String>,
}

impl ProviderConfig {
    /// Parses and validates the plugin configuration bytes.
    pub fn from_json(bytes: &[u8]) -> Result<Self, ConfigError> {
        let dto: ProviderDto = read_dto(bytes, &[])?;
        let closing_header = header_name(
            "closing_header",
            dto.closing_header
                .as_deref()
                .unwrap_or(DEFAULT_CLOSING_HEADER),
        )?;
        let instance_header = optional_header_name(
            "instance_header",
            dto.instance_header.as_deref(),
            DEFAULT_INSTANCE_HEADER,
        )?;
        if instance_header.as_deref() == Some(closing_header.as_str()) {
            return Err(ConfigError::new(
                "instance_header",
                "must differ from closing_header",
            ));
        }
        let consumer_header = optional_header_name(
            "consumer_header",
            dto.consumer_header.as_deref(),
            DEFAULT_CONSUMER_HEADER,
        )?;
        let instance_id = match dto.instance_id {
            None => None,
            Some(id) => Some(instance_id("instance_id", &id)?),
        };
        let paths = dto.long_lived_paths.unwrap_or_default();
        if paths.len() > MAX_LONG_LIVED_PATHS {
            return Err(ConfigError::new(
                "long_lived_paths",
                format!("{} entries, at most {MAX_LONG_LIVED_PATHS}", paths.len()),
            ));
        }
        let long_lived_paths = paths
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let field = format!("long_lived_paths[{i}]");
                match p.strip_suffix('*') {
                    Some(prefix) => url_path(&field, prefix).map(LongLivedPath::Prefix),
                    None => url_path(&field, p).map(LongLivedPath::Exact),
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(ProviderConfig {
            closing_header,
            instance_header,
            instance_id,
            immediate_health_check_fail: dto.immediate_health_check_fail.unwrap_or(false),
            reject_when_drained: dto.reject_when_drained.unwrap_or(true),
            long_lived_paths,
            long_lived_upgrades: dto.long_lived_upgrades.unwrap_or(true),
            consumer_header,
        })
    }
}

/// Instance ids travel in a response header, so they must be a valid header
/// value; they are compared byte for byte by consumers.
fn instance_id(field: &str, id: &str) -> Result<String, ConfigError> {
    if id.is_empty() {
        return Err(ConfigError::new(field, "instance id is empty"));
    }
    if id.len() > MAX_INSTANCE_ID_BYTES || !id.bytes().all(is_instance_id_byte) {
        return Err(ConfigError::new(
            field,
            "instance id must be 1 to 128 printable ASCII characters without spaces",
        ));
    }
    Ok(id.to_string())
}

const MAX_INSTANCE_ID_BYTES: usize = 128;

/// Printable ASCII but space.
fn is_instance_id_byte(b: u8) -> bool {
    (0x21..0x7f).contains(&b)
}

/// [`instance_id`]'s form, for the schema.
#[cfg(feature = "schema")]
struct InstanceIdText;

#[cfg(feature = "schema")]
impl JsonSchema for InstanceIdText {
    fn schema_name() -> Cow<'static, str> {
        "instance_id".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": format!("^{}+$", ascii_class(is_instance_id_byte)),
            "maxLength": MAX_INSTANCE_ID_BYTES,
            "description": "An instance id: 1 to 128 printable ASCII characters, no spaces.",
        })
    }
}

/// A long-lived path as written: a path, or a prefix with a trailing `*`
/// (validated as a path once the `*` is taken off, so up to one more byte).
#[cfg(feature = "schema")]
impl JsonSchema for LongLivedPath {
    fn schema_name() -> Cow<'static, str> {
        "long_lived_path".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "anyOf": [
                {"pattern": url_path_pattern(""), "maxLength": MAX_URL_PATH_BYTES},
                {"pattern": url_path_pattern("\\*"), "maxLength": MAX_URL_PATH_BYTES + 1},
            ],
            "description": "A URL path as in url_path (that path exactly), or one followed by `*` (every path it prefixes).",
        })
    }
}

/// [`ProviderConfig::from_json`]'s rule across fields.
#[cfg(feature = "schema")]
const DISTINCT_HEADERS: ParserOnlyRule = ParserOnlyRule {
    name: "distinct_headers",
    rule: "`instance_header` must differ from `closing_header`, compared case-insensitively.",
};

impl ProviderConfig {
    /// The JSON Schema of graceful_provider's configuration.
    #[cfg(feature = "schema")]
    pub fn json_schema() -> serde_json::Value {
        json_schema_of::<ProviderDto>(&[DUPLICATE_KEYS, DISTINCT_HEADERS])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider_err(json: &str) -> ConfigError {
        ProviderConfig::from_json(json.as_bytes()).unwrap_err()
    }

    #[test]
    fn provider_defaults_when_configuration_is_empty() {
        for empty in ["", "  \n", "{}"] {
            let cfg = ProviderConfig::from_json(empty.as_bytes()).unwrap();
            assert_eq!(cfg.closing_header, "x-graceful-closing");
            assert_eq!(cfg.instance_header.as_deref(), Some("x-graceful-instance"));
            assert_eq!(cfg.instance_id, None);
            assert!(!cfg.immediate_health_check_fail);
            assert!(cfg.reject_when_drained);
            assert_eq!(cfg.long_lived_paths, Vec::new());
            assert!(cfg.long_lived_upgrades);
            assert_eq!(cfg.consumer_header.as_deref(), Some("x-graceful-consumer"));
        }
    }

    #[test]
    fn long_lived_paths_are_exact_or_prefixes_and_bad_ones_are_named() {
        let cfg = ProviderConfig::from_json(
            br#"{"long_lived_paths":["/events","/stream/*"],"long_lived_upgrades":false}"#,
        )
        .unwrap();
        assert_eq!(
            cfg.long_lived_paths,
            vec![
                LongLivedPath::Exact("/events".into()),
                LongLivedPath::Prefix("/stream/".into())
            ]
        );
        assert!(!cfg.long_lived_upgrades);
        let [exact, prefix] = [&cfg.long_lived_paths[0], &cfg.long_lived_paths[1]];
        assert!(exact.matches(b"/events") && !exact.matches(b"/events/1"));
        assert!(prefix.matches(b"/stream/1") && !prefix.matches(b"/streams"));
        for (json, field) in [
            (r#"{"long_lived_paths":["events"]}"#, "long_lived_paths[0]"),
            (
                r#"{"long_lived_paths":["/a","/b c"]}"#,
                "long_lived_paths[1]",
            ),
            (r#"{"long_lived_paths":"/a"}"#, "long_lived_paths"),
            (r#"{"long_lived_upgrades":"yes"}"#, "long_lived_upgrades"),
        ] {
            assert_eq!(provider_err(json).field, field, "{json}");
        }
        let many: Vec<String> = (0..=MAX_LONG_LIVED_PATHS)
            .map(|i| format!("\"/p{i}\""))
            .collect();
        let json = format!(r#"{{"long_lived_paths":[{}]}}"#, many.join(","));
        assert_eq!(provider_err(&json).field, "long_lived_paths");
    }

    #[test]
    fn provider_reads_every_field() {
        let cfg = ProviderConfig::from_json(
            br#"{"closing_header":"Closing","instance_header":"X-Pod","instance_id":"pod-7",
                "immediate_health_check_fail":true,"reject_when_drained":false,
                "consumer_header":"X-Caller"}"#,
        )
        .unwrap();
        assert_eq!(cfg.closing_header, "closing", "names are stored lower case");
        assert_eq!(cfg.instance_header.as_deref(), Some("x-pod"));
        assert_eq!(cfg.instance_id.as_deref(), Some("pod-7"));
        assert!(cfg.immediate_health_check_fail);
        assert!(!cfg.reject_when_drained);
        assert_eq!(cfg.consumer_header.as_deref(), Some("x-caller"));
    }

    #[test]
    fn provider_instance_header_empty_turns_it_off() {
        let cfg = ProviderConfig::from_json(br#"{"instance_header":""}"#).unwrap();
        assert_eq!(cfg.instance_header, None);
        let cfg = ProviderConfig::from_json(br#"{"consumer_header":""}"#).unwrap();
        assert_eq!(cfg.consumer_header, None);
        assert_eq!(
            provider_err(r#"{"consumer_header":"a:b"}"#).field,
            "consumer_header"
        );
    }

    #[test]
    fn provider_config_errors_name_the_field() {
        let cases = [
            (r#"{"closing_header":""}"#, "closing_header", "empty"),
            (
                r#"{"closing_header":"bad header"}"#,
                "closing_header",
                "not a valid header name",
            ),
            (
                r#"{"closing_header":":status"}"#,
                "closing_header",
                "not a valid header name",
            ),
            (r#"{"closing_header":7}"#, "closing_header", "invalid type"),
            (
                r#"{"instance_header":"x\ny"}"#,
                "instance_header",
                "not a valid header name",
            ),
            (
                r#"{"instance_header":"X-Graceful-Closing"}"#,
                "instance_header",
                "differ",
            ),
            (r#"{"instance_id":""}"#, "instance_id", "empty"),
            (r#"{"instance_id":"a b"}"#, "instance_id", "printable"),
            (
                r#"{"immediate_health_check_fail":"yes"}"#,
                "immediate_health_check_fail",
                "invalid type",
            ),
            (
                r#"{"reject_when_drained":1}"#,
                "reject_when_drained",
                "invalid type",
            ),
        ];
        for (json, field, reason) in cases {
            let err = provider_err(json);
            assert_eq!(err.field, field, "{json}: {err}");
            assert!(err.reason.contains(reason), "{json}: {err}");
            assert!(err.to_string().contains(&format!("\"{field}\"")), "{err}");
        }
    }

    #[test]
    fn provider_unknown_field_is_named() {
        let err = provider_err(r#"{"closing_headr":"x"}"#);
        assert_eq!(err.field, "closing_headr");
        assert!(
            err.to_string().contains("unknown field `closing_headr`"),
            "{err}"
        );
    }
}
