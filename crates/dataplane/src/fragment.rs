//! IPv4 fragmentation of a forwarded packet: one longer than the MTU of the way on that
//! does not forbid it (no DF) is cut into fragments as the kernel's `ip_do_fragment` cuts
//! it, so that what leaves is what the kernel would have sent.
//!
//! - Every fragment but the last carries as much of the payload as the MTU leaves room
//!   for, rounded down to 8 bytes (offsets count in units of 8); the last carries the rest.
//! - Each has the packet's header with its own total length, offset and more-fragments
//!   flag, and its checksum made anew. The flags and offset field is written whole, as
//!   the kernel writes it: DF stays clear (the packet did not have it), and so does the
//!   reserved bit.
//! - A fragment cut again keeps its place: its offset is added to each piece's, and if
//!   more fragments followed it, every piece says more follow. The sum is written as the
//!   kernel writes it, unmasked: a piece past the field's 8,191 units (a malformed
//!   fragment, which the kernel forwards all the same) spills into the flags.
//! - Packets with IP options never come here (the input stage hands them to the kernel),
//!   so every header is the plain 20 bytes, and no option needs dropping from the later
//!   fragments.

use crate::input::ETHERNET_LEN;
use fibre_headers::ipv4::{HEADER_LEN as HEADER, MORE_FRAGMENTS, OFFSET_MASK as OFFSET};
use fibre_headers::Ipv4Packet;

/// One fragment's share of the packet's payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Where it starts in the packet's payload, in bytes (a multiple of 8).
    pub offset: usize,
    /// Its length in bytes.
    pub len: usize,
    /// Whether it is the packet's last piece.
    pub last: bool,
}

/// The pieces a packet's payload is cut into, in order ([`pieces`]).
#[derive(Clone, Debug)]
pub struct Pieces {
    /// Payload bytes not yet in a piece.
    left: usize,
    /// Where the next piece starts.
    at: usize,
    /// The most payload a fragment carries.
    most: usize,
}

impl Iterator for Pieces {
    type Item = Piece;

    fn next(&mut self) -> Option<Piece> {
        if self.left == 0 {
            return None;
        }
        // As `ip_do_fragment`: the rest if it fits, else the room rounded down to 8.
        let len = if self.left <= self.most {
            self.left
        } else {
            self.most & !7
        };
        let piece = Piece {
            offset: self.at,
            len,
            last: len == self.left,
        };
        self.at += len;
        self.left -= len;
        Some(piece)
    }
}

/// The pieces of the payload of an IPv4 packet `ip_len` bytes long (a 20-byte header)
/// cut for an MTU of `mtu`; `None` if the MTU leaves no room for 8 bytes of payload
/// after the header, or the packet has no payload. A packet within the MTU is one piece.
pub fn pieces(ip_len: usize, mtu: usize) -> Option<Pieces> {
    let most = mtu.checked_sub(HEADER).filter(|&m| m >= 8)?;
    let left = ip_len.checked_sub(HEADER).filter(|&l| l > 0)?;
    Some(Pieces { left, at: 0, most })
}

