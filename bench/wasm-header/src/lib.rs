//! `make bench` only: the floor. A Rust proxy-wasm filter that adds one
//! response header, the same job as the bench's Lua filter. Whatever a set
//! of these costs against no filter is what Envoy's wasm host charges any
//! filter for entering the VM on each stream, before the filter does work.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(HeaderRoot) });
}}

struct HeaderRoot;

impl Context for HeaderRoot {}

impl RootContext for HeaderRoot {
    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(AddHeader))
    }
}

struct AddHeader;

impl Context for AddHeader {}

impl HttpContext for AddHeader {
    fn on_http_response_headers(&mut self, _: usize, _: bool) -> Action {
        self.add_http_response_header("x-wasm", "true");
        Action::Continue
    }
}
