//! Addresses and prefixes of either family, as the configuration and the answers speak
//! of them.
//!
//! The LPM engines work on one family at a time (`u32`, `u128` keys); routing configuration
//! mixes both. [`Net`] is a prefix of either family with its host bits cleared, and
//! [`Family`] says which; conversions to the engines' keys are here and nowhere else.

use fibre_lpm::{Ipv4Prefix, Ipv6Prefix};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An address family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl Family {
    /// The family of an address.
    pub fn of(addr: IpAddr) -> Family {
        match addr {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// Width of an address in bits.
    pub fn bits(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }

    /// The all-zero address of the family.
    pub fn any(self) -> IpAddr {
        match self {
            Family::V4 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            Family::V6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        }
    }

    /// `inet` or `inet6`, as `ip` names the family.
    pub fn name(self) -> &'static str {
        match self {
            Family::V4 => "inet",
            Family::V6 => "inet6",
        }
    }
}

/// An address as an unsigned integer of 128 bits (IPv4 in the low 32).
pub fn addr_bits(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(a) => u32::from(a) as u128,
        IpAddr::V6(a) => u128::from(a),
    }
}

/// The address of `family` whose integer is `bits`.
pub fn addr_from_bits(family: Family, bits: u128) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(bits as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(bits)),
    }
}

/// A prefix of either family: an address and a length, host bits cleared.
///
/// Aligned to 8 bytes, not the 16 of its `u128`: 24 bytes rather than 32, in every route
/// (twice), every key of a table and every node of a snapshot, and read as fast.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(Rust, packed(8))]
pub struct Net {
    family: Family,
    bits: u128,
    len: u8,
}

impl Net {
    /// The prefix of `addr` and `len`, host bits cleared; `None` if `len` is too long.
    pub fn new(addr: IpAddr, len: u8) -> Option<Net> {
        let family = Family::of(addr);
        if len > family.bits() {
            return None;
        }
        Some(Net {
            family,
            bits: addr_bits(addr) & mask(family, len),
            len,
        })
    }

    /// The host prefix of `addr` (`/32` or `/128`).
    pub fn host(addr: IpAddr) -> Net {
        let family = Family::of(addr);
        Net {
            family,
            bits: addr_bits(addr),
            len: family.bits(),
        }
    }

    /// The default prefix (`0.0.0.0/0` or `::/0`).
    pub fn default_of(family: Family) -> Net {
        Net {
            family,
            bits: 0,
            len: 0,
        }
    }

    /// The keys `(dst, source)` of a table keyed by destination then source prefix
    /// that have destination `dst`, as a range of them.
    pub(crate) fn sources_of(dst: Net) -> std::ops::RangeInclusive<(Net, Net)> {
        let family = dst.family;
        (dst, Net::default_of(family))..=(dst, Net::bound(family, u128::MAX, u8::MAX))
    }

    /// A bound for ranges of prefixes in their order (family, bits, length): `bits` as
    /// given, host bits and all. Not a prefix to keep.
    pub(crate) fn bound(family: Family, bits: u128, len: u8) -> Net {
        Net { family, bits, len }
    }

    /// The network address's bits ([`addr_bits`]).
    pub(crate) fn bits(&self) -> u128 {
        self.bits
    }

    /// The last address's bits ([`addr_bits`]).
    pub(crate) fn last_bits(&self) -> u128 {
        self.bits | !mask(self.family, self.len) & full(self.family)
    }

    /// The prefix as a value and a mask over [`addr_bits`]: an address `a` is inside when
    /// `addr_bits(a) & mask == value`.
    pub(crate) fn value_and_mask(&self) -> (u128, u128) {
        (self.bits, mask(self.family, self.len))
    }

    /// The family.
    pub fn family(&self) -> Family {
        self.family
    }

    /// The network address.
    pub fn addr(&self) -> IpAddr {
        addr_from_bits(self.family, self.bits)
    }

    /// The prefix length.
    #[allow(clippy::len_without_is_empty)] // a prefix's length is not a collection's
    pub fn len(&self) -> u8 {
        self.len
    }

    /// Whether this is a default prefix.
    pub fn is_default(&self) -> bool {
        self.len == 0
    }

    /// Whether a host prefix.
    pub fn is_host(&self) -> bool {
        self.len == self.family.bits()
    }

    /// Whether `addr` (of the same family) lies inside.
    pub fn contains(&self, addr: IpAddr) -> bool {
        Family::of(addr) == self.family
            && addr_bits(addr) & mask(self.family, self.len) == self.bits
    }

    /// Whether `other` lies inside (same family, at least as long, same leading bits).
    pub fn covers(&self, other: &Net) -> bool {
        other.family == self.family
            && other.len >= self.len
            && other.bits & mask(self.family, self.len) == self.bits
    }

    /// The last address of the prefix (IPv4's broadcast address).
    pub fn last(&self) -> IpAddr {
        addr_from_bits(
            self.family,
            self.bits | !mask(self.family, self.len) & full(self.family),
        )
    }

    /// The IPv4 prefix, for the engines (`None` for IPv6).
    pub fn v4(&self) -> Option<Ipv4Prefix> {
        match self.family {
            Family::V4 => Ipv4Prefix::new(self.bits as u32, self.len).ok(),
            Family::V6 => None,
        }
    }

    /// The IPv6 prefix, for the engines (`None` for IPv4).
    pub fn v6(&self) -> Option<Ipv6Prefix> {
        match self.family {
            Family::V6 => Ipv6Prefix::new(self.bits, self.len).ok(),
            Family::V4 => None,
        }
    }

