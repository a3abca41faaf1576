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
//! ([`Forward`]), before the owner sends the connection's first packet, so before any
//! reply can come; a packet that finds no connection there but such a tuple goes on to
//! the owner. NAT's choices ask every worker's connections through the registry
//! ([`crate::registry`]).
//!
//! When the number of workers changes, the tables' connections move to their new
//! owners ([`redistribute`]), every table held meanwhile.
//!
//! The hash is one the links' steering can compute too: the addresses' 32-bit words
//! and the two ports (ICMP's identifier) each folded by exclusive or, which is the same
//! either way, with the protocol and the seed, then mixed by a multiply. `AF_PACKET`'s
//! fanout runs [`Owners::steering_program`], the same hash in classic BPF over the
//! frame, so that a worker reads the packets of the connections it owns, both ways,
//! and hands over only what the program cannot see as the tracker does (a translated
//! reply, an ICMP error, IPv6 behind extension headers, a fragment).

use crate::table::{Connection, Conntrack, Forward};
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
        self.worker(symmetric(&t.words()))
    }

    /// The worker that owns `c`: the one its original tuple hashes to.
    pub fn of_connection(&self, c: &Connection) -> u16 {
        self.of_tuple(&c.tuples[0])
    }

    /// The worker a connection key names: the key mixed, modulo the workers, as the
    /// kernel takes a fanout program's answer.
    fn worker(&self, key: u32) -> u16 {
        (mix(key ^ self.seed as u32) % u32::from(self.workers.max(1))) as u16
    }

    /// The classic BPF program that picks, for `AF_PACKET`'s fanout (a group whose
    /// sockets joined in the workers' order), the worker [`Owners::of_tuple`] names
    /// for an IPv4 or IPv6 packet read from its network header: the same hash over
    /// the packet's bytes. (The kernel takes the answer modulo the group's sockets.)
    /// Each instruction as `(code, jump if true, jump if false, k)`.
    pub fn steering_program(&self) -> Vec<(u16, u8, u8, u32)> {
        steering_program(self.seed as u32)
    }
}

/// The multiply and shift that spread a folded key over its 32 bits (the golden
/// ratio's multiplier, then the high half into the low, which the modulo reads).
fn mix(key: u32) -> u32 {
    let h = key.wrapping_mul(GOLDEN);
    h ^ h >> 16
}

const GOLDEN: u32 = 0x9e37_79b1;

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

/// The words of a tuple ([`crate::Tuple`]'s) folded so that its inverse gives the
/// same: the addresses' 32-bit words, the two ports (of ICMP's two only the identifier,
/// which a query and its answer share; the type differs), each by exclusive or, and
/// the protocol above them.
fn symmetric(w: &[u64; 5]) -> u32 {
    // The addresses lie big-endian in the words' bytes: their 32-bit words, folded.
    let a = ((w[0] ^ w[2]) ^ (w[1] ^ w[3])).to_ne_bytes();
    let addresses =
        u32::from_be_bytes([a[0], a[1], a[2], a[3]]) ^ u32::from_be_bytes([a[4], a[5], a[6], a[7]]);
    let protocol = (w[4] >> 32) as u8;
    let (p, q) = (w[4] as u32 & 0xffff, (w[4] >> 16) as u32 & 0xffff);
    let ports = match protocol {
        ICMP | ICMPV6 => p,
        _ if PORTED.contains(&protocol) => p ^ q,
        _ => 0,
    };
    addresses ^ ports ^ u32::from(protocol) << 16
}

