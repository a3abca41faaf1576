//! `fibre daemon --forward`: the forwarding workers beside the mirror. The mirror's
//! thread publishes the neighbour table to them whenever an entry changes, and, when the
//! workers use AF_XDP, this host's destinations to the links' XDP programs (so that
//! what is for the kernel reaches it); the workers read the FIB's snapshots as the
//! mirror publishes them; their counters are shown by `fibre ctl stats` and in the
//! metrics. A worker that fails is started again, logged and counted
//! ([`Forwarding::supervise`]); a forwarded link deleted and made again has the workers
//! started again on it ([`Forwarding::publish`]).

use crate::metrics::{label, Exposition, Kind, Labels};
use fibre_conntrack::{Conntrack, Settings};
use fibre_dataplane::capture::fate_name;
use fibre_dataplane::icmp::{Hops, Limits};
use fibre_dataplane::runtime;
use fibre_dataplane::worker::{Counters, NeighbourMacs, Resolve, Shared};
use fibre_dataplane::workers::IoMode;
use fibre_dataplane::workers::{Failure, Notify, Options, Workers};
use fibre_dataplane::Generation;
use fibre_dataplane::LocalDestinations;
use fibre_fib::FibReader;
use fibre_mirror::netlink::Resolver;
use fibre_mirror::Mirror;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The links up, and each link's addresses.
type LinksUp = (Vec<u32>, Vec<(u32, std::net::IpAddr)>);

/// The workers and what they share.
pub struct Forwarding {
    shared: Arc<Shared>,
    /// The workers; `None` while none of the links is there.
    workers: Option<Workers>,
    /// The links asked for, by name.
    links: Vec<String>,
    options: Options,
    /// The neighbour table's version last published.
    published: Option<u64>,
    /// How the workers read and send.
    io: String,
    /// Why AF_XDP is not used, if it was to be used where it could.
    fallback: Option<String>,
    /// This host's destinations, for the XDP programs (AF_XDP only).
    local: Option<LocalDestinations>,
    /// The serial of the snapshot whose routes `local` holds: a batch that left the
    /// routes as they were (a neighbour's state changing, as they do every few seconds)
    /// walks no routes.
    local_serial: Option<(u64, u8)>,
    /// Called when a worker ends unasked.
    notify: Option<Notify>,
    /// Workers that failed, and their reasons (the last 16), kept across restarts.
    failures: Vec<Failure>,
    /// Failures in all.
    failed: u64,
    /// Times the workers were started again because a forwarded link went or came.
    relinked: u64,
    /// The families the kernel forwards itself from each forwarded link, by name
    /// ([`kernel_forwarding`]).
    kernel: Vec<(String, u8)>,
    /// The links up and their addresses masqueraded connections were last held to.
    masquerade_links: Option<LinksUp>,
    /// What the kernel's connections gave when forwarding started.
    takeover: Takeover,
}

/// The connections the kernel tracked when fibre took over, entered into fibre's table
/// ([`fibre_firewall::connections`]).
#[derive(Debug, Default)]
struct Takeover {
    /// Connections entered.
    imported: u64,
    /// Connections left out, by why.
    left: std::collections::BTreeMap<&'static str, u64>,
    /// Messages that could not be read.
    malformed: u64,
    /// Translated connections whose frames to this host were claimed from its stack.
    claimed: u64,
    /// Why none could be read, if none could.
    unavailable: Option<String>,
}

/// Prefixes covering every destination of the families `families` holds (bit 0 IPv4,
/// bit 1 IPv6), as keys of the XDP programs' map, where IPv4 is v4-mapped: IPv4 is
/// `0.0.0.0/0`; IPv6 is every prefix beside `::ffff:0:0/96` on its way from the root,
/// which cover all of IPv6 but the v4-mapped block.
fn everything(families: u8) -> Vec<(std::net::IpAddr, u8)> {
    let mut out = Vec::new();
    if families & 1 != 0 {
        out.push((std::net::Ipv4Addr::UNSPECIFIED.into(), 0));
    }
    if families & 2 != 0 {
        let mapped = u128::from(std::net::Ipv6Addr::from([0, 0, 0, 0, 0, 0xffff, 0, 0]));
        for len in 1..=96u32 {
            // The sibling, at this length, of the v4-mapped block's ancestor.
            let ancestor = mapped & (u128::MAX << (128 - len));
            let sibling = ancestor ^ (1u128 << (128 - len));
            out.push((std::net::Ipv6Addr::from(sibling).into(), len as u8));
        }
    }
    out
}

