//! The frames fibre claims from the kernel: those of connections fibre translated that
//! arrive addressed to the host itself (the replies of one masqueraded, or sent by snat
//! to an address of the host; the original direction of a port forwarded by dnat from
//! one). A worker reads them (its `AF_PACKET` ring sees every
//! frame, and the XDP program passes frames for this host to the kernel, where the ring
//! takes them too), but the kernel would also take its copy up its own stack: a TCP
//! segment for no socket of its own is answered with a reset, a datagram with "port
//! unreachable", and the connection is broken.
//!
//! So a traffic-control program on the ingress of each forwarded link, which runs after
//! the packet sockets have their copies and before the kernel's stack, drops the frames
//! whose tuple is in the map of claims. fibre enters a connection's tuple when it
//! confirms the connection and sends its first packet, and takes it out when the
//! connection ends. (With its forwarding on, the kernel forwards those frames itself
//! from its copy, fibre sends nothing, and claims nothing.) Everything else goes on (`TCX_NEXT`). The program is
//! assembled here, as the XDP and express programs are.

use fibre_conntrack::{tuple, Tuple};
use fibre_kernel::bpf::{self, assemble, Insn, Item, Map, MapType, Program, Size};
use fibre_kernel::bpf::{R0, R1, R10, R2, R3, R6, R7, R8};
use fibre_kernel::bpf::{SKB_DATA, SKB_DATA_END, SKB_PKT_TYPE, TCX_NEXT};
use std::io;
use std::os::fd::OwnedFd;

/// `TC_ACT_SHOT`: the frame dropped.
pub const TC_ACT_SHOT: i32 = 2;
/// Bytes of a key: the protocol, the family (0 IPv4, 1 IPv6), two of padding, the
/// source and destination ports (ICMP's identifier, and type and code) as they are on
/// the wire, the source and destination addresses (IPv4 v4-mapped).
const KEY_LEN: u32 = 40;
/// Claims the map holds at most.
const CAPACITY: u32 = 1 << 20;
/// Where the key is built on the stack.
const KEY: i16 = -40;

/// The key of the reply tuple `t`.
pub fn key(t: &Tuple) -> [u8; KEY_LEN as usize] {
    let mut k = [0u8; KEY_LEN as usize];
    k[0] = t.protocol;
    k[1] = u8::from(t.v6);
    k[4..6].copy_from_slice(&t.src_port.to_be_bytes());
    k[6..8].copy_from_slice(&t.dst_port.to_be_bytes());
    k[8..24].copy_from_slice(&t.src);
    k[24..40].copy_from_slice(&t.dst);
    k
}

/// The map of claimed replies and the program that drops them from the kernel's way.
#[derive(Debug)]
pub struct Claims {
    map: Map,
    /// One byte, not 0 while some family is translated: else the program looks no
    /// further, so that a router without NAT pays one array lookup a frame.
    switch: Map,
    program: Program,
    /// The links the program is on, each with the attachment that holds it there.
    links: std::sync::Mutex<Vec<(u32, OwnedFd)>>,
}

