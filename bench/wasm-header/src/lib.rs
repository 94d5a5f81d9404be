//! `make bench` only: the floor. A Rust proxy-wasm filter that adds one
//! response header, the same job as the bench's Lua filter. Whatever a set
//! of these costs against no filter is what Envoy's wasm host charges any
//! filter for entering the VM on each stream, before the filter does work.
//!
//! `make bench-prices` builds it again with `FLOOR_PRICE` set to one kind
//! of call, which its response callback then makes [`CALLS`] times more:
//! counted under callgrind against the floor, the difference is what Envoy
//! charges for that call. Unset (every other build), the floor does nothing
//! else: the match below folds away.

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, MapType, MetricType};

/// The call `make bench-prices` prices in this build, if any.
const PRICE: Option<&str> = option_env!("FLOOR_PRICE");
/// How many more calls a priced build makes per response: enough to stand
/// clear of a run's spread (about 1,000 instructions).
pub const CALLS: usize = 10;

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(HeaderRoot { gauge: 0 }) });
}}

struct HeaderRoot {
    /// A gauge of its own, for the metric prices.
    gauge: u32,
}

impl Context for HeaderRoot {}

impl RootContext for HeaderRoot {
    fn on_vm_start(&mut self, _: usize) -> bool {
        if PRICE.is_some() {
            self.gauge = hostcalls::define_metric(MetricType::Gauge, "bench_price").unwrap_or(0);
        }
        true
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(AddHeader { gauge: self.gauge }))
    }
}

struct AddHeader {
    gauge: u32,
}

impl Context for AddHeader {}

impl HttpContext for AddHeader {
    /// Exported only by the `entry` build (tools/strip_exports.py removes
    /// it from every other): the price of one VM entry that does nothing.
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _: usize, _: bool) -> Action {
        if let Some(price) = PRICE {
            // Summed into a header that is never set, so no call is
            // optimised away.
            let mut seen = 0usize;
            for _ in 0..CALLS {
                seen = seen.wrapping_add(self.priced_call(price));
            }
            if seen == usize::MAX {
                self.add_http_response_header("x-never", "");
            }
        }
        self.add_http_response_header("x-wasm", "true");
        Action::Continue
    }
}

impl AddHeader {
    fn priced_call(&self, price: &str) -> usize {
        let len = |v: Option<Vec<u8>>| v.map_or(0, |v| v.len());
        let map = MapType::HttpResponseHeaders;
        match price {
            "metric_add" => usize::from(hostcalls::increment_metric(self.gauge, 1).is_ok()),
            "metric_get" => hostcalls::get_metric(self.gauge).unwrap_or(0) as usize,
            "clock" => hostcalls::get_current_time()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.subsec_nanos() as usize),
            "header_absent" => len(hostcalls::get_map_value_bytes(map, "x-absent")
                .ok()
                .flatten()),
            "header_present" => len(hostcalls::get_map_value_bytes(map, "content-length")
                .ok()
                .flatten()),
            "header_map" => hostcalls::get_map_bytes(map).map_or(0, |m| m.len()),
            "header_replace" => {
                usize::from(hostcalls::set_map_value(map, "x-replaced", Some("abcdef")).is_ok())
            }
            "header_remove" => usize::from(hostcalls::remove_map_value(map, "x-absent").is_ok()),
            "property" => len(hostcalls::get_property(vec!["upstream", "address"])
                .ok()
                .flatten()),
            "guest_ops" => {
                // About 8 wasm operators an iteration.
                let mut x = self.gauge as u64;
                for i in 0..100u64 {
                    x = core::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
                }
                x as usize & 1
            }
            "guest_alloc" => core::hint::black_box(Vec::<u8>::with_capacity(64)).capacity(),
            _ => 0,
        }
    }
}
