//! Frames out of a Linux link through an `AF_PACKET` socket, a vector at a time
//! (`sendmmsg`), straight out of the pool's buffers; and one frame at a time in and
//! out, for tests and tools. Workers receive through the socket's ring
//! (`crate::ring`).
//!
//! An `AF_PACKET` socket sees every frame the link receives, beside the kernel, which
//! gets them all as well: with the kernel's forwarding off, the kernel answers what is
//! its own (ARP, neighbour discovery, packets for the host) and drops the rest, which
//! fibre forwards. The socket ignores the frames sent on the link (its own among them),
//! so that nothing sent is read back as received.
//!
//! A socket opened to send hands each frame's unfinished work on to the kernel in a
//! virtio-net header (`PACKET_VNET_HDR`, `crate::offload`): a checksum left partial
//! leaves partial, to be finished by the device or the next host as the kernel's own
//! forwarding leaves it, and a large TCP or UDP packet leaves whole, for the kernel to
//! cut where the way out needs it cut.
//!
//! This is the I/O that works on any link, where AF_XDP (`crate::xsk`) does not.

use crate::offload::{VnetHeader, VNET_HEADER_LEN};
use crate::pool::{BufferId, Pool};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// `ETH_P_ALL`: every protocol, in network order as `socket` and `bind` take it.
const ALL: u16 = (libc::ETH_P_ALL as u16).to_be();

/// `PACKET_VNET_HDR`: a virtio-net header before each frame read or written.
pub(crate) const PACKET_VNET_HDR: libc::c_int = 15;

/// `PACKET_FANOUT_FLAG_IGNORE_OUTGOING`: a fanout group ignores what the link sends.
const FANOUT_FLAG_IGNORE_OUTGOING: libc::c_int = 0x4000;
/// A classic BPF program, each instruction as `(code, jump if true, jump if false, k)`.
pub type ClassicBpf = [(u16, u8, u8, u32)];

/// `PACKET_FANOUT_CBPF`: a classic BPF program picks the group's socket.
const FANOUT_CBPF: libc::c_int = 6;
/// `PACKET_FANOUT_DATA`: the option that gives a group its program.
const FANOUT_DATA: libc::c_int = 22;

/// An `AF_PACKET` socket bound to one link.
#[derive(Debug)]
pub struct PacketSocket {
    fd: OwnedFd,
    ifindex: u32,
    /// Whether each frame sent goes with a virtio-net header.
    vnet: bool,
}

/// Room for the system calls of one vector: made once per worker, reused.
pub struct Batch {
    headers: Vec<libc::mmsghdr>,
    iovecs: Vec<libc::iovec>,
    /// Each frame's virtio-net header, for a socket that sends them.
    vnet: Vec<[u8; VNET_HEADER_LEN]>,
}

impl Default for Batch {
    fn default() -> Batch {
        Batch::new()
    }
}

impl Batch {
    /// Room for vectors of up to 256 frames.
    pub fn new() -> Batch {
        Batch {
            headers: Vec::with_capacity(256),
            iovecs: Vec::with_capacity(512),
            vnet: Vec::with_capacity(256),
        }
    }
}

impl PacketSocket {
    /// A socket on the link of index `ifindex`, not blocking.
    pub fn open(ifindex: u32) -> io::Result<PacketSocket> {
        PacketSocket::open_as(ifindex, ALL)
    }

    /// A socket that only sends on the link of index `ifindex`: bound to no protocol, it
    /// is given no frame to read. Each frame leaves with what its buffer says is left
    /// to do ([`Pool::offload`]), in a virtio-net header.
    pub fn open_for_sending(ifindex: u32) -> io::Result<PacketSocket> {
        let mut socket = PacketSocket::unbound()?;
        set_int(&socket.fd, libc::SOL_PACKET, PACKET_VNET_HDR, 1)?;
        socket.vnet = true;
        socket.bind(ifindex, 0)?;
        Ok(socket)
    }

