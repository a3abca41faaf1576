//! Packet buffers made once and handed out in bulk: no allocation per packet.
//!
//! A [`Pool`] holds `count` buffers of `size` bytes in one page-aligned allocation, so
//! that the same memory can be lent to the kernel as an AF_XDP UMEM, where frames are
//! received into and sent from without a copy. A buffer is named by its index
//! ([`BufferId`]), as VPP names its buffers, so that a vector of packets is a vector of
//! `u32`s; the frame in a buffer is `len` bytes from an offset in it (0, unless the kernel
//! placed the frame past a headroom). Buffers are taken and given back many at a time,
//! from a stack of free ones (the most recently freed, whose memory is warmest, goes out
//! first). A buffer given back twice, or one that was never taken, is refused and
//! counted: the pool's free stack is never corrupted.
//!
//! The bytes are reached through a raw pointer, never through one slice over the whole
//! area: while a buffer is lent to the kernel (taken from the pool, its index in an AF_XDP
//! ring) the kernel may write it at any moment, so a Rust reference may only ever span
//! the one buffer a caller holds.
//!
//! The area is an anonymous mapping: the kernel gives it zeroed and page-aligned, and
//! makes a page resident only when it is first touched, so a pool of large buffers
//! (64 KiB, for the segments a sender left unsplit) costs what its frames use.
//!
//! Beside each frame a buffer keeps what its sender left for a device to do
//! ([`Offload`]: a checksum to finish, segments to cut), as the kernel keeps it beside a
//! packet.

use crate::offload::Offload;
use std::ptr::NonNull;

/// A buffer's index in its pool.
pub type BufferId = u32;

/// Alignment of the pool's area: a page, as an AF_XDP UMEM must be.
#[cfg(test)]
const AREA_ALIGN: usize = 4096;

/// Preallocated packet buffers.
#[derive(Debug)]
pub struct Pool {
    /// `count * size` bytes, zeroed at the start, aligned to a page; owned by the pool.
    area: NonNull<u8>,
    /// The area's length in bytes.
    area_len: usize,
    size: usize,
    /// Each buffer's frame and state, side by side: a frame is found from one record
    /// (one bounds check, one cache line), as every stage finds it for every packet.
    buffers: Vec<Buffer>,
    /// The free buffers, a stack.
    free: Vec<BufferId>,
    /// Buffers given back that were not taken.
    refused: u64,
}

/// What the pool holds of one buffer.
#[derive(Clone, Copy, Debug)]
struct Buffer {
    /// Where its frame starts in it.
    offset: u32,
    /// Its frame's length.
    len: u32,
    /// Whether it is taken.
    taken: bool,
    /// What its frame leaves to be done.
    offload: Offload,
}

impl Buffer {
    /// A buffer free, or just taken: its frame empty, at its start, nothing to do.
    const EMPTY: Buffer = Buffer {
        offset: 0,
        len: 0,
        taken: false,
        offload: Offload::NONE,
    };
}

// SAFETY: the pool owns its area alone (nothing else holds the pointer but what the
// kernel is lent, which is not bound to a thread), so moving it to another thread moves
// all access with it.
unsafe impl Send for Pool {}

impl Drop for Pool {
    fn drop(&mut self) {
        #[cfg(not(miri))]
        // SAFETY: `area` is the mapping made in `Pool::new`, `area_len` bytes long,
        // unmapped once, here; nothing borrows it past the pool.
        unsafe {
            libc::munmap(self.area.as_ptr().cast(), self.area_len);
        }
        #[cfg(miri)]
        // SAFETY: under Miri the area was allocated with this layout in `Pool::new`,
        // and is freed once, here.
        unsafe {
            std::alloc::dealloc(self.area.as_ptr(), miri_layout(self.area_len))
        }
    }
}

/// The layout of the area under Miri, which cannot map memory: a page-aligned
/// allocation.
#[cfg(miri)]
fn miri_layout(len: usize) -> std::alloc::Layout {
    std::alloc::Layout::from_size_align(len, 4096).expect("pool too large")
}

/// `len` bytes of zeroed, page-aligned memory owned by the caller.
fn map_area(len: usize) -> NonNull<u8> {
    #[cfg(not(miri))]
    {
        // SAFETY: a new private anonymous mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            panic!("a pool of {len} bytes: {}", std::io::Error::last_os_error());
        }
        NonNull::new(p.cast()).expect("mmap never gives null")
    }
    #[cfg(miri)]
    {
        let layout = miri_layout(len);
        // SAFETY: the layout's size is at least 1.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout))
    }
}

impl Pool {
    /// The most a buffer holds: a 64 KiB segment a sender left unsplit, with its
    /// headers.
    pub const MAX_BUFFER: usize = 1 << 17;

