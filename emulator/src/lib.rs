//! A deterministic proxy-wasm host for the filters' `.wasm` files.
//!
//! Real Envoy shows the filters work, but it cannot stop time, put two
//! workers into a compare-and-swap race on purpose, or say which hostcalls a
//! filter made. This host can. It loads a `dist/*.wasm` module into
//! wasmtime and plays Envoy 1.40 around it:
//!
//! - **VM copies.** [`Host::start_vm`] starts one VM copy (Envoy starts one
//!   per worker plus one on the main thread): WASI stubs linked, `_initialize`
//!   run, the allocator found by name (`malloc`, else
//!   `proxy_on_memory_allocate`), then a root context, `proxy_on_vm_start`
//!   and `proxy_on_configure`. All copies of one host share one shared-data
//!   namespace (one Envoy process, one `vm_id`), one metric per name, one
//!   virtual clock, one log.
//! - **Time.** Nothing sleeps. Two clocks, as in Envoy: a monotonic one
//!   (WASI `clock_time_get` with `CLOCK_MONOTONIC`) and a wall clock
//!   (`proxy_get_current_time_nanoseconds`, WASI `CLOCK_REALTIME`).
//!   [`Host::advance`] moves both and fires, in time order, every tick that
//!   falls due (in every VM copy, as in Envoy) and every HTTP-call timeout;
//!   [`Host::step_wall_clock`] steps the wall clock alone, as NTP or an
//!   operator does; [`Host::tick`] ticks one copy now, [`Host::hold_ticks`]
//!   keeps a copy from ticking.
//! - **Streams.** [`Host::stream`] or [`Host::stream_through`] (a filter
//!   chain, e.g. drain then provider) and then the callbacks in Envoy's
//!   order: `request_headers`, `request_body`, `request_trailers`, the
//!   upstream's `response_headers`/`_body`/`_trailers`, and `log` (on_log,
//!   on_done, on_delete in every filter, contexts created first if a filter
//!   never saw the stream). Inspect what the filters left: headers sent
//!   upstream and downstream, the local reply, metrics, shared data, logs.
//! - **Trace.** Every callback and hostcall is recorded with its virtual
//!   time; when a test panics, dropping its host prints the trace.
//!
//! Envoy semantics reproduced (each observed on the Envoy 1.40 release
//! binary, or read in proxy-wasm-cpp-host where marked):
//! shared data with cpp-host's CAS rules (every write gets a fresh non-zero
//! CAS; a stale CAS mismatches; a write to a missing key never does; no
//! delete; an empty value reads back as "no bytes" with its CAS);
//! header maps only inside their callbacks, so request headers in the
//! response phase are `BadArgument`; a filter's map access ends when its
//! callback returns `Continue`; trailers exist only if the upstream sent
//! them, or are created by a write in the body callback at end of stream;
//! `get_header_map_value` returns the first of duplicated headers, replace
//! changes the first entry only; `send_local_response` is delivered after
//! the VM call returns, through the encoder callbacks of the filters that
//! saw the request (the sender included), rendered as Envoy does (a gRPC
//! request gets a trailers-only reply with `grpc-status` derived from the
//! HTTP status and `grpc-message` from the body); `set_effective_context`
//! refuses a deleted context; `http_call` needs `:method`, `:path`,
//! `:authority` and a known cluster, and a failed or timed-out call is
//! answered with no headers; counters refuse negative increments; metrics
//! are shared by name; properties are per stream, values raw bytes as the
//! test sets them (e.g. `response.flags` as 8 little-endian bytes).
//!
//! Deliberate differences: the router and the upstream are the test's to
//! play (it calls `response_headers` for the upstream's answer and for the
//! router's own 503s, and sets `upstream.address` and `response.flags` when
//! Envoy would know them); a stream ends only when the test calls `log` or
//! `reset`; one shared-data namespace per host; no network
//! data, gRPC calls, shared queues, foreign functions, `continue_stream`
//! or `close_stream` (they trap with "hostcall X is not implemented by the
//! test host", as does any unknown import); a second local reply on a
//! stream is refused (`BadArgument`) and a local reply after the response
//! started traps; a filter's first write of a shared-data key from any
//! callback but `on_vm_start`/`on_configure` traps (in Envoy another worker
//! may read the key as missing at the same moment, and with no CAS on a
//! missing key both writes land: one change is lost, both count it);
//! gauges are signed so that a double decrement shows as a negative value
//! instead of wrapping; WASI `random_get` is a seeded generator, so runs
//! repeat exactly; a trap fails the test at once (Envoy would reload or
//! fail the worker's VM).
//!
//! The modules, one concept each:
//!
//! - `vm`: VM copies and their contexts; running one VM callback and what
//!   Envoy does after it returns.
//! - `clock`: the virtual clocks, ticks and HTTP-call timeouts.
//! - `streams`: streams through a filter chain and their callbacks in
//!   Envoy's order; `headers`: header maps as Envoy keeps them and the
//!   proxy-wasm pairs encoding.
//! - `http_calls`: clusters, scripted answers, pending, failed and timed-out
//!   calls.
//! - `local_reply`: local replies rendered and delivered as Envoy does.
//! - `shared`: shared data, a store of the emulator's own with cpp-host's
//!   CAS rules ([`SharedData`]), and injected CAS races.
//! - `inspect`: what the filters left, and the hostcall trace.
//! - `abi`: the hostcalls themselves (`env.proxy_*`, WASI); `module`:
//!   finding and compiling the `.wasm` files; `world`: the state one
//!   emulated Envoy process holds.
//!
//! ```no_run
//! use std::time::Duration;
//! use graceful_emulated_host::{Filter, Host};
//!
//! let mut host = Host::new();
//! let config = r#"{"consumer_update_wait":"1s"}"#;
//! host.start_vm(Filter::Drain, config); // the main thread's copy
//! let w0 = host.start_vm(Filter::Drain, config);
//! let s = host.stream(w0);
//! host.request_headers(s, &[(":method", "POST"), (":path", "/graceful/closing")], true);
//! assert_eq!(host.local_reply(s).unwrap().status, 202);
//! host.log(s);
//! host.advance(Duration::from_millis(1050)); // ticks every 50 ms in both copies
//! assert_eq!(host.metric("graceful_drain_phase"), 2);
//! ```

