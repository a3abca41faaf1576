//! `fibre daemon --forward` and the router's nftables ruleset, as root: host A, veth, a
//! router namespace whose kernel does not forward and whose daemon does, veth, host B.
//! fibre evaluates the stateless filter rules of the forwarding path as the kernel
//! would, and never forwards around the rest: a family the ruleset tracks, translates
//! or filters with what fibre does not evaluate is refused, said and counted; a family
//! it leaves alone is forwarded; each committed change of the ruleset steers, opens or
//! closes the families as it comes, the express path included.

mod common;

use common::*;
use fibre_testbed::netns::Namespace;

/// Loads `rules` into the router's kernel with `nft -f`.
fn nft(ns: &Namespace, rules: &str) {
    ns.nft(&["-f", "-"], rules).expect("nft loads the rules");
}

fn closed(daemon: &Daemon) -> (bool, bool) {
    let s = daemon.stats();
    let c = &s["firewall"]["closed"];
    (c["ipv4"] == true, c["ipv6"] == true)
}

/// Over AF_XDP.
#[test]
#[ignore = "needs root: network namespaces, veth pairs, XDP, nft, ping"]
fn the_firewall_is_enforced_or_closes_its_family_over_af_xdp() {
    never_around_the_firewall("xdp");
}

/// As a user starts it on veths: `AF_PACKET` with the express path, whose entries must
/// stop forwarding as soon as the ruleset closes their family.
#[test]
#[ignore = "needs root: network namespaces, veth pairs, AF_PACKET sockets, tcx, nft, ping"]
fn the_firewall_is_enforced_or_closes_its_family_over_the_express_path() {
    never_around_the_firewall("auto");
}

