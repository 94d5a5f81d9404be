//! The instance record: one shared-data value holding the shutdown phase,
//! when closing started and when (and why) the drain gate passed. Requests
//! never touch it: admission and the in-flight count are Envoy stats (see
//! [`crate::shared::gate`], whose protocol makes a pass safe without CAS); the record
//! is written twice in an instance's life, when closing starts and when the
//! gate passes, and its CAS decides which VM copy reports the pass.
//!
//! # Transition table
//!
//! `elapsed` = now − closing_since; `quiet` = nothing in flight (inbound and
//! outbound) and no request started within `quiet_window`; `arriving` = a
//! request started within `quiet_window` (or at this evaluation), as the
//! evaluating copy sees the stats ([`Seen`]). A quiet pass is written only
//! after the gate protocol's attempt held
//! ([`crate::shared::gate::GateHold::try_pass`]); a forced one after the gate was
//! put up ([`crate::shared::gate::GateHold::hold`]).
//!
//! | phase    | event                  | condition                                          | next phase / effect                          |
//! |----------|------------------------|----------------------------------------------------|----------------------------------------------|
//! | serving  | start closing          |                                                    | closing, closing_since = now                 |
//! | closing  | start closing          |                                                    | closing (idempotent)                         |
//! | drained  | start closing          |                                                    | drained (idempotent)                         |
//! | closing  | evaluate gate          | elapsed ≥ consumer_update_wait, quiet              | pass: quiet (drained, forced = false)        |
//! | closing  | evaluate gate          | elapsed ≥ timeout, not quiet                       | pass: forced = true (overall timeout)        |
//! | closing  | evaluate gate          | elapsed ≥ wait + step_timeout, not quiet, no `longest_request` | pass: forced = true (step timeout) |
//! | closing  | evaluate gate          | elapsed ≥ wait + step_timeout, not quiet, `longest_request` set | closing; [`InstanceRecord::stops_admitting`]: the gate goes up, admission stops (refused late arrivals get the marked 503), what is in flight is waited for |
//! | closing  | stop admitting written | (CAS: exactly one copy's write lands)  | closing, admission_stopped = true            |
//! | closing  | evaluate gate          | otherwise                                          | closing                                      |
//! | closing  | pass written           | (CAS: exactly one copy's write lands)  | drained, drained_at = now                    |
//! | serving  | evaluate gate          |                                        | serving                                      |
//! | drained  | evaluate gate          |                                        | drained                                      |
//!
//! `step_timeout` bounds the wait for quiet (the contract's meaning, and
//! dubbo-go's). With `longest_request` set, it bounds only how long new
//! requests are admitted: past it, arrivals get the marked 503 (callers
//! that never heed the closing mark retry elsewhere), and the requests
//! already in flight are waited for until `timeout`, which then covers the
//! longest request: a late caller never cuts a long request. The gate then
//! passes quiet once they end.
//!
//! Closing is one-way for the life of the shared-data namespace (the Envoy
//! process): a shutting-down instance does not come back, a new one does.

use std::time::Duration;

use crate::shared::duration::micros;

use crate::shared::store::{update, SharedStore, StoreError, UpdateError};

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
    /// The app's longest request, when configured: `step_timeout` then
    /// stops admission instead of forcing the gate, and requests in flight
    /// are waited for until `timeout`.
    pub longest_request: Option<Duration>,
}

impl GateTimings {
    /// Closing time (µs) at which `step_timeout` runs out: it forces the
    /// gate, or with `longest_request` stops admission.
    fn step_deadline_us(&self) -> u64 {
        micros(self.consumer_update_wait).saturating_add(micros(self.step_timeout))
    }
}

/// Why the gate passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatePass {
    /// Nothing in flight and nothing started within the quiet window.
    Quiet,
    /// `step_timeout` after `consumer_update_wait` ran out before quiet,
    /// without `longest_request` (forced).
    StepTimeout,
    /// The overall `timeout` ran out (forced).
    Timeout,
}

