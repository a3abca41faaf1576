//! `fibre forward`: one link's capture through the packet path offline. The
//! configuration (`ip` command lines, `neigh add` lines among them) makes the router;
//! with `--ruleset`, the file `nft -f` takes is its firewall; the frames the capture
//! holds arrive on `--iif`; what the pipeline sends is written to a pcapng file, each
//! frame on an interface block named after the link it left by; and each stage's cost
//! and each fate's count are printed.
//!
//! The ruleset is read by `nft` itself, into a private network namespace holding links
//! of the configuration's names and indexes, and mirrored from there as the daemon
//! mirrors a router's: fibre has no second parser of nft's grammar. The namespace is
//! scratch, made for the reading and deleted after it, so that neither the ruleset nor
//! the links made for its names touch the machine's own; it is the test and bench
//! harness's [`Namespace`] (`fibre-testbed`), the one use of the harness outside tests
//! and `fibre bench`. Offline there is no kernel to hand anything to, so a ruleset
//! holding what fibre does not enforce is refused, naming each such part.

use fibre_dataplane::capture::{fate_name, read_capture, SentCapture};
use fibre_dataplane::icmp::{Hops, Limits, RateLimit};
use fibre_dataplane::neighbour::StaticNeighbours;
use fibre_dataplane::offline::{self, VECTOR};
use fibre_dataplane::pipeline::{Arrival, Pipeline};
use fibre_dataplane::runtime;
use fibre_fib::{config, State};
use fibre_firewall::Filter;
use fibre_testbed::netns::Namespace;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `fibre forward`.
#[derive(clap::Args)]
pub struct ForwardArgs {
    /// The router: a file of `ip` command lines (links, addresses, routes, rules,
    /// nexthops), with `neigh add ADDR lladdr MAC dev DEV` lines for the neighbours.
    #[arg(long)]
    config: PathBuf,
    /// The link the capture's frames arrive on. Without it, each frame arrives on the
    /// link its pcapng interface block names (a capture of several links, as
    /// `--out` writes one).
    #[arg(long)]
    iif: Option<String>,
    /// The capture in (pcap or pcapng, Ethernet).
    #[arg(long = "in")]
    input: PathBuf,
    /// The frames sent, as pcapng (an interface block per output link).
    #[arg(long = "out")]
    output: PathBuf,
    /// Packets in a vector (1 to 256).
    #[arg(long, default_value_t = VECTOR)]
    vector: usize,
    /// Workers, each with a connection table of its own, reading the vectors in turn
    /// and handing each packet to the worker that owns its connection, as the daemon's
    /// do (1 to 64).
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// The router's firewall: a file of nftables rules, as `nft -f` takes it (needs
    /// root: `nft` reads it into a private network namespace).
    #[arg(long)]
    ruleset: Option<PathBuf>,
    /// Print the counters as JSON.
    #[arg(long)]
    json: bool,
}

/// The filter rules of the nftables file `path` for the router `snap`, and the families
/// whose connections it has the kernel track; why not, if `nft` refuses the file or it
/// holds what fibre does not enforce.
pub fn load_ruleset(path: &Path, snap: &fibre_fib::Snapshot) -> Result<(Filter, u8), String> {
    use fibre_firewall::gate::{self, Legacy};
    let file = path.display().to_string();
    if let Some(why) = fibre_testbed::netns::unavailable_reason() {
        return Err(format!("--ruleset {file}: {why}"));
    }
    let ns = Namespace::create("ruleset").map_err(|e| format!("--ruleset {file}: {e}"))?;
    // Links of the configuration's names and indexes, for rules that name them (`meta
    // iif` takes the index the name has when the rule is loaded): veths, which every
    // kernel that runs fibre has, their peers far above any index the router uses.
    for l in snap.links().filter(|l| l.index != 1) {
        ns.ip(&[
            "link",
            "add",
            "name",
            &l.name,
            "index",
            &l.index.to_string(),
            "type",
            "veth",
            "peer",
            "name",
            &format!("fibre-p{}", l.index),
            "index",
            &(1_000_000 + l.index).to_string(),
        ])
        .map_err(|e| format!("--ruleset {file}: the link {}: {e}", l.name))?;
    }
    let absolute = std::fs::canonicalize(path).map_err(|e| format!("{file}: {e}"))?;
    ns.nft(&["-f", &absolute.display().to_string()], "")
        .map_err(|e| {
            // nft names the file, line and column itself.
            let text = e.to_string();
            let said = text.split_once(": ").map_or(text.as_str(), |(_, s)| s);
            format!("--ruleset: {said}")
        })?;
    let dump = std::thread::scope(|s| {
        s.spawn(|| {
            ns.enter()?;
            fibre_firewall::nfnetlink::dump()
        })
        .join()
        .map_err(|_| std::io::Error::other("the namespace's thread failed"))?
    })
    .map_err(|e| format!("--ruleset {file}: {e}"))?;
    let links: Vec<String> = snap.links().map(|l| l.name.clone()).collect();
    let refusals = gate::refusals(&dump.ruleset, &links, &Legacy::default());
    if !refusals.is_empty() {
        let mut why = format!(
            "--ruleset {file}: fibre does not enforce {} part(s) of it, and offline there is \
             no kernel to hand their packets to:",
            refusals.len()
        );
        for r in &refusals {
            why += &format!("\n  {}", r.describe());
        }
        return Err(why);
    }
    Ok((
        Filter::of(&dump.ruleset),
        gate::tracked(&dump.ruleset).bits(),
    ))
}

