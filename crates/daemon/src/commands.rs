//! The commands `fibre ctl` asks the daemon, answered as `ip` answers them (`route get`,
//! `route show`, `rule show`, `nexthop show`, `link show`, `addr show`), written to a
//! command's output and errors: the daemon's reply, or standard output and error for the
//! `fibre` commands that answer them on a configuration file.

use fibre_fib::{show, Family, Query, Snapshot, State};
use std::io::Write;

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

/// `writeln!` to `out` that returns a write's error (standard output closed, say by
/// `head`) to the caller.
macro_rules! say {
    ($out:expr, $($arg:tt)*) => {
        writeln!($out, $($arg)*)?
    };
}

/// The families `-4` and `-6` choose (both when neither is given).
pub fn families(v4: bool, v6: bool) -> Vec<Family> {
    match (v4, v6) {
        (true, _) => vec![Family::V4],
        (_, true) => vec![Family::V6],
        _ => vec![Family::V4, Family::V6],
    }
}

/// The query `words` (the words after `ip route get`) name, links named as `snap` has them.
pub fn query_of(snap: &Snapshot, words: &[&str]) -> Result<Query, String> {
    fibre_fib::parse_query(words, |name| {
        snap.links().find(|l| l.name == name).map(|l| l.index)
    })
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
            list.push(show::route_json(state, &r));
        } else {
            say!(o.out, "{}", show::route_text(state, &r));
        }
    }
    if json {
        say!(o.out, "{}", serde_json::Value::Array(list));
    }
    Ok(0)
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
