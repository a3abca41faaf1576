//! The stages over a vector of packets from one link: input, route, neighbour, rewrite.
//!
//! Each stage runs over the whole vector before the next starts, as VPP's graph nodes
//! do, so that a stage's code and data stay in cache across the vector and the route
//! stage can search the FIB for all of the vector's flows together
//! ([`Snapshot::lookup_vector_v4`]). Each stage is timed once per vector
//! ([`crate::runtime`]); each packet's fate is counted.
//!
//! - input: the frame checked and sorted ([`crate::input`]);
//! - route: the FIB's answer for the flow as it arrived on the link, rules and all;
//!   this host's own destinations go to the kernel;
//! - neighbour: the TTL or hop limit and the MTU checked, the next hop's MAC address found
//!   (without one, the packet goes to the kernel, which resolves it);
//! - rewrite: TTL or hop limit down by one, MAC addresses set, the output link named.
//!
//! Not yet: the ICMP errors a router sends for what it drops here (time exceeded,
//! unreachable, packet too big) are counted but not made, and IPv4 packets too big
//! without DF are dropped rather than fragmented.

use crate::input::{self, Input, Packet4, Packet6};
use crate::pool::{BufferId, Pool};
use crate::rewrite;
use crate::runtime::StageCounters;
use fibre_fib::{FlowVector, Hop, LinkIndex, NoRoute, Query, RouteType, Snapshot, VectorAnswers};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Instant;

/// The neighbour table the neighbour stage reads: the MAC address of `addr` on `link`.
pub trait Neighbours {
    /// The MAC address, if the entry is usable.
    fn mac(&self, link: LinkIndex, addr: IpAddr) -> Option<[u8; 6]>;
}

impl<F: Fn(LinkIndex, IpAddr) -> Option<[u8; 6]>> Neighbours for F {
    fn mac(&self, link: LinkIndex, addr: IpAddr) -> Option<[u8; 6]> {
        self(link, addr)
    }
}

/// The link a vector of packets arrived on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arrival {
    /// Its index.
    pub link: LinkIndex,
    /// Its MAC address: frames sent to another are not this host's.
    pub mac: [u8; 6],
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
}

/// Why a packet was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dropped {
    /// The input stage's reason.
    Input(input::Drop),
    /// The FIB's answer: no route, a reject route or rule, a martian source.
    NoRoute(NoRoute),
    /// The TTL or hop limit would reach 0 (ICMP time exceeded, not made yet).
    TtlExpired,
    /// Longer than the route's or the output link's MTU (ICMP packet too big or
    /// fragmentation needed, not made yet).
    TooBig,
    /// The route names a link the snapshot does not hold.
    NoLink,
}

/// Where a packet went.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fate {
    /// Rewritten, to be sent out of this link.
    Out(LinkIndex),
    /// To the kernel, untouched.
    Kernel(Handed),
    /// Dropped.
    Drop(Dropped),
}

/// The stages, their counters, and the room they work in (made once, reused).
#[derive(Default)]
pub struct Pipeline {
    /// The input stage's cost.
    pub input: StageCounters,
    /// The route stage's cost.
    pub route: StageCounters,
    /// The neighbour stage's cost.
    pub neighbour: StageCounters,
    /// The rewrite stage's cost.
    pub rewrite: StageCounters,
    /// Packets by fate.
    pub fates: HashMap<Fate, u64>,
    inputs: Vec<Input>,
    hops: Vec<Option<Hop>>,
    v4: Vec<(usize, Packet4)>,
    v6: Vec<(usize, Packet6)>,
    dst4: Vec<Ipv4Addr>,
    src4: Vec<Ipv4Addr>,
    dst6: Vec<Ipv6Addr>,
    src6: Vec<Ipv6Addr>,
    answers: Option<VectorAnswers<'static>>,
    next: Vec<(usize, [u8; 6])>,
}

impl Pipeline {
    /// A pipeline with nothing counted.
    pub fn new() -> Pipeline {
        Pipeline::default()
    }

