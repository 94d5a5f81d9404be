//! `graceful_drain`'s configuration: the gate's timings, who may start
//! closing, the endpoints' paths and the app's shutdown hook.

use std::time::Duration;

#[cfg(feature = "schema")]
use std::borrow::Cow;

#[cfg(feature = "schema")]
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::Deserialize;

use crate::drain::record::GateTimings;
#[cfg(feature = "schema")]
use crate::drain::report::peers::PEERS_KEPT;
use crate::shared::config::{cluster_name, duration, read_dto, url_path, ConfigError};
#[cfg(feature = "schema")]
use crate::shared::config::{
    json_schema_of, ClusterName, DurationText, ParserOnlyRule, PositiveDurationText, UrlPath,
    CLUSTER_NAME_BYTES, DUPLICATE_KEYS, DURATION_AT_MOST_24H, WHOLE_NUMBERS,
};
#[cfg(feature = "schema")]
use crate::shared::duration::contract_duration;
use crate::shared::duration::format_duration;
use crate::shared::net::Cidr;

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
/// Peers the report shows by default (`max_report_peers`).
pub const DEFAULT_MAX_REPORT_PEERS: u32 = 32;

/// The endpoints' paths (`paths` field).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    pub closing: String,
    pub ready: String,
    pub status: String,
    pub drained: String,
    pub grpc_health: String,
    pub grpc_health_watch: String,
    pub report: String,
}

