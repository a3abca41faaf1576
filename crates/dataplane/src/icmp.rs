//! The ICMP and ICMPv6 errors a router answers the packets it cannot forward with, made
//! in the packet's own buffer, and the limits on how many it sends.
//!
//! Which packets get an answer, and what it holds, follow the kernel's `__icmp_send` and
//! `icmp6_send`:
//!
//! - no error answers an error (an ICMP error, an ICMPv6 error), nor an IPv4 fragment
//!   other than the first;
//! - the error goes back to the packet's source from the address the route back to it
//!   gives (the kernel's default, `icmp_errors_use_inbound_ifaddr=0`);
//! - IPv4: TOS the packet's with precedence "internetwork control", the namespace's
//!   default TTL ([`Hops`]), DF clear, and as much of the packet as fits in 576 bytes
//!   (RFC 1812, 4.3.2.3);
//! - IPv6: traffic class 0, the hop limit of the link it leaves by ([`Hops`]), and as
//!   much of the packet as fits in 1280 bytes (RFC 4443, 2.4).
//!
//! The limits are the kernel's (its settings read from `/proc/sys` where a namespace has
//! them, [`Limits::read`]), checked in its order (`__icmp_send`, `icmp6_send`):
//!
//! 1. an IPv4 packet without a route first pays its source's bucket the kernel's
//!    `ip_error` toll (a second, in bursts of five);
//! 2. the overall limit (1000 errors a second in bursts of 50, `icmp_msgs_per_sec`,
//!    `icmp_msgs_burst`) must have credit left, shared by every worker as the kernel
//!    shares it within a namespace;
//! 3. there must be a route back;
//! 4. the destination's limit must allow it: one a second for IPv4 (`icmp_ratelimit`),
//!    one every 100 ms for IPv6 (`net.ipv6.icmp.ratelimit`), in bursts of 6
//!    (`inet_peer_xrlim_allow`);
//! 5. only then is the overall credit spent, so that one destination's refused errors do
//!    not use up everyone's.
//!
//! Which errors are limited, the rate masks say (`icmp_ratemask`,
//! `net.ipv6.icmp.ratemask`): by default every one but those path MTU discovery needs,
//! fragmentation needed (never limited) and packet too big. The kernel keeps a bucket for every
//! destination in a tree; here each worker keeps a fixed table of buckets indexed by the
//! destination's hash, a destination taking the slot of another that hashed alike, so
//! that the table costs nothing to keep and cannot grow. A destination that loses its
//! slot starts afresh, and one whose packets reach two workers has a bucket in each: the
//! overall limit still holds.

use crate::input::{ETHERNET_LEN, ETHERTYPE_IPV4, ETHERTYPE_IPV6};
use fibre_headers::icmp::HEADER_LEN as ICMP_HEADER_LEN;
use fibre_headers::transport::{TCP, UDP};
use fibre_headers::{checksum, ipv4, ipv6, EthernetFrame, IcmpMessage, Ipv4Packet};
use fibre_headers::{Ipv6Extension, Ipv6Fragment, Ipv6Packet, UdpDatagram};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Bytes an IPv4 error may have in all (RFC 1812, 4.3.2.3).
pub const IPV4_ERROR_MAX: usize = 576;
/// Bytes an IPv6 error may have in all: the minimum MTU (RFC 4443, 2.4).
pub const IPV6_ERROR_MAX: usize = 1280;
/// The TTL and hop limit the router's own packets leave with, as the kernel's settings
/// give them: IPv4's `net.ipv4.ip_default_ttl` (`ip4_dst_hoplimit`), IPv6's the
/// `hop_limit` of the link the packet leaves by (`ip6_dst_hoplimit`: the link's
/// `net.ipv6.conf.LINK.hop_limit`; a link made since they were read has `default`'s, as
/// the kernel gives a new link). A route's own `hoplimit` metric, which the kernel puts
/// first, is not followed. Read when the router starts, as the error limits are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hops {
    /// The TTL of IPv4 packets.
    pub ipv4: u8,
    /// The hop limit of IPv6 packets leaving by a link not in `ipv6_links`.
    pub ipv6_default: u8,
    /// The hop limit of IPv6 packets leaving by each link, by name.
    pub ipv6_links: Vec<(String, u8)>,
}

impl Default for Hops {
    /// The kernel's defaults: 64 both.
    fn default() -> Hops {
        Hops {
            ipv4: 64,
            ipv6_default: 64,
            ipv6_links: Vec::new(),
        }
    }
}

impl Hops {
    /// The settings of the calling thread's network namespace, from `/proc/sys/net`; the
    /// defaults for any that cannot be read.
    pub fn read() -> Hops {
        Hops::read_from(std::path::Path::new("/proc/sys/net"))
    }

    /// [`Hops::read`] from the tree `net` (laid out as `/proc/sys/net`).
    pub fn read_from(net: &std::path::Path) -> Hops {
        // (The kernel takes 1 to 255 for either.)
        let value = |path: std::path::PathBuf| -> Option<u8> {
            std::fs::read_to_string(path)
                .ok()?
                .trim()
                .parse()
                .ok()
                .filter(|&v| v != 0)
        };
        let d = Hops::default();
        let conf = net.join("ipv6/conf");
        let mut ipv6_links: Vec<(String, u8)> = std::fs::read_dir(&conf)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let hops = value(e.path().join("hop_limit"))?;
                (name != "all" && name != "default").then_some((name, hops))
            })
            .collect();
        ipv6_links.sort();
        Hops {
            ipv4: value(net.join("ipv4/ip_default_ttl")).unwrap_or(d.ipv4),
            ipv6_default: value(conf.join("default/hop_limit")).unwrap_or(d.ipv6_default),
            ipv6_links,
        }
    }

    /// The hop limit of IPv6 packets leaving by the link named `link`.
    pub fn ipv6(&self, link: &str) -> u8 {
        self.ipv6_links
            .iter()
            .find(|(name, _)| name == link)
            .map_or(self.ipv6_default, |&(_, hops)| hops)
    }
}

