//! Admission and the drain gate without compare-and-swap: the in-flight
//! count, the request starts and the gate are Envoy stats (process-wide
//! atomics every VM copy on every worker shares by name), so a request costs
//! a few of the cheapest hostcalls instead of a read-modify-write of shared
//! data. The shared instance record ([`crate::drain::record`]) still holds the
//! phase and the times, and is written only when closing starts and when
//! the gate passes.
//! It is shared, not drain's: graceful_provider writes `inflight` and
//! `started` (steps 1–4), graceful_drain writes `gate`.
//!
//! # The protocol (Dekker-style: each side writes, then reads the other)
//!
//! Stats: `inflight` (gauge `graceful_provider_inflight`), `started`
//! (counter `graceful_provider_started`), `gate` (gauge
//! `graceful_drain_gate`: > 0 once the gate has passed or while a copy is
//! trying to pass it), `phase` (gauge `graceful_drain_phase`: 0 serving, 1
//! closing, 2 drained). Every operation is one sequentially consistent atomic
//! in Envoy (`std::atomic<uint64_t>` `+=` and loads in
//! `source/common/stats/allocator_impl.*`), so all of them fall in one total
//! order that every worker agrees on.
//!
//! | side | step | operation | then |
//! |------|------|-----------|------|
//! | provider, request | 1 | `inflight += 1` | |
//! | provider, request | 2 | read `phase`, until this copy has read it past 0 | 0: admitted without step 2′ (no gate is up yet) |
//! | provider, request | 2′ | read `gate` (only with `reject_when_drained`) | `> 0`: `inflight -= 1`, reject (503 + closing mark) |
//! | provider, request | 3 | `started += 1` | admitted |
//! | provider, stream end (`on_delete`) | 4 | `inflight -= 1` | exactly once per admitted stream |
//! | drain, tick | 0 | `phase` raised to the record's (`gate_copy::raise_phase`), before anything below | |
//! | drain, tick | a | quiet by this copy's view: `inflight` 0 (and outbound 0), `started` unchanged for `quiet_window` | else no attempt |
//! | drain, tick | b | `gate += 1` | |
//! | drain, tick | c | read `inflight`, outbound in flight, `started` | all still as in (a): passed, `gate` keeps the 1 for good |
//! | drain, tick | d | | otherwise back off: `gate -= 1`, try again next tick |
//! | drain, forced pass | b′ | `gate += 1` | passed, whatever is in flight |
//!
//! **No request is admitted after an unforced pass.** Suppose a request's
//! read (2′) sees `gate` 0, or its read (2) sees `phase` 0 and it skips
//! (2′), and the attempt's reads (c) see `inflight` 0 and `started`
//! unchanged. A `phase` of 0 comes before every copy's step 0 raised it,
//! so before every (b): whichever read the request made, it comes before
//! (b) in the total order (the phase read saves a serving request the gate
//! read, and is the read the drain report needs anyway). So (1)
//! comes before (c) and (c) sees the request in `inflight`, unless the
//! request already ended (4); then its step (3) also came before (c), and
//! (c) sees `started` moved. Either way the attempt backs off. So once an
//! attempt passes, every request whose (1) follows it reads `gate > 0` and
//! is rejected, and none is in flight: the same two guarantees the CAS
//! record gave.
//!
//! **Both sides may back off** (Dekker's cost): a request whose (1) lands
//! between an attempt's (b) and (c) is rejected even if that attempt then
//! backs off. That window is a few hostcalls long and opens only after
//! `quiet_window` without a request start, while closing, when the
//! consumers have already been told to go elsewhere; the rejection carries
//! the closing mark, so a consumer retries it elsewhere.
//!
//! Several copies may attempt at once: `+=`/`-=` commute, so each attempt
//! takes back only its own 1, and a pass leaves its 1 for good. A copy
//! keeps at most one 1 of its own ([`GateHold`]). The record's CAS still
//! decides which copy writes "drained", logs the pass and calls
//! `on_drained` (exactly one).
//!
//! `phase` never returns to 0 while `gate` is up: `raise_phase` only
//! raises, and the two stats are defined by the same filters, so they are
//! made again together (below), when step 0 comes first again.
//!
//! Where a host could differ: the stats must be real. Envoy's
//! `stats_matcher` turns a rejected name into a null stat that reads 0
//! (Istio's bootstrap keeps the `wasm` prefix, so `wasmcustom.*` stays), so
//! the filters check at configure time that the in-flight gauge counts and
//! refuse to start otherwise. Under Envoy's hot restart, gauges are added
//! across parent and child (`ImportMode::Accumulate`) while both run.
//! Stats live as long as a scope holds them: a listener removed and added
//! again starts from 0 with nothing in flight; the drain filter puts its 1
//! back into `gate` on its next tick when the record says drained.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::shared::metrics::{Metric, Metrics};

