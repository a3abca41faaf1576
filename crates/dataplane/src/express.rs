//! The express path: frames whose forwarding fibre has already decided, redirected from
//! link to link inside the kernel by a traffic-control program, without reaching a
//! worker.
//!
//! On a veth, the copies around a worker's socket cost more than everything fibre
//! decides (docs/design.md): a frame that crosses the router in the kernel, as an skb
//! that keeps its offloads, costs a fraction. The program decides nothing itself. It
//! looks up an *entry* for the frame's input link and destination, which the daemon
//! wrote from what a worker decided for an earlier frame to that destination: the output
//! link and the MAC addresses to write. An entry carries the serials of the snapshot and
//! of the neighbour table it came from, and counts only while they are the ones in the
//! generation map: publishing a change retires every entry at once.
//!
//! The program forwards a frame only if all of these hold, and otherwise leaves it to
//! the kernel's next step (`TCX_NEXT`), and so to fibre's worker as before:
//!
//! - it was sent to the link's own MAC address, and carries no VLAN tag;
//! - IPv4 without options whose header checksum is right and whose total length is the
//!   frame's, or IPv6 without a hop-by-hop header whose payload length is the frame's;
//! - a time to live or hop limit above 1;
//! - a source the kernel would take: not a martian (IPv4 0/8, 127/8, multicast, limited
//!   broadcast; IPv6 unspecified, loopback, multicast, link-local), and none of this
//!   host's own destinations (the XDP programs' map of local prefixes);
//! - a live entry, and the frame (each of its segments, for a packet left whole for
//!   segmentation) within the output link's MTU (`bpf_check_mtu`).
//!
//! Then the time to live or hop limit is taken down by one (the IPv4 checksum patched
//! as the kernel's `ip_decrease_ttl` does), the MAC addresses are written and the frame
//! is redirected to the output link's transmit path.
//!
//! Which decisions may become entries (one path, no policy rule but the defaults, no
//! route MTU below the link's) is the daemon's to say; this module holds the maps and
//! the program, assembled here as the XDP program is.

use crate::xdp::LocalDestinations;
use fibre_kernel::bpf::{self, assemble, Insn, Item, Map, MapType, Program, Size};
use fibre_kernel::bpf::{HELPER_REDIRECT, SKB_DATA, SKB_DATA_END, SKB_PKT_TYPE};
use fibre_kernel::bpf::{R0, R1, R10, R2, R3, R4, R5, R6, R7, R8, R9};
use std::io;
use std::net::IpAddr;
use std::os::fd::OwnedFd;

/// Destinations the express path holds at most (a hash of 40-byte entries, the least
/// recently used making room): some 4 MiB.
pub const EXPRESS_DESTINATIONS: u32 = 65_536;

pub use fibre_kernel::bpf::TCX_NEXT;
/// `TC_ACT_REDIRECT`, what `bpf_redirect` returns.
#[cfg(test)]
pub const TC_ACT_REDIRECT: u32 = 7;

/// Helper `bpf_check_mtu`.
const HELPER_CHECK_MTU: i32 = 163;
/// `BPF_MTU_CHK_SEGS`: a packet left whole for segmentation fits if its segments do.
const MTU_CHECK_SEGMENTS: i32 = 1;

/// `__sk_buff` offsets.
const SKB_LEN: i16 = 0;
const SKB_VLAN_PRESENT: i16 = 20;
const SKB_IFINDEX: i16 = 40;

/// Bytes of a key: the input link's index, then the destination (IPv4 v4-mapped).
const KEY_LEN: u32 = 20;
/// Bytes of an entry: output link, padding, the two serials, destination and source MAC
/// addresses, padding.
const ENTRY_LEN: u32 = 40;

/// Where a destination's frames go, as a worker decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The output link's index.
    pub out: u32,
    /// The next hop's MAC address.
    pub dst_mac: [u8; 6],
    /// The output link's MAC address.
    pub src_mac: [u8; 6],
}

/// The serials a decision was taken under: the snapshot's and the neighbour table's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Generation {
    /// The FIB snapshot's serial.
    pub snapshot: u64,
    /// The neighbour table's version.
    pub neighbours: u64,
}

