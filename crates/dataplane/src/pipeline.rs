//! The stages over a vector of packets from one link: input, route, neighbour, filter,
//! rewrite.
//!
//! Each stage runs over the whole vector before the next starts, as VPP's graph nodes
//! do, so that a stage's code and data stay in cache across the vector and the route
//! stage can search the FIB for all of the vector's flows together
//! ([`Snapshot::lookup_vector_v4`]). Each stage is timed once per vector
//! ([`crate::runtime`]); each packet's fate is counted. Every header is read and
//! written through the typed views of `fibre-headers`.
//!
//! Each stage is a module of its own, a method of [`Pipeline`] over the vector, and
//! [`Pipeline::run`] calls them in order:
//!
//! - input (`classify`): the frame checked and sorted ([`crate::input`]);
//! - conntrack (`connections`): where the ruleset tracks connections, each packet's
//!   connection found or made, the prerouting chains and destination NAT;
//! - route (`route`): the FIB's answer for the flow as it arrived on the link, rules and all;
//!   this host's own destinations go to the kernel;
//! - neighbour (`neighbour`): the TTL or hop limit and the MTU checked, the next hop's MAC address found
//!   (without one, the packet goes to the kernel, which resolves it). What a hop of the
//!   searched table comes to (its link, MTU and MAC addresses: VPP's adjacency) is made
//!   once and kept from vector to vector while the snapshot and the neighbour table stay
//!   the same, so that most packets find theirs by the route stage's answer id alone;
//! - filter (`filter`): the router's stateless filter rules ([`fibre_firewall::Filter`]) at the
//!   prerouting, forward and postrouting hooks, for the packets to send, and at
//!   prerouting for those to answer with an error; what they drop is neither sent nor
//!   answered. The stage runs only while the rules hold something;
//! - rewrite (`rewrite`): TTL or hop limit down by one, MAC addresses set, the output link named;
//!   an IPv4 packet over the MTU without DF cut into fragments (`crate::fragment`),
//!   the later ones in buffers of their own;
//! - icmp (`answer`): the packets the route and neighbour stages refused for a reason the kernel
//!   answers (no route, an unreachable or prohibit route, the TTL run out, over the MTU)
//!   made, in their own buffers, into the ICMP or ICMPv6 error the kernel would send back
//!   ([`crate::icmp`]), within its limits. The stage runs only on vectors that have such
//!   packets.
//!
//! Taking frames in and sending them out is the caller's (a worker's sockets, a capture
//! offline, memory in the benchmark), which counts what it costs in the pipeline's
//! `receive` and `output` counters, so that `show runtime` covers a packet's whole way;
//! [`Output`] sorts a vector's frames by the link they leave by.
//!
//! Not yet: no redirects are sent for packets that leave by the link they came in on
//! (the kernel sends them, and forwards the packet as fibre does).

use crate::claims::Claims;
use crate::icmp::{self, RateLimit};
pub use crate::input::Arrival;
use crate::input::{self, Input};
use crate::pool::{BufferId, Pool};
use crate::runtime::StageCounters;
use fibre_conntrack::{Conntrack, Epoch, Tracked, Tuple, Untrackable};
use fibre_fib::{LinkIndex, NoRoute, Snapshot, VectorAnswers};
use fibre_firewall::Filter;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Instant;

mod answer;
mod classify;
mod connections;
mod filter;
mod neighbour;
mod rewrite;
mod route;

use neighbour::{Adjacencies, NeighbourCache};

/// The neighbour table the neighbour stage reads: the MAC address of `addr` on `link`.
pub trait Neighbours {
    /// The MAC address, if the entry is usable.
    fn mac(&self, link: LinkIndex, addr: IpAddr) -> Option<[u8; 6]>;

    /// A number that changes whenever the table's answers may change: while it stays
    /// the same, the pipeline keeps the answers it got, vector after vector. `None`
    /// (the default): it keeps none past a vector.
    fn version(&self) -> Option<u64> {
        None
    }
}

/// An address as one 128-bit number: IPv6 as it is, IPv4 as its IPv4-mapped IPv6 form
/// (which no link's neighbour has), so that both families key one table.
#[inline]
pub fn address_bits(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(a) => a.to_ipv6_mapped().to_bits(),
        IpAddr::V6(a) => a.to_bits(),
    }
}

/// The address whose [`address_bits`] are `bits`.
#[inline]
pub fn address_of_bits(bits: u128) -> IpAddr {
    let v6 = Ipv6Addr::from_bits(bits);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

impl<F: Fn(LinkIndex, IpAddr) -> Option<[u8; 6]>> Neighbours for F {
    fn mac(&self, link: LinkIndex, addr: IpAddr) -> Option<[u8; 6]> {
        self(link, addr)
    }
}

/// Why a packet went to the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Handed {
    /// The input stage's reason.
    Input(input::Kernel),
    /// For this host (a local, broadcast, anycast or multicast route).
    Local,
    /// No usable neighbour entry for the next hop: the kernel resolves it.
    Unresolved,
    /// Of a family whose connections are tracked, but not fibre's to track: a fragment
    /// (which the kernel reassembles first), or a protocol with a tracker of the
    /// kernel's that fibre does not have.
    Untrackable(Untrackable),
}

/// Why a packet was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dropped {
    /// The input stage's reason.
    Input(input::Drop),
    /// The FIB's answer: no route, a reject route or rule, a martian source.
    NoRoute(NoRoute),
    /// The TTL or hop limit would reach 0.
    TtlExpired,
    /// Longer than the route's or the output link's MTU: IPv6, or IPv4 with DF.
    TooBig,
    /// IPv4 without DF, longer than the MTU, and the pool had no buffers left for its
    /// fragments (or the MTU no room for one).
    NoBufferToFragment,
    /// IPv4 without DF, left whole by its sender (GSO), whose segments are longer than
    /// the MTU: the kernel cuts it into segments and those into fragments; fibre does
    /// not yet.
    SegmentsOverMtu,
    /// IPv6: a source that must not leave its link (unspecified; link-local, answered
    /// with "beyond scope").
    SourceScope,
    /// The route names a link the snapshot does not hold.
    NoLink,
    /// Dropped by the router's filter rules (a drop verdict or policy at prerouting,
    /// forward or postrouting).
    Filtered,
    /// The connection table is full (`nf_conntrack_max`) and no connection could be
    /// dropped early to make room: the kernel drops the packet.
    ConntrackFull,
}

/// Where a packet went.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fate {
    /// Rewritten, to be sent out of this link.
    Out(LinkIndex),
    /// Rewritten and cut into fragments (IPv4 without DF, over the MTU): the buffer holds
    /// the first, [`Pipeline::fragments`] the others, to be sent out of this link after
    /// it.
    Fragmented(LinkIndex),
    /// Answered: the buffer now holds the ICMP or ICMPv6 error sent back to the packet's
    /// source, to be sent out of the link.
    Icmp(icmp::Error, LinkIndex),
    /// Rejected with a TCP reset: the buffer now holds the reset sent back to the
    /// segment's source, to be sent out of the link.
    Reset(LinkIndex),
    /// To the kernel, untouched.
    Kernel(Handed),
    /// Dropped.
    Drop(Dropped),
    /// Another worker's, untouched: the worker that owns the packet's connection
    /// ([`fibre_conntrack::Owners`]), which tracks it.
    Handoff(u16),
}

impl Fate {
    /// The link the packet's buffer is to be sent out of, if it is to be sent.
    pub fn output(&self) -> Option<LinkIndex> {
        match *self {
            Fate::Out(link) | Fate::Fragmented(link) | Fate::Icmp(_, link) | Fate::Reset(link) => {
                Some(link)
            }
            _ => None,
        }
    }
}

/// The output stage's sorting: the buffers of a vector to send, by the link they leave
/// by, in the order they came. A router has a few links, so the queues are a short list
/// searched in order, made once and reused.
#[derive(Default)]
pub struct Output {
    queues: Vec<(LinkIndex, Vec<BufferId>)>,
}

impl Output {
    /// Queues `id` to leave by `link`.
    #[inline]
    pub fn push(&mut self, link: LinkIndex, id: BufferId) {
        match self.queues.iter_mut().find(|(l, _)| *l == link) {
            Some((_, q)) => q.push(id),
            None => self.queues.push((link, vec![id])),
        }
    }

    /// The queues, each a link and its buffers (empty queues included: they are kept
    /// for the next vector).
    pub fn queues(&mut self) -> impl Iterator<Item = (LinkIndex, &mut Vec<BufferId>)> {
        self.queues.iter_mut().map(|(l, q)| (*l, q))
    }

    /// Buffers queued on every link.
    pub fn len(&self) -> usize {
        self.queues.iter().map(|(_, q)| q.len()).sum()
    }

    /// Whether no buffer is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why a packet the kernel would answer with an error was not answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unanswered {
    /// The packet is one the kernel does not answer (an ICMP error, a later fragment).
    pub not_answered: u64,
    /// Over the limits on errors.
    pub rate_limited: u64,
    /// No unicast route back to the packet's source, or no source address for it.
    pub no_route_back: u64,
    /// No MAC address for the way back.
    pub unresolved: u64,
    /// A TCP reset the kernel's NAT would drop: a `nat` chain drops it, or it leaves a
    /// masqueraded connection's link.
    pub dropped_by_nat: u64,
}

