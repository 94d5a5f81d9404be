//! The virtual clocks: nothing sleeps. [`Host::advance`] moves time and
//! fires, in time order, every tick that falls due (in every VM copy, as in
//! Envoy) and every HTTP-call timeout; a VM copy's ticks can be held or
//! fired by hand. Ticks and timeouts are due on the monotonic clock, as
//! Envoy's timers are; [`Host::step_wall_clock`] moves the wall clock alone.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::vm::ROOT;
use crate::world::{CallState, Callback};
use crate::{must, Host, Vm};

/// 2026-01-01T00:00:00Z: a realistic wall clock.
pub(crate) const EPOCH_NS: u64 = 1_767_225_600_000_000_000;

/// The monotonic clock at the start: Envoy's counts from boot, and a
/// sidecar may start seconds after it (a filter that took an early time
/// for "never" would show).
pub(crate) const MONOTONIC_START_NS: u64 = 10_000_000_000;

/// A step of the wall clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WallStep {
    Forward(Duration),
    Back(Duration),
}

impl Host {
    /// The virtual wall clock.
    pub fn now(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(self.world.borrow().wall_ns())
    }

    /// The virtual monotonic clock in µs, as the filters read it for every
    /// time they keep.
    pub fn now_us(&self) -> u64 {
        self.world.borrow().now_ns / 1_000
    }

    /// Steps the wall clock alone, as NTP or an operator does: no tick or
    /// timeout falls due, the monotonic clock does not move.
    pub fn step_wall_clock(&mut self, step: WallStep) {
        let (sign, by, label) = match step {
            WallStep::Forward(d) => (1, d, "forward"),
            WallStep::Back(d) => (-1, d, "back"),
        };
        let ns = i128::try_from(by.as_nanos()).unwrap_or(i128::MAX);
        let mut w = self.world.borrow_mut();
        w.wall_step_ns = w.wall_step_ns.saturating_add(sign * ns);
        w.note("host", format!("wall clock stepped {label} by {by:?}"));
    }

    /// Virtual time since the host was created.
    pub fn elapsed(&self) -> Duration {
        self.world.borrow().elapsed()
    }

    /// Moves the clock forward by `d`, firing on the way, in time order,
    /// every due tick of every VM copy (copies in start order) and every
    /// HTTP call timeout (before ticks of the same instant).
    pub fn advance(&mut self, d: Duration) {
        let target = self.world.borrow().now_ns + u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        must(self.run_until(target));
    }

    /// Moves the clock to `elapsed` since the host was created (see
    /// [`advance`](Self::advance)); panics if that is in the past.
    pub fn advance_to(&mut self, elapsed: Duration) {
        let now = self.elapsed();
        assert!(
            elapsed >= now,
            "advance_to({elapsed:?}) but it is already {now:?}"
        );
        self.advance(elapsed - now);
    }

    pub(crate) fn run_until(&mut self, target: u64) -> Result<(), String> {
        loop {
            enum Next {
                Timeout(usize),
                Tick(usize),
            }
            let next = {
                let w = self.world.borrow();
                let mut best: Option<(u64, Next)> = None;
                for c in &w.calls {
                    if c.state != CallState::Pending || c.timeout.is_zero() {
                        continue;
                    }
                    let due = w.start_ns
                        + u64::try_from((c.sent_at + c.timeout).as_nanos()).unwrap_or(u64::MAX);
                    if best.as_ref().is_none_or(|(t, _)| due < *t) {
                        best = Some((due, Next::Timeout(c.id)));
                    }
                }
                for (i, v) in w.vms.iter().enumerate() {
                    if v.dead || v.ticks_held {
                        continue;
                    }
                    if let Some(due) = v.next_tick_ns {
                        if best.as_ref().is_none_or(|(t, _)| due < *t) {
                            best = Some((due, Next::Tick(i)));
                        }
                    }
                }
                best
            };
            let Some((due, next)) = next.filter(|(t, _)| *t <= target) else {
                break;
            };
            {
                let mut w = self.world.borrow_mut();
                w.now_ns = w.now_ns.max(due);
            }
            match next {
                Next::Timeout(id) => {
                    self.world
                        .borrow_mut()
                        .note("host", format!("http call {id} timed out"));
                    self.deliver_call(id, None)?;
                }
                Next::Tick(vm) => {
                    {
                        let mut w = self.world.borrow_mut();
                        let state = &mut w.vms[vm];
                        state.next_tick_ns =
                            Some(due + u64::from(state.tick_period_ms) * 1_000_000);
                    }
                    self.fire_tick(vm)?;
                }
            }
        }
        let mut w = self.world.borrow_mut();
        w.now_ns = w.now_ns.max(target);
        Ok(())
    }

    /// The tick period the VM copy asked for, if any.
    pub fn tick_period(&self, vm: Vm) -> Option<Duration> {
        let ms = self.world.borrow().vms[vm.0].tick_period_ms;
        (ms > 0).then(|| Duration::from_millis(u64::from(ms)))
    }

    /// Keeps `vm` from ticking on [`advance`](Self::advance) (true) or lets
    /// it tick again from now on (false).
    pub fn hold_ticks(&mut self, vm: Vm, hold: bool) {
        let mut w = self.world.borrow_mut();
        let now = w.now_ns;
        let state = &mut w.vms[vm.0];
        state.ticks_held = hold;
        if !hold && state.tick_period_ms > 0 {
            state.next_tick_ns = Some(now + u64::from(state.tick_period_ms) * 1_000_000);
        }
    }

    /// Runs `proxy_on_tick` in `vm` now (its schedule is unchanged).
    pub fn tick(&mut self, vm: Vm) {
        must(self.fire_tick(vm.0));
    }

    pub(crate) fn fire_tick(&mut self, vm: usize) -> Result<(), String> {
        if self.world.borrow().vms[vm].dead {
            return Err(format!(
                "{} is dead and cannot tick",
                self.world.borrow().vms[vm].name
            ));
        }
        let f = self.vms[vm].ex.tick.clone();
        self.call(
            vm,
            ROOT,
            Callback::Tick,
            f,
            ROOT as i32,
            format!("proxy_on_tick({ROOT})"),
        )?;
        Ok(())
    }
}
