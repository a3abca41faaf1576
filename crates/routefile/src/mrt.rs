//! MRT dumps (RFC 6396) decoded by `bgpkit-parser`: RIB entries and updates as routes, a
//! record that cannot be decoded skipped and counted, a stream that breaks off ending the
//! read with what came before kept.

use crate::{AnyPrefix, RouteOp, SourceError, EXAMPLES};
use fibre_lpm::Prefix;
use std::path::Path;

/// One route of an MRT file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MrtRoute {
    /// Announcement (RIB entry or update) or withdrawal.
    pub op: RouteOp,
    /// The prefix.
    pub prefix: AnyPrefix,
    /// The peer that sent or held it.
    pub peer: std::net::IpAddr,
    /// Its next hop, when it has one.
    pub next_hop: Option<std::net::IpAddr>,
}

/// What reading an MRT file gave.
#[derive(Clone, Debug, Default)]
pub struct MrtSummary {
    /// Routes read.
    pub routes: usize,
    /// Records skipped (unsupported or malformed, the stream intact around them).
    pub skipped: usize,
    /// The first few of them.
    pub skipped_examples: Vec<SourceError>,
    /// Where the file broke off, if it did.
    pub broken: Option<SourceError>,
}

/// Counts the bytes read through it.
struct Counting<R> {
    inner: R,
    count: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl<R: std::io::Read> std::io::Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(n)
    }
}

/// Reads MRT records from `reader` (already decompressed), passing every route to
/// `each`. A record that cannot be decoded while the stream around it is intact
/// (unsupported type, malformed attributes) is skipped and counted; a break of the stream
/// itself (truncation, read error) ends the read without losing what came before, and is
/// returned in the summary with the byte offset where reading stopped.
pub fn read_mrt(
    reader: impl std::io::Read,
    path: &Path,
    mut each: impl FnMut(MrtRoute),
) -> Result<MrtSummary, SourceError> {
    use bgpkit_parser::models::ElemType;
    let count = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counting = Counting {
        inner: reader,
        count: count.clone(),
    };
    let parser = bgpkit_parser::BgpkitParser::from_reader(counting);
    let mut summary = MrtSummary::default();
    for item in parser.into_fallible_elem_iter() {
        match item {
            Ok(elem) => {
                let (addr, len) = (elem.prefix.prefix.addr(), elem.prefix.prefix.prefix_len());
                let prefix = match addr {
                    std::net::IpAddr::V4(a) => AnyPrefix::V4(Prefix::new_clamped(a.into(), len)),
                    std::net::IpAddr::V6(a) => AnyPrefix::V6(Prefix::new_clamped(a.into(), len)),
                };
                let op = match elem.elem_type {
                    ElemType::ANNOUNCE => RouteOp::Announce,
                    ElemType::WITHDRAW => RouteOp::Withdraw,
                };
                each(MrtRoute {
                    op,
                    prefix,
                    peer: elem.peer_ip,
                    next_hop: elem.next_hop,
                });
                summary.routes += 1;
            }
            Err(e) => {
                use bgpkit_parser::ParserError as P;
                let at = count.load(std::sync::atomic::Ordering::Relaxed);
                let stream_broken = matches!(
                    e.error,
                    P::IoError(_)
                        | P::EofError(_)
                        | P::EofExpected
                        | P::TruncatedMsg(_)
                        | P::OversizedRecord { .. }
                );
                if stream_broken {
                    summary.broken = Some(SourceError {
                        path: path.to_path_buf(),
                        line: None,
                        reason: format!(
                            "MRT data breaks off near byte {at} after {} routes ({}); the routes before it are kept",
                            summary.routes, e.error
                        ),
                    });
                    break;
                }
                summary.skipped += 1;
                if summary.skipped_examples.len() < EXAMPLES {
                    summary.skipped_examples.push(SourceError {
                        path: path.to_path_buf(),
                        line: None,
                        reason: format!("MRT record near byte {at} skipped: {}", e.error),
                    });
                }
            }
        }
    }
    Ok(summary)
}
