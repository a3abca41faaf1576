//! `fibre daemon` and `fibre ctl`: the kernel's routing state mirrored over rtnetlink
//! (`fibre-mirror`), and a control client that asks it what the file-configured
//! commands answer (`route get`, `route show`, `rule show`, `nexthop show`, `link show`,
//! `addr show`), `neigh show` and `stats`.
//!
//! One thread owns the mirror: it applies each batch of notifications and answers each
//! request in turn, so that a request sees whole batches only. The others feed it through
//! one channel: the netlink receiver, the signal watcher (SIGINT, SIGTERM: the daemon
//! removes its socket and exits), the watcher of the mirrored namespace's name (deleted,
//! the daemon says so and exits non-zero), and one thread per client. A client sends one
//! line, a JSON array of the command's words, and reads one line back, a JSON object
//! with the output (or, asked with `--json`, the JSON value itself), the errors and the
//! exit code; who it is (process, user, group) and what it asked go to the log, which
//! `tracing` writes (time, level, message; `RUST_LOG` filters it). A malformed request gets an error reply; nothing a
//! client sends or fails to send stops the daemon. The control socket is made safely
//! ([`crate::control_socket`]).
//!
//! Everything is bounded: the notifications received and not yet applied (`--backlog`:
//! past it the receiver waits, the kernel's socket overflows and the mirror dumps again),
//! the clients served at once ([`MAX_CLIENTS`], [`MAX_SCRAPES`]), and the time each has to
//! send its request and take its reply ([`CLIENT_TIME`]).

use crate::commands::{self, Done, Out};
use crate::control_socket::ControlSocket;
use crate::firewall::{self, Firewall, SharedFirewall};
use crate::forwarding::Forwarding;
use crate::metrics::{Exposition, Kind};
use clap::Args;
use fibre_fib::{Family, State};
use fibre_kernel::{priority, privileges};
use fibre_mirror::netlink::{self, Backlog, Batch, Events};
use fibre_mirror::Mirror;
use fibre_mirror::{lladdr_text, NeighState};
use prometheus_client::metrics::histogram::Histogram;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// `fibre daemon`.
#[derive(Args)]
pub struct DaemonArgs {
    /// Mirror this named network namespace (`/run/netns/NAME`) instead of the current one.
    #[arg(long)]
    netns: Option<String>,
    /// The control socket `fibre ctl` connects to (removed on exit). Made 0660: its
    /// owner and its group may connect. A stale socket there is replaced; anything else
    /// there (a daemon answering, a file) is refused and left as it was.
    #[arg(long)]
    socket: PathBuf,
    /// The group (name or number) the control socket is made for: its members may use
    /// `fibre ctl`. By default the daemon's own.
    #[arg(long)]
    socket_group: Option<String>,
    /// The receive buffer of the subscribed netlink socket, in bytes: large, so that
    /// bursts queue; past it changes are lost and the daemon dumps again (counted).
    #[arg(long, default_value_t = netlink::RECEIVE_BUFFER)]
    receive_buffer: usize,
    /// The most notifications received and not yet applied: past it the daemon stops
    /// reading them, so that a mirror falling behind overflows the socket above and dumps
    /// again rather than queueing without end.
    #[arg(long, default_value_t = netlink::BACKLOG_MESSAGES)]
    backlog: usize,
    /// Serve Prometheus metrics over HTTP at this address (in the namespace the daemon
    /// was started in): routes per table and family, updates, batches, overflows,
    /// resyncs, lag quantiles, memory.
    #[arg(long)]
    metrics: Option<std::net::SocketAddr>,
    /// Forward packets between these links (names, comma-separated), with the mirrored
    /// routes and neighbours; the kernel's own forwarding may be off.
    #[arg(long, value_delimiter = ',')]
    forward: Vec<String>,
    /// Forwarding workers, each pinned to a core of its own.
    #[arg(long, default_value_t = 1, requires = "forward")]
    workers: usize,
    /// The CPUs the workers run on (comma-separated), worker `n` on the `n`-th; by
    /// default worker `n` runs on CPU `n`.
    #[arg(long, value_delimiter = ',', requires = "forward")]
    cpus: Vec<usize>,
    /// Run the mirror, its netlink receivers and the workers at the normal priority, not
    /// the lowest real-time one (`SCHED_FIFO` 1), which publishes each change as soon as
    /// it arrives, however busy the CPUs, and keeps the workers ahead of the kernel
    /// threads that feed their sockets on a shared CPU.
    #[arg(long)]
    no_realtime: bool,
    /// How the workers read and send: `xdp` (AF_XDP sockets, an XDP program on each
    /// link passing the kernel's frames to it), `packet` (AF_PACKET sockets), or `auto`
    /// (AF_XDP where every link takes it, else AF_PACKET). With AF_XDP, every receive
    /// queue of every link is read, worker `w` of `W` reading queues `q % W == w`: there
    /// are at most as many workers as the link with the fewest queues has queues.
    #[arg(long, value_enum, default_value_t = Io::Auto, requires = "forward")]
    io: Io,
    /// Forward, inside the kernel, the frames of each destination the workers have
    /// decided by its destination alone: a traffic-control program on each link
    /// redirects them by an entry the workers write, retired at every route or
    /// neighbour change. With `--io packet`.
    #[arg(long, requires = "forward")]
    express: bool,
}

/// `--io`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Io {
    /// AF_XDP where it can be, else AF_PACKET.
    Auto,
    /// AF_XDP.
    Xdp,
    /// AF_PACKET.
    Packet,
}

impl From<Io> for fibre_dataplane::workers::IoMode {
    fn from(io: Io) -> Self {
        match io {
            Io::Auto => Self::Auto,
            Io::Xdp => Self::Xdp,
            Io::Packet => Self::Packet,
        }
    }
}

