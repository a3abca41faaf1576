//! `fibre daemon --forward` end to end, as root: host A, veth, a router namespace whose
//! kernel does not forward (`ip_forward=0`, IPv6 `forwarding=0`) and whose daemon does,
//! veth, host B. Real pings, a real TCP transfer, real ICMP errors, routes changed with
//! `ip route` while traffic flows, malformed frames thrown at the router.

mod common;

use common::*;

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

/// The same as a user starts it on veths, `--io auto`, which chooses AF_PACKET sockets
/// with the express path there: after a worker forwarded a destination's first packet, the frames to it cross the router in the kernel, by the
/// entry the worker wrote; everything else (TTL 1, over the MTU, an unreachable route, a
/// route changed, malformed frames) still reaches the workers, and every answer is the
/// kernel's as before.
#[test]
#[ignore = "needs root: network namespaces, veth pairs, AF_PACKET sockets, tcx, ping, ethtool"]
fn the_daemon_forwards_between_hosts_with_the_kernels_forwarding_off_over_the_express_path() {
    forwards_with_the_kernels_forwarding_off("express");
}

fn forwards_with_the_kernels_forwarding_off(way: &str) {
    let (a, r, b) = topology();
    // Without fibre, nothing crosses: the kernel's forwarding is off.
    let (ok, text) = ping(&a, &["-c", "1", "10.0.1.2"]);
    assert!(!ok, "forwarded without fibre: {text}");

    let express = way == "express";
    let io = if express { "packet" } else { way };
    let daemon = if express {
        Daemon::start_with(&r, "auto", &["--workers", "2"])
    } else {
        Daemon::start(&r, io)
    };
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
    if express {
        // The workers saw a destination's first packets; the kernel the rest, by the
        // entries they wrote (both ways, both families).
        let taught = daemon.stats()["forwarding"]["express"]["taught"].as_u64();
        assert!(taught >= Some(4), "destinations taught: {taught:?}");
        assert!(
            sent < 4 * 1000,
            "the transfers went by the express path: {sent}"
        );
    } else {
        assert!(
            sent > 4 * 1000,
            "the transfers went through fibre: {sent} frames sent"
        );
    }
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
        assert_eq!(
            got,
            300,
            "every datagram to {to} arrived whole; B's socket overflowed {} times; \
             fibre's stats: {}",
            receive_buffer_errors(&b),
            daemon.stats()["forwarding"]
        );
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
        .any(|s| s["stage"] == "route"
            && s["packets"].as_u64() > Some(if express { 20 } else { 4_000 })));
    // Stopped as an operator stops it.
    daemon.terminate();
}

/// Links of four receive queues and one worker: every queue is read (the worker owns
/// them all), and every one of 64 UDP flows from A reaches B, which the hosts spread
/// over their links' four queues. Over AF_XDP.
#[test]
#[ignore = "needs root: network namespaces, veth pairs of four queues, XDP"]
fn every_queue_of_a_link_is_read_over_af_xdp() {
    every_flow_crosses("xdp");
}

/// The same over AF_PACKET.
#[test]
#[ignore = "needs root: network namespaces, veth pairs of four queues, AF_PACKET sockets"]
fn every_queue_of_a_link_is_read_over_af_packet() {
    every_flow_crosses("packet");
}

fn every_flow_crosses(io: &str) {
    let (a, r, b) = topology_of(4);
    let daemon = Daemon::start_with(&r, io, &["--workers", "1"]);
    assert_eq!(daemon.counter("workers"), 1);
    let (ok, text) = ping(&a, &["10.0.1.2"]);
    assert!(ok, "{text}");
    let got = flows(
        &a,
        &b,
        "10.0.1.2:6100".parse().unwrap(),
        64,
        5,
        2_000,
        || (),
    );
    let short: Vec<_> = got.iter().filter(|(_, &n)| n < 5).collect();
    assert_eq!(got.len(), 64, "flows that arrived: {got:?}");
    assert!(short.is_empty(), "flows short of datagrams: {short:?}");
    let stats = daemon.stats();
    assert_eq!(stats["forwarding"]["kernel_unreached"], 0, "{stats}");
    assert_eq!(stats["forwarding"]["priority"], "realtime", "{stats}");
    assert_eq!(stats["forwarding"]["placement"], "as asked", "{stats}");
    // On veths AF_XDP costs more than the kernel's forwarding: the daemon says so.
    let caution = &stats["forwarding"]["caution"];
    if io == "xdp" {
        let text = caution.as_str().unwrap_or_default();
        assert!(text.contains("links r0, r1 are veths"), "{stats}");
    } else {
        assert!(caution.is_null(), "{stats}");
    }
}

