//! Every Envoy metric the filters define, in one registry beside
//! [`crate::shared::keys`]: its name (the contract's), its kind, the filter that
//! writes it and the filters that read it. No glue spells a metric name:
//! each defines [`Metric::defined_by`] its filter and addresses metrics by
//! [`Metric`].
//!
//! A delivery that reads metrics through Envoy (proxy-wasm: `get_metric`)
//! defines what its filter writes and what it reads; one that keeps the
//! values itself ([`AtomicMetrics`], the native module) defines only what
//! its filter writes, as mirrors.

use std::sync::atomic::{AtomicI64, Ordering::SeqCst};

use crate::shared::keys::Owner;

/// Counter or gauge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

/// One metric of the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Metric {
    /// Inbound requests in flight (the gate's, [`crate::shared::gate`]).
    ProviderInflight,
    /// Inbound requests admitted.
    ProviderStarted,
    /// Responses that carried the closing mark.
    ProviderClosingMarked,
    /// Requests answered with the marked 503 once drained.
    ProviderRejected,
    /// 0 serving, 1 closing, 2 drained: the provider reads it per response.
    DrainPhase,
    /// > 0 once the gate passed (or while a copy tries to pass it).
    DrainGate,
    /// Gate passes forced by a timeout.
    DrainForced,
    /// `on_drained` calls that failed or could not be sent.
    DrainCallbackFailed,
    /// Shutdowns whose gate passed quiet.
    DrainPassedQuiet,
    /// Shutdowns whose gate `step_timeout` forced.
    DrainPassedStepTimeout,
    /// Shutdowns whose gate the overall `timeout` forced.
    DrainPassedTimeout,
    /// Callers still sending after `consumer_update_wait` (the report's
    /// peers whose last request came later).
    DrainLatePeers,
    /// The last shutdown's closing-to-pass time in ms (the report's
    /// `drained_after_ms`), set at the pass.
    DrainDrainedAfterMs,
    /// Outbound requests in flight (read by the drain gate).
    ConsumerInflight,
    /// Outbound requests started (the drain's quiet window).
    ConsumerStarted,
    /// Live tombstones.
    ConsumerTombstones,
    /// Size of the shared tombstone list.
    ConsumerTombstoneBytes,
    ConsumerEvictions,
    /// Requests whose override header the host accepted.
    ConsumerSteered,
    ConsumerReadmitted,
    /// The change signal: bumped after every shared write the other copies
    /// must see ([`crate::consumer::decisions`]).
    ConsumerGeneration,
    /// The front role's hosts not serving (its table's entries).
    FrontClosing,
    /// Hosts the front acknowledged (nothing of this Envoy's in flight).
    FrontAcknowledged,
    /// Attempts seen at a host after its acknowledgement.
    FrontLate,
    /// Front endpoint requests refused (untrusted peer, not a member,
    /// another host's address).
    FrontRefused,
    /// The grace count's epoch (docs/design/front-proxy-drain.md §3):
    /// advanced by a steering once the older slot reads 0.
    FrontEpoch,
    /// Requests of the listener instance between their request headers
    /// and their response headers (or end), by the epoch's parity at
    /// their start: slot 0.
    FrontAwaiting0,
    /// The same, slot 1.
    FrontAwaiting1,
}

use Kind::{Counter, Gauge};
use Owner::{Consumer, Drain, Provider};

impl Metric {
    pub const ALL: [Metric; 28] = [
        Metric::ProviderInflight,
        Metric::ProviderStarted,
        Metric::ProviderClosingMarked,
        Metric::ProviderRejected,
        Metric::DrainPhase,
        Metric::DrainGate,
        Metric::DrainForced,
        Metric::DrainCallbackFailed,
        Metric::DrainPassedQuiet,
        Metric::DrainPassedStepTimeout,
        Metric::DrainPassedTimeout,
        Metric::DrainLatePeers,
        Metric::DrainDrainedAfterMs,
        Metric::ConsumerInflight,
        Metric::ConsumerStarted,
        Metric::ConsumerTombstones,
        Metric::ConsumerTombstoneBytes,
        Metric::ConsumerEvictions,
        Metric::ConsumerSteered,
        Metric::ConsumerReadmitted,
        Metric::ConsumerGeneration,
        Metric::FrontClosing,
        Metric::FrontAcknowledged,
        Metric::FrontLate,
        Metric::FrontRefused,
        Metric::FrontEpoch,
        Metric::FrontAwaiting0,
        Metric::FrontAwaiting1,
    ];

    /// Its place in [`Metric::ALL`] (for tables indexed by metric).
    pub fn index(self) -> usize {
        self as usize
    }

