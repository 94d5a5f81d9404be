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
//! | a copy of a filter's state (a worker's, the drain's) | a panic caught while its lock was held | poisoned: dropped at its next use and a fresh one built from the config in its place (`copies.rs`), never reused |
//! | dead stream's filter, or a dead config's | `filter_destroy` | still releases what the stream holds (the provider's in-flight count and kept scheduler, the consumer's live token and held front long-poll): nothing else frees them, and a count never left would hold the drain gate until `timeout` |
//!
//! Every stream hook is one [`Event`] through [`dispatch`], every config
//! hook one `ConfigEvent` through [`dispatch_config`]: the look-up, the
//! life check and the panic guard are written once.
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

/// Where a panic was caught, which says what dies and how often it is
/// logged (the module doc's table).
#[derive(Clone, Copy)]
enum Scope {
    /// A stream's filter: logged once per process (a bug that panics on
    /// every request would flood the log).
    Stream,
    /// A config: logged each time (a config dies once).
    Config,
    /// Creating or destroying a config or a filter: nothing to kill;
    /// logged once per process.
    Lifecycle,
}

static STREAM_PANIC_LOGGED: AtomicBool = AtomicBool::new(false);
static LIFECYCLE_PANIC_LOGGED: AtomicBool = AtomicBool::new(false);

impl Scope {
    fn log(self, hook: &str) {
        let (once, after) = match self {
            Scope::Stream => (
                Some(&STREAM_PANIC_LOGGED),
                "that stream's filter is dropped and the stream goes on without it (failing open); logged once",
            ),
            Scope::Config => (
                None,
                "this filter config is dropped and requests pass without it (failing open)",
            ),
            Scope::Lifecycle => (
                Some(&LIFECYCLE_PANIC_LOGGED),
                "the stream goes on without the filter (failing open)",
            ),
        };
        if once.is_some_and(|logged| logged.swap(true, Relaxed)) {
            return;
        }
        abi::log(
            abi::LOG_ERROR,
            &format!("graceful: a panic in {hook} was caught; {after}"),
        );
    }
}

