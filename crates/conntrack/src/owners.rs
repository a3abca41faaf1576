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

    /// The worker a connection key names.
    fn worker(&self, key: u64) -> u16 {
        let hash = fold(key ^ self.seed, 0x9e37_79b9_7f4a_7c15);
        // (The hash's high half scaled to the workers, without a division.)
        (((hash >> 32) * u64::from(self.workers)) >> 32) as u16
    }
}

/// The family's bit (1 IPv4, 2 IPv6), as the families a ruleset tracks or translates are
/// said.
pub fn family_bit(v6: bool) -> u8 {
    if v6 {
        2
    } else {
        1
    }
}

/// The multiply that folds the hash (foldhash's folded multiply).
fn fold(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

/// The words of a tuple ([`crate::Tuple`]'s) folded so that its inverse gives the
/// same: the addresses and the ports each taken in order (of ICMP's two words only the
/// identifier, which a query and its answer share; the type differs).
fn symmetric(w: &[u64; 5]) -> u64 {
    let (a, b) = ((w[0], w[1]), (w[2], w[3]));
    let (low, high) = if a <= b { (a, b) } else { (b, a) };
    let protocol = (w[4] >> 32) & 0x1ff;
    let (p, q) = (w[4] & 0xffff, (w[4] >> 16) & 0xffff);
    let ports = if matches!(protocol as u8, ICMP | ICMPV6) {
        p
    } else {
        p.min(q) | p.max(q) << 16
    };
    let first = fold(low.0 ^ 0x243f_6a88_85a3_08d3, low.1 ^ 0x1319_8a2e_0370_7344);
    let second = fold(
        high.0 ^ 0xa409_3822_299f_31d0,
        high.1 ^ 0x082e_fa98_ec4e_6c89,
    );
    fold(first ^ ports, second ^ protocol << 32)
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
}
