//! DPDK's FIBs measured beside fibre's tables: `rte_fib` (DIR-24-8) for IPv4 and
//! `rte_fib6` (the trie) for IPv6, of the DPDK found at build time (Debian 12: 22.11).
//!
//! DPDK's FIBs are the reference issue 38 holds fibre's lookups to. DIR-24-8 is a direct
//! table of 2^24 entries indexed by an address's first 24 bits, whose entries hold a next
//! hop or the index of a 256-entry second-level group ("tbl8") for the routes longer than
//! /24; the IPv6 trie starts with the same 2^24-entry table and continues one byte a
//! level through tbl8 groups. Both keep every route in a route tree (`rte_rib`) besides,
//! which updates use. With 4-byte next hops the first level alone is 64 MiB.
//!
//! The peer gets the same routes as fibre (next hop = the route's index), the same
//! addresses and the same method (repetitions, trimmed mean, the dry run subtracted),
//! three ways: one address a call (`rte_fib_lookup_bulk` with n = 1, DPDK's own `n=1`
//! figure), calls of 64 addresses, and dependent lookups, each address changed by the
//! previous answer (xor'd with the answer masked by an opaque zero), so that no two
//! lookups overlap: their latency. The lookup functions are DPDK's AVX-512 ones where the
//! CPU has them (the environment starts with `--force-max-simd-bitwidth=512`, as DPDK
//! keeps to 256 bits unless told), the scalar ones otherwise; reports say which.
//!
//! Memory: the tables' size follows from what is configured (2^24 x 4 bytes plus
//! `num_tbl8` groups of 256 x 4 bytes, plus one spare group); the growth of DPDK's heap
//! while the FIB is made and filled is everything, the route tree included.
//! `num_tbl8` is sized to the table: DPDK reserves groups more cautiously than it fills
//! them (each route longer than /24 reserves the groups between its parent's length and
//! its own, shared or not), and refuses a route once the reservations would pass
//! `num_tbl8`; so the FIB is made with the groups the routes fill (IPv4: the /24s holding
//! longer routes; IPv6: the distinct prefixes of 24, 32, ... bits of longer routes) and
//! an eighth more, made again with half as many more until every route fits, and the
//! count then narrowed down to within a thirty-second of the fewest that fit. Reports
//! give the tables as configured and as the filled groups alone would make them.
//!
//! DPDK's environment (EAL) starts once a process, without hugepages (ordinary memory,
//! `--no-huge`, so 4 KiB pages, as fibre's tables have), without devices (`--no-pci`),
//! sharing nothing with other processes (`--no-shconf`). Where it cannot start, or the
//! build found no DPDK (see `build.rs`), [`unavailable`] says why and the studies skip
//! the peer with that reason; nothing here panics for want of DPDK.

#[cfg(fibre_dpdk)]
mod ffi;

use crate::lookups::Mode;
use crate::method::{measure, Method, Timing};
use fibre_lpm::{Key, Prefix};
use std::hint::black_box;
use std::marker::PhantomData;

/// The next hop DPDK answers where no route matches: the largest a 4-byte next hop can
/// be (DPDK keeps the top bit), above any route index.
pub const MISS: u32 = (1 << 31) - 1;

/// MiB of ordinary memory DPDK's environment may allocate: the largest family's FIB at
/// once (about 510 MiB for a full IPv4 table, most of it the route tree). The memory is
/// mapped, not touched, until DPDK allocates it.
#[cfg(fibre_dpdk)]
const MEM_MB: u32 = 2048;

/// Why the DPDK peer cannot run in this process (the build has no DPDK, or its
/// environment did not start), as a line for reports; `None` if it can.
pub fn unavailable() -> Option<String> {
    #[cfg(fibre_dpdk)]
    let why = ffi::init(MEM_MB).err();
    #[cfg(not(fibre_dpdk))]
    let why = Some(env!("FIBRE_DPDK_MISSING").to_string());
    why.map(|w| format!("DPDK peer skipped: {w}"))
}

/// The version of the DPDK this build links, where it found one.
pub fn version() -> Option<&'static str> {
    option_env!("FIBRE_DPDK_VERSION")
}

