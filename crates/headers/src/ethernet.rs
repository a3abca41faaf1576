//! An Ethernet II frame's header: the destination and source MAC addresses and the
//! EtherType, 14 bytes before the packet it carries.

use crate::view;
use std::fmt;

/// The header's fields, as byte ranges.
pub mod field {
    use std::ops::Range;
    /// The destination MAC address.
    pub const DESTINATION: Range<usize> = 0..6;
    /// The source MAC address.
    pub const SOURCE: Range<usize> = 6..12;
    /// The EtherType.
    pub const ETHERTYPE: Range<usize> = 12..14;
    /// The payload.
    pub const PAYLOAD: usize = 14;
}

/// The EtherTypes fibre tells apart.
pub mod ethertype {
    /// IPv4.
    pub const IPV4: u16 = 0x0800;
    /// IPv6.
    pub const IPV6: u16 = 0x86dd;
    /// ARP.
    pub const ARP: u16 = 0x0806;
    /// VLAN tags: 802.1Q and 802.1ad.
    pub const VLAN: [u16; 2] = [0x8100, 0x88a8];
}

/// The bytes of an Ethernet header.
pub const HEADER_LEN: usize = field::PAYLOAD;

view!(
    /// A view of an Ethernet frame: its header, then the packet it carries.
    EthernetFrame,
    HEADER_LEN,
    "Ethernet"
);

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// The destination MAC address.
    #[inline(always)]
    pub fn destination(&self) -> [u8; 6] {
        crate::bytes(self.buffer.as_ref(), field::DESTINATION.start)
    }

    /// The source MAC address.
    #[inline(always)]
    pub fn source(&self) -> [u8; 6] {
        crate::bytes(self.buffer.as_ref(), field::SOURCE.start)
    }

    /// Whether the destination is a group (broadcast or multicast) address.
    #[inline(always)]
    pub fn to_group(&self) -> bool {
        self.buffer.as_ref()[0] & 1 == 1
    }

    /// The EtherType.
    #[inline(always)]
    pub fn ethertype(&self) -> u16 {
        crate::be16(self.buffer.as_ref(), field::ETHERTYPE.start)
    }

    /// The packet the frame carries (with any padding after it).
    #[inline(always)]
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PAYLOAD..]
    }
}

impl<'a> EthernetFrame<&'a [u8]> {
    /// The packet the frame carries, for as long as the buffer lives.
    #[inline(always)]
    pub fn into_payload(self) -> &'a [u8] {
        &self.buffer[field::PAYLOAD..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    /// Sets the destination MAC address.
    #[inline(always)]
    pub fn set_destination(&mut self, mac: [u8; 6]) {
        self.buffer.as_mut()[field::DESTINATION].copy_from_slice(&mac);
    }

    /// Sets the source MAC address.
    #[inline(always)]
    pub fn set_source(&mut self, mac: [u8; 6]) {
        self.buffer.as_mut()[field::SOURCE].copy_from_slice(&mac);
    }

    /// Sets the EtherType.
    #[inline(always)]
    pub fn set_ethertype(&mut self, ethertype: u16) {
        self.buffer.as_mut()[field::ETHERTYPE].copy_from_slice(&ethertype.to_be_bytes());
    }

    /// The packet the frame carries, to write.
    #[inline(always)]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PAYLOAD..]
    }
}

impl<T: AsRef<[u8]>> fmt::Display for EthernetFrame<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mac = |m: [u8; 6]| {
            m.iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(":")
        };
        write!(
            f,
            "Ethernet {} > {} type {:#06x}",
            mac(self.source()),
            mac(self.destination()),
            self.ethertype()
        )
    }
}