impl Paths {
    /// Every endpoint's path beside its field name under `paths`.
    pub fn named(&self) -> [(&'static str, &String); 7] {
        [
            ("closing", &self.closing),
            ("ready", &self.ready),
            ("status", &self.status),
            ("drained", &self.drained),
            ("grpc_health", &self.grpc_health),
            ("grpc_health_watch", &self.grpc_health_watch),
            ("report", &self.report),
        ]
    }
}

impl Default for Paths {
    fn default() -> Self {
        Paths {
            closing: "/graceful/closing".into(),
            ready: "/graceful/ready".into(),
            status: "/graceful/status".into(),
            drained: "/graceful/drained".into(),
            grpc_health: "/grpc.health.v1.Health/Check".into(),
            grpc_health_watch: "/grpc.health.v1.Health/Watch".into(),
            report: "/graceful/report".into(),
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

/// How closing reaches the clients' connections (`close_connections`):
/// through Envoy's admin, since a filter cannot drain its own connection
/// (a `connection` header it adds is stripped as hop-by-hop, and neither
/// proxy-wasm nor the dynamic-module ABI of 1.36/1.37 can mark a stream's
/// connection to drain).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseConnections {
    /// Clients are not told; they learn at the gate's 503s.
    Off,
    /// `POST /healthcheck/fail`: every listener whose `drain_type` is
    /// `DEFAULT` answers HTTP/1.1 with `connection: close` and sends HTTP/2
    /// GOAWAY at its next response, at once whatever the drain strategy.
    HealthcheckFail,
    /// `POST /drain_listeners?graceful&skip_exit&inboundonly`: Envoy's drain
    /// sequence on the `INBOUND` listeners, whatever their `drain_type` (as
    /// Envoy Gateway's listeners are `MODIFY_ONLY`); every response is told
    /// only with `--drain-strategy immediate`, and it cannot be undone.
    DrainListeners,
}

impl CloseConnections {
    /// The admin request that starts it (none for `Off`).
    pub fn admin_path(self) -> Option<&'static str> {
        match self {
            CloseConnections::Off => None,
            CloseConnections::HealthcheckFail => Some("/healthcheck/fail"),
            CloseConnections::DrainListeners => {
                Some("/drain_listeners?graceful&skip_exit&inboundonly")
            }
        }
    }
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
    pub close_connections: CloseConnections,
    /// Most peers the drain report shows (at most
    /// [`crate::drain::report::peers::PEERS_KEPT`], the ones kept).
    pub max_report_peers: u32,
}

/// The configuration as written. Its doc comments and `schemars`
/// attributes are the JSON Schema's descriptions, defaults and forms
/// (schema/graceful_drain.schema.json, docs/configuration.md).
#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(
    feature = "schema",
    schemars(
        title = "graceful_drain",
        description = "The configuration of graceful_drain, on a listener that kubelet, the release system and the consumers' health checks reach: it answers the closing, readiness, status, drained and report endpoints and decides when the drain gate passes.",
        transform = close_connections_needs_admin
    )
)]
struct DrainDto {
    /// The least time spent closing before the gate can pass: consumers need it to learn of the
    /// closing.
    #[cfg_attr(feature = "schema", schemars(with = "DurationText", extend("default" = contract_duration(DEFAULT_CONSUMER_UPDATE_WAIT))))]
    consumer_update_wait: Option<String>,
    /// The gate passes only when nothing is in flight and no request started within this window.
    #[cfg_attr(feature = "schema", schemars(with = "DurationText", extend("default" = contract_duration(DEFAULT_QUIET_WINDOW))))]
    quiet_window: Option<String>,
    /// After `consumer_update_wait`, the most time spent waiting for quiet; then the gate passes,
    /// forced. With `longest_request` set: how long new requests are still admitted; past it they
    /// get the marked 503 and the requests in flight are waited for until `timeout`.
    #[cfg_attr(feature = "schema", schemars(with = "DurationText", extend("default" = contract_duration(DEFAULT_STEP_TIMEOUT))))]
    step_timeout: Option<String>,
    /// After this much closing time the gate passes whatever happens, forced. Must be at least
    /// `consumer_update_wait`; with `longest_request` set, at least `consumer_update_wait` +
    /// `step_timeout` + `quiet_window` + `longest_request`, and when unset it becomes that sum
    /// rounded up to whole seconds if the sum is longer than 60s.
    #[cfg_attr(feature = "schema", schemars(with = "DurationText", extend("default" = contract_duration(DEFAULT_TIMEOUT))))]
    timeout: Option<String>,
    /// The app's longest request: with it set, `step_timeout` stops admission instead of forcing
    /// the gate (later arrivals get the marked 503), the requests in flight are waited for until
    /// `timeout`, and `timeout` defaults to what that needs.
    #[cfg_attr(feature = "schema", schemars(with = "PositiveDurationText"))]
    longest_request: Option<String>,
    /// Address ranges allowed to start closing, hold `drained?wait=`, and read `status`, `drained`
    /// and the report; others get 403 at once and are never held (readiness and gRPC health answer
    /// everyone). `[]` allows none (only `admin_cluster` can start closing).
    #[cfg_attr(feature = "schema", schemars(with = "Vec<Cidr>", extend("default" = DEFAULT_ALLOWED_SOURCES)))]
    allowed_sources: Option<Vec<String>>,
    /// A cluster pointing at Envoy's admin; when set, `POST /healthcheck/fail` on the admin starts
    /// closing (polled once a second per Envoy).
    #[cfg_attr(feature = "schema", schemars(with = "ClusterName"))]
    admin_cluster: Option<String>,
    /// When the gate passes, POST the status JSON once to this cluster: the app's own shutdown hook
    /// (the mesh form of dubbo-go's custom shutdown callbacks). Failures are logged and counted,
    /// never block the gate.
    on_drained: Option<OnDrainedDto>,
    /// Bound on `drained?wait=` requests held at once per Envoy; more get 429.
    #[cfg_attr(feature = "schema", schemars(range(max = MAX_MAX_WAITERS), extend("default" = DEFAULT_MAX_WAITERS)))]
    max_waiters: Option<u64>,
    /// The endpoints' paths: each must start with `/`, all distinct.
    paths: Option<PathsDto>,
    /// How closing reaches clients that never read the mark: `"healthcheck_fail"` (Envoy's `POST
    /// /healthcheck/fail`: HTTP/1.1 `connection: close` and HTTP/2 GOAWAY on the listeners of drain
    /// type DEFAULT), `"drain_listeners"` (`POST /drain_listeners?graceful&skip_exit&inboundonly`:
    /// the INBOUND listeners, whatever their drain type) or `"off"`. The first two need
    /// `admin_cluster` (refused without it).
    #[cfg_attr(feature = "schema", schemars(with = "CloseConnections", extend("x-default" = "`\"healthcheck_fail\"` with `admin_cluster`, else `\"off\"`")))]
    close_connections: Option<String>,
    /// Callers the drain report lists, largest first.
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = PEERS_KEPT), extend("default" = DEFAULT_MAX_REPORT_PEERS)))]
    max_report_peers: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema), schemars(inline))]
struct OnDrainedDto {
    /// The cluster to POST to (the app's).
    #[cfg_attr(feature = "schema", schemars(with = "ClusterName"))]
    cluster: String,
    /// The path to POST to.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(with = "UrlPath", extend("default" = DEFAULT_ON_DRAINED_PATH)))]
    path: Option<String>,
    /// How long to wait for the answer: above 0s, at most 60s.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(with = "PositiveDurationText", extend("default" = contract_duration(DEFAULT_ON_DRAINED_TIMEOUT))))]
    timeout: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema), schemars(inline))]
