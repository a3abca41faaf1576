//! An ICMP (RFC 792) or ICMPv6 (RFC 4443) message's first eight bytes, which the two
//! share: the type, the code, the checksum and four bytes whose meaning the type
//! gives (an MTU, a pointer, an identifier and a sequence number), then the body (for
//! an error, as much of the packet that caused it as fits).

use crate::{be16, be32, view};
use std::fmt;

/// The header's fields, as byte offsets and ranges.
pub mod field {
    use std::ops::Range;
    /// The type.
    pub const TYPE: usize = 0;
    /// The code.
    pub const CODE: usize = 1;
    /// The checksum.
    pub const CHECKSUM: Range<usize> = 2..4;
    /// The rest of the header, by type.
    pub const REST: Range<usize> = 4..8;
    /// The next-hop MTU of an IPv4 fragmentation needed error.
    pub const NEXT_HOP_MTU: Range<usize> = 6..8;
    /// The body.
    pub const BODY: usize = 8;
}

/// The bytes of the header.
pub const HEADER_LEN: usize = 8;

view!(
    /// A view of an ICMP or ICMPv6 message, its header first.
    IcmpMessage,
    HEADER_LEN,
    "ICMP"
);

impl<T: AsRef<[u8]>> IcmpMessage<T> {
    /// The type.
    #[inline(always)]
    pub fn kind(&self) -> u8 {
        self.buffer.as_ref()[field::TYPE]
    }

    /// The code.
    #[inline(always)]
    pub fn code(&self) -> u8 {
        self.buffer.as_ref()[field::CODE]
    }

    /// The checksum.
    #[inline(always)]
    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), field::CHECKSUM.start)
    }

    /// The rest of the header, as one word.
    #[inline(always)]
    pub fn rest(&self) -> u32 {
        be32(self.buffer.as_ref(), field::REST.start)
    }

    /// The body after the header.
    #[inline(always)]
    pub fn body(&self) -> &[u8] {
        &self.buffer.as_ref()[field::BODY..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> IcmpMessage<T> {
    /// Sets the type and the code.
    #[inline(always)]
    pub fn set_kind_and_code(&mut self, kind: u8, code: u8) {
        let b = self.buffer.as_mut();
        b[field::TYPE] = kind;
        b[field::CODE] = code;
    }

    /// Sets the checksum.
    #[inline(always)]
    pub fn set_checksum(&mut self, sum: u16) {
        self.buffer.as_mut()[field::CHECKSUM].copy_from_slice(&sum.to_be_bytes());
    }

    /// Sets the rest of the header.
    #[inline(always)]
    pub fn set_rest(&mut self, rest: u32) {
        self.buffer.as_mut()[field::REST].copy_from_slice(&rest.to_be_bytes());
    }

    /// The body after the header, to write.
    #[inline(always)]
    pub fn body_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::BODY..]
    }
}

impl<T: AsRef<[u8]>> fmt::Display for IcmpMessage<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ICMP type {} code {} rest {:#010x}",
            self.kind(),
            self.code(),
            self.rest()
        )
    }
}
