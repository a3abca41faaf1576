//! Prefixes: an address and a length, host bits cleared.
//!
//! `Prefix<u32>` is an IPv4 prefix, `Prefix<u128>` an IPv6 one. Constructing a prefix
//! clears the bits past its length, so `10.1.2.3/8` and `10.0.0.0/8` are the same prefix,
//! as they are to a router.

use crate::key::Key;
use std::fmt;
use std::str::FromStr;

/// A network prefix of one address family: `addr/len` with the host bits cleared.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Prefix<K: Key> {
    addr: K,
    len: u8,
}

/// An IPv4 prefix.
pub type Ipv4Prefix = Prefix<u32>;
/// An IPv6 prefix.
pub type Ipv6Prefix = Prefix<u128>;

/// Why a prefix could not be made or parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrefixError {
    /// The length exceeds the family's width.
    LengthTooLong {
        /// The length given.
        len: u32,
        /// The family's width.
        max: u8,
    },
    /// The length after `/` is not a number (the text, quoted, at most
    /// [`QUOTE_CHARS`] characters of it).
    BadLength(String),
    /// The address part does not parse as an address of this family (the text, quoted,
    /// at most [`QUOTE_CHARS`] characters of it).
    BadAddress(String),
}

/// Characters of a bad input that an error quotes; the rest is counted, not copied (a
/// 10 MB line must not come back as a 10 MB message).
pub const QUOTE_CHARS: usize = 40;

/// `text` quoted for an error message: whole if it is short, else its first
/// [`QUOTE_CHARS`] characters and its length.
pub fn quote(text: &str) -> String {
    match text.char_indices().nth(QUOTE_CHARS) {
        None => format!("{text:?}"),
        Some((cut, _)) => format!("{:?}... ({} bytes)", &text[..cut], text.len()),
    }
}

impl fmt::Display for PrefixError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PrefixError::LengthTooLong { len, max } => {
                write!(f, "prefix length {len} is longer than {max}")
            }
            PrefixError::BadLength(s) => write!(f, "prefix length {s} is not a number"),
            PrefixError::BadAddress(s) => write!(f, "{s} is not a valid address"),
        }
    }
}

impl std::error::Error for PrefixError {}

impl<K: Key> Prefix<K> {
    /// The prefix of length `len` containing `addr` (host bits are cleared).
    pub fn new(addr: K, len: u8) -> Result<Self, PrefixError> {
        if len > K::BITS {
            return Err(PrefixError::LengthTooLong {
                len: len.into(),
                max: K::BITS,
            });
        }
        Ok(Prefix {
            addr: addr.mask(len),
            len,
        })
    }

    /// Like [`Prefix::new`] for lengths known to be valid; the length is clamped to the width.
    pub fn new_clamped(addr: K, len: u8) -> Self {
        let len = len.min(K::BITS);
        Prefix {
            addr: addr.mask(len),
            len,
        }
    }

    /// The host route (`/32` or `/128`) of an address.
    pub fn host(addr: K) -> Self {
        Prefix { addr, len: K::BITS }
    }

    /// The network address (host bits zero).
    pub fn addr(&self) -> K {
        self.addr
    }

    /// The prefix length.
    #[allow(clippy::len_without_is_empty)] // a prefix length, not a container size
    pub fn len(&self) -> u8 {
        self.len
    }

    /// True for the default route (`/0`).
    pub fn is_default(&self) -> bool {
        self.len == 0
    }

    /// True if `key` lies inside this prefix.
    pub fn contains(&self, key: K) -> bool {
        key.mask(self.len) == self.addr
    }

    /// True if `other` lies inside this prefix (it may be the same prefix).
    pub fn covers(&self, other: &Prefix<K>) -> bool {
        other.len >= self.len && self.contains(other.addr)
    }
}

impl<K: Key> fmt::Display for Prefix<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", K::Addr::from(self.addr), self.len)
    }
}

impl<K: Key> fmt::Debug for Prefix<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl<K: Key> FromStr for Prefix<K> {
    type Err = PrefixError;

    /// Parses `addr/len`, or a bare address as a host route.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => {
                let len: u32 = l.parse().map_err(|_| PrefixError::BadLength(quote(l)))?;
                (a, len)
            }
            None => (s, u32::from(K::BITS)),
        };
        let addr: K::Addr = addr
            .parse()
            .map_err(|_| PrefixError::BadAddress(quote(addr)))?;
        if len > u32::from(K::BITS) {
            return Err(PrefixError::LengthTooLong { len, max: K::BITS });
        }
        Prefix::new(addr.into(), len as u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_masks_host_bits_and_round_trips() {
        let p: Ipv4Prefix = "10.1.2.3/8".parse().unwrap();
        assert_eq!(p.to_string(), "10.0.0.0/8");
        let p: Ipv6Prefix = "2001:db8::1/32".parse().unwrap();
        assert_eq!(p.to_string(), "2001:db8::/32");
        let host: Ipv4Prefix = "192.0.2.1".parse().unwrap();
        assert_eq!(host.len(), 32);
        let all: Ipv6Prefix = "::/0".parse().unwrap();
        assert!(all.is_default());
        assert!(all.contains(u128::MAX));
    }

    #[test]
    fn parse_errors_say_what_is_wrong() {
        let e = "10.0.0.0/33".parse::<Ipv4Prefix>().unwrap_err();
        assert_eq!(e.to_string(), "prefix length 33 is longer than 32");
        let e = "10.0.0/8".parse::<Ipv4Prefix>().unwrap_err();
        assert!(matches!(e, PrefixError::BadAddress(_)));
        let e = "2001:db8::/x".parse::<Ipv6Prefix>().unwrap_err();
        assert!(matches!(e, PrefixError::BadLength(_)));
        assert!("::1/8".parse::<Ipv4Prefix>().is_err());
    }

    #[test]
    fn errors_quote_a_bounded_excerpt_of_the_input() {
        assert_eq!(quote("10.0.0.0"), "\"10.0.0.0\"");
        let huge = "9".repeat(10 << 20);
        let e = format!("{huge}/8")
            .parse::<Ipv4Prefix>()
            .unwrap_err()
            .to_string();
        assert!(e.len() < 100, "{} bytes", e.len());
        assert!(e.contains("(10485760 bytes)"), "{e}");
        let e = format!("10.0.0.0/{huge}")
            .parse::<Ipv4Prefix>()
            .unwrap_err()
            .to_string();
        assert!(e.len() < 100 && e.starts_with("prefix length \"999"), "{e}");
        // Cut at a character boundary, never inside one.
        let wide = "é".repeat(100);
        assert_eq!(
            quote(&wide),
            format!("{:?}... (200 bytes)", "é".repeat(QUOTE_CHARS))
        );
    }

    #[test]
    fn covers_is_containment() {
        let a: Ipv4Prefix = "10.0.0.0/8".parse().unwrap();
        let b: Ipv4Prefix = "10.20.0.0/16".parse().unwrap();
        assert!(a.covers(&b));
        assert!(!b.covers(&a));
        assert!(a.covers(&a));
    }
}
