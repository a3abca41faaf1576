//! The connection table, shaped as the kernel's `nf_conntrack_core.c` shapes it: one
//! hash table holds each connection under the tuple of each of its directions, so that
//! a packet of either direction finds the same connection with one lookup, and a reply
//! (whose tuple is the original's inverted, or after NAT something else again) needs no
//! other structure. Each worker has one, holding the connections it owns
//! ([`crate::owners`]: a packet another worker's connection holds is handed to it, as
//! VPP's nat44-ed hands packets to the worker that owns their session), and what NAT
//! asks of every worker's connections is in the registry they share
//! ([`crate::registry`]), so that together they answer as the kernel's one table does.
//!
//! Connections live in a slab (a vector of slots, a free list); the hash table holds
//! 32-bit handles (slot and direction), not copies of the tuples, so that a connection
//! costs its slot (164 bytes: two tuples, its status, mark, times and protocol state)
//! and two handles.
//!
//! A packet is tracked as `nf_conntrack_in` tracks it at the prerouting hook:
//!
//! 1. its tuple read (a fragment is not tracked: the kernel reassembles first; a
//!    protocol whose tracker fibre does not have is the kernel's); ICMP and ICMPv6
//!    errors are RELATED to the connection their quoted packet belongs to, or invalid;
//!    ICMPv6 neighbour discovery and MLD are untracked;
//! 2. its connection found by the tuple (an expired one is gone), or a new one made,
//!    unconfirmed: held aside until the packet passes every hook ([`Conntrack::confirm`],
//!    the kernel's confirm at the last hook), so that a packet the firewall drops leaves
//!    no connection behind; beyond `nf_conntrack_max` an unassured connection is
//!    dropped early to make room, or the packet is dropped;
//! 3. the protocol's tracker decides (TCP's state machine and windows, UDP's streams,
//!    ICMP's requests and answers), refreshing the connection's timer;
//! 4. the packet's state for the rules: NEW (the original direction before any reply),
//!    ESTABLISHED, RELATED, INVALID (no connection would have it), UNTRACKED.

use crate::connection::At;
use crate::connection::{
    Connection, Fate, Forward, Nanos, Protocol, State, Tracked, Untrackable, ASSURED, CONFIRMED,
    SEEN_REPLY,
};
use crate::kept::{Epoch, Epochs, Kept};
use crate::nat;
use crate::owners::{family_bit, Owners};
use crate::registry::Registry;
use crate::settings::Settings;
use crate::tcp::{self, Segment, Tcp, TcpState};
use crate::tuple::{self, Network, Tuple, TupleHash, Unread, ICMP, ICMPV6, TCP, UDP};
use hashbrown::HashTable;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// What the table counted, as the kernel's `conntrack -S` counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Packets that found their connection.
    pub found: u64,
    /// Connections entered (confirmed).
    pub inserted: u64,
    /// Packets invalid.
    pub invalid: u64,
    /// Packets let pass without changing their connection.
    pub ignored: u64,
    /// Packets dropped for want of room.
    pub dropped: u64,
    /// Connections dropped early to make room.
    pub early_dropped: u64,
    /// Connections gone, their time up.
    pub expired: u64,
    /// Packets handed to the kernel.
    pub kernel: u64,
    /// Packets dropped because their new connection clashed with another as it was
    /// entered.
    pub insert_failed: u64,
    /// Bindings that translate a new connection's source (snat, masquerade, or a null
    /// binding that moved its port off one taken).
    pub source_translated: u64,
    /// Bindings that translate a new connection's destination (dnat).
    pub destination_translated: u64,
    /// Connections entered as the kernel tracked them ([`Conntrack::import`]).
    pub imported: u64,
}

impl Stats {
    /// Adds what `other` counted.
    pub fn add(&mut self, other: &Stats) {
        let Stats {
            found,
            inserted,
            invalid,
            ignored,
            dropped,
            early_dropped,
            expired,
            kernel,
            insert_failed,
            source_translated,
            destination_translated,
            imported,
        } = *other;
        self.found += found;
        self.inserted += inserted;
        self.invalid += invalid;
        self.ignored += ignored;
        self.dropped += dropped;
        self.early_dropped += early_dropped;
        self.expired += expired;
        self.kernel += kernel;
        self.insert_failed += insert_failed;
        self.source_translated += source_translated;
        self.destination_translated += destination_translated;
        self.imported += imported;
    }
}

const TWO_SECONDS: u64 = 2_000_000_000;
/// Released reply tuples kept, at most, until drained.
pub const RELEASED_MAX: usize = 65_536;
/// Unconfirmed connections kept, at most, between settlings (a vector's worth).
const PENDING_MAX: usize = 1024;
/// Slots looked at, at most, to find a connection to drop early.
const EVICTION_RANGE: usize = 64;

/// The connection table of one namespace's forwarded packets.
pub struct Conntrack {
    settings: Settings,
    pub(crate) slots: Vec<Option<Connection>>,
    free: Vec<u32>,
    /// Slots given back during the vector: free from the next on, so that a packet of
    /// the vector that found its connection in one never meets another connection
    /// there (its translation, its kept verdict).
    freed: Vec<u32>,
    index: HashTable<u32>,
    /// The hash of `index`'s tuples.
    tuple_hash: TupleHash,
    /// The connections the vector's packets made, unconfirmed: each one's ticket, when
    /// it was made, the connection.
    pending: Vec<(u64, u64, Connection)>,
    /// The vector's connections confirmed: their ticket, their slot.
    confirmed: Vec<(u64, u32)>,
    ticket: u64,
    /// The connections the vector's packets closed, by ticket, for the rules to read
    /// and NAT to translate their packets by.
    gone: Vec<(u64, Connection)>,
    /// What NAT asks of every worker's connections ([`crate::registry`]), shared
    /// with the other workers' tables.
    registry: Arc<Mutex<Registry>>,
    /// The families whose every connection enters the registry (those NAT translates:
    /// [`Conntrack::register`]); a translated connection enters it whatever its family.
    registering: u8,
    /// The tuples that hash to this worker of connections another worker owns (a
    /// translated connection's reply, mostly): their packets go to it. Each owner
    /// counted (told it holds one, +1; no longer, -1), the last told first, so that
    /// what is said holds whatever order the owners' words arrive in.
    forwards: hashbrown::HashMap<[u64; 5], Vec<(u16, i32)>, foldhash::fast::FixedState>,
    /// What the other workers' `forwards` are to learn of this table's connections,
    /// each with the worker it is for.
    outbox: Vec<(u16, Forward)>,
    /// The state of the random numbers NAT draws ports from.
    pub(crate) random: u64,
    /// The tuples of translated connections removed since the last
    /// [`Conntrack::drain_released`]: the reply tuple of a source translated, the
    /// original of a destination translated.
    released: Vec<Tuple>,
    /// Where the sweep and the early drop look next.
    cursor: usize,
    /// The hashes, then handles, of the vector [`Conntrack::warm`] warms (its room kept
    /// from vector to vector).
    warming: Vec<u64>,
    /// The epochs verdicts are kept under.
    pub(crate) epochs: Epochs,
    /// What it counted.
    pub stats: Stats,
    /// Which worker's table it is, among how many ([`Owners`](crate::Owners)).
    owners: Owners,
    /// The connections of every worker's table together, which `nf_conntrack_max`
    /// bounds as the kernel's count of its one table.
    census: Arc<AtomicUsize>,
}

/// A handle: slot and direction.
fn handle(slot: u32, dir: usize) -> u32 {
    slot << 1 | dir as u32
}

