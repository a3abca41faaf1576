//! `fibre bench`: measurements. Alone, it runs the studies of `fibre_bench::studies`
//! (lookup cost against table size and threads, real and synthetic tables) with fibre, a
//! peer library and the Linux kernel side by side; `fibre bench lookup` measures fibre's
//! tables alone on a route file.

use fibre_bench::addresses;
use fibre_bench::lookups::{bench_family, AddressSet, Choice, Figure, LookupConfig};
use fibre_lpm::{Form, Key, Prefix, Structure};
use fibre_routefile::{final_prefixes, RouteOp};
use indicatif::{ProgressBar, ProgressStyle};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `fibre bench`.
#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    studies: StudyArgs,
}

/// Arguments of the studies (`fibre bench` without a subcommand).
#[derive(clap::Args)]
pub struct StudyArgs {
    /// Run every study: also many-48, many-128 and lookups during the day of updates.
    #[arg(long)]
    full: bool,
    /// Route files (default: the shipped full tables). Repeat to add files.
    #[arg(long)]
    routes: Vec<PathBuf>,
    /// Update stream for --full (default: the shipped day of updates). Repeatable.
    #[arg(long)]
    updates: Vec<PathBuf>,
    /// Folder for the report, plots and figures (default: `bench-out/<UTC time>`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Also print every figure as a JSON line on standard output.
    #[arg(long)]
    json: bool,
    /// Highest thread count of the threads study (default: CPUs + 1).
    #[arg(long)]
    threads: Option<usize>,
    /// Repetitions per measurement (the highest and lowest are dropped).
    #[arg(long, default_value_t = 12)]
    repetitions: usize,
    /// Addresses per set for fibre and the peers.
    #[arg(long, default_value_t = 1 << 20)]
    count: usize,
    /// Lookups per repetition and thread for the kernel.
    #[arg(long, default_value_t = 1 << 16)]
    kernel_count: u32,
    /// Table sizes sampled from the real table, comma-separated (the whole table is
    /// always added).
    #[arg(long, value_delimiter = ',')]
    sizes: Option<Vec<usize>>,
    /// Table sizes of the many-48 and many-128 studies of --full, comma-separated
    /// (default: 10000,100000,1000000).
    #[arg(long, value_delimiter = ',')]
    many_sizes: Option<Vec<usize>>,
    /// Leave the kernel out.
    #[arg(long)]
    no_kernel: bool,
    /// Leave DPDK's FIBs out (the DPDK peer, measured where the build found DPDK).
    #[arg(long)]
    no_dpdk: bool,
    /// Seed of samples and addresses.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Count and skip malformed route lines.
    #[arg(long)]
    skip_bad: bool,
}

/// Subcommands of `fibre bench`.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Lookups, builds, updates and memory of the LPM engine on one route table.
    Lookup(LookupArgs),
    /// What policy rules and source-specific routes cost a full route lookup, fibre's
    /// and the kernel's, on a sample of the real tables.
    Rules(RulesArgs),
    /// The kernel mirror of `fibre daemon` on a namespace holding the real tables (as
    /// root): its sync against the kernel's dump, a burst of changes followed (time,
    /// publications, lag), its CPU time busy and idle.
    Mirror(MirrorArgs),
    /// What the packet path costs a packet, stage by stage, in memory on the full tables
    /// (1..N cores, by vector size); and, as root, the kernel's forwarding and fibre's on
    /// the same veth topology, their loss-free rates.
    Pipeline(PipelineArgs),
}