/// What admission decided for a new request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Counted in `inflight`: must leave it once, through [`finish`].
    Admitted,
    /// The gate has passed: answer 503 with the closing mark. Not counted.
    Rejected,
}

/// What a copy knows of the phase gauge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PhaseSeen {
    /// Past serving, read now or before (the phase only moves forward).
    Closing,
    /// Read as serving.
    Serving,
    /// Could not be read.
    Unreadable,
}

/// Reads `phase` until this copy has seen it past 0; `knows_closing` is
/// the copy's memory of that, after which `phase` is not read again.
pub fn phase_seen(metrics: &dyn Metrics, knows_closing: &AtomicBool) -> PhaseSeen {
    if knows_closing.load(Relaxed) {
        return PhaseSeen::Closing;
    }
    match metrics.get(Metric::DrainPhase) {
        Some(0) => PhaseSeen::Serving,
        Some(_) => {
            knows_closing.store(true, Relaxed);
            PhaseSeen::Closing
        }
        None => PhaseSeen::Unreadable,
    }
}

/// Steps 1–3 of the table, the phase read through [`phase_seen`]. An
/// unreadable `phase` is followed by the gate read; a `gate` that cannot
/// be read admits (fail open: a shutdown helper never denies traffic over
/// its own trouble).
pub fn admit(
    metrics: &dyn Metrics,
    reject_when_drained: bool,
    knows_closing: &AtomicBool,
) -> Admission {
    metrics.add(Metric::ProviderInflight, 1);
    let gate_may_be_up = phase_seen(metrics, knows_closing) != PhaseSeen::Serving;
    if reject_when_drained
        && gate_may_be_up
        && metrics.get(Metric::DrainGate).is_some_and(|g| g > 0)
    {
        metrics.add(Metric::ProviderInflight, -1);
        return Admission::Rejected;
    }
    metrics.add(Metric::ProviderStarted, 1);
    Admission::Admitted
}

/// Whether a rejection came while the record was still closing: the
/// gate was up to stop admission (`longest_request`), not because it
/// passed, so the request is a late arrival refused while others end. Read
/// on the rejection path only. A rejection in the few hostcalls between a
/// quiet pass's gate and its phase counts as late too.
pub fn refused_late(metrics: &dyn Metrics) -> bool {
    metrics.get(Metric::DrainPhase) == Some(1)
}

/// Step 4: an admitted stream ended.
pub fn finish(metrics: &dyn Metrics) {
    metrics.add(Metric::ProviderInflight, -1);
}

/// What the drain side reads: in-flight counts and the total of starts
/// (inbound and outbound). None where a stat could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Traffic {
    pub inflight_inbound: Option<u64>,
    pub inflight_outbound: Option<u64>,
    pub started: Option<u64>,
}

impl Traffic {
    /// Reads the counts, in-flight first: a request that ended before its
    /// count was read had started before `started` is read (step c).
    pub fn read(metrics: &dyn Metrics) -> Traffic {
        let inflight_inbound = metrics.get(Metric::ProviderInflight);
        let inflight_outbound = metrics.get(Metric::ConsumerInflight);
        let started = metrics
            .get(Metric::ProviderStarted)
            .zip(metrics.get(Metric::ConsumerStarted))
            .map(|(a, b)| a.wrapping_add(b));
        Traffic {
            inflight_inbound,
            inflight_outbound,
            started,
        }
    }

    /// Nothing in flight, as far as can be told (an unreadable count is
    /// not nothing: the gate then waits for its timeouts).
    pub fn idle(&self) -> bool {
        self.inflight_inbound == Some(0) && self.inflight_outbound == Some(0)
    }

    /// Inbound plus outbound in flight (unreadable counts as 0: for
    /// reports only).
    pub fn inflight(&self) -> (u64, u64) {
        (
            self.inflight_inbound.unwrap_or(0),
            self.inflight_outbound.unwrap_or(0),
        )
    }
}

