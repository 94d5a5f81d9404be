//! Guest memory: reading the module's arguments and writing its results,
//! including values copied into memory the module's own allocator hands out.

use wasmtime::{Error, Memory};

use super::{status, Fail, C, INVALID_MEMORY_ACCESS};

fn memory(c: &C) -> Result<Memory, Fail> {
    c.data()
        .memory
        .ok_or_else(|| status(INVALID_MEMORY_ACCESS, "module exports no memory"))
}

pub(super) fn read(c: &C, ptr: i32, len: i32) -> Result<Vec<u8>, Fail> {
    let mem = memory(c)?;
    let (ptr, len) = (ptr as u32 as usize, len as u32 as usize);
    if ptr.saturating_add(len) > mem.data_size(c) {
        return Err(status(
            INVALID_MEMORY_ACCESS,
            format!("read of {len} bytes at {ptr:#x} is out of bounds"),
        ));
    }
    let mut buf = vec![0; len];
    mem.read(c, ptr, &mut buf)
        .map_err(|e| status(INVALID_MEMORY_ACCESS, e.to_string()))?;
    Ok(buf)
}

pub(super) fn write(c: &mut C, ptr: u32, bytes: &[u8]) -> Result<(), Fail> {
    let mem = memory(c)?;
    mem.write(&mut *c, ptr as usize, bytes).map_err(|e| {
        status(
            INVALID_MEMORY_ACCESS,
            format!("write of {} bytes at {ptr:#x}: {e}", bytes.len()),
        )
    })
}

pub(super) fn write_u32(c: &mut C, ptr: i32, v: u32) -> Result<(), Fail> {
    write(c, ptr as u32, &v.to_le_bytes())
}

/// cpp-host `copyToPointerSize`: allocates guest memory with the module's
/// allocator, copies `bytes` there and stores pointer and size. An empty
/// value is stored as a null pointer (the SDK then sees None).
pub(super) fn copy_out(c: &mut C, bytes: &[u8], ptr_ptr: i32, size_ptr: i32) -> Result<(), Fail> {
    let mut addr = 0u32;
    if !bytes.is_empty() {
        let alloc = c
            .data()
            .alloc
            .clone()
            .ok_or_else(|| Fail::Trap(Error::msg("the module exports no allocator")))?;
        let len = i32::try_from(bytes.len())
            .map_err(|_| status(INVALID_MEMORY_ACCESS, "value larger than 2 GiB"))?;
        addr = alloc.call(&mut *c, len)? as u32;
        if addr == 0 {
            return Err(status(INVALID_MEMORY_ACCESS, "allocator returned null"));
        }
        write(c, addr, bytes)?;
    }
    write_u32(c, ptr_ptr, addr)?;
    write_u32(c, size_ptr, bytes.len() as u32)
}
