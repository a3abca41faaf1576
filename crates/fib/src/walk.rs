//! The full lookup, as the kernel makes it: a query's checks, the rule walk, each table's
//! lookup, the choice among a route's paths, the source checks, and the answer as
//! `ip route get` prints it ([`Snapshot::route`]). The forwarding lookup (`forward`)
//! answers from what the compile decided wherever it can and comes here for the rest.
//!
//! The rule walk follows the kernel's `fib_rules_lookup`: rules by priority, selectors
//! matched (inverted by `not`), `goto` jumping forward, `nop` passing, rejecting actions
//! answering with their error, `lookup` answering unless the table has no route (or a
//! `throw` route), or the rule suppresses the answer. A table's lookup takes the longest
//! match of its LPM structure and, when no route of that node fits the flow (its TOS, its
//! source, dead paths, the output link), walks up to shorter prefixes, as the kernel
//! backtracks (IPv6's source-specific routes as `fib6_table_lookup` does).

use crate::answers::{DestAnswer, ObjectHop, Unnumbered};
use crate::classify::{Action, Candidates, CompiledRule, FlowKey};
use crate::hop::{sent_via, Hop};
use crate::layout::{CompiledTable, FamilyFib, Node, Snapshot};
use crate::link::{Link, LinkIndex, LinkKind};
use crate::multipath;
use crate::names::*;
use crate::net::{Family, Net};
use crate::nexthop::{NexthopId, NexthopKind};
use crate::query::{Answer, NoRoute, Query};
use crate::route::{Path, Paths, RouteBody, RouteType};
use crate::source;
use std::net::IpAddr;

/// The result of one table's lookup.
pub(crate) enum TableResult<'a> {
    /// A route fits the flow.
    Hit(&'a RouteBody, u8),
    /// A reject route answered with its error.
    Reject(NoRoute),
    /// Nothing here: the walk goes on.
    Miss,
    /// A `throw` route: the walk goes on (but an IPv6 gateway check stops at it).
    Thrown,
}

/// Whether an IPv6 destination binds a flow to its output link whatever its source
/// (`rt6_need_strict`: multicast, link-local, loopback).
pub(crate) fn needs_strict_oif(dst: IpAddr) -> bool {
    match dst {
        IpAddr::V6(a) => a.is_multicast() || a.segments()[0] & 0xffc0 == 0xfe80 || a.is_loopback(),
        IpAddr::V4(_) => false,
    }
}

/// `fib6_backtrack` from destination node `n`'s own routes: up to the next shorter
/// destination, whose subtree comes first, then its own routes; `None` past `::/0`.
fn self_or_up(
    table: &CompiledTable,
    mut n: usize,
    group: &dyn Fn(usize, u8) -> Option<Net>,
    has_own: &dyn Fn(usize) -> bool,
) -> Option<(usize, Option<Net>)> {
    loop {
        if table.nodes[n].dst.len() == 0 {
            return None;
        }
        n = table.nodes[n].parent? as usize;
        if let Some(g) = group(n, 129) {
            return Some((n, Some(g)));
        }
        if has_own(n) {
            return Some((n, None));
        }
    }
}

/// A query checked and ready for the rule walk.
#[derive(Clone, Debug)]
pub(crate) struct Prepared {
    /// The query as walked (a forwarded flow's source filled in, its `oif` dropped).
    pub(crate) q: Query,
    pub(crate) family: Family,
    /// The output link the walk matches rules and paths against.
    pub(crate) oif: Option<LinkIndex>,
    /// The input link the rules see (1, the loopback, for a flow this host sends).
    pub(crate) iif: LinkIndex,
    /// The link a forwarded flow arrives on.
    pub(crate) input: Option<LinkIndex>,
}

/// A query's checks passed: its family and the walk's links, without the query.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Checked {
    pub(crate) family: Family,
    /// The output link the walk matches rules and paths against.
    pub(crate) oif: Option<LinkIndex>,
    /// The input link the rules see (1, the loopback, for a flow this host sends).
    pub(crate) iif: LinkIndex,
    /// The link a forwarded flow arrives on.
    pub(crate) input: Option<LinkIndex>,
}

impl Checked {
    /// Whether multipath prefers the paths whose source address is the flow's (`src`):
    /// an IPv4 flow this host sends from a given source (the kernel's
    /// `fib_select_multipath`).
    #[inline]
    pub(crate) fn prefers_source(&self, src: Option<IpAddr>) -> bool {
        self.family == Family::V4
            && self.input.is_none()
            && src.is_some_and(|s| !s.is_unspecified())
    }

