//! The mirror study (`fibre bench mirror`): how long the kernel mirror of `fibre daemon`
//! takes to sync a namespace that holds the real tables, against the kernel's own dump of
//! them, and how it follows a burst of changes made there: how long until it holds them
//! all, the lag from a batch's arrival to its publication, the publications, and the CPU
//! time it takes, while busy and while idle.
//!
//! The mirror runs as the daemon runs it (`fibre_mirror`: subscribe, dump, apply batches
//! of notifications), on a thread of this process that entered the namespace; the kernel
//! is asked with `ip -batch`, as an administrator or a routing daemon would change it.

use crate::kernel::KernelFib;
use fibre_lpm::{Key, Prefix};
use fibre_mirror::netlink::{self as nl, Batch, Events};
use fibre_mirror::Mirror;
use fibre_testbed::netns::{gateway, OUTPUT_DEV};
use serde_json::{json, Value};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What the study changes.
#[derive(Clone, Debug)]
pub struct MirrorConfig {
    /// Changes in the burst: routes added, then as many removed again (half each).
    pub updates: usize,
    /// Changes made one at a time after the burst (an `ip route` command each), for the
    /// lag of a single update.
    pub paced: usize,
    /// How long the idle mirror's CPU time is watched.
    pub idle: Duration,
    /// Whether the mirror's thread runs at the lowest real-time priority, as the
    /// daemon's does unless told `--no-realtime`.
    pub realtime: bool,
}

impl Default for MirrorConfig {
    fn default() -> Self {
        MirrorConfig {
            updates: 10_000,
            paced: 200,
            idle: Duration::from_secs(2),
            realtime: true,
        }
    }
}

/// The table of the routes that end a phase: once the mirror holds one, it holds every
/// change made before. It is made before the mirror syncs.
const SENTINEL_TABLE: u32 = 250;

/// The sentinel routes: the table's first, the burst's end, the paced changes' end.
const SENTINELS: [&str; 3] = ["198.51.100.0/32", "198.51.100.1/32", "198.51.100.2/32"];

/// The routes a nexthop object carries in the phase of single changes of each kind.
const OBJECT_ROUTES: usize = 100_000;

