//! The kernel's time by component, as the component model attributes it: the router's
//! CPU sampled by the software clock while the kernel forwards (`perf record -e
//! cpu-clock -g`: virtual machines have no hardware counters), and each sample put to
//! the component of the outermost function on its call chain that belongs to one:
//!
//! - connection tracking: `nf_conntrack_in` and the confirm (`ipv4_confirm`,
//!   `nf_confirm`, ...), everything under them;
//! - NAT: the NAT hooks (`nf_nat_ipv4_pre_routing`, `nf_nat_inet_fn`, ...), and so the
//!   rules of `nat` chains they run;
//! - the filter: `nft_do_chain` reached from a filter chain's hook;
//! - routing: the FIB's lookups (`ip_route_input_noref`, `fib_table_lookup`,
//!   `ip6_route_input`, ...);
//! - forwarding: every other sample the CPU was not idle for (receiving, the netfilter
//!   hooks' dispatch, `ip_forward`, the neighbour, transmitting over the veth).
//!
//! Outermost, so that a component's helpers (a hash, a lock, a copy) count as its own.
//! What a component costs a frame is its share of the busy samples times the CPU's busy
//! time per frame, measured apart (the sampling itself takes a little of the CPU).
//!
//! The software clock does not tick on an idle CPU, and the kernel forwards in the
//! softirq an interrupt brings to the idle CPU: sampled so, the router's work would go
//! almost unseen. So while it is sampled the CPU is kept busy by a filler of the lowest
//! priority (`SCHED_IDLE`, a shell's empty loop), whose own samples (in user space) are
//! left out, and the softirqs run over it and are sampled.

use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The components, in the order [`Shares::samples`] holds them.
pub const COMPONENTS: [&str; 5] = ["routing", "conntrack", "filter", "nat", "forwarding"];

/// Which of [`COMPONENTS`] (but forwarding) kernel function `symbol` belongs to.
pub fn component_of(symbol: &str) -> Option<usize> {
    let starts = |prefixes: &[&str]| prefixes.iter().any(|p| symbol.starts_with(p));
    if starts(&[
        "nf_conntrack_",
        "__nf_conntrack_",
        "ipv4_conntrack",
        "ipv6_conntrack",
        "ipv4_confirm",
        "ipv6_confirm",
        "nf_confirm",
        "__nf_ct_",
        "nf_ct_",
    ]) {
        Some(1)
    } else if starts(&["nft_do_chain"]) {
        Some(2)
    } else if starts(&["nf_nat_", "nft_nat", "nft_masq", "__nf_nat_"]) {
        Some(3)
    } else if starts(&[
        "ip_route_input",
        "ip_route_use_hint",
        "ip_mkroute_input",
        "fib_",
        "__fib_",
        "fib4_",
        "fib6_",
        "__fib6_",
        "ip6_route_input",
        "ip6_pol_route",
    ]) {
        Some(0)
    } else {
        None
    }
}

/// Whether a sample whose innermost frame is `leaf` (address, function) found the CPU
/// idle, or running the filler in user space.
fn idle((address, leaf): (&str, &str)) -> bool {
    !address.starts_with("ffff")
        || [
            "pv_native_safe_halt",
            "native_safe_halt",
            "default_idle",
            "acpi_safe_halt",
            "acpi_idle_do_entry",
            "mwait_idle",
            "intel_idle",
            "poll_idle",
            "cpu_idle_poll",
        ]
        .iter()
        .any(|i| leaf.starts_with(i))
}

/// Samples by component.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Shares {
    /// The busy samples of each of [`COMPONENTS`].
    pub samples: [u64; 5],
    /// Samples of the idle CPU, left out.
    pub idle: u64,
}

impl Shares {
    /// The busy samples.
    pub fn busy(&self) -> u64 {
        self.samples.iter().sum()
    }

    /// Each component's part of `busy_ns` (the CPU's busy time a frame), by its share of
    /// the busy samples; `None` without any.
    pub fn split(&self, busy_ns: f64) -> Option<[f64; 5]> {
        let busy = self.busy();
        (busy > 0).then(|| self.samples.map(|s| busy_ns * s as f64 / busy as f64))
    }
}

/// The samples of `perf script -F comm,ip,sym` output `script` (each sample's command
/// name, then its call chain indented, innermost first), by component.
pub fn attribute(script: &str) -> Shares {
    let mut shares = Shares::default();
    let mut chain: Vec<(&str, &str)> = Vec::new();
    let mut take = |chain: &mut Vec<(&str, &str)>| {
        let Some(&leaf) = chain.first() else { return };
        if idle(leaf) {
            shares.idle += 1;
        } else {
            let component = (chain.iter().rev())
                .find_map(|s| component_of(s.1))
                .unwrap_or(4);
            shares.samples[component] += 1;
        }
        chain.clear();
    };
    for line in script.lines() {
        // A sample's header (not indented), where its fields make one, then its frames.
        if !line.starts_with(char::is_whitespace) {
            take(&mut chain);
            continue;
        }
        let line = line.trim();
        if line.is_empty() {
            take(&mut chain);
            continue;
        }
        // "ADDRESS SYMBOL+OFFSET" or "ADDRESS SYMBOL" or "ADDRESS [unknown]".
        let (address, symbol) = line.split_once(' ').unwrap_or((line, ""));
        let symbol = symbol.trim();
        chain.push((address, symbol.split('+').next().unwrap_or(symbol)));
    }
    take(&mut chain);
    shares
}

