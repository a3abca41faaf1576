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

use crate::answers::{AddrFilter, AnswerTable, DestAnswer, ObjectHop, Unnumbered};
use crate::chunked::Chunked;
use crate::classify::{Action, Candidates, CompiledRule, FlowKey, Rules};
use crate::hop::{sent_via, Hop};
use crate::link::{Address, Link, LinkIndex, LinkKind};
use crate::multipath::{self, Multipath};
use crate::names::*;
use crate::net::{Family, Net};
use crate::nexthop::{Nexthop, NexthopId, NexthopKind};
use crate::query::{Answer, NoRoute, Query};
use crate::route::{Path, Paths, RouteBody, RouteType};
use crate::source;
use crate::state::State;
use fibre_lpm::{Ipv4Table, Ipv6Table};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

/// Destinations from which [`State::snapshot`] compiles the two families side by side.
const PARALLEL_FROM: usize = 100_000;

/// `make` of IPv4 and of IPv6: side by side on two threads if `parallel`, else in turn.
fn per_family<T: Send>(parallel: bool, make: impl Fn(Family) -> T + Sync) -> (T, T) {
    if !parallel {
        return (make(Family::V4), make(Family::V6));
    }
    std::thread::scope(|scope| {
        let v6 = scope.spawn(|| make(Family::V6));
        let v4 = make(Family::V4);
        (v4, v6.join().expect("a compile does not panic"))
    })
}

/// One destination prefix of a compiled table.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Node {
    /// The destination prefix.
    pub(crate) dst: Net,
    /// The routes, grouped by source prefix (longest source first), each group in the
    /// kernel's order: where one key (destination and source) has routes here, the
    /// state's list itself, shared.
    pub(crate) routes: crate::state::RouteList,
    /// The node of the next shorter destination prefix in the table, if any.
    pub(crate) parent: Option<u32>,
}

/// One compiled table.
#[derive(Clone, Debug, Default)]
pub(crate) struct CompiledTable {
    /// The table's id.
    pub(crate) id: u32,
    pub(crate) v4: Option<Ipv4Table>,
    pub(crate) v6: Option<Ipv6Table>,
    /// The nodes, by the index the LPM structure gives (slots in `free` hold none).
    pub(crate) nodes: Chunked<Node>,
    /// The forwarding lookup's structure (see [`AnswerTable`]). Filled in once the
    /// snapshot's links and nexthops are known.
    pub(crate) plain: AnswerTable,
    /// Each node's answer as `plain` holds it encoded, kept for patching `plain` and the
    /// merged searches made from it.
    pub(crate) answers: Chunked<DestAnswer>,
    /// The nodes whose answer is their parent's (no route of theirs answers a flow with
    /// no output link): a change above one changes its answer too.
    pub(crate) inheriting: BTreeSet<Net>,
    /// Slots of `nodes` that a patch emptied, to fill again.
    pub(crate) free: Vec<u32>,
    /// `plain` answers as a walk through table `plain_holds` and then this one, not as
    /// this table alone (its nodes and `answers` are its own): `main` holds `local`'s
    /// answers for as long as every walk of its family looks up `local` first
    /// ([`Rules::looks_up_first`]): IPv4's from the first rule that parts the two, IPv6's
    /// from the compile. A walk reaches `main` only where `local` had no answer, and
    /// there the two answer alike; a search merging the two, a second structure of the
    /// full table (or, for IPv4 parted, its copy), is saved.
    pub(crate) plain_holds: Option<u32>,
}

/// The routes of one destination's keys (`lists`, by source prefix in ascending order),
/// as a node holds them: the one list itself, shared, or the lists' routes, longest
/// source prefix first, each list's in its order.
pub(crate) fn by_source<L: std::borrow::Borrow<crate::state::RouteList>>(
    lists: &[L],
) -> crate::state::RouteList {
    if let [one] = lists {
        return Arc::clone(one.borrow());
    }
    let mut routes: Vec<RouteBody> = lists
        .iter()
        .flat_map(|l| l.borrow().iter().cloned())
        .collect();
    routes.sort_by_key(|r| std::cmp::Reverse(r.src.len()));
    routes.into()
}

impl CompiledTable {
    /// The table `id` of `family` compiled from its keys' lists in key order
    /// ([`joined`]).
    pub(crate) fn build<'a>(
        id: u32,
        family: Family,
        routes: impl Iterator<Item = (Net, std::borrow::Cow<'a, crate::state::RouteList>)>,
    ) -> CompiledTable {
        // Nodes by destination: source groups longest first, then the kernel's order.
        // (Made in their chunks: a vector copied into them wrote a full table's nodes
        // twice, each time to fresh pages.)
        let mut nodes: Chunked<Node> = Chunked::default();
        // Each node's parent, the longest shorter prefix present that covers it: the
        // destinations come in prefix order (by address, a shorter prefix first), so the
        // prefixes covering this one are the ones on a stack of those covering the last.
        let mut covering: Vec<u32> = Vec::new();
        let mut keys = routes.peekable();
        let mut lists = Vec::new();
        while let Some((dst, list)) = keys.next() {
            lists.clear();
            lists.push(list);
            while let Some((_, more)) = keys.next_if(|(d, _)| *d == dst) {
                lists.push(more);
            }
            while let Some(&top) = covering.last() {
                let up = nodes[top as usize].dst;
                if up.len() < dst.len() && up.covers(&dst) {
                    break;
                }
                covering.pop();
            }
            covering.push(nodes.len() as u32);
            nodes.push(Node {
                dst,
                routes: by_source(&lists),
                parent: covering.iter().rev().nth(1).copied(),
            });
        }
        nodes.fit();
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
        CompiledTable {
            id,
            v4,
            v6,
            nodes,
            plain: AnswerTable::default(),
            answers: Chunked::default(),
            inheriting: BTreeSet::new(),
            free: Vec::new(),
            plain_holds: None,
        }
    }

    /// The prefixes that have routes (not the slots of nodes a patch emptied), in the
    /// order of their nodes.
    pub(crate) fn prefixes(&self) -> impl Iterator<Item = Net> + '_ {
        self.nodes
            .iter()
            .filter(|n| !n.routes.is_empty())
            .map(|n| n.dst)
    }

    /// The node of the longest prefix holding `dst`.
    pub(crate) fn longest(&self, dst: IpAddr) -> Option<u32> {
        match dst {
            IpAddr::V4(a) => self.v4.as_ref()?.lookup(u32::from(a)),
            IpAddr::V6(a) => self.v6.as_ref()?.lookup(u128::from(a)),
        }
    }

    /// Bytes the table's structures, nodes and hops take.
    fn memory(&self) -> usize {
        self.lookup_memory() + self.node_memory()
    }

    /// Bytes of its LPM structures and the hops their answers name.
    fn lookup_memory(&self) -> usize {
        let bytes = |m: fibre_lpm::MemoryUsage| m.lookup_bytes + m.update_bytes;
        self.v4.as_ref().map_or(0, |t| bytes(t.memory()))
            + self.v6.as_ref().map_or(0, |t| bytes(t.memory()))
            + self.plain.memory()
    }

    /// Bytes of its nodes and their answers, without a walk of them. The lists of routes
    /// they hold are the state's (counted there), but for a destination with routes of
    /// several source prefixes, whose list the node holds alone: those few are not counted.
    fn node_memory(&self) -> usize {
        self.nodes.memory() + self.answers.memory()
    }
}