/// [`Owners::steering_program`] with the seed's low half: classic BPF, the packet read
/// from its network header (`SKF_NET_OFF`), memory words 0 the protocol and 1 the
/// addresses folded.
fn steering_program(seed: u32) -> Vec<(u16, u8, u8, u32)> {
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
    const ALU_MUL_K: u16 = 0x24;
    const ALU_RSH_K: u16 = 0x74;
    const ALU_LSH_K: u16 = 0x64;
    const ALU_AND_K: u16 = 0x54;
    const JA: u16 = 0x05;
    const JEQ_K: u16 = 0x15;
    const JSET_K: u16 = 0x45;
    const RET_K: u16 = 0x06;
    const RET_A: u16 = 0x16;
    const TAX: u16 = 0x07;
    const NET: u32 = (-0x10_0000i32) as u32;
    let at = |off: u32| NET.wrapping_add(off);
    let mut p: Vec<(u16, u8, u8, u32)> = Vec::new();
    // The version: 4, 6, or anything else to the first worker.
    p.push((LD_B_ABS, 0, 0, at(0)));
    p.push((ALU_RSH_K, 0, 0, 4));
    let version = p.len();
    p.push((JEQ_K, 0, 0, 4)); // to IPv4 (jt), else on
    p.push((JEQ_K, 0, 0, 6)); // to IPv6 (jt), else on
    p.push((RET_K, 0, 0, 0));
    // IPv4: a fragment (offset or more to come) to the first worker (the tracker
    // gives fragments to the kernel); the protocol, the addresses, the header's length.
    let v4 = p.len();
    p.push((LD_H_ABS, 0, 0, at(6)));
    p.push((JSET_K, 0, 1, 0x3fff));
    p.push((RET_K, 0, 0, 0));
    p.push((LD_B_ABS, 0, 0, at(9)));
    p.push((ST, 0, 0, 0));
    p.push((LD_W_ABS, 0, 0, at(12)));
    p.push((TAX, 0, 0, 0));
    p.push((LD_W_ABS, 0, 0, at(16)));
    p.push((ALU_XOR_X, 0, 0, 0));
    p.push((ST, 0, 0, 1));
    p.push((LDX_MSH, 0, 0, at(0)));
    let v4_done = p.len();
    p.push((JA, 0, 0, 0)); // to the transport header
                           // IPv6: the next header, the eight words of the addresses, 40 bytes of header.
    let v6 = p.len();
    p.push((LD_B_ABS, 0, 0, at(6)));
    p.push((ST, 0, 0, 0));
    p.push((LD_W_ABS, 0, 0, at(8)));
    for k in 1..8 {
        p.push((TAX, 0, 0, 0));
        p.push((LD_W_ABS, 0, 0, at(8 + 4 * k)));
        p.push((ALU_XOR_X, 0, 0, 0));
    }
    p.push((ST, 0, 0, 1));
    p.push((LDX_IMM, 0, 0, 40));
    // The transport header at X: the ports, the identifier, or nothing.
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
    p.push((LD_IMM, 0, 0, 0));
    let none_done = p.len();
    p.push((JA, 0, 0, 0));
    let ported = p.len();
    p.push((LD_H_IND, 0, 0, at(0)));
    p.push((ST, 0, 0, 2));
    p.push((LD_H_IND, 0, 0, at(2)));
    p.push((LDX_MEM, 0, 0, 2));
    p.push((ALU_XOR_X, 0, 0, 0));
    let ported_done = p.len();
    p.push((JA, 0, 0, 0));
    let identified = p.len();
    p.push((LD_H_IND, 0, 0, at(4)));
    // The ports folded (in A): the addresses, the protocol above, the seed, mixed.
    let mixing = p.len();
    p.push((LDX_MEM, 0, 0, 1));
    p.push((ALU_XOR_X, 0, 0, 0));
    p.push((ST, 0, 0, 2));
    p.push((LD_MEM, 0, 0, 0));
    p.push((ALU_AND_K, 0, 0, 0xff));
    p.push((ALU_LSH_K, 0, 0, 16));
    p.push((LDX_MEM, 0, 0, 2));
    p.push((ALU_XOR_X, 0, 0, 0));
    p.push((ALU_XOR_K, 0, 0, seed));
    p.push((ALU_MUL_K, 0, 0, GOLDEN));
    p.push((TAX, 0, 0, 0));
    p.push((ALU_RSH_K, 0, 0, 16));
    p.push((ALU_XOR_X, 0, 0, 0));
    p.push((RET_A, 0, 0, 0));
    // The jumps, relative to the instruction after each.
    let rel = |from: usize, to: usize| (to - from - 1) as u8;
    p[version].1 = rel(version, v4);
    p[version + 1].1 = rel(version + 1, v6);
    p[v4_done].3 = u32::from(rel(v4_done, transport));
    p[none_done].3 = u32::from(rel(none_done, mixing));
    p[ported_done].3 = u32::from(rel(ported_done, mixing));
    for (k, &c) in checks.iter().enumerate() {
        p[c].1 = rel(c, if k < PORTED.len() { ported } else { identified });
    }
    p
}

/// Moves the connections of `tables` (table `k` worker `k`'s) to their owners under
/// `owners` (each table's own `me` set from its place), and has each table follow it.
/// Connections in their owner's table stay where they are.
pub fn redistribute(tables: &mut [&mut Conntrack], owners: Owners) {
    let workers = tables.len() as u16;
    let mut moving: Vec<(u16, Connection)> = Vec::new();
    for (k, table) in tables.iter_mut().enumerate() {
        let mine = Owners {
            workers,
            me: k as u16,
            ..owners
        };
        table.set_owners(mine);
        moving.extend(
            table
                .hand_over(|c| mine.of_connection(c) != k as u16)
                .into_iter()
                .map(|c| (mine.of_connection(&c), c)),
        );
    }
    for (to, c) in moving {
        tables[usize::from(to)].adopt(c);
    }
    // What each table forwards, made anew from where the connections now lie.
    let mut told = Vec::new();
    for (k, table) in tables.iter_mut().enumerate() {
        table.clear_forwards();
        let mine = *table.owners();
        for c in table.connections(0).map(|(c, _)| c) {
            for t in &c.tuples {
                let to = mine.of_tuple(t);
                if to != k as u16 {
                    told.push((to, Forward::Add(*t, k as u16)));
                }
            }
        }
    }
    for (to, f) in told {
        tables[usize::from(to)].forward(f);
    }
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
            let program = owners.steering_program();
            assert!(program.len() < 4096, "within classic BPF's bound");
            for k in 0..5_000 {
                let mut t = random_tuple(&mut rng);
                if k % 5 == 0 {
                    // Protocols with ports the tracker reads, and one without.
                    t.protocol = [33, 47, 132, 136, 50][k % 25 / 5];
                }
                let options = if t.v6 { 0 } else { 4 * (k % 3) };
                let ip = packet(&t, options);
                let answer = run(&program, &ip) % u32::from(workers);
                assert_eq!(answer, u32::from(owners.of_tuple(&t)), "{t:?}");
                let back = t.inverted().map_or(t, |b| b);
                assert_eq!(
                    run(&program, &packet(&back, options)) % u32::from(workers),
                    answer,
                    "{t:?} both ways"
                );
            }
        }
        // A fragment, a truncated header, not IP: the first worker.
        let owners = Owners {
            workers: 4,
            me: 0,
            seed: 5,
        };
        let program = owners.steering_program();
        let mut rng = rand::rngs::StdRng::seed_from_u64(12);
        let mut t = random_tuple(&mut rng);
        t.v6 = false;
        t.src[10..12].fill(0xff);
        t.dst[10..12].fill(0xff);
        let mut fragment = packet(&t, 0);
        fragment[7] = 8;
        assert_eq!(run(&program, &fragment), 0);
        assert_eq!(run(&program, &packet(&t, 0)[..21]), 0);
        assert_eq!(run(&program, &[0x20; 40]), 0);
    }
}
