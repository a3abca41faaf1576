//! Software segmentation (GSO) of a forwarded packet: a TCP or UDP packet that its sender
//! left whole for a device to cut (a "super-packet" of up to 64 KiB, with a segment
//! size) is cut into the packets that device would have sent, as the kernel cuts it when
//! the way out cannot take it whole (`validate_xmit_skb` → `skb_gso_segment`). fibre
//! does it where it sends by a way that carries no segmentation (AF_XDP), or where the
//! segments must then be fragmented.
//!
//! What the kernel does (read in `inet_gso_segment`, `ipv6_gso_segment`,
//! `tcp4_gso_segment`, `tcp6_gso_segment`, `tcp_gso_segment`, `udp4_ufo_fragment`,
//! `__udp_gso_segment`, `skb_segment`, `virtio_net_hdr_to_skb`; checked against Linux
//! 6.18 byte for byte by this module's tests), and so what this module does:
//!
//! - Every segment is the packet's headers, all of them (Ethernet, IP with its options or
//!   extension headers, TCP with its options, or UDP), followed by the next `size` bytes
//!   of payload; the last segment carries the rest.
//! - IPv4 (`inet_gso_segment`): each segment's total length its own; the identification
//!   the packet's plus the segment's number, wrapping at 16 bits, DF or not (only the
//!   `FIXEDID` kind keeps it, which a virtio-net header cannot say); the header checksum
//!   made anew. The options go into every segment, all of them, where fragmentation keeps
//!   only the copied ones after the first fragment ([`crate::fragment`]).
//! - IPv6 (`ipv6_gso_segment`): each segment's payload length its own. The extension
//!   headers the kernel steps over (`ipv6_gso_pull_exthdrs`: hop-by-hop, routing,
//!   destination options) go into every segment. Any other before the transport header
//!   (a fragment header, AH, ESP) leaves the kernel no way to cut the packet, and it
//!   drops it: refused ([`SegmentError::ExtensionHeader`]).
//! - TCP (`tcp_gso_segment`): the sequence number advanced by the payload before the
//!   segment; FIN and PSH on the last segment only, CWR on the first only (the kernel
//!   keeps it on all for accurate ECN, `SKB_GSO_TCP_ACCECN`, which a virtio-net header
//!   cannot say either). The rest of the header (ACK, window, urgent pointer, options)
//!   is copied as it is.
//! - UDP (`__udp_gso_segment`, the `UDP_L4` kind): each segment a datagram with its own
//!   length.
//! - Each segment's transport checksum is complete: the pseudo-header's sum for the
//!   segment's own length plus the sum of the segment's own bytes (`gso_make_checksum`).
//!   The pseudo-header's sum is the one the sender left in the checksum field of a
//!   partial checksum (`CHECKSUM_PARTIAL`), adjusted for the length, as the kernel takes
//!   it: the sender knows the final destination a routing header or a source route names,
//!   and the kernel never sums the addresses again. For a packet whose checksum was
//!   complete it is summed from the IP header's addresses, as `tcp4_gso_segment` and
//!   `tcp6_gso_segment` sum it. So a UDP super-packet whose field held zero (IPv4's "no
//!   checksum") does not keep it: the kernel reads the zero as the pseudo-header's sum,
//!   as every UDP super-packet comes partial (`virtio_net_hdr_to_skb` refuses one that
//!   does not). A UDP checksum that comes out zero is written as all ones
//!   (`CSUM_MANGLED_0`), zero meaning "none"; a TCP one stays zero.
//! - A packet whose payload fits one segment is not cut: the virtio-net header's reader
//!   does not mark it for segmentation, and it leaves as it is, a partial checksum
//!   finished (`skb_checksum_help`, which writes a zero TCP checksum as all ones too).
//!   That reader counts the payload from the end of a 20-byte TCP header: a packet whose
//!   TCP options make the difference is marked, and then `tcp_gso_segment` refuses it (no
//!   more payload than one segment) and the kernel drops it; so does fibre
//!   ([`SegmentError::NotLarger`]).
//!
//! Refused, where the kernel would send something all the same: an IPv4 fragment (the
//! kernel would copy MF and the offset into every segment; no sender makes one); a UDP
//! length field that is not the datagram's (the kernel adjusts the checksum by the
//! field's length, so its segments would carry wrong checksums). Refused as the kernel
//! refuses it: a partial checksum that is not the transport header's (`tcp_gso_segment`
//! and `__udp_gso_segment` check where it starts, `virtio_net_hdr_to_skb` where its field
//! is). Bytes past the IP length (Ethernet padding) are dropped, as `ip_rcv` and
//! `ipv6_rcv` trim them before the kernel forwards.
//!
//! The shape: the headers are read once into a plan (where the transport header and
//! the payload start, where the packet ends, the pseudo-header's sum), and one routine
//! writes segment `k` from the packet: headers copied, its share of the payload copied,
//! then the fields above set and the checksum summed. [`segments`] runs it into vectors
//! (tests, tools); [`segment`] into a pool's buffers, the first segment staying in the
//! packet's own buffer, shortened, with its headers rewritten in place.
//!
//! What it costs: each payload byte is copied and then summed, as the kernel does in
//! software. A pool lends one buffer at a time (and fibre takes no `unsafe` for two), so
//! each segment after the first is written into a scratch copy, one per call, and then
//! into its buffer: those bytes are copied twice. A 64 KiB super-packet in 1,448-byte
//! segments is 45 buffers, 44 taken from the pool.

use crate::input::{ETHERNET_LEN, ETHERTYPE_IPV4, ETHERTYPE_IPV6};
use crate::offload::{GsoKind, Offload};
use crate::pool::{BufferId, Pool};
use fibre_headers::tcp::flags::{FIN, PSH};
use fibre_headers::transport::{TCP, UDP};
use fibre_headers::{checksum, tcp, udp, EthernetFrame, Ipv4Packet, Ipv6Extension, Ipv6Packet};
use fibre_headers::{TcpSegment, UdpDatagram};

/// IPv6 extension headers the kernel steps over before the transport header
/// (`ipv6_gso_pull_exthdrs`): hop-by-hop options, routing, destination options.
const STEPPED_OVER: [u8; 3] = [0, 43, 60];

/// IPv6 extension headers it does not: fragment, ESP, AH, mobility, HIP, shim6, and the
/// two for experiments (RFC 7045's list).
const NOT_STEPPED_OVER: [u8; 8] = [44, 50, 51, 135, 139, 140, 253, 254];

/// TCP's CWR flag, in the flags byte.
const CWR: u8 = 0x80;

/// Bytes of an IPv6 header.
const IPV6_HEADER: usize = 40;

/// Why a packet could not be cut. The packet is left as it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentError {
    /// The buffer's offload asks for no segmentation.
    NotGso,
    /// Not an IPv4 or IPv6 packet, by its EtherType (VLAN-tagged frames included).
    NotIp,
    /// TCP segmentation for one IP version of a packet of the other (the kernel's
    /// `tcp4_gso_segment` and `tcp6_gso_segment` refuse it).
    WrongFamily,
    /// TCP segmentation of a packet that is not TCP.
    NotTcp,
    /// UDP segmentation of a packet that is not UDP.
    NotUdp,
    /// An IPv6 extension header (its number) before the transport header that the
    /// kernel does not step over: a fragment header, AH, ESP, and the like.
    ExtensionHeader(u8),
    /// An IPv4 fragment (MF set, or an offset).
    Fragment,
    /// Headers cut short, or lengths that disagree with each other or with the frame.
    Malformed,
    /// A partial checksum that is not the transport header's own.
    ChecksumPlace,
    /// The payload fits one segment, yet counted as the virtio-net header's reader counts
    /// it (from the end of a 20-byte TCP header) it does not: the kernel marks it for
    /// segmentation, `tcp_gso_segment` refuses it, and the kernel drops it.
    NotLarger,
    /// A segment longer than a buffer of the pool. While a pool's buffers are all one
    /// size this cannot be (no segment is longer than the packet); checked all the same,
    /// as a buffer filled past its room would be cut short without a word.
    TooLarge,
    /// The pool has too few free buffers for the segments.
    NoBuffers,
}

