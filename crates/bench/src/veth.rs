//! The veth study (the second half of `fibre bench pipeline`): the same router forwarded
//! by the kernel and by fibre, on the same topology in the same run, as root.
//!
//! Three namespaces: host A, veth, the router, veth, host B. The router holds the real
//! tables (route `i` through gateway `i mod GATEWAYS` on host B's link, each gateway a
//! permanent neighbour entry on host B's link, with a MAC address that is not host B's).
//! Host A sends the pipeline study's frames (the shortest UDP frames, to matched
//! addresses of the tables); host B's kernel drops them as soon as it sees they are for
//! another host, so that they cost little. What the router sent out of its link to host
//! B (the link's transmit counter) against what host A's link sent is the loss.
//!
//! The router has one CPU, whoever forwards, and the hosts the other: a measurement of
//! the router, not of the generator. On a veth the receiving side's work otherwise runs
//! in the sender's softirq, on the generator's CPU, and host B's on the router's; so:
//!
//! - the generator, a packet socket of fibre's own sending 64 frames a system call, is
//!   pinned to the hosts' CPU;
//! - the kernel's receive work on the router's link is steered to the router's CPU
//!   (receive packet steering), where the kernel forwards in its receive softirq;
//! - fibre's worker runs on the router's CPU, and over AF_XDP the router's links run
//!   their NAPI in kernel threads (threaded NAPI) pinned there too: the XDP program and
//!   the copy into fibre's buffers are counted as the router's;
//! - host B's receive work is steered to the hosts' CPU.
//!
//! What a forwarded frame costs the router's CPU is measured at one rate that every
//! engine forwards without loss: the CPU's busy time (the wall time less the CPU's idle
//! time in `/proc/stat`) over the frames forwarded. Whatever else runs on that CPU counts
//! too: keep it free.
//!
//! A trial offers a rate for a fixed time; the loss-free rate is found by halving the
//! interval between a rate that lost nothing and one that lost (RFC 2544's throughput);
//! the rate forwarded when host A sends as fast as it can (saturation) is shown too.
//! Host A's fastest is the ceiling of what can be found: a router that loses nothing at
//! it is marked as bound by the generator.
//!
//! Last, TCP from host A to host B through the router, each host with the offloads a
//! new veth has: what a transfer of a few seconds moves, in Gbit/s.

use crate::attribution::{Sampling, COMPONENTS};
use crate::kernel::GATEWAYS;
use crate::pipeline::{flows, mac_text, other_source_port};
use fibre_dataplane::packet::{Batch, PacketSocket};
use fibre_dataplane::pool::{BufferId, Pool};
use fibre_lpm::{Key, Prefix};
use fibre_testbed::netns::{gateway, Namespace};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::fmt::Write;
use std::io::{Read, Write as _};
use std::process::Command;
use std::time::{Duration, Instant};

/// Host A's link, the router's links, host B's link.
pub const HOST_A_DEV: &str = "ha0";
/// The router's link to host A.
pub const ROUTER_IN: &str = "r0";
/// The router's link to host B.
pub const ROUTER_OUT: &str = "r1";
/// Host B's link.
pub const HOST_B_DEV: &str = "hb0";

pub(crate) const HOST_A_MAC: [u8; 6] = [0x02, 0xa0, 0, 0, 0, 2];
pub(crate) const ROUTER_IN_MAC: [u8; 6] = [0x02, 0xa0, 0, 0, 0, 1];
pub(crate) const ROUTER_OUT_MAC: [u8; 6] = [0x02, 0xb0, 0, 0, 0, 1];
pub(crate) const HOST_B_MAC: [u8; 6] = [0x02, 0xb0, 0, 0, 0, 2];
/// The gateways' MAC address: on host B's link, but not host B's own, so that host B's
/// kernel drops the frames as soon as it sees them (they are for another host).
pub(crate) const GATEWAY_MAC: [u8; 6] = [0x02, 0xb0, 0, 0, 0, 0x99];

/// What to run.
#[derive(Clone, Debug)]
pub struct VethConfig {
    /// How long a trial offers its rate.
    pub trial: Duration,
    /// Halvings of the search interval.
    pub steps: usize,
    /// Distinct flows host A sends (at most 4096; the kernel's masquerade by its
    /// connections sends [`VethConfig::component_flows`]).
    pub flows: usize,
    /// Seed of the flows.
    pub seed: u64,
    /// The rate (frames a second) at which what a forwarded frame costs the router's
    /// core is measured, the same for every engine.
    pub cost_rate: f64,
    /// How long the cost is measured for.
    pub cost_time: Duration,
    /// How long each TCP transfer runs.
    pub tcp_time: Duration,
    /// How long a daemon's CPU time is measured with no traffic.
    pub idle_time: Duration,
    /// Numbers of forward rules no frame matches loaded into the kernel's ruleset, to
    /// measure what its filter costs a frame by its rules.
    pub filter_rules: Vec<usize>,
    /// The rules of the component model's last configuration (masquerade behind them);
    /// 0: the kernel's components are not measured.
    pub component_rules: usize,
    /// Numbers of connections the kernel's masquerade is taken apart at (each a UDP
    /// flow of its own, made before the measurement); none: not measured.
    pub component_flows: Vec<usize>,
}

impl Default for VethConfig {
    fn default() -> Self {
        VethConfig {
            trial: Duration::from_secs(1),
            steps: 8,
            flows: 4096,
            seed: 1,
            cost_rate: 200_000.0,
            cost_time: Duration::from_secs(3),
            tcp_time: Duration::from_secs(3),
            idle_time: Duration::from_secs(10),
            filter_rules: vec![0, 1000, 10_000],
            component_rules: 1000,
            component_flows: vec![1, 1000, 100_000, 1_000_000],
        }
    }
}

