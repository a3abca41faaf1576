//! The two passes around the one search of flows alike (see `forward`), eight flows an
//! instruction where the CPU has AVX2.
//!
//! While only the default rules exist, a batch of flows from one link is one LPM search;
//! what routing adds is two passes over the batch's addresses and answers. Written one
//! flow at a time they cost as much as the search itself (about 80 instructions a flow
//! against its 75), so they are written here as vector code:
//!
//! - [`martians_v4`]: which IPv4 flows have a martian destination (`0.0.0.0/8`,
//!   `127.0.0.0/8`) or, arriving on a link, a martian source (multicast, the limited
//!   broadcast, `0.0.0.0/8`, `127.0.0.0/8`). Compares and a movemask.
//! - [`quick_hops`]: which flows the search answered with one hop that needs no further
//!   check, and that hop. A flow arriving on a link needs its source checked when its
//!   source may be this host's (a gather of the [`AddrFilter`]'s words) or its hop sends
//!   it back out of that link (a gather of the table's [`AnswerTable::backs`]).
//!
//! Each has a portable form, the reference the AVX2 form is tested against (and what runs
//! on a CPU without AVX2). The AVX2 form is the only `unsafe` of this crate: its loads,
//! stores and gathers are in bounds by construction, as each block says, and the tests
//! run it under Miri in a build that enables AVX2.

use crate::answers::{AddrFilter, AnswerTable, DestAnswer};
use crate::query::BATCH;
use std::net::{Ipv4Addr, Ipv6Addr};

/// This CPU's AVX2, detected: the proof that the AVX2 forms may run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Avx2 {
    _detected: (),
}

impl Avx2 {
    /// The proof, if this CPU has AVX2 and the tables' forms may use it
    /// ([`fibre_lpm::FORM_CAP_VARIABLE`]).
    pub(crate) fn detect() -> Option<Avx2> {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") && fibre_lpm::Form::best() >= fibre_lpm::Form::Avx2
        {
            return Some(Avx2 { _detected: () });
        }
        None
    }
}

/// What the hop pass checks of flows arriving on a link (`None` for flows this host
/// sends: their source is not checked).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Arriving<'a> {
    /// The input link (never 0: no link has that index).
    pub(crate) input: u32,
    /// This host's addresses and broadcast addresses.
    pub(crate) own: &'a AddrFilter,
    /// Every source is looked up (rules or local routes were added): no flow is quick.
    pub(crate) full: bool,
}

/// `f(args)` in its AVX2 form where `cpu` proves the CPU has AVX2, else in its portable
/// form: the one place the AVX2 forms are called.
macro_rules! form {
    ($cpu:expr, $f:ident($($arg:expr),*)) => {{
        #[cfg(target_arch = "x86_64")]
        let answer = match $cpu {
            // SAFETY: the `Avx2` proves this CPU has AVX2, the one feature the AVX2 forms
            // enable.
            Some(_) => unsafe { avx2::$f($($arg),*) },
            None => portable::$f($($arg),*),
        };
        #[cfg(not(target_arch = "x86_64"))]
        let answer = {
            let _ = $cpu;
            portable::$f($($arg),*)
        };
        answer
    }};
}

/// The mask of the first `n` flows.
#[inline]
fn first(n: usize) -> u64 {
    debug_assert!(n <= BATCH);
    if n == BATCH {
        u64::MAX
    } else {
        (1 << n) - 1
    }
}

/// Bit `i` set where IPv4 flow `i` of the first `n` (destination `dst[i]`, source
/// `src[i]`, host order) is martian or more than the tables answer: its destination is
/// in `0.0.0.0/8` or `127.0.0.0/8`, multicast or the limited broadcast, or, with
/// `arriving`, its source is multicast, the limited broadcast, or in `0.0.0.0/8` or
/// `127.0.0.0/8`.
#[inline]
pub(crate) fn martians_v4(
    cpu: Option<Avx2>,
    dst: &[u32; BATCH],
    src: &[u32; BATCH],
    n: usize,
    arriving: bool,
) -> u64 {
    form!(cpu, martians_v4(dst, src, arriving)) & first(n)
}

