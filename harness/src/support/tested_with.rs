//! The "Tested with graceful-wasm <version>" line of an example's README,
//! written by the suite that verifies the example once it has passed: the
//! line then names the workspace version the suite ran on (`0.3.0-dev` on
//! `main`, the release's number on a release commit). `make lint`
//! (tools/check_tested_with.py) fails while a line names another version,
//! so a version bump is followed by a run of the suites before a release.

use std::path::Path;

use crate::support::envoy::repo_root;

/// The line's opening words; the version follows, up to the next space.
pub const PREFIX: &str = "Tested with graceful-wasm ";

/// The workspace version (every crate inherits it).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// `text` with its Tested-with line naming `version`, or None if it has no
/// such line.
pub fn rewrite(text: &str, version: &str) -> Option<String> {
    let start = text.find(PREFIX)? + PREFIX.len();
    let end = text[start..]
        .find(char::is_whitespace)
        .map_or(text.len(), |n| start + n);
    Some(format!("{}{version}{}", &text[..start], &text[end..]))
}

/// Records that the example whose README is `readme` (relative to the
/// repository) passed its suite on this version. Panics if the README has
/// no Tested-with line: the suite would have nothing to say it on.
pub fn record(readme: &str) {
    let path = repo_root().join(readme);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", Path::new(readme).display()));
    let Some(new) = rewrite(&text, VERSION) else {
        panic!("{readme}: no \"{PREFIX}<version>\" line for the suite to write");
    };
    if new != text {
        std::fs::write(&path, new).unwrap_or_else(|e| panic!("{readme}: {e}"));
        eprintln!("{readme}: Tested with graceful-wasm {VERSION} (written by this suite)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_rewrites_the_version_alone() {
        let text = "# X\n\nTested with graceful-wasm 0.2.0 on Envoy 1.40.0 (`a.rs`).\n";
        assert_eq!(
            rewrite(text, "0.3.0-dev").as_deref(),
            Some("# X\n\nTested with graceful-wasm 0.3.0-dev on Envoy 1.40.0 (`a.rs`).\n")
        );
        assert_eq!(rewrite("no line\n", "0.3.0"), None);
    }
}
