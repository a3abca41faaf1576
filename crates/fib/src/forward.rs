//! The forwarding lookup: what a packet needs from a route query, and nothing more.
//!
//! [`Snapshot::route`] answers as `ip route get` does, with the source address chosen,
//! every path listed and the answer's flags; a packet needs only where to go. [`Hop`] is
//! that: the route's type and table, the output link, the gateway to send through, the
//! route's MTU. [`Snapshot::lookup`] finds it with the same checks, rule walk and table
//! lookups as `route` (so both always agree), and allocates nothing.
//!
//! [`Snapshot::lookup_batch`] does the same for many flows, [`BATCH`] at a time, and keeps
//! them batched through rules and tables: each round moves every flow still walking to
//! the next rule that looks up a table, then looks up each table once for all the flows
//! that reached it ([`fibre_lpm::Table::lookup_batch`], whose searches overlap in memory),
//! then lets each flow's rule take or refuse its table's answer. While no rule the walk
//! reaches depends on the flow (the default rules, or rules that only look up, jump or
//! reject), there is no walk at all: the tables it would visit are merged into one
//! structure when the snapshot is compiled, and a batch is one batched search of it.
//!
//! The source of an IPv4 flow arriving on a link is checked on the same plain answers:
//! the quick check (is the source this host's or a broadcast address) by two binary
//! searches, the kernel's reverse lookup, where it is needed, by a second plain walk.

use crate::classify::CompiledRule;
use crate::classify::FlowKey;
use crate::link::LinkIndex;
use crate::multipath::{self, Multipath};
use crate::net::{addr_bits, Family};
use crate::query::{NoRoute, Query};
use crate::route::Path;
use crate::route::{Route, RouteType};
use crate::snapshot::{sent_via, Concluded, Plain, PlainTable};
use crate::snapshot::{Checked, Direct, FamilyFib, Prepared, Snapshot, Step, WalkFor};
use std::net::IpAddr;

/// Flows a batch keeps together through rules and tables.
pub const BATCH: usize = 64;

/// Where a flow goes: what a packet needs from its route.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Hop {
    /// The route's type (`local` for this host's addresses).
    pub kind: RouteType,
    /// The table that answered (`None` for an IPv4 flow sent out of its `oif` with no
    /// route).
    pub table: Option<u32>,
    /// The output link (the loopback for local delivery).
    pub dev: LinkIndex,
    /// The gateway to send through; `None`: the destination is on the link.
    pub gateway: Option<IpAddr>,
    /// The route's MTU, if it sets one.
    pub mtu: Option<u32>,
}

impl Snapshot {
    /// Where a flow goes: the same answer as [`Snapshot::route`] (its type, table, link
    /// and gateway), without building the rest of it.
    pub fn lookup(&self, q: &Query) -> Result<Hop, NoRoute> {
        let c = self.check(q)?;
        if c.oif.is_none() && self.plain_answers_hold(&c, q.dst) {
            if let Some(answer) = self.plain_walk(&c, q) {
                if let Some(answer) = self.source_checked(&c, q, answer) {
                    return answer;
                }
            }
        }
        self.full_lookup(&c.with(q))
    }

    /// A plain walk's answer once the source of a flow arriving on a link is checked as
    /// the kernel checks it ([`Snapshot::validate_source`]), the flow back to the source
    /// looked up on the plain answers too; `None` when the full lookup must decide.
    #[inline]
    fn source_checked(
        &self,
        c: &Checked,
        q: &Query,
        answer: Result<Hop, NoRoute>,
    ) -> Option<Result<Hop, NoRoute>> {
        let Ok(h) = &answer else {
            return Some(answer);
        };
        if c.input.is_none() || !(self.input_needs_source_check(c, q.src) || self.sends_back(c, h))
        {
            // The quick check passes: the source is not this host's.
            return Some(answer);
        }
        let src = Some(q.src.unwrap_or(c.family.any()));
        let back = |flow: &Query, iif: LinkIndex| {
            // Arriving on `iif`: a multipath answer's paths are all of the route's type.
            let bc = Checked {
                family: Family::V4,
                oif: None,
                iif,
                input: Some(iif),
            };
            Some(self.plain_walk(&bc, flow)?.ok().map(|h| h.kind))
        };
        match self.check_source(q, c.input, src, h.kind, h.dev, back)? {
            Ok(()) => Some(answer),
            Err(e) => Some(Err(e)),
        }
    }

