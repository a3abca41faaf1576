//! Generic receive offload (GRO) on the links fibre reads through `AF_PACKET`.
//!
//! GRO merges a flow's frames into one larger frame before a packet socket sees it. The
//! kernel's own forwarding cuts merged frames apart again on the way out; fibre reads
//! them after the merge, and a frame longer than a buffer is dropped (`truncated`). So
//! the daemon turns GRO off on the links it reads this way, and back on when it stops,
//! through the ethtool ioctl (`SIOCETHTOOL`: `ETHTOOL_GGRO`, `ETHTOOL_SGRO`), as `ethtool
//! -K IF gro off` does. AF_XDP reads frames before GRO and needs none of this.
//!
//! A process killed outright cannot turn GRO back on: the links keep it off.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `ETHTOOL_GGRO`: whether GRO is on.
const ETHTOOL_GGRO: u32 = 0x2b;
/// `ETHTOOL_SGRO`: turn GRO on or off.
const ETHTOOL_SGRO: u32 = 0x2c;

/// The kernel's `struct ethtool_value`.
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// Runs ethtool command `cmd` with `data` on the link named `name` (in this thread's
/// network namespace); the value it gives back.
fn ethtool(name: &str, cmd: u32, data: u32) -> io::Result<u32> {
    let mut req: libc::ifreq = libc::ifreq {
        ifr_name: [0; libc::IFNAMSIZ],
        ifr_ifru: libc::__c_anonymous_ifr_ifru { ifru_ifindex: 0 },
    };
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?}: not a link name"),
        ));
    }
    for (c, b) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *c = b as libc::c_char;
    }
    let mut value = EthtoolValue { cmd, data };
    req.ifr_ifru.ifru_data = (&mut value as *mut EthtoolValue).cast();
    // SAFETY: socket(2) takes no pointers; a non-negative result is a new descriptor
    // that nothing else owns.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by no one else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `req` is a whole `ifreq` holding a NUL-terminated name and, as
    // SIOCETHTOOL reads it, a pointer to `value`, a whole `ethtool_value` that outlives
    // the call; the kernel reads and writes no more than these two.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCETHTOOL, &mut req) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{name}: {e}")));
    }
    Ok(value.data)
}

/// Whether GRO is on on link `name`.
pub fn gro(name: &str) -> io::Result<bool> {
    ethtool(name, ETHTOOL_GGRO, 0).map(|on| on != 0)
}

/// Turns GRO on or off on link `name`.
pub fn set_gro(name: &str, on: bool) -> io::Result<()> {
    ethtool(name, ETHTOOL_SGRO, on as u32).map(|_| ())
}

/// GRO turned off on links that had it on, turned back on when this drops.
#[derive(Debug, Default)]
pub struct GroOff {
    /// The links GRO was turned off on.
    pub links: Vec<String>,
    /// The links whose GRO could not be read or turned off, and why.
    pub failed: Vec<(String, String)>,
}

impl GroOff {
    /// Turns GRO off on each of `names` that has it on. A link that cannot say or
    /// cannot change it is listed in `failed`, and the others still go.
    pub fn turn_off(names: &[String]) -> GroOff {
        let mut off = GroOff::default();
        for name in names {
            match gro(name).and_then(|on| {
                if on {
                    set_gro(name, false).map(|_| on)
                } else {
                    Ok(on)
                }
            }) {
                Ok(true) => off.links.push(name.clone()),
                Ok(false) => {}
                Err(e) => off.failed.push((name.clone(), e.to_string())),
            }
        }
        off
    }
}

impl Drop for GroOff {
    fn drop(&mut self) {
        for name in &self.links {
            let _ = set_gro(name, true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fibre_kernel::netns::Namespace;

    /// Names that are no link's are refused before the kernel is asked.
    #[test]
    fn a_name_no_link_can_have_is_refused() {
        for name in ["", "sixteen-letters!", "a\0b"] {
            let e = gro(name).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{name:?}");
        }
    }

    /// On a veth pair: GRO turned off where it was on and back on when the guard
    /// drops; a link that had it off is left off, and untouched; a missing link is
    /// named among the failures, the others still turned off.
    #[test]
    #[ignore = "needs root: a network namespace and a veth pair"]
    fn gro_goes_off_while_the_guard_lives_and_comes_back() {
        let ns = Namespace::create("gro").unwrap();
        ns.batch("link add g0 type veth peer name g1\nlink set g0 up\nlink set g1 up\n")
            .unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                ns.enter().unwrap();
                set_gro("g0", true).unwrap();
                set_gro("g1", false).unwrap();
                assert!(gro("g0").unwrap() && !gro("g1").unwrap());
                let names = ["g0", "g1", "nowhere"].map(String::from);
                let off = GroOff::turn_off(&names);
                assert_eq!(off.links, ["g0"]);
                assert_eq!(off.failed.len(), 1);
                assert!(off.failed[0].0 == "nowhere" && off.failed[0].1.contains("nowhere"));
                assert!(!gro("g0").unwrap() && !gro("g1").unwrap());
                drop(off);
                assert!(gro("g0").unwrap(), "back on");
                assert!(!gro("g1").unwrap(), "left as it was");
            })
            .join()
            .unwrap()
        });
    }
}
