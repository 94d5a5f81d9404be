//! The test host itself: Envoy's rules that the filters never break on
//! purpose (so the filter suites cannot show the host enforces them), shown
//! with a tiny hand-assembled proxy-wasm module that makes exactly the
//! hostcalls a test names. Each hostcall's status is read from the trace.

use std::collections::BTreeMap;
use std::time::Duration;

use graceful_emulated_host::{CallState, Host, StartError, StreamId};

const I32: u8 = 0x7f;

/// Hostcalls the probe can make: name, parameter count (all i32).
const HOSTCALLS: &[(&str, usize)] = &[
    ("proxy_get_header_map_value", 5),
    ("proxy_add_header_map_value", 5),
    ("proxy_get_shared_data", 5),
    ("proxy_set_shared_data", 5),
    ("proxy_set_effective_context", 1),
    ("proxy_http_call", 10),
    ("proxy_send_local_response", 8),
    ("proxy_call_foreign_function", 6),
    ("proxy_bogus", 0),
];

/// Where the host writes hostcall results in the probe's memory.
const OUT_PTR: i32 = 64;
const OUT_SIZE: i32 = 68;
const OUT_CAS: i32 = 72;
const OUT_TOKEN: i32 = 76;

/// A proxy-wasm module whose callbacks each make a fixed list of
/// hostcalls with constant arguments.
#[derive(Default)]
struct Probe {
    /// Callback export name -> hostcalls (name, args).
    calls: BTreeMap<&'static str, Vec<(&'static str, Vec<i32>)>>,
    data: Vec<u8>,
}

/// Data segment base address.
const DATA: i32 = 1024;

fn uleb(mut v: u64, out: &mut Vec<u8>) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

fn sleb(mut v: i64, out: &mut Vec<u8>) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        let done = (v == 0 && b & 0x40 == 0) || (v == -1 && b & 0x40 != 0);
        out.push(if done { b } else { b | 0x80 });
        if done {
            return;
        }
    }
}

fn name(s: &str, out: &mut Vec<u8>) {
    uleb(s.len() as u64, out);
    out.extend_from_slice(s.as_bytes());
}

fn section(id: u8, items: &[Vec<u8>], out: &mut Vec<u8>) {
    let mut body = Vec::new();
    uleb(items.len() as u64, &mut body);
    for item in items {
        body.extend_from_slice(item);
    }
    out.push(id);
    uleb(body.len() as u64, out);
    out.extend(body);
}

/// The callbacks the probe exports: name, parameter count, returns i32,
/// value returned.
const CALLBACKS: &[(&str, usize, Option<i32>)] = &[
    ("proxy_on_memory_allocate", 1, Some(4096)),
    ("proxy_on_context_create", 2, None),
    ("proxy_on_vm_start", 2, Some(1)),
    ("proxy_on_configure", 2, Some(1)),
    ("proxy_on_tick", 1, None),
    ("proxy_on_request_headers", 3, Some(0)),
    ("proxy_on_response_headers", 3, Some(0)),
    ("proxy_on_response_body", 3, Some(0)),
    ("proxy_on_response_trailers", 2, Some(0)),
    ("proxy_on_log", 1, None),
    ("proxy_on_done", 1, Some(1)),
    ("proxy_on_delete", 1, None),
    ("proxy_on_http_call_response", 5, None),
    ("proxy_abi_version_0_2_1", 0, None),
];

impl Probe {
    /// Places bytes in the data segment; returns (pointer, length).
    fn bytes(&mut self, b: &[u8]) -> (i32, i32) {
        let at = DATA + self.data.len() as i32;
        self.data.extend_from_slice(b);
        (at, b.len() as i32)
    }

