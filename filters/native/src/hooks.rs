//! The event hooks Envoy calls (`envoy_dynamic_module_on_*`). Envoy refuses
//! a module that lacks any required one, so every required HTTP-filter
//! hook is here, most doing nothing. Each catches a panic in its body and
//! goes on as if the filter were not there (a shutdown helper never denies
//! traffic over its own bug). What panicked is dropped, not reused (its
//! state, or a lock it held, may be half changed):
//!
//! | state | event | next |
//! |---|---|---|
//! | stream's filter alive | a panic caught in one of its hooks | dead: its later hooks do nothing and continue; logged once per process |
//! | config alive | a panic caught in its tick or callout answer | dead: its streams' hooks do nothing (requests pass without the filter), its tick and answers are ignored; logged once |
//! | dead stream's filter, or a dead config's | `filter_destroy` | still releases what the stream holds (the provider's in-flight count and kept scheduler, the consumer's live token): nothing else frees them, and a count never left would hold the drain gate until `timeout` |
//!
//! Filter names (`filter_name` in the Envoy config): `graceful_provider`,
//! `graceful_drain`, `graceful_consumer`, and `graceful_consumer:upstream`
//! for the consumer as a cluster's upstream filter. Any other name refuses
//! the config, naming it.

#![allow(unsafe_code)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::abi::{
    self, ConfigEnvoyPtr, ConfigModulePtr, EnvoyBuffer, EnvoyHeader, FilterEnvoyPtr,
    FilterModulePtr, Stream, CONTINUE,
};
use crate::host::CalloutAnswer;
use crate::{consumer, drain, provider};

/// What Envoy does with a stream after a core callback (the headers and
/// trailers hooks' status): a reply sent or a stream held stops it.
pub fn code(next: graceful_core::shared::host::Action) -> u32 {
    match next {
        graceful_core::shared::host::Action::Continue => CONTINUE,
        graceful_core::shared::host::Action::Stop => abi::STOP_ITERATION,
    }
}

/// The probe panics in the request hook of a request carrying this header.
#[cfg(feature = "panic-probe")]
const PANIC_PROBE_HEADER: &str = "x-graceful-panic-probe";
/// The probe's response header from a live probe stream.
#[cfg(feature = "panic-probe")]
const PANIC_PROBE_ALIVE: &str = "x-graceful-panic-probe-alive";

/// Boxed once per config (`config_new`): the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum FilterConfig {
    #[cfg(feature = "panic-probe")]
    PanicProbe,
    #[cfg(feature = "bench-floor")]
    BenchFloor,
    Provider(provider::Config),
    Drain(drain::Config),
    Consumer(consumer::Config),
}

enum FilterStream {
    Provider(provider::NativeProviderStream),
    Drain(drain::DrainStream),
    Consumer(consumer::ConsumerStream),
}

/// A config as boxed for Envoy: its filter's state and its life.
struct Configured {
    kind: FilterConfig,
    life: Life,
}

/// One stream's filter: its kind's state, its life, and its config, which
/// Envoy keeps alive as long as any of its filters.
struct Filter {
    config: *const Configured,
    stream: FilterStream,
    life: Life,
}

/// Whether a stream's filter or a config still runs: dead once a panic was
/// caught in its code (the module doc's table).
#[derive(Default)]
struct Life {
    dead: AtomicBool,
}

/// What [`Life::run`] did.
#[derive(Debug, PartialEq)]
enum Ran<T> {
    Done(T),
    /// Dead already: the body did not run.
    Dead,
    /// The body panicked: dead from now on.
    Panicked,
}

impl Life {
    fn is_dead(&self) -> bool {
        self.dead.load(Relaxed)
    }

    /// Runs `body` unless dead; a panic in it is caught and kills this life.
    fn run<T>(&self, body: impl FnOnce() -> T) -> Ran<T> {
        if self.is_dead() {
            return Ran::Dead;
        }
        match catch_unwind(AssertUnwindSafe(body)) {
            Ok(v) => Ran::Done(v),
            Err(_) => {
                self.dead.store(true, Relaxed);
                Ran::Panicked
            }
        }
    }
}

/// A stream's filter died: logged once per process (a bug that panics on
/// every request would flood the log).
static STREAM_PANIC_LOGGED: AtomicBool = AtomicBool::new(false);
static PANICKED: AtomicBool = AtomicBool::new(false);

