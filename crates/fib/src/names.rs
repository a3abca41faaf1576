//! The names `ip` gives to numbers: tables, protocols, scopes, route types, rule actions.
//!
//! These are iproute2's defaults (`/etc/iproute2/rt_tables`, `rt_protos`, `rt_scopes`);
//! a number without a name is printed and accepted as the number.

/// Table `local` (255): local and broadcast routes.
pub const TABLE_LOCAL: u32 = 255;
/// Table `main` (254): what `ip route` shows.
pub const TABLE_MAIN: u32 = 254;
/// Table `default` (253).
pub const TABLE_DEFAULT: u32 = 253;

/// Scope `global` (universe): reaches beyond this host.
pub const SCOPE_UNIVERSE: u8 = 0;
/// Scope `site`.
pub const SCOPE_SITE: u8 = 200;
/// Scope `link`: on a directly attached link.
pub const SCOPE_LINK: u8 = 253;
/// Scope `host`: this host only.
pub const SCOPE_HOST: u8 = 254;
/// Scope `nowhere`.
pub const SCOPE_NOWHERE: u8 = 255;

/// Protocol `unspec`: what `ip nexthop add` sets unless told otherwise.
pub const PROTO_UNSPEC: u8 = 0;
/// Protocol `kernel`: routes the kernel derives from addresses.
pub const PROTO_KERNEL: u8 = 2;
/// Protocol `boot`: what `ip route add` sets unless told otherwise.
pub const PROTO_BOOT: u8 = 3;
/// Protocol `static`.
pub const PROTO_STATIC: u8 = 4;

const TABLES: &[(u32, &str)] = &[
    (TABLE_LOCAL, "local"),
    (TABLE_MAIN, "main"),
    (TABLE_DEFAULT, "default"),
];

const PROTOCOLS: &[(u8, &str)] = &[
    (PROTO_UNSPEC, "unspec"),
    (1, "redirect"),
    (PROTO_KERNEL, "kernel"),
    (PROTO_BOOT, "boot"),
    (PROTO_STATIC, "static"),
    (8, "gated"),
    (9, "ra"),
    (10, "mrt"),
    (11, "zebra"),
    (12, "bird"),
    (13, "dnrouted"),
    (14, "xorp"),
    (15, "ntk"),
    (16, "dhcp"),
    (17, "mrouted"),
    (18, "keepalived"),
    (42, "babel"),
    (99, "openr"),
    (186, "bgp"),
    (187, "isis"),
    (188, "ospf"),
    (189, "rip"),
    (192, "eigrp"),
];

const SCOPES: &[(u8, &str)] = &[
    (SCOPE_UNIVERSE, "global"),
    (SCOPE_SITE, "site"),
    (SCOPE_LINK, "link"),
    (SCOPE_HOST, "host"),
    (SCOPE_NOWHERE, "nowhere"),
];

/// A table's name, or its number.
pub fn table_name(id: u32) -> String {
    TABLES
        .iter()
        .find(|t| t.0 == id)
        .map_or_else(|| id.to_string(), |t| t.1.to_string())
}

/// A table id from a name or a number (`0` is refused: it means "unspecified").
pub fn parse_table(text: &str) -> Option<u32> {
    TABLES
        .iter()
        .find(|t| t.1 == text)
        .map(|t| t.0)
        .or_else(|| parse_u32(text).filter(|&id| id != 0))
}

/// A protocol's name, or its number.
pub fn protocol_name(id: u8) -> String {
    PROTOCOLS
        .iter()
        .find(|p| p.0 == id)
        .map_or_else(|| id.to_string(), |p| p.1.to_string())
}

/// A protocol from a name or a number.
pub fn parse_protocol(text: &str) -> Option<u8> {
    PROTOCOLS
        .iter()
        .find(|p| p.1 == text)
        .map(|p| p.0)
        .or_else(|| parse_u32(text).and_then(|n| u8::try_from(n).ok()))
}

/// A scope's name, or its number.
pub fn scope_name(id: u8) -> String {
    SCOPES
        .iter()
        .find(|s| s.0 == id)
        .map_or_else(|| id.to_string(), |s| s.1.to_string())
}

/// A scope from a name or a number.
pub fn parse_scope(text: &str) -> Option<u8> {
    SCOPES
        .iter()
        .find(|s| s.1 == text)
        .map(|s| s.0)
        .or_else(|| parse_u32(text).and_then(|n| u8::try_from(n).ok()))
}

/// An unsigned number as `ip` reads it: decimal, or hexadecimal after `0x`.
pub fn parse_u32(text: &str) -> Option<u32> {
    if let Some(hex) = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        u32::from_str_radix(hex, 16).ok()
    } else if text.len() > 1 && text.starts_with('0') {
        u32::from_str_radix(&text[1..], 8).ok()
    } else {
        text.parse().ok()
    }
}

/// An IP protocol number from a name (`tcp`, `udp`, `icmp`, ...) or a number.
pub fn parse_ipproto(text: &str) -> Option<u8> {
    let named = match text {
        "icmp" => Some(1),
        "igmp" => Some(2),
        "tcp" => Some(6),
        "udp" => Some(17),
        "ipv6-icmp" | "icmpv6" | "ipv6_icmp" => Some(58),
        "gre" => Some(47),
        "esp" => Some(50),
        "ah" => Some(51),
        "sctp" => Some(132),
        "udplite" => Some(136),
        _ => None,
    };
    named.or_else(|| parse_u32(text).and_then(|n| u8::try_from(n).ok()))
}

/// An IP protocol's name as `ip rule` prints it, or its number.
pub fn ipproto_name(p: u8) -> String {
    match p {
        1 => "icmp".into(),
        2 => "igmp".into(),
        6 => "tcp".into(),
        17 => "udp".into(),
        47 => "gre".into(),
        50 => "esp".into(),
        51 => "ah".into(),
        58 => "ipv6-icmp".into(),
        132 => "sctp".into(),
        136 => "udplite".into(),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers_round_trip() {
        assert_eq!(parse_table("main"), Some(254));
        assert_eq!(parse_table("100"), Some(100));
        assert_eq!(parse_table("0"), None);
        assert_eq!(parse_table("4294967295"), Some(u32::MAX));
        assert_eq!(table_name(255), "local");
        assert_eq!(table_name(7), "7");
        assert_eq!(parse_protocol("bgp"), Some(186));
        assert_eq!(protocol_name(2), "kernel");
        assert_eq!(parse_scope("link"), Some(253));
        assert_eq!(parse_u32("0x10"), Some(16));
        assert_eq!(parse_ipproto("tcp"), Some(6));
        assert_eq!(parse_ipproto("300"), None);
    }
}
