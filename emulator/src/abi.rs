//! The proxy-wasm 0.2.1 hostcalls (`env.proxy_*`) and the WASI preview1
//! functions the filters import, as wasmtime host functions.
//!
//! Semantics follow proxy-wasm-cpp-host and Envoy 1.40's wasm context (as
//! observed on the 1.40 release binary): an empty value comes back as a null
//! pointer, a missing key or header is `NotFound`, a map that does not
//! exist in this phase is `BadArgument`. Hostcalls this host does not
//! implement trap with a message naming them, so a test that reaches one
//! fails loudly instead of reading a silent zero.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;
use std::time::Duration;

use graceful_core::store::StoreError;
use wasmtime::{Caller, Engine, Error, Linker, Memory, Module, TypedFunc};

use super::headers::{self, HeaderMap};
use super::world::{
    show, CallState, Callback, Ctx, Deferred, HttpCall, Level, LocalReply, LogLine, Metric,
    MetricKind, World,
};

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

// ---------------------------------------------------------------------------
// Guest memory

fn memory(c: &C) -> Result<Memory, Fail> {
    c.data()
        .memory
        .ok_or_else(|| status(INVALID_MEMORY_ACCESS, "module exports no memory"))
}

fn read(c: &C, ptr: i32, len: i32) -> Result<Vec<u8>, Fail> {
    let mem = memory(c)?;
    let (ptr, len) = (ptr as u32 as usize, len as u32 as usize);
    if ptr.saturating_add(len) > mem.data_size(c) {
        return Err(status(
            INVALID_MEMORY_ACCESS,
            format!("read of {len} bytes at {ptr:#x} is out of bounds"),
        ));
    }
    let mut buf = vec![0; len];
    mem.read(c, ptr, &mut buf)
        .map_err(|e| status(INVALID_MEMORY_ACCESS, e.to_string()))?;
    Ok(buf)
}

fn write(c: &mut C, ptr: u32, bytes: &[u8]) -> Result<(), Fail> {
    let mem = memory(c)?;
    mem.write(&mut *c, ptr as usize, bytes).map_err(|e| {
        status(
            INVALID_MEMORY_ACCESS,
            format!("write of {} bytes at {ptr:#x}: {e}", bytes.len()),
        )
    })
}

fn write_u32(c: &mut C, ptr: i32, v: u32) -> Result<(), Fail> {
    write(c, ptr as u32, &v.to_le_bytes())
}

/// cpp-host `copyToPointerSize`: allocates guest memory with the module's
/// allocator, copies `bytes` there and stores pointer and size. An empty
/// value is stored as a null pointer (the SDK then sees None).
fn copy_out(c: &mut C, bytes: &[u8], ptr_ptr: i32, size_ptr: i32) -> Result<(), Fail> {
    let mut addr = 0u32;
    if !bytes.is_empty() {
        let alloc = c
            .data()
            .alloc
            .clone()
            .ok_or_else(|| Fail::Trap(Error::msg("the module exports no allocator")))?;
        let len = i32::try_from(bytes.len())
            .map_err(|_| status(INVALID_MEMORY_ACCESS, "value larger than 2 GiB"))?;
        addr = alloc.call(&mut *c, len)? as u32;
        if addr == 0 {
            return Err(status(INVALID_MEMORY_ACCESS, "allocator returned null"));
        }
        write(c, addr, bytes)?;
    }
    write_u32(c, ptr_ptr, addr)?;
    write_u32(c, size_ptr, bytes.len() as u32)
}

fn with_world<R>(c: &C, f: impl FnOnce(&mut World, usize) -> R) -> R {
    let world = c.data().world.clone();
    let vm = c.data().vm;
    let mut w = world.borrow_mut();
    f(&mut w, vm)
}

// ---------------------------------------------------------------------------
// Header maps and buffers