/// The families the kernel forwards itself from each of the links `names` (bit 0 IPv4,
/// bit 1 IPv6), as the namespace's sysctls say: IPv4 by the input link's
/// `net.ipv4.conf.LINK.forwarding`, IPv6 by `net.ipv6.conf.all.forwarding` or the
/// link's `force_forwarding` (where the kernel has it). The daemon reads them each
/// second (the kernel's netconf notifications would say it sooner; not followed yet).
pub fn kernel_forwarding(names: &[String]) -> Vec<(String, u8)> {
    let on = |path: String| {
        std::fs::read_to_string(path).is_ok_and(|v| v.trim().parse::<u32>().is_ok_and(|v| v > 0))
    };
    let all6 = on("/proc/sys/net/ipv6/conf/all/forwarding".into());
    names
        .iter()
        .map(|n| {
            let v4 = on(format!("/proc/sys/net/ipv4/conf/{n}/forwarding"));
            let v6 = all6 || on(format!("/proc/sys/net/ipv6/conf/{n}/force_forwarding"));
            (n.clone(), u8::from(v4) | u8::from(v6) << 1)
        })
        .collect()
}

impl Forwarding {
    /// Starts workers forwarding between the links named `names`, as `options` say,
    /// refusing what `closed` holds (what the router's firewall closes to fibre, as
    /// [`Shared::closed`] reads it);
    /// `notify` is called from a worker's thread if it ends unasked (the daemon then
    /// calls [`Forwarding::supervise`]).
    pub fn start(
        mirror: &Mirror,
        fib: FibReader,
        names: &[String],
        options: Options,
        closed: u8,
        notify: Option<Notify>,
    ) -> Result<Forwarding, String> {
        let links = Forwarding::present(mirror, names);
        if let Some(name) = names.iter().find(|n| !links.iter().any(|(m, _)| m == *n)) {
            return Err(format!("--forward {name}: no such link"));
        }
        let mut options = options;
        let chosen = Forwarding::choose(mirror, &links, &mut options);
        // The namespace's settings: the daemon entered it before any thread started.
        let shared = Arc::new(Shared::new(fib, Limits::read(), Hops::read()));
        follow_conntrack_settings(&shared)?;
        let mut takeover = take_over_connections(&shared);
        // No express path yet: nothing to retire.
        let _ = shared.close(closed);
        let mut forwarding = Forwarding {
            shared,
            workers: None,
            links: names.to_vec(),
            options,
            published: None,
            io: String::new(),
            fallback: None,
            local: None,
            local_serial: None,
            notify,
            failures: Vec::new(),
            failed: 0,
            relinked: 0,
            kernel: kernel_forwarding(names),
            masquerade_links: None,
            takeover: Takeover::default(),
        };
        forwarding.publish_kernel_forwarding(mirror);
        forwarding.publish_neighbours(mirror, true);
        // This host's destinations go in before any program is attached, so that none of
        // the kernel's frames reaches a worker.
        let mut local_error = None;
        if forwarding.options.mode != IoMode::Packet || forwarding.options.express {
            match LocalDestinations::new() {
                Ok(l) => forwarding.local = Some(l),
                Err(e) if forwarding.options.mode == IoMode::Xdp => {
                    return Err(format!("--io xdp: {e}"))
                }
                Err(e) if chosen.is_some() => {
                    forwarding.options.express = false;
                    local_error = Some(format!("no express path: BPF maps: {e}"));
                }
                Err(e) => local_error = Some(format!("BPF maps: {e}")),
            }
            if forwarding.local.is_some() {
                forwarding.publish_local(mirror)?;
            }
        }
        let indexes: Vec<u32> = links.iter().map(|(_, i)| *i).collect();
        let started = forwarding.start_workers(&indexes);
        let started = match started {
            // The express path was chosen, not asked for: without it (a kernel without
            // tcx), the workers alone.
            Err(e) if chosen.is_some() && forwarding.options.express => {
                forwarding.options.express = false;
                forwarding.local = None;
                local_error = Some(format!("no express path: {e}"));
                forwarding.start_workers(&indexes)
            }
            started => started,
        };
        started.map_err(|e| format!("--forward: {e}"))?;
        takeover.claimed = forwarding.claim_imported();
        forwarding.takeover = takeover;
        forwarding.publish_generation(mirror);
        forwarding.fallback = match (chosen, local_error) {
            (Some(c), Some(e)) => Some(format!("{c}; {e}")),
            (c, e) => c.or(e).or(forwarding.fallback.take()),
        };
        Ok(forwarding)
    }

