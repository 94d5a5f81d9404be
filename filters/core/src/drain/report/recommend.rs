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
//!
//! Every value is one the drain config's parser takes with the configured
//! `quiet_window`: none above the 24 h it accepts ([`MAX_DURATION`]), and
//! `step_timeout`, then `longest_request`, cut so the timeout covering them
//! fits in it (none is left when nothing fits); a cut value's basis says so.

use std::time::Duration;

use crate::drain::record::{GatePass, GateTimings};
use crate::shared::duration::{format_duration, MAX_DURATION};

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
    Duration::from_millis(ms.div_ceil(500).saturating_mul(500).max(1000))
}

/// Up to the next whole second: a timeout never below what it must cover.
fn up_to_second(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs() + u64::from(d.subsec_nanos() > 0))
}

/// Up to the next millisecond: [`format_duration`] writes milliseconds, so
/// a value rounded down on the way out could fall below what it covers.
fn up_to_ms(d: Duration) -> Duration {
    let ms = d.as_millis() + u128::from(!d.subsec_nanos().is_multiple_of(1_000_000));
    Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

/// Down to a whole millisecond (so it is written as it is).
fn down_to_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn ms_text(us: u64) -> String {
    format!("{} ms", us.saturating_add(500) / 1000)
}

/// What a basis adds when a value was cut to the parser's bound.
const CAPPED: &str = "; capped at 24h, the most the drain config accepts";

/// `d`, at most [`MAX_DURATION`], and whether it was cut.
fn capped(d: Duration) -> (Duration, bool) {
    (d.min(MAX_DURATION), d > MAX_DURATION)
}

fn capped_note(cut: bool) -> &'static str {
    if cut {
        CAPPED
    } else {
        ""
    }
}

/// The callers after closing, split by whether they stopped before the end.
struct Callers<'a> {
    any: bool,
    stopped: Vec<&'a Caller>,
    sending: Vec<&'a Caller>,
}

impl<'a> Callers<'a> {
    fn split(callers: &'a [Caller], end_ms: u64) -> Self {
        let stopped_ms = STOPPED_AFTER.as_millis() as u64;
        let (stopped, sending) = callers
            .iter()
            .partition(|c| c.last_ms.saturating_add(stopped_ms) <= end_ms);
        Callers {
            any: !callers.is_empty(),
            stopped,
            sending,
        }
    }

    /// The stopped caller whose last request came latest.
    fn last_stopped(&self) -> Option<&'a Caller> {
        self.stopped.iter().copied().max_by_key(|c| c.last_ms)
    }

    /// The basis's clause naming the callers still sending at the end.
    fn still_sending(&self) -> String {
        if self.sending.is_empty() {
            return String::new();
        }
        let names: Vec<&str> = self
            .sending
            .iter()
            .take(3)
            .map(|c| c.name.as_str())
            .collect();
        format!(
            "; {} caller(s) kept sending to the end ({}{}): they ignore the closing mark, and no wait is long enough for them",
            self.sending.len(),
            names.join(", "),
            if self.sending.len() > 3 { ", …" } else { "" }
        )
    }
}

/// The basis's clause for the budget that forced this pass.
fn forced_note(forced_by: Option<GatePass>, by: GatePass) -> &'static str {
    if forced_by == Some(by) {
        "; it forced this pass"
    } else {
        ""
    }
}

/// `consumer_update_wait`: 1.5 × the last stopped caller's final request
/// + 500 ms; without one, the configured value.
fn consumer_update_wait(gate: &GateTimings, callers: &Callers) -> (Duration, String) {
    let still = callers.still_sending();
    let Some(last) = callers.last_stopped() else {
        let why = if callers.any {
            "no caller stopped sending after closing"
        } else {
            "no request started after closing (every caller was told before it sent another)"
        };
        let (wait, cut) = capped(up_to_ms(gate.consumer_update_wait));
        return (
            wait,
            format!(
                "{why}, so the configured {} is kept{}{still}",
                format_duration(wait),
                capped_note(cut)
            ),
        );
    };
    let ms = (last.last_ms.saturating_mul(3) / 2).saturating_add(500);
    let (wait, cut) = capped(half_seconds(ms));
    (
        wait,
        format!(
            "the last of {} caller(s) that stopped sent its final request {} ms after closing ({}); 1.5 × that + 500 ms{}{still}",
            callers.stopped.len(),
            last.last_ms,
            last.name,
            capped_note(cut)
        ),
    )
}

