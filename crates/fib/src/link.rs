//! Links and their addresses, as the kernel holds them.
//!
//! A link has an index (the kernel's ifindex, given in creation order from 1 for `lo`), a
//! name, an administrative state (`ip link set DEV up|down`) and a carrier: a veth has
//! carrier only while it and its peer are both up, loopback while it is up. Routes through
//! a link that is down are gone (the kernel flushes them); routes through a link without
//! carrier are kept and flagged `linkdown`.

use crate::net::{Family, Net};
use std::net::IpAddr;

/// A link's index (the kernel's ifindex). `lo` is 1.
pub type LinkIndex = u32;

/// What kind of link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkKind {
    /// The loopback link, `lo`, present from the start.
    Loopback,
    /// One end of a veth pair; the other end's index.
    Veth {
        /// The peer's index.
        peer: LinkIndex,
    },
    /// A dummy link (carrier whenever up).
    Dummy,
    /// Another kind of link the kernel has (a physical device, a bridge, a veth whose
    /// peer is in another namespace): its kind as the kernel names it (`IFLA_INFO_KIND`),
    /// empty for a device without one. Only a mirror of the kernel has these.
    Other(String),
}

impl LinkKind {
    /// The kind as `ip -d link` names it.
    pub fn name(&self) -> &str {
        match self {
            LinkKind::Loopback => "loopback",
            LinkKind::Veth { .. } => "veth",
            LinkKind::Dummy => "dummy",
            LinkKind::Other(kind) => kind,
        }
    }
}

/// How a link makes its IPv6 link-local address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddrGenMode {
    /// From the MAC address (EUI-64), the kernel's default.
    Eui64,
    /// None at all.
    None,
}

/// A network link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    /// The kernel's index.
    pub index: LinkIndex,
    /// The name.
    pub name: String,
    /// The kind.
    pub kind: LinkKind,
    /// Administratively up (`IFF_UP`).
    pub up: bool,
    /// The MTU.
    pub mtu: u32,
    /// The MAC address (all zero for loopback).
    pub mac: [u8; 6],
    /// The link's group (`ip link set DEV group N`), matched by `suppress_ifgroup`.
    pub group: u32,
    /// How the IPv6 link-local address is made.
    pub addrgenmode: AddrGenMode,
}

/// An address on a link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Address {
    /// The link it is on.
    pub link: LinkIndex,
    /// The local address.
    pub local: IpAddr,
    /// The prefix length.
    pub len: u8,
    /// An IPv4 broadcast address given with `brd` (the kernel adds a broadcast route for it).
    pub broadcast: Option<IpAddr>,
    /// The scope (`global` unless told; `host` for 127/8 and `::1`; `link` for fe80::/10).
    pub scope: u8,
    /// An IPv4 address in a subnet a primary address of the same link already holds.
    pub secondary: bool,
    /// `noprefixroute`: no connected route.
    pub noprefixroute: bool,
    /// The metric of the connected route (`metric N`).
    pub metric: u32,
    /// Made by the kernel (an IPv6 link-local address from the MAC).
    pub automatic: bool,
}

impl Address {
    /// The address's family.
    pub fn family(&self) -> Family {
        Family::of(self.local)
    }

    /// The subnet: the local address masked to its length.
    pub fn subnet(&self) -> Net {
        Net::new(self.local, self.len).expect("length checked when added")
    }
}

/// The IPv6 link-local address EUI-64 makes from a MAC address.
pub fn eui64_link_local(mac: [u8; 6]) -> IpAddr {
    let mut b = [0u8; 16];
    b[0] = 0xfe;
    b[1] = 0x80;
    b[8] = mac[0] ^ 0x02;
    b[9] = mac[1];
    b[10] = mac[2];
    b[11] = 0xff;
    b[12] = 0xfe;
    b[13] = mac[3];
    b[14] = mac[4];
    b[15] = mac[5];
    IpAddr::from(b)
}

/// A MAC address as `ip` prints it.
pub fn mac_string(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Parses a MAC address `xx:xx:xx:xx:xx:xx`.
pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for b in mac.iter_mut() {
        let p = parts.next()?;
        if p.is_empty() || p.len() > 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}
