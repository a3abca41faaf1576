//! `fibre daemon`'s view of the router's firewall: the nftables ruleset mirrored over
//! nfnetlink (`fibre-firewall`), the parts of it fibre may not bypass
//! ([`fibre_firewall::gate`]) for the links it forwards, and what those close. The
//! firewall's own threads close it to the workers as soon as a commit is applied (the
//! receiver of the nf_tables group) or an iptables-legacy table appears (a watcher that
//! reads `/proc/net` each second: legacy tables announce nothing), without waiting for
//! the daemon's loop; then the loop hands a closed family to the kernel where the
//! kernel forwards it (the XDP programs pass it), and gives the express path its
//! generation back once nothing is closed. Each change is logged with the rules and why; `fibre ctl
//! ruleset show` lists what the daemon holds.

use crate::commands::{Done, Out};
use crate::metrics::{label, Exposition, Kind};
use fibre_dataplane::worker::Shared;
use fibre_firewall::gate::{self, Families, Legacy, Refusal};
use fibre_firewall::message::Message;
use fibre_firewall::nfnetlink::{self, Batch, Dump};
use fibre_firewall::{render, Filter, Ruleset};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex, MutexGuard};

/// Refusals written to the log for each change, at most; `fibre ctl ruleset show`
/// lists them all.
const LOGGED: usize = 8;

/// Everything closed: both families and their errors.
const ALL: u8 = 0b1111;

/// The mirrored ruleset and what it closes.
pub struct Firewall {
    ruleset: Ruleset,
    /// The forwarded links, by name.
    links: Vec<String>,
    legacy: Legacy,
    refusals: Vec<Refusal>,
    /// The filter rules fibre evaluates, compiled.
    filter: Arc<Filter>,
    /// What is closed ([`Shared::closed`]'s bits).
    closed: u8,
    /// The families whose connections the kernel tracks, and fibre with it (bit 0
    /// IPv4, bit 1 IPv6).
    tracked: u8,
    /// Why everything is closed whatever the ruleset says: it cannot be seen.
    blind: Option<String>,
    /// The workers' shared state, once they run: closed through it.
    shared: Option<Arc<Shared>>,
    /// What was last logged: the bits and the refusals' count.
    logged: Option<(u8, usize)>,
    /// Why the kernel has no nf_tables, if it has none.
    unavailable: Option<String>,
    /// Messages that could not be read, dropped (each has the ruleset dumped again).
    malformed: u64,
    /// Dumps taken again (an overflow, a malformed or orphaned message, a link
    /// renamed).
    resyncs: u64,
    /// Committed batches applied.
    commits: u64,
}

/// The families of bits 0 (IPv4) and 1 (IPv6).
fn bits(b: u8) -> Families {
    Families {
        v4: b & 1 != 0,
        v6: b & 2 != 0,
    }
}

/// The firewall, shared by the daemon's loop and the firewall's threads.
pub type SharedFirewall = Arc<Mutex<Firewall>>;

