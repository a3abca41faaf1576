//! A [`State`] that mirrors a kernel's, changed by what the kernel reports (its dumps and
//! notifications over rtnetlink) rather than by `ip` commands.
//!
//! The kernel reports the addresses and routes it derives (local, broadcast, connected,
//! IPv6 link-local), so a mirror derives none: it holds exactly what was reported. What
//! the kernel removes without a message, a mirror removes the same way, by the same code
//! as the `ip` commands take: IPv4 routes through a link that goes down or loses its last
//! address, the paths of routes over a link that goes away, IPv6 addresses of a link going
//! down. Each operation is idempotent where the kernel may report a thing twice (a
//! notification queued during the dump that the dump already held).

use super::*;

impl State {
    /// An empty mirror of a kernel's state: no links, no rules, no routes, until the
    /// kernel reports them.
    pub fn mirrored() -> State {
        let mut s = State::new();
        s.links.clear();
        s.rules = [Vec::new(), Vec::new()];
        s.v6_tables_made.clear();
        s.mirrored = true;
        s
    }

    /// Whether this state mirrors a kernel's.
    pub fn is_mirror(&self) -> bool {
        self.mirrored
    }

    /// A link as the kernel reports it (new or changed), with its carrier
    /// (`IFF_LOWER_UP`). A link going down loses its routes as in the kernel.
    pub fn mirror_link(&mut self, link: Link, carrier: bool) {
        let index = link.index;
        let up = link.up;
        match self.links.get_mut(&index) {
            Some(old) => {
                let was_up = old.up;
                *old = Link { up: was_up, ..link };
                self.carriers.insert(index, carrier);
                if was_up != up {
                    self.set_up(index, up);
                    if !up {
                        self.nexthops_link_gone(&[index]);
                    }
                }
            }
            None => {
                self.carriers.insert(index, carrier);
                self.links.insert(index, link);
            }
        }
        self.next_index = self.next_index.max(index + 1);
        self.refresh_rule_links();
    }

    /// A link the kernel removed: its addresses, and its paths, with it.
    pub fn mirror_del_link(&mut self, index: LinkIndex) {
        if !self.links.contains_key(&index) {
            return;
        }
        self.set_up(index, false);
        self.addrs.retain(|a| a.link != index);
        self.flush_dev(index, None, true);
        self.links.remove(&index);
        self.carriers.remove(&index);
        self.nexthops_link_gone(&[index]);
        self.refresh_rule_links();
    }

    /// An address as the kernel reports it, new or changed (the same link, address and
    /// length).
    pub fn mirror_address(&mut self, a: Address) {
        if !self.links.contains_key(&a.link) {
            return;
        }
        match self
            .addrs
            .iter_mut()
            .find(|o| o.link == a.link && o.local == a.local && o.len == a.len)
        {
            Some(o) => *o = a,
            None => self.addrs.push(a),
        }
    }

    /// An address the kernel removed, with what the kernel removes with it unreported
    /// (IPv4 routes through a link left with no address).
    pub fn mirror_del_address(&mut self, link: LinkIndex, local: IpAddr, len: u8) {
        let Some(name) = self.links.get(&link).map(|l| l.name.clone()) else {
            return;
        };
        // Not there (already gone with its primary, say): nothing to do.
        let _ = self.del_address(&name, local, Some(len));
    }

    /// A route as the kernel reports it: `op` from the message's flags (`Replace` for
    /// `NLM_F_REPLACE`, `Append` for `NLM_F_APPEND` and for a dump, else `Prepend`). An
    /// IPv6 route is reported whole (all its paths), so it replaces the route of its key.
    pub fn mirror_route(&mut self, route: Route, op: RouteOp) {
        self.note_kind(&route);
        let family = route.family();
        let held = || {
            let routes = self.tables.get(&(family, route.table))?;
            routes.get(&(route.dst, route.src))
        };
        if family == Family::V4 && held().is_some_and(|list| list.contains(&route.body)) {
            // Reported twice (a dump and a queued notification), or again as it is (the
            // kernel reports every route using a nexthop object that was replaced: a
            // hundred thousand, say); what it uses was noted when it came.
            return;
        }
        self.note_users(&route);
        let (table, dst) = (route.table, route.dst);
        let list = self
            .tables
            .entry((family, route.table))
            .or_default()
            .entry((route.dst, route.src))
            .or_insert_with(no_route);
        let at_key = ((family, route.table), route.dst);
        let route = route.body;
        // A list the same as before is the same interned list: the destination is noted
        // only if its routes changed (an IPv6 route reported again as it is).
        let before = Arc::clone(list);
        edit(list, &mut self.shared, &mut self.tally, at_key, |list| {
            put_reported(list, family, route, op)
        });
        if !Arc::ptr_eq(&before, list) {
            note(&mut self.journal, family, table, dst);
        }
    }