/// The stages, their counters, and the room they work in (made once, reused).
#[derive(Default)]
pub struct Pipeline {
    /// What taking the frames in cost (the system call that received them, or the copy
    /// that stands for it), counted by the caller that does it.
    pub receive: StageCounters,
    /// The input stage's cost.
    pub input: StageCounters,
    /// The conntrack stage's cost (over the packets it tracked): tracking, the
    /// prerouting rules, destination NAT.
    pub conntrack_stage: StageCounters,
    /// The route stage's cost.
    pub route: StageCounters,
    /// The neighbour stage's cost.
    pub neighbour: StageCounters,
    /// The filter stage's cost (over the packets it put through the router's rules).
    pub filter: StageCounters,
    /// The rewrite stage's cost.
    pub rewrite: StageCounters,
    /// The ICMP stage's cost (over the packets it answered or refused).
    pub icmp: StageCounters,
    /// What sending the frames out cost (sorted by link with [`Output`], and the system
    /// call that sends them, or what stands for it), counted by the caller that does it.
    pub output: StageCounters,
    /// Packets by fate.
    pub fates: HashMap<Fate, u64>,
    /// Packets the kernel would answer with an error that got none, by reason.
    pub unanswered: Unanswered,
    /// The limits on errors (a worker's shares its overall limit with the others').
    pub limit: RateLimit,
    /// IPv6 packets with no route, or a reject route, are left unanswered: the kernel
    /// answers them itself, forwarding on or off (`ip6_pkt_discard`), when it sees every
    /// frame fibre does (a packet socket's link).
    pub kernel_answers_ipv6_rejects: bool,
    /// The kernel sees every frame fibre does and runs its prerouting chains on its
    /// copy: a `reject` there, it answers itself.
    pub kernel_rejects_at_prerouting: bool,
    /// The next hops of the last vector that had no MAC address (a link, an address),
    /// for the kernel to be asked to resolve.
    pub unresolved: Vec<(LinkIndex, IpAddr)>,
    /// When each packet of the vector about to run was received, in nanoseconds, for the
    /// limits on errors to read (a run offline gives its capture's times); empty: the
    /// time the errors are made, on a monotonic clock.
    pub times: Vec<u64>,
    /// The later fragments of the vector's packets whose fate is [`Fate::Fragmented`]:
    /// each its packet's index and a buffer of the pool, in the packets' order and each
    /// packet's in the fragments' order. The caller holds these buffers: it sends each
    /// packet's after the packet's own (its first fragment), by the same link, and gives
    /// back what it does not send.
    pub fragments: Vec<(usize, BufferId)>,
    /// The router's filter rules, as the caller last took them: the filter stage puts
    /// each packet to forward through them.
    pub rules: Arc<Filter>,
    /// The families whose forwarded packets are tracked (bit 0 IPv4, bit 1 IPv6), as
    /// the caller last took them: the kernel's ruleset has it track their connections.
    pub tracked: u8,
    /// The worker's connection table (taken once a vector).
    pub conntrack: Option<Arc<std::sync::Mutex<Conntrack>>>,
    /// The workers' mailboxes, through which the tables tell each other of the
    /// connections whose tuples hash to another worker ([`crate::handoff`]).
    pub mailboxes: Option<Arc<Vec<crate::handoff::Mailbox>>>,
    /// What the table was to tell the others, as the vector ended (its room kept).
    told: Vec<(u16, fibre_conntrack::Forward)>,
    /// The TTL and hop limits of the errors and resets the router makes, as the caller
    /// read them from its namespace.
    pub hops: icmp::Hops,
    /// What tracking made of each packet of the vector (none: not tracked).
    tracks: Vec<Option<Tracked>>,
    /// The epoch the vector's verdicts are kept under ([`fibre_conntrack::Kept`]).
    epoch: Epoch,
    /// For each packet of the vector tracked, what the conntrack stage found of its
    /// kept verdict.
    keeping: Vec<connections::Keeping>,
    /// The map of frames claimed from the kernel's stack (`crate::claims`), if the
    /// links have its program: the tuples of new translated connections that arrive at
    /// an address of this host (the replies of a source translated to one, the
    /// original direction of a destination translated from one) go in as the
    /// connections are confirmed, and out as they end, under the table's lock.
    pub claims: Option<Arc<Claims>>,
    /// Whether to claim this vector's new connections (not where the kernel forwards
    /// the frames itself, from its own copy).
    pub claiming: bool,
    /// Tuples claimed.
    pub claimed: u64,
    /// Tuples the map refused (full).
    pub claims_failed: u64,
    /// Tuples given back, the connections ended.
    released: Vec<Tuple>,
    /// Fragments made (every piece, the first too: the kernel's `FragCreates`).
    pub fragments_made: u64,
    /// Tracked packets whose verdict was kept on their connection: no chain asked at
    /// forward and postrouting, nor at prerouting.
    pub verdicts_kept: u64,
    /// The IP identification of the next IPv4 error.
    ip_id: u16,
    /// The packets to cut into fragments: their index, the MTU of the way on, where
    /// their later fragments' buffers are in `spare`.
    cut: Vec<(usize, u32, std::ops::Range<usize>)>,
    /// A packet being cut, copied out of its buffer, which takes its first fragment.
    whole: Vec<u8>,
    /// Buffers taken for the later fragments of the packets of `cut`, in order.
    spare: Vec<BufferId>,
    /// Packets to answer: their index, the error, the MTU it reports.
    errors: Vec<(usize, icmp::Error, u32)>,
    /// Packets to answer whose destination NAT undid: their index, the address it
    /// gave back, which their error comes from.
    error_sources: Vec<(usize, IpAddr)>,
    /// Packets the prerouting chains rejected, to answer among `errors` once routing
    /// made those.
    rejected: Vec<(usize, icmp::Error, u32)>,
    /// The conntrack stage's packets in the order they came, and those it stopped
    /// (room kept from vector to vector).
    order: Vec<usize>,
    stopped: Vec<bool>,
    /// The filter stage's packets in the order they came (whether each is to send),
    /// those the rules stopped, and those a rule rejected with the error that answers
    /// each (room kept from vector to vector).
    filter_order: Vec<(usize, bool)>,
    failed: Vec<usize>,
    rejects: Vec<(usize, icmp::Error, u32)>,
    /// Segments a rule rejected with a TCP reset: their index, where their TCP header
    /// starts in the IP packet, their connection if tracked, whether at prerouting.
    resets: Vec<(usize, usize, Option<Tracked>, bool)>,
    inputs: Vec<Input>,
    /// For each packet of the vector left whole by its sender (GSO), the length of its
    /// segments' IP packets (the MTU applies to those, as the kernel's
    /// `skb_gso_validate_network_len` applies it); 0 for the others.
    segment_lens: Vec<u32>,
    /// The IPv4 and the IPv6 packets the route stage found a unicast hop for: their
    /// index, and the id of their answer (in `answers4` or `answers6`).
    forward4: Vec<(usize, u32)>,
    forward6: Vec<(usize, u32)>,
    /// The IPv4 packets' and the IPv6 packets' indexes.
    v4: Vec<usize>,
    v6: Vec<usize>,
    dst4: Vec<Ipv4Addr>,
    src4: Vec<Ipv4Addr>,
    dst6: Vec<Ipv6Addr>,
    src6: Vec<Ipv6Addr>,
    answers4: Option<VectorAnswers<'static>>,
    answers6: Option<VectorAnswers<'static>>,
    neighbour_cache: NeighbourCache,
    /// Each family's adjacencies, by the id of the hop they were made for.
    adjacencies: [Adjacencies; 2],
    /// Packets to send: their index, the next hop's MAC address, the output link's.
    next: Vec<(usize, [u8; 6], [u8; 6])>,
}

impl Pipeline {
    /// A pipeline with nothing counted.
    pub fn new() -> Pipeline {
        Pipeline::default()
    }

