//! Private network namespaces for the tests and benchmarks that ask the kernel, so that
//! its routing, firewall and forwarding can be configured and judged without touching
//! the machine's own.
//!
//! A [`Namespace`] is made with `ip netns add` under a name of this process's own and
//! deleted when dropped; it is configured through `ip` (iproute2) and `nft` run inside
//! it, as an administrator would do it, one command at a time or as a batch. A thread
//! enters it through `fibre_kernel::netns::enter`, the way the daemon enters one.
//!
//! [`Namespace::setup_router`] makes the router the kernel's FIB is measured in: a veth
//! pair whose packets "arrive" on `fin` ([`INPUT_DEV`]: the XDP probe runs as if on it,
//! with forwarding enabled), and routes pointing at gateways on `fout`'s
//! ([`OUTPUT_DEV`]) subnets, 10.200.0.0/16 and fd00:200::/64, each gateway
//! ([`gateway`]) with a permanent neighbour entry so that a lookup completes the way
//! forwarding would.

use std::io::{self, Write};
use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The interface packets arrive on.
pub const INPUT_DEV: &str = "fin";
/// The interface routes leave through.
pub const OUTPUT_DEV: &str = "fout";

/// A network namespace of this process's own, deleted on drop.
#[derive(Debug)]
pub struct Namespace {
    name: String,
}

/// Why the kernel side cannot run here, said plainly.
pub fn unavailable_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("measuring the kernel needs root (network namespaces and BPF)".into());
    }
    match Command::new("ip").arg("-V").output() {
        Ok(o) if o.status.success() => None,
        _ => Some("measuring the kernel needs the `ip` command (iproute2)".into()),
    }
}

