//! Socket options the daemon's netlink sockets share: a receive buffer as large as
//! asked, so that bursts of notifications queue rather than overflow.

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