    /// Claims from this host's stack the frames to it of the translated connections
    /// taken over (as a worker claims a connection's it translates, once confirmed):
    /// how many were claimed.
    fn claim_imported(&self) -> u64 {
        use fibre_conntrack::nat::{DST_NAT, SRC_NAT};
        let claims = self
            .shared
            .claims
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let Some(claims) = claims else { return 0 };
        let snap = self.shared.fib.snapshot();
        let mut claimed = 0;
        self.with_conntrack(|tables, now| {
            for (c, _) in tables.iter().flat_map(|t| t.connections(now)) {
                for (bit, dir) in [(SRC_NAT, 1), (DST_NAT, 0)] {
                    let tuple = &c.tuples[dir];
                    let local = c.status & bit != 0
                        && snap
                            .route(&fibre_fib::Query::to(tuple.destination()))
                            .is_ok_and(|a| a.kind == fibre_fib::RouteType::Local);
                    if local && claims.claim(tuple).is_ok() {
                        claimed += 1;
                    }
                }
            }
        });
        claimed
    }

    /// Resolves `--io auto` where AF_XDP is known to lose: on veth links AF_XDP has no
    /// zero-copy mode, the kernel copies each frame twice and allocates it anew, which
    /// costs about the kernel's own forwarding a frame (docs/design.md, "What a frame
    /// costs on a veth"), while `AF_PACKET` with the express path costs well under half
    /// of it. With `--express`, `auto` is `AF_PACKET` too. Says why, when it chose.
    fn choose(mirror: &Mirror, links: &[(String, u32)], options: &mut Options) -> Option<String> {
        if options.mode != IoMode::Auto {
            return None;
        }
        if options.express {
            options.mode = IoMode::Packet;
            return Some("--express runs beside AF_PACKET rings".into());
        }
        let state = mirror.state();
        let veths: Vec<&str> = links
            .iter()
            .filter(|(_, index)| {
                state
                    .links()
                    .any(|l| l.index == *index && l.kind.name() == "veth")
            })
            .map(|(name, _)| name.as_str())
            .collect();
        if veths.is_empty() {
            return None;
        }
        options.mode = IoMode::Packet;
        options.express = true;
        Some(format!(
            "links {} are veths, where AF_XDP costs about the kernel's CPU a frame: \
             AF_PACKET with the express path",
            veths.join(", ")
        ))
    }

    /// The links of `names` the mirror holds now: each name and interface index.
    fn present(mirror: &Mirror, names: &[String]) -> Vec<(String, u32)> {
        names
            .iter()
            .filter_map(|name| {
                mirror
                    .state()
                    .links()
                    .find(|l| &l.name == name)
                    .map(|l| (name.clone(), l.index))
            })
            .collect()
    }

    /// Starts the workers on `links` (interface indexes).
    fn start_workers(&mut self, links: &[u32]) -> std::io::Result<()> {
        let resolver = Box::new(|| {
            let mut r = Resolver::new()?;
            Ok(Box::new(move |link, addr| r.resolve(link, addr)) as Resolve)
        });
        let workers = Workers::start(
            self.shared.clone(),
            links,
            &self.options,
            self.local.as_ref(),
            resolver,
            self.notify.clone(),
        )?;
        self.io = workers.io.clone();
        self.fallback = workers.fallback.clone();
        if self.io == "AF_PACKET" && !self.options.express {
            self.local = None;
        }
        self.workers = Some(workers);
        Ok(())
    }

    /// Starts worker `n` of `generation` again, which said it ended; its failure, for
    /// the daemon to log (`None` if it was stopped, not failed).
    pub fn supervise(&mut self, generation: u64, n: usize) -> Option<Failure> {
        let f = self.workers.as_mut()?.restart(generation, n)?;
        self.failed += 1;
        if self.failures.len() == 16 {
            self.failures.remove(0);
        }
        self.failures.push(f.clone());
        Some(f)
    }

    /// Has worker `n` fail at its next round (a panic), to test what follows; false if
    /// there is no such worker.
    pub fn fail_worker(&self, n: usize) -> bool {
        if self.workers.as_ref().is_none_or(|w| n >= w.len()) {
            return false;
        }
        self.shared.fail.store(n, Ordering::Relaxed);
        true
    }

