//! A stand-in for Envoy's side of the dynamic-module ABI, for the glue's
//! unit tests: every callback `abi.rs` declares, as an `extern "C"`
//! function over in-memory streams and configs, installed in place of
//! Envoy's ([`install`]). The tests then call the module's hooks
//! (`hooks.rs`) as Envoy would, with pointers to a [`FakeStream`] or a
//! [`FakeConfig`], and read back what the module did: headers set, local
//! replies, stats, scheduler commits and deletions, callouts, log lines.
//!
//! What it checks of the module itself: a scheduler committed or deleted
//! after its deletion is recorded in [`misuse`] (Envoy would crash).

#![allow(unsafe_code)]

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard, Once, PoisonError};

use crate::abi::{
    self, AttributeId, ConfigEnvoyPtr, ConfigSchedulerPtr, EnvoyBuffer, EnvoyHeader,
    FilterEnvoyPtr, HeaderType, LogLevel, MetricsResult, ModuleBuffer, ModuleHeader, SchedulerPtr,
};

/// A metric change as the module asked for it: (operation, id, value).
pub type StatCall = (&'static str, usize, u64);

/// A local reply the module sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    pub status: u32,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub details: String,
}

/// A header map: (name, value) pairs in order.
type HeaderList = Vec<(Vec<u8>, Vec<u8>)>;

/// One stream as the fake Envoy holds it; its address is the filter
/// pointer handed to the hooks.
#[derive(Default)]
pub struct FakeStream {
    /// By `HeaderType` (0 request headers .. 3 response trailers).
    headers: [RefCell<HeaderList>; 4],
    /// Shared by a request's listener stream and its upstream attempts, as
    /// Envoy's `StreamInfo` is.
    pub filter_state: Rc<RefCell<HashMap<Vec<u8>, Vec<u8>>>>,
    attributes: RefCell<HashMap<AttributeId, Vec<u8>>>,
    cluster: RefCell<Option<Vec<u8>>>,
    pub worker: u32,
    pub sent: RefCell<Option<Sent>>,
    pub stats: RefCell<Vec<StatCall>>,
    /// Events committed to any scheduler of this stream.
    pub commits: Arc<Mutex<Vec<u64>>>,
    pub schedulers_made: RefCell<usize>,
}

impl FakeStream {
    /// A stream of worker `worker`, with no headers yet.
    pub fn on_worker(worker: u32) -> FakeStream {
        FakeStream {
            worker,
            ..FakeStream::default()
        }
    }

    pub fn with_request(headers: &[(&str, &str)]) -> FakeStream {
        let s = FakeStream::default();
        *s.headers[usize::try_from(abi::REQUEST_HEADERS).unwrap_or(0)].borrow_mut() = headers
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect();
        s
    }

    /// An upstream attempt of this stream's request: its request headers,
    /// and the same filter state.
    pub fn attempt(&self) -> FakeStream {
        let a = FakeStream {
            filter_state: self.filter_state.clone(),
            worker: self.worker,
            ..FakeStream::default()
        };
        *a.map(abi::REQUEST_HEADERS).borrow_mut() = self.map(abi::REQUEST_HEADERS).borrow().clone();
        a
    }

    pub fn add_header(&self, map: HeaderType, name: &str, value: &str) {
        self.map(map)
            .borrow_mut()
            .push((name.as_bytes().to_vec(), value.as_bytes().to_vec()));
    }

    pub fn set_attribute(&self, id: AttributeId, value: &str) {
        self.attributes
            .borrow_mut()
            .insert(id, value.as_bytes().to_vec());
    }

    pub fn set_cluster(&self, name: &str) {
        *self.cluster.borrow_mut() = Some(name.as_bytes().to_vec());
    }

