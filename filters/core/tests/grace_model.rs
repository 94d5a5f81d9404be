//! The grace count's protocol ([`graceful_core::consumer::front::grace`])
//! model-checked as `gate_model.rs` checks the drain gate: the real
//! `enter`, `leave`, `advance` and `clear` run on threads whose every
//! metric operation waits for a scheduler's go, so a run is one
//! interleaving of those operations, each atomic (Envoy's stats are
//! sequentially consistent atomics). Small worlds are checked for every
//! interleaving, larger ones for many random ones. The promise: once a
//! steering's acknowledgement finds its guard clear, every request that
//! read the generation before that steering's bump (so was not steered
//! away) has been answered, before the guard's last read.
//!
//! A broken protocol (counting the request after the generation read that
//! steers it) is checked too, and must be caught.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Condvar, Mutex};

use graceful_core::consumer::front::grace;
use graceful_core::shared::metrics::{Metric, Metrics};

/// One metric operation as the scheduler ran it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Add(Metric, i64),
    Get(Metric, u64),
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
    /// Operations this actor ran so far.
    ops: std::cell::Cell<usize>,
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
        self.ops.set(self.ops.get() + 1);
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
        match self.step(|st| Op::Get(metric, u64::try_from(st.values[metric.index()]).unwrap())) {
            Op::Get(_, v) => Some(v),
            Op::Add(..) => unreachable!(),
        }
    }
}

/// Who acts in a world.
#[derive(Clone, Copy, Debug)]
enum Actor {
    /// A request of the listener instance: counted, steered by the
    /// generation it reads, answered.
    Request,
    /// Counted after the generation read (broken).
    BrokenRequest,
    /// The poll's lease holder: `n` steerings in turn, each a generation
    /// bump, the steering's epoch, then up to two polls checking its guard.
    Steerer(usize),
}

/// What each actor did.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    /// The generation it read.
    Request(u64),
    /// Per steering, the number of the steerer's operations when its guard
    /// read clear (its last read), if it did.
    Steerer(Vec<Option<usize>>),
}

fn act(actor: Actor, m: &ActorMetrics) -> Outcome {
    match actor {
        Actor::Request => {
            let gauge = grace::enter(m).unwrap();
            let gen = m.get(Metric::ConsumerGeneration).unwrap();
            grace::leave(m, gauge);
            Outcome::Request(gen)
        }
        Actor::BrokenRequest => {
            let gen = m.get(Metric::ConsumerGeneration).unwrap();
            let gauge = grace::enter(m).unwrap();
            grace::leave(m, gauge);
            Outcome::Request(gen)
        }
        Actor::Steerer(n) => {
            let mut acks = Vec::new();
            for _ in 0..n {
                m.add(Metric::ConsumerGeneration, 1);
                // As the front's poll does (serve.rs, front_epoch).
                let epoch = m.get(Metric::FrontEpoch).unwrap();
                let target = grace::advance(m)
                    .map(grace::stored)
                    .unwrap_or(grace::stored(epoch + 1));
                let mut acked = None;
                for _ in 0..2 {
                    let now = m.get(Metric::FrontEpoch).unwrap();
                    if grace::ahead(target, now) {
                        grace::advance(m);
                    }
                    if grace::clear(m, target) {
                        acked = Some(m.ops.get());
                        break;
                    }
                }
                acks.push(acked);
            }
            Outcome::Steerer(acks)
        }
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
    let values = [0; Metric::ALL.len()];
    let sched = Sched {
        state: Mutex::new(State {
            values,
            parked: vec![false; n],
            finished: vec![false; n],
            ..State::default()
        }),
        cv: Condvar::new(),
    };
    let outcomes: Mutex<Vec<Option<Outcome>>> = Mutex::new(vec![None; n]);
    let mut choices = Vec::new();
    std::thread::scope(|scope| {
        for (id, &actor) in actors.iter().enumerate() {
            let sched = &sched;
            let outcomes = &outcomes;
            scope.spawn(move || {
                let out = act(
                    actor,
                    &ActorMetrics {
                        id,
                        sched,
                        ops: std::cell::Cell::new(0),
                    },
                );
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

/// The promise for one run; Err says how it was broken.
fn check(actors: &[Actor], r: &Run) -> Result<(), String> {
    let ops_of = |actor: usize| -> Vec<usize> {
        r.log
            .iter()
            .enumerate()
            .filter(|(_, (a, _))| *a == actor)
            .map(|(i, _)| i)
            .collect()
    };
    for (d, _) in actors.iter().enumerate() {
        let Outcome::Steerer(acks) = &r.outcomes[d] else {
            continue;
        };
        let own = ops_of(d);
        for (i, ack) in acks.iter().enumerate() {
            let Some(n) = ack else {
                continue;
            };
            let last_read = own[n - 1];
            for (q, _) in actors.iter().enumerate() {
                // Not steered by steering i: read the generation before its bump.
                let Outcome::Request(gen) = r.outcomes[q] else {
                    continue;
                };
                if gen > i as u64 {
                    continue;
                }
                let answered = *ops_of(q).last().unwrap();
                if answered > last_read {
                    return Err(format!(
                        "request {q} (generation {gen}) in flight after steering {i} was acknowledged: {:?}",
                        r.log
                    ));
                }
            }
        }
    }
    for m in [Metric::FrontAwaiting0, Metric::FrontAwaiting1] {
        if r.values[m.index()] != 0 {
            return Err(format!("{} ends at {:?}", m.name(), r.values));
        }
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
fn one_request_and_one_steering_every_interleaving() {
    let runs = every_interleaving(&[Actor::Request, Actor::Steerer(1)]).unwrap();
    assert!(runs > 100, "{runs} interleavings");
}

#[test]
fn one_request_and_two_steerings_every_interleaving() {
    let runs = every_interleaving(&[Actor::Request, Actor::Steerer(2)]).unwrap();
    assert!(runs > 500, "{runs} interleavings");
}

#[test]
fn requests_and_steerings_random_interleavings() {
    random_interleavings(
        &[
            Actor::Request,
            Actor::Steerer(3),
            Actor::Request,
            Actor::Request,
        ],
        3_000,
    )
    .unwrap();
}

#[test]
fn the_checker_catches_a_request_counted_after_its_generation_read() {
    let err = every_interleaving(&[Actor::BrokenRequest, Actor::Steerer(1)])
        .expect_err("counting after the steering read must lose");
    assert!(err.contains("request 0"), "{err}");
}