    /// Notes what kind of route `route` is where lookups depend on it: an IPv6 table
    /// made, an IPv4 local route a user added.
    fn note_kind(&mut self, route: &Route) {
        let family = route.family();
        if family == Family::V6 {
            self.v6_tables_made.insert(route.table);
        }
        self.v4_custom_local_routes |= family == Family::V4
            && route.kind == RouteType::Local
            && route.protocol != PROTO_KERNEL;
    }

    /// A route the kernel removed: the route of its key with its type and paths (IPv6:
    /// the paths it names, the route itself once it has none left).
    pub fn mirror_del_route(&mut self, route: &Route) {
        let family = route.family();
        let table_key = (family, route.table);
        let Some(table) = self.tables.get_mut(&table_key) else {
            return;
        };
        let key = (route.dst, route.src);
        let Some(list) = table.get_mut(&key) else {
            return;
        };
        note(&mut self.journal, family, route.table, route.dst);
        let same_key = |r: &RouteBody| r.tos == route.tos && r.metric == route.metric;
        let at_key = (table_key, route.dst);
        edit(
            list,
            &mut self.shared,
            &mut self.tally,
            at_key,
            |list| match family {
                Family::V4 => {
                    let at = list
                        .iter()
                        .position(|r| same_key(r) && r.kind == route.kind && r.paths == route.paths)
                        .or_else(|| {
                            list.iter()
                                .position(|r| same_key(r) && r.kind == route.kind)
                        });
                    if let Some(at) = at {
                        list.remove(at);
                    }
                }
                Family::V6 => {
                    let gone = route.own_paths();
                    let at = list.iter().position(|r| {
                        same_key(r)
                            && (ecmp_v6(r) && ecmp_v6(route)
                                || r.kind == route.kind
                                    && r.own_paths().iter().all(|p| {
                                        gone.iter()
                                            .any(|g| g.dev == p.dev && g.gateway == p.gateway)
                                    }))
                    });
                    if let Some(at) = at {
                        let left = match &list[at].paths {
                            Paths::Own(_) if !gone.is_empty() => list[at]
                                .paths
                                .edit(|paths| {
                                    paths.retain(|p| {
                                        !gone
                                            .iter()
                                            .any(|g| g.dev == p.dev && g.gateway == p.gateway)
                                    });
                                    !paths.is_empty()
                                })
                                .unwrap_or(false),
                            _ => false,
                        };
                        if !left {
                            list.remove(at);
                        }
                    }
                }
            },
        );
        if list.is_empty() {
            table.remove(&key);
        }
        if table.is_empty() {
            self.tables.remove(&table_key);
        }
    }

    /// A rule as the kernel reports it (a rule the same in every field is not added
    /// twice). Rules other than the defaults make IPv4 walk its rules, as in the kernel.
    pub fn mirror_rule(&mut self, rule: Rule) {
        let family = rule.family;
        let custom = !rule.is_default();
        let rules = &mut self.rules[fam_ix(family)];
        if rules.iter().any(|r| same_reported(r, &rule)) {
            return;
        }
        let at = rules
            .iter()
            .position(|r| r.pref > rule.pref)
            .unwrap_or(rules.len());
        rules.insert(at, rule);
        self.mirror_rules_changed(family, custom);
    }

    /// A rule the kernel removed.
    pub fn mirror_del_rule(&mut self, rule: &Rule) {
        let family = rule.family;
        let rules = &mut self.rules[fam_ix(family)];
        if let Some(at) = rules.iter().position(|r| same_reported(r, rule)) {
            rules.remove(at);
            // The kernel walks IPv4 rules from then on (`fib4_rule_delete`).
            self.mirror_rules_changed(family, true);
        }
    }

    /// After a rule change (`custom`: a rule other than the defaults added, or a rule
    /// deleted): the kernel walks IPv4 rules (and keeps `local` and `main` apart) once
    /// any rule other than its defaults was added or any rule deleted; a mirror that
    /// did not see the history takes rules other than the defaults for that. The
    /// defaults arriving one by one in a dump are no such change.
    fn mirror_rules_changed(&mut self, family: Family, custom: bool) {
        if family == Family::V4 {
            let custom = custom || self.rules[0].iter().any(|r| !r.is_default());
            self.v4_custom_rules |= custom;
            self.v4_unmerged |= custom;
        } else {
            for r in &self.rules[1] {
                if let RuleAction::Lookup(t) = r.action {
                    self.v6_tables_made.insert(t);
                }
            }
        }
        self.refresh_rule_links();
    }

    /// A nexthop object as the kernel reports it, new or replaced.
    pub fn mirror_nexthop(&mut self, nh: Nexthop) {
        self.nexthops.insert(nh.id, nh);
    }

    /// A nexthop object the kernel removed (with the routes that used it, as the kernel
    /// removes them unreported).
    pub fn mirror_del_nexthop(&mut self, id: NexthopId) {
        let _ = self.del_nexthop(id);
    }
}

/// Whether an IPv6 route's paths are siblings the kernel keeps as one multipath route:
/// a unicast route whose every path is via a gateway (`rt6_qualify_for_ecmp`).
fn ecmp_v6(r: &RouteBody) -> bool {
    r.kind == RouteType::Unicast
        && !r.own_paths().is_empty()
        && r.own_paths().iter().all(|p| p.gateway.is_some())
}