/// What DPDK's FIB of one table takes.
#[derive(Clone, Copy, Debug)]
pub struct Memory {
    /// The lookup tables as configured: the first level and the tbl8 groups.
    pub tables_bytes: u64,
    /// The lookup tables with only the groups the routes fill (counted from the routes,
    /// one a distinct 24, 32, ... bit prefix of longer routes): less than DPDK must be
    /// given, since it reserves groups more cautiously than it fills them.
    pub needed_bytes: u64,
    /// The growth of DPDK's heap: the tables, the route tree and the rest.
    pub heap_bytes: u64,
    /// The tbl8 groups configured: the fewest (within a thirty-second) with which DPDK
    /// takes every route, in the order given.
    pub num_tbl8: u32,
    /// The tbl8 groups the routes fill.
    pub tbl8_needed: u32,
}

/// An address family DPDK has a FIB for, and its addresses as DPDK takes them.
pub trait DpdkKey: Key {
    /// The address as DPDK's lookups take it (IPv4: host order; IPv6: 16 bytes in
    /// network order).
    type Raw: Copy + Send + Sync + 'static;
    /// The key as DPDK takes it.
    fn raw(self) -> Self::Raw;
    /// `raw` changed by `x` (a dependent lookup's link to the previous answer).
    fn perturb(raw: Self::Raw, x: u32) -> Self::Raw;
    /// 32 bits of `raw`, for the dry run.
    fn low(raw: Self::Raw) -> u32;
    /// The tbl8 groups the routes need, by this family's structure.
    #[cfg_attr(not(fibre_dpdk), allow(dead_code))]
    fn tbl8_estimate(prefixes: &[Prefix<Self>]) -> u32;
    /// DPDK's bulk lookup.
    #[cfg(fibre_dpdk)]
    fn lookup(fib: &ffi::Fib, raw: &[Self::Raw], out: &mut [u64]);
    /// Which of DPDK's FIBs this family's is.
    #[cfg(fibre_dpdk)]
    const FIB: ffi::Family;
}

impl DpdkKey for u32 {
    type Raw = u32;
    fn raw(self) -> u32 {
        self
    }
    fn perturb(raw: u32, x: u32) -> u32 {
        raw ^ x
    }
    fn low(raw: u32) -> u32 {
        raw
    }
    fn tbl8_estimate(prefixes: &[Prefix<u32>]) -> u32 {
        distinct_blocks(prefixes, &[24])
    }
    #[cfg(fibre_dpdk)]
    fn lookup(fib: &ffi::Fib, raw: &[u32], out: &mut [u64]) {
        fib.lookup4(raw, out);
    }
    #[cfg(fibre_dpdk)]
    const FIB: ffi::Family = ffi::Family::V4;
}

impl DpdkKey for u128 {
    type Raw = [u8; 16];
    fn raw(self) -> [u8; 16] {
        self.to_be_bytes()
    }
    fn perturb(mut raw: [u8; 16], x: u32) -> [u8; 16] {
        raw[15] ^= x as u8;
        raw
    }
    fn low(raw: [u8; 16]) -> u32 {
        u32::from_be_bytes([raw[12], raw[13], raw[14], raw[15]])
    }
    fn tbl8_estimate(prefixes: &[Prefix<u128>]) -> u32 {
        let levels: Vec<u8> = (24..128).step_by(8).collect();
        distinct_blocks(prefixes, &levels)
    }
    #[cfg(fibre_dpdk)]
    fn lookup(fib: &ffi::Fib, raw: &[[u8; 16]], out: &mut [u64]) {
        fib.lookup6(raw, out);
    }
    #[cfg(fibre_dpdk)]
    const FIB: ffi::Family = ffi::Family::V6;
}

/// For each level `b` of `levels`, the distinct first `b` bits of the routes longer than
/// `b`, summed: the second-level groups a byte-a-level structure needs below /24.
#[cfg_attr(not(fibre_dpdk), allow(dead_code))]
fn distinct_blocks<K: Key>(prefixes: &[Prefix<K>], levels: &[u8]) -> u32 {
    let mut total = 0usize;
    for &b in levels {
        let shift = u32::from(K::BITS - b);
        let mut blocks: Vec<u128> = prefixes
            .iter()
            .filter(|p| p.len() > b)
            .map(|p| p.addr().to_u128() >> shift)
            .collect();
        blocks.sort_unstable();
        blocks.dedup();
        total += blocks.len();
    }
    u32::try_from(total).unwrap_or(u32::MAX)
}

