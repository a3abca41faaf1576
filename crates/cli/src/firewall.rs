//! `fibre daemon`'s view of the router's firewall: the nftables ruleset mirrored over
//! nfnetlink (`fibre-firewall`), the parts of it fibre may not bypass
//! ([`fibre_firewall::gate`]) for the links it forwards, and the IP families those
//! close. The daemon closes them to its workers at start and after each committed
//! change, and says which rules and why; `fibre ctl ruleset show` lists what it holds.

use crate::route::{Done, Out};
use fibre_firewall::gate::{self, Families, Legacy, Refusal};
use fibre_firewall::kernel::{self, Dump};
use fibre_firewall::message::Message;
use fibre_firewall::{render, Ruleset};
use serde_json::{json, Value};

/// Refusals written to the log for each change, at most; `fibre ctl ruleset show`
/// lists them all.
const LOGGED: usize = 8;

/// The mirrored ruleset and what it closes.
pub struct Firewall {
    ruleset: Ruleset,
    /// The forwarded links, by name.
    links: Vec<String>,
    legacy: Legacy,
    refusals: Vec<Refusal>,
    closed: Families,
    /// Why the kernel has no nf_tables, if it has none.
    unavailable: Option<String>,
    /// Messages that could not be read, dropped.
    malformed: u64,
    /// Dumps taken again after the subscription overflowed.
    resyncs: u64,
    /// Committed batches applied.
    commits: u64,
}

impl Firewall {
    /// Dumps the ruleset, for forwarding between `links`.
    pub fn sync(links: &[String]) -> std::io::Result<Firewall> {
        let mut f = Firewall {
            ruleset: Ruleset::new(),
            links: links.to_vec(),
            legacy: Legacy::default(),
            refusals: Vec::new(),
            closed: Families::NONE,
            unavailable: None,
            malformed: 0,
            resyncs: 0,
            commits: 0,
        };
        f.take(kernel::dump()?);
        Ok(f)
    }

    /// Takes a dump in place of what it held.
    fn take(&mut self, d: Dump) {
        self.ruleset = d.ruleset;
        self.malformed += d.malformed;
        self.unavailable = d.unavailable;
        self.judge();
    }

    /// Dumps again, after the subscription lost messages.
    pub fn resync(&mut self) -> std::io::Result<()> {
        self.resyncs += 1;
        let d = kernel::dump()?;
        self.take(d);
        Ok(())
    }

    /// Applies notifications (and counts `bad` ones that could not be read); whether
    /// a commit ended among them (then the families closed may have changed).
    pub fn apply(&mut self, messages: Vec<(Message, u16)>, bad: u64) -> bool {
        self.malformed += bad;
        let mut committed = false;
        for (m, flags) in messages {
            committed |= matches!(m, Message::NewGen(_));
            self.ruleset.apply(m, flags);
        }
        if committed {
            self.commits += 1;
            self.judge();
        }
        committed
    }

    /// Reads the legacy tables again and finds what the ruleset closes.
    fn judge(&mut self) {
        self.legacy = kernel::legacy();
        self.refusals = gate::refusals(&self.ruleset, &self.links, &self.legacy);
        self.closed = gate::closed(&self.refusals);
    }

    /// The families closed to fibre: bit 0 IPv4, bit 1 IPv6.
    pub fn closed(&self) -> u8 {
        self.closed.bits()
    }

    /// The log's words for what is closed now: one line for the families, then the
    /// first refusals.
    pub fn report(&self) -> Vec<String> {
        if !self.closed.any() {
            return vec![format!(
                "the firewall closes nothing to fibre ({} tables, {} chains, {} rules)",
                self.ruleset.counts().0,
                self.ruleset.counts().1,
                self.ruleset.counts().2
            )];
        }
        let mut out = vec![format!(
            "refusing to forward {}: the router's firewall holds {} part(s) fibre does not \
             enforce yet and will not bypass; those packets are dropped (the kernel's \
             forwarding, with the firewall, is what forwards them: run without --forward)",
            self.closed.name(),
            self.refusals.len()
        )];
        for r in self.refusals.iter().take(LOGGED) {
            out.push(format!("  {}", r.describe()));
        }
        if self.refusals.len() > LOGGED {
            out.push(format!(
                "  ... and {} more (fibre ctl ruleset show)",
                self.refusals.len() - LOGGED
            ));
        }
        out
    }

