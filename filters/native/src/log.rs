//! Lines in Envoy's log under `[dynamic_modules]`, prefixed with the
//! filter's name as the wasm build's are.

use crate::abi;

pub fn debug(line: &str) {
    abi::log(abi::LOG_DEBUG, line);
}

pub fn info(line: &str) {
    abi::log(abi::LOG_INFO, line);
}

pub fn warn(line: &str) {
    abi::log(abi::LOG_WARN, line);
}

pub fn error(line: &str) {
    abi::log(abi::LOG_ERROR, line);
}
