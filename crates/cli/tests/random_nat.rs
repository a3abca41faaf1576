//! Random rulesets with connection tracking and NAT, through the kernel's forwarding and
//! through `fibre forward`, frame by frame.
//!
//! Each round makes a router in a namespace (veth `a0` toward the inside hosts, `b0`
//! toward the outside ones), loads a random ruleset into it with `nft -f`, and plays
//! random connections through it from a packet socket on each link's far end: TCP
//! (handshakes, data both ways, FIN, RST, segments out of the window, odd flags, pickups
//! in mid-stream), UDP (answered with data or an ICMP error quoting it), ICMP echoes;
//! out through NAT, in from outside, to port forwards on the router's outside address,
//! and back in from inside to them (hairpin), IPv4 and IPv6, now and then with a time
//! to live that runs out at the router. A host answers what reached it, as the router
//! translated it, so that replies find their connections. Every frame sent into the
//! router goes into a capture on an interface block named after the link it arrived on;
//! `fibre forward` then forwards that capture, one packet a vector as the kernel took
//! them, with the same ruleset file, and what left each link must be what the kernel
//! sent out of it, byte for byte (an ICMP error's identification and checksum aside).
//! Every other round `fibre forward` runs two workers with a table each, reading the
//! packets in turn and handing each to its connection's owner (a translated reply by
//! what the owner's table told the worker its tuple hashes to), as the daemon's do.
//!
//! The rulesets: filter chains at prerouting (before and after destination NAT) and
//! forward, with policies, and regular chains reached by `jump` and `goto`; matches on
//! the connection (state, status, direction), links, protocols, addresses, ports, TCP
//! flags, in sets too; verdicts accept, drop, `reject` of every kind (TCP resets, which
//! the kernel's NAT translates by the connection they answer, too), `return`, a counter
//! alone.
//! NAT: `dnat` to addresses, address ranges, ports and port ranges; `snat` to an address
//! or a range, `persistent` at times; `masquerade`, with a port range at times. No
//! `redirect`: fibre hands what it redirects to the kernel, which offline is no one
//! (the prerouting chains after NAT are the kernel's to run on it). Never `random` or
//! `fully-random`, with which the kernel draws ports at random; and each connection's
//! client port (or echo identifier) is its own in a round, so that no NAT mapping
//! clashes and every mapping is the kernel's to reproduce (clashes are `forward_capture.rs`'s).
//!
//! A round's kernel side ends on an event, not on a quiet spell: after the round's frames,
//! a sentinel UDP frame is sent into each link ([`sentinel`]), which every ruleset
//! forwards out of the other (its own accept rule comes first in every filter chain, and
//! no NAT rule reads its addresses or port). The frames are sent from one core, so they
//! queue on one CPU's backlog and the kernel handles them in order: once both sentinels
//! came out, everything the round's frames made has come out before them. A sentinel
//! that never comes fails the round. `fibre forward` reads a capture, which ends by
//! itself, and never sees the sentinels.
//!
//! What the kernel does of its own accord is kept out of the comparison: an input chain
//! drops what is for the router (which would answer it), redirects are not sent (fibre
//! sends none yet), and the limits on ICMP errors are lifted in the router's namespace,
//! where `fibre forward` runs too. `FIBRE_SEED=N` replays a run.

mod common;

use common::frames::{kernels_own, normal};
use common::Namespace;
use fibre_dataplane::capture::{read_capture, Frame, SentCapture};
use fibre_dataplane::packet::PacketSocket;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::process::Command;
use std::time::{Duration, Instant};

const FIBRE: &str = env!("CARGO_BIN_EXE_fibre");

/// Rulesets tried in a run.
const ROUNDS: usize = 24;
/// Frames sent into the router in each round.
const PACKETS_PER_ROUND: usize = 5_000;
/// The first client port (and echo identifier) of a round; each connection takes the
/// next.
const FIRST_CLIENT_PORT: u16 = 20_000;
/// The payload of the frames that end a round ([`sentinel`]).
const SENTINEL: &[u8] = b"random NAT test: the frames before me are all out";
/// The sentinel's source port and destination port: none of a connection's, before NAT
/// or after it (servers' ports are below 10,000, clients' from [`FIRST_CLIENT_PORT`]).
const SENTINEL_PORTS: (u16, u16) = (4999, 4545);
/// How long the kernel may take to forward a round's sentinels before the round fails:
/// far past what it takes (milliseconds), never the normal end.
const SENTINEL_WITHIN: Duration = Duration::from_secs(30);

const A0: [u8; 6] = [2, 0, 0, 0, 0x0a, 0];
const B0: [u8; 6] = [2, 0, 0, 0, 0x0b, 0];
const HOST_A: [u8; 6] = [2, 0, 0, 0, 0x0a, 0x02];
const HOST_B: [u8; 6] = [2, 0, 0, 0, 0x0b, 0x02];

/// The router: the inside (192.0.2.0/24, 2001:db8:9::/48) behind `a0`, the outside
/// (10.1.0.0/16, 2001:db8:1::/48) behind `b0`, half of the outside's IPv4 hosts by a
/// route with a hop limit (what the router sends them, and its resets of what is sent
/// to them, leave with it); neighbours fixed, those of the `snat`
/// range's addresses too, so that what is sent to them without a connection is
/// forwarded alike rather than waiting on a neighbour that never answers.
fn router_config() -> String {
    let mut text = String::from(
        "\
link add a0 address 02:00:00:00:0a:00 type veth peer name a1 address 02:00:00:00:0a:01
link add b0 address 02:00:00:00:0b:00 type veth peer name b1 address 02:00:00:00:0b:01
link set a0 up
link set a1 up
link set b0 up
link set b1 up
addr add 10.0.0.1/24 dev a0
addr add 10.0.1.1/24 dev b0
addr add fd00::1/64 dev a0
addr add fd01::1/64 dev b0
route add 10.1.0.0/16 via 10.0.1.2
route add 10.1.1.0/24 via 10.0.1.2 hoplimit 44
route add 192.0.2.0/24 via 10.0.0.2
route add 2001:db8:1::/48 via fd01::2
route add 2001:db8:9::/48 via fd00::2
neigh add 10.0.1.2 lladdr 02:00:00:00:0b:02 dev b0
neigh add 10.0.0.2 lladdr 02:00:00:00:0a:02 dev a0
neigh add fd01::2 lladdr 02:00:00:00:0b:02 dev b0
neigh add fd00::2 lladdr 02:00:00:00:0a:02 dev a0
",
    );
    for k in 100..=110 {
        let _ = writeln!(
            text,
            "neigh add 10.0.1.{k} lladdr 02:00:00:00:0c:{k:02x} dev b0"
        );
    }
    text
}

