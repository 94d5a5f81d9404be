//! Plugin configuration: JSON in two steps. First serde reads it into DTOs
//! that deny unknown fields (a typo must not silently fall back to a default);
//! then validation turns each DTO into the typed config the filters run on,
//! naming the field on every error. Empty configuration means all defaults.

use std::fmt;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::duration::parse_duration;
use crate::net::Cidr;
use crate::record::GateTimings;

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

/// For optional DTO fields: absent means default, but an explicit `null` is
/// a wrong type like any other (nothing is silently ignored).
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// Step one: bytes to DTO. Empty or all-whitespace input gives the DTO's
/// default (every field unset). `objects` names the fields that hold
/// nested sections: serde would also read a struct from a JSON array, so
/// the document and those sections are checked to be objects first.
fn read_dto<T: DeserializeOwned + Default>(
    bytes: &[u8],
    objects: &[&str],
) -> Result<T, ConfigError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) {
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
    }
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

// ---------------------------------------------------------------------------
// graceful_provider

/// Defaults fixed by the public contract.
pub const DEFAULT_CLOSING_HEADER: &str = "x-graceful-closing";
pub const DEFAULT_INSTANCE_HEADER: &str = "x-graceful-instance";

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
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ProviderDto {
    #[serde(default, deserialize_with = "present")]
    closing_header: Option<String>,
    #[serde(default, deserialize_with = "present")]
    instance_header: Option<String>,
    #[serde(default, deserialize_with = "present")]
    instance_id: Option<String>,
    #[serde(default, deserialize_with = "present")]
    immediate_health_check_fail: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    reject_when_drained: Option<bool>,
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
        let instance_header = match dto.instance_header.as_deref() {
            Some("") => None,
            other => Some(header_name(
                "instance_header",
                other.unwrap_or(DEFAULT_INSTANCE_HEADER),
            )?),
        };
        if instance_header.as_deref() == Some(closing_header.as_str()) {
            return Err(ConfigError::new(
                "instance_header",
                "must differ from closing_header",
            ));
        }
        let instance_id = match dto.instance_id {
            None => None,
            Some(id) => Some(instance_id("instance_id", &id)?),
        };
        Ok(ProviderConfig {
            closing_header,
            instance_header,
            instance_id,
            immediate_health_check_fail: dto.immediate_health_check_fail.unwrap_or(false),
            reject_when_drained: dto.reject_when_drained.unwrap_or(true),
        })
    }
}

/// Instance ids travel in a response header, so they must be a valid header
/// value; they are compared byte for byte by consumers.
fn instance_id(field: &str, id: &str) -> Result<String, ConfigError> {
    if id.is_empty() {
        return Err(ConfigError::new(field, "instance id is empty"));
    }
    if id.len() > 128 || !id.bytes().all(|b| (0x21..0x7f).contains(&b)) {
        return Err(ConfigError::new(
            field,
            "instance id must be 1 to 128 printable ASCII characters without spaces",
        ));
    }
    Ok(id.to_string())
}

// ---------------------------------------------------------------------------
// graceful_drain

pub const DEFAULT_CONSUMER_UPDATE_WAIT: Duration = Duration::from_secs(3);
pub const DEFAULT_QUIET_WINDOW: Duration = Duration::from_millis(500);
pub const DEFAULT_STEP_TIMEOUT: Duration = Duration::from_secs(3);
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
pub const DEFAULT_ALLOWED_SOURCES: [&str; 2] = ["127.0.0.0/8", "::1/128"];
pub const DEFAULT_MAX_WAITERS: u32 = 64;
/// Upper bound for `max_waiters`: each waiter is a held downstream stream.
pub const MAX_MAX_WAITERS: u64 = 10_000;
pub const DEFAULT_ON_DRAINED_PATH: &str = "/shutdown";
pub const DEFAULT_ON_DRAINED_TIMEOUT: Duration = Duration::from_secs(2);
/// Upper bound for `on_drained.timeout`.
pub const MAX_ON_DRAINED_TIMEOUT: Duration = Duration::from_secs(60);

