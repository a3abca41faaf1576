//! Forwarding workers: threads, each pinned to a core, that take vectors of frames from
//! the forwarded links, run them through the pipeline with the FIB's current snapshot and
//! the current neighbour table, and send what the pipeline sends.
//!
//! Every worker reads every forwarded link: each link's sockets are joined in one
//! `PACKET_FANOUT` group hashed by flow, so that the kernel spreads the link's flows over
//! the workers and a flow's packets stay in order on one. The FIB snapshot and the
//! neighbour table are taken once per vector, without a lock. A next hop with no MAC
//! address is asked of the kernel (`NTF_USE`, at most once a second each), which
//! resolves it and announces it, and the mirror publishes it; meanwhile its packets wait,
//! as the kernel queues packets for a neighbour it resolves (up to 64 a next hop, 256 a
//! worker, 3 seconds), and go through the pipeline again when the table changes. (The
//! kernel sees every frame a link receives too, and drops those it does not forward.)
//! What each worker counted is added to the shared counters every tenth of a
//! second, so that no packet takes a lock.

use crate::packet::{wait_any, Batch, PacketSocket};
use crate::pipeline::{
    address_bits, Arrival, Fate, Handed, Neighbours, Output, Pipeline, Unanswered,
};
use crate::pool::{BufferId, Pool};
use crate::runtime::StageCounters;
use arc_swap::ArcSwap;
use fibre_fib::{FibReader, LinkIndex};
use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
        for s in p.stages_mut() {
            *s = StageCounters::default();
        }
        self.received += std::mem::take(&mut io.received);
        self.sent += std::mem::take(&mut io.sent);
        self.send_failed += std::mem::take(&mut io.send_failed);
        self.resolve_requests += std::mem::take(&mut io.resolve_requests);
        self.unresolved_dropped += std::mem::take(&mut io.unresolved_dropped);
        self.truncated += std::mem::take(&mut io.truncated);
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
}

/// Packets waiting for their next hop's MAC address: each its buffer, the link it came
/// in on, when it started waiting.
#[derive(Default)]
struct Waiting {
    packets: Vec<(BufferId, Arrival, Instant)>,
    /// The neighbour table they last went through the pipeline with.
    seen: Option<Arc<NeighbourMacs>>,
}

/// Packets a worker holds waiting at most.
const WAITING_MAX: usize = 256;
/// How long a packet waits for its neighbour.
const WAIT_FOR: Duration = Duration::from_secs(3);
/// How long a worker keeps reading its links without sleeping once frames stop coming:
/// a worker put to sleep and woken for every few frames spends more on the two than
/// on the frames, so while traffic flows it reads on, as NAPI's busy polling does.
const SPIN_FOR: Duration = Duration::from_micros(200);

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
}

/// Asks the kernel to resolve a neighbour (the daemon's netlink socket does it).
pub type Resolve = Box<dyn FnMut(u32, IpAddr) -> io::Result<()> + Send>;

/// Starts `workers` workers on links `links` (interface indexes), the n-th pinned to the
/// n-th core if the system has it; `resolver` makes each worker's way to ask the kernel
/// for neighbours. Sockets are opened before this returns, so that a link that cannot be
/// opened is an error here; the workers run until `shared.stop` is set.
pub fn start(
    shared: Arc<Shared>,
    links: &[u32],
    workers: usize,
    mut resolver: impl FnMut() -> io::Result<Resolve>,
) -> io::Result<Vec<std::thread::JoinHandle<()>>> {
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    // Room in a buffer for the largest frame a forwarded link takes.
    let snap = shared.fib.snapshot();
    let mtu = links
        .iter()
        .filter_map(|&l| snap.link(l).map(|l| l.mtu as usize))
        .max()
        .unwrap_or(1500);
    drop(snap);
    let buffer = (mtu + 18).max(2048);
    let mut handles = Vec::new();
    let mut all = Vec::new();
    for _ in 0..workers.max(1) {
        let mut ports = Vec::new();
        for &ifindex in links {
            let rx = PacketSocket::open(ifindex)?;
            if workers > 1 {
                rx.join_fanout(ifindex as u16)?;
            }
            ports.push(rx);
        }
        all.push((ports, resolver()?));
    }
    for (n, (ports, resolve)) in all.into_iter().enumerate() {
        let shared = shared.clone();
        let core = cores.get(n % cores.len().max(1)).copied();
        handles.push(
            std::thread::Builder::new()
                .name(format!("fibre-worker-{n}"))
                .spawn(move || {
                    if let Some(core) = core {
                        core_affinity::set_for_current(core);
                    }
                    run(&shared, ports, resolve, buffer);
                })?,
        );
    }
    Ok(handles)
}

/// What a worker's vectors run with: made once, reused.
struct Vector {
    pool: Pool,
    pipeline: Pipeline,
    batch: Batch,
    io: Io,
    fates: Vec<Fate>,
    /// Buffers to send, by output link.
    out: Output,
    /// A sending socket per output link, opened at its first frame (`None`: it could
    /// not be).
    senders: HashMap<LinkIndex, Option<PacketSocket>>,
    /// Buffers to give back.
    free: Vec<BufferId>,
}

