//! Socket options the daemon's sockets need: for its netlink sockets a receive buffer
//! as large as asked, so that bursts of notifications queue rather than overflow; for
//! its control socket's clients, who they are (`SO_PEERCRED`), to say in the log.

use std::io;
use std::os::fd::AsRawFd;

/// Sets a socket's receive buffer to `bytes`: `SO_RCVBUFFORCE` where the process may
/// (as root, past the system's `rmem_max`), else `SO_RCVBUF`, which the kernel caps.
pub fn set_receive_buffer(socket: &impl AsRawFd, bytes: usize) -> io::Result<()> {
    let value = bytes.min(i32::MAX as usize) as libc::c_int;
    for option in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
        // SAFETY: `setsockopt` reads `size_of::<c_int>()` bytes from a pointer to a live
        // `c_int`, on a descriptor the caller's socket owns; it keeps neither.
        let done = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                option,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if done == 0 {
            return Ok(());
        }
    }
    Err(io::Error::last_os_error())
}

/// Who is at the other end of a connected Unix socket, as the kernel recorded it when
/// the peer connected (`SO_PEERCRED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCredentials {
    /// The peer's process.
    pub pid: i32,
    /// Its user.
    pub uid: u32,
    /// Its group.
    pub gid: u32,
}

/// The credentials of the peer of the connected Unix socket `socket`.
pub fn peer_credentials(socket: &impl AsRawFd) -> io::Result<PeerCredentials> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `getsockopt` writes at most `len` bytes (the size of the live `ucred` it is
    // given a pointer to) and the length written to a live `socklen_t`, on a descriptor
    // the caller's socket owns; it keeps neither pointer.
    let done = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if done != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCredentials {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket pair's peer is this process, as the kernel says.
    #[test]
    fn a_peer_is_who_connected() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().expect("a socket pair");
        let peer = peer_credentials(&a).expect("SO_PEERCRED");
        assert_eq!(peer.pid, std::process::id() as i32);
        // The process's own directory is its effective user's and group's.
        use std::os::unix::fs::MetadataExt;
        let me = std::fs::metadata("/proc/self").expect("/proc/self");
        assert_eq!((peer.uid, peer.gid), (me.uid(), me.gid()));
    }
}
