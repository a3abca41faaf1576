//! Network address translation as the kernel's `nf_nat` does it: a connection's
//! binding chosen once, by its first packet (`nf_nat_setup_info`, `get_unique_tuple`),
//! and every later packet of it rewritten by that binding (`nf_nat_packet`), both ways.
//!
//! A binding changes the tuple the connection's replies carry: source NAT (snat,
//! masquerade) their destination, destination NAT (dnat, redirect) their source. The
//! choice is the kernel's: the original address and port kept where the range allows
//! them and no other connection holds the tuple they make; else a source already
//! mapped (`find_appropriate_src`); else the address hashed out of the range as the
//! kernel hashes it (`jhash2` of the addresses, so a client keeps its address across
//! connections), and the port searched from a random offset within the range (the
//! kernel's offset is random too: only the properties of such a choice can be compared).
//!
//! Packets are rewritten in place with their checksums updated incrementally (a
//! checksum left partial by the sender is updated as the kernel updates it, over the
//! pseudo-header only); an ICMP error RELATED to a translated connection has the packet
//! it quotes translated back, and its own addresses with it
//! (`nf_nat_icmp_reply_translation`).

use crate::connection::Connection;
use crate::tuple::{self, Network, Tuple, ICMP, ICMPV6, TCP, UDP};

/// `NF_NAT_RANGE_MAP_IPS`: the range holds addresses.
pub const MAP_IPS: u32 = 1;
/// `NF_NAT_RANGE_PROTO_SPECIFIED`: the range holds ports.
pub const PROTO_SPECIFIED: u32 = 2;
/// `NF_NAT_RANGE_PROTO_RANDOM`: ports chosen at random.
pub const PROTO_RANDOM: u32 = 4;
/// `NF_NAT_RANGE_PERSISTENT`: the address chosen by the source alone.
pub const PERSISTENT: u32 = 8;
/// `NF_NAT_RANGE_PROTO_RANDOM_FULLY`.
pub const PROTO_RANDOM_FULLY: u32 = 16;
/// `NF_NAT_RANGE_PROTO_OFFSET`.
pub const PROTO_OFFSET: u32 = 32;
/// `NF_NAT_RANGE_NETMAP`.
pub const NETMAP: u32 = 64;
/// Either random flag (`NF_NAT_RANGE_PROTO_RANDOM_ALL`).
pub const PROTO_RANDOM_ALL: u32 = PROTO_RANDOM | PROTO_RANDOM_FULLY;

/// `IPS_SRC_NAT`: the connection's source is translated.
pub const SRC_NAT: u32 = 1 << 4;
/// `IPS_DST_NAT`: its destination is.
pub const DST_NAT: u32 = 1 << 5;
/// `IPS_SRC_NAT_DONE`: its source binding is chosen.
pub const SRC_NAT_DONE: u32 = 1 << 7;
/// `IPS_DST_NAT_DONE`.
pub const DST_NAT_DONE: u32 = 1 << 8;

/// `NF_NAT_MAX_ATTEMPTS`: ports tried in a round.
const MAX_ATTEMPTS: u32 = 128;

/// Which end of a packet a binding rewrites.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Manip {
    /// The source (at postrouting: snat, masquerade).
    Source,
    /// The destination (at prerouting: dnat, redirect).
    Destination,
}

impl Manip {
    /// The status bit saying a connection is translated this way.
    pub fn nat_bit(self) -> u32 {
        match self {
            Manip::Source => SRC_NAT,
            Manip::Destination => DST_NAT,
        }
    }

    /// The status bit saying its binding this way is chosen.
    pub fn done_bit(self) -> u32 {
        match self {
            Manip::Source => SRC_NAT_DONE,
            Manip::Destination => DST_NAT_DONE,
        }
    }

    fn other(self) -> Manip {
        match self {
            Manip::Source => Manip::Destination,
            Manip::Destination => Manip::Source,
        }
    }
}

/// What a NAT statement asks for (`nf_nat_range2`): addresses and ports, inclusive,
/// with the flags above. Addresses are 16 bytes, IPv4 as IPv4-mapped IPv6.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Range {
    /// [`MAP_IPS`], [`PROTO_SPECIFIED`], ...
    pub flags: u32,
    /// The first address.
    pub min_addr: [u8; 16],
    /// The last address.
    pub max_addr: [u8; 16],
    /// The first port (ICMP identifier).
    pub min_proto: u16,
    /// The last port.
    pub max_proto: u16,
    /// With [`PROTO_OFFSET`]: the port the offset counts from.
    pub base_proto: u16,
}

/// The part of `t` that `m` rewrites: its address and port.
fn part(t: &Tuple, m: Manip) -> ([u8; 16], u16) {
    match m {
        Manip::Source => (t.src, t.src_port),
        Manip::Destination => (t.dst, t.dst_port),
    }
}

fn set_part(t: &mut Tuple, m: Manip, addr: [u8; 16], port: u16) {
    match m {
        Manip::Source => (t.src, t.src_port) = (addr, port),
        Manip::Destination => (t.dst, t.dst_port) = (addr, port),
    }
}

/// Whether the protocol has ports (or an ICMP identifier) NAT may change.
fn has_ports(protocol: u8) -> bool {
    matches!(protocol, TCP | UDP | ICMP | ICMPV6)
}