/// Locks the firewall; a thread that failed while it held it left it whole (each change
/// is), so a poisoned lock is taken all the same.
pub fn lock(f: &SharedFirewall) -> MutexGuard<'_, Firewall> {
    f.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Firewall {
    /// Dumps the ruleset, for forwarding between `links`.
    pub fn sync(links: &[String]) -> std::io::Result<Firewall> {
        let mut f = Firewall {
            ruleset: Ruleset::new(),
            links: links.to_vec(),
            legacy: nfnetlink::legacy(),
            refusals: Vec::new(),
            filter: Arc::default(),
            closed: 0,
            tracked: 0,
            blind: None,
            shared: None,
            logged: None,
            unavailable: None,
            malformed: 0,
            resyncs: 0,
            commits: 0,
        };
        f.take(nfnetlink::dump()?);
        Ok(f)
    }

    /// Takes a dump in place of what it held.
    fn take(&mut self, d: Dump) {
        self.ruleset = d.ruleset;
        self.malformed += d.malformed;
        self.unavailable = d.unavailable;
        self.blind = None;
        self.judge();
    }

    /// Closes what it closes through `shared` from now on (the workers started with
    /// it closed already).
    pub fn attach(&mut self, shared: Arc<Shared>) {
        self.shared = Some(shared);
        // Judged again: whether the workers can claim translated frames is known now.
        self.judge();
    }

    /// Dumps again; if the dump fails, everything closes. Whether what is closed
    /// changed.
    pub fn resync(&mut self, why: &str) -> bool {
        self.resyncs += 1;
        let before = self.closed;
        match nfnetlink::dump() {
            Ok(d) => self.take(d),
            Err(e) => self.blind(format!("the ruleset's dump after {why} failed: {e}")),
        }
        before != self.closed
    }

    /// Closes everything: the ruleset cannot be seen any more, for `why`.
    pub fn blind(&mut self, why: String) {
        self.blind = Some(why);
        self.judge();
    }

    /// Applies a batch of notifications; whether what is closed changed. A message that
    /// cannot be read, or names a table or chain not held, has the ruleset dumped
    /// again: the mirror never guesses.
    pub fn receive(&mut self, batch: Batch) -> bool {
        let messages = match batch {
            Batch::Overflow => return self.resync("an overflow"),
            Batch::Messages(m, bad) if bad > 0 => {
                self.malformed += bad;
                drop(m);
                return self.resync("a malformed message");
            }
            Batch::Messages(m, _) => m,
        };
        let orphans = self.ruleset.orphans;
        let mut committed = false;
        for (m, flags) in messages {
            committed |= matches!(m, Message::NewGen(_));
            self.ruleset.apply(m, flags);
        }
        if self.ruleset.orphans != orphans {
            return self.resync("a message naming what the ruleset does not hold");
        }
        if !committed {
            return false;
        }
        self.commits += 1;
        let before = self.closed;
        self.judge();
        before != self.closed
    }

    /// Reads the iptables-legacy tables again; whether what is closed changed.
    pub fn watch_legacy(&mut self) -> bool {
        let now = nfnetlink::legacy();
        if now == self.legacy {
            return false;
        }
        self.legacy = now;
        let before = self.closed;
        self.judge();
        before != self.closed
    }

    /// Finds what the ruleset closes, closes it to the workers, and logs what changed.
    fn judge(&mut self) {
        self.refusals = gate::refusals(&self.ruleset, &self.links, &self.legacy);
        self.filter = Arc::new(Filter::of(&self.ruleset));
        self.tracked = gate::tracked(&self.ruleset).bits();
        if let Some(refusal) = self.unclaimable() {
            self.refusals.push(refusal);
        }
        self.switch_claims();
        // Closed to the express path, which neither filters nor tracks: what is filtered
        // or tracked.
        let filtered = u8::from(self.filter.holds(false))
            | u8::from(self.filter.holds(true)) << 1
            | self.tracked;
        self.closed = match &self.blind {
            Some(_) => ALL,
            None => {
                gate::closed(&self.refusals).bits()
                    | gate::quiet(&self.refusals).bits() << 2
                    | filtered << 4
            }
        };
        if let Some(shared) = &self.shared {
            if let Err(e) = shared.enforce(self.filter.clone(), self.tracked, self.closed) {
                tracing::warn!("the express path's generation: {e}");
            }
        }
        let now = (self.closed, self.refusals.len());
        // Said only where it matters: when forwarding.
        if self.logged != Some(now) && !self.links.is_empty() {
            self.logged = Some(now);
            for line in self.report() {
                tracing::info!("{line}");
            }
        }
    }

    /// Where the workers cannot keep the frames of translated connections from the
    /// kernel's stack (`fibre_dataplane::claims`: the traffic-control program could not
    /// be attached), the families the ruleset translates, refused.
    fn unclaimable(&self) -> Option<Refusal> {
        let shared = self.shared.as_ref()?;
        let claims = shared
            .claims
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some();
        let families = Families {
            v4: self.filter.translates(false),
            v6: self.filter.translates(true),
        };
        (!claims && families.any()).then(|| Refusal {
            families,
            errors_only: false,
            family: "nat".into(),
            table: "of every family".into(),
            chain: None,
            handle: None,
            rule: "the ruleset's nat chains".into(),
            why: "the traffic-control program that keeps the replies of translated \
                  connections from the kernel's stack could not be attached (`fibre ctl \
                  stats`: forwarding.claims.unavailable)"
                .into(),
        })
    }

    /// Turns the program that claims translated frames from the kernel's stack on while
    /// the ruleset translates a family, off (one lookup a frame) while it does not.
    fn switch_claims(&self) {
        let Some(shared) = &self.shared else { return };
        let on = self.filter.translates(false) || self.filter.translates(true);
        let claims = shared
            .claims
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(c) = &*claims {
            if let Err(e) = c.switch(on) {
                tracing::warn!("the claims program's switch: {e}");
            }
        }
    }

    /// What to close to workers that start before they are given the filter rules
    /// ([`Firewall::attach`]): what is closed, and the families the rules hold.
    pub fn closed_until_attached(&self) -> u8 {
        self.closed | (self.closed >> 4 & 3)
    }

    /// The families closed to forwarding, and those whose ICMP errors are.
    fn families(&self) -> (Families, Families) {
        (bits(self.closed), bits(self.closed >> 2))
    }

    /// The families fibre puts through the filter stage (filter rules, or tracking).
    fn filtered(&self) -> Families {
        bits(self.closed >> 4)
    }

    /// The families whose connections fibre tracks.
    fn tracked(&self) -> Families {
        bits(self.tracked)
    }

    /// The log's words for what is closed now: a line for the families, then the first
    /// refusals.
    pub fn report(&self) -> Vec<String> {
        let (tables, chains, rules) = self.ruleset.counts();
        if let Some(why) = &self.blind {
            return vec![format!(
                "refusing to forward IPv4 and IPv6: the router's firewall cannot be seen ({why})"
            )];
        }
        let (closed, quiet) = self.families();
        let mut out = Vec::new();
        if closed.any() {
            out.push(format!(
                "refusing to forward {}: the router's firewall holds {} part(s) fibre does \
                 not enforce yet and will not bypass; those packets are dropped (the \
                 kernel's forwarding, with the firewall, is what forwards them: run without \
                 --forward)",
                closed.name(),
                self.refusals.len()
            ));
        } else if quiet.any() {
            out.push(format!(
                "sending no ICMP errors of {}: the router's output or postrouting hook \
                 holds rules fibre does not put its errors through yet",
                quiet.name()
            ));
        } else {
            out.push(format!(
                "the firewall closes nothing to fibre ({tables} tables, {chains} chains, \
                 {rules} rules)"
            ));
        }
        let filtered = self.filtered();
        if filtered.any() {
            out.push(format!(
                "putting {} through the router's filter rules (prerouting, forward, \
                 postrouting), as the kernel would",
                filtered.name()
            ));
        }
        let tracked = self.tracked();
        if tracked.any() {
            out.push(format!(
                "tracking the connections of {} as the kernel's conntrack would (the \
                 ruleset has it track them); their fragments go to the kernel, which \
                 reassembles them",
                tracked.name()
            ));
        }
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
        let (closed, quiet) = self.families();
        json!({
            "generation": self.ruleset.generation,
            "tables": tables, "chains": chains, "rules": rules,
            "closed": {"ipv4": closed.v4, "ipv6": closed.v6},
            "errors_closed": {"ipv4": quiet.v4, "ipv6": quiet.v6},
            "filtered": {"ipv4": self.filtered().v4, "ipv6": self.filtered().v6},
            "tracked": {"ipv4": self.tracked().v4, "ipv6": self.tracked().v6},
            "blind": self.blind,
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

    /// The firewall metrics, added to `e`.
    pub fn metrics(&self, e: &mut Exposition) {
        let (closed, _) = self.families();
        for (name, help, families) in [
            (
                "fibre_firewall_closed",
                "Whether the router's firewall closes the family to fibre (1).",
                closed,
            ),
            (
                "fibre_firewall_filtered",
                "Whether fibre puts the family through the router's filter rules (1).",
                self.filtered(),
            ),
        ] {
            e.add(
                name,
                Kind::Gauge,
                help,
                [("ipv4", families.v4), ("ipv6", families.v6)]
                    .map(|(family, on)| (label("family", family), f64::from(u8::from(on)))),
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
                "Dumps of the ruleset taken again (an overflow, a malformed or orphaned message, a link renamed).",
                self.resyncs,
            ),
            (
                "fibre_firewall_malformed_total",
                "counter",
                "nf_tables messages that could not be read, dropped.",
                self.malformed,
            ),
        ] {
            let kind = if kind == "counter" {
                Kind::Counter
            } else {
                Kind::Gauge
            };
            e.one(name, kind, help, v as f64);
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
