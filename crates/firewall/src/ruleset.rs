//! The mirrored ruleset: tables, their chains, each chain's rules in the kernel's order,
//! and the generation last committed. Applied message by message, as a dump and the
//! notifications of each committed batch give them; a batch is whole once its
//! generation message (`NFT_MSG_NEWGEN`) has come.

use crate::message::{Chain, Family, Flowtable, Message, Object, Rule, Set, Table, NLM_F_APPEND};
use crate::render;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// A chain and its rules, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainEntry {
    /// The chain.
    pub chain: Chain,
    /// Its rules, in the order the kernel evaluates them.
    pub rules: Vec<Rule>,
}

/// A table and its chains, by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableEntry {
    /// The table.
    pub table: Table,
    /// Its chains.
    pub chains: BTreeMap<String, ChainEntry>,
    /// Its sets and maps.
    pub sets: BTreeMap<String, Set>,
    /// Its stateful objects.
    pub objects: BTreeMap<String, Object>,
    /// Its flowtables.
    pub flowtables: BTreeMap<String, Flowtable>,
}

/// The ruleset as the kernel announced it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ruleset {
    tables: BTreeMap<(Family, String), TableEntry>,
    /// The generation last committed, once known.
    pub generation: Option<u32>,
    /// Messages that named a table or chain the ruleset does not hold (dropped).
    pub orphans: u64,
}

impl Ruleset {
    /// An empty ruleset.
    pub fn new() -> Ruleset {
        Ruleset::default()
    }

    /// Applies one message, with its header's flags.
    pub fn apply(&mut self, message: Message, flags: u16) {
        match message {
            Message::NewTable(table) => {
                let key = (table.family, table.name.clone());
                match self.tables.get_mut(&key) {
                    Some(entry) => entry.table = table,
                    None => {
                        self.tables.insert(
                            key,
                            TableEntry {
                                table,
                                chains: BTreeMap::new(),
                                sets: BTreeMap::new(),
                                objects: BTreeMap::new(),
                                flowtables: BTreeMap::new(),
                            },
                        );
                    }
                }
            }
            Message::DelTable(family, name) => {
                self.tables.remove(&(family, name));
            }
            Message::NewChain(chain) => {
                let Some(table) = self.tables.get_mut(&(chain.family, chain.table.clone())) else {
                    self.orphans += 1;
                    return;
                };
                // A chain renamed keeps its handle and its rules.
                let renamed = table
                    .chains
                    .iter()
                    .find(|(name, c)| c.chain.handle == chain.handle && **name != chain.name)
                    .map(|(name, _)| name.clone());
                if let Some(old) = renamed {
                    if let Some(mut entry) = table.chains.remove(&old) {
                        for r in &mut entry.rules {
                            r.chain = chain.name.clone();
                        }
                        table.chains.insert(chain.name.clone(), entry);
                    }
                }
                match table.chains.get_mut(&chain.name) {
                    Some(entry) => {
                        // An update names the devices it adds to the hook, not those the
                        // hook keeps.
                        let mut chain = chain;
                        if let (Some(old), Some(new)) = (&entry.chain.hook, &mut chain.hook) {
                            merge(&mut new.devices, &old.devices);
                        }
                        entry.chain = chain;
                    }
                    None => {
                        table.chains.insert(
                            chain.name.clone(),
                            ChainEntry {
                                chain,
                                rules: Vec::new(),
                            },
                        );
                    }
                }
            }
            Message::DelChain(family, table, name, devices) => {
                let Some(t) = self.tables.get_mut(&(family, table)) else {
                    return;
                };
                let hooked = t.chains.get_mut(&name).and_then(|c| c.chain.hook.as_mut());
                if !hooked.is_some_and(|h| take_off(&mut h.devices, &devices)) {
                    t.chains.remove(&name);
                }
            }
            Message::NewSet(mut set) => {
                if let Some(t) = self.table(set.family, &set.table) {
                    // An update keeps the elements.
                    if let Some(old) = t.sets.remove(&set.name) {
                        set.elements = old.elements;
                    }
                    t.sets.insert(set.name.clone(), set);
                }
            }
            Message::NewElements(family, table, set, elements) => {
                let Some(s) = self
                    .tables
                    .get_mut(&(family, table))
                    .and_then(|t| t.sets.get_mut(&set))
                else {
                    self.orphans += 1;
                    return;
                };
                for e in elements {
                    match s.elements.iter_mut().find(|x| x.same(&e)) {
                        Some(same) => *same = e,
                        None => s.elements.push(e),
                    }
                }
            }
            Message::DelElements(family, table, set, elements) => {
                if let Some(s) = self
                    .tables
                    .get_mut(&(family, table))
                    .and_then(|t| t.sets.get_mut(&set))
                {
                    s.elements.retain(|x| !elements.iter().any(|e| e.same(x)));
                }
            }
            Message::DelSet(family, table, name) => {
                if let Some(t) = self.tables.get_mut(&(family, table)) {
                    t.sets.remove(&name);
                }
            }
            Message::NewObject(object) => {
                if let Some(t) = self.table(object.family, &object.table) {
                    t.objects.insert(object.name.clone(), object);
                }
            }
            Message::DelObject(family, table, name) => {
                if let Some(t) = self.tables.get_mut(&(family, table)) {
                    t.objects.remove(&name);
                }
            }
            Message::NewFlowtable(mut f) => {
                if let Some(t) = self.table(f.family, &f.table) {
                    if let Some(old) = t.flowtables.get(&f.name) {
                        merge(&mut f.devices, &old.devices);
                    }
                    t.flowtables.insert(f.name.clone(), f);
                }
            }
            Message::DelFlowtable(family, table, name, devices) => {
                let Some(t) = self.tables.get_mut(&(family, table)) else {
                    return;
                };
                let held = t.flowtables.get_mut(&name);
                if !held.is_some_and(|f| take_off(&mut f.devices, &devices)) {
                    t.flowtables.remove(&name);
                }
            }
            Message::NewRule(rule) => {
                let Some(chain) = self
                    .tables
                    .get_mut(&(rule.family, rule.table.clone()))
                    .and_then(|t| t.chains.get_mut(&rule.chain))
                else {
                    self.orphans += 1;
                    return;
                };
                let rules = &mut chain.rules;
                if let Some(same) = rules.iter_mut().find(|r| r.handle == rule.handle) {
                    *same = rule;
                    return;
                }
                // After the rule the kernel names; at the end if appended (or if the
                // rule named is unknown); else first.
                let at = match rule.position {
                    Some(p) => rules
                        .iter()
                        .position(|r| r.handle == p)
                        .map_or(rules.len(), |i| i + 1),
                    None if flags & NLM_F_APPEND != 0 => rules.len(),
                    None => 0,
                };
                rules.insert(at, rule);
            }
            Message::DelRule(family, table, chain, handle) => {
                if let Some(c) = self
                    .tables
                    .get_mut(&(family, table))
                    .and_then(|t| t.chains.get_mut(&chain))
                {
                    c.rules.retain(|r| r.handle != handle);
                }
            }
            Message::NewGen(id) => self.generation = Some(id),
            Message::Other(_) => {}
        }
    }