    /// Whether `hop` forwards an arriving IPv4 flow back out of its input link.
    #[inline]
    fn sends_back(&self, c: &Checked, h: &Hop) -> bool {
        c.family == Family::V4
            && h.kind == RouteType::Unicast
            && Some(h.dev) == c.input
            && c.input != Some(self.lo)
    }

    /// The lookup through the full walk, for what plain answers cannot decide.
    fn full_lookup(&self, p: &Prepared) -> Result<Hop, NoRoute> {
        let walk = self.walk(&p.q, p.family, p.oif, p.iif, 0, WalkFor::Flow);
        self.hop(p, walk)
    }

    /// The rule walk of a flow with no output link on the tables' [`Plain`] answers;
    /// `None` when one of them depends on the flow.
    fn plain_walk(&self, c: &Checked, q: &Query) -> Option<Result<Hop, NoRoute>> {
        let fib = self.fib(c.family);
        if let Some(direct) = &fib.direct {
            if !fib.rules.has_selective() {
                return self.direct_answer(fib, direct, c, q);
            }
        }
        let key = FlowKey::new(q, None, c.iif);
        let sets = fib.rules.sets(&key);
        if let Some(direct) = &fib.direct {
            if !fib.rules.any_selective_match(&key, sets) {
                return self.direct_answer(fib, direct, c, q);
            }
        }
        let candidates = fib.rules.candidates_with(&key, sets);
        let mut from = 0;
        loop {
            let (rule, table) = match self.next_lookup(fib, &candidates, from) {
                Step::Lookup { rule, table } => (rule, table),
                Step::Done(e) => return Some(Err(e)),
            };
            let (search, after) = fib.target(rule, table);
            let t = fib.searched(search);
            let plain = t.plain(q.dst);
            match plain_step(&fib.rules.list[rule], t, plain, c, q, &self.multipath) {
                PlainStep::Next => from = after,
                PlainStep::Done(answer) => return Some(answer),
                PlainStep::Full => return None,
            }
        }
    }

    /// The answer of a walk that no rule's selectors decide: one search.
    #[inline]
    fn direct_answer(
        &self,
        fib: &FamilyFib,
        direct: &Direct,
        c: &Checked,
        q: &Query,
    ) -> Option<Result<Hop, NoRoute>> {
        let t = direct.plain(&fib.tables);
        match t.plain(q.dst) {
            Plain::Miss | Plain::Thrown => Some(Err(direct.miss)),
            Plain::Reject(e) => Some(Err(e)),
            Plain::Flow => None,
            plain => Some(Ok(
                t.hops[plain_hop(t, plain, c, q, &self.multipath)? as usize]
            )),
        }
    }

    /// [`Snapshot::lookup`] for many flows: `out[i]` is `flows[i]`'s answer. Flows of both
    /// families may be mixed.
    ///
    /// # Panics
    /// If `out` is shorter than `flows`.
    pub fn lookup_batch(&self, flows: &[Query], out: &mut [Result<Hop, NoRoute>]) {
        assert!(out.len() >= flows.len(), "one answer for each flow");
        for (flows, out) in flows.chunks(BATCH).zip(out.chunks_mut(BATCH)) {
            self.lookup_chunk(flows, out);
        }
    }

