//! Which worker's table holds a connection, when each worker has a table of its own.
//!
//! Both directions of a connection must meet its state, and a table shared by the
//! workers costs each packet a wait for it (two workers sharing one forwarded fewer
//! packets than one). So each worker holds the connections it owns, and a packet is
//! tracked by the worker that owns its connection: the one a symmetric hash of its
//! original tuple names, the same for a connection's packets of either direction, and
//! for the ICMP errors that quote them. A worker that reads a packet hashing to another
//! hands it over; the links' own steering need not be symmetric.
//!
//! NAT changes a connection's reply tuple, which then hashes elsewhere. The worker it
//! hashes to learns from the owner's table that the tuple is the owner's
//! ([`crate::Forward`]), before the owner sends the connection's first packet, so before any
//! reply can come; a packet that finds no connection there but such a tuple goes on to
//! the owner. NAT's choices ask every worker's connections through the registry
//! ([`crate::registry`]).
//!
//! When the number of workers changes, the tables' connections move to their new
//! owners (`Conntrack::redistribute`), every table held meanwhile.
//!
//! The hash is one the links' steering can compute too: each address folded to 32 bits
//! (an IPv6 address's four words by exclusive or), the two taken in order, the ports in
//! order (ICMP's identifier alone), mixed with the seed and the protocol by three
//! rounds of a 32-bit finalizer (MurmurHash3's `fmix32`), so that every bit of the
//! tuple and of the seed moves the answer. `AF_PACKET`'s fanout runs
//! [`Owners::steering_program`], the same hash in classic BPF over the frame, so that a
//! worker reads the packets of the connections it owns, both ways, and hands over only
//! what the program cannot see as the tracker does (a translated reply, an ICMP error,
//! IPv6 behind extension headers; a fragment, which the tracker gives the kernel, is
//! spread by its addresses).

use crate::connection::Connection;
use crate::tuple::{Tuple, ICMP, ICMPV6};

/// How the workers share the connections: which worker a table is, of how many.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owners {
    /// The workers, each with a table.
    pub workers: u16,
    /// The worker whose table this is.
    pub me: u16,
    /// The hash's seed, the same for every worker.
    pub seed: u64,
}

impl Default for Owners {
    /// One worker, owning everything.
    fn default() -> Owners {
        Owners {
            workers: 1,
            me: 0,
            seed: 0,
        }
    }
}

impl Owners {
    /// The worker a packet whose tuple is `t` goes to: the same for `t` inverted, so
    /// for both directions of a connection NAT did not change, and for an ICMP error
    /// (the tracker looks up the tuple it quotes, inverted).
    pub fn of_tuple(&self, t: &Tuple) -> u16 {
        let workers = u32::from(self.workers.max(1));
        (symmetric(t, self.seed as u32) % workers) as u16
    }

    /// The worker that owns `c`: the one its original tuple hashes to.
    pub fn of_connection(&self, c: &Connection) -> u16 {
        self.of_tuple(&c.tuples[0])
    }

    /// The classic BPF program that picks, for `AF_PACKET`'s fanout, the socket of the
    /// worker [`Owners::of_tuple`] names for an IPv4 or IPv6 packet read from its
    /// network header: the same hash over the packet's bytes, then the worker's place
    /// in the group, `slots[worker]` (the order the sockets joined in; the kernel
    /// takes the answer modulo the group's sockets). Each instruction as `(code, jump
    /// if true, jump if false, k)`.
    pub fn steering_program(&self, slots: &[u16]) -> Vec<(u16, u8, u8, u32)> {
        steering_program(self.seed as u32, self.workers.max(1), slots)
    }
}

/// MurmurHash3's 32-bit finalizer: every bit of `h` moves every bit of the answer.
fn fmix(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(FMIX[0]);
    h ^= h >> 13;
    h = h.wrapping_mul(FMIX[1]);
    h ^ h >> 16
}

const FMIX: [u32; 2] = [0x85eb_ca6b, 0xc2b2_ae35];