/// The endpoints' paths (`paths` field).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    pub closing: String,
    pub ready: String,
    pub status: String,
    pub drained: String,
    pub grpc_health: String,
}

impl Default for Paths {
    fn default() -> Self {
        Paths {
            closing: "/graceful/closing".into(),
            ready: "/graceful/ready".into(),
            status: "/graceful/status".into(),
            drained: "/graceful/drained".into(),
            grpc_health: "/grpc.health.v1.Health/Check".into(),
        }
    }
}

/// `on_drained`: the app's shutdown hook, POSTed once when the gate passes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OnDrained {
    pub cluster: String,
    pub path: String,
    pub timeout: Duration,
}

/// Validated configuration of `graceful_drain`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainConfig {
    pub gate: GateTimings,
    pub allowed_sources: Vec<Cidr>,
    pub admin_cluster: Option<String>,
    pub on_drained: Option<OnDrained>,
    pub max_waiters: u32,
    pub paths: Paths,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct DrainDto {
    #[serde(default, deserialize_with = "present")]
    consumer_update_wait: Option<String>,
    #[serde(default, deserialize_with = "present")]
    quiet_window: Option<String>,
    #[serde(default, deserialize_with = "present")]
    step_timeout: Option<String>,
    #[serde(default, deserialize_with = "present")]
    timeout: Option<String>,
    #[serde(default, deserialize_with = "present")]
    allowed_sources: Option<Vec<String>>,
    #[serde(default, deserialize_with = "present")]
    admin_cluster: Option<String>,
    #[serde(default, deserialize_with = "present")]
    on_drained: Option<OnDrainedDto>,
    #[serde(default, deserialize_with = "present")]
    max_waiters: Option<u64>,
    #[serde(default, deserialize_with = "present")]
    paths: Option<PathsDto>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OnDrainedDto {
    cluster: String,
    #[serde(default, deserialize_with = "present")]
    path: Option<String>,
    #[serde(default, deserialize_with = "present")]
    timeout: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct PathsDto {
    #[serde(default, deserialize_with = "present")]
    closing: Option<String>,
    #[serde(default, deserialize_with = "present")]
    ready: Option<String>,
    #[serde(default, deserialize_with = "present")]
    status: Option<String>,
    #[serde(default, deserialize_with = "present")]
    drained: Option<String>,
    #[serde(default, deserialize_with = "present")]
    grpc_health: Option<String>,
}

impl DrainConfig {
    /// Parses and validates the plugin configuration bytes.
    pub fn from_json(bytes: &[u8]) -> Result<Self, ConfigError> {
        let dto: DrainDto = read_dto(bytes, &["paths", "on_drained"])?;
        let gate = GateTimings {
            consumer_update_wait: duration(
                "consumer_update_wait",
                dto.consumer_update_wait.as_deref(),
                DEFAULT_CONSUMER_UPDATE_WAIT,
            )?,
            quiet_window: duration(
                "quiet_window",
                dto.quiet_window.as_deref(),
                DEFAULT_QUIET_WINDOW,
            )?,
            step_timeout: duration(
                "step_timeout",
                dto.step_timeout.as_deref(),
                DEFAULT_STEP_TIMEOUT,
            )?,
            timeout: duration("timeout", dto.timeout.as_deref(), DEFAULT_TIMEOUT)?,
        };
        if gate.timeout < gate.consumer_update_wait {
            return Err(ConfigError::new(
                "timeout",
                "must be at least consumer_update_wait: consumers need that long to learn of the closing",
            ));
        }
        let allowed_sources = match dto.allowed_sources {
            None => DEFAULT_ALLOWED_SOURCES
                .iter()
                .filter_map(|s| s.parse().ok())
                .collect(),
            Some(list) => list
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    s.parse::<Cidr>().map_err(|e| {
                        ConfigError::new(&format!("allowed_sources[{i}]"), e.to_string())
                    })
                })
                .collect::<Result<_, _>>()?,
        };
        let admin_cluster = match dto.admin_cluster {
            None => None,
            Some(name) => Some(cluster_name("admin_cluster", &name)?),
        };
        let on_drained = match dto.on_drained {
            None => None,
            Some(cb) => {
                let timeout = duration(
                    "on_drained.timeout",
                    cb.timeout.as_deref(),
                    DEFAULT_ON_DRAINED_TIMEOUT,
                )?;
                if timeout.is_zero() || timeout > MAX_ON_DRAINED_TIMEOUT {
                    return Err(ConfigError::new(
                        "on_drained.timeout",
                        "must be above 0s and at most 60s",
                    ));
                }
                Some(OnDrained {
                    cluster: cluster_name("on_drained.cluster", &cb.cluster)?,
                    path: url_path(
                        "on_drained.path",
                        cb.path.as_deref().unwrap_or(DEFAULT_ON_DRAINED_PATH),
                    )?,
                    timeout,
                })
            }
        };
        let max_waiters = match dto.max_waiters {
            None => DEFAULT_MAX_WAITERS,
            Some(n) if n <= MAX_MAX_WAITERS => n as u32,
            Some(n) => {
                return Err(ConfigError::new(
                    "max_waiters",
                    format!("{n} is out of range 0..={MAX_MAX_WAITERS}"),
                ))
            }
        };
        Ok(DrainConfig {
            gate,
            allowed_sources,
            admin_cluster,
            on_drained,
            max_waiters,
            paths: paths(dto.paths.unwrap_or_default())?,
        })
    }
}

