//! An IPv4 packet's header (RFC 791): 20 fixed bytes, options up to 60, then the
//! payload up to the total length.
//!
//! The view is checked for the 20 fixed bytes only. The header length, the total length
//! and the checksum are fields a reader checks: the input stage checks them in the
//! kernel's order, to name each failure as the kernel names it. [`Ipv4Packet::payload`]
//! and [`Ipv4Packet::header`] never read past the buffer, whatever the lengths say.

use crate::{be16, bytes, checksum, view};
use std::fmt;
use std::net::Ipv4Addr;

/// The header's fields, as byte offsets and ranges.
pub mod field {
    use std::ops::Range;
    /// The version (high nibble) and the header length in words (low nibble).
    pub const VERSION_AND_LENGTH: usize = 0;
    /// The type of service: DSCP and ECN.
    pub const TOS: usize = 1;
    /// The total length.
    pub const LENGTH: Range<usize> = 2..4;
    /// The identification.
    pub const IDENT: Range<usize> = 4..6;
    /// The flags (reserved, DF, MF) and the fragment offset in 8-byte units.
    pub const FLAGS_AND_OFFSET: Range<usize> = 6..8;
    /// The time to live.
    pub const TTL: usize = 8;
    /// The protocol of the payload.
    pub const PROTOCOL: usize = 9;
    /// The header checksum.
    pub const CHECKSUM: Range<usize> = 10..12;
    /// The source address.
    pub const SOURCE: Range<usize> = 12..16;
    /// The destination address.
    pub const DESTINATION: Range<usize> = 16..20;
}

/// Don't fragment, in the flags and offset word.
pub const DONT_FRAGMENT: u16 = 0x4000;
/// More fragments, in the flags and offset word.
pub const MORE_FRAGMENTS: u16 = 0x2000;
/// The fragment offset's bits, in the flags and offset word.
pub const OFFSET_MASK: u16 = 0x1fff;

/// The bytes of the fixed header.
pub const HEADER_LEN: usize = 20;

view!(
    /// A view of an IPv4 packet, its header first.
    Ipv4Packet,
    HEADER_LEN,
    "IPv4"
);

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    #[inline(always)]
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The version (4 for a good packet).
    #[inline(always)]
    pub fn version(&self) -> u8 {
        self.b()[field::VERSION_AND_LENGTH] >> 4
    }

    /// The header's length in bytes, options included, as the header says.
    #[inline(always)]
    pub fn header_len(&self) -> usize {
        usize::from(self.b()[field::VERSION_AND_LENGTH] & 0xf) * 4
    }

    /// The type of service byte (DSCP and ECN).
    #[inline(always)]
    pub fn tos(&self) -> u8 {
        self.b()[field::TOS]
    }

    /// The total length, header included, as the header says.
    #[inline(always)]
    pub fn total_len(&self) -> u16 {
        be16(self.b(), field::LENGTH.start)
    }

    /// The identification.
    #[inline(always)]
    pub fn ident(&self) -> u16 {
        be16(self.b(), field::IDENT.start)
    }

    /// The flags and fragment offset word, whole.
    #[inline(always)]
    pub fn flags_and_offset(&self) -> u16 {
        be16(self.b(), field::FLAGS_AND_OFFSET.start)
    }

    /// Don't fragment.
    #[inline(always)]
    pub fn dont_fragment(&self) -> bool {
        self.flags_and_offset() & DONT_FRAGMENT != 0
    }

    /// More fragments follow.
    #[inline(always)]
    pub fn more_fragments(&self) -> bool {
        self.flags_and_offset() & MORE_FRAGMENTS != 0
    }

    /// The fragment offset, in 8-byte units.
    #[inline(always)]
    pub fn fragment_offset(&self) -> u16 {
        self.flags_and_offset() & OFFSET_MASK
    }

    /// A fragment: more follow, or it is not the first.
    #[inline(always)]
    pub fn is_fragment(&self) -> bool {
        self.flags_and_offset() & (MORE_FRAGMENTS | OFFSET_MASK) != 0
    }

    /// The time to live.
    #[inline(always)]
    pub fn ttl(&self) -> u8 {
        self.b()[field::TTL]
    }

    /// The protocol of the payload.
    #[inline(always)]
    pub fn protocol(&self) -> u8 {
        self.b()[field::PROTOCOL]
    }

    /// The header checksum.
    #[inline(always)]
    pub fn checksum(&self) -> u16 {
        be16(self.b(), field::CHECKSUM.start)
    }

    /// The source address.
    #[inline(always)]
    pub fn source(&self) -> Ipv4Addr {
        Ipv4Addr::from(bytes::<4>(self.b(), field::SOURCE.start))
    }

    /// The destination address.
    #[inline(always)]
    pub fn destination(&self) -> Ipv4Addr {
        Ipv4Addr::from(bytes::<4>(self.b(), field::DESTINATION.start))
    }

    /// The header, options included, as far as the buffer holds it.
    #[inline(always)]
    pub fn header(&self) -> &[u8] {
        let b = self.b();
        &b[..self.header_len().clamp(HEADER_LEN, b.len())]
    }

    /// Whether the header is whole in the buffer and its checksum holds. The usual
    /// header, without options, is summed as five words of a fixed array: no loop.
    #[inline(always)]
    pub fn checksum_holds(&self) -> bool {
        let b = self.b();
        let len = self.header_len();
        if len == HEADER_LEN {
            let h: &[u8; HEADER_LEN] = bytes_ref(b);
            let word = |k: usize| u32::from_be_bytes([h[k], h[k + 1], h[k + 2], h[k + 3]]) as u64;
            let mut s = word(0) + word(4) + word(8) + word(12) + word(16);
            s = (s & 0xffff_ffff) + (s >> 32);
            s = (s & 0xffff) + (s >> 16);
            s = (s & 0xffff) + (s >> 16);
            s = (s & 0xffff) + (s >> 16);
            s == 0xffff
        } else {
            len >= HEADER_LEN && len <= b.len() && checksum::holds(&b[..len])
        }
    }

    /// The payload: from the header's end to the total length, both cut to the buffer
    /// (empty where the lengths say nothing sensible).
    #[inline(always)]
    pub fn payload(&self) -> &[u8] {
        let b = self.b();
        let end = usize::from(self.total_len()).min(b.len());
        b.get(self.header_len()..end).unwrap_or(&[])
    }
}

