//! fibre's connection tracking ([`fibre_conntrack::Conntrack`]) against the Linux
//! kernel's `nf_conntrack`, as root.
//!
//! fibre claims to give each forwarded packet the state (`ct state`) the kernel's
//! tracker gives it at the prerouting hook. This test asks the kernel. Three network
//! namespaces make a router: the sender (veth `a0`), the router (`ra` towards the
//! sender; `o1`..`o5` towards the receiver, forwarding on, no reverse path filter) and
//! the receiver (`p1`..`p5`, the peers of `o1`..`o5`). The router's ruleset marks each
//! packet at prerouting by its state:
//!
//! ```text
//! meta mark set ct state map { invalid : 1, established : 2, related : 3, new : 4, untracked : 5 }
//! ```
//!
//! and policy routing (`ip rule add fwmark N table 10N`, both families) sends mark N out
//! of `oN`, whose neighbour is static, so no neighbour discovery is needed. Every packet
//! is injected on `a0` with a packet socket (the replies of a flow too: their source is
//! the far host, and with no reverse path filter the router forwards them all the same);
//! a packet socket in the receiver sees which of `p1`..`p5` it comes out of: that link
//! is its state. A packet that comes out of none was dropped by the kernel, and fibre
//! must say so too.
//!
//! The packets are sequences of many flows, hundreds at a time, interleaved: TCP
//! conversations as real stacks hold them (handshakes with window scaling, SACK and
//! timestamps offered, data and acknowledgements both ways within the windows, losses
//! beyond the router answered with SACK blocks and retransmissions, zero windows and
//! their probes, closes by FIN from either side or both, resets, reopening a closed
//! connection with a new SYN) broken here and there (simultaneous opens, mid-stream
//! pickup, SYN/ACK without SYN, refused SYNs, segments and acknowledgements out of the
//! window, invalid flag combinations, truncated headers, malformed options, bad
//! checksums); UDP exchanges, unanswered flows, zero checksums and length fields that
//! lie; ICMP and ICMPv6 queries and answers (and answers to nothing, unknown types);
//! ICMP and ICMPv6 errors quoting a tracked flow either way (RELATED), an unknown one,
//! an error, or naming the wrong outer destination; ICMPv6 neighbour discovery and MLD
//! (untracked: sent between global addresses with hop limit 255, which the router
//! forwards like any other packet); a protocol of no tracker of its own (generic). IPv4
//! and IPv6 both, some with IPv4 options or an IPv6 hop-by-hop header.
//!
//! Expiry too: the router's timeouts of unanswered UDP, ICMP, generic flows and of the
//! TCP states but ESTABLISHED are set to [`SHORT_TIMEOUT`] seconds (fibre reads them
//! from the namespace as it would in service), and some flows wait [`PAUSE`] (a second
//! longer) before a packet, so that the kernel has let their connection go by then.
//!
//! Each packet is sent alone: the next one waits until it came out of the router (or a
//! quiet period passed), so the kernel sees them in order. It is told from any other
//! frame by a tag where no tracker looks (the IPv4 identification, the IPv6 flow
//! label) and by its bytes. fibre tracks the same packet
//! at the time it was sent, and confirms what it passes (nothing here drops, so every
//! new connection is confirmed on both sides). The test fails on the first packet of
//! each flow whose state differs, naming the seed, the flow, the packet (its place in
//! the flow and in the run, its headers, what the generator meant by it) and the flow's
//! packets before it with both sides' states. Whether the kernel checks the packets'
//! checksums (a veth fed by a packet socket does not vouch for them) is asked first,
//! with a packet of a bad checksum, and fibre is told the same.
//!
//! Frames lost below IP would look like packets the kernel dropped, so the test counts
//! those losses and fails on any. The random seed is printed; `FIBRE_SEED=N` replays a
//! run: the same flows, the same packets (flows share no tuple, so each plays out on
//! its own; only the interleaving may differ, where a pause ends by the clock).

use fibre_conntrack::{Conntrack, Fate, Settings, State, Tracked};
use fibre_testbed::netns::Namespace;
use fibre_testbed::wire::{self, in_namespace};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

/// Packets sent in a run (flows under way when it is reached are finished).
const PACKETS: usize = 200_000;
/// Flows under way at once, their packets interleaved.
const FLOWS_AT_ONCE: usize = 300;
/// Past this, no new flow starts (those under way finish), so that a slow machine
/// still ends in time; the seed replays the same run up to where it stopped.
const TIME_BUDGET: Duration = Duration::from_secs(40);
/// How long a packet may take to come out of the router before it is taken as dropped.
/// A frame sent on a veth from a packet socket is normally forwarded and delivered
/// before `send` returns.
const QUIET: Duration = Duration::from_millis(30);
/// The receiving socket's buffer.
const CAPTURE_BUFFER: usize = 16 << 20;
/// The time to live (hop limit) of the packets sent.
const TTL: u8 = 64;
/// The most payload a segment or datagram carries, so that every packet fits a frame
/// whatever headers and options it has.
const MAX_PAYLOAD: u32 = 1200;
/// Mismatching flows reported in full.
const REPORTED: usize = 25;
/// The links towards the receiver, one per state the ruleset marks.
const OUT_LINKS: usize = 5;
/// The router's timeouts made short (of the connections the generator lets expire),
/// in seconds, so that expiry is tested within the run.
const SHORT_TIMEOUT: u64 = 2;
/// The sysctls set to [`SHORT_TIMEOUT`] (`net.netfilter.nf_conntrack_*`). The others
/// (an established connection's five days, unacknowledged data's five minutes, a UDP
/// stream's two) keep the kernel's defaults.
const SHORT_TIMEOUTS: &[&str] = &[
    "udp_timeout",
    "icmp_timeout",
    "icmpv6_timeout",
    "generic_timeout",
    "tcp_timeout_syn_sent",
    "tcp_timeout_syn_recv",
    "tcp_timeout_fin_wait",
    "tcp_timeout_close_wait",
    "tcp_timeout_last_ack",
    "tcp_timeout_time_wait",
    "tcp_timeout_close",
];
/// How long a flow waits before a packet meant to find its connection expired: a
/// second more than [`SHORT_TIMEOUT`], far from the edge, where the kernel's clock
/// (in jiffies) and the test's could disagree. Every other gap between two packets of
/// a flow is a few milliseconds.
const PAUSE: Duration = Duration::from_secs(SHORT_TIMEOUT + 1);

const SENDER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x0a, 0x00];
const ROUTER_IN_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x0a, 0x01];

/// The router's side of out link `n` (1..=5).
fn router_out_mac(n: usize) -> [u8; 6] {
    [0x02, 0, 0, 0, 0x0b, n as u8]
}

/// The receiver's side of out link `n` (1..=5).
fn receiver_mac(n: usize) -> [u8; 6] {
    [0x02, 0, 0, 0, 0x0c, n as u8]
}

fn mac(m: [u8; 6]) -> String {
    m.map(|b| format!("{b:02x}")).join(":")
}

/// The state whose packets leave by out link `n`: the ruleset's marks, in order.
const STATE_OF_LINK: [State; OUT_LINKS] = [
    State::Invalid,
    State::Established,
    State::Related,
    State::New,
    State::Untracked,
];

/// The router's ruleset: each packet marked by its state.
const RULESET: &str = "table inet t {
    chain pre {
        type filter hook prerouting priority mangle;
        meta mark set ct state map { invalid : 1, established : 2, related : 3, new : 4, untracked : 5 }
    }
}
";

// ---------------------------------------------------------------------------------
// The three namespaces.
// ---------------------------------------------------------------------------------

/// The namespaces (deleted when dropped) and what the test needs of their links.
struct Topology {
    sender: Namespace,
    router: Namespace,
    receiver: Namespace,
    /// `a0`'s index in the sender's namespace.
    sender_link: u32,
    /// `p1`..`p5`'s indexes in the receiver's namespace, in order.
    receiver_links: [u32; OUT_LINKS],
}

impl Topology {
    fn build() -> Topology {
        let sender = Namespace::create("ct-a").expect("a namespace (as root)");
        let router = Namespace::create("ct-r").expect("a namespace");
        let receiver = Namespace::create("ct-b").expect("a namespace");
        // The sender and receiver say nothing of their own over IPv6 (router
        // solicitations, MLD reports): the router would track it.
        for ns in [&sender, &receiver] {
            for scope in ["all", "default"] {
                ns.sysctl(&format!("net.ipv6.conf.{scope}.disable_ipv6"), "1")
                    .expect("IPv6 off");
            }
        }
        let mut links = format!(
            "link set lo up\n\
             link add ra address {} type veth peer name a0 address {} netns {}\n\
             link set ra up\n",
            mac(ROUTER_IN_MAC),
            mac(SENDER_MAC),
            sender.name(),
        );
        for n in 1..=OUT_LINKS {
            let _ = write!(
                links,
                "link add o{n} address {} type veth peer name p{n} address {} netns {}\n\
                 link set o{n} up\n",
                mac(router_out_mac(n)),
                mac(receiver_mac(n)),
                receiver.name(),
            );
        }
        router.batch(&links).expect("the router's links");
        sender
            .batch("link set lo up\nlink set a0 up\n")
            .expect("the sender's link");
        let receiver_up: String = (1..=OUT_LINKS)
            .map(|n| format!("link set p{n} up\n"))
            .collect();
        receiver
            .batch(&format!("link set lo up\n{receiver_up}"))
            .expect("the receiver's links");
        for sysctl in ["net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"] {
            router.sysctl(sysctl, "1").expect("forwarding on");
        }
        let out_names: Vec<String> = (1..=OUT_LINKS).map(|n| format!("o{n}")).collect();
        for link in ["all", "default", "ra"]
            .into_iter()
            .chain(out_names.iter().map(String::as_str))
        {
            router
                .sysctl(&format!("net.ipv4.conf.{link}.rp_filter"), "0")
                .expect("no reverse path filter");
        }
        let up = Duration::from_secs(10);
        sender.wait_up(&["a0"], up).expect("a0 up");
        let mut router_links = vec!["ra"];
        router_links.extend(out_names.iter().map(String::as_str));
        router
            .wait_up(&router_links, up)
            .expect("the router's links up");
        let receiver_names: Vec<String> = (1..=OUT_LINKS).map(|n| format!("p{n}")).collect();
        let receiver_links: Vec<&str> = receiver_names.iter().map(String::as_str).collect();
        receiver
            .wait_up(&receiver_links, up)
            .expect("the receiver's links up");

        // Out link N: its own subnets, the receiver's end a permanent neighbour, and a
        // table 10N whose default routes (both families) leave by it.
        let mut v4 = String::new();
        let mut v6 = String::new();
        for n in 1..=OUT_LINKS {
            let peer = mac(receiver_mac(n));
            let _ = write!(
                v4,
                "addr add 10.9.{n}.1/24 dev o{n}\n\
                 neigh replace 10.9.{n}.2 lladdr {peer} dev o{n} nud permanent\n\
                 route add default via 10.9.{n}.2 dev o{n} table 10{n}\n\
                 rule add fwmark {n} table 10{n}\n",
            );
            let _ = write!(
                v6,
                "addr add fd09:{n}::1/64 dev o{n} nodad\n\
                 neigh replace fd09:{n}::2 lladdr {peer} dev o{n} nud permanent\n\
                 route add default via fd09:{n}::2 dev o{n} table 10{n}\n\
                 rule add fwmark {n} table 10{n}\n",
            );
        }
        router
            .batch_family(4, &v4)
            .expect("the router's IPv4 addresses, neighbours, tables and rules");
        router
            .batch_family(6, &v6)
            .expect("the router's IPv6 addresses, neighbours, tables and rules");
        router
            .nft(&["-f", "-"], RULESET)
            .expect("nft loads the ruleset");
        for name in SHORT_TIMEOUTS {
            router
                .sysctl(
                    &format!("net.netfilter.nf_conntrack_{name}"),
                    &SHORT_TIMEOUT.to_string(),
                )
                .expect("a conntrack timeout");
        }
        let mut receiver_indexes = [0; OUT_LINKS];
        for (n, index) in receiver_indexes.iter_mut().enumerate() {
            *index = receiver
                .ifindex(&format!("p{}", n + 1))
                .expect("a receiver link's index");
        }
        Topology {
            sender_link: sender.ifindex("a0").expect("a0's index"),
            receiver_links: receiver_indexes,
            sender,
            router,
            receiver,
        }
    }

