//! The input stage: each received Ethernet frame checked as the kernel's `ip_rcv_core`
//! and `ip6_rcv_core` check it, and sorted into a packet to route, one for the kernel, or
//! one dropped with its reason.
//!
//! What fibre forwards it reads here once: the addresses, TTL or hop limit, TOS or
//! traffic class, protocol and ports the route stage asks about. What it does not handle
//! goes to the kernel untouched, so that the kernel stays the control plane: ARP and
//! anything not IP, VLAN-tagged frames, frames sent to a group address, IPv4 with
//! options, IPv6 with a hop-by-hop header (router alert, jumbograms), multicast and
//! IPv6 link-local destinations. A frame for another host is dropped, as the kernel drops
//! it; so is one that fails a check of the kernel's, each reason counted apart, as the
//! kernel counts them (`InHdrErrors`, `InCsumErrors`, `InTruncatedPkts`).
//!
//! Every header is read through the views of `fibre-headers`, checked once for the bytes
//! they read; the lengths they hold are checked here, in the kernel's order.
//!
//! Source addresses the route stage refuses (martians, this host's own) are its to judge,
//! as they are the kernel's route lookup's: the rules and tables decide.

use fibre_fib::LinkIndex;
use fibre_headers::{ipv4, ipv6, transport, EthernetFrame, Ipv4Packet, Ipv6Packet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The link a vector of packets arrived on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arrival {
    /// Its index.
    pub link: LinkIndex,
    /// Its MAC address: frames sent to another are not this host's.
    pub mac: [u8; 6],
}

pub use fibre_headers::ethernet::ethertype::{
    ARP as ETHERTYPE_ARP, IPV4 as ETHERTYPE_IPV4, IPV6 as ETHERTYPE_IPV6, VLAN as ETHERTYPE_VLAN,
};
/// Bytes of an Ethernet header.
pub const ETHERNET_LEN: usize = fibre_headers::ethernet::HEADER_LEN;

/// Why a frame was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Drop {
    /// Shorter than an Ethernet header.
    ShortFrame,
    /// Sent to another host's MAC address (the kernel's `PACKET_OTHERHOST`).
    OtherHost,
    /// Shorter than the IP header's fixed part.
    ShortHeader,
    /// The IP version is not the EtherType's.
    BadVersion,
    /// IPv4: a header length under 20 bytes, or past the frame.
    BadHeaderLength,
    /// IPv4: the header checksum does not hold.
    BadChecksum,
    /// The total (IPv4) or payload (IPv6) length is past the frame, or under the header.
    BadLength,
    /// IPv6: a multicast source address.
    MulticastSource,
    /// IPv6: the loopback address as source or destination, arriving on a link.
    Loopback,
}

impl Drop {
    /// Every reason, in the order of their counters.
    pub const ALL: [Drop; 9] = [
        Drop::ShortFrame,
        Drop::OtherHost,
        Drop::ShortHeader,
        Drop::BadVersion,
        Drop::BadHeaderLength,
        Drop::BadChecksum,
        Drop::BadLength,
        Drop::MulticastSource,
        Drop::Loopback,
    ];

    /// The reason's name in counters.
    pub fn name(self) -> &'static str {
        match self {
            Drop::ShortFrame => "short-frame",
            Drop::OtherHost => "other-host",
            Drop::ShortHeader => "short-header",
            Drop::BadVersion => "bad-version",
            Drop::BadHeaderLength => "bad-header-length",
            Drop::BadChecksum => "bad-checksum",
            Drop::BadLength => "bad-length",
            Drop::MulticastSource => "multicast-source",
            Drop::Loopback => "loopback-address",
        }
    }
}

/// Why a frame goes to the kernel untouched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Not IPv4 or IPv6 (ARP among them).
    NotIp,
    /// VLAN-tagged: the kernel's VLAN links take it.
    Vlan,
    /// Sent to a broadcast or multicast MAC address.
    Group,
    /// IPv4 with options.
    Options,
    /// IPv6 with a hop-by-hop options header (router alert, jumbogram).
    HopByHop,
    /// A multicast or limited-broadcast destination.
    Multicast,
    /// An IPv6 link-local destination.
    LinkLocal,
}