    /// The query as the walk takes it: a forwarded flow's source filled in (the
    /// family's unspecified address if none), its `oif` dropped.
    #[inline]
    pub(crate) fn with(self, q: &Query) -> Prepared {
        let mut q = q.clone();
        if self.input.is_some() {
            q.src = Some(q.src.unwrap_or(self.family.any()));
            q.oif = None;
        }
        Prepared {
            q,
            family: self.family,
            oif: self.oif,
            iif: self.iif,
            input: self.input,
        }
    }
}

/// The flow back to an arriving flow's source, as the kernel's source check looks it up:
/// to the source, from the destination (from nowhere for a broadcast), same TOS.
fn reverse(q: &Query, src: IpAddr, broadcast: bool) -> Query {
    let mut back = Query::to(src);
    back.src = Some(if broadcast { Family::V4.any() } else { q.dst });
    back.tos = q.tos;
    back
}

/// What answers a query once the walk is done.
pub(crate) enum Concluded<'a> {
    /// A route of a table.
    Route(&'a RouteBody, u32),
    /// No route: an IPv4 flow sent out of its `oif` all the same.
    Bare(LinkIndex),
}

/// Where a rule walk stands.
pub(crate) enum Step {
    /// Rule `rule` looks up the table at position `table`.
    Lookup { rule: usize, table: usize },
    /// The walk ended with this error.
    Done(NoRoute),
}

/// What a rule walk is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WalkFor {
    /// A flow's route (`ip route get`, a packet).
    Flow,
    /// The check of a new IPv6 route's gateway (`fib6_lookup` with the table-only rule
    /// action): `suppress_*` never applies, a `throw` route stops the walk as a reject,
    /// and the flow has no input link (rules with `iif lo` do not match).
    Gateway6,
}

/// The body of [`Snapshot::route`].
pub(crate) fn route(snap: &Snapshot, q: &Query) -> Result<Answer, NoRoute> {
    if let Some(answer) = snap.special_v4(q) {
        return answer;
    }
    let p = prepare(snap, q)?;
    let walk = walk(snap, &p.q, p.family, p.oif, p.iif, 0, WalkFor::Flow);
    match conclude(snap, &p, walk)? {
        Concluded::Route(route, table) => answer(snap, &p.q, p.family, route, table, p.input),
        Concluded::Bare(oif) => Ok(bare_answer(snap, q, oif)),
    }
}

/// The body of [`Snapshot::prepare`].
pub(crate) fn prepare(snap: &Snapshot, q: &Query) -> Result<Prepared, NoRoute> {
    Ok(check(snap, q)?.with(q))
}

/// The body of [`Snapshot::check`].
#[inline]
pub(crate) fn check(snap: &Snapshot, q: &Query) -> Result<Checked, NoRoute> {
    check_seen(snap, q, &mut None)
}

/// The body of [`Snapshot::check_seen`].
#[inline]
pub(crate) fn check_seen<'a>(
    snap: &'a Snapshot,
    q: &Query,
    seen: &mut Option<&'a Link>,
) -> Result<Checked, NoRoute> {
    let family = Family::of(q.dst);
    if q.src.is_some_and(|s| Family::of(s) != family) {
        return Err(NoRoute::Invalid);
    }
    if let Some(iif) = q.iif {
        let link = match *seen {
            Some(link) if link.index == iif => link,
            _ => {
                let link = snap.links.get(&iif).ok_or(NoRoute::NoDevice)?;
                *seen = Some(link);
                link
            }
        };
        return check_input(q, family, link);
    }
    if let Some(oif) = q.oif {
        let link = snap.links.get(&oif).ok_or(NoRoute::NoDevice)?;
        if family == Family::V4 && !link.up {
            return Err(NoRoute::NetworkUnreachable);
        }
    }
    if family == Family::V4 {
        if let Some(s) = q.src {
            if s.is_multicast() || s == IpAddr::from([255, 255, 255, 255]) || s.is_unspecified() {
                return Err(NoRoute::Invalid);
            }
            if !q.any_source && !is_local_v4(snap, s) {
                return Err(NoRoute::NetworkUnreachable);
            }
        }
    }
    Ok(Checked {
        family,
        oif: q.oif,
        iif: 1,
        input: None,
    })
}

/// The body of [`Snapshot::conclude`].
pub(crate) fn conclude<'a>(
    snap: &Snapshot,
    p: &Prepared,
    walk: Result<(&'a RouteBody, u8, u32), NoRoute>,
) -> Result<Concluded<'a>, NoRoute> {
    match walk {
        Ok((route, _, table)) => Ok(Concluded::Route(route, table)),
        Err(_) if p.family == Family::V4 && p.oif.is_some() && p.input.is_none() => {
            let oif = p.oif.expect("checked");
            if !snap.links[&oif].up {
                return Err(NoRoute::NetworkDown);
            }
            Ok(Concluded::Bare(oif))
        }
        Err(e) => Err(e),
    }
}