    /// Frames dropped so far below IP on the way (a veth's full peer, a CPU's full
    /// backlog): any would pass for a packet the kernel dropped.
    fn frames_lost_below_ip(&self) -> u64 {
        let drops = |ns: &Namespace, link: &str| {
            wire::link_drops(ns, link).expect("a link's dropped frames")
        };
        let mut lost = drops(&self.sender, "a0") + drops(&self.router, "ra");
        for n in 1..=OUT_LINKS {
            lost += drops(&self.router, &format!("o{n}"));
            lost += drops(&self.receiver, &format!("p{n}"));
        }
        lost + wire::backlog_drops().expect("the backlogs' drops")
    }
}

// ---------------------------------------------------------------------------------
// Packets: headers and checksums.
// ---------------------------------------------------------------------------------

const FIN: u8 = 0x01;
const SYN: u8 = 0x02;
const RST: u8 = 0x04;
const PSH: u8 = 0x08;
const ACK: u8 = 0x10;
const URG: u8 = 0x20;
const ECE: u8 = 0x40;
const CWR: u8 = 0x80;

const PROTO_ICMP: u8 = 1;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
const PROTO_ICMPV6: u8 = 58;

/// One packet of a flow: the IP packet, and what the generator meant by it.
#[derive(Clone)]
struct Packet {
    ip: Vec<u8>,
    what: String,
}

/// The one's complement sum of `bytes` (an odd last byte padded), added to `sum`.
fn sum_words(mut sum: u64, bytes: &[u8]) -> u64 {
    for pair in bytes.chunks(2) {
        let high = u64::from(pair[0]) << 8;
        sum += high | pair.get(1).map_or(0, |&b| u64::from(b));
    }
    sum
}

/// The Internet checksum of `bytes` after `initial` (a pseudo-header's sum).
fn checksum(initial: u64, bytes: &[u8]) -> u16 {
    let mut sum = sum_words(initial, bytes);
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn octets(address: IpAddr) -> Vec<u8> {
    match address {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// The sum of the pseudo-header TCP, UDP and ICMPv6 checksums cover, for `len` bytes
/// of transport (the kernel's `nf_checksum` takes every byte after the IP headers).
fn pseudo_header(source: IpAddr, destination: IpAddr, protocol: u8, len: usize) -> u64 {
    let mut sum = sum_words(0, &octets(source));
    sum = sum_words(sum, &octets(destination));
    sum + u64::from(protocol) + (len as u64 >> 16) + (len as u64 & 0xffff)
}

/// A checksum made wrong: one bit of it turned, which no one's complement equivalent
/// undoes (and never 0, which UDP over IPv4 reads as "none").
fn spoiled(good: u16) -> u16 {
    let bad = good ^ 0x0100;
    if bad == 0 {
        good ^ 0x0200
    } else {
        bad
    }
}

/// Writes the checksum of `transport` (pseudo-header included) at `at`, if the field
/// is there; spoiled if `bad`.
fn fill_checksum(
    transport: &mut [u8],
    at: usize,
    source: IpAddr,
    destination: IpAddr,
    protocol: u8,
    bad: bool,
) {
    if transport.len() < at + 2 {
        return;
    }
    transport[at..at + 2].fill(0);
    let initial = pseudo_header(source, destination, protocol, transport.len());
    let mut sum = checksum(initial, transport);
    if protocol == PROTO_UDP && sum == 0 {
        sum = 0xffff;
    }
    if bad {
        sum = spoiled(sum);
    }
    transport[at..at + 2].copy_from_slice(&sum.to_be_bytes());
}

/// Some payload bytes.
fn payload(len: usize, seed: u32) -> impl Iterator<Item = u8> {
    (0..len).map(move |k| b'a' + ((k as u32).wrapping_add(seed) % 26) as u8)
}

/// An IP packet from `source` to `destination` carrying `transport` of `protocol`,
/// with `hops` to live; `extra` adds IPv4 options (NOPs, then EOL) or an IPv6
/// hop-by-hop header (PadN), which the tracker must skip.
fn ip_packet(
    source: IpAddr,
    destination: IpAddr,
    protocol: u8,
    transport: &[u8],
    hops: u8,
    extra: bool,
) -> Vec<u8> {
    match (source, destination) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let options: &[u8] = if extra { &[1, 1, 1, 0] } else { &[] };
            let header = 20 + options.len();
            let total = header + transport.len();
            let mut ip = vec![0x40 | (header / 4) as u8, 0];
            ip.extend_from_slice(&(total as u16).to_be_bytes());
            ip.extend_from_slice(&[0, 0, 0, 0, hops, protocol, 0, 0]);
            ip.extend_from_slice(&s.octets());
            ip.extend_from_slice(&d.octets());
            ip.extend_from_slice(options);
            let sum = checksum(0, &ip[..header]);
            ip[10..12].copy_from_slice(&sum.to_be_bytes());
            ip.extend_from_slice(transport);
            ip
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let hop_by_hop: &[u8] = if extra {
                // Next header, length 0 (8 bytes), PadN of 4.
                &[protocol, 0, 1, 4, 0, 0, 0, 0]
            } else {
                &[]
            };
            let next = if extra { 0 } else { protocol };
            let len = hop_by_hop.len() + transport.len();
            let mut ip = vec![0x60, 0, 0, 0];
            ip.extend_from_slice(&(len as u16).to_be_bytes());
            ip.extend_from_slice(&[next, hops]);
            ip.extend_from_slice(&s.octets());
            ip.extend_from_slice(&d.octets());
            ip.extend_from_slice(hop_by_hop);
            ip.extend_from_slice(transport);
            ip
        }
        _ => panic!("{source} and {destination} are of different families"),
    }
}

/// Writes `tag` into a packet where no tracker looks (the IPv4 identification, the
/// IPv6 flow label), so that the packet coming out of the router is told from any
/// other. A tag at the end of the payload, as other tests put it, would be TCP data
/// and change what the tracker sees.
fn set_tag(ip: &mut [u8], tag: u32) {
    if ip[0] >> 4 == 4 {
        ip[4..6].copy_from_slice(&(tag as u16).to_be_bytes());
        let header = usize::from(ip[0] & 0xf) * 4;
        ip[10..12].fill(0);
        let sum = checksum(0, &ip[..header]);
        ip[10..12].copy_from_slice(&sum.to_be_bytes());
    } else {
        ip[1] = (ip[1] & 0xf0) | ((tag >> 16) & 0xf) as u8;
        ip[2] = (tag >> 8) as u8;
        ip[3] = tag as u8;
    }
}

/// Whether `received` is `sent` as a router forwards it: the time to live or hop limit
/// one less, the IPv4 header checksum changed with it, nothing else.
fn forwarded_from(sent: &[u8], received: &[u8]) -> bool {
    if sent.len() != received.len() || sent.is_empty() {
        return false;
    }
    let (hops, checksum_at) = if sent[0] >> 4 == 4 {
        (8, Some(10..12))
    } else {
        (7, None)
    };
    sent.iter().zip(received).enumerate().all(|(k, (s, r))| {
        if k == hops {
            *r == s.wrapping_sub(1)
        } else {
            checksum_at.as_ref().is_some_and(|c| c.contains(&k)) || s == r
        }
    })
}

/// A TCP segment to build, honest or not.
#[derive(Clone, Debug)]
struct Segment {
    flags: u8,
    seq: u32,
    ack: u32,
    window: u16,
    options: Vec<u8>,
    payload: u32,
    urgent: u16,
    /// A data offset written instead of the header's true length.
    doff: Option<u8>,
    /// The bytes of the segment kept (a truncated one).
    keep: Option<usize>,
    bad_checksum: bool,
}

impl Segment {
    fn new(flags: u8, seq: u32, ack: u32, window: u16) -> Segment {
        Segment {
            flags,
            seq,
            ack,
            window,
            options: Vec::new(),
            payload: 0,
            urgent: 0,
            doff: None,
            keep: None,
            bad_checksum: false,
        }
    }
}

fn tcp_bytes(source: IpAddr, destination: IpAddr, ports: (u16, u16), s: &Segment) -> Vec<u8> {
    let mut options = s.options.clone();
    while !options.len().is_multiple_of(4) {
        options.push(0);
    }
    let header = 20 + options.len();
    let mut t = Vec::with_capacity(header + s.payload as usize);
    t.extend_from_slice(&ports.0.to_be_bytes());
    t.extend_from_slice(&ports.1.to_be_bytes());
    t.extend_from_slice(&s.seq.to_be_bytes());
    t.extend_from_slice(&s.ack.to_be_bytes());
    t.push(s.doff.unwrap_or((header / 4) as u8) << 4);
    t.push(s.flags);
    t.extend_from_slice(&s.window.to_be_bytes());
    t.extend_from_slice(&[0, 0]);
    t.extend_from_slice(&s.urgent.to_be_bytes());
    t.extend_from_slice(&options);
    t.extend(payload(s.payload as usize, s.seq));
    if let Some(keep) = s.keep {
        t.truncate(keep);
    }
    fill_checksum(&mut t, 16, source, destination, PROTO_TCP, s.bad_checksum);
    t
}

/// How a UDP datagram's header may lie.
#[derive(Clone, Copy, PartialEq, Eq)]
enum UdpShape {
    Honest,
    /// A zero checksum: "none" over IPv4, not allowed over IPv6.
    NoChecksum,
    BadChecksum,
    /// The length field more than the datagram.
    LongerThanSent,
    /// The length field less than the datagram (at least the header); the checksum as
    /// a receiver reading the length would compute it (over the length's bytes).
    ShorterByLength,
    /// The same, the checksum over every byte sent (as the kernel's `nf_checksum`).
    ShorterByPacket,
    /// The length field less than a UDP header.
    BelowHeader,
    /// Fewer bytes than a UDP header.
    Cut,
}

fn udp_bytes(
    source: IpAddr,
    destination: IpAddr,
    ports: (u16, u16),
    len: usize,
    shape: UdpShape,
) -> Vec<u8> {
    let total = 8 + len;
    let field = match shape {
        UdpShape::LongerThanSent => total + 1 + len % 50,
        UdpShape::ShorterByLength | UdpShape::ShorterByPacket => 8 + len / 2,
        UdpShape::BelowHeader => len % 8,
        _ => total,
    };
    let mut t = Vec::with_capacity(total);
    t.extend_from_slice(&ports.0.to_be_bytes());
    t.extend_from_slice(&ports.1.to_be_bytes());
    t.extend_from_slice(&(field as u16).to_be_bytes());
    t.extend_from_slice(&[0, 0]);
    t.extend(payload(len, u32::from(ports.0)));
    match shape {
        UdpShape::NoChecksum => {}
        UdpShape::Cut => t.truncate(4 + len % 4),
        UdpShape::ShorterByLength => {
            let mut counted = t[..field].to_vec();
            fill_checksum(&mut counted, 6, source, destination, PROTO_UDP, false);
            t[6..8].copy_from_slice(&counted[6..8]);
        }
        _ => fill_checksum(
            &mut t,
            6,
            source,
            destination,
            PROTO_UDP,
            shape == UdpShape::BadChecksum,
        ),
    }
    t
}

/// An ICMP (or ICMPv6) message: type, code, the four bytes after the checksum, a body.
fn icmp_bytes(
    source: IpAddr,
    destination: IpAddr,
    head: (u8, u8, [u8; 4]),
    body: &[u8],
    bad: bool,
) -> Vec<u8> {
    let mut m = vec![head.0, head.1, 0, 0];
    m.extend_from_slice(&head.2);
    m.extend_from_slice(body);
    let initial = if source.is_ipv6() {
        pseudo_header(source, destination, PROTO_ICMPV6, m.len())
    } else {
        0
    };
    let mut sum = checksum(initial, &m);
    if bad {
        sum = spoiled(sum);
    }
    m[2..4].copy_from_slice(&sum.to_be_bytes());
    m
}

fn icmp_protocol(v6: bool) -> u8 {
    if v6 {
        PROTO_ICMPV6
    } else {
        PROTO_ICMP
    }
}

/// What an ICMP error quotes of `packet`: over IPv4 its header and 8 bytes (as RFC 792)
/// or more of it (as RFC 1812 allows), over IPv6 as much as fits.
fn quote(rng: &mut StdRng, packet: &[u8]) -> Vec<u8> {
    let keep = if packet[0] >> 4 == 4 {
        let header = usize::from(packet[0] & 0xf) * 4;
        if rng.gen_bool(0.6) {
            header + 8
        } else {
            500
        }
    } else {
        1000
    };
    packet[..keep.min(packet.len())].to_vec()
}

/// The source and destination of an IP packet.
fn addresses(ip: &[u8]) -> (IpAddr, IpAddr) {
    if ip[0] >> 4 == 4 {
        let a = |at: usize| IpAddr::V4(Ipv4Addr::new(ip[at], ip[at + 1], ip[at + 2], ip[at + 3]));
        (a(12), a(16))
    } else {
        let a = |at: usize| {
            let mut o = [0u8; 16];
            o.copy_from_slice(&ip[at..at + 16]);
            IpAddr::V6(Ipv6Addr::from(o))
        };
        (a(8), a(24))
    }
}

fn extra(rng: &mut StdRng) -> bool {
    rng.gen_bool(0.03)
}

/// An ICMP error from `source` to `destination` quoting `quoted` (whole, as given).
fn icmp_error(
    rng: &mut StdRng,
    source: IpAddr,
    destination: IpAddr,
    quoted: &[u8],
) -> (Vec<u8>, String) {
    let v6 = source.is_ipv6();
    let (kind, code, rest, name) = if v6 {
        match rng.gen_range(0..10) {
            0..=3 => (1, rng.gen_range(0..7), [0; 4], "destination unreachable"),
            4 => (2, 0, 1280u32.to_be_bytes(), "packet too big"),
            5..=7 => (3, rng.gen_range(0..2), [0; 4], "time exceeded"),
            8 => (
                4,
                rng.gen_range(0..3),
                6u32.to_be_bytes(),
                "parameter problem",
            ),
            _ => (
                rng.gen_range(5..128),
                0,
                [0; 4],
                "error of an unassigned type",
            ),
        }
    } else {
        match rng.gen_range(0..10) {
            0..=3 => (
                3,
                rng.gen_range(0..16),
                [0, 0, 5, 0x78],
                "destination unreachable",
            ),
            4..=6 => (11, rng.gen_range(0..2), [0; 4], "time exceeded"),
            7 => (12, 0, [20, 0, 0, 0], "parameter problem"),
            8 => (4, 0, [0; 4], "source quench"),
            _ => (5, rng.gen_range(0..4), [10, 3, 0, 1], "redirect"),
        }
    };
    let bad = rng.gen_bool(0.02);
    let message = icmp_bytes(source, destination, (kind, code, rest), quoted, bad);
    let ip = ip_packet(
        source,
        destination,
        icmp_protocol(v6),
        &message,
        TTL,
        extra(rng),
    );
    let what = format!(
        "ICMP{} {name} (type {kind} code {code}){}",
        if v6 { "v6" } else { "" },
        if bad { ", bad checksum" } else { "" }
    );
    (ip, what)
}

// ---------------------------------------------------------------------------------
// Addresses.
// ---------------------------------------------------------------------------------

/// The host behind the sender of flow `k`: one of its own, so that no two flows share
/// a tuple (flows that mean to share one are one flow).
fn client_address(k: usize, v6: bool) -> IpAddr {
    assert!(k < 250 * 250, "too many flows for the client addresses");
    if v6 {
        IpAddr::V6(Ipv6Addr::new(
            0xfd01,
            0,
            0,
            0,
            0,
            1,
            (k >> 16) as u16,
            k as u16,
        ))
    } else {
        IpAddr::V4(Ipv4Addr::new(10, 1, (k / 250) as u8, (k % 250 + 1) as u8))
    }
}

/// A host beyond the router (a few dozen, shared by the flows).
fn server_address(rng: &mut StdRng, v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::new(
            0xfd03,
            0,
            0,
            0,
            0,
            0,
            0,
            rng.gen_range(1..40),
        ))
    } else {
        IpAddr::V4(Ipv4Addr::new(
            10,
            3,
            rng.gen_range(0..2),
            rng.gen_range(1..20),
        ))
    }
}

