//! Raw frames into and out of a link with packet sockets, for tests and benchmarks that
//! ask the kernel.
//!
//! A test that wants the kernel's own answer (did it forward this packet, by which link,
//! changed how) builds namespaces joined by veth links ([`crate::netns`]), writes whole
//! Ethernet frames onto one link with a packet socket ([`packet_socket`],
//! [`send_frame`]) and reads what comes out of another with a second one
//! ([`capture_socket`], [`receive`]). A frame lost below IP (a veth's full peer, a CPU's
//! full backlog, the capture's full buffer) would pass for a frame the kernel chose to
//! drop, so the losses are counted where the kernel counts them ([`link_drops`],
//! [`backlog_drops`], [`capture_drops`]) and a test fails on any. Everything here needs
//! root; errors come back as [`io::Error`]s naming what failed.

use crate::netns::Namespace;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// The Ethernet header's length.
pub const ETHERNET_HEADER: usize = 14;

/// Runs `work` on a thread of its own that entered `ns` first (the calling thread keeps
/// its namespace; a socket stays in the namespace it was made in, whichever thread uses
/// it later).
pub fn in_namespace<T: Send>(ns: &Namespace, work: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            ns.enter().expect("entering the namespace");
            work()
        })
        .join()
        .expect("the namespace's thread does not panic")
    })
}

/// A packet socket bound to link `ifindex` of the calling thread's namespace (0: every
/// link of it), for frames of `protocol` (an `ETH_P_*` number; 0: none, a socket that
/// only sends).
pub fn packet_socket(protocol: u16, ifindex: u32) -> io::Result<OwnedFd> {
    // SAFETY: socket takes no pointers; the result is checked before use.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::c_int::from(protocol.to_be()),
        )
    };
    if fd < 0 {
        return Err(context("a packet socket"));
    }
    // SAFETY: fd is a descriptor just opened and owned by nothing else.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_ll is plain data, valid all zeros.
    let mut address: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    address.sll_family = libc::AF_PACKET as u16;
    address.sll_protocol = protocol.to_be();
    address.sll_ifindex = ifindex as libc::c_int;
    // SAFETY: address is a sockaddr_ll, its size given.
    let bound = unsafe {
        libc::bind(
            socket.as_raw_fd(),
            std::ptr::addr_of!(address).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if bound != 0 {
        return Err(context(&format!(
            "binding a packet socket to link {ifindex}"
        )));
    }
    Ok(socket)
}

/// Sets socket option `name` of `level` to `value`.
pub fn set_option<T>(
    socket: &OwnedFd,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    // SAFETY: value points to a T, its size given.
    let set = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            std::ptr::from_ref(value).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if set != 0 {
        return Err(context(&format!("setsockopt {level}/{name}")));
    }
    Ok(())
}

/// A socket that sees every frame on link `ifindex` (0: on every link of the calling
/// thread's namespace), sent and received, with a receive buffer of `buffer` bytes
/// (forced past `rmem_max`) and reads that give up after `quiet`.
pub fn capture_socket(ifindex: u32, buffer: usize, quiet: Duration) -> io::Result<OwnedFd> {
    let socket = packet_socket(libc::ETH_P_ALL as u16, ifindex)?;
    let buffer = libc::c_int::try_from(buffer).unwrap_or(libc::c_int::MAX);
    set_option(&socket, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &buffer)?;
    let timeout = libc::timeval {
        tv_sec: quiet.as_secs() as libc::time_t,
        tv_usec: quiet.subsec_micros() as libc::suseconds_t,
    };
    set_option(&socket, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &timeout)?;
    Ok(socket)
}

/// Frames the kernel dropped for want of room in `socket`'s buffer since last asked
/// (reading `PACKET_STATISTICS` resets it).
pub fn capture_drops(socket: &OwnedFd) -> io::Result<u32> {
    // SAFETY: tpacket_stats is plain data, valid all zeros.
    let mut stats: libc::tpacket_stats = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tpacket_stats>() as libc::socklen_t;
    // SAFETY: stats is a tpacket_stats and len its size, as PACKET_STATISTICS fills.
    let got = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_STATISTICS,
            std::ptr::addr_of_mut!(stats).cast(),
            &mut len,
        )
    };
    if got != 0 {
        return Err(context("PACKET_STATISTICS"));
    }
    Ok(stats.tp_drops)
}