impl Conntrack {
    /// An empty table following `settings`.
    pub fn new(settings: Settings) -> Conntrack {
        Conntrack {
            settings,
            slots: Vec::new(),
            free: Vec::new(),
            freed: Vec::new(),
            index: HashTable::new(),
            tuple_hash: TupleHash::new(),
            pending: Vec::new(),
            confirmed: Vec::new(),
            ticket: 0,
            gone: Vec::new(),
            registry: Arc::default(),
            registering: 0,
            forwards: Default::default(),
            outbox: Vec::new(),
            random: foldhash::fast::RandomState::default().hash_one(0x5eed_u64) | 1,
            released: Vec::new(),
            cursor: 0,
            epochs: Epochs::default(),
            warming: Vec::new(),
            stats: Stats::default(),
            owners: Owners::default(),
            census: Arc::default(),
        }
    }

    /// Which worker's table it is.
    pub fn owners(&self) -> &Owners {
        &self.owners
    }

    /// Makes it worker `owners.me`'s table ([`Conntrack::redistribute`] moves the
    /// connections with it).
    pub fn set_owners(&mut self, owners: Owners) {
        self.owners = owners;
    }

    /// Has it count its connections into `census`, the count of every worker's table,
    /// which `nf_conntrack_max` bounds.
    pub fn set_census(&mut self, census: Arc<AtomicUsize>) {
        census.fetch_add(self.len(), Ordering::Relaxed);
        self.census.fetch_sub(self.len(), Ordering::Relaxed);
        self.census = census;
    }

    /// The connections of every table counted with it ([`Conntrack::set_census`]).
    pub fn census(&self) -> usize {
        self.census.load(Ordering::Relaxed)
    }

    /// Takes out the connections `leaving` holds, as they are, to enter in another
    /// worker's table ([`Conntrack::adopt`]): nothing of them is counted as ended.
    pub fn hand_over(&mut self, leaving: impl Fn(&Connection) -> bool) -> Vec<Connection> {
        // (Between vectors: what the last one made and did not confirm is gone.)
        self.settle();
        let released = self.released.len();
        let out: Vec<Connection> = self
            .slots_where(leaving)
            .into_iter()
            .filter_map(|slot| self.remove(slot))
            .collect();
        // (Not ended: their frames are not the kernel's again.)
        self.released.truncate(released);
        // (The slots are free at once: no packet of a vector is under way.)
        self.free.append(&mut self.freed);
        out
    }

    /// Enters a connection another worker's table handed over, as it was (the
    /// verdicts kept on it were under that table's epochs, and are forgotten).
    pub fn adopt(&mut self, mut c: Connection) {
        c.kept = Default::default();
        self.insert(c);
    }

    /// Has it share `registry` with the other workers' tables (its connections that
    /// enter one leave the last and enter this one).
    pub fn set_registry(&mut self, registry: Arc<Mutex<Registry>>) {
        let entering: Vec<&Connection> = self
            .slots
            .iter()
            .flatten()
            .filter(|c| self.enters_registry(c))
            .collect();
        {
            let mut old = self.registry();
            for c in &entering {
                old.leave(c, c.status & nat::SRC_NAT_DONE != 0);
            }
        }
        {
            let mut new = registry
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for c in &entering {
                new.enter(c, c.status & nat::SRC_NAT_DONE != 0);
            }
        }
        self.registry = registry;
    }

    /// The registry, held.
    pub(crate) fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Has every connection of `families` (bit 0 IPv4, bit 1 IPv6) enter the registry
    /// from now on, those held now too: the families NAT translates, whose bindings
    /// must not take a tuple any worker's connection holds.
    pub fn register(&mut self, families: u8) {
        let new = families & !self.registering;
        if new == 0 {
            return;
        }
        let entering: Vec<&Connection> = self
            .slots
            .iter()
            .flatten()
            .filter(|c| new & family_bit(c.tuples[0].v6) != 0 && !self.enters_registry(c))
            .collect();
        {
            let mut registry = self.registry();
            for c in entering {
                registry.enter(c, c.status & nat::SRC_NAT_DONE != 0);
            }
        }
        self.registering |= new;
    }

    /// The families whose every connection enters the registry.
    pub fn registering(&self) -> u8 {
        self.registering
    }

    /// Whether `c` enters the registry: of a family NAT translates, or bound by NAT.
    fn enters_registry(&self, c: &Connection) -> bool {
        self.registering & family_bit(c.tuples[0].v6) != 0
            || c.status & (nat::SRC_NAT | nat::DST_NAT | nat::SRC_NAT_DONE) != 0
    }

    /// Tells the workers that `c`'s tuples hash to (other than this table's) that this
    /// one holds it (`entered`), or no longer does.
    fn tell_forwards(&mut self, c: &Connection, entered: bool) {
        if self.owners.workers <= 1 {
            return;
        }
        let me = self.owners.me;
        for t in &c.tuples {
            let to = self.owners.of_tuple(t);
            if to != me {
                let f = if entered {
                    Forward::Add(*t, me)
                } else {
                    Forward::Remove(*t, me)
                };
                self.outbox.push((to, f));
            }
        }
    }

    /// Moves what the other workers' tables are to learn into `out`: each the worker
    /// it is for, and what.
    pub fn drain_outbox(&mut self, out: &mut Vec<(u16, Forward)>) {
        out.append(&mut self.outbox);
    }

    /// Whether it has anything for the other workers.
    pub fn has_outbox(&self) -> bool {
        !self.outbox.is_empty()
    }

    /// Learns what another worker's table said ([`Conntrack::drain_outbox`]).
    pub fn forward(&mut self, f: Forward) {
        let (t, owner, step) = match f {
            Forward::Add(t, owner) => (t, owner, 1),
            Forward::Remove(t, owner) => (t, owner, -1),
        };
        let key = t.words();
        let owners = self.forwards.entry(key).or_default();
        let count = match owners.iter().position(|o| o.0 == owner) {
            Some(k) => owners.remove(k).1 + step,
            None => step,
        };
        if count != 0 {
            owners.push((owner, count));
        }
        if owners.is_empty() {
            self.forwards.remove(&key);
        }
    }

    /// Forgets what it forwards and what it was to tell ([`Conntrack::redistribute`]
    /// makes both anew).
    pub(crate) fn clear_forwards(&mut self) {
        self.forwards.clear();
        self.outbox.clear();
    }

    /// The tuples forwarded to other workers.
    pub fn forwards(&self) -> usize {
        self.forwards.len()
    }

    /// The worker a packet whose tuple's words are `key`, and which found no
    /// connection here, goes to, if another: the one the tuple hashes to, or the owner
    /// of a connection that holds it.
    #[inline]
    fn elsewhere(&self, key: &[u64; 5]) -> Option<u16> {
        if self.owners.workers <= 1 {
            return None;
        }
        let to = self.owners.of_tuple(&Tuple::from_words(key));
        if to != self.owners.me {
            return Some(to);
        }
        let owners = self.forwards.get(key)?;
        owners.iter().rev().find(|o| o.1 > 0).map(|o| o.0)
    }

    /// The settings followed.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Follows new settings (the namespace's sysctls changed).
    pub fn set_settings(&mut self, settings: Settings) {
        self.settings = settings;
    }

    /// The bytes the table holds for its connections (the slab's slots, free lists,
    /// the index, the forwards; allocations whether used or not), the registry it
    /// shares with the other tables left out ([`Registry::memory`]).
    pub fn memory(&self) -> usize {
        use std::mem::size_of;
        self.slots.capacity() * size_of::<Option<Connection>>()
            + (self.free.capacity() + self.freed.capacity()) * size_of::<u32>()
            + self.index.allocation_size()
            + self.pending.capacity() * size_of::<(u64, u64, Connection)>()
            + self.gone.capacity() * size_of::<(u64, Connection)>()
            + self.forwards.allocation_size()
    }

