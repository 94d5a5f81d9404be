//! The tests' upstream is the demo's app (`examples/demo-app`): see its docs
//! for the paths it answers.

pub use demo_app::{App as Upstream, AppConfig, Counters};
