//! Packet buffers made once and handed out in bulk: no allocation per packet.
//!
//! A [`Pool`] holds `count` buffers of `size` bytes in one allocation. A buffer is named
//! by its index ([`BufferId`]), as VPP names its buffers, so that a vector of packets is
//! a vector of `u32`s; the frame in a buffer is its first `len` bytes. Buffers are taken
//! and given back many at a time, from a stack of free ones (the most recently freed,
//! whose memory is warmest, goes out first). A buffer given back twice, or one that was
//! never taken, is refused and counted: the pool's free stack is never corrupted.

/// A buffer's index in its pool.
pub type BufferId = u32;

/// Preallocated packet buffers.
#[derive(Debug)]
pub struct Pool {
    data: Vec<u8>,
    size: usize,
    lens: Vec<u16>,
    /// The free buffers, a stack.
    free: Vec<BufferId>,
    /// Whether each buffer is taken.
    taken: Vec<bool>,
    /// Buffers given back that were not taken.
    refused: u64,
}

impl Pool {
    /// `count` buffers of `size` bytes each (a frame's most: at most 65,535).
    pub fn new(count: usize, size: usize) -> Pool {
        let size = size.min(u16::MAX as usize);
        Pool {
            data: vec![0; count * size],
            size,
            lens: vec![0; count],
            free: (0..count as BufferId).rev().collect(),
            taken: vec![false; count],
            refused: 0,
        }
    }

    /// Where buffer `id`'s bytes start, and how many it holds at most: for a socket to
    /// fill or read it (the frame's length is then set with [`Pool::resize`]). `None` if
    /// `id` is not taken. The bytes stay where they are while the pool lives, and no other
    /// buffer's overlap them.
    pub fn raw(&mut self, id: BufferId) -> Option<(*mut u8, usize)> {
        let i = id as usize;
        if !self.taken.get(i).copied().unwrap_or(false) {
            return None;
        }
        // Through the vector's own pointer, not a slice of it, so that pointers to two
        // buffers taken one after the other are both still valid.
        Some((
            self.data.as_mut_ptr().wrapping_add(i * self.size),
            self.size,
        ))
    }

    /// Bytes a buffer holds at most.
    pub fn buffer_size(&self) -> usize {
        self.size
    }

    /// Buffers free now.
    pub fn available(&self) -> usize {
        self.free.len()
    }

    /// Buffers given back that were not taken (refused, the pool unchanged).
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Takes up to `n` buffers, appended to `out` (their frames empty); returns how many
    /// it took (fewer when the pool runs short).
    pub fn alloc(&mut self, n: usize, out: &mut Vec<BufferId>) -> usize {
        let n = n.min(self.free.len());
        let from = self.free.len() - n;
        for &id in &self.free[from..] {
            self.taken[id as usize] = true;
            self.lens[id as usize] = 0;
        }
        out.extend(self.free.drain(from..).rev());
        n
    }

    /// Gives buffers back. One not taken (given back twice, or never taken, or out of
    /// range) is refused and counted.
    pub fn free(&mut self, ids: &[BufferId]) {
        for &id in ids {
            match self.taken.get_mut(id as usize) {
                Some(t) if *t => {
                    *t = false;
                    self.free.push(id);
                }
                _ => self.refused += 1,
            }
        }
    }

    /// The frame in buffer `id` (empty if it is not taken).
    pub fn frame(&self, id: BufferId) -> &[u8] {
        let i = id as usize;
        if !self.taken.get(i).copied().unwrap_or(false) {
            return &[];
        }
        &self.data[i * self.size..i * self.size + self.lens[i] as usize]
    }

    /// The frame in buffer `id`, to change in place (empty if it is not taken).
    pub fn frame_mut(&mut self, id: BufferId) -> &mut [u8] {
        let i = id as usize;
        if !self.taken.get(i).copied().unwrap_or(false) {
            return &mut [];
        }
        &mut self.data[i * self.size..i * self.size + self.lens[i] as usize]
    }

    /// Sets the length of buffer `id`'s frame to `len` (at most the buffer size; bytes past
    /// the old length are what the buffer last held) and returns the frame. Empty if `id`
    /// is not taken.
    pub fn resize(&mut self, id: BufferId, len: usize) -> &mut [u8] {
        let i = id as usize;
        if !self.taken.get(i).copied().unwrap_or(false) {
            return &mut [];
        }
        let len = len.min(self.size);
        self.lens[i] = len as u16;
        &mut self.data[i * self.size..i * self.size + len]
    }

    /// Puts `frame` in buffer `id`, cut to the buffer's size; returns the bytes kept (0 if
    /// the buffer is not taken).
    pub fn fill(&mut self, id: BufferId, frame: &[u8]) -> usize {
        let i = id as usize;
        if !self.taken.get(i).copied().unwrap_or(false) {
            return 0;
        }
        let n = frame.len().min(self.size);
        self.data[i * self.size..i * self.size + n].copy_from_slice(&frame[..n]);
        self.lens[i] = n as u16;
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Random bulk takes and gives back, double and wild frees among them: no buffer is
    /// ever out twice, every one comes back, frames stay each their own.
    #[test]
    fn buffers_go_out_once_and_come_back() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let mut pool = Pool::new(512, 128);
        let mut out: Vec<BufferId> = Vec::new();
        let mut refused = 0;
        for round in 0..5_000 {
            if rng.gen_bool(0.5) {
                let before = out.len();
                let want = rng.gen_range(0..300);
                let got = pool.alloc(want, &mut out);
                assert_eq!(got, want.min(512 - before), "round {round}");
                for &id in &out[before..] {
                    assert!(pool.frame(id).is_empty());
                    let n = pool.fill(id, &[id as u8; 200]);
                    assert_eq!(n, 128);
                }
            } else {
                let n = rng.gen_range(0..=out.len());
                let gone: Vec<BufferId> = out.drain(..n).collect();
                for &id in &out {
                    assert_eq!(pool.frame(id), &[id as u8; 128][..], "round {round}");
                }
                pool.free(&gone);
                // Given back again, or never taken: refused.
                if let Some(&again) = gone.first() {
                    pool.free(&[again, 100_000]);
                    refused += 2;
                }
            }
            let mut seen = out.clone();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen.len(), out.len(), "a buffer out twice");
            assert_eq!(pool.available() + out.len(), 512);
            assert_eq!(pool.refused(), refused);
        }
        pool.free(&out);
        assert_eq!(pool.available(), 512);
        assert!(pool.frame_mut(3).is_empty(), "a free buffer has no frame");
    }
}