    /// The bytes the registry it shares with the other tables holds.
    pub fn registry_memory(&self) -> usize {
        self.registry().memory()
    }

    /// Connections held (confirmed; expired ones not yet swept included).
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len() - self.freed.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The connections held, with their remaining time at `now`.
    pub fn connections(&self, now: u64) -> impl Iterator<Item = (&Connection, u64)> {
        self.slots
            .iter()
            .flatten()
            .filter(move |c| c.expires.get() > now)
            .map(move |c| (c, c.expires.get() - now))
    }

    /// The connection a tracked packet belongs to (a new one too, before it is
    /// confirmed).
    #[inline]
    pub fn connection(&self, t: &Tracked) -> Option<&Connection> {
        // (A connection entered, most packets', told apart first, without the match's
        // jump.)
        if let At::Entry(slot) = t.at {
            return self.slots.get(slot as usize)?.as_ref();
        }
        self.connection_elsewhere(t)
    }

    /// [`Conntrack::connection`] of a packet whose connection is not entered: pending in
    /// the vector, or ended by it.
    fn connection_elsewhere(&self, t: &Tracked) -> Option<&Connection> {
        match t.at {
            At::Entry(slot) => self.slots.get(slot as usize)?.as_ref(),
            At::Pending(ticket) => match self.pending.iter().find(|p| p.0 == ticket) {
                Some(p) => Some(&p.2),
                None => {
                    let &(_, slot) = self.confirmed.iter().find(|c| c.0 == ticket)?;
                    self.slots.get(slot as usize)?.as_ref()
                }
            },
            At::Gone(ticket) => self.gone.iter().find(|g| g.0 == ticket).map(|g| &g.1),
            At::None => None,
        }
    }

    /// The connection a tracked packet belongs to, mutably.
    pub(crate) fn connection_mut(&mut self, t: &Tracked) -> Option<&mut Connection> {
        match t.at {
            At::Entry(slot) => self.slots.get_mut(slot as usize)?.as_mut(),
            At::Pending(ticket) => {
                if let Some(k) = self.pending.iter().position(|p| p.0 == ticket) {
                    return Some(&mut self.pending[k].2);
                }
                let &(_, slot) = self.confirmed.iter().find(|c| c.0 == ticket)?;
                self.slots.get_mut(slot as usize)?.as_mut()
            }
            At::Gone(ticket) => self
                .gone
                .iter_mut()
                .find(|g| g.0 == ticket)
                .map(|g| &mut g.1),
            At::None => None,
        }
    }

    /// Whether a tracked packet's connection is new, unconfirmed: one NAT may still bind.
    pub fn unconfirmed(&self, t: &Tracked) -> bool {
        matches!(t.at, At::Pending(ticket) if self.pending.iter().any(|p| p.0 == ticket))
    }

    /// Closes `t`'s connection, if it is a confirmed TCP one, as the kernel's
    /// `nf_conntrack_tcp_set_closing` does when a reset is sent for one of its packets
    /// (`reject with tcp reset`): state CLOSE, the close timeout from `now`. One
    /// already closed keeps its time.
    pub fn set_closing(&mut self, t: &Tracked, now: u64) {
        if self.unconfirmed(t) {
            return;
        }
        let close = self.settings.tcp.close;
        let Some(c) = self.connection_mut(t) else {
            return;
        };
        let Protocol::Tcp(tcp) = &mut c.protocol else {
            return;
        };
        if tcp.state != TcpState::Close {
            tcp.state = TcpState::Close;
            c.expires = now.saturating_add(close).into();
        }
    }

    /// The slot of a tracked packet's connection, if entered.
    pub(crate) fn slot_of(&self, t: &Tracked) -> Option<u32> {
        match t.at {
            At::Entry(slot) => Some(slot),
            At::Pending(ticket) => self.confirmed.iter().find(|c| c.0 == ticket).map(|c| c.1),
            _ => None,
        }
    }

    /// The connections with a source binding whose original source (address, port,
    /// protocol) is `t`'s, the newest first (as the kernel's list holds them).
    pub(crate) fn mapped_from(&self, t: &Tuple) -> Vec<([u8; 16], u16)> {
        self.registry().mapped_from(t)
    }

    /// Moves the tuples of the translated connections removed since the last call
    /// (the reply tuple of a source translated, the original of a destination
    /// translated) into `out` (at most [`RELEASED_MAX`] are kept between calls).
    pub fn drain_released(&mut self, out: &mut Vec<Tuple>) {
        out.append(&mut self.released);
    }

    /// Ends the vector: the connections its packets made and no hook confirmed are
    /// gone, as the kernel frees an unconfirmed connection with its packet. The packet
    /// path settles each vector before tracking its packets.
    pub fn settle(&mut self) {
        self.pending.clear();
        self.confirmed.clear();
        self.gone.clear();
        self.free.append(&mut self.freed);
    }

    fn hash(&self, t: &Tuple) -> u64 {
        self.tuple_hash.of(t)
    }

    /// The live connection under `t`: its slot and the direction `t` is. An expired one
    /// found is removed, as the kernel's lookup removes it.
    pub(crate) fn find(&mut self, t: &Tuple, now: u64) -> Option<(u32, usize)> {
        self.find_key(&t.words(), now)
    }

    /// [`Conntrack::find`] by the tuple's words ([`tuple::key`]).
    #[inline(always)]
    fn find_key(&mut self, key: &[u64; 5], now: u64) -> Option<(u32, usize)> {
        let hash = self.tuple_hash.of_words(key);
        let slots = &self.slots;
        let h = *self.index.find(hash, |&h| {
            slots[(h >> 1) as usize]
                .as_ref()
                .is_some_and(|c| tuple::same_words(&c.tuples[(h & 1) as usize].words(), key))
        })?;
        let slot = h >> 1;
        if self.slots[slot as usize].as_ref()?.expires.get() <= now {
            self.remove(slot);
            self.stats.expired += 1;
            return None;
        }
        Some((slot, (h & 1) as usize))
    }

