//! Route exceptions: what the network taught about single destinations, kept beside the
//! routes rather than in them.
//!
//! An ICMP "fragmentation needed" or "packet too big" lowers the path MTU to one
//! destination; an ICMP redirect sends one destination through another gateway. The kernel
//! keeps these as exceptions of the nexthop (IPv4, `fib_nh_exception`) or of the route
//! (IPv6, `rt6_exception`), each bounded per bucket and expiring (PMTU after
//! `mtu_expires`, 600 s; a redirect after `gc_timeout`, 300 s), and consults them after the
//! route lookup. fibre does the same outside the lookup structure, so that learning one
//! never recompiles or republishes a snapshot:
//!
//! - An exception belongs to the hop it was learned on (destination, output link,
//!   gateway): when the route changes to another hop, the exception no longer applies, as
//!   the kernel's go with their nexthop.
//! - The table is split in shards by destination; a writer locks one shard, a reader locks
//!   nothing (each shard's entries are published with [`arc_swap`]), so there is no global
//!   lock and a reader never waits.
//! - It is bounded: a full shard drops its expired entries, then the one expiring first.
//! - Time is the caller's (milliseconds on any monotonic clock, [`Exceptions::now`] by
//!   default), so tests and offline runs decide it.

use crate::hop::Hop;
use crate::link::LinkIndex;
use arc_swap::ArcSwap;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// How long a learned path MTU holds, as the kernel's `net.ipv4.route.mtu_expires`.
pub const PMTU_EXPIRES_MS: u64 = 600_000;
/// How long a redirect holds, as the kernel's `net.ipv4.route.gc_timeout`.
pub const REDIRECT_EXPIRES_MS: u64 = 300_000;
/// The smallest IPv4 path MTU taken from the network (`net.ipv4.route.min_pmtu`); a smaller
/// one is raised to it.
pub const MIN_PMTU_V4: u32 = 552;
/// The smallest IPv6 path MTU (RFC 8200).
pub const MIN_PMTU_V6: u32 = 1280;

/// What is known of one destination reached through one hop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exception {
    /// The destination address.
    pub dst: IpAddr,
    /// The hop's output link when it was learned.
    pub dev: LinkIndex,
    /// The hop's gateway when it was learned.
    pub via: Option<IpAddr>,
    /// The path MTU learned, if any.
    pub mtu: Option<u32>,
    /// The gateway a redirect named, if any.
    pub redirect: Option<IpAddr>,
    /// When the PMTU expires (ms on the caller's clock).
    pub mtu_expires: u64,
    /// When the redirect expires (ms on the caller's clock).
    pub redirect_expires: u64,
}

impl Exception {
    fn belongs(&self, dst: IpAddr, hop: &Hop) -> bool {
        self.dst == dst && self.dev == hop.dev && self.via == hop.gateway
    }

    /// Forgets what has expired at `now`; `false` when nothing is left.
    fn age(&mut self, now: u64) -> bool {
        if self.mtu.is_some() && self.mtu_expires <= now {
            self.mtu = None;
        }
        if self.redirect.is_some() && self.redirect_expires <= now {
            self.redirect = None;
        }
        self.mtu.is_some() || self.redirect.is_some()
    }

    fn expires(&self) -> u64 {
        let m = self.mtu.map_or(0, |_| self.mtu_expires);
        let r = self.redirect.map_or(0, |_| self.redirect_expires);
        m.max(r)
    }
}

struct Shard {
    entries: ArcSwap<Vec<Exception>>,
    writer: Mutex<()>,
}

/// The exceptions of one routing state, shared by its readers and writers.
pub struct Exceptions {
    shards: Box<[Shard]>,
    per_shard: usize,
    /// How many entries the shards hold, so that a lookup skips them all while none is.
    held: AtomicUsize,
    hasher: std::collections::hash_map::RandomState,
}

/// What a learned exception did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Learned {
    /// Recorded (new, or lowering or refreshing what was known).
    Recorded,
    /// Ignored: the MTU is not below the hop's, as the kernel ignores it.
    NotLower,
}