/// What the kernel's router gets beside the ruleset: an input chain that drops what is
/// for the router itself, so that it answers nothing (fibre hands such packets to the
/// kernel, which offline is no one).
const SINK: &str = "table inet for_the_router {
  chain deliver { type filter hook input priority 1000; policy drop; }
}
";

/// A side of the router.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Side {
    /// Behind `a0`: the inside.
    A,
    /// Behind `b0`: the outside.
    B,
}

impl Side {
    fn link(self) -> &'static str {
        match self {
            Side::A => "a0",
            Side::B => "b0",
        }
    }

    /// (the host's MAC address, the router's on this side)
    fn macs(self) -> ([u8; 6], [u8; 6]) {
        match self {
            Side::A => (HOST_A, A0),
            Side::B => (HOST_B, B0),
        }
    }
}

/// What a host on the far side saw of a connection's client packet: the addresses and
/// ports as the router translated them, and the IP packet itself (for an ICMP error to
/// quote).
#[derive(Clone, Debug)]
struct Seen {
    side: Side,
    src: IpAddr,
    dst: IpAddr,
    sport: u16,
    dport: u16,
    packet: Vec<u8>,
}

/// A connection the round plays.
#[derive(Clone, Debug)]
struct Flow {
    v6: bool,
    /// 6, 17, or 1 for an echo (ICMPv6's in IPv6).
    proto: u8,
    client: Side,
    src: IpAddr,
    dst: IpAddr,
    /// The client's port, or the echo's identifier: the round's own.
    sport: u16,
    dport: u16,
    seen: Option<Seen>,
    /// The client's next sequence number, the server's.
    client_seq: u32,
    server_seq: u32,
    /// The client's SYN, and the server's SYN-ACK, sent.
    syn: bool,
    syn_ack: bool,
    echo_seq: u16,
    sent: usize,
}

fn v4(a: [u8; 4]) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(a))
}

fn v6(s: &str) -> IpAddr {
    IpAddr::V6(s.parse::<Ipv6Addr>().unwrap())
}

fn inside(rng: &mut StdRng, is_v6: bool) -> IpAddr {
    let k: u8 = rng.gen_range(2..=30);
    if is_v6 {
        v6(&format!("2001:db8:9::{k:x}"))
    } else {
        v4([192, 0, 2, k])
    }
}

fn outside(rng: &mut StdRng, is_v6: bool) -> IpAddr {
    let k: u8 = rng.gen_range(2..=30);
    if is_v6 {
        v6(&format!("2001:db8:1::{k:x}"))
    } else {
        v4([10, 1, rng.gen_range(0..2), k])
    }
}

/// The ports the rulesets forward on the router's outside address.
const FORWARDED: [u16; 4] = [8080, 2222, 5353, 9000];

fn server_port(rng: &mut StdRng, proto: u8) -> u16 {
    match proto {
        6 => pick(rng, &[22, 80, 443, 8080, 2222]),
        17 => pick(rng, &[53, 123, 5353, 9000]),
        _ => 0,
    }
}

fn pick<T: Copy>(rng: &mut StdRng, choices: &[T]) -> T {
    choices[rng.gen_range(0..choices.len())]
}

/// A new connection with client port `sport`: out (inside to outside), in (outside to
/// inside), to a port forward (outside to the router's outside address), or hairpin
/// (inside to that address; IPv4: an IPv6 router sends redirects for it, which fibre
/// does not).
fn new_flow(rng: &mut StdRng, sport: u16) -> Flow {
    let is_v6 = rng.gen_bool(0.3);
    let proto = pick(rng, &[6, 6, 6, 17, 17, 1]);
    let kind = rng.gen_range(0..10);
    let outside_address = if is_v6 {
        v6("fd01::1")
    } else {
        v4([10, 0, 1, 1])
    };
    let (client, src, dst, dport) = match kind {
        0..=4 => (
            Side::A,
            inside(rng, is_v6),
            outside(rng, is_v6),
            server_port(rng, proto),
        ),
        5..=6 => (
            Side::B,
            outside(rng, is_v6),
            inside(rng, is_v6),
            server_port(rng, proto),
        ),
        9 if !is_v6 => (
            Side::A,
            inside(rng, is_v6),
            outside_address,
            pick(rng, &FORWARDED),
        ),
        _ => (
            Side::B,
            outside(rng, is_v6),
            outside_address,
            pick(rng, &FORWARDED),
        ),
    };
    Flow {
        v6: is_v6,
        proto,
        client,
        src,
        dst,
        sport,
        dport: if proto == 1 { 0 } else { dport },
        seen: None,
        client_seq: rng.gen(),
        server_seq: rng.gen(),
        syn: false,
        syn_ack: false,
        echo_seq: 0,
        sent: 0,
    }
}

/// TCP flags.
const FIN: u8 = 0x01;
const SYN: u8 = 0x02;
const RST: u8 = 0x04;
const PSH: u8 = 0x08;
const ACK: u8 = 0x10;