    /// `count` buffers of `size` bytes each (at most [`Pool::MAX_BUFFER`]).
    pub fn new(count: usize, size: usize) -> Pool {
        let size = size.clamp(1, Pool::MAX_BUFFER);
        let count = count.max(1);
        let area_len = count.checked_mul(size).expect("pool too large");
        let area = map_area(area_len);
        Pool {
            area,
            area_len,
            size,
            buffers: vec![Buffer::EMPTY; count],
            free: (0..count as BufferId).rev().collect(),
            refused: 0,
        }
    }

    /// Buffers in the pool.
    pub fn count(&self) -> usize {
        self.buffers.len()
    }

    /// The whole area, to lend to the kernel as a UMEM: page-aligned, `count() *
    /// buffer_size()` bytes, buffer `i` at `i * buffer_size()`. It stays where it is while
    /// the pool lives. Whoever lends it must have the kernel write only buffers it holds
    /// taken, and stop before the pool is dropped.
    pub fn area(&self) -> NonNull<[u8]> {
        NonNull::slice_from_raw_parts(self.area, self.area_len)
    }

    /// Buffer `i`, if taken.
    #[inline]
    fn taken(&self, i: usize) -> Option<&Buffer> {
        self.buffers.get(i).filter(|b| b.taken)
    }

    fn is_taken(&self, i: usize) -> bool {
        self.taken(i).is_some()
    }

    /// Where buffer `i`'s frame starts, and the room from there to the buffer's end.
    fn span(&self, i: usize) -> (*mut u8, usize) {
        self.span_at(i, self.buffers[i].offset)
    }

    /// [`Pool::span`] of buffer `i` whose frame starts at `offset` (less than the
    /// buffer's size).
    #[inline]
    fn span_at(&self, i: usize, offset: u32) -> (*mut u8, usize) {
        let offset = offset as usize;
        (
            // In bounds: `i < count` and `offset < size`, so the pointer stays in the area.
            self.area.as_ptr().wrapping_add(i * self.size + offset),
            self.size - offset,
        )
    }

    /// Where buffer `id`'s frame starts, and how many bytes it may hold from there: for a
    /// socket to fill or read it (the frame's length is then set with [`Pool::resize`]).
    /// `None` if `id` is not taken. The bytes stay where they are while the pool lives,
    /// and no other buffer's overlap them.
    pub fn raw(&mut self, id: BufferId) -> Option<(*mut u8, usize)> {
        let i = id as usize;
        self.is_taken(i).then(|| self.span(i))
    }

    /// Places buffer `id`'s frame at `offset` bytes into it, `len` long (both cut to the
    /// buffer), as the kernel placed a received frame; false if `id` is not taken.
    pub fn place(&mut self, id: BufferId, offset: usize, len: usize) -> bool {
        let i = id as usize;
        if !self.is_taken(i) {
            return false;
        }
        let offset = offset.min(self.size - 1);
        let b = &mut self.buffers[i];
        b.offset = offset as u32;
        b.len = len.min(self.size - offset) as u32;
        true
    }

