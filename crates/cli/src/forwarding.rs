//! `fibre daemon --forward`: the forwarding workers beside the mirror. The mirror's
//! thread publishes the neighbour table to them whenever an entry changes; they read the
//! FIB's snapshots as the mirror publishes them; their counters are shown by `fibre ctl
//! stats` and in the metrics.

use fibre_dataplane::capture::fate_name;
use fibre_dataplane::runtime;
use fibre_dataplane::worker::{self, Counters, NeighbourMacs, Resolve, Shared};
use fibre_fib::FibReader;
use fibre_mirror::kernel::Resolver;
use fibre_mirror::Mirror;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The workers and what they share.
pub struct Forwarding {
    shared: Arc<Shared>,
    handles: Vec<std::thread::JoinHandle<()>>,
    links: Vec<String>,
    workers: usize,
    /// The neighbour table's version last published.
    published: Option<u64>,
}

impl Forwarding {
    /// Starts `workers` workers forwarding between the links named `names`.
    pub fn start(
        mirror: &Mirror,
        fib: FibReader,
        names: &[String],
        workers: usize,
    ) -> Result<Forwarding, String> {
        let mut links = Vec::new();
        for name in names {
            let link = mirror
                .state()
                .links()
                .find(|l| &l.name == name)
                .ok_or_else(|| format!("--forward {name}: no such link"))?;
            links.push(link.index);
        }
        let shared = Arc::new(Shared {
            fib,
            neighbours: Default::default(),
            counters: Default::default(),
            stop: Default::default(),
        });
        let mut forwarding = Forwarding {
            shared: shared.clone(),
            handles: Vec::new(),
            links: names.to_vec(),
            workers: workers.max(1),
            published: None,
        };
        forwarding.publish_neighbours(mirror, true);
        forwarding.handles = worker::start(shared, &links, workers, || {
            let mut r = Resolver::new()?;
            Ok(Box::new(move |link, addr| r.resolve(link, addr)) as Resolve)
        })
        .map_err(|e| format!("--forward: {e}"))?;
        Ok(forwarding)
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

    /// What the workers counted so far.
    pub fn counters(&self) -> Counters {
        self.shared
            .counters
            .lock()
            .map(|c| c.clone())
            .unwrap_or_default()
    }

    /// Stops the workers and waits for them.
    pub fn stop(self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        for h in self.handles {
            let _ = h.join();
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
        json!({
            "links": self.links,
            "workers": self.workers,
            "received": c.received,
            "sent": c.sent,
            "send_failed": c.send_failed,
            "resolve_requests": c.resolve_requests,
            "unresolved_dropped": c.unresolved_dropped,
            "truncated": c.truncated,
            "fates": fates(&c),
            "icmp_unanswered": {
                "not_answered": c.unanswered.not_answered,
                "rate_limited": c.unanswered.rate_limited,
                "no_route_back": c.unanswered.no_route_back,
                "unresolved": c.unanswered.unresolved,
            },
            "stages": stages,
        })
    }

    /// The stage table, as `show runtime` prints it.
    pub fn runtime_table(&self) -> String {
        runtime::table(&self.counters().stages, runtime::cpu_mhz())
    }

    /// The forwarding metrics, in Prometheus' text exposition format.
    pub fn metrics(&self, out: &mut String) {
        use std::fmt::Write as _;
        let c = self.counters();
        let mut metric = |name: &str, kind: &str, help: &str, samples: Vec<(String, f64)>| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, v) in samples {
                let _ = writeln!(out, "{name}{labels} {v}");
            }
        };
        let by_stage = |f: &dyn Fn(&runtime::StageCounters) -> f64| {
            c.stages
                .iter()
                .map(|(n, s)| (format!("{{stage=\"{n}\"}}"), f(s)))
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
                .map(|(f, n)| (format!("{{fate=\"{f}\"}}"), n as f64))
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
                "fibre_unresolved_dropped_total",
                "Packets that waited for their next hop's MAC address in vain, dropped.",
                c.unresolved_dropped,
            ),
        ] {
            metric(name, "counter", help, vec![(String::new(), v as f64)]);
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
