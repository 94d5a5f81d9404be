//! `graceful_consumer`'s configuration (the consumer's outbound sidecar):
//! which marks tombstone a host, for how long, and how steering and
//! membership are reached.

use std::time::Duration;

use serde::Deserialize;

use crate::shared::config::{
    cluster_name, duration, header_name, optional_header_name, read_dto, url_path, ConfigError,
};
#[cfg(feature = "schema")]
use crate::shared::config::{
    json_schema_of, ClusterName, DurationText, HeaderName, OptionalHeaderName, OptionalUrlPath,
    ParserOnlyRule, PositiveDurationText, CLUSTER_NAME_BYTES, DUPLICATE_KEYS, DURATION_AT_MOST_24H,
    WHOLE_NUMBERS,
};
#[cfg(feature = "schema")]
use crate::shared::duration::contract_duration;

pub const DEFAULT_CLOSING_HEADERS: [&str; 2] = ["x-graceful-closing", "closing"];
pub const DEFAULT_TOMBSTONE_TTL: Duration = Duration::from_secs(30);
pub const DEFAULT_FAILURE_TOMBSTONE_TTL: Duration = Duration::from_secs(5);
pub const DEFAULT_OVERRIDE_HOST_HEADER: &str = "x-graceful-override-host";
/// The header carrying this Envoy's consumer identity on every outbound
/// request, for the providers' drain reports (the contract's, added).
pub use crate::shared::config::{DEFAULT_CONSUMER_HEADER, DEFAULT_INSTANCE_HEADER};
pub const DEFAULT_MEMBERSHIP_REFRESH: Duration = Duration::from_secs(1);
pub const DEFAULT_MAX_TOMBSTONES: u32 = 1024;
pub const MAX_MAX_TOMBSTONES: u64 = 65_536;
pub const DEFAULT_PROBE_PATH: &str = "/graceful/ready";
/// Envoy's `healthy_panic_threshold` default, and ours.
pub const DEFAULT_PANIC_THRESHOLD: u8 = 50;
/// `panic_threshold` is a percentage.
const MAX_PANIC_THRESHOLD: u8 = 100;
/// Envoy's `slow_start_config` defaults (`aggression` 1.0: a linear ramp;
/// `min_weight_percent` 10).
pub const DEFAULT_SLOW_START_AGGRESSION: f64 = 1.0;
pub const DEFAULT_SLOW_START_MIN_WEIGHT_PERCENT: u8 = 10;
/// `front.closing_ttl` unless configured: past it a host still listed
/// `HEALTHY` is a restart the front was not told of.
pub const DEFAULT_FRONT_CLOSING_TTL: Duration = Duration::from_secs(120);
/// `front.poll` unless configured: how often one copy reads `rq_active`
/// while a host is not acknowledged.
pub const DEFAULT_FRONT_POLL: Duration = Duration::from_millis(100);
pub const MIN_FRONT_POLL: Duration = Duration::from_millis(10);
pub const MAX_FRONT_POLL: Duration = Duration::from_secs(10);
/// `front.max_waiters` unless configured.
pub const DEFAULT_FRONT_MAX_WAITERS: u32 = 64;
/// Upper bound for `front.max_waiters`: each is a held downstream stream.
pub const MAX_FRONT_MAX_WAITERS: u64 = 10_000;
pub use crate::consumer::front::{DEFAULT_MAX_HOSTS as DEFAULT_FRONT_MAX_HOSTS, MAX_HOSTS_CEILING};

/// `readmit_slow_start`: how a readmitted host's share ramps up, as
/// Envoy's `slow_start_config` ramps a new host's weight: the weight is the
/// host's full one times `max((elapsed / window) ^ (1 / aggression),
/// min_weight_percent / 100)` until the window ends
/// (`EdfLoadBalancerBase::applySlowStartFactor`).
#[derive(Debug, Clone, Copy)]
pub struct SlowStart {
    pub window: Duration,
    /// Above 0 and finite.
    pub aggression: f64,
    /// 0 to 100.
    pub min_weight_percent: u8,
}

