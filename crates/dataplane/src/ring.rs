//! Frames in from a Linux link through an `AF_PACKET` socket's receive ring
//! (`TPACKET_V3`): the kernel writes each frame it receives into blocks of memory this
//! process shares with it, and hands a block over when it is full or a millisecond old.
//! A worker reads frames out of the blocks it holds without a system call; it waits in
//! `poll` only when it holds none.
//!
//! This is the fallback where a link takes no XDP program: the kernel still receives
//! every frame (and answers or drops what is its own, as beside any packet socket), and
//! the ring saves fibre the `recvmmsg` call a vector and the socket buffer's queue. Each
//! frame is copied once, out of the ring into a buffer of the worker's pool, where the
//! pipeline rewrites it; frames are sent with `sendmmsg` ([`crate::packet`]).
//!
//! A block is handed over when full or after [`RETIRE_MS`]: at a low rate a frame waits
//! up to that long in a block the kernel has not yet handed over (the price of
//! `TPACKET_V3`'s blocks; AF_XDP has no such wait).
//!
//! Each frame comes with a virtio-net header (`PACKET_VNET_HDR`): what its sender left
//! for a device to do ([`crate::offload`]), a checksum to finish or a large packet to
//! cut, which the frame's buffer keeps. Frames merged by the link's receive offload
//! (GRO) or left whole by a sender's segmentation offload (TSO over a veth) are up to
//! 64 KiB long: blocks hold the largest.
//!
//! Beside AF_XDP the same ring reads, on each link, what the XDP program passed to the
//! kernel ([`ReceiveRing::open_passed`]): the kernel's own frames, which fibre leaves to
//! it, and the packets whose checksum may be partial, which only this way says.

use crate::offload::{Offload, VnetHeader, VNET_HEADER_LEN};
use crate::packet::{attach_program, set_int, ClassicBpf, PacketSocket, PACKET_VNET_HDR};
use crate::pool::{BufferId, Pool};
use crate::segment;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

/// Bytes of a block: a page multiple, room for the largest frame (64 KiB and its
/// headers) and some 1,000 of the shortest.
const BLOCK_SIZE: usize = 1 << 17;
/// Blocks of a ring: 4 MiB, some 30,000 short frames of slack while a worker is busy.
/// At a low rate the kernel hands a block over every [`RETIRE_MS`] however few frames
/// it holds, so the slack is also counted in time: the ring fills after this many
/// milliseconds of a worker not reading (a stall of its virtual CPU, say). More, smaller
/// blocks buy more of that time for the same memory.
const BLOCKS: usize = 32;
/// The longest frame a ring gives: a 64 KiB packet a sender or GRO left whole, with its
/// link header; a buffer this long takes any.
pub const LONGEST_FRAME: usize = 65_536 + 256;
/// Milliseconds after which the kernel hands over a block that is not full.
pub const RETIRE_MS: u32 = 1;

/// An `AF_PACKET` socket bound to one link, with a `TPACKET_V3` receive ring.
#[derive(Debug)]
pub struct ReceiveRing {
    socket: PacketSocket,
    /// The ring's mapping: `BLOCKS` blocks of `BLOCK_SIZE` bytes.
    map: NonNull<u8>,
    /// The block to read next.
    block: usize,
    /// In the block being read (one the kernel handed over): the frames left, and where
    /// the next one's header is.
    reading: Option<(u32, usize)>,
    /// Frames longer than a buffer, dropped.
    truncated: u64,
    /// Blocks whose frames did not fit in them as the kernel described them, given back
    /// unread (none has been seen; counted rather than trusted).
    bad_blocks: u64,
    /// Frames whose virtio-net header asked for what fibre cannot do, dropped.
    refused_offloads: u64,
    /// Room for the segments of a frame being cut.
    cut: Vec<BufferId>,
    /// Frames cut into segments because they were longer than a buffer.
    segmented: u64,
}

// SAFETY: the ring's mapping is owned by this value alone (no other value points into
// it), and the kernel's side of it is the same from any thread; moving the value to
// another thread moves that ownership with it.
unsafe impl Send for ReceiveRing {}

/// What the kernel counted of a ring since the last time it was asked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingStatistics {
    /// Frames the socket took (dropped ones included).
    pub packets: u64,
    /// Frames dropped because the ring had no free block.
    pub dropped: u64,
}

