//! AF_XDP sockets: one worker's way in and out of its forwarded links without copying a
//! frame through a system call.
//!
//! A worker lends its whole [`Pool`] to the kernel as one UMEM, and binds one AF_XDP
//! socket to each receive queue it owns on each forwarded link, sharing that UMEM: a
//! frame the
//! XDP program ([`crate::xdp`]) redirects lands in one of the pool's buffers, goes
//! through the pipeline where it lies, and is sent from the same buffer by the output
//! link's socket. The buffers lent to the kernel (in a fill ring, or sent and not yet
//! completed) are taken from the pool's point of view, so the pool never hands them out
//! and the pipeline never sees them; they come back through the receive and completion
//! rings. The rings themselves are `xdpilone`'s, which maps them and orders the reads
//! and writes the kernel shares.

use crate::pool::{BufferId, Pool};
use std::io;
use std::num::NonZeroU32;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use xdpilone::xdp::XdpDesc;
use xdpilone::{
    DeviceQueue, Errno, IfInfo, RingRx, RingTx, Socket, SocketConfig, Umem, UmemConfig,
};

/// Entries of each ring: fill, completion, receive, transmit.
pub const RING: u32 = 4096;

/// One socket: a receive queue of a link.
struct Port {
    ifindex: u32,
    queue: u32,
    fd: RawFd,
    rx: RingRx,
    tx: RingTx,
    device: DeviceQueue,
    /// Buffers in the fill ring or being received into.
    lent: u32,
}

/// Frames the kernel sends per wake-up in copy mode (its `TX_BATCH_SIZE`).
const KICKED: u32 = 32;

/// Wakes the kernel to send what waits in `port`'s transmit ring: in copy mode, each
/// wake-up sends at most [`KICKED`] frames, so as many as the ring holds, and one more.
fn kick(port: &mut Port) {
    let mut times = port.tx.pending() / KICKED + 1;
    while times > 0 && port.tx.pending() > 0 && port.tx.needs_wakeup() {
        port.tx.wake();
        times -= 1;
    }
}

/// What the kernel counted for AF_XDP sockets, since they were opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XskStatistics {
    /// Frames dropped on the way to a receive ring (in all, the next two among them).
    pub rx_dropped: u64,
    /// Of those, dropped because the receive ring was full: the worker fell behind.
    pub rx_ring_full: u64,
    /// Times a frame found no buffer in the fill ring.
    pub fill_ring_empty: u64,
    /// Descriptors the kernel refused (receive and transmit).
    pub invalid_descriptors: u64,
}

/// A worker's AF_XDP sockets on its forwarded links, sharing one UMEM: its pool.
pub struct XskPorts {
    /// Dropped first (fields drop in order): the sockets close, and the kernel stops
    /// writing the UMEM, before the UMEM's registration goes.
    ports: Vec<Port>,
    /// Held, never read: its registration must outlive the sockets.
    #[allow(dead_code)]
    umem: Umem,
    frame_size: u64,
    /// Descriptors the kernel gave back that named no buffer lent to it.
    pub bad_descriptors: u64,
    /// Room for the buffers of one ring's worth, reused.
    scratch: Vec<BufferId>,
}

// SAFETY: what keeps `XskPorts` from being `Send` is the UMEM's pointer to the pool's
// area, which `xdpilone` uses only to register the area when the UMEM is made (and in
// `Umem::frame`, never called here); the rings are `Send`, and the sockets are
// descriptors. The ports move to their worker's thread whole, with their pool, and are
// used there alone.
unsafe impl Send for XskPorts {}

fn error(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e.get_raw())
}

/// Chunk sizes a UMEM takes (aligned mode: a power of two, 2048 to a page).
pub const CHUNK_SIZES: [usize; 2] = [2048, 4096];

/// Bytes the kernel keeps before a received frame in its chunk (`XDP_PACKET_HEADROOM`):
/// a chunk holds a frame of its size less this.
pub const HEADROOM: usize = 256;

