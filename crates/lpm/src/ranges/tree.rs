//! The range tree's store: B+-trees of ranges in shared arenas, built in bulk and
//! rewritten span by span, copying on write what a published snapshot can reach.
//!
//! A tree maps every 64-bit key to a stored value through the ranges in its leaves,
//! ordered left to right; every leaf is at the same depth, so a batch of lookups walks
//! in lockstep. A leaf's first range starts exactly where its subtree starts (the
//! separator above it), which is what lets a leaf store its starts as offsets.
//!
//! An update *assigns* a span: the ranges over `[start, end]` become a given list and
//! everything outside keeps its value. Only the leaves overlapping the span are
//! rewritten; a leaf that overflows splits, and nodes split up to the root, which grows
//! a level. Nothing merges: leaves emptied of boundaries keep one range each, and the
//! engine rebuilds the tree in bulk when it has grown to twice its built size (see
//! `mod.rs`), which keeps the walk short without merge logic on the update path.
//!
//! Copy on write: a leaf or node allocated since the last publish is changed in place;
//! any other is copied, and the old one is released, to be reused once no reader can
//! reach it. Changing a child changes its parent, so an update copies its path up to
//! the root, each line at most once between publishes.

use super::layout::{
    decode_leaf, decode_node, encode_leaf, encode_node, fits_leaf, leaf_take, leaf_value,
    node_child, LeafCell, NodeCell, DEEP, DEEP_HEIGHT_SHIFT, DEEP_ROOT, NODE_CHILDREN,
};
use crate::trie::arena::{Arena, Fresh};

/// A tree: its root (a node, or a leaf when `height` is 0) and its number of node levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tree {
    pub root: u32,
    pub height: u8,
}

impl Tree {
    /// The stored value that refers to this tree as a second stage.
    pub fn to_deep(self) -> u32 {
        debug_assert!(self.root <= DEEP_ROOT && self.height < 8);
        DEEP | u32::from(self.height) << DEEP_HEIGHT_SHIFT | self.root
    }

    /// The second-stage tree a stored value refers to, if it refers to one.
    #[inline(always)]
    pub fn from_deep(stored: u32) -> Option<Tree> {
        (stored & DEEP != 0).then_some(Tree {
            root: stored & DEEP_ROOT,
            height: ((stored & !DEEP) >> DEEP_HEIGHT_SHIFT) as u8,
        })
    }
}

/// Lines released since the last publish that a snapshot may still reach.
#[derive(Debug, Default)]
pub(crate) struct Released {
    pub generation: u64,
    pub nodes: Vec<u32>,
    pub leaves: Vec<u32>,
}

/// The arenas of leaves and nodes, with what copy on write and reuse need.
#[derive(Debug, Default)]
pub(crate) struct Store {
    pub leaves: Arena<LeafCell>,
    pub nodes: Arena<NodeCell>,
    free_leaves: Vec<u32>,
    free_nodes: Vec<u32>,
    fresh_leaves: Fresh,
    fresh_nodes: Fresh,
    released: Released,
    /// Reused by leaf rewrites, to spare an allocation each.
    scratch: Vec<(u64, u32)>,
    /// Leaves and nodes in use (not free, not waiting for readers).
    pub live_leaves: usize,
    pub live_nodes: usize,
}

/// Searches `tree` for `key`: the stored value of its range.
#[inline(always)]
pub(crate) fn search(leaves: &[LeafCell], nodes: &[NodeCell], tree: Tree, key: u64) -> u32 {
    let mut i = tree.root;
    for _ in 0..tree.height {
        i = node_child(&nodes[i as usize], key);
    }
    leaf_value(&leaves[i as usize], key)
}

impl Store {
    /// A store whose arrays no snapshot has seen, named by `generation`.
    pub fn new(generation: u64) -> Self {
        Store {
            released: Released {
                generation,
                ..Released::default()
            },
            ..Store::default()
        }
    }

    /// The stored value of `key` in `tree`.
    pub fn search(&self, tree: Tree, key: u64) -> u32 {
        search(
            &self.leaves.buffer()[..],
            &self.nodes.buffer()[..],
            tree,
            key,
        )
    }

    /// Bytes of the free lists and of what copy on write tracks.
    pub fn update_bytes(&self) -> usize {
        4 * (self.free_leaves.capacity()
            + self.free_nodes.capacity()
            + self.released.leaves.capacity()
            + self.released.nodes.capacity())
            + self.fresh_leaves.bytes()
            + self.fresh_nodes.bytes()
    }

