//! Each filter's configuration schema, and its parser, from the command line
//! (needs the `schema` feature; `make schema` and `make unit` run it):
//!
//! - `config_schema write DIR`: writes `DIR/<filter>.schema.json`, the JSON
//!   Schema derived from the filter's configuration types;
//! - `config_schema parse`: reads JSON lines `{"filter": NAME, "text": CONFIG}`
//!   and answers each with a line `{"accepted": true}` or
//!   `{"accepted": false, "field": ..., "reason": ...}`: the filters' own
//!   parser, so tools/check_schema.py can hold the schema against it.

use std::io::{BufRead, Write};
use std::path::Path;

use graceful_core::consumer::config::ConsumerConfig;
use graceful_core::drain::config::DrainConfig;
use graceful_core::provider::config::ProviderConfig;
use graceful_core::shared::config::ConfigError;
use serde_json::{json, Value};

type Fallible<T> = Result<T, Box<dyn std::error::Error>>;

/// A filter, as this tool needs it.
struct Filter {
    name: &'static str,
    schema: fn() -> Value,
    /// Its parser, the config dropped: whether it accepts, and why not.
    parse: fn(&[u8]) -> Result<(), ConfigError>,
}

const FILTERS: [Filter; 3] = [
    Filter {
        name: "graceful_provider",
        schema: ProviderConfig::json_schema,
        parse: |b| ProviderConfig::from_json(b).map(drop),
    },
    Filter {
        name: "graceful_drain",
        schema: DrainConfig::json_schema,
        parse: |b| DrainConfig::from_json(b).map(drop),
    },
    Filter {
        name: "graceful_consumer",
        schema: ConsumerConfig::json_schema,
        parse: |b| ConsumerConfig::from_json(b).map(drop),
    },
];

fn main() -> Fallible<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["write", dir] => write(Path::new(dir)),
        ["parse"] => parse(),
        _ => Err("usage: config_schema write DIR | config_schema parse".into()),
    }
}

fn write(dir: &Path) -> Fallible<()> {
    std::fs::create_dir_all(dir)?;
    for filter in FILTERS {
        let mut text = serde_json::to_string_pretty(&(filter.schema)())?;
        text.push('\n');
        std::fs::write(dir.join(format!("{}.schema.json", filter.name)), text)?;
    }
    Ok(())
}

fn parse() -> Fallible<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for line in std::io::stdin().lock().lines() {
        let request: Value = serde_json::from_str(&line?)?;
        let filter = request["filter"].as_str().unwrap_or_default();
        let Some(known) = FILTERS.iter().find(|f| f.name == filter) else {
            return Err(format!("unknown filter {filter:?}").into());
        };
        let text = request["text"].as_str().ok_or("a request needs a text")?;
        let answer = match (known.parse)(text.as_bytes()) {
            Ok(()) => json!({"accepted": true}),
            Err(e) => json!({"accepted": false, "field": e.field, "reason": e.reason}),
        };
        writeln!(out, "{answer}")?;
        out.flush()?;
    }
    Ok(())
}
