//! Compiling a [`State`] into a [`Snapshot`]: every table's LPM structure and nodes,
//! every node's answer to a flow with no output link, the rules compiled, and the
//! searches that merge the tables a rule walk visits in turn (see `layout` for what they
//! are).
//!
//! The two families are compiled side by side on two threads once a state holds many
//! destinations ([`PARALLEL_FROM`]: a full table's IPv6 beside its IPv4), and a table's
//! answers are decided node by node in prefix order, a parent before its children, so
//! that a node whose routes answer nothing takes its parent's answer at no further cost.
//! A dump's IPv4 half can be compiled while its IPv6 routes are still being read
//! ([`Half`]). A change to a compiled snapshot is patched in place (`patch`), not
//! compiled anew.

use crate::answers::{AddrFilter, AnswerTable, DestAnswer, Unnumbered};
use crate::chunked::Chunked;
use crate::classify::{Action, CompiledRule, Rules};
use crate::layout::{
    new_serial, Answered, CompiledTable, Direct, DirectFrom, FamilyFib, Merged, Node, Run, Snapshot,
};
use crate::link::{Link, LinkIndex, LinkKind};
use crate::names::*;
use crate::net::{Family, Net};
use crate::nexthop::{Nexthop, NexthopId, NexthopKind};
use crate::query::NoRoute;
use crate::route::{Path, RouteType};
use crate::state::State;
use crate::walk::needs_strict_oif;
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
        take_links(&mut snapshot, self, nexthops, object_paths);
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
        refilter_own_addresses(&mut snapshot);
        let answers_of = |f: Family| -> Vec<Answered> {
            (0..snapshot.fib(f).tables.len())
                .map(|t| answered(&snapshot, f, t))
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
            walk_again(snapshot.fib_mut(f), f, Vec::new());
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

/// Makes the walk's searches again from the rules and the tables (their answers
/// made): the search of the flows no rule's selectors match, and the runs of rules
/// searched as one. A merged search of the same tables in the same order found in
/// `pool` (by the tables' ids) is taken as it is rather than made again.
pub(crate) fn walk_again(fib: &mut FamilyFib, f: Family, mut pool: Vec<(Vec<u32>, Merged)>) {
    let mut merged = Vec::new();
    fib.runs.clear();
    fib.direct = residual_walk(&fib.rules).map(|(seq, miss)| Direct {
        from: merge_tables(f, &fib.tables, &seq, &mut merged, &mut pool),
        miss,
    });
    fib.run_at = vec![u32::MAX; fib.rules.list.len()];
    for (first, end, seq) in lookup_runs(&fib.rules) {
        fib.run_at[first] = fib.runs.len() as u32;
        let from = merge_tables(f, &fib.tables, &seq, &mut merged, &mut pool);
        fib.runs.push(Run { end, from });
    }
    fib.merged = merged;
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

/// The body of [`Snapshot::answer_table`].
pub(crate) fn answer_table(snap: &mut Snapshot, f: Family, t: usize) {
    let answered = answered(snap, f, t);
    snap.fib_mut(f).tables[t].take_answers(answered);
}

/// What [`Snapshot::answer_table`] gives table `t` of family `f`, without changing
/// it (so that tables are answered side by side).
fn answered(snap: &Snapshot, f: Family, t: usize) -> Answered {
    let table = &snap.fib(f).tables[t];
    let mut plain = AnswerTable::default();
    let mut answers: Chunked<DestAnswer> = Chunked::default();
    let mut inheriting = BTreeSet::new();
    for node in table.nodes.iter() {
        let u = snap.unnumbered_answer(table.id, node);
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

/// The body of [`Snapshot::take_links`].
pub(crate) fn take_links(
    snap: &mut Snapshot,
    state: &State,
    nexthops: BTreeMap<NexthopId, Nexthop>,
    object_paths: BTreeMap<NexthopId, Vec<Path>>,
) {
    snap.links = state.links().map(|l| (l.index, l.clone())).collect();
    snap.lo = snap
        .links
        .values()
        .find(|l| l.kind == LinkKind::Loopback)
        .map_or(1, |l| l.index);
    snap.carrier = state
        .links()
        .map(|l| (l.index, state.carrier(l.index)))
        .collect();
    snap.addrs = state.addresses().to_vec();
    snap.nexthops = nexthops;
    snap.object_paths = object_paths;
    snap.multipath = state.multipath();
    snap.alike_inputs.clear();
    for l in snap.links.values() {
        // Kernel link indices are small and dense; a sparse one takes the map.
        let i = l.index as usize;
        // No link has index 0, which the quick hop pass takes for none.
        if l.kind != LinkKind::Loopback && i != 0 && i < 1 << 20 {
            if snap.alike_inputs.len() <= i {
                snap.alike_inputs.resize(i + 1, false);
            }
            snap.alike_inputs[i] = true;
        }
    }
    snap.v4_locals = sorted_v4(snap.addrs.iter().map(|a| a.local));
}

/// The body of [`Snapshot::refilter_own_addresses`].
pub(crate) fn refilter_own_addresses(snap: &mut Snapshot) {
    snap.v4_own = AddrFilter::default();
    for &a in snap.v4_locals.iter().chain(&snap.v4_broadcasts) {
        snap.v4_own.insert(a);
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
