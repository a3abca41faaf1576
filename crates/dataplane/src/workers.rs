//! The forwarding workers as a whole: started on the forwarded links, each on the CPU it
//! is given, watched, and restarted when one fails.
//!
//! Over AF_XDP every receive queue of every forwarded link gets a socket: worker `w` of
//! `W` owns the queues `q` with `q % W == w` on each link. A worker sends by its own
//! sockets, so it needs one on every link: there are at most as many workers as the link
//! with the fewest queues has queues. A queue nobody could serve would have its frames
//! passed to the kernel, whose forwarding is off: so a queue that cannot be bound is an
//! error at start, never a silent gap. Over `AF_PACKET` each worker reads each link, in a
//! fanout group per link.
//!
//! A worker that fails (a panic: a fault in fibre, never a packet, which is dropped and
//! counted) is noticed at once: its thread tells the supervisor as it unwinds (its
//! sockets close with it, so its queues' frames go to the kernel and, through the rings
//! of the others, to the workers still running, which forward them meanwhile), the
//! daemon logs and counts it, and the worker is started again on the same queues with a
//! new pool ([`Workers::restart`]). A link deleted and made again is another
//! link: the daemon starts all the workers again on the links as they are now.

use crate::claims::Claims;
use crate::express::Express;
use crate::pool::Pool;
use crate::ring::{ReceiveRing, LONGEST_FRAME};
use crate::worker::{run, Ports, Resolve, Shared};
use crate::xdp::{LinkProgram, LocalDestinations, QUEUES, XDP_PASS};
use crate::xsk::{self, XskPorts, CHUNK_SIZES, HEADROOM, RING};
use fibre_kernel::bpf::XdpMode;
use std::collections::HashMap;
use std::io;
use std::os::unix::thread::JoinHandleExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

/// How the workers reach their links.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoMode {
    /// AF_XDP where every link takes it, else AF_PACKET.
    Auto,
    /// AF_XDP, or an error.
    Xdp,
    /// AF_PACKET.
    Packet,
}

/// What the workers are started with, beside their links.
#[derive(Clone, Debug)]
pub struct Options {
    /// Workers wanted (fewer over AF_XDP if a link has fewer receive queues).
    pub workers: usize,
    /// How they reach the links.
    pub mode: IoMode,
    /// The CPUs to pin them to, worker `n` to the `n`-th (round the list); empty: worker
    /// `n` to core `n`.
    pub cpus: Vec<usize>,
    /// Whether they run at a real-time priority (`SCHED_FIFO`, the lowest), above the
    /// kernel threads that feed their sockets ([`REALTIME`]).
    pub realtime: bool,
    /// Whether destinations the workers decided are forwarded inside the kernel from
    /// then on (`crate::express`; over `AF_PACKET` only).
    pub express: bool,
}

/// Why the workers run at a real-time priority. Where a link's receive work runs in a
/// kernel thread on the worker's CPU (threaded NAPI, as a router confined to its cores
/// has it), the two share that CPU; at the same priority the scheduler lets the kernel's
/// thread run on for milliseconds after it woke the worker, the worker's fill ring runs
/// dry meanwhile and the kernel drops frames (`fill_ring_empty`) at a light load. Above
/// it, the worker runs as soon as its frames are there, takes them, gives the buffers
/// back and sleeps, and the kernel's thread runs in between: on a 2-vCPU guest, veth,
/// 64-byte frames, the worker and the NAPI thread on one CPU, the fill ring no longer
/// ran dry at 100,000 and 300,000 a second, where at the same priority 36 to 48% of the
/// frames were lost that way. The worker never spins, so it cannot starve the kernel's
/// thread; and the kernel keeps 5% of each second for other tasks
/// (`sched_rt_runtime_us`).
pub const REALTIME: i32 = 1;

/// Makes each worker's way to ask the kernel for neighbours.
pub type Resolver = Box<dyn FnMut() -> io::Result<Resolve> + Send>;

