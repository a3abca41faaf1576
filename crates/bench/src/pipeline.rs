//! The pipeline study (`fibre bench pipeline`): what fibre's packet path costs a packet,
//! stage by stage, in memory, on the full real tables.
//!
//! The router has an input link and an output link; every route of the table leaves by
//! the output link through one of `GATEWAYS` gateways, each with a neighbour entry, as
//! a router with full tables and a few peers has. A built-in generator makes the
//! shortest UDP frames to matched addresses of the table, from hosts on the input link's
//! subnet: 60 bytes for IPv4 (64 on the wire with the frame check sequence), 62 for IPv6
//! (66 on the wire, the shortest an IPv6 UDP frame can be). Flows that the router would
//! not forward (a destination that the local table or a link's subnet answers) are left
//! out before measuring, and every measured packet must leave by the output link, or
//! the run fails: what is measured is the forwarding path.
//!
//! Each thread runs its own [`Pipeline`] over vectors of frames taken from its own
//! [`Pool`], as a worker does:
//!
//! - **receive**: buffers taken from the pool in bulk and each frame copied into one (this
//!   stands for the socket or the NIC: a receive system call copies the frame into the
//!   buffer the same way);
//! - **input, route, neighbour, rewrite**: the pipeline's stages, as the daemon runs them;
//! - **output**: the frames sorted by output link ([`Output`]) and their buffers given
//!   back in bulk, as after a send (the system call itself is not made: that is the
//!   veth study's part).
//!
//! Every stage times itself once per vector (a monotonic clock read, shared by the
//! vector's packets); the wall time of the whole loop, clock reads included, over its
//! packets is the figure a packet costs. Cycles are nanoseconds at the CPU's nominal
//! frequency. The method is `crate::method`'s: repetitions, the highest and lowest
//! dropped, threads pinned one per core and started together.

use crate::addresses;
use crate::kernel::GATEWAYS;
use crate::method::{measure, Method, Stat};
use crate::studies::to_ip;
use fibre_dataplane::handoff::{Batch as HandedBatch, Group, Mailbox};
use fibre_dataplane::pipeline::{Arrival, Fate, Output, Pipeline};
use fibre_dataplane::pool::{BufferId, Pool};
use fibre_dataplane::runtime::StageCounters;
use fibre_dataplane::worker::NeighbourMacs;
use fibre_fib::{config, LinkIndex, Snapshot, State};
use fibre_firewall::Filter;
use fibre_headers::checksum;
use fibre_lpm::{Key, Prefix};
use fibre_testbed::netns::gateway;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::fmt::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The seeds' budget: a 64-byte frame at 10 Gbit/s, 14.88 million a second.
pub const BUDGET_NS: f64 = 67.2;

/// The input link's name, address and MAC address.
pub const INPUT: &str = "in0";
/// The output link's name.
pub const OUTPUT: &str = "out0";
const INPUT_MAC: [u8; 6] = [0x02, 0xf1, 0, 0, 0, 1];
const OUTPUT_MAC: [u8; 6] = [0x02, 0xf1, 0, 0, 0, 2];
const HOST_MAC: [u8; 6] = [0x02, 0xf1, 0, 0, 1, 1];
/// The input link's subnets, where the flows come from.
const INPUT_NET4: Ipv4Addr = Ipv4Addr::new(10, 199, 0, 0);
const INPUT_NET6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x199, 0, 0, 0, 0, 0, 0);

/// The stages in the order a packet goes through them, as [`Pipeline::stages`] names them.
pub const STAGES: [&str; 9] = [
    "receive",
    "input",
    "conntrack",
    "route",
    "neighbour",
    "filter",
    "rewrite",
    "icmp",
    "output",
];

/// What to run.
#[derive(Clone, Debug)]
pub struct PipelineConfig {
    /// Repetitions per measurement.
    pub repetitions: usize,
    /// Distinct flows generated per family.
    pub flows: usize,
    /// Packets each thread forwards per repetition.
    pub packets: usize,
    /// Thread counts to measure, one core each (up to the CPUs).
    pub threads: Vec<usize>,
    /// Packets per vector of the stage and thread figures.
    pub vector: usize,
    /// Vector sizes of the vector study.
    pub vectors: Vec<usize>,
    /// Buffers in each thread's pool.
    pub pool: usize,
    /// Seed of the flows.
    pub seed: u64,
    /// Numbers of filter rules (none of which a flow matches) of the filter study.
    pub filter_rules: Vec<usize>,
    /// Numbers of flows of the connections study (each its own connection).
    pub connections: Vec<usize>,
    /// The one mode of the connections study to measure (`tracked`, `masquerade`,
    /// `masquerade, 1000 rules`); all three if none.
    pub connections_mode: Option<String>,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            repetitions: 12,
            flows: 1 << 16,
            packets: 1 << 20,
            threads: vec![1],
            vector: 256,
            vectors: vec![1, 4, 16, 64, 256],
            pool: 4096,
            seed: 1,
            filter_rules: vec![0, 2, 32, 128, 1000, 10_000],
            connections: vec![1, 1_000, 100_000, 1_000_000],
            connections_mode: None,
        }
    }
}

/// The router of the study: its routes, its neighbours, the link frames arrive on.
pub struct Router {
    /// The routes.
    pub snapshot: Snapshot,
    /// The gateways' MAC addresses.
    pub neighbours: NeighbourMacs,
    /// The input link.
    pub arrival: Arrival,
    /// The output link.
    pub output: LinkIndex,
}

/// The MAC address of gateway `i`.
fn gateway_mac(i: usize) -> [u8; 6] {
    [0x02, 0xf2, 0, 0, (i >> 8) as u8, i as u8]
}

/// A MAC address as `ip` writes it.
pub(crate) fn mac_text(m: [u8; 6]) -> String {
    m.map(|b| format!("{b:02x}")).join(":")
}

impl Router {
    /// The router with `v4` and `v6` in its main tables, route `i` of a family through
    /// gateway `i mod GATEWAYS`.
    pub fn new(v4: &[Prefix<u32>], v6: &[Prefix<u128>]) -> Result<Router, String> {
        let mut state = State::new();
        let setup = format!(
            "link add {INPUT} type veth peer name {OUTPUT}
link set {INPUT} address {}
link set {OUTPUT} address {}
link set {INPUT} up
link set {OUTPUT} up
addr add 10.199.0.1/16 dev {INPUT}
addr add 10.200.0.1/16 dev {OUTPUT}
-6 addr add fd00:199::1/64 dev {INPUT} nodad
-6 addr add fd00:200::1/64 dev {OUTPUT} nodad
",
            mac_text(INPUT_MAC),
            mac_text(OUTPUT_MAC)
        );
        config::apply_text(&mut state, "router", &setup).map_err(|e| e.to_string())?;
        add_routes(&mut state, v4)?;
        add_routes(&mut state, v6)?;
        let index = |name: &str| {
            state
                .links()
                .find(|l| l.name == name)
                .map(|l| l.index)
                .ok_or_else(|| format!("no link {name}"))
        };
        let (input, output) = (index(INPUT)?, index(OUTPUT)?);
        let mut neighbours = NeighbourMacs::default();
        for i in 0..GATEWAYS {
            for family in [4, 6] {
                neighbours.insert(output, gateway(family, i), gateway_mac(i));
            }
        }
        Ok(Router {
            snapshot: state.snapshot(),
            neighbours,
            arrival: Arrival {
                link: input,
                mac: INPUT_MAC,
            },
            output,
        })
    }
}

/// Adds `routes` to `state`'s main table, through the gateways.
fn add_routes<K: Key>(state: &mut State, routes: &[Prefix<K>]) -> Result<(), String> {
    let mut lines = String::with_capacity(routes.len() * 48);
    for (i, p) in routes.iter().enumerate() {
        let _ = writeln!(
            lines,
            "{}route add {p} via {} dev {OUTPUT}",
            if K::FAMILY == 6 { "-6 " } else { "" },
            gateway(K::FAMILY, i % GATEWAYS)
        );
    }
    config::apply_text(state, &format!("IPv{} routes", K::FAMILY), &lines)
        .map_err(|e| e.to_string())
}

/// A frame of `len` zero bytes under an Ethernet header.
fn ethernet(len: usize, dst_mac: [u8; 6], src_mac: [u8; 6], ethertype: u16) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[0..6].copy_from_slice(&dst_mac);
    f[6..12].copy_from_slice(&src_mac);
    f[12..14].copy_from_slice(&ethertype.to_be_bytes());
    f
}

/// A UDP header's ports and length in `udp` (its checksum left as it is).
fn udp_header(udp: &mut [u8], ports: (u16, u16), len: u16) {
    udp[0..2].copy_from_slice(&ports.0.to_be_bytes());
    udp[2..4].copy_from_slice(&ports.1.to_be_bytes());
    udp[4..6].copy_from_slice(&len.to_be_bytes());
}

