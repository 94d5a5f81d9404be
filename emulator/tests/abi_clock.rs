//! The filters' `.wasm` files measure every duration on the monotonic
//! clock: a step of the wall clock (NTP, an operator), forward or back,
//! mid-drain changes no gate pass, quiet window, report duration or
//! tombstone TTL. Each scenario runs three times, with no step and with a
//! step of +1 h and −1 h, and must come out the same; on the wall clock a
//! step forward would force the gate at once and a step back would hold
//! it (and every tombstone) an hour longer.

use std::time::Duration;

use graceful_core::consumer::tombstone::Tombstones;
use graceful_core::drain::record::{self, InstanceRecord, Phase};
use graceful_core::drain::status::Status;
use graceful_emulated_host::{Filter, Host, StreamId, Vm, WallStep};
use serde_json::Value;

const HOUR: Duration = Duration::from_secs(3600);

/// No step, then each step the suite tries.
const STEPS: [Option<WallStep>; 3] = [
    None,
    Some(WallStep::Forward(HOUR)),
    Some(WallStep::Back(HOUR)),
];

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn a_wall_clock_step_moves_the_wall_clock_alone() {
    let mut host = Host::new();
    let drain = host.start_vm(Filter::Drain, "");
    let (wall, mono, tick) = (host.now(), host.now_us(), host.tick_period(drain));
    host.step_wall_clock(WallStep::Forward(HOUR));
    assert_eq!(host.now(), wall + HOUR);
    assert_eq!((host.now_us(), host.elapsed()), (mono, Duration::ZERO));
    host.step_wall_clock(WallStep::Back(2 * HOUR));
    assert_eq!(host.now(), wall - HOUR);
    // Both clocks move on together; ticks fall due on the monotonic one.
    host.advance(ms(120));
    assert_eq!(host.now(), wall - HOUR + ms(120));
    assert_eq!(host.now_us(), mono + 120_000);
    assert_eq!(host.tick_period(drain), tick);
}

/// What a drain showed, in virtual time since the host started.
#[derive(Debug, PartialEq)]
struct Drain {
    /// When the gate passed, and whether a timeout forced it.
    passed_at: Duration,
    forced: bool,
    /// The status JSON mid-drain, just after the step.
    status: Status,
    /// The drain report after the pass.
    report: Value,
}

/// graceful_drain then graceful_provider on the main thread and two
/// workers, as in `envoy/provider-sidecar.yaml`.
fn sidecar(host: &mut Host) -> Vec<[Vm; 2]> {
    const DRAIN: &str = r#"{"consumer_update_wait":"1s","quiet_window":"500ms","step_timeout":"3s","timeout":"60s"}"#;
    const PROVIDER: &str = r#"{"instance_id":"pod-1"}"#;
    host.start_vm(Filter::Drain, DRAIN);
    host.start_vm(Filter::Provider, PROVIDER);
    (0..2)
        .map(|_| {
            [
                host.start_vm(Filter::Drain, DRAIN),
                host.start_vm(Filter::Provider, PROVIDER),
            ]
        })
        .collect()
}

fn start(host: &mut Host, chain: &[Vm], method: &str, path: &str) -> StreamId {
    let s = host.stream_through(chain);
    host.request_headers(
        s,
        &[(":method", method), (":path", path), (":authority", "svc")],
        true,
    );
    s
}

fn record_of(host: &Host) -> InstanceRecord {
    host.with_store(|s| record::read(s))
        .expect("the instance record")
}

fn end(host: &mut Host, s: StreamId) {
    host.response_headers(s, &[(":status", "200")], true);
    host.log(s);
}

/// An endpoint's JSON answer.
fn endpoint(host: &mut Host, chain: &[Vm], path: &str) -> Vec<u8> {
    let s = start(host, chain, "GET", path);
    let body = host.local_reply(s).expect("answered by the filter").body;
    host.log(s);
    body
}

/// Closing at 100 ms; a request from 500 to 900 ms, across the step at
/// 600 ms; another request in flight from 50 ms to 1 s.
fn drain(step: Option<WallStep>) -> Drain {
    let mut host = Host::new();
    let w = sidecar(&mut host);
    host.advance_to(ms(50));
    let slow = start(&mut host, &w[0], "GET", "/slow");
    host.advance_to(ms(100));
    let closing = start(&mut host, &w[0], "POST", "/graceful/closing");
    assert_eq!(host.local_reply(closing).map(|r| r.status), Some(202));
    host.log(closing);
    host.advance_to(ms(500));
    let across = start(&mut host, &w[1], "GET", "/across");
    host.advance_to(ms(600));
    if let Some(step) = step {
        host.step_wall_clock(step);
    }
    host.advance_to(ms(650));
    let status = serde_json::from_slice(&endpoint(&mut host, &w[1], "/graceful/status"))
        .expect("status JSON");
    host.advance_to(ms(900));
    end(&mut host, across);
    host.advance_to(ms(1000));
    end(&mut host, slow);
    let mut t = 1000;
    let passed_at = loop {
        t += 50;
        host.advance_to(ms(t));
        if record_of(&host).phase == Phase::Drained {
            break host.elapsed();
        }
        assert!(t < 70_000, "the gate never passed");
    };
    let forced = record_of(&host).forced;
    // The report is merged from the providers' copies on their ticks.
    host.advance(ms(500));
    let report = serde_json::from_slice(&endpoint(&mut host, &w[0], "/graceful/report"))
        .expect("report JSON");
    Drain {
        passed_at,
        forced,
        status,
        report,
    }
}