impl GatePass {
    pub fn forced(self) -> bool {
        self != GatePass::Quiet
    }

    /// The timeout that forced it, as the log and the drain report name
    /// it; None for a quiet pass.
    pub fn forced_by(self) -> Option<&'static str> {
        match self {
            GatePass::Quiet => None,
            GatePass::StepTimeout => Some("step_timeout"),
            GatePass::Timeout => Some("timeout"),
        }
    }

    /// As [`crate::shared::keys::PASSED_BY`] holds it (0 there: not passed).
    pub fn to_byte(self) -> u8 {
        match self {
            GatePass::Quiet => 1,
            GatePass::StepTimeout => 2,
            GatePass::Timeout => 3,
        }
    }

    pub fn from_byte(byte: u8) -> Option<GatePass> {
        [GatePass::Quiet, GatePass::StepTimeout, GatePass::Timeout]
            .into_iter()
            .find(|p| p.to_byte() == byte)
    }
}

/// Shutdown phase and its times, stored under [`RECORD`](crate::shared::keys::RECORD).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InstanceRecord {
    pub phase: Phase,
    /// True when a timeout, not quiet, passed the gate.
    pub forced: bool,
    /// With `longest_request`: `step_timeout` ran out before quiet, so the
    /// gate is up and new requests are refused while those in flight end.
    pub admission_stopped: bool,
    /// When closing started (µs on the host's monotonic clock); 0 while
    /// serving.
    pub closing_since_us: u64,
    /// When the gate passed (µs on the host's monotonic clock); 0 before.
    pub drained_at_us: u64,
}

/// The traffic as the evaluating copy sees it (from the stats).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Seen {
    /// Nothing in flight, inbound or outbound.
    pub idle: bool,
    /// When the latest request started as far as this copy knows (µs on the
    /// host's monotonic clock, 0 = none): never earlier than the real start.
    pub last_start_us: u64,
}

impl InstanceRecord {
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

    /// True when nothing is in flight and no request started within the
    /// quiet window.
    pub fn is_quiet(seen: &Seen, quiet_window: Duration, now_us: u64) -> bool {
        seen.idle && now_us.saturating_sub(seen.last_start_us) >= micros(quiet_window)
    }

    /// With `longest_request` set: true once `step_timeout` after
    /// `consumer_update_wait` ran out before quiet, while closing. The gate
    /// then goes up to stop admission (not to pass): what is in flight is
    /// waited for until `timeout`.
    pub fn stops_admitting(&self, gate: &GateTimings, seen: &Seen, now_us: u64) -> bool {
        self.phase == Phase::Closing
            && gate.longest_request.is_some()
            && now_us.saturating_sub(self.closing_since_us) >= gate.step_deadline_us()
            && !InstanceRecord::is_quiet(seen, gate.quiet_window, now_us)
    }

