//! The drain gate's protocol ([`graceful_core::shared::gate`]) model-checked: the
//! real `admit`, `finish` and `GateHold::try_pass` run on threads whose
//! every metric operation waits for a scheduler's go, so a run is one
//! interleaving of those operations, each atomic: sequential consistency,
//! what Envoy's `std::atomic` stats give. Small worlds are checked for
//! every interleaving (stateless model checking, depth first), larger ones
//! for many random ones. Each run must keep the gate's promises:
//!
//! - every admitted request has ended before a passing attempt's last read
//!   of the in-flight count: none is in flight at the pass, and none is
//!   admitted after it;
//! - no request is admitted after reading the gate once it was up, nor
//!   after reading the phase as serving once a gate was up (a serving
//!   request reads the phase, not the gate: every attempt raises the phase
//!   first);
//! - the in-flight count ends exact (0), and the gate ends up by exactly
//!   the passes that held.
//!
//! Deliberately broken protocols (reading the gate before counting the
//! request in; raising the phase after the gate) are checked too, and must
//! be caught.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::AtomicBool;
use std::sync::{Condvar, Mutex};

use graceful_core::drain::gate_copy::raise_phase;
use graceful_core::drain::record::Phase;
use graceful_core::shared::gate::{self, Admission, GateHold, Traffic};
use graceful_core::shared::metrics::{Metric, Metrics, PhaseGauge};

/// One metric operation as the scheduler ran it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Add(Metric, i64),
    Get(Metric, u64),
    Set(Metric, u64),
}

#[derive(Default)]
struct State {
    values: [i64; Metric::ALL.len()],
    /// Every operation, in the order it ran: (actor, op).
    log: Vec<(usize, Op)>,
    turn: Option<usize>,
    parked: Vec<bool>,
    finished: Vec<bool>,
}

struct Sched {
    state: Mutex<State>,
    cv: Condvar,
}

/// What the metrics look like to one actor.
struct ActorMetrics<'a> {
    id: usize,
    sched: &'a Sched,
}

impl ActorMetrics<'_> {
    fn step(&self, f: impl FnOnce(&mut State) -> Op) -> Op {
        let mut st = self.sched.state.lock().unwrap();
        st.parked[self.id] = true;
        self.sched.cv.notify_all();
        while st.turn != Some(self.id) {
            st = self.sched.cv.wait(st).unwrap();
        }
        let op = f(&mut st);
        st.log.push((self.id, op));
        st.turn = None;
        st.parked[self.id] = false;
        self.sched.cv.notify_all();
        op
    }
}

impl Metrics for ActorMetrics<'_> {
    fn add(&self, metric: Metric, delta: i64) {
        self.step(|st| {
            st.values[metric.index()] += delta;
            Op::Add(metric, delta)
        });
    }

    fn get(&self, metric: Metric) -> Option<u64> {
        // Nothing in these worlds writes the outbound metrics: their reads
        // commute with every operation, so they need no interleaving.
        if matches!(metric, Metric::ConsumerInflight | Metric::ConsumerStarted) {
            return Some(0);
        }
        match self.step(|st| Op::Get(metric, u64::try_from(st.values[metric.index()]).unwrap())) {
            Op::Get(_, v) => Some(v),
            Op::Add(..) | Op::Set(..) => unreachable!(),
        }
    }
}

impl PhaseGauge for ActorMetrics<'_> {
    fn get(&self) -> Option<u64> {
        Metrics::get(self, Metric::DrainPhase)
    }

    fn set(&self, value: u64) {
        self.step(|st| {
            st.values[Metric::DrainPhase.index()] = i64::try_from(value).unwrap();
            Op::Set(Metric::DrainPhase, value)
        });
    }
}

/// Who acts in a world.
#[derive(Clone, Copy, Debug)]
enum Actor {
    /// A request: admitted or rejected, and if admitted, ended.
    Request,
    /// A request on a copy that has read the phase past serving: it reads
    /// only the gate.
    RequestKnowingClosing,
    /// A request under a broken protocol: gate read before the count.
    BrokenRequest,
    /// A drain copy: raises the phase to closing, looks, then tries to
    /// pass.
    Attempt,
    /// A drain copy under a broken protocol: the phase raised after its
    /// attempt.
    BrokenAttempt,
    /// A drain copy that raised the phase on an earlier tick (a world with
    /// one starts closing): looks, then tries to pass.
    AttemptWhileClosing,
}

/// What each actor did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Admitted,
    Rejected,
    Passed,
    BackedOff,
}

