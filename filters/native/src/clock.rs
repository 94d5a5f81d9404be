//! The module's clocks. Every duration is measured on `CLOCK_MONOTONIC`,
//! the clock Envoy's `steady_clock` reads and so the one the wasm build
//! gets from WASI `clock_time_get` (docs/design/shared-data.md): one clock for
//! the whole process and every worker thread, which a step of the wall
//! clock does not move. std's `Instant` reads it too, but its value is
//! opaque; the module keeps times as numbers in its store.

#![allow(unsafe_code)]

use std::ffi::{c_int, c_long};
use std::time::{SystemTime, UNIX_EPOCH};

#[cfg(target_os = "linux")]
#[repr(C)]
struct Timespec {
    tv_sec: c_long,
    tv_nsec: c_long,
}

#[cfg(target_os = "linux")]
extern "C" {
    fn clock_gettime(clock_id: c_int, tp: *mut Timespec) -> c_int;
}

/// Linux's `CLOCK_MONOTONIC`.
#[cfg(target_os = "linux")]
const CLOCK_MONOTONIC: c_int = 1;

/// `CLOCK_MONOTONIC` in µs (since boot), 0 if unavailable.
#[cfg(target_os = "linux")]
pub fn monotonic_us() -> u64 {
    let mut t = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: the out-pointer points at a live local of the C layout for
    // the call.
    if unsafe { clock_gettime(CLOCK_MONOTONIC, &mut t) } != 0 {
        return 0;
    }
    let secs = u64::try_from(t.tv_sec).unwrap_or(0);
    let micros = u64::try_from(t.tv_nsec / 1_000).unwrap_or(0);
    secs.saturating_mul(1_000_000).saturating_add(micros)
}

/// Elsewhere: std's monotonic `Instant` against one origin for the
/// process, which counts from one day so no reading is near 0.
#[cfg(not(target_os = "linux"))]
pub fn monotonic_us() -> u64 {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let since = ORIGIN.get_or_init(std::time::Instant::now).elapsed();
    u64::try_from(since.as_micros())
        .unwrap_or(u64::MAX)
        .saturating_add(86_400_000_000)
}

/// The wall clock in µs since the Unix epoch, 0 if before it.
pub fn wall_clock_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_monotonic_clock_moves_forward_and_is_not_the_wall_clock() {
        let a = monotonic_us();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = monotonic_us();
        assert!(a > 0 && b >= a + 2_000, "{a} then {b}");
        // Since boot, not since 1970.
        assert!(wall_clock_us() > b.saturating_add(1_000_000_000_000));
    }

    #[test]
    fn every_thread_reads_one_clock() {
        let before = monotonic_us();
        let other = std::thread::spawn(monotonic_us).join().unwrap_or(0);
        let after = monotonic_us();
        assert!(
            before <= other && other <= after,
            "{before} {other} {after}"
        );
    }
}
