//! Rules as text for an operator: a rule's expressions as the kernel holds them, each in
//! brackets, in the words `nft --debug=netlink` uses for the common ones (`[ payload
//! load 4b @ network header + 16 => reg 1 ]`, `[ cmp eq reg 1 0x0a020002 ]`, `[
//! immediate reg 0 drop ]`), data as bytes in the packet's order; other expressions by
//! their name. With the rule's family, table, chain and handle, enough to find it in
//! `nft -a list ruleset`.

use crate::message::{be32, string, Attributes, Expression, Family, Rule};

/// A hook's name in its family.
pub fn hook_name(family: Family, number: u32) -> String {
    match (family, number) {
        (Family::Netdev, 0) => "ingress".into(),
        (Family::Netdev, 1) => "egress".into(),
        (_, 0) => "prerouting".into(),
        (_, 1) => "input".into(),
        (_, 2) => "forward".into(),
        (_, 3) => "output".into(),
        (_, 4) => "postrouting".into(),
        (_, 5) => "ingress".into(),
        (_, n) => format!("hook {n}"),
    }
}

/// A rule's expressions, each in brackets, and its comment.
pub fn rule(r: &Rule) -> String {
    let mut out: Vec<String> = r.expressions.iter().map(expression).collect();
    if let Some(c) = &r.comment {
        out.push(format!("comment \"{c}\""));
    }
    out.join(" ")
}

/// One expression in brackets.
pub fn expression(e: &Expression) -> String {
    let a = Attributes::read(&e.data).ok();
    let body = a.as_ref().and_then(|a| known(&e.name, a));
    match body {
        Some(b) => format!("[ {} {b} ]", e.name),
        None => format!("[ {} ]", e.name),
    }
}

/// The words for the expressions `nft --debug=netlink` prints most.
fn known(name: &str, a: &Attributes) -> Option<String> {
    let u = |k| a.u32(k).ok().flatten();
    Some(match name {
        "payload" => {
            let base = match u(2)? {
                0 => "link",
                1 => "network",
                2 => "transport",
                _ => "inner",
            };
            format!(
                "load {}b @ {base} header + {} => reg {}",
                u(4)?,
                u(3)?,
                u(1)?
            )
        }
        "cmp" => {
            let op = ["eq", "neq", "lt", "lte", "gt", "gte"]
                .get(u(2)? as usize)
                .copied()?;
            format!("{op} reg {} {}", u(1)?, data(a.get(3)?)?)
        }
        "immediate" => format!("reg {} {}", u(1)?, data(a.get(2)?)?),
        "meta" => {
            const KEYS: [&str; 25] = [
                "len",
                "protocol",
                "priority",
                "mark",
                "iif",
                "oif",
                "iifname",
                "oifname",
                "iiftype",
                "oiftype",
                "skuid",
                "skgid",
                "nftrace",
                "rtclassid",
                "secmark",
                "nfproto",
                "l4proto",
                "bri_iifname",
                "bri_oifname",
                "pkttype",
                "cpu",
                "iifgroup",
                "oifgroup",
                "cgroup",
                "prandom",
            ];
            let key = KEYS.get(u(2)? as usize).copied().unwrap_or("key");
            match (u(1), u(3)) {
                (Some(d), _) => format!("load {key} => reg {d}"),
                (_, Some(s)) => format!("set {key} with reg {s}"),
                _ => key.to_string(),
            }
        }
        "lookup" => format!(
            "reg {} set {}",
            u(2)?,
            a.string(1).ok().flatten().unwrap_or_default()
        ),
        _ => return None,
    })
}

/// `NFTA_DATA_VALUE` (1) as hex bytes, or `NFTA_DATA_VERDICT` (2) as its word.
fn data(nested: &[u8]) -> Option<String> {
    let a = Attributes::read(nested).ok()?;
    if let Some(v) = a.get(1) {
        let hex: String = v.iter().map(|b| format!("{b:02x}")).collect();
        return Some(format!("0x{hex}"));
    }
    let v = Attributes::read(a.get(2)?).ok()?;
    let code = be32(v.get(1)?).ok()? as i32;
    let chain = v.get(2).and_then(|c| string(c).ok()).unwrap_or_default();
    Some(match code {
        0 => "drop".into(),
        1 => "accept".into(),
        2 => "stolen".into(),
        3 => "queue".into(),
        -1 => "continue".into(),
        -2 => "break".into(),
        -3 => format!("jump {chain}"),
        -4 => format!("goto {chain}"),
        -5 => "return".into(),
        c => format!("verdict {c}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::tests::nla;

    #[test]
    fn common_expressions_read_as_nft_debug_prints_them() {
        let mut p = nla(1, &1u32.to_be_bytes());
        p.extend(nla(2, &1u32.to_be_bytes()));
        p.extend(nla(3, &16u32.to_be_bytes()));
        p.extend(nla(4, &4u32.to_be_bytes()));
        let payload = Expression {
            name: "payload".into(),
            data: p,
        };
        assert_eq!(
            expression(&payload),
            "[ payload load 4b @ network header + 16 => reg 1 ]"
        );
        let mut c = nla(1, &1u32.to_be_bytes());
        c.extend(nla(2, &0u32.to_be_bytes()));
        c.extend(nla(3 | 0x8000, &nla(1, &[10, 2, 0, 2])));
        let cmp = Expression {
            name: "cmp".into(),
            data: c,
        };
        assert_eq!(expression(&cmp), "[ cmp eq reg 1 0x0a020002 ]");
        let verdict = nla(2 | 0x8000, &nla(1, &0u32.to_be_bytes()));
        let mut i = nla(1, &0u32.to_be_bytes());
        i.extend(nla(2 | 0x8000, &verdict));
        let drop = Expression {
            name: "immediate".into(),
            data: i,
        };
        assert_eq!(expression(&drop), "[ immediate reg 0 drop ]");
        let other = Expression {
            name: "masq".into(),
            data: vec![1, 2, 3],
        };
        assert_eq!(expression(&other), "[ masq ]");
    }
}
