//! Reports of a `fibre bench` run: tables in Markdown, and plots in SVG.
//!
//! Rows are engine and family, columns the table size or the thread count, cells
//! nanoseconds per lookup, and a row of kernel/fibre ratios under each family. Plots put
//! the table size on a log x axis (or threads on a linear one) and ns per lookup on a log
//! y axis, since the engines are orders apart.
//!
//! Every figure shown is a positive quantity (a time, a rate, bytes). A figure that is
//! null in the run's figures (one the run could not trust, with its reason in a `_note`
//! field), or that is zero, negative or not finite (impossible), is shown as "–" with a
//! footnote saying why, never as a number.

use plotters::prelude::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// A row of a report table: an engine in a mode.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
struct Row {
    order: u8,
    engine: &'static str,
    mode: &'static str,
}

const ROWS: [Row; 4] = [
    Row {
        order: 0,
        engine: "fibre",
        mode: "scalar",
    },
    Row {
        order: 1,
        engine: "fibre",
        mode: "batch",
    },
    Row {
        order: 2,
        engine: "prefix-trie",
        mode: "scalar",
    },
    Row {
        order: 3,
        engine: "kernel",
        mode: "scalar",
    },
];

fn label(r: &Row) -> String {
    match r.engine {
        "fibre" => format!("fibre {}", r.mode),
        e => e.to_string(),
    }
}

/// Why a figure the run recorded as a number is not shown.
const IMPOSSIBLE: &str = "the run recorded zero, a negative or a non-finite value here, \
    which no real time, rate or size can be: not shown";
/// Why a figure the run recorded as null, without a reason, is not shown.
const UNRECORDED: &str = "the run recorded no figure here";

/// A cell of a report table: a figure and its mean deviation, or why there is none.
#[derive(Clone, Debug, PartialEq)]
enum Cell {
    Figure(f64, Option<f64>),
    NoFigure(String),
}

/// The cell of field `key` of figure `f` (its mean deviation in `dev_key`, the reason it
/// is missing in `note_key`); `None` if the figure does not have the field at all.
fn cell(f: &Value, key: &str, dev_key: &str, note_key: &str) -> Option<Cell> {
    let note = || f[note_key].as_str().unwrap_or(UNRECORDED).to_string();
    match f.get(key)? {
        Value::Null => Some(Cell::NoFigure(note())),
        v => match v.as_f64() {
            Some(x) if x.is_finite() && x > 0.0 => {
                let dev = f[dev_key].as_f64().filter(|d| d.is_finite() && *d >= 0.0);
                Some(Cell::Figure(x, dev))
            }
            _ => Some(Cell::NoFigure(IMPOSSIBLE.into())),
        },
    }
}

/// The note key of a lookup figure's field.
fn note_key(value: &str) -> &'static str {
    match value {
        "throughput_ns" => "throughput_ns_note",
        _ => "ns_per_lookup_note",
    }
}

/// The deviation key of a lookup figure's field.
fn dev_key(value: &str) -> &'static str {
    match value {
        "throughput_ns" => "throughput_mean_dev",
        _ => "mean_dev",
    }
}

/// The footnotes of a section: the reasons figures are missing, numbered in order.
#[derive(Default)]
struct Notes(Vec<String>);

impl Notes {
    /// "–" marked with the number of the footnote holding `why`.
    fn mark(&mut self, why: &str) -> String {
        let n = match self.0.iter().position(|w| w == why) {
            Some(i) => i + 1,
            None => {
                self.0.push(why.to_string());
                self.0.len()
            }
        };
        format!("–{}", superscript(n))
    }

    /// The text of a cell.
    fn show(&mut self, c: Option<&Cell>, show: impl Fn(f64, Option<f64>) -> String) -> String {
        match c {
            None => "–".into(),
            Some(Cell::Figure(v, d)) => show(*v, *d),
            Some(Cell::NoFigure(why)) => self.mark(why),
        }
    }

    /// Writes the footnotes (if any) and starts afresh.
    fn write(&mut self, out: &mut String) {
        for (i, why) in self.0.drain(..).enumerate() {
            let _ = writeln!(out, "{} {why}.\n", superscript(i + 1));
        }
    }
}

fn superscript(n: usize) -> String {
    const DIGITS: [char; 10] = ['⁰', '¹', '²', '³', '⁴', '⁵', '⁶', '⁷', '⁸', '⁹'];
    n.to_string()
        .bytes()
        .map(|b| DIGITS[usize::from(b - b'0')])
        .collect()
}

/// Lookup figures of one study and family: row -> column -> cell.
type Grid = BTreeMap<Row, BTreeMap<u64, Cell>>;