/// The key NAT changes for `m`: ICMP's identifier is the source's whichever way.
fn key(t: &Tuple, m: Manip) -> u16 {
    match t.protocol {
        ICMP | ICMPV6 => t.src_port,
        _ => part(t, m).1,
    }
}

fn set_key(t: &mut Tuple, m: Manip, v: u16) {
    match (t.protocol, m) {
        (ICMP | ICMPV6, _) | (_, Manip::Source) => t.src_port = v,
        (_, Manip::Destination) => t.dst_port = v,
    }
}

/// `l4proto_in_range`.
fn proto_in_range(t: &Tuple, m: Manip, r: &Range) -> bool {
    match t.protocol {
        ICMP | ICMPV6 => (r.min_proto..=r.max_proto).contains(&t.src_port),
        TCP | UDP => (r.min_proto..=r.max_proto).contains(&key(t, m)),
        _ => true,
    }
}

/// `nf_in_range`: the tuple's part already within the range.
pub(crate) fn in_range(t: &Tuple, m: Manip, r: &Range) -> bool {
    let (addr, _) = part(t, m);
    if r.flags & MAP_IPS != 0 && !(r.min_addr <= addr && addr <= r.max_addr) {
        return false;
    }
    r.flags & PROTO_SPECIFIED == 0 || proto_in_range(t, m, r)
}

/// The kernel's `jhash2` (Bob Jenkins' lookup3 over 32-bit words).
pub fn jhash2(k: &[u32], initval: u32) -> u32 {
    let mut a = 0xdead_beef_u32
        .wrapping_add((k.len() as u32) << 2)
        .wrapping_add(initval);
    let (mut b, mut c) = (a, a);
    let mut k = k;
    while k.len() > 3 {
        a = a.wrapping_add(k[0]);
        b = b.wrapping_add(k[1]);
        c = c.wrapping_add(k[2]);
        // __jhash_mix
        a = a.wrapping_sub(c) ^ c.rotate_left(4);
        c = c.wrapping_add(b);
        b = b.wrapping_sub(a) ^ a.rotate_left(6);
        a = a.wrapping_add(c);
        c = c.wrapping_sub(b) ^ b.rotate_left(8);
        b = b.wrapping_add(a);
        a = a.wrapping_sub(c) ^ c.rotate_left(16);
        c = c.wrapping_add(b);
        b = b.wrapping_sub(a) ^ a.rotate_left(19);
        a = a.wrapping_add(c);
        c = c.wrapping_sub(b) ^ b.rotate_left(4);
        b = b.wrapping_add(a);
        k = &k[3..];
    }
    if k.is_empty() {
        return c;
    }
    if k.len() == 3 {
        c = c.wrapping_add(k[2]);
    }
    if k.len() >= 2 {
        b = b.wrapping_add(k[1]);
    }
    a = a.wrapping_add(k[0]);
    // __jhash_final
    c = (c ^ b).wrapping_sub(b.rotate_left(14));
    a = (a ^ c).wrapping_sub(c.rotate_left(11));
    b = (b ^ a).wrapping_sub(a.rotate_left(25));
    c = (c ^ b).wrapping_sub(b.rotate_left(16));
    a = (a ^ c).wrapping_sub(c.rotate_left(4));
    b = (b ^ a).wrapping_sub(a.rotate_left(14));
    (c ^ b).wrapping_sub(b.rotate_left(24))
}

/// An address as the kernel's `union nf_inet_addr` holds it: four words as they lie in
/// memory (IPv4 in the first, the others zero).
fn words(addr: [u8; 16], v6: bool) -> [u32; 4] {
    if v6 {
        std::array::from_fn(|i| u32::from_ne_bytes(addr[i * 4..i * 4 + 4].try_into().unwrap()))
    } else {
        [
            u32::from_ne_bytes(addr[12..16].try_into().unwrap()),
            0,
            0,
            0,
        ]
    }
}