    /// The stages' counters in order, named.
    pub fn stages(&self) -> [(&'static str, StageCounters); 9] {
        [
            ("receive", self.receive),
            ("input", self.input),
            ("conntrack", self.conntrack_stage),
            ("route", self.route),
            ("neighbour", self.neighbour),
            ("filter", self.filter),
            ("rewrite", self.rewrite),
            ("icmp", self.icmp),
            ("output", self.output),
        ]
    }

    /// The stages' counters, mutably, in [`Pipeline::stages`] order.
    pub fn stages_mut(&mut self) -> [&mut StageCounters; 9] {
        [
            &mut self.receive,
            &mut self.input,
            &mut self.conntrack_stage,
            &mut self.route,
            &mut self.neighbour,
            &mut self.filter,
            &mut self.rewrite,
            &mut self.icmp,
            &mut self.output,
        ]
    }

    /// Adds what `other` counted (its stages, the errors not sent, the fragments made,
    /// the verdicts kept) to what this one counted: another worker's.
    pub fn add_counts(&mut self, other: &mut Pipeline) {
        for (mine, theirs) in self.stages_mut().into_iter().zip(other.stages_mut()) {
            mine.calls += theirs.calls;
            mine.packets += theirs.packets;
            mine.time += theirs.time;
        }
        let u = other.unanswered;
        self.unanswered.not_answered += u.not_answered;
        self.unanswered.rate_limited += u.rate_limited;
        self.unanswered.no_route_back += u.no_route_back;
        self.unanswered.unresolved += u.unresolved;
        self.unanswered.dropped_by_nat += u.dropped_by_nat;
        self.fragments_made += other.fragments_made;
        self.verdicts_kept += other.verdicts_kept;
    }

    /// Runs the stages over `packets` (buffers of `pool`), received as `arrival` says,
    /// with the routes of `snap` and the neighbours of `neighbours`; `fates` gets each
    /// packet's fate, in order. Packets sent out are rewritten in their buffers.
    pub fn run(
        &mut self,
        snap: &Snapshot,
        neighbours: &impl Neighbours,
        arrival: Arrival,
        pool: &mut Pool,
        packets: &[BufferId],
        fates: &mut Vec<Fate>,
    ) {
        let Arrival { link: iif, mac } = arrival;
        let n = packets.len();
        let start = fates.len();
        fates.resize(start + n, Fate::Drop(Dropped::NoLink));
        let fates = &mut fates[start..];

        self.input_stage(mac, pool, packets, fates);

        // Conntrack: where the ruleset has connections tracked. The table is taken for
        // the whole vector: what its packets made stays the vector's until it ends.
        let shared_table = self.conntrack.clone().filter(|_| self.tracked != 0);
        let mut table = shared_table
            .as_ref()
            .map(|c| c.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        self.tracks.clear();
        self.error_sources.clear();
        self.rejected.clear();
        self.resets.clear();
        if let Some(table) = table.as_deref_mut() {
            let t = Instant::now();
            let tracked = self.conntrack_vector(table, snap, iif, mac, pool, packets, fates);
            self.conntrack_stage.add(tracked, t);
        }

        let (answers4, answers6) = self.route_stage(snap, iif, fates);
        let mut next = std::mem::take(&mut self.next);
        self.neighbour_stage(
            snap, neighbours, iif, answers4, answers6, pool, fates, &mut next,
        );
        // Filter: only where the router's rules hold something for a family, or its
        // connections are tracked.
        if self.rules.holds(false) || self.rules.holds(true) || self.tracked != 0 {
            self.filter_stage(
                table.as_deref_mut(),
                snap,
                iif,
                pool,
                packets,
                fates,
                &mut next,
            );
        }
        // What the prerouting chains rejected, answered with the rest (after the
        // filter stage, which must not put them through those chains again).
        self.errors.extend_from_slice(&self.rejected);
        self.rewrite_stage(pool, packets, fates, &next);
        self.next = next;
        if !self.errors.is_empty() || !self.resets.is_empty() {
            self.icmp_stage(
                table.as_deref_mut(),
                snap,
                neighbours,
                iif,
                pool,
                packets,
                fates,
            );
        }
        if let Some(table) = table.as_deref_mut() {
            self.tell_other_workers(table);
        }
        drop(table);
        self.count_fates(fates);
    }

    /// Counts the vector's fates, by runs of one fate (a vector's packets mostly share
    /// theirs), so that the table is touched once a run, not once a packet.
    fn count_fates(&mut self, fates: &[Fate]) {
        let mut run: Option<(Fate, u64)> = None;
        for &f in fates.iter() {
            match &mut run {
                Some((g, n)) if *g == f => *n += 1,
                _ => {
                    if let Some((g, n)) = run.replace((f, 1)) {
                        *self.fates.entry(g).or_default() += n;
                    }
                }
            }
        }
        if let Some((g, n)) = run {
            *self.fates.entry(g).or_default() += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::ETHERNET_LEN;
    use crate::offload::Offload;
    use crate::{fragment, rewrite};
    use etherparse::{Ipv4HeaderSlice, PacketBuilder};
    use fibre_fib::{config, State};
    use fibre_fib::{Query, RouteType};
    use rand::{Rng, SeedableRng};

    const CONFIG: &str = "\
link add a0 type veth peer name a1
link add b0 type veth peer name b1
link set a0 up
link set a1 up
link set b0 up
link set b1 up
addr add 10.0.0.1/24 dev a0
addr add 10.0.1.1/24 dev b0
addr add fd00::1/64 dev a0
addr add fd01::1/64 dev b0
route add 10.1.0.0/16 via 10.0.1.2
route add 10.2.0.0/16 via 10.0.1.3
route add 10.3.0.0/16 via 10.0.1.2 mtu 1000
route add unreachable 10.5.0.0/16
route add blackhole 10.6.0.0/16
route add 2001:db8:1::/48 via fd01::2
route add prohibit 2001:db8:7::/48
route add 10.7.0.0/16 via 10.0.1.2
";

    /// A rule on the input link, for flows arriving on `a0` only.
    const RULE: &str = "rule add iif a0 to 10.7.0.0/16 prohibit\n";

    const NEIGHBOUR: [u8; 6] = [0x02, 0xaa, 0, 0, 0, 2];

    /// The router of `CONFIG` and the lines of `extra`: its state, a snapshot of it, and
    /// its links `a0` (where packets arrive) and `b0`.
    fn router(extra: &str) -> (State, Snapshot, fibre_fib::Link, fibre_fib::Link) {
        let mut state = State::new();
        config::apply_text(&mut state, "config", &format!("{CONFIG}{extra}")).unwrap();
        let snap = state.snapshot();
        let link = |name: &str| snap.links().find(|l| l.name == name).unwrap().clone();
        let (a0, b0) = (link("a0"), link("b0"));
        (state, snap, a0, b0)
    }

    fn udp4(to: [u8; 6], src: [u8; 4], dst: [u8; 4], ttl: u8, payload: usize) -> Vec<u8> {
        let b = PacketBuilder::ethernet2([2, 9, 9, 9, 9, 9], to)
            .ipv4(src, dst, ttl)
            .udp(4000, 53);
        let mut out = Vec::new();
        b.write(&mut out, &vec![7; payload]).unwrap();
        out
    }

    /// An IPv4 frame with DF cleared (its checksum made again).
    fn without_df(mut frame: Vec<u8>) -> Vec<u8> {
        let h = &mut frame[ETHERNET_LEN..ETHERNET_LEN + 20];
        h[6] &= !0x40;
        h[10..12].fill(0);
        let sum = fibre_headers::checksum::checksum(h);
        h[10..12].copy_from_slice(&sum.to_be_bytes());
        frame
    }

    fn udp6(to: [u8; 6], src: &str, dst: &str, hops: u8) -> Vec<u8> {
        let a = |s: &str| s.parse::<Ipv6Addr>().unwrap().octets();
        let b = PacketBuilder::ethernet2([2, 9, 9, 9, 9, 9], to)
            .ipv6(a(src), a(dst), hops)
            .udp(4000, 53);
        let mut out = Vec::new();
        b.write(&mut out, &[7; 8]).unwrap();
        out
    }

    /// `frames` through a fresh pipeline as one vector arrived on `link`: the pipeline
    /// with its counters, the pool holding the frames as they left, their buffers, their
    /// fates.
    fn run_once(
        snap: &Snapshot,
        neighbours: &impl Neighbours,
        link: &fibre_fib::Link,
        frames: &[&[u8]],
    ) -> (Pipeline, Pool, Vec<BufferId>, Vec<Fate>) {
        run_in(Pool::new(64, 2048), snap, neighbours, link, frames)
    }

    /// [`run_once`] with the buffers of `pool`.
    fn run_in(
        mut pool: Pool,
        snap: &Snapshot,
        neighbours: &impl Neighbours,
        link: &fibre_fib::Link,
        frames: &[&[u8]],
    ) -> (Pipeline, Pool, Vec<BufferId>, Vec<Fate>) {
        let mut ids = Vec::new();
        pool.alloc(frames.len(), &mut ids);
        for (id, frame) in ids.iter().zip(frames) {
            pool.fill(*id, frame);
        }
        let mut fates = Vec::new();
        let arrival = Arrival {
            link: link.index,
            mac: link.mac,
        };
        let mut pipeline = Pipeline::new();
        pipeline.run(snap, neighbours, arrival, &mut pool, &ids, &mut fates);
        (pipeline, pool, ids, fates)
    }

    /// A neighbour table that says when it changed, as the daemon's does.
    struct Versioned {
        macs: HashMap<(LinkIndex, IpAddr), [u8; 6]>,
        version: u64,
    }

    impl Neighbours for Versioned {
        fn mac(&self, link: LinkIndex, addr: IpAddr) -> Option<[u8; 6]> {
            self.macs.get(&(link, addr)).copied()
        }

        fn version(&self) -> Option<u64> {
            Some(self.version)
        }
    }

    /// The neighbour stage keeps what it made of each hop (its adjacency) from vector to
    /// vector, and makes it again when the neighbour table's version or the routes
    /// change: the next packets leave with the new MAC address, go to the kernel when
    /// their gateway has none, and follow a route replaced.
    #[test]
    fn adjacencies_follow_the_neighbour_table_and_the_routes() {
        let (mut state, snap, a0, b0) = router("");
        let frames = [
            udp4(a0.mac, [192, 0, 2, 7], [10, 1, 2, 3], 64, 8),
            udp6(a0.mac, "2001:db8::7", "2001:db8:1::5", 64),
        ];
        let (gw4, gw6): (IpAddr, IpAddr) =
            ("10.0.1.2".parse().unwrap(), "fd01::2".parse().unwrap());
        let gw4_new: IpAddr = "10.0.1.3".parse().unwrap();
        let mut pipeline = Pipeline::new();
        let mut pool = Pool::new(64, 2048);
        // Each frame's fate and the destination MAC address it left with.
        let mut run = |pipeline: &mut Pipeline, snap: &Snapshot, n: &Versioned| {
            let mut ids = Vec::new();
            pool.alloc(frames.len(), &mut ids);
            for (id, frame) in ids.iter().zip(&frames) {
                pool.fill(*id, frame);
            }
            let mut fates = Vec::new();
            let arrival = Arrival {
                link: a0.index,
                mac: a0.mac,
            };
            pipeline.run(snap, n, arrival, &mut pool, &ids, &mut fates);
            let out: Vec<(Fate, [u8; 6])> = ids
                .iter()
                .zip(&fates)
                .map(|(&id, &f)| (f, pool.frame(id)[..6].try_into().unwrap()))
                .collect();
            pool.free(&ids);
            out
        };
        let (m1, m2, m3) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 3]);
        let mut n = Versioned {
            macs: HashMap::from([((b0.index, gw4), m1), ((b0.index, gw6), m1)]),
            version: 1,
        };
        let out = Fate::Out(b0.index);
        assert_eq!(run(&mut pipeline, &snap, &n), [(out, m1), (out, m1)]);
        assert_eq!(run(&mut pipeline, &snap, &n), [(out, m1), (out, m1)]);
        // The gateways move to another MAC address.
        n.macs.insert((b0.index, gw4), m2);
        n.macs.insert((b0.index, gw6), m2);
        n.version += 1;
        assert_eq!(run(&mut pipeline, &snap, &n), [(out, m2), (out, m2)]);
        // The IPv4 gateway goes: its packets go to the kernel, which resolves it.
        n.macs.remove(&(b0.index, gw4));
        n.version += 1;
        let fates: Vec<Fate> = run(&mut pipeline, &snap, &n).iter().map(|f| f.0).collect();
        assert_eq!(fates, [Fate::Kernel(Handed::Unresolved), out]);
        assert_eq!(pipeline.unresolved, [(b0.index, gw4)]);
        // The route moves to another gateway, the neighbour table unchanged.
        n.macs.insert((b0.index, gw4_new), m3);
        n.version += 1;
        assert_eq!(
            run(&mut pipeline, &snap, &n)[0].0,
            Fate::Kernel(Handed::Unresolved)
        );
        config::apply_text(
            &mut state,
            "change",
            "route replace 10.1.0.0/16 via 10.0.1.3\n",
        )
        .unwrap();
        let changed = state.snapshot();
        assert_ne!(changed.serial(), snap.serial());
        assert_eq!(run(&mut pipeline, &changed, &n), [(out, m3), (out, m2)]);
    }

    /// An error whose way back has no MAC address is not sent, and its neighbour is
    /// asked for, as a packet's next hop is.
    #[test]
    fn an_error_with_no_way_back_asks_for_its_neighbour() {
        let (_, snap, a0, b0) = router("route add 192.0.2.0/24 via 10.0.1.9\n");
        let gw: IpAddr = "10.0.1.2".parse().unwrap();
        let neighbours =
            move |l: LinkIndex, a: IpAddr| (l == b0.index && a == gw).then_some(NEIGHBOUR);
        let frame = udp4(a0.mac, [192, 0, 2, 7], [10, 1, 2, 3], 1, 8);
        let (pipeline, pool, ids, fates) = run_once(&snap, &neighbours, &a0, &[&frame]);
        assert_eq!(fates, [Fate::Drop(Dropped::TtlExpired)]);
        assert_eq!(pipeline.unanswered.unresolved, 1);
        assert_eq!(
            pipeline.unresolved,
            [(b0.index, "10.0.1.9".parse().unwrap())]
        );
        assert_eq!(pool.frame(ids[0]), &frame[..], "left as it came");
    }

    /// Packets arriving on `a0` each meet their fate: forwarded (rewritten as a router
    /// rewrites them), to the kernel, or dropped, each for its reason; and every packet
    /// forwarded leaves by the link the FIB's single lookup names for it.
    #[test]
    fn each_packet_meets_its_fate() {
        let (_, snap, a0, b0) = router(RULE);
        let known: [IpAddr; 2] = ["10.0.1.2".parse().unwrap(), "fd01::2".parse().unwrap()];
        let neighbours = move |l: LinkIndex, a: IpAddr| {
            (l == b0.index && known.contains(&a)).then_some(NEIGHBOUR)
        };
        let src = [192, 0, 2, 7];
        let cases: Vec<(&str, Vec<u8>, Fate)> = vec![
            (
                "forwarded",
                udp4(a0.mac, src, [10, 1, 2, 3], 64, 8),
                Fate::Out(b0.index),
            ),
            (
                "no neighbour yet",
                udp4(a0.mac, src, [10, 2, 2, 3], 64, 8),
                Fate::Kernel(Handed::Unresolved),
            ),
            (
                "for this host",
                udp4(a0.mac, src, [10, 0, 0, 1], 64, 8),
                Fate::Kernel(Handed::Local),
            ),
            (
                "TTL 1",
                udp4(a0.mac, src, [10, 1, 2, 3], 1, 8),
                Fate::Drop(Dropped::TtlExpired),
            ),
            (
                "over the route's MTU",
                udp4(a0.mac, src, [10, 3, 0, 1], 64, 1000),
                Fate::Drop(Dropped::TooBig),
            ),
            (
                "over the route's MTU without DF",
                without_df(udp4(a0.mac, src, [10, 3, 0, 1], 64, 1000)),
                Fate::Fragmented(b0.index),
            ),
            (
                "the route's MTU exactly",
                udp4(a0.mac, src, [10, 3, 0, 1], 64, 1000 - 28),
                Fate::Out(b0.index),
            ),
            (
                "unreachable",
                udp4(a0.mac, src, [10, 5, 0, 1], 64, 8),
                Fate::Drop(Dropped::NoRoute(NoRoute::HostUnreachable)),
            ),
            (
                "blackhole",
                udp4(a0.mac, src, [10, 6, 0, 1], 64, 8),
                Fate::Drop(Dropped::NoRoute(NoRoute::Invalid)),
            ),
            (
                "no route",
                udp4(a0.mac, src, [11, 0, 0, 1], 64, 8),
                Fate::Drop(Dropped::NoRoute(NoRoute::NetworkUnreachable)),
            ),
            (
                "martian source",
                udp4(a0.mac, [127, 0, 0, 1], [10, 1, 2, 3], 64, 8),
                Fate::Drop(Dropped::NoRoute(NoRoute::Invalid)),
            ),
            (
                "another host's frame",
                udp4([2, 1, 1, 1, 1, 1], src, [10, 1, 2, 3], 64, 8),
                Fate::Drop(Dropped::Input(input::Drop::OtherHost)),
            ),
            (
                "IPv6 forwarded",
                udp6(a0.mac, "2001:db8:9::1", "2001:db8:1::5", 64),
                Fate::Out(b0.index),
            ),
            (
                "IPv6 hop limit 1",
                udp6(a0.mac, "2001:db8:9::1", "2001:db8:1::5", 1),
                Fate::Drop(Dropped::TtlExpired),
            ),
            (
                "IPv6 prohibited",
                udp6(a0.mac, "2001:db8:9::1", "2001:db8:7::5", 64),
                Fate::Drop(Dropped::NoRoute(NoRoute::Prohibited)),
            ),
            (
                "IPv6 link-local",
                udp6(a0.mac, "2001:db8:9::1", "fe80::5", 64),
                Fate::Kernel(Handed::Input(input::Kernel::LinkLocal)),
            ),
        ];
        let frames: Vec<&[u8]> = cases.iter().map(|(_, f, _)| &f[..]).collect();
        let (pipeline, pool, ids, fates) = run_once(&snap, &neighbours, &a0, &frames);
        for ((what, frame, want), (id, got)) in cases.iter().zip(ids.iter().zip(&fates)) {
            assert_eq!(got, want, "{what}");
            let now = pool.frame(*id);
            if let Fate::Out(dev) = got {
                // Rewritten: the next hop's MAC, the output link's, one hop less.
                assert_eq!(&now[..6], &NEIGHBOUR, "{what}");
                assert_eq!(&now[6..12], &b0.mac, "{what}");
                if frame[12..14] == [8, 0] {
                    let h = Ipv4HeaderSlice::from_slice(&now[ETHERNET_LEN..])
                        .unwrap()
                        .to_header();
                    assert_eq!(h.time_to_live, 63, "{what}");
                    assert_eq!(h.header_checksum, h.calc_header_checksum(), "{what}");
                } else {
                    assert_eq!(now[ETHERNET_LEN + 7], 63, "{what}");
                }
                assert_eq!(
                    now[ETHERNET_LEN + 12..],
                    frame[ETHERNET_LEN + 12..],
                    "{what}: the rest as it came"
                );
                assert_eq!(*dev, b0.index);
            } else if !matches!(got, Fate::Fragmented(_)) {
                // (Fragments have a test of their own.)
                assert_eq!(now, &frame[..], "{what}: untouched");
            }
        }
        // Counted: one call of each stage, each packet's fate.
        assert_eq!(pipeline.input.calls, 1);
        assert_eq!(pipeline.input.packets, cases.len() as u64);
        assert_eq!(pipeline.fates.values().sum::<u64>(), cases.len() as u64);
        assert_eq!(pipeline.fates[&Fate::Out(b0.index)], 3);
        // No route back to the source: the six the kernel would answer go unanswered.
        assert_eq!(pipeline.unanswered.no_route_back, 6);
        assert_eq!(pipeline.icmp.packets, 6);
    }

    /// An IPv4 UDP frame to `dst` without DF, `payload` bytes of a counting pattern.
    fn unfragmented(to: [u8; 6], dst: [u8; 4], payload: usize) -> Vec<u8> {
        let data: Vec<u8> = (0..payload).map(|i| (i * 7 + i / 256) as u8).collect();
        let mut out = Vec::new();
        PacketBuilder::ethernet2([2, 9, 9, 9, 9, 9], to)
            .ipv4([192, 0, 2, 7], dst, 64)
            .udp(4000, 53)
            .write(&mut out, &data)
            .unwrap();
        without_df(out)
    }

    /// IPv4 packets over the MTU without DF leave in fragments: the first in the
    /// packet's buffer, the rest in [`Pipeline::fragments`] in order, each rewritten
    /// (MACs, TTL) and cut as [`fragment`] cuts the rewritten packet; the packets around
    /// them are forwarded as ever. With too few buffers free, the packet is dropped and
    /// counted, and the pool gets back every buffer it lent.
    #[test]
    fn packets_over_the_mtu_without_df_leave_in_fragments() {
        let (_, snap, a0, b0) = router("");
        let neighbours = |_: LinkIndex, _: IpAddr| Some(NEIGHBOUR);
        // 10.3.0.0/16 has an MTU of 1000: 1028 bytes make two fragments, 1988 three.
        let frames = [
            udp4(a0.mac, [192, 0, 2, 7], [10, 1, 2, 3], 64, 8),
            unfragmented(a0.mac, [10, 3, 0, 1], 1000),
            unfragmented(a0.mac, [10, 1, 0, 1], 1000),
            unfragmented(a0.mac, [10, 3, 0, 2], 1960),
        ];
        let refs: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
        let (pipeline, pool, ids, fates) = run_once(&snap, &neighbours, &a0, &refs);
        let out = Fate::Out(b0.index);
        let cut = Fate::Fragmented(b0.index);
        assert_eq!(fates, [out, cut, out, cut]);
        let later: Vec<usize> = pipeline.fragments.iter().map(|f| f.0).collect();
        assert_eq!(later, [1, 3, 3], "one later fragment, then two");
        for (i, frame) in frames.iter().enumerate().filter(|(i, _)| fates[*i] == cut) {
            // What the router sends: the packet rewritten, then cut.
            let mut rewritten = frame.clone();
            rewrite::decrement_ttl(&mut rewritten);
            rewrite::set_macs(&mut rewritten, NEIGHBOUR, b0.mac);
            let ip_len = rewritten.len() - ETHERNET_LEN;
            let expected: Vec<Vec<u8>> = fragment::pieces(ip_len, 1000)
                .unwrap()
                .map(|p| {
                    let mut f = vec![0; 2048];
                    let n = fragment::write(&rewritten, p, &mut f).unwrap();
                    f.truncate(n);
                    f
                })
                .collect();
            let mut sent = vec![pool.frame(ids[i]).to_vec()];
            sent.extend(
                pipeline
                    .fragments
                    .iter()
                    .filter(|f| f.0 == i)
                    .map(|f| pool.frame(f.1).to_vec()),
            );
            assert_eq!(sent, expected, "packet {i}");
            for f in &sent {
                assert!(f.len() - ETHERNET_LEN <= 1000);
                let h = Ipv4HeaderSlice::from_slice(&f[ETHERNET_LEN..]).unwrap();
                assert_eq!(h.ttl(), 63);
            }
        }
        assert_eq!(pipeline.fates[&cut], 2);

        // A pool with two buffers to spare: the two-fragment packet takes one and goes;
        // the three-fragment one gets one of the two it needs, gives it back, and is
        // dropped as it came.
        let (pipeline, mut pool, ids, fates) =
            run_in(Pool::new(6, 2048), &snap, &neighbours, &a0, &refs);
        assert_eq!(
            fates,
            [out, cut, out, Fate::Drop(Dropped::NoBufferToFragment)]
        );
        assert_eq!(pool.frame(ids[3]), &frames[3][..], "left as it came");
        assert_eq!(pipeline.fragments.len(), 1);
        assert_eq!(
            pool.available(),
            1,
            "the buffer the dropped packet got, back"
        );
        pool.free(&[pipeline.fragments[0].1]);
        pool.free(&ids);
        assert_eq!((pool.available(), pool.refused()), (6, 0));
    }

    /// The error a packet is answered with, and the MTU it reports; `None`: dropped.
    type Answered = Option<(icmp::Error, u32)>;

    /// With a way back to the sources, what the kernel answers is answered: the buffer
    /// holds the error, from the router's address on the way back, to the packet's
    /// source, sent to the host the packet came from.
    #[test]
    fn refused_packets_are_answered_as_the_kernel_answers_them() {
        let back = "route add 192.0.2.0/24 via 10.0.0.2\nroute add 2001:db8:9::/48 via fd00::2\n";
        let (state, snap, a0, b0) = router(back);
        let everyone_on_b0 = move |l: LinkIndex, _: IpAddr| (l == b0.index).then_some(NEIGHBOUR);
        let src = [192, 0, 2, 7];
        let sender = [2, 9, 9, 9, 9, 9];
        use icmp::Error::*;
        let cases: Vec<(&str, Vec<u8>, Answered)> = vec![
            (
                "TTL 1",
                udp4(a0.mac, src, [10, 1, 2, 3], 1, 8),
                Some((TimeExceeded, 0)),
            ),
            (
                "unreachable",
                udp4(a0.mac, src, [10, 5, 0, 1], 64, 8),
                Some((HostUnreachable, 0)),
            ),
            (
                "no route",
                udp4(a0.mac, src, [11, 0, 0, 1], 64, 8),
                Some((NetUnreachable, 0)),
            ),
            (
                "DF over the MTU",
                udp4(a0.mac, src, [10, 3, 0, 1], 64, 1000),
                Some((TooBig, 1000)),
            ),
            ("blackhole", udp4(a0.mac, src, [10, 6, 0, 1], 64, 8), None),
            (
                "IPv6 hop limit 1",
                udp6(a0.mac, "2001:db8:9::1", "2001:db8:1::5", 1),
                Some((TimeExceeded, 0)),
            ),
            (
                "IPv6 prohibited",
                udp6(a0.mac, "2001:db8:9::1", "2001:db8:7::5", 64),
                Some((Prohibited, 0)),
            ),
            (
                "IPv6 no route",
                udp6(a0.mac, "2001:db8:9::1", "2001:db8:2::5", 64),
                Some((NetUnreachable, 0)),
            ),
            (
                "IPv6 link-local source",
                udp6(a0.mac, "fe80::9", "2001:db8:1::5", 64),
                Some((BeyondScope, 0)),
            ),
        ];
        let frames: Vec<&[u8]> = cases.iter().map(|(_, f, _)| &f[..]).collect();
        let (mut pipeline, mut pool, ids, mut fates) =
            run_once(&snap, &everyone_on_b0, &a0, &frames);
        let arrival = Arrival {
            link: a0.index,
            mac: a0.mac,
        };
        for ((what, frame, want), (id, got)) in cases.iter().zip(ids.iter().zip(&fates)) {
            let Some((error, mtu)) = *want else {
                assert!(matches!(got, Fate::Drop(_)), "{what}: {got:?}");
                continue;
            };
            assert_eq!(*got, Fate::Icmp(error, a0.index), "{what}");
            let now = pool.frame(*id);
            assert_eq!(
                (&now[..6], &now[6..12]),
                (&sender[..], &a0.mac[..]),
                "{what}"
            );
            let p = etherparse::SlicedPacket::from_ethernet(now).unwrap();
            let (from, to): (IpAddr, IpAddr) = match p.net {
                Some(etherparse::NetSlice::Ipv4(ip)) => (
                    ip.header().source_addr().into(),
                    ip.header().destination_addr().into(),
                ),
                Some(etherparse::NetSlice::Ipv6(ip)) => (
                    ip.header().source_addr().into(),
                    ip.header().destination_addr().into(),
                ),
                _ => panic!("{what}: not IP"),
            };
            let (kind, code, quoted) = match p.transport {
                Some(etherparse::TransportSlice::Icmpv4(m)) => {
                    assert_eq!(from, "10.0.0.1".parse::<IpAddr>().unwrap(), "{what}");
                    assert_eq!(to, IpAddr::from(src), "{what}");
                    if error == TooBig {
                        assert_eq!(
                            u16::from_be_bytes([m.bytes5to8()[2], m.bytes5to8()[3]]) as u32,
                            mtu
                        );
                    }
                    ((m.type_u8(), m.code_u8()), error.icmp(), m.payload())
                }
                Some(etherparse::TransportSlice::Icmpv6(m)) => {
                    let IpAddr::V6(to) = to else { panic!() };
                    assert_eq!(to.octets(), frame[22..38], "{what}");
                    // From the address source selection gives for the way back: the
                    // link's link-local one for a link-local destination.
                    let want = if to.is_unicast_link_local() {
                        let on_a0 = |a: &&fibre_fib::Address| a.link == a0.index;
                        let local = |a: &&fibre_fib::Address| a.scope == 253;
                        state
                            .addresses()
                            .iter()
                            .filter(on_a0)
                            .find(local)
                            .unwrap()
                            .local
                    } else {
                        "fd00::1".parse().unwrap()
                    };
                    assert_eq!(from, want, "{what}");
                    ((m.type_u8(), m.code_u8()), error.icmpv6(), m.payload())
                }
                _ => panic!("{what}: not ICMP"),
            };
            assert_eq!(kind, code, "{what}");
            assert_eq!(
                quoted,
                &frame[ETHERNET_LEN..ETHERNET_LEN + quoted.len()],
                "{what}"
            );
        }
        assert_eq!(pipeline.unanswered, Unanswered::default());

        // An error does not answer an error: the time exceeded just made, sent back
        // through the router with TTL 1, is dropped unanswered.
        // (From another host's address: from the router's own it would be a martian.)
        let mut again = pool.frame(ids[0]).to_vec();
        again[..6].copy_from_slice(&a0.mac);
        again[ETHERNET_LEN + 8] = 1;
        again[ETHERNET_LEN + 12..ETHERNET_LEN + 16].copy_from_slice(&[192, 0, 2, 8]);
        again[ETHERNET_LEN + 10..ETHERNET_LEN + 12].fill(0);
        let sum = fibre_headers::checksum::checksum(&again[ETHERNET_LEN..ETHERNET_LEN + 20]);
        again[ETHERNET_LEN + 10..ETHERNET_LEN + 12].copy_from_slice(&sum.to_be_bytes());
        pool.fill(ids[0], &again);
        fates.clear();
        pipeline.run(
            &snap,
            &everyone_on_b0,
            arrival,
            &mut pool,
            &ids[..1],
            &mut fates,
        );
        assert_eq!(fates, [Fate::Drop(Dropped::TtlExpired)]);
        assert_eq!(pipeline.unanswered.not_answered, 1);

        // Over the limits: a flood of TTL 1 from one source gets its burst of 6.
        let flood: Vec<_> = (0..40)
            .map(|_| udp4(a0.mac, [192, 0, 2, 9], [10, 1, 2, 3], 1, 8))
            .collect();
        pool.free(&ids);
        let mut ids = Vec::new();
        pool.alloc(flood.len(), &mut ids);
        for (id, f) in ids.iter().zip(&flood) {
            pool.fill(*id, f);
        }
        fates.clear();
        let mut fresh = Pipeline::new();
        fresh.run(&snap, &everyone_on_b0, arrival, &mut pool, &ids, &mut fates);
        let answered = fates.iter().filter(|f| matches!(f, Fate::Icmp(..))).count();
        assert_eq!(answered, 6);
        assert_eq!(fresh.unanswered.rate_limited, 34);
    }

    /// Vectors of random destinations: each packet the pipeline sends out leaves by the
    /// link the FIB's single lookup gives for the same flow, and each it drops for want of
    /// a route is one the lookup refuses alike.
    #[test]
    fn the_route_stage_agrees_with_single_lookups() {
        let (_, snap, a0, _) = router("");
        let everyone = |_: LinkIndex, _: IpAddr| Some(NEIGHBOUR);
        let mut rng = rand::rngs::StdRng::seed_from_u64(4);
        let mut pool = Pool::new(256, 256);
        let mut pipeline = Pipeline::new();
        for _ in 0..20 {
            let mut ids = Vec::new();
            pool.alloc(256, &mut ids);
            let mut queries = Vec::new();
            for &id in &ids {
                let dst = [10, rng.gen_range(0..8), rng.gen(), rng.gen()];
                pool.fill(id, &udp4(a0.mac, [198, 51, 100, rng.gen()], dst, 64, 8));
                queries.push(Query {
                    src: Some(IpAddr::from([
                        198,
                        51,
                        100,
                        pool.frame(id)[ETHERNET_LEN + 15],
                    ])),
                    iif: Some(a0.index),
                    ipproto: 17,
                    sport: 4000,
                    dport: 53,
                    ..Query::to(IpAddr::from(dst))
                });
            }
            let mut fates = Vec::new();
            let arrival = Arrival {
                link: a0.index,
                mac: a0.mac,
            };
            pipeline.run(&snap, &everyone, arrival, &mut pool, &ids, &mut fates);
            for (q, fate) in queries.iter().zip(&fates) {
                match (snap.lookup(q), fate) {
                    (Ok(h), Fate::Out(dev)) => assert_eq!(h.dev, *dev, "{q:?}"),
                    (Ok(h), Fate::Kernel(Handed::Local)) => assert_ne!(h.kind, RouteType::Unicast),
                    (Err(e), Fate::Drop(Dropped::NoRoute(got))) => assert_eq!(e, *got, "{q:?}"),
                    (want, got) => panic!("{q:?}: the lookup says {want:?}, the pipeline {got:?}"),
                }
            }
            pool.free(&ids);
        }
        assert!(pipeline.route.packets >= 5000);
    }

    /// The Internet checksum over `parts` holds (sums to all ones).
    fn holds(parts: &[&[u8]]) -> bool {
        let mut sum: u32 = 0;
        for p in parts {
            for c in p.chunks(2) {
                sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
            }
        }
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum == 0xffff
    }

    /// An IPv4 frame's header and transport checksums hold.
    fn checksums_hold(f: &[u8]) -> bool {
        let ip = &f[ETHERNET_LEN..];
        let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
        let l4 = &ip[20..total];
        let pseudo = [
            &ip[12..20],
            &[0, ip[9]],
            &(l4.len() as u16).to_be_bytes()[..],
        ]
        .concat();
        holds(&[&ip[..20]])
            && match ip[9] {
                1 => holds(&[l4]),
                _ => holds(&[&pseudo, l4]),
            }
    }

    /// A flow: protocol, source, source port (an echo's identifier), destination,
    /// destination port.
    /// The rules of one filter chain, `name`, of table `fw` of `family`: at `hook` with
    /// `policy` (0 drop, 1 accept).
    fn one_chain(
        family: fibre_firewall::message::Family,
        name: &str,
        (hook, policy): (u32, u32),
        rules: Vec<Vec<fibre_firewall::message::Expression>>,
    ) -> Filter {
        Filter::of(&fibre_firewall::build::ruleset(
            family,
            "fw",
            vec![fibre_firewall::build::ChainSpec {
                nat: false,
                name: name.into(),
                hook: Some((hook, policy)),
                rules,
            }],
        ))
    }

    /// A pipeline that tracks the connections of the families `tracked` (bits 0 IPv4,
    /// 1 IPv6), with `rules`.
    fn tracking(rules: Filter, tracked: u8) -> Pipeline {
        let mut pipeline = Pipeline::new();
        pipeline.rules = Arc::new(rules);
        pipeline.tracked = tracked;
        pipeline.conntrack = Some(Arc::new(std::sync::Mutex::new(Conntrack::new(
            fibre_conntrack::Settings::kernel_defaults(),
        ))));
        pipeline
    }

    /// `frame` through `pipeline` alone, arrived on `by`: its fate, and the packets whose
    /// verdict the pipeline has kept so far.
    fn send_one(
        pipeline: &mut Pipeline,
        snap: &Snapshot,
        pool: &mut Pool,
        by: &fibre_fib::Link,
        frame: &[u8],
    ) -> (Fate, u64) {
        let neighbours = |_: LinkIndex, _: IpAddr| Some(NEIGHBOUR);
        let mut ids = Vec::new();
        pool.alloc(1, &mut ids);
        pool.fill(ids[0], frame);
        let mut fates = Vec::new();
        let arrival = Arrival {
            link: by.index,
            mac: by.mac,
        };
        pipeline.run(snap, &neighbours, arrival, pool, &ids, &mut fates);
        pool.free(&ids);
        (fates[0], pipeline.verdicts_kept)
    }

    /// A checksum its link vouched for (`DATA_VALID`, the kernel's
    /// `CHECKSUM_UNNECESSARY`) is not checked again, as the kernel's conntrack and reject
    /// do not check it; one nobody vouched for is: wrong, it makes the packet invalid to
    /// tracking and leaves a reject unanswered.
    #[test]
    fn a_checksum_its_link_vouched_for_is_not_checked_again() {
        use fibre_firewall::build::{cmp, ct, meta, reject, verdict};
        let (_, snap, a0, b0) = router("");
        // forward: meta l4proto udp udp dport 54 reject (port unreachable); ct state
        // invalid drop; policy accept.
        let rules = one_chain(
            fibre_firewall::message::Family::Ip,
            "fwd",
            (2, 1),
            vec![
                vec![
                    meta(16, 1),
                    cmp(0, 1, &[17]),
                    fibre_firewall::build::payload(2, 2, 2, 1),
                    cmp(0, 1, &54u16.to_be_bytes()),
                    reject(0, 3),
                ],
                vec![
                    ct(0, 1, None),
                    cmp(0, 1, &1u32.to_ne_bytes()),
                    verdict(0, None),
                ],
            ],
        );
        let mut pipeline = tracking(rules, 1);
        let mut pool = Pool::new(64, 2048);
        let neighbours = |_: LinkIndex, _: IpAddr| Some(NEIGHBOUR);
        let arrival = Arrival {
            link: a0.index,
            mac: a0.mac,
        };
        // A datagram from source port `port` to `dport`, its UDP checksum made wrong if
        // `wrong`, its link vouching for it if `vouched`: its fate.
        let mut send = |port: u16, dport: u16, wrong: bool, vouched: bool| {
            let mut frame = udp4(a0.mac, [10, 0, 0, 2], [10, 1, 0, 5], 64, 20);
            let udp = ETHERNET_LEN + 20;
            frame[udp..udp + 2].copy_from_slice(&port.to_be_bytes());
            frame[udp + 2..udp + 4].copy_from_slice(&dport.to_be_bytes());
            frame[udp + 6..udp + 8].fill(0);
            let ip = &frame[ETHERNET_LEN..];
            let pseudo = [&ip[12..20], &[0, 17], &28u16.to_be_bytes()[..], &ip[20..48]].concat();
            let sum = match fibre_headers::checksum::checksum(&pseudo) {
                0 => 0xffff,
                c => c,
            } ^ u16::from(wrong);
            frame[udp + 6..udp + 8].copy_from_slice(&sum.to_be_bytes());
            assert_eq!(checksums_hold(&frame), !wrong);
            let mut ids = Vec::new();
            pool.alloc(1, &mut ids);
            pool.fill(ids[0], &frame);
            if vouched {
                let offload = Offload {
                    checksum_valid: true,
                    ..Offload::NONE
                };
                assert!(pool.set_offload(ids[0], offload));
            }
            let mut fates = Vec::new();
            pipeline.run(&snap, &neighbours, arrival, &mut pool, &ids, &mut fates);
            pool.free(&ids);
            fates[0]
        };
        let out = Fate::Out(b0.index);
        let answered = Fate::Icmp(icmp::Error::Rejected(3), a0.index);
        assert_eq!(send(1000, 53, false, false), out);
        assert_eq!(send(1001, 53, true, false), Fate::Drop(Dropped::Filtered));
        assert_eq!(send(1002, 53, true, true), out, "the link vouched for it");
        assert_eq!(send(1003, 54, false, false), answered);
        assert_eq!(send(1004, 54, true, false), Fate::Drop(Dropped::Filtered));
        assert_eq!(
            send(1005, 54, true, true),
            answered,
            "the link vouched for it"
        );
    }

    /// The prerouting chains see every packet, as the kernel's do before it routes it:
    /// one for the host or dropped by its route too, its connection tracked or not. A
    /// `reject` there answers it (unless the kernel, which has its copy, does), a
    /// `drop` keeps one for the host from the kernel.
    #[test]
    fn the_prerouting_chains_see_packets_for_the_host_and_for_routes_that_drop() {
        use fibre_firewall::build::{cmp, meta, reject, verdict};
        use fibre_firewall::message::Family;
        let (_, snap, a0, _) = router("");
        // prerouting: reject with icmpx port-unreachable (or drop), in an inet table.
        let rules = |statement| one_chain(Family::Inet, "pre", (0, 1), vec![vec![statement]]);
        let frames = [
            udp4(a0.mac, [10, 0, 0, 2], [10, 0, 1, 1], 64, 20),
            udp4(a0.mac, [10, 0, 0, 2], [10, 6, 0, 5], 64, 20),
            udp6(a0.mac, "fd00::2", "fd01::1", 64),
            udp6(a0.mac, "fd00::2", "2001:db8:7::5", 64),
        ];
        let mut pool = Pool::new(64, 2048);
        let answered = [
            Fate::Icmp(icmp::Error::Rejected(3), a0.index),
            Fate::Icmp(icmp::Error::Rejected(3), a0.index),
            Fate::Icmp(icmp::Error::Rejected(4), a0.index),
            Fate::Icmp(icmp::Error::Rejected(4), a0.index),
        ];
        // IPv4's connections tracked, IPv6's not, and each way.
        for tracked in [0, 1, 3] {
            // A rule that matches none of them: each goes its way.
            let none = one_chain(
                Family::Inet,
                "pre",
                (0, 1),
                vec![vec![meta(16, 1), cmp(0, 1, &[6]), reject(2, 1)]],
            );
            let mut pipeline = tracking(none, tracked);
            let fates: Vec<Fate> = frames
                .iter()
                .map(|frame| send_one(&mut pipeline, &snap, &mut pool, &a0, frame).0)
                .collect();
            assert_eq!(fates[0], Fate::Kernel(Handed::Local), "tracked {tracked}");
            assert!(
                matches!(fates[1], Fate::Drop(Dropped::NoRoute(_))),
                "{fates:?}"
            );
            assert_eq!(fates[2], Fate::Kernel(Handed::Local), "tracked {tracked}");
            assert_eq!(
                fates[3],
                Fate::Icmp(icmp::Error::Prohibited, a0.index),
                "tracked {tracked}"
            );
            let mut pipeline = tracking(rules(reject(2, 1)), tracked);
            for (frame, answer) in frames.iter().zip(answered) {
                let (fate, _) = send_one(&mut pipeline, &snap, &mut pool, &a0, frame);
                assert_eq!(fate, answer, "tracked {tracked}: {frame:02x?}");
            }
            // The kernel, with its copy, answers it itself.
            pipeline.kernel_rejects_at_prerouting = true;
            for frame in &frames {
                let (fate, _) = send_one(&mut pipeline, &snap, &mut pool, &a0, frame);
                assert_eq!(fate, Fate::Drop(Dropped::Filtered), "tracked {tracked}");
            }
            let mut pipeline = tracking(rules(verdict(0, None)), tracked);
            for frame in &frames {
                let (fate, _) = send_one(&mut pipeline, &snap, &mut pool, &a0, frame);
                assert_eq!(fate, Fate::Drop(Dropped::Filtered), "tracked {tracked}");
            }
        }
    }

    /// A reset answering a packet tracking found invalid carries no connection, so it
    /// is tracked as the host's own packet, as the kernel's conntrack tracks it on its
    /// way out: here it is the first packet of its connection's reply direction, a reset,
    /// which ends the connection (the random rulesets of `random_nat.rs` found fibre
    /// forwarding the next reply as established where the kernel saw a new connection).
    #[test]
    fn a_reset_for_an_invalid_packet_ends_the_connection_it_belongs_to() {
        use fibre_firewall::build::{cmp, ct, meta, reject, verdict};
        let (_, snap, a0, b0) = router("");
        // forward: ct state invalid reject with tcp reset; iifname "b0" ct state new
        // drop; policy accept.
        let rules = one_chain(
            fibre_firewall::message::Family::Ip,
            "forward",
            (2, 1),
            vec![
                vec![ct(0, 1, None), cmp(0, 1, &1u32.to_ne_bytes()), reject(1, 0)],
                vec![
                    meta(6, 1),
                    cmp(0, 1, b"b0\0\0\0\0\0\0\0\0\0\0\0\0\0\0"),
                    ct(0, 1, None),
                    cmp(0, 1, &8u32.to_ne_bytes()),
                    verdict(0, None),
                ],
            ],
        );
        let segment = |to: [u8; 6], from: ([u8; 4], u16), dst: ([u8; 4], u16), flags: &str| {
            let b = PacketBuilder::ethernet2([2, 9, 9, 9, 9, 9], to)
                .ipv4(from.0, dst.0, 64)
                .tcp(from.1, dst.1, 1000, 64240);
            let b = match flags {
                "ack" => b.ack(5000).psh(),
                _ => b.syn().fin(),
            };
            let mut out = Vec::new();
            b.write(&mut out, &[7; 10]).unwrap();
            out
        };
        let (host, far) = (([10, 0, 0, 2], 4000), ([10, 1, 0, 5], 80));
        let mut pool = Pool::new(64, 2048);
        let mut pipeline = tracking(rules, 1);
        let mut send = |by: &fibre_fib::Link, frame: Vec<u8>| {
            send_one(&mut pipeline, &snap, &mut pool, by, &frame).0
        };
        // Picked up in mid-stream from inside, forwarded.
        assert_eq!(
            send(&a0, segment(a0.mac, host, far, "ack")),
            Fate::Out(b0.index)
        );
        // SYN and FIN at once: invalid, answered with a reset (sequence 0: it
        // acknowledged nothing), which the other end never sent before.
        assert_eq!(
            send(&a0, segment(a0.mac, host, far, "syn-fin")),
            Fate::Reset(a0.index)
        );
        // The far end's answer finds no connection: a new one, dropped.
        assert_eq!(
            send(&b0, segment(b0.mac, far, host, "ack")),
            Fate::Drop(Dropped::Filtered)
        );
    }

    /// Two workers, each with a table of its own: a packet read by the worker that does
    /// not own its connection is handed to the one that does, whichever way it goes, so
    /// both directions meet the connection (a reply from outside, which the rules let in
    /// only as established, passes); each connection lies in one table, and moves
    /// with its owner when the workers are owned anew.
    #[test]
    fn each_worker_tracks_the_connections_it_owns_and_hands_over_the_others() {
        use fibre_conntrack::Owners;
        use fibre_firewall::build::{cmp, ct, meta, verdict};
        let (_, snap, a0, b0) = router("");
        // forward: iifname "b0" ct state new drop; policy accept.
        let rules = || {
            one_chain(
                fibre_firewall::message::Family::Ip,
                "forward",
                (2, 1),
                vec![vec![
                    meta(6, 1),
                    cmp(0, 1, b"b0\0\0\0\0\0\0\0\0\0\0\0\0\0\0"),
                    ct(0, 1, None),
                    cmp(0, 1, &8u32.to_ne_bytes()),
                    verdict(0, None),
                ]],
            )
        };
        let census = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let owners = Owners {
            workers: 2,
            me: 0,
            seed: 12345,
        };
        let mut workers: Vec<Pipeline> = (0..2u16)
            .map(|me| {
                let p = tracking(rules(), 1);
                let mut t = p.conntrack.as_ref().unwrap().lock().unwrap();
                t.set_census(census.clone());
                t.set_owners(Owners { me, ..owners });
                drop(t);
                p
            })
            .collect();
        let mut pool = Pool::new(64, 2048);
        let datagram = |to: [u8; 6], src: ([u8; 4], u16), dst: ([u8; 4], u16)| {
            let b = PacketBuilder::ethernet2([2, 9, 9, 9, 9, 9], to)
                .ipv4(src.0, dst.0, 64)
                .udp(src.1, dst.1);
            let mut out = Vec::new();
            b.write(&mut out, &[7; 10]).unwrap();
            out
        };
        // A frame read by worker `w`: its fate where it ends, and how many times it
        // was handed over.
        let mut deliver =
            |workers: &mut [Pipeline], w: usize, by: &fibre_fib::Link, frame: &[u8]| {
                let (mut fate, _) = send_one(&mut workers[w], &snap, &mut pool, by, frame);
                let mut handed = 0;
                while let Fate::Handoff(to) = fate {
                    assert_ne!(usize::from(to), w, "handed to itself");
                    handed += 1;
                    assert_eq!(handed, 1, "handed on again");
                    fate = send_one(&mut workers[usize::from(to)], &snap, &mut pool, by, frame).0;
                }
                (fate, handed)
            };
        let mut handed = [0, 0];
        for k in 0..64u16 {
            let host = ([10, 0, 0, 2], 5000 + k);
            let far = ([10, 1, 0, (k % 7) as u8 + 1], 53);
            // Read by one worker one way, by the other the other way.
            let (w, back) = (usize::from(k % 2), usize::from(1 - k % 2));
            let (fate, h) = deliver(&mut workers, w, &a0, &datagram(a0.mac, host, far));
            assert_eq!(fate, Fate::Out(b0.index), "flow {k} out");
            handed[0] += h;
            let (fate, h) = deliver(&mut workers, back, &b0, &datagram(b0.mac, far, host));
            assert_eq!(
                fate,
                Fate::Out(a0.index),
                "flow {k}: the reply met its connection"
            );
            handed[1] += h;
            // Anew from outside: dropped, whoever reads it.
            let (fate, _) = deliver(
                &mut workers,
                w,
                &b0,
                &datagram(b0.mac, far, (host.0, 9000 + k)),
            );
            assert_eq!(fate, Fate::Drop(Dropped::Filtered));
        }
        assert!(handed[0] > 10 && handed[1] > 10, "{handed:?}");
        let lens: Vec<usize> = workers
            .iter()
            .map(|p| p.conntrack.as_ref().unwrap().lock().unwrap().len())
            .collect();
        assert_eq!(lens.iter().sum::<usize>(), 64, "{lens:?}");
        assert!(lens.iter().all(|&n| n > 10), "{lens:?}");
        assert_eq!(census.load(std::sync::atomic::Ordering::Relaxed), 64);

        // Owned anew (as when the workers start again): each connection moved to its
        // new owner, and still met by its replies, whoever reads them.
        {
            let mut tables: Vec<_> = workers
                .iter()
                .map(|p| p.conntrack.as_ref().unwrap().lock().unwrap())
                .collect();
            let mut all: Vec<&mut Conntrack> = tables.iter_mut().map(|g| &mut **g).collect();
            fibre_conntrack::Conntrack::redistribute(
                &mut all,
                Owners {
                    seed: 999,
                    ..owners
                },
            );
            assert_eq!(all[0].len() + all[1].len(), 64);
            assert_eq!(census.load(std::sync::atomic::Ordering::Relaxed), 64);
        }
        for k in 0..64u16 {
            let host = ([10, 0, 0, 2], 5000 + k);
            let far = ([10, 1, 0, (k % 7) as u8 + 1], 53);
            let (fate, _) = deliver(&mut workers, 1, &b0, &datagram(b0.mac, far, host));
            assert_eq!(fate, Fate::Out(a0.index), "flow {k} still established");
        }
    }

    /// A connection's verdict kept: after its first packet, its direction's packets
    /// meet no chain while the rules and routes stay; new rules (which drop it), new
    /// routes, or rules that read what its packets do not hold alike, and the chains
    /// are asked again.
    #[test]
    fn a_kept_verdict_holds_while_the_rules_and_routes_stay() {
        use fibre_firewall::build::{cmp, meta, payload, verdict};
        let (_, snap, a0, b0) = router("");
        let (_, other_routes, _, _) = router("");
        assert_ne!(snap.serial(), other_routes.serial());
        // forward: meta l4proto udp udp dport N VERDICT (policy accept).
        let rules = |port: u16, code: i32, read_ttl: bool| {
            let mut rule = vec![meta(16, 1), cmp(0, 1, &[17])];
            if read_ttl {
                // ip ttl != 9
                rule.extend([payload(1, 8, 1, 1), cmp(1, 1, &[9])]);
            }
            rule.extend([
                payload(2, 2, 2, 1),
                cmp(0, 1, &port.to_be_bytes()),
                verdict(code, None),
            ]);
            Arc::new(one_chain(
                fibre_firewall::message::Family::Ip,
                "fwd",
                (2, 1),
                vec![rule],
            ))
        };
        let mut pool = Pool::new(64, 2048);
        let mut pipeline = tracking(Filter::default(), 1);
        let a1 = snap.links().find(|l| l.name == "a1").unwrap().clone();
        let mut send_by = |pipeline: &mut Pipeline, snap: &Snapshot, by: &fibre_fib::Link| {
            let frame = udp4(by.mac, [10, 0, 0, 2], [10, 1, 0, 5], 64, 20);
            send_one(pipeline, snap, &mut pool, by, &frame)
        };
        let out = Fate::Out(b0.index);
        // The rules accept port 53: the first packet asks them, the next do not.
        pipeline.rules = rules(53, 1, false);
        assert_eq!(send_by(&mut pipeline, &snap, &a0), (out, 0));
        assert_eq!(send_by(&mut pipeline, &snap, &a0), (out, 1));
        assert_eq!(send_by(&mut pipeline, &snap, &a0), (out, 2));
        // Rules that drop it: dropped at once.
        pipeline.rules = rules(53, 0, false);
        assert_eq!(
            send_by(&mut pipeline, &snap, &a0),
            (Fate::Drop(Dropped::Filtered), 2)
        );
        assert_eq!(
            send_by(&mut pipeline, &snap, &a0),
            (Fate::Drop(Dropped::Filtered), 2)
        );
        // Accepting again; then other routes: asked again once each time.
        pipeline.rules = rules(53, 1, false);
        assert_eq!(send_by(&mut pipeline, &snap, &a0), (out, 2));
        assert_eq!(send_by(&mut pipeline, &snap, &a0), (out, 3));
        assert_eq!(send_by(&mut pipeline, &other_routes, &a0), (out, 3));
        assert_eq!(send_by(&mut pipeline, &other_routes, &a0), (out, 4));
        // Rules that read the time to live: asked for every packet.
        pipeline.rules = rules(53, 1, true);
        for _ in 0..3 {
            assert_eq!(send_by(&mut pipeline, &other_routes, &a0), (out, 4));
        }
        // Forward: iifname "a0" accept, policy drop. Kept coming in by a0; the same
        // flow coming in by a1 (leaving by b0 as well) is asked, and dropped.
        pipeline.rules = Arc::new(one_chain(
            fibre_firewall::message::Family::Ip,
            "fwd",
            (2, 0),
            vec![vec![
                meta(6, 1),
                cmp(0, 1, b"a0\0\0\0\0\0\0\0\0\0\0\0\0\0\0"),
                verdict(1, None),
            ]],
        ));
        assert_eq!(send_by(&mut pipeline, &snap, &a0), (out, 4));
        assert_eq!(send_by(&mut pipeline, &snap, &a0), (out, 5));
        assert_eq!(
            send_by(&mut pipeline, &snap, &a1),
            (Fate::Drop(Dropped::Filtered), 5)
        );
        assert_eq!(send_by(&mut pipeline, &snap, &a0), (out, 6));
        // The same at prerouting (no forward chain to ask again for the other link).
        pipeline.rules = Arc::new(one_chain(
            fibre_firewall::message::Family::Ip,
            "pre",
            (0, 0),
            vec![vec![
                meta(6, 1),
                cmp(0, 1, b"a0\0\0\0\0\0\0\0\0\0\0\0\0\0\0"),
                verdict(1, None),
            ]],
        ));
        assert_eq!(send_by(&mut pipeline, &snap, &a0), (out, 6));
        assert_eq!(send_by(&mut pipeline, &snap, &a0), (out, 7));
        assert_eq!(
            send_by(&mut pipeline, &snap, &a1),
            (Fate::Drop(Dropped::Filtered), 7)
        );
    }

    /// A connection's first packet meets the chains before NAT binds it: its reply
    /// tuple is then not what its later packets carry, and its verdict is not kept.
    /// Masquerade out of b0; forward: ct reply daddr 10.0.0.2 accept, policy drop. The
    /// first packet passes (its reply still to 10.0.0.2); the next, the reply now to the
    /// router's address, is dropped, as the kernel drops it.
    #[test]
    fn a_kept_verdict_waits_for_the_binding() {
        use fibre_firewall::build::{cmp, ct, masquerade, ruleset, verdict, ChainSpec};
        let (_, snap, a0, b0) = router("");
        let mut pipeline = tracking(
            Filter::of(&ruleset(
                fibre_firewall::message::Family::Ip,
                "fw",
                vec![
                    ChainSpec {
                        nat: true,
                        name: "post".into(),
                        hook: Some((4, 1)),
                        rules: vec![vec![masquerade()]],
                    },
                    ChainSpec {
                        nat: false,
                        name: "fwd".into(),
                        hook: Some((2, 0)),
                        rules: vec![vec![
                            ct(20, 1, Some(1)),
                            cmp(0, 1, &[10, 0, 0, 2]),
                            verdict(1, None),
                        ]],
                    },
                ],
            )),
            1,
        );
        let mut pool = Pool::new(8, 2048);
        let frame = udp4(a0.mac, [10, 0, 0, 2], [10, 1, 0, 5], 64, 20);
        let mut send = |pipeline: &mut Pipeline| send_one(pipeline, &snap, &mut pool, &a0, &frame);
        assert_eq!(send(&mut pipeline), (Fate::Out(b0.index), 0));
        assert_eq!(send(&mut pipeline), (Fate::Drop(Dropped::Filtered), 0));
    }

    /// An IPv6 connection's packets with an authentication header are its own for
    /// conntrack, which steps over it, but the chains take it for the transport: a
    /// verdict kept from its packets without one stands for none with one.
    #[test]
    fn a_kept_verdict_is_not_one_for_ipv6_extension_headers() {
        use fibre_firewall::build::{cmp, meta, payload, verdict};
        let (_, snap, a0, b0) = router("");
        // forward: meta l4proto udp udp dport 53 accept, policy drop.
        let rule = vec![
            meta(16, 1),
            cmp(0, 1, &[17]),
            payload(2, 2, 2, 1),
            cmp(0, 1, &53u16.to_be_bytes()),
            verdict(1, None),
        ];
        let mut pipeline = tracking(
            one_chain(
                fibre_firewall::message::Family::Ip6,
                "fwd",
                (2, 0),
                vec![rule],
            ),
            2,
        );
        let plain = udp6(a0.mac, "fd00::2", "2001:db8:1::5", 64);
        // The same datagram behind an authentication header (next header 17, 24 bytes).
        let mut with_ah = plain[..ETHERNET_LEN + 40].to_vec();
        with_ah[ETHERNET_LEN + 6] = 51;
        let len = u16::from_be_bytes([with_ah[ETHERNET_LEN + 4], with_ah[ETHERNET_LEN + 5]]);
        with_ah[ETHERNET_LEN + 4..ETHERNET_LEN + 6].copy_from_slice(&(len + 24).to_be_bytes());
        with_ah.extend_from_slice(&[17, 4, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1]);
        with_ah.extend_from_slice(&[0; 12]);
        with_ah.extend_from_slice(&plain[ETHERNET_LEN + 40..]);
        let mut pool = Pool::new(8, 2048);
        let mut send = |pipeline: &mut Pipeline, frame: &[u8]| {
            send_one(pipeline, &snap, &mut pool, &a0, frame)
        };
        let out = Fate::Out(b0.index);
        assert_eq!(send(&mut pipeline, &plain), (out, 0));
        assert_eq!(send(&mut pipeline, &plain), (out, 1));
        assert_eq!(
            send(&mut pipeline, &with_ah),
            (Fate::Drop(Dropped::Filtered), 1)
        );
        assert_eq!(send(&mut pipeline, &plain), (out, 2));
    }

    type Flow = (u8, [u8; 4], u16, [u8; 4], u16);

    /// NAT over the whole pipeline, with random flows from `a0`'s network to beyond
    /// `b0`, masqueraded: each leaves from the router's address on `b0`, its checksums
    /// holding, no two flows to one destination on the same tuple, a port kept where no
    /// other flow holds it; each reply, made of what left, comes back through the
    /// pipeline to the flow's own source and port, its checksums holding. Random
    /// protocols (UDP, TCP, ICMP echo), sources and ports from small sets (so that
    /// ports collide), across vectors of one pipeline; and the same across two
    /// workers with a table each, each packet read by either (and handed to its
    /// connection's owner): the ports chosen as one table would (the registry), each
    /// reply, whose translated tuple hashes anywhere, brought to its connection's owner.
    #[test]
    fn masqueraded_flows_and_their_replies_round_trip() {
        use fibre_firewall::build::{masquerade, ruleset, ChainSpec};
        let (_, snap, a0, b0) = router("");
        let nat = ruleset(
            fibre_firewall::message::Family::Ip,
            "nat",
            vec![ChainSpec {
                nat: true,
                name: "post".into(),
                hook: Some((4, 1)),
                rules: vec![vec![masquerade()]],
            }],
        );
        let neighbours = |_: LinkIndex, _: IpAddr| Some(NEIGHBOUR);
        let mut pool = Pool::new(64, 2048);
        let mut handed = 0;
        let mut run = |pipelines: &mut [Pipeline],
                       rng: &mut rand::rngs::StdRng,
                       link: &fibre_fib::Link,
                       frames: &[Vec<u8>]| {
            let mut out = Vec::new();
            let arrival = Arrival {
                link: link.index,
                mac: link.mac,
            };
            if pipelines.len() > 1 {
                // One at a time, each read by either worker, handed on if not its own.
                for f in frames {
                    let mut w = rng.gen_range(0..pipelines.len());
                    let mut hops = 0;
                    loop {
                        let mut ids = Vec::new();
                        pool.alloc(1, &mut ids);
                        pool.fill(ids[0], f);
                        let mut fates = Vec::new();
                        pipelines[w].run(&snap, &neighbours, arrival, &mut pool, &ids, &mut fates);
                        let frame = pool.frame(ids[0]).to_vec();
                        pool.free(&ids);
                        match fates[0] {
                            Fate::Handoff(to) => {
                                assert_ne!(usize::from(to), w);
                                handed += 1;
                                hops += 1;
                                assert!(hops <= 2, "handed on and on: {f:02x?}");
                                w = usize::from(to);
                            }
                            fate => {
                                out.push((fate, frame));
                                break;
                            }
                        }
                    }
                }
                return out;
            }
            let pipeline = &mut pipelines[0];
            for chunk in frames.chunks(32) {
                let mut ids = Vec::new();
                pool.alloc(chunk.len(), &mut ids);
                for (id, f) in ids.iter().zip(chunk) {
                    pool.fill(*id, f);
                }
                let mut fates = Vec::new();
                pipeline.run(&snap, &neighbours, arrival, &mut pool, &ids, &mut fates);
                for (id, fate) in ids.iter().zip(&fates) {
                    out.push((*fate, pool.frame(*id).to_vec()));
                }
                pool.free(&ids);
            }
            out
        };
        for seed in 0..16u64 {
            let workers = 1 + seed as usize % 2;
            let mailboxes = Arc::new(
                (0..workers)
                    .map(|_| crate::handoff::Mailbox::new().unwrap())
                    .collect::<Vec<_>>(),
            );
            let census = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let registry = Arc::new(std::sync::Mutex::new(fibre_conntrack::Registry::default()));
            let mut pipelines: Vec<Pipeline> = (0..workers)
                .map(|me| {
                    let mut pipeline = Pipeline::new();
                    pipeline.rules = Arc::new(Filter::of(&nat));
                    pipeline.tracked = 1;
                    let mut table = Conntrack::new(fibre_conntrack::Settings::kernel_defaults());
                    table.set_census(census.clone());
                    table.set_registry(registry.clone());
                    table.register(1);
                    table.set_owners(fibre_conntrack::Owners {
                        workers: workers as u16,
                        me: me as u16,
                        seed: 77,
                    });
                    pipeline.conntrack = Some(Arc::new(std::sync::Mutex::new(table)));
                    pipeline.mailboxes = Some(mailboxes.clone());
                    pipeline
                })
                .collect();
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            // Each flow: protocol, source, source port, destination, destination port.
            let mut flows: Vec<Flow> = Vec::new();
            while flows.len() < 120 {
                let proto = [6, 17, 1][rng.gen_range(0..3)];
                let flow = (
                    proto,
                    [10, 0, 0, rng.gen_range(2..6)],
                    [1000, 2000, 40000, 40001, 700][rng.gen_range(0..5)],
                    [10, 1, 0, rng.gen_range(1..4)],
                    if proto == 1 {
                        0
                    } else {
                        [53, 80][rng.gen_range(0..2)]
                    },
                );
                if !flows.contains(&flow) {
                    flows.push(flow);
                }
            }
            let frame = |from: [u8; 6], to: [u8; 6], f: &Flow, reply: bool| {
                let b = PacketBuilder::ethernet2(from, to).ipv4(f.1, f.3, 64);
                let mut out = Vec::new();
                match (f.0, reply) {
                    (6, _) => {
                        let t = b.tcp(f.2, f.4, 1, 64240);
                        if reply { t.syn().ack(2) } else { t.syn() }
                            .write(&mut out, &[])
                            .unwrap()
                    }
                    (17, _) => b.udp(f.2, f.4).write(&mut out, &[5; 11]).unwrap(),
                    (_, false) => b
                        .icmpv4_echo_request(f.2, 1)
                        .write(&mut out, &[1; 8])
                        .unwrap(),
                    (_, true) => b
                        .icmpv4_echo_reply(f.2, 1)
                        .write(&mut out, &[1; 8])
                        .unwrap(),
                }
                out
            };
            let frames: Vec<Vec<u8>> = flows
                .iter()
                .map(|f| frame(NEIGHBOUR, a0.mac, f, false))
                .collect();
            let sent = run(&mut pipelines, &mut rng, &a0, &frames);
            let mut replies = Vec::new();
            let mut seen = std::collections::HashSet::new();
            let mut mapped = HashMap::new();
            for ((fate, out), f) in sent.iter().zip(&flows) {
                assert_eq!(*fate, Fate::Out(b0.index), "{f:?}");
                assert!(checksums_hold(out), "{f:?}: {out:02x?}");
                let ip = &out[ETHERNET_LEN..];
                assert_eq!(
                    (&ip[12..16], &ip[16..20]),
                    (&[10, 0, 1, 1][..], &f.3[..]),
                    "{f:?}"
                );
                let port = u16::from_be_bytes(if f.0 == 1 {
                    [ip[24], ip[25]]
                } else {
                    [ip[20], ip[21]]
                });
                // The port the latest earlier flow from the same source got (the
                // kernel's `find_appropriate_src`), else its own, kept where no earlier
                // flow to the same place holds it; else moved within its class (ports
                // under 1024 stay under it, ICMP identifiers anywhere).
                let wanted = mapped
                    .insert((f.0, f.1, f.2), port)
                    .filter(|w| !seen.contains(&(f.0, f.3, f.4, *w)));
                let own_free = !seen.contains(&(f.0, f.3, f.4, f.2));
                if let Some(w) = wanted {
                    assert_eq!(port, w, "{f:?}");
                } else if own_free {
                    assert_eq!(port, f.2, "{f:?}");
                } else if f.0 != 1 {
                    assert_eq!((port < 1024, f.2 < 1024), (f.2 < 1024, f.2 < 1024), "{f:?}");
                }
                assert!(seen.insert((f.0, f.3, f.4, port)), "{f:?}: a tuple twice");
                // An echo's answer carries the identifier where a port would be.
                let back = match f.0 {
                    1 => (1, f.3, port, [10, 0, 1, 1], 0),
                    _ => (f.0, f.3, f.4, [10, 0, 1, 1], port),
                };
                replies.push(frame(NEIGHBOUR, b0.mac, &back, true));
            }
            let back = run(&mut pipelines, &mut rng, &b0, &replies);
            for ((fate, out), f) in back.iter().zip(&flows) {
                assert_eq!(*fate, Fate::Out(a0.index), "{f:?}");
                assert!(checksums_hold(out), "{f:?}: {out:02x?}");
                let ip = &out[ETHERNET_LEN..];
                assert_eq!((&ip[12..16], &ip[16..20]), (&f.3[..], &f.1[..]), "{f:?}");
                let port = u16::from_be_bytes(if f.0 == 1 {
                    [ip[24], ip[25]]
                } else {
                    [ip[22], ip[23]]
                });
                assert_eq!(port, f.2, "{f:?}");
            }
            // Every connection in one table: its owner's.
            let held: usize = pipelines
                .iter()
                .map(|p| p.conntrack.as_ref().unwrap().lock().unwrap().len())
                .sum();
            assert_eq!(held, flows.len());
            assert_eq!(registry.lock().unwrap().len(), 2 * flows.len());
            if workers > 1 {
                // Replies whose translated tuple hashes to the other worker: forwarded.
                let forwards: usize = pipelines
                    .iter()
                    .map(|p| p.conntrack.as_ref().unwrap().lock().unwrap().forwards())
                    .sum();
                assert!(forwards > 10, "{forwards}");
            }
            // Their time up: every connection gone, and with them every tuple of the
            // registry, every mapped source and every forward, once the tables have
            // told each other.
            let mut told = Vec::new();
            for p in &pipelines {
                let mut t = p.conntrack.as_ref().unwrap().lock().unwrap();
                t.expire(u64::MAX, usize::MAX);
                t.drain_outbox(&mut told);
            }
            for (to, f) in told {
                mailboxes[usize::from(to)].tell(f);
            }
            for (p, m) in pipelines.iter().zip(mailboxes.iter()) {
                let mut t = p.conntrack.as_ref().unwrap().lock().unwrap();
                m.take_forwards(|f| t.forward(f));
                assert_eq!((t.len(), t.forwards()), (0, 0));
            }
            let registry = registry.lock().unwrap();
            assert_eq!((registry.len(), registry.sources()), (0, 0));
        }
        assert!(handed > 100, "{handed}");
    }
}
