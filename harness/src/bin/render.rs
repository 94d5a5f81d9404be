//! `render TEMPLATE [NAME=VALUE ...]`: prints an Envoy config template from
//! `envoy/` with its placeholders filled (see `graceful_harness::support::render`).

use std::collections::HashMap;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: render TEMPLATE [NAME=VALUE ...]");
        return ExitCode::from(2);
    };
    let mut values = HashMap::new();
    for arg in args {
        let Some((k, v)) = arg.split_once('=') else {
            eprintln!("render: expected NAME=VALUE, got {arg:?}");
            return ExitCode::from(2);
        };
        values.insert(k.to_string(), v.to_string());
    }
    let template = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("render: {path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    match graceful_harness::support::render::render(&template, &values) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("render: {path}: {e}");
            ExitCode::FAILURE
        }
    }
}
