//! The connections the kernel tracks, read over ctnetlink when fibre takes over a
//! router's forwarding: a connection opened while the kernel forwarded keeps its state
//! and its NAT binding in fibre (a masqueraded flow whose port the kernel moved keeps
//! the port it was given; the replies of a port forward are still translated back),
//! instead of being taken anew for a connection picked up mid-stream, or bound again.
//!
//! What ctnetlink gives is what the kernel gives `conntrack -L` and conntrackd: both
//! tuples (the reply one as NAT made it), the status bits, the time left, the mark, and
//! for TCP the state and each side's window scale and flags, not the windows. A
//! connection entered from it is tracked as the kernel tracks one that ctnetlink
//! creates: the first segment each way sets that side's window
//! ([`fibre_conntrack::Tcp::imported`]).
//!
//! What fibre cannot carry on exactly is left out and counted: a connection in a zone
//! other than 0, one a helper follows, one of a protocol fibre does not track, one
//! dying.

use crate::message::Attributes;
use fibre_conntrack::nat::{DST_NAT, DST_NAT_DONE, SRC_NAT, SRC_NAT_DONE};
use fibre_conntrack::tuple::UNTRACKED_HERE;
use fibre_conntrack::{Connection, Protocol, Tcp, TcpState, Tuple, ASSURED, CONFIRMED, SEEN_REPLY};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};
use std::io;

/// `NFNL_SUBSYS_CTNETLINK`.
const SUBSYS_CTNETLINK: u8 = 1;
/// `IPCTNL_MSG_CT_NEW`: a connection, as a dump gives each.
const CT_NEW: u8 = 0;
/// `IPCTNL_MSG_CT_GET`.
const CT_GET: u8 = 1;

// `CTA_*`, the attributes of a connection.
const TUPLE_ORIG: u16 = 1;
const TUPLE_REPLY: u16 = 2;
const STATUS: u16 = 3;
const PROTOINFO: u16 = 4;
const HELP: u16 = 5;
const TIMEOUT: u16 = 7;
const MARK: u16 = 8;
const ZONE: u16 = 18;

/// The status bits fibre keeps: the others (`IPS_EXPECTED`, `IPS_SEQ_ADJUST`, ...)
/// mean nothing to it.
const KEPT: u32 =
    SEEN_REPLY | ASSURED | CONFIRMED | SRC_NAT | DST_NAT | SRC_NAT_DONE | DST_NAT_DONE;
/// `IPS_DYING`.
const DYING: u32 = 1 << 9;
/// `IPS_TEMPLATE` and `IPS_UNTRACKED`.
const NOT_CONNECTIONS: u32 = 1 << 11 | 1 << 12;
/// `IPS_HELPER`.
const HELPER: u32 = 1 << 13;
/// `IPS_OFFLOAD`, `IPS_HW_OFFLOAD`: a flowtable forwards it.
const OFFLOADED: u32 = 1 << 14 | 1 << 15;

/// Why a connection the kernel tracks was not entered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Left {
    /// In a zone other than 0 (fibre tracks zone 0 alone).
    Zone,
    /// Followed by a helper, which fibre does not run.
    Helper,
    /// Of a protocol with a tracker fibre does not have: its packets are the kernel's.
    Protocol,
    /// Dying, a template, untracked, or forwarded by a flowtable.
    NotLive,
}

impl Left {
    /// The reason as an operator reads it.
    pub fn name(self) -> &'static str {
        match self {
            Left::Zone => "zone",
            Left::Helper => "helper",
            Left::Protocol => "protocol",
            Left::NotLive => "not-live",
        }
    }
}

/// What a dump of the kernel's connections gave.
#[derive(Debug, Default)]
pub struct Dump {
    /// The connections, as fibre tracks them.
    pub connections: Vec<Connection>,
    /// The connections left out, each with why.
    pub left: Vec<Left>,
    /// Messages that could not be read (dropped).
    pub malformed: u64,
    /// Why the kernel gave none, if it tracks none it can say (no connection tracking
    /// in this kernel, or no ctnetlink).
    pub unavailable: Option<String>,
}

