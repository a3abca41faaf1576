//! Fuzzes the whole packet path: any vectors of frames go through `Pipeline::run` on a
//! router with routes of every kind (gateways, an MTU, unreachable, blackhole, prohibit,
//! a rule, local addresses), and every stage after the input stage sees them: the route
//! and neighbour stages, the rewrite, and the ICMP errors, whose builder reads the
//! offending packet again. No input may panic, and each packet meets one fate that holds:
//!
//! - a packet sent on is the one that came in, its TTL or hop limit one lower, its IPv4
//!   header checksum intact, leaving with the neighbour's MAC address and the link's own;
//! - an error sent back is well formed: lengths that agree with the frame, checksums that
//!   hold (ICMPv6 over its pseudo-header), within 576 bytes of IPv4 or 1280 of IPv6, from
//!   one of the router's addresses, to the packet's source;
//! - an IPv4 packet cut into fragments is cut well: each fragment rewritten as a
//!   forwarded packet is, its header right, every piece but the last a multiple of 8
//!   bytes, together the packet's payload at its offset;
//! - nothing else leaves, and a packet not sent is left as it came.
//!
//! The input is split into frames by a two-byte length each; a flag byte before each frame
//! may mend what random bytes rarely get right (the MAC address, the lengths, the
//! checksum), so that most frames reach the stages past the input. The frames are run as
//! two vectors through one pipeline, so the second meets what the first left (the
//! adjacencies).
#![no_main]

use fibre_headers::checksum;
use fibre_dataplane::input::{classify, Input, ETHERNET_LEN};
use fibre_dataplane::pipeline::{Arrival, Fate, Pipeline};
use fibre_dataplane::pool::Pool;
use fibre_fib::{config, LinkIndex, Snapshot, State};
use libfuzzer_sys::fuzz_target;
use std::net::IpAddr;
use std::sync::OnceLock;

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
route add default via 10.0.0.2
route add 10.1.0.0/16 via 10.0.1.2
route add 10.2.0.0/16 via 10.0.1.3
route add 10.3.0.0/16 via 10.0.1.2 mtu 1000
route add unreachable 10.5.0.0/16
route add blackhole 10.6.0.0/16
route add 10.7.0.0/16 via 10.0.1.2
rule add iif a0 to 10.7.0.0/16 prohibit
route add ::/0 via fd00::2
route add 2001:db8:1::/48 via fd01::2
route add 2001:db8:2::/48 via fd01::2 mtu 1280
route add prohibit 2001:db8:7::/48
route add unreachable 2001:db8:8::/48
";

/// The neighbours' MAC address (the gateways that have one).
const NEIGHBOUR: [u8; 6] = [0x02, 0xaa, 0, 0, 0, 2];

fn snapshot() -> &'static Snapshot {
    static SNAP: OnceLock<Snapshot> = OnceLock::new();
    SNAP.get_or_init(|| {
        let mut state = State::new();
        config::apply_text(&mut state, "config", CONFIG).expect("the configuration applies");
        state.snapshot()
    })
}

/// Resolved: the gateways 10.0.0.2, 10.0.1.2, fd00::2 and fd01::2, and the hosts on the
/// links' subnets whose last byte is even (a packet back to an odd one is unresolved).
fn neighbour(_link: LinkIndex, addr: IpAddr) -> Option<[u8; 6]> {
    let last = match addr {
        IpAddr::V4(a) => a.octets()[3],
        IpAddr::V6(a) => a.octets()[15],
    };
    (last % 2 == 0 && last != 0).then_some(NEIGHBOUR)
}

/// The frames of `data`: each a flag byte, a two-byte length and as many bytes (fewer at
/// the end); at most 256.
fn frames(mut data: &[u8], ours: [u8; 6]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while data.len() >= 3 && out.len() < 256 {
        let flags = data[0];
        let len = (u16::from_le_bytes([data[1], data[2]]) % 1600) as usize;
        let take = len.min(data.len() - 3);
        let mut frame = data[3..3 + take].to_vec();
        data = &data[3 + take..];
        mend(&mut frame, flags, ours);
        out.push(frame);
    }
    out
}

/// Mends what `flags` says of `frame`: 1, addressed to this link; 2, the IP lengths made
/// the frame's; 4, the IPv4 header checksum made right.
fn mend(frame: &mut [u8], flags: u8, ours: [u8; 6]) {
    if flags & 1 != 0 && frame.len() >= 6 {
        frame[..6].copy_from_slice(&ours);
    }
    let Some(ether) = frame.get(12..14) else {
        return;
    };
    let ether = u16::from_be_bytes([ether[0], ether[1]]);
    let ip_len = frame.len().saturating_sub(ETHERNET_LEN);
    if ether == 0x0800 && ip_len >= 20 {
        if flags & 2 != 0 {
            frame[ETHERNET_LEN + 2..ETHERNET_LEN + 4]
                .copy_from_slice(&(ip_len.min(0xffff) as u16).to_be_bytes());
        }
        let header_len = ((frame[ETHERNET_LEN] & 0xf) as usize * 4).max(20);
        if flags & 4 != 0 && ip_len >= header_len {
            let h = &mut frame[ETHERNET_LEN..ETHERNET_LEN + header_len];
            h[10..12].fill(0);
            let sum = checksum::checksum(h);
            h[10..12].copy_from_slice(&sum.to_be_bytes());
        }
    } else if ether == 0x86dd && ip_len >= 40 && flags & 2 != 0 {
        frame[ETHERNET_LEN + 4..ETHERNET_LEN + 6]
            .copy_from_slice(&((ip_len - 40).min(0xffff) as u16).to_be_bytes());
    }
}