/// Whether a held rule is the one a report names: the same in every field, its links by
/// name (the held one has them resolved to indices, a report does not).
fn same_reported(held: &Rule, reported: &Rule) -> bool {
    let names = |r: &Rule| {
        let mut r = r.clone();
        for l in [&mut r.iif, &mut r.oif].into_iter().flatten() {
            l.index = None;
        }
        r
    };
    names(held) == names(reported)
}

/// Puts `route`, as the kernel reports it with `op`, into `list`, the routes of its key:
/// an IPv4 route goes after those of its key (`Append`, a dump) or before them (else), or
/// in place of the first (`Replace`); an IPv6 route replaces the route it is of, or its
/// paths join those of a multipath route.
fn put_reported(list: &mut Vec<RouteBody>, family: Family, route: RouteBody, op: RouteOp) {
    match family {
        Family::V4 => {
            if list.contains(&route) {
                // Reported twice (a dump and a queued notification).
                return;
            }
            let op = match op {
                RouteOp::Add | RouteOp::Prepend => RouteOp::Prepend,
                other => other,
            };
            let _ = modify_v4(list, op, route);
        }
        Family::V6 => {
            // The route the report is of: with `NLM_F_REPLACE`, the first of its
            // metric; for a multipath-capable route (every path via a gateway), the
            // one of its metric whose paths are siblings of its; else the same route.
            let at = if op == RouteOp::Replace {
                list.iter().position(|r| r.metric == route.metric)
            } else if ecmp_v6(&route) {
                list.iter()
                    .position(|r| r.metric == route.metric && ecmp_v6(r))
            } else {
                let ends = |r: &RouteBody| -> Vec<(LinkIndex, Option<IpAddr>)> {
                    r.own_paths().iter().map(|p| (p.dev, p.gateway)).collect()
                };
                list.iter().position(|r| {
                    r.metric == route.metric && r.kind == route.kind && ends(r) == ends(&route)
                })
            };
            match at {
                Some(at) if op == RouteOp::Append && ecmp_v6(&route) => {
                    // A path appended: the kernel lists the route's paths in the
                    // order they came, the new ones after.
                    if let Paths::Own(new) = route.paths {
                        list[at].paths.edit(|old| {
                            for p in new.iter() {
                                match old
                                    .iter_mut()
                                    .find(|o| o.dev == p.dev && o.gateway == p.gateway)
                                {
                                    Some(o) => *o = p.clone(),
                                    None => old.push(p.clone()),
                                }
                            }
                        });
                    }
                }
                Some(at) => list[at] = route,
                None => {
                    let at = insert_position(list, &route, true);
                    list.insert(at, route);
                }
            }
        }
    }
}

/// One-route lists a [`Dumping`] keeps to share, at most: a full table through a few
/// peers has a few; a table of routes all different keeps no more than this.
const SINGLES_KEPT: usize = 4096;

/// A table's routes staged by a [`Dumping`]: by key (destination, source), sorted.
type StagedRun = Vec<((Net, Net), RouteList)>;

/// A mirror's state being built from a dump: what [`State::mirror_route`] does with each
/// route of it (`Append`), faster. A dump lists each table's routes in about the order
/// of their keys, so they are staged in a sorted run (each a push, or an insert near
/// the end) and the table built from it at once, its B-tree's nodes full, where
/// inserting each would search a growing B-tree; a new key's one-route list is shared
/// with an equal one made before without being made again; the indexes of what routes
/// use are filled as the routes are staged.
pub struct Dumping {
    state: State,
    /// The routes of tables that held none when the dump began, by key, sorted.
    staged: BTreeMap<(Family, u32), StagedRun>,
    /// One-route lists made, by their route.
    singles: std::collections::HashMap<RouteBody, RouteList, foldhash::fast::RandomState>,
}

impl Dumping {
    /// Builds on `state` (a fresh mirror's).
    pub fn new(mut state: State) -> Dumping {
        state.dumping = true;
        Dumping {
            state,
            staged: BTreeMap::new(),
            singles: Default::default(),
        }
    }

    /// The state, the routes staged so far put in place first: for a message that is
    /// not a route.
    pub fn state_mut(&mut self) -> &mut State {
        debug_assert!(self.state.lent.is_none(), "a message for after the lend");
        self.build_staged();
        &mut self.state
    }