/// The setup of the single changes (a link carrying 1,000 routes, a nexthop object
/// carrying [`OBJECT_ROUTES`]), the kinds of change, and the steps that make them: each
/// a kind and the `ip -batch` lines of one change of it. The kinds that can be made again
/// are made [`REPEATS`] times each, so that each has a median and a p99; the first route
/// after the setup and IPv4's first rule happen once. The first rule splits the steps:
/// routes, addresses, the object, tables and the link change before it (IPv4's `local`
/// and `main` merged, as on a router without rules), rules after it. The kernel deletes
/// the IPv4 routes through a link that goes down: after each time the link is up again,
/// a step of no kind ([`RESTORE`], not reported) adds its 1,000 routes back.
fn change_kinds() -> (String, Vec<&'static str>, Vec<(usize, String)>) {
    let gw = |i| gateway(<u32 as Key>::FAMILY, i);
    let gw0 = gw(0);
    let mut setup = format!(
        "link add fx type veth peer name fy\nlink set fx up\nlink set fy up\n\
         addr add 10.201.0.1/24 dev fx\nnexthop add id 100 via {gw0} dev {OUTPUT_DEV}\n"
    );
    let through_fx: String = (0..1000)
        .map(|i| {
            format!(
                "route add 10.210.{}.{}/32 via 10.201.0.2 dev fx\n",
                i / 250,
                i % 250
            )
        })
        .collect();
    setup += &through_fx;
    for i in 0..OBJECT_ROUTES {
        setup += &format!(
            "route add 100.{}.{}.{}/32 nhid 100 table 300\n",
            64 + i / 65_536,
            i / 256 % 256,
            i % 256
        );
    }
    let route = |dst: &str| format!("route replace {dst} via {gw0} dev {OUTPUT_DEV}\n");
    let kinds = vec![
        "a route, the first after the setup (its publication brings the spare snapshot \
         up to the setup's 101,000 routes too)",
        "a route",
        "an address",
        "an address deleted",
        "a nexthop object carrying 100,000 routes",
        FIRST_RULE,
        "a route, right after the first rule",
        "a rule added",
        "a rule deleted",
        "a new table",
        "a table gone",
        "a link down (1,000 routes through it)",
        "the link up again",
    ];
    let mut steps = vec![(0, route("198.18.255.2/32"))];
    for i in 0..REPEATS {
        steps.extend([
            (1, route(&format!("198.18.253.{}/32", i + 1))),
            (2, "addr add 10.202.0.1/24 dev fx\n".to_string()),
            (3, "addr del 10.202.0.1/24 dev fx\n".to_string()),
            // Another path each time: the first gateway and the second in turn.
            (
                4,
                format!(
                    "nexthop replace id 100 via {} dev {OUTPUT_DEV}\n",
                    gw(1 - i % 2)
                ),
            ),
            (
                9,
                format!("route add 198.18.254.0/24 via {gw0} dev {OUTPUT_DEV} table 400\n"),
            ),
            (
                10,
                format!("route del 198.18.254.0/24 via {gw0} dev {OUTPUT_DEV} table 400\n"),
            ),
            (11, "link set fx down\n".to_string()),
            (12, "link set fx up\n".to_string()),
            (RESTORE, through_fx.clone()),
        ]);
    }
    steps.push((
        5,
        "rule add from 10.204.0.0/24 lookup 301 pref 900\n".to_string(),
    ));
    steps.push((6, route("198.18.255.3/32")));
    for _ in 0..REPEATS {
        steps.extend([
            (
                7,
                "rule add from 10.203.0.0/24 lookup 300 pref 1000\n".to_string(),
            ),
            (8, "rule del pref 1000\n".to_string()),
        ]);
    }
    (setup, kinds, steps)
}

/// How many times each kind of single change that can be made again is made: enough for
/// a p99 that is not the largest lag (the 99th of 100), which the report gives too.
const REPEATS: usize = 100;

/// The kind of the steps that only set up the next (not reported).
const RESTORE: usize = usize::MAX;

/// IPv4's first rule other than the defaults: it parts `local` from `main`, which the
/// kernel does with a walk of its whole table (`fib_unmerge`), and fibre by a patch at
/// `local`'s prefixes and a copy of the merged table's search.
pub const FIRST_RULE: &str = "the first IPv4 rule (parts local from main, as the kernel does)";

/// The sentinel route ending the `k`-th step of single changes (after the setup's, 0).
fn kind_sentinel(k: usize) -> String {
    format!("198.51.{}.{}/32", 100 + k / 200, 10 + k % 200)
}

/// What the mirror made of one single change.
struct KindFollowed {
    /// The longest lag from a batch's arrival to its publication in the phase.
    lag: Option<Duration>,
    /// The longest a batch that published nothing took in the phase.
    unpublished: Duration,
    patched: u64,
    compiled: u64,
}

/// Applies what the kernel announces until the mirror holds sentinel route `dst`.
fn follow_until(mirror: &mut Mirror, events: &mut Events, dst: &str) -> Result<(), String> {
    let e = |e: std::io::Error| e.to_string();
    let dst = fibre_fib::Net::parse(dst, None)?;
    loop {
        match events.receive().map_err(e)? {
            Batch::Messages(b, bad) => {
                mirror.apply(b, bad, Instant::now());
            }
            Batch::Overflow => {
                mirror.overflowed();
                fibre_kernel::priority::normal_while(|| mirror.resync()).map_err(e)?;
            }
        }
        let held = mirror
            .state()
            .routes(fibre_fib::Family::V4, Some(SENTINEL_TABLE))
            .any(|r| r.dst == dst);
        if held {
            return Ok(());
        }
    }
}

