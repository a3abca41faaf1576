//! A UDP header (RFC 768): ports, length and checksum, eight bytes.

use crate::{be16, view};
use std::fmt;

/// The header's fields, as byte ranges.
pub mod field {
    use std::ops::Range;
    /// The source port.
    pub const SOURCE_PORT: Range<usize> = 0..2;
    /// The destination port.
    pub const DESTINATION_PORT: Range<usize> = 2..4;
    /// The length, header included.
    pub const LENGTH: Range<usize> = 4..6;
    /// The checksum (0: none, over IPv4).
    pub const CHECKSUM: Range<usize> = 6..8;
}

/// The bytes of the header.
pub const HEADER_LEN: usize = 8;

view!(
    /// A view of a UDP datagram, its header first.
    UdpDatagram,
    HEADER_LEN,
    "UDP"
);

impl<T: AsRef<[u8]>> UdpDatagram<T> {
    /// The source port.
    #[inline(always)]
    pub fn source_port(&self) -> u16 {
        be16(self.buffer.as_ref(), field::SOURCE_PORT.start)
    }

    /// The destination port.
    #[inline(always)]
    pub fn destination_port(&self) -> u16 {
        be16(self.buffer.as_ref(), field::DESTINATION_PORT.start)
    }

    /// The length, header included, as the header says.
    #[inline(always)]
    pub fn len(&self) -> u16 {
        be16(self.buffer.as_ref(), field::LENGTH.start)
    }

    /// Whether the length field says 0 (never a good datagram's).
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The checksum.
    #[inline(always)]
    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), field::CHECKSUM.start)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> UdpDatagram<T> {
    /// Sets the source port.
    #[inline(always)]
    pub fn set_source_port(&mut self, port: u16) {
        self.buffer.as_mut()[field::SOURCE_PORT].copy_from_slice(&port.to_be_bytes());
    }

    /// Sets the destination port.
    #[inline(always)]
    pub fn set_destination_port(&mut self, port: u16) {
        self.buffer.as_mut()[field::DESTINATION_PORT].copy_from_slice(&port.to_be_bytes());
    }

    /// Sets the length.
    #[inline(always)]
    pub fn set_len(&mut self, len: u16) {
        self.buffer.as_mut()[field::LENGTH].copy_from_slice(&len.to_be_bytes());
    }

    /// Sets the checksum.
    #[inline(always)]
    pub fn set_checksum(&mut self, sum: u16) {
        self.buffer.as_mut()[field::CHECKSUM].copy_from_slice(&sum.to_be_bytes());
    }
}

impl<T: AsRef<[u8]>> fmt::Display for UdpDatagram<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "UDP {} > {} len {}",
            self.source_port(),
            self.destination_port(),
            self.len()
        )
    }
}
