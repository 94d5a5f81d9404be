//! `make demo`'s matrix: real situations (scenarios) × what teams run
//! (approaches), each cell a rolling restart (or a scale-down) under load as
//! in [`super::run`].
//!
//! | scenario | load | consumer's retries | registry lag | how a provider leaves |
//! |---|---|---|---|---|
//! | `today` | short GETs | shipped (connect failure, refused stream, reset, 503; 2) | 2 s | shutdown |
//! | `istio_long` | short GETs, 5% taking 2–6 s | Istio's default (no reset, no 503) | 2 s | shutdown |
//! | `no_retry_post` | short POSTs | none | 2 s | shutdown |
//! | `slow_registry` | short GETs | shipped | 6 s (longer than a 3 s sleep) | shutdown |
//! | `killed` | short GETs | Istio's default | 2 s | SIGKILL of sidecar and app |
//! | `keepalive_clients` | short GETs from callers without graceful_consumer, on keep-alive HTTP/1.1 or HTTP/2 connections through an L4 balancer (a kube-proxy stand-in, `envoy/l4-balancer.yaml`); and a gRPC client holding a health `Watch` on each provider that goes down (`watch_told_ms`: closing to the moment it learns) | none | 2 s | shutdown |
//! | `scale_down` | short GETs | Istio's default | 2 s | three of four shut down at once and do not come back |
//! | `behind_gateway` | short GETs, 5% taking 2–5 s, through two fronts to three backends with no sidecar | the front's (Istio's default with 503) | 2 s (Envoy Gateway's pushes: `DRAINING`, then removal) | shutdown, a new backend on a new address first (surge) |
//! | `behind_gateway_scale_down` | the same | the same | 2 s | two of three shut down at once and do not come back |
//!
//! | approach | the provider's preStop |
//! |---|---|
//! | `graceful` | the filters: `POST /graceful/closing`, wait for `drained` |
//! | `graceful_no_admin` | the same, graceful_consumer without `admin_cluster` (`today` and `scale_down`) |
//! | `graceful_close_off` | the same with graceful_drain's `close_connections: "off"` (`keepalive_clients` only: what telling the connections buys) |
//! | `sleep_3s`, `sleep_15s` | plain Envoy: `POST /healthcheck/fail`, a fixed sleep |
//! | `registry_only` | plain Envoy: none; SIGTERM at once, the registry follows |
//! | `plain` | plain Envoy (for `killed`, where no preStop runs) |
//!
//! Behind fronts (`super::fronts`): `graceful` is the filters on the fronts
//! and `graceful-hook front` as the backend's preStop; `no_hook` the filters
//! and no preStop; `sleep_5s`, `sleep_15s` plain fronts and a sleep;
//! `draining_only` plain fronts and no preStop (Envoy Gateway's `DRAINING`
//! push alone).

use std::time::Duration;

use super::{DemoConfig, Mode, Retry};
use crate::support::load::{Protocol, Shape};

/// A real situation a rollout meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scenario {
    pub name: &'static str,
    pub what: &'static str,
    pub retry: Retry,
    pub shape: Shape,
    pub registry_lag: Duration,
    /// The provider dies by SIGKILL instead of shutting down.
    pub killed: bool,
    /// The callers reach the providers through an L4 balancer, not a
    /// consumer sidecar: nothing reads the closing mark or retries.
    pub balancer: bool,
    /// Providers at the start.
    pub providers: usize,
    /// A scale-down: this many providers leave at once and do not come
    /// back; 0, a rolling restart.
    pub scale_down_by: usize,
    /// Backends with no sidecar behind two fronts (`super::fronts`).
    pub fronts: bool,
}