/// The CPU time this thread has taken (`/proc/thread-self/schedstat`).
fn thread_cpu() -> Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(Duration::ZERO, Duration::from_nanos)
}

/// One round of the sync's measure: the kernel's dump, then a mirror's sync.
#[derive(Clone, Copy)]
struct SyncRound {
    /// The kernel's dump of everything the mirror follows, read as the mirror reads it.
    dump: Duration,
    /// The mirror's sync, until published.
    sync: Duration,
    /// Its dump, read on a thread of its own while the state is built.
    sync_dump: Duration,
    /// Building the state, then compiling it.
    sync_build: Duration,
    /// Packing the state's tables, on the mirror's thread once the sync is published
    /// (not in `sync`).
    sync_pack: Duration,
}

/// Rounds of the kernel's dump and the mirror's sync, alternating: this machine's speed
/// drifts from second to second, so each is the median of as many runs taken side by
/// side, not one run against the best of others.
const SYNC_ROUNDS: usize = 5;

/// The median of `rounds`' `field`, and its least and greatest.
fn spread(
    rounds: &[SyncRound],
    field: fn(&SyncRound) -> Duration,
) -> (Duration, Duration, Duration) {
    let mut v: Vec<Duration> = rounds.iter().map(field).collect();
    v.sort_unstable();
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// What the mirror's thread measured.
struct Followed {
    /// The mirror thread's priority, as the report says it.
    priority: String,
    rounds: Vec<SyncRound>,
    idle_cpu: Duration,
    busy_cpu: Duration,
    caught_up: Instant,
    publications: u64,
    overflows: u64,
    lag_p50: Option<Duration>,
    lag_p99: Option<Duration>,
    patched: u64,
    compiled: u64,
    paced: Paced,
    routes: usize,
    memory: Memory,
    kinds: Vec<KindFollowed>,
}

/// What the mirror holds, in bytes.
struct Memory {
    /// The growth of the process's resident memory over the sync (the allocator's
    /// freed pages given back first).
    resident: u64,
    /// The state's routes ([`fibre_fib::State::memory`]).
    state: usize,
    /// One snapshot's nodes and routes.
    snapshot_routes: usize,
    /// One snapshot's lookup structures.
    snapshot_lookup: usize,
}

/// The process's resident memory, in bytes, once the allocator has given back the pages
/// it holds free (0 if unknown).
fn resident() -> u64 {
    fibre_kernel::memory::resident_bytes_trimmed().unwrap_or(0)
}

/// What the mirror measured of the changes made one at a time.
#[derive(Default)]
struct Paced {
    publications: u64,
    patched: u64,
    lags: usize,
    lag_p50: Option<Duration>,
    lag_p99: Option<Duration>,
    lag_max: Option<Duration>,
}

/// Runs the study on `v4` and `v6` (loaded into a fresh namespace first): figures as
/// JSON objects, or why it cannot run (it needs root).
pub fn mirror_study(
    v4: &[Prefix<u32>],
    v6: &[Prefix<u128>],
    cfg: &MirrorConfig,
) -> Result<Vec<Value>, String> {
    let k = KernelFib::new()?;
    let io = |e: std::io::Error| e.to_string();
    let load4 = k.load(v4).map_err(io)?;
    let load6 = k.load(v6).map_err(io)?;
    let name = k.namespace().name().to_string();
    let (ready, started) = mpsc::channel::<Instant>();
    let (go, burst_start) = mpsc::channel::<()>();
    let (burst_done, burst_followed) = mpsc::channel::<()>();
    let (paced_done, paced_followed) = mpsc::channel::<()>();
    let (kind_ready, kind_wanted) = mpsc::channel::<()>();
    let (kind_setup, kinds, steps) = change_kinds();
    let step_count = steps.len();
    k.namespace()
        .batch(&format!(
            "route add unreachable {} table {SENTINEL_TABLE}\n",
            SENTINELS[0]
        ))
        .map_err(io)?;
    let (idle, realtime) = (cfg.idle, cfg.realtime);
    let mirror = std::thread::spawn(move || -> Result<Followed, String> {
        let e = |e: std::io::Error| e.to_string();
        fibre_kernel::netns::enter(&name).map_err(e)?;
        // The kernel's own dump of everything the mirror follows, then the mirror's sync:
        // this first round's mirror is the one followed below (its memory measured before
        // any other is made), the other rounds' are dropped.
        let dump = || -> Result<Duration, String> {
            let t = Instant::now();
            nl::dump(drop).map_err(e)?;
            Ok(t.elapsed())
        };
        let round = |dump: Duration, sync: Duration, m: &Mirror| SyncRound {
            dump,
            // Until the kernel's state is published; the state's tables are packed after.
            sync: sync.saturating_sub(m.stats().pack_time),
            sync_dump: m.stats().dump_time,
            sync_build: m.stats().build_time,
            sync_pack: m.stats().pack_time,
        };
        let first_dump = dump()?;
        let mut events = Events::subscribe(nl::RECEIVE_BUFFER).map_err(e)?;
        let resident_before = resident();
        let t = Instant::now();
        let (mut mirror, reader) = Mirror::sync().map_err(e)?;
        let mut rounds = vec![round(first_dump, t.elapsed(), &mirror)];
        let routes = mirror.state().routes(fibre_fib::Family::V4, None).count()
            + mirror.state().routes(fibre_fib::Family::V6, None).count();
        // Idle: nothing changes; the mirror waits in `recv`.
        let cpu = thread_cpu();
        std::thread::sleep(idle);
        let idle_cpu = thread_cpu() - cpu;
        // By now the spare snapshot is copied: the state and both snapshots are held, as
        // in the daemon (whose workers hold a reader, as `reader` here).
        let resident = resident().saturating_sub(resident_before);
        let parts = mirror.snapshot().memory_parts();
        let memory = Memory {
            resident,
            state: mirror.state().memory(),
            snapshot_routes: parts.routes,
            snapshot_lookup: parts.lookup,
        };
        drop(reader);
        while rounds.len() < SYNC_ROUNDS {
            let dumped = dump()?;
            let t = Instant::now();
            let (other, _) = Mirror::sync().map_err(e)?;
            rounds.push(round(dumped, t.elapsed(), &other));
        }
        // As the daemon's mirror runs once synced (its main thread).
        use fibre_kernel::priority;
        let priority = match realtime {
            false => "normal (`--no-realtime`)".to_string(),
            true => match priority::make_this_thread_realtime() {
                Ok(()) => format!(
                    "the lowest real-time (`SCHED_FIFO` {}), as the daemon's",
                    priority::LOWEST_REALTIME
                ),
                Err(e) => format!("normal: a real-time one was refused ({e})"),
            },
        };
        let _ = ready.send(Instant::now());
        let _ = burst_start.recv();
        let cpu = thread_cpu();
        let made = mirror.publications();
        follow_until(&mut mirror, &mut events, SENTINELS[1])?;
        let busy_cpu = thread_cpu() - cpu;
        let caught_up = Instant::now();
        let s = mirror.stats().clone();
        let after = mirror.publications();
        // One change at a time: each its own batch, its lag a single update's.
        mirror.stats_mut().clear_lags();
        let _ = burst_done.send(());
        follow_until(&mut mirror, &mut events, SENTINELS[2])?;
        let p = mirror.stats();
        let paced = Paced {
            publications: mirror.publications().made() - after.made(),
            patched: mirror.publications().patched - after.patched,
            lags: p.lags(),
            lag_p50: p.lag(0.5),
            lag_p99: p.lag(0.99),
            lag_max: p.lag(1.0),
        };
        // One change of each kind, each with a sentinel after it, the setup first.
        let _ = paced_done.send(());
        follow_until(&mut mirror, &mut events, &kind_sentinel(0))?;
        let mut kinds = Vec::new();
        for k in 1..=step_count {
            mirror.stats_mut().clear_lags();
            let made = mirror.publications();
            let _ = kind_ready.send(());
            follow_until(&mut mirror, &mut events, &kind_sentinel(k))?;
            let now = mirror.publications();
            kinds.push(KindFollowed {
                lag: mirror.stats().lag(1.0),
                unpublished: mirror.stats().unpublished_longest(),
                patched: now.patched - made.patched,
                compiled: now.compiled - made.compiled,
            });
        }
        Ok(Followed {
            priority,
            rounds,
            idle_cpu,
            busy_cpu,
            caught_up,
            publications: after.made() - made.made(),
            overflows: s.overflows,
            lag_p50: s.lag(0.5),
            lag_p99: s.lag(0.99),
            patched: after.patched - made.patched,
            compiled: after.compiled - made.compiled,
            paced,
            routes,
            memory,
            kinds,
        })
    });
    let Ok(_) = started.recv() else {
        return Err(joined(mirror));
    };
    let mut burst = String::new();
    let half = cfg.updates / 2;
    for i in 0..half {
        burst += &format!(
            "route add 198.18.{}.{}/32 via {} dev {OUTPUT_DEV}\n",
            i / 256 % 256,
            i % 256,
            gateway(<u32 as Key>::FAMILY, i % 8)
        );
    }
    for i in 0..half {
        burst += &format!("route del 198.18.{}.{}/32\n", i / 256 % 256, i % 256);
    }
    burst += &format!(
        "route add unreachable {} table {SENTINEL_TABLE}\n",
        SENTINELS[1]
    );
    let _ = go.send(());
    let start = Instant::now();
    k.namespace().batch(&burst).map_err(io)?;
    let kernel_done = start.elapsed();
    if burst_followed.recv().is_err() {
        return Err(joined(mirror));
    }
    // One `ip` command a change: a few milliseconds apart.
    let paced = cfg.paced / 2;
    for op in ["add", "del"] {
        for i in 0..paced {
            let dst = format!("198.19.{}.{}/32", i / 256 % 256, i % 256);
            let gw = gateway(<u32 as Key>::FAMILY, i % 8).to_string();
            let mut args = vec!["route", op, &dst];
            if op == "add" {
                args.extend(["via", &gw, "dev", OUTPUT_DEV]);
            }
            k.namespace().ip(&args).map_err(io)?;
        }
    }
    k.namespace()
        .ip(&["route", "add", "unreachable", SENTINELS[2], "table", "250"])
        .map_err(io)?;
    if paced_followed.recv().is_err() {
        return Err(joined(mirror));
    }
    k.namespace()
        .batch(&format!(
            "{kind_setup}route add unreachable {} table 250
",
            kind_sentinel(0)
        ))
        .map_err(io)?;
    let mut kernel_took = Vec::new();
    for (i, (_, change)) in steps.iter().enumerate() {
        if kind_wanted.recv().is_err() {
            return Err(joined(mirror));
        }
        let started = Instant::now();
        k.namespace()
            .batch(&format!(
                "{change}route add unreachable {} table 250
",
                kind_sentinel(i + 1)
            ))
            .map_err(io)?;
        kernel_took.push(started.elapsed());
    }
    let f = mirror
        .join()
        .map_err(|_| "the mirror's thread panicked".to_string())??;
    let caught_up = f.caught_up.duration_since(start);
    let secs = |d: Duration| d.as_secs_f64();
    let changes = 2 * half + 1;
    let kernel_bytes = match (&load4.slab, &load6.slab) {
        (Ok(a), Ok(b)) => Some(a + b),
        _ => None,
    };
    let per_route = |b: f64| b / f.routes.max(1) as f64;
    let single_changes: Vec<Value> = kinds
        .iter()
        .enumerate()
        .map(|(kind, name)| {
            // The steps of this kind: each one change's lag, and the kernel's command.
            let made: Vec<(&KindFollowed, Duration)> = steps
                .iter()
                .zip(&f.kinds)
                .zip(&kernel_took)
                .filter(|(((k, _), _), _)| *k == kind)
                .map(|((_, followed), &kernel)| (followed, kernel))
                .collect();
            let in_order: Vec<Duration> = made.iter().filter_map(|(k, _)| k.lag).collect();
            let mut lags = in_order.clone();
            lags.sort_unstable();
            let mut kernel: Vec<Duration> = made.iter().map(|(_, d)| *d).collect();
            kernel.sort_unstable();
            let at = |v: &[Duration], q: f64| {
                (!v.is_empty())
                    .then(|| secs(v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1]))
            };
            json!({
                "kind": name,
                "changes": made.len(),
                "lag_p50_s": at(&lags, 0.5),
                "lag_p99_s": at(&lags, 0.99),
                "lag_max_s": lags.last().map(|&d| secs(d)),
                // Each change's, in the order they were made.
                "lags_s": in_order.iter().map(|&d| secs(d)).collect::<Vec<f64>>(),
                "kernel_command_s": at(&kernel, 0.5),
                // Batches that published nothing (the kernel's reports of routes again)
                // have no lag: the longest of them in any of the kind's steps.
                "unpublished_max_s": made.iter().map(|(k, _)| secs(k.unpublished)).fold(0.0, f64::max),
                "patched": made.iter().map(|(k, _)| k.patched).sum::<u64>(),
                "compiled": made.iter().map(|(k, _)| k.compiled).sum::<u64>(),
            })
        })
        .collect();
    let (dump, sync) = (spread(&f.rounds, |r| r.dump), spread(&f.rounds, |r| r.sync));
    let mut figures = json!({
        "study": "mirror",
        "routes_v4": v4.len(),
        "routes_v6": v6.len(),
        "routes_mirrored": f.routes,
        "kernel_load_s": load4.seconds + load6.seconds,
        "kernel_dump_s": secs(dump.0),
        "sync_s": secs(sync.0),
        "sync_dump_s": secs(spread(&f.rounds, |r| r.sync_dump).0),
        "sync_build_s": secs(spread(&f.rounds, |r| r.sync_build).0),
        "sync_over_dump": secs(sync.0) / secs(dump.0),
        "updates": changes,
        "kernel_updates_s": secs(kernel_done),
        "kernel_updates_per_s": changes as f64 / secs(kernel_done),
        "caught_up_s": secs(caught_up),
        "mirror_updates_per_s": changes as f64 / secs(caught_up),
        "publications": f.publications,
        "overflows": f.overflows,
        "lag_p50_s": f.lag_p50.map(secs),
        "lag_p99_s": f.lag_p99.map(secs),
        "patched": f.patched,
        "compiled": f.compiled,
        "paced_updates": 2 * paced + 1,
        "paced_publications": f.paced.publications,
        "paced_patched": f.paced.patched,
        "paced_lags": f.paced.lags,
        "paced_lag_p50_s": f.paced.lag_p50.map(secs),
        "paced_lag_p99_s": f.paced.lag_p99.map(secs),
        "paced_lag_max_s": f.paced.lag_max.map(secs),
        "busy_cpu_s": secs(f.busy_cpu),
        "idle_cpu_s": secs(f.idle_cpu),
        "idle_s": secs(idle),
        "kernel_route_bytes": kernel_bytes,
        "kernel_route_bytes_error": match (&load4.slab, &load6.slab) {
            (Err(e), _) | (_, Err(e)) => Some(e.clone()),
            _ => None,
        },
        "mirror_resident_bytes": f.memory.resident,
        "mirror_over_kernel": kernel_bytes.map(|k| f.memory.resident as f64 / k as f64),
        "state_bytes_per_route": per_route(f.memory.state as f64),
        "snapshot_routes_bytes_per_route": per_route(f.memory.snapshot_routes as f64),
        "snapshot_lookup_bytes_per_route": per_route(f.memory.snapshot_lookup as f64),
        "resident_bytes_per_route": per_route(f.memory.resident as f64),
        "kernel_bytes_per_route": kernel_bytes.map(|k| per_route(k as f64)),
        "single_changes": single_changes,
    });
    // Beside the macro's object: one more key there passes its recursion limit.
    figures["sync_pack_s"] = json!(secs(spread(&f.rounds, |r| r.sync_pack).0));
    figures["sync_rounds"] = json!(f.rounds.len());
    figures["kernel_dump_range_s"] = json!([secs(dump.1), secs(dump.2)]);
    figures["sync_range_s"] = json!([secs(sync.1), secs(sync.2)]);
    figures["mirror_priority"] = json!(f.priority);
    Ok(vec![figures])
}