const MAP_NAMES: [&str; 8] = [
    "RequestHeaders",
    "RequestTrailers",
    "ResponseHeaders",
    "ResponseTrailers",
    "GrpcInitialMetadata",
    "GrpcTrailingMetadata",
    "HttpCallResponseHeaders",
    "HttpCallResponseTrailers",
];

fn map_name(t: i32) -> String {
    usize::try_from(t)
        .ok()
        .and_then(|i| MAP_NAMES.get(i))
        .map_or_else(|| format!("map {t}"), |s| (*s).to_string())
}

/// The header map `map_type` as the current context may see it now.
/// Ok(None): the map does not exist, but in the log phase that is a plain
/// "not found" (Envoy's access-log maps may be absent), not an error.
fn map_mut(
    w: &mut World,
    vm: usize,
    map_type: i32,
    write: bool,
) -> Result<Option<&mut HeaderMap>, Fail> {
    let why = map_name(map_type);
    match map_type {
        4 | 5 => return Err(Fail::Trap(not_implemented("gRPC metadata maps"))),
        6 | 7 => {
            let active = w.vms[vm].active.as_mut();
            return match active.and_then(|a| a.call_answer.as_mut()) {
                Some(answer) => Ok(Some(if map_type == 6 {
                    &mut answer.headers
                } else {
                    &mut answer.trailers
                })),
                None => Err(status(
                    BAD_ARGUMENT,
                    format!("{why}: no HTTP call response is being delivered"),
                )),
            };
        }
        0..=3 => {}
        _ => return Err(status(BAD_ARGUMENT, format!("{why}: no such map type"))),
    }
    let Some((_, Ctx::Stream { stream, filter })) = w.current_ctx(vm) else {
        return Err(status(
            BAD_ARGUMENT,
            format!("{why}: not in a stream context"),
        ));
    };
    let s = &mut w.streams[stream];
    let open = s.chain[filter].open;
    let refuse = |phase: &str| {
        Err(status(
            BAD_ARGUMENT,
            format!("{why}: not available {phase} (Envoy has no such map here)"),
        ))
    };
    if open.log {
        if write {
            return refuse("for writing in on_log");
        }
        return Ok(match map_type {
            0 => s.request_headers.as_mut(),
            1 => s.request_trailers.as_mut(),
            2 => s.response_headers.as_mut(),
            _ => s.response_trailers.as_mut(),
        });
    }
    let map = match map_type {
        0 if open.request_headers => s.request_headers.as_mut(),
        2 if open.response_headers => s.response_headers.as_mut(),
        1 if open.request_trailers => s.request_trailers.as_mut(),
        3 if open.response_trailers => s.response_trailers.as_mut(),
        // Envoy creates the trailer map on a write in the last body
        // callback (`addEncodedTrailers`), and only there.
        1 if open.request_body && open.end_of_stream => {
            if write {
                Some(s.request_trailers.get_or_insert_with(HeaderMap::default))
            } else {
                s.request_trailers.as_mut()
            }
        }
        3 if open.response_body && open.end_of_stream => {
            if write {
                Some(s.response_trailers.get_or_insert_with(HeaderMap::default))
            } else {
                s.response_trailers.as_mut()
            }
        }
        _ => return refuse("in this callback"),
    };
    match map {
        Some(m) => Ok(Some(m)),
        None => refuse("(the stream has none)"),
    }
}

/// Which body buffer the current context may read now.
fn body_mut(w: &mut World, vm: usize, buffer_type: i32) -> Result<&mut Vec<u8>, Fail> {
    let Some((_, Ctx::Stream { stream, filter })) = w.current_ctx(vm) else {
        return Err(status(NOT_FOUND, "no stream body here"));
    };
    let s = &mut w.streams[stream];
    let open = s.chain[filter].open;
    match buffer_type {
        0 if open.request_body => Ok(&mut s.request_body),
        1 if open.response_body => Ok(&mut s.response_body),
        _ => Err(status(NOT_FOUND, "body not available in this callback")),
    }
}