    /// A route of the dump: as [`State::mirror_route`] with [`RouteOp::Append`].
    pub fn route(&mut self, route: Route) {
        let family = route.family();
        debug_assert!(self.state.lent != Some(family), "a route of a family lent");
        // The dump lists IPv4's routes, then IPv6's: IPv4's tables are built as soon as
        // IPv6's begin, while the kernel is still reporting them.
        if family == Family::V6
            && self
                .staged
                .keys()
                .next()
                .is_some_and(|(f, _)| *f == Family::V4)
        {
            self.build_staged_of(Some(Family::V4));
        }
        let table = (family, route.table);
        if self.state.tables.get(&table).is_some_and(|t| !t.is_empty()) {
            // A table held before the dump, or built since: its routes go in one by one.
            return self.state.mirror_route(route, RouteOp::Append);
        }
        self.state.note_kind(&route);
        // Noted as it comes (while the kernel is still reporting the rest), rather than
        // in a sweep of the table once built.
        self.state.note_users(&route);
        let run = self.staged.entry(table).or_default();
        let key = (route.dst, route.src);
        let found = match run.last() {
            None => Err(0),
            Some((last, _)) if *last < key => Err(run.len()),
            Some(_) => run.binary_search_by(|(k, _)| k.cmp(&key)),
        };
        let state = &mut self.state;
        let at_key = (table, route.dst);
        let (id, dst) = (route.table, route.dst);
        match found {
            Ok(at) => {
                let list = &mut run[at].1;
                if family == Family::V4 && list.contains(&route.body) {
                    return;
                }
                let before = Arc::clone(list);
                edit(list, &mut state.shared, &mut state.tally, at_key, |list| {
                    put_reported(list, family, route.body, RouteOp::Append)
                });
                if !Arc::ptr_eq(&before, list) {
                    note(&mut state.journal, family, id, dst);
                }
            }
            Err(at) => {
                // A new key: the list is the route alone, whatever the family.
                let list = match self.singles.get(&route.body) {
                    Some(list) => {
                        state.tally.count(table, route.dst, list, true);
                        Arc::clone(list)
                    }
                    None => {
                        let mut list = no_route();
                        let body = route.body.clone();
                        edit(
                            &mut list,
                            &mut state.shared,
                            &mut state.tally,
                            at_key,
                            |l| put_reported(l, family, body, RouteOp::Append),
                        );
                        if self.singles.len() < SINGLES_KEPT {
                            self.singles.insert(route.body, Arc::clone(&list));
                        }
                        list
                    }
                };
                run.insert(at, (key, list));
                note(&mut state.journal, family, id, dst);
            }
        }
    }

    /// The keys of family `family` staged so far (routes of tables that held none when
    /// the dump began).
    pub fn staged_routes(&self, family: Family) -> usize {
        self.staged
            .iter()
            .filter(|((f, _), _)| *f == family)
            .map(|(_, run)| run.len())
            .sum()
    }

    /// IPv4's routes, built, lent with a copy of what else a snapshot is made of (links,
    /// addresses, rules, nexthop objects), for IPv4's half of the snapshot to be compiled
    /// on another thread ([`State::compile_half`]) while IPv6's routes are still staged
    /// here. Until [`Dumping::put_v4_back`], this state holds no IPv4 route, and
    /// what changes anything but IPv6's routes is for after it (the copy would differ).
    pub fn take_v4(&mut self) -> State {
        self.build_staged_of(Some(Family::V4));
        let state = &mut self.state;
        let (v4, rest) = std::mem::take(&mut state.tables)
            .into_iter()
            .partition(|((f, _), _)| *f == Family::V4);
        state.tables = rest;
        // What routes use and share stays here: the copy is of the small rest.
        let journal = state.journal.take();
        let shared = std::mem::take(&mut state.shared);
        let tally = std::mem::take(&mut state.tally);
        let object_users = std::mem::take(&mut state.object_users);
        let link_users = std::mem::take(&mut state.link_users);
        let prefsrc_users = std::mem::take(&mut state.prefsrc_users);
        let mut part = state.clone();
        state.lent = Some(Family::V4);
        state.journal = journal;
        state.shared = shared;
        state.tally = tally;
        state.object_users = object_users;
        state.link_users = link_users;
        state.prefsrc_users = prefsrc_users;
        part.tables = v4;
        part
    }

    /// IPv6's routes staged built into the state, which IPv6's half of a snapshot is then
    /// compiled from ([`crate::compile::Half::of_v6`]; IPv4's lent by
    /// [`Dumping::take_v4`]).
    pub(crate) fn build_v6(&mut self) -> &State {
        self.build_staged_of(Some(Family::V6));
        &self.state
    }

    /// IPv4's routes lent by [`Dumping::take_v4`] back in place.
    pub fn put_v4_back(&mut self, part: State) {
        self.state.lent = None;
        for (key, table) in part.tables {
            // Moved whole, its B-tree as built (none of IPv4's came meanwhile).
            match self.state.tables.entry(key) {
                std::collections::btree_map::Entry::Occupied(mut held)
                    if !held.get().is_empty() =>
                {
                    held.get_mut().extend(table)
                }
                std::collections::btree_map::Entry::Occupied(mut held) => *held.get_mut() = table,
                std::collections::btree_map::Entry::Vacant(at) => {
                    at.insert(table);
                }
            }
        }
    }

    /// The state, the dump's routes in place.
    pub fn finish(mut self) -> State {
        self.build_staged();
        self.state.dumping = false;
        self.state
    }

    /// Builds the staged tables.
    fn build_staged(&mut self) {
        self.build_staged_of(None);
    }