impl Exceptions {
    const SHARDS: usize = 64;

    /// A table holding at most about `capacity` exceptions (rounded up to a whole number
    /// per shard).
    pub fn new(capacity: usize) -> Exceptions {
        let shards = (0..Self::SHARDS)
            .map(|_| Shard {
                entries: ArcSwap::from_pointee(Vec::new()),
                writer: Mutex::new(()),
            })
            .collect();
        Exceptions {
            shards,
            per_shard: capacity.div_ceil(Self::SHARDS).max(1),
            held: AtomicUsize::new(0),
            hasher: Default::default(),
        }
    }

    /// Milliseconds on a monotonic clock that starts with the process.
    pub fn now() -> u64 {
        static START: OnceLock<Instant> = OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_millis() as u64
    }

    fn shard(&self, dst: IpAddr) -> &Shard {
        &self.shards[self.hasher.hash_one(dst) as usize % self.shards.len()]
    }

    /// Learns a path MTU to `dst` through `hop` (an ICMP fragmentation needed or packet too
    /// big), as the kernel does: raised to the family's minimum, ignored unless below the
    /// hop's MTU (`link_mtu` when the route sets none) and any MTU already learned
    /// (a learned one is refreshed by the same value).
    pub fn learn_pmtu(&self, dst: IpAddr, hop: &Hop, link_mtu: u32, mtu: u32, now: u64) -> Learned {
        let floor = if dst.is_ipv4() {
            MIN_PMTU_V4
        } else {
            MIN_PMTU_V6
        };
        let mtu = mtu.max(floor);
        let hop_mtu = hop.mtu.unwrap_or(link_mtu);
        self.update(dst, hop, now, |e| {
            let known = e.mtu.unwrap_or(hop_mtu);
            if mtu > known || (mtu == known && e.mtu.is_none()) {
                return Learned::NotLower;
            }
            e.mtu = Some(mtu);
            e.mtu_expires = now + PMTU_EXPIRES_MS;
            Learned::Recorded
        })
    }

    /// Learns a redirect: `dst`, reached through `hop`, is to be sent to `gateway`.
    pub fn learn_redirect(&self, dst: IpAddr, hop: &Hop, gateway: IpAddr, now: u64) -> Learned {
        self.update(dst, hop, now, |e| {
            e.redirect = Some(gateway);
            e.redirect_expires = now + REDIRECT_EXPIRES_MS;
            Learned::Recorded
        })
    }

    fn update(
        &self,
        dst: IpAddr,
        hop: &Hop,
        now: u64,
        change: impl FnOnce(&mut Exception) -> Learned,
    ) -> Learned {
        let shard = self.shard(dst);
        // One writer per shard at a time; a poisoned lock only means a writer panicked
        // between reading and storing, which leaves the published entries whole.
        let _writing = shard.writer.lock().unwrap_or_else(|e| e.into_inner());
        let mut entries: Vec<Exception> = shard.entries.load().as_ref().clone();
        let before = entries.len();
        entries.retain_mut(|e| e.age(now));
        let at = entries.iter().position(|e| e.belongs(dst, hop));
        let mut entry = at.map_or(
            Exception {
                dst,
                dev: hop.dev,
                via: hop.gateway,
                mtu: None,
                redirect: None,
                mtu_expires: 0,
                redirect_expires: 0,
            },
            |i| entries[i],
        );
        let learned = change(&mut entry);
        if learned != Learned::Recorded {
            return learned;
        }
        match at {
            Some(i) => entries[i] = entry,
            None => {
                if entries.len() >= self.per_shard {
                    // Full: the entry that would expire first makes room.
                    let first = (0..entries.len())
                        .min_by_key(|&i| entries[i].expires())
                        .expect("a full shard has entries");
                    entries.swap_remove(first);
                }
                entries.push(entry);
            }
        }
        self.store(shard, before, entries);
        learned
    }

