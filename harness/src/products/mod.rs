//! The products: the library side of `make demo` ([`demo`]: a rolling
//! shutdown of providers under load, and its matrix of scenarios) and
//! `make bench` ([`bench`](mod@bench): what the filters cost against plain Envoy;
//! [`bench_count`]: the same sets' instructions per request, counted under
//! callgrind; [`bench_mesh`]: the consumer at mesh scale).
//! Their binaries are in `src/bin`.

pub mod bench;
pub mod bench_count;
pub mod bench_mesh;
pub mod demo;
