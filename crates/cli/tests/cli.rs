//! The `fibre` command run as a user runs it.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn fibre(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fibre"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fibre runs");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fibre-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

const ROUTES: &str = "# test routes\n0.0.0.0/0\n10.0.0.0/8\n10.1.0.0/16\nA 10.1.2.0/24\n2001:db8::/32\n2001:db8:1::/48\nW 10.1.0.0/16\n192.0.2.7\n";

#[test]
fn lookup_prints_the_longest_prefix_of_each_address() {
    let routes = temp_file("routes.txt", ROUTES);
    let o = fibre(
        &[
            "lookup",
            "--routes",
            routes.to_str().unwrap(),
            "10.1.2.3",
            "10.1.3.3",
            "11.0.0.1",
            "192.0.2.7",
            "2001:db8:1::5",
            "2001:db8:2::5",
            "2001:db9::",
        ],
        None,
    );
    assert!(o.status.success(), "{o:?}");
    assert_eq!(
        stdout(&o),
        "10.1.2.3 10.1.2.0/24\n10.1.3.3 10.0.0.0/8\n11.0.0.1 0.0.0.0/0\n192.0.2.7 192.0.2.7/32\n\
         2001:db8:1::5 2001:db8:1::/48\n2001:db8:2::5 2001:db8::/32\n2001:db9:: -\n"
    );
}

#[test]
fn lookup_reads_addresses_from_stdin_and_reports_bad_ones() {
    let routes = temp_file("routes2.txt", ROUTES);
    let o = fibre(
        &["lookup", "--routes", routes.to_str().unwrap()],
        Some("10.9.9.9\n\nnot-an-address\n2001:db8::1\n"),
    );
    assert_eq!(
        stdout(&o),
        "10.9.9.9 10.0.0.0/8\n2001:db8::1 2001:db8::/32\n"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("standard input, line 3: \"not-an-address\" is not an IPv4 or IPv6 address"),
        "{err}"
    );
    assert!(
        !o.status.success(),
        "a bad address makes the exit status non-zero"
    );
}

#[test]
fn a_bad_route_line_names_file_line_and_reason_unless_skipped() {
    let routes = temp_file("bad.txt", "10.0.0.0/8\n10.0.0.0/99\n11.0.0.0/8\n");
    let o = fibre(
        &["lookup", "--routes", routes.to_str().unwrap(), "11.1.1.1"],
        None,
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("bad.txt:2: prefix length 99 is longer than 32"),
        "{err}"
    );
    assert_eq!(stdout(&o), "");
    let o = fibre(
        &[
            "lookup",
            "--skip-bad",
            "--routes",
            routes.to_str().unwrap(),
            "11.1.1.1",
        ],
        None,
    );
    assert!(o.status.success());
    assert_eq!(stdout(&o), "11.1.1.1 11.0.0.0/8\n");
    assert!(String::from_utf8_lossy(&o.stderr).contains("skipped 1 bad line(s)"));
    let o = fibre(
        &["lookup", "--routes", "/nonexistent/routes.txt", "1.1.1.1"],
        None,
    );
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/routes.txt: cannot open"));
}

#[test]
fn errors_quote_a_bounded_excerpt_of_a_huge_input() {
    let huge = "1".repeat(10 << 20);
    let routes = temp_file("huge.txt", &format!("10.0.0.0/8\n{huge}/8\n"));
    let o = fibre(
        &["lookup", "--routes", routes.to_str().unwrap(), "1.1.1.1"],
        None,
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.len() < 300, "{} bytes of error", err.len());
    assert!(err.contains("huge.txt:2: \"1111"), "{err}");
    assert!(err.contains("(10485762 bytes)"), "{err}");
    let good = temp_file("good.txt", "10.0.0.0/8\n");
    let o = fibre(
        &["lookup", "--routes", good.to_str().unwrap()],
        Some(&format!("10.1.1.1\n{huge}\n")),
    );
    assert!(!o.status.success(), "a bad address fails the command");
    assert_eq!(stdout(&o), "10.1.1.1 10.0.0.0/8\n");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.len() < 300, "{} bytes of error", err.len());
    assert!(err.contains("standard input, line 2: \"1111"), "{err}");
}

#[test]
fn lookup_of_a_bad_address_argument_exits_non_zero() {
    let routes = temp_file("routes-arg.txt", ROUTES);
    let o = fibre(
        &[
            "lookup",
            "--routes",
            routes.to_str().unwrap(),
            "10.1.2.3",
            "10.1.2",
        ],
        None,
    );
    assert!(!o.status.success());
    assert_eq!(stdout(&o), "10.1.2.3 10.1.2.0/24\n");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("\"10.1.2\" is not an IPv4 or IPv6 address")
    );
}

#[test]
fn lookup_on_the_shipped_full_table() {
    let rib =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/ris-2026-05-11/rib-v4.txt.gz");
    let o = fibre(
        &[
            "lookup",
            "--routes",
            rib.to_str().unwrap(),
            "1.1.1.1",
            "8.8.8.8",
            "10.1.1.1",
        ],
        None,
    );
    assert!(o.status.success());
    assert_eq!(
        stdout(&o),
        "1.1.1.1 1.1.1.0/24\n8.8.8.8 8.8.8.0/24\n10.1.1.1 -\n"
    );
}