/// The shortest IPv4 UDP frame from `src` to `dst`: 60 bytes, TTL 64, its header and
/// UDP checksums right (a UDP checksum, as hosts send them, that tracking checks as
/// the kernel's conntrack does).
pub fn udp_frame_v4(
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    ports: (u16, u16),
) -> Vec<u8> {
    let mut f = ethernet(60, dst_mac, src_mac, 0x0800);
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&46u16.to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    let c = checksum::checksum(ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    udp_header(&mut f[34..42], ports, 26);
    let c = udp_checksum(&f[26..34], &f[34..60]);
    f[40..42].copy_from_slice(&c.to_be_bytes());
    f
}

/// The shortest IPv6 UDP frame from `src` to `dst`: 62 bytes, hop limit 64, the UDP
/// checksum right.
pub fn udp_frame_v6(
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    src: Ipv6Addr,
    dst: Ipv6Addr,
    ports: (u16, u16),
) -> Vec<u8> {
    let mut f = ethernet(62, dst_mac, src_mac, 0x86dd);
    let ip = &mut f[14..54];
    ip[0] = 0x60;
    ip[4..6].copy_from_slice(&8u16.to_be_bytes());
    ip[6] = 17;
    ip[7] = 64;
    ip[8..24].copy_from_slice(&src.octets());
    ip[24..40].copy_from_slice(&dst.octets());
    udp_header(&mut f[54..62], ports, 8);
    let c = udp_checksum(&f[22..54], &f[54..62]);
    f[60..62].copy_from_slice(&c.to_be_bytes());
    f
}

/// The checksum of the UDP `datagram` (its checksum field 0) under the pseudo-header
/// of `addresses` (source and destination, as they lie): its protocol and length summed
/// as the 16-bit words they are in either family's pseudo-header; 0 sent as all ones.
fn udp_checksum(addresses: &[u8], datagram: &[u8]) -> u16 {
    let mut pseudo = Vec::with_capacity(addresses.len() + 4 + datagram.len());
    pseudo.extend_from_slice(addresses);
    pseudo.extend_from_slice(&[0, 17]);
    pseudo.extend_from_slice(&(datagram.len() as u16).to_be_bytes());
    pseudo.extend_from_slice(datagram);
    match checksum::checksum(&pseudo) {
        0 => 0xffff,
        c => c,
    }
}

/// The UDP frame `f` (of [`udp_frame_v4`] or [`udp_frame_v6`]) again, a flow of
/// another connection: its source port moved by `round` steps (`round` 0 leaves it as
/// it is), the UDP checksum kept right.
pub fn other_source_port(f: &mut [u8], round: u16) {
    let at = if f[12..14] == [0x08, 0x00] { 34 } else { 54 };
    let old = u16::from_be_bytes([f[at], f[at + 1]]);
    let new = old.wrapping_add(round.wrapping_mul(7919));
    f[at..at + 2].copy_from_slice(&new.to_be_bytes());
    let c = u16::from_be_bytes([f[at + 6], f[at + 7]]);
    if c != 0 {
        // RFC 1624: ~(~HC + ~m + m').
        let mut sum = u32::from(!c) + u32::from(!old) + u32::from(new);
        sum = (sum & 0xffff) + (sum >> 16);
        sum = (sum & 0xffff) + (sum >> 16);
        let mut c = !(sum as u16);
        if c == 0 {
            c = 0xffff;
        }
        f[at + 6..at + 8].copy_from_slice(&c.to_be_bytes());
    }
}

/// `count` frames of family `K` to matched addresses of `table`, from random hosts of the
/// input link's subnet and random ports, addressed from `src_mac` to `dst_mac`.
pub fn flows<K: Key>(
    table: &[Prefix<K>],
    count: usize,
    seed: u64,
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
) -> Vec<Vec<u8>> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed_f10b);
    addresses::matched(table, count, seed)
        .into_iter()
        .map(|k| {
            let ports = (rng.gen_range(1024..65535), rng.gen_range(1..1024));
            match to_ip(k) {
                IpAddr::V4(dst) => {
                    let host: u32 = rng.gen_range(2..0xffff);
                    let src = Ipv4Addr::from(u32::from(INPUT_NET4) | host);
                    udp_frame_v4(dst_mac, src_mac, src, dst, ports)
                }
                IpAddr::V6(dst) => {
                    let host: u64 = rng.gen_range(2..u64::MAX);
                    let src = Ipv6Addr::from(u128::from(INPUT_NET6) | host as u128);
                    udp_frame_v6(dst_mac, src_mac, src, dst, ports)
                }
            }
        })
        .collect()
}

/// The frames of `frames` that `router` forwards out of its output link; how many it
/// would not (its own, a link's subnet).
fn forwarded(router: &Router, frames: Vec<Vec<u8>>) -> (Vec<Vec<u8>>, usize) {
    let mut pipeline = Pipeline::new();
    let mut pool = Pool::new(256, 2048);
    let (mut ids, mut fates) = (Vec::new(), Vec::new());
    let mut kept = Vec::with_capacity(frames.len());
    let mut left = 0;
    for chunk in frames.chunks(256) {
        ids.clear();
        fates.clear();
        pool.alloc(chunk.len(), &mut ids);
        for (&id, f) in ids.iter().zip(chunk) {
            pool.fill(id, f);
        }
        pipeline.run(
            &router.snapshot,
            &router.neighbours,
            router.arrival,
            &mut pool,
            &ids,
            &mut fates,
        );
        pool.free(&ids);
        for &(_, f) in &pipeline.fragments {
            pool.free(&[f]);
        }
        for (f, fate) in chunk.iter().zip(&fates) {
            if *fate == Fate::Out(router.output) {
                kept.push(f.clone());
            } else {
                left += 1;
            }
        }
    }
    (kept, left)
}

/// One thread's forwarding loop and what it works with.
struct Lane<'a> {
    router: &'a Router,
    frames: &'a [[u8; 64]],
    len: usize,
    next: usize,
    pipeline: Pipeline,
    pool: Pool,
    ids: Vec<BufferId>,
    fates: Vec<Fate>,
    output: Output,
    rest: Vec<BufferId>,
    /// Packets that did not leave by the output link (there must be none).
    strays: u64,
    /// With connections owned by one lane each: how the lane hands packets over.
    handing: Option<Handing>,
}

/// A lane's part in handing packets over, as the daemon's workers hand them: the
/// packets of connections another lane's table owns go to that lane's mailbox, copied,
/// once a vector; the lane takes what the others handed it before each vector it reads.
struct Handing {
    me: usize,
    mailboxes: Arc<Vec<Mailbox>>,
    /// A batch for each lane, posted at the end of the vector.
    batches: Vec<HandedBatch>,
    groups: Vec<Group>,
    fates: Vec<Fate>,
    /// Packets handed over, and those a full mailbox or pool dropped.
    handed: u64,
    lost: u64,
}

/// What lanes that hand packets over share: their mailboxes, the tables' census and
/// registry (the lanes masquerade, so every connection enters it, as in the daemon).
#[derive(Clone)]
struct HandOver {
    mailboxes: Arc<Vec<Mailbox>>,
    census: Arc<std::sync::atomic::AtomicUsize>,
    registry: Arc<Mutex<fibre_conntrack::Registry>>,
    lanes: usize,
}

/// The seed of the lanes' owners' hash.
const OWNERS_SEED: u64 = 0x5eed;

/// What a lane's packets meet: the router's rules, and whether their connections are
/// tracked: in a table of the lane's own, or in `shared`, one table every lane takes
/// once a vector, as the daemon's workers share theirs.
#[derive(Clone, Default)]
struct Firewall {
    rules: Arc<Filter>,
    tracked: bool,
    shared: Option<Arc<Mutex<fibre_conntrack::Conntrack>>>,
    /// Each lane forwards flows of its own (a share of them), as a router's workers
    /// each get theirs from the links' steering; else every lane all of them, from its
    /// own place.
    disjoint: bool,
    /// Each lane's table holds the connections that hash to it, the others' packets
    /// handed to their owners.
    hand_over: Option<HandOver>,
}

/// The table of a lane whose connections are tracked: room for the study's largest
/// number of connections.
fn lane_table() -> fibre_conntrack::Conntrack {
    let mut settings = fibre_conntrack::Settings::kernel_defaults();
    settings.max = 4 << 20;
    fibre_conntrack::Conntrack::new(settings)
}

impl<'a> Lane<'a> {
    fn new(
        router: &'a Router,
        frames: &'a [[u8; 64]],
        len: usize,
        pool: usize,
        first: usize,
        firewall: &Firewall,
        me: usize,
    ) -> Lane<'a> {
        let mut pipeline = Pipeline::new();
        pipeline.rules = firewall.rules.clone();
        let mut handing = None;
        if firewall.tracked {
            pipeline.tracked = 3;
            pipeline.conntrack = Some(match (&firewall.shared, &firewall.hand_over) {
                (Some(table), _) => table.clone(),
                (None, Some(h)) => {
                    let mut table = lane_table();
                    table.set_census(h.census.clone());
                    table.set_registry(h.registry.clone());
                    table.register(3);
                    table.set_owners(fibre_conntrack::Owners {
                        workers: h.lanes as u16,
                        me: me as u16,
                        seed: OWNERS_SEED,
                    });
                    pipeline.mailboxes = Some(h.mailboxes.clone());
                    handing = Some(Handing {
                        me,
                        mailboxes: h.mailboxes.clone(),
                        batches: (0..h.lanes).map(|_| HandedBatch::default()).collect(),
                        groups: Vec::new(),
                        fates: Vec::with_capacity(256),
                        handed: 0,
                        lost: 0,
                    });
                    Arc::new(Mutex::new(table))
                }
                (None, None) => Arc::new(Mutex::new(lane_table())),
            });
        }
        Lane {
            router,
            frames,
            len,
            next: first % frames.len().max(1),
            pipeline,
            pool: Pool::new(pool.max(256), 2048),
            ids: Vec::with_capacity(256),
            fates: Vec::with_capacity(256),
            output: Output::default(),
            rest: Vec::with_capacity(256),
            strays: 0,
            handing,
        }
    }

    /// Runs the packets the other lanes handed this one (their connections' owner), as
    /// a worker does before it reads its links: each group of alike packets through
    /// the pipeline, its buffers given back as after a send.
    fn take_handed(&mut self) {
        let Some(h) = self.handing.as_mut() else {
            return;
        };
        let mut batches = Vec::new();
        h.mailboxes[h.me].drain(false, |b| batches.push(b));
        for batch in batches {
            h.lost += batch.unpack(&mut self.pool, &mut h.groups) as u64;
            h.mailboxes[h.me].give_back(batch);
            for (arrival, _, _, ids) in h.groups.drain(..) {
                h.fates.clear();
                self.pipeline.run(
                    &self.router.snapshot,
                    &self.router.neighbours,
                    arrival,
                    &mut self.pool,
                    &ids,
                    &mut h.fates,
                );
                for fate in &h.fates {
                    if fate.output() != Some(self.router.output) {
                        self.strays += 1;
                    }
                }
                self.pool.free(&ids);
            }
        }
    }

    /// Hands the vector's packets that other lanes own to their mailboxes (their
    /// buffers given back), leaving the rest, in order, for the output.
    fn hand_over(&mut self) {
        let Some(h) = self.handing.as_mut() else {
            return;
        };
        let mut kept = 0;
        for k in 0..self.ids.len() {
            let (id, fate) = (self.ids[k], self.fates[k]);
            match fate {
                Fate::Handoff(to) => {
                    h.batches[usize::from(to)].push(&self.pool, id, self.router.arrival, false, 1);
                    self.pool.free(&[id]);
                }
                _ => {
                    self.ids[kept] = id;
                    self.fates[kept] = fate;
                    kept += 1;
                }
            }
        }
        self.ids.truncate(kept);
        self.fates.truncate(kept);
        for (to, batch) in h.batches.iter_mut().enumerate() {
            if batch.is_empty() {
                continue;
            }
            let n = batch.len() as u64;
            h.handed += n;
            if !h.mailboxes[to].post(batch) {
                h.lost += n;
            }
        }
    }

    /// Forwards `packets` packets in vectors of `vector`; the counters start afresh.
    fn forward(&mut self, packets: usize, vector: usize) -> u64 {
        for s in self.pipeline.stages_mut() {
            *s = StageCounters::default();
        }
        let mut done = 0;
        while done < packets {
            let n = vector.min(packets - done);
            // Receive: buffers in bulk, a frame copied into each.
            let t = Instant::now();
            self.ids.clear();
            self.pool.alloc(n, &mut self.ids);
            for &id in &self.ids {
                self.pool.fill(id, &self.frames[self.next][..self.len]);
                self.next += 1;
                if self.next == self.frames.len() {
                    self.next = 0;
                }
            }
            self.pipeline.receive.add(n, t);
            self.fates.clear();
            self.pipeline.run(
                &self.router.snapshot,
                &self.router.neighbours,
                self.router.arrival,
                &mut self.pool,
                &self.ids,
                &mut self.fates,
            );
            if self.handing.is_some() {
                self.hand_over();
                self.take_handed();
            }
            // Output: sorted by link, the buffers given back as after a send.
            let t = Instant::now();
            self.rest.clear();
            for (&id, fate) in self.ids.iter().zip(&self.fates) {
                match fate.output() {
                    Some(link) => self.output.push(link, id),
                    None => self.rest.push(id),
                }
            }
            for &(i, f) in &self.pipeline.fragments {
                match self.fates[i].output() {
                    Some(link) => self.output.push(link, f),
                    None => self.rest.push(f),
                }
            }
            let out = self.output.len();
            for (link, queue) in self.output.queues() {
                if link != self.router.output {
                    self.strays += queue.len() as u64;
                }
                self.pool.free(queue);
                queue.clear();
            }
            self.strays += self.rest.len() as u64;
            self.pool.free(&self.rest);
            self.pipeline.output.add(out, t);
            done += n;
        }
        done as u64
    }
}

