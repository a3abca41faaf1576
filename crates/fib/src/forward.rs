//! The forwarding lookup: what a packet needs from a route query, and nothing more.
//!
//! [`Snapshot::route`] answers as `ip route get` does, with the source address chosen,
//! every path listed and the answer's flags; a packet needs only where to go. [`Hop`] is
//! that: the route's type and table, the output link, the gateway to send through, the
//! route's MTU. [`Snapshot::lookup`] finds it with the same checks, rule walk and table
//! lookups as `route` (so both always agree), and allocates nothing. It answers with a
//! [`HopRef`], the compiled table's own hop by reference: a copy per flow cost as much as
//! the search.
//!
//! [`Snapshot::lookup_batch`] does the same for many flows, [`BATCH`] at a time, and keeps
//! them batched through rules and tables: each round moves every flow still walking to
//! the next rule that looks up a table, then looks up each table once for all the flows
//! that reached it ([`fibre_lpm::Table::lookup_batch`], whose searches overlap in memory),
//! then lets each flow's rule take or refuse its table's answer. While no rule the walk
//! reaches depends on the flow (the default rules, or rules that only look up, jump or
//! reject), there is no walk at all: the tables it would visit are merged into one
//! structure when the snapshot is compiled, and a batch is one batched search of it. A
//! batch of flows mostly alike (one family, one input link or none, as a packet path
//! batches them) takes that way in two tight passes, vector code where the CPU has AVX2
//! (`quick`), the few flows not alike answered one by one (`lookup_uniform`). A single
//! [`Snapshot::lookup`] of such a flow takes the same checks first (`lookup_alike`).
//!
//! A packet path's vectors of flows take the same passes (`vector`), answered with a `u32`
//! a flow.
//!
//! The source of an IPv4 flow arriving on a link is checked on the same plain answers:
//! the quick check (is the source this host's or a broadcast address) by a hash filter and
//! binary searches, the kernel's reverse lookup, where it is needed, by a second plain
//! walk.

use crate::answers::{AnswerTable, DestAnswer};
use crate::classify::CompiledRule;
use crate::classify::FlowKey;
use crate::hop::{Hop, HopRef};
use crate::layout::{Direct, FamilyFib, Snapshot};
use crate::link::{LinkIndex, LinkKind};
use crate::multipath::{self, Multipath};
use crate::net::{addr_bits, Family};
use crate::query::BATCH;
use crate::query::{NoRoute, Query};
use crate::quick;
use crate::route::{RouteBody, RouteType};
use crate::walk::{self, Checked, Concluded, Prepared, Step, WalkFor};
use std::borrow::Borrow;
use std::net::IpAddr;

/// How flows alike are answered: their family's tables, its one merged search, and what
/// the checks of their input link concluded ([`Snapshot::alike_way`]).
pub(crate) struct AlikePlan<'s> {
    fib: &'s FamilyFib,
    direct: &'s Direct,
    pub(crate) c: Checked,
}

impl<'s> AlikePlan<'s> {
    /// The structure the one search looks in.
    #[inline]
    pub(crate) fn plain(&self) -> &'s AnswerTable {
        self.direct.plain(self.fib)
    }
}

/// What the passes around the one search found of a batch of flows alike
/// ([`Snapshot::alike_v4`], [`Snapshot::alike_v6`]), kept by the caller from batch to
/// batch: 768 bytes, which a return by value had copied three times.
pub(crate) struct AlikeBatch {
    /// Each flow's search answer.
    found: [Option<u32>; BATCH],
    /// Each quick flow's hop, an index in the searched table's hops.
    pub(crate) hops: [u32; BATCH],
    /// Bit `i`: flow `i` is answered by `hops[i]`, with no further check.
    pub(crate) quick: u64,
    /// Bit `i`: flow `i` is not alike, and is looked up alone.
    odd: u64,
    /// The number of flows.
    pub(crate) n: usize,
}

impl AlikeBatch {
    /// Room for a batch.
    pub(crate) fn new() -> AlikeBatch {
        AlikeBatch {
            found: [None; BATCH],
            hops: [0; BATCH],
            quick: 0,
            odd: 0,
            n: 0,
        }
    }

    /// Ready for a batch of `n` flows, `odd` those known not to be alike.
    pub(crate) fn start(&mut self, n: usize, odd: u64) -> &mut AlikeBatch {
        debug_assert!(n <= BATCH);
        self.n = n;
        self.odd = odd;
        self
    }
}

/// Whether an IPv6 flow to `d` arriving on a link must be reached by that link (a
/// link-local, multicast or loopback destination): `needs_strict_oif` on a key.
#[inline]
fn strict_v6(d: u128) -> bool {
    d >> 120 == 0xff || d >> 118 == 0xfe80 >> 6 || d == 1
}

/// The body of [`Snapshot::lookup`].
pub(crate) fn lookup<'s>(snap: &'s Snapshot, q: &Query) -> Result<HopRef<'s>, NoRoute> {
    if let Some(hop) = lookup_alike(snap, q) {
        return Ok(hop);
    }
    if let Some(answer) = snap.special_v4(q) {
        return answer.map(|a| HopRef::Made(Hop::of_answer(&a)));
    }
    let c = snap.check(q)?;
    if c.oif.is_none() && snap.plain_answers_hold(&c, q.dst) {
        if let Some(answer) = plain_walk(snap, &c, q) {
            if let Some(answer) = source_checked(snap, &c, q, answer) {
                return answer;
            }
        }
    }
    full_lookup(snap, &c.with(q))
}