/// A frame from `side`'s host to the router: `src` to `dst`, the transport `proto`
/// (6, 17, 1 or 58) of header `l4` and payload.
fn frame(side: Side, src: IpAddr, dst: IpAddr, ttl: u8, proto: u8, l4: &[u8]) -> Vec<u8> {
    let (host, router) = side.macs();
    let mut f = Vec::new();
    f.extend_from_slice(&router);
    f.extend_from_slice(&host);
    let mut pseudo = Vec::new();
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            f.extend_from_slice(&[0x08, 0x00]);
            let len = (20 + l4.len()) as u16;
            let mut ip = vec![0x45, 0];
            ip.extend_from_slice(&len.to_be_bytes());
            ip.extend_from_slice(&[0x12, 0x34, 0x40, 0, ttl, proto, 0, 0]);
            ip.extend_from_slice(&s.octets());
            ip.extend_from_slice(&d.octets());
            let sum = !common::fold(&ip);
            ip[10..12].copy_from_slice(&sum.to_be_bytes());
            f.extend_from_slice(&ip);
            pseudo.extend_from_slice(&s.octets());
            pseudo.extend_from_slice(&d.octets());
            pseudo.extend_from_slice(&[0, proto]);
            pseudo.extend_from_slice(&(l4.len() as u16).to_be_bytes());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
            f.extend_from_slice(&(l4.len() as u16).to_be_bytes());
            f.extend_from_slice(&[proto, ttl]);
            f.extend_from_slice(&s.octets());
            f.extend_from_slice(&d.octets());
            pseudo.extend_from_slice(&s.octets());
            pseudo.extend_from_slice(&d.octets());
            pseudo.extend_from_slice(&(l4.len() as u32).to_be_bytes());
            pseudo.extend_from_slice(&[0, 0, 0, proto]);
        }
        _ => unreachable!("one family"),
    }
    let at = f.len();
    f.extend_from_slice(l4);
    // The checksum: ICMP's covers no pseudo-header.
    let sum_at = match proto {
        6 => Some(16),
        17 => Some(6),
        1 | 58 => Some(2),
        _ => None,
    };
    if let Some(k) = sum_at {
        let mut covered = if proto == 1 { Vec::new() } else { pseudo };
        covered.extend_from_slice(l4);
        let mut sum = !common::fold(&covered);
        if proto == 17 && sum == 0 {
            sum = 0xffff;
        }
        f[at + k..at + k + 2].copy_from_slice(&sum.to_be_bytes());
    }
    f
}

fn tcp(sport: u16, dport: u16, seq: u32, ack: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut h = Vec::new();
    h.extend_from_slice(&sport.to_be_bytes());
    h.extend_from_slice(&dport.to_be_bytes());
    h.extend_from_slice(&seq.to_be_bytes());
    h.extend_from_slice(&(if flags & ACK != 0 { ack } else { 0 }).to_be_bytes());
    h.extend_from_slice(&[0x50, flags, 0xfa, 0xf0, 0, 0, 0, 0]);
    h.extend_from_slice(payload);
    h
}

fn udp(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut h = Vec::new();
    h.extend_from_slice(&sport.to_be_bytes());
    h.extend_from_slice(&dport.to_be_bytes());
    h.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    h.extend_from_slice(&[0, 0]);
    h.extend_from_slice(payload);
    h
}

/// The UDP frame sent from `side`'s host after a round's frames, which the router
/// forwards out of its other link: addresses no connection of the round has (the
/// inside's hosts are .2 to .30, the outside's in 10.1.0.0/23), a route to the
/// destination without a hop limit, ports no NAT rule reads, and its own accept rule
/// ([`sentinel_accept`]).
fn sentinel(side: Side) -> Vec<u8> {
    let (src, dst) = match side {
        Side::A => (v4([192, 0, 2, 60]), v4([10, 1, 255, 254])),
        Side::B => (v4([10, 1, 255, 253]), v4([192, 0, 2, 61])),
    };
    let (sport, dport) = SENTINEL_PORTS;
    frame(side, src, dst, 64, 17, &udp(sport, dport, SENTINEL))
}

/// The rule that lets the sentinel through, first in every filter chain a packet starts
/// in (the regular chains are reached from those only); no frame of a round matches it.
fn sentinel_accept() -> String {
    let (sport, dport) = SENTINEL_PORTS;
    format!("udp sport {sport} udp dport {dport} accept")
}

/// Whether `f` is a sentinel, forwarded (its source maybe translated).
fn is_sentinel(f: &[u8]) -> bool {
    f.len() >= 14 + 20 + 8 + SENTINEL.len()
        && f[12..14] == [0x08, 0x00]
        && f[23] == 17
        && f.ends_with(SENTINEL)
}

fn echo(v6: bool, reply: bool, id: u16, seq: u16) -> Vec<u8> {
    let kind = match (v6, reply) {
        (false, false) => 8,
        (false, true) => 0,
        (true, false) => 128,
        (true, true) => 129,
    };
    let mut h = vec![kind, 0, 0, 0];
    h.extend_from_slice(&id.to_be_bytes());
    h.extend_from_slice(&seq.to_be_bytes());
    h.extend_from_slice(&[0x5a; 24]);
    h
}

fn icmp_proto(v6: bool) -> u8 {
    if v6 {
        58
    } else {
        1
    }
}

impl Flow {
    /// The flow's next frame, from its client or (once its packets reached the far side)
    /// its server; `None` once it has said all it will.
    fn next(&mut self, rng: &mut StdRng) -> Option<(Side, Vec<u8>)> {
        if self.sent > 40 {
            return None;
        }
        self.sent += 1;
        let ttl = if rng.gen_bool(0.02) { 1 } else { 64 };
        let payload: Vec<u8> = (0..rng.gen_range(0..120)).map(|_| rng.gen()).collect();
        // The server answers once it saw something, half of the time.
        let server = self.seen.clone().filter(|_| rng.gen_bool(0.5));
        match self.proto {
            6 => Some(self.next_tcp(rng, server, ttl, &payload)),
            17 => Some(match server {
                Some(s) if rng.gen_bool(0.15) => {
                    // Port unreachable, quoting what came.
                    let v6 = self.v6;
                    let mut h = if v6 {
                        vec![1, 4, 0, 0]
                    } else {
                        vec![3, 3, 0, 0]
                    };
                    h.extend_from_slice(&[0; 4]);
                    let quoted = if v6 { 1232 } else { 548 };
                    h.extend_from_slice(&s.packet[..s.packet.len().min(quoted)]);
                    (s.side, frame(s.side, s.dst, s.src, 64, icmp_proto(v6), &h))
                }
                Some(s) => (
                    s.side,
                    frame(
                        s.side,
                        s.dst,
                        s.src,
                        64,
                        17,
                        &udp(s.dport, s.sport, &payload),
                    ),
                ),
                None => (
                    self.client,
                    frame(
                        self.client,
                        self.src,
                        self.dst,
                        ttl,
                        17,
                        &udp(self.sport, self.dport, &payload),
                    ),
                ),
            }),
            _ => Some(match server {
                Some(s) => (
                    s.side,
                    frame(
                        s.side,
                        s.dst,
                        s.src,
                        64,
                        icmp_proto(self.v6),
                        &echo(self.v6, true, s.sport, self.echo_seq),
                    ),
                ),
                None => {
                    self.echo_seq = self.echo_seq.wrapping_add(1);
                    (
                        self.client,
                        frame(
                            self.client,
                            self.src,
                            self.dst,
                            ttl,
                            icmp_proto(self.v6),
                            &echo(self.v6, false, self.sport, self.echo_seq),
                        ),
                    )
                }
            }),
        }
    }

