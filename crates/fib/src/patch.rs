//! Patching a compiled snapshot in place after routes changed, rather than compiling the
//! whole state again.
//!
//! A batch of route changes touches a few destination prefixes of a few tables, while a
//! compile of the full Internet tables takes seconds. A patch makes each touched prefix's
//! node again from the state's routes (added, given its new routes, or emptied), updates
//! the LPM structures in place, and computes again the answers that depend on it: its
//! own, those of the nodes below it that take their parent's, and the merged searches'
//! at and under it. The state notes which destinations' routes changed, however they
//! changed (a command, a report, or what a link going down took with it). Links,
//! addresses, the multipath settings and nexthop objects are taken as they are now; a
//! nexthop object that stood for one live path and stands for another has the hops of its
//! routes rewritten in place, one that gains or loses live paths has the destinations of
//! the routes using it patched (the state indexes them by object). Rules added or
//! deleted, and tables appearing or going, make the walk again: the tables compiled are
//! kept, a new one is compiled on its own, and the merged searches of the same tables are
//! kept. IPv4's first rule parts `local` from `main` (the kernel's `fib_unmerge` walks its
//! whole table for it) at `local`'s prefixes only. What a patch does not follow is
//! compiled anew: the loopback link changing, a table's search worn out by changes.
//!
//! A patched snapshot answers every lookup as one compiled from the same state; the tests
//! hold the two to that over random batches of changes.

use crate::answers::{AnswerTable, DestAnswer};
use crate::compile::{joined, merged_answer, objects, prefers_input, walk_again};
use crate::layout::{by_source, new_serial, CompiledTable, FamilyFib, Merged, Node, Snapshot};
use crate::names::{TABLE_LOCAL, TABLE_MAIN};
use crate::net::{Family, Net};
use crate::nexthop::NexthopId;
use crate::route::{Path, RouteType};
use crate::state::{RouteList, State, TableRoutes};
use std::collections::BTreeSet;

/// What a batch of changes touched: the destination prefixes whose routes changed, by
/// family and table (noted by the state itself under [`crate::Fib::update`]), whether
/// anything besides routes changed, or everything.
#[derive(Clone, Debug, Default)]
pub struct Touched {
    /// As noted: a destination may be named more than once (see [`Touched::add`]).
    routes: Vec<(Family, u32, Net)>,
    others: bool,
    everything: bool,
}

/// Past this many touched prefixes a compile is as quick as a patch.
const MAX_PATCHED: usize = 200_000;

impl Touched {
    /// Nothing touched yet.
    pub fn nothing() -> Touched {
        Touched::default()
    }

    /// Everything touched: the state is compiled anew.
    pub fn everything() -> Touched {
        Touched {
            routes: Vec::new(),
            others: true,
            everything: true,
        }
    }

    /// The routes of destination `dst` in table `table` changed.
    pub fn route(&mut self, table: u32, dst: Net) {
        if !self.everything {
            self.routes.push((dst.family(), table, dst));
        }
    }

    /// Something besides routes changed: links, addresses, rules, nexthop objects,
    /// multipath settings (a patch takes them as they are, or compiles anew).
    pub fn others(&mut self) {
        self.others = true;
    }

    /// The state was replaced: compile it anew.
    pub fn all(&mut self) {
        self.everything = true;
        self.routes.clear();
    }

    /// What `other` touched, added.
    pub fn add(&mut self, other: &Touched) {
        if other.everything {
            self.all();
        } else if !self.everything {
            self.routes.extend(other.routes.iter().copied());
            self.others |= other.others;
            // Named once each before their count decides whether to patch.
            if self.routes.len() > MAX_PATCHED {
                self.routes.sort_unstable();
                self.routes.dedup();
            }
        }
    }

    /// Whether more than routes changed.
    pub fn is_everything(&self) -> bool {
        self.everything
    }

    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        !self.everything && !self.others && self.routes.is_empty()
    }
}

/// The state's tables a compiled table is made of, in order (IPv4's `local` and `main`
/// are one while they are merged).
fn sources(state: &State, family: Family, id: u32, v4_merged: bool) -> Vec<&TableRoutes> {
    if family == Family::V4 && v4_merged && id == TABLE_MAIN {
        [TABLE_LOCAL, TABLE_MAIN]
            .iter()
            .filter_map(|&t| state.table_routes(family, t))
            .collect()
    } else {
        state.table_routes(family, id).into_iter().collect()
    }
}