fn never_around_the_firewall(io: &str) {
    let (a, r, b) = topology();
    // The kernel's own forwarding would drop A's pings to B by this rule; fibre
    // evaluates it as the kernel would.
    nft(
        &r,
        "table ip fw { chain filter_forward { type filter hook forward priority 0; policy accept; \
         ip daddr 10.0.1.2 icmp type echo-request drop; }; }",
    );
    let daemon = Daemon::start(&r, io);
    let stats = daemon.stats();
    assert_eq!(closed(&daemon), (false, false), "{stats}");
    assert_eq!(stats["firewall"]["filtered"]["ipv4"], true, "{stats}");
    assert_eq!(stats["firewall"]["filtered"]["ipv6"], false, "{stats}");
    let (ok, text) = ping(&a, &["-c", "2", "10.0.1.2"]);
    assert!(!ok, "forwarded around the firewall: {text}");
    let filtered = |d: &Daemon| d.stats()["forwarding"]["fates"]["drop:filtered"].as_u64();
    assert!(filtered(&daemon) >= Some(2), "{}", daemon.stats());
    // What the rule does not match passes.
    let host_a: std::net::IpAddr = "10.0.0.2".parse().unwrap();
    let got = arrivals(&a, &b, "10.0.1.2:7200".parse().unwrap(), 100);
    assert!(got.iter().all(|g| g == &[host_a]), "{got:?}");
    let (ok, text) = ping(&a, &["fd01::2"]);
    assert!(ok, "{text}");

    // A rule added under way steers the packets that follow it.
    nft(&r, "add rule ip fw filter_forward udp dport 7201 drop");
    wait_for("the rule", || {
        daemon.stats()["firewall"]["rules"].as_u64() == Some(2)
    });
    let got = arrivals(&a, &b, "10.0.1.2:7201".parse().unwrap(), 50);
    assert!(got.iter().all(Vec::is_empty), "{got:?}");
    assert!(filtered(&daemon) >= Some(52), "{}", daemon.stats());
    let got = arrivals(&a, &b, "10.0.1.2:7202".parse().unwrap(), 50);
    assert!(got.iter().all(|g| g == &[host_a]), "{got:?}");

    // An expression fibre does not evaluate closes the family, naming the rule.
    nft(
        &r,
        "add rule ip fw filter_forward limit rate 1/second accept",
    );
    wait_for("IPv4 to close", || closed(&daemon) == (true, false));
    let stats = daemon.stats();
    let first = &stats["firewall"]["first_refusals"][0];
    assert_eq!(first["family"], "ip", "{stats}");
    assert_eq!(first["table"], "fw", "{stats}");
    assert_eq!(first["chain"], "filter_forward", "{stats}");
    assert!(first["handle"].as_u64().is_some(), "{stats}");
    assert!(
        first["rule"].as_str().unwrap_or_default().contains("limit"),
        "{stats}"
    );
    assert!(
        first["why"]
            .as_str()
            .unwrap_or_default()
            .contains("`limit`"),
        "{stats}"
    );
    // IPv4 is refused, and counted; IPv6, which the ruleset leaves alone, forwarded.
    let got = arrivals(&a, &b, "10.0.1.2:7202".parse().unwrap(), 20);
    assert!(got.iter().all(Vec::is_empty), "{got:?}");
    assert!(
        daemon.stats()["forwarding"]["firewall_refused"].as_u64() > Some(0),
        "{}",
        daemon.stats()
    );
    let (ok, text) = ping(&a, &["fd01::2"]);
    assert!(ok, "{text}");
    assert!(daemon.ctl(&["ruleset", "show"]));

    // The table deleted: IPv4 opens, from the commit's notification.
    nft(&r, "delete table ip fw");
    wait_for("IPv4 to open", || closed(&daemon) == (false, false));
    for to in ["10.0.1.2", "fd01::2"] {
        let (ok, text) = ping(&a, &["-c", "5", to]);
        assert!(ok, "{text}");
    }

    // A connection's mark set (which fibre does not follow) on the way out to B, in an
    // inet table: both close, whatever the express path had been taught.
    nft(
        &r,
        "table inet nat { chain post { type filter hook postrouting priority 100; \
         oifname \"r1\" ct mark set 7 drop; }; }",
    );
    wait_for("both families to close", || closed(&daemon) == (true, true));
    for to in ["10.0.1.2", "fd01::2"] {
        let (ok, text) = ping(&a, &[to]);
        assert!(!ok, "forwarded around the rule: {text}");
    }
    // Dormant, the table's `ct mark set` still has the kernel track connections: both
    // stay closed. Deleted, both open again.
    nft(&r, "add table inet nat { flags dormant; }");
    wait_for("the commit", || {
        daemon.stats()["firewall"]["commits"].as_u64() >= Some(3)
    });
    assert_eq!(closed(&daemon), (true, true));
    nft(&r, "delete table inet nat");
    wait_for("both families to open", || {
        closed(&daemon) == (false, false)
    });
    let (ok, text) = ping(&a, &["10.0.1.2"]);
    assert!(ok, "{text}");
    // fibre answers a time to live of 1 as the kernel would...
    let (_, text) = ping(&a, &["-t", "1", "10.0.1.2"]);
    assert!(text.contains("Time to live exceeded"), "{text}");
    // ... unless the output hook, which the kernel's own errors meet, holds a rule:
    // then it sends no errors of that family, and still forwards.
    nft(
        &r,
        "table ip out { chain o { type filter hook output priority 0; \
         ip daddr 192.0.2.1 drop; }; }",
    );
    wait_for("IPv4's errors to close", || {
        daemon.stats()["firewall"]["errors_closed"]["ipv4"] == true
    });
    assert_eq!(closed(&daemon), (false, false));
    let (_, text) = ping(&a, &["-t", "1", "10.0.1.2"]);
    assert!(!text.contains("Time to live exceeded"), "{text}");
    let (ok, text) = ping(&a, &["10.0.1.2"]);
    assert!(ok, "{text}");
    daemon.terminate();
}

/// A stateful firewall over AF_PACKET.
#[test]
#[ignore = "needs root: network namespaces, veth pairs, AF_PACKET sockets, nft, ping, TCP"]
fn a_stateful_firewall_lets_replies_in_and_keeps_connections_from_outside_out() {
    stateful_firewall("packet");
}

/// A stateful firewall over AF_XDP.
#[test]
#[ignore = "needs root: network namespaces, veth pairs, XDP, nft, ping, TCP"]
fn a_stateful_firewall_lets_replies_in_and_keeps_connections_from_outside_out_over_af_xdp() {
    stateful_firewall("xdp");
}