/// An error a packet is answered with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Error {
    /// The TTL or hop limit ran out (ICMP type 11, ICMPv6 type 3; code 0).
    TimeExceeded,
    /// No route, or a rule said `unreachable` (ICMP net unreachable; ICMPv6 no route).
    NetUnreachable,
    /// An `unreachable` route (ICMP host unreachable; ICMPv6 no route).
    HostUnreachable,
    /// A `prohibit` route or rule (ICMP administratively filtered, code 13; ICMPv6
    /// administratively prohibited, code 1).
    Prohibited,
    /// IPv6: a link-local source leaving its link (ICMPv6 beyond scope of source
    /// address, code 2).
    BeyondScope,
    /// Over the MTU of the way on: IPv4 with DF, fragmentation needed (type 3, code 4);
    /// IPv6, packet too big (type 2). The MTU goes in the error.
    TooBig,
    /// A firewall rule's `reject`: destination unreachable (ICMP type 3, ICMPv6 type
    /// 1) with this code of the packet's family.
    Rejected(u8),
}

impl Error {
    /// Every error, in the order of their counters.
    pub const ALL: [Error; 6] = [
        Error::TimeExceeded,
        Error::NetUnreachable,
        Error::HostUnreachable,
        Error::Prohibited,
        Error::BeyondScope,
        Error::TooBig,
    ];

    /// The error's name in counters.
    pub fn name(self) -> &'static str {
        match self {
            Error::TimeExceeded => "time-exceeded",
            Error::NetUnreachable => "net-unreachable",
            Error::HostUnreachable => "host-unreachable",
            Error::Prohibited => "prohibited",
            Error::BeyondScope => "beyond-scope",
            Error::TooBig => "too-big",
            Error::Rejected(_) => "rejected",
        }
    }

    /// ICMP type and code.
    pub fn icmp(self) -> (u8, u8) {
        match self {
            Error::TimeExceeded => (11, 0),
            Error::NetUnreachable => (3, 0),
            Error::HostUnreachable | Error::BeyondScope => (3, 1),
            Error::Prohibited => (3, 13),
            Error::TooBig => (3, 4),
            Error::Rejected(code) => (3, code),
        }
    }

    /// ICMPv6 type and code.
    pub fn icmpv6(self) -> (u8, u8) {
        match self {
            Error::TimeExceeded => (3, 0),
            Error::NetUnreachable | Error::HostUnreachable => (1, 0),
            Error::Prohibited => (1, 1),
            Error::BeyondScope => (1, 2),
            Error::TooBig => (2, 0),
            Error::Rejected(code) => (1, code),
        }
    }
}

/// Whether the kernel answers the IPv4 packet `ip` (its header first) with an error: not
/// a fragment other than the first, not an ICMP error (nor ICMP too short to say).
pub fn answers_v4(ip: &[u8]) -> bool {
    let Ok(h) = Ipv4Packet::new_checked(ip) else {
        return false;
    };
    if h.fragment_offset() != 0 {
        return false;
    }
    if h.protocol() != ICMP {
        return true;
    }
    // ICMP: only informational messages are answered.
    match ip.get(h.header_len()) {
        Some(&t) => !matches!(t, 3 | 4 | 5 | 11 | 12) && t <= 18,
        None => false,
    }
}

/// Whether the kernel answers the IPv6 packet `ip` (its header first) with an error
/// (`is_ineligible`): not an ICMPv6 error, found past the extension headers (nor ICMPv6
/// too short to say, unless it is a later fragment, which cannot say).
pub fn answers_v6(ip: &[u8]) -> bool {
    let Ok(h) = Ipv6Packet::new_checked(ip) else {
        return false;
    };
    let (mut next, mut at) = (h.next_header(), ipv6::HEADER_LEN);
    // Hop-by-hop, routing, destination options, fragment: each says what follows.
    for _ in 0..8 {
        match next {
            ipv6::next::HOP_BY_HOP | ipv6::next::ROUTING | ipv6::next::DESTINATION_OPTIONS => {
                let Some(Ok(e)) = ip.get(at..).map(Ipv6Extension::new_checked) else {
                    return true;
                };
                let len = e.len(next);
                next = e.next_header();
                at += len;
            }
            ipv6::next::FRAGMENT => {
                let Some(Ok(f)) = ip.get(at..).map(Ipv6Fragment::new_checked) else {
                    return true;
                };
                if f.offset() != 0 {
                    // A later fragment: what it carries cannot be told.
                    return true;
                }
                next = f.next_header();
                at += 8;
            }
            _ => break,
        }
    }
    if next != ipv6::next::ICMPV6 {
        return true;
    }
    // ICMPv6: informational messages (type 128 and over) are answered.
    ip.get(at).is_some_and(|&t| t & 0x80 != 0)
}

