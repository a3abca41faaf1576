//! Packets one worker hands another: those of a connection another worker's table
//! holds ([`fibre_conntrack::Owners`]), so that both directions of a connection meet
//! its state in one table, which only its worker touches, without a lock.
//!
//! Each worker has a mailbox: a bounded queue of batches (one a vector for each worker
//! it hands packets to; the queue is `std`'s, which takes no lock) and an `eventfd`
//! that wakes it. A batch holds the frames copied out of the sender's pool (its buffers
//! go back at once: over AF_XDP each worker's frames lie in memory the kernel lent its
//! own sockets), each with the link it arrived on, whether the kernel has its own copy
//! and what its sender left undone. The owner copies them into its pool and runs them
//! through its pipeline as frames of that link. A full mailbox drops the batch, counted
//! (`handoff_dropped`): a worker that falls behind does not make the others wait. The
//! packets of one flow, from one link, go in one worker's batches in order, so they stay
//! in order.

use crate::input::Arrival;
use crate::offload::Offload;
use crate::pool::{BufferId, Pool};
use fibre_conntrack::Forward;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TrySendError};
use std::sync::{Mutex, PoisonError};

/// Batches a mailbox holds at most (each up to a vector's packets).
pub const MAILBOX_BATCHES: usize = 64;

/// The bytes of frames a batch kept to be filled again may have room for: a vector of
/// full-sized Ethernet frames (a mailbox's spares stay under 64 MiB).
pub const SPARE_BYTES: usize = 1 << 20;

/// A handed packet: where its frame lies in the batch, how it came.
#[derive(Clone, Copy, Debug)]
struct Item {
    start: usize,
    len: usize,
    arrival: Arrival,
    kernel_has_its_copy: bool,
    offload: Offload,
    hops: u8,
}

/// Packets that arrived alike, unpacked: the link, whether the kernel has its own
/// copy, the times handed over, their buffers.
pub type Group = (Arrival, bool, u8, Vec<BufferId>);

/// The times a packet may be handed over: to the worker its tuple hashes to, then on
/// to the owner a forward names. One handed more is dropped (the workers' words about
/// it disagree), never passed round.
pub const HOPS: u8 = 2;

/// Packets handed to one worker together.
#[derive(Default)]
pub struct Batch {
    bytes: Vec<u8>,
    items: Vec<Item>,
}

impl Batch {
    /// Copies the frame of `id` into the batch, with how it came and the times it has
    /// been handed over, this one counted.
    pub fn push(
        &mut self,
        pool: &Pool,
        id: BufferId,
        arrival: Arrival,
        kernel_has_its_copy: bool,
        hops: u8,
    ) {
        let frame = pool.frame(id);
        let start = self.bytes.len();
        self.bytes.extend_from_slice(frame);
        self.items.push(Item {
            start,
            len: frame.len(),
            arrival,
            kernel_has_its_copy,
            offload: pool.offload(id),
            hops,
        });
    }

    /// Packets held.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Puts the packets into buffers of `pool`, in groups that arrived alike (the link,
    /// the kernel's copy or not, the times handed over), in order: each group's
    /// arrival, whether the kernel has its copy, the times handed over, its buffers.
    /// Returns the packets that found no buffer (or no room in one), which are dropped.
    pub fn unpack(&self, pool: &mut Pool, groups: &mut Vec<Group>) -> usize {
        let mut lost = 0;
        let mut k = 0;
        while k < self.items.len() {
            let first = self.items[k];
            let alike = |i: &Item| {
                i.arrival == first.arrival
                    && i.kernel_has_its_copy == first.kernel_has_its_copy
                    && i.hops == first.hops
            };
            let end = k + self.items[k..].iter().take_while(|i| alike(i)).count();
            // The group's buffers taken at once; packets past what the pool has lost.
            let mut ids = Vec::with_capacity(end - k);
            let got = pool.alloc(end - k, &mut ids);
            lost += end - k - got;
            let mut kept = 0;
            for (item, slot) in self.items[k..k + got].iter().zip(0..) {
                let id = ids[slot];
                let frame = &self.bytes[item.start..item.start + item.len];
                if pool.fill(id, frame) < frame.len() {
                    pool.free(&[id]);
                    lost += 1;
                    continue;
                }
                pool.set_offload(id, item.offload);
                ids[kept] = id;
                kept += 1;
            }
            ids.truncate(kept);
            if !ids.is_empty() {
                groups.push((first.arrival, first.kernel_has_its_copy, first.hops, ids));
            }
            k = end;
        }
        lost
    }
}

