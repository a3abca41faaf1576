//! The routing state and the kernel's rules for changing it.
//!
//! [`State`] holds links, addresses, tables of routes, policy rules and nexthop objects as
//! plain ordered collections, and changes them as Linux does: an address adds its local,
//! broadcast and connected routes; a link going down takes the routes through it away; a
//! route add, replace, append, prepend, change or delete touches the route the kernel would
//! touch; a refused change says why in the kernel's words and leaves the state as it was.
//! Lookups do not read this structure: [`State::snapshot`] compiles it into the published
//! form, a [`Snapshot`](crate::Snapshot) (`compile`).

use crate::link::{eui64_link_local, AddrGenMode, Address, Link, LinkIndex, LinkKind};
use crate::multipath::Multipath;
use crate::names::*;
use crate::net::{quote, Family, Net};
use crate::nexthop::{Nexthop, NexthopId, NexthopKind};
use crate::route::{Path, Paths, Route, RouteBody, RouteType};
use crate::rule::{Rule, RuleAction, RuleLink};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::ops::Bound::{Excluded, Unbounded};
use std::sync::Arc;

/// A change the kernel would refuse, in the kernel's words (`Error: ...` for messages the
/// kernel explains, `RTNETLINK answers: ...` for bare errors).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused(pub String);

impl Refused {
    /// An explained refusal: `Error: TEXT.`
    pub fn explained(text: &str) -> Refused {
        Refused(format!("Error: {text}."))
    }

    /// A bare refusal: `RTNETLINK answers: TEXT`.
    pub fn answers(text: &str) -> Refused {
        Refused(format!("RTNETLINK answers: {text}"))
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// How `ip route` changes a table: the netlink flags each command sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteOp {
    /// `add`: create; refuse if a route of the same key exists.
    Add,
    /// `replace`: replace the first route of the same key, or create.
    Replace,
    /// `change`: replace the first route of the same key; refuse if none.
    Change,
    /// `append`: create after the routes of the same key.
    Append,
    /// `prepend`: create before the routes of the same key.
    Prepend,
}

/// What `ip route del` names: every field given must match.
#[derive(Clone, Debug, Default)]
pub struct RouteFilter {
    /// The table (`main` when not given).
    pub table: Option<u32>,
    /// The destination.
    pub dst: Option<Net>,
    /// The source prefix: source routes, IPv6 as the kernel has them and IPv4 as fibre
    /// adds them (the kernel ignores `from` on IPv4 routes).
    pub src: Option<Net>,
    /// TOS.
    pub tos: u8,
    /// Metric (0: any).
    pub metric: u32,
    /// Type.
    pub kind: Option<RouteType>,
    /// Scope.
    pub scope: Option<u8>,
    /// Protocol.
    pub protocol: Option<u8>,
    /// Preferred source.
    pub prefsrc: Option<IpAddr>,
    /// Gateway.
    pub gateway: Option<IpAddr>,
    /// Link.
    pub dev: Option<LinkIndex>,
    /// Nexthop object.
    pub nhid: Option<NexthopId>,
}

/// The routes of one table of one family: for each (destination, source) prefix pair,
/// the kernel's ordered list of routes.
pub type TableRoutes = BTreeMap<(Net, Net), RouteList>;

/// The routes of one key (destination and source prefix), in the kernel's order, each
/// without the destination (the key holds it). Held once for every key with the same
/// routes (the state interns them: a full table through a few peers has a few such
/// lists) and shared
/// with the snapshots compiled from the state, whose node of a destination is this list
/// itself where one key has routes there: a change makes a new list, and the snapshots
/// keep the one they hold. A thin pointer (to a vector of exactly its routes): 8 bytes
/// in every key of a table and every node of a snapshot rather than a slice's 16, for
/// one more pointer followed where the routes themselves are read.
pub type RouteList = Arc<Vec<RouteBody>>;

/// Changes the routes of `list`, of destination `dst` in table `table`, with `change`: a
/// copy of them is changed and takes its place (the list held once for all the keys with
/// the same routes, see [`Shared`]), so that the snapshots and the other keys holding
/// the list keep theirs; the `tally` follows.
pub(crate) fn edit<T>(
    list: &mut RouteList,
    shared: &mut Shared,
    tally: &mut Tally,
    (table, dst): ((Family, u32), Net),
    change: impl FnOnce(&mut Vec<RouteBody>) -> T,
) -> T {
    tally.count(table, dst, list, false);
    let mut routes = list.to_vec();
    let out = change(&mut routes);
    for r in &mut routes {
        shared.paths.intern(&mut r.paths);
    }
    *list = shared.lists.held_list(routes);
    tally.count(table, dst, list, true);
    out
}

/// What the state counts of its routes as they change, so that neither a scrape of the
/// metrics nor a batch published to the packet path walks every route.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tally {
    /// Routes by family and table.
    routes: BTreeMap<(Family, u32), usize>,
    /// The destinations of routes that deliver to this host or its links (local,
    /// broadcast, anycast, multicast) in any table, each with how many there are.
    receiving: BTreeMap<Net, usize>,
}

impl Tally {
    /// Counts the routes of `list`, of table `table`, in (`add`) or out.
    fn count(&mut self, table: (Family, u32), dst: Net, list: &[RouteBody], add: bool) {
        let step = |n: &mut usize, by: usize| {
            *n = if add { *n + by } else { n.saturating_sub(by) };
            *n == 0
        };
        if !list.is_empty() {
            let n = self.routes.entry(table).or_default();
            if step(n, list.len()) {
                self.routes.remove(&table);
            }
        }
        for _ in list.iter().filter(|r| receives(r)) {
            let n = self.receiving.entry(dst).or_default();
            if step(n, 1) {
                self.receiving.remove(&dst);
            }
        }
    }
}

/// Whether `r` delivers to this host or its links: local, broadcast, anycast, multicast.
fn receives(r: &RouteBody) -> bool {
    matches!(
        r.kind,
        RouteType::Local | RouteType::Broadcast | RouteType::Anycast | RouteType::Multicast
    )
}

/// The whole routing state.
#[derive(Clone, Debug)]
pub struct State {
    links: BTreeMap<LinkIndex, Link>,
    next_index: LinkIndex,
    addrs: Vec<Address>,
    tables: BTreeMap<(Family, u32), TableRoutes>,
    rules: [Vec<Rule>; 2],
    nexthops: BTreeMap<NexthopId, Nexthop>,
    /// An IPv4 rule was ever added or deleted: lookups walk the rules (until then the
    /// kernel looks up `main` and `default` without them).
    v4_custom_rules: bool,
    /// An IPv4 rule was ever added or deleted: tables `local` and `main` are apart (until
    /// then the kernel keeps them merged in one structure, reported as `main`).
    v4_unmerged: bool,
    /// IPv6 tables the kernel has made (it makes one for a route or a rule naming it and
    /// keeps it, empty or not): deleting from another is "FIB table does not exist".
    v6_tables_made: BTreeSet<u32>,
    /// An IPv4 local route was ever added by a user (the kernel's
    /// `fib_has_custom_local_routes`): the source of an arriving flow is looked up.
    v4_custom_local_routes: bool,
    /// The multipath hash seed and policies.
    multipath: Multipath,
    /// A mirror of a kernel's state (`mirror`): the kernel reports the addresses and
    /// routes it derives, so none is derived here, and links' carriers are as reported.
    mirrored: bool,
    /// Each link's carrier as the kernel reported it (a mirror only).
    carriers: BTreeMap<LinkIndex, bool>,
    /// While kept ([`State::keep_journal`]): the destinations whose routes changed, by
    /// family and table, however they changed (a command, a report, or what a link or
    /// an address took with it). A published snapshot is patched at them.
    journal: Option<Vec<(Family, u32, Net)>>,
    /// The routes' lists of paths and lists of routes, each held once and shared by
    /// every holder of an equal one.
    shared: Shared,
    /// The destinations of the routes that use each nexthop object.
    object_users: BTreeMap<NexthopId, Users>,
    /// The destinations of the routes with a path of their own through each link.
    link_users: BTreeMap<LinkIndex, Users>,
    /// The destinations of the IPv4 routes with each preferred source.
    prefsrc_users: BTreeMap<IpAddr, Users>,
    /// The routes counted as they change.
    tally: Tally,
    /// A family whose routes are lent out while a dump is read
    /// ([`crate::Dumping::take_v4`]).
    lent: Option<Family>,
    /// A dump is being built ([`crate::Dumping`]): its routes are noted in the indexes
    /// of users as they are staged, before the tables hold them, so nothing is swept
    /// (what a message midway removed is swept as later destinations are noted).
    dumping: bool,
}

/// The destinations (by family and table) of the routes that use one thing, a nexthop
/// object or a link: what a change of it changes, found without a walk of every route.
/// It may hold destinations whose routes no longer use it (a route gone leaves its entry):
/// each new destination noted checks [`SWEPT_A_NOTE`] others in turn and drops those no
/// longer using it, so that an index holds about twice its live destinations at most
/// while they come and go (routes removed leave theirs until later ones are noted), and
/// no note sweeps it whole (a sweep at once of the index of a nexthop object carrying a
/// full table held the mirror for tens of milliseconds). A link's index stops past
/// [`LINK_USERS_HELD`] destinations (unless a sweep then leaves it half empty): a link
/// carrying more (an upstream with the full table) has its routes found by a walk, as the
/// kernel's `fib_flush` finds them.
#[derive(Clone, Debug)]
struct Users {
    /// `None`: too many to hold; a walk finds them.
    dsts: Option<BTreeSet<(Family, u32, Net)>>,
    /// The destination the sweep checked last: it goes on after it.
    swept_to: Option<(Family, u32, Net)>,
}

/// The most destinations a link's or a preferred source's [`Users`] holds.
const LINK_USERS_HELD: usize = 1 << 16;

/// How many other destinations of an index each one noted checks: two, so that the
/// sweep goes round faster than the index grows.
const SWEPT_A_NOTE: usize = 2;

impl Users {
    /// Notes destination `at`; `uses` says whether a destination's routes still use the
    /// thing (`None` while a dump is built: every destination is kept, none checked);
    /// past `held` after a sweep, the index gives up.
    fn note(
        &mut self,
        at: (Family, u32, Net),
        held: usize,
        uses: Option<impl Fn(&(Family, u32, Net)) -> bool>,
    ) {
        let Some(dsts) = &mut self.dsts else { return };
        if !dsts.insert(at) {
            return;
        }
        if dsts.len() > held {
            // The route being noted is not held yet: its destination stays.
            if let Some(uses) = &uses {
                dsts.retain(|d| *d == at || uses(d));
            }
            // Swept at the cap and still more than half full, the index gives up: kept,
            // it would be swept whole again every few notes.
            if dsts.len() > held / 2 {
                self.dsts = None;
            }
            return;
        }
        let Some(uses) = uses else { return };
        // Two others checked: `at` itself, if the sweep comes to it, is passed over and
        // not counted (counted, a destination noted right after the sweep's each time
        // would leave one check a note, and the index would grow without bound).
        let mut checked = 0;
        for _ in 0..=SWEPT_A_NOTE {
            if checked == SWEPT_A_NOTE {
                break;
            }
            let after = self
                .swept_to
                .and_then(|from| dsts.range((Excluded(from), Unbounded)).next());
            let Some(&d) = after.or_else(|| dsts.first()) else {
                break;
            };
            self.swept_to = Some(d);
            if d == at {
                continue;
            }
            checked += 1;
            if !uses(&d) {
                dsts.remove(&d);
            }
        }
    }
}