/// The body of [`Snapshot::gateway_v4`].
pub(crate) fn gateway_v4(
    snap: &Snapshot,
    table: u32,
    gw: IpAddr,
    oif: Option<LinkIndex>,
    min_scope: u8,
) -> Option<(LinkIndex, u8)> {
    let mut q = Query::to(gw);
    q.oif = oif;
    let in_table = (table != TABLE_MAIN)
        .then(|| snap.v4.table(table))
        .flatten()
        .and_then(|t| match table_lookup(snap, t, &q, oif, min_scope) {
            TableResult::Hit(r, _) => Some(r),
            _ => None,
        });
    let route = match in_table {
        Some(r) => r,
        None => {
            walk(snap, &q, Family::V4, oif, 1, min_scope, WalkFor::Flow)
                .ok()?
                .0
        }
    };
    if !matches!(route.kind, RouteType::Unicast | RouteType::Local) {
        return None;
    }
    let path = usable(snap, route, oif).next()?;
    Some((path.dev, route.scope))
}

/// The body of [`Snapshot::gateway_v6`].
pub(crate) fn gateway_v6(
    snap: &Snapshot,
    table: u32,
    gw: IpAddr,
    oif: Option<LinkIndex>,
) -> Option<LinkIndex> {
    let mut q = Query::to(gw);
    q.oif = oif;
    let on_link = |route: &RouteBody| -> Option<LinkIndex> {
        if route.kind.is_reject() {
            return None;
        }
        let path = usable(snap, route, oif).next()?;
        (path.gateway.is_none() && oif.is_none_or(|o| o == path.dev)).then_some(path.dev)
    };
    let in_table = snap
        .v6
        .table(table)
        .and_then(|t| match table_lookup(snap, t, &q, oif, 0) {
            TableResult::Hit(r, _) => on_link(r),
            _ => None,
        });
    in_table.or_else(|| {
        on_link(
            walk(snap, &q, Family::V6, oif, 0, 0, WalkFor::Gateway6)
                .ok()?
                .0,
        )
    })
}

/// The body of [`Snapshot::onlink_gateway_v6_conflicts`].
pub(crate) fn onlink_gateway_v6_conflicts(snap: &Snapshot, gw: IpAddr, dev: LinkIndex) -> bool {
    let q = Query::to(gw);
    let Some(t) = snap.v6.table(TABLE_MAIN) else {
        return false;
    };
    match table_lookup(snap, t, &q, None, 0) {
        TableResult::Hit(r, len) if len > 0 => {
            r.kind != RouteType::Unicast
                || usable(snap, r, None).next().is_some_and(|p| p.dev != dev)
        }
        _ => false,
    }
}

/// The body of [`Snapshot::bare_answer`].
pub(crate) fn bare_answer(snap: &Snapshot, q: &Query, oif: LinkIndex) -> Answer {
    let prefsrc = source::select_v4(&snap.addrs, &snap.links, oif, None, SCOPE_LINK);
    answer_without_route(q, RouteType::Unicast, oif, prefsrc)
}

/// An answer of type `kind` through `dev` with no route behind it: no table, gateway
/// or metrics; `prefsrc` given only when the query gives no source.
pub(crate) fn answer_without_route(
    q: &Query,
    kind: RouteType,
    dev: LinkIndex,
    prefsrc: Option<IpAddr>,
) -> Answer {
    Answer {
        kind,
        dst: q.dst,
        // An unspecified source is no source.
        from: q.src.filter(|s| !s.is_unspecified()),
        gateway: None,
        dev,
        table: None,
        prefsrc: if q.src.is_some() { None } else { prefsrc },
        metric: 0,
        protocol: 0,
        pref: 0,
        tos: 0,
        mtu: None,
        hoplimit: None,
        iif: None,
        linkdown: false,
        onlink: false,
        mark: q.mark,
        uid: q.uid,
        cache: Vec::new(),
    }
}

#[inline]
fn is_local_v4(snap: &Snapshot, a: IpAddr) -> bool {
    matches!(a, IpAddr::V4(a) if snap.v4_locals.binary_search(&u32::from(a)).is_ok())
}