    pub fn header(&self, map: HeaderType, name: &str) -> Option<String> {
        self.map(map)
            .borrow()
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    pub fn ptr(&self) -> FilterEnvoyPtr {
        std::ptr::from_ref(self).cast_mut().cast()
    }

    fn map(&self, map: HeaderType) -> &RefCell<HeaderList> {
        &self.headers[usize::try_from(map).unwrap_or(0).min(3)]
    }
}

/// A callout the module made from a config.
#[derive(Debug, Clone)]
pub struct Callout {
    pub id: u64,
    pub cluster: String,
    pub headers: Vec<(String, String)>,
}

/// One filter config as the fake Envoy holds it; its address is the
/// config pointer.
#[derive(Default)]
pub struct FakeConfig {
    /// Defined stats, by id.
    pub defined: Mutex<Vec<String>>,
    pub stats: Mutex<Vec<StatCall>>,
    pub callouts: Mutex<Vec<Callout>>,
    /// Events committed to this config's schedulers (the timer thread's).
    pub commits: Arc<Mutex<Vec<u64>>>,
}

impl FakeConfig {
    pub fn ptr(&self) -> ConfigEnvoyPtr {
        std::ptr::from_ref(self).cast_mut().cast()
    }

    /// The id the module defined a stat under.
    pub fn id_of(&self, name: &str) -> Option<usize> {
        lock(&self.defined).iter().position(|n| n == name)
    }
}

struct FakeScheduler {
    commits: Arc<Mutex<Vec<u64>>>,
}

/// Schedulers made and not deleted, by address.
static LIVE_SCHEDULERS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);
/// What the module did that Envoy would crash on.
static MISUSE: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Each gauge's value as Envoy would hold it, by stat id, every change
/// applied in the order the module made it, from any thread (an id is the
/// config's: a test reads the gauges of its own config).
static GAUGES: Mutex<Vec<i64>> = Mutex::new(Vec::new());
static NEXT_CALLOUT: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// Log lines of the hooks run on this thread.
    static LOG: RefCell<Vec<(LogLevel, String)>> = const { RefCell::new(Vec::new()) };
}

/// The worker count the fake Envoy reports.
pub const CONCURRENCY: u32 = 2;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Applies a gauge change to Envoy's value of gauge `id`.
fn gauge_change(op: &str, id: usize, value: u64) {
    let mut gauges = lock(&GAUGES);
    if gauges.len() <= id {
        gauges.resize(id + 1, 0);
    }
    let v = i64::try_from(value).unwrap_or(i64::MAX);
    match op {
        "gauge+" => gauges[id] += v,
        "gauge-" => gauges[id] -= v,
        "gauge=" => gauges[id] = v,
        _ => {}
    }
}

/// What runs inside the next config-level gauge write, before Envoy
/// applies it (a worker's hook, as one may on another thread).
type DuringWrite = Box<dyn FnOnce() + Send>;
static DURING_NEXT_WRITE: Mutex<Option<DuringWrite>> = Mutex::new(None);

/// Runs `f` inside the next config-level gauge write (set or add), after
/// the module computed what it writes and before Envoy applies it.
pub fn during_next_config_gauge_write(f: impl FnOnce() + Send + 'static) {
    *lock(&DURING_NEXT_WRITE) = Some(Box::new(f));
}

/// The hook [`during_next_config_gauge_write`] left, if any, taken: a
/// test runs it itself when no write came.
pub fn take_during_write() -> Option<DuringWrite> {
    lock(&DURING_NEXT_WRITE).take()
}

fn config_gauge_write() {
    if let Some(f) = take_during_write() {
        f();
    }
}

/// Envoy's value of gauge `id` (see [`GAUGES`]).
pub fn gauge(id: usize) -> i64 {
    lock(&GAUGES).get(id).copied().unwrap_or(0)
}

/// Misuse recorded so far (a scheduler used after its deletion).
pub fn misuse() -> Vec<String> {
    lock(&MISUSE).clone()
}

/// Schedulers made and not deleted yet.
pub fn live_schedulers() -> usize {
    lock(&LIVE_SCHEDULERS).as_ref().map_or(0, HashSet::len)
}

/// Log lines of this thread's hooks, taken.
pub fn take_log() -> Vec<(LogLevel, String)> {
    LOG.with(|l| std::mem::take(&mut *l.borrow_mut()))
}

/// The module's statics (shared data, metric values) are process-wide, as
/// in Envoy: the glue tests take turns. Installs the fake's callbacks.
pub fn world() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    static INSTALLED: Once = Once::new();
    let turn = lock(&TURN);
    INSTALLED.call_once(|| {
        // SAFETY: every address `address` gives is one of the functions
        // below, declared with the signature abi.rs declares for its name.
        if let Err(missing) = unsafe { abi::install_stand_in(&address) } {
            lock(&MISUSE).push(format!("the fake Envoy lacks {missing}"));
        }
    });
    turn
}

