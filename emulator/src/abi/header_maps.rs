//! Header and trailer maps: which map a callback may see or write (Envoy's
//! rules per phase, the log phase, an HTTP call's answer) and the
//! `proxy_*_header_map_*` hostcalls.

use crate::headers::{self, HeaderMap};
use crate::world::{show, Ctx, World};

use super::memory::{copy_out, read};
use super::{not_implemented, status, with_world, Fail, Hc, BAD_ARGUMENT, C, NOT_FOUND};

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

pub(super) fn proxy_get_header_map_pairs(
    c: &mut C,
    map_type: i32,
    ptr_ptr: i32,
    size_ptr: i32,
) -> Hc {
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

pub(super) fn proxy_set_header_map_pairs(c: &mut C, map_type: i32, ptr: i32, len: i32) -> Hc {
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

pub(super) fn proxy_get_header_map_value(
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
pub(super) enum Edit {
    Add,
    Replace,
}

pub(super) fn edit_header(
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

pub(super) fn proxy_remove_header_map_value(
    c: &mut C,
    map_type: i32,
    key_ptr: i32,
    key_len: i32,
) -> Hc {
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
