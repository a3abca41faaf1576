//! The published routing state that lookups read, and the lookup itself.
//!
//! A [`Snapshot`] is compiled from a [`State`] and never changes: readers hold one and
//! look up against all of it while a writer compiles the next. Each table of each family
//! is one LPM structure of `fibre-lpm` whose value for a destination prefix is the index
//! of a *node*: the routes of that prefix, ordered as the kernel orders them (and, for
//! IPv6, grouped by source prefix, longest first), and the node of the next shorter
//! destination prefix present in the table. A lookup takes the longest match and, when no
//! route of a node fits the flow (its TOS, its source, dead paths, the output link), walks
//! up to shorter prefixes, as the kernel backtracks.
//!
//! The rule walk follows the kernel's `fib_rules_lookup`: rules by priority, selectors
//! matched (inverted by `not`), `goto` jumping forward, `nop` passing, rejecting actions
//! answering with their error, `lookup` answering unless the table has no route (or a
//! `throw` route), or the rule suppresses the answer.

use crate::link::{Address, Link, LinkIndex, LinkKind};
use crate::names::*;
use crate::net::{addr_bits, Family, Net};
use crate::nexthop::{Nexthop, NexthopId, NexthopKind};
use crate::query::{Answer, NoRoute, Query};
use crate::route::{Path, Paths, Route, RouteType};
use crate::rule::{Rule, RuleAction};
use crate::source;
use crate::state::State;
use fibre_lpm::{Ipv4Table, Ipv6Table};
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

/// One destination prefix of a compiled table.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    /// The destination prefix.
    pub(crate) dst: Net,
    /// The routes, grouped by source prefix (longest source first), each group in the
    /// kernel's order.
    pub(crate) routes: Vec<Route>,
    /// The node of the next shorter destination prefix in the table, if any.
    pub(crate) parent: Option<u32>,
}

/// One compiled table.
#[derive(Debug)]
pub(crate) struct CompiledTable {
    v4: Option<Ipv4Table>,
    v6: Option<Ipv6Table>,
    pub(crate) nodes: Vec<Node>,
}

impl CompiledTable {
    fn build(family: Family, routes: &crate::state::TableRoutes) -> CompiledTable {
        // Nodes by destination: source groups longest first, then the kernel's order.
        let mut by_dst: BTreeMap<Net, Vec<Route>> = BTreeMap::new();
        for ((dst, _src), list) in routes {
            by_dst.entry(*dst).or_default().extend(list.iter().cloned());
        }
        let mut nodes: Vec<Node> = Vec::with_capacity(by_dst.len());
        let mut index: HashMap<Net, u32> = HashMap::with_capacity(by_dst.len());
        for (dst, mut list) in by_dst {
            list.sort_by_key(|r| std::cmp::Reverse(r.src.len()));
            index.insert(dst, nodes.len() as u32);
            nodes.push(Node {
                dst,
                routes: list,
                parent: None,
            });
        }
        // Each node's parent: the longest shorter prefix present that covers it.
        for node in nodes.iter_mut() {
            let dst = node.dst;
            node.parent = (0..dst.len()).rev().find_map(|len| {
                index
                    .get(&Net::new(dst.addr(), len).expect("shorter"))
                    .copied()
            });
        }
        let (mut v4, mut v6) = (None, None);
        match family {
            Family::V4 => {
                v4 = Some(Ipv4Table::build(
                    nodes
                        .iter()
                        .enumerate()
                        .map(|(i, n)| (n.dst.v4().expect("IPv4"), i as u32)),
                ))
            }
            Family::V6 => {
                v6 = Some(Ipv6Table::build(
                    nodes
                        .iter()
                        .enumerate()
                        .map(|(i, n)| (n.dst.v6().expect("IPv6"), i as u32)),
                ))
            }
        }
        CompiledTable { v4, v6, nodes }
    }

    /// The node of the longest prefix holding `dst`.
    fn longest(&self, dst: IpAddr) -> Option<u32> {
        match dst {
            IpAddr::V4(a) => self.v4.as_ref()?.lookup(u32::from(a)),
            IpAddr::V6(a) => self.v6.as_ref()?.lookup(u128::from(a)),
        }
    }

