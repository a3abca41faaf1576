//! The views read what `etherparse` wrote, field by field, for random packets of every
//! kind; what they write, `etherparse` reads back; and no buffer too short for a header
//! makes a view.

use etherparse::{
    Icmpv4Type, Icmpv6Type, IpFragOffset, IpHeaders, IpNumber, Ipv4Dscp, Ipv4Ecn, Ipv4Header,
    Ipv6FlowLabel, Ipv6Header, PacketBuilder, SlicedPacket, TransportSlice,
};
use fibre_headers::{
    checksum, ethernet, EthernetFrame, IcmpMessage, Ipv4Packet, Ipv6Packet, TcpSegment, UdpDatagram,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::net::{Ipv4Addr, Ipv6Addr};

/// A random frame: IPv4 or IPv6, carrying UDP, TCP or ICMP, and what was put in it.
struct Made {
    frame: Vec<u8>,
    macs: ([u8; 6], [u8; 6]),
    ttl: u8,
    v4: Option<([u8; 4], [u8; 4])>,
    v6: Option<([u8; 16], [u8; 16])>,
    payload: usize,
    /// IPv4: identification, DF, TOS, and (MF, offset) for a fragment.
    ident: u16,
    df: bool,
    tos: u8,
    fragment: Option<(bool, u16)>,
    /// IPv6: traffic class and flow label.
    class: u8,
    flow: u32,
}

fn random(rng: &mut StdRng, kind: u8) -> Made {
    let macs: ([u8; 6], [u8; 6]) = (rng.gen(), rng.gen());
    let ttl: u8 = rng.gen();
    let payload: Vec<u8> = (0..rng.gen_range(0..200)).map(|_| rng.gen()).collect();
    let (v4, v6) = if rng.gen() {
        (Some((rng.gen::<[u8; 4]>(), rng.gen::<[u8; 4]>())), None)
    } else {
        (None, Some((rng.gen::<[u8; 16]>(), rng.gen::<[u8; 16]>())))
    };
    let (ident, df, tos) = (rng.gen::<u16>(), rng.gen::<bool>(), rng.gen::<u8>());
    let fragment = (v4.is_some() && rng.gen_range(0..4) == 0)
        .then(|| (rng.gen::<bool>(), rng.gen_range(1..8191u16)));
    let (class, flow) = (rng.gen::<u8>(), rng.gen_range(0..1u32 << 20));
    let headers = match (v4, v6) {
        (Some((s, d)), _) => {
            let mut h = Ipv4Header::new(0, ttl, IpNumber(0), s, d).unwrap();
            h.identification = ident;
            h.dont_fragment = df;
            h.dscp = Ipv4Dscp::try_new(tos >> 2).unwrap();
            h.ecn = Ipv4Ecn::try_new(tos & 3).unwrap();
            if let Some((more, offset)) = fragment {
                h.more_fragments = more;
                h.fragment_offset = IpFragOffset::try_new(offset).unwrap();
            }
            IpHeaders::Ipv4(h, Default::default())
        }
        (_, Some((s, d))) => IpHeaders::Ipv6(
            Ipv6Header {
                traffic_class: class,
                flow_label: Ipv6FlowLabel::try_new(flow).unwrap(),
                payload_length: 0,
                next_header: IpNumber(0),
                hop_limit: ttl,
                source: s,
                destination: d,
            },
            Default::default(),
        ),
        _ => unreachable!(),
    };
    let ip = PacketBuilder::ethernet2(macs.0, macs.1).ip(headers);
    let mut frame = Vec::new();
    match kind % 3 {
        0 => ip
            .udp(rng.gen(), rng.gen())
            .write(&mut frame, &payload)
            .unwrap(),
        1 => ip
            .tcp(rng.gen(), rng.gen(), rng.gen(), rng.gen())
            .syn()
            .ack(rng.gen())
            .write(&mut frame, &payload)
            .unwrap(),
        _ => {
            let echo = etherparse::IcmpEchoHeader {
                id: rng.gen(),
                seq: rng.gen(),
            };
            if v4.is_some() {
                ip.icmpv4(Icmpv4Type::EchoRequest(echo))
                    .write(&mut frame, &payload)
                    .unwrap()
            } else {
                ip.icmpv6(Icmpv6Type::EchoRequest(echo))
                    .write(&mut frame, &payload)
                    .unwrap()
            }
        }
    }
    Made {
        frame,
        macs,
        ttl,
        v4,
        v6,
        payload: payload.len(),
        ident,
        df,
        tos,
        fragment,
        class,
        flow,
    }
}

/// Every field a view reads is what etherparse wrote, or reads back, for 5,000 random
/// frames.
#[test]
fn views_read_what_etherparse_wrote() {
    let mut rng = StdRng::seed_from_u64(36);
    for round in 0..5_000u32 {
        let made = random(&mut rng, round as u8);
        let frame = &made.frame;
        let parsed = SlicedPacket::from_ethernet(frame).unwrap();
        let eth = EthernetFrame::new_checked(&frame[..]).unwrap();
        assert_eq!((eth.source(), eth.destination()), made.macs);
        assert_eq!(eth.to_group(), made.macs.1[0] & 1 == 1);
        let ip = eth.payload();
        let l4 = match (made.v4, made.v6) {
            (Some((s, d)), _) => {
                assert_eq!(eth.ethertype(), ethernet::ethertype::IPV4);
                let p = Ipv4Packet::new_checked(ip).unwrap();
                let theirs = match &parsed.net {
                    Some(etherparse::NetSlice::Ipv4(h)) => h.header().to_header(),
                    other => panic!("{other:?}"),
                };
                assert_eq!(
                    (p.source(), p.destination()),
                    (Ipv4Addr::from(s), Ipv4Addr::from(d))
                );
                assert_eq!((p.version(), p.header_len(), p.ttl()), (4, 20, made.ttl));
                assert_eq!(p.total_len(), theirs.total_len);
                assert_eq!(p.ident(), theirs.identification);
                assert_eq!(
                    (p.ident(), p.dont_fragment(), p.tos()),
                    (made.ident, made.df, made.tos)
                );
                assert_eq!(p.protocol(), theirs.protocol.0);
                assert_eq!(p.checksum(), theirs.header_checksum);
                let (more, offset) = made.fragment.unwrap_or((false, 0));
                assert_eq!((p.more_fragments(), p.fragment_offset()), (more, offset));
                assert_eq!(p.is_fragment(), made.fragment.is_some());
                assert!(p.checksum_holds());
                assert!(p.to_string().contains(&Ipv4Addr::from(s).to_string()));
                assert_eq!(p.payload().len(), usize::from(p.total_len()) - 20);
                p.payload().to_vec()
            }
            (_, Some((s, d))) => {
                assert_eq!(eth.ethertype(), ethernet::ethertype::IPV6);
                let p = Ipv6Packet::new_checked(ip).unwrap();
                let theirs = match &parsed.net {
                    Some(etherparse::NetSlice::Ipv6(h)) => h.header().to_header(),
                    other => panic!("{other:?}"),
                };
                assert_eq!(
                    (p.source(), p.destination()),
                    (Ipv6Addr::from(s), Ipv6Addr::from(d))
                );
                assert_eq!((p.version(), p.hop_limit()), (6, made.ttl));
                assert_eq!(p.payload_len(), theirs.payload_length);
                assert_eq!(p.next_header(), theirs.next_header.0);
                assert_eq!(p.traffic_class(), theirs.traffic_class);
                assert_eq!(p.flow_label(), theirs.flow_label.value());
                assert_eq!((p.traffic_class(), p.flow_label()), (made.class, made.flow));
                assert_eq!(p.payload().len(), usize::from(p.payload_len()));
                p.payload().to_vec()
            }
            _ => unreachable!(),
        };
        if made.fragment.is_some() {
            // A fragment's transport is not read (etherparse leaves it unparsed too).
            continue;
        }
        match parsed.transport {
            Some(TransportSlice::Udp(u)) => {
                let v = UdpDatagram::new_checked(&l4[..]).unwrap();
                assert_eq!(
                    (v.source_port(), v.destination_port()),
                    (u.source_port(), u.destination_port())
                );
                assert_eq!((v.len(), v.checksum()), (u.length(), u.checksum()));
                assert_eq!(usize::from(v.len()), 8 + made.payload);
            }
            Some(TransportSlice::Tcp(t)) => {
                let v = TcpSegment::new_checked(&l4[..]).unwrap();
                assert_eq!(
                    (v.source_port(), v.destination_port()),
                    (t.source_port(), t.destination_port())
                );
                assert_eq!(
                    (v.sequence(), v.acknowledgment()),
                    (t.sequence_number(), t.acknowledgment_number())
                );
                assert_eq!((v.window(), v.checksum()), (t.window_size(), t.checksum()));
                assert_eq!(v.header_len(), usize::from(t.data_offset()) * 4);
                use fibre_headers::tcp::flags::*;
                assert_eq!(v.flags() & (SYN | ACK | FIN | RST), SYN | ACK);
            }
            Some(TransportSlice::Icmpv4(i)) => {
                let v = IcmpMessage::new_checked(&l4[..]).unwrap();
                assert_eq!(
                    (v.kind(), v.code(), v.checksum()),
                    (i.type_u8(), i.code_u8(), i.checksum())
                );
                assert_eq!(v.body().len(), made.payload);
                assert!(checksum::holds(&l4));
            }
            Some(TransportSlice::Icmpv6(i)) => {
                let v = IcmpMessage::new_checked(&l4[..]).unwrap();
                assert_eq!(
                    (v.kind(), v.code(), v.checksum()),
                    (i.type_u8(), i.code_u8(), i.checksum())
                );
                let (s, d) = made.v6.unwrap();
                let sum = checksum::pseudo_header_sum(&s, &d, 58, l4.len() as u32);
                assert_eq!(checksum::add(sum, checksum::sum(&l4)), 0xffff);
            }
            other => panic!("{other:?}"),
        }
    }
}

/// What the setters write, etherparse reads; a TTL taken down keeps the checksum whole.
#[test]
fn views_write_what_etherparse_reads() {
    let mut rng = StdRng::seed_from_u64(37);
    for round in 0..2_000u32 {
        let mut made = random(&mut rng, (round % 3) as u8);
        let (dst, src): ([u8; 6], [u8; 6]) = (rng.gen(), rng.gen());
        let mut eth = EthernetFrame::new_checked(&mut made.frame[..]).unwrap();
        eth.set_destination(dst);
        eth.set_source(src);
        let v4 = made.v4.is_some();
        let (a, b): ([u8; 16], [u8; 16]) = (rng.gen(), rng.gen());
        if v4 {
            let mut p = Ipv4Packet::new_checked(eth.payload_mut()).unwrap();
            let ttl = p.ttl();
            assert_eq!(p.decrement_ttl(), ttl != 0);
            assert!(p.checksum_holds());
            // The incremental update is the checksum etherparse computes whole.
            let h = etherparse::Ipv4HeaderSlice::from_slice(p.as_bytes())
                .unwrap()
                .to_header();
            assert_eq!(h.header_checksum, h.calc_header_checksum());
            p.set_source(Ipv4Addr::new(a[0], a[1], a[2], a[3]));
            p.set_destination(Ipv4Addr::new(b[0], b[1], b[2], b[3]));
            p.set_tos(a[4]);
            p.set_ident(7);
            p.set_flags_and_offset(fibre_headers::ipv4::DONT_FRAGMENT);
            p.fill_checksum();
            assert!(p.checksum_holds());
        } else {
            let mut p = Ipv6Packet::new_checked(eth.payload_mut()).unwrap();
            let hops = p.hop_limit();
            assert_eq!(p.decrement_hop_limit(), hops != 0);
            p.set_source(Ipv6Addr::from(a));
            p.set_destination(Ipv6Addr::from(b));
            p.set_version_class_flow(a[4], 0x12345);
        }
        let parsed = SlicedPacket::from_ethernet(&made.frame).unwrap();
        match parsed.link {
            Some(etherparse::LinkSlice::Ethernet2(e)) => {
                assert_eq!((e.destination(), e.source()), (dst, src));
            }
            other => panic!("{other:?}"),
        }
        match parsed.net {
            Some(etherparse::NetSlice::Ipv4(h)) => {
                let h = h.header().to_header();
                assert_eq!(
                    (h.source, h.destination, h.dont_fragment),
                    ([a[0], a[1], a[2], a[3]], [b[0], b[1], b[2], b[3]], true)
                );
                assert_eq!(
                    (h.identification, h.dscp.value() << 2 | h.ecn.value()),
                    (7, a[4])
                );
                assert_eq!(h.header_checksum, h.calc_header_checksum());
                assert_eq!(h.time_to_live, made.ttl.saturating_sub(1));
            }
            Some(etherparse::NetSlice::Ipv6(h)) => {
                let h = h.header().to_header();
                assert_eq!((h.source, h.destination), (a, b));
                assert_eq!((h.traffic_class, h.flow_label.value()), (a[4], 0x12345));
                assert_eq!(h.hop_limit, made.ttl.saturating_sub(1));
            }
            other => panic!("{other:?}"),
        }
    }
}

/// A buffer one byte too short for a header makes no view, and says which header and
/// how short; one long enough does, and reading every field of it cannot panic, however
/// its lengths lie.
#[test]
fn short_buffers_make_no_view_and_lying_lengths_read_safely() {
    let bytes = [0xffu8; 64];
    let lens = [
        ("Ethernet", 14),
        ("IPv4", 20),
        ("IPv6", 40),
        ("UDP", 8),
        ("TCP", 20),
        ("ICMP", 8),
    ];
    for (header, len) in lens {
        let short = &bytes[..len - 1];
        let err = match header {
            "Ethernet" => EthernetFrame::new_checked(short).map(|_| ()),
            "IPv4" => Ipv4Packet::new_checked(short).map(|_| ()),
            "IPv6" => Ipv6Packet::new_checked(short).map(|_| ()),
            "UDP" => UdpDatagram::new_checked(short).map(|_| ()),
            "TCP" => TcpSegment::new_checked(short).map(|_| ()),
            _ => IcmpMessage::new_checked(short).map(|_| ()),
        }
        .unwrap_err();
        assert_eq!((err.header, err.needs, err.had), (header, len, len - 1));
        assert!(err.to_string().contains(header));
        let exact = &bytes[..len];
        let whole = match header {
            "Ethernet" => EthernetFrame::new_checked(exact).is_ok(),
            "IPv4" => Ipv4Packet::new_checked(exact).is_ok(),
            "IPv6" => Ipv6Packet::new_checked(exact).is_ok(),
            "UDP" => UdpDatagram::new_checked(exact).is_ok(),
            "TCP" => TcpSegment::new_checked(exact).is_ok(),
            _ => IcmpMessage::new_checked(exact).is_ok(),
        };
        assert!(
            whole,
            "{header}: a buffer of exactly {len} bytes makes a view"
        );
    }
    let mut rng = StdRng::seed_from_u64(38);
    for _ in 0..20_000 {
        let len = rng.gen_range(20..80);
        let mut b: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        let _ = (p.header(), p.payload(), p.checksum_holds(), p.to_string());
        let mut p = Ipv4Packet::new_checked(&mut b[..]).unwrap();
        p.fill_checksum();
        let _ = p.payload_mut().len();
        if len >= 40 {
            let p = Ipv6Packet::new_checked(&b[..]).unwrap();
            let _ = (p.payload(), p.end(), p.to_string());
        }
    }
}

/// The transport views' setters write what etherparse reads, field by field, for
/// random values.
#[test]
fn transport_setters_write_what_etherparse_reads() {
    let mut rng = StdRng::seed_from_u64(39);
    for _ in 0..2_000 {
        let mut b = [0u8; 20];
        let mut t = TcpSegment::new_checked(&mut b[..]).unwrap();
        let (sp, dp, seq, ack, win, sum, urg): (u16, u16, u32, u32, u16, u16, u16) = (
            rng.gen(),
            rng.gen(),
            rng.gen(),
            rng.gen(),
            rng.gen(),
            rng.gen(),
            rng.gen(),
        );
        let flags = rng.gen::<u8>() & 0x3f;
        t.set_source_port(sp);
        t.set_destination_port(dp);
        t.set_sequence(seq);
        t.set_acknowledgment(ack);
        t.set_header_len(20);
        t.set_flags(flags);
        t.set_window(win);
        t.set_checksum(sum);
        t.set_urgent(urg);
        let h = etherparse::TcpHeaderSlice::from_slice(&b).unwrap();
        assert_eq!((h.source_port(), h.destination_port()), (sp, dp));
        assert_eq!((h.sequence_number(), h.acknowledgment_number()), (seq, ack));
        assert_eq!(
            (h.window_size(), h.checksum(), h.urgent_pointer()),
            (win, sum, urg)
        );
        assert_eq!(h.data_offset(), 5);
        use fibre_headers::tcp::flags::*;
        assert_eq!(
            (h.fin(), h.syn(), h.rst(), h.psh(), h.ack(), h.urg()),
            (
                flags & FIN != 0,
                flags & SYN != 0,
                flags & RST != 0,
                flags & PSH != 0,
                flags & ACK != 0,
                flags & URG != 0
            )
        );
        let mut b = [0u8; 8];
        let mut u = UdpDatagram::new_checked(&mut b[..]).unwrap();
        u.set_source_port(sp);
        u.set_destination_port(dp);
        u.set_len(win);
        u.set_checksum(sum);
        let h = etherparse::UdpHeaderSlice::from_slice(&b).unwrap();
        assert_eq!((h.source_port(), h.destination_port()), (sp, dp));
        assert_eq!((h.length(), h.checksum()), (win, sum));
        let mut b = [0u8; 8];
        let mut i = IcmpMessage::new_checked(&mut b[..]).unwrap();
        i.set_kind_and_code(11, (sp % 2) as u8);
        i.set_checksum(sum);
        i.set_rest(seq);
        let h = etherparse::Icmpv4Slice::from_slice(&b).unwrap();
        assert_eq!(
            (h.type_u8(), h.code_u8(), h.checksum()),
            (11, (sp % 2) as u8, sum)
        );
        assert_eq!(u32::from_be_bytes(h.bytes5to8()), seq);
    }
}

/// An extension header's length counts as RFC 8200 and RFC 4302 count it, by the kind
/// that named it; a fragment header's fields read as written.
#[test]
fn ipv6_extension_and_fragment_headers_read_as_written() {
    use fibre_headers::ipv6::next;
    use fibre_headers::{Ipv6Extension, Ipv6Fragment};
    let e = Ipv6Extension::new_checked(&[17u8, 3][..]).unwrap();
    assert_eq!(e.next_header(), 17);
    assert_eq!(e.len(next::ROUTING), 32);
    assert_eq!(e.len(next::DESTINATION_OPTIONS), 32);
    assert_eq!(e.len(next::HOP_BY_HOP), 32);
    assert_eq!(e.len(next::AUTHENTICATION), 20);
    assert_eq!(e.len(next::FRAGMENT), 8);
    let mut rng = StdRng::seed_from_u64(40);
    for _ in 0..1_000 {
        let (offset, more, ident): (u16, bool, u32) =
            (rng.gen_range(0..8192), rng.gen(), rng.gen());
        let mut b = [0u8; 8];
        b[0] = 6;
        b[2..4].copy_from_slice(&(offset << 3 | u16::from(more)).to_be_bytes());
        b[4..8].copy_from_slice(&ident.to_be_bytes());
        let f = Ipv6Fragment::new_checked(&b[..]).unwrap();
        assert_eq!(
            (f.next_header(), f.offset(), f.more_fragments(), f.ident()),
            (6, offset, more, ident)
        );
    }
    assert!(Ipv6Fragment::new_checked(&[0u8; 7][..]).is_err());
}
