//! # fibre-headers: typed views over packet headers
//!
//! The packet path reads and rewrites headers in place, in the buffers frames arrive
//! in. Each view here wraps a byte buffer (`&[u8]` to read, `&mut [u8]` to write too)
//! and names its fields, in the manner of smoltcp's `wire` module:
//!
//! - its checked constructor (`new_checked`) refuses a buffer too short for the fixed
//!   header, so that every accessor reads without a further check and cannot panic;
//! - the field offsets are written once, in each module's `field`;
//! - getters for every buffer, setters where the buffer is mutable, checksums verified
//!   and filled by the view;
//! - `Display`, so that a packet can be shown in a log line.
//!
//! What a view does not decide is a header's meaning: the input stage of the packet
//! path checks the lengths and versions in the order the kernel checks them, to count
//! each failure under the kernel's reason; the views give it the fields to check.
//!
//! - [`ethernet`]: [`EthernetFrame`], and the EtherTypes fibre tells apart.
//! - [`ipv4`]: [`Ipv4Packet`], its checksum, its fragment fields.
//! - [`ipv6`]: [`Ipv6Packet`], and the extension headers after it
//!   ([`Ipv6Extension`], [`Ipv6Fragment`]).
//! - [`udp`], [`tcp`], [`icmp`]: [`UdpDatagram`], [`TcpSegment`], [`IcmpMessage`]
//!   (ICMP and ICMPv6 share the first eight bytes).
//! - [`transport`]: the ports at the start of TCP, UDP, SCTP and DCCP.
//! - [`checksum`]: the Internet checksum, whole and incremental.

pub mod checksum;
pub mod ethernet;
pub mod icmp;
pub mod ipv4;
pub mod ipv6;
pub mod tcp;
pub mod transport;
pub mod udp;

pub use ethernet::EthernetFrame;
pub use icmp::IcmpMessage;
pub use ipv4::Ipv4Packet;
pub use ipv6::{Ipv6Extension, Ipv6Fragment, Ipv6Packet};
pub use tcp::TcpSegment;
pub use udp::UdpDatagram;

/// A buffer too short for the header a view was asked to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Truncated {
    /// The header's name.
    pub header: &'static str,
    /// The bytes it needs.
    pub needs: usize,
    /// The bytes there were.
    pub had: usize,
}

impl std::fmt::Display for Truncated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} header truncated: {} bytes of {}",
            self.header, self.had, self.needs
        )
    }
}

impl std::error::Error for Truncated {}

/// Refuses a buffer shorter than `needs` for the header `header`.
#[inline(always)]
pub(crate) fn check(buffer: &[u8], needs: usize, header: &'static str) -> Result<(), Truncated> {
    if buffer.len() >= needs {
        Ok(())
    } else {
        Err(Truncated {
            header,
            needs,
            had: buffer.len(),
        })
    }
}

/// The big-endian 16-bit word at `at`.
#[inline(always)]
pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// The big-endian 32-bit word at `at`.
#[inline(always)]
pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The `N` bytes at `at`.
#[inline(always)]
pub(crate) fn bytes<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut out = [0; N];
    out.copy_from_slice(&b[at..at + N]);
    out
}

/// Declares a view type `$name<T>` over a buffer whose fixed header is `$len` bytes,
/// with its checked constructor and the ways back to the buffer.
macro_rules! view {
    ($(#[$doc:meta])* $name:ident, $len:expr, $header:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// The bytes of the fixed header.
            pub const HEADER_LEN: usize = $len;

            /// A view of `buffer`, refused if it is shorter than the fixed header.
            #[inline(always)]
            pub fn new_checked(buffer: T) -> Result<Self, $crate::Truncated> {
                $crate::check(buffer.as_ref(), $len, $header)?;
                Ok(Self { buffer })
            }

            /// The buffer the view was made of.
            #[inline(always)]
            pub fn into_inner(self) -> T {
                self.buffer
            }

            /// The whole buffer, the header first.
            #[inline(always)]
            pub fn as_bytes(&self) -> &[u8] {
                self.buffer.as_ref()
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $name<T> {
            /// The whole buffer, the header first, to write.
            #[inline(always)]
            pub fn as_bytes_mut(&mut self) -> &mut [u8] {
                self.buffer.as_mut()
            }
        }
    };
}
pub(crate) use view;