/// The ruleset almost every router holds: forward policy drop, replies and errors of
/// known connections let in, new connections only from the inside (A, behind `r0`).
/// fibre tracks the connections itself: the family stays open, A's pings and TCP
/// connections to B work both ways, B's to A are refused.
fn stateful_firewall(io: &str) {
    let (a, r, b) = topology();
    nft(
        &r,
        "table inet fw { chain forward_filter { type filter hook forward priority 0; policy drop; \
         ct state established,related accept; ct state invalid drop; \
         iifname \"r0\" ct state new accept; }; }",
    );
    let daemon = Daemon::start(&r, io);
    let stats = daemon.stats();
    assert_eq!(closed(&daemon), (false, false), "{stats}");
    assert_eq!(stats["firewall"]["tracked"]["ipv4"], true, "{stats}");
    assert_eq!(stats["firewall"]["tracked"]["ipv6"], true, "{stats}");
    for to in ["10.0.1.2", "fd01::2"] {
        let (ok, text) = ping(&a, &["-c", "3", to]);
        assert!(ok, "A's pings to B and B's replies: {text}");
    }
    for to in ["10.0.0.2", "fd00::2"] {
        let (ok, text) = ping(&b, &["-c", "2", to]);
        assert!(!ok, "B's pings to A let in: {text}");
    }
    // A TCP connection from A, its data and its close, intact.
    let to: std::net::SocketAddr = "10.0.1.2:7300".parse().unwrap();
    let (got, sent_sum, got_sum) = transfer(&a, &b, to, 4 << 20);
    assert_eq!((got, got_sum), (4 << 20, sent_sum), "{}", daemon.stats());
    // One from B is refused: its SYN is new, from outside.
    let refused = std::thread::scope(|s| {
        s.spawn(|| {
            b.enter().unwrap();
            std::net::TcpStream::connect_timeout(
                &"10.0.0.2:7301".parse().unwrap(),
                std::time::Duration::from_secs(2),
            )
            .is_err()
        })
        .join()
        .unwrap()
    });
    assert!(refused, "B's connection to A let in");
    // More connections, both families, each of them intact: over AF_PACKET each link's
    // fanout is steered by the owners' hash, so each of the two workers reads both
    // directions of the connections it owns, and none is handed over (a program that
    // steered otherwise would have half of them handed over).
    for k in 0..16u16 {
        let to: std::net::SocketAddr = if k % 2 == 0 {
            format!("10.0.1.2:{}", 7310 + k)
        } else {
            format!("[fd01::2]:{}", 7310 + k)
        }
        .parse()
        .unwrap();
        let (got, sent_sum, got_sum) = transfer(&a, &b, to, 64 << 10);
        assert_eq!((got, got_sum), (64 << 10, sent_sum), "{}", daemon.stats());
    }
    let stats = daemon.stats();
    let forwarding = &stats["forwarding"];
    if io == "packet" {
        assert_eq!(forwarding["workers"], 2, "{stats}");
        assert_eq!(forwarding["handed_off"], 0, "{stats}");
        // The first worker made to fail and started again: its new sockets join the
        // groups last, the last ones taking its places, and the program they give the
        // groups follows that order, so still none is handed over. (The workers add
        // their counts each tenth of a second: the frames the transfers make, at
        // least six each through the router, awaited.)
        let sent = |stats: &serde_json::Value| stats["forwarding"]["sent"].as_u64().unwrap_or(0);
        assert!(daemon.ctl(&["test", "fail-worker", "0"]));
        wait_for("the worker started again", || {
            daemon.stats()["forwarding"]["failures"][0]["restarted"] == true
        });
        let before = sent(&daemon.stats());
        for k in 0..8u16 {
            let to: std::net::SocketAddr = format!("10.0.1.2:{}", 7340 + k).parse().unwrap();
            let (got, sent_sum, got_sum) = transfer(&a, &b, to, 64 << 10);
            assert_eq!((got, got_sum), (64 << 10, sent_sum), "{}", daemon.stats());
        }
        wait_for("the transfers counted", || {
            sent(&daemon.stats()) >= before + 48
        });
        let stats = daemon.stats();
        assert_eq!(stats["forwarding"]["handed_off"], 0, "{stats}");
    }
    assert_eq!(forwarding["handoff_dropped"], 0, "{stats}");
    let ct = &stats["forwarding"]["conntrack"];
    assert!(ct["inserted"].as_u64() >= Some(3), "{stats}");
    assert!(ct["found"].as_u64() > Some(100), "{stats}");
    assert!(daemon.fate("drop:filtered") >= 4, "{stats}");
    assert!(daemon.ctl(&["conntrack", "show"]));
    daemon.terminate();
}

