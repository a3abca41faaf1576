//! `fibre`: a userspace IPv4/IPv6 forwarding plane. This binary is thin: each subcommand
//! lives in its own file and calls into the library crates.

#![forbid(unsafe_code)]

// `fibre bench` and what only it needs (plots, the peers, the studies) are left out of a
// build without the `bench` feature (on by default).
#[cfg(feature = "bench")]
mod bench;
mod forward_capture;
mod lookup;
mod route;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "fibre",
    version,
    about = "Userspace IPv4/IPv6 forwarding plane: route lookups and their measurement"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Look up addresses in a route file: prints `ADDR PREFIX` (or `ADDR -`) per address.
    Lookup(lookup::Args),
    /// Measure fibre against the Linux kernel and a peer library (lookup cost against
    /// table size, threads, address kinds), or, with `lookup`, fibre's tables alone on a
    /// route file.
    #[cfg(feature = "bench")]
    Bench(Box<bench::BenchArgs>),
    /// Routing as Linux defines it, on a file of `ip` command lines: `route get` answers as
    /// `ip route get` does, `route show` lists as `ip route show` does.
    Route(route::RouteArgs),
    /// Policy rules of a configuration, as `ip rule show` lists them.
    Rule(route::ListArgs),
    /// Nexthop objects of a configuration, as `ip nexthop show` lists them.
    Nexthop(route::ListArgs),
    /// Links of a configuration, as `ip link show` lists them.
    Link(route::ListArgs),
    /// Addresses of a configuration, as `ip addr show` lists them.
    Addr(route::ListArgs),
    /// Mirror the kernel's routing state over rtnetlink (links, addresses, routes, rules,
    /// neighbours), in the foreground, answering `fibre ctl` on a control socket; with
    /// `--forward`, forward packets between links with it.
    Daemon(fibre_daemon::DaemonArgs),
    /// Forward one link's capture offline (pcap or pcapng in, pcapng out, a block per
    /// output link) through the packet path, printing each stage's cost and each fate.
    Forward(forward_capture::ForwardArgs),
    /// Ask a running `fibre daemon`: `route get ...`, `route show ...`, `rule show`,
    /// `nexthop show`, `link show`, `addr show`, `stats`.
    Ctl(fibre_daemon::CtlArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Lookup(args) => lookup::run(args),
        #[cfg(feature = "bench")]
        Command::Bench(args) => bench::run(*args),
        Command::Route(args) => route::run(args),
        Command::Rule(args) => route::rules(args),
        Command::Nexthop(args) => route::nexthops(args),
        Command::Link(args) => route::links(args),
        Command::Addr(args) => route::addrs(args),
        Command::Daemon(args) => fibre_daemon::run(args),
        Command::Ctl(args) => fibre_daemon::ctl(args),
        Command::Forward(args) => forward_capture::run(args),
    };
    match result {
        Ok(code) => code,
        // The reader of standard output went away (`fibre ... | head`): nothing to say.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("fibre: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Reads a route file, reporting skipped lines on stderr.
fn load_routes(
    path: &std::path::Path,
    skip_bad: bool,
) -> Result<fibre_routefile::RouteFile, Box<dyn std::error::Error>> {
    let file = fibre_routefile::read_route_file(path, skip_bad)?;
    if file.skipped > 0 {
        eprintln!(
            "fibre: skipped {} bad line(s) or record(s) of {}",
            file.skipped,
            path.display()
        );
        for e in &file.skipped_examples {
            eprintln!("  {e}");
        }
    }
    if let Some(e) = &file.broken {
        eprintln!("fibre: {e}");
    }
    Ok(file)
}

/// Reads several route files as one, in order.
fn load_all_routes(
    paths: &[std::path::PathBuf],
    skip_bad: bool,
) -> Result<fibre_routefile::RouteFile, Box<dyn std::error::Error>> {
    let mut all = fibre_routefile::RouteFile::default();
    for p in paths {
        let f = load_routes(p, skip_bad)?;
        all.v4.extend(f.v4);
        all.v6.extend(f.v6);
        all.skipped += f.skipped;
    }
    Ok(all)
}