/// Dumps the connections the kernel of this network namespace tracks, `now` being the
/// time on the clock the connections' expiry is counted on (nanoseconds).
pub fn dump(now: u64) -> io::Result<Dump> {
    let mut socket = Socket::new(NETLINK_NETFILTER)?;
    fibre_kernel::sockopt::set_receive_buffer(&socket, crate::nfnetlink::RECEIVE_BUFFER)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    socket.send(&request(), 0)?;
    let mut out = Dump::default();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = socket.recv(&mut &mut buf[..], 0)?;
        match read_all(&buf[..n], now, &mut out) {
            Ok(false) => {}
            Ok(true) => return Ok(out),
            Err(code) if unsupported(code) => {
                out.unavailable =
                    Some(format!("ctnetlink: {}", io::Error::from_raw_os_error(code)));
                return Ok(out);
            }
            Err(code) => return Err(io::Error::from_raw_os_error(code)),
        }
    }
}

/// Whether an error says the kernel has no connection tracking to dump.
fn unsupported(code: i32) -> bool {
    matches!(
        code,
        libc::EOPNOTSUPP | libc::EPROTONOSUPPORT | libc::ENOENT | libc::EAFNOSUPPORT
    )
}

/// The request: every connection of every family (`nfgen_family` 0), zone 0's and
/// others' (those are left out as they are read, and counted).
fn request() -> Vec<u8> {
    let len: u32 = 16 + 4;
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
    let mut out = Vec::with_capacity(len as usize);
    out.extend_from_slice(&len.to_ne_bytes());
    out.extend_from_slice(&(u16::from(SUBSYS_CTNETLINK) << 8 | u16::from(CT_GET)).to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&1u32.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out
}

/// Reads the messages of one receive into `out`: whether the dump ended, or the
/// kernel's error.
fn read_all(bytes: &[u8], now: u64, out: &mut Dump) -> Result<bool, i32> {
    let mut at = 0;
    while bytes.len() - at >= 16 {
        let len = u32::from_ne_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        let len = len as usize;
        if len < 16 || len > bytes.len() - at {
            // The rest cannot be framed: one malformed message, the receive's rest lost.
            out.malformed += 1;
            return Ok(false);
        }
        let m = &bytes[at..at + len];
        at += len.next_multiple_of(4).min(bytes.len() - at);
        let kind = u16::from_ne_bytes([m[4], m[5]]);
        let payload = &m[16..];
        let code = || {
            payload
                .get(..4)
                .map_or(0, |c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        };
        match kind {
            // NLMSG_ERROR, NLMSG_DONE (with the dump's error if it failed).
            2 | 3 if code() < 0 => return Err(code().wrapping_neg()),
            3 => return Ok(true),
            _ if kind == u16::from(SUBSYS_CTNETLINK) << 8 | u16::from(CT_NEW) => {
                match decode(payload, now) {
                    Ok(Ok(c)) => out.connections.push(c),
                    Ok(Err(left)) => out.left.push(left),
                    Err(_) => out.malformed += 1,
                }
            }
            _ => {}
        }
    }
    Ok(false)
}

/// Decodes one connection (the payload of a `IPCTNL_MSG_CT_NEW` after its netlink
/// header): the connection as fibre tracks it, `now` being the time its timeout counts
/// from; or why it is left out; or why the bytes are not a connection.
pub fn decode(payload: &[u8], now: u64) -> Result<Result<Connection, Left>, &'static str> {
    let family = *payload
        .first()
        .ok_or("a connection shorter than its header")?;
    let attrs = Attributes::read(
        payload
            .get(4..)
            .ok_or("a connection shorter than its header")?,
    )?;
    let v6 = match family {
        2 => false,
        10 => true,
        _ => return Err("a connection of a family neither IPv4 nor IPv6"),
    };
    let (original, zoned_original) = tuple(attrs.get(TUPLE_ORIG).ok_or("no original tuple")?, v6)?;
    let (reply, zoned_reply) = tuple(attrs.get(TUPLE_REPLY).ok_or("no reply tuple")?, v6)?;
    let status = attrs.u32(STATUS)?.ok_or("no status")?;
    let zone = match attrs.get(ZONE) {
        Some(z) => {
            u16::from_be_bytes(<[u8; 2]>::try_from(z).map_err(|_| "a zone of a length not 2")?)
        }
        None => 0,
    };
    // A zone for one direction only comes inside that direction's tuple.
    if zone != 0 || zoned_original || zoned_reply {
        return Ok(Err(Left::Zone));
    }
    if status & (DYING | NOT_CONNECTIONS | OFFLOADED) != 0 {
        return Ok(Err(Left::NotLive));
    }
    if status & HELPER != 0 || attrs.get(HELP).is_some() {
        return Ok(Err(Left::Helper));
    }
    if UNTRACKED_HERE.contains(&original.protocol) || original.protocol != reply.protocol {
        return Ok(Err(Left::Protocol));
    }
    let seconds = attrs.u32(TIMEOUT)?.unwrap_or(0);
    let protocol = match original.protocol {
        6 => {
            let info = attrs
                .get(PROTOINFO)
                .ok_or("a TCP connection without its state")?;
            Protocol::Tcp(tcp(info)?)
        }
        // As ctnetlink makes one: confirmed at once, so a stream at once if answered.
        17 => Protocol::Udp {
            stream_after: Default::default(),
        },
        1 | 58 => Protocol::Icmp,
        _ => Protocol::Generic,
    };
    Ok(Ok(Connection {
        tuples: [original, reply],
        status: status & KEPT,
        mark: attrs.u32(MARK)?.unwrap_or(0),
        expires: now
            .saturating_add(u64::from(seconds) * 1_000_000_000)
            .into(),
        protocol,
        masquerade: 0,
        kept: Default::default(),
    }))
}

/// `CTA_TUPLE_*`: `CTA_TUPLE_IP` 1 (`CTA_IP_V4_SRC` 1, `_DST` 2, `CTA_IP_V6_SRC` 3,
/// `_DST` 4), `CTA_TUPLE_PROTO` 2 (`CTA_PROTO_NUM` 1, `_SRC_PORT` 2, `_DST_PORT` 3,
/// `_ICMP_ID` 4, `_TYPE` 5, `_CODE` 6, `_ICMPV6_ID` 7, `_TYPE` 8, `_CODE` 9); and
/// whether it names a zone of its own (`CTA_TUPLE_ZONE` 3, not 0).
fn tuple(nested: &[u8], v6: bool) -> Result<(Tuple, bool), &'static str> {
    let a = Attributes::read(nested)?;
    let ip = Attributes::read(a.get(1).ok_or("a tuple without its addresses")?)?;
    let proto = Attributes::read(a.get(2).ok_or("a tuple without its protocol")?)?;
    let address = |kind: u16| -> Result<[u8; 16], &'static str> {
        let v = ip.get(kind).ok_or("a tuple without an address")?;
        if v6 {
            <[u8; 16]>::try_from(v).map_err(|_| "an IPv6 address of a length not 16")
        } else {
            let v4 = <[u8; 4]>::try_from(v).map_err(|_| "an IPv4 address of a length not 4")?;
            Ok(std::net::Ipv4Addr::from(v4).to_ipv6_mapped().octets())
        }
    };
    let (src, dst) = if v6 {
        (address(3)?, address(4)?)
    } else {
        (address(1)?, address(2)?)
    };
    let byte = |kind: u16| -> Result<u8, &'static str> {
        match proto.get(kind) {
            Some([b]) => Ok(*b),
            Some(_) => Err("a one-byte attribute of another length"),
            None => Err("a tuple without a field its protocol has"),
        }
    };
    let port = |kind: u16| -> Result<u16, &'static str> {
        let v = proto
            .get(kind)
            .ok_or("a tuple without a field its protocol has")?;
        <[u8; 2]>::try_from(v)
            .map(u16::from_be_bytes)
            .map_err(|_| "a port of a length not 2")
    };
    let protocol = byte(1)?;
    let (src_port, dst_port) = match (protocol, v6) {
        (1, false) => (port(4)?, u16::from_be_bytes([byte(5)?, byte(6)?])),
        (58, true) => (port(7)?, u16::from_be_bytes([byte(8)?, byte(9)?])),
        // Ports where the protocol has them (the kernel's generic tracker has none).
        _ => (port(2).unwrap_or(0), port(3).unwrap_or(0)),
    };
    let zoned = match a.get(3) {
        Some(z) => <[u8; 2]>::try_from(z).map_err(|_| "a zone of a length not 2")? != [0, 0],
        None => false,
    };
    Ok((
        Tuple {
            src,
            dst,
            src_port,
            dst_port,
            protocol,
            v6,
        },
        zoned,
    ))
}

