//! VM copies and their contexts: starting a module as Envoy does (WASI
//! start-up, the allocator, the root context, `proxy_on_vm_start` and
//! `proxy_on_configure`), creating a stream's context at its first callback,
//! and running one VM callback: recorded in the trace, then what Envoy does
//! after a VM call returns (local replies delivered, new HTTP calls offered
//! to scripted answers).

use wasmtime::{Instance, InstancePre, Store, TypedFunc, WasmParams, WasmResults};

use crate::abi::VmData;
use crate::module::{self, Filter};
use crate::world::{Active, CallAnswer, Callback, Ctx, Deferred, VmState};
use crate::{Host, StartError, Vm};

/// (context, token, headers, body size, trailers).
pub(crate) type CallResponseArgs = (i32, i32, i32, i32, i32);

/// The exports a VM copy is driven through (None if not exported: cpp-host
/// then skips the callback).
pub(crate) struct Exports {
    pub(crate) context_create: Option<TypedFunc<(i32, i32), ()>>,
    pub(crate) vm_start: Option<TypedFunc<(i32, i32), i32>>,
    pub(crate) configure: Option<TypedFunc<(i32, i32), i32>>,
    pub(crate) tick: Option<TypedFunc<i32, ()>>,
    pub(crate) request_headers: Option<TypedFunc<(i32, i32, i32), i32>>,
    pub(crate) request_body: Option<TypedFunc<(i32, i32, i32), i32>>,
    pub(crate) request_trailers: Option<TypedFunc<(i32, i32), i32>>,
    pub(crate) response_headers: Option<TypedFunc<(i32, i32, i32), i32>>,
    pub(crate) response_body: Option<TypedFunc<(i32, i32, i32), i32>>,
    pub(crate) response_trailers: Option<TypedFunc<(i32, i32), i32>>,
    pub(crate) log: Option<TypedFunc<i32, ()>>,
    pub(crate) done: Option<TypedFunc<i32, i32>>,
    pub(crate) delete: Option<TypedFunc<i32, ()>>,
    pub(crate) http_call_response: Option<TypedFunc<CallResponseArgs, ()>>,
}

pub(crate) struct VmHandle {
    pub(crate) store: Store<VmData>,
    pub(crate) ex: Exports,
}

pub(crate) fn typed<P: WasmParams, R: WasmResults>(
    instance: &Instance,
    store: &mut Store<VmData>,
    name: &str,
) -> Result<Option<TypedFunc<P, R>>, String> {
    if instance.get_func(&mut *store, name).is_none() {
        return Ok(None);
    }
    instance
        .get_typed_func::<P, R>(&mut *store, name)
        .map(Some)
        .map_err(|e| format!("export {name} has an unexpected signature: {e}"))
}

/// Root context id of every VM copy (Envoy's first context of a VM).
pub(crate) const ROOT: u32 = 1;

impl Host {
    /// Starts a VM copy of `filter` with this plugin configuration (raw
    /// bytes, as Envoy passes a `StringValue`). Panics if it does not start.
    pub fn start_vm(&mut self, filter: Filter, config: impl AsRef<[u8]>) -> Vm {
        match self.try_start_vm(filter, config) {
            Ok(vm) => vm,
            Err(e) => panic!("{} did not start: {e:?}", filter.name()),
        }
    }

    /// Starts a VM copy; the error says why it did not start.
    pub fn try_start_vm(
        &mut self,
        filter: Filter,
        config: impl AsRef<[u8]>,
    ) -> Result<Vm, StartError> {
        let pre = module::prepared(filter);
        self.start_prepared(filter.short(), filter.name(), pre, config.as_ref())
    }

    /// Starts a VM copy of any proxy-wasm 0.2.1 module (compiled now, not
    /// cached), e.g. a hand-made one that calls particular hostcalls.
    pub fn try_start_module(
        &mut self,
        name: &str,
        wasm: &[u8],
        config: impl AsRef<[u8]>,
    ) -> Result<Vm, StartError> {
        let pre = module::prepare(wasm).map_err(StartError::Load)?;
        self.start_prepared(name, name, pre, config.as_ref())
    }