/// `fibre ctl`.
#[derive(Args)]
pub struct CtlArgs {
    /// The daemon's control socket.
    #[arg(long)]
    socket: PathBuf,
    /// The command: `route get ...`, `route show [table ID|all] [-4|-6]`, `rule show
    /// [-4|-6]`, `nexthop show`, `link show`, `addr show [-4|-6]`, `neigh show [nud all]
    /// [-4|-6]`, `stats`; `--json` anywhere for JSON.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
    command: Vec<String>,
}

/// The longest request line a client may send.
const MAX_REQUEST: u64 = 64 << 10;

/// The most control clients served at once: one more is told so and turned away.
const MAX_CLIENTS: usize = 16;

/// The most metrics scrapes served at once.
const MAX_SCRAPES: usize = 4;

/// How long a client has to send its whole request, and again to take the reply.
const CLIENT_TIME: Duration = Duration::from_secs(10);

/// One of a bounded number of places ([`MAX_CLIENTS`], [`MAX_SCRAPES`]), held while a
/// client is served and given back when dropped.
struct Place(Arc<std::sync::atomic::AtomicUsize>);

impl Place {
    /// A place among at most `max` held through `taken`, or `None` if all are.
    fn take(taken: &Arc<std::sync::atomic::AtomicUsize>, max: usize) -> Option<Place> {
        use std::sync::atomic::Ordering;
        taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Place(taken.clone()))
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// A client's stream read against a deadline: each read waits at most what is left of
/// it, so that a client sending a byte now and then cannot hold its thread past it.
struct Until<S> {
    stream: S,
    until: Instant,
    set_timeout: fn(&S, Option<Duration>) -> std::io::Result<()>,
}

impl<S: Read> Read for Until<S> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let late = || {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("not sent within {} s", CLIENT_TIME.as_secs()),
            )
        };
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(late());
        }
        (self.set_timeout)(&self.stream, Some(left))?;
        match self.stream.read(buf) {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Err(late())
            }
            other => other,
        }
    }
}

/// What the mirror's thread is told.
enum Event {
    /// Notifications, received at the instant given.
    Netlink(Batch, Instant),
    /// The netlink receiver failed.
    Failed(std::io::Error),
    /// A client's command words, and where its reply goes.
    Request(Vec<String>, mpsc::Sender<Reply>),
    /// SIGINT or SIGTERM.
    Stop(i32),
    /// The mirrored namespace was deleted (why it is known).
    NamespaceGone(String),
    /// A scrape of the metrics, and where its text goes.
    Metrics(mpsc::Sender<String>),
    /// A forwarding worker ended (its generation and number).
    WorkerEnded(u64, usize),
    /// What the firewall closes changed (it closed it to the workers already): the
    /// XDP programs and the express path follow.
    FirewallChanged,
    /// What the kernel forwards itself changed: by forwarded link, its families.
    KernelForwarding(Vec<(String, u8)>),
}

/// A reply to a client: what the command printed, or, asked with `--json`, the JSON
/// value itself (not a string holding it), its errors and its exit code.
struct Reply {
    out: String,
    value: Option<serde_json::Value>,
    err: String,
    code: u8,
}

impl Reply {
    fn error(text: String) -> Reply {
        Reply {
            out: String::new(),
            value: None,
            err: text + "\n",
            code: 1,
        }
    }

    /// The reply on the wire, one line: `{"stdout": TEXT, "stderr": TEXT, "code": N}`,
    /// with `"json": VALUE` in place of `stdout` for a command asked with `--json`.
    fn json(&self) -> String {
        let mut v = serde_json::json!({"stderr": self.err, "code": self.code});
        match &self.value {
            Some(value) => v["json"] = value.clone(),
            None => v["stdout"] = self.out.clone().into(),
        }
        v.to_string()
    }
}

/// The daemon's log: lines on standard error with their time (UTC), level and message,
/// filtered by `RUST_LOG` (`info` when it is not set: `RUST_LOG=warn` leaves out the
/// requests, `RUST_LOG=debug` adds detail), colored only on a terminal.
fn start_logging() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::builder()
        .with_default_directive(tracing::Level::INFO.into())
        .from_env_lossy();
    // Another subscriber already set (the daemon run twice in one process) keeps its own.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
}

