//! `fibre forward` as a user runs it: a configuration and a capture in, a capture out.
//! Its output is held to the kernel's: the same configuration in a network namespace,
//! the same frames sent into it over veth, what the kernel sends on each link captured
//! and compared packet by packet with what fibre writes for that link, both directions,
//! IPv4 and IPv6, forwarded packets and ICMP errors alike.

mod common;

use common::fold;
use common::frames::{kernels_own, normal};
use etherparse::PacketBuilder;
use fibre_dataplane::capture::{read_capture, Frame};
use fibre_dataplane::packet::PacketSocket;
use fibre_testbed::netns::Namespace;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::DataLink;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const FIBRE: &str = env!("CARGO_BIN_EXE_fibre");

/// The router: two links, routes of every type (some with a hop limit, which the
/// router's errors and resets take), a rule, fixed neighbours. `a1` and `b1`
/// are the hosts' ends of the links (moved to another namespace on the kernel's side).
const ROUTER: &str = "\
link add a0 address 02:00:00:00:0a:00 type veth peer name a1 address 02:00:00:00:0a:01
link add b0 address 02:00:00:00:0b:00 mtu 1400 type veth peer name b1 address 02:00:00:00:0b:01
link set a0 up
link set a1 up
link set b0 up
link set b1 up
addr add 10.0.0.1/24 dev a0
addr add 10.0.1.1/24 dev b0
addr add fd00::1/64 dev a0
addr add fd01::1/64 dev b0
route add 10.1.0.0/16 via 10.0.1.2 hoplimit 34
route add 10.3.0.0/16 via 10.0.1.2 mtu 1000
route add unreachable 10.5.0.0/16
route add prohibit 10.6.0.0/16
route add blackhole 10.7.0.0/16
route add 192.0.2.0/24 via 10.0.0.2 hoplimit 33
route add 192.0.2.64/26 via 10.0.0.2 mtu 1280
route add 10.1.0.0/16 via 10.0.1.3 table 100
rule add from 192.0.2.128/25 lookup 100
route add 2001:db8:1::/48 via fd01::2 hoplimit 35
route add unreachable 2001:db8:5::/48
route add prohibit 2001:db8:6::/48
route add 2001:db8:9::/48 via fd00::2
neigh add 10.0.1.2 lladdr 02:00:00:00:0b:02 dev b0
neigh add 10.0.1.3 lladdr 02:00:00:00:0b:03 dev b0
neigh add 10.0.0.2 lladdr 02:00:00:00:0a:02 dev a0
neigh add fd01::2 lladdr 02:00:00:00:0b:02 dev b0
neigh add fd00::2 lladdr 02:00:00:00:0a:02 dev a0
neigh add fe80::99 lladdr 02:00:00:00:0a:09 dev a0
";

const A0: [u8; 6] = [2, 0, 0, 0, 0x0a, 0];
const B0: [u8; 6] = [2, 0, 0, 0, 0x0b, 0];
const HOST_A: [u8; 6] = [2, 0, 0, 0, 0x0a, 0x02];
const HOST_B: [u8; 6] = [2, 0, 0, 0, 0x0b, 0x02];

fn v6(s: &str) -> [u8; 16] {
    s.parse::<std::net::Ipv6Addr>().unwrap().octets()
}

fn udp4(from: [u8; 6], to: [u8; 6], src: [u8; 4], dst: [u8; 4], ttl: u8, n: usize) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(from, to)
        .ipv4(src, dst, ttl)
        .udp(4000, 53);
    let mut out = Vec::new();
    // A counting payload, so that fragments out of place would show.
    let payload: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
    b.write(&mut out, &payload).unwrap();
    out
}

/// An IPv4 frame with its flags and fragment offset field set to `field` (DF clear
/// unless it says so), its header checksum made again.
fn flags(mut f: Vec<u8>, field: u16) -> Vec<u8> {
    f[20..22].copy_from_slice(&field.to_be_bytes());
    f[24..26].fill(0);
    let h = etherparse::Ipv4HeaderSlice::from_slice(&f[14..])
        .unwrap()
        .to_header();
    f[24..26].copy_from_slice(&h.calc_header_checksum().to_be_bytes());
    f
}

fn udp6(from: [u8; 6], to: [u8; 6], src: &str, dst: &str, hops: u8, n: usize) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(from, to)
        .ipv6(v6(src), v6(dst), hops)
        .udp(4000, 53);
    let mut out = Vec::new();
    b.write(&mut out, &vec![0x5a; n]).unwrap();
    out
}

fn tcp4(from: [u8; 6], to: [u8; 6], src: [u8; 4], dst: [u8; 4], ttl: u8) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(from, to)
        .ipv4(src, dst, ttl)
        .tcp(40000, 443, 7, 64240)
        .syn();
    let mut out = Vec::new();
    b.write(&mut out, &[]).unwrap();
    out
}

fn ping4(from: [u8; 6], to: [u8; 6], src: [u8; 4], dst: [u8; 4], ttl: u8) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(from, to)
        .ipv4(src, dst, ttl)
        .icmpv4_echo_request(9, 1);
    let mut out = Vec::new();
    b.write(&mut out, &[1; 56]).unwrap();
    out
}

/// Frames arriving on `a0` from host A: each case that makes an error from a source of
/// its own, so that the kernel's limits per destination never bite.
fn from_a() -> Vec<Vec<u8>> {
    let s = |k: u8| [192, 0, 2, k];
    let mut out = vec![
        udp4(HOST_A, A0, s(1), [10, 1, 2, 3], 64, 8),
        udp4(HOST_A, A0, s(1), [10, 1, 2, 4], 2, 100),
        tcp4(HOST_A, A0, s(1), [10, 1, 9, 9], 64),
        ping4(HOST_A, A0, s(1), [10, 1, 2, 3], 64),
        // Through the rule to table 100's gateway.
        udp4(HOST_A, A0, s(200), [10, 1, 2, 3], 64, 8),
        udp4(HOST_A, A0, s(10), [10, 1, 2, 3], 1, 8),
        ping4(HOST_A, A0, s(11), [10, 1, 2, 3], 1),
        udp4(HOST_A, A0, s(12), [10, 5, 0, 1], 64, 8),
        udp4(HOST_A, A0, s(13), [10, 6, 0, 1], 64, 8),
        udp4(HOST_A, A0, s(14), [10, 7, 0, 1], 64, 8),
        udp4(HOST_A, A0, s(15), [11, 0, 0, 1], 64, 8),
        // Over b0's MTU with DF; at it exactly.
        udp4(HOST_A, A0, s(16), [10, 1, 0, 9], 64, 1400 - 28 + 1),
        udp4(HOST_A, A0, s(1), [10, 1, 0, 9], 64, 1400 - 28),
        // Over the route's MTU.
        udp4(HOST_A, A0, s(17), [10, 3, 0, 1], 64, 1100),
        // Without DF, over b0's MTU and over the route's: cut into fragments. Then a
        // fragment cut again: its offset (100 units of 8) added, more following.
        flags(udp4(HOST_A, A0, s(19), [10, 1, 0, 9], 64, 1380), 0),
        flags(udp4(HOST_A, A0, s(19), [10, 3, 0, 1], 64, 1472), 0),
        flags(
            udp4(HOST_A, A0, s(19), [10, 3, 0, 1], 64, 1200),
            0x2000 | 100,
        ),
        flags(udp4(HOST_A, A0, s(19), [10, 3, 0, 1], 64, 1200), 100),
        // A malformed fragment whose second piece lies past the field's last offset:
        // the sum, written unmasked, spills into the flags.
        flags(udp4(HOST_A, A0, s(19), [10, 3, 0, 1], 64, 1200), 8150),
        // A big one quoted in its error up to 576 bytes.
        udp4(HOST_A, A0, s(18), [10, 5, 0, 2], 64, 1200),
        udp6(HOST_A, A0, "2001:db8:9::1", "2001:db8:1::5", 64, 8),
        udp6(HOST_A, A0, "2001:db8:9::1", "2001:db8:1::6", 2, 300),
        udp6(HOST_A, A0, "2001:db8:9::10", "2001:db8:1::5", 1, 8),
        udp6(HOST_A, A0, "2001:db8:9::11", "2001:db8:5::5", 64, 8),
        udp6(HOST_A, A0, "2001:db8:9::12", "2001:db8:6::5", 64, 8),
        udp6(HOST_A, A0, "2001:db8:9::13", "2001:db8:77::5", 64, 8),
        udp6(
            HOST_A,
            A0,
            "2001:db8:9::14",
            "2001:db8:1::5",
            64,
            1400 - 48 + 1,
        ),
        udp6(HOST_A, A0, "2001:db8:9::1", "2001:db8:1::5", 64, 1400 - 48),
        udp6(HOST_A, A0, "fe80::99", "2001:db8:1::5", 64, 8),
    ];
    // A bad checksum: dropped by both.
    let mut bad = udp4(HOST_A, A0, s(1), [10, 1, 2, 3], 64, 8);
    bad[24] ^= 0xff;
    out.push(bad);
    out
}