impl Vector {
    /// Runs the pipeline over `ids` (arrived on `arrival`), sends what it sends, keeps
    /// waiting what waits for a neighbour (since `since`), frees the rest.
    fn run(
        &mut self,
        snap: &fibre_fib::Snapshot,
        neighbours: &Arc<NeighbourMacs>,
        arrival: Arrival,
        ids: &[BufferId],
        since: Instant,
        waiting: &mut Waiting,
    ) {
        self.fates.clear();
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
        for (&id, fate) in ids.iter().zip(self.fates.iter()) {
            match fate.output() {
                Some(link) => self.out.push(link, id),
                None if *fate == Fate::Kernel(Handed::Unresolved)
                    && waiting.packets.len() < WAITING_MAX =>
                {
                    waiting.packets.push((id, arrival, since));
                    waiting.seen = Some(neighbours.clone());
                }
                None => {
                    if *fate == Fate::Kernel(Handed::Unresolved) {
                        self.io.unresolved_dropped += 1;
                    }
                    self.free.push(id);
                }
            }
        }
        let out = self.out.len();
        for (link, frames) in self.out.queues() {
            if frames.is_empty() {
                continue;
            }
            let sender = self
                .senders
                .entry(link)
                .or_insert_with(|| PacketSocket::open_for_sending(link).ok());
            let went = match sender {
                Some(s) => s.send(&mut self.pool, frames, &mut self.batch).unwrap_or(0),
                None => 0,
            };
            self.io.sent += went as u64;
            self.io.send_failed += (frames.len() - went) as u64;
            self.pool.free(frames);
            frames.clear();
        }
        self.pool.free(&self.free);
        self.pipeline.output.add(out, t);
    }
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

/// A worker's loop.
fn run(shared: &Shared, ports: Vec<PacketSocket>, mut resolve: Resolve, buffer: usize) {
    let mut pipeline = Pipeline::new();
    pipeline.kernel_answers_ipv6_rejects = true;
    let mut v = Vector {
        pool: Pool::new(1024, buffer),
        pipeline,
        batch: Batch::new(),
        io: Io::default(),
        fates: Vec::with_capacity(256),
        out: Output::default(),
        senders: HashMap::new(),
        free: Vec::with_capacity(256),
    };
    let mut ids: Vec<BufferId> = Vec::with_capacity(256);
    let mut asked: HashMap<(LinkIndex, IpAddr), Instant> = HashMap::new();
    let fds: Vec<i32> = ports.iter().map(|p| p.as_raw_fd()).collect();
    let all: Vec<usize> = (0..ports.len()).collect();
    let mut last_frame = Instant::now() - SPIN_FOR;
    let mut waiting = Waiting::default();
    let mut again: Vec<(BufferId, Arrival, Instant)> = Vec::new();
    let mut added = Instant::now();
    while !shared.stop.load(Ordering::Relaxed) {
        let ready = if last_frame.elapsed() < SPIN_FOR {
            all.clone()
        } else {
            wait_any(&fds, Duration::from_millis(10)).unwrap_or_default()
        };
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
                .partition(|(_, _, since)| now.duration_since(*since) >= WAIT_FOR);
            for (id, _, _) in stale {
                v.pool.free(&[id]);
                v.io.unresolved_dropped += 1;
            }
            if changed {
                again.clear();
                again.extend(kept);
                let snap = shared.fib.snapshot();
                while let Some(&(_, arrival, _)) = again.first() {
                    let group: Vec<_> = again.iter().filter(|w| w.1 == arrival).copied().collect();
                    again.retain(|w| w.1 != arrival);
                    for chunk in group.chunks(256) {
                        ids.clear();
                        ids.extend(chunk.iter().map(|w| w.0));
                        let since = chunk.iter().map(|w| w.2).min().unwrap_or(now);
                        v.run(&snap, &neighbours, arrival, &ids, since, &mut waiting);
                    }
                }
                waiting.seen = Some(neighbours);
            } else {
                waiting.packets.extend(kept);
            }
        }
        for k in ready {
            let port = &ports[k];
            // A few vectors from one link, then the next: no link starves the others.
            for _ in 0..4 {
                ids.clear();
                let t = Instant::now();
                let n = port
                    .receive(&mut v.pool, 256, &mut v.batch, &mut ids)
                    .unwrap_or(0);
                v.io.truncated += port.take_truncated();
                if n == 0 {
                    break;
                }
                v.pipeline.receive.add(n, t);
                v.io.received += n as u64;
                last_frame = Instant::now();
                let snap = shared.fib.snapshot();
                let link = port.ifindex();
                let Some(mac) = snap.link(link).map(|l| l.mac) else {
                    v.pool.free(&ids);
                    continue;
                };
                let arrival = Arrival { link, mac };
                v.run(
                    &snap,
                    &shared.neighbours.load(),
                    arrival,
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
        if added.elapsed() >= Duration::from_millis(100) {
            added = Instant::now();
            if asked.len() > 4096 {
                asked.retain(|_, t| t.elapsed() < Duration::from_secs(1));
            }
            if let Ok(mut c) = shared.counters.lock() {
                c.add(&mut v.pipeline, &mut v.io);
            }
        }
    }
    if let Ok(mut c) = shared.counters.lock() {
        c.add(&mut v.pipeline, &mut v.io);
    }
}
