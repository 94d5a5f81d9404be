use std::time::Duration;

use super::durations::PendingDurations;
use super::peers::{PeerId, PendingPeers};
use super::*;
use crate::shared::store::MemStore;

const S: u64 = 1_000_000;
const MS: u64 = 1_000;
const T0: u64 = 1_700_000_000 * S;

fn gate() -> GateTimings {
    GateTimings {
        consumer_update_wait: Duration::from_secs(1),
        quiet_window: Duration::from_millis(500),
        step_timeout: Duration::from_secs(2),
        timeout: Duration::from_secs(10),
        longest_request: None,
    }
}

fn peer(addr: &str, consumer: Option<&str>) -> PeerId {
    PeerId::new(Some(addr.as_bytes()), consumer.map(str::as_bytes))
}

/// The report of what `store` holds at `now`, 32 peers at the most.
fn report_at(store: &MemStore, now: u64) -> Report {
    Report::build(&Inputs::read(store).unwrap(), &gate(), 32, now)
}

fn json(r: &Report) -> serde_json::Value {
    serde_json::from_str(&r.to_json()).unwrap()
}

#[test]
fn before_any_shutdown_it_says_serving_with_nulls_and_zeros() {
    let store = MemStore::default();
    let inputs = Inputs::read(&store).unwrap();
    let v = json(&Report::build(&inputs, &gate(), 32, T0));
    assert_eq!(v["phase"], "serving");
    for null in [
        "closing_for_ms",
        "drained_after_ms",
        "forced_by",
        "last_request_after_closing_ms",
        "recommended",
    ] {
        assert!(v[null].is_null(), "{null}: {v}");
    }
    assert_eq!(v["forced"], false);
    assert_eq!(v["requests_after_closing"], 0);
    assert_eq!(v["peers"], serde_json::json!([]));
    assert_eq!(v["peers_dropped"], 0);
    assert_eq!(v["request_ms"]["count"], 0);
    assert!(v["request_ms"]["p50"].is_null());
}

/// A shutdown: a graceful consumer stops 300 ms after closing, a plain
/// client keeps sending until the forced pass at 3 s.
fn shutdown(store: &MemStore, forced: Option<GatePass>) {
    crate::drain::record::start_closing(store, T0).unwrap();
    let mut pending = PendingReport::default();
    for i in 0..6 {
        pending.peers.add(
            peer("10.0.0.3:5000", Some("c-1")),
            true,
            false,
            T0 + i * 50 * MS,
        );
    }
    for i in 0..30 {
        pending.peers.add(
            peer("[fd00::9]:6000", None),
            i % 2 == 0,
            false,
            T0 + i * 100 * MS,
        );
    }
    for ms in [3u64, 4, 5, 1800] {
        pending.durations.add(ms * MS, true);
    }
    pending.merge_into(store).unwrap();
    let why = forced.unwrap_or(GatePass::Quiet);
    crate::drain::record::pass(store, why, T0 + 3 * S).unwrap();
    store
        .set(crate::shared::keys::PASSED_BY.name, &[why.to_byte()], 0)
        .unwrap();
}

