//! The mirrored state: built from a dump, kept by batches of notifications, each batch
//! published to readers as one version, with the counters `fibre ctl stats` reports.

use crate::convert::{change, route_op, Change, Skip};
use crate::neigh::Neighbours;
use crate::netlink::{self, Message, Received};
use crate::nexthop::NexthopMessage;
use fibre_fib::{Dumping, Fib, FibReader, State, Touched};
use fibre_fib::{Family, Nexthop};
use fibre_fib::{Half, NexthopKind};
use std::io;
use std::time::{Duration, Instant};

/// How many of the latest lags are kept for the quantiles.
const LAGS: usize = 4096;

/// What the mirror has done.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// The first dump is applied.
    pub synced: bool,
    /// Messages applied (from dumps and notifications).
    pub updates: u64,
    /// Batches of notifications applied (each published as one version, unless it
    /// changed nothing readers see).
    pub batches: u64,
    /// Whole dumps after the first (each after an overflow).
    pub resyncs: u64,
    /// Overflows of the subscribed socket (`ENOBUFS`).
    pub overflows: u64,
    /// Resyncs that backed off first (an overflow soon after the last resync).
    pub backoffs: u64,
    /// Times the receiver of notifications waited for the mirror to apply what it had
    /// received ([`crate::netlink::Backlog`]), as its owner last set it.
    pub backlog_waits: u64,
    /// Dumps the kernel marked interrupted, each started again.
    pub dump_restarts: u64,
    /// Messages that could not be parsed, or that named what is not there: dropped.
    pub malformed: u64,
    /// How long the last whole dump took the kernel to give (the messages received).
    pub dump_time: Duration,
    /// How long the last whole dump took to apply and publish, after it was received.
    pub build_time: Duration,
    /// How long packing the state's tables took after the last dump was published
    /// ([`fibre_fib::State::compact`]).
    pub pack_time: Duration,
    /// Messages of what the mirror does not hold (other families, multicast routing,
    /// encapsulations, neighbours): skipped.
    pub skipped: u64,
    /// The latest lags from a batch's arrival to its publication, oldest first: of the
    /// batches that published a new version.
    lags: Vec<Duration>,
    /// Where the next lag goes once `lags` is full.
    next_lag: usize,
    /// The longest a batch that published nothing took to apply, since the lags were
    /// last cleared: the kernel reports an object's routes again when it changes, and
    /// such a batch only drops them.
    unpublished_longest: Duration,
}

impl Stats {
    /// Forgets the lags recorded so far (to measure a new phase's).
    pub fn clear_lags(&mut self) {
        self.lags.clear();
        self.next_lag = 0;
        self.unpublished_longest = Duration::ZERO;
    }

    /// The longest a batch that published nothing took to apply since the lags were last
    /// cleared (zero if none came).
    pub fn unpublished_longest(&self) -> Duration {
        self.unpublished_longest
    }

    /// How many lags are recorded (at most the latest 4,096).
    pub fn lags(&self) -> usize {
        self.lags.len()
    }