/// Sends `n` tagged UDP datagrams from A to `to` on B; for each tag, the sources it
/// arrived from (one each, if nothing is lost or doubled).
fn arrivals(
    a: &Namespace,
    b: &Namespace,
    to: std::net::SocketAddr,
    n: u32,
) -> Vec<Vec<std::net::IpAddr>> {
    use std::net::UdpSocket;
    use std::time::Duration;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let receiver = s.spawn(move || {
            b.enter().unwrap();
            let socket = UdpSocket::bind(to).unwrap();
            socket
                .set_read_timeout(Some(Duration::from_millis(500)))
                .unwrap();
            ready_tx.send(()).unwrap();
            let mut got = vec![Vec::new(); n as usize];
            let mut buf = [0u8; 64];
            // Until every tag came and the line stayed quiet a while (a second copy of
            // the last would come within it).
            let mut quiet = 0;
            while quiet < 4 {
                match socket.recv_from(&mut buf) {
                    Ok((4, from)) => {
                        let k = u32::from_be_bytes(buf[..4].try_into().unwrap());
                        if let Some(g) = got.get_mut(k as usize) {
                            g.push(from.ip());
                        }
                        quiet = 0;
                    }
                    Ok(_) => {}
                    Err(_) => quiet += 1,
                }
            }
            got
        });
        s.spawn(move || {
            a.enter().unwrap();
            ready_rx.recv().unwrap();
            let socket =
                UdpSocket::bind(if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }).unwrap();
            for k in 0..n {
                socket.send_to(&k.to_be_bytes(), to).unwrap();
                if k % 50 == 49 {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        });
        receiver.join().unwrap()
    })
}

/// With the kernel's forwarding on, as routers have it: a family the ruleset closes to
/// fibre is forwarded by the kernel, with its firewall (the ping dropped by its rule, the
/// datagrams masqueraded), and fibre sends none of those frames a second time; once the
/// ruleset is gone, the express path takes the destinations the workers decide, still
/// with nothing doubled. As a user starts it on veths (`--io auto`).
#[test]
#[ignore = "needs root: network namespaces, veth pairs, AF_PACKET sockets, tcx, nft, ping"]
fn with_the_kernels_forwarding_on_a_closed_family_is_the_kernels_with_its_firewall() {
    kernel_forwarding_on("auto");
}

/// The same over AF_XDP: the XDP programs pass a closed family to the kernel whole.
#[test]
#[ignore = "needs root: network namespaces, veth pairs, XDP, nft, ping"]
fn with_the_kernels_forwarding_on_a_closed_family_is_the_kernels_over_af_xdp() {
    kernel_forwarding_on("xdp");
}

fn kernel_forwarding_on(io: &str) {
    let (a, r, b) = topology();
    r.sysctl("net.ipv4.ip_forward", "1").unwrap();
    r.sysctl("net.ipv6.conf.all.forwarding", "1").unwrap();
    nft(
        &r,
        "table inet fw { \
           chain filter_forward { type filter hook forward priority 0; policy accept; \
             ip daddr 10.0.1.2 icmp type echo-request drop; ct mark set 7; }; \
           chain nat_postrouting { type nat hook postrouting priority 100; \
             oifname \"r1\" masquerade; }; }",
    );
    let daemon = Daemon::start(&r, io);
    assert_eq!(closed(&daemon), (true, true));
    let stats = daemon.stats();
    let kernel = &stats["forwarding"]["kernel_forwards"];
    assert_eq!(kernel[0]["ipv4"], true, "{stats}");
    // The kernel's rule drops the ping; its masquerade rewrites the datagrams' source.
    let (ok, text) = ping(&a, &["10.0.1.2"]);
    assert!(!ok, "the kernel's firewall was bypassed: {text}");
    let got = arrivals(&a, &b, "10.0.1.2:7100".parse().unwrap(), 300);
    let router: std::net::IpAddr = "10.0.1.1".parse().unwrap();
    assert!(
        got.iter().all(|g| g == &[router]),
        "each datagram once, masqueraded: {:?}",
        got.iter()
            .filter(|g| g != &&[router])
            .take(5)
            .collect::<Vec<_>>()
    );
    let stats = daemon.stats();
    if io == "xdp" {
        // The programs passed them: the workers never saw them.
        assert_eq!(stats["forwarding"]["firewall_refused"], 0, "{stats}");
    } else {
        assert!(
            stats["forwarding"]["left_to_kernel"].as_u64() >= Some(300),
            "{stats}"
        );
    }
    assert_eq!(stats["forwarding"]["sent"], 0, "{stats}");

    // The ruleset gone: fibre's again, the express path taught, nothing doubled.
    nft(&r, "delete table inet fw");
    wait_for("both families to open", || {
        closed(&daemon) == (false, false)
    });
    let (ok, text) = ping(&a, &["-c", "3", "10.0.1.2"]);
    assert!(ok, "{text}");
    assert!(!text.contains("DUP!"), "{text}");
    let host_a: std::net::IpAddr = "10.0.0.2".parse().unwrap();
    let got = arrivals(&a, &b, "10.0.1.2:7101".parse().unwrap(), 300);
    assert!(
        got.iter().all(|g| g == &[host_a]),
        "each datagram once, from A: {:?}",
        got.iter()
            .filter(|g| g != &&[host_a])
            .take(5)
            .collect::<Vec<_>>()
    );
    if io == "auto" {
        let taught = daemon.stats()["forwarding"]["express"]["taught"].as_u64();
        assert!(taught > Some(0), "{taught:?}");
    }
    daemon.terminate();
}

