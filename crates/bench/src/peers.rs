//! Peer libraries measured beside fibre in the same run, by the same method.
//!
//! `prefix-trie` (a Rust prefix map with longest-prefix match) is built from the same
//! routes and asked for the same addresses, one at a time, with the same dry run
//! subtracted. Behind the `peers` cargo feature (on by default).

use crate::method::{measure, Method, Timing};
use fibre_lpm::{Key, Prefix};

/// A peer library's view of one family.
pub trait Peer<K: Key>: Sync {
    /// Name in reports (the `engine` field).
    fn name(&self) -> &'static str;
    /// Longest-prefix lookup; the value is the route's index.
    fn lookup(&self, key: K) -> Option<u32>;
}

/// Measures a peer's lookups of `keys`, dry run subtracted.
pub fn measure_peer<K: Key>(peer: &dyn Peer<K>, keys: &[K], method: Method) -> Timing {
    let run = |real: bool| {
        measure(
            method,
            |t| t * keys.len() / method.threads.max(1),
            |start, _| {
                let mut acc = 0u32;
                let (head, tail) = keys.split_at(*start);
                for &k in tail.iter().chain(head) {
                    acc = acc.wrapping_add(if real {
                        peer.lookup(k).unwrap_or(0)
                    } else {
                        std::hint::black_box(k).to_u128() as u32
                    });
                }
                std::hint::black_box(acc);
                keys.len() as u64
            },
        )
    };
    run(true).minus(run(false))
}

/// The peers available in this build, built from `prefixes` (values are indices).
pub fn build_peers<K: Key + PeerKey>(prefixes: &[Prefix<K>]) -> Vec<Box<dyn Peer<K>>> {
    K::peers(prefixes)
}

/// Keys that peers can be built for.
pub trait PeerKey: Key {
    /// Every peer of this build for this family.
    fn peers(prefixes: &[Prefix<Self>]) -> Vec<Box<dyn Peer<Self>>>;
}

#[cfg(feature = "peers")]
mod prefix_trie_peer {
    use super::*;
    use prefix_trie::PrefixMap;

    pub struct PrefixTrie<K: Key>(pub PrefixMap<(K, u8), u32>);

    macro_rules! impl_peer {
        ($k:ty) => {
            impl Peer<$k> for PrefixTrie<$k> {
                fn name(&self) -> &'static str {
                    "prefix-trie"
                }
                #[inline]
                fn lookup(&self, key: $k) -> Option<u32> {
                    self.0.get_lpm(&(key, <$k as Key>::BITS)).map(|(_, v)| *v)
                }
            }
            impl PeerKey for $k {
                fn peers(prefixes: &[Prefix<$k>]) -> Vec<Box<dyn Peer<$k>>> {
                    let mut map = PrefixMap::new();
                    for (i, p) in prefixes.iter().enumerate() {
                        map.insert((p.addr(), p.len()), i as u32);
                    }
                    vec![Box::new(PrefixTrie(map))]
                }
            }
        };
    }
    impl_peer!(u32);
    impl_peer!(u128);
}

#[cfg(not(feature = "peers"))]
impl PeerKey for u32 {
    fn peers(_: &[Prefix<u32>]) -> Vec<Box<dyn Peer<u32>>> {
        Vec::new()
    }
}

#[cfg(not(feature = "peers"))]
impl PeerKey for u128 {
    fn peers(_: &[Prefix<u128>]) -> Vec<Box<dyn Peer<u128>>> {
        Vec::new()
    }
}

#[cfg(all(test, feature = "peers"))]
mod tests {
    use super::*;
    use fibre_lpm::ReferenceLpm;

    #[test]
    fn prefix_trie_answers_like_the_reference() {
        let prefixes: Vec<Prefix<u128>> = [
            "2001:db8::/32",
            "2001:db8:1::/48",
            "::/0",
            "2001:db8:1::1/128",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        let peers = build_peers(&prefixes);
        let mut r = ReferenceLpm::new();
        for (i, p) in prefixes.iter().enumerate() {
            r.insert(*p, i as u32);
        }
        for k in crate::addresses::matched(&prefixes, 1000, 3) {
            assert_eq!(peers[0].lookup(k), r.lookup(k).map(|x| x.1));
        }
    }
}