/// Arguments of `fibre bench pipeline`.
#[derive(clap::Args)]
pub struct PipelineArgs {
    /// Route files (default: the shipped full tables). Repeat to add files.
    #[arg(long)]
    routes: Vec<PathBuf>,
    /// Folder for the report, plots and figures (default: `bench-out/pipeline-<UTC time>`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Also print every figure as a JSON line on standard output.
    #[arg(long)]
    json: bool,
    /// Repetitions per measurement (the highest and lowest are dropped).
    #[arg(long, default_value_t = 12)]
    repetitions: usize,
    /// Packets each thread forwards per repetition.
    #[arg(long, default_value_t = 1 << 20)]
    packets: usize,
    /// Distinct flows generated per family.
    #[arg(long, default_value_t = 1 << 16)]
    flows: usize,
    /// Highest thread count (default: the CPUs).
    #[arg(long)]
    threads: Option<usize>,
    /// Packets per vector of the stage and core figures (1 to 256).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u16).range(1..=256))]
    vector: u16,
    /// Vector sizes of the vector study, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64,256")]
    vectors: Vec<usize>,
    /// Numbers of filter rules of the filter study (rules no flow matches),
    /// comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0,2,32,128,1000,10000")]
    filter_rules: Vec<usize>,
    /// Numbers of connections of the connections study (each flow its own, tracked,
    /// then masqueraded, then behind 1,000 filter rules), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,1000,100000,1000000")]
    connections: Vec<usize>,
    /// Leave out the veth study (the kernel and fibre forwarding between namespaces).
    #[arg(long)]
    no_veth: bool,
    /// Routes of each family the veth study's router holds (default: all).
    #[arg(long)]
    veth_routes: Option<usize>,
    /// The rules of the kernel's component model's last configuration (connections
    /// tracked, masqueraded, behind that many forward rules that no frame matches); 0
    /// leaves the kernel's components out.
    #[arg(long, default_value_t = 1000)]
    component_rules: usize,
    /// Numbers of connections the kernel's masquerade is taken apart at, comma-separated
    /// (each a UDP flow, all made before the measurement; the host's conntrack limit and
    /// hash size raised to fit while it runs); 0 leaves it out
    #[arg(long, value_delimiter = ',', default_value = "1,1000,100000,1000000")]
    component_flows: Vec<usize>,
    /// The veth study's engines, comma-separated (kernel, floor, xdp, packet, express).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "kernel,floor,xdp,packet,express"
    )]
    engines: Vec<String>,
    /// Milliseconds a veth trial offers its rate for.
    #[arg(long, default_value_t = 1000)]
    trial_ms: u64,
    /// Halvings of the veth study's search for the loss-free rate.
    #[arg(long, default_value_t = 8)]
    steps: usize,
    /// Seed of the flows.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Count and skip malformed route lines.
    #[arg(long)]
    skip_bad: bool,
}

/// Arguments of `fibre bench mirror`.
#[derive(clap::Args)]
pub struct MirrorArgs {
    /// Route files (default: the shipped full tables). Repeat to add files.
    #[arg(long)]
    routes: Vec<PathBuf>,
    /// Routes taken from each family's table (default: all).
    #[arg(long)]
    sample: Option<usize>,
    /// Changes in the burst (half added, then removed).
    #[arg(long, default_value_t = 10_000)]
    updates: usize,
    /// Changes made one at a time after the burst (an `ip route` command each), for the
    /// lag of a single update.
    #[arg(long, default_value_t = 200)]
    paced: usize,
    /// Folder for the report and figures (default: `bench-out/mirror-<UTC time>`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Also print the figures as a JSON line on standard output.
    #[arg(long)]
    json: bool,
    /// Count and skip malformed route lines.
    #[arg(long)]
    skip_bad: bool,
    /// Run the mirror's thread at the normal priority, not the lowest real-time one the
    /// daemon gives its mirror (as `fibre daemon --no-realtime`).
    #[arg(long)]
    no_realtime: bool,
}

/// Arguments of `fibre bench rules`.
#[derive(clap::Args)]
pub struct RulesArgs {
    /// Route files (default: the shipped full tables). Repeat to add files.
    #[arg(long)]
    routes: Vec<PathBuf>,
    /// Routes sampled from each family's table.
    #[arg(long, default_value_t = 100_000)]
    sample: usize,
    /// Rule counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
    rules: Vec<usize>,
    /// Cases to run, comma-separated: default, from, dport, iif, source-routes.
    #[arg(long, value_delimiter = ',', default_value = "default,from,dport,iif,source-routes",
          value_parser = ["default", "from", "dport", "iif", "source-routes"])]
    cases: Vec<String>,
    /// Folder for the report and figures (default: `bench-out/rules-<UTC time>`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Also print every figure as a JSON line on standard output.
    #[arg(long)]
    json: bool,
    /// Repetitions per measurement (the highest and lowest are dropped).
    #[arg(long, default_value_t = 12)]
    repetitions: usize,
    /// Flows per fibre measurement.
    #[arg(long, default_value_t = 1 << 16)]
    count: usize,
    /// Lookups per repetition for the kernel.
    #[arg(long, default_value_t = 1 << 14)]
    kernel_count: u32,
    /// Leave the kernel out.
    #[arg(long)]
    no_kernel: bool,
    /// Seed of the sample and the addresses.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Count and skip malformed route lines.
    #[arg(long)]
    skip_bad: bool,
}

