//! A thread that wakes a config's main-thread hook every period (the
//! native module's stand-in for a VM's tick), stopped at once when the
//! config is destroyed.
//!
//! The thread waits on a condition variable with a timeout, not in a
//! sleep: `Drop` (on Envoy's main thread, when a listener update destroys
//! the config) sets the stop flag, wakes the thread and joins it, which
//! takes as long as one scheduler commit, not up to a period
//! (`membership_refresh` may be an hour). The ABI (v0.2.0) has no timer a
//! config can arm on the main thread's dispatcher: a config scheduler
//! only runs an event committed to it, hence the thread.
//!
//! | state | event | next |
//! |---|---|---|
//! | waiting | `period` passed | commits a tick, waiting |
//! | waiting | `Drop`: stop set, notified | stopped (joined) |
//! | committing | `Drop` | stopped after the commit returns (joined) |

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::abi;

/// The config scheduler's only event.
pub const EVENT_TICK: u64 = 1;

/// The stop flag and the condition variable the thread waits on.
#[derive(Default)]
struct Stop {
    stopped: Mutex<bool>,
    wake: Condvar,
}

impl Stop {
    /// Waits up to `period` (spurious wake-ups wait on); true once stopped.
    fn wait(&self, period: Duration) -> bool {
        let guard = self.stopped.lock().unwrap_or_else(PoisonError::into_inner);
        let (guard, _) = self
            .wake
            .wait_timeout_while(guard, period, |stopped| !*stopped)
            .unwrap_or_else(PoisonError::into_inner);
        *guard
    }

    fn stop(&self) {
        *self.stopped.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.wake.notify_all();
    }
}

/// Calls `tick` every `period` on a thread of its own, until dropped.
pub struct Ticker {
    stop: Arc<Stop>,
    thread: Option<JoinHandle<()>>,
}

impl Ticker {
    pub fn start(
        name: &str,
        period: Duration,
        tick: impl Fn() + Send + 'static,
    ) -> Result<Ticker, String> {
        let stop = Arc::new(Stop::default());
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                while !stopped.wait(period) {
                    tick();
                }
            })
            .map_err(|e| format!("cannot start the {name} timer: {e}"))?;
        Ok(Ticker {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub struct Timer {
    /// Declared first: dropped (stopped and joined) before the scheduler.
    _ticker: Ticker,
    /// Deleted after the thread was joined, on the main thread.
    _scheduler: Arc<abi::ConfigScheduler>,
}

impl Timer {
    /// Commits [`EVENT_TICK`] to `envoy`'s config scheduler every `period`.
    pub fn start(envoy: &abi::Config<'_>, name: &str, period: Duration) -> Result<Timer, String> {
        let scheduler = Arc::new(envoy.scheduler());
        let committer = scheduler.clone();
        let ticker = Ticker::start(name, period, move || committer.commit(EVENT_TICK))?;
        Ok(Timer {
            _ticker: ticker,
            _scheduler: scheduler,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
    use std::time::Instant;

    #[test]
    fn a_ticker_with_an_hour_period_stops_at_once() {
        let ticks = Arc::new(AtomicU32::new(0));
        let counted = ticks.clone();
        let ticker = Ticker::start("test-hour", Duration::from_secs(3600), move || {
            counted.fetch_add(1, SeqCst);
        })
        .expect("thread");
        // Let the thread reach its wait (a drop before it does stops it too).
        std::thread::sleep(Duration::from_millis(20));
        let began = Instant::now();
        drop(ticker);
        let took = began.elapsed();
        assert!(took < Duration::from_millis(500), "drop took {took:?}");
        assert_eq!(ticks.load(SeqCst), 0);
    }

    #[test]
    fn a_ticker_ticks_every_period_until_dropped() {
        let ticks = Arc::new(AtomicU32::new(0));
        let counted = ticks.clone();
        let ticker = Ticker::start("test-ms", Duration::from_millis(5), move || {
            counted.fetch_add(1, SeqCst);
        })
        .expect("thread");
        let deadline = Instant::now() + Duration::from_secs(10);
        while ticks.load(SeqCst) < 3 {
            assert!(Instant::now() < deadline, "no three ticks in 10 s");
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(ticker);
        let after = ticks.load(SeqCst);
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(ticks.load(SeqCst), after, "a tick after the drop");
    }
}
