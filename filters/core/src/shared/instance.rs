//! The instance id: what lets a consumer tell a restarted instance on the
//! same address from the one that announced it was closing. One id per Envoy
//! process, agreed by all of its VM copies through shared data.

use crate::shared::store::{SharedStore, StoreError};

/// A fresh id: 16 hex digits mixing the start time with entropy from the
/// host (WASI `random_get`), so two processes started in the same
/// microsecond still differ.
pub fn generate(now_us: u64, entropy: u64) -> String {
    // Multiplying by an odd constant spreads the time over all bits before
    // mixing; either input alone already makes ids distinct.
    format!(
        "{:016x}",
        now_us.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ entropy
    )
}

/// True for ids that can travel in a header value unchanged.
pub fn is_valid(id: &[u8]) -> bool {
    !id.is_empty() && id.len() <= 128 && id.iter().all(|b| (0x21..0x7f).contains(b))
}

/// The process's instance id: the stored one if any VM copy already chose
/// it, else `candidate`, stored for the others. Run at configure time (the
/// main thread's VM configures before workers serve, so copies agree).
pub fn agree(store: &dyn SharedStore, candidate: &str) -> Result<String, StoreError> {
    if let Some((bytes, _)) = store.get(crate::shared::keys::INSTANCE_ID.name)? {
        if is_valid(&bytes) {
            return Ok(String::from_utf8_lossy(&bytes).into_owned());
        }
    }
    store.set(
        crate::shared::keys::INSTANCE_ID.name,
        candidate.as_bytes(),
        0,
    )?;
    Ok(candidate.to_string())
}

/// The identity value: `<header name>\n<instance id>`.
pub fn encode_identity(header: &str, id: &str) -> Vec<u8> {
    format!("{header}\n{id}").into_bytes()
}

/// The header name and id, if the value is well formed.
pub fn decode_identity(bytes: &[u8]) -> Option<(String, String)> {
    let text = std::str::from_utf8(bytes).ok()?;
    let (header, id) = text.split_once('\n')?;
    let header_ok = !header.is_empty() && header.bytes().all(|b| b.is_ascii_graphic() && b != b':');
    (header_ok && is_valid(id.as_bytes())).then(|| (header.to_string(), id.to_string()))
}

/// Entropy for instance ids: std's per-process random hasher keys (seeded
/// from the OS natively, from WASI `random_get` in a VM), mixed with `seed`.
pub fn entropy(seed: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(seed);
    h.finish()
}

/// The process's instance id, agreed with every other VM copy (and filter)
/// through shared data at configure time; if the store refuses, this copy's
/// own, logged.
pub fn agreed_instance_id(h: &impl crate::shared::host::Host) -> String {
    // The wall clock: a monotonic one may read alike in two processes.
    let now = h.wall_clock_us();
    let candidate = generate(now, entropy(now));
    match agree(h.store(), &candidate) {
        Ok(id) => id,
        Err(e) => {
            h.log(
                crate::shared::host::Level::Warn,
                &format!("instance id not shared ({e:?}); using {candidate}"),
            );
            candidate
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::store::MemStore;

    #[test]
    fn generated_ids_are_valid_and_distinct() {
        let a = generate(1_700_000_000_000_000, 1);
        let b = generate(1_700_000_000_000_000, 2);
        let c = generate(1_700_000_000_000_001, 1);
        assert_eq!(a.len(), 16);
        assert!(is_valid(a.as_bytes()));
        assert_ne!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn copies_agree_on_the_first_id() {
        let store = MemStore::new();
        assert_eq!(agree(&store, "first").unwrap(), "first");
        assert_eq!(agree(&store, "second").unwrap(), "first");
    }

    #[test]
    fn identity_round_trips_and_refuses_garbage() {
        let bytes = encode_identity("x-graceful-instance", "abc");
        assert_eq!(
            decode_identity(&bytes),
            Some(("x-graceful-instance".into(), "abc".into()))
        );
        for bad in [
            &b""[..],
            b"x-h",
            b"\nabc",
            b"x-h\n",
            b"x h\nabc",
            b"x-h\na b",
            b"\xff\nabc",
        ] {
            assert_eq!(decode_identity(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_malformed_stored_id_is_replaced() {
        let store = MemStore::new();
        store
            .set(crate::shared::keys::INSTANCE_ID.name, b"bad id\n", 0)
            .unwrap();
        assert_eq!(agree(&store, "fresh").unwrap(), "fresh");
        store
            .set(crate::shared::keys::INSTANCE_ID.name, b"", 0)
            .unwrap();
        assert_eq!(agree(&store, "again").unwrap(), "again");
    }
}