/// Whether one IPv4 flow is martian, as [`martians_v4`] says of many.
#[inline]
pub(crate) fn martian_v4(d: u32, s: u32, arriving: bool) -> bool {
    let d8 = d >> 24;
    let s8 = s >> 24;
    let dst = (d8 == 0) | (d8 == 127) | (d >> 28 == 0xe) | (d == u32::MAX);
    let src = (s >> 28 == 0xe) | (s == u32::MAX) | (s8 == 0) | (s8 == 127);
    dst | (src & arriving)
}

/// Of the first `n` flows, bit `i` set where the search's answer `found[i]` is one hop
/// of `t` and, for flows `arriving` on a link (sources `src`), the source needs no further
/// check; `hops[i]` is then that hop's index in `t.hops`.
#[inline]
pub(crate) fn quick_hops(
    cpu: Option<Avx2>,
    t: &AnswerTable,
    found: &[Option<u32>; BATCH],
    src: &[u32; BATCH],
    n: usize,
    arriving: Option<Arriving<'_>>,
    hops: &mut [u32; BATCH],
) -> u64 {
    if t.backs.is_empty() {
        // No hops: no answer is one.
        return 0;
    }
    form!(cpu, quick_hops(&t.backs, found, src, arriving, hops)) & first(n)
}

/// The host-order values of up to [`BATCH`] IPv4 addresses, as the search takes them,
/// into the first `addrs.len()` of `keys`.
#[inline]
pub(crate) fn keys_v4(cpu: Option<Avx2>, addrs: &[Ipv4Addr], keys: &mut [u32; BATCH]) {
    form!(cpu, keys_v4(addrs, keys))
}

/// [`keys_v4`] for IPv6 addresses.
#[inline]
pub(crate) fn keys_v6(cpu: Option<Avx2>, addrs: &[Ipv6Addr], keys: &mut [u128; BATCH]) {
    form!(cpu, keys_v6(addrs, keys))
}

/// The value of a search that found nothing, as a code: not one hop.
const NOTHING: u32 = u32::MAX;

/// A code whose bits from here up are 0 answers with one hop, held in its low
/// `HOP_BITS` ([`crate::answers::DestAnswer::one_hop`]).
const ONE_KIND_SHIFT: u32 = 27;
const HOP_BITS: u32 = (1 << crate::answers::ANSWER_PAYLOAD) - 1;

/// The forms as plain Rust: the reference.
mod portable {
    use super::*;

    #[inline(always)]
    pub(super) fn keys_v4(addrs: &[Ipv4Addr], keys: &mut [u32; BATCH]) {
        for (k, a) in keys.iter_mut().zip(addrs) {
            *k = u32::from(*a);
        }
    }

    #[inline(always)]
    pub(super) fn keys_v6(addrs: &[Ipv6Addr], keys: &mut [u128; BATCH]) {
        for (k, a) in keys.iter_mut().zip(addrs) {
            *k = u128::from(*a);
        }
    }

    pub(super) fn martians_v4(dst: &[u32; BATCH], src: &[u32; BATCH], arriving: bool) -> u64 {
        let mut out = 0u64;
        for (i, (&d, &s)) in dst.iter().zip(src).enumerate() {
            out |= (martian_v4(d, s, arriving) as u64) << i;
        }
        out
    }

    pub(super) fn quick_hops(
        backs: &[u32],
        found: &[Option<u32>; BATCH],
        src: &[u32; BATCH],
        arriving: Option<Arriving<'_>>,
        hops: &mut [u32; BATCH],
    ) -> u64 {
        let mut out = 0u64;
        for (i, (f, &s)) in found.iter().zip(src).enumerate() {
            // One hop, and one the table has.
            let Some(hop) = f
                .and_then(DestAnswer::one_hop)
                .filter(|&h| (h as usize) < backs.len())
            else {
                continue;
            };
            let checked = match arriving {
                None => false,
                Some(a) => a.full | a.own.may_hold(s) | (backs[hop as usize] == a.input),
            };
            hops[i] = hop;
            out |= (!checked as u64) << i;
        }
        out
    }
}

