//! Route files read into prefixes: prefix lists, update streams, `ip -batch` files and MRT
//! dumps, plain or compressed. `fibre lookup` and the benchmarks read their routes here.
//!
//! Text: one prefix per line, IPv4 and IPv6 mixed freely. An optional first column says
//! what the line does: `A` announces (adds or replaces) the prefix, `W` withdraws it; a
//! line without it announces. `#` starts a comment; blank lines are ignored. Lines of an
//! `ip -batch` file (`route add PREFIX via ...`, `route del PREFIX`) are read too.
//!
//! MRT (RFC 6396, decoded by `bgpkit-parser`, with the `mrt` feature, on by default): a
//! TABLE_DUMP / TABLE_DUMP_V2 RIB gives one announcement per RIB entry; BGP4MP update
//! files give announcements and withdrawals in order. A file that breaks off (truncated,
//! or a malformed record) keeps everything read before the break, and says where it
//! broke. Built without the feature, an MRT file is refused with that reason.
//!
//! gzip and bzip2 are recognised by their magic bytes, whatever the file's name; MRT is
//! told from text by its record header.
//!
//! A bad line is reported as `FILE:LINE: reason`. By default it stops the read; with
//! `skip_bad` it is counted, remembered (the first few) and skipped.

use fibre_lpm::{quote, Ipv4Prefix, Ipv6Prefix, Key, Prefix};
use flate2::read::MultiGzDecoder;
use std::collections::BTreeSet;
use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

/// What a line does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteOp {
    /// Add the prefix, or replace it.
    Announce,
    /// Remove the prefix.
    Withdraw,
}

/// A prefix of either family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AnyPrefix {
    /// IPv4.
    V4(Ipv4Prefix),
    /// IPv6.
    V6(Ipv6Prefix),
}

impl fmt::Display for AnyPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AnyPrefix::V4(p) => p.fmt(f),
            AnyPrefix::V6(p) => p.fmt(f),
        }
    }
}

impl std::str::FromStr for AnyPrefix {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let addr = s.split('/').next().unwrap_or("");
        if addr.contains(':') {
            s.parse().map(AnyPrefix::V6).map_err(|e| e.to_string())
        } else if addr.contains('.') {
            s.parse().map(AnyPrefix::V4).map_err(|e| e.to_string())
        } else {
            Err(format!("{} is not an IPv4 or IPv6 prefix", quote(s)))
        }
    }
}

/// A read failure: which file, which line (if any), and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceError {
    /// The file.
    pub path: PathBuf,
    /// The 1-based line number, if the problem is in one line.
    pub line: Option<usize>,
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(n) => write!(f, "{}:{}: {}", self.path.display(), n, self.reason),
            None => write!(f, "{}: {}", self.path.display(), self.reason),
        }
    }
}

impl std::error::Error for SourceError {}

/// The lines of a route file, split by family, in file order.
#[derive(Clone, Debug, Default)]
pub struct RouteFile {
    /// IPv4 lines.
    pub v4: Vec<(RouteOp, Ipv4Prefix)>,
    /// IPv6 lines.
    pub v6: Vec<(RouteOp, Ipv6Prefix)>,
    /// Bad lines skipped (only with `skip_bad`).
    pub skipped: usize,
    /// The first few of them.
    pub skipped_examples: Vec<SourceError>,
    /// Where an MRT file broke off, if it did (the routes before it are kept).
    pub broken: Option<SourceError>,
}

/// How many skipped lines are kept as examples.
const EXAMPLES: usize = 5;

#[cfg(feature = "mrt")]
mod mrt;
#[cfg(feature = "mrt")]
pub use mrt::{read_mrt, MrtRoute, MrtSummary};

/// A reader that decompresses gzip or bzip2 if the stream starts with their magic bytes.
pub fn open_maybe_gz(path: &Path) -> Result<Box<dyn BufRead + Send>, SourceError> {
    let err = |reason: String| SourceError {
        path: path.to_path_buf(),
        line: None,
        reason,
    };
    let file = File::open(path).map_err(|e| err(format!("cannot open: {e}")))?;
    let mut reader = BufReader::with_capacity(1 << 16, file);
    let magic = reader
        .fill_buf()
        .map_err(|e| err(format!("cannot read: {e}")))?;
    if magic.starts_with(&[0x1f, 0x8b]) {
        Ok(Box::new(BufReader::with_capacity(
            1 << 16,
            MultiGzDecoder::new(reader),
        )))
    } else if magic.starts_with(b"BZh") {
        Ok(Box::new(BufReader::with_capacity(
            1 << 16,
            bzip2::read::MultiBzDecoder::new(reader),
        )))
    } else {
        Ok(Box::new(reader))
    }
}

