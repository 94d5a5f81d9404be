//! The report's `recommended` settings, derived from what one shutdown
//! measured, each with a sentence naming the measurement.
//!
//! | setting | from | rule |
//! |---|---|---|
//! | `consumer_update_wait` | the callers that stopped (their last request came more than [`STOPPED_AFTER`] before the end) | 1.5 × the last of their last requests after closing + 500 ms, up to the next 500 ms, at least 1 s; none stopped: the configured value |
//! | `timeout` | the longest request seen (`request_ms.max`) | the recommended wait + `quiet_window` + 1.5 × that, whole seconds; none timed: the configured value |
//! | `grace_period_seconds` | the recommended timeout | + [`EXIT_ALLOWANCE`] for the app and Envoy to exit after the gate |
//!
//! Callers still sending at the end ignore the mark: no wait is long enough
//! for them, so they are named in the basis, not waited for.

use std::time::Duration;

use crate::duration::format_duration;
use crate::record::GateTimings;

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
    pub timeout: String,
    pub grace_period_seconds: u64,
    pub basis: Basis,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Basis {
    pub consumer_update_wait: String,
    pub timeout: String,
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
/// gate's pass (or now, still closing).
pub fn recommend(
    gate: &GateTimings,
    callers: &[Caller],
    end_ms: u64,
    requests: &Summary,
) -> Recommended {
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
    let (timeout, timeout_basis) = if requests.count == 0 && requests.max_us == 0 {
        let t = gate.timeout.max(wait);
        (
            t,
            format!(
                "no request was timed, so the configured {} is kept",
                format_duration(gate.timeout)
            ),
        )
    } else {
        let ms = (wait + gate.quiet_window).as_millis() as u64
            + (requests.max_us * 3 / 2).div_ceil(1000);
        (
            whole_seconds(ms),
            format!(
                "consumer_update_wait {} + quiet_window {} + 1.5 × the longest request seen ({}; p99 {} over {} recent)",
                format_duration(wait),
                format_duration(gate.quiet_window),
                ms_text(requests.max_us),
                ms_text(requests.p99_us),
                requests.count
            ),
        )
    };
    let grace = (timeout + EXIT_ALLOWANCE).as_secs();
    Recommended {
        consumer_update_wait: format_duration(wait),
        timeout: format_duration(timeout),
        grace_period_seconds: grace,
        basis: Basis {
            consumer_update_wait: wait_basis,
            timeout: timeout_basis,
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
        match crate::config::DrainConfig::from_json(b"") {
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
        );
        // 1.5 × 412 + 500 = 1,118 ms: 1.5 s.
        assert_eq!(r.consumer_update_wait, "1500ms");
        assert!(r.basis.consumer_update_wait.contains("412 ms"), "{r:?}");
        assert!(r.basis.consumer_update_wait.contains("10.0.0.9"), "{r:?}");
        // 1.5 s + 0.5 s + 3,471 ms = 5,471 ms: 6 s, which covers the longest.
        assert_eq!(r.timeout, "6s");
        assert!(r.basis.timeout.contains("2314 ms"), "{r:?}");
        assert_eq!(r.grace_period_seconds, 11);
        // A caller told at once: the least wait, 1 s.
        let r = recommend(&gate(), &[caller("c", 2)], 5_000, &timed);
        assert_eq!(r.consumer_update_wait, "1s");
    }

    #[test]
    fn without_measurements_the_configured_values_stay() {
        let r = recommend(&gate(), &[], 3_600, &Summary::default());
        assert_eq!(
            (r.consumer_update_wait.as_str(), r.timeout.as_str()),
            ("3s", "1m")
        );
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
                let r = recommend(&gate(), &[caller("a", last)], last + 5_000, &timed);
                let wait = crate::duration::parse_duration(&r.consumer_update_wait).unwrap();
                let timeout = crate::duration::parse_duration(&r.timeout).unwrap();
                assert!(wait.as_millis() as u64 > last, "{r:?}");
                assert!(timeout >= wait + Duration::from_millis(max_ms), "{r:?}");
                assert!(r.grace_period_seconds > timeout.as_secs(), "{r:?}");
            }
        }
    }
}
