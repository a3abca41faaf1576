//! Instructions a flow, counted rather than timed: the default rules' lookup of the rules
//! study's IPv4 workload (100,000 real routes via 64 gateways, 65,536 flows to matched
//! addresses arriving on one link), three ways, beside the bare LPM search of the same
//! addresses one at a time and batched. Timings on a shared machine drift from run to run; the instructions
//! each way executes do not, so this is how a change to the lookup's passes is judged.
//!
//! Each way runs in a function of its own; callgrind counts them:
//!
//! ```sh
//! cargo build --release --example flow_instructions
//! valgrind --tool=callgrind --callgrind-out-file=flows.out \
//!     target/release/examples/flow_instructions
//! callgrind_annotate --inclusive=yes flows.out | grep flow_instructions::
//! ```
//!
//! Divide each function's count by the flows it prints. The figures measure code, not
//! memory: a cache miss costs one instruction here.

use fibre_bench::rules::{RulesConfig, Workload};
use fibre_fib::{FlowVector, HopRef, NoRoute, Query, Snapshot, VectorAnswers, BATCH};
use fibre_lpm::Table;
use fibre_routefile::{final_prefixes, read_route_file};
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

type Answer<'s> = Result<HopRef<'s>, NoRoute>;

/// The bare search: the sample's routes in a plain LPM table, 64 keys a call.
#[inline(never)]
fn lpm_batches(table: &Table<u32>, keys: &[u32]) -> u32 {
    let mut out = [None; BATCH];
    let mut acc = 0u32;
    for chunk in keys.chunks(BATCH) {
        let out = &mut out[..chunk.len()];
        table.lookup_batch(chunk, out);
        for v in out.iter() {
            acc = acc.wrapping_add(v.unwrap_or(0));
        }
    }
    acc
}

/// The bare search, one key a call.
#[inline(never)]
fn lpm_one_by_one(table: &Table<u32>, keys: &[u32]) -> u32 {
    keys.iter()
        .fold(0u32, |a, &k| a.wrapping_add(table.lookup(k).unwrap_or(0)))
}

/// The default rules' lookup, one query a call.
#[inline(never)]
fn one_by_one(snap: &Snapshot, flows: &[Query]) -> u32 {
    flows.iter().fold(0u32, |a, q| {
        a.wrapping_add(snap.lookup(q).map_or(0, |h| h.dev))
    })
}

/// The default rules' lookup of 64 flows' addresses a call, as a packet path holds them,
/// answered with a `u32` a flow as the bare search is.
#[inline(never)]
fn vectors(snap: &Snapshot, flows: &[Query], dst: &[Ipv4Addr], src: &[Ipv4Addr]) -> u32 {
    let iif = flows[0].iif;
    let mut out = VectorAnswers::new();
    let mut acc = 0u32;
    for (k, (dst, src)) in dst.chunks(BATCH).zip(src.chunks(BATCH)).enumerate() {
        let v = FlowVector { iif, dst, src };
        snap.lookup_vector_v4(&v, |i| flows[k * BATCH + i].clone(), &mut out);
        acc = out.ids().iter().fold(acc, |a, &id| a.wrapping_add(id));
    }
    acc
}

/// The default rules' lookup of 64 queries a call.
#[inline(never)]
fn batches(snap: &Snapshot, flows: &[Query]) -> u32 {
    let mut out: Vec<Answer> = vec![Err(NoRoute::NetworkUnreachable); BATCH];
    let mut acc = 0u32;
    for chunk in flows.chunks(BATCH) {
        let out = &mut out[..chunk.len()];
        snap.lookup_batch(chunk, out);
        acc = out
            .iter()
            .fold(acc, |a, h| a.wrapping_add(h.as_ref().map_or(0, |h| h.dev)));
    }
    acc
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/ris-2026-05-11/rib-v4.txt.gz");
    let file = read_route_file(&path, false)?;
    let table = final_prefixes(&file.v4);
    let w = Workload::<u32>::new(&table, &RulesConfig::default())?;
    let snap = w.router.snapshot();
    let lpm = Table::<u32>::build(w.routes.iter().enumerate().map(|(i, p)| (*p, i as u32)));
    let addr = |a: Option<IpAddr>| match a {
        Some(IpAddr::V4(a)) => a,
        _ => Ipv4Addr::UNSPECIFIED,
    };
    let dst: Vec<Ipv4Addr> = w.flows.iter().map(|q| addr(Some(q.dst))).collect();
    let src: Vec<Ipv4Addr> = w.flows.iter().map(|q| addr(q.src)).collect();
    black_box(lpm_one_by_one(&lpm, &w.keys));
    black_box(one_by_one(&snap, &w.flows));
    black_box(lpm_batches(&lpm, &w.keys));
    black_box(vectors(&snap, &w.flows, &dst, &src));
    black_box(batches(&snap, &w.flows));
    println!(
        "{} flows, {} routes; each way ran once over all flows",
        w.flows.len(),
        w.routes.len()
    );
    Ok(())
}