    /// Marks everything published; returns what was released before, for reuse once no
    /// reader holds a snapshot that reaches it.
    pub fn publish(&mut self) -> Released {
        self.fresh_leaves.clear();
        self.fresh_nodes.clear();
        let generation = self.released.generation;
        std::mem::replace(
            &mut self.released,
            Released {
                generation,
                ..Released::default()
            },
        )
    }

    /// Reuses lines that no reader can reach any more.
    pub fn reclaim(&mut self, released: Released) {
        if released.generation == self.released.generation {
            self.free_leaves.extend(released.leaves);
            self.free_nodes.extend(released.nodes);
        }
    }

    fn alloc_leaf(&mut self) -> u32 {
        let i = self
            .free_leaves
            .pop()
            .unwrap_or_else(|| self.leaves.extend(1));
        self.fresh_leaves.mark(i, 1);
        self.live_leaves += 1;
        i
    }

    fn alloc_node(&mut self) -> u32 {
        let i = self
            .free_nodes
            .pop()
            .unwrap_or_else(|| self.nodes.extend(1));
        self.fresh_nodes.mark(i, 1);
        self.live_nodes += 1;
        i
    }

    fn release_leaf(&mut self, i: u32) {
        self.live_leaves -= 1;
        if self.fresh_leaves.contains(i) {
            self.free_leaves.push(i);
        } else {
            self.released.leaves.push(i);
        }
    }

    fn release_node(&mut self, i: u32) {
        self.live_nodes -= 1;
        if self.fresh_nodes.contains(i) {
            self.free_nodes.push(i);
        } else {
            self.released.nodes.push(i);
        }
    }

    /// Writes leaf `i` with `ranges`, in place if no snapshot has seen it, else to a copy;
    /// returns where it now is.
    fn write_leaf(&mut self, i: u32, ranges: &[(u64, u32)]) -> u32 {
        let line = encode_leaf(ranges);
        if self.fresh_leaves.contains(i) {
            self.leaves.set(i, line);
            return i;
        }
        let j = self.alloc_leaf();
        self.leaves.set(j, line);
        self.release_leaf(i);
        j
    }

    /// Writes node `i` with `children`, as [`Store::write_leaf`] does.
    fn write_node(&mut self, i: u32, children: &[(u64, u32)]) -> u32 {
        let line = encode_node(children);
        if self.fresh_nodes.contains(i) {
            self.nodes.set(i, line);
            return i;
        }
        let j = self.alloc_node();
        self.nodes.set(j, line);
        self.release_node(i);
        j
    }

    fn new_leaf(&mut self, ranges: &[(u64, u32)]) -> u32 {
        let i = self.alloc_leaf();
        self.leaves.set(i, encode_leaf(ranges));
        i
    }

    fn new_node(&mut self, children: &[(u64, u32)]) -> u32 {
        let i = self.alloc_node();
        self.nodes.set(i, encode_node(children));
        i
    }

    /// Builds a tree over `ranges` (sorted, the first starting at 0): leaves as full as
    /// their offsets allow, nodes full.
    pub fn build(&mut self, ranges: &[(u64, u32)]) -> Tree {
        debug_assert_eq!(ranges.first().map(|r| r.0), Some(0));
        let mut level = Vec::with_capacity(ranges.len() / 4 + 1);
        let mut rest = ranges;
        while !rest.is_empty() {
            let n = leaf_take(rest);
            level.push((rest[0].0, self.new_leaf(&rest[..n])));
            rest = &rest[n..];
        }
        self.build_above(level, 0)
    }

    /// Puts levels of full nodes above `level` (subtrees of height `height`) until one
    /// root remains.
    fn build_above(&mut self, mut level: Vec<(u64, u32)>, mut height: u8) -> Tree {
        while level.len() > 1 {
            level = level
                .chunks(NODE_CHILDREN)
                .map(|group| (group[0].0, self.new_node(group)))
                .collect();
            height += 1;
        }
        Tree {
            root: level[0].1,
            height,
        }
    }

    /// Gives back every line of `tree`, and of the second-stage trees its leaves refer to.
    pub fn release_tree(&mut self, tree: Tree) {
        if tree.height == 0 {
            let line = self.leaves.get(tree.root);
            for &(_, v) in decode_leaf(&line).iter() {
                if let Some(deep) = Tree::from_deep(v) {
                    self.release_tree(deep);
                }
            }
            self.release_leaf(tree.root);
            return;
        }
        let line = self.nodes.get(tree.root);
        for &(_, child) in decode_node(&line, 0).iter() {
            self.release_tree(Tree {
                root: child,
                height: tree.height - 1,
            });
        }
        self.release_node(tree.root);
    }

