//! What a sender left for a device to finish: a checksum, and the cutting of one large
//! packet into segments. The kernel carries both with a packet (`CHECKSUM_PARTIAL`, GSO)
//! and passes them through `AF_PACKET` in a virtio-net header before the frame
//! (`PACKET_VNET_HDR`); fibre reads them there, keeps them beside the frame in its
//! buffer ([`crate::pool::Pool::offload`]), and either hands them on the same way when it
//! sends through `AF_PACKET`, as the kernel's own forwarding hands them to the next
//! device, or finishes the work itself where the way out cannot carry them (AF_XDP).
//!
//! Why it matters: a host behind a veth (every container, every namespace) leaves its
//! TCP and UDP checksums partial (the pseudo-header's sum in the checksum field, the rest
//! for the device that is not there) and, with TSO, hands over TCP segments of up to 64
//! KiB. The kernel forwards both as they are and the receiving host accepts them as
//! such; a forwarder that sends the bytes alone sends bad checksums and frames longer
//! than any link.
//!
//! The header ([`VnetHeader`], `struct virtio_net_hdr`, little-endian as the kernel
//! writes it on this machine): flags (`NEEDS_CSUM`: finish the checksum; `DATA_VALID`:
//! already checked), the segmentation kind (none, TCP over IPv4, TCP over IPv6, UDP; the
//! ECN bit), the headers' length, the segment size, where the checksummed bytes start and
//! where the checksum goes in them.

use fibre_headers::checksum;

/// Bytes of a virtio-net header (`struct virtio_net_hdr`, without the buffer count).
pub const VNET_HEADER_LEN: usize = 10;