/// Runs `fibre daemon` until SIGINT or SIGTERM.
pub fn run(a: DaemonArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    start_logging();
    // The metrics are served in the namespace the daemon was started in: bound before
    // entering the mirrored one.
    let metrics = match a.metrics {
        Some(addr) => {
            Some(std::net::TcpListener::bind(addr).map_err(|e| format!("--metrics {addr}: {e}"))?)
        }
        None => None,
    };
    // A panic is a fault in fibre: one line in the log, at once. A forwarding worker's
    // sockets stay open until its thread has unwound, and frames meanwhile wait on them:
    // no time goes to a backtrace first.
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current();
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        let at = info
            .location()
            .map_or_else(String::new, |l| format!(" at {}:{}", l.file(), l.line()));
        tracing::error!(
            "thread {} failed{at}: {what}",
            thread.name().unwrap_or("unnamed")
        );
    }));
    // Before any thread starts: they are all of the namespace.
    let entered = match &a.netns {
        Some(ns) => {
            fibre_kernel::netns::enter(ns)?;
            Some((ns.clone(), namespace_identity("/proc/thread-self/ns/net")?))
        }
        None => None,
    };
    let (tx, rx) = mpsc::channel::<Event>();
    // (Caught from before the socket is made: a signal meanwhile still removes it.)
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])?;
    let control = ControlSocket::bind(&a.socket, a.socket_group.as_deref())?;
    let listener = control.listener()?;
    // While privileged: the mirror (this thread) real-time; `CAP_SYS_NICE` is kept for
    // the receivers started after the cut.
    let realtime = !a.no_realtime
        && match priority::make_this_thread_realtime() {
            Ok(()) => {
                tracing::info!(
                    "the mirror and its receivers run at the lowest real-time priority (SCHED_FIFO {})",
                    priority::LOWEST_REALTIME
                );
                true
            }
            Err(e) => {
                tracing::warn!(
                    "the mirror runs at the normal priority: a real-time one was refused ({e})"
                );
                false
            }
        };
    let kept = privileges::keep_only(&needed_capabilities(!a.forward.is_empty(), realtime)?)?;
    tracing::info!(
        "capabilities kept: {}",
        match privileges::names(kept).join(", ") {
            n if n.is_empty() => "none".into(),
            n => n,
        }
    );
    if let Some((name, identity)) = entered {
        watch_namespace(name, identity, &tx)?;
    }
    {
        let tx = tx.clone();
        std::thread::spawn(move || {
            if let Some(sig) = signals.forever().next() {
                let _ = tx.send(Event::Stop(sig));
            }
        });
    }
    // Subscribed before the dump: what changes meanwhile queues, and is applied after.
    let mut events = Events::subscribe(a.receive_buffer)?;
    let started = Instant::now();
    // At the normal priority, beside its reader and compile threads.
    let (mut mirror, reader) = priority::normal_while(Mirror::sync)?;
    tracing::info!(
        "synced in {:.3} s (the kernel's dump {:.3} s): {} links, {} IPv4 and {} IPv6 routes; control socket {}",
        started.elapsed().as_secs_f64(),
        mirror.stats().dump_time.as_secs_f64(),
        mirror.state().links().count(),
        mirror.state().routes(Family::V4, None).count(),
        mirror.state().routes(Family::V6, None).count(),
        a.socket.display()
    );
    // The router's firewall, subscribed before its dump as the routes are. Forwarding
    // needs it: fibre does not forward around a ruleset it cannot see.
    let (firewall, ruleset_events) =
        match fibre_firewall::nfnetlink::Events::subscribe().and_then(|events| {
            Firewall::sync(&a.forward).map(|f| (Some(Arc::new(Mutex::new(f))), Some(events)))
        }) {
            Ok(pair) => pair,
            Err(e) if a.forward.is_empty() => {
                tracing::warn!("the nftables ruleset is not mirrored: {e}");
                (None, None)
            }
            Err(e) => {
                return Err(format!(
                    "--forward: the router's nftables ruleset cannot be read ({e}); fibre does \
                     not forward around a firewall it cannot see"
                )
                .into())
            }
        };
    let mut forwarding = if a.forward.is_empty() {
        None
    } else {
        let closed = firewall
            .as_ref()
            .map_or(0b1111, |f| firewall::lock(f).closed_until_attached());
        let tx = std::sync::Mutex::new(tx.clone());
        let notify: fibre_dataplane::workers::Notify = std::sync::Arc::new(move |g, n| {
            if let Ok(tx) = tx.lock() {
                let _ = tx.send(Event::WorkerEnded(g, n));
            }
        });
        let options = fibre_dataplane::workers::Options {
            workers: a.workers,
            mode: a.io.into(),
            cpus: a.cpus.clone(),
            realtime: !a.no_realtime,
            express: a.express,
        };
        let f = Forwarding::start(&mirror, reader, &a.forward, options, closed, Some(notify))?;
        let (io, fallback) = f.io();
        tracing::info!(
            "forwarding between {} with {} worker(s) ({io}, priority {})",
            a.forward.join(", "),
            f.workers(),
            f.priority()
        );
        if let Some(caution) = f.caution() {
            tracing::warn!("caution: {caution}");
        }
        if f.placement() != "as asked" {
            tracing::info!("{}", f.placement());
        }
        if let Some(why) = fallback {
            tracing::warn!("not AF_XDP: {why}");
        }
        if let Some(fw) = &firewall {
            firewall::lock(fw).attach(f.shared());
        }
        if let Some(said) = f.kernel_forwarding_said() {
            tracing::info!("{said}");
        }
        Some(f)
    };
    let backlog = Arc::new(Backlog::new(a.backlog));
    {
        let (tx, backlog) = (tx.clone(), backlog.clone());
        let receiver = std::thread::Builder::new().name("rtnetlink".into());
        receiver.spawn(move || {
            if realtime {
                // As the mirror is (a refusal was said for it).
                let _ = priority::make_this_thread_realtime();
            }
            loop {
                backlog.wait_for_room();
                match events.receive() {
                    Ok(b) => {
                        backlog.received(&b);
                        if tx.send(Event::Netlink(b, Instant::now())).is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Event::Failed(e));
                        return;
                    }
                }
            }
        })?;
    }
    if let (Some(fw), Some(events)) = (&firewall, ruleset_events) {
        watch_firewall(fw, events, &tx, realtime);
    }
    if forwarding.is_some() {
        watch_kernel_forwarding(a.forward.clone(), &tx);
    }
    {
        let tx = tx.clone();
        let taken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let Some(place) = Place::take(&taken, MAX_CLIENTS) else {
                    turn_away(conn);
                    continue;
                };
                let tx = tx.clone();
                // Past the threads this system allows, the client is turned away; the
                // daemon goes on.
                let _ = std::thread::Builder::new().spawn(move || serve(conn, tx, place));
            }
        });
    }
    if let Some(metrics) = metrics {
        let tx = tx.clone();
        let taken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        std::thread::spawn(move || {
            for conn in metrics.incoming().flatten() {
                // A scrape past the bound is closed unanswered: the scraper tries later.
                let Some(place) = Place::take(&taken, MAX_SCRAPES) else {
                    continue;
                };
                let tx = tx.clone();
                let _ = std::thread::Builder::new().spawn(move || scrape(conn, tx, place));
            }
        });
    }
    // Events taken out of the channel while gathering notifications, answered next.
    let mut waiting = std::collections::VecDeque::new();
    // The lag of every batch published, for the metrics.
    let lags = crate::metrics::seconds_histogram();
    let mut names = link_names(&mirror);
    let code = loop {
        let event = match waiting.pop_front() {
            Some(e) => Ok(e),
            None => rx.recv(),
        };
        match event {
            Ok(Event::Netlink(Batch::Messages(mut batch, mut bad), at)) => {
                // Every batch of notifications already waiting joins this one: one
                // publication for all, however long the last one took.
                while let Ok(e) = rx.try_recv() {
                    match e {
                        Event::Netlink(Batch::Messages(more, more_bad), _)
                            if waiting.is_empty() =>
                        {
                            batch.extend(more);
                            bad += more_bad;
                        }
                        other => waiting.push_back(other),
                    }
                }
                let applied = batch.len();
                if let Some(lag) = mirror.apply(batch, bad, at) {
                    lags.observe(lag.as_secs_f64());
                }
                backlog.applied(applied);
                mirror.stats_mut().backlog_waits = backlog.waits();
                if let Some(f) = &mut forwarding {
                    f.publish(&mirror, false);
                }
                // A chain's hook follows its device through a rename, which nf_tables
                // does not announce: the ruleset is dumped again.
                let now = link_names(&mirror);
                if now != names {
                    let renamed = now
                        .iter()
                        .any(|(i, n)| names.iter().any(|(j, m)| i == j && n != m));
                    names = now;
                    if let (true, Some(fw)) = (renamed, &firewall) {
                        if firewall::lock(fw).resync("a link renamed") {
                            let _ = tx.send(Event::FirewallChanged);
                        }
                    }
                }
            }
            Ok(Event::Netlink(Batch::Overflow, _)) => {
                mirror.overflowed();
                mirror.stats_mut().backlog_waits = backlog.waits();
                tracing::warn!("the netlink socket overflowed; dumping again");
                if let Err(e) = priority::normal_while(|| mirror.resync()) {
                    tracing::error!("the dump failed: {e}");
                    break ExitCode::FAILURE;
                }
                if let Some(f) = &mut forwarding {
                    f.publish(&mirror, true);
                }
            }
            Ok(Event::Failed(e)) => {
                tracing::error!("netlink: {e}");
                break ExitCode::FAILURE;
            }
            Ok(Event::FirewallChanged) => {
                if let Some(f) = &mut forwarding {
                    f.reopen(&mirror);
                    if let Err(e) = f.publish_local(&mirror) {
                        tracing::warn!("{e}");
                    }
                }
            }
            Ok(Event::KernelForwarding(now)) => {
                if let Some(f) = &mut forwarding {
                    if f.kernel_forwards(now, &mirror) {
                        if let Err(e) = f.publish_local(&mirror) {
                            tracing::warn!("{e}");
                        }
                        match f.kernel_forwarding_said() {
                            Some(said) => tracing::info!("{said}"),
                            None => tracing::info!(
                                "the kernel's forwarding is off on the forwarded links: fibre forwards everything"
                            ),
                        }
                    }
                }
            }
            Ok(Event::Request(words, reply)) => {
                // A command only reads the mirror: should one fail in a way not foreseen,
                // its client gets an error and the daemon goes on.
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let fw = firewall.as_ref().map(firewall::lock);
                    answer(&mirror, forwarding.as_ref(), fw.as_deref(), &words)
                }))
                .unwrap_or_else(|_| Reply::error("Error: the command failed".into()));
                let _ = reply.send(r);
            }
            Ok(Event::Metrics(reply)) => {
                let mut e = Exposition::new();
                exposition(&mirror, &lags, &mut e);
                if let Some(f) = &forwarding {
                    f.metrics(&mut e);
                }
                if let Some(fw) = &firewall {
                    firewall::lock(fw).metrics(&mut e);
                }
                let _ = reply.send(e.text());
            }
            Ok(Event::WorkerEnded(g, n)) => {
                if let Some(failure) = forwarding.as_mut().and_then(|f| f.supervise(g, n)) {
                    if failure.restarted {
                        tracing::warn!(
                            "forwarding worker {n} failed ({}); started again in {:.1} ms",
                            failure.reason,
                            failure.took.as_secs_f64() * 1e3
                        );
                    } else {
                        tracing::error!(
                            "forwarding worker {n} failed ({}); it could not be started again: its queues' frames go to the kernel and the other workers",
                            failure.reason
                        );
                    }
                }
            }
            Ok(Event::Stop(sig)) => {
                tracing::info!("signal {sig}: exiting");
                break ExitCode::SUCCESS;
            }
            Ok(Event::NamespaceGone(why)) => {
                tracing::error!("{why}: there is nothing left to mirror; exiting");
                break ExitCode::FAILURE;
            }
            Err(_) => break ExitCode::FAILURE,
        }
    };
    control.remove();
    if let Some(f) = forwarding {
        f.stop();
    }
    Ok(code)
}