/// A router on the far side (the source of ICMP errors about the client's packets).
fn far_router(rng: &mut StdRng, v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::new(
            0xfd03,
            0,
            0,
            0,
            0,
            0,
            0xffff,
            rng.gen_range(1..5),
        ))
    } else {
        IpAddr::V4(Ipv4Addr::new(10, 3, 254, rng.gen_range(1..5)))
    }
}

/// A router on the near side (the source of ICMP errors about the server's packets).
fn near_router(rng: &mut StdRng, v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::new(
            0xfd01,
            0,
            0,
            0,
            0,
            0,
            0xffff,
            rng.gen_range(1..5),
        ))
    } else {
        IpAddr::V4(Ipv4Addr::new(10, 1, 254, rng.gen_range(1..5)))
    }
}

/// A host no flow uses.
fn stranger(rng: &mut StdRng, v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::new(
            0xfd04,
            0,
            0,
            0,
            0,
            0,
            0,
            rng.gen_range(1..500),
        ))
    } else {
        IpAddr::V4(Ipv4Addr::new(
            10,
            4,
            rng.gen_range(0..4),
            rng.gen_range(1..250),
        ))
    }
}

fn ephemeral_port(rng: &mut StdRng) -> u16 {
    rng.gen_range(1024..=65535)
}

fn service_port(rng: &mut StdRng) -> u16 {
    match rng.gen_range(0..6) {
        0 => 80,
        1 => 443,
        2 => 53,
        3 => 22,
        4 => 8080,
        _ => rng.gen_range(1..=65535),
    }
}

fn pick<T: Copy>(rng: &mut StdRng, choices: &[T]) -> T {
    choices[rng.gen_range(0..choices.len())]
}

/// A flow: a kind, and its packets in order.
struct Flow {
    kind: String,
    packets: Vec<Packet>,
    /// The packets sent only [`PAUSE`] after the flow's one before (by index), so
    /// that its connection has expired by then.
    pauses: Vec<usize>,
}

/// An ICMP error about `packets[index]` (or any packet of `packets` if `None`): from
/// the other end or a router beside it, to its sender; now and then to another host
/// (the outer destination not the connection's: invalid), or quoting it partly.
fn error_about(rng: &mut StdRng, packets: &[Packet], from_client: &[bool]) -> Packet {
    let index = rng.gen_range(0..packets.len());
    let quoted = &packets[index].ip;
    let v6 = quoted[0] >> 4 == 6;
    let (sender, receiver) = addresses(quoted);
    let source = if rng.gen_bool(0.5) {
        receiver
    } else if from_client[index] {
        far_router(rng, v6)
    } else {
        near_router(rng, v6)
    };
    let (destination, aim) = if rng.gen_bool(0.15) {
        (
            stranger(rng, v6),
            ", to a host not the quoted packet's source",
        )
    } else {
        (sender, "")
    };
    let mut body = quote(rng, quoted);
    let mut cut = "";
    if !v6 && rng.gen_bool(0.04) {
        // The quoted packet a fragment: the first (more fragments, offset 0) or a
        // later one (offset 1480), whose transport header is not there to read.
        let (field, name): (u16, &str) = if rng.gen_bool(0.5) {
            (0x2000, ", the quoted packet a first fragment")
        } else {
            (185, ", the quoted packet a later fragment")
        };
        body[6..8].copy_from_slice(&field.to_be_bytes());
        let header = usize::from(body[0] & 0xf) * 4;
        body[10..12].fill(0);
        let sum = checksum(0, &body[..header]);
        body[10..12].copy_from_slice(&sum.to_be_bytes());
        cut = name;
    } else if rng.gen_bool(0.05) {
        let keep = rng.gen_range(0..body.len().min(24));
        body.truncate(keep);
        cut = ", the quoted packet cut short";
    }
    let (ip, what) = icmp_error(rng, source, destination, &body);
    Packet {
        ip,
        what: format!(
            "{what} about packet #{index} of the flow ({}){aim}{cut}",
            packets[index].what
        ),
    }
}

// ---------------------------------------------------------------------------------
// TCP conversations.
// ---------------------------------------------------------------------------------

/// Whether sequence number `a` comes after `b`.
fn after(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// One end of a TCP conversation, as its stack keeps it.
#[derive(Clone)]
struct End {
    addr: IpAddr,
    port: u16,
    isn: u32,
    /// The next sequence number it sends.
    nxt: u32,
    /// The oldest sequence number it sent that the other end has not acknowledged.
    una: u32,
    /// The next sequence number it expects (what it acknowledges).
    rcv: u32,
    /// Data received beyond `rcv` (what its SACK blocks say).
    beyond: Vec<(u32, u32)>,
    /// Its receive buffer: the window it offers, in bytes.
    buffer: u32,
    /// The window it last advertised, in bytes.
    advertised: u32,
    /// The window scale its SYN offers (the kernel takes at most 14).
    wscale: Option<u8>,
    sack: bool,
    timestamps: bool,
    mss: u32,
    /// The segments of data it sent: (sequence number, length).
    sent: Vec<(u32, u32)>,
    clock: u32,
    echo: u32,
}

impl End {
    fn new(rng: &mut StdRng, addr: IpAddr, port: u16) -> End {
        let isn = rng.gen();
        let buffer = pick(
            rng,
            &[64_240, 65_535, 29_200, 131_072, 8_192, 1 << 20, 3_000],
        );
        let wscale = if rng.gen_bool(0.85) {
            Some(if rng.gen_bool(0.05) {
                pick(rng, &[15, 20, 255])
            } else {
                pick(rng, &[0, 1, 2, 7, 7, 7, 8, 9, 14])
            })
        } else {
            None
        };
        End {
            addr,
            port,
            isn,
            nxt: isn,
            una: isn,
            rcv: 0,
            beyond: Vec::new(),
            buffer,
            advertised: buffer.min(65_535),
            wscale,
            sack: rng.gen_bool(0.8),
            timestamps: rng.gen_bool(0.6),
            mss: pick(rng, &[1200, 1200, 536, 1000]),
            sent: Vec::new(),
            clock: rng.gen(),
            echo: 0,
        }
    }
}

/// A TCP conversation between a client (end 0, behind the sender) and a server (end
/// 1, beyond the router), written packet by packet.
struct Conversation<'r> {
    rng: &'r mut StdRng,
    ends: [End; 2],
    /// Both SYNs offered window scaling.
    scaled: bool,
    /// Both SYNs offered SACK.
    sack: bool,
    /// Both SYNs offered timestamps.
    timestamps: bool,
    /// The next data segment from this end is lost beyond the router.
    lose: [bool; 2],
    /// Whether the connection is up (established and not reset), so that data flows.
    up: bool,
    /// Times the connection was reopened.
    reopened: usize,
    packets: Vec<Packet>,
    from_client: Vec<bool>,
    /// The packets that wait [`PAUSE`] after the one before.
    pauses: Vec<usize>,
}

