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
//! range tree rebuilds the tree in bulk when it has grown to twice its built size (see
//! `mod.rs`), which keeps the walk short without merge logic on the update path.
//!
//! A node's children sit side by side in one block of their arena (leaves for the
//! bottom nodes, nodes above), so a lookup finds a child by adding its rank to the
//! block's base. Copy on write works on blocks: a block allocated since the last publish
//! is changed in place, and then nothing above it changes; any other is copied whole
//! (up to 16 lines, with one vector copy) and the old one released, to be reused once no
//! reader can reach it ([`crate::memory`]), and the parent's line, which names the block,
//! changes in turn.
//! So an update after a publish copies one block a level up to the root, each at most
//! once between publishes. (Explicit child indices, one copied line a level, were
//! measured too: the dependent read of the index made lookups 10-15% slower.)

use super::layout::{
    decode_leaf, decode_node, encode_leaf, encode_node, leaf_take, node_block, LeafLine, NodeLine,
    Steps, DEEP, DEEP_HEIGHT_SHIFT, DEEP_ROOT, LEAF_RANGES, NODE_CHILDREN, NODE_KEYS, NODE_WORDS,
};
use crate::form::Portable;
use crate::memory::{Blocks, Released};

/// A tree: its root (a node, or a leaf when `height` is 0) and its number of node levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tree {
    pub root: u32,
    pub height: u8,
}