/// Whether the kernel's `reject` answers the IP packet `ip` (its header first; IPv6 if
/// `v6`), as `nf_send_unreach` and `nf_send_unreach6` decide before `icmp_send`: not a
/// fragment other than the first, and, unless its sender left its checksum to finish or
/// its link vouched for it (`partial`: the kernel's `skb_csum_unnecessary`), its
/// checksum holding: over the
/// transport's pseudo-header for TCP and UDP (a UDP checksum of 0 is not checked) and
/// every protocol of IPv6; over the payload alone for IPv4's others; not checked for
/// those with another check or a partial one (AH, ESP, SCTP, UDP-Lite, DCCP, GRE).
pub fn reject_answers(ip: &[u8], v6: bool, partial: bool) -> bool {
    // IPv6 asks nothing more of a packet whose checksum is left to finish
    // (`reject6_csum_ok`); IPv4 refuses a later fragment first (`nf_send_unreach`).
    if v6 && partial && ip.len() >= ipv6::HEADER_LEN {
        return true;
    }
    let Some((protocol, at, end)) = transport(ip, v6) else {
        return false;
    };
    if partial {
        return true;
    }
    let l4 = &ip[at..end];
    match protocol {
        // UDP with no checksum, and the protocols whose checksum is another's.
        UDP if UdpDatagram::new_checked(l4).is_ok_and(|u| u.checksum() == 0) => return true,
        47 | 51 | 50 | 132 | 136 | 33 => return true,
        _ => {}
    }
    let mut sum = checksum::sum(l4);
    if v6 || matches!(protocol, TCP | UDP) {
        let len = l4.len() as u32;
        let pseudo = if v6 {
            let Ok(h) = Ipv6Packet::new_checked(ip) else {
                return false;
            };
            let (src, dst) = (h.source().octets(), h.destination().octets());
            checksum::pseudo_header_sum(&src, &dst, protocol, len)
        } else {
            let Ok(h) = Ipv4Packet::new_checked(ip) else {
                return false;
            };
            let (src, dst) = (h.source().octets(), h.destination().octets());
            checksum::pseudo_header_sum(&src, &dst, protocol, len)
        };
        sum = checksum::add(sum, pseudo);
    }
    sum == 0xffff
}

/// An IP packet's transport (IPv6 if `v6`): its protocol, where it starts and where the
/// packet ends; `None` for a later fragment, or headers that do not fit.
pub(crate) fn transport(ip: &[u8], v6: bool) -> Option<(u8, usize, usize)> {
    if v6 {
        transport_v6(ip)
    } else {
        transport_v4(ip)
    }
}

/// An IPv4 packet's transport: its protocol, where it starts and where the packet ends;
/// `None` for a later fragment or a header that does not fit.
fn transport_v4(ip: &[u8]) -> Option<(u8, usize, usize)> {
    let h = Ipv4Packet::new_checked(ip).ok()?;
    if h.fragment_offset() != 0 {
        return None;
    }
    let at = h.header_len();
    let end = usize::from(h.total_len()).min(ip.len());
    (at >= ipv4::HEADER_LEN && at <= end).then_some((h.protocol(), at, end))
}

/// An IPv6 packet's transport past its extension headers, as `ipv6_skip_exthdr` finds
/// it: its protocol, where it starts and where the packet ends; `None` for a later
/// fragment, or where the headers do not fit or leave nothing.
fn transport_v6(ip: &[u8]) -> Option<(u8, usize, usize)> {
    let h = Ipv6Packet::new_checked(ip).ok()?;
    let end = h.end();
    let (mut next, mut at) = (h.next_header(), ipv6::HEADER_LEN);
    loop {
        match next {
            // The authentication header counts its length in 4-byte words.
            ipv6::next::HOP_BY_HOP
            | ipv6::next::ROUTING
            | ipv6::next::DESTINATION_OPTIONS
            | ipv6::next::AUTHENTICATION => {
                let e = Ipv6Extension::new_checked(ip.get(at..)?).ok()?;
                let len = e.len(next);
                next = e.next_header();
                at += len;
            }
            ipv6::next::FRAGMENT => {
                let f = Ipv6Fragment::new_checked(ip.get(at..)?).ok()?;
                if f.offset() != 0 {
                    return None;
                }
                next = f.next_header();
                at += 8;
            }
            // "No next header": nothing to answer about.
            ipv6::next::NONE => return None,
            _ => break,
        }
    }
    (at < end).then_some((next, at, end))
}

/// Makes, in place of the IPv4 packet in `buffer` (a whole packet buffer, holding the
/// received frame: its Ethernet header, then `ip_len` bytes of packet), the ICMP `error`
/// answering it, from `src`, with IP identification `id` and TTL `ttl`; `mtu` goes in a
/// fragmentation needed error. The Ethernet addresses are left for the caller. Returns
/// the error's frame length; `None` if `buffer` does not hold the packet.
pub fn answer_v4(
    buffer: &mut [u8],
    ip_len: usize,
    error: Error,
    mtu: u32,
    src: Ipv4Addr,
    id: u16,
    ttl: u8,
) -> Option<usize> {
    const HEADERS: usize = ipv4::HEADER_LEN + ICMP_HEADER_LEN;
    const AT: usize = ETHERNET_LEN + HEADERS;
    if buffer.len() < AT {
        return None;
    }
    let orig = buffer.get(ETHERNET_LEN..ETHERNET_LEN + ip_len.max(ipv4::HEADER_LEN))?;
    let orig = Ipv4Packet::new_checked(orig).ok()?;
    let (dst, tos) = (orig.source(), (orig.tos() & 0x1e) | 0xc0);
    let quoted = ip_len
        .min(IPV4_ERROR_MAX - HEADERS)
        .min(buffer.len().saturating_sub(AT));
    buffer.copy_within(ETHERNET_LEN..ETHERNET_LEN + quoted, AT);
    let total = HEADERS + quoted;
    let mut frame = EthernetFrame::new_checked(&mut buffer[..ETHERNET_LEN + total]).ok()?;
    frame.set_ethertype(ETHERTYPE_IPV4);
    let (ip, message) = frame.payload_mut().split_at_mut(ipv4::HEADER_LEN);
    let mut ip = Ipv4Packet::new_checked(ip).ok()?;
    ip.set_version_and_header_len(ipv4::HEADER_LEN);
    ip.set_tos(tos);
    ip.set_total_len(total as u16);
    ip.set_ident(id);
    ip.set_flags_and_offset(0);
    ip.set_ttl(ttl);
    ip.set_protocol(ICMP);
    ip.set_source(src);
    ip.set_destination(dst);
    ip.fill_checksum();
    let (kind, code) = error.icmp();
    let mut icmp = IcmpMessage::new_checked(message).ok()?;
    icmp.set_kind_and_code(kind, code);
    icmp.set_checksum(0);
    icmp.set_rest(if error == Error::TooBig {
        mtu.min(u16::MAX as u32)
    } else {
        0
    });
    let sum = checksum::checksum(icmp.as_bytes());
    icmp.set_checksum(sum);
    Some(ETHERNET_LEN + total)
}