impl std::fmt::Display for SegmentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SegmentError::NotGso => write!(f, "no segmentation asked"),
            SegmentError::NotIp => write!(f, "not an IPv4 or IPv6 packet"),
            SegmentError::WrongFamily => {
                write!(f, "TCP segmentation for the other IP version")
            }
            SegmentError::NotTcp => write!(f, "TCP segmentation of a packet not TCP"),
            SegmentError::NotUdp => write!(f, "UDP segmentation of a packet not UDP"),
            SegmentError::ExtensionHeader(n) => {
                write!(f, "IPv6 extension header {n} before the transport header")
            }
            SegmentError::Fragment => write!(f, "an IPv4 fragment"),
            SegmentError::Malformed => write!(f, "headers cut short or lengths that disagree"),
            SegmentError::ChecksumPlace => {
                write!(f, "partial checksum not the transport header's")
            }
            SegmentError::NotLarger => write!(
                f,
                "payload within one segment but TCP options past it (the kernel drops it)"
            ),
            SegmentError::TooLarge => write!(f, "a segment longer than a buffer"),
            SegmentError::NoBuffers => write!(f, "too few free buffers for the segments"),
        }
    }
}

/// Where a packet's parts lie and how it is cut, read once from its headers.
#[derive(Clone, Copy, Debug)]
struct Plan {
    /// IPv6, else IPv4.
    v6: bool,
    /// TCP, else UDP.
    tcp: bool,
    /// Where the transport header starts.
    l4: usize,
    /// Where the payload starts: every segment copies the bytes before it.
    payload: usize,
    /// Where the packet ends (its IP length; what follows is padding, dropped).
    end: usize,
    /// Payload bytes a segment carries.
    size: usize,
    /// How many segments.
    count: usize,
    /// The pseudo-header's sum for the packet's whole transport length.
    pseudo: u16,
    /// Not a super-packet after all: it leaves as it is, only a partial checksum finished.
    whole: bool,
    /// Whether its checksum was left partial.
    partial: bool,
}

impl Plan {
    /// Where segment `k`'s share of the payload starts and ends in the packet.
    fn share(&self, k: usize) -> (usize, usize) {
        let from = self.payload + k * self.size;
        (from, (from + self.size).min(self.end))
    }

    /// Segment `k`'s length.
    fn len(&self, k: usize) -> usize {
        let (from, to) = self.share(k);
        self.payload + (to - from)
    }

    /// Where the transport checksum is.
    fn field(&self) -> usize {
        self.l4
            + if self.tcp {
                tcp::field::CHECKSUM.start
            } else {
                udp::field::CHECKSUM.start
            }
    }
}

/// The checksum of the TCP (`tcp`) or UDP header at the start of `transport`, which
/// holds it.
fn transport_checksum(transport: &[u8], tcp: bool) -> u16 {
    if tcp {
        TcpSegment::new_checked(transport).map_or(0, |t| t.checksum())
    } else {
        UdpDatagram::new_checked(transport).map_or(0, |u| u.checksum())
    }
}

/// Sets the checksum of the TCP (`tcp`) or UDP header at the start of `transport`.
fn set_transport_checksum(transport: &mut [u8], tcp: bool, sum: u16) {
    if tcp {
        if let Ok(mut t) = TcpSegment::new_checked(transport) {
            t.set_checksum(sum);
        }
    } else if let Ok(mut u) = UdpDatagram::new_checked(transport) {
        u.set_checksum(sum);
    }
}

/// Reads the headers of `frame` and what `offload` asks, and plans the cut.
fn plan(frame: &[u8], offload: Offload) -> Result<Plan, SegmentError> {
    use SegmentError::*;
    let gso = offload.gso.ok_or(NotGso)?;
    if gso.size == 0 {
        return Err(Malformed);
    }
    let ip = ETHERNET_LEN;
    let eth = EthernetFrame::new_checked(frame).map_err(|_| Malformed)?;
    let (v6, proto, l4, end) = match eth.ethertype() {
        ETHERTYPE_IPV4 => {
            let h = Ipv4Packet::new_checked(eth.payload()).map_err(|_| Malformed)?;
            let (ihl, total) = (h.header_len(), usize::from(h.total_len()));
            if h.version() != 4 || ihl < 20 || total < ihl || ip + total > frame.len() {
                return Err(Malformed);
            }
            if h.is_fragment() {
                return Err(Fragment);
            }
            (false, h.protocol(), ip + ihl, ip + total)
        }
        ETHERTYPE_IPV6 => {
            let h = Ipv6Packet::new_checked(eth.payload()).map_err(|_| Malformed)?;
            let end = ip + IPV6_HEADER + usize::from(h.payload_len());
            // A payload length of zero is a jumbogram's, which no frame here can be.
            if h.version() != 6 || end == ip + IPV6_HEADER || end > frame.len() {
                return Err(Malformed);
            }
            let (mut next, mut at) = (h.next_header(), ip + IPV6_HEADER);
            while STEPPED_OVER.contains(&next) {
                if at + 8 > end {
                    return Err(Malformed);
                }
                let e = Ipv6Extension::new_checked(&frame[at..end]).map_err(|_| Malformed)?;
                at += e.len(next);
                next = e.next_header();
            }
            if at > end {
                return Err(Malformed);
            }
            if NOT_STEPPED_OVER.contains(&next) {
                return Err(ExtensionHeader(next));
            }
            (true, next, at, end)
        }
        _ => return Err(NotIp),
    };
    let tcp = match (gso.kind, v6) {
        (GsoKind::Tcp4, true) | (GsoKind::Tcp6, false) => return Err(WrongFamily),
        (GsoKind::Tcp4 | GsoKind::Tcp6, _) if proto != TCP => return Err(NotTcp),
        (GsoKind::Udp, _) if proto != UDP => return Err(NotUdp),
        (kind, _) => kind != GsoKind::Udp,
    };
    // The transport header: where the payload starts, and the shortest it can be (what
    // the virtio-net header's reader counts the payload from).
    let transport = &frame[l4..end];
    let (payload, least) = if tcp {
        let doff = TcpSegment::new_checked(transport)
            .map_err(|_| Malformed)?
            .header_len();
        if doff < tcp::HEADER_LEN || l4 + doff > end {
            return Err(Malformed);
        }
        (l4 + doff, tcp::HEADER_LEN)
    } else {
        let udp = UdpDatagram::new_checked(transport).map_err(|_| Malformed)?;
        if usize::from(udp.len()) != end - l4 {
            return Err(Malformed);
        }
        (l4 + udp::HEADER_LEN, udp::HEADER_LEN)
    };
    let size = gso.size as usize;
    let whole = end - l4 - least <= size;
    if !whole && end - payload <= size {
        return Err(NotLarger);
    }
    let mut plan = Plan {
        v6,
        tcp,
        l4,
        payload,
        end,
        size,
        count: if whole {
            1
        } else {
            (end - payload).div_ceil(size)
        },
        pseudo: 0,
        whole,
        partial: offload.checksum.is_some(),
    };
    plan.pseudo = match offload.checksum {
        Some(c) => {
            if c.start as usize != l4 || c.start as usize + c.offset as usize != plan.field() {
                return Err(ChecksumPlace);
            }
            transport_checksum(&frame[l4..], tcp)
        }
        None => {
            let len = (end - l4) as u32;
            match (Ipv6Packet::new_checked(eth.payload()), v6) {
                (Ok(h), true) => checksum::pseudo_header_sum(
                    &h.source().octets(),
                    &h.destination().octets(),
                    proto,
                    len,
                ),
                _ => {
                    let h = Ipv4Packet::new_checked(eth.payload()).map_err(|_| Malformed)?;
                    checksum::pseudo_header_sum(
                        &h.source().octets(),
                        &h.destination().octets(),
                        proto,
                        len,
                    )
                }
            }
        }
    };
    Ok(plan)
}