fn from_words(w: [u32; 4], v6: bool) -> [u8; 16] {
    let mut out = [0u8; 16];
    if v6 {
        for (i, w) in w.iter().enumerate() {
            out[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
        }
    } else {
        out[10] = 0xff;
        out[11] = 0xff;
        out[12..16].copy_from_slice(&w[0].to_ne_bytes());
    }
    out
}

/// `find_best_ips_proto`: the address of the range the tuple's endpoints hash to.
pub(crate) fn best_address(t: &mut Tuple, r: &Range, m: Manip) {
    if r.flags & MAP_IPS == 0 {
        return;
    }
    let (_, port) = part(t, m);
    if r.min_addr == r.max_addr {
        set_part(t, m, r.min_addr, port);
        return;
    }
    let max = if t.v6 { 3 } else { 0 };
    let src = words(t.src, t.v6);
    let dst = words(t.dst, t.v6);
    let persistent = r.flags & PERSISTENT != 0;
    let (min_w, max_w) = (words(r.min_addr, t.v6), words(r.max_addr, t.v6));
    let mut j = jhash2(&src, if persistent { 0 } else { dst[max] });
    let mut out = words(part(t, m).0, t.v6);
    let mut full_range = false;
    for i in 0..=max {
        let (minip, dist) = if full_range {
            (0u32, u32::MAX)
        } else {
            let (lo, hi) = (u32::from_be(min_w[i]), u32::from_be(max_w[i]));
            (lo, hi.wrapping_sub(lo).wrapping_add(1))
        };
        let scaled = ((u64::from(j) * u64::from(dist)) >> 32) as u32;
        out[i] = minip.wrapping_add(scaled).to_be();
        if out[i] != max_w[i] {
            full_range = true;
        }
        // The kernel mixes in the tuple's destination word as it now is: for
        // destination NAT, the word just chosen (it writes the tuple in place).
        if !persistent {
            j ^= if m == Manip::Destination {
                out[i]
            } else {
                dst[i]
            };
        }
    }
    set_part(t, m, from_words(out, t.v6), port);
}

/// What choosing a port asks of the table: whether a tuple is held by another
/// connection, and a random number.
pub(crate) trait Ports {
    /// `nf_nat_used_tuple`: whether the reply `tuple` would make is held.
    fn used(&mut self, tuple: &Tuple) -> bool;
    /// A random 16-bit number (`get_random_u16`).
    fn random(&mut self) -> u16;
}

/// `nf_nat_l4proto_unique_tuple`: a port (ICMP identifier) within the range that makes
/// the tuple unique, searched from a random offset; the last tried if none does.
pub(crate) fn unique_port(t: &mut Tuple, r: &Range, m: Manip, ports: &mut impl Ports) {
    let (min, size): (u32, u32) = match t.protocol {
        ICMP | ICMPV6 => {
            if r.flags & PROTO_SPECIFIED == 0 {
                (0, 65536)
            } else {
                let (lo, hi) = (u32::from(r.min_proto), u32::from(r.max_proto));
                // 0 to 65535 is 65536 identifiers (the kernel's unsigned arithmetic).
                (lo, hi.wrapping_sub(lo).wrapping_add(1))
            }
        }
        TCP | UDP => {
            if r.flags & PROTO_SPECIFIED == 0 {
                if m == Manip::Destination {
                    return;
                }
                match key(t, m) {
                    p if p < 512 => (1, 511),
                    p if p < 1024 => (600, 1023 - 600 + 1),
                    _ => (1024, 65535 - 1024 + 1),
                }
            } else {
                let (lo, hi) = (u32::from(r.min_proto), u32::from(r.max_proto));
                let (lo, hi) = (lo.min(hi), lo.max(hi));
                (lo, hi - lo + 1)
            }
        }
        _ => return,
    };
    let size = size.max(1);
    let mut off: u32 = if r.flags & PROTO_OFFSET != 0 {
        u32::from(key(t, m).wrapping_sub(r.base_proto))
    } else if r.flags & PROTO_RANDOM_ALL != 0 || m != Manip::Destination {
        u32::from(ports.random())
    } else {
        0
    };
    let mut attempts = size.min(MAX_ATTEMPTS);
    loop {
        for _ in 0..attempts {
            set_key(t, m, (min + off % size) as u16);
            if !ports.used(t) {
                return;
            }
            off = off.wrapping_add(1) & 0xffff;
        }
        if attempts >= size || attempts < 16 {
            return;
        }
        attempts /= 2;
        off = u32::from(ports.random());
    }
}

/// `get_unique_tuple` from step 2 on: the best address, then the port, unless it
/// already is in range and unique. (Step 1, the original and the mapped sources, is the
/// table's, which holds them.)
pub(crate) fn choose(t: &mut Tuple, r: &Range, m: Manip, ports: &mut impl Ports) {
    best_address(t, r, m);
    if r.flags & PROTO_RANDOM_ALL == 0 {
        if r.flags & PROTO_SPECIFIED != 0 {
            if r.flags & PROTO_OFFSET == 0
                && proto_in_range(t, m, r)
                && (r.min_proto == r.max_proto || !ports.used(t))
            {
                return;
            }
        } else if !ports.used(t) {
            return;
        }
    }
    if has_ports(t.protocol) {
        unique_port(t, r, m, ports);
    }
}

/// Ones' complement sum arithmetic on 16-bit words.
fn fold(sum: u32) -> u16 {
    // Twice is enough for any 32-bit sum (the first leaves at most 0x1fffe), and a
    // sum without a carry is left as it is: without a branch.
    let sum = (sum & 0xffff) + (sum >> 16);
    ((sum & 0xffff) + (sum >> 16)) as u16
}

/// A checksum field updated for the 16-bit words `from` becoming `to` (each given as
/// [`Words`]): RFC 1624's `~(~HC + ~m + m')`, the words' complements summed one by one
/// as the kernel's `csum_replace` sums them; a field left partial (holding the
/// pseudo-header's sum, not complemented) takes `HC + ~m + m'`.
fn replace(field: u16, from: Words, to: Words, partial: bool) -> u16 {
    let start = u32::from(if partial { field } else { !field });
    // (The complements' sum, `Σ(0xffff - w)`, without a loop.)
    let sum = start + from.count * 0xffff - from.sum + to.sum;
    let folded = fold(sum);
    if partial {
        folded
    } else {
        !folded
    }
}

/// Big-endian 16-bit words, as a checksum update needs them: their plain sum and how
/// many.
#[derive(Clone, Copy)]
struct Words {
    sum: u32,
    count: u32,
}

impl Words {
    /// The words of an address held as a number (IPv4 in its low 32 bits), summed
    /// four at a time in the lanes of a 64-bit word.
    #[inline]
    fn of_address(a: u128, v6: bool) -> Words {
        // A word's four 16-bit words: two pairs summed side by side, then the pairs.
        let four = |x: u64| {
            let pairs = (x & 0x0000_ffff_0000_ffff) + ((x >> 16) & 0x0000_ffff_0000_ffff);
            (pairs >> 32) + (pairs & 0xffff_ffff)
        };
        if v6 {
            Words {
                sum: (four((a >> 64) as u64) + four(a as u64)) as u32,
                count: 8,
            }
        } else {
            Words {
                sum: four(u64::from(a as u32)) as u32,
                count: 2,
            }
        }
    }

    /// One word.
    fn one(w: u16) -> Words {
        Words {
            sum: u32::from(w),
            count: 1,
        }
    }
}

fn get16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// Rewrites the part `m` of the IP packet `ip` (its network layer `n`) to `target`'s,
/// with its checksums, as `nf_nat_ipv4_manip_pkt` and `nf_nat_ipv6_manip_pkt` do.
/// `partial`: the transport checksum is left for the sender's link to finish. A packet
/// an ICMP error quotes may have its transport header cut short: only what is there is
/// rewritten, a checksum only if all of the header is.
pub(crate) fn manip(ip: &mut [u8], n: &Network, target: &Tuple, m: Manip, partial: bool) {
    let (addr, port) = part(target, m);
    rewrite(
        ip,
        n,
        (u128::from_be_bytes(addr), port, target.src_port),
        m,
        partial,
    );
}

/// [`manip`] of the part `m` to `address` (IPv4 as IPv4-mapped), `port` (TCP's and
/// UDP's) and `id` (an ICMP echo's identifier).
fn rewrite(
    ip: &mut [u8],
    n: &Network,
    (address, new_port, id): (u128, u16, u16),
    m: Manip,
    partial: bool,
) {
    let addr_at = match (n.v6, m) {
        (false, Manip::Source) => 12,
        (false, Manip::Destination) => 16,
        (true, Manip::Source) => 8,
        (true, Manip::Destination) => 24,
    };
    // (Read and written whole, at their fixed sizes.)
    let old = if n.v6 {
        let bytes: [u8; 16] = ip[addr_at..addr_at + 16].try_into().unwrap_or_default();
        Words::of_address(u128::from_be_bytes(bytes), true)
    } else {
        let bytes: [u8; 4] = ip[addr_at..addr_at + 4].try_into().unwrap_or_default();
        Words::of_address(u128::from(u32::from_be_bytes(bytes)), false)
    };
    let new = Words::of_address(address, n.v6);
    let l4 = n.transport;
    let end = n.len.min(ip.len());
    // The transport header: its checksum covers the addresses too, but ICMP's.
    match n.protocol {
        TCP | UDP => {
            let at_port = l4 + if m == Manip::Source { 0 } else { 2 };
            let csum_at = l4 + if n.protocol == TCP { 16 } else { 6 };
            let whole = csum_at + 2 <= end;
            let old_port = (at_port + 2 <= end).then(|| get16(ip, at_port));
            if whole {
                let field = get16(ip, csum_at);
                // UDP without a checksum keeps none.
                if !(n.protocol == UDP && field == 0) {
                    let mut f = replace(field, old, new, partial);
                    if let (Some(p), false) = (old_port, partial) {
                        f = replace(f, Words::one(p), Words::one(new_port), false);
                    }
                    if n.protocol == UDP && f == 0 {
                        f = 0xffff;
                    }
                    put16(ip, csum_at, f);
                }
            }
            if old_port.is_some() && has_ports(n.protocol) {
                put16(ip, at_port, new_port);
            }
        }
        ICMP | ICMPV6 => {
            let echo = |kind: u8| {
                if n.v6 {
                    matches!(kind, 128 | 129)
                } else {
                    matches!(kind, 0 | 8 | 13 | 14 | 15 | 16 | 17 | 18)
                }
            };
            if l4 + 8 <= end {
                let mut field = get16(ip, l4 + 2);
                if n.v6 {
                    field = replace(field, old, new, partial);
                }
                if echo(ip[l4]) {
                    let old_id = get16(ip, l4 + 4);
                    // A partial checksum is left as it is (`inet_proto_csum_replace2`
                    // without the pseudo-header).
                    if !partial {
                        field = replace(field, Words::one(old_id), Words::one(id), false);
                    }
                    put16(ip, l4 + 4, id);
                }
                put16(ip, l4 + 2, field);
            }
        }
        _ => {}
    }
    if n.v6 {
        ip[addr_at..addr_at + 16].copy_from_slice(&address.to_be_bytes());
    } else {
        ip[addr_at..addr_at + 4].copy_from_slice(&(address as u32).to_be_bytes());
    }
    if !n.v6 {
        let c = replace(get16(ip, 10), old, new, false);
        put16(ip, 10, c);
    }
}

/// The network header of `ip`, a packet of `tuple`'s direction, where it is plain: TCP
/// or UDP straight after an unfragmented IPv4 header or an IPv6 header without
/// extensions, its transport header whole. Read from the fields a rewrite needs alone,
/// as [`tuple::network`] would read them (its addresses left unread); `None` where the
/// packet is not so, for `tuple::network` to read it all.
#[inline]
pub(crate) fn plain_network(ip: &[u8], tuple: &Tuple) -> Option<Network> {
    let protocol = tuple.protocol;
    let (transport, len) = if tuple.v6 {
        let h = ip.get(..40)?;
        (h[0] >> 4 == 6 && h[6] == protocol).then_some((40, 40 + usize::from(get16(h, 4))))?
    } else {
        let h = ip.get(..20)?;
        let ihl = usize::from(h[0] & 0x0f) * 4;
        let unfragmented = get16(h, 6) & 0x3fff == 0;
        (h[0] >> 4 == 4 && ihl >= 20 && unfragmented && h[9] == protocol)
            .then_some((ihl, usize::from(get16(h, 2))))?
    };
    let header = match protocol {
        TCP => 20,
        UDP => 8,
        _ => return None,
    };
    (transport + header <= len && len <= ip.len()).then_some(Network {
        v6: tuple.v6,
        src: 0,
        dst: 0,
        protocol,
        transport,
        len,
    })
}

/// [`rewrite`] of a TCP or UDP packet whose transport header is whole and whose
/// checksum is complete (not left to the link to finish), its part `m` to address
/// `addr` (IPv4 in its last four bytes) and `port`: the same bytes, in fewer steps. The
/// checksums are updated in the machine's byte order, words read as they lie: a ones'
/// complement sum read with every word's bytes swapped is the sum swapped (RFC 1071),
/// so nothing is swapped, and a 32-bit word counts as its two halves. False, changing
/// nothing, if the header is not whole.
#[inline(always)]
fn rewrite_whole(ip: &mut [u8], n: &Network, addr: &[u8; 16], port: u16, m: Manip) -> bool {
    let (addr_at, width) = match (n.v6, m) {
        (false, Manip::Source) => (12, 4),
        (false, Manip::Destination) => (16, 4),
        (true, Manip::Source) => (8, 16),
        (true, Manip::Destination) => (24, 16),
    };
    let l4 = n.transport;
    let at_port = l4 + if m == Manip::Source { 0 } else { 2 };
    let csum_at = l4 + if n.protocol == TCP { 16 } else { 6 };
    let new = &addr[16 - width..];
    let (Some(old), true) = (
        ip.get(addr_at..addr_at + width),
        csum_at + 2 <= n.len.min(ip.len()),
    ) else {
        return false;
    };
    // The address's words, old complemented and new, summed a 32-bit word at a time
    // (at the address's fixed size, without a loop). Sizes that differ (never: both are
    // the family's) leave the packet to the general rewrite.
    let delta = if n.v6 {
        address_delta::<16>(old, new)
    } else {
        address_delta::<4>(old, new)
    };
    let Some(delta) = delta else {
        return false;
    };
    let half = |ip: &[u8], at: usize| u16::from_ne_bytes([ip[at], ip[at + 1]]);
    let field = half(ip, csum_at);
    // UDP without a checksum keeps none.
    if !(n.protocol == UDP && field == 0) {
        let ports =
            u64::from(!half(ip, at_port)) + u64::from(u16::from_ne_bytes(port.to_be_bytes()));
        let mut f = !fold_wide(u64::from(!field) + delta + ports);
        if n.protocol == UDP && f == 0 {
            f = 0xffff;
        }
        ip[csum_at..csum_at + 2].copy_from_slice(&f.to_ne_bytes());
    }
    ip[at_port..at_port + 2].copy_from_slice(&port.to_be_bytes());
    ip[addr_at..addr_at + width].copy_from_slice(new);
    if !n.v6 {
        let c = !fold_wide(u64::from(!half(ip, 10)) + delta);
        ip[10..12].copy_from_slice(&c.to_ne_bytes());
    }
    true
}

/// The sum of the 32-bit words of `old` complemented and of `new` (each `N` bytes, read
/// in the machine's order): what a checksum gains when `old` becomes `new`. `None` if
/// either is not `N` bytes.
#[inline]
fn address_delta<const N: usize>(old: &[u8], new: &[u8]) -> Option<u64> {
    let (Ok(old), Ok(new)) = (<[u8; N]>::try_from(old), <[u8; N]>::try_from(new)) else {
        return None;
    };
    let word =
        |b: &[u8; N], i: usize| u64::from(u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]));
    (0..N)
        .step_by(4)
        .map(|i| (0xffff_ffff - word(&old, i)) + word(&new, i))
        .sum::<u64>()
        .into()
}

