//! `fibre daemon --forward` end to end, as root: host A, veth, a router namespace whose
//! kernel does not forward (`ip_forward=0`, IPv6 `forwarding=0`) and whose daemon does,
//! veth, host B. Real pings, a real TCP transfer, real ICMP errors, routes changed with
//! `ip route` while traffic flows, malformed frames thrown at the router.

use fibre_dataplane::packet::PacketSocket;
use fibre_kernel::netns::Namespace;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A running `fibre daemon --forward`; stopped when dropped.
struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Daemon {
    /// Starts the daemon reading and sending by `io` (`xdp` or `packet`).
    fn start(router: &Namespace, io: &str) -> Daemon {
        let socket = std::env::temp_dir().join(format!("fibre-{}.sock", router.name()));
        let child = Command::new(env!("CARGO_BIN_EXE_fibre"))
            .args(["daemon", "--netns", router.name(), "--socket"])
            .arg(&socket)
            .args(["--forward", "r0,r1", "--workers", "2", "--io", io])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("fibre daemon starts");
        let d = Daemon { child, socket };
        wait_for("the workers", || {
            d.socket.exists() && d.stats().get("forwarding").is_some()
        });
        d
    }

    fn stats(&self) -> Value {
        let out = Command::new(env!("CARGO_BIN_EXE_fibre"))
            .args(["ctl", "--socket"])
            .arg(&self.socket)
            .args(["stats", "--json"])
            .output()
            .expect("fibre ctl runs");
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    fn fate(&self, name: &str) -> u64 {
        self.stats()["forwarding"]["fates"][name]
            .as_u64()
            .unwrap_or(0)
    }
}

impl Daemon {
    /// Stops the daemon with SIGTERM, as an operator does, and waits for it to end.
    fn terminate(mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "fibre daemon ended {status}");
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Waits until `done` holds; the bound only guards against a hang.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "waited in vain for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs a command inside a namespace.
fn exec(ns: &Namespace, args: &[&str]) -> Output {
    Command::new("ip")
        .args(["netns", "exec", ns.name()])
        .args(args)
        .output()
        .expect("ip netns exec")
}

fn ping(ns: &Namespace, args: &[&str]) -> (bool, String) {
    let mut all = vec!["ping", "-n", "-c", "2", "-i", "0.2", "-W", "2"];
    all.extend(args);
    let out = exec(ns, &all);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.success(), text)
}

/// Host A (`h0`, 10.0.0.2, fd00::2) — `r0` router `r1` — host B (`h1`, 10.0.1.2, fd01::2,
/// and 10.9.9.9 on its loopback); `r1` and `h1` with an MTU of 1400. The hosts keep
/// their links' offloads as a new veth has them: they leave TCP and UDP checksums
/// partial for a device to finish, and hand over TCP segments of up to 64 KiB; the
/// router has GRO on, as an operator may, so that what fibre reads through `AF_PACKET`
/// is merged too.
fn topology() -> (Namespace, Namespace, Namespace) {
    let a = Namespace::create("fwd-a").unwrap();
    let r = Namespace::create("fwd-r").unwrap();
    let b = Namespace::create("fwd-b").unwrap();
    for ns in [&a, &r, &b] {
        for (k, v) in [
            ("net.ipv6.conf.all.accept_dad", "0"),
            ("net.ipv6.conf.default.accept_dad", "0"),
        ] {
            ns.sysctl(k, v).unwrap();
        }
    }
    for (k, v) in [
        ("net.ipv4.ip_forward", "0"),
        ("net.ipv6.conf.all.forwarding", "0"),
    ] {
        r.sysctl(k, v).unwrap();
    }
    a.ip(&[
        "link",
        "add",
        "h0",
        "numtxqueues",
        "2",
        "numrxqueues",
        "2",
        "type",
        "veth",
        "peer",
        "name",
        "r0",
        "numtxqueues",
        "2",
        "numrxqueues",
        "2",
        "netns",
        r.name(),
    ])
    .unwrap();
    b.ip(&[
        "link",
        "add",
        "h1",
        "numtxqueues",
        "2",
        "numrxqueues",
        "2",
        "type",
        "veth",
        "peer",
        "name",
        "r1",
        "numtxqueues",
        "2",
        "numrxqueues",
        "2",
        "netns",
        r.name(),
    ])
    .unwrap();
    a.batch(
        "link set lo up\naddr add 10.0.0.2/24 dev h0\naddr add fd00::2/64 dev h0\nlink set h0 up\n\
         route add default via 10.0.0.1\nroute add default via fd00::1\n",
    )
    .unwrap();
    b.batch(
        "link set lo up\nlink set h1 mtu 1400\naddr add 10.0.1.2/24 dev h1\naddr add fd01::2/64 dev h1\n\
         addr add 10.9.9.9/32 dev lo\nlink set h1 up\nroute add default via 10.0.1.1\nroute add default via fd01::1\n",
    )
    .unwrap();
    r.batch(
        "link set lo up\nlink set r1 mtu 1400\naddr add 10.0.0.1/24 dev r0\naddr add fd00::1/64 dev r0\n\
         addr add 10.0.1.1/24 dev r1\naddr add fd01::1/64 dev r1\nlink set r0 up\nlink set r1 up\n\
         route add 10.9.9.0/24 via 10.0.1.2\nroute add unreachable 10.66.0.0/16\nroute add unreachable 2001:db8:66::/48\n",
    )
    .unwrap();
    for dev in ["r0", "r1"] {
        let out = exec(&r, &["ethtool", "-K", dev, "gro", "on"]);
        assert!(
            out.status.success(),
            "ethtool: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    (a, r, b)
}

/// The router's kernel forwards nothing; fibre forwards pings both ways in both
/// families, 100 MB over TCP each way in each family intact, UDP datagrams whose
/// checksums their sender left partial with valid ones, follows a route changed under
/// it, answers TTL 1, an unreachable route and a packet over the MTU with the errors the
/// kernel would send, and drops and counts malformed frames without a worker failing;
/// the router's own addresses still answer. The hosts keep their default offloads.
/// Through AF_XDP sockets, two workers on the links' two receive queues, the XDP
/// program passing the kernel's frames to it, and the packets whose checksum may be
/// partial to the workers' rings.
#[test]
#[ignore = "needs root: network namespaces, veth pairs, XDP, ping, ethtool"]
fn the_daemon_forwards_between_hosts_with_the_kernels_forwarding_off_over_af_xdp() {
    forwards_with_the_kernels_forwarding_off("xdp");
}

/// The same through AF_PACKET sockets, two workers in a fanout group per link.
#[test]
#[ignore = "needs root: network namespaces, veth pairs, AF_PACKET sockets, ping, ethtool"]
fn the_daemon_forwards_between_hosts_with_the_kernels_forwarding_off_over_af_packet() {
    forwards_with_the_kernels_forwarding_off("packet");
}

fn forwards_with_the_kernels_forwarding_off(io: &str) {
    let (a, r, b) = topology();
    // Without fibre, nothing crosses: the kernel's forwarding is off.
    let (ok, text) = ping(&a, &["-c", "1", "10.0.1.2"]);
    assert!(!ok, "forwarded without fibre: {text}");

    let daemon = Daemon::start(&r, io);
    let stats = daemon.stats();
    let used = stats["forwarding"]["io"].as_str().unwrap_or_default();
    assert!(
        used.to_lowercase().contains(&format!("af_{io}")),
        "asked {io}, got {used}"
    );
    assert_eq!(stats["forwarding"]["workers"], 2, "{stats}");
    // The router's own addresses: the kernel's, with fibre there or not.
    for (from, to) in [
        (&a, "10.0.0.1"),
        (&a, "fd00::1"),
        (&b, "10.0.1.1"),
        (&b, "fd01::1"),
    ] {
        let (ok, text) = ping(from, &[to]);
        assert!(ok, "ping {to}: {text}");
        assert!(
            text.contains("ttl=64") || text.contains("hlim=64"),
            "the router answers: {text}"
        );
    }
    for (from, to) in [
        (&a, "10.0.1.2"),
        (&a, "fd01::2"),
        (&b, "10.0.0.2"),
        (&b, "fd00::2"),
        (&a, "10.9.9.9"),
    ] {
        let (ok, text) = ping(from, &[to]);
        assert!(ok, "ping {to}: {text}");
        assert!(text.contains("ttl=63"), "one hop on: {text}");
    }

    // TTL 1, hop limit 1: time exceeded, from the router's address on the way back.
    let (_, text) = ping(&a, &["-t", "1", "10.0.1.2"]);
    assert!(
        text.contains("From 10.0.0.1") && text.contains("Time to live exceeded"),
        "{text}"
    );
    let (_, text) = ping(&a, &["-t", "1", "fd01::2"]);
    assert!(
        text.contains("From fd00::1") && text.contains("Time exceeded"),
        "{text}"
    );
    // An unreachable route.
    let (_, text) = ping(&a, &["10.66.0.1"]);
    assert!(text.contains("Destination Host Unreachable"), "{text}");
    let (_, text) = ping(&a, &["2001:db8:66::1"]);
    assert!(text.contains("Destination unreachable"), "{text}");
    // IPv4's answered by fibre. IPv6's: through AF_XDP, by fibre too; through AF_PACKET,
    // by the kernel, which sees the frame as well and answers a reject route whether it
    // forwards or not, so fibre leaves it be rather than answer twice.
    if io == "xdp" {
        wait_for("the unreachables answered", || {
            daemon.fate("icmp:host-unreachable") >= 3
        });
        assert_eq!(daemon.fate("drop:unreachable"), 0);
    } else {
        wait_for("the unreachables counted", || {
            daemon.fate("icmp:host-unreachable") >= 2 && daemon.fate("drop:unreachable") >= 2
        });
    }
    // Over r1's MTU: fragmentation needed with DF, packet too big.
    let (_, text) = ping(&a, &["-M", "do", "-s", "1400", "10.0.1.2"]);
    assert!(
        text.contains("Frag needed") && text.contains("mtu = 1400"),
        "{text}"
    );
    let (_, text) = ping(&a, &["-s", "1400", "fd01::2"]);
    assert!(
        text.contains("Packet too big") && text.contains("mtu=1400"),
        "{text}"
    );
    // Without DF, over r1's MTU: fibre cuts the echo requests into fragments, which B
    // puts back together and answers. (To B's other address: A has learned the path
    // MTU to 10.0.1.2 above, and would cut them itself.)
    let cut = daemon.fate("sent:fragmented");
    let (ok, text) = ping(&a, &["-M", "dont", "-s", "1400", "10.9.9.9"]);
    assert!(ok && text.contains("1408 bytes from 10.9.9.9"), "{text}");
    wait_for("the fragmented requests counted", || {
        daemon.fate("sent:fragmented") >= cut + 2
    });
    let made = daemon.stats()["forwarding"]["fragments_made"].as_u64();
    assert!(made >= Some(4), "two fragments a request: {made:?}");

    // A route changed under traffic steers the next packets.
    r.ip(&["route", "replace", "unreachable", "10.9.9.0/24"])
        .unwrap();
    wait_for("the change", || {
        ping(&a, &["-c", "1", "10.9.9.9"]).1.contains("Unreachable")
    });
    r.ip(&["route", "replace", "10.9.9.0/24", "via", "10.0.1.2"])
        .unwrap();
    wait_for("the change back", || ping(&a, &["-c", "1", "10.9.9.9"]).0);

    // 100 MB over TCP each way in each family, checked on arrival, the hosts'
    // checksums and segments left to a device that is not there.
    let before = daemon.stats()["forwarding"]["sent"].as_u64().unwrap_or(0);
    for (from, to, addr) in [
        (&a, &b, "10.0.1.2:5201"),
        (&b, &a, "10.0.0.2:5202"),
        (&a, &b, "[fd01::2]:5203"),
        (&b, &a, "[fd00::2]:5204"),
    ] {
        let sum = transfer(from, to, addr.parse().unwrap(), 100 << 20);
        assert_eq!(sum.0, 100 << 20, "every byte arrived at {addr}");
        assert_eq!(sum.1, sum.2, "what arrived at {addr} is what was sent");
    }
    let sent = daemon.stats()["forwarding"]["sent"].as_u64().unwrap_or(0) - before;
    assert!(
        sent > 4 * 1000,
        "the transfers went through fibre: {sent} frames sent"
    );
    assert_eq!(
        csum_errors(&a) + csum_errors(&b),
        0,
        "no host saw a bad checksum"
    );

    // UDP whose checksums A leaves partial: every datagram arrives, checked by B's
    // stack; over AF_XDP fibre finished the checksums, and what B's link received
    // carries them whole.
    let finished = daemon.stats()["forwarding"]["checksums_finished"]
        .as_u64()
        .unwrap_or(0);
    for to in ["10.0.1.2:6001", "[fd01::2]:6002"] {
        let (got, frames) = datagrams(&a, &b, to.parse().unwrap(), 300);
        assert_eq!(got, 300, "every datagram to {to} arrived whole");
        if io == "xdp" {
            assert!(frames >= 250, "B's link saw the datagrams: {frames}");
        }
    }
    assert_eq!(csum_errors(&b), 0, "B saw no bad checksum");
    if io == "xdp" {
        wait_for("fibre's count of the checksums it finished", || {
            daemon.stats()["forwarding"]["checksums_finished"].as_u64() >= Some(finished + 600)
        });
    }

    // Malformed frames at the router: dropped and counted, the workers go on.
    let router_mac = mac_of(&r, "r0");
    malformed(&a, router_mac);
    wait_for("the malformed frames counted", || {
        [
            "drop:short-header",
            "drop:bad-version",
            "drop:bad-checksum",
            "drop:bad-length",
        ]
        .iter()
        .all(|f| daemon.fate(f) >= 1)
    });
    let (ok, text) = ping(&a, &["10.0.1.2"]);
    assert!(ok, "after malformed frames: {text}");
    let stats = daemon.stats();
    // Nothing for the kernel came to fibre (through AF_XDP it could not go on).
    assert_eq!(stats["forwarding"]["kernel_unreached"], 0, "{stats}");
    assert_eq!(stats["forwarding"]["bad_descriptors"], 0, "{stats}");
    let stages = stats["forwarding"]["stages"].as_array().unwrap();
    assert!(stages
        .iter()
        .any(|s| s["stage"] == "route" && s["packets"].as_u64() > Some(4_000)));
    // Stopped as an operator stops it.
    daemon.terminate();
}

/// Segments and datagrams a host's stack found with a bad checksum, as `nstat` counts
/// them (TCP, UDP, UDP over IPv6).
fn csum_errors(ns: &Namespace) -> u64 {
    let out = exec(ns, &["nstat", "-az", "-j"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let kernel = &v["kernel"];
    ["TcpInCsumErrors", "UdpInCsumErrors", "Udp6InCsumErrors"]
        .iter()
        .map(|k| kernel[k].as_u64().unwrap_or(0))
        .sum()
}

/// Sends `n` UDP datagrams of known content from A to `to` on B (its checksums left
/// partial by A's link); (the datagrams B's socket received intact, the frames of them
/// B's link read with whole checksums).
fn datagrams(a: &Namespace, b: &Namespace, to: SocketAddr, n: usize) -> (usize, usize) {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let receiver = s.spawn(move || {
            b.enter().unwrap();
            let capture = PacketSocket::open_named("h1").unwrap();
            let socket = UdpSocket::bind(to).unwrap();
            socket
                .set_read_timeout(Some(Duration::from_millis(500)))
                .unwrap();
            ready_tx.send(()).unwrap();
            let mut got = 0;
            let mut buf = [0u8; 2048];
            let mut quiet = 0;
            while got < n && quiet < 6 {
                match socket.recv(&mut buf) {
                    Ok(k)
                        if k >= 4
                            && buf[..k]
                                == payload(u32::from_be_bytes(buf[..4].try_into().unwrap()))[..] =>
                    {
                        got += 1;
                        quiet = 0;
                    }
                    Ok(_) => {}
                    Err(_) => quiet += 1,
                }
            }
            let _ = done_rx.recv_timeout(Duration::from_secs(5));
            let mut whole = 0;
            while let Ok(Some(f)) = capture.receive_frame() {
                if udp_checksum_holds(&f, to.port()) {
                    whole += 1;
                }
            }
            (got, whole)
        });
        s.spawn(move || {
            a.enter().unwrap();
            ready_rx.recv().unwrap();
            let socket =
                UdpSocket::bind(if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }).unwrap();
            for k in 0..n as u32 {
                socket.send_to(&payload(k), to).unwrap();
                // Paced: a burst of datagrams is not the test.
                if k % 50 == 49 {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            done_tx.send(()).unwrap();
        });
        receiver.join().unwrap()
    })
}

/// Datagram `k`'s content: its number, then bytes that depend on it.
fn payload(k: u32) -> Vec<u8> {
    let mut p = k.to_be_bytes().to_vec();
    p.extend((0..(200 + k % 700)).map(|i| (i * 31 + k * 7) as u8));
    p
}

/// Whether `frame` is a UDP datagram to `port` whose checksum holds over its bytes.
fn udp_checksum_holds(frame: &[u8], port: u16) -> bool {
    let (l4, pseudo): (usize, Vec<u8>) = match frame.get(12..14) {
        Some([0x08, 0x00]) if frame.len() > 42 && frame[23] == 17 => {
            let l4 = 14 + 4 * (frame[14] & 0x0f) as usize;
            let len = (u16::from_be_bytes([frame[16], frame[17]]) as usize).saturating_sub(l4 - 14);
            let mut p = frame[26..34].to_vec();
            p.extend_from_slice(&[0, 17]);
            p.extend_from_slice(&(len as u16).to_be_bytes());
            (l4, p)
        }
        Some([0x86, 0xdd]) if frame.len() > 62 && frame[20] == 17 => {
            let mut p = frame[22..54].to_vec();
            p.extend_from_slice(&[0, 0]);
            p.extend_from_slice(&frame[18..20]);
            p.extend_from_slice(&[0, 0, 0, 17]);
            (54, p)
        }
        _ => return false,
    };
    if frame.get(l4 + 2..l4 + 4) != Some(&port.to_be_bytes()[..]) {
        return false;
    }
    let len = u16::from_be_bytes([frame[l4 + 4], frame[l4 + 5]]) as usize;
    let Some(segment) = frame.get(l4..l4 + len) else {
        return false;
    };
    let mut all = pseudo;
    all.extend_from_slice(segment);
    fold(&all) == 0xffff
}

/// The MAC address of `dev` in `ns`.
fn mac_of(ns: &Namespace, dev: &str) -> [u8; 6] {
    let out = ns.ip(&["-j", "link", "show", "dev", dev]).unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    let text = v[0]["address"].as_str().unwrap();
    let mut mac = [0u8; 6];
    for (m, p) in mac.iter_mut().zip(text.split(':')) {
        *m = u8::from_str_radix(p, 16).unwrap();
    }
    mac
}

/// Sends malformed frames from A's link to the router: a header cut short, a wrong
/// version, a wrong checksum, a total length past the frame.
fn malformed(a: &Namespace, router: [u8; 6]) {
    std::thread::scope(|s| {
        s.spawn(|| {
            a.enter().unwrap();
            let sock = PacketSocket::open_named("h0").unwrap();
            let mut good = vec![0u8; 14 + 28];
            good[..6].copy_from_slice(&router);
            good[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 9]);
            good[12..14].copy_from_slice(&[8, 0]);
            let ip = &mut good[14..34];
            ip.copy_from_slice(&[
                0x45, 0, 0, 28, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 2, 10, 0, 1, 2,
            ]);
            let sum = !fold(ip);
            good[24..26].copy_from_slice(&sum.to_be_bytes());
            let short = good[..14 + 12].to_vec();
            let mut version = good.clone();
            version[14] = 0x55;
            let mut checksum = good.clone();
            checksum[24] ^= 0xff;
            let mut length = good.clone();
            length[16..18].copy_from_slice(&400u16.to_be_bytes());
            length[24..26].fill(0);
            let sum = !fold(&length[14..34]);
            length[24..26].copy_from_slice(&sum.to_be_bytes());
            for f in [short, version, checksum, length] {
                sock.send_frame(&f).unwrap();
            }
        })
        .join()
        .unwrap()
    });
}

/// The ones' complement sum of `h` (an odd last byte padded with zero).
fn fold(h: &[u8]) -> u16 {
    let mut s: u32 = h
        .chunks(2)
        .map(|w| u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]) as u32)
        .sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// Sends `n` bytes of a known stream over TCP from host `a` to `to` on host `b`; (bytes
/// received, the stream's checksum as sent, as received).
fn transfer(a: &Namespace, b: &Namespace, to: SocketAddr, n: usize) -> (usize, u64, u64) {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let receiver = s.spawn(move || {
            b.enter().unwrap();
            let listener = std::net::TcpListener::bind(to).unwrap();
            ready_tx.send(()).unwrap();
            let (mut conn, _) = listener.accept().unwrap();
            conn.set_read_timeout(Some(Duration::from_secs(30)))
                .unwrap();
            let mut buf = vec![0u8; 1 << 16];
            let (mut got, mut sum) = (0usize, 0u64);
            loop {
                match conn.read(&mut buf) {
                    Ok(0) => break,
                    Ok(k) => {
                        sum = checksum(sum, got, &buf[..k]);
                        got += k;
                    }
                    Err(e) => panic!("receiving: {e} after {got} bytes"),
                }
            }
            (got, sum)
        });
        let sender = s.spawn(move || {
            a.enter().unwrap();
            ready_rx.recv().unwrap();
            let mut conn = std::net::TcpStream::connect(to).unwrap();
            let mut sum = 0u64;
            let mut sent = 0usize;
            let mut chunk = vec![0u8; 1 << 16];
            while sent < n {
                let k = chunk.len().min(n - sent);
                for (i, c) in chunk[..k].iter_mut().enumerate() {
                    *c = stream_byte(sent + i);
                }
                sum = checksum(sum, sent, &chunk[..k]);
                conn.write_all(&chunk[..k]).unwrap();
                sent += k;
            }
            sum
        });
        let sent = sender.join().unwrap();
        let (got, received) = receiver.join().unwrap();
        (got, sent, received)
    })
}

/// Byte `i` of the stream: a pattern no shift of itself matches.
fn stream_byte(i: usize) -> u8 {
    (i.wrapping_mul(2654435761) >> 13) as u8
}

/// A position-weighted checksum of `data` found at `at` in the stream.
fn checksum(mut sum: u64, at: usize, data: &[u8]) -> u64 {
    for (i, &b) in data.iter().enumerate() {
        sum = sum.wrapping_add((b as u64 + 1).wrapping_mul((at + i) as u64 | 1));
    }
    sum
}
