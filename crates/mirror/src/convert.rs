//! The kernel's rtnetlink messages as fibre's routing objects: a link, an address, a
//! route or a rule, new or removed ([`Change`]).
//!
//! The wire format is `netlink-packet-route`'s; this module reads its messages into
//! `fibre_fib`'s types. What fibre does not hold (multicast routing, MPLS, tunnels'
//! encapsulations, families other than IPv4 and IPv6) is not a change: it is skipped and
//! counted by the caller ([`Skip`]), never an error that stops the mirror.

use crate::neigh::{NeighState, Neighbour};
use fibre_fib::names::{SCOPE_HOST, SCOPE_LINK, SCOPE_NOWHERE};
use fibre_fib::{
    Address, Family, Link, LinkIndex, LinkKind, Net, Path, Paths, Range, Route, RouteBody,
    RouteType, Rule, RuleAction, RuleLink,
};
use netlink_packet_core::{NLM_F_APPEND, NLM_F_REPLACE};
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressHeaderFlags};
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkInfo};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteMessage, RouteMetric, RouteNextHopFlags,
    RouteType as WireRouteType, RouteVia,
};
use netlink_packet_route::rule::{RuleAction as WireRuleAction, RuleAttribute, RuleFlags};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use std::net::IpAddr;

/// What a message changes in the mirror.
#[derive(Debug)]
pub enum Change {
    /// A link, new or changed, with its carrier.
    Link(Link, bool),
    /// A link removed.
    DelLink(LinkIndex),
    /// An address, new or changed.
    Address(Address),
    /// An address removed: its link, address and length.
    DelAddress(LinkIndex, IpAddr, u8),
    /// A route, new or changed, and how it was added.
    Route(Route, fibre_fib::RouteOp),
    /// A route removed.
    DelRoute(Route),
    /// A rule added.
    Rule(Rule),
    /// A rule removed.
    DelRule(Rule),
    /// A neighbour entry, new or changed.
    Neighbour(Neighbour),
    /// A neighbour entry removed: its link and address.
    DelNeighbour(LinkIndex, IpAddr),
}

/// Why a message is not a change.
#[derive(Debug, PartialEq, Eq)]
pub enum Skip {
    /// A kind of message the mirror does not follow (neighbours, for now).
    NotFollowed,
    /// A family other than IPv4 and IPv6, or a route fibre does not hold (multicast
    /// routing, MPLS, a cached clone).
    NotHeld,
    /// Malformed: an attribute missing or out of range.
    Malformed(&'static str),
}

/// The change `msg` makes, given the flags of its netlink header.
pub fn change(msg: &RouteNetlinkMessage, flags: u16) -> Result<Change, Skip> {
    use RouteNetlinkMessage as M;
    match msg {
        M::NewLink(l) => link(l).map(|(l, c)| Change::Link(l, c)),
        M::DelLink(l) => Ok(Change::DelLink(l.header.index)),
        M::NewAddress(a) => address(a).map(Change::Address),
        M::DelAddress(a) => address(a).map(|a| Change::DelAddress(a.link, a.local, a.len)),
        M::NewRoute(r) => route(r).map(|r| Change::Route(r, route_op(flags))),
        M::DelRoute(r) => route(r).map(Change::DelRoute),
        M::NewRule(r) => rule(r).map(Change::Rule),
        M::DelRule(r) => rule(r).map(Change::DelRule),
        M::NewNeighbour(n) => neighbour(n).map(Change::Neighbour),
        M::DelNeighbour(n) => neighbour(n).map(|n| Change::DelNeighbour(n.link, n.dst)),
        _ => Err(Skip::NotFollowed),
    }
}

/// How a route reported with the header flags `flags` was added: `Replace` for
/// `NLM_F_REPLACE`, `Append` for `NLM_F_APPEND`, else `Prepend`.
pub fn route_op(flags: u16) -> fibre_fib::RouteOp {
    if flags & NLM_F_REPLACE != 0 {
        fibre_fib::RouteOp::Replace
    } else if flags & NLM_F_APPEND != 0 {
        fibre_fib::RouteOp::Append
    } else {
        fibre_fib::RouteOp::Prepend
    }
}

fn family(f: AddressFamily) -> Result<Family, Skip> {
    match f {
        AddressFamily::Inet => Ok(Family::V4),
        AddressFamily::Inet6 => Ok(Family::V6),
        _ => Err(Skip::NotHeld),
    }
}

/// A link and its carrier.
fn link(m: &netlink_packet_route::link::LinkMessage) -> Result<(Link, bool), Skip> {
    let flags = m.header.flags;
    let mut name = None;
    let (mut mtu, mut mac, mut group) = (1500, [0u8; 6], 0);
    let (mut kind_name, mut peer, mut other_netns) = (None, None, false);
    for a in &m.attributes {
        match a {
            LinkAttribute::IfName(n) => name = Some(n.clone()),
            LinkAttribute::Mtu(v) => mtu = *v,
            LinkAttribute::Group(g) => group = *g,
            LinkAttribute::Address(b) if b.len() == 6 => mac.copy_from_slice(b),
            LinkAttribute::Link(p) => peer = Some(*p),
            LinkAttribute::LinkNetNsId(_) => other_netns = true,
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    if let LinkInfo::Kind(k) = i {
                        kind_name = Some(k.to_string());
                    }
                }
            }
            _ => {}
        }
    }
    let name = name.ok_or(Skip::Malformed("a link without a name"))?;
    let kind = if flags.contains(LinkFlags::Loopback) {
        LinkKind::Loopback
    } else {
        match (kind_name.as_deref(), peer) {
            (Some("veth"), Some(peer)) if !other_netns && peer != 0 => LinkKind::Veth { peer },
            (Some("dummy"), _) => LinkKind::Dummy,
            (k, _) => LinkKind::Other(k.unwrap_or("").to_string()),
        }
    };
    let link = Link {
        index: m.header.index,
        name,
        kind,
        up: flags.contains(LinkFlags::Up),
        mtu,
        mac,
        group,
        addrgenmode: fibre_fib::AddrGenMode::Eui64,
    };
    Ok((link, flags.contains(LinkFlags::LowerUp)))
}