impl Default for Users {
    /// None yet, and indexed.
    fn default() -> Users {
        Users {
            dsts: Some(BTreeSet::new()),
            swept_to: None,
        }
    }
}

/// What the routes share, each held once: their lists of paths, and whole lists of
/// routes (a full table through a few peers has a few of each).
#[derive(Clone, Debug, Default)]
pub(crate) struct Shared {
    paths: Interned<[Path]>,
    lists: Interned<Vec<RouteBody>>,
}

/// Values held once each, shared by everything holding an equal one. Hashed by
/// `foldhash` (every route of a dump is looked up here: the standard SipHash took a
/// third of the time the mirror takes to apply a dump).
#[derive(Debug)]
struct Interned<T: ?Sized> {
    held: std::collections::HashSet<Arc<T>, foldhash::fast::RandomState>,
    /// How many there were after the last sweep of those no one else holds any more.
    swept: usize,
}

impl<T: ?Sized> Clone for Interned<T> {
    fn clone(&self) -> Self {
        Interned {
            held: self.held.clone(),
            swept: self.swept,
        }
    }
}

impl<T: ?Sized> Default for Interned<T> {
    fn default() -> Self {
        Interned {
            held: Default::default(),
            swept: 0,
        }
    }
}

impl<T: ?Sized + Eq + std::hash::Hash> Interned<T> {
    /// The value held equal to `value` (`value` itself, held from now on, if none).
    fn held(&mut self, value: Arc<T>) -> Arc<T> {
        if let Some(held) = self.held.get(&value) {
            return held.clone();
        }
        if self.held.len() >= 2 * self.swept.max(64) {
            self.held.retain(|l| Arc::strong_count(l) > 1);
            self.swept = self.held.len();
        }
        self.held.insert(value.clone());
        value
    }

    /// Bytes the values take (`size` of each, what it holds elsewhere included), each
    /// once, with their counts, and the set's slot.
    fn memory(&self, size: impl Fn(&T) -> usize) -> usize {
        self.held
            .iter()
            .map(|v| 2 * std::mem::size_of::<usize>() + size(v))
            .sum::<usize>()
            + self.held.capacity() * std::mem::size_of::<Arc<T>>()
    }
}

impl Interned<Vec<RouteBody>> {
    /// The list held equal to `routes`, or `routes` itself, held from now on: an equal
    /// list found (most are, a full table having a few), none is allocated.
    fn held_list(&mut self, mut routes: Vec<RouteBody>) -> RouteList {
        if let Some(held) = self.held.get(&routes) {
            return held.clone();
        }
        routes.shrink_to_fit();
        self.held(Arc::new(routes))
    }
}

impl Interned<[Path]> {
    /// Makes the paths of its own of `paths` those held equal to them.
    fn intern(&mut self, paths: &mut Paths) {
        if let Paths::Own(list) = paths {
            *list = self.held(list.clone());
        }
    }
}

/// Notes in `journal`, if kept, that the routes of `dst` in table `table` changed.
fn note(journal: &mut Option<Vec<(Family, u32, Net)>>, family: Family, table: u32, dst: Net) {
    if let Some(j) = journal {
        j.push((family, table, dst));
    }
}

/// The indexes of what routes use, borrowed beside the tables they index (which a sweep
/// reads).
struct UsersOf<'a> {
    tables: &'a BTreeMap<(Family, u32), TableRoutes>,
    /// Destinations whose routes `tables` may not hold yet ([`State::dumping`]): none
    /// is swept.
    dumping: bool,
    object: &'a mut BTreeMap<NexthopId, Users>,
    link: &'a mut BTreeMap<LinkIndex, Users>,
    prefsrc: &'a mut BTreeMap<IpAddr, Users>,
}

impl UsersOf<'_> {
    /// Notes destination `at` as a user of what `route` uses: its nexthop object, or the
    /// links of its own paths, and its preferred source.
    fn note(&mut self, at: (Family, u32, Net), route: &RouteBody) {
        let tables = self.tables;
        // The routes of a destination, for a sweep; none while a dump is built (its
        // routes are staged, not yet held: every destination is kept, unchecked).
        let swept = !self.dumping;
        let routes = move |f: Family, t: u32, dst: Net| routes_at(tables, f, t, dst);
        if let Some(src) = route.prefsrc {
            self.prefsrc.entry(src).or_default().note(
                at,
                LINK_USERS_HELD,
                swept.then_some(|&(f, t, dst): &(Family, u32, Net)| {
                    routes(f, t, dst).any(|r| r.prefsrc == Some(src))
                }),
            );
        }
        match &route.paths {
            Paths::Object(id) => {
                let id = *id;
                self.object.entry(id).or_default().note(
                    at,
                    usize::MAX,
                    swept.then_some(|&(f, t, dst): &(Family, u32, Net)| {
                        routes(f, t, dst).any(|r| r.paths == Paths::Object(id))
                    }),
                )
            }
            Paths::Own(paths) => {
                for (i, p) in paths.iter().enumerate() {
                    if paths[..i].iter().any(|o| o.dev == p.dev) {
                        continue;
                    }
                    let dev = p.dev;
                    self.link.entry(dev).or_default().note(
                        at,
                        LINK_USERS_HELD,
                        swept.then_some(|&(f, t, dst): &(Family, u32, Net)| {
                            routes(f, t, dst).any(|r| r.own_paths().iter().any(|p| p.dev == dev))
                        }),
                    )
                }
            }
            Paths::None => {}
        }
    }
}

mod mirror;
pub use mirror::Dumping;

impl Default for State {
    fn default() -> Self {
        State::new()
    }
}

fn fam_ix(f: Family) -> usize {
    match f {
        Family::V4 => 0,
        Family::V6 => 1,
    }
}

/// The kernel's default metric for IPv6 routes a user adds.
pub const IPV6_USER_METRIC: u32 = 1024;
/// The metric of IPv6 routes the kernel derives from addresses.
pub const IPV6_ADDR_METRIC: u32 = 256;

impl State {
    /// A fresh network namespace: `lo` (down), the default rules of both families, empty
    /// tables.
    pub fn new() -> State {
        let mut links = BTreeMap::new();
        links.insert(
            1,
            Link {
                index: 1,
                name: "lo".into(),
                kind: LinkKind::Loopback,
                up: false,
                mtu: 65536,
                mac: [0; 6],
                group: 0,
                addrgenmode: AddrGenMode::Eui64,
            },
        );
        State {
            shared: Shared::default(),
            links,
            next_index: 2,
            addrs: Vec::new(),
            tables: BTreeMap::new(),
            rules: [Rule::defaults(Family::V4), Rule::defaults(Family::V6)],
            nexthops: BTreeMap::new(),
            v4_custom_rules: false,
            v4_unmerged: false,
            v6_tables_made: [TABLE_LOCAL, TABLE_MAIN].into(),
            v4_custom_local_routes: false,
            multipath: Multipath::default(),
            mirrored: false,
            carriers: BTreeMap::new(),
            journal: None,
            object_users: BTreeMap::new(),
            link_users: BTreeMap::new(),
            prefsrc_users: BTreeMap::new(),
            tally: Tally::default(),
            lent: None,
            dumping: false,
        }
    }

    /// The multipath hash seed and policies.
    pub fn multipath(&self) -> Multipath {
        self.multipath
    }

    /// Sets the multipath hash seed and policies (the kernel's sysctls).
    pub fn set_multipath(&mut self, multipath: Multipath) {
        self.multipath = multipath;
    }

    // ----- reading -----

    /// The links, by index.
    pub fn links(&self) -> impl Iterator<Item = &Link> {
        self.links.values()
    }

    /// A link by index.
    pub fn link(&self, index: LinkIndex) -> Option<&Link> {
        self.links.get(&index)
    }

    /// A link by name.
    pub fn link_by_name(&self, name: &str) -> Option<&Link> {
        self.links.values().find(|l| l.name == name)
    }

    /// Whether a link has carrier: it is up and, for a veth, so is its peer.
    pub fn carrier(&self, index: LinkIndex) -> bool {
        if self.mirrored {
            return self.links.get(&index).is_some_and(|l| l.up)
                && self.carriers.get(&index).copied().unwrap_or(false);
        }
        match self.links.get(&index) {
            None => false,
            Some(l) => {
                l.up && match l.kind {
                    LinkKind::Veth { peer } => self.links.get(&peer).is_some_and(|p| p.up),
                    _ => true,
                }
            }
        }
    }

    /// The addresses, in the order the kernel lists them.
    pub fn addresses(&self) -> &[Address] {
        &self.addrs
    }

    /// The tables that hold routes, with their routes.
    pub fn tables(&self) -> impl Iterator<Item = (Family, u32, &TableRoutes)> {
        self.tables.iter().map(|(&(f, t), r)| (f, t, r))
    }

