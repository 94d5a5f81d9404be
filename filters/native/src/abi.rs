//! Envoy's dynamic-module ABI v0.2.0 (Envoy 1.40), the part this module
//! uses: types and the callbacks Envoy exports, declared from
//! `source/extensions/dynamic_modules/abi/abi.h`. The hooks Envoy calls are
//! in `hooks.rs`. Enums cross the boundary as C `int`s: they are plain
//! integer constants here, so a value Envoy adds later cannot be an invalid
//! Rust enum.
//!
//! Safe handles are at the bottom, and their types keep the header's rules
//! (misuse does not compile: the `compile_fail` examples on [`Stream`],
//! [`Stream::with_headers`], [`Config`] and [`resolve_callbacks`] show it):
//!
//! | handle | lives | threads | why |
//! |---|---|---|---|
//! | [`Stream`]`<'cb>` | the hook it was lent to (`in_hook` takes a closure generic over `'cb`); one per hook, neither `Copy` nor `Clone` | its worker (not `Send`) | Envoy's filter pointer is valid only during the hook |
//! | [`Config`]`<'cb>` | the config hook it was lent to; lent by reference | the main thread (not `Send`) | config callbacks are main-thread calls; a config's state keeps no copy of the pointer |
//! | a header map's pairs | one [`Stream::with_headers`] call, which holds the stream `&mut` | | valid until the map changes: what changes it ([`Stream::set_header`], [`Stream::remove_header`], [`Stream::send_response`]) takes the stream `&mut` too |
//! | other bytes borrowed from Envoy | copied before the call returns | | valid until the hook returns |
//! | [`StreamScheduler`], [`ConfigScheduler`] | owned, deleted on drop | any (`Send + Sync`) | commit is thread-safe; ownership makes delete the last use |
//!
//! The raw pointers stay in this file and in the hooks' signatures; what
//! rests on a caller's promise is an `unsafe fn` with a `# Safety` section,
//! called only from the hooks Envoy calls.

#![allow(unsafe_code)]

use std::ffi::c_void;
use std::marker::PhantomData;

/// The version string `envoy_dynamic_module_on_program_init` returns: the
/// ABI this module is built against (Envoy's `abi.h` says compatibility
/// holds only for an exact match). Envoy itself only warns on a mismatch,
/// so the module checks first ([`crate::envoy_version`]) and refuses any
/// other.
pub const ABI_VERSION: &[u8] = b"v0.2.0\0";
/// The Envoy minor whose `abi.h` is [`ABI_VERSION`]: the only one the
/// module runs on (1.39 has v0.1.0; 1.38 and older lack callbacks too).
pub const ENVOY_BUILT_FOR: &str = "1.40";

/// [`ABI_VERSION`] without its NUL.
pub fn abi_version() -> &'static str {
    let bytes = ABI_VERSION.strip_suffix(b"\0").unwrap_or(ABI_VERSION);
    std::str::from_utf8(bytes).unwrap_or("v0.2.0")
}