/// The whole rule walk of a family's flows with no output link as one plain search, for
/// the flows that no rule's selectors match, while every rule without selectors that
/// their walk reaches only looks up a table, jumps or ends the walk: the kernel's default
/// rules (IPv6's `local`, `main`, `default`, IPv4's before any rule was added), and any
/// rules with selectors beside them. The tables the walk visits merge into one structure:
/// each prefix answers with the first of those tables that has an answer for it (its own
/// longest match there), so the local routes of IPv6 stay ahead of longer prefixes in
/// `main`, as the kernel's walk keeps them.
#[derive(Clone, Debug)]
pub(crate) struct Direct {
    /// The one table the walk visits, or the tables merged.
    pub(crate) from: DirectFrom,
    /// The walk's error where no table answers.
    pub(crate) miss: NoRoute,
}

/// Where a [`Direct`] search looks.
#[derive(Clone, Debug)]
pub(crate) enum DirectFrom {
    /// The walk visits one table: its own structure.
    Table(usize),
    /// The tables the walk visits, merged: one of the family's [`Merged`] searches
    /// (shared by walks through the same tables).
    Merged(usize),
}

/// The search that answers as a walk through some of a family's tables in turn.
#[derive(Clone, Debug)]
pub(crate) struct Merged {
    /// The tables (positions in the family's), in the walk's order.
    pub(crate) seq: Vec<usize>,
    /// Each prefix of any of them, with the answer of the first table that answers.
    pub(crate) plain: AnswerTable,
}

impl Direct {
    /// The structure to search among the family's.
    #[inline]
    pub(crate) fn plain<'a>(&'a self, fib: &'a FamilyFib) -> &'a AnswerTable {
        self.from.plain(fib)
    }
}

impl DirectFrom {
    /// The structure to search among the family's.
    #[inline]
    pub(crate) fn plain<'a>(&'a self, fib: &'a FamilyFib) -> &'a AnswerTable {
        match self {
            DirectFrom::Table(t) => &fib.tables[*t].plain,
            DirectFrom::Merged(m) => &fib.merged[*m].plain,
        }
    }
}

/// The tables the walk of a flow that no rule's selectors match visits, in order, and
/// the error it ends with if none answers; `None` when a rule it reaches takes or
/// refuses answers by more than their table (a `suppress_*` option).
fn residual_walk(rules: &Rules) -> Option<(Vec<usize>, NoRoute)> {
    let list = &rules.list;
    let mut tables: Vec<usize> = Vec::new();
    let mut at = 0;
    while let Some(rule) = list.get(at) {
        if rule.is_selective() {
            // Such a flow passes it by.
            at += 1;
            continue;
        }
        if !rule.is_unconditional() {
            return None;
        }
        at += 1;
        match rule.action {
            // A goto jumps forward only (the kernel refuses others).
            Action::Goto(Some(target)) if target > at - 1 => at = target,
            Action::Goto(Some(_)) => return None,
            Action::Goto(None) | Action::Nop | Action::Lookup { table: None, .. } => {}
            Action::Lookup { table: Some(t), .. } => {
                // A table visited again answers as it did the first time: nothing.
                if !tables.contains(&t) {
                    tables.push(t)
                }
            }
            Action::Blackhole => return Some((tables, NoRoute::Invalid)),
            Action::Unreachable => return Some((tables, NoRoute::NetworkUnreachable)),
            Action::Prohibit => return Some((tables, NoRoute::Prohibited)),
        }
    }
    Some((tables, NoRoute::NetworkUnreachable))
}

/// The node of `table` with the longest prefix covering all of `net`.
fn covering(table: &CompiledTable, net: Net) -> Option<u32> {
    let mut node = table.longest(net.addr())?;
    while table.nodes[node as usize].dst.len() > net.len() {
        node = table.nodes[node as usize].parent?;
    }
    Some(node)
}

/// The answer at prefix `net` of a walk through the tables `seq` (positions in
/// `tables`) in order: the first table's that answers; [`DestAnswer::Miss`] where none does
/// (the caller knows what follows).
pub(crate) fn merged_answer(tables: &[CompiledTable], seq: &[usize], net: Net) -> Unnumbered {
    for &t in seq {
        let table = &tables[t];
        let Some(node) = covering(table, net) else {
            continue;
        };
        match table.answers[node as usize] {
            DestAnswer::Miss | DestAnswer::Thrown => continue,
            other => return table.plain.unnumbered(other),
        }
    }
    Unnumbered::Fixed(DestAnswer::Miss)
}

/// The search that answers as a walk through the tables `seq` (positions in `tables`,
/// their answers made) in order, made or found among `merged`.
fn merge_tables(
    family: Family,
    tables: &[CompiledTable],
    seq: &[usize],
    merged: &mut Vec<Merged>,
    pool: &mut Vec<(Vec<u32>, Merged)>,
) -> DirectFrom {
    // Tables with no route add nothing; one table alone is searched as it is. Where no
    // table answers, the search says [`DestAnswer::Miss`], and its caller knows what follows.
    let seq: Vec<usize> = seq
        .iter()
        .copied()
        .filter(|&t| tables[t].nodes.len() > tables[t].free.len())
        .collect();
    if let [only] = seq[..] {
        return DirectFrom::Table(only);
    }
    // A table whose structure answers as the walk through the other and then it.
    if let [first, then] = seq[..] {
        if tables[then].plain_holds == Some(tables[first].id) {
            return DirectFrom::Table(then);
        }
    }
    // The same tables in the same order (the default rules' walk, and their run) share
    // one structure.
    if let Some(m) = merged.iter().position(|m| m.seq == seq) {
        return DirectFrom::Merged(m);
    }
    // Made before, of the same tables in the same order.
    let ids: Vec<u32> = seq.iter().map(|&t| tables[t].id).collect();
    if let Some(at) = pool.iter().position(|(p, _)| *p == ids) {
        let (_, mut made) = pool.swap_remove(at);
        made.seq = seq;
        merged.push(made);
        return DirectFrom::Merged(merged.len() - 1);
    }
    let mut prefixes: Vec<Net> = seq.iter().flat_map(|&t| tables[t].prefixes()).collect();
    prefixes.sort_unstable();
    prefixes.dedup();
    let mut plain = AnswerTable::default();
    let answers: Vec<(Net, DestAnswer)> = prefixes
        .into_iter()
        .map(|net| {
            let u = merged_answer(tables, &seq, net);
            (net, plain.numbered(u, DestAnswer::Miss))
        })
        .collect();
    plain.fill(family, answers.into_iter());
    merged.push(Merged { seq, plain });
    DirectFrom::Merged(merged.len() - 1)
}

/// Consecutive rules with the same selectors that each only look up a table: a flow
/// that reaches the first matches them all and takes the first answer of their tables,
/// in order. The forwarding lookup searches them as one merged structure.
#[derive(Clone, Debug)]
pub(crate) struct Run {
    /// The position of the rule after the run.
    pub(crate) end: usize,
    /// The run's tables, merged.
    pub(crate) from: DirectFrom,
}

