//! What the property suites share.

use proptest::test_runner::Config;

/// `cases` per property; `PROPTEST_CASES=n` runs n instead (deeper runs).
pub fn config(cases: u32) -> Config {
    Config {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(cases),
        failure_persistence: None,
        ..Config::default()
    }
}