/// One drain copy's view of when the latest request started, from the
/// `started` total it reads (on every tick, and on status requests). The
/// time is when this copy saw the total move: never earlier than the start
/// itself, so a quiet window measured from it is never too short.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StartWatch {
    seen: Option<u64>,
    /// µs on the host's monotonic clock; 0 = no start seen.
    moved_at_us: u64,
}

impl StartWatch {
    /// Notes the `started` total read at `now_us`; returns the latest
    /// start time as this copy knows it (0 = none).
    pub fn observe(&mut self, started: Option<u64>, now_us: u64) -> u64 {
        match (started, self.seen) {
            // Unreadable: a start may have happened now.
            (None, _) => self.moved_at_us = now_us,
            // First look: starts happened at some time up to now.
            (Some(total), None) => {
                self.seen = Some(total);
                self.moved_at_us = if total == 0 { 0 } else { now_us };
            }
            (Some(total), Some(seen)) if total != seen => {
                self.seen = Some(total);
                self.moved_at_us = now_us;
            }
            (Some(_), Some(_)) => {}
        }
        self.moved_at_us
    }

    /// The total last seen.
    pub fn seen(&self) -> Option<u64> {
        self.seen
    }
}

/// This copy's own 1 in `gate`, kept for good once it passed the gate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GateHold {
    held: bool,
}

impl GateHold {
    pub fn is_held(&self) -> bool {
        self.held
    }

    /// Steps b–d: tries to pass the gate unforced when `before` (read at
    /// step a) was quiet. True if it passed (the 1 stays in `gate`).
    pub fn try_pass(&mut self, metrics: &dyn Metrics, before: &Traffic) -> bool {
        if self.held {
            return true;
        }
        if !before.idle() || before.started.is_none() {
            return false;
        }
        metrics.add(Metric::DrainGate, 1);
        let after = Traffic::read(metrics);
        if after.idle() && after.started == before.started {
            self.held = true;
            return true;
        }
        metrics.add(Metric::DrainGate, -1);
        false
    }

    /// Step b′: a forced pass. Idempotent per copy.
    pub fn hold(&mut self, metrics: &dyn Metrics) {
        if !self.held {
            metrics.add(Metric::DrainGate, 1);
            self.held = true;
        }
    }