/// Sends one whole frame on the link `socket` is bound to, trying again while the
/// socket's buffer is full for a moment.
pub fn send_frame(socket: &OwnedFd, frame: &[u8]) -> io::Result<()> {
    loop {
        // SAFETY: frame is valid for frame.len() bytes.
        let sent = unsafe { libc::send(socket.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        if sent == frame.len() as isize {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        match error.raw_os_error() {
            // Not sent: the socket's buffer full for a moment, or the veth's peer refused
            // the frame (which the count of frames lost below IP then shows).
            Some(libc::ENOBUFS | libc::EAGAIN | libc::EINTR) => std::thread::yield_now(),
            _ => {
                return Err(io::Error::new(
                    error.kind(),
                    format!("sending a frame of {} bytes: {error} ({sent})", frame.len()),
                ))
            }
        }
    }
}

/// A frame [`receive`] read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arrival {
    /// Its length, in the buffer given.
    pub len: usize,
    /// The link it was seen on.
    pub ifindex: u32,
    /// Whether it was going out of that link (a frame of the namespace's own), not
    /// arriving.
    pub outgoing: bool,
}

/// Reads the next frame `socket` holds into `buffer`: `None` once the socket's receive
/// timeout passed with none (a signal interrupting the wait is waited through).
pub fn receive(socket: &OwnedFd, buffer: &mut [u8]) -> io::Result<Option<Arrival>> {
    loop {
        // SAFETY: sockaddr_ll is plain data, valid all zeros.
        let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut from_len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: buffer is valid for its length, from for from_len bytes.
        let n = unsafe {
            libc::recvfrom(
                socket.as_raw_fd(),
                buffer.as_mut_ptr().cast(),
                buffer.len(),
                0,
                std::ptr::addr_of_mut!(from).cast(),
                &mut from_len,
            )
        };
        if n < 0 {
            let error = io::Error::last_os_error();
            match error.raw_os_error() {
                Some(libc::EAGAIN | libc::ETIMEDOUT) => return Ok(None),
                Some(libc::EINTR) => continue,
                _ => return Err(io::Error::new(error.kind(), format!("receiving: {error}"))),
            }
        }
        return Ok(Some(Arrival {
            len: n as usize,
            ifindex: from.sll_ifindex as u32,
            outgoing: from.sll_pkttype == libc::PACKET_OUTGOING,
        }));
    }
}

/// The IP packet an Ethernet frame carries, cut to the length its header gives (the
/// frame's padding left out); `None` for a frame not IPv4 or IPv6, or shorter than its
/// IP header says.
pub fn ip_packet(frame: &[u8]) -> Option<&[u8]> {
    let ip = frame.get(ETHERNET_HEADER..)?;
    let len = match frame.get(12..14)? {
        [0x08, 0x00] => usize::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?])),
        [0x86, 0xdd] => 40 + usize::from(u16::from_be_bytes([*ip.get(4)?, *ip.get(5)?])),
        _ => return None,
    };
    ip.get(..len)
}

/// An Ethernet frame from `source` to `destination` carrying the IP packet `ip` (its
/// type, IPv4 or IPv6, read from the packet's version).
pub fn ethernet_frame(destination: [u8; 6], source: [u8; 6], ip: &[u8]) -> Vec<u8> {
    let ether_type: [u8; 2] = if ip.first().is_some_and(|b| b >> 4 == 6) {
        [0x86, 0xdd]
    } else {
        [0x08, 0x00]
    };
    let mut frame = Vec::with_capacity(ETHERNET_HEADER + ip.len());
    frame.extend_from_slice(&destination);
    frame.extend_from_slice(&source);
    frame.extend_from_slice(&ether_type);
    frame.extend_from_slice(ip);
    frame
}

/// A link's dropped frames, received and sent, as `ip -s` counts them.
pub fn link_drops(ns: &Namespace, link: &str) -> io::Result<u64> {
    let out = ns.ip(&["-s", "-j", "link", "show", "dev", link])?;
    // `stats64` holds `"rx": {..., "dropped": N, ...}` and the same for `tx`, and
    // nothing else of one link at this level of detail is named so.
    let counts: Vec<u64> = out
        .match_indices("\"dropped\":")
        .map(|(at, key)| {
            let digits: String = out[at + key.len()..]
                .chars()
                .skip_while(|c| c.is_whitespace())
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse::<u64>()
        })
        .collect::<Result<_, _>>()
        .map_err(|e| io::Error::other(format!("ip -s -j link show dev {link}: {e}: {out}")))?;
    if counts.len() != 2 {
        return Err(io::Error::other(format!(
            "ip -s -j link show dev {link}: {} dropped counts, not 2 (received, sent): {out}",
            counts.len()
        )));
    }
    Ok(counts.iter().sum())
}

/// Frames dropped by every CPU's full input backlog (`/proc/net/softnet_stat`'s second
/// column), the whole machine's.
pub fn backlog_drops() -> io::Result<u64> {
    let text = std::fs::read_to_string("/proc/net/softnet_stat")?;
    text.lines()
        .filter_map(|line| line.split_whitespace().nth(1))
        .map(|hex| {
            u64::from_str_radix(hex, 16)
                .map_err(|e| io::Error::other(format!("/proc/net/softnet_stat: {hex}: {e}")))
        })
        .sum()
}

/// The last OS error, saying what was being done.
fn context(what: &str) -> io::Error {
    let error = io::Error::last_os_error();
    io::Error::new(error.kind(), format!("{what}: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ip_packet_is_cut_from_its_padded_frame() {
        let mut ip = vec![0x45, 0, 0, 24];
        ip.resize(24, 7);
        let mut frame = ethernet_frame([2; 6], [4; 6], &ip);
        assert_eq!(&frame[12..14], &[0x08, 0x00]);
        frame.resize(64, 0);
        assert_eq!(ip_packet(&frame), Some(&ip[..]));
        let mut v6 = vec![0x60, 0, 0, 0, 0, 2, 59, 64];
        v6.resize(42, 1);
        let frame = ethernet_frame([2; 6], [4; 6], &v6);
        assert_eq!(&frame[12..14], &[0x86, 0xdd]);
        assert_eq!(ip_packet(&frame), Some(&v6[..]));
        assert_eq!(
            ip_packet(&frame[..50]),
            None,
            "shorter than its header says"
        );
    }
}
