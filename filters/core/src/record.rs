//! The instance record: one shared-data value holding the shutdown phase and
//! the inbound request counters, so that admitting a request and passing the
//! drain gate are decided on the same atomic value. Consequences: no request
//! is admitted after the gate has passed (when rejecting is on), and an
//! unforced pass happens only on a value that says nothing is in flight.
//!
//! # Transition table
//!
//! `elapsed` = now − closing_since; `quiet` = nothing in flight (inbound and
//! outbound) and no request started within `quiet_window`.
//!
//! | phase    | event                  | condition                              | next phase / effect                          |
//! |----------|------------------------|----------------------------------------|----------------------------------------------|
//! | serving  | admit                  |                                        | serving, inflight + 1, last_start = now      |
//! | closing  | admit                  |                                        | closing, inflight + 1, last_start = now      |
//! | drained  | admit                  | reject_when_drained                    | drained, request rejected, nothing written   |
//! | drained  | admit                  | not reject_when_drained                | drained, inflight + 1, last_start = now      |
//! | any      | finish                 |                                        | same phase, inflight − 1 (never below 0)     |
//! | serving  | start closing          |                                        | closing, closing_since = now                 |
//! | closing  | start closing          |                                        | closing (idempotent)                         |
//! | drained  | start closing          |                                        | drained (idempotent)                         |
//! | closing  | evaluate gate          | elapsed ≥ consumer_update_wait, quiet  | drained, forced = false                      |
//! | closing  | evaluate gate          | elapsed ≥ timeout, not quiet           | drained, forced = true (overall timeout)     |
//! | closing  | evaluate gate          | elapsed ≥ wait + step_timeout, !quiet  | drained, forced = true (step timeout)        |
//! | closing  | evaluate gate          | otherwise                              | closing                                      |
//! | serving  | evaluate gate          |                                        | serving                                      |
//! | drained  | evaluate gate          |                                        | drained                                      |
//!
//! Closing is one-way for the life of the shared-data namespace (the Envoy
//! process): a shutting-down instance does not come back, a new one does.

use std::time::Duration;

use crate::store::{update, SharedStore, StoreError, UpdateError};
use crate::traffic::Traffic;

/// Shared-data key of the instance record.
pub const RECORD_KEY: &str = crate::keys::RECORD.name;

/// Encoded size of [`InstanceRecord`].
pub const RECORD_LEN: usize = 40;
const RECORD_VERSION: u8 = 1;

/// Where the instance is in its shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Phase {
    #[default]
    Serving,
    Closing,
    Drained,
}

impl Phase {
    /// The value of the `graceful_drain_phase` gauge.
    pub fn gauge(self) -> u64 {
        match self {
            Phase::Serving => 0,
            Phase::Closing => 1,
            Phase::Drained => 2,
        }
    }

    /// The name used in the status JSON.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Serving => "serving",
            Phase::Closing => "closing",
            Phase::Drained => "drained",
        }
    }

    fn from_byte(b: u8) -> Option<Phase> {
        match b {
            0 => Some(Phase::Serving),
            1 => Some(Phase::Closing),
            2 => Some(Phase::Drained),
            _ => None,
        }
    }

    /// True once closing has started (closing or drained): responses get
    /// the closing mark.
    pub fn is_closing(self) -> bool {
        self != Phase::Serving
    }
}

/// The drain gate's timings (from the drain filter's config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateTimings {
    pub consumer_update_wait: Duration,
    pub quiet_window: Duration,
    pub step_timeout: Duration,
    pub timeout: Duration,
}

/// Why the gate passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatePass {
    /// Nothing in flight and nothing started within the quiet window.
    Quiet,
    /// `step_timeout` after `consumer_update_wait` ran out (forced).
    StepTimeout,
    /// The overall `timeout` ran out (forced).
    Timeout,
}

impl GatePass {
    pub fn forced(self) -> bool {
        self != GatePass::Quiet
    }
}

/// What [`InstanceRecord::admit`] decided for a new request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Admitted,
    /// The gate has passed: answer 503 with the closing mark.
    Rejected,
}