/// A NAT gateway over AF_PACKET.
#[test]
#[ignore = "needs root: network namespaces, veth pairs, AF_PACKET sockets, nft, ping, TCP"]
fn a_nat_gateway_masquerades_the_inside_and_forwards_a_port() {
    nat_gateway("packet");
}

/// A NAT gateway over AF_XDP.
#[test]
#[ignore = "needs root: network namespaces, veth pairs, XDP, nft, ping, TCP"]
fn a_nat_gateway_masquerades_the_inside_and_forwards_a_port_over_af_xdp() {
    nat_gateway("xdp");
}

/// The NAT gateway almost every home and office router is: A's network masqueraded
/// out of B's link (`r1`), and a port of the router's outside address forwarded to A.
/// fibre translates itself, as the kernel would: the families stay open, B sees A's
/// datagrams, pings and a 100 MB TCP stream from the router's address, each once and
/// intact; B's connection to the router's port 8080 reaches A's 7400, from B.
fn nat_gateway(io: &str) {
    let (a, r, b) = topology();
    nft(
        &r,
        "table ip nat { \
           chain pre { type nat hook prerouting priority dstnat; \
             iifname \"r1\" tcp dport 8080 dnat to 10.0.0.2:7400; }; \
           chain post { type nat hook postrouting priority srcnat; \
             oifname \"r1\" masquerade; }; }\n\
         table ip6 nat { chain post { type nat hook postrouting priority srcnat; \
             oifname \"r1\" masquerade; }; }",
    );
    let daemon = Daemon::start(&r, io);
    let stats = daemon.stats();
    assert_eq!(closed(&daemon), (false, false), "{stats}");
    // Pings first: B's address resolved before the datagrams, which come faster than
    // a neighbour is resolved (as the kernel's, fibre's queue for an unresolved
    // neighbour is bounded).
    for to in ["10.0.1.2", "fd01::2"] {
        let (ok, text) = ping(&a, &["-c", "3", to]);
        assert!(ok, "A's pings to B, masqueraded, and B's replies: {text}");
    }
    for (to, router) in [("10.0.1.2:7100", "10.0.1.1"), ("[fd01::2]:7100", "fd01::1")] {
        let router: std::net::IpAddr = router.parse().unwrap();
        let got = arrivals(&a, &b, to.parse().unwrap(), 300);
        assert!(
            got.iter().all(|g| g == &[router]),
            "each datagram once, masqueraded: {:?} {}",
            got.iter()
                .enumerate()
                .filter(|(_, g)| g != &&[router])
                .take(5)
                .collect::<Vec<_>>(),
            daemon.stats()
        );
    }
    // A stream out, masqueraded.
    let to: std::net::SocketAddr = "10.0.1.2:7300".parse().unwrap();
    let (got, sent_sum, got_sum, peer) = transfer_via(&a, &b, to, to, 100 << 20);
    assert_eq!((got, got_sum), (100 << 20, sent_sum), "{}", daemon.stats());
    assert_eq!(peer.ip().to_string(), "10.0.1.1");
    // A stream in, through the forwarded port.
    let (got, sent_sum, got_sum, peer) = transfer_via(
        &b,
        &a,
        "10.0.0.2:7400".parse().unwrap(),
        "10.0.1.1:8080".parse().unwrap(),
        4 << 20,
    );
    assert_eq!((got, got_sum), (4 << 20, sent_sum), "{}", daemon.stats());
    assert_eq!(peer.ip().to_string(), "10.0.1.2");
    // A port forward added with `nft` while the daemon runs steers the next
    // connection: before it, the router's own stack refuses port 8081.
    let refused = inside(&b, || {
        std::net::TcpStream::connect_timeout(
            &"10.0.1.1:8081".parse().unwrap(),
            std::time::Duration::from_secs(3),
        )
    });
    assert!(refused.is_err(), "{refused:?}");
    let commits = daemon.stats()["firewall"]["commits"].as_u64().unwrap_or(0);
    nft(
        &r,
        "add rule ip nat pre iifname \"r1\" tcp dport 8081 dnat to 10.0.0.2:7401",
    );
    wait_for("the rule's commit", || {
        daemon.stats()["firewall"]["commits"].as_u64() > Some(commits)
    });
    let (got, sent_sum, got_sum, peer) = transfer_via(
        &b,
        &a,
        "10.0.0.2:7401".parse().unwrap(),
        "10.0.1.1:8081".parse().unwrap(),
        1 << 20,
    );
    assert_eq!((got, got_sum), (1 << 20, sent_sum), "{}", daemon.stats());
    assert_eq!(peer.ip().to_string(), "10.0.1.2");
    let stats = daemon.stats();
    assert!(
        stats["forwarding"]["sent"].as_u64() > Some(1_000),
        "{stats}"
    );
    // The replies of each masqueraded connection and the port forwarded, claimed from
    // the router's stack (which would answer them with resets and "port unreachable").
    // (Counted by the workers as they go: waited for.)
    wait_for("seven connections' claims", || {
        daemon.stats()["forwarding"]["claims"]["claimed"].as_u64() >= Some(7)
    });
    let listed = daemon.ctl_text(&["conntrack", "show"]);
    let ct = &stats["forwarding"]["conntrack"];
    assert!(ct["source_translated"].as_u64() >= Some(5), "{stats}");
    assert_eq!(ct["destination_translated"], 2, "{stats}");
    assert!(
        listed.contains("dport=8080 src=10.0.0.2 dst=10.0.1.2 sport=7400"),
        "{listed}"
    );
    // The outside address gone, the connections masqueraded to it end, as the kernel's
    // do; the port forward, not masqueraded, stays.
    r.ip(&["addr", "del", "10.0.1.1/24", "dev", "r1"]).unwrap();
    wait_for("the masqueraded connections to end", || {
        !daemon
            .ctl_text(&["conntrack", "show"])
            .contains("dst=10.0.1.1 sport=7300")
    });
    let listed = daemon.ctl_text(&["conntrack", "show"]);
    assert!(listed.contains("dport=8080"), "{listed}");
    assert!(!listed.contains("dst=10.0.1.1 sport=7100"), "{listed}");
    daemon.terminate();
}