/// The checks of a flow arriving on `iif`.
fn check_input(q: &Query, family: Family, link: &Link) -> Result<Checked, NoRoute> {
    // Both families route a flow arriving on a link that is down as any other.
    let src = q.src.unwrap_or(family.any());
    let lo_in = link.kind == LinkKind::Loopback;
    // Of `0.0.0.0/8` only `0.0.0.0` itself is martian: the kernel routes the rest as
    // unicast (its `ipv4_is_zeronet` is `addr == 0`).
    if let IpAddr::V4(d) = q.dst {
        if !lo_in && (d.is_loopback() || d.is_unspecified()) {
            return Err(NoRoute::Invalid);
        }
    }
    if family == Family::V4 {
        // Martian sources (`ip_route_input_slow`): multicast, limited broadcast, the
        // unspecified address, and loopback arriving on another link. A source that is one of
        // this host's addresses is found later, by the source check of what the
        // lookup answers (`fib_validate_source`).
        let IpAddr::V4(s4) = src else {
            unreachable!("checked to be of the family")
        };
        if src.is_multicast()
            || src == IpAddr::from([255, 255, 255, 255])
            || s4.is_unspecified()
            || (!lo_in && s4.is_loopback())
        {
            return Err(NoRoute::Invalid);
        }
    }
    Ok(Checked {
        family,
        oif: None,
        iif: link.index,
        input: Some(link.index),
    })
}

/// The body of [`Snapshot::input_needs_source_check`].
#[inline]
pub(crate) fn input_needs_source_check(snap: &Snapshot, c: &Checked, src: Option<IpAddr>) -> bool {
    match (c.input, src) {
        (Some(input), Some(IpAddr::V4(s))) if input != snap.lo => {
            snap.v4_full_source_check
                || (snap.v4_own.may_hold(u32::from(s))
                    && (is_local_v4(snap, IpAddr::V4(s)) || is_broadcast_v4(snap, IpAddr::V4(s))))
        }
        _ => false,
    }
}

/// The body of [`Snapshot::plain_answers_hold`].
#[inline]
pub(crate) fn plain_answers_hold(snap: &Snapshot, c: &Checked, dst: IpAddr) -> bool {
    !(c.family == Family::V6
        && c.input.is_some()
        && (snap.v6_input_prefers || needs_strict_oif(dst)))
}

/// Whether some table has a host route of type `broadcast` to `a`.
#[inline]
fn is_broadcast_v4(snap: &Snapshot, a: IpAddr) -> bool {
    matches!(a, IpAddr::V4(a) if snap.v4_broadcasts.binary_search(&u32::from(a)).is_ok())
}

/// The body of [`Snapshot::validate_source`].
pub(crate) fn validate_source(
    snap: &Snapshot,
    q: &Query,
    input: Option<LinkIndex>,
    route: &RouteBody,
    dev: LinkIndex,
) -> Result<(), NoRoute> {
    validate_source_of(snap, q, input, route.kind, dev)
}

/// The body of [`Snapshot::validate_source_of`].
pub(crate) fn validate_source_of(
    snap: &Snapshot,
    q: &Query,
    input: Option<LinkIndex>,
    kind: RouteType,
    dev: LinkIndex,
) -> Result<(), NoRoute> {
    let src = q.src.filter(|_| input.is_some());
    check_source(snap, q, input, src, kind, dev, |back, iif| {
        let walk = walk(snap, back, Family::V4, None, iif, 0, WalkFor::Flow);
        Some(walk.ok().map(|(r, _, _)| r.kind))
    })
    .expect("the walk decides")
}

/// The body of [`Snapshot::check_source`].
#[inline]
pub(crate) fn check_source(
    snap: &Snapshot,
    q: &Query,
    input: Option<LinkIndex>,
    src: Option<IpAddr>,
    kind: RouteType,
    dev: LinkIndex,
    back: impl FnOnce(&Query, LinkIndex) -> Option<Option<RouteType>>,
) -> Option<Result<(), NoRoute>> {
    let (Some(input), Some(src)) = (input, src) else {
        return Some(Ok(()));
    };
    if Family::of(src) != Family::V4 || input == snap.lo {
        return Some(Ok(()));
    }
    let forwarded = kind == RouteType::Unicast;
    if !(forwarded || matches!(kind, RouteType::Local | RouteType::Broadcast)) {
        return Some(Ok(()));
    }
    let same_link = forwarded && dev == input;
    if !snap.v4_full_source_check && !same_link {
        return Some(if is_local_v4(snap, src) {
            Err(NoRoute::Invalid)
        } else {
            Ok(())
        });
    }
    let flow = reverse(q, src, kind == RouteType::Broadcast);
    let iif = if forwarded { dev } else { snap.lo };
    Some(match back(&flow, iif)? {
        Some(k) if k != RouteType::Unicast => Err(NoRoute::Invalid),
        _ => Ok(()),
    })
}

