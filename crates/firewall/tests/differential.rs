//! fibre's stateless filter evaluator ([`fibre_firewall::Filter`]) against the Linux
//! kernel itself, as root.
//!
//! The evaluator claims to decide a forwarded packet as the kernel's `nft_do_chain`
//! decides it at the prerouting, forward and postrouting hooks. Unit tests can only
//! check that claim against what their author believes the kernel does; this test asks
//! the kernel. Three network namespaces make a router: the sender (veth `a0`), the
//! router (`ra` towards the sender, `rb` towards the receiver, forwarding on) and the
//! receiver (`b0`). Each round loads a random ruleset into the router with `nft -f`
//! (tables `ip`, `ip6` and `inet`; base chains of type filter at the three hooks and
//! others; regular chains reached by `jump` and `goto`; rules made only of what fibre
//! compiles: payload, meta, cmp, bitwise, byteorder, range, lookup, immediate and
//! counter), mirrors it from the kernel's dump the way fibre does, checks that fibre
//! compiles every base chain a forwarded packet meets, and injects thousands of random
//! IPv4 and IPv6 frames on `a0` with a packet socket. Every frame carries a tag at the
//! end of its payload; a packet socket on `b0` sees which came out of the router. For
//! each packet, whether the kernel forwarded it must equal fibre's
//! `prerouting(frame, ra) && forwarding(frame, ra -> rb)` on the mirrored ruleset.
//!
//! What the rules hold:
//! - the network and transport headers (`payload`, with `bitwise` masks, `cmp` of every
//!   order, `range`), later fragments included;
//! - the link layer as received, which the forward and postrouting hooks still see:
//!   `ether saddr` (frames come from three source addresses), `ether daddr`,
//!   `ether type`, raw `@ll` loads, some running on into the IP header (its time to
//!   live and checksum as taken down), and the link-layer dependency `nft` gives an
//!   `ip` or `ip6` match after `meta iiftype ether` in an `inet` table;
//! - the metadata: length, protocols, mark, the links' indexes, names, types and groups,
//!   packet type; orders and ranges on those held in host order, which `nft` turns
//!   with `byteorder`, and masks on them;
//! - sets (`lookup`): anonymous and named ones declared in the table, of addresses,
//!   ports, protocols, lengths, hops, names, groups, links, link addresses, ICMP types,
//!   TCP flags and more, plain (hash), of intervals (prefixes, ranges, wildcard names)
//!   and concatenations of two or three fields, inverted at times, with the catch-all
//!   element at times; and verdict maps, anonymous and named, whose elements accept,
//!   drop, continue, return, jump or go to a regular chain, the catch-all's too.
//!   Elements are drawn from the values the packets carry, many from a random packet's
//!   own fields (so that concatenations match too), so that lookups both hit and miss.
//!
//! `immediate` is only ever a verdict here: `nft` writes data into a register with it
//! only for statements (`meta mark set`, `snat to`), which fibre does not compile.
//! What the test found and the generator leaves out until fibre changes is behind
//! [`CONCATENATED_RANGES`] and [`INVERTED_CATCHALL`].
//!
//! Frames lost below IP (a full backlog, a full socket buffer) would look like frames
//! the firewall dropped, so the test counts those losses and fails on any. The random
//! seed is printed; `FIBRE_SEED=N` replays a run.

use fibre_firewall::nfnetlink::dump;
use fibre_firewall::Ruleset;
use fibre_firewall::{Filter, Link, Packet, Program};
use fibre_testbed::netns::Namespace;
use fibre_testbed::wire::{self, in_namespace, ETHERNET_HEADER};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Rulesets tried in a run.
const ROUNDS: usize = 100;
/// Packets sent through each ruleset.
const PACKETS_PER_ROUND: usize = 5_000;
/// How long the receiving socket must stay empty, once the last frame is sent, before
/// the round's arrivals are taken as complete. A frame sent on a veth from a packet
/// socket is normally forwarded and delivered before `send` returns.
const QUIET: Duration = Duration::from_millis(50);
/// The receiving socket's buffer: far more than a round's frames take.
const CAPTURE_BUFFER: usize = 256 << 20;
/// What precedes each packet's tag, at the very end of its IP packet.
const TAG_MARK: [u8; 4] = *b"fbDT";
/// Whether to send fragments other than the first (IPv4 fragment offset not 0, or an
/// IPv6 fragment header with one). The kernel's fast path for payload loads of 1, 2 or 4
/// aligned bytes (`nft_payload_fast_eval`) reads a later fragment's "transport header"
/// where the slow path (`nft_payload_eval`) breaks the rule, and for IPv6 reads it at
/// offset 0, the IPv6 header itself (`ipv6_find_hdr` leaves the offset unset for a
/// later fragment): this test found it, and holds fibre to it.
const SEND_LATER_FRAGMENTS: bool = true;
/// `ARPHRD_ETHER`: a veth's link type.
const ETHER: u16 = 1;

const SENDER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x0a, 0x00];
/// The source addresses of the frames sent: the sender's own, and two more it may as
/// well have (the router forwards from any), so that rules on the link layer's source
/// tell packets apart.
const SOURCE_MACS: [[u8; 6]; 3] = [
    SENDER_MAC,
    [0x02, 0, 0, 0, 0x0a, 0x02],
    [0x02, 0, 0, 0, 0x0a, 0x03],
];
const ROUTER_IN_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x0a, 0x01];
const ROUTER_OUT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x0b, 0x01];
const RECEIVER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x0b, 0x00];
/// The groups of the router's links (`meta iifgroup`, `oifgroup`), not the default 0 so
/// that a rule can tell them apart.
const ROUTER_IN_GROUP: u32 = 3;
const ROUTER_OUT_GROUP: u32 = 7;

fn mac(m: [u8; 6]) -> String {
    m.map(|b| format!("{b:02x}")).join(":")
}

/// The three namespaces and what the test needs to know of their links.
struct Topology {
    sender: Namespace,
    router: Namespace,
    receiver: Namespace,
    /// `a0`'s index in the sender's namespace.
    sender_link: u32,
    /// `ra`'s and `rb`'s indexes in the router's namespace.
    router_in: u32,
    router_out: u32,
    /// `b0`'s index in the receiver's namespace.
    receiver_link: u32,
}

impl Topology {
    fn build() -> Topology {
        let sender = Namespace::create("diff-a").expect("a namespace (as root)");
        let router = Namespace::create("diff-r").expect("a namespace");
        let receiver = Namespace::create("diff-b").expect("a namespace");
        router
            .batch(&format!(
                "link set lo up\n\
                 link add ra address {} type veth peer name a0 address {} netns {}\n\
                 link add rb address {} type veth peer name b0 address {} netns {}\n\
                 link set ra group {ROUTER_IN_GROUP} up\n\
                 link set rb group {ROUTER_OUT_GROUP} up\n",
                mac(ROUTER_IN_MAC),
                mac(SENDER_MAC),
                sender.name(),
                mac(ROUTER_OUT_MAC),
                mac(RECEIVER_MAC),
                receiver.name(),
            ))
            .expect("the router's links");
        sender
            .batch("link set lo up\nlink set a0 up\n")
            .expect("the sender's link");
        receiver
            .batch("link set lo up\nlink set b0 up\n")
            .expect("the receiver's link");
        for sysctl in ["net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"] {
            router.sysctl(sysctl, "1").expect("forwarding on");
        }
        for link in ["all", "default", "ra", "rb"] {
            router
                .sysctl(&format!("net.ipv4.conf.{link}.rp_filter"), "0")
                .expect("no reverse path filter");
        }
        let up = Duration::from_secs(10);
        sender.wait_up(&["a0"], up).expect("a0 up");
        router.wait_up(&["ra", "rb"], up).expect("ra and rb up");
        receiver.wait_up(&["b0"], up).expect("b0 up");
        sender
            .batch(
                "addr add 10.1.0.2/16 dev a0\n\
                 addr add fd01::2/64 dev a0 nodad\n",
            )
            .expect("the sender's addresses");
        receiver
            .batch(
                "addr add 10.2.0.2/24 dev b0\n\
                 addr add fd02::2/64 dev b0 nodad\n",
            )
            .expect("the receiver's addresses");
        let receiver_mac = mac(RECEIVER_MAC);
        router
            .batch(&format!(
                "addr add 10.1.0.1/16 dev ra\n\
                 addr add fd01::1/64 dev ra nodad\n\
                 addr add 10.2.0.1/24 dev rb\n\
                 addr add fd02::1/64 dev rb nodad\n\
                 neigh replace 10.2.0.2 lladdr {receiver_mac} dev rb nud permanent\n\
                 neigh replace fd02::2 lladdr {receiver_mac} dev rb nud permanent\n\
                 route add 10.3.0.0/16 via 10.2.0.2 dev rb\n\
                 route add fd03::/64 via fd02::2 dev rb\n",
            ))
            .expect("the router's addresses, neighbours and routes");
        Topology {
            sender_link: sender.ifindex("a0").expect("a0's index"),
            router_in: router.ifindex("ra").expect("ra's index"),
            router_out: router.ifindex("rb").expect("rb's index"),
            receiver_link: receiver.ifindex("b0").expect("b0's index"),
            sender,
            router,
            receiver,
        }
    }

    fn router_in(&self) -> Link<'static> {
        Link {
            index: self.router_in,
            name: "ra",
            kind: ETHER,
            group: ROUTER_IN_GROUP,
        }
    }

    fn router_out(&self) -> Link<'static> {
        Link {
            index: self.router_out,
            name: "rb",
            kind: ETHER,
            group: ROUTER_OUT_GROUP,
        }
    }

    /// Frames dropped so far below IP on the way (a veth's full peer, a CPU's full
    /// backlog): any would pass for a frame the firewall dropped.
    fn frames_lost_below_ip(&self) -> u64 {
        let drops = |ns: &Namespace, link: &str| {
            wire::link_drops(ns, link).expect("a link's dropped frames")
        };
        drops(&self.sender, "a0")
            + drops(&self.router, "ra")
            + drops(&self.router, "rb")
            + drops(&self.receiver, "b0")
            + wire::backlog_drops().expect("the backlogs' drops")
    }
}

/// The tag and IP packet of one of the test's frames, `None` for any other frame (the
/// router's and receiver's own neighbour discovery and such).
fn tagged(frame: &[u8]) -> Option<(u32, &[u8])> {
    let ip = wire::ip_packet(frame)?;
    let trailer = ip.get(ip.len().checked_sub(8)?..)?;
    (trailer[..4] == TAG_MARK).then(|| {
        (
            u32::from_be_bytes([trailer[4], trailer[5], trailer[6], trailer[7]]),
            ip,
        )
    })
}

/// Reads the frames arriving on `socket` until `sender_done` is set and then a read
/// waited [`QUIET`] for nothing: the IP packets of the test's frames, by tag.
fn receive_until_quiet(socket: &OwnedFd, sender_done: &AtomicBool) -> HashMap<u32, Vec<u8>> {
    let mut arrived = HashMap::new();
    let mut buffer = vec![0u8; 1 << 16];
    loop {
        let done_before_reading = sender_done.load(Ordering::Acquire);
        let Some(frame) = wire::receive(socket, &mut buffer).expect("receiving") else {
            if done_before_reading {
                return arrived;
            }
            continue;
        };
        // The receiver's own frames, going out.
        if frame.outgoing {
            continue;
        }
        if let Some((tag, ip)) = tagged(&buffer[..frame.len]) {
            let again = arrived.insert(tag, ip.to_vec());
            assert!(again.is_none(), "the frame tagged {tag} arrived twice");
        }
    }
}

