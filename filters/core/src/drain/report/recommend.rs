//! The report's `recommended` settings, derived from what one shutdown
//! measured, each with a sentence naming the measurement: every setting
//! that decided the pass or would have (docs/concepts/gate.md, "Which
//! budget ends the wait", says which budget ends the wait in which case).
//!
//! | setting | from | rule |
//! |---|---|---|
//! | `consumer_update_wait` | the callers that stopped (their last request came more than [`STOPPED_AFTER`] before the end) | 1.5 × the last of their last requests after closing + 500 ms, up to the next 500 ms, at least 1 s; none stopped: the configured value |
//! | `step_timeout` | the same callers | every caller after closing stopped: the recommended wait again, at least 1 s (a caller slower to learn than any seen gets as long again before arrivals count as endless); a caller kept sending to the end, or none came: the configured value |
//! | `longest_request` | the longest request since the provider started (`request_ms.max`, exact) | 1.5 × that, whole seconds (with it set, `step_timeout` ends only arrivals that go on, and a request in flight is waited for until `timeout`); none timed: the configured value, or null |
//! | `timeout` | the same | the recommended wait + step_timeout + `quiet_window` + the recommended `longest_request`, whole seconds (a request that starts as the last arrivals do still ends before it; the drain config accepts the two together); none timed: the configured value, at least wait + step_timeout |
//! | `grace_period_seconds` | the recommended timeout | + [`EXIT_ALLOWANCE`] for the app and Envoy to exit after the gate |
//!
//! Callers still sending at the end ignore the mark: no wait is long enough
//! for them, so they are named in the basis, not waited for. The setting
//! that forced this pass says so in its basis.

use std::time::Duration;

use crate::drain::record::{GatePass, GateTimings};
use crate::shared::duration::format_duration;

use super::durations::Summary;

/// A caller whose last request came this long before the end has stopped.
pub const STOPPED_AFTER: Duration = Duration::from_secs(1);
/// What the grace period adds to the timeout: the app's own shutdown and
/// Envoy's exit after the gate passes.
pub const EXIT_ALLOWANCE: Duration = Duration::from_secs(5);

/// One caller as the recommendation sees it.
#[derive(Debug, Clone)]
pub struct Caller {
    pub name: String,
    /// From closing to its last request's start.
    pub last_ms: u64,
}

/// The recommended settings, as the contract writes them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Recommended {
    pub consumer_update_wait: String,
    pub step_timeout: String,
    pub timeout: String,
    /// Null where nothing was timed and none is configured.
    pub longest_request: Option<String>,
    pub grace_period_seconds: u64,
    pub basis: Basis,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Basis {
    pub consumer_update_wait: String,
    pub step_timeout: String,
    pub timeout: String,
    pub longest_request: String,
    pub grace_period_seconds: String,
}

fn whole_seconds(ms: u64) -> Duration {
    Duration::from_secs(ms.div_ceil(1000).max(1))
}

/// Up to the next 500 ms, at least 1 s.
fn half_seconds(ms: u64) -> Duration {
    Duration::from_millis((ms.div_ceil(500) * 500).max(1000))
}

fn ms_text(us: u64) -> String {
    format!("{} ms", (us + 500) / 1000)
}

