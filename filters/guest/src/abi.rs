//! Header-map writes and local replies without the SDK's panics, and the
//! monotonic clock (the SDK reads only the wall clock). The SDK
//! wrappers `panic!` on any status but Ok; these calls can legitimately fail
//! (no trailer map on a headers-only response, a stream that has already
//! been answered), and a panic would trap the worker's VM. Same imports the
//! SDK declares, proxy-wasm ABI 0.2.1.
#![allow(unsafe_code)]

use proxy_wasm::types::MapType;

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_replace_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_remove_header_map_value(map_type: u32, key_data: *const u8, key_size: usize) -> u32;
    fn proxy_get_header_map_pairs(
        map_type: u32,
        return_map_data: *mut *mut u8,
        return_map_size: *mut usize,
    ) -> u32;
    fn proxy_send_local_response(
        status_code: u32,
        status_code_details_data: *const u8,
        status_code_details_size: usize,
        body_data: *const u8,
        body_size: usize,
        headers_data: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
}

#[link(wasm_import_module = "wasi_snapshot_preview1")]
extern "C" {
    /// WASI preview1's clock read, the import Rust's std declares for
    /// `Instant` (whose value is opaque: copies could not compare them).
    fn clock_time_get(clock_id: u32, precision: u64, time: *mut u64) -> u32;
}

/// proxy-wasm status Ok.
const OK: u32 = 0;

/// WASI's `CLOCK_MONOTONIC`.
const CLOCK_MONOTONIC: u32 = 1;

/// The host's monotonic clock in ns; None if it refused. cpp-host serves
/// it from `getMonotonicTimeNanoseconds`, in Envoy `steady_clock`: one
/// clock for the whole process (docs/design/shared-data.md).
pub fn monotonic_ns() -> Option<u64> {
    let mut ns: u64 = 0;
    // SAFETY: the out-pointer points at a live local for the call.
    let errno = unsafe { clock_time_get(CLOCK_MONOTONIC, 1, &mut ns) };
    (errno == 0).then_some(ns)
}

/// Sets a header or trailer, replacing any value; false if refused.
pub fn replace_header(map: MapType, name: &str, value: &str) -> bool {
    // SAFETY: pointers and lengths come from live slices for the duration of
    // the call; the host copies the bytes.
    unsafe {
        proxy_replace_header_map_value(
            map as u32,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        ) == OK
    }
}

/// Removes every value of a header; false if refused.
pub fn remove_header(map: MapType, name: &str) -> bool {
    // SAFETY: as in `replace_header`.
    unsafe { proxy_remove_header_map_value(map as u32, name.as_ptr(), name.len()) == OK }
}

/// A whole header (or trailer) map in the ABI's pairs encoding, from one
/// hostcall; None if the host refused (no such map in this phase). The SDK's
/// `get_map_bytes` panics on a refusal and on a non-UTF-8 name.
pub fn header_map_bytes(map: MapType) -> Option<Vec<u8>> {
    let mut data: *mut u8 = std::ptr::null_mut();
    let mut size: usize = 0;
    // SAFETY: both out-pointers point at live locals for the call.
    let status = unsafe { proxy_get_header_map_pairs(map as u32, &mut data, &mut size) };
    if status != OK {
        return None;
    }
    if data.is_null() {
        return Some(Vec::new());
    }
    // SAFETY: the host allocated `size` bytes through the SDK's
    // `proxy_on_memory_allocate` (a boxed slice of exactly `size` bytes,
    // whose layout is a Vec's with capacity `size`) and handed them over.
    Some(unsafe { Vec::from_raw_parts(data, size, size) })
}

/// Sends a local reply on the current (or effective) stream. `grpc_status`
/// is what Envoy puts in a gRPC request's trailers-only reply; -1 lets Envoy
/// derive it from `status`. False if the host refused.
pub fn send_reply(
    status: u32,
    headers: &[(&str, &str)],
    body: &[u8],
    grpc_status: Option<i32>,
) -> bool {
    let map = serialize_map(headers);
    // SAFETY: as in `replace_header`; the details pointer is null with size 0.
    unsafe {
        proxy_send_local_response(
            status,
            std::ptr::null(),
            0,
            body.as_ptr(),
            body.len(),
            map.as_ptr(),
            map.len(),
            grpc_status.unwrap_or(-1),
        ) == OK
    }
}

/// The proxy-wasm pairs encoding: count, then each key and value length
/// (u32 LE), then each key and value followed by a NUL.
fn serialize_map(pairs: &[(&str, &str)]) -> Vec<u8> {
    let size = 4 + pairs
        .iter()
        .map(|(k, v)| 10 + k.len() + v.len())
        .sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

/// The pairs of a map in the ABI's pairs encoding (see [`serialize_map`]),
/// in order; stops at the first malformed entry instead of panicking.
pub fn map_pairs(bytes: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    let u32_at = |at: usize| -> Option<usize> {
        let b: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
        usize::try_from(u32::from_le_bytes(b)).ok()
    };
    let count = u32_at(0).unwrap_or(0);
    let mut data = count.checked_mul(8).and_then(|n| n.checked_add(4));
    (0..count).map_while(move |i| {
        let at = data?;
        let key_len = u32_at(4 + i * 8)?;
        let value_len = u32_at(8 + i * 8)?;
        let key = bytes.get(at..at.checked_add(key_len)?)?;
        let value_at = at.checked_add(key_len)?.checked_add(1)?;
        let value = bytes.get(value_at..value_at.checked_add(value_len)?)?;
        data = value_at.checked_add(value_len)?.checked_add(1);
        Some((key, value))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_pairs_reads_what_serialize_map_writes_and_survives_garbage() {
        let bytes = serialize_map(&[("a", "bc"), ("", "d"), (":status", "200")]);
        let got: Vec<(&[u8], &[u8])> = map_pairs(&bytes).collect();
        let want: [(&[u8], &[u8]); 3] = [(b"a", b"bc"), (b"", b"d"), (b":status", b"200")];
        assert_eq!(got, want);
        assert_eq!(map_pairs(&[]).count(), 0);
        // Cut anywhere before the last value ends: never three pairs.
        for cut in 0..bytes.len() - 1 {
            assert!(map_pairs(&bytes[..cut]).count() < 3, "cut at {cut}");
        }
        let huge = [0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0];
        assert_eq!(map_pairs(&huge).count(), 0);
    }

    #[test]
    fn serialize_map_matches_the_abi_layout() {
        let got = serialize_map(&[("a", "bc"), ("", "d")]);
        let want: Vec<u8> = [
            &2u32.to_le_bytes()[..],
            &1u32.to_le_bytes(),
            &2u32.to_le_bytes(),
            &0u32.to_le_bytes(),
            &1u32.to_le_bytes(),
            b"a\0bc\0\0d\0",
        ]
        .concat();
        assert_eq!(got, want);
    }
}