/// Whether a flow forwarded back out of its input link comes from a neighbour on that
/// link, so the kernel would send it a redirect (`cache redirect`): the source's route,
/// as the source check looks it up, leaves by that link with no gateway.
fn redirects(
    snap: &Snapshot,
    q: &Query,
    input: Option<LinkIndex>,
    route: &RouteBody,
    dev: LinkIndex,
) -> bool {
    let (Some(input), Some(src)) = (input, q.src) else {
        return false;
    };
    if Family::of(src) != Family::V4 || route.kind != RouteType::Unicast || dev != input {
        return false;
    }
    let back = reverse(q, src, false);
    let on_link =
        |oif: Option<LinkIndex>| match walk(snap, &back, Family::V4, oif, dev, 0, WalkFor::Flow) {
            Ok((r, _, _)) if r.kind == RouteType::Unicast => {
                let paths = paths_of(snap, r);
                paths
                    .iter()
                    .any(|p| p.dev == dev && !p.dead)
                    .then(|| paths.iter().any(|p| p.dev == dev && p.gateway.is_none()))
            }
            _ => None,
        };
    on_link(None)
        .or_else(|| on_link(Some(dev)))
        .unwrap_or(false)
}

/// The body of [`Snapshot::walk`].
pub(crate) fn walk<'s>(
    snap: &'s Snapshot,
    q: &Query,
    family: Family,
    oif: Option<LinkIndex>,
    iif: LinkIndex,
    min_scope: u8,
    purpose: WalkFor,
) -> Result<(&'s RouteBody, u8, u32), NoRoute> {
    let fib = snap.fib(family);
    let key = FlowKey::new(q, oif, iif);
    let candidates = fib.rules.candidates(&key);
    // IPv6 looks a flow arriving on a link up with that link as its preferred output
    // link (`ip6_pol_route_input`), though rules do not see it as one.
    let tables_oif = match (family, oif, q.iif) {
        (Family::V6, None, Some(input)) => Some(input),
        _ => oif,
    };
    let mut from = 0;
    loop {
        let (rule, table) = match next_lookup(fib, &candidates, from) {
            Step::Lookup { rule, table } => (rule, table),
            Step::Done(e) => return Err(e),
        };
        let t = &fib.tables[table];
        let result = table_lookup(snap, t, q, tables_oif, min_scope);
        match after_lookup(snap, &fib.rules.list[rule], t.id, result, purpose) {
            Some(done) => return done,
            None => from = rule + 1,
        }
    }
}

/// From rule `from` on, the next rule whose selectors match and that looks up a
/// table, or the walk's end: a rejecting rule's error, or no rule left.
#[inline]
pub(crate) fn next_lookup(fib: &FamilyFib, candidates: &Candidates<'_>, mut from: usize) -> Step {
    loop {
        let Some(at) = candidates.next(from) else {
            return Step::Done(NoRoute::NetworkUnreachable);
        };
        from = at + 1;
        match fib.rules.list[at].action {
            Action::Goto(Some(target)) => from = target,
            Action::Goto(None) | Action::Nop | Action::Lookup { table: None, .. } => {}
            Action::Blackhole => return Step::Done(NoRoute::Invalid),
            Action::Unreachable => return Step::Done(NoRoute::NetworkUnreachable),
            Action::Prohibit => return Step::Done(NoRoute::Prohibited),
            Action::Lookup {
                table: Some(table), ..
            } => return Step::Lookup { rule: at, table },
        }
    }
}

/// What a rule makes of its table's result: the walk's answer, or `None` to go on
/// with the next rule (nothing found, a `throw`, or an answer the rule suppresses).
#[inline]
pub(crate) fn after_lookup<'a>(
    snap: &Snapshot,
    rule: &CompiledRule,
    table: u32,
    result: TableResult<'a>,
    purpose: WalkFor,
) -> Option<Result<(&'a RouteBody, u8, u32), NoRoute>> {
    match result {
        TableResult::Miss => None,
        TableResult::Thrown if purpose == WalkFor::Flow => None,
        TableResult::Thrown => Some(Err(NoRoute::HostUnreachable)),
        TableResult::Reject(e) => Some(Err(e)),
        TableResult::Hit(route, len) => {
            if purpose == WalkFor::Gateway6 {
                return Some(Ok((route, len, table)));
            }
            if rule.suppress_prefixlength.is_some_and(|p| len <= p) {
                return None;
            }
            if let Some(g) = rule.suppress_ifgroup {
                let dev = paths_of(snap, route).first().map(|p| p.dev);
                if dev
                    .and_then(|d| snap.links.get(&d))
                    .is_some_and(|l| l.group == g)
                {
                    return None;
                }
            }
            Some(Ok((route, len, table)))
        }
    }
}

/// The body of [`Snapshot::paths_of`].
#[inline]
pub(crate) fn paths_of<'a>(snap: &'a Snapshot, route: &'a RouteBody) -> &'a [Path] {
    match &route.paths {
        Paths::Own(p) => p,
        Paths::Object(id) => snap.object_paths.get(id).map_or(&[], Vec::as_slice),
        Paths::None => &[],
    }
}