    /// Every route of `family` (and of `table`, if given), in table and prefix order.
    pub fn routes(&self, family: Family, table: Option<u32>) -> impl Iterator<Item = Route> + '_ {
        self.tables
            .iter()
            .filter(move |((f, t), _)| *f == family && table.is_none_or(|id| id == *t))
            .flat_map(|(_, routes)| {
                routes
                    .iter()
                    .flat_map(|((dst, _), l)| l.iter().map(|body| Route::new(*dst, body.clone())))
            })
    }

    /// Starts noting the destinations whose routes change (see [`State::take_journal`]).
    pub fn keep_journal(&mut self) {
        self.journal = Some(Vec::new());
    }

    /// The destinations whose routes changed since [`State::keep_journal`], by family,
    /// table and destination; no more are noted.
    pub fn take_journal(&mut self) -> Vec<(Family, u32, Net)> {
        let mut journal = self.journal.take().unwrap_or_default();
        // Stable: a journal is mostly runs in order (a link's routes, a dump's), which a
        // stable sort merges in linear time.
        journal.sort();
        journal.dedup();
        journal
    }

    /// The routes of one table, keyed by destination and source prefix.
    pub(crate) fn table_routes(&self, family: Family, table: u32) -> Option<&TableRoutes> {
        self.tables.get(&(family, table))
    }

    /// The rules of a family, in the order they are walked.
    pub fn rules(&self, family: Family) -> &[Rule] {
        &self.rules[fam_ix(family)]
    }

    /// Whether IPv4 lookups walk the rules (an IPv4 rule was ever added or deleted).
    pub fn v4_custom_rules(&self) -> bool {
        self.v4_custom_rules
    }

    /// Whether an IPv4 local route was ever added by a user.
    pub fn v4_custom_local_routes(&self) -> bool {
        self.v4_custom_local_routes
    }

    /// Whether IPv4 tables `local` and `main` are apart (a rule was ever added or deleted).
    pub fn v4_unmerged(&self) -> bool {
        self.v4_unmerged
    }

    /// The nexthop objects, by id.
    pub fn nexthops(&self) -> impl Iterator<Item = &Nexthop> {
        self.nexthops.values()
    }

    /// A nexthop object by id.
    pub fn nexthop(&self, id: NexthopId) -> Option<&Nexthop> {
        self.nexthops.get(&id)
    }

    fn resolve(&self, name: &str) -> Result<LinkIndex, Refused> {
        self.link_by_name(name)
            .map(|l| l.index)
            .ok_or_else(|| Refused(format!("Cannot find device {}", quote(name))))
    }

    // ----- links -----

    /// `ip link add NAME type veth peer name PEER` (the peer is made first, as the kernel
    /// does, and so has the lower index), or `type dummy` when `peer` is `None`.
    pub fn add_link(
        &mut self,
        name: &str,
        mac: Option<[u8; 6]>,
        peer: Option<(&str, Option<[u8; 6]>)>,
        mtu: Option<u32>,
    ) -> Result<(), Refused> {
        let names = std::iter::once(name).chain(peer.map(|p| p.0));
        for n in names {
            if n.is_empty() || n.len() > 15 || n.contains(['/', ' ']) {
                return Err(Refused::answers("Invalid argument"));
            }
            if self.link_by_name(n).is_some() {
                return Err(Refused::answers("File exists"));
            }
        }
        if peer.is_some_and(|p| p.0 == name) {
            return Err(Refused::answers("File exists"));
        }
        let mtu = mtu.unwrap_or(1500);
        if !(68..=65535).contains(&mtu) {
            return Err(Refused::answers("Invalid argument"));
        }
        let new = |index, name: &str, kind, mac: Option<[u8; 6]>| Link {
            index,
            name: name.to_string(),
            kind,
            up: false,
            mtu,
            mac: mac.unwrap_or([0x02, 0, 0, 0, (index >> 8) as u8, index as u8]),
            group: 0,
            addrgenmode: AddrGenMode::Eui64,
        };
        match peer {
            Some((peer_name, peer_mac)) => {
                let (pi, li) = (self.next_index, self.next_index + 1);
                self.next_index += 2;
                self.links.insert(
                    pi,
                    new(pi, peer_name, LinkKind::Veth { peer: li }, peer_mac),
                );
                self.links
                    .insert(li, new(li, name, LinkKind::Veth { peer: pi }, mac));
            }
            None => {
                let li = self.next_index;
                self.next_index += 1;
                self.links.insert(li, new(li, name, LinkKind::Dummy, mac));
            }
        }
        self.refresh_rule_links();
        Ok(())
    }

    /// `ip link del DEV` (a veth takes its peer with it).
    pub fn del_link(&mut self, name: &str) -> Result<(), Refused> {
        let index = self.resolve(name)?;
        let link = &self.links[&index];
        if link.kind == LinkKind::Loopback {
            return Err(Refused::answers("Operation not supported"));
        }
        let mut gone = vec![index];
        if let LinkKind::Veth { peer } = link.kind {
            gone.push(peer);
        }
        for &i in &gone {
            self.set_up(i, false);
            self.addrs.retain(|a| a.link != i);
            self.flush_dev(i, None, true);
            self.links.remove(&i);
        }
        self.nexthops_link_gone(&gone);
        self.refresh_rule_links();
        Ok(())
    }

    /// `ip link set DEV up|down`.
    pub fn set_link_up(&mut self, name: &str, up: bool) -> Result<(), Refused> {
        let index = self.resolve(name)?;
        let peer = match self.links[&index].kind {
            LinkKind::Veth { peer } => Some(peer),
            _ => None,
        };
        let carriers_before: Vec<(LinkIndex, bool)> = std::iter::once(index)
            .chain(peer)
            .map(|i| (i, self.carrier(i)))
            .collect();
        self.set_up(index, up);
        // A peer whose carrier came with this link's: IPv6 configures it now.
        let mut lost = Vec::new();
        for (i, had) in carriers_before {
            if i != index && !had && self.carrier(i) {
                self.ipv6_link_ready(i);
            }
            // The kernel removes nexthop objects over a link that goes down or loses its
            // carrier (and the routes using them), and does not bring them back.
            if (i == index && !up) || (had && !self.carrier(i)) {
                lost.push(i);
            }
        }
        self.nexthops_link_gone(&lost);
        Ok(())
    }

    fn link_mut(&mut self, name: &str) -> Result<&mut Link, Refused> {
        self.links
            .values_mut()
            .find(|l| l.name == name)
            .ok_or_else(|| Refused(format!("Cannot find device {}", quote(name))))
    }

    /// `ip link set DEV mtu N`.
    pub fn set_link_mtu(&mut self, name: &str, mtu: u32) -> Result<(), Refused> {
        let link = self.link_mut(name)?;
        if !(68..=65535).contains(&mtu) && link.kind != LinkKind::Loopback {
            return Err(Refused::answers("Invalid argument"));
        }
        link.mtu = mtu;
        Ok(())
    }

    /// `ip link set DEV group N`.
    pub fn set_link_group(&mut self, name: &str, group: u32) -> Result<(), Refused> {
        self.link_mut(name)?.group = group;
        Ok(())
    }

    /// `ip link set DEV address MAC`.
    pub fn set_link_mac(&mut self, name: &str, mac: [u8; 6]) -> Result<(), Refused> {
        let link = self.link_mut(name)?;
        if mac[0] & 1 != 0 || mac == [0; 6] {
            return Err(Refused::answers("Cannot assign requested address"));
        }
        link.mac = mac;
        Ok(())
    }

    /// `ip link set DEV addrgenmode eui64|none`.
    pub fn set_link_addrgenmode(&mut self, name: &str, mode: AddrGenMode) -> Result<(), Refused> {
        self.link_mut(name)?.addrgenmode = mode;
        Ok(())
    }

    fn set_up(&mut self, index: LinkIndex, up: bool) {
        let was = self.links[&index].up;
        if was == up {
            return;
        }
        if up {
            self.links.get_mut(&index).expect("exists").up = true;
            let lo4 = IpAddr::from([127, 0, 0, 1]);
            if !self.mirrored
                && self.links[&index].kind == LinkKind::Loopback
                && !self.addrs.iter().any(|a| a.link == index && a.local == lo4)
            {
                // The kernel gives loopback 127.0.0.1/8 when it first comes up.
                let at = self
                    .addrs
                    .iter()
                    .rposition(|a| a.family() == Family::V4 && !a.secondary)
                    .map_or(0, |p| p + 1);
                self.addrs.insert(
                    at,
                    Address {
                        link: index,
                        local: lo4,
                        len: 8,
                        broadcast: None,
                        scope: SCOPE_HOST,
                        secondary: false,
                        noprefixroute: false,
                        metric: 0,
                        automatic: true,
                    },
                );
                let a = self.addrs[at].clone();
                self.add_local_route_v4(&a);
            }
            // IPv4: paths through the link come back; the addresses' routes are made again.
            // (IPv6 paths wait for the carrier: `ipv6_link_ready`.)
            // IPv6: the prefix routes of addresses added while it was down
            // (`addrconf_permanent_addr`).
            self.revive_dev(index, Family::V4);
            let addrs: Vec<Address> = self
                .addrs
                .iter()
                .filter(|a| a.link == index)
                .cloned()
                .collect();
            for a in &addrs {
                match a.family() {
                    Family::V4 => self.add_ifaddr_routes_v4(a),
                    Family::V6 => self.add_address_prefix_route_v6(a),
                }
            }
            if self.carrier(index) {
                self.ipv6_link_ready(index);
            }
        } else {
            // IPv4 keeps addresses and their local routes; IPv6 forgets its addresses.
            self.flush_dev(index, None, false);
            self.links.get_mut(&index).expect("exists").up = false;
            self.addrs
                .retain(|a| !(a.link == index && a.family() == Family::V6));
            self.flush_dev(index, Some(Family::V6), true);
        }
    }

    /// IPv6 on a link that came up with carrier: its link-local address and routes, and
    /// the local routes of addresses added while it was down.
    fn ipv6_link_ready(&mut self, index: LinkIndex) {
        self.revive_dev(index, Family::V6);
        if self.mirrored {
            // The kernel reports the addresses and routes it makes now.
            return;
        }
        let link = self.links[&index].clone();
        if link.kind == LinkKind::Loopback {
            let lo = IpAddr::V6(std::net::Ipv6Addr::LOCALHOST);
            if !self.addrs.iter().any(|a| a.link == index && a.local == lo) {
                self.addrs.push(Address {
                    link: index,
                    local: lo,
                    len: 128,
                    broadcast: None,
                    scope: SCOPE_HOST,
                    secondary: false,
                    noprefixroute: false,
                    metric: 0,
                    automatic: true,
                });
                self.add_local_route_v6(index, lo);
            }
            return;
        }
        self.add_multicast_route_v6(index);
        if link.addrgenmode == AddrGenMode::Eui64 {
            let ll = eui64_link_local(link.mac);
            if !self.addrs.iter().any(|a| a.link == index && a.local == ll) {
                self.addrs.push(Address {
                    link: index,
                    local: ll,
                    len: 64,
                    broadcast: None,
                    scope: SCOPE_LINK,
                    secondary: false,
                    noprefixroute: false,
                    metric: 0,
                    automatic: true,
                });
            }
            let fe80 = Net::parse("fe80::/64", None).expect("literal");
            self.add_prefix_route_v6(index, fe80, IPV6_ADDR_METRIC);
        }
        let locals: Vec<IpAddr> = self
            .addrs
            .iter()
            .filter(|a| a.link == index && a.family() == Family::V6)
            .map(|a| a.local)
            .collect();
        for l in locals {
            self.add_local_route_v6(index, l);
        }
    }

    // ----- addresses -----

    /// `ip addr add ADDR/LEN dev DEV [brd B] [scope S] [noprefixroute] [metric N]
    /// [nodad]`.
    #[allow(clippy::too_many_arguments)]
    pub fn add_address(
        &mut self,
        dev: &str,
        local: IpAddr,
        len: u8,
        broadcast: Option<IpAddr>,
        scope: Option<u8>,
        noprefixroute: bool,
        metric: u32,
        nodad: bool,
    ) -> Result<(), Refused> {
        let index = self.resolve(dev)?;
        let family = Family::of(local);
        if len > family.bits() {
            return Err(Refused::answers("Invalid argument"));
        }
        if self
            .addrs
            .iter()
            .any(|a| a.link == index && a.local == local && a.len == len)
            || (family == Family::V6
                && self
                    .addrs
                    .iter()
                    .any(|a| a.link == index && a.local == local))
        {
            return Err(Refused::answers("File exists"));
        }
        let default_scope = match local {
            IpAddr::V4(a) if a.is_loopback() => SCOPE_HOST,
            IpAddr::V6(a) if a.is_loopback() => SCOPE_HOST,
            IpAddr::V6(a) if a.segments()[0] & 0xffc0 == 0xfe80 => SCOPE_LINK,
            _ => SCOPE_UNIVERSE,
        };
        let subnet = Net::new(local, len).expect("checked");
        let secondary = family == Family::V4
            && self.addrs.iter().any(|a| {
                a.link == index && a.family() == Family::V4 && !a.secondary && a.subnet() == subnet
            });
        let addr = Address {
            link: index,
            local,
            len,
            broadcast,
            scope: scope.unwrap_or(default_scope),
            secondary,
            noprefixroute,
            metric,
            automatic: false,
        };
        // The kernel lists a new primary after the last primary, secondaries at the end.
        let at = if secondary {
            self.addrs.len()
        } else {
            self.addrs
                .iter()
                .rposition(|a| a.family() == family && !a.secondary)
                .map_or(0, |p| p + 1)
        };
        self.addrs.insert(at, addr.clone());
        match family {
            Family::V4 => {
                self.add_local_route_v4(&addr);
                if self.links[&index].up {
                    self.add_ifaddr_routes_v4(&addr);
                }
            }
            Family::V6 => {
                // The prefix route, and the link's multicast route, on a link that is up
                // (with or without carrier; a link coming up adds the prefix route then).
                let link = &self.links[&index];
                let (up, loopback) = (link.up, link.kind == LinkKind::Loopback);
                if up {
                    self.add_address_prefix_route_v6(&addr);
                    if !loopback {
                        self.add_multicast_route_v6(index);
                    }
                }
                // The local route once the address is no longer tentative: at once with
                // `nodad` (even on a link that is down), else once the link has carrier
                // (where duplicate address detection would succeed).
                if nodad || self.carrier(index) || loopback && up {
                    self.add_local_route_v6(index, local);
                }
            }
        }
        Ok(())
    }

    /// `ip addr del ADDR/LEN dev DEV`.
    pub fn del_address(
        &mut self,
        dev: &str,
        local: IpAddr,
        len: Option<u8>,
    ) -> Result<(), Refused> {
        let index = self.resolve(dev)?;
        let pos = self
            .addrs
            .iter()
            .position(|a| a.link == index && a.local == local && len.is_none_or(|l| l == a.len))
            .ok_or_else(|| Refused::answers("Cannot assign requested address"))?;
        let addr = self.addrs.remove(pos);
        match addr.family() {
            Family::V4 => {
                let mut gone = vec![addr.clone()];
                if !addr.secondary {
                    // Without promote_secondaries, the primary takes its secondaries along.
                    let subnet = addr.subnet();
                    let (sec, keep): (Vec<Address>, Vec<Address>) =
                        std::mem::take(&mut self.addrs).into_iter().partition(|a| {
                            a.link == index
                                && a.family() == Family::V4
                                && a.secondary
                                && a.subnet() == subnet
                        });
                    self.addrs = keep;
                    gone.extend(sec);
                }
                for a in &gone {
                    self.del_ifaddr_routes_v4(a);
                }
                if !self
                    .addrs
                    .iter()
                    .any(|a| a.link == index && a.family() == Family::V4)
                {
                    // The last address gone: IPv4 is off on the link.
                    self.flush_dev(index, Some(Family::V4), true);
                }
            }
            Family::V6 => {
                let host = Net::host(local);
                self.remove_routes_at(Family::V6, host, |_, r| {
                    r.table == TABLE_LOCAL && r.kind == RouteType::Local
                });
                let anycast = Net::host(addr.subnet().addr());
                let still = self.addrs.iter().any(|a| {
                    a.link == index
                        && a.family() == Family::V6
                        && a.len == addr.len
                        && a.subnet() == addr.subnet()
                });
                if !still {
                    self.remove_routes_at(Family::V6, anycast, |_, r| {
                        r.table == TABLE_LOCAL
                            && r.kind == RouteType::Anycast
                            && r.own_paths().iter().any(|p| p.dev == index)
                    });
                }
                if !addr.noprefixroute {
                    let subnet = addr.subnet();
                    let still = self
                        .addrs
                        .iter()
                        .any(|a| a.link == index && a.subnet() == subnet);
                    if !still {
                        self.remove_routes_at(Family::V6, subnet, |_, r| {
                            r.table == TABLE_MAIN
                                && r.protocol == PROTO_KERNEL
                                && r.own_paths()
                                    .iter()
                                    .any(|p| p.dev == index && p.gateway.is_none())
                        });
                    }
                }
            }
        }
        Ok(())
    }

    fn add_local_route_v4(&mut self, a: &Address) {
        let prim = self.primary_of(a);
        self.insert_kernel_route(Route::new(
            Net::host(a.local),
            RouteBody {
                table: TABLE_LOCAL,
                src: Net::default_of(Family::V4),
                tos: 0,
                metric: 0,
                protocol: PROTO_KERNEL,
                scope: SCOPE_HOST,
                kind: RouteType::Local,
                prefsrc: Some(prim),
                mtu: None,
                hoplimit: None,
                paths: Paths::own(vec![dev_path(a.link, SCOPE_NOWHERE)]),
                pref: 0,
            },
        ));
    }

    /// The primary address whose subnet a secondary shares (itself when primary).
    fn primary_of(&self, a: &Address) -> IpAddr {
        if !a.secondary {
            return a.local;
        }
        self.addrs
            .iter()
            .find(|p| {
                p.link == a.link
                    && !p.secondary
                    && p.family() == Family::V4
                    && p.subnet() == a.subnet()
            })
            .map_or(a.local, |p| p.local)
    }

    /// The routes an IPv4 address makes on a link that is up (the kernel's
    /// `fib_add_ifaddr` past the local route).
    fn add_ifaddr_routes_v4(&mut self, a: &Address) {
        let prim = self.primary_of(a);
        let is_lo = self.links[&a.link].kind == LinkKind::Loopback;
        self.add_local_route_v4(a);
        let bcast = |dst: IpAddr| {
            Route::new(
                Net::host(dst),
                RouteBody {
                    table: TABLE_LOCAL,
                    src: Net::default_of(Family::V4),
                    tos: 0,
                    metric: 0,
                    protocol: PROTO_KERNEL,
                    scope: SCOPE_LINK,
                    kind: RouteType::Broadcast,
                    prefsrc: Some(prim),
                    mtu: None,
                    hoplimit: None,
                    paths: Paths::own(vec![dev_path(a.link, SCOPE_HOST)]),
                    pref: 0,
                },
            )
        };
        if let Some(b) = a
            .broadcast
            .filter(|b| *b != IpAddr::from([255, 255, 255, 255]))
        {
            self.insert_kernel_route(bcast(b));
        }
        let subnet = a.subnet();
        if !subnet.addr().is_unspecified()
            && !a.secondary
            && (subnet.addr() != a.local || a.len < 32)
        {
            if !a.noprefixroute {
                self.insert_kernel_route(Route::new(
                    subnet,
                    RouteBody {
                        table: if is_lo { TABLE_LOCAL } else { TABLE_MAIN },
                        src: Net::default_of(Family::V4),
                        tos: 0,
                        metric: a.metric,
                        protocol: PROTO_KERNEL,
                        scope: if is_lo { SCOPE_HOST } else { SCOPE_LINK },
                        kind: if is_lo {
                            RouteType::Local
                        } else {
                            RouteType::Unicast
                        },
                        prefsrc: Some(prim),
                        mtu: None,
                        hoplimit: None,
                        paths: Paths::own(vec![dev_path(
                            a.link,
                            if is_lo { SCOPE_NOWHERE } else { SCOPE_HOST },
                        )]),
                        pref: 0,
                    },
                ));
            }
            if a.len < 31 {
                self.insert_kernel_route(bcast(subnet.last()));
            }
        }
    }

    /// The kernel's `fib_del_ifaddr`: the address's routes go unless another address of
    /// the namespace still needs them.
    fn del_ifaddr_routes_v4(&mut self, a: &Address) {
        let subnet = a.subnet();
        let still_local = self
            .addrs
            .iter()
            .any(|o| o.family() == Family::V4 && o.local == a.local);
        let is_lo = self.links[&a.link].kind == LinkKind::Loopback;
        let prim = a.local;
        if !still_local {
            let host = Net::host(a.local);
            self.remove_routes_at(Family::V4, host, |_, r| {
                r.table == TABLE_LOCAL && r.kind == RouteType::Local && r.protocol == PROTO_KERNEL
            });
        }
        if !a.secondary {
            if !a.noprefixroute {
                self.remove_routes_at(Family::V4, subnet, |_, r| {
                    r.protocol == PROTO_KERNEL
                        && r.prefsrc == Some(prim)
                        && r.table == if is_lo { TABLE_LOCAL } else { TABLE_MAIN }
                        && r.metric == a.metric
                });
            }
            let last = Net::host(subnet.last());
            let other_needs = |addrs: &[Address], dst: Net| {
                addrs.iter().any(|o| {
                    o.family() == Family::V4
                        && !o.secondary
                        && (o.broadcast.map(Net::host) == Some(dst)
                            || (o.len < 31 && Net::host(o.subnet().last()) == dst))
                })
            };
            let mut dsts = vec![last];
            if let Some(b) = a.broadcast {
                dsts.push(Net::host(b));
            }
            for d in dsts {
                if !other_needs(&self.addrs, d) {
                    self.remove_routes_at(Family::V4, d, |_, r| {
                        r.table == TABLE_LOCAL
                            && r.kind == RouteType::Broadcast
                            && r.protocol == PROTO_KERNEL
                    });
                }
            }
        }
        // Routes whose preferred source was this address go too (found by the index of
        // preferred sources, or a walk if too many have it).
        if !still_local {
            let gone = a.local;
            let goes = |dst: Net, r: &RouteBody| {
                r.prefsrc == Some(gone) && !(r.kind == RouteType::Local && dst == Net::host(gone))
            };
            match self.prefsrc_users.get(&gone).map(|u| u.dsts.clone()) {
                None => {}
                Some(Some(dsts)) => {
                    for (f, _, dst) in dsts {
                        self.remove_routes_at(f, dst, goes);
                    }
                }
                Some(None) => self.remove_routes(Family::V4, goes),
            }
        }
    }

    fn add_local_route_v6(&mut self, index: LinkIndex, local: IpAddr) {
        // The subnet-router anycast address of the address's prefix (a router's, as
        // forwarding is on): the prefix's first address, for prefixes shorter than /127.
        if let Some(a) = self
            .addrs
            .iter()
            .find(|a| a.link == index && a.local == local)
        {
            if a.len < 127 && a.scope != SCOPE_HOST {
                let anycast = Net::host(a.subnet().addr());
                if Net::host(local) != anycast {
                    self.insert_kernel_route(Route::new(
                        anycast,
                        RouteBody {
                            table: TABLE_LOCAL,
                            src: Net::default_of(Family::V6),
                            tos: 0,
                            metric: 0,
                            protocol: PROTO_KERNEL,
                            scope: SCOPE_UNIVERSE,
                            kind: RouteType::Anycast,
                            prefsrc: None,
                            mtu: None,
                            hoplimit: None,
                            paths: Paths::own(vec![dev_path(index, SCOPE_NOWHERE)]),
                            pref: 0,
                        },
                    ));
                }
            }
        }
        self.insert_kernel_route(Route::new(
            Net::host(local),
            RouteBody {
                table: TABLE_LOCAL,
                src: Net::default_of(Family::V6),
                tos: 0,
                metric: 0,
                protocol: PROTO_KERNEL,
                scope: SCOPE_UNIVERSE,
                kind: RouteType::Local,
                prefsrc: None,
                mtu: None,
                hoplimit: None,
                paths: Paths::own(vec![dev_path(index, SCOPE_NOWHERE)]),
                pref: 0,
            },
        ));
    }

    /// The link's `multicast ff00::/8` route in `local` (`addrconf_add_mroute`).
    fn add_multicast_route_v6(&mut self, index: LinkIndex) {
        self.insert_kernel_route(Route::new(
            Net::parse("ff00::/8", None).expect("literal"),
            RouteBody {
                table: TABLE_LOCAL,
                src: Net::default_of(Family::V6),
                tos: 0,
                metric: IPV6_ADDR_METRIC,
                protocol: PROTO_KERNEL,
                scope: SCOPE_UNIVERSE,
                kind: RouteType::Multicast,
                prefsrc: None,
                mtu: None,
                hoplimit: None,
                paths: Paths::own(vec![dev_path(index, SCOPE_LINK)]),
                pref: 0,
            },
        ));
    }

    /// The prefix route of an IPv6 address, unless it has none (`noprefixroute`, /128).
    fn add_address_prefix_route_v6(&mut self, a: &Address) {
        if !a.noprefixroute && a.len < 128 {
            let metric = if a.metric == 0 {
                IPV6_ADDR_METRIC
            } else {
                a.metric
            };
            self.add_prefix_route_v6(a.link, a.subnet(), metric);
        }
    }

    fn add_prefix_route_v6(&mut self, index: LinkIndex, dst: Net, metric: u32) {
        self.insert_kernel_route(Route::new(
            dst,
            RouteBody {
                table: TABLE_MAIN,
                src: Net::default_of(Family::V6),
                tos: 0,
                metric,
                protocol: PROTO_KERNEL,
                scope: SCOPE_UNIVERSE,
                kind: RouteType::Unicast,
                prefsrc: None,
                mtu: None,
                hoplimit: None,
                paths: Paths::own(vec![dev_path(index, SCOPE_HOST)]),
                pref: 0,
            },
        ));
    }

    /// Inserts a route the kernel makes, unless the same one is there.
    fn insert_kernel_route(&mut self, route: Route) {
        if self.mirrored {
            // The kernel reports the routes it makes.
            return;
        }
        self.note_users(&route);
        let list = self
            .tables
            .entry((route.family(), route.table))
            .or_default()
            .entry((route.dst, route.src))
            .or_insert_with(no_route);
        if list.iter().any(|r| same_route(r, &route)) {
            return;
        }
        note(&mut self.journal, route.family(), route.table, route.dst);
        let at = insert_position(list, &route, true);
        let at_key = ((route.family(), route.table), route.dst);
        edit(list, &mut self.shared, &mut self.tally, at_key, |l| {
            l.insert(at, route.body)
        });
    }

    fn remove_routes(&mut self, family: Family, mut gone: impl FnMut(Net, &RouteBody) -> bool) {
        for ((f, t), table) in self.tables.iter_mut() {
            if *f != family {
                continue;
            }
            for ((dst, _), list) in table.iter_mut() {
                if list.iter().any(|r| gone(*dst, r)) {
                    edit(
                        list,
                        &mut self.shared,
                        &mut self.tally,
                        ((*f, *t), *dst),
                        |l| l.retain(|r| !gone(*dst, r)),
                    );
                    note(&mut self.journal, *f, *t, *dst);
                }
            }
            table.retain(|_, l| !l.is_empty());
        }
        self.drop_empty_tables();
    }

    /// Tables left with no route go, as the kernel's listings and a compile know them
    /// (a table emptied and filled again is then a table appearing, which a patch
    /// follows).
    fn drop_empty_tables(&mut self) {
        self.tables.retain(|_, t| !t.is_empty());
    }

    /// The routes of destination `dst` for which `gone` holds go (what [`Self::remove_routes`]
    /// does, for one destination: no walk of every route).
    fn remove_routes_at(
        &mut self,
        family: Family,
        dst: Net,
        mut gone: impl FnMut(Net, &RouteBody) -> bool,
    ) {
        for ((f, t), table) in self.tables.iter_mut() {
            if *f != family {
                continue;
            }
            let keys: Vec<(Net, Net)> = table
                .range((dst, Net::default_of(family))..)
                .take_while(|((d, _), _)| *d == dst)
                .map(|(k, _)| *k)
                .collect();
            for key in keys {
                let list = table.get_mut(&key).expect("listed");
                if list.iter().any(|r| gone(dst, r)) {
                    edit(
                        list,
                        &mut self.shared,
                        &mut self.tally,
                        ((*f, *t), dst),
                        |l| l.retain(|r| !gone(dst, r)),
                    );
                    note(&mut self.journal, *f, *t, dst);
                    if list.is_empty() {
                        table.remove(&key);
                    }
                }
            }
        }
        self.drop_empty_tables();
    }

    /// The routes of each family and table, counted as they change (no walk).
    pub fn route_counts(&self) -> &BTreeMap<(Family, u32), usize> {
        &self.tally.routes
    }

    /// The destinations of the routes that deliver to this host or its links (local,
    /// broadcast, anycast, multicast), of any table, kept as they change (no walk).
    pub fn receiving_destinations(&self) -> impl Iterator<Item = Net> + '_ {
        self.tally.receiving.keys().copied()
    }

    /// Whether a route of `dst` in some table delivers to this host or its links (see
    /// [`State::receiving_destinations`]).
    pub(crate) fn receives_at(&self, dst: Net) -> bool {
        self.tally.receiving.contains_key(&dst)
    }

    /// Packs the tables' B-trees full. Routes inserted one by one in order (a dump)
    /// leave each node of a B-tree about half full: built again at once from the
    /// sorted routes, its nodes are full, and its keys take half the memory. Later
    /// changes split the nodes they reach, as before.
    pub fn compact(&mut self) {
        for table in self.tables.values_mut() {
            *table = std::mem::take(table).into_iter().collect();
        }
    }

    /// Bytes the routes take: the tables' entries (counted at the slack a B-tree's nodes
    /// have on average, half again), and the lists of routes and of paths they share,
    /// each once.
    pub fn memory(&self) -> usize {
        let entry = std::mem::size_of::<(Net, Net)>() + std::mem::size_of::<RouteList>();
        let keys: usize = self.tables.values().map(BTreeMap::len).sum();
        let list = |l: &Vec<RouteBody>| std::mem::size_of_val(l) + std::mem::size_of_val(&l[..]);
        keys * entry * 3 / 2
            + self.shared.lists.memory(list)
            + self.shared.paths.memory(std::mem::size_of_val)
    }

    /// Notes what `route` (about to be held) uses: its nexthop object, or the links of
    /// its own paths, and its preferred source.
    fn note_users(&mut self, route: &Route) {
        let at = (route.family(), route.table, route.dst);
        self.users().note(at, route);
    }

    /// Whether a table, or a destination's list of routes, is held empty (each is taken
    /// out as it empties).
    #[cfg(test)]
    pub(crate) fn holds_empty(&self) -> bool {
        self.tables
            .values()
            .any(|t| t.is_empty() || t.values().any(|l| l.is_empty()))
    }

    /// Gives up link `index`'s index of users, as past [`LINK_USERS_HELD`] routes: its
    /// routes are then found by a walk of every route.
    #[cfg(test)]
    pub(crate) fn give_up_link_index(&mut self, index: LinkIndex) {
        self.link_users.entry(index).or_default().dsts = None;
    }

    /// The state's indexes of users, beside its tables.
    fn users(&mut self) -> UsersOf<'_> {
        UsersOf {
            tables: &self.tables,
            dumping: self.dumping,
            object: &mut self.object_users,
            link: &mut self.link_users,
            prefsrc: &mut self.prefsrc_users,
        }
    }

    /// The destinations, by family and table, of the routes that use nexthop object `id`
    /// (and perhaps of a few that used it).
    pub(crate) fn object_users(
        &self,
        id: NexthopId,
    ) -> impl Iterator<Item = (Family, u32, Net)> + '_ {
        self.object_users
            .get(&id)
            .and_then(|u| u.dsts.as_ref())
            .into_iter()
            .flatten()
            .copied()
    }

    /// The destinations (by family and table) of the routes of `family` (all if `None`)
    /// that may have a path through link `index`, as its index holds them, in order;
    /// `None` for a link carrying too many routes to index, whose routes a walk finds.
    fn dsts_through(
        &self,
        index: LinkIndex,
        family: Option<Family>,
    ) -> Option<Vec<(Family, u32, Net)>> {
        let dsts = match self.link_users.get(&index) {
            // No route ever went through it.
            None => return Some(Vec::new()),
            Some(u) => u.dsts.as_ref()?,
        };
        Some(
            dsts.iter()
                .filter(|(f, _, _)| family.is_none_or(|x| x == *f))
                .copied()
                .collect(),
        )
    }

    /// Changes by `change` each list of routes of `family` (all if `None`) that may have
    /// a path through link `index` (found by the link's index, or by a walk of every
    /// route for a link carrying too many to index); `change` says whether it changed
    /// the list, which is then noted (and dropped if left empty).
    fn change_through(
        &mut self,
        index: LinkIndex,
        family: Option<Family>,
        mut change: impl FnMut(&mut RouteList, &mut Shared, &mut Tally, ((Family, u32), Net)) -> bool,
    ) {
        let dsts = self.dsts_through(index, family);
        let shared = &mut self.shared;
        let journal = &mut self.journal;
        let tally = &mut self.tally;
        match dsts {
            Some(dsts) => {
                for (f, t, dst) in dsts {
                    let Some(table) = self.tables.get_mut(&(f, t)) else {
                        continue;
                    };
                    // One search of the table for the destination's lists, each changed
                    // in place and an emptied one taken out where it is found (a link's
                    // routes going down: a search each, not three).
                    let emptied = table.extract_if(Net::sources_of(dst), |_, list| {
                        let changed = change(list, shared, tally, ((f, t), dst));
                        if changed {
                            note(journal, f, t, dst);
                        }
                        changed && list.is_empty()
                    });
                    emptied.for_each(drop);
                }
            }
            None => {
                for ((f, t), table) in self.tables.iter_mut() {
                    if family.is_some_and(|x| x != *f) {
                        continue;
                    }
                    for ((dst, _), list) in table.iter_mut() {
                        if change(list, shared, tally, ((*f, *t), *dst)) {
                            note(journal, *f, *t, *dst);
                        }
                    }
                    table.retain(|_, l| !l.is_empty());
                }
            }
        }
        self.drop_empty_tables();
    }

    /// The kernel's `fib_sync_down_dev` and `fib_flush` (and IPv6's `rt6_sync_down_dev`):
    /// paths through the link die; a route all of whose paths died is removed. Unless
    /// `force`, local routes' paths (scope nowhere) survive.
    fn flush_dev(&mut self, index: LinkIndex, family: Option<Family>, force: bool) {
        let dies = |p: &Path| p.dev == index && (force || p.scope != SCOPE_NOWHERE);
        // A route is changed if a path of its dies, and goes if none is left alive.
        let touched = |r: &RouteBody| {
            let paths = r.own_paths();
            matches!(r.paths, Paths::Own(_))
                && (paths.iter().any(|p| dies(p) && !p.dead)
                    || paths.iter().all(|p| p.dead || dies(p)))
        };
        self.change_through(index, family, |list, shared, tally, at| {
            // Copied only if a route changes: the lists and paths are shared.
            if !list.iter().any(touched) {
                return false;
            }
            // Every route of the list goes (each of a link's routes as it goes down): the
            // list is emptied whole, none of its paths marked dead in a copy first.
            let all_go = |r: &RouteBody| {
                matches!(r.paths, Paths::Own(_)) && r.own_paths().iter().all(|p| p.dead || dies(p))
            };
            if list.iter().all(all_go) {
                tally.count(at.0, at.1, list, false);
                *list = no_route();
                return true;
            }
            edit(list, shared, tally, at, |list| {
                list.retain_mut(|r| {
                    if !touched(r) {
                        return true;
                    }
                    r.paths.edit(|paths| {
                        for p in paths.iter_mut().filter(|p| dies(p)) {
                            p.dead = true;
                        }
                    });
                    r.own_paths().iter().any(|p| !p.dead)
                })
            });
            true
        });
    }

    /// The kernel's `fib_sync_up` (IPv4, when the link comes up) and `rt6_sync_up` (IPv6,
    /// when it is up with its carrier): paths of `family` through the link live again.
    fn revive_dev(&mut self, index: LinkIndex, family: Family) {
        let touched = |r: &RouteBody| r.own_paths().iter().any(|p| p.dev == index && p.dead);
        self.change_through(index, Some(family), |list, shared, tally, at| {
            // Copied only if a path lives again: the lists and paths are shared.
            if !list.iter().any(touched) {
                return false;
            }
            edit(list, shared, tally, at, |list| {
                for r in list.iter_mut().filter(|r| touched(r)) {
                    r.paths.edit(|paths| {
                        for p in paths.iter_mut().filter(|p| p.dev == index) {
                            p.dead = false;
                        }
                    });
                }
            });
            true
        });
    }

    // ----- routes -----

    /// `ip route add|replace|change|append|prepend ROUTE`, checked as the kernel checks it.
    pub fn modify_route(&mut self, op: RouteOp, mut route: Route) -> Result<(), Refused> {
        self.validate_route(&mut route)?;
        self.note_users(&route);
        let family = route.family();
        if family == Family::V6 {
            self.v6_tables_made.insert(route.table);
        }
        let (table_key, key) = ((family, route.table), (route.dst, route.src));
        note(&mut self.journal, family, route.table, route.dst);
        let table = self.tables.entry(table_key).or_default();
        let list = table.entry(key).or_insert_with(no_route);
        let local = family == Family::V4 && route.kind == RouteType::Local;
        let at = (table_key, route.dst);
        let result = edit(
            list,
            &mut self.shared,
            &mut self.tally,
            at,
            |l| match family {
                Family::V4 => modify_v4(l, op, route.body),
                Family::V6 => modify_v6(l, op, route.body),
            },
        );
        self.v4_custom_local_routes |= local && result.is_ok();
        // Only the list this change touched can have been left empty.
        if list.is_empty() {
            table.remove(&key);
        }
        if table.is_empty() {
            self.tables.remove(&table_key);
        }
        result
    }

    /// `ip route del ...`: the first route every given field matches.
    pub fn del_route(&mut self, family: Family, filter: &RouteFilter) -> Result<(), Refused> {
        let table = filter.table.unwrap_or(TABLE_MAIN);
        let dst = filter.dst.unwrap_or(Net::default_of(family));
        let src = filter.src.unwrap_or(Net::default_of(family));
        let no_such = || Refused::answers("No such process");
        if family == Family::V6 && !self.v6_tables_made.contains(&table) {
            return Err(Refused::explained("FIB table does not exist"));
        }
        let t = self.tables.get_mut(&(family, table)).ok_or_else(no_such)?;
        // `fib6_locate`: a source prefix is looked for only if the destination has
        // source-specific routes; otherwise the destination's own routes are the ones.
        let src = if family == Family::V6
            && src.len() > 0
            && !t.keys().any(|(d, s)| *d == dst && s.len() > 0)
        {
            Net::default_of(family)
        } else {
            src
        };
        let list = t.get_mut(&(dst, src)).ok_or_else(no_such)?;
        note(&mut self.journal, family, table, dst);
        if family == Family::V6 {
            // `ip6_route_del`: type, scope and source are not compared; a gateway given
            // deletes that one path of an ECMP group, else the whole group goes.
            let pos = list
                .iter()
                .position(|r| {
                    (filter.metric == 0 || r.metric == filter.metric)
                        && filter.protocol.is_none_or(|p| p == r.protocol)
                        && match (&r.paths, filter.nhid) {
                            (Paths::Object(id), want) => want.is_none_or(|w| w == *id),
                            (_, Some(_)) => false,
                            (Paths::None, _) => {
                                filter.gateway.is_none()
                                    && filter.dev.is_none_or(|d| self_lo(d, &self.links))
                            }
                            (Paths::Own(paths), _) => paths.iter().any(|p| {
                                filter.gateway.is_none_or(|g| Some(g) == p.gateway)
                                    && filter.dev.is_none_or(|d| d == p.dev)
                            }),
                        }
                })
                .ok_or_else(no_such)?;
            let one_path = filter.gateway.filter(|_| list[pos].own_paths().len() > 1);
            edit(
                list,
                &mut self.shared,
                &mut self.tally,
                ((family, table), dst),
                |list| {
                    if let (Some(g), Paths::Own(_)) = (one_path, &list[pos].paths) {
                        list[pos].paths.edit(|paths| {
                            let at = paths
                                .iter()
                                .position(|p| {
                                    Some(g) == p.gateway && filter.dev.is_none_or(|d| d == p.dev)
                                })
                                .expect("matched above");
                            paths.remove(at);
                        });
                    } else {
                        list.remove(pos);
                    }
                },
            );
        } else {
            let pos = list
                .iter()
                .position(|r| {
                    r.tos == filter.tos
                        && (filter.metric == 0 || r.metric == filter.metric)
                        && filter.kind.is_none_or(|k| k == r.kind)
                        && filter.scope.is_none_or(|s| s == r.scope)
                        && filter.protocol.is_none_or(|p| p == r.protocol)
                        && filter.prefsrc.is_none_or(|s| Some(s) == r.prefsrc)
                        && filter.nhid.is_none_or(|id| r.paths == Paths::Object(id))
                        && (filter.gateway.is_none() && filter.dev.is_none()
                            || r.own_paths().iter().any(|p| {
                                filter.gateway.is_none_or(|g| Some(g) == p.gateway)
                                    && filter.dev.is_none_or(|d| d == p.dev)
                            }))
                })
                .ok_or_else(no_such)?;
            edit(
                list,
                &mut self.shared,
                &mut self.tally,
                ((family, table), dst),
                |list| list.remove(pos),
            );
        }
        if list.is_empty() {
            t.remove(&(dst, src));
        }
        if t.is_empty() {
            self.tables.remove(&(family, table));
        }
        Ok(())
    }

    /// `ip route flush table ID` (of a family).
    pub fn flush_table(&mut self, family: Family, table: u32) {
        if let Some(gone) = self.tables.remove(&(family, table)) {
            for ((dst, _), list) in &gone {
                self.tally.count((family, table), *dst, list, false);
            }
            for (dst, _) in gone.keys() {
                note(&mut self.journal, family, table, *dst);
            }
        }
    }

    /// The kernel's checks of a new route, filling in what it derives (each path's scope
    /// and link).
    fn validate_route(&self, route: &mut Route) -> Result<(), Refused> {
        let family = route.family();
        if route.scope > SCOPE_HOST && route.kind != RouteType::Local {
            return Err(Refused::explained("Invalid scope"));
        }
        if let Some(src) = route.prefsrc {
            if family == Family::V4
                && !(route.kind == RouteType::Local && Net::host(src) == route.dst)
            {
                let local = self
                    .routes(Family::V4, Some(TABLE_LOCAL))
                    .any(|r| r.kind == RouteType::Local && r.dst == Net::host(src))
                    || self
                        .routes(Family::V4, Some(route.table))
                        .any(|r| r.kind == RouteType::Local && r.dst == Net::host(src));
                if !local {
                    return Err(Refused::explained("Invalid prefsrc address"));
                }
            }
            if family == Family::V6 && !self.addrs.iter().any(|a| a.local == src) {
                return Err(Refused::explained("Invalid source address"));
            }
        }
        let scope = route.scope;
        let table = route.table;
        let kind = route.kind;
        match &mut route.paths {
            Paths::None => {
                if !kind.is_reject() {
                    return Err(Refused::explained("Nexthop device required for onlink"));
                }
            }
            Paths::Object(id) => {
                let nh = self
                    .nexthops
                    .get(id)
                    .ok_or_else(|| Refused::explained("Nexthop id does not exist"))?;
                if nh.family != family
                    && !matches!(nh.kind, NexthopKind::Group(_) | NexthopKind::Blackhole)
                {
                    return Err(Refused::explained("Nexthop family mismatch"));
                }
            }
            Paths::Own(paths) => {
                if kind.is_reject() {
                    route.paths = Paths::None;
                    return Ok(());
                }
                for p in Arc::make_mut(paths).iter_mut() {
                    self.check_path(family, table, scope, kind, p)?;
                }
            }
        }
        Ok(())
    }

    /// The kernel's `fib_check_nh` (IPv4) and `fib6_nh_init` (IPv6) for one path.
    fn check_path(
        &self,
        family: Family,
        table: u32,
        scope: u8,
        kind: RouteType,
        p: &mut Path,
    ) -> Result<(), Refused> {
        let dev = self.links.get(&p.dev);
        if family == Family::V4 && scope == SCOPE_HOST || kind == RouteType::Local {
            if p.gateway.is_some() && family == Family::V4 {
                return Err(Refused::explained(
                    "Route with host scope can not have a gateway",
                ));
            }
            p.scope = SCOPE_NOWHERE;
            return Ok(());
        }
        let Some(gw) = p.gateway else {
            let dev = dev.ok_or_else(|| Refused::explained("Nexthop device required"))?;
            if p.onlink {
                return Err(Refused::explained(
                    "Invalid flags for nexthop - PERVASIVE and ONLINK can not be set",
                ));
            }
            if !dev.up {
                return Err(Refused::explained(if family == Family::V4 {
                    "Device for nexthop is not up"
                } else {
                    "Nexthop device is not up"
                }));
            }
            p.scope = SCOPE_HOST;
            return Ok(());
        };
        if family == Family::V6 || Family::of(gw) == Family::V6 {
            return self.check_gateway_v6(table, gw, p);
        }
        if p.onlink {
            let d = dev.ok_or_else(|| Refused::explained("Nexthop device required for onlink"))?;
            if !d.up {
                return Err(Refused::explained("Nexthop device is not up"));
            }
            if self.addr_type_v4(gw) != RouteType::Unicast {
                return Err(Refused::explained("Nexthop has invalid gateway"));
            }
            p.scope = SCOPE_LINK;
            return Ok(());
        }
        // The kernel looks the gateway up with routes narrower than the new route skipped.
        let (link, res_scope) = self
            .snapshot_for(gw)
            .gateway_v4(table, gw, dev.map(|d| d.index), scope.saturating_add(1))
            .ok_or_else(|| Refused::explained("Nexthop has invalid gateway"))?;
        // A gateway that is one of ours resolves through a local route of host scope: the
        // kernel keeps it (for listing and for choosing the source address) but does not
        // send through it, as the path's scope is then host.
        p.dev = link;
        p.scope = res_scope;
        if !self.links[&link].up {
            return Err(Refused::explained("Nexthop device is not up"));
        }
        Ok(())
    }

    /// The kernel's `ip6_validate_gw` and the checks of `fib6_nh_init` after it.
    fn check_gateway_v6(&self, table: u32, gw: IpAddr, p: &mut Path) -> Result<(), Refused> {
        let dev = self.links.get(&p.dev);
        let link_local = matches!(gw, IpAddr::V6(a) if a.segments()[0] & 0xffc0 == 0xfe80);
        // A link-local gateway is local only if it is on the route's own link.
        let ours = |on: LinkIndex| {
            self.addrs
                .iter()
                .any(|a| a.local == gw && (!link_local || a.link == on))
        };
        if p.onlink {
            let d = dev.ok_or_else(|| Refused::explained("Nexthop device required for onlink"))?;
            if !d.up {
                return Err(Refused::explained("Nexthop device is not up"));
            }
        }
        if dev.is_some_and(|d| ours(d.index)) {
            return Err(Refused::explained("Gateway can not be a local address"));
        }
        if !link_local {
            if gw.is_multicast() || gw.is_unspecified() {
                return Err(Refused::explained("Invalid gateway address"));
            }
            let snapshot = self.snapshot_for(gw);
            if p.onlink {
                if snapshot.onlink_gateway_v6_conflicts(gw, p.dev) {
                    return Err(Refused::explained(
                        "Nexthop has invalid gateway or device mismatch",
                    ));
                }
            } else {
                p.dev = snapshot
                    .gateway_v6(table, gw, dev.map(|d| d.index))
                    .ok_or_else(|| Refused::answers("No route to host"))?;
            }
        }
        let d = self
            .links
            .get(&p.dev)
            .ok_or_else(|| Refused::explained("Egress device not specified"))?;
        if d.kind == LinkKind::Loopback {
            return Err(Refused::explained(
                "Egress device can not be loopback device for this route",
            ));
        }
        if ours(d.index) {
            return Err(Refused::explained("Gateway can not be a local address"));
        }
        if !d.up {
            return Err(Refused::explained("Nexthop device is not up"));
        }
        p.scope = SCOPE_LINK;
        Ok(())
    }

    /// The type of an IPv4 address by the local table: local, broadcast, or unicast.
    fn addr_type_v4(&self, a: IpAddr) -> RouteType {
        let local = self.routes(Family::V4, Some(TABLE_LOCAL));
        let mut best: Option<Route> = None;
        for r in local {
            if r.dst.contains(a) && best.as_ref().is_none_or(|b| r.dst.len() > b.dst.len()) {
                best = Some(r);
            }
        }
        best.map_or(RouteType::Unicast, |r| r.kind)
    }

    // ----- rules -----

    /// `ip rule add RULE` (a rule without `pref` gets the kernel's default: one less than
    /// the second rule's).
    pub fn add_rule(&mut self, mut rule: Rule, pref_given: bool) -> Result<(), Refused> {
        let rules = &mut self.rules[fam_ix(rule.family)];
        if !pref_given {
            rule.pref = match rules.get(1) {
                Some(r) if r.pref > 0 => r.pref - 1,
                _ => 0,
            };
        }
        if let RuleAction::Goto(target) = rule.action {
            if target <= rule.pref {
                return Err(Refused::explained(
                    "Invalid goto target - can't jump backward",
                ));
            }
        }
        if rules.iter().any(|r| same_rule(r, &rule)) {
            return Err(Refused::answers("File exists"));
        }
        let at = rules
            .iter()
            .position(|r| r.pref > rule.pref)
            .unwrap_or(rules.len());
        if rule.family == Family::V4 {
            self.v4_custom_rules = true;
            self.v4_unmerged = true;
        }
        if let (Family::V6, RuleAction::Lookup(t)) = (rule.family, rule.action) {
            self.v6_tables_made.insert(t);
        }
        let rules = &mut self.rules[fam_ix(rule.family)];
        rules.insert(at, rule);
        self.refresh_rule_links();
        Ok(())
    }

    /// `ip rule del RULE`: the first rule that every given field matches.
    pub fn del_rule(
        &mut self,
        family: Family,
        pattern: &Rule,
        pref_given: bool,
        action_given: bool,
    ) -> Result<(), Refused> {
        let rules = &mut self.rules[fam_ix(family)];
        let pos = rules
            .iter()
            .position(|r| {
                (!pref_given || r.pref == pattern.pref)
                    // The kernel's `rule_find` compares the action's kind and table, not
                    // a `goto` target, and not `not`.
                    && (!action_given
                        || std::mem::discriminant(&r.action)
                            == std::mem::discriminant(&pattern.action)
                            && match (r.action, pattern.action) {
                                (RuleAction::Lookup(a), RuleAction::Lookup(b)) => a == b,
                                _ => true,
                            })
                    && (pattern.src.is_none() || r.src == pattern.src)
                    && (pattern.dst.is_none() || r.dst == pattern.dst)
                    && (pattern.iif.is_none()
                        || r.iif.as_ref().map(|l| &l.name) == pattern.iif.as_ref().map(|l| &l.name))
                    && (pattern.oif.is_none()
                        || r.oif.as_ref().map(|l| &l.name) == pattern.oif.as_ref().map(|l| &l.name))
                    && (pattern.fwmark.is_none() || r.fwmark == pattern.fwmark)
                    && (pattern.tos.is_none() || r.tos == pattern.tos)
                    && (pattern.ipproto.is_none() || r.ipproto == pattern.ipproto)
                    && (pattern.sport.is_none() || r.sport == pattern.sport)
                    && (pattern.dport.is_none() || r.dport == pattern.dport)
                    && (pattern.uidrange.is_none() || r.uidrange == pattern.uidrange)
                    && (pattern.suppress_prefixlength.is_none()
                        || r.suppress_prefixlength == pattern.suppress_prefixlength)
                    && (pattern.suppress_ifgroup.is_none()
                        || r.suppress_ifgroup == pattern.suppress_ifgroup)
            })
            .ok_or_else(|| Refused::answers("No such file or directory"))?;
        rules.remove(pos);
        if family == Family::V4 {
            // The kernel walks the rules from then on too (`fib4_rule_delete`).
            self.v4_custom_rules = true;
            self.v4_unmerged = true;
        }
        Ok(())
    }

    /// `ip rule flush` (of a family): every rule but priority 0's goes, as in the kernel.
    pub fn flush_rules(&mut self, family: Family) {
        let before = self.rules[fam_ix(family)].len();
        self.rules[fam_ix(family)].retain(|r| r.pref == 0);
        if family == Family::V4 && self.rules[fam_ix(family)].len() < before {
            self.v4_custom_rules = true;
            self.v4_unmerged = true;
        }
    }

    fn refresh_rule_links(&mut self) {
        let by_name: BTreeMap<String, LinkIndex> = self
            .links
            .values()
            .map(|l| (l.name.clone(), l.index))
            .collect();
        for rules in self.rules.iter_mut() {
            for r in rules.iter_mut() {
                for l in [&mut r.iif, &mut r.oif].into_iter().flatten() {
                    l.index = by_name.get(&l.name).copied();
                }
            }
        }
    }

    /// A rule link for `name`, resolved now.
    pub fn rule_link(&self, name: &str) -> RuleLink {
        RuleLink {
            name: name.to_string(),
            index: self.link_by_name(name).map(|l| l.index),
        }
    }

    // ----- nexthop objects -----

    /// `ip nexthop add|replace id N ...`.
    pub fn add_nexthop(&mut self, mut nh: Nexthop, replace: bool) -> Result<(), Refused> {
        if nh.id == 0 {
            return Err(Refused::explained("Invalid nexthop id"));
        }
        if let Some(old) = self.nexthops.get(&nh.id) {
            if !replace {
                return Err(Refused::explained("Nexthop id exists"));
            }
            if matches!(old.kind, NexthopKind::Group(_)) != matches!(nh.kind, NexthopKind::Group(_))
            {
                return Err(Refused::explained(
                    if matches!(nh.kind, NexthopKind::Group(_)) {
                        "Can not replace a nexthop with a nexthop group"
                    } else {
                        "Can not replace a nexthop group with a nexthop"
                    },
                ));
            }
        } else if replace {
            // `ip nexthop replace` creates as well.
        }
        match &mut nh.kind {
            NexthopKind::Blackhole => {}
            NexthopKind::Path {
                gateway,
                dev,
                onlink,
            } => {
                // `rtm_to_nh_config`: the device must be up and have its carrier.
                if let Some(link) = self.links.get(dev) {
                    if !link.up {
                        return Err(Refused::explained("Nexthop device is not up"));
                    }
                    if !self.carrier(*dev) {
                        return Err(Refused::explained("Carrier for nexthop device is down"));
                    }
                }
                let mut p = Path {
                    gateway: *gateway,
                    dev: *dev,
                    weight: 1,
                    onlink: *onlink,
                    dead: false,
                    scope: 0,
                };
                self.check_path(
                    nh.family,
                    TABLE_MAIN,
                    SCOPE_UNIVERSE,
                    RouteType::Unicast,
                    &mut p,
                )?;
                *dev = p.dev;
            }
            NexthopKind::Group(members) => {
                if members.is_empty() {
                    return Err(Refused::explained("Invalid group"));
                }
                let mut family = None;
                for (i, (id, w)) in members.iter().enumerate() {
                    if members[..i].iter().any(|m| m.0 == *id) {
                        return Err(Refused::explained("Duplicate nexthop id in group"));
                    }
                    if *w == 0 || *w > 256 {
                        return Err(Refused::explained("Invalid value for weight"));
                    }
                    let m = self
                        .nexthops
                        .get(id)
                        .ok_or_else(|| Refused::explained("Invalid nexthop id"))?;
                    if matches!(m.kind, NexthopKind::Group(_)) {
                        return Err(Refused::explained("Nested groups are not supported"));
                    }
                    if matches!(m.kind, NexthopKind::Blackhole) && members.len() > 1 {
                        return Err(Refused::explained(
                            "Blackhole nexthop can not be used in a group with more than 1 path",
                        ));
                    }
                    if let NexthopKind::Path { .. } = m.kind {
                        if family.is_some_and(|f| f != m.family) {
                            return Err(Refused::explained(
                                "Nexthop group members must all be of the same family",
                            ));
                        }
                        family = Some(m.family);
                    }
                }
                nh.family = family.unwrap_or(nh.family);
            }
        }
        self.nexthops.insert(nh.id, nh);
        Ok(())
    }

    /// `ip nexthop del id N`: routes using it go; groups drop it as a member (and a group
    /// left empty goes, with its routes).
    pub fn del_nexthop(&mut self, id: NexthopId) -> Result<(), Refused> {
        if self.nexthops.remove(&id).is_none() {
            return Err(Refused::explained("Nexthop id does not exist"));
        }
        self.nexthop_gone(id);
        Ok(())
    }

    fn nexthop_gone(&mut self, id: NexthopId) {
        let mut emptied = Vec::new();
        for nh in self.nexthops.values_mut() {
            if let NexthopKind::Group(members) = &mut nh.kind {
                let before = members.len();
                members.retain(|m| m.0 != id);
                if members.is_empty() && before > 0 {
                    emptied.push(nh.id);
                }
            }
        }
        // The routes that use it, found by the index rather than by a walk.
        let users = self.object_users.remove(&id).and_then(|u| u.dsts);
        for (f, _, dst) in users.into_iter().flatten() {
            self.remove_routes_at(f, dst, |_, r| r.paths == Paths::Object(id));
        }
        for e in emptied {
            self.nexthops.remove(&e);
            self.nexthop_gone(e);
        }
        self.drop_empty_tables();
    }

    /// Nexthop objects over links that are gone (or down) go, as the kernel removes them.
    fn nexthops_link_gone(&mut self, links: &[LinkIndex]) {
        let gone: Vec<NexthopId> = self
            .nexthops
            .values()
            .filter(|nh| matches!(nh.kind, NexthopKind::Path { dev, .. } if links.contains(&dev)))
            .map(|nh| nh.id)
            .collect();
        for id in gone {
            self.nexthops.remove(&id);
            self.nexthop_gone(id);
        }
    }
}