/// Every hook's guard: runs `body` unless `life` is dead; a panic in it
/// is caught, kills `life` and is logged; `fallback` then, as for a dead
/// life.
fn guard<T>(
    hook: &str,
    scope: Scope,
    life: Option<&Life>,
    fallback: T,
    body: impl FnOnce() -> T,
) -> T {
    let ran = match life {
        Some(life) => life.run(body),
        None => match catch_unwind(AssertUnwindSafe(body)) {
            Ok(v) => Ran::Done(v),
            Err(_) => Ran::Panicked,
        },
    };
    match ran {
        Ran::Done(v) => v,
        Ran::Dead => fallback,
        Ran::Panicked => {
            scope.log(hook);
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

/// What Envoy asks of a stream's filter: one event per stream hook.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Event {
    RequestHeaders {
        end_of_stream: bool,
    },
    ResponseHeaders,
    ResponseTrailers,
    StreamComplete,
    /// Woken by a tick (the drain's held long-poll or Watch, the
    /// provider's kept long-lived stream).
    Scheduled,
}

/// The dispatch every stream hook makes: its filter looked up, `event` run
/// on it unless the filter or its config is dead, a panic caught (killing
/// the filter); CONTINUE for a null, dead or panicked filter.
///
/// # Safety
/// As [`filter`]; `envoy` is the filter pointer Envoy passed to the hook.
unsafe fn dispatch(
    hook: &str,
    envoy: FilterEnvoyPtr,
    module: FilterModulePtr,
    event: Event,
) -> u32 {
    // SAFETY: as the caller promises.
    let Some((f, c)) = (unsafe { filter(module) }) else {
        return CONTINUE;
    };
    if c.life.is_dead() {
        return CONTINUE;
    }
    guard(hook, Scope::Stream, Some(&f.life), CONTINUE, || {
        // SAFETY: Envoy's pointer for this hook, the hook's only handle.
        unsafe { Stream::in_hook(envoy, |s| f.stream.on(&c.kind, s, event)) }
    })
}

impl FilterStream {
    /// `event` on this stream's filter of `config`'s kind.
    fn on(&self, config: &FilterConfig, s: Stream<'_>, event: Event) -> u32 {
        match (self, config) {
            #[cfg(feature = "panic-probe")]
            (_, FilterConfig::PanicProbe) => panic_probe(s, event),
            (FilterStream::Provider(p), FilterConfig::Provider(pc)) => pc.on(p, s, event),
            (FilterStream::Drain(d), FilterConfig::Drain(dc)) => d.on(dc, s, event),
            (FilterStream::Consumer(k), FilterConfig::Consumer(kc)) => k.on(kc, s, event),
            _ => CONTINUE,
        }
    }
}

/// The probe panics in the request hook of a request with its header; a
/// live probe stream marks its response (one that panicked is dead).
#[cfg(feature = "panic-probe")]
fn panic_probe(mut s: Stream<'_>, event: Event) -> u32 {
    match event {
        Event::RequestHeaders { .. }
            if s.header(abi::REQUEST_HEADERS, PANIC_PROBE_HEADER).is_some() =>
        {
            #[allow(clippy::panic)]
            {
                panic!("graceful_panic_probe: a panic on purpose");
            }
        }
        Event::ResponseHeaders => {
            s.set_header(abi::RESPONSE_HEADERS, PANIC_PROBE_ALIVE, "true");
        }
        _ => {}
    }
    CONTINUE
}

/// What Envoy asks of a config on the main thread.
#[derive(Clone, Copy)]
enum ConfigEvent {
    /// Its timer's tick.
    Tick,
    /// The answer to one of its callouts, in Envoy's buffers.
    Answered {
        id: u64,
        headers: *const EnvoyHeader,
        headers_size: usize,
        body: *const EnvoyBuffer,
        body_size: usize,
    },
}

/// The dispatch every config hook makes (on the main thread): its config
/// looked up, `event` run on it unless dead, a panic caught (killing the
/// config).
///
/// # Safety
/// `config` is null or came from `config_new` and is live; `envoy` is the
/// config pointer Envoy passed to the hook; an answer's buffers are the
/// ones Envoy passed to it.
unsafe fn dispatch_config(
    hook: &str,
    envoy: ConfigEnvoyPtr,
    config: ConfigModulePtr,
    event: ConfigEvent,
) {
    // SAFETY: as the caller promises.
    let Some(c) = (unsafe { config.cast::<Configured>().as_ref() }) else {
        return;
    };
    let run = |e: abi::Config<'_>| {
        // SAFETY: an answer's buffers are Envoy's for this hook (the caller).
        unsafe { c.kind.on(&e, event) }
    };
    guard(hook, Scope::Config, Some(&c.life), (), || {
        // SAFETY: Envoy's pointer for this hook, the hook's only handle.
        unsafe { abi::Config::in_hook(envoy, run) }
    });
}

impl FilterConfig {
    /// `event` on this config, on the main thread.
    ///
    /// # Safety
    /// An answer's buffers are the ones Envoy passed to the running hook.
    unsafe fn on(&self, envoy: &abi::Config<'_>, event: ConfigEvent) {
        match event {
            ConfigEvent::Tick => self.tick(envoy),
            ConfigEvent::Answered {
                id,
                headers,
                headers_size,
                body,
                body_size,
            } => {
                let Some(max_body) = self.max_answer_body() else {
                    return;
                };
                // SAFETY: the buffers Envoy passed to this hook (the caller).
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
                self.answered(envoy, id, &answer);
            }
        }
    }

    fn tick(&self, envoy: &abi::Config<'_>) {
        match self {
            FilterConfig::Drain(dc) => dc.tick(envoy),
            FilterConfig::Consumer(kc) => kc.tick(envoy),
            FilterConfig::Provider(pc) => pc.tick(envoy),
            #[cfg(feature = "panic-probe")]
            FilterConfig::PanicProbe => {}
            #[cfg(feature = "bench-floor")]
            FilterConfig::BenchFloor => {}
        }
    }

    /// The most of a callout's answer body this config reads; None: it
    /// makes no callouts.
    fn max_answer_body(&self) -> Option<usize> {
        match self {
            FilterConfig::Drain(_) => Some(graceful_core::drain::filter::MAX_ANSWER_BODY),
            FilterConfig::Consumer(_) => Some(graceful_core::consumer::decisions::MAX_ADMIN_BODY),
            _ => None,
        }
    }

    fn answered(&self, envoy: &abi::Config<'_>, id: u64, answer: &CalloutAnswer) {
        match self {
            FilterConfig::Drain(dc) => dc.callout_done(envoy, id, answer),
            FilterConfig::Consumer(kc) => kc.callout_done(envoy, id, answer),
            _ => {}
        }
    }
}

/// Refuses an Envoy of another dynamic-module ABI, then resolves the
/// callbacks; null (Envoy refuses the module) with one line on stderr,
/// which Envoy logs to as well (its own log callback may be what is
/// missing).
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const u8 {
    let refused = crate::envoy_version::check(abi::abi_version(), abi::ENVOY_BUILT_FOR).or_else(|| {
        // SAFETY: the check above found this Envoy's ABI to be ours.
        unsafe { abi::resolve_callbacks() }.err().map(|missing| {
            format!(
                "graceful: this Envoy lacks {missing}, a callback of dynamic-module ABI {} (Envoy {}): refused; use the .wasm filters",
                abi::abi_version(),
                abi::ENVOY_BUILT_FOR,
            )
        })
    });
    match refused {
        None => abi::ABI_VERSION.as_ptr(),
        Some(line) => {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "{line}");
            std::ptr::null()
        }
    }
}

