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
    /// lookups per thread per repetition, dry run subtracted, timed by the kernel's own
    /// clock around its loop. Fails if the lookups did not all complete (so that the
    /// figures are lookups, not an early error path).
    pub fn lookups(
        &self,
        family: u8,
        addrs: &[IpAddr],
        method: Method,
        per_rep: u32,
    ) -> io::Result<Timing> {
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
                    f64::from(
                        probe
                            .run(lookup, self.input, per_rep)
                            .expect("the probe ran before"),
                    )
                },
            )
        };
        let real = timed(true);
        // Every answer of the last run must be a lookup that ran to its end: a route and
        // its neighbour, or no route at all.
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
        Ok(real.minus(dry))
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