/// Makes, in place of the IPv6 packet in `buffer` (as [`answer_v4`]; `ip_len` counts the
/// fixed header), the ICMPv6 `error` answering it, from `src`, with hop limit
/// `hop_limit`; `mtu` goes in a packet too big error. Returns the error's frame length;
/// `None` if `buffer` does not hold the packet.
pub fn answer_v6(
    buffer: &mut [u8],
    ip_len: usize,
    error: Error,
    mtu: u32,
    src: Ipv6Addr,
    hop_limit: u8,
) -> Option<usize> {
    const HEADERS: usize = ipv6::HEADER_LEN + ICMP_HEADER_LEN;
    const AT: usize = ETHERNET_LEN + HEADERS;
    if buffer.len() < AT {
        return None;
    }
    let orig = buffer.get(ETHERNET_LEN..ETHERNET_LEN + ip_len.max(ipv6::HEADER_LEN))?;
    let dst = Ipv6Packet::new_checked(orig).ok()?.source();
    let quoted = ip_len
        .min(IPV6_ERROR_MAX - HEADERS)
        .min(buffer.len().saturating_sub(AT));
    buffer.copy_within(ETHERNET_LEN..ETHERNET_LEN + quoted, AT);
    let payload = ICMP_HEADER_LEN + quoted;
    let end = ETHERNET_LEN + ipv6::HEADER_LEN + payload;
    let mut frame = EthernetFrame::new_checked(&mut buffer[..end]).ok()?;
    frame.set_ethertype(ETHERTYPE_IPV6);
    let (ip, message) = frame.payload_mut().split_at_mut(ipv6::HEADER_LEN);
    let mut ip = Ipv6Packet::new_checked(ip).ok()?;
    ip.set_version_class_flow(0, 0);
    ip.set_payload_len(payload as u16);
    ip.set_next_header(ipv6::next::ICMPV6);
    ip.set_hop_limit(hop_limit);
    ip.set_source(src);
    ip.set_destination(dst);
    let (kind, code) = error.icmpv6();
    let mut icmp = IcmpMessage::new_checked(message).ok()?;
    icmp.set_kind_and_code(kind, code);
    icmp.set_checksum(0);
    icmp.set_rest(if error == Error::TooBig { mtu } else { 0 });
    let pseudo = checksum::pseudo_header_sum(
        &src.octets(),
        &dst.octets(),
        ipv6::next::ICMPV6,
        payload as u32,
    );
    let sum = !checksum::add(pseudo, checksum::sum(icmp.as_bytes()));
    icmp.set_checksum(sum);
    Some(end)
}

/// ICMP's protocol number.
const ICMP: u8 = 1;

/// A token bucket: `tokens` nanoseconds of credit, earned one a nanosecond since `last`.
#[derive(Clone, Copy, Debug, Default)]
struct Bucket {
    tokens: u64,
    last: u64,
}

impl Bucket {
    /// Takes `cost` if there is that much credit at `now`, credit capped at `cap`.
    fn take(&mut self, now: u64, cost: u64, cap: u64) -> bool {
        self.tokens = self
            .tokens
            .saturating_add(now.saturating_sub(self.last))
            .min(cap);
        self.last = now.max(self.last);
        if self.tokens >= cost {
            self.tokens -= cost;
            true
        } else {
            false
        }
    }
}

/// The limits on errors, as the kernel's settings give them (`net.ipv4.icmp_msgs_per_sec`,
/// `icmp_msgs_burst`, `icmp_ratelimit`, `net.ipv6.icmp.ratelimit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Errors a second overall, both families.
    pub per_second: u64,
    /// Errors overall in a burst.
    pub burst: u64,
    /// Nanoseconds between IPv4 errors to one destination (0: no limit).
    pub interval_v4: u64,
    /// Nanoseconds between IPv6 errors to one destination (0: no limit).
    pub interval_v6: u64,
    /// The ICMP types limited, a bit each (`net.ipv4.icmp_ratemask`).
    pub ratemask_v4: u32,
    /// The ICMPv6 types limited, a bit each (`net.ipv6.icmp.ratemask`).
    pub ratemask_v6: [u64; 4],
}

impl Default for Limits {
    /// The kernel's defaults: 1000 a second in bursts of 50 overall; to one destination
    /// one a second (IPv4) and one every 100 ms (IPv6, since the kernel dropped the
    /// interval's scaling by the route's prefix length).
    fn default() -> Limits {
        Limits {
            per_second: 1000,
            burst: 50,
            interval_v4: 1_000_000_000,
            interval_v6: 100_000_000,
            // Destination unreachable, source quench, time exceeded, parameter problem.
            ratemask_v4: 0x1818,
            // Every error but packet too big (0-1, 3-127).
            ratemask_v6: [!0b100, !0, 0, 0],
        }
    }
}

/// The types an ICMPv6 rate mask as `/proc/sys` shows it names (`0-1,3-127`: numbers
/// and ranges, comma-separated; empty: none); `None` if it is not one.
pub fn parse_ratemask_v6(text: &str) -> Option<[u64; 4]> {
    let mut mask = [0u64; 4];
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (from, to) = match part.split_once('-') {
            Some((a, b)) => (a.trim().parse::<u8>().ok()?, b.trim().parse::<u8>().ok()?),
            None => {
                let t = part.trim().parse::<u8>().ok()?;
                (t, t)
            }
        };
        if from > to {
            return None;
        }
        for t in from..=to {
            mask[usize::from(t / 64)] |= 1 << (t % 64);
        }
    }
    Some(mask)
}

