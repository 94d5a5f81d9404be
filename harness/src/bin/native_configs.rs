//! `make native-configs`: writes `envoy/native/*.yaml`, the shipped
//! sidecar configs and the front proxy in native form (see
//! `graceful_harness::support::native` and `support::front::native_file`).

use std::process::ExitCode;

fn main() -> ExitCode {
    let root = graceful_harness::support::envoy::repo_root();
    let files = graceful_harness::support::native::shipped_files().and_then(|mut files| {
        files.push(graceful_harness::support::front::native_file()?);
        Ok(files)
    });
    let files = match files {
        Ok(f) => f,
        Err(e) => {
            eprintln!("native-configs: {e}");
            return ExitCode::FAILURE;
        }
    };
    for (path, text) in files {
        let full = root.join(&path);
        let written = full
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&full, text));
        if let Err(e) = written {
            eprintln!("native-configs: {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("wrote {}", path.display());
    }
    ExitCode::SUCCESS
}
