//! `fibre route|rule|nexthop|link|addr`: routing as `ip` answers it, on a configuration
//! file of `ip` command lines.

use clap::{Args, Subcommand};
use fibre_daemon::{
    addr_show, families, link_show, nexthop_show, query_of, route_get, route_show, rule_show, Done,
    Out,
};
use fibre_fib::{show, Snapshot, State};
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
    crate::forward_capture::load_router(path).map(|(state, _)| state)
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

/// Runs `fibre rule show`.
pub fn rules(args: ListArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let ListCommand::Show(a) = args.command;
    let Some(state) = load(&a.config) else {
        return Ok(ExitCode::FAILURE);
    };
    stdio(|o| rule_show(&state, a.v6, a.json, o))
}

/// Runs `fibre nexthop show`.
pub fn nexthops(args: ListArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let ListCommand::Show(a) = args.command;
    let Some(state) = load(&a.config) else {
        return Ok(ExitCode::FAILURE);
    };
    stdio(|o| nexthop_show(&state, a.json, o))
}

/// Runs `fibre link show`.
pub fn links(args: ListArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let ListCommand::Show(a) = args.command;
    let Some(state) = load(&a.config) else {
        return Ok(ExitCode::FAILURE);
    };
    stdio(|o| link_show(&state, a.json, o))
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
