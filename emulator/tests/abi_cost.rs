//! What one ordinary request costs each filter in VM entries and hostcalls,
//! counted on the real `.wasm` from the test host's trace. Envoy charges
//! a few microseconds per VM entry and about one per hostcall (see
//! BENCHMARKS.md), so these counts are the filters' per-request cost model.
//! They are pinned exactly, both ways: a change that adds to the hot path
//! fails here, and so does one that saves a call (then pin the new count,
//! and update BENCHMARKS.md's table). A trace this test cannot read fails
//! too, instead of counting nothing and passing.

use graceful_emulated_host::{Filter, Host, StreamId, Vm};

/// One trace line, as far as cost goes.
#[derive(Debug, PartialEq)]
enum Event<'a> {
    /// `-> proxy_on_x(..)`: the host enters the VM.
    Enter(&'a str),
    /// `<- result`: the VM returns (or traps).
    Exit,
    /// An indented `proxy_y(..) -> Ok` (or a status) inside a callback.
    Hostcall(&'a str),
}

/// Reads one trace line: `[t+0.000000s] <who> <what happened>`. Host notes
/// and callbacks the module does not export (`proxy_on_x(..): not
/// exported, skipped`) cost nothing and read as None.
fn event<'a>(line: &'a str) -> Option<Event<'a>> {
    let mut words = line.split_whitespace();
    let stamp = words.next()?;
    if !stamp.starts_with("[t+") {
        return None;
    }
    let _who = words.next()?;
    let what = words.next()?;
    let name = |text: &'a str| text.split('(').next().unwrap_or(text);
    match what {
        "->" => {
            let callback = name(words.next()?);
            callback
                .starts_with("proxy_on_")
                .then_some(Event::Enter(callback))
        }
        "<-" => Some(Event::Exit),
        call if call.starts_with("proxy_") && !call.starts_with("proxy_on_") => {
            Some(Event::Hostcall(name(call)))
        }
        _ => None,
    }
}

/// What the trace since `mark` (a trace length) shows.
struct Cost {
    /// The callbacks entered, in order.
    entered: Vec<String>,
    /// The hostcalls made, in order.
    calls: Vec<String>,
    exits: usize,
    trace: String,
}

fn cost(host: &Host, mark: usize) -> Cost {
    let trace = host.trace();
    let lines: Vec<&str> = trace.lines().skip(mark).collect();
    let mut cost = Cost {
        entered: Vec::new(),
        calls: Vec::new(),
        exits: 0,
        trace: lines.join("\n"),
    };
    for event in lines.iter().filter_map(|l| event(l)) {
        match event {
            Event::Enter(callback) => cost.entered.push(callback.to_string()),
            Event::Exit => cost.exits += 1,
            Event::Hostcall(call) => cost.calls.push(call.to_string()),
        }
    }
    cost
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

fn measure(filter: Filter, config: &str) -> Cost {
    let mut host = Host::new();
    let vm = host.start_vm(filter, config);
    request(&mut host, vm);
    let mark = host.trace().lines().count();
    request(&mut host, vm);
    cost(&host, mark)
}

#[test]
fn the_trace_reader_understands_each_kind_of_line() {
    let lines = [
        (
            "[t+0.000000s] drain#0      -> proxy_on_log(3)",
            Some(Event::Enter("proxy_on_log")),
        ),
        ("[t+0.000000s] drain#0      <- ()", Some(Event::Exit)),
        (
            r#"[t+0.000000s] drain#0        proxy_get_header_map_value(RequestHeaders, ":path": "/") -> Ok"#,
            Some(Event::Hostcall("proxy_get_header_map_value")),
        ),
        (
            "[t+0.000000s] drain#0      proxy_on_done(3): not exported, skipped",
            None,
        ),
        (
            r#"[t+0.000000s] host         stream 1: property upstream.address = "127.0.0.1:18091""#,
            None,
        ),
    ];
    for (line, expected) in lines {
        assert_eq!(event(line), expected, "{line}");
    }
}

#[test]
fn an_ordinary_request_costs_each_filter_exactly_its_pinned_count() {
    // (filter, config, the callbacks entered in order, the hostcalls in
    // order: their kinds matter as much as their number, a call that
    // returns data costs several times one that does not)
    let pinned: [(Filter, &str, &[&str], &[&str]); 3] = [
        (
            Filter::Drain,
            "",
            &[
                "proxy_on_context_create",
                "proxy_on_request_headers",
                "proxy_on_log",
                "proxy_on_delete",
            ],
            &["proxy_get_header_map_value"],
        ),
        (
            Filter::Provider,
            "",
            &[
                "proxy_on_context_create",
                "proxy_on_request_headers",
                "proxy_on_response_headers",
                "proxy_on_delete",
            ],
            &[
                // request: in flight +1, the gate, started +1
                "proxy_increment_metric",
                "proxy_get_metric",
                "proxy_increment_metric",
                // response headers: the instance id, the phase
                "proxy_replace_header_map_value",
                "proxy_get_metric",
                // delete: in flight -1
                "proxy_increment_metric",
            ],
        ),
        (
            Filter::Consumer,
            "",
            &[
                "proxy_on_context_create",
                "proxy_on_request_headers",
                "proxy_on_response_headers",
                "proxy_on_done",
                "proxy_on_delete",
            ],
            &[
                // request: drop the client's override header, in flight +1,
                // started +1, the change signal (nothing moved: no shared
                // data, no clock, no cluster)
                "proxy_remove_header_map_value",
                "proxy_increment_metric",
                "proxy_increment_metric",
                "proxy_get_metric",
                // response: every header in one read, scanned in the guest;
                // without an admin cluster every answer is a membership
                // observation: the answering address and the clock (recorded
                // lately, so not the cluster)
                "proxy_get_header_map_pairs",
                "proxy_get_property",
                "proxy_get_current_time_nanoseconds",
                // done: in flight -1
                "proxy_increment_metric",
            ],
        ),
    ];
    for (filter, config, callbacks, calls) in pinned {
        let cost = measure(filter, config);
        let name = filter.name();
        println!(
            "{name}: {} VM entries ({}), {} hostcalls ({})",
            cost.entered.len(),
            cost.entered.join(", "),
            cost.calls.len(),
            cost.calls.join(", ")
        );
        // A request always enters the VM: reading none means the trace's
        // format changed under this reader.
        assert!(
            !cost.entered.is_empty() && cost.exits == cost.entered.len(),
            "{name}: read {} entries and {} exits: has the trace format changed?\n{}",
            cost.entered.len(),
            cost.exits,
            cost.trace
        );
        assert_eq!(
            cost.entered,
            callbacks,
            "{name}: VM entries changed (pinned: {} entries):\n{}",
            callbacks.len(),
            cost.trace
        );
        assert_eq!(
            cost.calls,
            calls,
            "{name}: hostcalls changed (pinned: {}):\n{}",
            calls.len(),
            cost.trace
        );
    }
}
