//! Which path of a multipath route a flow takes, as the kernel chooses it.
//!
//! The kernel hashes a flow's keys (`struct flow_keys`, the fields its hash policy names)
//! with SipHash-2-4 under a key made of `net.ipv4.fib_multipath_hash_seed`, and gives each
//! live path a share of the 31-bit hash space in proportion to its weight
//! (hash-threshold). With the same seed, fibre builds the same bytes and so takes the same
//! path for the same flow:
//!
//! - the keys are laid out as the kernel's `flow_keys` on x86-64 (80 bytes, the hash
//!   covering 48 of them for IPv4 and 72 for IPv6, from the `basic` member on), put in the
//!   kernel's canonical order (the lower address and port first, compared as the kernel
//!   compares them) so both directions of a flow hash alike;
//! - policy 0 (L3): IPv4 hashes the addresses; IPv6 the addresses, the protocol and the
//!   flow label. Policy 1 (L4): the addresses, the protocol and the ports. An IPv4 route
//!   query without `ipproto` is a UDP packet to the kernel, and without `from` its source
//!   is 0.0.0.0; IPv6 hashes the query's fields as given;
//! - path `i` takes the hashes up to `round((w_1 + .. + w_i) << 31 / total) - 1`, over the
//!   live paths in the route's order.

use crate::query::Query;
use siphasher::sip::SipHasher24;
use std::hash::Hasher;
use std::net::IpAddr;

/// Hash policy 1: the five-tuple. (Policy 0, the default, hashes the addresses and, for
/// IPv6, the protocol and flow label.)
pub const POLICY_L4: u8 = 1;

/// The multipath hash settings (the kernel's sysctls of those names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Multipath {
    /// `net.ipv4.fib_multipath_hash_seed`, used by both families. The kernel draws a
    /// random seed while it is 0; fibre hashes with 0.
    pub seed: u32,
    /// `net.ipv4.fib_multipath_hash_policy`.
    pub policy_v4: u8,
    /// `net.ipv6.fib_multipath_hash_policy`.
    pub policy_v6: u8,
}

/// Offsets in the kernel's `struct flow_keys` (x86-64).
const IP_PROTO: usize = 10;
const PORTS: usize = 36;
const ADDRS: usize = 44;
/// The hash covers the keys from the `basic` member to the end of the family's addresses.
const HASH_START: usize = 8;

impl Multipath {
    /// The flow's 31-bit multipath hash.
    pub fn hash(&self, q: &Query) -> u32 {
        let mut keys = [0u8; 80];
        let src = q.src;
        match q.dst {
            IpAddr::V4(dst) => {
                let src = match src {
                    Some(IpAddr::V4(s)) => s.octets(),
                    _ => [0; 4],
                };
                keys[ADDRS..ADDRS + 4].copy_from_slice(&src);
                keys[ADDRS + 4..ADDRS + 8].copy_from_slice(&dst.octets());
                if self.policy_v4 == POLICY_L4 {
                    // `ip route get` builds a packet: UDP unless told otherwise, with the
                    // ports in its TCP or UDP header.
                    let proto = if q.ipproto == 0 { 17 } else { q.ipproto };
                    keys[IP_PROTO] = proto;
                    if proto == 6 || proto == 17 {
                        keys[PORTS..PORTS + 2].copy_from_slice(&q.sport.to_be_bytes());
                        keys[PORTS + 2..PORTS + 4].copy_from_slice(&q.dport.to_be_bytes());
                    }
                }
                // The kernel orders addresses and ports as the CPU reads their bytes.
                let le32 = |at: usize| u32::from_le_bytes(keys[at..at + 4].try_into().unwrap());
                if le32(ADDRS + 4) < le32(ADDRS) {
                    let (a, b) = keys[ADDRS..ADDRS + 8].split_at_mut(4);
                    a.swap_with_slice(b);
                }
                order_ports(&mut keys);
                // The length is the struct's less the addresses IPv4 does not use: four
                // bytes past the addresses (the struct's tail padding) are hashed too.
                finish(self.seed, &keys[HASH_START..HASH_START + 48])
            }
            IpAddr::V6(dst) => {
                let src = match src {
                    Some(IpAddr::V6(s)) => s.octets(),
                    _ => [0; 16],
                };
                keys[ADDRS..ADDRS + 16].copy_from_slice(&src);
                keys[ADDRS + 16..ADDRS + 32].copy_from_slice(&dst.octets());
                keys[IP_PROTO] = q.ipproto;
                if self.policy_v6 == POLICY_L4 {
                    keys[PORTS..PORTS + 2].copy_from_slice(&q.sport.to_be_bytes());
                    keys[PORTS + 2..PORTS + 4].copy_from_slice(&q.dport.to_be_bytes());
                }
                // Policy 0 hashes the flow label too (at FLOW_LABEL); a route query's is 0.
                if keys[ADDRS + 16..ADDRS + 32] < keys[ADDRS..ADDRS + 16] {
                    let (a, b) = keys[ADDRS..ADDRS + 32].split_at_mut(16);
                    a.swap_with_slice(b);
                }
                order_ports(&mut keys);
                finish(self.seed, &keys[HASH_START..])
            }
        }
    }
}