/// One packet to send: its tag and its whole frame.
struct Probe {
    tag: u32,
    frame: Vec<u8>,
    /// The IP packet's length, without the frame's padding.
    ip_len: usize,
}

impl Probe {
    /// From the IP header on, padding included, as fibre's packet path holds it.
    fn ip(&self) -> &[u8] {
        &self.frame[ETHERNET_HEADER..]
    }
}

fn pick<T: Copy>(rng: &mut StdRng, choices: &[T]) -> T {
    choices[rng.gen_range(0..choices.len())]
}

fn random_bytes(rng: &mut StdRng, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.gen()).collect()
}

/// A time to live or hop limit, at least 2 (one less is an ICMP error, not a verdict):
/// often the values rules name.
fn random_hops(rng: &mut StdRng) -> u8 {
    if rng.gen_bool(0.7) {
        pick(rng, &[2, 3, 4, 5, 63, 64, 65, 127, 128, 254, 255])
    } else {
        rng.gen_range(2..=255)
    }
}

/// A port, often one that rules name.
fn random_port(rng: &mut StdRng) -> u16 {
    match rng.gen_range(0..4) {
        0 => pick(rng, &[22, 53, 80, 123, 443, 1000, 2000]),
        1 => rng.gen_range(1000..=3000),
        2 => rng.gen_range(30000..=40000),
        _ => rng.gen(),
    }
}

/// DSCP and ECN: a traffic class or type of service.
fn random_traffic_class(rng: &mut StdRng) -> u8 {
    let dscp = if rng.gen_bool(0.7) {
        pick(rng, &[0, 0x08, 0x10, 0x2e])
    } else {
        rng.gen_range(0..64)
    };
    dscp << 2 | rng.gen_range(0..4)
}

/// A transport protocol and its header and payload, the tag last: UDP, TCP, ICMP (or
/// ICMPv6) of many types, or another protocol's bytes.
fn random_transport(rng: &mut StdRng, v6: bool, tag: u32) -> (u8, Vec<u8>) {
    let payload_len = if rng.gen_bool(0.1) {
        rng.gen_range(0..=1200)
    } else {
        rng.gen_range(0..=200)
    };
    let mut payload = random_bytes(rng, payload_len);
    payload.extend(TAG_MARK);
    payload.extend(tag.to_be_bytes());
    let mut header = Vec::new();
    let protocol = match rng.gen_range(0..10) {
        0..=2 => {
            header.extend(random_port(rng).to_be_bytes());
            header.extend(random_port(rng).to_be_bytes());
            header.extend(((8 + payload.len()) as u16).to_be_bytes());
            header.extend(rng.gen::<u16>().to_be_bytes());
            17
        }
        3..=5 => {
            let options = if rng.gen_bool(0.2) { 4 } else { 0 };
            header.extend(random_port(rng).to_be_bytes());
            header.extend(random_port(rng).to_be_bytes());
            header.extend(rng.gen::<u32>().to_be_bytes());
            header.extend(rng.gen::<u32>().to_be_bytes());
            header.push((((20 + options) / 4) << 4) as u8);
            header.push(if rng.gen_bool(0.8) {
                pick(rng, &[0x02, 0x12, 0x10, 0x11, 0x04, 0x18, 0x14, 0x29])
            } else {
                rng.gen()
            });
            header.extend(rng.gen::<u16>().to_be_bytes());
            header.extend(rng.gen::<u16>().to_be_bytes());
            header.extend([0, 0]);
            header.extend(std::iter::repeat_n(1, options));
            6
        }
        6..=7 => {
            let kind = match (v6, rng.gen_bool(0.8)) {
                (false, true) => pick(rng, &[0, 8, 3, 11, 13]),
                (true, true) => pick(rng, &[128, 129, 1, 2, 3, 135, 136]),
                _ => rng.gen(),
            };
            header.push(kind);
            header.push(if rng.gen_bool(0.7) {
                0
            } else {
                rng.gen_range(0..5)
            });
            header.extend(rng.gen::<u16>().to_be_bytes());
            header.extend(rng.gen::<u32>().to_be_bytes());
            if v6 {
                58
            } else {
                1
            }
        }
        // GRE, SCTP, an authentication header, no next header: bytes only.
        _ => pick(rng, &[47, 132, 51, 59]),
    };
    header.extend(payload);
    (protocol, header)
}

/// An IPv4 packet from the sender's subnet to the receiver's routes: options,
/// fragments, any type of service, and a valid header checksum.
fn random_ipv4(rng: &mut StdRng, tag: u32) -> Vec<u8> {
    let (protocol, transport) = random_transport(rng, false, tag);
    let options: &[u8] = match rng.gen_range(0..10) {
        0 => &[1, 1, 1, 0],
        1 => &[1, 1, 1, 1, 1, 1, 1, 0],
        _ => &[],
    };
    let header_len = 20 + options.len();
    let total = header_len + transport.len();
    let fragment: u16 = match rng.gen_range(0..20) {
        // A first fragment, more to come.
        0 => 0x2000,
        // A later fragment, last or not.
        1 if SEND_LATER_FRAGMENTS => rng.gen_range(1..=200) | if rng.gen() { 0x2000 } else { 0 },
        // Don't fragment, or not said.
        _ => {
            if rng.gen() {
                0x4000
            } else {
                0
            }
        }
    };
    let mut ip = vec![(0x40 | (header_len / 4)) as u8, random_traffic_class(rng)];
    ip.extend((total as u16).to_be_bytes());
    ip.extend(rng.gen::<u16>().to_be_bytes());
    ip.extend(fragment.to_be_bytes());
    ip.push(random_hops(rng));
    ip.push(protocol);
    ip.extend([0, 0]);
    // Often one of a few hosts, which sets' elements name.
    if rng.gen_bool(0.3) {
        ip.extend([10, 1, rng.gen_range(0..4), rng.gen_range(2..=5)]);
    } else {
        ip.extend([10, 1, rng.gen_range(0..16), rng.gen_range(2..=254)]);
    }
    if rng.gen_bool(0.3) {
        ip.extend([10, 3, rng.gen_range(0..4), rng.gen_range(1..=4)]);
    } else {
        ip.extend([10, 3, rng.gen(), rng.gen_range(1..=254)]);
    }
    ip.extend(options);
    let checksum = internet_checksum(&ip);
    ip[10..12].copy_from_slice(&checksum.to_be_bytes());
    ip.extend(transport);
    ip
}

/// An address of `prefix` (a /64) with a random interface identifier, whose first
/// nibble rules' longer prefixes name, or often one of a few small ones (2 to 5), which
/// sets' elements name.
fn random_ipv6_address(rng: &mut StdRng, prefix: [u8; 8]) -> [u8; 16] {
    let mut address = [0u8; 16];
    address[..8].copy_from_slice(&prefix);
    let host = if rng.gen_bool(0.3) {
        rng.gen_range(2..=5)
    } else {
        rng.gen::<u64>().max(2)
    };
    address[8..].copy_from_slice(&host.to_be_bytes());
    address
}

/// An IPv6 packet from the sender's subnet to the receiver's route, sometimes with
/// hop-by-hop options, destination options or a fragment header before the transport.
fn random_ipv6(rng: &mut StdRng, tag: u32) -> Vec<u8> {
    let (protocol, transport) = random_transport(rng, true, tag);
    // Extension headers, each as (its protocol number, its bytes but the first, which
    // names what follows).
    let padded_options = |len: u8| {
        // PadN, zeros: what a router parsing hop-by-hop options accepts.
        let mut h = vec![len, 1, len * 8 + 4];
        h.extend(std::iter::repeat_n(0, usize::from(len) * 8 + 4));
        h
    };
    let mut extensions: Vec<(u8, Vec<u8>)> = Vec::new();
    match rng.gen_range(0..20) {
        0..=1 => extensions.push((0, padded_options(0))),
        2..=3 => extensions.push((60, padded_options(rng.gen_range(0..=1)))),
        4 => {
            extensions.push((0, padded_options(0)));
            extensions.push((60, padded_options(0)));
        }
        5 => {
            let offset: u16 = if !SEND_LATER_FRAGMENTS || rng.gen() {
                0
            } else {
                rng.gen_range(1..=200)
            };
            let mut h = vec![0];
            h.extend((offset << 3 | u16::from(rng.gen_bool(0.5))).to_be_bytes());
            h.extend(rng.gen::<u32>().to_be_bytes());
            extensions.push((44, h));
        }
        _ => {}
    }
    let payload_len: usize =
        transport.len() + extensions.iter().map(|(_, h)| 1 + h.len()).sum::<usize>();
    let class = random_traffic_class(rng);
    let flow: u32 = if rng.gen() {
        0
    } else {
        rng.gen_range(0..1 << 20)
    };
    let mut ip = (6 << 28 | u32::from(class) << 20 | flow)
        .to_be_bytes()
        .to_vec();
    ip.extend((payload_len as u16).to_be_bytes());
    ip.push(extensions.first().map_or(protocol, |(n, _)| *n));
    ip.push(random_hops(rng));
    ip.extend(random_ipv6_address(rng, [0xfd, 0x01, 0, 0, 0, 0, 0, 0]));
    ip.extend(random_ipv6_address(rng, [0xfd, 0x03, 0, 0, 0, 0, 0, 0]));
    for (k, (_, header)) in extensions.iter().enumerate() {
        ip.push(extensions.get(k + 1).map_or(protocol, |(n, _)| *n));
        ip.extend(header);
    }
    ip.extend(transport);
    ip
}

/// A frame to the router of a random packet of either family tagged `tag`, sometimes
/// with padding after the IP packet.
fn random_probe(rng: &mut StdRng, tag: u32) -> Probe {
    let v6 = rng.gen();
    let ip = if v6 {
        random_ipv6(rng, tag)
    } else {
        random_ipv4(rng, tag)
    };
    let mut frame = ROUTER_IN_MAC.to_vec();
    frame.extend(pick(rng, &SOURCE_MACS));
    frame.extend(if v6 { [0x86, 0xdd] } else { [0x08, 0x00] });
    let ip_len = ip.len();
    frame.extend(ip);
    if rng.gen_bool(0.1) {
        let padding = rng.gen_range(1..=16);
        frame.extend(random_bytes(rng, padding));
    }
    Probe { tag, frame, ip_len }
}

fn internet_checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Whether sets and maps may hold the catch-all element `*` (nft 1.0.6 and the kernel
/// take it in named and anonymous sets and maps alike).
const CATCHALL: bool = true;

/// Whether sets of concatenations may hold ranges (or be declared with `flags
/// interval`: the kernel's `nft_set_pipapo`, whose elements each carry a key and a last
/// key). This test found fibre's mirror reading an element's last key from attribute 9
/// (`NFTA_SET_ELEM_OBJREF`) rather than 10 (`NFTA_SET_ELEM_KEY_END`), and holds it to
/// the kernel.
const CONCATENATED_RANGES: bool = true;

/// Whether an inverted lookup (`!= @set`, `!= { ... }`) may be in a set that holds the
/// catch-all element. The kernel (with "netfilter: nft_lookup: fix catchall element
/// handling with inverted lookups", as Linux 6.18 has it) takes the catch-all for a
/// match before inverting, so that such a lookup never matches; this test found fibre
/// inverting first, and holds it to the kernel.
const INVERTED_CATCHALL: bool = true;

/// What the values of a set's key field are: each names the values packets carry, so
/// that elements match often and miss often.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Domain {
    Ipv4Source,
    Ipv4Destination,
    Ipv6Source,
    Ipv6Destination,
    Port,
    Protocol,
    Hops,
    /// `meta length` (host order) and `ip length`.
    Length,
    Mark,
    Ifname,
    Group,
    /// A link by index, named.
    Link,
    Mac,
    EtherType,
    Pkttype,
    Nfproto,
    Dscp,
    IcmpType,
    Icmpv6Type,
    TcpFlags,
}