/// A reading of one CPU's idle time, with the moment it was taken: the busy time between
/// two readings is the wall time between them less the idle time.
///
/// Busy time is not summed from `/proc/stat`'s user, system and softirq columns: those are
/// sampled by the scheduler tick, which a CPU that sleeps between bursts of softirq work
/// does not run, so most of such a CPU's work is never counted (at 500,000 frames a second
/// forwarded by the kernel, the busy columns held 42 of the 219 non-idle ticks). Idle time
/// is measured exactly as the CPU enters and leaves its idle loop.
#[derive(Clone, Copy, Debug)]
struct CpuReading {
    at: Instant,
    idle_ns: f64,
}

impl CpuReading {
    /// CPU `cpu`'s idle and I/O-wait time so far, from `/proc/stat`.
    fn take(cpu: usize) -> Result<CpuReading, String> {
        let stat = std::fs::read_to_string("/proc/stat").map_err(|e| format!("/proc/stat: {e}"))?;
        let at = Instant::now();
        let name = format!("cpu{cpu}");
        let line = stat
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name.as_str()))
            .ok_or_else(|| format!("no {name} in /proc/stat"))?;
        // user nice system idle iowait ...: idle and iowait are the fourth and fifth.
        let idle: u64 = line
            .split_whitespace()
            .skip(4)
            .take(2)
            .filter_map(|t| t.parse::<u64>().ok())
            .sum();
        // /proc/stat counts in USER_HZ, 100 a second: fixed in Linux's interface to user space.
        Ok(CpuReading {
            at,
            idle_ns: idle as f64 * 1e9 / 100.0,
        })
    }

    /// Nanoseconds CPU `cpu` was busy since this reading.
    fn busy_ns_since(&self, cpu: usize) -> Result<f64, String> {
        let now = CpuReading::take(cpu)?;
        let wall = now.at.duration_since(self.at).as_secs_f64() * 1e9;
        Ok((wall - (now.idle_ns - self.idle_ns)).max(0.0))
    }
}

/// The three namespaces, set up, with the routes loaded in the router.
pub struct Topology {
    /// Host A.
    pub host_a: Namespace,
    /// The router.
    pub router: Namespace,
    /// Host B.
    pub host_b: Namespace,
    /// Routes loaded per family.
    pub routes: (usize, usize),
    /// The CPU host A's generator runs on.
    pub generator_cpu: usize,
    /// The CPU the router's work is steered to.
    pub router_cpu: usize,
}

fn io(e: std::io::Error) -> String {
    e.to_string()
}