/// Parses one line: `None` for blank and comment lines.
pub fn parse_line(line: &str) -> Result<Option<(RouteOp, AnyPrefix)>, String> {
    let line = line.split('#').next().unwrap_or("").trim();
    if line.is_empty() {
        return Ok(None);
    }
    let mut fields = line.split_whitespace();
    let first = fields.next().unwrap_or("");
    if matches!(first, "route" | "ip" | "-4" | "-6") {
        return parse_ip_batch_line(line);
    }
    let (op, prefix) = match first {
        "A" | "a" => (RouteOp::Announce, fields.next()),
        "W" | "w" => (RouteOp::Withdraw, fields.next()),
        _ => {
            if fields.clone().next().is_some() {
                return Err(format!(
                    "unknown operation {} (expected A or W)",
                    quote(first)
                ));
            }
            (RouteOp::Announce, Some(first))
        }
    };
    let prefix = prefix.ok_or_else(|| format!("{} is not followed by a prefix", quote(first)))?;
    if let Some(extra) = fields.next() {
        return Err(format!("unexpected {} after the prefix", quote(extra)));
    }
    prefix.parse().map(|p| Some((op, p)))
}

/// Parses an `ip -batch` line: `[ip] [-4|-6] route add|replace|append|change|prepend
/// [TYPE] PREFIX ...` announces, `route del|delete [TYPE] PREFIX ...` withdraws; the
/// rest of the line (via, dev, metric...) is not needed for the prefix.
fn parse_ip_batch_line(line: &str) -> Result<Option<(RouteOp, AnyPrefix)>, String> {
    let mut v6 = false;
    let mut words = line.split_whitespace().peekable();
    while let Some(&w) = words.peek() {
        match w {
            "ip" | "-4" => {}
            "-6" => v6 = true,
            _ => break,
        }
        words.next();
    }
    if !matches!(words.next(), Some("route" | "r" | "ro" | "rou")) {
        return Err("an ip -batch line must be a route command".into());
    }
    let op = match words.next() {
        Some("add" | "replace" | "append" | "change" | "prepend") => RouteOp::Announce,
        Some("del" | "delete") => RouteOp::Withdraw,
        Some(v) => {
            return Err(format!(
                "route {} is not add, replace, append, change, prepend or del",
                quote(v)
            ))
        }
        None => return Err("\"route\" is not followed by a command".into()),
    };
    let mut words = words.skip_while(|w| {
        matches!(
            *w,
            "unicast"
                | "local"
                | "broadcast"
                | "multicast"
                | "throw"
                | "unreachable"
                | "prohibit"
                | "blackhole"
                | "nat"
                | "to"
        )
    });
    let prefix = match words.next() {
        Some("default") if v6 => "::/0",
        Some("default") => "0.0.0.0/0",
        Some(p) => p,
        None => return Err("the route command has no prefix".into()),
    };
    prefix.parse().map(|p| Some((op, p)))
}

/// True if `head` starts like an MRT record: a known type in bytes 4-5 (text never has
/// a NUL byte there).
fn looks_like_mrt(head: &[u8]) -> bool {
    head.len() >= 12
        && head[4] == 0
        && matches!(head[5], 11 | 12 | 13 | 16 | 17 | 32 | 33 | 48 | 49)
}

/// Reads a route file: text, `ip -batch` or MRT (see the module documentation).
pub fn read_route_file(path: &Path, skip_bad: bool) -> Result<RouteFile, SourceError> {
    let mut reader = open_maybe_gz(path)?;
    let head = reader.fill_buf().map_err(|e| SourceError {
        path: path.to_path_buf(),
        line: None,
        reason: format!("cannot read: {e}"),
    })?;
    if looks_like_mrt(head) {
        return read_mrt_file(reader, path);
    }
    read_routes(reader, path, skip_bad)
}

/// An MRT file's routes.
#[cfg(feature = "mrt")]
fn read_mrt_file(reader: impl BufRead, path: &Path) -> Result<RouteFile, SourceError> {
    let mut out = RouteFile::default();
    let summary = read_mrt(reader, path, |e| match e.prefix {
        AnyPrefix::V4(p) => out.v4.push((e.op, p)),
        AnyPrefix::V6(p) => out.v6.push((e.op, p)),
    })?;
    out.broken = summary.broken;
    out.skipped = summary.skipped;
    out.skipped_examples = summary.skipped_examples;
    Ok(out)
}

/// An MRT file, refused: this build does not read MRT.
#[cfg(not(feature = "mrt"))]
fn read_mrt_file(_reader: impl BufRead, path: &Path) -> Result<RouteFile, SourceError> {
    Err(SourceError {
        path: path.to_path_buf(),
        line: None,
        reason: "an MRT dump, which this build does not read (built without the `mrt` \
                 feature)"
            .to_string(),
    })
}

