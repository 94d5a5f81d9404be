//! The core's host traits ([`graceful_core::shared::host`]) over proxy-wasm
//! hostcalls: what each filter's glue hands its callbacks. `Guest` is the
//! VM copy (and, inside a stream callback, the current stream: proxy-wasm
//! hostcalls act on the context being called, or the one made effective).

use graceful_core::shared::host::{
    Attribute, CallResponse, HeaderScan, Host, HttpCall, Level, LocalReply, Map, Stream,
};
use graceful_core::shared::keys::Owner;
use graceful_core::shared::metrics::{Kind, Metric};
use graceful_core::shared::store::SharedStore;
use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType, MetricType};

use crate::{abi, now_us, wall_clock_us, HostStore};

/// One VM copy's host: the Envoy stats its filter defined, by metric.
pub struct Guest {
    ids: [Option<u32>; Metric::ALL.len()],
}

impl Guest {
    /// Defines the metrics `filter` writes and reads. Defining one name in
    /// every VM copy yields one Envoy stat: the values are process-wide.
    pub fn define(filter: Owner) -> Guest {
        let mut ids = [None; Metric::ALL.len()];
        for m in Metric::defined_by(filter, true) {
            let kind = match m.kind() {
                Kind::Counter => MetricType::Counter,
                Kind::Gauge => MetricType::Gauge,
            };
            ids[m.index()] = match hostcalls::define_metric(kind, m.name()) {
                Ok(id) => Some(id),
                Err(status) => {
                    log::error!("cannot define metric {}: {status:?}", m.name());
                    None
                }
            };
        }
        Guest { ids }
    }

    fn id(&self, m: Metric) -> Option<u32> {
        self.ids[m.index()]
    }
}

fn map_type(map: Map) -> MapType {
    match map {
        Map::RequestHeaders => MapType::HttpRequestHeaders,
        Map::ResponseHeaders => MapType::HttpResponseHeaders,
        Map::ResponseTrailers => MapType::HttpResponseTrailers,
    }
}

impl Host for Guest {
    fn store(&self) -> &dyn SharedStore {
        &HostStore
    }

    fn now_us(&self) -> u64 {
        now_us()
    }

    fn wall_clock_us(&self) -> u64 {
        wall_clock_us()
    }

    fn log(&self, level: Level, line: &str) {
        match level {
            Level::Debug => log::debug!("{line}"),
            Level::Info => log::info!("{line}"),
            Level::Warn => log::warn!("{line}"),
            Level::Error => log::error!("{line}"),
        }
    }

    fn metric_add(&self, metric: Metric, delta: i64) {
        if let Some(id) = self.id(metric) {
            let _ = hostcalls::increment_metric(id, delta);
        }
    }

    fn metric_set(&self, metric: Metric, value: u64) {
        if let Some(id) = self.id(metric) {
            let _ = hostcalls::record_metric(id, value);
        }
    }

    /// One of the cheapest hostcalls: an atomic load in Envoy, no guest
    /// allocation.
    fn metric_get(&self, metric: Metric) -> Option<u64> {
        hostcalls::get_metric(self.id(metric)?).ok()
    }

    /// A stat Envoy's `stats_matcher` rejects is a null stat that reads 0
    /// whatever is added. A gauge is probed with +1, a read and −1 (the
    /// probe is invisible to every reader but one that reads in between); a
    /// counter with +1 (it cannot go back: its readers must take a bump).
    fn metric_is_kept(&self, metric: Metric) -> bool {
        if self.id(metric).is_none() {
            return false;
        }
        self.metric_add(metric, 1);
        let seen = self.metric_get(metric);
        if metric.kind() == Kind::Gauge {
            self.metric_add(metric, -1);
        }
        seen.is_some_and(|v| v >= 1)
    }

    /// The SDK's call registers the callout for the context being called
    /// (the root, in a tick or a call's answer), so the answer comes to it.
    fn dispatch(&self, call: &HttpCall) -> Result<u32, String> {
        let body = (!call.body.is_empty()).then_some(call.body);
        let headers = call.headers.to_vec();
        hostcalls::dispatch_http_call(call.cluster, headers, body, vec![], call.timeout)
            .map_err(|status| format!("{status:?}"))
    }
}

impl Stream for Guest {
    fn header(&self, map: Map, name: &str) -> Option<Vec<u8>> {
        hostcalls::get_map_value_bytes(map_type(map), name)
            .ok()
            .flatten()
    }

    fn scan_headers(&self, map: Map, scan: &mut HeaderScan) -> bool {
        let Some(bytes) = abi::header_map_bytes(map_type(map)) else {
            return false;
        };
        scan(&mut abi::map_pairs(&bytes));
        true
    }

    fn set_header(&self, map: Map, name: &str, value: &str) -> bool {
        abi::replace_header(map_type(map), name, value)
    }

    fn remove_header(&self, map: Map, name: &str) -> bool {
        abi::remove_header(map_type(map), name)
    }

    /// Envoy derives a gRPC request's trailers-only `grpc-status` from the
    /// HTTP status when none is given; the details are not carried.
    fn send_reply(&self, reply: &LocalReply) -> bool {
        abi::send_reply(reply.status, reply.headers, reply.body, reply.grpc_status)
    }

    fn attribute(&self, attribute: Attribute) -> Option<Vec<u8>> {
        let path: &[&str] = match attribute {
            Attribute::SourceAddress => &["source", "address"],
            Attribute::DestinationAddress => &["destination", "address"],
            Attribute::UpstreamAddress => &["upstream", "address"],
            // The route's, readable in both phases.
            Attribute::ClusterName => &["xds", "cluster_name"],
            Attribute::UpstreamTransportFailureReason => &["upstream", "transport_failure_reason"],
            Attribute::UpstreamLocalAddress => &["upstream", "local_address"],
            Attribute::UpstreamPoolAnswered => &["upstream", "cx_pool_ready_duration"],
        };
        hostcalls::get_property(path.to_vec()).ok().flatten()
    }

    fn response_flags(&self) -> Option<u64> {
        let bytes = hostcalls::get_property(vec!["response", "flags"])
            .ok()
            .flatten()?;
        graceful_core::shared::store::read_u64(&bytes)
    }
}

/// The answer to an HTTP call, in `on_http_call_response`.
pub struct CallAnswer {
    pub body_size: usize,
}

impl CallResponse for CallAnswer {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        hostcalls::get_map_value_bytes(MapType::HttpCallResponseHeaders, name)
            .ok()
            .flatten()
    }

    fn body(&self, max: usize) -> Vec<u8> {
        hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, self.body_size.min(max))
            .ok()
            .flatten()
            .unwrap_or_default()
    }
}