impl Limits {
    /// The settings of the calling thread's network namespace, from `/proc/sys`; the
    /// defaults for any that cannot be read.
    pub fn read() -> Limits {
        let value = |path: &str| -> Option<u64> {
            std::fs::read_to_string(format!("/proc/sys/net/{path}"))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        let d = Limits::default();
        let ms = 1_000_000;
        Limits {
            per_second: value("ipv4/icmp_msgs_per_sec").unwrap_or(d.per_second),
            burst: value("ipv4/icmp_msgs_burst").unwrap_or(d.burst),
            interval_v4: value("ipv4/icmp_ratelimit").map_or(d.interval_v4, |v| v * ms),
            interval_v6: value("ipv6/icmp/ratelimit").map_or(d.interval_v6, |v| v * ms),
            ratemask_v4: value("ipv4/icmp_ratemask").map_or(d.ratemask_v4, |v| v as u32),
            ratemask_v6: std::fs::read_to_string("/proc/sys/net/ipv6/icmp/ratemask")
                .ok()
                .and_then(|t| parse_ratemask_v6(&t))
                .unwrap_or(d.ratemask_v6),
        }
    }
}

/// The limit on errors overall, one for every worker of a router as the kernel keeps one
/// for a namespace (`icmp_global_allow`, `icmp_global_consume`): credit, spent one an
/// error and allowed to go below zero; while any is left an error may go; once none is,
/// credit is earned back at the rate for the time since it last was, in steps of at
/// least 20 ms and at most a second's worth, up to the burst.
#[derive(Debug)]
pub struct Overall {
    per_second: u64,
    burst: i64,
    credit: AtomicI64,
    /// When credit was last earned, in nanoseconds of [`Overall::now`].
    stamp: AtomicU64,
    epoch: Instant,
}

/// The least time credit is earned for at once (the kernel's `HZ / 50`).
const EARN_STEP: u64 = 20_000_000;

impl Overall {
    /// A limit of `per_second` errors a second in bursts of `burst`, its credit full.
    pub fn new(per_second: u64, burst: u64) -> Overall {
        let burst = burst.min(i64::MAX as u64) as i64;
        Overall {
            per_second,
            burst,
            credit: AtomicI64::new(burst),
            stamp: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// Nanoseconds since the limit was made: the clock its users share.
    pub fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Whether an error may go at `now` (nanoseconds on a clock that does not go back);
    /// nothing is spent until [`Overall::spend`], once the destination's limit allowed it
    /// too (so that no one destination's errors starve the others).
    pub fn allows(&self, now: u64) -> bool {
        if self.credit.load(Ordering::Relaxed) > 0 {
            return true;
        }
        let stamp = self.stamp.load(Ordering::Relaxed);
        let waited = now.saturating_sub(stamp);
        let since = waited.min(1_000_000_000);
        if since < EARN_STEP {
            return false;
        }
        let earned = u128::from(self.per_second) * u128::from(since) / 1_000_000_000;
        if earned == 0 {
            return false;
        }
        // The stamp moves on by the time the credit earned stands for, so that the
        // remainder is not lost (the kernel counts in ticks that divide evenly), or to
        // now after a second or more.
        let paid = (earned * 1_000_000_000 / u128::from(self.per_second.max(1))) as u64;
        let next = if waited > 1_000_000_000 {
            now
        } else {
            stamp + paid
        };
        let earned = earned.min(i64::MAX as u128) as i64;
        // One worker earns it; another that raced it finds the credit earned.
        if self
            .stamp
            .compare_exchange(stamp, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            let _ = self
                .credit
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                    Some(c.saturating_add(earned).min(self.burst))
                });
        }
        true
    }