#[test]
fn bench_lookup_json_has_the_documented_keys() {
    let routes = temp_file("bench.txt", ROUTES);
    let updates = temp_file(
        "updates.txt",
        "A 10.2.0.0/16\nW 10.2.0.0/16\nA 2001:db8:5::/48\n",
    );
    let o = fibre(
        &[
            "bench",
            "lookup",
            "--routes",
            routes.to_str().unwrap(),
            "--updates",
            updates.to_str().unwrap(),
            "--threads",
            "2",
            "--json",
            "--count",
            "4096",
            "--repetitions",
            "3",
        ],
        None,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let figures: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let lookups: Vec<_> = figures.iter().filter(|f| f["metric"] == "lookup").collect();
    // 2 families x 2 address sets x 2 thread counts x 2 modes, plus, per family and mode,
    // the readers with the writer idle, on its own table, and on the shared one.
    assert_eq!(lookups.len(), 16 + 12);
    let under = |table: &str| {
        lookups
            .iter()
            .filter(|f| f["writer"] == true && f["writer_table"] == table)
            .count()
    };
    assert_eq!((under("private"), under("shared")), (4, 4));
    for f in &lookups {
        for key in [
            "engine",
            "family",
            "routes",
            "mode",
            "threads",
            "addresses",
            "mean_dev",
        ] {
            assert!(!f[key].is_null(), "{key} missing in {f}");
        }
        assert_eq!(f["engine"], "fibre");
        assert_eq!(f["form"], fibre_lpm::Form::best().name(), "{f}");
        assert!(f["family"] == 4 || f["family"] == 6);
        assert!(f["mode"] == "scalar" || f["mode"] == "batch");
        assert_figure(f, "ns_per_lookup");
        assert_figure(f, "throughput_ns");
    }
    assert_eq!(
        figures
            .iter()
            .find(|f| f["family"] == 4 && f["metric"] == "lookup")
            .unwrap()["routes"],
        4,
        "10.1.0.0/16 is withdrawn"
    );
    for metric in ["build", "memory", "insert", "remove", "updates"] {
        assert!(
            figures.iter().any(|f| f["metric"] == metric),
            "no {metric} figure"
        );
    }
}

#[test]
fn bench_lookup_names_the_structure_it_measures() {
    let routes = temp_file("bench3.txt", ROUTES);
    let structures = |extra: &[&str]| -> Vec<(u64, String)> {
        let mut args = vec![
            "bench",
            "lookup",
            "--routes",
            routes.to_str().unwrap(),
            "--json",
            "--count",
            "1024",
            "--repetitions",
            "3",
        ];
        args.extend_from_slice(extra);
        let o = fibre(&args, None);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let mut seen: Vec<(u64, String)> = stdout(&o)
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .map(|f| {
                let s = f["structure"].as_str().expect("every figure names it");
                (f["family"].as_u64().unwrap(), s.to_string())
            })
            .collect();
        seen.sort();
        seen.dedup();
        seen
    };
    let pair = |v4: &str, v6: &str| vec![(4, v4.to_string()), (6, v6.to_string())];
    // IPv6 uses the range tree where the CPU has the vector compares it is built on.
    let v6 = fibre_lpm::Structure::best::<u128>(fibre_lpm::Form::best()).name();
    assert_eq!(structures(&[]), pair("trie", v6));
    assert_eq!(structures(&["--structure", "trie"]), pair("trie", "trie"));
    assert_eq!(
        structures(&["--structure", "range-tree"]),
        pair("range tree", "range tree")
    );
}

#[test]
fn bench_lookup_forces_a_form_this_cpu_runs_and_refuses_others() {
    use fibre_lpm::Form;
    let routes = temp_file("bench-form.txt", ROUTES);
    for form in Form::ALL {
        let o = fibre(
            &[
                "bench",
                "lookup",
                "--routes",
                routes.to_str().unwrap(),
                "--json",
                "--count",
                "1024",
                "--repetitions",
                "3",
                "--form",
                form.name(),
            ],
            None,
        );
        if form.is_supported() {
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let forms: Vec<serde_json::Value> = stdout(&o)
                .lines()
                .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["form"].clone())
                .collect();
            assert!(!forms.is_empty() && forms.iter().all(|f| f == form.name()));
        } else {
            assert!(!o.status.success());
            assert_eq!(stdout(&o), "");
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(
                err.contains(&format!("this CPU cannot run the {form} form")),
                "{err}"
            );
        }
    }
}