/// A table in DPDK's FIB of its family.
pub struct Dpdk<K: DpdkKey> {
    #[cfg(fibre_dpdk)]
    fib: ffi::Fib,
    #[cfg(not(fibre_dpdk))]
    never: std::convert::Infallible,
    /// What the FIB takes.
    pub memory: Memory,
    /// Whether its lookups are DPDK's AVX-512 ones.
    pub vector: bool,
    /// Seconds to make and fill it (the last attempt, if it ran out of tbl8 groups).
    pub build_seconds: f64,
    _key: PhantomData<K>,
}

impl<K: DpdkKey> Dpdk<K> {
    /// DPDK's FIB holding `prefixes`, route `i` with next hop `i`; or why not (DPDK is
    /// missing, its environment did not start, a route was refused).
    pub fn build(prefixes: &[Prefix<K>]) -> Result<Dpdk<K>, String> {
        if let Some(why) = unavailable() {
            return Err(why);
        }
        #[cfg(not(fibre_dpdk))]
        unreachable!(
            "unavailable() is Some without DPDK: {} routes",
            prefixes.len()
        );
        #[cfg(fibre_dpdk)]
        Self::build_dpdk(prefixes)
    }

    #[cfg(fibre_dpdk)]
    fn build_dpdk(prefixes: &[Prefix<K>]) -> Result<Dpdk<K>, String> {
        let needed = K::tbl8_estimate(prefixes);
        // Grow by half until the routes fit, then halve the gap between the largest
        // count that did not fit and the smallest that did, down to a thirty-second.
        // DPDK fills no fewer groups than the routes need, and counts within 64 groups
        // (64 KiB) are not worth telling apart.
        let (mut lo, mut num_tbl8) = (
            needed.saturating_sub(1),
            needed.saturating_add(needed / 8).saturating_add(64),
        );
        let mut best: Option<Dpdk<K>> = None;
        for _ in 0..24 {
            match Self::attempt(prefixes, num_tbl8, needed)? {
                Some(d) => best = Some(d),
                None => lo = num_tbl8,
            }
            num_tbl8 = match &best {
                None if num_tbl8 == u32::MAX => break,
                None => num_tbl8.saturating_add(num_tbl8 / 2),
                Some(b) => {
                    let hi = b.memory.num_tbl8;
                    if hi - lo <= (hi / 32).max(64) {
                        break;
                    }
                    lo + (hi - lo) / 2
                }
            };
        }
        best.ok_or_else(|| format!("DPDK ran out of tbl8 groups even with {num_tbl8} of them"))
    }

