//! One routing state published to many readers: a writer changes it in batches, and each
//! batch becomes visible to every reader at once, in one publish.
//!
//! [`Fib`] is the writer's side: it holds the [`State`] and the [`Snapshot`] compiled from
//! it, which it swaps in atomically ([`arc_swap`]) once a batch is applied. [`FibReader`]s
//! (any number, on any threads) take the current snapshot with no lock and no wait and
//! look up against all of it for as long as they hold it; a batch is never seen in part,
//! and a batch that fails leaves the published state as it was.
//!
//! A batch of route changes is published by patching a snapshot rather than compiling the
//! state anew ([`Touched`] says what a batch changed): the writer keeps the snapshot it
//! published before the current one, waits for the readers still holding it to let it go,
//! patches it with what it lacks, and swaps it in. Readers never wait; the writer waits
//! only for readers of a snapshot two versions old. What a patch cannot follow is
//! compiled, and the spare snapshot is then a copy of the compiled one, made on a thread
//! of its own while the compiled one is already published.
//!
//! Beside the snapshot, both sides share the [`Exceptions`] learned from the network (path
//! MTUs, redirects): [`FibReader::lookup`] applies them to the hop its route gives, and a
//! link that is down or gone when a batch is published takes its exceptions with it.

use crate::config::{self, ConfigError};
use crate::exception::Exceptions;
use crate::hop::Hop;
use crate::layout::Snapshot;
use crate::link::LinkIndex;
use crate::patch::Touched;
use crate::query::{NoRoute, Query};
use crate::state::State;
use arc_swap::ArcSwap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The writer of a published routing state.
pub struct Fib {
    state: State,
    published: Arc<ArcSwap<Snapshot>>,
    exceptions: Arc<Exceptions>,
    /// The snapshot to patch into the next one, and what it lacks of the state.
    spare: Option<(NextToPatch, Touched)>,
    counts: Publications,
}

/// How a [`Fib`]'s publications were made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Publications {
    /// Batches published by patching a snapshot.
    pub patched: u64,
    /// Batches published by compiling the state anew.
    pub compiled: u64,
    /// Times the writer gave up waiting for readers to let the spare snapshot go.
    pub held_up: u64,
}

impl Publications {
    /// Batches published, either way.
    pub fn made(&self) -> u64 {
        self.patched + self.compiled
    }
}

/// The snapshot a [`Fib`] patches next.
enum NextToPatch {
    /// The snapshot published before the current one (readers may still hold it).
    Retired(Arc<Snapshot>),
    /// A copy of the current one, being made.
    Copying(std::thread::JoinHandle<Snapshot>),
}

impl NextToPatch {
    /// A copy of `snapshot`, made on a thread of its own (here, if none can start).
    fn copy_of(snapshot: &Arc<Snapshot>) -> NextToPatch {
        let from = Arc::clone(snapshot);
        match std::thread::Builder::new()
            .name("fibre-spare".into())
            .spawn(move || Snapshot::clone(&from))
        {
            Ok(handle) => NextToPatch::Copying(handle),
            Err(_) => NextToPatch::Retired(Arc::new(Snapshot::clone(snapshot))),
        }
    }

    /// The spare, once no reader holds it (false: readers held it too long, or the copy
    /// failed).
    fn take(self) -> Option<Arc<Snapshot>> {
        match self {
            NextToPatch::Retired(mut s) => alone(&mut s).then_some(s),
            NextToPatch::Copying(handle) => handle.join().ok().map(Arc::new),
        }
    }
}

/// How long the writer waits for readers to let the spare snapshot go before compiling
/// anew instead.
const SPARE_WAIT: Duration = Duration::from_secs(1);