/// The first 20 bytes of a buffer known to hold them, as an array.
#[inline(always)]
fn bytes_ref(b: &[u8]) -> &[u8; HEADER_LEN] {
    // The view's constructor checked the length: this cannot fail.
    b[..HEADER_LEN].try_into().unwrap_or(&[0; HEADER_LEN])
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    #[inline(always)]
    fn m(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    /// Sets the version to 4 and the header length to `len` bytes (a multiple of 4).
    #[inline(always)]
    pub fn set_version_and_header_len(&mut self, len: usize) {
        self.m()[field::VERSION_AND_LENGTH] = 0x40 | ((len / 4) as u8 & 0xf);
    }

    /// Sets the type of service byte.
    #[inline(always)]
    pub fn set_tos(&mut self, tos: u8) {
        self.m()[field::TOS] = tos;
    }

    /// Sets the total length.
    #[inline(always)]
    pub fn set_total_len(&mut self, len: u16) {
        self.m()[field::LENGTH].copy_from_slice(&len.to_be_bytes());
    }

    /// Sets the identification.
    #[inline(always)]
    pub fn set_ident(&mut self, ident: u16) {
        self.m()[field::IDENT].copy_from_slice(&ident.to_be_bytes());
    }

    /// Sets the flags and fragment offset word.
    #[inline(always)]
    pub fn set_flags_and_offset(&mut self, word: u16) {
        self.m()[field::FLAGS_AND_OFFSET].copy_from_slice(&word.to_be_bytes());
    }

    /// Sets the time to live (the checksum is left as it was).
    #[inline(always)]
    pub fn set_ttl(&mut self, ttl: u8) {
        self.m()[field::TTL] = ttl;
    }

    /// Sets the protocol.
    #[inline(always)]
    pub fn set_protocol(&mut self, protocol: u8) {
        self.m()[field::PROTOCOL] = protocol;
    }

    /// Sets the header checksum.
    #[inline(always)]
    pub fn set_checksum(&mut self, sum: u16) {
        self.m()[field::CHECKSUM].copy_from_slice(&sum.to_be_bytes());
    }

    /// Sets the source address.
    #[inline(always)]
    pub fn set_source(&mut self, addr: Ipv4Addr) {
        self.m()[field::SOURCE].copy_from_slice(&addr.octets());
    }

    /// Sets the destination address.
    #[inline(always)]
    pub fn set_destination(&mut self, addr: Ipv4Addr) {
        self.m()[field::DESTINATION].copy_from_slice(&addr.octets());
    }

    /// Computes the header checksum again and sets it, over the header as far as the
    /// buffer holds it.
    #[inline]
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let sum = checksum::checksum(self.header());
        self.set_checksum(sum);
    }

    /// Takes the TTL down by one and updates the checksum for that word alone (RFC
    /// 1624). False, and nothing changed, if the TTL is already 0.
    #[inline(always)]
    pub fn decrement_ttl(&mut self) -> bool {
        let (ttl, protocol, old) = (self.ttl(), self.protocol(), self.checksum());
        if ttl == 0 {
            return false;
        }
        // The TTL shares its 16-bit word with the protocol.
        let from = u16::from_be_bytes([ttl, protocol]);
        let to = u16::from_be_bytes([ttl - 1, protocol]);
        self.set_ttl(ttl - 1);
        self.set_checksum(checksum::update(old, from, to));
        true
    }

    /// The payload, to write: as [`Ipv4Packet::payload`] finds it.
    #[inline(always)]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let (start, total) = (self.header_len(), usize::from(self.total_len()));
        let b = self.m();
        let end = total.min(b.len());
        b.get_mut(start..end).unwrap_or(&mut [])
    }
}

impl<T: AsRef<[u8]>> fmt::Display for Ipv4Packet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "IPv4 {} > {} proto {} ttl {} len {} id {}",
            self.source(),
            self.destination(),
            self.protocol(),
            self.ttl(),
            self.total_len(),
            self.ident()
        )?;
        if self.is_fragment() {
            write!(
                f,
                " frag {}{}",
                usize::from(self.fragment_offset()) * 8,
                if self.more_fragments() { "+" } else { "" }
            )?;
        }
        if self.dont_fragment() {
            write!(f, " DF")?;
        }
        Ok(())
    }
}