/// The config of filter `name` from its JSON; Err names the field, or the
/// unknown name.
fn configure(envoy: &abi::Config<'_>, name: &str, json: &[u8]) -> Result<FilterConfig, String> {
    match name {
        "graceful_provider" => provider::Config::new(envoy, json).map(FilterConfig::Provider),
        "graceful_drain" => drain::Config::new(envoy, json).map(FilterConfig::Drain),
        #[cfg(feature = "panic-probe")]
        "graceful_panic_probe" => Ok(FilterConfig::PanicProbe),
        #[cfg(feature = "bench-floor")]
        "graceful_bench_floor" => Ok(FilterConfig::BenchFloor),
        "graceful_consumer" => consumer::Config::new(envoy, json, false).map(FilterConfig::Consumer),
        "graceful_consumer:upstream" => {
            consumer::Config::new(envoy, json, true).map(FilterConfig::Consumer)
        }
        other => Err(format!(
            "unknown filter_name {other:?}: this module has graceful_provider, graceful_drain, graceful_consumer and graceful_consumer:upstream"
        )),
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
    guard(
        "config_new",
        Scope::Lifecycle,
        None,
        std::ptr::null(),
        || {
            // SAFETY: valid for this call.
            let (name, json) = unsafe { (name.copied(), config.copied()) };
            let name = String::from_utf8_lossy(&name).into_owned();
            // SAFETY: Envoy's config pointer for this call, its only handle.
            let made =
                unsafe { abi::Config::in_hook(envoy, |envoy| configure(&envoy, &name, &json)) };
            match made {
                Ok(kind) => {
                    abi::log(
                        abi::LOG_INFO,
                        &format!(
                            "{name} {} (native): configured",
                            graceful_core::build_version!()
                        ),
                    );
                    Box::into_raw(Box::new(Configured {
                        kind,
                        life: Life::default(),
                    }))
                    .cast::<std::ffi::c_void>()
                    .cast_const()
                }
                Err(e) => {
                    abi::log(abi::LOG_ERROR, &format!("{name}: {e}"));
                    std::ptr::null()
                }
            }
        },
    )
}

/// # Safety
/// `ptr` came from `config_new` and is destroyed once.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(ptr: ConfigModulePtr) {
    guard("config_destroy", Scope::Lifecycle, None, (), || {
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
    guard(
        "filter_new",
        Scope::Lifecycle,
        None,
        std::ptr::null(),
        || {
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
        },
    )
}

/// # Safety
/// Envoy's pointers for a live stream.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    envoy: FilterEnvoyPtr,
    module: FilterModulePtr,
    end_of_stream: bool,
) -> u32 {
    let event = Event::RequestHeaders { end_of_stream };
    // SAFETY: a live filter.
    unsafe { dispatch("request_headers", envoy, module, event) }
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
    unsafe { dispatch("response_headers", envoy, module, Event::ResponseHeaders) }
}

/// # Safety
/// Envoy's pointers for a live stream.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    envoy: FilterEnvoyPtr,
    module: FilterModulePtr,
) -> u32 {
    // SAFETY: a live filter.
    unsafe { dispatch("response_trailers", envoy, module, Event::ResponseTrailers) }
}

/// # Safety
/// Envoy's pointers for a live stream.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    envoy: FilterEnvoyPtr,
    module: FilterModulePtr,
) {
    // SAFETY: a live filter.
    unsafe { dispatch("stream_complete", envoy, module, Event::StreamComplete) };
}

/// # Safety
/// `module` came from `filter_new` and is destroyed once.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_destroy(module: FilterModulePtr) {
    guard("filter_destroy", Scope::Lifecycle, None, (), || {
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
    unsafe { dispatch("scheduled", envoy, module, Event::Scheduled) };
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
    unsafe { dispatch_config("config_scheduled", envoy, config, ConfigEvent::Tick) }
}

/// An answer to a config's callout (the drain's admin poll or on_drained,
/// the consumer's membership refresh or probe).
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
    let event = ConfigEvent::Answered {
        id: callout_id,
        headers,
        headers_size,
        body,
        body_size,
    };
    // SAFETY: a live config; the buffers Envoy passed to this call.
    unsafe { dispatch_config("config_http_callout_done", envoy, config, event) }
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
