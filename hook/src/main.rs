//! `graceful-hook`: see the library's documentation for the commands.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `0.3.0-dev+<commit>` on a development build, `0.3.0` on a release.
    if matches!(args.as_slice(), [a] if a == "--version" || a == "version") {
        println!("graceful-hook {}", graceful_core::build_version!());
        return ExitCode::SUCCESS;
    }
    match graceful_hook::parse(&args) {
        Ok(hook) => graceful_hook::run(&hook),
        Err(e) => {
            eprintln!("graceful-hook: {e}\n{}", graceful_hook::USAGE);
            ExitCode::from(2)
        }
    }
}