pub const SCENARIOS: [Scenario; 9] = [
    Scenario {
        name: "today",
        what: "short GETs, the shipped retry policy, registry lag 2 s",
        retry: Retry::Shipped,
        shape: Shape {
            method: "GET",
            long_every: 0,
            long_ms: (0, 0),
            numbered: false,
        },
        registry_lag: Duration::from_secs(2),
        killed: false,
        balancer: false,
        providers: 3,
        scale_down_by: 0,
        fronts: false,
    },
    Scenario {
        name: "istio_long",
        what: "Istio's default retry policy (no reset, no 503), 5% of requests taking 2-6 s",
        retry: Retry::Istio,
        shape: Shape {
            method: "GET",
            long_every: 20,
            long_ms: (2000, 6000),
            numbered: false,
        },
        registry_lag: Duration::from_secs(2),
        killed: false,
        balancer: false,
        providers: 3,
        scale_down_by: 0,
        fronts: false,
    },
    Scenario {
        name: "no_retry_post",
        what: "non-idempotent POSTs, never retried",
        retry: Retry::Never,
        shape: Shape {
            method: "POST",
            long_every: 0,
            long_ms: (0, 0),
            numbered: false,
        },
        registry_lag: Duration::from_secs(2),
        killed: false,
        balancer: false,
        providers: 3,
        scale_down_by: 0,
        fronts: false,
    },
    Scenario {
        name: "slow_registry",
        what: "registry lag 6 s, longer than the short sleep",
        retry: Retry::Shipped,
        shape: Shape {
            method: "GET",
            long_every: 0,
            long_ms: (0, 0),
            numbered: false,
        },
        registry_lag: Duration::from_secs(6),
        killed: false,
        balancer: false,
        providers: 3,
        scale_down_by: 0,
        fronts: false,
    },
    Scenario {
        name: "killed",
        what: "a provider's sidecar and app SIGKILLed (OOM kill, node loss), Istio's default retry policy",
        retry: Retry::Istio,
        shape: Shape {
            method: "GET",
            long_every: 0,
            long_ms: (0, 0),
            numbered: false,
        },
        registry_lag: Duration::from_secs(2),
        killed: true,
        balancer: false,
        providers: 3,
        scale_down_by: 0,
        fronts: false,
    },
    Scenario {
        name: "keepalive_clients",
        what: "callers without graceful_consumer on keep-alive connections through an L4 balancer, no retries",
        retry: Retry::Never,
        shape: Shape {
            method: "GET",
            long_every: 0,
            long_ms: (0, 0),
            numbered: false,
        },
        registry_lag: Duration::from_secs(2),
        killed: false,
        balancer: true,
        providers: 3,
        scale_down_by: 0,
        fronts: false,
    },
    Scenario {
        name: "scale_down",
        what: "four providers, three leave at once and do not come back, Istio's default retry policy",
        retry: Retry::Istio,
        shape: Shape {
            method: "GET",
            long_every: 0,
            long_ms: (0, 0),
            // So each provider's requests after closing split into those
            // the consumer had routed before it saw the mark and the rest.
            numbered: true,
        },
        registry_lag: Duration::from_secs(2),
        killed: false,
        balancer: false,
        providers: 4,
        scale_down_by: 3,
        fronts: false,
    },
    Scenario {
        name: "behind_gateway",
        what: "three backends with no sidecar behind two fronts (as Envoy Gateway's), load through both, 5% of requests taking 2-5 s; a rolling restart with a surge, Envoy Gateway's DRAINING then removal",
        retry: Retry::Istio,
        shape: FRONT_SHAPE,
        registry_lag: Duration::from_secs(2),
        killed: false,
        balancer: false,
        providers: 3,
        scale_down_by: 0,
        fronts: true,
    },
    Scenario {
        name: "behind_gateway_scale_down",
        what: "the same fronts and backends; two of three leave at once and do not come back",
        retry: Retry::Istio,
        shape: FRONT_SHAPE,
        registry_lag: Duration::from_secs(2),
        killed: false,
        balancer: false,
        providers: 3,
        scale_down_by: 2,
        fronts: true,
    },
];

/// Behind the fronts: short GETs, 5% taking 2-5 s (a request in flight at
/// closing that a preStop must wait for, not cut).
const FRONT_SHAPE: Shape = Shape {
    method: "GET",
    long_every: 20,
    long_ms: (2000, 5000),
    numbered: false,
};

/// What a team runs to shut a provider down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Approach {
    Graceful,
    /// The filters with graceful_consumer on the contract's defaults: no
    /// `admin_cluster`, so steering knows the members it saw answer.
    GracefulNoAdmin,
    /// The filters with graceful_drain's `close_connections: "off"`: keep-
    /// alive callers are not told at the connection level.
    GracefulCloseOff,
    Sleep(Duration),
    RegistryOnly,
    /// Plain Envoy where no shutdown runs (the `killed` scenario).
    Plain,
    /// Behind fronts: the filters on the fronts, no preStop (they learn
    /// from Envoy Gateway's `DRAINING` push only).
    NoHook,
    /// Behind fronts: plain fronts and no preStop, Envoy Gateway's
    /// `DRAINING` push alone.
    DrainingOnly,
}

impl Approach {
    pub fn name(self) -> String {
        match self {
            Approach::Graceful => "graceful".into(),
            Approach::GracefulNoAdmin => "graceful_no_admin".into(),
            Approach::GracefulCloseOff => "graceful_close_off".into(),
            Approach::Sleep(d) => format!("sleep_{}s", d.as_secs()),
            Approach::RegistryOnly => "registry_only".into(),
            Approach::Plain => "plain".into(),
            Approach::NoHook => "no_hook".into(),
            Approach::DrainingOnly => "draining_only".into(),
        }
    }