    /// Publishes a shard's entries, keeping the count of all held.
    fn store(&self, shard: &Shard, before: usize, entries: Vec<Exception>) {
        let after = entries.len();
        shard.entries.store(Arc::new(entries));
        if after >= before {
            self.held.fetch_add(after - before, Ordering::Relaxed);
        } else {
            self.held.fetch_sub(before - after, Ordering::Relaxed);
        }
    }

    /// What is known of `dst` through `hop` at `now`, if anything.
    #[inline]
    pub fn get(&self, dst: IpAddr, hop: &Hop, now: u64) -> Option<Exception> {
        if self.held.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let entries = self.shard(dst).entries.load();
        let mut e = *entries.iter().find(|e| e.belongs(dst, hop))?;
        e.age(now).then_some(e)
    }

    /// Applies what is known of `dst` to the `hop` its route gave: a redirect's gateway, a
    /// learned path MTU. Returns the exception applied.
    #[inline]
    pub fn apply(&self, dst: IpAddr, hop: &mut Hop, now: u64) -> Option<Exception> {
        let e = self.get(dst, hop, now)?;
        if let Some(gw) = e.redirect {
            hop.gateway = Some(gw);
        }
        if let Some(mtu) = e.mtu {
            hop.mtu = Some(mtu);
        }
        Some(e)
    }

    /// Forgets every exception learned on `dev` (the link went down or away, as the kernel
    /// flushes them with its nexthops).
    pub fn forget_link(&self, dev: LinkIndex) {
        for shard in self.shards.iter() {
            let _writing = shard.writer.lock().unwrap_or_else(|e| e.into_inner());
            let entries = shard.entries.load();
            if entries.iter().any(|e| e.dev == dev) {
                let kept: Vec<Exception> =
                    entries.iter().filter(|e| e.dev != dev).copied().collect();
                self.store(shard, entries.len(), kept);
            }
        }
    }

    /// How many exceptions are held (expired ones included until a writer sweeps them).
    pub fn len(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most the table holds.
    pub fn capacity(&self) -> usize {
        self.per_shard * self.shards.len()
    }
}

impl std::fmt::Debug for Exceptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exceptions")
            .field("len", &self.len())
            .field("capacity", &self.capacity())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::RouteType;

    fn hop(gw: [u8; 4]) -> Hop {
        Hop {
            kind: RouteType::Unicast,
            table: Some(254),
            dev: 3,
            gateway: Some(IpAddr::from(gw)),
            mtu: None,
        }
    }