    /// Bytes the table's structure and nodes take.
    fn memory(&self) -> usize {
        let lpm = self.v4.as_ref().map_or(0, |t| {
            let m = t.memory();
            m.lookup_bytes + m.update_bytes
        }) + self.v6.as_ref().map_or(0, |t| {
            let m = t.memory();
            m.lookup_bytes + m.update_bytes
        });
        lpm + self.nodes.len() * std::mem::size_of::<Node>()
            + self
                .nodes
                .iter()
                .map(|n| n.routes.len() * std::mem::size_of::<Route>())
                .sum::<usize>()
    }
}

/// The rules and tables of one family.
#[derive(Debug)]
struct FamilyFib {
    rules: Vec<Rule>,
    /// For each rule, the index of its `goto` target (the first rule of that priority).
    goto_targets: Vec<Option<usize>>,
    tables: HashMap<u32, CompiledTable>,
    /// IPv4 before any rule was added: the kernel skips the rules and looks up `main`
    /// (holding `local` too while they are merged) and then `default`.
    without_rules: bool,
}

/// The result of one table's lookup.
enum TableResult<'a> {
    /// A route fits the flow.
    Hit(&'a Route, u8),
    /// A reject route answered with its error.
    Reject(NoRoute),
    /// Nothing here: the walk goes on.
    Miss,
    /// A `throw` route: the walk goes on (but an IPv6 gateway check stops at it).
    Thrown,
}

/// Whether an IPv6 destination binds a flow to its output link whatever its source
/// (`rt6_need_strict`: multicast, link-local, loopback).
fn needs_strict_oif(dst: IpAddr) -> bool {
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

/// The gateway a path sends through (`rt_uses_gateway`): an IPv4 gateway that resolved
/// to one of this host's addresses (scope host) is kept on the path but not used.
fn sent_via(p: &Path) -> Option<IpAddr> {
    p.gateway.filter(|g| g.is_ipv6() || p.scope == SCOPE_LINK)
}

/// What a rule walk is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WalkFor {
    /// A flow's route (`ip route get`, a packet).
    Flow,
    /// The check of a new IPv6 route's gateway (`fib6_lookup` with the table-only rule
    /// action): `suppress_*` never applies, a `throw` route stops the walk as a reject,
    /// and the flow has no input link (rules with `iif lo` do not match).
    Gateway6,
}

/// A compiled, immutable routing state: what readers look up against.
#[derive(Debug)]
pub struct Snapshot {
    v4: FamilyFib,
    v6: FamilyFib,
    links: BTreeMap<LinkIndex, Link>,
    carrier: BTreeMap<LinkIndex, bool>,
    addrs: Vec<Address>,
    nexthops: BTreeMap<NexthopId, Nexthop>,
}

impl State {
    /// Compiles the state into a snapshot for lookups.
    pub fn snapshot(&self) -> Snapshot {
        let fam = |f: Family| {
            let rules: Vec<Rule> = self.rules(f).to_vec();
            let goto_targets = rules
                .iter()
                .map(|r| match r.action {
                    RuleAction::Goto(p) => rules.iter().position(|t| t.pref == p),
                    _ => None,
                })
                .collect();
            let merged = f == Family::V4 && !self.v4_unmerged();
            let mut tables: HashMap<u32, CompiledTable> = self
                .tables()
                .filter(|(tf, id, _)| {
                    *tf == f && !(merged && (*id == TABLE_LOCAL || *id == TABLE_MAIN))
                })
                .map(|(_, id, routes)| (id, CompiledTable::build(f, routes)))
                .collect();
            if merged {
                // One structure for both, local's routes first in each prefix (the kernel
                // orders a merged prefix's routes by table, local's id being higher).
                let mut both = crate::state::TableRoutes::new();
                for id in [TABLE_LOCAL, TABLE_MAIN] {
                    for (_, _, routes) in self.tables().filter(|(tf, t, _)| *tf == f && *t == id) {
                        for (k, list) in routes {
                            both.entry(*k).or_default().extend(list.iter().cloned());
                        }
                    }
                }
                tables.insert(TABLE_MAIN, CompiledTable::build(f, &both));
            }
            let without_rules = f == Family::V4 && !self.v4_custom_rules();
            FamilyFib {
                rules,
                goto_targets,
                tables,
                without_rules,
            }
        };
        Snapshot {
            v4: fam(Family::V4),
            v6: fam(Family::V6),
            links: self.links().map(|l| (l.index, l.clone())).collect(),
            carrier: self
                .links()
                .map(|l| (l.index, self.carrier(l.index)))
                .collect(),
            addrs: self.addresses().to_vec(),
            nexthops: self.nexthops().map(|n| (n.id, n.clone())).collect(),
        }
    }
}