/// # Safety
/// `b` is a buffer the module passed for this call.
unsafe fn module_bytes(b: ModuleBuffer) -> Vec<u8> {
    if b.ptr.is_null() {
        return Vec::new();
    }
    // SAFETY: the module's buffer, valid for the call.
    unsafe { std::slice::from_raw_parts(b.ptr, b.length) }.to_vec()
}

/// # Safety
/// `p` is a live [`FakeStream`]'s address.
unsafe fn stream<'a>(p: FilterEnvoyPtr) -> &'a FakeStream {
    // SAFETY: as the caller promises.
    unsafe { &*p.cast::<FakeStream>() }
}

/// # Safety
/// `p` is a live [`FakeConfig`]'s address.
unsafe fn config<'a>(p: ConfigEnvoyPtr) -> &'a FakeConfig {
    // SAFETY: as the caller promises.
    unsafe { &*p.cast::<FakeConfig>() }
}

fn lend(bytes: &[u8], out: *mut EnvoyBuffer) {
    // SAFETY: `out` is the module's out-parameter for this call.
    unsafe {
        *out = EnvoyBuffer {
            ptr: bytes.as_ptr(),
            length: bytes.len(),
        };
    }
}

extern "C" fn get_concurrency() -> u32 {
    CONCURRENCY
}

extern "C" fn get_worker_index(filter: FilterEnvoyPtr) -> u32 {
    // SAFETY: the tests pass live fakes.
    unsafe { stream(filter) }.worker
}

extern "C" fn log(level: LogLevel, message: ModuleBuffer) {
    // SAFETY: the module's buffer.
    let text = String::from_utf8_lossy(&unsafe { module_bytes(message) }).into_owned();
    LOG.with(|l| l.borrow_mut().push((level, text)));
}

extern "C" fn log_enabled(_level: LogLevel) -> bool {
    true
}

extern "C" fn get_header(
    filter: FilterEnvoyPtr,
    map: HeaderType,
    key: ModuleBuffer,
    result: *mut EnvoyBuffer,
    index: usize,
    _optional_size: *mut usize,
) -> bool {
    // SAFETY: live fake; the module's buffer.
    let (s, key) = unsafe { (stream(filter), module_bytes(key)) };
    let headers = s.map(map).borrow();
    let found = headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case(&key))
        .nth(index);
    match found {
        Some((_, v)) => {
            // The bytes stay where they are until the map changes.
            lend(v, result);
            true
        }
        None => false,
    }
}

extern "C" fn get_headers_size(filter: FilterEnvoyPtr, map: HeaderType) -> usize {
    // SAFETY: live fake.
    unsafe { stream(filter) }.map(map).borrow().len()
}

extern "C" fn get_headers(
    filter: FilterEnvoyPtr,
    map: HeaderType,
    result: *mut EnvoyHeader,
) -> bool {
    // SAFETY: live fake.
    let headers = unsafe { stream(filter) }.map(map).borrow();
    for (i, (k, v)) in headers.iter().enumerate() {
        // SAFETY: the module sized the array by get_headers_size.
        unsafe {
            *result.add(i) = EnvoyHeader {
                key_ptr: k.as_ptr(),
                key_length: k.len(),
                value_ptr: v.as_ptr(),
                value_length: v.len(),
            };
        }
    }
    true
}

extern "C" fn set_header(
    filter: FilterEnvoyPtr,
    map: HeaderType,
    key: ModuleBuffer,
    value: ModuleBuffer,
) -> bool {
    // SAFETY: live fake; the module's buffers.
    let (s, k) = unsafe { (stream(filter), module_bytes(key)) };
    let mut headers = s.map(map).borrow_mut();
    headers.retain(|(name, _)| !name.eq_ignore_ascii_case(&k));
    if !value.ptr.is_null() {
        // SAFETY: the module's buffer.
        headers.push((k, unsafe { module_bytes(value) }));
    }
    true
}

