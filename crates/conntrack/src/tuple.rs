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
#[derive(Clone, Copy, Debug, Default)]
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

// Compared as the words the hash reads, not field by field: a tuple just built is
// read back at once, and loads the size of the stores that built it are forwarded
// from them, where wider ones (a whole address) would wait for them to drain.
impl PartialEq for Tuple {
    #[inline]
    fn eq(&self, other: &Tuple) -> bool {
        same_words(&self.words(), &other.words())
    }
}

/// Whether two tuples' words are the same: compared all at once, without a branch or a
/// call to `memcmp` for each.
#[inline]
pub(crate) fn same_words(a: &[u64; 5], b: &[u64; 5]) -> bool {
    (a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3]) | (a[4] ^ b[4]) == 0
}

impl Eq for Tuple {}

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

/// foldhash's folded multiply: the full product of `a` and `b`, its halves XORed.
#[inline(always)]
fn folded_multiply(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
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
        self.of_words(&t.words())
    }

    /// The hash of the tuple whose words are `words`.
    #[inline]
    pub fn of_words(&self, words: &[u64; 5]) -> u64 {
        let fold = folded_multiply;
        let [a, b, c, d, e] = *words;
        let [s0, s1, s2, s3] = self.seeds;
        let high = fold(a ^ s0, b ^ s1);
        let low = fold(c ^ s2, d ^ s3);
        fold(high ^ e, low ^ s0)
    }
}

/// A bit of the last word that no tuple's words set ([`Tuple::words`]): set in what
/// [`TupleHash::symmetric`] hashes, so that the words a symmetric hash hashes are never
/// a tuple's (which a directional hash, [`TupleHash::of`], hashes): the two meet only
/// as any two hashes may, one pair in 2^64.
const SYMMETRIC: u64 = 1 << 47;

