//! The floor of the veth study: the cheapest way a frame can cross the router's
//! namespace, to say how much of what any forwarder costs there is the veths' own.
//!
//! A traffic-control program on each of the router's links hands every TCP and UDP
//! frame that arrives for the router's MAC address straight to the other link: the
//! time to live (or hop limit) taken down by one, the IPv4 header checksum patched, the
//! MAC addresses rewritten, then `bpf_redirect`. No route is looked up, no neighbour,
//! no rule: frames to host B's own address go to host B's MAC, all others to the
//! gateways' one MAC (as every route of the study's tables leads there). Everything
//! else (ARP, neighbour discovery, a time to live of 1) goes on to the kernel.
//!
//! This is not a forwarder: it is what is left when every decision is taken away. The
//! kernel's forwarding and fibre's both pay, in the same run, the veth receive and
//! transmit this pays; the study shows the floor beside them so that the share a
//! forwarder can still win is plain.

use crate::veth::{
    Running, Topology, GATEWAY_MAC, HOST_A_MAC, HOST_B_MAC, ROUTER_IN, ROUTER_IN_MAC, ROUTER_OUT,
    ROUTER_OUT_MAC,
};
use fibre_kernel::bpf::{self, assemble, Insn, Item, Program, Size, R0, R1, R2, R6, R7, R8};
use fibre_kernel::bpf::{HELPER_REDIRECT, SKB_DATA, SKB_DATA_END, SKB_PKT_TYPE, TCX_NEXT};
use std::os::fd::OwnedFd;

/// `PACKET_HOST`: a frame for this link's own MAC address.
const PACKET_HOST: i32 = 0;

/// Where a link's program sends frames: the other link, and the MACs to write.
struct Direction {
    /// The output link's index in the router's namespace.
    out_ifindex: u32,
    /// The output link's MAC (the new source).
    src: [u8; 6],
    /// The MAC of frames to `host` (the new destination).
    host_mac: [u8; 6],
    /// The host's IPv4 and IPv6 addresses, whose frames go to `host_mac`.
    host: (u32, u128),
    /// The MAC of every other frame.
    other_mac: [u8; 6],
}

/// A MAC address written at `off` of the frame in `R7`: a word and a half-word.
fn write_mac(off: i16, mac: [u8; 6]) -> [Item; 2] {
    let word = i32::from_ne_bytes([mac[0], mac[1], mac[2], mac[3]]);
    let half = i32::from(u16::from_ne_bytes([mac[4], mac[5]]));
    [
        Item::Op(bpf::store_imm(Size::W, R7, off, word)),
        Item::Op(bpf::store_imm(Size::H, R7, off + 4, half)),
    ]
}