    /// Puts a 1 back into a gate stat that reads 0 although the record says
    /// drained: the stats were made again (see the module doc).
    pub fn hold_again(&mut self, metrics: &dyn Metrics) {
        metrics.add(Metric::DrainGate, 1);
        self.held = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn counts_read_as_gauges_never_below_zero() {
        let c = crate::shared::metrics::AtomicMetrics::new();
        c.add(Metric::ProviderInflight, 2);
        c.add(Metric::ProviderInflight, -3);
        assert_eq!(c.get(Metric::ProviderInflight), Some(0));
        c.add(Metric::ProviderInflight, 2);
        assert_eq!(c.get(Metric::ProviderInflight), Some(1));
    }

    type AfterAdd = Box<dyn FnMut(Metric, &Fake)>;

    /// Metrics as plain numbers, with a hook run after each add (to play
    /// another worker acting between two steps).
    #[derive(Default)]
    struct Fake {
        values: RefCell<[i64; Metric::ALL.len()]>,
        after_add: RefCell<Option<AfterAdd>>,
    }

    impl Metrics for Fake {
        fn add(&self, metric: Metric, delta: i64) {
            self.values.borrow_mut()[metric.index()] += delta;
            let hook = self.after_add.borrow_mut().take();
            if let Some(mut f) = hook {
                f(metric, self);
                *self.after_add.borrow_mut() = Some(f);
            }
        }
        fn get(&self, metric: Metric) -> Option<u64> {
            u64::try_from(self.values.borrow()[metric.index()]).ok()
        }
    }

    impl Fake {
        fn value(&self, metric: Metric) -> i64 {
            self.values.borrow()[metric.index()]
        }
    }

    /// A copy that has not read the phase past serving yet.
    fn serving() -> AtomicBool {
        AtomicBool::new(false)
    }

    #[test]
    fn admission_counts_and_rejects_only_once_the_gate_is_up() {
        let f = Fake::default();
        assert_eq!(admit(&f, true, &serving()), Admission::Admitted);
        assert_eq!(
            (
                f.value(Metric::ProviderInflight),
                f.value(Metric::ProviderStarted)
            ),
            (1, 1)
        );
        finish(&f);
        assert_eq!(f.value(Metric::ProviderInflight), 0);
        // As the drain does: the phase first (step 0), then the gate.
        f.add(Metric::DrainPhase, 1);
        f.add(Metric::DrainGate, 1);
        let knows = serving();
        assert_eq!(admit(&f, true, &knows), Admission::Rejected);
        assert!(knows.load(Relaxed), "the closing read is kept");
        assert_eq!(
            (
                f.value(Metric::ProviderInflight),
                f.value(Metric::ProviderStarted)
            ),
            (0, 1),
            "a rejected request leaves no count behind"
        );
        assert_eq!(
            admit(&f, false, &serving()),
            Admission::Admitted,
            "reject_when_drained: false"
        );
    }

    #[test]
    fn an_unreadable_gate_admits() {
        struct Blind;
        impl Metrics for Blind {
            fn add(&self, _: Metric, _: i64) {}
            fn get(&self, _: Metric) -> Option<u64> {
                None
            }
        }
        assert_eq!(admit(&Blind, true, &serving()), Admission::Admitted);
        let t = Traffic::read(&Blind);
        assert!(!t.idle(), "unreadable counts are not quiet");
        assert!(!GateHold::default().try_pass(&Blind, &t));
    }

    #[test]
    fn a_serving_request_reads_the_phase_and_not_the_gate_and_a_closing_copy_reads_only_the_gate() {
        let f = Fake::default();
        // A gate up under a phase of 0 cannot happen (step 0 comes first):
        // it shows which stat each admission read.
        f.add(Metric::DrainGate, 1);
        assert_eq!(admit(&f, true, &serving()), Admission::Admitted);
        finish(&f);
        let knows = AtomicBool::new(true);
        assert_eq!(admit(&f, true, &knows), Admission::Rejected);
        f.add(Metric::DrainPhase, 1);
        f.add(Metric::DrainGate, -1);
        let knows = serving();
        assert_eq!(admit(&f, true, &knows), Admission::Admitted);
        assert!(knows.load(Relaxed), "closing read from the phase");
    }

    #[test]
    fn an_attempt_backs_off_when_a_request_slips_in_and_keeps_its_one_when_not() {
        let f = Fake::default();
        f.add(Metric::DrainPhase, 1);
        let before = Traffic::read(&f);
        // A request arrives right after the attempt's gate += 1: it is
        // rejected, and the attempt (which sees nothing) passes.
        *f.after_add.borrow_mut() = Some(Box::new(|s, f: &Fake| {
            if s == Metric::DrainGate && f.value(Metric::DrainGate) == 1 {
                *f.after_add.borrow_mut() = None;
                assert_eq!(admit(f, true, &serving()), Admission::Rejected);
            }
        }));
        let mut hold = GateHold::default();
        assert!(hold.try_pass(&f, &before));
        assert_eq!(f.value(Metric::DrainGate), 1);
        assert!(hold.try_pass(&f, &before), "idempotent");
        hold.hold(&f);
        assert_eq!(f.value(Metric::DrainGate), 1, "one 1 per copy");
    }

    #[test]
    fn an_attempt_backs_off_when_a_request_started_and_ended_since_its_look() {
        let f = Fake::default();
        let before = Traffic::read(&f);
        assert_eq!(admit(&f, true, &serving()), Admission::Admitted);
        finish(&f);
        let mut hold = GateHold::default();
        assert!(!hold.try_pass(&f, &before), "started moved");
        assert_eq!(f.value(Metric::DrainGate), 0, "backed off");
        assert!(!hold.is_held());
    }

    #[test]
    fn start_watch_moves_only_when_the_total_moves_and_starts_conservative() {
        let mut w = StartWatch::default();
        assert_eq!(w.observe(Some(0), 100), 0, "nothing ever started");
        assert_eq!(w.observe(Some(0), 200), 0);
        assert_eq!(w.observe(Some(3), 300), 300);
        assert_eq!(w.observe(Some(3), 900), 300);
        let mut fresh = StartWatch::default();
        assert_eq!(
            fresh.observe(Some(7), 1000),
            1000,
            "a first look at starts assumes they are recent"
        );
        assert_eq!(
            fresh.observe(None, 2000),
            2000,
            "unreadable: assume one now"
        );
    }
}