/// A field a set's key may hold: how `nft` writes it, the network protocol it belongs
/// to (4, 6, or either), and its values.
struct KeyField {
    expr: &'static str,
    network: Option<u8>,
    domain: Domain,
}

const fn field(expr: &'static str, network: Option<u8>, domain: Domain) -> KeyField {
    KeyField {
        expr,
        network,
        domain,
    }
}

/// The fields of sets' and maps' keys (the addresses and the link layer's source twice:
/// they tell packets apart best).
const KEY_FIELDS: &[KeyField] = &[
    field("ip saddr", Some(4), Domain::Ipv4Source),
    field("ip saddr", Some(4), Domain::Ipv4Source),
    field("ip daddr", Some(4), Domain::Ipv4Destination),
    field("ip daddr", Some(4), Domain::Ipv4Destination),
    field("ip6 saddr", Some(6), Domain::Ipv6Source),
    field("ip6 saddr", Some(6), Domain::Ipv6Source),
    field("ip6 daddr", Some(6), Domain::Ipv6Destination),
    field("ip6 daddr", Some(6), Domain::Ipv6Destination),
    field("tcp dport", None, Domain::Port),
    field("tcp sport", None, Domain::Port),
    field("udp dport", None, Domain::Port),
    field("udp sport", None, Domain::Port),
    field("th dport", None, Domain::Port),
    field("th sport", None, Domain::Port),
    field("meta l4proto", None, Domain::Protocol),
    field("ip protocol", Some(4), Domain::Protocol),
    field("ip6 nexthdr", Some(6), Domain::Protocol),
    field("ip ttl", Some(4), Domain::Hops),
    field("ip6 hoplimit", Some(6), Domain::Hops),
    field("meta length", None, Domain::Length),
    field("ip length", Some(4), Domain::Length),
    field("meta mark", None, Domain::Mark),
    field("iifname", None, Domain::Ifname),
    field("oifname", None, Domain::Ifname),
    field("meta iifgroup", None, Domain::Group),
    field("meta oifgroup", None, Domain::Group),
    field("meta iif", None, Domain::Link),
    field("meta oif", None, Domain::Link),
    field("ether saddr", None, Domain::Mac),
    field("ether saddr", None, Domain::Mac),
    field("ether daddr", None, Domain::Mac),
    field("ether type", None, Domain::EtherType),
    field("meta protocol", None, Domain::EtherType),
    field("meta pkttype", None, Domain::Pkttype),
    field("meta nfproto", None, Domain::Nfproto),
    field("ip dscp", Some(4), Domain::Dscp),
    field("ip6 dscp", Some(6), Domain::Dscp),
    field("icmp type", Some(4), Domain::IcmpType),
    field("icmpv6 type", Some(6), Domain::Icmpv6Type),
    field("tcp flags", None, Domain::TcpFlags),
];

impl Domain {
    /// Whether one element of the domain leaves out most of its family's packets, so
    /// that a map may drop on it: not the links, the packet type, the mark or the
    /// family, which all packets share; not lengths and hops, whose ranges are wide.
    fn narrow(self) -> bool {
        !matches!(
            self,
            Domain::Hops
                | Domain::Length
                | Domain::Mark
                | Domain::Ifname
                | Domain::Group
                | Domain::Link
                | Domain::EtherType
                | Domain::Pkttype
                | Domain::Nfproto
        )
    }

    /// Whether a named set may key on it: `typeof ip dscp` makes `nft` shift the field
    /// into place (a `bitwise` of `NFT_BITWISE_RSHIFT`), which fibre does not claim;
    /// anonymous sets of it only mask it. (In a concatenation, anonymous too, `nft`
    /// shifts it, and it also writes every element's field as `cs0`: never there.)
    fn named(self) -> bool {
        self != Domain::Dscp
    }
}

/// An element's field as `nft` writes it, with the first and last keys it covers as
/// numbers (any one order within a domain will do: only overlaps are told from them).
struct Span {
    text: String,
    first: u128,
    last: u128,
}

impl Span {
    /// The same span, its text written by `text` from its number.
    fn with(self, text: fn(u128) -> String) -> Span {
        Span {
            text: text(self.first),
            ..self
        }
    }
}

fn point(text: String, value: u128) -> Span {
    Span {
        text,
        first: value,
        last: value,
    }
}

fn v4(address: [u8; 4]) -> u128 {
    u128::from(u32::from_be_bytes(address))
}

fn v4_text(n: u128) -> String {
    std::net::Ipv4Addr::from(n as u32).to_string()
}

fn v6_text(n: u128) -> String {
    std::net::Ipv6Addr::from(n).to_string()
}

/// A name as a number: its bytes, zero-padded to the 16 of an interface's name.
fn name_number(name: &str, fill: u8) -> u128 {
    let mut b = [fill; 16];
    b[..name.len()].copy_from_slice(name.as_bytes());
    u128::from_be_bytes(b)
}

/// A value, or a range of them, of `low..=high`, as numbers: a range only if `ranges`.
fn numbers(rng: &mut StdRng, ranges: bool, points: &[u32], low: u32, high: u32) -> Span {
    if ranges && rng.gen_bool(0.4) {
        let a = if rng.gen() {
            pick(rng, points)
        } else {
            rng.gen_range(low..=high)
        };
        let b = rng.gen_range(a..=high.min(a.saturating_add((high - low) / 4 + 1)));
        if a < b {
            return Span {
                text: format!("{a}-{b}"),
                first: a.into(),
                last: b.into(),
            };
        }
    }
    let n = if rng.gen_bool(0.7) {
        pick(rng, points)
    } else {
        rng.gen_range(low..=high)
    };
    point(n.to_string(), n.into())
}

/// A symbol of `named` (its text, its number).
fn symbol(rng: &mut StdRng, named: &[(&str, u32)]) -> Span {
    let (text, n) = pick(rng, named);
    point(text.to_string(), n.into())
}

/// A random element field of `domain`, from the values packets carry; a prefix or a
/// range only if `ranges`.
fn random_span(rng: &mut StdRng, domain: Domain, ranges: bool) -> Span {
    let range = ranges && rng.gen_bool(0.5);
    match domain {
        Domain::Ipv4Source | Domain::Ipv4Destination => {
            let (second, few, hosts) = if domain == Domain::Ipv4Source {
                (1, 16, 2..=5)
            } else {
                (3, 255, 1..=4)
            };
            let host = |rng: &mut StdRng| {
                if rng.gen_bool(0.7) {
                    v4([
                        10,
                        second,
                        rng.gen_range(0..4),
                        rng.gen_range(hosts.clone()),
                    ])
                } else {
                    v4([10, second, rng.gen_range(0..=few), rng.gen()])
                }
            };
            if !range {
                let a = host(rng);
                return point(v4_text(a), a);
            }
            if rng.gen() {
                let len = pick(rng, &[20, 22, 24, 24, 28, 30]);
                let a = host(rng) & !((1u128 << (32 - len)) - 1);
                Span {
                    text: format!("{}/{len}", v4_text(a)),
                    first: a,
                    last: a | ((1 << (32 - len)) - 1),
                }
            } else {
                let (a, b) = (host(rng), host(rng));
                let (a, b) = (a.min(b), a.max(b));
                Span {
                    text: format!("{}-{}", v4_text(a), v4_text(b)),
                    first: a,
                    last: b,
                }
            }
        }
        Domain::Ipv6Source | Domain::Ipv6Destination => {
            let prefix: u128 = if domain == Domain::Ipv6Source {
                0xfd01 << 112
            } else {
                0xfd03 << 112
            };
            if !range {
                let a = prefix | rng.gen_range(2..=5);
                return point(v6_text(a), a);
            }
            match rng.gen_range(0..3) {
                0 => {
                    let len = pick(rng, &[65, 66, 68]);
                    let a = prefix | u128::from(rng.gen_range(0..16u8)) << 60;
                    let a = a & !((1u128 << (128 - len)) - 1);
                    Span {
                        text: format!("{}/{len}", v6_text(a)),
                        first: a,
                        last: a | ((1 << (128 - len)) - 1),
                    }
                }
                1 => Span {
                    text: format!("{}/120", v6_text(prefix)),
                    first: prefix,
                    last: prefix | 0xff,
                },
                _ => {
                    let a = prefix | rng.gen_range(2..=4);
                    let b = prefix | rng.gen_range(3..=5);
                    let (a, b) = (a.min(b), a.max(b));
                    Span {
                        text: format!("{}-{}", v6_text(a), v6_text(b)),
                        first: a,
                        last: b,
                    }
                }
            }
        }
        Domain::Port => numbers(
            rng,
            ranges,
            &[22, 53, 80, 123, 443, 1000, 2000, 30000],
            1,
            u32::from(u16::MAX),
        ),
        Domain::Protocol => {
            if range && rng.gen_bool(0.3) {
                numbers(rng, true, &[1, 6, 17, 47, 58], 0, 140)
            } else {
                symbol(
                    rng,
                    &[
                        ("tcp", 6),
                        ("udp", 17),
                        ("icmp", 1),
                        ("ipv6-icmp", 58),
                        ("47", 47),
                        ("132", 132),
                        ("51", 51),
                        ("59", 59),
                        ("0", 0),
                        ("44", 44),
                        ("60", 60),
                    ],
                )
            }
        }
        Domain::Hops => numbers(
            rng,
            ranges,
            &[1, 2, 3, 4, 62, 63, 64, 126, 127, 253, 254],
            1,
            255,
        ),
        Domain::Length => numbers(rng, ranges, &[48, 60, 100, 128, 200], 20, 400),
        Domain::Mark => numbers(rng, ranges, &[0, 0, 1, 5], 0, 9),
        Domain::Ifname => {
            if range && rng.gen_bool(0.6) {
                let prefix = pick(rng, &["r", "a", "b", "l"]);
                Span {
                    text: format!("\"{prefix}*\""),
                    first: name_number(prefix, 0),
                    last: name_number(prefix, 0xff),
                }
            } else {
                let name = pick(rng, &["ra", "rb", "lo", "a0", "rc"]);
                point(format!("\"{name}\""), name_number(name, 0))
            }
        }
        Domain::Group => numbers(rng, ranges, &[0, 3, 7], 0, 9),
        // By name only: their indexes are the kernel's to give.
        Domain::Link => {
            let name = pick(rng, &["ra", "rb", "lo"]);
            point(format!("\"{name}\""), name_number(name, 0))
        }
        Domain::Mac => {
            let macs = [
                SOURCE_MACS[0],
                SOURCE_MACS[1],
                SOURCE_MACS[2],
                ROUTER_IN_MAC,
                RECEIVER_MAC,
            ];
            let number = |m: [u8; 6]| m.iter().fold(0u128, |n, &b| n << 8 | u128::from(b));
            if range && rng.gen_bool(0.3) {
                let (a, b) = (pick(rng, &macs), pick(rng, &macs));
                let (a, b) = if number(a) <= number(b) {
                    (a, b)
                } else {
                    (b, a)
                };
                if a != b {
                    return Span {
                        text: format!("{}-{}", mac(a), mac(b)),
                        first: number(a),
                        last: number(b),
                    };
                }
            }
            let m = pick(rng, &macs);
            point(mac(m), number(m))
        }
        Domain::EtherType => symbol(
            rng,
            &[
                ("ip", 0x0800),
                ("ip6", 0x86dd),
                ("arp", 0x0806),
                ("vlan", 0x8100),
            ],
        ),
        Domain::Pkttype => symbol(
            rng,
            &[
                ("host", 0),
                ("broadcast", 1),
                ("multicast", 2),
                ("other", 3),
            ],
        ),
        Domain::Nfproto => symbol(rng, &[("ipv4", 2), ("ipv6", 10)]),
        Domain::Dscp => symbol(
            rng,
            &[
                ("cs0", 0),
                ("cs1", 8),
                ("cs2", 16),
                ("ef", 46),
                ("af11", 10),
            ],
        ),
        Domain::IcmpType => {
            if range && rng.gen_bool(0.3) {
                numbers(rng, true, &[0, 3, 8], 0, 20)
            } else {
                symbol(
                    rng,
                    &[
                        ("echo-reply", 0),
                        ("destination-unreachable", 3),
                        ("echo-request", 8),
                        ("time-exceeded", 11),
                        ("timestamp-request", 13),
                    ],
                )
            }
        }
        Domain::Icmpv6Type => {
            if range && rng.gen_bool(0.3) {
                numbers(rng, true, &[1, 128, 135], 0, 140)
            } else {
                symbol(
                    rng,
                    &[
                        ("destination-unreachable", 1),
                        ("packet-too-big", 2),
                        ("time-exceeded", 3),
                        ("echo-request", 128),
                        ("echo-reply", 129),
                        ("nd-neighbor-solicit", 135),
                        ("nd-neighbor-advert", 136),
                    ],
                )
            }
        }
        Domain::TcpFlags => {
            let f: u8 = pick(rng, &[0x02, 0x12, 0x10, 0x11, 0x04, 0x18, 0x14, 0x29]);
            point(format!("{f:#04x}"), f.into())
        }
    }
}

