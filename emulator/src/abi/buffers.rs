//! Buffers: request and response bodies, an HTTP call's answer body and
//! the VM and plugin configuration, each readable only in its callback.

use crate::world::{show, Callback, Ctx, World};

use super::memory::{copy_out, read};
use super::{not_implemented, status, with_world, Fail, Hc, BAD_ARGUMENT, C, NOT_FOUND};

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

pub(super) fn proxy_get_buffer_bytes(
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

pub(super) fn proxy_set_buffer_bytes(
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