fn grid(figures: &[Value], study: &str, family: u64, column: &str, value: &str) -> Grid {
    let mut g = Grid::new();
    for f in figures {
        if f["metric"] != "lookup"
            || f["study"] != study
            || f["family"] != family
            || f["writer"] == true
        {
            continue;
        }
        let Some(row) = ROWS
            .iter()
            .find(|r| f["engine"] == r.engine && f["mode"] == r.mode)
        else {
            continue;
        };
        if let (Some(c), Some(cell)) = (
            f[column].as_u64(),
            cell(f, value, dev_key(value), note_key(value)),
        ) {
            g.entry(*row).or_default().insert(c, cell);
        }
    }
    g
}

fn ns(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// A figure and its deviation, as a cell shows them.
fn ns_dev(v: f64, d: Option<f64>) -> String {
    match d {
        Some(d) => format!("{} ±{}", ns(v), ns(d)),
        None => ns(v),
    }
}

fn human(n: u64) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

/// A Markdown table of `grid`, with kernel/fibre ratio rows when both are present.
fn table(
    out: &mut String,
    notes: &mut Notes,
    g: &Grid,
    family: u64,
    header: &str,
    columns: &[u64],
) {
    let _ = write!(out, "| engine | IPv |");
    for c in columns {
        let _ = write!(
            out,
            " {} |",
            if header == "threads" {
                c.to_string()
            } else {
                human(*c)
            }
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "|---|---|{}", "---:|".repeat(columns.len()));
    for (row, cells) in g {
        let _ = write!(out, "| {} | {family} |", label(row));
        for c in columns {
            let text = notes.show(cells.get(c), ns_dev);
            let _ = write!(out, " {text} |");
        }
        let _ = writeln!(out);
    }
    if let Some(kernel) = g.get(&ROWS[3]) {
        for fibre_row in &ROWS[..2] {
            let Some(fibre) = g.get(fibre_row) else {
                continue;
            };
            let _ = write!(out, "| **kernel / {}** | {family} |", label(fibre_row));
            for c in columns {
                match (kernel.get(c), fibre.get(c)) {
                    (Some(Cell::Figure(k, _)), Some(Cell::Figure(f, _))) => {
                        let _ = write!(out, " **{:.0}×** |", k / f);
                    }
                    _ => out.push_str(" – |"),
                }
            }
            let _ = writeln!(out);
        }
    }
    let _ = writeln!(out);
}

fn columns(g: &Grid) -> Vec<u64> {
    let mut c: Vec<u64> = g.values().flat_map(|m| m.keys().copied()).collect();
    c.sort_unstable();
    c.dedup();
    c
}

/// The CPU's model name and the number of CPUs, as reports name the machine.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .map(|m| {
            format!(
                "{m}, {} CPUs",
                std::thread::available_parallelism().map_or(1, |n| n.get())
            )
        })
        .unwrap_or_else(|| "an unknown CPU".into())
}

/// The figure of `study` with `engine`, `family` and `metric` (and `mode`, if given).
fn find<'a>(
    figures: &'a [Value],
    study: &str,
    engine: &str,
    family: u64,
    metric: &str,
    mode: Option<&str>,
) -> Option<&'a Value> {
    figures.iter().find(|f| {
        f["study"] == study
            && f["engine"] == engine
            && f["family"] == family
            && f["metric"] == metric
            && mode.is_none_or(|m| f["mode"] == m)
    })
}

fn mib(bytes: f64) -> String {
    format!("{:.1} MiB", bytes / 1_048_576.0)
}