/// Frames arriving on `a0` in bursts, ten from each source, so that the kernel's limits
/// per destination bite: an unreachable route (IPv4 pays twice, `ip_error` then the
/// error's own limit), TTL 1, IPv6's unreachable route (its own interval), and packets
/// too big (never limited).
fn bursts() -> Vec<Vec<u8>> {
    let s = |k: u8| [192, 0, 2, k];
    let mut out = Vec::new();
    for _ in 0..10 {
        out.push(udp4(HOST_A, A0, s(40), [10, 5, 0, 1], 64, 8));
    }
    for _ in 0..10 {
        out.push(udp4(HOST_A, A0, s(41), [10, 1, 2, 3], 1, 8));
    }
    for _ in 0..10 {
        out.push(udp6(HOST_A, A0, "2001:db8:9::40", "2001:db8:5::5", 64, 8));
    }
    for _ in 0..10 {
        out.push(udp4(HOST_A, A0, s(42), [10, 1, 0, 9], 64, 1400));
    }
    out
}

/// Frames arriving on `b0` from host B, bound for A's side.
fn from_b() -> Vec<Vec<u8>> {
    let s = |k: u8| [10, 1, 0, k];
    vec![
        udp4(HOST_B, B0, s(1), [192, 0, 2, 9], 64, 8),
        tcp4(HOST_B, B0, s(1), [192, 0, 2, 9], 30),
        udp4(HOST_B, B0, s(20), [192, 0, 2, 9], 1, 8),
        udp4(HOST_B, B0, s(21), [10, 5, 0, 1], 64, 8),
        // Over the MTU of the route to 192.0.2.64/26: with DF, then without.
        udp4(HOST_B, B0, s(22), [192, 0, 2, 70], 64, 1300),
        flags(udp4(HOST_B, B0, s(23), [192, 0, 2, 70], 64, 1300), 0),
        udp6(HOST_B, B0, "2001:db8:1::7", "2001:db8:9::1", 64, 8),
        udp6(HOST_B, B0, "2001:db8:1::20", "2001:db8:9::1", 1, 8),
        udp6(HOST_B, B0, "2001:db8:1::21", "2001:db8:6::1", 64, 8),
    ]
}

fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
    let header = PcapHeader {
        datalink: DataLink::ETHERNET,
        ..PcapHeader::default()
    };
    let mut w = PcapWriter::with_header(std::fs::File::create(path).unwrap(), header).unwrap();
    for (i, f) in frames.iter().enumerate() {
        let t = Duration::from_millis(1000 + i as u64);
        w.write_packet(&PcapPacket::new(t, f.len() as u32, f))
            .unwrap();
    }
}

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fibre-forward-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `fibre forward`; its JSON report and the frames it sent, by link.
fn fibre_forward(
    dir: &Path,
    iif: &str,
    frames: &[Vec<u8>],
    ruleset: Option<&str>,
) -> (Value, BTreeMap<String, Vec<Vec<u8>>>) {
    fibre_forward_with(dir, iif, frames, ruleset, &[])
}

/// [`fibre_forward`] with more options.
fn fibre_forward_with(
    dir: &Path,
    iif: &str,
    frames: &[Vec<u8>],
    ruleset: Option<&str>,
    options: &[&str],
) -> (Value, BTreeMap<String, Vec<Vec<u8>>>) {
    let config = dir.join("router.conf");
    std::fs::write(&config, ROUTER).unwrap();
    let input = dir.join(format!("{iif}.pcap"));
    let output = dir.join(format!("{iif}-sent.pcapng"));
    write_pcap(&input, frames);
    let mut command = Command::new(FIBRE);
    command
        .args(["forward", "--json", "--iif", iif, "--config"])
        .arg(&config)
        .arg("--in")
        .arg(&input)
        .arg("--out")
        .arg(&output)
        .args(options);
    if let Some(rules) = ruleset {
        let file = dir.join("rules.nft");
        std::fs::write(&file, rules).unwrap();
        command.arg("--ruleset").arg(file);
    }
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "fibre forward: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let sent = read_capture(&std::fs::read(&output).unwrap()).unwrap();
    let mut by_link: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
    for Frame {
        data, interface, ..
    } in sent.frames
    {
        let name = sent.interfaces[interface].clone().unwrap();
        by_link.entry(name).or_default().push(data);
    }
    (report, by_link)
}

/// The payload of the frame sent after the others ([`sentinel`]).
const SENTINEL: &[u8] = b"fibre forward test: the frames before me are all out";

/// A UDP frame from the host behind `iif_peer` that the router forwards out of its other
/// link whatever the rulesets of these tests say (a source, a destination and a port,
/// 4545, that none of them drops or translates but by masquerading), sent after the
/// frames compared: the kernel handles one link's frames in order, so once it comes out,
/// what they made has come out before it.
fn sentinel(iif_peer: &str) -> Vec<u8> {
    let (from, to, src, dst) = if iif_peer == "a1" {
        (HOST_A, A0, [192, 0, 2, 60], [10, 1, 255, 254])
    } else {
        (HOST_B, B0, [10, 0, 1, 50], [192, 0, 2, 61])
    };
    let b = PacketBuilder::ethernet2(from, to)
        .ipv4(src, dst, 64)
        .udp(4999, 4545);
    let mut out = Vec::new();
    b.write(&mut out, SENTINEL).unwrap();
    out
}

/// Whether `f` is the sentinel, forwarded (its addresses maybe translated).
fn is_sentinel(f: &[u8]) -> bool {
    f.len() >= 14 + 20 + 8 + SENTINEL.len()
        && f[12..14] == [0x08, 0x00]
        && f[23] == 17
        && f.ends_with(SENTINEL)
}