fn is_blackhole_object(snap: &Snapshot, id: NexthopId) -> bool {
    match snap.nexthops.get(&id).map(|n| &n.kind) {
        Some(NexthopKind::Blackhole) => true,
        Some(NexthopKind::Group(m)) => {
            m.len() == 1
                && matches!(
                    snap.nexthops.get(&m[0].0).map(|n| &n.kind),
                    Some(NexthopKind::Blackhole)
                )
        }
        _ => false,
    }
}

/// The body of [`Snapshot::local_route`].
pub(crate) fn local_route<'a>(
    snap: &Snapshot,
    table: &'a CompiledTable,
    addr: IpAddr,
) -> Option<&'a RouteBody> {
    match table_lookup(snap, table, &Query::to(addr), None, 0) {
        TableResult::Hit(route, _) if route.kind == RouteType::Local => Some(route),
        _ => None,
    }
}

/// One table's lookup, backtracking to shorter prefixes as the kernel does.
fn table_lookup<'a>(
    snap: &Snapshot,
    table: &'a CompiledTable,
    q: &Query,
    oif: Option<LinkIndex>,
    min_scope: u8,
) -> TableResult<'a> {
    table_lookup_from(snap, table, table.longest(q.dst), q, oif, min_scope)
}

/// One table's lookup once its LPM structure has given `longest`, the node of the
/// longest prefix holding the destination.
#[inline]
pub(crate) fn table_lookup_from<'a>(
    snap: &Snapshot,
    table: &'a CompiledTable,
    longest: Option<u32>,
    q: &Query,
    oif: Option<LinkIndex>,
    min_scope: u8,
) -> TableResult<'a> {
    if Family::of(q.dst) == Family::V6 {
        return table_lookup_v6(snap, table, longest, q, oif);
    }
    // Source-specific IPv4 routes (fibre's own; the kernel ignores `from` on IPv4
    // routes): at each destination prefix, longest first, the routes whose source
    // prefix holds the flow's source (the unspecified address when it gives none),
    // longest source prefix first, then the source-less ones.
    let src = q.src.unwrap_or(Family::V4.any());
    let mut node = longest;
    while let Some(n) = node {
        let n = &table.nodes[n as usize];
        let fitting = n
            .routes
            .iter()
            .filter(|r| r.tos == 0 || r.tos == q.tos & 0x1c)
            .filter(|r| r.scope >= min_scope)
            .filter(|r| r.src.len() == 0 || r.src.contains(src));
        if let Some(result) = select(snap, fitting, n.dst.len(), oif, true) {
            return result;
        }
        node = n.parent;
    }
    TableResult::Miss
}

/// The kernel's IPv6 table lookup (`fib6_table_lookup`), source-specific routes
/// included. A destination prefix with source-specific routes holds them in a subtree
/// keyed by source prefix. The first lookup takes the longest destination whose
/// subtree has a source prefix holding the flow's source, or, for a destination without
/// a subtree, its routes; a destination whose subtree has no such source is passed
/// over, its own source-less routes too (except at `::/0`). When the chosen routes
/// give nothing usable, the kernel backtracks (`fib6_backtrack`): shorter source
/// prefixes of the same subtree, then the destination's own routes, then the next
/// shorter destination (its subtree first).
fn table_lookup_v6<'a>(
    snap: &Snapshot,
    table: &'a CompiledTable,
    longest: Option<u32>,
    q: &Query,
    oif: Option<LinkIndex>,
) -> TableResult<'a> {
    let src = q.src.unwrap_or(Family::V6.any());
    // A source prefix of node `n` holding the flow's source, shorter than `below`.
    let group = |n: usize, below: u8| -> Option<Net> {
        table.nodes[n]
            .routes
            .iter()
            .map(|r| r.src)
            .find(|s| s.len() > 0 && s.len() < below && s.contains(src))
    };
    let has_subtree = |n: usize| table.nodes[n].routes.iter().any(|r| r.src.len() > 0);
    let has_own = |n: usize| table.nodes[n].routes.iter().any(|r| r.src.len() == 0);
    // The first lookup.
    let mut at: Option<(usize, Option<Net>)> = None;
    let mut node = longest.map(|n| n as usize);
    while let Some(n) = node {
        if has_subtree(n) {
            if let Some(g) = group(n, 129) {
                at = Some((n, Some(g)));
                break;
            }
            if table.nodes[n].dst.len() == 0 {
                at = Some((n, None));
                break;
            }
        } else {
            at = Some((n, None));
            break;
        }
        node = table.nodes[n].parent.map(|p| p as usize);
    }
    // IPv6 matches the output link strictly unless the flow has a source (or the
    // destination needs it: link-local and multicast).
    // A flow arriving on a link prefers it as its output link, strictly only for
    // those destinations (`ip6_route_input_lookup`).
    let strict = match q.iif {
        Some(_) => needs_strict_oif(q.dst),
        None => q.src.is_none_or(|s| s.is_unspecified()) || needs_strict_oif(q.dst),
    };
    while let Some((n, g)) = at {
        let node = &table.nodes[n];
        let routes = node
            .routes
            .iter()
            .filter(|r| g.map_or(r.src.len() == 0, |g| r.src == g));
        if let Some(result) = select(snap, routes, node.dst.len(), oif, strict) {
            return result;
        }
        // Backtrack.
        at = match g {
            Some(g) => match group(n, g.len()) {
                Some(shorter) => Some((n, Some(shorter))),
                None if has_own(n) => Some((n, None)),
                None => self_or_up(table, n, &group, &has_own),
            },
            None => self_or_up(table, n, &group, &has_own),
        };
    }
    TableResult::Miss
}