/// What a frame (of [`random_probe`]'s) carries in the field `expr` names, as an
/// element's span: what the router sees of it at some hook (the time to live as it
/// arrives or taken down), if the frame has the field.
fn span_of_frame(rng: &mut StdRng, frame: &[u8], expr: &str) -> Option<Span> {
    let ip = &frame[ETHERNET_HEADER..];
    let v6 = ip[0] >> 4 == 6;
    let number = |n: u128| point(n.to_string(), n);
    let name = |n: &str| point(format!("\"{n}\""), name_number(n, 0));
    let mac_span = |m: &[u8]| {
        let m: [u8; 6] = m.try_into().expect("six bytes");
        point(mac(m), m.iter().fold(0, |n, &b| n << 8 | u128::from(b)))
    };
    // The transport protocol and header, as the kernel finds them (none in a later
    // fragment).
    let transport: Option<(u8, &[u8])> = if v6 {
        let (mut next, mut at) = (ip[6], 40);
        loop {
            match next {
                0 | 60 => {
                    next = ip[at];
                    at += (usize::from(ip[at + 1]) + 1) * 8;
                }
                44 if u16::from_be_bytes([ip[at + 2], ip[at + 3]]) & !7 == 0 => {
                    next = ip[at];
                    at += 8;
                }
                44 => break None,
                _ => break Some((next, &ip[at..])),
            }
        }
    } else {
        let fragment = u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff;
        (fragment == 0).then(|| (ip[9], &ip[usize::from(ip[0] & 0xf) * 4..]))
    };
    let port = |at: usize, protocol: Option<u8>| {
        let (p, h) = transport?;
        (protocol.is_none_or(|q| q == p) && matches!(p, 6 | 17))
            .then(|| number(u16::from_be_bytes([h[at], h[at + 1]]).into()))
    };
    Some(match expr {
        "ip saddr" if !v6 => number(v4(ip[12..16].try_into().ok()?)).with(v4_text),
        "ip daddr" if !v6 => number(v4(ip[16..20].try_into().ok()?)).with(v4_text),
        "ip6 saddr" if v6 => number(u128::from_be_bytes(ip[8..24].try_into().ok()?)).with(v6_text),
        "ip6 daddr" if v6 => number(u128::from_be_bytes(ip[24..40].try_into().ok()?)).with(v6_text),
        "tcp dport" => port(2, Some(6))?,
        "tcp sport" => port(0, Some(6))?,
        "udp dport" => port(2, Some(17))?,
        "udp sport" => port(0, Some(17))?,
        "th dport" => port(2, None)?,
        "th sport" => port(0, None)?,
        "meta l4proto" => number(transport?.0.into()),
        "ip protocol" if !v6 => number(ip[9].into()),
        "ip6 nexthdr" if v6 => number(ip[6].into()),
        "ip ttl" if !v6 => number((ip[8] - u8::from(rng.gen_bool(0.5))).into()),
        "ip6 hoplimit" if v6 => number((ip[7] - u8::from(rng.gen_bool(0.5))).into()),
        "meta length" if v6 => number((40 + u16::from_be_bytes([ip[4], ip[5]])).into()),
        "meta length" | "ip length" if !v6 => number(u16::from_be_bytes([ip[2], ip[3]]).into()),
        "meta mark" => number(0),
        "iifname" | "meta iif" => name("ra"),
        "oifname" | "meta oif" => name("rb"),
        "meta iifgroup" => number(ROUTER_IN_GROUP.into()),
        "meta oifgroup" => number(ROUTER_OUT_GROUP.into()),
        "ether saddr" => mac_span(&frame[6..12]),
        "ether daddr" => mac_span(&frame[..6]),
        "ether type" | "meta protocol" if v6 => point("ip6".into(), 0x86dd),
        "ether type" | "meta protocol" => point("ip".into(), 0x0800),
        "meta pkttype" => point("host".into(), 0),
        "meta nfproto" if v6 => point("ipv6".into(), 10),
        "meta nfproto" => point("ipv4".into(), 2),
        "icmp type" if !v6 => match transport? {
            (1, h) => number(h[0].into()),
            _ => return None,
        },
        "icmpv6 type" if v6 => match transport? {
            (58, h) => number(h[0].into()),
            _ => return None,
        },
        "tcp flags" => match transport? {
            (6, h) => point(format!("{:#04x}", h[13]), h[13].into()),
            _ => return None,
        },
        _ => return None,
    })
}

/// An element of `key` that some random packet matches: each field as the packet
/// carries it (of a few packets tried, the first with every field).
fn packet_element(rng: &mut StdRng, key: &SetKey) -> Option<Element> {
    for _ in 0..20 {
        let probe = random_probe(rng, 0);
        let element: Option<Element> = key
            .fields
            .iter()
            .map(|f| span_of_frame(rng, &probe.frame, f.expr))
            .collect();
        if element.is_some() {
            return element;
        }
    }
    None
}

/// A set's or map's key: one field, or a concatenation of them.
#[derive(Clone)]
struct SetKey {
    fields: Vec<&'static KeyField>,
}

impl SetKey {
    /// As `nft` writes it before `@set`, `{ ... }` or `vmap`.
    fn expr(&self) -> String {
        self.fields
            .iter()
            .map(|f| f.expr)
            .collect::<Vec<_>>()
            .join(" . ")
    }

    /// Whether its sets may hold ranges (see [`CONCATENATED_RANGES`]).
    fn ranges(&self) -> bool {
        self.fields.len() == 1 || CONCATENATED_RANGES
    }

    /// Whether its sets may hold the catch-all element: with it, `nft` shifts a DSCP
    /// field into place (fibre does not claim the shift), and the kernel refuses the
    /// IPv6 one (`EINVAL`).
    fn catchall(&self) -> bool {
        CATCHALL && self.fields.iter().all(|f| f.domain != Domain::Dscp)
    }
}

impl KeyField {
    /// The name of its data type, as `type` declares a named set (`typeof` takes the
    /// field itself): none for plain integers, whose sets only `typeof` declares.
    fn type_name(&self) -> Option<&'static str> {
        Some(match self.expr {
            "ip saddr" | "ip daddr" => "ipv4_addr",
            "ip6 saddr" | "ip6 daddr" => "ipv6_addr",
            "tcp dport" | "tcp sport" | "udp dport" | "udp sport" | "th dport" | "th sport" => {
                "inet_service"
            }
            "meta l4proto" | "ip protocol" | "ip6 nexthdr" => "inet_proto",
            "meta mark" => "mark",
            "iifname" | "oifname" => "ifname",
            "meta iifgroup" | "meta oifgroup" => "devgroup",
            "meta iif" | "meta oif" => "iface_index",
            "ether saddr" | "ether daddr" => "ether_addr",
            "ether type" | "meta protocol" => "ether_type",
            "meta pkttype" => "pkt_type",
            "meta nfproto" => "nf_proto",
            "icmp type" => "icmp_type",
            "icmpv6 type" => "icmpv6_type",
            "tcp flags" => "tcp_flag",
            _ => return None,
        })
    }

    /// Whether a table of `family` may hold it.
    fn fits(&self, family: TableFamily) -> bool {
        match (family, self.network) {
            (TableFamily::Ip, Some(6)) | (TableFamily::Ip6, Some(4)) => false,
            _ => self.expr != "meta nfproto" || family == TableFamily::Inet,
        }
    }

    /// Whether one value of it leaves out most of its family's packets (see
    /// [`Domain::narrow`]; every frame is sent to the router's link address).
    fn narrow(&self) -> bool {
        self.domain.narrow() && self.expr != "ether daddr"
    }
}

/// A random key for a set in a table of `family`: one field mostly, else two or three
/// concatenated, of one network protocol and transport protocol (`nft` refuses
/// `ip saddr . ip6 daddr` and `tcp dport . udp sport`), none of which repeats.
fn random_key(rng: &mut StdRng, family: TableFamily, named: bool) -> SetKey {
    let count = match rng.gen_range(0..10) {
        0..=5 => 1,
        6..=8 => 2,
        _ => 3,
    };
    loop {
        let mut context = ProtocolContext::of(family);
        let mut fields: Vec<&'static KeyField> = Vec::new();
        for _ in 0..count * 4 {
            if fields.len() == count {
                break;
            }
            let f = &KEY_FIELDS[rng.gen_range(0..KEY_FIELDS.len())];
            if f.fits(family)
                && (!named || f.domain.named())
                && (count == 1 || f.domain != Domain::Dscp)
                && !fields.iter().any(|g| g.expr == f.expr)
                && context.admits_one(&format!("{} {{set}}", f.expr))
            {
                fields.push(f);
            }
        }
        if !fields.is_empty() {
            return SetKey { fields };
        }
    }
}

/// One element of a key: each field's span.
type Element = Vec<Span>;

/// Whether two elements share a key: every field's spans overlap.
fn overlap(a: &Element, b: &Element) -> bool {
    a.iter()
        .zip(b)
        .all(|(x, y)| x.first <= y.last && y.first <= x.last)
}

/// Up to `count` elements of `key` that share no key (`nft` refuses overlapping
/// intervals; elements that overlap would leave which one matches to the backend), as
/// `nft` writes them, each with whether it leaves out most packets (one value of a
/// narrow field), so that a map may drop on it.
fn random_elements(
    rng: &mut StdRng,
    key: &SetKey,
    ranges: bool,
    count: usize,
) -> Vec<(String, bool)> {
    let mut chosen: Vec<Element> = Vec::new();
    for _ in 0..count * 4 {
        if chosen.len() == count {
            break;
        }
        // Often what a packet carries, so that concatenations match too.
        let from_packet = rng.gen_bool(if key.fields.len() > 1 { 0.6 } else { 0.2 });
        let e: Element = match from_packet.then(|| packet_element(rng, key)).flatten() {
            Some(e) => e,
            None => key
                .fields
                .iter()
                .map(|f| random_span(rng, f.domain, ranges))
                .collect(),
        };
        if !chosen.iter().any(|c| overlap(c, &e)) {
            chosen.push(e);
        }
    }
    chosen
        .iter()
        .map(|e| {
            let text = e
                .iter()
                .map(|s| s.text.as_str())
                .collect::<Vec<_>>()
                .join(" . ");
            let narrow = key
                .fields
                .iter()
                .zip(e)
                .any(|(f, s)| f.narrow() && s.first == s.last);
            (text, narrow)
        })
        .collect()
}