    /// Reads, changing no connection, the memory that tracking the IP packets
    /// `packets` (a vector's, each from its header on) first reads: each one's handle in
    /// the index, then the slot it names. Warmed together, before any is tracked, a
    /// vector's lookups have their cache misses overlap, where tracked one by one each
    /// waits on its own; in three passes (hashes, handles, slots), so that each pass's
    /// loads depend on nothing the same pass loads, as VPP's nat44-ed hashes a whole
    /// vector and prefetches its buckets before it looks any up. Worth its cost (a
    /// second parse, hash and probe) only where the table outgrows the caches.
    pub fn warm<'p>(&mut self, packets: impl IntoIterator<Item = &'p [u8]>) {
        let mut hashes = std::mem::take(&mut self.warming);
        hashes.clear();
        for ip in packets {
            let Ok(n) = tuple::network(ip) else { continue };
            if let Some(key) = tuple::key(ip, &n) {
                hashes.push(self.tuple_hash.of_words(&key));
            }
        }
        // The first handle under each hash's tag: its connection's but for a tag
        // shared by chance. The control bytes and handles, not yet the slots.
        for h in &mut hashes {
            *h = self
                .index
                .find(*h, |_| true)
                .map_or(u64::MAX, |&k| u64::from(k));
        }
        // The slots: what tracking, NAT and the kept verdict read, wherever the
        // compiler laid it out.
        let mut touched = 0u64;
        for &k in &hashes {
            if let Some(Some(c)) = self.slots.get((k >> 1) as usize) {
                touched ^= c.expires.get() ^ u64::from(c.status ^ c.masquerade);
                touched ^= u64::from(c.kept == Kept::default());
            }
        }
        // (Kept, so that the loads are made.)
        std::hint::black_box(touched);
        self.warming = hashes;
    }

    /// The slots of the connections `which` picks.
    pub(crate) fn slots_where(&self, which: impl Fn(&Connection) -> bool) -> Vec<u32> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, c)| c.as_ref().is_some_and(&which))
            .map(|(s, _)| s as u32)
            .collect()
    }

    /// Removes the connection in `slot`, giving it back.
    pub(crate) fn remove(&mut self, slot: u32) -> Option<Connection> {
        let c = self.slots.get_mut(slot as usize)?.take()?;
        for dir in 0..2 {
            let hash = self.hash(&c.tuples[dir]);
            let wanted = handle(slot, dir);
            if let Ok(e) = self.index.find_entry(hash, |&h| h == wanted) {
                e.remove();
            }
        }
        if self.enters_registry(&c) {
            self.registry().leave(&c, c.status & nat::SRC_NAT_DONE != 0);
        }
        self.tell_forwards(&c, false);
        // Its tuples that arrive at an address NAT gave: the replies of a source
        // translated, the original direction of a destination translated.
        for (bit, dir) in [(nat::SRC_NAT, 1), (nat::DST_NAT, 0)] {
            if c.status & bit != 0 && self.released.len() < RELEASED_MAX {
                self.released.push(c.tuples[dir]);
            }
        }
        self.freed.push(slot);
        self.census.fetch_sub(1, Ordering::Relaxed);
        Some(c)
    }

    /// Enters `c` in the table: its slot.
    fn insert(&mut self, c: Connection) -> u32 {
        self.insert_entered(c, false)
    }

    /// [`Conntrack::insert`], `c` already in the registry if `registered`.
    fn insert_entered(&mut self, c: Connection, registered: bool) -> u32 {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(None);
                (self.slots.len() - 1) as u32
            }
        };
        for dir in 0..2 {
            let hash = self.hash(&c.tuples[dir]);
            let (slots, hasher) = (&self.slots, self.tuple_hash);
            let tuples = c.tuples;
            self.index.insert_unique(hash, handle(slot, dir), |&h| {
                let t = match slots.get((h >> 1) as usize).and_then(Option::as_ref) {
                    Some(other) => other.tuples[(h & 1) as usize],
                    // The connection being entered, not yet in its slot.
                    None => tuples[(h & 1) as usize],
                };
                hasher.of(&t)
            });
        }
        if !registered && self.enters_registry(&c) {
            self.registry().enter(&c, c.status & nat::SRC_NAT_DONE != 0);
        }
        self.tell_forwards(&c, true);
        self.slots[slot as usize] = Some(c);
        self.census.fetch_add(1, Ordering::Relaxed);
        slot
    }

    /// Enters a connection as it is (one the kernel tracked, imported), replacing any
    /// that holds either of its tuples.
    pub fn import(&mut self, mut c: Connection, now: u64) {
        for dir in 0..2 {
            if let Some((slot, _)) = self.find(&c.tuples[dir], now) {
                self.remove(slot);
            }
        }
        c.status |= CONFIRMED;
        self.insert(c);
        self.stats.imported += 1;
    }

    /// Removes the connections whose time is up, looking at `budget` slots at most from
    /// where the last sweep stopped: how many it removed.
    pub fn expire(&mut self, now: u64, budget: usize) -> usize {
        let mut removed = 0;
        for _ in 0..budget.min(self.slots.len()) {
            self.step_cursor();
            let slot = self.cursor as u32;
            if self.slots[self.cursor]
                .as_ref()
                .is_some_and(|c| c.expires.get() <= now)
            {
                self.remove(slot);
                self.stats.expired += 1;
                removed += 1;
            }
        }
        removed
    }

    /// The expiry cursor moved to the next slot, round to the first after the last
    /// (without a division: this runs for every packet of a large table).
    fn step_cursor(&mut self) {
        self.cursor += 1;
        if self.cursor >= self.slots.len() {
            self.cursor = 0;
        }
    }

    /// Makes room for one connection: an expired one, or one the kernel may drop early.
    fn early_drop(&mut self, now: u64) -> bool {
        for _ in 0..EVICTION_RANGE.min(self.slots.len()) {
            self.step_cursor();
            let Some(c) = self.slots[self.cursor].as_ref() else {
                continue;
            };
            let expired = c.expires.get() <= now;
            if expired || c.droppable() {
                self.remove(self.cursor as u32);
                if expired {
                    self.stats.expired += 1;
                } else {
                    self.stats.early_dropped += 1;
                }
                return true;
            }
        }
        false
    }

    /// The packet passed every hook: the connection it made, if any, is entered. False
    /// if it cannot be, another connection of the vector holding one of its tuples by
    /// now with another binding: the kernel drops the packet (`insert_failed`).
    #[inline]
    pub fn confirm(&mut self, t: &Tracked) -> bool {
        // (Most packets' connections are entered already: told so here, without the
        // call.)
        match t.at {
            At::Pending(ticket) => self.confirm_pending(ticket),
            _ => true,
        }
    }

    /// [`Conntrack::confirm`] of a packet whose connection is pending under `ticket`.
    fn confirm_pending(&mut self, ticket: u64) -> bool {
        let Some(k) = self.pending.iter().position(|p| p.0 == ticket) else {
            return true;
        };
        let (_, now, mut c) = self.pending.swap_remove(k);
        let found = [
            self.find(&c.tuples[0], now).map(|(s, _)| s),
            self.find(&c.tuples[1], now).map(|(s, _)| s),
        ];
        if let Some(slot) = found[0].or(found[1]) {
            let same = found[0] == found[1]
                && self.slots[slot as usize]
                    .as_ref()
                    .is_some_and(|o| o.tuples == c.tuples);
            if same {
                self.confirmed.push((ticket, slot));
                return true;
            }
            self.stats.insert_failed += 1;
            return false;
        }
        // Held by another worker's connection: the same clash. (Looked up and entered
        // at once.)
        c.status |= CONFIRMED;
        c.expires = now.saturating_add(c.expires.get()).into();
        let registered = self.enters_registry(&c);
        if registered
            && !self
                .registry()
                .enter_unless_taken(&c, c.status & nat::SRC_NAT_DONE != 0)
        {
            self.stats.insert_failed += 1;
            return false;
        }
        let slot = self.insert_entered(c, registered);
        self.confirmed.push((ticket, slot));
        self.stats.inserted += 1;
        true
    }

    /// Tracks the IP packet `ip` (from its header on; what runs past its length, a
    /// frame's padding, is ignored) arriving at `now` (nanoseconds), as the kernel's
    /// conntrack does at the prerouting hook. `vouched`: the link has vouched for its
    /// checksums (the kernel does not check them again), else they are checked when the
    /// namespace's `nf_conntrack_checksum` says so.
    pub fn track(&mut self, ip: &[u8], now: u64, vouched: bool) -> Tracked {
        // What the last packet made and no hook confirmed is gone, as the kernel frees
        // an unconfirmed connection with its packet.
        self.settle();
        self.track_in_vector(ip, now, vouched)
    }

    /// [`Conntrack::track`] for a packet of a vector whose packets are tracked in
    /// turn, each before the last is confirmed: what the vector's earlier packets made
    /// stays until [`Conntrack::settle`]. A packet of a flow an earlier packet of the
    /// vector began, unconfirmed yet, belongs to that packet's new connection.
    pub fn track_in_vector(&mut self, ip: &[u8], now: u64, vouched: bool) -> Tracked {
        if self.pending.len() >= PENDING_MAX {
            self.settle();
        }
        let t = self.track_inner(ip, now, !vouched && self.settings.checksum);
        match t.fate {
            Fate::TableFull => self.stats.dropped += 1,
            Fate::Kernel(_) => self.stats.kernel += 1,
            Fate::Elsewhere(_) => {}
            Fate::Pass if t.state == State::Invalid => self.stats.invalid += 1,
            Fate::Pass => {}
        }
        t
    }

    fn track_inner(&mut self, ip: &[u8], now: u64, check: bool) -> Tracked {
        let n = match tuple::network(ip) {
            Ok(n) => n,
            Err(Unread::Fragment) => return Tracked::fate(Fate::Kernel(Untrackable::Fragment)),
            Err(Unread::Malformed) => return Tracked::of(State::Invalid),
        };
        if tuple::UNTRACKED_HERE.contains(&n.protocol) {
            return Tracked::fate(Fate::Kernel(Untrackable::Protocol(n.protocol)));
        }
        let ip = &ip[..n.len];
        if matches!((n.protocol, n.v6), (ICMP, false) | (ICMPV6, true)) {
            if let Some(t) = self.icmp_error(ip, &n, now, check) {
                return t;
            }
        }
        let Some(key) = tuple::key(ip, &n) else {
            return Tracked::of(State::Invalid);
        };
        loop {
            // A connection entered is tracked where it lies.
            if let Some((slot, dir)) = self.find_key(&key, now) {
                self.stats.found += 1;
                let c = self.slots[slot as usize].as_mut().expect("found");
                let state = if dir == 1 || c.status & SEEN_REPLY != 0 {
                    State::Established
                } else {
                    State::New
                };
                let outcome = track_packet(&self.settings, c, ip, &n, dir, now, check);
                let mut tracked = Tracked {
                    fate: Fate::Pass,
                    state,
                    reply: dir == 1,
                    at: At::Entry(slot),
                };
                match outcome {
                    Handled::Accept | Handled::Ignore => {
                        // (Ignored, it passes, so that a reply is seen, as the kernel
                        // marks it.)
                        if dir == 1 {
                            c.status |= SEEN_REPLY;
                        }
                        if matches!(outcome, Handled::Ignore) {
                            self.stats.ignored += 1;
                        }
                    }
                    // A connection found stays.
                    Handled::Invalid => tracked = Tracked::of(State::Invalid),
                    Handled::Close => {
                        if let Some(c) = self.remove(slot) {
                            self.ticket += 1;
                            self.gone.push((self.ticket, c));
                            tracked.at = At::Gone(self.ticket);
                        }
                    }
                    Handled::Reopen => {
                        self.remove(slot);
                        continue;
                    }
                }
                return tracked;
            }
            // One an earlier packet of the vector made, unconfirmed, or a new one.
            let earlier = self
                .pending
                .iter()
                .position(|p| tuple::same_words(&p.2.tuples[0].words(), &key));
            let tuple = Tuple::from_words(&key);
            let (mut c, ticket) = match earlier {
                Some(k) => {
                    let (ticket, _, c) = self.pending.swap_remove(k);
                    (c, ticket)
                }
                None => {
                    // Not this worker's to make: the worker it hashes to holds it, or
                    // makes it. (A translated connection's reply, which hashes here:
                    // its owner's.)
                    if let Some(w) = self.elsewhere(&key) {
                        return Tracked::fate(Fate::Elsewhere(w));
                    }
                    let Some(reply) = tuple.inverted() else {
                        return Tracked::of(State::Invalid);
                    };
                    // Full: every table's connections together, as the kernel counts
                    // its one table's. Room is made in this one (the others are their
                    // workers'); one holding less than its share takes the connection
                    // anyway, so that a worker whose table is empty is not refused for
                    // what the others hold.
                    let max = self.settings.max as usize;
                    if max != 0
                        && self.census() + 1 > max
                        && !self.early_drop(now)
                        && self.len() >= max / usize::from(self.owners.workers.max(1))
                    {
                        return Tracked::fate(Fate::TableFull);
                    }
                    let protocol = match n.protocol {
                        TCP => Protocol::Tcp(Tcp::default()),
                        UDP => Protocol::Udp {
                            stream_after: (now + TWO_SECONDS).into(),
                        },
                        ICMP | ICMPV6 => Protocol::Icmp,
                        _ => Protocol::Generic,
                    };
                    self.ticket += 1;
                    let c = Connection {
                        tuples: [tuple, reply],
                        status: 0,
                        mark: 0,
                        expires: Nanos::default(),
                        protocol,
                        masquerade: 0,
                        kept: Default::default(),
                    };
                    (c, self.ticket)
                }
            };
            let state = if c.status & SEEN_REPLY != 0 {
                State::Established
            } else {
                State::New
            };
            let tracked = Tracked {
                fate: Fate::Pass,
                state,
                reply: false,
                at: At::Pending(ticket),
            };
            return match track_packet(&self.settings, &mut c, ip, &n, 0, now, check) {
                Handled::Accept | Handled::Close | Handled::Reopen => {
                    self.pending.push((ticket, now, c));
                    tracked
                }
                Handled::Ignore => {
                    self.stats.ignored += 1;
                    self.pending.push((ticket, now, c));
                    tracked
                }
                Handled::Invalid => {
                    // A connection made by this packet goes with it; an earlier one's
                    // stays.
                    if earlier.is_some() {
                        self.pending.push((ticket, now, c));
                    }
                    Tracked::of(State::Invalid)
                }
            };
        }
    }

    /// An ICMP or ICMPv6 message's checks, as `nf_conntrack_icmpv4_error` and
    /// `nf_conntrack_icmpv6_error` make them: `Some` outcome if they decide it (invalid,
    /// untracked, an error RELATED to a connection), `None` if it is tracked as a query
    /// or answer.
    fn icmp_error(&mut self, ip: &[u8], n: &Network, now: u64, check: bool) -> Option<Tracked> {
        let Some(header) = ip.get(n.transport..n.transport + 8) else {
            return Some(Tracked::of(State::Invalid));
        };
        if check && tuple::transport_checksum(ip, n) != 0 {
            return Some(Tracked::of(State::Invalid));
        }
        let kind = header[0];
        let error = if n.v6 {
            if matches!(kind, 130..=136 | 143) {
                return Some(Tracked::of(State::Untracked));
            }
            kind < 128
        } else {
            if kind > 18 {
                return Some(Tracked::of(State::Invalid));
            }
            matches!(kind, 3 | 4 | 5 | 11 | 12)
        };
        if !error {
            return None;
        }
        let related = (|| {
            let quoted = tuple::quoted_network(ip, n.transport + 8, n.v6)?;
            let inner = &ip[n.transport + 8..];
            let wanted = tuple::tuple(inner, &quoted)?.inverted()?;
            let Some((slot, dir)) = self.find(&wanted, now) else {
                return self.elsewhere(&wanted.words()).map(Err);
            };
            let c = self.slots[slot as usize].as_ref()?;
            (c.tuples[dir].dst == n.dst.to_be_bytes()).then_some(Ok((slot, dir)))
        })();
        Some(match related {
            Some(Err(w)) => Tracked::fate(Fate::Elsewhere(w)),
            Some(Ok((slot, dir))) => Tracked {
                fate: Fate::Pass,
                state: State::Related,
                reply: dir == 1,
                at: At::Entry(slot),
            },
            None => Tracked::of(State::Invalid),
        })
    }
}