/// An address.
fn address(m: &netlink_packet_route::address::AddressMessage) -> Result<Address, Skip> {
    let fam = family(m.header.family)?;
    let (mut local, mut peer, mut broadcast, mut metric) = (None, None, None, 0);
    let mut flags = AddressFlags::from_bits_retain(u32::from(m.header.flags.bits()));
    for a in &m.attributes {
        match a {
            AddressAttribute::Local(l) => local = Some(*l),
            AddressAttribute::Address(l) => peer = Some(*l),
            AddressAttribute::Broadcast(b) => broadcast = Some(IpAddr::V4(*b)),
            AddressAttribute::Flags(f) => flags = *f,
            AddressAttribute::RoutePriority(p) => metric = *p,
            _ => {}
        }
    }
    // IPv4: IFA_LOCAL is the address, IFA_ADDRESS its peer; IPv6 has only IFA_ADDRESS
    // (or IFA_LOCAL with a peer).
    let local = local
        .or(peer)
        .ok_or(Skip::Malformed("an address without one"))?;
    if Family::of(local) != fam || m.header.prefix_len > fam.bits() {
        return Err(Skip::Malformed("an address of the wrong family or length"));
    }
    let _ = AddressHeaderFlags::Secondary;
    Ok(Address {
        link: m.header.index,
        local,
        len: m.header.prefix_len,
        broadcast,
        scope: u8::from(m.header.scope),
        secondary: flags.contains(AddressFlags::Secondary),
        noprefixroute: flags.contains(AddressFlags::Noprefixroute),
        metric,
        automatic: false,
    })
}

fn route_address(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v) => Some(IpAddr::V4(*v)),
        RouteAddress::Inet6(v) => Some(IpAddr::V6(*v)),
        _ => None,
    }
}

fn via(v: &RouteVia) -> Option<IpAddr> {
    match v {
        RouteVia::Inet(a) => Some(IpAddr::V4(*a)),
        RouteVia::Inet6(a) => Some(IpAddr::V6(*a)),
        _ => None,
    }
}

/// A prefix of `fam` from an address attribute (the default one when absent).
fn prefix(fam: Family, addr: Option<IpAddr>, len: u8) -> Result<Net, Skip> {
    let addr = addr.unwrap_or(fam.any());
    if Family::of(addr) != fam || len > fam.bits() {
        return Err(Skip::Malformed("a prefix of the wrong family or length"));
    }
    Net::new(addr, len).ok_or(Skip::Malformed("a prefix with host bits"))
}