/// A verdict map's elements: each of `elements` with a verdict (one drop at most, on a
/// narrow element, so that a map drops few packets), and at times the catch-all (never
/// a drop); with the chains they jump or go to, of `targets`.
fn verdict_elements(
    rng: &mut StdRng,
    elements: Vec<(String, bool)>,
    targets: &[String],
    catchall: bool,
) -> (Vec<String>, Vec<String>) {
    let mut dropped = false;
    let mut jumps = Vec::new();
    let mut out = Vec::new();
    let catchall = catchall.then(|| ("*".to_string(), false));
    for (e, narrow) in elements.into_iter().chain(catchall) {
        let v = map_verdict(rng, targets, narrow && !dropped);
        dropped |= v == "drop";
        if let Some(chain) = v.split_whitespace().nth(1) {
            jumps.push(chain.to_string());
        }
        out.push(format!("{e} : {v}"));
    }
    (out, jumps)
}

/// A verdict for a map's element: mostly accept, continue or a jump; a drop only where
/// `drops`; a jump or goto to one of `targets`.
fn map_verdict(rng: &mut StdRng, targets: &[String], drops: bool) -> String {
    loop {
        let v = match rng.gen_range(0..12) {
            0..=2 => "accept".to_string(),
            3..=4 if drops => "drop".to_string(),
            5 => "continue".to_string(),
            6 => "return".to_string(),
            7..=9 if !targets.is_empty() => format!("jump {}", pick_name(rng, targets)),
            10..=11 if !targets.is_empty() => format!("goto {}", pick_name(rng, targets)),
            _ => continue,
        };
        return v;
    }
}

fn pick_name(rng: &mut StdRng, names: &[String]) -> String {
    names[rng.gen_range(0..names.len())].clone()
}

/// A named set or map of a table.
struct NamedSet {
    name: String,
    key: SetKey,
    /// A verdict map's chains, those its elements jump or go to.
    targets: Vec<String>,
    map: bool,
    /// Whether it holds the catch-all element.
    catchall: bool,
}

/// A named set (`s{n}`) or verdict map (`m{n}`) for a table of `family` whose regular
/// chains are `regular`: its declaration, and what rules need to know of it.
fn random_named_set(
    rng: &mut StdRng,
    family: TableFamily,
    n: usize,
    map: bool,
    regular: &[String],
) -> (String, NamedSet) {
    let key = random_key(rng, family, true);
    let interval = rng.gen_bool(0.5) && key.ranges();
    let count = rng.gen_range(1..=6);
    let elements = random_elements(rng, &key, interval, count);
    let catchall = key.catchall() && rng.gen_bool(if map { 0.3 } else { 0.15 });
    // A map jumps to the chains from some one on, so that the chains before it may
    // look it up without a loop.
    let first = rng.gen_range(0..=regular.len());
    let (elements, targets) = if map {
        verdict_elements(rng, elements, &regular[first..], catchall)
    } else {
        let mut plain: Vec<String> = elements.into_iter().map(|(e, _)| e).collect();
        if catchall {
            plain.push("*".into());
        }
        (plain, Vec::new())
    };
    let name = format!("{}{n}", if map { "m" } else { "s" });
    // By its fields' data types at times, else by the fields.
    let types: Option<Vec<&str>> = key.fields.iter().map(|f| f.type_name()).collect();
    let declared = match types.filter(|_| rng.gen()) {
        Some(types) => format!("type {}", types.join(" . ")),
        None => format!("typeof {}", key.expr()),
    };
    let text = format!(
        "  {} {name} {{\n    {declared}{};\n{}    elements = {{ {} }}\n  }}\n",
        if map { "map" } else { "set" },
        if map { " : verdict" } else { "" },
        if interval {
            "    flags interval;\n"
        } else {
            ""
        },
        elements.join(", ")
    );
    (
        text,
        NamedSet {
            name,
            key,
            targets,
            map,
            catchall,
        },
    )
}

/// A lookup in a set: a named one of `sets` or an anonymous one, inverted at times.
fn lookup_match(rng: &mut StdRng, family: TableFamily, sets: &[NamedSet]) -> String {
    let not = maybe_not(rng);
    let named: Vec<&NamedSet> = sets.iter().filter(|s| !s.map).collect();
    if !named.is_empty() && rng.gen_bool(0.5) {
        let s = named[rng.gen_range(0..named.len())];
        let not = if s.catchall && !INVERTED_CATCHALL {
            ""
        } else {
            not
        };
        return format!("{} {not}@{}", s.key.expr(), s.name);
    }
    let key = random_key(rng, family, false);
    let (ranges, count) = (rng.gen_bool(0.6) && key.ranges(), rng.gen_range(1..=5));
    let mut elements: Vec<String> = random_elements(rng, &key, ranges, count)
        .into_iter()
        .map(|(e, _)| e)
        .collect();
    if key.catchall() && (not.is_empty() || INVERTED_CATCHALL) && rng.gen_bool(0.03) {
        elements.push("*".into());
    }
    format!("{} {not}{{ {} }}", key.expr(), elements.join(", "))
}

/// A verdict map's lookup, the end of a rule: a named map of `sets` whose chains are
/// all among `targets`, or an anonymous one.
fn vmap_statement(
    rng: &mut StdRng,
    family: TableFamily,
    sets: &[NamedSet],
    targets: &[String],
) -> String {
    let named: Vec<&NamedSet> = sets
        .iter()
        .filter(|s| s.map && s.targets.iter().all(|t| targets.contains(t)))
        .collect();
    if !named.is_empty() && rng.gen_bool(0.5) {
        let m = named[rng.gen_range(0..named.len())];
        return format!("{} vmap @{}", m.key.expr(), m.name);
    }
    let key = random_key(rng, family, false);
    let (ranges, count) = (rng.gen_bool(0.5) && key.ranges(), rng.gen_range(1..=5));
    let elements = random_elements(rng, &key, ranges, count);
    let catchall = key.catchall() && rng.gen_bool(0.15);
    let (elements, _) = verdict_elements(rng, elements, targets, catchall);
    format!("{} vmap {{ {} }}", key.expr(), elements.join(", "))
}

/// The key of a set lookup or map in match `m` (what precedes `@set`, `{`, `!=` before
/// either, or `vmap`), if it is one.
fn lookup_key(m: &str) -> Option<&str> {
    [" != @", " != {", " @", " {", " vmap "]
        .iter()
        .filter_map(|p| m.find(p))
        .min()
        .map(|at| &m[..at])
}

/// The family of a table: which matches its rules may hold.
#[derive(Clone, Copy, PartialEq, Eq)]
enum TableFamily {
    Ip,
    Ip6,
    Inet,
}

impl TableFamily {
    fn keyword(self) -> &'static str {
        match self {
            TableFamily::Ip => "ip",
            TableFamily::Ip6 => "ip6",
            TableFamily::Inet => "inet",
        }
    }
}

/// A comparison of a number, as `nft` writes it after the field: equal, not, less,
/// greater, a range or out of it (`value` gives the numbers).
fn compared(rng: &mut StdRng, mut value: impl FnMut(&mut StdRng) -> u32) -> String {
    let n = value(rng);
    match rng.gen_range(0..8) {
        0 => format!("{n}"),
        1 => format!("!= {n}"),
        2 => format!("< {n}"),
        3 => format!("> {n}"),
        4 => format!("<= {n}"),
        5 => format!(">= {n}"),
        op => {
            let m = value(rng);
            let (low, high) = (n.min(m), n.max(m));
            match (low == high, op == 6) {
                (true, _) => format!("{low}"),
                (false, true) => format!("{low}-{high}"),
                (false, false) => format!("!= {low}-{high}"),
            }
        }
    }
}

fn maybe_not(rng: &mut StdRng) -> &'static str {
    if rng.gen_bool(0.25) {
        "!= "
    } else {
        ""
    }
}

/// A match on IPv4's header or ICMP (in an `inet` table, `nft` adds the dependency on
/// the family).
fn ipv4_match(rng: &mut StdRng) -> String {
    let not = maybe_not(rng);
    match rng.gen_range(0..15) {
        0 => {
            let len = rng.gen_range(21..=24);
            let third = rng.gen_range(0..16u8) & (0xff << (24 - len));
            format!("ip saddr {not}10.1.{third}.0/{len}")
        }
        1 => {
            let len = rng.gen_range(17..=20);
            let third = rng.gen::<u8>() & (0xff << (24 - len));
            format!("ip daddr {not}10.3.{third}.0/{len}")
        }
        2..=3 => format!("ip ttl {}", compared(rng, |r| u32::from(random_hops(r)))),
        4 => format!(
            "ip protocol {not}{}",
            pick(rng, &["udp", "tcp", "icmp", "47", "132", "51"])
        ),
        5 => format!("ip dscp {not}{:#04x}", pick(rng, &[0, 0x08, 0x10, 0x2e])),
        6 => format!(
            "ip ecn {not}{}",
            pick(rng, &["not-ect", "ect1", "ect0", "ce"])
        ),
        7 => format!("ip length {}", compared(rng, |r| r.gen_range(28..=400))),
        8 => {
            let bit = 1u16 << rng.gen_range(0..16);
            format!("ip id & {bit:#x} == {}", pick(rng, &[bit, 0]))
        }
        9 => format!(
            "ip frag-off & {}",
            pick(
                rng,
                &[
                    "0x1fff != 0",
                    "0x1fff == 0",
                    "0x2000 == 0x2000",
                    "0x4000 != 0"
                ]
            )
        ),
        // The checksum the forward and postrouting hooks see is patched for the TTL.
        10 => {
            let bit = 1u16 << rng.gen_range(0..16);
            format!("ip checksum & {bit:#x} == {}", pick(rng, &[bit, 0]))
        }
        11 => format!("ip hdrlength {not}5"),
        12 => format!(
            "icmp type {not}{}",
            pick(
                rng,
                &[
                    "echo-request",
                    "echo-reply",
                    "destination-unreachable",
                    "time-exceeded"
                ]
            )
        ),
        13 => format!("icmp code {not}{}", rng.gen_range(0..3)),
        _ => format!("ip version {not}4"),
    }
}

