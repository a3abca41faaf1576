//! Removals in a batch: many prefixes taken out at once, each node they touch recompiled
//! once.
//!
//! One removal recompiles the node where its prefix ends, and when that node is left
//! empty, moves its parent's whole children block to drop it and recompiles the parent.
//! A link going down takes its routes with it, often many host routes under a few
//! prefixes: a thousand /32s under four /24s recompile each /30's node four times and
//! move each /24's children block sixty times, one removal after another.
//!
//! A batch works in two passes. The first walks to each prefix's node as one removal
//! does (copying the path a snapshot can reach) and notes the prefix there, and each node
//! on the way under its parent. The second goes up the noted nodes level by level,
//! deepest first: each takes out its prefixes and drops its emptied children in one move
//! of its children block, then is recompiled once, or, left empty itself, is dropped by
//! its parent at the next level up without being recompiled.
//!
//! Node indices noted in the first pass stay valid in the second: a node moves only when
//! its parent's children block does, which the walk already made fresh (a fresh block is
//! not moved by the walk's copying), and a parent's block is rebuilt only when the parent
//! is handled, after every node below it.

use super::node::{Node, NodeAux};
use super::{Fold, Trie, LARGE_DIRECT_BITS, SHRINK_AT, SMALL_DIRECT_BITS};
use crate::key::Key;
use crate::prefix::Prefix;
use std::collections::HashMap;

/// What the batch does at one node.
#[derive(Default)]
struct Noted {
    /// The node's parent and its slot there; for a root, `None`.
    parent: Option<(u32, u32)>,
    /// For a root, its direct entry.
    entry: usize,
    /// The ART indices of the prefixes taken out of it.
    arts: Vec<u8>,
    /// The slots of its children left empty, to drop.
    drop: u64,
}

impl<K: Key> Trie<K> {
    /// Removes every prefix of `prefixes` the trie holds; returns how many it held. The
    /// same as removing them one at a time, in time proportional to the nodes they touch.
    pub fn remove_many(&mut self, prefixes: &[Prefix<K>]) -> usize {
        let mut prefixes = prefixes.to_vec();
        prefixes.sort_unstable();
        prefixes.dedup();
        let (short, deep): (Vec<_>, Vec<_>) = prefixes
            .into_iter()
            .partition(|p| p.len() <= self.direct_bits);
        let mut removed = 0;
        for p in &short {
            if self.remove_direct(p).is_some() {
                self.count_by_len[usize::from(p.len())] -= 1;
                removed += 1;
            }
        }
        // Per level below the direct array (0: the roots), the nodes noted there.
        let mut levels: Vec<Level> = Vec::new();
        for p in &deep {
            removed += usize::from(self.note_removal(p, &mut levels));
        }
        if removed == 0 {
            return 0;
        }
        for level in (0..levels.len()).rev() {
            // In the nodes' order: the same blocks reused from run to run.
            let mut noted = std::mem::take(&mut levels[level].noted);
            noted.sort_unstable_by_key(|(n, _)| *n);
            for (n, noted) in noted {
                let changed = !noted.arts.is_empty() || noted.drop != 0;
                self.take_out(n, &noted);
                match noted.parent {
                    // A node on the way to others, itself unchanged.
                    Some(_) if !changed => {}
                    Some((parent, slot)) => {
                        // A wide root keeps its children (it may narrow below).
                        if self.holds_nothing(n) && !self.is_wide(parent) {
                            levels[level - 1]
                                .get_mut(parent)
                                .expect("a node's parent is noted on the walk to it")
                                .drop |= 1 << slot;
                        } else {
                            self.recompile(n);
                        }
                    }
                    None => self.settle_root(noted.entry, n, changed),
                }
            }
        }
        self.len -= removed;
        if self.direct_bits == LARGE_DIRECT_BITS && self.len < SHRINK_AT {
            self.rebuild_with_direct_bits(SMALL_DIRECT_BITS);
        } else if self.mostly_free() {
            self.compact();
        }
        removed
    }

