//! The instance record under arbitrary admissions, ends, closings and gate
//! evaluations at arbitrary times and timings: never a panic; the count is
//! exact; the phase only moves forward; the gate passes at most once, never
//! before consumer_update_wait, and never unforced with requests in flight.
#![no_main]

use std::time::Duration;

use graceful_core::record::{Admission, GateTimings, InstanceRecord, Phase};
use graceful_core::traffic::Traffic;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Op {
    Admit { reject: bool },
    Finish,
    StartClosing,
    Advance { outbound: u8 },
}

#[derive(Arbitrary, Debug)]
struct Input {
    wait_ms: u32,
    quiet_ms: u32,
    step_ms: u32,
    timeout_ms: u32,
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
    };
    let mut r = InstanceRecord::default();
    let mut now = input.start_us;
    let mut outstanding: u64 = 0;
    let mut passes = 0;
    for (dt, op) in &input.steps {
        now = now.saturating_add(u64::from(*dt));
        let before = r;
        match op {
            Op::Admit { reject } => {
                let (next, a) = r.admit(now, *reject);
                if a == Admission::Admitted {
                    outstanding += 1;
                } else {
                    assert!(before.phase == Phase::Drained && *reject && next == before);
                }
                r = next;
            }
            Op::Finish => {
                r = r.finish();
                outstanding = outstanding.saturating_sub(1);
            }
            Op::StartClosing => r = r.start_closing(now),
            Op::Advance { outbound } => {
                let out = Traffic {
                    inflight: u64::from(*outbound),
                    last_start_us: 0,
                };
                let (next, pass) = r.evaluate(&gate, &out, now);
                if let Some(why) = pass {
                    passes += 1;
                    let elapsed = now.saturating_sub(before.closing_since_us);
                    assert!(elapsed >= gate.consumer_update_wait.as_micros() as u64);
                    if before.inbound.inflight + u64::from(*outbound) > 0 {
                        assert!(why.forced());
                    }
                    assert_eq!(next.phase, Phase::Drained);
                }
                r = next;
            }
        }
        assert_eq!(r.inbound.inflight, outstanding);
        assert!(r.phase.gauge() >= before.phase.gauge());
        assert_eq!(InstanceRecord::decode(&r.encode()), Some(r));
    }
    assert!(passes <= 1);
});