/// Shutdown phase plus inbound traffic, stored under [`RECORD_KEY`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InstanceRecord {
    pub phase: Phase,
    /// True when a timeout, not quiet, passed the gate.
    pub forced: bool,
    /// When closing started (µs since the epoch); 0 while serving.
    pub closing_since_us: u64,
    /// When the gate passed (µs since the epoch); 0 before.
    pub drained_at_us: u64,
    /// Inbound requests (the provider filter's count).
    pub inbound: Traffic,
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl InstanceRecord {
    /// Admission of a request starting at `now_us`.
    pub fn admit(self, now_us: u64, reject_when_drained: bool) -> (InstanceRecord, Admission) {
        if self.phase == Phase::Drained && reject_when_drained {
            return (self, Admission::Rejected);
        }
        (
            InstanceRecord {
                inbound: self.inbound.started(now_us),
                ..self
            },
            Admission::Admitted,
        )
    }

    /// A counted request ended.
    pub fn finish(self) -> InstanceRecord {
        InstanceRecord {
            inbound: self.inbound.ended(),
            ..self
        }
    }

    /// Starts closing at `now_us`; idempotent once closing.
    pub fn start_closing(self, now_us: u64) -> InstanceRecord {
        match self.phase {
            Phase::Serving => InstanceRecord {
                phase: Phase::Closing,
                closing_since_us: now_us,
                ..self
            },
            Phase::Closing | Phase::Drained => self,
        }
    }

    /// True when nothing is in flight (inbound here, `outbound` given) and
    /// no request started within the quiet window.
    pub fn is_quiet(&self, outbound: &Traffic, quiet_window: Duration, now_us: u64) -> bool {
        let inflight = self.inbound.inflight.saturating_add(outbound.inflight);
        let last_start = self.inbound.last_start_us.max(outbound.last_start_us);
        inflight == 0 && now_us.saturating_sub(last_start) >= micros(quiet_window)
    }

    /// Evaluates the drain gate at `now_us`. Returns the record after the
    /// evaluation and, if the gate passed just now, why.
    pub fn evaluate(
        self,
        gate: &GateTimings,
        outbound: &Traffic,
        now_us: u64,
    ) -> (InstanceRecord, Option<GatePass>) {
        if self.phase != Phase::Closing {
            return (self, None);
        }
        let elapsed = now_us.saturating_sub(self.closing_since_us);
        let waited = elapsed >= micros(gate.consumer_update_wait);
        let pass = if waited && self.is_quiet(outbound, gate.quiet_window, now_us) {
            Some(GatePass::Quiet)
        } else if elapsed >= micros(gate.timeout) {
            Some(GatePass::Timeout)
        } else if elapsed
            >= micros(gate.consumer_update_wait).saturating_add(micros(gate.step_timeout))
        {
            Some(GatePass::StepTimeout)
        } else {
            None
        };
        match pass {
            None => (self, None),
            Some(why) => (
                InstanceRecord {
                    phase: Phase::Drained,
                    forced: why.forced(),
                    drained_at_us: now_us,
                    ..self
                },
                Some(why),
            ),
        }
    }

    /// Fixed layout: version u8, phase u8, flags u8 (bit 0 forced), 5 zero
    /// bytes, then closing_since_us, drained_at_us, inflight, last_start_us
    /// as little-endian u64.
    pub fn encode(&self) -> [u8; RECORD_LEN] {
        let mut out = [0u8; RECORD_LEN];
        out[0] = RECORD_VERSION;
        out[1] = self.phase.gauge() as u8;
        out[2] = u8::from(self.forced);
        out[8..16].copy_from_slice(&self.closing_since_us.to_le_bytes());
        out[16..24].copy_from_slice(&self.drained_at_us.to_le_bytes());
        out[24..40].copy_from_slice(&self.inbound.encode());
        out
    }

    /// None for any value this version did not write.
    pub fn decode(bytes: &[u8]) -> Option<InstanceRecord> {
        let bytes: &[u8; RECORD_LEN] = bytes.try_into().ok()?;
        if bytes[0] != RECORD_VERSION || bytes[2] > 1 || bytes[3..8] != [0; 5] {
            return None;
        }
        let u64_at = |at: usize| bytes.get(at..at + 8).and_then(crate::store::read_u64);
        Some(InstanceRecord {
            phase: Phase::from_byte(bytes[1])?,
            forced: bytes[2] == 1,
            closing_since_us: u64_at(8)?,
            drained_at_us: u64_at(16)?,
            inbound: Traffic::decode(bytes.get(24..)?)?,
        })
    }
}

