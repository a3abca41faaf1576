//! What the end-to-end tests of `fibre daemon --forward` share: host A, a router, host
//! B in namespaces over veth, the daemon run in the router, and traffic of every kind
//! between the hosts, checked on arrival.

#![allow(dead_code)]

pub mod frames;

use fibre_dataplane::packet::PacketSocket;
pub use fibre_testbed::netns::Namespace;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A running `fibre daemon --forward`; stopped when dropped.
pub struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Daemon {
    /// Starts the daemon reading and sending by `io` (`xdp` or `packet`), two workers.
    pub fn start(router: &Namespace, io: &str) -> Daemon {
        Daemon::start_with(router, io, &["--workers", "2"])
    }

    /// Starts the daemon reading and sending by `io`, with more options.
    pub fn start_with(router: &Namespace, io: &str, options: &[&str]) -> Daemon {
        let socket = std::env::temp_dir().join(format!("fibre-{}.sock", router.name()));
        let child = Command::new(env!("CARGO_BIN_EXE_fibre"))
            .args(["daemon", "--netns", router.name(), "--socket"])
            .arg(&socket)
            .args(["--forward", "r0,r1", "--io", io])
            .args(options)
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

    /// Asserts that every thread of the daemon holds the capabilities a forwarding
    /// daemon keeps and no other, in no set, the bounding set cut to them, and
    /// `no_new_privs` set.
    pub fn assert_privileges_cut(&self) {
        use fibre_kernel::privileges::{self, mask};
        let kept = mask(&[
            privileges::NET_ADMIN,
            privileges::NET_RAW,
            privileges::IPC_LOCK,
            privileges::SYS_NICE,
            privileges::BPF,
        ]);
        let threads = privileges::of_threads(self.child.id()).expect("the daemon's threads");
        assert!(threads.len() > 2, "{threads:?}");
        for t in threads {
            assert!(t.no_new_privs, "{t:?}");
            for (set, m) in t.sets {
                let want = if matches!(set.as_str(), "Inh" | "Amb") {
                    0
                } else {
                    kept
                };
                assert_eq!(m, want, "Cap{set}: {:?}", privileges::names(m));
            }
        }
    }

    pub fn stats(&self) -> Value {
        let out = Command::new(env!("CARGO_BIN_EXE_fibre"))
            .args(["ctl", "--socket"])
            .arg(&self.socket)
            .args(["stats", "--json"])
            .output()
            .expect("fibre ctl runs");
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    /// Runs `fibre ctl` with `words`; whether it succeeded.
    pub fn ctl(&self, words: &[&str]) -> bool {
        Command::new(env!("CARGO_BIN_EXE_fibre"))
            .args(["ctl", "--socket"])
            .arg(&self.socket)
            .args(words)
            .output()
            .is_ok_and(|o| o.status.success())
    }

    /// What `fibre ctl WORDS` prints.
    pub fn ctl_text(&self, words: &[&str]) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_fibre"))
            .args(["ctl", "--socket"])
            .arg(&self.socket)
            .args(words)
            .output()
            .expect("fibre ctl runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A counter of the forwarding part of `fibre ctl stats` (0 if absent).
    pub fn counter(&self, name: &str) -> u64 {
        self.stats()["forwarding"][name].as_u64().unwrap_or(0)
    }

    pub fn fate(&self, name: &str) -> u64 {
        self.stats()["forwarding"]["fates"][name]
            .as_u64()
            .unwrap_or(0)
    }
}

impl Daemon {
    /// Stops the daemon with SIGTERM, as an operator does, and waits for it to end.
    pub fn terminate(mut self) {
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
pub fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
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
pub fn exec(ns: &Namespace, args: &[&str]) -> Output {
    Command::new("ip")
        .args(["netns", "exec", ns.name()])
        .args(args)
        .output()
        .expect("ip netns exec")
}

pub fn ping(ns: &Namespace, args: &[&str]) -> (bool, String) {
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
pub fn topology() -> (Namespace, Namespace, Namespace) {
    topology_of(2)
}

/// [`topology`] with links of `queues` receive and transmit queues.
pub fn topology_of(queues: u32) -> (Namespace, Namespace, Namespace) {
    let q = queues.to_string();
    let q = q.as_str();
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
        q,
        "numrxqueues",
        q,
        "type",
        "veth",
        "peer",
        "name",
        "r0",
        "numtxqueues",
        q,
        "numrxqueues",
        q,
        "netns",
        r.name(),
    ])
    .unwrap();
    b.ip(&[
        "link",
        "add",
        "h1",
        "numtxqueues",
        q,
        "numrxqueues",
        q,
        "type",
        "veth",
        "peer",
        "name",
        "r1",
        "numtxqueues",
        q,
        "numrxqueues",
        q,
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

/// Segments and datagrams a host's stack found with a bad checksum, as `nstat` counts
/// them (TCP, UDP, UDP over IPv6).
pub fn csum_errors(ns: &Namespace) -> u64 {
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
pub fn datagrams(a: &Namespace, b: &Namespace, to: SocketAddr, n: usize) -> (usize, usize) {
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
            room_for(&socket, n);
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

/// Gives `socket` room for `n` datagrams of up to a page each, beyond what the host's
/// limit allows a process (`SO_RCVBUFFORCE`, as root): what the router forwards must not
/// be lost at the receiver because the test's thread was late to read it on a busy
/// machine.
fn room_for(socket: &UdpSocket, n: usize) {
    use std::os::fd::AsRawFd;
    let bytes = libc::c_int::try_from(n * 4096).unwrap_or(libc::c_int::MAX);
    // SAFETY: the descriptor is the open socket's, and the option's value a c_int of
    // the length given.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&bytes as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "SO_RCVBUFFORCE: {}", std::io::Error::last_os_error());
}

/// UDP datagrams a host's stack dropped for want of room at the socket, as `nstat`
/// counts them (IPv4 and IPv6).
pub fn receive_buffer_errors(ns: &Namespace) -> u64 {
    let out = exec(ns, &["nstat", "-az", "-j"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    ["UdpRcvbufErrors", "Udp6RcvbufErrors"]
        .iter()
        .map(|k| v["kernel"][k].as_u64().unwrap_or(0))
        .sum()
}

/// Datagram `k`'s content: its number, then bytes that depend on it.
pub fn payload(k: u32) -> Vec<u8> {
    let mut p = k.to_be_bytes().to_vec();
    p.extend((0..(200 + k % 700)).map(|i| (i * 31 + k * 7) as u8));
    p
}

/// Whether `frame` is a UDP datagram to `port` whose checksum holds over its bytes.
pub fn udp_checksum_holds(frame: &[u8], port: u16) -> bool {
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
pub fn mac_of(ns: &Namespace, dev: &str) -> [u8; 6] {
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
pub fn malformed(a: &Namespace, router: [u8; 6]) {
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
pub fn fold(h: &[u8]) -> u16 {
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
pub fn transfer(a: &Namespace, b: &Namespace, to: SocketAddr, n: usize) -> (usize, u64, u64) {
    let (got, sent, received, _) = transfer_via(a, b, to, to, n);
    (got, sent, received)
}

/// [`transfer`] to a listener on `listen` on host `b`, through `connect` (an address
/// translated to it on the way); also the peer the listener saw.
pub fn transfer_via(
    a: &Namespace,
    b: &Namespace,
    listen: SocketAddr,
    connect: SocketAddr,
    n: usize,
) -> (usize, u64, u64, SocketAddr) {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let receiver = s.spawn(move || {
            b.enter().unwrap();
            let listener = std::net::TcpListener::bind(listen).unwrap();
            ready_tx.send(()).unwrap();
            let (mut conn, peer) = listener.accept().unwrap();
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
            (got, sum, peer)
        });
        let sender = s.spawn(move || {
            a.enter().unwrap();
            ready_rx.recv().unwrap();
            let mut conn = std::net::TcpStream::connect(connect).unwrap();
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
        let (got, received, peer) = receiver.join().unwrap();
        (got, sent, received, peer)
    })
}

/// Byte `i` of the stream: a pattern no shift of itself matches.
pub fn stream_byte(i: usize) -> u8 {
    (i.wrapping_mul(2654435761) >> 13) as u8
}

/// A position-weighted checksum of `data` found at `at` in the stream.
pub fn checksum(mut sum: u64, at: usize, data: &[u8]) -> u64 {
    for (i, &b) in data.iter().enumerate() {
        sum = sum.wrapping_add((b as u64 + 1).wrapping_mul((at + i) as u64 | 1));
    }
    sum
}

/// Sends `per_flow` datagrams on each of `flows` UDP flows (source ports 7000 on) from
/// host `a` to `to` on host `b`, paced at about `rate` a second, and calls `during` on a
/// thread of its own once half of them are sent; how many of each flow arrived, by
/// source port.
pub fn flows(
    a: &Namespace,
    b: &Namespace,
    to: SocketAddr,
    flows: u16,
    per_flow: usize,
    rate: u64,
    during: impl FnOnce() + Send,
) -> std::collections::BTreeMap<u16, usize> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let receiver = s.spawn(move || {
            b.enter().unwrap();
            let socket = UdpSocket::bind(to).unwrap();
            socket
                .set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            ready_tx.send(()).unwrap();
            let mut got = std::collections::BTreeMap::new();
            let mut buf = [0u8; 256];
            let mut finished = false;
            loop {
                match socket.recv_from(&mut buf) {
                    Ok((_, from)) => *got.entry(from.port()).or_insert(0) += 1,
                    // Quiet once the sender is done: nothing more is on its way.
                    Err(_) if finished => break,
                    Err(_) => {}
                }
                if !finished && done_rx.try_recv().is_ok() {
                    finished = true;
                }
            }
            got
        });
        s.spawn(move || {
            a.enter().unwrap();
            ready_rx.recv().unwrap();
            let any = if to.is_ipv4() { "0.0.0.0" } else { "::" };
            let sockets: Vec<UdpSocket> = (0..flows)
                .map(|f| UdpSocket::bind((any, 7000 + f)).unwrap())
                .collect();
            let total = flows as usize * per_flow;
            let start = Instant::now();
            let mut during = Some(during);
            std::thread::scope(|inner| {
                for k in 0..total {
                    sockets[k % flows as usize].send_to(b"fibre", to).unwrap();
                    if k == total / 2 {
                        if let Some(d) = during.take() {
                            inner.spawn(d);
                        }
                    }
                    // Paced: the k-th goes at k / rate seconds.
                    let due = start + Duration::from_nanos(k as u64 * 1_000_000_000 / rate);
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                }
            });
            done_tx.send(()).unwrap();
        });
        receiver.join().unwrap()
    })
}
