//! The proxy-wasm 0.2.1 hostcalls (`env.proxy_*`) and the WASI preview1
//! functions the filters import, as wasmtime host functions.
//!
//! Semantics follow proxy-wasm-cpp-host and Envoy 1.40's wasm context (as
//! observed on the 1.40 release binary): an empty value comes back as a null
//! pointer, a missing key or header is `NotFound`, a map that does not
//! exist in this phase is `BadArgument`. Hostcalls this host does not
//! implement trap with a message naming them, so a test that reaches one
//! fails loudly instead of reading a silent zero.
//!
//! One file per concept: this one holds what every hostcall shares (the
//! statuses, the store's data, the Ok/status/trap outcome and its trace
//! line) and the linker; `memory` reads and writes guest memory; the
//! hostcalls themselves are grouped by what they touch.

mod buffers;
mod contexts;
mod header_maps;
mod http_call;
mod local_reply;
mod log_and_time;
mod memory;
mod metrics;
mod properties;
mod shared_data;
mod wasi;

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;

use wasmtime::{Caller, Engine, Error, Linker, Memory, Module, TypedFunc};

use self::buffers::{proxy_get_buffer_bytes, proxy_set_buffer_bytes};
use self::contexts::proxy_set_effective_context;
use self::header_maps::{
    edit_header, proxy_get_header_map_pairs, proxy_get_header_map_value,
    proxy_remove_header_map_value, proxy_set_header_map_pairs, Edit,
};
use self::http_call::proxy_http_call;
use self::local_reply::proxy_send_local_response;
use self::log_and_time::{
    proxy_get_current_time_nanoseconds, proxy_get_log_level, proxy_log,
    proxy_set_tick_period_milliseconds,
};
use self::memory::write_u32;
use self::metrics::{
    proxy_define_metric, proxy_get_metric, proxy_increment_metric, proxy_record_metric,
};
use self::properties::{proxy_get_property, proxy_set_property};
use self::shared_data::{proxy_get_shared_data, proxy_set_shared_data};
use self::wasi::{clock_time_get, fd_write, random_get, ENOTSUP};
use super::world::World;

/// proxy-wasm statuses (`WasmResult`).
pub(crate) const OK: i32 = 0;
pub(crate) const NOT_FOUND: i32 = 1;
pub(crate) const BAD_ARGUMENT: i32 = 2;
pub(crate) const INVALID_MEMORY_ACCESS: i32 = 6;
pub(crate) const CAS_MISMATCH: i32 = 8;

fn status_name(s: i32) -> &'static str {
    match s {
        0 => "Ok",
        1 => "NotFound",
        2 => "BadArgument",
        3 => "SerializationFailure",
        4 => "ParseFailure",
        6 => "InvalidMemoryAccess",
        7 => "Empty",
        8 => "CasMismatch",
        10 => "InternalFailure",
        12 => "Unimplemented",
        _ => "?",
    }
}

/// What one VM copy's store carries.
pub(crate) struct VmData {
    pub world: Rc<RefCell<World>>,
    pub vm: usize,
    pub name: String,
    pub memory: Option<Memory>,
    /// `malloc` or `proxy_on_memory_allocate`, whichever the module exports.
    pub alloc: Option<TypedFunc<i32, i32>>,
}

type C<'a> = Caller<'a, VmData>;

/// Why a hostcall did not return Ok.
enum Fail {
    /// A proxy-wasm status for the module, and a note for the trace.
    Status(i32, String),
    /// Abort the VM call (unimplemented hostcall, `proc_exit`, a trap in
    /// the allocator).
    Trap(Error),
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        Fail::Trap(e)
    }
}

fn status(s: i32, why: impl Into<String>) -> Fail {
    Fail::Status(s, why.into())
}

/// Ok carries the trace detail of the call.
type Hc = Result<String, Fail>;

fn note(c: &C, line: String) {
    let world = c.data().world.clone();
    let name = c.data().name.clone();
    world.borrow_mut().note(&name, line);
}

