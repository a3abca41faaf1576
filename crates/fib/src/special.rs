//! IPv4 destinations the tables alone do not answer: the limited broadcast
//! (`255.255.255.255`), multicast (`224.0.0.0/4`) and the unspecified address.
//!
//! The kernel routes these before, around or after its table lookup, and the answer's type
//! is the destination's, not the route's:
//!
//! - **Sent by this host** (`ip_route_output_key_hash_rcu`, `__mkroute_output`): from a
//!   given source, a multicast or broadcast flow leaves by the link that holds that source,
//!   no table asked; out of a given link, a link-local multicast (`224.0.0.0/24`) or
//!   broadcast flow leaves by it, no table asked; `0.0.0.0` is this host (`local` on `lo`,
//!   from the link's address or `127.0.0.1`); otherwise the tables route it, and the answer
//!   is `broadcast` or `multicast` through the route's link. A broadcast never goes through
//!   a gateway nor takes the route's metrics, and neither does a multicast routed by a
//!   prefix shorter than `/4` (a default route).
//! - **Arriving on a link** (`ip_route_input_rcu`, `ip_route_input_slow`'s `brd_input`):
//!   a multicast flow is this host's (`multicast` on `lo`) if the link has joined its group,
//!   else refused; a limited broadcast (or `0.0.0.0` from `0.0.0.0`) is `broadcast` on
//!   `lo`; either after the source check the kernel makes of them.
//!
//! Which groups a link has joined: fibre knows the all-hosts group (`224.0.0.1`), which
//! every link joins while it is up. Groups that sockets join are not mirrored; a multicast
//! packet is always the kernel's to deliver (the packet path hands it over), so this only
//! changes what `route get` prints for such a group (`cache <mc>` where the kernel says
//! `cache <local,mc>`, or an error for an arriving flow).

use crate::layout::Snapshot;
use crate::link::{Link, LinkIndex, LinkKind};
use crate::names::{SCOPE_HOST, SCOPE_LINK, SCOPE_UNIVERSE, TABLE_LOCAL, TABLE_MAIN};
use crate::net::Family;
use crate::query::{Answer, NoRoute, Query};
use crate::route::RouteType;
use crate::source;
use crate::walk::{self, Concluded, WalkFor};
use std::net::{IpAddr, Ipv4Addr};

/// The all-hosts group every link joins while up.
const ALL_HOSTS: Ipv4Addr = Ipv4Addr::new(224, 0, 0, 1);

/// Whether `d` is link-local multicast (`224.0.0.0/24`, the kernel's
/// `ipv4_is_local_multicast`).
fn local_multicast(d: Ipv4Addr) -> bool {
    u32::from(d) & 0xffff_ff00 == 0xe000_0000
}

/// Whether the tables alone do not answer a flow to `d` (host order): multicast or the
/// limited broadcast, or the unspecified address. What [`Snapshot::special_v4`] answers.
#[inline]
pub(crate) fn is_special_v4(d: u32) -> bool {
    d >> 28 == 0xe || d == u32::MAX || d == 0
}

/// The body of [`Snapshot::special_v4`].
pub(crate) fn special_v4(snap: &Snapshot, q: &Query) -> Option<Result<Answer, NoRoute>> {
    let IpAddr::V4(d) = q.dst else { return None };
    if !is_special_v4(u32::from(d)) {
        return None;
    }
    let src = match q.src {
        None => None,
        Some(IpAddr::V4(s)) => Some(s),
        Some(IpAddr::V6(_)) => return Some(Err(NoRoute::Invalid)),
    };
    match q.iif {
        Some(iif) => special_input(snap, q, d, src, iif),
        None => Some(special_output(snap, q, d, src)),
    }
}

/// Whether link `link` has joined multicast group `group`.
fn joined(link: &Link, group: Ipv4Addr) -> bool {
    link.up && group == ALL_HOSTS
}

/// A flow to `d` arriving on `iif`; `None` for `0.0.0.0` from a source, which the
/// ordinary checks refuse as a martian destination.
fn special_input(
    snap: &Snapshot,
    q: &Query,
    d: Ipv4Addr,
    src: Option<Ipv4Addr>,
    iif: LinkIndex,
) -> Option<Result<Answer, NoRoute>> {
    let s = src.unwrap_or(Ipv4Addr::UNSPECIFIED);
    let broadcast = d.is_broadcast() || (d.is_unspecified() && s.is_unspecified());
    if !(broadcast || d.is_multicast()) {
        return None;
    }
    let Some(link) = snap.links.get(&iif) else {
        return Some(Err(NoRoute::NoDevice));
    };
    Some(special_input_on(snap, q, d, s, link, broadcast))
}

fn special_input_on(
    snap: &Snapshot,
    q: &Query,
    d: Ipv4Addr,
    s: Ipv4Addr,
    link: &Link,
    broadcast: bool,
) -> Result<Answer, NoRoute> {
    // The martian sources every arriving flow is refused for.
    if s.is_multicast() || s.is_broadcast() {
        return Err(NoRoute::Invalid);
    }
    let kind = if broadcast {
        RouteType::Broadcast
    } else {
        if !joined(link, d) {
            // Neither joined nor multicast-forwarded (`ip_route_input_rcu`).
            return Err(NoRoute::Invalid);
        }
        // `ip_mc_validate_source`.
        if s.is_loopback() || (s.is_unspecified() && !local_multicast(d)) {
            return Err(NoRoute::Invalid);
        }
        RouteType::Multicast
    };
    // Flows from `0.0.0.0` skip the source check.
    if !s.is_unspecified() {
        snap.validate_source_of(q, Some(link.index), RouteType::Broadcast, link.index)?;
    }
    let mut a = walk::answer_without_route(q, kind, snap.lo, None);
    a.iif = Some(link.index);
    a.cache = if broadcast {
        vec!["local", "brd"]
    } else {
        vec!["local", "mc"]
    };
    Ok(a)
}