/// `step_timeout`: every caller stopped, the wait again; else the
/// configured value. Never more than `timeout` can hold after the wait.
fn step_timeout(
    gate: &GateTimings,
    callers: &Callers,
    wait: Duration,
    forced_by: Option<GatePass>,
) -> (Duration, String) {
    let (step, why) = match callers.last_stopped() {
        Some(last) if callers.sending.is_empty() => {
            let step = wait.max(Duration::from_secs(1));
            (
                step,
                format!(
                    "every caller after closing stopped, the last {} ms after closing; arrivals that go on past consumer_update_wait get as long again, {}, before they count as endless",
                    last.last_ms,
                    format_duration(step),
                ),
            )
        }
        _ if !callers.sending.is_empty() => (
            gate.step_timeout,
            format!(
                "{} caller(s) kept sending to the end, so arrivals never stopped and no step_timeout would let them; the configured {} is kept",
                callers.sending.len(),
                format_duration(gate.step_timeout),
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
    // The timeout covers wait + step and may not exceed the parser's bound.
    let room = MAX_DURATION.saturating_sub(wait);
    let step = up_to_ms(step);
    let cut = step > room;
    let note = if cut {
        format!(
            "; capped at {} so consumer_update_wait + step_timeout fit in 24h, the most the drain config accepts",
            format_duration(room)
        )
    } else {
        String::new()
    };
    (
        step.min(room),
        format!(
            "{why}{note}{}",
            forced_note(forced_by, GatePass::StepTimeout)
        ),
    )
}

/// `longest_request`: 1.5 × the longest request measured, whole seconds;
/// none timed, the configured value. Cut to what a 24 h timeout leaves
/// after `before` (wait + step + quiet_window). The flag: it was measured.
fn longest_request(
    gate: &GateTimings,
    requests: &Summary,
    before: Duration,
) -> (Option<Duration>, String, bool) {
    let timed = !(requests.count == 0 && requests.max_us == 0);
    let (longest, why) = if timed {
        let ms = (requests.max_us.saturating_mul(3) / 2).div_ceil(1000);
        (
            Some(whole_seconds(ms)),
            format!(
                "1.5 × the longest request since the provider started ({}, every request counted; p99 {} over {} recent): with it set, step_timeout ends only arrivals that go on, and a request in flight is waited for until timeout",
                ms_text(requests.max_us),
                ms_text(requests.p99_us),
                requests.count
            ),
        )
    } else {
        (
            gate.longest_request.map(up_to_ms),
            "no request was timed, so the configured value is kept".to_string(),
        )
    };
    let room = down_to_ms(MAX_DURATION.saturating_sub(before));
    match longest {
        Some(l) if l > room && room.is_zero() => (
            None,
            format!(
                "{why}; none recommended: consumer_update_wait + step_timeout + quiet_window leave no room for it in the 24h timeout the drain config accepts"
            ),
            timed,
        ),
        Some(l) if l > room => (
            Some(room),
            format!(
                "{why}; capped at {} so consumer_update_wait + step_timeout + quiet_window + longest_request fit in the 24h timeout the drain config accepts",
                format_duration(room)
            ),
            timed,
        ),
        _ => (longest, why, timed),
    }
}

/// `timeout`: with a measured longest request, the sum it must cover,
/// whole seconds; else the configured value, at least wait + step (and
/// the sum, with a configured longest request kept), at most 24 h.
fn timeout(
    gate: &GateTimings,
    requests: &Summary,
    (wait, step): (Duration, Duration),
    (longest, measured): (Option<Duration>, bool),
    forced_by: Option<GatePass>,
) -> (Duration, String) {
    let forced = forced_note(forced_by, GatePass::Timeout);
    let needed = longest.map(|l| wait + step + gate.quiet_window + l);
    match (measured, longest) {
        (true, Some(longest)) => (
            // At most 24 h: longest_request was cut to fit.
            up_to_second(wait + step + gate.quiet_window + longest),
            format!(
                "consumer_update_wait {} + step_timeout {} + quiet_window {} + longest_request {} (the longest request since the provider started, {}){forced}",
                format_duration(wait),
                format_duration(step),
                format_duration(gate.quiet_window),
                format_duration(longest),
                ms_text(requests.max_us),
            ),
        ),
        (true, None) => (
            MAX_DURATION,
            format!(
                "consumer_update_wait + step_timeout leave no room for longest_request under it: the most the drain config accepts, 24h{forced}"
            ),
        ),
        (false, _) => {
            let least = needed.unwrap_or(wait + step).max(wait + step);
            let (t, cut) = capped(up_to_ms(gate.timeout.max(least)));
            let covers = if needed.is_some() {
                " + quiet_window + longest_request"
            } else {
                ""
            };
            (
                t,
                format!(
                    "no request was timed, so the configured {} is kept (at least consumer_update_wait + step_timeout{covers}){}{forced}",
                    format_duration(gate.timeout),
                    capped_note(cut)
                ),
            )
        }
    }
}

/// `callers`: every caller after closing; `end_ms`: from closing to the
/// gate's pass (or now, still closing); `forced_by`: the budget that
/// forced this pass, if one did. Every value is one the drain config's
/// parser accepts, with the configured `quiet_window`.
pub fn recommend(
    gate: &GateTimings,
    callers: &[Caller],
    end_ms: u64,
    requests: &Summary,
    forced_by: Option<GatePass>,
) -> Recommended {
    let callers = Callers::split(callers, end_ms);
    let (wait, wait_basis) = consumer_update_wait(gate, &callers);
    let (step, step_basis) = step_timeout(gate, &callers, wait, forced_by);
    let before_longest = wait + step + gate.quiet_window;
    let (longest, longest_basis, measured) = longest_request(gate, requests, before_longest);
    let (timeout, timeout_basis) =
        timeout(gate, requests, (wait, step), (longest, measured), forced_by);
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

    /// The drain config parsed back from a recommendation, with the
    /// configured quiet_window written exactly (it is not recommended).
    fn parse_back(
        r: &Recommended,
        quiet: Duration,
    ) -> Result<crate::drain::config::DrainConfig, String> {
        let mut json = serde_json::json!({
            "consumer_update_wait": r.consumer_update_wait,
            "step_timeout": r.step_timeout,
            "timeout": r.timeout,
            "quiet_window": exact(quiet),
        });
        // Null in the report: the field left out.
        if let Some(longest) = &r.longest_request {
            json["longest_request"] = longest.as_str().into();
        }
        crate::drain::config::DrainConfig::from_json(json.to_string().as_bytes())
            .map_err(|e| format!("{e}: {r:?}"))
    }

    /// `d` to the microsecond, in a form the parser reads.
    fn exact(d: Duration) -> String {
        let us = crate::shared::duration::micros(d);
        format!("{}.{:03}ms", us / 1000, us % 1000)
    }

    fn gate_from(json: &str) -> GateTimings {
        match crate::drain::config::DrainConfig::from_json(json.as_bytes()) {
            Ok(c) => c.gate,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn extreme_measurements_are_capped_at_24h_and_the_basis_says_so() {
        let hour = 3_600_000u64;
        let endless = Summary {
            count: 1,
            p50_us: u64::MAX,
            p99_us: u64::MAX,
            max_us: u64::MAX,
        };
        // A caller that stopped 20 h after closing: the wait alone fills
        // the 24 h, leaving no room for step_timeout or longest_request.
        let r = recommend(
            &gate(),
            &[caller("slow", 20 * hour)],
            30 * hour,
            &endless,
            None,
        );
        assert_eq!(
            (r.consumer_update_wait.as_str(), r.step_timeout.as_str()),
            ("24h", "0s")
        );
        assert!(
            r.basis.consumer_update_wait.contains("capped at 24h"),
            "{r:?}"
        );
        assert!(r.basis.step_timeout.contains("capped at 0s"), "{r:?}");
        assert_eq!(
            (r.longest_request.as_deref(), r.timeout.as_str()),
            (None, "24h")
        );
        assert!(
            r.basis.longest_request.contains("none recommended"),
            "{r:?}"
        );
        assert!(r.basis.timeout.contains("24h"), "{r:?}");
        parse_back(&r, gate().quiet_window).unwrap();

        // A request longer than a day: longest_request takes what the
        // 24 h timeout leaves after 3.5 s + 3.5 s + 500 ms.
        let r = recommend(&gate(), &[caller("c", 2_000)], 9_000, &endless, None);
        assert_eq!(r.longest_request.as_deref(), Some("86392500ms"));
        assert!(r.basis.longest_request.contains("capped at"), "{r:?}");
        assert!(r.basis.longest_request.contains("24h"), "{r:?}");
        assert_eq!(r.timeout, "24h");
        assert_eq!(r.grace_period_seconds, 24 * 3600 + 5);
        parse_back(&r, gate().quiet_window).unwrap();
    }

    #[test]
    fn a_configured_timeout_defaulted_past_24h_is_recommended_capped() {
        // longest_request 24h with timeout unset: the parser defaults the
        // timeout to 24h + 6.5 s, which it refuses when written.
        let gate = gate_from(r#"{"longest_request":"24h"}"#);
        assert!(gate.timeout > MAX_DURATION);
        let r = recommend(&gate, &[], 5_000, &Summary::default(), None);
        assert_eq!(r.timeout, "24h");
        assert!(r.basis.timeout.contains("capped at 24h"), "{r:?}");
        assert_eq!(r.longest_request.as_deref(), Some("86393500ms"));
        assert!(r.basis.longest_request.contains("capped at"), "{r:?}");
        parse_back(&r, gate.quiet_window).unwrap();
    }

    /// A duration in µs: small, any up to 24 h, or at the bound.
    fn micros() -> impl proptest::strategy::Strategy<Value = u64> {
        use proptest::prelude::*;
        let day = crate::shared::duration::micros(MAX_DURATION);
        prop_oneof![
            0..=10_000_000u64,
            0..=day,
            Just(day),
            (day - 10_000_000)..=day
        ]
    }

    /// A measurement in ms or µs: small, large, or anything a u64 holds.
    fn measured() -> impl proptest::strategy::Strategy<Value = u64> {
        use proptest::prelude::*;
        prop_oneof![0..=100_000u64, 0..=400_000_000_000u64, any::<u64>()]
    }

    proptest::proptest! {
        // No regression files: the suites keep their seeds in the tests.
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 2000,
            failure_persistence: None,
            ..proptest::prelude::ProptestConfig::default()
        })]

        /// Whatever was measured and configured, the drain config's parser
        /// takes every recommendation as it is.
        #[test]
        fn every_recommendation_parses_back(
            (wait, quiet, step) in (micros(), micros(), micros()),
            timeout in proptest::option::of(micros()),
            longest in proptest::option::of(micros()),
            lasts in proptest::collection::vec(measured(), 0..4),
            end_ms in measured(),
            (count, max_us, p99_us) in (0..3u64, measured(), measured()),
            forced in 0..3u8,
        ) {
            let mut json = serde_json::json!({
                "consumer_update_wait": exact(Duration::from_micros(wait)),
                "quiet_window": exact(Duration::from_micros(quiet)),
                "step_timeout": exact(Duration::from_micros(step)),
            });
            if let Some(t) = timeout {
                json["timeout"] = exact(Duration::from_micros(t)).into();
            }
            if let Some(l) = longest.filter(|l| *l > 0) {
                json["longest_request"] = exact(Duration::from_micros(l)).into();
            }
            // Only configs the parser takes can be running.
            let Ok(config) =
                crate::drain::config::DrainConfig::from_json(json.to_string().as_bytes())
            else {
                return Ok(());
            };
            let callers: Vec<Caller> = lasts
                .iter()
                .enumerate()
                .map(|(i, &last_ms)| caller(&format!("c{i}"), last_ms))
                .collect();
            let requests = Summary { count, p50_us: 0, p99_us, max_us };
            let forced_by = [None, Some(GatePass::StepTimeout), Some(GatePass::Timeout)]
                [usize::from(forced)];
            let r = recommend(&config.gate, &callers, end_ms, &requests, forced_by);
            let back = parse_back(&r, config.gate.quiet_window);
            proptest::prop_assert!(back.is_ok(), "{back:?}");
            let parsed = |text: &str| crate::shared::duration::parse_duration(text);
            let (Ok(w), Ok(s), Ok(t)) =
                (parsed(&r.consumer_update_wait), parsed(&r.step_timeout), parsed(&r.timeout))
            else {
                return Err(proptest::test_runner::TestCaseError::fail(format!("{r:?}")));
            };
            // The report's own rule: the timeout covers the wait and the step.
            proptest::prop_assert!(t >= w + s, "{r:?}");
            proptest::prop_assert!(r.grace_period_seconds > t.as_secs(), "{r:?}");
        }
    }
}
