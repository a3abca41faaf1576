//! Reports of a `fibre bench` run: tables in Markdown, and plots in SVG.
//!
//! Rows are engine and family, columns the table size or the thread count, cells
//! nanoseconds per lookup, and a row of kernel/fibre ratios under each family. Plots put
//! the table size on a log x axis (or threads on a linear one) and ns per lookup on a log
//! y axis, since the engines are orders apart.

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

/// Lookup figures of one study and family: row -> column -> (ns, mean deviation).
type Grid = BTreeMap<Row, BTreeMap<u64, (f64, f64)>>;

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
        if let (Some(c), Some(v)) = (f[column].as_u64(), f[value].as_f64()) {
            let dev_key = match value {
                "throughput_ns" => "throughput_mean_dev",
                _ => "mean_dev",
            };
            let dev = f[dev_key].as_f64().unwrap_or(0.0);
            g.entry(*row).or_default().insert(c, (v, dev));
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

fn human(n: u64) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

/// A Markdown table of `grid`, with kernel/fibre ratio rows when both are present.
fn table(out: &mut String, g: &Grid, family: u64, header: &str, columns: &[u64]) {
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
            match cells.get(c) {
                Some((v, d)) => {
                    let _ = write!(out, " {} ±{} |", ns(*v), ns(*d));
                }
                None => out.push_str(" – |"),
            }
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
                    (Some((k, _)), Some((f, _))) if *f > 0.0 => {
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

/// The Markdown report of a run.
pub fn markdown(figures: &[Value], kernel_missing: Option<&str>, header: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# fibre bench\n\n{header}\n");
    if let Some(why) = kernel_missing {
        let _ = writeln!(out, "**The kernel's side is missing: {why}.**\n");
    }
    let families: Vec<u64> = [4u64, 6]
        .into_iter()
        .filter(|f| figures.iter().any(|x| x["family"] == *f))
        .collect();

    let _ = writeln!(out, "## Lookup cost against table size\n\nns per lookup, one thread, matched addresses (random routes of the real table; the last column is the whole table). Dry run subtracted; ± is the mean deviation.\n");
    for &fam in &families {
        let g = grid(figures, "table-size", fam, "routes", "ns_per_lookup");
        if !g.is_empty() {
            table(&mut out, &g, fam, "routes", &columns(&g));
        }
    }
    let _ = writeln!(out, "## Lookup cost against threads\n\nThe whole table, matched addresses; ns per lookup as throughput, measured the same way for every engine: the threads run at once, and the wall time from the first thread's start to the last one's end is divided by all lookups of all threads, less the dry run's figure measured the same way. For the kernel that wall time is around its `BPF_PROG_TEST_RUN` calls, so it also holds each call's fixed costs (the system call, swapping the program into the XDP dispatcher), which the dry run pays too and the lookups per call amortise. Past the CPU count, threads share CPUs.\n");
    for &fam in &families {
        let g = grid(figures, "threads", fam, "threads", "throughput_ns");
        if !g.is_empty() {
            table(&mut out, &g, fam, "threads", &columns(&g));
        }
    }
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
                let cell = |x: Option<&(f64, f64)>| {
                    x.map_or("–".into(), |(v, d)| format!("{} ±{}", ns(*v), ns(*d)))
                };
                let _ = writeln!(
                    out,
                    "| {} | {fam} | {} | {} |",
                    label(&row),
                    cell(m),
                    cell(u)
                );
            }
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "## Loading the table\n\nfibre: bulk build and incremental inserts, bytes of lookup and update structures per route. Kernel: `ip -batch` of `route add` lines, and the growth of the kernel's slab memory (machine-wide, so approximate).\n");
    let _ = writeln!(out, "| engine | IPv | routes | routes/s (bulk or ip -batch) | inserts/s | removals/s | bytes/route |\n|---|---|---:|---:|---:|---:|---:|");
    for f in figures.iter().filter(|f| f["metric"] == "load") {
        let num = |k: &str| f[k].as_f64();
        // The kernel's deletion of the same table, when measured (--full).
        let removals = num("remove_per_sec").or_else(|| {
            figures
                .iter()
                .find(|d| {
                    d["metric"] == "delete"
                        && d["engine"] == f["engine"]
                        && d["family"] == f["family"]
                        && d["routes"] == f["routes"]
                })
                .and_then(|d| d["routes_per_sec"].as_f64())
        });
        let rate = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.0}"));
        let _ = writeln!(
            out,
            "| {} ({}) | {} | {} | {} | {} | {} | {} |",
            f["engine"].as_str().unwrap_or(""),
            f["study"].as_str().unwrap_or(""),
            f["family"],
            f["routes"],
            rate(num("routes_per_sec")),
            rate(num("insert_per_sec")),
            rate(removals),
            rate(num("bytes_per_route")),
        );
    }
    let _ = writeln!(out);
    for study in ["many-48", "many-128"] {
        let g = grid(figures, study, 6, "routes", "ns_per_lookup");
        if !g.is_empty() {
            let _ = writeln!(out, "## {study}: random /{} prefixes\n\nns per lookup, one thread, matched addresses.\n", &study[5..]);
            table(&mut out, &g, 6, "routes", &columns(&g));
        }
    }
    let upd: Vec<&Value> = figures
        .iter()
        .filter(|f| f["study"] == "updates" && f["metric"] == "lookup")
        .collect();
    if !upd.is_empty() {
        let _ = writeln!(out, "## Lookups while the real day of updates is applied (IPv4)\n\n| engine | mode | threads | writer | ns per lookup |\n|---|---|---:|---|---:|");
        for f in upd {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} ±{} |",
                f["engine"].as_str().unwrap_or(""),
                f["mode"].as_str().unwrap_or(""),
                f["threads"],
                match (f["writer"] == true, f["writer_table"].as_str()) {
                    (true, Some("private")) => "applying updates to its own table (control)",
                    (true, _) => "applying updates",
                    _ => "idle",
                },
                ns(f["ns_per_lookup"].as_f64().unwrap_or(f64::NAN)),
                ns(f["mean_dev"].as_f64().unwrap_or(f64::NAN))
            );
        }
        let _ = writeln!(out);
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
                    .filter(|(_, (v, _))| *v > 0.0)
                    .map(|(c, (v, _))| (*c as f64, *v))
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
        let missing = markdown(&sample(), Some("measuring the kernel needs root"), "x");
        assert!(missing.contains("The kernel's side is missing: measuring the kernel needs root."));
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
}
