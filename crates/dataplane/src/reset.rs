//! The TCP reset a firewall rule's `reject with tcp reset` answers a segment with, made
//! as the kernel's `nf_send_reset` and `nf_send_reset6` make it: from the segment's
//! destination to its source, ports swapped, no options, no window; the sequence number
//! the segment acknowledged if it carried an acknowledgement, else an acknowledgement
//! of everything it carried (its SYN and FIN counting one each). The IPv4 header has
//! DF set, identification 0, a TOS of 0; the IPv6 header no traffic class or flow
//! label. The hop count is the caller's ([`set_hops`] once the route is known): the
//! route's `hoplimit`, else [`crate::icmp::Hops`] (IPv4's default TTL, IPv6's the hop
//! limit of the link the reset leaves by).

use crate::checksum;
use crate::input::{ETHERNET_LEN, ETHERTYPE_IPV4, ETHERTYPE_IPV6};

/// The TCP flags of a reset's and a segment's header.
const FIN: u8 = 0x01;
const SYN: u8 = 0x02;
const RST: u8 = 0x04;
const ACK: u8 = 0x10;

/// Where the TCP header of the IP packet `ip` starts, if the kernel answers it with a
/// reset (`nf_reject_ip_tcphdr_get`, `nf_reject_ip6_tcphdr_get`): TCP in the first or
/// only fragment, its fixed header whole, not a reset itself, its checksum holding
/// unless its sender left it to finish or its link vouched for it (`partial`: the
/// kernel's `skb_csum_unnecessary`); IPv6 from and to unicast addresses.
pub fn answers(ip: &[u8], v6: bool, partial: bool) -> Option<usize> {
    if v6 {
        let h = ip.get(..40)?;
        // As `ipv6_addr_type` has it: neither multicast, nor unspecified, nor
        // IPv4-mapped.
        let unicast = |a: &[u8]| {
            a[0] != 0xff
                && a.iter().any(|&b| b != 0)
                && !(a[..10] == [0; 10] && a[10..12] == [0xff, 0xff])
        };
        if !unicast(&h[8..24]) || !unicast(&h[24..40]) {
            return None;
        }
    }
    if !crate::icmp::reject_answers(ip, v6, partial) {
        return None;
    }
    let (protocol, at, end) = crate::icmp::transport(ip, v6)?;
    let tcp = ip.get(at..end).filter(|_| protocol == 6)?.get(..20)?;
    (tcp[13] & RST == 0).then_some(at)
}

/// The packet's length as its header says, within `ip`.
fn packet_len(ip: &[u8], v6: bool) -> usize {
    let said = if v6 {
        40 + usize::from(u16::from_be_bytes([ip[4], ip[5]]))
    } else {
        usize::from(u16::from_be_bytes([ip[2], ip[3]]))
    };
    said.min(ip.len())
}

/// Makes, in place of the IP packet in `buffer` (its Ethernet header, then the packet,
/// whose TCP header starts at `tcp_at` of it: [`answers`]), the reset answering it. The
/// Ethernet addresses are left for the caller; `hops` is its TTL or hop limit. Returns
/// the reset's frame length.
pub fn make(buffer: &mut [u8], tcp_at: usize, v6: bool, hops: u8) -> Option<usize> {
    let ip = buffer.get(ETHERNET_LEN..)?;
    ip.get(..if v6 { 40 } else { 20 })?;
    let len = packet_len(ip, v6);
    let t = ip.get(tcp_at..tcp_at + 20)?;
    let (sport, dport) = ([t[0], t[1]], [t[2], t[3]]);
    let seq = u32::from_be_bytes([t[4], t[5], t[6], t[7]]);
    let ack_seq = [t[8], t[9], t[10], t[11]];
    let flags = t[13];
    // In 32 bits, wrapping as the kernel's sum does where a data offset overruns.
    let data = (len as u32)
        .wrapping_sub(tcp_at as u32)
        .wrapping_sub(u32::from(t[12] >> 4) * 4);
    let (src, dst): (Vec<u8>, Vec<u8>) = if v6 {
        (ip[24..40].to_vec(), ip[8..24].to_vec())
    } else {
        (ip[16..20].to_vec(), ip[12..16].to_vec())
    };
    let mut tcp = [0u8; 20];
    tcp[0..2].copy_from_slice(&dport);
    tcp[2..4].copy_from_slice(&sport);
    if flags & ACK != 0 {
        tcp[4..8].copy_from_slice(&ack_seq);
        tcp[13] = RST;
    } else {
        let counted = u32::from(flags & SYN != 0) + u32::from(flags & FIN != 0);
        let acked = seq.wrapping_add(counted).wrapping_add(data);
        tcp[8..12].copy_from_slice(&acked.to_be_bytes());
        tcp[13] = RST | ACK;
    }
    tcp[12] = 5 << 4;
    let mut sum = checksum::sum(&tcp);
    for part in [&src[..], &dst[..]] {
        sum = checksum::add(sum, checksum::sum(part));
    }
    sum = checksum::add(sum, 6);
    sum = checksum::add(sum, 20);
    tcp[16..18].copy_from_slice(&(!sum).to_be_bytes());
    let header = if v6 { 40 } else { 20 };
    let total = ETHERNET_LEN + header + 20;
    if buffer.len() < total {
        return None;
    }
    let out = &mut buffer[ETHERNET_LEN..total];
    if v6 {
        out[..40].fill(0);
        out[0] = 0x60;
        out[4..6].copy_from_slice(&20u16.to_be_bytes());
        out[6] = 6;
        out[7] = hops;
        out[8..24].copy_from_slice(&src);
        out[24..40].copy_from_slice(&dst);
    } else {
        out[..20].fill(0);
        out[0] = 0x45;
        out[2..4].copy_from_slice(&40u16.to_be_bytes());
        out[6] = 0x40;
        out[8] = hops;
        out[9] = 6;
        out[12..16].copy_from_slice(&src);
        out[16..20].copy_from_slice(&dst);
        let c = checksum::checksum(&out[..20]);
        out[10..12].copy_from_slice(&c.to_be_bytes());
    }
    out[header..].copy_from_slice(&tcp);
    let ethertype = if v6 { ETHERTYPE_IPV6 } else { ETHERTYPE_IPV4 };
    buffer[12..14].copy_from_slice(&ethertype.to_be_bytes());
    Some(total)
}

/// Sets the time to live (IPv4, its header's checksum made again) or the hop limit
/// (IPv6) of the reset `frame` (as [`make`] made it), once its route is known.
pub fn set_hops(frame: &mut [u8], v6: bool, hops: u8) {
    if v6 {
        if let Some(h) = frame.get_mut(ETHERNET_LEN + 7) {
            *h = hops;
        }
    } else if let Some(h) = frame.get_mut(ETHERNET_LEN..ETHERNET_LEN + 20) {
        if h[8] != hops {
            h[8] = hops;
            h[10..12].fill(0);
            let c = checksum::checksum(h);
            h[10..12].copy_from_slice(&c.to_be_bytes());
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