extern "C" fn send_response(
    filter: FilterEnvoyPtr,
    status: u32,
    headers: *mut ModuleHeader,
    headers_size: usize,
    body: ModuleBuffer,
    details: ModuleBuffer,
) {
    let pairs = if headers.is_null() {
        Vec::new()
    } else {
        // SAFETY: the module's array of headers_size entries.
        unsafe { std::slice::from_raw_parts(headers, headers_size) }
            .iter()
            .map(|h| {
                // SAFETY: the module's buffers.
                let (k, v) = unsafe {
                    (
                        module_bytes(ModuleBuffer {
                            ptr: h.key_ptr,
                            length: h.key_length,
                        }),
                        module_bytes(ModuleBuffer {
                            ptr: h.value_ptr,
                            length: h.value_length,
                        }),
                    )
                };
                (
                    String::from_utf8_lossy(&k).into_owned(),
                    String::from_utf8_lossy(&v).into_owned(),
                )
            })
            .collect()
    };
    // SAFETY: live fake; the module's buffers.
    let (s, body, details) = unsafe { (stream(filter), module_bytes(body), module_bytes(details)) };
    *s.sent.borrow_mut() = Some(Sent {
        status,
        headers: pairs,
        body,
        details: String::from_utf8_lossy(&details).into_owned(),
    });
}

extern "C" fn set_filter_state(
    filter: FilterEnvoyPtr,
    key: ModuleBuffer,
    value: ModuleBuffer,
) -> bool {
    // SAFETY: live fake; the module's buffers.
    let (s, k, v) = unsafe { (stream(filter), module_bytes(key), module_bytes(value)) };
    s.filter_state.borrow_mut().insert(k, v);
    true
}

extern "C" fn get_filter_state(
    filter: FilterEnvoyPtr,
    key: ModuleBuffer,
    result: *mut EnvoyBuffer,
) -> bool {
    // SAFETY: live fake; the module's buffer.
    let (s, k) = unsafe { (stream(filter), module_bytes(key)) };
    let state = s.filter_state.borrow();
    match state.get(&k) {
        Some(v) => {
            lend(v, result);
            true
        }
        None => false,
    }
}

extern "C" fn get_attribute_string(
    filter: FilterEnvoyPtr,
    id: AttributeId,
    result: *mut EnvoyBuffer,
) -> bool {
    // SAFETY: live fake.
    let attributes = unsafe { stream(filter) }.attributes.borrow();
    match attributes.get(&id) {
        Some(v) => {
            lend(v, result);
            true
        }
        None => false,
    }
}

extern "C" fn get_attribute_int(
    _filter: FilterEnvoyPtr,
    _id: AttributeId,
    _result: *mut u64,
) -> bool {
    false
}

extern "C" fn get_cluster_name(filter: FilterEnvoyPtr, result: *mut EnvoyBuffer) -> bool {
    // SAFETY: live fake.
    let cluster = unsafe { stream(filter) }.cluster.borrow();
    match cluster.as_deref() {
        Some(v) => {
            lend(v, result);
            true
        }
        None => false,
    }
}

fn define(c: ConfigEnvoyPtr, name: ModuleBuffer, id: *mut usize) -> MetricsResult {
    // SAFETY: live fake; the module's buffer.
    let (c, name) = unsafe { (config(c), module_bytes(name)) };
    let mut defined = lock(&c.defined);
    defined.push(String::from_utf8_lossy(&name).into_owned());
    // SAFETY: the module's out-parameter.
    unsafe { *id = defined.len() - 1 };
    0
}

extern "C" fn define_counter(
    c: ConfigEnvoyPtr,
    name: ModuleBuffer,
    _labels: *mut ModuleBuffer,
    _n: usize,
    id: *mut usize,
) -> MetricsResult {
    define(c, name, id)
}

extern "C" fn define_gauge(
    c: ConfigEnvoyPtr,
    name: ModuleBuffer,
    _labels: *mut ModuleBuffer,
    _n: usize,
    id: *mut usize,
) -> MetricsResult {
    define(c, name, id)
}

fn stream_stat(op: &'static str, filter: FilterEnvoyPtr, id: usize, value: u64) -> MetricsResult {
    gauge_change(op, id, value);
    // SAFETY: live fake.
    unsafe { stream(filter) }
        .stats
        .borrow_mut()
        .push((op, id, value));
    0
}

extern "C" fn increment_counter(
    f: FilterEnvoyPtr,
    id: usize,
    _l: *mut ModuleBuffer,
    _n: usize,
    v: u64,
) -> MetricsResult {
    stream_stat("counter+", f, id, v)
}

