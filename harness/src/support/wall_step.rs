//! A wall clock a test steps in one Envoy process alone, as NTP or an
//! operator does: `wall_step.c`, preloaded (`LD_PRELOAD`), moves
//! `CLOCK_REALTIME` by the step in a file the test rewrites while Envoy
//! runs; the monotonic clock is left as it is. Built with the system's `cc`
//! on first use.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use super::envoy::{repo_root, scratch_path, EnvoySpec};

/// The shim, built once per test process.
fn shim() -> &'static PathBuf {
    static SHIM: OnceLock<PathBuf> = OnceLock::new();
    SHIM.get_or_init(|| {
        let source = repo_root().join("harness/src/support/wall_step.c");
        let out = scratch_path("wall_step", "so");
        let built = Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&out)
            .arg(&source)
            .status()
            .unwrap_or_else(|e| panic!("cc (to build {}): {e}", source.display()));
        assert!(built.success(), "cc {}: {built}", source.display());
        out
    })
}

/// The step file of one Envoy process.
pub struct WallStep {
    file: File,
    path: PathBuf,
}

/// Forward (positive) or back, in ns.
fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

impl WallStep {
    /// No step yet.
    pub fn new(name: &str) -> WallStep {
        let path = scratch_path(name, "wall");
        fs::write(&path, 0_i64.to_le_bytes()).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        let file = OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("{path:?}: {e}"));
        WallStep { file, path }
    }

    /// `spec` with the shim preloaded and reading this step.
    pub fn preload(&self, spec: EnvoySpec) -> EnvoySpec {
        spec.env("LD_PRELOAD", shim().display())
            .env("WALL_STEP_FILE", self.path.display())
    }

    /// Sets the process's wall clock `d` ahead of the real one.
    pub fn ahead(&self, d: Duration) {
        self.set(nanos(d));
    }

    /// Sets the process's wall clock `d` behind the real one.
    pub fn behind(&self, d: Duration) {
        self.set(-nanos(d));
    }

    /// In place (the process maps the file: never truncated).
    fn set(&self, ns: i64) {
        self.file
            .write_all_at(&ns.to_le_bytes(), 0)
            .unwrap_or_else(|e| panic!("{:?}: {e}", self.path));
    }
}

impl Drop for WallStep {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}
