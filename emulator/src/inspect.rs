//! Inspection: what the filters left (headers sent upstream and downstream,
//! the response, metrics, logs) and the hostcall trace, printed when a test
//! panics.

use crate::headers::HeaderMap;
use crate::world::{Level, LogLine, Response};
use crate::{Host, StreamId, Vm};

impl Drop for Host {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Ok(w) = self.world.try_borrow() {
                eprintln!("---- proxy-wasm trace of the failed test ----");
                if w.trace.dropped > 0 {
                    eprintln!("({} earlier lines dropped)", w.trace.dropped);
                }
                for line in &w.trace.lines {
                    eprintln!("{line}");
                }
                eprintln!("---- end of trace ----");
            }
        }
    }
}

impl Host {
    /// The request headers as the filters left them (what the router would
    /// forward).
    pub fn request_headers_map(&self, s: StreamId) -> HeaderMap {
        self.world.borrow().streams[s.0]
            .request_headers
            .clone()
            .unwrap_or_default()
    }

    /// One request header as the filters left it.
    pub fn request_header(&self, s: StreamId, name: &str) -> Option<String> {
        self.request_headers_map(s).text(name)
    }

    /// True if the request went through every filter to the router.
    pub fn reached_upstream(&self, s: StreamId) -> bool {
        self.world.borrow().streams[s.0].reached_upstream
    }

    /// The response as the client gets it: headers and trailers as the
    /// filters left them, the body chunks delivered so far.
    pub fn response(&self, s: StreamId) -> Response {
        let w = self.world.borrow();
        let st = &w.streams[s.0];
        Response {
            headers: st.response_headers.clone().unwrap_or_default(),
            body: st.response_body_total.clone(),
            trailers: st.response_trailers.clone(),
        }
    }

    /// One response header as the client gets it.
    pub fn response_header(&self, s: StreamId, name: &str) -> Option<String> {
        self.response(s).header(name)
    }

    /// One response trailer as the client gets it.
    pub fn response_trailer(&self, s: StreamId, name: &str) -> Option<String> {
        self.response(s).trailer(name)
    }

    /// A metric's value by name (counters: total; gauges: current value).
    /// Panics if no VM copy defined it, so a misspelt name fails.
    pub fn metric(&self, name: &str) -> i64 {
        self.try_metric(name)
            .unwrap_or_else(|| panic!("metric {name:?} was never defined"))
    }

    /// A metric's value, None if never defined.
    pub fn try_metric(&self, name: &str) -> Option<i64> {
        self.world
            .borrow()
            .metrics
            .iter()
            .find(|m| m.name == name)
            .map(|m| m.value)
    }

    /// Sets a gauge as another filter in the process would (defining it
    /// if no VM copy has yet): e.g. graceful_drain's phase or gate, for a
    /// provider tested alone.
    pub fn set_gauge(&mut self, name: &str, value: i64) {
        let mut w = self.world.borrow_mut();
        w.note("host", format!("gauge {name} = {value}"));
        match w.metrics.iter_mut().find(|m| m.name == name) {
            Some(m) => m.value = value,
            None => w.metrics.push(crate::world::Metric {
                name: name.to_string(),
                kind: crate::world::MetricKind::Gauge,
                value,
                samples: Vec::new(),
                null: false,
            }),
        }
    }

    /// Makes `name` a null stat for VM copies that define it from now on,
    /// as Envoy does for a name its `stats_matcher` rejects: it reads 0
    /// whatever is added or set.
    pub fn reject_stats(&mut self, name: &str) {
        self.world
            .borrow_mut()
            .rejected_stats
            .push(name.to_string());
    }

    /// Every log line so far.
    pub fn logs(&self) -> Vec<LogLine> {
        self.world.borrow().logs.clone()
    }

    /// Messages logged at exactly `level`.
    pub fn logs_at(&self, level: Level) -> Vec<String> {
        self.world
            .borrow()
            .logs
            .iter()
            .filter(|l| l.level == level)
            .map(|l| l.message.clone())
            .collect()
    }

    /// Messages logged at `level` or above.
    pub fn logs_at_least(&self, level: Level) -> Vec<String> {
        self.world
            .borrow()
            .logs
            .iter()
            .filter(|l| l.level >= level)
            .map(|l| l.message.clone())
            .collect()
    }

    /// Messages containing `needle`, any level.
    pub fn logs_containing(&self, needle: &str) -> Vec<String> {
        self.world
            .borrow()
            .logs
            .iter()
            .filter(|l| l.message.contains(needle))
            .map(|l| l.message.clone())
            .collect()
    }

    /// The wasm operators VM copy `vm` has run since it started (wasmtime
    /// fuel): what a callback costs the guest, independent of this host's
    /// load.
    pub fn fuel_used(&self, vm: Vm) -> u64 {
        let left = self.vms[vm.0].store.get_fuel().unwrap_or(u64::MAX);
        u64::MAX - left
    }

    /// The hostcall trace so far, one line per callback or hostcall.
    pub fn trace(&self) -> String {
        let w = self.world.borrow();
        w.trace.lines.iter().cloned().collect::<Vec<_>>().join("\n")
    }
}