/// Connections the kernel opened survive fibre's takeover, over `AF_PACKET`.
#[test]
#[ignore = "needs root: network namespaces, veth pairs, nft, ctnetlink, TCP"]
fn connections_opened_through_the_kernel_survive_the_takeover() {
    takeover("packet");
}

/// Connections the kernel opened survive fibre's takeover, over AF_XDP.
#[test]
#[ignore = "needs root: network namespaces, veth pairs, XDP, nft, ctnetlink, TCP"]
fn connections_opened_through_the_kernel_survive_the_takeover_over_af_xdp() {
    takeover("xdp");
}

/// Runs `f` on a thread inside `ns` (the sockets it opens stay in `ns`).
fn inside<T: Send>(ns: &Namespace, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            ns.enter().unwrap();
            f()
        })
        .join()
        .unwrap()
    })
}

/// Sends `what` from `from` to `to` until `at` receives it (a few tries: the first
/// frames after a takeover may meet a neighbour being resolved): where it came from.
fn datagram(
    from: &std::net::UdpSocket,
    at: &std::net::UdpSocket,
    to: std::net::SocketAddr,
    what: &[u8],
) -> std::net::SocketAddr {
    let mut buf = [0u8; 64];
    for _ in 0..5 {
        from.send_to(what, to).unwrap();
        if let Ok((n, peer)) = at.recv_from(&mut buf) {
            assert_eq!(&buf[..n], what);
            return peer;
        }
    }
    panic!("{what:?} never arrived");
}

