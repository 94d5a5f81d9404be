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
//! - **Time.** Nothing sleeps. [`Host::advance`] moves the clock and fires,
//!   in time order, every tick that falls due (in every VM copy, as in
//!   Envoy) and every HTTP-call timeout; [`Host::tick`] ticks one copy now,
//!   [`Host::hold_ticks`] keeps a copy from ticking.
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
//! ```no_run
//! use std::time::Duration;
//! use graceful_host_tests::emu::{Filter, Host};
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
mod module;
mod pairs;
mod world;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use graceful_core::store::{MemStore, SharedStore};
use wasmtime::{Instance, InstancePre, Store, TypedFunc, WasmParams, WasmResults};

use abi::VmData;
pub use module::Filter;
pub use pairs::HeaderMap;
use world::{Active, Callback, Ctx, Deferred, Open, Race, Slot, Stream, VmState, World};
pub use world::{CallAnswer, CallState, HttpCall, Level, LocalReply, LogLine, Responder, Response};

/// A VM copy started by [`Host::start_vm`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vm(usize);

/// A stream (one HTTP request and its response) through one or more filters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamId(usize);

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

/// (context, token, headers, body size, trailers).
type CallResponseArgs = (i32, i32, i32, i32, i32);

/// The exports a VM copy is driven through (None if not exported: cpp-host
/// then skips the callback).
struct Exports {
    context_create: Option<TypedFunc<(i32, i32), ()>>,
    vm_start: Option<TypedFunc<(i32, i32), i32>>,
    configure: Option<TypedFunc<(i32, i32), i32>>,
    tick: Option<TypedFunc<i32, ()>>,
    request_headers: Option<TypedFunc<(i32, i32, i32), i32>>,
    request_body: Option<TypedFunc<(i32, i32, i32), i32>>,
    request_trailers: Option<TypedFunc<(i32, i32), i32>>,
    response_headers: Option<TypedFunc<(i32, i32, i32), i32>>,
    response_body: Option<TypedFunc<(i32, i32, i32), i32>>,
    response_trailers: Option<TypedFunc<(i32, i32), i32>>,
    log: Option<TypedFunc<i32, ()>>,
    done: Option<TypedFunc<i32, i32>>,
    delete: Option<TypedFunc<i32, ()>>,
    http_call_response: Option<TypedFunc<CallResponseArgs, ()>>,
}

struct VmHandle {
    store: Store<VmData>,
    ex: Exports,
}

fn typed<P: WasmParams, R: WasmResults>(
    instance: &Instance,
    store: &mut Store<VmData>,
    name: &str,
) -> Result<Option<TypedFunc<P, R>>, String> {
    if instance.get_func(&mut *store, name).is_none() {
        return Ok(None);
    }
    instance
        .get_typed_func::<P, R>(&mut *store, name)
        .map(Some)
        .map_err(|e| format!("export {name} has an unexpected signature: {e}"))
}

/// Root context id of every VM copy (Envoy's first context of a VM).
const ROOT: u32 = 1;
/// 2026-01-01T00:00:00Z: a realistic wall clock (the filters treat 0 as
/// "never").
const EPOCH_NS: u64 = 1_767_225_600_000_000_000;

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

impl Drop for Host {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Ok(w) = self.world.try_borrow() {
                eprintln!("---- proxy-wasm trace of the failed test ----");
                if w.trace.dropped > 0 {
                    eprintln!("({} earlier lines dropped)", w.trace.dropped);
                }
                for line in &w.trace.lines {
                    eprintln!("{line}");
                }
                eprintln!("---- end of trace ----");
            }
        }
    }
}

/// Fails the test on a trap or misuse; the host's Drop prints the trace.
fn must<T>(r: Result<T, String>) -> T {
    r.unwrap_or_else(|e| panic!("{e}"))
}

fn action(v: i32) -> Result<Action, String> {
    match v {
        0 => Ok(Action::Continue),
        1 => Ok(Action::Pause),
        other => Err(format!(
            "filter returned action {other}, not in ABI 0.2.1's 0/1"
        )),
    }
}

/// Envoy's `PercentEncoding::encode` for `grpc-message`.
fn percent_encode(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    for &b in bytes {
        if !(b' '..b'~').contains(&b) || b == b'%' {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        } else {
            out.push(b);
        }
    }
    out
}

/// What Envoy's `sendLocalReply` makes of a filter's local reply: the
/// headers and body the encoder filters (and the client) see.
fn render_local_reply(reply: &LocalReply, grpc: bool) -> (HeaderMap, Vec<u8>) {
    let mut h = HeaderMap::default();
    h.add(b":status", reply.status.to_string().as_bytes());
    for (k, v) in reply.headers.entries() {
        h.add(k, v);
    }
    if grpc {
        // Trailers-only: status in headers, the body is dropped.
        h.replace(b":status", b"200");
        h.replace(b"content-type", b"application/grpc");
        if !h.contains("grpc-status") {
            let code = reply
                .grpc_status
                .unwrap_or_else(|| abi::http_to_grpc_status(reply.status));
            h.add(b"grpc-status", code.to_string().as_bytes());
        }
        if !reply.body.is_empty() {
            let body = reply.body.strip_suffix(b"\n").unwrap_or(&reply.body);
            h.replace(b"grpc-message", &percent_encode(body));
        }
        h.remove(b"content-length");
        return (h, Vec::new());
    }
    if reply.body.is_empty() {
        h.remove(b"content-length");
        h.remove(b"content-type");
    } else {
        h.replace(b"content-length", reply.body.len().to_string().as_bytes());
        if !h.contains("content-type") {
            h.add(b"content-type", b"text/plain");
        }
    }
    (h, reply.body.clone())
}

impl Host {
    /// An empty process: no VM copy, no stream, clock at 2026-01-01.
    pub fn new() -> Host {
        Host {
            world: Rc::new(RefCell::new(World::new(EPOCH_NS))),
            vms: Vec::new(),
        }
    }

    // -----------------------------------------------------------------------
    // VM copies