/// The 31-bit flow hash multipath uses to choose a path (L3: addresses; L4: the five-tuple
/// when the query gives a protocol and ports).
pub fn flow_hash(q: &Query) -> u32 {
    let mut h: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut mix = |v: u64| {
        h ^= v;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
    };
    let s = q.src.map_or(0, addr_bits);
    let d = addr_bits(q.dst);
    mix(s as u64);
    mix((s >> 64) as u64);
    mix(d as u64);
    mix((d >> 64) as u64);
    if q.ipproto != 0 {
        mix(q.ipproto as u64);
        mix(((q.sport as u64) << 16) | q.dport as u64);
    }
    (h >> 33) as u32 & 0x7fff_ffff
}

impl Snapshot {
    fn family(&self, f: Family) -> &FamilyFib {
        match f {
            Family::V4 => &self.v4,
            Family::V6 => &self.v6,
        }
    }

    /// A link by index.
    pub fn link(&self, index: LinkIndex) -> Option<&Link> {
        self.links.get(&index)
    }

    /// The links.
    pub fn links(&self) -> impl Iterator<Item = &Link> {
        self.links.values()
    }

    /// Bytes each table takes (structure, nodes and routes), by family and table id.
    pub fn memory_by_table(&self) -> Vec<(Family, u32, usize)> {
        let mut out = Vec::new();
        for f in [Family::V4, Family::V6] {
            let mut ids: Vec<_> = self
                .family(f)
                .tables
                .iter()
                .map(|(id, t)| (*id, t.memory()))
                .collect();
            ids.sort();
            out.extend(ids.into_iter().map(|(id, m)| (f, id, m)));
        }
        out
    }

    /// Routes a query as the kernel's `ip route get` would.
    pub fn route(&self, q: &Query) -> Result<Answer, NoRoute> {
        let family = Family::of(q.dst);
        if q.src.is_some_and(|s| Family::of(s) != family) {
            return Err(NoRoute::Invalid);
        }
        if let Some(iif) = q.iif {
            self.links.get(&iif).ok_or(NoRoute::NoDevice)?;
            return self.route_input(q, family);
        }
        if let Some(oif) = q.oif {
            let link = self.links.get(&oif).ok_or(NoRoute::NoDevice)?;
            if family == Family::V4 && !link.up {
                return Err(NoRoute::NetworkUnreachable);
            }
        }
        if family == Family::V4 {
            if let Some(s) = q.src {
                if s.is_multicast() || s == IpAddr::from([255, 255, 255, 255]) || s.is_unspecified()
                {
                    return Err(NoRoute::Invalid);
                }
                if !self.is_local_v4(s) {
                    return Err(NoRoute::NetworkUnreachable);
                }
            }
        }
        let walk = self.walk(q, family, q.oif, 1, 0, WalkFor::Flow);
        let (route, _, table) = match walk {
            Ok(hit) => hit,
            Err(_) if family == Family::V4 && q.oif.is_some() => {
                // The kernel sends a flow with an output link that no route covers out of
                // that link anyway, "assuming it is on link".
                let oif = q.oif.expect("checked");
                if !self.links[&oif].up {
                    return Err(NoRoute::NetworkDown);
                }
                return Ok(self.bare_answer(q, oif));
            }
            Err(e) => return Err(e),
        };
        self.answer(q, family, route, table, None)
    }