/// The DPDK study's section: DPDK's FIBs beside fibre on the whole tables, ns a lookup
/// in the four columns of issue 38 and dependent lookups, DPDK / fibre, memory; or the
/// line saying why DPDK was skipped.
fn dpdk_section(out: &mut String, notes: &mut Notes, figures: &[Value]) {
    let study = "dpdk";
    if !figures.iter().any(|f| f["study"] == study) {
        return;
    }
    let fams: Vec<u64> = [4u64, 6]
        .into_iter()
        .filter(|&fam| {
            figures
                .iter()
                .any(|f| f["study"] == study && f["family"] == fam)
        })
        .collect();
    let mem = |engine: &str, fam: u64| find(figures, study, engine, fam, "memory", None);
    let version = fams
        .iter()
        .find_map(|&fam| mem("dpdk", fam)?["dpdk_version"].as_str())
        .map_or("DPDK".to_string(), |v| format!("DPDK {v}"));
    let cpu = fams
        .iter()
        .find_map(|&fam| find(figures, study, "dpdk", fam, "ratio", None)?["cpu"].as_str())
        .map_or_else(cpu_model, str::to_string);
    let _ = writeln!(out, "## fibre beside DPDK\n\nThe whole tables, the same matched addresses, one thread, on {cpu}; ns per lookup, dry run subtracted, the engines taking turns repetition by repetition. {version}: `rte_fib` (DIR-24-8) for IPv4, `rte_fib6` (trie) for IPv6, 4-byte next hops, no hugepages. One at a time: `rte_fib_lookup_bulk` with n = 1 (DPDK's `n=1`) and fibre's `lookup`; batched: calls of 64 addresses; dependent: each address changed by the previous answer, so that lookups cannot overlap (their latency). **DPDK / fibre** above 1: fibre is ahead.\n");
    let mut skipped: Vec<&str> = figures
        .iter()
        .filter(|f| f["study"] == study && f["metric"] == "skipped")
        .filter_map(|f| f["reason"].as_str())
        .collect();
    skipped.dedup();
    for why in &skipped {
        let _ = writeln!(out, "**{why}.**\n");
    }
    let lookups = |engine: &str, fam: u64, mode: &str| {
        find(figures, study, engine, fam, "lookup", Some(mode))
            .and_then(|f| cell(f, "ns_per_lookup", "mean_dev", "ns_per_lookup_note"))
    };
    let columns: Vec<(u64, &str, &str)> = fams
        .iter()
        .flat_map(|&fam| [(fam, "batch", "batched"), (fam, "scalar", "one at a time")])
        .chain(fams.iter().map(|&fam| (fam, "dependent", "dependent")))
        .collect();
    let _ = write!(out, "| |");
    for (fam, _, name) in &columns {
        let _ = write!(out, " IPv{fam} {name} |");
    }
    let _ = writeln!(out, "\n|---|{}", "---:|".repeat(columns.len()));
    for (engine, label) in [("dpdk", version.as_str()), ("fibre", "fibre")] {
        let _ = write!(out, "| {label} |");
        for &(fam, mode, _) in &columns {
            let text = notes.show(lookups(engine, fam, mode).as_ref(), ns_dev);
            let _ = write!(out, " {text} |");
        }
        let _ = writeln!(out);
    }
    let _ = write!(out, "| **DPDK / fibre** |");
    for &(fam, mode, _) in &columns {
        match (lookups("dpdk", fam, mode), lookups("fibre", fam, mode)) {
            (Some(Cell::Figure(d, _)), Some(Cell::Figure(f, _))) => {
                let _ = write!(out, " **{:.2}×** |", d / f);
            }
            _ => out.push_str(" – |"),
        }
    }
    let _ = writeln!(out, "\n");
    let functions: Vec<String> = fams
        .iter()
        .filter_map(|&fam| {
            let f = mem("dpdk", fam)?;
            Some(format!(
                "IPv{fam} {} lookups, {} tbl8 groups configured (the fewest, within a \
                 thirty-second, that take every route), {} filled, built in {:.2} s",
                f["lookup_fn"].as_str().unwrap_or("?"),
                f["num_tbl8"],
                f["tbl8_needed"],
                f["build_seconds"].as_f64().unwrap_or(f64::NAN)
            ))
        })
        .collect();
    if !functions.is_empty() {
        let _ = writeln!(out, "DPDK: {}.\n", functions.join("; "));
    }
    let _ = write!(out, "| memory |");
    for fam in &fams {
        let _ = write!(out, " IPv{fam} |");
    }
    let _ = writeln!(out, "\n|---|{}", "---:|".repeat(fams.len()));
    type Bytes<'a> = &'a dyn Fn(u64) -> Option<f64>;
    let bytes = |engine: &'static str, key: &'static str| {
        move |fam: u64| mem(engine, fam).and_then(|f| f[key].as_f64())
    };
    let (d_tables, d_total) = (bytes("dpdk", "tables_bytes"), bytes("dpdk", "total_bytes"));
    let d_needed = bytes("dpdk", "tables_needed_bytes");
    let (f_lookup, f_total) = (
        bytes("fibre", "lookup_bytes"),
        bytes("fibre", "total_bytes"),
    );
    let r_lookup = |fam: u64| Some(f_lookup(fam)? / d_tables(fam)?);
    let r_total = |fam: u64| Some(f_total(fam)? / d_total(fam)?);
    let r_needed = |fam: u64| Some(f_lookup(fam)? / d_needed(fam)?);
    let rows: [(&str, Bytes<'_>, bool); 8] = [
        (
            "DPDK lookup tables (tbl24 and tbl8 groups, as configured)",
            &d_tables,
            false,
        ),
        (
            "DPDK lookup tables with only the groups the routes fill",
            &d_needed,
            false,
        ),
        (
            "DPDK all (its heap's growth: the tables and the route tree)",
            &d_total,
            false,
        ),
        ("fibre lookup structure", &f_lookup, false),
        (
            "fibre all (lookup structure and update side)",
            &f_total,
            false,
        ),
        ("**fibre / DPDK, lookup structures**", &r_lookup, true),
        (
            "**fibre / DPDK, lookup structures (groups filled)**",
            &r_needed,
            true,
        ),
        ("**fibre / DPDK, all**", &r_total, true),
    ];
    for (label, value, is_ratio) in rows {
        let _ = write!(out, "| {label} |");
        for &fam in &fams {
            let text = match value(fam) {
                Some(v) if v.is_finite() && v > 0.0 && is_ratio => format!("**{v:.3}**"),
                Some(v) if v.is_finite() && v > 0.0 => mib(v),
                _ => "–".into(),
            };
            let _ = write!(out, " {text} |");
        }
        let _ = writeln!(out);
    }
    let _ = writeln!(out);
    notes.write(out);
}

/// The Markdown report of a run.
pub fn markdown(figures: &[Value], kernel_missing: Option<&str>, header: &str) -> String {
    let mut out = String::new();
    let mut notes = Notes::default();
    let _ = writeln!(out, "# fibre bench\n\n{header}\n");
    if let Some(why) = kernel_missing {
        let _ = writeln!(out, "**The kernel's side is missing: {why}.**\n");
    }
    let families: Vec<u64> = [4u64, 6]
        .into_iter()
        .filter(|f| figures.iter().any(|x| x["family"] == *f))
        .collect();

    let _ = writeln!(out, "## Lookup cost against table size\n\nns per lookup, one thread, matched addresses (random routes of the real table; the last column is the whole table). Dry run subtracted; ± is the mean deviation; a figure the subtraction leaves untrustworthy is shown as –, with the reason below the table. The kernel's figures are its own clock's, around its loop of lookups.\n");
    for &fam in &families {
        let g = grid(figures, "table-size", fam, "routes", "ns_per_lookup");
        if !g.is_empty() {
            table(&mut out, &mut notes, &g, fam, "routes", &columns(&g));
        }
    }
    notes.write(&mut out);
    let _ = writeln!(out, "## Lookup cost against threads\n\nThe whole table, matched addresses; ns per lookup as throughput, measured the same way for every engine: the threads run at once, and the wall time from the first thread's start to the last one's end is divided by all lookups of all threads, less the dry run's figure measured the same way. For the kernel that wall time is around its `BPF_PROG_TEST_RUN` calls, so it also holds each call's fixed costs (the system call, swapping the program into the XDP dispatcher), which the dry run pays too and the lookups per call amortise. Past the CPU count, threads share CPUs.\n");
    for &fam in &families {
        let g = grid(figures, "threads", fam, "threads", "throughput_ns");
        if !g.is_empty() {
            table(&mut out, &mut notes, &g, fam, "threads", &columns(&g));
        }
    }
    notes.write(&mut out);
    let _ = writeln!(out, "## From BGP: the whole table, matched and uniform addresses\n\nns per lookup, one thread.\n");
    let _ = writeln!(
        out,
        "| engine | IPv | matched | uniform |\n|---|---|---:|---:|"
    );
    for &fam in &families {
        let matched = grid(figures, "threads", fam, "threads", "ns_per_lookup");
        let uniform = grid(figures, "from-bgp", fam, "threads", "ns_per_lookup");
        for row in ROWS {
            let m = matched.get(&row).and_then(|c| c.get(&1));
            let u = uniform.get(&row).and_then(|c| c.get(&1));
            if m.is_some() || u.is_some() {
                let m = notes.show(m, ns_dev);
                let u = notes.show(u, ns_dev);
                let _ = writeln!(out, "| {} | {fam} | {m} | {u} |", label(&row));
            }
        }
    }
    let _ = writeln!(out);
    notes.write(&mut out);
    dpdk_section(&mut out, &mut notes, figures);
    let _ = writeln!(out, "## Loading the table\n\nfibre: bulk build and incremental inserts, bytes of lookup and update structures per route. Kernel: `ip -batch` of `route add` lines, and the growth of the kernel's slab memory (machine-wide, so shown only where the growth stands clearly above the counter's noise).\n");
    let _ = writeln!(out, "| engine | IPv | routes | routes/s (bulk or ip -batch) | inserts/s | removals/s | bytes/route |\n|---|---|---:|---:|---:|---:|---:|");
    for f in figures.iter().filter(|f| f["metric"] == "load") {
        let get = |f: &Value, k: &str, note: &str| cell(f, k, "", note);
        // The kernel's deletion of the same table, when measured (--full).
        let removals = get(f, "remove_per_sec", "").or_else(|| {
            figures
                .iter()
                .find(|d| {
                    d["metric"] == "delete"
                        && d["study"] == f["study"]
                        && d["engine"] == f["engine"]
                        && d["family"] == f["family"]
                        && d["routes"] == f["routes"]
                })
                .and_then(|d| get(d, "routes_per_sec", ""))
        });
        let rate = |v: f64, _| format!("{v:.0}");
        let cells = [
            get(f, "routes_per_sec", ""),
            get(f, "insert_per_sec", ""),
            removals,
            get(f, "bytes_per_route", "slab_note"),
        ]
        .map(|c| notes.show(c.as_ref(), rate));
        let routes = f["routes"].as_u64().map_or("?".into(), |r| r.to_string());
        let _ = writeln!(
            out,
            "| {} ({}) | {} | {routes} | {} |",
            f["engine"].as_str().unwrap_or(""),
            f["study"].as_str().unwrap_or(""),
            f["family"],
            cells.join(" | "),
        );
    }
    let _ = writeln!(out);
    notes.write(&mut out);
    for study in ["many-48", "many-128"] {
        let g = grid(figures, study, 6, "routes", "ns_per_lookup");
        if !g.is_empty() {
            let _ = writeln!(out, "## {study}: random /{} prefixes\n\nns per lookup, one thread, matched addresses.\n", &study[5..]);
            table(&mut out, &mut notes, &g, 6, "routes", &columns(&g));
            notes.write(&mut out);
        }
    }
    let upd: Vec<&Value> = figures
        .iter()
        .filter(|f| f["study"] == "updates" && f["metric"] == "lookup")
        .collect();
    if !upd.is_empty() {
        let _ = writeln!(out, "## Lookups while the real day of updates is applied\n\nOne reader, matched addresses of the family's whole table; ns per lookup, dry run subtracted. fibre's readers read a shared table while its writer applies the day's updates flat out (publishing every 64), against the same readers with the writer idle, and with the writer applying them to a table of its own (the control: what any writer's memory traffic costs). The kernel's lookups run while `ip -batch` applies the same stream.\n\n| engine | IPv | mode | threads | writer | ns per lookup |\n|---|---|---|---:|---|---:|");
        for fam in [4u64, 6] {
            for f in upd.iter().filter(|f| f["family"] == fam) {
                let engine = match (f["engine"].as_str(), f["structure"].as_str()) {
                    (Some(e), Some(s)) => format!("{e} ({s})"),
                    (Some(e), None) => e.to_string(),
                    _ => String::new(),
                };
                let figure = notes.show(
                    cell(f, "ns_per_lookup", "mean_dev", "ns_per_lookup_note").as_ref(),
                    ns_dev,
                );
                let _ = writeln!(
                    out,
                    "| {engine} | {fam} | {} | {} | {} | {figure} |",
                    f["mode"].as_str().unwrap_or(""),
                    f["threads"],
                    match (f["writer"] == true, f["writer_table"].as_str()) {
                        (true, Some("private")) => "applying updates to its own table (control)",
                        (true, _) => "applying updates",
                        _ => "idle",
                    },
                );
            }
        }
        let _ = writeln!(out);
        notes.write(&mut out);
    }
    out
}

const COLORS: [RGBColor; 4] = [
    RGBColor(0, 114, 178),
    RGBColor(86, 180, 233),
    RGBColor(0, 158, 115),
    RGBColor(213, 94, 0),
];

/// The plots of a run: (study, column on x, figure on y, file stem, title, x label, log x).
const PLOTS: [(&str, &str, &str, &str, &str, &str, bool); 2] = [
    (
        "table-size",
        "routes",
        "ns_per_lookup",
        "table-size",
        "lookup cost against table size",
        "routes (log)",
        true,
    ),
    (
        "threads",
        "threads",
        "throughput_ns",
        "threads",
        "lookup cost against threads (throughput)",
        "threads",
        false,
    ),
];

/// Writes the plots of a run into `dir`; returns their paths.
pub fn plots(figures: &[Value], dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut written = Vec::new();
    for fam in [4u64, 6] {
        for (study, column, value, stem, title, x_desc, log_x) in PLOTS {
            let g = grid(figures, study, fam, column, value);
            if !g.is_empty() {
                let path = dir.join(format!("{stem}-ipv{fam}.svg"));
                plot(&path, &format!("IPv{fam}: {title}"), x_desc, &g, log_x)?;
                written.push(path);
            }
        }
    }
    Ok(written)
}

fn plot(path: &Path, title: &str, x_desc: &str, g: &Grid, log_x: bool) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    let points: Vec<(Row, Vec<(f64, f64)>)> = g
        .iter()
        .map(|(r, cells)| {
            (
                *r,
                cells
                    .iter()
                    .filter_map(|(c, cell)| match cell {
                        Cell::Figure(v, _) => Some((*c as f64, *v)),
                        Cell::NoFigure(_) => None,
                    })
                    .collect(),
            )
        })
        .collect();
    let all = points.iter().flat_map(|(_, p)| p.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        return Ok(());
    }
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let y_range = (y0 / 1.5).max(0.1)..y1 * 1.5;
    macro_rules! draw {
        ($chart:expr) => {{
            let mut chart = $chart.map_err(|e| err(&e))?;
            chart
                .configure_mesh()
                .x_desc(x_desc)
                .y_desc("ns per lookup (log)")
                .x_label_formatter(&|x| {
                    if log_x {
                        human(x.round() as u64)
                    } else {
                        format!("{x:.0}")
                    }
                })
                .y_label_formatter(&|y| format!("{y:.0}"))
                .draw()
                .map_err(|e| err(&e))?;
            for (row, pts) in &points {
                let color = COLORS[(row.order as usize).min(COLORS.len() - 1)];
                chart
                    .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                    .map_err(|e| err(&e))?
                    .label(label(row))
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                    });
                chart
                    .draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))
                    .map_err(|e| err(&e))?;
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(|e| err(&e))?;
        }};
    }
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70);
    if log_x {
        draw!(builder.build_cartesian_2d((x0.max(1.0)..x1 * 1.5).log_scale(), y_range.log_scale()));
    } else {
        draw!(builder.build_cartesian_2d((x0 - 0.2)..(x1 + 0.2), y_range.log_scale()));
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fig(
        engine: &str,
        mode: &str,
        fam: u64,
        routes: u64,
        threads: u64,
        ns: f64,
        study: &str,
    ) -> Value {
        json!({"engine": engine, "mode": mode, "family": fam, "routes": routes, "threads": threads,
               "ns_per_lookup": ns, "throughput_ns": ns / threads as f64, "mean_dev": 0.5,
               "throughput_mean_dev": 0.25,
               "metric": "lookup", "study": study, "addresses": "matched", "writer": false})
    }

    fn sample() -> Vec<Value> {
        let mut v = Vec::new();
        for (i, routes) in [10u64, 1000, 100_000].into_iter().enumerate() {
            v.push(fig(
                "fibre",
                "scalar",
                6,
                routes,
                1,
                10.0 + i as f64,
                "table-size",
            ));
            v.push(fig("fibre", "batch", 6, routes, 1, 5.0, "table-size"));
            v.push(fig(
                "kernel",
                "scalar",
                6,
                routes,
                1,
                1000.0 * (i + 1) as f64,
                "table-size",
            ));
        }
        for t in 1..=3 {
            v.push(fig("fibre", "scalar", 6, 100_000, t, 12.0, "threads"));
            v.push(fig("kernel", "scalar", 6, 100_000, t, 3000.0, "threads"));
        }
        v.push(fig("fibre", "scalar", 6, 100_000, 1, 3.0, "from-bgp"));
        v.push(json!({"engine": "kernel", "family": 6, "routes": 100_000, "metric": "load", "study": "table-size",
                      "seconds": 2.0, "routes_per_sec": 50_000.0, "bytes_per_route": 700.0}));
        v.push(json!({"engine": "kernel", "family": 6, "routes": 100_000, "metric": "delete", "study": "table-size",
                      "seconds": 4.0, "routes_per_sec": 25_000.0}));
        v
    }

    #[test]
    fn markdown_has_the_tables_and_ratios() {
        let md = markdown(&sample(), None, "test run");
        assert!(md.contains("| engine | IPv | 10 | 1k | 100k |"), "{md}");
        assert!(
            md.contains("| fibre scalar | 6 | 10.0 ±0.5 | 11.0 ±0.5 | 12.0 ±0.5 |"),
            "{md}"
        );
        assert!(
            md.contains("| **kernel / fibre scalar** | 6 | **100×** | **182×** | **250×** |"),
            "{md}"
        );
        assert!(
            md.contains("| **kernel / fibre batch** | 6 | **200×** | **400×** | **600×** |"),
            "{md}"
        );
        assert!(md.contains("| engine | IPv | 1 | 2 | 3 |"), "{md}");
        assert!(
            md.contains("| fibre scalar | 6 | 12.0 ±0.5 | 3.0 ±0.5 |"),
            "{md}"
        );
        assert!(
            md.contains("| kernel (table-size) | 6 | 100000 | 50000 | – | 25000 | 700 |"),
            "{md}"
        );
        // The delete was of the table-size study's table, not the updates study's.
        let mut v = sample();
        v.push(json!({"engine": "kernel", "family": 6, "routes": 100_000, "metric": "load", "study": "updates",
                      "seconds": 2.0, "routes_per_sec": 50_000.0, "bytes_per_route": 700.0}));
        let md = markdown(&v, None, "test run");
        assert!(
            md.contains("| kernel (updates) | 6 | 100000 | 50000 | – | – | 700 |"),
            "{md}"
        );
        let missing = markdown(&sample(), Some("measuring the kernel needs root"), "x");
        assert!(missing.contains("The kernel's side is missing: measuring the kernel needs root."));
    }

    /// The DPDK study's figures of a run, as `studies` emits them.
    fn dpdk_figures() -> Vec<Value> {
        let mut v = Vec::new();
        for (fam, scale) in [(4u64, 1.0), (6, 2.0)] {
            for (engine, ns) in [("fibre", 10.0), ("dpdk", 15.0)] {
                for (mode, k) in [("scalar", 1.0), ("batch", 0.5), ("dependent", 8.0)] {
                    let mut f = fig(engine, mode, fam, 1000, 1, ns * k * scale, "dpdk");
                    f["threads"] = json!(1);
                    v.push(f);
                }
            }
            v.push(json!({"study": "dpdk", "engine": "fibre", "family": fam, "metric": "memory",
                          "lookup_bytes": 8u64 << 20, "update_bytes": 12u64 << 20, "total_bytes": 20u64 << 20}));
            v.push(
                json!({"study": "dpdk", "engine": "dpdk", "family": fam, "metric": "memory",
                          "tables_bytes": 64u64 << 20, "total_bytes": 512u64 << 20, "num_tbl8": 900,
                          "tbl8_needed": 800, "tables_needed_bytes": 32u64 << 20,
                          "build_seconds": 1.5, "lookup_fn": "avx512", "dpdk_version": "22.11.11"}),
            );
            v.push(
                json!({"study": "dpdk", "engine": "dpdk", "family": fam, "metric": "ratio",
                          "cpu": "Test CPU, 2 CPUs"}),
            );
        }
        v
    }

    #[test]
    fn the_dpdk_table_has_the_four_columns_dependent_ratios_and_memory() {
        let md = markdown(&dpdk_figures(), None, "test run");
        let section = md.split("## fibre beside DPDK").nth(1).expect(&md);
        assert!(section.contains("on Test CPU, 2 CPUs;"), "{md}");
        assert!(section.contains("| | IPv4 batched | IPv4 one at a time | IPv6 batched | IPv6 one at a time | IPv4 dependent | IPv6 dependent |"), "{md}");
        assert!(
            section.contains("| DPDK 22.11.11 | 7.5 ±0.5 | 15.0 ±0.5 | 15.0 ±0.5 | 30.0 ±0.5 | 120 ±0.5 | 240 ±0.5 |"),
            "{md}"
        );
        assert!(
            section.contains(
                "| fibre | 5.0 ±0.5 | 10.0 ±0.5 | 10.0 ±0.5 | 20.0 ±0.5 | 80.0 ±0.5 | 160 ±0.5 |"
            ),
            "{md}"
        );
        assert!(
            section.contains("| **DPDK / fibre** | **1.50×** | **1.50×** | **1.50×** | **1.50×** | **1.50×** | **1.50×** |"),
            "{md}"
        );
        assert!(
            section.contains("IPv4 avx512 lookups, 900 tbl8 groups"),
            "{md}"
        );
        assert!(
            section.contains("| DPDK lookup tables (tbl24 and tbl8 groups, as configured) | 64.0 MiB | 64.0 MiB |"),
            "{md}"
        );
        assert!(
            section.contains("| **fibre / DPDK, lookup structures** | **0.125** | **0.125** |"),
            "{md}"
        );
        assert!(
            section.contains("| **fibre / DPDK, all** | **0.039** | **0.039** |"),
            "{md}"
        );
        assert!(!section.contains("skipped"), "{md}");
    }

    #[test]
    fn a_skipped_dpdk_peer_is_one_line_and_fibre_alone() {
        let why = "DPDK peer skipped: libdpdk not found by pkg-config (install dpdk-dev)";
        let mut v: Vec<Value> = dpdk_figures()
            .into_iter()
            .filter(|f| f["engine"] == "fibre")
            .collect();
        for fam in [4u64, 6] {
            v.push(
                json!({"study": "dpdk", "engine": "dpdk", "family": fam, "metric": "skipped",
                          "reason": why}),
            );
        }
        let md = markdown(&v, None, "test run");
        assert_eq!(md.matches(why).count(), 1, "{md}");
        assert!(md.contains(&format!("**{why}.**")), "{md}");
        assert!(md.contains("| fibre | 5.0 ±0.5 |"), "{md}");
        assert!(md.contains("| **DPDK / fibre** | – | – |"), "{md}");
        assert!(!has_negative_number(&md), "{md}");
    }

    #[test]
    fn plots_are_written_as_svg() {
        let dir = std::env::temp_dir().join(format!("fibre-plots-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let paths = plots(&sample(), &dir).unwrap();
        assert_eq!(paths.len(), 2);
        for p in &paths {
            let svg = std::fs::read_to_string(p).unwrap();
            assert!(
                svg.starts_with("<svg") && svg.contains("kernel") && svg.contains("fibre scalar"),
                "{}",
                p.display()
            );
            assert!(svg.matches("<circle").count() >= 6, "points are drawn");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// True if `text` holds a negative number (a minus sign before a digit, not inside a
    /// word such as "many-48").
    fn has_negative_number(text: &str) -> bool {
        let b = text.as_bytes();
        (0..b.len().saturating_sub(1)).any(|i| {
            b[i] == b'-'
                && b[i + 1].is_ascii_digit()
                && (i == 0 || !b[i - 1].is_ascii_alphanumeric())
        })
    }

    #[test]
    fn negative_null_and_impossible_figures_print_as_dashes_with_reasons() {
        let mut v = sample();
        // A one-route table whose dry run came out slower: the run recorded null.
        let mut f = fig("fibre", "scalar", 4, 1, 1, 1.0, "table-size");
        f["ns_per_lookup"] = Value::Null;
        f["ns_per_lookup_note"] = json!("the dry run took as long as the lookups or longer");
        v.push(f);
        // Figures recorded as numbers that no cost can be: shown as dashes all the same.
        v.push(fig("fibre", "batch", 4, 1, 1, -0.7, "table-size"));
        v.push(fig("kernel", "scalar", 4, 1, 1, 0.0, "table-size"));
        let mut f = fig("kernel", "scalar", 4, 100_000, 2, 400.0, "threads");
        f["throughput_ns"] = json!(-12.5);
        f["mean_dev"] = json!(-3.0);
        v.push(f);
        let mut f = fig("kernel", "scalar", 4, 100_000, 1, 800.0, "threads");
        f["throughput_ns"] = Value::Null;
        f["throughput_ns_note"] =
            json!("the dry run's wall time was as long as the lookups' or longer");
        v.push(f);
        let mut f = fig("fibre", "scalar", 4, 100_000, 1, 5.0, "threads");
        f["throughput_mean_dev"] = json!(-1.0);
        v.push(f);
        // The kernel's memory as it once printed (many-128, 10k routes), and as it now
        // comes when the counter says nothing.
        v.push(json!({"engine": "kernel", "family": 6, "routes": 10_000, "metric": "load", "study": "many-128",
                      "seconds": 0.2, "routes_per_sec": 50_000.0, "slab_bytes": -409_890_000i64, "bytes_per_route": -40_989.0}));
        v.push(json!({"engine": "kernel", "family": 4, "routes": 10, "metric": "load", "study": "table-size",
                      "seconds": 0.01, "routes_per_sec": -1000.0, "slab_bytes": null, "bytes_per_route": null,
                      "slab_note": "the machine-wide slab counter grew by 0 KiB, below its noise"}));
        // The updates section, each family, with a null and a negative figure.
        for (fam, ns) in [(4u64, Value::Null), (6, json!(-2.0))] {
            let mut f = fig("fibre", "scalar", fam, 1000, 1, 1.0, "updates");
            f["ns_per_lookup"] = ns;
            f["writer"] = json!(true);
            f["writer_table"] = json!("shared");
            f["structure"] = json!(if fam == 4 { "trie" } else { "range tree" });
            v.push(f);
            let mut f = fig("kernel", "scalar", fam, 1000, 1, 300.0, "updates");
            f["writer"] = json!(true);
            v.push(f);
        }
        let md = markdown(&v, None, "test run");
        assert!(!has_negative_number(&md), "{md}");
        let words: Vec<String> = md
            .split(|c: char| !c.is_alphanumeric())
            .map(str::to_lowercase)
            .collect();
        assert!(
            !words
                .iter()
                .any(|w| w == "nan" || w == "inf" || w == "infinity"),
            "{md}"
        );
        assert!(!md.contains("40989") && !md.contains("12.5"), "{md}");
        // Each dash says why, in a footnote.
        assert!(md.contains("| fibre scalar | 4 | –¹ |"), "{md}");
        assert!(
            md.contains("¹ the dry run took as long as the lookups or longer."),
            "{md}"
        );
        assert!(md.contains("| fibre batch | 4 | –² |"), "{md}");
        assert!(md.contains(&format!("² {IMPOSSIBLE}.")), "{md}");
        assert!(md.contains("| kernel | 4 | –² |"), "{md}");
        assert!(
            md.contains("| kernel | 4 | –¹ | –² |") && md.contains("| fibre scalar | 4 | 5.0 |"),
            "{md}"
        );
        assert!(
            md.contains("| kernel (many-128) | 6 | 10000 | 50000 | – | – | –"),
            "{md}"
        );
        assert!(md.contains("the machine-wide slab counter grew by 0 KiB, below its noise."));
        assert!(md.contains("| kernel (table-size) | 4 | 10 | –"), "{md}");
        assert!(
            md.contains("| fibre (trie) | 4 | scalar | 1 | applying updates | –"),
            "{md}"
        );
        assert!(
            md.contains("| fibre (range tree) | 6 | scalar | 1 | applying updates | –"),
            "{md}"
        );
        assert!(
            md.contains("| kernel | 6 | scalar | 1 | applying updates | 300 ±0.5 |"),
            "{md}"
        );
        // No ratio is drawn from a missing figure.
        assert!(
            md.contains("| **kernel / fibre scalar** | 4 | – | – |"),
            "{md}"
        );
    }
}