/// The runs of `rules` ([`Run`]), as (first rule, end, tables in order). A walk takes a
/// run only where it reaches the run's first rule (one that jumps past it goes on rule by
/// rule), so runs are cut at `goto` targets, to start where the jumps land.
fn lookup_runs(rules: &Rules) -> Vec<(usize, usize, Vec<usize>)> {
    let list = &rules.list;
    let targets: std::collections::HashSet<usize> = list
        .iter()
        .filter_map(|r| match r.action {
            Action::Goto(Some(t)) => Some(t),
            _ => None,
        })
        .collect();
    let mut runs = Vec::new();
    let mut i = 0;
    while i < list.len() {
        let first = &list[i];
        let mut end = i + 1;
        if first.plain_lookup() {
            while end < list.len()
                && list[end].plain_lookup()
                && list[end].same_selectors(first)
                && !targets.contains(&end)
            {
                end += 1;
            }
        }
        if end - i >= 2 {
            let mut seq: Vec<usize> = Vec::new();
            for r in &list[i..end] {
                if let Action::Lookup { table: Some(t), .. } = r.action {
                    if !seq.contains(&t) {
                        seq.push(t);
                    }
                }
            }
            runs.push((i, end, seq));
        }
        i = end;
    }
    runs
}

/// The rules and tables of one family.
#[derive(Clone, Debug)]
pub(crate) struct FamilyFib {
    /// The rules the walk follows. IPv4 before any rule was added has two with no
    /// selector, `main` (holding `local` too while they are merged) and `default`: the
    /// kernel skips the rules then and looks up those two tables.
    pub(crate) rules: Rules,
    /// The tables, each one LPM structure.
    pub(crate) tables: Vec<CompiledTable>,
    /// Each table id's position in `tables`.
    ids: HashMap<u32, usize>,
    /// The whole walk as one search, for the flows no rule's selectors match.
    pub(crate) direct: Option<Direct>,
    /// The runs of rules searched as one ([`Run`]).
    pub(crate) runs: Vec<Run>,
    /// The searches of several tables merged, which `direct` and `runs` name.
    pub(crate) merged: Vec<Merged>,
    /// For each rule, the run it starts (`u32::MAX`: none).
    run_at: Vec<u32>,
}

impl FamilyFib {
    /// A table by id.
    pub(crate) fn table(&self, id: u32) -> Option<&CompiledTable> {
        self.ids.get(&id).map(|&i| &self.tables[i])
    }

    /// A table's position by id.
    pub(crate) fn position(&self, id: u32) -> Option<usize> {
        self.ids.get(&id).copied()
    }

    /// Where the forwarding lookup searches for rule `rule`, which looks up table
    /// `table`: a search key (the table's position, or past the tables a run's) and the
    /// rule the walk goes on from if the search has no answer.
    #[inline]
    pub(crate) fn target(&self, rule: usize, table: usize) -> (usize, usize) {
        match self.run_at.get(rule) {
            Some(&run) if run != u32::MAX => (
                self.tables.len() + run as usize,
                self.runs[run as usize].end,
            ),
            _ => (table, rule + 1),
        }
    }

    /// The structure a search key of [`FamilyFib::target`] names.
    #[inline]
    pub(crate) fn searched(&self, key: usize) -> &AnswerTable {
        match self.tables.get(key) {
            Some(t) => &t.plain,
            None => self.runs[key - self.tables.len()].from.plain(self),
        }
    }
}

/// The bytes of a snapshot's parts ([`Snapshot::memory_parts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotMemory {
    /// The lookup structures: LPM searches, their hops, the compiled rules.
    pub lookup: usize,
    /// The nodes and the routes they hold.
    pub routes: usize,
}

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

/// A compiled, immutable routing state: what readers look up against.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub(crate) v4: FamilyFib,
    pub(crate) v6: FamilyFib,
    pub(crate) links: BTreeMap<LinkIndex, Link>,
    carrier: BTreeMap<LinkIndex, bool>,
    pub(crate) addrs: Vec<Address>,
    nexthops: BTreeMap<NexthopId, Nexthop>,
    /// The paths each nexthop object stands for (a group's members; a blackhole has none).
    pub(crate) object_paths: BTreeMap<NexthopId, Vec<Path>>,
    /// The rules the walk was compiled from, of each family (a patch compiles anew
    /// if they changed).
    pub(crate) rule_source: [Vec<crate::rule::Rule>; 2],
    /// The loopback link's index (local delivery goes through it).
    pub(crate) lo: LinkIndex,
    /// The multipath hash seed and policies.
    pub(crate) multipath: Multipath,
    /// IPv4 rules or local routes were added: the source of a flow arriving on a link is
    /// looked up (the kernel's `fib4_has_custom_rules`, `fib_has_custom_local_routes`).
    pub(crate) v4_full_source_check: bool,
    /// This host's IPv4 addresses, sorted: what a source check looks for first.
    pub(crate) v4_locals: Vec<u32>,
    /// The IPv4 addresses that have a host route of type `broadcast` in some table,
    /// sorted (a source that is one is checked in full).
    pub(crate) v4_broadcasts: Vec<u32>,
    /// Both of the above, for a quick answer that a source is neither.
    pub(crate) v4_own: AddrFilter,
    /// Some IPv6 prefix has several routes of one metric (and source prefix): which one
    /// a flow arriving on a link takes depends on the link (it prefers routes leaving
    /// by it), so such flows take the full walk.
    pub(crate) v6_input_prefers: bool,
    /// How many IPv6 nodes are such ([`prefers_input`]), kept for patches.
    pub(crate) v6_prefers: usize,
    /// IPv4's `local` and `main` were compiled as one table (no IPv4 rule yet).
    pub(crate) v4_merged: bool,
    /// IPv4's rules were compiled (else the two default lookups).
    pub(crate) v4_custom_rules: bool,
    /// AVX2, if this CPU has it: the lookup passes of flows alike use it (`quick`).
    pub(crate) cpu: Option<crate::quick::Avx2>,
    /// By link index: whether flows arriving on the link can be flows alike (it exists
    /// and is not the loopback), for the forwarding lookup's quick way.
    pub(crate) alike_inputs: Vec<bool>,
    /// This content's number ([`Snapshot::serial`]).
    pub(crate) serial: u64,
}

/// One family's half of a snapshot, compiled apart ([`State::compile_half`]) to be
/// joined with the other's ([`Half::join`]).
pub struct Half {
    family: Family,
    snapshot: Snapshot,
}

impl Half {
    /// IPv6's half of the snapshot of a state being dumped, compiled from the routes it
    /// staged (IPv4's lent by [`crate::Dumping::take_v4`]).
    pub fn of_v6(dumping: &mut crate::Dumping) -> Half {
        dumping.build_v6().compile_half(Family::V6)
    }

    /// The snapshot of IPv4's half `v4` and IPv6's half `v6`, compiled from states that
    /// held the same links, addresses, rules and nexthop objects: as the state holding
    /// both halves' routes compiled whole.
    pub fn join(v4: Half, v6: Half) -> Snapshot {
        assert!(
            v4.family == Family::V4 && v6.family == Family::V6,
            "halves of IPv4 and IPv6"
        );
        let mut snapshot = v4.snapshot;
        snapshot.v6 = v6.snapshot.v6;
        snapshot.v6_prefers = v6.snapshot.v6_prefers;
        snapshot.v6_input_prefers = v6.snapshot.v6_input_prefers;
        snapshot.serial = new_serial();
        snapshot
    }
}

