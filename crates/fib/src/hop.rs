//! What a packet needs from its route: a [`Hop`] (its route's type and table, output
//! link, gateway and MTU), and a lookup's answer that borrows one from the snapshot or
//! holds one made for the flow ([`HopRef`]).

use crate::link::LinkIndex;
use crate::names::SCOPE_LINK;
use crate::query::Answer;
use crate::route::{Path, RouteBody, RouteType};
use std::net::IpAddr;
use std::ops::Deref;

/// Where a flow goes: what a packet needs from its route.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Hop {
    /// The route's type (`local` for this host's addresses).
    pub kind: RouteType,
    /// The table that answered (`None` for an IPv4 flow sent out of its `oif` with no
    /// route).
    pub table: Option<u32>,
    /// The output link (the loopback for local delivery).
    pub dev: LinkIndex,
    /// The gateway to send through; `None`: the destination is on the link.
    pub gateway: Option<IpAddr>,
    /// The route's MTU, if it sets one.
    pub mtu: Option<u32>,
}

impl Hop {
    /// This hop (its route's type, table and MTU) through `path`, the loopback link being
    /// `lo`: local delivery by the loopback (and a broadcast arriving on a link too), the
    /// gateway only where the path sends through it.
    pub(crate) fn through(self, path: &Path, lo: LinkIndex, input: bool) -> Hop {
        let local = matches!(self.kind, RouteType::Local | RouteType::Anycast);
        let brd = self.kind == RouteType::Broadcast;
        Hop {
            dev: if local || (brd && input) {
                lo
            } else {
                path.dev
            },
            gateway: if local { None } else { sent_via(path) },
            ..self
        }
    }

    /// The hop of `route` in `table` through `path`, the loopback link being `lo`: local
    /// delivery by the loopback (and a forwarded broadcast too), the gateway only where
    /// the path sends through it.
    pub(crate) fn of_route(
        route: &RouteBody,
        table: u32,
        path: &Path,
        lo: LinkIndex,
        input: bool,
    ) -> Hop {
        Hop {
            kind: route.kind,
            table: Some(table),
            dev: 0,
            gateway: None,
            mtu: route.mtu,
        }
        .through(path, lo, input)
    }

    /// The hop of a route query's answer.
    pub(crate) fn of_answer(a: &Answer) -> Hop {
        Hop {
            kind: a.kind,
            table: a.table,
            dev: a.dev,
            gateway: a.gateway,
            mtu: a.mtu,
        }
    }
}

/// A flow's hop as a lookup answers it: one the snapshot holds (most answers, which then
/// cost no copy), or one made for the flow by the full walk. Either reads as a [`Hop`].
#[derive(Clone, Copy, Debug)]
pub enum HopRef<'s> {
    /// A hop of the snapshot's tables.
    Shared(&'s Hop),
    /// A hop made for this flow.
    Made(Hop),
}

impl Deref for HopRef<'_> {
    type Target = Hop;

    #[inline]
    fn deref(&self) -> &Hop {
        match self {
            HopRef::Shared(h) => h,
            HopRef::Made(h) => h,
        }
    }
}

impl PartialEq for HopRef<'_> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for HopRef<'_> {}

impl PartialEq<Hop> for HopRef<'_> {
    fn eq(&self, other: &Hop) -> bool {
        **self == *other
    }
}

impl From<HopRef<'_>> for Hop {
    fn from(h: HopRef<'_>) -> Hop {
        *h
    }
}

/// The gateway a path sends through (`rt_uses_gateway`): an IPv4 gateway that resolved
/// to one of this host's addresses (scope host) is kept on the path but not used.
pub(crate) fn sent_via(p: &Path) -> Option<IpAddr> {
    p.gateway.filter(|g| g.is_ipv6() || p.scope == SCOPE_LINK)
}
