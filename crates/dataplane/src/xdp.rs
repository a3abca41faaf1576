//! The XDP program that sorts a forwarded link's frames before the kernel sees them:
//! what fibre forwards is redirected to its AF_XDP socket on the frame's receive queue,
//! everything else is passed to the kernel untouched, as if fibre were not there.
//!
//! Passed to the kernel: frames sent to a group MAC address (ARP requests, neighbour
//! discovery, multicast), anything not IPv4 or IPv6 (ARP, VLAN tags), IPv4 with options,
//! IPv6 with a hop-by-hop header, multicast and limited-broadcast destinations, IPv6
//! link-local destinations (the input stage's reasons for the kernel, [`crate::input`]),
//! and destinations of this host: every prefix of a local, broadcast, anycast or
//! multicast route of any table, kept in an LPM trie map ([`LocalDestinations`]) that the
//! daemon updates as the routes change. A queue with no socket passes its frames too.
//!
//! Passed too, to reach fibre by the way that says what their sender left unfinished
//! (the worker's `AF_PACKET` ring on the link, [`crate::ring`]): packets whose checksum
//! may be partial. A host behind a veth leaves its TCP and UDP checksums for a device to
//! finish (the field holds the pseudo-header's sum), and XDP is not told which packets
//! are such: the kernel knows (`CHECKSUM_PARTIAL`), and tells a packet socket, but not an
//! XDP program. So the program passes every TCP or UDP packet (not a fragment) whose
//! checksum field holds exactly its pseudo-header's sum, which a finished checksum does
//! once in 65,536 packets; and, where a partial checksum may hide behind other headers,
//! packets of the protocols that carry one inside (IP in IP, IPv6 in IPv4, GRE, SCTP,
//! whose CRC is offloaded too) and IPv6 packets with routing, destination options,
//! mobility, HIP or shim6 headers. fibre then knows for sure, from the kernel, and
//! finishes a partial checksum, or forwards the packet as it came, as the kernel would.
//! (A checksum left partial inside a UDP tunnel, VXLAN or Geneve, is not seen: its outer
//! UDP checksum is whole or absent.) [`may_hide_a_partial_checksum`] says the same in
//! Rust, and the tests hold the program to it.
//!
//! Everything else goes to fibre, malformed frames among them, so that the input stage
//! drops and counts them as the kernel would. The program is assembled here, as the
//! kernel probe is, so that cargo alone builds fibre.

#[cfg(test)]
use crate::input::{ETHERTYPE_IPV4, ETHERTYPE_IPV6};
#[cfg(test)]
use fibre_headers::transport::{TCP, UDP};
#[cfg(test)]
use fibre_headers::{checksum, ipv4, ipv6, tcp, udp, EthernetFrame, Ipv4Packet, Ipv6Packet};
use fibre_kernel::bpf::{
    self, assemble, Insn, Item, Map, MapType, Program, XdpMode, R0, R1, R2, R3, R4, R5, R6, R7, R8,
    R9,
};
use std::collections::HashSet;
use std::io;
use std::net::IpAddr;
use std::os::fd::{OwnedFd, RawFd};

/// `XDP_PASS`: to the kernel.
pub const XDP_PASS: u32 = 2;
/// `XDP_TX`: back out of the link it came in on.
#[cfg(test)]
pub const XDP_TX: u32 = 3;

/// AF_XDP sockets one link's map holds at most: one per receive queue.
pub const QUEUES: u32 = 64;
/// Local prefixes the map holds at most.
const LOCAL_MAX: u32 = 65_536;
/// A key of the local map: a prefix length, then an IPv6 address (IPv4 v4-mapped).
type Key = [u8; 20];

/// The prefixes of this host's own destinations, shared by every forwarded link's program.
#[derive(Debug)]
pub struct LocalDestinations {
    map: Map,
    installed: HashSet<Key>,
}

