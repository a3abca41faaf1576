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
    /// Nothing here (no route, or a `throw` route): the walk goes on.
    Miss,
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
        let walk = self.walk(q, family, q.oif, 1, 0);
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

    /// How the kernel resolves a new route's gateway: in the route's table (unless `main`)
    /// and then through the rules, IPv4 routes of a scope narrower than `min_scope`
    /// skipped; the route found (its link, type and scope), or the error.
    pub(crate) fn resolve_gateway(
        &self,
        table: u32,
        gw: IpAddr,
        oif: Option<LinkIndex>,
        min_scope: u8,
    ) -> Result<(LinkIndex, RouteType, u8, bool), NoRoute> {
        let family = Family::of(gw);
        let mut q = Query::to(gw);
        q.oif = oif;
        let found = |route: &Route| {
            let paths = self.usable_paths(route, oif);
            let p = paths.first().ok_or(NoRoute::NetworkUnreachable)?;
            Ok((p.dev, route.kind, route.scope, p.gateway.is_some()))
        };
        if table != TABLE_MAIN {
            if let Some(t) = self.family(family).tables.get(&table) {
                if let TableResult::Hit(r, _) = self.table_lookup(t, &q, oif, min_scope) {
                    return found(r);
                }
            }
        }
        let (r, _, _) = self.walk(&q, family, oif, 1, min_scope)?;
        found(r)
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
        let (route, _, table) = self.walk(&qi, family, None, iif, 0)?;
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
    ) -> Result<(&Route, u8, u32), NoRoute> {
        let fib = self.family(family);
        if fib.without_rules {
            for t in [TABLE_MAIN, TABLE_DEFAULT] {
                let Some(table) = fib.tables.get(&t) else {
                    continue;
                };
                match self.table_lookup(table, q, oif, min_scope) {
                    TableResult::Miss => continue,
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
                        TableResult::Reject(e) => return Err(e),
                        TableResult::Hit(route, len) => {
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
        let mut node = table.longest(q.dst);
        let src = q.src.unwrap_or(Family::of(q.dst).any());
        while let Some(n) = node {
            let n = &table.nodes[n as usize];
            for r in &n.routes {
                if r.src.len() > 0 && !r.src.contains(src) {
                    continue;
                }
                if r.tos != 0 && r.tos != q.tos & 0x1c {
                    continue;
                }
                if r.scope < min_scope && r.family() == Family::V4 {
                    continue;
                }
                if r.kind.is_reject() && r.family() == Family::V6 && oif.is_some() {
                    // IPv6 matches an output link strictly: a reject route is on `lo`.
                    continue;
                }
                match r.kind {
                    RouteType::Blackhole => return TableResult::Reject(NoRoute::Invalid),
                    RouteType::Unreachable => return TableResult::Reject(NoRoute::HostUnreachable),
                    RouteType::Prohibit => return TableResult::Reject(NoRoute::Prohibited),
                    RouteType::Throw => return TableResult::Miss,
                    _ => {}
                }
                if let Paths::Object(id) = r.paths {
                    if self.is_blackhole_object(id) {
                        return TableResult::Reject(NoRoute::Invalid);
                    }
                }
                let usable = self.usable_paths(r, oif);
                if usable.is_empty() {
                    continue;
                }
                return TableResult::Hit(r, n.dst.len());
            }
            node = n.parent;
        }
        TableResult::Miss
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
        let paths = self.usable_paths(route, q.oif);
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
            gateway: if local { None } else { path.gateway },
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
            choices: paths.iter().map(|p| (p.gateway, p.dev)).collect(),
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