pub type ConfigEnvoyPtr = *mut c_void;
pub type ConfigModulePtr = *const c_void;
pub type FilterEnvoyPtr = *mut c_void;
pub type FilterModulePtr = *const c_void;
pub type SchedulerPtr = *mut c_void;
pub type ConfigSchedulerPtr = *mut c_void;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyBuffer {
    pub ptr: *const u8,
    pub length: usize,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModuleBuffer {
    pub ptr: *const u8,
    pub length: usize,
}

impl ModuleBuffer {
    pub fn of(bytes: &[u8]) -> ModuleBuffer {
        ModuleBuffer {
            ptr: bytes.as_ptr(),
            length: bytes.len(),
        }
    }

    pub const NULL: ModuleBuffer = ModuleBuffer {
        ptr: std::ptr::null(),
        length: 0,
    };
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModuleHeader {
    pub key_ptr: *const u8,
    pub key_length: usize,
    pub value_ptr: *const u8,
    pub value_length: usize,
}

impl ModuleHeader {
    pub fn of(key: &str, value: &str) -> ModuleHeader {
        ModuleHeader {
            key_ptr: key.as_ptr(),
            key_length: key.len(),
            value_ptr: value.as_ptr(),
            value_length: value.len(),
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyHeader {
    pub key_ptr: *const u8,
    pub key_length: usize,
    pub value_ptr: *const u8,
    pub value_length: usize,
}

/// Declares the callbacks the module calls in Envoy, resolved by name when
/// Envoy first loads the module ([`resolve_callbacks`]) instead of by the
/// dynamic linker: an Envoy that lacks one then gets one clear refusal
/// naming it, where a link-time reference fails `dlopen` with an
/// undefined symbol (every call here goes through the GOT, bound at load).
/// Each becomes an `unsafe fn` of the same name and signature.
macro_rules! envoy_callbacks {
    (@ret) => { () };
    (@ret $ret:ty) => { $ret };
    ($( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $(-> $ret:ty)? ; )*) => {
        /// Each callback's address in this Envoy; 0 until resolved.
        #[allow(non_upper_case_globals)]
        mod slots {
            use std::sync::atomic::AtomicUsize;
            $( pub static $name: AtomicUsize = AtomicUsize::new(0); )*
        }

        /// Stores every callback's address as `resolve` finds it by name;
        /// Err: the first it lacks (nothing after it is stored).
        ///
        /// # Safety
        /// Every non-null address `resolve` gives is a function with the
        /// signature declared for its name: each later call trusts it.
        unsafe fn install(
            resolve: &dyn Fn(&'static str) -> *mut c_void,
        ) -> Result<(), &'static str> {
            $(
                let address = resolve(concat!(stringify!($name), "\0"));
                if address.is_null() {
                    return Err(stringify!($name));
                }
                slots::$name.store(address as usize, std::sync::atomic::Ordering::Relaxed);
            )*
            Ok(())
        }

        $(
            #[allow(clippy::too_many_arguments)]
            unsafe fn $name($($arg: $ty),*) -> envoy_callbacks!(@ret $($ret)?) {
                let address = slots::$name.load(std::sync::atomic::Ordering::Relaxed);
                if address == 0 {
                    // Unreachable: Envoy calls no hook of a module whose
                    // program init refused. A null answer, not a jump to 0.
                    return Fallback::fallback();
                }
                // SAFETY: the address of this very symbol, whose C signature
                // is the one declared (abi.h).
                let f: unsafe extern "C" fn($($ty),*) -> envoy_callbacks!(@ret $($ret)?) =
                    unsafe { std::mem::transmute::<usize, _>(address) };
                // SAFETY: as the caller promises for the callback.
                unsafe { f($($arg),*) }
            }
        )*
    };
}

extern "C" {
    fn dlsym(handle: *mut c_void, symbol: *const std::ffi::c_char) -> *mut c_void;
}

/// Resolves every callback in the running Envoy; Err: the first it lacks.
///
/// # Safety
/// The process is an Envoy whose dynamic-module ABI is [`ABI_VERSION`]:
/// each callback found by name is then called with the signature declared
/// here, which only that ABI promises. Resolving is itself safe to call;
/// calling it is what makes every later call trust the signatures, so it
/// is `unsafe` to call:
///
/// ```compile_fail,E0133
/// let _ = graceful::abi::resolve_callbacks();
/// ```
///
/// ```no_run
/// // SAFETY: (an example) the version check passed first.
/// let _ = unsafe { graceful::abi::resolve_callbacks() };
/// ```
pub unsafe fn resolve_callbacks() -> Result<(), &'static str> {
    let resolve = |symbol: &'static str| {
        // SAFETY: a NUL-terminated name; RTLD_DEFAULT (null) searches the
        // global scope, where the Envoy executable exports them.
        unsafe { dlsym(std::ptr::null_mut(), symbol.as_ptr().cast()) }
    };
    // SAFETY: Envoy's ABI is ours (the caller), so each symbol has the
    // declared signature.
    unsafe { install(&resolve) }
}

/// Points every callback at a stand-in for Envoy (the unit tests' fake):
/// `resolve` gets each NUL-terminated name.
///
/// # Safety
/// Every non-null address `resolve` returns is an `extern "C"` function
/// with the signature declared here for that name.
#[cfg(test)]
pub unsafe fn install_stand_in(
    resolve: &dyn Fn(&'static str) -> *mut c_void,
) -> Result<(), &'static str> {
    // SAFETY: as the caller promises.
    unsafe { install(resolve) }
}

/// What a callback that was never resolved returns.
trait Fallback {
    fn fallback() -> Self;
}

impl Fallback for () {
    fn fallback() {}
}

impl Fallback for bool {
    fn fallback() -> bool {
        false
    }
}

impl Fallback for u32 {
    fn fallback() -> u32 {
        // For the metric and callout results: not Success.
        u32::MAX
    }
}

impl Fallback for usize {
    fn fallback() -> usize {
        0
    }
}

impl Fallback for *mut c_void {
    fn fallback() -> *mut c_void {
        std::ptr::null_mut()
    }
}

/// `envoy_dynamic_module_type_http_header_type`.
pub type HeaderType = u32;
/// Headers listed on the stack by [`Stream::with_headers`]; a larger map
/// is listed on the heap.
const HEADERS_ON_STACK: usize = 32;

pub const REQUEST_HEADERS: HeaderType = 0;
pub const RESPONSE_HEADERS: HeaderType = 2;
pub const RESPONSE_TRAILERS: HeaderType = 3;

/// `envoy_dynamic_module_type_log_level`.
pub type LogLevel = u32;
pub const LOG_DEBUG: LogLevel = 1;
pub const LOG_INFO: LogLevel = 2;
pub const LOG_WARN: LogLevel = 3;
pub const LOG_ERROR: LogLevel = 4;

/// `envoy_dynamic_module_type_attribute_id`.
pub type AttributeId = u32;
pub const ATTR_RESPONSE_FLAGS: AttributeId = 17;
pub const ATTR_SOURCE_ADDRESS: AttributeId = 24;
pub const ATTR_DESTINATION_ADDRESS: AttributeId = 26;
pub const ATTR_UPSTREAM_ADDRESS: AttributeId = 41;
pub const ATTR_XDS_CLUSTER_NAME: AttributeId = 57;

/// The headers / body / trailers statuses the hooks return: 0 is
/// Continue in each of them, 1 StopIteration in the headers and trailers
/// ones.
pub const CONTINUE: u32 = 0;
pub const STOP_ITERATION: u32 = 1;

/// `envoy_dynamic_module_type_http_callout_init_result`: 0 is Success.
pub type CalloutInit = u32;
/// `envoy_dynamic_module_type_metrics_result`: 0 is Success.
pub type MetricsResult = u32;

envoy_callbacks! {
    fn envoy_dynamic_module_callback_get_concurrency() -> u32;
    fn envoy_dynamic_module_callback_http_filter_get_worker_index(filter: FilterEnvoyPtr) -> u32;
    fn envoy_dynamic_module_callback_log(level: LogLevel, message: ModuleBuffer);
    fn envoy_dynamic_module_callback_log_enabled(level: LogLevel) -> bool;

    fn envoy_dynamic_module_callback_http_get_header(
        filter: FilterEnvoyPtr,
        header_type: HeaderType,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
        index: usize,
        optional_size: *mut usize,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_get_headers_size(
        filter: FilterEnvoyPtr,
        header_type: HeaderType,
    ) -> usize;
    fn envoy_dynamic_module_callback_http_get_headers(
        filter: FilterEnvoyPtr,
        header_type: HeaderType,
        result: *mut EnvoyHeader,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_set_header(
        filter: FilterEnvoyPtr,
        header_type: HeaderType,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_send_response(
        filter: FilterEnvoyPtr,
        status_code: u32,
        headers: *mut ModuleHeader,
        headers_size: usize,
        body: ModuleBuffer,
        details: ModuleBuffer,
    );
    fn envoy_dynamic_module_callback_http_set_filter_state_bytes(
        filter: FilterEnvoyPtr,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_get_filter_state_bytes(
        filter: FilterEnvoyPtr,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_filter_get_attribute_string(
        filter: FilterEnvoyPtr,
        id: AttributeId,
        result: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_filter_get_attribute_int(
        filter: FilterEnvoyPtr,
        id: AttributeId,
        result: *mut u64,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_get_cluster_name(
        filter: FilterEnvoyPtr,
        result: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_filter_config_define_counter(
        config: ConfigEnvoyPtr,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        id: *mut usize,
    ) -> MetricsResult;
    fn envoy_dynamic_module_callback_http_filter_config_define_gauge(
        config: ConfigEnvoyPtr,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        id: *mut usize,
    ) -> MetricsResult;
    fn envoy_dynamic_module_callback_http_filter_increment_counter(
        filter: FilterEnvoyPtr,
        id: usize,
        labels: *mut ModuleBuffer,
        labels_length: usize,
        value: u64,
    ) -> MetricsResult;
    fn envoy_dynamic_module_callback_http_filter_increment_gauge(
        filter: FilterEnvoyPtr,
        id: usize,
        labels: *mut ModuleBuffer,
        labels_length: usize,
        value: u64,
    ) -> MetricsResult;
    fn envoy_dynamic_module_callback_http_filter_decrement_gauge(
        filter: FilterEnvoyPtr,
        id: usize,
        labels: *mut ModuleBuffer,
        labels_length: usize,
        value: u64,
    ) -> MetricsResult;
    fn envoy_dynamic_module_callback_http_filter_set_gauge(
        filter: FilterEnvoyPtr,
        id: usize,
        labels: *mut ModuleBuffer,
        labels_length: usize,
        value: u64,
    ) -> MetricsResult;
    fn envoy_dynamic_module_callback_http_filter_config_increment_counter(
        config: ConfigEnvoyPtr,
        id: usize,
        labels: *mut ModuleBuffer,
        labels_length: usize,
        value: u64,
    ) -> MetricsResult;
    fn envoy_dynamic_module_callback_http_filter_config_increment_gauge(
        config: ConfigEnvoyPtr,
        id: usize,
        labels: *mut ModuleBuffer,
        labels_length: usize,
        value: u64,
    ) -> MetricsResult;
    fn envoy_dynamic_module_callback_http_filter_config_decrement_gauge(
        config: ConfigEnvoyPtr,
        id: usize,
        labels: *mut ModuleBuffer,
        labels_length: usize,
        value: u64,
    ) -> MetricsResult;
    fn envoy_dynamic_module_callback_http_filter_config_set_gauge(
        config: ConfigEnvoyPtr,
        id: usize,
        labels: *mut ModuleBuffer,
        labels_length: usize,
        value: u64,
    ) -> MetricsResult;

    fn envoy_dynamic_module_callback_http_filter_scheduler_new(
        filter: FilterEnvoyPtr,
    ) -> SchedulerPtr;
    fn envoy_dynamic_module_callback_http_filter_scheduler_commit(
        scheduler: SchedulerPtr,
        event_id: u64,
    );
    fn envoy_dynamic_module_callback_http_filter_scheduler_delete(scheduler: SchedulerPtr);
    fn envoy_dynamic_module_callback_http_filter_config_scheduler_new(
        config: ConfigEnvoyPtr,
    ) -> ConfigSchedulerPtr;
    fn envoy_dynamic_module_callback_http_filter_config_scheduler_commit(
        scheduler: ConfigSchedulerPtr,
        event_id: u64,
    );
    fn envoy_dynamic_module_callback_http_filter_config_scheduler_delete(
        scheduler: ConfigSchedulerPtr,
    );
    fn envoy_dynamic_module_callback_http_filter_config_http_callout(
        config: ConfigEnvoyPtr,
        callout_id: *mut u64,
        cluster: ModuleBuffer,
        headers: *mut ModuleHeader,
        headers_size: usize,
        body: ModuleBuffer,
        timeout_ms: u64,
    ) -> CalloutInit;
}

/// Bytes Envoy owns, borrowed for as long as the handle `_scope` of the
/// hook they came from is borrowed: they cannot outlive that borrow.
///
/// # Safety
/// `b` comes from Envoy within the hook `_scope` belongs to.
unsafe fn envoy_bytes<'s>(_scope: &'s Hook<'_>, b: EnvoyBuffer) -> &'s [u8] {
    if b.ptr.is_null() || b.length == 0 {
        &[]
    } else {
        // SAFETY: Envoy guarantees ptr..ptr+length is readable for the hook.
        unsafe { std::slice::from_raw_parts(b.ptr, b.length) }
    }
}

/// The key and value of a header Envoy owns, borrowed for the hook.
///
/// # Safety
/// `h` comes from Envoy within the hook `scope` belongs to.
unsafe fn header_pair<'s>(scope: &'s Hook<'_>, h: &EnvoyHeader) -> (&'s [u8], &'s [u8]) {
    // SAFETY: both buffers are Envoy's, valid for the hook.
    unsafe {
        (
            envoy_bytes(
                scope,
                EnvoyBuffer {
                    ptr: h.key_ptr,
                    length: h.key_length,
                },
            ),
            envoy_bytes(
                scope,
                EnvoyBuffer {
                    ptr: h.value_ptr,
                    length: h.value_length,
                },
            ),
        )
    }
}

/// The running hook, as a lifetime: a handle or borrowed bytes tagged
/// `'cb` cannot be kept past it (every `in_hook` takes a closure generic
/// over `'cb`). Not `Send`: a hook's handles are its thread's.
#[derive(Clone, Copy)]
struct Hook<'cb>(PhantomData<*const &'cb ()>);

impl EnvoyBuffer {
    /// The bytes, copied.
    ///
    /// # Safety
    /// `self` comes from Envoy within the running hook.
    pub unsafe fn copied(self) -> Vec<u8> {
        // SAFETY: as the caller promises; copied before the hook returns.
        unsafe { envoy_bytes(&Hook(PhantomData), self) }.to_vec()
    }
}

/// Every metric change in the ABI has this shape, for a filter or for a
/// config: (owner, id, label values, label count, value).
type MetricCall = unsafe fn(*mut c_void, usize, *mut ModuleBuffer, usize, u64) -> MetricsResult;

/// Applies `call` to a defined metric with no labels; nothing for an
/// undefined one.
///
/// # Safety
/// `owner` is the live filter or config pointer `call` expects.
unsafe fn metric(call: MetricCall, owner: *mut c_void, id: Option<usize>, value: u64) {
    if let Some(id) = id {
        // SAFETY: as the caller promises; no labels.
        unsafe {
            call(owner, id, std::ptr::null_mut(), 0, value);
        }
    }
}

/// The metric changes of one owner, a filter's or a config's.
struct MetricCalls {
    increment_counter: MetricCall,
    increment_gauge: MetricCall,
    decrement_gauge: MetricCall,
    set_gauge: MetricCall,
}

/// A filter's metric changes (any worker's stream).
const STREAM_METRICS: MetricCalls = MetricCalls {
    increment_counter: envoy_dynamic_module_callback_http_filter_increment_counter,
    increment_gauge: envoy_dynamic_module_callback_http_filter_increment_gauge,
    decrement_gauge: envoy_dynamic_module_callback_http_filter_decrement_gauge,
    set_gauge: envoy_dynamic_module_callback_http_filter_set_gauge,
};

/// A config's metric changes (the main thread).
const CONFIG_METRICS: MetricCalls = MetricCalls {
    increment_counter: envoy_dynamic_module_callback_http_filter_config_increment_counter,
    increment_gauge: envoy_dynamic_module_callback_http_filter_config_increment_gauge,
    decrement_gauge: envoy_dynamic_module_callback_http_filter_config_decrement_gauge,
    set_gauge: envoy_dynamic_module_callback_http_filter_config_set_gauge,
};

impl MetricCalls {
    /// Adds `n` to a defined counter; nothing for an undefined one.
    ///
    /// # Safety
    /// `owner` is the live pointer these calls expect, on a thread they
    /// may be made on.
    unsafe fn counter_add(&self, owner: *mut c_void, id: Option<usize>, n: u64) {
        // SAFETY: as the caller promises.
        unsafe { metric(self.increment_counter, owner, id, n) }
    }

    /// Adds `delta` (either sign) to a defined gauge.
    ///
    /// # Safety
    /// As for [`MetricCalls::counter_add`].
    unsafe fn gauge_add(&self, owner: *mut c_void, id: Option<usize>, delta: i64) {
        let call = if delta >= 0 {
            self.increment_gauge
        } else {
            self.decrement_gauge
        };
        // SAFETY: as the caller promises.
        unsafe { metric(call, owner, id, delta.unsigned_abs()) }
    }

    /// Sets a defined gauge to `value`.
    ///
    /// # Safety
    /// As for [`MetricCalls::counter_add`].
    unsafe fn gauge_set(&self, owner: *mut c_void, id: Option<usize>, value: u64) {
        // SAFETY: as the caller promises.
        unsafe { metric(self.set_gauge, owner, id, value) }
    }
}

/// A hook handle's metric methods (`Stream`'s, `Config`'s), through its
/// owner's [`MetricCalls`]; the attributes given go on `gauge_add`.
macro_rules! metric_methods {
    ($calls:expr $(, $(#[$gauge_add_attr:meta])*)?) => {
        pub fn counter_add(&self, id: Option<usize>, n: u64) {
            // SAFETY: the pointer Envoy passed to the running hook, used on
            // its thread (`in_hook`): the owner these calls expect.
            unsafe { $calls.counter_add(self.ptr, id, n) }
        }

        $($(#[$gauge_add_attr])*)?
        pub fn gauge_add(&self, id: Option<usize>, delta: i64) {
            // SAFETY: as in `counter_add`.
            unsafe { $calls.gauge_add(self.ptr, id, delta) }
        }

        pub fn gauge_set(&self, id: Option<usize>, value: u64) {
            // SAFETY: as in `counter_add`.
            unsafe { $calls.gauge_set(self.ptr, id, value) }
        }
    };
}

/// Every metric definition has this shape: (config, name, label names,
/// label count, id out).
type DefineCall =
    unsafe fn(ConfigEnvoyPtr, ModuleBuffer, *mut ModuleBuffer, usize, *mut usize) -> MetricsResult;

pub fn log(level: LogLevel, message: &str) {
    // SAFETY: plain calls; the buffer is read during the call only.
    unsafe {
        if envoy_dynamic_module_callback_log_enabled(level) {
            envoy_dynamic_module_callback_log(level, ModuleBuffer::of(message.as_bytes()));
        }
    }
}

/// A stream as Envoy hands it to a hook: usable only inside that hook
/// (`'cb`) and on its thread (not `Send`), the filter pointer hidden.
/// Neither `Copy` nor `Clone`: the one handle of a hook is lent to it, and
/// what changes the stream's header maps (or may run another of its hooks)
/// takes it `&mut`, so no listing borrowed from a map is alive meanwhile.
///
/// The hook's body is generic over `'cb`, so the handle cannot leave it:
///
/// ```no_run
/// use graceful::abi::{Stream, REQUEST_HEADERS};
/// # let envoy_ptr = std::ptr::null_mut();
/// // SAFETY: the filter pointer Envoy passed to the running hook.
/// let n = unsafe { Stream::in_hook(envoy_ptr, |s| s.header(REQUEST_HEADERS, "host").map(|h| h.len())) };
/// ```
///
/// ```compile_fail
/// use graceful::abi::{Stream, REQUEST_HEADERS};
/// # let envoy_ptr = std::ptr::null_mut();
/// // SAFETY: the filter pointer Envoy passed to the running hook.
/// let kept = unsafe { Stream::in_hook(envoy_ptr, |s| s) }; // the handle outlives its hook
/// ```
///
/// Nor can it be copied (to change a map through one copy while another
/// lists it): a reborrow compiles,
///
/// ```no_run
/// use graceful::abi::{Stream, REQUEST_HEADERS};
/// # let envoy_ptr = std::ptr::null_mut();
/// // SAFETY: the filter pointer Envoy passed to the running hook.
/// unsafe {
///     Stream::in_hook(envoy_ptr, |mut s| {
///         let other = &mut s;
///         other.set_header(REQUEST_HEADERS, "x-a", "1");
///         s.header(REQUEST_HEADERS, "x-a");
///     })
/// };
/// ```
///
/// a copy does not:
///
/// ```compile_fail,E0382
/// use graceful::abi::{Stream, REQUEST_HEADERS};
/// # let envoy_ptr = std::ptr::null_mut();
/// // SAFETY: the filter pointer Envoy passed to the running hook.
/// unsafe {
///     Stream::in_hook(envoy_ptr, |mut s| {
///         let mut other = s;
///         other.set_header(REQUEST_HEADERS, "x-a", "1");
///         s.header(REQUEST_HEADERS, "x-a");
///     })
/// };
/// ```
pub struct Stream<'cb> {
    ptr: FilterEnvoyPtr,
    hook: Hook<'cb>,
}

impl Stream<'_> {
    /// Runs `body` with the stream Envoy passed to the running hook.
    ///
    /// # Safety
    /// `ptr` is the filter pointer Envoy passed to the hook being run, on
    /// this thread, and no other handle to it is alive (one per hook).
    pub unsafe fn in_hook<T>(
        ptr: FilterEnvoyPtr,
        body: impl for<'cb> FnOnce(Stream<'cb>) -> T,
    ) -> T {
        body(Stream {
            ptr,
            hook: Hook(PhantomData),
        })
    }
}

impl<'cb> Stream<'cb> {
    /// The first value of a header, copied.
    pub fn header(&self, map: HeaderType, name: &str) -> Option<Vec<u8>> {
        let mut out = EnvoyBuffer {
            ptr: std::ptr::null(),
            length: 0,
        };
        // SAFETY: a valid filter pointer for this hook; out is written by Envoy.
        let found = unsafe {
            envoy_dynamic_module_callback_http_get_header(
                self.ptr,
                map,
                ModuleBuffer::of(name.as_bytes()),
                &mut out,
                0,
                std::ptr::null_mut(),
            )
        };
        // SAFETY: the buffer was just returned in this hook.
        (found && !out.ptr.is_null()).then(|| unsafe { envoy_bytes(&self.hook, out) }.to_vec())
    }

    /// Runs `f` over every header of a map, borrowed from Envoy for the
    /// call (no copy); `f` gets an empty list when the map is unavailable.
    /// The stream is held `&mut` for the call and the pairs' lifetime is
    /// the call's: nothing can change the map while they are read, and
    /// none of them outlives the call. Each misuse below is refused at
    /// compile time, shown beside the same code without it.
    ///
    /// A change after the listing compiles:
    /// ```no_run
    /// use graceful::abi::{Stream, REQUEST_HEADERS};
    /// # let envoy_ptr = std::ptr::null_mut();
    /// // SAFETY: the filter pointer Envoy passed to the running hook.
    /// unsafe {
    ///     Stream::in_hook(envoy_ptr, |mut s| {
    ///         let n = s.with_headers(REQUEST_HEADERS, |pairs| pairs.count());
    ///         s.set_header(REQUEST_HEADERS, "x-count", &n.to_string());
    ///         s.remove_header(REQUEST_HEADERS, "x-old");
    ///         s.send_response(503, &[], b"", "details");
    ///     })
    /// };
    /// ```
    /// one during it does not: a set,
    /// ```compile_fail,E0499
    /// use graceful::abi::{Stream, REQUEST_HEADERS};
    /// # let envoy_ptr = std::ptr::null_mut();
    /// // SAFETY: the filter pointer Envoy passed to the running hook.
    /// unsafe {
    ///     Stream::in_hook(envoy_ptr, |mut s| {
    ///         let n = s.with_headers(REQUEST_HEADERS, |pairs| {
    ///             s.set_header(REQUEST_HEADERS, "x-count", "1");
    ///             pairs.count()
    ///         });
    ///     })
    /// };
    /// ```
    /// a removal,
    /// ```compile_fail,E0499
    /// use graceful::abi::{Stream, REQUEST_HEADERS};
    /// # let envoy_ptr = std::ptr::null_mut();
    /// // SAFETY: the filter pointer Envoy passed to the running hook.
    /// unsafe {
    ///     Stream::in_hook(envoy_ptr, |mut s| {
    ///         let n = s.with_headers(REQUEST_HEADERS, |pairs| {
    ///             s.remove_header(REQUEST_HEADERS, "x-old");
    ///             pairs.count()
    ///         });
    ///     })
    /// };
    /// ```
    /// or a local reply (Envoy runs the response hooks inside it, and
    /// replaces the response maps):
    /// ```compile_fail,E0499
    /// use graceful::abi::{Stream, REQUEST_HEADERS};
    /// # let envoy_ptr = std::ptr::null_mut();
    /// // SAFETY: the filter pointer Envoy passed to the running hook.
    /// unsafe {
    ///     Stream::in_hook(envoy_ptr, |mut s| {
    ///         let n = s.with_headers(REQUEST_HEADERS, |pairs| {
    ///             s.send_response(503, &[], b"", "details");
    ///             pairs.count()
    ///         });
    ///     })
    /// };
    /// ```
    /// What is read from the pairs may leave the call, copied,
    /// ```no_run
    /// use graceful::abi::{Stream, REQUEST_HEADERS};
    /// # let envoy_ptr = std::ptr::null_mut();
    /// // SAFETY: the filter pointer Envoy passed to the running hook.
    /// unsafe {
    ///     Stream::in_hook(envoy_ptr, |mut s| {
    ///         let first = s.with_headers(REQUEST_HEADERS, |pairs| pairs.next().map(|(k, _)| k.to_vec()));
    ///         s.set_header(REQUEST_HEADERS, "x-count", "1");
    ///         drop(first);
    ///     })
    /// };
    /// ```
    /// a pair itself may not, returned
    /// ```compile_fail
    /// use graceful::abi::{Stream, REQUEST_HEADERS};
    /// # let envoy_ptr = std::ptr::null_mut();
    /// // SAFETY: the filter pointer Envoy passed to the running hook.
    /// unsafe {
    ///     Stream::in_hook(envoy_ptr, |mut s| {
    ///         let first = s.with_headers(REQUEST_HEADERS, |pairs| pairs.next().map(|(k, _)| k));
    ///         s.set_header(REQUEST_HEADERS, "x-count", "1");
    ///         drop(first);
    ///     })
    /// };
    /// ```
    /// or stored outside (copied, it compiles:
    /// ```no_run
    /// use graceful::abi::{Stream, REQUEST_HEADERS};
    /// # let envoy_ptr = std::ptr::null_mut();
    /// // SAFETY: the filter pointer Envoy passed to the running hook.
    /// unsafe {
    ///     Stream::in_hook(envoy_ptr, |mut s| {
    ///         let mut kept: Vec<Vec<u8>> = Vec::new();
    ///         s.with_headers(REQUEST_HEADERS, |pairs| kept.extend(pairs.map(|(k, _)| k.to_vec())));
    ///         s.set_header(REQUEST_HEADERS, "x-count", "1");
    ///         drop(kept);
    ///     })
    /// };
    /// ```
    /// borrowed, it does not):
    /// ```compile_fail
    /// use graceful::abi::{Stream, REQUEST_HEADERS};
    /// # let envoy_ptr = std::ptr::null_mut();
    /// // SAFETY: the filter pointer Envoy passed to the running hook.
    /// unsafe {
    ///     Stream::in_hook(envoy_ptr, |mut s| {
    ///         let mut kept: Vec<&[u8]> = Vec::new();
    ///         s.with_headers(REQUEST_HEADERS, |pairs| kept.extend(pairs.map(|(k, _)| k)));
    ///         s.set_header(REQUEST_HEADERS, "x-count", "1");
    ///         drop(kept);
    ///     })
    /// };
    /// ```
    pub fn with_headers<T>(
        &mut self,
        map: HeaderType,
        f: impl for<'h> FnOnce(&mut dyn Iterator<Item = (&'h [u8], &'h [u8])>) -> T,
    ) -> T {
        const EMPTY: EnvoyHeader = EnvoyHeader {
            key_ptr: std::ptr::null(),
            key_length: 0,
            value_ptr: std::ptr::null(),
            value_length: 0,
        };
        // SAFETY: valid filter pointer; the array is sized as Envoy says.
        let n = unsafe { envoy_dynamic_module_callback_http_get_headers_size(self.ptr, map) };
        // A map of ordinary size is listed on the stack: no allocation on
        // every response, and only the entries Envoy fills are set first
        // (not the whole array, on every hook).
        let mut on_stack = [std::mem::MaybeUninit::<EnvoyHeader>::uninit(); HEADERS_ON_STACK];
        let mut on_heap = Vec::new();
        let raw: &mut [EnvoyHeader] = if n <= HEADERS_ON_STACK {
            let listed = &mut on_stack[..n];
            for slot in listed.iter_mut() {
                slot.write(EMPTY);
            }
            // SAFETY: every element of `listed` was initialised just above,
            // and MaybeUninit<T> has T's layout.
            unsafe {
                &mut *(listed as *mut [std::mem::MaybeUninit<EnvoyHeader>] as *mut [EnvoyHeader])
            }
        } else {
            on_heap.resize(n, EMPTY);
            &mut on_heap
        };
        // SAFETY: as above; Envoy fills at most n entries.
        let ok = n > 0
            && unsafe {
                envoy_dynamic_module_callback_http_get_headers(self.ptr, map, raw.as_mut_ptr())
            };
        let raw: &[EnvoyHeader] = if ok { raw } else { &[] };
        let hook = &self.hook;
        // SAFETY: Envoy's buffers, valid until the map changes; nothing can
        // change it during this call (`self` is held `&mut`), and `f` is
        // generic over the pairs' lifetime, so none is kept past it.
        let mut pairs = raw.iter().map(|h| unsafe { header_pair(hook, h) });
        f(&mut pairs)
    }

    /// The worker this stream runs on (0-based).
    pub fn worker_index(&self) -> u32 {
        // SAFETY: valid filter pointer.
        unsafe { envoy_dynamic_module_callback_http_filter_get_worker_index(self.ptr) }
    }

    /// Sets a header (replacing every value); false if Envoy refused (the
    /// map is not available in this phase).
    pub fn set_header(&mut self, map: HeaderType, name: &str, value: &str) -> bool {
        // SAFETY: valid filter pointer; buffers read during the call.
        unsafe {
            envoy_dynamic_module_callback_http_set_header(
                self.ptr,
                map,
                ModuleBuffer::of(name.as_bytes()),
                ModuleBuffer::of(value.as_bytes()),
            )
        }
    }

    /// Removes a header (a set with a null value).
    pub fn remove_header(&mut self, map: HeaderType, name: &str) -> bool {
        // SAFETY: as set_header; a null value removes the key.
        unsafe {
            envoy_dynamic_module_callback_http_set_header(
                self.ptr,
                map,
                ModuleBuffer::of(name.as_bytes()),
                ModuleBuffer::NULL,
            )
        }
    }

    /// Sends a local reply; `details` goes to `%RESPONSE_CODE_DETAILS%`.
    /// `&mut`: Envoy runs the stream's response hooks inside it.
    pub fn send_response(
        &mut self,
        status: u32,
        headers: &[(&str, &str)],
        body: &[u8],
        details: &str,
    ) {
        let mut raw: Vec<ModuleHeader> = headers
            .iter()
            .map(|(k, v)| ModuleHeader::of(k, v))
            .collect();
        // SAFETY: valid filter pointer; every buffer outlives the call.
        unsafe {
            envoy_dynamic_module_callback_http_send_response(
                self.ptr,
                status,
                raw.as_mut_ptr(),
                raw.len(),
                ModuleBuffer::of(body),
                ModuleBuffer::of(details.as_bytes()),
            );
        }
    }

    pub fn attribute_string(&self, id: AttributeId) -> Option<Vec<u8>> {
        let mut out = EnvoyBuffer {
            ptr: std::ptr::null(),
            length: 0,
        };
        // SAFETY: valid filter pointer; the buffer is copied at once.
        let ok = unsafe {
            envoy_dynamic_module_callback_http_filter_get_attribute_string(self.ptr, id, &mut out)
        };
        // SAFETY: returned in this hook.
        (ok && !out.ptr.is_null()).then(|| unsafe { envoy_bytes(&self.hook, out) }.to_vec())
    }

    /// Sets a bytes value in the stream's filter state (its `StreamInfo`,
    /// which the upstream filters of its attempts read too); false if
    /// Envoy refused.
    pub fn set_filter_state(&self, key: &str, value: &[u8]) -> bool {
        // SAFETY: valid filter pointer; buffers read during the call.
        unsafe {
            envoy_dynamic_module_callback_http_set_filter_state_bytes(
                self.ptr,
                ModuleBuffer::of(key.as_bytes()),
                ModuleBuffer::of(value),
            )
        }
    }

    /// A bytes value of the stream's filter state, copied.
    pub fn filter_state(&self, key: &str) -> Option<Vec<u8>> {
        let mut out = EnvoyBuffer {
            ptr: std::ptr::null(),
            length: 0,
        };
        // SAFETY: valid filter pointer; the buffer is copied at once.
        let ok = unsafe {
            envoy_dynamic_module_callback_http_get_filter_state_bytes(
                self.ptr,
                ModuleBuffer::of(key.as_bytes()),
                &mut out,
            )
        };
        // SAFETY: returned in this hook.
        (ok && !out.ptr.is_null()).then(|| unsafe { envoy_bytes(&self.hook, out) }.to_vec())
    }

    pub fn attribute_int(&self, id: AttributeId) -> Option<u64> {
        let mut out = 0u64;
        // SAFETY: valid filter pointer; out is a plain integer.
        let ok = unsafe {
            envoy_dynamic_module_callback_http_filter_get_attribute_int(self.ptr, id, &mut out)
        };
        ok.then_some(out)
    }

    pub fn cluster_name(&self) -> Option<String> {
        let mut out = EnvoyBuffer {
            ptr: std::ptr::null(),
            length: 0,
        };
        // SAFETY: valid filter pointer; copied at once.
        let ok = unsafe { envoy_dynamic_module_callback_http_get_cluster_name(self.ptr, &mut out) };
        // SAFETY: returned in this hook.
        ok.then(|| String::from_utf8_lossy(unsafe { envoy_bytes(&self.hook, out) }).into_owned())
    }

    metric_methods!(STREAM_METRICS);

    /// A scheduler that brings work back to this stream's worker
    /// (`on_http_filter_scheduled`), from any thread, for as long as it is
    /// kept; deleted when dropped.
    pub fn scheduler(&self) -> StreamScheduler {
        // SAFETY: valid filter pointer.
        StreamScheduler(unsafe {
            envoy_dynamic_module_callback_http_filter_scheduler_new(self.ptr)
        })
    }
}

/// A stream's scheduler, owned: commit from any thread, deleted once, on
/// drop. A commit after the stream ended does nothing (Envoy's scheduler
/// holds the filter weakly and posts to its worker's dispatcher).
pub struct StreamScheduler(SchedulerPtr);

// SAFETY: Envoy's commit posts to a dispatcher, which is thread-safe, and
// delete frees an object holding a weak pointer and a dispatcher
// reference; ownership makes delete the last use.
unsafe impl Send for StreamScheduler {}
// SAFETY: commit takes `&self` and is thread-safe (above).
unsafe impl Sync for StreamScheduler {}

impl StreamScheduler {
    /// A scheduler of no stream (a hook without one asked): its commits do
    /// nothing.
    pub fn none() -> StreamScheduler {
        StreamScheduler(std::ptr::null_mut())
    }

    pub fn commit(&self, event: u64) {
        if !self.0.is_null() {
            // SAFETY: alive until Drop; commit is thread-safe.
            unsafe { envoy_dynamic_module_callback_http_filter_scheduler_commit(self.0, event) }
        }
    }
}

impl Drop for StreamScheduler {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: owned: no commit can follow.
            unsafe { envoy_dynamic_module_callback_http_filter_scheduler_delete(self.0) }
        }
    }
}

/// A filter config as Envoy hands it to `config_new` and the config hooks
/// (its tick, a callout's answer): usable only inside that hook, on the
/// main thread (not `Send`), the pointer hidden; lent by reference, never
/// copied. A config's state keeps no copy: each main-thread hook gets its
/// own.
///
/// ```no_run
/// use graceful::abi::Config;
/// # let envoy_ptr = std::ptr::null_mut();
/// // SAFETY: the config pointer Envoy passed to the running hook.
/// let workers = unsafe { Config::in_hook(envoy_ptr, |c| c.concurrency()) };
/// ```
///
/// ```compile_fail
/// use graceful::abi::Config;
/// # let envoy_ptr = std::ptr::null_mut();
/// // SAFETY: the config pointer Envoy passed to the running hook.
/// let kept = unsafe { Config::in_hook(envoy_ptr, |c| c) }; // the handle outlives its hook
/// ```
pub struct Config<'cb> {
    ptr: ConfigEnvoyPtr,
    hook: Hook<'cb>,
}

impl Config<'_> {
    /// Runs `body` with the config Envoy passed to the running hook.
    ///
    /// # Safety
    /// `ptr` is the config pointer Envoy passed to the hook being run, on
    /// the main thread, and no other handle to it is alive (one per hook).
    pub unsafe fn in_hook<T>(
        ptr: ConfigEnvoyPtr,
        body: impl for<'cb> FnOnce(Config<'cb>) -> T,
    ) -> T {
        body(Config {
            ptr,
            hook: Hook(PhantomData),
        })
    }
}

impl<'cb> Config<'cb> {
    fn define(&self, call: DefineCall, name: &str) -> Option<usize> {
        let mut id = 0usize;
        // SAFETY: valid config pointer during config_new; no labels.
        let r = unsafe {
            call(
                self.ptr,
                ModuleBuffer::of(name.as_bytes()),
                std::ptr::null_mut(),
                0,
                &mut id,
            )
        };
        (r == 0).then_some(id)
    }

    pub fn define_counter(&self, name: &str) -> Option<usize> {
        self.define(
            envoy_dynamic_module_callback_http_filter_config_define_counter,
            name,
        )
    }

    pub fn define_gauge(&self, name: &str) -> Option<usize> {
        self.define(
            envoy_dynamic_module_callback_http_filter_config_define_gauge,
            name,
        )
    }

    /// Envoy's worker count (a main-thread call, hence a config's).
    pub fn concurrency(&self) -> u32 {
        // SAFETY: in a config hook, on the main thread.
        unsafe { envoy_dynamic_module_callback_get_concurrency() }
    }

    metric_methods!(
        CONFIG_METRICS,
        /// Adds `delta` to a gauge, as a worker's stream does: never a set
        /// from the module's count, which would race the workers' adds.
    );

    /// A scheduler that brings work to the main thread
    /// (`on_http_filter_config_scheduled`), from any thread.
    pub fn scheduler(&self) -> ConfigScheduler {
        // SAFETY: valid config pointer during config_new.
        ConfigScheduler(unsafe {
            envoy_dynamic_module_callback_http_filter_config_scheduler_new(self.ptr)
        })
    }

    /// An HTTP call to `cluster`; its answer comes to
    /// `on_http_filter_config_http_callout_done` with the returned id.
    pub fn callout(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u64,
    ) -> Result<u64, u32> {
        let mut raw: Vec<ModuleHeader> = headers
            .iter()
            .map(|(k, v)| ModuleHeader::of(k, v))
            .collect();
        let mut id = 0u64;
        // SAFETY: valid config pointer on the main thread; buffers outlive the call.
        let r = unsafe {
            envoy_dynamic_module_callback_http_filter_config_http_callout(
                self.ptr,
                &mut id,
                ModuleBuffer::of(cluster.as_bytes()),
                raw.as_mut_ptr(),
                raw.len(),
                ModuleBuffer::of(body),
                timeout_ms,
            )
        };
        if r == 0 {
            Ok(id)
        } else {
            Err(r)
        }
    }

    /// The pairs of a callout's answer headers, copied.
    ///
    /// # Safety
    /// `headers` and `n` come from the `*_callout_done` hook being run.
    pub unsafe fn callout_headers(
        &self,
        headers: *const EnvoyHeader,
        n: usize,
    ) -> Vec<(Vec<u8>, Vec<u8>)> {
        if headers.is_null() {
            return Vec::new();
        }
        // SAFETY: Envoy passes n valid headers for the hook's duration.
        let raw = unsafe { std::slice::from_raw_parts(headers, n) };
        raw.iter()
            .map(|h| {
                // SAFETY: as above.
                let (k, v) = unsafe { header_pair(&self.hook, h) };
                (k.to_vec(), v.to_vec())
            })
            .collect()
    }

    /// A callout's answer body, concatenated, at most `max` bytes.
    ///
    /// # Safety
    /// `chunks` and `n` come from the `*_callout_done` hook being run.
    pub unsafe fn callout_body(&self, chunks: *const EnvoyBuffer, n: usize, max: usize) -> Vec<u8> {
        if chunks.is_null() {
            return Vec::new();
        }
        let mut out = Vec::new();
        // SAFETY: Envoy passes n valid buffers for the hook's duration.
        for c in unsafe { std::slice::from_raw_parts(chunks, n) } {
            // SAFETY: as above.
            let bytes = unsafe { envoy_bytes(&self.hook, *c) };
            let room = max.saturating_sub(out.len());
            out.extend_from_slice(&bytes[..bytes.len().min(room)]);
        }
        out
    }
}

/// A config scheduler, owned: commit from any thread, deleted once, on
/// drop.
pub struct ConfigScheduler(ConfigSchedulerPtr);

// SAFETY: the header says commit may be called from any thread; ownership
// makes delete (on drop) the last use.
unsafe impl Send for ConfigScheduler {}
// SAFETY: commit takes `&self` and is thread-safe (above).
unsafe impl Sync for ConfigScheduler {}

impl ConfigScheduler {
    pub fn commit(&self, event: u64) {
        if !self.0.is_null() {
            // SAFETY: alive until Drop; commit is thread-safe.
            unsafe {
                envoy_dynamic_module_callback_http_filter_config_scheduler_commit(self.0, event)
            }
        }
    }
}

impl Drop for ConfigScheduler {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: owned: no commit can follow.
            unsafe { envoy_dynamic_module_callback_http_filter_config_scheduler_delete(self.0) }
        }
    }
}
