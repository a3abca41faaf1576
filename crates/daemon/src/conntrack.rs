//! `fibre ctl conntrack show` and the connection tracking part of `stats` and the
//! metrics: the connections the workers track for the forwarded packets of the
//! families the router's ruleset has the kernel track, listed as `conntrack -L` lists
//! the kernel's.

use crate::commands::{Done, Out};
use crate::metrics::{label, Exposition, Kind};
use fibre_conntrack::{Connection, Conntrack, Tuple};
use fibre_conntrack::{ASSURED, SEEN_REPLY};
use serde_json::{json, Value};
use std::fmt::Write as _;

/// A protocol's name, as `conntrack` prints it.
fn protocol_name(p: u8) -> String {
    match p {
        1 => "icmp".into(),
        6 => "tcp".into(),
        17 => "udp".into(),
        58 => "icmpv6".into(),
        _ => "unknown".into(),
    }
}

/// A tuple's words: `src=.. dst=.. sport=.. dport=..` (`type=.. code=.. id=..` for
/// ICMP).
fn tuple_text(t: &Tuple) -> String {
    let mut s = format!("src={} dst={}", t.source(), t.destination());
    match t.protocol {
        1 | 58 => {
            let [kind, code] = t.dst_port.to_be_bytes();
            let _ = write!(s, " type={kind} code={code} id={}", t.src_port);
        }
        6 | 17 => {
            let _ = write!(s, " sport={} dport={}", t.src_port, t.dst_port);
        }
        _ => {}
    }
    s
}

fn tuple_json(t: &Tuple) -> Value {
    let mut v = json!({"src": t.source().to_string(), "dst": t.destination().to_string()});
    match t.protocol {
        1 | 58 => {
            let [kind, code] = t.dst_port.to_be_bytes();
            v["type"] = kind.into();
            v["code"] = code.into();
            v["id"] = t.src_port.into();
        }
        6 | 17 => {
            v["sport"] = t.src_port.into();
            v["dport"] = t.dst_port.into();
        }
        _ => {}
    }
    v
}

/// One connection as `conntrack -L` prints it.
fn line(c: &Connection, left: u64) -> String {
    let t = &c.tuples[0];
    let mut s = format!(
        "{:<8} {:<2} {} ",
        protocol_name(t.protocol),
        t.protocol,
        left / 1_000_000_000
    );
    if let Some(state) = c.tcp_state() {
        s += state.name();
        s.push(' ');
    }
    s += &tuple_text(t);
    if c.status & SEEN_REPLY == 0 {
        s += " [UNREPLIED]";
    }
    s.push(' ');
    s += &tuple_text(&c.tuples[1]);
    if c.status & ASSURED != 0 {
        s += " [ASSURED]";
    }
    let _ = write!(s, " mark={}", c.mark);
    s
}

/// `fibre ctl conntrack show [--json]`: every connection tracked, at `now`.
pub fn show(tables: &[&Conntrack], now: u64, json: bool, o: &mut Out) -> Done {
    let mut list: Vec<(&Connection, u64)> =
        tables.iter().flat_map(|t| t.connections(now)).collect();
    list.sort_by_key(|(c, _)| (c.tuples[0].v6, c.tuples[0].protocol, c.tuples[0].src));
    if json {
        let v: Vec<Value> = list
            .iter()
            .map(|(c, left)| {
                json!({
                    "family": if c.tuples[0].v6 { "ipv6" } else { "ipv4" },
                    "protocol": protocol_name(c.tuples[0].protocol),
                    "timeout": left / 1_000_000_000,
                    "state": c.tcp_state().map(|s| s.name()),
                    "original": tuple_json(&c.tuples[0]),
                    "reply": tuple_json(&c.tuples[1]),
                    "unreplied": c.status & SEEN_REPLY == 0,
                    "assured": c.status & ASSURED != 0,
                    "mark": c.mark,
                })
            })
            .collect();
        writeln!(o.out, "{}", Value::Array(v))?;
    } else {
        for (c, left) in &list {
            writeln!(o.out, "{}", line(c, *left))?;
        }
        writeln!(o.err, "fibre: {} flow entries have been shown.", list.len())?;
    }
    Ok(0)
}

/// What every worker's table counted, together.
fn total(tables: &[&Conntrack]) -> fibre_conntrack::Stats {
    let mut sum = fibre_conntrack::Stats::default();
    for t in tables {
        sum.add(&t.stats);
    }
    sum
}

/// The tracking part of `stats`.
pub fn stats(tables: &[&Conntrack]) -> Value {
    let s = total(tables);
    json!({
        "connections": tables.iter().map(|t| t.len()).sum::<usize>(),
        "max": tables.first().map_or(0, |t| t.settings().max),
        "found": s.found,
        "inserted": s.inserted,
        "invalid": s.invalid,
        "ignored": s.ignored,
        "dropped": s.dropped,
        "early_dropped": s.early_dropped,
        "expired": s.expired,
        "to_kernel": s.kernel,
        "insert_failed": s.insert_failed,
        "source_translated": s.source_translated,
        "destination_translated": s.destination_translated,
        "imported": s.imported,
    })
}

/// The tracking metrics, in Prometheus' text exposition format.
pub fn metrics(tables: &[&Conntrack], e: &mut Exposition) {
    let s = total(tables);
    e.one(
        "fibre_conntrack_connections",
        Kind::Gauge,
        "Connections tracked.",
        tables.iter().map(|t| t.len()).sum::<usize>() as f64,
    );
    e.add(
        "fibre_conntrack_packets",
        Kind::Counter,
        "Packets tracked, by what became of them.",
        [
            ("found", s.found),
            ("invalid", s.invalid),
            ("ignored", s.ignored),
            ("dropped", s.dropped),
            ("to_kernel", s.kernel),
            ("insert_failed", s.insert_failed),
        ]
        .map(|(outcome, n)| (label("outcome", outcome), n as f64)),
    );
    e.add(
        "fibre_conntrack_events",
        Kind::Counter,
        "Connections entered, dropped early, expired, translated (their source or their \
         destination), imported from the kernel's at takeover.",
        [
            ("inserted", s.inserted),
            ("early_dropped", s.early_dropped),
            ("expired", s.expired),
            ("source_translated", s.source_translated),
            ("destination_translated", s.destination_translated),
            ("imported", s.imported),
        ]
        .map(|(event, n)| (label("event", event), n as f64)),
    );
}
