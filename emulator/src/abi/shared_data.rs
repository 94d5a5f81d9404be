//! Shared data: reads (with injected races) and writes under cpp-host's
//! CAS rules.

use graceful_core::shared::store::StoreError;
use wasmtime::Error;

use crate::world::{show, Callback, World};

use super::memory::{copy_out, read, write_u32};
use super::{status, with_world, Fail, Hc, C, CAS_MISMATCH, NOT_FOUND};

pub(super) fn proxy_get_shared_data(
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

pub(super) fn proxy_set_shared_data(
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