/// Writes the fragment of `piece` of `frame` (an Ethernet header and an IPv4 packet with
/// a 20-byte header, rewritten for the way on, its padding cut off) into `out`: the same
/// Ethernet header, the packet's header made the fragment's, and the piece of payload.
/// Returns the fragment's frame length; `None`, with `out` as it may be, if `frame` is
/// not so long as its header says or `out` cannot hold the fragment.
pub fn write(frame: &[u8], piece: Piece, out: &mut [u8]) -> Option<usize> {
    let ip = Ipv4Packet::new_checked(frame.get(ETHERNET_LEN..)?).ok()?;
    let payload = ip
        .as_bytes()
        .get(HEADER + piece.offset..HEADER + piece.offset + piece.len)?;
    let len = ETHERNET_LEN + HEADER + piece.len;
    let out = out.get_mut(..len)?;
    out[..ETHERNET_LEN + HEADER].copy_from_slice(&frame[..ETHERNET_LEN + HEADER]);
    out[ETHERNET_LEN + HEADER..].copy_from_slice(payload);
    let word = ip.flags_and_offset();
    // At most 8,191 + 8,189 units: no overflow, but it may reach the flags' bits.
    let offset = (word & OFFSET) + (piece.offset / 8) as u16;
    let more = !piece.last || word & MORE_FRAGMENTS != 0;
    let mut h = Ipv4Packet::new_checked(&mut out[ETHERNET_LEN..ETHERNET_LEN + HEADER]).ok()?;
    h.set_total_len((HEADER + piece.len) as u16);
    h.set_flags_and_offset(offset | if more { MORE_FRAGMENTS } else { 0 });
    h.fill_checksum();
    Some(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::{Ipv4HeaderSlice, PacketBuilder};
    use fibre_headers::checksum;
    use rand::{Rng, SeedableRng};

    /// A UDP frame of `payload` bytes, with `id`, DF clear, and the flags and offset
    /// field set to `field` (a fragment's).
    fn frame(payload: usize, id: u16, field: u16) -> Vec<u8> {
        let mut f = Vec::new();
        PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4([10, 0, 0, 2], [10, 1, 0, 9], 63)
            .udp(4000, 53)
            .write(&mut f, &(0..payload).map(|i| i as u8).collect::<Vec<_>>())
            .unwrap();
        let h = &mut f[ETHERNET_LEN..ETHERNET_LEN + HEADER];
        h[4..6].copy_from_slice(&id.to_be_bytes());
        h[6..8].copy_from_slice(&field.to_be_bytes());
        h[10..12].fill(0);
        let sum = checksum::checksum(h);
        h[10..12].copy_from_slice(&sum.to_be_bytes());
        f
    }

    /// The fragments of `f` for `mtu`, each a frame.
    fn cut(f: &[u8], mtu: usize) -> Vec<Vec<u8>> {
        pieces(f.len() - ETHERNET_LEN, mtu)
            .unwrap()
            .map(|p| {
                let mut out = vec![0xee; 2048];
                let n = write(f, p, &mut out).unwrap();
                out.truncate(n);
                out
            })
            .collect()
    }

    /// Fragments put back together by their offsets: the payload, the more-fragments
    /// flag of the last, and the first's offset.
    fn reassemble(fragments: &[Vec<u8>]) -> (Vec<u8>, bool, usize) {
        let mut payload = Vec::new();
        let mut last_more = false;
        let mut first = usize::MAX;
        for f in fragments {
            let h = Ipv4HeaderSlice::from_slice(&f[ETHERNET_LEN..]).unwrap();
            let at = h.fragments_offset().byte_offset() as usize;
            first = first.min(at);
            let data = &f[ETHERNET_LEN + HEADER..];
            assert_eq!(h.total_len() as usize, HEADER + data.len());
            let end = at - first + data.len();
            if payload.len() < end {
                payload.resize(end, 0);
            }
            payload[at - first..end].copy_from_slice(data);
            last_more = h.more_fragments();
        }
        (payload, last_more, first)
    }

    /// A 1500-byte packet through an MTU of 1000: two fragments, the first carrying 976
    /// bytes of payload (980 rounded down to 8), the second the rest, the same ID and
    /// TTL, their own lengths, offsets and checksums, MF on the first only.
    #[test]
    fn a_packet_is_cut_at_the_mtu_rounded_down_to_eight() {
        let f = frame(1472, 0x1234, 0);
        let frags = cut(&f, 1000);
        assert_eq!(frags.len(), 2);
        let h: Vec<_> = frags
            .iter()
            .map(|f| Ipv4HeaderSlice::from_slice(&f[ETHERNET_LEN..]).unwrap())
            .collect();
        assert_eq!((h[0].total_len(), h[1].total_len()), (996, 20 + 1480 - 976));
        assert_eq!(h[0].fragments_offset().value(), 0);
        assert_eq!(h[1].fragments_offset().byte_offset(), 976);
        assert!(h[0].more_fragments() && !h[1].more_fragments());
        for (g, f) in h.iter().zip(&frags) {
            assert_eq!(
                (g.identification(), g.ttl(), g.protocol().0),
                (0x1234, 63, 17)
            );
            assert!(!g.dont_fragment());
            assert!(checksum::holds(&f[ETHERNET_LEN..ETHERNET_LEN + HEADER]));
            assert_eq!(f[..ETHERNET_LEN], frame(0, 0, 0)[..ETHERNET_LEN]);
        }
        let (payload, more, _) = reassemble(&frags);
        assert_eq!(payload, f[ETHERNET_LEN + HEADER..]);
        assert!(!more);
    }

    /// Random packets, MTUs and fragments (of fragments too, up to the field's last
    /// offset), against a reference of the kernel's rule: pieces of the MTU's room less
    /// the header rounded down to 8 while more than the room is left, then the rest;
    /// each fragment's flags and offset field the packet's offset plus the piece's, in
    /// units of 8, unmasked, with MF but on the last (there too if the packet had it);
    /// together the payload, in order.
    #[test]
    fn random_packets_are_cut_as_the_kernel_cuts_them() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(13);
        for _ in 0..2000 {
            let payload = rng.gen_range(1..1800);
            let mtu = rng.gen_range(68..1600);
            let offset = match rng.gen_range(0..4) {
                0 => 0,
                1 => rng.gen_range(8000..=OFFSET),
                _ => rng.gen_range(0..=OFFSET),
            };
            let more = rng.gen_bool(0.3);
            let field = offset | if more { MORE_FRAGMENTS } else { 0 };
            let f = frame(payload, rng.gen(), field);
            let data = f.len() - ETHERNET_LEN - HEADER;
            let frags = cut(&f, mtu);
            // The reference, as `ip_frag_next` goes.
            let (room, mut left, mut at) = (mtu - HEADER, data, offset as usize * 8);
            let mut expected = Vec::new();
            while left > 0 {
                let len = if left > room { room & !7 } else { left };
                left -= len;
                let more = left > 0 || more;
                expected.push((
                    len,
                    (at >> 3) as u16 | if more { MORE_FRAGMENTS } else { 0 },
                ));
                at += len;
            }
            let got: Vec<(usize, u16)> = frags
                .iter()
                .map(|g| {
                    let ip = &g[ETHERNET_LEN..];
                    assert!(ip.len() <= mtu);
                    assert!(checksum::holds(&ip[..HEADER]));
                    (ip.len() - HEADER, u16::from_be_bytes([ip[6], ip[7]]))
                })
                .collect();
            assert_eq!(
                got, expected,
                "{payload} bytes, MTU {mtu}, field {field:#x}"
            );
            let joined: Vec<u8> = frags
                .iter()
                .flat_map(|g| g[ETHERNET_LEN + HEADER..].to_vec())
                .collect();
            assert_eq!(joined, f[ETHERNET_LEN + HEADER..]);
            if offset < 7000 {
                let (got, last_more, first) = reassemble(&frags);
                assert_eq!(got, f[ETHERNET_LEN + HEADER..]);
                assert_eq!(last_more, more);
                assert_eq!(first, offset as usize * 8);
            }
        }
    }

    /// An MTU without room for 8 bytes after the header, or a packet with no payload,
    /// gives no pieces; a frame shorter than its pieces say, or room too small, gives
    /// no fragment.
    #[test]
    fn what_cannot_be_cut_is_refused() {
        assert!(pieces(1500, 27).is_none());
        assert!(pieces(20, 1000).is_none());
        let f = frame(100, 1, 0);
        let p = Piece {
            offset: 96,
            len: 16,
            last: true,
        };
        assert!(write(&f, p, &mut [0; 2048]).is_none());
        let p = Piece {
            offset: 0,
            len: 56,
            last: false,
        };
        assert!(write(&f, p, &mut [0; 60]).is_none());
        assert_eq!(write(&f, p, &mut [0; 90]), Some(90));
    }
}
