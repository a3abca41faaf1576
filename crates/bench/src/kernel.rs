//! The kernel side of the studies: the same routes loaded into the Linux kernel of a
//! private namespace, the same addresses looked up by the kernel's own FIB code, measured
//! by the same method (pinned threads, repetitions, trimmed mean, dry run subtracted).
//!
//! Routes point at [`GATEWAYS`] on-link gateways, route `i` at gateway `i mod GATEWAYS`,
//! as a router's table points many prefixes at a few next hops. Loading goes through
//! `ip -batch`, the way an administrator would load a table; its speed and the growth of
//! the kernel's slab memory are reported.

use crate::method::{measure_self_timed, Method, Timing};
use fibre_kernel::netns::{gateway, unavailable_reason, Namespace, INPUT_DEV, OUTPUT_DEV};
use fibre_kernel::probe::{ret, FibProbe};
use fibre_lpm::{Key, Prefix};
use std::io;
use std::net::IpAddr;
use std::time::Instant;

/// Next hops per family.
pub const GATEWAYS: usize = 64;

/// A kernel FIB of its own, in a namespace.
pub struct KernelFib {
    ns: Namespace,
    input: u32,
}

/// What loading a table into the kernel cost.
#[derive(Clone, Copy, Debug)]
pub struct LoadCost {
    /// Wall time of `ip -batch`.
    pub seconds: f64,
    /// Growth of the kernel's slab memory (from /proc/meminfo; the whole machine's, so
    /// other activity adds noise).
    pub slab_bytes: i64,
}

/// The kernel's lookups as measured: the lookup program and its dry run, each with two
/// figures per lookup, the kernel's own clock around its loop (`per_op`) and the wall
/// clock around the calls of all threads at once (`throughput`).
#[derive(Clone, Copy, Debug)]
pub struct KernelTiming {
    /// The lookup program.
    pub real: Timing,
    /// The dry run: the same program without the helper call.
    pub dry: Timing,
}

impl KernelTiming {
    /// The lookups' figures: the dry run's subtracted from the real ones, clock from clock
    /// and wall from wall.
    pub fn net(&self) -> Timing {
        self.real.minus(self.dry)
    }
}

impl KernelFib {
    /// A fresh namespace set up as a router, or the reason the kernel side cannot run.
    pub fn new() -> Result<KernelFib, String> {
        if let Some(why) = unavailable_reason() {
            return Err(why);
        }
        let setup = || -> io::Result<KernelFib> {
            let ns = Namespace::create("bench")?;
            ns.setup_router(GATEWAYS)?;
            let input = ns.ifindex(INPUT_DEV)?;
            Ok(KernelFib { ns, input })
        };
        setup().map_err(|e| format!("cannot set up the kernel side: {e}"))
    }

    /// Adds routes (one family) to the namespace's main table.
    pub fn load<K: Key>(&self, prefixes: &[Prefix<K>]) -> io::Result<LoadCost> {
        let mut cmds = String::with_capacity(prefixes.len() * 48);
        for (i, p) in prefixes.iter().enumerate() {
            cmds.push_str(&format!(
                "route add {p} via {} dev {OUTPUT_DEV}\n",
                gateway(K::FAMILY, i % GATEWAYS)
            ));
        }
        let slab_before = slab_bytes()?;
        let start = Instant::now();
        self.ns.batch(&cmds)?;
        let seconds = start.elapsed().as_secs_f64();
        Ok(LoadCost {
            seconds,
            slab_bytes: slab_bytes()? - slab_before,
        })
    }

    /// Removes routes, timing it.
    pub fn unload<K: Key>(&self, prefixes: &[Prefix<K>]) -> io::Result<f64> {
        let mut cmds = String::with_capacity(prefixes.len() * 32);
        for p in prefixes {
            cmds.push_str(&format!("route del {p}\n"));
        }
        let start = Instant::now();
        self.ns.batch(&cmds)?;
        Ok(start.elapsed().as_secs_f64())
    }

