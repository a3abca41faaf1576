//! A TCP header (RFC 9293): ports, sequence and acknowledgment numbers, the data
//! offset, the flags, the window and the checksum; 20 fixed bytes, options up to 60.

use crate::{be16, be32, view};
use std::fmt;

/// The header's fields, as byte offsets and ranges.
pub mod field {
    use std::ops::Range;
    /// The source port.
    pub const SOURCE_PORT: Range<usize> = 0..2;
    /// The destination port.
    pub const DESTINATION_PORT: Range<usize> = 2..4;
    /// The sequence number.
    pub const SEQUENCE: Range<usize> = 4..8;
    /// The acknowledgment number.
    pub const ACKNOWLEDGMENT: Range<usize> = 8..12;
    /// The data offset, in 4-byte words (high nibble).
    pub const DATA_OFFSET: usize = 12;
    /// The flags.
    pub const FLAGS: usize = 13;
    /// The window.
    pub const WINDOW: Range<usize> = 14..16;
    /// The checksum.
    pub const CHECKSUM: Range<usize> = 16..18;
    /// The urgent pointer.
    pub const URGENT: Range<usize> = 18..20;
}

/// The flags' bits.
pub mod flags {
    /// No more data from the sender.
    pub const FIN: u8 = 0x01;
    /// Synchronize sequence numbers.
    pub const SYN: u8 = 0x02;
    /// Reset the connection.
    pub const RST: u8 = 0x04;
    /// Push.
    pub const PSH: u8 = 0x08;
    /// The acknowledgment number is significant.
    pub const ACK: u8 = 0x10;
    /// The urgent pointer is significant.
    pub const URG: u8 = 0x20;
}

/// The bytes of the fixed header.
pub const HEADER_LEN: usize = 20;

view!(
    /// A view of a TCP segment, its header first.
    TcpSegment,
    HEADER_LEN,
    "TCP"
);

impl<T: AsRef<[u8]>> TcpSegment<T> {
    #[inline(always)]
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The source port.
    #[inline(always)]
    pub fn source_port(&self) -> u16 {
        be16(self.b(), field::SOURCE_PORT.start)
    }

    /// The destination port.
    #[inline(always)]
    pub fn destination_port(&self) -> u16 {
        be16(self.b(), field::DESTINATION_PORT.start)
    }

    /// The sequence number.
    #[inline(always)]
    pub fn sequence(&self) -> u32 {
        be32(self.b(), field::SEQUENCE.start)
    }

    /// The acknowledgment number.
    #[inline(always)]
    pub fn acknowledgment(&self) -> u32 {
        be32(self.b(), field::ACKNOWLEDGMENT.start)
    }

    /// The header's length in bytes, options included, as the data offset says.
    #[inline(always)]
    pub fn header_len(&self) -> usize {
        usize::from(self.b()[field::DATA_OFFSET] >> 4) * 4
    }

    /// The flags byte.
    #[inline(always)]
    pub fn flags(&self) -> u8 {
        self.b()[field::FLAGS]
    }

    /// The window.
    #[inline(always)]
    pub fn window(&self) -> u16 {
        be16(self.b(), field::WINDOW.start)
    }

    /// The checksum.
    #[inline(always)]
    pub fn checksum(&self) -> u16 {
        be16(self.b(), field::CHECKSUM.start)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> TcpSegment<T> {
    #[inline(always)]
    fn m(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    /// Sets the source port.
    #[inline(always)]
    pub fn set_source_port(&mut self, port: u16) {
        self.m()[field::SOURCE_PORT].copy_from_slice(&port.to_be_bytes());
    }

    /// Sets the destination port.
    #[inline(always)]
    pub fn set_destination_port(&mut self, port: u16) {
        self.m()[field::DESTINATION_PORT].copy_from_slice(&port.to_be_bytes());
    }

    /// Sets the sequence number.
    #[inline(always)]
    pub fn set_sequence(&mut self, seq: u32) {
        self.m()[field::SEQUENCE].copy_from_slice(&seq.to_be_bytes());
    }

    /// Sets the acknowledgment number.
    #[inline(always)]
    pub fn set_acknowledgment(&mut self, ack: u32) {
        self.m()[field::ACKNOWLEDGMENT].copy_from_slice(&ack.to_be_bytes());
    }

    /// Sets the header length in bytes (a multiple of 4), the reserved bits cleared.
    #[inline(always)]
    pub fn set_header_len(&mut self, len: usize) {
        self.m()[field::DATA_OFFSET] = ((len / 4) as u8) << 4;
    }

    /// Sets the flags byte.
    #[inline(always)]
    pub fn set_flags(&mut self, flags: u8) {
        self.m()[field::FLAGS] = flags;
    }

    /// Sets the window.
    #[inline(always)]
    pub fn set_window(&mut self, window: u16) {
        self.m()[field::WINDOW].copy_from_slice(&window.to_be_bytes());
    }

    /// Sets the checksum.
    #[inline(always)]
    pub fn set_checksum(&mut self, sum: u16) {
        self.m()[field::CHECKSUM].copy_from_slice(&sum.to_be_bytes());
    }

    /// Sets the urgent pointer.
    #[inline(always)]
    pub fn set_urgent(&mut self, urgent: u16) {
        self.m()[field::URGENT].copy_from_slice(&urgent.to_be_bytes());
    }
}

impl<T: AsRef<[u8]>> fmt::Display for TcpSegment<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (flags::SYN, 'S'),
            (flags::FIN, 'F'),
            (flags::RST, 'R'),
            (flags::PSH, 'P'),
            (flags::ACK, '.'),
            (flags::URG, 'U'),
        ];
        let shown: String = names
            .iter()
            .filter(|(bit, _)| self.flags() & bit != 0)
            .map(|(_, c)| *c)
            .collect();
        write!(
            f,
            "TCP {} > {} [{}] seq {} ack {} win {}",
            self.source_port(),
            self.destination_port(),
            shown,
            self.sequence(),
            self.acknowledgment(),
            self.window()
        )
    }
}