/// The protocols whose first two 16-bit words are ports, as the tracker reads them.
const PORTED: [u8; 6] = [6, 17, 33, 47, 132, 136];

/// The family's bit (1 IPv4, 2 IPv6), as the families a ruleset tracks or translates are
/// said.
pub fn family_bit(v6: bool) -> u8 {
    if v6 {
        2
    } else {
        1
    }
}

/// The hash of `t`, the same for its inverse: each address folded to 32 bits (IPv4's
/// own word; IPv6's four words by exclusive or), the two in order, then the ports in
/// order (of ICMP's two words only the identifier, which a query and its answer share;
/// the type differs), each mixed in after the seed, with the protocol.
fn symmetric(t: &Tuple, seed: u32) -> u32 {
    let fold = |a: &[u8; 16]| {
        let word = |k: usize| u32::from_be_bytes([a[k], a[k + 1], a[k + 2], a[k + 3]]);
        if t.v6 {
            word(0) ^ word(4) ^ word(8) ^ word(12)
        } else {
            word(12)
        }
    };
    let (a, b) = (fold(&t.src), fold(&t.dst));
    let (p, q) = (u32::from(t.src_port), u32::from(t.dst_port));
    let ports = match t.protocol {
        ICMP | ICMPV6 => p,
        protocol if PORTED.contains(&protocol) => p.min(q) << 16 | p.max(q),
        _ => 0,
    };
    let h = fmix(a.min(b) ^ seed);
    let h = fmix(h ^ a.max(b));
    fmix(h ^ ports ^ u32::from(t.protocol) << 24)
}