impl Tree {
    /// The stored value that refers to this tree as a second stage.
    ///
    /// # Panics
    /// If the root's index needs more than 28 bits (a leaf arena of 16 GiB) or the tree
    /// more than 7 levels (16^7 leaves): a stored value has no room for them, and a
    /// wrong reference would be worse than stopping.
    pub fn to_deep(self) -> u32 {
        assert!(
            self.root <= DEEP_ROOT && self.height < 8,
            "second-stage tree out of the stored value's range"
        );
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

/// What a publish released from the leaf and node arenas.
#[derive(Debug)]
pub(crate) struct TreeReleased {
    pub leaves: Released,
    pub nodes: Released,
}

/// The content of a leaf (the first 8 words) or of a node.
type Line = [u64; NODE_WORDS];

/// The arenas of leaves and nodes, with what copy on write and reuse need.
#[derive(Debug, Default)]
pub(crate) struct Store {
    pub leaves: Blocks<LeafLine>,
    pub nodes: Blocks<NodeLine>,
    /// Reused by leaf rewrites, to spare an allocation each.
    scratch: Vec<(u64, u32)>,
    /// Leaves and nodes in use (not free, not waiting for readers).
    pub live_leaves: usize,
    pub live_nodes: usize,
}

/// Searches `tree` for `key` with `steps`: the stored value of its range.
#[inline(always)]
pub(crate) fn search<S: Steps>(
    steps: S,
    leaves: &[LeafLine],
    nodes: &[NodeLine],
    tree: Tree,
    key: u64,
) -> u32 {
    let mut i = tree.root;
    for _ in 0..tree.height {
        i = steps.node_child(&nodes[i as usize], key);
    }
    steps.leaf_value(&leaves[i as usize], key)
}

impl Store {
    /// The stored value of `key` in `tree` (the writer's search: portable steps).
    pub fn search(&self, tree: Tree, key: u64) -> u32 {
        search(
            Portable,
            &self.leaves.buffer()[..],
            &self.nodes.buffer()[..],
            tree,
            key,
        )
    }

    /// Bytes of the free lists and of what copy on write tracks.
    pub fn update_bytes(&self) -> usize {
        self.leaves.update_bytes() + self.nodes.update_bytes() + 12 * self.scratch.capacity()
    }

    /// Marks everything published; returns what was released before, for reuse once no
    /// reader holds a snapshot that reaches it.
    pub fn publish(&mut self) -> TreeReleased {
        TreeReleased {
            leaves: self.leaves.publish(),
            nodes: self.nodes.publish(),
        }
    }

    /// Reuses blocks that no reader can reach any more.
    pub fn reclaim(&mut self, released: TreeReleased) {
        self.leaves.reclaim(released.leaves);
        self.nodes.reclaim(released.nodes);
    }

    /// A block of `size` lines for subtrees of `height` (leaves at 0).
    fn alloc(&mut self, height: u8, size: usize) -> u32 {
        let size = size as u32;
        if height == 0 {
            self.live_leaves += size as usize;
            self.leaves.alloc(size)
        } else {
            self.live_nodes += size as usize;
            self.nodes.alloc(size)
        }
    }

    /// Gives back a block: free now if no snapshot has seen it, later otherwise.
    fn release(&mut self, height: u8, base: u32, size: u32) {
        if height == 0 {
            self.live_leaves -= size as usize;
            self.leaves.release(base, size);
        } else {
            self.live_nodes -= size as usize;
            self.nodes.release(base, size);
        }
    }

    /// True if the block at `base` was allocated since the last publish.
    fn fresh(&self, height: u8, base: u32) -> bool {
        if height == 0 {
            self.leaves.is_fresh(base)
        } else {
            self.nodes.is_fresh(base)
        }
    }

    /// The line at `i` among subtrees of `height`.
    fn read(&self, height: u8, i: u32) -> Line {
        if height == 0 {
            let mut line = [0; NODE_WORDS];
            line[..8].copy_from_slice(&self.leaves.get(i));
            line
        } else {
            self.nodes.get(i)
        }
    }

    /// Writes the line at `i`, which no snapshot may reach ([`Blocks::set`] checks).
    fn write(&self, height: u8, i: u32, line: &Line) {
        if height == 0 {
            let mut leaf = [0; 8];
            leaf.copy_from_slice(&line[..8]);
            self.leaves.set(i, leaf);
        } else {
            self.nodes.set(i, *line);
        }
    }

    /// A new block holding `lines`, subtrees of `height`; returns its base.
    fn store_block(&mut self, height: u8, lines: &[(u64, Line)]) -> u32 {
        let base = self.alloc(height, lines.len());
        for (k, (_, line)) in lines.iter().enumerate() {
            self.write(height, base + k as u32, line);
        }
        base
    }

    /// A node over `children` (subtrees of `height - 1`), stored in a new block.
    fn node_over(&mut self, height: u8, children: &[(u64, Line)]) -> (u64, Line) {
        let base = self.store_block(height - 1, children);
        let mut firsts = [0; NODE_CHILDREN];
        for (f, c) in firsts.iter_mut().zip(children) {
            *f = c.0;
        }
        (children[0].0, encode_node(&firsts[..children.len()], base))
    }

    /// Builds a tree over `ranges` (sorted, the first starting at 0): leaves as full as
    /// their offsets allow, nodes full.
    pub fn build(&mut self, ranges: &[(u64, u32)]) -> Tree {
        debug_assert_eq!(ranges.first().map(|r| r.0), Some(0));
        self.build_above(leaf_lines(ranges), 0)
    }

    /// Puts levels of full nodes above `level` (subtrees of height `height`) until one
    /// root remains, and stores the root in a block of its own.
    fn build_above(&mut self, mut level: Vec<(u64, Line)>, mut height: u8) -> Tree {
        while level.len() > 1 {
            height += 1;
            level = level
                .chunks(NODE_CHILDREN)
                .map(|group| self.node_over(height, group))
                .collect();
        }
        let root = self.store_block(height, &level);
        Tree { root, height }
    }

    /// Gives back every block of `tree`, and of the second-stage trees its leaves refer
    /// to.
    pub fn release_tree(&mut self, tree: Tree) {
        let line = self.read(tree.height, tree.root);
        self.release_below(&line, tree.height);
        self.release(tree.height, tree.root, 1);
    }

    /// Gives back what the line of a subtree of `height` refers to.
    fn release_below(&mut self, line: &Line, height: u8) {
        if height == 0 {
            let mut leaf = [0; 8];
            leaf.copy_from_slice(&line[..8]);
            for &(_, v) in decode_leaf(&leaf).iter() {
                if let Some(deep) = Tree::from_deep(v) {
                    self.release_tree(deep);
                }
            }
            return;
        }
        let (base, count) = node_block(line);
        for k in 0..count {
            let child = self.read(height - 1, base + k);
            self.release_below(&child, height - 1);
        }
        self.release(height - 1, base, count);
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
        let line = self.read(tree.height, tree.root);
        let Some(top) = self.rewrite(&line, tree.height, 0, u64::MAX, &span) else {
            return tree;
        };
        if let [(_, root)] = &top[..] {
            if self.fresh(tree.height, tree.root) {
                self.write(tree.height, tree.root, root);
                return tree;
            }
        }
        self.release(tree.height, tree.root, 1);
        self.build_above(top, tree.height)
    }

    /// Rewrites the subtree of `height` whose root line is `line`, covering `[lo, hi]`,
    /// for `span`: `None` if its root line stays as it is (what changed below was
    /// written in place), else the root lines that replace it, `(first key, line)`.
    fn rewrite(
        &mut self,
        line: &Line,
        height: u8,
        lo: u64,
        hi: u64,
        span: &Span,
    ) -> Option<Vec<(u64, Line)>> {
        if height == 0 {
            return self.rewrite_leaf(line, lo, hi, span);
        }
        let children = decode_node(line, lo);
        let (base, count) = node_block(line);
        // The children the span overlaps: usually one.
        let first = children
            .partition_point(|c| c.0 <= span.start)
            .saturating_sub(1);
        let last = children.partition_point(|c| c.0 <= span.end) - 1;
        let mut replaced: Vec<(usize, Vec<(u64, Line)>)> = Vec::new();
        for k in first..=last {
            let (c_lo, c) = children[k];
            let c_hi = children.get(k + 1).map_or(hi, |next| next.0 - 1);
            let child = self.read(height - 1, c);
            if let Some(lines) = self.rewrite(&child, height - 1, c_lo, c_hi, span) {
                replaced.push((k, lines));
            }
        }
        if replaced.is_empty() {
            return None;
        }
        // One line for one: written in place if the block is new since the last publish.
        if self.fresh(height - 1, base) && replaced.iter().all(|r| r.1.len() == 1) {
            for (k, lines) in &replaced {
                self.write(height - 1, base + *k as u32, &lines[0].1);
            }
            return None;
        }
        // One line for one in a block a snapshot can reach: a copy of the block, and the
        // node's own line with its new base (its keys stay).
        if replaced.iter().all(|r| r.1.len() == 1) {
            let copy = self.alloc(height - 1, count as usize);
            if height == 1 {
                self.leaves.copy(base, copy, count);
            } else {
                self.nodes.copy(base, copy, count);
            }
            for (k, new) in &replaced {
                self.write(height - 1, copy + *k as u32, &new[0].1);
            }
            self.release(height - 1, base, count);
            let mut moved = *line;
            moved[NODE_KEYS] = u64::from(copy) | u64::from(count) << 32;
            return Some(vec![(lo, moved)]);
        }
        // Otherwise the children move to new blocks under one node or several.
        let mut lines: Vec<(u64, Line)> = Vec::with_capacity(count as usize + 1);
        let mut next = replaced.into_iter().peekable();
        for (k, &(c_lo, c)) in children.iter().enumerate() {
            match next.next_if(|r| r.0 == k) {
                Some((_, new)) => lines.extend(new),
                None => lines.push((c_lo, self.read(height - 1, c))),
            }
        }
        self.release(height - 1, base, count);
        let parts = lines.len().div_ceil(NODE_CHILDREN);
        let mut result = Vec::with_capacity(parts);
        let mut from = 0;
        for p in 0..parts {
            let to = lines.len() * (p + 1) / parts;
            result.push(self.node_over(height, &lines[from..to]));
            from = to;
        }
        Some(result)
    }

    /// Rewrites a leaf, covering `[lo, hi]`, for `span`.
    fn rewrite_leaf(
        &mut self,
        line: &Line,
        lo: u64,
        hi: u64,
        span: &Span,
    ) -> Option<Vec<(u64, Line)>> {
        let mut leaf = [0; 8];
        leaf.copy_from_slice(&line[..8]);
        let old = decode_leaf(&leaf);
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
        let result = (*ranges != *old).then(|| leaf_lines(&ranges));
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
            self.leaves.free_slots() + self.leaves.released_slots(),
            self.nodes.free_slots() + self.nodes.released_slots(),
        )
    }
}

/// `ranges` packed into leaf lines, as full as their offsets allow: `(first key, line)`.
fn leaf_lines(ranges: &[(u64, u32)]) -> Vec<(u64, Line)> {
    let mut lines = Vec::with_capacity(ranges.len() / LEAF_RANGES + 1);
    let mut rest = ranges;
    while !rest.is_empty() {
        let n = leaf_take(rest);
        let mut line = [0; NODE_WORDS];
        line[..8].copy_from_slice(&encode_leaf(&rest[..n]));
        lines.push((rest[0].0, line));
        rest = &rest[n..];
    }
    lines
}

/// An assignment being applied.
struct Span<'a> {
    start: u64,
    end: u64,
    new: &'a [(u64, u32)],
}