mod abi;
mod clock;
mod headers;
mod http_calls;
mod inspect;
mod local_reply;
mod module;
mod shared;
mod streams;
mod vm;
mod world;

use std::cell::RefCell;
use std::rc::Rc;

pub use clock::WallStep;
pub use headers::HeaderMap;
pub use module::Filter;
pub use shared::SharedData;
use vm::VmHandle;
use world::World;
pub use world::{CallAnswer, CallState, HttpCall, Level, LocalReply, LogLine, Responder, Response};

/// A VM copy started by [`Host::start_vm`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vm(pub(crate) usize);

/// A stream (one HTTP request and its response) through one or more filters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamId(pub(crate) usize);

/// What a filter chain decided for a headers, body or trailers callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Every filter continued.
    Continue,
    /// A filter paused (or answered with a local reply).
    Pause,
}

/// Why a VM copy did not start.
#[derive(Debug, Clone)]
pub enum StartError {
    /// The module could not be instantiated (e.g. an import with the wrong
    /// signature) or is not a proxy-wasm 0.2.1 module.
    Load(String),
    /// `proxy_on_vm_start` or `proxy_on_configure` returned false.
    Refused {
        callback: &'static str,
        /// Everything that VM copy logged.
        logs: Vec<LogLine>,
    },
    /// The module trapped while starting.
    Trapped(String),
}

/// One emulated Envoy process: VM copies, streams, shared data, a virtual
/// clock. Each test owns its own; nothing is global but compiled code.
pub struct Host {
    world: Rc<RefCell<World>>,
    vms: Vec<VmHandle>,
}

impl Default for Host {
    fn default() -> Self {
        Host::new()
    }
}

/// Fails the test on a trap or misuse; the host's Drop prints the trace.
pub(crate) fn must<T>(r: Result<T, String>) -> T {
    r.unwrap_or_else(|e| panic!("{e}"))
}

pub(crate) fn action(v: i32) -> Result<Action, String> {
    match v {
        0 => Ok(Action::Continue),
        1 => Ok(Action::Pause),
        other => Err(format!(
            "filter returned action {other}, not in ABI 0.2.1's 0/1"
        )),
    }
}

impl Host {
    /// An empty process: no VM copy, no stream, the wall clock at
    /// 2026-01-01, the monotonic clock 10 s after boot.
    pub fn new() -> Host {
        Host {
            world: Rc::new(RefCell::new(World::new(
                clock::MONOTONIC_START_NS,
                clock::EPOCH_NS,
            ))),
            vms: Vec::new(),
        }
    }
}