    /// The hop a concluded walk gives.
    fn hop(&self, p: &Prepared, walk: Result<(&Route, u8, u32), NoRoute>) -> Result<Hop, NoRoute> {
        let (route, table) = match self.conclude(p, walk)? {
            Concluded::Route(route, table) => (route, table),
            Concluded::Bare(oif) => {
                return Ok(Hop {
                    kind: RouteType::Unicast,
                    table: None,
                    dev: oif,
                    gateway: None,
                    mtu: None,
                })
            }
        };
        let oif = self.path_oif(&p.q, p.family, route);
        let path = self
            .choose_path(route, oif, &p.q, p.input.is_some())
            .ok_or(NoRoute::NetworkUnreachable)?;
        self.validate_source(&p.q, p.input, route, path.dev)?;
        Ok(self.hop_of(route, table, path, p.input.is_some()))
    }

    /// The hop of `route` in `table` through `path`: local delivery by the loopback (and
    /// a forwarded broadcast too), the gateway only where the path sends through it.
    pub(crate) fn hop_of(&self, route: &Route, table: u32, path: &Path, input: bool) -> Hop {
        let local = matches!(route.kind, RouteType::Local | RouteType::Anycast);
        let brd = route.kind == RouteType::Broadcast;
        Hop {
            kind: route.kind,
            table: Some(table),
            dev: if local || (brd && input) {
                self.lo
            } else {
                path.dev
            },
            gateway: if local { None } else { sent_via(path) },
            mtu: route.mtu,
        }
    }