/// Waits for every other holder of `snapshot` to let it go, up to [`SPARE_WAIT`].
fn alone(snapshot: &mut Arc<Snapshot>) -> bool {
    let started = Instant::now();
    let mut spins = 0u32;
    while Arc::get_mut(snapshot).is_none() {
        if started.elapsed() > SPARE_WAIT {
            return false;
        }
        spins += 1;
        if spins < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    true
}

/// A reader of a published routing state.
#[derive(Clone)]
pub struct FibReader {
    published: Arc<ArcSwap<Snapshot>>,
    exceptions: Arc<Exceptions>,
}

/// How many exceptions a [`Fib`] holds at most (the kernel's IPv4 buckets hold up to
/// 2,048 × 5).
pub const EXCEPTIONS: usize = 16_384;

impl Fib {
    /// Publishes `state` and returns the writer and a first reader.
    pub fn new(state: State) -> (Fib, FibReader) {
        let snapshot = state.snapshot();
        Fib::with_snapshot(state, snapshot)
    }

    /// As [`Fib::new`], the first snapshot joined from halves compiled apart
    /// ([`State::compile_half`]) from `state`'s IPv4 routes and its IPv6 routes.
    pub fn new_from_halves(
        state: State,
        v4: crate::compile::Half,
        v6: crate::compile::Half,
    ) -> (Fib, FibReader) {
        Fib::with_snapshot(state, crate::compile::Half::join(v4, v6))
    }

    /// Publishes `snapshot`, compiled from `state`.
    fn with_snapshot(state: State, snapshot: Snapshot) -> (Fib, FibReader) {
        let snapshot = Arc::new(snapshot);
        let spare = NextToPatch::copy_of(&snapshot);
        let published = Arc::new(ArcSwap::new(snapshot));
        let exceptions = Arc::new(Exceptions::new(EXCEPTIONS));
        let reader = FibReader {
            published: Arc::clone(&published),
            exceptions: Arc::clone(&exceptions),
        };
        let fib = Fib {
            state,
            published,
            exceptions,
            spare: Some((spare, Touched::nothing())),
            counts: Publications {
                compiled: 1,
                ..Publications::default()
            },
        };
        (fib, reader)
    }

    /// Applies changes that cannot fail, made by `f` to the state in place, and publishes
    /// them in one swap. The state notes which routes changed; `f` says whether anything
    /// else did ([`Touched::others`]) or the state was replaced ([`Touched::all`]). A
    /// patch publishes the changes in time proportional to them; what it cannot follow is
    /// compiled anew. True if a new version was published: false if nothing a snapshot
    /// holds changed.
    pub fn update(&mut self, f: impl FnOnce(&mut State, &mut Touched)) -> bool {
        let up = self.links_up();
        let mut touched = Touched::nothing();
        self.state.keep_journal();
        f(&mut self.state, &mut touched);
        for (_, table, dst) in self.state.take_journal() {
            touched.route(table, dst);
        }
        let published = !touched.is_empty();
        self.publish(touched, &up);
        published
    }

    /// How the publications so far were made.
    pub fn publications(&self) -> Publications {
        self.counts
    }

    fn links_up(&self) -> Vec<LinkIndex> {
        self.state
            .links()
            .filter(|l| l.up)
            .map(|l| l.index)
            .collect()
    }

    /// Publishes the state, of which `touched` changed since the last publication (`up`:
    /// the links up then).
    fn publish(&mut self, touched: Touched, up: &[LinkIndex]) {
        if touched.is_empty() {
            // Nothing a snapshot holds changed (a neighbour, an announcement repeated):
            // the published one stands.
            return;
        }
        let patched = match self.spare.take() {
            Some((spare, mut behind)) if !touched.is_everything() => {
                behind.add(&touched);
                match spare.take() {
                    None => {
                        self.counts.held_up += 1;
                        None
                    }
                    Some(mut spare) => {
                        let snapshot = Arc::get_mut(&mut spare).expect("no other holder");
                        let patched = snapshot.patch(&self.state, &behind);
                        if patched {
                            snapshot.share_with(&self.published.load());
                        }
                        patched.then_some(spare)
                    }
                }
            }
            _ => None,
        };
        let compiled = patched.is_none();
        let next = patched.unwrap_or_else(|| Arc::new(self.state.snapshot()));
        let copy = compiled.then(|| NextToPatch::copy_of(&next));
        let old = self.published.swap(next);
        self.spare = Some(match copy {
            Some(copy) => (copy, Touched::nothing()),
            None => (NextToPatch::Retired(old), touched),
        });
        if compiled {
            self.counts.compiled += 1;
        } else {
            self.counts.patched += 1;
        }
        for &index in up {
            if !self.state.link(index).is_some_and(|l| l.up) {
                self.exceptions.forget_link(index);
            }
        }
    }

    /// Packs the state's tables ([`State::compact`]), which publishes nothing: the
    /// snapshots hold the routes' lists, not the tables. A mirror packs the state once its
    /// dump is published, so that lookups need not wait for it.
    pub fn pack_state(&mut self) {
        self.state.compact();
    }

    /// The state as last published.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// Applies a batch of `ip` lines (a configuration text, `name` naming it in errors):
    /// all of them and one publish, or, at the first line that fails, none of them and
    /// the error.
    pub fn apply(&mut self, name: &str, text: &str) -> Result<(), ConfigError> {
        self.change(|state| config::apply_text(state, name, text))
    }

    /// Applies a batch of changes made by `f` to a copy of the state: if `f` succeeds the
    /// copy is published, in one swap; if it fails nothing changes.
    pub fn change<E>(&mut self, f: impl FnOnce(&mut State) -> Result<(), E>) -> Result<(), E> {
        let mut next = self.state.clone();
        f(&mut next)?;
        let up = self.links_up();
        self.state = next;
        self.publish(Touched::everything(), &up);
        Ok(())
    }

    /// Another reader.
    pub fn reader(&self) -> FibReader {
        FibReader {
            published: Arc::clone(&self.published),
            exceptions: Arc::clone(&self.exceptions),
        }
    }

    /// The exceptions learned from the network.
    pub fn exceptions(&self) -> &Exceptions {
        &self.exceptions
    }
}

impl FibReader {
    /// The current snapshot, held for as long as the caller keeps it.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.published.load_full()
    }

    /// [`Snapshot::lookup`] on the current snapshot, with what the exceptions know of
    /// the destination through the hop applied (a redirect's gateway, a path MTU).
    pub fn lookup(&self, q: &Query) -> Result<Hop, NoRoute> {
        let mut hop = Hop::from(self.published.load().lookup(q)?);
        self.exceptions.apply(q.dst, &mut hop, Exceptions::now());
        Ok(hop)
    }

    /// The exceptions learned from the network, to learn more (ICMP errors received).
    pub fn exceptions(&self) -> &Exceptions {
        &self.exceptions
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;
    use std::sync::atomic::{AtomicBool, Ordering};

    const LINKS: &str = "\
link add a0 type veth peer name a1
link set a0 up
link set a1 up
addr add 10.0.0.1/24 dev a0
";

    /// Two routes change together in every batch; a reader looking both up in one
    /// snapshot must always see them agree, however the batches and the lookups interleave.
    #[test]
    fn readers_see_whole_batches_only() {
        let mut state = State::new();
        config::apply_text(&mut state, "links", LINKS).unwrap();
        let (mut fib, reader) = Fib::new(state);
        fib.apply(
            "routes",
            "route add 10.1.0.0/16 via 10.0.0.2\nroute add 10.2.0.0/16 via 10.0.0.2\n",
        )
        .unwrap();
        let stop = AtomicBool::new(false);
        let (a, b) = (
            Query::to([10, 1, 0, 1].into()),
            Query::to([10, 2, 0, 1].into()),
        );
        std::thread::scope(|s| {
            let checker = s.spawn(|| {
                let mut seen = std::collections::BTreeSet::new();
                while !stop.load(Ordering::Relaxed) {
                    let snap = reader.snapshot();
                    let (ga, gb) = (snap.lookup(&a).unwrap(), snap.lookup(&b).unwrap());
                    assert_eq!(ga.gateway, gb.gateway, "a batch seen in part");
                    seen.insert(ga.gateway);
                }
                seen.len()
            });
            for i in 0..300u16 {
                let gw = IpAddr::from([10, 0, 0, 2 + (i % 50) as u8]);
                let batch = format!(
                    "route replace 10.1.0.0/16 via {gw}\nroute replace 10.2.0.0/16 via {gw}\n"
                );
                fib.apply("batch", &batch).unwrap();
            }
            stop.store(true, Ordering::Relaxed);
            assert!(
                checker.join().unwrap() > 1,
                "the reader saw the batches change"
            );
        });
        // A batch with a bad line publishes nothing.
        let before = reader.lookup(&a).unwrap();
        let err = fib
            .apply(
                "bad",
                "route replace 10.1.0.0/16 via 10.0.0.77\nroute add nonsense\n",
            )
            .unwrap_err();
        assert_eq!(err.line, 2);
        assert_eq!(reader.lookup(&a).unwrap(), before);
        assert_eq!(fib.reader().lookup(&b).unwrap().gateway, before.gateway);
    }

    /// A reader's lookup applies a learned path MTU and redirect to the hop they were
    /// learned on; a route moved to another gateway leaves them behind; the link going
    /// down forgets them.
    #[test]
    fn lookups_apply_exceptions_of_their_hop() {
        let mut state = State::new();
        config::apply_text(&mut state, "links", LINKS).unwrap();
        let (mut fib, reader) = Fib::new(state);
        fib.apply("r", "route add 10.1.0.0/16 via 10.0.0.2\n")
            .unwrap();
        let q = Query::to([10, 1, 0, 1].into());
        let hop = reader.lookup(&q).unwrap();
        let now = Exceptions::now();
        reader.exceptions().learn_pmtu(q.dst, &hop, 1500, 1400, now);
        let redirected = IpAddr::from([10, 0, 0, 9]);
        fib.exceptions()
            .learn_redirect(q.dst, &hop, redirected, now);
        let seen = reader.lookup(&q).unwrap();
        assert_eq!((seen.mtu, seen.gateway), (Some(1400), Some(redirected)));
        // Another destination of the same route: untouched.
        let other = reader.lookup(&Query::to([10, 1, 0, 2].into())).unwrap();
        assert_eq!((other.mtu, other.gateway), (None, hop.gateway));
        fib.apply("r", "route replace 10.1.0.0/16 via 10.0.0.3\n")
            .unwrap();
        assert_eq!(reader.lookup(&q).unwrap().mtu, None);
        fib.apply("r", "route replace 10.1.0.0/16 via 10.0.0.2\n")
            .unwrap();
        assert_eq!(reader.lookup(&q).unwrap().mtu, Some(1400));
        fib.apply("down", "link set a0 down\n").unwrap();
        assert!(fib.exceptions().is_empty());
    }
}