impl XskPorts {
    /// Binds a socket to each of `queues` (an interface index and a receive queue), all
    /// sharing `pool` as their UMEM (its buffer size must be one of [`CHUNK_SIZES`]).
    /// Each socket still has to be put in its link's XDP program's map
    /// ([`XskPorts::sockets`]) to receive. Frames go out by the first socket on their
    /// link.
    ///
    /// # Safety
    /// The kernel writes received frames into `pool`'s area until the returned ports are
    /// dropped: `pool` must be dropped after them (it may move meanwhile; its area does
    /// not), and its buffers must only be handed out by the pool itself, so that those
    /// lent here are never read or written while the kernel holds them.
    pub unsafe fn open(pool: &mut Pool, queues: &[(u32, u32)]) -> io::Result<XskPorts> {
        let frame_size = pool.buffer_size();
        if !CHUNK_SIZES.contains(&frame_size) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("buffers of {frame_size} bytes cannot be a UMEM's chunks"),
            ));
        }
        let config = UmemConfig {
            fill_size: RING,
            complete_size: RING,
            frame_size: frame_size as u32,
            headroom: 0,
            flags: 0,
        };
        // SAFETY: the area is the pool's, page-aligned, `count * size` bytes, and lives
        // (the caller's promise) as long as the UMEM and its sockets, which `XskPorts`
        // owns and drops before the pool.
        let umem = unsafe { Umem::new(config, pool.area()) }.map_err(error)?;
        // The UMEM's own socket asks to be woken only when the kernel needs it; the
        // sockets sharing its UMEM inherit that, and may not ask again.
        let rings = |first: bool| SocketConfig {
            rx_size: NonZeroU32::new(RING),
            tx_size: NonZeroU32::new(RING),
            bind_flags: if first {
                SocketConfig::XDP_BIND_NEED_WAKEUP
            } else {
                0
            },
        };
        let mut ports = Vec::new();
        for (k, &(ifindex, queue)) in queues.iter().enumerate() {
            let mut info = IfInfo::invalid();
            info.from_ifindex(ifindex).map_err(error)?;
            info.set_queue(queue);
            // The first socket is the UMEM's own; the others share it, each with fill
            // and completion rings of its own (another link, or another queue).
            let socket = if k == 0 {
                Socket::with_shared(&info, &umem)
            } else {
                Socket::new(&info)
            }
            .map_err(error)?;
            let device = umem.fq_cq(&socket).map_err(error)?;
            let user = umem.rx_tx(&socket, &rings(k == 0)).map_err(error)?;
            let rx = user.map_rx().map_err(error)?;
            let tx = user.map_tx().map_err(error)?;
            umem.bind(&user).map_err(|e| {
                let e = error(e);
                io::Error::new(
                    e.kind(),
                    format!("AF_XDP socket on link {ifindex} queue {queue}: {e}"),
                )
            })?;
            ports.push(Port {
                ifindex,
                queue,
                fd: rx.as_raw_fd(),
                rx,
                tx,
                device,
                lent: 0,
            });
        }
        let mut xsk = XskPorts {
            ports,
            umem,
            frame_size: frame_size as u64,
            bad_descriptors: 0,
            scratch: Vec::with_capacity(RING as usize),
        };
        xsk.fill(pool);
        Ok(xsk)
    }

    /// Each socket's interface index, receive queue and descriptor, to put in its
    /// link's XDP program's map.
    pub fn sockets(&self) -> impl Iterator<Item = (u32, u32, RawFd)> + '_ {
        self.ports.iter().map(|p| (p.ifindex, p.queue, p.fd))
    }

    /// The sockets, in order.
    pub fn len(&self) -> usize {
        self.ports.len()
    }

    /// Socket `k`'s interface index.
    pub fn ifindex(&self, k: usize) -> u32 {
        self.ports[k].ifindex
    }

    /// Socket `k`, to wait on.
    pub fn fd(&self, k: usize) -> RawFd {
        self.ports[k].fd
    }

    /// Tops up every socket's fill ring with free buffers, so that it can receive; each
    /// keeps at most its share of half the pool's buffers, or the ring, whichever is
    /// fewer.
    pub fn fill(&mut self, pool: &mut Pool) {
        for k in 0..self.ports.len() {
            self.fill_port(k, pool, 32);
        }
    }

    /// Tops up link `k`'s fill ring if it lacks at least `least` buffers (or has none).
    fn fill_port(&mut self, k: usize, pool: &mut Pool, least: u32) {
        let share = (pool.count() as u32 / 2 / self.ports.len().max(1) as u32).min(RING);
        let port = &mut self.ports[k];
        let want = share.saturating_sub(port.lent);
        if want == 0 || (want < least && port.lent > 0) {
            return;
        }
        let ids = &mut self.scratch;
        ids.clear();
        pool.alloc(want as usize, ids);
        let mut writer = port.device.fill(ids.len() as u32);
        let room = (writer.capacity() as usize).min(ids.len());
        let size = self.frame_size;
        let went = writer.insert(ids[..room].iter().map(|&id| u64::from(id) * size));
        writer.commit();
        drop(writer);
        pool.free(&ids[went as usize..]);
        port.lent += went;
        if port.device.needs_wakeup() {
            port.device.wake();
        }
    }

    /// Receives up to `max` frames from socket `k` into `ids` (appended), in the pool's
    /// buffers where the kernel put them; returns how many. The socket's fill ring gets
    /// as many buffers back at once: left to the next round of upkeep, it ran dry while
    /// a busy worker read on (the kernel's `fill_ring_empty`).
    pub fn receive(
        &mut self,
        k: usize,
        pool: &mut Pool,
        max: usize,
        ids: &mut Vec<BufferId>,
    ) -> usize {
        let size = self.frame_size;
        let port = &mut self.ports[k];
        let mut reader = port.rx.receive(max as u32);
        let mut n = 0;
        while let Some(desc) = reader.read() {
            port.lent = port.lent.saturating_sub(1);
            let id = desc.addr / size;
            let placed = u32::try_from(id)
                .is_ok_and(|id| pool.place(id, (desc.addr % size) as usize, desc.len as usize));
            if placed {
                ids.push(id as BufferId);
                n += 1;
            } else {
                self.bad_descriptors += 1;
            }
        }
        reader.release();
        drop(reader);
        if n > 0 {
            self.fill_port(k, pool, 1);
        }
        n
    }

    /// Sends the frames of `ids` out of link `ifindex` from where they lie; returns how
    /// many went into its transmit ring. Those are the kernel's until they complete
    /// ([`XskPorts::complete`]); the rest (no such link, or no room) are given back to
    /// the pool here. What the link finished sending is taken back first, and once more
    /// if the ring is short of room: the kernel stops sending while the completion ring
    /// is full.
    pub fn send(&mut self, ifindex: u32, pool: &mut Pool, ids: &[BufferId]) -> usize {
        let size = self.frame_size;
        let Some(k) = self.ports.iter().position(|p| p.ifindex == ifindex) else {
            pool.free(ids);
            return 0;
        };
        let mut went = 0;
        for attempt in 0..2 {
            self.complete_port(k, pool);
            let port = &mut self.ports[k];
            let rest = &ids[went..];
            let mut writer = port.tx.transmit(rest.len() as u32);
            let room = (writer.capacity() as usize).min(rest.len());
            went += writer.insert(rest[..room].iter().map(|&id| {
                let (offset, len) = pool.placement(id).unwrap_or((0, 0));
                XdpDesc {
                    addr: u64::from(id) * size + offset as u64,
                    len: len as u32,
                    options: 0,
                }
            })) as usize;
            writer.commit();
            drop(writer);
            kick(port);
            if went == ids.len() || attempt == 1 {
                break;
            }
        }
        pool.free(&ids[went..]);
        went
    }

    /// Has the kernel send what waits in every link's transmit ring.
    pub fn flush(&mut self) {
        for port in &mut self.ports {
            kick(port);
        }
    }

    /// Takes back the buffers every link's kernel side has finished sending.
    pub fn complete(&mut self, pool: &mut Pool) {
        for k in 0..self.ports.len() {
            self.complete_port(k, pool);
        }
    }

    /// Takes back the buffers link `k` has finished sending.
    fn complete_port(&mut self, k: usize, pool: &mut Pool) {
        let size = self.frame_size;
        let done = &mut self.scratch;
        done.clear();
        let mut reader = self.ports[k].device.complete(RING);
        while let Some(addr) = reader.read() {
            match u32::try_from(addr / size) {
                Ok(id) => done.push(id),
                Err(_) => self.bad_descriptors += 1,
            }
        }
        reader.release();
        let before = pool.refused();
        pool.free(done);
        self.bad_descriptors += pool.refused() - before;
    }

    /// The kernel's counts for every link's socket, added: frames it dropped (no room
    /// in the receive ring, or no buffer in the fill ring), and descriptors it refused.
    pub fn statistics(&self) -> XskStatistics {
        let mut total = XskStatistics::default();
        for port in &self.ports {
            if let Ok(s) = port.device.statistics_v2() {
                total.rx_dropped += s.rx_dropped;
                total.rx_ring_full += s.rx_ring_full;
                total.fill_ring_empty += s.rx_fill_ring_empty_descs;
                total.invalid_descriptors += s.rx_invalid_descs + s.tx_invalid_descs;
            }
        }
        total
    }

    /// Frames lent to the kernel to receive into, on all links.
    #[cfg(test)]
    pub fn lent(&self) -> u32 {
        self.ports.iter().map(|p| p.lent).sum()
    }
}

