//! A thread that wakes a config's main-thread hook every period (the
//! native module's stand-in for a VM's tick), stopped and joined when the
//! config is destroyed.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::abi;

/// The config scheduler's only event.
pub const EVENT_TICK: u64 = 1;

pub struct Timer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// Deleted when the timer is dropped, after the thread was joined (a
    /// field drops after `Drop::drop`), on the main thread.
    _scheduler: Arc<abi::ConfigScheduler>,
}

impl Timer {
    /// Commits [`EVENT_TICK`] to `envoy`'s config scheduler every `period`.
    pub fn start(envoy: abi::Config, name: &str, period: Duration) -> Result<Timer, String> {
        let scheduler = Arc::new(envoy.scheduler());
        let stop = Arc::new(AtomicBool::new(false));
        let (stopped, committer) = (stop.clone(), scheduler.clone());
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                while !stopped.load(SeqCst) {
                    std::thread::sleep(period);
                    committer.commit(EVENT_TICK);
                }
            })
            .map_err(|e| format!("cannot start the {name} timer: {e}"))?;
        Ok(Timer {
            stop,
            thread: Some(thread),
            _scheduler: scheduler,
        })
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
