//! What a [`Snapshot`] can do: every method of it, in one place.
//!
//! A snapshot is a [`State`] compiled for lookups, and never changes: readers hold one and
//! look up against all of it while a writer compiles the next. Its methods are declared
//! here, each a call into the module that does the work, inlined always so that the call
//! costs nothing:
//!
//! - `walk`: the full lookup, the kernel's checks, rule walk and table lookups, answered
//!   as `ip route get` prints it ([`Snapshot::route`]);
//! - `forward`: the forwarding lookup, the same answers cut down to a [`Hop`] and found by
//!   as few searches as the compile allows ([`Snapshot::lookup`],
//!   [`Snapshot::lookup_batch`]);
//! - `vector`: the forwarding lookup of a packet path's vectors of flows
//!   ([`Snapshot::lookup_vector_v4`]);
//! - `special`: IPv4's multicast and broadcast destinations, which the tables alone do
//!   not answer;
//! - `compile` and `patch`: a state compiled into a snapshot, and a snapshot brought up to
//!   a changed state in place.
//!
//! What a snapshot holds, its tables and their searches, is in `layout`.

use crate::answers::Unnumbered;
use crate::compile;
use crate::forward::{self, AlikeBatch, AlikePlan};
use crate::hop::{Hop, HopRef};
use crate::layout::{self, CompiledTable, FamilyFib, Node, Snapshot, SnapshotMemory};
use crate::link::{Link, LinkIndex};
use crate::net::Family;
use crate::nexthop::{Nexthop, NexthopId};
use crate::patch::{self, Touched};
use crate::query::{Answer, NoRoute, Query, BATCH};
use crate::route::{Path, RouteBody, RouteType};
use crate::source;
use crate::special;
use crate::state::State;
use crate::vector::{self, FlowVector, VectorAnswers};
use crate::walk::{self, Checked, Concluded, Prepared, WalkFor};
use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What users of a snapshot can do.
impl Snapshot {
    /// Routes a query as the kernel's `ip route get` would.
    #[inline(always)]
    pub fn route(&self, q: &Query) -> Result<Answer, NoRoute> {
        walk::route(self, q)
    }