/// Runs the body of a hook that has no stream or config to kill (creating
/// and destroying them); on a panic logs (once per process) and returns
/// `fallback`.
fn fail_open<T>(hook: &str, fallback: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(v) => v,
        Err(_) => {
            if !PANICKED.swap(true, Relaxed) {
                abi::log(abi::LOG_ERROR, &format!(
                    "graceful: a panic in {hook} was caught; the stream goes on without the filter (failing open)"
                ));
            }
            fallback
        }
    }
}

/// The stream's filter and its config, or None for a null pointer. Shared
/// references only: Envoy may run one of a stream's hooks inside another
/// (a local reply runs the response hooks), so the stream state is in cells.
///
/// # Safety
/// `ptr` is null or a pointer [`envoy_dynamic_module_on_http_filter_new`]
/// returned and Envoy has not destroyed.
unsafe fn filter<'a>(ptr: FilterModulePtr) -> Option<(&'a Filter, &'a Configured)> {
    let f = ptr.cast::<Filter>();
    // SAFETY: as the caller promises; all on the stream's worker thread.
    let f = unsafe { f.as_ref()? };
    // SAFETY: the config outlives its filters.
    let c = unsafe { f.config.as_ref()? };
    Some((f, c))
}

/// A stream hook's body on its filter, config and stream, failing open:
/// the fallback for a null filter, a dead filter or config, or a panic
/// (which kills the stream's filter).
///
/// # Safety
/// As [`filter`]; `envoy` is the filter pointer Envoy passed to the hook.
unsafe fn on_stream<T>(
    hook: &str,
    envoy: FilterEnvoyPtr,
    module: FilterModulePtr,
    fallback: T,
    body: impl FnOnce(&FilterStream, &FilterConfig, Stream<'_>) -> T,
) -> T {
    // SAFETY: as the caller promises.
    let Some((f, c)) = (unsafe { filter(module) }) else {
        return fallback;
    };
    if c.life.is_dead() {
        return fallback;
    }
    // SAFETY: Envoy's pointer for this hook.
    let ran = unsafe { Stream::in_hook(envoy, |s| f.life.run(|| body(&f.stream, &c.kind, s))) };
    match ran {
        Ran::Done(v) => v,
        Ran::Dead => fallback,
        Ran::Panicked => {
            if !STREAM_PANIC_LOGGED.swap(true, Relaxed) {
                abi::log(abi::LOG_ERROR, &format!(
                    "graceful: a panic in {hook} was caught; that stream's filter is dropped and the stream goes on without it (failing open); logged once"
                ));
            }
            fallback
        }
    }
}

/// A config hook's body (its tick, a callout's answer, on the main
/// thread); a panic kills the config (the module doc's table).
///
/// # Safety
/// `config` is null or came from `config_new` and is live; `envoy` is the
/// config pointer Envoy passed to the hook.
unsafe fn on_config(
    hook: &str,
    envoy: ConfigEnvoyPtr,
    config: ConfigModulePtr,
    body: impl FnOnce(&FilterConfig, abi::Config<'_>),
) {
    // SAFETY: as the caller promises.
    let Some(c) = (unsafe { config.cast::<Configured>().as_ref() }) else {
        return;
    };
    // SAFETY: Envoy's pointer for this hook.
    let ran = unsafe { abi::Config::in_hook(envoy, |e| c.life.run(|| body(&c.kind, e))) };
    if ran == Ran::Panicked {
        abi::log(abi::LOG_ERROR, &format!(
            "graceful: a panic in {hook} was caught; this filter config is dropped and requests pass without it (failing open)"
        ));
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const u8 {
    match abi::resolve_callbacks() {
        Ok(()) => abi::ABI_VERSION.as_ptr(),
        Err(missing) => {
            // Envoy's own log callback may be what is missing: stderr, which
            // Envoy logs to as well. Null: Envoy refuses the module.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "graceful: this Envoy lacks {missing}: the native module needs Envoy {} or later (dynamic-module ABI {}); on an older Envoy use the .wasm filters",
                abi::ENVOY_NEEDED,
                String::from_utf8_lossy(abi::ABI_VERSION.strip_suffix(b"\0").unwrap_or(abi::ABI_VERSION)),
            );
            std::ptr::null()
        }
    }
}

/// Parses the config for `name`; null (Envoy refuses the config) on any
/// error, logged with the field it names.
///
/// # Safety
/// Envoy passes buffers valid for the call.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    envoy: ConfigEnvoyPtr,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> ConfigModulePtr {
    fail_open("config_new", std::ptr::null(), || {
        // SAFETY: valid for this call.
        let (name, json) = unsafe { (name.copied(), config.copied()) };
        let name = String::from_utf8_lossy(&name).into_owned();
        // SAFETY: Envoy's config pointer for this call.
        let made = unsafe {
            abi::Config::in_hook(envoy, |envoy| {
                match name.as_str() {
            "graceful_provider" => provider::Config::new(envoy, &json).map(FilterConfig::Provider),
            "graceful_drain" => drain::Config::new(envoy, &json).map(FilterConfig::Drain),
            #[cfg(feature = "panic-probe")]
            "graceful_panic_probe" => Ok(FilterConfig::PanicProbe),
            #[cfg(feature = "bench-floor")]
            "graceful_bench_floor" => Ok(FilterConfig::BenchFloor),
            "graceful_consumer" => {
                consumer::Config::new(envoy, &json, false).map(FilterConfig::Consumer)
            }
            "graceful_consumer:upstream" => {
                consumer::Config::new(envoy, &json, true).map(FilterConfig::Consumer)
            }
            other => Err(format!(
                "unknown filter_name {other:?}: this module has graceful_provider, graceful_drain, graceful_consumer and graceful_consumer:upstream"
            )),
        }
            })
        };
        match made {
            Ok(kind) => Box::into_raw(Box::new(Configured {
                kind,
                life: Life::default(),
            }))
            .cast::<std::ffi::c_void>()
            .cast_const(),
            Err(e) => {
                abi::log(abi::LOG_ERROR, &format!("{name}: {e}"));
                std::ptr::null()
            }
        }
    })
}

/// # Safety
/// `ptr` came from `config_new` and is destroyed once.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(ptr: ConfigModulePtr) {
    fail_open("config_destroy", (), || {
        if !ptr.is_null() {
            // SAFETY: made by Box::into_raw in config_new, given back once.
            drop(unsafe { Box::from_raw(ptr.cast::<Configured>().cast_mut()) });
        }
    });
}

/// # Safety
/// `config` came from `config_new`.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: ConfigModulePtr,
    _envoy: FilterEnvoyPtr,
) -> FilterModulePtr {
    fail_open("filter_new", std::ptr::null(), || {
        let c = config.cast::<Configured>();
        // SAFETY: a live config.
        let stream = match unsafe { c.as_ref() }.map(|c| &c.kind) {
            Some(FilterConfig::Provider(_)) => FilterStream::Provider(Default::default()),
            Some(FilterConfig::Drain(_)) => FilterStream::Drain(Default::default()),
            Some(FilterConfig::Consumer(_)) => FilterStream::Consumer(Default::default()),
            #[cfg(feature = "panic-probe")]
            Some(FilterConfig::PanicProbe) => FilterStream::Provider(Default::default()),
            // No stream of any filter's matches it: every hook does nothing.
            #[cfg(feature = "bench-floor")]
            Some(FilterConfig::BenchFloor) => FilterStream::Provider(Default::default()),
            None => return std::ptr::null(),
        };
        Box::into_raw(Box::new(Filter {
            config: c,
            stream,
            life: Life::default(),
        }))
        .cast::<std::ffi::c_void>()
        .cast_const()
    })
}

