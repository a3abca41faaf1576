//! Forwarding workers: threads, each pinned to a core, that take vectors of frames from
//! the forwarded links, run them through the pipeline with the FIB's current snapshot and
//! the current neighbour table, and send what the pipeline sends.
//!
//! Every worker reads every forwarded link, in one of two ways:
//!
//! - **AF_XDP** (`crate::xsk`), where the links take an XDP program: each link's
//!   program (`crate::xdp`) passes the kernel's frames to the kernel and redirects the
//!   rest to the socket of the worker that owns the frame's receive queue (worker `n`,
//!   queue `n`; a link with fewer queues than workers leaves the extra workers out). The
//!   frames lie in the worker's pool from the moment they arrive until they are sent.
//!   Packets whose checksum may have been left partial are passed to the kernel too,
//!   and each worker reads them from a receive ring on each link (`crate::ring`),
//!   which says what the XDP program cannot know: fibre finishes a partial checksum
//!   (and cuts a packet left whole into its segments, `crate::segment`) before the
//!   frame leaves by AF_XDP, which carries neither.
//! - **AF_PACKET** otherwise: each worker reads each link through a socket's
//!   `TPACKET_V3` receive ring (`crate::ring`) and sends with `sendmmsg`
//!   ([`crate::packet`]). Each link's sockets are joined in one `PACKET_FANOUT` group
//!   hashed by flow, so that the kernel spreads the link's flows over the workers and a
//!   flow's packets stay in order on one. The kernel sees every frame too, and drops
//!   those it does not forward. What a sender left undone (a partial checksum, a packet
//!   to cut into segments) comes in with the frame and leaves with it, as the kernel's
//!   own forwarding hands it on.
//!
//! The FIB snapshot and the neighbour table are taken once per vector, without a lock. A next hop with no MAC
//! address is asked of the kernel (`NTF_USE`, at most once a second each), which
//! resolves it and announces it, and the mirror publishes it; meanwhile its packets wait,
//! as the kernel queues packets for a neighbour it resolves (up to 64 a next hop, 256 a
//! worker, 3 seconds), and go through the pipeline again when the table changes.
//! What each worker counted is added to the shared counters every tenth of a
//! second, so that no packet takes a lock.

use crate::claims::Claims;
use crate::express::EXPRESS_DESTINATIONS;
use crate::express::{Entry, Express, Generation};
use crate::handoff::{Batch as Handing, Mailbox, HOPS};
use crate::icmp::{self, RateLimit};
use crate::offload::{finish_checksum, Offload};
use crate::packet::{wait_any, Batch, PacketSocket};
use crate::pipeline::{
    address_bits, Arrival, Fate, Handed, Neighbours, Output, Pipeline, Unanswered,
};
use crate::pool::{BufferId, Pool};
use crate::ring::ReceiveRing;
use crate::runtime::StageCounters;
use crate::segment;
use crate::xsk::{XskPorts, XskStatistics};
use arc_swap::ArcSwap;
use fibre_conntrack::{Conntrack, Owners};
use fibre_fib::{FibReader, LinkIndex};
use fibre_firewall::Filter;
use std::collections::{HashMap, HashSet};
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// MAC addresses of usable neighbour entries, by link and address.
///
/// An address is kept as one 128-bit number ([`address_bits`]), hashed with the link
/// index in two words, with a fast hash seeded at random (its keys are the kernel's
/// neighbour entries, not what a packet chooses). Each table has a version of its own,
/// new at every change, so that the pipeline may keep its answers while it stays.
#[derive(Clone, Debug)]
pub struct NeighbourMacs {
    map: HashMap<(LinkIndex, u128), [u8; 6], foldhash::fast::RandomState>,
    version: u64,
}

/// The next version a neighbour table takes.
fn next_version() -> u64 {
    static VERSIONS: AtomicU64 = AtomicU64::new(1);
    VERSIONS.fetch_add(1, Ordering::Relaxed)
}

fn neighbour_key(link: LinkIndex, addr: IpAddr) -> (LinkIndex, u128) {
    (link, address_bits(addr))
}

impl Default for NeighbourMacs {
    fn default() -> Self {
        NeighbourMacs {
            map: HashMap::default(),
            version: next_version(),
        }
    }
}

impl NeighbourMacs {
    /// An empty table.
    pub fn new() -> NeighbourMacs {
        NeighbourMacs::default()
    }

    /// Sets the MAC address of `addr` on `link`.
    pub fn insert(&mut self, link: LinkIndex, addr: IpAddr, mac: [u8; 6]) {
        self.map.insert(neighbour_key(link, addr), mac);
        self.version = next_version();
    }

