//! This process's memory as the kernel counts it: its resident bytes (`VmRSS` of
//! `/proc/self/status`), read as they are or after the allocator has given back the free
//! pages it keeps, so that a measurement of what a structure holds is not blurred by what
//! was freed before it.

/// The resident bytes of this process, if the kernel says.
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// [`resident_bytes`] once the allocator has returned its free memory to the system.
pub fn resident_bytes_trimmed() -> Option<u64> {
    // SAFETY: `malloc_trim` only returns free memory to the system; it takes any
    // argument, touches no memory of the caller's, and is thread-safe in glibc.
    unsafe {
        libc::malloc_trim(0);
    }
    resident_bytes()
}
