//! graceful_provider natively: the callbacks of
//! [`graceful_core::filter::provider`] over the module's host. A stream
//! Envoy destroys without `stream_complete` leaves the in-flight count at
//! its destruction (the gate must not wait for it forever); its gauge
//! change is owed to the next stream (see `host.rs`).

use graceful_core::filter::provider::{Provider, ProviderStream};
use graceful_core::keys::Owner;

use crate::abi::{self, Stream};
use crate::hooks::code;
use crate::host::{Ids, Native};

pub struct Config {
    provider: Provider,
    ids: Ids,
}

impl Config {
    pub fn new(envoy: abi::Config, json: &[u8]) -> Result<Config, String> {
        let ids = Ids::define(envoy, Owner::Provider);
        let provider = Provider::configure(&Native::config(envoy, &ids), json)?;
        Ok(Config { provider, ids })
    }

    pub fn request_headers(&self, st: &ProviderStream, s: Stream) -> u32 {
        code(
            self.provider
                .request_headers(st, &Native::stream(s, &self.ids)),
        )
    }

    pub fn response_headers(&self, st: &ProviderStream, s: Stream) -> u32 {
        code(
            self.provider
                .response_headers(st, &Native::stream(s, &self.ids)),
        )
    }

    pub fn response_trailers(&self, st: &ProviderStream, s: Stream) -> u32 {
        code(
            self.provider
                .response_trailers(st, &Native::stream(s, &self.ids)),
        )
    }

    pub fn stream_complete(&self, st: &ProviderStream, s: Stream) {
        self.provider.stream_end(st, &Native::stream(s, &self.ids));
    }

    pub fn destroy(&self, st: &ProviderStream) {
        self.provider.stream_end(st, &Native::detached(&self.ids));
    }
}