/// Turns a hostcall's outcome into its ABI return value and a trace line.
fn finish(c: &C, name: &str, r: Hc) -> wasmtime::Result<i32> {
    match r {
        Ok(detail) => {
            note(c, format!("  {name}({detail}) -> Ok"));
            Ok(OK)
        }
        Err(Fail::Status(s, detail)) => {
            note(c, format!("  {name}({detail}) -> {}", status_name(s)));
            Ok(s)
        }
        Err(Fail::Trap(e)) => {
            note(c, format!("  {name} -> TRAP: {e}"));
            Err(e)
        }
    }
}

fn not_implemented(name: &str) -> Error {
    Error::msg(format!(
        "hostcall {name} is not implemented by the test host"
    ))
}

fn with_world<R>(c: &C, f: impl FnOnce(&mut World, usize) -> R) -> R {
    let world = c.data().world.clone();
    let vm = c.data().vm;
    let mut w = world.borrow_mut();
    f(&mut w, vm)
}

/// Hostcalls this module's files define; every other import traps with
/// its name.
const DEFINED: &[&str] = &[
    "proxy_log",
    "proxy_get_log_level",
    "proxy_get_current_time_nanoseconds",
    "proxy_set_tick_period_milliseconds",
    "proxy_get_buffer_bytes",
    "proxy_set_buffer_bytes",
    "proxy_get_header_map_pairs",
    "proxy_set_header_map_pairs",
    "proxy_get_header_map_value",
    "proxy_add_header_map_value",
    "proxy_replace_header_map_value",
    "proxy_remove_header_map_value",
    "proxy_get_property",
    "proxy_set_property",
    "proxy_get_shared_data",
    "proxy_set_shared_data",
    "proxy_send_local_response",
    "proxy_http_call",
    "proxy_set_effective_context",
    "proxy_define_metric",
    "proxy_increment_metric",
    "proxy_record_metric",
    "proxy_get_metric",
    "environ_get",
    "environ_sizes_get",
    "fd_write",
    "proc_exit",
    "random_get",
    "clock_time_get",
];