fn buffer(w: &mut World, vm: usize, buffer_type: i32) -> Result<Vec<u8>, Fail> {
    let callback = w.active(vm).map(|a| a.callback);
    match buffer_type {
        0 | 1 => body_mut(w, vm, buffer_type).map(|b| b.clone()),
        2 | 3 => Err(status(NOT_FOUND, "no connection data in an HTTP filter")),
        4 => match w.active(vm).and_then(|a| a.call_answer.as_ref()) {
            Some(a) => Ok(a.body.clone()),
            None => Err(status(
                NOT_FOUND,
                "no HTTP call response is being delivered",
            )),
        },
        5 => Err(Fail::Trap(not_implemented("gRPC receive buffer"))),
        6 if callback == Some(Callback::VmStart) => Ok(w.vms[vm].vm_config.clone()),
        7 if callback == Some(Callback::Configure) => Ok(w.vms[vm].plugin_config.clone()),
        6 | 7 => Err(status(NOT_FOUND, "configuration outside its callback")),
        8 => Err(Fail::Trap(not_implemented("foreign function call data"))),
        _ => Err(status(BAD_ARGUMENT, "no such buffer type")),
    }
}

// ---------------------------------------------------------------------------
// The hostcalls

fn proxy_log(c: &mut C, level: i32, ptr: i32, len: i32) -> Hc {
    let message = read(c, ptr, len)?;
    let Some(level) = Level::from_abi(level) else {
        return Err(status(BAD_ARGUMENT, format!("log level {level}")));
    };
    let message = String::from_utf8_lossy(&message).into_owned();
    let detail = format!("{level:?}, {}", show(message.as_bytes()));
    let vm = c.data().name.clone();
    with_world(c, |w, _| w.logs.push(LogLine { vm, level, message }));
    Ok(detail)
}

fn proxy_get_log_level(c: &mut C, ptr: i32) -> Hc {
    // Trace: the host takes every line; the SDK filters by its own level.
    write_u32(c, ptr, 0)?;
    Ok(String::new())
}

fn proxy_get_current_time_nanoseconds(c: &mut C, ptr: i32) -> Hc {
    let now = with_world(c, |w, _| w.now_ns);
    write(c, ptr as u32, &now.to_le_bytes())?;
    Ok(String::new())
}

fn proxy_set_tick_period_milliseconds(c: &mut C, ms: i32) -> Hc {
    with_world(c, |w, vm| {
        let now = w.now_ns;
        let state = &mut w.vms[vm];
        state.tick_period_ms = ms as u32;
        // Envoy (re)arms the timer: the first tick is one period from now.
        state.next_tick_ns = (ms != 0).then(|| now + u64::from(ms as u32) * 1_000_000);
    });
    Ok(format!("{}ms", ms as u32))
}

fn proxy_get_buffer_bytes(
    c: &mut C,
    buffer_type: i32,
    start: i32,
    max: i32,
    ptr_ptr: i32,
    size_ptr: i32,
) -> Hc {
    let data = with_world(c, |w, vm| buffer(w, vm, buffer_type))?;
    let (start, max) = (start as u32 as usize, max as u32 as usize);
    let detail = format!("type {buffer_type}, {start}, {max}");
    // cpp-host: clamp to the buffer; a zero-length read writes nothing.
    let end = start.saturating_add(max).min(data.len());
    if start < end {
        copy_out(c, &data[start..end], ptr_ptr, size_ptr)?;
        Ok(format!("{detail}: {}", show(&data[start..end])))
    } else {
        Ok(format!("{detail}: nothing"))
    }
}