/// `FIBRE_FORM` caps the form every table takes: `portable` makes fibre's figures the
/// portable form's; a value that names no form is said on standard error, and no cap.
#[test]
fn the_form_cap_in_the_environment_is_taken_or_named_as_wrong() {
    use fibre_lpm::Form;
    let routes = temp_file("bench-cap.txt", ROUTES);
    let run = |cap: &str| {
        let o = Command::new(env!("CARGO_BIN_EXE_fibre"))
            .args(["bench", "lookup", "--routes", routes.to_str().unwrap()])
            .args(["--json", "--count", "1024", "--repetitions", "3"])
            .env(fibre_lpm::FORM_CAP_VARIABLE, cap)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let mut forms: Vec<String> = stdout(&o)
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .map(|f| f["form"].as_str().unwrap().to_string())
            .collect();
        forms.dedup();
        (forms, String::from_utf8_lossy(&o.stderr).into_owned())
    };
    assert_eq!(run("portable").0, ["portable"]);
    let (forms, err) = run("sse9");
    let uncapped = Form::ALL
        .into_iter()
        .rev()
        .find(|f| f.is_supported())
        .unwrap();
    assert_eq!(forms, [uncapped.name()]);
    assert!(err.contains("FIBRE_FORM") && err.contains("sse9"), "{err}");
}

#[test]
fn bench_lookup_with_an_address_file_uses_its_name() {
    let routes = temp_file("bench2.txt", ROUTES);
    let addrs = temp_file("addrs.txt", "10.1.2.3\n# comment\n10.0.0.1\n");
    let o = fibre(
        &[
            "bench",
            "lookup",
            "--routes",
            routes.to_str().unwrap(),
            "--addresses",
            addrs.to_str().unwrap(),
            "--json",
            "--repetitions",
            "3",
        ],
        None,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lookups: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|f| f["metric"] == "lookup")
        .collect();
    assert_eq!(
        lookups.len(),
        2,
        "IPv4 only (the file has no IPv6 address): scalar and batch"
    );
    assert!(lookups
        .iter()
        .all(|f| f["addresses"] == "addrs.txt" && f["family"] == 4));
}

/// A small route file of both families for `fibre bench` runs.
fn bench_routes() -> PathBuf {
    let mut text = String::new();
    for i in 0..300 {
        text.push_str(&format!(
            "{}.{}.0.0/16\n{}.{}.{}.0/24\n",
            20 + i % 50,
            i / 50,
            20 + i % 50,
            i / 50,
            i % 200
        ));
        text.push_str(&format!(
            "2a0{}:{:x}::/32\n2a0{}:{:x}:{:x}::/48\n",
            i % 8,
            i,
            i % 8,
            i,
            i % 100
        ));
    }
    temp_file("bench-routes.txt", &text)
}