    fn next_tcp(
        &mut self,
        rng: &mut StdRng,
        server: Option<Seen>,
        ttl: u8,
        payload: &[u8],
    ) -> (Side, Vec<u8>) {
        // Only once the first segment reached the far side: what is odd before that
        // leaves untranslated, and the server answering it would clash with the
        // connection the client opens next.
        let odd = self.seen.is_some() && rng.gen_bool(0.06);
        let from_client = |f: &Flow, seq: u32, ack: u32, flags: u8, data: &[u8]| {
            (
                f.client,
                frame(
                    f.client,
                    f.src,
                    f.dst,
                    ttl,
                    6,
                    &tcp(f.sport, f.dport, seq, ack, flags, data),
                ),
            )
        };
        let from_server = |s: &Seen, seq: u32, ack: u32, flags: u8, data: &[u8]| {
            (
                s.side,
                frame(
                    s.side,
                    s.dst,
                    s.src,
                    64,
                    6,
                    &tcp(s.dport, s.sport, seq, ack, flags, data),
                ),
            )
        };
        if odd {
            // Out of the window, odd flags, a reset: from either end.
            let flags = pick(rng, &[SYN | FIN, 0, FIN, RST, RST | ACK, ACK, SYN | ACK]);
            let far = if rng.gen_bool(0.5) { 1 << 30 } else { 0 };
            // A reset may end the connection: neither end says more, since what the
            // server sent after would open one the other way, which the client's
            // next would clash with (a port the kernel then draws at random).
            if flags & RST != 0 {
                self.sent = usize::MAX;
            }
            return match server {
                Some(s) => from_server(
                    &s,
                    self.server_seq.wrapping_add(far),
                    self.client_seq,
                    flags,
                    &[],
                ),
                None => from_client(
                    self,
                    self.client_seq.wrapping_add(far),
                    self.server_seq,
                    flags,
                    payload,
                ),
            };
        }
        if !self.syn {
            self.syn = true;
            if rng.gen_bool(0.1) {
                // Picked up in mid-stream.
                self.syn_ack = true;
                let seq = self.client_seq;
                self.client_seq = seq.wrapping_add(payload.len() as u32);
                return from_client(self, seq, self.server_seq, ACK | PSH, payload);
            }
            let seq = self.client_seq;
            self.client_seq = seq.wrapping_add(1);
            return from_client(self, seq, 0, SYN, &[]);
        }
        match server {
            Some(s) if !self.syn_ack => {
                self.syn_ack = true;
                let seq = self.server_seq;
                self.server_seq = seq.wrapping_add(1);
                from_server(&s, seq, self.client_seq, SYN | ACK, &[])
            }
            Some(s) => {
                let fin = if rng.gen_bool(0.05) { FIN } else { 0 };
                let seq = self.server_seq;
                self.server_seq = seq.wrapping_add(payload.len() as u32 + u32::from(fin));
                from_server(&s, seq, self.client_seq, ACK | fin, payload)
            }
            None if !self.syn_ack => {
                // The SYN again.
                from_client(self, self.client_seq.wrapping_sub(1), 0, SYN, &[])
            }
            None => {
                let fin = if rng.gen_bool(0.05) { FIN } else { 0 };
                let seq = self.client_seq;
                self.client_seq = seq.wrapping_add(payload.len() as u32 + u32::from(fin));
                from_client(self, seq, self.server_seq, ACK | fin, payload)
            }
        }
    }
}

/// A packet's addresses and ports (an echo's identifier as both), if it is TCP, UDP
/// or an echo request: (src, dst, sport, dport, the IP packet).
fn addressing(f: &[u8]) -> Option<(IpAddr, IpAddr, u16, u16, Vec<u8>)> {
    let (src, dst, proto, l4) = match u16::from_be_bytes([f[12], f[13]]) {
        0x0800 => {
            let ihl = usize::from(f[14] & 0xf) * 4;
            let s: [u8; 4] = f[26..30].try_into().ok()?;
            let d: [u8; 4] = f[30..34].try_into().ok()?;
            (v4(s), v4(d), f[23], 14 + ihl)
        }
        0x86dd => {
            let s: [u8; 16] = f[22..38].try_into().ok()?;
            let d: [u8; 16] = f[38..54].try_into().ok()?;
            (IpAddr::V6(s.into()), IpAddr::V6(d.into()), f[20], 54)
        }
        _ => return None,
    };
    let word = |k: usize| Some(u16::from_be_bytes([*f.get(l4 + k)?, *f.get(l4 + k + 1)?]));
    let (sport, dport) = match proto {
        6 | 17 => (word(0)?, word(2)?),
        1 if f.get(l4) == Some(&8) => (word(4)?, word(4)?),
        58 if f.get(l4) == Some(&128) => (word(4)?, word(4)?),
        _ => return None,
    };
    Some((src, dst, sport, dport, f[14..].to_vec()))
}

/// A random ruleset over what fibre claims, with NAT if `nat`. With `resets`, the
/// forward chain first rejects TCP to port 2222 with a reset, so that every run meets
/// the router's resets under NAT whatever rules the draw gave.
fn random_ruleset(rng: &mut StdRng, nat: bool, resets: bool) -> String {
    let mut out = String::new();
    // The filter: one `inet` table, or an `ip` and an `ip6` one.
    let families: &[&str] = if rng.gen_bool(0.5) {
        &["inet"]
    } else {
        &["ip", "ip6"]
    };
    for &family in families {
        let subs = rng.gen_range(0..3);
        let _ = writeln!(out, "table {family} filter {{");
        for k in 0..subs {
            let _ = writeln!(out, "  chain sub{k} {{");
            for _ in 0..rng.gen_range(1..4) {
                let _ = writeln!(out, "    {}", random_rule(rng, family, true, k + 1, subs));
            }
            let _ = writeln!(out, "  }}");
        }
        if rng.gen_bool(0.4) {
            let priority = pick(rng, &["-150", "-90"]);
            let _ = writeln!(
                out,
                "  chain pre {{ type filter hook prerouting priority {priority}; policy accept;"
            );
            let _ = writeln!(out, "    {}", sentinel_accept());
            for _ in 0..rng.gen_range(1..3) {
                let _ = writeln!(out, "    {}", random_rule(rng, family, false, 0, 0));
            }
            let _ = writeln!(out, "  }}");
        }
        let policy = if rng.gen_bool(0.3) { "drop" } else { "accept" };
        let _ = writeln!(
            out,
            "  chain forwarding {{ type filter hook forward priority filter; policy {policy};"
        );
        let _ = writeln!(out, "    {}", sentinel_accept());
        if resets {
            let _ = writeln!(out, "    tcp dport 2222 reject with tcp reset");
        }
        if policy == "drop" || rng.gen_bool(0.3) {
            let _ = writeln!(out, "    ct state established,related accept");
        }
        for _ in 0..rng.gen_range(1..7) {
            let _ = writeln!(out, "    {}", random_rule(rng, family, false, 0, subs));
        }
        let _ = writeln!(out, "  }}\n}}");
    }
    if nat {
        out += &random_nat(rng, false);
        if rng.gen_bool(0.7) {
            out += &random_nat(rng, true);
        }
    }
    out
}

