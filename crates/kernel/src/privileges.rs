//! The daemon's privileges, cut after setup to what its work goes on needing: the
//! capabilities it names are kept, every other one leaves every set (the bounding set
//! too, so that nothing it runs gets them back), and `no_new_privs` is set. Capabilities
//! are a thread's: a thread started after the cut has only what is kept, one started
//! before keeps what it had (the daemon cuts before it starts any).

use std::io;

/// A capability, by its number in the kernel's `capability.h`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capability(pub u32);

/// `CAP_CHOWN`.
pub const CHOWN: Capability = Capability(0);
/// `CAP_NET_ADMIN`: netlink's dumps of the firewall and connections, a socket's receive
/// buffer past the system's bound, XDP and traffic-control programs attached.
pub const NET_ADMIN: Capability = Capability(12);
/// `CAP_NET_RAW`: `AF_PACKET` and AF_XDP sockets.
pub const NET_RAW: Capability = Capability(13);
/// `CAP_IPC_LOCK`: AF_XDP's frames pinned past `RLIMIT_MEMLOCK`.
pub const IPC_LOCK: Capability = Capability(14);
/// `CAP_SYS_ADMIN`.
pub const SYS_ADMIN: Capability = Capability(21);
/// `CAP_SYS_NICE`: a real-time priority for the workers.
pub const SYS_NICE: Capability = Capability(23);
/// `CAP_BPF`: BPF programs and maps made (since Linux 5.8; before it `CAP_SYS_ADMIN`).
pub const BPF: Capability = Capability(39);

impl Capability {
    /// Its name as `capabilities(7)` writes it, lower case without `cap_`.
    pub fn name(self) -> String {
        const NAMES: [&str; 41] = [
            "chown",
            "dac_override",
            "dac_read_search",
            "fowner",
            "fsetid",
            "kill",
            "setgid",
            "setuid",
            "setpcap",
            "linux_immutable",
            "net_bind_service",
            "net_broadcast",
            "net_admin",
            "net_raw",
            "ipc_lock",
            "ipc_owner",
            "sys_module",
            "sys_rawio",
            "sys_chroot",
            "sys_ptrace",
            "sys_pacct",
            "sys_admin",
            "sys_boot",
            "sys_nice",
            "sys_resource",
            "sys_time",
            "sys_tty_config",
            "mknod",
            "lease",
            "audit_write",
            "audit_control",
            "setfcap",
            "mac_override",
            "mac_admin",
            "syslog",
            "wake_alarm",
            "block_suspend",
            "audit_read",
            "perfmon",
            "bpf",
            "checkpoint_restore",
        ];
        NAMES
            .get(self.0 as usize)
            .map_or_else(|| format!("capability {}", self.0), |n| n.to_string())
    }

    fn bit(self) -> u64 {
        1u64.checked_shl(self.0).unwrap_or(0)
    }
}

/// The mask of the capabilities `caps`.
pub fn mask(caps: &[Capability]) -> u64 {
    caps.iter().fold(0, |m, c| m | c.bit())
}

/// The highest capability this kernel knows.
pub fn last() -> io::Result<Capability> {
    let text = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")?;
    text.trim()
        .parse()
        .map(Capability)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("cap_last_cap: {e}")))
}

