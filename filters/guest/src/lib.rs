//! The guest side of the proxy-wasm ABI: glue between proxy-wasm hostcalls
//! (called from inside the filters' VM) and the core's small traits, shared by
//! the three filters. Every call here either cannot fail in the phases the
//! filters use it, or maps the failure to a value: a panic in a filter traps
//! the VM copy and fails every later request on that worker (Envoy 1.40).

mod abi;

use std::time::{Duration, UNIX_EPOCH};

use graceful_core::store::{SharedStore, StoreError, Versioned};
use proxy_wasm::hostcalls;
use proxy_wasm::types::{MapType, MetricType, Status};

pub use abi::{add_header, header_map_bytes, map_pairs, remove_header, replace_header, send_reply};

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

/// Envoy's wall clock in microseconds since the Unix epoch (µs is the
/// host's real resolution), 0 if unavailable.
pub fn now_us() -> u64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Entropy from the host (WASI `random_get` seeds std's hasher keys).
pub fn entropy() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(now_us());
    h.finish()
}

/// A proxy-wasm metric. Defining the same name in every VM copy yields the
/// same Envoy stat, so counters and gauges are process-wide.
#[derive(Clone, Copy)]
pub struct Metric(Option<u32>);

impl Metric {
    pub fn counter(name: &str) -> Metric {
        Metric::define(MetricType::Counter, name)
    }

    pub fn gauge(name: &str) -> Metric {
        Metric::define(MetricType::Gauge, name)
    }

    fn define(kind: MetricType, name: &str) -> Metric {
        match hostcalls::define_metric(kind, name) {
            Ok(id) => Metric(Some(id)),
            Err(status) => {
                log::error!("cannot define metric {name}: {status:?}");
                Metric(None)
            }
        }
    }

    /// Adds `delta` (counters: positive only; gauges: either sign).
    pub fn add(&self, delta: i64) {
        if let Some(id) = self.0 {
            let _ = hostcalls::increment_metric(id, delta);
        }
    }

    /// Sets a gauge.
    pub fn set(&self, value: u64) {
        if let Some(id) = self.0 {
            let _ = hostcalls::record_metric(id, value);
        }
    }

    /// The current value (counters: total; gauges: value), None if the
    /// metric was never defined or the host refuses. One of the cheapest
    /// hostcalls: an atomic load in Envoy, no guest allocation.
    pub fn get(&self) -> Option<u64> {
        hostcalls::get_metric(self.0?).ok()
    }

    /// Whether Envoy keeps this stat: a stat its `stats_matcher` rejects is
    /// a null stat that reads 0 whatever is added. Probed with +1, a read
    /// and −1 (a gauge only: the probe is invisible to every reader but one
    /// that reads in between, which sees one more than there is).
    pub fn gauge_is_kept(&self) -> bool {
        if self.0.is_none() {
            return false;
        }
        self.add(1);
        let seen = self.get();
        self.add(-1);
        seen.is_some_and(|v| v >= 1)
    }
}

/// A request or response header as raw bytes; None if absent or if the map
/// is not available in this phase.
pub fn header(map: MapType, name: &str) -> Option<Vec<u8>> {
    hostcalls::get_map_value_bytes(map, name).ok().flatten()
}

/// A property (Envoy attribute) as raw bytes; None when absent, empty or
/// unavailable in this phase.
pub fn property(path: &[&str]) -> Option<Vec<u8>> {
    hostcalls::get_property(path.to_vec()).ok().flatten()
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

/// A property holding a little-endian u64 (e.g. `response.flags`).
pub fn property_u64(path: &[&str]) -> Option<u64> {
    graceful_core::store::read_u64(&property(path)?)
}

/// A header as text, if present and valid UTF-8.
pub fn header_text(map: MapType, name: &str) -> Option<String> {
    String::from_utf8(header(map, name)?).ok()
}

/// Sets the tick period; logs if the host refuses.
pub fn set_tick_period(period: Duration) {
    if let Err(status) = hostcalls::set_tick_period(period) {
        log::error!("cannot set tick period: {status:?}");
    }
}

/// [`graceful_core::gate::Stats`] over Envoy stats: the metrics a filter
/// defines at configure time (a stat it did not define reads as unknown).
#[derive(Default)]
pub struct GuestStats {
    defined: Vec<(graceful_core::gate::Stat, Metric)>,
}

impl GuestStats {
    /// Defines `stats` (gauges, except the `*_started` counters).
    pub fn define(stats: &[graceful_core::gate::Stat]) -> GuestStats {
        use graceful_core::gate::Stat;
        GuestStats {
            defined: stats
                .iter()
                .map(|&s| {
                    let metric = match s {
                        Stat::Started | Stat::OutboundStarted => Metric::counter(s.name()),
                        Stat::Inflight | Stat::Gate | Stat::OutboundInflight => {
                            Metric::gauge(s.name())
                        }
                    };
                    (s, metric)
                })
                .collect(),
        }
    }

    pub fn metric(&self, stat: graceful_core::gate::Stat) -> Option<Metric> {
        self.defined
            .iter()
            .find(|(s, _)| *s == stat)
            .map(|(_, m)| *m)
    }
}

impl graceful_core::gate::Stats for GuestStats {
    fn add(&self, stat: graceful_core::gate::Stat, delta: i64) {
        if let Some(m) = self.metric(stat) {
            m.add(delta);
        }
    }

    fn get(&self, stat: graceful_core::gate::Stat) -> Option<u64> {
        self.metric(stat)?.get()
    }
}

impl graceful_core::drain::PhaseGauge for Metric {
    fn get(&self) -> Option<u64> {
        Metric::get(self)
    }

    fn set(&self, value: u64) {
        Metric::set(self, value);
    }
}