    /// Where a flow goes: the same answer as [`Snapshot::route`] (its type, table, link
    /// and gateway), without building the rest of it.
    #[inline(always)]
    pub fn lookup<'s>(&'s self, q: &Query) -> Result<HopRef<'s>, NoRoute> {
        forward::lookup(self, q)
    }

    /// [`Snapshot::lookup`] for many flows: `out[i]` is `flows[i]`'s answer. Flows of both
    /// families may be mixed.
    ///
    /// # Panics
    /// If `out` is shorter than `flows`.
    #[inline(always)]
    pub fn lookup_batch<'s>(&'s self, flows: &[Query], out: &mut [Result<HopRef<'s>, NoRoute>]) {
        forward::lookup_batch(self, flows, out)
    }

    /// [`Snapshot::lookup`] for a vector of IPv4 flows as a packet path holds it: flow
    /// `i`'s answer is `out.get(i)`, named by `out.ids()[i]`. The flows arrive on `v.iif`
    /// from `v.src[i]` to `v.dst[i]` (or, with `v.iif` `None` and `v.src` empty, this host
    /// sends them from no given source). Most flows are answered from their addresses
    /// alone, in two tight passes around one batched search; `flow(i)` gives flow `i`'s
    /// whole query (its mark, TOS, protocol and ports too) for the few that need more:
    /// where rules with selectors exist, where an address is martian or this host's, or
    /// the general way. It must agree with `v` on the addresses and the input link.
    ///
    /// # Panics
    /// If `v.src` is neither as long as `v.dst` nor empty.
    #[inline(always)]
    pub fn lookup_vector_v4<'s>(
        &'s self,
        v: &FlowVector<'_, Ipv4Addr>,
        flow: impl Fn(usize) -> Query,
        out: &mut VectorAnswers<'s>,
    ) {
        vector::lookup_vector_v4(self, v, flow, out)
    }

    /// [`Snapshot::lookup_vector_v4`] for IPv6 flows.
    ///
    /// # Panics
    /// If `v.src` is neither as long as `v.dst` nor empty.
    #[inline(always)]
    pub fn lookup_vector_v6<'s>(
        &'s self,
        v: &FlowVector<'_, Ipv6Addr>,
        flow: impl Fn(usize) -> Query,
        out: &mut VectorAnswers<'s>,
    ) {
        vector::lookup_vector_v6(self, v, flow, out)
    }

    /// The hop of every flow arriving on link `iif` to `dst` whose source is neither a
    /// martian (IPv4: 0/8, 127/8, multicast, limited broadcast; IPv6: unspecified,
    /// loopback, multicast, link-local) nor inside a prefix of one of this host's local,
    /// broadcast, anycast or multicast routes, whatever else the flow carries: where the
    /// one search decides it, with one path, a unicast route that sets no MTU of its own,
    /// leaving by another link. Such a decision can be kept for the destination and the
    /// input link (the express path). `None` where a flow's source, marks, ports or
    /// anything but its destination may change the answer.
    #[inline(always)]
    pub fn hop_by_destination(&self, iif: LinkIndex, dst: IpAddr) -> Option<&Hop> {
        forward::hop_by_destination(self, iif, dst)
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
    pub fn answers_from_v6(&self, iif: LinkIndex, addr: Ipv6Addr) -> bool {
        source::answers_from_v6(&self.addrs, iif, addr)
    }

    /// A link by index.
    pub fn link(&self, index: LinkIndex) -> Option<&Link> {
        self.links.get(&index)
    }

    /// The links.
    pub fn links(&self) -> impl Iterator<Item = &Link> {
        self.links.values()
    }

    /// A number that names this snapshot's content: every snapshot compiled, and every
    /// patch of one, gets a number no snapshot had before; a clone keeps its original's
    /// (their content is the same). A reader that keeps what it derived from a
    /// snapshot's answers (a packet path's adjacencies) keeps it while the serial stays.
    pub fn serial(&self) -> u64 {
        self.serial
    }

    /// Bytes each table takes (structure, nodes and routes), by family and table id.
    #[inline(always)]
    pub fn memory_by_table(&self) -> Vec<(Family, u32, usize)> {
        layout::memory_by_table(self)
    }

    /// Bytes the snapshot's tables take, in two parts: the lookup structures (each
    /// table's LPM searches and their hops) and the routes (the nodes holding the routes
    /// of each destination, for the full walk).
    #[inline(always)]
    pub fn memory_parts(&self) -> SnapshotMemory {
        layout::memory_parts(self)
    }

    /// Bytes the compiled rules of each family take: the rules, their index (when there
    /// are enough rules to have one), and the merged searches of tables they compile to.
    #[inline(always)]
    pub fn memory_of_rules(&self) -> Vec<(Family, usize)> {
        layout::memory_of_rules(self)
    }
}

/// What the crate's modules call of one another.
impl Snapshot {
    // Its parts.

    /// Family `f`'s rules and tables.
    #[inline]
    pub(crate) fn fib(&self, f: Family) -> &FamilyFib {
        match f {
            Family::V4 => &self.v4,
            Family::V6 => &self.v6,
        }
    }

    /// Family `f`'s rules and tables, to change.
    #[inline]
    pub(crate) fn fib_mut(&mut self, f: Family) -> &mut FamilyFib {
        match f {
            Family::V4 => &mut self.v4,
            Family::V6 => &mut self.v6,
        }
    }

    // Compiled and patched (`compile`, `patch`).

    /// Takes the state's links, addresses and nexthop objects (`objects`), and what is
    /// derived of them but the answers.
    #[inline(always)]
    pub(crate) fn take_links(
        &mut self,
        state: &State,
        nexthops: BTreeMap<NexthopId, Nexthop>,
        object_paths: BTreeMap<NexthopId, Vec<Path>>,
    ) {
        compile::take_links(self, state, nexthops, object_paths)
    }

    /// Makes the filter of this host's and the broadcast addresses again.
    #[inline(always)]
    pub(crate) fn refilter_own_addresses(&mut self) {
        compile::refilter_own_addresses(self)
    }

    /// Makes the answers of table `t` of family `f` (its nodes and their parents made)
    /// and the forwarding lookup's structure of them.
    #[inline(always)]
    pub(crate) fn answer_table(&mut self, f: Family, t: usize) {
        compile::answer_table(self, f, t)
    }

    /// The answer of a node of table `table` to a flow with no output link, its hops
    /// not yet numbered.
    #[inline(always)]
    pub(crate) fn unnumbered_answer(&self, table: u32, node: &Node) -> Unnumbered {
        walk::unnumbered_answer(self, table, node)
    }