/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the checksum is to be finished.
const NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_F_DATA_VALID`: the checksum was checked (by a device).
const DATA_VALID: u8 = 2;

/// `VIRTIO_NET_HDR_GSO_TCPV4`.
const GSO_TCPV4: u8 = 1;
/// `VIRTIO_NET_HDR_GSO_UDP` (UDP fragmentation offload, which the kernel no longer
/// makes).
const GSO_UDP: u8 = 3;
/// `VIRTIO_NET_HDR_GSO_TCPV6`.
const GSO_TCPV6: u8 = 4;
/// `VIRTIO_NET_HDR_GSO_UDP_L4`: UDP segmentation, each segment a datagram.
const GSO_UDP_L4: u8 = 5;
/// `VIRTIO_NET_HDR_GSO_ECN`: TCP with the congestion-experienced bits in use.
const GSO_ECN: u8 = 0x80;

/// A checksum left for the device: the Internet checksum of the frame's bytes from
/// `start` to its end, to be stored at `start + offset` (whose field holds the
/// pseudo-header's sum meanwhile).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartialChecksum {
    /// Where the summed bytes start, from the frame's first byte.
    pub start: u16,
    /// Where the checksum field is, from `start`.
    pub offset: u16,
}

/// What kind of segments a large packet is cut into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GsoKind {
    /// TCP over IPv4.
    Tcp4,
    /// TCP over IPv6.
    Tcp6,
    /// UDP, each segment a datagram of its own (`UDP_L4`).
    Udp,
}

/// A packet to be cut into segments of `size` payload bytes each (the last shorter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gso {
    /// What it is cut as.
    pub kind: GsoKind,
    /// Payload bytes a segment carries (TCP's MSS, or the UDP datagrams' size).
    pub size: u16,
    /// TCP with ECN in use: the CWR flag stays on the first segment only either way;
    /// kept to hand on.
    pub ecn: bool,
}

/// What a frame in a buffer leaves to be done, beside its bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offload {
    /// A checksum to finish.
    pub checksum: Option<PartialChecksum>,
    /// Segments to cut.
    pub gso: Option<Gso>,
    /// The checksums were checked on the way in (by a device that said so).
    pub checksum_valid: bool,
}

impl Offload {
    /// Nothing left to do.
    pub const NONE: Offload = Offload {
        checksum: None,
        gso: None,
        checksum_valid: false,
    };

    /// Whether nothing is left to do.
    #[inline]
    pub fn is_none(&self) -> bool {
        self.checksum.is_none() && self.gso.is_none()
    }
}

/// Why a virtio-net header was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VnetError {
    /// Fewer than [`VNET_HEADER_LEN`] bytes.
    Truncated,
    /// A segmentation kind fibre does not cut (UDP fragmentation offload, or unknown).
    UnsupportedGso(u8),
    /// Segmentation without a segment size, or a checksum that falls outside the frame.
    Malformed,
}

impl std::fmt::Display for VnetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VnetError::Truncated => write!(f, "virtio-net header cut short"),
            VnetError::UnsupportedGso(k) => write!(f, "segmentation kind {k} not supported"),
            VnetError::Malformed => write!(f, "virtio-net header malformed"),
        }
    }
}

/// A virtio-net header as the kernel reads and writes it beside a packet socket's frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VnetHeader {
    /// `NEEDS_CSUM`, `DATA_VALID`.
    pub flags: u8,
    /// The segmentation kind, with the ECN bit.
    pub gso_type: u8,
    /// Bytes of the headers before the payload (a hint; the kernel reads its own).
    pub hdr_len: u16,
    /// The segment size.
    pub gso_size: u16,
    /// Where the checksummed bytes start.
    pub csum_start: u16,
    /// Where the checksum goes, from `csum_start`.
    pub csum_offset: u16,
}

impl VnetHeader {
    /// Reads a header from the first [`VNET_HEADER_LEN`] bytes of `bytes`.
    pub fn read(bytes: &[u8]) -> Result<VnetHeader, VnetError> {
        let b = bytes.get(..VNET_HEADER_LEN).ok_or(VnetError::Truncated)?;
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        Ok(VnetHeader {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u16_at(2),
            gso_size: u16_at(4),
            csum_start: u16_at(6),
            csum_offset: u16_at(8),
        })
    }

    /// Writes the header into the first [`VNET_HEADER_LEN`] bytes of `out`.
    pub fn write(&self, out: &mut [u8; VNET_HEADER_LEN]) {
        out[0] = self.flags;
        out[1] = self.gso_type;
        out[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        out[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        out[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        out[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
    }

    /// What the header says is left to do for a frame of `frame_len` bytes.
    pub fn offload(&self, frame_len: usize) -> Result<Offload, VnetError> {
        let checksum = if self.flags & NEEDS_CSUM != 0 {
            let field = self.csum_start as usize + self.csum_offset as usize;
            if field + 2 > frame_len {
                return Err(VnetError::Malformed);
            }
            Some(PartialChecksum {
                start: self.csum_start,
                offset: self.csum_offset,
            })
        } else {
            None
        };
        let kind = match self.gso_type & !GSO_ECN {
            0 => None,
            GSO_TCPV4 => Some(GsoKind::Tcp4),
            GSO_TCPV6 => Some(GsoKind::Tcp6),
            GSO_UDP_L4 => Some(GsoKind::Udp),
            // UDP fragmentation offload: the kernel no longer makes it.
            GSO_UDP => return Err(VnetError::UnsupportedGso(GSO_UDP)),
            other => return Err(VnetError::UnsupportedGso(other)),
        };
        let gso = match kind {
            None => None,
            Some(_) if self.gso_size == 0 => return Err(VnetError::Malformed),
            Some(kind) => Some(Gso {
                kind,
                size: self.gso_size,
                ecn: self.gso_type & GSO_ECN != 0,
            }),
        };
        Ok(Offload {
            checksum,
            gso,
            checksum_valid: self.flags & DATA_VALID != 0,
        })
    }

    /// The header that hands `offload` on with a frame whose headers are `hdr_len`
    /// bytes long (the kernel only takes it as a hint).
    pub fn from_offload(offload: &Offload, hdr_len: u16) -> VnetHeader {
        let mut h = VnetHeader::default();
        // Whether the checksum was checked on the way in is not handed on: the next
        // host checks it again.
        if let Some(c) = offload.checksum {
            h.flags |= NEEDS_CSUM;
            h.csum_start = c.start;
            h.csum_offset = c.offset;
        }
        if let Some(g) = offload.gso {
            h.gso_type = match g.kind {
                GsoKind::Tcp4 => GSO_TCPV4,
                GsoKind::Tcp6 => GSO_TCPV6,
                GsoKind::Udp => GSO_UDP_L4,
            } | if g.ecn { GSO_ECN } else { 0 };
            h.gso_size = g.size;
            h.hdr_len = hdr_len;
        }
        h
    }
}

/// Finishes a checksum the sender left partial, as a device does: the Internet checksum
/// of `frame[start..]` (whose field holds the pseudo-header's sum) stored in the field.
/// False, and the frame untouched, if the field lies outside the frame. A checksum that
/// comes out zero is written as all ones (the same in ones' complement), as the kernel's
/// `skb_checksum_help` writes it: to UDP, zero would mean "no checksum".
pub fn finish_checksum(frame: &mut [u8], partial: PartialChecksum) -> bool {
    let start = partial.start as usize;
    let field = start + partial.offset as usize;
    if field + 2 > frame.len() || start > field {
        return false;
    }
    let mut sum = checksum::checksum(&frame[start..]);
    if sum == 0 {
        sum = 0xffff;
    }
    frame[field..field + 2].copy_from_slice(&sum.to_be_bytes());
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::PacketBuilder;

    #[test]
    fn a_header_reads_back_what_was_written() {
        let h = VnetHeader {
            flags: NEEDS_CSUM,
            gso_type: GSO_TCPV6 | GSO_ECN,
            hdr_len: 74,
            gso_size: 1428,
            csum_start: 54,
            csum_offset: 16,
        };
        let mut b = [0; VNET_HEADER_LEN];
        h.write(&mut b);
        assert_eq!(VnetHeader::read(&b), Ok(h));
        let o = h.offload(2000).unwrap();
        assert_eq!(
            o.checksum,
            Some(PartialChecksum {
                start: 54,
                offset: 16
            })
        );
        assert_eq!(
            o.gso,
            Some(Gso {
                kind: GsoKind::Tcp6,
                size: 1428,
                ecn: true
            })
        );
        assert_eq!(VnetHeader::from_offload(&o, 74), h);
        let valid = Offload {
            checksum_valid: true,
            ..Offload::NONE
        };
        assert_eq!(VnetHeader::from_offload(&valid, 0), VnetHeader::default());
        assert_eq!(VnetHeader::read(&b[..9]), Err(VnetError::Truncated));
    }

    #[test]
    fn headers_that_cannot_be_honoured_are_refused() {
        let mut h = VnetHeader {
            flags: NEEDS_CSUM,
            csum_start: 34,
            csum_offset: 16,
            ..Default::default()
        };
        assert_eq!(
            h.offload(51),
            Err(VnetError::Malformed),
            "field past the end"
        );
        assert!(h.offload(52).is_ok());
        h.gso_type = GSO_UDP;
        h.gso_size = 1000;
        assert_eq!(h.offload(100), Err(VnetError::UnsupportedGso(GSO_UDP)));
        h.gso_type = GSO_TCPV4;
        h.gso_size = 0;
        assert_eq!(h.offload(100), Err(VnetError::Malformed), "no segment size");
        let plain = VnetHeader {
            flags: DATA_VALID,
            ..Default::default()
        };
        let o = plain.offload(60).unwrap();
        assert!(o.is_none() && o.checksum_valid);
    }

    /// A UDP and a TCP packet whose checksum fields hold the pseudo-header's sum, as a
    /// host with checksum offload sends them, come out with the checksums `etherparse`
    /// computes for the whole packet.
    #[test]
    fn a_partial_checksum_is_finished_as_the_whole_one() {
        for tcp in [false, true] {
            for v6 in [false, true] {
                let b = PacketBuilder::ethernet2([2; 6], [4; 6]);
                let b = if v6 {
                    b.ipv6([0x20; 16], [0x30; 16], 64)
                } else {
                    b.ipv4([10, 0, 0, 1], [10, 2, 0, 9], 64)
                };
                let payload: Vec<u8> = (0..333u32).map(|i| (i * 7) as u8).collect();
                let mut whole = Vec::new();
                if tcp {
                    b.tcp(4000, 80, 12345, 1000)
                        .write(&mut whole, &payload)
                        .unwrap();
                } else {
                    b.udp(4000, 53).write(&mut whole, &payload).unwrap();
                }
                let l4 = if v6 { 54 } else { 34 };
                let offset = if tcp { 16 } else { 6 };
                // The pseudo-header's sum: the whole checksum's complement, less the
                // segment's own sum.
                let mut partial = whole.clone();
                partial[l4 + offset..l4 + offset + 2].fill(0);
                let segment = checksum::sum(&partial[l4..]);
                let pseudo = checksum::add(
                    !u16::from_be_bytes([whole[l4 + offset], whole[l4 + offset + 1]]),
                    !segment,
                );
                partial[l4 + offset..l4 + offset + 2].copy_from_slice(&pseudo.to_be_bytes());
                assert_ne!(partial, whole);
                let p = PartialChecksum {
                    start: l4 as u16,
                    offset: offset as u16,
                };
                assert!(finish_checksum(&mut partial, p));
                assert_eq!(partial, whole, "tcp {tcp} v6 {v6}");
            }
        }
        let mut short = [0u8; 40];
        assert!(!finish_checksum(
            &mut short,
            PartialChecksum {
                start: 34,
                offset: 6
            }
        ));
    }
}
