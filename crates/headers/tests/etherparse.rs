//! The views read what `etherparse` wrote, field by field, for random packets of every
//! kind; what they write, `etherparse` reads back; and no buffer too short for a header
//! makes a view.

use etherparse::{Icmpv4Type, Icmpv6Type, PacketBuilder, SlicedPacket, TransportSlice};
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
    let base = PacketBuilder::ethernet2(macs.0, macs.1);
    let mut frame = Vec::new();
    macro_rules! finish {
        ($ip:expr) => {{
            let ip = $ip;
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
                    if v4.is_some() {
                        ip.icmpv4(Icmpv4Type::EchoRequest(etherparse::IcmpEchoHeader {
                            id: rng.gen(),
                            seq: rng.gen(),
                        }))
                        .write(&mut frame, &payload)
                        .unwrap()
                    } else {
                        ip.icmpv6(Icmpv6Type::EchoRequest(etherparse::IcmpEchoHeader {
                            id: rng.gen(),
                            seq: rng.gen(),
                        }))
                        .write(&mut frame, &payload)
                        .unwrap()
                    }
                }
            }
        }};
    }
    match (v4, v6) {
        (Some((s, d)), _) => finish!(base.ipv4(s, d, ttl)),
        (_, Some((s, d))) => finish!(base.ipv6(s, d, ttl)),
        _ => unreachable!(),
    }
    Made {
        frame,
        macs,
        ttl,
        v4,
        v6,
        payload: payload.len(),
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
                assert_eq!(p.protocol(), theirs.protocol.0);
                assert_eq!(p.checksum(), theirs.header_checksum);
                assert_eq!(p.dont_fragment(), theirs.dont_fragment);
                assert_eq!((p.is_fragment(), p.fragment_offset()), (false, 0));
                assert!(p.checksum_holds());
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
                assert_eq!(p.payload().len(), usize::from(p.payload_len()));
                p.payload().to_vec()
            }
            _ => unreachable!(),
        };
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
        // Every view shows itself in a line.
        assert!(eth.to_string().starts_with("Ethernet "));
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