/// A plain walk's answer once the source of a flow arriving on a link is checked as
/// the kernel checks it ([`Snapshot::validate_source`]), the flow back to the source
/// looked up on the plain answers too; `None` when the full lookup must decide.
#[inline]
fn source_checked<'s>(
    snap: &'s Snapshot,
    c: &Checked,
    q: &Query,
    answer: Result<HopRef<'s>, NoRoute>,
) -> Option<Result<HopRef<'s>, NoRoute>> {
    let Ok(h) = &answer else {
        return Some(answer);
    };
    if c.input.is_none() || !input_source_to_check(snap, c, q, h) {
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
        Some(plain_walk(snap, &bc, flow)?.ok().map(|h| h.kind))
    };
    match snap.check_source(q, c.input, src, h.kind, h.dev, back)? {
        Ok(()) => Some(answer),
        Err(e) => Some(Err(e)),
    }
}

/// Whether the source of a flow arriving on a link needs more than the quick check
/// (is it this host's) for the answer `h`: the kernel looks it up.
#[inline]
fn input_source_to_check(snap: &Snapshot, c: &Checked, q: &Query, h: &Hop) -> bool {
    snap.input_needs_source_check(c, q.src) || sends_back(snap, c, h)
}

/// Whether `hop` forwards an arriving IPv4 flow back out of its input link.
#[inline]
fn sends_back(snap: &Snapshot, c: &Checked, h: &Hop) -> bool {
    c.family == Family::V4
        && h.kind == RouteType::Unicast
        && Some(h.dev) == c.input
        && c.input != Some(snap.lo)
}

/// The lookup through the full walk, for what plain answers cannot decide.
fn full_lookup<'s>(snap: &'s Snapshot, p: &Prepared) -> Result<HopRef<'s>, NoRoute> {
    let walk = snap.walk(&p.q, p.family, p.oif, p.iif, 0, WalkFor::Flow);
    hop(snap, p, walk)
}

/// The rule walk of a flow with no output link on the tables' [`DestAnswer`] answers;
/// `None` when one of them depends on the flow.
fn plain_walk<'s>(
    snap: &'s Snapshot,
    c: &Checked,
    q: &Query,
) -> Option<Result<HopRef<'s>, NoRoute>> {
    let fib = snap.fib(c.family);
    if let Some(direct) = &fib.direct {
        if !fib.rules.has_selective() {
            return direct_answer(snap, fib, direct, c, q);
        }
    }
    let key = FlowKey::new(q, None, c.iif);
    let sets = fib.rules.sets(&key);
    if let Some(direct) = &fib.direct {
        if !fib.rules.any_selective_match(&key, sets) {
            return direct_answer(snap, fib, direct, c, q);
        }
    }
    let candidates = fib.rules.candidates_with(&key, sets);
    let mut from = 0;
    loop {
        let (rule, table) = match walk::next_lookup(fib, &candidates, from) {
            Step::Lookup { rule, table } => (rule, table),
            Step::Done(e) => return Some(Err(e)),
        };
        let (search, after) = fib.target(rule, table);
        let t = fib.searched(search);
        let plain = t.plain(q.dst);
        match plain_step(&fib.rules.list[rule], t, plain, c, q, &snap.multipath) {
            PlainStep::Next => from = after,
            PlainStep::Done(answer) => return Some(answer),
            PlainStep::Full => return None,
        }
    }
}

/// The answer of a walk that no rule's selectors decide: one search.
#[inline]
fn direct_answer<'s>(
    snap: &'s Snapshot,
    fib: &'s FamilyFib,
    direct: &'s Direct,
    c: &Checked,
    q: &Query,
) -> Option<Result<HopRef<'s>, NoRoute>> {
    let t = direct.plain(fib);
    match t.plain(q.dst) {
        DestAnswer::Miss | DestAnswer::Thrown => Some(Err(direct.miss)),
        DestAnswer::Reject(e) => Some(Err(e)),
        DestAnswer::Flow => None,
        plain => Some(Ok(HopRef::Shared(
            &t.hops[plain_hop(t, plain, c, q, &snap.multipath)? as usize],
        ))),
    }
}

/// The answer of a flow whose walk is the one search, from what the search found.
fn direct_code_answer<'s>(
    snap: &'s Snapshot,
    t: &'s AnswerTable,
    miss: NoRoute,
    c: &Checked,
    q: &Query,
    plain: DestAnswer,
) -> Result<HopRef<'s>, NoRoute> {
    let answer = match plain {
        DestAnswer::Miss | DestAnswer::Thrown => Some(Err(miss)),
        DestAnswer::Reject(e) => Some(Err(e)),
        DestAnswer::Flow => None,
        plain => plain_hop(t, plain, c, q, &snap.multipath)
            .and_then(|h| source_checked(snap, c, q, Ok(HopRef::Shared(&t.hops[h as usize])))),
    };
    match answer {
        Some(answer) => answer,
        None => full_lookup(snap, &c.with(q)),
    }
}

/// Whether some rule's selectors match a flow of `fib`'s family (checked `c`), so
/// that its walk is more than the one search.
#[inline]
fn selected(fib: &FamilyFib, q: &Query, c: &Checked) -> bool {
    fib.rules.has_selective() && {
        let key = FlowKey::new(q, None, c.iif);
        fib.rules.any_selective_match(&key, fib.rules.sets(&key))
    }
}

/// Whether at most a quarter of the first `n` flows of a batch are not alike: those in
/// `odd`, and those some rule's selectors match (added to `odd`). Stops looking at the
/// first flow past a quarter: where rules match most flows, the batch takes the
/// general way at once.
fn few_selected<Q: Borrow<Query>>(
    fib: &FamilyFib,
    c: &Checked,
    n: usize,
    odd: &mut u64,
    flow: impl Fn(usize) -> Q,
) -> bool {
    let most = n / 4;
    if odd.count_ones() as usize > most {
        return false;
    }
    if fib.rules.has_selective() {
        for i in 0..n {
            if *odd & 1 << i == 0 && selected(fib, flow(i).borrow(), c) {
                *odd |= 1 << i;
                if odd.count_ones() as usize > most {
                    return false;
                }
            }
        }
    }
    true
}