struct PathsDto {
    /// `POST`: starts closing.
    #[cfg_attr(feature = "schema", schemars(with = "UrlPath", extend("default" = Paths::default().closing)))]
    closing: Option<String>,
    /// `GET`: the readiness probe (`SERVING`, then `NOT_SERVING` once closing).
    #[cfg_attr(feature = "schema", schemars(with = "UrlPath", extend("default" = Paths::default().ready)))]
    ready: Option<String>,
    /// `GET`: the status JSON.
    #[cfg_attr(feature = "schema", schemars(with = "UrlPath", extend("default" = Paths::default().status)))]
    status: Option<String>,
    /// `GET`: whether the gate has passed; `?wait=` holds the request until it does.
    #[cfg_attr(feature = "schema", schemars(with = "UrlPath", extend("default" = Paths::default().drained)))]
    drained: Option<String>,
    /// gRPC health `Check`: the app's while serving, the filter's once closing.
    #[cfg_attr(feature = "schema", schemars(with = "UrlPath", extend("default" = Paths::default().grpc_health)))]
    grpc_health: Option<String>,
    /// gRPC health `Watch`: the app's while serving, ended once closing.
    #[cfg_attr(feature = "schema", schemars(with = "UrlPath", extend("default" = Paths::default().grpc_health_watch)))]
    grpc_health_watch: Option<String>,
    /// `GET`: the drain report.
    #[cfg_attr(feature = "schema", schemars(with = "UrlPath", extend("default" = Paths::default().report)))]
    report: Option<String>,
}

/// A positive duration (`longest_request`: "0s" would say nothing; the
/// schema's `positive_duration`).
fn positive_duration(field: &str, text: &str) -> Result<Duration, ConfigError> {
    let d = duration(field, Some(text), Duration::ZERO)?;
    if d.is_zero() {
        return Err(ConfigError::new(field, "must be above 0s"));
    }
    Ok(d)
}

/// With `longest_request` set, the overall `timeout` must leave a request
/// that long room after the arrivals' budget: unset, it becomes the
/// least that does (whole seconds, never below the default); set shorter,
/// the config is refused, naming it.
fn with_longest_request(
    mut gate: GateTimings,
    timeout_set: bool,
) -> Result<GateTimings, ConfigError> {
    let Some(longest) = gate.longest_request else {
        return Ok(gate);
    };
    let needed = gate.consumer_update_wait + gate.step_timeout + gate.quiet_window + longest;
    if gate.timeout >= needed {
        return Ok(gate);
    }
    if timeout_set {
        return Err(ConfigError::new(
            "timeout",
            format!(
                "shorter than consumer_update_wait + step_timeout + quiet_window + longest_request ({}): a request that long would be cut",
                format_duration(needed)
            ),
        ));
    }
    gate.timeout = Duration::from_secs(needed.as_secs() + u64::from(needed.subsec_nanos() > 0));
    Ok(gate)
}

impl DrainConfig {
    /// Names a `timeout` the other budgets make unreachable (logged once
    /// when the config loads): without `longest_request`, the gate passes
    /// by `consumer_update_wait` + `step_timeout` at the latest.
    pub fn unreachable_timeout(&self) -> Option<String> {
        let g = &self.gate;
        let latest = g.consumer_update_wait + g.step_timeout;
        (g.longest_request.is_none() && g.timeout > latest).then(|| {
            format!(
                "graceful_drain: timeout {} is never reached: without longest_request the gate passes by consumer_update_wait + step_timeout ({}) at the latest, forced if requests are still in flight; set longest_request to wait for requests in flight until timeout (arrivals past step_timeout then get the marked 503)",
                format_duration(g.timeout),
                format_duration(latest),
            )
        })
    }
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
            longest_request: match dto.longest_request.as_deref() {
                None => None,
                Some(text) => Some(positive_duration("longest_request", text)?),
            },
        };
        if gate.timeout < gate.consumer_update_wait {
            return Err(ConfigError::new(
                "timeout",
                "must be at least consumer_update_wait: consumers need that long to learn of the closing",
            ));
        }
        let gate = with_longest_request(gate, dto.timeout.is_some())?;
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
        let close_connections =
            close_connections(dto.close_connections.as_deref(), admin_cluster.is_some())?;
        let kept = crate::drain::report::peers::PEERS_KEPT as u64;
        let max_report_peers = match dto.max_report_peers {
            None => DEFAULT_MAX_REPORT_PEERS,
            Some(n) if (1..=kept).contains(&n) => n as u32,
            Some(n) => {
                return Err(ConfigError::new(
                    "max_report_peers",
                    format!("{n} is out of range 1..={kept}"),
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
            close_connections,
            max_report_peers,
        })
    }
}