/// A router's configuration file: `ip` command lines, and `neigh add ADDR lladdr MAC dev
/// DEV` lines for its neighbours (read once the links exist). `None` after printing
/// `FILE:LINE: reason` for the first bad line.
pub fn load_router(path: &Path) -> Option<(State, StaticNeighbours)> {
    let file = path.display().to_string();
    let text = config::read(path).map_err(|e| eprintln!("{e}")).ok()?;
    let (rest, lines) = StaticNeighbours::split(&text);
    let mut state = State::new();
    if let Err(e) = config::apply_text(&mut state, &file, &rest) {
        eprintln!("{e}");
        return None;
    }
    let index = |name: &str| state.links().find(|l| l.name == name).map(|l| l.index);
    match StaticNeighbours::parse(&lines, index) {
        Ok(n) => Some((state, n)),
        Err((line, why)) => {
            eprintln!("{file}:{line}: {why}");
            None
        }
    }
}

/// Runs `fibre forward`.
pub fn run(a: ForwardArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let file = a.config.display().to_string();
    let Some((state, neighbours)) = load_router(&a.config) else {
        return Ok(ExitCode::FAILURE);
    };
    let snap = state.snapshot();
    let arrival_on = |name: &str| {
        snap.links().find(|l| l.name == name).map(|l| Arrival {
            link: l.index,
            mac: l.mac,
        })
    };
    let iif = match &a.iif {
        Some(name) => {
            Some(arrival_on(name).ok_or_else(|| format!("--iif {name}: no such link in {file}"))?)
        }
        None => None,
    };
    let input = a.input.display().to_string();
    let bytes = std::fs::read(&a.input).map_err(|e| format!("{input}: {e}"))?;
    let capture = read_capture(&bytes).map_err(|e| format!("{input}: {e}"))?;
    if let Some(why) = &capture.broken {
        eprintln!("{input}: cut short, the frames before kept: {why}");
    }
    // Without `--iif`, each interface block of the capture names the link its frames
    // arrived on.
    let arrivals: Vec<Result<Arrival, String>> = (capture.interfaces.iter().enumerate())
        .map(|(k, name)| match (iif, name) {
            (Some(a), _) => Ok(a),
            (None, Some(name)) => arrival_on(name).ok_or_else(|| {
                format!("{input}: interface {k} is named {name}, no link of {file} (or give --iif)")
            }),
            (None, None) => Err(format!(
                "{input}: interface {k} does not name the link its frames arrived on: give --iif"
            )),
        })
        .collect();
    for f in &capture.frames {
        arrivals[f.interface].clone()?;
    }

    if !(1..=64).contains(&a.workers) {
        return Err(format!("--workers {}: from 1 to 64", a.workers).into());
    }
    let ruleset = match &a.ruleset {
        Some(path) => Some(load_ruleset(path, &snap)?),
        None => None,
    };
    // The workers' tables, as the daemon's: one count of their connections, one
    // registry, one mailbox each.
    let census = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let registry = std::sync::Arc::new(std::sync::Mutex::new(fibre_conntrack::Registry::default()));
    let mailboxes = std::sync::Arc::new(
        (0..a.workers)
            .map(|_| fibre_dataplane::handoff::Mailbox::new())
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| format!("a worker's mailbox: {e}"))?,
    );
    // Errors limited as this machine's kernel limits them (one limit for all).
    let overall = std::sync::Arc::new(fibre_dataplane::icmp::Overall::new(
        Limits::read().per_second,
        Limits::read().burst,
    ));
    let mut pipelines: Vec<Pipeline> = (0..a.workers)
        .map(|me| {
            let mut pipeline = Pipeline::new();
            if let Some((filter, tracked)) = &ruleset {
                pipeline.rules = std::sync::Arc::new(filter.clone());
                // Tracked as a namespace of Linux's defaults tracks, by the capture's
                // clock.
                pipeline.tracked = *tracked;
                let mut table =
                    fibre_conntrack::Conntrack::new(fibre_conntrack::Settings::kernel_defaults());
                table.set_census(census.clone());
                table.set_registry(registry.clone());
                table.register(
                    u8::from(filter.translates(false)) | u8::from(filter.translates(true)) << 1,
                );
                table.set_owners(fibre_conntrack::Owners {
                    workers: a.workers as u16,
                    me: me as u16,
                    seed: offline::OWNERS_SEED,
                });
                pipeline.conntrack = Some(std::sync::Arc::new(std::sync::Mutex::new(table)));
                pipeline.mailboxes = Some(mailboxes.clone());
            }
            pipeline.limit = if a.workers == 1 {
                RateLimit::new(&Limits::read())
            } else {
                RateLimit::sharing(&Limits::read(), overall.clone())
            };
            pipeline.hops = Hops::read();
            pipeline
        })
        .collect();
    let (fates, sent) = offline::forward(
        &mut pipelines,
        &snap,
        &neighbours,
        // (Every frame's checked above.)
        |f| {
            arrivals[f.interface].clone().unwrap_or(Arrival {
                link: 0,
                mac: [0; 6],
            })
        },
        &capture.frames,
        a.vector,
    );
    let out =
        std::fs::File::create(&a.output).map_err(|e| format!("{}: {e}", a.output.display()))?;
    let mut writer = SentCapture::new(std::io::BufWriter::new(out))?;
    offline::write_sent(&snap, &capture.frames, &sent, &mut writer)?;
    writer.finish()?;

    let mut by_fate: BTreeMap<String, u64> = BTreeMap::new();
    for f in &fates {
        *by_fate.entry(fate_name(f)).or_default() += 1;
    }
    let mut by_link: BTreeMap<String, u64> = BTreeMap::new();
    for s in &sent {
        let name = snap.link(s.link).map_or("?", |l| l.name.as_str());
        *by_link.entry(name.to_string()).or_default() += 1;
    }
    // Packets a worker handed to another (counted by the one that read them).
    let handed_off: u64 = pipelines
        .iter()
        .flat_map(|p| p.fates.iter())
        .filter(|(f, _)| matches!(f, fibre_dataplane::pipeline::Fate::Handoff(_)))
        .map(|(_, n)| n)
        .sum();
    // What the workers counted, together.
    let (pipeline, others) = pipelines.split_first_mut().expect("one worker at least");
    for p in others {
        pipeline.add_counts(p);
    }
    let u = pipeline.unanswered;
    let mhz = runtime::cpu_mhz();
    if a.json {
        let stages: Vec<_> = pipeline
            .stages()
            .iter()
            .map(|(name, c)| {
                json!({
                    "stage": name,
                    "calls": c.calls,
                    "packets": c.packets,
                    "per_call": c.per_call(),
                    "ns_per_packet": c.ns_per_packet(),
                    "cycles_per_packet": mhz.map(|m| c.cycles_per_packet(m)),
                })
            })
            .collect();
        let report = json!({
            "frames": capture.frames.len(),
            "skipped": capture.skipped,
            "broken": capture.broken,
            "sent": sent.len(),
            "sent_by_link": by_link,
            "fragments_made": pipeline.fragments_made,
            "verdicts_kept": pipeline.verdicts_kept,
            "workers": a.workers,
            "handed_off": handed_off,
            "fates": by_fate,
            "unanswered": {
                "not_answered": u.not_answered,
                "rate_limited": u.rate_limited,
                "no_route_back": u.no_route_back,
                "unresolved": u.unresolved,
                "dropped_by_nat": u.dropped_by_nat,
            },
            "stages": stages,
        });
        println!("{report}");
    } else {
        println!(
            "{} frames in on {}, {} sent to {}",
            capture.frames.len(),
            a.iif.as_deref().unwrap_or("the links the capture names"),
            sent.len(),
            a.output.display()
        );
        if capture.skipped > 0 {
            println!("{} frames of other link types left out", capture.skipped);
        }
        for (link, n) in &by_link {
            println!("  out {link:<12} {n:>10}");
        }
        println!("fates:");
        for (name, n) in &by_fate {
            println!("  {name:<32} {n:>10}");
        }
        if u != Default::default() {
            println!(
                "errors not sent: {} not answered (errors, later fragments), {} over the limits, {} no route back, {} unresolved, {} resets NAT dropped",
                u.not_answered, u.rate_limited, u.no_route_back, u.unresolved, u.dropped_by_nat
            );
        }
        if pipeline.verdicts_kept > 0 {
            println!(
                "{} packets met no chain: their verdict was kept on their connection",
                pipeline.verdicts_kept
            );
        }
        print!("{}", runtime::table(&pipeline.stages(), mhz));
    }
    Ok(ExitCode::SUCCESS)
}