/// Reads the record; missing reads as a fresh serving record, and so does a
/// malformed one (only something else writing under our vm_id makes one).
pub fn read(store: &dyn SharedStore) -> Result<InstanceRecord, StoreError> {
    Ok(store
        .get(RECORD_KEY)?
        .and_then(|(bytes, _)| InstanceRecord::decode(&bytes))
        .unwrap_or_default())
}

/// Creates the record if it has never been written. Call from the root
/// context at configure time, before any stream can count (see
/// [`crate::store::ensure`]).
pub fn ensure(store: &dyn SharedStore) -> Result<(), StoreError> {
    let (key, value) = initial();
    crate::store::ensure(store, key, &value)
}

/// The record's key and the value it starts from (serving, nothing in
/// flight), for [`crate::store::ensure_all`].
pub fn initial() -> (&'static str, Vec<u8>) {
    (RECORD_KEY, InstanceRecord::default().encode().to_vec())
}

fn modify<T>(
    store: &dyn SharedStore,
    f: impl Fn(InstanceRecord) -> (Option<InstanceRecord>, T),
) -> Result<T, UpdateError> {
    update(store, RECORD_KEY, |bytes| {
        let current = bytes.and_then(InstanceRecord::decode).unwrap_or_default();
        let (next, out) = f(current);
        (
            next.filter(|n| *n != current).map(|n| n.encode().to_vec()),
            out,
        )
    })
}

/// Admits or rejects a request starting at `now_us` (see the table).
pub fn admit(
    store: &dyn SharedStore,
    now_us: u64,
    reject_when_drained: bool,
) -> Result<(Admission, InstanceRecord), UpdateError> {
    modify(store, |r| {
        let (next, admission) = r.admit(now_us, reject_when_drained);
        (Some(next), (admission, next))
    })
}

/// Ends a counted request; returns the record after it.
pub fn finish(store: &dyn SharedStore) -> Result<InstanceRecord, UpdateError> {
    modify(store, |r| {
        let next = r.finish();
        (Some(next), next)
    })
}

/// Starts closing. Returns the record and whether this call started it.
pub fn start_closing(
    store: &dyn SharedStore,
    now_us: u64,
) -> Result<(InstanceRecord, bool), UpdateError> {
    modify(store, |r| {
        let next = r.start_closing(now_us);
        (Some(next), (next, r.phase == Phase::Serving))
    })
}