/// One measurement: `threads` lanes forwarding `frames`, vectors of `vector` packets.
struct Measured {
    /// Wall ns per packet (per thread, and over all threads), trimmed over repetitions.
    per_packet: Stat,
    throughput: Stat,
    /// Each stage's ns per packet, averaged over threads, trimmed over repetitions.
    stages: Vec<Stat>,
    /// Packets handed to the lane that owns their connection, over all repetitions,
    /// and those of them a full mailbox dropped.
    handed: u64,
    lost: u64,
    /// Packets read by all lanes over all repetitions.
    read: u64,
    /// The bytes the lanes' connection tables and their registry held at the end,
    /// the largest of the repetitions.
    table_bytes: usize,
}

fn measure_lanes(
    router: &Router,
    flows: &Flows,
    cfg: &PipelineConfig,
    threads: usize,
    vector: usize,
    firewall: &Firewall,
) -> Result<Measured, String> {
    let reps = cfg.repetitions.max(1);
    // Per repetition, per thread, each stage's ns per packet.
    let stages: Mutex<Vec<Vec<[f64; STAGES.len()]>>> = Mutex::new(vec![Vec::new(); reps]);
    let strays = Mutex::new(0u64);
    let handing = Mutex::new((0u64, 0u64));
    let reads = Mutex::new(0u64);
    let table_bytes = Mutex::new(0usize);
    let per_thread = flows.frames.len() / threads.max(1);
    let timing = measure(
        Method {
            repetitions: reps,
            threads,
        },
        |t| {
            let (frames, first) = if firewall.disjoint && per_thread > 0 {
                (&flows.frames[t * per_thread..(t + 1) * per_thread], 0)
            } else {
                (&flows.frames[..], t * per_thread)
            };
            Lane::new(router, frames, flows.len, cfg.pool, first, firewall, t)
        },
        |lane, rep| {
            let n = lane.forward(cfg.packets, vector);
            let mut ns = [0.0; STAGES.len()];
            for (k, (_, c)) in lane.pipeline.stages().iter().enumerate() {
                ns[k] = c.time.as_nanos() as f64 / n.max(1) as f64;
            }
            if let Ok(mut s) = stages.lock() {
                s[rep].push(ns);
            }
            if let Ok(mut s) = strays.lock() {
                *s += std::mem::take(&mut lane.strays);
            }
            if let (Some(h), Ok(mut s)) = (lane.handing.as_mut(), handing.lock()) {
                s.0 += std::mem::take(&mut h.handed);
                s.1 += std::mem::take(&mut h.lost);
            }
            if let Ok(mut r) = reads.lock() {
                *r += n;
            }
            if let (Some(table), Ok(mut most)) = (&lane.pipeline.conntrack, table_bytes.lock()) {
                let table = table
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                *most = (*most).max(table.memory() + table.registry_memory());
            }
            n
        },
    );
    let (handed, lost) = handing.into_inner().unwrap_or_default();
    let strays = strays.into_inner().unwrap_or(0);
    if strays > 0 {
        return Err(format!(
            "{strays} packets did not leave by the output link: the measurement would not be of forwarding"
        ));
    }
    let stages = stages.into_inner().unwrap_or_default();
    let stage_stats = (0..STAGES.len())
        .map(|k| {
            let per_rep: Vec<f64> = stages
                .iter()
                .map(|threads| {
                    threads.iter().map(|ns| ns[k]).sum::<f64>() / threads.len().max(1) as f64
                })
                .collect();
            Stat::trimmed(&per_rep)
        })
        .collect();
    Ok(Measured {
        per_packet: timing.per_op,
        throughput: timing.throughput,
        stages: stage_stats,
        handed,
        lost,
        read: reads.into_inner().unwrap_or(0),
        table_bytes: table_bytes.into_inner().unwrap_or(0),
    })
}

/// The flows of one family, ready to measure: those the router forwards, side by side
/// in memory a cache line each, as a receive ring holds them.
pub struct Flows {
    /// The family.
    pub family: u8,
    /// The frames, each in the first `len` bytes of its line.
    pub frames: Vec<[u8; 64]>,
    /// The frames' length.
    pub len: usize,
    /// Generated flows left out because the router does not forward them.
    pub left_out: usize,
}

impl Flows {
    /// `n` flows made of these: each frame again with other source ports, as many
    /// times as it takes (the UDP checksum kept right).
    pub fn with_count(&self, n: usize) -> Flows {
        let frames = (0..n.max(1))
            .map(|k| {
                let mut f = self.frames[k % self.frames.len()];
                other_source_port(&mut f, (k / self.frames.len()) as u16);
                f
            })
            .collect();
        Flows {
            family: self.family,
            frames,
            len: self.len,
            left_out: self.left_out,
        }
    }

    /// `cfg.flows` flows to matched addresses of `table`, those `router` forwards.
    pub fn new<K: Key>(router: &Router, table: &[Prefix<K>], cfg: &PipelineConfig) -> Flows {
        let frames = flows(table, cfg.flows, cfg.seed, INPUT_MAC, HOST_MAC);
        let (frames, left_out) = forwarded(router, frames);
        let len = frames.first().map_or(0, Vec::len);
        Flows {
            family: K::FAMILY,
            frames: frames
                .iter()
                .map(|f| {
                    let mut line = [0u8; 64];
                    line[..f.len()].copy_from_slice(f);
                    line
                })
                .collect(),
            len,
            left_out,
        }
    }
}

fn base(family: u8, routes: usize, threads: usize, vector: usize) -> Value {
    json!({"study": "pipeline", "family": family, "routes": routes,
           "threads": threads, "vector": vector})
}