    const DST: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 9, 0, 1));

    #[test]
    fn a_pmtu_lowers_expires_and_belongs_to_its_hop() {
        let x = Exceptions::new(1024);
        let h = hop([10, 0, 0, 2]);
        assert_eq!(x.learn_pmtu(DST, &h, 1500, 1600, 0), Learned::NotLower);
        assert_eq!(x.learn_pmtu(DST, &h, 1500, 1500, 0), Learned::NotLower);
        assert!(x.is_empty());
        assert_eq!(x.learn_pmtu(DST, &h, 1500, 1400, 1000), Learned::Recorded);
        // Not raised by a later, larger one; lowered by a smaller; refreshed by the same.
        assert_eq!(x.learn_pmtu(DST, &h, 1500, 1450, 2000), Learned::NotLower);
        assert_eq!(x.learn_pmtu(DST, &h, 1500, 1300, 3000), Learned::Recorded);
        assert_eq!(x.learn_pmtu(DST, &h, 1500, 1300, 4000), Learned::Recorded);
        // Below the IPv4 minimum: the minimum.
        let other: IpAddr = [10, 9, 0, 2].into();
        x.learn_pmtu(other, &h, 1500, 100, 0);
        assert_eq!(x.get(other, &h, 0).unwrap().mtu, Some(MIN_PMTU_V4));

        let mut applied = h;
        assert!(x.apply(DST, &mut applied, 5000).is_some());
        assert_eq!(applied.mtu, Some(1300));
        assert_eq!(applied.gateway, h.gateway);
        // Another hop (the route changed): not this one's exception.
        let mut moved = hop([10, 0, 0, 3]);
        assert!(x.apply(DST, &mut moved, 5000).is_none());
        assert_eq!(moved.mtu, None);
        // Expired: gone.
        assert!(x.get(DST, &h, 4000 + PMTU_EXPIRES_MS - 1).is_some());
        assert!(x.get(DST, &h, 4000 + PMTU_EXPIRES_MS).is_none());
        // A route MTU counts as the hop's.
        let mut small = hop([10, 0, 0, 4]);
        small.mtu = Some(1200);
        assert_eq!(x.learn_pmtu(DST, &small, 1500, 1300, 0), Learned::NotLower);
        // IPv6's minimum is 1280.
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        x.learn_pmtu(v6, &h, 1500, 1000, 0);
        assert_eq!(x.get(v6, &h, 0).unwrap().mtu, Some(MIN_PMTU_V6));
    }

    #[test]
    fn a_redirect_changes_the_gateway_until_it_expires() {
        let x = Exceptions::new(1024);
        let h = hop([10, 0, 0, 2]);
        let new: IpAddr = [10, 0, 0, 9].into();
        x.learn_redirect(DST, &h, new, 0);
        x.learn_pmtu(DST, &h, 1500, 1400, 200_000);
        let mut a = h;
        x.apply(DST, &mut a, 1);
        assert_eq!(a.gateway, Some(new));
        // The redirect expires first, the MTU stays.
        let mut b = h;
        let e = x.apply(DST, &mut b, REDIRECT_EXPIRES_MS).unwrap();
        assert_eq!(
            (e.redirect, b.gateway, b.mtu),
            (None, h.gateway, Some(1400))
        );
        x.forget_link(h.dev);
        assert!(x.is_empty());
    }

    #[test]
    fn a_full_table_drops_what_expires_first() {
        let x = Exceptions::new(64);
        assert_eq!(x.capacity(), 64);
        let h = hop([10, 0, 0, 2]);
        for i in 0..10_000u32 {
            let dst = IpAddr::from((0x0a00_0000 + i).to_be_bytes());
            x.learn_pmtu(dst, &h, 1500, 1400, i as u64);
            assert!(x.len() <= x.capacity());
        }
        // The newest are kept: each shard dropped its oldest.
        let last = IpAddr::from((0x0a00_0000 + 9_999u32).to_be_bytes());
        assert!(x.get(last, &h, 10_000).is_some());
        let first = IpAddr::from(0x0a00_0000u32.to_be_bytes());
        assert!(x.get(first, &h, 10_000).is_none());
    }

    /// Readers on other threads look up while writers learn: each reader sees either no
    /// exception or a whole one for its destination, and never waits on a lock.
    #[test]
    fn readers_and_writers_on_many_threads() {
        let x = Exceptions::new(4096);
        let h = hop([10, 0, 0, 2]);
        std::thread::scope(|s| {
            for w in 0..2u32 {
                let x = &x;
                s.spawn(move || {
                    for i in 0..20_000u32 {
                        let dst = IpAddr::from((0x0a00_0000 + (i % 500)).to_be_bytes());
                        let mtu = 1400 - (i % 100) - w;
                        x.learn_pmtu(dst, &h, 1500, mtu, 0);
                    }
                });
            }
            for _ in 0..2 {
                let x = &x;
                s.spawn(move || {
                    for i in 0..50_000u32 {
                        let dst = IpAddr::from((0x0a00_0000 + (i % 500)).to_be_bytes());
                        if let Some(e) = x.get(dst, &h, 1) {
                            assert_eq!(e.dst, dst);
                            let mtu = e.mtu.expect("only MTUs learned");
                            assert!((1299..=1400).contains(&mtu), "{mtu}");
                        }
                    }
                });
            }
        });
        // Every destination ends at the lowest MTU either writer learned for it.
        for i in 0..500u32 {
            let dst = IpAddr::from((0x0a00_0000 + i).to_be_bytes());
            let lowest = (0..20_000u32)
                .filter(|j| j % 500 == i)
                .map(|j| 1400 - (j % 100) - 1)
                .min()
                .unwrap();
            assert_eq!(x.get(dst, &h, 1).unwrap().mtu, Some(lowest));
        }
    }
}