/// Reads route lines from any reader; `path` names it in errors.
pub fn read_routes(
    mut reader: impl BufRead,
    path: &Path,
    skip_bad: bool,
) -> Result<RouteFile, SourceError> {
    let mut out = RouteFile::default();
    let mut buf = Vec::new();
    let mut number = 0;
    loop {
        buf.clear();
        let n = reader
            .read_until(b'\n', &mut buf)
            .map_err(|e| SourceError {
                path: path.to_path_buf(),
                line: None,
                reason: format!("read failed after line {number}: {e}"),
            })?;
        if n == 0 {
            return Ok(out);
        }
        number += 1;
        let parsed = std::str::from_utf8(&buf)
            .map_err(|_| "line is not valid UTF-8".to_string())
            .and_then(parse_line);
        match parsed {
            Ok(None) => {}
            Ok(Some((op, AnyPrefix::V4(p)))) => out.v4.push((op, p)),
            Ok(Some((op, AnyPrefix::V6(p)))) => out.v6.push((op, p)),
            Err(reason) => {
                let e = SourceError {
                    path: path.to_path_buf(),
                    line: Some(number),
                    reason,
                };
                if !skip_bad {
                    return Err(e);
                }
                out.skipped += 1;
                if out.skipped_examples.len() < EXAMPLES {
                    out.skipped_examples.push(e);
                }
            }
        }
    }
}

/// The prefixes present after applying `lines` in order to an empty table, sorted.
pub fn final_prefixes<K: Key>(lines: &[(RouteOp, Prefix<K>)]) -> Vec<Prefix<K>> {
    let mut set = BTreeSet::new();
    for &(op, p) in lines {
        match op {
            RouteOp::Announce => set.insert(p),
            RouteOp::Withdraw => set.remove(&p),
        };
    }
    set.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn read(text: &str, skip: bool) -> Result<RouteFile, SourceError> {
        read_routes(Cursor::new(text.as_bytes()), Path::new("t.txt"), skip)
    }

    #[test]
    fn reads_mixed_families_ops_and_comments() {
        let f = read(
            "# a comment\n10.0.0.0/8\nA 2001:db8::/32  # inline\n\nW 10.0.0.0/8\n  192.0.2.1\n",
            false,
        )
        .unwrap();
        assert_eq!(f.v4.len(), 3);
        assert_eq!(f.v6.len(), 1);
        assert_eq!(f.v4[1].0, RouteOp::Withdraw);
        assert_eq!(f.v4[2].1.to_string(), "192.0.2.1/32");
        assert_eq!(final_prefixes(&f.v4).len(), 1);
    }

    #[test]
    fn a_bad_line_names_file_line_and_reason() {
        let e = read("10.0.0.0/8\n10.0.0.0/40\n", false).unwrap_err();
        assert_eq!(e.to_string(), "t.txt:2: prefix length 40 is longer than 32");
        let e = read("1.2.3.4/8\nX 1.0.0.0/8\n", false).unwrap_err();
        assert_eq!(e.line, Some(2));
        assert_eq!(e.reason, "unknown operation \"X\" (expected A or W)");
        let e = read("A\n", false).unwrap_err();
        assert!(e.to_string().contains("not followed by a prefix"), "{e}");
        let e = read("A 1.0.0.0/8 extra\n", false).unwrap_err();
        assert!(e.to_string().contains("unexpected \"extra\""), "{e}");
        let e = read_routes(
            Cursor::new(b"1.0.0.0/8\n\xff\xfe\n".to_vec()),
            Path::new("t"),
            false,
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "t:2: line is not valid UTF-8");
    }

    #[test]
    fn ip_batch_lines_are_route_sources() {
        let f = read(
            "route add 10.0.0.0/8 via 192.0.2.1 dev eth0\n-6 route replace 2001:db8::/32 dev eth0 metric 5\n\
             route add blackhole 198.51.100.0/24\nroute del 10.0.0.0/8\n-6 route add default via fe80::1 dev eth0\n",
            false,
        )
        .unwrap();
        assert_eq!(f.v4.len(), 3);
        assert_eq!(f.v4[2], (RouteOp::Withdraw, "10.0.0.0/8".parse().unwrap()));
        assert_eq!(f.v6[1].1.to_string(), "::/0");
        let e = read("route flush 10.0.0.0/8\n", false).unwrap_err();
        assert!(e.reason.contains("\"flush\" is not add"), "{e}");
    }

    #[test]
    fn skip_bad_counts_and_keeps_the_good_lines() {
        let f = read("1.0.0.0/8\nbogus\n2.0.0.0/8\n::/200\n", true).unwrap();
        assert_eq!(f.v4.len(), 2);
        assert_eq!(f.skipped, 2);
        assert_eq!(f.skipped_examples[1].line, Some(4));
    }

    #[test]
    fn gzip_is_detected_by_content_and_truncation_is_reported() {
        use flate2::write::GzEncoder;
        use std::io::Write;
        let dir = std::env::temp_dir().join(format!("fibre-src-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut enc = GzEncoder::new(Vec::new(), flate2::Compression::default());
        for i in 0..2000 {
            writeln!(enc, "10.{}.{}.0/24", i / 256, i % 256).unwrap();
        }
        let gz = enc.finish().unwrap();
        let whole = dir.join("routes.txt"); // no .gz suffix: found by its magic bytes
        std::fs::write(&whole, &gz).unwrap();
        assert_eq!(read_route_file(&whole, false).unwrap().v4.len(), 2000);
        let cut = dir.join("cut.gz");
        std::fs::write(&cut, &gz[..gz.len() / 2]).unwrap();
        let e = read_route_file(&cut, false).unwrap_err();
        assert!(e.reason.starts_with("read failed after line"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