    /// Starts a VM copy of `filter` with this plugin configuration (raw
    /// bytes, as Envoy passes a `StringValue`). Panics if it does not start.
    pub fn start_vm(&mut self, filter: Filter, config: impl AsRef<[u8]>) -> Vm {
        match self.try_start_vm(filter, config) {
            Ok(vm) => vm,
            Err(e) => panic!("{} did not start: {e:?}", filter.name()),
        }
    }

    /// Starts a VM copy; the error says why it did not start.
    pub fn try_start_vm(
        &mut self,
        filter: Filter,
        config: impl AsRef<[u8]>,
    ) -> Result<Vm, StartError> {
        let pre = module::prepared(filter);
        self.start_prepared(filter.short(), filter.name(), pre, config.as_ref())
    }

    /// Starts a VM copy of any proxy-wasm 0.2.1 module (compiled now, not
    /// cached), e.g. a hand-made one that calls particular hostcalls.
    pub fn try_start_module(
        &mut self,
        name: &str,
        wasm: &[u8],
        config: impl AsRef<[u8]>,
    ) -> Result<Vm, StartError> {
        let pre = module::prepare(wasm).map_err(StartError::Load)?;
        self.start_prepared(name, name, pre, config.as_ref())
    }

    fn start_prepared(
        &mut self,
        short: &str,
        plugin: &str,
        pre: InstancePre<VmData>,
        config: &[u8],
    ) -> Result<Vm, StartError> {
        let engine = module::engine();
        let index = self.vms.len();
        let name = {
            let mut w = self.world.borrow_mut();
            let n = w.vms.iter().filter(|v| v.short == short).count();
            let name = format!("{short}#{n}");
            w.vms.push(VmState {
                name: name.clone(),
                short: short.to_string(),
                plugin: plugin.to_string(),
                plugin_config: config.to_vec(),
                vm_config: Vec::new(),
                contexts: Default::default(),
                next_context_id: ROOT + 1,
                active: None,
                tick_period_ms: 0,
                next_tick_ns: None,
                ticks_held: false,
                dead: false,
                next_token: 0,
                stdio: Vec::new(),
            });
            w.note(
                &name,
                format!("start {plugin} ({} config bytes)", config.len()),
            );
            name
        };
        let mut store = Store::new(
            engine,
            VmData {
                world: self.world.clone(),
                vm: index,
                name,
                memory: None,
                alloc: None,
            },
        );
        let load = |e: String| StartError::Load(e);
        let instance = pre
            .instantiate(&mut store)
            .map_err(|e| load(format!("instantiate: {e:?}")))?;
        if instance
            .get_func(&mut store, "proxy_abi_version_0_2_1")
            .is_none()
        {
            return Err(load("not a proxy-wasm 0.2.1 module".into()));
        }
        let memory = instance.get_memory(&mut store, "memory");
        // cpp-host's order: `malloc` first, then the SDK's own allocator.
        let alloc = match typed::<i32, i32>(&instance, &mut store, "malloc").map_err(load)? {
            Some(f) => Some(f),
            None => typed::<i32, i32>(&instance, &mut store, "proxy_on_memory_allocate")
                .map_err(load)?,
        };
        if memory.is_none() || alloc.is_none() {
            return Err(load("module exports no memory or no allocator".into()));
        }
        store.data_mut().memory = memory;
        store.data_mut().alloc = alloc;
        let initialize = typed::<(), ()>(&instance, &mut store, "_initialize").map_err(load)?;
        let main = typed::<(i32, i32), i32>(&instance, &mut store, "main").map_err(load)?;
        let main_void = typed::<(), i32>(&instance, &mut store, "__main_void").map_err(load)?;
        let start = typed::<(), ()>(&instance, &mut store, "_start").map_err(load)?;
        let ex = Exports {
            context_create: typed(&instance, &mut store, "proxy_on_context_create")
                .map_err(load)?,
            vm_start: typed(&instance, &mut store, "proxy_on_vm_start").map_err(load)?,
            configure: typed(&instance, &mut store, "proxy_on_configure").map_err(load)?,
            tick: typed(&instance, &mut store, "proxy_on_tick").map_err(load)?,
            request_headers: typed(&instance, &mut store, "proxy_on_request_headers")
                .map_err(load)?,
            request_body: typed(&instance, &mut store, "proxy_on_request_body").map_err(load)?,
            request_trailers: typed(&instance, &mut store, "proxy_on_request_trailers")
                .map_err(load)?,
            response_headers: typed(&instance, &mut store, "proxy_on_response_headers")
                .map_err(load)?,
            response_body: typed(&instance, &mut store, "proxy_on_response_body").map_err(load)?,
            response_trailers: typed(&instance, &mut store, "proxy_on_response_trailers")
                .map_err(load)?,
            log: typed(&instance, &mut store, "proxy_on_log").map_err(load)?,
            done: typed(&instance, &mut store, "proxy_on_done").map_err(load)?,
            delete: typed(&instance, &mut store, "proxy_on_delete").map_err(load)?,
            http_call_response: typed(&instance, &mut store, "proxy_on_http_call_response")
                .map_err(load)?,
        };
        let context_create = ex.context_create.clone();
        let (vm_start, configure) = (ex.vm_start.clone(), ex.configure.clone());
        self.vms.push(VmHandle { store, ex });
        let trapped = |e: String| StartError::Trapped(e);
        // WASI reactor start-up (cpp-host): `_initialize`, then `main` if
        // any; a command module's `_start` only without `_initialize`.
        if initialize.is_some() {
            self.call(
                index,
                0,
                Callback::Initialize,
                initialize,
                (),
                "_initialize()".into(),
            )
            .map_err(trapped)?;
            if main_void.is_some() {
                self.call(
                    index,
                    0,
                    Callback::Initialize,
                    main_void,
                    (),
                    "__main_void()".into(),
                )
                .map_err(trapped)?;
            } else if main.is_some() {
                self.call(
                    index,
                    0,
                    Callback::Initialize,
                    main,
                    (0, 0),
                    "main(0, 0)".into(),
                )
                .map_err(trapped)?;
            }
        } else if start.is_some() {
            self.call(index, 0, Callback::Initialize, start, (), "_start()".into())
                .map_err(trapped)?;
        }
        self.world.borrow_mut().vms[index]
            .contexts
            .insert(ROOT, Ctx::Root);
        self.call(
            index,
            ROOT,
            Callback::ContextCreate,
            context_create,
            (ROOT as i32, 0),
            format!("proxy_on_context_create({ROOT}, 0)"),
        )
        .map_err(trapped)?;
        let refused = |host: &Host, callback: &'static str| {
            let mut w = host.world.borrow_mut();
            w.vms[index].dead = true;
            w.vms[index].next_tick_ns = None;
            let name = w.vms[index].name.clone();
            StartError::Refused {
                callback,
                logs: w.logs.iter().filter(|l| l.vm == name).cloned().collect(),
            }
        };
        let size = self.world.borrow().vms[index].vm_config.len() as i32;
        let ok = self
            .call(
                index,
                ROOT,
                Callback::VmStart,
                vm_start,
                (ROOT as i32, size),
                format!("proxy_on_vm_start({ROOT}, {size})"),
            )
            .map_err(trapped)?;
        if ok == Some(0) {
            return Err(refused(self, "proxy_on_vm_start"));
        }
        let size = config.len() as i32;
        let ok = self
            .call(
                index,
                ROOT,
                Callback::Configure,
                configure,
                (ROOT as i32, size),
                format!("proxy_on_configure({ROOT}, {size})"),
            )
            .map_err(trapped)?;
        if ok == Some(0) {
            return Err(refused(self, "proxy_on_configure"));
        }
        Ok(Vm(index))
    }

    /// The VM copy's name in logs and the trace (`"drain#1"`).
    pub fn vm_name(&self, vm: Vm) -> String {
        self.world.borrow().vms[vm.0].name.clone()
    }

    /// The tick period the VM copy asked for, if any.
    pub fn tick_period(&self, vm: Vm) -> Option<Duration> {
        let ms = self.world.borrow().vms[vm.0].tick_period_ms;
        (ms > 0).then(|| Duration::from_millis(u64::from(ms)))
    }

    /// Keeps `vm` from ticking on [`advance`](Self::advance) (true) or lets
    /// it tick again from now on (false).
    pub fn hold_ticks(&mut self, vm: Vm, hold: bool) {
        let mut w = self.world.borrow_mut();
        let now = w.now_ns;
        let state = &mut w.vms[vm.0];
        state.ticks_held = hold;
        if !hold && state.tick_period_ms > 0 {
            state.next_tick_ns = Some(now + u64::from(state.tick_period_ms) * 1_000_000);
        }
    }

    /// Runs `proxy_on_tick` in `vm` now (its schedule is unchanged).
    pub fn tick(&mut self, vm: Vm) {
        must(self.fire_tick(vm.0));
    }

    fn fire_tick(&mut self, vm: usize) -> Result<(), String> {
        if self.world.borrow().vms[vm].dead {
            return Err(format!(
                "{} is dead and cannot tick",
                self.world.borrow().vms[vm].name
            ));
        }
        let f = self.vms[vm].ex.tick.clone();
        self.call(
            vm,
            ROOT,
            Callback::Tick,
            f,
            ROOT as i32,
            format!("proxy_on_tick({ROOT})"),
        )?;
        Ok(())
    }

    // -----------------------------------------------------------------------
    // The clock

    /// The virtual wall clock.
    pub fn now(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(self.world.borrow().now_ns)
    }

    /// The virtual clock in µs since the epoch, as the filters read it.
    pub fn now_us(&self) -> u64 {
        self.world.borrow().now_ns / 1_000
    }

    /// Virtual time since the host was created.
    pub fn elapsed(&self) -> Duration {
        self.world.borrow().elapsed()
    }

    /// Moves the clock forward by `d`, firing on the way, in time order,
    /// every due tick of every VM copy (copies in start order) and every
    /// HTTP call timeout (before ticks of the same instant).
    pub fn advance(&mut self, d: Duration) {
        let target = self.world.borrow().now_ns + u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        must(self.run_until(target));
    }

    /// Moves the clock to `elapsed` since the host was created (see
    /// [`advance`](Self::advance)); panics if that is in the past.
    pub fn advance_to(&mut self, elapsed: Duration) {
        let now = self.elapsed();
        assert!(
            elapsed >= now,
            "advance_to({elapsed:?}) but it is already {now:?}"
        );
        self.advance(elapsed - now);
    }

    fn run_until(&mut self, target: u64) -> Result<(), String> {
        loop {
            enum Next {
                Timeout(usize),
                Tick(usize),
            }
            let next = {
                let w = self.world.borrow();
                let mut best: Option<(u64, Next)> = None;
                for c in &w.calls {
                    if c.state != CallState::Pending || c.timeout.is_zero() {
                        continue;
                    }
                    let due = w.start_ns
                        + u64::try_from((c.sent_at + c.timeout).as_nanos()).unwrap_or(u64::MAX);
                    if best.as_ref().is_none_or(|(t, _)| due < *t) {
                        best = Some((due, Next::Timeout(c.id)));
                    }
                }
                for (i, v) in w.vms.iter().enumerate() {
                    if v.dead || v.ticks_held {
                        continue;
                    }
                    if let Some(due) = v.next_tick_ns {
                        if best.as_ref().is_none_or(|(t, _)| due < *t) {
                            best = Some((due, Next::Tick(i)));
                        }
                    }
                }
                best
            };
            let Some((due, next)) = next.filter(|(t, _)| *t <= target) else {
                break;
            };
            {
                let mut w = self.world.borrow_mut();
                w.now_ns = w.now_ns.max(due);
            }
            match next {
                Next::Timeout(id) => {
                    self.world
                        .borrow_mut()
                        .note("host", format!("http call {id} timed out"));
                    self.deliver_call(id, None)?;
                }
                Next::Tick(vm) => {
                    {
                        let mut w = self.world.borrow_mut();
                        let state = &mut w.vms[vm];
                        state.next_tick_ns =
                            Some(due + u64::from(state.tick_period_ms) * 1_000_000);
                    }
                    self.fire_tick(vm)?;
                }
            }
        }
        let mut w = self.world.borrow_mut();
        w.now_ns = w.now_ns.max(target);
        Ok(())
    }

    // -----------------------------------------------------------------------
    // Streams

    /// A new stream through one filter.
    pub fn stream(&mut self, vm: Vm) -> StreamId {
        self.stream_through(&[vm])
    }

    /// A new stream through a filter chain, in decoding order (Envoy's
    /// `http_filters` order). Defaults: `source.address` 127.0.0.1 with a
    /// port of its own, `destination.address` 127.0.0.1:10000; set others
    /// with [`set_property`](Self::set_property).
    pub fn stream_through(&mut self, chain: &[Vm]) -> StreamId {
        assert!(!chain.is_empty(), "a stream needs at least one filter");
        let mut w = self.world.borrow_mut();
        let id = w.streams.len();
        let mut slots = Vec::new();
        for vm in chain {
            let state = &mut w.vms[vm.0];
            assert!(!state.dead, "{} is dead", state.name);
            // Envoy allocates the context id when it creates the filter;
            // proxy_on_context_create runs at the first callback.
            let context_id = state.next_context_id;
            state.next_context_id += 1;
            slots.push(Slot {
                vm: vm.0,
                context_id,
                created: false,
                deleted: false,
                open: Open::default(),
            });
        }
        let mut properties = std::collections::BTreeMap::new();
        properties.insert(
            "source.address".to_string(),
            format!("127.0.0.1:{}", 40000 + id % 20000).into_bytes(),
        );
        properties.insert(
            "destination.address".to_string(),
            b"127.0.0.1:10000".to_vec(),
        );
        let names: Vec<String> = slots
            .iter()
            .map(|s| format!("{}/{}", w.vms[s.vm].name, s.context_id))
            .collect();
        w.streams.push(Stream {
            chain: slots,
            properties,
            request_headers: None,
            request_body: Vec::new(),
            request_trailers: None,
            response_headers: None,
            response_body: Vec::new(),
            response_trailers: None,
            response_body_total: Vec::new(),
            local_reply: None,
            grpc: false,
            reached_upstream: false,
            stopped_at: None,
            response_started: false,
            response_complete: false,
            ended: false,
        });
        w.note(
            "host",
            format!("stream {id} through {}", names.join(" -> ")),
        );
        StreamId(id)
    }

    /// Sets a property of the stream (dotted path, e.g. `upstream.address`)
    /// to raw bytes, as Envoy would encode it.
    pub fn set_property(&mut self, s: StreamId, path: &str, value: impl Into<Vec<u8>>) {
        let value = value.into();
        let mut w = self.world.borrow_mut();
        w.note(
            "host",
            format!("stream {}: property {path} = {}", s.0, world::show(&value)),
        );
        w.streams[s.0].properties.insert(path.to_string(), value);
    }

    /// A property of the stream as currently set.
    pub fn property(&self, s: StreamId, path: &str) -> Option<Vec<u8>> {
        self.world.borrow().streams[s.0]
            .properties
            .get(path)
            .cloned()
    }

    /// `source.address`: the downstream peer, `ip:port`.
    pub fn set_source(&mut self, s: StreamId, address: &str) {
        self.set_property(s, "source.address", address);
    }

    /// `upstream.address`: the host that answers (Envoy knows it only once
    /// a host was picked, i.e. in the response phase).
    pub fn set_upstream(&mut self, s: StreamId, address: &str) {
        self.set_property(s, "upstream.address", address);
    }

    /// `xds.cluster_name`: the route's cluster.
    pub fn set_cluster(&mut self, s: StreamId, cluster: &str) {
        self.set_property(s, "xds.cluster_name", cluster);
    }

    /// `response.flags` (u64 little-endian, Envoy's legacy bits: 0x20 UF,
    /// 0x40 UC, 0x4000 DC, ...).
    pub fn set_response_flags(&mut self, s: StreamId, flags: u64) {
        self.set_property(s, "response.flags", flags.to_le_bytes().to_vec());
    }

    fn ensure_context(&mut self, s: usize, j: usize) -> Result<(), String> {
        let (vm, ctx, created) = {
            let w = self.world.borrow();
            let slot = &w.streams[s].chain[j];
            (slot.vm, slot.context_id, slot.created)
        };
        if created {
            return Ok(());
        }
        {
            let mut w = self.world.borrow_mut();
            if w.vms[vm].dead {
                return Err(format!(
                    "{} is dead; stream {s} cannot use it",
                    w.vms[vm].name
                ));
            }
            w.vms[vm].contexts.insert(
                ctx,
                Ctx::Stream {
                    stream: s,
                    filter: j,
                },
            );
            w.streams[s].chain[j].created = true;
        }
        let f = self.vms[vm].ex.context_create.clone();
        self.call(
            vm,
            ctx,
            Callback::ContextCreate,
            f,
            (ctx as i32, ROOT as i32),
            format!("proxy_on_context_create({ctx}, {ROOT})"),
        )?;
        Ok(())
    }

    fn slot(&self, s: usize, j: usize) -> (usize, u32) {
        let w = self.world.borrow();
        let slot = &w.streams[s].chain[j];
        (slot.vm, slot.context_id)
    }

    fn set_open(&self, s: usize, j: usize, open: Open) {
        self.world.borrow_mut().streams[s].chain[j].open = open;
    }

    fn check_live(&self, s: usize) -> Result<(), String> {
        if self.world.borrow().streams[s].ended {
            return Err(format!("stream {s} has ended (log was called)"));
        }
        Ok(())
    }

    /// The client's request headers reach the chain; returns Continue if
    /// every filter continued (the router forwards them), Pause if one
    /// paused or answered locally (then the local reply has been delivered
    /// already, through the encoder callbacks, as Envoy does).
    pub fn request_headers<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &mut self,
        s: StreamId,
        headers: &[(K, V)],
        end_of_stream: bool,
    ) -> Action {
        must(self.try_request_headers(s, HeaderMap::from_pairs(headers), end_of_stream))
    }

    fn try_request_headers(
        &mut self,
        s: StreamId,
        map: HeaderMap,
        eos: bool,
    ) -> Result<Action, String> {
        let s = s.0;
        self.check_live(s)?;
        let n = {
            let mut w = self.world.borrow_mut();
            let st = &mut w.streams[s];
            if st.request_headers.is_some() {
                return Err(format!("stream {s}: request headers sent twice"));
            }
            st.grpc = map
                .get("content-type")
                .is_some_and(|ct| ct.starts_with(b"application/grpc"));
            let n = map.len();
            st.request_headers = Some(map);
            n
        };
        let len = self.world.borrow().streams[s].chain.len();
        for j in 0..len {
            self.ensure_context(s, j)?;
            let (vm, ctx) = self.slot(s, j);
            self.set_open(
                s,
                j,
                Open {
                    request_headers: true,
                    ..Open::default()
                },
            );
            let f = self.vms[vm].ex.request_headers.clone();
            let r = self.call(
                vm,
                ctx,
                Callback::RequestHeaders,
                f,
                (ctx as i32, n as i32, i32::from(eos)),
                format!("proxy_on_request_headers({ctx}, {n}, eos={eos})"),
            )?;
            let a = r.map_or(Ok(Action::Continue), action)?;
            let replied = self.world.borrow().streams[s].local_reply.is_some();
            if replied || a == Action::Pause {
                self.world.borrow_mut().streams[s].stopped_at = Some(j);
                return Ok(Action::Pause);
            }
            self.set_open(s, j, Open::default());
        }
        self.world.borrow_mut().streams[s].reached_upstream = true;
        Ok(Action::Continue)
    }

    /// Which filters get a request body or trailers: those the headers went
    /// through, up to and including one that paused.
    fn request_reach(&self, s: usize) -> Result<usize, String> {
        let w = self.world.borrow();
        let st = &w.streams[s];
        if st.request_headers.is_none() {
            return Err(format!("stream {s}: request body before headers"));
        }
        if st.local_reply.is_some() {
            return Ok(0);
        }
        Ok(st.stopped_at.map_or(st.chain.len(), |j| j + 1))
    }

    /// A request body chunk.
    pub fn request_body(&mut self, s: StreamId, body: &[u8], end_of_stream: bool) -> Action {
        must(self.try_body(s.0, body, end_of_stream, false))
    }

    /// A response body chunk from the upstream.
    pub fn response_body(&mut self, s: StreamId, body: &[u8], end_of_stream: bool) -> Action {
        must(self.try_body(s.0, body, end_of_stream, true))
    }

    fn try_body(
        &mut self,
        s: usize,
        body: &[u8],
        eos: bool,
        response: bool,
    ) -> Result<Action, String> {
        self.check_live(s)?;
        let order: Vec<usize> = if response {
            self.response_order(s)?
        } else {
            (0..self.request_reach(s)?).collect()
        };
        {
            let mut w = self.world.borrow_mut();
            let st = &mut w.streams[s];
            if response {
                st.response_body = body.to_vec();
            } else {
                st.request_body = body.to_vec();
            }
        }
        let mut result = Action::Continue;
        for j in order {
            let (vm, ctx) = self.slot(s, j);
            let open = if response {
                Open {
                    response_body: true,
                    end_of_stream: eos,
                    ..Open::default()
                }
            } else {
                Open {
                    request_body: true,
                    end_of_stream: eos,
                    ..Open::default()
                }
            };
            self.set_open(s, j, open);
            let (f, name, cb) = if response {
                (
                    self.vms[vm].ex.response_body.clone(),
                    "proxy_on_response_body",
                    Callback::ResponseBody,
                )
            } else {
                (
                    self.vms[vm].ex.request_body.clone(),
                    "proxy_on_request_body",
                    Callback::RequestBody,
                )
            };
            let len = body.len();
            let r = self.call(
                vm,
                ctx,
                cb,
                f,
                (ctx as i32, len as i32, i32::from(eos)),
                format!("{name}({ctx}, {len}, eos={eos})"),
            )?;
            self.set_open(s, j, Open::default());
            if r.map_or(Ok(Action::Continue), action)? == Action::Pause {
                result = Action::Pause;
                break;
            }
        }
        let mut w = self.world.borrow_mut();
        let st = &mut w.streams[s];
        if response {
            let chunk = std::mem::take(&mut st.response_body);
            st.response_body_total.extend_from_slice(&chunk);
            if eos {
                st.response_complete = true;
            }
        }
        Ok(result)
    }

    /// Request trailers from the client.
    pub fn request_trailers<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &mut self,
        s: StreamId,
        trailers: &[(K, V)],
    ) -> Action {
        must(self.try_trailers(s.0, HeaderMap::from_pairs(trailers), false))
    }

    /// Response trailers from the upstream.
    pub fn response_trailers<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &mut self,
        s: StreamId,
        trailers: &[(K, V)],
    ) -> Action {
        must(self.try_trailers(s.0, HeaderMap::from_pairs(trailers), true))
    }

    fn try_trailers(&mut self, s: usize, map: HeaderMap, response: bool) -> Result<Action, String> {
        self.check_live(s)?;
        let order: Vec<usize> = if response {
            self.response_order(s)?
        } else {
            (0..self.request_reach(s)?).collect()
        };
        let n = map.len();
        {
            let mut w = self.world.borrow_mut();
            let st = &mut w.streams[s];
            if response {
                st.response_trailers = Some(map);
                st.response_complete = true;
            } else {
                st.request_trailers = Some(map);
            }
        }
        for j in order {
            let (vm, ctx) = self.slot(s, j);
            let open = if response {
                Open {
                    response_trailers: true,
                    ..Open::default()
                }
            } else {
                Open {
                    request_trailers: true,
                    ..Open::default()
                }
            };
            self.set_open(s, j, open);
            let (f, name, cb) = if response {
                (
                    self.vms[vm].ex.response_trailers.clone(),
                    "proxy_on_response_trailers",
                    Callback::ResponseTrailers,
                )
            } else {
                (
                    self.vms[vm].ex.request_trailers.clone(),
                    "proxy_on_request_trailers",
                    Callback::RequestTrailers,
                )
            };
            let r = self.call(
                vm,
                ctx,
                cb,
                f,
                (ctx as i32, n as i32),
                format!("{name}({ctx}, {n})"),
            )?;
            if r.map_or(Ok(Action::Continue), action)? == Action::Pause {
                return Ok(Action::Pause);
            }
            self.set_open(s, j, Open::default());
        }
        Ok(Action::Continue)
    }

    /// Encoder order for an upstream response: every filter, last first.
    fn response_order(&self, s: usize) -> Result<Vec<usize>, String> {
        let w = self.world.borrow();
        let st = &w.streams[s];
        if st.local_reply.is_some() {
            return Err(format!(
                "stream {s} was answered by a local reply; no upstream response"
            ));
        }
        if !st.reached_upstream {
            return Err(format!(
                "stream {s}: the request never reached the upstream"
            ));
        }
        if st.response_complete {
            return Err(format!("stream {s}: the response has ended already"));
        }
        Ok((0..st.chain.len()).rev().collect())
    }

    /// The upstream's response headers (the router's own replies too: a
    /// 503 for a connect failure is a response like any other, with
    /// `response.flags` set).
    pub fn response_headers<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &mut self,
        s: StreamId,
        headers: &[(K, V)],
        end_of_stream: bool,
    ) -> Action {
        must(self.try_response_headers(s.0, HeaderMap::from_pairs(headers), end_of_stream))
    }

    fn try_response_headers(
        &mut self,
        s: usize,
        map: HeaderMap,
        eos: bool,
    ) -> Result<Action, String> {
        self.check_live(s)?;
        let order = self.response_order(s)?;
        {
            let mut w = self.world.borrow_mut();
            let st = &mut w.streams[s];
            if st.response_started {
                return Err(format!("stream {s}: response headers sent twice"));
            }
            st.response_started = true;
            st.response_complete = eos;
            st.response_headers = Some(map);
        }
        self.encode_headers(s, &order, eos)
    }

    fn encode_headers(&mut self, s: usize, order: &[usize], eos: bool) -> Result<Action, String> {
        let n = self.world.borrow().streams[s]
            .response_headers
            .as_ref()
            .map_or(0, HeaderMap::len);
        for &j in order {
            self.ensure_context(s, j)?;
            let (vm, ctx) = self.slot(s, j);
            self.set_open(
                s,
                j,
                Open {
                    response_headers: true,
                    ..Open::default()
                },
            );
            let f = self.vms[vm].ex.response_headers.clone();
            let r = self.call(
                vm,
                ctx,
                Callback::ResponseHeaders,
                f,
                (ctx as i32, n as i32, i32::from(eos)),
                format!("proxy_on_response_headers({ctx}, {n}, eos={eos})"),
            )?;
            if r.map_or(Ok(Action::Continue), action)? == Action::Pause {
                return Ok(Action::Pause);
            }
            self.set_open(s, j, Open::default());
        }
        Ok(Action::Continue)
    }

    /// Envoy delivering a filter's local reply (after the VM call that sent
    /// it returned): rendered like `sendLocalReply`, then through the
    /// encoder callbacks of filter `j` and those before it, last first.
    fn deliver_local_reply(&mut self, s: usize, j: usize) -> Result<(), String> {
        let (headers, body) = {
            let mut w = self.world.borrow_mut();
            let st = &mut w.streams[s];
            let Some(reply) = st.local_reply.clone() else {
                return Ok(());
            };
            let (headers, body) = render_local_reply(&reply, st.grpc);
            st.response_started = true;
            st.response_headers = Some(headers.clone());
            st.stopped_at.get_or_insert(j);
            w.note(
                "host",
                format!(
                    "stream {s}: Envoy sends the local reply of {}: {headers:?}",
                    reply.vm
                ),
            );
            (headers, body)
        };
        let _ = headers;
        let order: Vec<usize> = (0..=j).rev().collect();
        let eos = body.is_empty();
        self.world.borrow_mut().streams[s].response_complete = eos;
        self.encode_headers(s, &order, eos)?;
        if !eos {
            self.world.borrow_mut().streams[s].response_body = body.clone();
            for &k in &order {
                let (vm, ctx) = self.slot(s, k);
                self.set_open(
                    s,
                    k,
                    Open {
                        response_body: true,
                        end_of_stream: true,
                        ..Open::default()
                    },
                );
                let f = self.vms[vm].ex.response_body.clone();
                let len = body.len();
                self.call(
                    vm,
                    ctx,
                    Callback::ResponseBody,
                    f,
                    (ctx as i32, len as i32, 1),
                    format!("proxy_on_response_body({ctx}, {len}, eos=true)"),
                )?;
                self.set_open(s, k, Open::default());
            }
            let mut w = self.world.borrow_mut();
            let st = &mut w.streams[s];
            let chunk = std::mem::take(&mut st.response_body);
            st.response_body_total.extend_from_slice(&chunk);
            st.response_complete = true;
        }
        Ok(())
    }

    /// The stream ends: Envoy calls `on_log` in every filter (creating the
    /// context first where a filter never saw the stream), then `on_done`
    /// and `on_delete`. Covers complete streams, resets and aborts alike.
    pub fn log(&mut self, s: StreamId) {
        must(self.try_log(s.0));
    }

    /// The client reset the stream (or the connection dropped): no more
    /// callbacks but `on_log`, `on_done`, `on_delete` (Envoy 1.40 logs every
    /// stream that reached a filter).
    pub fn reset(&mut self, s: StreamId) {
        self.world
            .borrow_mut()
            .note("host", format!("stream {}: downstream reset", s.0));
        must(self.try_log(s.0));
    }

    fn try_log(&mut self, s: usize) -> Result<(), String> {
        self.check_live(s)?;
        let len = self.world.borrow().streams[s].chain.len();
        for j in 0..len {
            self.ensure_context(s, j)?;
            let (vm, ctx) = self.slot(s, j);
            self.set_open(
                s,
                j,
                Open {
                    log: true,
                    ..Open::default()
                },
            );
            let f = self.vms[vm].ex.log.clone();
            self.call(
                vm,
                ctx,
                Callback::Log,
                f,
                ctx as i32,
                format!("proxy_on_log({ctx})"),
            )?;
            self.set_open(s, j, Open::default());
        }
        self.world.borrow_mut().streams[s].ended = true;
        for j in 0..len {
            let (vm, ctx) = self.slot(s, j);
            let f = self.vms[vm].ex.done.clone();
            let done = self.call(
                vm,
                ctx,
                Callback::Done,
                f,
                ctx as i32,
                format!("proxy_on_done({ctx})"),
            )?;
            if done == Some(0) {
                return Err(format!(
                    "proxy_on_done({ctx}) returned false (waits for proxy_done): not modelled"
                ));
            }
            let f = self.vms[vm].ex.delete.clone();
            self.call(
                vm,
                ctx,
                Callback::Delete,
                f,
                ctx as i32,
                format!("proxy_on_delete({ctx})"),
            )?;
            let mut w = self.world.borrow_mut();
            w.vms[vm].contexts.remove(&ctx);
            w.streams[s].chain[j].deleted = true;
            // Envoy cancels the calls of a context that goes away.
            for c in w.calls.iter_mut() {
                if c.vm_index == vm && c.context_id == ctx && c.state == CallState::Pending {
                    c.state = CallState::Cancelled;
                }
            }
        }
        Ok(())
    }

    // -----------------------------------------------------------------------
    // VM calls

    /// Runs one VM callback with `ctx` as its context, records it in the
    /// trace, and then does what Envoy does after a VM call returns
    /// (deliver local replies, offer new HTTP calls to scripted answers).
    #[allow(clippy::too_many_arguments)]
    fn call<P: WasmParams, R: WasmResults + std::fmt::Debug>(
        &mut self,
        vm: usize,
        ctx: u32,
        callback: Callback,
        f: Option<TypedFunc<P, R>>,
        params: P,
        what: String,
    ) -> Result<Option<R>, String> {
        self.call_with(vm, ctx, callback, f, params, what, None)
    }

    #[allow(clippy::too_many_arguments)]
    fn call_with<P: WasmParams, R: WasmResults + std::fmt::Debug>(
        &mut self,
        vm: usize,
        ctx: u32,
        callback: Callback,
        f: Option<TypedFunc<P, R>>,
        params: P,
        what: String,
        call_answer: Option<CallAnswer>,
    ) -> Result<Option<R>, String> {
        let name = self.world.borrow().vms[vm].name.clone();
        let Some(f) = f else {
            self.world
                .borrow_mut()
                .note(&name, format!("{what}: not exported, skipped"));
            return Ok(None);
        };
        {
            let mut w = self.world.borrow_mut();
            if w.vms[vm].active.is_some() {
                return Err(format!("{name}: {what} while another call is in progress"));
            }
            w.vms[vm].active = Some(Active {
                callback,
                effective: ctx,
                call_answer,
            });
            w.note(&name, format!("-> {what}"));
        }
        let result = f.call(&mut self.vms[vm].store, params);
        {
            let mut w = self.world.borrow_mut();
            w.vms[vm].active = None;
            match &result {
                Ok(r) => w.note(&name, format!("<- {r:?}")),
                Err(e) => {
                    w.vms[vm].dead = true;
                    w.note(&name, format!("<- TRAP: {e:?}"));
                }
            }
        }
        match result {
            Ok(r) => {
                self.run_deferred()?;
                Ok(Some(r))
            }
            Err(e) => {
                let w = self.world.borrow();
                let stdio: Vec<&str> = w
                    .logs
                    .iter()
                    .filter(|l| l.vm == name && l.message.starts_with("fd "))
                    .map(|l| l.message.as_str())
                    .collect();
                Err(format!(
                    "{name} trapped in {what}: {e:?}{}",
                    if stdio.is_empty() {
                        String::new()
                    } else {
                        format!("\nmodule output:\n{}", stdio.join("\n"))
                    }
                ))
            }
        }
    }

    fn run_deferred(&mut self) -> Result<(), String> {
        loop {
            let next = self.world.borrow_mut().deferred.pop_front();
            match next {
                None => return Ok(()),
                Some(Deferred::LocalReply { stream, filter }) => {
                    self.deliver_local_reply(stream, filter)?
                }
                Some(Deferred::CallMade { call }) => self.offer_call(call)?,
            }
        }
    }

    // -----------------------------------------------------------------------
    // HTTP calls

    /// Declares an upstream cluster: `http_call` to any other is refused
    /// with BadArgument, as Envoy does.
    pub fn add_cluster(&mut self, name: &str) {
        self.world.borrow_mut().clusters.insert(name.to_string());
    }

    /// Answers calls to `cluster` as they are made (right after the VM call
    /// that made them returns). `answer` returning None leaves a call
    /// pending. Declares the cluster too.
    pub fn respond(
        &mut self,
        cluster: &str,
        answer: impl FnMut(&HttpCall) -> Option<CallAnswer> + 'static,
    ) {
        self.add_cluster(cluster);
        self.world
            .borrow_mut()
            .responders
            .push((cluster.to_string(), Box::new(answer)));
    }

    fn offer_call(&mut self, id: usize) -> Result<(), String> {
        let (call, mut responders) = {
            let mut w = self.world.borrow_mut();
            (w.calls[id].clone(), std::mem::take(&mut w.responders))
        };
        let mut answer = None;
        for (cluster, f) in responders.iter_mut() {
            if *cluster == call.cluster {
                answer = f(&call);
                if answer.is_some() {
                    break;
                }
            }
        }
        {
            let mut w = self.world.borrow_mut();
            responders.append(&mut w.responders);
            w.responders = responders;
        }
        match answer {
            Some(a) => self.deliver_call(id, Some(a)),
            None => Ok(()),
        }
    }

    /// Every HTTP call made so far, in order.
    pub fn http_calls(&self) -> Vec<HttpCall> {
        self.world.borrow().calls.clone()
    }

    /// The calls still waiting for an answer.
    pub fn pending_calls(&self) -> Vec<HttpCall> {
        self.world
            .borrow()
            .calls
            .iter()
            .filter(|c| c.state == CallState::Pending)
            .cloned()
            .collect()
    }

    /// Answers a pending call: `proxy_on_http_call_response` runs in the
    /// context that made it.
    pub fn answer_call(&mut self, id: usize, answer: CallAnswer) {
        must(self.deliver_call(id, Some(answer)));
    }

    /// Fails a pending call (reset, no healthy upstream): delivered with no
    /// headers and no body, as Envoy does.
    pub fn fail_call(&mut self, id: usize) {
        must(self.deliver_call(id, None));
    }

    fn deliver_call(&mut self, id: usize, answer: Option<CallAnswer>) -> Result<(), String> {
        let (vm, ctx, token, alive) = {
            let mut w = self.world.borrow_mut();
            let c = &w.calls[id];
            if c.state != CallState::Pending {
                return Err(format!("http call {id} is not pending: {:?}", c.state));
            }
            let (vm, ctx, token) = (c.vm_index, c.context_id, c.token);
            let alive = !w.vms[vm].dead && w.vms[vm].contexts.contains_key(&ctx);
            w.calls[id].state = match &answer {
                _ if !alive => CallState::Cancelled,
                Some(a) => CallState::Answered(
                    a.headers
                        .text(":status")
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0),
                ),
                None => CallState::Failed,
            };
            (vm, ctx, token, alive)
        };
        if !alive {
            return Ok(());
        }
        let answer = answer.unwrap_or_default();
        let (nh, nb, nt) = (
            answer.headers.len(),
            answer.body.len(),
            answer.trailers.len(),
        );
        let f = self.vms[vm].ex.http_call_response.clone();
        self.call_with(
            vm,
            ctx,
            Callback::HttpCallResponse,
            f,
            (ctx as i32, token as i32, nh as i32, nb as i32, nt as i32),
            format!("proxy_on_http_call_response({ctx}, token {token}, {nh} headers, {nb} body bytes, {nt} trailers)"),
            Some(answer),
        )?;
        Ok(())
    }

    // -----------------------------------------------------------------------
    // Inspectors

    /// The request headers as the filters left them (what the router would
    /// forward).
    pub fn request_headers_map(&self, s: StreamId) -> HeaderMap {
        self.world.borrow().streams[s.0]
            .request_headers
            .clone()
            .unwrap_or_default()
    }

    /// One request header as the filters left it.
    pub fn request_header(&self, s: StreamId, name: &str) -> Option<String> {
        self.request_headers_map(s).text(name)
    }

    /// True if the request went through every filter to the router.
    pub fn reached_upstream(&self, s: StreamId) -> bool {
        self.world.borrow().streams[s.0].reached_upstream
    }

    /// The response as the client gets it: headers and trailers as the
    /// filters left them, the body chunks delivered so far.
    pub fn response(&self, s: StreamId) -> Response {
        let w = self.world.borrow();
        let st = &w.streams[s.0];
        Response {
            headers: st.response_headers.clone().unwrap_or_default(),
            body: st.response_body_total.clone(),
            trailers: st.response_trailers.clone(),
        }
    }

    /// One response header as the client gets it.
    pub fn response_header(&self, s: StreamId, name: &str) -> Option<String> {
        self.response(s).header(name)
    }

    /// One response trailer as the client gets it.
    pub fn response_trailer(&self, s: StreamId, name: &str) -> Option<String> {
        self.response(s).trailer(name)
    }

    /// The local reply a filter sent on this stream, as it asked for it.
    pub fn local_reply(&self, s: StreamId) -> Option<LocalReply> {
        self.world.borrow().streams[s.0].local_reply.clone()
    }

    /// A metric's value by name (counters: total; gauges: current value).
    /// Panics if no VM copy defined it, so a misspelt name fails.
    pub fn metric(&self, name: &str) -> i64 {
        self.try_metric(name)
            .unwrap_or_else(|| panic!("metric {name:?} was never defined"))
    }

    /// A metric's value, None if never defined.
    pub fn try_metric(&self, name: &str) -> Option<i64> {
        self.world
            .borrow()
            .metrics
            .iter()
            .find(|m| m.name == name)
            .map(|m| m.value)
    }

    /// The shared-data value under `key`, None if never set.
    pub fn shared_data(&self, key: &str) -> Option<Vec<u8>> {
        let w = self.world.borrow();
        w.store.get(key).ok().flatten().map(|(v, _)| v)
    }

    /// Writes a shared-data value unconditionally, as some other writer in
    /// the process could (e.g. to plant garbage).
    pub fn set_shared_data(&mut self, key: &str, value: &[u8]) {
        let mut w = self.world.borrow_mut();
        w.note(
            "host",
            format!("shared data {key:?} = {}", world::show(value)),
        );
        let _ = w.store.set(key, value, 0);
    }

    /// Runs `f` on the shared-data store (e.g. with `graceful_core`'s
    /// decoders, or to set up a record).
    pub fn with_store<R>(&self, f: impl FnOnce(&MemStore) -> R) -> R {
        f(&self.world.borrow().store)
    }

    /// Injects a compare-and-swap race: for the next `times` reads of `key`
    /// by any VM copy, `write` runs right after the read, as if another
    /// worker wrote in between; the reader's CAS then mismatches.
    pub fn race_after_read(
        &mut self,
        key: &str,
        times: usize,
        write: impl FnMut(&MemStore) + 'static,
    ) {
        self.world.borrow_mut().races.push(Race {
            key: key.to_string(),
            remaining: times,
            write: Box::new(write),
        });
    }

    /// Every log line so far.
    pub fn logs(&self) -> Vec<LogLine> {
        self.world.borrow().logs.clone()
    }

    /// Messages logged at exactly `level`.
    pub fn logs_at(&self, level: Level) -> Vec<String> {
        self.world
            .borrow()
            .logs
            .iter()
            .filter(|l| l.level == level)
            .map(|l| l.message.clone())
            .collect()
    }

    /// Messages logged at `level` or above.
    pub fn logs_at_least(&self, level: Level) -> Vec<String> {
        self.world
            .borrow()
            .logs
            .iter()
            .filter(|l| l.level >= level)
            .map(|l| l.message.clone())
            .collect()
    }

    /// Messages containing `needle`, any level.
    pub fn logs_containing(&self, needle: &str) -> Vec<String> {
        self.world
            .borrow()
            .logs
            .iter()
            .filter(|l| l.message.contains(needle))
            .map(|l| l.message.clone())
            .collect()
    }

    /// True if a VM copy trapped or was refused: Envoy would stop using it.
    pub fn is_dead(&self, vm: Vm) -> bool {
        self.world.borrow().vms[vm.0].dead
    }

    /// The hostcall trace so far, one line per callback or hostcall.
    pub fn trace(&self) -> String {
        let w = self.world.borrow();
        w.trace.lines.iter().cloned().collect::<Vec<_>>().join("\n")
    }
}