    /// The FIB with `num_tbl8` groups, or `None` if the routes do not fit in them.
    #[cfg(fibre_dpdk)]
    fn attempt(
        prefixes: &[Prefix<K>],
        num_tbl8: u32,
        needed: u32,
    ) -> Result<Option<Dpdk<K>>, String> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NAMES: AtomicU32 = AtomicU32::new(0);
        let max_routes = u32::try_from(prefixes.len() + 1).map_err(|e| e.to_string())?;
        let name = format!(
            "fibre{}-{}",
            <K as Key>::FAMILY,
            NAMES.fetch_add(1, Ordering::Relaxed)
        );
        let before = ffi::heap_bytes();
        let start = std::time::Instant::now();
        let mut fib = ffi::Fib::create(K::FIB, &name, max_routes, num_tbl8, MISS)?;
        for (i, p) in prefixes.iter().enumerate() {
            match fib.add(p.addr().to_u128(), p.len(), i as u32) {
                Ok(()) => {}
                Err(e) if out_of_groups(e) => return Ok(None),
                Err(e) => {
                    return Err(format!(
                        "DPDK refused the route {p}: {}",
                        std::io::Error::from_raw_os_error(-e)
                    ))
                }
            }
        }
        let build_seconds = start.elapsed().as_secs_f64();
        let heap_bytes = ffi::heap_bytes().saturating_sub(before);
        Ok(Some(Dpdk {
            vector: fib.vector,
            fib,
            memory: Memory {
                tables_bytes: tables_bytes(num_tbl8),
                needed_bytes: tables_bytes(needed),
                heap_bytes,
                num_tbl8,
                tbl8_needed: needed,
            },
            build_seconds,
            _key: PhantomData,
        }))
    }

    /// DPDK's lookup of `raw` into `out` (one next hop a key).
    #[inline]
    pub fn lookup_raw(&self, raw: &[K::Raw], out: &mut [u64]) {
        #[cfg(fibre_dpdk)]
        K::lookup(&self.fib, raw, out);
        #[cfg(not(fibre_dpdk))]
        match (self.never, raw, out) {}
    }

    /// The route index DPDK answers for `key`, or `None` where no route matches.
    pub fn lookup(&self, key: K) -> Option<u32> {
        let mut out = [0u64];
        self.lookup_raw(&[key.raw()], &mut out);
        (out[0] != u64::from(MISS)).then_some(out[0] as u32)
    }

    /// Measures DPDK's lookups of `raw` (see [`raw_keys`]) in `mode`, dry run
    /// subtracted; batches of `batch` addresses.
    pub fn measure(&self, raw: &[K::Raw], mode: Mode, method: Method, batch: usize) -> Timing {
        let start_of = |thread: usize| thread * raw.len() / method.threads.max(1);
        let run = |real: bool| {
            measure(
                method,
                |thread| (vec![0u64; batch.max(1)], start_of(thread)),
                |(out, first), _| self.pass(raw, *first, mode, out, real),
            )
        };
        run(true).minus(run(false))
    }

    /// One pass over `raw` from `first`; with `real == false` everything but the
    /// lookups (the dry run).
    #[inline(never)]
    fn pass(&self, raw: &[K::Raw], first: usize, mode: Mode, out: &mut [u64], real: bool) -> u64 {
        let mut acc = 0u32;
        let (head, tail) = raw.split_at(first.min(raw.len()));
        match mode {
            Mode::Scalar => {
                for &k in tail.iter().chain(head) {
                    acc = acc.wrapping_add(if real {
                        self.lookup_raw(std::slice::from_ref(&k), &mut out[..1]);
                        out[0] as u32
                    } else {
                        K::low(black_box(k))
                    });
                }
            }
            Mode::Batch => {
                let n = out.len();
                for chunk in tail.chunks(n).chain(head.chunks(n)) {
                    let out = &mut out[..chunk.len()];
                    if real {
                        self.lookup_raw(chunk, out);
                    } else {
                        for (o, &k) in out.iter_mut().zip(black_box(chunk)) {
                            *o = u64::from(K::low(k));
                        }
                    }
                    for o in out.iter() {
                        acc = acc.wrapping_add(*o as u32);
                    }
                }
            }
            Mode::Dependent => {
                let zero = black_box(0u32);
                let mut answer = 0u32;
                for &k in tail.iter().chain(head) {
                    let k = K::perturb(k, answer & zero);
                    answer = if real {
                        self.lookup_raw(std::slice::from_ref(&k), &mut out[..1]);
                        out[0] as u32
                    } else {
                        K::low(k)
                    };
                    acc = acc.wrapping_add(answer);
                }
            }
        }
        black_box(acc);
        raw.len() as u64
    }
}

/// `keys` as DPDK's lookups take them.
pub fn raw_keys<K: DpdkKey>(keys: &[K]) -> Vec<K::Raw> {
    keys.iter().map(|&k| k.raw()).collect()
}

/// The lookup tables' bytes with `num_tbl8` groups: the first level (2^24 4-byte
/// entries) and the groups (256 entries each, one more than configured).
#[cfg(fibre_dpdk)]
fn tables_bytes(num_tbl8: u32) -> u64 {
    (1u64 << 24) * 4 + (u64::from(num_tbl8) + 1) * 256 * 4
}