/// `close_connections`'s values as written, for the schema (the parser's
/// match below names them too; a test holds the two together).
#[cfg(feature = "schema")]
const CLOSE_CONNECTIONS: [(&str, CloseConnections); 3] = [
    ("healthcheck_fail", CloseConnections::HealthcheckFail),
    ("drain_listeners", CloseConnections::DrainListeners),
    ("off", CloseConnections::Off),
];

/// `close_connections`: absent, `healthcheck_fail` where the admin is
/// reachable and off where it is not; named, it needs `admin_cluster`.
fn close_connections(
    value: Option<&str>,
    has_admin: bool,
) -> Result<CloseConnections, ConfigError> {
    let mode = match value {
        None if has_admin => return Ok(CloseConnections::HealthcheckFail),
        None => return Ok(CloseConnections::Off),
        Some("off") => CloseConnections::Off,
        Some("healthcheck_fail") => CloseConnections::HealthcheckFail,
        Some("drain_listeners") => CloseConnections::DrainListeners,
        Some(other) => {
            return Err(ConfigError::new(
                "close_connections",
                format!(
                    "{other:?} is not one of \"healthcheck_fail\", \"drain_listeners\", \"off\""
                ),
            ))
        }
    };
    if mode != CloseConnections::Off && !has_admin {
        return Err(ConfigError::new(
            "close_connections",
            "needs admin_cluster: the connections are drained through Envoy's admin",
        ));
    }
    Ok(mode)
}

/// `close_connections`'s form, for the schema: one of its names.
#[cfg(feature = "schema")]
impl JsonSchema for CloseConnections {
    fn schema_name() -> Cow<'static, str> {
        "close_connections".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let names: Vec<&str> = CLOSE_CONNECTIONS.iter().map(|(name, _)| *name).collect();
        json_schema!({"type": "string", "enum": names})
    }
}

/// [`close_connections`]'s rule across fields, for the schema: a mode that
/// goes through the admin needs `admin_cluster`.
#[cfg(feature = "schema")]
fn close_connections_needs_admin(schema: &mut Schema) {
    let through_admin: Vec<&str> = CLOSE_CONNECTIONS
        .iter()
        .filter(|(_, mode)| mode.admin_path().is_some())
        .map(|(name, _)| *name)
        .collect();
    schema.insert(
        "dependentSchemas".into(),
        serde_json::json!({
            "close_connections": {
                "if": {"properties": {"close_connections": {"enum": through_admin}}},
                "then": {"required": ["admin_cluster"]},
            }
        }),
    );
}

/// [`DrainConfig::from_json`]'s rules on values the schema cannot weigh:
/// durations compared across fields, and the paths' distinctness.
#[cfg(feature = "schema")]
const TIMEOUT_AT_LEAST_CONSUMER_UPDATE_WAIT: ParserOnlyRule = ParserOnlyRule {
    name: "timeout_at_least_consumer_update_wait",
    rule: "`timeout` must be at least `consumer_update_wait`.",
};

#[cfg(feature = "schema")]
const TIMEOUT_COVERS_LONGEST_REQUEST: ParserOnlyRule = ParserOnlyRule {
    name: "timeout_covers_longest_request",
    rule: "With `longest_request` set, a `timeout` that is set must be at least `consumer_update_wait` + `step_timeout` + `quiet_window` + `longest_request`.",
};

#[cfg(feature = "schema")]
const ON_DRAINED_TIMEOUT_AT_MOST_60S: ParserOnlyRule = ParserOnlyRule {
    name: "on_drained_timeout_at_most_60s",
    rule: "`on_drained.timeout` is at most 60s.",
};

#[cfg(feature = "schema")]
const DISTINCT_PATHS: ParserOnlyRule = ParserOnlyRule {
    name: "distinct_paths",
    rule: "The paths under `paths` must all differ, defaults included (setting `paths.status` to `\"/graceful/ready\"` is refused).",
};

