//! The TCP reset a firewall rule's `reject with tcp reset` answers a segment with, made
//! as the kernel's `nf_send_reset` and `nf_send_reset6` make it: from the segment's
//! destination to its source, ports swapped, no options, no window; the sequence number
//! the segment acknowledged if it carried an acknowledgement, else an acknowledgement
//! of everything it carried (its SYN and FIN counting one each). The IPv4 header has
//! DF set, identification 0, a TOS of 0; the IPv6 header no traffic class or flow
//! label. The hop count is the caller's ([`set_hops`] once the route is known): the
//! route's `hoplimit`, else [`crate::icmp::Hops`] (IPv4's default TTL, IPv6's the hop
//! limit of the link the reset leaves by).

use crate::input::{ETHERNET_LEN, ETHERTYPE_IPV4, ETHERTYPE_IPV6};
use fibre_headers::tcp::flags::{ACK, FIN, RST, SYN};
use fibre_headers::transport::TCP;
use fibre_headers::TcpSegment;
use fibre_headers::{checksum, ipv4, ipv6, tcp, EthernetFrame, Ipv4Packet, Ipv6Packet};

/// Where the TCP header of the IP packet `ip` starts, if the kernel answers it with a
/// reset (`nf_reject_ip_tcphdr_get`, `nf_reject_ip6_tcphdr_get`): TCP in the first or
/// only fragment, its fixed header whole, not a reset itself, its checksum holding
/// unless its sender left it to finish or its link vouched for it (`partial`: the
/// kernel's `skb_csum_unnecessary`); IPv6 from and to unicast addresses.
pub fn answers(ip: &[u8], v6: bool, partial: bool) -> Option<usize> {
    if v6 {
        let h = Ipv6Packet::new_checked(ip).ok()?;
        // As `ipv6_addr_type` has it: neither multicast, nor unspecified, nor
        // IPv4-mapped.
        let unicast = |a: std::net::Ipv6Addr| {
            !a.is_multicast() && !a.is_unspecified() && a.to_ipv4_mapped().is_none()
        };
        if !unicast(h.source()) || !unicast(h.destination()) {
            return None;
        }
    }
    if !crate::icmp::reject_answers(ip, v6, partial) {
        return None;
    }
    let (protocol, at, end) = crate::icmp::transport(ip, v6)?;
    let segment = TcpSegment::new_checked(ip.get(at..end).filter(|_| protocol == TCP)?).ok()?;
    (segment.flags() & RST == 0).then_some(at)
}

/// The packet's length as its header says, within `ip` (a whole fixed header).
fn packet_len(ip: &[u8], v6: bool) -> Option<usize> {
    let said = if v6 {
        ipv6::HEADER_LEN + usize::from(Ipv6Packet::new_checked(ip).ok()?.payload_len())
    } else {
        usize::from(Ipv4Packet::new_checked(ip).ok()?.total_len())
    };
    Some(said.min(ip.len()))
}