const SIDE: [&str; 2] = ["client", "server"];

impl<'r> Conversation<'r> {
    fn new(rng: &'r mut StdRng, client: IpAddr, server: IpAddr) -> Conversation<'r> {
        let client_port = ephemeral_port(rng);
        let server_port = service_port(rng);
        let ends = [
            End::new(rng, client, client_port),
            End::new(rng, server, server_port),
        ];
        Conversation {
            rng,
            ends,
            scaled: false,
            sack: false,
            timestamps: false,
            lose: [false; 2],
            up: false,
            reopened: 0,
            packets: Vec::new(),
            from_client: Vec::new(),
            pauses: Vec::new(),
        }
    }

    /// The window end `from` advertises in a segment, recording it.
    fn window_field(&mut self, from: usize, syn: bool) -> u16 {
        let e = &mut self.ends[from];
        if syn {
            let field = e.buffer.min(65_535);
            e.advertised = field;
            return field as u16;
        }
        let shift = if self.scaled {
            u32::from(e.wscale.unwrap_or(0).min(14))
        } else {
            0
        };
        let field = (e.buffer >> shift).min(65_535);
        e.advertised = field << shift;
        field as u16
    }

    /// The options of a SYN from end `from`, in Linux's order.
    fn syn_options(&mut self, from: usize) -> Vec<u8> {
        let e = &self.ends[from];
        let mut o = vec![2, 4];
        o.extend_from_slice(&(e.mss as u16).to_be_bytes());
        match (e.sack, e.timestamps) {
            (true, true) => o.extend_from_slice(&[4, 2, 8, 10]),
            (false, true) => o.extend_from_slice(&[1, 1, 8, 10]),
            (true, false) => o.extend_from_slice(&[1, 1, 4, 2]),
            (false, false) => {}
        }
        if e.timestamps {
            o.extend_from_slice(&e.clock.to_be_bytes());
            o.extend_from_slice(&e.echo.to_be_bytes());
        }
        if let Some(shift) = e.wscale {
            o.extend_from_slice(&[1, 3, 3, shift]);
        }
        o
    }

    /// The options of another segment from end `from`: timestamps if agreed, SACK
    /// blocks if agreed and something was received out of order.
    fn options(&mut self, from: usize) -> Vec<u8> {
        let timestamps = self.timestamps;
        let sack = self.sack;
        let e = &mut self.ends[from];
        let mut o = Vec::new();
        if timestamps {
            e.clock = e.clock.wrapping_add(1);
            o.extend_from_slice(&[1, 1, 8, 10]);
            o.extend_from_slice(&e.clock.to_be_bytes());
            o.extend_from_slice(&e.echo.to_be_bytes());
        }
        if sack && !e.beyond.is_empty() {
            let blocks: Vec<(u32, u32)> = e
                .beyond
                .iter()
                .rev()
                .take(if timestamps { 3 } else { 4 })
                .copied()
                .collect();
            o.extend_from_slice(&[1, 1, 5, 2 + 8 * blocks.len() as u8]);
            for (left, right) in blocks {
                o.extend_from_slice(&left.to_be_bytes());
                o.extend_from_slice(&right.to_be_bytes());
            }
        }
        o
    }

    /// An honest segment from end `from` with `flags` and `payload` bytes of data.
    fn segment(&mut self, from: usize, flags: u8, payload: u32) -> Segment {
        let syn = flags & SYN != 0;
        let window = self.window_field(from, syn);
        let options = if syn {
            self.syn_options(from)
        } else {
            self.options(from)
        };
        let e = &self.ends[from];
        let ack = if flags & ACK != 0 { e.rcv } else { 0 };
        let seq = if syn { e.isn } else { e.nxt };
        let mut s = Segment::new(flags, seq, ack, window);
        s.options = options;
        s.payload = payload;
        s
    }

    /// Writes a segment from end `from` into the flow.
    fn emit(&mut self, from: usize, s: &Segment, what: &str) {
        let (a, b) = (&self.ends[from], &self.ends[1 - from]);
        let t = tcp_bytes(a.addr, b.addr, (a.port, b.port), s);
        let ip = ip_packet(a.addr, b.addr, PROTO_TCP, &t, TTL, extra(self.rng));
        self.packets.push(Packet {
            ip,
            what: format!("{}: {what}", SIDE[from]),
        });
        self.from_client.push(from == 0);
    }

    /// What the other end makes of an honest segment from `from` that reached it.
    fn deliver(&mut self, from: usize, s: &Segment) {
        let to = 1 - from;
        let clock = self.ends[from].clock;
        let r = &mut self.ends[to];
        r.echo = clock;
        if s.flags & ACK != 0 && !after(s.ack, r.nxt) && !after(r.una, s.ack) {
            r.una = s.ack;
        }
        if s.flags & SYN != 0 {
            r.rcv = s.seq.wrapping_add(1);
            r.beyond.clear();
            return;
        }
        let len = s.payload + u32::from(s.flags & FIN != 0);
        if len == 0 {
            return;
        }
        let end = s.seq.wrapping_add(len);
        if after(s.seq, r.rcv) {
            r.beyond.push((s.seq, end));
            r.beyond.sort_by_key(|b| b.0.wrapping_sub(r.rcv));
            return;
        }
        if after(end, r.rcv) {
            r.rcv = end;
        }
        // Blocks received out of order that the filled hole reaches join on.
        while let Some(k) = r.beyond.iter().position(|&(left, _)| !after(left, r.rcv)) {
            let (_, right) = r.beyond.remove(k);
            if after(right, r.rcv) {
                r.rcv = right;
            }
        }
    }

    /// Emits an honest segment and lets the other end have it (unless lost).
    fn send(&mut self, from: usize, flags: u8, payload: u32, what: &str) -> Segment {
        let s = self.segment(from, flags, payload);
        let lost = payload > 0 && std::mem::take(&mut self.lose[from]);
        if lost {
            self.emit(from, &s, &format!("{what}, lost beyond the router"));
        } else {
            self.emit(from, &s, what);
        }
        let occupied = payload + u32::from(flags & (SYN | FIN) != 0);
        if flags & SYN == 0 {
            let e = &mut self.ends[from];
            e.nxt = e.nxt.wrapping_add(occupied);
            if payload > 0 {
                e.sent.push((s.seq, payload));
            }
        }
        if !lost {
            self.deliver(from, &s);
        }
        s
    }

    /// The room the other end's window leaves end `from`.
    fn room(&self, from: usize) -> u32 {
        let e = &self.ends[from];
        let edge = e.una.wrapping_add(self.ends[1 - from].advertised);
        let room = edge.wrapping_sub(e.nxt) as i32;
        room.max(0) as u32
    }

    // The opening of a connection.

    fn syn(&mut self, from: usize, what: &str) {
        let s = self.segment(from, SYN, 0);
        self.emit(from, &s, what);
        let e = &mut self.ends[from];
        e.nxt = e.isn.wrapping_add(1);
        e.una = e.isn;
        self.deliver(from, &s);
    }

    fn syn_ack(&mut self, from: usize, what: &str) {
        let s = self.segment(from, SYN | ACK, 0);
        self.emit(from, &s, what);
        let e = &mut self.ends[from];
        e.nxt = e.isn.wrapping_add(1);
        self.deliver(from, &s);
    }

    /// What both SYNs agreed.
    fn agree(&mut self) {
        let [c, s] = &self.ends;
        self.scaled = c.wscale.is_some() && s.wscale.is_some();
        self.sack = c.sack && s.sack;
        self.timestamps = c.timestamps && s.timestamps;
    }

    /// A three-way handshake, with its usual accidents.
    fn handshake(&mut self) -> bool {
        if self.rng.gen_bool(0.04) {
            // TCP Fast Open without a cookie: data on the SYN, which the server does
            // not take (it acknowledges the SYN alone; the client sends the data again).
            let len = self.rng.gen_range(1..200);
            let s = self.segment(0, SYN, len);
            self.emit(0, &s, "SYN carrying data (Fast Open)");
            let e = &mut self.ends[0];
            e.nxt = e.isn.wrapping_add(1);
            e.una = e.isn;
            self.deliver(0, &s);
        } else {
            self.syn(0, "SYN");
        }
        if self.rng.gen_bool(0.1) {
            self.syn(0, "SYN retransmitted");
        }
        if self.rng.gen_bool(0.04) {
            // The client starts over with another initial sequence number.
            self.ends[0].isn = self.rng.gen();
            self.syn(0, "SYN with a new initial sequence number");
        }
        match self.rng.gen_range(0..100) {
            0..=5 => {
                // Refused: RST/ACK with seq 0 answering the SYN.
                let ack = self.ends[0].isn.wrapping_add(1);
                let mut s = Segment::new(RST | ACK, 0, ack, 0);
                if self.rng.gen_bool(0.3) {
                    s.ack = ack.wrapping_add(self.rng.gen_range(1..1000));
                    self.emit(
                        1,
                        &s,
                        "RST/ACK answering the SYN, acknowledging the wrong number",
                    );
                } else {
                    self.emit(1, &s, "RST/ACK answering the SYN (seq 0)");
                }
                return false;
            }
            6..=8 => {
                // A challenge ACK (the server holds an old connection on these ports):
                // the client resets with its sequence number, and tries again.
                let seq: u32 = self.rng.gen();
                let ack: u32 = self.rng.gen();
                let s = Segment::new(ACK, seq, ack, 502);
                self.emit(1, &s, "ACK answering the SYN (a challenge ACK)");
                let r = Segment::new(RST, ack, 0, 0);
                self.emit(0, &r, "RST with the challenge ACK's acknowledgement number");
                self.syn(0, "SYN again after the challenge ACK");
            }
            9..=11 => {
                // A SYN/ACK acknowledging the wrong number, then the right one.
                let mut s = self.segment(1, SYN | ACK, 0);
                s.ack = s.ack.wrapping_add(self.rng.gen_range(1..1 << 20));
                self.emit(1, &s, "SYN/ACK acknowledging the wrong number");
            }
            _ => {}
        }
        self.agree();
        self.syn_ack(1, "SYN/ACK");
        if self.rng.gen_bool(0.08) {
            self.syn_ack(1, "SYN/ACK retransmitted");
        }
        if self.rng.gen_bool(0.03) {
            // The client is slow to complete the handshake: SYN_RECV times out.
            self.pause();
        }
        if self.rng.gen_bool(0.2) {
            // The ACK is lost; the client's first data acknowledges the SYN/ACK.
            let len = self.rng.gen_range(1..=self.room(0).clamp(1, 300));
            self.send(0, ACK | PSH, len, "data completing the handshake");
        } else {
            self.send(0, ACK, 0, "ACK completing the handshake");
        }
        true
    }

    /// Both ends send a SYN before either saw the other's.
    fn simultaneous_open(&mut self) {
        self.syn(0, "SYN");
        self.syn(1, "SYN crossing the client's (simultaneous open)");
        self.agree();
        self.syn_ack(0, "SYN/ACK (simultaneous open)");
        self.syn_ack(1, "SYN/ACK (simultaneous open)");
        self.send(0, ACK, 0, "ACK");
    }

    /// A connection long established when the router first sees it.
    fn pick_up(&mut self) {
        for e in &mut self.ends {
            e.nxt = e.isn.wrapping_add(self.rng.gen_range(1..1 << 24));
            e.una = e.nxt;
        }
        for i in 0..2 {
            let other = self.ends[1 - i].nxt;
            self.ends[i].rcv = other;
        }
        self.agree();
        for i in 0..2 {
            self.window_field(i, false);
        }
    }

    // The established connection.

    fn data(&mut self, from: usize) {
        let room = self.room(from);
        if room == 0 {
            self.zero_window_probe(from);
            return;
        }
        let most = room.min(self.ends[from].mss).min(MAX_PAYLOAD);
        let len = if self.rng.gen_bool(0.4) {
            most
        } else {
            self.rng.gen_range(1..=most)
        };
        let mut flags = ACK;
        if self.rng.gen_bool(0.6) {
            flags |= PSH;
        }
        if self.rng.gen_bool(0.03) {
            flags |= ECE | CWR;
        }
        self.send(from, flags, len, "data");
    }

    fn zero_window_probe(&mut self, from: usize) {
        // Linux probes a zero window with an old sequence number and no data.
        let mut s = self.segment(from, ACK, 0);
        s.seq = self.ends[from].una.wrapping_sub(1);
        self.emit(from, &s, "zero window probe (seq = una - 1)");
        self.send(1 - from, ACK, 0, "ACK answering a zero window probe");
    }

    fn retransmit(&mut self, from: usize) {
        let e = &self.ends[from];
        if e.sent.is_empty() {
            return self.data(from);
        }
        let rcv = self.ends[1 - from].rcv;
        // The segment the other end waits for, if any was lost; else any.
        let k = e
            .sent
            .iter()
            .position(|&(seq, _)| seq == rcv)
            .unwrap_or_else(|| self.rng.gen_range(0..e.sent.len()));
        let (seq, len) = e.sent[k];
        let mut s = self.segment(from, ACK | PSH, len);
        s.seq = seq;
        self.emit(from, &s, "data retransmitted");
        self.deliver(from, &s);
    }

    fn zero_window(&mut self, from: usize) {
        // `from` stops reading: its window closes; the other end probes; it opens.
        let kept = self.ends[from].buffer;
        self.ends[from].buffer = 0;
        self.send(from, ACK, 0, "ACK closing the window (zero window)");
        let other = 1 - from;
        for _ in 0..self.rng.gen_range(0..3) {
            if self.rng.gen_bool(0.5) {
                self.zero_window_probe(other);
            } else {
                // A byte past the closed window.
                let mut s = self.segment(other, ACK, 1);
                s.seq = self.ends[other].nxt;
                self.emit(other, &s, "one byte into a zero window");
                self.send(from, ACK, 0, "ACK refusing the byte (zero window)");
            }
        }
        self.ends[from].buffer = kept;
        self.send(from, ACK, 0, "window update opening the window");
    }

    fn window_change(&mut self, from: usize) {
        let e = &mut self.ends[from];
        e.buffer = if self.rng.gen_bool(0.7) {
            e.buffer.saturating_mul(2).min(1 << 24)
        } else {
            (e.buffer / 2).max(1_000)
        };
        self.send(from, ACK, 0, "window update");
    }

    fn keepalive(&mut self, from: usize) {
        let byte = u32::from(self.rng.gen_bool(0.3));
        let mut s = self.segment(from, ACK, byte);
        s.seq = self.ends[from].nxt.wrapping_sub(1);
        self.emit(from, &s, "keepalive (seq = nxt - 1)");
        self.send(1 - from, ACK, 0, "ACK answering a keepalive");
    }

    /// A segment no honest stack sends here; the ends take no notice of it.
    fn anomaly(&mut self) {
        let from = self.rng.gen_range(0..2);
        let other = 1 - from;
        let mut s = self.segment(from, ACK, 0);
        let e = self.ends[from].clone();
        let peer = self.ends[other].clone();
        let what: String = match self.rng.gen_range(0..22) {
            0 => {
                s.seq = e
                    .nxt
                    .wrapping_add(1 << 30)
                    .wrapping_add(self.rng.gen_range(0..1000));
                s.payload = self.rng.gen_range(1..500);
                "data far beyond the window (seq + 2^30)".into()
            }
            1 => {
                s.seq = e.nxt.wrapping_sub(1 << 30);
                s.payload = self.rng.gen_range(1..500);
                "data far behind (seq - 2^30)".into()
            }
            2 => {
                let edge = e.una.wrapping_add(peer.advertised);
                s.seq = edge.wrapping_add(self.rng.gen_range(0..200));
                s.payload = self.rng.gen_range(1..300);
                "data just beyond the right edge of the window".into()
            }
            3 => {
                let edge = e.una.wrapping_add(peer.advertised);
                s.seq = edge.wrapping_sub(self.rng.gen_range(1..100));
                s.payload = self.rng.gen_range(100..400);
                "data running over the right edge of the window".into()
            }
            4 => {
                s.ack = peer.nxt.wrapping_add(self.rng.gen_range(1..1 << 20));
                "ACK of data never sent".into()
            }
            5 => {
                s.ack = e.rcv.wrapping_sub(self.rng.gen_range(70_000..1 << 24));
                "ACK far behind".into()
            }
            6 => {
                s.flags = pick(
                    self.rng,
                    &[
                        SYN | FIN,
                        SYN | FIN | ACK,
                        0,
                        FIN,
                        FIN | PSH | URG,
                        SYN | RST,
                        RST | FIN,
                        SYN | RST | ACK,
                        0x3f,
                        PSH,
                        URG,
                        FIN | RST | ACK,
                    ],
                );
                format!("invalid flags {}", flag_names(s.flags))
            }
            7 => {
                s.flags = self.rng.gen();
                s.payload = self.rng.gen_range(0..50);
                format!("random flags {}", flag_names(s.flags))
            }
            8 => {
                if from == 0 {
                    let mut syn = self.segment(0, SYN, 0);
                    if self.rng.gen_bool(0.5) {
                        syn.seq = self.rng.gen();
                    }
                    s = syn;
                    "SYN in the middle of the connection".into()
                } else {
                    let mut synack = self.segment(1, SYN | ACK, 0);
                    synack.ack = peer.isn.wrapping_add(1);
                    s = synack;
                    "SYN/ACK (the handshake's) in the middle of the connection".into()
                }
            }
            9 => {
                s.doff = Some(self.rng.gen_range(0..5));
                format!("data offset {} (< 5)", s.doff.unwrap_or(0))
            }
            10 => {
                s.doff = Some(self.rng.gen_range(6..16));
                s.options.clear();
                s.payload = 0;
                format!("data offset {} past the segment's end", s.doff.unwrap_or(0))
            }
            11 => {
                s.keep = Some(self.rng.gen_range(4..20));
                "TCP header cut short".into()
            }
            12 => {
                s.flags = pick(self.rng, &[RST, RST | ACK]);
                s.seq = e.nxt.wrapping_add(1 << 30);
                "RST far out of the window".into()
            }
            13 => {
                s.flags = RST;
                s.seq = e
                    .nxt
                    .wrapping_add(self.rng.gen_range(1..peer.advertised.max(2)));
                "RST within the window, not at the next sequence number".into()
            }
            14 => {
                s.payload = self.rng.gen_range(1..200);
                s.bad_checksum = true;
                s.seq = e.nxt;
                "data with a bad checksum".into()
            }
            15 => {
                s.options = pick(
                    self.rng,
                    &[
                        &[3u8, 3, 5][..],
                        &[5, 10, 0, 0, 0, 0, 0, 0, 0, 1],
                        &[8, 0],
                        &[2, 1],
                        &[1, 1, 5, 40],
                        &[4, 2],
                    ],
                )
                .to_vec();
                "malformed or misplaced options".into()
            }
            16 => {
                let mut sack = vec![1, 1, 5, 10];
                sack.extend_from_slice(&peer.nxt.wrapping_add(1000).to_be_bytes());
                sack.extend_from_slice(&peer.nxt.wrapping_add(5000).to_be_bytes());
                s.options = sack;
                "SACK of data never sent".into()
            }
            17 => {
                s.flags = ACK | URG | PSH;
                s.urgent = self.rng.gen_range(1..100);
                s.payload = self.rng.gen_range(1..100).min(self.room(from).max(1));
                "urgent data (not entered in the model)".into()
            }
            18 => {
                s.window = 0;
                s.seq = e.nxt.wrapping_add(self.rng.gen_range(1..1 << 16));
                "ACK ahead of the sequence, window 0".into()
            }
            19 => {
                s.flags = FIN | ACK;
                s.seq = e.nxt.wrapping_add(1 << 20);
                "FIN out of the window".into()
            }
            20 => {
                s.flags = ACK;
                s.ack = peer.una.wrapping_sub(self.rng.gen_range(1..60_000));
                "old ACK (duplicate of an earlier one)".into()
            }
            _ => {
                s.payload = 0;
                s.keep = Some(20 + self.rng.gen_range(1..4));
                s.doff = Some(5);
                "segment with a stray byte or three after a bare header".into()
            }
        };
        self.emit(from, &s, &what);
    }

    fn icmp_error(&mut self) {
        let packet = error_about(self.rng, &self.packets, &self.from_client);
        self.packets.push(packet);
        self.from_client.push(false);
    }

    /// Data both ways, acknowledgements, losses, windows, and now and then something
    /// wrong, for `steps` steps or until a reset.
    fn talk(&mut self, steps: usize) {
        for _ in 0..steps {
            if !self.up {
                return;
            }
            let from = self.rng.gen_range(0..2);
            match self.rng.gen_range(0..100) {
                0..=39 => self.data(from),
                40..=54 => {
                    self.send(from, ACK, 0, "ACK");
                }
                55..=59 => self.retransmit(from),
                60..=63 => self.lose[from] = true,
                64..=65 => self.zero_window(from),
                66..=68 => self.window_change(from),
                69..=70 => self.keepalive(from),
                71..=89 => self.anomaly(),
                90..=94 => self.icmp_error(),
                95 => {
                    // Duplicate ACKs while a segment is missing.
                    for _ in 0..3 {
                        self.send(from, ACK, 0, "duplicate ACK");
                    }
                }
                _ => {
                    self.reset(from);
                }
            }
        }
    }

    /// An honest reset from `from`: the connection is gone.
    fn reset(&mut self, from: usize) {
        let flags = if self.rng.gen_bool(0.5) {
            RST
        } else {
            RST | ACK
        };
        let mut s = self.segment(from, flags, 0);
        if flags == RST {
            s.ack = 0;
        }
        self.emit(from, &s, "RST at the next sequence number");
        self.up = false;
    }

    /// Closes with FINs (either side first, or both at once), or a reset.
    fn close(&mut self) {
        if !self.up {
            return;
        }
        let first = self.rng.gen_range(0..2);
        let second = 1 - first;
        match self.rng.gen_range(0..10) {
            0..=5 => {
                self.send(first, FIN | ACK, 0, "FIN");
                if self.rng.gen_bool(0.1) {
                    let mut s = self.segment(first, FIN | ACK, 0);
                    s.seq = self.ends[first].nxt.wrapping_sub(1);
                    self.emit(first, &s, "FIN retransmitted");
                }
                if self.rng.gen_bool(0.4) {
                    self.send(second, FIN | ACK, 0, "FIN answering a FIN");
                } else {
                    self.send(second, ACK, 0, "ACK of the FIN");
                    for _ in 0..self.rng.gen_range(0..4) {
                        self.data(second);
                        self.send(first, ACK, 0, "ACK after its FIN (half closed)");
                    }
                    self.send(second, FIN | ACK, 0, "FIN");
                }
                self.send(first, ACK, 0, "last ACK");
            }
            6..=7 => {
                // Simultaneous close.
                self.send(first, FIN | ACK, 0, "FIN");
                let mut s = self.segment(second, FIN | ACK, 0);
                s.ack = self.ends[second].rcv.wrapping_sub(1);
                self.emit(second, &s, "FIN crossing the other's FIN");
                self.ends[second].nxt = self.ends[second].nxt.wrapping_add(1);
                self.deliver(second, &s);
                self.send(first, ACK, 0, "ACK of the crossing FIN");
                self.send(second, ACK, 0, "ACK of the first FIN");
            }
            8 => {
                self.reset(first);
            }
            _ => {
                // Left open: the flow ends without a word.
                return;
            }
        }
        self.up = false;
    }

    /// What comes after a close: late segments, or the ports used again by a new SYN.
    fn after_close(&mut self) {
        match self.rng.gen_range(0..10) {
            0..=2 => {
                let from = self.rng.gen_range(0..2);
                let mut s = self.segment(from, ACK, 0);
                if self.rng.gen_bool(0.5) {
                    s.flags = FIN | ACK;
                    s.seq = self.ends[from].nxt.wrapping_sub(1);
                    self.emit(from, &s, "FIN retransmitted after the close");
                } else {
                    self.emit(from, &s, "ACK after the close");
                }
            }
            3..=4 if self.reopened < 2 => self.reopen(0),
            5 if self.reopened < 2 => self.reopen(1),
            6 => {
                let from = self.rng.gen_range(0..2);
                let s = self.segment(from, RST, 0);
                self.emit(from, &s, "RST after the close");
            }
            _ => {}
        }
    }

    /// The same ports used again: a new SYN from `from` (the client, or the server
    /// turning the connection round), a new handshake, a little data, a close.
    fn reopen(&mut self, from: usize) {
        self.reopened += 1;
        let old_nxt = self.ends[from].nxt;
        let (old_client, old_server) = (self.ends[0].clone(), self.ends[1].clone());
        self.ends = [
            End::new(self.rng, old_client.addr, old_client.port),
            End::new(self.rng, old_server.addr, old_server.port),
        ];
        if self.rng.gen_bool(0.7) {
            // RFC 6191: a new ISN beyond the old sequence space.
            let isn = old_nxt.wrapping_add(self.rng.gen_range(1..1 << 30));
            let e = &mut self.ends[from];
            e.isn = isn;
            e.nxt = isn;
            e.una = isn;
        }
        self.lose = [false; 2];
        let to = 1 - from;
        self.syn(from, "SYN reusing the closed connection's ports");
        self.agree();
        self.syn_ack(to, "SYN/ACK");
        self.send(from, ACK, 0, "ACK completing the handshake");
        self.up = true;
        let steps = self.rng.gen_range(0..8);
        self.talk(steps);
        self.close();
    }

    /// The next packet waits [`PAUSE`]: the connection's timeout (short in this test)
    /// passes first.
    fn pause(&mut self) {
        self.pauses.push(self.packets.len());
    }
}

/// `tcpdump`'s letters for a flag byte.
fn flag_names(flags: u8) -> String {
    let mut s = String::from("[");
    for (bit, c) in [
        (SYN, 'S'),
        (FIN, 'F'),
        (RST, 'R'),
        (PSH, 'P'),
        (ACK, '.'),
        (URG, 'U'),
        (ECE, 'E'),
        (CWR, 'W'),
    ] {
        if flags & bit != 0 {
            s.push(c);
        }
    }
    if flags == 0 {
        s.push_str("none");
    }
    s.push(']');
    s
}

fn tcp_flow(rng: &mut StdRng, k: usize, v6: bool) -> Flow {
    let client = client_address(k, v6);
    let server = server_address(rng, v6);
    let mut c = Conversation::new(rng, client, server);
    let opening = c.rng.gen_range(0..100);
    let kind = match opening {
        0..=64 => {
            c.up = c.handshake();
            "handshake"
        }
        65..=69 => {
            c.simultaneous_open();
            c.up = true;
            "simultaneous open"
        }
        70..=79 => {
            c.pick_up();
            c.up = true;
            let from = c.rng.gen_range(0..2);
            if c.rng.gen_bool(0.5) {
                c.data(from);
            } else {
                c.send(from, ACK, 0, "ACK (the first packet seen: mid-stream)");
            }
            "picked up mid-stream"
        }
        80..=83 => {
            // The SYN went another way: the router sees the SYN/ACK first.
            c.ends[0].nxt = c.ends[0].isn.wrapping_add(1);
            c.ends[1].rcv = c.ends[0].nxt;
            c.agree();
            c.syn_ack(1, "SYN/ACK without a SYN");
            c.send(0, ACK, 0, "ACK of the SYN/ACK");
            c.up = true;
            "SYN/ACK first"
        }
        84..=88 => {
            for k in 0..c.rng.gen_range(1..4) {
                c.syn(0, if k == 0 { "SYN" } else { "SYN retransmitted" });
            }
            if c.rng.gen_bool(0.3) {
                // Answered after SYN_SENT timed out.
                c.pause();
                c.agree();
                c.syn_ack(1, "SYN/ACK after a pause");
                c.send(0, ACK, 0, "ACK completing the handshake");
                c.up = true;
            }
            "unanswered SYN"
        }
        _ => {
            // Something invalid first, then (maybe) a proper handshake.
            let flags = pick(
                c.rng,
                &[
                    SYN | FIN,
                    0,
                    FIN,
                    RST,
                    FIN | ACK,
                    RST | ACK,
                    SYN | RST,
                    0xff,
                ],
            );
            let mut s = c.segment(0, ACK, 0);
            s.flags = flags;
            let what = format!("{} as the first packet", flag_names(flags));
            c.emit(0, &s, &what);
            if c.rng.gen_bool(0.6) {
                c.up = c.handshake();
            }
            "invalid first"
        }
    };
    let steps = c.rng.gen_range(0..30);
    c.talk(steps);
    c.close();
    if !c.up {
        if c.rng.gen_bool(0.15) {
            // TIME_WAIT or CLOSE times out first.
            c.pause();
        }
        c.after_close();
    }
    Flow {
        kind: format!("TCP/IPv{}, {kind}", if v6 { 6 } else { 4 }),
        pauses: c.pauses,
        packets: c.packets,
    }
}

// ---------------------------------------------------------------------------------
// UDP, ICMP, ICMPv6, neighbour discovery, generic.
// ---------------------------------------------------------------------------------

fn udp_flow(rng: &mut StdRng, k: usize, v6: bool) -> Flow {
    let ends = [client_address(k, v6), server_address(rng, v6)];
    let ports = [ephemeral_port(rng), service_port(rng)];
    let mut packets: Vec<Packet> = Vec::new();
    let mut from_client = Vec::new();
    let mut pauses = Vec::new();
    let style = rng.gen_range(0..10);
    let count = rng.gen_range(1..10);
    for n in 0..count {
        if n > 0 && rng.gen_bool(0.05) {
            pauses.push(packets.len());
        }
        let from = match style {
            // Unanswered.
            0..=1 => 0,
            // The server speaks first.
            2 if n == 0 => 1,
            _ => n % 2,
        };
        if rng.gen_bool(0.12) && !packets.is_empty() {
            packets.push(error_about(rng, &packets, &from_client));
            from_client.push(false);
            continue;
        }
        let shape = match rng.gen_range(0..100) {
            0..=3 => UdpShape::NoChecksum,
            4..=5 => UdpShape::BadChecksum,
            6..=7 => UdpShape::LongerThanSent,
            8 => UdpShape::ShorterByLength,
            9 => UdpShape::ShorterByPacket,
            10 => UdpShape::BelowHeader,
            11 => UdpShape::Cut,
            _ => UdpShape::Honest,
        };
        let what = match shape {
            UdpShape::Honest => "datagram",
            UdpShape::NoChecksum => "datagram without a checksum (0)",
            UdpShape::BadChecksum => "datagram with a bad checksum",
            UdpShape::LongerThanSent => "datagram whose length field is more than was sent",
            UdpShape::ShorterByLength => {
                "datagram whose length field is less than was sent (checksum over the length)"
            }
            UdpShape::ShorterByPacket => {
                "datagram whose length field is less than was sent (checksum over all)"
            }
            UdpShape::BelowHeader => "datagram whose length field is less than a header",
            UdpShape::Cut => "datagram shorter than a UDP header",
        };
        let len = rng.gen_range(0..MAX_PAYLOAD as usize / 2);
        let t = udp_bytes(
            ends[from],
            ends[1 - from],
            (ports[from], ports[1 - from]),
            len,
            shape,
        );
        let ip = ip_packet(ends[from], ends[1 - from], PROTO_UDP, &t, TTL, extra(rng));
        packets.push(Packet {
            ip,
            what: format!("{}: {what}", SIDE[from]),
        });
        from_client.push(from == 0);
    }
    let kind = match style {
        0..=1 => "unanswered",
        2 => "server first",
        _ => "exchange",
    };
    Flow {
        kind: format!("UDP/IPv{}, {kind}", if v6 { 6 } else { 4 }),
        packets,
        pauses,
    }
}

/// A query type and its answer's, for ICMP or ICMPv6.
fn query_types(rng: &mut StdRng, v6: bool) -> (u8, u8, &'static str) {
    if v6 {
        match rng.gen_range(0..10) {
            0..=7 => (128, 129, "echo"),
            _ => (139, 140, "node information"),
        }
    } else {
        match rng.gen_range(0..12) {
            0..=7 => (8, 0, "echo"),
            8..=9 => (13, 14, "timestamp"),
            10 => (15, 16, "information"),
            _ => (17, 18, "address mask"),
        }
    }
}

fn icmp_flow(rng: &mut StdRng, k: usize, v6: bool) -> Flow {
    let ends = [client_address(k, v6), server_address(rng, v6)];
    let protocol = icmp_protocol(v6);
    let (request, reply, name) = query_types(rng, v6);
    let id: u16 = rng.gen();
    let mut seq: u16 = rng.gen();
    let mut packets: Vec<Packet> = Vec::new();
    let mut from_client = Vec::new();
    let family = if v6 { "ICMPv6" } else { "ICMP" };
    let style = rng.gen_range(0..10);
    let kind = match style {
        0 => "answer without a request",
        1 => "unknown types",
        _ => "queries",
    };
    let mut pauses = Vec::new();
    let count = rng.gen_range(1..8);
    for n in 0..count {
        if n > 0 && rng.gen_bool(0.05) {
            pauses.push(packets.len());
        }
        let roll = rng.gen_range(0..100);
        let (from, kind, code, what): (usize, u8, u8, String) = match style {
            0 => (1, reply, 0, format!("{name} reply to no request")),
            1 => {
                let kind = if v6 {
                    pick(rng, &[141, 142, 144, 150, 200, 255, 137, 138])
                } else if rng.gen_bool(0.7) {
                    rng.gen_range(19..=255)
                } else {
                    pick(rng, &[1, 2, 6, 7, 9, 10])
                };
                (n % 2, kind, 0, format!("type {kind}"))
            }
            _ => match roll {
                0..=39 => (0, request, 0, format!("{name} request")),
                40..=79 => (1, reply, 0, format!("{name} reply")),
                80..=84 => (
                    0,
                    request,
                    rng.gen_range(1..5),
                    format!("{name} request, code not 0"),
                ),
                85..=89 => (1, reply, 0, format!("{name} reply, another identifier")),
                _ => {
                    if packets.is_empty() {
                        (0, request, 0, format!("{name} request"))
                    } else {
                        let mut error = error_about(rng, &packets, &from_client);
                        if rng.gen_bool(0.3) {
                            // An error quoting an error.
                            let (source, destination) = addresses(&error.ip);
                            let (ip, what) = icmp_error(rng, destination, source, &error.ip);
                            error = Packet {
                                ip,
                                what: format!("{what} quoting an ICMP error"),
                            };
                        }
                        packets.push(error);
                        from_client.push(false);
                        continue;
                    }
                }
            },
        };
        let this_id = if what.contains("another identifier") {
            id.wrapping_add(1)
        } else {
            id
        };
        let mut rest = [0u8; 4];
        rest[..2].copy_from_slice(&this_id.to_be_bytes());
        rest[2..].copy_from_slice(&seq.to_be_bytes());
        if from == 1 {
            seq = seq.wrapping_add(1);
        }
        let body: Vec<u8> = match kind {
            13 | 14 => vec![0; 12],
            17 | 18 => vec![255, 255, 255, 0],
            _ => payload(rng.gen_range(0..64), u32::from(id)).collect(),
        };
        let bad = rng.gen_bool(0.02);
        let m = icmp_bytes(ends[from], ends[1 - from], (kind, code, rest), &body, bad);
        let ip = ip_packet(ends[from], ends[1 - from], protocol, &m, TTL, extra(rng));
        packets.push(Packet {
            ip,
            what: format!(
                "{}: {family} {what}{}",
                SIDE[from],
                if bad { ", bad checksum" } else { "" }
            ),
        });
        from_client.push(from == 0);
    }
    Flow {
        kind: format!("{family}, {kind}"),
        packets,
        pauses,
    }
}

/// Neighbour discovery and MLD, which the kernel does not track, sent to a global
/// destination beyond the router with hop limit 255, so that the router forwards them
/// (the router's neighbours are static: these do not concern it). A redirect (137),
/// not among them, goes too.
fn neighbour_flow(rng: &mut StdRng, k: usize) -> Flow {
    let ends = [client_address(k, true), server_address(rng, true)];
    let mut packets = Vec::new();
    for _ in 0..rng.gen_range(1..4) {
        let from = rng.gen_range(0..2);
        let (source, destination) = (ends[from], ends[1 - from]);
        let target = octets(destination);
        let (kind, rest, body, name): (u8, [u8; 4], Vec<u8>, &str) = match rng.gen_range(0..9) {
            0 => (
                133,
                [0; 4],
                vec![1, 1, 2, 0, 0, 0, 0, 1],
                "router solicitation",
            ),
            1 => (134, [64, 0, 0, 0], vec![0; 8], "router advertisement"),
            2 => {
                let mut b = target.clone();
                b.extend_from_slice(&[1, 1, 2, 0, 0, 0, 0, 1]);
                (135, [0; 4], b, "neighbour solicitation")
            }
            3 => (
                136,
                [0x60, 0, 0, 0],
                target.clone(),
                "neighbour advertisement",
            ),
            4 => (130, [0, 10, 0, 0], vec![0; 16], "MLD query"),
            5 => (131, [0; 4], target.clone(), "MLD report"),
            6 => (132, [0; 4], target.clone(), "MLD done"),
            7 => (143, [0, 0, 0, 0], Vec::new(), "MLDv2 report"),
            _ => {
                let mut b = target.clone();
                b.extend_from_slice(&target);
                (137, [0; 4], b, "redirect")
            }
        };
        let bad = rng.gen_bool(0.05);
        let m = icmp_bytes(source, destination, (kind, 0, rest), &body, bad);
        let hops = if rng.gen_bool(0.8) { 255 } else { TTL };
        let ip = ip_packet(source, destination, PROTO_ICMPV6, &m, hops, extra(rng));
        packets.push(Packet {
            ip,
            what: format!(
                "{}: {name} (type {kind}, hop limit {hops}){}",
                SIDE[from],
                if bad { ", bad checksum" } else { "" }
            ),
        });
    }
    if rng.gen_bool(0.1) {
        // An ICMPv6 message too short for its header.
        let m = vec![135, 0, 0];
        let ip = ip_packet(ends[0], ends[1], PROTO_ICMPV6, &m, 255, false);
        packets.push(Packet {
            ip,
            what: "client: ICMPv6 of 3 bytes".into(),
        });
    }
    Flow {
        kind: "ICMPv6 neighbour discovery and MLD".into(),
        packets,
        pauses: Vec::new(),
    }
}

fn generic_flow(rng: &mut StdRng, k: usize, v6: bool) -> Flow {
    let ends = [client_address(k, v6), server_address(rng, v6)];
    let protocol = pick(rng, &[253, 254, 253]);
    let mut packets = Vec::new();
    let style = rng.gen_range(0..3);
    let mut pauses = Vec::new();
    for n in 0..rng.gen_range(1..6) {
        if n > 0 && rng.gen_bool(0.1) {
            pauses.push(packets.len());
        }
        let from = if style == 0 { 0 } else { n % 2 };
        let body: Vec<u8> = payload(rng.gen_range(0..100), n as u32).collect();
        let ip = ip_packet(ends[from], ends[1 - from], protocol, &body, TTL, extra(rng));
        packets.push(Packet {
            ip,
            what: format!("{}: IP protocol {protocol}", SIDE[from]),
        });
    }
    Flow {
        kind: format!("protocol {protocol}/IPv{}", if v6 { 6 } else { 4 }),
        packets,
        pauses,
    }
}

/// An ICMP error about a connection never seen.
fn stray_error_flow(rng: &mut StdRng, v6: bool) -> Flow {
    let (a, b) = (stranger(rng, v6), server_address(rng, v6));
    let quoted = match rng.gen_range(0..3) {
        0 => {
            let s = Segment::new(SYN, rng.gen(), 0, 64_240);
            let t = tcp_bytes(a, b, (ephemeral_port(rng), 80), &s);
            ip_packet(a, b, PROTO_TCP, &t, TTL, false)
        }
        1 => {
            let t = udp_bytes(a, b, (ephemeral_port(rng), 53), 20, UdpShape::Honest);
            ip_packet(a, b, PROTO_UDP, &t, TTL, false)
        }
        _ => {
            let kind = if v6 { 128 } else { 8 };
            let m = icmp_bytes(a, b, (kind, 0, [0, 1, 0, 1]), &[0; 8], false);
            ip_packet(a, b, icmp_protocol(v6), &m, TTL, false)
        }
    };
    let body = quote(rng, &quoted);
    let (ip, what) = icmp_error(rng, b, a, &body);
    Flow {
        kind: format!(
            "ICMP{} error about no connection",
            if v6 { "v6" } else { "" }
        ),
        packets: vec![Packet {
            ip,
            what: format!("{what} quoting a packet of no connection"),
        }],
        pauses: Vec::new(),
    }
}

/// The next flow, number `k`.
fn random_flow(rng: &mut StdRng, k: usize) -> Flow {
    let v6 = rng.gen_bool(0.5);
    match rng.gen_range(0..100) {
        0..=49 => tcp_flow(rng, k, v6),
        50..=69 => udp_flow(rng, k, v6),
        70..=84 => icmp_flow(rng, k, v6),
        85..=89 => neighbour_flow(rng, k),
        90..=95 => generic_flow(rng, k, v6),
        _ => stray_error_flow(rng, v6),
    }
}

// ---------------------------------------------------------------------------------
// Reading packets back: what a mismatch report shows.
// ---------------------------------------------------------------------------------

/// The headers of an IP packet in a line, read from its bytes (as sent, lies and all).
fn describe(ip: &[u8]) -> String {
    let Some(&first) = ip.first() else {
        return "empty".into();
    };
    let (source, destination, mut protocol, mut at) = if first >> 4 == 4 && ip.len() >= 20 {
        let (s, d) = addresses(ip);
        (s, d, ip[9], usize::from(first & 0xf) * 4)
    } else if first >> 4 == 6 && ip.len() >= 40 {
        let (s, d) = addresses(ip);
        (s, d, ip[6], 40)
    } else {
        return format!("not an IP packet: {}", hex(ip));
    };
    let mut notes = String::new();
    if first >> 4 == 4 && at > 20 {
        notes.push_str(" (IPv4 options)");
    }
    while first >> 4 == 6 && matches!(protocol, 0 | 43 | 60) && at + 8 <= ip.len() {
        notes.push_str(" (extension header)");
        protocol = ip[at];
        at += (usize::from(ip[at + 1]) + 1) * 8;
    }
    let t = ip.get(at..).unwrap_or(&[]);
    let word = |k: usize| u16::from_be_bytes([t[k], t[k + 1]]);
    let long = |k: usize| u32::from_be_bytes([t[k], t[k + 1], t[k + 2], t[k + 3]]);
    let ports = || {
        if t.len() >= 4 {
            (
                format!("{source}:{}", word(0)),
                format!("{destination}:{}", word(2)),
            )
        } else {
            (source.to_string(), destination.to_string())
        }
    };
    match protocol {
        PROTO_TCP => {
            let (s, d) = ports();
            if t.len() < 20 {
                return format!("{s} > {d} TCP cut to {} bytes{notes}", t.len());
            }
            let doff = usize::from(t[12] >> 4) * 4;
            let mut line = format!(
                "{s} > {d} TCP {} seq {} ack {} win {} len {}",
                flag_names(t[13]),
                long(4),
                long(8),
                word(14),
                t.len().saturating_sub(doff.max(20)),
            );
            if doff != 20 {
                let _ = write!(line, " doff {}", doff / 4);
            }
            if doff > 20 && doff <= t.len() {
                let _ = write!(line, " options {}", hex(&t[20..doff]));
            }
            if word(18) != 0 {
                let _ = write!(line, " urg {}", word(18));
            }
            line + &notes
        }
        PROTO_UDP => {
            let (s, d) = ports();
            if t.len() < 8 {
                return format!("{s} > {d} UDP cut to {} bytes{notes}", t.len());
            }
            format!(
                "{s} > {d} UDP length field {} of {} bytes, checksum {:#06x}{notes}",
                word(4),
                t.len(),
                word(6)
            )
        }
        PROTO_ICMP | PROTO_ICMPV6 => {
            let family = if protocol == PROTO_ICMP {
                "ICMP"
            } else {
                "ICMPv6"
            };
            if t.len() < 8 {
                return format!(
                    "{source} > {destination} {family} of {} bytes{notes}",
                    t.len()
                );
            }
            let error = if protocol == PROTO_ICMP {
                matches!(t[0], 3 | 4 | 5 | 11 | 12)
            } else {
                t[0] < 128
            };
            if error {
                format!(
                    "{source} > {destination} {family} type {} code {}{notes} quoting [{}]",
                    t[0],
                    t[1],
                    describe(&t[8..])
                )
            } else {
                format!(
                    "{source} > {destination} {family} type {} code {} id {} seq {}{notes}",
                    t[0],
                    t[1],
                    word(4),
                    word(6)
                )
            }
        }
        _ => format!(
            "{source} > {destination} protocol {protocol}, {} bytes{notes}",
            t.len()
        ),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

// ---------------------------------------------------------------------------------
// The run.
// ---------------------------------------------------------------------------------

/// What became of a packet, by one side's account.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// It went on with this state.
    Passed(State),
    /// Dropped.
    Dropped,
    /// fibre leaves it to the kernel (not its to track).
    NotFibres,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Passed(state) => write!(f, "{}", state_name(*state)),
            Verdict::Dropped => write!(f, "dropped"),
            Verdict::NotFibres => write!(f, "not fibre's to track"),
        }
    }
}