/// A match on IPv6's header or ICMPv6.
fn ipv6_match(rng: &mut StdRng) -> String {
    let not = maybe_not(rng);
    match rng.gen_range(0..13) {
        0 => {
            let len = rng.gen_range(65..=68);
            let nibble = rng.gen_range(0..16u8) & (0xf << (68 - len));
            format!("ip6 saddr {not}fd01:0:0:0:{nibble:x}000::/{len}")
        }
        1 => {
            let len = rng.gen_range(65..=68);
            let nibble = rng.gen_range(0..16u8) & (0xf << (68 - len));
            format!("ip6 daddr {not}fd03:0:0:0:{nibble:x}000::/{len}")
        }
        2..=3 => format!(
            "ip6 hoplimit {}",
            compared(rng, |r| u32::from(random_hops(r)))
        ),
        // What the IPv6 header names next: an extension header's number, not the
        // transport protocol, when there is one.
        4..=5 => format!(
            "ip6 nexthdr {not}{}",
            pick(
                rng,
                &["udp", "tcp", "ipv6-icmp", "0", "60", "44", "47", "59"]
            )
        ),
        6 => format!("ip6 dscp {not}{:#04x}", pick(rng, &[0, 0x08, 0x10, 0x2e])),
        7 => format!(
            "ip6 ecn {not}{}",
            pick(rng, &["not-ect", "ect1", "ect0", "ce"])
        ),
        8 => format!("ip6 flowlabel {not}0"),
        9 => format!("ip6 length {}", compared(rng, |r| r.gen_range(8..=400))),
        10 => format!(
            "icmpv6 type {not}{}",
            pick(
                rng,
                &[
                    "echo-request",
                    "echo-reply",
                    "destination-unreachable",
                    "nd-neighbor-solicit"
                ]
            )
        ),
        11 => format!("icmpv6 code {not}{}", rng.gen_range(0..3)),
        _ => format!("ip6 version {not}6"),
    }
}

/// A match of either family: transport headers, raw payload, and the packet's metadata
/// (links, their names, types and groups, length, mark, type).
fn either_match(rng: &mut StdRng, family: TableFamily) -> String {
    let not = maybe_not(rng);
    let port = |r: &mut StdRng| u32::from(random_port(r));
    match rng.gen_range(0..22) {
        0..=1 => format!(
            "meta l4proto {not}{}",
            pick(rng, &["tcp", "udp", "icmp", "ipv6-icmp", "47", "132"])
        ),
        2 => format!("udp dport {}", compared(rng, port)),
        3 => format!("udp sport {}", compared(rng, port)),
        4 => format!("tcp dport {}", compared(rng, port)),
        5 => format!("tcp sport {}", compared(rng, port)),
        6..=7 => {
            // A mask of the flags fin (0x01), syn, rst, psh, ack and urg (0x20), and a
            // value within it, often of syn and ack.
            let mask = rng.gen_range(1..0x40u8);
            let value = if rng.gen_bool(0.7) {
                mask & rng.gen::<u8>()
            } else {
                mask & 0x12
            };
            format!(
                "tcp flags & {mask:#x} {}= {value:#x}",
                if rng.gen_bool(0.8) { "=" } else { "!" }
            )
        }
        // The transport header's bytes, whatever the protocol (no dependency).
        8 => format!("th dport {not}{}", random_port(rng)),
        9 => format!("@th,0,8 {not}{}", pick(rng, &[0, 3, 8, 128, 129])),
        10 => {
            let bit = 1u8 << rng.gen_range(0..8);
            format!("@th,104,8 & {bit:#x} == {}", pick(rng, &[bit, 0]))
        }
        // The network header's: the hop limit (IPv6), time to live (IPv4), the IPv4
        // checksum, the version.
        11 => {
            let bit = 1u8 << rng.gen_range(0..8);
            let at = pick(rng, &[56, 64, 72, 80, 88]);
            format!("@nh,{at},8 & {bit:#x} == {}", pick(rng, &[bit, 0]))
        }
        12 => format!("@nh,0,8 & 0xf0 == {}", pick(rng, &["0x40", "0x60"])),
        13 => format!("meta length {not}{}", rng.gen_range(40..=300)),
        14 => format!(
            "iifname {not}{}",
            pick(rng, &["\"ra\"", "\"rb\"", "\"r*\"", "\"a*\""])
        ),
        15 => format!(
            "oifname {not}{}",
            pick(rng, &["\"rb\"", "\"ra\"", "\"r*\"", "\"b*\""])
        ),
        16 => format!(
            "meta {} {not}{}",
            pick(rng, &["iif", "oif"]),
            pick(rng, &["\"ra\"", "\"rb\""])
        ),
        17 => format!(
            "meta pkttype {not}{}",
            pick(rng, &["host", "host", "broadcast", "multicast", "other"])
        ),
        18 => format!("meta {} {not}ether", pick(rng, &["iiftype", "oiftype"])),
        19 => format!(
            "meta {} {not}{}",
            pick(rng, &["iifgroup", "oifgroup"]),
            pick(rng, &[0, ROUTER_IN_GROUP, ROUTER_OUT_GROUP])
        ),
        20 => format!("meta mark {not}{}", pick(rng, &["0", "0x5"])),
        _ if family == TableFamily::Inet && rng.gen() => {
            format!("meta nfproto {}", pick(rng, &["ipv4", "ipv6"]))
        }
        _ => format!("meta protocol {not}{}", pick(rng, &["ip", "ip6"])),
    }
}

/// A match on the link layer: the frame's Ethernet header as received (the kernel's
/// mac header, which the forward and postrouting hooks still see), its addresses and
/// type by name or as raw bits, and raw loads that run on into the IP header (whose
/// time to live or hop limit and checksum the later hooks see taken down).
fn link_match(rng: &mut StdRng) -> String {
    let not = maybe_not(rng);
    match rng.gen_range(0..10) {
        0..=1 => format!("ether saddr {not}{}", mac(pick(rng, &SOURCE_MACS))),
        2 => format!(
            "ether daddr {not}{}",
            mac(pick(rng, &[ROUTER_IN_MAC, RECEIVER_MAC]))
        ),
        3 => format!(
            "ether type {not}{}",
            pick(rng, &["ip", "ip6", "ip", "ip6", "arp", "vlan"])
        ),
        4 => format!("@ll,48,48 {not}0x{}", hex(&pick(rng, &SOURCE_MACS))),
        5 => format!(
            "@ll,0,48 {not}0x{}",
            hex(&pick(rng, &[ROUTER_IN_MAC, RECEIVER_MAC]))
        ),
        6 => format!("@ll,96,16 {not}{}", pick(rng, &["0x0800", "0x86dd"])),
        // IPv4's time to live.
        7 => format!("@ll,176,8 {}", compared(rng, |r| u32::from(random_hops(r)))),
        _ => {
            // A bit of the link layer or of the network header: the sender's address,
            // the type, IPv4's version, ToS, TTL, protocol, checksum and addresses,
            // IPv6's hop limit and addresses; loads within a header or across both.
            let (at, len) = pick(
                rng,
                &[
                    (40, 8),
                    (88, 8),
                    (104, 8),
                    (112, 8),
                    (120, 8),
                    (168, 8),
                    (176, 8),
                    (184, 8),
                    (192, 8),
                    (200, 8),
                    (232, 8),
                    (280, 8),
                    (96, 32),
                    (104, 16),
                    (160, 32),
                    (168, 16),
                    (176, 16),
                    (192, 16),
                    (112, 64),
                ],
            );
            let bit = 1u64 << rng.gen_range(0..len);
            format!(
                "@ll,{at},{len} & {bit:#x} {} {}",
                pick(rng, &["==", "!="]),
                pick(rng, &[bit, 0])
            )
        }
    }
}

/// An order, a range or a mask on the packet's metadata, most of it held in host order
/// (`nft` turns it to network order with `byteorder` before an order or a range).
fn meta_order_match(rng: &mut StdRng) -> String {
    let op = |rng: &mut StdRng| pick(rng, &["<", ">", "<=", ">=", "!="]);
    match rng.gen_range(0..10) {
        0..=2 => format!("meta length {}", compared(rng, |r| r.gen_range(40..=300))),
        3 => {
            let bit = 1u32 << rng.gen_range(0..9);
            format!("meta length & {bit:#x} == {}", pick(rng, &[bit, 0]))
        }
        4 => format!("meta mark {}", compared(rng, |r| r.gen_range(0..=6))),
        5 => format!(
            "meta {} {}",
            pick(rng, &["iifgroup", "oifgroup"]),
            compared(rng, |r| r.gen_range(0..=8))
        ),
        6 => format!(
            "meta {} {} \"{}\"",
            pick(rng, &["iif", "oif"]),
            op(rng),
            pick(rng, &["lo", "ra", "rb"])
        ),
        7 => format!(
            "meta {} {} {}",
            pick(rng, &["iiftype", "oiftype"]),
            op(rng),
            pick(rng, &[1, 2, 772])
        ),
        8 => format!(
            "meta l4proto {}",
            compared(rng, |r| pick(r, &[1, 6, 17, 47, 58, 132]))
        ),
        _ => {
            let bit = 1u32 << rng.gen_range(0..4);
            format!(
                "meta {} & {bit:#x} == {}",
                pick(rng, &["iifgroup", "oifgroup", "mark"]),
                pick(rng, &[bit, 0])
            )
        }
    }
}

/// A random match for a rule of a table of `family` (whose named sets are `sets`): on
/// IPv4's headers, on IPv6's, on either's and the metadata, on the link layer, or a
/// lookup in a set.
fn random_match(rng: &mut StdRng, family: TableFamily, sets: &[NamedSet]) -> String {
    match rng.gen_range(0..100) {
        0..=19 => return lookup_match(rng, family, sets),
        20..=27 => return link_match(rng),
        28..=33 => return meta_order_match(rng),
        _ => {}
    }
    let v4 = match family {
        TableFamily::Ip => rng.gen_bool(0.6),
        TableFamily::Ip6 => false,
        TableFamily::Inet => rng.gen_bool(0.35),
    };
    let v6 = !v4
        && match family {
            TableFamily::Ip => false,
            TableFamily::Ip6 => rng.gen_bool(0.6),
            TableFamily::Inet => rng.gen_bool(0.5),
        };
    if v4 {
        ipv4_match(rng)
    } else if v6 {
        ipv6_match(rng)
    } else {
        either_match(rng, family)
    }
}

/// What the matches of a rule so far tell `nft` of the packet's protocols: its network
/// protocol (4 or 6, 0 for another on the link layer) and its transport protocol. `nft`
/// refuses a rule whose matches contradict each other (`ip6 daddr ... ip ttl 3`,
/// `meta l4proto udp tcp dport 80`, `ether type arp ip saddr ...`), the fields of a
/// set's key too.
#[derive(Clone)]
struct ProtocolContext {
    network: Option<u8>,
    transport: Option<String>,
}

impl ProtocolContext {
    /// What a table of `family` tells of its packets.
    fn of(family: TableFamily) -> ProtocolContext {
        ProtocolContext {
            network: match family {
                TableFamily::Ip => Some(4),
                TableFamily::Ip6 => Some(6),
                TableFamily::Inet => None,
            },
            transport: None,
        }
    }

    /// Whether `m` (a match, a set lookup or a verdict map) agrees with the matches so
    /// far; if so, what it tells is added.
    fn admits(&mut self, m: &str) -> bool {
        let mut next = self.clone();
        // A set's protocol field tells `nft` one protocol of its elements, which a
        // match on another contradicts: taken as one no other match names.
        let agrees = match lookup_key(m) {
            Some(key) => key
                .split(" . ")
                .all(|part| next.admits_one(&format!("{part} {{set}}"))),
            None => next.admits_one(m),
        };
        if agrees {
            *self = next;
        }
        agrees
    }