    /// The firewall part of `fibre ctl stats`.
    pub fn stats(&self) -> Value {
        let (tables, chains, rules) = self.ruleset.counts();
        json!({
            "generation": self.ruleset.generation,
            "tables": tables, "chains": chains, "rules": rules,
            "closed": {"ipv4": self.closed.v4, "ipv6": self.closed.v6},
            "refusals": self.refusals.len(),
            "first_refusals": self.refusals.iter().take(16).map(Refusal::to_json)
                .collect::<Vec<_>>(),
            "legacy_tables": {"ipv4": self.legacy.v4, "ipv6": self.legacy.v6},
            "unavailable": self.unavailable,
            "commits": self.commits,
            "resyncs": self.resyncs,
            "malformed": self.malformed,
            "orphans": self.ruleset.orphans,
        })
    }

    /// The firewall metrics, in Prometheus' text exposition format.
    pub fn metrics(&self, out: &mut String) {
        use std::fmt::Write as _;
        let _ = writeln!(
            out,
            "# HELP fibre_firewall_closed Whether the router's firewall closes the family to fibre (1).\n# TYPE fibre_firewall_closed gauge"
        );
        for (family, closed) in [("ipv4", self.closed.v4), ("ipv6", self.closed.v6)] {
            let _ = writeln!(
                out,
                "fibre_firewall_closed{{family=\"{family}\"}} {}",
                u8::from(closed)
            );
        }
        for (name, kind, help, v) in [
            (
                "fibre_firewall_refusals",
                "gauge",
                "Parts of the ruleset fibre does not enforce and will not bypass.",
                self.refusals.len() as u64,
            ),
            (
                "fibre_firewall_rules",
                "gauge",
                "Rules of the mirrored ruleset.",
                self.ruleset.counts().2 as u64,
            ),
            (
                "fibre_firewall_commits_total",
                "counter",
                "Committed changes of the ruleset applied.",
                self.commits,
            ),
            (
                "fibre_firewall_resyncs_total",
                "counter",
                "Dumps of the ruleset taken again after the subscription overflowed.",
                self.resyncs,
            ),
            (
                "fibre_firewall_malformed_total",
                "counter",
                "nf_tables messages that could not be read, dropped.",
                self.malformed,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        }
    }

    /// `ruleset show [--json]`: the mirrored ruleset (shaped as `nft -j list ruleset`
    /// with `--json`), and what of it fibre refuses to bypass.
    pub fn show(&self, json: bool, o: &mut Out) -> Done {
        if json {
            let mut v = self.ruleset.to_json();
            v["refusals"] = self.refusals.iter().map(Refusal::to_json).collect();
            writeln!(o.out, "{v}")?;
            return Ok(0);
        }
        for t in self.ruleset.tables() {
            let family = t.table.family.name();
            let dormant = if t.table.dormant() { " (dormant)" } else { "" };
            writeln!(o.out, "table {family} {}{dormant}", t.table.name)?;
            for c in t.chains.values() {
                match &c.chain.hook {
                    Some(h) => writeln!(
                        o.out,
                        "  chain {} {{ type {} hook {} priority {}; policy {}; }}",
                        c.chain.name,
                        c.chain.kind.as_deref().unwrap_or("filter"),
                        render::hook_name(t.table.family, h.number),
                        h.priority,
                        if c.chain.policy == Some(0) {
                            "drop"
                        } else {
                            "accept"
                        }
                    )?,
                    None => writeln!(o.out, "  chain {}", c.chain.name)?,
                }
                for r in &c.rules {
                    writeln!(o.out, "    {} # handle {}", render::rule(r), r.handle)?;
                }
            }
        }
        for line in self.report() {
            writeln!(o.out, "{line}")?;
        }
        if self.refusals.len() > LOGGED {
            for r in &self.refusals[LOGGED..] {
                writeln!(o.out, "  {}", r.describe())?;
            }
        }
        Ok(0)
    }
}