impl Claims {
    /// An empty map, and the program.
    pub fn new() -> io::Result<Claims> {
        let map = Map::create(MapType::Hash, KEY_LEN, 1, CAPACITY, "fibre_claims")?;
        let switch = Map::new(MapType::Array, 4, 1, "fibre_claims_on")?;
        let insns = program(&map, &switch);
        let program = Program::load(bpf::PROG_TYPE_SCHED_CLS, &insns, "fibre_claims")?;
        Ok(Claims {
            map,
            switch,
            program,
            links: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// Puts the program on the traffic-control ingress of exactly `links` (interface
    /// indexes, in the calling thread's network namespace): on those it is not on yet,
    /// off those no longer listed. It stays on until this value is dropped.
    pub fn attach(&self, links: &[u32]) -> io::Result<()> {
        let mut on = self
            .links
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        on.retain(|(l, _)| links.contains(l));
        for &link in links {
            if !on.iter().any(|(l, _)| *l == link) {
                let fd = self.program.attach_tc_ingress(link)?;
                on.push((link, fd));
            }
        }
        Ok(())
    }

    /// Turns the program on (some family is translated) or off.
    pub fn switch(&self, on: bool) -> io::Result<()> {
        self.switch.set(0, &u32::from(on).to_ne_bytes())
    }

    /// Claims the replies of tuple `reply`.
    pub fn claim(&self, reply: &Tuple) -> io::Result<()> {
        self.map.update(&key(reply), &[1])
    }

    /// Gives the replies of tuple `reply` back to the kernel (none claimed: nothing).
    pub fn release(&self, reply: &Tuple) {
        // Not claimed (the connection was never sent on): nothing to take out.
        let _ = self.map.delete(&key(reply));
    }

    /// What the program answers for `frame` (a test run).
    pub fn run(&self, frame: &[u8]) -> io::Result<u32> {
        let ctx = [0u8; 192];
        Ok(self.program.test_run_frame(frame, &ctx)?.0)
    }
}

/// The program. `R6` is the context, `R7` the frame's first byte and `R8` its end; the
/// key is built at `R10 - 40`, the switch's index at `R10 - 44`.
fn program(map: &Map, switch: &Map) -> Vec<Insn> {
    use bpf::{
        add_imm, and_imm, call, exit, jeq_imm, jgt_reg, jne_imm, load, mov_imm, mov_reg, store_imm,
        store_reg,
    };
    use Item::*;
    let bounds = |len| {
        [
            Op(mov_reg(R2, R7)),
            Op(add_imm(R2, len)),
            JumpReg(jgt_reg, R2, R8, "next"),
        ]
    };
    let byte = |dst, off| Op(load(Size::B, dst, R7, off));
    // Copies `n` words from the frame at `from` to the stack at `to`.
    let words = |from: i16, to: i16, n: i16| -> Vec<Item> {
        (0..n)
            .flat_map(|k| {
                [
                    Op(load(Size::W, R2, R7, from + 4 * k)),
                    Op(store_reg(Size::W, R10, to + 4 * k, R2)),
                ]
            })
            .collect()
    };
    // The ports (ICMP's identifier, and type and code) of a transport header at `l4`,
    // into the key, as the tuple holds them.
    let ports = |l4: i16, icmp: u8, label: &'static str| -> Vec<Item> {
        vec![
            Jump(jeq_imm, R3, i32::from(icmp), label),
            Op(load(Size::H, R2, R7, l4)),
            Op(store_reg(Size::H, R10, KEY + 4, R2)),
            Op(load(Size::H, R2, R7, l4 + 2)),
            Op(store_reg(Size::H, R10, KEY + 6, R2)),
            Goto("lookup"),
            Label(label),
            Op(load(Size::H, R2, R7, l4 + 4)),
            Op(store_reg(Size::H, R10, KEY + 4, R2)),
            Op(load(Size::H, R2, R7, l4)),
            Op(store_reg(Size::H, R10, KEY + 6, R2)),
            Goto("lookup"),
        ]
    };
    let mut p = vec![
        Op(mov_reg(R6, R1)),
        // Off: nothing is translated.
        Op(store_imm(Size::W, R10, KEY - 4, 0)),
        Wide(bpf::load_map(R1, switch)),
        Op(mov_reg(R2, R10)),
        Op(add_imm(R2, i32::from(KEY - 4))),
        Op(call(bpf::HELPER_MAP_LOOKUP_ELEM)),
        Jump(jeq_imm, R0, 0, "next"),
        Op(load(Size::W, R2, R0, 0)),
        Jump(jeq_imm, R2, 0, "next"),
        // Only frames for this host (replies to its address are).
        Op(load(Size::W, R2, R6, SKB_PKT_TYPE)),
        Jump(jne_imm, R2, 0, "next"),
        Op(load(Size::W, R7, R6, SKB_DATA)),
        Op(load(Size::W, R8, R6, SKB_DATA_END)),
    ];
    p.extend(bounds(14));
    p.extend([
        Op(load(Size::H, R2, R7, 12)),
        Jump(jeq_imm, R2, 0x0008, "ipv4"),
        Jump(jne_imm, R2, 0xdd86, "next"),
    ]);
    // IPv6, its transport header right after its own (behind extension headers, the
    // kernel's: fibre tracks no such reply).
    p.extend(bounds(62));
    p.extend([
        byte(R3, 20),
        Jump(jeq_imm, R3, i32::from(tuple::TCP), "v6-known"),
        Jump(jeq_imm, R3, i32::from(tuple::UDP), "v6-known"),
        Jump(jne_imm, R3, i32::from(tuple::ICMPV6), "next"),
        Label("v6-known"),
        Op(store_reg(Size::B, R10, KEY, R3)),
        Op(store_imm(Size::B, R10, KEY + 1, 1)),
        Op(store_imm(Size::H, R10, KEY + 2, 0)),
    ]);
    p.extend(words(22, KEY + 8, 8));
    p.extend(ports(54, tuple::ICMPV6, "v6-icmp"));
    // IPv4 without options, not a fragment.
    p.push(Label("ipv4"));
    p.extend(bounds(42));
    p.extend([
        byte(R2, 14),
        Jump(jne_imm, R2, 0x45, "next"),
        Op(load(Size::H, R2, R7, 20)),
        // More fragments, or an offset (in the frame's byte order).
        Op(and_imm(R2, i32::from(u16::from_ne_bytes([0x3f, 0xff])))),
        Jump(jne_imm, R2, 0, "next"),
        byte(R3, 23),
        Jump(jeq_imm, R3, i32::from(tuple::TCP), "v4-known"),
        Jump(jeq_imm, R3, i32::from(tuple::UDP), "v4-known"),
        Jump(jne_imm, R3, i32::from(tuple::ICMP), "next"),
        Label("v4-known"),
        Op(store_reg(Size::B, R10, KEY, R3)),
        Op(store_imm(Size::B, R10, KEY + 1, 0)),
        Op(store_imm(Size::H, R10, KEY + 2, 0)),
    ]);
    for (from, to) in [(26, KEY + 8), (30, KEY + 24)] {
        p.extend(bpf::v4_mapped_to_stack(R7, R2, from, to));
    }
    p.extend(ports(34, tuple::ICMP, "v4-icmp"));
    p.extend([
        Label("lookup"),
        Wide(bpf::load_map(R1, map)),
        Op(mov_reg(R2, R10)),
        Op(add_imm(R2, i32::from(KEY))),
        Op(call(bpf::HELPER_MAP_LOOKUP_ELEM)),
        Jump(jeq_imm, R0, 0, "next"),
        Op(mov_imm(R0, TC_ACT_SHOT)),
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
    use fibre_kernel::bpf::TCX_NEXT;

    fn frame(v6: bool, protocol: u8, src: &[u8], dst: &[u8], l4: &[u8]) -> Vec<u8> {
        // To the test run's link (loopback, all zeros): a frame for this host.
        let mut f = vec![0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0, 0, 2];
        if v6 {
            f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
            f.extend_from_slice(&(l4.len() as u16).to_be_bytes());
            f.extend_from_slice(&[protocol, 64]);
        } else {
            f.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
            f.extend_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
            f.extend_from_slice(&[0, 1, 0x40, 0, 64, protocol, 0, 0]);
        }
        f.extend_from_slice(src);
        f.extend_from_slice(dst);
        f.extend_from_slice(l4);
        f
    }

    fn mapped(a: [u8; 4]) -> [u8; 16] {
        std::net::Ipv4Addr::from(a).to_ipv6_mapped().octets()
    }

    /// The program drops the frames of claimed tuples, and only those: a reply of a
    /// claimed TCP, UDP and ICMP echo connection, IPv4 and IPv6, against one a port,
    /// an address or a protocol off.
    #[test]
    #[ignore = "needs root: loads a BPF program and map"]
    fn claimed_replies_are_dropped_and_nothing_else() {
        let claims = Claims::new().unwrap();
        claims.switch(true).unwrap();
        let (b, r) = ([10, 0, 1, 2], [10, 0, 1, 1]);
        let (b6, r6): ([u8; 16], [u8; 16]) = (
            "fd01::2".parse::<std::net::Ipv6Addr>().unwrap().octets(),
            "fd01::1".parse::<std::net::Ipv6Addr>().unwrap().octets(),
        );
        let mut l4 = vec![0u8; 20];
        l4[0..2].copy_from_slice(&7300u16.to_be_bytes());
        l4[2..4].copy_from_slice(&44588u16.to_be_bytes());
        let mut echo = vec![0u8; 8];
        echo[4..6].copy_from_slice(&77u16.to_be_bytes());
        let reply = |protocol, v6: bool, src, dst, sp, dp| Tuple {
            src,
            dst,
            src_port: sp,
            dst_port: dp,
            protocol,
            v6,
        };
        let claimed = [
            (
                reply(6, false, mapped(b), mapped(r), 7300, 44588),
                frame(false, 6, &b, &r, &l4),
            ),
            (
                reply(17, false, mapped(b), mapped(r), 7300, 44588),
                frame(false, 17, &b, &r, &l4),
            ),
            (
                reply(1, false, mapped(b), mapped(r), 77, 0),
                frame(false, 1, &b, &r, &echo),
            ),
            (
                reply(6, true, b6, r6, 7300, 44588),
                frame(true, 6, &b6, &r6, &l4),
            ),
            (reply(58, true, b6, r6, 77, 129 << 8), {
                let mut e = echo.clone();
                e[0] = 129;
                frame(true, 58, &b6, &r6, &e)
            }),
        ];
        for (t, f) in &claimed {
            assert_eq!(
                claims.run(f).unwrap() as i32,
                TCX_NEXT,
                "unclaimed yet: {t:?}"
            );
            claims.claim(t).unwrap();
            assert_eq!(claims.run(f).unwrap() as i32, TC_ACT_SHOT, "{t:?}");
        }
        let mut other_port = l4.clone();
        other_port[3] ^= 1;
        let others = [
            frame(false, 6, &b, &r, &other_port),
            frame(false, 6, &[10, 0, 1, 3], &r, &l4),
            frame(false, 132, &b, &r, &l4),
            frame(true, 17, &b6, &r6, &l4),
        ];
        for f in &others {
            assert_eq!(claims.run(f).unwrap() as i32, TCX_NEXT, "{f:?}");
        }
        // Switched off (nothing translated), nothing is dropped; on again, the claims
        // hold.
        claims.switch(false).unwrap();
        for (t, f) in &claimed {
            assert_eq!(claims.run(f).unwrap() as i32, TCX_NEXT, "off: {t:?}");
        }
        claims.switch(true).unwrap();
        for (t, f) in &claimed {
            claims.release(t);
            assert_eq!(claims.run(f).unwrap() as i32, TCX_NEXT, "released: {t:?}");
        }
    }
}