    /// How the workers read and send, and why not AF_XDP if it could not be.
    pub fn io(&self) -> (&str, Option<&str>) {
        (&self.io, self.fallback.as_deref())
    }

    /// The priority the workers run at.
    pub fn priority(&self) -> &str {
        self.workers.as_ref().map_or("", |w| w.priority.as_str())
    }

    /// What the operator should know of how the workers read and send, if anything.
    pub fn caution(&self) -> Option<&str> {
        self.workers.as_ref().and_then(|w| w.caution.as_deref())
    }

    /// Where the workers run: `as asked`, or which could not be placed and why.
    pub fn placement(&self) -> &str {
        self.workers.as_ref().map_or("", |w| w.placement.as_str())
    }

    /// The workers running.
    pub fn workers(&self) -> usize {
        self.workers.as_ref().map_or(0, Workers::len)
    }

    /// Gives the XDP programs this host's destinations as the mirror holds them now:
    /// the prefix of every local, broadcast, anycast and multicast route of any table;
    /// and every destination of a family the firewall closes while the kernel forwards
    /// it ([`Forwarding::handed`]), so that the programs pass those frames to the
    /// kernel, which forwards them with its firewall.
    pub fn publish_local(&mut self, mirror: &Mirror) -> Result<(), String> {
        let handed = self.handed();
        let Some(local) = &mut self.local else {
            return Ok(());
        };
        let serial = (mirror.snapshot().serial(), handed);
        if self.local_serial == Some(serial) {
            return Ok(());
        }
        // Kept by the state as routes change: no walk of them.
        let prefixes: Vec<_> = mirror
            .state()
            .receiving_destinations()
            .map(|dst| (dst.addr(), dst.len()))
            .chain(everything(handed))
            .collect();
        local
            .set(prefixes)
            .map_err(|e| format!("the XDP programs' local destinations: {e}"))?;
        self.local_serial = Some(serial);
        Ok(())
    }

    /// Publishes what changed in the mirror to the workers (and their programs). A
    /// forwarded link gone, or come (again: a link made anew is another link), has the
    /// workers started again on the links there are now.
    pub fn publish(&mut self, mirror: &Mirror, force: bool) {
        self.publish_neighbours(mirror, force);
        self.end_masqueraded(mirror);
        if let Err(e) = self.publish_local(mirror) {
            tracing::warn!("{e}");
        }
        self.publish_generation(mirror);
        let now: Vec<u32> = Forwarding::present(mirror, &self.links)
            .into_iter()
            .map(|(_, i)| i)
            .collect();
        let running = self.workers.as_ref().map_or(&[][..], Workers::links);
        if now == running {
            return;
        }
        self.publish_kernel_forwarding(mirror);
        if let Some(w) = self.workers.take() {
            w.stop();
        }
        self.relinked += 1;
        if now.is_empty() {
            tracing::warn!("none of the forwarded links is there: forwarding waits for them");
            return;
        }
        let names: Vec<String> = Forwarding::present(mirror, &self.links)
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        match self.start_workers(&now) {
            Ok(()) => {
                self.publish_generation(mirror);
                tracing::info!(
                    "forwarded links changed: forwarding again between {} ({})",
                    names.join(", "),
                    self.io
                )
            }
            Err(e) => tracing::error!(
                "forwarded links changed, and the workers could not start again: {e}"
            ),
        }
    }

    /// Publishes the mirror's usable neighbour entries if they changed (or `force`).
    pub fn publish_neighbours(&mut self, mirror: &Mirror, force: bool) {
        let version = mirror.neighbours().version();
        if !force && self.published == Some(version) {
            return;
        }
        self.published = Some(version);
        let table: NeighbourMacs = mirror
            .neighbours()
            .iter()
            .filter(|n| n.state.usable())
            .filter_map(|n| {
                let mac: [u8; 6] = n.lladdr.as_deref()?.try_into().ok()?;
                Some(((n.link, n.dst), mac))
            })
            .collect();
        self.shared.neighbours.publish(table);
    }

    /// The families handed to the kernel whole (bit 0 IPv4, bit 1 IPv6): those the
    /// firewall closes to fibre while the kernel forwards them from a forwarded link.
    fn handed(&self) -> u8 {
        let kernel = self.kernel.iter().fold(0, |f, (_, k)| f | k);
        self.shared.closed() & kernel & 3
    }