/// The serial of the next snapshot compiled or patched.
static NEXT_SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A serial no snapshot had.
pub(crate) fn new_serial() -> u64 {
    NEXT_SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The IPv4 addresses among `addrs`, sorted and deduplicated.
fn sorted_v4(addrs: impl Iterator<Item = IpAddr>) -> Vec<u32> {
    let mut out: Vec<u32> = addrs
        .filter_map(|a| match a {
            IpAddr::V4(a) => Some(u32::from(a)),
            IpAddr::V6(_) => None,
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Whether IPv6 node `n` has several routes of one metric (and source prefix): which one
/// a flow arriving on a link takes depends on the link (it prefers routes leaving by it).
/// Prefixes whose every destination is matched strictly, such as each link's
/// `fe80::/64` and `ff00::/8`, take the full walk anyway.
pub(crate) fn prefers_input(n: &Node) -> bool {
    let strict = n.dst.len() > 0
        && needs_strict_oif(n.dst.addr())
        && (n.dst.len() >= 10 || (n.dst.len() >= 8 && n.dst.addr().is_multicast()));
    !strict
        && n.routes
            .windows(2)
            .any(|w| w[0].metric == w[1].metric && w[0].src == w[1].src)
}

/// The routes of `table` whose destination holds `addr`: all a lookup of `addr` can visit.
fn holding(table: &crate::state::TableRoutes, addr: IpAddr) -> crate::state::TableRoutes {
    let family = Family::of(addr);
    let mut out = crate::state::TableRoutes::new();
    for len in 0..=family.bits() {
        let dst = Net::new(addr, len).expect("a length of the family");
        for (k, v) in table
            .range((dst, Net::default_of(family))..)
            .take_while(|(k, _)| k.0 == dst)
        {
            out.insert(*k, v.clone());
        }
    }
    out
}

impl State {
    /// Compiles the state into a snapshot for lookups.
    pub fn snapshot(&self) -> Snapshot {
        self.compile(None)
    }

    /// A snapshot that answers lookups of `addr` (and only of it) as [`State::snapshot`]
    /// would: its tables hold only the routes whose destination holds `addr`, the only
    /// ones a lookup of `addr` visits. The kernel's checks of a new route's gateway look
    /// the gateway up; this keeps each check's cost to the routes around it.
    pub(crate) fn snapshot_for(&self, addr: IpAddr) -> Snapshot {
        self.compile(Some(addr))
    }

    fn compile(&self, only: Option<IpAddr>) -> Snapshot {
        let filtered: Vec<(Family, u32, std::borrow::Cow<'_, crate::state::TableRoutes>)> = self
            .tables()
            .filter(|(f, _, _)| only.is_none_or(|a| Family::of(a) == *f))
            .map(|(f, id, routes)| {
                let routes = match only {
                    Some(a) => std::borrow::Cow::Owned(holding(routes, a)),
                    None => std::borrow::Cow::Borrowed(routes),
                };
                (f, id, routes)
            })
            .collect();
        let tables: Vec<(Family, u32, &crate::state::TableRoutes)> = filtered
            .iter()
            .map(|(f, id, r)| (*f, *id, r.as_ref()))
            .collect();
        let fam = |f: Family| self.family_fib(f, &tables);
        // Many destinations are compiled on two threads (a full table's IPv6 beside its
        // IPv4); a few (a small state, or the routes holding one address that a check
        // compiles) here, where starting threads would cost more than it saves.
        let parallel = filtered.iter().map(|(_, _, r)| r.len()).sum::<usize>() >= PARALLEL_FROM;
        let (v4, v6) = per_family(parallel, fam);
        let mut snapshot = Snapshot {
            serial: new_serial(),
            v4,
            v6,
            lo: 1,
            links: BTreeMap::new(),
            carrier: BTreeMap::new(),
            addrs: Vec::new(),
            nexthops: BTreeMap::new(),
            object_paths: BTreeMap::new(),
            rule_source: [
                self.rules(Family::V4).to_vec(),
                self.rules(Family::V6).to_vec(),
            ],
            multipath: self.multipath(),
            v4_full_source_check: self.v4_custom_rules() || self.v4_custom_local_routes(),
            v4_locals: Vec::new(),
            v4_broadcasts: Vec::new(),
            v4_own: AddrFilter::default(),
            v6_input_prefers: false,
            v6_prefers: 0,
            v4_merged: !self.v4_unmerged(),
            v4_custom_rules: self.v4_custom_rules(),
            cpu: crate::quick::Avx2::detect(),
            alike_inputs: Vec::new(),
        };
        let (nexthops, object_paths) = objects(self);
        snapshot.take_links(self, nexthops, object_paths);
        snapshot.v6_prefers = snapshot
            .v6
            .tables
            .iter()
            .flat_map(|t| &t.nodes)
            .filter(|n| prefers_input(n))
            .count();
        snapshot.v6_input_prefers = snapshot.v6_prefers > 0;
        snapshot.v4_broadcasts = sorted_v4(snapshot.v4.tables.iter().flat_map(|t| {
            t.nodes
                .iter()
                .filter(|n| {
                    n.dst.is_host() && n.routes.iter().any(|r| r.kind == RouteType::Broadcast)
                })
                .map(|n| n.dst.addr())
        }));
        snapshot.refilter_own_addresses();
        let answers_of = |f: Family| -> Vec<Answered> {
            (0..snapshot.fib(f).tables.len())
                .map(|t| snapshot.answered(f, t))
                .collect()
        };
        let (v4, v6) = per_family(parallel, answers_of);
        for (f, answered) in [(Family::V4, v4), (Family::V6, v6)] {
            for (t, a) in answered.into_iter().enumerate() {
                snapshot.fib_mut(f).tables[t].take_answers(a);
            }
            // (Not in a check's snapshot of one address's routes, whose merged search
            // is small, where holding would look at all of `main`'s under `local`'s.)
            if only.is_none() {
                snapshot.hold_local(self, f);
            }
            snapshot.fib_mut(f).walk_again(f, Vec::new());
        }
        snapshot
    }

    /// Family `f`'s tables of `tables` built (their nodes, not yet answered) with its
    /// rules.
    fn family_fib(
        &self,
        f: Family,
        tables: &[(Family, u32, &crate::state::TableRoutes)],
    ) -> FamilyFib {
        let tables_of = || tables.iter().copied();
        let merged = f == Family::V4 && !self.v4_unmerged();
        let mut tables: Vec<CompiledTable> = tables_of()
            .filter(|(tf, id, _)| {
                *tf == f && !(merged && (*id == TABLE_LOCAL || *id == TABLE_MAIN))
            })
            .map(|(_, id, routes)| CompiledTable::build(id, f, joined(&[routes])))
            .collect();
        if merged {
            let both: Vec<&crate::state::TableRoutes> = [TABLE_LOCAL, TABLE_MAIN]
                .iter()
                .flat_map(|&id| {
                    tables_of()
                        .filter(move |(tf, t, _)| *tf == f && *t == id)
                        .map(|(_, _, r)| r)
                })
                .collect();
            // One structure for both, present even while they are empty.
            tables.push(CompiledTable::build(TABLE_MAIN, f, joined(&both)));
        }
        let ids: HashMap<u32, usize> = tables.iter().enumerate().map(|(i, t)| (t.id, i)).collect();
        FamilyFib {
            rules: self.compiled_rules(f, &ids),
            tables,
            ids,
            direct: None,
            runs: Vec::new(),
            merged: Vec::new(),
            run_at: Vec::new(),
        }
    }

    /// Compiles family `family`'s half of a snapshot, from a state that holds that
    /// family's routes only (and all else a snapshot is made of: links, addresses,
    /// rules, nexthop objects): a dump's IPv4 routes compiled on a thread of their own
    /// while its IPv6 routes are read, and those once read.
    pub fn compile_half(&self, family: Family) -> Half {
        debug_assert!(self.tables().all(|(f, _, _)| f == family));
        Half {
            family,
            snapshot: self.compile(None),
        }
    }
}

/// The keys of `tables` in order, each destination with the list of its key: one table's
/// as it is, or IPv4's `local` and `main` (`tables`, in that order) as the one table the
/// kernel keeps while they are merged, walked side by side rather than copied into one
/// (which took a tenth of the full tables' compile): a key of one table keeps its list;
/// of both, local's routes come first (the kernel orders a merged prefix's routes by
/// table, local's id being higher).
pub(crate) fn joined<'a>(
    tables: &[&'a crate::state::TableRoutes],
) -> impl Iterator<Item = (Net, std::borrow::Cow<'a, crate::state::RouteList>)> + 'a {
    use std::borrow::Cow;
    let mut each: Vec<_> = tables.iter().map(|t| t.iter().peekable()).collect();
    std::iter::from_fn(move || {
        let key = each
            .iter_mut()
            .filter_map(|keys| keys.peek().map(|(k, _)| **k))
            .min()?;
        let mut out: Option<Cow<'a, crate::state::RouteList>> = None;
        for keys in &mut each {
            if let Some((_, list)) = keys.next_if(|(k, _)| **k == key) {
                out = Some(match out {
                    None => Cow::Borrowed(list),
                    Some(first) => {
                        Cow::Owned(Arc::new(first.iter().chain(list.iter()).cloned().collect()))
                    }
                });
            }
        }
        out.map(|list| (key.0, list))
    })
}

impl State {
    /// The rules of family `f` compiled against the tables at positions `ids`: IPv4
    /// before any rule was added looks up `main` and `default` without rules, as the
    /// kernel does.
    pub(crate) fn compiled_rules(&self, f: Family, ids: &HashMap<u32, usize>) -> Rules {
        if f == Family::V4 && !self.v4_custom_rules() {
            let lookup = |id: u32| {
                CompiledRule::always(Action::Lookup {
                    id,
                    table: ids.get(&id).copied(),
                })
            };
            Rules::of(vec![lookup(TABLE_MAIN), lookup(TABLE_DEFAULT)])
        } else {
            Rules::compile(self.rules(f), |id| ids.get(&id).copied())
        }
    }
}

impl FamilyFib {
    /// Makes the walk's searches again from the rules and the tables (their answers
    /// made): the search of the flows no rule's selectors match, and the runs of rules
    /// searched as one. A merged search of the same tables in the same order found in
    /// `pool` (by the tables' ids) is taken as it is rather than made again.
    pub(crate) fn walk_again(&mut self, f: Family, mut pool: Vec<(Vec<u32>, Merged)>) {
        let mut merged = Vec::new();
        self.runs.clear();
        self.direct = residual_walk(&self.rules).map(|(seq, miss)| Direct {
            from: merge_tables(f, &self.tables, &seq, &mut merged, &mut pool),
            miss,
        });
        self.run_at = vec![u32::MAX; self.rules.list.len()];
        for (first, end, seq) in lookup_runs(&self.rules) {
            self.run_at[first] = self.runs.len() as u32;
            let from = merge_tables(f, &self.tables, &seq, &mut merged, &mut pool);
            self.runs.push(Run { end, from });
        }
        self.merged = merged;
    }

    /// Each table id's position made again from `tables`.
    pub(crate) fn index_tables(&mut self) {
        self.ids = self
            .tables
            .iter()
            .enumerate()
            .map(|(i, t)| (t.id, i))
            .collect();
    }

    /// The merged searches, each with its tables' ids in order (what [`Self::walk_again`]
    /// takes to keep them).
    pub(crate) fn take_merged(&mut self) -> Vec<(Vec<u32>, Merged)> {
        std::mem::take(&mut self.merged)
            .into_iter()
            .map(|m| (m.seq.iter().map(|&t| self.tables[t].id).collect(), m))
            .collect()
    }
}

impl Snapshot {
    /// Makes the answers of table `t` of family `f` (its nodes and their parents made)
    /// and the forwarding lookup's structure of them.
    pub(crate) fn answer_table(&mut self, f: Family, t: usize) {
        let answered = self.answered(f, t);
        self.fib_mut(f).tables[t].take_answers(answered);
    }

    /// What [`Snapshot::answer_table`] gives table `t` of family `f`, without changing
    /// it (so that tables are answered side by side).
    pub(crate) fn answered(&self, f: Family, t: usize) -> Answered {
        let table = &self.fib(f).tables[t];
        let mut plain = AnswerTable::default();
        let mut answers: Chunked<DestAnswer> = Chunked::default();
        let mut inheriting = BTreeSet::new();
        for node in table.nodes.iter() {
            let u = self.unnumbered_answer(table.id, node);
            if u == Unnumbered::Up {
                inheriting.insert(node.dst);
            }
            // A node's parent comes before it (a shorter prefix of the same bits sorts
            // first), so its answer is known.
            let up = node
                .parent
                .map_or(DestAnswer::Miss, |p| answers[p as usize]);
            answers.push(plain.numbered(u, up));
        }
        answers.fit();
        plain.fill(
            f,
            table
                .nodes
                .iter()
                .map(|n| n.dst)
                .zip(answers.iter().copied()),
        );
        Answered {
            plain,
            answers,
            inheriting,
        }
    }
}

/// A table's answers, made by [`Snapshot::answered`].
pub(crate) struct Answered {
    plain: AnswerTable,
    answers: Chunked<DestAnswer>,
    inheriting: BTreeSet<Net>,
}

impl CompiledTable {
    /// Takes `answered` as the table's answers.
    fn take_answers(&mut self, answered: Answered) {
        self.plain = answered.plain;
        self.plain_holds = None;
        self.answers = answered.answers;
        self.inheriting = answered.inheriting;
    }
}

/// The state's nexthop objects, and the paths each stands for.
#[allow(clippy::type_complexity)]
pub(crate) fn objects(
    state: &State,
) -> (BTreeMap<NexthopId, Nexthop>, BTreeMap<NexthopId, Vec<Path>>) {
    let links: BTreeMap<LinkIndex, &Link> = state.links().map(|l| (l.index, l)).collect();
    let nexthops: BTreeMap<NexthopId, Nexthop> =
        state.nexthops().map(|n| (n.id, n.clone())).collect();
    let object_paths = nexthops
        .keys()
        .map(|&id| (id, resolve_object(&nexthops, &links, id)))
        .collect();
    (nexthops, object_paths)
}

impl Snapshot {
    /// Takes the state's links, addresses and nexthop objects (`objects`), and what is
    /// derived of them but the answers.
    pub(crate) fn take_links(
        &mut self,
        state: &State,
        nexthops: BTreeMap<NexthopId, Nexthop>,
        object_paths: BTreeMap<NexthopId, Vec<Path>>,
    ) {
        self.links = state.links().map(|l| (l.index, l.clone())).collect();
        self.lo = self
            .links
            .values()
            .find(|l| l.kind == LinkKind::Loopback)
            .map_or(1, |l| l.index);
        self.carrier = state
            .links()
            .map(|l| (l.index, state.carrier(l.index)))
            .collect();
        self.addrs = state.addresses().to_vec();
        self.nexthops = nexthops;
        self.object_paths = object_paths;
        self.multipath = state.multipath();
        self.alike_inputs.clear();
        for l in self.links.values() {
            // Kernel link indices are small and dense; a sparse one takes the map.
            let i = l.index as usize;
            // No link has index 0, which the quick hop pass takes for none.
            if l.kind != LinkKind::Loopback && i != 0 && i < 1 << 20 {
                if self.alike_inputs.len() <= i {
                    self.alike_inputs.resize(i + 1, false);
                }
                self.alike_inputs[i] = true;
            }
        }
        self.v4_locals = sorted_v4(self.addrs.iter().map(|a| a.local));
    }

    /// Makes the filter of this host's and the broadcast addresses again.
    pub(crate) fn refilter_own_addresses(&mut self) {
        self.v4_own = AddrFilter::default();
        for &a in self.v4_locals.iter().chain(&self.v4_broadcasts) {
            self.v4_own.insert(a);
        }
    }

    /// A number that names this snapshot's content: every snapshot compiled, and every
    /// patch of one, gets a number no snapshot had before; a clone keeps its original's
    /// (their content is the same). A reader that keeps what it derived from a
    /// snapshot's answers (a packet path's adjacencies) keeps it while the serial stays.
    pub fn serial(&self) -> u64 {
        self.serial
    }

    pub(crate) fn fib(&self, f: Family) -> &FamilyFib {
        match f {
            Family::V4 => &self.v4,
            Family::V6 => &self.v6,
        }
    }

    pub(crate) fn fib_mut(&mut self, f: Family) -> &mut FamilyFib {
        match f {
            Family::V4 => &mut self.v4,
            Family::V6 => &mut self.v6,
        }
    }

    /// The answer of a node of table `table` to a flow with no output link, its hops
    /// not yet numbered.
    pub(crate) fn unnumbered_answer(&self, table: u32, node: &Node) -> Unnumbered {
        let len = node.dst.len();
        let v6 = node.dst.family() == Family::V6;
        if node.routes.iter().any(|r| r.tos != 0 || r.src.len() > 0) {
            return Unnumbered::Fixed(DestAnswer::Flow);
        }
        match self.select(node.routes.iter(), len, None, true) {
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
                    hop: Hop::of_route(route, table, p, self.lo, false),
                    object,
                };
                let paths: Vec<&Path> = self.usable(route, None).collect();
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

    /// The address a connection masqueraded out of `oif` takes, as the kernel's
    /// masquerade chooses it: IPv4's `inet_select_addr(oif, toward, universe)`, `toward`
    /// the next hop (the gateway, or the destination); IPv6's source selection for the
    /// destination `toward` out of `oif`.
    pub fn masquerade_source(&self, oif: LinkIndex, toward: IpAddr) -> Option<IpAddr> {
        match toward {
            IpAddr::V4(_) => source::select_v4(&self.addrs, &self.links, oif, Some(toward), 0),
            IpAddr::V6(_) => source::select_v6(&self.addrs, &self.links, oif, toward),
        }
    }

    /// Whether an ICMPv6 error about a packet to `addr`, arrived on `iif`, comes from
    /// `addr` (`icmp6_send`): `addr` is one of the host's addresses, or the subnet-router
    /// anycast address of one of its prefixes (an address or prefix of link or host
    /// scope counts on `iif` only).
    pub fn answers_from_v6(&self, iif: LinkIndex, addr: std::net::Ipv6Addr) -> bool {
        let scoped = addr.is_unicast_link_local() || addr.is_loopback();
        let addr = IpAddr::V6(addr);
        self.addrs.iter().any(|a| {
            let here = a.link == iif;
            let unicast = a.local == addr && (here || !matches!(a.scope, SCOPE_LINK | SCOPE_HOST));
            let anycast = a.local.is_ipv6()
                && a.len < 127
                && a.scope != SCOPE_HOST
                && a.subnet().addr() == addr
                && (here || !scoped);
            unicast || anycast
        })
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
                .fib(f)
                .tables
                .iter()
                .map(|t| (t.id, t.memory()))
                .collect();
            ids.sort();
            out.extend(ids.into_iter().map(|(id, m)| (f, id, m)));
        }
        out
    }

    /// Bytes the snapshot's tables take, in two parts: the lookup structures (each
    /// table's LPM searches and their hops) and the routes (the nodes holding the routes
    /// of each destination, for the full walk).
    pub fn memory_parts(&self) -> SnapshotMemory {
        let tables = || self.v4.tables.iter().chain(&self.v6.tables);
        SnapshotMemory {
            lookup: tables().map(CompiledTable::lookup_memory).sum::<usize>()
                + self.memory_of_rules().iter().map(|(_, b)| b).sum::<usize>(),
            routes: tables().map(CompiledTable::node_memory).sum(),
        }
    }

    /// Bytes the compiled rules of each family take: the rules, their index (when there
    /// are enough rules to have one), and the merged searches of tables they compile to.
    pub fn memory_of_rules(&self) -> Vec<(Family, usize)> {
        [Family::V4, Family::V6]
            .into_iter()
            .map(|f| {
                let fib = self.fib(f);
                // Each merged structure once, however many walks share it.
                let mut seen = std::collections::HashSet::new();
                let merged: usize = fib
                    .direct
                    .iter()
                    .map(|d| &d.from)
                    .chain(fib.runs.iter().map(|r| &r.from))
                    .filter_map(|from| match from {
                        DirectFrom::Merged(m) => {
                            seen.insert(*m).then(|| fib.merged[*m].plain.memory())
                        }
                        DirectFrom::Table(_) => None,
                    })
                    .sum();
                (f, fib.rules.memory() + merged + fib.run_at.len() * 4)
            })
            .collect()
    }

    /// Routes a query as the kernel's `ip route get` would.
    pub fn route(&self, q: &Query) -> Result<Answer, NoRoute> {
        if let Some(answer) = self.special_v4(q) {
            return answer;
        }
        let p = self.prepare(q)?;
        let walk = self.walk(&p.q, p.family, p.oif, p.iif, 0, WalkFor::Flow);
        match self.conclude(&p, walk)? {
            Concluded::Route(route, table) => self.answer(&p.q, p.family, route, table, p.input),
            Concluded::Bare(oif) => Ok(self.bare_answer(q, oif)),
        }
    }

    /// The checks a query passes before the rule walk (`ip_route_output_key`'s and
    /// `ip_route_input`'s), and the walk's parameters.
    pub(crate) fn prepare(&self, q: &Query) -> Result<Prepared, NoRoute> {
        Ok(self.check(q)?.with(q))
    }

    /// [`Snapshot::prepare`] without the copy of the query.
    #[inline]
    pub(crate) fn check(&self, q: &Query) -> Result<Checked, NoRoute> {
        self.check_seen(q, &mut None)
    }

    /// [`Snapshot::check`] of one of many flows: `seen` is the input link of the flow
    /// checked before (flows of a batch mostly arrive on one link), found again at no cost.
    #[inline]
    pub(crate) fn check_seen<'a>(
        &'a self,
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
                    let link = self.links.get(&iif).ok_or(NoRoute::NoDevice)?;
                    *seen = Some(link);
                    link
                }
            };
            return self.check_input(q, family, link);
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
                if !q.any_source && !self.is_local_v4(s) {
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

    /// What the rule walk's outcome means for the query: the route and table, or, for an
    /// IPv4 flow with an output link that no route covers, that link, "assuming it is on
    /// link" as the kernel does.
    pub(crate) fn conclude<'a>(
        &self,
        p: &Prepared,
        walk: Result<(&'a RouteBody, u8, u32), NoRoute>,
    ) -> Result<Concluded<'a>, NoRoute> {
        match walk {
            Ok((route, _, table)) => Ok(Concluded::Route(route, table)),
            Err(_) if p.family == Family::V4 && p.oif.is_some() && p.input.is_none() => {
                let oif = p.oif.expect("checked");
                if !self.links[&oif].up {
                    return Err(NoRoute::NetworkDown);
                }
                Ok(Concluded::Bare(oif))
            }
            Err(e) => Err(e),
        }
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
            .then(|| self.v4.table(table))
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
        let path = self.usable(route, oif).next()?;
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
        let on_link = |route: &RouteBody| -> Option<LinkIndex> {
            if route.kind.is_reject() {
                return None;
            }
            let path = self.usable(route, oif).next()?;
            (path.gateway.is_none() && oif.is_none_or(|o| o == path.dev)).then_some(path.dev)
        };
        let in_table = self
            .v6
            .table(table)
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
        let Some(t) = self.v6.table(TABLE_MAIN) else {
            return false;
        };
        match self.table_lookup(t, &q, None, 0) {
            TableResult::Hit(r, len) if len > 0 => {
                r.kind != RouteType::Unicast
                    || self.usable(r, None).next().is_some_and(|p| p.dev != dev)
            }
            _ => false,
        }
    }

    /// An IPv4 flow sent out of `oif` with no route.
    pub(crate) fn bare_answer(&self, q: &Query, oif: LinkIndex) -> Answer {
        let prefsrc = source::select_v4(&self.addrs, &self.links, oif, None, SCOPE_LINK);
        self.answer_without_route(q, RouteType::Unicast, oif, prefsrc)
    }

    /// An answer of type `kind` through `dev` with no route behind it: no table, gateway
    /// or metrics; `prefsrc` given only when the query gives no source.
    pub(crate) fn answer_without_route(
        &self,
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
    fn is_local_v4(&self, a: IpAddr) -> bool {
        matches!(a, IpAddr::V4(a) if self.v4_locals.binary_search(&u32::from(a)).is_ok())
    }

    /// The checks of a flow arriving on `iif`.
    fn check_input(&self, q: &Query, family: Family, link: &Link) -> Result<Checked, NoRoute> {
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

    /// Whether an IPv4 flow arriving on a link needs more than the plain answers to check
    /// its source (`src`, as the query gives it): the source is one of this host's
    /// addresses or a broadcast address, or rules or local routes were added (the kernel
    /// then looks the source up).
    #[inline]
    pub(crate) fn input_needs_source_check(&self, c: &Checked, src: Option<IpAddr>) -> bool {
        match (c.input, src) {
            (Some(input), Some(IpAddr::V4(s))) if input != self.lo => {
                self.v4_full_source_check
                    || (self.v4_own.may_hold(u32::from(s))
                        && (self.is_local_v4(IpAddr::V4(s)) || self.is_broadcast_v4(IpAddr::V4(s))))
            }
            _ => false,
        }
    }

    /// Whether a flow's plain answers hold for it: not for an IPv6 flow arriving on a
    /// link where that link could change which route answers (some prefix has several
    /// routes of one metric), or whose destination makes the kernel match the link
    /// strictly (link-local, multicast, loopback).
    #[inline]
    pub(crate) fn plain_answers_hold(&self, c: &Checked, dst: IpAddr) -> bool {
        !(c.family == Family::V6
            && c.input.is_some()
            && (self.v6_input_prefers || needs_strict_oif(dst)))
    }

    /// Whether some table has a host route of type `broadcast` to `a`.
    #[inline]
    fn is_broadcast_v4(&self, a: IpAddr) -> bool {
        matches!(a, IpAddr::V4(a) if self.v4_broadcasts.binary_search(&u32::from(a)).is_ok())
    }

    /// The kernel's source check of an IPv4 flow arriving on a link (`fib_validate_source`
    /// with `rp_filter` off), for what the lookup answered: a local, broadcast or
    /// forwarded unicast route (`dev`: the chosen path's link). While no rule or local
    /// route was added and the flow leaves by another link, the source must only not be
    /// this host's; otherwise the source is looked up as a destination (from the output
    /// link, or the loopback), and anything but a unicast route there is refused.
    pub(crate) fn validate_source(
        &self,
        q: &Query,
        input: Option<LinkIndex>,
        route: &RouteBody,
        dev: LinkIndex,
    ) -> Result<(), NoRoute> {
        self.validate_source_of(q, input, route.kind, dev)
    }

    /// [`Snapshot::validate_source`] of a flow whose answer is of type `kind` through `dev`.
    pub(crate) fn validate_source_of(
        &self,
        q: &Query,
        input: Option<LinkIndex>,
        kind: RouteType,
        dev: LinkIndex,
    ) -> Result<(), NoRoute> {
        let src = q.src.filter(|_| input.is_some());
        self.check_source(q, input, src, kind, dev, |back, iif| {
            let walk = self.walk(back, Family::V4, None, iif, 0, WalkFor::Flow);
            Some(walk.ok().map(|(r, _, _)| r.kind))
        })
        .expect("the walk decides")
    }

    /// [`Snapshot::validate_source`] of an arriving flow with source `src` whose route is
    /// of type `kind` through `dev`; `back(flow, iif)` is the type of the route that
    /// answers the flow back to the source arriving on `iif` (`Some(None)`: none), or
    /// `None` if it cannot tell, and then neither can this.
    #[inline]
    pub(crate) fn check_source(
        &self,
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
        if Family::of(src) != Family::V4 || input == self.lo {
            return Some(Ok(()));
        }
        let forwarded = kind == RouteType::Unicast;
        if !(forwarded || matches!(kind, RouteType::Local | RouteType::Broadcast)) {
            return Some(Ok(()));
        }
        let same_link = forwarded && dev == input;
        if !self.v4_full_source_check && !same_link {
            return Some(if self.is_local_v4(src) {
                Err(NoRoute::Invalid)
            } else {
                Ok(())
            });
        }
        let flow = reverse(q, src, kind == RouteType::Broadcast);
        let iif = if forwarded { dev } else { self.lo };
        Some(match back(&flow, iif)? {
            Some(k) if k != RouteType::Unicast => Err(NoRoute::Invalid),
            _ => Ok(()),
        })
    }

    /// Whether a flow forwarded back out of its input link comes from a neighbour on that
    /// link, so the kernel would send it a redirect (`cache redirect`): the source's route,
    /// as the source check looks it up, leaves by that link with no gateway.
    fn redirects(
        &self,
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
            |oif: Option<LinkIndex>| match self.walk(&back, Family::V4, oif, dev, 0, WalkFor::Flow)
            {
                Ok((r, _, _)) if r.kind == RouteType::Unicast => {
                    let paths = self.paths_of(r);
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

    /// The rule walk: the answering route, its prefix length and table.
    pub(crate) fn walk(
        &self,
        q: &Query,
        family: Family,
        oif: Option<LinkIndex>,
        iif: LinkIndex,
        min_scope: u8,
        purpose: WalkFor,
    ) -> Result<(&RouteBody, u8, u32), NoRoute> {
        let fib = self.fib(family);
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
            let (rule, table) = match self.next_lookup(fib, &candidates, from) {
                Step::Lookup { rule, table } => (rule, table),
                Step::Done(e) => return Err(e),
            };
            let t = &fib.tables[table];
            let result = self.table_lookup(t, q, tables_oif, min_scope);
            match self.after_lookup(&fib.rules.list[rule], t.id, result, purpose) {
                Some(done) => return done,
                None => from = rule + 1,
            }
        }
    }

    /// From rule `from` on, the next rule whose selectors match and that looks up a
    /// table, or the walk's end: a rejecting rule's error, or no rule left.
    #[inline]
    pub(crate) fn next_lookup(
        &self,
        fib: &FamilyFib,
        candidates: &Candidates<'_>,
        mut from: usize,
    ) -> Step {
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
        &self,
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
                    let dev = self.paths_of(route).first().map(|p| p.dev);
                    if dev
                        .and_then(|d| self.links.get(&d))
                        .is_some_and(|l| l.group == g)
                    {
                        return None;
                    }
                }
                Some(Ok((route, len, table)))
            }
        }
    }

    /// A route's paths: its own, or its nexthop object's.
    #[inline]
    pub(crate) fn paths_of<'a>(&'a self, route: &'a RouteBody) -> &'a [Path] {
        match &route.paths {
            Paths::Own(p) => p,
            Paths::Object(id) => self.object_paths.get(id).map_or(&[], Vec::as_slice),
            Paths::None => &[],
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

    /// The `local` route of `table` holding `addr`, if the table's lookup answers one.
    pub(crate) fn local_route<'a>(
        &self,
        table: &'a CompiledTable,
        addr: IpAddr,
    ) -> Option<&'a RouteBody> {
        match self.table_lookup(table, &Query::to(addr), None, 0) {
            TableResult::Hit(route, _) if route.kind == RouteType::Local => Some(route),
            _ => None,
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
        self.table_lookup_from(table, table.longest(q.dst), q, oif, min_scope)
    }

    /// One table's lookup once its LPM structure has given `longest`, the node of the
    /// longest prefix holding the destination.
    #[inline]
    pub(crate) fn table_lookup_from<'a>(
        &self,
        table: &'a CompiledTable,
        longest: Option<u32>,
        q: &Query,
        oif: Option<LinkIndex>,
        min_scope: u8,
    ) -> TableResult<'a> {
        if Family::of(q.dst) == Family::V6 {
            return self.table_lookup_v6(table, longest, q, oif);
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
            if self.usable(r, oif).next().is_some() {
                return Some(TableResult::Hit(r, len));
            }
            if !strict && fallback.is_none() && self.usable(r, None).next().is_some() {
                fallback = Some(r);
            }
        }
        fallback.map(|r| TableResult::Hit(r, len))
    }

    /// A route's paths that are alive (and leave by `oif`, if given).
    #[inline]
    pub(crate) fn usable<'a>(
        &'a self,
        r: &'a RouteBody,
        oif: Option<LinkIndex>,
    ) -> impl Iterator<Item = &'a Path> + Clone + 'a {
        self.paths_of(r)
            .iter()
            .filter(move |p| !p.dead && oif.is_none_or(|o| o == p.dev))
    }

    /// The path of `route` a flow takes. Leaving by a given output link: the first live
    /// path by it, as the kernel's lookup matches the link (no hashing). Otherwise the
    /// multipath hash chooses among the live paths (see [`multipath`]).
    #[inline]
    pub(crate) fn choose_path<'a>(
        &'a self,
        route: &'a RouteBody,
        oif: Option<LinkIndex>,
        q: &Query,
        input: bool,
    ) -> Option<&'a Path> {
        let mut usable = self.usable(route, oif);
        if oif.is_some() {
            return usable.next();
        }
        match q.src {
            Some(IpAddr::V4(src))
                if !input && !src.is_unspecified() && matches!(route.paths, Paths::Own(_)) =>
            {
                self.choose_by_source(route, IpAddr::V4(src), q)
            }
            _ => {
                let hashed = multipath::choose(usable, |p| p.weight, || self.multipath.hash(q))?;
                match q.iif {
                    // An IPv6 flow arriving on a link to a destination bound to it takes
                    // the hashed path only if it leaves by that link; else the path the
                    // lookup chose, the first that does (`fib6_select_path`).
                    Some(iif) if input && hashed.dev != iif && needs_strict_oif(q.dst) => {
                        self.usable(route, Some(iif)).next().or(Some(hashed))
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
        &'a self,
        route: &'a RouteBody,
        src: IpAddr,
        q: &Query,
    ) -> Option<&'a Path> {
        let usable = self.usable(route, None);
        let total: u64 = usable.clone().map(|p| p.weight as u64).sum();
        let h = self.multipath.hash(q) as i64;
        let mut acc = 0u64;
        let mut best: Option<(&Path, u8)> = None;
        for p in usable {
            acc += p.weight as u64;
            let own = source::select_v4(&self.addrs, &self.links, p.dev, p.gateway, route.scope)
                == Some(src);
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

    /// The output link a flow's paths must leave by: its `oif`, except that IPv6 with a
    /// source only prefers it, taking any path when none leaves by it.
    #[inline]
    pub(crate) fn path_oif(
        &self,
        q: &Query,
        family: Family,
        route: &RouteBody,
    ) -> Option<LinkIndex> {
        if q.oif.is_some()
            && family == Family::V6
            && q.src.is_some_and(|s| !s.is_unspecified())
            && self.usable(route, q.oif).next().is_none()
        {
            None
        } else {
            q.oif
        }
    }

    /// The answer for a route that fits: the path chosen by the flow's hash, the source.
    pub(crate) fn answer(
        &self,
        q: &Query,
        family: Family,
        route: &RouteBody,
        table: u32,
        iif: Option<LinkIndex>,
    ) -> Result<Answer, NoRoute> {
        let oif = self.path_oif(q, family, route);
        let path = self
            .choose_path(route, oif, q, iif.is_some())
            .ok_or(NoRoute::NetworkUnreachable)?;
        self.validate_source(q, iif, route, path.dev)?;
        let redirect = self.redirects(q, iif, route, path.dev);
        let lo = self.lo;
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
            linkdown: !local && !self.carrier.get(&path.dev).copied().unwrap_or(false),
            onlink: path.onlink,
            mark: q.mark,
            uid: q.uid,
            cache,
        })
    }
}

/// The paths a nexthop object stands for (a group's members; a blackhole has none).
fn resolve_object(
    nexthops: &BTreeMap<NexthopId, Nexthop>,
    links: &BTreeMap<LinkIndex, &Link>,
    id: NexthopId,
) -> Vec<Path> {
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
            dead: !links.get(&dev).is_some_and(|l| l.up),
            scope: if gateway.is_some() {
                SCOPE_LINK
            } else {
                SCOPE_HOST
            },
        }),
        _ => None,
    };
    match nexthops.get(&id) {
        None => Vec::new(),
        Some(nh) => match &nh.kind {
            NexthopKind::Group(members) => members
                .iter()
                .filter_map(|(m, w)| nexthops.get(m).and_then(|n| one(n, *w)))
                .collect(),
            _ => one(nh, 1).into_iter().collect(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node is held once for each destination of a table (the two snapshots share
    /// them): its prefix, a thin pointer to its routes and its parent's slot. A field
    /// added, or the routes' pointer made a slice's again, shows here.
    #[test]
    fn a_node_stays_small() {
        assert_eq!(std::mem::size_of::<Node>(), 40);
    }
}
