//! `fibre route|rule|nexthop|link|addr`: routing as `ip` answers it, on a configuration
//! file of `ip` command lines.

use clap::{Args, Subcommand};
use fibre_fib::{show, Family, Query, Snapshot, State};
use std::io::{BufRead, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

/// Runs `f` writing to standard output and error; its code is the exit code.
fn stdio(f: impl FnOnce(&mut Out) -> Done) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let (stdout, stderr) = (std::io::stdout(), std::io::stderr());
    let (mut out, mut err) = (stdout.lock(), stderr.lock());
    let code = f(&mut Out {
        out: &mut out,
        err: &mut err,
    })?;
    Ok(ExitCode::from(code))
}

/// `writeln!` to `out` that returns a write's error (standard output closed, say by
/// `head`) to the caller.
macro_rules! say {
    ($out:expr, $($arg:tt)*) => {
        writeln!($out, $($arg)*)?
    };
}

/// Where a command writes: its output and its errors (standard output and error, or a
/// daemon's reply to `fibre ctl`).
pub struct Out<'a> {
    /// What the command prints.
    pub out: &'a mut dyn Write,
    /// What it says went wrong.
    pub err: &'a mut dyn Write,
}

/// A command's result: its exit code, or a write that failed.
pub type Done = Result<u8, Box<dyn std::error::Error>>;

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

/// The configuration's state, or `None` after printing `FILE:LINE: reason`. Its
/// `neigh add` lines (a router's configuration for `fibre forward` has them) are checked
/// and take no part in routing.
fn load(path: &std::path::Path) -> Option<State> {
    crate::forward::load_router(path).map(|(state, _)| state)
}

/// The families `-4` and `-6` choose (both when neither is given).
pub fn families(v4: bool, v6: bool) -> Vec<Family> {
    match (v4, v6) {
        (true, _) => vec![Family::V4],
        (_, true) => vec![Family::V6],
        _ => vec![Family::V4, Family::V6],
    }
}