    /// Walks to the node where `prefix` (longer than the direct bits) ends, making the
    /// path fresh, and notes the prefix there and each node on the way; false, with
    /// nothing copied or noted, if the trie does not hold it.
    fn note_removal(&mut self, prefix: &Prefix<K>, levels: &mut Vec<Level>) -> bool {
        if self.get(prefix).is_none() {
            return false;
        }
        let d = u32::from(self.direct_bits);
        let len = u32::from(prefix.len());
        let key = prefix.addr();
        let e = key.bits(0, d) as usize;
        let mut n = self.writable_root(e);
        let mut level = 0;
        let mut depth = d;
        note(
            levels,
            0,
            n,
            Noted {
                entry: e,
                ..Noted::default()
            },
        );
        while len > depth + 6 {
            self.fresh_children(n);
            let node = self.node(n);
            let slot = key.bits(depth, 6);
            let child = node.child_base + self.ones(node.children & ((1u64 << slot) - 1));
            level += 1;
            note(
                levels,
                level,
                child,
                Noted {
                    parent: Some((n, slot)),
                    ..Noted::default()
                },
            );
            n = child;
            depth += 6;
        }
        note(levels, level, n, Noted::default())
            .arts
            .push(super::art_index(key, depth, len));
        self.count_by_len[usize::from(prefix.len())] -= 1;
        true
    }

    /// Takes out of node `n` (fresh) the prefixes and children `noted` names.
    fn take_out(&mut self, n: u32, noted: &Noted) {
        if !noted.arts.is_empty() {
            let aux = &mut self.aux[n as usize];
            aux.prefixes = aux
                .prefixes
                .iter()
                .filter(|e| !noted.arts.contains(&e.art))
                .copied()
                .collect();
        }
        if noted.drop != 0 {
            self.drop_children(n, noted.drop);
        }
    }

    /// Deletes the (empty) children of `parent` (fresh) at the slots of `slots`, in one
    /// move of the rest of its children block. The parent is not recompiled.
    fn drop_children(&mut self, parent: u32, slots: u64) {
        let mut node = self.node(parent);
        let count = self.ones(node.children);
        let kept = count - self.ones(slots);
        let base = if kept == 0 { 0 } else { self.alloc_nodes(kept) };
        let (mut children, mut j, mut k) = (node.children, 0, 0);
        while children != 0 {
            let slot = children.trailing_zeros();
            let child = node.child_base + j;
            if slots >> slot & 1 == 1 {
                self.free_node_leaves(child);
                self.aux[child as usize] = NodeAux::default();
            } else {
                self.move_node(child, base + k);
                k += 1;
            }
            j += 1;
            children &= children - 1;
        }
        if self.nodes.is_fresh(node.child_base) {
            for j in 0..count {
                self.set_node(node.child_base + j, Node::default());
            }
        }
        self.release_nodes(node.child_base, count);
        node.children &= !slots;
        node.child_base = base;
        self.set_node(parent, node);
    }

    /// Root `n` of direct entry `e`, its removals taken out (`changed`: some were its
    /// own), or some below it: recompiled, narrowed if it was wide, and pointed at, or
    /// deleted if it holds nothing.
    fn settle_root(&mut self, e: usize, n: u32, changed: bool) {
        if !self.holds_nothing(n) {
            if changed {
                self.recompile(n);
            }
            self.adjust_width(n);
        }
        if self.holds_nothing(n) {
            let default = self.aux[n as usize].default;
            self.free_node_leaves(n);
            self.aux[n as usize] = NodeAux::default();
            self.set_node(n, Node::default());
            self.release_nodes(n, 1);
            self.set_entry(e, default);
            self.wide_roots.remove(&e);
        } else {
            self.refresh_direct(e, n);
        }
    }
}

/// The nodes noted at one level, in the order first noted.
#[derive(Default)]
struct Level {
    noted: Vec<(u32, Noted)>,
    /// Where each node is in `noted`.
    at: HashMap<u32, usize, Fold>,
}

impl Level {
    /// Node `n` as noted, if it is.
    fn get_mut(&mut self, n: u32) -> Option<&mut Noted> {
        let i = *self.at.get(&n)?;
        Some(&mut self.noted[i].1)
    }
}

/// Node `n` of `level` as noted in `levels` (noted as `noted` if not yet). The batch's
/// prefixes come sorted, so most walks pass the nodes the last one passed: the node
/// noted last at a level is checked before the index.
fn note(levels: &mut Vec<Level>, level: usize, n: u32, noted: Noted) -> &mut Noted {
    if levels.len() <= level {
        levels.resize_with(level + 1, Level::default);
    }
    let l = &mut levels[level];
    let i = match l.noted.last() {
        Some((last, _)) if *last == n => l.noted.len() - 1,
        _ => *l.at.entry(n).or_insert_with(|| {
            l.noted.push((n, noted));
            l.noted.len() - 1
        }),
    };
    &mut l.noted[i].1
}
