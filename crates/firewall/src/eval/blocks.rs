//! Rules skipped by what they require, so that a chain of thousands of rules does not
//! cost a packet thousands of evaluations. A rule that, before any verdict, loads a
//! field of the packet (a `payload` or `meta` load) and requires it equal to a constant
//! (`cmp eq`) has no effect on a packet whose field differs: it breaks at that
//! comparison, and a stateless rule that breaks changes nothing. So a run of rules that
//! all require one field equal to a constant each becomes a block: the field is read
//! once, and a hash table from its value gives the block's rules that may match, in
//! order; the others are skipped. A packet whose field cannot be read (no transport
//! header, no output link) breaks every rule of the block at that load, and skips them
//! all. What each rule does once reached is unchanged, and the rules are still met in
//! the kernel's order, so the verdict is the kernel's.
//!
//! Only chains whose every rule writes each register it reads are made into blocks
//! (`nft` makes them so): then skipping a rule cannot change what a later rule reads.

use super::{ct_width, run, At, Dest, Jump, Op, SetCode, REGISTER_BYTES};
use std::collections::HashMap;

/// Rules in a run that make it worth a block.
const SMALLEST_BLOCK: usize = 8;

/// Where a block's probe writes the field it reads.
const PROBE_AT: usize = 16;

/// A run of rules that each require one field equal to a constant.
#[derive(Clone, Debug, PartialEq)]
struct Block {
    /// The run, by rule index.
    end: usize,
    /// The field's load (into [`PROBE_AT`]), then a `continue` that says it did not
    /// break.
    probe: [Op; 2],
    /// The bytes of the field compared.
    len: usize,
    /// For each value, the indexes of the rules that require it, in order.
    candidates: HashMap<Box<[u8]>, Box<[u32]>, foldhash::fast::FixedState>,
}

/// A chain's blocks, and the block each rule is in.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Blocks {
    blocks: Vec<Block>,
    /// For each rule, its block's index, or `u32::MAX`.
    of_rule: Vec<u32>,
}

impl Blocks {
    /// The blocks of a chain of `rules` (which look up `sets`).
    pub(super) fn new(rules: &[Vec<Op>], sets: &[SetCode]) -> Blocks {
        let mut out = Blocks {
            blocks: Vec::new(),
            of_rule: vec![u32::MAX; rules.len()],
        };
        if !rules.iter().all(|r| self_contained(r, sets)) {
            return out;
        }
        let keys: Vec<Vec<Key>> = rules.iter().map(|r| keys(r)).collect();
        let mut i = 0;
        while i < rules.len() {
            // The field of rule i's that the longest run requires; of those as long,
            // the one with the most values (which tells the rules apart best).
            let best = keys[i]
                .iter()
                .map(|k| {
                    let run: Vec<&Key> = keys[i..]
                        .iter()
                        .map_while(|ks| ks.iter().find(|o| o.same_field(k)))
                        .collect();
                    let values: std::collections::HashSet<&[u8]> =
                        run.iter().map(|o| &o.value[..]).collect();
                    (run.len(), values.len(), k)
                })
                .max_by_key(|&(run, values, _)| (run, values))
                .map(|(run, _, k)| (run, k));
            let Some((run, key)) = best.filter(|(run, _)| *run >= SMALLEST_BLOCK) else {
                i += 1;
                continue;
            };
            let mut candidates: HashMap<Vec<u8>, Vec<u32>> = HashMap::new();
            for (r, ks) in keys.iter().enumerate().skip(i).take(run) {
                // A rule may require the field twice: any value it requires will do
                // to reach it (it breaks on the other).
                let value = ks.iter().find(|o| o.same_field(key)).expect("in the run");
                candidates
                    .entry(value.value.clone())
                    .or_default()
                    .push(r as u32);
                out.of_rule[r] = out.blocks.len() as u32;
            }
            let mut probe = key.load.clone();
            set_dreg(&mut probe, PROBE_AT);
            let mut map = HashMap::with_hasher(foldhash::fast::FixedState::default());
            map.extend(
                candidates
                    .into_iter()
                    .map(|(v, rs)| (v.into_boxed_slice(), rs.into_boxed_slice())),
            );
            out.blocks.push(Block {
                end: i + run,
                probe: [probe, Op::Verdict(Jump::Continue)],
                len: key.value.len(),
                candidates: map,
            });
            i += run;
        }
        out
    }

    /// The first rule at or after `next` that may match `p`: `next` itself unless it is
    /// in a block, whose rules the packet's field does not name are skipped.
    #[inline]
    pub(super) fn next_candidate(&self, next: usize, sets: &[SetCode], p: &At) -> usize {
        let Some(&b) = self.of_rule.get(next) else {
            return next;
        };
        let Some(block) = self.blocks.get(b as usize) else {
            return next;
        };
        let mut regs = [0u8; REGISTER_BYTES];
        if run(&block.probe, sets, p, &mut regs).is_none() {
            return block.end;
        }
        match block.candidates.get(&regs[PROBE_AT..PROBE_AT + block.len]) {
            Some(rules) => {
                let k = rules.partition_point(|&r| (r as usize) < next);
                rules.get(k).map_or(block.end, |&r| r as usize)
            }
            None => block.end,
        }
    }
}