/// The takeover of a NAT gateway with a stateful firewall: while the kernel forwards,
/// two hosts' flows from the same port (A's two addresses) to one server on B are
/// masqueraded, the second moved off the port by the kernel; B connects through the
/// port forward to A. Then the kernel's forwarding goes off and fibre starts. The
/// moved flow speaks first and still reaches B from the port the kernel gave it (fibre
/// alone, bound anew, would give it the free original port); the forwarded
/// connection's inside end speaks first and reaches B translated back (fibre alone
/// would masquerade it from another port, and B would reset it); replies come back
/// to each.
fn takeover(io: &str) {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
    let (a, r, b) = topology();
    a.ip(&["addr", "add", "10.0.0.3/24", "dev", "h0"]).unwrap();
    nft(
        &r,
        "table ip nat { \
           chain pre { type nat hook prerouting priority dstnat; \
             iifname \"r1\" tcp dport 8080 dnat to 10.0.0.2:7400; }; \
           chain post { type nat hook postrouting priority srcnat; \
             oifname \"r1\" masquerade; }; }\n\
         table inet filter { chain forward { type filter hook forward priority 0; policy drop; \
             ct state established,related accept; ct state invalid drop; \
             iifname \"r0\" accept; ct status dnat accept; }; }",
    );
    r.sysctl("net.ipv4.ip_forward", "1").unwrap();
    let timeout = Some(std::time::Duration::from_secs(1));
    let server = inside(&b, || UdpSocket::bind("10.0.1.2:7600").unwrap());
    let first = inside(&a, || UdpSocket::bind("10.0.0.2:5000").unwrap());
    let second = inside(&a, || UdpSocket::bind("10.0.0.3:5000").unwrap());
    for s in [&server, &first, &second] {
        s.set_read_timeout(timeout).unwrap();
    }
    let to: SocketAddr = "10.0.1.2:7600".parse().unwrap();
    let kept = datagram(&first, &server, to, b"first");
    let moved = datagram(&second, &server, to, b"second");
    assert_eq!(kept, "10.0.1.1:5000".parse().unwrap());
    assert_eq!(moved.ip(), kept.ip());
    assert_ne!(
        moved.port(),
        5000,
        "the kernel moves the second flow's port"
    );
    let listener = inside(&a, || TcpListener::bind("10.0.0.2:7400").unwrap());
    let mut outside = inside(&b, || TcpStream::connect("10.0.1.1:8080").unwrap());
    let (mut inner, peer) = listener.accept().unwrap();
    assert_eq!(peer.ip().to_string(), "10.0.1.2");
    for s in [&outside, &inner] {
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
    }
    let mut got = [0u8; 6];
    outside.write_all(b"before").unwrap();
    inner.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"before");

    r.sysctl("net.ipv4.ip_forward", "0").unwrap();
    let daemon = Daemon::start(&r, io);
    let stats = daemon.stats();
    assert_eq!(closed(&daemon), (false, false), "{stats}");
    let t = &stats["forwarding"]["takeover"];
    assert!(t["imported"].as_u64() >= Some(3), "{stats}");
    assert_eq!(t["malformed"], 0, "{stats}");
    // The port forward and the masqueraded flows' replies, claimed from the router's
    // stack.
    assert!(t["claimed"].as_u64() >= Some(3), "{stats}");
    let sent = daemon.fate("sent");

    assert_eq!(datagram(&second, &server, to, b"second again"), moved);
    assert_eq!(datagram(&first, &server, to, b"first again"), kept);
    assert_eq!(datagram(&server, &second, moved, b"reply"), to);
    assert_eq!(datagram(&server, &first, kept, b"reply"), to);
    inner.write_all(b"after!").unwrap();
    outside.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"after!");
    outside.write_all(b"again!").unwrap();
    inner.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"again!");
    // fibre forwarded them (the kernel no longer does), and listed them as it found
    // them.
    wait_for("fibre's count of what it sent", || {
        daemon.fate("sent") >= sent + 8
    });
    let listed = daemon.ctl_text(&["conntrack", "show"]);
    assert!(
        listed.contains(&format!(
            "src=10.0.0.3 dst=10.0.1.2 sport=5000 dport=7600 src=10.0.1.2 dst=10.0.1.1 sport=7600 dport={}",
            moved.port()
        )),
        "{listed}"
    );
    let ct = &daemon.stats()["forwarding"]["conntrack"];
    assert_eq!(ct["source_translated"], 0, "nothing bound anew: {ct}");
    assert_eq!(ct["destination_translated"], 0, "nothing bound anew: {ct}");
    daemon.terminate();
}