    /// Up to [`BATCH`] flows, round by round.
    fn lookup_chunk(&self, flows: &[Query], out: &mut [Result<Hop, NoRoute>]) {
        let n = flows.len();
        debug_assert!(n <= BATCH);
        /// Where one flow stands.
        #[derive(Clone, Copy)]
        enum At {
            /// Done (or refused before the walk).
            Done,
            /// Walking, from this rule on.
            From(usize),
            /// Rule `rule` searches `search` of the flow's family
            /// ([`FamilyFib::target`]); without an answer the walk goes on from `after`.
            Lookup {
                rule: usize,
                search: usize,
                after: usize,
            },
        }
        let mut at = [At::Done; BATCH];
        // The flows' checks: small, so a batch copies little.
        let mut checked: [Option<Checked>; BATCH] = [None; BATCH];
        for i in 0..n {
            let q = &flows[i];
            match self.check(q) {
                // A flow with an output link takes the full lookup, and so does one
                // the plain answers do not hold for.
                Ok(c) if c.oif.is_some() || !self.plain_answers_hold(&c, q.dst) => {
                    out[i] = self.full_lookup(&c.with(q))
                }
                Ok(c) => {
                    checked[i] = Some(c);
                    at[i] = At::From(0);
                }
                Err(e) => out[i] = Err(e),
            }
        }
        let mut keys4 = [0u32; BATCH];
        let mut keys6 = [0u128; BATCH];
        let mut members = [0usize; BATCH];
        let mut found = [None; BATCH];
        // The flows' keys and bit sets in the rule index, found once for all rounds.
        let mut keys: [Option<FlowKey>; BATCH] = [None; BATCH];
        let mut sets: [Option<crate::classify::Sets>; BATCH] = [None; BATCH];
        // The flows no rule's selectors match, of a family where such a walk is one
        // search: all in one batched search.
        for family in [Family::V4, Family::V6] {
            let fib = self.fib(family);
            let Some(direct) = &fib.direct else { continue };
            let selective = fib.rules.has_selective();
            let t = direct.plain(&fib.tables);
            let mut count = 0;
            for i in 0..n {
                let Some(c) = checked[i].filter(|c| c.family == family) else {
                    continue;
                };
                if selective {
                    let key = FlowKey::new(&flows[i], None, c.iif);
                    let s = fib.rules.sets(&key);
                    keys[i] = Some(key);
                    sets[i] = s;
                    if fib.rules.any_selective_match(&key, s) {
                        continue;
                    }
                }
                members[count] = i;
                match flows[i].dst {
                    IpAddr::V4(a) => keys4[count] = u32::from(a),
                    IpAddr::V6(a) => keys6[count] = u128::from(a),
                }
                count += 1;
            }
            if count == 0 {
                continue;
            }
            t.lookup_batch(
                family,
                &keys4[..count],
                &keys6[..count],
                &mut found[..count],
            );
            for k in 0..count {
                let j = members[k];
                let (c, q) = (checked[j].expect("walking"), &flows[j]);
                // Each answer written once, straight to its place.
                let answer = match found[k].map_or(Plain::Miss, Plain::decode) {
                    Plain::Miss | Plain::Thrown => Some(Err(direct.miss)),
                    Plain::Reject(e) => Some(Err(e)),
                    Plain::Flow => None,
                    plain => plain_hop(t, plain, &c, q, &self.multipath)
                        .and_then(|h| self.source_checked(&c, q, Ok(t.hops[h as usize]))),
                };
                out[j] = match answer {
                    Some(answer) => answer,
                    None => self.full_lookup(&c.with(q)),
                };
                at[j] = At::Done;
            }
        }
        if !at[..n].iter().any(|a| matches!(a, At::From(_))) {
            return;
        }
        // The rest walk the rules.
        for i in 0..n {
            if let (At::From(_), Some(c), None) = (at[i], checked[i], keys[i]) {
                let key = FlowKey::new(&flows[i], None, c.iif);
                sets[i] = self.fib(c.family).rules.sets(&key);
                keys[i] = Some(key);
            }
        }
        loop {
            // Every walking flow to its next table (or to its end).
            for i in 0..n {
                let At::From(from) = at[i] else { continue };
                let c = checked[i].expect("walking");
                let fib = self.fib(c.family);
                let key = keys[i].as_ref().expect("walking");
                let candidates = fib.rules.candidates_with(key, sets[i]);
                at[i] = match self.next_lookup(fib, &candidates, from) {
                    Step::Lookup { rule, table } => {
                        let (search, after) = fib.target(rule, table);
                        At::Lookup {
                            rule,
                            search,
                            after,
                        }
                    }
                    Step::Done(e) => {
                        out[i] = self.hop(&c.with(&flows[i]), Err(e));
                        At::Done
                    }
                };
            }
            // Each table once, for all the flows at it.
            let mut any = false;
            for first in 0..n {
                let At::Lookup { search, .. } = at[first] else {
                    continue;
                };
                any = true;
                let family = checked[first].expect("walking").family;
                let mut count = 0;
                for (j, a) in at.iter().enumerate().take(n).skip(first) {
                    let same = matches!(*a, At::Lookup { search: s, .. } if s == search)
                        && checked[j].expect("walking").family == family;
                    if same {
                        members[count] = j;
                        let dst = addr_bits(flows[j].dst);
                        keys4[count] = dst as u32;
                        keys6[count] = dst;
                        count += 1;
                    }
                }
                let fib = self.fib(family);
                let t = fib.searched(search);
                t.lookup_batch(
                    family,
                    &keys4[..count],
                    &keys6[..count],
                    &mut found[..count],
                );
                for k in 0..count {
                    let j = members[k];
                    let At::Lookup { rule, after, .. } = at[j] else {
                        unreachable!("a member is at a lookup")
                    };
                    let (c, q) = (checked[j].expect("walking"), &flows[j]);
                    let plain = found[k].map_or(Plain::Miss, Plain::decode);
                    let step = plain_step(&fib.rules.list[rule], t, plain, &c, q, &self.multipath);
                    at[j] = match step {
                        PlainStep::Next => At::From(after),
                        PlainStep::Done(answer) => {
                            out[j] = match self.source_checked(&c, q, answer) {
                                Some(answer) => answer,
                                None => self.full_lookup(&c.with(q)),
                            };
                            At::Done
                        }
                        PlainStep::Full => {
                            out[j] = self.full_lookup(&c.with(q));
                            At::Done
                        }
                    };
                }
            }
            if !any {
                return;
            }
        }
    }
}

