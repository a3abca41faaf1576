//! rtnetlink sockets to the kernel of the current network namespace: one subscribed to
//! the routing groups, which queues every change the kernel announces, and one for
//! dumps, which restarts a dump the kernel marks interrupted (`NLM_F_DUMP_INTR`).

use crate::convert::{self, Skip};
use crate::nexthop::{self, NexthopMessage};
use fibre_fib::Route;
use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_CREATE, NLM_F_DUMP, NLM_F_DUMP_INTR,
    NLM_F_REPLACE, NLM_F_REQUEST,
};
use netlink_packet_route::address::AddressMessage;
use netlink_packet_route::link::LinkMessage;
use netlink_packet_route::neighbour::NeighbourMessage;
use netlink_packet_route::route::RouteMessage;
use netlink_packet_route::rule::RuleMessage;
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use std::io;

/// `RTM_NEWROUTE` (`linux/rtnetlink.h`).
const RTM_NEWROUTE: u16 = 24;
/// `RTM_DELROUTE`.
const RTM_DELROUTE: u16 = 25;

/// The groups the mirror follows: links, IPv4 and IPv6 addresses, routes and rules,
/// nexthop objects, neighbours.
const GROUPS: [u32; 9] = [
    libc::RTNLGRP_NEXTHOP,
    libc::RTNLGRP_NEIGH,
    libc::RTNLGRP_LINK,
    libc::RTNLGRP_IPV4_IFADDR,
    libc::RTNLGRP_IPV6_IFADDR,
    libc::RTNLGRP_IPV4_ROUTE,
    libc::RTNLGRP_IPV6_ROUTE,
    libc::RTNLGRP_IPV4_RULE,
    libc::RTNLGRP_IPV6_RULE,
];

/// The most notifications one batch takes: a burst larger than this is published in
/// parts, each soon. A batch's lag is the time to apply all of it: 1,024 route messages
/// that change routes take about half a millisecond. When a nexthop object is replaced,
/// the kernel reports again each of its routes (100,000, say), which the mirror finds
/// held as they are and drops: 0.4 ms a batch of 4,096, 0.1 ms of 1,024.
pub const BATCH_MESSAGES: usize = 1 << 10;

/// The most notifications received and not yet applied ([`Backlog`]) by default.
pub const BACKLOG_MESSAGES: usize = 1 << 17;

/// A bound on the notifications received and not yet applied. The receiver waits for
/// room before it reads the socket again, so that a mirror falling behind leaves the
/// changes in the kernel's socket, whose buffer is bounded too: it overflows
/// (`ENOBUFS`), the overflow is counted and the mirror dumps again, where an unbounded
/// queue between the two would grow without end.
pub struct Backlog {
    /// Messages received and not yet applied.
    queued: std::sync::Mutex<usize>,
    /// Signalled as messages are applied.
    room: std::sync::Condvar,
    /// The bound.
    limit: usize,
    /// Times the receiver waited for room.
    waits: std::sync::atomic::AtomicU64,
}