/// # Safety
/// Envoy's pointers for a live stream.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    envoy: FilterEnvoyPtr,
    module: FilterModulePtr,
    end_of_stream: bool,
) -> u32 {
    // SAFETY: a live filter.
    unsafe {
        on_stream(
            "request_headers",
            envoy,
            module,
            CONTINUE,
            |stream, c, s| {
                #[cfg(feature = "panic-probe")]
                if matches!(c, FilterConfig::PanicProbe)
                    && s.header(abi::REQUEST_HEADERS, PANIC_PROBE_HEADER).is_some()
                {
                    #[allow(clippy::panic)]
                    {
                        panic!("graceful_panic_probe: a panic on purpose");
                    }
                }
                match (stream, c) {
                    (FilterStream::Provider(p), FilterConfig::Provider(pc)) => {
                        pc.request_headers(p, s, end_of_stream)
                    }
                    (FilterStream::Drain(d), FilterConfig::Drain(dc)) => d.request_headers(dc, s),
                    (FilterStream::Consumer(k), FilterConfig::Consumer(kc)) => {
                        k.request_headers(kc, s)
                    }
                    _ => CONTINUE,
                }
            },
        )
    }
}

/// # Safety
/// Envoy's pointers for a live stream.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    envoy: FilterEnvoyPtr,
    module: FilterModulePtr,
    _end_of_stream: bool,
) -> u32 {
    // SAFETY: a live filter.
    unsafe {
        on_stream(
            "response_headers",
            envoy,
            module,
            CONTINUE,
            |stream, c, s| {
                match (stream, c) {
                    #[cfg(feature = "panic-probe")]
                    (_, FilterConfig::PanicProbe) => {
                        // Only a live probe stream says so: one that panicked is dead.
                        s.set_header(abi::RESPONSE_HEADERS, PANIC_PROBE_ALIVE, "true");
                        CONTINUE
                    }
                    (FilterStream::Provider(p), FilterConfig::Provider(pc)) => {
                        pc.response_headers(p, s)
                    }
                    (FilterStream::Consumer(k), FilterConfig::Consumer(kc)) => {
                        k.response_headers(kc, s)
                    }
                    _ => CONTINUE,
                }
            },
        )
    }
}