/// The kernel's side: the router namespace with `ROUTER`, the hosts' ends of its links
/// in another namespace, the frames sent in there; what each host end receives, up to
/// the sentinel sent after them.
fn kernel_forward(
    router: &Namespace,
    hosts: &Namespace,
    iif_peer: &str,
    frames: &[Vec<u8>],
) -> BTreeMap<String, Vec<Vec<u8>>> {
    std::thread::scope(|s| {
        s.spawn(|| {
            hosts.enter().unwrap();
            let a1 = PacketSocket::open_named("a1").unwrap();
            let b1 = PacketSocket::open_named("b1").unwrap();
            let into = if iif_peer == "a1" { &a1 } else { &b1 };
            // What the links said before (neighbour discovery on coming up) is not ours;
            // what they say later, `kernels_own` tells apart.
            while a1.receive_frame().unwrap().is_some() {}
            while b1.receive_frame().unwrap().is_some() {}
            let mut got: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
            // Reads what came; true if the sentinel did.
            let read = |got: &mut BTreeMap<String, Vec<Vec<u8>>>| {
                let mut sentinel_seen = false;
                for (name, sock) in [("a0", &a1), ("b0", &b1)] {
                    while let Some(f) = sock.receive_frame().unwrap() {
                        if is_sentinel(&f) {
                            sentinel_seen = true;
                        } else if !kernels_own(&f) {
                            got.entry(name.to_string()).or_default().push(f);
                        }
                    }
                }
                sentinel_seen
            };
            for f in frames {
                into.send_frame(f).unwrap();
                // Paced as the capture fibre reads is (its frames 1 ms apart), so that
                // the kernel's limits on errors see them spread alike.
                std::thread::sleep(Duration::from_millis(2));
                assert!(!read(&mut got), "a sentinel before it was sent");
            }
            into.send_frame(&sentinel(iif_peer)).unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while !read(&mut got) {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the kernel did not forward the sentinel within 10 s"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            let _ = router;
            got
        })
        .join()
        .unwrap()
    })
}

/// Waits until every link of `ns` named in `links` has its carrier (`LOWER_UP`).
fn wait_for_carrier(ns: &Namespace, links: &[&str]) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    for link in links {
        loop {
            let shown = ns.ip(&["-j", "link", "show", link]).unwrap();
            if shown.contains("\"LOWER_UP\"") {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{link} has no carrier after 10 s: {shown}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// The router's namespace with `ROUTER` (and `ruleset`, loaded with `nft -f`), its
/// links' peers in the hosts' namespace.
fn router_and_hosts(ruleset: Option<&str>) -> (Namespace, Namespace) {
    let router = Namespace::create("fwd-router").unwrap();
    let hosts = Namespace::create("fwd-hosts").unwrap();
    for (k, v) in [
        ("net.ipv4.ip_forward", "1"),
        ("net.ipv6.conf.all.forwarding", "1"),
        ("net.ipv6.conf.all.accept_dad", "0"),
        ("net.ipv6.conf.default.accept_dad", "0"),
        ("net.ipv4.conf.all.rp_filter", "0"),
        ("net.ipv4.conf.default.rp_filter", "0"),
    ] {
        router.sysctl(k, v).unwrap();
    }
    router.batch("link set lo up\n").unwrap();
    router.batch(ROUTER).unwrap();
    if let Some(rules) = ruleset {
        router.nft(&["-f", "-"], rules).unwrap();
    }
    for peer in ["a1", "b1"] {
        router
            .ip(&["link", "set", peer, "netns", hosts.name()])
            .unwrap();
        hosts.ip(&["link", "set", peer, "up"]).unwrap();
    }
    // The links' carriers come up with their peers'.
    wait_for_carrier(&router, &["a0", "b0"]);
    wait_for_carrier(&hosts, &["a1", "b1"]);
    (router, hosts)
}

/// Holds what fibre sent out of each link to what the kernel sent, frame by frame.
fn compare(
    iif: &str,
    kernel: &BTreeMap<String, Vec<Vec<u8>>>,
    fibre: &BTreeMap<String, Vec<Vec<u8>>>,
) {
    let links: Vec<&String> = kernel.keys().chain(fibre.keys()).collect();
    // What left `link`, with what two correct routers may differ in set to zero.
    let normalised = |sent: &BTreeMap<String, Vec<Vec<u8>>>, link: &String| -> Vec<Vec<u8>> {
        sent.get(link)
            .into_iter()
            .flatten()
            .cloned()
            .map(normal)
            .collect()
    };
    for link in links {
        let k = normalised(kernel, link);
        let f = normalised(fibre, link);
        for (i, (a, b)) in k.iter().zip(&f).enumerate() {
            assert_eq!(
                a, b,
                "arriving on {iif}, frame {i} out of {link}: the kernel's, then fibre's"
            );
        }
        for extra in k.iter().skip(f.len()).chain(f.iter().skip(k.len())) {
            eprintln!("{link}: extra {:02x?}", &extra[..extra.len().min(80)]);
        }
        assert_eq!(
            k.len(),
            f.len(),
            "arriving on {iif}: frames out of {link}, the kernel's and fibre's"
        );
    }
}

/// The same capture through `fibre forward` and through the kernel's forwarding, on the
/// same router, gives the same frames on each link, in the same order: forwarded
/// packets byte for byte, errors but for their IP identification or flow label.
#[test]
#[ignore = "needs root: network namespaces, veth pairs, AF_PACKET sockets"]
fn fibre_forward_sends_what_the_kernel_sends() {
    let (router, hosts) = router_and_hosts(None);
    let dir = scratch("kernel");
    for (iif, peer, frames) in [
        ("a0", "a1", from_a()),
        ("b0", "b1", from_b()),
        ("a0", "a1", bursts()),
    ] {
        let kernel = kernel_forward(&router, &hosts, peer, &frames);
        let (report, fibre) = fibre_forward(&dir, iif, &frames, None);
        compare(iif, &kernel, &fibre);
        let sent = report["sent"].as_u64().unwrap();
        assert!(sent >= frames.len() as u64 / 2, "{report}");
        if iif == "a0" && frames.len() == 40 {
            // 2 + 6 + 6 + 10 errors: the limits bit, and the comparison held.
            assert_eq!(sent, 24, "{report}");
            assert_eq!(report["unanswered"]["rate_limited"], 16, "{report}");
        }
        assert_eq!(report["frames"].as_u64(), Some(frames.len() as u64));
    }
    // Every kind of error was among them; five packets were cut in two.
    let (report, _) = fibre_forward(&dir, "a0", &from_a(), None);
    assert_eq!(report["fragments_made"], 10, "{report}");
    for fate in [
        "icmp:time-exceeded",
        "icmp:host-unreachable",
        "icmp:net-unreachable",
        "icmp:prohibited",
        "icmp:too-big",
        "icmp:beyond-scope",
        "sent:fragmented",
        "drop:bad-checksum",
    ] {
        assert!(report["fates"][fate].as_u64() > Some(0), "{fate}: {report}");
    }
    std::fs::remove_dir_all(dir).ok();
}

/// A firewall for the captures above: prerouting drops that silence the errors their
/// packets would get, forward rules by named and anonymous sets, an interval set, a
/// verdict map jumping to a chain that returns, the time to live as the forward hook
/// sees it, a fragment's offset, a length range, interface names, and an `ip6` table
/// whose policy drops.
const RULESET: &str = r#"
table inet fw {
  set quiet { type ipv4_addr; elements = { 192.0.2.10, 192.0.2.12 } }
  set far { type ipv4_addr; flags interval; elements = { 10.1.9.0/24 } }
  map by_source { type ipv4_addr : verdict; elements = { 192.0.2.17 : drop, 192.0.2.19 : jump fragments } }
  chain prerouting_filter { type filter hook prerouting priority -5; policy accept;
    ip saddr @quiet drop
    ip6 saddr { 2001:db8:9::11, 2001:db8:9::40 } drop
  }
  chain forward_filter { type filter hook forward priority 0; policy accept;
    ip daddr @far drop
    ip saddr vmap @by_source
    meta l4proto icmp ip ttl 63 drop
    ip6 daddr 2001:db8:1::6 drop
    iifname "b0" ip saddr { 10.1.0.22, 10.1.0.23 } drop
    udp dport 53 meta length 1390-1400 ip daddr 10.1.0.9 drop
  }
  chain fragments { ip frag-off & 0x1fff != 0 drop; return; }
}
table ip6 six {
  chain forward_filter { type filter hook forward priority 10; policy drop;
    ip6 saddr 2001:db8:9::1 accept
    iifname "b0" accept
  }
}
"#;

/// With a ruleset, `fibre forward --ruleset` sends what the kernel sends with the same
/// ruleset loaded: what the rules drop, neither sends; an error the kernel sends before
/// its forward hook (the time to live run out, too big), both send; one whose packet
/// prerouting drops, neither.
#[test]
#[ignore = "needs root: network namespaces, veth pairs, AF_PACKET sockets, nft"]
fn fibre_forward_with_a_ruleset_sends_what_the_kernel_sends() {
    let (router, hosts) = router_and_hosts(Some(RULESET));
    let dir = scratch("ruleset");
    let mut filtered = 0;
    for (iif, peer, frames) in [
        ("a0", "a1", from_a()),
        ("b0", "b1", from_b()),
        ("a0", "a1", bursts()),
    ] {
        let kernel = kernel_forward(&router, &hosts, peer, &frames);
        let (report, fibre) = fibre_forward(&dir, iif, &frames, Some(RULESET));
        compare(iif, &kernel, &fibre);
        filtered += report["fates"]["drop:filtered"].as_u64().unwrap_or(0);
        assert_eq!(report["frames"].as_u64(), Some(frames.len() as u64));
    }
    // Counted as the rules say, frame by frame. From A: the two sources of `quiet`
    // (their errors silenced), the interval's TCP, three fragments by the verdict map's
    // jump, the ping at TTL 64 (63 at the hook), IPv6 to 2001:db8:1::6, the UDP of 1400
    // bytes, IPv6 from 2001:db8:9::11 at prerouting: 10. From B: the fragmented datagram
    // of 10.1.0.23 (10.1.0.22's, too big, is answered before the forward hook): 1. The
    // bursts' ten IPv6 datagrams from 2001:db8:9::40: 10.
    assert_eq!(filtered, 21);
    // What fibre does not enforce is refused, named.
    let out = Command::new(FIBRE)
        .args(["forward", "--iif", "a0", "--config"])
        .arg(dir.join("router.conf"))
        .arg("--in")
        .arg(dir.join("a0.pcap"))
        .arg("--out")
        .arg(dir.join("refused.pcapng"))
        .arg("--ruleset")
        .arg({
            let f = dir.join("limit.nft");
            std::fs::write(
                &f,
                "table ip t { chain f { type filter hook forward priority 0; limit rate 1/second accept; }; }",
            )
            .unwrap();
            f
        })
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        said.contains("ip table t chain f handle") && said.contains("`limit`"),
        "{said}"
    );
    std::fs::remove_dir_all(dir).ok();
}

/// Bad input gets a clear error: a bad configuration line by file and line, a link the
/// configuration lacks; a cut capture keeps the frames before the cut and says so.
#[test]
fn bad_input_is_named_and_a_cut_capture_keeps_what_came_before() {
    let dir = scratch("input");
    let config = dir.join("router.conf");
    std::fs::write(
        &config,
        format!("{ROUTER}route add 10.9.0.0/16 via nowhere\n"),
    )
    .unwrap();
    let input = dir.join("in.pcap");
    write_pcap(&input, &from_a());
    let output = dir.join("out.pcapng");
    let run = |config: &Path, iif: &str, input: &Path| {
        Command::new(FIBRE)
            .args(["forward", "--iif", iif, "--config"])
            .arg(config)
            .arg("--in")
            .arg(input)
            .arg("--out")
            .arg(&output)
            .output()
            .unwrap()
    };
    let out = run(&config, "a0", &input);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let line = ROUTER.lines().count() + 1;
    assert!(err.contains(&format!("router.conf:{line}:")), "{err}");

    std::fs::write(&config, ROUTER).unwrap();
    let out = run(&config, "nosuch", &input);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nosuch"));

    // Without `--iif`, a pcap names no link for its frames; a pcapng's interface
    // names one, or another the router does not have.
    let without_iif = |input: &Path| {
        Command::new(FIBRE)
            .args(["forward", "--config"])
            .arg(&config)
            .arg("--in")
            .arg(input)
            .arg("--out")
            .arg(&output)
            .output()
            .unwrap()
    };
    let out = without_iif(&input);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("in.pcap: interface 0") && err.contains("--iif"),
        "{err}"
    );
    for (name, works) in [("a0", true), ("zz9", false)] {
        let named = dir.join(format!("{name}.pcapng"));
        let mut w = fibre_dataplane::capture::SentCapture::new(Vec::new()).unwrap();
        for f in from_a() {
            w.write(7, name, Duration::from_secs(1), &f).unwrap();
        }
        std::fs::write(&named, w.finish().unwrap()).unwrap();
        let out = without_iif(&named);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.success(), works, "{err}");
        if !works {
            assert!(err.contains("named zz9, no link"), "{err}");
        }
    }

    let bytes = std::fs::read(&input).unwrap();
    let cut = dir.join("cut.pcap");
    std::fs::write(&cut, &bytes[..bytes.len() - 20]).unwrap();
    let out = run(&config, "a0", &cut);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cut short"), "{err}");
    let said = String::from_utf8_lossy(&out.stdout);
    let n = from_a().len() - 1;
    assert!(said.starts_with(&format!("{n} frames in on a0")), "{said}");
    assert!(
        said.contains("route") && said.contains("ns/packet"),
        "{said}"
    );
    std::fs::remove_dir_all(dir).ok();
}

/// NAT for the captures below: port forwards from B's side (`dnat`, to an address and
/// port, to an address alone), a source block translated into a range of addresses
/// (which one each source gets is the kernel's hash of the addresses), the rest
/// masqueraded out of `b0`, IPv4 and IPv6.
const NAT_RULESET: &str = r#"
table ip nat {
  chain pre { type nat hook prerouting priority dstnat;
    iifname "b0" tcp dport 8080 dnat to 10.0.0.2:80
    iifname "b0" udp dport 5353 dnat to 192.0.2.9
  }
  chain post { type nat hook postrouting priority srcnat;
    ip saddr 192.0.2.128/25 oifname "b0" snat to 10.0.1.100-10.0.1.120
    oifname "b0" masquerade
  }
}
table ip6 nat {
  chain post { type nat hook postrouting priority srcnat; oifname "b0" masquerade; }
}
"#;

/// A UDP, TCP (SYN) or ICMP echo frame with these ports (the echo's identifier is
/// `sport`).
fn flow4(
    from: [u8; 6],
    to: [u8; 6],
    proto: u8,
    src: [u8; 4],
    dst: [u8; 4],
    ports: (u16, u16),
    ttl: u8,
) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(from, to).ipv4(src, dst, ttl);
    let mut out = Vec::new();
    match proto {
        6 => b
            .tcp(ports.0, ports.1, 1000, 64240)
            .syn()
            .write(&mut out, &[]),
        17 => b.udp(ports.0, ports.1).write(&mut out, &[7; 20]),
        _ => b.icmpv4_echo_request(ports.0, 1).write(&mut out, &[1; 16]),
    }
    .unwrap();
    out
}