    /// The kernel's `fib_check_nh_v4_gw`: an IPv4 gateway is looked up in the route's
    /// table (unless `main`; a miss or a reject route there falls back), then through the
    /// rules, routes of a scope narrower than `min_scope` skipped. The route found must be
    /// unicast or local: its link and its scope.
    pub(crate) fn gateway_v4(
        &self,
        table: u32,
        gw: IpAddr,
        oif: Option<LinkIndex>,
        min_scope: u8,
    ) -> Option<(LinkIndex, u8)> {
        let mut q = Query::to(gw);
        q.oif = oif;
        let in_table = (table != TABLE_MAIN)
            .then(|| self.v4.tables.get(&table))
            .flatten()
            .and_then(|t| match self.table_lookup(t, &q, oif, min_scope) {
                TableResult::Hit(r, _) => Some(r),
                _ => None,
            });
        let route = match in_table {
            Some(r) => r,
            None => {
                self.walk(&q, Family::V4, oif, 1, min_scope, WalkFor::Flow)
                    .ok()?
                    .0
            }
        };
        if !matches!(route.kind, RouteType::Unicast | RouteType::Local) {
            return None;
        }
        let path = self.usable_paths(route, oif).into_iter().next()?;
        Some((path.dev, route.scope))
    }

    /// The kernel's `ip6_route_check_nh`: an IPv6 gateway is looked up in the route's own
    /// table (`main` included); if that finds no route straight onto a link (of `oif`, if
    /// given), through the rules, where a reject rule, a reject route or a route via a
    /// gateway refuses it. The link the gateway is on.
    pub(crate) fn gateway_v6(
        &self,
        table: u32,
        gw: IpAddr,
        oif: Option<LinkIndex>,
    ) -> Option<LinkIndex> {
        let mut q = Query::to(gw);
        q.oif = oif;
        let on_link = |route: &Route| -> Option<LinkIndex> {
            if route.kind.is_reject() {
                return None;
            }
            let path = self.usable_paths(route, oif).into_iter().next()?;
            (path.gateway.is_none() && oif.is_none_or(|o| o == path.dev)).then_some(path.dev)
        };
        let in_table =
            self.v6
                .tables
                .get(&table)
                .and_then(|t| match self.table_lookup(t, &q, oif, 0) {
                    TableResult::Hit(r, _) => on_link(r),
                    _ => None,
                });
        in_table.or_else(|| {
            on_link(
                self.walk(&q, Family::V6, oif, 0, 0, WalkFor::Gateway6)
                    .ok()?
                    .0,
            )
        })
    }

    /// The kernel's `ip6_route_check_nh_onlink`: an `onlink` IPv6 gateway that `main`
    /// routes (other than a default route) to another link, or by a route not unicast,
    /// is refused.
    pub(crate) fn onlink_gateway_v6_conflicts(&self, gw: IpAddr, dev: LinkIndex) -> bool {
        let q = Query::to(gw);
        let Some(t) = self.v6.tables.get(&TABLE_MAIN) else {
            return false;
        };
        match self.table_lookup(t, &q, None, 0) {
            TableResult::Hit(r, _) if r.dst.len() > 0 => {
                r.kind != RouteType::Unicast
                    || self
                        .usable_paths(r, None)
                        .first()
                        .is_some_and(|p| p.dev != dev)
            }
            _ => false,
        }
    }

    /// An IPv4 flow sent out of `oif` with no route.
    fn bare_answer(&self, q: &Query, oif: LinkIndex) -> Answer {
        let prefsrc = if q.src.is_some() {
            None
        } else {
            source::select_v4(&self.addrs, &self.links, oif, None, SCOPE_LINK)
        };
        Answer {
            kind: RouteType::Unicast,
            dst: q.dst,
            from: q.src,
            gateway: None,
            dev: oif,
            table: None,
            prefsrc,
            metric: 0,
            protocol: 0,
            pref: 0,
            tos: 0,
            mtu: None,
            iif: None,
            linkdown: false,
            onlink: false,
            mark: q.mark,
            uid: q.uid,
            cache: Vec::new(),
            choices: vec![(None, oif)],
        }
    }

    fn is_local_v4(&self, a: IpAddr) -> bool {
        self.addrs.iter().any(|x| x.local == a)
    }