/// The router's addresses, where its errors come from.
const MINE: [&str; 4] = ["10.0.0.1", "10.0.1.1", "fd00::1", "fd01::1"];

/// Checks the error `answer` sent back for a packet the input stage read as `came`.
fn check_error(answer: &[u8], came: &Input) {
    let ip = &answer[ETHERNET_LEN..];
    let source_of_came = match came {
        Input::V4(p) => IpAddr::V4(p.src),
        Input::V6(p) => IpAddr::V6(p.src),
        other => panic!("an error answered a frame the input stage made {other:?}"),
    };
    let mine = |a: IpAddr| MINE.iter().any(|m| m.parse::<IpAddr>().unwrap() == a);
    match u16::from_be_bytes([answer[12], answer[13]]) {
        0x0800 => {
            assert!(ip.len() <= 576, "an IPv4 error of {} bytes", ip.len());
            assert!(checksum::holds(&ip[..20]), "the error's header checksum");
            assert_eq!(u16::from_be_bytes([ip[2], ip[3]]) as usize, ip.len());
            assert!(checksum::holds(&ip[20..]), "the ICMP checksum");
            assert!(matches!(ip[20], 3 | 11), "ICMP type {}", ip[20]);
            let dst: [u8; 4] = ip[16..20].try_into().unwrap();
            let src: [u8; 4] = ip[12..16].try_into().unwrap();
            assert_eq!(IpAddr::from(dst), source_of_came);
            assert!(mine(IpAddr::from(src)), "from {src:?}, not the router's");
        }
        0x86dd => {
            assert!(ip.len() <= 1280, "an IPv6 error of {} bytes", ip.len());
            assert_eq!(u16::from_be_bytes([ip[4], ip[5]]) as usize + 40, ip.len());
            assert_eq!(ip[6], 58);
            let mut pseudo = Vec::with_capacity(ip.len());
            pseudo.extend_from_slice(&ip[8..40]);
            pseudo.extend_from_slice(&((ip.len() - 40) as u32).to_be_bytes());
            pseudo.extend_from_slice(&[0, 0, 0, 58]);
            pseudo.extend_from_slice(&ip[40..]);
            assert!(checksum::holds(&pseudo), "the ICMPv6 checksum");
            assert!(matches!(ip[40], 1..=3), "ICMPv6 type {}", ip[40]);
            let dst: [u8; 16] = ip[24..40].try_into().unwrap();
            let src: [u8; 16] = ip[8..24].try_into().unwrap();
            assert_eq!(IpAddr::from(dst), source_of_came);
            // To a link-local source, from the link's own link-local address.
            let scoped = |a: [u8; 16]| a[0] == 0xfe && a[1] & 0xc0 == 0x80;
            assert!(
                mine(IpAddr::from(src)) || (scoped(src) && scoped(dst)),
                "from {src:?}, not the router's"
            );
        }
        other => panic!("an error of EtherType {other:#06x}"),
    }
}

/// The fragments an IPv4 packet (`came`, read by the input stage as `input`) was cut
/// into: each to the neighbour from the link's `mac`, its header's checksum holding, the
/// TTL one lower, the ID, addresses and protocol the packet's; every piece but the last a
/// multiple of 8 bytes; the flags and offset field as the kernel writes it; together, at
/// their offsets, the packet's payload.
fn check_fragments(pieces: &[&[u8]], came: &[u8], input: &Input, mac: [u8; 6]) {
    let Input::V4(p) = input else {
        panic!("fragmented a frame the input stage made {input:?}");
    };
    assert!(pieces.len() >= 2, "a packet cut into one piece");
    let h0 = &came[ETHERNET_LEN..ETHERNET_LEN + 20];
    let payload = &came[ETHERNET_LEN + 20..ETHERNET_LEN + p.len as usize];
    let start = (u16::from_be_bytes([h0[6], h0[7]]) & 0x1fff) as usize * 8;
    let mut at = start;
    for (k, f) in pieces.iter().enumerate() {
        assert_eq!(&f[..6], &NEIGHBOUR, "to the neighbour");
        assert_eq!(&f[6..12], &mac, "from the link");
        let h = &f[ETHERNET_LEN..ETHERNET_LEN + 20];
        assert!(checksum::holds(h), "a fragment's header checksum");
        assert_eq!(h[8], p.ttl - 1, "the TTL one lower");
        assert_eq!(
            (&h[4..6], h[9], &h[12..20]),
            (&h0[4..6], h0[9], &h0[12..20])
        );
        let data = &f[ETHERNET_LEN + 20..];
        assert_eq!(u16::from_be_bytes([h[2], h[3]]) as usize, 20 + data.len());
        assert_eq!(data, &payload[at - start..at - start + data.len()]);
        let last = k + 1 == pieces.len();
        if !last {
            assert_eq!(data.len() % 8, 0, "a piece not the last is a multiple of 8");
        }
        // The flags and offset field as the kernel writes it: the offset in units of 8
        // (unmasked, past 8,191 into the flags), MF but on the last, DF clear.
        let more = !last || h0[6] & 0x20 != 0;
        let field = (at / 8) as u16 | if more { 0x2000 } else { 0 };
        assert_eq!(u16::from_be_bytes([h[6], h[7]]), field, "flags and offset");
        at += data.len();
    }
    assert_eq!(at - start, payload.len(), "the whole payload");
}