/// Runs `fibre route`.
pub fn run(args: RouteArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    match args.command {
        RouteCommand::Get(a) => get(a),
        RouteCommand::Show(a) => {
            let Some(state) = load(&a.config) else {
                return Ok(ExitCode::FAILURE);
            };
            stdio(|o| route_show(&state, &a.words, a.v4, a.v6, a.json, o))
        }
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
    stdio(|o| route_get(&snap, &a.query, a.json, o))
}

/// `route get WORDS` on `snap`: the answer as `ip route get` prints it (with `json`, or
/// `--json` among the words, as `ip -j`), or the kernel's error (exit code 2), or
/// `Error: ...` for words that are not a query (exit code 1).
pub fn route_get(snap: &Snapshot, query: &[String], json: bool, o: &mut Out) -> Done {
    // `--json` may follow the query words, which the query takes whole.
    let json = json || query.iter().any(|w| w == "--json" || w == "-j");
    let words: Vec<&str> = query
        .iter()
        .map(String::as_str)
        .filter(|w| *w != "--json" && *w != "-j")
        .collect();
    let q = match query_of(snap, &words) {
        Ok(q) => q,
        Err(e) => {
            say!(o.err, "Error: {e}");
            return Ok(1);
        }
    };
    match snap.route(&q) {
        Ok(ans) => {
            if json {
                say!(
                    o.out,
                    "{}",
                    serde_json::Value::Array(vec![show::answer_json(snap, &ans)])
                );
            } else {
                say!(o.out, "{}", show::answer_text(snap, &ans));
            }
            Ok(0)
        }
        Err(e) => {
            say!(o.err, "{e}");
            Ok(2)
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

/// `route show [table ID|all]` of `state` (`v6`: IPv6, else IPv4), as `ip route show`
/// lists it.
pub fn route_show(
    state: &State,
    words: &[String],
    v4: bool,
    v6: bool,
    json: bool,
    o: &mut Out,
) -> Done {
    let table = match words {
        [] => Some(fibre_fib::names::TABLE_MAIN),
        [t, id] if t == "table" && id == "all" => None,
        [t, id] if t == "table" => match fibre_fib::names::parse_table(id) {
            Some(n) => Some(n),
            None => {
                say!(
                    o.err,
                    "Error: argument \"{id}\" is wrong: table id value is invalid"
                );
                return Ok(1);
            }
        },
        _ => {
            say!(o.err, "Error: only `table ID|all` is supported");
            return Ok(1);
        }
    };
    // `ip route show` lists IPv4 unless told otherwise, but `table all` both families.
    let fams = match (table, v4, v6) {
        (None, false, false) => families(false, false),
        (_, _, true) => vec![Family::V6],
        _ => vec![Family::V4],
    };
    let mut list = Vec::new();
    for r in fams.into_iter().flat_map(|f| state.routes(f, table)) {
        if json {
            list.push(show::route_json(state, r));
        } else {
            say!(o.out, "{}", show::route_text(state, r));
        }
    }
    if json {
        say!(o.out, "{}", serde_json::Value::Array(list));
    }
    Ok(0)
}

/// Runs `fibre rule show`.
pub fn rules(args: ListArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let ListCommand::Show(a) = args.command;
    let Some(state) = load(&a.config) else {
        return Ok(ExitCode::FAILURE);
    };
    stdio(|o| rule_show(&state, a.v6, a.json, o))
}

/// `rule show` of `state` (`v6`: IPv6, else IPv4), as `ip rule show` lists it.
pub fn rule_show(state: &State, v6: bool, json: bool, o: &mut Out) -> Done {
    let family = if v6 { Family::V6 } else { Family::V4 };
    let mut list = Vec::new();
    for r in state.rules(family) {
        if json {
            list.push(show::rule_json(r));
        } else {
            say!(o.out, "{}", show::rule_text(r));
        }
    }
    if json {
        say!(o.out, "{}", serde_json::Value::Array(list));
    }
    Ok(0)
}

/// Runs `fibre nexthop show`.
pub fn nexthops(args: ListArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let ListCommand::Show(a) = args.command;
    let Some(state) = load(&a.config) else {
        return Ok(ExitCode::FAILURE);
    };
    stdio(|o| nexthop_show(&state, a.json, o))
}

/// `nexthop show` of `state`, as `ip nexthop show` lists it.
pub fn nexthop_show(state: &State, json: bool, o: &mut Out) -> Done {
    let list: Vec<serde_json::Value> = state
        .nexthops()
        .map(|n| show::nexthop_json(state, n))
        .collect();
    if json {
        say!(o.out, "{}", serde_json::Value::Array(list));
        return Ok(0);
    }
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
        say!(o.out, "{s}");
    }
    Ok(0)
}

/// Runs `fibre link show`.
pub fn links(args: ListArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let ListCommand::Show(a) = args.command;
    let Some(state) = load(&a.config) else {
        return Ok(ExitCode::FAILURE);
    };
    stdio(|o| link_show(&state, a.json, o))
}

/// `link show` of `state`, as `ip link show` lists it.
pub fn link_show(state: &State, json: bool, o: &mut Out) -> Done {
    let list: Vec<serde_json::Value> = state.links().map(|l| show::link_json(state, l)).collect();
    if json {
        say!(o.out, "{}", serde_json::Value::Array(list));
        return Ok(0);
    }
    for v in list {
        let flags: Vec<&str> = v["flags"]
            .as_array()
            .map_or(vec![], |f| f.iter().filter_map(|x| x.as_str()).collect());
        let name = match v.get("link").and_then(|l| l.as_str()) {
            Some(peer) => format!("{}@{peer}", v["ifname"].as_str().unwrap_or("")),
            None => v["ifname"].as_str().unwrap_or("").to_string(),
        };
        say!(
            o.out,
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
    Ok(0)
}

/// Runs `fibre addr show`.
pub fn addrs(args: ListArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let ListCommand::Show(a) = args.command;
    let Some(state) = load(&a.config) else {
        return Ok(ExitCode::FAILURE);
    };
    let fams = families(a.v4, a.v6);
    stdio(|o| addr_show(&state, &fams, a.json, o))
}

/// `addr show` of `state`, the addresses of `fams`, as `ip addr show` lists them.
pub fn addr_show(state: &State, fams: &[Family], json: bool, o: &mut Out) -> Done {
    if json {
        let list: Vec<serde_json::Value> = state
            .links()
            .map(|l| {
                let mut v = show::addr_json(state, l);
                if let Some(infos) = v["addr_info"].as_array_mut() {
                    infos.retain(|i| fams.iter().any(|f| i["family"] == f.name()));
                }
                v
            })
            .collect();
        say!(o.out, "{}", serde_json::Value::Array(list));
        return Ok(0);
    }
    for l in state.links() {
        say!(o.out, "{}: {}:", l.index, l.name);
        for ad in state
            .addresses()
            .iter()
            .filter(|ad| ad.link == l.index && fams.contains(&ad.family()))
        {
            say!(o.out, "{}", show::addr_text(state, ad));
        }
    }
    Ok(0)
}
