//! `fibre daemon` and `fibre ctl` as a user runs them, held to the kernel: a private
//! network namespace configured with `ip`, the daemon mirroring it, and what `fibre ctl`
//! lists and answers compared with what `ip` lists and answers, after the first dump and
//! after each round of changes made while the daemon runs.

use fibre_testbed::netns::Namespace;
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A running `fibre daemon` of a namespace; stopped (SIGKILL) when dropped.
struct Daemon {
    child: Child,
    socket: PathBuf,
    /// What it logs, read as it comes (a pipe left unread would fill, and the daemon,
    /// which logs every request, would wait on it), until it ends.
    log: Option<std::thread::JoinHandle<String>>,
}

impl Daemon {
    fn start(ns: &Namespace, extra: &[&str]) -> Daemon {
        let socket = std::env::temp_dir().join(format!("fibre-{}.sock", ns.name()));
        let mut command = Command::new(env!("CARGO_BIN_EXE_fibre"));
        command
            .args(["daemon", "--netns", ns.name(), "--socket"])
            .arg(&socket)
            .args(extra);
        let d = Daemon::spawn(&mut command, socket);
        // The socket is bound before the first dump: a request waits for it.
        wait_for("the control socket", || d.socket.exists());
        d
    }

    /// Runs `command` (a daemon whose socket is `socket`), its log read as it comes.
    fn spawn(command: &mut Command, socket: PathBuf) -> Daemon {
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("fibre daemon starts");
        let mut stderr = child.stderr.take().expect("its log");
        let log = std::thread::spawn(move || {
            use std::io::Read;
            let mut log = String::new();
            let _ = stderr.read_to_string(&mut log);
            log
        });
        Daemon {
            child,
            socket,
            log: Some(log),
        }
    }

    fn ctl(&self, words: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_fibre"))
            .args(["ctl", "--socket"])
            .arg(&self.socket)
            .args(words)
            .output()
            .expect("fibre ctl runs")
    }