/// Connections moved between workers' tables ([`Owners`](crate::Owners)).
impl Conntrack {
    /// Moves the connections of `tables` (table `k` worker `k`'s) to their owners under
    /// `owners` (each table's own `me` set from its place), and has each table follow it.
    /// Connections in their owner's table stay where they are.
    pub fn redistribute(tables: &mut [&mut Conntrack], owners: Owners) {
        let workers = tables.len() as u16;
        let mut moving: Vec<(u16, Connection)> = Vec::new();
        for (k, table) in tables.iter_mut().enumerate() {
            let mine = Owners {
                workers,
                me: k as u16,
                ..owners
            };
            table.set_owners(mine);
            moving.extend(
                table
                    .hand_over(|c| mine.of_connection(c) != k as u16)
                    .into_iter()
                    .map(|c| (mine.of_connection(&c), c)),
            );
        }
        for (to, c) in moving {
            tables[usize::from(to)].adopt(c);
        }
        // What each table forwards, made anew from where the connections now lie.
        let mut told = Vec::new();
        for (k, table) in tables.iter_mut().enumerate() {
            table.clear_forwards();
            let mine = *table.owners();
            for c in table.connections(0).map(|(c, _)| c) {
                for t in &c.tuples {
                    let to = mine.of_tuple(t);
                    if to != k as u16 {
                        told.push((to, Forward::Add(*t, k as u16)));
                    }
                }
            }
        }
        for (to, f) in told {
            tables[usize::from(to)].forward(f);
        }
    }
}