/// The routes of destination `dst` (any source prefix) in table `table` of family `f`.
fn routes_at(
    tables: &BTreeMap<(Family, u32), TableRoutes>,
    f: Family,
    table: u32,
    dst: Net,
) -> impl Iterator<Item = &RouteBody> {
    tables.get(&(f, table)).into_iter().flat_map(move |t| {
        t.range((dst, Net::default_of(f))..)
            .take_while(move |((d, _), _)| *d == dst)
            .flat_map(|(_, list)| list.iter())
    })
}

/// The kernel's `rule_exists` for an existing rule `old` and a new one: every selector
/// and the action's kind and table alike; the source, destination and TOS only if the
/// new rule has them; neither `not` nor a `goto` target.
fn same_rule(old: &Rule, new: &Rule) -> bool {
    let action = |r: &Rule| match r.action {
        RuleAction::Goto(_) => RuleAction::Goto(0),
        other => other,
    };
    Rule {
        invert: false,
        action: action(old),
        src: new.src.and(old.src),
        dst: new.dst.and(old.dst),
        tos: new.tos.and(old.tos),
        ..old.clone()
    } == Rule {
        invert: false,
        action: action(new),
        ..new.clone()
    }
}

/// Whether `index` is the loopback link (where the kernel puts reject routes).
fn self_lo(index: LinkIndex, links: &BTreeMap<LinkIndex, Link>) -> bool {
    links
        .get(&index)
        .is_some_and(|l| l.kind == LinkKind::Loopback)
}