    /// The table of `family` named `name`, counting it an orphan if there is none.
    fn table(&mut self, family: Family, name: &str) -> Option<&mut TableEntry> {
        let t = self.tables.get_mut(&(family, name.to_string()));
        if t.is_none() {
            self.orphans += 1;
        }
        t
    }

    /// The tables, by family and name.
    pub fn tables(&self) -> impl Iterator<Item = &TableEntry> {
        self.tables.values()
    }

    /// How many tables, chains and rules it holds.
    pub fn counts(&self) -> (usize, usize, usize) {
        let chains = self.tables.values().map(|t| t.chains.len()).sum();
        let rules = self
            .tables
            .values()
            .flat_map(|t| t.chains.values())
            .map(|c| c.rules.len())
            .sum();
        (self.tables.len(), chains, rules)
    }

    /// The ruleset shaped as `nft -j list ruleset` shapes it: a list of tables, chains
    /// and rules, each rule's expressions named and rendered.
    pub fn to_json(&self) -> Value {
        let mut out = vec![json!({"metainfo": {"generation": self.generation}})];
        for t in self.tables.values() {
            let family = t.table.family.name();
            out.push(json!({"table": {
                "family": family, "name": t.table.name, "handle": t.table.handle,
                "flags": if t.table.dormant() { vec!["dormant"] } else { vec![] },
            }}));
            for c in t.chains.values() {
                let mut chain = json!({
                    "family": family, "table": t.table.name, "name": c.chain.name,
                    "handle": c.chain.handle,
                });
                if let Some(h) = &c.chain.hook {
                    chain["type"] = json!(c.chain.kind);
                    chain["hook"] = json!(render::hook_name(t.table.family, h.number));
                    chain["prio"] = json!(h.priority);
                    chain["policy"] = json!(match c.chain.policy {
                        Some(0) => "drop",
                        _ => "accept",
                    });
                    if !h.devices.is_empty() {
                        let mut devices = h.devices.clone();
                        devices.sort();
                        chain["dev"] = json!(devices);
                    }
                }
                out.push(json!({ "chain": chain }));
            }
            for set in t.sets.values() {
                out.push(json!({"set": {
                    "family": family, "table": t.table.name, "name": set.name,
                    "expr": set.expressions.iter().map(|e| &e.name).collect::<Vec<_>>(),
                }}));
            }
            for o in t.objects.values() {
                out.push(json!({"object": {
                    "family": family, "table": t.table.name, "name": o.name, "type": o.kind,
                }}));
            }
            for f in t.flowtables.values() {
                let mut devices = f.devices.clone();
                devices.sort();
                out.push(json!({"flowtable": {
                    "family": family, "table": t.table.name, "name": f.name, "dev": devices,
                }}));
            }
            for c in t.chains.values() {
                for r in &c.rules {
                    out.push(json!({"rule": {
                        "family": family, "table": t.table.name, "chain": c.chain.name,
                        "handle": r.handle, "comment": r.comment,
                        "expr": r.expressions.iter().map(|e| json!({
                            "name": e.name, "text": render::expression(e),
                        })).collect::<Vec<_>>(),
                    }}));
                }
            }
        }
        json!({ "nftables": out })
    }
}

