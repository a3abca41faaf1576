//! The lowest real-time priority for the threads that follow the kernel: the daemon's
//! mirror (which publishes each change) and its netlink receivers.
//!
//! A change's lag is the time from its notification to its publication. On a router
//! whose few CPUs the kernel's own work of that change holds (a link going down walks
//! its routes; a nexthop object replaced frees the state of every route that used it),
//! a mirror at the normal priority waits on the run queue for a scheduler tick, 4 ms,
//! now and then: its work takes a tenth of a millisecond. At the lowest real-time
//! priority (`SCHED_FIFO` 1) it runs as soon as it wakes, ahead of every normal thread,
//! and behind every other real-time one (the kernel's own real-time threads are higher).
//! The kernel's throttling of real-time threads (95% of each second, by default) still
//! leaves the CPU to the rest should a real-time thread spin.
//!
//! The priority is asked with `SCHED_RESET_ON_FORK`: a thread the real-time one starts
//! (a sync's dump reader and compile threads) runs at the normal priority, so that only
//! the threads named here are real-time. And a sync runs at the normal priority
//! ([`normal_while`]): its mirror thread stages each batch of the dump as it comes, and
//! at real-time it would take a CPU from the dump's reader and the compile whenever it
//! has one (a sync measured 1.8 times the kernel's dump once in three runs that way,
//! against 1.2 at the normal priority).
//!
//! Setting it needs `CAP_SYS_NICE` (or a `RLIMIT_RTPRIO` of at least 1, which only a
//! process with `CAP_SYS_RESOURCE`, or systemd's `LimitRTPRIO`, raises: containers
//! often lack it), which the daemon keeps for the threads it starts after setup.

use std::io;

/// The real-time priority asked: the lowest.
pub const LOWEST_REALTIME: i32 = 1;

/// Makes the calling thread (only it) real-time at [`LOWEST_REALTIME`], the threads it
/// starts from now on at the normal priority.
pub fn make_this_thread_realtime() -> io::Result<()> {
    let param = libc::sched_param {
        sched_priority: LOWEST_REALTIME,
    };
    // SAFETY: pid 0 names the calling thread; `param` is a live `sched_param` the call
    // only reads.
    let r = unsafe {
        libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param)
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Runs `work` with the calling thread at the normal priority, then makes it real-time
/// again if it was (a failure to is ignored: the thread goes on at the normal priority).
pub fn normal_while<T>(work: impl FnOnce() -> T) -> T {
    let was = this_thread_policy().is_ok_and(|(policy, _)| policy == "SCHED_FIFO");
    if was {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: pid 0 names the calling thread; `param` is a live `sched_param` the
        // call only reads.
        let _ = unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) };
    }
    let done = work();
    if was {
        let _ = make_this_thread_realtime();
    }
    done
}

/// The calling thread's scheduling policy, as `sched(7)` names it (`SCHED_FIFO`,
/// `SCHED_OTHER`, ...), and its real-time priority (0 for a normal thread).
pub fn this_thread_policy() -> io::Result<(&'static str, i32)> {
    // SAFETY: pid 0 names the calling thread; the call takes no pointer.
    let policy = unsafe { libc::sched_getscheduler(0) };
    if policy < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 names the calling thread; `param` is a live `sched_param` it writes.
    if unsafe { libc::sched_getparam(0, &mut param) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let name = match policy & !libc::SCHED_RESET_ON_FORK {
        libc::SCHED_OTHER => "SCHED_OTHER",
        libc::SCHED_FIFO => "SCHED_FIFO",
        libc::SCHED_RR => "SCHED_RR",
        libc::SCHED_BATCH => "SCHED_BATCH",
        libc::SCHED_IDLE => "SCHED_IDLE",
        _ => "another policy",
    };
    Ok((name, param.sched_priority))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread made real-time is `SCHED_FIFO` 1, but normal while it works at the
    /// normal priority; a thread it starts is not; the thread that asked nothing stays
    /// as it was.
    #[test]
    #[ignore = "needs root: CAP_SYS_NICE for a real-time priority"]
    fn only_the_asking_thread_is_made_realtime() {
        let before = this_thread_policy().unwrap();
        let (own, child) = std::thread::spawn(|| {
            make_this_thread_realtime().unwrap();
            let child = std::thread::spawn(|| this_thread_policy().unwrap())
                .join()
                .unwrap();
            let working = normal_while(|| this_thread_policy().unwrap());
            ((this_thread_policy().unwrap(), working), child)
        })
        .join()
        .unwrap();
        assert_eq!(own.0, ("SCHED_FIFO", LOWEST_REALTIME));
        assert_eq!(own.1, ("SCHED_OTHER", 0), "normal while working");
        assert_eq!(child, ("SCHED_OTHER", 0), "reset on fork");
        assert_eq!(this_thread_policy().unwrap(), before);
    }
}