/// `perf` sampling CPU `cpu` into `data` until [`Sampling::finish`], the CPU kept busy
/// by the filler.
pub struct Sampling {
    child: Child,
    filler: Child,
}

impl Sampling {
    /// Starts sampling for `seconds`; an error if `perf` (or the filler: `chrt`,
    /// `taskset`) cannot be run.
    pub fn start(cpu: usize, data: &Path, seconds: f64) -> Result<Sampling, String> {
        let mut filler = Command::new("chrt")
            .args(["--idle", "0", "taskset", "-c"])
            .arg(cpu.to_string())
            .args(["sh", "-c", "while :; do :; done"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("chrt: {e}"))?;
        let child = Command::new("perf")
            .args(["record", "-q", "-e", "cpu-clock", "-g", "-C"])
            .arg(cpu.to_string())
            .arg("-o")
            .arg(data)
            .args(["--", "sleep"])
            .arg(format!("{seconds:.3}"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn();
        match child {
            Ok(child) => Ok(Sampling { child, filler }),
            Err(e) => {
                let _ = filler.kill();
                let _ = filler.wait();
                Err(format!("perf: {e} (the linux-perf package has it)"))
            }
        }
    }

    /// Waits for the sampling to end, stops the filler, and attributes the samples.
    pub fn finish(mut self, data: &Path) -> Result<Shares, String> {
        let out = self.child.wait_with_output();
        let _ = self.filler.kill();
        let _ = self.filler.wait();
        let out = out.map_err(|e| format!("perf record: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "perf record: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let script = Command::new("perf")
            .args(["script", "-F", "comm,ip,sym", "-i"])
            .arg(data)
            .output()
            .map_err(|e| format!("perf script: {e}"))?;
        if !script.status.success() {
            return Err(format!(
                "perf script: {}",
                String::from_utf8_lossy(&script.stderr).trim()
            ));
        }
        let _ = std::fs::remove_file(data);
        Ok(attribute(&String::from_utf8_lossy(&script.stdout)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Call chains as the kernel forwards: each to the outermost component's function
    /// on it; a NAT chain's rules to NAT; the idle loop and the filler's own loop left
    /// out, a softirq over the filler counted.
    #[test]
    fn samples_go_to_the_outermost_component() {
        let script = "
\tffffffff81a0 jhash2+0x10
\tffffffff81a1 __nf_conntrack_find_get+0x20
\tffffffff81a2 nf_conntrack_in+0x30
\tffffffff81a3 nf_hook_slow+0x40
\tffffffff81a4 ip_rcv+0x50

\tffffffff81b0 nft_do_chain+0x10
\tffffffff81b1 nft_nat_do_chain+0x20
\tffffffff81b2 nf_nat_inet_fn+0x30
\tffffffff81b3 nf_nat_ipv4_pre_routing+0x40
\tffffffff81b4 nf_hook_slow+0x50

\tffffffff81c0 nft_do_chain+0x10
\tffffffff81c1 nft_do_chain_inet+0x20
\tffffffff81c2 nf_hook_slow+0x30
\tffffffff81c3 ip_forward+0x40

\tffffffff81d0 fib_table_lookup+0x10
\tffffffff81d1 ip_route_input_noref+0x20
\tffffffff81d2 ip_rcv_finish+0x30

\tffffffff81e0 veth_xmit+0x10
\tffffffff81e1 dev_hard_start_xmit+0x20

\tffffffff81f0 pv_native_safe_halt+0x10
\tffffffff81f1 default_idle+0x20
\tffffffff81f2 do_idle+0x30

\tffffffff8200 [unknown]
sh
\t    55cc71150530 [unknown]
\t    55cc711528c0 [unknown]
sh
\tffffffff81a2 nf_conntrack_in+0x30
\tffffffff81a5 __do_softirq+0x30
\t    55cc711528c0 [unknown]
";
        let s = attribute(script);
        assert_eq!(s.samples, [1, 2, 1, 1, 2]);
        assert_eq!(s.idle, 2);
        assert_eq!(s.split(700.0), Some([100.0, 200.0, 100.0, 100.0, 200.0]));
        assert_eq!(Shares::default().split(500.0), None);
    }

    #[test]
    fn functions_belong_to_their_components() {
        for (f, c) in [
            ("ipv4_confirm", Some(1)),
            ("nf_conntrack_in", Some(1)),
            ("nf_nat_masquerade_ipv4", Some(3)),
            ("nft_do_chain_ipv4", Some(2)),
            ("ip6_route_input", Some(0)),
            ("fib6_table_lookup", Some(0)),
            ("ip_forward", None),
            ("nf_hook_slow", None),
        ] {
            assert_eq!(component_of(f), c, "{f}");
        }
    }
}