    /// A flow arriving on `iif`.
    fn route_input(&self, q: &Query, family: Family) -> Result<Answer, NoRoute> {
        let iif = q.iif.expect("input");
        if !self.links[&iif].up {
            return Err(if family == Family::V4 {
                NoRoute::Invalid
            } else {
                NoRoute::NetworkUnreachable
            });
        }
        let src = q.src.unwrap_or(family.any());
        if let IpAddr::V4(d) = q.dst {
            let lo_in = self.links[&iif].kind == LinkKind::Loopback;
            if !lo_in && (d.is_loopback() || d.octets()[0] == 0) {
                return Err(NoRoute::Invalid);
            }
        }
        if family == Family::V4 {
            if src.is_unspecified()
                || src.is_multicast()
                || src == IpAddr::from([255, 255, 255, 255])
            {
                return Err(NoRoute::Invalid);
            }
            if self.links[&iif].kind != LinkKind::Loopback && self.is_local_v4(src) {
                return Err(NoRoute::Invalid);
            }
        }
        let mut qi = q.clone();
        qi.src = Some(src);
        let (route, _, table) = self.walk(&qi, family, None, iif, 0, WalkFor::Flow)?;
        let mut a = self.answer(&qi, family, route, table, Some(iif))?;
        a.from = Some(src);
        Ok(a)
    }

    /// The rule walk: the answering route, its prefix length and table.
    fn walk(
        &self,
        q: &Query,
        family: Family,
        oif: Option<LinkIndex>,
        iif: LinkIndex,
        min_scope: u8,
        purpose: WalkFor,
    ) -> Result<(&Route, u8, u32), NoRoute> {
        let fib = self.family(family);
        if fib.without_rules {
            for t in [TABLE_MAIN, TABLE_DEFAULT] {
                let Some(table) = fib.tables.get(&t) else {
                    continue;
                };
                match self.table_lookup(table, q, oif, min_scope) {
                    TableResult::Miss | TableResult::Thrown => continue,
                    TableResult::Reject(e) => return Err(e),
                    TableResult::Hit(route, len) => return Ok((route, len, t)),
                }
            }
            return Err(NoRoute::NetworkUnreachable);
        }
        let mut i = 0;
        while i < fib.rules.len() {
            let rule = &fib.rules[i];
            let at = i;
            i += 1;
            if !rule_matches(rule, q, oif, iif) {
                continue;
            }
            match rule.action {
                RuleAction::Goto(_) => {
                    if let Some(t) = fib.goto_targets[at] {
                        i = t;
                    }
                }
                RuleAction::Nop => {}
                RuleAction::Blackhole => return Err(NoRoute::Invalid),
                RuleAction::Unreachable => return Err(NoRoute::NetworkUnreachable),
                RuleAction::Prohibit => return Err(NoRoute::Prohibited),
                RuleAction::Lookup(t) => {
                    let Some(table) = fib.tables.get(&t) else {
                        continue;
                    };
                    match self.table_lookup(table, q, oif, min_scope) {
                        TableResult::Miss => continue,
                        TableResult::Thrown if purpose == WalkFor::Flow => continue,
                        TableResult::Thrown => return Err(NoRoute::HostUnreachable),
                        TableResult::Reject(e) => return Err(e),
                        TableResult::Hit(route, len) => {
                            if purpose == WalkFor::Gateway6 {
                                return Ok((route, len, t));
                            }
                            if rule.suppress_prefixlength.is_some_and(|p| len <= p) {
                                continue;
                            }
                            if let Some(g) = rule.suppress_ifgroup {
                                let dev = self.first_dev(route);
                                if dev
                                    .and_then(|d| self.links.get(&d))
                                    .is_some_and(|l| l.group == g)
                                {
                                    continue;
                                }
                            }
                            return Ok((route, len, t));
                        }
                    }
                }
            }
        }
        Err(NoRoute::NetworkUnreachable)
    }

    fn first_dev(&self, route: &Route) -> Option<LinkIndex> {
        match &route.paths {
            Paths::Own(p) => p.first().map(|p| p.dev),
            Paths::Object(id) => self.object_paths(*id).first().map(|p| p.dev),
            Paths::None => None,
        }
    }