fn act(actor: Actor, metrics: &ActorMetrics) -> Outcome {
    match actor {
        // A copy of its own: it has not read the phase past serving.
        Actor::Request | Actor::RequestKnowingClosing => {
            let knows_closing = AtomicBool::new(matches!(actor, Actor::RequestKnowingClosing));
            match gate::admit(metrics, true, &knows_closing) {
                Admission::Admitted => {
                    gate::finish(metrics);
                    Outcome::Admitted
                }
                Admission::Rejected => Outcome::Rejected,
            }
        }
        Actor::BrokenRequest => {
            if Metrics::get(metrics, Metric::DrainGate).is_some_and(|g| g > 0) {
                return Outcome::Rejected;
            }
            metrics.add(Metric::ProviderInflight, 1);
            metrics.add(Metric::ProviderStarted, 1);
            metrics.add(Metric::ProviderInflight, -1);
            Outcome::Admitted
        }
        Actor::Attempt => {
            raise_phase(metrics, Phase::Closing);
            attempt(metrics)
        }
        Actor::BrokenAttempt => {
            let outcome = attempt(metrics);
            raise_phase(metrics, Phase::Closing);
            outcome
        }
        Actor::AttemptWhileClosing => attempt(metrics),
    }
}

fn attempt(metrics: &ActorMetrics) -> Outcome {
    let before = Traffic::read(metrics);
    if GateHold::default().try_pass(metrics, &before) {
        Outcome::Passed
    } else {
        Outcome::BackedOff
    }
}

/// How the scheduler picks among the actors waiting to run.
enum Pick<'a> {
    /// Follow these choices (indices into the waiting list), then the first.
    Prefix(&'a [usize]),
    /// Pseudo-random choices from this seed.
    Random(u64),
}

struct Run {
    /// (choice made, how many were waiting) at each step.
    choices: Vec<(usize, usize)>,
    log: Vec<(usize, Op)>,
    values: [i64; Metric::ALL.len()],
    outcomes: Vec<Outcome>,
}

fn run(actors: &[Actor], mut pick: Pick) -> Run {
    let n = actors.len();
    let mut values = [0; Metric::ALL.len()];
    if actors
        .iter()
        .any(|a| matches!(a, Actor::AttemptWhileClosing))
    {
        values[Metric::DrainPhase.index()] = 1;
    }
    let sched = Sched {
        state: Mutex::new(State {
            values,
            parked: vec![false; n],
            finished: vec![false; n],
            ..State::default()
        }),
        cv: Condvar::new(),
    };
    let outcomes = Mutex::new(vec![None; n]);
    let mut choices = Vec::new();
    std::thread::scope(|scope| {
        for (id, &actor) in actors.iter().enumerate() {
            let sched = &sched;
            let outcomes = &outcomes;
            scope.spawn(move || {
                let out = act(actor, &ActorMetrics { id, sched });
                outcomes.lock().unwrap()[id] = Some(out);
                let mut st = sched.state.lock().unwrap();
                st.finished[id] = true;
                sched.cv.notify_all();
            });
        }
        loop {
            let mut st = sched.state.lock().unwrap();
            while (0..n).any(|i| !st.parked[i] && !st.finished[i]) {
                st = sched.cv.wait(st).unwrap();
            }
            let waiting: Vec<usize> = (0..n).filter(|&i| st.parked[i]).collect();
            if waiting.is_empty() {
                break;
            }
            let step = choices.len();
            let choice = match &mut pick {
                Pick::Prefix(prefix) => prefix.get(step).copied().unwrap_or(0),
                Pick::Random(seed) => {
                    *seed ^= *seed << 13;
                    *seed ^= *seed >> 7;
                    *seed ^= *seed << 17;
                    usize::try_from(*seed % waiting.len() as u64).unwrap()
                }
            };
            choices.push((choice, waiting.len()));
            st.turn = Some(waiting[choice]);
            sched.cv.notify_all();
            while st.turn.is_some() {
                st = sched.cv.wait(st).unwrap();
            }
        }
    });
    let st = sched.state.into_inner().unwrap();
    Run {
        choices,
        log: st.log,
        values: st.values,
        outcomes: outcomes
            .into_inner()
            .unwrap()
            .into_iter()
            .map(|o| o.unwrap())
            .collect(),
    }
}