fn proxy_set_buffer_bytes(
    c: &mut C,
    buffer_type: i32,
    start: i32,
    size: i32,
    ptr: i32,
    len: i32,
) -> Hc {
    let data = read(c, ptr, len)?;
    let (start, size) = (start as u32 as usize, size as u32 as usize);
    if !(0..=1).contains(&buffer_type) {
        return Err(status(BAD_ARGUMENT, format!("type {buffer_type}")));
    }
    with_world(c, |w, vm| {
        let body = body_mut(w, vm, buffer_type)?;
        // Envoy's `Buffer::copyFrom`: prepend (after draining `size`) at
        // 0, append at or past the end, nothing else.
        if start == 0 {
            body.drain(..size.min(body.len()));
            body.splice(0..0, data.iter().copied());
        } else if start >= body.len() {
            body.extend_from_slice(&data);
        } else {
            return Err(status(BAD_ARGUMENT, "copyFrom in the middle of a body"));
        }
        Ok(format!(
            "type {buffer_type}, {start}, {size}, {}",
            show(&data)
        ))
    })
}

fn proxy_get_header_map_pairs(c: &mut C, map_type: i32, ptr_ptr: i32, size_ptr: i32) -> Hc {
    let encoded = with_world(c, |w, vm| {
        map_mut(w, vm, map_type, false)
            .map(|m| m.map(|m| (m.len(), m.encode())).unwrap_or((0, Vec::new())))
    })?;
    let (n, bytes) = encoded;
    // An empty map is an empty value: a null pointer (cpp-host).
    let bytes = if n == 0 { Vec::new() } else { bytes };
    copy_out(c, &bytes, ptr_ptr, size_ptr)?;
    Ok(format!("{}: {n} entries", map_name(map_type)))
}

fn proxy_set_header_map_pairs(c: &mut C, map_type: i32, ptr: i32, len: i32) -> Hc {
    let bytes = read(c, ptr, len)?;
    let Some(pairs) = headers::decode(&bytes) else {
        return Err(status(BAD_ARGUMENT, "malformed pairs"));
    };
    with_world(c, |w, vm| {
        let Some(map) = map_mut(w, vm, map_type, true)? else {
            return Err(status(BAD_ARGUMENT, "no map"));
        };
        *map = HeaderMap::from_pairs(&pairs);
        Ok(format!("{}: {} entries", map_name(map_type), pairs.len()))
    })
}

fn proxy_get_header_map_value(
    c: &mut C,
    map_type: i32,
    key_ptr: i32,
    key_len: i32,
    ptr_ptr: i32,
    size_ptr: i32,
) -> Hc {
    let key = read(c, key_ptr, key_len)?;
    let detail = format!("{}, {}", map_name(map_type), show(&key));
    let value = with_world(c, |w, vm| {
        map_mut(w, vm, map_type, false).map(|m| m.and_then(|m| m.first_owned(&key)))
    })
    .map_err(|e| match e {
        Fail::Status(s, why) => Fail::Status(s, format!("{detail}: {why}")),
        trap => trap,
    })?;
    match value {
        Some(v) => {
            copy_out(c, &v, ptr_ptr, size_ptr)?;
            Ok(format!("{detail}: {}", show(&v)))
        }
        None => Err(status(NOT_FOUND, detail)),
    }
}

#[derive(Clone, Copy)]
enum Edit {
    Add,
    Replace,
}

fn edit_header(
    c: &mut C,
    edit: Edit,
    map_type: i32,
    key_ptr: i32,
    key_len: i32,
    value_ptr: i32,
    value_len: i32,
) -> Hc {
    let key = read(c, key_ptr, key_len)?;
    let value = read(c, value_ptr, value_len)?;
    let detail = format!("{}, {}, {}", map_name(map_type), show(&key), show(&value));
    with_world(c, |w, vm| match map_mut(w, vm, map_type, true) {
        Ok(Some(map)) => {
            match edit {
                Edit::Add => map.add(&key, &value),
                Edit::Replace => map.replace(&key, &value),
            }
            Ok(detail)
        }
        Ok(None) => Err(status(BAD_ARGUMENT, format!("{detail}: no map"))),
        Err(Fail::Status(s, why)) => Err(Fail::Status(s, format!("{detail}: {why}"))),
        Err(trap) => Err(trap),
    })
}