/// A filter rule: matches and a verdict. In a regular chain (`sub`) `return` too; jumps
/// only to chains after `first` of `subs` (no loops).
fn random_rule(rng: &mut StdRng, family: &str, sub: bool, first: usize, subs: usize) -> String {
    let mut rule = String::new();
    let mut tcp_only = false;
    // At most one match of each kind: nft refuses protocols in conflict.
    let mut kinds = Vec::new();
    let mut address_family = None;
    let matches = if rng.gen_bool(0.1) {
        0
    } else {
        rng.gen_range(1..4)
    };
    for _ in 0..matches {
        let kind = match rng.gen_range(0..16) {
            // An address of the table's family.
            9 if family == "ip6" => (10, 9),
            10 if family == "ip" => (9, 9),
            14 if family == "ip6" => (15, 14),
            15 if family == "ip" => (14, 14),
            k @ (5..=8 | 11 | 13) => (k, 5),
            k @ (9 | 10) => (k, 9),
            k @ (14 | 15) => (k, 14),
            k => (k, k),
        };
        if kinds.contains(&kind.1) {
            continue;
        }
        // Addresses of one IP family only (an `inet` table's rule may draw either).
        let v6 = match kind.0 {
            9 | 14 => Some(false),
            10 | 15 => Some(true),
            _ => None,
        };
        if v6.is_some() && address_family.is_some_and(|f| Some(f) != v6) {
            continue;
        }
        address_family = address_family.or(v6);
        kinds.push(kind.1);
        let m = match kind.0 {
            0 => format!(
                "ct state {}",
                pick(
                    rng,
                    &[
                        "new",
                        "established",
                        "related",
                        "invalid",
                        "untracked",
                        "{ new, established }",
                        "{ invalid, untracked }",
                        "!= established",
                    ]
                )
            ),
            1 => format!("ct status {}", pick(rng, &["dnat", "snat", "dnat,snat"])),
            2 => format!("ct direction {}", pick(rng, &["original", "reply"])),
            3 => format!("iifname {}", pick(rng, &["\"a0\"", "\"b0\""])),
            4 => format!("oifname {}", pick(rng, &["\"a0\"", "\"b0\""])),
            5 => {
                let p = pick(rng, &["tcp", "udp", "icmp", "ipv6-icmp", "{ tcp, udp }"]);
                tcp_only = p == "tcp";
                format!("meta l4proto {p}")
            }
            6 => {
                tcp_only = true;
                format!(
                    "tcp dport {}",
                    pick(rng, &["22", "{ 80, 443 }", "8080", "1-1000", "!= 22"])
                )
            }
            7 => format!("udp dport {}", pick(rng, &["53", "{ 123, 5353 }", "9000"])),
            8 => {
                tcp_only = true;
                pick(
                    rng,
                    &[
                        "tcp flags & (syn | ack) == syn",
                        "tcp flags & (fin | rst) != 0",
                        "tcp flags syn,ack",
                    ],
                )
                .to_string()
            }
            9 => format!(
                "ip {} {}",
                pick(rng, &["saddr", "daddr"]),
                pick(
                    rng,
                    &[
                        "192.0.2.0/28",
                        "10.1.0.0/24",
                        "{ 192.0.2.5, 10.1.1.7 }",
                        "10.0.1.1"
                    ]
                )
            ),
            10 => format!(
                "ip6 {} {}",
                pick(rng, &["saddr", "daddr"]),
                pick(rng, &["2001:db8:9::/124", "2001:db8:1::10/124", "fd01::1"])
            ),
            // What differs from packet to packet of a connection: its verdict is
            // never one kept for the connection.
            12 => format!("meta length {}", pick(rng, &["< 90", "> 120", "80-140"])),
            // The connection's tuples, which NAT binds on its first packet: a rule
            // on the reply's reads them before the binding then, and after it later.
            13 => {
                let p = pick(rng, &["tcp", "udp"]);
                tcp_only = p == "tcp";
                format!(
                    "meta l4proto {p} ct {} proto-dst {}",
                    pick(rng, &["original", "reply"]),
                    pick(rng, &["53", "80", "{ 22, 8080 }", "!= 53"])
                )
            }
            14 => format!(
                "ct {} ip {} {}",
                pick(rng, &["original", "reply"]),
                pick(rng, &["saddr", "daddr"]),
                pick(
                    rng,
                    &["10.0.1.1", "10.1.0.0/24", "192.0.2.0/28", "10.0.0.0/16"]
                )
            ),
            15 => format!(
                "ct {} ip6 {} {}",
                pick(rng, &["original", "reply"]),
                pick(rng, &["saddr", "daddr"]),
                pick(rng, &["fd01::1", "2001:db8:1::10/124", "2001:db8:9::/124"])
            ),
            _ => "meta l4proto { tcp, udp, icmp, ipv6-icmp }".to_string(),
        };
        rule += &m;
        rule.push(' ');
    }
    let later: Vec<usize> = (first..subs).collect();
    let verdict = match rng.gen_range(0..20) {
        0..=5 => "accept".to_string(),
        6..=9 => "drop".to_string(),
        10..=12 => match (family, rng.gen_range(0..4)) {
            ("ip", 0) => "reject with icmp type host-prohibited".into(),
            ("ip6", 0) => "reject with icmpv6 type admin-prohibited".into(),
            ("inet", 1) => "reject with icmpx type port-unreachable".into(),
            (_, 2) => {
                if !tcp_only {
                    rule += "meta l4proto tcp ";
                }
                "reject with tcp reset".into()
            }
            _ => "reject".into(),
        },
        13..=15 if !later.is_empty() => {
            format!("{} sub{}", pick(rng, &["jump", "goto"]), pick(rng, &later))
        }
        16..=17 if sub => "return".into(),
        _ => "counter".into(),
    };
    rule + &verdict
}