/// # Safety
/// Envoy's pointers for a live stream.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    envoy: FilterEnvoyPtr,
    module: FilterModulePtr,
) -> u32 {
    // SAFETY: a live filter.
    unsafe {
        on_stream(
            "response_trailers",
            envoy,
            module,
            CONTINUE,
            |stream, c, s| match (stream, c) {
                (FilterStream::Provider(p), FilterConfig::Provider(pc)) => {
                    pc.response_trailers(p, s)
                }
                (FilterStream::Consumer(k), FilterConfig::Consumer(kc)) => {
                    k.response_trailers(kc, s)
                }
                _ => CONTINUE,
            },
        )
    }
}

/// # Safety
/// Envoy's pointers for a live stream.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    envoy: FilterEnvoyPtr,
    module: FilterModulePtr,
) {
    // SAFETY: a live filter.
    unsafe {
        on_stream(
            "stream_complete",
            envoy,
            module,
            (),
            |stream, c, s| match (stream, c) {
                (FilterStream::Provider(p), FilterConfig::Provider(pc)) => pc.stream_complete(p, s),
                (FilterStream::Consumer(k), FilterConfig::Consumer(kc)) => k.stream_complete(kc, s),
                _ => {}
            },
        )
    }
}

/// # Safety
/// `module` came from `filter_new` and is destroyed once.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_destroy(module: FilterModulePtr) {
    fail_open("filter_destroy", (), || {
        if module.is_null() {
            return;
        }
        // SAFETY: made by Box::into_raw in filter_new, given back once.
        let f = unsafe { Box::from_raw(module.cast::<Filter>().cast_mut()) };
        // SAFETY: the config outlives its filters. A dead filter or
        // config still releases what the stream holds (module doc).
        match (&f.stream, unsafe { f.config.as_ref() }.map(|c| &c.kind)) {
            (FilterStream::Provider(p), Some(FilterConfig::Provider(pc))) => pc.destroy(p),
            (FilterStream::Drain(d), Some(FilterConfig::Drain(dc))) => d.destroy(dc),
            (FilterStream::Consumer(k), Some(FilterConfig::Consumer(kc))) => k.destroy(kc),
            _ => {}
        }
    });
}

/// A stream woken by a tick, on its worker: the drain's held long-poll or
/// Watch, the provider's kept long-lived stream.
///
/// # Safety
/// Envoy's pointers for a live stream.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    envoy: FilterEnvoyPtr,
    module: FilterModulePtr,
    _event: u64,
) {
    // SAFETY: a live filter.
    unsafe {
        on_stream("scheduled", envoy, module, (), |stream, c, s| {
            match (stream, c) {
                (FilterStream::Drain(d), FilterConfig::Drain(dc)) => d.scheduled(dc, s),
                (FilterStream::Provider(p), FilterConfig::Provider(pc)) => pc.scheduled(p, s),
                _ => {}
            }
        })
    }
}

/// A config timer's tick (drain, provider, consumer), on the main thread.
///
/// # Safety
/// `config` came from `config_new`.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_scheduled(
    envoy: ConfigEnvoyPtr,
    config: ConfigModulePtr,
    _event: u64,
) {
    // SAFETY: a live config.
    unsafe {
        on_config("config_scheduled", envoy, config, |c, envoy| match c {
            FilterConfig::Drain(dc) => dc.tick(envoy),
            FilterConfig::Consumer(kc) => kc.tick(envoy),
            FilterConfig::Provider(pc) => pc.tick(envoy),
            #[cfg(feature = "panic-probe")]
            FilterConfig::PanicProbe => {}
            #[cfg(feature = "bench-floor")]
            FilterConfig::BenchFloor => {}
        })
    }
}

