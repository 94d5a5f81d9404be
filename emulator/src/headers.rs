//! Header maps as Envoy keeps them, and the proxy-wasm pairs encoding.

use std::fmt;

/// A header (or trailer) map the way Envoy holds one: an ordered list of
/// entries, names lower-cased, duplicates kept as separate entries, values
/// raw bytes (HTTP allows obs-text, so values need not be UTF-8).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct HeaderMap {
    entries: Vec<(Vec<u8>, Vec<u8>)>,
}

impl HeaderMap {
    /// A map from `(name, value)` pairs; names are lower-cased like Envoy's
    /// codecs do, order and duplicates are kept.
    pub fn from_pairs<K: AsRef<[u8]>, V: AsRef<[u8]>>(pairs: &[(K, V)]) -> HeaderMap {
        HeaderMap {
            entries: pairs
                .iter()
                .map(|(k, v)| (k.as_ref().to_ascii_lowercase(), v.as_ref().to_vec()))
                .collect(),
        }
    }

    /// The first value of `name`, as Envoy's `get_header_map_value` returns
    /// it (later duplicates are not visible through that call).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        let name = name.as_bytes().to_ascii_lowercase();
        self.entries
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_slice())
    }

    /// The first value of `name` as text (lossy for non-UTF-8 bytes).
    pub fn text(&self, name: &str) -> Option<String> {
        self.get(name)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }

    /// Every value of `name`, in order.
    pub fn get_all(&self, name: &str) -> Vec<&[u8]> {
        let name = name.as_bytes().to_ascii_lowercase();
        self.entries
            .iter()
            .filter(|(k, _)| *k == name)
            .map(|(_, v)| v.as_slice())
            .collect()
    }

    /// True if `name` is present.
    pub fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Number of entries (duplicates counted).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when the map has no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// All entries, in order.
    pub fn entries(&self) -> &[(Vec<u8>, Vec<u8>)] {
        &self.entries
    }

    /// Envoy `addCopy`: appends an entry.
    pub(crate) fn add(&mut self, name: &[u8], value: &[u8]) {
        self.entries
            .push((name.to_ascii_lowercase(), value.to_vec()));
    }

    /// Envoy `setCopy`: replaces the value of the first entry with this
    /// name (later duplicates stay), or appends one.
    pub(crate) fn replace(&mut self, name: &[u8], value: &[u8]) {
        let name = name.to_ascii_lowercase();
        match self.entries.iter_mut().find(|(k, _)| *k == name) {
            Some(entry) => entry.1 = value.to_vec(),
            None => self.entries.push((name, value.to_vec())),
        }
    }

    /// Envoy `remove`: drops every entry with this name.
    pub(crate) fn remove(&mut self, name: &[u8]) {
        let name = name.to_ascii_lowercase();
        self.entries.retain(|(k, _)| *k != name);
    }

    /// The value of `name` in [`get`](Self::get) order, as bytes owned.
    pub(crate) fn first_owned(&self, name: &[u8]) -> Option<Vec<u8>> {
        let name = name.to_ascii_lowercase();
        self.entries
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
    }

    /// The map in the proxy-wasm pairs encoding.
    pub(crate) fn encode(&self) -> Vec<u8> {
        encode(&self.entries)
    }
}

impl fmt::Debug for HeaderMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|(k, v)| {
                format!(
                    "{}: {}",
                    String::from_utf8_lossy(k),
                    String::from_utf8_lossy(v)
                )
            }))
            .finish()
    }
}

/// The proxy-wasm pairs encoding: u32 count, then u32 key and value
/// lengths for each pair, then each key and value followed by a NUL.
pub(crate) fn encode(pairs: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
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
        out.extend_from_slice(k);
        out.push(0);
        out.extend_from_slice(v);
        out.push(0);
    }
    out
}

/// Decodes the pairs encoding; None if the bytes do not hold exactly that
/// (the host then answers BadArgument, as a malformed argument deserves).
pub(crate) fn decode(bytes: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    let u32_at = |at: usize| -> Option<usize> {
        let b = bytes.get(at..at.checked_add(4)?)?;
        Some(u32::from_le_bytes(b.try_into().ok()?) as usize)
    };
    let count = u32_at(0)?;
    let mut sizes = Vec::with_capacity(count.min(bytes.len() / 8));
    for i in 0..count {
        let at = 4usize.checked_add(i.checked_mul(8)?)?;
        sizes.push((u32_at(at)?, u32_at(at + 4)?));
    }
    let mut at = 4usize.checked_add(count.checked_mul(8)?)?;
    let mut pairs = Vec::with_capacity(sizes.len());
    for (ks, vs) in sizes {
        let key = bytes.get(at..at.checked_add(ks)?)?.to_vec();
        at += ks;
        if bytes.get(at) != Some(&0) {
            return None;
        }
        at += 1;
        let value = bytes.get(at..at.checked_add(vs)?)?.to_vec();
        at += vs;
        if bytes.get(at) != Some(&0) {
            return None;
        }
        at += 1;
        pairs.push((key, value));
    }
    (at == bytes.len()).then_some(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_round_trip() {
        let pairs = vec![
            (b"a".to_vec(), b"bc".to_vec()),
            (b"".to_vec(), b"d".to_vec()),
            (b"\xff".to_vec(), Vec::new()),
        ];
        assert_eq!(decode(&encode(&pairs)), Some(pairs));
        assert_eq!(decode(&[]), Some(vec![]));
        assert_eq!(decode(&[1, 0, 0, 0]), None);
        let mut bad = encode(&[(b"k".to_vec(), b"v".to_vec())]);
        bad.push(0);
        assert_eq!(decode(&bad), None);
    }

    #[test]
    fn header_map_follows_envoy_semantics() {
        let mut m = HeaderMap::from_pairs(&[("X-A", "1"), ("x-a", "2")]);
        assert_eq!(m.get("x-a"), Some(&b"1"[..]), "first value wins");
        m.replace(b"X-A", b"3");
        assert_eq!(m.get_all("x-a"), vec![&b"3"[..], &b"2"[..]]);
        m.remove(b"x-a");
        assert!(m.is_empty());
    }
}