impl Generation {
    /// A generation no entry is written under: while it is the current one, the program
    /// forwards nothing by its entries.
    pub const RETIRED: Generation = Generation {
        snapshot: u64::MAX,
        neighbours: u64::MAX,
    };
}

/// The express path's maps and program, attached to links until dropped.
#[derive(Debug)]
pub struct Express {
    entries: Map,
    generation: Map,
    program: Program,
    links: Vec<(u32, OwnedFd)>,
}

fn key(input: u32, dst: IpAddr) -> [u8; KEY_LEN as usize] {
    let mut k = [0u8; KEY_LEN as usize];
    k[..4].copy_from_slice(&input.to_ne_bytes());
    let bytes = match dst {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    };
    k[4..].copy_from_slice(&bytes);
    k
}

impl Express {
    /// The maps (room for `capacity` destinations, the least recently used giving way)
    /// and the program, which consults `local` for sources of this host.
    pub fn new(local: &LocalDestinations, capacity: u32) -> io::Result<Express> {
        let entries = Map::create(
            MapType::LruHash,
            KEY_LEN,
            ENTRY_LEN,
            capacity,
            "fibre_express",
        )?;
        let generation = Map::new(MapType::Array, 16, 1, "fibre_expr_gen")?;
        let insns = program(local.map(), &entries, &generation);
        let program = Program::load(bpf::PROG_TYPE_SCHED_CLS, &insns, "fibre_express")?;
        Ok(Express {
            entries,
            generation,
            program,
            links: Vec::new(),
        })
    }

    /// Attaches the program to the traffic-control ingress of link `ifindex` (in the
    /// calling thread's network namespace), until this value is dropped or
    /// [`Express::detach`] is called.
    pub fn attach(&mut self, ifindex: u32) -> io::Result<()> {
        let fd = self.program.attach_tc_ingress(ifindex)?;
        self.links.push((ifindex, fd));
        Ok(())
    }

    /// Takes the program off link `ifindex`.
    pub fn detach(&mut self, ifindex: u32) {
        self.links.retain(|(i, _)| *i != ifindex);
    }

    /// The links the program is on.
    pub fn links(&self) -> Vec<u32> {
        self.links.iter().map(|(i, _)| *i).collect()
    }

    /// Makes `g` the generation whose entries count; every other entry is retired.
    pub fn set_generation(&self, g: Generation) -> io::Result<()> {
        let mut v = [0u8; 16];
        v[..8].copy_from_slice(&g.snapshot.to_ne_bytes());
        v[8..].copy_from_slice(&g.neighbours.to_ne_bytes());
        self.generation.set(0, &v)
    }

    /// Writes the entry for frames from link `input` to `dst`, decided under `g`.
    pub fn learn(&self, input: u32, dst: IpAddr, entry: Entry, g: Generation) -> io::Result<()> {
        let mut v = [0u8; ENTRY_LEN as usize];
        v[..4].copy_from_slice(&entry.out.to_ne_bytes());
        v[8..16].copy_from_slice(&g.snapshot.to_ne_bytes());
        v[16..24].copy_from_slice(&g.neighbours.to_ne_bytes());
        v[24..30].copy_from_slice(&entry.dst_mac);
        v[30..36].copy_from_slice(&entry.src_mac);
        self.entries.update(&key(input, dst), &v)
    }

    /// What the program answers for `frame` arriving on link `ifindex` (in the calling
    /// thread's network namespace), and the frame as it left it.
    pub fn run(&self, frame: &[u8], ifindex: u32) -> io::Result<(u32, Vec<u8>)> {
        // A `struct __sk_buff`: only the fields a test run may set; the link is the
        // input link, whose MAC address decides whether the frame is for this host.
        let mut ctx = [0u8; 192];
        ctx[SKB_IFINDEX as usize..SKB_IFINDEX as usize + 4].copy_from_slice(&ifindex.to_ne_bytes());
        self.program.test_run_frame(frame, &ctx)
    }
}

/// Stack layout: the entry key at `R10 - 24` (20 bytes), the local-prefix key at
/// `R10 - 48` (a prefix length of 128, then 16 bytes), the generation map's index at
/// `R10 - 52`, `bpf_check_mtu`'s length at `R10 - 56`.
const ENTRY_KEY: i16 = -24;
const LOCAL_KEY: i16 = -48;
const GENERATION_KEY: i16 = -52;
const MTU_LEN: i16 = -56;

