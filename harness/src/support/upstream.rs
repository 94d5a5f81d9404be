//! The tests' upstream is the demo's app (`examples/demo-app`): see its docs
//! for the paths it answers. In process as [`Upstream`], or as its own
//! process from [`demo_app_binary`].

use std::path::PathBuf;

use crate::support::envoy::repo_root;

pub use demo_app::{App as Upstream, AppConfig, Counters};

/// The demo app binary: `$DEMO_APP`, else the workspace's debug, else release build.
pub fn demo_app_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("DEMO_APP") {
        return PathBuf::from(p);
    }
    let debug = repo_root().join("target/debug/demo-app");
    if debug.exists() {
        return debug;
    }
    repo_root().join("target/release/demo-app")
}

/// `graceful-hook`, the examples' preStop hook and readiness probe:
/// `GRACEFUL_HOOK`, else the debug build (`cargo build -p graceful-hook`).
pub fn hook_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("GRACEFUL_HOOK") {
        return PathBuf::from(p);
    }
    repo_root().join("target/debug/graceful-hook")
}