fn key(addr: IpAddr, len: u8) -> Key {
    let (bytes, len) = match addr {
        IpAddr::V4(a) => (a.to_ipv6_mapped().octets(), 96 + u32::from(len.min(32))),
        IpAddr::V6(a) => (a.octets(), u32::from(len.min(128))),
    };
    let mut k = [0; 20];
    k[..4].copy_from_slice(&len.to_ne_bytes());
    k[4..].copy_from_slice(&bytes);
    k
}

impl LocalDestinations {
    /// An empty map.
    pub fn new() -> io::Result<LocalDestinations> {
        Ok(LocalDestinations {
            map: Map::create(MapType::LpmTrie, 20, 1, LOCAL_MAX, "fibre_local")?,
            installed: HashSet::new(),
        })
    }

    /// Makes the map hold exactly `prefixes` (address, length): what is new is added,
    /// what is gone is removed. Past the map's room, the rest is left out and an error
    /// says so.
    pub fn set(&mut self, prefixes: impl IntoIterator<Item = (IpAddr, u8)>) -> io::Result<()> {
        let want: HashSet<Key> = prefixes.into_iter().map(|(a, l)| key(a, l)).collect();
        let gone: Vec<Key> = self.installed.difference(&want).copied().collect();
        for k in gone {
            self.map.delete(&k)?;
            self.installed.remove(&k);
        }
        for k in want {
            if !self.installed.contains(&k) {
                self.map.update(&k, &[1])?;
                self.installed.insert(k);
            }
        }
        Ok(())
    }

    /// The map, for the programs that consult it.
    pub(crate) fn map(&self) -> &Map {
        &self.map
    }

    /// Prefixes held.
    pub fn len(&self) -> usize {
        self.installed.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.installed.is_empty()
    }
}

/// One forwarded link's program and its map of AF_XDP sockets by receive queue.
#[derive(Debug)]
pub struct LinkProgram {
    program: Program,
    sockets: Map,
    /// The attachment: the program stays on the link while it is open.
    attached: Option<(OwnedFd, XdpMode)>,
}

impl LinkProgram {
    /// Loads the program for one link, consulting `local`; a frame it would redirect to a
    /// queue that has no socket gets `missing` (`XDP_PASS` for a router; tests use
    /// another action to see the choice).
    pub fn new(local: &LocalDestinations, missing: u32) -> io::Result<LinkProgram> {
        let sockets = Map::new(MapType::XskMap, 4, QUEUES, "fibre_xsks")?;
        let insns = program(&local.map, &sockets, missing);
        let program = Program::load_for(
            bpf::PROG_TYPE_XDP,
            bpf::ATTACH_TYPE_XDP,
            &insns,
            "fibre_xdp",
        )?;
        Ok(LinkProgram {
            program,
            sockets,
            attached: None,
        })
    }

    /// Puts AF_XDP socket `fd` in the map for receive queue `queue`.
    pub fn set_socket(&self, queue: u32, fd: RawFd) -> io::Result<()> {
        self.sockets.set(queue, &(fd as u32).to_ne_bytes())
    }

    /// Attaches the program to interface `ifindex`: in the driver if it can be, else
    /// generic. Returns the mode it got.
    pub fn attach(&mut self, ifindex: u32) -> io::Result<XdpMode> {
        let fd = match self.program.attach_xdp(ifindex, XdpMode::Driver) {
            Ok(fd) => (fd, XdpMode::Driver),
            Err(_) => (
                self.program.attach_xdp(ifindex, XdpMode::Generic)?,
                XdpMode::Generic,
            ),
        };
        let mode = fd.1;
        self.attached = Some(fd);
        Ok(mode)
    }

    /// What the program answers for `frame` arriving on queue 0 (in the calling thread's
    /// network namespace).
    #[cfg(test)]
    pub fn verdict(&self, frame: &[u8]) -> io::Result<u32> {
        Ok(self.program.test_run(frame, &[], 1)?.retval)
    }
}