/// Frames from A to B's side: flows masqueraded (UDP, TCP, an echo, a second packet of
/// a flow, one whose time to live runs out, answered quoting it as it came), twelve
/// sources of the `snat` block, IPv6 masqueraded.
fn nat_from_a() -> Vec<Vec<u8>> {
    let s = |k: u8| [192, 0, 2, k];
    let far = [10, 1, 0, 9];
    let mut out = vec![
        flow4(HOST_A, A0, 17, s(5), far, (4000, 53), 64),
        flow4(HOST_A, A0, 17, s(5), far, (4000, 53), 64),
        flow4(HOST_A, A0, 6, s(5), far, (4001, 80), 64),
        flow4(HOST_A, A0, 1, s(5), far, (77, 0), 64),
        flow4(HOST_A, A0, 17, s(7), far, (999, 53), 64),
        flow4(HOST_A, A0, 17, s(8), far, (5000, 53), 1),
    ];
    for k in 0..12 {
        out.push(flow4(
            HOST_A,
            A0,
            17,
            s(130 + 9 * k),
            far,
            (6000 + u16::from(k), 53),
            64,
        ));
    }
    for k in 0..3 {
        let b = PacketBuilder::ethernet2(HOST_A, A0)
            .ipv6(v6("2001:db8:9::5"), v6("2001:db8:1::9"), 64)
            .udp(7000 + k, 53);
        let mut f = Vec::new();
        b.write(&mut f, &[3; 12]).unwrap();
        out.push(f);
    }
    out
}