fn state_name(state: State) -> &'static str {
    match state {
        State::Invalid => "invalid",
        State::Established => "established",
        State::Related => "related",
        State::New => "new",
        State::Untracked => "untracked",
    }
}

fn fibre_verdict(t: &Tracked) -> Verdict {
    match t.outcome() {
        Fate::Pass => Verdict::Passed(t.state()),
        Fate::TableFull => Verdict::Dropped,
        Fate::Kernel(_) => Verdict::NotFibres,
        // (One table: every connection is its own.)
        Fate::Elsewhere(w) => panic!("handed to worker {w} with one table"),
    }
}

/// The wire: the socket writing onto `a0`, the one reading `p1`..`p5`.
struct Wire {
    inject: OwnedFd,
    capture: OwnedFd,
    /// `p1`..`p5`'s indexes.
    links: [u32; OUT_LINKS],
    buffer: Vec<u8>,
}

impl Wire {
    /// Sends `ip` into the router and waits for it to come out: the state of the link
    /// it came out of, or `Dropped` once [`QUIET`] passed without it.
    fn through_kernel(&mut self, ip: &[u8]) -> Verdict {
        let frame = wire::ethernet_frame(ROUTER_IN_MAC, SENDER_MAC, ip);
        wire::send_frame(&self.inject, &frame).expect("sending a frame");
        loop {
            let Some(arrival) = wire::receive(&self.capture, &mut self.buffer).expect("receiving")
            else {
                return Verdict::Dropped;
            };
            if arrival.outgoing {
                continue;
            }
            let Some(link) = self.links.iter().position(|&l| l == arrival.ifindex) else {
                continue;
            };
            let frame = &self.buffer[..arrival.len];
            if wire::ip_packet(frame).is_some_and(|received| forwarded_from(ip, received)) {
                return Verdict::Passed(STATE_OF_LINK[link]);
            }
        }
    }
}