impl DrainConfig {
    /// The JSON Schema of graceful_drain's configuration.
    #[cfg(feature = "schema")]
    pub fn json_schema() -> serde_json::Value {
        json_schema_of::<DrainDto>(&[
            DUPLICATE_KEYS,
            WHOLE_NUMBERS,
            DURATION_AT_MOST_24H,
            CLUSTER_NAME_BYTES,
            TIMEOUT_AT_LEAST_CONSUMER_UPDATE_WAIT,
            TIMEOUT_COVERS_LONGEST_REQUEST,
            ON_DRAINED_TIMEOUT_AT_MOST_60S,
            DISTINCT_PATHS,
        ])
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
        grpc_health_watch: pick(
            "paths.grpc_health_watch",
            dto.grpc_health_watch,
            defaults.grpc_health_watch,
        )?,
        report: pick("paths.report", dto.report, defaults.report)?,
    };
    let named = paths.named();
    for (i, (field, path)) in named.iter().enumerate() {
        if let Some((other, _)) = named.iter().take(i).find(|(_, p)| p == path) {
            return Err(ConfigError::new(
                &format!("paths.{field}"),
                format!("{path:?} is already used by paths.{other}"),
            ));
        }
    }
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The schema's `close_connections` values are the parser's, one for
    /// each mode.
    #[cfg(feature = "schema")]
    #[test]
    fn the_schemas_close_connections_are_the_parsers() {
        for (name, mode) in CLOSE_CONNECTIONS {
            assert_eq!(close_connections(Some(name), true), Ok(mode), "{name}");
        }
        for mode in [
            CloseConnections::Off,
            CloseConnections::HealthcheckFail,
            CloseConnections::DrainListeners,
        ] {
            assert!(
                CLOSE_CONNECTIONS.iter().any(|(_, m)| *m == mode),
                "{mode:?}"
            );
        }
    }

    fn drain_err(json: &str) -> ConfigError {
        DrainConfig::from_json(json.as_bytes()).unwrap_err()
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
        assert_eq!(cfg.paths.report, "/graceful/report");
        assert_eq!(cfg.max_report_peers, 32);
    }

    #[test]
    fn drain_reads_every_field() {
        let cfg = DrainConfig::from_json(
            br#"{"consumer_update_wait":"1s","quiet_window":"250ms","step_timeout":"2s","timeout":"10s",
                "allowed_sources":["10.0.0.0/8"],"admin_cluster":"envoy_admin",
                "on_drained":{"cluster":"app","path":"/bye","timeout":"1s"},"max_waiters":3,
                "max_report_peers":128,
                "paths":{"closing":"/c","ready":"/r","status":"/s","drained":"/d","grpc_health":"/g",
                         "report":"/rep"}}"#,
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
        assert_eq!(cfg.paths.report, "/rep");
        assert_eq!(cfg.max_report_peers, 128);
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
    fn longest_request_sets_the_timeout_it_needs_unless_one_is_given() {
        let none = DrainConfig::from_json(b"").unwrap();
        assert_eq!(none.gate.longest_request, None);
        let long = DrainConfig::from_json(br#"{"longest_request":"90s"}"#).unwrap();
        assert_eq!(long.gate.longest_request, Some(Duration::from_secs(90)));
        // 3 s + 3 s + 500 ms + 90 s, in whole seconds.
        assert_eq!(long.gate.timeout, Duration::from_secs(97));
        let short = DrainConfig::from_json(br#"{"longest_request":"2s"}"#).unwrap();
        assert_eq!(
            short.gate.timeout,
            Duration::from_secs(60),
            "never below the default"
        );
        let given = DrainConfig::from_json(br#"{"longest_request":"2s","timeout":"20s"}"#).unwrap();
        assert_eq!(given.gate.timeout, Duration::from_secs(20));
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
            (r#"{"longest_request":"0s"}"#, "longest_request", "above 0s"),
            (r#"{"longest_request":30}"#, "longest_request", "invalid type"),
            (
                r#"{"longest_request":"30s","timeout":"30s"}"#,
                "timeout",
                "shorter than consumer_update_wait + step_timeout + quiet_window + longest_request (36500ms)",
            ),
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
            (
                r#"{"max_report_peers":0}"#,
                "max_report_peers",
                "out of range",
            ),
            (
                r#"{"max_report_peers":129}"#,
                "max_report_peers",
                "out of range",
            ),
            (
                r#"{"paths":{"report":"/graceful/status"}}"#,
                "paths.report",
                "already used",
            ),
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
}