/// The gate's promises for one run; Err says which was broken.
fn check(actors: &[Actor], r: &Run) -> Result<(), String> {
    let pos = |actor: usize, want: &dyn Fn(&Op) -> bool| -> Vec<usize> {
        r.log
            .iter()
            .enumerate()
            .filter(|(_, (a, op))| *a == actor && want(op))
            .map(|(i, _)| i)
            .collect()
    };
    let mut passes = 0;
    for (d, _) in actors.iter().enumerate().filter(|(_, a)| {
        matches!(
            a,
            Actor::Attempt | Actor::BrokenAttempt | Actor::AttemptWhileClosing
        )
    }) {
        if r.outcomes[d] != Outcome::Passed {
            continue;
        }
        passes += 1;
        let gate_up = pos(d, &|op| *op == Op::Add(Metric::DrainGate, 1))[0];
        let check_read = *pos(d, &|op| matches!(op, Op::Get(Metric::ProviderInflight, _)))
            .last()
            .unwrap();
        for (q, _) in actors.iter().enumerate().filter(|(_, a)| {
            matches!(
                a,
                Actor::Request | Actor::RequestKnowingClosing | Actor::BrokenRequest
            )
        }) {
            if r.outcomes[q] != Outcome::Admitted {
                continue;
            }
            // Admitted requests must all have ended before the attempt's
            // last look at the count: none in flight at the pass, none
            // admitted after it.
            let ended = pos(q, &|op| *op == Op::Add(Metric::ProviderInflight, -1));
            if ended[0] > check_read {
                return Err(format!(
                    "request {q} in flight after attempt {d} passed: {:?}",
                    r.log
                ));
            }
            // What admitted it: the gate read, or a phase read as serving
            // (then no gate read).
            let deciding = pos(q, &|op| matches!(op, Op::Get(Metric::DrainGate, _)))
                .first()
                .or(pos(q, &|op| *op == Op::Get(Metric::DrainPhase, 0)).first())
                .copied()
                .ok_or(format!("request {q} admitted with no read: {:?}", r.log))?;
            if deciding > gate_up {
                return Err(format!(
                    "request {q} admitted although it read after attempt {d} put the gate up: {:?}",
                    r.log
                ));
            }
        }
    }
    if r.values[Metric::ProviderInflight.index()] != 0 {
        return Err(format!("in-flight count ends at {:?}", r.values));
    }
    if r.values[Metric::DrainGate.index()] != passes {
        return Err(format!(
            "gate ends at {} after {passes} passes: {:?}",
            r.values[Metric::DrainGate.index()],
            r.log
        ));
    }
    Ok(())
}

/// Every interleaving of `actors`; returns how many, or the first broken
/// promise.
fn every_interleaving(actors: &[Actor]) -> Result<usize, String> {
    let mut prefix: Vec<usize> = Vec::new();
    let mut runs = 0;
    loop {
        let r = run(actors, Pick::Prefix(&prefix));
        runs += 1;
        check(actors, &r)?;
        // The next schedule: the deepest choice with an untried sibling.
        let Some(depth) = r.choices.iter().rposition(|&(c, n)| c + 1 < n) else {
            return Ok(runs);
        };
        prefix = r.choices[..depth].iter().map(|&(c, _)| c).collect();
        prefix.push(r.choices[depth].0 + 1);
    }
}

fn random_interleavings(actors: &[Actor], runs: usize) -> Result<(), String> {
    for seed in 1..=runs as u64 {
        let r = run(
            actors,
            Pick::Random(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        );
        check(actors, &r)?;
    }
    Ok(())
}

#[test]
fn one_request_and_one_attempt_every_interleaving() {
    let runs = every_interleaving(&[Actor::Request, Actor::Attempt]).unwrap();
    // Admitted: 4 request ops, rejected 3; the attempt 5 or 6: the count
    // shows the search went through all of them, not one.
    assert!(runs > 50, "{runs} interleavings");
}

#[test]
fn two_requests_and_one_attempt_every_interleaving() {
    // Closing already, and known to the requests' copies: every
    // interleaving of the gate itself. The phase read and its raising
    // under way are the one-request world's and the random ones'; all of
    // it here would be some 365,000 runs (minutes).
    let runs = every_interleaving(&[
        Actor::RequestKnowingClosing,
        Actor::RequestKnowingClosing,
        Actor::AttemptWhileClosing,
    ])
    .unwrap();
    println!("{runs} interleavings");
    assert!(runs > 1_000, "{runs} interleavings");
}

#[test]
fn two_attempts_at_once_with_requests_random_interleavings() {
    random_interleavings(
        &[
            Actor::Request,
            Actor::Attempt,
            Actor::Attempt,
            Actor::Request,
        ],
        3_000,
    )
    .unwrap();
}

#[test]
fn the_checker_catches_a_protocol_that_reads_the_gate_before_counting() {
    let err = every_interleaving(&[Actor::BrokenRequest, Actor::Attempt])
        .expect_err("reading the gate before counting the request in must lose");
    assert!(
        err.contains("request 0 in flight after attempt 1 passed"),
        "{err}"
    );
}

#[test]
fn the_checker_catches_a_drain_that_raises_the_phase_after_the_gate() {
    let err = every_interleaving(&[Actor::Request, Actor::BrokenAttempt])
        .expect_err("a serving phase read under a gate already up must lose");
    assert!(err.contains("request 0"), "{err}");
}
