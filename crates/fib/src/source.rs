//! Source address selection: the `src` a route query reports when the route names none.
//!
//! IPv4 follows the kernel's `inet_select_addr`: a primary address of the output link whose
//! scope the route allows, preferring one on the gateway's subnet; failing that, any link's
//! first primary address of a suitable scope that is not link-scoped, `lo` first. IPv6
//! follows RFC 6724 as Linux applies it (`ipv6_dev_get_saddr`): for link-local and
//! multicast destinations only the output link's addresses; otherwise every link's, ranked
//! by scope, the output link, policy label, and the longest common prefix.

use crate::link::{Address, Link, LinkIndex};
use crate::names::*;
use crate::net::Family;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv6Addr};

/// The kernel's `inet_select_addr(dev, gateway, scope)`.
pub fn select_v4(
    addrs: &[Address],
    links: &BTreeMap<LinkIndex, Link>,
    dev: LinkIndex,
    gateway: Option<IpAddr>,
    scope: u8,
) -> Option<IpAddr> {
    let v4 = |a: &&Address| a.family() == Family::V4 && !a.secondary;
    let mut first = None;
    for a in addrs.iter().filter(v4).filter(|a| a.link == dev) {
        if a.scope.min(SCOPE_HOST) > scope {
            continue;
        }
        match gateway {
            Some(g) if Family::of(g) == Family::V4 && !a.subnet().contains(g) => {
                first.get_or_insert(a.local);
            }
            _ => return Some(a.local),
        }
    }
    if first.is_some() {
        return first;
    }
    // Any link's address, loopback first (it is the first link).
    for l in links.values() {
        if let Some(a) = addrs
            .iter()
            .filter(v4)
            .find(|a| a.link == l.index && a.scope != SCOPE_LINK && a.scope <= scope)
        {
            return Some(a.local);
        }
    }
    None
}

/// An IPv6 address's scope as RFC 4291 numbers it (smaller is narrower).
fn v6_scope(a: Ipv6Addr) -> u8 {
    let s = a.segments();
    if a.is_unspecified() {
        // No scope (the kernel's `__IPV6_ADDR_SCOPE_INVALID`): narrower than any, so the
        // output link's addresses of the narrowest scope are preferred.
        0x0
    } else if a.is_loopback() {
        0x1
    } else if s[0] & 0xff00 == 0xff00 {
        (s[0] & 0xf) as u8
    } else if s[0] & 0xffc0 == 0xfe80 {
        0x2
    } else if s[0] & 0xffc0 == 0xfec0 {
        0x5
    } else {
        0xe
    }
}

/// RFC 6724's default policy table label.
fn label(a: Ipv6Addr) -> u8 {
    let bits = u128::from(a);
    let table: [(u128, u8, u8); 9] = [
        (1, 128, 0),                 // ::1/128
        (0xffff_0000_0000, 96, 4),   // ::ffff:0:0/96
        (0x2002u128 << 112, 16, 2),  // 2002::/16
        (0x2001u128 << 112, 32, 5),  // 2001::/32
        (0xfc00u128 << 112, 7, 13),  // fc00::/7
        (0, 96, 3),                  // ::/96
        (0xfec0u128 << 112, 10, 11), // fec0::/10
        (0x3ffeu128 << 112, 16, 12), // 3ffe::/16
        (0, 0, 1),                   // ::/0
    ];
    let mut best = (0u8, 1u8);
    for (p, len, l) in table {
        let mask = if len == 0 {
            0
        } else {
            u128::MAX << (128 - len as u32)
        };
        if bits & mask == p && len >= best.0 {
            best = (len, l);
        }
    }
    best.1
}

fn common_prefix(a: Ipv6Addr, b: Ipv6Addr) -> u32 {
    (u128::from(a) ^ u128::from(b)).leading_zeros()
}

/// The kernel's `ipv6_dev_get_saddr` for a destination leaving by `dev`.
pub fn select_v6(
    addrs: &[Address],
    links: &BTreeMap<LinkIndex, Link>,
    dev: LinkIndex,
    dst: IpAddr,
) -> Option<IpAddr> {
    let IpAddr::V6(d) = dst else { return None };
    let dscope = v6_scope(d);
    let only_dev = dscope <= 0x2 || d.segments()[0] & 0xff00 == 0xff00;
    let candidates = addrs.iter().filter(|a| {
        a.family() == Family::V6 && (a.link == dev || !only_dev) && links.contains_key(&a.link)
    });
    let mut best: Option<(&Address, [i64; 5])> = None;
    for a in candidates {
        let IpAddr::V6(s) = a.local else { continue };
        let sscope = v6_scope(s);
        // Rule 1: same address.
        let same = (s == d) as i64;
        // Rule 2: appropriate scope.
        let scope_rank = if sscope >= dscope {
            256 - sscope as i64
        } else {
            -(256 - sscope as i64) - 512
        };
        // Rule 5: the output link.
        let oif = (a.link == dev) as i64;
        // Rule 6: matching label.
        let lab = (label(s) == label(d)) as i64;
        // Rule 8: longest matching prefix (capped at the address's prefix length).
        let lcp = common_prefix(s, d).min(a.len as u32) as i64;
        let score = [same, scope_rank, oif, lab, lcp];
        if best.as_ref().is_none_or(|(_, b)| score > *b) {
            best = Some((a, score));
        }
    }
    best.map(|(a, _)| a.local)
}

/// Whether an ICMPv6 error about a packet to `addr`, arrived on `iif`, comes from `addr`
/// (`icmp6_send`), this host's addresses being `addrs`: `addr` is one of them, or the
/// subnet-router anycast address of one of their prefixes (an address or prefix of link
/// or host scope counts on `iif` only).
pub(crate) fn answers_from_v6(addrs: &[Address], iif: LinkIndex, addr: Ipv6Addr) -> bool {
    let scoped = addr.is_unicast_link_local() || addr.is_loopback();
    let addr = IpAddr::V6(addr);
    addrs.iter().any(|a| {
        let here = a.link == iif;
        let unicast = a.local == addr && (here || !matches!(a.scope, SCOPE_LINK | SCOPE_HOST));
        let anycast = a.local.is_ipv6()
            && a.len < 127
            && a.scope != SCOPE_HOST
            && a.subnet().addr() == addr
            && (here || !scoped);
        unicast || anycast
    })
}