    /// The MAC address of `addr` on `link`.
    #[inline]
    pub fn get(&self, link: LinkIndex, addr: IpAddr) -> Option<[u8; 6]> {
        self.map.get(&neighbour_key(link, addr)).copied()
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

impl FromIterator<((LinkIndex, IpAddr), [u8; 6])> for NeighbourMacs {
    fn from_iter<I: IntoIterator<Item = ((LinkIndex, IpAddr), [u8; 6])>>(iter: I) -> Self {
        let mut t = NeighbourMacs::new();
        for ((link, addr), mac) in iter {
            t.insert(link, addr, mac);
        }
        t
    }
}

/// The neighbour table the workers read, published whole by its one writer.
#[derive(Default)]
pub struct SharedNeighbours {
    table: ArcSwap<NeighbourMacs>,
}

impl SharedNeighbours {
    /// Publishes `table` for the workers' next vectors.
    pub fn publish(&self, table: NeighbourMacs) {
        self.table.store(Arc::new(table));
    }

    /// The current table.
    pub fn load(&self) -> Arc<NeighbourMacs> {
        self.table.load_full()
    }

    /// The version of the table published last.
    pub fn serial(&self) -> u64 {
        self.table.load().version
    }
}

impl Neighbours for NeighbourMacs {
    fn mac(&self, link: LinkIndex, addr: IpAddr) -> Option<[u8; 6]> {
        self.get(link, addr)
    }

    fn version(&self) -> Option<u64> {
        Some(self.version)
    }
}

/// What the workers counted, together.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    /// The stages' costs, in [`Pipeline::stages`] order.
    pub stages: Vec<(&'static str, StageCounters)>,
    /// Packets by fate.
    pub fates: HashMap<Fate, u64>,
    /// Errors not sent, by reason.
    pub unanswered: Unanswered,
    /// Fragments made of IPv4 packets over the MTU without DF.
    pub fragments_made: u64,
    /// Tracked packets whose chains' verdict was kept on their connection.
    pub verdicts_kept: u64,
    /// Frames received.
    pub received: u64,
    /// Frames sent.
    pub sent: u64,
    /// Frames the output link had no room for (or could not be opened for), dropped.
    pub send_failed: u64,
    /// Neighbours asked of the kernel.
    pub resolve_requests: u64,
    /// Packets that waited for a neighbour in vain (or found no room to wait), dropped.
    pub unresolved_dropped: u64,
    /// Frames received longer than a buffer (merged by receive offload), dropped.
    pub truncated: u64,
    /// Frames for the kernel that reached a worker through AF_XDP, which cannot hand
    /// them back (the XDP program passes the kernel's frames itself; these slipped past
    /// it, as when a local route was added an instant before), dropped.
    pub kernel_unreached: u64,
    /// AF_XDP descriptors that named no buffer lent to the kernel, and `AF_PACKET`
    /// ring blocks whose frames did not fit in them, ignored.
    pub bad_descriptors: u64,
    /// Frames whose virtio-net header asked for what fibre cannot do (a kind of
    /// segmentation it does not make), dropped.
    pub refused_offloads: u64,
    /// Partial checksums fibre finished before sending by AF_XDP.
    pub checksums_finished: u64,
    /// Packets left whole by their sender that fibre cut into segments, for AF_XDP
    /// (which carries no segmentation) or its buffers.
    pub segmented: u64,
    /// Packets left whole by their sender that could not be cut (no buffers, or
    /// malformed), dropped.
    pub segment_failed: u64,
    /// Frames the `AF_PACKET` receive rings had no free block for, dropped by the
    /// kernel.
    pub ring_dropped: u64,
    /// What the kernel counted for the AF_XDP sockets.
    pub xsk: XskStatistics,
    /// Destinations taught to the express path (once per generation each).
    pub express_taught: u64,
    /// Destinations the express path's map refused.
    pub express_failed: u64,
    /// Replies of translated connections claimed from the kernel's stack.
    pub claimed: u64,
    /// Replies the map of claims refused (full): the kernel's stack answers them.
    pub claims_failed: u64,
    /// Packets of a family the router's firewall closes ([`Shared::closed`]) that fibre
    /// would have sent, dropped.
    pub firewall_refused: u64,
    /// Frames the kernel forwards itself ([`Shared::kernel_forwards`]: it has its own
    /// copy, and its forwarding is on for their family), left to it.
    pub left_to_kernel: u64,
    /// Packets handed to the worker that owns their connection ([`crate::handoff`]).
    pub handed_off: u64,
    /// Packets handed over that the worker they went to could not take (its mailbox
    /// full, or its pool), dropped.
    pub handoff_dropped: u64,
}

impl Counters {
    fn add(&mut self, p: &mut Pipeline, io: &mut Io) {
        let stages = p.stages();
        if self.stages.is_empty() {
            self.stages = stages
                .iter()
                .map(|(n, _)| (*n, StageCounters::default()))
                .collect();
        }
        for ((_, total), (_, c)) in self.stages.iter_mut().zip(stages) {
            total.calls += c.calls;
            total.packets += c.packets;
            total.time += c.time;
        }
        for (f, n) in p.fates.drain() {
            *self.fates.entry(f).or_default() += n;
        }
        let u = std::mem::take(&mut p.unanswered);
        self.unanswered.not_answered += u.not_answered;
        self.unanswered.rate_limited += u.rate_limited;
        self.unanswered.no_route_back += u.no_route_back;
        self.unanswered.unresolved += u.unresolved;
        self.unanswered.dropped_by_nat += u.dropped_by_nat;
        self.fragments_made += std::mem::take(&mut p.fragments_made);
        self.verdicts_kept += std::mem::take(&mut p.verdicts_kept);
        for s in p.stages_mut() {
            *s = StageCounters::default();
        }
        self.received += std::mem::take(&mut io.received);
        self.sent += std::mem::take(&mut io.sent);
        self.send_failed += std::mem::take(&mut io.send_failed);
        self.resolve_requests += std::mem::take(&mut io.resolve_requests);
        self.unresolved_dropped += std::mem::take(&mut io.unresolved_dropped);
        self.truncated += std::mem::take(&mut io.truncated);
        self.kernel_unreached += std::mem::take(&mut io.kernel_unreached);
        self.bad_descriptors += std::mem::take(&mut io.bad_descriptors);
        self.refused_offloads += std::mem::take(&mut io.refused_offloads);
        self.checksums_finished += std::mem::take(&mut io.checksums_finished);
        self.segmented += std::mem::take(&mut io.segmented);
        self.segment_failed += std::mem::take(&mut io.segment_failed);
        self.ring_dropped += std::mem::take(&mut io.ring_dropped);
        self.express_taught += std::mem::take(&mut io.express_taught);
        self.express_failed += std::mem::take(&mut io.express_failed);
        self.claimed += std::mem::take(&mut io.claimed);
        self.claims_failed += std::mem::take(&mut io.claims_failed);
        self.firewall_refused += std::mem::take(&mut io.firewall_refused);
        self.left_to_kernel += std::mem::take(&mut io.left_to_kernel);
        self.handed_off += std::mem::take(&mut io.handed_off);
        self.handoff_dropped += std::mem::take(&mut io.handoff_dropped);
        let x = std::mem::take(&mut io.xsk);
        self.xsk.rx_dropped += x.rx_dropped;
        self.xsk.rx_ring_full += x.rx_ring_full;
        self.xsk.fill_ring_empty += x.fill_ring_empty;
        self.xsk.invalid_descriptors += x.invalid_descriptors;
    }
}

/// A worker's I/O counts since it last added them.
#[derive(Default)]
struct Io {
    received: u64,
    sent: u64,
    send_failed: u64,
    resolve_requests: u64,
    unresolved_dropped: u64,
    truncated: u64,
    kernel_unreached: u64,
    bad_descriptors: u64,
    refused_offloads: u64,
    checksums_finished: u64,
    segmented: u64,
    segment_failed: u64,
    ring_dropped: u64,
    express_taught: u64,
    express_failed: u64,
    claimed: u64,
    claims_failed: u64,
    firewall_refused: u64,
    left_to_kernel: u64,
    handed_off: u64,
    handoff_dropped: u64,
    /// The kernel's AF_XDP counts since they were last added.
    xsk: XskStatistics,
}

/// Packets waiting for their next hop's MAC address: each its buffer, the link it came
/// in on, whether the kernel has its own copy, when it started waiting.
#[derive(Default)]
struct Waiting {
    packets: Vec<(BufferId, Arrival, bool, Instant)>,
    /// The neighbour table they last went through the pipeline with.
    seen: Option<Arc<NeighbourMacs>>,
}

/// The longest a worker reads without sleeping; then it sleeps [`BUSY_PAUSE`] (a
/// fraction of a percent of its time), so that the kernel's grace periods pass.
const BUSY_SPELL: Duration = Duration::from_millis(10);
/// See [`BUSY_SPELL`].
const BUSY_PAUSE: Duration = Duration::from_micros(20);

/// Slots of its table a worker looks at for connections whose time is up, each tenth
/// of a second, beside those its packets make it look at.
const SWEEP: usize = 4096;

/// Packets a worker holds waiting at most.
const WAITING_MAX: usize = 256;
/// How long a packet waits for its neighbour.
const WAIT_FOR: Duration = Duration::from_secs(3);

/// What the workers share: the routes, the neighbours, the counters, the stop flag.
pub struct Shared {
    /// The FIB's snapshots.
    pub fib: FibReader,
    /// The neighbour table.
    pub neighbours: SharedNeighbours,
    /// The counters, added to by every worker.
    pub counters: Mutex<Counters>,
    /// Set to stop the workers.
    pub stop: AtomicBool,
    /// The limits on ICMP and ICMPv6 errors.
    pub icmp_limits: icmp::Limits,
    /// The TTL and hop limits of the errors and resets the workers make.
    pub hops: icmp::Hops,
    /// The overall limit on errors, which the workers share as the kernel's CPUs do.
    pub icmp_overall: Arc<icmp::Overall>,
    /// The worker to fail (panic) at its next round, to test what follows a failure;
    /// `usize::MAX`: none.
    pub fail: AtomicUsize,
    /// The express path the workers feed with what they decide, if one runs.
    express: Mutex<Option<Arc<Express>>>,
    /// The replies the workers claim from the kernel's stack, on the links that have
    /// the program on (`crate::claims`); set before the workers start.
    pub claims: Mutex<Option<Arc<Claims>>>,
    /// What the router's firewall closes to fibre: bit 0 IPv4, bit 1 IPv6 (packets of
    /// those it would send, it drops and counts instead, `firewall_refused`, and the
    /// express path forwards none); bit 2 IPv4's, bit 3 IPv6's ICMP errors fibre would
    /// send (dropped and counted alike); bit 4 IPv4, bit 5 IPv6 to the express path only
    /// (the workers put those families through the filter rules, which the express path
    /// does not run). Set by [`Shared::close`].
    closed: AtomicU8,
    /// The router's filter rules, which the workers put every packet through, together
    /// with what is closed: taken by a worker as one, so that it never meets a filter
    /// that leaves out a chain with the family that chain closes still open, nor a
    /// family opened with the filter that leaves it out.
    enforced: ArcSwap<Enforced>,
    /// The families the kernel forwards itself, by input link (bit 0 IPv4, bit 1 IPv6:
    /// its forwarding is on for frames from that link): a frame it has its own copy of
    /// is left to it, never sent a second time; the workers still teach the express
    /// path by it.
    kernel_forwards: ArcSwap<Vec<(LinkIndex, u8)>>,
    /// The connections of the forwarded packets of the families tracked: a table for
    /// each worker (worker `n` the `n`-th), holding the connections it owns
    /// ([`fibre_conntrack::Owners`]). Only its worker takes a table while packets flow
    /// (once a vector); the daemon takes them all, in order, to read them or move
    /// connections between them.
    tables: ArcSwap<Vec<Arc<Mutex<Conntrack>>>>,
    /// Held while the tables are made anew or their connections moved.
    tables_changing: Mutex<()>,
    /// The connections of every table together, which `nf_conntrack_max` bounds.
    census: Arc<AtomicUsize>,
    /// What NAT asks of every table's connections.
    registry: Arc<Mutex<fibre_conntrack::Registry>>,
    /// The owners' hash's seed.
    owners_seed: u64,
    /// The workers' mailboxes, worker `n`'s the `n`-th ([`crate::handoff`]).
    mailboxes: ArcSwap<Vec<Mailbox>>,
}

/// The router's filter rules and what the firewall closes ([`Shared::closed`]'s bits),
/// taken together.
#[derive(Default)]
pub struct Enforced {
    /// The filter rules.
    pub filter: Arc<Filter>,
    /// The families whose connections are tracked (bit 0 IPv4, bit 1 IPv6).
    pub tracked: u8,
    /// What is closed.
    pub closed: u8,
}

impl Shared {
    /// What the workers share, with nothing counted: the FIB's reader, the ICMP limits.
    pub fn new(fib: FibReader, icmp_limits: icmp::Limits, hops: icmp::Hops) -> Shared {
        Shared {
            fib,
            neighbours: SharedNeighbours::default(),
            counters: Mutex::default(),
            stop: AtomicBool::new(false),
            icmp_limits,
            hops,
            icmp_overall: Arc::new(icmp::Overall::new(
                icmp_limits.per_second,
                icmp_limits.burst,
            )),
            fail: AtomicUsize::new(usize::MAX),
            express: Mutex::new(None),
            claims: Mutex::new(None),
            closed: AtomicU8::new(0),
            enforced: ArcSwap::default(),
            kernel_forwards: ArcSwap::default(),
            tables: ArcSwap::from_pointee(vec![Arc::new(Mutex::new(Conntrack::new(
                fibre_conntrack::Settings::kernel_defaults(),
            )))]),
            tables_changing: Mutex::new(()),
            census: Arc::default(),
            registry: Arc::default(),
            owners_seed: {
                use std::hash::BuildHasher;
                foldhash::fast::RandomState::default().hash_one(0x0c0a_u64)
            },
            mailboxes: ArcSwap::default(),
        }
        .with_census()
    }

    fn with_census(self) -> Shared {
        for t in self.tables.load().iter() {
            let mut t = lock(t);
            t.set_census(self.census.clone());
            t.set_registry(self.registry.clone());
        }
        self
    }

    /// The connection tables, worker `n`'s the `n`-th.
    pub fn tables(&self) -> Arc<Vec<Arc<Mutex<Conntrack>>>> {
        self.tables.load_full()
    }

    /// Calls `f` with every connection table held (taken in order: a worker takes only
    /// its own, so no two wait for each other).
    pub fn with_tables<T>(&self, f: impl FnOnce(&mut [&mut Conntrack]) -> T) -> T {
        let tables = self.tables.load_full();
        let mut held: Vec<std::sync::MutexGuard<'_, Conntrack>> =
            tables.iter().map(|t| lock(t)).collect();
        let mut all: Vec<&mut Conntrack> = held.iter_mut().map(|g| &mut **g).collect();
        // What the tables were told and have not taken yet, first, so that what `f`
        // tells them comes after it.
        let mailboxes = self.mailboxes.load_full();
        for (t, m) in all.iter_mut().zip(mailboxes.iter()) {
            m.take_forwards(|f| t.forward(f));
        }
        let out = f(&mut all);
        // What the tables are to tell each other of connections entered or ended here,
        // told at once (every table is held).
        let mut told = Vec::new();
        for t in all.iter_mut() {
            t.drain_outbox(&mut told);
        }
        for (to, f) in told {
            if let Some(t) = all.get_mut(usize::from(to)) {
                t.forward(f);
            }
        }
        out
    }

    /// Makes a table for each of `workers` workers (before they start), moving the
    /// connections of the tables there were to their owners among them.
    pub fn set_workers(&self, workers: usize) -> io::Result<()> {
        let _changing = lock(&self.tables_changing);
        let workers = workers.max(1);
        let before = self.mailboxes.load_full();
        if before.len() != workers {
            let mailboxes = (0..workers)
                .map(|_| Mailbox::new())
                .collect::<io::Result<Vec<_>>>()?;
            self.mailboxes.store(Arc::new(mailboxes));
            // What the workers that were had not yet taken is lost (what the tables
            // told each other is made anew below, from the connections).
            let mut lost = 0;
            for m in before.iter() {
                m.drain(true, |b| lost += b.len() as u64);
            }
            self.counters().handoff_dropped += lost;
        }
        let old = self.tables.load_full();
        if old.len() == workers {
            return Ok(());
        }
        let (settings, registering) = {
            let first = lock(&old[0]);
            (first.settings().clone(), first.registering())
        };
        let new: Vec<Arc<Mutex<Conntrack>>> = (0..workers)
            .map(|n| {
                old.get(n).cloned().unwrap_or_else(|| {
                    let mut t = Conntrack::new(settings.clone());
                    t.set_census(self.census.clone());
                    t.set_registry(self.registry.clone());
                    t.register(registering);
                    Arc::new(Mutex::new(t))
                })
            })
            .collect();
        {
            let mut held: Vec<_> = new.iter().map(|t| lock(t)).collect();
            let mut gone: Vec<_> = old[workers.min(old.len())..]
                .iter()
                .map(|t| lock(t))
                .collect();
            let mut all: Vec<&mut Conntrack> = held.iter_mut().map(|g| &mut **g).collect();
            // The tables that go hand their connections to the first, and every
            // connection then goes to its owner.
            for g in &mut gone {
                for c in g.hand_over(|_| true) {
                    all[0].adopt(c);
                }
            }
            fibre_conntrack::Conntrack::redistribute(
                &mut all,
                Owners {
                    workers: workers as u16,
                    me: 0,
                    seed: self.owners_seed,
                },
            );
        }
        self.tables.store(Arc::new(new));
        Ok(())
    }

    /// How `workers` workers share the connections: the owners' hash, whose seed lives
    /// as long as the daemon (`me` left 0).
    pub fn owners(&self, workers: usize) -> Owners {
        Owners {
            workers: workers as u16,
            me: 0,
            seed: self.owners_seed,
        }
    }

    /// Has every table follow `settings` (the namespace's conntrack sysctls), tables made
    /// meanwhile too.
    pub fn set_settings(&self, settings: &fibre_conntrack::Settings) {
        let _changing = lock(&self.tables_changing);
        self.with_tables(|all| {
            for t in all.iter_mut() {
                t.set_settings(settings.clone());
            }
        });
    }

    /// Has every connection of `families` (bit 0 IPv4, bit 1 IPv6) enter the registry
    /// NAT asks ([`fibre_conntrack::Registry`]), in every worker's table, from now on: the
    /// families NAT translates. A family stays so while the daemon runs.
    pub fn register(&self, families: u8) {
        let _changing = lock(&self.tables_changing);
        self.with_tables(|all| {
            for t in all.iter_mut() {
                t.register(families);
            }
        });
    }

    /// The workers' mailboxes.
    pub(crate) fn mailboxes(&self) -> Arc<Vec<Mailbox>> {
        self.mailboxes.load_full()
    }

    /// Closes to the workers what `closed` says (as [`Shared::closed`] reads it); while
    /// a family is closed, the express path's current generation is one no entry has
    /// ([`Generation::RETIRED`]). Under the express path's lock, so that a generation
    /// published meanwhile ([`Shared::publish_generation`]) cannot undo it.
    pub fn close(&self, closed: u8) -> io::Result<()> {
        let now = self.enforced.load();
        self.enforce(now.filter.clone(), now.tracked, closed)
    }

    /// Gives the workers the router's filter rules, the families whose connections are
    /// tracked and what the firewall closes (as [`Shared::close`] says it), all at once.
    pub fn enforce(&self, filter: Arc<Filter>, tracked: u8, closed: u8) -> io::Result<()> {
        // The connections of the families NAT translates are in the registry before any
        // worker meets the rules that translate them.
        let translated =
            u8::from(filter.translates(false)) | u8::from(filter.translates(true)) << 1;
        self.register(translated);
        let express = self.express();
        self.enforced.store(Arc::new(Enforced {
            filter,
            tracked,
            closed,
        }));
        self.closed.store(closed, Ordering::SeqCst);
        match &*express {
            Some(x) if express_closed(closed) != 0 => x.set_generation(Generation::RETIRED),
            _ => Ok(()),
        }
    }

    /// The router's filter rules and what is closed, as the workers take them.
    pub fn enforced(&self) -> Arc<Enforced> {
        self.enforced.load_full()
    }

    /// What the firewall closes now: bit 0 IPv4, bit 1 IPv6, bit 2 IPv4's ICMP errors,
    /// bit 3 IPv6's; bits 4 and 5 IPv4 and IPv6 to the express path only.
    pub fn closed(&self) -> u8 {
        self.closed.load(Ordering::Relaxed)
    }

    /// Says which families the kernel forwards itself, by input link (bit 0 IPv4, bit
    /// 1 IPv6).
    pub fn set_kernel_forwards(&self, by_link: Vec<(LinkIndex, u8)>) {
        self.kernel_forwards.store(Arc::new(by_link));
    }

    /// The families the kernel forwards itself, by input link.
    pub fn kernel_forwards(&self) -> Arc<Vec<(LinkIndex, u8)>> {
        self.kernel_forwards.load_full()
    }

    /// Makes `g` the express path's current generation (if it runs), unless the
    /// firewall closes a family: then [`Generation::RETIRED`].
    pub fn publish_generation(&self, g: Generation) -> io::Result<()> {
        let express = self.express();
        let Some(x) = &*express else { return Ok(()) };
        if express_closed(self.closed.load(Ordering::SeqCst)) != 0 {
            x.set_generation(Generation::RETIRED)
        } else {
            x.set_generation(g)
        }
    }

    /// The express path the workers feed, to read or set.
    pub fn express(&self) -> std::sync::MutexGuard<'_, Option<Arc<Express>>> {
        self.express
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The counters, to read or add to. A worker that failed while it held them left
    /// them whole (each addition is), so a poisoned lock is taken all the same.
    pub fn counters(&self) -> std::sync::MutexGuard<'_, Counters> {
        self.counters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Asks the kernel to resolve a neighbour (the daemon's netlink socket does it).
pub type Resolve = Box<dyn FnMut(u32, IpAddr) -> io::Result<()> + Send>;

/// How a worker reaches its links.
pub(crate) enum Ports {
    /// A packet socket per link to read; one per output link to send from, opened at
    /// its first frame (`None`: it could not be).
    Packet {
        rx: Vec<ReceiveRing>,
        senders: HashMap<LinkIndex, Option<PacketSocket>>,
    },
    /// An AF_XDP socket per link, sharing the worker's pool; and a receive ring per link
    /// for what the link's XDP program passed to the kernel (the kernel has each of
    /// those frames too). The rings drop first: should the worker fail, they leave their
    /// fanout groups at once, and the other workers' rings take their frames, while the
    /// sockets take their time to close (each waits out an RCU grace period).
    Xdp {
        passed: Vec<ReceiveRing>,
        xsk: XskPorts,
    },
}

impl Ports {
    /// The ways in: over AF_XDP, each link's socket, then each link's ring.
    fn len(&self) -> usize {
        match self {
            Ports::Packet { rx, .. } => rx.len(),
            Ports::Xdp { xsk, passed } => xsk.len() + passed.len(),
        }
    }

    fn fd(&self, k: usize) -> RawFd {
        match self {
            Ports::Packet { rx, .. } => rx[k].as_raw_fd(),
            Ports::Xdp { xsk, .. } if k < xsk.len() => xsk.fd(k),
            Ports::Xdp { xsk, passed } => passed[k - xsk.len()].as_raw_fd(),
        }
    }

    fn ifindex(&self, k: usize) -> u32 {
        match self {
            Ports::Packet { rx, .. } => rx[k].ifindex(),
            Ports::Xdp { xsk, .. } if k < xsk.len() => xsk.ifindex(k),
            Ports::Xdp { xsk, passed } => passed[k - xsk.len()].ifindex(),
        }
    }

    /// Whether the kernel has its own copy of the frames that come in by way `k` (so a
    /// packet for it needs nothing more): every frame read from a ring.
    fn kernel_has_its_copy(&self, k: usize) -> bool {
        match self {
            Ports::Packet { .. } => true,
            Ports::Xdp { xsk, .. } => k >= xsk.len(),
        }
    }

    /// Up to 256 frames from link `k`, appended to `ids`; how many.
    fn receive(
        &mut self,
        k: usize,
        pool: &mut Pool,
        ids: &mut Vec<BufferId>,
        io: &mut Io,
    ) -> usize {
        let ring = match self {
            Ports::Packet { rx, .. } => &mut rx[k],
            Ports::Xdp { xsk, .. } if k < xsk.len() => return xsk.receive(k, pool, 256, ids),
            Ports::Xdp { xsk, passed } => &mut passed[k - xsk.len()],
        };
        let n = ring.receive(pool, 256, ids);
        io.truncated += ring.take_truncated();
        io.bad_descriptors += ring.take_bad_blocks();
        io.refused_offloads += ring.take_refused_offloads();
        io.segmented += ring.take_segmented();
        n
    }

    /// Sends `frames` out of `link`; returns how many went, and how many were to go
    /// (segments count one each). Every buffer is dealt with: given back, or lent to the
    /// kernel until it is sent.
    fn send(
        &mut self,
        link: LinkIndex,
        pool: &mut Pool,
        batch: &mut Batch,
        frames: &mut Vec<BufferId>,
        io: &mut Io,
    ) -> (usize, usize) {
        if let Ports::Xdp { .. } = self {
            finish_offloads(pool, frames, io);
        }
        let went = match self {
            Ports::Packet { senders, .. } => {
                let sender = senders
                    .entry(link)
                    .or_insert_with(|| PacketSocket::open_for_sending(link).ok());
                let went = match sender {
                    Some(s) => s.send(pool, frames, batch).unwrap_or(0),
                    None => 0,
                };
                pool.free(frames);
                went
            }
            Ports::Xdp { xsk, .. } => xsk.send(link, pool, frames),
        };
        (went, frames.len())
    }

    /// AF_XDP's upkeep between vectors: buffers sent are taken back, the fill rings
    /// topped up, the transmit rings flushed.
    fn service(&mut self, pool: &mut Pool, io: &mut Io) {
        if let Ports::Xdp { xsk, .. } = self {
            xsk.complete(pool);
            xsk.fill(pool);
            xsk.flush();
            io.bad_descriptors += std::mem::take(&mut xsk.bad_descriptors);
        }
    }
}

/// Does what the frames of `frames` left undone, for a way out that carries no
/// virtio-net header (AF_XDP): a packet left whole is cut into its segments (which
/// take its place in `frames`, in order), a partial checksum finished. A packet that
/// cannot be cut is dropped, its buffer given back, and counted.
fn finish_offloads(pool: &mut Pool, frames: &mut Vec<BufferId>, io: &mut Io) {
    if frames.iter().all(|&id| pool.offload(id).is_none()) {
        return;
    }
    let mut out = Vec::with_capacity(frames.len());
    for &id in frames.iter() {
        let offload = pool.offload(id);
        if offload.gso.is_some() {
            match segment::segment(pool, id, &mut out) {
                Ok(_) => io.segmented += 1,
                Err(_) => {
                    io.segment_failed += 1;
                    pool.free(&[id]);
                }
            }
            continue;
        }
        if let Some(c) = offload.checksum {
            finish_checksum(pool.frame_mut(id), c);
            pool.set_offload(id, Offload::NONE);
            io.checksums_finished += 1;
        }
        out.push(id);
    }
    *frames = out;
}

/// What a worker's vectors run with: made once, reused.
struct Vector {
    /// Before the pool, so that it drops first: AF_XDP sockets lend the pool's buffers
    /// to the kernel until they close.
    ports: Ports,
    pool: Pool,
    pipeline: Pipeline,
    /// The system calls' headers, for AF_PACKET.
    batch: Batch,
    io: Io,
    fates: Vec<Fate>,
    /// Buffers to send, by output link.
    out: Output,
    /// Buffers to give back.
    free: Vec<BufferId>,
    /// The express path to teach, if one runs.
    express: Option<Learner>,
    /// The map of replies claimed from the kernel, if the links have its program.
    claims: Option<Arc<Claims>>,
    /// The families the firewall closes ([`Shared::closed`]), as read for this vector.
    closed: u8,
    /// The families the kernel forwards itself, by input link
    /// ([`Shared::kernel_forwards`]), as read for this round.
    kernel_forwards: Arc<Vec<(LinkIndex, u8)>>,
    /// The workers' mailboxes.
    mailboxes: Arc<Vec<Mailbox>>,
    /// The packets for each worker, handed over at the end of the vector.
    handing: Vec<Handing>,
    /// The times the vector's packets were handed over before (0: read from a link).
    hops: u8,
}

/// What a worker teaches the express path: for each destination it forwarded, arriving
/// on a link, whose hop its destination decides alone (`Snapshot::hop_by_destination`),
/// the output link and the MAC addresses it wrote; each once per generation.
struct Learner {
    express: Arc<Express>,
    generation: Option<Generation>,
    taught: HashSet<(u32, IpAddr)>,
}

impl Learner {
    /// Teaches what `frame` (as sent out of `out`, having arrived on `input`) says, if
    /// its destination's hop is decided by it alone under `g`.
    fn learn(
        &mut self,
        snap: &fibre_fib::Snapshot,
        g: Generation,
        input: u32,
        out: u32,
        frame: &[u8],
        io: &mut Io,
    ) {
        if self.generation != Some(g) {
            self.generation = Some(g);
            self.taught.clear();
        }
        let dst = match frame.get(12..14) {
            Some([0x08, 0x00]) => frame
                .get(30..34)
                .map(|a| IpAddr::from(<[u8; 4]>::try_from(a).expect("four bytes"))),
            Some([0x86, 0xdd]) => frame
                .get(38..54)
                .map(|a| IpAddr::from(<[u8; 16]>::try_from(a).expect("sixteen bytes"))),
            _ => None,
        };
        let Some(dst) = dst else { return };
        if self.taught.contains(&(input, dst))
            || snap
                .hop_by_destination(input, dst)
                .is_none_or(|hop| hop.dev != out)
        {
            return;
        }
        // A worker's table of what it taught stays bounded: past the map's room the
        // least recently used entries leave the map anyway.
        if self.taught.len() >= EXPRESS_DESTINATIONS as usize {
            self.taught.clear();
        }
        self.taught.insert((input, dst));
        let mut dst_mac = [0; 6];
        let mut src_mac = [0; 6];
        dst_mac.copy_from_slice(&frame[..6]);
        src_mac.copy_from_slice(&frame[6..12]);
        let entry = Entry {
            out,
            dst_mac,
            src_mac,
        };
        match self.express.learn(input, dst, entry, g) {
            Ok(()) => io.express_taught += 1,
            Err(_) => io.express_failed += 1,
        }
    }
}

impl Vector {
    /// Runs the pipeline over `ids` (arrived on `arrival`; the kernel has its own copy of
    /// each if `kernel_has_its_copy`), sends what it sends, keeps waiting what waits for
    /// a neighbour (since `since`), frees the rest.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        snap: &fibre_fib::Snapshot,
        neighbours: &Arc<NeighbourMacs>,
        arrival: Arrival,
        kernel_has_its_copy: bool,
        ids: &[BufferId],
        since: Instant,
        waiting: &mut Waiting,
    ) {
        self.fates.clear();
        // Frames of translated connections are claimed from the kernel's stack, but
        // where the kernel forwards what arrives on this link itself (its copy).
        self.pipeline.claims = self.claims.clone();
        self.pipeline.claiming = !(kernel_has_its_copy
            && self
                .kernel_forwards
                .iter()
                .any(|(l, f)| *l == arrival.link && *f != 0));
        // The kernel answers an IPv6 reject route itself (forwarding on or off) when it
        // sees the frame; when it does not, fibre answers.
        self.pipeline.kernel_answers_ipv6_rejects = kernel_has_its_copy;
        self.pipeline.kernel_rejects_at_prerouting = kernel_has_its_copy;
        self.pipeline.run(
            snap,
            &**neighbours,
            arrival,
            &mut self.pool,
            ids,
            &mut self.fates,
        );
        let t = Instant::now();
        self.free.clear();
        // Each packet's later fragments follow its first, in order.
        let mut later = self.pipeline.fragments.iter().peekable();
        let generation = Generation {
            snapshot: snap.serial(),
            neighbours: neighbours.version,
        };
        let forwarded_by_kernel = self
            .kernel_forwards
            .iter()
            .find(|(l, _)| *l == arrival.link)
            .map_or(0, |(_, f)| *f);
        for (i, (&id, fate)) in ids.iter().zip(self.fates.iter()).enumerate() {
            // What the kernel forwards itself, from its own copy, is left to it (its
            // firewall applies); a destination decided still teaches the express path.
            if kernel_has_its_copy
                && forwarded_by_kernel != 0
                && (fate.output().is_some() || *fate == Fate::Kernel(Handed::Unresolved))
                && in_families(forwarded_by_kernel, self.pool.frame(id), false)
            {
                if let (Fate::Out(link), Some(learner)) = (fate, &mut self.express) {
                    let frame = self.pool.frame(id);
                    if !in_families(express_closed(self.closed), frame, false) {
                        learner.learn(snap, generation, arrival.link, *link, frame, &mut self.io);
                    }
                }
                self.io.left_to_kernel += 1;
                self.free.push(id);
                while let Some(&(_, f)) = later.next_if(|f| f.0 == i) {
                    self.free.push(f);
                }
                continue;
            }
            if self.closed != 0
                && fate.output().is_some()
                && in_families(
                    self.closed,
                    self.pool.frame(id),
                    matches!(fate, Fate::Icmp(..) | Fate::Reset(_)),
                )
            {
                self.io.firewall_refused += 1;
                self.free.push(id);
                while let Some(&(_, f)) = later.next_if(|f| f.0 == i) {
                    self.free.push(f);
                }
                continue;
            }
            match fate {
                Fate::Out(link) => {
                    if let Some(learner) = &mut self.express {
                        let frame = self.pool.frame(id);
                        if !in_families(express_closed(self.closed), frame, false) {
                            learner.learn(
                                snap,
                                generation,
                                arrival.link,
                                *link,
                                frame,
                                &mut self.io,
                            );
                        }
                    }
                    self.out.push(*link, id)
                }
                Fate::Icmp(_, link) | Fate::Reset(link) => self.out.push(*link, id),
                Fate::Fragmented(link) => {
                    self.out.push(*link, id);
                    while let Some(&(_, f)) = later.next_if(|f| f.0 == i) {
                        self.out.push(*link, f);
                    }
                }
                Fate::Handoff(w) => {
                    match self.handing.get_mut(usize::from(*w)) {
                        Some(batch) if self.hops < HOPS => {
                            batch.push(&self.pool, id, arrival, kernel_has_its_copy, self.hops + 1)
                        }
                        _ => self.io.handoff_dropped += 1,
                    }
                    self.free.push(id);
                }
                Fate::Kernel(Handed::Unresolved) if waiting.packets.len() < WAITING_MAX => {
                    waiting
                        .packets
                        .push((id, arrival, kernel_has_its_copy, since));
                    waiting.seen = Some(neighbours.clone());
                }
                Fate::Kernel(Handed::Unresolved) => {
                    self.io.unresolved_dropped += 1;
                    self.free.push(id);
                }
                Fate::Kernel(_) if !kernel_has_its_copy => {
                    self.io.kernel_unreached += 1;
                    self.free.push(id);
                }
                _ => self.free.push(id),
            }
        }
        self.io.claimed += std::mem::take(&mut self.pipeline.claimed);
        self.io.claims_failed += std::mem::take(&mut self.pipeline.claims_failed);
        // Fragments of no packet cut (none, as the pipeline makes them) go back.
        self.free.extend(later.map(|f| f.1));
        let out = self.out.len();
        for (link, frames) in self.out.queues() {
            if frames.is_empty() {
                continue;
            }
            let (went, of) =
                self.ports
                    .send(link, &mut self.pool, &mut self.batch, frames, &mut self.io);
            self.io.sent += went as u64;
            self.io.send_failed += (of - went) as u64;
            frames.clear();
        }
        self.pool.free(&self.free);
        for (w, batch) in self.handing.iter_mut().enumerate() {
            if batch.is_empty() {
                continue;
            }
            let n = batch.len() as u64;
            // (Posted or not, the batch is left empty.)
            match self.mailboxes.get(w) {
                Some(m) if m.post(batch) => self.io.handed_off += n,
                Some(_) => self.io.handoff_dropped += n,
                None => {
                    *batch = Handing::default();
                    self.io.handoff_dropped += n;
                }
            }
        }
        self.pipeline.output.add(out, t);
    }
}

/// The families (bit 0 IPv4, bit 1 IPv6) closed to the express path by `closed` (as
/// [`Shared::closed`] has them): those closed to fibre, and those it filters.
fn express_closed(closed: u8) -> u8 {
    (closed | closed >> 4) & 3
}

/// Whether a frame to send (Ethernet, no VLAN tag: those go to the kernel) is of a
/// family `families` holds (bit 0 IPv4, bit 1 IPv6, as [`Shared::closed`] has them);
/// for an ICMP error fibre made (`error`), of one whose errors it holds (bits 2, 3).
fn in_families(families: u8, frame: &[u8], error: bool) -> bool {
    let bit = match frame.get(12..14) {
        Some([0x08, 0x00]) => 1,
        Some([0x86, 0xdd]) => 2,
        // Neither: nothing fibre forwards, refused all the same.
        _ => 3,
    };
    let families = if error {
        families | families >> 2
    } else {
        families
    };
    families & bit != 0
}

/// Asks the kernel for the next hops of `unresolved`, each at most once a second.
fn ask(
    unresolved: &[(LinkIndex, IpAddr)],
    asked: &mut HashMap<(LinkIndex, IpAddr), Instant>,
    resolve: &mut Resolve,
    io: &mut Io,
) {
    let now = Instant::now();
    for &(link, addr) in unresolved {
        let last = asked
            .entry((link, addr))
            .or_insert(now - Duration::from_secs(2));
        if now.duration_since(*last) >= Duration::from_secs(1) {
            *last = now;
            io.resolve_requests += 1;
            let _ = resolve(link, addr);
        }
    }
}

/// A worker's loop, until `shared.stop` is set (or the worker is asked to fail, as
/// [`Shared::fail`] says).
pub(crate) fn run(shared: &Shared, n: usize, ports: Ports, pool: Pool, mut resolve: Resolve) {
    let mut pipeline = Pipeline::new();
    pipeline.limit = RateLimit::sharing(&shared.icmp_limits, shared.icmp_overall.clone());
    let tables = shared.tables();
    pipeline.conntrack = Some(tables[n.min(tables.len() - 1)].clone());
    let mailboxes = shared.mailboxes();
    pipeline.mailboxes = Some(mailboxes.clone());
    pipeline.hops = shared.hops.clone();
    let mut v = Vector {
        ports,
        pool,
        pipeline,
        batch: Batch::new(),
        io: Io::default(),
        fates: Vec::with_capacity(256),
        out: Output::default(),
        free: Vec::with_capacity(256),
        claims: shared
            .claims
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone(),
        express: shared.express().clone().map(|express| Learner {
            express,
            generation: None,
            taught: HashSet::new(),
        }),
        closed: 0,
        kernel_forwards: Arc::default(),
        handing: (0..mailboxes.len()).map(|_| Handing::default()).collect(),
        hops: 0,
        mailboxes,
    };
    let mut ids: Vec<BufferId> = Vec::with_capacity(256);
    let mut asked: HashMap<(LinkIndex, IpAddr), Instant> = HashMap::new();
    let mut fds: Vec<RawFd> = (0..v.ports.len()).map(|k| v.ports.fd(k)).collect();
    let all: Vec<usize> = (0..v.ports.len()).collect();
    // Its mailbox wakes it too: the last way in polled.
    let mailbox = v.mailboxes.get(n).map(|m| m.fd());
    fds.extend(mailbox);
    let mut handed: Vec<Handing> = Vec::new();
    // Whether the last round read any frame: then the next reads every way in again at
    // once; else the worker sleeps until one is readable (or for housekeeping, 10 ms).
    // It never spins: the kernel's side that feeds its sockets (the link's NAPI, which
    // may share its CPU) needs the CPU meanwhile, and an idle router stays idle.
    let mut busy = false;
    // Since when every round has found frames: a worker at real-time priority that
    // never sleeps never lets its CPU pass through a quiescent state, and the kernel's
    // read-copy-update grace periods (which deleting a link waits for, under the
    // routing lock) stall while it runs. So a long busy spell ends in a short sleep.
    let mut busy_since: Option<Instant> = None;
    let mut waiting = Waiting::default();
    let mut again: Vec<(BufferId, Arrival, bool, Instant)> = Vec::new();
    let mut added = Instant::now();
    let mut xsk_seen = XskStatistics::default();
    while !shared.stop.load(Ordering::Relaxed) {
        v.ports.service(&mut v.pool, &mut v.io);
        let polled = !busy;
        let ready = if busy {
            all.clone()
        } else {
            wait_any(&fds, Duration::from_millis(10)).unwrap_or_default()
        };
        // Read once awake, for the frames of this round: what the firewall closed while
        // the worker slept holds for them.
        let enforced = shared.enforced();
        v.closed = enforced.closed;
        v.pipeline.rules = enforced.filter.clone();
        v.pipeline.tracked = enforced.tracked;
        v.kernel_forwards = shared.kernel_forwards();
        busy = false;
        // Packets waiting for a neighbour: again through the pipeline once the table
        // changed, before what came after them; dropped once they waited long enough.
        if !waiting.packets.is_empty() {
            let neighbours = shared.neighbours.load();
            let changed = !waiting
                .seen
                .as_ref()
                .is_some_and(|s| Arc::ptr_eq(s, &neighbours));
            let now = Instant::now();
            let (stale, kept): (Vec<_>, Vec<_>) = waiting
                .packets
                .drain(..)
                .partition(|(_, _, _, since)| now.duration_since(*since) >= WAIT_FOR);
            for (id, _, _, _) in stale {
                v.pool.free(&[id]);
                v.io.unresolved_dropped += 1;
            }
            if changed {
                again.clear();
                again.extend(kept);
                let snap = shared.fib.snapshot();
                while let Some(&(_, arrival, copy, _)) = again.first() {
                    let alike =
                        |w: &(BufferId, Arrival, bool, Instant)| w.1 == arrival && w.2 == copy;
                    let group: Vec<_> = again.iter().filter(|w| alike(w)).copied().collect();
                    again.retain(|w| !alike(w));
                    for chunk in group.chunks(256) {
                        ids.clear();
                        ids.extend(chunk.iter().map(|w| w.0));
                        let since = chunk.iter().map(|w| w.3).min().unwrap_or(now);
                        v.run(&snap, &neighbours, arrival, copy, &ids, since, &mut waiting);
                    }
                }
                waiting.seen = Some(neighbours);
            } else {
                waiting.packets.extend(kept);
            }
        }
        // Packets other workers handed it: before its own links' next, which came after.
        // (The wake-up is read only when poll found it: a busy worker does not pay a
        // system call a round for it.)
        if let Some(m) = v.mailboxes.get(n) {
            let woken = polled && mailbox.is_some() && ready.contains(&(fds.len() - 1));
            m.drain(woken, |b| handed.push(b));
        }
        if !handed.is_empty() {
            busy = true;
            let snap = shared.fib.snapshot();
            let neighbours = shared.neighbours.load();
            let mut groups = Vec::new();
            for batch in handed.drain(..) {
                v.io.handoff_dropped += batch.unpack(&mut v.pool, &mut groups) as u64;
                if let Some(m) = v.mailboxes.get(n) {
                    m.give_back(batch);
                }
                for (arrival, copy, hops, ids) in groups.drain(..) {
                    v.hops = hops;
                    v.run(
                        &snap,
                        &neighbours,
                        arrival,
                        copy,
                        &ids,
                        Instant::now(),
                        &mut waiting,
                    );
                    v.hops = 0;
                    ask(&v.pipeline.unresolved, &mut asked, &mut resolve, &mut v.io);
                }
            }
        }
        // Ways in poll said were ready (not those read again after a busy round).
        // (The mailbox's wake-up is not one of them: one left from batches taken while
        // the worker was busy is read above and wakes nothing more.)
        let woken = if polled {
            ready.iter().filter(|&&k| k < v.ports.len()).count()
        } else {
            0
        };
        for k in ready {
            if k >= v.ports.len() {
                continue;
            }
            // A few vectors from one link, then the next: no link starves the others.
            for _ in 0..4 {
                ids.clear();
                let t = Instant::now();
                let n = v.ports.receive(k, &mut v.pool, &mut ids, &mut v.io);
                if n == 0 {
                    break;
                }
                v.pipeline.receive.add(n, t);
                v.io.received += n as u64;
                busy = true;
                let snap = shared.fib.snapshot();
                let link = v.ports.ifindex(k);
                let Some(mac) = snap.link(link).map(|l| l.mac) else {
                    v.pool.free(&ids);
                    continue;
                };
                let arrival = Arrival { link, mac };
                let copy = v.ports.kernel_has_its_copy(k);
                v.run(
                    &snap,
                    &shared.neighbours.load(),
                    arrival,
                    copy,
                    &ids,
                    Instant::now(),
                    &mut waiting,
                );
                drop(snap);
                ask(&v.pipeline.unresolved, &mut asked, &mut resolve, &mut v.io);
                if n < 256 {
                    break;
                }
            }
        }
        match (busy, busy_since) {
            // Ways in that said they were ready and gave nothing (an error, a link going
            // away): not a reason to spin.
            (false, _) if woken > 0 => {
                busy_since = None;
                std::thread::sleep(Duration::from_millis(1));
            }
            (false, _) => busy_since = None,
            (true, None) => busy_since = Some(Instant::now()),
            (true, Some(since)) if since.elapsed() >= BUSY_SPELL => {
                std::thread::sleep(BUSY_PAUSE);
                busy_since = None;
            }
            _ => {}
        }
        // Asked to fail: after the frames just read, as a fault in the next round would.
        if shared.fail.load(Ordering::Relaxed) == n {
            shared.fail.store(usize::MAX, Ordering::Relaxed);
            panic!("worker {n} was asked to fail");
        }
        if added.elapsed() >= Duration::from_millis(100) {
            added = Instant::now();
            // Connections whose time is up are swept here too, so that a worker whose
            // packets meet few of its connections still frees their room (counted with
            // every table's against `nf_conntrack_max`).
            // And what the other tables told this one is taken, what it is to tell them
            // told, however few packets it reads.
            if let Some(table) = &v.pipeline.conntrack {
                if let Ok(mut t) = table.try_lock() {
                    if let Some(m) = v.mailboxes.get(n) {
                        m.take_forwards(|f| t.forward(f));
                    }
                    t.expire(shared.icmp_overall.now(), SWEEP);
                    let mut told = Vec::new();
                    t.drain_outbox(&mut told);
                    for (to, f) in told {
                        if let Some(m) = v.mailboxes.get(usize::from(to)) {
                            m.tell(f);
                        }
                    }
                }
            }
            let rings = match &v.ports {
                Ports::Packet { rx, .. } => rx,
                Ports::Xdp { passed, .. } => passed,
            };
            for ring in rings {
                v.io.ring_dropped += ring.statistics().map_or(0, |s| s.dropped);
            }
            if let Ports::Xdp { xsk, .. } = &v.ports {
                let now = xsk.statistics();
                v.io.xsk = XskStatistics {
                    rx_dropped: now.rx_dropped - xsk_seen.rx_dropped,
                    rx_ring_full: now.rx_ring_full - xsk_seen.rx_ring_full,
                    fill_ring_empty: now.fill_ring_empty - xsk_seen.fill_ring_empty,
                    invalid_descriptors: now.invalid_descriptors - xsk_seen.invalid_descriptors,
                };
                xsk_seen = now;
            }
            if asked.len() > 4096 {
                asked.retain(|_, t| t.elapsed() < Duration::from_secs(1));
            }
            shared.counters().add(&mut v.pipeline, &mut v.io);
        }
    }
    shared.counters().add(&mut v.pipeline, &mut v.io);
}

/// `m` held, whatever a thread that failed holding it left: a table's connections are
/// whole between any two of its calls.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