    /// The second-stage trees that ranges of `tree` starting in `[start, end]` refer to.
    pub fn deep_in(&self, tree: Tree, start: u64, end: u64) -> Vec<Tree> {
        let mut out = Vec::new();
        self.collect_deep(tree.root, tree.height, 0, u64::MAX, (start, end), &mut out);
        out
    }

    fn collect_deep(
        &self,
        i: u32,
        height: u8,
        lo: u64,
        hi: u64,
        span: (u64, u64),
        out: &mut Vec<Tree>,
    ) {
        if height == 0 {
            let ranges = decode_leaf(&self.leaves.get(i));
            let inside = ranges.iter().filter(|r| r.0 >= span.0 && r.0 <= span.1);
            out.extend(inside.filter_map(|r| Tree::from_deep(r.1)));
            return;
        }
        let children = decode_node(&self.nodes.get(i), lo);
        for (k, &(c_lo, c)) in children.iter().enumerate() {
            let c_hi = children.get(k + 1).map_or(hi, |next| next.0 - 1);
            if c_lo <= span.1 && c_hi >= span.0 {
                self.collect_deep(c, height - 1, c_lo, c_hi, span, out);
            }
        }
    }

    /// Makes the ranges over `[start, end]` of `tree` exactly `new` (sorted, the first
    /// starting at `start`, none after `end`), keeping every value outside; returns the
    /// tree, which may have a new root and height.
    pub fn assign(&mut self, tree: Tree, start: u64, end: u64, new: &[(u64, u32)]) -> Tree {
        debug_assert_eq!(new.first().map(|r| r.0), Some(start));
        let span = Span { start, end, new };
        let top = match self.rewrite(tree.root, tree.height, 0, u64::MAX, &span) {
            Subtrees::One(root) => {
                return Tree {
                    root,
                    height: tree.height,
                }
            }
            Subtrees::Many(top) => top,
        };
        self.build_above(top, tree.height)
    }

    /// Rewrites the subtree at `i` (of `height` node levels) covering `[lo, hi]` for
    /// `span`; returns the subtrees that replace it, `(first key, index)`, in order.
    fn rewrite(&mut self, i: u32, height: u8, lo: u64, hi: u64, span: &Span) -> Subtrees {
        if height == 0 {
            return self.rewrite_leaf(i, lo, hi, span);
        }
        let children = decode_node(&self.nodes.get(i), lo);
        let bound = |k: usize| children.get(k + 1).map_or(hi, |next| next.0 - 1);
        // The children the span overlaps: usually one.
        let first = children
            .partition_point(|c| c.0 <= span.start)
            .saturating_sub(1);
        let last = children.partition_point(|c| c.0 <= span.end) - 1;
        if first == last {
            let (c_lo, c) = children[first];
            match self.rewrite(c, height - 1, c_lo, bound(first), span) {
                Subtrees::One(j) if j == c => return Subtrees::One(i),
                Subtrees::One(j) => {
                    let mut patched = children;
                    patched.set(first, (c_lo, j));
                    return Subtrees::One(self.write_node(i, &patched));
                }
                Subtrees::Many(replaced) => {
                    let mut out = Vec::with_capacity(children.len() + replaced.len());
                    out.extend_from_slice(&children[..first]);
                    out.extend(replaced);
                    out.extend_from_slice(&children[first + 1..]);
                    return self.split_node(i, out);
                }
            }
        }
        let mut out = Vec::with_capacity(children.len() + 1);
        let mut changed = false;
        out.extend_from_slice(&children[..first]);
        for (k, &(c_lo, c)) in children.iter().enumerate().take(last + 1).skip(first) {
            match self.rewrite(c, height - 1, c_lo, bound(k), span) {
                Subtrees::One(j) => {
                    changed |= j != c;
                    out.push((c_lo, j));
                }
                Subtrees::Many(replaced) => {
                    changed = true;
                    out.extend(replaced);
                }
            }
        }
        out.extend_from_slice(&children[last + 1..]);
        if !changed {
            return Subtrees::One(i);
        }
        self.split_node(i, out)
    }

    /// Writes `children` into node `i`, or, when they are too many for one node, into as
    /// few nodes as hold them, split evenly.
    fn split_node(&mut self, i: u32, children: Vec<(u64, u32)>) -> Subtrees {
        if children.len() <= NODE_CHILDREN {
            return Subtrees::One(self.write_node(i, &children));
        }
        let parts = children.len().div_ceil(NODE_CHILDREN);
        let mut result = Vec::with_capacity(parts);
        let mut from = 0;
        for p in 0..parts {
            let to = children.len() * (p + 1) / parts;
            let group = &children[from..to];
            let j = if p == 0 {
                self.write_node(i, group)
            } else {
                self.new_node(group)
            };
            result.push((group[0].0, j));
            from = to;
        }
        Subtrees::Many(result)
    }