    /// Builds the staged tables of `family` (all if `None`).
    fn build_staged_of(&mut self, family: Option<Family>) {
        let (built, kept) = std::mem::take(&mut self.staged)
            .into_iter()
            .partition(|((f, _), _)| family.is_none_or(|x| x == *f));
        self.staged = kept;
        let built: BTreeMap<(Family, u32), StagedRun> = built;
        for ((family, id), run) in built {
            let table = self.state.tables.entry((family, id)).or_default();
            // (Staged only while the table held nothing.)
            debug_assert!(table.is_empty());
            // Sorted and of distinct keys: built at once. (What the routes use was
            // noted as they were staged.)
            *table = run.into_iter().collect();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::Half;
    use rand::Rng;

    /// The default rules reported one at a time, as a dump reports them, leave IPv4
    /// merged and its sources checked the quick way; another rule, or a deletion, does
    /// not.
    #[test]
    fn a_dump_of_the_default_rules_is_no_custom_rule() {
        let mut state = State::mirrored();
        for mut rule in Rule::defaults(Family::V4) {
            // As the kernel reports its own.
            rule.protocol = crate::names::PROTO_KERNEL;
            state.mirror_rule(rule);
            assert!(!state.v4_custom_rules(), "{:?}", state.rules[0]);
        }
        assert!(!state.v4_unmerged());
        let mut added = state.clone();
        let mut rule = Rule::defaults(Family::V4)[1].clone();
        rule.pref = 100;
        added.mirror_rule(rule);
        assert!(added.v4_custom_rules() && added.v4_unmerged());
        let mut deleted = state.clone();
        let mut default = Rule::defaults(Family::V4)[2].clone();
        default.protocol = crate::names::PROTO_KERNEL;
        deleted.mirror_del_rule(&default);
        assert!(deleted.v4_custom_rules() && deleted.v4_unmerged());
    }

    /// A random route of a dump: keys drawn from a few so that each recurs, near and far
    /// from where it came first; IPv6 routes through gateways (whose paths join one
    /// multipath route) and not; nexthop objects, preferred sources, reject routes.
    fn dumped_route(rng: &mut impl Rng) -> Route {
        let v6 = rng.gen_bool(0.4);
        let (family, len) = if v6 {
            (Family::V6, [0, 32, 48, 64, 128][rng.gen_range(0..5)])
        } else {
            (Family::V4, [0, 8, 16, 24, 32][rng.gen_range(0..5)])
        };
        let addr = if v6 {
            IpAddr::V6(std::net::Ipv6Addr::from(
                (0x2001_0db8_u128 << 96) | (u128::from(rng.gen_range(0..6u8)) << 80),
            ))
        } else {
            IpAddr::V4(std::net::Ipv4Addr::from(
                0x0a00_0000 | (u32::from(rng.gen_range(0..6u8)) << 16),
            ))
        };
        let dst = Net::new(addr, len)
            .or_else(|| Net::new(addr, family.bits()))
            .unwrap_or(Net::default_of(family));
        let dev = rng.gen_range(1..4);
        let gateway = rng.gen_bool(0.7).then(|| match family {
            Family::V4 => IpAddr::V4(std::net::Ipv4Addr::new(10, 9, 0, rng.gen_range(1..4))),
            Family::V6 => IpAddr::V6(std::net::Ipv6Addr::new(
                0xfe80,
                0,
                0,
                0,
                0,
                0,
                0,
                rng.gen_range(1..4),
            )),
        });
        let kind = match rng.gen_range(0..10) {
            0 => RouteType::Blackhole,
            1 => RouteType::Local,
            _ => RouteType::Unicast,
        };
        let paths = match (kind, rng.gen_range(0..8)) {
            (RouteType::Blackhole, _) => Paths::None,
            (_, 0) => Paths::Object(rng.gen_range(1..3)),
            _ => Paths::own(vec![Path {
                gateway,
                dev,
                weight: 1,
                onlink: false,
                dead: false,
                scope: if gateway.is_some() {
                    SCOPE_LINK
                } else {
                    SCOPE_HOST
                },
            }]),
        };
        let prefsrc = (family == Family::V4 && rng.gen_bool(0.2))
            .then(|| IpAddr::V4(std::net::Ipv4Addr::new(10, 9, 0, 100)));
        Route::new(
            dst,
            RouteBody {
                table: [254, 255, 100][rng.gen_range(0..3)],
                src: Net::default_of(family),
                tos: [0, 0, 0, 8][rng.gen_range(0..4)],
                metric: [0, 0, 100, 1024][rng.gen_range(0..4)],
                protocol: [2, 3, 186][rng.gen_range(0..3)],
                scope: 0,
                kind,
                prefsrc,
                mtu: None,
                hoplimit: None,
                paths,
                pref: 0,
            },
        )
    }

    /// A dump built through [`Dumping`] is the state its routes make one at a time:
    /// the same tables, counts, indexes of users and kinds noted, whatever the order
    /// (keys coming again far from where they came first), twice reported included.
    #[test]
    fn a_dump_built_at_once_is_the_dump_applied_route_by_route() {
        use rand::SeedableRng;
        for seed in 0..200u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let routes: Vec<Route> = (0..rng.gen_range(1..300))
                .map(|_| dumped_route(&mut rng))
                .collect();
            let mut one_by_one = State::mirrored();
            // A table held before the dump takes its routes one by one in both.
            let held = Route::new(
                Net::new(IpAddr::V4(std::net::Ipv4Addr::new(10, 7, 0, 0)), 16).unwrap(),
                RouteBody {
                    table: 100,
                    ..routes[0].body.clone()
                },
            );
            let with_held = rng.gen_bool(0.5);
            if with_held {
                one_by_one.mirror_route(held.clone(), RouteOp::Append);
            }
            let mut dumping = Dumping::new(one_by_one.clone());
            for (i, r) in routes.iter().enumerate() {
                one_by_one.mirror_route(r.clone(), RouteOp::Append);
                dumping.route(r.clone());
                // A message that is not a route, midway: what is staged is built.
                if i == routes.len() / 2 && seed % 3 == 0 {
                    let _ = dumping.state_mut();
                }
            }
            let at_once = dumping.finish();
            assert_eq!(one_by_one.tables, at_once.tables, "seed {seed}");
            let debug = |s: &State| {
                format!(
                    "{:?} {:?} {}",
                    s.tally, s.v6_tables_made, s.v4_custom_local_routes
                )
            };
            assert_eq!(debug(&one_by_one), debug(&at_once), "seed {seed}");
            // Each index of users holds every destination whose routes use the thing,
            // built at once as route by route; built at once, none but those of routes
            // that used the thing when they came (nothing is swept while a dump is
            // built; a route reported again for its destination leaves the first's).
            type Index<K> = BTreeMap<K, Users>;
            type Sets<K> = BTreeMap<K, BTreeSet<(Family, u32, Net)>>;
            fn holds<K: Ord + std::fmt::Debug>(
                at_once: &Index<K>,
                one_by_one: &Index<K>,
                (live, came): (Sets<K>, Sets<K>),
            ) {
                for (k, dsts) in &live {
                    let held = at_once[k].dsts.as_ref().expect("indexed");
                    assert!(held.is_superset(dsts), "{k:?}: {held:?} {dsts:?}");
                    let noted = one_by_one[k].dsts.as_ref().expect("indexed");
                    assert!(noted.is_superset(dsts), "{k:?}: {noted:?} {dsts:?}");
                }
                for (k, u) in at_once {
                    let held = u.dsts.as_ref().expect("indexed");
                    assert!(came.get(k).is_some_and(|c| c.is_superset(held)), "{k:?}");
                }
            }
            /// The destinations of `routes` by what they use.
            #[allow(clippy::type_complexity)]
            fn users_of<'a>(
                routes: impl Iterator<Item = ((Family, u32, Net), &'a RouteBody)>,
            ) -> (Sets<NexthopId>, Sets<LinkIndex>, Sets<IpAddr>) {
                let (mut objects, mut links, mut prefsrcs) =
                    (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
                for (at, r) in routes {
                    if let Some(src) = r.prefsrc {
                        prefsrcs.entry(src).or_insert_with(BTreeSet::new).insert(at);
                    }
                    if let Paths::Object(id) = r.paths {
                        objects.entry(id).or_insert_with(BTreeSet::new).insert(at);
                    }
                    for p in r.own_paths() {
                        links.entry(p.dev).or_insert_with(BTreeSet::new).insert(at);
                    }
                }
                (objects, links, prefsrcs)
            }
            let live = users_of(at_once.tables.iter().flat_map(|(&(f, t), routes)| {
                routes
                    .iter()
                    .flat_map(move |((dst, _), list)| list.iter().map(move |r| ((f, t, *dst), r)))
            }));
            let came = users_of(
                routes
                    .iter()
                    .chain(with_held.then_some(&held))
                    .map(|r| ((r.family(), r.body.table, r.dst), &r.body)),
            );
            holds(
                &at_once.object_users,
                &one_by_one.object_users,
                (live.0, came.0),
            );
            holds(
                &at_once.link_users,
                &one_by_one.link_users,
                (live.1, came.1),
            );
            holds(
                &at_once.prefsrc_users,
                &one_by_one.prefsrc_users,
                (live.2, came.2),
            );
        }
    }

    /// A dump's IPv4 routes lent and compiled apart while its IPv6 routes are staged,
    /// then IPv6's compiled, the two halves joined answer every lookup as the whole state
    /// compiled at once; the state is whole again, as one built route by route.
    #[test]
    fn a_snapshot_compiled_in_two_halves_answers_as_one_compiled_whole() {
        use crate::query::Query;
        use rand::SeedableRng;
        let links = "\
link add a0 type veth peer name b0
link add a1 type veth peer name b1
link set a0 up
link set b0 up
link set a1 up
link set b1 up
";
        let addresses = "\
addr add 10.9.0.100/24 dev a0
addr add 10.9.1.1/24 dev a1
addr add fe80::100/64 dev a0
route add 10.9.0.0/24 dev a0 proto kernel scope link
route add 10.9.1.0/24 dev a1 proto kernel scope link
route add fe80::/64 dev a0 proto kernel
rule add from ::/0 lookup local pref 0
rule add from ::/0 lookup main pref 32766
nexthop add id 1 via 10.9.0.1 dev a0
nexthop add id 2 dev a1
";
        // Lookups answered with a hop, by family: both halves are compared.
        let mut answered = [0usize; 2];
        for seed in 0..60u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut base = State::mirrored();
            crate::config::apply_text(&mut base, "links", links).unwrap();
            // The kernel reports the carriers of a mirror's links.
            let indexes: Vec<LinkIndex> = base.links.keys().copied().collect();
            for index in indexes {
                base.carriers.insert(index, true);
            }
            crate::config::apply_text(&mut base, "addresses", addresses).unwrap();
            // A dump lists IPv4's routes, then IPv6's.
            let mut routes: Vec<Route> = (0..rng.gen_range(1..400))
                .map(|_| dumped_route(&mut rng))
                .collect();
            routes.sort_by_key(|r| r.family() == Family::V6);
            let mut whole = base.clone();
            let mut dumping = Dumping::new(base);
            let mut early = None;
            for r in &routes {
                whole.mirror_route(r.clone(), RouteOp::Append);
                if r.family() == Family::V6 && early.is_none() {
                    let v4 = dumping.take_v4();
                    assert!(v4.tables.keys().all(|(f, _)| *f == Family::V4));
                    assert!(dumping.state.tables.keys().all(|(f, _)| *f == Family::V6));
                    let compiled = v4.compile_half(Family::V4);
                    early = Some((v4, compiled));
                }
                dumping.route(r.clone());
            }
            let halves = early.map(|(v4, compiled)| {
                let v6 = Half::of_v6(&mut dumping);
                dumping.put_v4_back(v4);
                (compiled, v6)
            });
            let state = dumping.finish();
            assert_eq!(state.tables, whole.tables, "seed {seed}");
            assert_eq!(state.rules, whole.rules, "seed {seed}");
            let Some((v4, v6)) = halves else {
                continue;
            };
            let halves = Half::join(v4, v6);
            let at_once = state.snapshot();
            for r in &routes {
                for addr in [r.dst.addr(), r.dst.last()] {
                    for iif in [None, Some(2)] {
                        let q = Query {
                            iif,
                            src: iif.map(|_| match addr {
                                IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::new(10, 9, 0, 7)),
                                IpAddr::V6(_) => "fe80::7".parse().unwrap(),
                            }),
                            ..Query::to(addr)
                        };
                        assert_eq!(halves.route(&q), at_once.route(&q), "seed {seed}: {q:?}");
                        let hop = at_once.lookup(&q).map(crate::hop::Hop::from);
                        answered[(q.dst.is_ipv6()) as usize] += hop.is_ok() as usize;
                        assert_eq!(
                            halves.lookup(&q).map(crate::hop::Hop::from),
                            hop,
                            "seed {seed}: {q:?}"
                        );
                    }
                }
            }
        }
        assert!(answered.iter().all(|&n| n > 1000), "{answered:?}");
    }