/// Starts the firewall's threads: the receiver of the nf_tables group, which applies
/// each batch and closes at once what a commit closes; and the watcher of the
/// iptables-legacy tables, each second. Each change is told to the daemon's loop. The
/// receiver is real-time if `realtime`, as the mirror.
fn watch_firewall(
    fw: &SharedFirewall,
    mut events: fibre_firewall::nfnetlink::Events,
    tx: &mpsc::Sender<Event>,
    realtime: bool,
) {
    {
        let (fw, tx, blinded) = (fw.clone(), tx.clone(), fw.clone());
        let receiver = std::thread::Builder::new().name("nftables".into());
        let started = receiver.spawn(move || {
            if realtime {
                // A commit closes what it closes as soon as it arrives, as a route does.
                let _ = priority::make_this_thread_realtime();
            }
            loop {
                match events.receive() {
                    Ok(batch) => {
                        let changed = firewall::lock(&fw).receive(batch);
                        if changed && tx.send(Event::FirewallChanged).is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        firewall::lock(&fw).blind(format!("the nftables subscription failed: {e}"));
                        return;
                    }
                }
            }
        });
        if let Err(e) = started {
            firewall::lock(&blinded).blind(format!("the nftables receiver cannot start: {e}"));
        }
    }
    let (fw, tx) = (fw.clone(), tx.clone());
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_secs(1));
        let changed = firewall::lock(&fw).watch_legacy();
        if changed && tx.send(Event::FirewallChanged).is_err() {
            return;
        }
    });
}