    /// Rewrites leaf `i`, covering `[lo, hi]`, for `span`.
    fn rewrite_leaf(&mut self, i: u32, lo: u64, hi: u64, span: &Span) -> Subtrees {
        let old = decode_leaf(&self.leaves.get(i));
        let mut ranges = std::mem::take(&mut self.scratch);
        ranges.clear();
        let mut push = |start: u64, value: u32| match ranges.last_mut() {
            Some(last) if last.1 == value => {}
            _ => ranges.push((start, value)),
        };
        // Before the span.
        for &(start, value) in old.iter().take_while(|r| r.0 < span.start) {
            push(start, value);
        }
        // The span, within this leaf.
        let from = span.start.max(lo);
        let to = span.end.min(hi);
        let first = span.new.partition_point(|r| r.0 <= from) - 1;
        push(from, span.new[first].1);
        for &(start, value) in span.new[first + 1..].iter().take_while(|r| r.0 <= to) {
            push(start, value);
        }
        // After the span: the range holding `end + 1` keeps its value from there on.
        if to < hi {
            let after = to + 1;
            let holding = old.partition_point(|r| r.0 <= after) - 1;
            push(after, old[holding].1);
            for &(start, value) in &old[holding + 1..] {
                push(start, value);
            }
        }
        let result = if *ranges == *old {
            Subtrees::One(i)
        } else if fits_leaf(&ranges) {
            Subtrees::One(self.write_leaf(i, &ranges))
        } else {
            let mut result = Vec::new();
            let mut rest = &ranges[..];
            while !rest.is_empty() {
                let n = leaf_take(rest);
                let j = if result.is_empty() {
                    self.write_leaf(i, &rest[..n])
                } else {
                    self.new_leaf(&rest[..n])
                };
                result.push((rest[0].0, j));
                rest = &rest[n..];
            }
            Subtrees::Many(result)
        };
        self.scratch = ranges;
        result
    }

    /// Checks the tree's shape and that its leaves' ranges are sorted and start where their
    /// subtrees do; returns its ranges in order (for tests).
    #[cfg(test)]
    pub fn ranges(&self, tree: Tree) -> Vec<(u64, u32)> {
        let mut out = Vec::new();
        self.collect(tree.root, tree.height, 0, &mut out);
        out
    }

    #[cfg(test)]
    fn collect(&self, i: u32, height: u8, lo: u64, out: &mut Vec<(u64, u32)>) {
        if height == 0 {
            let r = decode_leaf(&self.leaves.get(i));
            assert_eq!(r[0].0, lo, "a leaf starts where its subtree does");
            out.extend_from_slice(&r);
            return;
        }
        let children = decode_node(&self.nodes.get(i), lo);
        for w in children.windows(2) {
            assert!(w[0].0 < w[1].0, "separators increase");
        }
        for &(c_lo, c) in children.iter() {
            self.collect(c, height - 1, c_lo, out);
        }
    }

    /// Leaves and nodes reachable from `tree`, second stages included (for tests).
    #[cfg(test)]
    pub fn reachable(&self, tree: Tree) -> (usize, usize) {
        if tree.height == 0 {
            let deep = decode_leaf(&self.leaves.get(tree.root))
                .iter()
                .filter_map(|&(_, v)| Tree::from_deep(v))
                .map(|t| self.reachable(t))
                .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
            return (deep.0 + 1, deep.1);
        }
        decode_node(&self.nodes.get(tree.root), 0)
            .iter()
            .map(|&(_, c)| {
                self.reachable(Tree {
                    root: c,
                    height: tree.height - 1,
                })
            })
            .fold((0, 1), |a, b| (a.0 + b.0, a.1 + b.1))
    }

    /// Leaves and nodes free or released since the last publish (for tests).
    #[cfg(test)]
    pub fn idle(&self) -> (usize, usize) {
        (
            self.free_leaves.len() + self.released.leaves.len(),
            self.free_nodes.len() + self.released.nodes.len(),
        )
    }
}

/// What replaces a subtree after a rewrite: itself or a copy, or several subtrees when it
/// split.
enum Subtrees {
    One(u32),
    Many(Vec<(u64, u32)>),
}

/// An assignment being applied.
struct Span<'a> {
    start: u64,
    end: u64,
    new: &'a [(u64, u32)],
}