impl PartialEq for SlowStart {
    fn eq(&self, other: &Self) -> bool {
        self.window == other.window
            && self.aggression.to_bits() == other.aggression.to_bits()
            && self.min_weight_percent == other.min_weight_percent
    }
}

// `aggression` is finite (validated), so bitwise equality is an equivalence.
impl Eq for SlowStart {}

impl SlowStart {
    /// The share of its full weight a host readmitted `elapsed` ago gets
    /// (0 to 1; 1 once the window has passed).
    pub fn weight(&self, elapsed: Duration) -> f64 {
        if elapsed >= self.window {
            return 1.0;
        }
        // Envoy counts at least 1 ms in.
        let elapsed = elapsed.max(Duration::from_millis(1));
        let time_factor = elapsed.as_secs_f64() / self.window.as_secs_f64();
        let ramp = if self.aggression == 1.0 {
            time_factor
        } else {
            time_factor.powf(1.0 / self.aggression)
        };
        ramp.max(f64::from(self.min_weight_percent) / 100.0)
            .min(1.0)
    }
}

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
    /// Percent of a cluster's usable members that steering keeps listing:
    /// when tombstones leave fewer acceptable, members tombstoned only for
    /// a refused connection are tried too, longest confirmed first (never
    /// one whose last answer said closing: see
    /// [`crate::consumer::steering::plan()`]); 0 turns the rule off.
    pub panic_threshold: u8,
    /// Lower-case request header set to this Envoy's instance id on every
    /// outbound request, replacing a client's; None turns it off.
    pub consumer_header: Option<String>,
    /// How a readmitted host's share ramps up; None (the default): it takes
    /// its full share at once.
    pub readmit_slow_start: Option<SlowStart>,
    /// The front-proxy role (docs/design/front-proxy-drain.md); None: off.
    /// Only the listener instance acts on it.
    pub front: Option<FrontConfig>,
}

/// `front`: the front-proxy role's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrontConfig {
    /// This listener answers `{prefix}/front/...` (a listener the public
    /// does not reach).
    pub serve_endpoints: bool,
    pub closing_ttl: Duration,
    /// 10ms to 10s.
    pub poll: Duration,
    /// 1 to [`MAX_HOSTS_CEILING`].
    pub max_hosts: usize,
    pub max_waiters: u32,
}

impl FrontConfig {
    /// The limits the host table's transitions read.
    pub fn limits(&self) -> crate::consumer::front::Limits {
        crate::consumer::front::Limits {
            closing_ttl: self.closing_ttl,
            poll: self.poll,
            max_hosts: self.max_hosts,
        }
    }
}