    /// Takes what the kernel forwards itself now ([`kernel_forwarding`]); whether it
    /// changed.
    pub fn kernel_forwards(&mut self, now: Vec<(String, u8)>, mirror: &Mirror) -> bool {
        if now == self.kernel {
            return false;
        }
        self.kernel = now;
        self.publish_kernel_forwarding(mirror);
        true
    }

    /// What the kernel forwards itself, in words, if it forwards anything.
    pub fn kernel_forwarding_said(&self) -> Option<String> {
        let with = |bit: u8| -> Vec<&str> {
            self.kernel
                .iter()
                .filter(|(_, f)| f & bit != 0)
                .map(|(n, _)| n.as_str())
                .collect()
        };
        let (v4, v6) = (with(1), with(2));
        if v4.is_empty() && v6.is_empty() {
            return None;
        }
        let mut parts = Vec::new();
        if !v4.is_empty() {
            parts.push(format!("IPv4 from {}", v4.join(", ")));
        }
        if !v6.is_empty() {
            parts.push(format!("IPv6 from {}", v6.join(", ")));
        }
        Some(format!(
            "the kernel's forwarding is on for {}: the kernel forwards those frames itself, \
             with its firewall, and fibre sends none of what the kernel also receives (it \
             forwards what reaches only it, and teaches the express path)",
            parts.join(" and ")
        ))
    }