    pub(crate) fn start_prepared(
        &mut self,
        short: &str,
        plugin: &str,
        pre: InstancePre<VmData>,
        config: &[u8],
    ) -> Result<Vm, StartError> {
        let engine = module::engine();
        let index = self.vms.len();
        let name = {
            let mut w = self.world.borrow_mut();
            let n = w.vms.iter().filter(|v| v.short == short).count();
            let name = format!("{short}#{n}");
            w.vms.push(VmState {
                name: name.clone(),
                short: short.to_string(),
                plugin: plugin.to_string(),
                plugin_config: config.to_vec(),
                vm_config: Vec::new(),
                contexts: Default::default(),
                next_context_id: ROOT + 1,
                active: None,
                tick_period_ms: 0,
                next_tick_ns: None,
                ticks_held: false,
                dead: false,
                next_token: 0,
                stdio: Vec::new(),
            });
            w.note(
                &name,
                format!("start {plugin} ({} config bytes)", config.len()),
            );
            name
        };
        let mut store = Store::new(
            engine,
            VmData {
                world: self.world.clone(),
                vm: index,
                name,
                memory: None,
                alloc: None,
            },
        );
        let load = |e: String| StartError::Load(e);
        store
            .set_fuel(u64::MAX)
            .map_err(|e| load(format!("fuel: {e}")))?;
        let instance = pre
            .instantiate(&mut store)
            .map_err(|e| load(format!("instantiate: {e:?}")))?;
        if instance
            .get_func(&mut store, "proxy_abi_version_0_2_1")
            .is_none()
        {
            return Err(load("not a proxy-wasm 0.2.1 module".into()));
        }
        let memory = instance.get_memory(&mut store, "memory");
        // cpp-host's order: `malloc` first, then the SDK's own allocator.
        let alloc = match typed::<i32, i32>(&instance, &mut store, "malloc").map_err(load)? {
            Some(f) => Some(f),
            None => typed::<i32, i32>(&instance, &mut store, "proxy_on_memory_allocate")
                .map_err(load)?,
        };
        if memory.is_none() || alloc.is_none() {
            return Err(load("module exports no memory or no allocator".into()));
        }
        store.data_mut().memory = memory;
        store.data_mut().alloc = alloc;
        let initialize = typed::<(), ()>(&instance, &mut store, "_initialize").map_err(load)?;
        let main = typed::<(i32, i32), i32>(&instance, &mut store, "main").map_err(load)?;
        let main_void = typed::<(), i32>(&instance, &mut store, "__main_void").map_err(load)?;
        let start = typed::<(), ()>(&instance, &mut store, "_start").map_err(load)?;
        let ex = Exports {
            context_create: typed(&instance, &mut store, "proxy_on_context_create")
                .map_err(load)?,
            vm_start: typed(&instance, &mut store, "proxy_on_vm_start").map_err(load)?,
            configure: typed(&instance, &mut store, "proxy_on_configure").map_err(load)?,
            tick: typed(&instance, &mut store, "proxy_on_tick").map_err(load)?,
            request_headers: typed(&instance, &mut store, "proxy_on_request_headers")
                .map_err(load)?,
            request_body: typed(&instance, &mut store, "proxy_on_request_body").map_err(load)?,
            request_trailers: typed(&instance, &mut store, "proxy_on_request_trailers")
                .map_err(load)?,
            response_headers: typed(&instance, &mut store, "proxy_on_response_headers")
                .map_err(load)?,
            response_body: typed(&instance, &mut store, "proxy_on_response_body").map_err(load)?,
            response_trailers: typed(&instance, &mut store, "proxy_on_response_trailers")
                .map_err(load)?,
            log: typed(&instance, &mut store, "proxy_on_log").map_err(load)?,
            done: typed(&instance, &mut store, "proxy_on_done").map_err(load)?,
            delete: typed(&instance, &mut store, "proxy_on_delete").map_err(load)?,
            http_call_response: typed(&instance, &mut store, "proxy_on_http_call_response")
                .map_err(load)?,
        };
        let context_create = ex.context_create.clone();
        let (vm_start, configure) = (ex.vm_start.clone(), ex.configure.clone());
        self.vms.push(VmHandle { store, ex });
        let trapped = |e: String| StartError::Trapped(e);
        // WASI reactor start-up (cpp-host): `_initialize`, then `main` if
        // any; a command module's `_start` only without `_initialize`.
        if initialize.is_some() {
            self.call(
                index,
                0,
                Callback::Initialize,
                initialize,
                (),
                "_initialize()".into(),
            )
            .map_err(trapped)?;
            if main_void.is_some() {
                self.call(
                    index,
                    0,
                    Callback::Initialize,
                    main_void,
                    (),
                    "__main_void()".into(),
                )
                .map_err(trapped)?;
            } else if main.is_some() {
                self.call(
                    index,
                    0,
                    Callback::Initialize,
                    main,
                    (0, 0),
                    "main(0, 0)".into(),
                )
                .map_err(trapped)?;
            }
        } else if start.is_some() {
            self.call(index, 0, Callback::Initialize, start, (), "_start()".into())
                .map_err(trapped)?;
        }
        self.world.borrow_mut().vms[index]
            .contexts
            .insert(ROOT, Ctx::Root);
        self.call(
            index,
            ROOT,
            Callback::ContextCreate,
            context_create,
            (ROOT as i32, 0),
            format!("proxy_on_context_create({ROOT}, 0)"),
        )
        .map_err(trapped)?;
        let refused = |host: &Host, callback: &'static str| {
            let mut w = host.world.borrow_mut();
            w.vms[index].dead = true;
            w.vms[index].next_tick_ns = None;
            let name = w.vms[index].name.clone();
            StartError::Refused {
                callback,
                logs: w.logs.iter().filter(|l| l.vm == name).cloned().collect(),
            }
        };
        let size = self.world.borrow().vms[index].vm_config.len() as i32;
        let ok = self
            .call(
                index,
                ROOT,
                Callback::VmStart,
                vm_start,
                (ROOT as i32, size),
                format!("proxy_on_vm_start({ROOT}, {size})"),
            )
            .map_err(trapped)?;
        if ok == Some(0) {
            return Err(refused(self, "proxy_on_vm_start"));
        }
        let size = config.len() as i32;
        let ok = self
            .call(
                index,
                ROOT,
                Callback::Configure,
                configure,
                (ROOT as i32, size),
                format!("proxy_on_configure({ROOT}, {size})"),
            )
            .map_err(trapped)?;
        if ok == Some(0) {
            return Err(refused(self, "proxy_on_configure"));
        }
        Ok(Vm(index))
    }

    /// The VM copy's name in logs and the trace (`"drain#1"`).
    pub fn vm_name(&self, vm: Vm) -> String {
        self.world.borrow().vms[vm.0].name.clone()
    }

    /// True if a VM copy trapped or was refused: Envoy would stop using it.
    pub fn is_dead(&self, vm: Vm) -> bool {
        self.world.borrow().vms[vm.0].dead
    }

    pub(crate) fn ensure_context(&mut self, s: usize, j: usize) -> Result<(), String> {
        let (vm, ctx, created) = {
            let w = self.world.borrow();
            let slot = &w.streams[s].chain[j];
            (slot.vm, slot.context_id, slot.created)
        };
        if created {
            return Ok(());
        }
        {
            let mut w = self.world.borrow_mut();
            if w.vms[vm].dead {
                return Err(format!(
                    "{} is dead; stream {s} cannot use it",
                    w.vms[vm].name
                ));
            }
            w.vms[vm].contexts.insert(
                ctx,
                Ctx::Stream {
                    stream: s,
                    filter: j,
                },
            );
            w.streams[s].chain[j].created = true;
        }
        let f = self.vms[vm].ex.context_create.clone();
        self.call(
            vm,
            ctx,
            Callback::ContextCreate,
            f,
            (ctx as i32, ROOT as i32),
            format!("proxy_on_context_create({ctx}, {ROOT})"),
        )?;
        Ok(())
    }

    /// Runs one VM callback with `ctx` as its context, records it in the
    /// trace, and then does what Envoy does after a VM call returns
    /// (deliver local replies, offer new HTTP calls to scripted answers).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn call<P: WasmParams, R: WasmResults + std::fmt::Debug>(
        &mut self,
        vm: usize,
        ctx: u32,
        callback: Callback,
        f: Option<TypedFunc<P, R>>,
        params: P,
        what: String,
    ) -> Result<Option<R>, String> {
        self.call_with(vm, ctx, callback, f, params, what, None)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn call_with<P: WasmParams, R: WasmResults + std::fmt::Debug>(
        &mut self,
        vm: usize,
        ctx: u32,
        callback: Callback,
        f: Option<TypedFunc<P, R>>,
        params: P,
        what: String,
        call_answer: Option<CallAnswer>,
    ) -> Result<Option<R>, String> {
        let name = self.world.borrow().vms[vm].name.clone();
        let Some(f) = f else {
            self.world
                .borrow_mut()
                .note(&name, format!("{what}: not exported, skipped"));
            return Ok(None);
        };
        {
            let mut w = self.world.borrow_mut();
            if w.vms[vm].active.is_some() {
                return Err(format!("{name}: {what} while another call is in progress"));
            }
            w.vms[vm].active = Some(Active {
                callback,
                effective: ctx,
                call_answer,
            });
            w.note(&name, format!("-> {what}"));
        }
        let result = f.call(&mut self.vms[vm].store, params);
        {
            let mut w = self.world.borrow_mut();
            w.vms[vm].active = None;
            match &result {
                Ok(r) => w.note(&name, format!("<- {r:?}")),
                Err(e) => {
                    w.vms[vm].dead = true;
                    w.note(&name, format!("<- TRAP: {e:?}"));
                }
            }
        }
        match result {
            Ok(r) => {
                self.run_deferred()?;
                Ok(Some(r))
            }
            Err(e) => {
                let w = self.world.borrow();
                let stdio: Vec<&str> = w
                    .logs
                    .iter()
                    .filter(|l| l.vm == name && l.message.starts_with("fd "))
                    .map(|l| l.message.as_str())
                    .collect();
                Err(format!(
                    "{name} trapped in {what}: {e:?}{}",
                    if stdio.is_empty() {
                        String::new()
                    } else {
                        format!("\nmodule output:\n{}", stdio.join("\n"))
                    }
                ))
            }
        }
    }

    pub(crate) fn run_deferred(&mut self) -> Result<(), String> {
        loop {
            let next = self.world.borrow_mut().deferred.pop_front();
            match next {
                None => return Ok(()),
                Some(Deferred::LocalReply { stream, filter }) => {
                    self.deliver_local_reply(stream, filter)?
                }
                Some(Deferred::CallMade { call }) => self.offer_call(call)?,
            }
        }
    }
}
