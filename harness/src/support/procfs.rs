//! What Linux's `/proc` says of a running process: its resident size (the
//! demo's consumer, the bench's Envoy) and the CPU time it has used (the
//! bench's cost per request).

/// Resident set size of a process, in KiB.
pub fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// CPU time a process has used so far (user + system), µs.
pub fn cpu_us(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| stat_cpu_us(&s))
        .unwrap_or(0)
}

/// CPU time one thread of a process has used so far, µs: `tid` == `pid` is
/// the main thread (Envoy's, which runs the admin and every root context).
pub fn thread_cpu_us(pid: u32, tid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"))
        .ok()
        .and_then(|s| stat_cpu_us(&s))
        .unwrap_or(0)
}

/// utime + stime of a `/proc/PID/stat` line, µs. The fields after the
/// command name's last `)` (the name may hold one) start with the state;
/// utime is the 12th and stime the 13th, in clock ticks (USER_HZ, 100).
fn stat_cpu_us(stat: &str) -> Option<u64> {
    const TICK_US: u64 = 10_000;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks * TICK_US)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_cpu_time_from_proc_stat() {
        let line = "4242 (envoy (main)) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 31 0 0 20 0 9 0";
        assert_eq!(stat_cpu_us(line), Some(281 * 10_000));
        assert_eq!(stat_cpu_us("garbage"), None);
    }
}