/// NAT chains of one family: port forwards on the router's outside address, and source
/// NAT out of `b0`, hairpin's out of `a0`.
fn random_nat(rng: &mut StdRng, v6: bool) -> String {
    let (family, router) = if v6 {
        ("ip6", "fd01::1")
    } else {
        ("ip", "10.0.1.1")
    };
    let ip = family;
    let host = |k: u8| {
        if v6 {
            format!("2001:db8:9::{k:x}")
        } else {
            format!("192.0.2.{k}")
        }
    };
    let bracket = |a: String| if v6 { format!("[{a}]") } else { a };
    let mut pre = Vec::new();
    for &port in &FORWARDED {
        if rng.gen_bool(0.3) {
            continue;
        }
        let proto = match port {
            8080 | 2222 => "tcp",
            5353 => "udp",
            _ => "meta l4proto { tcp, udp } th",
        };
        let k = rng.gen_range(2..=30);
        let to = match rng.gen_range(0..5) {
            0 => host(k),
            1 => format!("{}:80", bracket(host(k))),
            2 => format!("{}:{}-{}", bracket(host(k)), port - 1, port + 2),
            3 => format!("{}-{}", host(k), host(k + 3)),
            _ => format!("{}:22-24", bracket(host(k))),
        };
        let guard = pick(rng, &["", "iifname \"b0\" ", "ct state new "]);
        pre.push(format!(
            "{guard}{ip} daddr {router} {proto} dport {port} dnat to {to}"
        ));
    }
    let mut post = Vec::new();
    if !v6 && rng.gen_bool(0.6) {
        post.push("ct status dnat oifname \"a0\" masquerade".to_string());
    }
    for _ in 0..rng.gen_range(0..3) {
        let guard = pick(
            rng,
            &[
                "oifname \"b0\" ",
                "oifname \"b0\" meta l4proto udp ",
                "oifname \"b0\" meta l4proto tcp ",
            ],
        );
        // A port range only after a transport protocol's match.
        let ports = if guard.contains("l4proto") {
            ""
        } else {
            "meta l4proto { tcp, udp } "
        };
        let statement = match (v6, rng.gen_range(0..5)) {
            (_, 0) => "masquerade".to_string(),
            (_, 1) => format!("{ports}masquerade to :20000-40000"),
            (false, 2) => "snat to 10.0.1.100-10.0.1.105".to_string(),
            (false, 3) => "snat to 10.0.1.100-10.0.1.110 persistent".to_string(),
            (false, _) => "ip saddr 192.0.2.0/28 snat to 10.0.1.110".to_string(),
            (true, _) => format!("{ports}snat to [fd01::1]:20000-40000"),
        };
        post.push(format!("{guard}{statement}"));
    }
    let mut out = format!("table {family} nat {{\n");
    out += "  chain pre { type nat hook prerouting priority dstnat;\n";
    for r in &pre {
        let _ = writeln!(out, "    {r}");
    }
    out += "  }\n  chain post { type nat hook postrouting priority srcnat;\n";
    for r in &post {
        let _ = writeln!(out, "    {r}");
    }
    out += "  }\n}\n";
    out
}

/// The router's namespace with the configuration, `ruleset` and the sink loaded, its
/// links' far ends in the hosts' namespace.
fn router_and_hosts(config: &str, ruleset: &str) -> (Namespace, Namespace) {
    let router = Namespace::create("nat-router").unwrap();
    let hosts = Namespace::create("nat-hosts").unwrap();
    for (k, v) in [
        ("net.ipv4.ip_forward", "1"),
        ("net.ipv6.conf.all.forwarding", "1"),
        ("net.ipv6.conf.all.accept_dad", "0"),
        ("net.ipv6.conf.default.accept_dad", "0"),
        ("net.ipv4.conf.all.rp_filter", "0"),
        ("net.ipv4.conf.default.rp_filter", "0"),
        ("net.ipv4.conf.all.send_redirects", "0"),
        ("net.ipv4.conf.default.send_redirects", "0"),
        ("net.ipv4.icmp_ratelimit", "0"),
        ("net.ipv6.icmp.ratelimit", "0"),
        ("net.ipv4.icmp_msgs_per_sec", "10000000"),
        ("net.ipv4.icmp_msgs_burst", "10000000"),
        // The hop counts of what the router makes (errors, resets) not the defaults,
        // so that fibre's must follow them: links made from here on take `default`'s.
        ("net.ipv4.ip_default_ttl", "77"),
        ("net.ipv6.conf.default.hop_limit", "66"),
    ] {
        router.sysctl(k, v).unwrap();
    }
    // The hosts' ends say nothing of their own.
    hosts
        .sysctl("net.ipv6.conf.default.disable_ipv6", "1")
        .unwrap();
    router.batch("link set lo up\n").unwrap();
    router.batch(config).unwrap();
    // One link's own, another's its default.
    router.sysctl("net.ipv6.conf.a0.hop_limit", "55").unwrap();
    if let Err(e) = router.nft(&["-f", "-"], ruleset) {
        panic!("nft refused the ruleset: {e}\n{ruleset}");
    }
    router.nft(&["-f", "-"], SINK).unwrap();
    for peer in ["a1", "b1"] {
        router
            .ip(&["link", "set", peer, "netns", hosts.name()])
            .unwrap();
        hosts.ip(&["link", "set", peer, "up"]).unwrap();
    }
    router
        .wait_up(&["a0", "b0"], Duration::from_secs(5))
        .unwrap();
    (router, hosts)
}

/// What the kernel sent out of each link, and the frames sent into it (their link and
/// time), as a round played them.
struct Played {
    kernel: BTreeMap<&'static str, Vec<Vec<u8>>>,
    into: Vec<(Side, Duration, Vec<u8>)>,
}