impl Kernel {
    /// Every reason, in the order of their counters.
    pub const ALL: [Kernel; 7] = [
        Kernel::NotIp,
        Kernel::Vlan,
        Kernel::Group,
        Kernel::Options,
        Kernel::HopByHop,
        Kernel::Multicast,
        Kernel::LinkLocal,
    ];

    /// The reason's name in counters.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::NotIp => "not-ip",
            Kernel::Vlan => "vlan",
            Kernel::Group => "group-address",
            Kernel::Options => "ipv4-options",
            Kernel::HopByHop => "ipv6-hop-by-hop",
            Kernel::Multicast => "multicast",
            Kernel::LinkLocal => "link-local",
        }
    }
}

/// An IPv4 packet to route: what the route and rewrite stages need of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet4 {
    /// The source address.
    pub src: Ipv4Addr,
    /// The destination address.
    pub dst: Ipv4Addr,
    /// The time to live, as received.
    pub ttl: u8,
    /// The type of service byte (DSCP and ECN).
    pub tos: u8,
    /// The protocol of the payload.
    pub protocol: u8,
    /// The total length (the frame may carry padding past it).
    pub len: u16,
    /// Don't fragment.
    pub df: bool,
    /// A fragment (more follow, or not the first).
    pub fragment: bool,
    /// TCP, UDP, SCTP or DCCP ports of a first fragment that holds them.
    pub ports: Option<(u16, u16)>,
}

/// An IPv6 packet to route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet6 {
    /// The source address.
    pub src: Ipv6Addr,
    /// The destination address.
    pub dst: Ipv6Addr,
    /// The hop limit, as received.
    pub hop_limit: u8,
    /// The traffic class (DSCP and ECN).
    pub traffic_class: u8,
    /// The flow label.
    pub flow_label: u32,
    /// The next header after the fixed one.
    pub next_header: u8,
    /// The payload length.
    pub len: u16,
    /// TCP, UDP, SCTP or DCCP ports, when they follow the fixed header.
    pub ports: Option<(u16, u16)>,
}

/// What the input stage makes of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    /// An IPv4 packet to route; its header starts at [`ETHERNET_LEN`].
    V4(Packet4),
    /// An IPv6 packet to route; its header starts at [`ETHERNET_LEN`].
    V6(Packet6),
    /// For the kernel, untouched.
    Kernel(Kernel),
    /// Dropped.
    Drop(Drop),
}

/// The destination and source addresses of the IPv4 (`v6` false) or IPv6 packet the
/// Ethernet frame `frame` carries, if its network header is whole.
pub fn addresses(frame: &[u8], v6: bool) -> Option<(IpAddr, IpAddr)> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    let ip = eth.payload();
    if v6 {
        let p = Ipv6Packet::new_checked(ip).ok()?;
        Some((IpAddr::V6(p.destination()), IpAddr::V6(p.source())))
    } else {
        let p = Ipv4Packet::new_checked(ip).ok()?;
        Some((IpAddr::V4(p.destination()), IpAddr::V4(p.source())))
    }
}

/// Checks and sorts `frame`, received on a link whose MAC address is `mac`.
pub fn classify(frame: &[u8], mac: [u8; 6]) -> Input {
    sort(frame, mac)
}

/// [`classify`], its findings written into `out`: the pipeline's way, which writes them
/// straight into the vector's record (a record returned, then copied, is read back whole
/// just after it was stored in parts, and the CPU stalls on it).
#[inline(never)]
pub fn classify_into(frame: &[u8], mac: [u8; 6], out: &mut Input) {
    *out = sort(frame, mac);
}