/// The list of a new key's routes, before its first, or of one emptied: one list shared
/// by all, not an allocation of each (a link's 1,000 routes going down made one in the
/// state and one in the patch for each, freed at once).
pub(crate) fn no_route() -> RouteList {
    static EMPTY: std::sync::LazyLock<RouteList> = std::sync::LazyLock::new(Default::default);
    Arc::clone(&EMPTY)
}

/// A path straight onto a link.
pub fn dev_path(dev: LinkIndex, scope: u8) -> Path {
    Path {
        gateway: None,
        dev,
        weight: 1,
        onlink: false,
        dead: false,
        scope,
    }
}

/// Whether two routes are the same to the kernel (type, scope and everything about the
/// paths), so that adding the second is refused as a duplicate.
fn same_route(a: &RouteBody, b: &RouteBody) -> bool {
    a.kind == b.kind
        && a.tos == b.tos
        && a.metric == b.metric
        && a.prefsrc == b.prefsrc
        && a.protocol == b.protocol
        && a.scope == b.scope
        && a.mtu == b.mtu
        && a.hoplimit == b.hoplimit
        && same_paths(&a.paths, &b.paths)
}

fn same_paths(a: &Paths, b: &Paths) -> bool {
    match (a, b) {
        (Paths::Own(x), Paths::Own(y)) => {
            x.len() == y.len()
                && x.iter().zip(y.iter()).all(|(p, q)| {
                    p.gateway == q.gateway
                        && p.dev == q.dev
                        && p.weight == q.weight
                        && p.onlink == q.onlink
                })
        }
        _ => a == b,
    }
}

