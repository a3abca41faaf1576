//! Neighbours (ARP and NDP entries) as the kernel holds them, mirrored beside the routing
//! state: where a packet path finds the MAC address of a route's next hop.

use fibre_fib::LinkIndex;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// A neighbour entry's state (`NUD_*`), as `ip neigh` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NeighState {
    /// Being resolved.
    Incomplete,
    /// Confirmed reachable.
    Reachable,
    /// Known, not confirmed lately.
    Stale,
    /// Waiting to probe.
    Delay,
    /// Being probed.
    Probe,
    /// Resolution failed.
    Failed,
    /// No resolution needed (point-to-point, multicast).
    Noarp,
    /// Set by an administrator.
    Permanent,
    /// No state.
    None,
}

impl NeighState {
    /// The name `ip neigh` prints.
    pub fn name(self) -> &'static str {
        match self {
            NeighState::Incomplete => "INCOMPLETE",
            NeighState::Reachable => "REACHABLE",
            NeighState::Stale => "STALE",
            NeighState::Delay => "DELAY",
            NeighState::Probe => "PROBE",
            NeighState::Failed => "FAILED",
            NeighState::Noarp => "NOARP",
            NeighState::Permanent => "PERMANENT",
            NeighState::None => "NONE",
        }
    }

    /// Whether its link-layer address can be used to send.
    pub fn usable(self) -> bool {
        matches!(
            self,
            NeighState::Reachable
                | NeighState::Stale
                | NeighState::Delay
                | NeighState::Probe
                | NeighState::Noarp
                | NeighState::Permanent
        )
    }
}

/// A neighbour entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Neighbour {
    /// The link it is on.
    pub link: LinkIndex,
    /// Its address.
    pub dst: IpAddr,
    /// Its link-layer address, once known.
    pub lladdr: Option<Vec<u8>>,
    /// Its state.
    pub state: NeighState,
    /// It is a router (`NTF_ROUTER`, IPv6).
    pub router: bool,
}

/// The neighbour entries, by link and address.
#[derive(Clone, Debug, Default)]
pub struct Neighbours {
    entries: BTreeMap<(LinkIndex, IpAddr), Neighbour>,
    version: u64,
}

impl Neighbours {
    /// An entry as the kernel reports it, new or changed.
    pub fn put(&mut self, n: Neighbour) {
        if self.entries.get(&(n.link, n.dst)) != Some(&n) {
            self.version += 1;
            self.entries.insert((n.link, n.dst), n);
        }
    }

    /// An entry the kernel removed.
    pub fn remove(&mut self, link: LinkIndex, dst: IpAddr) {
        if self.entries.remove(&(link, dst)).is_some() {
            self.version += 1;
        }
    }

    /// The entries of a link that went away.
    pub fn remove_link(&mut self, link: LinkIndex) {
        let before = self.entries.len();
        self.entries.retain(|&(l, _), _| l != link);
        if self.entries.len() != before {
            self.version += 1;
        }
    }

    /// A number that changes whenever an entry does (a dump's table starts again at
    /// its own count, so that readers compare it with the last they saw, not order it).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The entry of `dst` on `link`.
    pub fn get(&self, link: LinkIndex, dst: IpAddr) -> Option<&Neighbour> {
        self.entries.get(&(link, dst))
    }

    /// Every entry, by link and address.
    pub fn iter(&self) -> impl Iterator<Item = &Neighbour> {
        self.entries.values()
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn lladdr_text(b: &[u8]) -> String {
    b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}