/// One packet's place and both sides' accounts of it.
struct Record {
    run_index: usize,
    kernel: Verdict,
    fibre: Verdict,
}

/// A flow being sent, and what became of its packets so far.
struct Running {
    number: usize,
    flow: Flow,
    records: Vec<Record>,
}

/// What the generator meant by packet `at` of `flow`.
fn meant(flow: &Flow, at: usize) -> String {
    let what = &flow.packets[at].what;
    if flow.pauses.contains(&at) {
        format!("{what}, after a pause of {PAUSE:?}")
    } else {
        what.clone()
    }
}

/// The first packet of a flow on which the sides disagreed, reported in full.
fn report(seed: u64, running: &Running, at: usize) -> String {
    let record = &running.records[at];
    let packet = &running.flow.packets[at];
    let mut text = format!(
        "seed {seed}, flow {} ({}), packet {at} of the flow, {} of the run: kernel {}, fibre {}\n  \
         {}\n  (the generator: {})\n",
        running.number,
        running.flow.kind,
        record.run_index,
        record.kernel,
        record.fibre,
        describe(&packet.ip),
        meant(&running.flow, at),
    );
    if at > 0 {
        text.push_str("  the flow before it:\n");
    }
    for (k, (r, p)) in running.records[..at]
        .iter()
        .zip(&running.flow.packets)
        .enumerate()
    {
        let _ = writeln!(
            text,
            "    #{k} (run {}): kernel {}, fibre {}: {}\n        ({})",
            r.run_index,
            r.kernel,
            r.fibre,
            describe(&p.ip),
            meant(&running.flow, k)
        );
    }
    text
}