    /// Measures the kernel's lookups of `addrs` (one family, at least one): `per_rep`
    /// lookups per thread per repetition, the lookup program and then its dry run. Each
    /// is timed two ways: by the kernel's own clock around its loop, and by the wall
    /// clock around the `BPF_PROG_TEST_RUN` calls of all threads, which start each
    /// repetition together (see [`measure_self_timed`]). Fails if the lookups did not all
    /// complete (so that the figures are lookups, not an early error path).
    ///
    /// The wall time of a call holds fixed costs the kernel's clock leaves out: the system
    /// call and, for a call of more than one run, the kernel swapping the program into its
    /// XDP dispatcher before the loop and out of it after, each swap waiting for an RCU
    /// grace period. The dry run pays them too, so they cancel in the difference on
    /// average, and `per_rep` lookups a call amortise the noise they add.
    ///
    /// How large they are, measured on a 2-CPU AMD EPYC VM under Linux 6.18 (HZ=250),
    /// one thread (`cargo run --release -p fibre-bench --example kernel_call_cost`): a
    /// call of one run takes 2-3 µs of wall time, a call of two runs 16.0 ms (10th to
    /// 90th percentile 15.97-16.03 ms on the idle machine, up to 32 ms when other work
    /// ran), four ticks of the two swaps. At the default 65,536 lookups a call that is
    /// some 244 ns a lookup in the lookups' wall time and the dry run's alike, and the
    /// difference came out at 793 ns a lookup against the kernel clock's 766 on the whole
    /// IPv4 table (1,042,325 routes); on a sample of 10,000 routes, 275 against 255 in one
    /// run and 153 against 220 in another where the swaps took 16 to 32 ms. With 1,048,576
    /// lookups a call, 174 against 176; with 4,096, the dry run's wall time exceeded the
    /// lookups' (no figure). The wall-clock figure is thus only as good as the swaps are
    /// alike: its mean deviation says how far to trust it, and a larger `per_rep` makes
    /// it steadier.
    pub fn lookups(
        &self,
        family: u8,
        addrs: &[IpAddr],
        method: Method,
        per_rep: u32,
    ) -> io::Result<KernelTiming> {
        let probe = FibProbe::new(family, addrs)?;
        probe.spread_cursors()?;
        // One checked run first, so that errors surface here and not in the threads.
        std::thread::scope(|s| {
            s.spawn(|| -> io::Result<()> {
                self.ns.enter()?;
                probe.run(true, self.input, 1).map(|_| ())
            })
            .join()
            .expect("probe thread")
        })?;
        let timed = |lookup: bool| {
            measure_self_timed(
                method,
                |_| self.ns.enter().expect("the namespace was entered before"),
                |_, _| {
                    let clock_ns = probe
                        .run(lookup, self.input, per_rep)
                        .expect("the probe ran before");
                    (u64::from(per_rep), f64::from(clock_ns))
                },
            )
        };
        let real = timed(true);
        // Every answer of the last run must be a lookup that ran to its end: a route and
        // its neighbour, or no route at all. (The dry run writes answers too, so this
        // comes before it.)
        let n = probe.len().min(per_rep);
        for i in 0..n {
            let a = probe.answer(i)?;
            if a.code != ret::SUCCESS && a.code != ret::NOT_FWDED {
                return Err(io::Error::other(format!(
                    "the kernel answered {} for {}: not a completed lookup",
                    a.code, addrs[i as usize]
                )));
            }
        }
        let dry = timed(false);
        Ok(KernelTiming { real, dry })
    }

    /// The namespace (to query the kernel directly).
    pub fn namespace(&self) -> &Namespace {
        &self.ns
    }
}

/// The kernel's slab memory in bytes.
fn slab_bytes() -> io::Result<i64> {
    let text = std::fs::read_to_string("/proc/meminfo")?;
    text.lines()
        .find_map(|l| l.strip_prefix("Slab:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| io::Error::other("no Slab line in /proc/meminfo"))
}