/// A forward chain that rejects, over `AF_PACKET`.
#[test]
#[ignore = "needs root: network namespaces, veth pairs, nft, ping"]
fn what_the_firewall_rejects_is_answered() {
    rejected("packet");
}

/// A forward chain that rejects, over AF_XDP.
#[test]
#[ignore = "needs root: network namespaces, veth pairs, XDP, nft, ping"]
fn what_the_firewall_rejects_is_answered_over_af_xdp() {
    rejected("xdp");
}

/// The forward chain rejects A's pings to B (`icmpx admin-prohibited`), A's datagrams
/// to B's port 9 (`reject`: port unreachable) and connections to it (`tcp reset`), IPv4
/// and IPv6: the families stay open, fibre answers each as the kernel would (ping
/// reports the packet filtered, a connected UDP socket and a connection are refused),
/// and datagrams to another port pass.
fn rejected(io: &str) {
    use std::net::UdpSocket;
    let (a, r, b) = topology();
    nft(
        &r,
        "table inet f { chain through { type filter hook forward priority 0; \
           icmp type echo-request reject with icmpx admin-prohibited; \
           icmpv6 type echo-request reject with icmpx admin-prohibited; \
           udp dport 9 reject; tcp dport 9 reject with tcp reset; }; }",
    );
    // B listens on port 9, so that only the router's reject can refuse what goes there.
    let listening = inside(&b, || {
        [("10.0.1.2:9"), ("[fd01::2]:9")].map(|at| {
            (
                UdpSocket::bind(at).unwrap(),
                std::net::TcpListener::bind(at).unwrap(),
            )
        })
    });
    let daemon = Daemon::start(&r, io);
    assert_eq!(closed(&daemon), (false, false), "{}", daemon.stats());
    for to in ["10.0.1.2", "fd01::2"] {
        let (ok, text) = ping(&a, &["-c", "1", to]);
        assert!(!ok, "{text}");
        assert!(
            text.contains("Packet filtered") || text.contains("Administratively prohibited"),
            "{to}: {text}"
        );
    }
    for (from, to) in [("10.0.0.2:0", "10.0.1.2:9"), ("[fd00::2]:0", "[fd01::2]:9")] {
        let socket = inside(&a, || UdpSocket::bind(from).unwrap());
        socket
            .set_read_timeout(Some(std::time::Duration::from_secs(2)))
            .unwrap();
        socket.connect(to).unwrap();
        socket.send(b"to port 9").unwrap();
        let got = socket.recv(&mut [0u8; 16]);
        assert_eq!(
            got.map_err(|e| e.kind()),
            Err(std::io::ErrorKind::ConnectionRefused),
            "{to}"
        );
    }
    // A connection to B's port 9: reset, refused at once.
    for to in ["10.0.1.2:9", "[fd01::2]:9"] {
        let got = inside(&a, || {
            std::net::TcpStream::connect_timeout(
                &to.parse().unwrap(),
                std::time::Duration::from_secs(5),
            )
        });
        assert_eq!(
            got.map(|_| ()).map_err(|e| e.kind()),
            Err(std::io::ErrorKind::ConnectionRefused),
            "{to}"
        );
    }
    let got = arrivals(&a, &b, "10.0.1.2:7100".parse().unwrap(), 50);
    assert!(
        got.iter().all(|g| g.len() == 1),
        "{got:?} {}",
        daemon.stats()
    );
    wait_for("the rejects counted", || {
        daemon.fate("icmp:rejected") >= 4 && daemon.fate("tcp-reset") >= 2
    });
    drop(listening);
    daemon.terminate();
}