/// Makes, in place of the IP packet in `buffer` (its Ethernet header, then the packet,
/// whose TCP header starts at `tcp_at` of it: [`answers`]), the reset answering it. The
/// Ethernet addresses are left for the caller; `hops` is its TTL or hop limit. Returns
/// the reset's frame length.
pub fn make(buffer: &mut [u8], tcp_at: usize, v6: bool, hops: u8) -> Option<usize> {
    let ip = buffer.get(ETHERNET_LEN..)?;
    let len = packet_len(ip, v6)?;
    let t = TcpSegment::new_checked(ip.get(tcp_at..)?).ok()?;
    let flags = t.flags();
    // In 32 bits, wrapping as the kernel's sum does where a data offset overruns.
    let data = (len as u32)
        .wrapping_sub(tcp_at as u32)
        .wrapping_sub(t.header_len() as u32);
    // The reset goes back: from the packet's destination to its source.
    let (src, dst): (std::net::IpAddr, std::net::IpAddr) = if v6 {
        let h = Ipv6Packet::new_checked(ip).ok()?;
        (h.destination().into(), h.source().into())
    } else {
        let h = Ipv4Packet::new_checked(ip).ok()?;
        (h.destination().into(), h.source().into())
    };
    let mut bytes = [0u8; tcp::HEADER_LEN];
    let mut reset = TcpSegment::new_checked(&mut bytes[..]).ok()?;
    reset.set_source_port(t.destination_port());
    reset.set_destination_port(t.source_port());
    if flags & ACK != 0 {
        reset.set_sequence(t.acknowledgment());
        reset.set_flags(RST);
    } else {
        let counted = u32::from(flags & SYN != 0) + u32::from(flags & FIN != 0);
        reset.set_acknowledgment(t.sequence().wrapping_add(counted).wrapping_add(data));
        reset.set_flags(RST | ACK);
    }
    reset.set_header_len(tcp::HEADER_LEN);
    let octets = |a: std::net::IpAddr| match a {
        std::net::IpAddr::V4(a) => a.octets().to_vec(),
        std::net::IpAddr::V6(a) => a.octets().to_vec(),
    };
    let pseudo = checksum::pseudo_header_sum(&octets(src), &octets(dst), TCP, 20);
    reset.set_checksum(!checksum::add(pseudo, checksum::sum(reset.as_bytes())));
    let header = if v6 {
        ipv6::HEADER_LEN
    } else {
        ipv4::HEADER_LEN
    };
    let total = ETHERNET_LEN + header + tcp::HEADER_LEN;
    let mut frame = EthernetFrame::new_checked(buffer.get_mut(..total)?).ok()?;
    frame.set_ethertype(if v6 { ETHERTYPE_IPV6 } else { ETHERTYPE_IPV4 });
    let out = frame.payload_mut();
    out[..header].fill(0);
    match (src, dst) {
        (std::net::IpAddr::V6(src), std::net::IpAddr::V6(dst)) => {
            let mut h = Ipv6Packet::new_checked(&mut out[..]).ok()?;
            h.set_version_class_flow(0, 0);
            h.set_payload_len(tcp::HEADER_LEN as u16);
            h.set_next_header(TCP);
            h.set_hop_limit(hops);
            h.set_source(src);
            h.set_destination(dst);
        }
        (std::net::IpAddr::V4(src), std::net::IpAddr::V4(dst)) => {
            let mut h = Ipv4Packet::new_checked(&mut out[..]).ok()?;
            h.set_version_and_header_len(ipv4::HEADER_LEN);
            h.set_total_len((ipv4::HEADER_LEN + tcp::HEADER_LEN) as u16);
            h.set_flags_and_offset(ipv4::DONT_FRAGMENT);
            h.set_ttl(hops);
            h.set_protocol(TCP);
            h.set_source(src);
            h.set_destination(dst);
            h.fill_checksum();
        }
        _ => return None,
    }
    out[header..].copy_from_slice(&bytes);
    Some(total)
}