fn proxy_remove_header_map_value(c: &mut C, map_type: i32, key_ptr: i32, key_len: i32) -> Hc {
    let key = read(c, key_ptr, key_len)?;
    let detail = format!("{}, {}", map_name(map_type), show(&key));
    with_world(c, |w, vm| match map_mut(w, vm, map_type, true) {
        Ok(Some(map)) => {
            map.remove(&key);
            Ok(detail)
        }
        Ok(None) => Err(status(BAD_ARGUMENT, format!("{detail}: no map"))),
        Err(Fail::Status(s, why)) => Err(Fail::Status(s, format!("{detail}: {why}"))),
        Err(trap) => Err(trap),
    })
}

/// A property path arrives as NUL-separated segments; stored dotted.
fn property_key(path: &[u8]) -> String {
    path.split(|&b| b == 0)
        .map(|seg| String::from_utf8_lossy(seg).into_owned())
        .collect::<Vec<_>>()
        .join(".")
}

fn proxy_get_property(c: &mut C, path_ptr: i32, path_len: i32, ptr_ptr: i32, size_ptr: i32) -> Hc {
    let key = property_key(&read(c, path_ptr, path_len)?);
    let value = with_world(c, |w, vm| {
        let plugin = match key.as_str() {
            "plugin_name" | "plugin_root_id" => Some(w.vms[vm].plugin.as_bytes().to_vec()),
            "plugin_vm_id" => Some(b"graceful".to_vec()),
            _ => None,
        };
        match w.current_ctx(vm) {
            Some((_, Ctx::Stream { stream, .. })) => {
                w.streams[stream].properties.get(&key).cloned().or(plugin)
            }
            _ => plugin,
        }
    });
    match value {
        Some(v) => {
            copy_out(c, &v, ptr_ptr, size_ptr)?;
            Ok(format!("{key}: {}", show(&v)))
        }
        None => Err(status(NOT_FOUND, key)),
    }
}

fn proxy_set_property(c: &mut C, path_ptr: i32, path_len: i32, ptr: i32, len: i32) -> Hc {
    let key = property_key(&read(c, path_ptr, path_len)?);
    let value = read(c, ptr, len)?;
    with_world(c, |w, vm| match w.current_ctx(vm) {
        Some((_, Ctx::Stream { stream, .. })) => {
            let detail = format!("{key}, {}", show(&value));
            w.streams[stream].properties.insert(key, value);
            Ok(detail)
        }
        _ => Err(status(
            BAD_ARGUMENT,
            format!("{key}: no stream (Envoy has no filter state here)"),
        )),
    })
}

fn proxy_get_shared_data(
    c: &mut C,
    key_ptr: i32,
    key_len: i32,
    ptr_ptr: i32,
    size_ptr: i32,
    cas_ptr: i32,
) -> Hc {
    let key = String::from_utf8_lossy(&read(c, key_ptr, key_len)?).into_owned();
    let (found, raced) = with_world(c, |w, _| {
        let found = w.store.read(&key);
        // An injected race: another worker writes right after this read,
        // so the value handed back is stale and the caller's CAS fails.
        let mut raced = false;
        if found.is_some() {
            let World { races, store, .. } = w;
            if let Some(race) = races.iter_mut().find(|r| r.key == key && r.remaining > 0) {
                race.remaining -= 1;
                (race.write)(store);
                raced = true;
            }
        }
        (found, raced)
    });
    let Some((value, cas)) = found else {
        return Err(status(NOT_FOUND, show(key.as_bytes())));
    };
    copy_out(c, &value, ptr_ptr, size_ptr)?;
    write_u32(c, cas_ptr, cas)?;
    Ok(format!(
        "{}: {}, cas {cas}{}",
        show(key.as_bytes()),
        show(&value),
        if raced {
            " [race injected after this read]"
        } else {
            ""
        }
    ))
}