/// [`fold`] of a sum of up to 2^32 32-bit words: 2^32 is 1 in ones' complement
/// arithmetic on 16-bit words, as 2^16 is.
fn fold_wide(sum: u64) -> u16 {
    let sum = (sum & 0xffff_ffff) + (sum >> 32);
    let sum = (sum & 0xffff_ffff) + (sum >> 32);
    fold(sum as u32)
}

/// Rewrites the TCP or UDP packet `ip` (its network header read as `n`) as the tuple
/// `other` inverted says: its part `m` is `other`'s other part (read in place rather
/// than the tuple built anew).
#[inline(always)]
pub(crate) fn rewrite_ported(other: &Tuple, ip: &mut [u8], n: &Network, m: Manip, partial: bool) {
    let (addr, port) = part(other, m.other());
    if partial || !rewrite_whole(ip, n, &addr, port, m) {
        rewrite(ip, n, (u128::from_be_bytes(addr), port, 0), m, partial);
    }
}

/// Rewrites `ip` (its network header read as `n`), a packet of connection `c` going in
/// direction `dir`, where the connection's binding for `m` changed that direction
/// (`nf_nat_packet`'s status bit): to the other direction's tuple inverted.
pub(crate) fn manip_as(
    c: &Connection,
    dir: usize,
    ip: &mut [u8],
    n: &Network,
    m: Manip,
    partial: bool,
) {
    let mut bit = m.nat_bit();
    if dir == 1 {
        bit ^= SRC_NAT | DST_NAT;
    }
    if c.status & bit == 0 {
        return;
    }
    let other = &c.tuples[1 - dir];
    if matches!(other.protocol, TCP | UDP) {
        rewrite_ported(other, ip, n, m, partial);
    } else if let Some(target) = other.inverted() {
        manip(ip, n, &target, m, partial);
    }
}