extern "C" fn increment_gauge(
    f: FilterEnvoyPtr,
    id: usize,
    _l: *mut ModuleBuffer,
    _n: usize,
    v: u64,
) -> MetricsResult {
    stream_stat("gauge+", f, id, v)
}

extern "C" fn decrement_gauge(
    f: FilterEnvoyPtr,
    id: usize,
    _l: *mut ModuleBuffer,
    _n: usize,
    v: u64,
) -> MetricsResult {
    stream_stat("gauge-", f, id, v)
}

extern "C" fn set_gauge(
    f: FilterEnvoyPtr,
    id: usize,
    _l: *mut ModuleBuffer,
    _n: usize,
    v: u64,
) -> MetricsResult {
    stream_stat("gauge=", f, id, v)
}

/// Records a config-level stat write `op` on `c`'s list.
fn config_stat(op: &'static str, c: ConfigEnvoyPtr, id: usize, value: u64) -> MetricsResult {
    // SAFETY: live fake.
    lock(&unsafe { config(c) }.stats).push((op, id, value));
    0
}

/// A config-level gauge write: the hook due inside it runs first, then
/// Envoy's value changes and the write is recorded.
fn config_gauge(op: &'static str, c: ConfigEnvoyPtr, id: usize, value: u64) -> MetricsResult {
    config_gauge_write();
    gauge_change(op, id, value);
    config_stat(op, c, id, value)
}

extern "C" fn config_increment_counter(
    c: ConfigEnvoyPtr,
    id: usize,
    _l: *mut ModuleBuffer,
    _n: usize,
    v: u64,
) -> MetricsResult {
    config_stat("counter+", c, id, v)
}

extern "C" fn config_increment_gauge(
    c: ConfigEnvoyPtr,
    id: usize,
    _l: *mut ModuleBuffer,
    _n: usize,
    v: u64,
) -> MetricsResult {
    config_gauge("gauge+", c, id, v)
}

extern "C" fn config_decrement_gauge(
    c: ConfigEnvoyPtr,
    id: usize,
    _l: *mut ModuleBuffer,
    _n: usize,
    v: u64,
) -> MetricsResult {
    config_gauge("gauge-", c, id, v)
}

extern "C" fn config_set_gauge(
    c: ConfigEnvoyPtr,
    id: usize,
    _l: *mut ModuleBuffer,
    _n: usize,
    v: u64,
) -> MetricsResult {
    config_gauge("gauge=", c, id, v)
}

fn new_scheduler(commits: Arc<Mutex<Vec<u64>>>) -> *mut c_void {
    let p = Box::into_raw(Box::new(FakeScheduler { commits })).cast::<c_void>();
    lock(&LIVE_SCHEDULERS)
        .get_or_insert_with(HashSet::new)
        .insert(p as usize);
    p
}

fn commit(p: *mut c_void, event: u64) {
    if !lock(&LIVE_SCHEDULERS)
        .get_or_insert_with(HashSet::new)
        .contains(&(p as usize))
    {
        lock(&MISUSE).push(format!("commit {event} to a deleted scheduler"));
        return;
    }
    // SAFETY: live (checked above).
    let s = unsafe { &*p.cast::<FakeScheduler>() };
    lock(&s.commits).push(event);
}

fn delete(p: *mut c_void) {
    if !lock(&LIVE_SCHEDULERS)
        .get_or_insert_with(HashSet::new)
        .remove(&(p as usize))
    {
        lock(&MISUSE).push("a scheduler deleted twice".into());
        return;
    }
    // SAFETY: made by new_scheduler, deleted once (checked above).
    drop(unsafe { Box::from_raw(p.cast::<FakeScheduler>()) });
}

extern "C" fn scheduler_new(filter: FilterEnvoyPtr) -> SchedulerPtr {
    // SAFETY: live fake.
    let s = unsafe { stream(filter) };
    *s.schedulers_made.borrow_mut() += 1;
    new_scheduler(s.commits.clone())
}

extern "C" fn scheduler_commit(p: SchedulerPtr, event: u64) {
    commit(p, event);
}

extern "C" fn scheduler_delete(p: SchedulerPtr) {
    delete(p);
}