/// Runs the study on one family's flows through `router` (holding `routes` routes of
/// the family); every figure goes to `emit` as it is measured, `step` hears what comes
/// next.
pub fn pipeline_study(
    router: &Router,
    flows: &Flows,
    routes: usize,
    cfg: &PipelineConfig,
    emit: &mut dyn FnMut(Value),
    step: &mut dyn FnMut(&str),
) -> Result<(), String> {
    let family = flows.family;
    if flows.frames.is_empty() {
        return Err(format!("IPv{family}: no flow the router forwards"));
    }
    let mhz = fibre_dataplane::runtime::cpu_mhz();
    let cycles = |ns: f64| mhz.map(|m| ns * m / 1e3);
    let no_rules = Firewall::default();
    let mut threads: Vec<usize> = cfg.threads.clone();
    threads.sort_unstable();
    threads.dedup();
    for &t in &threads {
        step(&format!(
            "IPv{family}: {t} thread(s), vectors of {}",
            cfg.vector
        ));
        let m = measure_lanes(router, flows, cfg, t, cfg.vector, &no_rules)?;
        if t == threads[0] {
            for (k, name) in STAGES.iter().enumerate() {
                let s = m.stages[k];
                let mut f = base(family, routes, t, cfg.vector);
                f["metric"] = json!("stage");
                f["stage"] = json!(name);
                f["ns_per_packet"] = json!(s.mean);
                f["mean_dev"] = json!(s.mean_dev);
                f["cycles_per_packet"] = json!(cycles(s.mean));
                emit(f);
            }
            let forwarding: f64 = m
                .stages
                .iter()
                .zip(STAGES)
                .filter(|(_, n)| *n != "receive")
                .map(|(s, _)| s.mean)
                .sum();
            let mut f = base(family, routes, t, cfg.vector);
            f["metric"] = json!("forwarding");
            f["ns_per_packet"] = json!(forwarding);
            f["cycles_per_packet"] = json!(cycles(forwarding));
            f["budget_ns"] = json!(BUDGET_NS);
            emit(f);
        }
        let mut f = base(family, routes, t, cfg.vector);
        f["metric"] = json!("packet");
        f["ns_per_packet"] = json!(m.per_packet.mean);
        f["mean_dev"] = json!(m.per_packet.mean_dev);
        f["cycles_per_packet"] = json!(cycles(m.per_packet.mean));
        f["throughput_ns"] = json!(m.throughput.mean);
        f["mpps"] = json!(1e3 / m.throughput.mean);
        f["mpps_per_core"] = json!(1e3 / m.throughput.mean / t as f64);
        f["flows"] = json!(flows.frames.len());
        f["left_out"] = json!(flows.left_out);
        emit(f);
    }
    for &v in &cfg.vectors {
        step(&format!("IPv{family}: vectors of {v}"));
        let m = measure_lanes(router, flows, cfg, 1, v.clamp(1, 256), &no_rules)?;
        let mut f = base(family, routes, 1, v);
        f["metric"] = json!("vector");
        f["ns_per_packet"] = json!(m.per_packet.mean);
        f["mean_dev"] = json!(m.per_packet.mean_dev);
        f["cycles_per_packet"] = json!(cycles(m.per_packet.mean));
        emit(f);
    }
    for &n in &cfg.filter_rules {
        let rules = unmatched_rules(n, family);
        for (mode, filter) in [("blocks", rules.clone()), ("walked", rules.walked())] {
            if n == 0 && mode == "walked" {
                continue;
            }
            step(&format!("IPv{family}: {n} filter rules, {mode}"));
            // Walked, the rules cost a packet their number: fewer packets keep the
            // measurement's time bounded.
            let mut c = cfg.clone();
            if mode == "walked" {
                c.packets = (cfg.packets * 32 / (32 + n)).max(4 * cfg.vector);
            }
            let firewall = Firewall {
                rules: Arc::new(filter),
                ..Firewall::default()
            };
            let m = measure_lanes(router, flows, &c, 1, cfg.vector, &firewall)?;
            let mut f = base(family, routes, 1, cfg.vector);
            f["metric"] = json!("filter");
            f["rules"] = json!(n);
            f["mode"] = json!(mode);
            f["ns_per_packet"] = json!(m.per_packet.mean);
            f["mean_dev"] = json!(m.per_packet.mean_dev);
            f["cycles_per_packet"] = json!(cycles(m.per_packet.mean));
            let k = STAGES.iter().position(|s| *s == "filter").expect("a stage");
            f["filter_ns"] = json!(m.stages[k].mean);
            emit(f);
        }
    }
    // Connections: each flow its own, tracked; then masqueraded out of the output link;
    // then behind 1,000 filter rules none matches too.
    let stage = |name: &str| STAGES.iter().position(|s| *s == name).expect("a stage");
    for &n in &cfg.connections {
        let many = flows.with_count(n);
        for (mode, rules) in [
            ("tracked", connection_rules(0, false, family)),
            ("masquerade", connection_rules(0, true, family)),
            (
                "masquerade, 1000 rules",
                connection_rules(1000, true, family),
            ),
        ] {
            if cfg.connections_mode.as_deref().is_some_and(|m| m != mode) {
                continue;
            }
            step(&format!("IPv{family}: {n} connections, {mode}"));
            let firewall = Firewall {
                rules: Arc::new(rules),
                tracked: true,
                ..Firewall::default()
            };
            let m = measure_lanes(router, &many, cfg, 1, cfg.vector, &firewall)?;
            let mut f = base(family, routes, 1, cfg.vector);
            f["metric"] = json!("connections");
            f["connections"] = json!(n);
            f["mode"] = json!(mode);
            f["ns_per_packet"] = json!(m.per_packet.mean);
            f["mean_dev"] = json!(m.per_packet.mean_dev);
            f["cycles_per_packet"] = json!(cycles(m.per_packet.mean));
            f["conntrack_ns"] = json!(m.stages[stage("conntrack")].mean);
            f["filter_ns"] = json!(m.stages[stage("filter")].mean);
            f["route_ns"] = json!(m.stages[stage("route")].mean);
            let forwarding: f64 = m
                .stages
                .iter()
                .zip(STAGES)
                .filter(|(_, n)| *n != "receive" && *n != "output")
                .map(|(s, _)| s.mean)
                .sum();
            f["forwarding_ns"] = json!(forwarding);
            // The stages the seeds' budget counts: input to output.
            f["budget_ns"] = json!(forwarding + m.stages[stage("output")].mean);
            f["table_bytes"] = json!(m.table_bytes);
            f["stages_ns"] = STAGES
                .iter()
                .zip(&m.stages)
                .map(|(n, s)| (n.to_string(), json!(s.mean)))
                .collect();
            emit(f);
        }
    }
    connections_by_workers(router, flows, routes, cfg, &threads, emit, step)
}

/// The connections study's last mode (masqueraded behind 1,000 rules) on each number of
/// threads past one, each thread forwarding flows of its own: its connections tracked in
/// a table of each thread's own (as the daemon's workers track theirs, here with every
/// packet read by its owner), and in one table every thread takes once a vector (what
/// sharing one would cost). All packets over the wall time.
fn connections_by_workers(
    router: &Router,
    flows: &Flows,
    routes: usize,
    cfg: &PipelineConfig,
    threads: &[usize],
    emit: &mut dyn FnMut(Value),
    step: &mut dyn FnMut(&str),
) -> Result<(), String> {
    let family = flows.family;
    if threads.iter().all(|&t| t < 2) {
        return Ok(());
    }
    let rules = Arc::new(connection_rules(1000, true, family));
    for &n in &cfg.connections {
        let many = flows.with_count(n);
        for &t in threads {
            if n < t {
                continue;
            }
            for table in ["own", "shared", "handed"] {
                // (One thread hands nothing over.)
                if table == "handed" && t < 2 {
                    continue;
                }
                step(&format!(
                    "IPv{family}: {n} connections, {t} threads, {table} table"
                ));
                let hand_over = match table {
                    "handed" => Some(HandOver {
                        mailboxes: Arc::new(
                            (0..t)
                                .map(|_| Mailbox::new())
                                .collect::<Result<_, _>>()
                                .map_err(|e| format!("a mailbox's eventfd: {e}"))?,
                        ),
                        census: Arc::default(),
                        registry: Arc::default(),
                        lanes: t,
                    }),
                    _ => None,
                };
                let firewall = Firewall {
                    rules: rules.clone(),
                    tracked: true,
                    shared: (table == "shared").then(|| Arc::new(Mutex::new(lane_table()))),
                    disjoint: true,
                    hand_over,
                };
                let m = measure_lanes(router, &many, cfg, t, cfg.vector, &firewall)?;
                let mut f = base(family, routes, t, cfg.vector);
                f["metric"] = json!("connections-workers");
                f["connections"] = json!(n);
                f["table"] = json!(table);
                // (Packets a full mailbox dropped were read, not forwarded.)
                let forwarded = 1.0 - m.lost as f64 / m.read.max(1) as f64;
                f["throughput_ns"] = json!(m.throughput.mean / forwarded);
                f["mpps"] = json!(1e3 / m.throughput.mean * forwarded);
                if table == "handed" {
                    f["packets_read"] = json!(m.read);
                    f["handed"] = json!(m.handed);
                    f["handoff_dropped"] = json!(m.lost);
                }
                emit(f);
            }
        }
    }
    Ok(())
}

/// The rules of the connections study (whose lanes track every connection, as a
/// ruleset with a `ct` rule has them): `n` rules no flow matches at the forward hook,
/// and with `masquerade`, a `nat` chain masquerading out of every link.
pub fn connection_rules(n: usize, masquerade: bool, family: u8) -> Filter {
    use fibre_firewall::build::{self, ChainSpec};
    let mut chains = vec![ChainSpec {
        nat: false,
        name: "forward".into(),
        hook: Some((2, 1)),
        rules: unmatched_expressions(n, family),
    }];
    if masquerade {
        chains.push(ChainSpec {
            nat: true,
            name: "postrouting".into(),
            hook: Some((4, 1)),
            rules: vec![vec![build::masquerade()]],
        });
    }
    let r = build::ruleset(fibre_firewall::message::Family::Inet, "fw", chains);
    Filter::of(&r)
}

/// `n` filter rules at the forward hook of an `inet` table, as `nft` compiles `ip saddr
/// 198.18.X.Y drop` (`ip6 saddr 2001:db8:ffff::X drop` for IPv6): each source an
/// address no flow has, so that every packet goes through them all and passes.
pub fn unmatched_rules(n: usize, family: u8) -> Filter {
    use fibre_firewall::build::{ruleset, ChainSpec};
    let r = ruleset(
        fibre_firewall::message::Family::Inet,
        "filter",
        vec![ChainSpec {
            nat: false,
            name: "forward".into(),
            hook: Some((2, 1)),
            rules: unmatched_expressions(n, family),
        }],
    );
    Filter::of(&r)
}

/// The expressions of [`unmatched_rules`]' rules.
fn unmatched_expressions(n: usize, family: u8) -> Vec<Vec<fibre_firewall::message::Expression>> {
    use fibre_firewall::build::{cmp, meta, payload, verdict};
    (0..n)
        .map(|i| {
            let i = i as u32;
            let (nfproto, offset, address) = if family == 4 {
                (2, 12, (0xc612_0000 | (i & 0xffff)).to_be_bytes().to_vec())
            } else {
                let a = 0x2001_0db8_ffff_0000_0000_0000_0000_0000u128 | u128::from(i);
                (10, 8, a.to_be_bytes().to_vec())
            };
            vec![
                meta(15, 1),
                cmp(0, 1, &[nfproto]),
                payload(1, offset, address.len() as u32, 1),
                cmp(0, 1, &address),
                verdict(0, None),
            ]
        })
        .collect()
}

/// The figures of `family` and `metric`.
fn of<'a>(
    figures: &'a [Value],
    study: &'a str,
    metric: Option<&'a str>,
) -> impl Iterator<Item = &'a Value> {
    figures
        .iter()
        .filter(move |f| f["study"] == study && metric.is_none_or(|m| f["metric"] == m))
}

fn num(v: &Value) -> Option<f64> {
    v.as_f64().filter(|x| x.is_finite() && *x >= 0.0)
}

fn show(v: Option<f64>, digits: usize) -> String {
    v.map_or("–".into(), |x| format!("{x:.digits$}"))
}

/// Writes to `md` a table of the figures of `metric`: a row per value of `column`, and
/// for each family a column per field of `fields` (a heading, the figure's key).
fn family_table(
    md: &mut String,
    figures: &[Value],
    families: &[u64],
    (metric, column): (&str, &str),
    fields: &[(&str, &str)],
) {
    let mut head = format!("| {column} |");
    let mut rule = "|---:|".to_string();
    for fam in families {
        for (title, _) in fields {
            let _ = write!(head, " IPv{fam} {title} |");
            rule += "---:|";
        }
    }
    let _ = writeln!(md, "{head}\n{rule}");
    let mut keys: Vec<u64> = of(figures, "pipeline", Some(metric))
        .filter_map(|f| f[column].as_u64())
        .collect();
    keys.sort_unstable();
    keys.dedup();
    for k in keys {
        let mut row = format!("| {k} |");
        for &fam in families {
            let f = of(figures, "pipeline", Some(metric))
                .find(|f| f["family"] == fam && f[column] == k);
            for (_, key) in fields {
                let _ = write!(row, " {} |", show(f.and_then(|f| num(&f[*key])), 2));
            }
        }
        let _ = writeln!(md, "{row}");
    }
    md.push('\n');
}