/// Arguments of `fibre bench lookup`.
#[derive(clap::Args)]
pub struct LookupArgs {
    /// Route file (prefix list; A/W lines are applied in order). Repeat to add files.
    #[arg(long, required = true)]
    routes: Vec<PathBuf>,
    /// Addresses to look up, one per line; without it, matched and uniform random ones.
    #[arg(long)]
    addresses: Option<PathBuf>,
    /// An update stream (A/W lines) to apply, alone and under concurrent lookups.
    /// Repeat to add files.
    #[arg(long)]
    updates: Vec<PathBuf>,
    /// Measure 1 up to this many threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Print one JSON object per line instead of text.
    #[arg(long)]
    json: bool,
    /// Repetitions per measurement (the highest and lowest are dropped).
    #[arg(long, default_value_t = 12)]
    repetitions: usize,
    /// Random addresses generated per set.
    #[arg(long, default_value_t = addresses::DEFAULT_COUNT)]
    count: usize,
    /// Keys per batched lookup call.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Updates the writer applies between two publishes.
    #[arg(long, default_value_t = 64)]
    publish_every: usize,
    /// Seed of the address generators.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Count and skip malformed lines instead of stopping at the first.
    #[arg(long)]
    skip_bad: bool,
    /// The lookup structure to measure: each family's own (the trie for IPv4, the range
    /// tree for IPv6 where the CPU has AVX2 or AVX-512), or one of them for both.
    #[arg(long, value_enum, default_value_t = StructureArg::Family)]
    structure: StructureArg,
    /// The instructions lookups use: the fastest this CPU runs, or `portable`, `avx2`,
    /// `avx512` (refused if this CPU lacks them).
    #[arg(long)]
    form: Option<Form>,
}

/// Which structure `fibre bench lookup` measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum StructureArg {
    /// Each family's own structure.
    Family,
    /// The trie, for both families.
    Trie,
    /// The range tree, for both families.
    RangeTree,
}

pub fn run(args: BenchArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    match args.command {
        Some(Command::Lookup(args)) => lookup(args),
        Some(Command::Rules(args)) => rules(args),
        Some(Command::Mirror(args)) => mirror(args),
        Some(Command::Pipeline(args)) => pipeline(args),
        None => studies(args.studies),
    }
}

