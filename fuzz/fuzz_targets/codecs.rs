//! Every shared-data decoder on arbitrary bytes (the first byte picks
//! which): never a panic, and a decoder accepts only what its encoder
//! writes, so decoding then encoding gives back the same bytes.
#![no_main]

use graceful_core::consumer::steering::{ClusterSet, Membership, MAX_CLUSTERS};
use graceful_core::consumer::tombstone::Tombstones;
use graceful_core::drain::record::InstanceRecord;
use graceful_core::shared::instance::{decode_identity, encode_identity, is_valid};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    match which % 6 {
        0 | 1 => {
            // The last 16 bytes held counters an older build wrote:
            // ignored when read, written as zero.
            if let Some(r) = InstanceRecord::decode(bytes) {
                assert_eq!(&r.encode()[..24], &bytes[..24]);
                assert_eq!(&r.encode()[24..], &[0u8; 16][..]);
            }
        }
        2 => {
            if let Some(t) = Tombstones::decode(bytes) {
                assert_eq!(t.encode(), bytes);
            }
        }
        3 => {
            if let Some(m) = Membership::decode(bytes) {
                let clusters = usize::from(u16::from_le_bytes([bytes[1], bytes[2]]));
                let again = m.encode();
                // Decoding allows more clusters than encode writes.
                if clusters <= MAX_CLUSTERS && bytes.len() < 2048 {
                    assert_eq!(again, bytes);
                }
                assert_eq!(Membership::decode(&again).map(|m| m.encode()), Some(again));
            }
        }
        4 => {
            if let Some(s) = ClusterSet::decode(bytes) {
                assert_eq!(s.encode(), bytes);
            }
        }
        _ => {
            if let Some((header, id)) = decode_identity(bytes) {
                assert!(is_valid(id.as_bytes()));
                assert_eq!(encode_identity(&header, &id), bytes);
            }
        }
    }
});
