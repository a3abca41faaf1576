//! A vector kept in chunks that copies of it share: a snapshot's nodes and their answers.
//!
//! A published routing state is double-buffered: the writer patches the snapshot
//! published before the current one while readers look up the current one. Were each
//! snapshot's nodes a vector of their own, the full tables would be held twice. Kept in
//! chunks, a copy of the snapshot shares every chunk with its original; a change copies
//! the one chunk it falls in (if another copy holds it), and [`Chunked::share_equal`]
//! makes the chunks that a patch brought back to the other copy's contents shared again.
//! So the two snapshots hold the nodes once, but for the chunks the last batch changed.

use std::sync::Arc;

/// Elements a chunk holds.
const CHUNK: usize = 1024;

/// A vector of `T` in chunks of [`CHUNK`] elements, shared between clones.
#[derive(Clone, Debug)]
pub(crate) struct Chunked<T> {
    chunks: Vec<Arc<Vec<T>>>,
    len: usize,
}

impl<T> Default for Chunked<T> {
    fn default() -> Self {
        Chunked {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

impl<T: Clone> Chunked<T> {
    /// Fits the last chunk to what it holds, once built: a chunk is made with room for
    /// [`CHUNK`] elements, which a small table would otherwise keep empty.
    pub(crate) fn fit(&mut self) {
        if let Some(last) = self.chunks.last_mut() {
            Arc::make_mut(last).shrink_to_fit();
        }
    }

    /// How many elements there are.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Adds `item` at the end.
    pub(crate) fn push(&mut self, item: T) {
        match self.chunks.last_mut() {
            Some(last) if last.len() < CHUNK => Arc::make_mut(last).push(item),
            _ => {
                let mut chunk = Vec::with_capacity(CHUNK);
                chunk.push(item);
                self.chunks.push(Arc::new(chunk));
            }
        }
        self.len += 1;
    }

    /// The elements, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        self.chunks.iter().flat_map(|c| c.iter())
    }

    /// Bytes the elements take (a chunk shared with a copy counted in each).
    pub(crate) fn memory(&self) -> usize {
        self.chunks
            .iter()
            .map(|c| c.capacity() * std::mem::size_of::<T>())
            .sum::<usize>()
            + self.chunks.capacity() * std::mem::size_of::<Arc<Vec<T>>>()
    }
}

impl<T: Clone + PartialEq> Chunked<T> {
    /// Shares with `other` each chunk whose elements are the same as its chunk at the
    /// same place (checked only where the two hold chunks of their own).
    pub(crate) fn share_equal(&mut self, other: &Chunked<T>) {
        for (mine, theirs) in self.chunks.iter_mut().zip(&other.chunks) {
            if !Arc::ptr_eq(mine, theirs) && mine == theirs {
                *mine = Arc::clone(theirs);
            }
        }
    }
}

impl<T> Chunked<T> {
    /// How many of its chunks are `other`'s own (the same allocation), and how many
    /// chunks it has.
    #[cfg(test)]
    pub(crate) fn chunks_shared_with(&self, other: &Chunked<T>) -> (usize, usize) {
        let shared = self
            .chunks
            .iter()
            .zip(&other.chunks)
            .filter(|(a, b)| Arc::ptr_eq(a, b))
            .count();
        (shared, self.chunks.len())
    }
}

impl<T: Clone> FromIterator<T> for Chunked<T> {
    /// The elements of `items`, in order, each written once into its chunk.
    fn from_iter<I: IntoIterator<Item = T>>(items: I) -> Chunked<T> {
        let mut chunked = Chunked::default();
        for item in items {
            chunked.push(item);
        }
        chunked.fit();
        chunked
    }
}

impl<T> std::ops::Index<usize> for Chunked<T> {
    type Output = T;

    #[inline]
    fn index(&self, i: usize) -> &T {
        &self.chunks[i / CHUNK][i % CHUNK]
    }
}

impl<T: Clone> std::ops::IndexMut<usize> for Chunked<T> {
    /// The element, its chunk copied first if a copy of the vector shares it.
    #[inline]
    fn index_mut(&mut self, i: usize) -> &mut T {
        &mut Arc::make_mut(&mut self.chunks[i / CHUNK])[i % CHUNK]
    }
}

impl<'a, T: Clone> IntoIterator for &'a Chunked<T> {
    type Item = &'a T;
    type IntoIter = Box<dyn Iterator<Item = &'a T> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Pushes, writes and clones read back as a plain vector does; a clone shares
        /// every chunk until written, and chunks written back to equal contents are
        /// shared again.
        #[test]
        fn reads_as_a_vector_and_shares_what_is_equal(
            start in 0usize..5000,
            edits in proptest::collection::vec((0usize..6000, 0u32..4, any::<bool>()), 0..200),
        ) {
            let mut plain: Vec<u32> = (0..start as u32).collect();
            let mut chunked: Chunked<u32> = plain.iter().copied().collect();
            let original = chunked.clone();
            for (at, value, push) in edits {
                if push || plain.is_empty() {
                    plain.push(value);
                    chunked.push(value);
                } else {
                    let at = at % plain.len();
                    plain[at] = value;
                    chunked[at] = value;
                }
            }
            prop_assert_eq!(chunked.len(), plain.len());
            prop_assert_eq!(chunked.iter().copied().collect::<Vec<_>>(), plain.clone());
            for (i, v) in plain.iter().enumerate() {
                prop_assert_eq!(chunked[i], *v);
            }
            // The clone kept its elements.
            prop_assert_eq!(original.iter().copied().collect::<Vec<_>>(), (0..start as u32).collect::<Vec<_>>());
            // Back to the original's contents, every chunk the original filled is the
            // original's (its last, if pushed onto since, holds more).
            let mut back = chunked.clone();
            for i in 0..start {
                back[i] = i as u32;
            }
            back.share_equal(&original);
            for (mine, theirs) in back.chunks.iter().zip(&original.chunks).take(start / CHUNK) {
                prop_assert!(Arc::ptr_eq(mine, theirs));
            }
        }
    }
}