fuzz_target!(|data: &[u8]| {
    let snap = snapshot();
    let Some((&which, data)) = data.split_first() else {
        return;
    };
    let links: Vec<_> = snap.links().filter(|l| l.name.ends_with('0')).collect();
    let link = links[which as usize % links.len()];
    let frames = frames(data, link.mac);
    let mut pool = Pool::new(512, 2048);
    let mut ids = Vec::new();
    assert_eq!(pool.alloc(frames.len(), &mut ids), frames.len());
    for (&id, frame) in ids.iter().zip(&frames) {
        pool.fill(id, frame);
    }
    let arrival = Arrival {
        link: link.index,
        mac: link.mac,
    };
    let mut pipeline = Pipeline::new();
    let mut fates = Vec::new();
    let half = ids.len() / 2;
    // Each vector's later fragments, by the index of their packet in `ids`.
    let mut later: Vec<(usize, u32)> = Vec::new();
    for (at, vector) in [(0, &ids[..half]), (half, &ids[half..])] {
        pipeline.run(snap, &neighbour, arrival, &mut pool, vector, &mut fates);
        later.extend(pipeline.fragments.iter().map(|&(i, b)| (at + i, b)));
    }
    assert_eq!(fates.len(), frames.len(), "a fate for every packet");
    for (i, ((&id, came), fate)) in ids.iter().zip(&frames).zip(&fates).enumerate() {
        let left = pool.frame(id);
        let input = classify(came, link.mac);
        match *fate {
            Fate::Fragmented(out) => {
                let out = snap.link(out).expect("sent out of a link the router has");
                let mut pieces = vec![left];
                pieces.extend(later.iter().filter(|f| f.0 == i).map(|f| pool.frame(f.1)));
                check_fragments(&pieces, came, &input, out.mac);
            }
            Fate::Out(out) => {
                let out = snap.link(out).expect("sent out of a link the router has");
                assert_eq!(left.len(), came.len(), "a forwarded frame keeps its length");
                assert_eq!(&left[..6], &NEIGHBOUR, "to the neighbour");
                assert_eq!(&left[6..12], &out.mac, "from the link");
                // Past the MACs, only the TTL and the header checksum, or the hop limit,
                // differ from what came.
                let (changed, kept) = match input {
                    Input::V4(p) => {
                        let h = &left[ETHERNET_LEN..ETHERNET_LEN + 20];
                        assert!(checksum::holds(h), "the forwarded header's checksum");
                        assert_eq!(h[8], p.ttl - 1, "the TTL one lower");
                        (
                            ETHERNET_LEN + 8..ETHERNET_LEN + 12,
                            ETHERNET_LEN + 9..ETHERNET_LEN + 10,
                        )
                    }
                    Input::V6(p) => {
                        assert_eq!(left[ETHERNET_LEN + 7], p.hop_limit - 1, "the hop limit");
                        (ETHERNET_LEN + 7..ETHERNET_LEN + 8, 0..0)
                    }
                    other => panic!("forwarded a frame the input stage made {other:?}"),
                };
                assert_eq!(left[12..changed.start], came[12..changed.start]);
                assert_eq!(left[kept.clone()], came[kept]);
                assert_eq!(left[changed.end..], came[changed.end..]);
            }
            Fate::Icmp(_, _) => check_error(left, &input),
            Fate::Reset(_) => panic!("a reset with no rule that resets"),
            Fate::Handoff(_) => panic!("handed to another worker where there is none"),
            Fate::Kernel(_) | Fate::Drop(_) => {
                assert_eq!(left, &came[..], "a packet not sent is left as it came");
            }
        }
    }
    // Every buffer can go back.
    pool.free(&ids);
    pool.free(&later.iter().map(|f| f.1).collect::<Vec<_>>());
    assert_eq!(pool.available(), pool.count());
});
