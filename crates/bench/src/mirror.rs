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
use fibre_kernel::netns::{gateway, OUTPUT_DEV};
use fibre_lpm::{Key, Prefix};
use fibre_mirror::kernel::{self as nl, Batch, Events};
use fibre_mirror::Mirror;
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
}

impl Default for MirrorConfig {
    fn default() -> Self {
        MirrorConfig {
            updates: 10_000,
            paced: 200,
            idle: Duration::from_secs(2),
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

/// The single changes of each kind, after the setup they need: a name, and `ip -batch`
/// lines. A link of its own (`fx`) with routes through it is taken down and up; a nexthop
/// object carrying [`OBJECT_ROUTES`] routes is replaced.
fn change_kinds() -> (String, Vec<(&'static str, String)>) {
    let gw = gateway(<u32 as Key>::FAMILY, 0);
    let mut setup = format!(
        "link add fx type veth peer name fy\nlink set fx up\nlink set fy up\n\
         addr add 10.201.0.1/24 dev fx\nnexthop add id 100 via {gw} dev {OUTPUT_DEV}\n"
    );
    for i in 0..1000 {
        setup += &format!(
            "route add 10.210.{}.{}/32 via 10.201.0.2 dev fx\n",
            i / 250,
            i % 250
        );
    }
    for i in 0..OBJECT_ROUTES {
        setup += &format!(
            "route add 100.{}.{}.{}/32 nhid 100 table 300\n",
            64 + i / 65_536,
            i / 256 % 256,
            i % 256
        );
    }
    let route = |dst: &str| format!("route replace {dst} via {gw} dev {OUTPUT_DEV}\n");
    let kinds = vec![
        (
            "a route, the first after the setup (its publication brings the spare snapshot \
             up to the setup's 101,000 routes too)",
            route("198.18.255.2/32"),
        ),
        ("a route", route("198.18.255.1/32")),
        ("an address", "addr add 10.202.0.1/24 dev fx\n".to_string()),
        (
            "an address deleted",
            "addr del 10.202.0.1/24 dev fx\n".to_string(),
        ),
        (
            "a nexthop object carrying 100,000 routes",
            format!(
                "nexthop replace id 100 via {} dev {OUTPUT_DEV}\n",
                gateway(<u32 as Key>::FAMILY, 1)
            ),
        ),
        (
            FIRST_RULE,
            "rule add from 10.204.0.0/24 lookup 301 pref 900\n".to_string(),
        ),
        (
            "a route, right after the first rule",
            route("198.18.255.3/32"),
        ),
        (
            "a rule added",
            "rule add from 10.203.0.0/24 lookup 300 pref 1000\n".to_string(),
        ),
        ("a rule deleted", "rule del pref 1000\n".to_string()),
        (
            "a new table",
            format!("route add 198.18.254.0/24 via {gw} dev {OUTPUT_DEV} table 400\n"),
        ),
        (
            "a table gone",
            format!("route del 198.18.254.0/24 via {gw} dev {OUTPUT_DEV} table 400\n"),
        ),
        (
            "a link down (1,000 routes through it)",
            "link set fx down\n".to_string(),
        ),
        ("the link up again", "link set fx up\n".to_string()),
    ];
    (setup, kinds)
}

/// IPv4's first rule other than the defaults: it parts `local` from `main`, which the
/// kernel does with a walk of its whole table (`fib_unmerge`), and fibre by a patch at
/// `local`'s prefixes and a copy of the merged table's search.
pub const FIRST_RULE: &str = "the first IPv4 rule (parts local from main, as the kernel does)";

/// The sentinel route ending the `k`-th phase of single changes (after the setup's, 0).
fn kind_sentinel(k: usize) -> String {
    format!("198.51.100.{}/32", 10 + k)
}

/// What the mirror made of one single change.
struct KindFollowed {
    /// The longest lag from a batch's arrival to its publication in the phase.
    lag: Option<Duration>,
    patched: u64,
    compiled: u64,
}

/// Applies what the kernel announces until the mirror holds sentinel route `dst`.
fn follow_until(mirror: &mut Mirror, events: &mut Events, dst: &str) -> Result<(), String> {
    let e = |e: std::io::Error| e.to_string();
    let dst = fibre_fib::Net::parse(dst, None)?;
    loop {
        match events.receive().map_err(e)? {
            Batch::Messages(b, bad) => mirror.apply(b, bad, Instant::now()),
            Batch::Overflow => {
                mirror.overflowed();
                mirror.resync().map_err(e)?;
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

/// What the mirror's thread measured.
struct Followed {
    dump: Duration,
    sync: Duration,
    sync_dump: Duration,
    sync_build: Duration,
    /// Packing the state's tables, on the mirror's thread once the sync is published
    /// (not in `sync`).
    sync_pack: Duration,
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
    let (kind_setup, kinds) = change_kinds();
    let kind_count = kinds.len();
    k.namespace()
        .batch(&format!(
            "route add unreachable {} table {SENTINEL_TABLE}\n",
            SENTINELS[0]
        ))
        .map_err(io)?;
    let idle = cfg.idle;
    let mirror = std::thread::spawn(move || -> Result<Followed, String> {
        let e = |e: std::io::Error| e.to_string();
        nl::enter_netns(&name).map_err(e)?;
        // The kernel's own dump of everything the mirror follows, the best of three.
        let mut dump = Duration::MAX;
        for _ in 0..3 {
            let t = Instant::now();
            nl::dump(drop).map_err(e)?;
            dump = dump.min(t.elapsed());
        }
        let mut events = Events::subscribe(nl::RECEIVE_BUFFER).map_err(e)?;
        let resident_before = resident();
        let t = Instant::now();
        let (mut mirror, reader) = Mirror::sync().map_err(e)?;
        // Until the kernel's state is published; the state's tables are packed after.
        let sync = t.elapsed().saturating_sub(mirror.stats().pack_time);
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
        let _ = ready.send(Instant::now());
        let _ = burst_start.recv();
        let cpu = thread_cpu();
        let before = mirror.stats().batches;
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
            publications: p.batches - s.batches,
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
        for k in 1..=kind_count {
            mirror.stats_mut().clear_lags();
            let made = mirror.publications();
            let _ = kind_ready.send(());
            follow_until(&mut mirror, &mut events, &kind_sentinel(k))?;
            let now = mirror.publications();
            kinds.push(KindFollowed {
                lag: mirror.stats().lag(1.0),
                patched: now.patched - made.patched,
                compiled: now.compiled - made.compiled,
            });
        }
        Ok(Followed {
            dump,
            sync,
            sync_dump: s.dump_time,
            sync_build: s.build_time,
            sync_pack: s.pack_time,
            idle_cpu,
            busy_cpu,
            caught_up,
            publications: s.batches - before,
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
    for (i, (_, change)) in kinds.iter().enumerate() {
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
        .zip(&f.kinds)
        .zip(&kernel_took)
        .map(|(((name, _), k), &kernel)| {
            json!({
                "kind": name,
                "lag_s": k.lag.map(secs),
                "kernel_command_s": secs(kernel),
                "patched": k.patched,
                "compiled": k.compiled,
            })
        })
        .collect();
    let mut figures = json!({
        "study": "mirror",
        "routes_v4": v4.len(),
        "routes_v6": v6.len(),
        "routes_mirrored": f.routes,
        "kernel_load_s": load4.seconds + load6.seconds,
        "kernel_dump_s": secs(f.dump),
        "sync_s": secs(f.sync),
        "sync_dump_s": secs(f.sync_dump),
        "sync_build_s": secs(f.sync_build),
        "sync_over_dump": secs(f.sync) / secs(f.dump),
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
    figures["sync_pack_s"] = json!(secs(f.sync_pack));
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
             the mirror holds {} (with the kernel's own).\n\n\
             | | seconds |\n|---|---:|\n\
             | the kernel's dump of links, addresses, rules, nexthops, routes, neighbours | {:.3} |\n\
             | the mirror's sync (subscribe, dump, build, compile, publish) | {:.3} |\n\
             | its dump, read on a thread of its own while the state is built | {:.3} |\n\
             | building the state, then compiling it | {:.3} |\n\
             | then, once published, packing the state's tables (not in the sync) | {:.3} |\n\n\
             The sync takes {:.1} times the kernel's dump.\n\n\
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
            g("kernel_dump_s"),
            g("sync_s"),
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
        s += "\nSingle changes of each kind, each with the full tables loaded (a sentinel route \
              after each ends it): the longest lag from a batch's arrival to its \
              publication, and how it was published; beside it, the wall time of the \
              kernel's own `ip -batch` of the change and its sentinel (a process started \
              included, about a millisecond).\n\n\
              | change | lag | published by | the kernel's `ip` command |\n|---|---:|---|---:|\n";
        for k in f["single_changes"].as_array().into_iter().flatten() {
            let how = if k["compiled"].as_u64().unwrap_or(0) > 0 {
                "compiling anew"
            } else {
                "a patch"
            };
            s += &format!(
                "| {} | {} | {how} | {} |\n",
                k["kind"].as_str().unwrap_or("?"),
                ms(&k["lag_s"]),
                ms(&k["kernel_command_s"])
            );
        }
    }
    s
}
