//! Properties: the plugin's own and a stream's (its filter state).

use crate::world::{show, Ctx};

use super::memory::{copy_out, read};
use super::{status, with_world, Hc, BAD_ARGUMENT, C, NOT_FOUND};

/// A property path arrives as NUL-separated segments; stored dotted.
fn property_key(path: &[u8]) -> String {
    path.split(|&b| b == 0)
        .map(|seg| String::from_utf8_lossy(seg).into_owned())
        .collect::<Vec<_>>()
        .join(".")
}

pub(super) fn proxy_get_property(
    c: &mut C,
    path_ptr: i32,
    path_len: i32,
    ptr_ptr: i32,
    size_ptr: i32,
) -> Hc {
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

pub(super) fn proxy_set_property(
    c: &mut C,
    path_ptr: i32,
    path_len: i32,
    ptr: i32,
    len: i32,
) -> Hc {
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
