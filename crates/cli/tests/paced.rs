//! A paced run through `fibre daemon --forward`, alone in its test binary so that no
//! other test shares the CPUs: 64-byte UDP frames from host A to host B at 50,000 a
//! second, well below the loss-free rates `fibre bench pipeline` measures on these
//! machines (docs/figures.md), over AF_XDP and then over AF_PACKET. Every frame must
//! arrive, and no drop counter of fibre's or of the kernel's for fibre's sockets may
//! move.

mod common;

use common::*;
use fibre_dataplane::packet::{Batch, PacketSocket};
use fibre_dataplane::pool::Pool;
use std::time::{Duration, Instant};

/// Frames sent in each run.
const FRAMES: usize = 100_000;
/// Frames a second.
const RATE: usize = 50_000;

#[test]
#[ignore = "needs root: network namespaces, veth pairs, XDP, AF_PACKET sockets"]
fn no_drop_counter_moves_below_the_loss_free_rate() {
    for io in ["xdp", "packet"] {
        let (a, r, b) = topology();
        let daemon = Daemon::start_with(&r, io, &["--workers", "1"]);
        let (ok, text) = ping(&a, &["10.0.1.2"]);
        assert!(ok, "{text}");
        let router = mac_of(&r, "r0");
        let host = mac_of(&a, "h0");
        let before = received(&b);
        let sent_before = daemon.fate("sent");
        send_paced(&a, router, host);
        // Every frame arrives; if not, what did and what fibre's counters say.
        let start = Instant::now();
        while received(&b) < before + FRAMES as u64 {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{io}: {} of {FRAMES} frames at B; fibre sent {}: {}",
                received(&b) - before,
                daemon.fate("sent") - sent_before,
                daemon.stats()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        wait_for("fibre's count of them", || {
            daemon.fate("sent") >= sent_before + FRAMES as u64
        });
        let stats = daemon.stats();
        let f = &stats["forwarding"];
        for counter in [
            "send_failed",
            "ring_dropped",
            "truncated",
            "bad_descriptors",
            "refused_offloads",
            "unresolved_dropped",
            "segment_failed",
        ] {
            assert_eq!(f[counter], 0, "{io}: {counter} moved: {stats}");
        }
        for counter in [
            "rx_dropped",
            "rx_ring_full",
            "fill_ring_empty",
            "invalid_descriptors",
        ] {
            assert_eq!(f["xsk"][counter], 0, "{io}: xsk {counter} moved: {stats}");
        }
        let drops: Vec<_> = f["fates"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, v)| k.starts_with("drop:") && v.as_u64() > Some(0))
            .filter(|(k, _)| !["drop:loopback-address", "drop:other-host"].contains(&k.as_str()))
            .collect();
        assert!(drops.is_empty(), "{io}: {drops:?}");
    }
}

/// Frames host B's link received, as its counters say.
fn received(b: &Namespace) -> u64 {
    let out = b.ip(&["-s", "-j", "link", "show", "dev", "h1"]).unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v[0]["stats64"]["rx"]["packets"].as_u64().unwrap_or(0)
}

/// Sends [`FRAMES`] 64-byte UDP frames (60 on the wire before the FCS) from A's link to
/// the router for B, over 64 flows, [`RATE`] a second in bursts of a millisecond's worth.
fn send_paced(a: &Namespace, router: [u8; 6], host: [u8; 6]) {
    std::thread::scope(|s| {
        s.spawn(|| {
            a.enter().unwrap();
            let socket = PacketSocket::open_named("h0").unwrap();
            let mut pool = Pool::new(256, 2048);
            let mut batch = Batch::new();
            let mut ids = Vec::new();
            let per_ms = RATE / 1000;
            let start = Instant::now();
            let mut sent = 0;
            while sent < FRAMES {
                ids.clear();
                pool.alloc(per_ms.min(FRAMES - sent), &mut ids);
                for (k, &id) in ids.iter().enumerate() {
                    pool.fill(id, &frame(router, host, (sent + k) as u16));
                }
                let mut went = 0;
                while went < ids.len() {
                    went += socket.send(&mut pool, &ids[went..], &mut batch).unwrap();
                }
                pool.free(&ids);
                sent += ids.len();
                let due = start + Duration::from_micros((sent / per_ms) as u64 * 1000);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
        })
        .join()
        .unwrap()
    });
}

/// Frame `k`: UDP from 10.0.0.2 (port 10,000 + k % 64) to 10.0.1.2 port 9, its
/// checksums whole.
fn frame(router: [u8; 6], host: [u8; 6], k: u16) -> Vec<u8> {
    let mut f = Vec::new();
    etherparse::PacketBuilder::ethernet2(host, router)
        .ipv4([10, 0, 0, 2], [10, 0, 1, 2], 64)
        .udp(10_000 + k % 64, 9)
        .write(&mut f, &[0u8; 18])
        .unwrap();
    f
}