    /// Joins the socket to fanout group `group` of its network namespace, hashed by flow:
    /// the link's frames are spread over the group's sockets, a flow's to one. With
    /// `steering` (a classic BPF program, [`fibre_conntrack::Owners::steering_program`]),
    /// the program picks the socket instead (`PACKET_FANOUT_CBPF`): the sockets, joined
    /// in the workers' order, each get the packets of the connections their worker owns.
    /// The group ignores the frames the link sends, as the socket alone did
    /// (`PACKET_FANOUT_FLAG_IGNORE_OUTGOING`, Linux 6.2: a group has its own hook, which
    /// the socket's `PACKET_IGNORE_OUTGOING` does not reach); an older kernel refuses
    /// the flag, and the group takes them, which the input stage drops as for another
    /// host.
    pub fn join_fanout(&self, group: u16, steering: Option<&ClassicBpf>) -> io::Result<()> {
        let kind = match steering {
            Some(_) => FANOUT_CBPF,
            None => libc::PACKET_FANOUT_HASH as libc::c_int,
        };
        let arg = group as libc::c_int | kind << 16;
        match set_int(
            &self.fd,
            libc::SOL_PACKET,
            libc::PACKET_FANOUT,
            arg | FANOUT_FLAG_IGNORE_OUTGOING << 16,
        ) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                set_int(&self.fd, libc::SOL_PACKET, libc::PACKET_FANOUT, arg)
            }
            other => other,
        }?;
        match steering {
            Some(program) => attach_program(&self.fd, libc::SOL_PACKET, FANOUT_DATA, program),
            None => Ok(()),
        }
    }

    /// A socket on link `ifindex` for `protocol` (network order; 0: none).
    fn open_as(ifindex: u32, protocol: u16) -> io::Result<PacketSocket> {
        let mut socket = PacketSocket::unbound()?;
        socket.bind(ifindex, protocol)?;
        Ok(socket)
    }

    /// A socket bound to no link yet, not blocking, ignoring the frames sent on the
    /// link it will be bound to.
    pub(crate) fn unbound() -> io::Result<PacketSocket> {
        // SAFETY: socket takes no pointers; the descriptor it returns is checked and
        // then owned by `fd` alone.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        set_int(&fd, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, 1)?;
        // Room for bursts while the worker is busy: some 4,000 full-size frames
        // (the default holds some 200). Forcing it past the system's cap needs
        // CAP_NET_ADMIN; without it, the cap is what the socket gets.
        let room = 8 << 20;
        if set_int(&fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, room).is_err() {
            let _ = set_int(&fd, libc::SOL_SOCKET, libc::SO_RCVBUF, room);
        }
        Ok(PacketSocket {
            fd,
            ifindex: 0,
            vnet: false,
        })
    }

    /// The socket's descriptor, for options set from elsewhere in the crate.
    pub(crate) fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Binds the socket to every protocol of link `ifindex`: from now on it is given
    /// the link's frames.
    pub(crate) fn bind_all(&mut self, ifindex: u32) -> io::Result<()> {
        self.bind(ifindex, ALL)
    }

    /// Binds the socket to one EtherType of link `ifindex` (`ETH_P_IP`, `ETH_P_IPV6`):
    /// such a socket is handed a frame after the link's traffic-control ingress, so it
    /// never sees a frame a program there redirected; one bound to every protocol is
    /// handed each frame before.
    pub(crate) fn bind_ethertype(&mut self, ifindex: u32, ethertype: u16) -> io::Result<()> {
        self.bind(ifindex, ethertype.to_be())
    }

    /// Binds the socket to `protocol` (network order; 0: none) on link `ifindex`.
    fn bind(&mut self, ifindex: u32, protocol: u16) -> io::Result<()> {
        let fd = &self.fd;
        // SAFETY: sockaddr_ll is plain data, valid all zero.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = protocol;
        addr.sll_ifindex = ifindex as i32;
        // SAFETY: the address is a live sockaddr_ll of the size given.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        self.ifindex = ifindex;
        Ok(())
    }

    /// A socket on the link named `name` in this thread's network namespace.
    pub fn open_named(name: &str) -> io::Result<PacketSocket> {
        let c = std::ffi::CString::new(name).map_err(io::Error::other)?;
        // SAFETY: `c` is a live NUL-terminated string.
        let ifindex = unsafe { libc::if_nametoindex(c.as_ptr()) };
        if ifindex == 0 {
            return Err(io::Error::other(format!("no link named {name}")));
        }
        PacketSocket::open(ifindex)
    }

    /// The link's index.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// Waits up to `timeout` for a frame to read; whether there is one.
    pub fn wait(&self, timeout: Duration) -> io::Result<bool> {
        let ready = wait_any(&[self.fd.as_raw_fd()], timeout)?;
        Ok(!ready.is_empty())
    }

    /// Sends the frames of buffers `ids` of `pool` out of the link; returns how many
    /// went. A frame the link refuses on its own (longer than the link takes) is
    /// skipped and the rest still go; once the link has no room, the rest are not
    /// sent. An error of the socket itself is returned only if no frame went, so that
    /// what went is always counted.
    pub fn send(&self, pool: &mut Pool, ids: &[BufferId], batch: &mut Batch) -> io::Result<usize> {
        let mut sent = 0;
        for chunk in ids.chunks(256) {
            batch.headers.clear();
            batch.iovecs.clear();
            batch.vnet.clear();
            if self.vnet {
                for &id in chunk {
                    let offload = pool.offload(id);
                    let hdr_len = offload.checksum.map_or(0, |c| c.start + c.offset + 2);
                    let mut h = [0; VNET_HEADER_LEN];
                    VnetHeader::from_offload(&offload, hdr_len).write(&mut h);
                    batch.vnet.push(h);
                }
            }
            // Each frame's iovecs: its virtio-net header if the socket sends one, then
            // the frame. `batch.vnet` is not touched again until the call is made.
            let per_frame = if self.vnet { 2 } else { 1 };
            for (k, &id) in chunk.iter().enumerate() {
                if self.vnet {
                    batch.iovecs.push(libc::iovec {
                        iov_base: batch.vnet[k].as_mut_ptr().cast(),
                        iov_len: VNET_HEADER_LEN,
                    });
                }
                let len = pool.frame(id).len();
                let (base, _) = pool.raw(id).unwrap_or((std::ptr::null_mut(), 0));
                batch.iovecs.push(libc::iovec {
                    iov_base: base.cast(),
                    iov_len: if base.is_null() { 0 } else { len },
                });
            }
            for iov in batch.iovecs.chunks_exact_mut(per_frame) {
                // SAFETY: mmsghdr is plain data, valid all zero.
                let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
                h.msg_hdr.msg_iov = iov.as_mut_ptr();
                h.msg_hdr.msg_iovlen = per_frame;
                batch.headers.push(h);
            }
            let mut from = 0;
            while from < chunk.len() {
                let rest = &mut batch.headers[from..];
                // SAFETY: each header names its frame's iovecs in `batch.iovecs`, alive
                // and unmoved during the call; each iovec spans a frame of a buffer of
                // `pool` (or nothing) or a header of `batch.vnet`, which the kernel only
                // reads. `rest` holds `rest.len()` headers.
                let n = unsafe {
                    libc::sendmmsg(
                        self.fd.as_raw_fd(),
                        rest.as_mut_ptr(),
                        rest.len() as libc::c_uint,
                        libc::MSG_DONTWAIT,
                    )
                };
                if n >= 0 {
                    // Fewer than asked: the next frame failed, and the next call says why.
                    sent += n as usize;
                    from += n as usize;
                    continue;
                }
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    // This frame alone is refused (too long, empty): the rest go on.
                    Some(libc::EMSGSIZE | libc::EINVAL) => from += 1,
                    // No room now: the rest are not sent.
                    Some(libc::EAGAIN | libc::EINTR | libc::ENOBUFS) => return Ok(sent),
                    // The socket or the link itself: nothing more will go.
                    _ if sent > 0 => return Ok(sent),
                    _ => return Err(e),
                }
            }
        }
        Ok(sent)
    }

    /// Sends one frame (for tests and tools).
    pub fn send_frame(&self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: the frame is a live slice of the length given, only read.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Receives one frame if one is waiting (for tests and tools).
    pub fn receive_frame(&self) -> io::Result<Option<Vec<u8>>> {
        let mut buf = vec![0u8; 65536];
        // SAFETY: the buffer is live and writable for the length given.
        let n = unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e),
            };
        }
        buf.truncate(n as usize);
        Ok(Some(buf))
    }
}