/// The body of [`Snapshot::alike_way`].
pub(crate) fn alike_way(
    snap: &Snapshot,
    family: Family,
    iif: Option<LinkIndex>,
) -> Option<AlikePlan<'_>> {
    let fib = snap.fib(family);
    let direct = fib.direct.as_ref()?;
    let input = match iif {
        None => None,
        Some(i) if alike_input(snap, i) => Some(i),
        Some(_) => return None,
    };
    if family == Family::V6 && input.is_some() && snap.v6_input_prefers {
        return None;
    }
    let c = Checked {
        family,
        oif: None,
        iif: input.unwrap_or(1),
        input,
    };
    Some(AlikePlan { fib, direct, c })
}

/// Whether flows arriving on link `i` can be flows alike: it exists and is not the
/// loopback (nor index 0, which no link has).
#[inline]
fn alike_input(snap: &Snapshot, i: LinkIndex) -> bool {
    match snap.alike_inputs.get(i as usize) {
        Some(&alike) => alike,
        None => {
            i as usize >= 1 << 20
                && snap
                    .links
                    .get(&i)
                    .is_some_and(|l| l.kind != LinkKind::Loopback)
        }
    }
}

/// [`Snapshot::lookup`] of one flow alike (as `lookup_uniform` takes them) that its one
/// search answers with one hop needing no further check: the two passes of
/// [`Snapshot::alike_v4`] for one flow. `None`: the flow is not such a flow, and the
/// general way answers it.
#[inline]
fn lookup_alike<'s>(snap: &'s Snapshot, q: &Query) -> Option<HopRef<'s>> {
    if q.oif.is_some() {
        return None;
    }
    let input = match q.iif {
        None => None,
        Some(i) if alike_input(snap, i) => Some(i),
        Some(_) => return None,
    };
    match q.dst {
        IpAddr::V4(d) => {
            let fib = &snap.v4;
            let direct = fib.direct.as_ref()?;
            let s = match (input, q.src) {
                (Some(_), Some(IpAddr::V4(s))) => u32::from(s),
                (None, None) => 0,
                _ => return None,
            };
            let d = u32::from(d);
            if fib.rules.has_selective() || quick::martian_v4(d, s, input.is_some()) {
                return None;
            }
            let t = direct.plain(fib);
            let hop = t.one_hop_v4(d)? as usize;
            if let Some(i) = input {
                // The quick source check (see `alike_v4`).
                if snap.v4_full_source_check || snap.v4_own.may_hold(s) || t.backs[hop] == i {
                    return None;
                }
            }
            Some(HopRef::Shared(&t.hops[hop]))
        }
        IpAddr::V6(d) => {
            let fib = &snap.v6;
            let direct = fib.direct.as_ref()?;
            let d = u128::from(d);
            if fib.rules.has_selective()
                || q.src.is_some_and(|s| s.is_ipv4())
                || (input.is_some() && (snap.v6_input_prefers || strict_v6(d)))
            {
                return None;
            }
            let t = direct.plain(fib);
            Some(HopRef::Shared(&t.hops[t.one_hop_v6(d)? as usize]))
        }
    }
}

/// The body of [`Snapshot::hop_by_destination`].
pub(crate) fn hop_by_destination(snap: &Snapshot, iif: LinkIndex, dst: IpAddr) -> Option<&Hop> {
    if !alike_input(snap, iif) {
        return None;
    }
    let hop = match dst {
        IpAddr::V4(d) => {
            let fib = &snap.v4;
            let direct = fib.direct.as_ref()?;
            let d = u32::from(d);
            // The source check of `lookup_alike` without its source: martians and
            // this host's addresses are the program's to refuse.
            if fib.rules.has_selective()
                || snap.v4_full_source_check
                || quick::martian_v4(d, 0x0a00_0000, false)
            {
                return None;
            }
            let t = direct.plain(fib);
            let hop = t.one_hop_v4(d)? as usize;
            if t.backs[hop] == iif {
                return None;
            }
            &t.hops[hop]
        }
        IpAddr::V6(d) => {
            let fib = &snap.v6;
            let direct = fib.direct.as_ref()?;
            let d = u128::from(d);
            if fib.rules.has_selective() || snap.v6_input_prefers || strict_v6(d) {
                return None;
            }
            let t = direct.plain(fib);
            &t.hops[t.one_hop_v6(d)? as usize]
        }
    };
    (hop.kind == RouteType::Unicast && hop.mtu.is_none() && hop.dev != iif).then_some(hop)
}