/// [`Owners::steering_program`] with the seed's low half, for `workers` workers whose
/// sockets lie at `slots` in the group: classic BPF, the packet read from its network
/// header (`SKF_NET_OFF`); memory words 0 the protocol, 1 and 2 the addresses folded,
/// 3 the transport's fold, 4 a spare.
fn steering_program(seed: u32, workers: u16, slots: &[u16]) -> Vec<(u16, u8, u8, u32)> {
    // Classic BPF's codes (`linux/filter.h`).
    const LD_W_ABS: u16 = 0x20;
    const LD_H_ABS: u16 = 0x28;
    const LD_B_ABS: u16 = 0x30;
    const LD_H_IND: u16 = 0x48;
    const LD_IMM: u16 = 0x00;
    const LD_MEM: u16 = 0x60;
    const LDX_IMM: u16 = 0x01;
    const LDX_MEM: u16 = 0x61;
    const LDX_MSH: u16 = 0xb1;
    const ST: u16 = 0x02;
    const ALU_XOR_X: u16 = 0xac;
    const ALU_XOR_K: u16 = 0xa4;
    const ALU_OR_X: u16 = 0x4c;
    const ALU_MUL_K: u16 = 0x24;
    const ALU_MOD_K: u16 = 0x94;
    const ALU_RSH_K: u16 = 0x74;
    const ALU_LSH_K: u16 = 0x64;
    const JA: u16 = 0x05;
    const JEQ_K: u16 = 0x15;
    const JGT_X: u16 = 0x2d;
    const JSET_K: u16 = 0x45;
    const RET_K: u16 = 0x06;
    const TAX: u16 = 0x07;
    const TXA: u16 = 0x87;
    const NET: u32 = (-0x10_0000i32) as u32;
    let at = |off: u32| NET.wrapping_add(off);
    let mut p: Vec<(u16, u8, u8, u32)> = Vec::new();
    // A's `fmix`, X its scratch.
    let fmix = |p: &mut Vec<(u16, u8, u8, u32)>| {
        for (shift, multiply) in [(16, Some(FMIX[0])), (13, Some(FMIX[1])), (16, None)] {
            p.push((TAX, 0, 0, 0));
            p.push((ALU_RSH_K, 0, 0, shift));
            p.push((ALU_XOR_X, 0, 0, 0));
            if let Some(m) = multiply {
                p.push((ALU_MUL_K, 0, 0, m));
            }
        }
    };
    // The version: 4, 6, or anything else to the first worker.
    p.push((LD_B_ABS, 0, 0, at(0)));
    p.push((ALU_RSH_K, 0, 0, 4));
    let version = p.len();
    p.push((JEQ_K, 0, 0, 4)); // to IPv4 (jt), else on
    p.push((JEQ_K, 0, 0, 6)); // to IPv6 (jt), else on
    p.push((RET_K, 0, 0, 0));
    // IPv4: the protocol, the addresses, the header's length; a fragment (offset or
    // more to come) has no ports.
    let v4 = p.len();
    p.push((LD_B_ABS, 0, 0, at(9)));
    p.push((ST, 0, 0, 0));
    p.push((LD_W_ABS, 0, 0, at(12)));
    p.push((ST, 0, 0, 1));
    p.push((LD_W_ABS, 0, 0, at(16)));
    p.push((ST, 0, 0, 2));
    p.push((LD_H_ABS, 0, 0, at(6)));
    let fragment = p.len();
    p.push((JSET_K, 0, 0, 0x3fff)); // to no ports (jt)
    p.push((LDX_MSH, 0, 0, at(0)));
    let v4_done = p.len();
    p.push((JA, 0, 0, 0)); // to the transport header
                           // IPv6: the next header, each address's four words folded, 40 bytes of header.
    let v6 = p.len();
    p.push((LD_B_ABS, 0, 0, at(6)));
    p.push((ST, 0, 0, 0));
    for (address, slot) in [(8, 1), (24, 2)] {
        p.push((LD_W_ABS, 0, 0, at(address)));
        for k in 1..4 {
            p.push((TAX, 0, 0, 0));
            p.push((LD_W_ABS, 0, 0, at(address + 4 * k)));
            p.push((ALU_XOR_X, 0, 0, 0));
        }
        p.push((ST, 0, 0, slot));
    }
    p.push((LDX_IMM, 0, 0, 40));
    // The transport header at X: the ports in order, the identifier, or nothing.
    let transport = p.len();
    p.push((LD_MEM, 0, 0, 0));
    let mut checks = Vec::new();
    for proto in PORTED {
        checks.push(p.len());
        p.push((JEQ_K, 0, 0, u32::from(proto)));
    }
    for proto in [ICMP, ICMPV6] {
        checks.push(p.len());
        p.push((JEQ_K, 0, 0, u32::from(proto)));
    }
    let no_ports = p.len();
    p.push((LD_IMM, 0, 0, 0));
    let none_done = p.len();
    p.push((JA, 0, 0, 0));
    let ported = p.len();
    p.push((LD_H_IND, 0, 0, at(0)));
    p.push((ST, 0, 0, 3));
    p.push((LD_H_IND, 0, 0, at(2)));
    p.push((LDX_MEM, 0, 0, 3));
    // A the destination port, X the source: the smaller above.
    let order = p.len();
    p.push((JGT_X, 0, 0, 0)); // A > X: X is the smaller (jt)
    p.push((ST, 0, 0, 4)); // X >= A: A the smaller, X the larger
    p.push((TXA, 0, 0, 0));
    p.push((LDX_MEM, 0, 0, 4));
    let swapped = p.len();
    p.push((ST, 0, 0, 4)); // A the larger, X the smaller
    p.push((TXA, 0, 0, 0));
    p.push((ALU_LSH_K, 0, 0, 16));
    p.push((LDX_MEM, 0, 0, 4));
    p.push((ALU_OR_X, 0, 0, 0));
    let ported_done = p.len();
    p.push((JA, 0, 0, 0));
    let identified = p.len();
    p.push((LD_H_IND, 0, 0, at(4)));
    // The transport's fold (in A), kept; the addresses in order, the seed, mixed.
    let mixing = p.len();
    p.push((ST, 0, 0, 3));
    p.push((LD_MEM, 0, 0, 1));
    p.push((LDX_MEM, 0, 0, 2));
    let addresses = p.len();
    p.push((JGT_X, 0, 0, 0)); // A > X: X the smaller (jt)
    p.push((ST, 0, 0, 4)); // A the smaller: (A, X) as they are
    let in_order = p.len();
    p.push((JA, 0, 0, 0));
    let reverse = p.len();
    p.push((ST, 0, 0, 4)); // A the larger: the smaller is X
    p.push((TXA, 0, 0, 0));
    p.push((LDX_MEM, 0, 0, 4));
    p.push((ST, 0, 0, 4));
    // Here A the smaller, M[4] the smaller too, X the larger.
    let hashing = p.len();
    p.push((TXA, 0, 0, 0));
    p.push((ST, 0, 0, 2)); // the larger
    p.push((LD_MEM, 0, 0, 4));
    p.push((ALU_XOR_K, 0, 0, seed));
    fmix(&mut p);
    p.push((LDX_MEM, 0, 0, 2));
    p.push((ALU_XOR_X, 0, 0, 0));
    fmix(&mut p);
    p.push((LDX_MEM, 0, 0, 3));
    p.push((ALU_XOR_X, 0, 0, 0));
    p.push((ST, 0, 0, 4));
    p.push((LD_MEM, 0, 0, 0));
    p.push((ALU_LSH_K, 0, 0, 24));
    p.push((LDX_MEM, 0, 0, 4));
    p.push((ALU_XOR_X, 0, 0, 0));
    fmix(&mut p);
    // The worker, then its socket's place in the group.
    p.push((ALU_MOD_K, 0, 0, u32::from(workers)));
    for w in 0..workers {
        let slot = slots.get(usize::from(w)).copied().unwrap_or(w);
        p.push((JEQ_K, 0, 1, u32::from(w)));
        p.push((RET_K, 0, 0, u32::from(slot)));
    }
    p.push((RET_K, 0, 0, 0));
    // The jumps, relative to the instruction after each.
    let rel = |from: usize, to: usize| (to - from - 1) as u8;
    p[version].1 = rel(version, v4);
    p[version + 1].1 = rel(version + 1, v6);
    p[fragment].1 = rel(fragment, no_ports);
    p[v4_done].3 = u32::from(rel(v4_done, transport));
    p[none_done].3 = u32::from(rel(none_done, mixing));
    p[order].1 = rel(order, swapped);
    p[ported_done].3 = u32::from(rel(ported_done, mixing));
    p[addresses].1 = rel(addresses, reverse);
    p[in_order].3 = u32::from(rel(in_order, hashing));
    for (k, &c) in checks.iter().enumerate() {
        p[c].1 = rel(c, if k < PORTED.len() { ported } else { identified });
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tuple::{TCP, UDP};
    use rand::{Rng, SeedableRng};

    fn random_tuple(rng: &mut impl Rng) -> Tuple {
        let v6 = rng.gen();
        let mut address = || {
            let mut a = [0u8; 16];
            if v6 {
                rng.fill(&mut a[..]);
            } else {
                a[10..12].fill(0xff);
                rng.fill(&mut a[12..]);
            }
            a
        };
        let (src, dst) = (address(), address());
        let protocol = [TCP, UDP, if v6 { ICMPV6 } else { ICMP }][rng.gen_range(0..3)];
        let (src_port, dst_port) = if matches!(protocol, ICMP | ICMPV6) {
            // An echo request: identifier, then type and code.
            (rng.gen(), u16::from(if v6 { 128u8 } else { 8 }) << 8)
        } else {
            (rng.gen(), rng.gen())
        };
        Tuple {
            src,
            dst,
            src_port,
            dst_port,
            protocol,
            v6,
        }
    }

    #[test]
    fn a_tuple_and_its_inverse_have_one_owner_and_the_owners_share_the_tuples() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let owners = Owners {
            workers: 3,
            me: 0,
            seed: 99,
        };
        let mut counts = [0usize; 3];
        for _ in 0..30_000 {
            let t = random_tuple(&mut rng);
            let back = t.inverted().expect("answered");
            let w = owners.of_tuple(&t);
            assert_eq!(owners.of_tuple(&back), w, "{t:?}");
            counts[usize::from(w)] += 1;
            // Another port (or identifier) is mostly another owner; never a panic.
            let mut other = t;
            other.src_port = other.src_port.wrapping_add(1);
            let _ = owners.of_tuple(&other);
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
        // Another seed spreads them otherwise.
        let t = random_tuple(&mut rng);
        let moved = (0..64)
            .filter(|&seed| Owners { seed, ..owners }.of_tuple(&t) != owners.of_tuple(&t))
            .count();
        assert!(moved > 20, "{moved}");
    }

    /// Runs a classic BPF program as the kernel does over a packet whose network
    /// header is `ip` (loads past its end end the program with 0).
    fn run(program: &[(u16, u8, u8, u32)], ip: &[u8]) -> u32 {
        let (mut a, mut x, mut mem, mut pc) = (0u32, 0u32, [0u32; 16], 0usize);
        let net = |k: u32| k.wrapping_add(0x10_0000) as usize;
        let load = |at: usize, size: usize| -> Option<u32> {
            let b = ip.get(at..at + size)?;
            Some(b.iter().fold(0u32, |v, &byte| v << 8 | u32::from(byte)))
        };
        loop {
            let (code, jt, jf, k) = program[pc];
            pc += 1;
            let value = match code {
                0x20 => load(net(k), 4),
                0x28 => load(net(k), 2),
                0x30 => load(net(k), 1),
                0x48 => load(net(k) + x as usize, 2),
                _ => Some(0),
            };
            let Some(value) = value else { return 0 };
            match code {
                0x20 | 0x28 | 0x30 | 0x48 => a = value,
                0x00 => a = k,
                0x60 => a = mem[k as usize],
                0x01 => x = k,
                0x61 => x = mem[k as usize],
                0xb1 => match load(net(k), 1) {
                    Some(v) => x = 4 * (v & 0xf),
                    None => return 0,
                },
                0x02 => mem[k as usize] = a,
                0xac => a ^= x,
                0xa4 => a ^= k,
                0x4c => a |= x,
                0x94 => a %= k,
                0x87 => a = x,
                0x2d => pc += usize::from(if a > x { jt } else { jf }),
                0x24 => a = a.wrapping_mul(k),
                0x74 => a >>= k,
                0x64 => a <<= k,
                0x54 => a &= k,
                0x07 => x = a,
                0x05 => pc += k as usize,
                0x15 => pc += usize::from(if a == k { jt } else { jf }),
                0x45 => pc += usize::from(if a & k != 0 { jt } else { jf }),
                0x06 => return k,
                0x16 => return a,
                other => panic!("an instruction the program does not use: {other:#x}"),
            }
        }
    }

    /// A packet of tuple `t`, from its network header, with `options` bytes of IPv4
    /// options, as the tracker would read it.
    fn packet(t: &Tuple, options: usize) -> Vec<u8> {
        let mut ip = if t.v6 {
            let mut h = vec![0x60, 0, 0, 0, 0, 16, t.protocol, 64];
            h.extend_from_slice(&t.src);
            h.extend_from_slice(&t.dst);
            h
        } else {
            let mut h = vec![
                0x45 + (options / 4) as u8,
                0,
                0,
                0,
                0,
                1,
                0x40,
                0,
                64,
                t.protocol,
            ];
            h.extend_from_slice(&[0, 0]);
            h.extend_from_slice(&t.src[12..]);
            h.extend_from_slice(&t.dst[12..]);
            h.extend(std::iter::repeat_n(1, options));
            h
        };
        let l4: [u8; 8] = if matches!(t.protocol, ICMP | ICMPV6) {
            let [kind, code] = t.dst_port.to_be_bytes();
            let [i0, i1] = t.src_port.to_be_bytes();
            [kind, code, 0, 0, i0, i1, 0, 1]
        } else {
            let [s0, s1] = t.src_port.to_be_bytes();
            let [d0, d1] = t.dst_port.to_be_bytes();
            [s0, s1, d0, d1, 0, 16, 0, 0]
        };
        ip.extend_from_slice(&l4);
        ip
    }

    #[test]
    fn the_steering_program_picks_the_owner_the_tuple_hashes_to() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for workers in [1u16, 2, 3, 4, 7] {
            let owners = Owners {
                workers,
                me: 0,
                seed: rng.gen(),
            };
            // The sockets joined in some order: each worker's place in the group.
            let mut slots: Vec<u16> = (0..workers).collect();
            slots.rotate_left(1);
            let program = owners.steering_program(&slots);
            assert!(program.len() < 4096, "within classic BPF's bound");
            let place = |t: &Tuple| u32::from(slots[usize::from(owners.of_tuple(t))]);
            for k in 0..5_000 {
                let mut t = random_tuple(&mut rng);
                if k % 5 == 0 {
                    // Protocols with ports the tracker reads, and one without.
                    t.protocol = [33, 47, 132, 136, 50][k % 25 / 5];
                }
                let options = if t.v6 { 0 } else { 4 * (k % 3) };
                let answer = run(&program, &packet(&t, options));
                assert_eq!(answer, place(&t), "{t:?}");
                let back = t.inverted().map_or(t, |b| b);
                assert_eq!(
                    run(&program, &packet(&back, options)),
                    answer,
                    "{t:?} both ways"
                );
                // An IPv4 fragment: its addresses and protocol, no ports.
                if !t.v6 {
                    let mut fragment = packet(&t, options);
                    fragment[7] = 8;
                    let bare = Tuple {
                        src_port: 0,
                        dst_port: 0,
                        ..t
                    };
                    assert_eq!(run(&program, &fragment), place(&bare), "{t:?} cut");
                }
            }
        }
        // A truncated header, not IP: the first socket.
        let owners = Owners {
            workers: 4,
            me: 0,
            seed: 5,
        };
        let program = owners.steering_program(&[0, 1, 2, 3]);
        let mut rng = rand::rngs::StdRng::seed_from_u64(12);
        let mut t = random_tuple(&mut rng);
        t.v6 = false;
        t.src[10..12].fill(0xff);
        t.dst[10..12].fill(0xff);
        assert_eq!(run(&program, &packet(&t, 0)[..21]), 0);
        assert_eq!(run(&program, &[0x20; 40]), 0);
    }

    /// Every bit of the tuple moves the owner: hosts that differ only in their first
    /// octet, without ports, spread over two workers as evenly as random ones; and
    /// what two tuples share under one seed, they do not under most others.
    #[test]
    fn every_bit_of_the_tuple_and_the_seed_moves_the_owner() {
        let owners = Owners {
            workers: 2,
            me: 0,
            seed: 0x51,
        };
        let mut counts = [0usize; 2];
        for high in 0..=255u8 {
            let mut t = Tuple {
                protocol: 50,
                ..Tuple::default()
            };
            t.src[10..12].fill(0xff);
            t.dst[10..12].fill(0xff);
            t.src[12..].copy_from_slice(&[high, 0, 0, 1]);
            t.dst[12..].copy_from_slice(&[192, 0, 2, 1]);
            counts[usize::from(owners.of_tuple(&t))] += 1;
        }
        assert!(counts.iter().all(|&c| c > 100), "{counts:?}");
        // Tuples with the same owner under seed 0x51: under other seeds, about half
        // part.
        let mut rng = rand::rngs::StdRng::seed_from_u64(13);
        let pairs: Vec<(Tuple, Tuple)> = (0..2_000)
            .map(|_| (random_tuple(&mut rng), random_tuple(&mut rng)))
            .filter(|(a, b)| owners.of_tuple(a) == owners.of_tuple(b))
            .take(400)
            .collect();
        let parted = pairs
            .iter()
            .filter(|(a, b)| {
                let other = Owners {
                    seed: 0x52,
                    ..owners
                };
                other.of_tuple(a) != other.of_tuple(b)
            })
            .count();
        assert!((120..280).contains(&parted), "{parted} of {}", pairs.len());
    }
}
