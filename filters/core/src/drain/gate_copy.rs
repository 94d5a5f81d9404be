//! One graceful_drain copy's evaluation of the drain gate, the same for
//! every delivery: a wasm VM copy on its tick, the native module on its
//! timer. The copy reads the instance record and the traffic stats, and
//! when the record's timings allow a pass it raises the gate
//! ([`crate::shared::gate::GateHold`]) and then records the pass with CAS
//! ([`crate::drain::record::pass`]), so exactly one copy reports it.
//!
//! | record phase | traffic | does |
//! |---|---|---|
//! | serving | any | nothing |
//! | closing | timings allow no pass yet | nothing |
//! | closing | quiet pass allowed | `try_pass`: gate up unless a request moved; then the record |
//! | closing | step timeout (no `longest_request`) or timeout | gate up (forced); then the record |
//! | closing | step timeout ran out, `longest_request` set, not quiet | gate up (admission stops, no pass); then the record's `admission_stopped`, so one copy logs it |
//! | closing, admission stopped | gate stat reads 0 (stats made again) | puts its 1 back |
//! | drained | gate stat reads 0 (stats made again) | puts its 1 back |
//! | drained | otherwise | nothing |
//!
//! Every evaluation also raises `graceful_drain_phase` to the record's
//! phase (it only moves forward).

use crate::drain::config::DrainConfig;
use crate::drain::record::{self, GatePass, InstanceRecord, Phase, Seen};
use crate::drain::status::Status;
use crate::shared::gate::{GateHold, StartWatch, Traffic};
use crate::shared::metrics::{Metric, Metrics, PhaseGauge};
use crate::shared::store::{SharedStore, UpdateError};

/// Sets the phase gauge if `phase` is further along. The phase only moves
/// forward, so a copy that read the record before another moved it cannot
/// set it back, except by a read-then-write race, which the next
/// evaluation heals.
pub fn raise_phase(gauge: &dyn PhaseGauge, phase: Phase) {
    if gauge.get().is_none_or(|p| p < phase.gauge()) {
        gauge.set(phase.gauge());
    }
}

/// What one evaluation saw: the record after it, the traffic, and the
/// latest start this copy knows of.
#[derive(Debug, Clone, Copy)]
pub struct Evaluation {
    pub rec: InstanceRecord,
    pub traffic: Traffic,
    pub last_start_us: u64,
    /// This copy's write stopped admission (at most one copy per Envoy).
    pub stopped_admitting: Option<StoppedAdmitting>,
}

/// Admission stopped at this evaluation (`longest_request` set): for the
/// one log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoppedAdmitting {
    pub closing_ms: u64,
    /// In flight then (inbound, outbound): waited for until `timeout`.
    pub inflight: (u64, u64),
}

impl StoppedAdmitting {
    /// The log line (warn: callers ignored the closing mark that long).
    pub fn line(&self, timeout_ms: u64) -> String {
        let (inbound, outbound) = self.inflight;
        format!(
            "drain: admission stopped after {} ms closing (step_timeout ran out, longest_request set): new requests get the marked 503; {inbound} inbound, {outbound} outbound in flight are waited for until timeout ({timeout_ms} ms)",
            self.closing_ms
        )
    }
}

impl Evaluation {
    pub fn status(&self, now_us: u64) -> Status {
        Status::new(&self.rec, &self.traffic, self.last_start_us, now_us)
    }
}

/// The pass this copy recorded, for its one log line and counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Passed {
    pub why: GatePass,
    pub closing_ms: u64,
    /// In flight when a forced pass was made (inbound, outbound).
    pub inflight: (u64, u64),
}

impl Passed {
    pub fn forced(&self) -> bool {
        self.why.forced()
    }

    /// The log line (info when quiet, warn when forced).
    pub fn line(&self) -> String {
        let ms = self.closing_ms;
        match self.why {
            GatePass::Quiet => format!("drain gate passed after {ms} ms closing: quiet"),
            GatePass::StepTimeout | GatePass::Timeout => {
                let (inbound, outbound) = self.inflight;
                format!(
                    "drain gate forced after {ms} ms closing by {}: {inbound} inbound, {outbound} outbound still in flight",
                    self.why.forced_by().unwrap_or_default(),
                )
            }
        }
    }
}

/// This copy's part in the drain gate: when it last saw a request start,
/// and its own 1 in `graceful_drain_gate`.
#[derive(Debug, Default)]
pub struct GateCopy {
    starts: StartWatch,
    hold: GateHold,
}