/// Called from a worker's thread, with its workers' generation ([`Workers::generation`])
/// and its number, as it ends: the supervisor wants to know (the daemon wakes its loop
/// with it, and calls [`Workers::restart`]).
pub type Notify = Arc<dyn Fn(u64, usize) + Send + Sync>;

/// A worker's failure, as the supervisor saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// Which worker.
    pub worker: usize,
    /// What it said as it failed.
    pub reason: String,
    /// Whether it runs again.
    pub restarted: bool,
    /// How long it took to start it again.
    pub took: std::time::Duration,
}

/// AF_XDP: the programs and what each worker owns.
struct Xdp {
    /// The programs, attached to the links while they live.
    programs: Vec<LinkProgram>,
    /// Each worker's receive queues: (interface index, queue).
    owned: Vec<Vec<(u32, u32)>>,
    /// The pool's buffer size (an AF_XDP chunk).
    chunk: usize,
}

/// The workers, running.
pub struct Workers {
    shared: Arc<Shared>,
    links: Vec<u32>,
    xdp: Option<Xdp>,
    /// Over `AF_PACKET`: the pool's buffer size.
    buffer: usize,
    cpus: Vec<usize>,
    handles: Vec<Option<JoinHandle<()>>>,
    resolver: Resolver,
    notify: Option<Notify>,
    /// Told apart from the workers started before and after these (a notice from a
    /// worker stopped with its generation is not a failure of the next's).
    generation: u64,
    /// How they read and send: `AF_XDP (driver)`, `AF_XDP (generic)` or `AF_PACKET`.
    pub io: String,
    /// The priority they run at: `realtime`, `normal`, or why not real-time.
    pub priority: String,
    /// Where they run: `as asked`, or which worker could not be placed on its CPU
    /// when it last started, and why.
    pub placement: String,
    realtime: bool,
    /// Why AF_XDP was not used, when it was asked for as `Auto` and could not be.
    pub fallback: Option<String>,
    /// Why the replies of connections translated to this host's addresses cannot be
    /// kept from the kernel's stack (`crate::claims`), if they cannot.
    pub claims_unavailable: Option<String>,
    /// What the operator should know of how they read and send: over AF_XDP on veth
    /// links, that every frame is copied in the kernel, which costs more than the
    /// kernel's own forwarding.
    pub caution: Option<String>,
    /// The express path, when asked for: its program on every link, its entries.
    express: Option<Arc<Express>>,
    /// Over `AF_PACKET`: each worker's place in its links' fanout groups (the order
    /// their sockets joined in, which the steering program maps the owners to).
    fanout_slots: Vec<u16>,
}

/// The CPUs of a list as the kernel writes one (`0-3,8,10-11`); what does not parse is
/// left out.
fn parse_cpu_list(text: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (from, to) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(from), Ok(to)) = (from.parse::<usize>(), to.parse::<usize>()) {
            // No list the kernel writes spans more CPUs than it may have.
            cpus.extend((from..=to).take(1 << 16));
        }
    }
    cpus
}

/// Why a failed worker's thread ended, from its panic.
fn reason(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(p) => match p.downcast::<&str>() {
            Ok(s) => s.to_string(),
            Err(_) => "a panic".into(),
        },
    }
}

/// Tells the supervisor that a worker's thread ends, as it drops (on a panic too): the
/// notice, the workers' generation, the worker's number.
struct Ending(Option<Notify>, u64, usize);

impl Drop for Ending {
    fn drop(&mut self) {
        if let Some(n) = &self.0 {
            n(self.1, self.2);
        }
    }
}

/// How long a failed worker is tried to be started again.
const RESTART_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// The next workers' generation.
fn next_generation() -> u64 {
    static GENERATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    GENERATIONS.fetch_add(1, Ordering::Relaxed)
}