    /// Header pairs in the proxy-wasm encoding, placed in data.
    fn pairs(&mut self, pairs: &[(&str, &str)]) -> (i32, i32) {
        let mut b = (pairs.len() as u32).to_le_bytes().to_vec();
        for (k, v) in pairs {
            b.extend((k.len() as u32).to_le_bytes());
            b.extend((v.len() as u32).to_le_bytes());
        }
        for (k, v) in pairs {
            b.extend(k.as_bytes());
            b.push(0);
            b.extend(v.as_bytes());
            b.push(0);
        }
        self.bytes(&b)
    }

    fn on(&mut self, callback: &'static str, hostcall: &'static str, args: Vec<i32>) {
        self.calls
            .entry(callback)
            .or_default()
            .push((hostcall, args));
    }

    fn build(&self) -> Vec<u8> {
        let mut types: Vec<(usize, bool)> = Vec::new();
        let mut ty = |params: usize, result: bool| -> u64 {
            if let Some(i) = types.iter().position(|t| *t == (params, result)) {
                return i as u64;
            }
            types.push((params, result));
            (types.len() - 1) as u64
        };
        let mut imports = Vec::new();
        for (i, (hostcall, params)) in HOSTCALLS.iter().enumerate() {
            let mut b = Vec::new();
            name("env", &mut b);
            name(hostcall, &mut b);
            b.push(0x00);
            uleb(ty(*params, true), &mut b);
            imports.push(b);
            assert_eq!(i, imports.len() - 1);
        }
        let mut funcs = Vec::new();
        let mut exports = Vec::new();
        let mut code = Vec::new();
        for (i, (callback, params, result)) in CALLBACKS.iter().enumerate() {
            let mut f = Vec::new();
            uleb(ty(*params, result.is_some()), &mut f);
            funcs.push(f);
            let mut e = Vec::new();
            name(callback, &mut e);
            e.push(0x00);
            uleb((HOSTCALLS.len() + i) as u64, &mut e);
            exports.push(e);
            let mut body = vec![0x00]; // no locals
            for (hostcall, args) in self.calls.get(callback).into_iter().flatten() {
                for a in args {
                    body.push(0x41);
                    sleb(i64::from(*a), &mut body);
                }
                let index = HOSTCALLS.iter().position(|h| h.0 == *hostcall).unwrap();
                body.push(0x10);
                uleb(index as u64, &mut body);
                body.push(0x1a); // drop the status: the trace has it
            }
            if let Some(v) = result {
                body.push(0x41);
                sleb(i64::from(*v), &mut body);
            }
            body.push(0x0b);
            let mut c = Vec::new();
            uleb(body.len() as u64, &mut c);
            c.extend(body);
            code.push(c);
        }
        let mut e = Vec::new();
        name("memory", &mut e);
        e.extend([0x02, 0x00]);
        exports.push(e);
        let type_items: Vec<Vec<u8>> = types
            .iter()
            .map(|(params, result)| {
                let mut t = vec![0x60];
                uleb(*params as u64, &mut t);
                t.extend(std::iter::repeat_n(I32, *params));
                if *result {
                    t.extend([1, I32]);
                } else {
                    t.push(0);
                }
                t
            })
            .collect();
        let mut data = vec![0x00, 0x41];
        sleb(i64::from(DATA), &mut data);
        data.push(0x0b);
        uleb(self.data.len() as u64, &mut data);
        data.extend(&self.data);

        let mut out = b"\0asm\x01\0\0\0".to_vec();
        section(1, &type_items, &mut out);
        section(2, &imports, &mut out);
        section(3, &funcs, &mut out);
        section(5, &[vec![0x00, 0x01]], &mut out); // one memory, 1 page
        section(7, &exports, &mut out);
        section(10, &code, &mut out);
        section(11, &[data], &mut out);
        out
    }
}

/// Statuses of every `hostcall` the trace shows, in order.
fn statuses(host: &Host, hostcall: &str) -> Vec<String> {
    host.trace()
        .lines()
        .filter(|l| l.contains(&format!(" {hostcall}(")))
        .map(|l| l.rsplit("-> ").next().unwrap().to_string())
        .collect()
}