/// Takes what the kernel sent out of its links, each on the hosts' sockets (`a`,
/// `b`): kept, and each client packet that reached the far side noted in its
/// connection (found by its client port in `by_port`), so that the server may answer
/// it as it came. The sides out of which a sentinel came, which is not kept.
fn receive(
    a: &PacketSocket,
    b: &PacketSocket,
    played: &mut Played,
    flows: &mut [Flow],
    by_port: &HashMap<u16, usize>,
) -> Vec<Side> {
    let mut sentinels = Vec::new();
    for (side, sock) in [(Side::A, a), (Side::B, b)] {
        while let Some(f) = sock.receive_frame().unwrap() {
            if is_sentinel(&f) {
                sentinels.push(side);
                continue;
            }
            if kernels_own(&f) {
                continue;
            }
            // Client ports are the round's own, above any server's: a packet from one
            // left the router toward the server (our own frames are not seen here).
            // The server answers the first it saw, as it came: a later one may have
            // left untranslated (invalid, so not NAT's), and answering that would
            // clash with the connection's own mapping, which the kernel then moves
            // to a port it draws at random. A TCP segment that opens no connection (a
            // FIN or a reset with none to close: invalid to conntrack) leaves
            // untranslated too, and a server answering it would open one the other
            // way, which the client's next would clash with: not answered.
            if let Some((src, dst, sport, dport, packet)) = addressing(&f) {
                let flow = by_port.get(&sport).map(|&k| &mut flows[k]);
                if let Some(flow) = flow.filter(|f| f.seen.is_none() && opens(&packet)) {
                    flow.seen = Some(Seen {
                        side,
                        src,
                        dst,
                        sport,
                        dport,
                        packet,
                    });
                }
            }
            played.kernel.entry(side.link()).or_default().push(f);
        }
    }
    sentinels
}

/// Whether an IP packet could open a connection in the kernel's conntrack: any but a
/// TCP segment other than a SYN or a bare ACK (`tcp_conntracks` from `sNO`).
fn opens(packet: &[u8]) -> bool {
    let (proto, l4) = match packet[0] >> 4 {
        4 => (packet[9], usize::from(packet[0] & 0xf) * 4),
        _ => (packet[6], 40),
    };
    let Some(&flags) = packet.get(l4 + 13).filter(|_| proto == 6) else {
        return true;
    };
    matches!(flags & (SYN | ACK | FIN | RST), SYN | ACK)
}

/// Plays a round's connections through the kernel's router from the hosts' namespace.
fn play(hosts: &Namespace, rng: &mut StdRng) -> Played {
    let seed: u64 = rng.gen();
    std::thread::scope(|s| {
        s.spawn(|| {
            hosts.enter().unwrap();
            // One core: the frames sent into both links, and what the router makes of
            // them, queue on one CPU's backlog, in order, ahead of the sentinels.
            let core = core_affinity::get_core_ids()
                .and_then(|cores| cores.into_iter().next())
                .expect("a core to send from");
            assert!(core_affinity::set_for_current(core), "pinned to {core:?}");
            let mut rng = StdRng::seed_from_u64(seed);
            let a = PacketSocket::open_named("a1").unwrap();
            let b = PacketSocket::open_named("b1").unwrap();
            let mut played = Played {
                kernel: BTreeMap::new(),
                into: Vec::new(),
            };
            let mut flows: Vec<Flow> = Vec::new();
            let mut by_port: HashMap<u16, usize> = HashMap::new();
            let start = Instant::now();
            let mut live: Vec<usize> = Vec::new();
            while played.into.len() < PACKETS_PER_ROUND {
                if live.len() < 24 || rng.gen_bool(0.05) {
                    let port = FIRST_CLIENT_PORT + flows.len() as u16;
                    by_port.insert(port, flows.len());
                    live.push(flows.len());
                    flows.push(new_flow(&mut rng, port));
                }
                let pos = rng.gen_range(0..live.len());
                let k = live[pos];
                let Some((side, f)) = flows[k].next(&mut rng) else {
                    live.swap_remove(pos);
                    continue;
                };
                let sock = if side == Side::A { &a } else { &b };
                sock.send_frame(&f).unwrap();
                played.into.push((side, start.elapsed(), f));
                let early = receive(&a, &b, &mut played, &mut flows, &by_port);
                assert!(early.is_empty(), "a sentinel before it was sent");
            }
            // The round's end: a sentinel into each link, after every frame of the
            // round; each comes out of the other link once everything before it has.
            a.send_frame(&sentinel(Side::A)).unwrap();
            b.send_frame(&sentinel(Side::B)).unwrap();
            let deadline = Instant::now() + SENTINEL_WITHIN;
            let mut came_out_of = Vec::new();
            for want in [Side::B, Side::A] {
                while !came_out_of.contains(&want) {
                    assert!(
                        Instant::now() < deadline,
                        "the sentinel sent into {} never came out of {} (in {SENTINEL_WITHIN:?}): \
                         the kernel did not forward it, so the round's frames cannot be known \
                         to be all out",
                        if want == Side::B { "a0" } else { "b0" },
                        want.link(),
                    );
                    std::thread::sleep(Duration::from_millis(1));
                    came_out_of.extend(receive(&a, &b, &mut played, &mut flows, &by_port));
                }
            }
            assert_eq!(came_out_of.len(), 2, "one sentinel out of each link");
            played
        })
        .join()
        .unwrap()
    })
}

/// Writes the frames sent into the router as a pcapng, each on its link's interface.
fn write_capture(path: &std::path::Path, into: &[(Side, Duration, Vec<u8>)]) {
    let file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut w = SentCapture::new(file).unwrap();
    for (side, at, data) in into {
        let link = u32::from(*side == Side::B);
        w.write(link, side.link(), Duration::from_secs(1_000) + *at, data)
            .unwrap();
    }
    w.finish().unwrap();
}