    /// Makes `main`'s structure of family `family`, just answered apart from `local`'s,
    /// answer as the walk through `local` then `main` ([`CompiledTable::plain_holds`])
    /// where every walk of the family looks up `local` first (IPv6's default rules, and
    /// IPv4's once parted): its answers are set again at `local`'s prefixes and at
    /// `main`'s under them, a few, where a search merging the two would be made whole
    /// beside it (a full IPv6 table's: a fifth of its compile, and its memory again).
    #[inline(always)]
    pub(crate) fn hold_local(&mut self, state: &State, family: Family) {
        patch::hold_local(self, state, family)
    }

    /// Brings this snapshot, compiled from `state` but for what `touched` names, up to
    /// `state` in place. False if it cannot be patched (more than routes changed, or too
    /// much): compile the state anew.
    #[inline(always)]
    pub(crate) fn patch(&mut self, state: &State, touched: &Touched) -> bool {
        patch::patch(self, state, touched)
    }

    /// Shares with `other` (the snapshot published beside this one) the chunks of nodes
    /// and answers whose contents are the same in both: after a patch, all but those
    /// the last batch changed. The two snapshots of a published state so hold their
    /// nodes once.
    #[inline(always)]
    pub(crate) fn share_with(&mut self, other: &Snapshot) {
        patch::share_with(self, other)
    }

    // The full lookup (`walk`): the checks, the rule walk and the answer.

    /// The checks a query passes before the rule walk (`ip_route_output_key`'s and
    /// `ip_route_input`'s), and the walk's parameters.
    #[inline(always)]
    pub(crate) fn prepare(&self, q: &Query) -> Result<Prepared, NoRoute> {
        walk::prepare(self, q)
    }

    /// [`Snapshot::prepare`] without the copy of the query.
    #[inline(always)]
    pub(crate) fn check(&self, q: &Query) -> Result<Checked, NoRoute> {
        walk::check(self, q)
    }