/// Frames from B's side to the router's address: the two port forwards, and a flow to a
/// port nothing forwards (the kernel's own, which neither forwards).
fn nat_from_b() -> Vec<Vec<u8>> {
    let far = [10, 1, 0, 9];
    let router = [10, 0, 1, 1];
    vec![
        flow4(HOST_B, B0, 6, far, router, (5555, 8080), 64),
        flow4(HOST_B, B0, 17, far, router, (6000, 5353), 64),
        flow4(HOST_B, B0, 17, far, router, (6000, 5353), 64),
        flow4(HOST_B, B0, 6, far, [192, 0, 2, 44], (5556, 22), 64),
    ]
}

/// With NAT, `fibre forward --ruleset` sends what the kernel sends, byte for byte: the
/// sources masqueraded with their ports kept, the addresses the `snat` range gives each
/// source (the kernel's hash), the port forwards, the error of a masqueraded flow. And
/// the same through two workers with a table each (a packet at a time, each handed to
/// its connection's owner).
#[test]
#[ignore = "needs root: network namespaces, veth pairs, AF_PACKET sockets, nft"]
fn fibre_forward_translates_as_the_kernel_does() {
    let (router, hosts) = router_and_hosts(Some(NAT_RULESET));
    let dir = scratch("nat");
    for (iif, peer, frames) in [("a0", "a1", nat_from_a()), ("b0", "b1", nat_from_b())] {
        let kernel = kernel_forward(&router, &hosts, peer, &frames);
        let (_, two) = fibre_forward_with(
            &dir,
            iif,
            &frames,
            Some(NAT_RULESET),
            &["--vector", "1", "--workers", "2"],
        );
        compare(iif, &kernel, &two);
        let (report, fibre) = fibre_forward(&dir, iif, &frames, Some(NAT_RULESET));
        compare(iif, &kernel, &fibre);
        let sent = report["sent"].as_u64().unwrap();
        assert!(sent + 2 >= frames.len() as u64, "{report}");
        if iif == "a0" {
            // The twelve of the block went to more than one address of the range.
            let sources: std::collections::BTreeSet<[u8; 4]> = kernel["b0"]
                .iter()
                .filter(|f| f[26] == 10 && f[28] == 1 && f[29] >= 100)
                .map(|f| f[26..30].try_into().unwrap())
                .collect();
            assert!(sources.len() > 2, "{sources:?}");
        }
    }
    std::fs::remove_dir_all(dir).ok();
}

/// A port forward reached from inside (hairpin NAT): a host behind `a0` connects to the
/// router's outside address, the connection is forwarded to a server behind `a0` too,
/// and masqueraded out of `a0` so that the server's replies come back through the
/// router; the server's answer is translated back to the outside address and port.
const HAIRPIN_RULESET: &str = r#"
table ip nat {
  chain pre { type nat hook prerouting priority dstnat;
    ip daddr 10.0.1.1 tcp dport 8080 dnat to 192.0.2.44:80
    ip daddr 10.0.1.1 udp dport 5353 dnat to 192.0.2.44
  }
  chain post { type nat hook postrouting priority srcnat;
    ct status dnat oifname "a0" masquerade
    oifname "b0" masquerade
  }
}
"#;

/// Hairpin NAT, byte for byte: from a host behind `a0` to the router's outside address,
/// a TCP port forward (the SYN, the server's SYN-ACK back through the router, the
/// client's ACK) and a UDP one (a datagram, its answer, another), both sent back out of
/// `a0` from the router's address there; a flow out of `b0` beside them, masqueraded.
#[test]
#[ignore = "needs root: network namespaces, veth pairs, AF_PACKET sockets, nft"]
fn fibre_forward_hairpins_as_the_kernel_does() {
    let (router, hosts) = router_and_hosts(Some(HAIRPIN_RULESET));
    let dir = scratch("hairpin");
    let (client, server, outside, inside) = (
        [192, 0, 2, 5],
        [192, 0, 2, 44],
        [10, 0, 1, 1],
        [10, 0, 0, 1],
    );
    let tcp = |src: [u8; 4], dst: [u8; 4], ports: (u16, u16), seq: u32, ack: Option<u32>, syn| {
        let b = PacketBuilder::ethernet2(HOST_A, A0)
            .ipv4(src, dst, 64)
            .tcp(ports.0, ports.1, seq, 64240);
        let b = if syn { b.syn() } else { b };
        let b = match ack {
            Some(a) => b.ack(a),
            None => b,
        };
        let mut out = Vec::new();
        b.write(&mut out, &[]).unwrap();
        out
    };
    let frames = vec![
        tcp(client, outside, (4000, 8080), 1000, None, true),
        // The server answers the router's address on `a0`, the port kept.
        tcp(server, inside, (80, 4000), 9000, Some(1001), true),
        tcp(client, outside, (4000, 8080), 1001, Some(9001), false),
        flow4(HOST_A, A0, 17, client, outside, (6000, 5353), 64),
        flow4(HOST_A, A0, 17, server, inside, (5353, 6000), 64),
        flow4(HOST_A, A0, 17, client, outside, (6000, 5353), 64),
        flow4(HOST_A, A0, 17, client, [10, 1, 0, 9], (6001, 53), 64),
    ];
    let kernel = kernel_forward(&router, &hosts, "a1", &frames);
    // A packet at a time, as the kernel took them: a reply can only follow what it
    // answers out of the router, so a live vector never holds both, but one capture
    // read as one vector would.
    let (_, two) = fibre_forward_with(
        &dir,
        "a0",
        &frames,
        Some(HAIRPIN_RULESET),
        &["--vector", "1", "--workers", "2"],
    );
    compare("a0", &kernel, &two);
    let (report, fibre) = fibre_forward_with(
        &dir,
        "a0",
        &frames,
        Some(HAIRPIN_RULESET),
        &["--vector", "1"],
    );
    compare("a0", &kernel, &fibre);
    // Every frame went on, six of them back out of `a0`, and the answers reached the
    // client from the outside address and port.
    let back = &kernel["a0"];
    assert_eq!(back.len(), 6, "{report}");
    assert_eq!(report["sent"].as_u64(), Some(7), "{report}");
    for (f, from, to) in [
        (&back[1], (outside, 8080), (client, 4000)),
        (&back[4], (outside, 5353), (client, 6000)),
    ] {
        assert_eq!(f[26..30], from.0);
        assert_eq!(f[30..34], to.0);
        assert_eq!(u16::from_be_bytes([f[34], f[35]]), from.1);
        assert_eq!(u16::from_be_bytes([f[36], f[37]]), to.1);
    }
    std::fs::remove_dir_all(dir).ok();
}

