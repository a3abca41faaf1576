//! Nexthop objects' messages (`RTM_NEWNEXTHOP`, `RTM_DELNEXTHOP`), which the netlink
//! crates do not decode yet: the framing and the attributes are `netlink-packet-core`'s
//! (`NlasIterator`); this module reads the `nhmsg` header and the few attributes fibre
//! holds, and makes the dump request.

use fibre_fib::Family;
use fibre_fib::{NexthopId, NexthopKind};
use netlink_packet_core::NlasIterator;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// `RTM_NEWNEXTHOP`.
pub const RTM_NEWNEXTHOP: u16 = 104;
/// `RTM_DELNEXTHOP`.
pub const RTM_DELNEXTHOP: u16 = 105;
/// `RTM_GETNEXTHOP`.
const RTM_GETNEXTHOP: u16 = 106;

const NHA_ID: u16 = 1;
const NHA_GROUP: u16 = 2;
const NHA_BLACKHOLE: u16 = 4;
const NHA_OIF: u16 = 5;
const NHA_GATEWAY: u16 = 6;
const NHA_ENCAP: u16 = 8;
/// `RTNH_F_ONLINK` in `nh_flags`.
const RTNH_F_ONLINK: u32 = 4;
/// The size of `struct nhmsg`.
const NHMSG: usize = 8;

/// A nexthop object as the kernel reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NexthopMessage {
    /// Its id.
    pub id: NexthopId,
    /// Its family; none for a group (its members') or a blackhole of no family.
    pub family: Option<Family>,
    /// What it is.
    pub kind: NexthopKind,
    /// The protocol that made it.
    pub protocol: u8,
}

/// Decodes the payload (after the netlink header) of a nexthop message.
pub fn decode(payload: &[u8]) -> Result<NexthopMessage, &'static str> {
    if payload.len() < NHMSG {
        return Err("a nexthop message shorter than its header");
    }
    let family = match payload[0] as i32 {
        libc::AF_INET => Some(Family::V4),
        libc::AF_INET6 => Some(Family::V6),
        _ => None,
    };
    let protocol = payload[2];
    let flags = u32::from_ne_bytes([payload[4], payload[5], payload[6], payload[7]]);
    let (mut id, mut group, mut blackhole, mut oif, mut gateway) = (None, None, false, None, None);
    for nla in NlasIterator::new(&payload[NHMSG..]) {
        let nla = nla.map_err(|_| "a malformed nexthop attribute")?;
        let v = nla.value();
        match nla.kind() {
            NHA_ID => id = Some(u32_of(v)?),
            NHA_OIF => oif = Some(u32_of(v)?),
            NHA_BLACKHOLE => blackhole = true,
            NHA_GATEWAY => {
                gateway = Some(match v.len() {
                    4 => IpAddr::V4(Ipv4Addr::new(v[0], v[1], v[2], v[3])),
                    16 => {
                        let mut b = [0u8; 16];
                        b.copy_from_slice(v);
                        IpAddr::V6(Ipv6Addr::from(b))
                    }
                    _ => return Err("a nexthop gateway of neither family"),
                })
            }
            NHA_GROUP => {
                // `struct nexthop_grp`: id (u32), weight - 1 (u8), the weight's high
                // byte (u8, newer kernels; 0 before), reserved (u16).
                if v.len() % 8 != 0 {
                    return Err("a nexthop group of partial entries");
                }
                let members: Vec<(NexthopId, u16)> = v
                    .chunks(8)
                    .map(|e| {
                        let id = u32::from_ne_bytes([e[0], e[1], e[2], e[3]]);
                        let weight = (u16::from(e[5]) << 8 | u16::from(e[4])) + 1;
                        (id, weight)
                    })
                    .collect();
                group = Some(members);
            }
            NHA_ENCAP => return Err("an encapsulation, which fibre does not hold"),
            _ => {}
        }
    }
    let id = id.ok_or("a nexthop without an id")?;
    let kind = if let Some(members) = group {
        NexthopKind::Group(members)
    } else if blackhole {
        NexthopKind::Blackhole
    } else {
        NexthopKind::Path {
            gateway,
            dev: oif.ok_or("a nexthop without a link")?,
            onlink: flags & RTNH_F_ONLINK != 0,
        }
    };
    Ok(NexthopMessage {
        id,
        family,
        kind,
        protocol,
    })
}

fn u32_of(v: &[u8]) -> Result<u32, &'static str> {
    v.get(..4)
        .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or("a short nexthop attribute")
}

