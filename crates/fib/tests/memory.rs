//! What a mirror's routes cost in memory, counted by a counting allocator (live heap
//! bytes, so that neither fragmentation nor the allocator's caches blur them): the
//! shipped full tables (1,042,325 IPv4 and 246,175 IPv6 routes), each route through one
//! of eight gateways as a mirror holds them, in the state (packed as the mirror packs it
//! after a dump), in a compiled snapshot, and in the spare copy a published state keeps
//! beside it. The bounds are what the layout gives today with some room (66, 128 and 72
//! bytes a route), far under what it was when every key's list of routes reserved four,
//! every route had its paths of its own, a snapshot copied every route and its spare
//! copied its nodes (702, 684 and 684): a change that copies routes, lists, paths or nodes
//! again fails here. `--nocapture` prints the figures and the times. The daemon's
//! resident set adds the allocator's overhead.

mod common;

use fibre_fib::{Family, Link, LinkKind, Net, Path, Paths, Route, RouteOp, State};
use std::alloc::{GlobalAlloc, Layout, System};
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

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

/// The prefixes of a shipped table.
fn prefixes(name: &str) -> Vec<Net> {
    common::shipped_prefixes(name)
        .iter()
        .filter_map(|p| Net::parse(p, None).ok())
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
        addrgenmode: fibre_fib::AddrGenMode::Eui64,
    }
}

fn route(i: usize, dst: Net) -> Route {
    let gateway: IpAddr = if dst.family() == Family::V6 {
        format!("2001:db8::{}", 2 + i % 8)
    } else {
        format!("10.0.0.{}", 2 + i % 8)
    }
    .parse()
    .expect("an address");
    common::route_via(dst, 2, gateway)
}

#[test]
fn the_full_tables_take_a_few_hundred_bytes_a_route_in_the_state_and_in_a_snapshot() {
    let dsts: Vec<Net> = prefixes("rib-v4.txt.gz")
        .into_iter()
        .chain(prefixes("rib-v6.txt.gz"))
        .collect();
    let start = LIVE.load(Ordering::Relaxed);
    let built = std::time::Instant::now();
    let mut state = State::mirrored();
    state.mirror_link(link(1, "lo", LinkKind::Loopback), true);
    state.mirror_link(link(2, "a0", LinkKind::Dummy), true);
    for (i, dst) in dsts.iter().enumerate() {
        state.mirror_route(route(i, *dst), RouteOp::Replace);
    }
    // As the mirror does once a dump is applied.
    state.compact();
    let built = built.elapsed();
    let routes = dsts.len();
    assert_eq!(
        state.routes(Family::V4, None).count() + state.routes(Family::V6, None).count(),
        routes
    );
    let in_state = LIVE.load(Ordering::Relaxed) - start;
    let before = LIVE.load(Ordering::Relaxed);
    let compiled = std::time::Instant::now();
    let snapshot = state.snapshot();
    let compiled = compiled.elapsed();
    let in_snapshot = LIVE.load(Ordering::Relaxed) - before;
    // The spare a published state keeps: a copy sharing the nodes.
    let before = LIVE.load(Ordering::Relaxed);
    let spare = snapshot.clone();
    let in_spare = LIVE.load(Ordering::Relaxed) - before;
    let per = |b: usize| b / routes;
    eprintln!(
        "{routes} routes: the state {} bytes a route ({} MiB, built in {:.2} s), a snapshot {} \
         ({} MiB, compiled in {:.2} s), its spare copy {} ({} MiB); all {} MiB",
        per(in_state),
        in_state >> 20,
        built.as_secs_f64(),
        per(in_snapshot),
        in_snapshot >> 20,
        compiled.as_secs_f64(),
        per(in_spare),
        in_spare >> 20,
        (in_state + in_snapshot + in_spare) >> 20
    );
    assert!(
        per(in_state) <= 70,
        "state: {} bytes a route",
        per(in_state)
    );
    assert!(
        per(in_snapshot) <= 125,
        "snapshot: {} bytes a route",
        per(in_snapshot)
    );
    assert!(
        per(in_spare) <= 60,
        "spare: {} bytes a route",
        per(in_spare)
    );
    // The routes through one gateway share one list of paths.
    let mut lists: Vec<*const Path> = [Family::V4, Family::V6]
        .into_iter()
        .flat_map(|f| state.routes(f, None))
        .filter_map(|r| match &r.paths {
            Paths::Own(p) => Some(Arc::as_ptr(p) as *const Path),
            _ => None,
        })
        .collect();
    lists.sort();
    lists.dedup();
    assert_eq!(lists.len(), 16, "eight gateways of each family");
    drop((snapshot, spare));
}

#[test]
fn a_prefix_and_a_route_stay_small() {
    // Both are held once a route in the state, and the prefix once more in every key and
    // node: a field added, or the prefix aligned to 16 again, shows here.
    assert_eq!(std::mem::size_of::<Net>(), 24);
    assert!(
        std::mem::size_of::<Route>() <= 112,
        "{}",
        std::mem::size_of::<Route>()
    );
    assert_eq!(std::mem::size_of::<Paths>(), 24);
}