/// Takes the devices `removed` names off `devices`, if it names some and others stay;
/// whether the hook (or flowtable) stays. A removal naming no device, or all of them,
/// removes the whole.
fn take_off(devices: &mut Vec<String>, removed: &[String]) -> bool {
    if removed.is_empty() || devices.iter().all(|d| removed.contains(d)) {
        return false;
    }
    devices.retain(|d| !removed.contains(d));
    true
}

/// Adds to `devices` those of `old` it does not name.
fn merge(devices: &mut Vec<String>, old: &[String]) {
    for d in old {
        if !devices.contains(d) {
            devices.push(d.clone());
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::message::tests::*;
    use crate::message::{read, Read, NEWTABLE};

    /// Applies a whole message's bytes to `r`.
    pub(crate) fn apply(r: &mut Ruleset, bytes: &[u8]) {
        let Ok(Read::Message(m, flags)) = read(bytes) else {
            panic!("{:?}", read(bytes));
        };
        r.apply(m, flags);
    }

    /// A table of `family` named `name` with `flags` (1: dormant).
    pub(crate) fn table(family: u8, name: &str, flags: u32) -> Vec<u8> {
        let mut attrs = nla(1, format!("{name}\0").as_bytes());
        attrs.extend(nla(2, &flags.to_be_bytes()));
        attrs.extend(nla(4, &1u64.to_be_bytes()));
        message(NEWTABLE, family, 0, &attrs)
    }

    fn handles(r: &Ruleset) -> Vec<u64> {
        r.tables()
            .flat_map(|t| t.chains.values())
            .flat_map(|c| c.rules.iter().map(|r| r.handle))
            .collect()
    }

    #[test]
    fn rules_keep_the_kernels_order() {
        let mut r = Ruleset::new();
        apply(&mut r, &table(1, "fw", 0));
        apply(&mut r, &base_chain(1, "fw", "fwd", 2, 1));
        apply(&mut r, &rule(1, "fw", "fwd", 4, &["counter"]));
        // Appended: at the end.
        let mut appended = rule(1, "fw", "fwd", 5, &["counter"]);
        appended[6..8].copy_from_slice(&NLM_F_APPEND.to_ne_bytes());
        apply(&mut r, &appended);
        // Inserted first: no position, not appended.
        apply(&mut r, &rule(1, "fw", "fwd", 6, &["counter"]));
        // After rule 6: a position attribute.
        let mut after = rule(1, "fw", "fwd", 7, &["counter"]);
        let position = nla(6, &6u64.to_be_bytes());
        after.extend(position);
        let len = after.len() as u32;
        after[..4].copy_from_slice(&len.to_ne_bytes());
        apply(&mut r, &after);
        assert_eq!(handles(&r), [6, 7, 4, 5]);
        // Replaced in place, then removed.
        apply(&mut r, &rule(1, "fw", "fwd", 7, &["counter", "log"]));
        assert_eq!(handles(&r), [6, 7, 4, 5]);
        r.apply(
            Message::DelRule(Family::Inet, "fw".into(), "fwd".into(), 4),
            0,
        );
        assert_eq!(handles(&r), [6, 7, 5]);
        assert_eq!(r.counts(), (1, 1, 3));
        // A rule of a chain never announced is counted and dropped.
        apply(&mut r, &rule(1, "fw", "nowhere", 9, &["counter"]));
        assert_eq!(r.orphans, 1);
        r.apply(Message::DelTable(Family::Inet, "fw".into()), 0);
        assert_eq!(r.counts(), (0, 0, 0));
    }
}
