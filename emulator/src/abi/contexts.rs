//! The effective context: which of the VM's contexts the hostcalls that
//! follow act on.

use super::{status, with_world, Hc, BAD_ARGUMENT, C};

pub(super) fn proxy_set_effective_context(c: &mut C, id: i32) -> Hc {
    with_world(c, |w, vm| {
        let state = &mut w.vms[vm];
        let id = id as u32;
        if !state.contexts.contains_key(&id) {
            return Err(status(
                BAD_ARGUMENT,
                format!("{id}: no such context (gone?)"),
            ));
        }
        if let Some(active) = state.active.as_mut() {
            active.effective = id;
        }
        Ok(id.to_string())
    })
}