/// Sets the time to live (IPv4, its header's checksum made again) or the hop limit
/// (IPv6) of the reset `frame` (as [`make`] made it), once its route is known.
pub fn set_hops(frame: &mut [u8], v6: bool, hops: u8) {
    let Some(ip) = frame.get_mut(ETHERNET_LEN..) else {
        return;
    };
    if v6 {
        if let Ok(mut h) = Ipv6Packet::new_checked(ip) {
            h.set_hop_limit(hops);
        }
    } else if let Ok(mut h) = Ipv4Packet::new_checked(ip) {
        if h.ttl() != hops {
            h.set_ttl(hops);
            h.fill_checksum();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv4 TCP segment in a frame: flags, sequence and acknowledgement numbers,
    /// `data` bytes of payload; its checksums whole.
    fn segment(flags: u8, seq: u32, ack: u32, data: usize) -> Vec<u8> {
        let mut f = vec![0u8; ETHERNET_LEN];
        f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        let total = 40 + data;
        let mut ip = vec![
            0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 2, 10, 1, 0, 9,
        ];
        ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        let c = checksum::checksum(&ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        let mut tcp = vec![0x9c, 0x40, 0, 22];
        tcp.extend_from_slice(&seq.to_be_bytes());
        tcp.extend_from_slice(&ack.to_be_bytes());
        tcp.extend_from_slice(&[0x50, flags, 0xfa, 0xf0, 0, 0, 0, 0]);
        tcp.extend(std::iter::repeat_n(7u8, data));
        let mut pseudo = ip[12..20].to_vec();
        pseudo.extend_from_slice(&[0, 6]);
        pseudo.extend_from_slice(&((20 + data) as u16).to_be_bytes());
        pseudo.extend_from_slice(&tcp);
        let c = checksum::checksum(&pseudo);
        tcp[16..18].copy_from_slice(&c.to_be_bytes());
        f.extend(ip);
        f.extend(tcp);
        f
    }

    #[test]
    fn a_syn_is_acknowledged_and_an_acknowledgement_taken_as_the_sequence() {
        let mut f = segment(SYN, 1000, 0, 0);
        let at = answers(&f[ETHERNET_LEN..], false, false).unwrap();
        let n = make(&mut f, at, false, 99).unwrap();
        let r = &f[..n];
        assert_eq!(n, ETHERNET_LEN + 40);
        assert_eq!(r[22], 99, "the TTL given");
        assert_eq!(&r[26..34], &[10, 1, 0, 9, 10, 0, 0, 2]);
        assert_eq!(&r[34..38], &[0, 22, 0x9c, 0x40]);
        assert_eq!(&r[38..42], &[0; 4]);
        assert_eq!(u32::from_be_bytes([r[42], r[43], r[44], r[45]]), 1001);
        assert_eq!(r[47], RST | ACK);
        assert!(checksum::holds(&r[14..34]));
        let mut pseudo = r[26..34].to_vec();
        pseudo.extend_from_slice(&[0, 6, 0, 20]);
        pseudo.extend_from_slice(&r[34..54]);
        assert!(checksum::holds(&pseudo));
        // Data acknowledged: 1000 + 30 bytes and a FIN.
        let mut f = segment(FIN, 1000, 0, 30);
        let at = answers(&f[ETHERNET_LEN..], false, false).unwrap();
        make(&mut f, at, false, 64).unwrap();
        assert_eq!(u32::from_be_bytes([f[42], f[43], f[44], f[45]]), 1031);
        let mut f = segment(ACK, 5, 777, 10);
        let at = answers(&f[ETHERNET_LEN..], false, false).unwrap();
        make(&mut f, at, false, 64).unwrap();
        assert_eq!(u32::from_be_bytes([f[38], f[39], f[40], f[41]]), 777);
        assert_eq!(f[47], RST);
    }

    #[test]
    fn resets_bad_checksums_and_later_fragments_are_not_answered() {
        assert!(answers(&segment(RST, 1, 0, 0)[ETHERNET_LEN..], false, false).is_none());
        let mut bad = segment(SYN, 1, 0, 4);
        bad[ETHERNET_LEN + 41] ^= 1;
        assert!(answers(&bad[ETHERNET_LEN..], false, false).is_none());
        // Unless its sender left the checksum to finish.
        assert!(answers(&bad[ETHERNET_LEN..], false, true).is_some());
        let mut later = segment(SYN, 1, 0, 0);
        later[ETHERNET_LEN + 7] = 10;
        assert!(answers(&later[ETHERNET_LEN..], false, false).is_none());
        let mut udp = segment(SYN, 1, 0, 0);
        udp[ETHERNET_LEN + 9] = 17;
        assert!(answers(&udp[ETHERNET_LEN..], false, true).is_none());
        for cut in 0..54 {
            let f = segment(SYN, 1, 0, 0);
            let _ = answers(&f[ETHERNET_LEN..cut.max(ETHERNET_LEN)], false, false);
        }
    }
}