/// `ETHTOOL_GCHANNELS`: a link's queue counts.
const ETHTOOL_GCHANNELS: u32 = 0x3c;

/// The kernel's `struct ethtool_channels`.
#[repr(C)]
#[derive(Default)]
struct EthtoolChannels {
    cmd: u32,
    max_rx: u32,
    max_tx: u32,
    max_other: u32,
    max_combined: u32,
    rx_count: u32,
    tx_count: u32,
    other_count: u32,
    combined_count: u32,
}

/// The receive queues of link `ifindex` in this thread's network namespace, as
/// `ethtool -l` counts them (receive-only and combined channels): every one an AF_XDP
/// socket must be bound to for none of the link's frames to go unread. A driver that
/// cannot say has one.
pub fn receive_queues(ifindex: u32) -> io::Result<u32> {
    let mut name = [0 as libc::c_char; libc::IFNAMSIZ];
    // SAFETY: `name` has the IFNAMSIZ bytes if_indextoname writes at most.
    if unsafe { libc::if_indextoname(ifindex, name.as_mut_ptr()) }.is_null() {
        return Err(io::Error::last_os_error());
    }
    let mut channels = EthtoolChannels {
        cmd: ETHTOOL_GCHANNELS,
        ..Default::default()
    };
    let mut req = libc::ifreq {
        ifr_name: name,
        ifr_ifru: libc::__c_anonymous_ifr_ifru {
            ifru_data: (&mut channels as *mut EthtoolChannels).cast(),
        },
    };
    // SAFETY: socket(2) takes no pointers; the descriptor is checked and owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and nothing else owns it.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    // SAFETY: `req` holds a NUL-terminated name and a pointer to `channels`, a whole
    // `ethtool_channels` that outlives the call; the kernel reads and writes no more.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCETHTOOL, &mut req) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) => Ok(1),
            _ => Err(e),
        };
    }
    Ok((channels.rx_count + channels.combined_count).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::PacketSocket;
    use crate::xdp::{LinkProgram, LocalDestinations, XDP_PASS};
    use etherparse::PacketBuilder;
    use fibre_testbed::netns::Namespace;
    use std::time::{Duration, Instant};

    const MAC0: [u8; 6] = [0x02, 0, 0, 0, 0, 0x10];
    const MAC1: [u8; 6] = [0x02, 0, 0, 0, 0, 0x11];

    fn udp(dst_mac: [u8; 6], src_mac: [u8; 6], dst: [u8; 4], k: u16) -> Vec<u8> {
        let mut f = Vec::new();
        PacketBuilder::ethernet2(src_mac, dst_mac)
            .ipv4([192, 0, 2, 9], dst, 64)
            .udp(1000 + k, 9999)
            .write(&mut f, &k.to_be_bytes())
            .unwrap();
        f
    }

    /// On a veth pair, with the program on `x1`: frames to routed destinations come in
    /// through the socket, unchanged and in order, and go out of it again from the same
    /// buffers; a broadcast frame and a datagram for `x1`'s own address reach the kernel
    /// (a UDP socket receives the datagram), not fibre. Every buffer comes back.
    #[test]
    #[ignore = "needs root: a network namespace, a veth pair, an XDP program"]
    fn frames_come_in_and_go_out_through_the_pools_buffers() {
        let ns = Namespace::create("xsk").unwrap();
        ns.batch(
            "link add x0 address 02:00:00:00:00:10 type veth peer name x1 address 02:00:00:00:00:11\n\
             link set x0 up\nlink set x1 up\naddr add 10.1.0.1/24 dev x1\n",
        )
        .unwrap();
        ns.wait_up(&["x0", "x1"], Duration::from_secs(5)).unwrap();
        let x1 = ns.ifindex("x1").unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                ns.enter().unwrap();
                let mut local = LocalDestinations::new().unwrap();
                local.set([("10.1.0.1".parse().unwrap(), 32)]).unwrap();
                let mut program = LinkProgram::new(&local, XDP_PASS).unwrap();
                let mut pool = Pool::new(512, 2048);
                // SAFETY: `ports` is dropped below, before `pool`, and only the pool
                // hands out its buffers.
                let mut ports = unsafe { XskPorts::open(&mut pool, &[(x1, 0)]) }.unwrap();
                let lent = ports.lent();
                assert_eq!(lent as usize, 256, "half the pool lent to receive into");
                assert_eq!(pool.available(), 512 - 256);
                program.set_socket(0, ports.fd(0)).unwrap();
                program.attach(x1).unwrap();
                let listener = std::net::UdpSocket::bind("10.1.0.1:9999").unwrap();
                listener
                    .set_read_timeout(Some(Duration::from_secs(2)))
                    .unwrap();
                let x0 = PacketSocket::open_named("x0").unwrap();
                let sent: Vec<Vec<u8>> = (0..100)
                    .map(|k| udp(MAC1, MAC0, [198, 51, 100, k as u8], k))
                    .collect();
                let mut arp = vec![0xff; 6];
                arp.extend_from_slice(&MAC0);
                arp.extend_from_slice(&[0x08, 0x06]);
                arp.resize(60, 0);
                x0.send_frame(&arp).unwrap();
                x0.send_frame(&udp(MAC1, MAC0, [10, 1, 0, 1], 7)).unwrap();
                for f in &sent {
                    x0.send_frame(f).unwrap();
                }
                let mut ids = Vec::new();
                let until = Instant::now() + Duration::from_secs(3);
                while ids.len() < sent.len() && Instant::now() < until {
                    ports.receive(0, &mut pool, 256, &mut ids);
                    ports.fill(&mut pool);
                }
                let got: Vec<&[u8]> = ids.iter().map(|&id| pool.frame(id)).collect();
                assert_eq!(got.len(), sent.len(), "every routed frame came to fibre");
                for (g, f) in got.iter().zip(&sent) {
                    assert_eq!(g, f);
                }
                let mut buf = [0u8; 16];
                let (n, _) = listener.recv_from(&mut buf).expect("the kernel's datagram");
                assert_eq!(&buf[..n], &7u16.to_be_bytes());
                assert_eq!(ports.bad_descriptors, 0);

                // Back out of x1, from the same buffers, to x0.
                for &id in &ids {
                    let f = pool.frame_mut(id);
                    f[0..6].copy_from_slice(&MAC0);
                    f[6..12].copy_from_slice(&MAC1);
                }
                assert_eq!(ports.send(x1, &mut pool, &ids), ids.len());
                let mut back = 0;
                let until = Instant::now() + Duration::from_secs(3);
                while back < ids.len() && Instant::now() < until {
                    x0.wait(Duration::from_millis(100)).unwrap();
                    while let Some(f) = x0.receive_frame().unwrap() {
                        if f[6..12] == MAC1 && f[12..14] == [0x08, 0x00] {
                            back += 1;
                        }
                    }
                }
                assert_eq!(back, ids.len(), "every frame went out");
                let until = Instant::now() + Duration::from_secs(3);
                while pool.available() + ports.lent() as usize != 512 && Instant::now() < until {
                    ports.complete(&mut pool);
                }
                assert_eq!(
                    pool.available() + ports.lent() as usize,
                    512,
                    "every buffer back"
                );
                assert_eq!(ports.bad_descriptors, 0);
                drop(ports);
                drop(pool);
            })
            .join()
            .unwrap()
        });
    }
}