/// Verdicts kept on connections ([`Kept`](crate::Kept)).
impl Conntrack {
    /// The epoch of the rules numbered `rules` and the routes and links numbered
    /// `routes`: the current one while they stay, a new one when either changes (every
    /// verdict kept before then no longer holds). Shared by whoever shares the table.
    pub fn epoch(&mut self, rules: u64, routes: u64) -> Epoch {
        let (epoch, wrapped) = self.epochs.of(rules, routes);
        if wrapped {
            // Numbers come round again: what was kept under the old ones goes.
            for c in self.slots.iter_mut().flatten() {
                c.kept = Kept::default();
            }
        }
        epoch
    }

    /// The links (in, out) the packets of `t`'s direction were kept as coming in and
    /// leaving by, if kept under `epoch` in `t`'s state.
    #[inline]
    pub fn kept(&self, t: &Tracked, epoch: Epoch) -> Option<(u32, u32)> {
        self.keeping(t, epoch, false).1
    }

    /// Whether a verdict may be kept for `t`'s direction at all, and the links it was
    /// kept as coming in and leaving by under `epoch` ([`Conntrack::kept`]), from one
    /// look at its connection. Not where its tuples may still change: a NEW connection
    /// not yet bound by NAT where its family `translates` (its first packet is decided on
    /// the tuples before the binding).
    #[inline]
    pub fn keeping(
        &self,
        t: &Tracked,
        epoch: Epoch,
        translates: bool,
    ) -> (bool, Option<(u32, u32)>) {
        let Some(c) = self.connection(t) else {
            return (false, None);
        };
        let both = nat::SRC_NAT_DONE | nat::DST_NAT_DONE;
        if translates && t.state() == State::New && c.status & both != both {
            return (false, None);
        }
        let Some(new) = kept_as_new(t.state()) else {
            return (true, None);
        };
        (true, c.kept.links(new, usize::from(t.reply()), epoch))
    }

    /// Keeps that the packets of `t`'s direction, in its state, pass every chain under
    /// `epoch`, coming in by `iif` and leaving by `oif` (unless either's index takes
    /// more than 16 bits: then nothing is kept).
    pub fn keep(&mut self, t: &Tracked, epoch: Epoch, iif: u32, oif: u32) {
        let Some(new) = kept_as_new(t.state()) else {
            return;
        };
        let (Ok(iif), Ok(oif)) = (u16::try_from(iif), u16::try_from(oif)) else {
            return;
        };
        let dir = usize::from(t.reply());
        if let Some(c) = self.connection_mut(t) {
            c.kept.keep(new, dir, epoch, iif, oif);
        }
    }
}

/// Whether a verdict in `state` is kept as NEW (true) or ESTABLISHED (false); `None`:
/// not kept (a RELATED packet's headers are an error's, INVALID and UNTRACKED ones have
/// no connection).
fn kept_as_new(state: State) -> Option<bool> {
    match state {
        State::Established => Some(false),
        State::New => Some(true),
        _ => None,
    }
}

/// The protocol's tracker, following `s`, on a packet of connection `c` in direction
/// `dir`.
fn track_packet(
    s: &Settings,
    c: &mut Connection,
    ip: &[u8],
    n: &Network,
    dir: usize,
    now: u64,
    check: bool,
) -> Handled {
    let confirmed = c.status & CONFIRMED != 0;
    let l4 = &ip[n.transport..n.len];
    let refresh = |c: &mut Connection, timeout: u64| {
        c.expires = if confirmed {
            now.saturating_add(timeout)
        } else {
            timeout
        }
        .into();
    };
    let status = c.status;
    match &mut c.protocol {
        Protocol::Tcp(t) => {
            let Some(segment) = Segment::parse(l4) else {
                return Handled::Invalid;
            };
            if check && tuple::transport_checksum(ip, n) != 0 {
                return Handled::Invalid;
            }
            if !confirmed {
                match Tcp::new(&segment, s) {
                    Some(fresh) => *t = fresh,
                    None => return Handled::Invalid,
                }
            }
            let flags = tcp::Status {
                seen_reply: status & SEEN_REPLY != 0,
                assured: status & ASSURED != 0,
            };
            match t.packet(&segment, dir, flags, s) {
                tcp::Verdict::Accept { timeout, assured } => {
                    refresh(c, timeout);
                    if assured {
                        c.status |= ASSURED;
                    }
                    Handled::Accept
                }
                tcp::Verdict::AcceptKeepTimer => Handled::Accept,
                tcp::Verdict::Ignore => Handled::Ignore,
                tcp::Verdict::Invalid => Handled::Invalid,
                tcp::Verdict::InvalidShorten(timeout) => {
                    let left = c.expires.get().saturating_sub(now);
                    if confirmed && left >= 120 * 1_000_000_000 && left > timeout {
                        c.expires = (now + timeout).into();
                    }
                    Handled::Invalid
                }
                tcp::Verdict::Reopen => Handled::Reopen,
                tcp::Verdict::Close => Handled::Close,
            }
        }
        Protocol::Udp { stream_after } => {
            let Some(h) = l4.get(..8) else {
                return Handled::Invalid;
            };
            let len = usize::from(u16::from_be_bytes([h[4], h[5]]));
            if len > l4.len() || len < 8 {
                return Handled::Invalid;
            }
            if h[6..8] != [0, 0] && check && tuple::transport_checksum(ip, n) != 0 {
                return Handled::Invalid;
            }
            let stream_after = stream_after.get();
            if status & SEEN_REPLY != 0 {
                let stream = now > stream_after;
                refresh(c, if stream { s.udp_stream } else { s.udp });
                if stream {
                    c.status |= ASSURED;
                }
            } else {
                refresh(c, s.udp);
            }
            Handled::Accept
        }
        Protocol::Icmp => {
            let kind = c.tuples[0].icmp_type();
            if n.v6 {
                if !confirmed && !matches!(kind, 128 | 139) {
                    return Handled::Invalid;
                }
                refresh(c, s.icmpv6);
            } else {
                if !matches!(kind, 8 | 13 | 15 | 17) {
                    return Handled::Invalid;
                }
                refresh(c, s.icmp);
            }
            Handled::Accept
        }
        Protocol::Generic => {
            refresh(c, s.generic);
            Handled::Accept
        }
    }
}