/// Runs `args` in namespace `ns` (`ip netns exec`).
fn exec(ns: &Namespace, args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns.name()])
        .args(args)
        .output()
        .map_err(|e| format!("{args:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{args:?} in {}: {}",
            ns.name(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

impl Topology {
    /// Sets up host A, the router with `v4` and `v6` as its routes, and host B. The
    /// kernel's forwarding is off until [`kernel_forwarding`] turns it on.
    pub fn new(v4: &[Prefix<u32>], v6: &[Prefix<u128>]) -> Result<Topology, String> {
        // The machine's CPUs online, whatever this process's affinity: `/proc/stat`'s
        // line of each (`cpu0`, `cpu1`, ...).
        let cpus: Vec<usize> = std::fs::read_to_string("/proc/stat")
            .map_err(|e| format!("/proc/stat: {e}"))?
            .lines()
            .filter_map(|l| {
                l.split_whitespace()
                    .next()?
                    .strip_prefix("cpu")?
                    .parse()
                    .ok()
            })
            .collect();
        let (first, last) = (
            cpus.iter().copied().min().unwrap_or(0),
            cpus.iter().copied().max().unwrap_or(0),
        );
        let host_a = Namespace::create("veth-a").map_err(io)?;
        let router = Namespace::create("veth-r").map_err(io)?;
        let host_b = Namespace::create("veth-b").map_err(io)?;
        let t = Topology {
            host_a,
            router,
            host_b,
            routes: (v4.len(), v6.len()),
            // The first CPU (CPU 0 takes most of a machine's other work) the hosts', the
            // last the router's. On a machine of one CPU they share it, and the report
            // says so.
            generator_cpu: first,
            router_cpu: last,
        };
        let (a, b) = (t.host_a.name(), t.host_b.name());
        t.router
            .batch(&format!(
                "link set lo up
link add {ROUTER_IN} address {} type veth peer name {HOST_A_DEV} netns {a} address {}
link add {ROUTER_OUT} address {} type veth peer name {HOST_B_DEV} netns {b} address {}
link set {ROUTER_IN} up
link set {ROUTER_OUT} up
addr add 10.199.0.1/16 dev {ROUTER_IN}
addr add 10.200.0.1/16 dev {ROUTER_OUT}
addr add fd00:199::1/64 dev {ROUTER_IN} nodad
addr add fd00:200::1/64 dev {ROUTER_OUT} nodad
",
                mac_text(ROUTER_IN_MAC),
                mac_text(HOST_A_MAC),
                mac_text(ROUTER_OUT_MAC),
                mac_text(HOST_B_MAC),
            ))
            .map_err(io)?;
        // The hosts' IPv6 addresses are clear of the gateways' (`fd00:200::2` up).
        for (host, dev, net) in [(&t.host_a, HOST_A_DEV, 199), (&t.host_b, HOST_B_DEV, 200)] {
            host.batch(&format!(
                "link set lo up
link set {dev} up
addr add 10.{net}.0.2/16 dev {dev}
addr add fd00:{net}::a:2/64 dev {dev} nodad
route add default via 10.{net}.0.1
"
            ))
            .map_err(io)?;
            host.ip(&[
                "-6",
                "route",
                "add",
                "default",
                "via",
                &format!("fd00:{net}::1"),
            ])
            .map_err(io)?;
        }
        let mut neigh = String::new();
        for i in 0..GATEWAYS {
            for family in [4, 6] {
                let _ = writeln!(
                    neigh,
                    "neigh replace {} lladdr {} dev {ROUTER_OUT} nud permanent",
                    gateway(family, i),
                    mac_text(GATEWAY_MAC)
                );
            }
        }
        t.router.batch(&neigh).map_err(io)?;
        load(&t.router, v4)?;
        load(&t.router, v6)?;
        // The router's receive work on the router's CPU, whichever CPU sent the frame
        // (TCP's acknowledgements come back through it too); the hosts' on theirs.
        steer(&t.router, ROUTER_IN, t.router_cpu)?;
        steer(&t.router, ROUTER_OUT, t.router_cpu)?;
        steer(&t.host_b, HOST_B_DEV, t.generator_cpu)?;
        steer(&t.host_a, HOST_A_DEV, t.generator_cpu)?;
        for (k, v) in [
            ("net.ipv4.ip_forward", "0"),
            ("net.ipv6.conf.all.forwarding", "0"),
        ] {
            t.router.sysctl(k, v).map_err(io)?;
        }
        Ok(t)
    }

    /// Frames the router has sent out of its link to host B.
    fn forwarded(&self) -> Result<u64, String> {
        Ok(transmitted(&self.router, ROUTER_OUT)?.0)
    }

    /// Frames host A's link has sent to the router, with those the router had no room
    /// for: a veth counts a frame its peer refused (its ring or backlog full) as the
    /// sender's `tx_dropped`, not as sent.
    fn offered(&self) -> Result<u64, String> {
        let (sent, refused) = transmitted(&self.host_a, HOST_A_DEV)?;
        Ok(sent + refused)
    }
}

/// Frames link `dev` of `ns` has sent, and those it dropped on the way out.
fn transmitted(ns: &Namespace, dev: &str) -> Result<(u64, u64), String> {
    let out = ns
        .ip(&["-j", "-s", "link", "show", "dev", dev])
        .map_err(io)?;
    let v: Value = serde_json::from_str(&out).map_err(|e| format!("ip -j -s link: {e}"))?;
    let tx = &v[0]["stats64"]["tx"];
    match (tx["packets"].as_u64(), tx["dropped"].as_u64()) {
        (Some(sent), Some(dropped)) => Ok((sent, dropped)),
        _ => Err(format!("no transmit counters in {out}")),
    }
}

/// The mask of CPU `cpu` alone as the kernel reads one: hex digits in groups of 32 bits,
/// separated by commas, the highest first.
fn cpu_mask(cpu: usize) -> String {
    let groups = cpu / 32 + 1;
    (0..groups)
        .rev()
        .map(|g| {
            let bits = if g == cpu / 32 { 1u32 << (cpu % 32) } else { 0 };
            format!("{bits:08x}")
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Steers the receive work of link `dev` of `ns` (its first queue) to CPU `cpu`.
fn steer(ns: &Namespace, dev: &str, cpu: usize) -> Result<(), String> {
    let mask = cpu_mask(cpu);
    exec(
        ns,
        &[
            "sh",
            "-c",
            &format!("echo {mask} > /sys/class/net/{dev}/queues/rx-0/rps_cpus"),
        ],
    )
}

/// Has the router's links run their NAPI in kernel threads, pinned to the router's CPU
/// (a veth has a NAPI while an XDP program is on it: call this once fibre's programs
/// are attached). The threads are named `napi/LINK-ID`.
pub fn threaded_napi(t: &Topology) -> Result<(), String> {
    for dev in [ROUTER_IN, ROUTER_OUT] {
        exec(
            &t.router,
            &[
                "sh",
                "-c",
                &format!("echo 1 > /sys/class/net/{dev}/threaded"),
            ],
        )?;
    }
    let cpu = t.router_cpu.to_string();
    let mut pinned = 0;
    for entry in std::fs::read_dir("/proc").map_err(io)?.flatten() {
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        let comm = comm.trim();
        if [ROUTER_IN, ROUTER_OUT]
            .iter()
            .any(|d| comm.starts_with(&format!("napi/{d}-")))
        {
            let pid = entry.file_name().to_string_lossy().into_owned();
            let out = Command::new("taskset")
                .args(["-pc", &cpu, &pid])
                .output()
                .map_err(|e| format!("taskset: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "pinning {comm} to CPU {cpu}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            pinned += 1;
        }
    }
    if pinned == 0 {
        return Err("the router's links have no NAPI threads".into());
    }
    Ok(())
}

/// Waits until the router's links carry an XDP program (fibre's, once its daemon has
/// attached them), at most `within`.
pub fn wait_for_xdp(t: &Topology, within: Duration) -> Result<(), String> {
    let until = Instant::now() + within;
    loop {
        let attached = [ROUTER_IN, ROUTER_OUT].iter().all(|dev| {
            t.router
                .ip(&["-j", "-d", "link", "show", "dev", dev])
                .is_ok_and(|out| out.contains("\"xdp\""))
        });
        if attached {
            return Ok(());
        }
        if Instant::now() > until {
            return Err("fibre's XDP programs never came on the router's links".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Loads `routes` into the router's main table through the gateways.
fn load<K: Key>(router: &Namespace, routes: &[Prefix<K>]) -> Result<(), String> {
    let mut lines = String::with_capacity(routes.len() * 48);
    for (i, p) in routes.iter().enumerate() {
        let _ = writeln!(
            lines,
            "route add {p} via {} dev {ROUTER_OUT}",
            gateway(K::FAMILY, i % GATEWAYS)
        );
    }
    router.batch_family(K::FAMILY, &lines).map_err(io)
}

/// The kernel forwarding (both families) until the guard is dropped.
pub struct KernelForwarding<'a>(&'a Namespace);

/// Turns the router's kernel forwarding on.
pub fn kernel_forwarding(t: &Topology) -> Result<KernelForwarding<'_>, String> {
    for k in ["net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"] {
        t.router.sysctl(k, "1").map_err(io)?;
    }
    Ok(KernelForwarding(&t.router))
}

impl Drop for KernelForwarding<'_> {
    fn drop(&mut self) {
        for k in ["net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"] {
            let _ = self.0.sysctl(k, "0");
        }
    }
}

/// Host A's generator of fibre's own: the frames in a pool, sent from a packet socket.
struct Generator {
    socket: PacketSocket,
    pool: Pool,
    ids: Vec<BufferId>,
    batch: Batch,
    /// Where in `ids` the next burst starts: each trial goes on where the last stopped,
    /// so that every frame is sent in turn however many there are.
    next: usize,
}

/// Frames per send call.
const BURST: usize = 64;

impl Generator {
    /// Opens host A's link from this thread (which enters host A's namespace) with
    /// `frames` ready.
    fn new(t: &Topology, frames: &[Vec<u8>]) -> Result<Generator, String> {
        t.host_a.enter().map_err(io)?;
        let ifindex = t.host_a.ifindex(HOST_A_DEV).map_err(io)?;
        let socket = PacketSocket::open_for_sending(ifindex).map_err(io)?;
        let n = frames.len().max(BURST);
        let mut pool = Pool::new(n, 128);
        let mut ids = Vec::with_capacity(n);
        pool.alloc(n, &mut ids);
        for (k, &id) in ids.iter().enumerate() {
            pool.fill(id, &frames[k % frames.len()]);
        }
        Ok(Generator {
            socket,
            pool,
            ids,
            batch: Batch::new(),
            next: 0,
        })
    }

    /// Sends for `time` at `rate` frames a second (as fast as it can: `None`).
    fn send(&mut self, time: Duration, rate: Option<f64>) {
        let start = Instant::now();
        let mut sent = 0u64;
        loop {
            let elapsed = start.elapsed();
            if elapsed >= time {
                break;
            }
            if let Some(r) = rate {
                if ((elapsed.as_secs_f64() * r) as u64) < sent + BURST as u64 {
                    std::hint::spin_loop();
                    continue;
                }
            }
            let k = self.next;
            let burst = &self.ids[k..k + BURST];
            self.next = (k + BURST) % (self.ids.len() - BURST + 1);
            sent += self
                .socket
                .send(&mut self.pool, burst, &mut self.batch)
                .unwrap_or(0) as u64;
        }
    }
}

/// One trial's outcome.
#[derive(Clone, Copy, Debug)]
struct Trial {
    sent: u64,
    forwarded: u64,
    seconds: f64,
    /// The router's core's busy time during the trial, in nanoseconds.
    router_busy_ns: f64,
}

impl Trial {
    fn lost(&self) -> u64 {
        self.sent.saturating_sub(self.forwarded)
    }
}

/// Runs trials with host A's generator, a thread of fibre's own on the hosts' CPU;
/// `trial(rate)` is one trial.
fn with_generator<R>(
    t: &Topology,
    frames: &[Vec<u8>],
    cfg: &VethConfig,
    body: impl FnOnce(&mut dyn FnMut(Option<f64>, bool) -> Result<Trial, String>) -> Result<R, String>,
) -> Result<R, String> {
    // A trial's rate and length; `None`: stop.
    let (to_gen, from_main) = std::sync::mpsc::channel::<Option<(Option<f64>, Duration)>>();
    let (to_main, from_gen) = std::sync::mpsc::channel::<Result<(), String>>();
    let cpu = t.generator_cpu;
    let (trial_time, cost_time) = (cfg.trial, cfg.cost_time);
    std::thread::scope(|s| {
        let frames = &frames;
        s.spawn(move || {
            core_affinity::set_for_current(core_affinity::CoreId { id: cpu });
            let mut g = match Generator::new(t, frames) {
                Ok(g) => g,
                Err(e) => {
                    let _ = to_main.send(Err(e));
                    return;
                }
            };
            while let Ok(Some((rate, time))) = from_main.recv() {
                g.send(time, rate);
                let _ = to_main.send(Ok(()));
            }
        });
        let mut trial = |rate: Option<f64>, cost: bool| -> Result<Trial, String> {
            let (before, offered) = (t.forwarded()?, t.offered()?);
            let busy_before = CpuReading::take(t.router_cpu)?;
            let start = Instant::now();
            let time = if cost { cost_time } else { trial_time };
            to_gen
                .send(Some((rate, time)))
                .map_err(|_| "the generator stopped".to_string())?;
            // What was offered is read from host A's link (`Topology::offered`), not
            // counted by the generator.
            from_gen
                .recv()
                .map_err(|_| "the generator stopped".to_string())??;
            let seconds = start.elapsed().as_secs_f64();
            let router_busy_ns = busy_before.busy_ns_since(t.router_cpu)?;
            // What is still queued drains.
            std::thread::sleep(Duration::from_millis(200));
            let forwarded = t.forwarded()?.saturating_sub(before);
            Ok(Trial {
                sent: t.offered()?.saturating_sub(offered),
                forwarded,
                seconds,
                router_busy_ns,
            })
        };
        let r = body(&mut trial);
        let _ = to_gen.send(None);
        r
    })
}

/// One engine's figures for one family.
#[derive(Clone, Copy, Debug)]
pub struct Rates {
    /// The highest rate offered that lost nothing (frames a second).
    pub loss_free: f64,
    /// Whether nothing was lost even at host A's fastest (the router may do more).
    pub generator_bound: bool,
    /// Host A's fastest rate.
    pub offered_max: f64,
    /// What the router forwarded at host A's fastest.
    pub forwarded_at_max: f64,
    /// The router's core's busy time per frame forwarded, at [`VethConfig::cost_rate`].
    pub core_ns_per_frame: f64,
    /// Frames lost while that was measured.
    pub cost_lost: u64,
}

/// Measures the engine currently forwarding in `t` with `frames`: waits until a slow
/// trial loses nothing (the engine is ready: fibre's mirror has the routes), then
/// host A's fastest, then the loss-free rate by halving.
fn rates(
    t: &Topology,
    frames: &[Vec<u8>],
    cfg: &VethConfig,
    step: &mut dyn FnMut(&str),
) -> Result<Rates, String> {
    with_generator(t, frames, cfg, |trial| {
        let slow = 20_000.0;
        let ready_by = Instant::now() + Duration::from_secs(120);
        loop {
            let r = trial(Some(slow), false)?;
            if r.sent > 0 && r.lost() == 0 {
                break;
            }
            if Instant::now() > ready_by {
                return Err(format!(
                    "the router never forwarded everything at {slow} frames/s: {} of {} lost",
                    r.lost(),
                    r.sent
                ));
            }
        }
        let cost = trial(Some(cfg.cost_rate), true)?;
        let core_ns_per_frame = cost.router_busy_ns / cost.forwarded.max(1) as f64;
        let cost_lost = cost.lost();
        let max = trial(None, false)?;
        let offered_max = max.sent as f64 / max.seconds;
        let forwarded_at_max = max.forwarded as f64 / max.seconds;
        step(&format!(
            "host A's fastest {:.2} Mpps, forwarded {:.2} Mpps; searching the loss-free rate",
            offered_max / 1e6,
            forwarded_at_max / 1e6
        ));
        if max.lost() == 0 {
            return Ok(Rates {
                loss_free: offered_max,
                generator_bound: true,
                offered_max,
                forwarded_at_max,
                core_ns_per_frame,
                cost_lost,
            });
        }
        let (mut lo, mut hi) = (slow, offered_max);
        for _ in 0..cfg.steps {
            let mid = (lo + hi) / 2.0;
            let r = trial(Some(mid), false)?;
            if r.lost() == 0 {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Ok(Rates {
            loss_free: lo,
            generator_bound: false,
            offered_max,
            forwarded_at_max,
            core_ns_per_frame,
            cost_lost,
        })
    })
}

/// Something running until dropped: an engine forwarding.
pub trait Running {
    /// The process that forwards, if it is one of its own (a daemon), whose CPU time
    /// with no traffic is measured.
    fn process(&self) -> Option<u32> {
        None
    }
}

impl Running for KernelForwarding<'_> {}

/// Each thread of process `pid` and its time on a CPU so far, in nanoseconds, as the
/// scheduler measures it (the first field of its schedstat): exact, where
/// /proc/PID/stat's user and system times are sampled by the tick and miss a thread that
/// wakes and sleeps between ticks.
fn thread_cpu_ns(pid: u32) -> Result<HashMap<u64, u64>, String> {
    let dir = format!("/proc/{pid}/task");
    let mut threads = HashMap::new();
    for task in std::fs::read_dir(&dir).map_err(|e| format!("{dir}: {e}"))? {
        let task = task.map_err(|e| format!("{dir}: {e}"))?;
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        let path = task.path().join("schedstat");
        // A thread that ended between the listing and the read took its time with it.
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let ns = text
            .split_whitespace()
            .next()
            .and_then(|f| f.parse::<u64>().ok())
            .ok_or_else(|| format!("{}: no run time", path.display()))?;
        threads.insert(tid, ns);
    }
    Ok(threads)
}

/// CPU seconds process `pid`'s threads used between `before` ([`thread_cpu_ns`]) and
/// now: a thread new since is counted whole; one ended since took its time with it.
fn process_cpu_seconds_since(pid: u32, before: &HashMap<u64, u64>) -> Result<f64, String> {
    let now = thread_cpu_ns(pid)?;
    let ns: u64 = now
        .iter()
        .map(|(tid, ns)| ns.saturating_sub(before.get(tid).copied().unwrap_or(0)))
        .sum();
    Ok(ns as f64 / 1e9)
}

/// How an engine is started in a topology: what it returns stops it when dropped.
pub type Start<'a> = Box<dyn Fn(&'a Topology) -> Result<Box<dyn Running + 'a>, String> + 'a>;

/// A way to make the router forward: its name and how to start it.
pub struct Engine<'a> {
    /// The name figures carry.
    pub name: &'static str,
    /// Starts the engine in the topology.
    pub start: Start<'a>,
}

/// Runs the study: for each family with routes, each engine's rates with frames to
/// matched addresses of `v4` or `v6`; every figure goes to `emit`, `step` hears what
/// comes next.
pub fn veth_study<'a>(
    t: &'a Topology,
    v4: &[Prefix<u32>],
    v6: &[Prefix<u128>],
    engines: &[Engine<'a>],
    cfg: &VethConfig,
    emit: &mut dyn FnMut(Value),
    step: &mut dyn FnMut(&str),
) -> Result<(), String> {
    let n = cfg.flows.clamp(BURST, 4096);
    let families: Vec<(u8, Vec<Vec<u8>>)> = [
        (!v4.is_empty()).then(|| (4, flows(v4, n, cfg.seed, ROUTER_IN_MAC, HOST_A_MAC))),
        (!v6.is_empty()).then(|| (6, flows(v6, n, cfg.seed, ROUTER_IN_MAC, HOST_A_MAC))),
    ]
    .into_iter()
    .flatten()
    .collect();
    for engine in engines {
        step(&format!("{} forwarding: starting", engine.name));
        let guard = (engine.start)(t)?;
        if let Some(pid) = guard.process() {
            step(&format!(
                "{}: idle for {} s",
                engine.name,
                cfg.idle_time.as_secs()
            ));
            let before = thread_cpu_ns(pid)?;
            std::thread::sleep(cfg.idle_time);
            let used = process_cpu_seconds_since(pid, &before)?;
            emit(json!({
                "study": "veth-idle", "engine": engine.name,
                "cpu_percent": 100.0 * used / cfg.idle_time.as_secs_f64(),
                "seconds": cfg.idle_time.as_secs_f64(),
            }));
        }
        for (family, frames) in &families {
            if engine.name == "kernel" && !cfg.filter_rules.is_empty() {
                for (n, ns, lost, rate) in kernel_filter(t, *family, frames, cfg, step)? {
                    emit(json!({
                        "study": "veth-filter", "engine": "kernel", "family": family,
                        "rules": n, "core_ns_per_frame": ns, "lost": lost,
                        "rate_kpps": rate / 1e3, "router_cpu": t.router_cpu,
                    }));
                }
            }
            if engine.name == "kernel" && cfg.component_rules > 0 {
                for (config, rules, ns, lost, rate, split) in
                    kernel_components(t, *family, frames, cfg, step)?
                {
                    let components = split.as_ref().ok().map(components_json);
                    emit(json!({
                        "study": "veth-components", "engine": "kernel", "family": family,
                        "config": config, "rules": rules, "core_ns_per_frame": ns,
                        "lost": lost, "rate_kpps": rate / 1e3, "components": components,
                        "attribution_error": split.err(), "router_cpu": t.router_cpu,
                    }));
                }
            }
            if engine.name == "kernel" && !cfg.component_flows.is_empty() {
                for f in kernel_flows(t, *family, frames, cfg, step)? {
                    emit(json!({
                        "study": "veth-components-flows", "engine": "kernel",
                        "family": family, "config": "masquerade",
                        "connections": f.connections, "tracked": f.tracked,
                        "core_ns_per_frame": f.ns, "lost": f.lost,
                        "rate_kpps": f.rate / 1e3,
                        "components": f.split.as_ref().ok().map(components_json),
                        "attribution_error": f.split.err(), "router_cpu": t.router_cpu,
                    }));
                }
            }
            step(&format!("{} forwarding IPv{family}", engine.name));
            let r = rates(t, frames, cfg, step)?;
            emit(json!({
                "study": "veth", "engine": engine.name, "family": family,
                "routes": if *family == 4 { t.routes.0 } else { t.routes.1 },
                "frame_bytes": frames[0].len() + 4,
                "loss_free_mpps": r.loss_free / 1e6,
                "generator_bound": r.generator_bound,
                "offered_max_mpps": r.offered_max / 1e6,
                "forwarded_at_max_mpps": r.forwarded_at_max / 1e6,
                "core_ns_per_frame": r.core_ns_per_frame,
                "cost_rate_kpps": cfg.cost_rate / 1e3,
                "cost_lost": r.cost_lost,
                "trial_seconds": cfg.trial.as_secs_f64(),
                "router_cpu": t.router_cpu,
                "generator_cpu": t.generator_cpu,
            }));
        }
        for family in [4u8, 6] {
            step(&format!("{} forwarding TCP over IPv{family}", engine.name));
            let (bytes, seconds) = tcp(t, family, cfg.tcp_time)?;
            emit(json!({
                "study": "veth-tcp", "engine": engine.name, "family": family,
                "gbit_per_s": bytes as f64 * 8.0 / seconds / 1e9,
                "bytes": bytes, "seconds": seconds,
            }));
        }
        drop(guard);
    }
    Ok(())
}

/// The kernel's forwarding with `n` rules of [`VethConfig::filter_rules`] at its forward
/// hook that no frame matches, as `nft` loads them (`ip saddr 198.18.X.Y drop`, `ip6
/// saddr 2001:db8:ffff::X drop`, the rules fibre's in-memory filter study measures):
/// for each `n`, what a forwarded frame costs the router's core, the frames lost, and
/// the rate offered (lower for more rules, that the kernel keep up).
fn kernel_filter(
    t: &Topology,
    family: u8,
    frames: &[Vec<u8>],
    cfg: &VethConfig,
    step: &mut dyn FnMut(&str),
) -> Result<Vec<(usize, f64, u64, f64)>, String> {
    let mut out = Vec::new();
    with_generator(t, frames, cfg, |trial| {
        for &n in &cfg.filter_rules {
            step(&format!(
                "kernel forwarding IPv{family} with {n} filter rules"
            ));
            let mut rules = String::from(
                "table inet fibre_bench { chain forward { type filter hook forward priority 0; \
                 policy accept;\n",
            );
            rules += &unmatched_rules(family, n);
            rules += "}\n}\n";
            t.router.nft(&["-f", "-"], &rules).map_err(io)?;
            let rate = cfg.cost_rate / (1.0 + n as f64 / 100.0);
            // Once to warm up, once measured.
            trial(Some(rate), false)?;
            let r = trial(Some(rate), true)?;
            out.push((
                n,
                r.router_busy_ns / r.forwarded.max(1) as f64,
                r.lost(),
                rate,
            ));
            t.router
                .nft(&["delete", "table", "inet", "fibre_bench"], "")
                .map_err(io)?;
        }
        Ok(())
    })?;
    Ok(out)
}

/// Rules at the forward hook that no frame matches, as `nft` writes them (`ip saddr
/// 198.18.X.Y drop`, `ip6 saddr 2001:db8:ffff::X drop`).
fn unmatched_rules(family: u8, n: usize) -> String {
    let mut rules = String::new();
    for i in 0..n {
        if family == 4 {
            let _ = writeln!(rules, "ip saddr 198.18.{}.{} drop", i >> 8 & 0xff, i & 0xff);
        } else {
            let _ = writeln!(rules, "ip6 saddr 2001:db8:ffff::{i:x} drop");
        }
    }
    rules
}

/// The configurations the component model takes the kernel's forwarding apart by, each
/// adding one component to the one before: forwarding alone; connections tracked (a
/// forward rule reads their state); masqueraded out of host B's link; behind `rules`
/// forward rules that no frame matches. Their names, rules, and rulesets.
pub fn component_configurations(family: u8, rules: usize) -> Vec<(String, usize, String)> {
    let filter = |extra: &str| {
        format!(
            "table inet fibre_bench {{\n  chain forward {{ type filter hook forward priority 0; \
             policy accept;\n    ct state invalid drop\n{extra}  }}\n}}\n"
        )
    };
    let nat = format!(
        "table {} fibre_bench_nat {{\n  chain post {{ type nat hook postrouting priority 100; \
         oifname \"{ROUTER_OUT}\" masquerade; }}\n}}\n",
        if family == 4 { "ip" } else { "ip6" }
    );
    vec![
        ("forwarding".into(), 0, String::new()),
        ("tracked".into(), 1, filter("")),
        ("masquerade".into(), 1, filter("") + &nat),
        (
            format!("masquerade, {rules} rules"),
            1 + rules,
            filter(&unmatched_rules(family, rules)) + &nat,
        ),
    ]
}

/// The kernel's forwarding in each of [`component_configurations`]: what a frame costs
/// the router's core (a trial of its own), the frames lost, the rate offered, and that
/// time by component ([`crate::attribution`], from a trial sampled by `perf`; why not,
/// if it cannot be).
#[allow(clippy::type_complexity)]
fn kernel_components(
    t: &Topology,
    family: u8,
    frames: &[Vec<u8>],
    cfg: &VethConfig,
    step: &mut dyn FnMut(&str),
) -> Result<Vec<(String, usize, f64, u64, f64, Result<[f64; 5], String>)>, String> {
    // A configuration's connections end within a second of its last frame, so that the
    // next (masquerade after tracking alone) makes its own.
    for k in [
        "net.netfilter.nf_conntrack_udp_timeout",
        "net.netfilter.nf_conntrack_udp_timeout_stream",
    ] {
        let _ = t.router.sysctl(k, "1");
    }
    let data = std::env::temp_dir().join(format!("fibre-bench-perf-{}.data", std::process::id()));
    let mut out = Vec::new();
    with_generator(t, frames, cfg, |trial| {
        for (name, rules, ruleset) in component_configurations(family, cfg.component_rules) {
            step(&format!("kernel forwarding IPv{family}: {name}"));
            if !ruleset.is_empty() {
                t.router.nft(&["-f", "-"], &ruleset).map_err(io)?;
            }
            let rate = cfg.cost_rate / (1.0 + rules as f64 / 100.0);
            // Once to warm up (the connections made), once measured, once sampled.
            trial(Some(rate), false)?;
            let r = trial(Some(rate), true)?;
            let ns = r.router_busy_ns / r.forwarded.max(1) as f64;
            let split = sampled_split(t, &data, cfg, ns, &mut || trial(Some(rate), true))?;
            out.push((name, rules, ns, r.lost(), rate, split));
            for table in [
                "inet fibre_bench",
                "ip fibre_bench_nat",
                "ip6 fibre_bench_nat",
            ] {
                let words: Vec<&str> = table.split(' ').collect();
                let _ = t.router.nft(&["delete", "table", words[0], words[1]], "");
            }
            std::thread::sleep(Duration::from_millis(1500));
        }
        Ok(())
    })?;
    Ok(out)
}

/// A frame's time by component as JSON, each of [`COMPONENTS`] by name.
fn components_json(parts: &[f64; 5]) -> Value {
    let mut m = serde_json::Map::new();
    for (name, ns) in COMPONENTS.iter().zip(parts) {
        m.insert(name.to_string(), json!(ns));
    }
    Value::Object(m)
}

/// `ns`, a frame's cost to the router's core, split by component from `perf` samples
/// of the router's core taken over one more trial (`trial`); why not, if it cannot be
/// (the trial's own failure is the study's).
fn sampled_split(
    t: &Topology,
    data: &std::path::Path,
    cfg: &VethConfig,
    ns: f64,
    trial: &mut dyn FnMut() -> Result<Trial, String>,
) -> Result<Result<[f64; 5], String>, String> {
    let sampling = match Sampling::start(t.router_cpu, data, cfg.cost_time.as_secs_f64()) {
        Ok(s) => s,
        Err(e) => return Ok(Err(e)),
    };
    let sampled = trial();
    let shares = sampling.finish(data);
    sampled?;
    Ok(shares.and_then(|s| {
        s.split(ns)
            .ok_or_else(|| "perf took no sample of the busy CPU".to_string())
    }))
}

/// Room for `connections` in the kernel's connection table, whose limit and hash size
/// are the host's, not a namespace's (`nf_conntrack_max`, `nf_conntrack_buckets`): each
/// raised to at least that while held, and given back as it was.
struct ConntrackRoom(Vec<(&'static str, String)>);

impl ConntrackRoom {
    fn make(connections: usize) -> Result<ConntrackRoom, String> {
        let mut kept = Vec::new();
        for (path, at_least) in [
            ("/proc/sys/net/netfilter/nf_conntrack_max", 2 * connections),
            ("/proc/sys/net/netfilter/nf_conntrack_buckets", connections),
        ] {
            let was = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
            let now: usize = was.trim().parse().unwrap_or(0);
            if now < at_least {
                std::fs::write(path, at_least.to_string()).map_err(|e| format!("{path}: {e}"))?;
                kept.push((path, was.trim().to_string()));
            }
        }
        Ok(ConntrackRoom(kept))
    }
}

impl Drop for ConntrackRoom {
    fn drop(&mut self) {
        for (path, was) in &self.0 {
            let _ = std::fs::write(path, was);
        }
    }
}

/// The kernel's masquerade at one number of connections.
struct FlowsFigure {
    /// The connections host A's frames make.
    connections: usize,
    /// The connections the router's table held once they were made.
    tracked: u64,
    /// What a frame cost the router's core, in nanoseconds.
    ns: f64,
    /// Frames lost in the measured trial.
    lost: u64,
    /// The rate offered, frames a second.
    rate: f64,
    /// That time by component, or why not.
    split: Result<[f64; 5], String>,
}

/// The connections namespace `ns`'s table holds (`nf_conntrack_count`).
fn conntrack_count(ns: &Namespace) -> Result<u64, String> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns.name(), "cat"])
        .arg("/proc/sys/net/netfilter/nf_conntrack_count")
        .output()
        .map_err(|e| format!("nf_conntrack_count: {e}"))?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|e| format!("nf_conntrack_count in {}: {e}", ns.name()))
}

/// The kernel's masquerade by the number of connections it holds: for each of
/// `cfg.component_flows`, that many UDP connections from host A (its frames, each again
/// from other source ports), all made (every frame sent once) before what a frame costs
/// the router's core is measured and split by component, as [`kernel_components`] does
/// it. Each number's connections, what a frame costs, frames lost, the rate, the split.
fn kernel_flows(
    t: &Topology,
    family: u8,
    frames: &[Vec<u8>],
    cfg: &VethConfig,
    step: &mut dyn FnMut(&str),
) -> Result<Vec<FlowsFigure>, String> {
    let most = cfg.component_flows.iter().copied().max().unwrap_or(0);
    let _room = ConntrackRoom::make(most)?;
    // The connections live through the study: made once, then found.
    let timeouts = [
        ("net.netfilter.nf_conntrack_udp_timeout", "600"),
        ("net.netfilter.nf_conntrack_udp_timeout_stream", "600"),
    ];
    for (k, v) in timeouts {
        t.router.sysctl(k, v).map_err(io)?;
    }
    let (_, _, ruleset) = component_configurations(family, 0)
        .into_iter()
        .find(|c| c.0 == "masquerade")
        .ok_or("no masquerade configuration")?;
    t.router.nft(&["-f", "-"], &ruleset).map_err(io)?;
    let data = std::env::temp_dir().join(format!("fibre-bench-perf-{}.data", std::process::id()));
    let rate = cfg.cost_rate;
    let mut out = Vec::new();
    for &n in &cfg.component_flows {
        step(&format!(
            "kernel forwarding IPv{family}: masquerade, {n} connections"
        ));
        exec(&t.router, &["conntrack", "-F"])?;
        let many: Vec<Vec<u8>> = (0..n.max(1))
            .map(|k| {
                let mut f = frames[k % frames.len()].clone();
                other_source_port(&mut f, (k / frames.len()) as u16);
                f
            })
            .collect();
        with_generator(t, &many, cfg, |trial| {
            // Every connection made: each frame sent once, at a quarter of the rate
            // (making a connection costs the router more than finding one), again
            // while some are missing (three times at most).
            let slow = rate / 4.0;
            let per_trial = slow * cfg.trial.as_secs_f64();
            let mut tracked = 0;
            for _ in 0..3 {
                for _ in 0..=(n as f64 / per_trial).ceil() as usize {
                    trial(Some(slow), false)?;
                }
                tracked = conntrack_count(&t.router)?;
                if tracked >= n as u64 {
                    break;
                }
            }
            let r = trial(Some(rate), true)?;
            let ns = r.router_busy_ns / r.forwarded.max(1) as f64;
            let split = sampled_split(t, &data, cfg, ns, &mut || trial(Some(rate), true))?;
            out.push(FlowsFigure {
                connections: n,
                tracked,
                ns,
                lost: r.lost(),
                rate,
                split,
            });
            Ok(())
        })?;
    }
    let _ = exec(&t.router, &["conntrack", "-F"]);
    for table in [
        "inet fibre_bench",
        "ip fibre_bench_nat",
        "ip6 fibre_bench_nat",
    ] {
        let words: Vec<&str> = table.split(' ').collect();
        let _ = t.router.nft(&["delete", "table", words[0], words[1]], "");
    }
    Ok(out)
}

/// One TCP connection from host A to host B through the router for `time`, the hosts'
/// offloads as a new veth has them, both ends on the hosts' CPU: the bytes host B read,
/// and the seconds it took.
fn tcp(t: &Topology, family: u8, time: Duration) -> Result<(u64, f64), String> {
    let to: std::net::SocketAddr = if family == 4 {
        "10.200.0.2:5201".parse()
    } else {
        "[fd00:200::a:2]:5201".parse()
    }
    .map_err(|e| format!("{e}"))?;
    let pin = || {
        core_affinity::set_for_current(core_affinity::CoreId {
            id: t.generator_cpu,
        });
    };
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    std::thread::scope(|s| {
        let receiver = s.spawn(move || -> Result<(u64, f64), String> {
            pin();
            t.host_b.enter().map_err(io)?;
            let listener = match std::net::TcpListener::bind(to) {
                Ok(l) => l,
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("listening on {to}: {e}")));
                    return Err(format!("listening on {to}: {e}"));
                }
            };
            let _ = ready_tx.send(Ok(()));
            // Accepted within as long as the sender tries to connect, so that a sender
            // that could not connect does not leave this thread waiting.
            listener.set_nonblocking(true).map_err(io)?;
            let give_up = Instant::now() + Duration::from_secs(11);
            let mut conn = loop {
                match listener.accept() {
                    Ok((conn, _)) => break conn,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if Instant::now() > give_up {
                            return Err(format!("no connection to {to} through the router"));
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => return Err(format!("accepting on {to}: {e}")),
                }
            };
            conn.set_nonblocking(false).map_err(io)?;
            conn.set_read_timeout(Some(Duration::from_secs(10)))
                .map_err(io)?;
            let mut buf = vec![0u8; 1 << 16];
            let (mut got, mut first) = (0u64, None);
            loop {
                match conn.read(&mut buf) {
                    Ok(0) => break,
                    Ok(k) => {
                        first.get_or_insert_with(Instant::now);
                        got += k as u64;
                    }
                    Err(e) => return Err(format!("TCP through the router: {e} after {got} bytes")),
                }
            }
            match first {
                Some(f) if got > 0 => Ok((got, f.elapsed().as_secs_f64())),
                _ => Err(format!("TCP through the router: nothing reached {to}")),
            }
        });
        let sender = s.spawn(move || -> Result<(), String> {
            pin();
            t.host_a.enter().map_err(io)?;
            ready_rx
                .recv()
                .map_err(|_| "host B's listener ended".to_string())??;
            let mut conn = std::net::TcpStream::connect_timeout(&to, Duration::from_secs(10))
                .map_err(|e| format!("connecting to {to} through the router: {e}"))?;
            conn.set_write_timeout(Some(Duration::from_secs(10)))
                .map_err(io)?;
            let chunk = vec![0x5au8; 1 << 16];
            let until = Instant::now() + time;
            while Instant::now() < until {
                conn.write_all(&chunk)
                    .map_err(|e| format!("sending to {to}: {e}"))?;
            }
            Ok(())
        });
        let sent = sender
            .join()
            .map_err(|_| "the TCP sender failed".to_string())?;
        let got = receiver
            .join()
            .map_err(|_| "the TCP receiver failed".to_string())?;
        // The sender's error says why first (a receiver that saw nothing follows from it).
        sent?;
        got
    })
}
