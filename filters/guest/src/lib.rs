//! The guest side of the proxy-wasm ABI: glue between proxy-wasm hostcalls
//! (called from inside the filters' VM) and the core's small traits, shared by
//! the three filters. Every call here either cannot fail in the phases the
//! filters use it, or maps the failure to a value: a panic in a filter traps
//! the VM copy and fails every later request on that worker (Envoy 1.40).
//!
//! Each filter ends its streams in its stream context's `Drop`: Envoy
//! deletes the context of every stream that reached the filter (client
//! resets, local replies and upstream filters included; `on_log` never
//! reaches an upstream filter), and the SDK drops it in `proxy_on_delete`,
//! a VM entry every stream pays anyway, so ending there costs none more
//! than `on_log` or `on_done` would.

mod abi;
mod host;

use std::time::{Duration, UNIX_EPOCH};

use graceful_core::shared::store::{SharedStore, StoreError, Versioned};
use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;

pub use host::{CallAnswer, Guest};

/// Shared data of this VM id, through hostcalls.
pub struct HostStore;

impl SharedStore for HostStore {
    fn get(&self, key: &str) -> Result<Option<Versioned>, StoreError> {
        match hostcalls::get_shared_data(key) {
            Ok((None, None)) => Ok(None),
            // An empty value is what "removed" looks like; keep it distinct
            // from "never set" (its CAS still guards writes).
            Ok((value, cas)) => Ok(Some((value.unwrap_or_default(), cas.unwrap_or(0)))),
            Err(status) => Err(StoreError::Host(status as u32)),
        }
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        match hostcalls::set_shared_data(key, Some(value), (cas != 0).then_some(cas)) {
            Ok(()) => Ok(()),
            Err(Status::CasMismatch) => Err(StoreError::CasMismatch),
            Err(status) => Err(StoreError::Host(status as u32)),
        }
    }
}

/// Envoy's monotonic clock in microseconds (WASI `clock_time_get` with
/// `CLOCK_MONOTONIC`), 0 if unavailable: what every duration is measured on.
pub fn now_us() -> u64 {
    abi::monotonic_ns().map_or(0, |ns| ns / 1_000)
}

/// Envoy's wall clock in microseconds since the Unix epoch (µs is the
/// host's real resolution), 0 if unavailable: never for a duration.
pub fn wall_clock_us() -> u64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The plugin configuration bytes (empty if none).
pub fn plugin_configuration() -> Vec<u8> {
    hostcalls::get_buffer(
        proxy_wasm::types::BufferType::PluginConfiguration,
        0,
        usize::MAX,
    )
    .ok()
    .flatten()
    .unwrap_or_default()
}

/// Sets the tick period; logs if the host refuses.
pub fn set_tick_period(period: Duration) {
    if let Err(status) = hostcalls::set_tick_period(period) {
        log::error!("cannot set tick period: {status:?}");
    }
}

/// What the SDK does with a stream after a core callback: a reply sent or
/// a stream held pauses it.
pub fn action(next: graceful_core::shared::host::Action) -> proxy_wasm::types::Action {
    match next {
        graceful_core::shared::host::Action::Continue => proxy_wasm::types::Action::Continue,
        graceful_core::shared::host::Action::Stop => proxy_wasm::types::Action::Pause,
    }
}
