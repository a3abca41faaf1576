//! The ports that open TCP, UDP, SCTP and DCCP headers alike: the source port, then the
//! destination port. The kernel's flow keys and route lookups read them so, whatever
//! the protocol.

/// TCP.
pub const TCP: u8 = 6;
/// UDP.
pub const UDP: u8 = 17;
/// DCCP.
pub const DCCP: u8 = 33;
/// SCTP.
pub const SCTP: u8 = 132;

/// Whether the header of `protocol` opens with the two ports.
#[inline(always)]
pub fn has_ports(protocol: u8) -> bool {
    matches!(protocol, TCP | UDP | DCCP | SCTP)
}

/// The source and destination ports at the start of `header`, if it holds them.
#[inline(always)]
pub fn ports(header: &[u8]) -> Option<(u16, u16)> {
    let p = header.get(..4)?;
    Some((
        u16::from_be_bytes([p[0], p[1]]),
        u16::from_be_bytes([p[2], p[3]]),
    ))
}