    /// Where buffer `id`'s frame starts in it, and its length (`None` if not taken).
    pub fn placement(&self, id: BufferId) -> Option<(usize, usize)> {
        self.taken(id as usize)
            .map(|b| (b.offset as usize, b.len as usize))
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

    /// Takes up to `n` buffers, appended to `out` (their frames empty, at the buffer's
    /// start); returns how many it took (fewer when the pool runs short).
    pub fn alloc(&mut self, n: usize, out: &mut Vec<BufferId>) -> usize {
        let n = n.min(self.free.len());
        let from = self.free.len() - n;
        for &id in &self.free[from..] {
            self.buffers[id as usize] = Buffer {
                taken: true,
                ..Buffer::EMPTY
            };
        }
        out.extend(self.free.drain(from..).rev());
        n
    }

    /// Gives buffers back. One not taken (given back twice, or never taken, or out of
    /// range) is refused and counted.
    pub fn free(&mut self, ids: &[BufferId]) {
        for &id in ids {
            match self.buffers.get_mut(id as usize) {
                Some(b) if b.taken => {
                    b.taken = false;
                    self.free.push(id);
                }
                _ => self.refused += 1,
            }
        }
    }

    /// The first `len` bytes of buffer `i`'s frame span, which starts at `offset` (`len`
    /// within its room).
    #[inline]
    fn bytes(&self, i: usize, offset: u32, len: usize) -> &[u8] {
        let (start, room) = self.span_at(i, offset);
        debug_assert!(len <= room);
        // SAFETY: buffer `i` is taken (every caller checked), so neither the pool nor the
        // kernel writes it but through `self`; the span lies inside the area, which lives
        // as long as `self`, and no other buffer's bytes overlap it.
        unsafe { std::slice::from_raw_parts(start, len.min(room)) }
    }

    /// As [`Pool::bytes`], to change.
    #[inline]
    fn bytes_mut(&mut self, i: usize, offset: u32, len: usize) -> &mut [u8] {
        let (start, room) = self.span_at(i, offset);
        debug_assert!(len <= room);
        // SAFETY: as in `bytes`; the pool is borrowed mutably, so this is the only
        // reference to the span while it lives.
        unsafe { std::slice::from_raw_parts_mut(start, len.min(room)) }
    }

    /// The frame in buffer `id` (empty if it is not taken).
    #[inline]
    pub fn frame(&self, id: BufferId) -> &[u8] {
        let i = id as usize;
        match self.taken(i) {
            Some(b) => self.bytes(i, b.offset, b.len as usize),
            None => &[],
        }
    }

    /// The frame in buffer `id`, to change in place (empty if it is not taken).
    #[inline]
    pub fn frame_mut(&mut self, id: BufferId) -> &mut [u8] {
        let i = id as usize;
        match self.taken(i).copied() {
            Some(b) => self.bytes_mut(i, b.offset, b.len as usize),
            None => &mut [],
        }
    }

    /// Sets the length of buffer `id`'s frame to `len` (at most the room from its start
    /// to the buffer's end; bytes past the old length are what the buffer last held) and
    /// returns the frame. Empty if `id` is not taken.
    pub fn resize(&mut self, id: BufferId, len: usize) -> &mut [u8] {
        let i = id as usize;
        let Some(&b) = self.taken(i) else {
            return &mut [];
        };
        let len = len.min(self.size - b.offset as usize);
        self.buffers[i].len = len as u32;
        self.bytes_mut(i, b.offset, len)
    }

    /// Puts `frame` in buffer `id`, cut to the buffer's room; returns the bytes kept (0 if
    /// the buffer is not taken).
    pub fn fill(&mut self, id: BufferId, frame: &[u8]) -> usize {
        let i = id as usize;
        let Some(&b) = self.taken(i) else {
            return 0;
        };
        let n = frame.len().min(self.size - b.offset as usize);
        self.bytes_mut(i, b.offset, n).copy_from_slice(&frame[..n]);
        self.buffers[i].len = n as u32;
        n
    }

    /// What buffer `id`'s frame leaves to be done (nothing if it is not taken). A
    /// buffer taken from the pool starts with nothing.
    #[inline]
    pub fn offload(&self, id: BufferId) -> Offload {
        self.taken(id as usize).map_or(Offload::NONE, |b| b.offload)
    }

    /// Sets what buffer `id`'s frame leaves to be done; false if it is not taken.
    pub fn set_offload(&mut self, id: BufferId, offload: Offload) -> bool {
        match self.buffers.get_mut(id as usize) {
            Some(b) if b.taken => {
                b.offload = offload;
                true
            }
            _ => false,
        }
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
        // Fewer under Miri, which runs each step thousands of times slower.
        let rounds = if cfg!(miri) { 200 } else { 5_000 };
        for round in 0..rounds {
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

    /// A frame placed past a headroom (as the kernel places one it receives) is read,
    /// grown and cut within its own buffer, and the next take starts it at 0 again.
    #[test]
    fn a_placed_frame_stays_inside_its_buffer() {
        let mut pool = Pool::new(4, 256);
        assert_eq!(pool.area().len(), 4 * 256);
        assert_eq!(pool.area().cast::<u8>().as_ptr() as usize % AREA_ALIGN, 0);
        let mut ids = Vec::new();
        pool.alloc(2, &mut ids);
        let (a, b) = (ids[0], ids[1]);
        assert!(pool.place(a, 200, 100));
        assert_eq!(
            pool.placement(a),
            Some((200, 56)),
            "cut to the buffer's end"
        );
        pool.frame_mut(a).fill(0xaa);
        pool.fill(b, &[0xbb; 256]);
        assert_eq!(pool.frame(a), &[0xaa; 56][..]);
        assert_eq!(pool.resize(a, 1000).len(), 56);
        assert_eq!(pool.resize(a, 10).len(), 10);
        let (start, room) = pool.raw(a).expect("taken");
        assert_eq!(room, 56);
        assert_eq!(
            start as usize - pool.area().cast::<u8>().as_ptr() as usize,
            a as usize * 256 + 200
        );
        assert_eq!(pool.frame(b), &[0xbb; 256][..], "the neighbour untouched");
        let partial = Offload {
            checksum: Some(crate::offload::PartialChecksum {
                start: 34,
                offset: 6,
            }),
            ..Offload::NONE
        };
        assert!(pool.set_offload(a, partial));
        assert_eq!(pool.offload(a), partial);
        assert_eq!(pool.offload(b), Offload::NONE);
        pool.free(&[a]);
        assert!(!pool.set_offload(a, partial), "a free buffer keeps nothing");
        assert!(!pool.place(a, 0, 1), "a free buffer is not placed");
        assert_eq!(pool.placement(a), None);
        let mut again = Vec::new();
        pool.alloc(1, &mut again);
        assert_eq!(again, [a]);
        assert_eq!(pool.placement(a), Some((0, 0)));
        assert_eq!(
            pool.offload(a),
            Offload::NONE,
            "taken again, it starts with nothing"
        );
        assert_eq!(pool.resize(a, 256).len(), 256);
    }
}