    /// (name, kind, writer, readers).
    fn entry(self) -> (&'static str, Kind, Owner, &'static [Owner]) {
        match self {
            Metric::ProviderInflight => ("graceful_provider_inflight", Gauge, Provider, &[Drain]),
            Metric::ProviderStarted => ("graceful_provider_started", Counter, Provider, &[Drain]),
            Metric::ProviderClosingMarked => {
                ("graceful_provider_closing_marked", Counter, Provider, &[])
            }
            Metric::ProviderRejected => ("graceful_provider_rejected", Counter, Provider, &[]),
            Metric::DrainPhase => ("graceful_drain_phase", Gauge, Drain, &[Provider]),
            Metric::DrainGate => ("graceful_drain_gate", Gauge, Drain, &[Provider]),
            Metric::DrainForced => ("graceful_drain_forced", Counter, Drain, &[]),
            Metric::DrainCallbackFailed => ("graceful_drain_callback_failed", Counter, Drain, &[]),
            Metric::DrainPassedQuiet => ("graceful_drain_passed_quiet", Counter, Drain, &[]),
            Metric::DrainPassedStepTimeout => {
                ("graceful_drain_passed_step_timeout", Counter, Drain, &[])
            }
            Metric::DrainPassedTimeout => ("graceful_drain_passed_timeout", Counter, Drain, &[]),
            Metric::DrainLatePeers => ("graceful_drain_late_peers", Gauge, Drain, &[]),
            Metric::DrainDrainedAfterMs => ("graceful_drain_drained_after_ms", Gauge, Drain, &[]),
            Metric::ConsumerInflight => ("graceful_consumer_inflight", Gauge, Consumer, &[Drain]),
            Metric::ConsumerStarted => ("graceful_consumer_started", Counter, Consumer, &[Drain]),
            Metric::ConsumerTombstones => ("graceful_consumer_tombstones", Gauge, Consumer, &[]),
            Metric::ConsumerTombstoneBytes => {
                ("graceful_consumer_tombstone_bytes", Gauge, Consumer, &[])
            }
            Metric::ConsumerEvictions => ("graceful_consumer_evictions", Counter, Consumer, &[]),
            Metric::ConsumerSteered => ("graceful_consumer_steered", Counter, Consumer, &[]),
            Metric::ConsumerReadmitted => ("graceful_consumer_readmitted", Counter, Consumer, &[]),
            Metric::ConsumerGeneration => ("graceful_consumer_generation", Counter, Consumer, &[]),
            // The front role's: graceful_consumer's, defined with its other
            // metrics (before its config is read, so whether or not `front`
            // is configured).
            Metric::FrontClosing => ("graceful_front_closing", Gauge, Consumer, &[]),
            Metric::FrontAcknowledged => ("graceful_front_acknowledged", Counter, Consumer, &[]),
            Metric::FrontLate => ("graceful_front_late", Counter, Consumer, &[]),
            Metric::FrontRefused => ("graceful_front_refused", Counter, Consumer, &[]),
            Metric::FrontEpoch => ("graceful_front_epoch", Counter, Consumer, &[]),
            Metric::FrontAwaiting0 => ("graceful_front_awaiting_0", Gauge, Consumer, &[]),
            Metric::FrontAwaiting1 => ("graceful_front_awaiting_1", Gauge, Consumer, &[]),
        }
    }

    /// The Envoy stat name (under `wasmcustom.`), fixed by the contract.
    pub fn name(self) -> &'static str {
        self.entry().0
    }

    pub fn kind(self) -> Kind {
        self.entry().1
    }

    /// The filter that writes it.
    pub fn owner(self) -> Owner {
        self.entry().2
    }

    /// The other filters that read it (on the same Envoy).
    pub fn readers(self) -> &'static [Owner] {
        self.entry().3
    }

    /// The metrics `filter` defines: those it writes, and with `reads`
    /// those it reads through the host too.
    pub fn defined_by(filter: Owner, reads: bool) -> impl Iterator<Item = Metric> {
        Metric::ALL
            .into_iter()
            .filter(move |m| m.owner() == filter || (reads && m.readers().contains(&filter)))
    }
}

/// The metrics as sequentially consistent atomics, one per [`Metric`]:
/// the native module's values (Envoy's stats are such atomics too), the
/// Envoy stats then being mirrors. Gauges never read below 0.
pub struct AtomicMetrics {
    values: [AtomicI64; Metric::ALL.len()],
}

impl AtomicMetrics {
    pub const fn new() -> AtomicMetrics {
        #[allow(clippy::declare_interior_mutable_const)]
        const ZERO: AtomicI64 = AtomicI64::new(0);
        AtomicMetrics {
            values: [ZERO; Metric::ALL.len()],
        }
    }

    pub fn metric_add(&self, m: Metric, delta: i64) {
        self.values[m.index()].fetch_add(delta, SeqCst);
    }

    pub fn metric_set(&self, m: Metric, value: u64) {
        self.values[m.index()].store(i64::try_from(value).unwrap_or(i64::MAX), SeqCst);
    }