/// Where a new route goes in its prefix's list: IPv4 sorts by TOS (highest first) then
/// metric (lowest first); IPv6 by metric. `after` places it after its equals.
fn insert_position(list: &[RouteBody], route: &RouteBody, after: bool) -> usize {
    list.iter()
        .position(|r| {
            let key_r = (std::cmp::Reverse(r.tos), r.metric);
            let key_n = (std::cmp::Reverse(route.tos), route.metric);
            if after {
                key_r > key_n
            } else {
                key_r >= key_n
            }
        })
        .unwrap_or(list.len())
}

/// The kernel's `fib_table_insert` for one prefix's list.
fn modify_v4(list: &mut Vec<RouteBody>, op: RouteOp, route: RouteBody) -> Result<(), Refused> {
    let same_key = |r: &RouteBody| r.tos == route.tos && r.metric == route.metric;
    let first = list.iter().position(same_key);
    if let Some(first) = first {
        if op == RouteOp::Add {
            return Err(Refused::answers("File exists"));
        }
        let exact = list
            .iter()
            .skip(first)
            .take_while(|r| same_key(r))
            .position(|r| same_route(r, &route));
        match op {
            RouteOp::Replace | RouteOp::Change => {
                if exact == Some(0) {
                    return Ok(());
                }
                list[first] = route;
                return Ok(());
            }
            _ if exact.is_some() => return Err(Refused::answers("File exists")),
            RouteOp::Append => {
                let last = first + list.iter().skip(first).take_while(|r| same_key(r)).count();
                list.insert(last, route);
            }
            _ => list.insert(first, route),
        }
        return Ok(());
    }
    if op == RouteOp::Change {
        return Err(Refused::answers("No such file or directory"));
    }
    let at = insert_position(list, &route, false);
    list.insert(at, route);
    Ok(())
}

