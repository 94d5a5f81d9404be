//! A host for unit tests: shared data in memory, metrics in a table, the
//! clock set by the test, and a record of what the filter asked (header
//! writes, local replies, calls, log lines). One `MockHost` is one stream
//! and its VM copy at once; tests make another for another stream.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::time::Duration;

use crate::shared::host::{
    Attribute, CallResponse, HeaderScan, Host, HttpCall, Level, LocalReply, Map, Stream,
};
use crate::shared::metrics::Metric;
use crate::shared::store::{MemStore, SharedStore, StoreError, Versioned};

/// A local reply as sent, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentReply {
    pub status: u32,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub grpc_status: Option<i32>,
    pub details: &'static str,
}

impl SentReply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A call as dispatched, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentCall {
    pub token: u32,
    pub cluster: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub timeout: Duration,
}

impl SentCall {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Shared data that refuses writes to some keys.
#[derive(Default)]
pub struct MockStore {
    inner: MemStore,
    refused: RefCell<Vec<String>>,
}

impl SharedStore for MockStore {
    fn get(&self, key: &str) -> Result<Option<Versioned>, StoreError> {
        self.inner.get(key)
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        if self.refused.borrow().iter().any(|k| k == key) {
            return Err(StoreError::Host(1));
        }
        self.inner.set(key, value, cas)
    }
}

#[derive(Default)]
pub struct MockHost {
    store: MockStore,
    /// The monotonic clock (`now_us`).
    now: Cell<u64>,
    /// The wall clock (`wall_clock_us`): fixed, apart from the monotonic one.
    wall_clock: Cell<u64>,
    metrics: RefCell<HashMap<Metric, i64>>,
    dropped: RefCell<Vec<Metric>>,
    logs: RefCell<Vec<(Level, String)>>,
    maps: RefCell<HashMap<Map, Vec<(String, String)>>>,
    attributes: RefCell<HashMap<Attribute, Vec<u8>>>,
    flags: Cell<Option<u64>>,
    replies: RefCell<Vec<SentReply>>,
    refuse_replies: Cell<bool>,
    calls: RefCell<Vec<SentCall>>,
    refuse_calls: Cell<bool>,
    next_token: Cell<u32>,
}

impl MockHost {
    pub fn new() -> MockHost {
        let h = MockHost::default();
        h.now.set(1_700_000_000_000_000);
        // 2026-01-01T00:00:00Z.
        h.wall_clock.set(1_767_225_600_000_000);
        h
    }

    pub fn set_now(&self, now_us: u64) {
        self.now.set(now_us);
    }

    pub fn advance(&self, by: Duration) {
        let us = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        self.now.set(self.now.get().saturating_add(us));
    }

    pub fn metric(&self, m: Metric) -> u64 {
        u64::try_from(self.metrics.borrow().get(&m).copied().unwrap_or(0)).unwrap_or(0)
    }

    /// Envoy's stats_matcher drops `m`: it reads 0 whatever is added.
    pub fn drop_metric(&self, m: Metric) {
        self.dropped.borrow_mut().push(m);
    }

    pub fn refuse_writes_to(&self, key: &str) {
        self.store.refused.borrow_mut().push(key.to_string());
    }

    pub fn logs_containing(&self, text: &str) -> Vec<(Level, String)> {
        self.logs
            .borrow()
            .iter()
            .filter(|(_, l)| l.contains(text))
            .cloned()
            .collect()
    }

    pub fn logs(&self) -> Vec<(Level, String)> {
        self.logs.borrow().clone()
    }

    pub fn set_request_header(&self, name: &str, value: &str) {
        self.set_header(Map::RequestHeaders, name, value);
    }

    /// Replaces a whole map (the order a response's headers arrive in).
    pub fn set_map(&self, map: Map, pairs: &[(&str, &str)]) {
        let pairs = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.maps.borrow_mut().insert(map, pairs);
    }

    pub fn header_text(&self, map: Map, name: &str) -> Option<String> {
        self.header(map, name)
            .map(|v| String::from_utf8_lossy(&v).into_owned())
    }

    pub fn set_attribute(&self, a: Attribute, value: &str) {
        self.attributes
            .borrow_mut()
            .insert(a, value.as_bytes().to_vec());
    }

    pub fn set_response_flags(&self, flags: u64) {
        self.flags.set(Some(flags));
    }

    pub fn replies(&self) -> Vec<SentReply> {
        self.replies.borrow().clone()
    }

    pub fn take_replies(&self) -> Vec<SentReply> {
        std::mem::take(&mut self.replies.borrow_mut())
    }