    /// Whether one match (or one field of a set's key, its value `{set}`) agrees; if
    /// so, what it tells is added.
    fn admits_one(&mut self, m: &str) -> bool {
        let words: Vec<&str> = m.split_whitespace().collect();
        let negated = words.contains(&"!=");
        let network = match (words.as_slice(), negated) {
            (["ip" | "icmp", ..], _) => Some(4),
            (["ip6" | "icmpv6", ..], _) => Some(6),
            (["meta", "nfproto", "ipv4"], _)
            | (["meta", "protocol", "ip"] | ["ether", "type", "ip"], false) => Some(4),
            (["meta", "nfproto", "ipv6"], _)
            | (["meta", "protocol", "ip6"] | ["ether", "type", "ip6"], false) => Some(6),
            (["ether", "type", "arp" | "vlan"], false)
            | (["ether" | "meta", "type" | "protocol" | "nfproto", "{set}"], _) => Some(0),
            _ => None,
        };
        let transport = match (words.as_slice(), negated) {
            ([p @ ("udp" | "tcp" | "icmp"), ..], _) => Some(*p),
            (["icmpv6", ..], _) => Some("ipv6-icmp"),
            (["ip", "protocol", p] | ["meta", "l4proto", p] | ["ip6", "nexthdr", p], false) => {
                Some(*p)
            }
            _ => None,
        };
        let agrees_network = network.is_none() || self.network.is_none() || network == self.network;
        let agrees_transport = transport.is_none()
            || self.transport.is_none()
            || transport == self.transport.as_deref();
        // Another protocol than IP on the link layer has no transport header.
        let beyond_ip = |n: Option<u8>, t: Option<&str>| n == Some(0) && t.is_some();
        if !(agrees_network && agrees_transport)
            || beyond_ip(network.or(self.network), transport)
            || beyond_ip(network, self.transport.as_deref())
        {
            return false;
        }
        self.network = self.network.or(network);
        if self.transport.is_none() {
            self.transport = transport.map(str::to_string);
        }
        true
    }
}

/// Whether match `m` in a table of `family` tells packets apart: not one on the links,
/// the packet type or the mark, which every packet at a hook meets alike, nor one on the
/// family in a table of one family.
fn reads_the_packet(m: &str, family: TableFamily) -> bool {
    let alike = [
        "iifname",
        "oifname",
        "meta iif",
        "meta oif",
        "meta pkttype",
        "meta mark",
        "ip version",
        "ip6 version",
        "ether daddr",
        "@ll,0,48",
    ];
    let family_only = [
        "meta protocol",
        "meta nfproto",
        "@nh,0,8 & 0xf0",
        "ether type",
        "@ll,96,16",
    ];
    !alike.iter().any(|p| m.starts_with(p))
        && (family == TableFamily::Inet || !family_only.iter().any(|p| m.starts_with(p)))
}

/// Whether match `m` in a table of `family` leaves out about half its family's packets
/// or more: it reads the packet, is not a negation, and is not one most packets meet
/// (an order on the time to live or a length, a port above or below some, the version,
/// a bit of the frame), nor a lookup (a set may hold wide ranges, or the catch-all).
fn narrows(m: &str, family: TableFamily) -> bool {
    if lookup_key(m).is_some() {
        return false;
    }
    let broad = [
        "ip ttl",
        "ip6 hoplimit",
        "ip length",
        "ip6 length",
        "meta length",
        "ip version",
        "ip6 version",
        "ip hdrlength",
        "ip frag-off",
        "ip6 flowlabel",
        "@nh,0,8",
        "@ll,",
    ];
    let words: Vec<&str> = m.split_whitespace().collect();
    let ordered = words.iter().any(|w| matches!(*w, "<" | ">" | "<=" | ">="));
    reads_the_packet(m, family)
        && !words.contains(&"!=")
        && !ordered
        && !broad.iter().any(|b| m.starts_with(b))
}

/// What ends a rule.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Accept,
    Drop,
    Continue,
    Return,
    Jump,
    Goto,
    /// No verdict: a counter, on to the next rule.
    Counter,
    /// A verdict map's: the verdict of the element the packet's key matches.
    Map,
}

/// A random rule of a chain of a table of `family` (whose named sets and maps are
/// `sets`) that may jump or go to `targets`: none to three matches (more for a drop),
/// and a verdict, a verdict map or a counter.
fn random_rule(
    rng: &mut StdRng,
    family: TableFamily,
    targets: &[String],
    sets: &[NamedSet],
) -> String {
    let verdict = loop {
        let v = match rng.gen_range(0..23) {
            0..=2 => Verdict::Accept,
            3..=4 => Verdict::Drop,
            5 => Verdict::Continue,
            6..=7 => Verdict::Return,
            8..=10 => Verdict::Jump,
            11..=12 => Verdict::Goto,
            13..=15 => Verdict::Map,
            _ => Verdict::Counter,
        };
        if !(matches!(v, Verdict::Jump | Verdict::Goto) && targets.is_empty()) {
            break v;
        }
    };
    if verdict == Verdict::Map {
        // Its elements decide, each on a value: a match before it at times.
        let mut context = ProtocolContext::of(family);
        let mut rule = Vec::new();
        if rng.gen_bool(0.3) {
            rule.push(loop {
                let m = random_match(rng, family, sets);
                if context.admits(&m) {
                    break m;
                }
            });
        }
        if rng.gen_bool(0.2) {
            rule.push("counter".into());
        }
        rule.push(loop {
            let m = vmap_statement(rng, family, sets, targets);
            if context.admits(&m) {
                break m;
            }
        });
        return rule.join(" ");
    }
    let mut matches = match rng.gen_range(0..10) {
        0 => 0,
        1..=5 => 1,
        6..=8 => 2,
        _ => 3,
    };
    // A rule that matches everything and accepts, drops or returns leaves the rest of
    // the chain unreached: rarely.
    let decides_all = matches!(
        verdict,
        Verdict::Accept | Verdict::Drop | Verdict::Return | Verdict::Goto
    );
    if matches == 0 && decides_all && rng.gen_bool(0.9) {
        matches = 1;
    }
    let mut context = ProtocolContext::of(family);
    let mut rule: Vec<String> = (0..matches)
        .map(|_| loop {
            let m = random_match(rng, family, sets);
            if context.admits(&m) {
                break m;
            }
        })
        .collect();
    // A decision on a match every packet meets alike (the links, the packet type) would
    // decide all or none: mostly, a decision also reads the packet.
    let decides = !matches!(
        verdict,
        Verdict::Counter | Verdict::Continue | Verdict::Jump
    );
    if decides
        && !rule.is_empty()
        && !rule.iter().any(|m| reads_the_packet(m, family))
        && rng.gen_bool(0.9)
    {
        rule.push(loop {
            let m = random_match(rng, family, sets);
            if reads_the_packet(&m, family) && context.admits(&m) {
                break m;
            }
        });
    }
    // Drops are many along the hooks, and one is enough: each drops at most about
    // half its family's packets, so that together they seldom drop all.
    if verdict == Verdict::Drop {
        rule.push(loop {
            let m = random_match(rng, family, sets);
            if narrows(&m, family) && context.admits(&m) {
                break m;
            }
        });
    }
    if verdict == Verdict::Counter || rng.gen_bool(0.2) {
        rule.push("counter".into());
    }
    match verdict {
        Verdict::Accept => rule.push("accept".into()),
        Verdict::Drop => rule.push("drop".into()),
        Verdict::Continue => rule.push("continue".into()),
        Verdict::Return => rule.push("return".into()),
        Verdict::Jump => rule.push(format!("jump {}", targets[rng.gen_range(0..targets.len())])),
        Verdict::Goto => rule.push(format!("goto {}", targets[rng.gen_range(0..targets.len())])),
        Verdict::Counter | Verdict::Map => {}
    }
    rule.join(" ")
}

/// A run of rules of a table of `family` that each require one field equal to a value
/// (a few values, each required by several rules), what fibre's filter makes into a
/// block that reads the field once and skips the rules whose value the packet does not
/// carry: each with another match at times, and a counter or a verdict (one drop at
/// most, on a narrow field), jumps and gotos to `targets`.
fn field_run(
    rng: &mut StdRng,
    family: TableFamily,
    targets: &[String],
    sets: &[NamedSet],
) -> Vec<String> {
    // Values the table's family admits (not `ether type arp` in an `ip` table).
    let (field, values) = loop {
        let f = &KEY_FIELDS[rng.gen_range(0..KEY_FIELDS.len())];
        if !f.fits(family) || f.domain == Domain::Dscp {
            continue;
        }
        let values: Vec<String> = (0..rng.gen_range(2..=5))
            .map(|_| random_span(rng, f.domain, false).text)
            .filter(|v| ProtocolContext::of(family).admits(&format!("{} {v}", f.expr)))
            .collect();
        if !values.is_empty() {
            break (f, values);
        }
    };
    let mut dropped = false;
    (0..rng.gen_range(8..=14))
        .map(|_| {
            let required = format!("{} {}", field.expr, pick_name(rng, &values));
            let mut context = ProtocolContext::of(family);
            context.admits(&required);
            let mut rule = vec![required];
            if rng.gen_bool(0.3) {
                rule.push(loop {
                    let m = random_match(rng, family, sets);
                    if context.admits(&m) {
                        break m;
                    }
                });
            }
            let verdict = loop {
                let v = match rng.gen_range(0..20) {
                    0..=5 => "counter".to_string(),
                    6..=9 => "accept".to_string(),
                    10..=11 => "continue".to_string(),
                    12 => "return".to_string(),
                    13..=15 if field.narrow() && !dropped => "drop".to_string(),
                    16..=18 if !targets.is_empty() => format!("jump {}", pick_name(rng, targets)),
                    19 if !targets.is_empty() => format!("goto {}", pick_name(rng, targets)),
                    _ => continue,
                };
                break v;
            };
            dropped |= verdict == "drop";
            rule.push(verdict);
            rule.join(" ")
        })
        .collect()
}

/// A match that a quarter to a half of the packets a chain of a table of `family`
/// meets do, by destination address (in the half of the destinations `half` names, the
/// same for every chain of a ruleset, so that two chains do not drop both halves) or
/// transport protocol: what the first rule of a chain with a policy of accept drops, so
/// that each ruleset drops some packets.
fn some_by_destination(rng: &mut StdRng, family: TableFamily, half: u8) -> String {
    let v4 = [
        format!("ip daddr 10.3.{}.0/17", half * 128),
        format!("ip daddr 10.3.{}.0/18", half * 128 + pick(rng, &[0, 64])),
        "ip protocol tcp".to_string(),
    ];
    let v6 = [
        format!("ip6 daddr fd03:0:0:0:{:x}000::/65", half * 8),
        format!(
            "ip6 daddr fd03:0:0:0:{:x}000::/66",
            half * 8 + pick(rng, &[0, 4])
        ),
        "ip6 nexthdr tcp".to_string(),
    ];
    let either = [
        "meta l4proto udp".to_string(),
        "meta l4proto tcp".to_string(),
    ];
    let choices: Vec<&String> = match family {
        TableFamily::Ip => v4.iter().chain(&either).collect(),
        TableFamily::Ip6 => v6.iter().chain(&either).collect(),
        TableFamily::Inet => v4.iter().chain(&v6).chain(&either).collect(),
    };
    choices[rng.gen_range(0..choices.len())].clone()
}

/// A match that half the packets of one family do, by source address (`v6` picks the
/// family): what a chain with a policy of drop accepts first. Not by destination or
/// protocol, so that the packets let in are not just those another chain drops.
fn half_by_source(rng: &mut StdRng, v6: bool) -> String {
    if v6 {
        format!("ip6 saddr fd01:0:0:0:{:x}000::/65", pick(rng, &[0, 8]))
    } else {
        format!("ip saddr 10.1.{}.0/21", pick(rng, &[0, 8]))
    }
}

