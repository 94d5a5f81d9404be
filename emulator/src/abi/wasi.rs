//! WASI preview1: just what a Rust `wasm32-wasip1` cdylib needs to start
//! (stdout and stderr as log lines, random bytes), and the clocks; the
//! rest (environ, `proc_exit`) are one-liners in the linker.

use crate::world::{show, Level, LogLine};

use super::memory::{read, write, write_u32};
use super::{with_world, Hc, C};

pub(super) fn fd_write(c: &mut C, fd: i32, iovs: i32, iovs_len: i32, nwritten_ptr: i32) -> Hc {
    let list = read(c, iovs, iovs_len.saturating_mul(8))?;
    let mut data = Vec::new();
    for iov in list.chunks_exact(8) {
        let ptr = i32::from_le_bytes([iov[0], iov[1], iov[2], iov[3]]);
        let len = i32::from_le_bytes([iov[4], iov[5], iov[6], iov[7]]);
        data.extend(read(c, ptr, len)?);
    }
    write_u32(c, nwritten_ptr, data.len() as u32)?;
    let name = c.data().name.clone();
    // Whole lines become log lines: a Rust panic message arrives here.
    with_world(c, |w, vm| {
        w.vms[vm].stdio.extend_from_slice(&data);
        while let Some(nl) = w.vms[vm].stdio.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = w.vms[vm].stdio.drain(..=nl).collect();
            w.logs.push(LogLine {
                vm: name.clone(),
                level: Level::Critical,
                message: format!("fd {fd}: {}", String::from_utf8_lossy(&line).trim_end()),
            });
        }
    });
    Ok(format!("fd {fd}, {}", show(&data)))
}

pub(super) fn random_get(c: &mut C, ptr: i32, len: i32) -> Hc {
    let mut buf = vec![0u8; len as u32 as usize];
    with_world(c, |w, _| w.random(&mut buf));
    write(c, ptr as u32, &buf)?;
    Ok(format!("{} bytes", buf.len()))
}

/// WASI errno ENOTSUP: cpp-host's answer for the CPU-time clocks.
pub(super) const ENOTSUP: i32 = 58;

/// `clock_time_get` as cpp-host serves it (`exports.cc`): id 0, realtime,
/// is the wall clock (`getCurrentTimeNanoseconds`); 1, monotonic, the
/// monotonic clock (`getMonotonicTimeNanoseconds`); any other id is
/// ENOTSUP (None here). The precision is ignored, as there.
pub(super) fn clock_time_get(c: &mut C, id: i32, ptr: i32) -> Option<Hc> {
    let now = with_world(c, |w, _| match id {
        0 => Some(w.wall_ns()),
        1 => Some(w.now_ns),
        _ => None,
    })?;
    Some(write(c, ptr as u32, &now.to_le_bytes()).map(|()| format!("clock {id}")))
}