/// The Internet checksum of `b` made again from nothing.
fn checksum(b: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut chunks = b.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    !fold(sum)
}

/// `nf_nat_icmp_reply_translation`: the ICMP error `ip` (network layer `n`) RELATED to
/// a connection whose tuples are `tuples`, going its direction `dir`, at the hook that
/// rewrites `m`: the packet it quotes is rewritten as the connection's other direction
/// is, its checksum made again, then its own addresses as the reply to that packet's
/// would be. False: it cannot be (truncated), and is dropped.
pub(crate) fn icmp_error(
    ip: &mut [u8],
    n: &Network,
    tuples: &[Tuple; 2],
    dir: usize,
    m: Manip,
    partial: bool,
) -> bool {
    let l4 = n.transport;
    let end = n.len.min(ip.len());
    let Some(quoted) = tuple::quoted_network(&ip[..end], l4 + 8, n.v6) else {
        return false;
    };
    let other = &tuples[1 - dir];
    {
        let inner = &mut ip[l4 + 8..end];
        let q = Network {
            len: inner.len(),
            ..quoted
        };
        manip(inner, &q, other, m.other(), false);
    }
    if !partial {
        ip[l4 + 2..l4 + 4].fill(0);
        let sum = if n.v6 {
            let mut pseudo = Vec::with_capacity(40 + end - l4);
            pseudo.extend_from_slice(&ip[8..40]);
            pseudo.extend_from_slice(&((end - l4) as u32).to_be_bytes());
            pseudo.extend_from_slice(&[0, 0, 0, ICMPV6]);
            pseudo.extend_from_slice(&ip[l4..end]);
            checksum(&pseudo)
        } else {
            checksum(&ip[l4..end])
        };
        put16(ip, l4 + 2, sum);
    }
    let Some(mut target) = other.inverted() else {
        return false;
    };
    target.protocol = n.protocol;
    manip(ip, n, &target, m, partial);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the hash picks the kernel's address is checked against the kernel (the
    /// `fibre forward` NAT test of the command line, a range of addresses); here, its
    /// shape.
    #[test]
    fn jhash2_is_deterministic_and_sensitive() {
        // Of zero words, the initial value's arithmetic alone.
        assert_eq!(jhash2(&[], 0), 0xdead_beef);
        let a = jhash2(&[1, 2, 3, 4], 0);
        assert_ne!(a, jhash2(&[1, 2, 3, 5], 0));
        assert_ne!(a, jhash2(&[1, 2, 3, 4], 1));
        assert_eq!(a, jhash2(&[1, 2, 3, 4], 0));
    }

    fn ipv4(src: [u8; 4], dst: [u8; 4], proto: u8, l4: &[u8]) -> Vec<u8> {
        let len = 20 + l4.len();
        let mut ip = vec![
            0x45,
            0,
            (len >> 8) as u8,
            len as u8,
            0,
            1,
            0x40,
            0,
            64,
            proto,
            0,
            0,
        ];
        ip.extend_from_slice(&src);
        ip.extend_from_slice(&dst);
        ip.extend_from_slice(l4);
        let c = checksum(&ip[..20]);
        put16(&mut ip, 10, c);
        ip
    }

    fn finish_l4(ip: &mut [u8], proto: u8, csum_at: usize) {
        let n = tuple::network(ip).unwrap();
        put16(ip, n.transport + csum_at, 0);
        let c = tuple::transport_checksum(ip, &n);
        put16(ip, n.transport + csum_at, c);
        let _ = proto;
    }

    fn mapped(a: [u8; 4]) -> [u8; 16] {
        std::net::Ipv4Addr::from(a).to_ipv6_mapped().octets()
    }

    #[test]
    fn rewritten_packets_keep_correct_checksums() {
        // TCP and UDP, each end rewritten: the incremental checksum equals one made
        // again from nothing.
        for (proto, csum_at) in [(TCP, 16), (UDP, 6)] {
            let mut l4 = vec![0u8; 24];
            l4[0..2].copy_from_slice(&5000u16.to_be_bytes());
            l4[2..4].copy_from_slice(&80u16.to_be_bytes());
            if proto == UDP {
                l4[4..6].copy_from_slice(&24u16.to_be_bytes());
            } else {
                l4[12] = 0x50;
            }
            l4[20..24].copy_from_slice(b"data");
            let mut ip = ipv4([10, 1, 0, 2], [10, 2, 0, 2], proto, &l4);
            finish_l4(&mut ip, proto, csum_at);
            for m in [Manip::Source, Manip::Destination] {
                let n = tuple::network(&ip).unwrap();
                let target = Tuple {
                    src: mapped([203, 0, 113, 9]),
                    dst: mapped([192, 0, 2, 7]),
                    src_port: 61000,
                    dst_port: 8080,
                    protocol: proto,
                    v6: false,
                };
                manip(&mut ip, &n, &target, m, false);
                let n = tuple::network(&ip).unwrap();
                assert_eq!(tuple::transport_checksum(&ip, &n), 0, "{proto} {m:?}");
                assert_eq!(checksum(&ip[..20]), 0);
            }
            let t = tuple::tuple(&ip, &tuple::network(&ip).unwrap()).unwrap();
            assert_eq!((t.src_port, t.dst_port), (61000, 8080));
            assert_eq!(&ip[12..20], &[203, 0, 113, 9, 192, 0, 2, 7]);
        }
    }

    /// A random TCP or UDP packet of either family, its checksums right (UDP's zero,
    /// "none", at times).
    fn random_packet(rng: &mut impl rand::Rng) -> Vec<u8> {
        let v6: bool = rng.gen();
        let protocol = if rng.gen() { TCP } else { UDP };
        let (header, l4_len) = (if v6 { 40 } else { 20 }, rng.gen_range(20..64));
        let mut ip = vec![0u8; header + l4_len];
        rng.fill(&mut ip[..]);
        if v6 {
            ip[0] = 0x60;
            ip[4..6].copy_from_slice(&(l4_len as u16).to_be_bytes());
            ip[6] = protocol;
        } else {
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&((header + l4_len) as u16).to_be_bytes());
            ip[6..8].copy_from_slice(&[0x40, 0]);
            ip[9] = protocol;
            put16(&mut ip, 10, 0);
            let c = checksum(&ip[..20]);
            put16(&mut ip, 10, c);
        }
        let csum_at = header + if protocol == TCP { 16 } else { 6 };
        if protocol == UDP {
            ip[header + 4..header + 6].copy_from_slice(&(l4_len as u16).to_be_bytes());
        }
        put16(&mut ip, csum_at, 0);
        if protocol == TCP || rng.gen_range(0..8) != 0 {
            let c = tuple::transport_checksum(&ip, &tuple::network(&ip).unwrap());
            put16(
                &mut ip,
                csum_at,
                if protocol == UDP && c == 0 { 0xffff } else { c },
            );
        }
        ip
    }

    #[test]
    fn a_connections_rewrite_is_its_other_tuple_inverted_with_checksums_made_anew() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for _ in 0..20_000 {
            let mut ip = random_packet(&mut rng);
            let n = tuple::network(&ip).unwrap();
            let original = tuple::tuple(&ip, &n).unwrap();
            // The other direction's tuple: the reply, its ends translated at random.
            let mut reply = original.inverted().unwrap();
            let (m, dir) = (
                [Manip::Source, Manip::Destination][rng.gen_range(0..2)],
                rng.gen_range(0..2),
            );
            let mut fresh = |a: &mut [u8; 16]| {
                rng.fill(&mut a[..]);
                if !n.v6 {
                    a[..12].copy_from_slice(&mapped([0; 4])[..12]);
                }
            };
            fresh(&mut reply.src);
            fresh(&mut reply.dst);
            (reply.src_port, reply.dst_port) = (rng.gen(), rng.gen());
            let mut tuples = [original, reply];
            if dir == 1 {
                tuples.swap(0, 1);
            }
            let mut bit = m.nat_bit();
            if dir == 1 {
                bit ^= SRC_NAT | DST_NAT;
            }
            let c = Connection {
                tuples,
                status: bit,
                mark: 0,
                expires: Default::default(),
                protocol: crate::connection::Protocol::Generic,
                masquerade: 0,
                kept: Default::default(),
            };
            let udp_without = n.protocol == UDP && get16(&ip, n.transport + 6) == 0;
            manip_as(&c, dir, &mut ip, &n, m, false);
            // As the tuple inverted says, every byte of it.
            let target = c.tuples[1 - dir].inverted().unwrap();
            let (addr, port) = part(&target, m);
            let (addr_at, len) = match (n.v6, m) {
                (false, Manip::Source) => (12, 4),
                (false, Manip::Destination) => (16, 4),
                (true, Manip::Source) => (8, 16),
                (true, Manip::Destination) => (24, 16),
            };
            assert_eq!(&ip[addr_at..addr_at + len], &addr[16 - len..]);
            let at_port = n.transport + if m == Manip::Source { 0 } else { 2 };
            assert_eq!(get16(&ip, at_port), port);
            let n = tuple::network(&ip).unwrap();
            let csum_at = n.transport + if n.protocol == TCP { 16 } else { 6 };
            if udp_without {
                assert_eq!(get16(&ip, csum_at), 0, "UDP without a checksum keeps none");
            } else {
                assert_eq!(tuple::transport_checksum(&ip, &n), 0);
                assert_ne!(get16(&ip, csum_at), 0);
            }
            if !n.v6 {
                assert_eq!(checksum(&ip[..20]), 0);
            }
        }
    }

    /// The rewrite of a whole TCP or UDP header in the machine's byte order writes what
    /// the general one writes, byte for byte, checksums of every value (right, wrong,
    /// UDP's none) included.
    #[test]
    fn a_whole_headers_rewrite_is_the_general_ones_byte_for_byte() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(13);
        for k in 0..50_000 {
            let mut ip = random_packet(&mut rng);
            let n = tuple::network(&ip).unwrap();
            let csum_at = n.transport + if n.protocol == TCP { 16 } else { 6 };
            match k % 4 {
                // A checksum of any value, or the values ones' complement holds twice.
                0 => put16(&mut ip, csum_at, rng.gen()),
                1 => put16(&mut ip, csum_at, [0, 0xffff][rng.gen_range(0..2)]),
                _ => {}
            }
            if !n.v6 && k % 5 == 0 {
                put16(&mut ip, 10, rng.gen());
            }
            let mut addr = [0u8; 16];
            rng.fill(&mut addr[..]);
            if k % 7 == 0 {
                // The same address: the checksums' sums unchanged.
                addr = if n.v6 {
                    ip[8..24].try_into().unwrap()
                } else {
                    mapped(ip[12..16].try_into().unwrap())
                };
            }
            let port: u16 = rng.gen();
            let m = [Manip::Source, Manip::Destination][rng.gen_range(0..2)];
            let mut general = ip.clone();
            rewrite(
                &mut general,
                &n,
                (u128::from_be_bytes(addr), port, 0),
                m,
                false,
            );
            assert!(rewrite_whole(&mut ip, &n, &addr, port, m));
            assert_eq!(ip, general, "packet {k}");
        }
    }

    #[test]
    fn a_plain_packets_network_header_is_read_as_in_full() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(12);
        let mut plain = 0;
        for _ in 0..50_000 {
            let mut ip = random_packet(&mut rng);
            let t = tuple::tuple(&ip, &tuple::network(&ip).unwrap()).unwrap();
            // Now and then a field that makes it other than plain, or malformed.
            match rng.gen_range(0..12) {
                0 => ip[0] = (ip[0] & 0xf0) | rng.gen_range(0..16),
                1 => ip[rng.gen_range(0..8)] = rng.gen(),
                2 => ip[6] = rng.gen(),
                3 => ip.truncate(rng.gen_range(0..ip.len())),
                4 => ip[9] = rng.gen(),
                _ => {}
            }
            let full = tuple::network(&ip).ok();
            match plain_network(&ip, &t) {
                Some(n) => {
                    plain += 1;
                    let f = full.expect("a plain header is a header");
                    assert_eq!(
                        (n.v6, n.protocol, n.transport, n.len),
                        (f.v6, f.protocol, f.transport, f.len)
                    );
                }
                None => {
                    // Not plain: a header of another shape, or not whole.
                    let shaped = full.is_some_and(|f| {
                        f.v6 == t.v6
                            && f.protocol == t.protocol
                            && f.transport == if t.v6 { 40 } else { 20 }
                            && f.transport + if f.protocol == TCP { 20 } else { 8 } <= f.len
                            && (!t.v6 || ip[6] == t.protocol)
                    });
                    assert!(!shaped, "{ip:?}");
                }
            }
        }
        assert!(plain > 30_000, "{plain}");
    }

    struct Free(u16);
    impl Ports for Free {
        fn used(&mut self, t: &Tuple) -> bool {
            t.src_port < 2000 && t.protocol == UDP
        }
        fn random(&mut self) -> u16 {
            self.0 = self.0.wrapping_mul(31).wrapping_add(7);
            self.0
        }
    }

    #[test]
    fn ports_are_searched_within_the_range() {
        let r = Range {
            flags: MAP_IPS | PROTO_SPECIFIED,
            min_addr: mapped([203, 0, 113, 1]),
            max_addr: mapped([203, 0, 113, 1]),
            min_proto: 1000,
            max_proto: 3000,
            base_proto: 0,
        };
        let mut t = Tuple {
            src: mapped([10, 0, 0, 1]),
            dst: mapped([10, 0, 0, 2]),
            src_port: 1500,
            dst_port: 53,
            protocol: UDP,
            v6: false,
        };
        choose(&mut t, &r, Manip::Source, &mut Free(1));
        assert_eq!(t.src, mapped([203, 0, 113, 1]));
        assert!((2000..=3000).contains(&t.src_port), "{}", t.src_port);
        // A range of addresses: the one each source gets is within it, hashed from the
        // endpoints alone (whatever the random numbers), and the sources spread.
        let r = Range {
            flags: MAP_IPS,
            max_addr: mapped([203, 0, 113, 20]),
            ..r
        };
        let mut given = std::collections::BTreeSet::new();
        for k in 0..20 {
            let mut a = Tuple {
                src: mapped([10, 0, 0, k]),
                src_port: 4000,
                ..t
            };
            let mut b = a;
            choose(&mut a, &r, Manip::Source, &mut Free(1));
            choose(&mut b, &r, Manip::Source, &mut Free(9));
            assert_eq!(a, b);
            assert!(r.min_addr <= a.src && a.src <= r.max_addr);
            assert_eq!(a.src_port, 4000);
            given.insert(a.src);
        }
        assert!(given.len() > 4, "{given:?}");
    }
}
