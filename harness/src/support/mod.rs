//! Shared test support: what the end-to-end suites, the platform
//! stand-ins and the products all build on. A real Envoy per test and its
//! paths ([`envoy`]), the wasm or native delivery ([`native`]), the
//! template renderer ([`render`]), the test upstream ([`upstream`]), HTTP
//! clients ([`client`]), a consumer sidecar in front of test upstreams
//! ([`mesh`]), front proxies in front of backends with no sidecar
//! ([`front`]), the open-loop load generator ([`load`]), what a rolling run
//! reports ([`run_report`]), what `/proc` says of a process
//! ([`procfs`]), a wall clock stepped in one Envoy alone
//! ([`wall_step`]) and config over a real xDS stream ([`xds`]).

pub mod client;
pub mod envoy;
pub mod front;
pub mod load;
pub mod logged;
pub mod mesh;
pub mod native;
pub mod panels_chart;
pub mod procfs;
pub mod prometheus;
pub mod render;
pub mod run_report;
pub mod share_chart;
pub mod tested_with;
pub mod upstream;
pub mod wall_step;
pub mod xds;