    /// The paths a nexthop object stands for (a blackhole has none).
    fn object_paths(&self, id: NexthopId) -> Vec<Path> {
        let one = |nh: &Nexthop, weight: u16| match nh.kind {
            NexthopKind::Path {
                gateway,
                dev,
                onlink,
            } => Some(Path {
                gateway,
                dev,
                weight,
                onlink,
                dead: !self.links.get(&dev).is_some_and(|l| l.up),
                scope: if gateway.is_some() {
                    SCOPE_LINK
                } else {
                    SCOPE_HOST
                },
            }),
            _ => None,
        };
        match self.nexthops.get(&id) {
            None => Vec::new(),
            Some(nh) => match &nh.kind {
                NexthopKind::Group(members) => members
                    .iter()
                    .filter_map(|(m, w)| self.nexthops.get(m).and_then(|n| one(n, *w)))
                    .collect(),
                _ => one(nh, 1).into_iter().collect(),
            },
        }
    }

    fn is_blackhole_object(&self, id: NexthopId) -> bool {
        match self.nexthops.get(&id).map(|n| &n.kind) {
            Some(NexthopKind::Blackhole) => true,
            Some(NexthopKind::Group(m)) => {
                m.len() == 1
                    && matches!(
                        self.nexthops.get(&m[0].0).map(|n| &n.kind),
                        Some(NexthopKind::Blackhole)
                    )
            }
            _ => false,
        }
    }

    /// One table's lookup, backtracking to shorter prefixes as the kernel does.
    fn table_lookup<'a>(
        &self,
        table: &'a CompiledTable,
        q: &Query,
        oif: Option<LinkIndex>,
        min_scope: u8,
    ) -> TableResult<'a> {
        if Family::of(q.dst) == Family::V6 {
            return self.table_lookup_v6(table, q, oif);
        }
        let mut node = table.longest(q.dst);
        while let Some(n) = node {
            let n = &table.nodes[n as usize];
            let fitting = n
                .routes
                .iter()
                .filter(|r| r.tos == 0 || r.tos == q.tos & 0x1c)
                .filter(|r| r.scope >= min_scope);
            if let Some(result) = self.select(fitting, n.dst.len(), oif, true) {
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
        &self,
        table: &'a CompiledTable,
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
        let mut node = table.longest(q.dst).map(|n| n as usize);
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
        let strict = q.src.is_none_or(|s| s.is_unspecified()) || needs_strict_oif(q.dst);
        while let Some((n, g)) = at {
            let node = &table.nodes[n];
            let routes = node
                .routes
                .iter()
                .filter(|r| g.map_or(r.src.len() == 0, |g| r.src == g));
            if let Some(result) = self.select(routes, node.dst.len(), oif, strict) {
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
        &self,
        routes: impl Iterator<Item = &'a Route>,
        len: u8,
        oif: Option<LinkIndex>,
        strict: bool,
    ) -> Option<TableResult<'a>> {
        let mut fallback: Option<&'a Route> = None;
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
                RouteType::Unreachable => {
                    return Some(TableResult::Reject(NoRoute::HostUnreachable))
                }
                RouteType::Prohibit => return Some(TableResult::Reject(NoRoute::Prohibited)),
                RouteType::Throw => return Some(TableResult::Thrown),
                _ => {}
            }
            if let Paths::Object(id) = r.paths {
                if self.is_blackhole_object(id) {
                    return Some(TableResult::Reject(NoRoute::Invalid));
                }
            }
            if !self.usable_paths(r, oif).is_empty() {
                return Some(TableResult::Hit(r, len));
            }
            if !strict && fallback.is_none() && !self.usable_paths(r, None).is_empty() {
                fallback = Some(r);
            }
        }
        fallback.map(|r| TableResult::Hit(r, len))
    }

    /// A route's paths that are alive (and leave by `oif`, if given).
    fn usable_paths(&self, r: &Route, oif: Option<LinkIndex>) -> Vec<Path> {
        let paths: Vec<Path> = match &r.paths {
            Paths::Own(p) => p.clone(),
            Paths::Object(id) => self.object_paths(*id),
            Paths::None => Vec::new(),
        };
        paths
            .into_iter()
            .filter(|p| !p.dead)
            .filter(|p| oif.is_none_or(|o| o == p.dev))
            .collect()
    }

    /// The answer for a route that fits: the path chosen by the flow's hash, the source.
    fn answer(
        &self,
        q: &Query,
        family: Family,
        route: &Route,
        table: u32,
        iif: Option<LinkIndex>,
    ) -> Result<Answer, NoRoute> {
        let mut paths = self.usable_paths(route, q.oif);
        if paths.is_empty() && family == Family::V6 && q.src.is_some_and(|s| !s.is_unspecified()) {
            // IPv6 with a source only prefers the output link.
            paths = self.usable_paths(route, None);
        }
        let path = choose_path(&paths, q).ok_or(NoRoute::NetworkUnreachable)?;
        let lo = self
            .links
            .values()
            .find(|l| l.kind == LinkKind::Loopback)
            .map_or(1, |l| l.index);
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
                            &self.addrs,
                            &self.links,
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
                        source::select_v6(&self.addrs, &self.links, path.dev, q.dst)
                    }
                }),
            }
        };
        if family == Family::V4
            && iif.is_some()
            && route.kind == RouteType::Unicast
            && Some(path.dev) == iif
        {
            let gw = path.gateway.unwrap_or(q.dst);
            let src = q.src.unwrap_or(family.any());
            let onlink = self
                .addrs
                .iter()
                .any(|a| a.link == path.dev && a.subnet().contains(src) && a.subnet().contains(gw));
            if onlink {
                cache.push("redirect");
            }
        }
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
            iif,
            linkdown: !local && !self.carrier.get(&path.dev).copied().unwrap_or(false),
            onlink: path.onlink,
            mark: q.mark,
            uid: q.uid,
            cache,
            choices: paths.iter().map(|p| (sent_via(p), p.dev)).collect(),
        })
    }
}