/// The program. `R2` is the frame's first byte and `R3` its end; the key for the local
/// map is built on the stack at `R10 - 24` (a prefix length of 128, then 16 bytes).
fn program(local: &Map, sockets: &Map, missing: u32) -> Vec<Insn> {
    use bpf::{
        add_imm, and_imm, call, exit, jeq_imm, jgt_imm, jgt_reg, jne_imm, load, mov_imm, mov_reg,
        store_imm, store_reg, Size, R10,
    };
    use Item::*;
    let byte = |dst, off| Op(load(Size::B, dst, R2, off));
    let bounds = |len| {
        [
            Op(mov_reg(R4, R2)),
            Op(add_imm(R4, len)),
            // Shorter than the header read next: fibre's input stage drops it, counted.
            JumpReg(jgt_reg, R4, R3, "redirect"),
        ]
    };
    let mut p = vec![
        Op(mov_reg(R6, R1)),
        Op(load(Size::W, R2, R6, 0)),
        Op(load(Size::W, R3, R6, 4)),
    ];
    p.extend(bounds(14));
    p.extend([
        // A group destination MAC: ARP requests, neighbour discovery, multicast.
        byte(R5, 0),
        Op(and_imm(R5, 1)),
        Jump(jne_imm, R5, 0, "pass"),
        byte(R5, 12),
        byte(R0, 13),
        Jump(jeq_imm, R5, 0x86, "ethertype-86"),
        Jump(jne_imm, R5, 0x08, "pass"),
        Jump(jne_imm, R0, 0x00, "pass"),
        Goto("ipv4"),
        Label("ethertype-86"),
        Jump(jne_imm, R0, 0xdd, "pass"),
        Goto("ipv6"),
        Label("ipv4"),
    ]);
    p.extend(bounds(34));
    p.extend([
        byte(R5, 14),
        Jump(jeq_imm, R5, 0x45, "ipv4-plain"),
        // Not version 4: fibre drops it; version 4 with options: the kernel's.
        Op(mov_reg(R0, R5)),
        Op(and_imm(R0, 0xf0)),
        Jump(jne_imm, R0, 0x40, "redirect"),
        Op(and_imm(R5, 0x0f)),
        Jump(jgt_imm, R5, 5, "pass"),
        Goto("redirect"),
        Label("ipv4-plain"),
        // Multicast (224/4) and limited broadcast: the kernel's.
        byte(R5, 30),
        Op(and_imm(R5, 0xf0)),
        Jump(jeq_imm, R5, 0xe0, "pass"),
        Op(load(Size::W, R5, R2, 30)),
        Op(mov_reg(R0, R5)),
        Op(add_imm(R0, 1)),
        // 0xffffffff + 1, in 64 bits.
        Op(bpf::rsh_imm(R0, 32)),
        Jump(jne_imm, R0, 0, "pass"),
        Op(store_imm(Size::W, R10, -24, 128)),
        Op(store_imm(Size::W, R10, -20, 0)),
        Op(store_imm(Size::W, R10, -16, 0)),
        Op(store_imm(
            Size::W,
            R10,
            -12,
            i32::from_ne_bytes([0, 0, 0xff, 0xff]),
        )),
        Op(store_reg(Size::W, R10, -8, R5)),
        Op(mov_imm(R7, 4)),
        Goto("lookup"),
        Label("ipv6"),
    ]);
    p.extend(bounds(54));
    p.extend([
        byte(R5, 14),
        Op(and_imm(R5, 0xf0)),
        Jump(jne_imm, R5, 0x60, "redirect"),
        // A hop-by-hop header: the kernel's.
        byte(R5, 20),
        Jump(jeq_imm, R5, 0, "pass"),
        // Multicast and link-local destinations: the kernel's.
        byte(R5, 38),
        Jump(jeq_imm, R5, 0xff, "pass"),
        Jump(jne_imm, R5, 0xfe, "ipv6-key"),
        byte(R5, 39),
        Op(and_imm(R5, 0xc0)),
        Jump(jeq_imm, R5, 0x80, "pass"),
        Label("ipv6-key"),
        Op(store_imm(Size::W, R10, -24, 128)),
        Op(mov_imm(R7, 6)),
    ]);
    for k in 0..4i16 {
        p.push(Op(load(Size::W, R5, R2, 38 + 4 * k)));
        p.push(Op(store_reg(Size::W, R10, -20 + 4 * k, R5)));
    }
    p.extend([
        Label("lookup"),
        Wide(bpf::load_map(R1, local)),
        Op(mov_reg(R2, R10)),
        Op(add_imm(R2, -24)),
        Op(call(bpf::HELPER_MAP_LOOKUP_ELEM)),
        // A destination of this host: the kernel's.
        Jump(jne_imm, R0, 0, "pass"),
        // The helper took R2 and R3.
        Op(load(Size::W, R2, R6, 0)),
        Op(load(Size::W, R3, R6, 4)),
        Jump(jeq_imm, R7, 6, "lane6"),
    ]);
    p.extend(partial_checksums());
    p.extend([
        Label("redirect"),
        Op(load(Size::W, R2, R6, 16)),
        Wide(bpf::load_map(R1, sockets)),
        Op(mov_imm(R3, missing as i32)),
        Op(call(bpf::HELPER_REDIRECT_MAP)),
        Op(exit()),
        Label("pass"),
        Op(mov_imm(R0, XDP_PASS as i32)),
        Op(exit()),
    ]);
    assemble(&p)
}

