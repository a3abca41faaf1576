//! What one `BPF_PROG_TEST_RUN` call costs beyond the lookups it runs, and how the wall
//! clock's figures for the kernel compare with the kernel's own clock.
//!
//! The kernel times its loop of lookups itself; the wall time around the system call also
//! holds the call itself and the kernel swapping the program into its XDP dispatcher
//! before the loop and out after it. This program, as root:
//!
//! 1. loads a table (a random sample of the shipped IPv4 table, or the whole of it) into
//!    a namespace, as `fibre bench` does;
//! 2. times calls of one run of the program and of two, one thread: the kernel swaps the
//!    program into its XDP dispatcher only for calls of more than one run, so the first
//!    give the cost of the system call, the second that of the swaps too (the kernel's
//!    clock gives the runs' share);
//! 3. measures the kernel's lookups as `fibre bench` does, `COUNT` lookups a call, for 1
//!    up to `THREADS` threads, and prints per lookup the kernel's clock and the wall
//!    clock, for the lookups, the dry run and the difference.
//!
//! `cargo run --release -p fibre-bench --example kernel_call_cost [ROUTES] [COUNT]
//! [THREADS] [REPETITIONS]` (ROUTES 0, the default, is the whole table; COUNT 65536;
//! THREADS 3; REPETITIONS 12).

use fibre_bench::addresses;
use fibre_bench::kernel::KernelFib;
use fibre_bench::method::Method;
use fibre_bench::source::{final_prefixes, read_route_file};
use fibre_kernel::netns::INPUT_DEV;
use fibre_kernel::probe::FibProbe;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arg = |i: usize, default: u64| -> Result<u64, Box<dyn std::error::Error>> {
        Ok(match std::env::args().nth(i) {
            Some(a) => a.parse()?,
            None => default,
        })
    };
    let (size, count, max_threads, reps) = (arg(1, 0)?, arg(2, 1 << 16)?, arg(3, 3)?, arg(4, 12)?);
    let rib = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/ris-2026-05-11/rib-v4.txt.gz");
    let all = final_prefixes(&read_route_file(&rib, false)?.v4);
    let routes = if size == 0 || size as usize >= all.len() {
        all
    } else {
        use rand::SeedableRng;
        let mut rng = rand::rngs::SmallRng::seed_from_u64(size);
        let mut v: Vec<_> = rand::seq::index::sample(&mut rng, all.len(), size as usize)
            .into_iter()
            .map(|i| all[i])
            .collect();
        v.sort_unstable();
        v
    };
    let kernel = KernelFib::new()?;
    let load = kernel.load(&routes)?;
    println!(
        "IPv4, {} routes loaded in {:.1} s",
        routes.len(),
        load.seconds
    );
    let keys = addresses::matched(&routes, count as usize, 1);
    let ips: Vec<IpAddr> = keys
        .iter()
        .map(|&k| IpAddr::V4(Ipv4Addr::from(k)))
        .collect();

    // 2. Calls of one and of two lookups: the fixed cost of a call. (The kernel swaps the
    // program into its XDP dispatcher only for calls of more than one run.)
    let ns = kernel.namespace();
    let input = ns.ifindex(INPUT_DEV)?;
    let probe = FibProbe::new(4, &ips)?;
    probe.spread_cursors()?;
    std::thread::scope(|s| {
        s.spawn(|| -> std::io::Result<()> {
            ns.enter()?;
            for (repeat, calls) in [(1u32, 2000usize), (2, 200)] {
                for lookup in [true, false] {
                    let mut walls = Vec::new();
                    let mut clocks = 0u64;
                    for _ in 0..calls {
                        let start = Instant::now();
                        clocks += u64::from(probe.run(lookup, input, repeat)?);
                        walls.push(start.elapsed().as_nanos() as f64);
                    }
                    walls.sort_by(f64::total_cmp);
                    let mean = walls.iter().sum::<f64>() / walls.len() as f64;
                    let us = |ns: f64| ns / 1e3;
                    println!(
                        "{}: {calls} calls of {repeat} run(s), wall time a call: median {:.1} µs, \
                         mean {:.1} µs, 10th-90th percentile {:.1}-{:.1} µs (kernel's clock: \
                         {:.0} ns a run)",
                        if lookup { "lookup " } else { "dry run" },
                        us(walls[walls.len() / 2]),
                        us(mean),
                        us(walls[walls.len() / 10]),
                        us(walls[walls.len() * 9 / 10]),
                        clocks as f64 / calls as f64
                    );
                }
            }
            Ok(())
        })
        .join()
        .expect("thread")
    })?;

    // 3. As `fibre bench` measures: COUNT lookups a call, 1 to THREADS threads.
    println!(
        "{count} lookups a call, {reps} repetitions; ns per lookup (wall: over all lookups of \
         all threads)"
    );
    println!(
        "threads | lookup clock | lookup wall | dry clock | dry wall | net clock | net wall | \
         wall-clock a call (lookup, dry), µs"
    );
    for threads in 1..=max_threads as usize {
        let method = Method {
            repetitions: reps as usize,
            threads,
        };
        let t = kernel.lookups(4, &ips, method, count as u32)?;
        let net = t.net();
        // Per call and thread: (wall per lookup * threads - clock per lookup) * count;
        // meaningful while the threads have a CPU each.
        let extra = |wall: f64, clock: f64| (wall * threads as f64 - clock) * count as f64 / 1e3;
        println!(
            "{threads} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0}, {:.0}",
            t.real.per_op.mean,
            t.real.throughput.mean,
            t.dry.per_op.mean,
            t.dry.throughput.mean,
            net.per_op.mean,
            net.throughput.mean,
            extra(t.real.throughput.mean, t.real.per_op.mean),
            extra(t.dry.throughput.mean, t.dry.per_op.mean),
        );
    }
    Ok(())
}
