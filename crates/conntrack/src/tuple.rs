//! A packet's connection tuple, read as the kernel's `nf_ct_get_tuple` reads it: the
//! addresses, the protocol, and the two 16-bit words that tell its flows apart (the
//! ports of TCP and UDP; for ICMP and ICMPv6 the identifier, and the type and code).
//! Both families share one shape: an IPv4 address is held as its IPv4-mapped IPv6 form,
//! and `v6` keeps the families apart.

/// TCP.
pub const TCP: u8 = 6;
/// UDP.
pub const UDP: u8 = 17;
/// ICMP.
pub const ICMP: u8 = 1;
/// ICMPv6.
pub const ICMPV6: u8 = 58;
/// Protocols the kernel tracks with trackers of their own that fibre does not have
/// (DCCP, GRE, SCTP, UDP-Lite): their packets are the kernel's to forward.
pub const UNTRACKED_HERE: [u8; 4] = [33, 47, 132, 136];

/// One direction of a connection, as `nf_conntrack_tuple` holds it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tuple {
    /// The source address (IPv4 as IPv4-mapped IPv6).
    pub src: [u8; 16],
    /// The destination address.
    pub dst: [u8; 16],
    /// The source port; ICMP's and ICMPv6's identifier.
    pub src_port: u16,
    /// The destination port; ICMP's and ICMPv6's type (high byte) and code (low byte).
    pub dst_port: u16,
    /// The transport protocol.
    pub protocol: u8,
    /// Whether IPv6.
    pub v6: bool,
}

impl std::hash::Hash for Tuple {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        for w in self.words() {
            h.write_u64(w);
        }
    }
}

/// A seeded hash of tuples, the connection table's: its five words folded in by three
/// multiplies (foldhash's folded multiply, written out: the table hashes a tuple for
/// every packet, and a hasher fed field by field takes several times as long).
#[derive(Clone, Copy, Debug)]
pub(crate) struct TupleHash {
    seeds: [u64; 4],
}

impl TupleHash {
    /// A hash of seeds drawn at random.
    pub fn new() -> TupleHash {
        use std::hash::BuildHasher;
        let random = foldhash::fast::RandomState::default();
        TupleHash {
            seeds: [1u64, 2, 3, 4].map(|k| random.hash_one(k)),
        }
    }

    /// `t`'s hash.
    #[inline]
    pub fn of(&self, t: &Tuple) -> u64 {
        let fold = |a: u64, b: u64| {
            let p = u128::from(a) * u128::from(b);
            (p as u64) ^ ((p >> 64) as u64)
        };
        let [a, b, c, d, e] = t.words();
        let [s0, s1, s2, s3] = self.seeds;
        let high = fold(a ^ s0, b ^ s1);
        let low = fold(c ^ s2, d ^ s3);
        fold(high ^ e, low ^ s0)
    }
}

impl Tuple {
    /// The tuple as five words: its addresses' halves, then its ports, protocol and
    /// family.
    #[inline]
    pub(crate) fn words(&self) -> [u64; 5] {
        let half = |a: &[u8; 16], k: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&a[k..k + 8]);
            u64::from_ne_bytes(w)
        };
        [
            half(&self.src, 0),
            half(&self.src, 8),
            half(&self.dst, 0),
            half(&self.dst, 8),
            u64::from(self.src_port)
                | u64::from(self.dst_port) << 16
                | u64::from(self.protocol) << 32
                | u64::from(self.v6) << 40,
        ]
    }

    /// The tuple of the other direction, as `nf_ct_invert_tuple` makes it: `None` for an
    /// ICMP or ICMPv6 type that has no answer (an error, an advertisement).
    pub fn inverted(&self) -> Option<Tuple> {
        let mut t = Tuple {
            src: self.dst,
            dst: self.src,
            src_port: self.dst_port,
            dst_port: self.src_port,
            ..*self
        };
        if matches!(self.protocol, ICMP | ICMPV6) {
            let [kind, code] = self.dst_port.to_be_bytes();
            let answer = answer_type(self.v6, kind)?;
            t.src_port = self.src_port;
            t.dst_port = u16::from_be_bytes([answer, code]);
        }
        Some(t)
    }

    /// The source address.
    pub fn source(&self) -> std::net::IpAddr {
        ip(self.src, self.v6)
    }

    /// The destination address.
    pub fn destination(&self) -> std::net::IpAddr {
        ip(self.dst, self.v6)
    }

    /// For ICMP and ICMPv6, the message's type.
    pub fn icmp_type(&self) -> u8 {
        self.dst_port.to_be_bytes()[0]
    }
}

fn ip(bytes: [u8; 16], v6: bool) -> std::net::IpAddr {
    let a = std::net::Ipv6Addr::from(bytes);
    match a.to_ipv4_mapped() {
        Some(v4) if !v6 => v4.into(),
        _ => a.into(),
    }
}