fn proxy_set_shared_data(
    c: &mut C,
    key_ptr: i32,
    key_len: i32,
    ptr: i32,
    len: i32,
    cas: i32,
) -> Hc {
    let key = String::from_utf8_lossy(&read(c, key_ptr, key_len)?).into_owned();
    let value = read(c, ptr, len)?;
    let detail = format!(
        "{}, {}, cas {}",
        show(key.as_bytes()),
        show(&value),
        cas as u32
    );
    with_world(c, |w, vm| {
        // A key's first write must come from configure: elsewhere another
        // worker may have read the key as missing at the same moment, and
        // cpp-host lets both writes land (no CAS guards a missing key), so
        // one worker's change is lost and both think they made it.
        let callback = w.active(vm).map(|a| a.callback);
        let missing = !w.store.contains(&key);
        if missing && !matches!(callback, Some(Callback::VmStart | Callback::Configure)) {
            return Err(Fail::Trap(Error::msg(format!(
                "first write of shared-data key {} from {callback:?}: create it in on_configure \
                 (on a missing key Envoy ignores CAS, so two workers' writes both land)",
                show(key.as_bytes())
            ))));
        }
        set_shared(w, &key, &value, cas, detail)
    })
}

fn set_shared(w: &mut World, key: &str, value: &[u8], cas: i32, detail: String) -> Hc {
    match w.store.write(key, value, cas as u32) {
        Ok(()) => Ok(detail),
        Err(StoreError::CasMismatch) => Err(status(CAS_MISMATCH, detail)),
        Err(StoreError::Host(code)) => Err(status(code as i32, detail)),
    }
}

#[allow(clippy::too_many_arguments)]
fn proxy_send_local_response(
    c: &mut C,
    code: i32,
    details_ptr: i32,
    details_len: i32,
    body_ptr: i32,
    body_len: i32,
    headers_ptr: i32,
    headers_len: i32,
    grpc_status: i32,
) -> Hc {
    let details = String::from_utf8_lossy(&read(c, details_ptr, details_len)?).into_owned();
    let body = read(c, body_ptr, body_len)?;
    let Some(headers) = headers::decode(&read(c, headers_ptr, headers_len)?) else {
        return Err(status(BAD_ARGUMENT, "malformed header pairs"));
    };
    let headers = HeaderMap::from_pairs(&headers);
    let detail = format!("{code}, {headers:?}, {}, grpc {grpc_status}", show(&body));
    let vm_name = c.data().name.clone();
    with_world(c, |w, vm| {
        let Some((_, Ctx::Stream { stream, filter })) = w.current_ctx(vm) else {
            // Envoy has no decoder callbacks on a root context: the reply
            // goes nowhere, and the call still says Ok.
            return Ok(format!("{detail} [no stream: ignored, as Envoy does]"));
        };
        let s = &mut w.streams[stream];
        if s.ended {
            return Err(status(
                BAD_ARGUMENT,
                format!("{detail}: the stream has ended"),
            ));
        }
        if s.local_reply.is_some() {
            return Err(status(
                BAD_ARGUMENT,
                format!("{detail}: a local reply was already sent on this stream"),
            ));
        }
        if s.response_started {
            return Err(Fail::Trap(Error::msg(
                "send_local_response after the response started is not modelled by the test host",
            )));
        }
        s.local_reply = Some(LocalReply {
            status: code as u32,
            headers,
            body,
            grpc_status: u32::try_from(grpc_status).ok().filter(|g| *g <= 16),
            details,
            vm: vm_name,
        });
        // Envoy sends it after the VM call returns (an after-VM-call action).
        w.deferred
            .push_back(Deferred::LocalReply { stream, filter });
        Ok(detail)
    })
}