fn start(probe: &Probe) -> (Host, graceful_emulated_host::Vm) {
    let mut host = Host::new();
    let vm = host
        .try_start_module("probe", &probe.build(), "")
        .unwrap_or_else(|e| panic!("probe did not start: {e:?}"));
    (host, vm)
}

fn request(host: &mut Host, vm: graceful_emulated_host::Vm) -> StreamId {
    let s = host.stream(vm);
    host.request_headers(s, &[(":method", "GET"), (":path", "/x")], true);
    s
}

#[test]
fn it_traps_loudly_on_unimplemented_and_unknown_hostcalls() {
    for hostcall in ["proxy_call_foreign_function", "proxy_bogus"] {
        let mut p = Probe::default();
        let args = vec![0; HOSTCALLS.iter().find(|h| h.0 == hostcall).unwrap().1];
        p.on("proxy_on_configure", hostcall, args);
        let err = Host::new()
            .try_start_module("probe", &p.build(), "")
            .unwrap_err();
        let StartError::Trapped(message) = err else {
            panic!("{err:?}");
        };
        assert!(
            message.contains(&format!(
                "hostcall env.{hostcall} is not implemented by the test host"
            )),
            "{message}"
        );
    }
}

#[test]
fn it_gives_request_headers_only_in_their_own_callbacks_and_on_log() {
    let mut p = Probe::default();
    let (key, len) = p.bytes(b":path");
    for cb in [
        "proxy_on_request_headers",
        "proxy_on_response_headers",
        "proxy_on_log",
    ] {
        p.on(
            cb,
            "proxy_get_header_map_value",
            vec![0, key, len, OUT_PTR, OUT_SIZE],
        );
    }
    let (mut host, vm) = start(&p);
    let s = request(&mut host, vm);
    host.response_headers(s, &[(":status", "200")], true);
    host.log(s);
    assert_eq!(
        statuses(&host, "proxy_get_header_map_value"),
        ["Ok", "BadArgument", "Ok"],
        "{}",
        host.trace()
    );
}

#[test]
fn it_creates_response_trailers_only_at_the_end_of_the_body() {
    let mut p = Probe::default();
    let (k, kl) = p.bytes(b"x-t");
    let (v, vl) = p.bytes(b"v");
    for cb in ["proxy_on_response_headers", "proxy_on_response_body"] {
        p.on(cb, "proxy_add_header_map_value", vec![3, k, kl, v, vl]);
    }
    let (mut host, vm) = start(&p);
    let s = request(&mut host, vm);
    host.response_headers(s, &[(":status", "200")], false);
    host.response_body(s, b"a", false);
    assert_eq!(host.response(s).trailers, None);
    host.response_body(s, b"b", true);
    assert_eq!(
        statuses(&host, "proxy_add_header_map_value"),
        ["BadArgument", "BadArgument", "Ok"]
    );
    assert_eq!(host.response_trailer(s, "x-t").as_deref(), Some("v"));
    // A headers-only response never has a trailer map.
    let s = request(&mut host, vm);
    host.response_headers(s, &[(":status", "200")], true);
    assert_eq!(host.response(s).trailers, None);
}

