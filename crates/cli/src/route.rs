//! `fibre route|rule|nexthop|link|addr`: routing as `ip` answers it, on a configuration
//! file of `ip` command lines.

use clap::{Args, Subcommand};
use fibre_fib::{config, show, Family, Query, Snapshot, State};
use std::io::{BufRead, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

/// `println!` that returns a write's error (standard output closed, say by `head`) to
/// the caller instead of panicking.
macro_rules! say {
    ($($arg:tt)*) => {
        writeln!(std::io::stdout().lock(), $($arg)*)?
    };
}

/// `fibre route ...`.
#[derive(Args)]
pub struct RouteArgs {
    #[command(subcommand)]
    command: RouteCommand,
}

#[derive(Subcommand)]
enum RouteCommand {
    /// The route a flow takes, as `ip route get` prints it: `ADDR [from ADDR] [iif DEV]
    /// [oif DEV] [mark N] [tos T] [ipproto P] [sport N] [dport N] [uid N]`.
    Get(GetArgs),
    /// The routes, as `ip route show` lists them.
    Show(ShowArgs),
}

#[derive(Args)]
struct GetArgs {
    /// The configuration: a file of `ip` command lines (`link add ...`, `addr add ...`,
    /// `route add ...`, `rule add ...`, `nexthop add ...`), applied in order.
    #[arg(long)]
    config: PathBuf,
    /// A file of queries, one a line (the words after `ip route get`); one answer a line.
    #[arg(long, conflicts_with = "query")]
    queries: Option<PathBuf>,
    /// JSON with the keys of `ip -d -j route get`.
    #[arg(long, short = 'j')]
    json: bool,
    /// The query: the words after `ip route get`.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    query: Vec<String>,
}

#[derive(Args)]
struct ShowArgs {
    /// The configuration file.
    #[arg(long)]
    config: PathBuf,
    /// IPv4 only.
    #[arg(short = '4', conflicts_with = "v6")]
    v4: bool,
    /// IPv6 only.
    #[arg(short = '6')]
    v6: bool,
    /// JSON, as `ip -d -j` lists.
    #[arg(long, short = 'j')]
    json: bool,
    /// `table ID|all` (default: main).
    #[arg(trailing_var_arg = true)]
    words: Vec<String>,
}

/// `fibre rule|nexthop|link|addr show`.
#[derive(Args)]
pub struct ListArgs {
    #[command(subcommand)]
    command: ListCommand,
}

#[derive(Subcommand)]
enum ListCommand {
    /// List them as `ip` does.
    Show(ShowArgs),
}

/// The configuration's state, or `None` after printing `FILE:LINE: reason`.
fn load(path: &std::path::Path) -> Option<State> {
    config::load(path).map_err(|e| eprintln!("{e}")).ok()
}

fn families(a: &ShowArgs) -> Vec<Family> {
    match (a.v4, a.v6) {
        (true, _) => vec![Family::V4],
        (_, true) => vec![Family::V6],
        _ => vec![Family::V4, Family::V6],
    }
}

/// Runs `fibre route`.
pub fn run(args: RouteArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    match args.command {
        RouteCommand::Get(a) => get(a),
        RouteCommand::Show(a) => route_show(a),
    }
}

fn query_of(snap: &Snapshot, words: &[&str]) -> Result<Query, String> {
    fibre_fib::query::parse_query(words, |name| {
        snap.links().find(|l| l.name == name).map(|l| l.index)
    })
}

fn get(a: GetArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let Some(state) = load(&a.config) else {
        return Ok(ExitCode::FAILURE);
    };
    let snap = state.snapshot();
    if let Some(path) = &a.queries {
        return many(&snap, path, a.json);
    }
    // `--json` may follow the query words, which the query takes whole.
    let json = a.json || a.query.iter().any(|w| w == "--json" || w == "-j");
    let words: Vec<&str> = a
        .query
        .iter()
        .map(String::as_str)
        .filter(|w| *w != "--json" && *w != "-j")
        .collect();
    let q = match query_of(&snap, &words) {
        Ok(q) => q,
        Err(e) => {
            eprintln!("Error: {e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    match snap.route(&q) {
        Ok(ans) => {
            if json {
                say!(
                    "{}",
                    serde_json::Value::Array(vec![show::answer_json(&snap, &ans)])
                );
            } else {
                say!("{}", show::answer_text(&snap, &ans));
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{e}");
            Ok(ExitCode::from(2))
        }
    }
}

/// One answer a line: the JSON list or the text, or `RTNETLINK answers: ...` (or
/// `{"error": ...}` in JSON) for a query without a route, `Error: ...` for a bad line.
fn many(
    snap: &Snapshot,
    path: &std::path::Path,
    json: bool,
) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let out = std::io::stdout();
    let mut out = BufWriter::new(out.lock());
    let mut bad = 0usize;
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| format!("{}:{}: {e}", path.display(), i + 1))?;
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.is_empty() || words[0].starts_with('#') {
            continue;
        }
        match query_of(snap, &words) {
            Err(e) => {
                bad += 1;
                eprintln!("{}:{}: {e}", path.display(), i + 1);
                if json {
                    writeln!(out, "{}", serde_json::json!({ "error": e }))?;
                } else {
                    writeln!(out, "Error: {e}")?;
                }
            }
            Ok(q) => match snap.route(&q) {
                Ok(ans) if json => writeln!(out, "[{}]", show::answer_json(snap, &ans))?,
                Ok(ans) => writeln!(
                    out,
                    "{}",
                    show::answer_text(snap, &ans).replace("\n    ", " ")
                )?,
                Err(e) if json => writeln!(out, "{}", serde_json::json!({ "error": e.words() }))?,
                Err(e) => writeln!(out, "{e}")?,
            },
        }
    }
    out.flush()?;
    Ok(if bad > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn route_show(a: ShowArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let Some(state) = load(&a.config) else {
        return Ok(ExitCode::FAILURE);
    };
    let table = match a.words.as_slice() {
        [] => Some(fibre_fib::names::TABLE_MAIN),
        [t, id] if t == "table" && id == "all" => None,
        [t, id] if t == "table" => match fibre_fib::names::parse_table(id) {
            Some(n) => Some(n),
            None => {
                eprintln!("Error: argument \"{id}\" is wrong: table id value is invalid");
                return Ok(ExitCode::FAILURE);
            }
        },
        _ => {
            eprintln!("Error: only `table ID|all` is supported");
            return Ok(ExitCode::FAILURE);
        }
    };
    // `ip route show` lists IPv4 unless told otherwise.
    let fams = if a.v6 { [Family::V6] } else { [Family::V4] };
    let mut json = Vec::new();
    for f in fams {
        for r in state.routes(f, table) {
            if a.json {
                json.push(show::route_json(&state, r));
            } else {
                say!("{}", show::route_text(&state, r));
            }
        }
    }
    if a.json {
        say!("{}", serde_json::Value::Array(json));
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `fibre rule show`.
pub fn rules(args: ListArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let ListCommand::Show(a) = args.command;
    let Some(state) = load(&a.config) else {
        return Ok(ExitCode::FAILURE);
    };
    let fams = if a.v6 {
        vec![Family::V6]
    } else if a.v4 || !a.v6 {
        vec![Family::V4]
    } else {
        vec![]
    };
    let mut json = Vec::new();
    for f in fams {
        for r in state.rules(f) {
            if a.json {
                json.push(show::rule_json(r));
            } else {
                say!("{}", show::rule_text(r));
            }
        }
    }
    if a.json {
        say!("{}", serde_json::Value::Array(json));
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `fibre nexthop show`.
pub fn nexthops(args: ListArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let ListCommand::Show(a) = args.command;
    let Some(state) = load(&a.config) else {
        return Ok(ExitCode::FAILURE);
    };
    let list: Vec<serde_json::Value> = state
        .nexthops()
        .map(|n| show::nexthop_json(&state, n))
        .collect();
    if a.json {
        say!("{}", serde_json::Value::Array(list));
    } else {
        for v in list {
            let mut s = format!("id {}", v["id"]);
            if let Some(g) = v.get("group").and_then(|g| g.as_array()) {
                let members: Vec<String> = g
                    .iter()
                    .map(|m| match m.get("weight") {
                        Some(w) => format!("{},{}", m["id"], w),
                        None => m["id"].to_string(),
                    })
                    .collect();
                s += &format!(" group {}", members.join("/"));
            }
            if let Some(g) = v.get("gateway").and_then(|g| g.as_str()) {
                s += &format!(" via {g}");
            }
            if let Some(d) = v.get("dev").and_then(|g| g.as_str()) {
                s += &format!(" dev {d} scope {}", v["scope"].as_str().unwrap_or(""));
            }
            if v.get("blackhole").is_some() {
                s += " blackhole";
            }
            say!("{s}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `fibre link show`.
pub fn links(args: ListArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let ListCommand::Show(a) = args.command;
    let Some(state) = load(&a.config) else {
        return Ok(ExitCode::FAILURE);
    };
    let list: Vec<serde_json::Value> = state.links().map(|l| show::link_json(&state, l)).collect();
    if a.json {
        say!("{}", serde_json::Value::Array(list));
    } else {
        for v in list {
            let flags: Vec<&str> = v["flags"]
                .as_array()
                .map_or(vec![], |f| f.iter().filter_map(|x| x.as_str()).collect());
            let name = match v.get("link").and_then(|l| l.as_str()) {
                Some(peer) => format!("{}@{peer}", v["ifname"].as_str().unwrap_or("")),
                None => v["ifname"].as_str().unwrap_or("").to_string(),
            };
            say!(
                "{}: {}: <{}> mtu {} state {} group {}\n    link/{} {}",
                v["ifindex"],
                name,
                flags.join(","),
                v["mtu"],
                v["operstate"].as_str().unwrap_or(""),
                v["group"].as_str().unwrap_or(""),
                v["link_type"].as_str().unwrap_or(""),
                v["address"].as_str().unwrap_or("")
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `fibre addr show`.
pub fn addrs(args: ListArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let ListCommand::Show(a) = args.command;
    let Some(state) = load(&a.config) else {
        return Ok(ExitCode::FAILURE);
    };
    let fams = families(&a);
    if a.json {
        let list: Vec<serde_json::Value> = state
            .links()
            .map(|l| {
                let mut v = show::addr_json(&state, l);
                if let Some(infos) = v["addr_info"].as_array_mut() {
                    infos.retain(|i| fams.iter().any(|f| i["family"] == f.name()));
                }
                v
            })
            .collect();
        say!("{}", serde_json::Value::Array(list));
    } else {
        for l in state.links() {
            say!("{}: {}:", l.index, l.name);
            for ad in state
                .addresses()
                .iter()
                .filter(|ad| ad.link == l.index && fams.contains(&ad.family()))
            {
                say!("{}", show::addr_text(&state, ad));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