/// Starts the watcher of the kernel's forwarding sysctls for the links `names`, each
/// second (the kernel's netconf notifications would say it sooner; not followed yet);
/// a change is told to the daemon's loop.
fn watch_kernel_forwarding(names: Vec<String>, tx: &mpsc::Sender<Event>) {
    let tx = tx.clone();
    std::thread::spawn(move || {
        // The first reading is always told: the forwarding's own, taken as it started,
        // may be older than it.
        let mut last = Vec::new();
        loop {
            std::thread::sleep(Duration::from_secs(1));
            let now = crate::forwarding::kernel_forwarding(&names);
            if now != last {
                last = now.clone();
                if tx.send(Event::KernelForwarding(now)).is_err() {
                    return;
                }
            }
        }
    });
}

/// Each link's index and name.
fn link_names(mirror: &Mirror) -> Vec<(u32, String)> {
    mirror
        .state()
        .links()
        .map(|l| (l.index, l.name.clone()))
        .collect()
}

/// The capabilities the daemon keeps after setup: `CAP_NET_ADMIN` to dump the firewall
/// again and to size a netlink socket past the system's bound (a resync); forwarding,
/// for a worker started again, `CAP_NET_RAW` (its sockets), `CAP_BPF` (its programs; on
/// a kernel before it, `CAP_SYS_ADMIN`), `CAP_IPC_LOCK` (AF_XDP's frames pinned) and
/// `CAP_SYS_NICE` (its real-time priority); `CAP_SYS_NICE` too if `realtime`, for the
/// mirror's receivers' real-time priority.
fn needed_capabilities(
    forwarding: bool,
    realtime: bool,
) -> std::io::Result<Vec<privileges::Capability>> {
    let mut keep = vec![privileges::NET_ADMIN];
    if forwarding {
        keep.extend([privileges::NET_RAW, privileges::IPC_LOCK]);
        keep.push(if privileges::last()?.0 >= privileges::BPF.0 {
            privileges::BPF
        } else {
            privileges::SYS_ADMIN
        });
    }
    if forwarding || realtime {
        keep.push(privileges::SYS_NICE);
    }
    Ok(keep)
}

/// A namespace's identity: the device and inode of its file (`/run/netns/NAME`, or a
/// thread's `/proc/thread-self/ns/net`).
fn namespace_identity(path: impl AsRef<std::path::Path>) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let path = path.as_ref();
    std::fs::metadata(path)
        .map(|m| (m.dev(), m.ino()))
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// Starts the watcher of the mirrored namespace's name (`/run/netns/NAME`), each
/// second: once it is gone (`ip netns del`) or names another namespace than the one
/// entered (`entered`), the daemon is told. (The daemon's threads keep the namespace
/// itself alive: only its name goes.) Refuses if it names another one already.
fn watch_namespace(
    name: String,
    entered: (u64, u64),
    tx: &mpsc::Sender<Event>,
) -> Result<(), String> {
    let path = std::path::Path::new("/run/netns").join(&name);
    let gone = move || match namespace_identity(&path) {
        Ok(now) if now == entered => None,
        Ok(_) => Some(format!("{} names another namespace", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(e.to_string()),
        // (Anything else says nothing of it: asked again in a second.)
        Err(_) => None,
    };
    if let Some(why) = gone() {
        return Err(format!(
            "the network namespace {name} changed as it was entered ({why})"
        ));
    }
    let tx = tx.clone();
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_secs(1));
        if let Some(why) = gone() {
            let _ = tx.send(Event::NamespaceGone(format!(
                "the network namespace {name} was deleted ({why})"
            )));
            return;
        }
    });
    Ok(())
}

/// A client past [`MAX_CLIENTS`]: told so, at once (what it sent is read for a moment
/// first, so that closing does not reset the connection under its reply). The first
/// turned away and then every hundredth are logged, with the count.
fn turn_away(conn: UnixStream) {
    static TURNED_AWAY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = TURNED_AWAY.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
    if n % 100 == 1 {
        log_request(
            &conn,
            &format!("(not read: too many clients; {n} turned away so far)"),
        );
    }
    let _ = conn.set_read_timeout(Some(Duration::from_millis(100)));
    let _ = BufReader::new(&conn)
        .take(MAX_REQUEST)
        .read_line(&mut String::new());
    let reply = Reply::error(format!(
        "Error: the daemon serves {MAX_CLIENTS} clients at once; try again"
    ));
    let deadline = Instant::now() + Duration::from_millis(100);
    reply_until(&conn, format!("{}\n", reply.json()).as_bytes(), deadline);
}

/// Writes `bytes` to a client until `until`, however slowly it reads: each write waits
/// at most what is left of the time (a timeout per write alone would let a client that
/// takes a little at a time hold its thread, and its reply, for hours). What is not
/// written by then is dropped with the connection.
fn write_until<S: Write>(
    mut stream: S,
    set_timeout: fn(&S, Option<Duration>) -> std::io::Result<()>,
    bytes: &[u8],
    until: Instant,
) {
    for chunk in bytes.chunks(64 << 10) {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || set_timeout(&stream, Some(left)).is_err() {
            return;
        }
        if stream.write_all(chunk).is_err() {
            return;
        }
    }
}

/// [`write_until`] to a control client.
fn reply_until(conn: &UnixStream, bytes: &[u8], until: Instant) {
    write_until(conn, |s, t| s.set_write_timeout(t), bytes, until);
}

/// One client: its request line in, the reply out. It holds `place` meanwhile.
fn serve(conn: UnixStream, tx: mpsc::Sender<Event>, place: Place) {
    // A client that stalls holds only its own thread, and not for long.
    let until = Until {
        stream: &conn,
        until: Instant::now() + CLIENT_TIME,
        set_timeout: |s, t| s.set_read_timeout(t),
    };
    let mut line = String::new();
    let read = BufReader::new(until).take(MAX_REQUEST).read_line(&mut line);
    let reply = match read {
        Err(e) => Reply::error(format!("Error: reading the request: {e}")),
        Ok(_) if !line.ends_with('\n') => {
            log_request(&conn, "a request cut short or too long");
            Reply::error("Error: a request is one line of at most 64 KiB".into())
        }
        Ok(_) => match serde_json::from_str::<Vec<String>>(&line) {
            Err(e) => {
                log_request(&conn, &format!("a malformed request ({e})"));
                Reply::error(format!(
                    "Error: a request is a JSON array of the command's words: {e}"
                ))
            }
            Ok(words) => {
                log_request(&conn, &words.join(" "));
                let (rtx, rrx) = mpsc::channel();
                if tx.send(Event::Request(words, rtx)).is_err() {
                    return;
                }
                match rrx.recv() {
                    Ok(r) => r,
                    Err(_) => return,
                }
            }
        },
    };
    let reply = format!("{}\n", reply.json());
    reply_until(&conn, reply.as_bytes(), Instant::now() + CLIENT_TIME);
    // Its place is free before the client sees the connection end.
    drop(place);
    drop(conn);
}

