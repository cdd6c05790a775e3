//! Process memory: what users of local LLM apps ask about first after speed.

/// Resident memory of this process now, in bytes.
pub fn resident_bytes() -> Option<u64> {
    memory_stats::memory_stats().map(|stats| stats.physical_mem as u64)
}

/// The highest resident memory since start or since [`reset_peak`], in bytes.
///
/// On Linux the kernel tracks it (`VmHWM`), so short spikes between our samples count too.
/// Elsewhere the current value is the best we have.
pub fn peak_resident_bytes() -> Option<u64> {
    linux_status_kib("VmHWM:")
        .map(|kib| kib * 1024)
        .or_else(resident_bytes)
}

/// Starts a new peak measurement, so that loading and generating can be measured apart.
/// Returns false where the platform cannot reset the peak.
pub fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Hands memory the process has freed back to the system. glibc keeps freed memory mapped
/// for reuse, so after a burst (a checkpoint read, a flood of connections) the process
/// would otherwise stay at its peak.
pub fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns unused memory of the allocator's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn linux_status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Memory the system can still give without swapping (Linux's `MemAvailable`), in bytes.
pub fn available_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemAvailable:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|kib| kib * 1024)
}

pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_remembers_memory_already_freed() {
        let block = vec![1u8; 64 << 20];
        std::hint::black_box(&block);
        let with_block = resident_bytes().expect("resident memory is readable here");
        drop(block);
        let peak = peak_resident_bytes().expect("peak memory is readable here");
        // Compared with the resident size while the block was held, not with the peak before
        // it: other tests in this process may have peaked higher already. The kernel keeps
        // resident-page counts per CPU and sums them approximately, so the two reads may
        // differ by a few hundred KiB, never by megabytes; a peak that were only the current
        // size would be 64 MiB short.
        let counter_slack = 4 << 20;
        assert!(
            peak + counter_slack >= with_block,
            "peak {peak} below the {with_block} resident while the block was held"
        );
    }
}