/// Among one node's routes (in the kernel's order), the one a flow takes: a reject
/// route answers with its error; a route with no path usable by `oif` is passed over
/// when `strict`, and otherwise only ranks after those leaving by `oif` among routes
/// of the same metric. `None` when none is usable.
fn select<'a>(
    snap: &Snapshot,
    routes: impl Iterator<Item = &'a RouteBody>,
    len: u8,
    oif: Option<LinkIndex>,
    strict: bool,
) -> Option<TableResult<'a>> {
    let mut fallback: Option<&'a RouteBody> = None;
    for r in routes {
        if fallback.is_some_and(|f| f.metric != r.metric) {
            break;
        }
        if r.kind.is_reject() && r.family() == Family::V6 && oif.is_some() && strict {
            // IPv6 matches an output link strictly: a reject route is on `lo`.
            continue;
        }
        match r.kind {
            RouteType::Blackhole => return Some(TableResult::Reject(NoRoute::Invalid)),
            RouteType::Unreachable => return Some(TableResult::Reject(NoRoute::HostUnreachable)),
            RouteType::Prohibit => return Some(TableResult::Reject(NoRoute::Prohibited)),
            RouteType::Throw => return Some(TableResult::Thrown),
            _ => {}
        }
        if let Paths::Object(id) = r.paths {
            if is_blackhole_object(snap, id) {
                return Some(TableResult::Reject(NoRoute::Invalid));
            }
        }
        if usable(snap, r, oif).next().is_some() {
            return Some(TableResult::Hit(r, len));
        }
        if !strict && fallback.is_none() && usable(snap, r, None).next().is_some() {
            fallback = Some(r);
        }
    }
    fallback.map(|r| TableResult::Hit(r, len))
}

/// A route's paths that are alive (and leave by `oif`, if given).
#[inline]
pub(crate) fn usable<'a>(
    snap: &'a Snapshot,
    r: &'a RouteBody,
    oif: Option<LinkIndex>,
) -> impl Iterator<Item = &'a Path> + Clone + 'a {
    paths_of(snap, r)
        .iter()
        .filter(move |p| !p.dead && oif.is_none_or(|o| o == p.dev))
}

/// The body of [`Snapshot::choose_path`].
#[inline]
pub(crate) fn choose_path<'a>(
    snap: &'a Snapshot,
    route: &'a RouteBody,
    oif: Option<LinkIndex>,
    q: &Query,
    input: bool,
) -> Option<&'a Path> {
    let mut live = usable(snap, route, oif);
    if oif.is_some() {
        return live.next();
    }
    match q.src {
        Some(IpAddr::V4(src))
            if !input && !src.is_unspecified() && matches!(route.paths, Paths::Own(_)) =>
        {
            choose_by_source(snap, route, IpAddr::V4(src), q)
        }
        _ => {
            let hashed = multipath::choose(live, |p| p.weight, || snap.multipath.hash(q))?;
            match q.iif {
                // An IPv6 flow arriving on a link to a destination bound to it takes
                // the hashed path only if it leaves by that link; else the path the
                // lookup chose, the first that does (`fib6_select_path`).
                Some(iif) if input && hashed.dev != iif && needs_strict_oif(q.dst) => {
                    usable(snap, route, Some(iif)).next().or(Some(hashed))
                }
                _ => Some(hashed),
            }
        }
    }
}

/// An IPv4 flow this host sends from `src`: the kernel scores each live path, 2 when
/// its source address is `src` and 1 when the hash falls in its share, and takes the
/// first of the highest score, so a path of the flow's source wins over the hash.
fn choose_by_source<'a>(
    snap: &'a Snapshot,
    route: &'a RouteBody,
    src: IpAddr,
    q: &Query,
) -> Option<&'a Path> {
    let usable = usable(snap, route, None);
    let total: u64 = usable.clone().map(|p| p.weight as u64).sum();
    let h = snap.multipath.hash(q) as i64;
    let mut acc = 0u64;
    let mut best: Option<(&Path, u8)> = None;
    for p in usable {
        acc += p.weight as u64;
        let own =
            source::select_v4(&snap.addrs, &snap.links, p.dev, p.gateway, route.scope) == Some(src);
        let score = 2 * own as u8 + (h <= multipath::upper_bound(acc, total)) as u8;
        if best.is_none_or(|(_, b)| score > b) {
            best = Some((p, score));
            if score == 3 {
                break;
            }
        }
    }
    best.map(|(p, _)| p)
}