/// Says in the log who asked what: the client's process, user and group as the kernel
/// recorded them when it connected, and what it asked (quoted, so that nothing it sends
/// can pass for another line; its first 200 characters).
fn log_request(conn: &UnixStream, what: &str) {
    let who = match fibre_kernel::sockopt::peer_credentials(conn) {
        Ok(p) => format!("pid {} uid {} gid {}", p.pid, p.uid, p.gid),
        Err(e) => format!("a client not known ({e})"),
    };
    let mut what = what.escape_debug().to_string();
    if let Some((cut, _)) = what.char_indices().nth(200) {
        what.truncate(cut);
        what.push_str("...");
    }
    tracing::info!("request from {who}: {what}");
}

/// The reply to a command, run on the mirror as it stands.
fn answer(
    mirror: &Mirror,
    forwarding: Option<&Forwarding>,
    firewall: Option<&Firewall>,
    words: &[String],
) -> Reply {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let done = {
        let mut o = Out {
            out: &mut out,
            err: &mut err,
        };
        command(mirror, forwarding, firewall, words, &mut o)
    };
    let code = match done {
        Ok(code) => code,
        Err(e) => {
            err.extend_from_slice(format!("Error: {e}\n").as_bytes());
            1
        }
    };
    let out = String::from_utf8_lossy(&out).into_owned();
    // Asked with `--json`, a command prints one JSON value: it goes as a value.
    let asked_json = words.iter().any(|w| w == "--json" || w == "-j");
    let value = asked_json
        .then(|| serde_json::from_str::<serde_json::Value>(&out).ok())
        .flatten();
    Reply {
        out: if value.is_some() { String::new() } else { out },
        value,
        err: String::from_utf8_lossy(&err).into_owned(),
        code,
    }
}

/// Runs a control command's words on the mirror.
fn command(
    mirror: &Mirror,
    forwarding: Option<&Forwarding>,
    firewall: Option<&Firewall>,
    words: &[String],
    o: &mut Out,
) -> Done {
    let json = words.iter().any(|w| w == "--json" || w == "-j");
    let v4 = words.iter().any(|w| w == "-4");
    let v6 = words.iter().any(|w| w == "-6");
    let rest: Vec<String> = words
        .iter()
        .skip(2)
        .filter(|w| !matches!(w.as_str(), "--json" | "-j" | "-4" | "-6"))
        .cloned()
        .collect();
    let state: &State = mirror.state();
    let w: Vec<&str> = words.iter().take(2).map(String::as_str).collect();
    match w.as_slice() {
        ["route", "get"] => commands::route_get(&mirror.snapshot(), &words[2..], json, o),
        ["route", "show"] => commands::route_show(state, &rest, v4, v6, json, o),
        ["rule", "show"] if rest.is_empty() => commands::rule_show(state, v6, json, o),
        ["nexthop", "show"] if rest.is_empty() => commands::nexthop_show(state, json, o),
        ["link", "show"] if rest.is_empty() => commands::link_show(state, json, o),
        ["addr", "show"] if rest.is_empty() => {
            commands::addr_show(state, &commands::families(v4, v6), json, o)
        }
        ["neigh", "show"] if rest.is_empty() || rest == ["nud", "all"] => neigh_show(
            mirror,
            &commands::families(v4, v6),
            !rest.is_empty(),
            json,
            o,
        ),
        ["stats", ..] if words.len() == 1 || (words.len() == 2 && json) => {
            stats(mirror, forwarding, firewall, json, o)
        }
        ["ruleset", "show"] if rest.is_empty() => match firewall {
            Some(fw) => fw.show(json, o),
            None => {
                writeln!(
                    o.err,
                    "Error: the nftables ruleset is not mirrored (see the daemon's log)"
                )?;
                Ok(1)
            }
        },
        ["conntrack", "show"] if rest.is_empty() => match forwarding {
            Some(f) => f.with_conntrack(|t, now| crate::conntrack::show(t, now, json, o)),
            None => {
                writeln!(o.err, "Error: not forwarding: no connections are tracked")?;
                Ok(1)
            }
        },
        // A fault made on purpose, to test what follows a worker's failure.
        ["test", "fail-worker"] if words.len() == 3 => {
            match (words[2].parse::<usize>(), forwarding) {
                (Ok(n), Some(f)) if f.fail_worker(n) => {
                    writeln!(o.out, "worker {n} fails at its next round")?;
                    Ok(0)
                }
                _ => {
                    writeln!(o.err, "Error: no forwarding worker {:?}", words[2])?;
                    Ok(1)
                }
            }
        }
        _ => {
            writeln!(
                o.err,
                "Error: unknown command {:?}: route get|show, rule show, nexthop show, link show, addr show, neigh show, ruleset show, conntrack show, stats",
                words.join(" ")
            )?;
            Ok(1)
        }
    }
}

