//! What the IPv6 design experiments share: the shipped table, the trie built from it,
//! matched addresses, and a comparison with the trie in one run.

use fibre_bench::addresses;
use fibre_routefile::{final_prefixes, read_route_file};
use fibre_lpm::{Key, Prefix, Structure, Table};
use std::path::PathBuf;
use std::time::Instant;

/// The shipped IPv6 table: its prefixes (sorted), the trie of them (each prefix's value
/// is its position), and 2^20 matched addresses.
#[allow(dead_code)] // not every experiment looks at IPv4
pub fn shipped_ipv6() -> (Vec<Prefix<u128>>, Table<u128>, Vec<u128>) {
    shipped(|r| final_prefixes(&r.v6), "rib-v6.txt.gz")
}

/// The same for the shipped IPv4 table.
#[allow(dead_code)]
pub fn shipped_ipv4() -> (Vec<Prefix<u32>>, Table<u32>, Vec<u32>) {
    shipped(|r| final_prefixes(&r.v4), "rib-v4.txt.gz")
}

fn shipped<K: Key>(
    family: impl Fn(&fibre_routefile::RouteFile) -> Vec<Prefix<K>>,
    file: &str,
) -> (Vec<Prefix<K>>, Table<K>, Vec<K>) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../data/ris-2026-05-11")
        .join(file);
    let routes = read_route_file(&path, false).expect("shipped table");
    let prefixes = family(&routes);
    let table = Table::build_with(Structure::Trie, prefixes.iter().enumerate().map(|(i, p)| (*p, i as u32)));
    let keys = addresses::matched(&prefixes, 1 << 20, 1);
    (prefixes, table, keys)
}

/// A lookup structure under test: batched and scalar lookups of the same addresses.
pub trait Candidate {
    /// What the candidate looks up: the addresses, or a form of them it prefers.
    type Key: Copy;
    fn lookup(&self, key: Self::Key) -> Option<u32>;
    fn lookup_batch(&self, keys: &[Self::Key], out: &mut [Option<u32>]);
    /// Its size and shape, for the report.
    fn describe(&self) -> String;
}

/// Prints the family's table and trie, the line every comparison of it follows.
pub fn announce<K: Key>(prefixes: &[Prefix<K>], table: &Table<K>) {
    println!(
        "IPv{} {} routes: trie {:.2} MiB",
        K::FAMILY,
        prefixes.len(),
        table.memory().lookup_bytes as f64 / 1048576.0
    );
}

/// Best of 7 passes of `f` over `n` lookups, in ns per lookup.
pub fn best_of(n: usize, mut f: impl FnMut()) -> f64 {
    (0..7)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
        * 1e9
        / n as f64
}

/// Checks that `candidate` answers as the trie does (batched for every address, scalar
/// for the first 100,000), then times both `rounds` times, one line a round.
pub fn compare<K: Key, C: Candidate>(
    name: &str,
    candidate: &C,
    table: &Table<K>,
    keys: &[K],
    own: &[C::Key],
    rounds: usize,
) {
    let mut a = vec![None; keys.len()];
    let mut b = vec![None; keys.len()];
    table.lookup_batch(keys, &mut a);
    candidate.lookup_batch(own, &mut b);
    assert_eq!(a, b, "{name} answers as the trie does");
    for (&k, &want) in own.iter().zip(&a).take(100_000) {
        assert_eq!(candidate.lookup(k), want, "{name}, scalar");
    }
    println!("{name}: {}", candidate.describe());
    for _ in 0..rounds {
        let trie_batch = best_of(keys.len(), || table.lookup_batch(keys, &mut a));
        let batch = best_of(keys.len(), || candidate.lookup_batch(own, &mut b));
        let trie_scalar = best_of(keys.len(), || {
            for (o, &k) in a.iter_mut().zip(keys) {
                *o = table.lookup(k);
            }
        });
        let scalar = best_of(keys.len(), || {
            for (o, &k) in b.iter_mut().zip(own) {
                *o = candidate.lookup(k);
            }
        });
        std::hint::black_box((&a, &b));
        println!(
            "matched, ns per lookup (best of 7): trie batch {trie_batch:.2} scalar {trie_scalar:.2} | {name} batch {batch:.2} scalar {scalar:.2}"
        );
    }
}

/// Asks the CPU to start loading the cache line at `p`.
#[allow(dead_code)] // not every experiment prefetches by hand
#[inline(always)]
pub fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch has no architectural effect and never faults, whatever the
    // address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
}
