//! graceful_provider: [`filter`] (its callbacks: admission, the closing
//! mark, the report's samples) and [`config`].
//!
//! It has no facade: no sibling room imports it.

pub mod config;
pub mod filter;
