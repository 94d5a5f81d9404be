//! The instance record under arbitrary closings and gate evaluations, at
//! arbitrary times and timings, with arbitrary traffic as the evaluating
//! copy sees it: never a panic; the phase only moves forward; the gate
//! passes at most once, never before consumer_update_wait, never unforced
//! with requests in flight or within the quiet window, and step_timeout
//! forces it only while requests keep arriving. (The
//! protocol that makes a pass safe against racing requests is checked in
//! filters/core/tests/gate_model.rs.)
#![no_main]

use std::time::Duration;

use graceful_core::drain::record::{GatePass, GateTimings, InstanceRecord, Phase, Seen};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Op {
    StartClosing,
    Evaluate { idle: bool, last_start_ago_us: u32 },
}

#[derive(Arbitrary, Debug)]
struct Input {
    wait_ms: u32,
    quiet_ms: u32,
    step_ms: u32,
    timeout_ms: u32,
    longest: bool,
    start_us: u64,
    steps: Vec<(u32, Op)>,
}

fuzz_target!(|input: Input| {
    let ms = |v: u32| Duration::from_millis(u64::from(v));
    let gate = GateTimings {
        consumer_update_wait: ms(input.wait_ms.min(input.timeout_ms)),
        quiet_window: ms(input.quiet_ms),
        step_timeout: ms(input.step_ms),
        timeout: ms(input.timeout_ms.max(input.wait_ms)),
        longest_request: input.longest.then(|| ms(input.timeout_ms)),
    };
    let mut r = InstanceRecord::default();
    let mut now = input.start_us;
    let mut passes = 0;
    for (dt, op) in &input.steps {
        now = now.saturating_add(u64::from(*dt));
        let before = r;
        match op {
            Op::StartClosing => r = r.start_closing(now),
            Op::Evaluate {
                idle,
                last_start_ago_us,
            } => {
                let seen = Seen {
                    idle: *idle,
                    last_start_us: now.saturating_sub(u64::from(*last_start_ago_us)),
                };
                let (next, pass) = r.evaluate(&gate, &seen, now);
                if let Some(why) = pass {
                    passes += 1;
                    let elapsed = now.saturating_sub(before.closing_since_us);
                    assert!(elapsed >= gate.consumer_update_wait.as_micros() as u64);
                    let quiet = *idle
                        && u64::from(*last_start_ago_us) >= gate.quiet_window.as_micros() as u64;
                    if !quiet {
                        assert!(why.forced());
                    }
                    if why == GatePass::StepTimeout {
                        // With longest_request the step timeout stops
                        // admission instead (stops_admitting).
                        assert!(gate.longest_request.is_none());
                    }
                    assert_eq!(next.phase, Phase::Drained);
                    r = next;
                }
            }
        }
        assert!(r.phase.gauge() >= before.phase.gauge());
        assert_eq!(InstanceRecord::decode(&r.encode()), Some(r));
    }
    assert!(passes <= 1);
});