#[inline(always)]
fn sort(frame: &[u8], mac: [u8; 6]) -> Input {
    let Ok(eth) = EthernetFrame::new_checked(frame) else {
        return Input::Drop(Drop::ShortFrame);
    };
    let ethertype = eth.ethertype();
    if ETHERTYPE_VLAN.contains(&ethertype) {
        return Input::Kernel(Kernel::Vlan);
    }
    if ethertype != ETHERTYPE_IPV4 && ethertype != ETHERTYPE_IPV6 {
        return Input::Kernel(Kernel::NotIp);
    }
    if eth.destination() != mac {
        // The group bit: broadcast and multicast frames are the kernel's.
        return if eth.to_group() {
            Input::Kernel(Kernel::Group)
        } else {
            Input::Drop(Drop::OtherHost)
        };
    }
    if ethertype == ETHERTYPE_IPV4 {
        ipv4(eth.payload())
    } else {
        ipv6(eth.payload())
    }
}

/// `ip_rcv_core`'s checks, in its order.
#[inline(always)]
fn ipv4(ip: &[u8]) -> Input {
    let Ok(p) = Ipv4Packet::new_checked(ip) else {
        return Input::Drop(Drop::ShortHeader);
    };
    if p.version() != 4 {
        return Input::Drop(Drop::BadVersion);
    }
    let header_len = p.header_len();
    if header_len < ipv4::HEADER_LEN || header_len > ip.len() {
        return Input::Drop(Drop::BadHeaderLength);
    }
    if !p.checksum_holds() {
        return Input::Drop(Drop::BadChecksum);
    }
    let len = p.total_len();
    if (len as usize) > ip.len() || (len as usize) < header_len {
        return Input::Drop(Drop::BadLength);
    }
    let dst = p.destination();
    if dst.is_multicast() || dst.is_broadcast() {
        return Input::Kernel(Kernel::Multicast);
    }
    if header_len > ipv4::HEADER_LEN {
        return Input::Kernel(Kernel::Options);
    }
    let protocol = p.protocol();
    let ports = if p.fragment_offset() == 0 && transport::has_ports(protocol) {
        transport::ports(p.payload())
    } else {
        None
    };
    Input::V4(Packet4 {
        src: p.source(),
        dst,
        ttl: p.ttl(),
        tos: p.tos(),
        protocol,
        len,
        df: p.dont_fragment(),
        fragment: p.is_fragment(),
        ports,
    })
}

/// `ip6_rcv_core`'s checks, in its order.
#[inline(always)]
fn ipv6(ip: &[u8]) -> Input {
    let Ok(p) = Ipv6Packet::new_checked(ip) else {
        return Input::Drop(Drop::ShortHeader);
    };
    if p.version() != 6 {
        return Input::Drop(Drop::BadVersion);
    }
    let (src, dst) = (p.source(), p.destination());
    if src.is_multicast() {
        return Input::Drop(Drop::MulticastSource);
    }
    if src.is_loopback() || dst.is_loopback() {
        return Input::Drop(Drop::Loopback);
    }
    let next_header = p.next_header();
    let len = p.payload_len();
    if next_header == ipv6::next::HOP_BY_HOP {
        // Hop-by-hop options, a jumbogram's length among them: the kernel's.
        return Input::Kernel(Kernel::HopByHop);
    }
    if ipv6::HEADER_LEN + len as usize > ip.len() {
        return Input::Drop(Drop::BadLength);
    }
    if dst.is_multicast() {
        return Input::Kernel(Kernel::Multicast);
    }
    if dst.segments()[0] & 0xffc0 == 0xfe80 {
        return Input::Kernel(Kernel::LinkLocal);
    }
    let ports = if transport::has_ports(next_header) {
        transport::ports(p.payload())
    } else {
        None
    };
    Input::V6(Packet6 {
        src,
        dst,
        hop_limit: p.hop_limit(),
        traffic_class: p.traffic_class(),
        flow_label: p.flow_label(),
        next_header,
        len,
        ports,
    })
}

/// The input stage's counters: frames sorted each way, drops and hand-overs by reason.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// IPv4 packets to route.
    pub v4: u64,
    /// IPv6 packets to route.
    pub v6: u64,
    /// Frames for the kernel, by [`Kernel::ALL`]'s order.
    pub kernel: [u64; Kernel::ALL.len()],
    /// Frames dropped, by [`Drop::ALL`]'s order.
    pub dropped: [u64; Drop::ALL.len()],
}