impl TupleHash {
    /// The hash of the tuple whose words are `words`, the same as its inverse's
    /// ([`Tuple::inverted`]): the tuple's two ends (address and port; for ICMP and
    /// ICMPv6 the addresses, in the order of the lower of the message's type and its
    /// answer's, the identifier being the same both ways) put in an order of their own,
    /// then hashed as [`TupleHash::of_words`] hashes. The registry holds a connection no
    /// NAT changed under it, once for both its tuples. Exact: two tuples hash alike by
    /// construction only if one is the other or its inverse.
    pub fn symmetric(&self, words: &[u64; 5]) -> u64 {
        let [a, b, c, d, e] = *words;
        let (src, dst) = (
            u128::from(a) << 64 | u128::from(b),
            u128::from(c) << 64 | u128::from(d),
        );
        let (src_port, dst_port) = (e as u16, (e >> 16) as u16);
        let protocol = (e >> 32) as u8;
        let (swap, ports) = if matches!(protocol, ICMP | ICMPV6) {
            // The identifier is the same both ways; the type is the query's or its
            // answer's: the lower of the two stands for both, its ends in the order
            // of the message that carries it (so that a query and an answer between
            // the same ends the same way hash apart).
            let [kind, code] = dst_port.to_be_bytes();
            let v6 = (e >> 40) & 1 != 0;
            let (swap, kind) = match answer_type(v6, kind) {
                Some(answer) if answer < kind => (true, answer),
                _ => (false, kind),
            };
            let ports = u32::from(src_port) | u32::from(u16::from_be_bytes([kind, code])) << 16;
            (swap, ports)
        } else {
            let swap = src > dst || (src == dst && src_port > dst_port);
            let (first, second) = if swap {
                (dst_port, src_port)
            } else {
                (src_port, dst_port)
            };
            (swap, u32::from(first) | u32::from(second) << 16)
        };
        let (x, y) = if swap { (dst, src) } else { (src, dst) };
        self.of_words(&[
            (x >> 64) as u64,
            x as u64,
            (y >> 64) as u64,
            y as u64,
            u64::from(ports) | (e >> 32) << 32 | SYMMETRIC,
        ])
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

    /// The tuple whose words are `w` ([`Tuple::words`]'s inverse).
    pub(crate) fn from_words(w: &[u64; 5]) -> Tuple {
        let address = |high: u64, low: u64| {
            let mut a = [0u8; 16];
            a[..8].copy_from_slice(&high.to_ne_bytes());
            a[8..].copy_from_slice(&low.to_ne_bytes());
            a
        };
        Tuple {
            src: address(w[0], w[1]),
            dst: address(w[2], w[3]),
            src_port: w[4] as u16,
            dst_port: (w[4] >> 16) as u16,
            protocol: (w[4] >> 32) as u8,
            v6: (w[4] >> 40) & 1 != 0,
        }
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
    /// The addresses, as the tuple's bytes read big-endian (IPv4 mapped): held as
    /// numbers, so that the tuple's words are stored whole from registers.
    pub src: u128,
    pub dst: u128,
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

fn address(b: &[u8], at: usize, v6: bool) -> Option<u128> {
    if v6 {
        Some(u128::from_be_bytes(b.get(at..at + 16)?.try_into().ok()?))
    } else {
        let bytes: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
        Some(0xffff_u128 << 32 | u128::from(u32::from_be_bytes(bytes)))
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
#[inline(always)]
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
    key(ip, n).map(|k| Tuple::from_words(&k))
}

/// The words ([`Tuple::words`]) of the tuple of a packet whose network layer is `n`,
/// made from the packet in registers, as [`tuple`] reads it: the tracker's key for a
/// lookup. (A tuple built in memory field by field and read back at once as words
/// waits for its narrow stores to drain: the loads are wider than the stores.)
#[inline]
pub(crate) fn key(ip: &[u8], n: &Network) -> Option<[u64; 5]> {
    let l4 = ip.get(n.transport..n.len)?;
    let (src_port, dst_port) = match n.protocol {
        ICMP | ICMPV6 => {
            let header = l4.get(..8)?;
            (
                u16::from_be_bytes([header[4], header[5]]),
                u16::from_be_bytes([header[0], header[1]]),
            )
        }
        TCP | UDP | 33 | 47 | 132 | 136 => {
            let ports = l4.get(..4)?;
            (
                u16::from_be_bytes([ports[0], ports[1]]),
                u16::from_be_bytes([ports[2], ports[3]]),
            )
        }
        _ => (0, 0),
    };
    // An address's bytes big-endian, each half read as `words` reads it.
    let halves = |a: u128| (((a >> 64) as u64).to_be(), (a as u64).to_be());
    let (s0, s1) = halves(n.src);
    let (d0, d1) = halves(n.dst);
    Some([
        s0,
        s1,
        d0,
        d1,
        u64::from(src_port)
            | u64::from(dst_port) << 16
            | u64::from(n.protocol) << 32
            | u64::from(n.v6) << 40,
    ])
}

/// `a + b` with the carry out added back in (ones' complement addition on 64 bits;
/// no second carry: a sum that carried is at most 2^64 - 2).
#[inline(always)]
fn add_carry(a: u64, b: u64) -> u64 {
    let (sum, carried) = a.overflowing_add(b);
    sum + u64::from(carried)
}

/// The ones' complement sum of `bytes` read as the machine reads them: 64-bit words,
/// then a 32-bit and a 16-bit one, then an odd last byte as the first of a 16-bit word.
/// Nothing needs swapping on the way: each is its 16-bit words as they lie, and a sum of
/// words read with their bytes swapped is the sum swapped (RFC 1071).
#[inline(always)]
fn sum_as_read(bytes: &[u8]) -> u64 {
    let mut eights = bytes.chunks_exact(8);
    let mut sum = 0;
    for e in &mut eights {
        let word = u64::from_ne_bytes([e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7]]);
        sum = add_carry(sum, word);
    }
    let mut rest = eights.remainder();
    if let [a, b, c, d, more @ ..] = rest {
        sum = add_carry(sum, u64::from(u32::from_ne_bytes([*a, *b, *c, *d])));
        rest = more;
    }
    if let [a, b, more @ ..] = rest {
        sum = add_carry(sum, u64::from(u16::from_ne_bytes([*a, *b])));
        rest = more;
    }
    if let [a] = rest {
        sum = add_carry(sum, u64::from(u16::from_ne_bytes([*a, 0])));
    }
    sum
}

/// `sum` folded to 16 bits, each carry out added back in: from 64 bits to 33, to 32,
/// to 17, to 16, without a loop.
#[inline(always)]
fn fold(sum: u64) -> u16 {
    let sum = (sum & 0xffff_ffff) + (sum >> 32);
    let sum = (sum & 0xffff_ffff) + (sum >> 32);
    let sum = (sum & 0xffff) + (sum >> 16);
    ((sum & 0xffff) + (sum >> 16)) as u16
}

/// The Internet checksum of a transport segment with its pseudo-header, as it reads
/// when the segment is whole and correct: 0 means good.
pub(crate) fn transport_checksum(ip: &[u8], n: &Network) -> u16 {
    let segment = &ip[n.transport..n.len];
    // The pseudo-header's addresses (at their fixed sizes) and the segment, as they
    // lie.
    let addresses = match (n.v6, n.protocol) {
        (true, _) => <&[u8; 32]>::try_from(&ip[8..40]).map_or(0, |a| {
            let word = |i: usize| u64::from_ne_bytes(std::array::from_fn(|k| a[i + k]));
            add_carry(add_carry(word(0), word(8)), add_carry(word(16), word(24)))
        }),
        (false, ICMP) => 0,
        (false, _) => <&[u8; 8]>::try_from(&ip[12..20]).map_or(0, |a| {
            u64::from(u32::from_ne_bytes([a[0], a[1], a[2], a[3]]))
                + u64::from(u32::from_ne_bytes([a[4], a[5], a[6], a[7]]))
        }),
    };
    let mut sum = add_carry(addresses, sum_as_read(segment));
    // The pseudo-header's length and protocol, as numbers (their words' sum) laid out
    // in the network's order, read as the rest was.
    if n.v6 || n.protocol != ICMP {
        let numbers = segment.len() as u32 + u32::from(n.protocol);
        sum = add_carry(sum, u64::from(u32::from_ne_bytes(numbers.to_be_bytes())));
    }
    // Folded, then in the network's order.
    !u16::from_be_bytes(fold(sum).to_ne_bytes())
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

    /// A tuple drawn at random, with its fields.
    fn random_tuple(rng: &mut impl rand::Rng) -> Tuple {
        Tuple {
            src: rng.gen(),
            dst: rng.gen(),
            src_port: rng.gen(),
            dst_port: rng.gen(),
            protocol: rng.gen(),
            v6: rng.gen(),
        }
    }

    /// `t` with one field changed at random, or its ports swapped.
    fn one_field_changed(t: &Tuple, rng: &mut impl rand::Rng) -> Tuple {
        let mut u = *t;
        match rng.gen_range(0..7) {
            0 => u.src[rng.gen_range(0..16)] ^= 1 << rng.gen_range(0..8),
            1 => u.dst[rng.gen_range(0..16)] ^= 1 << rng.gen_range(0..8),
            2 => u.src_port ^= 1 << rng.gen_range(0..16),
            3 => u.dst_port ^= 1 << rng.gen_range(0..16),
            4 => u.protocol ^= 1 << rng.gen_range(0..8),
            5 => u.v6 = !u.v6,
            _ => (u.src_port, u.dst_port) = (u.dst_port, u.src_port),
        }
        u
    }

    fn fields(t: &Tuple) -> ([u8; 16], [u8; 16], u16, u16, u8, bool) {
        (t.src, t.dst, t.src_port, t.dst_port, t.protocol, t.v6)
    }

    /// The symmetric hash is a tuple's and its inverse's alike, and no other's:
    /// over random tuples (ICMP queries among them, ends that share an address), a
    /// tuple changed anywhere but to its inverse (its ends' ports swapped without their
    /// addresses, a query's type for an answer's between other ends) hashes apart; and
    /// no symmetric hash is a directional one's.
    #[test]
    fn the_symmetric_hash_is_a_tuples_and_its_inverses_only() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let hash = TupleHash::new();
        let sym = |t: &Tuple| hash.symmetric(&t.words());
        let mut inverses = 0;
        for _ in 0..20_000 {
            let mut t = random_tuple(&mut rng);
            match rng.gen_range(0..6) {
                0 => {
                    t.protocol = if t.v6 { ICMPV6 } else { ICMP };
                    let kinds: &[u8] = if t.v6 {
                        &[128, 129, 139, 140, 1]
                    } else {
                        &[8, 0, 13, 14, 15, 16, 17, 18, 3]
                    };
                    t.dst_port =
                        u16::from_be_bytes([kinds[rng.gen_range(0..kinds.len())], rng.gen()]);
                }
                1 => t.dst = t.src,
                2 => t.dst_port = t.src_port,
                _ => t.protocol = [TCP, UDP, 47][rng.gen_range(0..3)],
            }
            if let Some(r) = t.inverted() {
                assert_eq!(sym(&t), sym(&r), "{t:?}");
                inverses += 1;
            }
            let u = one_field_changed(&t, &mut rng);
            if u != t && Some(u) != t.inverted() {
                assert_ne!(sym(&t), sym(&u), "{t:?} and {u:?}");
            }
            assert_ne!(sym(&t), hash.of(&t));
        }
        assert!(inverses > 15_000);
        // The two that an order of ends alone would take for one.
        let echo = Tuple {
            src: [1; 16],
            dst: [2; 16],
            src_port: 7,
            dst_port: u16::from_be_bytes([8, 0]),
            protocol: ICMP,
            v6: false,
        };
        let answer_same_way = Tuple {
            dst_port: u16::from_be_bytes([0, 0]),
            ..echo
        };
        assert_eq!(sym(&echo), sym(&echo.inverted().unwrap()));
        assert_ne!(sym(&echo), sym(&answer_same_way));
        let udp = Tuple {
            protocol: UDP,
            dst_port: 53,
            ..echo
        };
        let ports_crossed = Tuple {
            src_port: 53,
            dst_port: 7,
            ..udp
        };
        assert_ne!(sym(&udp), sym(&ports_crossed));
    }

    #[test]
    fn tuples_are_their_words_and_equal_as_their_fields_are() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..10_000 {
            let t = random_tuple(&mut rng);
            assert_eq!(fields(&Tuple::from_words(&t.words())), fields(&t));
            // One field changed (or the ports swapped, maybe alike): equal exactly when
            // the fields are.
            let u = one_field_changed(&t, &mut rng);
            assert_eq!(t == u, fields(&t) == fields(&u));
        }
    }

    #[test]
    fn a_packets_key_is_its_tuples_words() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(8);
        for _ in 0..2_000 {
            let v6: bool = rng.gen();
            let protocol = [TCP, UDP, ICMP, ICMPV6, 47, 99][rng.gen_range(0..6)];
            let mut ip = vec![0u8; if v6 { 48 } else { 28 }];
            rng.fill(&mut ip[..]);
            if v6 {
                ip[0] = 0x60;
                ip[4..6].copy_from_slice(&8u16.to_be_bytes());
                ip[6] = protocol;
            } else {
                ip[0] = 0x45;
                ip[2..4].copy_from_slice(&28u16.to_be_bytes());
                ip[6..8].copy_from_slice(&[0x40, 0]);
                ip[9] = protocol;
            }
            let n = network(&ip).unwrap();
            let at = if v6 { 8 } else { 12 };
            let len = if v6 { 16 } else { 4 };
            let mapped = |a: &[u8]| match <[u8; 16]>::try_from(a) {
                Ok(a) => a,
                Err(_) => std::net::Ipv4Addr::new(a[0], a[1], a[2], a[3])
                    .to_ipv6_mapped()
                    .octets(),
            };
            let t = Tuple::from_words(&key(&ip, &n).unwrap());
            assert_eq!(t.src, mapped(&ip[at..at + len]));
            assert_eq!(t.dst, mapped(&ip[at + len..at + 2 * len]));
            assert_eq!((t.protocol, t.v6), (protocol, v6));
            let l4 = &ip[n.transport..];
            let (sp, dp) = match protocol {
                ICMP | ICMPV6 => ([l4[4], l4[5]], [l4[0], l4[1]]),
                TCP | UDP | 47 => ([l4[0], l4[1]], [l4[2], l4[3]]),
                _ => ([0, 0], [0, 0]),
            };
            let ports = (u16::from_be_bytes(sp), u16::from_be_bytes(dp));
            assert_eq!((t.src_port, t.dst_port), ports);
        }
    }