#[allow(clippy::too_many_arguments)]
fn proxy_http_call(
    c: &mut C,
    up_ptr: i32,
    up_len: i32,
    headers_ptr: i32,
    headers_len: i32,
    body_ptr: i32,
    body_len: i32,
    trailers_ptr: i32,
    trailers_len: i32,
    timeout_ms: i32,
    token_ptr: i32,
) -> Hc {
    let cluster = String::from_utf8_lossy(&read(c, up_ptr, up_len)?).into_owned();
    let Some(headers) = headers::decode(&read(c, headers_ptr, headers_len)?) else {
        return Err(status(BAD_ARGUMENT, "malformed header pairs"));
    };
    let body = read(c, body_ptr, body_len)?;
    if headers::decode(&read(c, trailers_ptr, trailers_len)?).is_none() {
        return Err(status(BAD_ARGUMENT, "malformed trailer pairs"));
    }
    let headers = HeaderMap::from_pairs(&headers);
    let detail = format!(
        "{cluster:?}, {headers:?}, {}, {}ms",
        show(&body),
        timeout_ms as u32
    );
    let vm_name = c.data().name.clone();
    let token = with_world(c, |w, vm| {
        // Envoy refuses a call without these, or to an unknown cluster.
        for required in [":method", ":path", ":authority"] {
            if !headers.contains(required) {
                return Err(status(BAD_ARGUMENT, format!("{detail}: no {required}")));
            }
        }
        if !w.clusters.contains(&cluster) {
            return Err(status(BAD_ARGUMENT, format!("{detail}: unknown cluster")));
        }
        let Some((context_id, _)) = w.current_ctx(vm) else {
            return Err(status(BAD_ARGUMENT, format!("{detail}: no context")));
        };
        let sent_at = w.elapsed();
        let state = &mut w.vms[vm];
        state.next_token += 1;
        let token = state.next_token;
        let id = w.calls.len();
        w.calls.push(HttpCall {
            id,
            vm: vm_name,
            cluster,
            headers,
            body,
            timeout: Duration::from_millis(u64::from(timeout_ms as u32)),
            sent_at,
            state: CallState::Pending,
            vm_index: vm,
            context_id,
            token,
        });
        w.deferred.push_back(Deferred::CallMade { call: id });
        Ok(token)
    })?;
    write_u32(c, token_ptr, token)?;
    Ok(format!("{detail}: token {token}"))
}

fn proxy_set_effective_context(c: &mut C, id: i32) -> Hc {
    with_world(c, |w, vm| {
        let state = &mut w.vms[vm];
        let id = id as u32;
        if !state.contexts.contains_key(&id) {
            return Err(status(
                BAD_ARGUMENT,
                format!("{id}: no such context (gone?)"),
            ));
        }
        if let Some(active) = state.active.as_mut() {
            active.effective = id;
        }
        Ok(id.to_string())
    })
}

fn proxy_define_metric(c: &mut C, kind: i32, name_ptr: i32, name_len: i32, id_ptr: i32) -> Hc {
    let name = String::from_utf8_lossy(&read(c, name_ptr, name_len)?).into_owned();
    let kind = match kind {
        0 => MetricKind::Counter,
        1 => MetricKind::Gauge,
        2 => MetricKind::Histogram,
        _ => {
            return Err(status(
                BAD_ARGUMENT,
                format!("{name:?}: metric type {kind}"),
            ))
        }
    };
    // One stat per name, shared by every VM copy (Envoy's stats scope).
    let id = with_world(c, |w, _| {
        if let Some(i) = w.metrics.iter().position(|m| m.name == name) {
            return i + 1;
        }
        let null = w.rejected_stats.contains(&name);
        w.metrics.push(Metric {
            name: name.clone(),
            kind,
            value: 0,
            samples: Vec::new(),
            null,
        });
        w.metrics.len()
    });
    write_u32(c, id_ptr, id as u32)?;
    Ok(format!("{kind:?} {name:?}: id {id}"))
}

fn metric_mut(w: &mut World, id: i32) -> Result<&mut Metric, Fail> {
    usize::try_from(id)
        .ok()
        .and_then(|i| i.checked_sub(1))
        .and_then(|i| w.metrics.get_mut(i))
        .ok_or_else(|| status(NOT_FOUND, format!("metric id {id}")))
}