#[test]
fn a_wall_clock_step_of_an_hour_either_way_mid_drain_changes_nothing() {
    let runs: Vec<Drain> = STEPS.iter().map(|&step| drain(step)).collect();
    let unstepped = &runs[0];
    // What it is without a step: closing for 550 ms at 650 ms, the last
    // request 150 ms before; consumer_update_wait over at 1.1 s, the quiet
    // window 500 ms after the last start the drain copies saw (at their
    // 550 ms tick), unforced; the report's longest request is the slow one,
    // 50 ms to 1 s on the virtual clock: 950 ms exactly (the contract's
    // `request_ms.max` is exact, every request counted).
    assert_eq!(
        (
            unstepped.status.closing_for_ms,
            unstepped.status.last_request_ms_ago
        ),
        (Some(550), Some(100)),
        "{:?}",
        unstepped.status
    );
    assert_eq!((unstepped.passed_at, unstepped.forced), (ms(1100), false));
    let report = &unstepped.report;
    assert_eq!(report["drained_after_ms"], 1000, "{report}");
    assert_eq!(report["last_request_after_closing_ms"], 400, "{report}");
    assert_eq!(report["request_ms"]["max"], 950.0, "{report}");
    for (run, step) in runs.iter().zip(STEPS).skip(1) {
        assert_eq!(run, unstepped, "with the wall clock stepped {step:?}");
    }
}

/// The consumer's tombstones: one written at 10 ms with a 5 s TTL, the
/// wall clock stepped at 1 s; when does a second worker stop steering
/// away from the host?
fn tombstone_ends(step: Option<WallStep>) -> Duration {
    const A: &str = "10.0.0.1:8080";
    const B: &str = "10.0.0.2:8080";
    let config = r#"{"tombstone_ttl":"5s","probe_path":""}"#;
    let mut host = Host::new();
    host.start_vm(Filter::Consumer, config);
    let w0 = host.start_vm(Filter::Consumer, config);
    let w1 = host.start_vm(Filter::Consumer, config);
    let send = |host: &mut Host, vm: Vm| {
        let s = host.stream(vm);
        host.set_cluster(s, "providers");
        host.request_headers(
            s,
            &[
                (":method", "GET"),
                (":path", "/"),
                (":authority", "providers"),
            ],
            true,
        );
        s
    };
    let exchange = |host: &mut Host, vm: Vm, upstream: &str, closing: bool| {
        let s = send(host, vm);
        host.set_upstream(s, upstream);
        let mut headers = vec![(":status", "200"), ("x-graceful-instance", "i1")];
        if closing {
            headers.push(("x-graceful-closing", "true"));
        }
        host.response_headers(s, &headers, true);
        host.log(s);
    };
    // Both workers learn both members from their answers.
    for vm in [w0, w1] {
        for upstream in [A, B] {
            for _ in 0..graceful_core::consumer::decisions::OBSERVE_EVERY {
                exchange(&mut host, vm, upstream, false);
            }
        }
    }
    host.advance_to(ms(10));
    exchange(&mut host, w0, A, true);
    let tombstone = host
        .shared_data(graceful_core::shared::keys::TOMBSTONES.name)
        .and_then(|b| Tombstones::decode(&b))
        .and_then(|t| t.entries().first().cloned())
        .expect("a tombstone for A");
    assert_eq!(tombstone.expires_us, host.now_us() + 5_000_000);
    host.advance_to(ms(1000));
    if let Some(step) = step {
        host.step_wall_clock(step);
    }
    let steered = |host: &mut Host| {
        let s = send(host, w1);
        let list = host.request_header(s, "x-graceful-override-host");
        host.reset(s);
        list == Some(B.to_string())
    };
    let mut t = 1000;
    while steered(&mut host) {
        t += 100;
        // On the wall clock, a step back would hold it an hour.
        assert!(t <= 60_000, "still steered away from A at {t} ms");
        host.advance_to(ms(t));
    }
    host.elapsed()
}

#[test]
fn a_wall_clock_step_of_an_hour_either_way_changes_no_tombstone_ttl() {
    let ends: Vec<_> = STEPS.iter().map(|&step| tombstone_ends(step)).collect();
    // Written for 5 s at 10 ms: steered away from A through 5 s, not at 5.1 s.
    assert_eq!(ends[0], ms(5100));
    for (end, step) in ends.iter().zip(STEPS).skip(1) {
        assert_eq!(end, &ends[0], "with the wall clock stepped {step:?}");
    }
}