/// The configuration as written. Its doc comments and `schemars`
/// attributes are the JSON Schema's descriptions, defaults and forms
/// (schema/graceful_consumer.schema.json, docs/configuration.md).
#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(
    feature = "schema",
    schemars(
        title = "graceful_consumer",
        description = "The configuration of graceful_consumer, on the outbound side of a consumer's sidecar: it tombstones upstream hosts that say they are closing (or refuse connections) and steers requests away from them."
    )
)]
struct ConsumerDto {
    /// A response header or trailer with one of these names and value `true` (case-insensitive)
    /// marks the upstream host closing (`closing` is what dubbo-go providers send).
    #[cfg_attr(feature = "schema", schemars(with = "Vec<HeaderName>", extend("default" = DEFAULT_CLOSING_HEADERS)))]
    closing_headers: Option<Vec<String>>,
    /// A response from a tombstoned address with a different instance id in this header clears the
    /// tombstone at once; `""` turns that off.
    #[cfg_attr(feature = "schema", schemars(with = "OptionalHeaderName", extend("default" = DEFAULT_INSTANCE_HEADER)))]
    instance_header: Option<String>,
    /// How long a closing host stays evicted, whatever the registry (EDS) says meanwhile; a host
    /// that keeps answering closing (to probes) stays evicted.
    #[cfg_attr(feature = "schema", schemars(with = "PositiveDurationText", extend("default" = contract_duration(DEFAULT_TOMBSTONE_TTL))))]
    tombstone_ttl: Option<String>,
    /// A local reply with response flags UF (connect failure) or UC (connection termination) evicts
    /// that host too.
    #[cfg_attr(feature = "schema", schemars(extend("default" = true)))]
    evict_on_connect_failure: Option<bool>,
    /// The tombstone time for connect failures.
    #[cfg_attr(feature = "schema", schemars(with = "PositiveDurationText", extend("default" = contract_duration(DEFAULT_FAILURE_TOMBSTONE_TTL))))]
    failure_tombstone_ttl: Option<String>,
    /// The request header through which the filter steers Envoy's
    /// `envoy.load_balancing_policies.override_host` policy away from tombstoned hosts (the cluster
    /// must use that policy with this header as its source); any value a client sent in it is
    /// removed first. Must differ from `closing_headers` and `instance_header`.
    #[cfg_attr(feature = "schema", schemars(with = "HeaderName", extend("default" = DEFAULT_OVERRIDE_HOST_HEADER)))]
    override_host_header: Option<String>,
    /// A cluster pointing at Envoy's admin listener; when set, the filter learns the members and
    /// health of every cluster it routes to from `/clusters`.
    #[cfg_attr(feature = "schema", schemars(with = "ClusterName"))]
    admin_cluster: Option<String>,
    /// How often one VM copy refreshes membership and probes tombstoned hosts: 100ms to 1h.
    #[cfg_attr(feature = "schema", schemars(with = "DurationText", extend("default" = contract_duration(DEFAULT_MEMBERSHIP_REFRESH))))]
    membership_refresh: Option<String>,
    /// Bound on tombstones kept per Envoy, so memory stays bounded under any host churn; past it,
    /// those expiring first are dropped.
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = MAX_MAX_TOMBSTONES), extend("default" = DEFAULT_MAX_TOMBSTONES)))]
    max_tombstones: Option<u64>,
    /// Asked of each tombstoned host every `membership_refresh`, pinned to its address (and with
    /// the address as its Host), to learn whether a new instance answers there (graceful_drain's
    /// readiness endpoint answers with the instance id and the address it was reached at); `""`
    /// turns probing off.
    #[cfg_attr(feature = "schema", schemars(with = "OptionalUrlPath", extend("default" = DEFAULT_PROBE_PATH)))]
    probe_path: Option<String>,
    /// Percent of a cluster's usable members that steering keeps listing (`0` turns the rule off):
    /// when tombstones leave fewer acceptable hosts, members tombstoned only for a refused
    /// connection are tried too, up to that share; a host whose last answer said closing is never
    /// listed while any acceptable host is known.
    #[cfg_attr(feature = "schema", schemars(range(max = MAX_PANIC_THRESHOLD), extend("default" = DEFAULT_PANIC_THRESHOLD)))]
    panic_threshold: Option<u64>,
    /// Each request to a cluster graceful_consumer steers carries this Envoy's instance id in this
    /// header (the id its graceful_provider stamps, when it has one), so the providers' drain
    /// reports can name their callers: the upstream instance sets it, so it goes only to the
    /// clusters that run it; the listener instance drops any value a client sent, on every outbound
    /// request; `""` turns both off. Must differ from `override_host_header`, `closing_headers` and
    /// `instance_header`.
    #[cfg_attr(feature = "schema", schemars(with = "OptionalHeaderName", extend("default" = DEFAULT_CONSUMER_HEADER)))]
    consumer_header: Option<String>,
    /// A host readmitted (a new instance answering at a tombstoned address) gets a share that
    /// ramps up over `window`, as Envoy's `slow_start_config` ramps a new host: a restarted
    /// instance on the same address is the same Envoy host, which Envoy does not ramp again. Left
    /// out (the default), it takes its full share at once. While a host ramps, every request to its
    /// cluster is steered.
    readmit_slow_start: Option<SlowStartDto>,
    /// The front-proxy role, for backends with no sidecar behind this Envoy: a host closes
    /// itself (`POST /graceful/front/closing` from its own address), is steered away from on every
    /// worker, and is told once nothing of this Envoy's is in flight to it (`GET
    /// /graceful/front/drained?wait=`). Needs `admin_cluster`. Only the listener instance acts on
    /// it; the upstream instance ignores it.
    front: Option<FrontDto>,
}

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema), schemars(inline))]
struct FrontDto {
    /// Answer the front endpoints (`/graceful/front/closing`, `drained`, `serving`, `status`) on
    /// this listener: set it only on a listener the public does not reach. Elsewhere those paths
    /// are forwarded like any request.
    #[cfg_attr(feature = "schema", schemars(extend("default" = false)))]
    serve_endpoints: Option<bool>,
    /// How long a closing host stays steered away from without a new `closing`: past it, a host
    /// listed `HEALTHY` is serving again (a restart this Envoy was not told of).
    #[cfg_attr(feature = "schema", schemars(with = "PositiveDurationText", extend("default" = contract_duration(DEFAULT_FRONT_CLOSING_TTL))))]
    closing_ttl: Option<String>,
    /// How often one VM copy reads each closing host's requests in flight (`rq_active`) from the
    /// admin's `/clusters`, while a host is not acknowledged: 10ms to 10s.
    #[cfg_attr(feature = "schema", schemars(with = "DurationText", extend("default" = contract_duration(DEFAULT_FRONT_POLL))))]
    poll: Option<String>,
    /// Bound on hosts kept closing at once per Envoy; past it, the oldest acknowledged is
    /// forgotten, and with none, `closing` answers 503.
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = MAX_HOSTS_CEILING), extend("default" = DEFAULT_FRONT_MAX_HOSTS)))]
    max_hosts: Option<u64>,
    /// Bound on `drained?wait=` requests held at once per Envoy; more get 429.
    #[cfg_attr(feature = "schema", schemars(range(max = MAX_FRONT_MAX_WAITERS), extend("default" = DEFAULT_FRONT_MAX_WAITERS)))]
    max_waiters: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema), schemars(inline))]