/// A ruleset that rejects: at prerouting and at forward, with each kind of answer
/// (`icmp`, `icmpv6`, `icmpx` of every code, the default, a TCP reset), both families;
/// IPv4's connections tracked (a rule reads them), so that its rejects are met on the
/// conntrack stage's way.
const REJECT_RULESET: &str = r#"
table inet filter {
  chain pre { type filter hook prerouting priority -150;
    ip daddr 10.1.0.66 reject with icmp type host-unreachable
  }
  chain through { type filter hook forward priority 0;
    ip daddr 10.1.0.9 udp dport 99 reject
    ip daddr 10.1.0.9 tcp dport 25 reject with icmpx admin-prohibited
    ip daddr 10.1.0.9 ip protocol icmp reject with icmp type net-prohibited
    ip daddr 10.1.0.10 reject with icmpx no-route
    ip daddr 10.1.0.11 reject with icmpx host-unreachable
    ip6 daddr 2001:db8:1::9 udp dport 99 reject
    ip6 daddr 2001:db8:1::9 tcp dport 25 reject with icmpv6 type admin-prohibited
    ip6 daddr 2001:db8:1::10 reject with icmpx host-unreachable
    ip6 daddr 2001:db8:1::11 reject with icmpx no-route
    ip daddr 10.1.0.12 meta l4proto tcp reject with tcp reset
    ip6 daddr 2001:db8:1::12 meta l4proto tcp reject with tcp reset
  }
}
table ip tracked {
  chain pre { type filter hook prerouting priority -160; ip daddr 10.1.0.66 ct state invalid drop; }
}
"#;

/// The IPv4 header checksum of `frame` made again.
fn fix_ipv4_checksum(frame: &mut [u8]) {
    frame[24..26].fill(0);
    let sum = !fold(&frame[14..14 + usize::from(frame[14] & 0xf) * 4]);
    frame[24..26].copy_from_slice(&sum.to_be_bytes());
}

/// `reject`, byte for byte: from A's side, packets the forward chain rejects with each
/// code, IPv4 and IPv6 (UDP, a UDP checksum of 0, TCP, ICMP), one the prerouting chain
/// rejects, and those the kernel rejects without an answer (a bad UDP or ICMPv6
/// checksum, a later fragment, an ICMP error), and one whose time to live runs out
/// first (time exceeded, not the reject); TCP segments rejected with a reset (a SYN,
/// data with an acknowledgement, a FIN, IPv6), a reset not answered. Each from a source
/// of its own, so that no limit on errors applies.
#[test]
#[ignore = "needs root: network namespaces, veth pairs, AF_PACKET sockets, nft"]
fn fibre_forward_rejects_as_the_kernel_does() {
    let (router, hosts) = router_and_hosts(Some(REJECT_RULESET));
    let dir = scratch("reject");
    let s = |k: u8| [192, 0, 2, k];
    let far = |k: u8| [10, 1, 0, k];
    let udp6 = |src: &str, dst: &str, dport: u16| {
        let mut f = Vec::new();
        PacketBuilder::ethernet2(HOST_A, A0)
            .ipv6(v6(src), v6(dst), 64)
            .udp(5000, dport)
            .write(&mut f, &[9; 12])
            .unwrap();
        f
    };
    let mut zero_sum = flow4(HOST_A, A0, 17, s(2), far(9), (4000, 99), 64);
    zero_sum[40..42].fill(0);
    let mut bad_sum = flow4(HOST_A, A0, 17, s(3), far(9), (4000, 99), 64);
    bad_sum[45] ^= 0x55;
    let mut later = flow4(HOST_A, A0, 17, s(8), far(10), (4000, 53), 64);
    later[20..22].copy_from_slice(&100u16.to_be_bytes());
    fix_ipv4_checksum(&mut later);
    // A port unreachable to 10.1.0.10, quoting a datagram.
    let mut error = flow4(HOST_A, A0, 1, s(9), far(10), (0, 0), 64);
    let quoted = flow4(HOST_A, A0, 17, far(10), s(9), (53, 4000), 63)[14..42].to_vec();
    error.truncate(34);
    error.extend_from_slice(&[3, 3, 0, 0, 0, 0, 0, 0]);
    error.extend_from_slice(&quoted);
    let total = (error.len() - 14) as u16;
    error[16..18].copy_from_slice(&total.to_be_bytes());
    fix_ipv4_checksum(&mut error);
    let sum = !fold(&error[34..]);
    error[36..38].copy_from_slice(&sum.to_be_bytes());
    let mut bad6 = udp6("2001:db8:9::7", "2001:db8:1::9", 99);
    bad6[70] ^= 0x55;
    let tcp6_to = |dst: &str| {
        let mut f = Vec::new();
        PacketBuilder::ethernet2(HOST_A, A0)
            .ipv6(v6("2001:db8:9::6"), v6(dst), 64)
            .tcp(5001, 25, 7, 64240)
            .syn()
            .write(&mut f, &[])
            .unwrap();
        f
    };
    // A TCP segment to 10.1.0.12 with these flags, numbers and data.
    let tcp4 =
        |src: [u8; 4], ports: (u16, u16), seq: u32, ack: Option<u32>, flags: u8, data: usize| {
            let b = PacketBuilder::ethernet2(HOST_A, A0)
                .ipv4(src, [10, 1, 0, 12], 64)
                .tcp(ports.0, ports.1, seq, 64240);
            let b = match ack {
                Some(a) => b.ack(a),
                None => b,
            };
            let mut f = Vec::new();
            b.write(&mut f, &vec![5u8; data]).unwrap();
            // The flags as asked (the builder sets ACK with its number).
            f[47] = flags;
            f[50..52].fill(0);
            let mut pseudo = f[26..34].to_vec();
            pseudo.extend_from_slice(&[0, 6]);
            pseudo.extend_from_slice(&((f.len() - 34) as u16).to_be_bytes());
            pseudo.extend_from_slice(&f[34..]);
            let sum = !fold(&pseudo);
            f[50..52].copy_from_slice(&sum.to_be_bytes());
            f
        };
    let frames = vec![
        flow4(HOST_A, A0, 17, s(1), far(9), (4000, 99), 64),
        zero_sum,
        bad_sum,
        flow4(HOST_A, A0, 6, s(4), far(9), (4001, 25), 64),
        flow4(HOST_A, A0, 1, s(5), far(9), (77, 0), 64),
        flow4(HOST_A, A0, 17, s(6), far(10), (4000, 53), 64),
        flow4(HOST_A, A0, 17, s(7), far(11), (4000, 53), 64),
        later,
        error,
        flow4(HOST_A, A0, 17, s(10), [10, 1, 0, 66], (4000, 53), 64),
        flow4(HOST_A, A0, 17, s(11), far(9), (4000, 99), 1),
        flow4(HOST_A, A0, 17, s(12), far(9), (4000, 98), 64),
        udp6("2001:db8:9::5", "2001:db8:1::9", 99),
        tcp6_to("2001:db8:1::9"),
        bad6,
        udp6("2001:db8:9::8", "2001:db8:1::10", 53),
        udp6("2001:db8:9::9", "2001:db8:1::11", 53),
        // Reset: a SYN, a segment with data and an acknowledgement, a FIN; a reset is
        // not answered.
        tcp4(s(13), (4002, 22), 5000, None, 0x02, 0),
        tcp4(s(14), (4003, 22), 6000, Some(777), 0x18, 100),
        tcp4(s(15), (4004, 22), 7000, None, 0x01, 10),
        tcp4(s(16), (4005, 22), 8000, None, 0x04, 0),
        tcp6_to("2001:db8:1::12"),
    ];
    let kernel = kernel_forward(&router, &hosts, "a1", &frames);
    let (report, fibre) = fibre_forward(&dir, "a0", &frames, Some(REJECT_RULESET));
    compare("a0", &kernel, &fibre);
    // Sixteen answered (eleven rejected with an error, four with a reset, one out of
    // time), one sent on (to port 98).
    assert_eq!(kernel["a0"].len(), 16, "{report}");
    assert_eq!(kernel["b0"].len(), 1, "{report}");
    assert_eq!(report["fates"]["tcp-reset"].as_u64(), Some(4), "{report}");
    assert_eq!(
        report["fates"]["icmp:rejected"].as_u64(),
        Some(11),
        "{report}"
    );
    std::fs::remove_dir_all(dir).ok();
}