/// The report of a run's figures, in Markdown.
pub fn markdown(figures: &[Value]) -> String {
    let mut md = String::new();
    let families: Vec<u64> = [4, 6]
        .into_iter()
        .filter(|f| figures.iter().any(|x| x["family"] == *f))
        .collect();
    let stage = |fam: u64, name: &str| {
        of(figures, "pipeline", Some("stage")).find(|f| f["family"] == fam && f["stage"] == name)
    };
    if of(figures, "pipeline", Some("stage")).next().is_some() {
        let first = of(figures, "pipeline", Some("stage"))
            .next()
            .cloned()
            .unwrap_or_default();
        let _ = writeln!(
            md,
            "## In memory, one core: what each stage costs a packet\n\nVectors of {} packets, \
             {} thread; ns and cycles per packet (± mean deviation). The budget is {BUDGET_NS} ns: \
             a 64-byte frame at 10 Gbit/s.\n",
            first["vector"], first["threads"]
        );
        let mut head = "| stage |".to_string();
        let mut rule = "|---|".to_string();
        for fam in &families {
            let _ = write!(head, " IPv{fam} ns | IPv{fam} cycles |");
            rule += "---:|---:|";
        }
        let _ = writeln!(md, "{head}\n{rule}");
        for name in STAGES {
            let mut row = format!("| {name} |");
            for &fam in &families {
                let f = stage(fam, name);
                let ns = f.and_then(|f| num(&f["ns_per_packet"]));
                let dev = f.and_then(|f| num(&f["mean_dev"]));
                let cyc = f.and_then(|f| num(&f["cycles_per_packet"]));
                let _ = write!(
                    row,
                    " {} ± {} | {} |",
                    show(ns, 2),
                    show(dev, 2),
                    show(cyc, 0)
                );
            }
            let _ = writeln!(md, "{row}");
        }
        let mut row = "| **input … output** (the budget's stages) |".to_string();
        for &fam in &families {
            let f = of(figures, "pipeline", Some("forwarding")).find(|f| f["family"] == fam);
            let ns = f.and_then(|f| num(&f["ns_per_packet"]));
            let cyc = f.and_then(|f| num(&f["cycles_per_packet"]));
            let within = ns.map_or("", |n| if n <= BUDGET_NS { " ✓" } else { " ✗" });
            let _ = write!(row, " **{}**{within} | {} |", show(ns, 2), show(cyc, 0));
        }
        let _ = writeln!(md, "{row}");
        let mut row =
            "| the whole loop, wall clock (receive and clock reads included) |".to_string();
        for &fam in &families {
            let f = of(figures, "pipeline", Some("packet"))
                .find(|f| f["family"] == fam && f["threads"] == first["threads"]);
            let ns = f.and_then(|f| num(&f["ns_per_packet"]));
            let cyc = f.and_then(|f| num(&f["cycles_per_packet"]));
            let _ = write!(row, " {} | {} |", show(ns, 2), show(cyc, 0));
        }
        let _ = writeln!(md, "{row}\n");
    }
    if of(figures, "pipeline", Some("packet")).next().is_some() {
        let _ = writeln!(
            md,
            "## In memory, by cores: millions of packets a second\n\nEach thread pinned to a \
             core of its own (threads past the CPUs share them), all forwarding at once; the \
             rate is all packets over the wall time of the run.\n"
        );
        family_table(
            &mut md,
            figures,
            &families,
            ("packet", "threads"),
            &[("Mpps", "mpps"), ("Mpps per core", "mpps_per_core")],
        );
    }
    if of(figures, "pipeline", Some("vector")).next().is_some() {
        let _ = writeln!(
            md,
            "## In memory, one core, by vector size: ns per packet\n\nThe whole loop over its \
             packets. Every stage reads the clock once per vector, so small vectors pay for \
             seven clock reads over few packets: part of what batching saves.\n"
        );
        family_table(
            &mut md,
            figures,
            &families,
            ("vector", "vector"),
            &[("ns", "ns_per_packet")],
        );
    }
    let filter: Vec<&Value> = of(figures, "pipeline", Some("filter")).collect();
    if !filter.is_empty() {
        let _ = writeln!(
            md,
            "## In memory, one core: the filter by its rules\n\nRules at the forward hook no \
             flow matches (`ip saddr 198.18.X.Y drop`, `ip6 saddr 2001:db8:ffff::X drop`), so \
             every packet goes through them all and passes: the filter stage's ns per packet, \
             and the whole packet's, with the blocks that skip the rules a packet's field does \
             not name, and walked one by one as the kernel walks them.\n"
        );
        let mut head = "| rules |".to_string();
        let mut rule = "|---:|".to_string();
        for fam in &families {
            let _ = write!(
                head,
                " IPv{fam} filter | IPv{fam} packet | IPv{fam} filter, walked | IPv{fam} packet, walked |"
            );
            rule += "---:|---:|---:|---:|";
        }
        let _ = writeln!(md, "{head}\n{rule}");
        let mut counts: Vec<u64> = filter.iter().filter_map(|f| f["rules"].as_u64()).collect();
        counts.sort_unstable();
        counts.dedup();
        for n in counts {
            let mut row = format!("| {n} |");
            for &fam in &families {
                for mode in ["blocks", "walked"] {
                    let f = filter
                        .iter()
                        .find(|f| f["family"] == fam && f["rules"] == n && f["mode"] == mode);
                    let _ = write!(
                        row,
                        " {} | {} |",
                        show(f.and_then(|f| num(&f["filter_ns"])), 1),
                        show(f.and_then(|f| num(&f["ns_per_packet"])), 1)
                    );
                }
            }
            let _ = writeln!(md, "{row}");
        }
        let _ = writeln!(md);
    }
    let connections: Vec<&Value> = of(figures, "pipeline", Some("connections")).collect();
    if !connections.is_empty() {
        let _ = writeln!(
            md,
            "## In memory, one core: connections tracked and translated\n\nEach flow its \
             own connection (UDP, one way), tracked as the kernel's conntrack tracks it; then \
             masqueraded out of the output link; then behind 1,000 filter rules none matches \
             (walked with blocks). Per packet, ns: the conntrack stage (tracking, prerouting, \
             destination NAT), the filter stage (the rules, source NAT, the confirm), and the \
             whole packet but its receive and output (`forwarding`), the stages the budget \
             counts (`input … output`, as above) and the whole loop (`packet`). The budget: \
             routing, conntrack, NAT and 1,000 rules within 100 ns. `table`: the bytes the \
             connection table (and the registry of the tuples NAT must not take) holds.\n"
        );
        let _ = writeln!(
            md,
            "| family | connections | mode | conntrack | filter | forwarding | input … output | packet | table, MiB |\n\
             |---|---:|---|---:|---:|---:|---:|---:|---:|"
        );
        for f in &connections {
            let mib = num(&f["table_bytes"]).map(|b| b / f64::from(1u32 << 20));
            let _ = writeln!(
                md,
                "| IPv{} | {} | {} | {} | {} | {} | {} | {} | {} |",
                f["family"],
                f["connections"],
                f["mode"].as_str().unwrap_or(""),
                show(num(&f["conntrack_ns"]), 1),
                show(num(&f["filter_ns"]), 1),
                show(num(&f["forwarding_ns"]), 1),
                show(num(&f["budget_ns"]), 1),
                show(num(&f["ns_per_packet"]), 1),
                show(mib, 1)
            );
        }
        let _ = writeln!(md);
    }
    connections_by_workers_table(figures, &mut md);
    let kernel_filter: Vec<&Value> = of(figures, "veth-filter", None).collect();
    if !kernel_filter.is_empty() {
        let _ = writeln!(
            md,
            "## The kernel's filter by its rules, beside fibre's\n\nThe same rules loaded \
             with `nft` into the kernel's forward hook, the kernel forwarding over veth (the \
             veth study's topology, at a rate it keeps up with): what a frame costs the \
             router's core, and what each rule adds to a frame, against what each rule adds \
             to a packet in fibre's filter stage (in memory, walked and with blocks).\n"
        );
        let _ = writeln!(
            md,
            "| family | rules | kernel ns a frame | kernel ns a rule | fibre ns a rule, walked | fibre ns a rule, blocks |\n|---|---:|---:|---:|---:|---:|"
        );
        for f in &kernel_filter {
            let (fam, n) = (
                f["family"].as_u64().unwrap_or(0),
                f["rules"].as_u64().unwrap_or(0),
            );
            let ns = num(&f["core_ns_per_frame"]);
            let none = kernel_filter
                .iter()
                .find(|g| g["family"] == fam && g["rules"] == 0)
                .and_then(|g| num(&g["core_ns_per_frame"]));
            let per_rule = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(a), Some(b)) if n > 0 => Some((a - b) / n as f64),
                _ => None,
            };
            let fibre = |mode: &str| {
                filter
                    .iter()
                    .find(|g| g["family"] == fam && g["rules"] == n && g["mode"] == mode)
                    .and_then(|g| num(&g["filter_ns"]))
            };
            let _ = writeln!(
                md,
                "| IPv{fam} | {n} | {} | {} | {} | {} |",
                show(ns, 0),
                show(per_rule(ns, none), 2),
                show(fibre("walked").map(|x| x / n.max(1) as f64), 3),
                show(fibre("blocks").map(|x| x / n.max(1) as f64), 4),
            );
        }
        let _ = writeln!(md);
    }
    component_model(figures, &mut md);
    components_by_connections(figures, &mut md);
    let veth: Vec<&Value> = of(figures, "veth", None).collect();
    if !veth.is_empty() {
        let _ = writeln!(
            md,
            "## Over veth: host A, router, host B; the kernel and fibre\n\nShortest UDP \
             frames (64 bytes on the wire for IPv4, 66 for IPv6) to matched addresses of the \
             tables, sent by host A from a packet socket. The router's work on one CPU, the hosts' (the generator, \
             host B's receive) on the other: the kernel's receive work on the router's \
             input link steered to the router's CPU; fibre's worker there, and over AF_XDP \
             the links' NAPI in kernel threads pinned there too. Loss-free: the highest \
             rate offered for a whole trial with nothing lost. The router CPU's ns per \
             frame: its busy time (the wall time less its idle time) over the frames \
             forwarded, at {} thousand frames a second for every engine (whatever else ran \
             on that CPU counts too). The floor is no forwarder: a traffic-control program \
             on each router link hands every TCP and UDP frame to the other link, MACs and \
             time to live rewritten, no lookup; what it costs, any forwarder on these links \
             pays. fibre runs as \
             `fibre daemon --forward` with one worker, the kernel's forwarding off: over \
             `AF_XDP`, an XDP program redirects the frames it forwards to its socket before \
             the kernel makes anything of them; over `AF_PACKET`, the kernel still receives \
             every frame and routes it to drop it, on the same CPU.\n",
            veth.first()
                .map_or("?".into(), |f| f["cost_rate_kpps"].to_string())
        );
        if veth
            .first()
            .is_some_and(|f| f["router_cpu"] == f["generator_cpu"])
        {
            let _ = writeln!(
                md,
                "**This machine has one CPU: the router and the hosts shared it, so every \
                 figure below counts the generator's work as well as the router's.**\n"
            );
        }
        let _ = writeln!(
            md,
            "| family | engine | router CPU ns per frame | loss-free Mpps | forwarded at host A's fastest, Mpps | host A's fastest, Mpps |\n|---|---|---:|---:|---:|---:|"
        );
        for f in &veth {
            let bound = if f["generator_bound"] == true {
                " (host A's limit)"
            } else {
                ""
            };
            let lost = match f["cost_lost"].as_u64() {
                Some(n) if n > 0 => format!(" ({n} lost)"),
                _ => String::new(),
            };
            let _ = writeln!(
                md,
                "| IPv{} | {} | {}{lost} | {}{bound} | {} | {} |",
                f["family"],
                f["engine"].as_str().unwrap_or("?"),
                show(num(&f["core_ns_per_frame"]), 0),
                show(num(&f["loss_free_mpps"]), 3),
                show(num(&f["forwarded_at_max_mpps"]), 3),
                show(num(&f["offered_max_mpps"]), 3)
            );
        }
        for &fam in &families {
            let of = |e: &str, k: &str| {
                veth.iter()
                    .find(|f| f["family"] == fam && f["engine"] == e)
                    .and_then(|f| num(&f[k]))
            };
            if let (Some(floor), Some(ker)) = (
                of("floor", "core_ns_per_frame"),
                of("kernel", "core_ns_per_frame"),
            ) {
                if ker > 0.0 {
                    let _ = writeln!(
                        md,
                        "\nIPv{fam}: the floor keeps the router's CPU busy {:.2}× as long a frame as the kernel.",
                        floor / ker
                    );
                }
            }
            let fibres: Vec<&str> = veth
                .iter()
                .filter(|f| f["family"] == fam)
                .filter_map(|f| f["engine"].as_str())
                .filter(|e| e.starts_with("fibre"))
                .collect();
            for e in fibres {
                if let (Some(fib), Some(ker)) =
                    (of(e, "loss_free_mpps"), of("kernel", "loss_free_mpps"))
                {
                    if ker > 0.0 {
                        let _ = writeln!(
                            md,
                            "\nIPv{fam}: {e}'s loss-free rate is {:.2}× the kernel's.",
                            fib / ker
                        );
                    }
                }
                if let (Some(fib), Some(ker)) = (
                    of(e, "core_ns_per_frame"),
                    of("kernel", "core_ns_per_frame"),
                ) {
                    if ker > 0.0 {
                        let _ = writeln!(
                            md,
                            "IPv{fam}: the router's CPU is busy {:.2}× as long a frame with {e} as with the kernel.",
                            fib / ker
                        );
                    }
                }
            }
        }
        md.push('\n');
    }
    let idle: Vec<&Value> = of(figures, "veth-idle", None).collect();
    if !idle.is_empty() {
        let _ = writeln!(
            md,
            "## Idle\n\nThe daemon's CPU time (all its threads) with no traffic, forwarding \
             ready, over {} s:\n\n| engine | % of a core |\n|---|---:|",
            idle[0]["seconds"]
        );
        for f in &idle {
            let _ = writeln!(
                md,
                "| {} | {} |",
                f["engine"].as_str().unwrap_or("?"),
                show(num(&f["cpu_percent"]), 2)
            );
        }
        md.push('\n');
    }
    let tcp: Vec<&Value> = of(figures, "veth-tcp", None).collect();
    if !tcp.is_empty() {
        let _ = writeln!(
            md,
            "## TCP through the router\n\nOne connection from host A to host B for a few \
             seconds, both ends on the hosts' CPU, their links' offloads as a new veth has \
             them (checksums left partial, segments of up to 64 KiB handed over whole); \
             with fibre's XDP program on the router's link, the veth takes host A's \
             segmentation offload away, and host A cuts its segments itself.\n\n\
             | family | engine | Gbit/s |\n|---|---|---:|"
        );
        for f in &tcp {
            let _ = writeln!(
                md,
                "| IPv{} | {} | {} |",
                f["family"],
                f["engine"].as_str().unwrap_or("?"),
                show(num(&f["gbit_per_s"]), 2)
            );
        }
        md.push('\n');
    }
    md
}