#[repr(C)]
struct Header {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Data {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// `_LINUX_CAPABILITY_VERSION_3`: 64-bit sets, in two halves.
const VERSION_3: u32 = 0x2008_0522;

/// The calling thread's sets: effective, permitted, inheritable.
fn get() -> io::Result<(u64, u64, u64)> {
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: `capget` reads the live header and writes two `Data` (the version 3
    // layout) into the live array it is given; it keeps neither pointer.
    let done = unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut header as *mut Header,
            data.as_mut_ptr(),
        )
    };
    if done != 0 {
        return Err(io::Error::last_os_error());
    }
    let join = |f: fn(&Data) -> u32| u64::from(f(&data[0])) | u64::from(f(&data[1])) << 32;
    Ok((
        join(|d| d.effective),
        join(|d| d.permitted),
        join(|d| d.inheritable),
    ))
}

/// Sets the calling thread's sets.
fn set(effective: u64, permitted: u64, inheritable: u64) -> io::Result<()> {
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let half = |m: u64, k: u32| (m >> (32 * k)) as u32;
    let data = [0, 1].map(|k| Data {
        effective: half(effective, k),
        permitted: half(permitted, k),
        inheritable: half(inheritable, k),
    });
    // SAFETY: `capset` reads the live header and the two `Data` of the live array (the
    // version 3 layout); it keeps neither pointer.
    let done =
        unsafe { libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) };
    if done != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `prctl(option, arg)`, its error if it fails.
fn prctl(option: libc::c_int, arg: libc::c_ulong) -> io::Result<()> {
    // SAFETY: these `prctl` options (bounding set, ambient set, no_new_privs) take plain
    // integers and no pointer.
    let done = unsafe {
        libc::prctl(
            option,
            arg,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if done != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Keeps the calling thread's capabilities `keep` (those of them it has) and drops every
/// other one from its effective, permitted and inheritable sets, its ambient set and
/// (where it may: with `CAP_SETPCAP`) the bounding set; then sets `no_new_privs`. The
/// capabilities kept and held.
pub fn keep_only(keep: &[Capability]) -> io::Result<u64> {
    let keep = mask(keep);
    let (effective, permitted, _) = get()?;
    // (Without an ambient set, an old kernel: nothing to clear.)
    let _ = prctl(
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
    );
    if effective & mask(&[Capability(8)]) != 0 {
        for cap in 0..=last()?.0 {
            if keep & Capability(cap).bit() == 0 {
                prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap))?;
            }
        }
    }
    let kept = permitted & keep;
    set(kept, kept, 0)?;
    prctl(libc::PR_SET_NO_NEW_PRIVS, 1)?;
    Ok(kept)
}

/// The sets a task's `status` file reports (`CapEff`, `CapPrm`, `CapInh`, `CapBnd`,
/// `CapAmb`), by name.
pub fn from_status(status: &str) -> Vec<(String, u64)> {
    status
        .lines()
        .filter_map(|l| {
            let (name, value) = l.split_once(':')?;
            let set = name.strip_prefix("Cap")?;
            Some((set.to_string(), u64::from_str_radix(value.trim(), 16).ok()?))
        })
        .collect()
}

/// What a thread holds.
#[derive(Clone, Debug)]
pub struct ThreadPrivileges {
    /// Its sets as its status file reports them ([`from_status`]).
    pub sets: Vec<(String, u64)>,
    /// Whether `no_new_privs` is set.
    pub no_new_privs: bool,
}

/// What each thread of process `pid` holds.
pub fn of_threads(pid: u32) -> io::Result<Vec<ThreadPrivileges>> {
    let mut threads = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let status = std::fs::read_to_string(task?.path().join("status"))?;
        let no_new_privs = status.lines().any(|l| {
            l.split_once(':')
                .is_some_and(|(k, v)| k == "NoNewPrivs" && v.trim() == "1")
        });
        threads.push(ThreadPrivileges {
            sets: from_status(&status),
            no_new_privs,
        });
    }
    Ok(threads)
}

/// The names of the capabilities in `mask`.
pub fn names(mask: u64) -> Vec<String> {
    (0..64)
        .filter(|&c| mask >> c & 1 != 0)
        .map(|c| Capability(c).name())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the calling thread holds is what its status file reports.
    #[test]
    fn the_sets_read_are_the_status_files() {
        let (effective, permitted, inheritable) = get().expect("capget");
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let sets = from_status(&status);
        let of = |n: &str| sets.iter().find(|(s, _)| s == n).map(|s| s.1);
        assert_eq!(of("Eff"), Some(effective));
        assert_eq!(of("Prm"), Some(permitted));
        assert_eq!(of("Inh"), Some(inheritable));
    }

    /// In a thread of its own (capabilities are a thread's): what is kept stays, the rest
    /// goes from every set, the bounding set too where it may, and a thread it starts
    /// holds no more.
    #[test]
    fn a_thread_keeps_only_what_it_names() {
        std::thread::spawn(|| {
            let (_, before, _) = get().unwrap();
            let kept = keep_only(&[NET_ADMIN, NET_RAW]).expect("keep_only");
            assert_eq!(kept, before & mask(&[NET_ADMIN, NET_RAW]));
            let (effective, permitted, inheritable) = get().unwrap();
            assert_eq!((effective, permitted, inheritable), (kept, kept, 0));
            let sets = from_status(&std::fs::read_to_string("/proc/thread-self/status").unwrap());
            for (set, m) in &sets {
                match set.as_str() {
                    // Dropped from the bounding set only with CAP_SETPCAP (root).
                    "Bnd" if before & mask(&[Capability(8)]) == 0 => {}
                    _ => assert_eq!(m & !mask(&[NET_ADMIN, NET_RAW]), 0, "Cap{set}: {m:x}"),
                }
            }
            let child = std::thread::spawn(|| get().unwrap()).join().unwrap();
            assert_eq!(child, (kept, kept, 0));
            // Nothing regained: asked for again, the others stay gone.
            assert_eq!(keep_only(&[NET_ADMIN, NET_RAW, SYS_ADMIN]).unwrap(), kept);
        })
        .join()
        .expect("the thread");
    }

    #[test]
    fn names_and_masks_agree() {
        assert_eq!(
            names(mask(&[NET_ADMIN, BPF, CHOWN])),
            ["chown", "net_admin", "bpf"]
        );
        assert_eq!(SYS_NICE.name(), "sys_nice");
        assert_eq!(Capability(63).name(), "capability 63");
    }
}
