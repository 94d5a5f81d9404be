//! Finding and compiling the filters' `.wasm` files, once per test process.

use std::path::PathBuf;
use std::sync::OnceLock;

use wasmtime::{Config, Engine, InstancePre, Module, OptLevel, Strategy};

use super::abi::VmData;

/// One of the three filters, as built by `make build` into `dist/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Filter {
    Provider,
    Drain,
    Consumer,
}

impl Filter {
    /// The plugin name (`graceful_drain`).
    pub fn name(self) -> &'static str {
        match self {
            Filter::Provider => "graceful_provider",
            Filter::Drain => "graceful_drain",
            Filter::Consumer => "graceful_consumer",
        }
    }

    pub(crate) fn short(self) -> &'static str {
        match self {
            Filter::Provider => "provider",
            Filter::Drain => "drain",
            Filter::Consumer => "consumer",
        }
    }

    /// `$GRACEFUL_DIST/<name>.wasm`, by default the workspace's `dist/`.
    pub fn path(self) -> PathBuf {
        let dist = std::env::var_os("GRACEFUL_DIST").map_or_else(
            || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../dist"),
            PathBuf::from,
        );
        dist.join(format!("{}.wasm", self.name()))
    }
}

/// The engine every host shares: compiled code is engine-bound, and
/// compiling a module takes far longer than any test's body.
pub(crate) fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let mut config = Config::new();
        // The filters run a few thousand instructions per callback: compile
        // fast rather than generate fast code. Winch, the baseline compiler,
        // compiles the three modules about 3x faster than Cranelift in a
        // debug build of the tests (a few seconds instead of 20).
        config.strategy(Strategy::Winch);
        config.cranelift_opt_level(OptLevel::None);
        // Fuel counts the wasm operators a callback runs: a cost that does
        // not move with the host's load (`Host::fuel_used`, pinned in
        // tests/abi_cost.rs). Every store starts with all the fuel there is.
        config.consume_fuel(true);
        Engine::new(&config).unwrap_or_else(|e| panic!("wasmtime engine: {e}"))
    })
}

/// The compiled module of `filter`, with its imports resolved against the
/// test host's hostcalls, ready to instantiate. Built on first use in this
/// process. Not test state: compiled code and host-function definitions are
/// immutable; every VM copy gets its own instance and store. Each filter
/// has its own cell, so tests needing different filters build them in
/// parallel.
pub(crate) fn prepared(filter: Filter) -> InstancePre<VmData> {
    static PROVIDER: OnceLock<InstancePre<VmData>> = OnceLock::new();
    static DRAIN: OnceLock<InstancePre<VmData>> = OnceLock::new();
    static CONSUMER: OnceLock<InstancePre<VmData>> = OnceLock::new();
    let cell = match filter {
        Filter::Provider => &PROVIDER,
        Filter::Drain => &DRAIN,
        Filter::Consumer => &CONSUMER,
    };
    cell.get_or_init(|| {
        let path = filter.path();
        let bytes = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "cannot read {}: {e}; run `make build` first (or set GRACEFUL_DIST)",
                path.display()
            )
        });
        prepare(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    })
    .clone()
}

/// Compiles `wasm` and links it against the test host's hostcalls.
pub(crate) fn prepare(wasm: &[u8]) -> Result<InstancePre<VmData>, String> {
    let module = Module::new(engine(), wasm).map_err(|e| format!("cannot compile: {e:?}"))?;
    let linker =
        super::abi::linker(engine(), &module).map_err(|e| format!("cannot link: {e:?}"))?;
    linker
        .instantiate_pre(&module)
        .map_err(|e| format!("cannot link: {e:?}"))
}