    /// [`Snapshot::check`] of one of many flows: `seen` is the input link of the flow
    /// checked before (flows of a batch mostly arrive on one link), found again at no cost.
    #[inline(always)]
    pub(crate) fn check_seen<'a>(
        &'a self,
        q: &Query,
        seen: &mut Option<&'a Link>,
    ) -> Result<Checked, NoRoute> {
        walk::check_seen(self, q, seen)
    }

    /// The rule walk: the answering route, its prefix length and table.
    #[inline(always)]
    pub(crate) fn walk(
        &self,
        q: &Query,
        family: Family,
        oif: Option<LinkIndex>,
        iif: LinkIndex,
        min_scope: u8,
        purpose: WalkFor,
    ) -> Result<(&RouteBody, u8, u32), NoRoute> {
        walk::walk(self, q, family, oif, iif, min_scope, purpose)
    }

    /// What the rule walk's outcome means for the query: the route and table, or, for an
    /// IPv4 flow with an output link that no route covers, that link, "assuming it is on
    /// link" as the kernel does.
    #[inline(always)]
    pub(crate) fn conclude<'a>(
        &self,
        p: &Prepared,
        walk: Result<(&'a RouteBody, u8, u32), NoRoute>,
    ) -> Result<Concluded<'a>, NoRoute> {
        walk::conclude(self, p, walk)
    }

    /// A route's paths: its own, or its nexthop object's.
    #[inline(always)]
    pub(crate) fn paths_of<'a>(&'a self, route: &'a RouteBody) -> &'a [Path] {
        walk::paths_of(self, route)
    }

    /// The `local` route of `table` holding `addr`, if the table's lookup answers one.
    #[inline(always)]
    pub(crate) fn local_route<'a>(
        &self,
        table: &'a CompiledTable,
        addr: IpAddr,
    ) -> Option<&'a RouteBody> {
        walk::local_route(self, table, addr)
    }

    /// The output link a flow's paths must leave by: its `oif`, except that IPv6 with a
    /// source only prefers it, taking any path when none leaves by it.
    #[inline(always)]
    pub(crate) fn path_oif(
        &self,
        q: &Query,
        family: Family,
        route: &RouteBody,
    ) -> Option<LinkIndex> {
        walk::path_oif(self, q, family, route)
    }

    /// The path of `route` a flow takes. Leaving by a given output link: the first live
    /// path by it, as the kernel's lookup matches the link (no hashing). Otherwise the
    /// multipath hash chooses among the live paths (see [`multipath`]).
    #[inline(always)]
    pub(crate) fn choose_path<'a>(
        &'a self,
        route: &'a RouteBody,
        oif: Option<LinkIndex>,
        q: &Query,
        input: bool,
    ) -> Option<&'a Path> {
        walk::choose_path(self, route, oif, q, input)
    }

    /// The answer for a route that fits: the path chosen by the flow's hash, the source.
    #[inline(always)]
    pub(crate) fn answer(
        &self,
        q: &Query,
        family: Family,
        route: &RouteBody,
        table: u32,
        iif: Option<LinkIndex>,
    ) -> Result<Answer, NoRoute> {
        walk::answer(self, q, family, route, table, iif)
    }

    /// An IPv4 flow sent out of `oif` with no route.
    #[inline(always)]
    pub(crate) fn bare_answer(&self, q: &Query, oif: LinkIndex) -> Answer {
        walk::bare_answer(self, q, oif)
    }

    /// Whether an IPv4 flow arriving on a link needs more than the plain answers to check
    /// its source (`src`, as the query gives it): the source is one of this host's
    /// addresses or a broadcast address, or rules or local routes were added (the kernel
    /// then looks the source up).
    #[inline(always)]
    pub(crate) fn input_needs_source_check(&self, c: &Checked, src: Option<IpAddr>) -> bool {
        walk::input_needs_source_check(self, c, src)
    }

    /// Whether a flow's plain answers hold for it: not for an IPv6 flow arriving on a
    /// link where that link could change which route answers (some prefix has several
    /// routes of one metric), or whose destination makes the kernel match the link
    /// strictly (link-local, multicast, loopback).
    #[inline(always)]
    pub(crate) fn plain_answers_hold(&self, c: &Checked, dst: IpAddr) -> bool {
        walk::plain_answers_hold(self, c, dst)
    }

    /// The kernel's source check of an IPv4 flow arriving on a link (`fib_validate_source`
    /// with `rp_filter` off), for what the lookup answered: a local, broadcast or
    /// forwarded unicast route (`dev`: the chosen path's link). While no rule or local
    /// route was added and the flow leaves by another link, the source must only not be
    /// this host's; otherwise the source is looked up as a destination (from the output
    /// link, or the loopback), and anything but a unicast route there is refused.
    #[inline(always)]
    pub(crate) fn validate_source(
        &self,
        q: &Query,
        input: Option<LinkIndex>,
        route: &RouteBody,
        dev: LinkIndex,
    ) -> Result<(), NoRoute> {
        walk::validate_source(self, q, input, route, dev)
    }

    /// [`Snapshot::validate_source`] of a flow whose answer is of type `kind` through `dev`.
    #[inline(always)]
    pub(crate) fn validate_source_of(
        &self,
        q: &Query,
        input: Option<LinkIndex>,
        kind: RouteType,
        dev: LinkIndex,
    ) -> Result<(), NoRoute> {
        walk::validate_source_of(self, q, input, kind, dev)
    }

    /// [`Snapshot::validate_source`] of an arriving flow with source `src` whose route is
    /// of type `kind` through `dev`; `back(flow, iif)` is the type of the route that
    /// answers the flow back to the source arriving on `iif` (`Some(None)`: none), or
    /// `None` if it cannot tell, and then neither can this.
    #[inline(always)]
    pub(crate) fn check_source(
        &self,
        q: &Query,
        input: Option<LinkIndex>,
        src: Option<IpAddr>,
        kind: RouteType,
        dev: LinkIndex,
        back: impl FnOnce(&Query, LinkIndex) -> Option<Option<RouteType>>,
    ) -> Option<Result<(), NoRoute>> {
        walk::check_source(self, q, input, src, kind, dev, back)
    }

    /// The kernel's `fib_check_nh_v4_gw`: an IPv4 gateway is looked up in the route's
    /// table (unless `main`; a miss or a reject route there falls back), then through the
    /// rules, routes of a scope narrower than `min_scope` skipped. The route found must be
    /// unicast or local: its link and its scope.
    #[inline(always)]
    pub(crate) fn gateway_v4(
        &self,
        table: u32,
        gw: IpAddr,
        oif: Option<LinkIndex>,
        min_scope: u8,
    ) -> Option<(LinkIndex, u8)> {
        walk::gateway_v4(self, table, gw, oif, min_scope)
    }

    /// The kernel's `ip6_route_check_nh`: an IPv6 gateway is looked up in the route's own
    /// table (`main` included); if that finds no route straight onto a link (of `oif`, if
    /// given), through the rules, where a reject rule, a reject route or a route via a
    /// gateway refuses it. The link the gateway is on.
    #[inline(always)]
    pub(crate) fn gateway_v6(
        &self,
        table: u32,
        gw: IpAddr,
        oif: Option<LinkIndex>,
    ) -> Option<LinkIndex> {
        walk::gateway_v6(self, table, gw, oif)
    }

    /// The kernel's `ip6_route_check_nh_onlink`: an `onlink` IPv6 gateway that `main`
    /// routes (other than a default route) to another link, or by a route not unicast,
    /// is refused.
    #[inline(always)]
    pub(crate) fn onlink_gateway_v6_conflicts(&self, gw: IpAddr, dev: LinkIndex) -> bool {
        walk::onlink_gateway_v6_conflicts(self, gw, dev)
    }

    // IPv4's special destinations (`special`).

    /// The kernel's answer to an IPv4 flow whose destination is multicast, the limited
    /// broadcast or `0.0.0.0` (see the module's comment); `None` for any other flow, which
    /// the tables answer.
    #[inline(always)]
    pub(crate) fn special_v4(&self, q: &Query) -> Option<Result<Answer, NoRoute>> {
        special::special_v4(self, q)
    }

    // The forwarding lookup's passes (`forward`), which the vector lookup (`vector`)
    // takes too.

    /// Where flows of `family` arriving on `iif` (or sent by this host: `None`) can be
    /// answered as flows alike: by the family's one merged search, arriving on a link that
    /// is not the loopback, and (IPv6) on one whose routes the input link does not choose
    /// between. `None`: the general way answers them.
    #[inline(always)]
    pub(crate) fn alike_way(
        &self,
        family: Family,
        iif: Option<LinkIndex>,
    ) -> Option<AlikePlan<'_>> {
        forward::alike_way(self, family, iif)
    }

    /// The first `a.n` of up to [`BATCH`] IPv4 flows alike (checked `c`), by destination
    /// `keys` and source `srcs` (host order; unused for flows sent by this host), `a.odd`
    /// those already known not to be alike ([`AlikeBatch::start`]); `flow(i)` is flow `i`'s
    /// whole query. First pass: the martian checks ([`crate::quick::martians_v4`]) and the
    /// rule selectors' test. Then one batched search. Second pass: which flows the search
    /// answered with one hop needing no source check ([`crate::quick::quick_hops`]). The
    /// flows not alike are looked up one by one; `false`, with nothing written, when more
    /// than a quarter are.
    #[inline(always)]
    pub(crate) fn alike_v4<Q: Borrow<Query>>(
        &self,
        way: &AlikePlan<'_>,
        keys: &[u32; BATCH],
        srcs: &[u32; BATCH],
        flow: impl Fn(usize) -> Q,
        a: &mut AlikeBatch,
    ) -> bool {
        forward::alike_v4(self, way, keys, srcs, flow, a)
    }

    /// [`Snapshot::alike_v4`] for IPv6 flows: neither the source nor the way back is
    /// checked, but a destination the input link must reach (link-local, multicast, the
    /// loopback's) is not alike.
    #[inline(always)]
    pub(crate) fn alike_v6<Q: Borrow<Query>>(
        &self,
        way: &AlikePlan<'_>,
        keys: &[u128; BATCH],
        flow: impl Fn(usize) -> Q,
        a: &mut AlikeBatch,
    ) -> bool {
        forward::alike_v6(self, way, keys, flow, a)
    }

    /// The answer of flow `i` (`q`) of a batch of flows alike that is not quick: looked
    /// up alone if it is not alike, else from what the search found, checked in full.
    #[inline(always)]
    pub(crate) fn answer_slow<'s>(
        &'s self,
        way: &AlikePlan<'s>,
        a: &AlikeBatch,
        i: usize,
        q: &Query,
    ) -> Result<HopRef<'s>, NoRoute> {
        forward::answer_slow(self, way, a, i, q)
    }

    /// Up to [`BATCH`] flows, round by round through the rules.
    #[inline(always)]
    pub(crate) fn lookup_rounds<'s>(
        &'s self,
        flows: &[Query],
        out: &mut [Result<HopRef<'s>, NoRoute>],
    ) {
        forward::lookup_rounds(self, flows, out)
    }
}
