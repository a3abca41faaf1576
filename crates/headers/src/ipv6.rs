//! An IPv6 packet's fixed header (RFC 8200): 40 bytes, then extension headers, each
//! saying what follows it, then the upper layer, up to the payload length.
//!
//! [`Ipv6Extension`] reads the two bytes every extension header starts with, and
//! [`Ipv6Fragment`] the fragment header's eight. How far to walk them differs by
//! reader (the kernel's `ipv6_skip_exthdr` steps over the authentication header, its
//! segmentation does not), so each reader walks them itself, through these views.

use crate::{be16, be32, bytes, view};
use std::fmt;
use std::net::Ipv6Addr;

/// The fixed header's fields, as byte offsets and ranges.
pub mod field {
    use std::ops::Range;
    /// The version, traffic class and flow label.
    pub const VERSION_CLASS_FLOW: Range<usize> = 0..4;
    /// The payload length: what follows the fixed header.
    pub const PAYLOAD_LEN: Range<usize> = 4..6;
    /// The next header.
    pub const NEXT_HEADER: usize = 6;
    /// The hop limit.
    pub const HOP_LIMIT: usize = 7;
    /// The source address.
    pub const SOURCE: Range<usize> = 8..24;
    /// The destination address.
    pub const DESTINATION: Range<usize> = 24..40;
}

/// Next header values of extension headers and of what ends them.
pub mod next {
    /// Hop-by-hop options.
    pub const HOP_BY_HOP: u8 = 0;
    /// Routing.
    pub const ROUTING: u8 = 43;
    /// Fragment.
    pub const FRAGMENT: u8 = 44;
    /// Encapsulating security payload.
    pub const ESP: u8 = 50;
    /// Authentication header.
    pub const AUTHENTICATION: u8 = 51;
    /// ICMPv6.
    pub const ICMPV6: u8 = 58;
    /// No next header.
    pub const NONE: u8 = 59;
    /// Destination options.
    pub const DESTINATION_OPTIONS: u8 = 60;
}

/// The bytes of the fixed header.
pub const HEADER_LEN: usize = 40;