/// A random ruleset, as `nft -f` reads it: one to three tables of the families `ip`,
/// `ip6` and `inet`, each with named sets and verdict maps, regular chains (a chain
/// jumps or goes only to chains after it, directly or through a map, so there is no
/// loop) and base chains of type filter, mostly at the forwarding path's hooks, some
/// with a run of rules on one field; every base chain with a rule that drops some
/// packets when its policy accepts, one that accepts some when it drops, so that
/// verdicts mix.
fn random_ruleset(rng: &mut StdRng) -> String {
    let mut text = String::new();
    let mut dropping_policy = false;
    let half = rng.gen_range(0..2);
    for t in 0..pick(rng, &[1, 1, 2, 2, 3]) {
        let family = pick(
            rng,
            &[
                TableFamily::Ip,
                TableFamily::Ip6,
                TableFamily::Inet,
                TableFamily::Inet,
            ],
        );
        writeln!(text, "table {} t{t} {{", family.keyword()).unwrap();
        if t > 0 && rng.gen_bool(0.05) {
            writeln!(text, "  flags dormant;").unwrap();
        }
        let regular: Vec<String> = (0..rng.gen_range(0..=3)).map(|c| format!("c{c}")).collect();
        // Named sets and verdict maps first, for the rules that name them.
        let mut sets = Vec::new();
        for n in 0..pick(rng, &[0, 1, 1, 2, 3]) {
            let (declaration, set) = random_named_set(rng, family, n, false, &regular);
            text.push_str(&declaration);
            sets.push(set);
        }
        for n in 0..pick(rng, &[0, 0, 1, 1, 2]) {
            let (declaration, map) = random_named_set(rng, family, n, true, &regular);
            text.push_str(&declaration);
            sets.push(map);
        }
        // Declared last first, so that each target exists before a chain names it.
        for (c, name) in regular.iter().enumerate().rev() {
            writeln!(text, "  chain {name} {{").unwrap();
            let mut rules: Vec<String> = (0..rng.gen_range(1..=4))
                .map(|_| random_rule(rng, family, &regular[c + 1..], &sets))
                .collect();
            if rng.gen_bool(0.1) {
                let at = rng.gen_range(0..=rules.len());
                let run = field_run(rng, family, &regular[c + 1..], &sets);
                rules.splice(at..at, run);
            }
            for rule in rules {
                writeln!(text, "    {rule}").unwrap();
            }
            writeln!(text, "  }}").unwrap();
        }
        for b in 0..rng.gen_range(1..=2) {
            let hook = if b > 0 && rng.gen_bool(0.1) {
                pick(rng, &["input", "output"])
            } else {
                pick(rng, &["prerouting", "forward", "forward", "postrouting"])
            };
            // One chain at most with a policy of drop, not the first: with several, or
            // with the first chain's, too few packets would pass.
            let drops = !(dropping_policy || (t == 0 && b == 0)) && rng.gen_bool(0.15);
            dropping_policy |= drops;
            writeln!(
                text,
                "  chain base{b} {{\n    type filter hook {hook} priority {}; policy {};",
                rng.gen_range(-300..=300),
                if drops { "drop" } else { "accept" }
            )
            .unwrap();
            let mut rules: Vec<String> = (0..rng.gen_range(1..=6))
                .map(|_| random_rule(rng, family, &regular, &sets))
                .collect();
            if rng.gen_bool(0.2) {
                let at = rng.gen_range(0..=rules.len());
                let run = field_run(rng, family, &regular, &sets);
                rules.splice(at..at, run);
            }
            if drops {
                // Two ways in, first: a policy of drop lets few through otherwise.
                let families = match family {
                    TableFamily::Ip => [false, false],
                    TableFamily::Ip6 => [true, true],
                    TableFamily::Inet => [false, true],
                };
                for v6 in families {
                    rules.insert(0, format!("{} accept", half_by_source(rng, v6)));
                }
            } else {
                // First in the first chain, so that each ruleset drops some packets.
                let at = if t == 0 && b == 0 {
                    0
                } else {
                    rng.gen_range(0..=rules.len())
                };
                rules.insert(
                    at,
                    format!("{} drop", some_by_destination(rng, family, half)),
                );
            }
            for rule in rules {
                writeln!(text, "    {rule}").unwrap();
            }
            writeln!(text, "  }}").unwrap();
        }
        writeln!(text, "}}").unwrap();
    }
    text
}

/// fibre's filter of `ruleset`, after checking that fibre compiles every base chain a
/// forwarded packet meets (the filter leaves out those it does not, which would make
/// the comparison meaningless).
fn compiled_filter(ruleset: &Ruleset, text: &str) -> Filter {
    for table in ruleset.tables().filter(|t| !t.table.dormant()) {
        for entry in table.chains.values() {
            let on_path = entry
                .chain
                .hook
                .as_ref()
                .is_some_and(|h| matches!(h.number, 0 | 2 | 4));
            if on_path {
                if let Err(refused) = Program::compile(table, &entry.chain.name) {
                    panic!(
                        "fibre does not compile chain {} of table {}: {refused:?}\nruleset:\n{text}",
                        entry.chain.name, table.table.name
                    );
                }
            }
        }
    }
    Filter::of(ruleset)
}

/// Sends every probe's frame and returns the IP packets that came out of the router,
/// by tag, and the frames the capture could not keep.
fn forward_through_kernel(
    inject: &OwnedFd,
    capture: &OwnedFd,
    probes: &[Probe],
) -> (HashMap<u32, Vec<u8>>, u32) {
    wire::capture_drops(capture).expect("the capture's drops");
    let sender_done = AtomicBool::new(false);
    let arrived = std::thread::scope(|s| {
        let receiver = s.spawn(|| receive_until_quiet(capture, &sender_done));
        for probe in probes {
            wire::send_frame(inject, &probe.frame).expect("sending a frame");
        }
        sender_done.store(true, Ordering::Release);
        receiver
            .join()
            .expect("the receiving thread does not panic")
    });
    let lost = wire::capture_drops(capture).expect("the capture's drops");
    (arrived, lost)
}

/// Whether `received` is `sent` (its IP packet, no padding) as a router forwards it:
/// the time to live or hop limit one less, the IPv4 checksum still right, nothing else
/// changed.
fn forwarded_unchanged(sent: &[u8], received: &[u8]) -> bool {
    if sent.len() != received.len() {
        return false;
    }
    let (hops, checksum) = if sent[0] >> 4 == 4 {
        (8, Some(10..12))
    } else {
        (7, None)
    };
    let header_len = if checksum.is_some() {
        usize::from(sent[0] & 0xf) * 4
    } else {
        40
    };
    sent.iter().zip(received).enumerate().all(|(k, (s, r))| {
        if k == hops {
            *r == s - 1
        } else if checksum.as_ref().is_some_and(|c| c.contains(&k)) {
            true
        } else {
            s == r
        }
    }) && (checksum.is_none() || internet_checksum(&received[..header_len]) == 0)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
#[ignore = "needs root: network namespaces, veth pairs, nft, packet sockets"]
fn fibres_filter_decides_as_the_kernel_forwards() {
    let seed: u64 = match std::env::var("FIBRE_SEED") {
        Ok(s) => s.parse().expect("FIBRE_SEED is a number"),
        Err(_) => rand::random(),
    };
    println!("differential seed {seed} (FIBRE_SEED={seed} replays this run)");
    let started = Instant::now();
    let net = Topology::build();
    let inject = in_namespace(&net.sender, || {
        wire::packet_socket(0, net.sender_link).expect("the sending socket")
    });
    let capture = in_namespace(&net.receiver, || {
        wire::capture_socket(net.receiver_link, CAPTURE_BUFFER, QUIET)
            .expect("the capturing socket")
    });
    let (iif, oif) = (net.router_in(), net.router_out());
    let mut rng = StdRng::seed_from_u64(seed);
    let mut next_tag = 0u32;
    let (mut compared, mut passed) = (0usize, 0usize);
    for round in 0..ROUNDS {
        let text = random_ruleset(&mut rng);
        net.router
            .nft(&["flush", "ruleset"], "")
            .expect("nft flush ruleset");
        if let Err(e) = net.router.nft(&["-f", "-"], &text) {
            panic!("seed {seed}, round {round}: nft refused the ruleset: {e}\n{text}");
        }
        let mirrored = in_namespace(&net.router, || dump().expect("the ruleset's dump"));
        assert_eq!(mirrored.malformed, 0, "malformed messages in the dump");
        assert!(mirrored.unavailable.is_none(), "{:?}", mirrored.unavailable);
        let filter = compiled_filter(&mirrored.ruleset, &text);
        let probes: Vec<Probe> = (0..PACKETS_PER_ROUND)
            .map(|_| {
                next_tag += 1;
                random_probe(&mut rng, next_tag)
            })
            .collect();

        let lost_before = net.frames_lost_below_ip();
        let (arrived, capture_lost) = forward_through_kernel(&inject, &capture, &probes);
        let lost = net.frames_lost_below_ip() - lost_before;
        assert_eq!(
            (lost, capture_lost),
            (0, 0),
            "seed {seed}, round {round}: frames lost below IP (links and backlogs, \
             capture buffer): the kernel's verdicts cannot be told"
        );
        let sent: HashMap<u32, &Probe> = probes.iter().map(|p| (p.tag, p)).collect();
        for (tag, ip) in &arrived {
            let probe = sent.get(tag).unwrap_or_else(|| {
                panic!(
                    "seed {seed}, round {round}: a frame tagged {tag}, not of this round, arrived"
                )
            });
            let original = &probe.ip()[..probe.ip_len];
            assert!(
                forwarded_unchanged(original, ip),
                "seed {seed}, round {round}: packet {tag} came out changed\nsent     {}\nreceived {}",
                hex(original),
                hex(ip)
            );
        }

        let mut mismatches = Vec::new();
        let mut round_passed = 0;
        for probe in &probes {
            let frame = &probe.frame[..];
            let ip = probe.ip();
            let before_routing = filter.prerouting(frame, iif, None);
            let after_routing = filter.forwarding(&Packet { frame, iif, oif }, None);
            let fibre = before_routing && after_routing;
            let kernel = arrived.contains_key(&probe.tag);
            round_passed += usize::from(kernel);
            if fibre != kernel {
                mismatches.push(format!(
                    "packet {} ({} bytes of IP, {} of frame padding): kernel {}, fibre {} \
                     (prerouting {}, forward and postrouting {})\n  {} {}",
                    probe.tag,
                    probe.ip_len,
                    ip.len() - probe.ip_len,
                    if kernel { "forwarded" } else { "dropped" },
                    if fibre { "forwards" } else { "drops" },
                    if before_routing { "accepts" } else { "drops" },
                    if after_routing { "accept" } else { "drop" },
                    hex(&frame[..ETHERNET_HEADER]),
                    hex(ip),
                ));
            }
        }
        let round_dropped = probes.len() - round_passed;
        println!(
            "round {round}: {round_passed} forwarded, {round_dropped} dropped, {} mismatches",
            mismatches.len()
        );
        if !mismatches.is_empty() {
            panic!(
                "seed {seed}, round {round}: fibre and the kernel disagree on {} of {} packets \
                 (the first {} below; each frame's Ethernet header, then its IP packet, in hex)\nruleset:\n{text}\n{}",
                mismatches.len(),
                probes.len(),
                mismatches.len().min(10),
                mismatches[..mismatches.len().min(10)].join("\n")
            );
        }
        assert!(
            round_passed > 0 && round_dropped > 0,
            "seed {seed}, round {round}: the kernel forwarded {round_passed} and dropped \
             {round_dropped}: a round that does not mix verdicts cannot fail\nruleset:\n{text}"
        );
        compared += probes.len();
        passed += round_passed;
    }
    println!(
        "{compared} packets compared over {ROUNDS} rulesets ({passed} forwarded, {} dropped) \
         in {:.1?}; seed {seed}",
        compared - passed,
        started.elapsed()
    );
}