/// Draws the run's plots into `dir`: rate by cores, cost by vector size; the files
/// written.
pub fn plots(figures: &[Value], dir: &std::path::Path) -> Result<Vec<std::path::PathBuf>, String> {
    let mut written = Vec::new();
    let series = |metric: &str, x: &str, y: &str| -> Vec<(String, Vec<(f64, f64)>)> {
        [4u64, 6]
            .into_iter()
            .map(|fam| {
                let mut pts: Vec<(f64, f64)> = of(figures, "pipeline", Some(metric))
                    .filter(|f| f["family"] == fam)
                    .filter_map(|f| Some((f[x].as_f64()?, num(&f[y])?)))
                    .collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                (format!("IPv{fam}"), pts)
            })
            .filter(|(_, p)| !p.is_empty())
            .collect()
    };
    for (stem, title, metric, x, y, x_desc, y_desc, log_x) in [
        (
            "pipeline-cores",
            "In memory: forwarding rate by cores",
            "packet",
            "threads",
            "mpps",
            "threads (one core each)",
            "Mpps",
            false,
        ),
        (
            "pipeline-vector",
            "In memory: cost by vector size, one core",
            "vector",
            "vector",
            "ns_per_packet",
            "packets per vector (log)",
            "ns per packet",
            true,
        ),
    ] {
        let s = series(metric, x, y);
        if s.is_empty() {
            continue;
        }
        let path = dir.join(format!("{stem}.svg"));
        line_plot(&path, title, x_desc, y_desc, &s, log_x)?;
        written.push(path);
    }
    let bars = component_bars(figures);
    if !bars.is_empty() {
        let path = dir.join("pipeline-components.svg");
        stacked_bars(
            &path,
            "Forwarding a packet by component: the kernel over veth, fibre in memory",
            &bars,
        )?;
        written.push(path);
    }
    Ok(written)
}

/// The parts each bar of the component plot stacks, bottom up.
const BAR_PARTS: [&str; 5] = ["routing", "conntrack", "NAT", "filter", "forwarding"];

/// The component plot's bars: for each family and configuration without rules
/// (forwarding alone, tracked, masquerade), the kernel's frame by component
/// (`veth-components`) and fibre's packet in memory (the connections study, one
/// connection: its route stage as routing, conntrack stage (destination NAT's and
/// tracking) as conntrack, filter stage (source NAT's and the confirm) as filter, the
/// rest as forwarding). Each: its label, and ns by [`BAR_PARTS`].
fn component_bars(figures: &[Value]) -> Vec<(String, [f64; 5])> {
    let mut bars = Vec::new();
    for fam in [4u64, 6] {
        for config in ["forwarding", "tracked", "masquerade"] {
            let kernel = figures.iter().find(|f| {
                f["study"] == "veth-components" && f["family"] == fam && f["config"] == config
            });
            if let Some(c) = kernel.map(|f| &f["components"]).filter(|c| c.is_object()) {
                let part = |n: &str| num(&c[n]).unwrap_or(0.0);
                bars.push((
                    format!("kernel IPv{fam} {config}"),
                    [
                        part("routing"),
                        part("conntrack"),
                        part("nat"),
                        part("filter"),
                        part("forwarding"),
                    ],
                ));
            }
            let fibre = figures.iter().find(|f| {
                f["study"] == "pipeline"
                    && f["metric"] == "connections"
                    && f["family"] == fam
                    && f["connections"] == 1
                    && f["mode"] == config
            });
            if let Some(f) = fibre {
                let part = |n: &str| num(&f[n]).unwrap_or(0.0);
                let (route, conntrack, filter) =
                    (part("route_ns"), part("conntrack_ns"), part("filter_ns"));
                let rest = (part("forwarding_ns") - route - conntrack - filter).max(0.0);
                bars.push((
                    format!("fibre IPv{fam} {config}"),
                    [route, conntrack, 0.0, filter, rest],
                ));
            }
        }
    }
    bars
}

