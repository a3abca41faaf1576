//! What counts as a lag, with a real subscribed socket in a network namespace: a batch of
//! notifications that changes what readers see publishes a version and has a lag; one
//! that changes nothing they see (the kernel reporting a nexthop object's routes again
//! after the object changed) publishes nothing and has none, its time kept apart.

use fibre_mirror::netlink::{self, Batch, Events};
use fibre_mirror::Mirror;
use fibre_testbed::netns::Namespace;
use std::time::Instant;

/// Routes through the nexthop object: enough for the kernel's reports of them again to
/// fill batches of their own.
const OBJECT_ROUTES: usize = 3000;

#[test]
#[ignore = "needs root: mirrors a network namespace the test configures"]
fn only_a_batch_that_publishes_has_a_lag() {
    let ns = Namespace::create("lag").unwrap();
    let mut setup = "link set lo up\nlink add a0 type veth peer name a1\nlink set a0 up\n\
                     link set a1 up\naddr add 10.0.0.1/24 dev a0\naddr add 10.0.0.3/24 dev a0\n\
                     nexthop add id 7 via 10.0.0.2 dev a0\n"
        .to_string();
    for i in 0..OBJECT_ROUTES {
        setup += &format!("route add 10.{}.{}.0/24 nhid 7\n", 1 + i / 250, i % 250);
    }
    ns.batch(&setup).unwrap();
    let name = ns.name().to_string();
    let (to_test, from_mirror) = std::sync::mpsc::channel();
    let (to_mirror, from_test) = std::sync::mpsc::channel::<()>();
    let mirror_side = std::thread::spawn(move || {
        fibre_kernel::netns::enter(&name).unwrap();
        let mut events = Events::subscribe(netlink::RECEIVE_BUFFER).unwrap();
        let (mut mirror, reader) = Mirror::sync().unwrap();
        let hop_of = |addr: &str| {
            let q = fibre_fib::Query::to(addr.parse().unwrap());
            reader.lookup(&q).map(|h| h.gateway)
        };
        let through = |gw: &str| Ok(Some(gw.parse().unwrap()));
        assert_eq!(hop_of("10.1.0.1"), through("10.0.0.2"));
        to_test.send(()).unwrap();
        from_test.recv().unwrap();
        // Every batch until the sentinel route: the object's change, the routes reported
        // again, the sentinel.
        let (mut published, mut unpublished) = (0, 0);
        let sentinel = fibre_fib::Net::parse("192.0.2.0/24", None).unwrap();
        loop {
            let Batch::Messages(batch, bad) = events.receive().unwrap() else {
                panic!("the socket overflowed");
            };
            let before = mirror.snapshot();
            match mirror.apply(batch, bad, Instant::now()) {
                Some(lag) => {
                    published += 1;
                    assert!(lag > std::time::Duration::ZERO);
                    assert!(!std::sync::Arc::ptr_eq(&before, &mirror.snapshot()));
                }
                None => {
                    unpublished += 1;
                    assert!(
                        std::sync::Arc::ptr_eq(&before, &mirror.snapshot()),
                        "a batch said to publish nothing published a version"
                    );
                }
            }
            let mut routes = mirror.state().routes(fibre_fib::Family::V4, None);
            if routes.any(|r| r.dst == sentinel) {
                break;
            }
        }
        // The object's change is published (its routes answer through the new gateway),
        // and the kernel's reports of its routes again made batches that published
        // nothing.
        assert_eq!(hop_of("10.1.0.1"), through("10.0.0.4"));
        assert!(published >= 1);
        assert!(unpublished >= 1, "no batch of routes reported again");
        let stats = mirror.stats();
        assert_eq!(stats.lags(), published);
        assert!(stats.unpublished_longest() > std::time::Duration::ZERO);
    });
    from_mirror.recv().unwrap();
    ns.batch("nexthop replace id 7 via 10.0.0.4 dev a0\n")
        .unwrap();
    ns.batch("route add unreachable 192.0.2.0/24\n").unwrap();
    to_mirror.send(()).unwrap();
    mirror_side.join().expect("the mirror's side held");
}