/// The program. `R6` is the context, `R7` the frame's first byte and `R8` its end, `R9`
/// the entry once found.
fn program(local: &Map, entries: &Map, generation: &Map) -> Vec<Insn> {
    use bpf::{
        add_imm, add_reg, and_imm, be16, call, exit, jeq_imm, jgt_reg, jlt_imm, jne32_imm, jne_imm,
        jne_reg, load, mov_imm, mov_reg, or_reg, rsh_imm, store_imm, store_reg,
    };
    use Item::*;
    let byte = |dst, off| Op(load(Size::B, dst, R7, off));
    let bounds = |len| {
        [
            Op(mov_reg(R2, R7)),
            Op(add_imm(R2, len)),
            JumpReg(jgt_reg, R2, R8, "next"),
        ]
    };
    // Writes the IPv4 address at `from` in the frame to the stack at `to`, v4-mapped:
    // ten zero bytes, two 0xff, the address.
    let v4_mapped = |from: i16, to: i16| bpf::v4_mapped_to_stack(R7, R2, from, to);
    // Copies 16 address bytes from the frame at `from` to the stack at `to`.
    let address = |from: i16, to: i16| -> Vec<Item> {
        (0..4i16)
            .flat_map(|k| {
                [
                    Op(load(Size::W, R2, R7, from + 4 * k)),
                    Op(store_reg(Size::W, R10, to + 4 * k, R2)),
                ]
            })
            .collect()
    };
    let mut p = vec![
        Op(mov_reg(R6, R1)),
        Op(load(Size::W, R2, R6, SKB_PKT_TYPE)),
        Jump(jne_imm, R2, 0, "next"),
        Op(load(Size::W, R2, R6, SKB_VLAN_PRESENT)),
        Jump(jne_imm, R2, 0, "next"),
        Op(load(Size::W, R7, R6, SKB_DATA)),
        Op(load(Size::W, R8, R6, SKB_DATA_END)),
        // The keys' fixed parts.
        Op(load(Size::W, R2, R6, SKB_IFINDEX)),
        Op(store_reg(Size::W, R10, ENTRY_KEY, R2)),
        Op(store_imm(Size::W, R10, LOCAL_KEY, 128)),
    ];
    p.extend(bounds(14));
    p.extend([
        Op(load(Size::H, R2, R7, 12)),
        Jump(jeq_imm, R2, 0x0008, "ipv4"),
        Jump(jne_imm, R2, 0xdd86, "next"),
    ]);

    // IPv6.
    p.extend(bounds(54));
    p.extend([
        byte(R2, 14),
        Op(and_imm(R2, 0xf0)),
        Jump(jne_imm, R2, 0x60, "next"),
        Op(load(Size::H, R2, R7, 18)),
        Op(be16(R2)),
        Op(add_imm(R2, 54)),
        Op(load(Size::W, R3, R6, SKB_LEN)),
        JumpReg(jne_reg, R2, R3, "next"),
        byte(R2, 20),
        Jump(jeq_imm, R2, 0, "next"),
        byte(R2, 21),
        Jump(jlt_imm, R2, 2, "next"),
        // Source: multicast, link-local.
        byte(R2, 22),
        Jump(jeq_imm, R2, 0xff, "next"),
        Jump(jne_imm, R2, 0xfe, "v6-source-zero"),
        byte(R2, 23),
        Op(and_imm(R2, 0xc0)),
        Jump(jeq_imm, R2, 0x80, "next"),
        Label("v6-source-zero"),
        // Unspecified (all zero) and loopback (::1): the first 15 bytes zero.
        Op(load(Size::W, R2, R7, 22)),
        Op(load(Size::W, R3, R7, 26)),
        Op(or_reg(R2, R3)),
        Op(load(Size::W, R3, R7, 30)),
        Op(or_reg(R2, R3)),
        Op(load(Size::W, R3, R7, 34)),
        Op(and_imm(R3, 0x00ff_ffff)),
        Op(or_reg(R2, R3)),
        Jump(jeq_imm, R2, 0, "next"),
    ]);
    p.extend(address(38, ENTRY_KEY + 4));
    p.extend(address(22, LOCAL_KEY + 4));
    p.push(Goto("lookup"));

    // IPv4.
    p.push(Label("ipv4"));
    p.extend(bounds(34));
    p.extend([
        byte(R2, 14),
        Jump(jne_imm, R2, 0x45, "next"),
        Op(load(Size::H, R2, R7, 16)),
        Op(be16(R2)),
        Op(add_imm(R2, 14)),
        Op(load(Size::W, R3, R6, SKB_LEN)),
        JumpReg(jne_reg, R2, R3, "next"),
        byte(R2, 22),
        Jump(jlt_imm, R2, 2, "next"),
    ]);
    // The header checksum: the ones' complement sum of its ten half-words is 0xffff
    // (in either byte order).
    p.push(Op(mov_imm(R3, 0)));
    for k in 0..10i16 {
        p.push(Op(load(Size::H, R2, R7, 14 + 2 * k)));
        p.push(Op(add_reg(R3, R2)));
    }
    for _ in 0..2 {
        p.extend([
            Op(mov_reg(R2, R3)),
            Op(rsh_imm(R2, 16)),
            Op(and_imm(R3, 0xffff)),
            Op(add_reg(R3, R2)),
        ]);
    }
    p.extend([
        Jump(jne_imm, R3, 0xffff, "next"),
        // Source: 0/8, 127/8, multicast, limited broadcast.
        byte(R2, 26),
        Jump(jeq_imm, R2, 0, "next"),
        Jump(jeq_imm, R2, 127, "next"),
        Op(and_imm(R2, 0xf0)),
        Jump(jeq_imm, R2, 0xe0, "next"),
        Op(load(Size::W, R2, R7, 26)),
        Jump(jne32_imm, R2, -1, "v4-keys"),
        Goto("next"),
        Label("v4-keys"),
    ]);
    p.extend(v4_mapped(30, ENTRY_KEY + 4));
    p.extend(v4_mapped(26, LOCAL_KEY + 4));

    // Both families: the source not this host's, a live entry, the MTU.
    p.extend([
        Label("lookup"),
        Wide(bpf::load_map(R1, local)),
        Op(mov_reg(R2, R10)),
        Op(add_imm(R2, LOCAL_KEY as i32)),
        Op(call(bpf::HELPER_MAP_LOOKUP_ELEM)),
        Jump(jne_imm, R0, 0, "next"),
        Wide(bpf::load_map(R1, entries)),
        Op(mov_reg(R2, R10)),
        Op(add_imm(R2, ENTRY_KEY as i32)),
        Op(call(bpf::HELPER_MAP_LOOKUP_ELEM)),
        Jump(jeq_imm, R0, 0, "next"),
        Op(mov_reg(R9, R0)),
        Op(store_imm(Size::W, R10, GENERATION_KEY, 0)),
        Wide(bpf::load_map(R1, generation)),
        Op(mov_reg(R2, R10)),
        Op(add_imm(R2, GENERATION_KEY as i32)),
        Op(call(bpf::HELPER_MAP_LOOKUP_ELEM)),
        Jump(jeq_imm, R0, 0, "next"),
        Op(load(Size::DW, R2, R0, 0)),
        Op(load(Size::DW, R3, R9, 8)),
        JumpReg(jne_reg, R2, R3, "next"),
        Op(load(Size::DW, R2, R0, 8)),
        Op(load(Size::DW, R3, R9, 16)),
        JumpReg(jne_reg, R2, R3, "next"),
        Op(store_imm(Size::W, R10, MTU_LEN, 0)),
        Op(mov_reg(R1, R6)),
        Op(load(Size::W, R2, R9, 0)),
        Op(mov_reg(R3, R10)),
        Op(add_imm(R3, MTU_LEN as i32)),
        Op(mov_imm(R4, 0)),
        Op(mov_imm(R5, MTU_CHECK_SEGMENTS)),
        Op(call(HELPER_CHECK_MTU)),
        Jump(jne_imm, R0, 0, "next"),
        // The frame's pointers held across the calls, none of which moves the frame;
        // the verifier checks that they still may be used.
        Op(load(Size::H, R2, R7, 12)),
        Jump(jeq_imm, R2, 0x0008, "ipv4-rewrite"),
        byte(R2, 21),
        Op(add_imm(R2, -1)),
        Op(store_reg(Size::B, R7, 21, R2)),
        Goto("macs"),
        Label("ipv4-rewrite"),
        byte(R2, 22),
        Op(add_imm(R2, -1)),
        Op(store_reg(Size::B, R7, 22, R2)),
    ]);
    p.extend(bpf::ttl_checksum_patch(R7, R2, "ipv4-sum"));
    p.extend([
        Label("macs"),
        Op(load(Size::W, R2, R9, 24)),
        Op(store_reg(Size::W, R7, 0, R2)),
        Op(load(Size::H, R2, R9, 28)),
        Op(store_reg(Size::H, R7, 4, R2)),
        Op(load(Size::H, R2, R9, 30)),
        Op(store_reg(Size::H, R7, 6, R2)),
        Op(load(Size::W, R2, R9, 32)),
        Op(store_reg(Size::W, R7, 8, R2)),
        Op(load(Size::W, R1, R9, 0)),
        Op(mov_imm(R2, 0)),
        Op(call(HELPER_REDIRECT)),
        Op(exit()),
        Label("next"),
        Op(mov_imm(R0, TCX_NEXT)),
        Op(exit()),
    ]);
    assemble(&p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rewrite;
    use fibre_testbed::netns::Namespace;
    use rand::{Rng, SeedableRng};
    use std::net::{Ipv4Addr, Ipv6Addr};

    const IN_MAC: [u8; 6] = [0x02, 0xe0, 0, 0, 0, 1];
    const OUT_MAC: [u8; 6] = [0x02, 0xe1, 0, 0, 0, 1];
    const NEXT_MAC: [u8; 6] = [0x02, 0xe1, 0, 0, 0, 9];
    const OUT_MTU: usize = 1400;

    fn local(a: IpAddr) -> bool {
        ["10.0.0.1", "2001:db8:1::1"]
            .iter()
            .any(|l| l.parse::<IpAddr>().unwrap() == a)
    }

    /// Destinations with entries: `10.9.0.0`-`10.9.0.15` and `2001:db8:9::0`-`f`.
    fn learned(a: IpAddr) -> bool {
        match a {
            IpAddr::V4(a) => u32::from(a) >> 4 == u32::from(Ipv4Addr::new(10, 9, 0, 0)) >> 4,
            IpAddr::V6(a) => {
                u128::from(a) >> 4 == u128::from("2001:db8:9::".parse::<Ipv6Addr>().unwrap()) >> 4
            }
        }
    }

    fn mac_text(m: [u8; 6]) -> String {
        m.map(|b| format!("{b:02x}")).join(":")
    }

    fn v4_sum_ok(h: &[u8]) -> bool {
        fibre_headers::checksum::sum(h) == 0xffff
    }

    /// What the program must do with `f`, said simply: the frame it sends, or `None` to
    /// leave it to the kernel.
    fn model(f: &[u8]) -> Option<Vec<u8>> {
        if f.len() < 14 || f[..6] != IN_MAC {
            return None;
        }
        let mut out = f.to_vec();
        match u16::from_be_bytes([f[12], f[13]]) {
            0x0800 if f.len() >= 34 => {
                let h = &f[14..34];
                let src = Ipv4Addr::new(h[12], h[13], h[14], h[15]);
                let dst = Ipv4Addr::new(h[16], h[17], h[18], h[19]);
                let ok = h[0] == 0x45
                    && usize::from(u16::from_be_bytes([h[2], h[3]])) + 14 == f.len()
                    && h[8] > 1
                    && v4_sum_ok(h)
                    && !(src.octets()[0] == 0
                        || src.octets()[0] == 127
                        || src.is_multicast()
                        || src.is_broadcast()
                        || local(src.into()))
                    && learned(dst.into())
                    && f.len() - 14 <= OUT_MTU;
                if !ok {
                    return None;
                }
                rewrite::decrement_ttl(&mut out);
            }
            0x86dd if f.len() >= 54 => {
                let h = &f[14..54];
                let src = Ipv6Addr::from(<[u8; 16]>::try_from(&h[8..24]).unwrap());
                let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&h[24..40]).unwrap());
                let s = src.octets();
                let ok = h[0] >> 4 == 6
                    && usize::from(u16::from_be_bytes([h[4], h[5]])) + 54 == f.len()
                    && h[6] != 0
                    && h[7] > 1
                    && !(s[0] == 0xff
                        || (s[0] == 0xfe && s[1] & 0xc0 == 0x80)
                        || s[..15].iter().all(|&b| b == 0)
                        || local(src.into()))
                    && learned(dst.into())
                    && f.len() - 14 <= OUT_MTU;
                if !ok {
                    return None;
                }
                rewrite::decrement_hop_limit(&mut out);
            }
            _ => return None,
        }
        rewrite::set_macs(&mut out, NEXT_MAC, OUT_MAC);
        Some(out)
    }

    /// A frame to vary: IPv4 or IPv6 UDP, of a random length, to a learned destination
    /// or not, from a good source or a refused one; then now and then a field spoiled.
    fn random_frame(rng: &mut impl Rng) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(if rng.gen_bool(0.9) {
            &IN_MAC
        } else {
            &[0x02, 9, 9, 9, 9, 9]
        });
        f.extend_from_slice(&[0x02, 0xe0, 0, 0, 0, 2]);
        let payload = rng.gen_range(8..OUT_MTU);
        if rng.gen_bool(0.5) {
            f.extend_from_slice(&[0x08, 0x00]);
            let dst = match rng.gen_range(0..4) {
                0 => Ipv4Addr::from(rng.gen::<u32>()),
                _ => Ipv4Addr::new(10, 9, 0, rng.gen_range(0..20)),
            };
            let src = match rng.gen_range(0..12) {
                0 => Ipv4Addr::new(0, 1, 2, 3),
                1 => Ipv4Addr::new(127, 0, 0, 1),
                2 => Ipv4Addr::new(224, 0, 0, 5),
                3 => Ipv4Addr::BROADCAST,
                4 => "10.0.0.1".parse().unwrap(),
                _ => Ipv4Addr::new(192, 0, 2, rng.gen()),
            };
            let mut h = [0u8; 20];
            h[0] = 0x45;
            h[2..4].copy_from_slice(&((20 + payload) as u16).to_be_bytes());
            h[8] = rng.gen_range(0..4).max(rng.gen_range(0..64));
            h[9] = 17;
            h[12..16].copy_from_slice(&src.octets());
            h[16..20].copy_from_slice(&dst.octets());
            let sum = !fibre_headers::checksum::sum(&h);
            h[10..12].copy_from_slice(&sum.to_be_bytes());
            f.extend_from_slice(&h);
        } else {
            f.extend_from_slice(&[0x86, 0xdd]);
            let dst: Ipv6Addr = match rng.gen_range(0..4) {
                0 => Ipv6Addr::from(rng.gen::<u128>()),
                _ => Ipv6Addr::from(
                    u128::from("2001:db8:9::".parse::<Ipv6Addr>().unwrap()) | rng.gen_range(0..20),
                ),
            };
            let src: Ipv6Addr = match rng.gen_range(0..12) {
                0 => Ipv6Addr::UNSPECIFIED,
                1 => Ipv6Addr::LOCALHOST,
                2 => "ff02::1".parse().unwrap(),
                3 => "fe80::1".parse().unwrap(),
                4 => "2001:db8:1::1".parse().unwrap(),
                _ => Ipv6Addr::from(0x2001_0db8_00aa_u128 << 80 | rng.gen::<u64>() as u128),
            };
            let mut h = [0u8; 40];
            h[0] = 0x60;
            h[4..6].copy_from_slice(&(payload as u16).to_be_bytes());
            h[6] = if rng.gen_bool(0.1) { 0 } else { 17 };
            h[7] = rng.gen_range(0..4).max(rng.gen_range(0..64));
            h[8..24].copy_from_slice(&src.octets());
            h[24..40].copy_from_slice(&dst.octets());
            f.extend_from_slice(&h);
        }
        f.extend((0..payload).map(|_| rng.gen::<u8>()));
        // Spoil something now and then: a byte of the header, the length.
        match rng.gen_range(0..20) {
            0 => {
                let at = rng.gen_range(12..34);
                f[at] ^= 1 << rng.gen_range(0..8);
            }
            1 => f.truncate(rng.gen_range(14..f.len())),
            2 => f.extend_from_slice(&[0; 6]),
            3 => f.extend((0..200).map(|_| rng.gen::<u8>())),
            _ => {}
        }
        f
    }

    /// The program, run by the kernel on random frames, forwards exactly what the
    /// simple model says, rewritten byte for byte as fibre's own rewrite does; entries
    /// of another generation count for nothing.
    #[test]
    #[ignore = "needs root: a network namespace with links, and a BPF program"]
    fn the_program_forwards_what_the_entries_allow_and_nothing_else() {
        let ns = Namespace::create("fibre-express").unwrap();
        ns.batch(&format!(
            "link add in0 address {} type veth peer name in1
link add out0 address {} mtu {OUT_MTU} type veth peer name out1
link set in0 up
link set out0 up
",
            mac_text(IN_MAC),
            mac_text(OUT_MAC),
        ))
        .unwrap();
        let (input, output) = (ns.ifindex("in0").unwrap(), ns.ifindex("out0").unwrap());
        std::thread::scope(|s| {
            s.spawn(|| {
                ns.enter().unwrap();
                let mut locals = LocalDestinations::new().unwrap();
                locals
                    .set(["10.0.0.1/32", "2001:db8:1::1/128"].iter().map(|p| {
                        let (a, l) = p.split_once('/').unwrap();
                        (a.parse().unwrap(), l.parse().unwrap())
                    }))
                    .unwrap();
                let express = Express::new(&locals, 1024).unwrap();
                let now = Generation {
                    snapshot: 7,
                    neighbours: 3,
                };
                express.set_generation(now).unwrap();
                let entry = Entry {
                    out: output,
                    dst_mac: NEXT_MAC,
                    src_mac: OUT_MAC,
                };
                for k in 0..16u8 {
                    let v4 = IpAddr::V4(Ipv4Addr::new(10, 9, 0, k));
                    let v6 = IpAddr::V6(Ipv6Addr::from(
                        u128::from("2001:db8:9::".parse::<Ipv6Addr>().unwrap()) | u128::from(k),
                    ));
                    for dst in [v4, v6] {
                        express.learn(input, dst, entry, now).unwrap();
                    }
                }
                // Entries of a retired generation, for destinations 16-19.
                let old = Generation {
                    snapshot: 6,
                    neighbours: 3,
                };
                for k in 16..20u8 {
                    express
                        .learn(input, IpAddr::V4(Ipv4Addr::new(10, 9, 0, k)), entry, old)
                        .unwrap();
                }
                let mut rng = rand::rngs::StdRng::seed_from_u64(33);
                let mut forwarded = [0usize; 2];
                let (mut left, mut short) = (0, 0);
                for n in 0..20_000 {
                    let f = random_frame(&mut rng);
                    // A test run refuses a frame cut short inside its IP header (the
                    // kernel's own receive drops such a frame before any hook).
                    let (verdict, out) = match express.run(&f, input) {
                        Err(e) if f.len() < 54 && e.raw_os_error() == Some(libc::EINVAL) => {
                            short += 1;
                            continue;
                        }
                        r => r.unwrap(),
                    };
                    match model(&f) {
                        Some(want) => {
                            assert_eq!(verdict, TC_ACT_REDIRECT, "frame {n}: {f:02x?}");
                            assert_eq!(out, want, "frame {n}");
                            forwarded[usize::from(f[12] == 0x86)] += 1;
                        }
                        None => {
                            assert_eq!(verdict, TCX_NEXT as u32, "frame {n}: {f:02x?}");
                            assert_eq!(out, f, "frame {n}: left untouched");
                            left += 1;
                        }
                    }
                }
                assert!(forwarded.iter().all(|&n| n > 2_000), "{forwarded:?}");
                assert!(left > 5_000, "{left}");
                assert!(short < 500, "{short} frames refused by the test run");
                // A new generation retires every entry.
                express
                    .set_generation(Generation {
                        snapshot: 8,
                        neighbours: 3,
                    })
                    .unwrap();
                let mut rng = rand::rngs::StdRng::seed_from_u64(33);
                for _ in 0..2_000 {
                    let f = random_frame(&mut rng);
                    if let Ok((verdict, _)) = express.run(&f, input) {
                        assert_eq!(verdict, TCX_NEXT as u32);
                    }
                }
            })
            .join()
            .unwrap();
        });
    }
}