/// `fibre forward` of the capture, with the ruleset, in the router's namespace (whose
/// limits on errors it reads): the frames it sent, by link, and the packets whose
/// verdict it kept on their connection.
fn fibre_forward(
    router: &Namespace,
    dir: &std::path::Path,
    config: &str,
    ruleset: &str,
    workers: usize,
) -> (BTreeMap<String, Vec<Vec<u8>>>, u64) {
    let conf = dir.join("router.conf");
    std::fs::write(&conf, config).unwrap();
    let rules = dir.join("rules.nft");
    std::fs::write(&rules, ruleset).unwrap();
    let out = dir.join("sent.pcapng");
    let run = Command::new("ip")
        .args([
            "netns",
            "exec",
            router.name(),
            FIBRE,
            "forward",
            "--vector",
            "1",
            "--json",
        ])
        .arg("--workers")
        .arg(workers.to_string())
        .arg("--config")
        .arg(&conf)
        .arg("--in")
        .arg(dir.join("in.pcapng"))
        .arg("--out")
        .arg(&out)
        .arg("--ruleset")
        .arg(&rules)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "fibre forward: {}\n{ruleset}",
        String::from_utf8_lossy(&run.stderr)
    );
    let sent = read_capture(&std::fs::read(&out).unwrap()).unwrap();
    let mut by_link: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
    for Frame {
        data, interface, ..
    } in sent.frames
    {
        let name = sent.interfaces[interface].clone().unwrap();
        by_link.entry(name).or_default().push(data);
    }
    let report: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    // Two workers tracking connections: packets read by the worker that does not own
    // their connection went to the one that does. (A round without NAT whose ruleset
    // matches no connection state tracks none, and has nothing to hand off.)
    let tracked = report["stages"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|s| s["stage"] == "conntrack" && s["packets"].as_u64() > Some(0));
    if workers > 1 && tracked {
        assert!(report["handed_off"].as_u64() > Some(0), "{report}");
    }
    (by_link, report["verdicts_kept"].as_u64().unwrap())
}

/// Whether a frame left with a source NAT gave: an address of the router, or of the
/// `snat` range.
fn translated_source(f: &[u8]) -> bool {
    addressing(f).is_some_and(|(src, ..)| match src {
        IpAddr::V4(a) => {
            let o = a.octets();
            o[..3] == [10, 0, 0] || (o[..3] == [10, 0, 1] && o[3] != 2)
        }
        IpAddr::V6(a) => a == "fd01::1".parse::<Ipv6Addr>().unwrap(),
    })
}

/// Whether `f` is a TCP reset the router made (for a `reject`): an IPv4 identification
/// of 0 (the hosts' is 0x1234), or an IPv6 hop limit the router gives its own (55 out
/// of `a0`, 66 out of `b0`; the hosts' leave the router with 63).
fn router_reset(f: &[u8]) -> bool {
    let (at, made) = match f.get(12..14) {
        Some([0x08, 0x00]) => (34, f.get(18..20) == Some(&[0, 0]) && f.get(23) == Some(&6)),
        Some([0x86, 0xdd]) => (
            54,
            f.get(20) == Some(&6) && matches!(f.get(21), Some(55 | 66)),
        ),
        _ => return false,
    };
    made && f.get(at + 13).is_some_and(|flags| flags & 0x04 != 0)
}

/// Random rulesets with NAT send the same frames out of each link through `fibre
/// forward` as through the kernel, byte for byte, over at least 100,000 packets.
#[test]
#[ignore = "needs root: network namespaces, veth pairs, AF_PACKET sockets, nft"]
fn random_rulesets_with_nat_forward_as_the_kernel_does() {
    let seed = std::env::var("FIBRE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("FIBRE_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let config = router_config();
    let dir = std::env::temp_dir().join(format!("fibre-random-nat-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (mut packets, mut forwarded, mut translated) = (0, 0, 0);
    // The router's resets in rounds with NAT, and those from an address NAT gave.
    let (mut resets, mut resets_translated) = (0, 0);
    // Packets whose verdict fibre kept on their connection, not asking the chains.
    let mut kept = 0;
    for round in 0..ROUNDS {
        let nat = round % 6 != 5;
        let ruleset = random_ruleset(&mut rng, nat, round == 0);
        let (router, hosts) = router_and_hosts(&config, &ruleset);
        let played = play(&hosts, &mut rng);
        write_capture(&dir.join("in.pcapng"), &played.into);
        let workers = 1 + round % 2;
        let (fibre, kept_here) = fibre_forward(&router, &dir, &config, &ruleset, workers);
        kept += kept_here;
        drop((router, hosts));
        packets += played.into.len();
        for (link, kernel) in &played.kernel {
            let theirs = fibre.get(*link).cloned().unwrap_or_default();
            let k: Vec<Vec<u8>> = kernel.iter().cloned().map(normal).collect();
            let f: Vec<Vec<u8>> = theirs.into_iter().map(normal).collect();
            if let Some(i) = k.iter().zip(&f).position(|(a, b)| a != b) {
                // What the kernel sent, beside the round's capture, to look into.
                for (link, kernel) in &played.kernel {
                    let sent: Vec<(Side, Duration, Vec<u8>)> = kernel
                        .iter()
                        .map(|f| (Side::A, Duration::ZERO, f.clone()))
                        .collect();
                    write_capture(&dir.join(format!("kernel-{link}.pcapng")), &sent);
                }
                panic!(
                    "round {round} (FIBRE_SEED={seed}, {workers} workers), frame {i} out of {link}:\n\
                     kernel {:02x?}\n fibre {:02x?}\n{ruleset}",
                    k[i], f[i]
                );
            }
            assert_eq!(
                k.len(),
                f.len(),
                "round {round} (FIBRE_SEED={seed}): frames out of {link}, the kernel's and \
                 fibre's; the first extra: {:02x?}\n{ruleset}",
                k.iter().chain(&f).nth(k.len().min(f.len())),
            );
            forwarded += k.len();
            translated += k.iter().filter(|f| translated_source(f)).count();
            if nat {
                let made: Vec<&Vec<u8>> = k.iter().filter(|f| router_reset(f)).collect();
                resets += made.len();
                resets_translated += made.iter().filter(|f| translated_source(f)).count();
            }
        }
        assert!(
            !fibre
                .keys()
                .any(|l| !played.kernel.contains_key(l.as_str())),
            "round {round}: fibre sent out of a link the kernel did not: {:?}",
            fibre.keys()
        );
    }
    eprintln!(
        "{packets} packets, {forwarded} frames out, {translated} of them from a source NAT \
         gave; {resets} resets of the router's with NAT, {resets_translated} of them from a \
         source NAT gave; {kept} packets met no chain, their verdict kept"
    );
    assert!(packets >= 100_000);
    assert!(translated * 20 > forwarded, "NAT at work");
    assert!(resets > 0, "resets where NAT translates");
    assert!(
        kept * 20 > packets as u64,
        "verdicts kept for a twentieth of the packets at least"
    );
    std::fs::remove_dir_all(dir).ok();
}