/// Whether an IPv6 route can be an ECMP sibling (`rt6_qualify_for_ecmp`): a unicast route
/// of its own paths, each through a gateway.
fn ecmp_able(r: &RouteBody) -> bool {
    r.kind == RouteType::Unicast
        && matches!(&r.paths, Paths::Own(p) if !p.is_empty() && p.iter().all(|p| p.gateway.is_some()))
}

/// The kernel's `rt6_duplicate_nexthop`: the same nexthop object, or a path of one on the
/// same link through the same gateway as a path of the other. Reject routes sit on the
/// loopback link without a gateway, so any two are duplicates.
fn duplicate_v6(a: &RouteBody, b: &RouteBody) -> bool {
    match (&a.paths, &b.paths) {
        (Paths::Object(x), Paths::Object(y)) => x == y,
        (Paths::Object(_), _) | (_, Paths::Object(_)) => false,
        (Paths::None, Paths::None) => true,
        (Paths::Own(x), Paths::Own(y)) => x
            .iter()
            .any(|p| y.iter().any(|q| p.gateway == q.gateway && p.dev == q.dev)),
        _ => false,
    }
}

/// The kernel's `fib6_add_rt2node` for one prefix's list. ECMP siblings are kept as one
/// route with several paths (the kernel links sibling routes; the answers are the same).
/// `add` refuses any route of the same metric; `replace` and `change` replace the first
/// route of the same metric that is as ECMP-able as the new one (else the first of that
/// metric); `append` and `prepend` refuse a duplicate path and otherwise join an ECMP
/// group of that metric at its end, or stand after the routes of that metric.
fn modify_v6(list: &mut Vec<RouteBody>, op: RouteOp, route: RouteBody) -> Result<(), Refused> {
    let same: Vec<usize> = (0..list.len())
        .filter(|&i| list[i].metric == route.metric)
        .collect();
    let can_ecmp = ecmp_able(&route);
    match op {
        RouteOp::Add if !same.is_empty() => Err(Refused::answers("File exists")),
        RouteOp::Replace | RouteOp::Change => {
            let target = same
                .iter()
                .copied()
                .find(|&i| ecmp_able(&list[i]) == can_ecmp)
                .or(same.first().copied());
            match target {
                Some(i) => list[i] = route,
                None if op == RouteOp::Change => {
                    return Err(Refused::explained("Can not replace route - no match found"))
                }
                None => {
                    let at = insert_position(list, &route, true);
                    list.insert(at, route);
                }
            }
            Ok(())
        }
        _ => {
            if same.iter().any(|&i| duplicate_v6(&list[i], &route)) {
                return Err(Refused::answers("File exists"));
            }
            let group = same.iter().copied().find(|&i| ecmp_able(&list[i]));
            match group {
                Some(i) if can_ecmp => {
                    let new_paths = route.own_paths().to_vec();
                    list[i].paths.edit(|paths| paths.extend(new_paths));
                }
                _ => {
                    let at = insert_position(list, &route, true);
                    list.insert(at, route);
                }
            }
            Ok(())
        }
    }
}