/// `CTA_PROTOINFO` holding `CTA_PROTOINFO_TCP` 1: `_STATE` 1, `_WSCALE_ORIGINAL` 2,
/// `_WSCALE_REPLY` 3, `_FLAGS_ORIGINAL` 4 and `_FLAGS_REPLY` 5 (`nf_ct_tcp_flags`:
/// the flags, then a mask the kernel's dump leaves 0: the flags are taken whole).
fn tcp(info: &[u8]) -> Result<Tcp, &'static str> {
    let outer = Attributes::read(info)?;
    let a = Attributes::read(outer.get(1).ok_or("a TCP connection without its state")?)?;
    let byte = |kind: u16| match a.get(kind) {
        Some([b]) => Ok(Some(*b)),
        Some(_) => Err("a one-byte attribute of another length"),
        None => Ok(None),
    };
    let state = byte(1)?
        .and_then(TcpState::of)
        .ok_or("a TCP state the kernel does not have")?;
    let flags = |kind: u16| match a.get(kind) {
        Some([flags, _mask]) => Ok(*flags),
        Some(_) => Err("TCP flags of a length not 2"),
        None => Ok(0),
    };
    Ok(Tcp::imported(
        state,
        [byte(2)?.unwrap_or(0), byte(3)?.unwrap_or(0)],
        [flags(4)?, flags(5)?],
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An attribute, framed and padded.
    fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
        let len = 4 + value.len();
        let mut out = (len as u16).to_ne_bytes().to_vec();
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(value);
        out.resize(len.next_multiple_of(4), 0);
        out
    }

    fn nested(kind: u16, parts: &[Vec<u8>]) -> Vec<u8> {
        attr(kind | 0x8000, &parts.concat())
    }

    fn v4_tuple(kind: u16, src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        nested(
            kind,
            &[
                nested(1, &[attr(1, &src), attr(2, &dst)]),
                nested(
                    2,
                    &[
                        attr(1, &[17]),
                        attr(2, &sport.to_be_bytes()),
                        attr(3, &dport.to_be_bytes()),
                    ],
                ),
            ],
        )
    }

    /// A masqueraded UDP flow, as the kernel's dump gives it.
    fn masqueraded(status: u32, extra: &[Vec<u8>]) -> Vec<u8> {
        let mut m = vec![2, 0, 0, 0];
        m.extend(v4_tuple(
            TUPLE_ORIG,
            [10, 0, 0, 3],
            [10, 0, 1, 2],
            5000,
            7600,
        ));
        m.extend(v4_tuple(
            TUPLE_REPLY,
            [10, 0, 1, 2],
            [10, 0, 1, 1],
            7600,
            40123,
        ));
        m.extend(attr(STATUS, &status.to_be_bytes()));
        m.extend(attr(TIMEOUT, &120u32.to_be_bytes()));
        m.extend(attr(MARK, &7u32.to_be_bytes()));
        for e in extra {
            m.extend_from_slice(e);
        }
        m
    }

    #[test]
    fn a_masqueraded_flow_keeps_its_binding_and_its_time() {
        // SEEN_REPLY, ASSURED, CONFIRMED, SRC_NAT, SRC_NAT_DONE, DST_NAT_DONE and
        // SEQ_ADJUST: a masqueraded flow's status as the kernel's dump gives it.
        let c = decode(&masqueraded(0x19e | 1 << 6, &[]), 1_000)
            .unwrap()
            .unwrap();
        assert_eq!(c.tuples[0].source().to_string(), "10.0.0.3");
        assert_eq!((c.tuples[0].src_port, c.tuples[0].dst_port), (5000, 7600));
        assert_eq!(c.tuples[1].destination().to_string(), "10.0.1.1");
        assert_eq!(c.tuples[1].dst_port, 40123);
        assert!(!c.tuples[0].v6);
        // Each kept; SEQ_ADJUST (1 << 6) not.
        for bit in [
            SEEN_REPLY,
            ASSURED,
            CONFIRMED,
            SRC_NAT,
            SRC_NAT_DONE,
            DST_NAT_DONE,
        ] {
            assert_ne!(c.status & bit, 0, "{bit:#x}");
        }
        assert_eq!(c.status & (DST_NAT | 1 << 6), 0);
        assert_eq!(c.mark, 7);
        assert_eq!(c.expires.get(), 1_000 + 120_000_000_000);
        assert_eq!(
            c.protocol,
            Protocol::Udp {
                stream_after: Default::default()
            }
        );
    }

    #[test]
    fn what_fibre_cannot_carry_on_is_left_out_and_said_why() {
        let zone = attr(ZONE, &3u16.to_be_bytes());
        assert_eq!(decode(&masqueraded(0x18e, &[zone]), 0), Ok(Err(Left::Zone)));
        // A zone of the reply direction alone, inside its tuple.
        let mut m = vec![2, 0, 0, 0];
        m.extend(v4_tuple(
            TUPLE_ORIG,
            [10, 0, 0, 3],
            [10, 0, 1, 2],
            5000,
            7600,
        ));
        let reply = v4_tuple(0, [10, 0, 1, 2], [10, 0, 1, 1], 7600, 5000);
        let mut inner = reply[4..].to_vec();
        inner.extend(attr(3, &5u16.to_be_bytes()));
        m.extend(attr(TUPLE_REPLY | 0x8000, &inner));
        m.extend(attr(STATUS, &0x18eu32.to_be_bytes()));
        assert_eq!(decode(&m, 0), Ok(Err(Left::Zone)));
        let help = nested(HELP, &[attr(1, b"ftp\0")]);
        assert_eq!(
            decode(&masqueraded(0x18e, &[help]), 0),
            Ok(Err(Left::Helper))
        );
        assert_eq!(
            decode(&masqueraded(0x18e | DYING, &[]), 0),
            Ok(Err(Left::NotLive))
        );
        assert_eq!(
            decode(&masqueraded(0x18e | HELPER, &[]), 0),
            Ok(Err(Left::Helper))
        );
        assert!(decode(&masqueraded(0x18e, &[]), 0).unwrap().is_ok());
    }

    #[test]
    fn a_tcp_connection_keeps_its_state_scales_and_flags_but_no_window() {
        let mut m = vec![10, 0, 0, 0];
        let a6 = |last: u8| {
            let mut a = [0u8; 16];
            a[0] = 0xfd;
            a[15] = last;
            a
        };
        let t6 = |kind: u16, s: [u8; 16], d: [u8; 16], sp: u16, dp: u16| {
            nested(
                kind,
                &[
                    nested(1, &[attr(3, &s), attr(4, &d)]),
                    nested(
                        2,
                        &[
                            attr(1, &[6]),
                            attr(2, &sp.to_be_bytes()),
                            attr(3, &dp.to_be_bytes()),
                        ],
                    ),
                ],
            )
        };
        m.extend(t6(TUPLE_ORIG, a6(2), a6(9), 40000, 80));
        m.extend(t6(TUPLE_REPLY, a6(9), a6(2), 80, 40000));
        m.extend(attr(STATUS, &0xeu32.to_be_bytes()));
        m.extend(nested(
            PROTOINFO,
            &[nested(
                1,
                &[
                    attr(1, &[3]),
                    attr(2, &[7]),
                    attr(3, &[9]),
                    // The flags as the kernel dumps them: their mask 0.
                    attr(4, &[0x23, 0]),
                    attr(5, &[0x03, 0]),
                ],
            )],
        ));
        let c = decode(&m, 0).unwrap().unwrap();
        assert!(c.tuples[0].v6);
        assert_eq!(c.tcp_state(), Some(TcpState::Established));
        let Protocol::Tcp(t) = c.protocol else {
            panic!("not TCP")
        };
        assert_eq!((t.seen[0].scale, t.seen[1].scale), (7, 9));
        assert_eq!((t.seen[0].flags, t.seen[1].flags), (0x23, 0x03));
        assert_eq!((t.seen[0].maxwin, t.seen[1].maxwin), (0, 0));
    }

    #[test]
    fn every_cut_and_random_bytes_read_without_a_panic() {
        use rand::{Rng, SeedableRng};
        let whole = masqueraded(0x18e, &[]);
        for cut in 0..whole.len() {
            let _ = decode(&whole[..cut], 0);
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(34);
        for _ in 0..20_000 {
            let mut m = whole.clone();
            for _ in 0..rng.gen_range(1..6) {
                let i = rng.gen_range(0..m.len());
                m[i] = rng.gen();
            }
            let _ = decode(&m, u64::MAX - 5);
            let mut out = Dump::default();
            let _ = read_all(&m, 0, &mut out);
        }
    }
}
