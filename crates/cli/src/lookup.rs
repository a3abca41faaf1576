//! `fibre lookup`: longest-prefix match of addresses against a route file.

use fibre_lpm::{Key, Prefix, Table};
use fibre_routefile::final_prefixes;
use std::io::{BufRead, BufWriter, Write};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `fibre lookup`.
#[derive(clap::Args)]
pub struct Args {
    /// Route file: one prefix per line, optional A/W column, `#` comments, gzip allowed.
    /// Repeat to add files (applied in order).
    #[arg(long, required = true)]
    routes: Vec<PathBuf>,
    /// Count and skip malformed route lines instead of stopping at the first.
    #[arg(long)]
    skip_bad: bool,
    /// Addresses to look up; without any, each line of standard input is one.
    addrs: Vec<String>,
}

/// A table of one family whose values index its sorted prefix list.
struct Routes<K: Key> {
    prefixes: Vec<Prefix<K>>,
    lpm: Table<K>,
}

impl<K: Key> Routes<K> {
    fn new(prefixes: Vec<Prefix<K>>) -> Self {
        let lpm = Table::<K>::build(prefixes.iter().enumerate().map(|(i, p)| (*p, i as u32)));
        Routes { prefixes, lpm }
    }

    fn answer(&self, addr: K) -> String {
        match self.lpm.lookup(addr) {
            Some(i) => self.prefixes[i as usize].to_string(),
            None => "-".to_string(),
        }
    }
}

pub fn run(args: Args) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let file = crate::load_all_routes(&args.routes, args.skip_bad)?;
    let v4 = Routes::new(final_prefixes(&file.v4));
    let v6 = Routes::new(final_prefixes(&file.v6));
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut bad = 0usize;
    let mut answer = |text: &str, place: &str, out: &mut dyn Write| -> std::io::Result<()> {
        match text.parse::<IpAddr>() {
            Ok(IpAddr::V4(a)) => writeln!(out, "{text} {}", v4.answer(a.into())),
            Ok(IpAddr::V6(a)) => writeln!(out, "{text} {}", v6.answer(a.into())),
            Err(_) => {
                bad += 1;
                eprintln!(
                    "fibre: {place}{} is not an IPv4 or IPv6 address",
                    fibre_lpm::quote(text)
                );
                Ok(())
            }
        }
    };
    if args.addrs.is_empty() {
        for (n, line) in std::io::stdin().lock().lines().enumerate() {
            let line = line.map_err(|e| format!("standard input, line {}: {e}", n + 1))?;
            let text = line.trim();
            if !text.is_empty() {
                answer(text, &format!("standard input, line {}: ", n + 1), &mut out)?;
            }
        }
    } else {
        for text in &args.addrs {
            answer(text.trim(), "", &mut out)?;
        }
    }
    out.flush()?;
    Ok(if bad > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