/// The body of [`Snapshot::path_oif`].
#[inline]
pub(crate) fn path_oif(
    snap: &Snapshot,
    q: &Query,
    family: Family,
    route: &RouteBody,
) -> Option<LinkIndex> {
    if q.oif.is_some()
        && family == Family::V6
        && q.src.is_some_and(|s| !s.is_unspecified())
        && usable(snap, route, q.oif).next().is_none()
    {
        None
    } else {
        q.oif
    }
}

/// The body of [`Snapshot::answer`].
pub(crate) fn answer(
    snap: &Snapshot,
    q: &Query,
    family: Family,
    route: &RouteBody,
    table: u32,
    iif: Option<LinkIndex>,
) -> Result<Answer, NoRoute> {
    let oif = path_oif(snap, q, family, route);
    let path =
        choose_path(snap, route, oif, q, iif.is_some()).ok_or(NoRoute::NetworkUnreachable)?;
    validate_source(snap, q, iif, route, path.dev)?;
    let redirect = redirects(snap, q, iif, route, path.dev);
    let lo = snap.lo;
    let local = matches!(route.kind, RouteType::Local | RouteType::Anycast);
    let brd = matches!(route.kind, RouteType::Broadcast);
    let mut cache = Vec::new();
    if family == Family::V4 {
        if local || brd {
            cache.push("local");
        }
        if brd {
            cache.push("brd");
        }
        if redirect {
            cache.push("redirect");
        }
    }
    let dev = if local || (brd && iif.is_some()) {
        lo
    } else {
        path.dev
    };
    let prefsrc = if iif.is_some() {
        None
    } else {
        match family {
            Family::V4 if q.src.is_some() => None,
            Family::V4 => route.prefsrc.or_else(|| {
                if local {
                    Some(q.dst)
                } else {
                    source::select_v4(
                        &snap.addrs,
                        &snap.links,
                        path.dev,
                        path.gateway,
                        route.scope,
                    )
                }
            }),
            Family::V6 => route.prefsrc.or_else(|| {
                if route.kind == RouteType::Local {
                    Some(q.dst)
                } else {
                    source::select_v6(&snap.addrs, &snap.links, path.dev, q.dst)
                }
            }),
        }
    };
    Ok(Answer {
        kind: route.kind,
        dst: q.dst,
        from: q.src,
        gateway: if local { None } else { sent_via(path) },
        dev,
        table: Some(table),
        prefsrc,
        metric: route.metric,
        protocol: route.protocol,
        pref: route.pref,
        tos: route.tos,
        mtu: route.mtu,
        hoplimit: route.hoplimit,
        iif,
        linkdown: !local && !snap.carrier.get(&path.dev).copied().unwrap_or(false),
        onlink: path.onlink,
        mark: q.mark,
        uid: q.uid,
        cache,
    })
}

/// The body of [`Snapshot::unnumbered_answer`].
pub(crate) fn unnumbered_answer(snap: &Snapshot, table: u32, node: &Node) -> Unnumbered {
    let len = node.dst.len();
    let v6 = node.dst.family() == Family::V6;
    if node.routes.iter().any(|r| r.tos != 0 || r.src.len() > 0) {
        return Unnumbered::Fixed(DestAnswer::Flow);
    }
    match select(snap, node.routes.iter(), len, None, true) {
        None if v6 && len == 0 => Unnumbered::Fixed(DestAnswer::Miss),
        None | Some(TableResult::Miss) => Unnumbered::Up,
        Some(TableResult::Thrown) => Unnumbered::Fixed(DestAnswer::Thrown),
        Some(TableResult::Reject(e)) => Unnumbered::Fixed(DestAnswer::Reject(e)),
        Some(TableResult::Hit(route, len)) => {
            let object = match route.paths {
                Paths::Object(id) => Some(id),
                _ => None,
            };
            let hop = |p: &Path| ObjectHop {
                hop: Hop::of_route(route, table, p, snap.lo, false),
                object,
            };
            let paths: Vec<&Path> = usable(snap, route, None).collect();
            if route.kind == RouteType::Broadcast || paths.is_empty() {
                Unnumbered::Fixed(DestAnswer::Flow)
            } else if paths.len() == 1 {
                Unnumbered::One(hop(paths[0]), len)
            } else {
                Unnumbered::Multi(paths.iter().map(|p| (hop(p), p.weight)).collect(), len)
            }
        }
    }
}