fn run_bench(extra: &[&str], out: &std::path::Path) -> Output {
    let routes = bench_routes();
    let mut args = vec![
        "bench",
        "--routes",
        routes.to_str().unwrap(),
        "--sizes",
        "10,100",
        "--count",
        "4096",
        "--repetitions",
        "3",
        "--threads",
        "2",
        "--kernel-count",
        "2048",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    fibre(&args, None)
}

fn figures(out: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out.join("figures.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn bench_without_the_kernel_writes_report_plots_and_figures() {
    let out = std::env::temp_dir().join(format!("fibre-bench-nk-{}", std::process::id()));
    let o = run_bench(&["--no-kernel"], &out);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert_eq!(
        stdout(&o),
        format!("{report}\n"),
        "the report is printed too"
    );
    assert!(report
        .contains("The kernel's side is missing: the kernel side was turned off (--no-kernel)"));
    assert!(
        report.contains("| engine | IPv | 10 | 100 | 600 |"),
        "{report}"
    );
    assert!(
        report.contains("| fibre scalar | 4 |") && report.contains("| prefix-trie | 6 |"),
        "{report}"
    );
    assert!(!report.contains("| kernel |"));
    for plot in [
        "table-size-ipv4.svg",
        "table-size-ipv6.svg",
        "threads-ipv4.svg",
        "threads-ipv6.svg",
    ] {
        assert!(
            std::fs::read_to_string(out.join(plot))
                .unwrap()
                .starts_with("<svg"),
            "{plot}"
        );
    }
    let figs = figures(&out);
    let lookups: Vec<_> = figs
        .iter()
        .filter(|f| f["metric"] == "lookup" && f["study"] != "dpdk")
        .collect();
    // Per family: 3 sizes + 2 thread counts + uniform = 6 runs, each fibre x2 and the peer.
    assert_eq!(lookups.len(), 2 * 6 * 3);
    assert!(lookups
        .iter()
        .all(|f| f["engine"] == "fibre" || f["engine"] == "prefix-trie"));
    for f in &lookups {
        assert_figure(f, "ns_per_lookup");
        assert_figure(f, "throughput_ns");
    }
    assert_dpdk_study(&report, &figs);
    std::fs::remove_dir_all(&out).unwrap();
}

/// The DPDK study of a `fibre bench` run: where the build has DPDK (`pkg-config` finds
/// `libdpdk`, as the bench crate's build script asks, and `FIBRE_NO_DPDK` is unset),
/// DPDK's figures beside fibre's in the report's table and in the figures, with the
/// ratios; where it has not, the one line saying why, and fibre's side alone.
fn assert_dpdk_study(report: &str, figs: &[serde_json::Value]) {
    let section = report
        .split("## fibre beside DPDK")
        .nth(1)
        .unwrap_or_else(|| panic!("no DPDK section: {report}"));
    assert!(
        section.contains("| | IPv4 batched | IPv4 one at a time | IPv6 batched | IPv6 one at a time | IPv4 dependent | IPv6 dependent |"),
        "{report}"
    );
    assert!(section.contains("| fibre |") && section.contains("| **DPDK / fibre** |"));
    let dpdk = |metric: &str| -> Vec<&serde_json::Value> {
        figs.iter()
            .filter(|f| f["study"] == "dpdk" && f["engine"] == "dpdk" && f["metric"] == metric)
            .collect()
    };
    let fibre = figs
        .iter()
        .filter(|f| f["study"] == "dpdk" && f["engine"] == "fibre" && f["metric"] == "lookup");
    // One at a time, batched and dependent, each family.
    assert_eq!(fibre.clone().count(), 2 * 3);
    for f in fibre {
        assert_figure(f, "ns_per_lookup");
    }
    let skipped = dpdk("skipped");
    let built = Command::new("pkg-config")
        .args(["--exists", "libdpdk"])
        .status()
        .is_ok_and(|s| s.success())
        && std::env::var_os("FIBRE_NO_DPDK").is_none();
    assert_eq!(skipped.is_empty(), built, "{skipped:?}");
    if skipped.is_empty() {
        let lookups = dpdk("lookup");
        assert_eq!(lookups.len(), 2 * 3, "{figs:?}");
        for f in &lookups {
            assert_figure(f, "ns_per_lookup");
        }
        for f in dpdk("memory") {
            assert!(
                f["tables_bytes"].as_u64().unwrap() >= 64 << 20
                    && f["total_bytes"].as_u64() >= f["tables_bytes"].as_u64(),
                "{f}"
            );
        }
        let ratios = dpdk("ratio");
        assert_eq!(ratios.len(), 2, "{figs:?}");
        for r in ratios {
            assert!(r["memory_lookup"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["cpu"].is_string(), "{r}");
        }
        assert!(
            section.contains("| **fibre / DPDK, lookup structures** |"),
            "{report}"
        );
        assert!(!section.contains("DPDK peer skipped"), "{report}");
    } else {
        let why = skipped[0]["reason"].as_str().unwrap();
        assert!(why.starts_with("DPDK peer skipped: "), "{why}");
        assert!(section.contains(&format!("**{why}.**")), "{report}");
        assert!(dpdk("lookup").is_empty());
    }
}

/// A figure that came out of a subtraction is a positive number, or null with the reason
/// beside it (`KEY_note`); never zero, negative or missing.
fn assert_figure(f: &serde_json::Value, key: &str) {
    match f[key].as_f64() {
        Some(v) => assert!(v.is_finite() && v > 0.0, "{key} in {f}"),
        None => {
            assert!(f[key].is_null(), "{key} in {f}");
            assert!(
                f.get(key).is_some() && f[format!("{key}_note")].is_string(),
                "{key} is null without a reason: {f}"
            );
        }
    }
}

/// True if `text` holds a negative number (a minus sign before a digit, not inside a
/// word such as "many-48") or a NaN or infinity.
fn has_impossible_number(text: &str) -> bool {
    let b = text.as_bytes();
    let negative = (0..b.len().saturating_sub(1)).any(|i| {
        b[i] == b'-' && b[i + 1].is_ascii_digit() && (i == 0 || !b[i - 1].is_ascii_alphanumeric())
    });
    negative
        || text
            .split(|c: char| !c.is_alphanumeric())
            .any(|w| matches!(w.to_lowercase().as_str(), "nan" | "inf" | "infinity"))
}

/// Update streams of each family for the routes of [`bench_routes`].
fn bench_updates() -> (PathBuf, PathBuf) {
    let (mut v4, mut v6) = (String::new(), String::new());
    for i in 0..40 {
        v4.push_str(&format!(
            "W {}.{}.0.0/16\nA {}.{}.0.0/16\nA 99.{i}.0.0/16\n",
            20 + i % 50,
            i / 50,
            20 + i % 50,
            i / 50
        ));
        v6.push_str(&format!(
            "W 2a0{}:{:x}::/32\nA 2a0{}:{:x}::/32\nA 2a0f:{i:x}::/32\n",
            i % 8,
            i,
            i % 8,
            i
        ));
    }
    (
        temp_file("bench-updates-v4.txt", &v4),
        temp_file("bench-updates-v6.txt", &v6),
    )
}

/// The rows of the report's updates section.
fn updates_rows(report: &str) -> Vec<String> {
    report
        .split("## Lookups while the real day of updates is applied")
        .nth(1)
        .unwrap_or("")
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| engine"))
        .map(str::to_string)
        .collect()
}

#[test]
fn bench_full_runs_with_an_update_stream_of_either_family_alone() {
    let (u4, u6) = bench_updates();
    for (stream, family) in [(&u4, "4"), (&u6, "6")] {
        let out =
            std::env::temp_dir().join(format!("fibre-bench-full{family}-{}", std::process::id()));
        let o = run_bench(
            &[
                "--no-kernel",
                "--full",
                "--many-sizes",
                "100",
                "--updates",
                stream.to_str().unwrap(),
            ],
            &out,
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let report = std::fs::read_to_string(out.join("report.md")).unwrap();
        assert!(!has_impossible_number(&report), "{report}");
        let rows = updates_rows(&report);
        // Scalar and batch, each with the writer idle, on its own table, on the shared one.
        assert_eq!(rows.len(), 6, "{report}");
        assert!(
            rows.iter()
                .all(|r| r.starts_with("| fibre (") && r.contains(&format!(") | {family} |"))),
            "{report}"
        );
        assert!(
            report.contains("## many-128: random /128 prefixes"),
            "{report}"
        );
        std::fs::remove_dir_all(&out).unwrap();
    }
}

#[test]
#[ignore = "needs root: measures the kernel in a network namespace"]
fn bench_as_root_measures_the_kernel_beside_fibre() {
    assert!(
        !fibre_kernel_unavailable(),
        "measuring the kernel needs root and iproute2"
    );
    let out = std::env::temp_dir().join(format!("fibre-bench-k-{}", std::process::id()));
    let o = run_bench(&[], &out);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(!report.contains("missing"), "{report}");
    for family in ["4", "6"] {
        assert!(
            report.contains(&format!("| kernel | {family} |")),
            "{report}"
        );
        assert!(
            report.contains(&format!("| **kernel / fibre scalar** | {family} |")),
            "{report}"
        );
        assert!(
            report.contains(&format!("| fibre (table-size) | {family} | 600 |")),
            "{report}"
        );
        assert!(
            report.contains(&format!("| kernel (table-size) | {family} | 600 |")),
            "{report}"
        );
    }
    let kernel: Vec<_> = figures(&out)
        .into_iter()
        .filter(|f| f["engine"] == "kernel" && f["metric"] == "lookup")
        .collect();
    assert_eq!(
        kernel.len(),
        2 * 6,
        "every study measured the kernel: {kernel:?}"
    );
    // A kernel lookup costs tens of nanoseconds at least, by its own clock; a figure
    // the noise of the tests beside this one swallowed is none, with its reason, and
    // most are figures.
    for family in [4, 6] {
        let of_family = kernel.iter().filter(|f| f["family"] == family);
        let measured = of_family
            .clone()
            .filter_map(|f| f["ns_per_lookup"].as_f64())
            .inspect(|&ns| assert!(ns > 10.0, "{kernel:?}"))
            .count();
        assert!(measured * 2 >= of_family.count(), "IPv{family}: {kernel:?}");
    }
    for f in &kernel {
        assert_figure(f, "ns_per_lookup");
        // Throughput is the wall clock's, with the figures it is made of beside it.
        assert_figure(f, "throughput_ns");
        for key in [
            "real_clock_ns",
            "dry_clock_ns",
            "real_wall_ns",
            "dry_wall_ns",
        ] {
            assert!(f[key].as_f64().unwrap() > 0.0, "{key} in {f}");
        }
        // The wall clock around a call sees at least what the kernel's clock inside it saw.
        assert!(
            f["real_wall_ns"].as_f64().unwrap() * f["threads"].as_f64().unwrap()
                >= f["real_clock_ns"].as_f64().unwrap() * 0.9,
            "{f}"
        );
    }
    // The kernel's memory: a positive figure, or none with the reason.
    let loads: Vec<_> = figures(&out)
        .into_iter()
        .filter(|f| f["engine"] == "kernel" && f["metric"] == "load")
        .collect();
    assert_eq!(loads.len(), 2 * 3, "{loads:?}");
    for f in &loads {
        match f["bytes_per_route"].as_f64() {
            Some(b) => assert!(b > 0.0 && f["slab_bytes"].as_u64().unwrap() > 0, "{f}"),
            None => assert!(f["slab_note"].is_string(), "{f}"),
        }
    }
    assert!(!has_impossible_number(&report), "{report}");
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
#[ignore = "needs root: measures the kernel in a network namespace while it is updated"]
fn bench_full_as_root_measures_the_kernel_under_updates_of_both_families() {
    assert!(
        !fibre_kernel_unavailable(),
        "measuring the kernel needs root and iproute2"
    );
    let out = std::env::temp_dir().join(format!("fibre-bench-kfull-{}", std::process::id()));
    let (u4, u6) = bench_updates();
    let o = run_bench(
        &[
            "--full",
            "--many-sizes",
            "100",
            "--updates",
            u4.to_str().unwrap(),
            "--updates",
            u6.to_str().unwrap(),
        ],
        &out,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(!has_impossible_number(&report), "{report}");
    let rows = updates_rows(&report);
    for family in ["4", "6"] {
        let kernel: Vec<_> = rows
            .iter()
            .filter(|r| r.starts_with(&format!("| kernel | {family} | scalar | 1 |")))
            .collect();
        assert_eq!(kernel.len(), 2, "idle and applying updates: {report}");
        assert!(
            kernel[1].contains("| applying updates |") && !kernel[1].ends_with("| – |"),
            "{report}"
        );
    }
    let errors: Vec<_> = figures(&out)
        .into_iter()
        .filter(|f| f["metric"] == "error")
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
#[ignore = "needs root: switches to the unprivileged user nobody (with setpriv)"]
fn bench_as_an_ordinary_user_says_why_the_kernel_is_missing() {
    assert!(
        !fibre_kernel_unavailable() && Command::new("setpriv").arg("--version").output().is_ok(),
        "needs root, iproute2 and setpriv to run fibre as an ordinary user"
    );
    let out = std::env::temp_dir().join(format!("fibre-bench-u-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    Command::new("chmod")
        .args(["777", out.to_str().unwrap()])
        .status()
        .unwrap();
    let routes = bench_routes();
    Command::new("chmod")
        .args(["-R", "a+rX", routes.parent().unwrap().to_str().unwrap()])
        .status()
        .unwrap();
    // A copy of the binary the unprivileged user can reach wherever the build lives.
    let exe = out.join("fibre");
    std::fs::copy(env!("CARGO_BIN_EXE_fibre"), &exe).unwrap();
    Command::new("chmod")
        .args(["755", exe.to_str().unwrap()])
        .status()
        .unwrap();
    let o = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            exe.to_str().unwrap(),
        ])
        .args([
            "bench",
            "--routes",
            routes.to_str().unwrap(),
            "--sizes",
            "10",
            "--count",
            "2048",
            "--repetitions",
            "3",
            "--threads",
            "1",
            "--out",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("the kernel's side is missing: measuring the kernel needs root"),
        "{err}"
    );
    assert!(stdout(&o).contains("| fibre scalar | 4 |"));
    std::fs::remove_dir_all(&out).unwrap();
}

/// True unless this test runs as root with iproute2 (what the kernel side needs).
fn fibre_kernel_unavailable() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout == b"0\n")
        .unwrap_or(false);
    !root || Command::new("ip").arg("-V").output().is_err()
}

/// `fibre route get --config CONF ADDR`, which must fail and print nothing: what it
/// says on standard error.
fn route_get_refused(conf: &std::path::Path, addr: &str) -> String {
    let out = fibre(
        &["route", "get", "--config", conf.to_str().unwrap(), addr],
        None,
    );
    assert!(!out.status.success());
    assert!(stdout(&out).is_empty());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The router configuration `fibre forward` takes, `neigh add` lines and all, answers
/// `fibre route get` too; a bad neighbour line is named by file and line.
#[test]
fn route_get_takes_a_forwarding_config_with_its_neighbours() {
    let conf = temp_file(
        "forwarding.conf",
        "link add a0 type veth peer name a1\nlink set a0 up\nlink set a1 up\n\
         addr add 10.0.0.1/24 dev a0\nneigh add 10.0.0.2 lladdr 02:00:00:00:00:02 dev a0\n\
         route add 10.2.0.0/16 via 10.0.0.2\n",
    );
    let out = fibre(
        &[
            "route",
            "get",
            "--config",
            conf.to_str().unwrap(),
            "10.2.3.4",
            "--json",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v[0]["gateway"], "10.0.0.2");
    let bad = temp_file(
        "bad-neigh.conf",
        "link add a0 type veth peer name a1\nneigh add 10.0.0.2 lladdr 02:00:00:00:00:02 dev b9\n",
    );
    let err = route_get_refused(&bad, "10.0.0.2");
    assert!(err.contains("bad-neigh.conf:2: dev: no link b9"), "{err}");
    // A file that stops being text is named with the line where it does.
    let path = std::env::temp_dir().join(format!("fibre-cli-{}-binary.conf", std::process::id()));
    std::fs::write(&path, b"link set lo up\nroute add \xff\xfe\n").unwrap();
    let err = route_get_refused(&path, "127.0.0.1");
    assert!(err.contains("binary.conf:2: not UTF-8 text"), "{err}");
}

#[test]
fn route_get_answers_from_a_config_and_a_bad_line_names_file_and_line() {
    let conf = temp_file(
        "router.conf",
        "link set lo up\nlink add a0 type veth peer name a1\nlink set a0 up\nlink set a1 up\n\
         addr add 10.0.0.1/24 dev a0\nroute add 10.2.0.0/16 via 10.0.0.2 table 100\n\
         rule add to 10.2.0.0/16 lookup 100 pref 1000\nroute add blackhole 10.3.0.0/16\n",
    );
    let conf = conf.to_str().unwrap();
    let out = fibre(
        &["route", "get", "--config", conf, "10.2.3.4", "--json"],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v[0]["gateway"], "10.0.0.2");
    assert_eq!(v[0]["table"], "100");
    assert_eq!(v[0]["prefsrc"], "10.0.0.1");
    let out = fibre(&["route", "get", "--config", conf, "10.3.0.1"], None);
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "RTNETLINK answers: Invalid argument"
    );

    // The second line is wrong: the load stops there, naming it, and answers nothing.
    let bad = temp_file(
        "bad.conf",
        "link set lo up\nroute add 10.0.0.0/8 via 1.2.3.4\nroute add 10.9.0.0/16 dev lo\n",
    );
    let err = route_get_refused(&bad, "127.0.0.1");
    assert!(
        err.contains("bad.conf:2: Error: Nexthop has invalid gateway."),
        "{err}"
    );
}

/// A small table for `fibre bench rules`: /24s and /48s away from the router's subnets.
fn rules_routes() -> PathBuf {
    let mut text = String::new();
    for i in 0..120 {
        text += &format!("20.{}.{}.0/24\n", i / 10, i % 10);
    }
    for i in 0..60 {
        text += &format!("2001:db8:{i:x}::/48\n");
    }
    temp_file("rules-routes.txt", &text)
}

fn bench_rules(kernel: bool) -> Vec<serde_json::Value> {
    let routes = rules_routes();
    let out = std::env::temp_dir().join(format!("fibre-rules-{}-{kernel}", std::process::id()));
    let mut args = vec![
        "bench",
        "rules",
        "--routes",
        routes.to_str().unwrap(),
        "--sample",
        "150",
        "--rules",
        "12,40",
        "--count",
        "2048",
        "--kernel-count",
        "512",
        "--repetitions",
        "3",
        "--json",
        "--out",
        out.to_str().unwrap(),
    ];
    if !kernel {
        args.push("--no-kernel");
    }
    let o = fibre(&args, None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        report.contains("Cost per `from` rule (12 to 40 rules)"),
        "{report}"
    );
    assert!(report.contains("| source routes | 0 |"), "{report}");
    stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn bench_rules_measures_every_case_of_both_families() {
    let figures = bench_rules(false);
    for family in [4, 6] {
        for (case, rules) in [("default", 0), ("from", 12), ("from", 40), ("dport", 40)] {
            for mode in ["scalar", "batch"] {
                assert!(
                    figures.iter().any(|f| f["family"] == family
                        && f["engine"] == "fibre"
                        && f["case"] == case
                        && f["rules"] == rules
                        && f["mode"] == mode),
                    "IPv{family} {case} {rules} {mode}"
                );
            }
        }
    }
    assert!(!figures.iter().any(|f| f["engine"] == "kernel"));
}

#[test]
#[ignore = "needs root: loads the same rules into the kernel of a network namespace"]
fn bench_rules_measures_the_kernel_with_the_same_rules() {
    let figures = bench_rules(true);
    for family in [4, 6] {
        for (case, rules) in [("default", 0), ("from", 40), ("dport", 40)] {
            let kernel = figures
                .iter()
                .find(|f| {
                    f["family"] == family
                        && f["engine"] == "kernel"
                        && f["case"] == case
                        && f["rules"] == rules
                })
                .unwrap_or_else(|| panic!("no kernel figure for IPv{family} {case} {rules}"));
            assert_eq!(kernel["metric"], "lookup", "{kernel}");
        }
    }
}

#[test]
fn route_show_lists_as_ip_route_show_does() {
    // The lines the kernel printed for the same configuration (`ip route show` and
    // `ip -6 route show`; a0's peer is down, so a0 has no carrier).
    let config = temp_file(
        "show.conf",
        "link add a0 type veth peer name a1
link set a0 up
addr add 10.0.0.1/24 dev a0
-6 addr add 2001:db8::1/64 dev a0 nodad
route add 10.4.0.0/16 via 10.0.0.2 dev a0 onlink mtu 1400
route add 10.5.0.0/16 nexthop via 10.0.0.2 nexthop via 10.0.0.3
route add throw 10.8.0.0/16
-6 route add 2001:db8:5::/48 nexthop via 2001:db8::2 nexthop via 2001:db8::3
-6 route add prohibit 2001:db8:7::/48
",
    );
    let config = config.to_str().unwrap();
    let o = fibre(&["route", "show", "--config", config], None);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(
        stdout(&o),
        "10.0.0.0/24 dev a0 proto kernel scope link src 10.0.0.1 linkdown
10.4.0.0/16 via 10.0.0.2 dev a0 onlink linkdown mtu 1400
10.5.0.0/16 linkdown
\tnexthop via 10.0.0.2 dev a0 weight 1 linkdown
\tnexthop via 10.0.0.3 dev a0 weight 1 linkdown
throw 10.8.0.0/16
"
    );
    let o = fibre(&["route", "show", "--config", config, "-6"], None);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(
        stdout(&o),
        "2001:db8::/64 dev a0 proto kernel metric 256 linkdown pref medium
2001:db8:5::/48 metric 1024 pref medium
\tnexthop via 2001:db8::2 dev a0 weight 1 linkdown
\tnexthop via 2001:db8::3 dev a0 weight 1 linkdown
prohibit 2001:db8:7::/48 dev lo metric 1024 pref medium
"
    );
}

#[test]
fn a_listing_cut_short_by_its_reader_ends_quietly() {
    use std::io::{BufRead, BufReader, Read};
    let mut text =
        String::from("link add a0 type dummy\nlink set a0 up\naddr add 10.0.0.1/24 dev a0\n");
    for i in 0..20_000 {
        text += &format!("route add 11.{}.{}.0/24 via 10.0.0.2\n", i / 256, i % 256);
    }
    let config = temp_file("many.conf", &text);
    let mut child = Command::new(env!("CARGO_BIN_EXE_fibre"))
        .args(["route", "show", "--config", config.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fibre runs");
    // Read one line, then close the pipe as `head -1` does.
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert_eq!(
        first,
        "10.0.0.0/24 dev a0 proto kernel scope link src 10.0.0.1\n"
    );
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(status.code().is_some(), "{status:?}: killed, not ended");
    assert!(err.is_empty(), "nothing on standard error: {err}");
}

#[test]
#[ignore = "needs root: loads routes into a network namespace and mirrors it"]
fn bench_mirror_syncs_and_follows_a_burst_on_a_sample_of_the_tables() {
    let out_dir = std::env::temp_dir().join(format!("fibre-mirror-{}", std::process::id()));
    let out = fibre(
        &[
            "bench",
            "mirror",
            "--sample",
            "2000",
            "--updates",
            "400",
            "--paced",
            "40",
            "--json",
            "--out",
            out_dir.to_str().unwrap(),
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let f: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(f["routes_v4"], 2000);
    assert_eq!(f["routes_v6"], 2000);
    // The sample and the kernel's own routes (the namespace's links and addresses).
    let mirrored = f["routes_mirrored"].as_u64().unwrap();
    assert!((4000..4100).contains(&mirrored), "{f}");
    assert_eq!(f["updates"], 401);
    assert!(f["publications"].as_u64().unwrap() >= 1, "{f}");
    for k in ["kernel_dump_s", "sync_s", "caught_up_s", "busy_cpu_s"] {
        let v = f[k].as_f64().unwrap();
        assert!(v > 0.0 && v.is_finite(), "{k}: {f}");
    }
    assert!(f["sync_s"].as_f64() >= f["sync_dump_s"].as_f64(), "{f}");
    // Each the median of the rounds, within their range.
    assert_eq!(f["sync_rounds"], 5, "{f}");
    // Route changes are published by patches, never by compiling the state anew.
    assert!(f["patched"].as_u64().unwrap() >= 1, "{f}");
    assert_eq!(f["compiled"], 0, "{f}");
    assert_eq!(f["paced_updates"], 41);
    let paced = f["paced_publications"].as_u64().unwrap();
    assert!(paced >= 1, "{f}");
    assert_eq!(f["paced_patched"].as_u64(), Some(paced), "{f}");
    assert!(f["paced_lag_p99_s"].as_f64().unwrap() > 0.0, "{f}");
    // The memory of each part, and a single change of each kind, each published.
    for k in [
        "state_bytes_per_route",
        "snapshot_routes_bytes_per_route",
        "snapshot_lookup_bytes_per_route",
    ] {
        assert!(f[k].as_f64().unwrap() > 0.0, "{k}: {f}");
    }
    let kinds = f["single_changes"].as_array().unwrap();
    assert_eq!(kinds.len(), 13, "{f}");
    // The kinds that can be made again are made a hundred times; the first route after
    // the setup, IPv4's first rule and the route right after it, once.
    let once = [0, 5, 6];
    for (i, k) in kinds.iter().enumerate() {
        let times = if once.contains(&i) { 1 } else { 100 };
        assert_eq!(k["changes"], times, "{k}");
        let published = k["patched"].as_u64().unwrap() + k["compiled"].as_u64().unwrap();
        assert!(published >= times, "{k}");
        // Each change's lag; its median, 99th of a hundred and largest among them.
        let mut lags: Vec<f64> = k["lags_s"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l.as_f64().unwrap())
            .collect();
        assert_eq!(lags.len() as u64, times, "{k}");
        assert!(lags.iter().all(|&l| l > 0.0), "{k}");
        lags.sort_by(f64::total_cmp);
        let p99 = lags[(lags.len() * 99).div_ceil(100) - 1];
        assert_eq!(k["lag_p99_s"].as_f64(), Some(p99), "{k}");
        assert_eq!(k["lag_max_s"].as_f64(), lags.last().copied(), "{k}");
        assert!(lags.contains(&k["lag_p50_s"].as_f64().unwrap()), "{k}");
        // Every kind is patched: routes, addresses, a nexthop object, rules (IPv4's
        // first, which parts `local` from `main`, among them), tables, a link.
        assert_eq!(k["compiled"], 0, "{k}");
        assert!(k["kernel_command_s"].as_f64().unwrap() > 0.0, "{k}");
        // The kernel reports an object's routes again when the object changes: the
        // mirror drops them in batches that publish nothing, which have no lag.
        let unpublished = k["unpublished_max_s"].as_f64().unwrap();
        if i == 4 {
            assert!(unpublished > 0.0, "{k}");
        } else {
            assert!(unpublished >= 0.0, "{k}");
        }
    }
    // As the daemon's mirror, as root.
    assert_eq!(
        f["mirror_priority"], "the lowest real-time (`SCHED_FIFO` 1), as the daemon's",
        "{f}"
    );
    let report = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    assert!(report.contains("The sync takes"), "{report}");
    assert!(
        report.contains("runs at the lowest real-time (`SCHED_FIFO` 1)"),
        "{report}"
    );
    assert!(
        report.contains("| a nexthop object carrying 100,000 routes |"),
        "{report}"
    );
}