    fn json(&self, words: &[&str]) -> Value {
        let out = self.ctl(words);
        assert!(
            out.status.success(),
            "fibre ctl {words:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("JSON")
    }

    /// Stops the daemon as a user does (SIGTERM) and returns its exit status.
    fn stop(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        self.child.wait().expect("the daemon exits")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// How a daemon ended: its exit status, what it logged, and whether its socket was
/// left behind.
struct Ended {
    status: std::process::ExitStatus,
    log: String,
    socket_left: bool,
}

impl Daemon {
    /// Waits, without a signal, for the daemon to end on its own.
    fn ended(mut self, guard: Duration) -> Ended {
        let mut status = None;
        wait_up_to("the daemon to end", guard, || {
            status = self.child.try_wait().expect("try_wait");
            status.is_some()
        });
        self.end(status.unwrap())
    }

    /// Stops the daemon (SIGTERM).
    fn stop_with_log(mut self) -> Ended {
        let pid = self.child.id().to_string();
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        let status = self.child.wait().expect("the daemon exits");
        self.end(status)
    }

    /// How the daemon, exited with `status`, ended (before this drops it, which
    /// removes whatever is at its socket's path).
    fn end(&mut self, status: std::process::ExitStatus) -> Ended {
        let log = self
            .log
            .take()
            .map(|l| l.join().expect("the log's reader"))
            .unwrap_or_default();
        Ended {
            status,
            log,
            socket_left: std::fs::symlink_metadata(&self.socket).is_ok(),
        }
    }
}

/// Waits until `done` holds. The bound is a guard against a hang, far past anything seen
/// (the daemon follows a change in well under a millisecond): it is not a measurement.
fn wait_for(what: &str, done: impl FnMut() -> bool) {
    wait_up_to(what, Duration::from_secs(60), done)
}

/// [`wait_for`] with another guard (the full tables take the kernel itself minutes).
fn wait_up_to(what: &str, guard: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < guard, "{what}: not after {guard:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn namespace(tag: &str) -> Namespace {
    let ns = Namespace::create(tag).expect("a network namespace (needs root)");
    for (k, v) in [
        ("net.ipv6.conf.all.accept_dad", "0"),
        ("net.ipv6.conf.default.accept_dad", "0"),
        ("net.ipv4.ip_forward", "1"),
        ("net.ipv6.conf.all.forwarding", "1"),
        // The same paths as the kernel's need its hash seed, which the mirror reads.
        ("net.ipv4.fib_multipath_hash_seed", "3141592653"),
    ] {
        ns.sysctl(k, v).expect("sysctl");
    }
    ns
}

/// `ip -n NS` with `lines`, one command a line, in order: runs of lines as `ip -batch`
/// reads them, a line with options (`-6 rule add ...`) on its own.
fn ip_batch(ns: &Namespace, lines: &str) {
    let mut run = String::new();
    for line in lines.lines() {
        if line.starts_with('-') {
            if !run.is_empty() {
                ns.batch(&run).expect("ip -batch");
                run.clear();
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            ns.ip(&words).expect("ip");
        } else {
            run.push_str(line);
            run.push('\n');
        }
    }
    if !run.is_empty() {
        ns.batch(&run).expect("ip -batch");
    }
}

/// Both sides' listings of every table of both families (JSON objects as text, sorted:
/// the kernel lists tables in its hash order), of the rules of both families, and of the
/// neighbours (as `ip neigh show` lists them, and with `nud all`).
fn listings(ns: &Namespace, d: &Daemon) -> (Vec<String>, Vec<String>) {
    let mut kernel = Vec::new();
    let mut fibre = Vec::new();
    for f in ["-4", "-6"] {
        let k: Value = serde_json::from_str(
            &ns.ip(&["-d", "-j", f, "route", "show", "table", "all"])
                .expect("ip route show"),
        )
        .expect("JSON");
        kernel.extend(k.as_array().unwrap().iter().map(Value::to_string));
        let v = d.json(&["route", "show", "table", "all", f, "--json"]);
        fibre.extend(v.as_array().unwrap().iter().map(Value::to_string));
        let k: Value =
            serde_json::from_str(&ns.ip(&["-j", f, "rule", "show"]).expect("ip rule show"))
                .expect("JSON");
        kernel.extend(k.as_array().unwrap().iter().map(|r| format!("rule {r}")));
        let v = d.json(&["rule", "show", f, "--json"]);
        fibre.extend(v.as_array().unwrap().iter().map(|r| format!("rule {r}")));
    }
    let k: Value =
        serde_json::from_str(&ns.ip(&["-j", "nexthop", "show"]).expect("ip nexthop show"))
            .expect("JSON");
    kernel.extend(k.as_array().unwrap().iter().map(|n| format!("nexthop {n}")));
    let v = d.json(&["nexthop", "show", "--json"]);
    fibre.extend(v.as_array().unwrap().iter().map(|n| format!("nexthop {n}")));
    for nud in [&[][..], &["nud", "all"][..]] {
        let mut args = vec!["-j", "neigh", "show"];
        args.extend(nud);
        let k: Value = serde_json::from_str(&ns.ip(&args).expect("ip neigh show")).expect("JSON");
        // The kernel's entries of multicast addresses come and go unannounced; the
        // mirror holds none.
        let unicast = |n: &&Value| {
            n["dst"]
                .as_str()
                .and_then(|d| d.parse::<std::net::IpAddr>().ok())
                .is_some_and(|d| !d.is_multicast())
        };
        kernel.extend(
            k.as_array()
                .unwrap()
                .iter()
                .filter(unicast)
                .map(|n| format!("neigh {nud:?} {n}")),
        );
        let mut words = vec!["neigh", "show"];
        words.extend(nud);
        words.push("--json");
        let v = d.json(&words);
        fibre.extend(
            v.as_array()
                .unwrap()
                .iter()
                .map(|n| format!("neigh {nud:?} {n}")),
        );
    }
    kernel.sort();
    fibre.sort();
    (kernel, fibre)
}

/// Adds a sentinel route and waits until the daemon lists it: notifications come in
/// order, so every change made before is applied too.
fn caught_up(ns: &Namespace, d: &Daemon, n: u32) {
    let dst = format!("198.51.100.{n}");
    ns.ip(&[
        "route",
        "add",
        &format!("{dst}/32"),
        "dev",
        "lo",
        "table",
        "250",
    ])
    .expect("the sentinel");
    wait_for("the sentinel route", || {
        let out = d.ctl(&["route", "show", "table", "250"]);
        String::from_utf8_lossy(&out.stdout).contains(&dst)
    });
}

/// The kernel's `ip -j route get` and the daemon's `route get --json` for `query`.
fn both_get(ns: &Namespace, d: &Daemon, query: &[&str]) -> (String, String) {
    let mut args = vec!["-d", "-j", "route", "get"];
    args.extend(query);
    let kernel = match ns.ip(&args) {
        Ok(out) => serde_json::from_str::<Value>(&out)
            .expect("JSON")
            .to_string(),
        Err(e) => {
            let text = e.to_string();
            let last = text.lines().last().unwrap_or("");
            format!("error {}", last.rsplit("failed: ").next().unwrap_or(last))
        }
    };
    let mut words = vec!["route", "get"];
    words.extend(query);
    words.push("--json");
    let out = d.ctl(&words);
    let fibre = if out.status.success() {
        serde_json::from_slice::<Value>(&out.stdout)
            .expect("JSON")
            .to_string()
    } else {
        format!(
            "error {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        )
    };
    (kernel, fibre)
}

fn assert_same(ns: &Namespace, d: &Daemon, when: &str) {
    let (kernel, fibre) = listings(ns, d);
    let only_kernel: Vec<_> = kernel.iter().filter(|r| !fibre.contains(r)).collect();
    let only_fibre: Vec<_> = fibre.iter().filter(|r| !kernel.contains(r)).collect();
    assert!(
        only_kernel.is_empty() && only_fibre.is_empty(),
        "{when}: only the kernel lists {only_kernel:#?}\nonly fibre lists {only_fibre:#?}"
    );
    assert_eq!(
        kernel.len(),
        fibre.len(),
        "{when}: as many routes and rules"
    );
    // The routes the daemon counts by table (as they change, no walk) are the kernel's.
    let mut counted = std::collections::BTreeMap::new();
    for t in d.json(&["stats", "--json"])["tables"].as_array().unwrap() {
        let key = (
            t["family"].as_str().unwrap().to_string(),
            t["table"].as_u64().unwrap(),
        );
        counted.insert(key, t["routes"].as_u64().unwrap());
    }
    let mut listed = std::collections::BTreeMap::new();
    for (f, name) in [("-4", "inet"), ("-6", "inet6")] {
        let k: Value = serde_json::from_str(
            &ns.ip(&["-d", "-j", f, "route", "show", "table", "all"])
                .expect("ip route show"),
        )
        .expect("JSON");
        for r in k.as_array().unwrap() {
            let table = match r["table"].as_str() {
                None | Some("main") => 254,
                Some("local") => 255,
                Some("default") => 253,
                Some(n) => n.parse().expect("a table number"),
            };
            *listed.entry((name.to_string(), table)).or_insert(0u64) += 1;
        }
    }
    assert_eq!(counted, listed, "{when}: routes counted by table");
}

const SETUP: &str = "\
link set lo up
link add a0 type veth peer name a1
link add b0 type veth peer name b1
link add d0 type veth peer name d1
link set a0 up
link set a1 up
link set b0 up
link set b1 up
link set d0 up
link set d1 up
addr add 10.0.0.1/24 dev a0
addr add 10.0.1.1/24 dev b0
addr add 10.0.1.9/24 dev b0
addr add 192.0.2.1/28 dev d0
addr add 2001:db8::1/64 dev a0 nodad
addr add 2001:db8:1::1/64 dev b0 nodad
route add 10.1.0.0/16 via 10.0.0.2
route add 10.2.0.0/16 nexthop via 10.0.0.2 weight 2 nexthop via 10.0.1.2
route add 10.3.0.0/16 via 10.0.0.3 table 100
route add blackhole 10.4.0.0/16
route add unreachable 10.5.0.0/16 metric 5
route add 10.6.0.0/16 via 10.0.1.3 mtu 1400 proto static
route add 2001:db8:5::/48 via 2001:db8::2
route add 2001:db8:5::/48 via 2001:db8:1::2 metric 2048
route add 2001:db8:6::/48 nexthop via 2001:db8::2 nexthop via 2001:db8:1::2
route add prohibit 2001:db8:7::/48
rule add from 10.9.0.0/16 lookup 100 pref 1000
rule add iif b1 lookup 100 pref 1001
rule add fwmark 7/0xff blackhole pref 1002
-6 rule add from 2001:db8:9::/48 lookup 100 pref 1000
nexthop add id 1 via 10.0.0.2 dev a0
nexthop add id 2 via 10.0.1.2 dev b0
nexthop add id 3 group 1/2,3
nexthop add id 4 blackhole
nexthop add id 5 via 2001:db8::2 dev a0
nexthop add id 6 via 2001:db8:1::2 dev b0
nexthop add id 7 group 5/6
route add 10.10.0.0/16 nhid 3
route add 10.11.0.0/16 nhid 4
route add 2001:db8:10::/48 nhid 7
neigh add 10.0.0.2 lladdr 02:00:00:00:00:02 dev a0 nud permanent
neigh add 10.0.1.2 lladdr 02:00:00:00:01:02 dev b0 nud noarp
-6 neigh add 2001:db8::2 lladdr 02:00:00:00:00:12 dev a0 nud permanent router
";

/// Queries asked of both after each round.
const QUERIES: [&str; 16] = [
    "10.10.1.1",
    "10.11.0.1",
    "10.12.0.1",
    "2001:db8:10::1",
    "10.1.2.3",
    "10.2.7.7",
    "10.3.0.1 from 10.9.1.1",
    "10.4.0.1",
    "10.5.0.1",
    "10.6.1.1",
    "10.0.1.9",
    "192.0.2.5",
    "2001:db8:5::1",
    "2001:db8:6::1",
    "2001:db8:7::1",
    "203.0.113.1",
];

fn ask_all(ns: &Namespace, d: &Daemon, when: &str) {
    for q in QUERIES {
        let words: Vec<&str> = q.split_whitespace().collect();
        let (kernel, fibre) = both_get(ns, d, &words);
        assert_eq!(kernel, fibre, "{when}: route get {q}");
    }
}

#[test]
#[ignore = "needs root: mirrors a network namespace the test configures"]
fn the_daemon_mirrors_a_namespace_and_follows_its_changes() {
    let ns = namespace("mirror");
    ip_batch(&ns, SETUP);
    // A free port for the metrics, in this (the host's) namespace.
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let d = Daemon::start(&ns, &["--metrics", &metrics]);
    caught_up(&ns, &d, 1);
    assert_same(&ns, &d, "after the first dump");
    ask_all(&ns, &d, "after the first dump");
    let stats = d.json(&["stats", "--json"]);
    assert_eq!(stats["synced"], true);

    // Changes while it runs, each kind the mirror follows.
    ip_batch(
        &ns,
        "\
route add 10.7.0.0/16 via 10.0.0.4 metric 5
route append 10.7.0.0/16 via 10.0.1.4 metric 5
route replace 10.1.0.0/16 via 10.0.1.5
route del 10.6.0.0/16
route add 2001:db8:8::/48 via 2001:db8::3
route append 2001:db8:8::/48 via 2001:db8:1::3
route del 2001:db8:6::/48 via 2001:db8::2
addr add 10.0.5.1/24 dev a1
addr add 2001:db8:2::1/64 dev a1 nodad
rule add to 10.7.0.0/16 lookup main pref 900
rule del pref 1001
route add 10.3.0.0/16 via 10.0.1.3 table 101
rule add from 10.9.0.0/16 lookup 101 pref 999
nexthop replace id 1 via 10.0.0.9 dev a0
nexthop add id 8 via 10.0.1.8 dev b0
nexthop replace id 3 group 1/8
nexthop del id 2
route add 10.12.0.0/16 nhid 8
neigh replace 10.0.0.2 lladdr 02:00:00:00:00:22 dev a0 nud permanent
neigh del 10.0.1.2 dev b0
neigh add 10.0.5.2 lladdr 02:00:00:00:05:02 dev a1 nud permanent
",
    );
    caught_up(&ns, &d, 2);
    assert_same(&ns, &d, "after routes, addresses and rules changed");
    ask_all(&ns, &d, "after routes, addresses and rules changed");

    // What the kernel removes without a message: routes through a link going down,
    // through a link losing its last address, and a link deleted.
    ip_batch(
        &ns,
        "\
link set b0 down
addr del 192.0.2.1/28 dev d0
link del a1
",
    );
    caught_up(&ns, &d, 3);
    assert_same(&ns, &d, "after links went down and away");
    ask_all(&ns, &d, "after links went down and away");
    ip_batch(&ns, "link set b0 up\nroute add 10.8.0.0/16 via 10.0.1.8\n");
    caught_up(&ns, &d, 4);
    assert_same(&ns, &d, "after a link came back");

    let stats = d.json(&["stats", "--json"]);
    assert!(stats["batches"].as_u64().unwrap() > 0, "{stats}");
    assert_eq!(stats["resyncs"], 0, "{stats}");
    assert_eq!(stats["malformed"], 0, "{stats}");

    // The metrics, scraped as Prometheus does.
    let mut conn = std::net::TcpStream::connect(&metrics).expect("the metrics port");
    std::io::Write::write_all(&mut conn, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut page = String::new();
    std::io::Read::read_to_string(&mut conn, &mut page).unwrap();
    assert!(page.starts_with("HTTP/1.1 200 OK"), "{page}");
    let main_routes: Value = serde_json::from_str(
        &ns.ip(&["-j", "-4", "route", "show", "table", "main"])
            .unwrap(),
    )
    .unwrap();
    let main_routes = main_routes.as_array().unwrap().len();
    // Read by a Prometheus text parser, not by matching lines.
    let body = page.split("\r\n\r\n").nth(1).expect("a body");
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("the exposition parses");
    let sample = |name: &str, labels: &[(&str, &str)]| {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .unwrap_or_else(|| panic!("{name} {labels:?} in {body}"))
    };
    let value = |name: &str, labels: &[(&str, &str)]| match sample(name, labels).value {
        prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Untyped(v) => v,
        ref other => panic!("{name}: {other:?}"),
    };
    assert_eq!(
        value(
            "fibre_mirror_routes",
            &[("family", "inet"), ("table", "254")]
        ),
        main_routes as f64,
        "{body}"
    );
    assert_eq!(value("fibre_mirror_synced", &[]), 1.0);
    assert!(value("fibre_mirror_updates_total", &[]) > 0.0, "{body}");
    // The lag is a histogram: its count is the batches applied, its sum their lags.
    assert!(
        value("fibre_mirror_lag_seconds_count", &[]) >= 1.0,
        "{body}"
    );
    assert!(value("fibre_mirror_lag_seconds_sum", &[]) > 0.0, "{body}");
    assert!(body.ends_with("# EOF\n"), "{body}");

    // On the socket itself: a command asked with `--json` is answered with its value,
    // typed (not a string holding it); without, with the text it prints.
    let ask = |words: &[&str]| -> Value {
        let mut conn = std::os::unix::net::UnixStream::connect(&d.socket).unwrap();
        let line = format!("{}\n", serde_json::to_string(words).unwrap());
        std::io::Write::write_all(&mut conn, line.as_bytes()).unwrap();
        let mut reply = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(&conn), &mut reply).unwrap();
        serde_json::from_str(&reply).unwrap()
    };
    let typed = ask(&["stats", "--json"]);
    assert_eq!(typed["code"], 0, "{typed}");
    assert!(typed["json"]["tables"].is_array(), "{typed}");
    assert!(typed.get("stdout").is_none(), "{typed}");
    let got = ask(&["route", "get", "127.0.0.1", "--json"]);
    assert_eq!(got["json"][0]["type"], "local", "{got}");
    let text = ask(&["route", "get", "127.0.0.1"]);
    assert!(
        text["stdout"]
            .as_str()
            .unwrap()
            .starts_with("local 127.0.0.1"),
        "{text}"
    );
    assert!(text.get("json").is_none(), "{text}");

    // A request that is not a command gets an error; the daemon answers the next.
    let out = d.ctl(&["route", "frobnicate"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown command"));
    let long = "x".repeat(10_000);
    for bad in [
        &["route", "get"][..],
        &["route", "get", "999.1.1.1"],
        &["route", "get", "10.1.1.1", "iif", "nosuchdev"],
        &["route", "show", "table", "x"],
        &["rule", "show", "extra"],
        &["stats", "now"],
        &[long.as_str()],
    ] {
        let out = d.ctl(bad);
        assert!(!out.status.success(), "{bad:?} is refused");
        assert!(!out.stderr.is_empty(), "{bad:?} says why");
    }
    for raw in [&b"[]\n"[..], b"[1, 2]\n", b"{\"a\": 1}\n", b"\n"] {
        let mut conn = std::os::unix::net::UnixStream::connect(&d.socket).unwrap();
        std::io::Write::write_all(&mut conn, raw).unwrap();
        let mut reply = String::new();
        std::io::Read::read_to_string(&mut conn, &mut reply).unwrap();
        let v: Value = serde_json::from_str(&reply).expect("a JSON reply");
        assert_ne!(v["code"], 0, "{raw:?}: {reply}");
    }
    let mut raw = std::os::unix::net::UnixStream::connect(&d.socket).unwrap();
    std::io::Write::write_all(&mut raw, b"not json\n").unwrap();
    let mut reply = String::new();
    std::io::Read::read_to_string(&mut raw, &mut reply).unwrap();
    assert!(reply.contains("JSON array"), "{reply}");
    assert_eq!(d.json(&["stats", "--json"])["synced"], true);

    let socket = d.socket.clone();
    let status = d.stop();
    assert!(status.success(), "exit on SIGTERM: {status}");
    assert!(!socket.exists(), "the socket is removed on exit");
}

/// Links as both sides list them: index, name, MTU, MAC, up; sorted.
fn links(ns: &Namespace, d: &Daemon) -> (Vec<String>, Vec<String>) {
    let pick = |l: &Value| {
        let up = l["flags"]
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x == "UP"));
        format!(
            "{} {} mtu {} {} up {up}",
            l["ifindex"], l["ifname"], l["mtu"], l["address"]
        )
    };
    let k: Value = serde_json::from_str(&ns.ip(&["-j", "link", "show"]).unwrap()).unwrap();
    let f = d.json(&["link", "show", "--json"]);
    let mut k: Vec<String> = k.as_array().unwrap().iter().map(pick).collect();
    let mut f: Vec<String> = f.as_array().unwrap().iter().map(pick).collect();
    k.sort();
    f.sort();
    (k, f)
}

/// Addresses as both sides list them: link, family, address, length; sorted.
fn addresses(ns: &Namespace, d: &Daemon) -> (Vec<String>, Vec<String>) {
    let all = |v: Value| -> Vec<String> {
        let mut out = Vec::new();
        for l in v.as_array().unwrap() {
            for a in l["addr_info"].as_array().into_iter().flatten() {
                out.push(format!(
                    "{} {} {}/{}",
                    l["ifname"], a["family"], a["local"], a["prefixlen"]
                ));
            }
        }
        out.sort();
        out
    };
    let k: Value = serde_json::from_str(&ns.ip(&["-j", "addr", "show"]).unwrap()).unwrap();
    (all(k), all(d.json(&["addr", "show", "--json"])))
}

#[test]
#[ignore = "needs root: mirrors a network namespace the test configures"]
fn the_daemon_keeps_up_with_links_churning() {
    let ns = namespace("churn");
    ip_batch(&ns, "link set lo up\n");
    let d = Daemon::start(&ns, &[]);
    // Rounds of 10 to 100 veth pairs, each with addresses of both families and routes
    // through them, made and then deleted in part, as containers come and go.
    let mut sentinel = 10;
    for (round, count) in [10usize, 40, 100, 25].into_iter().enumerate() {
        let mut up = String::new();
        for i in 0..count {
            let (a, b) = (i / 250, i % 250);
            up += &format!(
                "link add c{i} type veth peer name p{i}\nlink set c{i} up\nlink set p{i} up\n\
                 addr add 10.{}.{b}.1/24 dev c{i}\naddr add 2001:db8:{a:x}{b:02x}::1/64 dev c{i} nodad\n\
                 route add 172.{}.{b}.0/24 via 10.{}.{b}.2\n",
                100 + a,
                16 + a,
                100 + a
            );
        }
        ip_batch(&ns, &up);
        let mut down = String::new();
        for i in (round % 2..count).step_by(2) {
            down += &format!("link del c{i}\n");
        }
        ip_batch(&ns, &down);
        sentinel += 1;
        caught_up(&ns, &d, sentinel);
        let when = format!("round {round} ({count} pairs)");
        assert_same(&ns, &d, &when);
        let (k, f) = links(&ns, &d);
        assert_eq!(k, f, "{when}: links");
        let (k, f) = addresses(&ns, &d);
        assert_eq!(k, f, "{when}: addresses");
        // What is left goes before the next round.
        let mut gone = String::new();
        for i in (1 - round % 2..count).step_by(2) {
            gone += &format!("link del c{i}\n");
        }
        ip_batch(&ns, &gone);
    }
    sentinel += 1;
    caught_up(&ns, &d, sentinel);
    assert_same(&ns, &d, "after the churn");
    let (k, f) = links(&ns, &d);
    assert_eq!(k, f, "links after the churn");
    let stats = d.json(&["stats", "--json"]);
    assert_eq!(stats["malformed"], 0, "{stats}");
    // Links and addresses coming and going are patched too: a compile only at the start
    // and where a batch changed what a patch does not follow.
    eprintln!("after the churn: {stats}");
    assert!(
        stats["patched"].as_u64().unwrap() > stats["compiled"].as_u64().unwrap(),
        "{stats}"
    );
}

#[test]
#[ignore = "needs root: mirrors a network namespace the test configures"]
fn an_overflow_is_counted_and_the_mirror_converges_to_the_kernel() {
    let ns = namespace("overflow");
    ip_batch(
        &ns,
        "link set lo up\nlink add a0 type veth peer name a1\nlink set a0 up\nlink set a1 up\n\
         addr add 10.0.0.1/24 dev a0\n",
    );
    // A small receive buffer and a stalled reader: a burst of changes cannot queue.
    let d = Daemon::start(&ns, &["--receive-buffer", "4096"]);
    caught_up(&ns, &d, 1);
    let pid = d.child.id().to_string();
    let signal = |sig: &str| {
        assert!(Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success())
    };
    // Twice, seconds apart: the second resync backs off first.
    for round in 0..2 {
        signal("-STOP");
        let mut burst = String::new();
        for i in 0..3000 {
            burst += &format!(
                "route replace 10.{}.{}.0/24 via 10.0.0.{}\n",
                1 + i / 250,
                i % 250,
                2 + round
            );
        }
        for i in 0..500 {
            burst += &format!(
                "route del 10.{}.{}.0/24\n",
                1 + i / 250,
                (i + round * 7) % 250
            );
        }
        ip_batch(&ns, &burst);
        signal("-CONT");
        caught_up(&ns, &d, 2 + round as u32);
        assert_same(&ns, &d, &format!("after overflow {round}"));
    }
    let stats = d.json(&["stats", "--json"]);
    assert!(stats["overflows"].as_u64().unwrap() >= 2, "{stats}");
    assert!(stats["resyncs"].as_u64().unwrap() >= 2, "{stats}");
    assert!(stats["backoffs"].as_u64().unwrap() >= 1, "{stats}");
}

/// The lines of a shipped data file (`data/ris-2026-05-11`, gzip).
fn shipped(name: &str) -> Vec<String> {
    use std::io::BufRead;
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/ris-2026-05-11")
        .join(name);
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    std::io::BufReader::new(flate2::read::GzDecoder::new(file))
        .lines()
        .map(|l| l.expect("a line"))
        .collect()
}

/// The first differences of two sorted listings.
fn differences(kernel: &[String], fibre: &[String]) -> Vec<String> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while (i < kernel.len() || j < fibre.len()) && out.len() < 10 {
        match (kernel.get(i), fibre.get(j)) {
            (Some(k), Some(f)) if k == f => (i, j) = (i + 1, j + 1),
            (Some(k), Some(f)) if k < f => {
                out.push(format!("only the kernel: {k}"));
                i += 1;
            }
            (Some(k), None) => {
                out.push(format!("only the kernel: {k}"));
                i += 1;
            }
            (_, Some(f)) => {
                out.push(format!("only fibre: {f}"));
                j += 1;
            }
            (None, None) => break,
        }
    }
    out
}

/// Links, addresses, rules and a table of their own beside the full tables: the day's
/// routes go through `a0`, rules send some flows to table 100 or refuse them.
const DAY_SETUP: &str = "\
link set lo up
link add a0 type veth peer name a1
link set a0 up
link set a1 up
addr add 10.255.0.1/24 dev a0
addr add fd00::1/64 dev a0 nodad
route add 10.9.0.0/16 via 10.255.0.3 table 100
route add 2001:db8:9::/48 via fd00::3 table 100
route add 198.51.100.0/32 dev lo table 250
rule add from 10.9.0.0/16 lookup 100 pref 1000
rule add to 192.0.2.0/24 prohibit pref 1001
-6 rule add from 2001:db8:9::/48 lookup 100 pref 1000
";

/// The acceptance test of the mirror: the full real tables in a namespace, the daemon
/// started, the real day of updates replayed into the kernel while it runs (each
/// announcement replacing its route through another gateway, each withdrawal deleting
/// it); then every route of every table, both families, equal to `ip`'s, and `route get`
/// equal to `ip route get` on random addresses, with rules in place. Every batch was
/// published by a patch, none by compiling the state anew (but after an overflow).
#[test]
#[ignore = "needs root: loads the full tables into a network namespace and replays a day of updates"]
fn the_daemon_follows_a_real_day_of_updates_on_the_full_tables() {
    use rand::{Rng, SeedableRng};
    let guard = Duration::from_secs(900);
    let ns = namespace("day");
    ip_batch(&ns, DAY_SETUP);
    let rib: Vec<Vec<String>> = ["rib-v4.txt.gz", "rib-v6.txt.gz"]
        .iter()
        .map(|f| shipped(f))
        .collect();
    for (prefixes, gw) in rib.iter().zip(["10.255.0.2", "fd00::2"]) {
        let text: String = prefixes
            .iter()
            .map(|p| format!("route add {p} via {gw} dev a0\n"))
            .collect();
        ns.batch(&text).expect("the full table loads");
    }
    let d = Daemon::start(&ns, &[]);
    wait_up_to("the first dump", guard, || {
        let out = d.ctl(&["stats", "--json"]);
        out.status.success()
            && serde_json::from_slice::<Value>(&out.stdout).is_ok_and(|v| v["synced"] == true)
    });
    let mut announced = 0;
    for (file, gw) in [
        ("updates-v4.txt.gz", "10.255.0."),
        ("updates-v6.txt.gz", "fd00::"),
    ] {
        let mut text = String::new();
        for (i, line) in shipped(file).iter().enumerate() {
            match line.split_once(' ') {
                Some(("A", p)) => {
                    announced += 1;
                    text += &format!("route replace {p} via {gw}{} dev a0\n", 2 + i % 8)
                }
                Some(("W", p)) => text += &format!("route del {p}\n"),
                _ => panic!("{file}: {line}"),
            }
        }
        // Withdrawals of routes not there fail; the day goes on.
        ns.batch_force(&text).expect("the day replays");
    }
    assert!(announced > 2_000_000, "{announced} announcements");
    // A sentinel: once the daemon lists it, it has applied every change made before.
    ns.ip(&[
        "route",
        "add",
        "198.51.100.1/32",
        "dev",
        "lo",
        "table",
        "250",
    ])
    .expect("the sentinel");
    wait_up_to("the sentinel route", guard, || {
        let out = d.ctl(&["route", "show", "table", "250"]);
        String::from_utf8_lossy(&out.stdout).contains("198.51.100.1")
    });
    // Every route of every table, both families, as `ip -d -j route show table all`.
    let list = |v: Value| -> Vec<String> {
        let mut l: Vec<String> = v.as_array().unwrap().iter().map(Value::to_string).collect();
        l.sort_unstable();
        l
    };
    let kernel = list(
        serde_json::from_str(
            &ns.ip(&["-d", "-j", "route", "show", "table", "all"])
                .expect("ip route show"),
        )
        .expect("JSON"),
    );
    let fibre = list(d.json(&["route", "show", "table", "all", "--json"]));
    let diff = differences(&kernel, &fibre);
    assert!(diff.is_empty(), "after the day: {diff:#?}");
    assert_eq!(kernel.len(), fibre.len());
    assert!(kernel.len() > 1_200_000, "{} routes", kernel.len());
    // `route get` on random addresses of the tables' prefixes and beyond, from this
    // host and forwarded, through the rules.
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for i in 0..1500 {
        let v6 = i % 2 == 1;
        let prefixes = &rib[v6 as usize];
        let p = &prefixes[rng.gen_range(0..prefixes.len())];
        let (addr, len) = p.split_once('/').unwrap();
        let len: u32 = len.parse().unwrap();
        let dst = if v6 {
            let base = u128::from(addr.parse::<std::net::Ipv6Addr>().unwrap());
            let host = if len == 128 {
                0
            } else {
                rng.gen::<u128>() >> len
            };
            std::net::Ipv6Addr::from(base | host).to_string()
        } else if i % 10 == 4 {
            format!("192.0.2.{}", rng.gen_range(1..255))
        } else {
            let base = u32::from(addr.parse::<std::net::Ipv4Addr>().unwrap());
            let host = if len == 32 {
                0
            } else {
                rng.gen::<u32>() >> len
            };
            std::net::Ipv4Addr::from(base | host).to_string()
        };
        let src = match (v6, rng.gen_range(0..3)) {
            (false, 0) => format!("10.9.{}.{}", rng.gen_range(0..256), rng.gen_range(1..255)),
            (true, 0) => format!("2001:db8:9::{:x}", rng.gen_range(1..65535)),
            (false, _) => format!("198.18.{}.{}", rng.gen_range(0..256), rng.gen_range(1..255)),
            (true, _) => format!("2001:db8:77::{:x}", rng.gen_range(1..65535)),
        };
        let query: Vec<&str> = if i % 3 == 0 {
            vec![&dst]
        } else {
            vec![&dst, "from", &src, "iif", "a1"]
        };
        let (kernel, fibre) = both_get(&ns, &d, &query);
        assert_eq!(kernel, fibre, "after the day: route get {query:?}");
    }
    let stats = d.json(&["stats", "--json"]);
    eprintln!("after the day: {stats}");
    let resyncs = stats["resyncs"].as_u64().unwrap();
    assert_eq!(stats["compiled"].as_u64(), Some(1 + resyncs), "{stats}");
    assert!(stats["patched"].as_u64().unwrap() > 0, "{stats}");
    assert!(d.stop().success());
}

/// The control socket as a root daemon's must be: a regular file at its path is refused,
/// named, and left as it was; the socket made is 0660 and of the group asked; each
/// request is logged with who made it (the client, not the daemon); on exit the socket
/// goes.
#[test]
#[ignore = "needs root: runs the daemon as root in a network namespace"]
fn the_control_socket_replaces_nothing_and_says_who_asks() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let ns = namespace("socket");
    let file = std::env::temp_dir().join(format!("fibre-precious-{}", std::process::id()));
    std::fs::write(&file, b"precious").unwrap();
    let refused = Daemon::spawn(
        Command::new(env!("CARGO_BIN_EXE_fibre"))
            .args(["daemon", "--netns", ns.name(), "--socket"])
            .arg(&file),
        // (Its drop removes what is at this path: not the file.)
        file.with_extension("none"),
    )
    .ended(Duration::from_secs(30));
    assert!(!refused.status.success());
    assert!(
        refused.log.contains(&*file.to_string_lossy()) && refused.log.contains("not a socket"),
        "{}",
        refused.log
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"precious");
    std::fs::remove_file(&file).unwrap();

    let d = Daemon::start(&ns, &["--socket-group", "4242"]);
    let m = std::fs::metadata(&d.socket).unwrap();
    assert!(m.file_type().is_socket());
    assert_eq!((m.mode() & 0o777, m.gid()), (0o660, 4242));
    let asking = Command::new(env!("CARGO_BIN_EXE_fibre"))
        .args(["ctl", "--socket"])
        .arg(&d.socket)
        .args(["stats", "--json"])
        .spawn()
        .expect("fibre ctl runs");
    let client = asking.id();
    assert!(asking.wait_with_output().unwrap().status.success());
    // Answering, it is set up: every thread keeps CAP_NET_ADMIN and CAP_SYS_NICE (the
    // receivers' real-time priority) alone (no forwarding), in no other set; no new
    // privileges.
    use fibre_kernel::privileges::{mask, NET_ADMIN, SYS_NICE};
    let kept = mask(&[NET_ADMIN, SYS_NICE]);
    for t in fibre_kernel::privileges::of_threads(d.child.id()).unwrap() {
        assert!(t.no_new_privs, "{t:?}");
        for (set, m) in t.sets {
            let want = if matches!(set.as_str(), "Inh" | "Amb") {
                0
            } else {
                kept
            };
            assert_eq!(m, want, "Cap{set}");
        }
    }

    let daemon = d.child.id();
    let end = d.stop_with_log();
    assert!(end.status.success(), "{}", end.log);
    let logged = format!("request from pid {client} uid 0 gid 0: stats --json");
    assert!(end.log.lines().any(|l| l.ends_with(&logged)), "{}", end.log);
    assert!(!end.log.contains(&format!("pid {daemon} ")), "{}", end.log);
    assert!(!end.socket_left, "the socket removed on exit");
}

/// Each thread of process `pid`: its id, name, scheduling policy (`SCHED_OTHER` 0,
/// `SCHED_FIFO` 1) and real-time priority, as its `stat` file gives them.
fn thread_policies(pid: u32) -> Vec<(u32, String, u32, u32)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = entry.unwrap().path();
        let tid: u32 = dir.file_name().unwrap().to_str().unwrap().parse().unwrap();
        let name = std::fs::read_to_string(dir.join("comm")).unwrap();
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap();
        // After the name in parentheses, fields 3 onwards: rt_priority is the 40th, the
        // policy the 41st.
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        let field = |n: usize| fields[n - 3].parse::<u32>().unwrap();
        out.push((tid, name.trim().to_string(), field(41), field(40)));
    }
    out.sort();
    out
}

/// The mirror (the main thread) and its receivers of rtnetlink and nftables run at the
/// lowest real-time priority, every other thread (the control socket's, the watchers')
/// at the normal one; with `--no-realtime`, all at the normal one.
#[test]
#[ignore = "needs root: runs the daemon as root in a network namespace"]
fn the_mirror_and_its_receivers_alone_are_realtime() {
    const FIFO: u32 = 1;
    let ns = namespace("priority");
    let d = Daemon::start(&ns, &[]);
    assert_eq!(d.json(&["stats", "--json"])["synced"], true);
    let pid = d.child.id();
    let threads = thread_policies(pid);
    let realtime: Vec<&str> = threads
        .iter()
        .filter(|t| t.2 == FIFO)
        .map(|t| if t.0 == pid { "main" } else { t.1.as_str() })
        .collect();
    assert!(
        realtime == ["main", "rtnetlink"] || realtime == ["main", "rtnetlink", "nftables"],
        "{threads:?}"
    );
    assert!(
        threads
            .iter()
            .all(|t| t.2 == 0 || (t.2 == FIFO && t.3 == 1)),
        "the others normal, the real-time ones at 1: {threads:?}"
    );
    assert!(threads.len() > realtime.len(), "{threads:?}");
    let end = d.stop_with_log();
    assert!(
        end.log
            .contains("the mirror and its receivers run at the lowest real-time priority"),
        "{}",
        end.log
    );

    let d = Daemon::start(&ns, &["--no-realtime"]);
    assert_eq!(d.json(&["stats", "--json"])["synced"], true);
    let threads = thread_policies(d.child.id());
    assert!(threads.iter().all(|t| t.2 == 0), "{threads:?}");
    assert!(d.stop().success());
}

/// A namespace deleted under the daemon (`ip netns del`) ends it: it says so and exits
/// non-zero, its socket gone.
#[test]
#[ignore = "needs root: deletes the network namespace the daemon mirrors"]
fn a_namespace_deleted_under_the_daemon_ends_it() {
    let ns = namespace("deleted");
    let d = Daemon::start(&ns, &[]);
    assert_eq!(d.json(&["stats", "--json"])["synced"], true);
    let del = Command::new("ip")
        .args(["netns", "del", ns.name()])
        .status()
        .expect("ip netns del");
    assert!(del.success());
    let end = d.ended(Duration::from_secs(30));
    assert!(!end.status.success(), "{}", end.log);
    assert!(
        end.log
            .contains(&format!("the network namespace {} was deleted", ns.name())),
        "{}",
        end.log
    );
    assert!(!end.socket_left, "the socket removed on exit");
}

#[test]
#[ignore = "needs root: mirrors a network namespace the test configures"]
fn clients_are_bounded_in_number_and_in_time() {
    use std::io::Read;
    use std::os::unix::net::UnixStream;
    let ns = namespace("clients");
    ip_batch(&ns, "link set lo up\n");
    let d = Daemon::start(&ns, &[]);
    d.json(&["stats", "--json"]);
    // Sixteen clients that connect and send nothing hold every place (the daemon accepts
    // in the order clients connect).
    let idle: Vec<UnixStream> = (0..16)
        .map(|_| UnixStream::connect(&d.socket).expect("a client connects"))
        .collect();
    // One more is told so at once, and the daemon goes on.
    let out = d.ctl(&["stats"]);
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("16 clients at once"), "{said}");
    // Each idle one is answered with an error and closed when its time is up.
    for mut c in idle {
        c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut reply = String::new();
        c.read_to_string(&mut reply).expect("the daemon closes it");
        assert!(reply.contains("not sent within 10 s"), "{reply}");
    }
    // Their places are free again.
    wait_for("a client served again", || {
        d.ctl(&["stats"]).status.success()
    });
    let ended = d.stop_with_log();
    assert!(ended.status.success());
    assert!(
        ended
            .log
            .contains("(not read: too many clients; 1 turned away so far)"),
        "{}",
        ended.log
    );
}