/// A fanout group to join: its number, and the program that steers its frames, if one
/// does (else the kernel's flow hash).
pub type Fanout<'a> = (u16, Option<&'a ClassicBpf>);

impl ReceiveRing {
    /// A socket on the link of index `ifindex` with its receive ring, joined to fanout
    /// group `fanout` if one is given: hashed by flow, or steered by the program given
    /// with it ([`PacketSocket::join_fanout`]).
    pub fn open(ifindex: u32, fanout: Option<Fanout>) -> io::Result<ReceiveRing> {
        ReceiveRing::open_filtered(ifindex, fanout, false, None)
    }

    /// As [`ReceiveRing::open`], for the frames of one EtherType (`ETH_P_IP`,
    /// `ETH_P_IPV6`) that the link's traffic-control ingress left to the kernel: what
    /// the express path ([`crate::express`]) redirected never comes here.
    pub fn open_ethertype(
        ifindex: u32,
        fanout: Option<Fanout>,
        ethertype: u16,
    ) -> io::Result<ReceiveRing> {
        ReceiveRing::open_filtered(ifindex, fanout, false, Some(ethertype))
    }

    /// As [`ReceiveRing::open`], for the IPv4 and IPv6 frames the link's XDP program
    /// passed to the kernel (a socket filter leaves the rest out).
    pub fn open_passed(ifindex: u32, fanout: Option<Fanout>) -> io::Result<ReceiveRing> {
        ReceiveRing::open_filtered(ifindex, fanout, true, None)
    }