/// What a protocol's tracker made of a packet.
enum Handled {
    Accept,
    Ignore,
    Invalid,
    Close,
    Reopen,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a million connections take, measured: a million UDP flows tracked and
    /// confirmed, the memory the table holds: within 200 MB (193 today: the slab's
    /// 164-byte slots, a power of two of them, 172 MB; the index's handles of both
    /// directions, 21 MB). Where NAT translates their family, each enters the registry
    /// too, under one hash for both its tuples (19 MB more).
    #[test]
    fn a_million_connections_take_at_most_200_mb() {
        let mut settings = Settings::kernel_defaults();
        settings.max = 2 << 20;
        let mut t = Conntrack::new(settings);
        t.register(1);
        for k in 0..1_000_000u32 {
            let mut ip = udp(1000 + (k % 1000) as u16, false);
            ip[12..16].copy_from_slice(&[10, (k >> 16) as u8, (k >> 8) as u8, k as u8]);
            let tr = t.track(&ip, 1, true);
            assert!(t.confirm(&tr), "connection {k}");
        }
        assert_eq!(t.len(), 1_000_000);
        assert!(t.memory() <= 200_000_000, "{} bytes", t.memory());
        assert_eq!(t.registry().len(), 1_000_000, "one hash each");
        let bytes = t.memory() + t.registry_memory();
        assert!(bytes <= 215_000_000, "{bytes} bytes");
    }

    fn udp(src_port: u16, reply: bool) -> Vec<u8> {
        let (a, b) = ([10, 0, 0, 2], [10, 2, 0, 2]);
        let (src, dst) = if reply { (b, a) } else { (a, b) };
        let mut ip = vec![0x45, 0, 0, 28, 0, 0, 0x40, 0, 64, 17, 0, 0];
        ip.extend_from_slice(&src);
        ip.extend_from_slice(&dst);
        let (sp, dp) = if reply {
            (53, src_port)
        } else {
            (src_port, 53)
        };
        ip.extend_from_slice(&sp.to_be_bytes());
        ip.extend_from_slice(&dp.to_be_bytes());
        ip.extend_from_slice(&[0, 8, 0, 0]);
        ip
    }

    /// Warming a vector changes nothing tracking then finds: over random vectors of
    /// packets of a few hundred connections both ways (some cut short, some with a
    /// byte changed), a table that warms each vector first tracks every packet as one
    /// that does not, and ends with the same connections.
    #[test]
    fn warming_a_vector_changes_nothing_tracking_finds() {
        use rand::{rngs::StdRng, Rng, SeedableRng};
        let mut rng = StdRng::seed_from_u64(7);
        let (mut warmed, mut plain) = (
            Conntrack::new(Settings::kernel_defaults()),
            Conntrack::new(Settings::kernel_defaults()),
        );
        for round in 0..200u64 {
            let vector: Vec<Vec<u8>> = (0..rng.gen_range(1..64))
                .map(|_| {
                    let mut p = udp(rng.gen_range(1000..1300), rng.gen_bool(0.3));
                    match rng.gen_range(0..10) {
                        0 => p.truncate(rng.gen_range(0..p.len())),
                        1 => {
                            let at = rng.gen_range(0..p.len());
                            p[at] = rng.gen();
                        }
                        _ => {}
                    }
                    p
                })
                .collect();
            warmed.settle();
            plain.settle();
            warmed.warm(vector.iter().map(|p| p.as_slice()));
            for p in &vector {
                let (a, b) = (
                    warmed.track_in_vector(p, round, true),
                    plain.track_in_vector(p, round, true),
                );
                assert_eq!(
                    (a.outcome(), a.state(), a.reply()),
                    (b.outcome(), b.state(), b.reply()),
                    "{p:02x?}"
                );
                if rng.gen_bool(0.9) {
                    assert_eq!(warmed.confirm(&a), plain.confirm(&b));
                }
            }
        }
        let ports = |t: &Conntrack| {
            let mut p: Vec<(u16, u32)> = t
                .connections(200)
                .map(|(c, _)| (c.tuples[0].src_port, c.status))
                .collect();
            p.sort_unstable();
            p
        };
        assert!(warmed.len() > 100);
        assert_eq!(ports(&warmed), ports(&plain));
    }

    #[test]
    fn a_full_table_drops_unassured_connections_early_and_then_packets() {
        let mut s = Settings::kernel_defaults();
        s.max = 2;
        let mut t = Conntrack::new(s);
        for port in [1000, 1001] {
            let tr = t.track(&udp(port, false), 1, true);
            assert_eq!(tr.state(), State::New);
            t.confirm(&tr);
        }
        // A third: one of the two (unassured) goes to make room.
        let tr = t.track(&udp(1002, false), 1, true);
        assert_eq!(tr.outcome(), Fate::Pass);
        t.confirm(&tr);
        assert_eq!((t.len(), t.stats.early_dropped), (2, 1));
        // Both left answered, and assured once two seconds old: nothing can go, so a
        // new flow's packet is dropped.
        let later = 1 + 3 * TWO_SECONDS;
        let kept: Vec<u16> = t
            .connections(2)
            .map(|(c, _)| c.tuples[0].src_port)
            .collect();
        assert_eq!(kept.len(), 2);
        for port in kept {
            assert_eq!(
                t.track(&udp(port, true), 2, true).state(),
                State::Established
            );
            assert_eq!(
                t.track(&udp(port, false), later, true).state(),
                State::Established
            );
        }
        assert!(t.connections(later).all(|(c, _)| c.status & ASSURED != 0));
        let tr = t.track(&udp(1003, false), later, true);
        assert_eq!(tr.outcome(), Fate::TableFull);
        // Expired, they make room again.
        let tr = t.track(&udp(1003, false), later + 1_000 * TWO_SECONDS, true);
        assert_eq!(tr.outcome(), Fate::Pass);
    }

    /// A TCP segment between 10.0.0.2:4000 and 10.2.0.2:22 (`reply`: the other way),
    /// with these flags and numbers; its checksum left for the tracker not to check.
    fn tcp(reply: bool, flags: u8, seq: u32, ack: u32) -> Vec<u8> {
        let (a, b) = ([10, 0, 0, 2], [10, 2, 0, 2]);
        let (src, dst, sp, dp) = if reply {
            (b, a, 22u16, 4000u16)
        } else {
            (a, b, 4000, 22)
        };
        let mut ip = vec![0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0];
        ip.extend_from_slice(&src);
        ip.extend_from_slice(&dst);
        ip.extend_from_slice(&sp.to_be_bytes());
        ip.extend_from_slice(&dp.to_be_bytes());
        ip.extend_from_slice(&seq.to_be_bytes());
        ip.extend_from_slice(&ack.to_be_bytes());
        ip.extend_from_slice(&[0x50, flags, 0xfa, 0xf0, 0, 0, 0, 0]);
        ip
    }

    #[test]
    fn a_reset_sent_for_a_connection_closes_it() {
        let mut t = Conntrack::new(Settings::kernel_defaults());
        let syn = t.track(&tcp(false, 0x02, 1000, 0), 1, true);
        // Not yet confirmed: nothing to close (`nf_conntrack_tcp_set_closing`).
        t.set_closing(&syn, 1);
        assert_eq!(
            t.connection(&syn).and_then(Connection::tcp_state),
            Some(TcpState::SynSent)
        );
        t.confirm(&syn);
        t.track(&tcp(true, 0x12, 5000, 1001), 2, true);
        let ack = t.track(&tcp(false, 0x10, 1001, 5001), 3, true);
        assert_eq!(ack.state(), State::Established);
        t.set_closing(&ack, 100);
        let c = t.connection(&ack).unwrap();
        assert_eq!(c.tcp_state(), Some(TcpState::Close));
        assert_eq!(c.expires.get(), 100 + t.settings().tcp.close);
        // Closed already: its time stays.
        t.set_closing(&ack, 500);
        assert_eq!(
            t.connection(&ack).unwrap().expires.get(),
            100 + t.settings().tcp.close
        );
    }