    pub fn refuse_replies(&self) {
        self.refuse_replies.set(true);
    }

    pub fn calls(&self) -> Vec<SentCall> {
        self.calls.borrow().clone()
    }

    pub fn take_calls(&self) -> Vec<SentCall> {
        std::mem::take(&mut self.calls.borrow_mut())
    }

    pub fn refuse_calls(&self) {
        self.refuse_calls.set(true);
    }
}

impl Host for MockHost {
    fn store(&self) -> &dyn SharedStore {
        &self.store
    }

    fn now_us(&self) -> u64 {
        self.now.get()
    }

    fn wall_clock_us(&self) -> u64 {
        self.wall_clock.get()
    }

    fn log(&self, level: Level, line: &str) {
        self.logs.borrow_mut().push((level, line.to_string()));
    }

    fn metric_add(&self, metric: Metric, delta: i64) {
        if self.dropped.borrow().contains(&metric) {
            return;
        }
        *self.metrics.borrow_mut().entry(metric).or_default() += delta;
    }

    fn metric_set(&self, metric: Metric, value: u64) {
        if self.dropped.borrow().contains(&metric) {
            return;
        }
        let v = i64::try_from(value).unwrap_or(i64::MAX);
        self.metrics.borrow_mut().insert(metric, v);
    }

    fn metric_get(&self, metric: Metric) -> Option<u64> {
        Some(self.metric(metric))
    }

    fn metric_is_kept(&self, metric: Metric) -> bool {
        !self.dropped.borrow().contains(&metric)
    }

    fn dispatch(&self, call: &HttpCall) -> Result<u32, String> {
        if self.refuse_calls.get() {
            return Err("BadArgument".into());
        }
        let token = self.next_token.get() + 1;
        self.next_token.set(token);
        self.calls.borrow_mut().push(SentCall {
            token,
            cluster: call.cluster.to_string(),
            headers: call
                .headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: call.body.to_vec(),
            timeout: call.timeout,
        });
        Ok(token)
    }
}

impl Stream for MockHost {
    fn header(&self, map: Map, name: &str) -> Option<Vec<u8>> {
        let maps = self.maps.borrow();
        let (_, v) = maps
            .get(&map)?
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))?;
        Some(v.as_bytes().to_vec())
    }

    fn scan_headers(&self, map: Map, scan: &mut HeaderScan) -> bool {
        let maps = self.maps.borrow();
        let Some(pairs) = maps.get(&map) else {
            return false;
        };
        scan(&mut pairs.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes())));
        true
    }

    fn set_header(&self, map: Map, name: &str, value: &str) -> bool {
        let mut maps = self.maps.borrow_mut();
        let pairs = maps.entry(map).or_default();
        pairs.retain(|(k, _)| !k.eq_ignore_ascii_case(name));
        pairs.push((name.to_string(), value.to_string()));
        true
    }

    fn remove_header(&self, map: Map, name: &str) -> bool {
        if let Some(pairs) = self.maps.borrow_mut().get_mut(&map) {
            pairs.retain(|(k, _)| !k.eq_ignore_ascii_case(name));
        }
        true
    }

    fn send_reply(&self, reply: &LocalReply) -> bool {
        if self.refuse_replies.get() {
            return false;
        }
        self.replies.borrow_mut().push(SentReply {
            status: reply.status,
            headers: reply
                .headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: reply.body.to_vec(),
            grpc_status: reply.grpc_status,
            details: reply.details,
        });
        true
    }

    fn attribute(&self, attribute: Attribute) -> Option<Vec<u8>> {
        self.attributes.borrow().get(&attribute).cloned()
    }

    fn response_flags(&self) -> Option<u64> {
        self.flags.get()
    }
}

/// A call's answer for tests.
pub struct MockAnswer {
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl MockAnswer {
    /// An answer with `:status` and a body.
    pub fn status(status: &str, body: &str) -> MockAnswer {
        MockAnswer {
            headers: vec![(":status".into(), status.into())],
            body: body.as_bytes().to_vec(),
        }
    }

    /// A call that failed: no headers at all.
    pub fn failed() -> MockAnswer {
        MockAnswer {
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    pub fn with_header(mut self, name: &str, value: &str) -> MockAnswer {
        self.headers.push((name.into(), value.into()));
        self
    }
}

impl CallResponse for MockAnswer {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_bytes().to_vec())
    }

    fn body(&self, max: usize) -> Vec<u8> {
        self.body[..self.body.len().min(max)].to_vec()
    }
}