    fn open_filtered(
        ifindex: u32,
        fanout: Option<Fanout>,
        ip_only: bool,
        ethertype: Option<u16>,
    ) -> io::Result<ReceiveRing> {
        // Bound to no protocol until the ring is in place, so that no frame is queued
        // the old way meanwhile.
        let socket = PacketSocket::unbound()?;
        if ip_only {
            keep_ip_only(&socket)?;
        }
        set_int(socket.fd(), libc::SOL_PACKET, PACKET_VNET_HDR, 1)?;
        let fd = socket.as_raw_fd();
        set_option(
            fd,
            libc::PACKET_VERSION,
            &(libc::tpacket_versions::TPACKET_V3 as libc::c_int),
        )?;
        let request = libc::tpacket_req3 {
            tp_block_size: BLOCK_SIZE as u32,
            tp_block_nr: BLOCKS as u32,
            // Frames are packed in a block one after the other; the kernel only wants
            // a frame size that divides the block.
            tp_frame_size: 2048,
            tp_frame_nr: (BLOCKS * BLOCK_SIZE / 2048) as u32,
            tp_retire_blk_tov: RETIRE_MS,
            tp_sizeof_priv: 0,
            tp_feature_req_word: 0,
        };
        set_option(fd, libc::PACKET_RX_RING, &request)?;
        // SAFETY: a new shared mapping of the ring the kernel just made for `fd`, of
        // its whole size; no existing memory is touched. Checked for failure below.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                BLOCKS * BLOCK_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let mut ring = ReceiveRing {
            socket,
            map: NonNull::new(map.cast()).ok_or_else(|| io::Error::other("mmap gave null"))?,
            block: 0,
            reading: None,
            truncated: 0,
            bad_blocks: 0,
            refused_offloads: 0,
            cut: Vec::new(),
            segmented: 0,
        };
        match ethertype {
            Some(t) => ring.socket.bind_ethertype(ifindex, t)?,
            None => ring.socket.bind_all(ifindex)?,
        }
        if let Some((group, steering)) = fanout {
            ring.socket.join_fanout(group, steering)?;
        }
        Ok(ring)
    }

    /// The link's index.
    pub fn ifindex(&self) -> u32 {
        self.socket.ifindex()
    }

    /// Frames received longer than a buffer, dropped (taken: the count starts again).
    /// Frames merged by the link's receive offload (GRO, LRO) are such: forwarded links
    /// want it off.
    pub fn take_truncated(&mut self) -> u64 {
        std::mem::take(&mut self.truncated)
    }

    /// Blocks given back unread because their frames did not fit in them (taken: the
    /// count starts again).
    pub fn take_bad_blocks(&mut self) -> u64 {
        std::mem::take(&mut self.bad_blocks)
    }

    /// Frames dropped because their virtio-net header asked for what fibre cannot do
    /// (taken: the count starts again).
    pub fn take_refused_offloads(&mut self) -> u64 {
        std::mem::take(&mut self.refused_offloads)
    }

    /// Frames left whole by their sender and longer than a buffer, cut into segments as
    /// they were read (taken: the count starts again).
    pub fn take_segmented(&mut self) -> u64 {
        std::mem::take(&mut self.segmented)
    }

    /// What the kernel counted since the last call (it starts again at each).
    pub fn statistics(&self) -> io::Result<RingStatistics> {
        let mut stats = libc::tpacket_stats_v3 {
            tp_packets: 0,
            tp_drops: 0,
            tp_freeze_q_cnt: 0,
        };
        let mut len = std::mem::size_of::<libc::tpacket_stats_v3>() as libc::socklen_t;
        // SAFETY: the kernel writes at most `len` bytes into `stats`, a live value of
        // that size, and the new length into `len`.
        let r = unsafe {
            libc::getsockopt(
                self.socket.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&mut stats as *mut libc::tpacket_stats_v3).cast(),
                &mut len,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(RingStatistics {
            packets: stats.tp_packets as u64,
            dropped: stats.tp_drops as u64,
        })
    }

    /// The status word of block `b`, which the kernel and this process both write.
    fn status(&self, b: usize) -> &AtomicU32 {
        // SAFETY: block `b` (< BLOCKS) starts inside the mapping, page-aligned, with
        // its descriptor: the version and private offset (8 bytes), then
        // `tpacket_hdr_v1`, whose first field is the status, a u32 at offset 8,
        // 4-aligned. The kernel and this process only ever access it atomically (the
        // kernel with its barriers), and the mapping lives as long as `self`.
        unsafe { AtomicU32::from_ptr(self.map.as_ptr().add(b * BLOCK_SIZE + 8).cast()) }
    }

    /// The bytes of block `b`, which the kernel has handed over.
    fn block_bytes(&self, b: usize) -> &[u8] {
        // SAFETY: block `b` lies inside the mapping. Once the kernel sets a block's
        // status to `TP_STATUS_USER` (read with acquire ordering before this is
        // called) it writes nothing into that block until this process sets it back to
        // `TP_STATUS_KERNEL`, which `give_back` does only once the slice is no longer
        // used (it borrows `self` mutably). Its status word changes only through
        // atomics, and nothing reads it through this slice.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(b * BLOCK_SIZE), BLOCK_SIZE) }
    }

    /// Gives the block being read back to the kernel, and moves to the next.
    fn give_back(&mut self) {
        self.status(self.block)
            .store(libc::TP_STATUS_KERNEL, Ordering::Release);
        self.block = (self.block + 1) % BLOCKS;
        self.reading = None;
    }

    /// Receives up to `max` frames into buffers taken from `pool`, appended to `ids`,
    /// each with what its virtio-net header says is left to do; returns how many came
    /// (0: none waiting). Frames longer than a buffer are dropped and counted
    /// ([`ReceiveRing::take_truncated`]): cut, they would be sent on wrong.
    pub fn receive(&mut self, pool: &mut Pool, max: usize, ids: &mut Vec<BufferId>) -> usize {
        let start = ids.len();
        // Buffers for as many frames as may come, the unused ones given back after.
        let taken = pool.alloc(max, ids);
        let room = pool.buffer_size();
        let mut filled = 0;
        let mut cut = std::mem::take(&mut self.cut);
        while filled < taken {
            let (left, at) = match self.reading {
                Some(r) => r,
                None => {
                    let status = self.status(self.block).load(Ordering::Acquire);
                    if status & libc::TP_STATUS_USER == 0 {
                        break;
                    }
                    match block_header(self.block_bytes(self.block)) {
                        Some(first) => first,
                        None => {
                            self.bad_blocks += 1;
                            self.give_back();
                            continue;
                        }
                    }
                }
            };
            if left == 0 {
                self.give_back();
                continue;
            }
            let block = self.block_bytes(self.block);
            let Some((frame, wire_len, next, vnet)) = frame_at(block, at) else {
                self.bad_blocks += 1;
                self.give_back();
                continue;
            };
            match VnetHeader::read(vnet).and_then(|h| h.offload(frame.len())) {
                Err(_) => self.refused_offloads += 1,
                Ok(_) if wire_len > frame.len() => self.truncated += 1,
                // Left whole by its sender, and longer than a buffer (AF_XDP's chunks):
                // cut here into segments, each in a buffer, in the place of the frame.
                Ok(offload) if frame.len() > room && offload.gso.is_some() => {
                    match segment::count(frame, offload) {
                        // Not room for all of them in this vector: the next takes it.
                        Ok(n) if n > taken - filled && filled > 0 => break,
                        Ok(_) => {
                            cut.clear();
                            if segment::segment_into(pool, frame, offload, &mut cut).is_ok() {
                                // The segments take the places of unused buffers, which
                                // go to the end.
                                self.segmented += 1;
                                for &seg in &cut {
                                    if filled < taken {
                                        ids.push(ids[start + filled]);
                                        ids[start + filled] = seg;
                                    } else {
                                        ids.insert(start + filled, seg);
                                    }
                                    filled += 1;
                                }
                            } else {
                                self.refused_offloads += 1;
                            }
                        }
                        Err(_) => self.refused_offloads += 1,
                    }
                }
                Ok(_) if frame.len() > room => self.truncated += 1,
                Ok(offload) => {
                    let id = ids[start + filled];
                    pool.fill(id, frame);
                    if offload != Offload::NONE {
                        pool.set_offload(id, offload);
                    }
                    filled += 1;
                }
            }
            self.reading = Some((left - 1, next));
        }
        self.cut = cut;
        pool.free(&ids[start + filled..]);
        ids.truncate(start + filled);
        filled
    }
}