    /// The checksum summed a 16-bit word at a time over the pseudo-header and segment
    /// laid out as the RFCs draw them.
    fn checksum_by_words(ip: &[u8], n: &Network) -> u16 {
        let segment = &ip[n.transport..n.len];
        let mut bytes = Vec::new();
        if n.v6 {
            bytes.extend_from_slice(&ip[8..40]);
            bytes.extend_from_slice(&(segment.len() as u32).to_be_bytes());
            bytes.extend_from_slice(&[0, 0, 0, n.protocol]);
        } else if n.protocol != ICMP {
            bytes.extend_from_slice(&ip[12..20]);
            bytes.extend_from_slice(&[0, n.protocol]);
            bytes.extend_from_slice(&(segment.len() as u16).to_be_bytes());
        }
        bytes.extend_from_slice(segment);
        let mut sum: u64 = 0;
        for (k, b) in bytes.iter().enumerate() {
            sum += u64::from(*b) << if k % 2 == 0 { 8 } else { 0 };
        }
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    #[test]
    fn transport_checksums_are_the_word_by_word_sums() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        for _ in 0..5_000 {
            let v6: bool = rng.gen();
            let protocol = [TCP, UDP, ICMP, ICMPV6][rng.gen_range(0..4)];
            let header = if v6 { 40 } else { 20 };
            let len = header + rng.gen_range(0..70);
            let mut ip = vec![0u8; len];
            rng.fill(&mut ip[..]);
            if v6 {
                ip[0] = 0x60;
                ip[4..6].copy_from_slice(&((len - 40) as u16).to_be_bytes());
                ip[6] = protocol;
            } else {
                ip[0] = 0x45;
                ip[2..4].copy_from_slice(&(len as u16).to_be_bytes());
                ip[6..8].copy_from_slice(&[0x40, 0]);
                ip[9] = protocol;
            }
            let n = network(&ip).unwrap();
            assert_eq!(transport_checksum(&ip, &n), checksum_by_words(&ip, &n));
        }
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
