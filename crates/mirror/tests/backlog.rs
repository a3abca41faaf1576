//! The bound between the netlink receiver and the mirror ([`Backlog`]), with a real
//! subscribed socket in a network namespace: a mirror that stops applying leaves the
//! changes in the kernel's socket, which overflows, instead of a queue in between growing;
//! after the overflow the mirror dumps again and holds what the kernel holds.

use fibre_fib::{show, Family};
use fibre_mirror::netlink::{Backlog, Batch, Events};
use fibre_mirror::Mirror;
use fibre_testbed::netns::Namespace;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// The destinations of table `main`'s IPv4 routes as `ip -j route show` names them,
/// sorted: the kernel's.
fn kernel_routes(ns: &Namespace) -> Vec<String> {
    let out = ns
        .ip(&["-j", "-4", "route", "show", "table", "main"])
        .unwrap();
    let routes: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mut dsts: Vec<String> = routes
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["dst"].as_str().unwrap().to_string())
        .collect();
    dsts.sort();
    dsts
}

/// The same of the mirror's state.
fn mirrored_routes(mirror: &Mirror) -> Vec<String> {
    let state = mirror.state();
    let mut dsts: Vec<String> = state
        .routes(Family::V4, Some(254))
        .map(|r| {
            show::route_json(state, &r)["dst"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    dsts.sort();
    dsts
}

#[test]
#[ignore = "needs root: mirrors a network namespace the test configures"]
fn a_stalled_mirror_overflows_the_socket_not_a_queue_and_converges() {
    let ns = Namespace::create("backlog").unwrap();
    ns.batch("link set lo up\nlink add a0 type veth peer name a1\nlink set a0 up\nlink set a1 up\naddr add 10.0.0.1/24 dev a0\n")
        .unwrap();
    let name = ns.name().to_string();
    // The mirror's side runs in a thread of the namespace; the receiver it starts is too.
    let (to_test, from_mirror) = mpsc::channel();
    let (to_mirror, from_test) = mpsc::channel::<()>();
    let mirror_side = std::thread::spawn(move || {
        fibre_kernel::netns::enter(&name).unwrap();
        // A small socket buffer: a burst cannot wait in it.
        let mut events = Events::subscribe(4096).unwrap();
        let (mut mirror, _reader) = Mirror::sync().unwrap();
        let backlog = Arc::new(Backlog::new(1));
        let (tx, rx) = mpsc::channel();
        {
            let backlog = backlog.clone();
            std::thread::spawn(move || loop {
                backlog.wait_for_room();
                let b = events.receive().unwrap();
                backlog.received(&b);
                if tx.send(b).is_err() {
                    return;
                }
            });
        }
        // One change, received: the backlog is full and the receiver waits.
        to_test.send("ready").unwrap();
        let first = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(matches!(first, Batch::Messages(..)), "an overflow first");
        to_test.send("first").unwrap();
        // The mirror stalls while a burst comes.
        from_test.recv().unwrap();
        assert!(
            rx.try_recv().is_err(),
            "the receiver went on reading while the backlog was full"
        );
        assert_eq!(backlog.queued(), first.len());
        assert!(backlog.waits() >= 1);
        // Applied: the receiver reads again, and finds the socket overflowed.
        if let Batch::Messages(m, bad) = first {
            let n = m.len();
            mirror.apply(m, bad, Instant::now());
            backlog.applied(n);
        }
        let next = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(
            matches!(next, Batch::Overflow),
            "{} messages, not an overflow",
            next.len()
        );
        mirror.overflowed();
        mirror.resync().unwrap();
        assert_eq!(mirror.stats().overflows, 1);
        assert_eq!(mirror.stats().resyncs, 1);
        mirror
    });
    assert_eq!(from_mirror.recv().unwrap(), "ready");
    ns.batch("route add 10.200.0.0/16 via 10.0.0.2\n").unwrap();
    assert_eq!(from_mirror.recv().unwrap(), "first");
    let mut burst = String::new();
    for i in 0..3000 {
        burst += &format!(
            "route add 10.{}.{}.0/24 via 10.0.0.2\n",
            1 + i / 250,
            i % 250
        );
    }
    ns.batch(&burst).unwrap();
    to_mirror.send(()).unwrap();
    let mirror = mirror_side.join().expect("the mirror's side held");
    let (kernel, fibre) = (kernel_routes(&ns), mirrored_routes(&mirror));
    // The link's prefix, the first change, the burst.
    assert_eq!(kernel.len(), 3002);
    let missing: Vec<_> = kernel
        .iter()
        .filter(|r| !fibre.contains(r))
        .take(5)
        .collect();
    let extra: Vec<_> = fibre
        .iter()
        .filter(|r| !kernel.contains(r))
        .take(5)
        .collect();
    assert!(
        kernel == fibre,
        "the mirror lacks {missing:?} and holds {extra:?} too"
    );
}