/// A worker made to fail (a panic, as a fault in fibre would make) is reported in the
/// log and the stats, started again, and its flows go on meanwhile through the other
/// worker: of 2,000 datagrams on 16 flows, paced, only those the failed worker held as
/// it failed may be lost. Then the link to B is deleted and made again, as an operator
/// may: the daemon forwards on the new link. Over AF_XDP.
#[test]
#[ignore = "needs root: network namespaces, veth pairs, XDP"]
fn a_failed_worker_and_a_link_made_again_forward_again_over_af_xdp() {
    failed_worker_and_link_made_again("xdp");
}

/// The same over AF_PACKET.
#[test]
#[ignore = "needs root: network namespaces, veth pairs, AF_PACKET sockets"]
fn a_failed_worker_and_a_link_made_again_forward_again_over_af_packet() {
    failed_worker_and_link_made_again("packet");
}

fn failed_worker_and_link_made_again(io: &str) {
    let (a, r, b) = topology();
    let daemon = Daemon::start(&r, io);
    let (ok, text) = ping(&a, &["10.0.1.2"]);
    assert!(ok, "{text}");
    let to = "10.0.1.2:6200".parse().unwrap();
    let got = flows(&a, &b, to, 16, 125, 2_000, || {
        assert!(daemon.ctl(&["test", "fail-worker", "0"]));
    });
    let arrived: usize = got.values().sum();
    // Lost at most: what the failed worker held as it failed and what reached its
    // sockets until they closed and it was started again. Measured 11-20 on a 2-vCPU
    // guest (at 2,000 a second, more than its ring held: where the rest goes is still
    // to be found); bounded at 20 ms of this traffic. (That it is started again, and
    // forwards every flow after, is asserted below.)
    assert!(
        arrived >= 2_000 - 40,
        "datagrams that arrived: {arrived} of 2,000"
    );
    wait_for("the failure reported", || {
        daemon.counter("worker_failures") == 1
    });
    let stats = daemon.stats();
    let failure = &stats["forwarding"]["failures"][0];
    assert_eq!(failure["worker"], 0, "{stats}");
    assert_eq!(failure["restarted"], true, "{stats}");
    assert!(
        failure["reason"].as_str().unwrap_or("").contains("fail"),
        "{stats}"
    );
    assert_eq!(daemon.counter("workers"), 2);
    // Started again with the capabilities the daemon kept (and no more: every thread,
    // the new worker's too).
    daemon.assert_privileges_cut();
    // The worker started again forwards: every flow, twice over.
    let got = flows(&a, &b, to, 16, 20, 2_000, || ());
    assert_eq!(got.values().sum::<usize>(), 320, "{got:?}");
    // No such worker: refused.
    assert!(!daemon.ctl(&["test", "fail-worker", "9"]));

    // r1 deleted and made again (another link, another index), with its address.
    r.ip(&["link", "del", "r1"]).unwrap();
    wait_for("forwarding without r1", || {
        daemon.counter("restarts_for_links") >= 1
    });
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
    b.batch("link set h1 mtu 1400\naddr add 10.0.1.2/24 dev h1\nlink set h1 up\nroute add default via 10.0.1.1\n")
        .unwrap();
    r.batch("link set r1 mtu 1400\naddr add 10.0.1.1/24 dev r1\nlink set r1 up\n")
        .unwrap();
    wait_for("forwarding on the new r1", || {
        daemon.counter("restarts_for_links") >= 2
    });
    wait_for("pings across the new link", || ping(&a, &["10.0.1.2"]).0);
    let got = flows(&a, &b, to, 16, 20, 2_000, || ());
    assert_eq!(got.values().sum::<usize>(), 320, "{got:?}");
}

/// A worker asked onto a CPU the machine does not have is refused at the start, with the
/// CPUs it has; nothing is left running.
#[test]
#[ignore = "needs root: network namespaces, veth pairs"]
fn a_cpu_the_machine_does_not_have_is_refused() {
    let (_a, r, _b) = topology();
    let mut daemon = std::process::Command::new(env!("CARGO_BIN_EXE_fibre"))
        .args(["daemon", "--netns", r.name(), "--socket"])
        .arg(std::env::temp_dir().join(format!("fibre-{}-cpus.sock", r.name())))
        .args(["--forward", "r0,r1", "--io", "packet", "--cpus", "4095"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A daemon that took the CPU would run on: it must end by itself, and fail.
    let mut status = None;
    common::wait_for("the daemon to end", || {
        status = daemon.try_wait().unwrap();
        status.is_some()
    });
    let out = daemon.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!status.unwrap().success(), "{err}");
    assert!(
        err.contains("CPU 4095 is not one of this machine's online CPUs"),
        "{err}"
    );
}
