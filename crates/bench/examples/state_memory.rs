//! The heap a mirror's routing state takes for the shipped full tables, part by part: the
//! state itself and one compiled snapshot (a published `Fib` keeps two: the published
//! one and the spare it patches). Counted by a counting allocator, live bytes, so
//! that neither fragmentation nor the allocator's caches blur them; the daemon's resident
//! memory is larger by those.
//!
//! `cargo run --release -p fibre-bench --example state_memory`

use fibre_fib::{Family, Link, LinkKind, Net, Path, Paths, Route, RouteOp, RouteType};
use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Read;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The system allocator, counting the bytes live.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is the system allocator's, with the same arguments; the counter only
// adds and subtracts the sizes it was given.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: as the caller's contract for `GlobalAlloc::alloc`.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as the caller's contract for `GlobalAlloc::dealloc`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as the caller's contract for `GlobalAlloc::realloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// The prefixes of a shipped table.
fn prefixes(name: &str) -> Vec<Net> {
    let path = format!(
        "{}/../../data/ris-2026-05-11/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&path).expect(&path))
        .read_to_string(&mut text)
        .expect("gzip text");
    text.lines()
        .filter_map(|l| Net::parse(l.split_whitespace().next()?, None).ok())
        .collect()
}

fn link(index: u32, name: &str, kind: LinkKind) -> Link {
    Link {
        index,
        name: name.into(),
        kind,
        up: true,
        mtu: 1500,
        mac: [2, 0, 0, 0, 0, index as u8],
        group: 0,
        addrgenmode: fibre_fib::link::AddrGenMode::Eui64,
    }
}

fn main() {
    let v4 = prefixes("rib-v4.txt.gz");
    let v6 = prefixes("rib-v6.txt.gz");
    let start = live();
    let built = std::time::Instant::now();
    let mut state = fibre_fib::State::mirrored();
    state.mirror_link(link(1, "lo", LinkKind::Loopback), true);
    state.mirror_link(link(2, "a0", LinkKind::Dummy), true);
    for (i, dst) in v4.iter().chain(&v6).enumerate() {
        let v6 = dst.family() == Family::V6;
        let gateway: IpAddr = if v6 {
            format!("2001:db8::{}", 2 + i % 8).parse().unwrap()
        } else {
            format!("10.0.0.{}", 2 + i % 8).parse().unwrap()
        };
        let route = Route {
            table: 254,
            dst: *dst,
            src: Net::default_of(dst.family()),
            tos: 0,
            metric: if v6 { 1024 } else { 0 },
            protocol: 3,
            scope: 0,
            kind: RouteType::Unicast,
            prefsrc: None,
            mtu: None,
            hoplimit: None,
            paths: Paths::Own(
                vec![Path {
                    gateway: Some(gateway),
                    dev: 2,
                    weight: 1,
                    onlink: false,
                    dead: false,
                    scope: 0,
                }]
                .into(),
            ),
            pref: 0,
        };
        state.mirror_route(route, RouteOp::Replace);
    }
    let routes = v4.len() + v6.len();
    let state_bytes = live() - start;
    let state_time = built.elapsed();
    let before = live();
    let compiled = std::time::Instant::now();
    let snapshot = state.snapshot();
    let compile_time = compiled.elapsed();
    let snapshot_bytes = live() - before;
    println!(
        "built the state in {:.3} s, compiled a snapshot in {:.3} s",
        state_time.as_secs_f64(),
        compile_time.as_secs_f64()
    );
    drop(snapshot);
    let per = |b: usize| b as f64 / routes as f64;
    println!("{} IPv4 and {} IPv6 routes ({routes})", v4.len(), v6.len());
    println!(
        "state:    {:>6.1} MiB, {:>5.0} bytes a route",
        state_bytes as f64 / (1 << 20) as f64,
        per(state_bytes)
    );
    println!(
        "snapshot: {:>6.1} MiB, {:>5.0} bytes a route (a published Fib keeps two)",
        snapshot_bytes as f64 / (1 << 20) as f64,
        per(snapshot_bytes)
    );
    let total = state_bytes + 2 * snapshot_bytes;
    println!(
        "total:    {:>6.1} MiB, {:>5.0} bytes a route",
        total as f64 / (1 << 20) as f64,
        per(total)
    );
}