    /// Gives the workers what the kernel forwards itself, by the links' indexes now.
    fn publish_kernel_forwarding(&self, mirror: &Mirror) {
        let by_link = Forwarding::present(mirror, &self.links)
            .into_iter()
            .filter_map(|(name, index)| {
                self.kernel
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, f)| (index, *f))
            })
            .collect();
        self.shared.set_kernel_forwards(by_link);
    }

    /// What the workers share: the firewall closes families to them through it
    /// ([`Shared::close`]).
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Gives the express path the current generation again (which stays retired while
    /// the firewall closes a family).
    pub fn reopen(&self, mirror: &Mirror) {
        self.publish_generation(mirror);
    }

    /// Tells the express path which snapshot and neighbour table are current: the
    /// entries the workers wrote under others count no more. While the firewall closes
    /// a family, one no entry has ([`Shared::publish_generation`]).
    fn publish_generation(&self, mirror: &Mirror) {
        let g = Generation {
            snapshot: mirror.snapshot().serial(),
            neighbours: self.shared.neighbours.serial(),
        };
        if let Err(e) = self.shared.publish_generation(g) {
            tracing::warn!("the express path's generation: {e}");
        }
    }

    /// What the workers counted so far.
    pub fn counters(&self) -> Counters {
        self.shared.counters().clone()
    }

    /// Stops the workers and waits for them.
    pub fn stop(self) {
        if let Some(w) = self.workers {
            w.stop();
        }
    }

    /// The connections tracked, every worker's table held for `f` (the tables' clock's
    /// time given too).
    pub fn with_conntrack<T>(&self, f: impl FnOnce(&[&Conntrack], u64) -> T) -> T {
        let now = self.shared.icmp_overall.now();
        self.shared.with_tables(|all| {
            let tables: Vec<&Conntrack> = all.iter().map(|t| &**t).collect();
            f(&tables, now)
        })
    }

    /// Ends the masqueraded connections whose link went down or lost the address they
    /// took, as the kernel's masquerade does when told, on each new state of the links.
    fn end_masqueraded(&mut self, mirror: &Mirror) {
        let state = mirror.state();
        let up: Vec<u32> = state.links().filter(|l| l.up).map(|l| l.index).collect();
        let addresses: Vec<(u32, std::net::IpAddr)> = state
            .addresses()
            .iter()
            .map(|a| (a.link, a.local))
            .collect();
        // Only when the links or their addresses changed (not on every route's).
        let now = (up, addresses);
        if self.masquerade_links.as_ref() == Some(&now) {
            return;
        }
        let (up, addresses) = self.masquerade_links.insert(now).clone();
        self.shared.with_tables(|all| {
            let mut released = Vec::new();
            for table in all.iter_mut() {
                if table.end_masqueraded(|link, address| {
                    up.contains(&link) && addresses.contains(&(link, address))
                }) != 0
                {
                    // Their frames go back to the kernel now, under the tables' locks (as a
                    // worker gives back what ended, before it claims anything).
                    table.drain_released(&mut released);
                }
            }
            self.release_claims(&released);
        });
    }

    /// Gives the kernel's stack back the replies of translated connections that ended.
    fn release_claims(&self, released: &[fibre_conntrack::Tuple]) {
        if released.is_empty() {
            return;
        }
        if let Some(claims) = &*self
            .shared
            .claims
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
        {
            for tuple in released {
                claims.release(tuple);
            }
        }
    }

    /// The forwarding part of `fibre ctl stats`.
    pub fn stats(&self) -> Value {
        let c = self.counters();
        let mhz = runtime::cpu_mhz();
        let stages: Vec<Value> = c
            .stages
            .iter()
            .map(|(name, s)| {
                json!({
                    "stage": name,
                    "calls": s.calls,
                    "packets": s.packets,
                    "per_call": s.per_call(),
                    "ns_per_packet": s.ns_per_packet(),
                    "cycles_per_packet": mhz.map(|m| s.cycles_per_packet(m)),
                })
            })
            .collect();
        let mut stats = json!({
            "links": self.links,
            "workers": self.workers(),
            "priority": self.priority(),
            "placement": self.placement(),
            "caution": self.caution(),
            "worker_failures": self.failed,
            "failures": self.failures.iter().map(|f| json!({
                "worker": f.worker,
                "reason": f.reason,
                "restarted": f.restarted,
                "restart_seconds": f.took.as_secs_f64(),
            })).collect::<Vec<_>>(),
            "restarts_for_links": self.relinked,
            "io": self.io,
            "io_fallback": self.fallback,
            "local_destinations": self.local.as_ref().map(|l| l.len()),
            "kernel_unreached": c.kernel_unreached,
            "firewall_refused": c.firewall_refused,
            "left_to_kernel": c.left_to_kernel,
            "kernel_forwards": self.kernel.iter().map(|(n, f)| json!({
                "link": n, "ipv4": f & 1 != 0, "ipv6": f & 2 != 0,
            })).collect::<Vec<_>>(),
            "bad_descriptors": c.bad_descriptors,
            "refused_offloads": c.refused_offloads,
            "checksums_finished": c.checksums_finished,
            "segmented": c.segmented,
            "segment_failed": c.segment_failed,
            "xsk": {
                "rx_dropped": c.xsk.rx_dropped,
                "rx_ring_full": c.xsk.rx_ring_full,
                "fill_ring_empty": c.xsk.fill_ring_empty,
                "invalid_descriptors": c.xsk.invalid_descriptors,
            },
            "received": c.received,
            "sent": c.sent,
            "send_failed": c.send_failed,
            "fragments_made": c.fragments_made,
            "resolve_requests": c.resolve_requests,
            "unresolved_dropped": c.unresolved_dropped,
            "truncated": c.truncated,
            "ring_dropped": c.ring_dropped,
            "express": self.workers.as_ref().and_then(Workers::express).map(|x| json!({
                "links": x.links(),
                "taught": c.express_taught,
                "failed": c.express_failed,
            })),
            "claims": {
                "claimed": c.claimed,
                "failed": c.claims_failed,
                "unavailable": self.workers.as_ref().and_then(|w| w.claims_unavailable.clone()),
            },
            "fates": fates(&c),
            "icmp_unanswered": {
                "not_answered": c.unanswered.not_answered,
                "rate_limited": c.unanswered.rate_limited,
                "no_route_back": c.unanswered.no_route_back,
                "unresolved": c.unanswered.unresolved,
                "dropped_by_nat": c.unanswered.dropped_by_nat,
            },
            "stages": stages,
            "conntrack": self.with_conntrack(|t, _| crate::conntrack::stats(t)),
            "takeover": {
                "imported": self.takeover.imported,
                "left": self.takeover.left,
                "malformed": self.takeover.malformed,
                "claimed": self.takeover.claimed,
                "unavailable": self.takeover.unavailable,
            },
        });
        // (Apart: one more key overflows the macro's recursion.)
        stats["verdicts_kept"] = json!(c.verdicts_kept);
        stats["handed_off"] = json!(c.handed_off);
        stats["handoff_dropped"] = json!(c.handoff_dropped);
        stats
    }

    /// The stage table, as `show runtime` prints it.
    pub fn runtime_table(&self) -> String {
        runtime::table(&self.counters().stages, runtime::cpu_mhz())
    }

    /// The forwarding metrics, added to `e`.
    pub fn metrics(&self, e: &mut Exposition) {
        self.with_conntrack(|t, _| crate::conntrack::metrics(t, e));
        let c = self.counters();
        let mut metric = |name: &str, kind: &str, help: &str, samples: Vec<(Labels, f64)>| {
            let kind = if kind == "counter" {
                Kind::Counter
            } else {
                Kind::Gauge
            };
            e.add(name, kind, help, samples);
        };
        let by_stage = |f: &dyn Fn(&runtime::StageCounters) -> f64| {
            c.stages
                .iter()
                .map(|(n, s)| (label("stage", n), f(s)))
                .collect::<Vec<_>>()
        };
        metric(
            "fibre_stage_calls_total",
            "counter",
            "Vectors each stage ran on.",
            by_stage(&|s| s.calls as f64),
        );
        metric(
            "fibre_stage_packets_total",
            "counter",
            "Packets each stage ran on.",
            by_stage(&|s| s.packets as f64),
        );
        metric(
            "fibre_stage_seconds_total",
            "counter",
            "Time spent in each stage.",
            by_stage(&|s| s.time.as_secs_f64()),
        );
        metric(
            "fibre_packets_total",
            "counter",
            "Packets by fate: sent, answered with an ICMP error, to the kernel, dropped (with the reason).",
            fates(&c)
                .into_iter()
                .map(|(f, n)| (label("fate", f), n as f64))
                .collect(),
        );
        for (name, help, v) in [
            (
                "fibre_frames_received_total",
                "Frames read from the forwarded links.",
                c.received,
            ),
            ("fibre_frames_sent_total", "Frames sent.", c.sent),
            (
                "fibre_fragments_made_total",
                "Fragments made of IPv4 packets over the MTU without DF.",
                c.fragments_made,
            ),
            (
                "fibre_verdicts_kept_total",
                "Tracked packets whose chains' verdict was kept on their connection.",
                c.verdicts_kept,
            ),
            (
                "fibre_frames_send_failed_total",
                "Frames an output link had no room for, dropped.",
                c.send_failed,
            ),
            (
                "fibre_neighbour_resolve_requests_total",
                "Next hops without a MAC address asked of the kernel.",
                c.resolve_requests,
            ),
            (
                "fibre_frames_truncated_total",
                "Frames longer than a buffer (merged by receive offload), dropped.",
                c.truncated,
            ),
            (
                "fibre_worker_failures_total",
                "Forwarding workers that failed (each started again).",
                self.failed,
            ),
            (
                "fibre_checksums_finished_total",
                "Checksums their senders left partial, finished before sending by AF_XDP.",
                c.checksums_finished,
            ),
            (
                "fibre_packets_segmented_total",
                "Packets their senders left whole (GSO), cut into segments before sending by AF_XDP.",
                c.segmented,
            ),
            (
                "fibre_segment_failed_total",
                "Packets left whole by their senders that could not be cut, dropped.",
                c.segment_failed,
            ),
            (
                "fibre_refused_offloads_total",
                "Frames whose virtio-net header asked for a segmentation fibre does not make, dropped.",
                c.refused_offloads,
            ),
            (
                "fibre_ring_dropped_total",
                "Frames the AF_PACKET receive rings had no free block for, dropped.",
                c.ring_dropped,
            ),
            (
                "fibre_unresolved_dropped_total",
                "Packets that waited for their next hop's MAC address in vain, dropped.",
                c.unresolved_dropped,
            ),
            (
                "fibre_left_to_kernel_total",
                "Frames the kernel forwards itself (its forwarding on), left to it.",
                c.left_to_kernel,
            ),
            (
                "fibre_handed_off_total",
                "Packets a worker handed to the worker that owns their connection.",
                c.handed_off,
            ),
            (
                "fibre_handoff_dropped_total",
                "Packets handed over that the worker they went to had no room for, dropped.",
                c.handoff_dropped,
            ),
            (
                "fibre_firewall_refused_total",
                "Packets of a family the router's firewall closes to fibre, dropped rather than sent.",
                c.firewall_refused,
            ),
        ] {
            e.one(name, Kind::Counter, help, v as f64);
        }
    }
}

