//! The rewrite stage's operations on a forwarded frame: the TTL or hop limit taken down by
//! one (the IPv4 checksum updated for that word alone, RFC 1624), and the Ethernet
//! addresses of the next hop set.
//!
//! Each takes the frame as the input stage passed it ([`crate::input::Input::V4`] or
//! `V6`): the IP header at [`ETHERNET_LEN`], whole. Given less, they change nothing and
//! say so.

use crate::input::ETHERNET_LEN;
use fibre_headers::{EthernetFrame, Ipv4Packet, Ipv6Packet};

/// Takes an IPv4 packet's TTL down by one and updates its header checksum. False (and
/// nothing changed) if the frame holds no IPv4 header or the TTL is already 0.
#[inline]
pub fn decrement_ttl(frame: &mut [u8]) -> bool {
    match frame.get_mut(ETHERNET_LEN..).map(Ipv4Packet::new_checked) {
        Some(Ok(mut p)) => p.decrement_ttl(),
        _ => false,
    }
}

/// Takes an IPv6 packet's hop limit down by one. False (and nothing changed) if the frame
/// holds no IPv6 header or the hop limit is already 0.
#[inline]
pub fn decrement_hop_limit(frame: &mut [u8]) -> bool {
    match frame.get_mut(ETHERNET_LEN..).map(Ipv6Packet::new_checked) {
        Some(Ok(mut p)) => p.decrement_hop_limit(),
        _ => false,
    }
}

/// Sets the frame's destination and source MAC addresses. False if it is shorter than an
/// Ethernet header.
#[inline]
pub fn set_macs(frame: &mut [u8], dst: [u8; 6], src: [u8; 6]) -> bool {
    match EthernetFrame::new_checked(frame) {
        Ok(mut eth) => {
            eth.set_destination(dst);
            eth.set_source(src);
            true
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::{Ipv4HeaderSlice, PacketBuilder};
    use fibre_headers::checksum;
    use rand::{Rng, SeedableRng};

    /// A TTL taken down leaves a checksum equal to one computed whole, on random headers
    /// (TTLs, addresses, identifications); a TTL of 0 is left alone.
    #[test]
    fn the_ttl_goes_down_and_the_checksum_holds() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for _ in 0..20_000 {
            let ttl: u8 = rng.gen_range(1..=255);
            let b = PacketBuilder::ethernet2([2; 6], [4; 6])
                .ipv4(rng.gen(), rng.gen(), ttl)
                .udp(rng.gen(), rng.gen());
            let mut frame = Vec::new();
            b.write(&mut frame, &[1, 2, 3]).unwrap();
            frame[ETHERNET_LEN + 4..ETHERNET_LEN + 6].copy_from_slice(&rng.gen::<[u8; 2]>());
            let h = &mut frame[ETHERNET_LEN..ETHERNET_LEN + 20];
            h[10..12].fill(0);
            let c = checksum::checksum(h);
            h[10..12].copy_from_slice(&c.to_be_bytes());
            assert!(decrement_ttl(&mut frame));
            let header = Ipv4HeaderSlice::from_slice(&frame[ETHERNET_LEN..])
                .unwrap()
                .to_header();
            assert_eq!(header.time_to_live, ttl - 1);
            assert_eq!(header.header_checksum, header.calc_header_checksum());
        }
        let mut frame = vec![0u8; ETHERNET_LEN + 20];
        assert!(!decrement_ttl(&mut frame), "TTL 0");
        assert!(!decrement_ttl(&mut frame[..30]), "no header");
    }

    #[test]
    fn hop_limits_and_macs_are_set() {
        let mut frame = vec![0u8; ETHERNET_LEN + 40];
        frame[ETHERNET_LEN + 7] = 2;
        assert!(decrement_hop_limit(&mut frame));
        assert!(decrement_hop_limit(&mut frame));
        assert!(!decrement_hop_limit(&mut frame), "hop limit 0");
        assert_eq!(frame[ETHERNET_LEN + 7], 0);
        assert!(!decrement_hop_limit(&mut frame[..50]));
        assert!(set_macs(&mut frame, [1; 6], [2; 6]));
        assert_eq!(&frame[..12], &[1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2]);
        assert!(!set_macs(&mut frame[..11], [1; 6], [2; 6]));
    }
}
