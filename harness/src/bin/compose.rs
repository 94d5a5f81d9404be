//! `compose [--check]`: writes the docker harness (envoy/docker-compose.yaml,
//! its front shape envoy/docker-compose-front.yaml, and envoy/compose/*) from
//! the templates, or with `--check` exits 1 if the committed files are not
//! what it would write.

use std::process::ExitCode;

use graceful_harness::platform::compose;
use graceful_harness::support::envoy::repo_root;

fn main() -> ExitCode {
    let root = repo_root();
    let check = std::env::args().nth(1).as_deref() == Some("--check");
    let result = if check {
        compose::stale(&root)
    } else {
        compose::write(&root)
    };
    match (check, result) {
        (_, Err(e)) => {
            eprintln!("compose: {e}");
            ExitCode::FAILURE
        }
        (true, Ok(stale)) if !stale.is_empty() => {
            eprintln!("compose: out of date (run `make compose`): {stale:?}");
            ExitCode::FAILURE
        }
        (true, Ok(_)) => ExitCode::SUCCESS,
        (false, Ok(written)) => {
            for p in written {
                println!("wrote {}", p.display());
            }
            ExitCode::SUCCESS
        }
    }
}