struct SlowStartDto {
    /// How long the ramp lasts (Envoy's `slow_start_window`).
    #[cfg_attr(feature = "schema", schemars(with = "PositiveDurationText"))]
    window: String,
    /// The ramp's shape: the weight grows as `(elapsed / window) ^ (1 / aggression)`; 1 is linear,
    /// above 1 faster at first. Above 0.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(extend("default" = DEFAULT_SLOW_START_AGGRESSION, "exclusiveMinimum" = 0)))]
    aggression: Option<f64>,
    /// The least share of its weight the host gets during the ramp, in percent.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(range(max = 100), extend("default" = DEFAULT_SLOW_START_MIN_WEIGHT_PERCENT)))]
    min_weight_percent: Option<u64>,
}

/// [`ConsumerConfig::from_json`]'s rules on values the schema cannot weigh.
#[cfg(feature = "schema")]
const MEMBERSHIP_REFRESH_RANGE: ParserOnlyRule = ParserOnlyRule {
    name: "membership_refresh_range",
    rule: "`membership_refresh` is between 100ms and 1h.",
};

#[cfg(feature = "schema")]
const FRONT_POLL_RANGE: ParserOnlyRule = ParserOnlyRule {
    name: "front_poll_range",
    rule: "`front.poll` is between 10ms and 10s.",
};

#[cfg(feature = "schema")]
const FRONT_NEEDS_ADMIN: ParserOnlyRule = ParserOnlyRule {
    name: "front_needs_admin_cluster",
    rule: "`front` requires `admin_cluster`.",
};

#[cfg(feature = "schema")]
const DISTINCT_HEADERS: ParserOnlyRule = ParserOnlyRule {
    name: "distinct_headers",
    rule: "`override_host_header` must differ from `closing_headers` and `instance_header`, and `consumer_header` (unless `\"\"`) from all three, compared case-insensitively.",
};