/// A worker's mailbox: where the others put the packets it owns, and what their
/// tables tell its table ([`Forward`]: the tuples hashing to it of connections they
/// own, which NAT translated).
pub struct Mailbox {
    sender: SyncSender<Batch>,
    /// Taken by its worker only (the queue's reader is one); held here, not by the
    /// worker's thread, so that a worker started again after a failure reads on.
    receiver: Mutex<Receiver<Batch>>,
    wake: OwnedFd,
    /// Not bounded: at most two a translated connection, and one lost would leave a
    /// connection's replies to meet none.
    forwards: Sender<Forward>,
    told: Mutex<Receiver<Forward>>,
    /// Batches the worker emptied, for the senders to fill again: their memory goes
    /// round rather than being made by one thread and given back by another.
    spare: Mutex<Vec<Batch>>,
}

impl Mailbox {
    /// An empty mailbox.
    pub fn new() -> io::Result<Mailbox> {
        let (sender, receiver) = mpsc::sync_channel(MAILBOX_BATCHES);
        let (forwards, told) = mpsc::channel();
        // SAFETY: `eventfd` takes no pointer; its result is checked before use.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Mailbox {
            sender,
            receiver: Mutex::new(receiver),
            // SAFETY: `fd` was just opened, and nothing else owns it.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
            forwards,
            told: Mutex::new(told),
            spare: Mutex::new(Vec::new()),
        })
    }

    /// Keeps `batch`, which its worker has unpacked, for a sender to fill again (at
    /// most as many as the mailbox holds, each of at most [`SPARE_BYTES`]: one that
    /// carried merged frames of 64 KiB is let go, so that what is kept stays small).
    pub fn give_back(&self, mut batch: Batch) {
        if batch.bytes.capacity() > SPARE_BYTES {
            return;
        }
        batch.bytes.clear();
        batch.items.clear();
        let mut spare = self.spare.lock().unwrap_or_else(PoisonError::into_inner);
        if spare.len() < MAILBOX_BATCHES {
            spare.push(batch);
        }
    }

    /// Tells the worker's table `f`. (Its worker takes it before it tracks the packets
    /// it reads next: posted before the owner sends a connection's first packet, it is
    /// there before any reply.)
    pub fn tell(&self, f: Forward) {
        // (The receiver lives as long as the mailbox.)
        let _ = self.forwards.send(f);
    }

    /// Gives each of what the worker's table was told to `take`, in order.
    pub fn take_forwards(&self, mut take: impl FnMut(Forward)) {
        let told = self.told.lock().unwrap_or_else(PoisonError::into_inner);
        while let Ok(f) = told.try_recv() {
            take(f);
        }
    }

    /// Posts `batch` and wakes the mailbox's worker, leaving an empty batch in its
    /// place (one the worker gave back, when there is one); false (the packets
    /// dropped) if the mailbox is full.
    pub fn post(&self, batch: &mut Batch) -> bool {
        let empty = self
            .spare
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
            .unwrap_or_default();
        let full = std::mem::replace(batch, empty);
        match self.sender.try_send(full) {
            Ok(()) => {
                let one = 1u64.to_ne_bytes();
                // SAFETY: `one` is eight live bytes, as an eventfd's write takes. (It
                // cannot fail but at the counter's limit, when the worker is awake
                // anyway.)
                unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), 8) };
                true
            }
            Err(TrySendError::Full(full)) | Err(TrySendError::Disconnected(full)) => {
                self.give_back(full);
                false
            }
        }
    }

    /// What wakes the worker: readable when a batch was posted.
    pub fn fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }

    /// Takes the batches posted, each given to `take`. With `woken` (the worker's poll
    /// found the mailbox readable), the wake-up is read first, so that one posted
    /// meanwhile wakes the worker again; a worker that did not sleep leaves it (a
    /// system call saved each round), to be read when it next polls.
    pub fn drain(&self, woken: bool, mut take: impl FnMut(Batch)) {
        if woken {
            let mut count = [0u8; 8];
            // SAFETY: `count` is eight live bytes, as an eventfd's read takes; a read
            // with nothing posted fails (`EAGAIN`), which says nothing is to be
            // cleared.
            unsafe { libc::read(self.wake.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
        }
        let receiver = self.receiver.lock().unwrap_or_else(PoisonError::into_inner);
        // (At most what it holds: senders that keep posting do not keep it here.)
        for _ in 0..MAILBOX_BATCHES {
            match receiver.try_recv() {
                Ok(batch) => take(batch),
                Err(_) => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrival(link: u32) -> Arrival {
        Arrival {
            link,
            mac: [2, 0, 0, 0, 0, link as u8],
        }
    }

    #[test]
    fn batches_carry_frames_in_order_with_how_they_came() {
        let mut from = Pool::new(8, 2048);
        let mut ids = Vec::new();
        from.alloc(5, &mut ids);
        let mut batch = Batch::default();
        for (k, &id) in ids.iter().enumerate() {
            from.fill(id, &vec![k as u8; 60 + k]);
            let mut offload = Offload::NONE;
            offload.checksum_valid = k == 2;
            from.set_offload(id, offload);
            batch.push(&from, id, arrival(if k < 3 { 7 } else { 9 }), k == 4, 1);
        }
        let mailbox = Mailbox::new().expect("eventfd");
        assert!(mailbox.post(&mut batch));
        assert!(batch.is_empty(), "an empty batch left in its place");
        let mut to = Pool::new(8, 2048);
        let mut seen = Vec::new();
        let mut runs = Vec::new();
        mailbox.drain(true, |b| {
            let mut groups = Vec::new();
            assert_eq!(b.unpack(&mut to, &mut groups), 0);
            for (arrival, copy, hops, ids) in groups {
                assert_eq!(hops, 1);
                runs.push((arrival.link, copy, ids.len()));
                for &id in &ids {
                    seen.push((to.frame(id).to_vec(), to.offload(id).checksum_valid));
                }
                to.free(&ids);
            }
        });
        assert_eq!(runs, [(7, false, 3), (9, false, 1), (9, true, 1)]);
        for (k, (frame, valid)) in seen.iter().enumerate() {
            assert_eq!(frame, &vec![k as u8; 60 + k]);
            assert_eq!(*valid, k == 2);
        }
        assert_eq!(to.available(), 8, "every buffer given back");
    }

    /// A batch the worker gives back is what the next post leaves in its sender's
    /// hands, its room kept and its packets gone; one with room past `SPARE_BYTES`
    /// (merged frames) is let go.
    #[test]
    fn batches_given_back_go_round_unless_too_large() {
        let mailbox = Mailbox::new().expect("eventfd");
        let mut small = Batch::default();
        small.bytes.reserve(4096);
        small.bytes.extend_from_slice(&[1; 100]);
        small.items.push(Item {
            start: 0,
            len: 100,
            arrival: arrival(1),
            kernel_has_its_copy: false,
            offload: Offload::NONE,
            hops: 1,
        });
        mailbox.give_back(small);
        let mut large = Batch::default();
        large.bytes.reserve(SPARE_BYTES + 1);
        mailbox.give_back(large);
        let mut posted = Batch::default();
        assert!(mailbox.post(&mut posted));
        assert!(posted.is_empty() && posted.bytes.is_empty());
        let room = posted.bytes.capacity();
        assert!((4096..=SPARE_BYTES).contains(&room), "{room}");
        // The large one was not kept: the next post gets a new batch.
        assert!(mailbox.post(&mut posted));
        assert_eq!(posted.bytes.capacity(), 0);
    }

    #[test]
    fn a_full_mailbox_refuses_and_a_short_pool_loses_what_it_cannot_hold() {
        let mailbox = Mailbox::new().expect("eventfd");
        for _ in 0..MAILBOX_BATCHES {
            assert!(mailbox.post(&mut Batch::default()));
        }
        assert!(!mailbox.post(&mut Batch::default()));
        let mut taken = 0;
        mailbox.drain(true, |b| {
            taken += 1;
            mailbox.give_back(b);
        });
        assert_eq!(taken, MAILBOX_BATCHES);
        assert!(mailbox.post(&mut Batch::default()));

        let mut from = Pool::new(4, 2048);
        let mut ids = Vec::new();
        from.alloc(3, &mut ids);
        let mut batch = Batch::default();
        for &id in &ids {
            from.fill(id, &[1u8; 100]);
            batch.push(&from, id, arrival(3), false, 1);
        }
        let mut to = Pool::new(2, 2048);
        let mut groups = Vec::new();
        let lost = batch.unpack(&mut to, &mut groups);
        assert_eq!((groups[0].3.len(), lost), (2, 1));
        // A frame longer than the buffers: lost, its buffer given back.
        let mut small = Pool::new(2, 64);
        let mut groups = Vec::new();
        let lost = batch.unpack(&mut small, &mut groups);
        assert_eq!((lost, small.available(), groups.len()), (3, 2, 0));
    }
}