/// A reset answering a segment that came in from outside goes back from the segment's
/// destination, another host's address: the kernel routes it from there all the same
/// (`ip_route_me_harder`'s `FLOWI_FLAG_ANYSRC`), so the router's rule `from
/// 192.0.2.128/25 lookup 100` sends it by table 100's 10.0.1.3, not main's 10.0.1.2.
#[test]
#[ignore = "needs root: network namespaces, veth pairs, AF_PACKET sockets, nft"]
fn a_reset_is_routed_from_the_segments_destination_as_the_kernel_routes_it() {
    const RULESET: &str = "table ip fw {
  chain forward {
    type filter hook forward priority 0; policy accept;
    ip daddr 192.0.2.200 tcp dport 22 reject with tcp reset
  }
}
";
    let (router, hosts) = router_and_hosts(Some(RULESET));
    let dir = scratch("reset-from");
    let mut syn = Vec::new();
    PacketBuilder::ethernet2(HOST_B, B0)
        .ipv4([10, 1, 0, 12], [192, 0, 2, 200], 64)
        .tcp(4000, 22, 1000, 64240)
        .syn()
        .write(&mut syn, &[])
        .unwrap();
    let frames = vec![syn];
    let kernel = kernel_forward(&router, &hosts, "b1", &frames);
    let (report, fibre) = fibre_forward(&dir, "b0", &frames, Some(RULESET));
    compare("b0", &kernel, &fibre);
    let sent = kernel.get("b0").cloned().unwrap_or_default();
    assert_eq!(sent.len(), 1, "the kernel's reset: {report}");
    assert_eq!(sent[0][..6], [2, 0, 0, 0, 0x0b, 3], "by 10.0.1.3");
    assert_eq!(report["fates"]["tcp-reset"].as_u64(), Some(1), "{report}");
    std::fs::remove_dir_all(dir).ok();
}

/// The kernel's prerouting chains see a packet before it is routed: one for the router
/// itself, or one its route drops (blackhole, prohibit), meets them too. A `reject`
/// there answers it, as the random rulesets of `random_nat.rs` found the kernel doing
/// where fibre, offline, handed the packet on and nothing answered; a `drop` stops it
/// before the host's own stack (which would answer a closed port) sees it. An IPv6
/// error about a packet to one of the router's addresses, or to the subnet-router
/// anycast address of one of its prefixes, comes from that address, whichever link it
/// is on.
#[test]
#[ignore = "needs root: network namespaces, veth pairs, AF_PACKET sockets, nft"]
fn the_prerouting_chains_stop_packets_for_the_router_as_the_kernels_do() {
    const RULESET: &str = "table inet fw {
  chain pre {
    type filter hook prerouting priority -90; policy accept;
    udp dport 7 reject
    udp dport 9 drop
  }
}
";
    let (router, hosts) = router_and_hosts(Some(RULESET));
    let dir = scratch("prerouting-local");
    let mut frames = Vec::new();
    for port in [7, 9] {
        for dst in [[10, 0, 1, 1], [10, 0, 0, 1], [10, 7, 0, 5], [10, 6, 0, 5]] {
            let mut f = Vec::new();
            PacketBuilder::ethernet2(HOST_B, B0)
                .ipv4([10, 1, 0, 12], dst, 64)
                .udp(4000, port)
                .write(&mut f, &[1; 12])
                .unwrap();
            frames.push(f);
        }
        for dst in ["fd01::1", "fd00::1", "2001:db8:6::5", "fd01::", "fd00::"] {
            let mut f = Vec::new();
            PacketBuilder::ethernet2(HOST_B, B0)
                .ipv6(v6("2001:db8:1::12"), v6(dst), 64)
                .udp(4000, port)
                .write(&mut f, &[1; 12])
                .unwrap();
            frames.push(f);
        }
    }
    let kernel = kernel_forward(&router, &hosts, "b1", &frames);
    let (report, fibre) = fibre_forward(&dir, "b0", &frames, Some(RULESET));
    compare("b0", &kernel, &fibre);
    let fates = &report["fates"];
    assert_eq!(kernel.get("b0").map(Vec::len), Some(9), "{report}");
    assert_eq!(fates["icmp:rejected"].as_u64(), Some(9), "{report}");
    assert_eq!(fates["drop:filtered"].as_u64(), Some(9), "{report}");
    assert!(fates.get("kernel:local").is_none(), "{report}");
    std::fs::remove_dir_all(dir).ok();
}