impl ConsumerConfig {
    /// The JSON Schema of graceful_consumer's configuration.
    #[cfg(feature = "schema")]
    pub fn json_schema() -> serde_json::Value {
        json_schema_of::<ConsumerDto>(&[
            DUPLICATE_KEYS,
            WHOLE_NUMBERS,
            DURATION_AT_MOST_24H,
            CLUSTER_NAME_BYTES,
            MEMBERSHIP_REFRESH_RANGE,
            DISTINCT_HEADERS,
            FRONT_POLL_RANGE,
            FRONT_NEEDS_ADMIN,
        ])
    }
}

/// A duration that must be above 0s (the schema's `positive_duration`).
fn positive(field: &str, d: Duration) -> Result<Duration, ConfigError> {
    if d.is_zero() {
        return Err(ConfigError::new(field, "must be above 0s"));
    }
    Ok(d)
}

impl ConsumerConfig {
    /// Parses and validates the plugin configuration bytes.
    pub fn from_json(bytes: &[u8]) -> Result<Self, ConfigError> {
        let dto: ConsumerDto = read_dto(bytes, &["readmit_slow_start", "front"])?;
        let closing_headers = closing_headers(dto.closing_headers.as_deref())?;
        let instance_header = optional_header_name(
            "instance_header",
            dto.instance_header.as_deref(),
            DEFAULT_INSTANCE_HEADER,
        )?;
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
        let consumer_header = optional_header_name(
            "consumer_header",
            dto.consumer_header.as_deref(),
            DEFAULT_CONSUMER_HEADER,
        )?;
        if let Some(h) = &consumer_header {
            if *h == override_host_header
                || closing_headers.contains(h)
                || instance_header.as_ref() == Some(h)
            {
                return Err(ConfigError::new(
                    "consumer_header",
                    "must differ from override_host_header, closing_headers and instance_header",
                ));
            }
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
        let membership_refresh = membership_refresh(dto.membership_refresh.as_deref())?;
        let max_tombstones = max_tombstones(dto.max_tombstones)?;
        let admin_cluster = match dto.admin_cluster {
            None => None,
            Some(name) => Some(cluster_name("admin_cluster", &name)?),
        };
        let probe_path = match dto.probe_path.as_deref() {
            Some("") => None,
            other => Some(url_path("probe_path", other.unwrap_or(DEFAULT_PROBE_PATH))?),
        };
        let panic_threshold = panic_threshold(dto.panic_threshold)?;
        let readmit_slow_start = match dto.readmit_slow_start {
            None => None,
            Some(ss) => Some(slow_start(&ss)?),
        };
        let front = match &dto.front {
            None => None,
            Some(_) if admin_cluster.is_none() => return Err(ConfigError::new(
                "front",
                "requires admin_cluster (membership, health and requests in flight come from it)",
            )),
            Some(f) => Some(front(f)?),
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
            panic_threshold,
            consumer_header,
            readmit_slow_start,
            front,
        })
    }
}

/// `front`'s fields, each refused naming `front.<field>`.
fn front(dto: &FrontDto) -> Result<FrontConfig, ConfigError> {
    let closing_ttl = positive(
        "front.closing_ttl",
        duration(
            "front.closing_ttl",
            dto.closing_ttl.as_deref(),
            DEFAULT_FRONT_CLOSING_TTL,
        )?,
    )?;
    let poll = duration("front.poll", dto.poll.as_deref(), DEFAULT_FRONT_POLL)?;
    if !(MIN_FRONT_POLL..=MAX_FRONT_POLL).contains(&poll) {
        return Err(ConfigError::new(
            "front.poll",
            "must be between 10ms and 10s",
        ));
    }
    let max_hosts = match dto.max_hosts {
        None => DEFAULT_FRONT_MAX_HOSTS,
        Some(n) => usize::try_from(n)
            .ok()
            .filter(|n| (1..=MAX_HOSTS_CEILING).contains(n))
            .ok_or_else(|| {
                ConfigError::new(
                    "front.max_hosts",
                    format!("{n} is out of range 1..={MAX_HOSTS_CEILING}"),
                )
            })?,
    };
    let max_waiters = match dto.max_waiters {
        None => DEFAULT_FRONT_MAX_WAITERS,
        Some(n) if n <= MAX_FRONT_MAX_WAITERS => n as u32,
        Some(n) => {
            return Err(ConfigError::new(
                "front.max_waiters",
                format!("{n} is out of range 0..={MAX_FRONT_MAX_WAITERS}"),
            ))
        }
    };
    Ok(FrontConfig {
        serve_endpoints: dto.serve_endpoints.unwrap_or(false),
        closing_ttl,
        poll,
        max_hosts,
        max_waiters,
    })
}