/// Packets by fate name.
fn fates(c: &Counters) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (f, n) in &c.fates {
        *out.entry(fate_name(f)).or_default() += n;
    }
    out
}

/// Enters into fibre's table the connections the kernel of the namespace tracks, with
/// their NAT bindings, so that they go on through fibre as they went through the
/// kernel (up to the table's limit). A connection masqueraded (its source translated to
/// the address masquerade would give it out of the link toward its destination) is
/// held to that link, as one fibre masqueraded.
fn take_over_connections(shared: &Arc<Shared>) -> Takeover {
    let now = shared.icmp_overall.now();
    let dump = match fibre_firewall::connections::dump(now) {
        Ok(d) => d,
        Err(e) => {
            return Takeover {
                unavailable: Some(format!("ctnetlink: {e}")),
                ..Takeover::default()
            }
        }
    };
    let mut takeover = Takeover {
        malformed: dump.malformed,
        unavailable: dump.unavailable,
        ..Takeover::default()
    };
    for why in dump.left {
        *takeover.left.entry(why.name()).or_default() += 1;
    }
    let snap = shared.fib.snapshot();
    // Each to its owner's table (a translated one's reply forwarded to it from the
    // table that tuple hashes to, as `with_tables` tells them).
    shared.with_tables(|tables| {
        // `nf_conntrack_max` 0: no limit.
        let room = tables[0].settings().max as usize;
        for mut c in dump.connections {
            if room != 0 && tables[0].census() >= room {
                *takeover.left.entry("table-full").or_default() += 1;
                continue;
            }
            if c.status & fibre_conntrack::nat::SRC_NAT != 0 {
                let dst = c.tuples[0].destination();
                if let Ok(a) = snap.route(&fibre_fib::Query::to(dst)) {
                    let toward = a.gateway.unwrap_or(dst);
                    if snap.masquerade_source(a.dev, toward) == Some(c.tuples[1].destination()) {
                        c.masquerade = a.dev;
                    }
                }
            }
            let owner = usize::from(tables[0].owners().of_connection(&c));
            tables[owner].import(c, now);
            takeover.imported += 1;
        }
    });
    takeover
}

