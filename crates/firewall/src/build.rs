//! Rulesets made in memory, expression by expression, as `nft` would compile them and the
//! kernel would announce them: for the benchmarks, which measure the filter without a
//! kernel to load rules into, and for the tests. The expressions are encoded as the
//! kernel's netlink attributes, so what reads them is what reads the kernel's.

use crate::message::{Chain, Expression, Family, Hook, Message, Rule, Table};
use crate::ruleset::Ruleset;

/// A netlink attribute: its length, type, value and padding.
pub fn attribute(kind: u16, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity((4 + value.len()).next_multiple_of(4));
    out.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(value);
    out.resize(out.len().next_multiple_of(4), 0);
    out
}

/// A nested attribute.
fn nested(kind: u16, value: &[u8]) -> Vec<u8> {
    attribute(kind | 0x8000, value)
}

fn be(v: u32) -> Vec<u8> {
    v.to_be_bytes().to_vec()
}

fn expression(name: &str, attributes: Vec<Vec<u8>>) -> Expression {
    Expression {
        name: name.into(),
        data: attributes.concat(),
    }
}

/// `payload load LEN @ BASE + OFFSET => DREG` (base 1 network, 2 transport).
pub fn payload(base: u32, offset: u32, len: u32, dreg: u32) -> Expression {
    expression(
        "payload",
        vec![
            attribute(1, &be(dreg)),
            attribute(2, &be(base)),
            attribute(3, &be(offset)),
            attribute(4, &be(len)),
        ],
    )
}

/// `meta load KEY => DREG`.
pub fn meta(key: u32, dreg: u32) -> Expression {
    expression(
        "meta",
        vec![attribute(1, &be(dreg)), attribute(2, &be(key))],
    )
}

/// `ct load KEY => DREG`, of the connection's direction `dir` (0 original, 1 reply)
/// where the key is a tuple's.
pub fn ct(key: u32, dreg: u32, dir: Option<u8>) -> Expression {
    let mut attributes = vec![attribute(1, &be(dreg)), attribute(2, &be(key))];
    if let Some(d) = dir {
        attributes.push(attribute(3, &[d]));
    }
    expression("ct", attributes)
}

/// `cmp OP SREG DATA` (op 0 eq, 1 neq, 2 lt, 3 lte, 4 gt, 5 gte).
pub fn cmp(op: u32, sreg: u32, data: &[u8]) -> Expression {
    expression(
        "cmp",
        vec![
            attribute(1, &be(sreg)),
            attribute(2, &be(op)),
            nested(3, &attribute(1, data)),
        ],
    )
}

/// `immediate reg 0` of a verdict: its code (0 drop, 1 accept, -1 continue, -3 jump,
/// -4 goto, -5 return) and a jump's chain.
pub fn verdict(code: i32, chain: Option<&str>) -> Expression {
    let mut v = attribute(1, &code.to_be_bytes());
    if let Some(c) = chain {
        v.extend(attribute(2, format!("{c}\0").as_bytes()));
    }
    expression(
        "immediate",
        vec![attribute(1, &be(0)), nested(2, &nested(2, &v))],
    )
}

/// A `reject` of type `kind` (0 ICMP, 1 TCP reset, 2 `icmpx`) with `code`.
pub fn reject(kind: u32, code: u8) -> Expression {
    expression(
        "reject",
        vec![attribute(1, &be(kind)), attribute(2, &[code])],
    )
}

/// A `counter`.
pub fn counter() -> Expression {
    expression("counter", vec![])
}

/// `masq`: masquerade, with no ports or flags.
pub fn masquerade() -> Expression {
    expression("masq", vec![])
}

/// A chain to make: its name, its hook's number and its policy (0 drop, 1 accept) if it
/// is a base chain of type filter at priority 0, and its rules' expressions.
pub struct ChainSpec {
    /// Its name.
    pub name: String,
    /// Its hook and policy, if a base chain.
    pub hook: Option<(u32, u32)>,
    /// Whether the base chain is of type `nat` (at NAT's priority for its hook:
    /// -100 at prerouting, 100 at postrouting), not `filter` (at 0).
    pub nat: bool,
    /// Its rules.
    pub rules: Vec<Vec<Expression>>,
}

/// A ruleset of one table of `family` named `table` with `chains`, applied as the
/// kernel's messages would have it made (rule handles from 1 on, in order).
pub fn ruleset(family: Family, table: &str, chains: Vec<ChainSpec>) -> Ruleset {
    let mut r = Ruleset::new();
    r.apply(
        Message::NewTable(Table {
            family,
            name: table.into(),
            flags: 0,
            handle: 1,
        }),
        0,
    );
    let mut handle = 1;
    for c in chains {
        r.apply(
            Message::NewChain(Chain {
                family,
                table: table.into(),
                name: c.name.clone(),
                handle,
                hook: c.hook.map(|(number, _)| Hook {
                    number,
                    priority: match (c.nat, number) {
                        (true, 0) => -100,
                        (true, _) => 100,
                        _ => 0,
                    },
                    devices: vec![],
                }),
                policy: c.hook.map(|(_, p)| p),
                kind: c.hook.map(|_| if c.nat { "nat" } else { "filter" }.into()),
            }),
            0,
        );
        handle += 1;
        for expressions in c.rules {
            r.apply(
                Message::NewRule(Rule {
                    family,
                    table: table.into(),
                    chain: c.name.clone(),
                    handle,
                    position: None,
                    expressions,
                    comment: None,
                }),
                crate::message::NLM_F_APPEND,
            );
            handle += 1;
        }
    }
    r
}