/// A plot of `bars` (a label, and ns by [`BAR_PARTS`]), each stacked bottom up.
fn stacked_bars(
    path: &std::path::Path,
    title: &str,
    bars: &[(String, [f64; 5])],
) -> Result<(), String> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    let top = bars
        .iter()
        .map(|(_, p)| p.iter().sum::<f64>())
        .fold(0.0, f64::max);
    let root = SVGBackend::new(path, (1100, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let colors = [
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        RGBColor(44, 160, 44),
        RGBColor(255, 127, 14),
        RGBColor(150, 150, 150),
    ];
    let n = bars.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(150)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5..n as f64 - 0.5, 0.0..top * 1.15)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            let k = x.round();
            if (x - k).abs() < 1e-6 && k >= 0.0 && (k as usize) < n {
                bars[k as usize].0.clone()
            } else {
                String::new()
            }
        })
        .x_label_style(
            ("sans-serif", 12)
                .into_font()
                .transform(FontTransform::Rotate90),
        )
        .y_desc("ns a packet (the kernel: a frame of its core)")
        .draw()
        .map_err(|e| err(&e))?;
    for (k, name) in BAR_PARTS.iter().enumerate() {
        let color = colors[k];
        chart
            .draw_series(bars.iter().enumerate().map(|(i, (_, parts))| {
                let below: f64 = parts[..k].iter().sum();
                let x = i as f64;
                Rectangle::new(
                    [(x - 0.35, below), (x + 0.35, below + parts[k])],
                    color.filled(),
                )
            }))
            .map_err(|e| err(&e))?
            .label(*name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// A line plot of `series` (a name and its points), y from zero.
fn line_plot(
    path: &std::path::Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[(String, Vec<(f64, f64)>)],
    log_x: bool,
) -> Result<(), String> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    let pts = series.iter().flat_map(|(_, p)| p.iter());
    let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, 0.0f64);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        return Ok(());
    }
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let colors = [RGBColor(31, 119, 180), RGBColor(214, 39, 40)];
    macro_rules! draw {
        ($chart:expr) => {{
            let mut chart = $chart.map_err(|e| err(&e))?;
            chart
                .configure_mesh()
                .x_desc(x_desc)
                .y_desc(y_desc)
                .x_label_formatter(&|x| format!("{x:.0}"))
                .draw()
                .map_err(|e| err(&e))?;
            for (k, (name, p)) in series.iter().enumerate() {
                let color = colors[k % colors.len()];
                chart
                    .draw_series(LineSeries::new(p.iter().copied(), color.stroke_width(2)))
                    .map_err(|e| err(&e))?
                    .label(name.as_str())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                    });
                chart
                    .draw_series(p.iter().map(|q| Circle::new(*q, 3, color.filled())))
                    .map_err(|e| err(&e))?;
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(|e| err(&e))?;
        }};
    }
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70);
    if log_x {
        draw!(builder.build_cartesian_2d((x0.max(1.0)..x1 * 1.5).log_scale(), 0.0..y1 * 1.15));
    } else {
        draw!(builder.build_cartesian_2d((x0 - 0.2)..(x1 + 0.2), 0.0..y1 * 1.15));
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// The table of [`connections_by_workers`]: per family, number of connections and of
/// threads, the rate with a table each and with one shared, and their ratio.
fn connections_by_workers_table(figures: &[Value], md: &mut String) {
    let rows: Vec<&Value> = of(figures, "pipeline", Some("connections-workers")).collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "## In memory, by threads: a table each, packets handed over, or one table shared\n\n\
         The connections study's `masquerade, 1000 rules`, each thread on a core of its own \
         reading flows of its own. Its connections tracked in a table of each thread's own, \
         every packet read by the thread that owns its connection (the best steering could \
         give); in a table each, connections owned by the thread their tuple hashes to and \
         the packets another thread reads handed to it through its mailbox, as the daemon's \
         workers do (`handed`: the share of packets handed over, and those a full mailbox \
         dropped); or in one table every thread takes once a vector. Millions of packets a \
         second forwarded, all threads' packets over the wall time (those a full mailbox \
         dropped left out).\n"
    );
    let _ = writeln!(
        md,
        "| family | connections | threads | a table each, Mpps | handed over, Mpps | handed / each | handed, dropped | one shared, Mpps | shared / each |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for f in rows.iter().filter(|f| f["table"] == "own") {
        let other = |table: &str| {
            rows.iter().find(|g| {
                g["table"] == table
                    && g["family"] == f["family"]
                    && g["connections"] == f["connections"]
                    && g["threads"] == f["threads"]
            })
        };
        let own = num(&f["mpps"]);
        let (handed, shared) = (other("handed"), other("shared"));
        let rate = |g: Option<&&Value>| g.and_then(|g| num(&g["mpps"]));
        let ratio = |g: Option<f64>| own.zip(g).map(|(a, b)| b / a);
        let share = handed.map_or("–".to_string(), |g| {
            let read = num(&g["packets_read"]).unwrap_or(0.0);
            let h = num(&g["handed"]).unwrap_or(0.0);
            let share = if read > 0.0 { 100.0 * h / read } else { 0.0 };
            format!("{share:.0}%, {}", g["handoff_dropped"])
        });
        let _ = writeln!(
            md,
            "| IPv{} | {} | {} | {} | {} | {} | {} | {} | {} |",
            f["family"],
            f["connections"],
            f["threads"],
            show(own, 2),
            show(rate(handed), 2),
            show(ratio(rate(handed)), 2),
            share,
            show(rate(shared), 2),
            show(ratio(rate(shared)), 2)
        );
    }
    let _ = writeln!(md);
}

/// The kernel's masquerade taken apart by the connections it holds
/// (`veth-components-flows`), beside fibre's packet masqueraded in memory at as many
/// connections (the connections study).
fn components_by_connections(figures: &[Value], md: &mut String) {
    let kernel: Vec<&Value> = figures
        .iter()
        .filter(|f| f["study"] == "veth-components-flows")
        .collect();
    if kernel.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "## The kernel's masquerade by its connections, beside fibre's\n\n\
         The kernel masquerading over veth (the component model's `masquerade` \
         configuration) with that many UDP connections, each made before the \
         measurement (every flow's frame sent once) and found after: what a frame costs \
         the router's core, and that time by component, taken as the component model \
         takes it; `tracked`, the kernel's connections once they were made (two flows \
         that share a tuple make one). fibre: a packet masqueraded in memory, one core, \
         as many flows (the connections study's `masquerade`; everything but receive \
         and output).\n"
    );
    let _ = writeln!(
        md,
        "| family | flows | tracked | kernel ns a frame | routing | conntrack | filter | NAT | forwarding | fibre ns a packet | kernel / fibre |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let mut notes = Vec::new();
    for f in &kernel {
        let fam = f["family"].as_u64().unwrap_or(0);
        let n = f["connections"].as_u64().unwrap_or(0);
        let ns = num(&f["core_ns_per_frame"]);
        let part = |name: &str| num(&f["components"][name]);
        let fibre = figures
            .iter()
            .find(|g| {
                g["study"] == "pipeline"
                    && g["metric"] == "connections"
                    && g["family"] == fam
                    && g["connections"] == n
                    && g["mode"] == "masquerade"
            })
            .and_then(|g| num(&g["forwarding_ns"]));
        let ratio = match (ns, fibre) {
            (Some(k), Some(p)) if p > 0.0 => Some(k / p),
            _ => None,
        };
        let _ = writeln!(
            md,
            "| IPv{fam} | {n} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            f["tracked"]
                .as_u64()
                .map_or("–".to_string(), |t| t.to_string()),
            show(ns, 0),
            show(part("routing"), 0),
            show(part("conntrack"), 0),
            show(part("filter"), 0),
            show(part("nat"), 0),
            show(part("forwarding"), 0),
            show(fibre, 1),
            show(ratio, 1),
        );
        if let Some(why) = f["attribution_error"].as_str() {
            notes.push(format!("IPv{fam}, {n} connections: no components: {why}."));
        }
    }
    let _ = writeln!(md);
    for n in notes {
        let _ = writeln!(md, "{n}\n");
    }
}