/// `callers`: every caller after closing; `end_ms`: from closing to the
/// gate's pass (or now, still closing); `forced_by`: the budget that
/// forced this pass, if one did.
pub fn recommend(
    gate: &GateTimings,
    callers: &[Caller],
    end_ms: u64,
    requests: &Summary,
    forced_by: Option<GatePass>,
) -> Recommended {
    let forced = |by: GatePass| {
        if forced_by == Some(by) {
            "; it forced this pass"
        } else {
            ""
        }
    };
    let stopped_ms = STOPPED_AFTER.as_millis() as u64;
    let (stopped, sending): (Vec<&Caller>, Vec<&Caller>) = callers
        .iter()
        .partition(|c| c.last_ms.saturating_add(stopped_ms) <= end_ms);
    let still = if sending.is_empty() {
        String::new()
    } else {
        let names: Vec<&str> = sending.iter().take(3).map(|c| c.name.as_str()).collect();
        format!(
            "; {} caller(s) kept sending to the end ({}{}): they ignore the closing mark, and no wait is long enough for them",
            sending.len(),
            names.join(", "),
            if sending.len() > 3 { ", …" } else { "" }
        )
    };
    let (wait, wait_basis) = match stopped.iter().max_by_key(|c| c.last_ms) {
        Some(last) => {
            (
                half_seconds(last.last_ms * 3 / 2 + 500),
                format!(
                    "the last of {} caller(s) that stopped sent its final request {} ms after closing ({}); 1.5 × that + 500 ms{still}",
                    stopped.len(),
                    last.last_ms,
                    last.name
                ),
            )
        }
        None if callers.is_empty() => (
            gate.consumer_update_wait,
            format!(
                "no request started after closing (every caller was told before it sent another), so the configured {} is kept",
                format_duration(gate.consumer_update_wait)
            ),
        ),
        None => (
            gate.consumer_update_wait,
            format!(
                "no caller stopped sending after closing, so the configured {} is kept{still}",
                format_duration(gate.consumer_update_wait)
            ),
        ),
    };
    let (step, step_basis) = match stopped.iter().max_by_key(|c| c.last_ms) {
        Some(last) if sending.is_empty() => (
            wait.max(Duration::from_secs(1)),
            format!(
                "every caller after closing stopped, the last {} ms after closing; arrivals that go on past consumer_update_wait get as long again, {}, before they count as endless{}",
                last.last_ms,
                format_duration(wait.max(Duration::from_secs(1))),
                forced(GatePass::StepTimeout)
            ),
        ),
        _ if !sending.is_empty() => (
            gate.step_timeout,
            format!(
                "{} caller(s) kept sending to the end, so arrivals never stopped and no step_timeout would let them; the configured {} is kept{}",
                sending.len(),
                format_duration(gate.step_timeout),
                forced(GatePass::StepTimeout)
            ),
        ),
        _ => (
            gate.step_timeout,
            format!(
                "no request started after closing, so the configured {} is kept",
                format_duration(gate.step_timeout)
            ),
        ),
    };
    let timed = !(requests.count == 0 && requests.max_us == 0);
    let (longest, longest_basis) = if timed {
        let longest = whole_seconds((requests.max_us * 3 / 2).div_ceil(1000));
        (
            Some(longest),
            format!(
                "1.5 × the longest request since the provider started ({}, every request counted; p99 {} over {} recent): with it set, step_timeout ends only arrivals that go on, and a request in flight is waited for until timeout",
                ms_text(requests.max_us),
                ms_text(requests.p99_us),
                requests.count
            ),
        )
    } else {
        (
            gate.longest_request,
            "no request was timed, so the configured value is kept".to_string(),
        )
    };
    let (timeout, timeout_basis) = match (timed, longest) {
        (true, Some(longest)) => {
            let ms = (wait + step + gate.quiet_window + longest).as_millis() as u64;
            (
                whole_seconds(ms),
                format!(
                    "consumer_update_wait {} + step_timeout {} + quiet_window {} + longest_request {} (the longest request since the provider started, {}){}",
                    format_duration(wait),
                    format_duration(step),
                    format_duration(gate.quiet_window),
                    format_duration(longest),
                    ms_text(requests.max_us),
                    forced(GatePass::Timeout)
                ),
            )
        }
        _ => {
            let t = gate.timeout.max(wait + step);
            (
                t,
                format!(
                    "no request was timed, so the configured {} is kept (at least consumer_update_wait + step_timeout){}",
                    format_duration(gate.timeout),
                    forced(GatePass::Timeout)
                ),
            )
        }
    };
    let grace = (timeout + EXIT_ALLOWANCE).as_secs();
    Recommended {
        consumer_update_wait: format_duration(wait),
        step_timeout: format_duration(step),
        timeout: format_duration(timeout),
        longest_request: longest.map(format_duration),
        grace_period_seconds: grace,
        basis: Basis {
            consumer_update_wait: wait_basis,
            step_timeout: step_basis,
            timeout: timeout_basis,
            longest_request: longest_basis,
            grace_period_seconds: format!(
                "timeout {} + {} for the app and Envoy to exit after the gate passes",
                format_duration(timeout),
                format_duration(EXIT_ALLOWANCE)
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// graceful_drain's defaults.
    fn gate() -> GateTimings {
        match crate::drain::config::DrainConfig::from_json(b"") {
            Ok(c) => c.gate,
            Err(e) => panic!("{e}"),
        }
    }

    fn caller(name: &str, last_ms: u64) -> Caller {
        Caller {
            name: name.into(),
            last_ms,
        }
    }

    #[test]
    fn the_wait_comes_from_callers_that_stopped_and_names_those_that_did_not() {
        let timed = Summary {
            count: 200,
            p50_us: 2_000,
            p99_us: 40_000,
            max_us: 2_314_000,
        };
        let r = recommend(
            &gate(),
            &[caller("10.0.0.3 (c-1)", 412), caller("10.0.0.9", 6_900)],
            7_000,
            &timed,
            None,
        );
        // 1.5 × 412 + 500 = 1,118 ms: 1.5 s.
        assert_eq!(r.consumer_update_wait, "1500ms");
        assert!(r.basis.consumer_update_wait.contains("412 ms"), "{r:?}");
        assert!(r.basis.consumer_update_wait.contains("10.0.0.9"), "{r:?}");
        // A caller kept sending: the configured step_timeout stays.
        assert_eq!(r.step_timeout, "3s");
        assert!(
            r.basis.step_timeout.contains("1 caller(s) kept sending"),
            "{r:?}"
        );
        // 1.5 s + 3 s + 0.5 s + 3,471 ms = 8,471 ms: 9 s, which covers the
        // longest after the last arrivals.
        assert_eq!(r.timeout, "9s");
        assert!(r.basis.timeout.contains("2314 ms"), "{r:?}");
        assert_eq!(r.grace_period_seconds, 14);
        // A caller told at once: the least wait, 1 s.
        let r = recommend(&gate(), &[caller("c", 2)], 5_000, &timed, None);
        assert_eq!(r.consumer_update_wait, "1s");
        // Every caller stopped: the wait again for a slower one.
        assert_eq!(r.step_timeout, "1s");
        assert!(r.basis.step_timeout.contains("2 ms after closing"), "{r:?}");
    }

    #[test]
    fn the_budget_that_forced_the_pass_says_so() {
        let timed = Summary {
            count: 3,
            p50_us: 1_000,
            p99_us: 1_000,
            max_us: 1_000,
        };
        let callers = [caller("10.0.0.9", 4_900)];
        let r = recommend(
            &gate(),
            &callers,
            5_000,
            &timed,
            Some(GatePass::StepTimeout),
        );
        assert!(
            r.basis.step_timeout.ends_with("it forced this pass"),
            "{r:?}"
        );
        assert!(!r.basis.timeout.contains("forced"), "{r:?}");
        let r = recommend(&gate(), &callers, 5_000, &timed, Some(GatePass::Timeout));
        assert!(r.basis.timeout.ends_with("it forced this pass"), "{r:?}");
        assert!(!r.basis.step_timeout.contains("forced"), "{r:?}");
    }

    #[test]
    fn without_measurements_the_configured_values_stay() {
        let r = recommend(&gate(), &[], 3_600, &Summary::default(), None);
        assert_eq!(
            (
                r.consumer_update_wait.as_str(),
                r.step_timeout.as_str(),
                r.timeout.as_str()
            ),
            ("3s", "3s", "1m")
        );
        assert!(r.basis.step_timeout.contains("no request started"), "{r:?}");
        assert_eq!(r.grace_period_seconds, 65);
        assert!(r.basis.timeout.contains("no request was timed"), "{r:?}");
    }

    #[test]
    fn the_timeout_always_covers_the_wait_and_the_longest_request() {
        for max_ms in [0u64, 1, 999, 1_000, 5_432, 61_000] {
            for last in [0u64, 10, 2_000, 9_999] {
                let timed = Summary {
                    count: 1,
                    p50_us: 1,
                    p99_us: 1,
                    max_us: max_ms * 1000,
                };
                let r = recommend(&gate(), &[caller("a", last)], last + 5_000, &timed, None);
                let wait =
                    crate::shared::duration::parse_duration(&r.consumer_update_wait).unwrap();
                let step = crate::shared::duration::parse_duration(&r.step_timeout).unwrap();
                let timeout = crate::shared::duration::parse_duration(&r.timeout).unwrap();
                assert!(wait.as_millis() as u64 > last, "{r:?}");
                // A request that starts as late as arrivals may go on
                // unforced still ends before the timeout.
                assert!(
                    timeout >= wait + step + Duration::from_millis(max_ms),
                    "{r:?}"
                );
                assert!(r.grace_period_seconds > timeout.as_secs(), "{r:?}");
                // The drain config takes the recommendation as it is.
                let json = serde_json::json!({
                    "consumer_update_wait": r.consumer_update_wait,
                    "step_timeout": r.step_timeout,
                    "timeout": r.timeout,
                    "longest_request": r.longest_request,
                });
                let cfg = crate::drain::config::DrainConfig::from_json(json.to_string().as_bytes());
                let longest = cfg
                    .map(|c| c.gate.longest_request)
                    .unwrap_or_else(|e| panic!("{e}: {r:?}"));
                assert!(
                    longest.is_some_and(|l| l >= Duration::from_millis(max_ms)),
                    "{r:?}"
                );
            }
        }
    }
}