/// A chunk of flows mostly alike: of one family, arriving on one link (not the
/// loopback) or sent by this host from no given source, with no output link, and
/// matched by no rule's selectors, so that every such flow's walk is the one
/// search. Two tight passes answer them ([`Snapshot::alike_v4`],
/// [`Snapshot::alike_v6`]). `false`, with nothing written, when the chunk is not
/// mostly alike (the general way answers it).
fn lookup_uniform<'s>(
    snap: &'s Snapshot,
    flows: &[Query],
    out: &mut [Result<HopRef<'s>, NoRoute>],
) -> bool {
    let Some(first) = flows.first() else {
        return true;
    };
    let family = Family::of(first.dst);
    let iif = first.iif;
    let Some(way) = alike_way(snap, family, iif) else {
        return false;
    };
    let c = &way.c;
    let n = flows.len();
    // Bit i: flow i is not alike.
    let mut odd = 0u64;
    let mut a = AlikeBatch::new();
    let alike = match family {
        Family::V4 => {
            let mut keys = [0u32; BATCH];
            let mut srcs = [0u32; BATCH];
            for (i, q) in flows.iter().enumerate() {
                let d = match q.dst {
                    IpAddr::V4(d) => u32::from(d),
                    IpAddr::V6(_) => u32::MAX,
                };
                let (s, alike) = match (c.input, q.src) {
                    (Some(_), Some(IpAddr::V4(s))) => (u32::from(s), true),
                    (None, None) => (0, true),
                    _ => (0, false),
                };
                let other = !alike || !q.dst.is_ipv4() || q.iif != iif || q.oif.is_some();
                odd |= (other as u64) << i;
                keys[i] = d;
                srcs[i] = s;
            }
            alike_v4(snap, &way, &keys, &srcs, |i| &flows[i], a.start(n, odd))
        }
        Family::V6 => {
            let mut keys = [0u128; BATCH];
            for (i, q) in flows.iter().enumerate() {
                let other = match q.dst {
                    IpAddr::V6(d) => {
                        keys[i] = u128::from(d);
                        q.iif != iif || q.oif.is_some() || q.src.is_some_and(|s| s.is_ipv4())
                    }
                    IpAddr::V4(_) => true,
                };
                odd |= (other as u64) << i;
            }
            alike_v6(snap, &way, &keys, |i| &flows[i], a.start(n, odd))
        }
    };
    if alike {
        answer_alike(snap, &way, &a, |i| &flows[i], out);
    }
    alike
}

/// The body of [`Snapshot::alike_v4`].
pub(crate) fn alike_v4<Q: Borrow<Query>>(
    snap: &Snapshot,
    way: &AlikePlan<'_>,
    keys: &[u32; BATCH],
    srcs: &[u32; BATCH],
    flow: impl Fn(usize) -> Q,
    a: &mut AlikeBatch,
) -> bool {
    let AlikePlan { fib, direct, c } = way;
    let (n, mut odd) = (a.n, a.odd);
    odd |= quick::martians_v4(snap.cpu, keys, srcs, n, c.input.is_some());
    if !few_selected(fib, c, n, &mut odd, flow) {
        return false;
    }
    let t = direct.plain(fib);
    t.lookup_batch(Family::V4, &keys[..n], &[], &mut a.found[..n]);
    // The quick source check, as `source_checked` makes it: the source may be this
    // host's, or the flow is sent back out of its link.
    let arriving = c.input.map(|input| quick::Arriving {
        input,
        own: &snap.v4_own,
        full: snap.v4_full_source_check,
    });
    let quick = quick::quick_hops(snap.cpu, t, &a.found, srcs, n, arriving, &mut a.hops);
    a.quick = quick & !odd;
    a.odd = odd;
    true
}

/// The body of [`Snapshot::alike_v6`].
pub(crate) fn alike_v6<Q: Borrow<Query>>(
    snap: &Snapshot,
    way: &AlikePlan<'_>,
    keys: &[u128; BATCH],
    flow: impl Fn(usize) -> Q,
    a: &mut AlikeBatch,
) -> bool {
    let AlikePlan { fib, direct, c } = way;
    let (n, mut odd) = (a.n, a.odd);
    if c.input.is_some() {
        for (i, &d) in keys[..n].iter().enumerate() {
            odd |= (strict_v6(d) as u64) << i;
        }
    }
    if !few_selected(fib, c, n, &mut odd, flow) {
        return false;
    }
    let t = direct.plain(fib);
    t.lookup_batch(Family::V6, &[], &keys[..n], &mut a.found[..n]);
    let quick = quick::quick_hops(snap.cpu, t, &a.found, &[0; BATCH], n, None, &mut a.hops);
    a.quick = quick & !odd;
    a.odd = odd;
    true
}

/// The answers of a batch of flows alike, as [`Snapshot::alike_v4`] or
/// [`Snapshot::alike_v6`] found them (`a`).
#[inline]
fn answer_alike<'s, Q: Borrow<Query>>(
    snap: &'s Snapshot,
    way: &AlikePlan<'s>,
    a: &AlikeBatch,
    flow: impl Fn(usize) -> Q,
    out: &mut [Result<HopRef<'s>, NoRoute>],
) {
    let t = way.plain();
    let out = &mut out[..a.n];
    if a.quick.count_ones() as usize == a.n {
        // Every flow (the common case): one tight loop.
        for (o, &h) in out.iter_mut().zip(&a.hops) {
            *o = Ok(HopRef::Shared(&t.hops[h as usize]));
        }
        return;
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = match a.quick >> i & 1 {
            1 => Ok(HopRef::Shared(&t.hops[a.hops[i] as usize])),
            _ => answer_slow(snap, way, a, i, flow(i).borrow()),
        };
    }
}

/// The body of [`Snapshot::answer_slow`].
pub(crate) fn answer_slow<'s>(
    snap: &'s Snapshot,
    way: &AlikePlan<'s>,
    a: &AlikeBatch,
    i: usize,
    q: &Query,
) -> Result<HopRef<'s>, NoRoute> {
    if a.odd >> i & 1 == 1 {
        lookup(snap, q)
    } else {
        let plain = a.found[i].map_or(DestAnswer::Miss, DestAnswer::decode);
        direct_code_answer(snap, way.plain(), way.direct.miss, &way.c, q, plain)
    }
}

/// The body of [`Snapshot::lookup_batch`].
pub(crate) fn lookup_batch<'s>(
    snap: &'s Snapshot,
    flows: &[Query],
    out: &mut [Result<HopRef<'s>, NoRoute>],
) {
    assert!(out.len() >= flows.len(), "one answer for each flow");
    for (flows, out) in flows.chunks(BATCH).zip(out.chunks_mut(BATCH)) {
        lookup_chunk(snap, flows, out);
    }
}