/// Sets the transport checksum of `seg` (a packet as `plan` reads it, `seg.len()` long):
/// the pseudo-header's sum for its length and the sum of its transport bytes. A zero
/// result is written as all ones if `mangle_zero`.
fn put_checksum(seg: &mut [u8], plan: &Plan, mangle_zero: bool) {
    set_transport_checksum(&mut seg[plan.l4..], plan.tcp, 0);
    // Ones' complement: the whole length's share taken out, this length's put in.
    let pseudo = checksum::add(
        checksum::add(plan.pseudo, !((plan.end - plan.l4) as u16)),
        (seg.len() - plan.l4) as u16,
    );
    let mut sum = !checksum::add(pseudo, checksum::sum(&seg[plan.l4..]));
    if sum == 0 && mangle_zero {
        sum = 0xffff;
    }
    set_transport_checksum(&mut seg[plan.l4..], plan.tcp, sum);
}

/// Makes the headers of segment `k` of the packet `plan` was made from its own: `seg`
/// holds the packet's headers and the segment's share of the payload.
fn finish(seg: &mut [u8], plan: &Plan, k: usize) {
    if plan.whole {
        // Not cut: left as it is (`skb_checksum_help` finishes a partial checksum).
        if plan.partial {
            put_checksum(seg, plan, true);
        }
        return;
    }
    let (ip, l4, len) = (ETHERNET_LEN, plan.l4, seg.len());
    if plan.v6 {
        if let Ok(mut h) = Ipv6Packet::new_checked(&mut seg[ip..]) {
            h.set_payload_len((len - ip - IPV6_HEADER) as u16);
        }
    } else if let Ok(mut h) = Ipv4Packet::new_checked(&mut seg[ip..l4]) {
        h.set_total_len((len - ip) as u16);
        h.set_ident(h.ident().wrapping_add(k as u16));
        h.fill_checksum();
    }
    if plan.tcp {
        if let Ok(mut t) = TcpSegment::new_checked(&mut seg[l4..]) {
            t.set_sequence(t.sequence().wrapping_add((k * plan.size) as u32));
            let mut flags = t.flags();
            if k + 1 < plan.count {
                flags &= !(FIN | PSH);
            }
            if k > 0 {
                flags &= !CWR;
            }
            t.set_flags(flags);
        }
    } else if let Ok(mut u) = UdpDatagram::new_checked(&mut seg[l4..]) {
        u.set_len((len - l4) as u16);
    }
    put_checksum(seg, plan, !plan.tcp);
}

/// Writes segment `k` of `frame` (cut as `plan` says) into the start of `out`, which has
/// room for it; returns its length.
fn write(frame: &[u8], plan: &Plan, k: usize, out: &mut [u8]) -> usize {
    let (from, to) = plan.share(k);
    let len = plan.payload + (to - from);
    out[..plan.payload].copy_from_slice(&frame[..plan.payload]);
    out[plan.payload..len].copy_from_slice(&frame[from..to]);
    finish(&mut out[..len], plan, k);
    len
}

/// The segments of `frame` (an Ethernet frame carrying a TCP or UDP packet) that
/// `offload` asks for, each a frame of its own with a complete checksum, in order: one,
/// the packet itself with its checksum finished, if its payload fits one segment.
#[cfg(test)]
pub fn segments(frame: &[u8], offload: Offload) -> Result<Vec<Vec<u8>>, SegmentError> {
    let plan = plan(frame, offload)?;
    Ok((0..plan.count)
        .map(|k| {
            let mut seg = vec![0; plan.len(k)];
            write(frame, &plan, k, &mut seg);
            seg
        })
        .collect())
}

/// Cuts the frame in buffer `id` of `pool` into the segments its offload
/// ([`Pool::offload`]) asks for: the first in `id` itself (shortened), the others in
/// buffers taken from `pool`; all of them, `id` first, are appended to `out` in the order
/// they are to be sent. Returns how many. Every segment's transport checksum is complete
/// and its offload is [`Offload::NONE`], so that any way out can send it. A packet whose
/// payload fits one segment is one segment, `id`, its checksum finished.
///
/// On an error, `id` and `out` are as they were and no buffer is taken.
pub fn segment(
    pool: &mut Pool,
    id: BufferId,
    out: &mut Vec<BufferId>,
) -> Result<usize, SegmentError> {
    let plan = plan(pool.frame(id), pool.offload(id))?;
    let more = plan.count - 1;
    // The second segment is the longest of those that go to new buffers.
    if more > 0 && plan.len(1) > pool.buffer_size() {
        return Err(SegmentError::TooLarge);
    }
    let first = out.len();
    out.push(id);
    if pool.alloc(more, out) < more {
        pool.free(&out[first + 1..]);
        out.truncate(first);
        return Err(SegmentError::NoBuffers);
    }
    if more > 0 {
        let mut scratch = vec![0; plan.len(1)];
        for k in 1..plan.count {
            let len = write(pool.frame(id), &plan, k, &mut scratch);
            pool.fill(out[first + k], &scratch[..len]);
        }
    }
    // The first segment is the packet's start: its headers rewritten where they are.
    finish(pool.resize(id, plan.len(0)), &plan, 0);
    pool.set_offload(id, Offload::NONE);
    Ok(plan.count)
}

/// How many segments `frame` is cut into (what [`segment_into`] takes from a pool).
pub fn count(frame: &[u8], offload: Offload) -> Result<usize, SegmentError> {
    Ok(plan(frame, offload)?.count)
}