/// Has the connection table follow the namespace's conntrack sysctls: read now (an
/// error if they cannot be), then each second while the workers' state lives (the
/// kernel announces no change of a sysctl).
fn follow_conntrack_settings(shared: &Arc<Shared>) -> Result<(), String> {
    let read = || Settings::read().map_err(|e| format!("the conntrack settings: {e}"));
    let first = read()?;
    shared.set_settings(&first);
    let weak = Arc::downgrade(shared);
    std::thread::spawn(move || {
        let mut last = first;
        loop {
            std::thread::sleep(std::time::Duration::from_secs(1));
            let Some(shared) = weak.upgrade() else { return };
            match read() {
                Ok(now) if now != last => {
                    shared.set_settings(&now);
                    last = now;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("{e}; the last read kept"),
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use std::net::{IpAddr, Ipv6Addr};

    /// Whether `prefixes` (as the XDP programs' map keys them: IPv4 v4-mapped) hold
    /// `addr`.
    fn covered(prefixes: &[(IpAddr, u8)], addr: Ipv6Addr) -> bool {
        prefixes.iter().any(|&(p, len)| {
            let (p, len) = match p {
                IpAddr::V4(v4) => (u128::from(v4.to_ipv6_mapped()), u32::from(len) + 96),
                IpAddr::V6(v6) => (u128::from(v6), u32::from(len)),
            };
            let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
            (u128::from(addr) & mask) == p & mask
        })
    }

    #[test]
    fn everything_of_a_family_is_every_address_of_it_and_none_of_the_other() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(9);
        let (v4, v6, both) = (everything(1), everything(2), everything(3));
        assert_eq!((v4.len(), v6.len(), both.len()), (1, 96, 97));
        for k in 0..20_000 {
            let mapped = std::net::Ipv4Addr::from(rng.gen::<u32>()).to_ipv6_mapped();
            // Random IPv6 addresses, and some near the v4-mapped block.
            let other = if k % 2 == 0 {
                Ipv6Addr::from(rng.gen::<u128>())
            } else {
                Ipv6Addr::from(u128::from(mapped) ^ (1u128 << rng.gen_range(32..128)))
            };
            assert!(covered(&v4, mapped) && !covered(&v6, mapped), "{mapped}");
            assert!(covered(&v6, other) && !covered(&v4, other), "{other}");
            assert!(covered(&both, mapped) && covered(&both, other));
        }
        assert!(everything(0).is_empty());
    }
}
