//! `graceful-hook`: see the library's documentation for the commands.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match graceful_hook::parse(&args) {
        Ok(hook) => graceful_hook::run(&hook),
        Err(e) => {
            eprintln!("graceful-hook: {e}\n{}", graceful_hook::USAGE);
            ExitCode::from(2)
        }
    }
}
