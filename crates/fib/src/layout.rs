//! What a [`Snapshot`] holds: a [`State`](crate::State) compiled for lookups, laid out
//! as the lookups read it. The snapshot's methods are listed in `snapshot`; the work they
//! do is in the modules named there.
//!
//! A snapshot is compiled from a state and never changes: readers hold one and look up
//! against all of it while a writer compiles the next (or patches a copy). Each family
//! has its rules, compiled ([`Rules`]), and its tables ([`FamilyFib`]). Each table
//! ([`CompiledTable`]) is one LPM structure of `fibre-lpm` whose value for a destination
//! prefix is the index of a *node* ([`Node`]): the routes of that prefix, ordered as the
//! kernel orders them (and, for IPv6, grouped by source prefix, longest first), and the
//! node of the next shorter destination prefix present in the table. The full lookup
//! takes the longest match and, when no route of a node fits the flow, walks up the
//! parents to shorter prefixes, as the kernel backtracks.
//!
//! ```text
//! Snapshot
//! ├── v4, v6: FamilyFib
//! │   ├── rules: Rules             selectors compiled, actions
//! │   ├── tables: [CompiledTable]
//! │   │   ├── v4 or v6             LPM structure: prefix -> node
//! │   │   ├── nodes: [Node]        a prefix's routes, its parent's node
//! │   │   └── plain: AnswerTable   LPM structure: prefix -> answer, hops
//! │   ├── direct: Direct           the whole walk as one search
//! │   ├── runs: [Run]              runs of rules searched as one
//! │   └── merged: [Merged]         searches of tables walked in turn
//! └── links, addresses, nexthop objects, what the source checks read
//! ```
//!
//! Beside the nodes, each table holds every node's answer to a flow with no output link,
//! decided at compile time, in a second LPM structure ([`AnswerTable`]): the forwarding
//! lookup's one search. Where a walk visits several tables in turn and no rule's
//! selectors decide, their answers are merged into one more structure ([`Merged`]), so
//! that the walk too is one search. What this costs: two LPM structures a table (one to
//! nodes, one to answers) and its nodes, whose lists of routes are the state's own,
//! shared; and a merged structure per distinct sequence of tables a walk visits (the
//! walks through the same tables share it).

use crate::answers::{AddrFilter, AnswerTable, DestAnswer};
use crate::chunked::Chunked;
use crate::classify::Rules;
use crate::link::{Address, Link, LinkIndex};
use crate::multipath::Multipath;
use crate::net::{Family, Net};
use crate::nexthop::{Nexthop, NexthopId};
use crate::query::NoRoute;
use crate::route::{Path, RouteBody};
use fibre_lpm::{Ipv4Table, Ipv6Table};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

/// A compiled, immutable routing state: what readers look up against.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub(crate) v4: FamilyFib,
    pub(crate) v6: FamilyFib,
    pub(crate) links: BTreeMap<LinkIndex, Link>,
    pub(crate) carrier: BTreeMap<LinkIndex, bool>,
    pub(crate) addrs: Vec<Address>,
    pub(crate) nexthops: BTreeMap<NexthopId, Nexthop>,
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
    /// How many IPv6 nodes are such (`compile::prefers_input`), kept for patches.
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

/// The bytes of a snapshot's parts ([`Snapshot::memory_parts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotMemory {
    /// The lookup structures: LPM searches, their hops, the compiled rules.
    pub lookup: usize,
    /// The nodes and the routes they hold.
    pub routes: usize,
}