/// Protocols inside which a checksum may be left partial: IP in IP, IPv6 in IP, GRE,
/// SCTP (whose CRC is offloaded as a checksum is).
const CARRIERS: [u8; 4] = [4, 41, 47, 132];
/// IPv6 extension headers a partial checksum may follow (the hop-by-hop header goes to
/// the kernel already; a fragment's checksum is never partial; ESP and AH hide theirs):
/// routing, destination options, mobility, HIP, shim6.
const EXTENSIONS: [u8; 5] = [43, 60, 135, 139, 140];

/// Whether the program passes `frame` (an IPv4 packet without options or an IPv6
/// packet, to a destination not of this host) for what its checksum may be: a TCP or
/// UDP packet, not a fragment, whose checksum field holds its pseudo-header's sum; a
/// packet of a protocol that carries another (IP in IP, IPv6 in IP, GRE, SCTP); an IPv6
/// packet behind a routing, destination options, mobility, HIP or shim6 header.
#[cfg(test)]
pub fn may_hide_a_partial_checksum(frame: &[u8]) -> bool {
    let Ok(eth) = EthernetFrame::new_checked(frame) else {
        return false;
    };
    // The checksum field of a TCP or UDP header starting at `l4` of the packet `ip`,
    // if the packet reaches it (as the program reads it: the field, not the whole
    // header).
    let field = |ip: &[u8], l4: usize, protocol: u8| {
        let at = l4
            + match protocol {
                TCP => tcp::field::CHECKSUM.start,
                _ => udp::field::CHECKSUM.start,
            };
        ip.get(at..at + 2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    };
    let ip = eth.into_payload();
    match eth.ethertype() {
        ETHERTYPE_IPV4 => {
            let Ok(h) = Ipv4Packet::new_checked(ip) else {
                return false;
            };
            if h.version() != 4 || h.header_len() != ipv4::HEADER_LEN || h.is_fragment() {
                return false;
            }
            let protocol = h.protocol();
            // Less the header, in ones' complement as the program takes it off.
            let len = checksum::add(h.total_len(), !(ipv4::HEADER_LEN as u16));
            let pseudo = || {
                checksum::pseudo_header_sum(
                    &h.source().octets(),
                    &h.destination().octets(),
                    protocol,
                    u32::from(len),
                )
            };
            match protocol {
                TCP | UDP => field(ip, ipv4::HEADER_LEN, protocol) == Some(pseudo()),
                p => CARRIERS.contains(&p),
            }
        }
        ETHERTYPE_IPV6 => {
            let Ok(h) = Ipv6Packet::new_checked(ip) else {
                return false;
            };
            if h.version() != 6 {
                return false;
            }
            let next = h.next_header();
            let pseudo = || {
                checksum::pseudo_header_sum(
                    &h.source().octets(),
                    &h.destination().octets(),
                    next,
                    u32::from(h.payload_len()),
                )
            };
            match next {
                TCP | UDP => field(ip, ipv6::HEADER_LEN, next) == Some(pseudo()),
                n => CARRIERS.contains(&n) || EXTENSIONS.contains(&n),
            }
        }
        _ => false,
    }
}

/// The part of the program that passes what may hide a partial checksum
/// ([`may_hide_a_partial_checksum`]), entered at `lane4` (IPv4, the frame 34 bytes at
/// least) or `lane6` (IPv6, 54), with `R2` and `R3` the frame's bounds; it goes on to
/// `redirect` or `pass`.
///
/// The pseudo-header is summed from 32-bit and 16-bit loads in this machine's order:
/// the ones' complement sum of byte-swapped words is the byte-swapped sum (RFC 1071,
/// 2(B)), so the folded sum is compared with the checksum field loaded the same way;
/// the protocol and the length are added swapped, and IPv4's header length taken off
/// as the ones' complement of 20, swapped (`0xebff`).
fn partial_checksums() -> Vec<Item> {
    use bpf::{
        add_imm, add_reg, and_imm, jeq_imm, jeq_reg, jgt_reg, jne_imm, load, lsh_imm, mov_reg, Size,
    };
    use Item::*;
    let bounds = |len| {
        [
            Op(mov_reg(R4, R2)),
            Op(add_imm(R4, len)),
            // Too short for the field: not partial.
            JumpReg(jgt_reg, R4, R3, "redirect"),
        ]
    };
    // The bounds checked again: the verifier forgot them with the registers.
    let mut p = Vec::from(bounds(34));
    p.extend([
        // IPv4: not a fragment (flags and offset, but DF, all zero).
        Op(load(Size::B, R5, R2, 20)),
        Op(and_imm(R5, 0x3f)),
        Jump(jne_imm, R5, 0, "redirect"),
        Op(load(Size::B, R5, R2, 21)),
        Jump(jne_imm, R5, 0, "redirect"),
        Op(load(Size::B, R8, R2, 23)),
        Jump(jeq_imm, R8, 6, "tcp4"),
        Jump(jeq_imm, R8, 17, "udp4"),
    ]);
    for c in CARRIERS {
        p.push(Jump(jeq_imm, R8, i32::from(c), "pass"));
    }
    p.push(Goto("redirect"));
    p.push(Label("tcp4"));
    p.extend(bounds(52));
    p.extend([Op(load(Size::H, R9, R2, 50)), Goto("sum4"), Label("udp4")]);
    p.extend(bounds(42));
    p.extend([
        Op(load(Size::H, R9, R2, 40)),
        Label("sum4"),
        Op(load(Size::W, R5, R2, 26)),
        Op(load(Size::W, R0, R2, 30)),
        Op(add_reg(R5, R0)),
        Op(load(Size::H, R0, R2, 16)),
        Op(add_reg(R5, R0)),
        Op(add_imm(R5, 0xebff)),
        Goto("protocol"),
        Label("lane6"),
    ]);
    p.extend(bounds(54));
    p.extend([
        Op(load(Size::B, R8, R2, 20)),
        Jump(jeq_imm, R8, 6, "tcp6"),
        Jump(jeq_imm, R8, 17, "udp6"),
    ]);
    for c in CARRIERS.into_iter().chain(EXTENSIONS) {
        p.push(Jump(jeq_imm, R8, i32::from(c), "pass"));
    }
    p.push(Goto("redirect"));
    p.push(Label("tcp6"));
    p.extend(bounds(72));
    p.extend([Op(load(Size::H, R9, R2, 70)), Goto("sum6"), Label("udp6")]);
    p.extend(bounds(62));
    p.extend([
        Op(load(Size::H, R9, R2, 60)),
        Label("sum6"),
        Op(load(Size::H, R5, R2, 18)),
    ]);
    for k in 0..8 {
        p.push(Op(load(Size::W, R0, R2, 22 + 4 * k)));
        p.push(Op(add_reg(R5, R0)));
    }
    p.extend([Label("protocol"), Op(lsh_imm(R8, 8)), Op(add_reg(R5, R8))]);
    // Folded four times: a sum of at most ten 32-bit words fits 16 bits after three.
    for _ in 0..4 {
        p.extend([
            Op(mov_reg(R0, R5)),
            Op(bpf::rsh_imm(R0, 16)),
            Op(and_imm(R5, 0xffff)),
            Op(add_reg(R5, R0)),
        ]);
    }
    p.extend([JumpReg(jeq_reg, R5, R9, "pass"), Goto("redirect")]);
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::{classify, Input};
    use rand::{Rng, SeedableRng};
    use std::net::{Ipv4Addr, Ipv6Addr};

    const MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 1];

    fn locals() -> Vec<(IpAddr, u8)> {
        [
            ("10.0.0.1", 32),
            ("10.9.0.0", 16),
            ("127.0.0.0", 8),
            ("2001:db8:1::1", 128),
            ("2001:db8:ff::", 48),
            ("::1", 128),
        ]
        .into_iter()
        .map(|(a, l)| (a.parse().unwrap(), l))
        .collect()
    }

    fn is_local(addr: IpAddr) -> bool {
        locals().iter().any(|&(net, len)| match (net, addr) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                len == 0 || (u32::from(n) ^ u32::from(a)) >> (32 - u32::from(len)) == 0
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                len == 0 || (u128::from(n) ^ u128::from(a)) >> (128 - u32::from(len)) == 0
            }
            _ => false,
        })
    }

    /// A random frame: mostly well-formed IPv4 and IPv6 to this host's MAC, with group
    /// and other MACs, other EtherTypes, bad versions, options, bad checksums and
    /// lengths, truncations, and destinations of every kind the program tells apart.
    fn random_frame(rng: &mut impl Rng) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&match rng.gen_range(0..10) {
            0 => [0xff; 6],
            1 => [0x33, 0x33, 0, 0, 0, 1],
            2 => [0x02, 9, 9, 9, 9, 9],
            _ => MAC,
        });
        f.extend_from_slice(&[0x02, 0, 0, 0, 0, 2]);
        let ethertype: u16 = match rng.gen_range(0..12) {
            0 => 0x0806,
            1 => 0x8100,
            2 => rng.gen(),
            3..=7 => 0x0800,
            _ => 0x86dd,
        };
        f.extend_from_slice(&ethertype.to_be_bytes());
        if ethertype == 0x0800 || rng.gen_bool(0.1) {
            let ihl: u8 = if rng.gen_bool(0.8) {
                5
            } else {
                rng.gen_range(0..16)
            };
            let version: u8 = if rng.gen_bool(0.9) {
                4
            } else {
                rng.gen_range(0..16)
            };
            let dst: Ipv4Addr = match rng.gen_range(0..8) {
                0 => "10.0.0.1".parse().unwrap(),
                1 => Ipv4Addr::new(10, 9, rng.gen(), rng.gen()),
                2 => Ipv4Addr::new(224 + rng.gen_range(0..16), rng.gen(), 0, 5),
                3 => Ipv4Addr::BROADCAST,
                4 => Ipv4Addr::new(255, 255, 255, 254),
                5 => Ipv4Addr::new(127, 0, 0, 1),
                _ => Ipv4Addr::from(rng.gen::<u32>()),
            };
            let header_len = (usize::from(ihl) * 4).max(20);
            let protocol = protocol(rng, &[1, 4, 47, 132]);
            let src = rng.gen::<u32>().to_be_bytes();
            let l4 = transport(rng, protocol, &src, &dst.octets());
            let total = header_len + l4.len();
            let mut h = vec![0u8; header_len];
            h[0] = version << 4 | ihl;
            h[2..4].copy_from_slice(&(total as u16).to_be_bytes());
            // Now and then a fragment: more to come, or an offset.
            match rng.gen_range(0..20) {
                0 => h[6] = 0x20,
                1 => h[7] = rng.gen_range(1..=255),
                2 => h[6] = 0x40,
                _ => {}
            }
            h[8] = rng.gen();
            h[9] = protocol;
            h[12..16].copy_from_slice(&src);
            h[16..20].copy_from_slice(&dst.octets());
            if rng.gen_bool(0.1) {
                h[2..4].copy_from_slice(&rng.gen::<u16>().to_be_bytes());
            }
            let sum = !fibre_headers::checksum::sum(&h[..header_len.min(60)]);
            h[10..12].copy_from_slice(&sum.to_be_bytes());
            if rng.gen_bool(0.1) {
                h[10] ^= 0x40;
            }
            f.extend_from_slice(&h);
            f.extend_from_slice(&l4);
        } else {
            let version: u8 = if rng.gen_bool(0.9) {
                6
            } else {
                rng.gen_range(0..16)
            };
            let dst: Ipv6Addr = match rng.gen_range(0..9) {
                0 => "2001:db8:1::1".parse().unwrap(),
                1 => Ipv6Addr::from(0x2001_0db8_00ff_u128 << 80 | rng.gen::<u64>() as u128),
                2 => "ff02::1".parse().unwrap(),
                3 => "fe80::1".parse().unwrap(),
                4 => "febf::1".parse().unwrap(),
                5 => "fec0::1".parse().unwrap(),
                6 => Ipv6Addr::LOCALHOST,
                _ => Ipv6Addr::from(rng.gen::<u128>()),
            };
            let src: Ipv6Addr = if rng.gen_bool(0.05) {
                "ff02::2".parse().unwrap()
            } else {
                Ipv6Addr::from(rng.gen::<u128>())
            };
            let next = match rng.gen_range(0..10) {
                0 => 0,
                1 => rng.gen(),
                _ => protocol(rng, &[44, 43, 60, 58, 41, 132, 50]),
            };
            let l4 = transport(rng, next, &src.octets(), &dst.octets());
            let mut h = [0u8; 40];
            h[0] = version << 4;
            h[4..6].copy_from_slice(&(l4.len() as u16).to_be_bytes());
            h[6] = next;
            h[7] = rng.gen();
            h[8..24].copy_from_slice(&src.octets());
            h[24..40].copy_from_slice(&dst.octets());
            f.extend_from_slice(&h);
            f.extend_from_slice(&l4);
        }
        if rng.gen_bool(0.1) {
            let len = rng.gen_range(14..=f.len());
            f.truncate(len);
        }
        f
    }

    /// A protocol: UDP mostly, TCP often, now and then one of `others`.
    fn protocol(rng: &mut impl Rng, others: &[u8]) -> u8 {
        match rng.gen_range(0..10) {
            0..=4 => 17,
            5..=7 => 6,
            _ => others[rng.gen_range(0..others.len())],
        }
    }

    /// A transport header and a few bytes for `protocol` between `src` and `dst`: for
    /// TCP and UDP, half the time with the checksum field holding the pseudo-header's
    /// sum, as a sender leaves it for offload, else anything.
    fn transport(rng: &mut impl Rng, protocol: u8, src: &[u8], dst: &[u8]) -> Vec<u8> {
        let (len, field) = match protocol {
            6 => (20 + rng.gen_range(0..8), Some(16)),
            17 => (8 + rng.gen_range(0..8), Some(6)),
            _ => (8, None),
        };
        let mut l4: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        if let Some(at) = field {
            let sum = if rng.gen_bool(0.5) {
                checksum::pseudo_header_sum(src, dst, protocol, len as u32)
            } else {
                rng.gen()
            };
            l4[at..at + 2].copy_from_slice(&sum.to_be_bytes());
        }
        l4
    }

    /// Frames the program hands to the kernel before fibre's checks would have dropped
    /// them: the kernel drops them instead, as it drops them without fibre.
    fn kernel_anyway(f: &[u8]) -> bool {
        let ethertype = u16::from_be_bytes([f[12], f[13]]);
        if f[0] & 1 == 1 {
            return true;
        }
        match ethertype {
            0x0800 if f.len() >= 34 => {
                (f[14] >> 4 == 4 && f[14] & 0xf > 5)
                    || (f[14] == 0x45
                        && (f[30] >> 4 == 0xe
                            || f[30..34] == [0xff; 4]
                            || is_local(IpAddr::from(<[u8; 4]>::try_from(&f[30..34]).unwrap()))))
            }
            0x86dd if f.len() >= 54 => {
                f[14] >> 4 == 6
                    && (f[20] == 0
                        || f[38] == 0xff
                        || (f[38] == 0xfe && f[39] & 0xc0 == 0x80)
                        || is_local(IpAddr::from(<[u8; 16]>::try_from(&f[38..54]).unwrap())))
            }
            _ => false,
        }
    }

    /// The program, run by the kernel on random frames, passes exactly what fibre's input
    /// stage hands to the kernel and what is for this host, and redirects what fibre
    /// routes; a frame fibre drops goes to fibre to be counted, unless the kernel would
    /// have taken it first. Then the local prefixes change, and so do the answers.
    #[test]
    #[ignore = "needs root: loads a BPF program"]
    fn the_program_passes_what_is_the_kernels_and_redirects_the_rest() {
        let mut local = LocalDestinations::new().unwrap();
        local.set(locals()).unwrap();
        assert_eq!(local.len(), 6);
        let program = LinkProgram::new(&local, XDP_TX).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(13);
        let mut seen = std::collections::HashMap::new();
        for n in 0..20_000 {
            let f = random_frame(&mut rng);
            let sorted = classify(&f, MAC);
            let want = match sorted {
                Input::Kernel(_) => XDP_PASS,
                Input::V4(p) if is_local(p.dst.into()) => XDP_PASS,
                Input::V6(p) if is_local(p.dst.into()) => XDP_PASS,
                Input::Drop(_) if kernel_anyway(&f) => XDP_PASS,
                // What may hide a partial checksum goes the way that says.
                _ if may_hide_a_partial_checksum(&f) => XDP_PASS,
                Input::V4(_) | Input::V6(_) | Input::Drop(_) => XDP_TX,
            };
            let got = program.verdict(&f).unwrap();
            assert_eq!(got, want, "frame {n}: {sorted:?} {f:02x?}");
            let kind = match sorted {
                Input::V4(_) | Input::V6(_) if may_hide_a_partial_checksum(&f) => {
                    "partial".to_string()
                }
                Input::V4(_) => "v4".to_string(),
                Input::V6(_) => "v6".to_string(),
                other => format!("{other:?}"),
            };
            *seen.entry((kind, got)).or_insert(0) += 1;
        }
        // Every kind of frame was seen, and routed packets both ways.
        for kind in ["v4", "v6"] {
            for verdict in [XDP_PASS, XDP_TX] {
                assert!(
                    seen.get(&(kind.to_string(), verdict))
                        .is_some_and(|&n| n > 50),
                    "{kind} {verdict}: {seen:?}"
                );
            }
        }
        assert!(
            seen.get(&("partial".to_string(), XDP_PASS))
                .is_some_and(|&n| n > 500),
            "packets with partial checksums passed: {seen:?}"
        );
        assert!(seen.len() > 20, "{seen:?}");

        // The prefixes change: what was local is routed, and the other way round.
        let to = |dst: &str| {
            let mut f = MAC.to_vec();
            f.extend_from_slice(&[
                2, 0, 0, 0, 0, 2, 0x08, 0x00, 0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 192, 0, 2,
                1,
            ]);
            f.extend_from_slice(&dst.parse::<Ipv4Addr>().unwrap().octets());
            f.extend_from_slice(&[0; 8]);
            f
        };
        assert_eq!(program.verdict(&to("10.9.1.1")).unwrap(), XDP_PASS);
        assert_eq!(program.verdict(&to("10.8.1.1")).unwrap(), XDP_TX);
        local.set([("10.8.0.0".parse().unwrap(), 16)]).unwrap();
        assert_eq!(local.len(), 1);
        assert_eq!(program.verdict(&to("10.9.1.1")).unwrap(), XDP_TX);
        assert_eq!(program.verdict(&to("10.8.1.1")).unwrap(), XDP_PASS);
    }
}