/// An answer to a config's callout (the drain's admin poll or on_drained).
///
/// # Safety
/// Envoy's pointers, valid for the call.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_http_callout_done(
    envoy: ConfigEnvoyPtr,
    config: ConfigModulePtr,
    callout_id: u64,
    _result: u32,
    headers: *const EnvoyHeader,
    headers_size: usize,
    body: *const EnvoyBuffer,
    body_size: usize,
) {
    let answered = |c: &FilterConfig, envoy: abi::Config<'_>| {
        let max_body = match c {
            FilterConfig::Drain(_) => graceful_core::drain::filter::MAX_ANSWER_BODY,
            FilterConfig::Consumer(_) => graceful_core::consumer::decisions::MAX_ADMIN_BODY,
            _ => return,
        };
        // SAFETY: buffers valid for this call.
        let (headers, body) = unsafe {
            (
                envoy.callout_headers(headers, headers_size),
                envoy.callout_body(body, body_size, max_body),
            )
        };
        let answer = CalloutAnswer {
            headers: &headers,
            body: &body,
        };
        match c {
            FilterConfig::Drain(dc) => dc.callout_done(envoy, callout_id, &answer),
            FilterConfig::Consumer(kc) => kc.callout_done(envoy, callout_id, &answer),
            _ => {}
        }
    };
    // SAFETY: a live config.
    unsafe { on_config("config_http_callout_done", envoy, config, answered) }
}

// Required hooks these filters do nothing in: the stream goes on.

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    _envoy: FilterEnvoyPtr,
    _module: FilterModulePtr,
    _end_of_stream: bool,
) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    _envoy: FilterEnvoyPtr,
    _module: FilterModulePtr,
) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    _envoy: FilterEnvoyPtr,
    _module: FilterModulePtr,
    _end_of_stream: bool,
) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    _envoy: FilterEnvoyPtr,
    _module: FilterModulePtr,
    _callout_id: u64,
    _result: u32,
    _headers: *const EnvoyHeader,
    _headers_size: usize,
    _body: *const EnvoyBuffer,
    _body_size: usize,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    _envoy: FilterEnvoyPtr,
    _module: FilterModulePtr,
    _stream_id: u64,
    _headers: *const EnvoyHeader,
    _headers_size: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    _envoy: FilterEnvoyPtr,
    _module: FilterModulePtr,
    _stream_id: u64,
    _data: *const EnvoyBuffer,
    _data_count: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    _envoy: FilterEnvoyPtr,
    _module: FilterModulePtr,
    _stream_id: u64,
    _trailers: *const EnvoyHeader,
    _trailers_size: usize,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(
    _envoy: FilterEnvoyPtr,
    _module: FilterModulePtr,
    _stream_id: u64,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    _envoy: FilterEnvoyPtr,
    _module: FilterModulePtr,
    _stream_id: u64,
    _reason: u32,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _envoy: FilterEnvoyPtr,
    _module: FilterModulePtr,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _envoy: FilterEnvoyPtr,
    _module: FilterModulePtr,
) {
}

/// Every worker calls into one config at once: the configs must be `Sync`
/// (checked here, since Envoy hands them over as raw pointers).
const _: () = {
    const fn shared_by_workers<T: Sync + Send>() {}
    shared_by_workers::<provider::Config>();
    shared_by_workers::<drain::Config>();
    shared_by_workers::<consumer::Config>();
};

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn a_panic_kills_the_life_and_its_later_hooks_do_not_run() {
        let life = Life::default();
        assert_eq!(life.run(|| 1), Ran::Done(1));
        #[allow(clippy::panic)]
        let ran = life.run(|| -> u32 { panic!("on purpose") });
        assert_eq!(ran, Ran::Panicked);
        assert!(life.is_dead());
        let called = Cell::new(false);
        assert_eq!(life.run(|| called.set(true)), Ran::Dead);
        assert!(!called.get(), "a dead filter's hook ran");
    }

    #[test]
    fn one_dead_life_leaves_the_others_alive() {
        let (dead, alive) = (Life::default(), Life::default());
        #[allow(clippy::panic)]
        let _ = dead.run(|| panic!("on purpose"));
        assert!(dead.is_dead());
        assert_eq!(alive.run(|| 2), Ran::Done(2));
    }
}