/// Cuts `frame`, which lies outside the pool (in a receive ring), into the segments
/// `offload` asks for, each in a buffer taken from `pool`, appended to `out` in order;
/// returns how many. Every segment's transport checksum is complete and its offload
/// [`Offload::NONE`]. On an error, `out` is as it was and no buffer is taken.
pub fn segment_into(
    pool: &mut Pool,
    frame: &[u8],
    offload: Offload,
    out: &mut Vec<BufferId>,
) -> Result<usize, SegmentError> {
    let plan = plan(frame, offload)?;
    // The first segment is the longest.
    if plan.len(0) > pool.buffer_size() {
        return Err(SegmentError::TooLarge);
    }
    let first = out.len();
    if pool.alloc(plan.count, out) < plan.count {
        pool.free(&out[first..]);
        out.truncate(first);
        return Err(SegmentError::NoBuffers);
    }
    for k in 0..plan.count {
        let len = plan.len(k);
        write(frame, &plan, k, pool.resize(out[first + k], len));
    }
    Ok(plan.count)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The big-endian 16-bit word at `at`.
    fn word(b: &[u8], at: usize) -> u16 {
        u16::from_be_bytes([b[at], b[at + 1]])
    }

    /// Writes `value` big-endian at `at`.
    fn put(b: &mut [u8], at: usize, value: u16) {
        b[at..at + 2].copy_from_slice(&value.to_be_bytes());
    }
    use crate::offload::{Gso, PartialChecksum};
    use etherparse::{NetSlice, PacketBuilder, SlicedPacket, TransportSlice};
    use rand::{Rng, SeedableRng};

    /// The sending host's MAC address in every frame built here.
    const SOURCE_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
    /// The next hop's.
    const DESTINATION_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];

    /// A super-packet to build.
    #[derive(Clone, Debug)]
    struct Spec {
        v6: bool,
        tcp: bool,
        payload: Vec<u8>,
        size: u16,
        /// Whether the checksum field holds the pseudo-header's sum (else the whole
        /// checksum).
        partial: bool,
        seq: u32,
        /// FIN, PSH, CWR, ECE, URG, in this order.
        flags: [bool; 5],
        /// TCP options (a multiple of 4 bytes).
        tcp_options: Vec<u8>,
        /// IPv4 options (a multiple of 4 bytes).
        ip_options: Vec<u8>,
        /// An IPv6 extension header: its number and bytes (its first, the next header,
        /// filled in).
        extension: Option<(u8, Vec<u8>)>,
        id: u16,
        dont_fragment: bool,
        /// Whether the checksum field of a partial checksum holds zero (as IPv4's "no
        /// checksum" would read) in place of the pseudo-header's sum.
        zero_field: bool,
    }

    impl Spec {
        fn new(v6: bool, tcp: bool, payload_len: usize, size: u16) -> Spec {
            Spec {
                v6,
                tcp,
                payload: (0..payload_len).map(|i| (i * 7 + i / 251) as u8).collect(),
                size,
                partial: true,
                seq: 1_000_000,
                flags: [false; 5],
                tcp_options: Vec::new(),
                ip_options: Vec::new(),
                extension: None,
                id: 0x1234,
                dont_fragment: true,
                zero_field: false,
            }
        }

        fn kind(&self) -> GsoKind {
            match (self.tcp, self.v6) {
                (true, false) => GsoKind::Tcp4,
                (true, true) => GsoKind::Tcp6,
                (false, _) => GsoKind::Udp,
            }
        }

        /// The frame, and the offload that goes with it.
        fn build(&self) -> (Vec<u8>, Offload) {
            let b = PacketBuilder::ethernet2(SOURCE_MAC, DESTINATION_MAC);
            let b = if self.v6 {
                b.ipv6(
                    [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10],
                    [0x20, 1, 0xd, 0xb8, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x20],
                    63,
                )
            } else {
                b.ipv4([10, 0, 0, 1], [10, 2, 0, 9], 63)
            };
            let mut f = Vec::new();
            if self.tcp {
                let mut t = b.tcp(40000, 443, self.seq, 501).ack(0x0a0b0c0d);
                let [fin, psh, cwr, ece, urg] = self.flags;
                if fin {
                    t = t.fin();
                }
                if psh {
                    t = t.psh();
                }
                if cwr {
                    t = t.cwr();
                }
                if ece {
                    t = t.ece();
                }
                if urg {
                    t = t.urg(77);
                }
                if !self.tcp_options.is_empty() {
                    t = t.options_raw(&self.tcp_options).unwrap();
                }
                t.write(&mut f, &self.payload).unwrap();
            } else {
                b.udp(5353, 4433).write(&mut f, &self.payload).unwrap();
            }
            let ip = ETHERNET_LEN;
            if self.v6 {
                if let Some((number, ext)) = &self.extension {
                    let mut ext = ext.clone();
                    ext[0] = f[ip + 6];
                    f[ip + 6] = *number;
                    let len = word(&f, ip + 4) as usize + ext.len();
                    put(&mut f, ip + 4, len as u16);
                    f.splice(ip + IPV6_HEADER..ip + IPV6_HEADER, ext);
                }
            } else {
                let n = self.ip_options.len();
                f.splice(ip + 20..ip + 20, self.ip_options.iter().copied());
                f[ip] = 0x45 + (n / 4) as u8;
                let total = word(&f, ip + 2) as usize + n;
                put(&mut f, ip + 2, total as u16);
                put(&mut f, ip + 4, self.id);
                put(&mut f, ip + 6, if self.dont_fragment { 0x4000 } else { 0 });
                f[ip + 10..ip + 12].fill(0);
                let sum = checksum::checksum(&f[ip..ip + 20 + n]);
                put(&mut f, ip + 10, sum);
            }
            // The transport checksum (the addresses, so its pseudo-header, unchanged by
            // the headers put in) stays what etherparse computed.
            let l4 = transport_start(&f);
            let field = l4 + if self.tcp { 16 } else { 6 };
            let checksum = if self.partial {
                make_partial(&mut f, l4, field);
                if self.zero_field {
                    f[field..field + 2].fill(0);
                }
                Some(PartialChecksum {
                    start: l4 as u16,
                    offset: (field - l4) as u16,
                })
            } else {
                None
            };
            let gso = Gso {
                kind: self.kind(),
                size: self.size,
                ecn: false,
            };
            (
                f,
                Offload {
                    checksum,
                    gso: Some(gso),
                    checksum_valid: false,
                },
            )
        }
    }

    /// Where the transport header of a frame etherparse reads starts.
    fn transport_start(f: &[u8]) -> usize {
        let p = SlicedPacket::from_ethernet(f).unwrap();
        let t = match p.transport.unwrap() {
            TransportSlice::Tcp(t) => t.slice().as_ptr(),
            TransportSlice::Udp(u) => u.slice().as_ptr(),
            other => panic!("{other:?}"),
        };
        t as usize - f.as_ptr() as usize
    }

    /// Replaces a complete transport checksum with the pseudo-header's sum, as a sender
    /// leaves it for a device: the complete checksum's complement, less the sum of the
    /// transport bytes.
    fn make_partial(f: &mut [u8], l4: usize, field: usize) {
        let whole = word(f, field);
        f[field..field + 2].fill(0);
        let pseudo = checksum::add(!whole, !checksum::sum(&f[l4..]));
        put(f, field, pseudo);
    }

    /// What etherparse reads in a frame.
    struct Read<'a> {
        ip_header: &'a [u8],
        extensions: &'a [u8],
        source: Vec<u8>,
        destination: Vec<u8>,
        transport: TransportSlice<'a>,
    }

    fn read(f: &[u8]) -> Read<'_> {
        let p = SlicedPacket::from_ethernet(f).unwrap_or_else(|e| panic!("{e:?}"));
        let l4 = transport_start(f);
        let ip = &f[ETHERNET_LEN..];
        let (ip_header, extensions, source, destination) = match p.net.unwrap() {
            NetSlice::Ipv4(_) => {
                let h = &ip[..(ip[0] & 0x0f) as usize * 4];
                (h, &[][..], h[12..16].to_vec(), h[16..20].to_vec())
            }
            NetSlice::Ipv6(_) => {
                let h = &ip[..IPV6_HEADER];
                let ext = &ip[IPV6_HEADER..l4 - ETHERNET_LEN];
                (h, ext, h[8..24].to_vec(), h[24..40].to_vec())
            }
        };
        Read {
            ip_header,
            extensions,
            source,
            destination,
            transport: p.transport.unwrap(),
        }
    }

    /// The transport checksum etherparse computes for a frame's segment, and the one it
    /// carries.
    fn checksums(r: &Read) -> (u16, u16) {
        let v4 = |a: &[u8]| <[u8; 4]>::try_from(a).unwrap();
        let v6 = |a: &[u8]| <[u8; 16]>::try_from(a).unwrap();
        match &r.transport {
            TransportSlice::Tcp(t) => {
                let c = if r.source.len() == 4 {
                    t.calc_checksum_ipv4(v4(&r.source), v4(&r.destination))
                } else {
                    t.calc_checksum_ipv6(v6(&r.source), v6(&r.destination))
                };
                (c.unwrap(), t.checksum())
            }
            TransportSlice::Udp(u) => {
                let h = u.to_header();
                let c = if r.source.len() == 4 {
                    h.calc_checksum_ipv4_raw(v4(&r.source), v4(&r.destination), u.payload())
                } else {
                    h.calc_checksum_ipv6_raw(v6(&r.source), v6(&r.destination), u.payload())
                };
                (c.unwrap(), u.checksum())
            }
            other => panic!("{other:?}"),
        }
    }

    /// Holds `segs` to what the kernel's rules make of the super-packet `spec` built:
    /// each segment read by etherparse, its lengths, IP ID, sequence number, flags and
    /// checksums as they must be, its headers otherwise the packet's, and the payloads
    /// together the packet's.
    fn check(spec: &Spec, frame: &[u8], segs: &[Vec<u8>]) {
        let size = spec.size as usize;
        let orig = read(frame);
        let payload_len = spec.payload.len();
        let least = if spec.tcp {
            20 + spec.tcp_options.len()
        } else {
            8
        };
        let whole = payload_len + least - if spec.tcp { 20 } else { 8 } <= size;
        let count = if whole { 1 } else { payload_len.div_ceil(size) };
        assert_eq!(segs.len(), count, "{payload_len} bytes in {size}");
        let mut joined = Vec::new();
        for (k, seg) in segs.iter().enumerate() {
            let r = read(seg);
            let last = k + 1 == count;
            assert_eq!(seg[..ETHERNET_LEN], frame[..ETHERNET_LEN]);
            // The IP header: the packet's but for the lengths, the ID and the checksum.
            let (h, o) = (r.ip_header, orig.ip_header);
            assert_eq!(h.len(), o.len());
            assert_eq!(r.extensions, orig.extensions, "extension headers copied");
            if spec.v6 {
                assert_eq!(word(h, 4) as usize, seg.len() - ETHERNET_LEN - IPV6_HEADER);
                assert_eq!((&h[..4], &h[6..]), (&o[..4], &o[6..]));
            } else {
                assert_eq!(word(h, 2) as usize, seg.len() - ETHERNET_LEN);
                let id = spec.id.wrapping_add(if whole { 0 } else { k as u16 });
                assert_eq!(word(h, 4), id, "segment {k}: IP ID");
                assert!(checksum::holds(h), "segment {k}: IPv4 header checksum");
                assert_eq!(
                    (&h[..2], &h[6..10], &h[12..]),
                    (&o[..2], &o[6..10], &o[12..])
                );
            }
            let (computed, carried) = checksums(&r);
            match (&r.transport, &orig.transport) {
                (TransportSlice::Tcp(t), TransportSlice::Tcp(o)) => {
                    let seq = spec.seq.wrapping_add((k * size) as u32);
                    assert_eq!(t.sequence_number(), seq, "segment {k}");
                    assert_eq!(t.fin(), o.fin() && last, "segment {k}: FIN");
                    assert_eq!(t.psh(), o.psh() && last, "segment {k}: PSH");
                    assert_eq!(t.cwr(), o.cwr() && k == 0, "segment {k}: CWR");
                    let same = |t: &etherparse::TcpSlice| {
                        (
                            t.source_port(),
                            t.destination_port(),
                            t.acknowledgment_number(),
                            (t.ns(), t.syn(), t.rst(), t.ack(), t.ece(), t.urg()),
                            t.window_size(),
                            t.urgent_pointer(),
                            t.options().to_vec(),
                        )
                    };
                    assert_eq!(same(t), same(o), "segment {k}");
                    // A zero result stays zero in a cut TCP segment; a packet left whole
                    // has it written as all ones.
                    let ok = carried == computed || (whole && computed == 0 && carried == !0);
                    assert!(ok, "segment {k}: TCP checksum {carried:#x}, {computed:#x}");
                    joined.extend_from_slice(t.payload());
                }
                (TransportSlice::Udp(u), TransportSlice::Udp(o)) => {
                    assert_eq!(u.length() as usize, u.slice().len());
                    assert_eq!(
                        (u.source_port(), u.destination_port()),
                        (o.source_port(), o.destination_port())
                    );
                    assert_eq!(carried, computed, "segment {k}: UDP checksum");
                    joined.extend_from_slice(u.payload());
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(joined, spec.payload, "the payloads together");
    }

    /// Random super-packets of each kind (payload lengths, segment sizes, flags, IDs and
    /// sequence numbers near their wrap, options and extension headers, checksums partial
    /// or complete), each cut and held to the kernel's rules by etherparse.
    #[test]
    fn random_super_packets_are_cut_by_the_rules() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(29);
        for round in 0..1200 {
            let (v6, tcp) = [(false, true), (true, true), (false, false), (true, false)][round % 4];
            let size: u16 = match rng.gen_range(0..4) {
                0 => rng.gen_range(1..64),
                1 => rng.gen_range(500..1500),
                _ => rng.gen_range(64..9000),
            };
            let max = 65535 - 60 - 40 - 40 - 8;
            let len = match rng.gen_range(0..6) {
                0 => rng.gen_range(0..=size as usize),
                1 => size as usize * rng.gen_range(2..8),
                _ => rng.gen_range(size as usize + 1..=(size as usize * 60).min(max)),
            }
            .min(max)
            .min(size as usize * 200);
            let mut spec = Spec::new(v6, tcp, len, size);
            spec.payload.iter_mut().for_each(|b| *b = rng.gen());
            spec.partial = rng.gen_bool(0.7);
            spec.seq = if rng.gen_bool(0.3) {
                u32::MAX - rng.gen_range(0..70_000)
            } else {
                rng.gen()
            };
            spec.id = if rng.gen_bool(0.3) {
                u16::MAX - rng.gen_range(0..50)
            } else {
                rng.gen()
            };
            spec.dont_fragment = rng.gen_bool(0.5);
            spec.flags = [(); 5].map(|_| rng.gen_bool(0.5));
            if tcp && rng.gen_bool(0.3) {
                // NOP, NOP, a timestamp.
                spec.tcp_options = vec![1, 1, 8, 10, 1, 2, 3, 4, 5, 6, 7, 8];
            }
            if !v6 && rng.gen_bool(0.2) {
                // Router alert, as IGMP and RSVP carry it.
                spec.ip_options = vec![0x94, 4, 0, 0];
            }
            if v6 && rng.gen_bool(0.3) {
                let number = [0, 43, 60][rng.gen_range(0..3)];
                // Options, or a routing header of type 4 with no segment left: a next
                // header and a length, then padding or the type's fields, in 8 bytes.
                let ext = match number {
                    43 => vec![0, 0, 4, 0, 0, 0, 0, 0],
                    _ => vec![0, 0, 1, 4, 0, 0, 0, 0],
                };
                spec.extension = Some((number, ext));
            }
            // TCP options past the segment size with no more payload than it: refused.
            let options_too = tcp && len + spec.tcp_options.len() > size as usize;
            let (frame, offload) = spec.build();
            match segments(&frame, offload) {
                Ok(segs) => check(&spec, &frame, &segs),
                Err(SegmentError::NotLarger) => {
                    assert!(
                        options_too && len <= size as usize,
                        "round {round}: {spec:?}"
                    )
                }
                Err(e) => panic!("round {round}: {e}: {spec:?}"),
            }
        }
    }

    /// Frames of every kind, bytes changed and cut short at random: refused or cut, never
    /// a panic (the parse checks every length before it reads).
    #[test]
    fn arbitrary_bytes_are_refused_or_cut() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(31);
        for round in 0..20_000 {
            let (v6, tcp) = [(false, true), (true, true), (false, false), (true, false)][round % 4];
            let mut spec = Spec::new(v6, tcp, rng.gen_range(0..3000), rng.gen_range(1..1500));
            if v6 && rng.gen_bool(0.3) {
                spec.extension = Some(([0, 43, 60, 44][rng.gen_range(0..4)], vec![0; 8]));
            }
            let (mut frame, mut offload) = spec.build();
            for _ in 0..rng.gen_range(1..4) {
                let at = rng.gen_range(0..frame.len().min(100));
                frame[at] = rng.gen();
            }
            frame.truncate(rng.gen_range(0..=frame.len()));
            if rng.gen_bool(0.2) {
                offload.checksum = None;
            }
            if let Ok(segs) = segments(&frame, offload) {
                assert!(!segs.is_empty());
            }
        }
    }

    /// A super-packet to cut, built to be cut in four: for the pool tests.
    fn four_segments() -> (Vec<u8>, Offload) {
        let mut spec = Spec::new(false, true, 3 * 1448 + 100, 1448);
        spec.flags = [true, true, true, false, false];
        spec.build()
    }

    /// In a pool: the first segment in the packet's own buffer, the others in buffers
    /// taken, all in order in `out` after what it held; the same bytes as [`segments`],
    /// nothing left to do. A frame placed past a headroom is cut the same.
    #[test]
    fn a_pool_buffer_is_cut_into_buffers_of_the_pool() {
        let (frame, offload) = four_segments();
        let expected = segments(&frame, offload).unwrap();
        assert_eq!(expected.len(), 4);
        for headroom in [0, 256] {
            let mut pool = Pool::new(16, 1 << 16);
            let mut ids = Vec::new();
            pool.alloc(1, &mut ids);
            let id = ids[0];
            pool.place(id, headroom, frame.len());
            pool.frame_mut(id).copy_from_slice(&frame);
            pool.set_offload(id, offload);
            let mut out = vec![99];
            assert_eq!(segment(&mut pool, id, &mut out), Ok(4));
            assert_eq!(out.len(), 5);
            assert_eq!(out[..2], [99, id]);
            assert_eq!(pool.available(), 16 - 4);
            for (k, &b) in out[1..].iter().enumerate() {
                assert_eq!(pool.frame(b), &expected[k][..], "segment {k}");
                assert_eq!(pool.offload(b), Offload::NONE);
            }
            assert_eq!(pool.placement(id), Some((headroom, expected[0].len())));
        }
    }

    /// A frame outside the pool (a ring's) is cut into buffers the size of its segments
    /// (AF_XDP's chunks), the same segments as `segments` makes; a pool that cannot take
    /// them all, or whose buffers are shorter than a segment, takes none.
    #[test]
    fn a_frame_from_a_ring_is_cut_into_the_pools_buffers() {
        let (frame, offload) = four_segments();
        let expected = segments(&frame, offload).unwrap();
        assert_eq!(count(&frame, offload), Ok(4));
        let longest = expected.iter().map(Vec::len).max().unwrap();
        let mut pool = Pool::new(6, longest);
        let mut out = vec![5];
        assert_eq!(segment_into(&mut pool, &frame, offload, &mut out), Ok(4));
        assert_eq!(out.len(), 5);
        for (k, &b) in out[1..].iter().enumerate() {
            assert_eq!(pool.frame(b), &expected[k][..], "segment {k}");
            assert_eq!(pool.offload(b), Offload::NONE);
        }
        assert_eq!(pool.available(), 2);
        let mut out = vec![5];
        let e = segment_into(&mut pool, &frame, offload, &mut out);
        assert_eq!(e, Err(SegmentError::NoBuffers));
        assert_eq!((out, pool.available()), (vec![5], 2));
        let mut small = Pool::new(8, longest - 1);
        let e = segment_into(&mut small, &frame, offload, &mut Vec::new());
        assert_eq!(e, Err(SegmentError::TooLarge));
        assert_eq!(small.available(), 8);
    }

    /// A pool with too few free buffers: refused, the packet's buffer, its offload and
    /// `out` as they were, no buffer taken. A buffer that asks for no segmentation is
    /// refused the same way.
    #[test]
    fn what_the_pool_cannot_hold_leaves_everything_as_it_was() {
        let (frame, offload) = four_segments();
        for (free, offload, error) in [
            (2, offload, SegmentError::NoBuffers),
            (8, Offload::NONE, SegmentError::NotGso),
        ] {
            let mut pool = Pool::new(1 + free, 8192);
            let mut ids = Vec::new();
            pool.alloc(1, &mut ids);
            pool.fill(ids[0], &frame);
            pool.set_offload(ids[0], offload);
            let mut out = vec![7, 8];
            assert_eq!(segment(&mut pool, ids[0], &mut out), Err(error));
            assert_eq!(out, [7, 8]);
            assert_eq!(pool.available(), free);
            assert_eq!(pool.frame(ids[0]), &frame[..]);
            assert_eq!(pool.offload(ids[0]), offload);
        }
        // With one more buffer it goes.
        let mut pool = Pool::new(4, 8192);
        let mut ids = Vec::new();
        pool.alloc(1, &mut ids);
        pool.fill(ids[0], &frame);
        pool.set_offload(ids[0], offload);
        let mut out = Vec::new();
        assert_eq!(segment(&mut pool, ids[0], &mut out), Ok(4));
        assert_eq!((out.len(), pool.available()), (4, 0));
    }

    /// A packet whose payload fits one segment is one segment, in its own buffer: its
    /// partial checksum finished, nothing left to do, no buffer taken.
    #[test]
    fn a_packet_within_one_segment_is_only_finished() {
        let spec = Spec::new(true, false, 700, 1000);
        let (frame, offload) = spec.build();
        let mut pool = Pool::new(2, 2048);
        let mut ids = Vec::new();
        pool.alloc(1, &mut ids);
        pool.fill(ids[0], &frame);
        pool.set_offload(ids[0], offload);
        let mut out = Vec::new();
        assert_eq!(segment(&mut pool, ids[0], &mut out), Ok(1));
        assert_eq!((out, pool.available()), (ids.clone(), 1));
        assert_eq!(pool.offload(ids[0]), Offload::NONE);
        let mut whole = spec.clone();
        whole.partial = false;
        assert_eq!(pool.frame(ids[0]), &whole.build().0[..]);
        check(&spec, &frame, &[pool.frame(ids[0]).to_vec()]);
    }

    /// Changes a payload word of segment `k` of what `spec` builds so that the segment's
    /// transport checksum comes out zero (its bytes and pseudo-header summing to all
    /// ones). The segment's share must start at an even offset (an even size).
    fn zero_checksum(spec: &mut Spec, k: usize) {
        let (frame, offload) = spec.build();
        let seg = &segments(&frame, offload).unwrap()[k];
        let l4 = transport_start(seg);
        let field = l4 + if spec.tcp { 16 } else { 6 };
        let ip = &seg[ETHERNET_LEN..];
        let mut bytes = if spec.v6 {
            ip[8..40].to_vec()
        } else {
            ip[12..20].to_vec()
        };
        bytes.extend_from_slice(&[0, if spec.tcp { TCP } else { UDP }]);
        bytes.extend_from_slice(&((seg.len() - l4) as u16).to_be_bytes());
        let at = bytes.len() + field - l4;
        bytes.extend_from_slice(&seg[l4..]);
        bytes[at..at + 2].fill(0);
        let sum = checksum::sum(&bytes);
        let w = k * spec.size as usize;
        let new = checksum::add(word(&spec.payload, w), !sum);
        put(&mut spec.payload, w, new);
    }

    /// Segments whose checksum comes out zero: a cut TCP segment keeps zero, a UDP one
    /// has all ones (zero is "no checksum"), and so does a TCP packet left whole
    /// (`skb_checksum_help`).
    #[test]
    fn a_zero_checksum_is_written_as_the_kernel_writes_it() {
        for (tcp, len, size, k, expected) in [
            (true, 6000, 1400, 2, 0x0000),
            (false, 4000, 1000, 1, 0xffff),
            (true, 500, 1448, 0, 0xffff),
        ] {
            for v6 in [false, true] {
                let mut spec = Spec::new(v6, tcp, len, size);
                zero_checksum(&mut spec, k);
                let (frame, offload) = spec.build();
                let segs = segments(&frame, offload).unwrap();
                let l4 = transport_start(&segs[k]);
                let field = l4 + if tcp { 16 } else { 6 };
                assert_eq!(word(&segs[k], field), expected, "tcp {tcp} v6 {v6}");
                check(&spec, &frame, &segs);
            }
        }
    }

    /// A packet whose checksum was complete is cut as the same packet left partial is;
    /// one whose UDP checksum field held zero as complete ("no checksum") gets checksums
    /// of its own all the same.
    #[test]
    fn a_complete_checksum_is_cut_as_a_partial_one() {
        for (v6, tcp) in [(false, true), (true, true), (false, false), (true, false)] {
            let mut spec = Spec::new(v6, tcp, 9999, 1234);
            spec.flags = [true; 5];
            let (partial, p) = spec.build();
            spec.partial = false;
            let (whole, w) = spec.build();
            assert_ne!(partial, whole);
            let segs = segments(&whole, w).unwrap();
            assert_eq!(segments(&partial, p).unwrap(), segs, "v6 {v6} tcp {tcp}");
            check(&spec, &whole, &segs);
            if !tcp {
                let mut none = whole.clone();
                let field = transport_start(&none) + 6;
                none[field..field + 2].fill(0);
                assert_eq!(segments(&none, w).unwrap(), segs);
                // Partial, the zero is taken for the pseudo-header's sum, as the kernel
                // takes it: each segment's checksum is its bytes' and the difference of
                // lengths' alone, not zero.
                spec.partial = true;
                spec.zero_field = true;
                let (f, o) = spec.build();
                let all = (f.len() - transport_start(&f)) as u16;
                for (seg, good) in segments(&f, o).unwrap().iter().zip(&segs) {
                    let l4 = transport_start(seg);
                    let mut bytes = seg[l4..].to_vec();
                    bytes[6..8].fill(0);
                    let lengths = checksum::add(!all, bytes.len() as u16);
                    let sum = checksum::add(lengths, checksum::sum(&bytes));
                    assert_eq!(word(seg, l4 + 6), !sum);
                    assert_eq!(seg[..l4 + 6], good[..l4 + 6]);
                }
            }
        }
    }

    /// Bytes past the IP length (Ethernet padding) are not payload.
    #[test]
    fn padding_is_left_out() {
        let spec = Spec::new(false, false, 3000, 1000);
        let (frame, offload) = spec.build();
        let mut padded = frame.clone();
        padded.extend_from_slice(&[0xee; 6]);
        assert_eq!(segments(&padded, offload), segments(&frame, offload));
    }

    /// Every refusal, named: the kernel's own (kind and packet disagree, an extension
    /// header it does not step over, a partial checksum elsewhere, TCP options making a
    /// packet look larger than it is) and fibre's (fragments, malformed headers).
    #[test]
    fn what_cannot_be_cut_is_refused_by_name() {
        use SegmentError::*;
        let tcp4 = Spec::new(false, true, 3000, 1000).build();
        let tcp6 = Spec::new(true, true, 3000, 1000).build();
        let udp4 = Spec::new(false, false, 3000, 1000).build();
        let with_kind = |(f, o): &(Vec<u8>, Offload), kind| {
            let mut o = *o;
            o.gso = o.gso.map(|g| Gso { kind, ..g });
            segments(f, o)
        };
        let edited = |(f, o): &(Vec<u8>, Offload), at: usize, bytes: &[u8]| {
            let mut f = f.clone();
            f[at..at + bytes.len()].copy_from_slice(bytes);
            segments(&f, *o)
        };
        assert_eq!(segments(&tcp4.0, Offload::NONE), Err(NotGso));
        assert_eq!(edited(&tcp4, 12, &[0x81, 0x00]), Err(NotIp), "VLAN-tagged");
        assert_eq!(edited(&tcp4, 12, &[0x08, 0x06]), Err(NotIp), "ARP");
        assert_eq!(with_kind(&tcp4, GsoKind::Tcp6), Err(WrongFamily));
        assert_eq!(with_kind(&tcp6, GsoKind::Tcp4), Err(WrongFamily));
        assert_eq!(with_kind(&udp4, GsoKind::Tcp4), Err(NotTcp));
        assert_eq!(with_kind(&tcp4, GsoKind::Udp), Err(NotUdp));
        assert_eq!(edited(&tcp4, 20, &[0x20, 0x00]), Err(Fragment), "MF");
        assert_eq!(edited(&tcp4, 20, &[0x00, 0x10]), Err(Fragment), "an offset");
        assert!(edited(&tcp4, 20, &[0x40, 0x00]).is_ok(), "DF alone");
        let mut fragment = Spec::new(true, true, 3000, 1000);
        fragment.extension = Some((44, vec![0, 0, 0, 0, 0, 0, 0, 1]));
        assert_eq!(
            segments(&fragment.build().0, tcp6.1),
            Err(ExtensionHeader(44))
        );
        // Malformed: an IP length past the frame, a zero IPv6 payload length (a
        // jumbogram's), a TCP header shorter than 20 bytes, a UDP length not the
        // datagram's, a segment size of zero, a frame cut inside its headers.
        assert_eq!(edited(&tcp4, 16, &[0x0f, 0xff]), Err(Malformed));
        assert_eq!(edited(&tcp6, 18, &[0, 0]), Err(Malformed));
        assert_eq!(edited(&tcp4, 34 + 12, &[0x40]), Err(Malformed));
        assert_eq!(edited(&udp4, 34 + 4, &[0x0b, 0xb7]), Err(Malformed));
        let mut zero = udp4.1;
        zero.gso = zero.gso.map(|g| Gso { size: 0, ..g });
        assert_eq!(segments(&udp4.0, zero), Err(Malformed));
        assert_eq!(segments(&tcp4.0[..40], tcp4.1), Err(Malformed));
        assert_eq!(segments(&tcp6.0[..60], tcp6.1), Err(Malformed));
        // A partial checksum whose start or field is not the transport header's.
        for (start, offset) in [(30, 20), (34, 6), (34, 18)] {
            let mut o = tcp4.1;
            o.checksum = Some(PartialChecksum { start, offset });
            assert_eq!(segments(&tcp4.0, o), Err(ChecksumPlace));
        }
        // 990 bytes of payload in segments of 995, but 12 bytes of TCP options: the
        // virtio-net header's reader counts 1,002 bytes past 20 of TCP header.
        let mut options = Spec::new(false, true, 990, 995);
        options.tcp_options = vec![1, 1, 8, 10, 1, 2, 3, 4, 5, 6, 7, 8];
        let (f, o) = options.build();
        assert_eq!(segments(&f, o), Err(NotLarger));
        // Counted so it fits: one segment.
        options.tcp_options.truncate(4);
        let (f, o) = options.build();
        assert_eq!(segments(&f, o).map(|s| s.len()), Ok(1));
        for e in [NotGso, ExtensionHeader(44), NotLarger, NoBuffers] {
            assert!(!e.to_string().is_empty());
        }
    }

    /// The super-packets sent through the kernel: a name, what to build, and the
    /// segment (if any) whose checksum is made to come out zero.
    fn kernel_cases() -> Vec<(&'static str, Spec, Option<usize>)> {
        let options = vec![1, 1, 8, 10, 1, 2, 3, 4, 5, 6, 7, 8];
        let mut cases = Vec::new();
        let mut s = Spec::new(false, true, 20000, 1448);
        s.flags = [true, true, true, false, false];
        s.id = 0xfffd;
        s.seq = u32::MAX - 5000;
        cases.push(("TCPv4, FIN PSH CWR, the ID and sequence wrapping", s, None));
        let mut s = Spec::new(false, true, 7777, 1000);
        s.flags = [true, true, false, true, true];
        s.tcp_options = options.clone();
        s.ip_options = vec![0x94, 4, 0, 0];
        s.dont_fragment = false;
        cases.push(("TCPv4, TCP and IPv4 options, no DF, ECE URG", s, None));
        cases.push((
            "TCPv4 in 8,000-byte segments",
            Spec::new(false, true, 30001, 8000),
            None,
        ));
        let s = Spec::new(false, true, 6000, 1400);
        cases.push(("TCPv4, a segment's checksum zero", s, Some(2)));
        let mut s = Spec::new(true, true, 15000, 1440);
        s.flags = [true, true, true, false, false];
        cases.push(("TCPv6, FIN PSH CWR", s, None));
        let mut s = Spec::new(true, true, 5000, 1200);
        s.extension = Some((60, vec![0, 0, 1, 4, 0, 0, 0, 0]));
        cases.push(("TCPv6, a destination options header", s, None));
        let mut s = Spec::new(true, true, 5000, 1200);
        s.extension = Some((43, vec![0, 0, 4, 0, 0, 0, 0, 0]));
        s.tcp_options = options.clone();
        cases.push(("TCPv6, a routing header, TCP options", s, None));
        let mut s = Spec::new(false, false, 12000, 1472);
        s.id = 0xffff;
        cases.push(("UDPv4, the ID wrapping", s, None));
        cases.push(("UDPv6", Spec::new(true, false, 9000, 1232), None));
        let s = Spec::new(false, false, 4000, 1000);
        cases.push(("UDPv4, a segment's checksum zero", s, Some(1)));
        let mut s = Spec::new(false, false, 5000, 1400);
        s.zero_field = true;
        cases.push(("UDPv4, its checksum field zero", s, None));
        let s = Spec::new(true, false, 4000, 1000);
        cases.push(("UDPv6, a segment's checksum zero", s, Some(3)));
        let s = Spec::new(false, true, 500, 1448);
        cases.push(("TCPv4 within one segment, its checksum zero", s, Some(0)));
        cases.push((
            "UDPv6 within one segment",
            Spec::new(true, false, 700, 1000),
            None,
        ));
        let mut s = Spec::new(false, true, 990, 995);
        s.tcp_options = options;
        cases.push(("TCPv4, options past the segment size", s, None));
        cases
    }

    /// Runs `ip netns exec NS ethtool -K DEV ARGS...`.
    fn ethtool(ns: &fibre_testbed::netns::Namespace, dev: &str, args: &[&str]) {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", ns.name(), "ethtool", "-K", dev])
            .args(args)
            .output()
            .expect("ethtool runs");
        assert!(
            out.status.success(),
            "ethtool -K {dev} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A frame of the local experimental EtherType saying case `n` was sent: sent after
    /// each case, so that what arrives before it is all the case made.
    fn marker(n: u16) -> Vec<u8> {
        let mut f = vec![0; 60];
        f[..6].copy_from_slice(&DESTINATION_MAC);
        f[6..12].copy_from_slice(&SOURCE_MAC);
        f[12..14].copy_from_slice(&[0x88, 0xb5]);
        f[14..16].copy_from_slice(&n.to_be_bytes());
        f
    }

    /// The kernel as the judge: super-packets sent out of a veth link that can neither
    /// segment nor checksum (`ethtool -K s0 tso off gso off tx off`), through an
    /// `AF_PACKET` socket with virtio-net headers, as a host behind a veth hands them
    /// over; the kernel cuts them in software (`validate_xmit_skb` → `skb_gso_segment`)
    /// and what arrives on the peer is, byte for byte, what [`segments`] makes of the
    /// same super-packets: TCP over IPv4 and IPv6 (flags, options, extension headers,
    /// wrapping IDs and sequence numbers), UDP over both, checksums coming out zero,
    /// packets within one segment, and one the kernel drops.
    #[test]
    #[ignore = "needs root: a network namespace, a veth pair"]
    fn the_kernel_cuts_super_packets_as_fibre_does() {
        use crate::offload::{VnetHeader, VNET_HEADER_LEN};
        use crate::packet::PacketSocket;
        use std::time::Duration;

        let ns = fibre_testbed::netns::Namespace::create("segment").expect("a namespace");
        ns.batch(
            "link add s0 type veth peer name s1\n\
             link set s0 mtu 9000\nlink set s1 mtu 9000\n\
             link set s0 up\nlink set s1 up\n",
        )
        .unwrap();
        // The test's own reference link: no segmentation and no checksums in "hardware",
        // so that the kernel does both in software before the frames cross.
        let off = [
            "tso",
            "off",
            "gso",
            "off",
            "tx",
            "off",
            "tx-udp-segmentation",
            "off",
        ];
        ethtool(&ns, "s0", &off);
        ethtool(&ns, "s1", &["gro", "off"]);
        ns.wait_up(&["s0", "s1"], Duration::from_secs(5)).unwrap();
        let s0 = ns.ifindex("s0").unwrap();
        let mut cases = kernel_cases();
        for (_, spec, zero) in cases.iter_mut() {
            if let Some(k) = *zero {
                zero_checksum(spec, k);
            }
        }
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    ns.enter().unwrap();
                    // One core: the frames of a case and its marker queue on one CPU's
                    // backlog, in order.
                    core_affinity::set_for_current(core_affinity::CoreId { id: 0 });
                    let receiver = PacketSocket::open_named("s1").unwrap();
                    let sender = PacketSocket::open_for_sending(s0).unwrap();
                    let mut failures = Vec::new();
                    for (n, (name, spec, zero)) in cases.iter().enumerate() {
                        let (frame, offload) = spec.build();
                        let expected = segments(&frame, offload);
                        let gso = offload.gso.unwrap();
                        let c = offload.checksum.unwrap();
                        let l4 = c.start as usize;
                        let header = if spec.tcp {
                            (frame[l4 + 12] >> 4) as usize * 4
                        } else {
                            8
                        };
                        let vnet = VnetHeader {
                            flags: 1, // VIRTIO_NET_HDR_F_NEEDS_CSUM
                            gso_type: match gso.kind {
                                GsoKind::Tcp4 => 1, // VIRTIO_NET_HDR_GSO_TCPV4
                                GsoKind::Tcp6 => 4, // VIRTIO_NET_HDR_GSO_TCPV6
                                GsoKind::Udp => 5,  // VIRTIO_NET_HDR_GSO_UDP_L4
                            },
                            hdr_len: (l4 + header) as u16,
                            gso_size: gso.size,
                            csum_start: c.start,
                            csum_offset: c.offset,
                        };
                        let mut bytes = [0; VNET_HEADER_LEN];
                        vnet.write(&mut bytes);
                        let mut message = bytes.to_vec();
                        message.extend_from_slice(&frame);
                        let sent = sender.send_frame(&message);
                        // The packet the kernel drops may be refused at once.
                        if expected.is_ok() {
                            sent.unwrap_or_else(|e| panic!("{name}: {e}"));
                        }
                        let mut message = vec![0; VNET_HEADER_LEN];
                        message.extend_from_slice(&marker(n as u16));
                        sender.send_frame(&message).unwrap();
                        let mut got = Vec::new();
                        let mut marked = false;
                        while !marked && receiver.wait(Duration::from_secs(2)).unwrap() {
                            while let Some(f) = receiver.receive_frame().unwrap() {
                                if f[6..12] != SOURCE_MAC {
                                    continue;
                                }
                                if f[12..14] == [0x88, 0xb5] {
                                    marked |= f[14..16] == (n as u16).to_be_bytes();
                                    continue;
                                }
                                got.push(f);
                            }
                        }
                        assert!(marked, "{name}: the marker never came");
                        // What fibre makes: the segments, or none for a refusal.
                        let ours = match &expected {
                            Ok(segs) => segs.clone(),
                            Err(e) => {
                                assert_eq!(*e, SegmentError::NotLarger, "{name}");
                                Vec::new()
                            }
                        };
                        if got != ours {
                            let first = got.iter().zip(&ours).position(|(a, b)| a != b);
                            let byte = first.and_then(|k| {
                                got[k].iter().zip(&ours[k]).position(|(a, b)| a != b)
                            });
                            failures.push(format!(
                                "{name}: the kernel sent {} segments, fibre made {}; \
                                 the first that differs: segment {first:?}, byte {byte:?}",
                                got.len(),
                                ours.len(),
                            ));
                        }
                        // The case stands for what it says it does.
                        if let Some(seg) = zero.and_then(|k| got.get(k)) {
                            let field = transport_start(seg) + if spec.tcp { 16 } else { 6 };
                            let kept = if spec.tcp && got.len() > 1 { 0 } else { 0xffff };
                            assert_eq!(word(seg, field), kept, "{name}");
                        }
                    }
                    assert!(failures.is_empty(), "{}", failures.join("\n"));
                })
                .join()
                .unwrap()
        });
    }
}