/// Hash-threshold path choice: each path owns a share of the 31-bit hash space in
/// proportion to its weight.
fn choose_path<'a>(paths: &'a [Path], q: &Query) -> Option<&'a Path> {
    if paths.len() <= 1 {
        return paths.first();
    }
    let total: u64 = paths.iter().map(|p| p.weight as u64).sum();
    let h = flow_hash(q) as u64;
    let mut acc = 0u64;
    for p in paths {
        acc += p.weight as u64;
        let upper = ((acc << 31) + total / 2) / total;
        if h < upper {
            return Some(p);
        }
    }
    paths.last()
}

/// Whether a rule's selectors match a flow (before `not`), as `fib_rule_match` and the
/// family's match decide.
fn rule_matches(rule: &Rule, q: &Query, oif: Option<LinkIndex>, iif: LinkIndex) -> bool {
    let m = (|| {
        if let Some(l) = &rule.iif {
            if l.index != Some(iif) {
                return false;
            }
        }
        if let Some(l) = &rule.oif {
            if l.index.is_none() || l.index != oif {
                return false;
            }
        }
        if let Some((mark, mask)) = rule.fwmark {
            if (mark ^ q.mark) & mask != 0 {
                return false;
            }
        }
        if let Some(u) = rule.uidrange {
            if !u.contains(q.uid) {
                return false;
            }
        }
        if let Some(s) = rule.src {
            if !s.contains(q.src.unwrap_or(s.family().any())) {
                return false;
            }
        }
        if let Some(d) = rule.dst {
            if !d.contains(q.dst) {
                return false;
            }
        }
        if let Some(t) = rule.tos {
            if t != q.tos & 0xfc {
                return false;
            }
        }
        if let Some(p) = rule.ipproto {
            if p != q.ipproto {
                return false;
            }
        }
        if let Some(r) = rule.sport {
            if !r.contains(q.sport as u32) {
                return false;
            }
        }
        if let Some(r) = rule.dport {
            if !r.contains(q.dport as u32) {
                return false;
            }
        }
        true
    })();
    m != rule.invert
}