#[test]
fn a_forced_shutdown_names_its_timeout_and_the_caller_that_kept_sending() {
    let store = MemStore::default();
    shutdown(&store, Some(GatePass::StepTimeout));
    let inputs = Inputs::read(&store).unwrap();
    let r = Report::build(&inputs, &gate(), 32, T0 + 4 * S);
    let v = json(&r);
    assert_eq!(v["phase"], "drained");
    assert_eq!(v["closing_for_ms"], 4000);
    assert_eq!(v["drained_after_ms"], 3000);
    assert_eq!(
        (v["forced"].clone(), v["forced_by"].clone()),
        (true.into(), "step_timeout".into())
    );
    assert_eq!(v["requests_after_closing"], 36);
    assert_eq!(v["last_request_after_closing_ms"], 2900);
    // Largest first: the plain client, then the consumer.
    assert_eq!(
        v["peers"],
        serde_json::json!([
            {"address": "fd00::9", "consumer": null, "requests": 30, "marked": 15, "refused_late": 0, "last_ms": 2900},
            {"address": "10.0.0.3", "consumer": "c-1", "requests": 6, "marked": 6, "refused_late": 0, "last_ms": 250},
        ])
    );
    assert_eq!(v["request_ms"]["count"], 4);
    assert_eq!(v["request_ms"]["max"], 1800.0);
    let rec = r.recommended.clone().unwrap();
    // The consumer stopped at 250 ms: 1.5 × 250 + 500 = 875 ms → 1 s.
    assert_eq!(rec.consumer_update_wait, "1s");
    assert!(
        rec.basis.consumer_update_wait.contains("fd00::9"),
        "{rec:?}"
    );
    // The plain client never stopped: the configured step_timeout stays,
    // and says it forced this pass.
    assert_eq!(rec.step_timeout, "2s");
    assert!(
        rec.basis.step_timeout.ends_with("it forced this pass"),
        "{rec:?}"
    );
    // 1 s + 2 s + 0.5 s + 2.7 s = 6.2 s → 7 s, covering the 1.8 s request.
    assert_eq!(rec.timeout, "7s");
    assert_eq!(rec.grace_period_seconds, 12);
    assert_eq!(Report::late_peers(&inputs, &gate()), 1);
    // The JSON names every budget, each with its basis.
    for key in [
        "consumer_update_wait",
        "step_timeout",
        "timeout",
        "grace_period_seconds",
    ] {
        assert!(!v["recommended"][key].is_null(), "{key}: {v}");
        assert!(
            v["recommended"]["basis"][key]
                .as_str()
                .is_some_and(|b| !b.is_empty()),
            "{key}: {v}"
        );
    }
}

#[test]
fn the_max_covers_rare_long_requests_timed_while_serving_but_never_sampled() {
    // Three 1.5 s requests among many short ones while serving, none of
    // them sampled for the percentiles: the max is theirs, and the
    // recommended timeout covers them.
    let store = MemStore::default();
    let mut pending = PendingReport::default();
    for i in 0..1_000u64 {
        if i % 32 == 0 {
            pending.durations.add(2 * MS, false);
        }
    }
    for _ in 0..3 {
        pending.durations.note_longest(1_500 * MS);
    }
    pending.merge_into(&store).unwrap();
    crate::drain::record::start_closing(&store, T0).unwrap();
    crate::drain::record::pass(&store, GatePass::Quiet, T0 + S).unwrap();
    let r = report_at(&store, T0 + 2 * S);
    assert_eq!(r.request_ms.max, Some(1_500.0));
    assert_eq!(r.request_ms.p99, Some(2.0), "the percentiles stay sampled");
    let rec = r.recommended.unwrap();
    let timeout = crate::shared::duration::parse_duration(&rec.timeout).unwrap();
    let wait = crate::shared::duration::parse_duration(&rec.consumer_update_wait).unwrap();
    let step = crate::shared::duration::parse_duration(&rec.step_timeout).unwrap();
    assert!(
        timeout >= wait + step + Duration::from_millis(1_500),
        "{rec:?}"
    );
    assert!(rec.basis.timeout.contains("1500 ms"), "{rec:?}");
}

#[test]
fn a_quiet_pass_says_so_and_the_timeout_is_named_when_it_forced() {
    let store = MemStore::default();
    shutdown(&store, None);
    let v = json(&report_at(&store, T0 + 4 * S));
    assert_eq!(
        (v["forced"].clone(), v["forced_by"].clone()),
        (false.into(), serde_json::Value::Null)
    );
    let store = MemStore::default();
    shutdown(&store, Some(GatePass::Timeout));
    let v = json(&report_at(&store, T0 + 4 * S));
    assert_eq!(v["forced_by"], "timeout");
}

