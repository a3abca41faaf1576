//! From prefixes to ranges: what the answer is over a prefix's span of addresses.
//!
//! Keys are widened to 128 bits, most significant bit first (an IPv4 address fills the
//! top 32), so both families share one arithmetic. A sweep over the prefixes inside a
//! span, in address order, shorter first, gives the span's ranges: the value changes
//! where a prefix starts and where one ends and the one around it resumes.

use crate::key::Key;
use crate::prefix::Prefix;

/// A key widened to 128 bits, most significant bit first.
#[inline(always)]
pub(crate) fn wide<K: Key>(key: K) -> u128 {
    key.to_u128() << (128 - u32::from(K::BITS))
}

/// The key whose widened form is `w` (bits below the key's width ignored).
pub(crate) fn narrow<K: Key>(w: u128) -> K {
    K::from_u128(w >> (128 - u32::from(K::BITS)))
}

/// The top 64 bits of a widened key: what the first-stage tree searches.
#[inline(always)]
pub(crate) fn top64(w: u128) -> u64 {
    (w >> 64) as u64
}

/// The low 64 bits of a widened key: what a second-stage tree searches.
#[inline(always)]
pub(crate) fn low64(w: u128) -> u64 {
    w as u64
}

/// The first and last widened keys a prefix covers.
pub(crate) fn span<K: Key>(p: &Prefix<K>) -> (u128, u128) {
    let start = wide(p.addr());
    let host = u128::MAX.checked_shr(u32::from(p.len())).unwrap_or(0);
    (start, start | host)
}

/// The ranges over `[start, end]`: `(first widened key, stored value)`, neighbours with
/// equal values merged. `covering` is the value around the span; `inside` yields the
/// prefixes within it, sorted by address, shorter first, with their stored values.
pub(crate) fn sweep<K: Key>(
    start: u128,
    end: u128,
    covering: u32,
    inside: impl Iterator<Item = (Prefix<K>, u32)>,
) -> Vec<(u128, u32)> {
    let mut out: Vec<(u128, u32)> = vec![(start, covering)];
    let push = |out: &mut Vec<(u128, u32)>, at: u128, value: u32| {
        if let Some(last) = out.last_mut() {
            if last.0 == at {
                last.1 = value;
                if out.len() >= 2 && out[out.len() - 2].1 == value {
                    out.pop();
                }
                return;
            }
            if last.1 == value {
                return;
            }
        }
        out.push((at, value));
    };
    // The prefixes open at the current point: (last key, value); the span's at the bottom.
    let mut open: Vec<(u128, u32)> = vec![(end, covering)];
    for (p, value) in inside {
        let (s, e) = span(&p);
        while open.last().is_some_and(|o| o.0 < s) {
            let (closed, _) = open.pop().expect("checked");
            let resumed = open.last().expect("the span's own entry stays").1;
            push(&mut out, closed + 1, resumed);
        }
        push(&mut out, s, value);
        open.push((e, value));
    }
    while open.len() > 1 {
        let (closed, _) = open.pop().expect("checked");
        let resumed = open.last().expect("the span's own entry stays").1;
        if closed < end {
            push(&mut out, closed + 1, resumed);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ranges::layout::UNROUTED;

    fn p(s: &str) -> Prefix<u32> {
        s.parse().unwrap()
    }

    #[test]
    fn a_sweep_nests_and_resumes() {
        let inside = [
            (p("10.0.0.0/8"), 1),
            (p("10.1.0.0/16"), 2),
            (p("10.1.2.0/24"), 3),
            (p("10.2.0.0/16"), 4),
        ];
        let (s, e) = span(&p("10.0.0.0/8"));
        let got = sweep(s, e, UNROUTED, inside.into_iter());
        let at = |a: &str| wide(a.parse::<std::net::Ipv4Addr>().map(u32::from).unwrap());
        assert_eq!(
            got,
            vec![
                (at("10.0.0.0"), 1),
                (at("10.1.0.0"), 2),
                (at("10.1.2.0"), 3),
                (at("10.1.3.0"), 2),
                (at("10.2.0.0"), 4),
                (at("10.3.0.0"), 1),
            ]
        );
        let whole = sweep(0, u128::MAX, 9, [(p("0.0.0.0/0"), 9)].into_iter());
        assert_eq!(whole, vec![(0, 9)]);
        let host = sweep(
            0,
            u128::MAX,
            UNROUTED,
            [(p("255.255.255.255/32"), 5)].into_iter(),
        );
        assert_eq!(host, vec![(0, UNROUTED), (at("255.255.255.255"), 5)]);
    }
}
