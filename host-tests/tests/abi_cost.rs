//! What one ordinary request costs each filter in VM entries and hostcalls,
//! counted on the real `.wasm` from the test host's trace. Envoy charges
//! a few microseconds per VM entry and about one per hostcall (see
//! BENCHMARKS.md), so these counts are the filters' per-request cost model;
//! the budgets below catch a change that adds to the hot path unnoticed.

use graceful_host_tests::emu::{Filter, Host, StreamId, Vm};

/// Callbacks entered and hostcalls made since `mark` (a trace length).
fn count(host: &Host, mark: usize) -> (usize, usize, String) {
    let trace = host.trace();
    let lines: Vec<&str> = trace.lines().skip(mark).collect();
    // Trace lines: "-> proxy_on_x(..)" enters the VM; an indented
    // "proxy_y(..) -> Ok" inside it is a hostcall.
    let entries = lines.iter().filter(|l| l.contains("-> proxy_on_")).count();
    let hostcalls = lines
        .iter()
        .filter(|l| {
            let text = l.split_whitespace().nth(2).unwrap_or_default();
            text.starts_with("proxy_") && !text.starts_with("proxy_on_")
        })
        .count();
    (entries, hostcalls, lines.join("\n"))
}

/// One keep-alive GET answered 200 with a small body, steady state (the
/// VM has served a request before, so one-time work is done).
fn request(host: &mut Host, vm: Vm) -> StreamId {
    let s = host.stream(vm);
    host.set_cluster(s, "upstream");
    host.request_headers(
        s,
        &[(":method", "GET"), (":path", "/"), (":authority", "app")],
        true,
    );
    host.set_upstream(s, "127.0.0.1:18091");
    host.response_headers(
        s,
        &[
            (":status", "200"),
            ("content-length", "2"),
            ("content-type", "text/plain"),
        ],
        false,
    );
    host.response_body(s, b"ok", true);
    host.log(s);
    s
}

fn measure(filter: Filter, config: &str) -> (usize, usize, String) {
    let mut host = Host::new();
    let vm = host.start_vm(filter, config);
    request(&mut host, vm);
    let mark = host.trace().lines().count();
    request(&mut host, vm);
    count(&host, mark)
}

#[test]
fn an_ordinary_request_stays_within_each_filters_budget() {
    // (filter, config, most VM entries, most hostcalls)
    let budgets = [
        (Filter::Drain, "", 4, 1),
        (Filter::Provider, "", 6, 8),
        (Filter::Consumer, "", 5, 14),
    ];
    for (filter, config, max_entries, max_hostcalls) in budgets {
        let (entries, hostcalls, trace) = measure(filter, config);
        println!(
            "{}: {entries} VM entries, {hostcalls} hostcalls",
            filter.name()
        );
        assert!(
            entries <= max_entries && hostcalls <= max_hostcalls,
            "{}: {entries} entries (budget {max_entries}), {hostcalls} hostcalls (budget {max_hostcalls}):\n{trace}",
            filter.name()
        );
    }
}