/// `neigh show [nud all]` of `fams`, as `ip neigh show` lists the entries (without `nud
/// all`, those of state `NOARP` are left out, as `ip` leaves them).
fn neigh_show(mirror: &Mirror, fams: &[Family], all: bool, json: bool, o: &mut Out) -> Done {
    let state = mirror.state();
    let mut list = Vec::new();
    for n in mirror.neighbours().iter() {
        if !fams.contains(&Family::of(n.dst)) || (!all && n.state == NeighState::Noarp) {
            continue;
        }
        let dev = state
            .link(n.link)
            .map_or_else(|| n.link.to_string(), |l| l.name.clone());
        if json {
            let mut m = serde_json::Map::new();
            m.insert("dst".into(), n.dst.to_string().into());
            m.insert("dev".into(), dev.into());
            if let Some(ll) = &n.lladdr {
                m.insert("lladdr".into(), lladdr_text(ll).into());
            }
            if n.router {
                m.insert("router".into(), serde_json::Value::Null);
            }
            m.insert("state".into(), serde_json::json!([n.state.name()]));
            list.push(serde_json::Value::Object(m));
        } else {
            let mut line = format!("{} dev {dev}", n.dst);
            if let Some(ll) = &n.lladdr {
                line += &format!(" lladdr {}", lladdr_text(ll));
            }
            if n.router {
                line += " router";
            }
            writeln!(o.out, "{line} {}", n.state.name())?;
        }
    }
    if json {
        writeln!(o.out, "{}", serde_json::Value::Array(list))?;
    }
    Ok(0)
}

/// `stats`: whether the mirror is synced, its routes per table and family, what it has
/// applied, resynchronised and dropped, its lag, its memory.
fn stats(
    mirror: &Mirror,
    forwarding: Option<&Forwarding>,
    firewall: Option<&Firewall>,
    json: bool,
    o: &mut Out,
) -> Done {
    let s = mirror.stats();
    let state = mirror.state();
    // Counted by the state as routes change: no walk of them.
    let tables: Vec<serde_json::Value> = state
        .route_counts()
        .iter()
        .map(|((f, t), n)| serde_json::json!({"family": f.name(), "table": t, "routes": n}))
        .collect();
    let us = |q| s.lag(q).map(|d| d.as_secs_f64() * 1e6);
    let routes: usize = tables
        .iter()
        .filter_map(|t| t["routes"].as_u64())
        .sum::<u64>() as usize;
    let parts = mirror.snapshot().memory_parts();
    let state_bytes = state.memory();
    let per_route = |b: usize| (b as f64 / routes.max(1) as f64).round();
    // The state, and the two snapshots a publication keeps (the published one and the
    // spare it patches next): their nodes are shared but for the few chunks the last
    // batch changed, their lookup structures are each their own.
    let memory = serde_json::json!({
        "state_bytes": state_bytes,
        "snapshot_routes_bytes": parts.routes,
        "snapshot_lookup_bytes": parts.lookup,
        "total_bytes": state_bytes + parts.routes + 2 * parts.lookup,
        "state_bytes_per_route": per_route(state_bytes),
        "snapshot_routes_bytes_per_route": per_route(parts.routes),
        "snapshot_lookup_bytes_per_route": per_route(parts.lookup),
    });
    let mut v = serde_json::json!({
        "synced": s.synced,
        "tables": tables,
        "updates": s.updates,
        "batches": s.batches,
        "resyncs": s.resyncs,
        "overflows": s.overflows,
        "backlog_waits": s.backlog_waits,
        "backoffs": s.backoffs,
        "dump_restarts": s.dump_restarts,
        "malformed": s.malformed,
        "skipped": s.skipped,
        "neighbours": mirror.neighbours().len(),
        "dump_s": s.dump_time.as_secs_f64(),
        "build_s": s.build_time.as_secs_f64(),
        "pack_s": s.pack_time.as_secs_f64(),
        "patched": mirror.publications().patched,
        "compiled": mirror.publications().compiled,
        "lag_p50_us": us(0.5),
        "lag_p99_us": us(0.99),
        "lookup_memory_bytes": parts.lookup,
        "memory": memory,
        "resident_bytes": fibre_kernel::memory::resident_bytes(),
    });
    if let Some(f) = forwarding {
        v["forwarding"] = f.stats();
    }
    if let Some(fw) = firewall {
        v["firewall"] = fw.stats();
    }
    if json {
        writeln!(o.out, "{v}")?;
    } else if let serde_json::Value::Object(m) = v {
        for (k, v) in &m {
            if k != "forwarding" {
                writeln!(o.out, "{k}: {v}")?;
            }
        }
        if let (Some(f), Some(serde_json::Value::Object(fwd))) = (forwarding, m.get("forwarding")) {
            for (k, v) in fwd {
                if k != "stages" {
                    writeln!(o.out, "forwarding {k}: {v}")?;
                }
            }
            write!(o.out, "{}", f.runtime_table())?;
        }
    }
    Ok(0)
}

/// One HTTP request for the metrics: its head read (bounded), the exposition written.
fn scrape(conn: std::net::TcpStream, tx: mpsc::Sender<Event>, place: Place) {
    let until = Until {
        stream: &conn,
        until: Instant::now() + CLIENT_TIME,
        set_timeout: |s, t| s.set_read_timeout(t),
    };
    let mut head = Vec::new();
    let mut reader = BufReader::new(until).take(8 << 10);
    // The request line and headers, up to the blank line.
    loop {
        let mut line = Vec::new();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let blank = line == b"\r\n" || line == b"\n";
                head.extend(line);
                if blank {
                    break;
                }
            }
        }
    }
    let get = head.starts_with(b"GET ");
    let (status, body) = if !get {
        ("405 Method Not Allowed", String::from("GET /metrics\n"))
    } else {
        let (rtx, rrx) = mpsc::channel();
        if tx.send(Event::Metrics(rtx)).is_err() {
            return;
        }
        match rrx.recv() {
            Ok(text) => ("200 OK", text),
            Err(_) => return,
        }
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        crate::metrics::CONTENT_TYPE,
        body.len()
    );
    write_until(
        &conn,
        |s, t| s.set_write_timeout(t),
        response.as_bytes(),
        Instant::now() + CLIENT_TIME,
    );
    drop(place);
}