fn proxy_increment_metric(c: &mut C, id: i32, offset: i64) -> Hc {
    with_world(c, |w, _| {
        let now = w.elapsed();
        let m = metric_mut(w, id)?;
        if m.null {
            return Ok(format!("{} (null stat) += {offset}", m.name));
        }
        match m.kind {
            // Envoy: counters only go up.
            MetricKind::Counter if offset <= 0 => {
                return Err(status(
                    BAD_ARGUMENT,
                    format!("{}: counter += {offset}", m.name),
                ))
            }
            MetricKind::Counter | MetricKind::Gauge => m.value += offset,
            MetricKind::Histogram => {
                return Err(status(BAD_ARGUMENT, format!("{}: histogram", m.name)))
            }
        }
        let mut detail = format!("{} += {offset}: {}", m.name, m.value);
        if m.value < 0 {
            // Envoy's gauges are u64: this would wrap there.
            detail.push_str(&format!(" [NEGATIVE GAUGE at {now:?}]"));
        }
        Ok(detail)
    })
}

fn proxy_record_metric(c: &mut C, id: i32, value: i64) -> Hc {
    with_world(c, |w, _| {
        let m = metric_mut(w, id)?;
        if m.null {
            return Ok(format!("{} (null stat) = {value}", m.name));
        }
        let value = value as u64;
        match m.kind {
            MetricKind::Counter => m.value += value as i64,
            MetricKind::Gauge => m.value = value as i64,
            MetricKind::Histogram => m.samples.push(value),
        }
        Ok(format!("{} = {value}", m.name))
    })
}

fn proxy_get_metric(c: &mut C, id: i32, ptr: i32) -> Hc {
    let value = with_world(c, |w, _| {
        let m = metric_mut(w, id)?;
        match m.kind {
            MetricKind::Histogram => Err(status(BAD_ARGUMENT, format!("{}: histogram", m.name))),
            _ => Ok(m.value as u64),
        }
    })?;
    write(c, ptr as u32, &value.to_le_bytes())?;
    Ok(format!("{id}: {value}"))
}

// ---------------------------------------------------------------------------
// WASI preview1: just what a Rust `wasm32-wasip1` cdylib needs to start.

fn fd_write(c: &mut C, fd: i32, iovs: i32, iovs_len: i32, nwritten_ptr: i32) -> Hc {
    let list = read(c, iovs, iovs_len.saturating_mul(8))?;
    let mut data = Vec::new();
    for iov in list.chunks_exact(8) {
        let ptr = i32::from_le_bytes([iov[0], iov[1], iov[2], iov[3]]);
        let len = i32::from_le_bytes([iov[4], iov[5], iov[6], iov[7]]);
        data.extend(read(c, ptr, len)?);
    }
    write_u32(c, nwritten_ptr, data.len() as u32)?;
    let name = c.data().name.clone();
    // Whole lines become log lines: a Rust panic message arrives here.
    with_world(c, |w, vm| {
        w.vms[vm].stdio.extend_from_slice(&data);
        while let Some(nl) = w.vms[vm].stdio.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = w.vms[vm].stdio.drain(..=nl).collect();
            w.logs.push(LogLine {
                vm: name.clone(),
                level: Level::Critical,
                message: format!("fd {fd}: {}", String::from_utf8_lossy(&line).trim_end()),
            });
        }
    });
    Ok(format!("fd {fd}, {}", show(&data)))
}

fn random_get(c: &mut C, ptr: i32, len: i32) -> Hc {
    let mut buf = vec![0u8; len as u32 as usize];
    with_world(c, |w, _| w.random(&mut buf));
    write(c, ptr as u32, &buf)?;
    Ok(format!("{} bytes", buf.len()))
}

/// Hostcalls defined here; every other import traps with its name.
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

/// A linker for `module` with every hostcall above, and a trapping stub
/// (named in its error) for each other import.
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
        |mut c: C<'_>, _id: i32, _precision: i64, ptr: i32| {
            let now = with_world(&c, |w, _| w.now_ns);
            let r = write(&mut c, ptr as u32, &now.to_le_bytes()).map(|()| String::new());
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