    /// The `q` quantile (0 to 1) of the latest lags, if any.
    pub fn lag(&self, q: f64) -> Option<Duration> {
        if self.lags.is_empty() {
            return None;
        }
        let mut l = self.lags.clone();
        l.sort_unstable();
        let at = ((l.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
        Some(l[at])
    }

    fn record_lag(&mut self, d: Duration) {
        if self.lags.len() < LAGS {
            self.lags.push(d);
        } else {
            self.lags[self.next_lag] = d;
            self.next_lag = (self.next_lag + 1) % LAGS;
        }
    }
}

/// The kernel's routing state mirrored and published.
pub struct Mirror {
    fib: Fib,
    reader: FibReader,
    neighbours: Neighbours,
    stats: Stats,
    /// When the last resync ended, and the back-off before the next.
    last_resync: Option<Instant>,
    backoff: Duration,
}

/// Overflows closer together than this back off before dumping again.
const BACKOFF_WINDOW: Duration = Duration::from_secs(10);
/// The first back-off, doubled at each overflow in the window, up to [`BACKOFF_MAX`].
const BACKOFF_FIRST: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

impl Mirror {
    /// The state of the current network namespace's kernel, dumped (the caller has
    /// subscribed before, so that nothing changed meanwhile is missed), and a reader of
    /// it.
    pub fn sync() -> io::Result<(Mirror, FibReader)> {
        let mut stats = Stats::default();
        let (state, neighbours, halves) = dumped(&mut stats)?;
        stats.synced = true;
        let compile = Instant::now();
        let (mut fib, reader) = match halves {
            Some((v4, v6)) => Fib::new_from_halves(state, v4, v6),
            None => Fib::new(state),
        };
        stats.build_time += compile.elapsed();
        let packed = Instant::now();
        fib.pack_state();
        stats.pack_time = packed.elapsed();
        let own = fib.reader();
        Ok((
            Mirror {
                fib,
                reader: own,
                neighbours,
                stats,
                last_resync: None,
                backoff: Duration::ZERO,
            },
            reader,
        ))
    }

    /// Dumps the kernel's state again and publishes it in place of the mirror's (after
    /// an overflow: what was lost is in the dump, what is gone is not). Overflows that
    /// follow one another within seconds back off first, 10 ms doubling up to 2 s, so that
    /// a storm of changes is dumped once it eases rather than over and over.
    pub fn resync(&mut self) -> io::Result<()> {
        self.backoff = match self.last_resync {
            Some(t) if t.elapsed() < BACKOFF_WINDOW => {
                (self.backoff * 2).clamp(BACKOFF_FIRST, BACKOFF_MAX)
            }
            _ => Duration::ZERO,
        };
        if !self.backoff.is_zero() {
            self.stats.backoffs += 1;
            std::thread::sleep(self.backoff);
        }
        // (Compiled whole: the state replaces one whose snapshots are patched.)
        let (state, neighbours, _) = dumped(&mut self.stats)?;
        self.neighbours = neighbours;
        self.stats.resyncs += 1;
        let compile = Instant::now();
        self.fib.update(|s, touched| {
            *s = state;
            touched.all();
        });
        self.stats.build_time += compile.elapsed();
        let packed = Instant::now();
        self.fib.pack_state();
        self.stats.pack_time = packed.elapsed();
        self.last_resync = Some(Instant::now());
        Ok(())
    }

    /// Counts an overflow of the subscribed socket.
    pub fn overflowed(&mut self) {
        self.stats.overflows += 1;
    }

    /// Applies a batch of notifications (`malformed` more could not be parsed) that
    /// arrived at `arrived`, and publishes the result as one version. Its lag, from
    /// `arrived` to the publication, if it published one: a batch that changed nothing
    /// readers see (a neighbour, routes reported again) publishes nothing.
    pub fn apply(
        &mut self,
        batch: Vec<Received>,
        malformed: u64,
        arrived: Instant,
    ) -> Option<Duration> {
        let (stats, neighbours) = (&mut self.stats, &mut self.neighbours);
        stats.malformed += malformed;
        let published = self.fib.update(|s, touched| {
            for (msg, flags) in batch {
                apply_one(s, neighbours, stats, touched, Converted::of(msg, flags));
            }
        });
        let took = arrived.elapsed();
        self.stats.batches += 1;
        if published {
            self.stats.record_lag(took);
        } else {
            self.stats.unpublished_longest = self.stats.unpublished_longest.max(took);
        }
        published.then_some(took)
    }

    /// The mirrored state.
    pub fn state(&self) -> &State {
        self.fib.state()
    }

    /// The published snapshot.
    pub fn snapshot(&self) -> std::sync::Arc<fibre_fib::Snapshot> {
        self.reader.snapshot()
    }

    /// The neighbour entries.
    pub fn neighbours(&self) -> &Neighbours {
        &self.neighbours
    }

    /// The counters, to reset the lags.
    pub fn stats_mut(&mut self) -> &mut Stats {
        &mut self.stats
    }

    /// The counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// How the publications were made: patched, or compiled anew.
    pub fn publications(&self) -> fibre_fib::Publications {
        self.fib.publications()
    }
}

/// Messages the dump's reader hands over at once.
const DUMP_BATCH: usize = 1024;
/// Batches the dump's reader may be ahead of the state by: the memory a dump holds. The
/// reader goes on reading IPv6's routes while IPv4's tables are built (0.1 s on the full
/// tables, some 150,000 messages): with 16 batches it waited, and the kernel with it.
const DUMP_AHEAD: usize = 256;

/// A mirror state and neighbour entries from a fresh dump. A thread of its own reads the
/// dump (the kernel makes it as it is read) while this one applies each message as it
/// comes, in batches of [`DUMP_BATCH`] through a channel holding at most [`DUMP_AHEAD`]:
/// on two cores the two overlap, and no more than that is held. A dump the kernel marks
/// interrupted is thrown away and made again, from a fresh state.
fn dumped(stats: &mut Stats) -> io::Result<(State, Neighbours, Option<Halves>)> {
    // The dump's time counts the attempts the kernel interrupted too.
    let started = Instant::now();
    loop {
        let mut state = State::mirrored();
        state.set_multipath(multipath());
        let mut state = Dumping::new(state);
        let mut neighbours = Neighbours::default();
        // A fresh state: compiled whole, whatever it touched.
        let mut touched = Touched::everything();
        let mut groups = Vec::new();
        let mut part = Stats::default();
        let mut applying = Duration::ZERO;
        // What came after IPv4's routes were lent to be compiled, other than IPv6's
        // routes and neighbours: applied once they are back.
        let mut deferred: Vec<Converted> = Vec::new();
        let (dumped, read_in, early) = std::thread::scope(|scope| {
            let (batches, arriving) = std::sync::mpsc::sync_channel::<Vec<Converted>>(DUMP_AHEAD);
            // The reader: a thread started from this one is in its network namespace.
            // It decodes each message into what it changes, so that the messages are
            // made and freed on one thread, and the applier only applies.
            let reader = scope.spawn(move || {
                let mut batch = Vec::with_capacity(DUMP_BATCH);
                let mut last_paths = None;
                let dumped = netlink::dump(|(msg, _)| {
                    // A dump lists each key's routes in the kernel's order: each goes
                    // after those before it.
                    let mut converted = Converted::of(msg, netlink_packet_core::NLM_F_APPEND);
                    converted.share_paths(&mut last_paths);
                    batch.push(converted);
                    if batch.len() == DUMP_BATCH {
                        // The applier gone (it stops only with the dump), the rest is
                        // read away.
                        let full = std::mem::replace(&mut batch, Vec::with_capacity(DUMP_BATCH));
                        let _ = batches.send(full);
                    }
                });
                let _ = batches.send(batch);
                (dumped, started.elapsed())
            });
            // IPv4's half of the snapshot, compiled while IPv6's routes are read (on a
            // thread of its own: the reader is busy, the applier mostly waits).
            let mut early = None;
            for batch in arriving {
                let applied = Instant::now();
                for converted in batch {
                    let v6_route = matches!(&converted,
                        Converted::Change(Ok(Change::Route(r, _))) if r.family() == Family::V6);
                    if v6_route
                        && early.is_none()
                        && state.staged_routes(Family::V4) >= EARLY_V4_FROM
                    {
                        // The dump lists IPv4's routes, then IPv6's: IPv4's are all in.
                        let v4 = state.take_v4();
                        early = Some(scope.spawn(move || {
                            let compiled = v4.compile_half(Family::V4);
                            (v4, compiled)
                        }));
                    }
                    // Neighbours are not the state's; a message skipped changes nothing.
                    let aside = matches!(
                        &converted,
                        Converted::Change(
                            Ok(Change::Neighbour(_) | Change::DelNeighbour(..)) | Err(_)
                        )
                    );
                    if early.is_some() && !v6_route && !aside {
                        deferred.push(converted);
                        continue;
                    }
                    apply_dumped(
                        &mut state,
                        &mut neighbours,
                        &mut part,
                        &mut touched,
                        &mut groups,
                        converted,
                    );
                }
                applying += applied.elapsed();
            }
            let (dumped, read_in) = reader.join().expect("the dump's reader does not panic");
            // IPv6's half here meanwhile, unless IPv4's may not be used.
            let halves = Instant::now();
            let v6 = (early.is_some()
                && deferred.is_empty()
                && dumped.as_ref().is_ok_and(|d| !d.interrupted))
            .then(|| Half::of_v6(&mut state));
            let early = early.map(|h| h.join().expect("a compile does not panic"));
            applying += halves.elapsed();
            (dumped, read_in, early.map(|(v4, half)| (v4, half, v6)))
        });
        let dumped = dumped?;
        if dumped.interrupted {
            // Its messages are read again: counted then.
            stats.dump_restarts += 1;
            continue;
        }
        // IPv4's routes back in place; what changed anything else meanwhile makes the
        // half compiled apart differ from the state: it is then compiled whole.
        let halves = early.and_then(|(v4, v4_half, v6_half)| {
            state.put_v4_back(v4);
            v6_half.map(|v6_half| (v4_half, v6_half))
        });
        for converted in deferred {
            apply_dumped(
                &mut state,
                &mut neighbours,
                &mut part,
                &mut touched,
                &mut groups,
                converted,
            );
        }
        stats.malformed += dumped.malformed + part.malformed;
        stats.updates += part.updates;
        stats.skipped += part.skipped;
        let mut state = state.finish();
        // A group dumped before its members (a lower id) takes their family now (which
        // the half compiled ahead did not know).
        let mut regrouped = false;
        for nh in &groups {
            let before = state.nexthop(nh.id).cloned();
            state.mirror_nexthop(nexthop_of(&state, nh));
            regrouped |= state.nexthop(nh.id) != before.as_ref();
        }
        stats.dump_time = read_in;
        stats.build_time = applying;
        return Ok((state, neighbours, halves.filter(|_| !regrouped)));
    }
}

/// Applies one message of a dump ([`apply_one`]), keeping aside the nexthop groups, which
/// take their members' family once the dump is whole.
fn apply_dumped(
    state: &mut Dumping,
    neighbours: &mut Neighbours,
    stats: &mut Stats,
    touched: &mut Touched,
    groups: &mut Vec<NexthopMessage>,
    converted: Converted,
) {
    if let Converted::Nexthop(nh) = &converted {
        if matches!(nh.kind, NexthopKind::Group(_)) && nh.family.is_none() {
            groups.push(nh.clone());
        }
    }
    apply_one(state, neighbours, stats, touched, converted);
}

/// A snapshot's IPv4 and IPv6 halves, compiled apart.
type Halves = (Half, Half);

/// IPv4 routes from which a dump compiles IPv4's half of the snapshot on a thread of its
/// own while IPv6's routes are read (fewer compile in less than starting a thread takes).
const EARLY_V4_FROM: usize = 50_000;

/// A message read, made into what it changes.
enum Converted {
    /// A route, link, address, rule or neighbour message's change, or why it is none.
    Change(Result<Change, Skip>),
    /// A nexthop object, new or changed.
    Nexthop(NexthopMessage),
    /// A nexthop object removed: its id.
    DelNexthop(u32),
}

impl Converted {
    /// What `msg`, with its header's `flags`, changes.
    fn of(msg: Message, flags: u16) -> Converted {
        match msg {
            Message::Decoded(m) => Converted::Change(change(&m, flags)),
            Message::Route(deleted, route) => Converted::Change(route.map(|r| {
                if deleted {
                    Change::DelRoute(r)
                } else {
                    Change::Route(r, route_op(flags))
                }
            })),
            Message::Nexthop(nh) => Converted::Nexthop(nh),
            Message::DelNexthop(id) => Converted::DelNexthop(id),
        }
    }

    /// Makes a route's paths, if equal to `last`'s, the same shared ones, and `last`
    /// its paths otherwise: a dump lists the routes of one gateway in runs, and the
    /// state then interns them without a new allocation to free each.
    fn share_paths(&mut self, last: &mut Option<std::sync::Arc<[fibre_fib::Path]>>) {
        if let Converted::Change(Ok(Change::Route(route, _))) = self {
            if let fibre_fib::Paths::Own(paths) = &mut route.body.paths {
                match last {
                    Some(l) if **l == **paths => *paths = std::sync::Arc::clone(l),
                    _ => *last = Some(std::sync::Arc::clone(paths)),
                }
            }
        }
    }
}

/// Applies one message to `state`, counting it and saying what it touched.
fn apply_one(
    target: &mut impl Target,
    neighbours: &mut Neighbours,
    stats: &mut Stats,
    touched: &mut Touched,
    converted: Converted,
) {
    let changed = match converted {
        Converted::Change(c) => c,
        Converted::Nexthop(nh) => {
            stats.updates += 1;
            touched.others();
            let state = target.state();
            state.mirror_nexthop(nexthop_of(state, &nh));
            return;
        }
        Converted::DelNexthop(id) => {
            stats.updates += 1;
            touched.others();
            target.state().mirror_del_nexthop(id);
            return;
        }
    };
    match changed {
        // Routes the state notes itself, whatever removed them; neighbours are not the
        // state's (a dump's staged routes stay staged).
        Ok(Change::Route(r, op)) => {
            stats.updates += 1;
            target.route(r, op);
        }
        Ok(Change::Neighbour(n)) => {
            stats.updates += 1;
            neighbours.put(n);
        }
        Ok(Change::DelNeighbour(link, dst)) => {
            stats.updates += 1;
            neighbours.remove(link, dst);
        }
        Ok(c) => {
            stats.updates += 1;
            let state = target.state();
            match &c {
                Change::DelRoute(_) => {}
                // The kernel announces a link or an address again for changes the
                // mirror does not hold (statistics, an address's DAD ending).
                Change::Link(l, carrier)
                    if state.link(l.index) == Some(l) && state.carrier(l.index) == *carrier => {}
                Change::Address(a) if state.addresses().contains(a) => {}
                _ => touched.others(),
            }
            match c {
                Change::Link(l, carrier) => state.mirror_link(l, carrier),
                Change::DelLink(i) => {
                    state.mirror_del_link(i);
                    neighbours.remove_link(i);
                }
                Change::Address(a) => state.mirror_address(a),
                Change::DelAddress(link, local, len) => state.mirror_del_address(link, local, len),
                Change::DelRoute(r) => state.mirror_del_route(&r),
                Change::Rule(r) => state.mirror_rule(r),
                Change::DelRule(r) => state.mirror_del_rule(&r),
                // (Taken above.)
                Change::Route(..) | Change::Neighbour(_) | Change::DelNeighbour(..) => {}
            }
        }
        Err(Skip::Malformed(_)) => stats.malformed += 1,
        Err(Skip::NotFollowed | Skip::NotHeld) => stats.skipped += 1,
    }
}

/// What messages are applied to: a mirror's state, or one being built from a dump.
trait Target {
    /// The state, for any message but a route.
    fn state(&mut self) -> &mut State;
    /// A route reported with `op`.
    fn route(&mut self, route: fibre_fib::Route, op: fibre_fib::RouteOp);
}

impl Target for State {
    fn state(&mut self) -> &mut State {
        self
    }

    fn route(&mut self, route: fibre_fib::Route, op: fibre_fib::RouteOp) {
        self.mirror_route(route, op);
    }
}

impl Target for Dumping {
    fn state(&mut self) -> &mut State {
        self.state_mut()
    }

    /// (A dump's routes each go after those before: `Append`.)
    fn route(&mut self, route: fibre_fib::Route, _: fibre_fib::RouteOp) {
        Dumping::route(self, route);
    }
}

/// A reported nexthop object as the state holds it: a group is of its members' family
/// (the kernel reports none), a blackhole of no family is IPv4's.
fn nexthop_of(state: &State, m: &NexthopMessage) -> Nexthop {
    let family = m.family.unwrap_or_else(|| match &m.kind {
        NexthopKind::Group(members) => members
            .iter()
            .find_map(|(id, _)| state.nexthop(*id).map(|n| n.family))
            .unwrap_or(Family::V4),
        _ => Family::V4,
    });
    Nexthop {
        id: m.id,
        family,
        kind: m.kind.clone(),
        protocol: m.protocol,
    }
}

/// The namespace's multipath hash settings, read from its sysctls (the kernel announces no
/// change of them: they are read at each dump). A seed of 0 is the kernel's random one,
/// which it does not show: paths are then chosen with another hash than the kernel's.
fn multipath() -> fibre_fib::Multipath {
    let read = |key: &str| -> Option<u32> {
        std::fs::read_to_string(format!("/proc/sys/net/{key}"))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let mut m = fibre_fib::Multipath::default();
    if let Some(seed) = read("ipv4/fib_multipath_hash_seed") {
        m.seed = seed;
    }
    if let Some(p) = read("ipv4/fib_multipath_hash_policy") {
        m.policy_v4 = p.min(255) as u8;
    }
    if let Some(p) = read("ipv6/fib_multipath_hash_policy") {
        m.policy_v6 = p.min(255) as u8;
    }
    m
}