    #[test]
    fn an_unconfirmed_connection_is_gone_with_its_packet() {
        let mut t = Conntrack::new(Settings::kernel_defaults());
        let first = t.track(&udp(7, false), 1, true);
        assert_eq!(first.state(), State::New);
        // Not confirmed (the rules dropped it): the reply finds nothing, and is new.
        let reply = t.track(&udp(7, true), 2, true);
        assert_eq!((reply.state(), reply.reply()), (State::New, false));
        assert_eq!(t.len(), 0);
        t.confirm(&reply);
        // Confirmed, the request is now its reply direction.
        let again = t.track(&udp(7, false), 3, true);
        assert_eq!((again.state(), again.reply()), (State::Established, true));
    }
}

#[cfg(test)]
mod verdicts_kept {
    use super::*;
    use crate::kept::FLAGS;
    use crate::Settings;

    fn udp(sport: u16, reply: bool) -> Vec<u8> {
        let (a, b) = ([10, 0, 0, 2], [10, 2, 0, 2]);
        let (src, dst, sp, dp) = if reply {
            (b, a, 53, sport)
        } else {
            (a, b, sport, 53)
        };
        let mut ip = vec![0x45, 0, 0, 28, 0, 0, 0x40, 0, 64, 17, 0, 0];
        ip.extend_from_slice(&src);
        ip.extend_from_slice(&dst);
        ip.extend_from_slice(&sp.to_be_bytes());
        ip.extend_from_slice(&dp.to_be_bytes());
        ip.extend_from_slice(&[0, 8, 0, 0]);
        ip
    }

    #[test]
    fn a_kept_verdict_holds_for_its_epoch_state_direction_and_link_only() {
        let mut table = Conntrack::new(Settings::kernel_defaults());
        let e = table.epoch(1, 1);
        assert_eq!(
            table.epoch(1, 1),
            e,
            "the same rules and routes: the same epoch"
        );
        let first = table.track(&udp(1000, false), 0, false);
        assert_eq!(first.state(), State::New);
        assert!(table.confirm(&first));
        let again = table.track(&udp(1000, false), 1, false);
        assert_eq!(table.kept(&again, e), None);
        table.keep(&again, e, 2, 7);
        assert_eq!(table.kept(&again, e), Some((2, 7)));
        // A link whose index takes more than 16 bits: not kept (the verdict is decided
        // again), and what was kept goes on holding.
        table.keep(&again, e, 70_000, 7);
        table.keep(&again, e, 2, 1 << 20);
        assert_eq!(table.kept(&again, e), Some((2, 7)));
        // The other direction is not kept; its reply makes the connection ESTABLISHED,
        // a state not kept either way.
        let reply = table.track(&udp(1000, true), 2, false);
        assert_eq!(reply.state(), State::Established);
        assert_eq!(table.kept(&reply, e), None);
        let on = table.track(&udp(1000, false), 3, false);
        assert_eq!(on.state(), State::Established);
        assert_eq!(table.kept(&on, e), None, "kept when NEW, not now");
        table.keep(&on, e, 2, 7);
        assert_eq!(table.kept(&on, e), Some((2, 7)));
        // Other rules, or other routes: a new epoch, nothing kept under it.
        let other = table.epoch(2, 1);
        assert_ne!(other, e);
        assert_eq!(table.kept(&on, other), None);
        let routes = table.epoch(2, 2);
        assert_ne!(routes, other);
        assert_eq!(table.kept(&on, routes), None);
        // Both directions under one epoch; one kept under the next ends the other's.
        let back = table.track(&udp(1000, true), 5, false);
        table.keep(&on, routes, 2, 7);
        table.keep(&back, routes, 7, 2);
        assert_eq!(table.kept(&on, routes), Some((2, 7)));
        assert_eq!(table.kept(&back, routes), Some((7, 2)));
        let next = table.epoch(3, 3);
        table.keep(&back, next, 7, 2);
        assert_eq!(table.kept(&back, next), Some((7, 2)));
        assert_eq!(table.kept(&on, next), None);
        // Another connection knows nothing of this one's.
        let second = table.track(&udp(1001, false), 4, false);
        assert_eq!(table.kept(&second, routes), None);
    }

    /// A connection ended in a vector leaves its slot empty until the vector ends: a
    /// later packet of the vector that had found it there meets no other connection
    /// (its stamp, its bindings) in it.
    #[test]
    fn a_slot_given_back_in_a_vector_is_taken_in_the_next_only() {
        let mut table = Conntrack::new(Settings::kernel_defaults());
        let a = table.track(&udp(1000, false), 0, false);
        assert!(table.confirm(&a));
        table.settle();
        let a = table.track_in_vector(&udp(1000, false), 1, false);
        let again = table.track_in_vector(&udp(1000, false), 1, false);
        table.end(&a);
        let b = table.track_in_vector(&udp(1001, false), 1, false);
        assert!(table.confirm(&b));
        assert_eq!(
            table.connection(&again),
            None,
            "the slot holds no one this vector"
        );
        assert_eq!(table.len(), 1);
        table.settle();
        let c = table.track_in_vector(&udp(1002, false), 2, false);
        assert!(table.confirm(&c));
        assert_eq!(table.len(), 2);
        assert_eq!(table.slots.len(), 2, "the slot taken again");
    }

    /// One look at the connection says what the two questions say: whether a verdict
    /// may be kept (not for a NEW connection NAT has not bound where the family
    /// translates) and what is kept.
    #[test]
    fn keeping_is_whether_it_may_be_kept_and_what_is() {
        let mut table = Conntrack::new(Settings::kernel_defaults());
        let e = table.epoch(1, 1);
        // One connection NAT bound both ways (to nothing), one it never bound.
        let first = table.track(&udp(1000, false), 0, false);
        for m in [crate::nat::Manip::Destination, crate::nat::Manip::Source] {
            table.bind(&first, m, None, 0);
        }
        assert!(table.confirm(&first));
        let unbound = table.track(&udp(1001, false), 0, false);
        assert!(table.confirm(&unbound));
        let again = table.track(&udp(1000, false), 1, false);
        assert_eq!(again.state(), State::New);
        assert_eq!(table.keeping(&again, e, true), (true, None));
        table.keep(&again, e, 2, 7);
        assert_eq!(table.keeping(&again, e, true), (true, Some((2, 7))));
        assert_eq!(table.keeping(&again, e, true).1, table.kept(&again, e));
        let other = table.epoch(2, 1);
        assert_eq!(table.keeping(&again, other, true), (true, None));
        let stranger = table.track(&udp(1001, false), 2, false);
        assert_eq!(table.keeping(&stranger, other, false), (true, None));
        table.keep(&stranger, other, 3, 4);
        assert_eq!(table.keeping(&stranger, other, false), (true, Some((3, 4))));
        assert_eq!(
            table.keeping(&stranger, other, true),
            (false, None),
            "NEW and not bound where the family translates"
        );
        // An ESTABLISHED packet's tuples are settled, bound or not.
        let reply = table.track(&udp(1001, true), 3, false);
        assert_eq!(reply.state(), State::Established);
        assert_eq!(table.keeping(&reply, other, true), (true, None));
        let lone = table.track(&udp(1002, false), 4, false);
        table.settle();
        assert_eq!(table.keeping(&lone, other, false), (false, None), "gone");
    }

    #[test]
    fn numbers_come_round_without_an_old_verdict_holding() {
        let mut table = Conntrack::new(Settings::kernel_defaults());
        let e = table.epoch(1, 1);
        let t = table.track(&udp(1000, false), 0, false);
        assert!(table.confirm(&t));
        let t = table.track(&udp(1000, false), 1, false);
        table.keep(&t, e, 2, 3);
        // The count made to wrap: the epoch after it must not find the old stamp.
        table.epochs.current = u32::MAX >> FLAGS << FLAGS;
        let wrapped = table.epoch(9, 9);
        assert_eq!(wrapped, Epoch(1 << FLAGS));
        assert_eq!(table.kept(&t, wrapped), None);
    }
}