/// The program of one link, for `d`.
fn program(d: &Direction) -> Vec<Insn> {
    use bpf::{
        add_imm, call, exit, jeq_imm, jgt_reg, jlt_imm, jne32_imm, jne_imm, load, mov_imm, mov_reg,
        store_reg,
    };
    use Item::*;
    // The IPv6 host address compared as four words, as they lie in the frame.
    let v6: Vec<i32> = d
        .host
        .1
        .to_be_bytes()
        .chunks(4)
        .map(|w| i32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
        .collect();
    let bounds = |len| {
        [
            Op(mov_reg(R2, R7)),
            Op(add_imm(R2, len)),
            JumpReg(jgt_reg, R2, R8, "next"),
        ]
    };
    let mut p = vec![
        Op(mov_reg(R6, R1)),
        Op(load(Size::W, R2, R6, SKB_PKT_TYPE)),
        Jump(jne_imm, R2, PACKET_HOST, "next"),
        Op(load(Size::W, R7, R6, SKB_DATA)),
        Op(load(Size::W, R8, R6, SKB_DATA_END)),
    ];
    p.extend(bounds(14));
    p.extend([
        Op(load(Size::H, R2, R7, 12)),
        Jump(jeq_imm, R2, 0x0008, "v4"),
        Jump(jne_imm, R2, 0xdd86_u16 as i32, "next"),
    ]);
    // IPv6: TCP or UDP, a hop limit above 1.
    p.extend(bounds(54));
    p.extend([
        Op(load(Size::B, R2, R7, 20)),
        Jump(jeq_imm, R2, 6, "v6-transport"),
        Jump(jne_imm, R2, 17, "next"),
        Label("v6-transport"),
        Op(load(Size::B, R2, R7, 21)),
        Jump(jlt_imm, R2, 2, "next"),
        Op(add_imm(R2, -1)),
        Op(store_reg(Size::B, R7, 21, R2)),
    ]);
    for (k, word) in v6.iter().enumerate() {
        p.extend([
            Op(load(Size::W, R2, R7, 38 + 4 * k as i16)),
            Jump(jne32_imm, R2, *word, "other"),
        ]);
    }
    p.push(Goto("host"));
    // IPv4: TCP or UDP, a time to live above 1; the checksum patched as the kernel's
    // `ip_decrease_ttl` does.
    p.push(Label("v4"));
    p.extend(bounds(34));
    p.extend([
        Op(load(Size::B, R2, R7, 23)),
        Jump(jeq_imm, R2, 6, "v4-transport"),
        Jump(jne_imm, R2, 17, "next"),
        Label("v4-transport"),
        Op(load(Size::B, R2, R7, 22)),
        Jump(jlt_imm, R2, 2, "next"),
        Op(add_imm(R2, -1)),
        Op(store_reg(Size::B, R7, 22, R2)),
    ]);
    p.extend(bpf::ttl_checksum_patch(R7, R2, "v4-sum"));
    p.extend([
        Op(load(Size::W, R2, R7, 30)),
        Jump(
            jne32_imm,
            R2,
            i32::from_ne_bytes(d.host.0.to_be_bytes()),
            "other",
        ),
        Label("host"),
    ]);
    p.extend(write_mac(0, d.host_mac));
    p.push(Goto("out"));
    p.push(Label("other"));
    p.extend(write_mac(0, d.other_mac));
    p.push(Label("out"));
    p.extend(write_mac(6, d.src));
    p.extend([
        Op(mov_imm(R1, d.out_ifindex as i32)),
        Op(mov_imm(R2, 0)),
        Op(call(HELPER_REDIRECT)),
        Op(exit()),
        Label("next"),
        Op(mov_imm(R0, TCX_NEXT)),
        Op(exit()),
    ]);
    assemble(&p)
}

/// The floor's programs, attached to the router's links until dropped.
pub struct Floor {
    _links: Vec<OwnedFd>,
}

impl Running for Floor {}

/// Attaches the floor's programs to the router's links: from host A's side to host B's
/// (`10.200.0.2`, `fd00:200::a:2` to host B's MAC, the rest to the gateways'), and back
/// (all to host A's MAC).
pub fn attach(t: &Topology) -> Result<Floor, String> {
    let err = |e: std::io::Error| e.to_string();
    // A link's index is its namespace's: the programs are attached from a thread in it.
    std::thread::scope(|s| {
        s.spawn(|| {
            t.router.enter().map_err(err)?;
            let (rin, rout) = (
                t.router.ifindex(ROUTER_IN).map_err(err)?,
                t.router.ifindex(ROUTER_OUT).map_err(err)?,
            );
            let to_b = Direction {
                out_ifindex: rout,
                src: ROUTER_OUT_MAC,
                host_mac: HOST_B_MAC,
                host: (0x0ac8_0002, 0xfd00_0200_0000_0000_0000_0000_000a_0002),
                other_mac: GATEWAY_MAC,
            };
            let to_a = Direction {
                out_ifindex: rin,
                src: ROUTER_IN_MAC,
                host_mac: HOST_A_MAC,
                host: (0x0ac7_0002, 0xfd00_0199_0000_0000_0000_0000_000a_0002),
                other_mac: HOST_A_MAC,
            };
            let mut links = Vec::new();
            for (dev, ifindex, d) in [(ROUTER_IN, rin, to_b), (ROUTER_OUT, rout, to_a)] {
                let prog = Program::load(bpf::PROG_TYPE_SCHED_CLS, &program(&d), "fibre_floor")
                    .map_err(|e| format!("the floor's program for {dev}: {e}"))?;
                links.push(
                    prog.attach_tc_ingress(ifindex)
                        .map_err(|e| format!("attaching the floor to {dev}: {e}"))?,
                );
            }
            Ok(Floor { _links: links })
        })
        .join()
        .map_err(|_| "the floor's thread panicked".to_string())?
    })
}
