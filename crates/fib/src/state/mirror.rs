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
        self.note_users(&route);
        let family = route.family();
        if family == Family::V6 {
            self.v6_tables_made.insert(route.table);
        }
        let local = family == Family::V4
            && route.kind == RouteType::Local
            && route.protocol != PROTO_KERNEL;
        self.v4_custom_local_routes |= local;
        let (table, dst) = (route.table, route.dst);
        let list = self
            .tables
            .entry((family, route.table))
            .or_default()
            .entry((route.dst, route.src))
            .or_insert_with(no_route);
        let at_key = ((family, route.table), route.dst);
        let route = route.body;
        if family == Family::V4 && list.contains(&route) {
            // Reported twice (a dump and a queued notification), or again as it is (the
            // kernel reports every route using a nexthop object that was replaced).
            return;
        }
        // A list the same as before is the same interned list: the destination is noted
        // only if its routes changed (an IPv6 route reported again as it is).
        let before = Arc::clone(list);
        edit(
            list,
            &mut self.shared,
            &mut self.tally,
            at_key,
            |list| match family {
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
                            r.metric == route.metric
                                && r.kind == route.kind
                                && ends(r) == ends(&route)
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
            },
        );
        if !Arc::ptr_eq(&before, list) {
            note(&mut self.journal, family, table, dst);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