view!(
    /// A view of an IPv6 packet, its fixed header first.
    Ipv6Packet,
    HEADER_LEN,
    "IPv6"
);

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    #[inline(always)]
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The version (6 for a good packet).
    #[inline(always)]
    pub fn version(&self) -> u8 {
        self.b()[0] >> 4
    }

    /// The traffic class (DSCP and ECN).
    #[inline(always)]
    pub fn traffic_class(&self) -> u8 {
        let b = self.b();
        (b[0] & 0xf) << 4 | b[1] >> 4
    }

    /// The flow label.
    #[inline(always)]
    pub fn flow_label(&self) -> u32 {
        be32(self.b(), field::VERSION_CLASS_FLOW.start) & 0xf_ffff
    }

    /// The payload length, as the header says.
    #[inline(always)]
    pub fn payload_len(&self) -> u16 {
        be16(self.b(), field::PAYLOAD_LEN.start)
    }

    /// The header that follows the fixed one.
    #[inline(always)]
    pub fn next_header(&self) -> u8 {
        self.b()[field::NEXT_HEADER]
    }

    /// The hop limit.
    #[inline(always)]
    pub fn hop_limit(&self) -> u8 {
        self.b()[field::HOP_LIMIT]
    }

    /// The source address.
    #[inline(always)]
    pub fn source(&self) -> Ipv6Addr {
        Ipv6Addr::from(bytes::<16>(self.b(), field::SOURCE.start))
    }

    /// The destination address.
    #[inline(always)]
    pub fn destination(&self) -> Ipv6Addr {
        Ipv6Addr::from(bytes::<16>(self.b(), field::DESTINATION.start))
    }

    /// Where the packet ends: the fixed header and the payload length, cut to the
    /// buffer.
    #[inline(always)]
    pub fn end(&self) -> usize {
        (HEADER_LEN + usize::from(self.payload_len())).min(self.b().len())
    }

    /// What follows the fixed header, up to the payload length (cut to the buffer).
    #[inline(always)]
    pub fn payload(&self) -> &[u8] {
        &self.b()[HEADER_LEN..self.end()]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6Packet<T> {
    #[inline(always)]
    fn m(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    /// Sets the version to 6, the traffic class and the flow label.
    #[inline(always)]
    pub fn set_version_class_flow(&mut self, class: u8, flow: u32) {
        let word = 6 << 28 | u32::from(class) << 20 | flow & 0xf_ffff;
        self.m()[field::VERSION_CLASS_FLOW].copy_from_slice(&word.to_be_bytes());
    }

    /// Sets the payload length.
    #[inline(always)]
    pub fn set_payload_len(&mut self, len: u16) {
        self.m()[field::PAYLOAD_LEN].copy_from_slice(&len.to_be_bytes());
    }

    /// Sets the next header.
    #[inline(always)]
    pub fn set_next_header(&mut self, next: u8) {
        self.m()[field::NEXT_HEADER] = next;
    }

    /// Sets the hop limit.
    #[inline(always)]
    pub fn set_hop_limit(&mut self, hops: u8) {
        self.m()[field::HOP_LIMIT] = hops;
    }

    /// Takes the hop limit down by one. False, and nothing changed, if it is already 0.
    #[inline(always)]
    pub fn decrement_hop_limit(&mut self) -> bool {
        let hops = self.hop_limit();
        if hops == 0 {
            return false;
        }
        self.set_hop_limit(hops - 1);
        true
    }

    /// Sets the source address.
    #[inline(always)]
    pub fn set_source(&mut self, addr: Ipv6Addr) {
        self.m()[field::SOURCE].copy_from_slice(&addr.octets());
    }

    /// Sets the destination address.
    #[inline(always)]
    pub fn set_destination(&mut self, addr: Ipv6Addr) {
        self.m()[field::DESTINATION].copy_from_slice(&addr.octets());
    }
}

impl<T: AsRef<[u8]>> fmt::Display for Ipv6Packet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "IPv6 {} > {} next {} hlim {} len {}",
            self.source(),
            self.destination(),
            self.next_header(),
            self.hop_limit(),
            self.payload_len()
        )
    }
}

view!(
    /// A view of an IPv6 extension header's first two bytes: what follows it, and its
    /// length.
    Ipv6Extension,
    2,
    "IPv6 extension"
);

impl<T: AsRef<[u8]>> Ipv6Extension<T> {
    /// The header that follows this one.
    #[inline(always)]
    pub fn next_header(&self) -> u8 {
        self.buffer.as_ref()[0]
    }

    /// This header's length in bytes, for an extension header of kind `kind` (the
    /// next header value that named it): the authentication header counts 4-byte
    /// words less two, the fragment header is 8 bytes, the others count 8-byte words
    /// less one.
    #[inline(always)]
    pub fn len(&self, kind: u8) -> usize {
        let words = usize::from(self.buffer.as_ref()[1]);
        match kind {
            next::AUTHENTICATION => (words + 2) * 4,
            next::FRAGMENT => 8,
            _ => (words + 1) * 8,
        }
    }
}

view!(
    /// A view of an IPv6 fragment header (RFC 8200, section 4.5).
    Ipv6Fragment,
    8,
    "IPv6 fragment"
);

impl<T: AsRef<[u8]>> Ipv6Fragment<T> {
    /// The header that follows this one.
    #[inline(always)]
    pub fn next_header(&self) -> u8 {
        self.buffer.as_ref()[0]
    }

    /// The fragment offset, in 8-byte units.
    #[inline(always)]
    pub fn offset(&self) -> u16 {
        be16(self.buffer.as_ref(), 2) >> 3
    }

    /// More fragments follow.
    #[inline(always)]
    pub fn more_fragments(&self) -> bool {
        self.buffer.as_ref()[3] & 1 == 1
    }

    /// The identification.
    #[inline(always)]
    pub fn ident(&self) -> u32 {
        be32(self.buffer.as_ref(), 4)
    }
}