/// A path's scope as the kernel keeps it (`nh_scope`), from its route's scope: `nowhere`
/// for a route of scope `host` (a local route's), `link` for a gateway, else `host`.
fn path_scope(route_scope: u8, gateway: Option<IpAddr>) -> u8 {
    match (route_scope, gateway) {
        (SCOPE_HOST, _) => SCOPE_NOWHERE,
        (_, Some(_)) => SCOPE_LINK,
        (_, None) => SCOPE_HOST,
    }
}

/// What a route message's attributes say, read from the netlink crates' attributes or
/// straight from the bytes ([`route_from_bytes`]).
#[derive(Default)]
struct RouteParts {
    dst: Option<IpAddr>,
    src: Option<IpAddr>,
    gateway: Option<IpAddr>,
    prefsrc: Option<IpAddr>,
    table: Option<u32>,
    metric: u32,
    oif: Option<u32>,
    /// The paths of a multipath route (their scope set from the route's).
    multipath: Option<Vec<Path>>,
    nhid: Option<u32>,
    pref: u8,
    mtu: Option<u32>,
    hoplimit: Option<u8>,
}

/// A route.
pub fn route(m: &RouteMessage) -> Result<Route, Skip> {
    let mut parts = RouteParts::default();
    for a in &m.attributes {
        match a {
            RouteAttribute::Destination(d) => parts.dst = route_address(d),
            RouteAttribute::Source(s) => parts.src = route_address(s),
            RouteAttribute::Gateway(g) => parts.gateway = route_address(g),
            RouteAttribute::Via(v) => parts.gateway = via(v),
            RouteAttribute::PrefSource(p) => parts.prefsrc = route_address(p),
            RouteAttribute::Table(t) => parts.table = Some(*t),
            RouteAttribute::Priority(p) => parts.metric = *p,
            RouteAttribute::Oif(o) => parts.oif = Some(*o),
            RouteAttribute::MultiPath(hops) => {
                let paths = hops.iter().map(|hop| {
                    let mut gw = None;
                    for a in &hop.attributes {
                        match a {
                            RouteAttribute::Gateway(g) => gw = route_address(g),
                            RouteAttribute::Via(v) => gw = via(v),
                            _ => {}
                        }
                    }
                    Path {
                        gateway: gw,
                        dev: hop.interface_index,
                        weight: u16::from(hop.hops) + 1,
                        onlink: hop.flags.contains(RouteNextHopFlags::Onlink),
                        dead: hop.flags.contains(RouteNextHopFlags::Dead),
                        scope: 0,
                    }
                });
                parts.multipath = Some(paths.collect());
            }
            RouteAttribute::NhId(id) => parts.nhid = Some(*id),
            RouteAttribute::Preference(p) => parts.pref = u8::from(*p),
            RouteAttribute::Metrics(ms) => {
                for x in ms {
                    match x {
                        RouteMetric::Mtu(v) => parts.mtu = Some(*v),
                        // (0 is unset, as the kernel takes it.)
                        RouteMetric::Hoplimit(v) => {
                            parts.hoplimit = u8::try_from((*v).min(255)).ok().filter(|&h| h != 0);
                        }
                        _ => {}
                    }
                }
            }
            RouteAttribute::Encap(_) | RouteAttribute::EncapType(_) => return Err(Skip::NotHeld),
            _ => {}
        }
    }
    route_of(&m.header, parts)
}

/// Attributes of a route message read by [`route_from_bytes`] (`linux/rtnetlink.h`).
const RTA_DST: u16 = 1;
const RTA_SRC: u16 = 2;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_PRIORITY: u16 = 6;
const RTA_PREFSRC: u16 = 7;
const RTA_CACHEINFO: u16 = 12;
const RTA_TABLE: u16 = 15;
const RTA_PREF: u16 = 20;
const RTA_NH_ID: u16 = 30;