fn paths(dto: PathsDto) -> Result<Paths, ConfigError> {
    let defaults = Paths::default();
    let pick = |field: &str, value: Option<String>, default: String| match value {
        None => Ok(default),
        Some(p) => url_path(field, &p),
    };
    let paths = Paths {
        closing: pick("paths.closing", dto.closing, defaults.closing)?,
        ready: pick("paths.ready", dto.ready, defaults.ready)?,
        status: pick("paths.status", dto.status, defaults.status)?,
        drained: pick("paths.drained", dto.drained, defaults.drained)?,
        grpc_health: pick("paths.grpc_health", dto.grpc_health, defaults.grpc_health)?,
    };
    let named = [
        ("paths.closing", &paths.closing),
        ("paths.ready", &paths.ready),
        ("paths.status", &paths.status),
        ("paths.drained", &paths.drained),
        ("paths.grpc_health", &paths.grpc_health),
    ];
    for (i, (field, path)) in named.iter().enumerate() {
        if let Some((other, _)) = named.iter().take(i).find(|(_, p)| p == path) {
            return Err(ConfigError::new(
                field,
                format!("{path:?} is already used by {other}"),
            ));
        }
    }
    Ok(paths)
}

// ---------------------------------------------------------------------------
// graceful_consumer

pub const DEFAULT_CLOSING_HEADERS: [&str; 2] = ["x-graceful-closing", "closing"];
pub const DEFAULT_TOMBSTONE_TTL: Duration = Duration::from_secs(30);
pub const DEFAULT_FAILURE_TOMBSTONE_TTL: Duration = Duration::from_secs(5);
pub const DEFAULT_OVERRIDE_HOST_HEADER: &str = "x-graceful-override-host";
pub const DEFAULT_MEMBERSHIP_REFRESH: Duration = Duration::from_secs(1);
pub const DEFAULT_MAX_TOMBSTONES: u32 = 1024;
pub const MAX_MAX_TOMBSTONES: u64 = 65_536;
pub const DEFAULT_PROBE_PATH: &str = "/graceful/ready";

