//! The version an artifact shows: the workspace version, and on a
//! development version (`0.3.0-dev`, what `main` carries between releases)
//! the commit it was built from as build metadata, `0.3.0-dev+<commit>`.
//! The Makefile passes the commit as `GRACEFUL_COMMIT`; a build without it
//! (plain `cargo build`, no git) says `+unknown`. A release's version
//! (`0.3.0`) is shown as it is: its tag names the commit.
//!
//! [`build_version!`](crate::build_version) reads both at the calling
//! crate's compile time, so only the crates that show a version rebuild
//! when the commit changes, not this one.

/// `package` (a crate's `CARGO_PKG_VERSION`) with `+commit` on a
/// development version.
pub fn compose(package: &str, commit: Option<&str>) -> String {
    if is_development(package) {
        let commit = commit
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .unwrap_or("unknown");
        format!("{package}+{commit}")
    } else {
        package.to_string()
    }
}

/// Whether a version is a development one: `dev` among its pre-release
/// identifiers (tools/release.py's rule).
pub fn is_development(version: &str) -> bool {
    let version = version.split('+').next().unwrap_or(version);
    version
        .split_once('-')
        .is_some_and(|(_, pre)| pre.split('.').any(|id| id.starts_with("dev")))
}

/// The calling crate's version as its artifact shows it (see the module).
#[macro_export]
macro_rules! build_version {
    () => {
        $crate::version::compose(env!("CARGO_PKG_VERSION"), option_env!("GRACEFUL_COMMIT"))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_development_version_shows_its_commit_and_a_release_its_number() {
        assert_eq!(
            compose("0.3.0-dev", Some("8ab842c0ffee")),
            "0.3.0-dev+8ab842c0ffee"
        );
        assert_eq!(compose("0.3.0-dev", None), "0.3.0-dev+unknown");
        assert_eq!(compose("0.3.0-dev.2", Some(" ")), "0.3.0-dev.2+unknown");
        assert_eq!(compose("0.3.0", Some("8ab842c0ffee")), "0.3.0");
        assert_eq!(compose("0.3.0-rc.1", Some("8ab842c0ffee")), "0.3.0-rc.1");
        assert!(!is_development("0.3.0") && is_development("0.3.0-dev"));
    }
}