impl Counters {
    /// Counts what the stage made of one frame.
    pub fn count(&mut self, input: &Input) {
        match input {
            Input::V4(_) => self.v4 += 1,
            Input::V6(_) => self.v6 += 1,
            Input::Kernel(k) => {
                self.kernel[Kernel::ALL.iter().position(|x| x == k).unwrap_or(0)] += 1
            }
            Input::Drop(d) => self.dropped[Drop::ALL.iter().position(|x| x == d).unwrap_or(0)] += 1,
        }
    }

    /// The counters with their names: `v4`, `v6`, `kernel:REASON`, `drop:REASON`.
    pub fn named(&self) -> Vec<(String, u64)> {
        let mut out = vec![("v4".to_string(), self.v4), ("v6".to_string(), self.v6)];
        out.extend(
            Kernel::ALL
                .iter()
                .zip(self.kernel)
                .map(|(k, n)| (format!("kernel:{}", k.name()), n)),
        );
        out.extend(
            Drop::ALL
                .iter()
                .zip(self.dropped)
                .map(|(d, n)| (format!("drop:{}", d.name()), n)),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::PacketBuilder;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    const OURS: [u8; 6] = [0x02, 0, 0, 0, 0, 1];
    const THEIRS: [u8; 6] = [0x02, 0, 0, 0, 0, 2];

    fn udp4(src: [u8; 4], dst: [u8; 4], ttl: u8, ports: (u16, u16), payload: usize) -> Vec<u8> {
        let b = PacketBuilder::ethernet2(THEIRS, OURS)
            .ipv4(src, dst, ttl)
            .udp(ports.0, ports.1);
        let mut out = Vec::with_capacity(b.size(payload));
        b.write(&mut out, &vec![0xab; payload]).unwrap();
        out
    }

    fn tcp6(src: [u8; 16], dst: [u8; 16], hops: u8, ports: (u16, u16), payload: usize) -> Vec<u8> {
        let b = PacketBuilder::ethernet2(THEIRS, OURS)
            .ipv6(src, dst, hops)
            .tcp(ports.0, ports.1, 7, 1024);
        let mut out = Vec::with_capacity(b.size(payload));
        b.write(&mut out, &vec![0xcd; payload]).unwrap();
        out
    }

    /// Sets an IPv4 header's checksum right again after a test changed it.
    fn fix_checksum(frame: &mut [u8]) {
        let len = (frame[ETHERNET_LEN] & 0xf) as usize * 4;
        let h = &mut frame[ETHERNET_LEN..ETHERNET_LEN + len];
        h[10] = 0;
        h[11] = 0;
        let c = fibre_headers::checksum::checksum(h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
    }

    /// Packets etherparse builds are read back with the fields it wrote, ports and all.
    #[test]
    fn packets_are_read_as_they_were_built() {
        let mut rng = StdRng::seed_from_u64(5);
        for _ in 0..2000 {
            let (src, dst): ([u8; 4], [u8; 4]) = (rng.gen(), [10, rng.gen(), rng.gen(), rng.gen()]);
            let (ttl, ports, payload) = (rng.gen(), rng.gen(), rng.gen_range(0..64));
            let frame = udp4(src, dst, ttl, ports, payload);
            let Input::V4(p) = classify(&frame, OURS) else {
                panic!("{:?}", classify(&frame, OURS));
            };
            assert_eq!((p.src.octets(), p.dst.octets(), p.ttl), (src, dst, ttl));
            assert_eq!(
                (p.protocol, p.ports, p.len as usize),
                (17, Some(ports), 28 + payload)
            );
            assert!(!p.fragment);
            let src: [u8; 16] = [0x20, 0x01, 0xd, 0xb8]
                .into_iter()
                .chain(rng.gen::<[u8; 12]>())
                .collect::<Vec<_>>()
                .try_into()
                .unwrap();
            let dst: [u8; 16] = [0x20, 0x01, 0xd, 0xb9]
                .into_iter()
                .chain(rng.gen::<[u8; 12]>())
                .collect::<Vec<_>>()
                .try_into()
                .unwrap();
            let frame = tcp6(src, dst, ttl, ports, payload);
            let Input::V6(p) = classify(&frame, OURS) else {
                panic!("{:?}", classify(&frame, OURS));
            };
            assert_eq!(
                (p.src.octets(), p.dst.octets(), p.hop_limit),
                (src, dst, ttl)
            );
            assert_eq!(
                (p.next_header, p.ports, p.len as usize),
                (6, Some(ports), 20 + payload)
            );
        }
        // Ethernet padding past the total length is allowed, as the kernel trims it.
        let mut padded = udp4([192, 0, 2, 1], [10, 0, 0, 1], 64, (1, 2), 0);
        padded.extend([0; 18]);
        assert!(matches!(classify(&padded, OURS), Input::V4(_)));
    }

    /// Each check of the kernel's fails on its own malformation, with its reason; what
    /// fibre does not forward goes to the kernel, with its reason.
    #[test]
    fn each_check_names_its_reason() {
        let good4 = udp4([192, 0, 2, 1], [10, 0, 0, 1], 64, (53, 53), 8);
        let good6 = tcp6(
            "2001:db8::1".parse::<Ipv6Addr>().unwrap().octets(),
            "2001:db8:1::1".parse::<Ipv6Addr>().unwrap().octets(),
            64,
            (1, 2),
            8,
        );
        let with = |base: &[u8], f: &dyn Fn(&mut Vec<u8>)| {
            let mut v = base.to_vec();
            f(&mut v);
            classify(&v, OURS)
        };
        let e = ETHERNET_LEN;
        let cases: Vec<(&str, Input, Input)> = vec![
            (
                "short frame",
                classify(&good4[..13], OURS),
                Input::Drop(Drop::ShortFrame),
            ),
            (
                "another host's MAC",
                with(&good4, &|v| v[5] = 9),
                Input::Drop(Drop::OtherHost),
            ),
            (
                "broadcast MAC",
                with(&good4, &|v| v[..6].fill(0xff)),
                Input::Kernel(Kernel::Group),
            ),
            (
                "ARP",
                with(&good4, &|v| v[12..14].copy_from_slice(&[8, 6])),
                Input::Kernel(Kernel::NotIp),
            ),
            (
                "VLAN",
                with(&good4, &|v| v[12..14].copy_from_slice(&[0x81, 0])),
                Input::Kernel(Kernel::Vlan),
            ),
            (
                "IPv4 short header",
                classify(&good4[..e + 19], OURS),
                Input::Drop(Drop::ShortHeader),
            ),
            (
                "IPv4 version 6",
                with(&good4, &|v| {
                    v[e] = 0x65;
                    fix_checksum(v)
                }),
                Input::Drop(Drop::BadVersion),
            ),
            (
                "IPv4 IHL 4",
                with(&good4, &|v| v[e] = 0x44),
                Input::Drop(Drop::BadHeaderLength),
            ),
            (
                "IPv4 IHL past the frame",
                with(&good4[..e + 24], &|v| v[e] = 0x47),
                Input::Drop(Drop::BadHeaderLength),
            ),
            (
                "IPv4 checksum",
                with(&good4, &|v| v[e + 10] ^= 1),
                Input::Drop(Drop::BadChecksum),
            ),
            (
                "IPv4 total past the frame",
                with(&good4, &|v| {
                    v[e + 3] += 1;
                    fix_checksum(v)
                }),
                Input::Drop(Drop::BadLength),
            ),
            (
                "IPv4 total under the header",
                with(&good4, &|v| {
                    v[e + 2] = 0;
                    v[e + 3] = 19;
                    fix_checksum(v)
                }),
                Input::Drop(Drop::BadLength),
            ),
            (
                "IPv4 multicast",
                with(&good4, &|v| {
                    v[e + 16] = 239;
                    fix_checksum(v)
                }),
                Input::Kernel(Kernel::Multicast),
            ),
            (
                "IPv4 broadcast",
                with(&good4, &|v| {
                    v[e + 16..e + 20].fill(255);
                    fix_checksum(v)
                }),
                Input::Kernel(Kernel::Multicast),
            ),
            (
                "IPv4 options",
                with(&good4, &|v| {
                    // A no-op option word after the fixed header, the lengths grown by 4.
                    v.splice(e + 20..e + 20, [1, 1, 1, 1]);
                    v[e] = 0x46;
                    v[e + 3] += 4;
                    fix_checksum(v)
                }),
                Input::Kernel(Kernel::Options),
            ),
            (
                "IPv6 short header",
                classify(&good6[..e + 39], OURS),
                Input::Drop(Drop::ShortHeader),
            ),
            (
                "IPv6 version 4",
                with(&good6, &|v| v[e] = 0x40),
                Input::Drop(Drop::BadVersion),
            ),
            (
                "IPv6 multicast source",
                with(&good6, &|v| v[e + 8] = 0xff),
                Input::Drop(Drop::MulticastSource),
            ),
            (
                "IPv6 loopback",
                with(&good6, &|v| {
                    v[e + 24..e + 40].fill(0);
                    v[e + 39] = 1
                }),
                Input::Drop(Drop::Loopback),
            ),
            (
                "IPv6 hop-by-hop",
                with(&good6, &|v| v[e + 6] = 0),
                Input::Kernel(Kernel::HopByHop),
            ),
            (
                "IPv6 payload past the frame",
                with(&good6, &|v| v[e + 5] += 1),
                Input::Drop(Drop::BadLength),
            ),
            (
                "IPv6 multicast",
                with(&good6, &|v| v[e + 24] = 0xff),
                Input::Kernel(Kernel::Multicast),
            ),
            (
                "IPv6 link-local",
                with(&good6, &|v| {
                    v[e + 24..e + 26].copy_from_slice(&[0xfe, 0x80])
                }),
                Input::Kernel(Kernel::LinkLocal),
            ),
        ];
        for (what, got, want) in cases {
            assert_eq!(got, want, "{what}");
        }
        // Fragments: forwarded, ports only from the first.
        let first = with(&good4, &|v| {
            v[e + 6] = 0x20;
            fix_checksum(v)
        });
        assert!(
            matches!(first, Input::V4(p) if p.fragment && p.ports == Some((53, 53))),
            "{first:?}"
        );
        let later = with(&good4, &|v| {
            v[e + 7] = 1;
            fix_checksum(v)
        });
        assert!(
            matches!(later, Input::V4(p) if p.fragment && p.ports.is_none()),
            "{later:?}"
        );
    }

    /// Every truncation of good packets, and random bytes, are sorted without a panic; a
    /// frame cut inside its IP packet is never forwarded.
    #[test]
    fn cut_and_random_frames_never_panic() {
        let good4 = udp4([192, 0, 2, 1], [10, 0, 0, 1], 64, (53, 53), 30);
        let good6 = tcp6(
            [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            [0x20, 1, 0xd, 0xb8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            64,
            (1, 2),
            30,
        );
        for good in [good4, good6] {
            for cut in 0..good.len() {
                let got = classify(&good[..cut], OURS);
                assert!(matches!(got, Input::Drop(_)), "cut at {cut}: {got:?}");
            }
        }
        let mut rng = StdRng::seed_from_u64(9);
        let mut counters = Counters::default();
        for _ in 0..100_000 {
            let len = rng.gen_range(0..120);
            let mut frame: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            if len >= 14 {
                frame[..6].copy_from_slice(&OURS);
                frame[12..14].copy_from_slice(if rng.gen() { &[8, 0] } else { &[0x86, 0xdd] });
            }
            counters.count(&classify(&frame, OURS));
        }
        let named = counters.named();
        let total: u64 = named.iter().map(|(_, n)| n).sum();
        assert_eq!(total, 100_000);
        assert!(
            named
                .iter()
                .any(|(k, n)| k == "drop:bad-checksum" && *n > 0),
            "{named:?}"
        );
    }
}