    /// The stages' counters in order, named.
    pub fn stages(&self) -> [(&'static str, StageCounters); 4] {
        [
            ("input", self.input),
            ("route", self.route),
            ("neighbour", self.neighbour),
            ("rewrite", self.rewrite),
        ]
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

        // Input.
        let t = Instant::now();
        self.inputs.clear();
        self.v4.clear();
        self.v6.clear();
        for (i, &id) in packets.iter().enumerate() {
            let input = input::classify(pool.frame(id), mac);
            match input {
                Input::V4(p) => self.v4.push((i, p)),
                Input::V6(p) => self.v6.push((i, p)),
                Input::Kernel(k) => fates[i] = Fate::Kernel(Handed::Input(k)),
                Input::Drop(d) => fates[i] = Fate::Drop(Dropped::Input(d)),
            }
            self.inputs.push(input);
        }
        self.input.add(n, t);

        // Route.
        let t = Instant::now();
        self.hops.clear();
        self.hops.resize(n, None);
        let mut answers = self.answers.take().unwrap_or_default().recycle();
        if !self.v4.is_empty() {
            self.dst4.clear();
            self.src4.clear();
            self.dst4.extend(self.v4.iter().map(|(_, p)| p.dst));
            self.src4.extend(self.v4.iter().map(|(_, p)| p.src));
            let v4 = &self.v4;
            let flow = FlowVector {
                iif: Some(iif),
                dst: &self.dst4,
                src: &self.src4,
            };
            snap.lookup_vector_v4(&flow, |k| query4(iif, &v4[k].1), &mut answers);
            for (k, &(i, _)) in self.v4.iter().enumerate() {
                route_fate(answers.get(k), i, &mut self.hops, fates);
            }
        }
        if !self.v6.is_empty() {
            answers = answers.recycle();
            self.dst6.clear();
            self.src6.clear();
            self.dst6.extend(self.v6.iter().map(|(_, p)| p.dst));
            self.src6.extend(self.v6.iter().map(|(_, p)| p.src));
            let v6 = &self.v6;
            let flow = FlowVector {
                iif: Some(iif),
                dst: &self.dst6,
                src: &self.src6,
            };
            snap.lookup_vector_v6(&flow, |k| query6(iif, &v6[k].1), &mut answers);
            for (k, &(i, _)) in self.v6.iter().enumerate() {
                route_fate(answers.get(k), i, &mut self.hops, fates);
            }
        }
        self.answers = Some(answers.recycle());
        let routed = self.v4.len() + self.v6.len();
        self.route.add(routed, t);

        // Neighbour: hop count, MTU, the next hop's MAC address.
        let t = Instant::now();
        let mut next = std::mem::take(&mut self.next);
        next.clear();
        for (i, fate) in fates.iter_mut().enumerate() {
            let Some(hop) = self.hops[i] else { continue };
            let (dst, hops_left, len) = match self.inputs[i] {
                Input::V4(p) => (IpAddr::V4(p.dst), p.ttl, p.len as u32),
                Input::V6(p) => (IpAddr::V6(p.dst), p.hop_limit, 40 + p.len as u32),
                _ => continue,
            };
            let Some(link) = snap.link(hop.dev) else {
                *fate = Fate::Drop(Dropped::NoLink);
                continue;
            };
            *fate = if hops_left <= 1 {
                Fate::Drop(Dropped::TtlExpired)
            } else if len > hop.mtu.unwrap_or(link.mtu).min(link.mtu) {
                Fate::Drop(Dropped::TooBig)
            } else {
                match neighbours.mac(hop.dev, hop.gateway.unwrap_or(dst)) {
                    Some(m) => {
                        next.push((i, m));
                        Fate::Out(hop.dev)
                    }
                    None => Fate::Kernel(Handed::Unresolved),
                }
            };
        }
        self.neighbour.add(routed, t);

        // Rewrite.
        let t = Instant::now();
        for &(i, dst_mac) in &next {
            let Fate::Out(dev) = fates[i] else { continue };
            let src_mac = snap.link(dev).map_or([0; 6], |l| l.mac);
            let frame = pool.frame_mut(packets[i]);
            match self.inputs[i] {
                Input::V4(_) => rewrite::decrement_ttl(frame),
                _ => rewrite::decrement_hop_limit(frame),
            };
            rewrite::set_macs(frame, dst_mac, src_mac);
        }
        self.rewrite.add(next.len(), t);
        self.next = next;

        for f in fates.iter() {
            *self.fates.entry(*f).or_default() += 1;
        }
    }
}

/// The FIB's answer `answer` for packet `i`: a hop to forward through, or its fate.
fn route_fate(
    answer: Result<&Hop, NoRoute>,
    i: usize,
    hops: &mut [Option<Hop>],
    fates: &mut [Fate],
) {
    match answer {
        Ok(hop) if hop.kind == RouteType::Unicast => hops[i] = Some(*hop),
        Ok(_) => fates[i] = Fate::Kernel(Handed::Local),
        Err(e) => fates[i] = Fate::Drop(Dropped::NoRoute(e)),
    }
}

/// The whole query of an IPv4 packet arriving on `iif` (rules on TOS, protocol and ports,
/// and the multipath hash, read them).
fn query4(iif: LinkIndex, p: &Packet4) -> Query {
    let (sport, dport) = p.ports.unwrap_or((0, 0));
    Query {
        src: Some(IpAddr::V4(p.src)),
        iif: Some(iif),
        tos: p.tos,
        ipproto: p.protocol,
        sport,
        dport,
        ..Query::to(IpAddr::V4(p.dst))
    }
}

/// The whole query of an IPv6 packet arriving on `iif`.
fn query6(iif: LinkIndex, p: &Packet6) -> Query {
    let (sport, dport) = p.ports.unwrap_or((0, 0));
    Query {
        src: Some(IpAddr::V6(p.src)),
        iif: Some(iif),
        tos: p.traffic_class,
        ipproto: p.next_header,
        sport,
        dport,
        ..Query::to(IpAddr::V6(p.dst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::ETHERNET_LEN;
    use etherparse::{Ipv4HeaderSlice, PacketBuilder};
    use fibre_fib::{config, State};
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

    fn udp4(to: [u8; 6], src: [u8; 4], dst: [u8; 4], ttl: u8, payload: usize) -> Vec<u8> {
        let b = PacketBuilder::ethernet2([2, 9, 9, 9, 9, 9], to)
            .ipv4(src, dst, ttl)
            .udp(4000, 53);
        let mut out = Vec::new();
        b.write(&mut out, &vec![7; payload]).unwrap();
        out
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

    /// Packets arriving on `a0` each meet their fate: forwarded (rewritten as a router
    /// rewrites them), to the kernel, or dropped, each for its reason; and every packet
    /// forwarded leaves by the link the FIB's single lookup names for it.
    #[test]
    fn each_packet_meets_its_fate() {
        let mut state = State::new();
        config::apply_text(&mut state, "config", CONFIG).unwrap();
        config::apply_text(&mut state, "rule", RULE).unwrap();
        let snap = state.snapshot();
        let link = |name: &str| snap.links().find(|l| l.name == name).unwrap().clone();
        let (a0, b0) = (link("a0"), link("b0"));
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
        let mut pool = Pool::new(64, 2048);
        let mut ids = Vec::new();
        pool.alloc(cases.len(), &mut ids);
        for (id, (_, frame, _)) in ids.iter().zip(&cases) {
            pool.fill(*id, frame);
        }
        let mut pipeline = Pipeline::new();
        let mut fates = Vec::new();
        let arrival = Arrival {
            link: a0.index,
            mac: a0.mac,
        };
        pipeline.run(&snap, &neighbours, arrival, &mut pool, &ids, &mut fates);
        for ((what, frame, want), (id, got)) in cases.iter().zip(ids.iter().zip(&fates)) {
            assert_eq!(got, want, "{what}");
            let now = pool.frame(*id);
            if let Fate::Out(dev) = got {
                // Rewritten: the next hop's MAC, the output link's, one hop less.
                assert_eq!(&now[..6], &NEIGHBOUR, "{what}");
                assert_eq!(&now[6..12], &link("b0").mac, "{what}");
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
            } else {
                assert_eq!(now, &frame[..], "{what}: untouched");
            }
        }
        // Counted: one call of each stage, each packet's fate.
        assert_eq!(pipeline.input.calls, 1);
        assert_eq!(pipeline.input.packets, cases.len() as u64);
        assert_eq!(pipeline.fates.values().sum::<u64>(), cases.len() as u64);
        assert_eq!(pipeline.fates[&Fate::Out(b0.index)], 3);
    }

    /// Vectors of random destinations: each packet the pipeline sends out leaves by the
    /// link the FIB's single lookup gives for the same flow, and each it drops for want of
    /// a route is one the lookup refuses alike.
    #[test]
    fn the_route_stage_agrees_with_single_lookups() {
        let mut state = State::new();
        config::apply_text(&mut state, "config", CONFIG).unwrap();
        let snap = state.snapshot();
        let a0 = snap.links().find(|l| l.name == "a0").unwrap().clone();
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
                    (Ok(_), Fate::Drop(Dropped::TooBig)) => {}
                    (want, got) => panic!("{q:?}: the lookup says {want:?}, the pipeline {got:?}"),
                }
            }
            pool.free(&ids);
        }
        assert!(pipeline.route.packets >= 5000);
    }
}
