//! A neighbour table of fixed entries, for runs offline: `neigh add ADDR lladdr MAC dev
//! DEV` lines in a configuration file, as `ip neigh add` takes them. (The daemon's
//! pipeline reads the kernel's table, which `fibre-mirror` keeps.)

use crate::pipeline::Neighbours;
use fibre_fib::parse_mac;
use fibre_fib::LinkIndex;
use std::collections::HashMap;
use std::net::IpAddr;

/// Fixed neighbour entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StaticNeighbours {
    entries: HashMap<(LinkIndex, IpAddr), [u8; 6]>,
}

/// Whether a configuration line is a neighbour's.
fn is_neighbour(line: &str) -> bool {
    matches!(
        line.split_whitespace().next(),
        Some("neigh" | "neighbour" | "neighbor" | "n")
    )
}

impl StaticNeighbours {
    /// Splits a configuration text: the text without its neighbour lines (each left blank,
    /// so that the other lines keep their numbers), and the neighbour lines with their
    /// numbers (from 1), to parse once the links exist.
    pub fn split(text: &str) -> (String, Vec<(usize, String)>) {
        let mut rest = String::with_capacity(text.len());
        let mut lines = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if is_neighbour(line) {
                lines.push((i + 1, line.to_string()));
            } else {
                rest.push_str(line);
            }
            rest.push('\n');
        }
        (rest, lines)
    }

    /// The entries of neighbour `lines` (numbered), their links found by name with `link`;
    /// the first bad line's number and why.
    pub fn parse(
        lines: &[(usize, String)],
        link: impl Fn(&str) -> Option<LinkIndex>,
    ) -> Result<StaticNeighbours, (usize, String)> {
        let mut out = StaticNeighbours::default();
        for (n, line) in lines {
            let words: Vec<&str> = line.split_whitespace().collect();
            let e = |why: String| (*n, why);
            match words.get(1) {
                Some(&("add" | "replace" | "change")) => {}
                other => {
                    return Err(e(format!(
                        "neigh: {} (only add, replace, change)",
                        other.unwrap_or(&"nothing to do")
                    )))
                }
            }
            let addr: IpAddr = words
                .get(2)
                .and_then(|a| a.parse().ok())
                .ok_or_else(|| e("neigh: an address first".into()))?;
            let (mut mac, mut dev) = (None, None);
            let mut w = words[3..].iter();
            while let Some(word) = w.next() {
                match *word {
                    "lladdr" => {
                        let text = w.next().ok_or_else(|| e("lladdr: a MAC address".into()))?;
                        mac =
                            Some(parse_mac(text).ok_or_else(|| {
                                e(format!("lladdr: {text} is not a MAC address"))
                            })?);
                    }
                    "dev" => {
                        let name = w.next().ok_or_else(|| e("dev: a link".into()))?;
                        dev = Some(link(name).ok_or_else(|| e(format!("dev: no link {name}")))?);
                    }
                    "nud" => {
                        w.next();
                    }
                    "router" | "proxy" | "extern_learn" => {}
                    other => return Err(e(format!("neigh: unknown word {other}"))),
                }
            }
            let (Some(mac), Some(dev)) = (mac, dev) else {
                return Err(e("neigh: lladdr and dev are needed".into()));
            };
            out.entries.insert((dev, addr), mac);
        }
        Ok(out)
    }

    /// How many entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl Neighbours for StaticNeighbours {
    fn mac(&self, link: LinkIndex, addr: IpAddr) -> Option<[u8; 6]> {
        self.entries.get(&(link, addr)).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbour_lines_are_taken_out_and_read() {
        let text = "link add a0 type veth peer name a1\nneigh add 10.0.0.2 lladdr 02:00:00:00:00:02 dev a0 nud permanent\nroute add 10.1.0.0/16 via 10.0.0.2\n";
        let (rest, lines) = StaticNeighbours::split(text);
        assert_eq!(rest.lines().count(), 3, "line numbers kept");
        assert_eq!(rest.lines().nth(1), Some(""));
        assert_eq!(lines, vec![(2, lines[0].1.clone())]);
        let link = |name: &str| (name == "a0").then_some(4);
        let n = StaticNeighbours::parse(&lines, link).unwrap();
        assert_eq!(
            n.mac(4, "10.0.0.2".parse().unwrap()),
            Some([2, 0, 0, 0, 0, 2])
        );
        assert_eq!(n.mac(5, "10.0.0.2".parse().unwrap()), None);
        for (bad, why) in [
            (
                "neigh add 10.0.0.2 lladdr 02:00:00:00:00 dev a0",
                "not a MAC",
            ),
            (
                "neigh add 10.0.0.2 lladdr 02:00:00:00:00:02 dev b9",
                "no link",
            ),
            (
                "neigh add nonsense lladdr 02:00:00:00:00:02 dev a0",
                "an address",
            ),
            ("neigh add 10.0.0.2 dev a0", "lladdr and dev"),
            ("neigh del 10.0.0.2 dev a0", "only add"),
            (
                "neigh add 10.0.0.2 lladdr 02:00:00:00:00:02 dev a0 color blue",
                "unknown word",
            ),
        ] {
            let err = StaticNeighbours::parse(&[(7, bad.into())], link).unwrap_err();
            assert_eq!(err.0, 7);
            assert!(err.1.contains(why), "{bad}: {}", err.1);
        }
    }
}