/// The serial of the next snapshot compiled or patched.
static NEXT_SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A serial no snapshot had.
pub(crate) fn new_serial() -> u64 {
    NEXT_SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
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
    pub(crate) ids: HashMap<u32, usize>,
    /// The whole walk as one search, for the flows no rule's selectors match.
    pub(crate) direct: Option<Direct>,
    /// The runs of rules searched as one ([`Run`]).
    pub(crate) runs: Vec<Run>,
    /// The searches of several tables merged, which `direct` and `runs` name.
    pub(crate) merged: Vec<Merged>,
    /// For each rule, the run it starts (`u32::MAX`: none).
    pub(crate) run_at: Vec<u32>,
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

    /// Each table id's position made again from `tables`.
    pub(crate) fn index_tables(&mut self) {
        self.ids = self
            .tables
            .iter()
            .enumerate()
            .map(|(i, t)| (t.id, i))
            .collect();
    }

    /// The merged searches, each with its tables' ids in order (what `compile::walk_again`
    /// takes to keep them).
    pub(crate) fn take_merged(&mut self) -> Vec<(Vec<u32>, Merged)> {
        std::mem::take(&mut self.merged)
            .into_iter()
            .map(|m| (m.seq.iter().map(|&t| self.tables[t].id).collect(), m))
            .collect()
    }
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
    match lists {
        [] => return crate::state::no_route(),
        [one] => return Arc::clone(one.borrow()),
        _ => {}
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
    pub(crate) fn memory(&self) -> usize {
        self.lookup_memory() + self.node_memory()
    }

    /// Bytes of its LPM structures and the hops their answers name.
    pub(crate) fn lookup_memory(&self) -> usize {
        let bytes = |m: fibre_lpm::MemoryUsage| m.lookup_bytes + m.update_bytes;
        self.v4.as_ref().map_or(0, |t| bytes(t.memory()))
            + self.v6.as_ref().map_or(0, |t| bytes(t.memory()))
            + self.plain.memory()
    }

    /// Bytes of its nodes and their answers, without a walk of them. The lists of routes
    /// they hold are the state's (counted there), but for a destination with routes of
    /// several source prefixes, whose list the node holds alone: those few are not counted.
    pub(crate) fn node_memory(&self) -> usize {
        self.nodes.memory() + self.answers.memory()
    }

    /// Takes `answered` as the table's answers.
    pub(crate) fn take_answers(&mut self, answered: Answered) {
        self.plain = answered.plain;
        self.plain_holds = None;
        self.answers = answered.answers;
        self.inheriting = answered.inheriting;
    }
}

/// A table's answers, made by `compile::answered`.
pub(crate) struct Answered {
    pub(crate) plain: AnswerTable,
    pub(crate) answers: Chunked<DestAnswer>,
    pub(crate) inheriting: BTreeSet<Net>,
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
/// that reaches the first matches them all and takes the first answer of their tables,
/// in order. The forwarding lookup searches them as one merged structure.
#[derive(Clone, Debug)]
pub(crate) struct Run {
    /// The position of the rule after the run.
    pub(crate) end: usize,
    /// The run's tables, merged.
    pub(crate) from: DirectFrom,
}

/// The body of [`Snapshot::memory_by_table`].
pub(crate) fn memory_by_table(snap: &Snapshot) -> Vec<(Family, u32, usize)> {
    let mut out = Vec::new();
    for f in [Family::V4, Family::V6] {
        let mut ids: Vec<_> = snap
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

/// The body of [`Snapshot::memory_parts`].
pub(crate) fn memory_parts(snap: &Snapshot) -> SnapshotMemory {
    let tables = || snap.v4.tables.iter().chain(&snap.v6.tables);
    SnapshotMemory {
        lookup: tables().map(CompiledTable::lookup_memory).sum::<usize>()
            + snap.memory_of_rules().iter().map(|(_, b)| b).sum::<usize>(),
        routes: tables().map(CompiledTable::node_memory).sum(),
    }
}

/// The body of [`Snapshot::memory_of_rules`].
pub(crate) fn memory_of_rules(snap: &Snapshot) -> Vec<(Family, usize)> {
    [Family::V4, Family::V6]
        .into_iter()
        .map(|f| {
            let fib = snap.fib(f);
            // Each merged structure once, however many walks share it.
            let mut seen = std::collections::HashSet::new();
            let merged: usize = fib
                .direct
                .iter()
                .map(|d| &d.from)
                .chain(fib.runs.iter().map(|r| &r.from))
                .filter_map(|from| match from {
                    DirectFrom::Merged(m) => seen.insert(*m).then(|| fib.merged[*m].plain.memory()),
                    DirectFrom::Table(_) => None,
                })
                .sum();
            (f, fib.rules.memory() + merged + fib.run_at.len() * 4)
        })
        .collect()
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