/// The ids of the tables a snapshot of `state` compiles for `family`, sorted: the state's
/// (IPv4's `local` and `main` as `main`, always there, while they are merged).
fn compiled_ids(state: &State, family: Family, v4_merged: bool) -> Vec<u32> {
    let merged = family == Family::V4 && v4_merged;
    let mut ids: Vec<u32> = state
        .tables()
        .filter(|(f, _, _)| *f == family)
        .map(|(_, id, _)| id)
        .filter(|&id| !(merged && id == TABLE_LOCAL))
        .chain(merged.then_some(TABLE_MAIN))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// The routes of destination `dst` among `sources`, as a compiled node holds them: by
/// source prefix, longest first, each source prefix's routes in the kernel's order, the
/// tables' in turn.
pub(crate) fn routes_at(sources: &[&TableRoutes], dst: Net) -> RouteList {
    let mut by_src: Vec<(Net, &RouteList)> = Vec::new();
    for table in sources {
        for ((_, src), list) in table
            .range((dst, Net::default_of(dst.family()))..)
            .take_while(|((d, _), _)| *d == dst)
        {
            by_src.push((*src, list));
        }
    }
    // Stable: the tables' order kept within a source prefix.
    by_src.sort_by_key(|(src, _)| *src);
    let lists: Vec<&RouteList> = by_src.into_iter().map(|(_, l)| l).collect();
    by_source(&lists)
}

/// Where a search merging the tables `seq` (positions in `tables`) changes when table
/// `t`, one of them, changed at prefixes `changed` (sorted): those prefixes, and the
/// other tables' prefixes inside them, sorted.
fn merged_prefixes(
    state: &State,
    family: Family,
    tables: &[CompiledTable],
    seq: &[usize],
    t: usize,
    changed: &[Net],
    v4_merged: bool,
) -> Vec<Net> {
    let others: Vec<Vec<&TableRoutes>> = seq
        .iter()
        .filter(|&&o| o != t)
        .map(|&o| sources(state, family, tables[o].id, v4_merged))
        .collect();
    let mut at: Vec<Net> = changed.to_vec();
    for &p in changed {
        for have in &others {
            for table in have {
                let family = p.family();
                at.extend(
                    table
                        .range(
                            (
                                Net::bound(family, p.bits(), p.len() + 1),
                                Net::default_of(family),
                            )..,
                        )
                        .map(|((d, _), _)| *d)
                        .take_while(|d| d.bits() <= p.last_bits())
                        .filter(|d| p.covers(d)),
                );
            }
        }
    }
    // `changed` in order, then what is inside each prefix: a stable sort takes the runs
    // as they are.
    at.sort();
    at.dedup();
    at
}

/// The answers of a walk through the tables `seq` (positions in `tables`) at prefixes
/// `at`: `None` where none of them has the prefix (a merged search holds no entry there).
fn answers_at(
    tables: &[CompiledTable],
    seq: &[usize],
    at: Vec<Net>,
) -> Vec<(Net, Option<crate::answers::Unnumbered>)> {
    at.into_iter()
        .map(|net| {
            let present = seq.iter().any(|&s| tables[s].node_at(net).is_some());
            (net, present.then(|| merged_answer(tables, seq, net)))
        })
        .collect()
}

/// Writes `answers` (of distinct prefixes) into search `plain`, the prefixes without one
/// taken out in one batch.
fn set_answers(plain: &mut AnswerTable, answers: Vec<(Net, Option<crate::answers::Unnumbered>)>) {
    let mut gone = Vec::new();
    for (net, answer) in answers {
        match answer {
            Some(u) => {
                let answer = plain.numbered(u, DestAnswer::Miss);
                plain.set(net, Some(answer));
            }
            None => gone.push(net),
        }
    }
    plain.unset_all(&gone);
}

/// Whether every walk of family `family` looks up `local` first
/// ([`crate::classify::Rules::looks_up_first`]).
fn local_first(state: &State, family: Family) -> bool {
    let rules = state.rules(family);
    crate::classify::Rules::compile(&rules[..rules.len().min(1)], |_| None)
        .looks_up_first(TABLE_LOCAL)
}

/// The destinations of IPv4's `local` table, in order.
fn local_destinations(state: &State) -> Vec<Net> {
    let mut dsts: Vec<Net> = state
        .table_routes(Family::V4, TABLE_LOCAL)
        .into_iter()
        .flat_map(|t| t.keys().map(|(dst, _)| *dst))
        .collect();
    dsts.dedup();
    dsts
}

/// The destinations of `sources` strictly inside `dst` with none between them and it.
fn children(sources: &[&TableRoutes], dst: Net) -> Vec<Net> {
    let family = dst.family();
    let mut out = Vec::new();
    if dst.len() == family.bits() {
        return out;
    }
    let mut from = Net::bound(family, dst.bits(), dst.len() + 1);
    loop {
        let next = sources
            .iter()
            .filter_map(|t| {
                t.range((from, Net::default_of(family))..)
                    .find(|(_, list)| !list.is_empty())
                    .map(|((d, _), _)| *d)
            })
            .min();
        let Some(child) = next.filter(|c| dst.covers(c)) else {
            return out;
        };
        out.push(child);
        // Past the child's own subtree.
        if child.last_bits() >= dst.last_bits() {
            return out;
        }
        from = Net::bound(family, child.last_bits() + 1, 0);
    }
}

/// The elements of `set` strictly inside `dst`, in order.
fn inside(set: &BTreeSet<Net>, dst: Net) -> Vec<Net> {
    let family = dst.family();
    set.range(
        Net::bound(family, dst.bits(), dst.len() + 1)
            ..=Net::bound(family, dst.last_bits(), u8::MAX),
    )
    .filter(|n| dst.covers(n))
    .copied()
    .collect()
}

impl CompiledTable {
    /// The node of exactly `dst`.
    fn node_at(&self, dst: Net) -> Option<u32> {
        match (&self.v4, &self.v6) {
            (Some(t), _) => t.get(&dst.v4()?),
            (_, Some(t)) => t.get(&dst.v6()?),
            _ => None,
        }
    }

    /// The node of the longest prefix present strictly shorter than `dst` and holding it.
    fn node_above(&self, dst: Net) -> Option<u32> {
        (0..dst.len())
            .rev()
            .find_map(|len| self.node_at(Net::new(dst.addr(), len).expect("shorter")))
    }

    /// Takes prefixes `dsts` out of the map of nodes, in one batch.
    fn unmap_all(&mut self, dsts: &[Net]) {
        crate::answers::remove_all(&mut self.v4, &mut self.v6, dsts);
    }

    /// Maps prefix `dst` to node `node`.
    fn map(&mut self, dst: Net, node: u32) {
        match (dst.v4(), dst.v6()) {
            (Some(p), _) => {
                self.v4.get_or_insert_with(Default::default).insert(p, node);
            }
            (_, Some(p)) => {
                self.v6.get_or_insert_with(Default::default).insert(p, node);
            }
            _ => {}
        }
    }
}

/// The body of [`Snapshot::share_with`].
pub(crate) fn share_with(snap: &mut Snapshot, other: &Snapshot) {
    for (mine, theirs) in [(&mut snap.v4, &other.v4), (&mut snap.v6, &other.v6)] {
        for table in &mut mine.tables {
            if let Some(same) = theirs.tables.iter().find(|t| t.id == table.id) {
                table.nodes.share_equal(&same.nodes);
                table.answers.share_equal(&same.answers);
            }
        }
    }
}

/// The body of [`Snapshot::patch`].
pub(crate) fn patch(snap: &mut Snapshot, state: &State, touched: &Touched) -> bool {
    // Whatever follows changes the content (or the snapshot is compiled anew).
    snap.serial = new_serial();
    // IPv4's `local` and `main` merge again only with a new state.
    if touched.everything
        || touched.routes.len() > MAX_PATCHED
        || !snap.v4_merged && !state.v4_unmerged()
    {
        return false;
    }
    let worn = |f: &FamilyFib| {
        f.tables.iter().any(|t| t.plain.numbers_run_short())
            || f.merged.iter().any(|m| m.plain.numbers_run_short())
    };
    if worn(&snap.v4) || worn(&snap.v6) {
        return false;
    }
    // The destinations of the routes whose nexthop object now stands for other paths.
    let mut routes: Vec<(Family, u32, Net)> = Vec::new();
    if touched.others {
        let Some((followed, objects_changed)) = adopt_links_and_objects(snap, state) else {
            return false;
        };
        for (id, path) in followed {
            follow_object(snap, id, &path);
        }
        for id in objects_changed {
            routes.extend(state.object_users(id));
            if routes.len() > MAX_PATCHED {
                return false;
            }
        }
    }
    // IPv4's first rule parts `local` from `main`.
    let parted = snap.v4_merged && state.v4_unmerged();
    // `local`'s destinations, and those whose local routes went since this snapshot
    // was made (the merged table still holds them).
    let mut local_dsts = Vec::new();
    let mut seeds = Vec::new();
    if parted {
        local_dsts = local_destinations(state);
        local_dsts.extend(
            touched
                .routes
                .iter()
                .filter(|(f, t, _)| *f == Family::V4 && *t == TABLE_LOCAL)
                .map(|(_, _, dst)| *dst),
        );
        local_dsts.sort_unstable();
        local_dsts.dedup();
        seeds = part_v4(snap, state, &local_dsts);
    }
    // Rules changed, or a table appeared or went: the walk is made again.
    let custom = snap.v4_custom_rules != state.v4_custom_rules();
    snap.v4_custom_rules = state.v4_custom_rules();
    for family in [Family::V4, Family::V6] {
        if state.rules(family) != &snap.rule_source[family as usize][..]
            || table_ids(snap, family) != compiled_ids(state, family, snap.v4_merged)
            || family == Family::V4 && custom
        {
            let seeds = if family == Family::V4 {
                std::mem::take(&mut seeds)
            } else {
                Vec::new()
            };
            rewalk(snap, state, family, seeds);
        }
    }
    // The searches that were made as if `local` and `main` were one answer as the
    // walk through them in turn but at `local`'s prefixes and under them.
    if parted {
        if let Some(local) = snap.v4.position(TABLE_LOCAL) {
            patch_merged(snap, state, Family::V4, local, &local_dsts);
        }
    }
    // The touched prefixes of each compiled table.
    let mut work: Vec<(Family, usize, Vec<Net>)> = Vec::new();
    for &(family, id, dst) in touched.routes.iter().chain(&routes) {
        let merged = family == Family::V4 && snap.v4_merged && id == TABLE_LOCAL;
        let id = if merged { TABLE_MAIN } else { id };
        // A table gone took its nodes with it.
        let Some(t) = snap.fib(family).position(id) else {
            continue;
        };
        match work.iter_mut().find(|(f, p, _)| *f == family && *p == t) {
            Some((_, _, dsts)) => dsts.push(dst),
            None => work.push((family, t, vec![dst])),
        }
    }
    // In the order of the tables' ids, each family's in turn.
    work.sort_by_key(|(family, t, _)| (*family, snap.fib(*family).tables[*t].id));
    let mut v4_hosts: Vec<Net> = Vec::new();
    for (family, t, mut dsts) in work {
        // The journals of the batches behind the patch, each in order: a stable sort
        // merges them in linear time, where an unstable one sorts anew (an eighth of
        // the publication of a link's 1,000 routes going down).
        dsts.sort();
        dsts.dedup();
        let id = snap.fib(family).tables[t].id;
        let have = sources(state, family, id, snap.v4_merged);
        // Out while it changes, for the answers' checks to read the snapshot.
        let mut table = std::mem::take(&mut snap.fib_mut(family).tables[t]);
        let changed = patch_table(snap, &mut table, &have, &dsts);
        snap.fib_mut(family).tables[t] = table;
        patch_merged(snap, state, family, t, &changed);
        v4_hosts.extend(dsts.iter().filter(|d| family == Family::V4 && d.is_host()));
    }
    snap.v6_input_prefers = snap.v6_prefers > 0;
    snap.v4_full_source_check = state.v4_custom_rules() || state.v4_custom_local_routes();
    if !v4_hosts.is_empty() {
        patch_broadcasts(snap, state, &v4_hosts);
    }
    if touched.others || !v4_hosts.is_empty() {
        snap.refilter_own_addresses();
    }
    true
}

/// Takes the state's links, addresses, nexthop objects and multipath settings as they
/// are, and returns the nexthop objects that now stand for other paths: those whose
/// routes' hops follow them in place (one live path before and after, given), and
/// the others (the answers of the routes using them are made again). `None` if the
/// loopback link changed, which every local answer depends on: the state is then
/// compiled anew.
#[allow(clippy::type_complexity)]
fn adopt_links_and_objects(
    snap: &mut Snapshot,
    state: &State,
) -> Option<(Vec<(NexthopId, Path)>, Vec<NexthopId>)> {
    let (nexthops, object_paths) = objects(state);
    let only_live = |paths: &[Path]| -> Option<Path> {
        let mut live = paths.iter().filter(|p| !p.dead);
        let one = live.next()?;
        live.next().is_none().then(|| one.clone())
    };
    let mut followed = Vec::new();
    let mut changed = Vec::new();
    for (&id, paths) in &object_paths {
        let before = snap.object_paths.get(&id);
        if before == Some(paths) {
            continue;
        }
        match (before.and_then(|b| only_live(b)), only_live(paths)) {
            (Some(_), Some(now)) => followed.push((id, now)),
            _ => changed.push(id),
        }
    }
    // One gone took the routes that used it with it (noted), unless a route still
    // names it (then it has no paths).
    changed.extend(
        snap.object_paths
            .keys()
            .filter(|id| !object_paths.contains_key(id)),
    );
    let lo = snap.lo;
    snap.take_links(state, nexthops, object_paths);
    (snap.lo == lo).then_some((followed, changed))
}

/// Nexthop object `id` stood for one live path and stands for `path` now: the hops
/// of the routes through it, in every search, are made again through `path`, in
/// place. No answer changes but by its hop (see
/// [`crate::answers::AnswerTable::follow_object`]).
fn follow_object(snap: &mut Snapshot, id: NexthopId, path: &Path) {
    let lo = snap.lo;
    for fib in [&mut snap.v4, &mut snap.v6] {
        let plains = fib
            .tables
            .iter_mut()
            .map(|t| &mut t.plain)
            .chain(fib.merged.iter_mut().map(|m| &mut m.plain));
        for plain in plains {
            plain.follow_object(id, path, |hop, path| hop.through(path, lo, false));
        }
    }
}

/// Parts IPv4's `local` from `main` (the first IPv4 rule), in time proportional to
/// `local`'s routes, where the kernel's `fib_unmerge` walks the whole table: the
/// merged table becomes `main` by making the nodes of `local_dsts` again from `main`'s
/// routes alone: `local`'s prefixes, and those whose local routes went since this
/// snapshot was made, which the merged table still holds (`local` itself is compiled
/// on its own by the walk made again).
/// While every walk looks up `local` first (the kernel's rule at priority 0), `main`'s
/// structure keeps answering as the merged table did, to be patched as a search
/// merging `local` and `main` ([`CompiledTable::plain_holds`]): it serves both the
/// walks through `local` then `main` and `main` after `local` had no answer, and
/// nothing is copied. Otherwise the searches a walk through `local` then `main` (and
/// the tables after) will need answer as the merged table did but at `local`'s
/// prefixes and under them: they are returned as seeds for the walk, each under its
/// tables' ids, from a copy of the merged table's search and the merged searches
/// holding it, to be patched there.
fn part_v4(snap: &mut Snapshot, state: &State, local_dsts: &[Net]) -> Vec<(Vec<u32>, Merged)> {
    let mut seeds: Vec<(Vec<u32>, Merged)> = snap
        .v4
        .take_merged()
        .into_iter()
        .map(|(ids, m)| {
            let ids = ids
                .iter()
                .flat_map(|&id| match id {
                    TABLE_MAIN => vec![TABLE_LOCAL, TABLE_MAIN],
                    other => vec![other],
                })
                .collect();
            (ids, m)
        })
        .collect();
    snap.v4_merged = false;
    let Some(t) = snap.v4.position(TABLE_MAIN) else {
        return seeds;
    };
    if local_first(state, Family::V4) {
        snap.v4.tables[t].plain_holds = Some(TABLE_LOCAL);
    } else {
        seeds.push((
            vec![TABLE_LOCAL, TABLE_MAIN],
            Merged {
                seq: Vec::new(),
                plain: snap.v4.tables[t].plain.clone(),
            },
        ));
    }
    let have = sources(state, Family::V4, TABLE_MAIN, false);
    let mut table = std::mem::take(&mut snap.v4.tables[t]);
    patch_table(snap, &mut table, &have, local_dsts);
    snap.v4.tables[t] = table;
    seeds
}

/// The body of [`Snapshot::hold_local`].
pub(crate) fn hold_local(snap: &mut Snapshot, state: &State, family: Family) {
    if family == Family::V4 && snap.v4_merged || !local_first(state, family) {
        return;
    }
    let fib = snap.fib_mut(family);
    let (Some(local), Some(main)) = (fib.position(TABLE_LOCAL), fib.position(TABLE_MAIN)) else {
        return;
    };
    let prefixes: Vec<Net> = fib.tables[local].prefixes().collect();
    let seq = [local, main];
    let at = merged_prefixes(state, family, &fib.tables, &seq, local, &prefixes, false);
    let answers = answers_at(&fib.tables, &seq, at);
    let table = &mut fib.tables[main];
    set_answers(&mut table.plain, answers);
    table.plain_holds = Some(TABLE_LOCAL);
}

/// The tables of family `family` whose structure holds another's answers
/// ([`CompiledTable::plain_holds`]) where that no longer holds: the other is no longer
/// compiled, or a walk may reach them without looking it up first (`local`'s rule
/// deleted or moved, as VRF setups do). Each gives a copy of its structure as the
/// search merging the two (a seed for the walk), if the other is still compiled, and
/// has its own made again where the two differ: at the other's prefixes and under
/// them, in time proportional to those (and a copy).
fn release_held(
    snap: &mut Snapshot,
    state: &State,
    family: Family,
    ids: &[u32],
) -> Vec<(Vec<u32>, Merged)> {
    let first = local_first(state, family);
    let fib = snap.fib_mut(family);
    let mut seeds = Vec::new();
    for t in 0..fib.tables.len() {
        let Some(held) = fib.tables[t].plain_holds else {
            continue;
        };
        if first && ids.contains(&held) {
            continue;
        }
        let id = fib.tables[t].id;
        if ids.contains(&held) {
            seeds.push((
                vec![held, id],
                Merged {
                    seq: Vec::new(),
                    plain: fib.tables[t].plain.clone(),
                },
            ));
        }
        // Where the structure holds what the other's nodes answered when it was last
        // patched (this batch's changes to them follow).
        let Some(other) = fib.position(held) else {
            fib.tables[t].plain_holds = None;
            continue;
        };
        let prefixes: Vec<Net> = fib.tables[other].prefixes().collect();
        let at = merged_prefixes(
            state,
            family,
            &fib.tables,
            &[other, t],
            other,
            &prefixes,
            false,
        );
        let table = &mut fib.tables[t];
        table.plain_holds = None;
        for net in at {
            let answer = table.node_at(net).map(|i| table.answers[i as usize]);
            table.plain.set(net, answer);
        }
    }
    seeds
}

/// The ids of family `family`'s compiled tables, in order.
fn table_ids(snap: &Snapshot, family: Family) -> Vec<u32> {
    let mut ids: Vec<u32> = snap.fib(family).tables.iter().map(|t| t.id).collect();
    ids.sort_unstable();
    ids
}

/// Makes family `family`'s rules and walk again from the state (rules were added or
/// deleted, a table appeared or went): the compiled tables the state still has are
/// kept, a table that appeared is compiled (in time proportional to its routes), one
/// gone is dropped, and the merged searches of the same tables in the same order are
/// kept (or taken from `seeds`, by their tables' ids); only a search of tables not
/// merged before is made.
fn rewalk(snap: &mut Snapshot, state: &State, family: Family, mut seeds: Vec<(Vec<u32>, Merged)>) {
    let want = compiled_ids(state, family, snap.v4_merged);
    seeds.extend(release_held(snap, state, family, &want));
    let v4_merged = snap.v4_merged;
    let fib = snap.fib_mut(family);
    let mut pool = fib.take_merged();
    pool.extend(seeds);
    let (kept, gone): (Vec<CompiledTable>, Vec<CompiledTable>) = std::mem::take(&mut fib.tables)
        .into_iter()
        .partition(|t| want.contains(&t.id));
    fib.tables = kept;
    let mut new = Vec::new();
    for id in want {
        if !fib.tables.iter().any(|t| t.id == id) {
            let have = sources(state, family, id, v4_merged);
            let table = CompiledTable::build(id, family, joined(&have));
            fib.tables.push(table);
            new.push(fib.tables.len() - 1);
        }
    }
    fib.index_tables();
    for &t in &new {
        snap.answer_table(family, t);
    }
    // What the snapshot derives from every node: the IPv6 nodes that prefer the
    // input link, the IPv4 broadcast addresses.
    let fib = snap.fib(family);
    let counted = |t: &CompiledTable| t.nodes.iter().filter(|n| prefers_input(n)).count();
    let hosts = |t: &CompiledTable| -> Vec<Net> {
        t.nodes
            .iter()
            .map(|n| n.dst)
            .filter(|d| d.is_host())
            .collect()
    };
    let mut v4_hosts: Vec<Net> = Vec::new();
    if family == Family::V6 {
        let added: usize = new.iter().map(|&t| counted(&fib.tables[t])).sum();
        snap.v6_prefers = snap.v6_prefers + added - gone.iter().map(counted).sum::<usize>();
    } else {
        v4_hosts.extend(gone.iter().flat_map(hosts));
        v4_hosts.extend(new.iter().flat_map(|&t| hosts(&fib.tables[t])));
    }
    drop(gone);
    let fib = snap.fib_mut(family);
    let ids: std::collections::HashMap<u32, usize> = fib
        .tables
        .iter()
        .enumerate()
        .map(|(i, t)| (t.id, i))
        .collect();
    fib.rules = state.compiled_rules(family, &ids);
    walk_again(fib, family, pool);
    snap.rule_source[family as usize] = state.rules(family).to_vec();
    if !v4_hosts.is_empty() {
        patch_broadcasts(snap, state, &v4_hosts);
    }
}

/// Patches `table` (taken out of the snapshot) at prefixes `dsts` (sorted, each
/// once: a prefix's node is looked up before any removal is made) from its state's
/// tables `have`; returns the prefixes whose answers may have changed.
fn patch_table(
    snap: &mut Snapshot,
    table: &mut CompiledTable,
    have: &[&TableRoutes],
    dsts: &[Net],
) -> Vec<Net> {
    debug_assert!(dsts.windows(2).all(|w| w[0] < w[1]), "sorted, each once");
    // Each touched prefix's node made again, added or emptied; `here`, its node
    // after (looked up once: each lookup of a prefix is a walk of the trie).
    let mut here: Vec<Option<u32>> = Vec::with_capacity(dsts.len());
    // The prefixes that lose their node, taken out of the searches in one batch.
    let mut gone: Vec<Net> = Vec::new();
    for &dst in dsts {
        let routes = routes_at(have, dst);
        let at = table.node_at(dst);
        if let Some(i) = at {
            let old = &table.nodes[i as usize];
            snap.v6_prefers -= (dst.family() == Family::V6 && prefers_input(old)) as usize;
        }
        let node = Node {
            dst,
            routes,
            parent: None,
        };
        snap.v6_prefers += (dst.family() == Family::V6 && prefers_input(&node)) as usize;
        match (at, node.routes.is_empty()) {
            (Some(i), true) => {
                here.push(None);
                gone.push(dst);
                table.inheriting.remove(&dst);
                table.nodes[i as usize] = node;
                table.answers[i as usize] = DestAnswer::Miss;
                table.free.push(i);
            }
            (Some(i), false) => {
                here.push(Some(i));
                table.nodes[i as usize].routes = node.routes;
            }
            (None, false) => {
                let i = match table.free.pop() {
                    Some(i) => {
                        table.nodes[i as usize] = node;
                        i
                    }
                    None => {
                        table.nodes.push(node);
                        table.answers.push(DestAnswer::Miss);
                        table.nodes.len() as u32 - 1
                    }
                };
                here.push(Some(i));
                table.map(dst, i);
            }
            (None, true) => here.push(None),
        }
    }
    table.unmap_all(&gone);
    if table.plain_holds.is_none() {
        table.plain.unset_all(&gone);
    }
    // Parents: of each touched node, and of the nodes right below each touched
    // prefix. Ancestors come first, so a deeper prefix's say is the last.
    for (&dst, &here) in dsts.iter().zip(&here) {
        let below = children(have, dst);
        // A prefix gone with nothing under it has no parent to find (a link's routes
        // going down: the longest prefix above is a lookup for each length).
        if here.is_none() && below.is_empty() {
            continue;
        }
        let above = table.node_above(dst);
        if let Some(i) = here {
            table.nodes[i as usize].parent = above;
        }
        for child in below {
            if let Some(c) = table.node_at(child) {
                table.nodes[c as usize].parent = here.or(above);
            }
        }
    }
    // Answers: of each touched node, then of the nodes below that take their
    // parent's (parents first, in the prefixes' order).
    let mut changed: Vec<Net> = Vec::with_capacity(dsts.len());
    for (&dst, &here) in dsts.iter().zip(&here) {
        changed.push(dst);
        if let Some(i) = here {
            answer_again(snap, table, i);
        }
        for below in inside(&table.inheriting, dst) {
            if let Some(i) = table.node_at(below) {
                answer_again(snap, table, i);
                changed.push(below);
            }
        }
    }
    // In order but for what is inside each prefix: runs a stable sort merges.
    changed.sort();
    changed.dedup();
    changed
}

/// Computes node `i`'s answer again (its parent's is up to date).
fn answer_again(snap: &Snapshot, table: &mut CompiledTable, i: u32) {
    let node = &table.nodes[i as usize];
    let u = snap.unnumbered_answer(table.id, node);
    let dst = node.dst;
    if u == crate::answers::Unnumbered::Up {
        table.inheriting.insert(dst);
    } else {
        table.inheriting.remove(&dst);
    }
    let up = node
        .parent
        .map_or(DestAnswer::Miss, |p| table.answers[p as usize]);
    let answer = table.plain.numbered(u, up);
    table.answers[i as usize] = answer;
    // A structure holding another table's answers is patched as a merged search.
    if table.plain_holds.is_none() {
        table.plain.set(dst, Some(answer));
    }
}

/// Patches the merged searches holding table `t` of `family` at prefixes `changed`
/// (sorted) of it, and at the other tables' prefixes inside them; and a table's own
/// structure where it answers as a walk through `t` then it, or through another
/// table then `t` ([`CompiledTable::plain_holds`]).
fn patch_merged(snap: &mut Snapshot, state: &State, family: Family, t: usize, changed: &[Net]) {
    let v4_merged = snap.v4_merged;
    let fib = snap.fib_mut(family);
    let holding = (0..fib.tables.len()).find_map(|h| {
        let first = fib.tables[h].plain_holds?;
        let first = fib.position(first)?;
        (t == h || t == first).then_some((h, [first, h]))
    });
    for m in 0..fib.merged.len() {
        if !fib.merged[m].seq.contains(&t) {
            continue;
        }
        let seq = fib.merged[m].seq.clone();
        let at = merged_prefixes(state, family, &fib.tables, &seq, t, changed, v4_merged);
        let answers = answers_at(&fib.tables, &seq, at);
        set_answers(&mut fib.merged[m].plain, answers);
    }
    if let Some((h, seq)) = holding {
        let at = merged_prefixes(state, family, &fib.tables, &seq, t, changed, v4_merged);
        // Computed from the tables, then written into one of them.
        let answers = answers_at(&fib.tables, &seq, at);
        set_answers(&mut fib.tables[h].plain, answers);
    }
}

/// The IPv4 host prefixes `hosts` changed: which are broadcast addresses again.
fn patch_broadcasts(snap: &mut Snapshot, state: &State, hosts: &[Net]) {
    for &h in hosts {
        let a = match h.addr() {
            std::net::IpAddr::V4(a) => u32::from(a),
            std::net::IpAddr::V6(_) => continue,
        };
        // A destination with no route delivering to the host in any table (a link's
        // host routes going) is no broadcast address, and the tables are not searched.
        let broadcast = state.receives_at(h)
            && snap.v4.tables.iter().any(|t| {
                t.node_at(h).is_some_and(|i| {
                    t.nodes[i as usize]
                        .routes
                        .iter()
                        .any(|r| r.kind == RouteType::Broadcast)
                })
            });
        match (snap.v4_broadcasts.binary_search(&a), broadcast) {
            (Err(at), true) => snap.v4_broadcasts.insert(at, a),
            (Ok(at), false) => {
                snap.v4_broadcasts.remove(at);
            }
            _ => {}
        }
    }
    snap.v4_own = Default::default();
    for &a in snap.v4_locals.iter().chain(&snap.v4_broadcasts) {
        snap.v4_own.insert(a);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answers::DestAnswer;
    use crate::chunked::Chunked;
    use crate::config;
    use crate::publish::Fib;
    use crate::query::Query;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::net::IpAddr;
    use std::sync::Arc;

    const LINKS: &str = "\
link add a0 type veth peer name a1
link add b0 type veth peer name b1
link set a0 up
link set a1 up
link set b0 up
link set b1 up
addr add 10.0.0.1/24 dev a0
addr add 10.1.0.1/24 dev b0
addr add fd00::1/64 dev a0
addr add fd01::1/64 dev b0
nexthop add id 1 via 10.0.0.2 dev a0
nexthop add id 2 via fd00::2 dev a0
nexthop add id 4 via 10.1.0.2 dev b0
nexthop add id 3 group 1/4
route add 10.50.0.0/16 via 10.0.0.2 table 100
route add 2001:db8:50::/48 via fd00::2 table 100
";

    /// Rules that send some flows to table 100 and leave the rest to the defaults.
    const RULES: &str = "\
rule add from 10.1.0.0/24 lookup 100 pref 100
rule add to 10.9.0.0/16 lookup 100 pref 200
rule add from fd01::/64 lookup 100 pref 100
";

    /// `n` routes to /24s from 10.100.0.0 on through 10.0.0.2 (on `a0`), as `ip` lines.
    fn routes_via_a0(n: usize) -> String {
        (0..n)
            .map(|i| {
                format!(
                    "route add 10.{}.{}.0/24 via 10.0.0.2\n",
                    100 + i / 256,
                    i % 256
                )
            })
            .collect()
    }

    /// A random prefix from a small space, so that prefixes nest and repeat.
    fn prefix(rng: &mut StdRng, v6: bool) -> String {
        if v6 {
            let len = [0, 16, 32, 40, 48, 56, 64, 96, 128][rng.gen_range(0..9)];
            let (a, b, c) = (
                rng.gen_range(0..3u16),
                rng.gen_range(0..4u16),
                rng.gen_range(0..3u16),
            );
            let addr = format!("2001:db8:{a:x}{b:x}::{c:x}");
            let net = Net::new(addr.parse().unwrap(), len).unwrap();
            format!("{}/{}", net.addr(), len)
        } else {
            let len = [0, 8, 12, 16, 20, 24, 28, 32][rng.gen_range(0..8)];
            let addr = IpAddr::from([
                10,
                rng.gen_range(8..11),
                rng.gen_range(0..3) * 16,
                rng.gen_range(0..3),
            ]);
            let net = Net::new(addr, len).unwrap();
            format!("{}/{}", net.addr(), len)
        }
    }

    /// A random route change line for `dst`, and the table it names.
    fn change(rng: &mut StdRng, v6: bool, dst: &str) -> (String, u32) {
        // Table 200 has no rule and few routes: it appears and goes.
        let table =
            [TABLE_MAIN, TABLE_MAIN, TABLE_MAIN, 100, TABLE_LOCAL, 200][rng.gen_range(0..6)];
        let (gw, gw2, dev) = if v6 {
            ("fd00::2", "fd01::2", "a0")
        } else {
            ("10.0.0.2", "10.1.0.2", "b0")
        };
        let metric = [0, 100, 200][rng.gen_range(0..3)];
        let how = match rng.gen_range(0..12) {
            0 => "blackhole".to_string(),
            1 => "unreachable".to_string(),
            2 => "prohibit".to_string(),
            3 => "throw".to_string(),
            4 => format!("dev {dev}"),
            5 => format!("nexthop via {gw} nexthop via {gw2} weight 3"),
            6 if !v6 => "broadcast dev b0".to_string(),
            6 => "nhid 2".to_string(),
            11 if !v6 => ["nhid 1", "nhid 3"][rng.gen_range(0..2)].to_string(),
            7 if table == TABLE_LOCAL => format!("local dev {dev}"),
            n if n % 2 == 0 => format!("via {gw}"),
            _ => format!("via {gw2}"),
        };
        let (kind, rest) = match how.split_once(' ') {
            Some((
                k @ ("blackhole" | "unreachable" | "prohibit" | "throw" | "broadcast" | "local"),
                r,
            )) => (k, r.to_string()),
            _ => match how.as_str() {
                k @ ("blackhole" | "unreachable" | "prohibit" | "throw") => (k, String::new()),
                _ => ("", how.clone()),
            },
        };
        let op = ["add", "add", "replace", "del", "append"][rng.gen_range(0..5)];
        let line = if op == "del" {
            format!("route del {dst} table {table}")
        } else {
            format!("route {op} {kind} {dst} {rest} metric {metric} table {table}")
        };
        (line, table)
    }

    /// The destinations looked up: each route's first and last address and random ones.
    fn destinations(rng: &mut StdRng, state: &State) -> Vec<IpAddr> {
        let mut out: Vec<IpAddr> = Vec::new();
        for f in [Family::V4, Family::V6] {
            for r in state.routes(f, None) {
                out.push(r.dst.addr());
                out.push(r.dst.last());
            }
        }
        for _ in 0..200 {
            let v6 = rng.gen_bool(0.5);
            let p: Net = Net::parse(&prefix(rng, v6), None).unwrap();
            let bits =
                crate::net::addr_bits(p.addr()) | rng.gen::<u128>() & (p.last_bits() - p.bits());
            out.push(crate::net::addr_from_bits(p.family(), bits));
        }
        out
    }

    /// `patched` answers every query as `fresh` does: the full walk, single lookups and
    /// batches, for flows this host sends and flows arriving on a link.
    fn same_answers(patched: &Snapshot, fresh: &Snapshot, dsts: &[IpAddr], what: &str) {
        let a1 = fresh.links().find(|l| l.name == "a1").unwrap().index;
        let mut flows = Vec::new();
        for &dst in dsts {
            flows.push(Query::to(dst));
            let src: IpAddr = if dst.is_ipv4() {
                [10, 0, 0, 9].into()
            } else {
                "fd01::9".parse().unwrap()
            };
            flows.push(Query {
                iif: Some(a1),
                src: Some(src),
                ..Query::to(dst)
            });
            // From an address routes name: a broadcast or local one is refused.
            flows.push(Query {
                iif: Some(a1),
                src: Some(dst),
                ..Query::to(src)
            });
        }
        // What the lookups derive from all routes.
        assert_eq!(patched.v4_broadcasts, fresh.v4_broadcasts, "{what}");
        assert_eq!(patched.v4_own.words(), fresh.v4_own.words(), "{what}");
        assert_eq!(patched.v6_input_prefers, fresh.v6_input_prefers, "{what}");
        assert_eq!(
            patched.v4_full_source_check, fresh.v4_full_source_check,
            "{what}"
        );
        for q in &flows {
            assert_eq!(patched.route(q), fresh.route(q), "{what}: route {q:?}");
            assert_eq!(
                patched.lookup(q).map(Hop::from),
                fresh.lookup(q).map(Hop::from),
                "{what}: lookup {q:?}"
            );
        }
        let mut a = vec![Err(crate::query::NoRoute::NetworkUnreachable); flows.len()];
        let mut b = a.clone();
        patched.lookup_batch(&flows, &mut a);
        fresh.lookup_batch(&flows, &mut b);
        for (i, (a, b)) in a.iter().zip(&b).enumerate() {
            assert_eq!(
                a.map(Hop::from),
                b.map(Hop::from),
                "{what}: batch {:?}",
                flows[i]
            );
        }
    }

    use crate::hop::Hop;

    /// What the state counts as routes change equals what a walk of them finds: the
    /// routes of each table, the destinations that deliver to this host.
    pub(crate) fn counted_as_walked(state: &State, what: &str) {
        let mut routes = std::collections::BTreeMap::new();
        let mut receiving = BTreeSet::new();
        for f in [Family::V4, Family::V6] {
            for r in state.routes(f, None) {
                *routes.entry((f, r.table)).or_insert(0usize) += 1;
                if matches!(
                    r.kind,
                    RouteType::Local
                        | RouteType::Broadcast
                        | RouteType::Anycast
                        | RouteType::Multicast
                ) {
                    receiving.insert(r.dst);
                }
            }
        }
        assert_eq!(state.route_counts(), &routes, "{what}");
        let counted: BTreeSet<Net> = state.receiving_destinations().collect();
        assert_eq!(counted, receiving, "{what}");
        assert!(
            !state.holds_empty(),
            "{what}: an empty list of routes is held"
        );
    }

    /// A link going down leaves exactly what the kernel leaves: of a multipath route, the
    /// path through it dead; the routes wholly through it gone, each of several under one
    /// destination and source, and of several sources under one destination; the routes
    /// of other links, of a nexthop object and of no path kept; its local routes kept
    /// (all gone with the link deleted). The same whether the link's routes are found by
    /// its index of users or, the index given up, by a walk of every route; and published
    /// by a patch that answers as the state compiled anew.
    #[test]
    fn a_link_down_takes_out_exactly_its_routes() {
        let routes = "\
route add 10.8.0.0/16 nexthop via 10.0.0.2 dev a0 nexthop via 10.1.0.2 dev b0
route add 10.9.0.0/16 via 10.1.0.2
route add 10.9.0.0/16 via 10.1.0.3 metric 100
route add 10.10.0.0/16 via 10.1.0.2
route add 10.10.0.0/16 via 10.0.0.2 metric 100
route add 10.11.0.0/16 via 10.1.0.2
route add 10.11.0.0/16 nhid 1 metric 100
route add blackhole 10.11.0.0/16 metric 200
route add 2001:db8:5::/48 from 2001:db8:1::/64 via fd01::2
route add 2001:db8:5::/48 from 2001:db8:2::/64 via fd00::2
route add 2001:db8:5::/48 via fd01::2
route add 2001:db8:6::/48 nexthop via fd00::2 dev a0 nexthop via fd01::2 dev b0
route add 2001:db8:7::/48 via fd01::2 metric 10
route add 2001:db8:7::/48 via fd01::3 metric 20
";
        // Each route of main and local not derived from an address elsewhere: its
        // destination, source, metric and paths (link, dead or not).
        let described = |state: &State| -> Vec<String> {
            let name = |dev| state.link(dev).map_or("?".to_string(), |l| l.name.clone());
            let mut out = Vec::new();
            for family in [Family::V4, Family::V6] {
                for table in [TABLE_MAIN, TABLE_LOCAL] {
                    for r in state.routes(family, Some(table)) {
                        let paths: Vec<String> = match &r.body.paths {
                            crate::Paths::Own(p) => p
                                .iter()
                                .map(|p| {
                                    format!("{}{}", name(p.dev), if p.dead { " dead" } else { "" })
                                })
                                .collect(),
                            crate::Paths::Object(id) => vec![format!("nhid {id}")],
                            crate::Paths::None => vec!["none".to_string()],
                        };
                        let d = format!(
                            "{} {:?} {} from {} metric {} [{}]",
                            table,
                            r.body.kind,
                            r.dst,
                            r.body.src,
                            r.body.metric,
                            paths.join(", ")
                        );
                        if d.contains("b0")
                            || r.dst.to_string().starts_with("10.")
                            || r.dst.to_string().starts_with("2001:db8:")
                        {
                            out.push(d);
                        }
                    }
                }
            }
            out
        };
        let mut after = Vec::new();
        for walked in [false, true] {
            let mut state = State::new();
            config::apply_text(&mut state, "links", LINKS).unwrap();
            config::apply_text(&mut state, "routes", routes).unwrap();
            let b0 = state.link_by_name("b0").unwrap().index;
            if walked {
                state.give_up_link_index(b0);
            }
            let (mut fib, reader) = Fib::new(state);
            fib.update(|s, t| {
                config::apply_line(s, "link set b0 down").unwrap();
                t.others();
            });
            let what = format!("b0 down, walked {walked}");
            counted_as_walked(fib.state(), &what);
            assert_eq!(fib.publications().patched, 1, "{what}");
            let dsts = (0..=255u8)
                .map(|i| IpAddr::from([10, i % 16, i, 1]))
                .chain((0..=255u16).map(|i| IpAddr::from([0x2001, 0xdb8, i % 9, 0, 0, 0, 0, 1])))
                .collect::<Vec<_>>();
            same_answers(&reader.snapshot(), &fib.state().snapshot(), &dsts, &what);
            after.push(described(fib.state()));
            // The link deleted: its local routes go too.
            fib.update(|s, t| {
                config::apply_line(s, "link del b0").unwrap();
                t.others();
            });
            counted_as_walked(fib.state(), &format!("b0 deleted, walked {walked}"));
            assert!(
                described(fib.state()).iter().all(|d| !d.contains("b0")),
                "{:?}",
                described(fib.state())
            );
        }
        assert_eq!(after[0], after[1], "indexed and walked");
        let expected = [
            "254 Unicast 10.0.0.0/24 from 0.0.0.0/0 metric 0 [a0]",
            "254 Unicast 10.8.0.0/16 from 0.0.0.0/0 metric 0 [a0, b0 dead]",
            "254 Unicast 10.10.0.0/16 from 0.0.0.0/0 metric 100 [a0]",
            "254 Unicast 10.11.0.0/16 from 0.0.0.0/0 metric 100 [nhid 1]",
            "254 Blackhole 10.11.0.0/16 from 0.0.0.0/0 metric 200 [none]",
            "255 Local 10.0.0.1/32 from 0.0.0.0/0 metric 0 [a0]",
            "255 Broadcast 10.0.0.255/32 from 0.0.0.0/0 metric 0 [a0]",
            "255 Local 10.1.0.1/32 from 0.0.0.0/0 metric 0 [b0]",
            "254 Unicast 2001:db8:5::/48 from 2001:db8:2::/64 metric 1024 [a0]",
            "254 Unicast 2001:db8:6::/48 from ::/0 metric 1024 [a0, b0 dead]",
        ];
        assert_eq!(after[0], expected, "{:#?}", after[0]);
    }

    /// Random batches of route changes (every type, nested and repeated prefixes, both
    /// families, the merged IPv4 tables, a table of rules, the local table, nexthop
    /// objects), now and then with a link going down or up, addresses, nexthop objects or
    /// rules changing (`local`'s own rule deleted and added again among them), published
    /// by patches (or compiles where a patch cannot follow) answer every lookup as the
    /// state compiled anew. The state notes the routes changed on its own.
    #[test]
    fn patched_snapshots_answer_as_compiled_ones() {
        for (seed, rules) in (1u64..=12).map(|s| (s, s % 2 == 0)) {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut state = State::new();
            config::apply_text(&mut state, "links", LINKS).unwrap();
            let (mut fib, reader) = Fib::new(state);
            // The rules added by a patch: the first parts `local` from `main`.
            if rules {
                fib.update(|s, t| {
                    config::apply_text(s, "rules", RULES).unwrap();
                    t.others();
                });
            }
            let mut applied = 0;
            for round in 0..60 {
                let lines: Vec<(String, u32, bool)> = (0..rng.gen_range(1..12))
                    .map(|_| {
                        let v6 = rng.gen_bool(0.5);
                        let dst = prefix(&mut rng, v6);
                        let (line, table) = change(&mut rng, v6, &dst);
                        (line, table, v6)
                    })
                    .collect();
                // Now and then a change besides routes: a link down and up, addresses,
                // nexthop objects (new ones, or one that routes use changed), a rule.
                let other = match rng.gen_range(0..30) {
                    0 => Some("link set b0 down".to_string()),
                    1 | 2 => Some("link set b0 up".to_string()),
                    3 => Some(format!("addr add 10.1.0.{}/24 dev b0", rng.gen_range(5..9))),
                    4 => Some(format!("addr del 10.1.0.{}/24 dev b0", rng.gen_range(5..9))),
                    5 => Some(format!("addr add fd01::{}/64 dev b0", rng.gen_range(5..9))),
                    6 => Some(format!("addr del fd01::{}/64 dev b0", rng.gen_range(5..9))),
                    7 => Some(format!(
                        "nexthop add id {} via 10.1.0.2 dev b0",
                        rng.gen_range(10..1000)
                    )),
                    8 => Some(format!(
                        "nexthop replace id 1 via 10.0.0.{} dev a0",
                        rng.gen_range(2..5)
                    )),
                    9 => Some(format!(
                        "rule add to 10.{}.0.0/16 lookup 100",
                        rng.gen_range(8..11)
                    )),
                    10 => Some(format!(
                        "rule add to 10.{}.0.0/16 lookup 200 pref {}",
                        rng.gen_range(8..11),
                        rng.gen_range(50..300)
                    )),
                    11 => Some(format!(
                        "rule del lookup {}",
                        [100, 200][rng.gen_range(0..2)]
                    )),
                    12 => Some(format!(
                        "rule add from fd01::/64 lookup 200 pref {}",
                        rng.gen_range(50..300)
                    )),
                    13 => Some("rule del from fd01::/64".to_string()),
                    14 => Some(format!(
                        "nexthop replace id 4 via 10.1.0.{} dev b0",
                        rng.gen_range(2..5)
                    )),
                    15 => Some(format!(
                        "nexthop replace id 3 group 1/4,{}",
                        rng.gen_range(1..4)
                    )),
                    16 => Some("nexthop replace id 3 group 4".to_string()),
                    // `local`'s rule gone and back: `main`'s structure holds `local`'s
                    // answers only while every walk looks `local` up first.
                    17 => Some("rule del pref 0".to_string()),
                    18 => Some("rule add lookup local pref 0".to_string()),
                    // And IPv6's, whose `main` holds `local`'s answers from the compile.
                    19 => Some("-6 rule del pref 0".to_string()),
                    20 => Some("-6 rule add lookup local pref 0".to_string()),
                    21 => Some("-6 rule add lookup main pref 10".to_string()),
                    22 => Some("-6 rule del lookup main pref 10".to_string()),
                    _ => None,
                };
                fib.update(|state, touched| {
                    // The routes each line changes, the state notes itself.
                    for (line, _, _) in &lines {
                        // Refused lines (a route that exists, a gateway off-link) change
                        // nothing.
                        applied += config::apply_text(state, "batch", line).is_ok() as usize;
                    }
                    if let Some(line) = &other {
                        let _ = config::apply_text(state, "other", line);
                        touched.others();
                    }
                });
                let fresh = fib.state().snapshot();
                counted_as_walked(fib.state(), &format!("seed {seed} round {round}"));
                let dsts = destinations(&mut rng, fib.state());
                same_answers(
                    &reader.snapshot(),
                    &fresh,
                    &dsts,
                    &format!("seed {seed} round {round}"),
                );
            }
            let p = fib.publications();
            // Every batch patched but the first publication (the first IPv4 rule's too,
            // which parts `local` and `main`), and now and then a table whose search
            // wore out with changes; a batch that changed nothing publishes nothing.
            assert!(p.compiled <= 2, "seed {seed}: {p:?}");
            assert!(p.patched >= 55, "seed {seed}: {p:?}");
            assert!(
                fib.state().v4_unmerged(),
                "seed {seed}: no IPv4 rule was added"
            );
            eprintln!(
                "seed {seed}: {applied} changes applied, {p:?}, {} routes",
                fib.state().routes(Family::V4, None).count()
                    + fib.state().routes(Family::V6, None).count()
            );
        }
    }

    /// Nodes whose routes all have dead paths take their parent's answer: when only the
    /// parent changes (replaced, deleted, made a reject route), theirs follow.
    #[test]
    fn nodes_taking_their_parents_answer_follow_it() {
        let mut state = State::new();
        config::apply_text(&mut state, "links", LINKS).unwrap();
        let (mut fib, reader) = Fib::new(state);
        let routes = "\
route add 10.8.0.0/13 via 10.0.0.2
route add 10.9.0.0/16 via 10.0.0.3
route add 10.9.2.0/24 via 10.0.0.4
route add 2001:db8::/32 via fd00::2
route add 2001:db8:1::/48 via fd00::3
route add 2001:db8:1:2::/64 via fd00::4
";
        let nets: Vec<Net> = routes
            .lines()
            .map(|l| Net::parse(l.split_whitespace().nth(2).unwrap(), None).unwrap())
            .collect();
        let check = |fib: &Fib, what: &str| {
            let fresh = fib.state().snapshot();
            let dsts: Vec<IpAddr> = nets.iter().flat_map(|n| [n.addr(), n.last()]).collect();
            same_answers(&reader.snapshot(), &fresh, &dsts, what);
        };
        fib.update(|s, t| {
            config::apply_text(s, "routes", routes).unwrap();
            nets.iter().for_each(|n| t.route(TABLE_MAIN, *n));
        });
        check(&fib, "added");
        // The longer prefixes' paths die: their nodes take the shortest's answer.
        fib.update(|s, t| {
            for &n in &nets[1..3]
                .iter()
                .chain(&nets[4..6])
                .copied()
                .collect::<Vec<_>>()
            {
                let mut r = s
                    .routes(n.family(), Some(TABLE_MAIN))
                    .find(|r| r.dst == n)
                    .unwrap()
                    .clone();
                r.paths
                    .edit(|paths| paths.iter_mut().for_each(|p| p.dead = true));
                s.mirror_route(r, crate::state::RouteOp::Replace);
                t.route(TABLE_MAIN, n);
            }
        });
        check(&fib, "paths dead");
        for (i, change) in [
            "route replace 10.8.0.0/13 via 10.0.0.5\nroute replace 2001:db8::/32 via fd00::5",
            "route replace 10.8.0.0/13 via 10.1.0.5\nroute replace 2001:db8::/32 via fd01::5",
            "route del 10.8.0.0/13\nroute del 2001:db8::/32",
            "route add blackhole 10.8.0.0/13\nroute add prohibit 2001:db8::/32",
            "route replace 10.8.0.0/13 via 10.0.0.2\nroute replace 2001:db8::/32 via fd00::2",
        ]
        .iter()
        .enumerate()
        {
            fib.update(|s, t| {
                config::apply_text(s, "change", change).unwrap();
                t.route(TABLE_MAIN, nets[0]);
                t.route(TABLE_MAIN, nets[3]);
            });
            check(&fib, &format!("change {i}: {change}"));
        }
        assert_eq!(fib.publications().compiled, 1, "{:?}", fib.publications());
    }

    /// The spare snapshot, patched and made to share with the published one, holds its
    /// own copy of only the chunks the change wrote; patched in turn to the same state,
    /// the other shares every chunk again; both answer as the state compiled anew.
    #[test]
    fn a_patched_spare_shares_all_but_the_chunks_a_change_wrote() {
        let mut state = State::new();
        config::apply_text(&mut state, "links", LINKS).unwrap();
        config::apply_text(&mut state, "routes", &routes_via_a0(5000)).unwrap();
        let published = state.snapshot();
        let mut spare = published.clone();
        let main = |s: &Snapshot| -> (Chunked<Node>, Chunked<DestAnswer>) {
            let t = s.v4.tables.iter().find(|t| t.id == TABLE_MAIN).unwrap();
            (t.nodes.clone(), t.answers.clone())
        };
        let chunks = main(&published).0.chunks_shared_with(&main(&published).0).1;
        assert!(chunks >= 5, "{chunks} chunks");
        state.keep_journal();
        config::apply_text(
            &mut state,
            "change",
            "route replace 10.110.7.0/24 via 10.0.0.3",
        )
        .unwrap();
        let mut touched = Touched::nothing();
        for (_, table, dst) in state.take_journal() {
            touched.route(table, dst);
        }
        assert!(spare.patch(&state, &touched));
        spare.share_with(&published);
        // One node and its answer changed: one chunk of each held apart.
        let (nodes, answers) = (main(&spare), main(&published));
        assert_eq!(nodes.0.chunks_shared_with(&answers.0), (chunks - 1, chunks));
        assert_eq!(
            nodes.1.chunks_shared_with(&answers.1).0 + 1,
            nodes.1.chunks_shared_with(&answers.1).1
        );
        // The other brought to the same state shares every chunk.
        let mut other = published.clone();
        assert!(other.patch(&state, &touched));
        other.share_with(&spare);
        let (a, b) = (main(&other), main(&spare));
        assert_eq!(a.0.chunks_shared_with(&b.0), (chunks, chunks));
        let answer_chunks = a.1.chunks_shared_with(&b.1).1;
        assert_eq!(a.1.chunks_shared_with(&b.1), (answer_chunks, answer_chunks));
        let fresh = state.snapshot();
        let dsts: Vec<IpAddr> = ["10.110.7.1", "10.100.0.1", "10.119.135.9", "10.0.0.9"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        same_answers(&spare, &fresh, &dsts, "spare");
        same_answers(&other, &fresh, &dsts, "other");
    }

    /// A nexthop object that stood for one live path and stands for another (a gateway,
    /// a link, a group's only member replaced) has the hops of its routes made again in
    /// place: no answer of any table or merged search changes, nor the number of hops,
    /// and every lookup answers as the state compiled anew. One that gains or loses live
    /// paths has its routes' answers made again. With and without rules (merged searches
    /// of several tables, and IPv4's `local` and `main` merged).
    #[test]
    fn an_object_standing_for_another_path_is_followed_in_place() {
        for rules in [false, true] {
            let mut state = State::new();
            config::apply_text(&mut state, "links", LINKS).unwrap();
            if rules {
                config::apply_text(&mut state, "rules", RULES).unwrap();
            }
            let mut routes = String::new();
            for i in 0..3000 {
                let (a, b) = (100 + i / 256, i % 256);
                routes += &format!(
                    "route add 10.{a}.{b}.0/24 nhid 1
"
                );
                routes += &format!(
                    "route add 10.9.{b}.{}/32 nhid 3 table 100
",
                    a - 100
                );
                routes += &format!(
                    "route add 2001:db8:{a:x}:{b:x}::/64 nhid 2
"
                );
            }
            config::apply_text(&mut state, "routes", &routes).unwrap();
            let mut snapshot = state.snapshot();
            let answers = |s: &Snapshot| -> Vec<(u32, Vec<DestAnswer>, usize)> {
                let fibs = [&s.v4, &s.v6];
                let tables = fibs.iter().flat_map(|f| &f.tables);
                let mut out: Vec<_> = tables
                    .map(|t| {
                        (
                            t.id,
                            t.answers.iter().copied().collect(),
                            t.plain.hops.len(),
                        )
                    })
                    .collect();
                let merged = fibs.iter().flat_map(|f| &f.merged);
                out.extend(merged.map(|m| (0, Vec::new(), m.plain.hops.len())));
                out
            };
            let dsts: Vec<IpAddr> = ["10.100.0.1", "10.111.183.9", "10.9.7.1", "10.9.7.2"]
                .iter()
                .chain(&["2001:db8:64:0::1", "2001:db8:6f:b7::1", "10.1.0.7"])
                .map(|a| a.parse().unwrap())
                .collect();
            for (change, in_place) in [
                ("nexthop replace id 3 group 4", false),
                ("nexthop replace id 1 via 10.0.0.3 dev a0", true),
                ("nexthop replace id 2 via fd01::3 dev b0", true),
                ("nexthop replace id 4 via 10.0.0.4 dev a0", true),
                ("nexthop replace id 1 via 10.1.0.3 dev b0", true),
                ("link set b0 down", false),
                ("link set b0 up", false),
                (
                    "nexthop add id 1 via 10.0.0.2 dev a0\nnexthop replace id 3 group 1/4",
                    false,
                ),
            ] {
                let what = format!("rules {rules}: {change}");
                let before = answers(&snapshot);
                state.keep_journal();
                config::apply_text(&mut state, "change", change).unwrap();
                let mut touched = Touched::nothing();
                touched.others();
                for (_, table, dst) in state.take_journal() {
                    touched.route(table, dst);
                }
                assert!(snapshot.patch(&state, &touched), "{what}");
                assert_eq!(answers(&snapshot) == before, in_place, "{what}");
                same_answers(&snapshot, &state.snapshot(), &dsts, &what);
            }
        }
    }

    /// A link going down kills paths and takes routes with it, unannounced; coming up it
    /// brings them back; addresses come and go: each published by a patch, answering as
    /// the state compiled anew.
    #[test]
    fn links_and_addresses_changing_are_patched() {
        let mut state = State::new();
        config::apply_text(&mut state, "links", LINKS).unwrap();
        let (mut fib, reader) = Fib::new(state);
        let routes = "\
route add 10.8.0.0/16 nexthop via 10.0.0.2 nexthop via 10.1.0.2
route add 10.9.0.0/16 via 10.1.0.2
route add 10.10.0.0/16 via 10.0.0.2
route add 2001:db8:1::/48 nexthop via fd00::2 nexthop via fd01::2
route add 2001:db8:2::/48 via fd01::2
";
        let dsts: Vec<IpAddr> = ["10.8.1.1", "10.9.1.1", "10.10.1.1", "10.1.0.9", "10.1.0.7"]
            .iter()
            .chain(&["2001:db8:1::1", "2001:db8:2::1", "fd01::9"])
            .map(|a| a.parse().unwrap())
            .collect();
        let mut patched = fib.publications().patched;
        for (i, (change, others)) in [
            (routes, false),
            ("link set b0 down", true),
            ("link set b0 up", true),
            ("addr add 10.1.0.7/24 dev b0", true),
            ("addr add fd01::7/64 dev b0", true),
            ("addr del 10.1.0.7/24 dev b0", true),
            ("addr del 10.1.0.1/24 dev b0", true),
        ]
        .into_iter()
        .enumerate()
        {
            fib.update(|s, t| {
                config::apply_text(s, "change", change).unwrap();
                if others {
                    t.others();
                }
            });
            let fresh = fib.state().snapshot();
            counted_as_walked(fib.state(), change);
            same_answers(&reader.snapshot(), &fresh, &dsts, &format!("{i}: {change}"));
            patched += 1;
            assert_eq!(fib.publications().patched, patched, "{i}: {change}");
        }
        // A batch that changes nothing a snapshot holds publishes nothing.
        let before = Arc::as_ptr(&reader.snapshot());
        fib.update(|_, _| {});
        assert_eq!(Arc::as_ptr(&reader.snapshot()), before);
        assert_eq!(fib.publications().patched, patched);
    }

    /// Each kind of change besides routes is published by a patch, and answers as the
    /// state compiled anew: a nexthop object that routes use standing for other paths (a
    /// path, a group's member, a group's members), rules added and deleted (IPv4 after
    /// its first rule, and IPv6), a table appearing and going. Each change is followed by
    /// one of an unrelated route, so that both snapshots the writer alternates between
    /// are checked (each is patched with what the other took).
    #[test]
    fn every_kind_of_change_is_patched() {
        let mut state = State::new();
        config::apply_text(&mut state, "links", LINKS).unwrap();
        config::apply_text(&mut state, "rules", RULES).unwrap();
        let (mut fib, reader) = Fib::new(state);
        let routes = "\
route add 10.60.0.0/16 nhid 1
route add 10.61.0.0/16 nhid 3
route add 10.62.0.0/16 nhid 3 table 100
route add 10.9.1.0/24 via 10.0.0.2 table 100
route add 2001:db8:60::/48 nhid 2
route add 2001:db8:61::/48 via fd00::2 table 100
";
        let dsts: Vec<IpAddr> = [
            "10.60.0.1",
            "10.61.0.1",
            "10.62.0.1",
            "10.9.1.1",
            "10.9.2.1",
            "10.70.0.1",
            "2001:db8:60::1",
            "2001:db8:61::1",
            "2001:db8:70::1",
        ]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
        let mut patched = fib.publications().patched;
        let changes = [
            routes,
            "nexthop replace id 1 via 10.0.0.3 dev a0",
            "nexthop replace id 2 via fd00::3 dev a0",
            "nexthop replace id 4 via 10.1.0.3 dev b0",
            "nexthop replace id 3 group 1/4,3",
            "nexthop replace id 3 group 4",
            "nexthop del id 4",
            "rule add to 10.9.0.0/16 lookup 200 pref 150",
            "route add 10.9.2.0/24 via 10.1.0.2 table 200",
            "route add 10.70.0.0/16 via 10.1.0.2 table 200",
            "rule add lookup 200 pref 5",
            "rule add from fd00::/16 lookup 200 pref 150",
            "route add 2001:db8:70::/48 via fd01::2 table 200",
            "route del 10.9.2.0/24 table 200\nroute del 10.70.0.0/16 table 200",
            "rule del pref 150",
            "rule del pref 5",
            "rule del from fd00::/16",
            "route del 2001:db8:70::/48 table 200",
        ];
        for (i, change) in changes.iter().enumerate() {
            for (j, step) in [change, "route replace 10.99.0.0/16 via 10.0.0.2"]
                .iter()
                .enumerate()
            {
                fib.update(|s, t| {
                    config::apply_text(s, "change", step).unwrap();
                    t.others();
                });
                let fresh = fib.state().snapshot();
                same_answers(
                    &reader.snapshot(),
                    &fresh,
                    &dsts,
                    &format!("{i}.{j}: {change}"),
                );
                patched += 1;
                assert_eq!(fib.publications().patched, patched, "{i}.{j}: {change}");
            }
        }
    }

    /// IPv4's first rule parts `local` from `main` by a patch: a flow to a prefix of
    /// `main` inside one of `local`'s is delivered locally from then on (the walk takes
    /// `local` first, where the merged table took the longer prefix), and every lookup
    /// answers as the state compiled anew; with and without routes in table `default`
    /// (whose search with `main` seeds the walk's). Each change is followed by one of an
    /// unrelated route, so that both snapshots the writer alternates between are checked.
    #[test]
    fn the_first_ipv4_rule_is_patched() {
        // The rule alone, with routes in `default`, and after an address (local and
        // broadcast routes) deleted in the same batch or in the one before: the spare is
        // patched with both, and the merged table still holds what the deletion took.
        let rule = "rule add from 10.1.0.0/24 lookup 100 pref 100";
        let gone = "addr del 10.1.0.1/24 dev b0";
        let together = format!("{gone}\n{rule}");
        for (default, first) in [
            (false, vec![rule]),
            (true, vec![rule]),
            (false, vec![together.as_str()]),
            (true, vec![gone, rule]),
        ] {
            let mut state = State::new();
            config::apply_text(&mut state, "links", LINKS).unwrap();
            let mut routes = String::from(
                "route add local 10.77.0.0/16 dev lo table local\n\
                 route add 10.77.1.0/24 via 10.0.0.2\n\
                 route add 10.0.0.128/25 via 10.1.0.2\n\
                 route add 10.78.0.0/16 via 10.0.0.2\n",
            );
            if default {
                routes += "route add 10.77.2.0/24 via 10.1.0.2 table default\n\
                           route add 10.88.0.0/16 via 10.1.0.2 table default\n\
                           route add 10.78.1.0/24 via 10.1.0.2 table default\n";
            }
            routes += &routes_via_a0(2000);
            config::apply_text(&mut state, "routes", &routes).unwrap();
            let (mut fib, reader) = Fib::new(state);
            let dsts: Vec<IpAddr> = [
                "10.77.1.5",
                "10.77.2.5",
                "10.77.3.5",
                "10.78.1.5",
                "10.78.2.5",
                "10.88.1.1",
                "10.0.0.1",
                "10.0.0.200",
                "10.0.0.255",
                "10.1.0.1",
                "127.0.0.1",
                "127.1.2.3",
                "10.100.3.4",
                "10.107.207.1",
                "10.9.1.1",
            ]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
            let later = [
                "route add 10.9.0.0/16 via 10.0.0.2 table 100",
                "rule add to 10.77.0.0/16 lookup 100 pref 50",
                "rule del pref 50",
                // `local` looked up after another table: `main` searched on its own.
                "rule add lookup local pref 1000",
                "rule del pref 0",
                "route add local 10.78.3.0/24 dev lo table local",
                "rule add lookup local pref 0",
            ];
            for (i, &change) in first.iter().chain(&later).enumerate() {
                // The address's deletion right before the rule: the other snapshot is
                // patched with both at once.
                let steps = if change == gone {
                    vec![change]
                } else {
                    vec![change, "route replace 10.99.0.0/16 via 10.0.0.2"]
                };
                for (j, step) in steps.iter().enumerate() {
                    let before = fib.publications();
                    fib.update(|s, t| {
                        config::apply_text(s, "change", step).unwrap();
                        t.others();
                    });
                    let what = format!("default {default}, {first:?}: {i}.{j}: {step}");
                    same_answers(&reader.snapshot(), &fib.state().snapshot(), &dsts, &what);
                    let after = fib.publications();
                    assert_eq!(after.compiled, before.compiled, "{what}");
                    assert_eq!(after.patched, before.patched + 1, "{what}");
                    // While every walk looks up `local` first, `main`'s structure
                    // keeps answering as the merged table did (nothing copied).
                    let snapshot = reader.snapshot();
                    let main = snapshot.v4.position(TABLE_MAIN).unwrap();
                    let holds = snapshot.v4.tables[main].plain_holds;
                    let local_first =
                        fib.state().v4_unmerged() && fib.state().rules(Family::V4)[0].pref == 0;
                    let released = later[..].iter().position(|c| *c == "rule del pref 0");
                    let after_release = released.is_some_and(|r| i >= first.len() + r);
                    assert_eq!(
                        holds,
                        (local_first && !after_release).then_some(TABLE_LOCAL),
                        "{what}"
                    );
                }
            }
            // The walk takes `local` first now.
            let q = Query::to("10.77.1.5".parse().unwrap());
            assert_eq!(
                reader.snapshot().lookup(&q).map(|h| h.kind),
                Ok(RouteType::Local)
            );
        }
    }

    /// `main`'s structure holds `local`'s answers after the first rule only while every
    /// walk looks up `local` first: the VRF setup (`local`'s rule moved after another
    /// table's, then a rule looking up `main` ahead of it) and `local` emptied each give
    /// `main` a structure of its own again, by a patch, and every lookup answers as the
    /// state compiled anew, for both snapshots. Where a walk takes `main` before `local`,
    /// a prefix of `main` inside one of `local`'s answers from `main`.
    #[test]
    fn main_holds_local_only_while_every_walk_looks_it_up_first() {
        let setup = format!(
            "route add local 10.77.0.0/16 dev lo table local\n\
             route add 10.77.1.0/24 via 10.0.0.2\n\
             route add 0.0.0.0/0 via 10.0.0.2\n{}",
            routes_via_a0(500)
        );
        let dsts: Vec<IpAddr> = [
            "10.77.1.5",
            "10.77.2.5",
            "10.78.1.5",
            "10.0.0.1",
            "10.0.0.255",
            "10.1.0.1",
            "10.100.3.4",
            "10.9.9.9",
            "127.0.0.1",
        ]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
        // Each change, whether `main` holds `local`'s answers after it.
        let vrf: &[(&str, bool)] = &[
            ("rule add from 10.1.0.0/24 lookup 100 pref 100", true),
            ("route add local 10.78.0.0/16 dev lo table local", true),
            ("rule add lookup local pref 1000", true),
            ("rule del pref 0", false),
            ("rule add lookup main pref 10", false),
            ("route add 10.77.3.0/24 via 10.1.0.2", false),
            ("route del local 10.78.0.0/16 dev lo table local", false),
        ];
        let emptied: &[(&str, bool)] = &[
            ("rule add from 10.1.0.0/24 lookup 100 pref 100", true),
            ("route del local 10.77.0.0/16 dev lo table local", true),
            ("addr del 10.1.0.1/24 dev b0", true),
            (
                "route del local 10.0.0.1 dev a0 table local\n\
                 route del broadcast 10.0.0.255 dev a0 table local",
                false,
            ),
            ("route add local 10.77.0.0/16 dev lo table local", false),
        ];
        for (name, changes) in [("vrf", vrf), ("emptied", emptied)] {
            let mut state = State::new();
            config::apply_text(&mut state, "links", LINKS).unwrap();
            config::apply_text(&mut state, "routes", &setup).unwrap();
            let (mut fib, reader) = Fib::new(state);
            for (i, &(change, holds)) in changes.iter().enumerate() {
                for (j, step) in [change, "route replace 10.99.0.0/16 via 10.0.0.2"]
                    .iter()
                    .enumerate()
                {
                    let before = fib.publications();
                    fib.update(|s, t| {
                        config::apply_text(s, "change", step).unwrap();
                        t.others();
                    });
                    let what = format!("{name} {i}.{j}: {step}");
                    let snapshot = reader.snapshot();
                    same_answers(&snapshot, &fib.state().snapshot(), &dsts, &what);
                    let after = fib.publications();
                    assert_eq!(after.compiled, before.compiled, "{what}");
                    assert_eq!(after.patched, before.patched + 1, "{what}");
                    let main = snapshot.v4.position(TABLE_MAIN).unwrap();
                    assert_eq!(
                        snapshot.v4.tables[main].plain_holds,
                        holds.then_some(TABLE_LOCAL),
                        "{what}"
                    );
                }
            }
            if name == "vrf" {
                // `main` first: its own route, not `local`'s.
                let q = Query::to("10.77.1.5".parse().unwrap());
                assert_eq!(
                    reader.snapshot().lookup(&q).map(|h| h.kind),
                    Ok(RouteType::Unicast)
                );
            }
        }
    }

    /// A compile makes no search merging `local` and `main` where every walk looks up
    /// `local` first (IPv6's default rules; IPv4's once parted): `main`'s structure holds
    /// `local`'s answers. IPv6's `local` rule moved after another table's gives `main` a
    /// structure of its own again, by a patch, as a compile of the same state makes; each
    /// snapshot answers as the state compiled anew.
    #[test]
    fn a_compile_makes_main_hold_local_where_walks_look_it_up_first() {
        let setup = format!(
            "-6 route add local 2001:db8:77::/48 dev lo table local\n\
             -6 route add 2001:db8:77:1::/64 via fd00::2\n\
             -6 route add ::/0 via fd00::2\n\
             rule add from 10.1.0.0/24 lookup 100 pref 100\n\
             -6 rule add from fd01::/64 lookup 100 pref 100\n{}",
            routes_via_a0(50)
        );
        let dsts: Vec<IpAddr> = [
            "2001:db8:77:1::5",
            "2001:db8:77:2::5",
            "2001:db8:78::5",
            "fd00::1",
            "fd00::2",
            "fd01::1",
            "::1",
            "ff02::1",
            "2001:db8:50::1",
            "10.0.0.1",
            "10.100.3.4",
        ]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
        let mut state = State::new();
        config::apply_text(&mut state, "links", LINKS).unwrap();
        config::apply_text(&mut state, "routes", &setup).unwrap();
        let held = |s: &Snapshot, f: Family| {
            let fib = s.fib(f);
            (
                fib.tables[fib.position(TABLE_MAIN).unwrap()].plain_holds,
                fib.merged.len(),
            )
        };
        // Every lookup of the structures as the full walk through the tables answers.
        let flows: Vec<Query> = dsts.iter().map(|&d| Query::to(d)).collect();
        let compiled = state.snapshot();
        crate::forward::tests::agree_on(&compiled, &flows);
        assert_eq!(held(&compiled, Family::V6), (Some(TABLE_LOCAL), 0));
        // IPv4 parted by its first rule: a walk through `local`, `main` and `default`
        // (empty) is `main`'s structure too; table 100's rule has its own.
        assert_eq!(held(&compiled, Family::V4).0, Some(TABLE_LOCAL));
        let (mut fib, reader) = Fib::new(state);
        for (change, holds) in [
            (
                "-6 route add local 2001:db8:78::/48 dev lo table local",
                true,
            ),
            ("-6 rule add lookup local pref 1000", true),
            ("-6 rule del pref 0", false),
            ("-6 rule add lookup main pref 10", false),
            ("-6 route add 2001:db8:77:3::/64 via fd00::2", false),
        ] {
            let before = fib.publications();
            fib.update(|s, t| {
                config::apply_text(s, "change", change).unwrap();
                t.others();
            });
            let snapshot = reader.snapshot();
            let fresh = fib.state().snapshot();
            same_answers(&snapshot, &fresh, &dsts, change);
            crate::forward::tests::agree_on(&snapshot, &flows);
            assert_eq!(fib.publications().patched, before.patched + 1, "{change}");
            assert_eq!(
                held(&snapshot, Family::V6).0,
                holds.then_some(TABLE_LOCAL),
                "{change}"
            );
            assert_eq!(
                held(&fresh, Family::V6).0,
                holds.then_some(TABLE_LOCAL),
                "{change}"
            );
        }
        // `main` looked up first: its own route, not `local`'s.
        let q = Query::to("2001:db8:77:1::5".parse().unwrap());
        assert_eq!(
            reader.snapshot().lookup(&q).map(|h| h.kind),
            Ok(RouteType::Unicast)
        );
    }

    /// The indexes of routes by nexthop object and by link hold every destination past
    /// their sweeps (thousands of routes each), and a table emptied by a link going down
    /// and filled again is searched again by the walk that merges it: each change is
    /// published by a patch that answers, at every destination, as a compile.
    #[test]
    fn indexes_hold_every_route_past_their_sweeps() {
        let mut state = State::new();
        config::apply_text(&mut state, "links", LINKS).unwrap();
        config::apply_text(&mut state, "rules", "rule add lookup 300 pref 50").unwrap();
        let mut routes = String::new();
        let mut dsts: Vec<IpAddr> = Vec::new();
        for i in 0..5000u32 {
            let (a, b) = (i / 250, i % 250);
            routes += &format!("route add 10.40.{a}.{b}/32 nhid 1\n");
            routes += &format!("route add 10.41.{a}.{b}/32 via 10.1.0.2\n");
            dsts.push(IpAddr::from([10, 40, a as u8, b as u8]));
            dsts.push(IpAddr::from([10, 41, a as u8, b as u8]));
        }
        routes += "route add 10.42.0.0/16 via 10.1.0.2 table 300\n";
        dsts.push(IpAddr::from([10, 42, 0, 1]));
        let (mut fib, reader) = Fib::new(state);
        for (i, change) in [
            routes.as_str(),
            "nexthop replace id 1 via 10.0.0.3 dev a0",
            "route replace 10.99.0.0/16 via 10.0.0.2",
            "link set b0 down",
            // Compiled (a batch applied whole): table 300 was emptied by the link.
            "compile: route replace 10.99.0.0/16 via 10.0.0.3",
            "link set b0 up",
            "route add 10.42.0.0/16 via 10.0.0.2 table 300",
            "route replace 10.99.0.0/16 via 10.0.0.2",
        ]
        .into_iter()
        .enumerate()
        {
            match change.strip_prefix("compile: ") {
                Some(line) => fib.apply("change", line).unwrap(),
                None => {
                    fib.update(|s, t| {
                        config::apply_text(s, "change", change).unwrap();
                        t.others();
                    });
                }
            }
            let fresh = fib.state().snapshot();
            let what = format!("{i}: {}", change.lines().next().unwrap_or(""));
            counted_as_walked(fib.state(), &what);
            same_answers(&reader.snapshot(), &fresh, &dsts, &what);
        }
        assert_eq!(fib.publications().compiled, 2, "{:?}", fib.publications());
    }
}