impl GateCopy {
    /// The record with the traffic as this copy sees it now, no gate
    /// evaluation (the answer to a closing POST, and step one of
    /// [`GateCopy::advance`]).
    pub fn look(&mut self, metrics: &dyn Metrics, rec: InstanceRecord, now_us: u64) -> Evaluation {
        let traffic = Traffic::read(metrics);
        let last_start_us = self.starts.observe(traffic.started, now_us);
        Evaluation {
            rec,
            traffic,
            last_start_us,
            stopped_admitting: None,
        }
    }

    /// Evaluates the gate now (the table above); `Some` if this copy made
    /// and recorded the pass.
    pub fn advance(
        &mut self,
        store: &dyn SharedStore,
        metrics: &dyn Metrics,
        phase: &dyn PhaseGauge,
        config: &DrainConfig,
        now_us: u64,
    ) -> Result<(Evaluation, Option<Passed>), UpdateError> {
        let rec = record::read(store)?;
        let mut out = self.look(metrics, rec, now_us);
        let traffic = out.traffic;
        raise_phase(phase, rec.phase);
        match rec.phase {
            Phase::Serving => return Ok((out, None)),
            Phase::Drained => {
                if metrics.get(Metric::DrainGate) == Some(0) {
                    self.hold.hold_again(metrics);
                }
                return Ok((out, None));
            }
            Phase::Closing => {}
        }
        if rec.admission_stopped && metrics.get(Metric::DrainGate) == Some(0) {
            self.hold.hold_again(metrics);
        }
        let seen = Seen {
            idle: traffic.idle(),
            last_start_us: out.last_start_us,
        };
        let Some(why) = rec.evaluate(&config.gate, &seen, now_us).1 else {
            if rec.stops_admitting(&config.gate, &seen, now_us) {
                // Up before it is recorded: a copy that reads the record
                // stopped finds the gate up too.
                self.hold.hold(metrics);
                if !rec.admission_stopped {
                    let (rec, mine) = record::stop_admitting(store)?;
                    out.rec = rec;
                    out.stopped_admitting = mine.then(|| StoppedAdmitting {
                        closing_ms: now_us.saturating_sub(rec.closing_since_us) / 1000,
                        inflight: traffic.inflight(),
                    });
                }
            }
            return Ok((out, None));
        };
        let up = match why {
            GatePass::Quiet => self.hold.try_pass(metrics, &traffic),
            GatePass::StepTimeout | GatePass::Timeout => {
                self.hold.hold(metrics);
                true
            }
        };
        if !up {
            // A request slipped in between the look and the gate: next time.
            return Ok((out, None));
        }
        let (rec, mine) = record::pass(store, why, now_us)?;
        out.rec = rec;
        raise_phase(phase, rec.phase);
        if !mine {
            return Ok((out, None));
        }
        Ok((
            out,
            Some(Passed {
                why,
                closing_ms: now_us.saturating_sub(rec.closing_since_us) / 1000,
                inflight: traffic.inflight(),
            }),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::metrics::AtomicMetrics;
    use crate::shared::store::MemStore;

    const S: u64 = 1_000_000;

    fn config() -> DrainConfig {
        DrainConfig::from_json(
            br#"{"consumer_update_wait":"3s","quiet_window":"500ms","step_timeout":"3s"}"#,
        )
        .unwrap()
    }

    #[test]
    fn serving_passes_nothing_and_keeps_the_phase_at_zero() {
        let (store, metrics) = (MemStore::new(), AtomicMetrics::new());
        let (eval, passed) = GateCopy::default()
            .advance(&store, &metrics, &metrics, &config(), 10 * S)
            .unwrap();
        assert_eq!((eval.rec.phase, passed), (Phase::Serving, None));
        assert_eq!(
            (
                metrics.value(Metric::DrainPhase),
                Metrics::get(&metrics, Metric::DrainGate)
            ),
            (0, Some(0))
        );
    }

    #[test]
    fn one_copy_records_a_quiet_pass_and_every_copy_sees_drained() {
        let (store, metrics) = (MemStore::new(), AtomicMetrics::new());
        let cfg = config();
        record::start_closing(&store, 100 * S).unwrap();
        let (mut a, mut b) = (GateCopy::default(), GateCopy::default());
        // Before consumer_update_wait: nothing, but the phase says closing.
        let (_, passed) = a
            .advance(&store, &metrics, &metrics, &cfg, 101 * S)
            .unwrap();
        assert_eq!((passed, metrics.value(Metric::DrainPhase)), (None, 1));
        let (eval, passed) = a
            .advance(&store, &metrics, &metrics, &cfg, 104 * S)
            .unwrap();
        let passed = passed.unwrap();
        assert_eq!((passed.why, passed.closing_ms), (GatePass::Quiet, 4000));
        assert!(!passed.forced() && passed.line().contains("quiet"));
        assert_eq!(
            (eval.rec.phase, metrics.value(Metric::DrainPhase)),
            (Phase::Drained, 2)
        );
        assert_eq!(Metrics::get(&metrics, Metric::DrainGate), Some(1));
        // Another copy only sees it: no second report, no second 1.
        let (eval, passed) = b
            .advance(&store, &metrics, &metrics, &cfg, 104 * S)
            .unwrap();
        assert_eq!((eval.rec.phase, passed), (Phase::Drained, None));
        assert_eq!(Metrics::get(&metrics, Metric::DrainGate), Some(1));
    }

    #[test]
    fn a_request_in_flight_holds_the_gate_until_the_step_timeout_forces_it() {
        let (store, metrics) = (MemStore::new(), AtomicMetrics::new());
        let cfg = config();
        record::start_closing(&store, 100 * S).unwrap();
        assert_eq!(
            crate::shared::gate::admit(&metrics, true, &Default::default()),
            crate::shared::gate::Admission::Admitted
        );
        let mut copy = GateCopy::default();
        let (_, passed) = copy
            .advance(&store, &metrics, &metrics, &cfg, 105 * S)
            .unwrap();
        assert_eq!(passed, None, "not quiet: one in flight");
        let (_, passed) = copy
            .advance(&store, &metrics, &metrics, &cfg, 106 * S)
            .unwrap();
        let passed = passed.unwrap();
        assert_eq!(
            (passed.why, passed.inflight),
            (GatePass::StepTimeout, (1, 0))
        );
        assert!(passed.forced() && passed.line().contains("step_timeout: 1 inbound"));
    }

    #[test]
    fn with_longest_request_the_step_timeout_stops_admission_and_the_gate_passes_quiet_once_the_long_request_ends(
    ) {
        let (store, metrics) = (MemStore::new(), AtomicMetrics::new());
        let cfg = DrainConfig::from_json(
            br#"{"consumer_update_wait":"3s","quiet_window":"500ms","step_timeout":"3s","longest_request":"30s"}"#,
        )
        .unwrap();
        let admit = || crate::shared::gate::admit(&metrics, true, &Default::default());
        record::start_closing(&store, 100 * S).unwrap();
        assert_eq!(admit(), crate::shared::gate::Admission::Admitted);
        let (mut a, mut b) = (GateCopy::default(), GateCopy::default());
        let (eval, passed) = a
            .advance(&store, &metrics, &metrics, &cfg, 105 * S)
            .unwrap();
        assert_eq!(
            (passed, eval.stopped_admitting),
            (None, None),
            "not quiet: one in flight"
        );
        assert_eq!(
            admit(),
            crate::shared::gate::Admission::Admitted,
            "before wait + step"
        );
        // wait + step_timeout (6 s) ran out, two in flight: admission
        // stops, nothing passes; one copy records and reports it.
        let (eval, passed) = a
            .advance(&store, &metrics, &metrics, &cfg, 106 * S)
            .unwrap();
        assert_eq!(passed, None, "in flight: waited for");
        assert_eq!(
            eval.stopped_admitting,
            Some(StoppedAdmitting {
                closing_ms: 6000,
                inflight: (2, 0)
            })
        );
        assert!(eval.rec.admission_stopped && eval.rec.phase == Phase::Closing);
        assert!(eval
            .stopped_admitting
            .unwrap()
            .line(60_000)
            .contains("2 inbound"));
        let (eval, _) = b
            .advance(&store, &metrics, &metrics, &cfg, 106 * S)
            .unwrap();
        assert_eq!(eval.stopped_admitting, None, "logged once");
        // A late arrival is refused; those in flight go on.
        assert_eq!(admit(), crate::shared::gate::Admission::Rejected);
        assert_eq!(metrics.value(Metric::ProviderInflight), 2);
        let (_, passed) = a
            .advance(&store, &metrics, &metrics, &cfg, 120 * S)
            .unwrap();
        assert_eq!(passed, None, "still in flight at 20 s");
        // They end: quiet once the window passed, not forced.
        crate::shared::gate::finish(&metrics);
        crate::shared::gate::finish(&metrics);
        let (_, passed) = b
            .advance(&store, &metrics, &metrics, &cfg, 121 * S)
            .unwrap();
        assert_eq!(passed.map(|p| p.why), Some(GatePass::Quiet));
        assert_eq!(admit(), crate::shared::gate::Admission::Rejected, "drained");
    }

    #[test]
    fn a_stopped_admission_whose_gate_stat_was_made_again_is_put_back() {
        let (store, metrics) = (MemStore::new(), AtomicMetrics::new());
        record::start_closing(&store, 0).unwrap();
        record::stop_admitting(&store).unwrap();
        let mut copy = GateCopy::default();
        let _ = copy
            .advance(&store, &metrics, &metrics, &config(), S)
            .unwrap();
        assert_eq!(Metrics::get(&metrics, Metric::DrainGate), Some(1));
    }
}
