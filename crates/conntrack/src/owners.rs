//! Which worker's table holds a connection, when each worker has a table of its own.
//!
//! Both directions of a connection must meet its state, and a table shared by the
//! workers costs each packet a wait for it (two workers sharing one forwarded fewer
//! packets than one). So each worker holds the connections it owns, and a packet is
//! tracked by the worker that owns its connection: the one a symmetric hash of the
//! packet's tuple names (the same for a connection's packets of either direction, and
//! for the ICMP errors that quote them), or, for a family whose connections NAT may
//! change, the first worker (a translated reply's tuple is not its original's
//! inverted, and hashes elsewhere). A worker that reads a packet another owns hands it
//! over ([`Owners::elsewhere`]); the links' own steering need not be symmetric.
//!
//! When the families NAT may change, or the number of workers, change, the tables'
//! connections move to their new owners ([`redistribute`]), every table held meanwhile.

use crate::table::{Connection, Conntrack};
use crate::tuple::{self, ICMP, ICMPV6};

/// How the workers share the connections: which worker a table is, of how many, and
/// which families the first worker owns whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owners {
    /// The workers, each with a table.
    pub workers: u16,
    /// The worker whose table this is.
    pub me: u16,
    /// The families (bit 0 IPv4, bit 1 IPv6) whose connections the first worker owns
    /// whole: those NAT may change.
    pub pinned: u8,
    /// The hash's seed, the same for every worker.
    pub seed: u64,
}

impl Default for Owners {
    /// One worker, owning everything.
    fn default() -> Owners {
        Owners {
            workers: 1,
            me: 0,
            pinned: 0,
            seed: 0,
        }
    }
}

impl Owners {
    /// The worker that owns the connection of the IP packet `ip` (from its header on),
    /// if another than this table's: `None` where this one does, or where no worker
    /// would (a packet that cannot be read, a fragment: any worker does with it what
    /// the tracker does).
    #[inline]
    pub fn elsewhere(&self, ip: &[u8]) -> Option<u16> {
        if self.workers <= 1 {
            return None;
        }
        let w = self.of_packet(ip)?;
        (w != self.me).then_some(w)
    }

    /// The worker that owns the connection of the IP packet `ip`, if it can be read.
    pub fn of_packet(&self, ip: &[u8]) -> Option<u16> {
        let v6 = ip.first()? >> 4 == 6;
        if self.pinned & family_bit(v6) != 0 {
            return Some(0);
        }
        connection_key(ip).map(|k| self.worker(k))
    }

    /// The worker that owns `c`.
    pub fn of_connection(&self, c: &Connection) -> u16 {
        let t = &c.tuples[0];
        if self.pinned & family_bit(t.v6) != 0 {
            return 0;
        }
        self.worker(symmetric(&t.words()))
    }

    /// The worker a connection key names.
    fn worker(&self, key: u64) -> u16 {
        let hash = fold(key ^ self.seed, 0x9e37_79b9_7f4a_7c15);
        // (The hash's high half scaled to the workers, without a division.)
        (((hash >> 32) * u64::from(self.workers)) >> 32) as u16
    }
}

/// The family's bit in [`Owners::pinned`].
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

