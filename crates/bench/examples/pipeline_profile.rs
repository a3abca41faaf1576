//! The in-memory pipeline of `fibre bench pipeline` on one family's full table, looped
//! long enough for a profiler to see its stages rather than the table's build:
//!
//! ```sh
//! cargo build --release -p fibre-bench --example pipeline_profile
//! perf record -o pipeline.perf target/release/examples/pipeline_profile 6 40
//! perf report -i pipeline.perf --no-children --sort symbol
//! ```
//!
//! The arguments are the family (4 or 6), the repetitions (each 2^20 packets) and, for
//! the connections study alone, its number of connections, then the number of routes to
//! keep and the one mode to run; it prints each stage's ns per packet as the bench does,
//! so a change can be judged by its figures and its profile at once. Instructions a
//! packet of one mode, which do not drift as timings do (2^20 packets, and warm-up):
//!
//! ```sh
//! valgrind --tool=callgrind --toggle-collect='fibre_dataplane::pipeline::Pipeline::run' \
//!     target/release/examples/pipeline_profile 6 1 1 20000 "masquerade, 1000 rules"
//! ```

use fibre_bench::pipeline::{pipeline_study, Flows, PipelineConfig, Router};
use fibre_routefile::{final_prefixes, read_route_file};
use std::path::Path;

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let family: u8 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(6);
    let repetitions: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(40);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/ris-2026-05-11");
    let read = |name: &str| read_route_file(&root.join(name), false).map_err(|e| e.to_string());
    // A third argument, a number of connections, measures the connections study alone.
    let connections: Option<usize> = args.get(3).and_then(|a| a.parse().ok());
    let cfg = match connections {
        Some(n) => PipelineConfig {
            repetitions,
            vectors: vec![],
            threads: vec![],
            filter_rules: vec![],
            connections: vec![n],
            // A fifth: the one mode of the study to run.
            connections_mode: args.get(5).cloned(),
            ..PipelineConfig::default()
        },
        None => PipelineConfig {
            repetitions,
            vectors: vec![],
            filter_rules: vec![],
            connections: vec![],
            ..PipelineConfig::default()
        },
    };
    // A fourth, a number of routes: the table's first ones only (for callgrind, whose
    // instruction counts do not drift as timings do, but which takes long over the
    // full table's build).
    let most: usize = args
        .get(4)
        .and_then(|a| a.parse().ok())
        .unwrap_or(usize::MAX);
    let (router, flows, routes) = if family == 4 {
        let mut v4 = final_prefixes(&read("rib-v4.txt.gz")?.v4);
        v4.truncate(most);
        let router = Router::new(&v4, &[])?;
        let flows = Flows::new(&router, &v4, &cfg);
        (router, flows, v4.len())
    } else {
        let mut v6 = final_prefixes(&read("rib-v6.txt.gz")?.v6);
        v6.truncate(most);
        let router = Router::new(&[], &v6)?;
        let flows = Flows::new(&router, &v6, &cfg);
        (router, flows, v6.len())
    };
    eprintln!(
        "IPv{family}: {routes} routes, {} flows; forwarding",
        flows.frames.len()
    );
    let mut emit = |f: serde_json::Value| {
        if f["metric"] == "connections" {
            println!(
                "{:>24} conntrack {:6.1} filter {:6.1} forwarding {:6.1} ns",
                f["mode"].as_str().unwrap_or(""),
                f["conntrack_ns"].as_f64().unwrap_or(f64::NAN),
                f["filter_ns"].as_f64().unwrap_or(f64::NAN),
                f["forwarding_ns"].as_f64().unwrap_or(f64::NAN)
            );
            if let Some(stages) = f["stages_ns"].as_object() {
                let each: Vec<String> = stages
                    .iter()
                    .map(|(n, v)| format!("{n} {:.1}", v.as_f64().unwrap_or(f64::NAN)))
                    .collect();
                println!("{:>24} {}", "", each.join(", "));
            }
        }
        if f["metric"] == "stage" || f["metric"] == "forwarding" {
            println!(
                "{:>12} {:6.2} ns",
                f["stage"].as_str().unwrap_or("input … output"),
                f["ns_per_packet"].as_f64().unwrap_or(f64::NAN)
            );
        }
    };
    pipeline_study(&router, &flows, routes, &cfg, &mut emit, &mut |_| {})
}