/// The type of the message that answers an ICMP (or ICMPv6) message of type `kind`, as
/// the kernel's `invmap` tables have it.
fn answer_type(v6: bool, kind: u8) -> Option<u8> {
    match (v6, kind) {
        (false, 8) => Some(0),
        (false, 0) => Some(8),
        (false, 13) => Some(14),
        (false, 14) => Some(13),
        (false, 15) => Some(16),
        (false, 16) => Some(15),
        (false, 17) => Some(18),
        (false, 18) => Some(17),
        (true, 128) => Some(129),
        (true, 129) => Some(128),
        (true, 139) => Some(140),
        (true, 140) => Some(139),
        _ => None,
    }
}

/// An IP packet's network layer, as conntrack reads it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Network {
    pub v6: bool,
    pub src: [u8; 16],
    pub dst: [u8; 16],
    /// The transport protocol (after IPv6's extension headers).
    pub protocol: u8,
    /// Where the transport header starts.
    pub transport: usize,
    /// The IP packet's length (the buffer may run on: a frame's padding).
    pub len: usize,
}

/// Why a packet has no network layer conntrack can read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unread {
    /// A fragment: the kernel reassembles it before tracking it.
    Fragment,
    /// Malformed, or no transport header (IPv6 "no next header"): invalid.
    Malformed,
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn address(b: &[u8], at: usize, v6: bool) -> Option<[u8; 16]> {
    if v6 {
        b.get(at..at + 16)?.try_into().ok()
    } else {
        let bytes: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
        Some(std::net::Ipv4Addr::from(bytes).to_ipv6_mapped().octets())
    }
}

/// Skips IPv6 extension headers from `at` with next header `next`, as
/// `ipv6_skip_exthdr` does: the transport protocol and where it starts, the fragment
/// offset field of a fragment header met (0 if none). `None`: truncated, or "no next
/// header".
fn skip_extensions(ip: &[u8], mut next: u8, mut at: usize) -> Option<(u8, usize, Option<u16>)> {
    let mut fragment = None;
    loop {
        let len = match next {
            0 | 43 | 60 => (usize::from(*ip.get(at + 1)?) + 1) * 8,
            51 => (usize::from(*ip.get(at + 1)?) + 2) * 4,
            44 => {
                let offset = be16(ip, at + 2)?;
                fragment = Some(offset);
                if offset & !7 != 0 {
                    return Some((*ip.get(at)?, at, fragment));
                }
                8
            }
            59 => return None,
            _ => return Some((next, at, fragment)),
        };
        next = *ip.get(at)?;
        at += len;
    }
}

/// The network layer of the IP packet `ip` (from its header on; what runs past its
/// length is ignored).
pub(crate) fn network(ip: &[u8]) -> Result<Network, Unread> {
    let version = ip.first().ok_or(Unread::Malformed)? >> 4;
    match version {
        4 => {
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            let len = usize::from(be16(ip, 2).ok_or(Unread::Malformed)?);
            if ihl < 20 || len < ihl || len > ip.len() {
                return Err(Unread::Malformed);
            }
            let fragment = be16(ip, 6).ok_or(Unread::Malformed)?;
            if fragment & 0x3fff != 0 {
                return Err(Unread::Fragment);
            }
            Ok(Network {
                v6: false,
                src: address(ip, 12, false).ok_or(Unread::Malformed)?,
                dst: address(ip, 16, false).ok_or(Unread::Malformed)?,
                protocol: ip[9],
                transport: ihl,
                len,
            })
        }
        6 => {
            let len = 40 + usize::from(be16(ip, 4).ok_or(Unread::Malformed)?);
            if len > ip.len() {
                return Err(Unread::Malformed);
            }
            let ip = &ip[..len];
            let (protocol, transport, fragment) =
                skip_extensions(ip, ip[6], 40).ok_or(Unread::Malformed)?;
            if fragment.is_some() {
                return Err(Unread::Fragment);
            }
            Ok(Network {
                v6: true,
                src: address(ip, 8, true).ok_or(Unread::Malformed)?,
                dst: address(ip, 24, true).ok_or(Unread::Malformed)?,
                protocol,
                transport,
                len,
            })
        }
        _ => Err(Unread::Malformed),
    }
}