#[test]
fn it_shows_at_most_max_peers_and_counts_the_rest() {
    let store = MemStore::default();
    crate::drain::record::start_closing(&store, T0).unwrap();
    for chunk in 0..4u64 {
        let mut pending = PendingReport::default();
        for i in 0..250u64 {
            let n = chunk * 250 + i;
            let source = format!("127.2.{}.{}:1000", n / 200, n % 200 + 1);
            for _ in 0..(1 + n % 3) {
                pending
                    .peers
                    .add(peer(&source, Some("x")), false, false, T0 + n);
            }
        }
        pending.merge_into(&store).unwrap();
    }
    let r = report_at(&store, T0 + S);
    assert_eq!(r.peers.len(), 32);
    assert_eq!(r.peers_dropped, 1000 - 32);
    assert!(r.peers.windows(2).all(|w| w[0].requests >= w[1].requests));
    assert!(r.to_json().len() < 8 * 1024, "{}", r.to_json().len());
}

#[test]
fn forged_consumer_values_cannot_break_the_json() {
    let store = MemStore::default();
    crate::drain::record::start_closing(&store, T0).unwrap();
    let mut pending = PendingPeers::default();
    for forged in [
        &b"\",\"requests\":999999,\"x\":\""[..],
        b"</script>\n",
        b"\\u0000",
        b"\xf0\x28\x8c\x28",
        b"ok-\"quoted\"",
        b"pod-a.ns:1",
    ] {
        pending.add(
            PeerId::new(Some(b"10.1.1.1:9"), Some(forged)),
            false,
            false,
            T0 + MS,
        );
    }
    let report = PendingReport {
        peers: pending,
        durations: PendingDurations::default(),
    };
    report.merge_into(&store).unwrap();
    let r = report_at(&store, T0 + S);
    let v = json(&r);
    for p in v["peers"].as_array().unwrap() {
        assert_eq!(p.as_object().unwrap().len(), 6, "{p}");
        assert!(p["requests"].as_u64().unwrap() <= 5, "{p}");
    }
    assert_eq!(v["requests_after_closing"], 6);
    // Only the well-formed name is kept; every forged one counts as none.
    let names: Vec<&serde_json::Value> = v["peers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| &p["consumer"])
        .collect();
    assert_eq!(
        names,
        [&serde_json::json!(null), &serde_json::json!("pod-a.ns:1")]
    );
}

#[test]
fn malformed_shared_values_read_as_empty() {
    let store = MemStore::default();
    for key in [
        &crate::shared::keys::REPORT_PEERS,
        &crate::shared::keys::REPORT_DURATIONS,
    ] {
        store.set(key.name, b"\x01garbage", 0).unwrap();
    }
    store
        .set(crate::shared::keys::PASSED_BY.name, b"", 0)
        .unwrap();
    let inputs = Inputs::read(&store).unwrap();
    assert_eq!(inputs.peers, PeerTable::default());
    assert_eq!(inputs.passed_by, None);
}

#[test]
fn refused_late_arrivals_are_counted_and_their_callers_named() {
    let store = MemStore::new();
    crate::drain::record::start_closing(&store, T0).unwrap();
    let mut pending = PendingReport::default();
    // A caller that missed the mark: 4 requests after admission stopped,
    // refused; a long request from another caller, admitted.
    for i in 0..4 {
        pending
            .peers
            .add(peer("10.0.0.7:4000", None), true, true, T0 + (6 + i) * S);
    }
    pending
        .peers
        .add(peer("10.0.0.3:5000", Some("c-1")), true, false, T0 + MS);
    pending.merge_into(&store).unwrap();
    crate::drain::record::pass(&store, GatePass::Quiet, T0 + 11 * S).unwrap();
    let v = json(&report_at(&store, T0 + 12 * S));
    assert_eq!(
        (
            v["requests_after_closing"].clone(),
            v["refused_late"].clone()
        ),
        (5.into(), 4.into())
    );
    let late = &v["peers"][0];
    assert_eq!(
        (late["address"].clone(), late["refused_late"].clone()),
        ("10.0.0.7".into(), 4.into()),
        "{v}"
    );
    assert_eq!(v["peers"][1]["refused_late"], 0, "{v}");
}