impl AsRawFd for ReceiveRing {
    fn as_raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

impl Drop for ReceiveRing {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, of that size, unmapped once; nothing
        // borrows it past `self`.
        unsafe {
            libc::munmap(self.map.as_ptr().cast(), BLOCKS * BLOCK_SIZE);
        }
    }
}

/// Attaches a socket filter that keeps IPv4 and IPv6 frames only (classic BPF: the
/// EtherType, then accept all of the frame or none).
fn keep_ip_only(socket: &PacketSocket) -> io::Result<()> {
    let program = [
        // ldh [12]
        (0x28, 0, 0, 12),
        // jeq #0x0800, accept; jeq #0x86dd, accept
        (0x15, 2, 0, 0x0800),
        (0x15, 1, 0, 0x86dd),
        // ret #0
        (0x06, 0, 0, 0),
        // ret #all
        (0x06, 0, 0, u32::MAX),
    ];
    attach_program(
        socket.fd(),
        libc::SOL_SOCKET,
        libc::SO_ATTACH_FILTER,
        &program,
    )
}

/// Sets socket option `option` of `SOL_PACKET` to `value`.
fn set_option<T>(fd: RawFd, option: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: the option's value is a live `T` of the size given, only read.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_PACKET,
            option,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A `u32` of `bytes` at `at`, in this machine's order (the kernel's).
fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// A `u16` of `bytes` at `at`, in this machine's order.
fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

/// A block's frame count and where its first frame's header is (`tpacket_hdr_v1`
/// after the 8-byte descriptor head: status, count, first offset), if they fit.
fn block_header(block: &[u8]) -> Option<(u32, usize)> {
    let count = u32_at(block, 12)?;
    let first = u32_at(block, 16)? as usize;
    (first < block.len()).then_some((count, first))
}