extern "C" fn config_scheduler_new(c: ConfigEnvoyPtr) -> ConfigSchedulerPtr {
    // SAFETY: live fake.
    new_scheduler(unsafe { config(c) }.commits.clone())
}

extern "C" fn config_scheduler_commit(p: ConfigSchedulerPtr, event: u64) {
    commit(p, event);
}

extern "C" fn config_scheduler_delete(p: ConfigSchedulerPtr) {
    delete(p);
}

extern "C" fn config_http_callout(
    c: ConfigEnvoyPtr,
    callout_id: *mut u64,
    cluster: ModuleBuffer,
    headers: *mut ModuleHeader,
    headers_size: usize,
    _body: ModuleBuffer,
    _timeout_ms: u64,
) -> u32 {
    let id = NEXT_CALLOUT.fetch_add(1, SeqCst);
    let pairs = if headers.is_null() {
        Vec::new()
    } else {
        // SAFETY: the module's array.
        unsafe { std::slice::from_raw_parts(headers, headers_size) }
            .iter()
            .map(|h| {
                // SAFETY: the module's buffers.
                let (k, v) = unsafe {
                    (
                        module_bytes(ModuleBuffer {
                            ptr: h.key_ptr,
                            length: h.key_length,
                        }),
                        module_bytes(ModuleBuffer {
                            ptr: h.value_ptr,
                            length: h.value_length,
                        }),
                    )
                };
                (
                    String::from_utf8_lossy(&k).into_owned(),
                    String::from_utf8_lossy(&v).into_owned(),
                )
            })
            .collect()
    };
    // SAFETY: live fake; the module's buffer and out-parameter.
    unsafe {
        lock(&config(c).callouts).push(Callout {
            id,
            cluster: String::from_utf8_lossy(&module_bytes(cluster)).into_owned(),
            headers: pairs,
        });
        *callout_id = id;
    }
    0
}

/// Each callback's address by its NUL-terminated name; null for a name
/// the fake lacks (install then names it).
fn address(symbol: &'static str) -> *mut c_void {
    let name = symbol.strip_suffix('\0').unwrap_or(symbol);
    let Some(callback) = name.strip_prefix("envoy_dynamic_module_callback_") else {
        return std::ptr::null_mut();
    };
    let f: *const () = match callback {
        "get_concurrency" => get_concurrency as *const (),
        "http_filter_get_worker_index" => get_worker_index as *const (),
        "log" => log as *const (),
        "log_enabled" => log_enabled as *const (),
        "http_get_header" => get_header as *const (),
        "http_get_headers_size" => get_headers_size as *const (),
        "http_get_headers" => get_headers as *const (),
        "http_set_header" => set_header as *const (),
        "http_send_response" => send_response as *const (),
        "http_set_filter_state_bytes" => set_filter_state as *const (),
        "http_get_filter_state_bytes" => get_filter_state as *const (),
        "http_filter_get_attribute_string" => get_attribute_string as *const (),
        "http_filter_get_attribute_int" => get_attribute_int as *const (),
        "http_get_cluster_name" => get_cluster_name as *const (),
        "http_filter_config_define_counter" => define_counter as *const (),
        "http_filter_config_define_gauge" => define_gauge as *const (),
        "http_filter_increment_counter" => increment_counter as *const (),
        "http_filter_increment_gauge" => increment_gauge as *const (),
        "http_filter_decrement_gauge" => decrement_gauge as *const (),
        "http_filter_set_gauge" => set_gauge as *const (),
        "http_filter_config_increment_counter" => config_increment_counter as *const (),
        "http_filter_config_increment_gauge" => config_increment_gauge as *const (),
        "http_filter_config_decrement_gauge" => config_decrement_gauge as *const (),
        "http_filter_config_set_gauge" => config_set_gauge as *const (),
        "http_filter_scheduler_new" => scheduler_new as *const (),
        "http_filter_scheduler_commit" => scheduler_commit as *const (),
        "http_filter_scheduler_delete" => scheduler_delete as *const (),
        "http_filter_config_scheduler_new" => config_scheduler_new as *const (),
        "http_filter_config_scheduler_commit" => config_scheduler_commit as *const (),
        "http_filter_config_scheduler_delete" => config_scheduler_delete as *const (),
        "http_filter_config_http_callout" => config_http_callout as *const (),
        _ => std::ptr::null(),
    };
    f.cast_mut().cast()
}