    /// While a dump is built, the indexes of users, noted as routes are staged and swept
    /// as they grow, keep every destination (routes staged, or IPv4's lent, are out of
    /// sight, not gone): a link and a nexthop object used by thousands of routes of both
    /// families still index every one of them once the routes are in place, and the
    /// tables are moved back whole.
    #[test]
    fn indexes_swept_while_ipv4_is_lent_keep_its_destinations() {
        let mut base = State::mirrored();
        crate::config::apply_text(
            &mut base,
            "links",
            "link add a0 type veth peer name b0\nlink set a0 up\nlink set b0 up",
        )
        .unwrap();
        let a0 = base.link_by_name("a0").unwrap().index;
        base.carriers.insert(a0, true);
        let mut dumping = Dumping::new(base);
        let route = |dst: Net, paths: Paths| {
            let family = dst.family();
            Route::new(
                dst,
                RouteBody {
                    table: 254,
                    src: Net::default_of(family),
                    tos: 0,
                    metric: 0,
                    protocol: 186,
                    scope: 0,
                    kind: RouteType::Unicast,
                    prefsrc: None,
                    mtu: None,
                    hoplimit: None,
                    paths,
                    pref: 0,
                },
            )
        };
        let through_a0 = || {
            Paths::own(vec![Path {
                gateway: None,
                dev: a0,
                weight: 1,
                onlink: false,
                dead: false,
                scope: SCOPE_LINK,
            }])
        };
        let mut v4 = Vec::new();
        for i in 0..6000u32 {
            let dst = Net::new(
                IpAddr::V4(std::net::Ipv4Addr::from(0x0b00_0000 | (i << 8))),
                24,
            )
            .unwrap();
            let paths = if i % 2 == 0 {
                through_a0()
            } else {
                Paths::Object(7)
            };
            v4.push(dst);
            dumping.route(route(dst, paths));
        }
        let v4_part = dumping.take_v4();
        for i in 0..6000u128 {
            let dst = Net::new(
                IpAddr::V6(std::net::Ipv6Addr::from(
                    (0x2001_0db8_u128 << 96) | (i << 64),
                )),
                64,
            )
            .unwrap();
            let paths = if i % 2 == 0 {
                through_a0()
            } else {
                Paths::Object(7)
            };
            dumping.route(route(dst, paths));
        }
        let _v6_half = Half::of_v6(&mut dumping);
        dumping.put_v4_back(v4_part);
        let state = dumping.finish();
        let links = state.link_users[&a0].dsts.as_ref().expect("indexed");
        let objects = state.object_users[&7].dsts.as_ref().expect("indexed");
        for (i, dst) in v4.iter().enumerate() {
            let index = if i % 2 == 0 { links } else { objects };
            assert!(index.contains(&(Family::V4, 254, *dst)), "{dst}");
        }
        assert_eq!(links.len() + objects.len(), 12_000);
        assert_eq!(state.tables[&(Family::V4, 254)].len(), 6000);
    }