/// Gives socket `fd` the classic BPF `program` through option `option` of `level`
/// (`SO_ATTACH_FILTER` of `SOL_SOCKET`, `PACKET_FANOUT_DATA` of `SOL_PACKET`).
pub(crate) fn attach_program(
    fd: &OwnedFd,
    level: libc::c_int,
    option: libc::c_int,
    program: &ClassicBpf,
) -> io::Result<()> {
    let mut filter: Vec<libc::sock_filter> = program
        .iter()
        .map(|&(code, jt, jf, k)| libc::sock_filter { code, jt, jf, k })
        .collect();
    let fprog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_mut_ptr(),
    };
    // SAFETY: the option's value is a live `sock_fprog` naming `filter`'s instructions,
    // which the kernel copies during the call.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            option,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets socket option `option` of `level` to the integer `value`.
pub(crate) fn set_int(
    fd: &OwnedFd,
    level: libc::c_int,
    option: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the option's value is a live c_int of the size given, only read.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            option,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl AsRawFd for PacketSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Waits up to `timeout` for any of `fds` to be readable; the positions of those that
/// are.
pub fn wait_any(fds: &[RawFd], timeout: Duration) -> io::Result<Vec<usize>> {
    let mut polls: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: `polls` is a live array of the length given.
    let n = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(Vec::new());
        }
        return Err(e);
    }
    for p in polls.iter().filter(|p| p.revents & libc::POLLERR != 0) {
        // An error reported (the link gone: `ENETDOWN`) is taken, so that the next
        // poll waits again instead of reporting it forever: a ring is read from memory,
        // and no read would take it.
        let mut error: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `error` and `len` are live and of the sizes given.
        unsafe {
            libc::getsockopt(
                p.fd,
                libc::SOL_SOCKET,
                libc::SO_ERROR,
                (&mut error as *mut libc::c_int).cast(),
                &mut len,
            )
        };
    }
    Ok(polls
        .iter()
        .enumerate()
        .filter(|(_, p)| p.revents & (libc::POLLIN | libc::POLLERR) != 0)
        .map(|(i, _)| i)
        .collect())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use fibre_testbed::netns::Namespace;

    /// A frame of `len` bytes of the local experimental EtherType, numbered `i`: nothing
    /// else on the link (the kernel's own neighbour discovery) looks like it.
    pub(crate) fn frame(i: u16, len: usize) -> Vec<u8> {
        let mut f = vec![0u8; len];
        f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&[0x88, 0xb5]);
        f[14..16].copy_from_slice(&i.to_be_bytes());
        f
    }

    /// Runs `test` with packet sockets on both ends of a fresh veth pair (`x0`, `x1`),
    /// on a thread inside a namespace of its own.
    fn on_veth_pair(test: impl FnOnce(&PacketSocket, &PacketSocket) + Send) {
        let ns = Namespace::create("packet").unwrap();
        ns.batch("link add x0 type veth peer name x1\nlink set x0 up\nlink set x1 up\n")
            .unwrap();
        ns.wait_up(&["x0", "x1"], Duration::from_secs(5)).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                ns.enter().unwrap();
                let a = PacketSocket::open_named("x0").unwrap();
                let b = PacketSocket::open_named("x1").unwrap();
                test(&a, &b);
            })
            .join()
            .unwrap()
        });
    }

    /// A frame longer than the link takes is refused alone: the frames around it go,
    /// and are counted.
    #[test]
    #[ignore = "needs root: a network namespace and a veth pair"]
    fn a_frame_the_link_refuses_does_not_stop_the_rest() {
        on_veth_pair(|a, b| {
            let mut pool = Pool::new(64, 4096);
            let mut batch = Batch::new();
            let mut ids = Vec::new();
            // The MTU is 1500: 1514 bytes go, 3000 do not.
            let lens = [60, 3000, 1514, 3000, 3000, 100];
            pool.alloc(lens.len(), &mut ids);
            for (k, (&id, &len)) in ids.iter().zip(&lens).enumerate() {
                pool.fill(id, &frame(k as u16, len));
            }
            let went = a.send(&mut pool, &ids, &mut batch).unwrap();
            assert_eq!(went, 3, "the three frames the link takes");
            let mut got = Vec::new();
            while got.len() < 3 && b.wait(Duration::from_secs(2)).unwrap() {
                while let Some(f) = b.receive_frame().unwrap() {
                    if f[12..14] == [0x88, 0xb5] {
                        got.push(u16::from_be_bytes([f[14], f[15]]));
                    }
                }
            }
            assert_eq!(got, [0, 2, 5], "in order, the refused ones left out");
        });
    }
}