    /// Spends an error's credit. The kernel spends 0, 1 or 2 at random (so that the
    /// limit cannot be read off from outside); this spends their mean.
    pub fn spend(&self) {
        self.credit.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The kernel's `ip_error` toll: what an IPv4 packet without a route (an unreachable or
/// prohibit route, or none) costs its source's bucket before the error is even asked for
/// (`net.ipv4.route.error_cost`, a second, and `error_burst`, five; their defaults).
const ROUTE_ERROR_COST: u64 = 1_000_000_000;
const ROUTE_ERROR_BURST: u64 = 5 * ROUTE_ERROR_COST;

/// The limits on errors sent: overall (shared), and to each destination (this worker's).
#[derive(Clone, Debug)]
pub struct RateLimit {
    overall: Arc<Overall>,
    /// Nanoseconds between errors to one destination, IPv4 and IPv6.
    interval: [u64; 2],
    /// Errors to one destination in a burst.
    peer_burst: u64,
    peers: Vec<(Option<u128>, Bucket)>,
    /// The types limited, IPv4 and IPv6.
    ratemask_v4: u32,
    ratemask_v6: [u64; 4],
}

impl Default for RateLimit {
    fn default() -> RateLimit {
        RateLimit::new(&Limits::default())
    }
}

impl RateLimit {
    /// The limits `limits`, with an overall limit of its own.
    pub fn new(limits: &Limits) -> RateLimit {
        RateLimit::sharing(
            limits,
            Arc::new(Overall::new(limits.per_second, limits.burst)),
        )
    }

    /// The limits `limits` to each destination, sharing the overall limit `overall`
    /// with other workers. Each destination's limit starts full.
    pub fn sharing(limits: &Limits, overall: Arc<Overall>) -> RateLimit {
        RateLimit {
            overall,
            interval: [limits.interval_v4, limits.interval_v6],
            peer_burst: 6,
            peers: vec![(None, Bucket::default()); 4096],
            ratemask_v4: limits.ratemask_v4,
            ratemask_v6: limits.ratemask_v6,
        }
    }

    /// Whether the limits apply to `error` (IPv6 if `v6`), as the rate masks say; never to
    /// IPv4's fragmentation needed, which path MTU discovery must not be starved of
    /// (`icmpv4_mask_allow`, `icmpv6_mask_allow`).
    pub fn applies(&self, error: Error, v6: bool) -> bool {
        if v6 {
            let (t, _) = error.icmpv6();
            self.ratemask_v6[usize::from(t / 64)] >> (t % 64) & 1 == 1
        } else {
            let (t, code) = error.icmp();
            !(t == 3 && code == 4) && t < 32 && self.ratemask_v4 >> t & 1 == 1
        }
    }

    /// The overall limit.
    pub fn overall(&self) -> &Overall {
        &self.overall
    }

    /// The bucket of destination `dst` at `now`, made full if the slot held another.
    fn peer(&mut self, dst: IpAddr, now: u64) -> &mut Bucket {
        let key = u128::from(match dst {
            IpAddr::V4(a) => a.to_ipv6_mapped(),
            IpAddr::V6(a) => a,
        });
        let slot = (key.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835) >> 116) as usize
            % self.peers.len();
        let (k, bucket) = &mut self.peers[slot];
        if *k != Some(key) {
            *k = Some(key);
            *bucket = Bucket {
                tokens: u64::MAX,
                last: now,
            };
        }
        bucket
    }

    /// Whether an error may go to `dst` at `now` under the destination's limit; if so,
    /// it is counted.
    pub fn to(&mut self, dst: IpAddr, now: u64) -> bool {
        let interval = self.interval[usize::from(dst.is_ipv6())];
        let cap = interval.saturating_mul(self.peer_burst);
        self.peer(dst, now).take(now, interval, cap)
    }

    /// Whether an IPv4 packet without a route, from `src`, may be answered at all at
    /// `now`: the kernel's `ip_error` charges the source's bucket (the same one
    /// [`RateLimit::to`] charges) before it asks for the error, so that such errors cost
    /// a destination twice.
    pub fn route_error(&mut self, src: IpAddr, now: u64) -> bool {
        self.peer(src, now)
            .take(now, ROUTE_ERROR_COST, ROUTE_ERROR_BURST)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::{Icmpv4Type, Icmpv6Type, PacketBuilder, SlicedPacket, TransportSlice};
    use rand::{Rng, SeedableRng};

    fn udp4(payload: usize) -> Vec<u8> {
        let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4([198, 51, 100, 7], [203, 0, 113, 9], 5)
            .udp(4000, 53);
        let mut out = Vec::new();
        b.write(&mut out, &vec![0x5a; payload]).unwrap();
        out
    }

    /// An IPv4 error holds what the kernel's does: the addresses swapped for the router's,
    /// the type, code and MTU, checksums that hold, and the packet quoted up to 576 bytes.
    #[test]
    fn ipv4_errors_quote_the_packet_within_576_bytes() {
        for (payload, error, mtu) in [
            (8, Error::TimeExceeded, 0),
            (1400, Error::TooBig, 1000),
            (520, Error::HostUnreachable, 0),
            (0, Error::Prohibited, 0),
        ] {
            let frame = udp4(payload);
            let ip_len = frame.len() - ETHERNET_LEN;
            let mut buffer = frame.clone();
            buffer.resize(2048, 0);
            let len =
                answer_v4(&mut buffer, ip_len, error, mtu, [10, 0, 0, 1].into(), 7, 71).unwrap();
            assert_eq!(len - ETHERNET_LEN, (ip_len + 28).min(576), "{error:?}");
            let p = SlicedPacket::from_ethernet(&buffer[..len]).unwrap();
            let Some(etherparse::NetSlice::Ipv4(ip)) = p.net else {
                panic!("{error:?}: not IPv4")
            };
            let h = ip.header().to_header();
            assert_eq!(h.source, [10, 0, 0, 1]);
            assert_eq!(h.destination, [198, 51, 100, 7]);
            assert_eq!(
                (h.time_to_live, h.dont_fragment, h.dscp.value()),
                (71, false, 48)
            );
            assert_eq!(h.header_checksum, h.calc_header_checksum());
            let Some(TransportSlice::Icmpv4(icmp)) = p.transport else {
                panic!("{error:?}: not ICMP")
            };
            let whole = &buffer[ETHERNET_LEN + 20..len];
            assert!(checksum::holds(whole), "{error:?}: the ICMP checksum");
            let (t, c) = error.icmp();
            assert_eq!((icmp.type_u8(), icmp.code_u8()), (t, c), "{error:?}");
            if error == Error::TooBig {
                let Icmpv4Type::DestinationUnreachable(u) = icmp.icmp_type() else {
                    panic!()
                };
                assert_eq!(
                    u,
                    etherparse::icmpv4::DestUnreachableHeader::FragmentationNeeded {
                        next_hop_mtu: 1000
                    }
                );
            }
            let quoted = icmp.payload();
            assert_eq!(quoted, &frame[ETHERNET_LEN..ETHERNET_LEN + quoted.len()]);
        }
    }

    /// An IPv6 error holds what the kernel's does, within 1280 bytes, its checksum over
    /// the pseudo-header holding.
    #[test]
    fn ipv6_errors_quote_the_packet_within_1280_bytes() {
        let src: Ipv6Addr = "2001:db8:9::1".parse().unwrap();
        let router: Ipv6Addr = "fd01::1".parse().unwrap();
        for (payload, error, mtu) in [
            (8, Error::TimeExceeded, 0),
            (1400, Error::TooBig, 1280),
            (100, Error::Prohibited, 0),
            (1300, Error::BeyondScope, 0),
        ] {
            let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
                .ipv6(
                    src.octets(),
                    [0x20, 1, 0xd, 0xb8, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5],
                    9,
                )
                .udp(4000, 53);
            let mut frame = Vec::new();
            b.write(&mut frame, &vec![0x5a; payload]).unwrap();
            let ip_len = frame.len() - ETHERNET_LEN;
            let mut buffer = frame.clone();
            buffer.resize(2048, 0);
            let len = answer_v6(&mut buffer, ip_len, error, mtu, router, 66).unwrap();
            assert_eq!(len - ETHERNET_LEN, (ip_len + 48).min(1280), "{error:?}");
            let p = SlicedPacket::from_ethernet(&buffer[..len]).unwrap();
            let Some(etherparse::NetSlice::Ipv6(ip)) = p.net else {
                panic!("{error:?}: not IPv6")
            };
            let h = ip.header().to_header();
            assert_eq!((h.source, h.destination), (router.octets(), src.octets()));
            assert_eq!(h.hop_limit, 66);
            let Some(TransportSlice::Icmpv6(icmp)) = p.transport else {
                panic!("{error:?}: not ICMPv6")
            };
            let want = icmp
                .header()
                .icmp_type
                .calc_checksum(router.octets(), src.octets(), icmp.payload())
                .unwrap();
            assert_eq!(icmp.header().checksum, want, "{error:?}");
            if error == Error::TooBig {
                assert_eq!(icmp.icmp_type(), Icmpv6Type::PacketTooBig { mtu: 1280 });
            }
            let (t, c) = error.icmpv6();
            assert_eq!((icmp.type_u8(), icmp.code_u8()), (t, c), "{error:?}");
            let quoted = icmp.payload();
            assert_eq!(quoted, &frame[ETHERNET_LEN..ETHERNET_LEN + quoted.len()]);
        }
    }

    /// Errors do not answer errors, nor later fragments; queries and other protocols are
    /// answered.
    #[test]
    fn errors_answer_what_the_kernel_answers() {
        let ip = |proto: u8, offset: u16, first: &[u8]| {
            let mut h = vec![0x45, 0, 0, 40, 0, 0, 0, 0, 64, proto, 0, 0];
            h[6..8].copy_from_slice(&offset.to_be_bytes());
            h.extend([198, 51, 100, 7, 203, 0, 113, 9]);
            h.extend(first);
            h
        };
        // A buffer too short for an error's headers is refused, not written past.
        let mut short = udp4(8);
        short.truncate(40);
        assert_eq!(
            answer_v4(
                &mut short,
                20,
                Error::TimeExceeded,
                0,
                [10, 0, 0, 1].into(),
                1,
                64
            ),
            None
        );
        let mut short = vec![0x60; 60];
        assert_eq!(
            answer_v6(
                &mut short,
                40,
                Error::TimeExceeded,
                0,
                Ipv6Addr::LOCALHOST,
                64
            ),
            None
        );
        assert!(answers_v4(&ip(17, 0, &[0; 8])));
        assert!(answers_v4(&ip(17, 0x2000, &[0; 8])), "a first fragment");
        assert!(!answers_v4(&ip(17, 0x0010, &[0; 8])), "a later fragment");
        assert!(answers_v4(&ip(1, 0, &[8, 0])), "an echo request");
        assert!(!answers_v4(&ip(1, 0, &[3, 1])), "an unreachable");
        assert!(!answers_v4(&ip(1, 0, &[11, 0])), "a time exceeded");
        assert!(!answers_v4(&ip(1, 0, &[])), "ICMP too short to say");
        let ip6 = |next: u8, rest: &[u8]| {
            let mut h = vec![0x60, 0, 0, 0, 0, rest.len() as u8, next, 64];
            h.extend([0x20, 1, 0xd, 0xb8].iter().chain(&[0; 12]));
            h.extend([0x20, 1, 0xd, 0xb8].iter().chain(&[1; 12]));
            h.extend(rest);
            h
        };
        assert!(answers_v6(&ip6(17, &[0; 8])));
        assert!(answers_v6(&ip6(58, &[128, 0])), "an echo request");
        assert!(!answers_v6(&ip6(58, &[1, 0])), "an unreachable");
        assert!(!answers_v6(&ip6(58, &[])), "ICMPv6 too short to say");
        assert!(
            !answers_v6(&ip6(60, &[58, 0, 0, 0, 0, 0, 0, 0, 2, 0])),
            "a packet too big behind destination options"
        );
        assert!(
            answers_v6(&ip6(44, &[58, 0, 0, 8, 0, 0, 0, 1])),
            "a later fragment cannot say"
        );
    }

    /// An IPv4 packet without a route pays its source's bucket before its error's own
    /// charge, as the kernel's `ip_error` does: two such errors in a burst, then one
    /// for a packet that comes two seconds after the last, none for one a second after;
    /// IPv6's interval is its own (100 ms); packet too big is never limited.
    #[test]
    fn route_errors_cost_their_source_twice() {
        let second = 1_000_000_000;
        let mut limit = RateLimit::default();
        let a: IpAddr = "198.51.100.7".parse().unwrap();
        let unreachable =
            |limit: &mut RateLimit, now| limit.route_error(a, now) && limit.to(a, now);
        let sent = (0..10).filter(|_| unreachable(&mut limit, 5)).count();
        assert_eq!(sent, 2, "a burst of two");
        assert!(!unreachable(&mut limit, 5 + second), "a second later");
        assert!(
            !unreachable(&mut limit, 5 + 2 * second),
            "a second after that"
        );
        assert!(
            unreachable(&mut limit, 5 + 4 * second),
            "two seconds after that"
        );
        // The time exceeded errors to the same source pay once.
        let b: IpAddr = "198.51.100.8".parse().unwrap();
        assert_eq!((0..10).filter(|_| limit.to(b, 5)).count(), 6);

        let c: IpAddr = "2001:db8::7".parse().unwrap();
        assert_eq!((0..10).filter(|_| limit.to(c, 5)).count(), 6);
        assert!(!limit.to(c, 5 + second / 20), "50 ms later");
        assert!(limit.to(c, 5 + second / 10), "100 ms later");
    }

    /// The rate masks say which errors are limited: by default every one but
    /// fragmentation needed and packet too big; a mask of nothing limits none; the
    /// IPv6 mask reads as `/proc/sys` shows it.
    #[test]
    fn the_rate_masks_choose_what_is_limited() {
        let limit = RateLimit::default();
        for e in Error::ALL {
            assert_eq!(limit.applies(e, false), e != Error::TooBig, "IPv4 {e:?}");
            assert_eq!(limit.applies(e, true), e != Error::TooBig, "IPv6 {e:?}");
        }
        assert_eq!(
            parse_ratemask_v6("0-1,3-127"),
            Some(Limits::default().ratemask_v6)
        );
        assert_eq!(parse_ratemask_v6(""), Some([0; 4]));
        assert_eq!(parse_ratemask_v6("2, 255"), Some([0b100, 0, 0, 1 << 63]));
        assert_eq!(parse_ratemask_v6("5-3"), None);
        assert_eq!(parse_ratemask_v6("0-256"), None);
        let none = RateLimit::new(&Limits {
            ratemask_v4: 0,
            ratemask_v6: [0; 4],
            ..Limits::default()
        });
        let all = RateLimit::new(&Limits {
            ratemask_v4: !0,
            ratemask_v6: [!0; 4],
            ..Limits::default()
        });
        for e in Error::ALL {
            assert!(!none.applies(e, false) && !none.applies(e, true), "{e:?}");
            assert_eq!(
                all.applies(e, false),
                e != Error::TooBig,
                "{e:?}: IPv4's is never"
            );
            assert!(all.applies(e, true), "{e:?}: IPv6's follows the mask");
        }
    }

    /// The overall limit is one for every worker: what one spends, the others lack;
    /// asking spends nothing.
    #[test]
    fn workers_share_the_overall_limit() {
        let limits = Limits::default();
        let overall = Arc::new(Overall::new(limits.per_second, limits.burst));
        let one = RateLimit::sharing(&limits, overall.clone());
        let two = RateLimit::sharing(&limits, overall);
        for _ in 0..1000 {
            assert!(one.overall().allows(1));
        }
        for _ in 0..50 {
            assert!(two.overall().allows(1));
            two.overall().spend();
        }
        assert!(!one.overall().allows(1), "the burst spent by the other");
        assert!(
            !one.overall().allows(1 + 10_000_000),
            "10 ms later: not yet earned"
        );
        assert!(
            one.overall().allows(1 + 20_000_000),
            "20 ms later: 20 earned"
        );
        for _ in 0..20 {
            assert!(two.overall().allows(1 + 20_000_000));
            two.overall().spend();
        }
        assert!(!one.overall().allows(1 + 20_000_000));
    }

    /// The limits hold over a random stream of errors: to one destination never more
    /// than its burst plus one an interval, overall never more than the burst plus the
    /// rate; and a destination that has waited gets its burst again.
    #[test]
    fn the_limits_hold_as_a_reference_counts() {
        let second = 1_000_000_000;
        let mut limit = RateLimit::default();
        let a: IpAddr = "198.51.100.7".parse().unwrap();
        let sent = (0..20).filter(|_| limit.to(a, 5)).count();
        assert_eq!(sent, 6, "a burst of 6");
        assert!(!limit.to(a, second / 2), "half a second later");
        assert!(limit.to(a, 5 + second), "a second later");
        assert!(
            limit.to("2001:db8::7".parse().unwrap(), 5),
            "another destination"
        );
        let sent = (0..20).filter(|_| limit.to(a, 100 * second)).count();
        assert_eq!(sent, 6, "waited long: a burst again");

        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let overall = Overall::new(1000, 50);
        let mut now = 0u64;
        let mut times = Vec::new();
        for _ in 0..200_000 {
            now += rng.gen_range(0..200_000);
            if overall.allows(now) {
                overall.spend();
                times.push(now);
            }
        }
        // All the credit spent, but for what the last step had not yet earned (20 ms).
        let earned = 50 + (now / 1_000_000) as usize;
        assert!(
            times.len() <= earned && times.len() + 21 >= earned,
            "{} errors sent, {earned} earned",
            times.len()
        );
        for (i, t) in times.iter().enumerate() {
            // In any second, at most 1000 and the burst.
            let within = times[i..].iter().take_while(|u| **u < t + second).count();
            assert!(within <= 1050, "{within} errors in a second from {t}");
        }
    }

    /// The hop counts as `/proc/sys/net` holds them: the default TTL, each link's IPv6
    /// hop limit, `default`'s for a link without its own.
    #[test]
    fn hop_counts_are_read_as_the_namespace_has_them() {
        let net = std::env::temp_dir().join(format!("fibre-hops-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&net);
        let write = |path: &str, value: &str| {
            let path = net.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, value).unwrap();
        };
        // Nothing to read: the kernel's defaults.
        assert_eq!(Hops::read_from(&net), Hops::default());
        write("ipv4/ip_default_ttl", "77\n");
        write("ipv6/conf/all/hop_limit", "12\n");
        write("ipv6/conf/default/hop_limit", "66\n");
        write("ipv6/conf/b0/hop_limit", "55\n");
        write("ipv6/conf/a0/hop_limit", "not a number\n");
        let hops = Hops::read_from(&net);
        assert_eq!(hops.ipv4, 77);
        assert_eq!(hops.ipv6("b0"), 55);
        // A link whose own cannot be read, and one made since: `default`'s, never
        // `all`'s.
        assert_eq!(hops.ipv6("a0"), 66);
        assert_eq!(hops.ipv6("c0"), 66);
        std::fs::remove_dir_all(&net).unwrap();
    }
}
