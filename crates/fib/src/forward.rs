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
//! then lets each flow's rule take or refuse its table's answer. While only the default
//! rules exist, that is one round: one batched search of one structure.

use crate::classify::CompiledRule;
use crate::classify::FlowKey;
use crate::link::LinkIndex;
use crate::multipath::{self, Multipath};
use crate::net::{addr_bits, Family};
use crate::query::{NoRoute, Query};
use crate::route::Path;
use crate::route::{Route, RouteType};
use crate::snapshot::{sent_via, CompiledTable, Concluded, Plain};
use crate::snapshot::{Prepared, Snapshot, Step, WalkFor};
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
        let p = self.prepare(q)?;
        if p.oif.is_none() && !self.input_needs_source_check(&p) {
            if let Some(answer) = self.plain_walk(&p) {
                if !self.forwarded_back(&p, &answer) {
                    return answer;
                }
            }
        }
        self.full_lookup(&p)
    }

    /// Whether a plain answer forwards an arriving IPv4 flow back out of its input link,
    /// which the kernel's source check looks up in full.
    #[inline]
    fn forwarded_back(&self, p: &Prepared, answer: &Result<Hop, NoRoute>) -> bool {
        p.family == Family::V4
            && answer.as_ref().is_ok_and(|h| {
                h.kind == RouteType::Unicast && Some(h.dev) == p.input && p.input != Some(self.lo)
            })
    }

    /// The lookup through the full walk, for what plain answers cannot decide.
    fn full_lookup(&self, p: &Prepared) -> Result<Hop, NoRoute> {
        let walk = self.walk(&p.q, p.family, p.oif, p.iif, 0, WalkFor::Flow);
        self.hop(p, walk)
    }

    /// The rule walk of a flow with no output link on the tables' [`Plain`] answers;
    /// `None` when one of them depends on the flow.
    fn plain_walk(&self, p: &Prepared) -> Option<Result<Hop, NoRoute>> {
        let fib = self.fib(p.family);
        if let Some(tables) = &fib.without_rules {
            // No rule to test: `main` (with `local`), then `default`.
            for &t in tables {
                let t = &fib.tables[t];
                match t.plain(p.q.dst) {
                    Plain::Miss | Plain::Thrown => continue,
                    Plain::Reject(e) => return Some(Err(e)),
                    Plain::Flow => return None,
                    plain => {
                        let hop = plain_hop(t, plain, p, &self.multipath)?;
                        return Some(Ok(t.hops[hop as usize]));
                    }
                }
            }
            return Some(Err(NoRoute::NetworkUnreachable));
        }
        let key = FlowKey::new(&p.q, None, p.iif);
        let candidates = fib.rules.candidates(&key);
        let mut from = 0;
        loop {
            let (rule, table) = match self.next_lookup(fib, &candidates, from) {
                Step::Lookup { rule, table } => (rule, table),
                Step::Done(e) => return Some(Err(e)),
            };
            let t = &fib.tables[table];
            let plain = t.plain(p.q.dst);
            match plain_step(&fib.rules.list[rule], t, plain, p, &self.multipath) {
                PlainStep::Next => from = rule + 1,
                PlainStep::Done(answer) => return Some(answer),
                PlainStep::Full => return None,
            }
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
            /// Rule `rule` looks up table `table` of the flow's family.
            Lookup { rule: usize, table: usize },
        }
        let mut at = [At::Done; BATCH];
        let mut prepared: [Option<Prepared>; BATCH] = std::array::from_fn(|_| None);
        for i in 0..n {
            match self.prepare(&flows[i]) {
                // A flow with an output link, or a source to check in full, takes the
                // full lookup.
                Ok(p) if p.oif.is_some() || self.input_needs_source_check(&p) => {
                    out[i] = self.full_lookup(&p)
                }
                Ok(p) => {
                    prepared[i] = Some(p);
                    at[i] = At::From(0);
                }
                Err(e) => out[i] = Err(e),
            }
        }
        // Rule keys only for flows whose family has rules to test.
        let keys: [Option<FlowKey>; BATCH] = std::array::from_fn(|i| {
            prepared[i]
                .as_ref()
                .filter(|p| self.fib(p.family).without_rules.is_none())
                .map(|p| FlowKey::new(&p.q, p.oif, p.iif))
        });
        // The flows' bit sets in the rule index, found once for all rounds.
        let sets: [Option<crate::classify::Sets>; BATCH] = std::array::from_fn(|i| {
            let p = prepared[i].as_ref()?;
            self.fib(p.family).rules.sets(keys[i].as_ref()?)
        });
        let mut keys4 = [0u32; BATCH];
        let mut keys6 = [0u128; BATCH];
        let mut members = [0usize; BATCH];
        let mut found = [None; BATCH];
        loop {
            // Every walking flow to its next table (or to its end).
            for i in 0..n {
                let At::From(from) = at[i] else { continue };
                let p = prepared[i].as_ref().expect("walking");
                let fib = self.fib(p.family);
                if let Some(tables) = &fib.without_rules {
                    // No rule to test: the tables in turn (their synthetic rules, which
                    // suppress nothing, stand at the same positions).
                    at[i] = match tables.get(from) {
                        Some(&table) => At::Lookup { rule: from, table },
                        None => {
                            out[i] = Err(NoRoute::NetworkUnreachable);
                            At::Done
                        }
                    };
                    continue;
                }
                let key = keys[i].as_ref().expect("walking");
                let candidates = fib.rules.candidates_with(key, sets[i]);
                at[i] = match self.next_lookup(fib, &candidates, from) {
                    Step::Lookup { rule, table } => At::Lookup { rule, table },
                    Step::Done(e) => {
                        out[i] = self.hop(p, Err(e));
                        At::Done
                    }
                };
            }
            // Each table once, for all the flows at it.
            let mut any = false;
            for first in 0..n {
                let At::Lookup { table, .. } = at[first] else {
                    continue;
                };
                any = true;
                let family = prepared[first].as_ref().expect("walking").family;
                let mut count = 0;
                for (j, a) in at.iter().enumerate().take(n).skip(first) {
                    let same = matches!(*a, At::Lookup { table: t, .. } if t == table)
                        && prepared[j].as_ref().expect("walking").family == family;
                    if same {
                        members[count] = j;
                        let dst = addr_bits(flows[j].dst);
                        keys4[count] = dst as u32;
                        keys6[count] = dst;
                        count += 1;
                    }
                }
                let fib = self.fib(family);
                let t = &fib.tables[table];
                match family {
                    Family::V4 => match &t.plain_v4 {
                        Some(lpm) => lpm.lookup_batch(&keys4[..count], &mut found[..count]),
                        None => found[..count].fill(None),
                    },
                    Family::V6 => match &t.plain_v6 {
                        Some(lpm) => lpm.lookup_batch(&keys6[..count], &mut found[..count]),
                        None => found[..count].fill(None),
                    },
                }
                for k in 0..count {
                    let j = members[k];
                    let At::Lookup { rule, .. } = at[j] else {
                        unreachable!("a member is at a lookup")
                    };
                    let p = prepared[j].as_ref().expect("walking");
                    let plain = found[k].map_or(Plain::Miss, Plain::decode);
                    at[j] = match plain_step(&fib.rules.list[rule], t, plain, p, &self.multipath) {
                        PlainStep::Next => At::From(rule + 1),
                        PlainStep::Done(answer) if self.forwarded_back(p, &answer) => {
                            out[j] = self.full_lookup(p);
                            At::Done
                        }
                        PlainStep::Done(answer) => {
                            out[j] = answer;
                            At::Done
                        }
                        PlainStep::Full => {
                            out[j] = self.full_lookup(p);
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
    t: &CompiledTable,
    plain: Plain,
    p: &Prepared,
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
    match plain_hop(t, plain, p, mp) {
        Some(hop) => PlainStep::Done(Ok(t.hops[hop as usize])),
        None => PlainStep::Full,
    }
}

/// The hop of a plain answer with a route: its one hop, or the flow's among several,
/// chosen as [`Snapshot::choose_path`] chooses among paths; `None` when that choice
/// needs the paths' source addresses (an IPv4 flow this host sends from a given source).
#[inline]
fn plain_hop(t: &CompiledTable, plain: Plain, p: &Prepared, mp: &Multipath) -> Option<u32> {
    match plain {
        Plain::One { hop, .. } => Some(hop),
        Plain::Multi { start, .. } => {
            if p.prefers_source() {
                return None;
            }
            let start = start as usize;
            let count = t.multi[start].0 as usize;
            let paths = &t.multi[start + 1..start + 1 + count];
            let chosen = multipath::choose(paths.iter(), |p| p.1, || mp.hash(&p.q));
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
