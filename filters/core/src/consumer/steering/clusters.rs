//! The set of clusters the consumer has routed to.

use super::{MAX_CLUSTERS, VERSION};

/// The clusters routed to (at most [`MAX_CLUSTERS`], names of at most 255
/// bytes; past the bound new ones are not tracked and fall back to the
/// addresses that answered).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterSet {
    names: Vec<String>,
}

impl ClusterSet {
    pub fn contains(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }

    /// Adds `name`; false if it was there, too long, or the set is full.
    pub fn insert(&mut self, name: &str) -> bool {
        if name.is_empty()
            || name.len() > 255
            || self.names.len() >= MAX_CLUSTERS
            || self.contains(name)
        {
            return false;
        }
        self.names.push(name.to_string());
        true
    }

    /// Layout: version u8, then per name: u8 length + bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![VERSION];
        for n in &self.names {
            out.push(n.len() as u8);
            out.extend_from_slice(n.as_bytes());
        }
        out
    }

    /// None for anything [`ClusterSet::encode`] did not write.
    pub fn decode(bytes: &[u8]) -> Option<ClusterSet> {
        let (&version, mut rest) = bytes.split_first()?;
        if version != VERSION {
            return None;
        }
        let mut set = ClusterSet::default();
        while let Some((&len, tail)) = rest.split_first() {
            let name = std::str::from_utf8(tail.get(..usize::from(len))?).ok()?;
            if !set.insert(name) {
                return None;
            }
            rest = tail.get(usize::from(len)..)?;
        }
        Some(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_set_is_bounded_and_round_trips() {
        let mut set = ClusterSet::default();
        assert!(set.insert("svc"));
        assert!(!set.insert("svc"), "once");
        assert!(!set.insert(""), "no empty name");
        assert!(!set.insert(&"x".repeat(256)), "no overlong name");
        for i in 0..100 {
            set.insert(&format!("c{i}"));
        }
        assert_eq!(set.names().count(), MAX_CLUSTERS);
        assert_eq!(ClusterSet::decode(&set.encode()), Some(set.clone()));
        let bytes = set.encode();
        assert_eq!(ClusterSet::decode(&bytes[..bytes.len() - 1]), None);
        assert_eq!(ClusterSet::decode(&[2]), None);
        assert_eq!(
            ClusterSet::decode(&[1, 1, b'a', 1, b'a']),
            None,
            "duplicates are foreign"
        );
    }
}