/// A route read straight from a route message's bytes (after the netlink header),
/// without the netlink crates' decoding, which allocates each attribute: a full table's
/// dump is a million of them. Only the attributes of a plain route are read here (a
/// destination, a gateway, a link, a table, a metric, a preferred source, a nexthop
/// object, a preference); a message with any other (several paths, metrics, an
/// encapsulation), or one whose attributes do not parse, is `None`: the netlink crates
/// decode it and [`route`] reads it.
pub fn route_from_bytes(payload: &[u8]) -> Option<Result<Route, Skip>> {
    let header = netlink_packet_route::route::RouteHeader::parse(payload).ok()?;
    let fam = match header.address_family {
        AddressFamily::Inet => 4,
        AddressFamily::Inet6 => 16,
        _ => return None,
    };
    let addr = |v: &[u8]| -> Option<IpAddr> {
        match (fam, v.len()) {
            (4, 4) => Some(IpAddr::from(<[u8; 4]>::try_from(v).ok()?)),
            (16, 16) => Some(IpAddr::from(<[u8; 16]>::try_from(v).ok()?)),
            _ => None,
        }
    };
    let word = |v: &[u8]| <[u8; 4]>::try_from(v).ok().map(u32::from_ne_bytes);
    let mut parts = RouteParts::default();
    for nla in netlink_packet_core::NlasIterator::new(payload.get(12..)?) {
        let nla = nla.ok()?;
        let v = nla.value();
        match nla.kind() {
            RTA_DST => parts.dst = Some(addr(v)?),
            RTA_SRC => parts.src = Some(addr(v)?),
            RTA_GATEWAY => parts.gateway = Some(addr(v)?),
            RTA_PREFSRC => parts.prefsrc = Some(addr(v)?),
            RTA_OIF => parts.oif = Some(word(v)?),
            RTA_TABLE => parts.table = Some(word(v)?),
            RTA_PRIORITY => parts.metric = word(v)?,
            RTA_NH_ID => parts.nhid = Some(word(v)?),
            RTA_PREF if v.len() == 1 => parts.pref = v[0],
            // (`struct rta_cacheinfo`: eight words.)
            RTA_CACHEINFO if v.len() >= 32 => {}
            _ => return None,
        }
    }
    Some(route_of(&header, parts))
}

/// A route of `h`, its header, and `parts`, its attributes.
fn route_of(
    h: &netlink_packet_route::route::RouteHeader,
    parts: RouteParts,
) -> Result<Route, Skip> {
    let fam = family(h.address_family)?;
    if h.flags.contains(RouteFlags::Cloned) {
        return Err(Skip::NotHeld);
    }
    let kind = match h.kind {
        WireRouteType::Unicast => RouteType::Unicast,
        WireRouteType::Local => RouteType::Local,
        WireRouteType::Broadcast => RouteType::Broadcast,
        WireRouteType::Anycast => RouteType::Anycast,
        WireRouteType::Multicast => RouteType::Multicast,
        WireRouteType::BlackHole => RouteType::Blackhole,
        WireRouteType::Unreachable => RouteType::Unreachable,
        WireRouteType::Prohibit => RouteType::Prohibit,
        WireRouteType::Throw => RouteType::Throw,
        _ => return Err(Skip::NotHeld),
    };
    let dst = prefix(fam, parts.dst, h.destination_prefix_length)?;
    let src = prefix(fam, parts.src, h.source_prefix_length)?;
    let scope = u8::from(h.scope);
    let paths = if let Some(id) = parts.nhid {
        Paths::Object(id)
    } else if let Some(mut paths) = parts.multipath {
        for p in &mut paths {
            p.scope = path_scope(scope, p.gateway);
        }
        Paths::own(paths)
    } else if kind.is_reject() || kind == RouteType::Throw {
        Paths::None
    } else {
        let dev = parts.oif.ok_or(Skip::Malformed("a route without a link"))?;
        Paths::own(vec![Path {
            gateway: parts.gateway,
            dev,
            weight: 1,
            onlink: h.flags.contains(RouteFlags::Onlink),
            dead: h.flags.contains(RouteFlags::Dead),
            scope: path_scope(scope, parts.gateway),
        }])
    };
    Ok(Route::new(
        dst,
        RouteBody {
            table: parts.table.unwrap_or(u32::from(h.table)),
            src,
            tos: h.tos,
            metric: parts.metric,
            protocol: u8::from(h.protocol),
            scope,
            kind,
            prefsrc: parts.prefsrc,
            mtu: parts.mtu,
            hoplimit: parts.hoplimit,
            paths,
            pref: parts.pref,
        },
    ))
}