    /// Every approach that applies to `scenario` (the consumer without an
    /// admin cluster in `today`, and in `scale_down`, where what it knows of
    /// the members decides how few hosts are left; elsewhere its membership,
    /// not the scenario, is what differs).
    pub fn all_for(scenario: &Scenario) -> Vec<Approach> {
        if scenario.killed {
            return vec![Approach::Graceful, Approach::Plain];
        }
        if scenario.fronts {
            return vec![
                Approach::Graceful,
                Approach::Sleep(Duration::from_secs(5)),
                Approach::Sleep(Duration::from_secs(15)),
                Approach::DrainingOnly,
                Approach::NoHook,
            ];
        }
        let mut all = vec![Approach::Graceful];
        if scenario.name == "today" || scenario.scale_down_by > 0 {
            all.push(Approach::GracefulNoAdmin);
        }
        if scenario.balancer {
            all.push(Approach::GracefulCloseOff);
        }
        all.extend([
            Approach::Sleep(Duration::from_secs(3)),
            Approach::Sleep(Duration::from_secs(15)),
            Approach::RegistryOnly,
        ]);
        all
    }
}

/// graceful_drain's configuration in the demo: the defaults but a step
/// timeout that outlasts the longest request the demo sends (6 s), as an
/// operator sets it for such a workload (the gate passes at quiet anyway).
pub const DRAIN_CONFIG: &str = r#"{"admin_cluster":"envoy_admin","step_timeout":"8s"}"#;

/// One cell: the run's configuration and mode.
pub fn cell(
    base: &DemoConfig,
    scenario: &Scenario,
    approach: Approach,
    protocol: Protocol,
) -> (DemoConfig, Mode) {
    let mut config = base.clone();
    // Each cell's logs, EDS and samples in a folder of its own.
    config.work_dir = base
        .work_dir
        .join(format!("{}-{}-{protocol:?}", scenario.name, approach.name()).to_lowercase());
    config.protocol = protocol;
    config.retry = scenario.retry;
    config.shape = if protocol == Protocol::Grpc {
        Shape::default()
    } else {
        scenario.shape
    };
    config.registry_lag = scenario.registry_lag;
    config.balancer = scenario.balancer;
    config.providers = scenario.providers;
    config.scale_down_by = scenario.scale_down_by;
    config.fronts = scenario.fronts;
    if scenario.shape.long_every > 0 {
        // Long requests hold a connection each: enough of them for the
        // open-loop rate (5% of 500/s × 4 s ≈ 100 at once).
        config.connections = config.connections.max(160);
    }
    if scenario.fronts {
        let mode = front_mode(&mut config, approach);
        return (config, mode);
    }
    let mode = match (approach, scenario.killed) {
        (Approach::Graceful, false) => Mode::Graceful,
        (Approach::GracefulNoAdmin, _) => {
            config.consumer_config = "{}".into();
            Mode::Graceful
        }
        (Approach::GracefulCloseOff, _) => {
            let json = config.drain_config.trim_end();
            let open = json.strip_suffix('}').unwrap_or(json);
            config.drain_config = format!(r#"{open},"close_connections":"off"}}"#);
            Mode::Graceful
        }
        (Approach::Graceful, true) => Mode::Killed,
        (Approach::Sleep(d), _) => {
            config.baseline_sleep = d;
            Mode::Baseline
        }
        (Approach::RegistryOnly, _) => Mode::RegistryOnly,
        (Approach::Plain, _) => Mode::KilledBaseline,
        (Approach::NoHook | Approach::DrainingOnly, _) => Mode::RegistryOnly,
    };
    (config, mode)
}

/// The mode of an approach behind fronts (`super::fronts`).
fn front_mode(config: &mut DemoConfig, approach: Approach) -> Mode {
    match approach {
        Approach::Sleep(d) => {
            config.baseline_sleep = d;
            Mode::FrontSleep
        }
        Approach::DrainingOnly | Approach::RegistryOnly | Approach::Plain => {
            Mode::FrontDrainingOnly
        }
        Approach::NoHook => Mode::FrontNoHook,
        Approach::Graceful | Approach::GracefulNoAdmin | Approach::GracefulCloseOff => {
            Mode::FrontHook
        }
    }
}

pub fn scenario(name: &str) -> Option<&'static Scenario> {
    SCENARIOS.iter().find(|s| s.name == name)
}