    /// Parses `ADDR[/LEN]` or `default` (of `family`), as `ip` does; an address alone is a
    /// host prefix. `ip` also accepts `all` and `any` for the default prefix.
    pub fn parse(text: &str, family: Option<Family>) -> Result<Net, String> {
        if matches!(text, "default" | "all" | "any") {
            return Ok(Net::default_of(family.unwrap_or(Family::V4)));
        }
        let (addr, len) = match text.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (text, None),
        };
        let addr: IpAddr = parse_addr(addr)?;
        if let Some(f) = family {
            if Family::of(addr) != f {
                return Err(format!(
                    "{} is not an {} prefix",
                    quote(text),
                    family_word(f)
                ));
            }
        }
        let len = match len {
            None => Family::of(addr).bits(),
            Some(l) => l
                .parse::<u8>()
                .ok()
                .filter(|&l| l <= Family::of(addr).bits())
                .ok_or_else(|| format!("invalid prefix length in {}", quote(text)))?,
        };
        Ok(Net::new(addr, len).expect("length checked"))
    }
}

/// `IPv4` or `IPv6`.
pub fn family_word(f: Family) -> &'static str {
    match f {
        Family::V4 => "IPv4",
        Family::V6 => "IPv6",
    }
}

/// Parses an address of either family, naming the text when it is not one.
pub fn parse_addr(text: &str) -> Result<IpAddr, String> {
    text.parse::<IpAddr>()
        .map_err(|_| format!("{} is not an address", quote(text)))
}

/// A bounded excerpt of user input for error messages: quoted and escaped as
/// [`fibre_lpm::quote`] does, and cut at [`fibre_lpm::QUOTE_CHARS`] characters of the
/// input or at [`QUOTE_WIDTH`] characters once escaped, whichever comes first (a control
/// or invisible character escapes to as many as ten, `\u{10ffff}`), so that
/// `FILE:LINE: reason` stays one short line whatever the input.
pub fn quote(text: &str) -> String {
    let mut width = 0;
    for (n, (at, c)) in text.char_indices().enumerate() {
        width += c.escape_debug().count();
        if n == fibre_lpm::QUOTE_CHARS || width > QUOTE_WIDTH {
            return format!("{:?}... ({} bytes)", &text[..at], text.len());
        }
    }
    format!("{text:?}")
}

/// The most characters an excerpt of input takes in a message, once escaped.
pub const QUOTE_WIDTH: usize = 80;

fn full(family: Family) -> u128 {
    match family {
        Family::V4 => u32::MAX as u128,
        Family::V6 => u128::MAX,
    }
}

/// `nets` as the engines' prefixes, IPv4's and IPv6's apart.
pub(crate) fn by_family(nets: &[Net]) -> (Vec<Ipv4Prefix>, Vec<Ipv6Prefix>) {
    (
        nets.iter().filter_map(Net::v4).collect(),
        nets.iter().filter_map(Net::v6).collect(),
    )
}

fn mask(family: Family, len: u8) -> u128 {
    let width = family.bits() as u32;
    if len == 0 {
        0
    } else {
        (full(family) >> (width - len as u32) << (width - len as u32)) & full(family)
    }
}

impl fmt::Display for Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", IpText(self.addr()), self.len)
    }
}

/// An address as `ip` prints it (the C library's `inet_ntop`): as Rust prints it, but
/// for an IPv6 address whose first 96 bits are zero and whose next 16 are not, which ends
/// in dotted IPv4 form (`::10.0.0.5`, where Rust prints `::a00:5`).
#[derive(Clone, Copy, Debug)]
pub struct IpText(pub IpAddr);

impl fmt::Display for IpText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V6(a) if a.segments()[..6] == [0; 6] && a.segments()[6] != 0 => {
                let [.., a, b, c, d] = a.octets();
                write!(f, "::{a}.{b}.{c}.{d}")
            }
            a => a.fmt(f),
        }
    }
}

/// An address as `ip` prints it ([`IpText`]).
pub fn ip_text(a: IpAddr) -> String {
    IpText(a).to_string()
}

impl fmt::Debug for Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_clear_host_bits_and_contain_what_they_should() {
        let n = Net::parse("10.1.2.3/8", None).unwrap();
        assert_eq!(n.to_string(), "10.0.0.0/8");
        assert!(n.contains("10.200.0.1".parse().unwrap()));
        assert!(!n.contains("11.0.0.1".parse().unwrap()));
        assert!(!n.contains("::1".parse().unwrap()));
        assert_eq!(n.last().to_string(), "10.255.255.255");
        let d = Net::parse("default", Some(Family::V6)).unwrap();
        assert_eq!(d.to_string(), "::/0");
        assert!(d.contains("2001:db8::1".parse().unwrap()));
        assert!(Net::parse("10.0.0.0/33", None).is_err());
        assert!(Net::parse("2001:db8::/64", Some(Family::V4)).is_err());
        assert_eq!(Net::parse("2001:db8::1", None).unwrap().len(), 128);
        assert!(n.covers(&Net::parse("10.9.0.0/16", None).unwrap()));
        assert!(!n.covers(&Net::parse("0.0.0.0/0", None).unwrap()));
    }

    #[test]
    fn excerpts_of_input_stay_short_once_escaped() {
        for text in [
            "a0",
            "10.0.0.1/33",
            "",
            "é\"x",
            &"x".repeat(40),
            &"x".repeat(41),
        ] {
            assert_eq!(quote(text), fibre_lpm::quote(text));
        }
        let escaped = "\u{feff}".repeat(1000);
        let q = quote(&escaped);
        assert!(q.len() < QUOTE_WIDTH + 30, "{q}");
        assert!(q.ends_with("... (3000 bytes)"), "{q}");
        assert!(quote(&"\u{1b}".repeat(30)).starts_with("\"\\u{1b}"));
    }
}