    pub fn value(&self, m: Metric) -> u64 {
        u64::try_from(self.values[m.index()].load(SeqCst)).unwrap_or(0)
    }
}

impl Default for AtomicMetrics {
    fn default() -> Self {
        AtomicMetrics::new()
    }
}

impl Metrics for AtomicMetrics {
    fn add(&self, metric: Metric, delta: i64) {
        self.metric_add(metric, delta);
    }

    fn get(&self, metric: Metric) -> Option<u64> {
        Some(self.value(metric))
    }
}

impl PhaseGauge for AtomicMetrics {
    fn get(&self) -> Option<u64> {
        Some(self.value(Metric::DrainPhase))
    }

    fn set(&self, value: u64) {
        self.metric_set(Metric::DrainPhase, value);
    }
}

/// The metrics as process-wide atomics, as the gate's protocol
/// ([`crate::shared::gate`]) reads and writes them: Envoy's stats through
/// hostcalls ([`crate::shared::host::HostMetrics`]), or [`AtomicMetrics`]
/// (tests, the native module).
pub trait Metrics {
    /// Adds `delta` (may be negative for gauges).
    fn add(&self, metric: Metric, delta: i64);
    /// The current value; None if the host cannot say.
    fn get(&self, metric: Metric) -> Option<u64>;
}

/// The `graceful_drain_phase` gauge, which graceful_provider reads on every
/// response.
pub trait PhaseGauge {
    fn get(&self) -> Option<u64>;
    fn set(&self, value: u64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_is_in_order_with_unique_contract_names() {
        for (i, m) in Metric::ALL.iter().enumerate() {
            assert_eq!(m.index(), i, "{m:?}");
            assert!(m.name().starts_with("graceful_"), "{m:?}");
            assert!(
                Metric::ALL[..i].iter().all(|o| o.name() != m.name()),
                "{} twice",
                m.name()
            );
        }
    }

    #[test]
    fn each_filter_defines_what_it_writes_and_what_it_reads() {
        let names =
            |f, reads| -> Vec<&str> { Metric::defined_by(f, reads).map(Metric::name).collect() };
        assert_eq!(
            names(Provider, true),
            [
                "graceful_provider_inflight",
                "graceful_provider_started",
                "graceful_provider_closing_marked",
                "graceful_provider_rejected",
                "graceful_drain_phase",
                "graceful_drain_gate",
            ]
        );
        assert_eq!(
            names(Drain, true),
            [
                "graceful_provider_inflight",
                "graceful_provider_started",
                "graceful_drain_phase",
                "graceful_drain_gate",
                "graceful_drain_forced",
                "graceful_drain_callback_failed",
                "graceful_drain_passed_quiet",
                "graceful_drain_passed_step_timeout",
                "graceful_drain_passed_timeout",
                "graceful_drain_late_peers",
                "graceful_drain_drained_after_ms",
                "graceful_consumer_inflight",
                "graceful_consumer_started",
            ]
        );
        assert_eq!(names(Consumer, true), names(Consumer, false));
        assert_eq!(names(Consumer, false).len(), 15);
        assert_eq!(
            names(Consumer, false)[8..],
            [
                "graceful_front_closing",
                "graceful_front_acknowledged",
                "graceful_front_late",
                "graceful_front_refused",
                "graceful_front_epoch",
                "graceful_front_awaiting_0",
                "graceful_front_awaiting_1",
            ]
        );
        assert_eq!(
            names(Drain, false),
            [
                "graceful_drain_phase",
                "graceful_drain_gate",
                "graceful_drain_forced",
                "graceful_drain_callback_failed",
                "graceful_drain_passed_quiet",
                "graceful_drain_passed_step_timeout",
                "graceful_drain_passed_timeout",
                "graceful_drain_late_peers",
                "graceful_drain_drained_after_ms",
            ]
        );
    }

    #[test]
    fn the_gate_metrics_are_of_the_kinds_the_gate_assumes() {
        for (metric, kind) in [
            (Metric::ProviderInflight, Gauge),
            (Metric::ProviderStarted, Counter),
            (Metric::DrainGate, Gauge),
            (Metric::ConsumerInflight, Gauge),
            (Metric::ConsumerStarted, Counter),
        ] {
            assert_eq!(metric.kind(), kind, "{metric:?}");
        }
    }

    #[test]
    fn atomic_gauges_never_read_below_zero() {
        let m = AtomicMetrics::new();
        m.metric_add(Metric::ProviderInflight, -1);
        assert_eq!(m.value(Metric::ProviderInflight), 0);
        m.metric_add(Metric::ProviderInflight, 2);
        assert_eq!(Metrics::get(&m, Metric::ProviderInflight), Some(1));
        PhaseGauge::set(&m, 2);
        assert_eq!(PhaseGauge::get(&m), Some(2));
    }
}