/// Validated configuration of `graceful_consumer`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerConfig {
    /// Lower-case names; a response header or trailer with one of them and
    /// value `true` marks the upstream host closing.
    pub closing_headers: Vec<String>,
    /// Lower-case name of the instance id header; None turns readmission by
    /// instance id off.
    pub instance_header: Option<String>,
    pub tombstone_ttl: Duration,
    pub evict_on_connect_failure: bool,
    pub failure_tombstone_ttl: Duration,
    /// Lower-case request header the `override_host` LB policy reads.
    pub override_host_header: String,
    pub admin_cluster: Option<String>,
    pub membership_refresh: Duration,
    pub max_tombstones: u32,
    /// Path asked of a tombstoned host to learn whether a new instance
    /// answers at its address (graceful_drain's readiness endpoint); None
    /// turns probing off.
    pub probe_path: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ConsumerDto {
    #[serde(default, deserialize_with = "present")]
    closing_headers: Option<Vec<String>>,
    #[serde(default, deserialize_with = "present")]
    instance_header: Option<String>,
    #[serde(default, deserialize_with = "present")]
    tombstone_ttl: Option<String>,
    #[serde(default, deserialize_with = "present")]
    evict_on_connect_failure: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    failure_tombstone_ttl: Option<String>,
    #[serde(default, deserialize_with = "present")]
    override_host_header: Option<String>,
    #[serde(default, deserialize_with = "present")]
    admin_cluster: Option<String>,
    #[serde(default, deserialize_with = "present")]
    membership_refresh: Option<String>,
    #[serde(default, deserialize_with = "present")]
    max_tombstones: Option<u64>,
    #[serde(default, deserialize_with = "present")]
    probe_path: Option<String>,
}

fn positive(field: &str, d: Duration) -> Result<Duration, ConfigError> {
    if d.is_zero() {
        return Err(ConfigError::new(field, "must be above 0s"));
    }
    Ok(d)
}