/// Evaluates the gate and stores a pass. Of all callers racing on the same
/// record, exactly one gets `Some(pass)`: the one whose write made it.
pub fn advance(
    store: &dyn SharedStore,
    gate: &GateTimings,
    outbound: &Traffic,
    now_us: u64,
) -> Result<(InstanceRecord, Option<GatePass>), UpdateError> {
    modify(store, |r| {
        let (next, pass) = r.evaluate(gate, outbound, now_us);
        (pass.map(|_| next), (next, pass))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{MemStore, Versioned};
    use std::cell::Cell;

    const MS: u64 = 1_000;
    const S: u64 = 1_000_000;

    fn gate() -> GateTimings {
        GateTimings {
            consumer_update_wait: Duration::from_secs(3),
            quiet_window: Duration::from_millis(500),
            step_timeout: Duration::from_secs(3),
            timeout: Duration::from_secs(60),
        }
    }

    fn closing_at(t: u64) -> InstanceRecord {
        InstanceRecord::default().start_closing(t)
    }

    const NO_OUTBOUND: Traffic = Traffic {
        inflight: 0,
        last_start_us: 0,
    };

    #[test]
    fn admit_counts_in_every_phase_but_drained() {
        let (r, a) = InstanceRecord::default().admit(10, true);
        assert_eq!(a, Admission::Admitted);
        assert_eq!(
            r.inbound,
            Traffic {
                inflight: 1,
                last_start_us: 10
            }
        );
        let (r, a) = closing_at(0).admit(20, true);
        assert_eq!(a, Admission::Admitted);
        assert_eq!(r.inbound.inflight, 1);
        let drained = InstanceRecord {
            phase: Phase::Drained,
            ..Default::default()
        };
        assert_eq!(drained.admit(30, true), (drained, Admission::Rejected));
        let (r, a) = drained.admit(30, false);
        assert_eq!(
            a,
            Admission::Admitted,
            "reject_when_drained: false keeps serving"
        );
        assert_eq!(r.inbound.inflight, 1);
    }

    #[test]
    fn finish_never_goes_below_zero() {
        assert_eq!(InstanceRecord::default().finish().inbound.inflight, 0);
    }

    #[test]
    fn start_closing_is_idempotent_and_keeps_the_first_time() {
        let r = InstanceRecord::default().start_closing(5 * S);
        assert_eq!((r.phase, r.closing_since_us), (Phase::Closing, 5 * S));
        let again = r.start_closing(9 * S);
        assert_eq!(again, r);
        let drained = InstanceRecord {
            phase: Phase::Drained,
            closing_since_us: 1,
            ..Default::default()
        };
        assert_eq!(drained.start_closing(9 * S), drained);
    }

    #[test]
    fn gate_never_passes_while_serving_or_twice() {
        let (r, pass) = InstanceRecord::default().evaluate(&gate(), &NO_OUTBOUND, 100 * S);
        assert_eq!((r.phase, pass), (Phase::Serving, None));
        let (drained, pass) = closing_at(0).evaluate(&gate(), &NO_OUTBOUND, 3 * S);
        assert_eq!(pass, Some(GatePass::Quiet));
        assert_eq!(
            drained.evaluate(&gate(), &NO_OUTBOUND, 4 * S),
            (drained, None)
        );
    }

    #[test]
    fn gate_waits_consumer_update_wait_even_when_idle() {
        let r = closing_at(10 * S);
        assert_eq!(r.evaluate(&gate(), &NO_OUTBOUND, 10 * S).1, None);
        assert_eq!(r.evaluate(&gate(), &NO_OUTBOUND, 13 * S - 1).1, None);
        let (d, pass) = r.evaluate(&gate(), &NO_OUTBOUND, 13 * S);
        assert_eq!(pass, Some(GatePass::Quiet));
        assert_eq!(
            (d.phase, d.forced, d.drained_at_us),
            (Phase::Drained, false, 13 * S)
        );
    }

    #[test]
    fn gate_waits_for_the_quiet_window_after_the_last_start() {
        // A request started at 2.8 s and ended: quiet from 3.3 s.
        let (r, _) = closing_at(0).admit(2_800 * MS, true);
        let r = r.finish();
        assert_eq!(r.evaluate(&gate(), &NO_OUTBOUND, 3 * S).1, None);
        assert_eq!(r.evaluate(&gate(), &NO_OUTBOUND, 3_300 * MS - 1).1, None);
        assert_eq!(
            r.evaluate(&gate(), &NO_OUTBOUND, 3_300 * MS).1,
            Some(GatePass::Quiet)
        );
    }

    #[test]
    fn late_request_slides_the_quiet_window() {
        let (r, _) = closing_at(0).admit(3_200 * MS, true);
        let r = r.finish();
        assert_eq!(r.evaluate(&gate(), &NO_OUTBOUND, 3_600 * MS).1, None);
        assert_eq!(
            r.evaluate(&gate(), &NO_OUTBOUND, 3_700 * MS).1,
            Some(GatePass::Quiet)
        );
    }

    #[test]
    fn gate_holds_while_inbound_requests_are_in_flight() {
        let (r, _) = closing_at(0).admit(100 * MS, true);
        assert_eq!(r.evaluate(&gate(), &NO_OUTBOUND, 5 * S).1, None);
        assert_eq!(
            r.finish().evaluate(&gate(), &NO_OUTBOUND, 5 * S).1,
            Some(GatePass::Quiet)
        );
    }

    #[test]
    fn gate_holds_while_outbound_requests_are_in_flight() {
        let r = closing_at(0);
        let busy = Traffic {
            inflight: 1,
            last_start_us: 100 * MS,
        };
        assert_eq!(r.evaluate(&gate(), &busy, 5 * S).1, None);
        let recent = Traffic {
            inflight: 0,
            last_start_us: 4_800 * MS,
        };
        assert_eq!(
            r.evaluate(&gate(), &recent, 5 * S).1,
            None,
            "outbound starts count for the window"
        );
        assert_eq!(
            r.evaluate(&gate(), &recent, 5_300 * MS).1,
            Some(GatePass::Quiet)
        );
    }

    #[test]
    fn step_timeout_forces_the_gate() {
        let (r, _) = closing_at(0).admit(S, true); // never finishes
        assert_eq!(r.evaluate(&gate(), &NO_OUTBOUND, 6 * S - 1).1, None);
        let (d, pass) = r.evaluate(&gate(), &NO_OUTBOUND, 6 * S);
        assert_eq!(pass, Some(GatePass::StepTimeout));
        assert!(d.forced);
        assert_eq!(d.inbound.inflight, 1, "the count is kept for the status");
    }

    #[test]
    fn overall_timeout_forces_the_gate_before_the_step_timeout() {
        let gate = GateTimings {
            timeout: Duration::from_secs(4),
            ..gate()
        };
        let (r, _) = closing_at(0).admit(S, true);
        assert_eq!(r.evaluate(&gate, &NO_OUTBOUND, 4 * S - 1).1, None);
        let (d, pass) = r.evaluate(&gate, &NO_OUTBOUND, 4 * S);
        assert_eq!(pass, Some(GatePass::Timeout));
        assert!(d.forced);
    }

    #[test]
    fn timeout_equal_to_wait_passes_quiet_when_quiet() {
        let gate = GateTimings {
            timeout: Duration::from_secs(3),
            ..gate()
        };
        assert_eq!(
            closing_at(0).evaluate(&gate, &NO_OUTBOUND, 3 * S).1,
            Some(GatePass::Quiet)
        );
    }

    #[test]
    fn zero_timings_pass_at_once() {
        let zero = GateTimings {
            consumer_update_wait: Duration::ZERO,
            quiet_window: Duration::ZERO,
            step_timeout: Duration::ZERO,
            timeout: Duration::ZERO,
        };
        assert_eq!(
            closing_at(7).evaluate(&zero, &NO_OUTBOUND, 7).1,
            Some(GatePass::Quiet)
        );
        let (busy, _) = closing_at(7).admit(7, true);
        assert_eq!(
            busy.evaluate(&zero, &NO_OUTBOUND, 7).1,
            Some(GatePass::Timeout)
        );
    }

    #[test]
    fn clock_going_backwards_does_not_pass_the_gate() {
        let r = closing_at(10 * S);
        assert_eq!(r.evaluate(&gate(), &NO_OUTBOUND, 9 * S).1, None);
    }

    #[test]
    fn encoding_round_trips_every_phase() {
        for phase in [Phase::Serving, Phase::Closing, Phase::Drained] {
            let r = InstanceRecord {
                phase,
                forced: phase == Phase::Drained,
                closing_since_us: 1,
                drained_at_us: u64::MAX,
                inbound: Traffic {
                    inflight: 3,
                    last_start_us: 4,
                },
            };
            assert_eq!(InstanceRecord::decode(&r.encode()), Some(r));
        }
    }

    #[test]
    fn decode_refuses_foreign_values() {
        let good = InstanceRecord::default().encode();
        assert!(InstanceRecord::decode(&good).is_some());
        assert_eq!(InstanceRecord::decode(&good[..39]), None);
        let mut bad = good;
        bad[0] = 2;
        assert_eq!(InstanceRecord::decode(&bad), None, "unknown version");
        let mut bad = good;
        bad[1] = 3;
        assert_eq!(InstanceRecord::decode(&bad), None, "unknown phase");
        let mut bad = good;
        bad[2] = 2;
        assert_eq!(InstanceRecord::decode(&bad), None, "unknown flag");
        let mut bad = good;
        bad[5] = 1;
        assert_eq!(InstanceRecord::decode(&bad), None, "reserved bytes");
    }

    #[test]
    fn store_ops_follow_the_table() {
        let store = MemStore::new();
        ensure(&store).unwrap();
        let (a, r) = admit(&store, S, true).unwrap();
        assert_eq!((a, r.inbound.inflight), (Admission::Admitted, 1));
        let (r, started) = start_closing(&store, 2 * S).unwrap();
        assert!(started);
        assert_eq!(r.phase, Phase::Closing);
        assert!(
            !start_closing(&store, 3 * S).unwrap().1,
            "second call does not start it again"
        );
        assert_eq!(
            advance(&store, &gate(), &NO_OUTBOUND, 6 * S).unwrap().1,
            None,
            "one in flight"
        );
        finish(&store).unwrap();
        let (r, pass) = advance(&store, &gate(), &NO_OUTBOUND, 6 * S).unwrap();
        assert_eq!((r.phase, pass), (Phase::Drained, Some(GatePass::Quiet)));
        assert_eq!(read(&store).unwrap(), r);
        assert_eq!(admit(&store, 7 * S, true).unwrap().0, Admission::Rejected);
        assert_eq!(
            read(&store).unwrap().inbound.inflight,
            0,
            "a rejected request is not counted"
        );
    }

    #[test]
    fn ensure_does_not_reset_a_live_record() {
        let store = MemStore::new();
        ensure(&store).unwrap();
        admit(&store, 1, true).unwrap();
        ensure(&store).unwrap();
        assert_eq!(read(&store).unwrap().inbound.inflight, 1);
    }

    /// Two workers: when worker A reads the record, worker B gets a whole
    /// read-modify-write in before A writes, as on two threads.
    type OtherWorker<'a> = Box<dyn FnOnce(&MemStore) + 'a>;
    struct Interleaved<'a> {
        store: MemStore,
        on_first_get: Cell<Option<OtherWorker<'a>>>,
    }
    impl SharedStore for Interleaved<'_> {
        fn get(&self, key: &str) -> Result<Option<Versioned>, StoreError> {
            let got = self.store.get(key);
            if let Some(other_worker) = self.on_first_get.take() {
                other_worker(&self.store);
            }
            got
        }
        fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
            self.store.set(key, value, cas)
        }
    }

    fn interleaved<'a>(other_worker: impl FnOnce(&MemStore) + 'a) -> Interleaved<'a> {
        let store = MemStore::new();
        ensure(&store).unwrap();
        Interleaved {
            store,
            on_first_get: Cell::new(Some(Box::new(other_worker))),
        }
    }

    #[test]
    fn cas_race_between_two_workers_loses_no_count() {
        let racing = interleaved(|store| {
            admit(store, 2, true).unwrap();
        });
        admit(&racing, 1, true).unwrap();
        let r = read(&racing.store).unwrap();
        assert_eq!(r.inbound.inflight, 2, "both admissions counted");
        assert_eq!(r.inbound.last_start_us, 2);
    }

    #[test]
    fn cas_race_between_finish_and_admit_stays_exact() {
        let store = MemStore::new();
        ensure(&store).unwrap();
        admit(&store, 1, true).unwrap();
        let racing = Interleaved {
            store,
            on_first_get: Cell::new(Some(Box::new(|s: &MemStore| {
                admit(s, 2, true).unwrap();
            }))),
        };
        finish(&racing).unwrap();
        assert_eq!(read(&racing.store).unwrap().inbound.inflight, 1);
    }

    #[test]
    fn gate_pass_is_reported_to_exactly_one_of_two_racing_tickers() {
        let store = MemStore::new();
        ensure(&store).unwrap();
        start_closing(&store, 0).unwrap();
        let other_pass = Cell::new(None);
        let racing = Interleaved {
            store,
            on_first_get: Cell::new(Some(Box::new(|s: &MemStore| {
                other_pass.set(advance(s, &gate(), &NO_OUTBOUND, 4 * S).unwrap().1);
            }))),
        };
        let (r, mine) = advance(&racing, &gate(), &NO_OUTBOUND, 4 * S).unwrap();
        assert_eq!(r.phase, Phase::Drained);
        assert_eq!(
            other_pass.get(),
            Some(GatePass::Quiet),
            "the worker that wrote first reports it"
        );
        assert_eq!(mine, None, "the loser re-reads and sees it drained");
    }

    #[test]
    fn admission_racing_the_gate_is_either_counted_before_or_rejected_after() {
        // A request admitted between the ticker's read and write makes the
        // ticker's CAS fail; on re-read it is not quiet, so no pass.
        let store = MemStore::new();
        ensure(&store).unwrap();
        start_closing(&store, 0).unwrap();
        let racing = Interleaved {
            store,
            on_first_get: Cell::new(Some(Box::new(|s: &MemStore| {
                assert_eq!(admit(s, 4 * S, true).unwrap().0, Admission::Admitted);
            }))),
        };
        let (r, pass) = advance(&racing, &gate(), &NO_OUTBOUND, 4 * S).unwrap();
        assert_eq!(pass, None);
        assert_eq!((r.phase, r.inbound.inflight), (Phase::Closing, 1));
    }
}