/// Asks the kernel whether it checks the checksums of packets arriving on the router
/// from `a0`: a UDP datagram of a bad checksum is invalid if it does.
fn kernel_checks_checksums(wire: &mut Wire) -> bool {
    let (a, b): (IpAddr, IpAddr) = ("10.5.0.1".parse().unwrap(), "10.5.0.2".parse().unwrap());
    let t = udp_bytes(a, b, (1, 2), 16, UdpShape::BadChecksum);
    let mut ip = ip_packet(a, b, PROTO_UDP, &t, TTL, false);
    set_tag(&mut ip, 0xfffff);
    match wire.through_kernel(&ip) {
        Verdict::Passed(State::Invalid) => true,
        Verdict::Passed(State::New) => false,
        other => panic!(
            "a UDP datagram of a bad checksum came out of the router {other}: the topology \
             is not what the test expects"
        ),
    }
}

#[test]
#[ignore = "needs root: network namespaces, veth links and nftables"]
fn fibre_tracks_connections_as_the_kernel_does() {
    let seed: u64 = match std::env::var("FIBRE_SEED") {
        Ok(s) => s.parse().expect("FIBRE_SEED is a number"),
        Err(_) => rand::random(),
    };
    println!("conntrack seed {seed} (FIBRE_SEED={seed} replays this run)");
    let started = Instant::now();
    let net = Topology::build();
    let mut wire = Wire {
        inject: in_namespace(&net.sender, || {
            wire::packet_socket(0, net.sender_link).expect("the sending socket")
        }),
        capture: in_namespace(&net.receiver, || {
            wire::capture_socket(0, CAPTURE_BUFFER, QUIET).expect("the capturing socket")
        }),
        links: net.receiver_links,
        buffer: vec![0; 1 << 16],
    };
    let settings = in_namespace(&net.router, Settings::read).expect("the router's sysctls");
    let checked = kernel_checks_checksums(&mut wire);
    // A link vouches for a packet's checksums when the kernel does not check them.
    let vouched = !checked;
    println!(
        "the kernel {} the checksums of packets injected on a veth: fibre tracks with \
         vouched = {vouched}",
        if checked { "checks" } else { "does not check" }
    );
    let mut conntrack = Conntrack::new(settings);
    let lost_before = net.frames_lost_below_ip();
    wire::capture_drops(&wire.capture).expect("the capture's drops");

    // The flows come from one generator, the order their packets are interleaved in
    // from another: a flow waking from a pause comes back when the clock says, so the
    // interleaving of a replay may differ, but every flow is the same.
    let mut flow_rng = StdRng::seed_from_u64(seed);
    let mut order_rng = StdRng::seed_from_u64(seed ^ 0x006f_7264_6572);
    let mut active: Vec<Running> = Vec::new();
    // Flows waiting out a pause, and when they may go on (since `started`).
    let mut parked: Vec<(Duration, Running)> = Vec::new();
    let mut flows_started = 0usize;
    let mut sent = 0usize;
    let mut matched: BTreeMap<String, usize> = BTreeMap::new();
    let mut mismatching: Vec<(usize, String)> = Vec::new();
    let mut mismatch_kinds: BTreeMap<String, usize> = BTreeMap::new();
    let mut mismatched_packets = 0usize;
    let mut disagreeing_flows: HashSet<usize> = HashSet::new();
    // The kernel's states of the packets sent after a pause.
    let mut after_pauses: BTreeMap<String, usize> = BTreeMap::new();
    loop {
        let starting = sent < PACKETS && started.elapsed() < TIME_BUDGET;
        while starting && active.len() < FLOWS_AT_ONCE {
            let flow = random_flow(&mut flow_rng, flows_started);
            active.push(Running {
                number: flows_started,
                flow,
                records: Vec::new(),
            });
            flows_started += 1;
        }
        let elapsed = started.elapsed();
        let mut p = 0;
        while p < parked.len() {
            if parked[p].0 <= elapsed {
                active.push(parked.swap_remove(p).1);
            } else {
                p += 1;
            }
        }
        if active.is_empty() {
            match parked.iter().map(|(due, _)| *due).min() {
                Some(due) => {
                    std::thread::sleep(due.saturating_sub(elapsed));
                    continue;
                }
                None => break,
            }
        }
        let k = order_rng.gen_range(0..active.len());
        let running = &mut active[k];
        let at = running.records.len();
        let mut ip = running.flow.packets[at].ip.clone();
        set_tag(&mut ip, sent as u32);
        let now = started.elapsed().as_nanos() as u64;
        let kernel = wire.through_kernel(&ip);
        let tracked = conntrack.track(&ip, now, vouched);
        let fibre = fibre_verdict(&tracked);
        if tracked.outcome() == Fate::Pass {
            conntrack.confirm(&tracked);
        }
        running.records.push(Record {
            run_index: sent,
            kernel,
            fibre,
        });
        sent += 1;
        if running.flow.pauses.contains(&at) {
            *after_pauses.entry(kernel.to_string()).or_default() += 1;
        }
        if kernel == fibre {
            *matched.entry(kernel.to_string()).or_default() += 1;
        } else {
            mismatched_packets += 1;
            let first_of_flow = disagreeing_flows.insert(running.number);
            if first_of_flow {
                *mismatch_kinds
                    .entry(format!(
                        "{}: {}: kernel {kernel}, fibre {fibre}",
                        running.flow.kind,
                        meant(&running.flow, at)
                    ))
                    .or_default() += 1;
                if mismatching.len() < REPORTED {
                    mismatching.push((running.number, report(seed, running, at)));
                }
            }
        }
        let next = running.records.len();
        if next == running.flow.packets.len() {
            active.swap_remove(k);
        } else if running.flow.pauses.contains(&next) {
            let paused = active.swap_remove(k);
            parked.push((started.elapsed() + PAUSE, paused));
        }
    }

    let lost = net.frames_lost_below_ip() - lost_before;
    let capture_lost = wire::capture_drops(&wire.capture).expect("the capture's drops");
    assert_eq!(
        (lost, capture_lost),
        (0, 0),
        "seed {seed}: frames lost below IP (links and backlogs, capture buffer): the \
         kernel's states cannot be told"
    );
    let summary: Vec<String> = matched.iter().map(|(s, n)| format!("{n} {s}")).collect();
    println!(
        "{sent} packets of {flows_started} flows in {:.1?}: {} matched ({}), {mismatched_packets} \
         did not, in {} flows; fibre holds {} connections; seed {seed}",
        started.elapsed(),
        sent - mismatched_packets,
        summary.join(", "),
        disagreeing_flows.len(),
        conntrack.len(),
    );
    let paused: Vec<String> = after_pauses
        .iter()
        .map(|(s, n)| format!("{n} {s}"))
        .collect();
    println!(
        "after a pause of {PAUSE:?} (timeouts of {SHORT_TIMEOUT} s), the kernel said: {}",
        paused.join(", ")
    );
    for state in ["new", "established", "related", "invalid", "untracked"] {
        assert!(
            matched.get(state).copied().unwrap_or(0) + mismatched_packets > 0,
            "seed {seed}: no packet was {state}: the generator does not reach it"
        );
    }
    if !disagreeing_flows.is_empty() {
        let kinds: Vec<String> = mismatch_kinds
            .iter()
            .map(|(kind, n)| format!("  {n} × {kind}"))
            .collect();
        let shown: Vec<&str> = mismatching.iter().map(|(_, text)| text.as_str()).collect();
        panic!(
            "seed {seed}: fibre and the kernel disagree on {mismatched_packets} of {sent} \
             packets, in {} flows. The first packet of each flow that disagrees, by kind:\n{}\n\n\
             The first {} flows in full:\n\n{}",
            disagreeing_flows.len(),
            kinds.join("\n"),
            shown.len(),
            shown.join("\n"),
        );
    }
}