/// The hop a concluded walk gives.
fn hop<'s>(
    snap: &'s Snapshot,
    p: &Prepared,
    walk: Result<(&RouteBody, u8, u32), NoRoute>,
) -> Result<HopRef<'s>, NoRoute> {
    let (route, table) = match snap.conclude(p, walk)? {
        Concluded::Route(route, table) => (route, table),
        Concluded::Bare(oif) => {
            return Ok(HopRef::Made(Hop {
                kind: RouteType::Unicast,
                table: None,
                dev: oif,
                gateway: None,
                mtu: None,
            }))
        }
    };
    let oif = snap.path_oif(&p.q, p.family, route);
    let path = snap
        .choose_path(route, oif, &p.q, p.input.is_some())
        .ok_or(NoRoute::NetworkUnreachable)?;
    snap.validate_source(&p.q, p.input, route, path.dev)?;
    Ok(HopRef::Made(Hop::of_route(
        route,
        table,
        path,
        snap.lo,
        p.input.is_some(),
    )))
}

/// Up to [`BATCH`] flows: as flows alike where most are, else round by round.
fn lookup_chunk<'s>(snap: &'s Snapshot, flows: &[Query], out: &mut [Result<HopRef<'s>, NoRoute>]) {
    if !lookup_uniform(snap, flows, out) {
        lookup_rounds(snap, flows, out);
    }
}