/// Whether DPDK's error `e` (a negative errno) is `ENOSPC`: no tbl8 group left.
#[cfg(fibre_dpdk)]
fn out_of_groups(e: i32) -> bool {
    std::io::Error::from_raw_os_error(-e).kind() == std::io::ErrorKind::StorageFull
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tbl8_estimates_count_the_groups_below_24_bits() {
        let p4 = |s: &str| s.parse::<Prefix<u32>>().unwrap();
        let v4 = [
            p4("10.0.0.0/8"),
            p4("10.1.2.0/25"),
            p4("10.1.2.128/25"),
            p4("10.1.3.7/32"),
        ];
        assert_eq!(u32::tbl8_estimate(&v4), 2, "two /24s hold longer routes");
        let p6 = |s: &str| s.parse::<Prefix<u128>>().unwrap();
        let v6 = [
            p6("2001:db8::/32"),
            p6("2001:db8:1::/48"),
            p6("2001:db8:2::/48"),
        ];
        // Every route is longer than 24 bits and shares the first 24 (one group); the
        // /48s share their first 32 (one group) and 40 (one group) too.
        assert_eq!(u128::tbl8_estimate(&v6), 1 + 1 + 1);
    }

    /// A small table of `n` random routes of every length from /8 (so that some addresses
    /// match nothing), and addresses matched and uniform.
    fn small<K: DpdkKey>(n: usize, seed: u64) -> (Vec<Prefix<K>>, Vec<K>) {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let mut routes: Vec<Prefix<K>> = (0..n)
            .map(|_| {
                let len = rng.gen_range(8..=K::BITS);
                Prefix::new_clamped(K::from_u128(rng.gen()), len)
            })
            .collect();
        routes.sort_unstable();
        routes.dedup();
        let mut keys = crate::addresses::matched(&routes, 20_000, seed);
        keys.extend(crate::addresses::uniform::<K>(20_000, seed));
        (routes, keys)
    }

    /// DPDK's answers against fibre's, for random addresses of a small random table.
    fn answers_like_fibre<K: DpdkKey>() {
        let (routes, keys) = small::<K>(3000, 7);
        let dpdk = match Dpdk::<K>::build(&routes) {
            Ok(d) => d,
            // Without DPDK in the build there is nothing to check; with it, it must run.
            Err(why) if !cfg!(fibre_dpdk) => return eprintln!("{why}"),
            Err(why) => panic!("{why}"),
        };
        let table =
            fibre_lpm::Table::<K>::build(routes.iter().enumerate().map(|(i, p)| (*p, i as u32)));
        let mut misses = 0;
        for &k in &keys {
            assert_eq!(
                dpdk.lookup(k),
                table.lookup(k),
                "IPv{} {k:?}",
                <K as Key>::FAMILY
            );
            misses += usize::from(table.lookup(k).is_none());
        }
        assert!(
            misses > 0 && misses < keys.len() / 2,
            "{misses} addresses match nothing"
        );
        // Batched and dependent lookups give the same answers as one at a time.
        let raw = raw_keys(&keys);
        let mut out = vec![0u64; 64];
        for (chunk, ks) in raw.chunks(64).zip(keys.chunks(64)) {
            dpdk.lookup_raw(chunk, &mut out[..chunk.len()]);
            for (o, &k) in out.iter().zip(ks) {
                assert_eq!(
                    (*o != u64::from(MISS)).then_some(*o as u32),
                    table.lookup(k)
                );
            }
        }
        let method = Method {
            repetitions: 3,
            threads: 1,
        };
        for mode in [Mode::Scalar, Mode::Batch, Mode::Dependent] {
            let t = dpdk.measure(&raw, mode, method, 64);
            assert!(t.per_op.mean.is_finite(), "{mode:?}: {t:?}");
        }
        assert!(dpdk.memory.tables_bytes >= 64 << 20, "{:?}", dpdk.memory);
        assert!(
            dpdk.memory.heap_bytes >= dpdk.memory.tables_bytes,
            "{:?}",
            dpdk.memory
        );
    }

    #[test]
    fn the_dpdk_peer_answers_like_fibre() {
        answers_like_fibre::<u32>();
        answers_like_fibre::<u128>();
    }

    #[test]
    fn without_dpdk_the_reason_is_one_line() {
        if let Some(why) = unavailable() {
            assert!(
                why.starts_with("DPDK peer skipped: ") && !why.contains('\n'),
                "{why}"
            );
        }
        #[cfg(not(fibre_dpdk))]
        assert!(
            unavailable().unwrap().contains("pkg-config")
                || unavailable().unwrap().contains("FIBRE_NO_DPDK")
        );
    }

    #[test]
    fn raw_keys_are_what_dpdk_takes() {
        assert_eq!(0x0a01_0203u32.raw(), 0x0a01_0203);
        let a: u128 = "2001:db8::1".parse::<std::net::Ipv6Addr>().unwrap().into();
        assert_eq!(a.raw()[..4], [0x20, 0x01, 0x0d, 0xb8]);
        assert_eq!(u128::low(a.raw()), 1);
        assert_eq!(u128::perturb(a.raw(), 0), a.raw());
    }
}