    /// The `i`-th destination an index of users notes in the tests below: host `i` of
    /// IPv4's `main`.
    fn dst(i: u32) -> (Family, u32, Net) {
        let host = Net::new(IpAddr::V4(std::net::Ipv4Addr::from(i)), 32);
        (Family::V4, 254, host.expect("a host"))
    }

    /// The `i` of destination `d` made by [`dst`].
    fn number(d: Net) -> u32 {
        match d.addr() {
            IpAddr::V4(a) => u32::from(a),
            IpAddr::V6(_) => unreachable!("IPv4 hosts only"),
        }
    }

    /// An index of users with no bound (a nexthop object's), its destinations coming and
    /// going: no note checks more than two others (none sweeps the index whole), and the
    /// index holds at most about twice the destinations still in use.
    #[test]
    fn an_index_of_users_is_swept_a_few_destinations_a_note() {
        let live = 100u32;
        let mut users = Users::default();
        let mut most = 0;
        for i in 0..10_000u32 {
            let checks = std::cell::Cell::new(0u32);
            // The last `live` noted are still used; the one being noted is not held yet.
            users.note(
                dst(i),
                usize::MAX,
                Some(|&(_, _, d): &(Family, u32, Net)| {
                    checks.set(checks.get() + 1);
                    number(d) + live > i && number(d) != i
                }),
            );
            assert!(checks.get() <= SWEPT_A_NOTE as u32, "note {i}");
            most = most.max(users.dsts.as_ref().expect("indexed").len());
        }
        assert!(most <= 2 * live as usize + 2, "{most} held");
        let held = users.dsts.as_ref().expect("indexed");
        assert!((0..live).all(|k| held.contains(&dst(9_999 - k))));
        // Each destination noted right after the one the sweep checked last, and that
        // one's routes going: the sweep still checks two others a note, and the index
        // stays within a few times what is in use (counting the one noted among the two,
        // it grew without bound: checked).
        let mut users = Users::default();
        let mut used: BTreeSet<u32> = (0..live).map(|k| k << 20).collect();
        for &k in &used {
            users.note(dst(k), usize::MAX, None::<fn(&(Family, u32, Net)) -> bool>);
        }
        let mut most = 0;
        for _ in 0..80_000 {
            // As many in use throughout: another goes if that one went already.
            let last = users.swept_to.map_or(0, |(_, _, d)| number(d));
            if !used.remove(&last) {
                let other = *used.first().expect("some in use");
                used.remove(&other);
            }
            let held = users.dsts.as_ref().expect("indexed");
            let new = (last + 1..)
                .find(|k| !held.contains(&dst(*k)))
                .expect("room");
            used.insert(new);
            users.note(
                dst(new),
                usize::MAX,
                Some(|&(_, _, d): &(Family, u32, Net)| {
                    number(d) != new && used.contains(&number(d))
                }),
            );
            most = most.max(users.dsts.as_ref().expect("indexed").len());
        }
        assert!(
            most <= 5 * live as usize,
            "{most} held, noted after the sweep"
        );
    }

    /// An index of users near its bound, its destinations coming and going: one whose
    /// sweep at the bound leaves it more than half full gives up (rather than be swept
    /// whole every few notes); one left half empty goes on, swept a few times a note at
    /// most.
    #[test]
    fn an_index_of_users_at_its_bound_gives_up_or_is_swept_seldom() {
        for (live, gives_up) in [(99u32, true), (40, false)] {
            let mut users = Users::default();
            let checks = std::cell::Cell::new(0u32);
            for i in 0..1000u32 {
                // The last `live` noted are still used.
                users.note(
                    dst(i),
                    100,
                    Some(|&(_, _, d): &(Family, u32, Net)| {
                        checks.set(checks.get() + 1);
                        number(d) + live > i
                    }),
                );
            }
            assert_eq!(users.dsts.is_none(), gives_up, "{live} live");
            assert!(
                checks.get() < 3 * 1000,
                "{live} live: {} checks",
                checks.get()
            );
        }
    }
}