#[test]
fn it_keeps_shared_data_cas_like_envoy() {
    let mut p = Probe::default();
    let (k, kl) = p.bytes(b"k");
    let (a, al) = p.bytes(b"a");
    let (b, bl) = p.bytes(b"b");
    let on = "proxy_on_configure";
    // A write to a missing key never mismatches, whatever its CAS.
    p.on(on, "proxy_set_shared_data", vec![k, kl, a, al, 12345]);
    p.on(
        on,
        "proxy_get_shared_data",
        vec![k, kl, OUT_PTR, OUT_SIZE, OUT_CAS],
    );
    // The first write got CAS 1: a write with it passes, then it is stale.
    p.on(on, "proxy_set_shared_data", vec![k, kl, b, bl, 1]);
    p.on(on, "proxy_set_shared_data", vec![k, kl, a, al, 1]);
    // No delete: an empty value stays, with a fresh CAS.
    p.on(on, "proxy_set_shared_data", vec![k, kl, 0, 0, 0]);
    p.on(
        on,
        "proxy_get_shared_data",
        vec![k, kl, OUT_PTR, OUT_SIZE, OUT_CAS],
    );
    let (host, _) = start(&p);
    assert_eq!(
        statuses(&host, "proxy_set_shared_data"),
        ["Ok", "Ok", "CasMismatch", "Ok"]
    );
    let gets: Vec<String> = host
        .trace()
        .lines()
        .filter(|l| l.contains("proxy_get_shared_data("))
        .map(str::to_string)
        .collect();
    assert!(gets[0].contains(r#""a", cas 1) -> Ok"#), "{gets:?}");
    assert!(gets[1].contains(r#""", cas 3) -> Ok"#), "{gets:?}");
    assert_eq!(host.shared_data("k"), Some(vec![]));
}

#[test]
fn it_refuses_the_effective_context_of_a_finished_stream() {
    let mut p = Probe::default();
    p.on("proxy_on_tick", "proxy_set_effective_context", vec![2]);
    let (mut host, vm) = start(&p);
    let s = request(&mut host, vm);
    host.tick(vm);
    host.log(s);
    host.tick(vm);
    assert_eq!(
        statuses(&host, "proxy_set_effective_context"),
        ["Ok", "BadArgument"]
    );
}

#[test]
fn it_delivers_a_local_reply_after_the_call_that_sent_it() {
    let mut p = Probe::default();
    let (body, bl) = p.bytes(b"no");
    p.on(
        "proxy_on_request_headers",
        "proxy_send_local_response",
        vec![403, 0, 0, body, bl, 0, 0, -1],
    );
    let (mut host, vm) = start(&p);
    let s = request(&mut host, vm);
    let trace = host.trace();
    let returned = trace.find("<- 0").expect("on_request_headers returned");
    let encoded = trace
        .find("-> proxy_on_response_headers")
        .expect("the sender's own response callback ran");
    assert!(returned < encoded, "{trace}");
    let r = host.response(s);
    assert_eq!((r.status(), r.body.as_slice()), (403, &b"no"[..]));
    assert_eq!(r.header("content-type").as_deref(), Some("text/plain"));
    assert_eq!(r.header("content-length").as_deref(), Some("2"));
    assert!(!host.reached_upstream(s));
}

#[test]
fn it_checks_http_calls_like_envoy_and_times_them_out() {
    let mut p = Probe::default();
    let (nope, nl) = p.bytes(b"nope");
    let (app, al) = p.bytes(b"app");
    let (full, fl) = p.pairs(&[(":method", "GET"), (":path", "/"), (":authority", "app")]);
    let (partial, pl) = p.pairs(&[(":method", "GET"), (":path", "/")]);
    let call = |up: i32, ul: i32, h: i32, hl: i32| vec![up, ul, h, hl, 0, 0, 0, 0, 100, OUT_TOKEN];
    p.on("proxy_on_tick", "proxy_http_call", call(nope, nl, full, fl));
    p.on(
        "proxy_on_tick",
        "proxy_http_call",
        call(app, al, partial, pl),
    );
    p.on("proxy_on_tick", "proxy_http_call", call(app, al, full, fl));
    let (mut host, vm) = start(&p);
    host.add_cluster("app");
    host.tick(vm);
    assert_eq!(
        statuses(&host, "proxy_http_call"),
        ["BadArgument", "BadArgument", "Ok"]
    );
    assert_eq!(host.pending_calls().len(), 1);
    host.advance(Duration::from_millis(99));
    assert_eq!(host.http_calls()[0].state, CallState::Pending);
    host.advance(Duration::from_millis(1));
    assert_eq!(host.http_calls()[0].state, CallState::Failed);
    assert!(host.trace().contains(
        "-> proxy_on_http_call_response(1, token 1, 0 headers, 0 body bytes, 0 trailers)"
    ));
}