/// The network layer of the packet an ICMP error quotes, from `at` in `packet` (which
/// ends where the error does), as `nf_ct_get_tuplepr` reads it: `None` if it cannot be
/// read, or is a later fragment.
pub(crate) fn quoted_network(packet: &[u8], at: usize, v6: bool) -> Option<Network> {
    let ip = packet.get(at..)?;
    if v6 {
        if ip.len() < 40 {
            return None;
        }
        let (protocol, transport, fragment) = skip_extensions(ip, ip[6], 40)?;
        if fragment.is_some_and(|f| f & !7 != 0) {
            return None;
        }
        Some(Network {
            v6,
            src: address(ip, 8, true)?,
            dst: address(ip, 24, true)?,
            protocol,
            transport,
            len: ip.len(),
        })
    } else {
        if ip.len() < 20 {
            return None;
        }
        if be16(ip, 6)? & 0x1fff != 0 {
            return None;
        }
        let transport = usize::from(ip[0] & 0x0f) * 4;
        if transport > ip.len() {
            return None;
        }
        Some(Network {
            v6,
            src: address(ip, 12, false)?,
            dst: address(ip, 16, false)?,
            protocol: ip[9],
            transport,
            len: ip.len(),
        })
    }
}

/// The tuple of a packet whose network layer is `n` (its transport header in `ip` from
/// `n.transport`, up to `n.len`), as `nf_ct_get_tuple` reads it: `None` if the words it
/// reads are not all there.
pub(crate) fn tuple(ip: &[u8], n: &Network) -> Option<Tuple> {
    let l4 = ip.get(n.transport..n.len)?;
    let mut t = Tuple {
        src: n.src,
        dst: n.dst,
        protocol: n.protocol,
        v6: n.v6,
        ..Tuple::default()
    };
    match n.protocol {
        ICMP | ICMPV6 => {
            let header = l4.get(..8)?;
            t.src_port = u16::from_be_bytes([header[4], header[5]]);
            t.dst_port = u16::from_be_bytes([header[0], header[1]]);
        }
        TCP | UDP | 33 | 47 | 132 | 136 => {
            let ports = l4.get(..4)?;
            t.src_port = u16::from_be_bytes([ports[0], ports[1]]);
            t.dst_port = u16::from_be_bytes([ports[2], ports[3]]);
        }
        _ => {}
    }
    Some(t)
}

/// The Internet checksum of a transport segment with its pseudo-header, as it reads
/// when the segment is whole and correct: 0 means good.
pub(crate) fn transport_checksum(ip: &[u8], n: &Network) -> u16 {
    let segment = &ip[n.transport..n.len];
    let mut sum: u64 = 0;
    let mut add = |bytes: &[u8]| {
        let mut chunks = bytes.chunks_exact(2);
        for c in &mut chunks {
            sum += u64::from(u16::from_be_bytes([c[0], c[1]]));
        }
        if let [last] = chunks.remainder() {
            sum += u64::from(*last) << 8;
        }
    };
    if n.v6 {
        add(&ip[8..40]);
        add(&(segment.len() as u32).to_be_bytes());
        add(&[0, 0, 0, n.protocol]);
    } else if n.protocol != ICMP {
        add(&ip[12..20]);
        add(&[0, n.protocol]);
        add(&(segment.len() as u16).to_be_bytes());
    }
    add(segment);
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn icmp_tuples_invert_by_the_kernels_map() {
        let (a, b) = ([1; 16], [2; 16]);
        let echo = Tuple {
            src: a,
            dst: b,
            src_port: 77,
            dst_port: u16::from_be_bytes([8, 0]),
            protocol: ICMP,
            v6: false,
        };
        let reply = echo.inverted().unwrap();
        assert_eq!((reply.src, reply.dst, reply.src_port), (b, a, 77));
        assert_eq!(reply.icmp_type(), 0);
        assert_eq!(reply.inverted(), Some(echo));
        let unreachable = Tuple {
            dst_port: u16::from_be_bytes([3, 1]),
            ..echo
        };
        assert_eq!(unreachable.inverted(), None);
        let v6 = Tuple {
            v6: true,
            protocol: ICMPV6,
            dst_port: u16::from_be_bytes([128, 0]),
            ..echo
        };
        assert_eq!(v6.inverted().unwrap().icmp_type(), 129);
    }

    #[test]
    fn fragments_and_missing_transports_are_told_apart() {
        let mut v4 = [0u8; 28];
        v4[0] = 0x45;
        v4[3] = 28;
        v4[9] = UDP;
        assert!(network(&v4).is_ok());
        v4[6] = 0x20; // more fragments
        assert_eq!(network(&v4).unwrap_err(), Unread::Fragment);
        let mut v6 = [0u8; 48];
        v6[0] = 0x60;
        v6[5] = 8;
        v6[6] = 44;
        v6[40] = UDP;
        assert_eq!(network(&v6).unwrap_err(), Unread::Fragment);
        v6[6] = 59;
        assert_eq!(network(&v6).unwrap_err(), Unread::Malformed);
        v6[6] = 0; // hop-by-hop, then UDP
        let n = network(&v6).unwrap();
        assert_eq!((n.protocol, n.transport), (UDP, 48));
    }
}