/// The generator alone, without the kernel (no root needed): every packet it writes is
/// an IP packet that fits a frame, with a right IPv4 header checksum; and what fibre
/// makes of a run reaches every state, so that the comparison with the kernel can.
#[test]
fn the_generator_writes_packets_that_reach_every_state() {
    let mut rng = StdRng::seed_from_u64(7);
    let mut conntrack = Conntrack::new(Settings::kernel_defaults());
    let mut states: BTreeMap<String, usize> = BTreeMap::new();
    let mut sent = 0u64;
    for k in 0..2_000 {
        for packet in random_flow(&mut rng, k).packets {
            let mut ip = packet.ip;
            assert!(ip.len() <= 1500, "{} bytes: {}", ip.len(), packet.what);
            set_tag(&mut ip, sent as u32);
            if ip[0] >> 4 == 4 {
                let header = usize::from(ip[0] & 0xf) * 4;
                assert_eq!(checksum(0, &ip[..header]), 0, "{}", describe(&ip));
                assert_eq!(usize::from(u16::from_be_bytes([ip[2], ip[3]])), ip.len());
            } else {
                assert_eq!(
                    usize::from(u16::from_be_bytes([ip[4], ip[5]])) + 40,
                    ip.len()
                );
            }
            assert!(!describe(&ip).is_empty());
            let tracked = conntrack.track(&ip, sent * 1_000, true);
            conntrack.confirm(&tracked);
            *states
                .entry(fibre_verdict(&tracked).to_string())
                .or_default() += 1;
            sent += 1;
        }
    }
    println!("{sent} packets: {states:?}");
    for state in ["new", "established", "related", "invalid", "untracked"] {
        assert!(states.contains_key(state), "no packet {state}: {states:?}");
    }
}
