//! Logging, the virtual clocks' time and the tick period.

use crate::world::{show, Level, LogLine};

use super::memory::{read, write, write_u32};
use super::{status, with_world, Hc, BAD_ARGUMENT, C};

pub(super) fn proxy_log(c: &mut C, level: i32, ptr: i32, len: i32) -> Hc {
    let message = read(c, ptr, len)?;
    let Some(level) = Level::from_abi(level) else {
        return Err(status(BAD_ARGUMENT, format!("log level {level}")));
    };
    let message = String::from_utf8_lossy(&message).into_owned();
    let detail = format!("{level:?}, {}", show(message.as_bytes()));
    let vm = c.data().name.clone();
    with_world(c, |w, _| w.logs.push(LogLine { vm, level, message }));
    Ok(detail)
}

pub(super) fn proxy_get_log_level(c: &mut C, ptr: i32) -> Hc {
    // Trace: the host takes every line; the SDK filters by its own level.
    write_u32(c, ptr, 0)?;
    Ok(String::new())
}

/// The wall clock (Envoy's `systemTime()`).
pub(super) fn proxy_get_current_time_nanoseconds(c: &mut C, ptr: i32) -> Hc {
    let now = with_world(c, |w, _| w.wall_ns());
    write(c, ptr as u32, &now.to_le_bytes())?;
    Ok(String::new())
}

pub(super) fn proxy_set_tick_period_milliseconds(c: &mut C, ms: i32) -> Hc {
    with_world(c, |w, vm| {
        let now = w.now_ns;
        let state = &mut w.vms[vm];
        state.tick_period_ms = ms as u32;
        // Envoy (re)arms the timer: the first tick is one period from now.
        state.next_tick_ns = (ms != 0).then(|| now + u64::from(ms as u32) * 1_000_000);
    });
    Ok(format!("{}ms", ms as u32))
}