/// A rule.
fn rule(m: &netlink_packet_route::rule::RuleMessage) -> Result<Rule, Skip> {
    let h = &m.header;
    let fam = family(h.family)?;
    let mut table = u32::from(h.table);
    let mut r = Rule::new(fam, 0, RuleAction::Nop);
    r.invert = h.flags.contains(RuleFlags::Invert);
    if h.tos != 0 {
        r.tos = Some(h.tos);
    }
    let (mut src, mut dst, mut goto, mut mark, mut mask) = (None, None, 0, None, None);
    for a in &m.attributes {
        match a {
            RuleAttribute::Priority(p) => r.pref = *p,
            RuleAttribute::Source(s) => src = Some(*s),
            RuleAttribute::Destination(d) => dst = Some(*d),
            RuleAttribute::Iifname(n) => {
                r.iif = Some(RuleLink {
                    name: n.clone(),
                    index: None,
                })
            }
            RuleAttribute::Oifname(n) => {
                r.oif = Some(RuleLink {
                    name: n.clone(),
                    index: None,
                })
            }
            RuleAttribute::Goto(g) => goto = *g,
            RuleAttribute::FwMark(v) => mark = Some(*v),
            RuleAttribute::FwMask(v) => mask = Some(*v),
            RuleAttribute::Table(t) => table = *t,
            RuleAttribute::SuppressPrefixLen(v) if *v != u32::MAX => {
                r.suppress_prefixlength = Some(
                    u8::try_from(*v)
                        .map_err(|_| Skip::Malformed("suppress_prefixlength out of range"))?,
                )
            }
            RuleAttribute::SuppressIfGroup(v) if *v != u32::MAX => r.suppress_ifgroup = Some(*v),
            RuleAttribute::IpProtocol(p) => r.ipproto = Some(i32::from(*p) as u8),
            RuleAttribute::SourcePortRange(p) => {
                r.sport = Some(Range {
                    start: u32::from(p.start),
                    end: u32::from(p.end),
                })
            }
            RuleAttribute::DestinationPortRange(p) => {
                r.dport = Some(Range {
                    start: u32::from(p.start),
                    end: u32::from(p.end),
                })
            }
            RuleAttribute::UidRange(u) => {
                r.uidrange = Some(Range {
                    start: u.start,
                    end: u.end,
                })
            }
            RuleAttribute::Protocol(p) => r.protocol = u8::from(*p),
            _ => {}
        }
    }
    r.src = src.map(|s| prefix(fam, Some(s), h.src_len)).transpose()?;
    r.dst = dst.map(|d| prefix(fam, Some(d), h.dst_len)).transpose()?;
    if mark.is_some() || mask.is_some() {
        r.fwmark = Some((mark.unwrap_or(0), mask.unwrap_or(u32::MAX)));
    }
    r.action = match h.action {
        WireRuleAction::ToTable => RuleAction::Lookup(table),
        WireRuleAction::Goto => RuleAction::Goto(goto),
        WireRuleAction::Nop => RuleAction::Nop,
        WireRuleAction::Blackhole => RuleAction::Blackhole,
        WireRuleAction::Unreachable => RuleAction::Unreachable,
        WireRuleAction::Prohibit => RuleAction::Prohibit,
        _ => return Err(Skip::NotHeld),
    };
    Ok(r)
}

/// A neighbour entry (of IPv4 or IPv6: bridge FDB entries and others are not held, nor
/// entries of multicast addresses: the kernel makes those, `NOARP`, whenever it sends to
/// one, without a message, and their link-layer address is computed, not learned).
fn neighbour(m: &NeighbourMessage) -> Result<Neighbour, Skip> {
    family(m.header.family)?;
    let (mut dst, mut lladdr) = (None, None);
    for a in &m.attributes {
        match a {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(v)) => {
                dst = Some(IpAddr::V4(*v))
            }
            NeighbourAttribute::Destination(NeighbourAddress::Inet6(v)) => {
                dst = Some(IpAddr::V6(*v))
            }
            NeighbourAttribute::LinkLayerAddress(b) => lladdr = Some(b.clone()),
            _ => {}
        }
    }
    let state = match m.header.state {
        NeighbourState::Incomplete => NeighState::Incomplete,
        NeighbourState::Reachable => NeighState::Reachable,
        NeighbourState::Stale => NeighState::Stale,
        NeighbourState::Delay => NeighState::Delay,
        NeighbourState::Probe => NeighState::Probe,
        NeighbourState::Failed => NeighState::Failed,
        NeighbourState::Noarp => NeighState::Noarp,
        NeighbourState::Permanent => NeighState::Permanent,
        _ => NeighState::None,
    };
    let dst = dst.ok_or(Skip::Malformed("a neighbour without an address"))?;
    if dst.is_multicast() {
        return Err(Skip::NotHeld);
    }
    Ok(Neighbour {
        link: m.header.ifindex,
        dst,
        lladdr,
        state,
        router: m.header.flags.contains(NeighbourFlags::Router),
    })
}