impl Namespace {
    /// Creates a fresh namespace (its name includes the process id).
    pub fn create(tag: &str) -> io::Result<Namespace> {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "fibre-{tag}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        run(Command::new("ip").args(["netns", "add", &name]))?;
        Ok(Namespace { name })
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `ip -n NAME ARGS...` and returns its standard output.
    pub fn ip(&self, args: &[&str]) -> io::Result<String> {
        run(Command::new("ip").args(["-n", &self.name]).args(args))
    }

    /// Waits until each of `links` is operationally up (a veth is once its peer is up
    /// too; frames sent before are dropped), at most `within`; an error naming the links
    /// still down after that.
    pub fn wait_up(&self, links: &[&str], within: std::time::Duration) -> io::Result<()> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let mut down = Vec::new();
            for link in links {
                // `ip -br link show dev NAME`: the name, then the state.
                let out = self.ip(&["-br", "link", "show", "dev", link])?;
                if out.split_whitespace().nth(1) != Some("UP") {
                    down.push(*link);
                }
            }
            if down.is_empty() {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{}: still down in {}", down.join(", "), self.name),
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Runs `ip -n NAME -batch -` on `commands` (one command per line); fails at the
    /// first command that fails, with ip's message.
    pub fn batch(&self, commands: &str) -> io::Result<()> {
        self.run_batch(commands, false)
    }

    /// Like [`Namespace::batch`], but carries on past failing commands (`ip -force`), as
    /// a stream of updates needs (a withdrawal of a route that is not there fails).
    pub fn batch_force(&self, commands: &str) -> io::Result<()> {
        self.run_batch(commands, true)
    }

    /// Like [`Namespace::batch`] with `ip -6` (or `-4`): lines of `ip -batch` cannot say
    /// their family, and a rule's family is not always in its words.
    pub fn batch_family(&self, family: u8, commands: &str) -> io::Result<()> {
        self.run_batch_as(Some(family), commands, false)
    }

    fn run_batch(&self, commands: &str, force: bool) -> io::Result<()> {
        self.run_batch_as(None, commands, force)
    }

    fn run_batch_as(&self, family: Option<u8>, commands: &str, force: bool) -> io::Result<()> {
        let mut child = Command::new("ip")
            .args(["-n", &self.name])
            .args(family.map(|f| if f == 6 { "-6" } else { "-4" }))
            .args(force.then_some("-force"))
            .args(["-batch", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let mut stdin = child.stdin.take().expect("stdin is piped");
        // Feed the commands from a thread of their own while this one reads what ip
        // says: ip writes an error line per failing command, and if nobody read them
        // while the commands were still being written, both would wait on a full pipe.
        let out = std::thread::scope(|s| {
            let feeder = s.spawn(move || stdin.write_all(commands.as_bytes()));
            let out = child.wait_with_output();
            let fed = feeder.join().expect("the feeding thread does not panic");
            // ip stops reading at the first failure without -force: a broken pipe then
            // is that failure, which its exit status and message report.
            match fed {
                Err(e) if e.kind() != io::ErrorKind::BrokenPipe || force => Err(e),
                _ => out,
            }
        })?;
        if !force && !out.status.success() {
            return Err(io::Error::other(format!(
                "ip -batch in {}: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }

    /// Runs `nft` inside the namespace with `args`, `stdin` fed to it (`-f -` loads a
    /// ruleset); what it printed.
    pub fn nft(&self, args: &[&str], stdin: &str) -> io::Result<String> {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.name, "nft"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let mut input = child.stdin.take().expect("stdin is piped");
        // Fed from a thread of its own while this one reads what nft says, as for ip.
        let out = std::thread::scope(|s| {
            let feeder = s.spawn(move || input.write_all(stdin.as_bytes()));
            let out = child.wait_with_output();
            let _ = feeder.join().expect("the feeding thread does not panic");
            out
        })?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "nft {args:?} in {}: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Sets a sysctl inside the namespace.
    pub fn sysctl(&self, key: &str, value: &str) -> io::Result<()> {
        run(Command::new("ip").args([
            "netns",
            "exec",
            &self.name,
            "sysctl",
            "-qw",
            &format!("{key}={value}"),
        ]))
        .map(|_| ())
    }

    /// Moves the calling thread into the namespace (other threads are unaffected),
    /// through [`fibre_kernel::netns::enter`], as the daemon's `--netns` does.
    pub fn enter(&self) -> io::Result<()> {
        fibre_kernel::netns::enter(&self.name)
    }

    /// The interface index of `dev` in the namespace.
    pub fn ifindex(&self, dev: &str) -> io::Result<u32> {
        let out = self.ip(&["-o", "link", "show", "dev", dev])?;
        out.split(':')
            .next()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| io::Error::other(format!("cannot read the index of {dev}: {out:?}")))
    }

    /// Makes the namespace a router: veth pair `fin`/`fout`, output subnets, forwarding
    /// on, and `gateways` on-link gateways per family with permanent neighbour entries.
    pub fn setup_router(&self, gateways: usize) -> io::Result<()> {
        let mut cmds = String::new();
        cmds.push_str("link set lo up\n");
        cmds.push_str(&format!(
            "link add {INPUT_DEV} type veth peer name {OUTPUT_DEV}\n"
        ));
        cmds.push_str(&format!(
            "link set {INPUT_DEV} up\nlink set {OUTPUT_DEV} up\n"
        ));
        cmds.push_str(&format!("addr add 10.199.0.1/24 dev {INPUT_DEV}\n"));
        cmds.push_str(&format!("addr add 10.200.0.1/16 dev {OUTPUT_DEV}\n"));
        cmds.push_str(&format!("addr add fd00:200::1/64 dev {OUTPUT_DEV} nodad\n"));
        for i in 0..gateways {
            let mac = format!("02:00:00:00:{:02x}:{:02x}", i >> 8 & 0xff, i & 0xff);
            cmds.push_str(&format!(
                "neigh add {} lladdr {mac} dev {OUTPUT_DEV} nud permanent\n",
                gateway(4, i)
            ));
            cmds.push_str(&format!(
                "neigh add {} lladdr {mac} dev {OUTPUT_DEV} nud permanent\n",
                gateway(6, i)
            ));
        }
        self.batch(&cmds)?;
        self.sysctl("net.ipv4.conf.all.forwarding", "1")?;
        self.sysctl("net.ipv6.conf.all.forwarding", "1")?;
        Ok(())
    }

    /// The kernel's answer to `ip route get ADDR` as forwarding sees it: the gateway,
    /// `Some(None)` for a forwarding route without one, `None` when the address is not
    /// forwarded (no route, or a local, broadcast, multicast or blocking route).
    pub fn route_get(&self, addr: IpAddr) -> io::Result<Option<Option<IpAddr>>> {
        let out = Command::new("ip")
            .args(["-n", &self.name, "route", "get", &addr.to_string()])
            .output()?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            if err.contains("unreachable") {
                return Ok(None);
            }
            return Err(io::Error::other(format!(
                "ip route get {addr}: {}",
                err.trim()
            )));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let mut words = text.split_whitespace();
        let first = words.next().unwrap_or("");
        if matches!(
            first,
            "unreachable"
                | "blackhole"
                | "prohibit"
                | "throw"
                | "local"
                | "broadcast"
                | "multicast"
        ) {
            return Ok(None);
        }
        while let Some(w) = words.next() {
            if w == "via" {
                let gw = words.next().and_then(|g| g.parse().ok());
                return Ok(Some(gw));
            }
        }
        Ok(Some(None))
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Gateway number `i` (of at most 65,000) of a family, on `fout`'s subnet.
pub fn gateway(family: u8, i: usize) -> IpAddr {
    let i = i % 65_000;
    if family == 4 {
        IpAddr::V4(std::net::Ipv4Addr::new(
            10,
            200,
            (1 + i / 250) as u8,
            (1 + i % 250) as u8,
        ))
    } else {
        let base: u128 = 0xfd00_0200_0000_0000_0000_0000_0000_0000;
        IpAddr::V6(std::net::Ipv6Addr::from(base + 2 + i as u128))
    }
}

fn run(cmd: &mut Command) -> io::Result<String> {
    let out = cmd.output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{:?} failed: {}",
            cmd,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[ignore = "needs root: creates a network namespace"]
    fn a_batch_whose_commands_all_fail_loudly_ends() {
        // 3,000 withdrawals of routes that are not there: ip writes an error line for
        // each, far more than a pipe holds, while its input is still being written.
        let ns = Namespace::create("batch").expect("a namespace (as root)");
        let commands: String = (0..3000)
            .map(|i| format!("route del 10.{}.{}.0/24\n", i / 256, i % 256))
            .collect();
        ns.batch_force(&commands)
            .expect("a forced batch carries on");
        let err = ns.batch(&commands).expect_err("the first failure stops it");
        assert!(err.to_string().contains("ip -batch in"), "{err}");
        ns.batch("route add blackhole 10.9.9.0/24\n")
            .expect("a good batch");
        assert!(ns.ip(&["route", "show"]).unwrap().contains("10.9.9.0/24"));
    }

    #[test]
    #[ignore = "needs root: creates a network namespace"]
    fn a_thread_that_enters_sees_the_namespace_links_and_the_caller_keeps_its_own() {
        let ns = Namespace::create("enter").expect("a namespace (as root)");
        ns.setup_router(1).expect("a router");
        let index = ns.ifindex(INPUT_DEV).unwrap();
        let name_of = |index: u32| {
            let mut name = [0 as libc::c_char; libc::IF_NAMESIZE];
            // SAFETY: `name` holds IF_NAMESIZE bytes, as if_indextoname writes at most.
            let p = unsafe { libc::if_indextoname(index, name.as_mut_ptr()) };
            // SAFETY: a non-null result is `name`, a NUL-terminated string.
            (!p.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(p) }.to_owned())
        };
        let inside = std::thread::scope(|s| {
            s.spawn(|| {
                ns.enter().expect("entering");
                name_of(index)
            })
            .join()
            .unwrap()
        });
        assert_eq!(inside.as_deref(), Some(c"fin"));
        assert_ne!(
            name_of(index).as_deref(),
            Some(c"fin"),
            "the caller stayed out"
        );
    }
}