/// `fibre bench mirror`: the mirror study on the tables, in a namespace.
fn mirror(args: MirrorArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    use fibre_bench::mirror::{markdown, mirror_study, MirrorConfig};
    use std::io::Write;
    let routes = if args.routes.is_empty() {
        vec![shipped("rib-v4.txt.gz"), shipped("rib-v6.txt.gz")]
    } else {
        args.routes.clone()
    };
    let file = crate::load_all_routes(&routes, args.skip_bad)?;
    let (mut v4, mut v6) = (final_prefixes(&file.v4), final_prefixes(&file.v6));
    if let Some(n) = args.sample {
        v4.truncate(n);
        v6.truncate(n);
    }
    let cfg = MirrorConfig {
        updates: args.updates.max(2),
        paced: args.paced,
        realtime: !args.no_realtime,
        ..MirrorConfig::default()
    };
    let figures = mirror_study(&v4, &v6, &cfg)?;
    let out = output_folder(&args.out, "mirror", None)?;
    let report = markdown(&figures, &format!("{}.", run_of(&routes)));
    std::fs::write(out.join("report.md"), &report)?;
    let mut lines = String::new();
    for f in &figures {
        lines += &format!("{f}\n");
    }
    std::fs::write(out.join("figures.jsonl"), &lines)?;
    let stdout = std::io::stdout();
    let mut o = stdout.lock();
    if args.json {
        write!(o, "{lines}")?;
    } else {
        writeln!(o, "{report}")?;
    }
    eprintln!(
        "fibre bench mirror: wrote {} (report.md, figures.jsonl)",
        out.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `fibre bench rules`: the rules study on each family's table, the kernel beside.
fn rules(args: RulesArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    use fibre_bench::rules::{markdown, rules_study, RulesConfig};
    use std::io::Write;
    if args.repetitions == 0 || args.count == 0 || args.kernel_count == 0 || args.sample == 0 {
        return Err(
            "--repetitions, --count, --kernel-count and --sample must be at least 1".into(),
        );
    }
    let routes = if args.routes.is_empty() {
        vec![shipped("rib-v4.txt.gz"), shipped("rib-v6.txt.gz")]
    } else {
        args.routes.clone()
    };
    let file = crate::load_all_routes(&routes, args.skip_bad)?;
    let (v4, v6) = (final_prefixes(&file.v4), final_prefixes(&file.v6));
    if v4.is_empty() && v6.is_empty() {
        return Err("the route files hold no routes".into());
    }
    let missing = if args.no_kernel {
        Some("the kernel side was turned off (--no-kernel)".to_string())
    } else {
        fibre_bench::studies::kernel_missing(&fibre_bench::studies::StudyConfig::default())
    };
    let cfg = RulesConfig {
        routes: args.sample,
        rule_counts: args.rules.clone(),
        cases: args.cases.clone(),
        repetitions: args.repetitions,
        count: args.count,
        kernel_count: args.kernel_count,
        seed: args.seed,
        kernel: missing.is_none(),
    };
    let out = output_folder(&args.out, "rules", Some("fibre bench rules"))?;
    let mut jsonl = std::io::BufWriter::new(std::fs::File::create(out.join("figures.jsonl"))?);
    let progress = spinner();
    let mut figures = Vec::new();
    let json = args.json;
    let mut emit = |f: Figure| {
        let _ = writeln!(jsonl, "{f}");
        if json {
            progress.suspend(|| println!("{f}"));
        }
        figures.push(f);
    };
    let mut step = |s: &str| progress.set_message(s.to_string());
    if !v4.is_empty() {
        rules_study(&v4, &cfg, &mut emit, &mut step)?;
    }
    if !v6.is_empty() {
        rules_study(&v6, &cfg, &mut emit, &mut step)?;
    }
    progress.finish_and_clear();
    jsonl.flush()?;
    let mut md = format!("# fibre bench rules\n\n{}.\n\n", run_of(&routes));
    if let Some(why) = &missing {
        md += &format!("**The kernel's side is missing: {why}.**\n\n");
        eprintln!("fibre bench rules: the kernel's side is missing: {why}");
    }
    md += &markdown(&figures);
    std::fs::write(out.join("report.md"), &md)?;
    if !json {
        println!("{md}");
    }
    eprintln!(
        "fibre bench rules: wrote {} (report.md, figures.jsonl)",
        out.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `fibre bench pipeline`: the packet path in memory, then over veth against the kernel.
fn pipeline(args: PipelineArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    if let Some(e) = args.engines.iter().find(|e| {
        !["kernel", "floor", "xdp", "packet", "express"].contains(&e.to_lowercase().as_str())
    }) {
        return Err(
            format!("--engines {e}: not one of kernel, floor, xdp, packet, express").into(),
        );
    }
    use fibre_bench::pipeline::{markdown, pipeline_study, plots, Flows, PipelineConfig, Router};
    use fibre_bench::veth::{kernel_forwarding, veth_study, Engine, Topology, VethConfig};
    use std::io::Write;
    if args.repetitions == 0 || args.packets == 0 || args.flows == 0 {
        return Err("--repetitions, --packets and --flows must be at least 1".into());
    }
    let routes = if args.routes.is_empty() {
        vec![shipped("rib-v4.txt.gz"), shipped("rib-v6.txt.gz")]
    } else {
        args.routes.clone()
    };
    let file = crate::load_all_routes(&routes, args.skip_bad)?;
    let (v4, v6) = (final_prefixes(&file.v4), final_prefixes(&file.v6));
    if v4.is_empty() && v6.is_empty() {
        return Err("the route files hold no routes".into());
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cfg = PipelineConfig {
        repetitions: args.repetitions,
        flows: args.flows,
        packets: args.packets,
        threads: (1..=args.threads.unwrap_or(cpus).max(1)).collect(),
        vector: args.vector as usize,
        vectors: args.vectors.clone(),
        seed: args.seed,
        filter_rules: args.filter_rules.clone(),
        connections: args.connections.clone(),
        ..PipelineConfig::default()
    };
    let out = output_folder(&args.out, "pipeline", Some("fibre bench pipeline"))?;
    let mut jsonl = std::io::BufWriter::new(std::fs::File::create(out.join("figures.jsonl"))?);
    let progress = spinner();
    progress.enable_steady_tick(std::time::Duration::from_millis(200));
    let mut figures = Vec::new();
    let json = args.json;
    let mut emit = |f: serde_json::Value| {
        let _ = writeln!(jsonl, "{f}");
        if json {
            progress.suspend(|| println!("{f}"));
        }
        figures.push(f);
    };
    let mut step = |s: &str| progress.set_message(s.to_string());
    step(&format!(
        "building the router: {} IPv4 and {} IPv6 routes",
        v4.len(),
        v6.len()
    ));
    let router = Router::new(&v4, &v6)?;
    if !v4.is_empty() {
        let flows = Flows::new(&router, &v4, &cfg);
        pipeline_study(&router, &flows, v4.len(), &cfg, &mut emit, &mut step)?;
    }
    if !v6.is_empty() {
        let flows = Flows::new(&router, &v6, &cfg);
        pipeline_study(&router, &flows, v6.len(), &cfg, &mut emit, &mut step)?;
    }
    drop(router);
    let veth_missing = if args.no_veth {
        Some("left out (--no-veth)".to_string())
    } else {
        fibre_testbed::netns::unavailable_reason()
    };
    if veth_missing.is_none() {
        let (mut v4s, mut v6s) = (v4.clone(), v6.clone());
        if let Some(n) = args.veth_routes {
            v4s.truncate(n);
            v6s.truncate(n);
        }
        step(&format!(
            "veth: loading {} IPv4 and {} IPv6 routes into the router's namespace",
            v4s.len(),
            v6s.len()
        ));
        let topology = Topology::new(&v4s, &v6s)?;
        let exe = std::env::current_exe()?;
        let engines = [
            Engine {
                name: "kernel",
                start: Box::new(|t| Ok(Box::new(kernel_forwarding(t)?))),
            },
            Engine {
                name: "floor",
                start: Box::new(|t| Ok(Box::new(fibre_bench::floor::attach(t)?))),
            },
            Engine {
                name: "fibre AF_XDP",
                start: Box::new(|t| Ok(Box::new(FibreDaemon::start(&exe, t, "xdp")?))),
            },
            Engine {
                name: "fibre AF_PACKET",
                start: Box::new(|t| Ok(Box::new(FibreDaemon::start(&exe, t, "packet")?))),
            },
            Engine {
                name: "fibre express",
                start: Box::new(|t| Ok(Box::new(FibreDaemon::start(&exe, t, "express")?))),
            },
        ];
        let vcfg = VethConfig {
            trial: std::time::Duration::from_millis(args.trial_ms.max(10)),
            steps: args.steps,
            seed: args.seed,
            // The kernel's filter is measured where its rules tell: none, and many.
            filter_rules: args
                .filter_rules
                .iter()
                .copied()
                .filter(|&n| n == 0 || n >= 1000)
                .collect(),
            component_rules: args.component_rules,
            component_flows: args
                .component_flows
                .iter()
                .copied()
                .filter(|&n| n > 0)
                .collect(),
            ..VethConfig::default()
        };
        let picked = |name: &str| {
            let short = name.trim_start_matches("fibre ").to_lowercase();
            let short = short.trim_start_matches("af_");
            args.engines.iter().any(|e| e.eq_ignore_ascii_case(short))
        };
        let engines: Vec<Engine> = engines.into_iter().filter(|e| picked(e.name)).collect();
        veth_study(&topology, &v4s, &v6s, &engines, &vcfg, &mut emit, &mut step)?;
    }
    progress.finish_and_clear();
    jsonl.flush()?;
    let mut md = format!("# fibre bench pipeline\n\n{}.\n\n", run_of(&routes));
    if let Some(why) = &veth_missing {
        md += &format!("**The veth study is missing: {why}.**\n\n");
    }
    md += &markdown(&figures);
    let drawn = plots(&figures, &out)?;
    for p in &drawn {
        md += &format!("![{}]({})\n\n", file_name(p), file_name(p));
    }
    std::fs::write(out.join("report.md"), &md)?;
    if !json {
        println!("{md}");
    }
    eprintln!(
        "fibre bench pipeline: wrote {} (report.md, figures.jsonl, {} plots)",
        out.display(),
        drawn.len()
    );
    Ok(ExitCode::SUCCESS)
}

/// `fibre daemon --forward` on the veth study's router, one worker on the router's CPU,
/// reading and sending by `--io` (over AF_XDP, the links' NAPI in threads on the same
/// CPU); stopped when dropped.
struct FibreDaemon {
    child: std::process::Child,
    socket: PathBuf,
}

impl FibreDaemon {
    fn start(exe: &Path, t: &fibre_bench::veth::Topology, io: &str) -> Result<FibreDaemon, String> {
        use fibre_bench::veth::{threaded_napi, wait_for_xdp, ROUTER_IN, ROUTER_OUT};
        let netns = t.router.name();
        let socket = std::env::temp_dir().join(format!("fibre-bench-{netns}.sock"));
        let child = std::process::Command::new(exe)
            .args(["daemon", "--netns", netns, "--socket"])
            .arg(&socket)
            .args([
                "--forward",
                &format!("{ROUTER_IN},{ROUTER_OUT}"),
                "--workers",
                "1",
                "--cpus",
                &t.router_cpu.to_string(),
                "--io",
                if io == "express" { "packet" } else { io },
            ])
            .args(if io == "express" {
                &["--express"][..]
            } else {
                &[]
            })
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("fibre daemon: {e}"))?;
        let mut daemon = FibreDaemon { child, socket };
        daemon.wait_until_synced(exe, std::time::Duration::from_secs(300))?;
        if io == "xdp" {
            wait_for_xdp(t, std::time::Duration::from_secs(30))?;
            threaded_napi(t)?;
        }
        Ok(daemon)
    }
}

impl FibreDaemon {
    /// Waits until the daemon has mirrored the router's tables and its workers are
    /// running (`fibre ctl stats`): until then it is still loading, and its CPU and its
    /// frames would be counted as forwarding's.
    fn wait_until_synced(&mut self, exe: &Path, within: std::time::Duration) -> Result<(), String> {
        let start = std::time::Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("fibre daemon exited while starting: {status}"));
            }
            let out = std::process::Command::new(exe)
                .args(["ctl", "--socket"])
                .arg(&self.socket)
                .args(["stats", "--json"])
                .output()
                .map_err(|e| format!("fibre ctl: {e}"))?;
            if out.status.success() {
                let stats: serde_json::Value =
                    serde_json::from_slice(&out.stdout).map_err(|e| format!("fibre ctl: {e}"))?;
                if stats["synced"] == true && stats["forwarding"]["workers"].as_u64() > Some(0) {
                    return Ok(());
                }
            }
            if start.elapsed() > within {
                return Err(format!(
                    "fibre daemon not synced with its workers running within {} s",
                    within.as_secs()
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

impl fibre_bench::veth::Running for FibreDaemon {
    fn process(&self) -> Option<u32> {
        Some(self.child.id())
    }
}

impl Drop for FibreDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// The shipped data folder: under the current directory, or beside the sources.
fn shipped(name: &str) -> PathBuf {
    let here = Path::new("data/ris-2026-05-11").join(name);
    if here.exists() {
        return here;
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/ris-2026-05-11")
        .join(name)
}

fn studies(args: StudyArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    use fibre_bench::studies::{
        kernel_missing, run_studies, step_count, Sink, StudyConfig, StudyInput,
    };
    use std::io::Write;
    let routes = if args.routes.is_empty() {
        vec![shipped("rib-v4.txt.gz"), shipped("rib-v6.txt.gz")]
    } else {
        args.routes.clone()
    };
    let updates = if !args.full {
        Vec::new()
    } else if args.updates.is_empty() {
        vec![shipped("updates-v4.txt.gz"), shipped("updates-v6.txt.gz")]
    } else {
        args.updates.clone()
    };
    if args.repetitions == 0 || args.count == 0 || args.kernel_count == 0 || args.threads == Some(0)
    {
        return Err(
            "--repetitions, --count, --kernel-count and --threads must be at least 1".into(),
        );
    }
    let file = crate::load_all_routes(&routes, args.skip_bad)?;
    let upd = crate::load_all_routes(&updates, args.skip_bad)?;
    let (v4, v6) = (final_prefixes(&file.v4), final_prefixes(&file.v6));
    if v4.is_empty() && v6.is_empty() {
        return Err("the route files hold no routes".into());
    }
    let mut cfg = StudyConfig {
        full: args.full,
        repetitions: args.repetitions,
        count: args.count,
        kernel_count: args.kernel_count,
        seed: args.seed,
        kernel: !args.no_kernel,
        dpdk: !args.no_dpdk,
        ..StudyConfig::default()
    };
    if let Some(t) = args.threads {
        cfg.max_threads = t;
    }
    if let Some(s) = args.sizes.clone() {
        cfg.sizes = s;
    }
    if let Some(s) = args.many_sizes.clone() {
        if s.contains(&0) {
            return Err("--many-sizes must be at least 1".into());
        }
        cfg.many_sizes = s;
    }
    let out = output_folder(&args.out, "", Some("fibre bench"))?;
    let mut jsonl = std::io::BufWriter::new(std::fs::File::create(out.join("figures.jsonl"))?);
    let input = StudyInput {
        v4: &v4,
        v6: &v6,
        updates_v4: &upd.v4,
        updates_v6: &upd.v6,
    };
    let with_kernel = kernel_missing(&cfg).is_none();
    let progress = ProgressBar::new(step_count(&input, &cfg, with_kernel));
    progress.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed:>4} {msg}")
            .expect("valid template"),
    );
    let mut figures = Vec::new();
    let json = args.json;
    // fibre's tables take the fastest form this CPU runs and each family's structure
    // for it: every fibre figure says which.
    let form = Form::best();
    let structure = |family: u64| match family {
        4 => Structure::best::<u32>(form),
        _ => Structure::best::<u128>(form),
    };
    let mut emit = |mut f: Figure| {
        if f["engine"] == "fibre" {
            let family = f["family"].as_u64().unwrap_or(4);
            f["form"] = form.name().into();
            f["structure"] = structure(family).name().into();
        }
        let _ = writeln!(jsonl, "{f}");
        if json {
            progress.suspend(|| println!("{f}"));
        }
        figures.push(f);
    };
    let mut started = false;
    let mut step = |s: &str| {
        if started {
            progress.inc(1);
        }
        started = true;
        progress.set_message(s.to_string());
    };
    let missing = run_studies(
        &input,
        &cfg,
        &mut Sink {
            emit: &mut emit,
            step: &mut step,
        },
    );
    progress.finish_and_clear();
    jsonl.flush()?;
    if let Some(why) = &missing {
        eprintln!("fibre bench: the kernel's side is missing: {why}");
    }
    let mut dpdk_skipped: Vec<&str> = figures
        .iter()
        .filter(|f| f["study"] == "dpdk" && f["metric"] == "skipped")
        .filter_map(|f| f["reason"].as_str())
        .collect();
    dpdk_skipped.dedup();
    for why in dpdk_skipped {
        eprintln!("fibre bench: {why}");
    }
    let header = format!(
        "{}. fibre's lookups: the {form} form (the fastest this CPU runs), the IPv4 {} and \
         the IPv6 {}.",
        run_of(&routes),
        structure(4),
        structure(6),
    );
    let md = fibre_bench::report::markdown(&figures, missing.as_deref(), &header);
    std::fs::write(out.join("report.md"), &md)?;
    let plots = fibre_bench::report::plots(&figures, &out)?;
    if !json {
        println!("{md}");
    }
    eprintln!(
        "fibre bench: wrote {} (report.md, figures.jsonl, {} plot(s))",
        out.display(),
        plots.len()
    );
    Ok(ExitCode::SUCCESS)
}

/// What a report says of its run: the command, the CPU, the kernel, the form fibre's
/// tables run (the fastest this CPU has, or the one `FIBRE_FORM` caps them at), the time,
/// the routes.
fn run_of(routes: &[PathBuf]) -> String {
    format!(
        "Run of `fibre bench{}` on {} (Linux {}), fibre's lookups in the `{}` form, {}. Routes: {}",
        std::env::args()
            .skip(2)
            .map(|a| format!(" {a}"))
            .collect::<String>(),
        fibre_bench::report::cpu_model(),
        kernel_release(),
        Form::best().name(),
        utc_stamp(),
        routes
            .iter()
            .map(|p| file_name(p))
            .collect::<Vec<_>>()
            .join(", "),
    )
}

/// The current UTC time as `YYYYMMDD-HHMMSS`.
/// The folder a study writes to: `out`, or `bench-out/<prefix>-<UTC time>` (no prefix:
/// the time alone), made if missing; `command`, if given, says where it writes.
fn output_folder(
    out: &Option<PathBuf>,
    prefix: &str,
    command: Option<&str>,
) -> Result<PathBuf, String> {
    let out = out.clone().unwrap_or_else(|| {
        let name = if prefix.is_empty() {
            utc_stamp()
        } else {
            format!("{prefix}-{}", utc_stamp())
        };
        PathBuf::from("bench-out").join(name)
    });
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    if let Some(command) = command {
        eprintln!("{command}: writing to {}", out.display());
    }
    Ok(out)
}

/// A spinner with the time elapsed and what is being done.
fn spinner() -> ProgressBar {
    let progress = ProgressBar::new_spinner();
    progress.set_style(
        ProgressStyle::with_template("{spinner} {elapsed:>4} {msg}").expect("valid template"),
    );
    progress
}

fn utc_stamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|_| "?".into(), |s| s.trim().to_string())
}

fn lookup(args: LookupArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    if args.threads == 0
        || args.repetitions == 0
        || args.count == 0
        || args.batch == 0
        || args.publish_every == 0
    {
        return Err(
            "--threads, --repetitions, --count, --batch and --publish-every must be at least 1"
                .into(),
        );
    }
    let routes = crate::load_all_routes(&args.routes, args.skip_bad)?;
    let updates = if args.updates.is_empty() {
        None
    } else {
        Some(crate::load_all_routes(&args.updates, args.skip_bad)?)
    };
    let given = match &args.addresses {
        Some(p) => Some(read_addresses(p)?),
        None => None,
    };
    let cfg = LookupConfig {
        threads: args.threads,
        repetitions: args.repetitions,
        count: args.count,
        batch: args.batch,
        seed: args.seed,
        publish_every: args.publish_every,
    };
    let progress = spinner();
    progress.enable_steady_tick(std::time::Duration::from_millis(200));
    let json = args.json;
    let name = args.addresses.as_deref().map(file_name);
    let mut emit = |f: Figure| progress.suspend(|| print_figure(&f, json));
    let mut step = |s: &str| progress.set_message(s.to_string());
    let structure = match args.structure {
        StructureArg::Family => None,
        StructureArg::Trie => Some(Structure::Trie),
        StructureArg::RangeTree => Some(Structure::RangeTree),
    };
    let choice = Choice::new(structure, args.form)?;
    let mut families = 0;
    if !routes.v4.is_empty() {
        families += 1;
        run_family::<u32>(
            choice,
            &final_prefixes(&routes.v4),
            updates.as_ref().map(|u| &u.v4[..]),
            given
                .as_ref()
                .map(|g| (name.clone().unwrap_or_default(), g.0.clone())),
            &cfg,
            &mut emit,
            &mut step,
        );
    }
    if !routes.v6.is_empty() {
        families += 1;
        run_family::<u128>(
            choice,
            &final_prefixes(&routes.v6),
            updates.as_ref().map(|u| &u.v6[..]),
            given
                .as_ref()
                .map(|g| (name.clone().unwrap_or_default(), g.1.clone())),
            &cfg,
            &mut emit,
            &mut step,
        );
    }
    progress.finish_and_clear();
    if families == 0 {
        return Err("the route files hold no routes".into());
    }
    Ok(ExitCode::SUCCESS)
}

fn run_family<K: Key>(
    choice: Choice,
    prefixes: &[Prefix<K>],
    updates: Option<&[(RouteOp, Prefix<K>)]>,
    given: Option<(String, Vec<K>)>,
    cfg: &LookupConfig,
    emit: &mut dyn FnMut(Figure),
    step: &mut dyn FnMut(&str),
) {
    let sets = match given {
        Some((name, keys)) if !keys.is_empty() => vec![AddressSet { name, keys }],
        Some(_) => return, // the address file has none of this family
        None => vec![
            AddressSet {
                name: "matched".into(),
                keys: addresses::matched(prefixes, cfg.count, cfg.seed),
            },
            AddressSet {
                name: "uniform".into(),
                keys: addresses::uniform(cfg.count, cfg.seed),
            },
        ],
    };
    let updates = updates.filter(|u| !u.is_empty());
    bench_family::<K>(choice, prefixes, updates, &sets, cfg, emit, step);
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.display().to_string())
}

/// Reads one address per line (blank lines and `#` comments allowed), split by family.
fn read_addresses(path: &Path) -> Result<(Vec<u32>, Vec<u128>), Box<dyn std::error::Error>> {
    use std::io::BufRead;
    let reader = fibre_routefile::open_maybe_gz(path)?;
    let (mut v4, mut v6) = (Vec::new(), Vec::new());
    for (n, line) in reader.lines().enumerate() {
        let line =
            line.map_err(|e| format!("{}: read failed after line {n}: {e}", path.display()))?;
        let text = line.split('#').next().unwrap_or("").trim();
        if text.is_empty() {
            continue;
        }
        match text.parse::<IpAddr>() {
            Ok(IpAddr::V4(a)) => v4.push(a.into()),
            Ok(IpAddr::V6(a)) => v6.push(a.into()),
            Err(_) => {
                return Err(format!(
                    "{}:{}: {} is not an IPv4 or IPv6 address",
                    path.display(),
                    n + 1,
                    fibre_lpm::quote(text)
                )
                .into())
            }
        }
    }
    Ok((v4, v6))
}

/// Prints a figure as JSON or as a line of text.
fn print_figure(f: &Figure, json: bool) {
    if json {
        println!("{f}");
        return;
    }
    let num = |k: &str| f[k].as_f64().unwrap_or(f64::NAN);
    // A figure that could not be trusted is null in the figure, with the reason beside.
    let ns = |k: &str, width: usize| match f[k].as_f64() {
        Some(v) => format!("{v:width$.2}"),
        None => format!("{:>width$}", "–"),
    };
    let notes: String = ["ns_per_lookup_note", "throughput_ns_note"]
        .iter()
        .filter_map(|k| f[*k].as_str())
        .map(|n| format!(" ({n})"))
        .collect();
    let family = format!("IPv{} {} routes", f["family"], group(num("routes") as u64));
    match f["metric"].as_str().unwrap_or("") {
        "build" => println!("{family}: bulk build {:.3} s ({:.2} M routes/s)", num("seconds"), num("routes_per_sec") / 1e6),
        "memory" => println!(
            "{family}: lookup structure ({}, {} form) {:.2} MiB ({:.2} bytes/route), update side {:.2} MiB",
            f["structure"].as_str().unwrap_or("?"),
            f["form"].as_str().unwrap_or("?"),
            num("lookup_bytes") / 1048576.0,
            num("bytes_per_route"),
            num("update_bytes") / 1048576.0,
        ),
        "insert" | "remove" => println!(
            "{family}: incremental {} of every route {:.3} s ({:.2} M/s)",
            f["metric"].as_str().unwrap_or(""),
            num("seconds"),
            num("ops_per_sec") / 1e6
        ),
        "updates" => println!(
            "{family}: update stream via {}: {} ops in {:.3} s ({:.2} M/s)",
            f["path"].as_str().unwrap_or(""),
            group(num("ops") as u64),
            num("seconds"),
            num("ops_per_sec") / 1e6
        ),
        "lookup" => println!(
            "{family}: {:<8} {:<6} {} thread(s){}: {} ns/lookup ±{:.2}, throughput {} ns ({} M lookups/s){notes}",
            f["addresses"].as_str().unwrap_or(""),
            f["mode"].as_str().unwrap_or(""),
            f["threads"],
            match (f["writer"].as_bool(), f["writer_table"].as_str()) {
                (Some(true), Some("private")) => " + writer on its own table",
                (Some(true), _) => " + writer",
                _ => "",
            },
            ns("ns_per_lookup", 7),
            num("mean_dev"),
            ns("throughput_ns", 7),
            f["lookups_per_sec"]
                .as_f64()
                .map_or("–".into(), |v| format!("{:.1}", v / 1e6))
        ),
        _ => println!("{f}"),
    }
}

/// 1234567 -> "1,234,567".
fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