/// What a rule makes of a table's plain answer.
enum PlainStep {
    /// Go on with the next rule.
    Next,
    /// The walk's answer.
    Done(Result<Hop, NoRoute>),
    /// The answer depends on the flow: the full lookup decides.
    Full,
}

#[inline]
fn plain_step(
    rule: &CompiledRule,
    t: &PlainTable,
    plain: Plain,
    c: &Checked,
    q: &Query,
    mp: &Multipath,
) -> PlainStep {
    let len = match plain {
        Plain::Miss | Plain::Thrown => return PlainStep::Next,
        Plain::Reject(e) => return PlainStep::Done(Err(e)),
        Plain::Flow => return PlainStep::Full,
        Plain::One { len, .. } | Plain::Multi { len, .. } => len,
    };
    if rule.suppress_prefixlength.is_some_and(|s| len <= s) {
        return PlainStep::Next;
    }
    if rule.suppress_ifgroup.is_some() {
        return PlainStep::Full;
    }
    match plain_hop(t, plain, c, q, mp) {
        Some(hop) => PlainStep::Done(Ok(t.hops[hop as usize])),
        None => PlainStep::Full,
    }
}

/// The hop of a plain answer with a route: its one hop, or the flow's among several,
/// chosen as [`Snapshot::choose_path`] chooses among paths; `None` when that choice
/// needs the paths' source addresses (an IPv4 flow this host sends from a given source).
#[inline]
fn plain_hop(t: &PlainTable, plain: Plain, c: &Checked, q: &Query, mp: &Multipath) -> Option<u32> {
    match plain {
        Plain::One { hop, .. } => Some(hop),
        Plain::Multi { start, .. } => {
            if c.prefers_source(q.src) {
                return None;
            }
            let start = start as usize;
            let count = t.multi[start].0 as usize;
            let paths = &t.multi[start + 1..start + 1 + count];
            // The query as given hashes as the walk's (an input flow's missing source
            // hashes as the unspecified address it stands for).
            let chosen = multipath::choose(paths.iter(), |p| p.1, || mp.hash(q));
            Some(chosen.expect("several paths").0)
        }
        _ => unreachable!("answers with a route"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;
    use crate::state::State;

    fn snapshot(text: &str) -> Snapshot {
        let mut state = State::new();
        config::apply_text(&mut state, "test", text).expect("configuration");
        state.snapshot()
    }

    const LINKS: &str = "\
link add a0 type veth peer name a1
link set a0 up
link set a1 up
addr add 10.0.0.1/24 dev a0
addr add 10.0.1.1/24 dev a1
-6 addr add 2001:db8::1/64 dev a0 nodad
";

    #[test]
    fn a_hop_is_the_route_s_answer_cut_down() {
        let snap = snapshot(&format!(
            "{LINKS}route add 10.1.0.0/16 via 10.0.0.2 table 100 mtu 1400
rule add to 10.1.0.0/16 lookup 100 pref 1000
route add blackhole 10.2.0.0/16
route add 10.3.0.0/16 nexthop via 10.0.0.2 nexthop via 10.0.1.2
"
        ));
        for dst in [
            "10.1.2.3",
            "10.2.0.1",
            "10.0.0.1",
            "10.0.0.255",
            "10.0.0.7",
            "10.3.1.1",
            "10.3.9.200",
            "192.0.2.1",
            "2001:db8::5",
            "2001:db9::5",
        ] {
            let q = Query::to(dst.parse().unwrap());
            let hop = snap.lookup(&q);
            let answer = snap.route(&q).map(|a| Hop {
                kind: a.kind,
                table: a.table,
                dev: a.dev,
                gateway: a.gateway,
                mtu: a.mtu,
            });
            assert_eq!(hop, answer, "{dst}");
        }
        let q = Query::to("10.1.2.3".parse().unwrap());
        let hop = snap.lookup(&q).unwrap();
        assert_eq!(hop.gateway, Some("10.0.0.2".parse().unwrap()));
        assert_eq!((hop.table, hop.mtu), (Some(100), Some(1400)));
        assert_eq!(
            snap.lookup(&Query::to("10.2.0.1".parse().unwrap())),
            Err(NoRoute::Invalid)
        );
    }

    /// A flow to each of `dsts` gets the same hop from `lookup`, `lookup_batch` and the
    /// full walk of `route`.
    fn agree(snap: &Snapshot, dsts: &[&str]) {
        let flows: Vec<Query> = dsts.iter().map(|d| Query::to(d.parse().unwrap())).collect();
        agree_on(snap, &flows);
    }

    /// Every flow gets the same hop from `lookup`, `lookup_batch` and the full walk of
    /// `route`.
    fn agree_on(snap: &Snapshot, flows: &[Query]) {
        let mut batched = vec![Err(NoRoute::NetworkUnreachable); flows.len()];
        snap.lookup_batch(flows, &mut batched);
        for (q, batched) in flows.iter().zip(batched) {
            let answer = snap.route(q).map(|a| Hop {
                kind: a.kind,
                table: a.table,
                dev: a.dev,
                gateway: a.gateway,
                mtu: a.mtu,
            });
            assert_eq!(snap.lookup(q), answer, "{q:?}");
            assert_eq!(batched, answer, "{q:?} batched");
        }
    }

    #[test]
    fn one_search_keeps_the_walk_s_table_order() {
        // IPv6's default rules: `local` before `main`, even where `main` has the longer
        // prefix (its multicast and local routes win over longer routes in `main`).
        let text = format!(
            "{LINKS}-6 route add ff02::/16 via 2001:db8::2
-6 route add 2001:db8::1/128 via 2001:db8::3
-6 route add 2001:db8:5::/48 via 2001:db8::3 table default
-6 route add 2001:db8:5:1::/64 via 2001:db8::4 table default
-6 route add throw 2001:db8:6::/48
-6 route add 2001:db8:6::/48 via 2001:db8::4 table default
"
        );
        let dsts = [
            "ff02::1",
            "ff05::1",
            "2001:db8::1",
            "2001:db8::7",
            "2001:db8:5::1",
            "2001:db8:5:1::1",
            "2001:db8:6::1",
            "2001:db9::1",
        ];
        let snap = snapshot(&text);
        assert!(snap.v6.direct.is_some(), "the default rules are one search");
        assert_eq!(
            snap.lookup(&Query::to("ff02::1".parse().unwrap()))
                .unwrap()
                .kind,
            RouteType::Multicast
        );
        assert_eq!(
            snap.lookup(&Query::to("2001:db8::1".parse().unwrap()))
                .unwrap()
                .kind,
            RouteType::Local
        );
        agree(&snap, &dsts);
        // Rules that match every flow stay one search: `local` jumped over, a walk ended
        // by a blackhole rule.
        let jumped = snapshot(&format!(
            "{text}-6 rule del pref 0
-6 rule add nop pref 10
-6 rule add goto 32766 pref 20
-6 rule add lookup local pref 30
-6 rule add blackhole pref 40000
"
        ));
        assert!(jumped.v6.direct.is_some());
        assert_eq!(
            jumped
                .lookup(&Query::to("2001:db8::1".parse().unwrap()))
                .unwrap()
                .kind,
            RouteType::Unicast
        );
        assert_eq!(
            jumped.lookup(&Query::to("2001:db9::1".parse().unwrap())),
            Err(NoRoute::Invalid)
        );
        agree(&jumped, &dsts);
        // A rule with a selector: the flows it matches walk the rules, the others are
        // still one search.
        let selective = snapshot(&format!(
            "{text}-6 rule add fwmark 1 prohibit pref 5
"
        ));
        assert!(selective.v6.direct.is_some());
        agree(&selective, &dsts);
        let mut marked = Query::to("2001:db8::7".parse().unwrap());
        marked.mark = 1;
        let flows = [marked.clone(), Query::to("2001:db8::7".parse().unwrap())];
        let mut batched = [Err(NoRoute::NetworkUnreachable), Err(NoRoute::Invalid)];
        selective.lookup_batch(&flows, &mut batched);
        assert_eq!(selective.lookup(&marked), Err(NoRoute::Prohibited));
        assert_eq!(batched[0], Err(NoRoute::Prohibited));
        assert_eq!(batched[1], selective.lookup(&flows[1]));
        assert_eq!(batched[1].map(|h| h.kind), Ok(RouteType::Unicast));
        // A rule that refuses answers by their length stops the one search.
        let suppressing = snapshot(&format!(
            "{text}-6 rule add lookup main suppress_prefixlength 0 pref 5
"
        ));
        assert!(suppressing.v6.direct.is_none());
        agree(&suppressing, &dsts);
    }

    #[test]
    fn runs_of_rules_search_their_tables_as_one() {
        // Rules 100 to 140 select `fwmark 1` and look up tables 100 to 104 in turn (a
        // table named twice, one that does not exist); 150 jumps into the middle of a
        // second run, which is cut there so that the jump lands on a run's start. Their
        // tables overlap: longer and
        // shorter prefixes, a throw, an unreachable route, an ECMP route.
        let mut text = format!(
            "{LINKS}route add 10.5.0.0/16 via 10.0.0.2 table 100
route add 10.5.1.0/24 via 10.0.0.3 table 101
route add throw 10.6.0.0/16 table 100
route add 10.6.0.0/16 via 10.0.0.4 table 102
route add unreachable 10.7.0.0/16 table 101
route add 10.7.7.0/24 via 10.0.0.5 table 102
route add 10.8.0.0/16 table 103 nexthop via 10.0.0.2 nexthop via 10.0.1.2
route add 10.9.0.0/16 via 10.0.1.9 table 104
route add 10.9.9.0/24 via 10.0.1.8 table 104
rule add fwmark 1 lookup 100 pref 100
rule add fwmark 1 lookup 101 pref 110
rule add fwmark 1 lookup 100 pref 115
rule add fwmark 1 lookup 102 pref 120
rule add fwmark 1 lookup 999 pref 125
rule add fwmark 1 lookup 103 pref 130
rule add fwmark 1 lookup 104 pref 140
rule add fwmark 2 goto 220 pref 150
rule add fwmark 2 lookup 104 pref 210
rule add fwmark 2 lookup 102 pref 220
rule add fwmark 2 lookup 101 pref 230
"
        );
        let snap = snapshot(&text);
        let runs: Vec<usize> = snap.v4.runs.iter().map(|r| r.end).collect();
        assert_eq!(
            runs.len(),
            3,
            "the fwmark 1 run, the fwmark 2 run from the goto's target on, main and default"
        );
        let mut flows = Vec::new();
        for mark in [0, 1, 2] {
            for dst in [
                "10.5.0.1", "10.5.1.1", "10.6.0.1", "10.7.0.1", "10.7.7.1", "10.8.0.1", "10.8.0.2",
                "10.8.3.4", "10.9.0.1", "10.9.9.9", "10.0.0.7", "10.3.0.1",
            ] {
                let mut q = Query::to(dst.parse().unwrap());
                q.mark = mark;
                flows.push(q);
            }
        }
        agree_on(&snap, &flows);
        let mut q = Query::to("10.5.1.1".parse().unwrap());
        q.mark = 1;
        // Table 100's /16 answers before table 101's longer /24.
        assert_eq!(snap.lookup(&q).unwrap().table, Some(100));
        q.dst = "10.6.0.1".parse().unwrap();
        assert_eq!(snap.lookup(&q).unwrap().table, Some(102), "past the throw");
        q.dst = "10.7.7.1".parse().unwrap();
        assert_eq!(snap.lookup(&q), Err(NoRoute::HostUnreachable));
        q.mark = 2;
        q.dst = "10.9.9.9".parse().unwrap();
        // The goto skips table 104.
        assert_eq!(snap.lookup(&q), Err(NoRoute::NetworkUnreachable));
        q.dst = "10.6.0.1".parse().unwrap();
        assert_eq!(snap.lookup(&q).unwrap().table, Some(102));
        text += "rule add fwmark 1 lookup 100 suppress_prefixlength 8 pref 105\n";
        let split = snapshot(&text);
        assert_eq!(
            split.v4.runs.len(),
            3,
            "a suppressing rule is no part of a run"
        );
    }

    #[test]
    fn ipv6_flows_arriving_on_a_link_keep_plain_answers_unless_the_link_matters() {
        // Every link's `fe80::/64` and `ff00::/8` routes share a prefix and a metric,
        // but their destinations are matched strictly (the full walk) anyway.
        let text = format!("{LINKS}-6 addr add 2001:db8:1::1/64 dev a1 nodad\n");
        let snap = snapshot(&text);
        assert!(!snap.v6_input_prefers);
        // Two routes of one metric to one prefix: the input link chooses between them.
        let snap = snapshot(&format!(
            "{text}-6 route add 2001:db8:5::/64 dev a0 metric 100
-6 route append 2001:db8:5::/64 dev a1 metric 100
"
        ));
        assert!(snap.v6_input_prefers);
        let a1 = snap.links().find(|l| l.name == "a1").unwrap().index;
        let mut q = Query::to("2001:db8:5::7".parse().unwrap());
        q.iif = Some(a1);
        assert_eq!(snap.lookup(&q).unwrap().dev, a1);
        let mut batched = [Err(NoRoute::NetworkUnreachable)];
        snap.lookup_batch(std::slice::from_ref(&q), &mut batched);
        assert_eq!(batched[0].unwrap().dev, a1);
        q.iif = None;
        assert_ne!(
            snap.lookup(&q).unwrap().dev,
            a1,
            "the first route, without a link"
        );
    }

    #[test]
    fn a_batch_answers_as_one_flow_at_a_time() {
        let mut text = String::from(LINKS);
        for i in 0..40 {
            text += &format!(
                "route add 10.{}.0.0/16 via 10.0.0.2 table {}\n",
                10 + i,
                100 + i % 5
            );
            text += &format!(
                "rule add to 10.{}.0.0/16 lookup {} pref {}\n",
                10 + i,
                100 + i % 5,
                100 + i
            );
            text += &format!(
                "-6 route add 2001:db8:{:x}::/48 dev a0 table {}\n",
                i,
                200 + i % 3
            );
            text += &format!(
                "-6 rule add from 2001:db8:ff{i:02x}::/48 lookup {} pref {}\n",
                200 + i % 3,
                100 + i
            );
        }
        text += "rule add fwmark 7 prohibit pref 50\n";
        text += "-6 rule add fwmark 7 unreachable pref 50\n";
        let snap = snapshot(&text);
        let flows: Vec<Query> = (0..1000u32)
            .map(|i| {
                let mut q = if i % 3 == 0 {
                    let mut q = Query::to(format!("2001:db8:{:x}::9", i % 50).parse().unwrap());
                    q.src = Some(format!("2001:db8:ff{:02x}::1", i % 45).parse().unwrap());
                    q
                } else {
                    Query::to(IpAddr::from([10, (i % 60) as u8, 1, i as u8]))
                };
                q.mark = if i % 17 == 0 { 7 } else { 0 };
                q
            })
            .collect();
        let mut out = vec![Err(NoRoute::NetworkUnreachable); flows.len()];
        snap.lookup_batch(&flows, &mut out);
        let mut hits = 0;
        for (q, batched) in flows.iter().zip(&out) {
            assert_eq!(*batched, snap.lookup(q), "{q:?}");
            hits += usize::from(batched.is_ok());
        }
        assert!(hits > 500, "{hits} hits");
    }
}