/// A key the same for every packet of one connection, both ways, and for the ICMP
/// errors that quote them: the packet's tuple (or the quoted packet's), its two ends
/// taken in order. `None` for a packet the tracker cannot read, or a fragment.
pub fn connection_key(ip: &[u8]) -> Option<u64> {
    let n = tuple::network(ip).ok()?;
    let ip = &ip[..n.len];
    if matches!((n.protocol, n.v6), (ICMP, false) | (ICMPV6, true)) {
        let kind = *ip.get(n.transport)?;
        let error = if n.v6 {
            kind < 128
        } else {
            matches!(kind, 3 | 4 | 5 | 11 | 12)
        };
        if error {
            let at = n.transport + 8;
            let quoted = tuple::quoted_network(ip, at, n.v6)?;
            return tuple::key(&ip[at..], &quoted).map(|k| symmetric(&k));
        }
    }
    tuple::key(ip, &n).map(|k| symmetric(&k))
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// An IPv4 or IPv6 packet of `protocol` from `src`:`sport` to `dst`:`dport`, with
    /// `l4` (whose first four bytes the ports overwrite, for TCP and UDP).
    fn packet(v6: bool, protocol: u8, src: &[u8], dst: &[u8], l4: &[u8]) -> Vec<u8> {
        let mut p = if v6 {
            let mut h = vec![0u8; 40];
            h[0] = 0x60;
            h[4..6].copy_from_slice(&(l4.len() as u16).to_be_bytes());
            h[6] = protocol;
            h[7] = 64;
            h[8..24].copy_from_slice(src);
            h[24..40].copy_from_slice(dst);
            h
        } else {
            let mut h = vec![0u8; 20];
            h[0] = 0x45;
            h[2..4].copy_from_slice(&(20 + l4.len() as u16).to_be_bytes());
            h[8] = 64;
            h[9] = protocol;
            h[12..16].copy_from_slice(src);
            h[16..20].copy_from_slice(dst);
            h
        };
        p.extend_from_slice(l4);
        p
    }

    fn address(rng: &mut impl Rng, v6: bool) -> Vec<u8> {
        let n = if v6 { 16 } else { 4 };
        (0..n).map(|_| rng.gen()).collect()
    }

    #[test]
    fn a_connections_packets_both_ways_and_its_errors_have_one_owner() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut counts = [0usize; 3];
        for round in 0..20_000 {
            let v6 = round % 2 == 1;
            let (a, b) = (address(&mut rng, v6), address(&mut rng, v6));
            let (icmp, icmp_error) = if v6 { (ICMPV6, 1) } else { (ICMP, 3) };
            let (protocol, there, back) = match rng.gen_range(0..3) {
                0 | 1 => {
                    let protocol = if rng.gen() { 6 } else { 17 };
                    let (p, q): (u16, u16) = (rng.gen(), rng.gen());
                    let mut l4 = vec![0u8; 20];
                    l4[..2].copy_from_slice(&p.to_be_bytes());
                    l4[2..4].copy_from_slice(&q.to_be_bytes());
                    let mut r = l4.clone();
                    r[..2].copy_from_slice(&q.to_be_bytes());
                    r[2..4].copy_from_slice(&p.to_be_bytes());
                    (protocol, l4, r)
                }
                _ => {
                    // An echo request and its answer: one identifier, two types.
                    let id: u16 = rng.gen();
                    let (ask, answer) = if v6 { (128, 129) } else { (8, 0) };
                    let mut l4 = vec![ask, 0, 0, 0, 0, 0, 0, 1];
                    l4[4..6].copy_from_slice(&id.to_be_bytes());
                    let mut r = l4.clone();
                    r[0] = answer;
                    (icmp, l4, r)
                }
            };
            let forth = packet(v6, protocol, &a, &b, &there);
            let reply = packet(v6, protocol, &b, &a, &back);
            // An error about the first, from a router on its way.
            let router = address(&mut rng, v6);
            let mut error = vec![icmp_error, 0, 0, 0, 0, 0, 0, 0];
            error.extend_from_slice(&forth);
            let error = packet(v6, icmp, &router, &a, &error);
            let key = connection_key(&forth).expect("read");
            assert_eq!(connection_key(&reply), Some(key), "{forth:?} {reply:?}");
            assert_eq!(connection_key(&error), Some(key), "{error:?}");
            let owners = Owners {
                workers: 3,
                me: 0,
                pinned: 0,
                seed: 99,
            };
            let w = owners.of_packet(&forth).expect("owned");
            counts[usize::from(w)] += 1;
            for p in [&reply, &error] {
                assert_eq!(owners.of_packet(p), Some(w));
            }
            // Pinned: the first worker, whatever the hash.
            let pinned = Owners {
                pinned: family_bit(v6),
                ..owners
            };
            assert_eq!(pinned.of_packet(&forth), Some(0));
            assert_eq!(Owners { me: w, ..owners }.elsewhere(&reply), None);
        }
        // Spread over the workers, none with much more than its share.
        for c in counts {
            assert!((6_000..7_400).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn another_flow_or_family_is_another_key() {
        let a = [10, 0, 0, 1];
        let b = [10, 0, 0, 2];
        let udp = |p: u16, q: u16| {
            let mut l4 = vec![0u8; 8];
            l4[..2].copy_from_slice(&p.to_be_bytes());
            l4[2..4].copy_from_slice(&q.to_be_bytes());
            packet(false, 17, &a, &b, &l4)
        };
        let key = connection_key(&udp(1000, 53));
        assert_ne!(key, connection_key(&udp(1001, 53)));
        assert_ne!(key, connection_key(&udp(1000, 54)));
        let mut tcp = udp(1000, 53);
        tcp[9] = 6;
        assert_ne!(key, connection_key(&tcp));
        // Unreadable, or a fragment: no key.
        assert_eq!(connection_key(&udp(1, 2)[..10]), None);
        let mut fragment = udp(1000, 53);
        fragment[7] = 8;
        assert_eq!(connection_key(&fragment), None);
    }
}
