//! The kernel side of the studies: the same routes loaded into the Linux kernel of a
//! private namespace, the same addresses looked up by the kernel's own FIB code, measured
//! by the same method (pinned threads, repetitions, trimmed mean, dry run subtracted).
//!
//! Routes point at [`GATEWAYS`] on-link gateways, route `i` at gateway `i mod GATEWAYS`,
//! as a router's table points many prefixes at a few next hops. Loading goes through
//! `ip -batch`, the way an administrator would load a table; its speed and the growth of
//! the kernel's slab memory are reported (the growth only when it stands clearly above the
//! counter's noise).

use crate::method::{measure_self_timed, Method, Timing};
use fibre_lpm::{Key, Prefix};
use fibre_testbed::netns::{gateway, unavailable_reason, Namespace, INPUT_DEV, OUTPUT_DEV};
use fibre_testbed::probe::{ret, FibProbe};
use std::io;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Next hops per family.
pub const GATEWAYS: usize = 64;

/// A kernel FIB of its own, in a namespace.
pub struct KernelFib {
    ns: Namespace,
    input: u32,
}

/// What loading a table into the kernel cost.
#[derive(Clone, Debug)]
pub struct LoadCost {
    /// Wall time of `ip -batch`.
    pub seconds: f64,
    /// Growth of the kernel's slab memory (from /proc/meminfo), or why there is no figure:
    /// the counter is the whole machine's, so other activity (a namespace of an earlier
    /// study still being torn down, say) moves it too, and a small table's growth is lost
    /// in that noise or in the slack of slabs already allocated.
    pub slab: Result<u64, String>,
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
        let before = slab_settled()?;
        let start = Instant::now();
        self.ns.batch(&cmds)?;
        let seconds = start.elapsed().as_secs_f64();
        let after = slab_samples(SLAB_SAMPLES, SLAB_GAP)?;
        Ok(LoadCost {
            seconds,
            slab: slab_growth(&before, &after),
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

/// Samples of the slab counter taken after a load.
const SLAB_SAMPLES: usize = 8;
/// Time between two samples of the slab counter.
const SLAB_GAP: Duration = Duration::from_millis(10);
/// How long to wait at most for the slab counter to stop moving before a load.
const SLAB_SETTLE: Duration = Duration::from_secs(2);
/// A swing of the counter that counts as steady: a few slabs of a few pages.
const SLAB_STEADY: u64 = 16 << 10;
/// The least growth reported: less than this says little about the routes, since the
/// counter moves by whole slabs and the routes' first objects go into slabs the caches
/// already hold.
const SLAB_MIN_GROWTH: u64 = 64 << 10;
/// How far the growth must stand above the counter's swing to be reported.
const SLAB_NOISE_FACTOR: u64 = 4;

/// The kernel's slab memory in bytes.
fn slab_bytes() -> io::Result<i64> {
    let text = std::fs::read_to_string("/proc/meminfo")?;
    text.lines()
        .find_map(|l| l.strip_prefix("Slab:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| io::Error::other("no Slab line in /proc/meminfo"))
}

/// `n` samples of the slab counter, `gap` apart.
fn slab_samples(n: usize, gap: Duration) -> io::Result<Vec<i64>> {
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        if i > 0 {
            std::thread::sleep(gap);
        }
        v.push(slab_bytes()?);
    }
    Ok(v)
}

/// The last [`SLAB_SAMPLES`] samples of the slab counter once it has stopped moving (its
/// swing over them at most [`SLAB_STEADY`]), or after [`SLAB_SETTLE`] if it does not:
/// the counter's noise just before a load, for [`slab_growth`] to judge against.
fn slab_settled() -> io::Result<Vec<i64>> {
    let start = Instant::now();
    let mut window = slab_samples(SLAB_SAMPLES, SLAB_GAP)?;
    while swing(&window) > SLAB_STEADY && start.elapsed() < SLAB_SETTLE {
        std::thread::sleep(SLAB_GAP);
        window.remove(0);
        window.push(slab_bytes()?);
    }
    Ok(window)
}

/// Highest minus lowest.
fn swing(samples: &[i64]) -> u64 {
    let hi = samples.iter().max().copied().unwrap_or(0);
    let lo = samples.iter().min().copied().unwrap_or(0);
    hi.abs_diff(lo)
}

fn median(samples: &[i64]) -> i64 {
    let mut s = samples.to_vec();
    s.sort_unstable();
    s.get(s.len() / 2).copied().unwrap_or(0)
}

/// The growth of the slab counter from the samples `before` a load to those `after` it
/// (median to median), when it stands clearly above the counter's noise (the larger
/// swing of the two sets of samples, at least a page): at least `SLAB_NOISE_FACTOR`
/// times that and at least `SLAB_MIN_GROWTH`. Otherwise why there is no figure.
pub fn slab_growth(before: &[i64], after: &[i64]) -> Result<u64, String> {
    let kib = |b: u64| b.div_ceil(1024);
    let noise = swing(before).max(swing(after)).max(4096);
    let growth = median(after) - median(before);
    let Ok(growth) = u64::try_from(growth) else {
        return Err(
            "the machine-wide slab counter fell while the routes were loaded (other \
             activity freed more than they took): no figure"
                .into(),
        );
    };
    let floor = (SLAB_NOISE_FACTOR * noise).max(SLAB_MIN_GROWTH);
    if growth < floor {
        return Err(format!(
            "the machine-wide slab counter grew by {} KiB, less than the {} KiB a figure \
             needs ({}× its swing of {} KiB around the load, and at least {} KiB): no figure",
            kib(growth),
            kib(floor),
            SLAB_NOISE_FACTOR,
            kib(noise),
            kib(SLAB_MIN_GROWTH)
        ));
    }
    Ok(growth)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slab_growth_is_reported_only_clear_of_the_noise() {
        const K: i64 = 1024;
        let steady = [100_000 * K; 8];
        // A clear growth on a steady counter.
        assert_eq!(
            slab_growth(&steady, &[100_800 * K; 8]),
            Ok(800 * 1024),
            "800 KiB on a still counter"
        );
        // The median resists one odd sample on either side.
        let mut odd = steady;
        odd[3] = 90_000 * K;
        let mut after = [100_800 * K; 8];
        after[0] = 100_804 * K;
        assert!(slab_growth(&odd, &after).is_err(), "a 10 MB swing is noise");
        // A fall: another namespace torn down while loading (the -40,989 bytes a route
        // once printed).
        let e = slab_growth(&steady, &[99_000 * K; 8]).unwrap_err();
        assert!(e.contains("fell"), "{e}");
        // No growth at all (a table of a few routes fits slabs already allocated).
        let e = slab_growth(&steady, &steady).unwrap_err();
        assert!(e.contains("grew by 0 KiB"), "{e}");
        // Growth below the floor on a still counter.
        assert!(slab_growth(&steady, &[100_032 * K; 8]).is_err());
        // Growth above the floor but within 4 swings of a moving counter.
        let moving: Vec<i64> = (0..8).map(|i| (100_000 + 40 * i) * K).collect();
        let after: Vec<i64> = (0..8).map(|i| (101_000 + 40 * i) * K).collect();
        let e = slab_growth(&moving, &after).unwrap_err();
        assert!(e.contains("swing of 280 KiB"), "{e}");
        let after: Vec<i64> = (0..8).map(|i| (102_200 + 40 * i) * K).collect();
        assert_eq!(slab_growth(&moving, &after), Ok(2200 * 1024));
        for e in [
            slab_growth(&steady, &[99_000 * K; 8]),
            slab_growth(&moving, &moving),
        ] {
            let e = e.unwrap_err();
            let negative = e
                .as_bytes()
                .windows(2)
                .any(|w| w[0] == b'-' && w[1].is_ascii_digit());
            assert!(!negative, "no negative figure in a note: {e}");
        }
    }
}