/// The AVX2 forms, eight flows a step, giving exactly the portable forms' bits.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    /// Eight lanes of `a` from `8 * k`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn load(a: &[u32; BATCH], k: usize) -> __m256i {
        let lanes = &a[8 * k..8 * k + 8];
        // SAFETY: `lanes` is 8 u32s, the 32 bytes an unaligned load reads.
        unsafe { _mm256_loadu_si256(lanes.as_ptr().cast()) }
    }

    /// Lanes of `v` all ones where true, as a byte of bits.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn movemask(v: __m256i) -> u64 {
        _mm256_movemask_ps(_mm256_castsi256_ps(v)) as u32 as u64
    }

    /// The portable loop, which the compiler turns into byte shuffles with AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) fn keys_v4(addrs: &[Ipv4Addr], keys: &mut [u32; BATCH]) {
        portable::keys_v4(addrs, keys)
    }

    /// The portable loop, which the compiler turns into byte shuffles with AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) fn keys_v6(addrs: &[Ipv6Addr], keys: &mut [u128; BATCH]) {
        portable::keys_v6(addrs, keys)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn martians_v4(dst: &[u32; BATCH], src: &[u32; BATCH], arriving: bool) -> u64 {
        let zero = _mm256_setzero_si256();
        let lo = _mm256_set1_epi32(127);
        let multicast = _mm256_set1_epi32(0xe);
        let ones = _mm256_set1_epi32(-1);
        let arriving = if arriving { ones } else { zero };
        let mut out = 0u64;
        for k in 0..BATCH / 8 {
            let d8 = _mm256_srli_epi32::<24>(load(dst, k));
            let s = load(src, k);
            let s8 = _mm256_srli_epi32::<24>(s);
            let d = load(dst, k);
            let dst = _mm256_or_si256(
                _mm256_or_si256(_mm256_cmpeq_epi32(d8, zero), _mm256_cmpeq_epi32(d8, lo)),
                _mm256_or_si256(
                    _mm256_cmpeq_epi32(_mm256_srli_epi32::<28>(d), multicast),
                    _mm256_cmpeq_epi32(d, ones),
                ),
            );
            let src = _mm256_or_si256(
                _mm256_or_si256(
                    _mm256_cmpeq_epi32(_mm256_srli_epi32::<28>(s), multicast),
                    _mm256_cmpeq_epi32(s, ones),
                ),
                _mm256_or_si256(_mm256_cmpeq_epi32(s8, zero), _mm256_cmpeq_epi32(s8, lo)),
            );
            let m = _mm256_or_si256(dst, _mm256_and_si256(src, arriving));
            out |= movemask(m) << (8 * k);
        }
        out
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn quick_hops(
        backs: &[u32],
        found: &[Option<u32>; BATCH],
        src: &[u32; BATCH],
        arriving: Option<Arriving<'_>>,
        hops: &mut [u32; BATCH],
    ) -> u64 {
        let mut codes = [0u32; BATCH];
        for (c, f) in codes.iter_mut().zip(found) {
            *c = f.unwrap_or(NOTHING);
        }
        let last = _mm256_set1_epi32(backs.len() as i32 - 1);
        let hop_bits = _mm256_set1_epi32(HOP_BITS as i32);
        let zero = _mm256_setzero_si256();
        let (input, full, words) = match arriving {
            // No link has index 0, and a flow sent by this host has no source to check:
            // with `full` 0 and the filter never consulted, nothing is checked.
            None => (zero, zero, None),
            Some(a) => (
                _mm256_set1_epi32(a.input as i32),
                _mm256_set1_epi32(-(a.full as i32)),
                Some(a.own.words()),
            ),
        };
        let mut out = 0u64;
        for k in 0..BATCH / 8 {
            let code = load(&codes, k);
            let payload = _mm256_and_si256(code, hop_bits);
            let hop = _mm256_min_epu32(payload, last);
            // One hop, and one the table has.
            let one = _mm256_and_si256(
                _mm256_cmpeq_epi32(_mm256_srli_epi32::<{ ONE_KIND_SHIFT as i32 }>(code), zero),
                _mm256_cmpeq_epi32(payload, hop),
            );
            let lanes = &mut hops[8 * k..8 * k + 8];
            // SAFETY: `lanes` is 8 u32s, the 32 bytes an unaligned store writes.
            unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), hop) };
            let mut checked = full;
            if let Some(words) = words {
                // SAFETY: each lane of `hop` is at most `backs.len() - 1` (the minimum
                // above; `backs` is not empty), so the gather reads inside `backs`.
                let back = unsafe { _mm256_i32gather_epi32::<4>(backs.as_ptr().cast(), hop) };
                let s = load(src, k);
                let bucket = _mm256_srli_epi32::<{ 32 - AddrFilter::BUCKET_BITS as i32 }>(
                    _mm256_mullo_epi32(s, _mm256_set1_epi32(AddrFilter::MULTIPLIER as i32)),
                );
                let word = _mm256_srli_epi32::<5>(bucket);
                // SAFETY: a bucket has `BUCKET_BITS` bits, so its word (bucket / 32) is
                // below `words.len()`, which is 2^BUCKET_BITS / 32: the gather reads
                // inside `words`.
                let w = unsafe { _mm256_i32gather_epi32::<4>(words.as_ptr().cast(), word) };
                let bit = _mm256_and_si256(
                    _mm256_srlv_epi32(w, _mm256_and_si256(bucket, _mm256_set1_epi32(31))),
                    _mm256_set1_epi32(1),
                );
                let own = _mm256_cmpeq_epi32(bit, _mm256_set1_epi32(1));
                checked = _mm256_or_si256(
                    checked,
                    _mm256_or_si256(own, _mm256_cmpeq_epi32(back, input)),
                );
            }
            out |= movemask(_mm256_andnot_si256(checked, one)) << (8 * k);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Addresses where the martian checks change their answer, and random ones.
    fn addresses(rng: &mut impl Rng) -> [u32; BATCH] {
        let edges = [
            0,
            1,
            0x00ff_ffff,
            0x0100_0000,
            0x7eff_ffff,
            0x7f00_0000,
            0x7f00_0001,
            0x7fff_ffff,
            0x8000_0000,
            0xdfff_ffff,
            0xe000_0000,
            0xefff_ffff,
            0xf000_0000,
            0xffff_fffe,
            0xffff_ffff,
        ];
        std::array::from_fn(|_| {
            if rng.gen_bool(0.5) {
                edges[rng.gen_range(0..edges.len())]
            } else {
                rng.gen()
            }
        })
    }

    /// The portable martian check against the checks written one by one.
    #[test]
    fn portable_martians_are_the_kernel_s() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for _ in 0..if cfg!(miri) { 4 } else { 200 } {
            let (dst, src) = (addresses(&mut rng), addresses(&mut rng));
            for arriving in [false, true] {
                let bits = portable::martians_v4(&dst, &src, arriving);
                for i in 0..BATCH {
                    let d = std::net::Ipv4Addr::from(dst[i]);
                    let s = std::net::Ipv4Addr::from(src[i]);
                    let martian_src = s.is_multicast()
                        || s.is_broadcast()
                        || s.octets()[0] == 0
                        || s.is_loopback();
                    let want = d.octets()[0] == 0
                        || d.is_loopback()
                        || d.is_multicast()
                        || d.is_broadcast()
                        || (arriving && martian_src);
                    assert_eq!(
                        bits >> i & 1 == 1,
                        want,
                        "{d} from {s}, arriving {arriving}"
                    );
                }
            }
        }
    }

    /// A table with `count` hops whose `backs` are random links (0: not unicast).
    fn table(rng: &mut impl Rng, count: usize) -> AnswerTable {
        let mut t = AnswerTable::default();
        t.backs = (0..count).map(|_| rng.gen_range(0..4)).collect();
        t
    }

    /// Search answers: one hop (in range or not), other kinds, nothing.
    fn found(rng: &mut impl Rng, hops: u32) -> [Option<u32>; BATCH] {
        std::array::from_fn(|_| match rng.gen_range(0..4) {
            0 => None,
            1 => Some(rng.gen()),
            2 => Some(rng.gen_range(0..hops.max(1) * 2) | rng.gen_range(0..256) << 19),
            _ => Some(rng.gen_range(0..hops.max(1))),
        })
    }

    #[test]
    fn portable_quick_hops_are_the_checks_one_by_one() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let mut own = AddrFilter::default();
        let owned: Vec<u32> = (0..20).map(|_| rng.gen()).collect();
        for &a in &owned {
            own.insert(a);
        }
        for _ in 0..if cfg!(miri) { 4 } else { 200 } {
            let count = rng.gen_range(1..40);
            let t = table(&mut rng, count);
            let f = found(&mut rng, t.backs.len() as u32);
            let mut src = addresses(&mut rng);
            src[..8].copy_from_slice(&owned[..8]);
            for arriving in [
                None,
                Some(Arriving {
                    input: rng.gen_range(1..4),
                    own: &own,
                    full: false,
                }),
                Some(Arriving {
                    input: 2,
                    own: &own,
                    full: true,
                }),
            ] {
                let mut hops = [0; BATCH];
                let bits = portable::quick_hops(&t.backs, &f, &src, arriving, &mut hops);
                for i in 0..BATCH {
                    let one = f[i].and_then(DestAnswer::one_hop);
                    let want = one.filter(|&h| {
                        (h as usize) < t.backs.len()
                            && arriving.is_none_or(|a| {
                                !a.full && !a.own.may_hold(src[i]) && t.backs[h as usize] != a.input
                            })
                    });
                    if owned.contains(&src[i]) && arriving.is_some() {
                        assert_eq!(bits >> i & 1, 0, "this host's source is checked");
                    }
                    assert_eq!(bits >> i & 1 == 1, want.is_some(), "flow {i}: {:?}", f[i]);
                    if let Some(h) = want {
                        assert_eq!(hops[i], h);
                    }
                }
            }
        }
    }

    #[test]
    #[cfg_attr(
        all(miri, not(target_feature = "avx2")),
        ignore = "under Miri the AVX2 form runs only in a build that enables it"
    )]
    #[cfg_attr(fibre_cpu_lacks_avx2, ignore = "this CPU lacks AVX2")]
    fn avx2_forms_answer_as_the_portable_ones() {
        let cpu = Avx2::detect().expect("the build found AVX2 on this CPU, detection did not");
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let mut own = AddrFilter::default();
        for _ in 0..30 {
            own.insert(rng.gen());
        }
        let rounds = if cfg!(miri) { 4 } else { 500 };
        for _ in 0..rounds {
            let (dst, src) = (addresses(&mut rng), addresses(&mut rng));
            let n = rng.gen_range(0..=BATCH);
            for arriving in [false, true] {
                assert_eq!(
                    martians_v4(Some(cpu), &dst, &src, n, arriving),
                    martians_v4(None, &dst, &src, n, arriving)
                );
            }
            let count = rng.gen_range(1..3000);
            let t = table(&mut rng, count);
            let f = found(&mut rng, t.backs.len() as u32);
            for arriving in [
                None,
                Some(Arriving {
                    input: rng.gen_range(1..4),
                    own: &own,
                    full: false,
                }),
                Some(Arriving {
                    input: 1,
                    own: &own,
                    full: true,
                }),
            ] {
                let (mut a, mut b) = ([0; BATCH], [0; BATCH]);
                let fast = quick_hops(Some(cpu), &t, &f, &src, n, arriving, &mut a);
                let slow = quick_hops(None, &t, &f, &src, n, arriving, &mut b);
                assert_eq!(fast, slow);
                for i in 0..n {
                    if fast >> i & 1 == 1 {
                        assert_eq!(a[i], b[i]);
                    }
                }
            }
        }
    }
}