/// Two hosts' flows from the same port to the same server: the kernel keeps the first's
/// port and moves the second's, at random, within 1024-65535. fibre does the same, with
/// one worker and with two whose tables each hold one of the flows (the registry holds
/// the port the other's took): compared by those properties.
#[test]
#[ignore = "needs root: network namespaces, veth pairs, AF_PACKET sockets, nft"]
fn a_port_taken_is_moved_as_the_kernel_moves_it() {
    let (router, hosts) = router_and_hosts(Some(NAT_RULESET));
    let dir = scratch("collision");
    let far = [10, 1, 0, 9];
    // Two hosts whose flows two workers own, one each (so that only the registry
    // tells the second's worker the port is taken).
    let owner = |host: [u8; 4]| {
        let mapped = |a: [u8; 4]| {
            let mut m = [0u8; 16];
            m[10..12].fill(0xff);
            m[12..].copy_from_slice(&a);
            m
        };
        fibre_conntrack::Owners {
            workers: 2,
            me: 0,
            seed: fibre_dataplane::offline::OWNERS_SEED,
        }
        .of_tuple(&fibre_conntrack::Tuple {
            src: mapped(host),
            dst: mapped(far),
            src_port: 4000,
            dst_port: 53,
            protocol: 17,
            v6: false,
        })
    };
    let first = [192, 0, 2, 5];
    let second = (6..=99)
        .map(|h| [192, 0, 2, h])
        .find(|&h| owner(h) != owner(first))
        .expect("two owners");
    let frames = vec![
        flow4(HOST_A, A0, 17, first, far, (4000, 53), 64),
        flow4(HOST_A, A0, 17, second, far, (4000, 53), 64),
        flow4(HOST_A, A0, 17, second, far, (4000, 53), 64),
    ];
    let kernel = kernel_forward(&router, &hosts, "a1", &frames);
    let (_, fibre) = fibre_forward(&dir, "a0", &frames, Some(NAT_RULESET));
    let (_, two) = fibre_forward_with(
        &dir,
        "a0",
        &frames,
        Some(NAT_RULESET),
        &["--vector", "1", "--workers", "2"],
    );
    for sent in [&kernel, &fibre, &two] {
        let out = &sent["b0"];
        assert_eq!(out.len(), 3);
        let port = |f: &Vec<u8>| u16::from_be_bytes([f[34], f[35]]);
        assert!(out.iter().all(|f| f[26..30] == [10, 0, 1, 1]));
        assert_eq!(port(&out[0]), 4000);
        assert!(
            port(&out[1]) >= 1024 && port(&out[1]) != 4000,
            "{}",
            port(&out[1])
        );
        // The flow keeps the port it was given.
        assert_eq!(port(&out[1]), port(&out[2]));
        // The UDP checksum holds over the moved port.
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&out[1][26..34]);
        pseudo.extend_from_slice(&[0, 17]);
        pseudo.extend_from_slice(&out[1][38..40]);
        pseudo.extend_from_slice(&out[1][34..]);
        let sum = pseudo
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
            .sum::<u32>();
        let folded = (sum & 0xffff) + (sum >> 16);
        assert_eq!((folded & 0xffff) + (folded >> 16), 0xffff);
    }
    std::fs::remove_dir_all(dir).ok();
}

/// Port forwards whose errors the random rulesets of `random_nat.rs` found fibre
/// answering otherwise than the kernel: an error about a packet of a connection whose
/// destination NAT changed comes from where the packet was going (the kernel's NAT
/// makes the error look like the reply to it), the connection new or not, the packet
/// translated yet or not; and an IPv6 address range is drawn by the kernel's hash over
/// the address as it is being written.
const ERRORS_OF_PORT_FORWARDS: &str = r#"
table ip nat {
  chain pre { type nat hook prerouting priority dstnat;
    ip daddr 10.0.1.1 tcp dport 8080 dnat to 192.0.2.44:80
    ip daddr 10.0.1.1 udp dport 5353 dnat to 192.0.2.40-192.0.2.47
  }
}
table ip6 nat {
  chain pre { type nat hook prerouting priority dstnat;
    ip6 daddr fd01::1 udp dport 5353 dnat to 2001:db8:9::40-2001:db8:9::47
  }
}
table ip filter {
  chain pre { type filter hook prerouting priority -150;
    ip saddr 192.0.2.8 ct status dnat reject
  }
  chain forwarding { type filter hook forward priority filter;
    ip saddr 192.0.2.7 tcp dport 80 reject
  }
}
"#;

/// Byte for byte: from inside to the router's outside address (the errors go back out
/// of `a0`, whose own address the host would give them), a port forward's first SYN
/// whose time to live runs out (time exceeded, quoting the SYN as it came); one the
/// forward chain rejects, new; a connection's second packet rejected at prerouting
/// before NAT; datagrams of many sources to a range of addresses, IPv4 from inside and
/// IPv6 from outside.
#[test]
#[ignore = "needs root: network namespaces, veth pairs, AF_PACKET sockets, nft"]
fn errors_of_port_forwards_come_from_where_they_were_going() {
    let (router, hosts) = router_and_hosts(Some(ERRORS_OF_PORT_FORWARDS));
    let dir = scratch("port-forward-errors");
    let router_outside = [10, 0, 1, 1];
    let mut from_a = vec![
        flow4(
            HOST_A,
            A0,
            6,
            [192, 0, 2, 9],
            router_outside,
            (4000, 8080),
            1,
        ),
        flow4(
            HOST_A,
            A0,
            6,
            [192, 0, 2, 7],
            router_outside,
            (4001, 8080),
            64,
        ),
        flow4(
            HOST_A,
            A0,
            17,
            [192, 0, 2, 8],
            router_outside,
            (4002, 5353),
            64,
        ),
        flow4(
            HOST_A,
            A0,
            17,
            [192, 0, 2, 8],
            router_outside,
            (4002, 5353),
            64,
        ),
    ];
    let mut from_b = Vec::new();
    for k in 0..8u8 {
        from_a.push(flow4(
            HOST_A,
            A0,
            17,
            [192, 0, 2, 100 + 7 * k],
            router_outside,
            (5000 + u16::from(k), 5353),
            64,
        ));
        let b = PacketBuilder::ethernet2(HOST_B, B0)
            .ipv6(
                v6(&format!("2001:db8:1::{:x}", 10 + 7 * k)),
                v6("fd01::1"),
                64,
            )
            .udp(6000 + u16::from(k), 5353);
        let mut f = Vec::new();
        b.write(&mut f, &[5; 12]).unwrap();
        from_b.push(f);
    }
    let mut out_of_a = Vec::new();
    for (iif, peer, frames) in [("a0", "a1", from_a), ("b0", "b1", from_b)] {
        let kernel = kernel_forward(&router, &hosts, peer, &frames);
        let (report, fibre) = fibre_forward_with(
            &dir,
            iif,
            &frames,
            Some(ERRORS_OF_PORT_FORWARDS),
            &["--vector", "1"],
        );
        compare(iif, &kernel, &fibre);
        out_of_a.extend(kernel["a0"].clone());
        eprintln!("{report}");
    }
    // Three errors back to the inside, each from the router's outside address.
    let errors: Vec<&Vec<u8>> = (out_of_a.iter())
        .filter(|f| f[12] == 0x08 && f[23] == 1)
        .collect();
    assert_eq!(errors.len(), 3);
    for e in errors {
        assert_eq!(e[26..30], router_outside);
    }
    // The ranges' addresses: more than one of each drawn.
    let drawn = |v6: bool| -> std::collections::BTreeSet<Vec<u8>> {
        out_of_a
            .iter()
            .filter(|f| f[12] == 0x86 && v6 || f[12] == 0x08 && f[23] == 17 && !v6)
            .map(|f| {
                if v6 {
                    f[38..54].to_vec()
                } else {
                    f[30..34].to_vec()
                }
            })
            .collect()
    };
    assert!(drawn(false).len() > 2 && drawn(true).len() > 2);
    std::fs::remove_dir_all(dir).ok();
}