/// A field a rule requires equal to a constant: its load (as written, any register)
/// and the bytes required.
struct Key {
    load: Op,
    value: Vec<u8>,
}

impl Key {
    /// Whether `other` reads the same field, as many bytes of it.
    fn same_field(&self, other: &Key) -> bool {
        self.value.len() == other.value.len() && same_load(&self.load, &other.load)
    }
}

/// Whether two loads read the same bytes of the packet, whatever their registers.
fn same_load(a: &Op, b: &Op) -> bool {
    let (mut a, mut b) = (a.clone(), b.clone());
    set_dreg(&mut a, 0);
    set_dreg(&mut b, 0);
    a == b
}

fn set_dreg(load: &mut Op, to: usize) {
    if let Op::Payload { dreg, .. } | Op::Meta { dreg, .. } = load {
        *dreg = to;
    }
}

/// The bytes a load writes from its register on.
fn written(load: &Op) -> usize {
    match load {
        Op::Payload { len, .. } => *len,
        Op::Meta { key: 6 | 7, .. } => 16,
        Op::Meta { .. } => 4,
        _ => 0,
    }
}

/// The fields `rule` requires equal to constants before any verdict.
fn keys(rule: &[Op]) -> Vec<Key> {
    // What each register byte holds: the load (its index in the rule) that wrote it
    // from that byte on, if a load did.
    let mut loaded: Vec<(usize, usize)> = Vec::new();
    let mut out = Vec::new();
    let clobber = |loaded: &mut Vec<(usize, usize)>, at: usize, len: usize| {
        loaded.retain(|&(start, i)| {
            let end = start + written(&rule[i]).max(4);
            end <= at || start >= at + len
        });
    };
    for (i, op) in rule.iter().enumerate() {
        match op {
            Op::Payload { dreg, .. } | Op::Meta { dreg, .. } => {
                clobber(&mut loaded, *dreg, written(op).next_multiple_of(4));
                loaded.push((*dreg, i));
            }
            Op::Cmp {
                op: 0, sreg, data, ..
            } => {
                if let Some(&(_, l)) = loaded
                    .iter()
                    .find(|&&(start, l)| start == *sreg && data.len() <= written(&rule[l]))
                {
                    out.push(Key {
                        load: rule[l].clone(),
                        value: data.clone(),
                    });
                }
            }
            Op::Ct { dreg, key, .. } => clobber(&mut loaded, *dreg, ct_width(*key)),
            Op::Bitwise { dreg, mask, .. } => clobber(&mut loaded, *dreg, mask.len()),
            Op::Byteorder { dreg, len, .. } => clobber(&mut loaded, *dreg, *len),
            Op::Data { dreg, data } => clobber(&mut loaded, *dreg, data.len().next_multiple_of(4)),
            Op::Lookup {
                dreg: Some(Dest::Register(d)),
                ..
            } => clobber(&mut loaded, *d, REGISTER_BYTES - d),
            // A verdict (or a verdict map) may end the rule with an effect: what
            // follows does not decide whether it has one.
            Op::Verdict(_)
            | Op::Lookup {
                dreg: Some(Dest::Verdict),
                ..
            } => break,
            _ => {}
        }
    }
    out
}

/// Whether `rule` writes every register byte it reads before reading it.
fn self_contained(rule: &[Op], sets: &[SetCode]) -> bool {
    let mut written = [false; REGISTER_BYTES];
    let read =
        |w: &[bool; REGISTER_BYTES], at: usize, len: usize| w[at..at + len].iter().all(|&b| b);
    let write = |w: &mut [bool; REGISTER_BYTES], at: usize, len: usize| {
        w[at..(at + len).min(REGISTER_BYTES)].fill(true);
    };
    for op in rule {
        match op {
            Op::Payload { dreg, len, .. } => write(&mut written, *dreg, len.next_multiple_of(4)),
            Op::Meta { dreg, key } => write(
                &mut written,
                *dreg,
                if matches!(key, 6 | 7) { 16 } else { 4 },
            ),
            Op::Ct { dreg, key, .. } => write(&mut written, *dreg, ct_width(*key)),
            // Which registers a NAT statement reads depends on the packet's family.
            Op::Nat(_) => return false,
            Op::Cmp { sreg, data, .. } => {
                if !read(&written, *sreg, data.len()) {
                    return false;
                }
            }
            Op::Bitwise {
                sreg, dreg, mask, ..
            } => {
                if !read(&written, *sreg, mask.len()) {
                    return false;
                }
                write(&mut written, *dreg, mask.len());
            }
            Op::Byteorder {
                sreg, dreg, len, ..
            } => {
                if !read(&written, *sreg, *len) {
                    return false;
                }
                write(&mut written, *dreg, *len);
            }
            Op::Range { sreg, from, .. } => {
                if !read(&written, *sreg, from.len()) {
                    return false;
                }
            }
            Op::Data { dreg, data } => write(&mut written, *dreg, data.len().next_multiple_of(4)),
            Op::Lookup {
                set, sreg, dreg, ..
            } => {
                let s = &sets[*set];
                if !read(&written, *sreg, s.index.key_len) {
                    return false;
                }
                if let Some(Dest::Register(d)) = dreg {
                    write(&mut written, *d, s.data_len.next_multiple_of(4));
                }
            }
            Op::Verdict(_) | Op::Nothing => {}
        }
    }
    true
}