/// A flow to `d` this host sends.
fn special_output(
    snap: &Snapshot,
    q: &Query,
    d: Ipv4Addr,
    src: Option<Ipv4Addr>,
) -> Result<Answer, NoRoute> {
    let group = d.is_multicast() || d.is_broadcast();
    if let Some(s) = src {
        if s.is_multicast() || s.is_broadcast() || s.is_unspecified() {
            return Err(NoRoute::Invalid);
        }
        let holder = link_holding(snap, s);
        if q.oif.is_none() && group {
            // Out of the link that holds the source, no table asked.
            let dev = holder.ok_or(NoRoute::NetworkUnreachable)?;
            return made_special(snap, q, d, dev, None);
        }
        if holder.is_none() && !q.any_source {
            return Err(NoRoute::NetworkUnreachable);
        }
    }
    let mut chosen = src.map(IpAddr::V4);
    if let Some(oif) = q.oif {
        let link = snap.links.get(&oif).ok_or(NoRoute::NoDevice)?;
        if !link.up {
            return Err(NoRoute::NetworkUnreachable);
        }
        let select = |scope| source::select_v4(&snap.addrs, &snap.links, oif, None, scope);
        if local_multicast(d) || d.is_broadcast() {
            return made_special(snap, q, d, oif, chosen.or_else(|| select(SCOPE_LINK)));
        }
        if chosen.is_none() {
            if d.is_multicast() {
                chosen = select(SCOPE_UNIVERSE);
            } else if d.is_unspecified() {
                chosen = select(SCOPE_HOST);
            }
        }
    }
    if d.is_unspecified() {
        // This host: to the source, or to the loopback address from it.
        let s = chosen.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let mut a = walk::answer_without_route(q, RouteType::Local, snap.lo, Some(s));
        a.cache = vec!["local"];
        return Ok(a);
    }
    routed_special(snap, q, d, chosen)
}

/// A multicast or broadcast flow this host sends that the tables route (`chosen`: the
/// source picked before the lookup, if any).
fn routed_special(
    snap: &Snapshot,
    q: &Query,
    d: Ipv4Addr,
    chosen: Option<IpAddr>,
) -> Result<Answer, NoRoute> {
    let p = snap.prepare(q)?;
    let walk = snap.walk(&p.q, Family::V4, p.oif, p.iif, 0, WalkFor::Flow);
    let len = walk.as_ref().map_or(0, |&(_, len, _)| len);
    let mut a = match snap.conclude(&p, walk)? {
        Concluded::Route(route, table) => snap.answer(&p.q, Family::V4, route, table, None)?,
        Concluded::Bare(oif) => snap.bare_answer(q, oif),
    };
    if q.src.is_none() {
        a.prefsrc = chosen.or(a.prefsrc);
    }
    // The route's path and metrics are dropped for a broadcast, and for a multicast
    // routed by a prefix shorter than the multicast range.
    if d.is_broadcast() || len < 4 {
        a.gateway = None;
        a.mtu = None;
        a.hoplimit = None;
    }
    finish_special(snap, q, d, a)
}

/// A multicast or broadcast flow sent out of `dev` with no table asked.
fn made_special(
    snap: &Snapshot,
    q: &Query,
    d: Ipv4Addr,
    dev: LinkIndex,
    prefsrc: Option<IpAddr>,
) -> Result<Answer, NoRoute> {
    let a = walk::answer_without_route(q, RouteType::Unicast, dev, prefsrc);
    finish_special(snap, q, d, a)
}

/// A sent multicast or broadcast answer given its destination's type and cache flags,
/// or refused where a loopback source would leave by another link than the loopback.
fn finish_special(
    snap: &Snapshot,
    q: &Query,
    d: Ipv4Addr,
    mut a: Answer,
) -> Result<Answer, NoRoute> {
    let source = q.src.or(a.prefsrc);
    let dev = snap.links.get(&a.dev);
    let loopback = dev.is_some_and(|l| l.kind == LinkKind::Loopback);
    if source.is_some_and(|s| s.is_loopback()) && !loopback {
        return Err(NoRoute::Invalid);
    }
    if d.is_broadcast() {
        a.kind = RouteType::Broadcast;
        a.cache = vec!["local", "brd"];
    } else {
        a.kind = RouteType::Multicast;
        // Local only if the link joined the group, the loopback too.
        let joined = dev.is_some_and(|l| joined(l, d));
        a.cache = if joined {
            vec!["local", "mc"]
        } else {
            vec!["mc"]
        };
    }
    Ok(a)
}

/// The link holding this host's address `s` (the kernel's `__ip_dev_find`): the link
/// it is configured on, else the link of a `local` route of table `local` holding it.
fn link_holding(snap: &Snapshot, s: Ipv4Addr) -> Option<LinkIndex> {
    let s = IpAddr::V4(s);
    if let Some(a) = snap.addrs.iter().find(|a| a.local == s) {
        return Some(a.link);
    }
    // Without rules of its own, table `local` is compiled into `main`'s structure.
    let fib = snap.fib(Family::V4);
    let local = fib.table(TABLE_LOCAL).or_else(|| fib.table(TABLE_MAIN))?;
    let route = snap
        .local_route(local, s)
        .filter(|r| r.table == TABLE_LOCAL)?;
    snap.paths_of(route).first().map(|p| p.dev)
}