impl Backlog {
    /// A backlog of at most `limit` messages (at least one).
    pub fn new(limit: usize) -> Backlog {
        Backlog {
            queued: std::sync::Mutex::new(0),
            room: std::sync::Condvar::new(),
            limit: limit.max(1),
            waits: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Waits until fewer than the bound are queued (the receiver, before it reads).
    pub fn wait_for_room(&self) {
        let mut queued = self.queued.lock().unwrap_or_else(|e| e.into_inner());
        if *queued >= self.limit {
            self.waits
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        while *queued >= self.limit {
            queued = self.room.wait(queued).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Counts a batch received (the receiver, before it hands the batch on).
    pub fn received(&self, batch: &Batch) {
        *self.queued.lock().unwrap_or_else(|e| e.into_inner()) += batch.len();
    }

    /// Counts `n` messages applied (the mirror), making room.
    pub fn applied(&self, n: usize) {
        let mut queued = self.queued.lock().unwrap_or_else(|e| e.into_inner());
        *queued = queued.saturating_sub(n);
        self.room.notify_all();
    }

    /// Messages received and not yet applied.
    pub fn queued(&self) -> usize {
        *self.queued.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The bound.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// How many times the receiver waited for room.
    pub fn waits(&self) -> u64 {
        self.waits.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The receive buffer asked for each socket: large, so that bursts of changes (a table
/// loaded with `ip -batch`) queue rather than overflow.
pub const RECEIVE_BUFFER: usize = 64 << 20;

/// A message the mirror reads.
#[derive(Debug)]
pub enum Message {
    /// One the netlink crates decode.
    Decoded(RouteNetlinkMessage),
    /// A nexthop object, new or changed.
    Nexthop(NexthopMessage),
    /// A nexthop object removed: its id.
    DelNexthop(u32),
    /// A route, read from the message's bytes (`convert::route_from_bytes`): removed
    /// or not, and the route or why it is none.
    Route(bool, Result<Route, Skip>),
}

/// A message as received, with its header's flags.
pub type Received = (Message, u16);

/// One netlink message (its whole bytes) read: a message, the end of a dump, or `None`
/// for one to leave aside (an acknowledgement, a message of no interest). A kernel's
/// error is an `Err` with its code; a message that cannot be parsed, `Err(None)`.
fn read_one(bytes: &[u8]) -> Result<Option<Read>, Option<i32>> {
    let kind = u16::from_ne_bytes([bytes[4], bytes[5]]);
    if kind == nexthop::RTM_NEWNEXTHOP || kind == nexthop::RTM_DELNEXTHOP {
        let m = nexthop::decode(&bytes[16..]).map_err(|_| None)?;
        return Ok(Some(Read::Message(if kind == nexthop::RTM_NEWNEXTHOP {
            Message::Nexthop(m)
        } else {
            Message::DelNexthop(m.id)
        })));
    }
    if kind == RTM_NEWROUTE || kind == RTM_DELROUTE {
        if let Some(route) = convert::route_from_bytes(&bytes[16..]) {
            return Ok(Some(Read::Message(Message::Route(
                kind == RTM_DELROUTE,
                route,
            ))));
        }
    }
    match NetlinkMessage::<RouteNetlinkMessage>::deserialize(bytes) {
        Ok(m) => match m.payload {
            NetlinkPayload::Done(_) => Ok(Some(Read::Done)),
            NetlinkPayload::Error(e) => match e.code {
                Some(code) => Err(Some(code.get())),
                None => Ok(None),
            },
            NetlinkPayload::InnerMessage(inner) => Ok(Some(Read::Message(Message::Decoded(inner)))),
            _ => Ok(None),
        },
        Err(_) => Err(None),
    }
}

/// What [`read_one`] read.
enum Read {
    Message(Message),
    Done,
}

/// The subscribed socket: every change the kernel announces, queued from the moment it
/// is made.
pub struct Events {
    socket: Socket,
    buf: Vec<u8>,
}

/// What a receive on the subscribed socket gave.
pub enum Batch {
    /// Messages (and how many could not be parsed, dropped).
    Messages(Vec<Received>, u64),
    /// The socket overflowed (`ENOBUFS`): changes were lost, the state must be dumped
    /// again.
    Overflow,
}

impl Batch {
    /// The messages it holds (none for an overflow).
    pub fn len(&self) -> usize {
        match self {
            Batch::Messages(m, _) => m.len(),
            Batch::Overflow => 0,
        }
    }

    /// Whether it holds no message.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Events {
    /// Subscribes to the routing groups, with a receive buffer of `receive_buffer` bytes
    /// (forced past the system's limit where this process may).
    pub fn subscribe(receive_buffer: usize) -> io::Result<Events> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        fibre_kernel::sockopt::set_receive_buffer(&socket, receive_buffer)?;
        socket.bind_auto()?;
        for g in GROUPS {
            socket.add_membership(g)?;
        }
        Ok(Events {
            socket,
            buf: vec![0; 1 << 20],
        })
    }

    /// Waits for the next changes and returns what has queued since.
    /// After an overflow, what is still queued is discarded: it is older than the loss
    /// (the kernel reports the overflow before the messages queued ahead of it), and the
    /// dump that must follow holds its effect, where applying it after the dump would
    /// bring back what a lost message had removed.
    ///
    /// Each notification is a datagram of its own: after waiting for the first, every
    /// one already queued is taken too (up to [`BATCH_MESSAGES`]), so that a burst is
    /// one batch, not one a message.
    pub fn receive(&mut self) -> io::Result<Batch> {
        let mut out = Vec::new();
        let mut bad = 0;
        let mut flags = 0;
        while out.len() < BATCH_MESSAGES {
            let n = match self.socket.recv(&mut &mut self.buf[..], flags) {
                Ok(n) => n,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    self.discard()?;
                    return Ok(Batch::Overflow);
                }
                Err(e) if flags != 0 && e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            };
            bad += parse(&self.buf[..n], &mut out);
            flags = libc::MSG_DONTWAIT;
        }
        Ok(Batch::Messages(out, bad))
    }
}

impl Events {
    /// Reads and drops everything queued, without waiting.
    fn discard(&mut self) -> io::Result<()> {
        loop {
            match self.socket.recv(&mut &mut self.buf[..], libc::MSG_DONTWAIT) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }
}

/// Parses the netlink messages in `bytes` into `out`; the number that could not be
/// parsed (each dropped).
fn parse(mut bytes: &[u8], out: &mut Vec<Received>) -> u64 {
    let mut bad = 0;
    while bytes.len() >= 16 {
        let len = u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
        if len < 16 || len > bytes.len() {
            // A length that cannot be: the rest of the buffer cannot be framed.
            return bad + 1;
        }
        let flags = u16::from_ne_bytes([bytes[6], bytes[7]]);
        match read_one(&bytes[..len]) {
            Ok(Some(Read::Message(m))) => out.push((m, flags)),
            Ok(_) => {}
            Err(_) => bad += 1,
        }
        // Messages are aligned to 4 bytes.
        let step = (len + 3) & !3;
        bytes = &bytes[step.min(bytes.len())..];
    }
    bad
}

/// What a dump came to: how many messages could not be parsed, and whether the kernel
/// marked it interrupted (something changed while it was read, so that what was given
/// may be inconsistent: the caller dumps again).
#[derive(Clone, Copy, Debug, Default)]
pub struct Dumped {
    /// Messages that could not be parsed (dropped).
    pub malformed: u64,
    /// The kernel marked a part of the dump interrupted; the parts after it were not
    /// asked for.
    pub interrupted: bool,
}

/// Dumps links, addresses, rules, nexthop objects, routes and neighbours of both
/// families, in that order, handing each message to `each` as it is read: none is
/// held, so that a full table's dump costs no more memory than what the caller keeps
/// of it. Stops after a part the kernel marks interrupted.
pub fn dump(mut each: impl FnMut(Received)) -> io::Result<Dumped> {
    let mut socket = Socket::new(NETLINK_ROUTE)?;
    fibre_kernel::sockopt::set_receive_buffer(&socket, RECEIVE_BUFFER)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    // Nexthop objects before the routes that name them.
    let requests: Vec<Vec<u8>> = [
        RouteNetlinkMessage::GetLink(LinkMessage::default()),
        RouteNetlinkMessage::GetAddress(AddressMessage::default()),
        RouteNetlinkMessage::GetRule(RuleMessage::default()),
    ]
    .into_iter()
    .enumerate()
    .map(|(seq, r)| request(r, seq as u32 + 1))
    .chain([nexthop::dump_request(4)])
    .chain(
        [
            RouteNetlinkMessage::GetRoute(RouteMessage::default()),
            RouteNetlinkMessage::GetNeighbour(NeighbourMessage::default()),
        ]
        .into_iter()
        .enumerate()
        .map(|(seq, r)| request(r, seq as u32 + 5)),
    )
    .collect();
    let mut out = Dumped::default();
    let mut buf = vec![0u8; 1 << 20];
    for request in &requests {
        let part = dump_one(&socket, &mut buf, request, &mut each)?;
        out.malformed += part.malformed;
        if part.interrupted {
            out.interrupted = true;
            break;
        }
    }
    Ok(out)
}

/// Asks the kernel to resolve neighbours: what a packet path does for a next hop it has
/// no MAC address for, when the kernel's own forwarding (which would ask) is off. Each
/// request is `ip neigh replace ADDR dev DEV use` (`NTF_USE`): the kernel starts
/// resolving (ARP, neighbour solicitation) and announces the entry when it has it, which
/// the mirror then holds.
pub struct Resolver {
    socket: Socket,
    seq: u32,
}

impl Resolver {
    /// A netlink socket for the requests, in this thread's network namespace.
    pub fn new() -> io::Result<Resolver> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        socket.set_non_blocking(true)?;
        Ok(Resolver { socket, seq: 0 })
    }

    /// Asks for `addr` on link `ifindex`. The kernel's answer (an error for a link gone)
    /// is not awaited: the entry's announcement is the answer that matters.
    pub fn resolve(&mut self, ifindex: u32, addr: std::net::IpAddr) -> io::Result<()> {
        use netlink_packet_route::neighbour::{
            NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourState,
        };
        use netlink_packet_route::AddressFamily;
        let mut msg = NeighbourMessage::default();
        msg.header.family = if addr.is_ipv4() {
            AddressFamily::Inet
        } else {
            AddressFamily::Inet6
        };
        msg.header.ifindex = ifindex;
        msg.header.state = NeighbourState::Permanent;
        msg.header.flags = NeighbourFlags::Use;
        msg.attributes
            .push(NeighbourAttribute::Destination(match addr {
                std::net::IpAddr::V4(a) => NeighbourAddress::Inet(a),
                std::net::IpAddr::V6(a) => NeighbourAddress::Inet6(a),
            }));
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_REPLACE;
        self.seq = self.seq.wrapping_add(1);
        header.sequence_number = self.seq;
        let mut packet = NetlinkMessage::new(
            header,
            NetlinkPayload::from(RouteNetlinkMessage::NewNeighbour(msg)),
        );
        packet.finalize();
        let mut bytes = vec![0; packet.buffer_len()];
        packet.serialize(&mut bytes);
        self.socket.send(&bytes, 0)?;
        // What the kernel said of earlier requests is not needed: read it away, so
        // that its queue never fills.
        let mut buf = [0u8; 4096];
        while matches!(self.socket.recv(&mut &mut buf[..], 0), Ok(n) if n > 0) {}
        Ok(())
    }
}

/// A dump request of `msg`, sequence number `seq`, serialized.
fn request(msg: RouteNetlinkMessage, seq: u32) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    header.sequence_number = seq;
    let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(msg));
    packet.finalize();
    let mut bytes = vec![0; packet.buffer_len()];
    packet.serialize(&mut bytes);
    bytes
}

/// One dump request's answer, each message handed to `each` as it is read.
fn dump_one(
    socket: &Socket,
    buf: &mut [u8],
    request: &[u8],
    each: &mut impl FnMut(Received),
) -> io::Result<Dumped> {
    socket.send(request, 0)?;
    let mut out = Dumped::default();
    loop {
        let n = socket.recv(&mut &mut buf[..], 0)?;
        let mut at = &buf[..n];
        while at.len() >= 16 {
            let len = u32::from_ne_bytes([at[0], at[1], at[2], at[3]]) as usize;
            if len < 16 || len > at.len() {
                out.malformed += 1;
                break;
            }
            let flags = u16::from_ne_bytes([at[6], at[7]]);
            out.interrupted |= flags & NLM_F_DUMP_INTR != 0;
            match read_one(&at[..len]) {
                Ok(Some(Read::Done)) => return Ok(out),
                Ok(Some(Read::Message(m))) => each((m, flags)),
                Ok(None) => {}
                // A kernel without nexthop objects refuses their dump: there are none.
                Err(Some(code)) if -code == libc::EOPNOTSUPP || -code == libc::EINVAL => {
                    return Ok(out)
                }
                Err(Some(code)) => return Err(io::Error::from_raw_os_error(-code)),
                Err(None) => out.malformed += 1,
            }
            let step = (len + 3) & !3;
            at = &at[step.min(at.len())..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_route::route::{RouteAddress, RouteAttribute};
    use rand::{Rng, SeedableRng};

    /// A route notification as the kernel sends one, serialized.
    fn route_message() -> Vec<u8> {
        let mut r = RouteMessage::default();
        r.header.address_family = netlink_packet_route::AddressFamily::Inet;
        r.header.destination_prefix_length = 16;
        r.header.table = 254;
        r.header.kind = netlink_packet_route::route::RouteType::Unicast;
        r.attributes = vec![
            RouteAttribute::Destination(RouteAddress::Inet("10.1.0.0".parse().unwrap())),
            RouteAttribute::Gateway(RouteAddress::Inet("10.0.0.2".parse().unwrap())),
            RouteAttribute::Oif(2),
        ];
        new_route_bytes(r)
    }

    /// `RTM_NEWROUTE` of `r`, serialized as the kernel sends it.
    fn new_route_bytes(r: RouteMessage) -> Vec<u8> {
        let mut packet = NetlinkMessage::new(
            NetlinkHeader::default(),
            NetlinkPayload::from(RouteNetlinkMessage::NewRoute(r)),
        );
        packet.finalize();
        let mut bytes = vec![0; packet.buffer_len()];
        packet.serialize(&mut bytes);
        bytes
    }

    #[test]
    fn a_notification_parses_and_becomes_a_route() {
        let bytes = route_message();
        let mut out = Vec::new();
        assert_eq!(parse(&bytes, &mut out), 0);
        assert_eq!(out.len(), 1);
        let Message::Route(false, route) = &out[0].0 else {
            panic!("a route read from its bytes");
        };
        match route {
            Ok(r) => {
                assert_eq!(r.dst.to_string(), "10.1.0.0/16");
                assert_eq!(r.own_paths()[0].gateway, Some("10.0.0.2".parse().unwrap()));
                assert_eq!(r.own_paths()[0].dev, 2);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn malformed_and_cut_messages_are_counted_never_panicked_on() {
        let good = route_message();
        // Cut anywhere: the part is dropped and counted, or is no message at all.
        for n in 0..good.len() {
            let mut out = Vec::new();
            let bad = parse(&good[..n], &mut out);
            assert!(out.is_empty() || n == good.len(), "cut at {n}");
            assert!(bad <= 1);
        }
        // A good message followed by garbage keeps the good one.
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..2000 {
            let mut bytes = good.clone();
            let extra: usize = rng.gen_range(0..64);
            bytes.extend((0..extra).map(|_| rng.gen::<u8>()));
            let mut out = Vec::new();
            parse(&bytes, &mut out);
            assert!(!out.is_empty());
        }
        // Random bytes, with a plausible length in front or not.
        for _ in 0..20000 {
            let len: usize = rng.gen_range(0..96);
            let mut bytes: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            if len >= 16 && rng.gen() {
                bytes[..4].copy_from_slice(&(len as u32).to_ne_bytes());
            }
            let mut out = Vec::new();
            parse(&bytes, &mut out);
            for (m, flags) in &out {
                if let Message::Decoded(m) = m {
                    let _ = crate::convert::change(m, *flags);
                }
            }
        }
    }

    /// A random route message, as the kernel could send one: of either family, with
    /// any of the attributes a route has (several paths, metrics, a nexthop object, a
    /// preference, cache information, an encapsulation's type) or none.
    fn random_route_message(rng: &mut impl Rng) -> Vec<u8> {
        use netlink_packet_route::route::{
            RouteCacheInfo, RouteMetric, RouteNextHop, RoutePreference, RouteProtocol, RouteScope,
            RouteType,
        };
        let v6 = rng.gen_bool(0.5);
        let addr = |rng: &mut dyn rand::RngCore| {
            if v6 {
                RouteAddress::Inet6(std::net::Ipv6Addr::from(
                    (0x2001_0db8_u128 << 96) | u128::from(rng.next_u32() & 0xff00),
                ))
            } else {
                RouteAddress::Inet(std::net::Ipv4Addr::from(
                    0x0a00_0000 | (rng.next_u32() & 0xff00),
                ))
            }
        };
        let mut r = RouteMessage::default();
        r.header.address_family = if v6 {
            netlink_packet_route::AddressFamily::Inet6
        } else {
            netlink_packet_route::AddressFamily::Inet
        };
        r.header.destination_prefix_length = [0, 8, 16, 24, 32, 64, 200][rng.gen_range(0..7)];
        r.header.table = [254, 255, 0][rng.gen_range(0..3)];
        r.header.tos = [0, 8][rng.gen_range(0..2)];
        r.header.protocol = RouteProtocol::from([2u8, 3, 4, 186][rng.gen_range(0..4)]);
        r.header.scope = RouteScope::from([0u8, 253, 254][rng.gen_range(0..3)]);
        r.header.kind = RouteType::from([1u8, 2, 6, 7, 5, 9][rng.gen_range(0..6)]);
        let mut attrs = Vec::new();
        for _ in 0..rng.gen_range(0..7) {
            attrs.push(match rng.gen_range(0..13) {
                0 | 1 => RouteAttribute::Destination(addr(rng)),
                2 => RouteAttribute::Gateway(addr(rng)),
                3 => RouteAttribute::Oif(rng.gen_range(0..4)),
                4 => RouteAttribute::Table(rng.gen_range(250..260)),
                5 => RouteAttribute::Priority(rng.gen_range(0..3)),
                6 => RouteAttribute::PrefSource(addr(rng)),
                7 => RouteAttribute::NhId(rng.gen_range(1..4)),
                8 => RouteAttribute::Preference(RoutePreference::from(rng.gen::<u8>() & 3)),
                9 => RouteAttribute::CacheInfo(RouteCacheInfo::parse(&[0; 32]).unwrap()),
                10 => RouteAttribute::Metrics(vec![RouteMetric::Mtu(1400)]),
                11 => RouteAttribute::Source(addr(rng)),
                _ => {
                    let mut hop = RouteNextHop::default();
                    hop.interface_index = rng.gen_range(1..4);
                    hop.attributes = vec![RouteAttribute::Gateway(addr(rng))];
                    RouteAttribute::MultiPath(vec![hop.clone(), hop])
                }
            });
        }
        r.attributes = attrs;
        new_route_bytes(r)
    }

    /// A route read straight from its bytes is the route the netlink crates' decoding
    /// gives, for random messages and for random corruptions of them: where the bytes
    /// are read, they are read as the crates read them; where not, the crates decode.
    #[test]
    fn a_route_read_from_its_bytes_is_the_decoded_one() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let (mut read, mut decoded) = (0, 0);
        for i in 0..50_000 {
            let mut bytes = random_route_message(&mut rng);
            if i % 2 == 1 {
                // Corrupted past the netlink header.
                for _ in 0..rng.gen_range(1..4) {
                    let at = rng.gen_range(16..bytes.len());
                    bytes[at] = rng.gen();
                }
            }
            let Some(fast) = crate::convert::route_from_bytes(&bytes[16..]) else {
                decoded += 1;
                continue;
            };
            read += 1;
            let library = match NetlinkMessage::<RouteNetlinkMessage>::deserialize(&bytes) {
                Ok(NetlinkMessage {
                    payload: NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewRoute(m)),
                    ..
                }) => crate::convert::route(&m),
                other => panic!("read from the bytes, not decoded: {other:?} {bytes:?}"),
            };
            assert_eq!(fast, library, "{bytes:?}");
        }
        // Both ways taken, many times each.
        assert!(read > 10_000 && decoded > 10_000, "{read} {decoded}");
    }
}
