//! `make native-configs` (with `native_configs`): writes
//! `envoy/native/front-proxy.yaml`, the front proxy in native form (see
//! `graceful_harness::support::front::native_file`).

use std::process::ExitCode;

fn main() -> ExitCode {
    let root = graceful_harness::support::envoy::repo_root();
    let (path, text) = match graceful_harness::support::front::native_file() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("front-native-config: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = std::fs::write(root.join(&path), text) {
        eprintln!("front-native-config: {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    println!("wrote {}", path.display());
    ExitCode::SUCCESS
}