/// The body of [`Snapshot::lookup_rounds`].
pub(crate) fn lookup_rounds<'s>(
    snap: &'s Snapshot,
    flows: &[Query],
    out: &mut [Result<HopRef<'s>, NoRoute>],
) {
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
    // The flows' keys and bit sets in the rule index, found once for all rounds.
    let mut keys: [Option<FlowKey>; BATCH] = [None; BATCH];
    let mut sets: [Option<crate::classify::Sets>; BATCH] = [None; BATCH];
    // The flows no rule's selectors match, of a family where such a walk is one
    // search: their places and destinations, by family.
    let mut alone = [[0u8; BATCH]; 2];
    let mut alone_count = [0usize; 2];
    let mut keys4 = [0u32; BATCH];
    let mut keys6 = [0u128; BATCH];
    let mut seen = None;
    for i in 0..n {
        let q = &flows[i];
        if let Some(answer) = snap.special_v4(q) {
            out[i] = answer.map(|a| HopRef::Made(Hop::of_answer(&a)));
            continue;
        }
        let c = match snap.check_seen(q, &mut seen) {
            Ok(c) => c,
            Err(e) => {
                out[i] = Err(e);
                continue;
            }
        };
        // A flow with an output link takes the full lookup, and so does one the
        // plain answers do not hold for.
        if c.oif.is_some() || !snap.plain_answers_hold(&c, q.dst) {
            out[i] = full_lookup(snap, &c.with(q));
            continue;
        }
        checked[i] = Some(c);
        let fib = snap.fib(c.family);
        if fib.direct.is_some() {
            let selected = fib.rules.has_selective() && {
                let key = FlowKey::new(q, None, c.iif);
                let s = fib.rules.sets(&key);
                keys[i] = Some(key);
                sets[i] = s;
                fib.rules.any_selective_match(&key, s)
            };
            if !selected {
                let f = c.family as usize;
                let k = alone_count[f];
                alone[f][k] = i as u8;
                match q.dst {
                    IpAddr::V4(a) => keys4[k] = u32::from(a),
                    IpAddr::V6(a) => keys6[k] = u128::from(a),
                }
                alone_count[f] += 1;
                continue;
            }
        }
        at[i] = At::From(0);
    }
    let mut found = [None; BATCH];
    for family in [Family::V4, Family::V6] {
        let count = alone_count[family as usize];
        if count == 0 {
            continue;
        }
        let fib = snap.fib(family);
        let direct = fib
            .direct
            .as_ref()
            .expect("flows alone have a direct search");
        let t = direct.plain(fib);
        let (k4, k6) = match family {
            Family::V4 => (&keys4[..count], &[][..]),
            Family::V6 => (&[][..], &keys6[..count]),
        };
        t.lookup_batch(family, k4, k6, &mut found[..count]);
        for (&j, code) in alone[family as usize][..count].iter().zip(&found[..count]) {
            let j = j as usize;
            let (c, q) = (checked[j].expect("checked"), &flows[j]);
            let plain = code.map_or(DestAnswer::Miss, DestAnswer::decode);
            // The common answer first: one hop, and no source to look up.
            if let DestAnswer::One { hop, .. } = plain {
                let h = &t.hops[hop as usize];
                if c.input.is_none() || !input_source_to_check(snap, &c, q, h) {
                    out[j] = Ok(HopRef::Shared(h));
                    continue;
                }
            }
            out[j] = direct_code_answer(snap, t, direct.miss, &c, q, plain);
        }
    }
    if !at[..n].iter().any(|a| matches!(a, At::From(_))) {
        return;
    }
    let mut members = [0usize; BATCH];
    // The rest walk the rules.
    for i in 0..n {
        if let (At::From(_), Some(c), None) = (at[i], checked[i], keys[i]) {
            let key = FlowKey::new(&flows[i], None, c.iif);
            sets[i] = snap.fib(c.family).rules.sets(&key);
            keys[i] = Some(key);
        }
    }
    loop {
        // Every walking flow to its next table (or to its end).
        for i in 0..n {
            let At::From(from) = at[i] else { continue };
            let c = checked[i].expect("walking");
            let fib = snap.fib(c.family);
            let key = keys[i].as_ref().expect("walking");
            let candidates = fib.rules.candidates_with(key, sets[i]);
            at[i] = match walk::next_lookup(fib, &candidates, from) {
                Step::Lookup { rule, table } => {
                    let (search, after) = fib.target(rule, table);
                    At::Lookup {
                        rule,
                        search,
                        after,
                    }
                }
                Step::Done(e) => {
                    out[i] = hop(snap, &c.with(&flows[i]), Err(e));
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
            let fib = snap.fib(family);
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
                let plain = found[k].map_or(DestAnswer::Miss, DestAnswer::decode);
                let step = plain_step(&fib.rules.list[rule], t, plain, &c, q, &snap.multipath);
                at[j] = match step {
                    PlainStep::Next => At::From(after),
                    PlainStep::Done(answer) => {
                        out[j] = match source_checked(snap, &c, q, answer) {
                            Some(answer) => answer,
                            None => full_lookup(snap, &c.with(q)),
                        };
                        At::Done
                    }
                    PlainStep::Full => {
                        out[j] = full_lookup(snap, &c.with(q));
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

/// What a rule makes of a table's plain answer.
enum PlainStep<'s> {
    /// Go on with the next rule.
    Next,
    /// The walk's answer.
    Done(Result<HopRef<'s>, NoRoute>),
    /// The answer depends on the flow: the full lookup decides.
    Full,
}

#[inline]
fn plain_step<'s>(
    rule: &CompiledRule,
    t: &'s AnswerTable,
    plain: DestAnswer,
    c: &Checked,
    q: &Query,
    mp: &Multipath,
) -> PlainStep<'s> {
    let len = match plain {
        DestAnswer::Miss | DestAnswer::Thrown => return PlainStep::Next,
        DestAnswer::Reject(e) => return PlainStep::Done(Err(e)),
        DestAnswer::Flow => return PlainStep::Full,
        DestAnswer::One { len, .. } | DestAnswer::Multi { len, .. } => len,
    };
    if rule.suppress_prefixlength.is_some_and(|s| len <= s) {
        return PlainStep::Next;
    }
    if rule.suppress_ifgroup.is_some() {
        return PlainStep::Full;
    }
    match plain_hop(t, plain, c, q, mp) {
        Some(hop) => PlainStep::Done(Ok(HopRef::Shared(&t.hops[hop as usize]))),
        None => PlainStep::Full,
    }
}

/// The hop of a plain answer with a route: its one hop, or the flow's among several,
/// chosen as [`Snapshot::choose_path`] chooses among paths; `None` when that choice
/// needs the paths' source addresses (an IPv4 flow this host sends from a given source).
#[inline]
fn plain_hop(
    t: &AnswerTable,
    plain: DestAnswer,
    c: &Checked,
    q: &Query,
    mp: &Multipath,
) -> Option<u32> {
    match plain {
        DestAnswer::One { hop, .. } => Some(hop),
        DestAnswer::Multi { start, .. } => {
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
pub(crate) mod tests {
    use super::*;
    use crate::config;
    use crate::state::State;
    use crate::vector::{FlowVector, VectorAnswers};
    use std::net::{Ipv4Addr, Ipv6Addr};

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

    /// Where a destination's hop is said to be decided by it alone, flows to it from
    /// any source the express path lets by (not a martian, not this host's) get that
    /// hop from the full lookup; and it is said for the destinations that are such, and
    /// for no other.
    #[test]
    fn a_hop_decided_by_the_destination_is_every_source_s_hop() {
        use rand::{Rng, SeedableRng};
        let routes = "-6 addr add 2001:db8:1::1/64 dev a1 nodad
route add 10.1.0.0/16 via 10.0.1.2
route add 10.4.0.0/16 via 10.0.0.2
route add 10.3.0.0/16 nexthop via 10.0.0.2 nexthop via 10.0.1.2
route add 10.5.0.0/16 via 10.0.1.2 mtu 1400
route add blackhole 10.2.0.0/16
-6 route add 2001:db8:2::/48 via 2001:db8:1::2
-6 route add 2001:db8:4::/48 via 2001:db8::2
";
        let snap = snapshot(&format!("{LINKS}{routes}"));
        let link = |name: &str| snap.links().find(|l| l.name == name).unwrap().index;
        let (a0, a1) = (link("a0"), link("a1"));
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let v4 = |rng: &mut rand::rngs::StdRng, net: [u8; 2]| -> IpAddr {
            Ipv4Addr::new(net[0], net[1], rng.gen(), rng.gen()).into()
        };
        let v6 = |rng: &mut rand::rngs::StdRng, net: u16| -> IpAddr {
            Ipv6Addr::from(
                (0x2001_0db8_u128 << 96) | (u128::from(net) << 80) | rng.gen::<u64>() as u128,
            )
            .into()
        };
        // This host's own destinations, which the program refuses as sources.
        let own = |a: IpAddr| {
            [
                "10.0.0.1",
                "10.0.1.1",
                "10.0.0.255",
                "10.0.1.255",
                "10.0.0.0",
                "10.0.1.0",
                "2001:db8::1",
                "2001:db8:1::1",
                "2001:db8::",
                "2001:db8:1::",
            ]
            .iter()
            .any(|o| o.parse::<IpAddr>().unwrap() == a)
        };
        let mut decided = 0;
        for _ in 0..4_000 {
            let (iif, dst, eligible) = match rng.gen_range(0..8) {
                0 => (a0, v4(&mut rng, [10, 1]), true),
                1 => (a1, v4(&mut rng, [10, 4]), true),
                2 => (a0, v4(&mut rng, [10, 4]), false),
                3 => (a0, v4(&mut rng, [10, 3]), false),
                4 => (a0, v4(&mut rng, [10, 5]), false),
                5 => (a0, v4(&mut rng, [10, 2]), false),
                6 => (a0, v6(&mut rng, 2), true),
                _ => (a0, v6(&mut rng, 4), false),
            };
            let hop = snap.hop_by_destination(iif, dst);
            assert_eq!(hop.is_some(), eligible, "{dst} on {iif}: {hop:?}");
            let Some(hop) = hop else { continue };
            decided += 1;
            for _ in 0..8 {
                let src = match dst {
                    IpAddr::V4(_) => match rng.gen_range(0..3) {
                        0 => v4(&mut rng, [10, 0]),
                        1 => v4(&mut rng, [10, 1]),
                        _ => v4(&mut rng, [192, 0]),
                    },
                    IpAddr::V6(_) => {
                        let net = rng.gen_range(0..6);
                        v6(&mut rng, net)
                    }
                };
                if own(src) {
                    continue;
                }
                let q = Query {
                    iif: Some(iif),
                    src: Some(src),
                    ..Query::to(dst)
                };
                let full = snap.lookup(&q).map(Hop::from);
                assert_eq!(full.as_ref(), Ok(hop), "{src} -> {dst} on {iif}");
            }
        }
        assert!(decided > 1_000, "{decided}");
        // A rule that selects by source: no destination decides alone.
        let snap = snapshot(&format!(
            "{LINKS}{routes}route add 10.1.0.0/16 via 10.0.0.2 table 100
rule add from 192.0.2.0/24 lookup 100 pref 100
"
        ));
        let a0 = snap.links().find(|l| l.name == "a0").unwrap().index;
        for dst in ["10.1.2.3", "10.4.0.1", "2001:db8:2::5"] {
            let dst: IpAddr = dst.parse().unwrap();
            if dst.is_ipv4() {
                assert_eq!(snap.hop_by_destination(a0, dst), None, "{dst}");
            }
        }
    }

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
            assert_eq!(hop.map(Hop::from), answer, "{dst}");
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
    pub(crate) fn agree_on(snap: &Snapshot, flows: &[Query]) {
        let mut batched = vec![Err(NoRoute::NetworkUnreachable); flows.len()];
        snap.lookup_batch(flows, &mut batched);
        // Flows alike batched together, as the packet path batches them (one family, one
        // input link): the batch's quickest way.
        let mut alike: Vec<&Query> = flows.iter().collect();
        alike.sort_by_key(|q| (q.dst.is_ipv6(), q.iif, q.oif.is_some(), q.src.is_some()));
        let alike: Vec<Query> = alike.into_iter().cloned().collect();
        let mut together = vec![Err(NoRoute::NetworkUnreachable); flows.len()];
        snap.lookup_batch(&alike, &mut together);
        for (q, h) in alike.iter().zip(together) {
            assert_eq!(h, snap.lookup(q), "{q:?} batched with flows alike");
        }
        // The flows a vector can hold (one family and input link, no output link, a
        // source for each arriving flow), as addresses side by side.
        for first in flows {
            let fits = |q: &&Query| {
                q.dst.is_ipv6() == first.dst.is_ipv6()
                    && q.iif == first.iif
                    && q.oif.is_none()
                    && q.src.is_some_and(|s| s.is_ipv6() == q.dst.is_ipv6()) == q.iif.is_some()
                    && (q.iif.is_some() || q.src.is_none())
            };
            let vector: Vec<Query> = flows.iter().filter(fits).cloned().collect();
            if vector.is_empty() {
                continue;
            }
            let mut out = VectorAnswers::new();
            let flow = |i: usize| vector[i].clone();
            let iif = first.iif;
            // Arriving flows' sources; none for flows this host sends.
            let src = |q: &Query| iif.and(q.src);
            // Each flow's destination and (arriving) source of the vector's family.
            fn sides<A>(
                vector: &[Query],
                src: impl Fn(&Query) -> Option<IpAddr>,
                pick: impl Fn(IpAddr) -> Option<A>,
            ) -> (Vec<A>, Vec<A>) {
                let dst = vector.iter().filter_map(|q| pick(q.dst)).collect();
                let src = vector
                    .iter()
                    .filter_map(|q| src(q).and_then(&pick))
                    .collect();
                (dst, src)
            }
            match first.dst {
                IpAddr::V4(_) => {
                    let (dst, src) = sides(&vector, src, |a| match a {
                        IpAddr::V4(a) => Some(a),
                        IpAddr::V6(_) => None,
                    });
                    let v = FlowVector {
                        iif,
                        dst: &dst,
                        src: &src,
                    };
                    snap.lookup_vector_v4(&v, flow, &mut out);
                }
                IpAddr::V6(_) => {
                    let (dst, src) = sides(&vector, src, |a| match a {
                        IpAddr::V6(a) => Some(a),
                        IpAddr::V4(_) => None,
                    });
                    let v = FlowVector {
                        iif,
                        dst: &dst,
                        src: &src,
                    };
                    snap.lookup_vector_v6(&v, flow, &mut out);
                }
            }
            assert_eq!(out.len(), vector.len());
            for (q, h) in vector.iter().zip(out.iter()) {
                assert_eq!(
                    h.copied(),
                    snap.lookup(q).map(Hop::from),
                    "{q:?} in a vector"
                );
            }
        }
        for (q, batched) in flows.iter().zip(batched) {
            let answer = snap.route(q).map(|a| Hop {
                kind: a.kind,
                table: a.table,
                dev: a.dev,
                gateway: a.gateway,
                mtu: a.mtu,
            });
            assert_eq!(snap.lookup(q).map(Hop::from), answer, "{q:?}");
            assert_eq!(batched.map(Hop::from), answer, "{q:?} batched");
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

    /// Flows mostly alike, `odd` of them placed among `plain` ones, arriving on `iif`
    /// from `src` (each `odd` flow its own source and destination), batched together.
    fn alike(
        iif: Option<LinkIndex>,
        src: Option<&str>,
        plain: &[&str],
        odd: &[(&str, &str)],
    ) -> Vec<Query> {
        let at = |dst: &str, src: Option<&str>| {
            let mut q = Query::to(dst.parse().unwrap());
            q.src = src.map(|s| s.parse().unwrap());
            q.iif = iif;
            q
        };
        let mut flows: Vec<Query> = (0..BATCH)
            .map(|i| at(plain[i % plain.len()], src))
            .collect();
        for (k, (dst, src)) in odd.iter().enumerate() {
            flows[3 + 4 * k] = at(dst, Some(*src).filter(|s| !s.is_empty()));
        }
        flows
    }

    #[test]
    fn flows_alike_take_the_quick_way_with_the_same_answers() {
        let base = format!(
            "{LINKS}route add 10.5.0.0/16 via 10.0.1.2
route add 10.6.0.0/16 nexthop via 10.0.0.2 nexthop via 10.0.1.2
route add 10.7.0.0/16 via 10.0.0.2
route add unreachable 10.8.0.0/16
route add multicast 10.10.0.0/16 dev a1
-6 addr add 2001:db8:1::1/64 dev a1 nodad
-6 route add 2001:db8:5::/48 via 2001:db8:1::2
-6 route add 2001:db8:6::/48 via 2001:db8::2
"
        );
        let plain4 = [
            "10.5.1.1",
            "10.6.2.2",
            "10.6.9.9",
            "10.0.1.9",
            "10.8.0.1",
            "192.0.2.1",
        ];
        let plain6 = [
            "2001:db8:5::1",
            "2001:db8:6::1",
            "2001:db8:1::9",
            "2001:db9::1",
        ];
        for extra in [
            "",
            // A local route added: every arriving source is looked up.
            "route add local 10.9.0.1 dev a0 table local\n",
            // Rules with selectors, matching only flows among the odd ones.
            "rule add to 10.11.0.0/16 prohibit pref 10\n-6 rule add to 2001:db8:8::/48 prohibit pref 10\n",
            // Two IPv6 routes of one metric: the input link chooses.
            "-6 route add 2001:db8:7::/64 dev a0 metric 9\n-6 route append 2001:db8:7::/64 dev a1 metric 9\n",
        ] {
            let snap = snapshot(&format!("{base}{extra}"));
            let a0 = snap.links().find(|l| l.name == "a0").unwrap().index;
            let a1 = snap.links().find(|l| l.name == "a1").unwrap().index;
            // Arriving IPv4 flows: sources this host's, broadcast, martian; flows sent
            // back out of their input link; martian destinations; another link, family
            // or an output link among them.
            let odd4 = [
                ("10.5.1.1", "10.0.1.1"),
                ("10.5.1.1", "10.0.0.255"),
                ("10.5.1.1", "255.255.255.255"),
                ("10.5.1.1", "224.0.0.5"),
                ("10.5.1.1", "0.1.2.3"),
                ("10.5.1.1", "127.0.0.1"),
                ("10.7.0.1", "192.0.2.7"),
                ("10.0.0.9", "192.0.2.7"),
                // A source whose way back is not unicast: refused where it is looked up.
                ("10.5.1.1", "10.10.0.5"),
                ("10.7.0.1", "10.10.0.5"),
                ("127.0.0.1", "192.0.2.7"),
                ("0.1.2.3", "192.0.2.7"),
                ("10.11.0.1", "192.0.2.7"),
                ("2001:db8:5::1", "2001:db8::9"),
            ];
            for iif in [a0, a1] {
                let mut flows = alike(Some(iif), Some("192.0.2.7"), &plain4, &odd4);
                flows[50].iif = Some(if iif == a0 { a1 } else { a0 });
                flows[51].oif = Some(a1);
                agree_on(&snap, &flows);
            }
            // Sent by this host: with no source, one with a source among them.
            let odd = [("10.5.1.1", "10.0.0.1"), ("10.5.1.1", "192.0.2.9"), ("127.0.0.1", "")];
            let flows = alike(None, None, &plain4, &odd);
            agree_on(&snap, &flows);
            // Arriving IPv6 flows: strict destinations, an IPv4 source, another family.
            let odd6 = [
                ("fe80::1", "2001:db8::9"),
                ("ff02::1", "2001:db8::9"),
                ("::1", "2001:db8::9"),
                ("2001:db8:7::1", "2001:db8::9"),
                ("2001:db8:8::1", "2001:db8::9"),
                ("10.5.1.1", "192.0.2.7"),
            ];
            for iif in [Some(a0), Some(a1), None] {
                let src = iif.map(|_| "2001:db8:ff::7");
                agree_on(&snap, &alike(iif, src, &plain6, &odd6));
            }
        }
    }

    #[test]
    fn strict_ipv6_destinations_are_told_apart_on_keys_as_on_addresses() {
        let mut addrs: Vec<u128> = [
            "::1",
            "::",
            "::2",
            "fe80::1",
            "febf:ffff::1",
            "fec0::1",
            "fe7f::1",
            "ff02::1",
            "ff00::",
            "feff::1",
            "2001:db8::1",
        ]
        .iter()
        .map(|a| u128::from(a.parse::<Ipv6Addr>().unwrap()))
        .collect();
        let mut x = 0x9e37_79b9_7f4a_7c15_u128;
        for _ in 0..10_000 {
            x = x.wrapping_mul(0x2545_f491_4f6c_dd1d).wrapping_add(1);
            // Random addresses, many of them under the strict prefixes.
            addrs.push(x ^ (x << 64 & (0xfe80 << 112)));
        }
        for a in addrs {
            let addr = IpAddr::V6(Ipv6Addr::from(a));
            assert_eq!(strict_v6(a), crate::walk::needs_strict_oif(addr), "{addr}");
        }
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
