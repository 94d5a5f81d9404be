//! A child process whose output goes to a log file: killed on drop, its
//! log printed when the test that held it fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct LoggedProcess {
    pub name: String,
    pub child: Child,
    pub log: PathBuf,
}

impl LoggedProcess {
    /// Spawns `cmd` with its stdout and stderr in `dir/NAME.log`;
    /// `prepare` gets the log's path first (e.g. to hand the file to the
    /// uid the process runs as).
    pub fn spawn(
        name: &str,
        mut cmd: Command,
        dir: &Path,
        prepare: impl FnOnce(&Path),
    ) -> LoggedProcess {
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        prepare(&log);
        let err = out.try_clone().unwrap_or_else(|e| panic!("{e}"));
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        LoggedProcess {
            name: name.into(),
            child,
            log,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM (what the kubelet or Docker sends), then waits up to
    /// `grace` before a kill.
    pub fn terminate(&mut self, grace: Duration) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for LoggedProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "===== {} ({}) =====\n{}",
                self.name,
                self.log.display(),
                self.log()
            );
        }
    }
}
