//! `fibre bench pipeline` run as a user runs it, on a sample of the shipped tables: the
//! figures it must give are there and hold what they say (every stage of the forwarding
//! path costs something, errors cost nothing when there are none, rates follow from
//! times), the report and plots are written, and, as root, the kernel and fibre both
//! forward over veth and get a loss-free rate each.

use serde_json::Value;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A route file of the first `n` routes of each shipped table.
fn sample(dir: &Path, n: usize) -> PathBuf {
    let path = dir.join("sample.txt");
    let mut out = std::fs::File::create(&path).unwrap();
    for name in ["rib-v4.txt.gz", "rib-v6.txt.gz"] {
        let file = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../data/ris-2026-05-11")
            .join(name);
        let file = std::fs::File::open(&file).unwrap();
        for line in std::io::BufReader::new(flate2::read::GzDecoder::new(file))
            .lines()
            .take(n)
        {
            writeln!(out, "{}", line.unwrap()).unwrap();
        }
    }
    path
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("fibre-bench-pipeline-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `fibre bench pipeline ARGS --json`; its figures.
fn run(dir: &Path, args: &[&str]) -> Vec<Value> {
    let routes = sample(dir, 3000);
    let out = Command::new(env!("CARGO_BIN_EXE_fibre"))
        .args(["bench", "pipeline", "--routes"])
        .arg(&routes)
        .arg("--out")
        .arg(dir.join("out"))
        .args(args)
        .arg("--json")
        .output()
        .expect("fibre runs");
    assert!(
        out.status.success(),
        "fibre bench pipeline failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let figures: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    let written = std::fs::read_to_string(dir.join("out/figures.jsonl")).unwrap();
    assert_eq!(
        written.lines().count(),
        figures.len(),
        "the same figures in the file"
    );
    figures
}

fn num(f: &Value, k: &str) -> f64 {
    f[k].as_f64().unwrap_or_else(|| panic!("no {k} in {f}"))
}

#[test]
fn the_packet_path_is_measured_stage_by_stage_in_memory() {
    let dir = temp_dir("memory");
    let figures = run(
        &dir,
        &[
            "--no-veth",
            "--repetitions",
            "3",
            "--packets",
            "8192",
            "--flows",
            "2048",
            "--threads",
            "2",
            "--vectors",
            "1,256",
            "--filter-rules",
            "0,32",
            "--connections",
            "1,4096",
        ],
    );
    for family in [4, 6] {
        let of = |metric: &str| -> Vec<&Value> {
            figures
                .iter()
                .filter(|f| {
                    f["study"] == "pipeline" && f["family"] == family && f["metric"] == metric
                })
                .collect()
        };
        let stages = of("stage");
        let names: Vec<&str> = stages
            .iter()
            .map(|f| f["stage"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "receive",
                "input",
                "conntrack",
                "route",
                "neighbour",
                "filter",
                "rewrite",
                "icmp",
                "output"
            ],
            "IPv{family}"
        );
        for f in &stages {
            let ns = num(f, "ns_per_packet");
            if f["stage"] == "icmp" {
                assert_eq!(ns, 0.0, "no packet needs an error: {f}");
            } else if f["stage"] == "filter" || f["stage"] == "conntrack" {
                assert_eq!(ns, 0.0, "the bench's router holds no filter rules: {f}");
            } else {
                assert!(ns > 0.0 && ns.is_finite(), "{f}");
            }
        }
        // The filter study: no rules, then 32 that no flow matches, with blocks and
        // walked; the filter stage costs nothing without rules.
        let filter = of("filter");
        let shape: Vec<(u64, &str)> = filter
            .iter()
            .map(|f| (f["rules"].as_u64().unwrap(), f["mode"].as_str().unwrap()))
            .collect();
        assert_eq!(shape, [(0, "blocks"), (32, "blocks"), (32, "walked")]);
        for f in &filter {
            let ns = num(f, "filter_ns");
            assert_eq!(ns == 0.0, f["rules"] == 0, "{f}");
            assert!(num(f, "ns_per_packet") > 0.0, "{f}");
        }
        // The connections study: 1 and 4,096 connections, tracked, masqueraded, behind
        // 1,000 rules; the conntrack stage costs something, the rules more.
        let connections = of("connections");
        let shape: Vec<(u64, &str)> = connections
            .iter()
            .map(|f| {
                (
                    f["connections"].as_u64().unwrap(),
                    f["mode"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            shape,
            [
                (1, "tracked"),
                (1, "masquerade"),
                (1, "masquerade, 1000 rules"),
                (4096, "tracked"),
                (4096, "masquerade"),
                (4096, "masquerade, 1000 rules")
            ]
        );
        for f in &connections {
            assert!(num(f, "conntrack_ns") > 0.0, "{f}");
            assert!(num(f, "forwarding_ns") > num(f, "conntrack_ns"), "{f}");
            assert!(
                num(f, "filter_ns") > 0.0,
                "the filter stage confirms each connection: {f}"
            );
        }
        let forwarding = of("forwarding");
        assert_eq!(forwarding.len(), 1);
        let sum: f64 = stages
            .iter()
            .filter(|f| f["stage"] != "receive")
            .map(|f| num(f, "ns_per_packet"))
            .sum();
        assert!((num(forwarding[0], "ns_per_packet") - sum).abs() < 1e-6 * sum.max(1.0));
        let packets = of("packet");
        assert_eq!(packets.len(), 2, "1 and 2 threads");
        for f in &packets {
            let mpps = num(f, "mpps");
            assert!(
                (mpps - 1e3 / num(f, "throughput_ns")).abs() < 1e-9 * mpps.max(1.0),
                "{f}"
            );
            assert!(
                (num(f, "mpps_per_core") * f["threads"].as_f64().unwrap() - mpps).abs()
                    < 1e-9 * mpps.max(1.0),
                "{f}"
            );
            // Timed apart from the stages, on a machine doing other work: only its
            // sign is a fact to hold it to, not its ratio to their sum.
            assert!(num(f, "ns_per_packet").is_finite(), "{f}");
            assert!(num(f, "ns_per_packet") > 0.0, "{f}");
            assert!(f["flows"].as_u64().unwrap() > 1000, "{f}");
        }
        let vectors: Vec<u64> = of("vector")
            .iter()
            .map(|f| f["vector"].as_u64().unwrap())
            .collect();
        assert_eq!(vectors, [1, 256]);
    }
    let report = std::fs::read_to_string(dir.join("out/report.md")).unwrap();
    for text in [
        "| route |",
        "input … output",
        "by cores",
        "by vector size",
        "The veth study is missing",
    ] {
        assert!(report.contains(text), "{text} not in:\n{report}");
    }
    for plot in ["pipeline-cores.svg", "pipeline-vector.svg"] {
        assert!(dir.join("out").join(plot).exists(), "{plot}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_vector_out_of_range_is_refused() {
    for v in ["0", "257"] {
        let out = Command::new(env!("CARGO_BIN_EXE_fibre"))
            .args(["bench", "pipeline", "--no-veth", "--vector", v])
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--vector"),
            "{v}"
        );
    }
}

#[test]
#[ignore = "needs root: network namespaces, veth and a packet socket"]
fn the_kernel_and_fibre_both_forward_over_veth() {
    let dir = temp_dir("veth");
    let figures = run(
        &dir,
        &[
            "--repetitions",
            "1",
            "--packets",
            "4096",
            "--flows",
            "1024",
            "--threads",
            "1",
            "--vectors",
            "256",
            "--veth-routes",
            "1000",
            "--trial-ms",
            "200",
            "--steps",
            "2",
            "--component-rules",
            "100",
            "--component-flows",
            "1,5000",
        ],
    );
    let veth: Vec<&Value> = figures.iter().filter(|f| f["study"] == "veth").collect();
    let seen: Vec<(u64, &str)> = veth
        .iter()
        .map(|f| (f["family"].as_u64().unwrap(), f["engine"].as_str().unwrap()))
        .collect();
    assert_eq!(
        seen,
        [
            (4, "kernel"),
            (6, "kernel"),
            (4, "floor"),
            (6, "floor"),
            (4, "fibre AF_XDP"),
            (6, "fibre AF_XDP"),
            (4, "fibre AF_PACKET"),
            (6, "fibre AF_PACKET"),
            (4, "fibre express"),
            (6, "fibre express")
        ]
    );
    for f in &veth {
        // The study waits until a slow trial loses nothing before it measures: every
        // engine forwarded the slow rate whole, so its loss-free rate is at least that.
        assert!(num(f, "loss_free_mpps") >= 0.02, "{f}");
        assert!(
            num(f, "offered_max_mpps") >= num(f, "loss_free_mpps") * 0.999,
            "{f}"
        );
        assert!(num(f, "forwarded_at_max_mpps") > 0.0, "{f}");
        assert!(num(f, "core_ns_per_frame") > 0.0, "{f}");
        assert_eq!(
            f["frame_bytes"],
            if f["family"] == 4 { 64 } else { 66 },
            "{f}"
        );
    }
    // The kernel taken apart by component: four configurations a family, each costing
    // its frame more than forwarding alone; with `perf` at hand, their time split into
    // components that add up to it, conntrack's there once connections are tracked,
    // NAT's once masqueraded, the filter's behind the rules.
    let components: Vec<&Value> = figures
        .iter()
        .filter(|f| f["study"] == "veth-components")
        .collect();
    let configs: Vec<(u64, &str)> = components
        .iter()
        .map(|f| (f["family"].as_u64().unwrap(), f["config"].as_str().unwrap()))
        .collect();
    let mut wanted = Vec::new();
    for family in [4, 6] {
        for c in [
            "forwarding",
            "tracked",
            "masquerade",
            "masquerade, 100 rules",
        ] {
            wanted.push((family, c));
        }
    }
    assert_eq!(configs, wanted);
    let perf = std::process::Command::new("perf")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    for f in &components {
        let ns = num(f, "core_ns_per_frame");
        assert!(ns > 0.0, "{f}");
        if !perf {
            assert!(f["attribution_error"].is_string(), "{f}");
            continue;
        }
        let part = |c: &str| f["components"][c].as_f64().unwrap_or(-1.0);
        let sum: f64 = ["routing", "conntrack", "filter", "nat", "forwarding"]
            .iter()
            .map(|c| part(c))
            .sum();
        assert!((sum - ns).abs() < ns * 1e-6, "{f}");
        let config = f["config"].as_str().unwrap();
        assert!(part("routing") > 0.0, "{f}");
        // (Where a component is not loaded, a sample or two at most: a hook just gone.)
        let there = |c: &str| part(c) > ns * 0.005;
        assert_eq!(there("conntrack"), config != "forwarding", "{f}");
        assert_eq!(there("nat"), config.starts_with("masquerade"), "{f}");
        // (Which component costs more is the bench's to say, not a test's.)
        if config.ends_with("rules") {
            assert!(there("filter"), "{f}");
        }
    }
    // The kernel's masquerade by its connections: each number's connections made
    // (more than the 4,096 flows of the other studies), what a frame costs, conntrack's
    // and NAT's part of it.
    let by_connections: Vec<&Value> = figures
        .iter()
        .filter(|f| f["study"] == "veth-components-flows")
        .collect();
    let counts: Vec<(u64, u64)> = by_connections
        .iter()
        .map(|f| {
            (
                f["family"].as_u64().unwrap(),
                f["connections"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(counts, [(4, 1), (4, 5000), (6, 1), (6, 5000)]);
    for f in &by_connections {
        let n = f["connections"].as_u64().unwrap();
        // (Two flows the generator made alike are one connection: a few may be.)
        assert!(f["tracked"].as_u64().unwrap() >= n * 99 / 100, "{f}");
        assert!(num(f, "core_ns_per_frame") > 0.0, "{f}");
        if perf {
            assert!(f["components"]["conntrack"].as_f64().unwrap() > 0.0, "{f}");
            assert!(f["components"]["nat"].as_f64().unwrap() > 0.0, "{f}");
        }
    }
    // TCP with the hosts' default offloads passes through every engine, both families.
    let tcp: Vec<(u64, &str)> = figures
        .iter()
        .filter(|f| f["study"] == "veth-tcp")
        .inspect(|f| assert!(num(f, "gbit_per_s") > 0.0, "{f}"))
        .map(|f| (f["family"].as_u64().unwrap(), f["engine"].as_str().unwrap()))
        .collect();
    assert_eq!(tcp.len(), 10, "{tcp:?}");
    for engine in [
        "kernel",
        "floor",
        "fibre AF_XDP",
        "fibre AF_PACKET",
        "fibre express",
    ] {
        assert!(
            tcp.contains(&(4, engine)) && tcp.contains(&(6, engine)),
            "{tcp:?}"
        );
    }
    // With no traffic a daemon ready to forward sleeps: a worker that spun would use a
    // whole core.
    let idle: Vec<&Value> = figures
        .iter()
        .filter(|f| f["study"] == "veth-idle")
        .collect();
    assert_eq!(idle.len(), 3, "{idle:?}");
    for f in &idle {
        let percent = num(f, "cpu_percent");
        assert!((0.0..5.0).contains(&percent), "{f}");
    }
    let report = std::fs::read_to_string(dir.join("out/report.md")).unwrap();
    assert!(report.contains("loss-free rate is"), "{report}");
    assert!(report.contains("## Idle"), "{report}");
    assert!(report.contains("TCP through the router"), "{report}");
    assert!(
        report.contains("## The kernel's masquerade by its connections"),
        "{report}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