impl Workers {
    /// Starts workers on `links` (interface indexes) as `options` say (AF_XDP consults
    /// `local` for this host's destinations); `resolver` makes each worker's way to ask
    /// the kernel for neighbours; `notify` is called when a worker ends without being
    /// stopped. Sockets are opened and programs attached before this returns, so that a
    /// link or a queue that cannot be served is an error here.
    pub fn start(
        shared: Arc<Shared>,
        links: &[u32],
        options: &Options,
        local: Option<&LocalDestinations>,
        resolver: Resolver,
        notify: Option<Notify>,
    ) -> io::Result<Workers> {
        if !options.cpus.is_empty() {
            let online = std::fs::read_to_string("/sys/devices/system/cpu/online")?;
            let known = parse_cpu_list(&online);
            if let Some(cpu) = options.cpus.iter().find(|c| !known.contains(c)) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "CPU {cpu} is not one of this machine's online CPUs ({})",
                        online.trim()
                    ),
                ));
            }
        }
        // Room in a buffer for the largest frame a forwarded link takes.
        let snap = shared.fib.snapshot();
        let mtu = links
            .iter()
            .filter_map(|&l| snap.link(l).map(|l| l.mtu as usize))
            .max()
            .unwrap_or(1500);
        drop(snap);
        let mut workers = Workers {
            shared,
            links: links.to_vec(),
            xdp: None,
            buffer: (mtu + 18).max(LONGEST_FRAME),
            cpus: options.cpus.clone(),
            handles: Vec::new(),
            resolver,
            notify,
            generation: next_generation(),
            io: "AF_PACKET".into(),
            priority: if options.realtime {
                "realtime"
            } else {
                "normal"
            }
            .into(),
            placement: "as asked".into(),
            realtime: options.realtime,
            fallback: None,
            caution: None,
            express: None,
            claims_unavailable: None,
            fanout_slots: (0..options.workers.max(1) as u16).collect(),
        };
        let mut opened = Vec::new();
        if options.express && options.mode != IoMode::Packet {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the express path runs beside AF_PACKET rings (--io packet)",
            ));
        }
        if options.mode != IoMode::Packet {
            let tried = match local {
                Some(local) => workers.open_xdp(options.workers, mtu, local),
                None => Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "no map of local destinations",
                )),
            };
            match tried {
                Ok(o) => opened = o,
                Err(e) if options.mode == IoMode::Xdp => return Err(e),
                Err(e) => {
                    // What AF_XDP had set up goes (its programs detached), so that a
                    // worker started again opens rings as the others did.
                    workers.xdp = None;
                    workers.fallback = Some(e.to_string());
                }
            }
        }
        if opened.is_empty() {
            for w in 0..options.workers.max(1) {
                opened.push(workers.open_packet(w, options.workers.max(1), options.express)?);
            }
            if options.express {
                let local = local.ok_or_else(|| {
                    io::Error::other("the express path needs the map of local destinations")
                })?;
                let mut express = Express::new(local, crate::express::EXPRESS_DESTINATIONS)?;
                for &link in &workers.links {
                    express.attach(link)?;
                }
                let express = Arc::new(express);
                *workers.shared.express() = Some(express.clone());
                workers.express = Some(express);
            }
        }
        // The replies of connections translated to this host's addresses, kept from the
        // kernel's stack: one map for the daemon's life, the program on these links.
        let claims = {
            let mut held = workers
                .shared
                .claims
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match &*held {
                Some(c) => Ok(c.clone()),
                None => Claims::new().map(|c| held.insert(Arc::new(c)).clone()),
            }
        };
        if let Err(e) = claims.and_then(|c| c.attach(&workers.links)) {
            // None at all rather than some links without: the firewall closes what
            // is translated.
            *workers
                .shared
                .claims
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
            workers.claims_unavailable = Some(e.to_string());
        }
        // A connection table and a mailbox for each worker, the connections of the
        // tables there were moved to their owners among them.
        workers.shared.set_workers(opened.len())?;
        for (w, (ports, pool)) in opened.into_iter().enumerate() {
            workers.handles.push(None);
            workers.spawn(w, ports, pool)?;
        }
        Ok(workers)
    }

    /// The workers running (or to run again).
    pub fn len(&self) -> usize {
        self.handles.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    /// The express path, if the workers run one.
    pub fn express(&self) -> Option<&Arc<Express>> {
        self.express.as_ref()
    }

    /// The links they forward between.
    pub fn links(&self) -> &[u32] {
        &self.links
    }

    /// Opens AF_XDP sockets for up to `workers` workers on every queue of every link and
    /// attaches each link's program; each worker's ports and pool.
    fn open_xdp(
        &mut self,
        workers: usize,
        mtu: usize,
        local: &LocalDestinations,
    ) -> io::Result<Vec<(Ports, Pool)>> {
        let chunk = CHUNK_SIZES
            .into_iter()
            .find(|&c| mtu + 18 + HEADROOM <= c)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("an MTU of {mtu} does not fit an AF_XDP chunk"),
                )
            })?;
        let links = &self.links;
        let queues = links
            .iter()
            .map(|&l| xsk::receive_queues(l))
            .collect::<io::Result<Vec<u32>>>()?;
        if let Some((&link, &n)) = links.iter().zip(&queues).find(|(_, &n)| n > QUEUES) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "link {link} has {n} receive queues; an XDP program serves {QUEUES} at most"
                ),
            ));
        }
        let workers = workers
            .max(1)
            .min(queues.iter().copied().min().unwrap_or(1) as usize);
        let owned: Vec<Vec<(u32, u32)>> = (0..workers)
            .map(|w| {
                links
                    .iter()
                    .zip(&queues)
                    .flat_map(|(&link, &n)| {
                        (0..n)
                            .filter(move |q| *q as usize % workers == w)
                            .map(move |q| (link, q))
                    })
                    .collect()
            })
            .collect();
        let programs = links
            .iter()
            .map(|_| LinkProgram::new(local, XDP_PASS))
            .collect::<io::Result<Vec<_>>>()?;
        self.xdp = Some(Xdp {
            programs,
            owned,
            chunk,
        });
        let mut opened = Vec::new();
        for w in 0..workers {
            opened.push(self.open_xdp_worker(w)?);
        }
        let mut mode = XdpMode::Driver;
        if let Some(xdp) = &mut self.xdp {
            for (program, &link) in xdp.programs.iter_mut().zip(&self.links) {
                if program.attach(link)? == XdpMode::Generic {
                    mode = XdpMode::Generic;
                }
            }
        }
        self.io = match mode {
            XdpMode::Driver => "AF_XDP (driver)",
            XdpMode::Generic => "AF_XDP (generic)",
        }
        .into();
        let snap = self.shared.fib.snapshot();
        let veths: Vec<String> = self
            .links
            .iter()
            .filter_map(|&l| snap.link(l))
            .filter(|l| l.kind.name() == "veth")
            .map(|l| l.name.clone())
            .collect();
        drop(snap);
        if !veths.is_empty() {
            self.caution = Some(format!(
                "links {} are veths: AF_XDP has no zero-copy mode there, the kernel copies \
                 every frame twice and allocates it anew, which costs the router's CPU \
                 about what its own forwarding does, and bursts of a few hundred frames \
                 overflow the veth's ring of 256 (--io packet --express forwards decided \
                 destinations in the kernel, at a fraction of that, offloads kept whole)",
                veths.join(", ")
            ));
        }
        Ok(opened)
    }

    /// Worker `w`'s AF_XDP sockets on its queues, put in the programs' maps, a new pool
    /// lent to them, and its rings for what the programs pass to the kernel.
    fn open_xdp_worker(&mut self, w: usize) -> io::Result<(Ports, Pool)> {
        let Some(xdp) = &self.xdp else {
            return Err(io::Error::other("not AF_XDP"));
        };
        let owned = &xdp.owned[w];
        let count = (owned.len() * 2 * RING as usize).max(4096);
        let mut pool = Pool::new(count, xdp.chunk);
        // SAFETY: the ports go into `Ports::Xdp` and then, with the pool, into the
        // worker's loop, whose `Vector` drops the ports before the pool; only the pool
        // hands out its buffers.
        let ports = unsafe { XskPorts::open(&mut pool, owned) }?;
        for (ifindex, queue, fd) in ports.sockets() {
            let k = self.links.iter().position(|&x| x == ifindex).unwrap_or(0);
            xdp.programs[k].set_socket(queue, fd)?;
        }
        let workers = xdp.owned.len();
        let mut passed = Vec::new();
        for &ifindex in &self.links {
            let fanout = (workers > 1).then_some((ifindex as u16, None));
            passed.push(ReceiveRing::open_passed(ifindex, fanout)?);
        }
        Ok((Ports::Xdp { xsk: ports, passed }, pool))
    }

    /// Worker `w`'s `AF_PACKET` rings (of `workers`), and its pool. With the express
    /// path, two rings a link, one for IPv4 and one for IPv6, each handed its frames
    /// after the express program has taken what it redirects (a fanout group each).
    /// The workers' rings join each group in the workers' order (each opened after the
    /// last), steered by the connections' owners' hash: each worker reads the packets
    /// of the connections it owns. (A worker started again joins last: the program,
    /// given again, follows the group's new order, [`Workers::restart`].)
    fn open_packet(
        &mut self,
        _w: usize,
        workers: usize,
        express: bool,
    ) -> io::Result<(Ports, Pool)> {
        let steering = self
            .shared
            .owners(workers)
            .steering_program(&self.fanout_slots);
        let mut rx = Vec::new();
        for &ifindex in &self.links {
            let fanout = (workers > 1).then_some((ifindex as u16, Some(&steering[..])));
            if express {
                for (k, ethertype) in [libc::ETH_P_IP, libc::ETH_P_IPV6].into_iter().enumerate() {
                    let group = fanout.map(|(g, s)| (g ^ (k as u16) << 15, s));
                    rx.push(ReceiveRing::open_ethertype(
                        ifindex,
                        group,
                        ethertype as u16,
                    )?);
                }
            } else {
                rx.push(ReceiveRing::open(ifindex, fanout)?);
            }
        }
        let ports = Ports::Packet {
            rx,
            senders: HashMap::new(),
        };
        Ok((ports, Pool::new(1024, self.buffer)))
    }

    /// Starts worker `w`'s thread on its CPU with `ports` and `pool`.
    fn spawn(&mut self, w: usize, ports: Ports, pool: Pool) -> io::Result<()> {
        let shared = self.shared.clone();
        let resolve = (self.resolver)()?;
        // A CPU asked for is taken as it is, even outside the daemon's own affinity
        // (an operator may start it on the control plane's CPUs and give the workers
        // others).
        let core = if self.cpus.is_empty() {
            let cores = core_affinity::get_core_ids().unwrap_or_default();
            cores.get(w % cores.len().max(1)).copied()
        } else {
            Some(core_affinity::CoreId {
                id: self.cpus[w % self.cpus.len()],
            })
        };
        let ending = Ending(self.notify.clone(), self.generation, w);
        let (placed_tx, placed_rx) = std::sync::mpsc::sync_channel(1);
        let handle = std::thread::Builder::new()
            .name(format!("fibre-worker-{w}"))
            .spawn(move || {
                let _ending = ending;
                let placed = core.is_none_or(core_affinity::set_for_current);
                let _ = placed_tx.send(placed);
                run(&shared, w, ports, pool, resolve);
            })?;
        // A worker that cannot have its CPU (one outside the machine or the daemon's
        // cgroup) runs where the scheduler puts it, and the daemon says so.
        // (A thread that ended before it said is a failure, reported as one.)
        let placed = placed_rx.recv();
        if placed == Ok(true) && self.placement.starts_with(&format!("worker {w} ")) {
            self.placement = "as asked".into();
        }
        if placed == Ok(false) {
            self.placement = format!(
                "worker {w} is not on CPU {}: the kernel refused it (outside this \
                 machine's or the daemon's cgroup's CPUs?)",
                core.map_or(0, |c| c.id)
            );
        }
        if self.realtime {
            let param = libc::sched_param {
                sched_priority: REALTIME,
            };
            // SAFETY: the thread is alive (its handle is held), and the parameter is a
            // live `sched_param` the call only reads.
            let r = unsafe {
                libc::pthread_setschedparam(handle.as_pthread_t(), libc::SCHED_FIFO, &param)
            };
            if r != 0 {
                self.priority = format!(
                    "normal (real-time refused: {})",
                    io::Error::from_raw_os_error(r)
                );
            }
        }
        self.handles[w] = Some(handle);
        Ok(())
    }

    /// These workers' generation, which their notices carry.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Worker `w` of generation `generation`, which said it ends ([`Notify`]): waits for
    /// its thread to finish, records why it ended, and starts it again on the same
    /// queues with a new pool. `None` if the notice is of other workers, or these are
    /// being stopped.
    pub fn restart(&mut self, generation: u64, w: usize) -> Option<Failure> {
        if generation != self.generation || self.shared.stop.load(Ordering::Relaxed) {
            return None;
        }
        let handle = self.handles.get_mut(w)?.take()?;
        let started = Instant::now();
        // It is ending: its sockets and pool are gone or about to be.
        let reason = match handle.join() {
            Err(payload) => reason(payload),
            Ok(()) => "ended".into(),
        };
        // Its sockets left their fanout groups, each group's last socket taking the
        // place a leaving one had (`__fanout_unlink`); its new ones join last, and the
        // program they give the groups maps the owners to that order. (A try that fails
        // closes the sockets it had joined, which were last: the others keep their
        // places.)
        if self.xdp.is_none() {
            let last = self.fanout_slots.len().saturating_sub(1) as u16;
            if let Some(place) = self.fanout_slots.get(w).copied() {
                if let Some(moved) = self.fanout_slots.iter().position(|&s| s == last) {
                    self.fanout_slots[moved] = place;
                }
                self.fanout_slots[w] = last;
            }
        }
        // The kernel lets the failed worker's sockets go a little after they close (it
        // releases their buffers in the background): binding its queues again may find
        // them still taken for some milliseconds, so it is tried until it takes.
        let mut restarted = false;
        while !restarted && started.elapsed() < RESTART_WITHIN {
            let again = if self.xdp.is_some() {
                self.open_xdp_worker(w)
            } else {
                let n = self.handles.len();
                let express = self.express.is_some();
                self.open_packet(w, n, express)
            };
            match again {
                Ok((ports, pool)) => restarted = self.spawn(w, ports, pool).is_ok(),
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
            }
        }
        Some(Failure {
            worker: w,
            reason,
            restarted,
            took: started.elapsed(),
        })
    }

    /// Stops the workers and waits for them; the programs come off the links.
    pub fn stop(mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        for h in self.handles.iter_mut().filter_map(Option::take) {
            let _ = h.join();
        }
        self.shared.stop.store(false, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::parse_cpu_list;

    #[test]
    fn a_cpu_list_is_read_as_the_kernel_writes_it() {
        assert_eq!(parse_cpu_list("0-1\n"), [0, 1]);
        assert_eq!(parse_cpu_list("0-3,8,10-11"), [0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpu_list("5"), [5]);
        assert!(parse_cpu_list("").is_empty());
        assert_eq!(parse_cpu_list("x,2,3-y"), [2]);
    }
}