/// The request for a dump of every nexthop object, sequence number `seq`.
pub fn dump_request(seq: u32) -> Vec<u8> {
    let len = (16 + NHMSG) as u32;
    let flags = netlink_packet_core::NLM_F_REQUEST | netlink_packet_core::NLM_F_DUMP;
    let mut b = Vec::with_capacity(len as usize);
    b.extend_from_slice(&len.to_ne_bytes());
    b.extend_from_slice(&RTM_GETNEXTHOP.to_ne_bytes());
    b.extend_from_slice(&flags.to_ne_bytes());
    b.extend_from_slice(&seq.to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes());
    b.extend_from_slice(&[0u8; NHMSG]);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An attribute: length, type, value, padded to 4 bytes.
    fn nla(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
        b.extend_from_slice(&kind.to_ne_bytes());
        b.extend_from_slice(value);
        while b.len() % 4 != 0 {
            b.push(0);
        }
        b
    }

    fn header(family: u8, flags: u32) -> Vec<u8> {
        let mut b = vec![family, 0, 4, 0];
        b.extend_from_slice(&flags.to_ne_bytes());
        b
    }

    #[test]
    fn paths_groups_and_blackholes_decode_as_ip_made_them() {
        let mut m = header(libc::AF_INET as u8, RTNH_F_ONLINK);
        m.extend(nla(NHA_ID, &7u32.to_ne_bytes()));
        m.extend(nla(NHA_GATEWAY, &[10, 0, 0, 2]));
        m.extend(nla(NHA_OIF, &3u32.to_ne_bytes()));
        let d = decode(&m).unwrap();
        assert_eq!(d.id, 7);
        assert_eq!(d.family, Some(Family::V4));
        assert_eq!(d.protocol, 4);
        assert_eq!(
            d.kind,
            NexthopKind::Path {
                gateway: Some("10.0.0.2".parse().unwrap()),
                dev: 3,
                onlink: true
            }
        );

        let mut m = header(0, 0);
        m.extend(nla(NHA_ID, &9u32.to_ne_bytes()));
        let mut g = Vec::new();
        for (id, w) in [(7u32, 1u16), (8, 300)] {
            g.extend_from_slice(&id.to_ne_bytes());
            g.push(((w - 1) & 0xff) as u8);
            g.push(((w - 1) >> 8) as u8);
            g.extend_from_slice(&[0, 0]);
        }
        m.extend(nla(NHA_GROUP, &g));
        let d = decode(&m).unwrap();
        assert_eq!(d.family, None);
        assert_eq!(d.kind, NexthopKind::Group(vec![(7, 1), (8, 300)]));

        let mut m = header(libc::AF_INET6 as u8, 0);
        m.extend(nla(NHA_ID, &1u32.to_ne_bytes()));
        m.extend(nla(NHA_BLACKHOLE, &[]));
        assert_eq!(decode(&m).unwrap().kind, NexthopKind::Blackhole);
    }

    #[test]
    fn malformed_messages_are_refused_not_panicked_on() {
        assert!(decode(&[1, 2, 3]).is_err());
        // No id.
        let mut m = header(libc::AF_INET as u8, 0);
        m.extend(nla(NHA_OIF, &3u32.to_ne_bytes()));
        assert!(decode(&m).is_err());
        // A gateway of 5 bytes, a short id, a group of a partial entry.
        for bad in [
            nla(NHA_GATEWAY, &[1, 2, 3, 4, 5]),
            nla(NHA_ID, &[1, 2]),
            nla(NHA_GROUP, &[1, 2, 3, 4, 5, 6]),
        ] {
            let mut m = header(libc::AF_INET as u8, 0);
            m.extend(nla(NHA_ID, &1u32.to_ne_bytes()));
            m.extend(bad);
            assert!(decode(&m).is_err());
        }
        // An attribute longer than the message.
        let mut m = header(libc::AF_INET as u8, 0);
        m.extend_from_slice(&[200, 0, 1, 0, 1, 0, 0, 0]);
        assert!(decode(&m).is_err());
        // Every truncation of a good message: an error or a message, never a panic.
        let mut good = header(libc::AF_INET as u8, 0);
        good.extend(nla(NHA_ID, &7u32.to_ne_bytes()));
        good.extend(nla(NHA_GATEWAY, &[10, 0, 0, 2]));
        good.extend(nla(NHA_OIF, &3u32.to_ne_bytes()));
        for n in 0..good.len() {
            let _ = decode(&good[..n]);
        }
    }
}
