//! What a mirror's routes cost in memory, counted by a counting allocator (live heap
//! bytes): 200,000 routes of the shipped IPv4 table's shape (one path, through one of
//! eight gateways), in the state and in a compiled snapshot. The bounds are what the
//! layout gives today with some room (218 and 202 bytes a route), far under what it was
//! when every route's list of routes reserved four, its paths were its own and a snapshot
//! copied every route (702 and 684): a change that copies routes or paths again fails.

use fibre_fib::{Family, Link, LinkKind, Net, Path, Paths, Route, RouteOp, RouteType, State};
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

const ROUTES: u32 = 200_000;

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

fn route(i: u32) -> Route {
    // /24s spread over the space, as a real table's are.
    let dst = Net::new(
        IpAddr::from((i.wrapping_mul(2_654_435_761) | 1 << 31).to_be_bytes()),
        24,
    )
    .expect("a prefix");
    let gateway: IpAddr = format!("10.0.0.{}", 2 + i % 8).parse().expect("an address");
    Route {
        table: 254,
        dst,
        src: Net::default_of(Family::V4),
        tos: 0,
        metric: 0,
        protocol: 3,
        scope: 0,
        kind: RouteType::Unicast,
        prefsrc: None,
        mtu: None,
        hoplimit: None,
        paths: Paths::own(vec![Path {
            gateway: Some(gateway),
            dev: 2,
            weight: 1,
            onlink: false,
            dead: false,
            scope: 0,
        }]),
        pref: 0,
    }
}

#[test]
fn routes_take_a_few_hundred_bytes_each_in_the_state_and_in_a_snapshot() {
    let start = LIVE.load(Ordering::Relaxed);
    let mut state = State::mirrored();
    state.mirror_link(link(1, "lo", LinkKind::Loopback), true);
    state.mirror_link(link(2, "a0", LinkKind::Dummy), true);
    for i in 0..ROUTES {
        state.mirror_route(route(i), RouteOp::Replace);
    }
    let routes = state.routes(Family::V4, None).count();
    assert!(routes > ROUTES as usize * 9 / 10, "{routes} routes");
    let in_state = LIVE.load(Ordering::Relaxed) - start;
    let before = LIVE.load(Ordering::Relaxed);
    let snapshot = state.snapshot();
    let in_snapshot = LIVE.load(Ordering::Relaxed) - before;
    let per = |b: usize| b / routes;
    eprintln!(
        "{routes} routes: state {} bytes a route, snapshot {}",
        per(in_state),
        per(in_snapshot)
    );
    assert!(
        per(in_state) <= 320,
        "state: {} bytes a route",
        per(in_state)
    );
    assert!(
        per(in_snapshot) <= 250,
        "snapshot: {} bytes a route",
        per(in_snapshot)
    );
    // The routes through one gateway share one list of paths, the snapshot's too.
    let lists = |s: &State| {
        let mut lists: Vec<*const Path> = s
            .routes(Family::V4, None)
            .filter_map(|r| match &r.paths {
                Paths::Own(p) => Some(Arc::as_ptr(p) as *const Path),
                _ => None,
            })
            .collect();
        lists.sort();
        lists.dedup();
        lists.len()
    };
    assert_eq!(lists(&state), 8);
    drop(snapshot);
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
