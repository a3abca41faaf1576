//! Addresses to look up, of two kinds.
//!
//! - *matched*: pick a prefix of the table at random, then random host bits inside it;
//!   so the address distribution follows the table's prefixes, as traffic to routed
//!   destinations does.
//! - *uniform*: anywhere in the address space (IPv4), or anywhere in 2000::/3, the
//!   global unicast space (IPv6).
//!
//! Generation is seeded, so a run can be repeated exactly.

use fibre_lpm::{Key, Prefix};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// The default number of addresses per run (2^20).
pub const DEFAULT_COUNT: usize = 1 << 20;

/// `count` addresses inside randomly chosen prefixes of `prefixes` (which must not be empty).
pub fn matched<K: Key>(prefixes: &[Prefix<K>], count: usize, seed: u64) -> Vec<K> {
    assert!(
        !prefixes.is_empty(),
        "matched addresses need at least one prefix"
    );
    let mut rng = SmallRng::seed_from_u64(seed);
    let width = u32::from(K::BITS);
    (0..count)
        .map(|_| {
            let p = prefixes[rng.gen_range(0..prefixes.len())];
            let host_bits = width - u32::from(p.len());
            let host = if host_bits == 0 {
                0
            } else {
                rng.gen::<u128>() >> (128 - host_bits)
            };
            K::from_u128(p.addr().to_u128() | host)
        })
        .collect()
}

/// `count` uniformly random addresses: all of IPv4, or 2000::/3 for IPv6.
pub fn uniform<K: Key>(count: usize, seed: u64) -> Vec<K> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..count)
        .map(|_| {
            let r: u128 = rng.gen();
            if K::BITS == 128 {
                K::from_u128((r >> 3) | (1 << 125))
            } else {
                K::from_u128(r)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matched_addresses_lie_in_the_table() {
        let ps: Vec<Prefix<u128>> = vec!["2001:db8::/32".parse().unwrap(), "::/0".parse().unwrap()];
        let a = matched(&ps, 1000, 1);
        assert!(a.iter().all(|&k| ps.iter().any(|p| p.contains(k))));
        let host: Vec<Prefix<u32>> = vec!["192.0.2.1/32".parse().unwrap()];
        assert_eq!(matched(&host, 3, 1), vec![0xC000_0201; 3]);
    }

    #[test]
    fn uniform_ipv6_stays_in_global_unicast_and_is_seeded() {
        let a = uniform::<u128>(1000, 9);
        assert!(a.iter().all(|&k| k >> 125 == 1));
        assert_eq!(a, uniform::<u128>(1000, 9));
        assert_ne!(uniform::<u32>(10, 1), uniform::<u32>(10, 2));
    }
}