/// The mirror's metrics, added to `e`; `lags` is the histogram of the lag from a batch's
/// arrival to its publication.
fn exposition(mirror: &Mirror, lags: &Histogram, e: &mut Exposition) {
    let s = mirror.stats();
    e.one(
        "fibre_mirror_synced",
        Kind::Gauge,
        "Whether the first dump is applied.",
        f64::from(u8::from(s.synced)),
    );
    let by_table = |f: Family, t: u32| {
        vec![
            ("family".to_string(), f.name().to_string()),
            ("table".to_string(), t.to_string()),
        ]
    };
    e.add(
        "fibre_mirror_routes",
        Kind::Gauge,
        "Routes mirrored, per table and family.",
        mirror
            .state()
            .route_counts()
            .iter()
            .map(|((f, t), n)| (by_table(*f, *t), *n as f64)),
    );
    e.add(
        "fibre_lookup_memory_bytes",
        Kind::Gauge,
        "Memory of the compiled lookup structures, per table and family.",
        mirror
            .snapshot()
            .memory_by_table()
            .into_iter()
            .map(|(f, t, bytes)| (by_table(f, t), bytes as f64)),
    );
    e.one(
        "fibre_resident_bytes",
        Kind::Gauge,
        "The daemon's resident memory.",
        fibre_kernel::memory::resident_bytes().unwrap_or(0) as f64,
    );
    e.one(
        "fibre_mirror_neighbours",
        Kind::Gauge,
        "Neighbour entries mirrored.",
        mirror.neighbours().len() as f64,
    );
    for (name, help, v) in [
        ("fibre_mirror_updates", "Messages applied.", s.updates),
        (
            "fibre_mirror_batches",
            "Batches of notifications published.",
            s.batches,
        ),
        (
            "fibre_mirror_overflows",
            "Overflows of the netlink socket.",
            s.overflows,
        ),
        (
            "fibre_mirror_backlog_waits",
            "Times the netlink receiver waited for the mirror to apply what it had received.",
            s.backlog_waits,
        ),
        (
            "fibre_mirror_backoffs",
            "Resyncs that backed off first, an overflow following the last resync closely.",
            s.backoffs,
        ),
        (
            "fibre_mirror_patched",
            "Publications made by patching the lookup structures.",
            mirror.publications().patched,
        ),
        (
            "fibre_mirror_compiled",
            "Publications made by compiling the lookup structures anew.",
            mirror.publications().compiled,
        ),
        (
            "fibre_mirror_resyncs",
            "Whole dumps after the first.",
            s.resyncs,
        ),
        (
            "fibre_mirror_dump_restarts",
            "Dumps the kernel marked interrupted.",
            s.dump_restarts,
        ),
        (
            "fibre_mirror_malformed",
            "Messages dropped as malformed.",
            s.malformed,
        ),
        (
            "fibre_mirror_skipped",
            "Messages of what the mirror does not hold.",
            s.skipped,
        ),
    ] {
        e.one(name, Kind::Counter, help, v as f64);
    }
    e.histogram(
        "fibre_mirror_lag_seconds",
        "From a batch's arrival to its publication.",
        lags,
    );
}

/// Runs `fibre ctl`: sends the command, prints the reply, exits with its code.
pub fn ctl(a: CtlArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let mut conn = UnixStream::connect(&a.socket)
        .map_err(|e| format!("{}: {e} (is `fibre daemon` running?)", a.socket.display()))?;
    writeln!(conn, "{}", serde_json::to_string(&a.command)?)?;
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line)?;
    let v: serde_json::Value =
        serde_json::from_str(&line).map_err(|e| format!("the daemon's reply: {e}"))?;
    match v.get("json") {
        Some(value) => println!("{value}"),
        None => print!("{}", v["stdout"].as_str().unwrap_or("")),
    }
    eprint!("{}", v["stderr"].as_str().unwrap_or(""));
    std::io::stdout().flush()?;
    Ok(ExitCode::from(
        v["code"].as_u64().map_or(1, |c| c.min(255) as u8),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One exchange over a socket pair, in process: `serve` reads the client's line and
    /// passes its words on as the event loop receives them; `answer` stands in for the
    /// mirror's thread. What the client reads back is returned.
    fn exchange(
        request: &[u8],
        answer: impl FnOnce(Vec<String>) -> Reply + Send,
    ) -> serde_json::Value {
        let (mut client, server) = UnixStream::pair().unwrap();
        let (tx, rx) = mpsc::channel();
        let taken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let place = Place::take(&taken, 1).unwrap();
        std::thread::scope(|s| {
            s.spawn(move || serve(server, tx, place));
            s.spawn(move || {
                if let Ok(Event::Request(words, reply)) = rx.recv() {
                    let _ = reply.send(answer(words));
                }
            });
            client.write_all(request).unwrap();
            let mut line = String::new();
            BufReader::new(&client).read_line(&mut line).unwrap();
            serde_json::from_str(&line).unwrap()
        })
    }

    #[test]
    fn the_control_protocol_answers_in_process() {
        // A command asked with `--json`: its value, typed.
        let v = exchange(b"[\"stats\",\"--json\"]\n", |words| {
            assert_eq!(words, ["stats", "--json"]);
            Reply {
                out: String::new(),
                value: Some(serde_json::json!({"synced": true, "tables": []})),
                err: String::new(),
                code: 0,
            }
        });
        assert_eq!(v["json"]["synced"], true, "{v}");
        assert!(v.get("stdout").is_none(), "{v}");
        assert_eq!(v["code"], 0);
        // Without: the text.
        let v = exchange(b"[\"route\",\"get\",\"10.1.1.1\"]\n", |_| Reply {
            out: "10.1.1.1 dev a0\n".into(),
            value: None,
            err: String::new(),
            code: 0,
        });
        assert_eq!(v["stdout"], "10.1.1.1 dev a0\n", "{v}");
        // A malformed request is refused with the reason, never passed on.
        let v = exchange(b"route get\n", |_| panic!("not a request"));
        assert_eq!(v["code"], 1, "{v}");
        assert!(
            v["stderr"].as_str().unwrap().contains("a JSON array"),
            "{v}"
        );
    }
}