/// The component model's section of the report: the kernel's forwarding in each
/// configuration (`veth-components`), its time a frame by component, and beside the
/// last configuration the cost the model predicts from the components measured apart
/// (the configuration before it, plus each rule's cost from the filter study over
/// veth), and the rate one core would forward at each; fibre's packets in memory in the
/// same configurations (one connection) and the model's prediction for them alike.
fn component_model(figures: &[Value], md: &mut String) {
    let kernel: Vec<&Value> = figures
        .iter()
        .filter(|f| f["study"] == "veth-components")
        .collect();
    if kernel.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "## The component model: the kernel's forwarding by component, beside fibre's\n\n\
         The kernel forwarding over veth (the veth study's topology, at a rate it keeps \
         up with) in four configurations, each adding a component: forwarding alone; \
         connections tracked (a forward rule reads their state); masqueraded out of host \
         B's link; behind rules at the forward hook that no frame matches. What a frame \
         costs the router's core, and that time by component: the core sampled by \
         `perf` (software clock) in a trial of its own, each sample put to the outermost \
         function on its call chain that is one of conntrack's (`nf_conntrack_in`, the \
         confirm), NAT's (`nf_nat_*`), the filter's (`nft_do_chain`) or routing's (the \
         FIB's lookups); the rest is forwarding's own. The model predicts the last \
         configuration's cost as the one before it plus its rules' cost, each rule's \
         measured apart (the filter study over veth); the rate is what one core would \
         forward at that cost. fibre: a packet in memory, one core, one connection (the \
         connections study), in the same configurations, and its model alike (the \
         filter study's rules, with blocks).\n"
    );
    let _ = writeln!(
        md,
        "| family | configuration | kernel ns a frame | routing | conntrack | filter | NAT | forwarding | kernel, model's ns | kernel Mpps a core, measured / model | fibre ns a packet | fibre, model's ns |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let mpps = |ns: Option<f64>| ns.filter(|&n| n > 0.0).map(|n| 1e3 / n);
    let mut notes = Vec::new();
    for f in &kernel {
        let fam = f["family"].as_u64().unwrap_or(0);
        let config = f["config"].as_str().unwrap_or("");
        let rules = f["rules"].as_u64().unwrap_or(0);
        let ns = num(&f["core_ns_per_frame"]);
        let part = |name: &str| num(&f["components"][name]);
        // The model: the configuration before plus its rules, for the last one.
        let last = config.starts_with("masquerade,");
        let before = |config: &str| {
            kernel
                .iter()
                .find(|g| g["family"] == fam && g["config"] == config)
                .and_then(|g| num(&g["core_ns_per_frame"]))
        };
        let filter_rule = |n: u64| {
            figures
                .iter()
                .find(|g| g["study"] == "veth-filter" && g["family"] == fam && g["rules"] == n)
                .and_then(|g| num(&g["core_ns_per_frame"]))
        };
        let n = rules.saturating_sub(1);
        let per_rule = match (filter_rule(n), filter_rule(0)) {
            (Some(a), Some(b)) if n > 0 => Some((a - b) / n as f64),
            _ => None,
        };
        let model = match (last, before("masquerade"), per_rule) {
            (true, Some(b), Some(r)) => Some(b + r * n as f64),
            _ => None,
        };
        let fibre = |mode: &str| {
            figures
                .iter()
                .find(|g| {
                    g["study"] == "pipeline"
                        && g["metric"] == "connections"
                        && g["family"] == fam
                        && g["connections"] == 1
                        && g["mode"] == mode
                })
                .and_then(|g| num(&g["forwarding_ns"]))
        };
        let fibre_filter = |n: u64| {
            figures
                .iter()
                .find(|g| {
                    g["study"] == "pipeline"
                        && g["metric"] == "filter"
                        && g["family"] == fam
                        && g["rules"] == n
                        && g["mode"] == "blocks"
                })
                .and_then(|g| num(&g["filter_ns"]))
        };
        let fibre_model = match (last, fibre("masquerade"), fibre_filter(n), fibre_filter(0)) {
            (true, Some(b), Some(with), Some(without)) => Some(b + with - without),
            _ => None,
        };
        let measured_mpps = mpps(ns).map_or("–".into(), |m| format!("{m:.3}"));
        let model_mpps = mpps(model).map_or("–".into(), |m| format!("{m:.3}"));
        let _ = writeln!(
            md,
            "| IPv{fam} | {config} | {} | {} | {} | {} | {} | {} | {} | {measured_mpps} / {model_mpps} | {} | {} |",
            show(ns, 0),
            show(part("routing"), 0),
            show(part("conntrack"), 0),
            show(part("filter"), 0),
            show(part("nat"), 0),
            show(part("forwarding"), 0),
            show(model, 0),
            show(if config == "forwarding" { None } else { fibre(config) }, 1),
            show(fibre_model, 1),
        );
        if let Some(why) = f["attribution_error"].as_str() {
            notes.push(format!("IPv{fam}, {config}: no components: {why}."));
        }
    }
    let _ = writeln!(md);
    for n in notes {
        let _ = writeln!(md, "{n}\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fibre_lpm::Prefix;

    fn p4(s: &str) -> Prefix<u32> {
        s.parse().unwrap()
    }

    fn p6(s: &str) -> Prefix<u128> {
        s.parse().unwrap()
    }

    #[test]
    fn generated_frames_are_forwarded_through_their_routes_gateways() {
        let v4 = [
            p4("198.51.100.0/24"),
            p4("203.0.113.0/25"),
            p4("192.0.2.0/24"),
        ];
        let v6 = [p6("2001:db8::/32"), p6("2001:db8:1::/48")];
        let router = Router::new(&v4, &v6).unwrap();
        let cfg = PipelineConfig {
            flows: 500,
            ..PipelineConfig::default()
        };
        for flows in [
            Flows::new(&router, &v4, &cfg),
            Flows::new(&router, &v6, &cfg),
        ] {
            assert_eq!(flows.left_out, 0, "every matched address is routed");
            assert_eq!(flows.frames.len(), 500);
            let mut lane = Lane::new(
                &router,
                &flows.frames,
                flows.len,
                1024,
                0,
                &Firewall::default(),
                0,
            );
            assert_eq!(lane.forward(1000, 64), 1000);
            assert_eq!(lane.strays, 0);
            let p = &lane.pipeline;
            assert_eq!((p.input.packets, p.output.packets), (1000, 1000));
            assert_eq!(p.fates[&Fate::Out(router.output)], 1000);
            // The frames as the output stage saw them: TTL down, gateway's MAC.
            let mut pool = Pool::new(4, 2048);
            let mut ids = Vec::new();
            pool.alloc(1, &mut ids);
            pool.fill(ids[0], &flows.frames[0][..flows.len]);
            let mut fates = Vec::new();
            let mut p = Pipeline::new();
            p.run(
                &router.snapshot,
                &router.neighbours,
                router.arrival,
                &mut pool,
                &ids,
                &mut fates,
            );
            let f = pool.frame(ids[0]);
            assert_eq!(&f[6..12], &OUTPUT_MAC);
            assert_eq!(&f[0..4], &[0x02, 0xf2, 0, 0]);
            let ttl = if flows.family == 4 { f[22] } else { f[21] };
            assert_eq!(ttl, 63);
            if flows.family == 4 {
                assert!(checksum::holds(&f[14..34]), "header checksum updated");
            }
        }
    }

    #[test]
    fn frames_the_router_does_not_forward_are_left_out() {
        // A route covering the router's own subnets: some flows go to its own address
        // or to a link's subnet, not through a gateway.
        let v4 = [p4("10.199.0.0/30"), p4("198.51.100.0/24")];
        let router = Router::new(&v4, &[]).unwrap();
        let cfg = PipelineConfig {
            flows: 400,
            ..PipelineConfig::default()
        };
        let flows = Flows::new(&router, &v4, &cfg);
        assert!(flows.left_out > 0, "10.199.0.1 is the router's own");
        assert_eq!(flows.frames.len() + flows.left_out, 400);
    }

    #[test]
    fn the_report_has_a_row_per_thread_count_and_vector_size() {
        let figures = vec![
            json!({"study": "pipeline", "family": 4, "metric": "packet", "threads": 2,
                   "vector": 256, "ns_per_packet": 80.0, "mpps": 25.0, "mpps_per_core": 12.5}),
            json!({"study": "pipeline", "family": 4, "metric": "packet", "threads": 1,
                   "vector": 256, "ns_per_packet": 80.0, "mpps": 12.5, "mpps_per_core": 12.5}),
            json!({"study": "pipeline", "family": 6, "metric": "vector", "threads": 1,
                   "vector": 16, "ns_per_packet": 120.5}),
            json!({"study": "pipeline", "family": 4, "metric": "vector", "threads": 1,
                   "vector": 16, "ns_per_packet": null}),
        ];
        let md = markdown(&figures);
        assert!(
            md.contains(
                "| threads | IPv4 Mpps | IPv4 Mpps per core | IPv6 Mpps | IPv6 Mpps per core |"
            ),
            "{md}"
        );
        let one = md.find("| 1 | 12.50 | 12.50 | – | – |").expect(&md);
        let two = md.find("| 2 | 25.00 | 12.50 | – | – |").expect(&md);
        assert!(one < two, "rows in order of threads");
        assert!(md.contains("| 16 | – | 120.50 |"), "{md}");
    }

    #[test]
    fn the_workers_table_sets_a_shared_table_beside_a_table_each() {
        let row = |threads: u64, table: &str, mpps: f64| {
            json!({"study": "pipeline", "family": 4, "metric": "connections-workers",
                   "threads": threads, "connections": 1000, "table": table, "mpps": mpps})
        };
        let mut handed = row(2, "handed", 12.0);
        handed["packets_read"] = json!(1000);
        handed["handed"] = json!(500);
        handed["handoff_dropped"] = json!(3);
        let figures = vec![
            row(1, "own", 8.0),
            row(1, "shared", 8.0),
            row(2, "own", 16.0),
            row(2, "shared", 4.0),
            handed,
            // A table each without the others: shown, with no ratio.
            json!({"study": "pipeline", "family": 6, "metric": "connections-workers",
                   "threads": 2, "connections": 1000, "table": "own", "mpps": 15.0}),
        ];
        let md = markdown(&figures);
        assert!(
            md.contains("| IPv4 | 1000 | 1 | 8.00 | – | – | – | 8.00 | 1.00 |"),
            "{md}"
        );
        assert!(
            md.contains("| IPv4 | 1000 | 2 | 16.00 | 12.00 | 0.75 | 50%, 3 | 4.00 | 0.25 |"),
            "{md}"
        );
        assert!(
            md.contains("| IPv6 | 1000 | 2 | 15.00 | – | – | – | – | – |"),
            "{md}"
        );
    }

    /// The component model's table: the kernel's components as measured, the model's
    /// prediction for the last configuration (the one before plus its rules at what
    /// each costs over veth), its rate, and fibre's beside it.
    #[test]
    fn the_component_model_predicts_from_the_parts() {
        let kernel = |config: &str, rules: u64, ns: f64| {
            json!({"study": "veth-components", "engine": "kernel", "family": 4,
                   "config": config, "rules": rules, "core_ns_per_frame": ns,
                   "components": {"routing": 100.0, "conntrack": 200.0, "filter": 300.0,
                                  "nat": 400.0, "forwarding": ns - 1000.0}})
        };
        let fibre = |mode: &str, ns: f64| {
            json!({"study": "pipeline", "metric": "connections", "family": 4,
                   "connections": 1, "mode": mode, "forwarding_ns": ns})
        };
        let figures = vec![
            kernel("forwarding", 0, 2000.0),
            kernel("tracked", 1, 2500.0),
            kernel("masquerade", 1, 3000.0),
            kernel("masquerade, 1000 rules", 1001, 30000.0),
            json!({"study": "veth-filter", "family": 4, "rules": 0, "core_ns_per_frame": 2000.0}),
            json!({"study": "veth-filter", "family": 4, "rules": 1000, "core_ns_per_frame": 28000.0}),
            fibre("masquerade", 300.0),
            fibre("masquerade, 1000 rules", 360.0),
            json!({"study": "pipeline", "metric": "filter", "family": 4, "rules": 0,
                   "mode": "blocks", "filter_ns": 20.0}),
            json!({"study": "pipeline", "metric": "filter", "family": 4, "rules": 1000,
                   "mode": "blocks", "filter_ns": 70.0}),
        ];
        let bars = component_bars(&figures);
        let labels: Vec<&str> = bars.iter().map(|b| b.0.as_str()).collect();
        assert_eq!(
            labels,
            [
                "kernel IPv4 forwarding",
                "kernel IPv4 tracked",
                "kernel IPv4 masquerade",
                "fibre IPv4 masquerade"
            ]
        );
        assert_eq!(bars[2].1, [100.0, 200.0, 400.0, 300.0, 2000.0]);
        let dir = std::env::temp_dir().join(format!("fibre-components-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.svg");
        stacked_bars(&path, "t", &bars).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("conntrack") && svg.contains("kernel IPv4 tracked"));
        std::fs::remove_dir_all(dir).ok();
        let mut md = String::new();
        component_model(&figures, &mut md);
        // 3000 + 1000 × 26 = 29,000 ns: 0.0345 Mpps against 0.0333 measured; fibre's
        // 300 + 50.
        assert!(
            md.contains("| IPv4 | masquerade, 1000 rules | 30000 | 100 | 200 | 300 | 400 | 29000 | 29000 | 0.033 / 0.034 | 360.0 | 350.0 |"),
            "{md}"
        );
        assert!(md.contains("| IPv4 | forwarding | 2000 | 100 | 200 | 300 | 400 | 1000 | – | 0.500 / – | – | – |"), "{md}");
    }

    #[test]
    fn the_udp_checksums_are_right_and_stay_right_on_other_ports() {
        let f = udp_frame_v6(
            [0; 6],
            [0; 6],
            "fd00::1".parse().unwrap(),
            "2001:db8::1".parse().unwrap(),
            (1000, 53),
        );
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&f[22..54]);
        pseudo.extend_from_slice(&8u32.to_be_bytes());
        pseudo.extend_from_slice(&17u32.to_be_bytes());
        pseudo.extend_from_slice(&f[54..62]);
        assert!(checksum::holds(&pseudo));
        let f4 = udp_frame_v4(
            [0; 6],
            [0; 6],
            "10.0.0.1".parse().unwrap(),
            "192.0.2.1".parse().unwrap(),
            (1, 2),
        );
        assert!(checksum::holds(&f4[14..34]));
        assert_eq!(f4.len(), 60);
        let mut pseudo = f4[26..34].to_vec();
        pseudo.extend_from_slice(&[0, 17, 0, 26]);
        pseudo.extend_from_slice(&f4[34..60]);
        assert_ne!(&f4[40..42], &[0, 0], "a UDP checksum sent");
        assert!(checksum::holds(&pseudo));
        // Other connections' frames: the source port moved, the checksum kept right.
        for round in [1, 2, 500, 9000] {
            let mut g = f4.clone();
            other_source_port(&mut g, round);
            assert_ne!(g[34..36], f4[34..36]);
            let mut pseudo = g[26..34].to_vec();
            pseudo.extend_from_slice(&[0, 17, 0, 26]);
            pseudo.extend_from_slice(&g[34..60]);
            assert!(checksum::holds(&pseudo), "round {round}");
        }
    }
}