/// The frame whose `tpacket3_hdr` is at `at` in `block`: its bytes as captured, its
/// length on the wire, where the next frame's header is, and the virtio-net header the
/// kernel wrote just before the frame; `None` if the header or the frame does not fit
/// in the block.
fn frame_at(block: &[u8], at: usize) -> Option<(&[u8], usize, usize, &[u8])> {
    let next = u32_at(block, at)? as usize;
    let snaplen = u32_at(block, at + 12)? as usize;
    let len = u32_at(block, at + 16)? as usize;
    let mac = u16_at(block, at + 24)? as usize;
    let frame = block.get(at + mac..at + mac + snaplen)?;
    let vnet = block.get((at + mac).checked_sub(VNET_HEADER_LEN)?..at + mac)?;
    Some((frame, len, at + next, vnet))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::tests::frame as numbered;
    use crate::packet::Batch;
    use fibre_testbed::netns::Namespace;
    use std::time::{Duration, Instant};

    /// A namespace `name` holding a veth pair x0 - x1, both up.
    fn veth_pair(name: &str) -> Namespace {
        let ns = Namespace::create(name).unwrap();
        ns.batch("link add x0 type veth peer name x1\nlink set x0 up\nlink set x1 up\n")
            .unwrap();
        ns.wait_up(&["x0", "x1"], Duration::from_secs(5)).unwrap();
        ns
    }

    /// The index of link `name` in the namespace the thread is in.
    fn index(name: &str) -> u32 {
        let c = std::ffi::CString::new(name).unwrap();
        // SAFETY: `c` is a live NUL-terminated string.
        unsafe { libc::if_nametoindex(c.as_ptr()) }
    }

    /// Vectors of frames sent out of one end of a veth pair arrive whole and in order in
    /// the other end's ring, read a vector at a time into the pool; frames longer than a
    /// buffer are dropped and counted; a ring on the sending end reads none of what was
    /// sent; the kernel's count of frames agrees.
    #[test]
    #[ignore = "needs root: a network namespace and a veth pair"]
    fn vectors_cross_a_veth_pair_whole_and_in_order() {
        let ns = veth_pair("ring");
        std::thread::scope(|s| {
            s.spawn(|| {
                ns.enter().unwrap();
                let sender = PacketSocket::open(index("x0")).unwrap();
                let mut own = ReceiveRing::open(index("x0"), None).unwrap();
                let mut ring = ReceiveRing::open(index("x1"), Some((7, None))).unwrap();
                // Buffers of 1,024 bytes: every 100th frame (1,400 bytes) is too long.
                let mut pool = Pool::new(1024, 1024);
                let count = 3000u16;
                let sent: Vec<Vec<u8>> = (0..count)
                    .map(|i| match i % 100 {
                        99 => numbered(i, 1400),
                        _ => numbered(i, 60 + (i as usize * 7) % 900),
                    })
                    .collect();
                let mut ids = Vec::new();
                send_frames(&sender, sent.iter().map(|f| &f[..]), 200);
                let fit: Vec<&Vec<u8>> = sent.iter().filter(|f| f.len() <= 1024).collect();
                let (mut got, mut truncated) = (Vec::new(), 0);
                let until = Instant::now() + Duration::from_secs(5);
                while got.len() < fit.len() && Instant::now() < until {
                    ids.clear();
                    let n = ring.receive(&mut pool, 256, &mut ids);
                    assert!(n <= 256 && n == ids.len());
                    truncated += ring.take_truncated();
                    for &id in &ids {
                        if pool.frame(id)[12..14] == [0x88, 0xb5] {
                            got.push(pool.frame(id).to_vec());
                        }
                    }
                    pool.free(&ids);
                    if n == 0 {
                        crate::packet::wait_any(&[ring.as_raw_fd()], Duration::from_millis(50))
                            .unwrap();
                    }
                }
                assert_eq!(got.len(), fit.len());
                assert!(
                    got.iter().zip(&fit).all(|(a, b)| a == *b),
                    "whole and in order"
                );
                assert_eq!(truncated, 30, "the frames longer than a buffer");
                assert_eq!(ring.take_bad_blocks(), 0);
                let stats = ring.statistics().unwrap();
                assert!(stats.packets >= count as u64, "{stats:?}");
                assert_eq!(stats.dropped, 0);
                assert_eq!(pool.available(), 1024, "every buffer back");
                // Nothing x0 sent is read on x0 (a block retires within a millisecond).
                std::thread::sleep(Duration::from_millis(20));
                ids.clear();
                own.receive(&mut pool, 256, &mut ids);
                for &id in &ids {
                    assert_ne!(
                        pool.frame(id)[12..14],
                        [0x88, 0xb5],
                        "x0 read its own frame"
                    );
                }
            })
            .join()
            .unwrap()
        });
    }

    /// A fanout group steered by the owners' program: each of three rings, joined in
    /// order, reads exactly the frames whose tuple (either way) hashes to its worker,
    /// for TCP, UDP and ICMP echo over IPv4 (with and without options) and IPv6, as the
    /// kernel runs the program; and again once the first worker's ring is closed and
    /// opened anew (it joins last, the last one taking its place), the program given
    /// with the new ring following that order, as a worker started again does.
    #[test]
    #[ignore = "needs root: a network namespace and a veth pair"]
    fn a_steered_fanout_gives_each_ring_the_connections_it_owns() {
        use etherparse::PacketBuilder;
        use fibre_conntrack::tuple::{ICMP, ICMPV6, TCP, UDP};
        use fibre_conntrack::{Owners, Tuple};
        use rand::{Rng, SeedableRng};
        let ns = veth_pair("steer");
        let owners = Owners {
            workers: 3,
            me: 0,
            seed: 0x1234_5678_9abc,
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        // Frames each with its number in its payload, and the ring that owns it.
        let mut frames: Vec<(Vec<u8>, u16)> = Vec::new();
        for k in 0..600u32 {
            let v6 = k % 2 == 1;
            let protocol = [TCP, UDP, if v6 { ICMPV6 } else { ICMP }][k as usize / 2 % 3];
            let mut t = Tuple {
                protocol,
                v6,
                src_port: rng.gen(),
                dst_port: rng.gen(),
                ..Tuple::default()
            };
            for a in [&mut t.src, &mut t.dst] {
                if v6 {
                    rng.fill(&mut a[..]);
                } else {
                    a[10..12].fill(0xff);
                    rng.fill(&mut a[12..]);
                }
            }
            if matches!(protocol, ICMP | ICMPV6) {
                t.dst_port = u16::from(if v6 { 128u8 } else { 8 }) << 8;
            }
            for t in [t, t.inverted().unwrap()] {
                let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
                let b = if v6 {
                    b.ipv6(t.src, t.dst, 64)
                } else {
                    let mut ip = etherparse::Ipv4Header::new(
                        0,
                        64,
                        etherparse::IpNumber(protocol),
                        t.src[12..].try_into().unwrap(),
                        t.dst[12..].try_into().unwrap(),
                    )
                    .unwrap();
                    if k % 4 == 0 {
                        ip.options = [1u8, 1, 1, 1][..].try_into().unwrap();
                    }
                    b.ip(etherparse::IpHeaders::Ipv4(ip, Default::default()))
                };
                let (id, seq) = (t.src_port, 1);
                let payload = (frames.len() as u32).to_be_bytes();
                let mut out = Vec::new();
                match protocol {
                    TCP => b
                        .tcp(t.src_port, t.dst_port, 1, 1000)
                        .write(&mut out, &payload),
                    UDP => b.udp(t.src_port, t.dst_port).write(&mut out, &payload),
                    _ => match t.dst_port >> 8 {
                        8 => b.icmpv4_echo_request(id, seq).write(&mut out, &payload),
                        0 => b.icmpv4_echo_reply(id, seq).write(&mut out, &payload),
                        128 => b.icmpv6_echo_request(id, seq).write(&mut out, &payload),
                        _ => b.icmpv6_echo_reply(id, seq).write(&mut out, &payload),
                    },
                }
                .unwrap();
                frames.push((out, owners.of_tuple(&t)));
            }
        }
        std::thread::scope(|s| {
            s.spawn(|| {
                ns.enter().unwrap();
                let sender = PacketSocket::open(index("x0")).unwrap();
                let program = owners.steering_program(&[0, 1, 2]);
                let open = |program: &[(u16, u8, u8, u32)]| {
                    ReceiveRing::open(index("x1"), Some((9, Some(program)))).unwrap()
                };
                // Worker k's ring at k.
                let mut rings: Vec<ReceiveRing> = (0..3).map(|_| open(&program)).collect();
                steered(&sender, &mut rings, &frames);
                // The first worker's ring gone, the last takes its place in the group;
                // the new one joins last.
                drop(rings.remove(0));
                let program = owners.steering_program(&[2, 1, 0]);
                rings.insert(0, open(&program));
                steered(&sender, &mut rings, &frames);
            })
            .join()
            .unwrap()
        });
    }

    /// Sends `frames` from `sender`, `vector` at a time.
    fn send_frames<'a>(
        sender: &PacketSocket,
        frames: impl Iterator<Item = &'a [u8]>,
        vector: usize,
    ) {
        let frames: Vec<&[u8]> = frames.collect();
        let mut sending = Pool::new(256, 2048);
        let mut batch = Batch::new();
        let mut ids = Vec::new();
        for chunk in frames.chunks(vector) {
            sending.alloc(chunk.len(), &mut ids);
            for (&id, f) in ids.iter().zip(chunk) {
                sending.fill(id, f);
            }
            let mut went = 0;
            while went < ids.len() {
                went += sender.send(&mut sending, &ids[went..], &mut batch).unwrap();
            }
            sending.free(&ids);
            ids.clear();
        }
    }

    /// Sends `frames` from `sender`; each must be read once, by the ring of the worker
    /// it names (`rings[worker]`), every worker getting some.
    fn steered(sender: &PacketSocket, rings: &mut [ReceiveRing], frames: &[(Vec<u8>, u16)]) {
        send_frames(sender, frames.iter().map(|f| &f.0[..]), 100);
        let mut ids = Vec::new();
        let mut read = vec![None; frames.len()];
        let mut pool = Pool::new(1024, 2048);
        let until = Instant::now() + Duration::from_secs(5);
        let mut count = 0;
        while count < frames.len() && Instant::now() < until {
            let mut any = false;
            for (r, ring) in rings.iter_mut().enumerate() {
                ids.clear();
                ring.receive(&mut pool, 256, &mut ids);
                for &id in &ids {
                    let f = pool.frame(id);
                    let Some(k) = frames.iter().position(|s| s.0 == f) else {
                        continue;
                    };
                    assert_eq!(read[k], None, "frame {k} read twice");
                    read[k] = Some(r as u16);
                    count += 1;
                    any = true;
                }
                pool.free(&ids);
            }
            if !any {
                let fds: Vec<RawFd> = rings.iter().map(|r| r.as_raw_fd()).collect();
                crate::packet::wait_any(&fds, Duration::from_millis(50)).unwrap();
            }
        }
        assert_eq!(count, frames.len(), "every frame read");
        let mut per_ring = vec![0usize; rings.len()];
        for (k, (f, owner)) in frames.iter().enumerate() {
            assert_eq!(read[k], Some(*owner), "frame {k}: {f:02x?}");
            per_ring[usize::from(*owner)] += 1;
        }
        assert!(per_ring.iter().all(|&n| n > 250), "{per_ring:?}");
    }

    /// A block as the kernel lays it out: descriptor, then each frame's header and
    /// bytes at 16-byte-aligned offsets.
    fn block(frames: &[&[u8]]) -> Vec<u8> {
        let mut b = vec![0u8; 4096];
        let first = 48;
        b[12..16].copy_from_slice(&(frames.len() as u32).to_ne_bytes());
        b[16..20].copy_from_slice(&(first as u32).to_ne_bytes());
        let mut at = first;
        for (i, f) in frames.iter().enumerate() {
            let mac = 82;
            let size = (mac + f.len()).next_multiple_of(16);
            let next = if i + 1 < frames.len() { size } else { 0 };
            b[at..at + 4].copy_from_slice(&(next as u32).to_ne_bytes());
            b[at + 12..at + 16].copy_from_slice(&(f.len() as u32).to_ne_bytes());
            b[at + 16..at + 20].copy_from_slice(&(f.len() as u32).to_ne_bytes());
            b[at + 24..at + 26].copy_from_slice(&(mac as u16).to_ne_bytes());
            b[at + mac..at + mac + f.len()].copy_from_slice(f);
            at += size;
        }
        b
    }

    #[test]
    fn frames_are_read_from_a_block_as_the_kernel_lays_it_out() {
        let frames: Vec<Vec<u8>> = (0..5).map(|i| vec![i as u8; 60 + i * 7]).collect();
        let refs: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
        let b = block(&refs);
        let (count, mut at) = block_header(&b).unwrap();
        assert_eq!(count, 5);
        for f in &frames {
            let (got, wire, next, vnet) = frame_at(&b, at).unwrap();
            assert_eq!(vnet, &[0u8; VNET_HEADER_LEN][..]);
            assert_eq!(got, &f[..]);
            assert_eq!(wire, f.len());
            at = next;
        }
    }

    #[test]
    fn frames_that_do_not_fit_their_block_are_refused() {
        let b = block(&[&[1u8; 100]]);
        let (_, at) = block_header(&b).unwrap();
        // The frame's length past the block's end.
        let mut bad = b.clone();
        bad[at + 12..at + 16].copy_from_slice(&5000u32.to_ne_bytes());
        assert!(frame_at(&bad, at).is_none());
        // A header past the end; a first frame past the end.
        assert!(frame_at(&b, 4090).is_none());
        let mut bad = b.clone();
        bad[16..20].copy_from_slice(&9999u32.to_ne_bytes());
        assert!(block_header(&bad).is_none());
    }
}