impl ConsumerConfig {
    /// Parses and validates the plugin configuration bytes.
    pub fn from_json(bytes: &[u8]) -> Result<Self, ConfigError> {
        let dto: ConsumerDto = read_dto(bytes, &[])?;
        let mut closing_headers: Vec<String> = Vec::new();
        match dto.closing_headers {
            None => closing_headers.extend(DEFAULT_CLOSING_HEADERS.iter().map(|s| s.to_string())),
            Some(list) => {
                for (i, name) in list.iter().enumerate() {
                    let name = header_name(&format!("closing_headers[{i}]"), name)?;
                    if !closing_headers.contains(&name) {
                        closing_headers.push(name);
                    }
                }
            }
        }
        let instance_header = match dto.instance_header.as_deref() {
            Some("") => None,
            other => Some(header_name(
                "instance_header",
                other.unwrap_or(DEFAULT_INSTANCE_HEADER),
            )?),
        };
        let override_host_header = header_name(
            "override_host_header",
            dto.override_host_header
                .as_deref()
                .unwrap_or(DEFAULT_OVERRIDE_HOST_HEADER),
        )?;
        if closing_headers.contains(&override_host_header)
            || instance_header.as_ref() == Some(&override_host_header)
        {
            return Err(ConfigError::new(
                "override_host_header",
                "must differ from closing_headers and instance_header",
            ));
        }
        let tombstone_ttl = positive(
            "tombstone_ttl",
            duration(
                "tombstone_ttl",
                dto.tombstone_ttl.as_deref(),
                DEFAULT_TOMBSTONE_TTL,
            )?,
        )?;
        let failure_tombstone_ttl = positive(
            "failure_tombstone_ttl",
            duration(
                "failure_tombstone_ttl",
                dto.failure_tombstone_ttl.as_deref(),
                DEFAULT_FAILURE_TOMBSTONE_TTL,
            )?,
        )?;
        let membership_refresh = duration(
            "membership_refresh",
            dto.membership_refresh.as_deref(),
            DEFAULT_MEMBERSHIP_REFRESH,
        )?;
        if membership_refresh < Duration::from_millis(100)
            || membership_refresh > Duration::from_secs(3600)
        {
            return Err(ConfigError::new(
                "membership_refresh",
                "must be between 100ms and 1h",
            ));
        }
        let max_tombstones = match dto.max_tombstones {
            None => DEFAULT_MAX_TOMBSTONES,
            Some(n) if (1..=MAX_MAX_TOMBSTONES).contains(&n) => n as u32,
            Some(n) => {
                return Err(ConfigError::new(
                    "max_tombstones",
                    format!("{n} is out of range 1..={MAX_MAX_TOMBSTONES}"),
                ))
            }
        };
        let admin_cluster = match dto.admin_cluster {
            None => None,
            Some(name) => Some(cluster_name("admin_cluster", &name)?),
        };
        let probe_path = match dto.probe_path.as_deref() {
            Some("") => None,
            other => Some(url_path("probe_path", other.unwrap_or(DEFAULT_PROBE_PATH))?),
        };
        Ok(ConsumerConfig {
            closing_headers,
            instance_header,
            tombstone_ttl,
            evict_on_connect_failure: dto.evict_on_connect_failure.unwrap_or(true),
            failure_tombstone_ttl,
            override_host_header,
            admin_cluster,
            membership_refresh,
            max_tombstones,
            probe_path,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn provider_err(json: &str) -> ConfigError {
        ProviderConfig::from_json(json.as_bytes()).unwrap_err()
    }

    fn drain_err(json: &str) -> ConfigError {
        DrainConfig::from_json(json.as_bytes()).unwrap_err()
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
        }
    }

    #[test]
    fn provider_reads_every_field() {
        let cfg = ProviderConfig::from_json(
            br#"{"closing_header":"Closing","instance_header":"X-Pod","instance_id":"pod-7",
                "immediate_health_check_fail":true,"reject_when_drained":false}"#,
        )
        .unwrap();
        assert_eq!(cfg.closing_header, "closing", "names are stored lower case");
        assert_eq!(cfg.instance_header.as_deref(), Some("x-pod"));
        assert_eq!(cfg.instance_id.as_deref(), Some("pod-7"));
        assert!(cfg.immediate_health_check_fail);
        assert!(!cfg.reject_when_drained);
    }

    #[test]
    fn provider_instance_header_empty_turns_it_off() {
        let cfg = ProviderConfig::from_json(br#"{"instance_header":""}"#).unwrap();
        assert_eq!(cfg.instance_header, None);
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
    fn provider_unknown_field_is_named() {
        let err = provider_err(r#"{"closing_headr":"x"}"#);
        assert_eq!(err.field, "closing_headr");
        assert!(
            err.to_string().contains("unknown field `closing_headr`"),
            "{err}"
        );
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
    fn drain_defaults_match_the_contract() {
        let cfg = DrainConfig::from_json(b"").unwrap();
        assert_eq!(cfg.gate.consumer_update_wait, Duration::from_secs(3));
        assert_eq!(cfg.gate.quiet_window, Duration::from_millis(500));
        assert_eq!(cfg.gate.step_timeout, Duration::from_secs(3));
        assert_eq!(cfg.gate.timeout, Duration::from_secs(60));
        let sources: Vec<String> = cfg
            .allowed_sources
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(sources, ["127.0.0.0/8", "::1/128"]);
        assert_eq!(cfg.admin_cluster, None);
        assert_eq!(cfg.on_drained, None);
        assert_eq!(cfg.max_waiters, 64);
        assert_eq!(cfg.paths, Paths::default());
        assert_eq!(cfg.paths.drained, "/graceful/drained");
        assert_eq!(cfg.paths.grpc_health, "/grpc.health.v1.Health/Check");
    }

    #[test]
    fn drain_reads_every_field() {
        let cfg = DrainConfig::from_json(
            br#"{"consumer_update_wait":"1s","quiet_window":"250ms","step_timeout":"2s","timeout":"10s",
                "allowed_sources":["10.0.0.0/8"],"admin_cluster":"envoy_admin",
                "on_drained":{"cluster":"app","path":"/bye","timeout":"1s"},"max_waiters":3,
                "paths":{"closing":"/c","ready":"/r","status":"/s","drained":"/d","grpc_health":"/g"}}"#,
        )
        .unwrap();
        assert_eq!(cfg.gate.consumer_update_wait, Duration::from_secs(1));
        assert_eq!(cfg.gate.quiet_window, Duration::from_millis(250));
        assert_eq!(cfg.gate.step_timeout, Duration::from_secs(2));
        assert_eq!(cfg.gate.timeout, Duration::from_secs(10));
        assert_eq!(cfg.allowed_sources.len(), 1);
        assert_eq!(cfg.admin_cluster.as_deref(), Some("envoy_admin"));
        assert_eq!(
            cfg.on_drained,
            Some(OnDrained {
                cluster: "app".into(),
                path: "/bye".into(),
                timeout: Duration::from_secs(1)
            })
        );
        assert_eq!(cfg.max_waiters, 3);
        assert_eq!(cfg.paths.closing, "/c");
        assert_eq!(cfg.paths.grpc_health, "/g");
    }

    #[test]
    fn drain_on_drained_defaults_path_and_timeout() {
        let cfg = DrainConfig::from_json(br#"{"on_drained":{"cluster":"app"}}"#).unwrap();
        let cb = cfg.on_drained.unwrap();
        assert_eq!(cb.path, "/shutdown");
        assert_eq!(cb.timeout, Duration::from_secs(2));
    }

    #[test]
    fn drain_allows_zero_where_zero_makes_sense() {
        let cfg = DrainConfig::from_json(
            br#"{"consumer_update_wait":"0s","quiet_window":"0s","step_timeout":"0s","timeout":"0s",
                "allowed_sources":[],"max_waiters":0}"#,
        )
        .unwrap();
        assert_eq!(cfg.gate.timeout, Duration::ZERO);
        assert!(cfg.allowed_sources.is_empty());
        assert_eq!(cfg.max_waiters, 0);
    }

    #[test]
    fn drain_config_errors_name_the_field() {
        let cases = [
            (
                r#"{"consumer_update_wait":"3"}"#,
                "consumer_update_wait",
                "missing unit",
            ),
            (
                r#"{"quiet_window":"-1s"}"#,
                "quiet_window",
                "invalid duration",
            ),
            (r#"{"step_timeout":"1d"}"#, "step_timeout", "unknown unit"),
            (r#"{"timeout":"25h"}"#, "timeout", "longer than 24h"),
            (r#"{"timeout":60}"#, "timeout", "invalid type"),
            (
                r#"{"consumer_update_wait":"5s","timeout":"4s"}"#,
                "timeout",
                "at least consumer_update_wait",
            ),
            (
                r#"{"allowed_sources":["127.0.0.0/8","10.0.0.0/33"]}"#,
                "allowed_sources[1]",
                "prefix",
            ),
            (
                r#"{"allowed_sources":"127.0.0.1"}"#,
                "allowed_sources",
                "invalid type",
            ),
            (
                r#"{"allowed_sources":[1]}"#,
                "allowed_sources[0]",
                "invalid type",
            ),
            (r#"{"admin_cluster":""}"#, "admin_cluster", "empty"),
            (
                r#"{"on_drained":{"path":"/x"}}"#,
                "on_drained",
                "missing field `cluster`",
            ),
            (
                r#"{"on_drained":{"cluster":"app","path":"x"}}"#,
                "on_drained.path",
                "start with '/'",
            ),
            (
                r#"{"on_drained":{"cluster":"app","timeout":"0s"}}"#,
                "on_drained.timeout",
                "above 0s",
            ),
            (
                r#"{"on_drained":{"cluster":"app","extra":1}}"#,
                "on_drained.extra",
                "unknown field `extra`",
            ),
            (r#"{"max_waiters":-1}"#, "max_waiters", "invalid value"),
            (r#"{"max_waiters":10001}"#, "max_waiters", "out of range"),
            (r#"{"max_waiters":1.5}"#, "max_waiters", "invalid type"),
            (
                r#"{"paths":{"ready":"graceful/ready"}}"#,
                "paths.ready",
                "start with '/'",
            ),
            (r#"{"paths":{"status":"/s?x=1"}}"#, "paths.status", "'?'"),
            (
                r#"{"paths":{"status":"/graceful/ready"}}"#,
                "paths.status",
                "already used by paths.ready",
            ),
            (
                r#"{"paths":{"closng":"/c"}}"#,
                "paths.closng",
                "unknown field `closng`",
            ),
        ];
        for (json, field, reason) in cases {
            let err = drain_err(json);
            assert_eq!(err.field, field, "{json}: {err}");
            assert!(err.reason.contains(reason), "{json}: {err}");
        }
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

    #[test]
    fn consumer_defaults_match_the_contract() {
        let cfg = ConsumerConfig::from_json(b"").unwrap();
        assert_eq!(cfg.closing_headers, ["x-graceful-closing", "closing"]);
        assert_eq!(cfg.instance_header.as_deref(), Some("x-graceful-instance"));
        assert_eq!(cfg.tombstone_ttl, Duration::from_secs(30));
        assert!(cfg.evict_on_connect_failure);
        assert_eq!(cfg.failure_tombstone_ttl, Duration::from_secs(5));
        assert_eq!(cfg.override_host_header, "x-graceful-override-host");
        assert_eq!(cfg.admin_cluster, None);
        assert_eq!(cfg.membership_refresh, Duration::from_secs(1));
        assert_eq!(cfg.max_tombstones, 1024);
        assert_eq!(cfg.probe_path.as_deref(), Some("/graceful/ready"));
    }

    #[test]
    fn consumer_reads_every_field() {
        let cfg = ConsumerConfig::from_json(
            br#"{"closing_headers":["Closing","X-Shutdown","closing"],"instance_header":"","tombstone_ttl":"10s",
                "evict_on_connect_failure":false,"failure_tombstone_ttl":"2s","override_host_header":"X-Pin",
                "admin_cluster":"admin","membership_refresh":"500ms","max_tombstones":8,"probe_path":""}"#,
        )
        .unwrap();
        assert_eq!(
            cfg.closing_headers,
            ["closing", "x-shutdown"],
            "lower-cased, duplicates dropped"
        );
        assert_eq!(cfg.instance_header, None);
        assert_eq!(cfg.tombstone_ttl, Duration::from_secs(10));
        assert!(!cfg.evict_on_connect_failure);
        assert_eq!(cfg.failure_tombstone_ttl, Duration::from_secs(2));
        assert_eq!(cfg.override_host_header, "x-pin");
        assert_eq!(cfg.admin_cluster.as_deref(), Some("admin"));
        assert_eq!(cfg.membership_refresh, Duration::from_millis(500));
        assert_eq!(cfg.max_tombstones, 8);
        assert_eq!(cfg.probe_path, None);
    }

    #[test]
    fn consumer_config_errors_name_the_field() {
        let cases = [
            (
                r#"{"closing_headers":["ok",""]}"#,
                "closing_headers[1]",
                "empty",
            ),
            (
                r#"{"closing_headers":"closing"}"#,
                "closing_headers",
                "invalid type",
            ),
            (
                r#"{"instance_header":"a b"}"#,
                "instance_header",
                "not a valid header name",
            ),
            (r#"{"tombstone_ttl":"0s"}"#, "tombstone_ttl", "above 0s"),
            (r#"{"tombstone_ttl":"30"}"#, "tombstone_ttl", "missing unit"),
            (
                r#"{"evict_on_connect_failure":"true"}"#,
                "evict_on_connect_failure",
                "invalid type",
            ),
            (
                r#"{"failure_tombstone_ttl":"0ms"}"#,
                "failure_tombstone_ttl",
                "above 0s",
            ),
            (
                r#"{"override_host_header":""}"#,
                "override_host_header",
                "empty",
            ),
            (
                r#"{"override_host_header":"closing"}"#,
                "override_host_header",
                "differ",
            ),
            (r#"{"admin_cluster":""}"#, "admin_cluster", "empty"),
            (
                r#"{"membership_refresh":"10ms"}"#,
                "membership_refresh",
                "between",
            ),
            (r#"{"max_tombstones":0}"#, "max_tombstones", "out of range"),
            (
                r#"{"max_tombstones":65537}"#,
                "max_tombstones",
                "out of range",
            ),
            (r#"{"probe_path":"ready"}"#, "probe_path", "start with '/'"),
            (
                r#"{"tombstone_tll":"5s"}"#,
                "tombstone_tll",
                "unknown field",
            ),
        ];
        for (json, field, reason) in cases {
            let err = ConsumerConfig::from_json(json.as_bytes()).unwrap_err();
            assert_eq!(err.field, field, "{json}: {err}");
            assert!(err.reason.contains(reason), "{json}: {err}");
        }
    }
}