fn order_ports(keys: &mut [u8; 80]) {
    let le16 = |at: usize| u16::from_le_bytes([keys[at], keys[at + 1]]);
    if le16(PORTS + 2) < le16(PORTS) {
        let (a, b) = keys[PORTS..PORTS + 4].split_at_mut(2);
        a.swap_with_slice(b);
    }
}

/// SipHash-2-4 of the keys under the seed (repeated into both halves of both key words),
/// cut to 32 bits, never 0, less its lowest bit.
fn finish(seed: u32, keys: &[u8]) -> u32 {
    let k = ((seed as u64) << 32) | seed as u64;
    let mut h = SipHasher24::new_with_keys(k, k);
    h.write(keys);
    let h = h.finish() as u32;
    h.max(1) >> 1
}

/// The last hash of the path whose weights, with those before it, add up to `acc` of
/// `total`: the kernel's `DIV_ROUND_CLOSEST(acc << 31, total) - 1` (-1 as no hash).
#[inline]
pub(crate) fn upper_bound(acc: u64, total: u64) -> i64 {
    (((acc << 31) + total / 2) / total) as i64 - 1
}

/// Hash-threshold choice among items of some weight: the only one, else the first whose
/// share of the 31-bit hash space ends at or above `hash`.
#[inline]
pub(crate) fn choose<T: Copy>(
    items: impl Iterator<Item = T> + Clone,
    weight: impl Fn(T) -> u16,
    hash: impl FnOnce() -> u32,
) -> Option<T> {
    let mut two = items.clone();
    let first = two.next()?;
    if two.next().is_none() {
        return Some(first);
    }
    let total: u64 = items.clone().map(|i| weight(i) as u64).sum();
    let h = hash() as i64;
    let mut acc = 0u64;
    let mut last = first;
    for i in items {
        acc += weight(i) as u64;
        if h <= upper_bound(acc, total) {
            return Some(i);
        }
        last = i;
    }
    Some(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn siphash_is_the_reference_siphash_2_4() {
        // The reference vector of SipHash-2-4: key 00..0f, message 00..0e.
        let k0 = u64::from_le_bytes([0, 1, 2, 3, 4, 5, 6, 7]);
        let k1 = u64::from_le_bytes([8, 9, 10, 11, 12, 13, 14, 15]);
        let mut h = SipHasher24::new_with_keys(k0, k1);
        h.write(&(0u8..15).collect::<Vec<u8>>());
        assert_eq!(h.finish(), 0xa129_ca61_49be_45e5);
    }

    #[test]
    fn both_directions_of_a_flow_hash_alike() {
        let mp = Multipath {
            seed: 7,
            policy_v4: POLICY_L4,
            policy_v6: POLICY_L4,
        };
        for (a, b) in [("10.0.0.1", "192.0.2.9"), ("2001:db8::1", "2001:db8:9::2")] {
            let mut q = Query::to(b.parse().unwrap());
            q.src = Some(a.parse().unwrap());
            (q.ipproto, q.sport, q.dport) = (6, 40000, 443);
            let mut r = Query::to(a.parse().unwrap());
            r.src = Some(b.parse().unwrap());
            (r.ipproto, r.sport, r.dport) = (6, 443, 40000);
            assert_eq!(mp.hash(&q), mp.hash(&r));
            r.dport = 40001;
            assert_ne!(mp.hash(&q), mp.hash(&r));
        }
    }

    #[test]
    fn shares_follow_the_weights() {
        // 1M random flows over weights 1, 2, 5: each share within 2% of its weight's.
        let mp = Multipath::default();
        let weights = [1u16, 2, 5];
        let mut counts = [0u32; 3];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..1_000_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut q = Query::to(IpAddr::from((x as u32).to_be_bytes()));
            q.src = Some(IpAddr::from(((x >> 32) as u32).to_be_bytes()));
            let i = choose(0..3usize, |i| weights[i], || mp.hash(&q)).unwrap();
            counts[i] += 1;
        }
        for (c, w) in counts.iter().zip(weights) {
            let share = *c as f64 / 1e6;
            let want = w as f64 / 8.0;
            assert!((share - want).abs() < 0.02 * want, "{counts:?}");
        }
    }
}