/// The mirror thread's error, once it has ended.
fn joined(h: std::thread::JoinHandle<Result<Followed, String>>) -> String {
    match h.join() {
        Ok(Err(e)) => e,
        Ok(Ok(_)) => "the mirror ended early".into(),
        Err(_) => "the mirror's thread panicked".into(),
    }
}

/// A range of seconds, `[least, greatest]`, as `least-greatest`.
fn range(v: &Value) -> String {
    let at = |i: usize| v[i].as_f64().unwrap_or(f64::NAN);
    format!("{:.3}-{:.3}", at(0), at(1))
}

/// Seconds as milliseconds, or `-`.
fn ms(v: &Value) -> String {
    v.as_f64()
        .map_or("-".into(), |v| format!("{:.3} ms", v * 1e3))
}

/// The report of the study's figures.
pub fn markdown(figures: &[Value], header: &str) -> String {
    let mut s = format!("# fibre bench mirror\n\n{header}\n\n");
    for f in figures {
        let g = |k: &str| f[k].as_f64().unwrap_or(f64::NAN);
        s += &format!(
            "Routes: {} IPv4 and {} IPv6, loaded into a namespace with `ip -batch` in {:.1} s; \
             the mirror holds {} (with the kernel's own). The mirror's thread runs at {} \
             priority.\n\n\
             {} rounds, each the kernel's dump then the mirror's sync; the median of each, \
             in seconds, and the range:\n\n\
             | | median | range |\n|---|---:|---:|\n\
             | the kernel's dump of links, addresses, rules, nexthops, routes, neighbours | {:.3} | {} |\n\
             | the mirror's sync (subscribe, dump, build, compile, publish) | {:.3} | {} |\n\
             | its dump, read on a thread of its own while the state is built | {:.3} | |\n\
             | building the state, then compiling it | {:.3} | |\n\
             | then, once published, packing the state's tables (not in the sync) | {:.3} | |\n\n\
             The sync takes {:.2} times the kernel's dump.\n\n\
             A burst of {} changes ({} routes added, then removed, then a sentinel): the kernel \
             made them in {:.3} s ({:.0} a second); the mirror held them all {:.3} s after the \
             burst began ({:.0} a second), in {} publications ({} patched, {} compiled; {} \
             overflows). Lag from a batch's arrival to its publication: p50 {}, p99 {}. CPU \
             time: {:.3} s while following the burst, {:.6} s idle over {:.1} s.\n\n\
             Then {} changes one at a time (an `ip route` command each): {} publications, {} \
             patched. Lag from a change's arrival to its publication, over {} changes: p50 {}, \
             p99 {}, max {}.\n",
            f["routes_v4"],
            f["routes_v6"],
            g("kernel_load_s"),
            f["routes_mirrored"],
            f["mirror_priority"].as_str().unwrap_or("an unrecorded"),
            f["sync_rounds"],
            g("kernel_dump_s"),
            range(&f["kernel_dump_range_s"]),
            g("sync_s"),
            range(&f["sync_range_s"]),
            g("sync_dump_s"),
            g("sync_build_s"),
            g("sync_pack_s"),
            g("sync_over_dump"),
            f["updates"],
            f["updates"].as_u64().unwrap_or(0) / 2,
            g("kernel_updates_s"),
            g("kernel_updates_per_s"),
            g("caught_up_s"),
            g("mirror_updates_per_s"),
            f["publications"],
            f["patched"],
            f["compiled"],
            f["overflows"],
            ms(&f["lag_p50_s"]),
            ms(&f["lag_p99_s"]),
            g("busy_cpu_s"),
            g("idle_cpu_s"),
            g("idle_s"),
            f["paced_updates"],
            f["paced_publications"],
            f["paced_patched"],
            f["paced_lags"],
            ms(&f["paced_lag_p50_s"]),
            ms(&f["paced_lag_p99_s"]),
            ms(&f["paced_lag_max_s"]),
        );
        let mib = |k: &str| {
            f[k].as_f64()
                .map_or("-".into(), |b| format!("{:.0} MiB", b / (1 << 20) as f64))
        };
        let per = |k: &str| f[k].as_f64().map_or("-".into(), |b| format!("{b:.0}"));
        s += &format!(
            "\nMemory, beside the kernel's for the same routes:\n\n\
             | | bytes a route | total |\n|---|---:|---:|\n\
             | the kernel (its slab's growth as the routes were loaded) | {} | {} |\n\
             | the mirror (resident growth over the sync: the state and both snapshots) | {} | {} |\n\
             | of which the state's routes | {} | |\n\
             | of which the snapshots' nodes (the two share them) | {} | |\n\
             | of which one snapshot's lookup structures (each has its own) | {} | |\n\n\
             The mirror takes {} times the kernel's memory.\n",
            per("kernel_bytes_per_route"),
            mib("kernel_route_bytes"),
            per("resident_bytes_per_route"),
            mib("mirror_resident_bytes"),
            per("state_bytes_per_route"),
            per("snapshot_routes_bytes_per_route"),
            per("snapshot_lookup_bytes_per_route"),
            f["mirror_over_kernel"].as_f64().map_or("-".into(), |r| format!("{r:.2}")),
        );
        s += "\nSingle changes of each kind, with the full tables loaded, each made as many \
              times as said (a sentinel route after each ends it): of each change, the \
              longest lag from a batch's arrival to its publication, their median, p99 (of \
              100, the 99th) and largest, and how they were published; beside it, the \
              median wall time of the kernel's own `ip -batch` of the change and its \
              sentinel (a process started included, about a millisecond). A batch that \
              publishes nothing (routes the kernel reports again, which the mirror \
              drops) has no lag; the longest such batch is given apart.\n\n\
              | change | times | lag p50 | lag p99 | lag max | published by | the kernel's `ip` command | longest batch publishing nothing |\n\
              |---|---:|---:|---:|---:|---|---:|---:|\n";
        for k in f["single_changes"].as_array().into_iter().flatten() {
            let compiled = k["compiled"].as_u64().unwrap_or(0);
            let how = if compiled > 0 {
                format!("{compiled} compiling anew")
            } else {
                "patches".to_string()
            };
            s += &format!(
                "| {} | {} | {} | {} | {} | {how} | {} | {} |\n",
                k["kind"].as_str().unwrap_or("?"),
                k["changes"],
                ms(&k["lag_p50_s"]),
                ms(&k["lag_p99_s"]),
                ms(&k["lag_max_s"]),
                ms(&k["kernel_command_s"]),
                match k["unpublished_max_s"].as_f64() {
                    Some(0.0) => "none".to_string(),
                    _ => ms(&k["unpublished_max_s"]),
                }
            );
        }
    }
    s
}