/// A linker for `module` with every hostcall in `DEFINED`, and a trapping
/// stub (named in its error) for each other import.
pub(crate) fn linker(engine: &Engine, module: &Module) -> wasmtime::Result<Linker<VmData>> {
    let mut l: Linker<VmData> = Linker::new(engine);
    macro_rules! hostcall {
        ($name:ident ( $($arg:ident : $ty:ty),* )) => {
            l.func_wrap("env", stringify!($name), |mut c: C<'_>, $($arg: $ty),*| {
                let r = $name(&mut c, $($arg),*);
                finish(&c, stringify!($name), r)
            })?;
        };
    }
    hostcall!(proxy_log(level: i32, ptr: i32, len: i32));
    hostcall!(proxy_get_log_level(ptr: i32));
    hostcall!(proxy_get_current_time_nanoseconds(ptr: i32));
    hostcall!(proxy_set_tick_period_milliseconds(ms: i32));
    hostcall!(proxy_get_buffer_bytes(t: i32, start: i32, max: i32, pp: i32, sp: i32));
    hostcall!(proxy_set_buffer_bytes(t: i32, start: i32, size: i32, p: i32, n: i32));
    hostcall!(proxy_get_header_map_pairs(t: i32, pp: i32, sp: i32));
    hostcall!(proxy_set_header_map_pairs(t: i32, p: i32, n: i32));
    hostcall!(proxy_get_header_map_value(t: i32, kp: i32, kn: i32, pp: i32, sp: i32));
    hostcall!(proxy_remove_header_map_value(t: i32, kp: i32, kn: i32));
    hostcall!(proxy_get_property(p: i32, n: i32, pp: i32, sp: i32));
    hostcall!(proxy_set_property(p: i32, n: i32, vp: i32, vn: i32));
    hostcall!(proxy_get_shared_data(kp: i32, kn: i32, pp: i32, sp: i32, cp: i32));
    hostcall!(proxy_set_shared_data(kp: i32, kn: i32, vp: i32, vn: i32, cas: i32));
    hostcall!(proxy_send_local_response(
        code: i32, dp: i32, dn: i32, bp: i32, bn: i32, hp: i32, hn: i32, grpc: i32
    ));
    hostcall!(proxy_http_call(
        up: i32, un: i32, hp: i32, hn: i32, bp: i32, bn: i32, tp: i32, tn: i32, ms: i32, tok: i32
    ));
    hostcall!(proxy_set_effective_context(id: i32));
    hostcall!(proxy_define_metric(kind: i32, np: i32, nn: i32, ip: i32));
    hostcall!(proxy_increment_metric(id: i32, offset: i64));
    hostcall!(proxy_record_metric(id: i32, value: i64));
    hostcall!(proxy_get_metric(id: i32, ptr: i32));
    l.func_wrap(
        "env",
        "proxy_add_header_map_value",
        |mut c: C<'_>, t: i32, kp: i32, kn: i32, vp: i32, vn: i32| {
            let r = edit_header(&mut c, Edit::Add, t, kp, kn, vp, vn);
            finish(&c, "proxy_add_header_map_value", r)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_replace_header_map_value",
        |mut c: C<'_>, t: i32, kp: i32, kn: i32, vp: i32, vn: i32| {
            let r = edit_header(&mut c, Edit::Replace, t, kp, kn, vp, vn);
            finish(&c, "proxy_replace_header_map_value", r)
        },
    )?;

    const WASI: &str = "wasi_snapshot_preview1";
    l.func_wrap(
        WASI,
        "environ_sizes_get",
        |mut c: C<'_>, n: i32, size: i32| {
            let r = write_u32(&mut c, n, 0)
                .and_then(|()| write_u32(&mut c, size, 0))
                .map(|()| String::new());
            // WASI errno 0 on success; a bad pointer is EFAULT (21).
            finish(&c, "environ_sizes_get", r).map(|s| if s == OK { 0 } else { 21 })
        },
    )?;
    l.func_wrap(WASI, "environ_get", |c: C<'_>, _env: i32, _buf: i32| {
        finish(&c, "environ_get", Ok(String::new()))
    })?;
    l.func_wrap(
        WASI,
        "fd_write",
        |mut c: C<'_>, fd: i32, iovs: i32, n: i32, written: i32| {
            let r = fd_write(&mut c, fd, iovs, n, written);
            finish(&c, "fd_write", r).map(|s| if s == OK { 0 } else { 21 })
        },
    )?;
    l.func_wrap(WASI, "random_get", |mut c: C<'_>, ptr: i32, len: i32| {
        let r = random_get(&mut c, ptr, len);
        finish(&c, "random_get", r).map(|s| if s == OK { 0 } else { 21 })
    })?;
    l.func_wrap(
        WASI,
        "clock_time_get",
        |mut c: C<'_>, id: i32, _precision: i64, ptr: i32| {
            let Some(r) = clock_time_get(&mut c, id, ptr) else {
                note(&c, format!("  clock_time_get(clock {id}) -> ENOTSUP"));
                return Ok(ENOTSUP);
            };
            finish(&c, "clock_time_get", r).map(|s| if s == OK { 0 } else { 21 })
        },
    )?;
    l.func_wrap(
        WASI,
        "proc_exit",
        |c: C<'_>, code: i32| -> wasmtime::Result<()> {
            let e = Error::msg(format!("the module called proc_exit({code})"));
            finish(&c, "proc_exit", Err(Fail::Trap(e))).map(|_| ())
        },
    )?;

    let defined: BTreeSet<&str> = DEFINED.iter().copied().collect();
    for import in module.imports() {
        let (m, name) = (import.module().to_string(), import.name().to_string());
        let known = (m == "env" || m == WASI) && defined.contains(name.as_str());
        if known {
            continue;
        }
        if let Some(ty) = import.ty().func() {
            let full = format!("{m}.{name}");
            l.func_new(&m, &name, ty.clone(), move |c: C<'_>, _args, _results| {
                let e = not_implemented(&full);
                note(&c, format!("  {full} -> TRAP: {e}"));
                Err(e)
            })?;
        }
    }
    Ok(l)
}