    /// Evaluates the drain gate at `now_us`: why it may pass now, if it
    /// may. Returns the record a pass would write too.
    pub fn evaluate(
        self,
        gate: &GateTimings,
        seen: &Seen,
        now_us: u64,
    ) -> (InstanceRecord, Option<GatePass>) {
        if self.phase != Phase::Closing {
            return (self, None);
        }
        let elapsed = now_us.saturating_sub(self.closing_since_us);
        let waited = elapsed >= micros(gate.consumer_update_wait);
        let pass = if waited && InstanceRecord::is_quiet(seen, gate.quiet_window, now_us) {
            Some(GatePass::Quiet)
        } else if elapsed >= micros(gate.timeout) {
            Some(GatePass::Timeout)
        } else if gate.longest_request.is_none() && elapsed >= gate.step_deadline_us() {
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

    /// Fixed layout: version u8, phase u8, flags u8 (bit 0 forced, bit 1
    /// admission stopped), 5 zero
    /// bytes, then closing_since_us, drained_at_us as little-endian u64, and
    /// 16 bytes that held the inbound counters before they became stats:
    /// written as zero, ignored when read (a record an older build wrote
    /// still decodes).
    pub fn encode(&self) -> [u8; RECORD_LEN] {
        let mut out = [0u8; RECORD_LEN];
        out[0] = RECORD_VERSION;
        out[1] = self.phase.gauge() as u8;
        out[2] = u8::from(self.forced) | (u8::from(self.admission_stopped) << 1);
        out[8..16].copy_from_slice(&self.closing_since_us.to_le_bytes());
        out[16..24].copy_from_slice(&self.drained_at_us.to_le_bytes());
        out
    }

    /// None for any value this version did not write.
    pub fn decode(bytes: &[u8]) -> Option<InstanceRecord> {
        let bytes: &[u8; RECORD_LEN] = bytes.try_into().ok()?;
        if bytes[0] != RECORD_VERSION || bytes[2] > 3 || bytes[3..8] != [0; 5] {
            return None;
        }
        let u64_at = |at: usize| {
            bytes
                .get(at..at + 8)
                .and_then(crate::shared::store::read_u64)
        };
        Some(InstanceRecord {
            phase: Phase::from_byte(bytes[1])?,
            forced: bytes[2] & 1 == 1,
            admission_stopped: bytes[2] & 2 == 2,
            closing_since_us: u64_at(8)?,
            drained_at_us: u64_at(16)?,
        })
    }
}

/// Reads the record; missing reads as a fresh serving record, and so does a
/// malformed one (only something else writing under our vm_id makes one).
pub fn read(store: &dyn SharedStore) -> Result<InstanceRecord, StoreError> {
    Ok(store
        .get(crate::shared::keys::RECORD.name)?
        .and_then(|(bytes, _)| InstanceRecord::decode(&bytes))
        .unwrap_or_default())
}

/// Creates the record if it has never been written. Call from the root
/// context at configure time, before any stream can count (see
/// [`crate::shared::store::ensure`]).
pub fn ensure(store: &dyn SharedStore) -> Result<(), StoreError> {
    let (key, value) = initial();
    crate::shared::store::ensure(store, key, &value)
}

/// The record's key and the value it starts from (serving, nothing in
/// flight), for [`crate::shared::store::ensure_all`].
pub fn initial() -> (&'static str, Vec<u8>) {
    (
        crate::shared::keys::RECORD.name,
        InstanceRecord::default().encode().to_vec(),
    )
}

fn modify<T>(
    store: &dyn SharedStore,
    f: impl Fn(InstanceRecord) -> (Option<InstanceRecord>, T),
) -> Result<T, UpdateError> {
    update(store, crate::shared::keys::RECORD.name, |bytes| {
        let current = bytes.and_then(InstanceRecord::decode).unwrap_or_default();
        let (next, out) = f(current);
        (
            next.filter(|n| *n != current).map(|n| n.encode().to_vec()),
            out,
        )
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

/// Records that admission stopped (the gate is already up, see the
/// table). Of all copies racing on the record, exactly one gets `true`:
/// the one whose write recorded it (it logs it once per Envoy).
pub fn stop_admitting(store: &dyn SharedStore) -> Result<(InstanceRecord, bool), UpdateError> {
    modify(store, |r| {
        if r.phase != Phase::Closing || r.admission_stopped {
            return (None, (r, false));
        }
        let next = InstanceRecord {
            admission_stopped: true,
            ..r
        };
        (Some(next), (next, true))
    })
}

/// Writes a pass decided at `now_us` (the gate is already up, see the
/// table). Of all copies racing on the record, exactly one gets `true`: the
/// one whose write made it drained.
pub fn pass(
    store: &dyn SharedStore,
    why: GatePass,
    now_us: u64,
) -> Result<(InstanceRecord, bool), UpdateError> {
    modify(store, |r| {
        if r.phase != Phase::Closing {
            return (None, (r, false));
        }
        let next = InstanceRecord {
            phase: Phase::Drained,
            forced: why.forced(),
            drained_at_us: now_us,
            ..r
        };
        (Some(next), (next, true))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::store::{MemStore, Versioned};
    use std::cell::Cell;

    #[test]
    fn a_pass_reason_round_trips_through_its_byte_and_names_its_timeout() {
        for p in [GatePass::Quiet, GatePass::StepTimeout, GatePass::Timeout] {
            assert_eq!(GatePass::from_byte(p.to_byte()), Some(p));
            assert_eq!(p.forced_by().is_some(), p.forced());
        }
        assert_eq!(GatePass::Timeout.forced_by(), Some("timeout"));
        assert_eq!(GatePass::StepTimeout.forced_by(), Some("step_timeout"));
        assert_eq!(GatePass::from_byte(0), None);
        assert_eq!(GatePass::from_byte(4), None);
    }

    const MS: u64 = 1_000;
    const S: u64 = 1_000_000;

    /// The contract's defaults.
    fn gate() -> GateTimings {
        GateTimings {
            consumer_update_wait: Duration::from_secs(3),
            quiet_window: Duration::from_millis(500),
            step_timeout: Duration::from_secs(3),
            timeout: Duration::from_secs(60),
            longest_request: None,
        }
    }

    /// The defaults with `longest_request` set.
    fn with_longest() -> GateTimings {
        GateTimings {
            longest_request: Some(Duration::from_secs(30)),
            ..gate()
        }
    }

    fn closing_at(t: u64) -> InstanceRecord {
        InstanceRecord::default().start_closing(t)
    }

    const IDLE: Seen = Seen {
        idle: true,
        last_start_us: 0,
    };

    fn busy() -> Seen {
        Seen {
            idle: false,
            last_start_us: 100 * MS,
        }
    }

    fn idle_since(t: u64) -> Seen {
        Seen {
            idle: true,
            last_start_us: t,
        }
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
        let (r, pass) = InstanceRecord::default().evaluate(&gate(), &IDLE, 100 * S);
        assert_eq!((r.phase, pass), (Phase::Serving, None));
        let (drained, pass) = closing_at(0).evaluate(&gate(), &IDLE, 3 * S);
        assert_eq!(pass, Some(GatePass::Quiet));
        assert_eq!(drained.evaluate(&gate(), &IDLE, 4 * S), (drained, None));
    }

    #[test]
    fn gate_waits_consumer_update_wait_even_when_idle() {
        let r = closing_at(10 * S);
        assert_eq!(r.evaluate(&gate(), &IDLE, 10 * S).1, None);
        assert_eq!(r.evaluate(&gate(), &IDLE, 13 * S - 1).1, None);
        let (d, pass) = r.evaluate(&gate(), &IDLE, 13 * S);
        assert_eq!(pass, Some(GatePass::Quiet));
        assert_eq!(
            (d.phase, d.forced, d.drained_at_us),
            (Phase::Drained, false, 13 * S)
        );
    }

    #[test]
    fn gate_waits_for_the_quiet_window_after_the_last_start() {
        let r = closing_at(0);
        let seen = idle_since(2_800 * MS);
        assert_eq!(r.evaluate(&gate(), &seen, 3 * S).1, None);
        assert_eq!(r.evaluate(&gate(), &seen, 3_300 * MS - 1).1, None);
        assert_eq!(
            r.evaluate(&gate(), &seen, 3_300 * MS).1,
            Some(GatePass::Quiet)
        );
    }

    #[test]
    fn gate_holds_while_requests_are_in_flight() {
        let r = closing_at(0);
        assert_eq!(r.evaluate(&gate(), &busy(), 5 * S).1, None);
        assert_eq!(
            r.evaluate(&gate(), &idle_since(100 * MS), 5 * S).1,
            Some(GatePass::Quiet)
        );
    }

    /// In flight, and a request started `ago` before `now`.
    fn busy_arriving(now: u64, ago: u64) -> Seen {
        Seen {
            idle: false,
            last_start_us: now - ago,
        }
    }

    #[test]
    fn without_longest_request_step_timeout_forces_the_gate_while_requests_keep_arriving() {
        let g = gate();
        let r = closing_at(0);
        let at = 6 * S;
        assert_eq!(r.evaluate(&g, &busy_arriving(at - 1, 0), at - 1).1, None);
        let (d, pass) = r.evaluate(&g, &busy_arriving(at, 499 * MS), at);
        assert_eq!(pass, Some(GatePass::StepTimeout));
        assert!(d.forced);
        // Idle but a start within the window: arrivals go on, forced too.
        let seen = idle_since(at - 100 * MS);
        assert_eq!(r.evaluate(&g, &seen, at).1, Some(GatePass::StepTimeout));
        assert!(!r.stops_admitting(&g, &seen, at), "no longest_request");
    }

    #[test]
    fn without_longest_request_step_timeout_ends_the_wait_for_quiet_as_the_contract_says() {
        let r = closing_at(0);
        // One long request in flight, nothing arriving: forced at
        // consumer_update_wait + step_timeout.
        let seen = busy_arriving(6 * S, 5 * S);
        assert_eq!(r.evaluate(&gate(), &seen, 6 * S - 1).1, None);
        assert_eq!(
            r.evaluate(&gate(), &seen, 6 * S).1,
            Some(GatePass::StepTimeout)
        );
    }

    #[test]
    fn with_longest_request_step_timeout_stops_admission_and_what_is_in_flight_is_waited_for() {
        let g = with_longest();
        let r = closing_at(0);
        // Requests in flight and arriving past wait + step_timeout (6 s):
        // no pass, admission stops.
        for at in [6 * S, 30 * S, 60 * S - 1] {
            for seen in [busy_arriving(at, 0), busy_arriving(at, 500 * MS)] {
                assert_eq!(r.evaluate(&g, &seen, at).1, None, "at {at}");
                assert!(r.stops_admitting(&g, &seen, at), "at {at}");
            }
        }
        assert!(!r.stops_admitting(&g, &busy_arriving(6 * S - 1, 0), 6 * S - 1));
        // Once they end: a quiet pass; else the overall timeout.
        assert_eq!(
            r.evaluate(&g, &idle_since(20 * S), 31 * S).1,
            Some(GatePass::Quiet)
        );
        assert!(!r.stops_admitting(&g, &idle_since(20 * S), 31 * S), "quiet");
        assert_eq!(r.evaluate(&g, &busy(), 60 * S).1, Some(GatePass::Timeout));
        // Drained or serving: nothing to stop.
        let (drained, _) = r.evaluate(&g, &IDLE, 10 * S);
        assert!(!drained.stops_admitting(&g, &busy(), 10 * S));
        assert!(!InstanceRecord::default().stops_admitting(&g, &busy(), 10 * S));
    }

    /// What one evaluation decides, as the hand-written table names it.
    fn outcome(g: &GateTimings, seen: &Seen, at: u64) -> &'static str {
        let r = closing_at(0);
        match r.evaluate(g, seen, at).1 {
            Some(GatePass::Quiet) => "quiet",
            Some(GatePass::StepTimeout) => "step_timeout",
            Some(GatePass::Timeout) => "timeout",
            None if r.stops_admitting(g, seen, at) => "stop admitting",
            None => "wait",
        }
    }

    /// The table of docs/concepts/gate.md ("Which budget ends the wait"),
    /// written out by hand at its edges: closing at 0, the contract's
    /// defaults (wait 3 s, quiet window 500 ms, step 3 s, timeout 60 s),
    /// `longest_request` 30 s where the row says so. `ago`: the last
    /// start that long before `at` (None: none since the provider
    /// started).
    #[test]
    fn which_budget_ends_the_wait_a_hand_written_table() {
        let short = GateTimings {
            timeout: Duration::from_secs(4),
            ..gate()
        };
        #[rustfmt::skip]
        let rows: [(&GateTimings, u64, bool, Option<u64>, &str); 30] = [
            // timings,      at,            idle,  ago,            outcome
            (&gate(),        0,             true,  None,           "wait"),
            (&gate(),        3 * S - 1,     true,  None,           "wait"),
            (&gate(),        3 * S,         true,  None,           "quiet"),
            (&gate(),        3 * S,         true,  Some(200 * MS), "wait"),
            (&gate(),        3 * S,         true,  Some(500 * MS), "quiet"),
            (&gate(),        3 * S,         false, Some(2 * S),    "wait"),
            (&gate(),        6 * S - 1,     false, Some(0),        "wait"),
            (&gate(),        6 * S,         false, Some(0),        "step_timeout"),
            (&gate(),        6 * S,         false, Some(5 * S),    "step_timeout"),
            (&gate(),        6 * S,         true,  Some(100 * MS), "step_timeout"),
            (&gate(),        6 * S,         true,  Some(499 * MS), "step_timeout"),
            (&gate(),        6 * S,         true,  Some(500 * MS), "quiet"),
            (&gate(),        60 * S,        false, Some(S),    "timeout"),
            (&short,         4 * S - 1,     false, Some(0),        "wait"),
            (&short,         4 * S,         false, Some(0),        "timeout"),
            (&short,         4 * S,         true,  Some(S),    "quiet"),
            (&with_longest(), 3 * S,        true,  None,           "quiet"),
            (&with_longest(), 3 * S,        false, Some(100 * MS), "wait"),
            (&with_longest(), 6 * S - 1,    false, Some(0),        "wait"),
            (&with_longest(), 6 * S,        false, Some(0),        "stop admitting"),
            (&with_longest(), 6 * S,        false, Some(5 * S),    "stop admitting"),
            (&with_longest(), 6 * S,        true,  Some(100 * MS), "stop admitting"),
            (&with_longest(), 6 * S,        true,  Some(500 * MS), "quiet"),
            (&with_longest(), 30 * S,       false, Some(24 * S),   "stop admitting"),
            (&with_longest(), 31 * S,       true,  Some(20 * S),   "quiet"),
            (&with_longest(), 31 * S,       true,  Some(0),        "stop admitting"),
            (&with_longest(), 60 * S - 1,   false, Some(50 * S),   "stop admitting"),
            (&with_longest(), 60 * S,       false, Some(50 * S),   "timeout"),
            (&with_longest(), 60 * S,       true,  Some(S),    "quiet"),
            (&with_longest(), 61 * S,       true,  Some(100 * MS), "timeout"),
        ];
        for (g, at, idle, ago, want) in rows {
            let seen = Seen {
                idle,
                last_start_us: ago.map_or(0, |ago| at - ago),
            };
            assert_eq!(
                outcome(g, &seen, at),
                want,
                "at {at} idle {idle} ago {ago:?} {g:?}"
            );
        }
    }

    #[test]
    fn overall_timeout_forces_the_gate_before_the_step_timeout() {
        let gate = GateTimings {
            timeout: Duration::from_secs(4),
            ..gate()
        };
        let r = closing_at(0);
        assert_eq!(r.evaluate(&gate, &busy(), 4 * S - 1).1, None);
        let (d, pass) = r.evaluate(&gate, &busy(), 4 * S);
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
            closing_at(0).evaluate(&gate, &IDLE, 3 * S).1,
            Some(GatePass::Quiet),
            "quiet wins over a timeout that runs out at the same moment"
        );
    }

    #[test]
    fn zero_timings_pass_at_once() {
        let zero = GateTimings {
            consumer_update_wait: Duration::ZERO,
            quiet_window: Duration::ZERO,
            step_timeout: Duration::ZERO,
            timeout: Duration::ZERO,
            longest_request: None,
        };
        assert_eq!(
            closing_at(7).evaluate(&zero, &IDLE, 7).1,
            Some(GatePass::Quiet)
        );
        assert_eq!(
            closing_at(7).evaluate(&zero, &busy(), 7).1,
            Some(GatePass::Timeout)
        );
    }

    #[test]
    fn clock_going_backwards_does_not_pass_the_gate() {
        let r = closing_at(10 * S);
        assert_eq!(r.evaluate(&gate(), &IDLE, 9 * S).1, None);
    }

    #[test]
    fn encoding_round_trips_every_phase() {
        for phase in [Phase::Serving, Phase::Closing, Phase::Drained] {
            let r = InstanceRecord {
                phase,
                forced: phase == Phase::Drained,
                admission_stopped: phase != Phase::Serving,
                closing_since_us: 1,
                drained_at_us: u64::MAX,
            };
            assert_eq!(InstanceRecord::decode(&r.encode()), Some(r));
        }
    }

    #[test]
    fn a_record_with_the_old_counters_still_decodes() {
        let mut old = closing_at(5).encode();
        old[24..32].copy_from_slice(&3u64.to_le_bytes());
        old[32..40].copy_from_slice(&4u64.to_le_bytes());
        assert_eq!(InstanceRecord::decode(&old), Some(closing_at(5)));
        assert_eq!(closing_at(5).encode()[24..], [0; 16], "written as zero");
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
        bad[2] = 4;
        assert_eq!(InstanceRecord::decode(&bad), None, "unknown flag");
        let mut bad = good;
        bad[5] = 1;
        assert_eq!(InstanceRecord::decode(&bad), None, "reserved bytes");
    }

    #[test]
    fn store_ops_follow_the_table() {
        let store = MemStore::new();
        ensure(&store).unwrap();
        assert!(
            !pass(&store, GatePass::Quiet, S).unwrap().1,
            "no pass while serving"
        );
        let (r, started) = start_closing(&store, 2 * S).unwrap();
        assert!(started);
        assert_eq!(r.phase, Phase::Closing);
        assert!(
            !start_closing(&store, 3 * S).unwrap().1,
            "second call does not start it again"
        );
        let (r, mine) = pass(&store, GatePass::StepTimeout, 6 * S).unwrap();
        assert!(mine);
        assert_eq!(
            (r.phase, r.forced, r.drained_at_us),
            (Phase::Drained, true, 6 * S)
        );
        assert_eq!(read(&store).unwrap(), r);
        assert!(!pass(&store, GatePass::Quiet, 7 * S).unwrap().1, "once");
        assert_eq!(read(&store).unwrap(), r, "the first pass stays");
    }

    #[test]
    fn ensure_does_not_reset_a_live_record() {
        let store = MemStore::new();
        ensure(&store).unwrap();
        start_closing(&store, 1).unwrap();
        ensure(&store).unwrap();
        assert_eq!(read(&store).unwrap().phase, Phase::Closing);
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

    #[test]
    fn gate_pass_is_reported_to_exactly_one_of_two_racing_tickers() {
        let store = MemStore::new();
        ensure(&store).unwrap();
        start_closing(&store, 0).unwrap();
        let other = Cell::new(None);
        let racing = Interleaved {
            store,
            on_first_get: Cell::new(Some(Box::new(|s: &MemStore| {
                other.set(Some(pass(s, GatePass::Quiet, 4 * S).unwrap().1));
            }))),
        };
        let (r, mine) = pass(&racing, GatePass::Timeout, 5 * S).unwrap();
        assert_eq!(r.phase, Phase::Drained);
        assert_eq!(
            other.get(),
            Some(true),
            "the worker that wrote first reports it"
        );
        assert!(!mine, "the loser re-reads and sees it drained");
        assert!(!r.forced, "the first pass's reason stays");
    }
}