/// `closing_headers`: the defaults when absent, else each name validated, in
/// order, the first of any repeated name kept.
fn closing_headers(list: Option<&[String]>) -> Result<Vec<String>, ConfigError> {
    let mut closing_headers: Vec<String> = Vec::new();
    match list {
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
    Ok(closing_headers)
}

/// `membership_refresh`: between 100ms and 1h.
fn membership_refresh(text: Option<&str>) -> Result<Duration, ConfigError> {
    let membership_refresh = duration("membership_refresh", text, DEFAULT_MEMBERSHIP_REFRESH)?;
    if membership_refresh < Duration::from_millis(100)
        || membership_refresh > Duration::from_secs(3600)
    {
        return Err(ConfigError::new(
            "membership_refresh",
            "must be between 100ms and 1h",
        ));
    }
    Ok(membership_refresh)
}

/// `max_tombstones`: in 1..=[`MAX_MAX_TOMBSTONES`].
fn max_tombstones(n: Option<u64>) -> Result<u32, ConfigError> {
    match n {
        None => Ok(DEFAULT_MAX_TOMBSTONES),
        Some(n) if (1..=MAX_MAX_TOMBSTONES).contains(&n) => Ok(n as u32),
        Some(n) => Err(ConfigError::new(
            "max_tombstones",
            format!("{n} is out of range 1..={MAX_MAX_TOMBSTONES}"),
        )),
    }
}

/// `panic_threshold`: a percentage, at most [`MAX_PANIC_THRESHOLD`].
fn panic_threshold(n: Option<u64>) -> Result<u8, ConfigError> {
    match n {
        None => Ok(DEFAULT_PANIC_THRESHOLD),
        Some(n) => u8::try_from(n)
            .ok()
            .filter(|n| *n <= MAX_PANIC_THRESHOLD)
            .ok_or_else(|| {
                ConfigError::new(
                    "panic_threshold",
                    format!("{n} is out of range 0..=100 (percent)"),
                )
            }),
    }
}

fn slow_start(dto: &SlowStartDto) -> Result<SlowStart, ConfigError> {
    let window = positive(
        "readmit_slow_start.window",
        duration(
            "readmit_slow_start.window",
            Some(&dto.window),
            Duration::ZERO,
        )?,
    )?;
    let aggression = dto.aggression.unwrap_or(DEFAULT_SLOW_START_AGGRESSION);
    if !(aggression.is_finite() && aggression > 0.0) {
        return Err(ConfigError::new(
            "readmit_slow_start.aggression",
            format!("{aggression} must be above 0"),
        ));
    }
    let min_weight_percent = match dto.min_weight_percent {
        None => DEFAULT_SLOW_START_MIN_WEIGHT_PERCENT,
        Some(n) => u8::try_from(n).ok().filter(|n| *n <= 100).ok_or_else(|| {
            ConfigError::new(
                "readmit_slow_start.min_weight_percent",
                format!("{n} is out of range 0..=100 (percent)"),
            )
        })?,
    };
    Ok(SlowStart {
        window,
        aggression,
        min_weight_percent,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(cfg.panic_threshold, 50);
        assert_eq!(cfg.consumer_header.as_deref(), Some("x-graceful-consumer"));
        assert_eq!(cfg.readmit_slow_start, None, "off unless asked, as Envoy's");
        assert_eq!(cfg.front, None, "the front role is off unless asked");
    }

    #[test]
    fn front_reads_its_defaults_and_every_field() {
        let cfg = ConsumerConfig::from_json(br#"{"admin_cluster":"admin","front":{}}"#).unwrap();
        assert_eq!(
            cfg.front,
            Some(FrontConfig {
                serve_endpoints: false,
                closing_ttl: Duration::from_secs(120),
                poll: Duration::from_millis(100),
                max_hosts: 256,
                max_waiters: 64,
            })
        );
        let cfg = ConsumerConfig::from_json(
            br#"{"admin_cluster":"admin","front":{"serve_endpoints":true,"closing_ttl":"30s",
                "poll":"10ms","max_hosts":1024,"max_waiters":0}}"#,
        )
        .unwrap();
        let front = cfg.front.unwrap();
        assert!(front.serve_endpoints);
        assert_eq!(front.closing_ttl, Duration::from_secs(30));
        assert_eq!(front.poll, Duration::from_millis(10));
        assert_eq!((front.max_hosts, front.max_waiters), (1024, 0));
        let limits = front.limits();
        assert_eq!((limits.poll, limits.max_hosts), (front.poll, 1024));
        let cfg = ConsumerConfig::from_json(br#"{"admin_cluster":"admin","front":{"poll":"10s"}}"#)
            .unwrap();
        assert_eq!(cfg.front.unwrap().poll, Duration::from_secs(10));
    }

    #[test]
    fn front_errors_name_the_field() {
        let cases = [
            (r#"{"front":{}}"#, "front", "requires admin_cluster"),
            (
                r#"{"front":{"serve_endpoints":true}}"#,
                "front",
                "requires admin_cluster",
            ),
            (
                r#"{"admin_cluster":"a","front":true}"#,
                "front",
                "JSON object",
            ),
            (
                r#"{"admin_cluster":"a","front":{"serve_endpoints":"yes"}}"#,
                "front.serve_endpoints",
                "invalid type",
            ),
            (
                r#"{"admin_cluster":"a","front":{"closing_ttl":"0s"}}"#,
                "front.closing_ttl",
                "above 0s",
            ),
            (
                r#"{"admin_cluster":"a","front":{"closing_ttl":"120"}}"#,
                "front.closing_ttl",
                "missing unit",
            ),
            (
                r#"{"admin_cluster":"a","front":{"poll":"9ms"}}"#,
                "front.poll",
                "between 10ms and 10s",
            ),
            (
                r#"{"admin_cluster":"a","front":{"poll":"11s"}}"#,
                "front.poll",
                "between 10ms and 10s",
            ),
            (
                r#"{"admin_cluster":"a","front":{"max_hosts":0}}"#,
                "front.max_hosts",
                "out of range",
            ),
            (
                r#"{"admin_cluster":"a","front":{"max_hosts":1025}}"#,
                "front.max_hosts",
                "out of range",
            ),
            (
                r#"{"admin_cluster":"a","front":{"max_waiters":10001}}"#,
                "front.max_waiters",
                "out of range",
            ),
            (
                r#"{"admin_cluster":"a","front":{"max_waiters":-1}}"#,
                "front.max_waiters",
                "invalid",
            ),
            (
                r#"{"admin_cluster":"a","front":{"hosts":1}}"#,
                "front.hosts",
                "unknown field",
            ),
        ];
        for (json, field, reason) in cases {
            let err = ConsumerConfig::from_json(json.as_bytes()).unwrap_err();
            assert_eq!(err.field, field, "{json}: {err}");
            assert!(err.reason.contains(reason), "{json}: {err}");
        }
    }

    #[test]
    fn slow_start_reads_envoys_fields_and_defaults() {
        let cfg = ConsumerConfig::from_json(br#"{"readmit_slow_start":{"window":"20s"}}"#).unwrap();
        let ss = cfg.readmit_slow_start.unwrap();
        assert_eq!(ss.window, Duration::from_secs(20));
        assert_eq!((ss.aggression, ss.min_weight_percent), (1.0, 10));
        let cfg = ConsumerConfig::from_json(
            br#"{"readmit_slow_start":{"window":"10s","aggression":2.0,"min_weight_percent":0}}"#,
        )
        .unwrap();
        let ss = cfg.readmit_slow_start.unwrap();
        assert_eq!((ss.aggression, ss.min_weight_percent), (2.0, 0));
    }

    #[test]
    fn slow_start_weight_follows_envoys_formula() {
        let linear = SlowStart {
            window: Duration::from_secs(10),
            aggression: 1.0,
            min_weight_percent: 10,
        };
        let w = |ss: &SlowStart, ms: u64| ss.weight(Duration::from_millis(ms));
        assert_eq!(w(&linear, 0), 0.1, "the floor");
        assert_eq!(w(&linear, 500), 0.1);
        assert!((w(&linear, 5_000) - 0.5).abs() < 1e-9);
        assert_eq!(w(&linear, 10_000), 1.0, "over once the window passed");
        let eager = SlowStart {
            aggression: 2.0,
            min_weight_percent: 0,
            ..linear
        };
        // (0.25)^(1/2) = 0.5: faster at first.
        assert!((w(&eager, 2_500) - 0.5).abs() < 1e-9);
        assert!(
            w(&eager, 0) > 0.0 && w(&eager, 0) < 0.02,
            "1 ms in at least"
        );
    }

    #[test]
    fn consumer_reads_every_field() {
        let cfg = ConsumerConfig::from_json(
            br#"{"closing_headers":["Closing","X-Shutdown","closing"],"instance_header":"","tombstone_ttl":"10s",
                "evict_on_connect_failure":false,"failure_tombstone_ttl":"2s","override_host_header":"X-Pin",
                "admin_cluster":"admin","membership_refresh":"500ms","max_tombstones":8,"probe_path":"",
                "panic_threshold":0,"consumer_header":""}"#,
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
        assert_eq!(cfg.panic_threshold, 0);
        assert_eq!(cfg.consumer_header, None);
        let cfg = ConsumerConfig::from_json(br#"{"consumer_header":"X-Caller"}"#).unwrap();
        assert_eq!(cfg.consumer_header.as_deref(), Some("x-caller"));
    }

    #[test]
    fn consumer_config_errors_name_the_field() {
        let cases = [
            (
                r#"{"consumer_header":"x-graceful-override-host"}"#,
                "consumer_header",
                "must differ",
            ),
            (
                r#"{"consumer_header":"a b"}"#,
                "consumer_header",
                "not a valid header name",
            ),
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
                r#"{"panic_threshold":101}"#,
                "panic_threshold",
                "out of range",
            ),
            (
                r#"{"panic_threshold":"50%"}"#,
                "panic_threshold",
                "invalid type",
            ),
            (r#"{"panic_threshold":-1}"#, "panic_threshold", "invalid"),
            (
                r#"{"readmit_slow_start":"30s"}"#,
                "readmit_slow_start",
                "JSON object",
            ),
            (
                r#"{"readmit_slow_start":{}}"#,
                "readmit_slow_start",
                "missing field `window`",
            ),
            (
                r#"{"readmit_slow_start":{"window":"0s"}}"#,
                "readmit_slow_start.window",
                "above 0s",
            ),
            (
                r#"{"readmit_slow_start":{"window":"5s","aggression":0}}"#,
                "readmit_slow_start.aggression",
                "above 0",
            ),
            (
                r#"{"readmit_slow_start":{"window":"5s","aggression":-1.5}}"#,
                "readmit_slow_start.aggression",
                "above 0",
            ),
            (
                r#"{"readmit_slow_start":{"window":"5s","min_weight_percent":101}}"#,
                "readmit_slow_start.min_weight_percent",
                "out of range",
            ),
            (
                r#"{"readmit_slow_start":{"window":"5s","ramp":"fast"}}"#,
                "readmit_slow_start.ramp",
                "unknown field",
            ),
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
