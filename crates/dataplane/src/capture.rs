//! Captures in and out, for runs of the pipeline offline: Ethernet frames read from a
//! pcap or pcapng file, and the frames sent written to a pcapng file, each on an
//! interface block named after its output link, as a capture on each link would show.

use crate::pipeline::Fate;
use fibre_fib::{LinkIndex, NoRoute};
use pcap_file::pcap::PcapReader;
use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::{Block, PcapNgReader, PcapNgWriter};
use pcap_file::DataLink;
use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

/// A captured frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// When it was captured (since the epoch).
    pub timestamp: Duration,
    /// The frame, from its Ethernet header.
    pub data: Vec<u8>,
    /// The interface it was captured on: its position in [`Capture::interfaces`] (0 in a
    /// pcap file, which has one).
    pub interface: usize,
}

/// The frames of a capture, and where it broke off if it did.
#[derive(Debug, Default)]
pub struct Capture {
    /// The Ethernet frames, in order.
    pub frames: Vec<Frame>,
    /// The names of the capture's interfaces, when it says them (pcapng `if_name`).
    pub interfaces: Vec<Option<String>>,
    /// Frames of other link types, left out.
    pub skipped: usize,
    /// Why the capture stops before its end (a truncated file): the frames before are
    /// kept.
    pub broken: Option<String>,
}

/// Reads a pcap or pcapng capture (told apart by their first bytes). An unreadable header
/// is an error; a capture that breaks off later keeps the frames before and says where.
pub fn read_capture(bytes: &[u8]) -> Result<Capture, String> {
    let mut out = Capture::default();
    // The pcapng section header block's type.
    if bytes.starts_with(&[0x0a, 0x0d, 0x0d, 0x0a]) {
        let mut reader = PcapNgReader::new(bytes).map_err(|e| format!("pcapng: {e}"))?;
        loop {
            // The block borrows the reader: what is kept of it is taken out first.
            let packet = match reader.next_block() {
                None => break,
                Some(Ok(Block::EnhancedPacket(p))) => {
                    Some((p.interface_id, p.timestamp, p.data.into_owned()))
                }
                Some(Ok(Block::InterfaceDescription(i))) => {
                    out.interfaces.push(i.options.iter().find_map(|o| match o {
                        InterfaceDescriptionOption::IfName(n) => Some(n.to_string()),
                        _ => None,
                    }));
                    None
                }
                Some(Ok(_)) => None,
                Some(Err(e)) => {
                    out.broken = Some(format!(
                        "pcapng: after {} frames: {e}",
                        out.frames.len() + out.skipped
                    ));
                    break;
                }
            };
            if let Some((interface, timestamp, data)) = packet {
                let ethernet = reader
                    .interfaces()
                    .get(interface as usize)
                    .is_some_and(|i| i.linktype == DataLink::ETHERNET);
                if ethernet {
                    out.frames.push(Frame {
                        timestamp,
                        data,
                        interface: interface as usize,
                    });
                } else {
                    out.skipped += 1;
                }
            }
        }
    } else {
        let mut reader = PcapReader::new(bytes).map_err(|e| format!("pcap: {e}"))?;
        // A pcap file is of one interface, which it does not name.
        out.interfaces.push(None);
        let ethernet = reader.header().datalink == DataLink::ETHERNET;
        while let Some(packet) = reader.next_packet() {
            match packet {
                Ok(p) if ethernet => out.frames.push(Frame {
                    timestamp: p.timestamp,
                    data: p.data.into_owned(),
                    interface: 0,
                }),
                Ok(_) => out.skipped += 1,
                Err(e) => {
                    out.broken = Some(format!(
                        "pcap: after {} frames: {e}",
                        out.frames.len() + out.skipped
                    ));
                    break;
                }
            }
        }
    }
    Ok(out)
}

/// A pcapng file of the frames sent, each on an interface block of its output link
/// (made at the link's first frame).
pub struct SentCapture<W: Write> {
    writer: PcapNgWriter<W>,
    interfaces: HashMap<LinkIndex, u32>,
}

impl<W: Write> SentCapture<W> {
    /// A capture written to `out`.
    pub fn new(out: W) -> Result<SentCapture<W>, String> {
        Ok(SentCapture {
            writer: PcapNgWriter::new(out).map_err(|e| format!("pcapng: {e}"))?,
            interfaces: HashMap::new(),
        })
    }

    /// Writes `frame`, sent out of link `link` named `name`, captured at `timestamp`.
    pub fn write(
        &mut self,
        link: LinkIndex,
        name: &str,
        timestamp: Duration,
        frame: &[u8],
    ) -> Result<(), String> {
        let id = match self.interfaces.get(&link) {
            Some(&id) => id,
            None => {
                let block = InterfaceDescriptionBlock {
                    linktype: DataLink::ETHERNET,
                    snaplen: 0,
                    options: vec![InterfaceDescriptionOption::IfName(Cow::Owned(
                        name.to_string(),
                    ))],
                };
                self.writer
                    .write_pcapng_block(block)
                    .map_err(|e| format!("pcapng: {e}"))?;
                let id = self.interfaces.len() as u32;
                self.interfaces.insert(link, id);
                id
            }
        };
        let packet = EnhancedPacketBlock {
            interface_id: id,
            timestamp,
            original_len: frame.len() as u32,
            data: Cow::Borrowed(frame),
            options: vec![],
        };
        self.writer
            .write_pcapng_block(packet)
            .map_err(|e| format!("pcapng: {e}"))?;
        Ok(())
    }

    /// The writer, flushed.
    pub fn finish(self) -> Result<W, String> {
        let mut w = self.writer.into_inner();
        w.flush().map_err(|e| e.to_string())?;
        Ok(w)
    }
}

/// A fate's name in counters: `sent`, `kernel:REASON`, `drop:REASON`.
pub fn fate_name(fate: &Fate) -> String {
    use crate::pipeline::{Dropped, Handed};
    use fibre_conntrack::Untrackable;
    match fate {
        Fate::Out(_) => "sent".into(),
        Fate::Fragmented(_) => "sent:fragmented".into(),
        Fate::Icmp(e, _) => format!("icmp:{}", e.name()),
        Fate::Reset(_) => "tcp-reset".into(),
        // (Counted again with its fate at the worker it went to.)
        Fate::Handoff(_) => "handoff".into(),
        Fate::Kernel(Handed::Input(k)) => format!("kernel:{}", k.name()),
        Fate::Kernel(Handed::Local) => "kernel:local".into(),
        Fate::Kernel(Handed::Unresolved) => "kernel:unresolved".into(),
        Fate::Kernel(Handed::Untrackable(Untrackable::Fragment)) => "kernel:reassembly".into(),
        Fate::Kernel(Handed::Untrackable(Untrackable::Protocol(p))) => {
            format!("kernel:untracked-protocol-{p}")
        }
        Fate::Drop(Dropped::Input(d)) => format!("drop:{}", d.name()),
        Fate::Drop(Dropped::NoRoute(e)) => format!(
            "drop:{}",
            match e {
                NoRoute::NetworkUnreachable => "no-route",
                NoRoute::HostUnreachable => "unreachable",
                NoRoute::Prohibited => "prohibited",
                NoRoute::Invalid => "blackhole-or-invalid",
                NoRoute::NetworkDown => "link-down",
                NoRoute::NoDevice => "no-device",
            }
        ),
        Fate::Drop(Dropped::TtlExpired) => "drop:ttl-expired".into(),
        Fate::Drop(Dropped::TooBig) => "drop:too-big".into(),
        Fate::Drop(Dropped::NoBufferToFragment) => "drop:no-buffer-to-fragment".into(),
        Fate::Drop(Dropped::SegmentsOverMtu) => "drop:segments-over-mtu".into(),
        Fate::Drop(Dropped::SourceScope) => "drop:source-scope".into(),
        Fate::Drop(Dropped::NoLink) => "drop:no-link".into(),
        Fate::Drop(Dropped::Filtered) => "drop:filtered".into(),
        Fate::Drop(Dropped::ConntrackFull) => "drop:conntrack-full".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};

    fn frames() -> Vec<Frame> {
        (0..5u8)
            .map(|i| Frame {
                timestamp: Duration::from_millis(1000 + i as u64),
                data: vec![i; 60 + i as usize],
                interface: 0,
            })
            .collect()
    }

    /// Frames written to pcap and to pcapng are read back alike; a cut file keeps the
    /// frames before the cut and says it broke.
    #[test]
    fn captures_round_trip_and_keep_what_comes_before_a_cut() {
        let mut pcap = PcapWriter::with_header(
            Vec::new(),
            PcapHeader {
                datalink: DataLink::ETHERNET,
                ..PcapHeader::default()
            },
        )
        .unwrap();
        for f in frames() {
            pcap.write_packet(&PcapPacket::new(f.timestamp, f.data.len() as u32, &f.data))
                .unwrap();
        }
        let pcap = pcap.into_writer();
        let mut ng = SentCapture::new(Vec::new()).unwrap();
        for (i, f) in frames().iter().enumerate() {
            ng.write(
                2 + (i % 2) as u32,
                &format!("l{}", i % 2),
                f.timestamp,
                &f.data,
            )
            .unwrap();
        }
        let ng = ng.finish().unwrap();
        for (bytes, on) in [(&pcap, [0, 0, 0, 0, 0]), (&ng, [0, 1, 0, 1, 0])] {
            let mut want = frames();
            for (f, i) in want.iter_mut().zip(on) {
                f.interface = i;
            }
            let c = read_capture(bytes).unwrap();
            assert_eq!(c.frames, want);
            assert!(c.broken.is_none());
            let cut = read_capture(&bytes[..bytes.len() - 10]).unwrap();
            assert_eq!(cut.frames, want[..4]);
            assert!(cut.broken.is_some());
        }
        let names = read_capture(&ng).unwrap().interfaces;
        assert_eq!(names, [Some("l0".to_string()), Some("l1".to_string())]);
        assert!(read_capture(b"nonsense").is_err());
        // Two interface blocks, named after the links.
        let mut reader = PcapNgReader::new(&ng[..]).unwrap();
        while reader.next_block().is_some() {}
        let names: Vec<_> = reader
            .interfaces()
            .iter()
            .map(|i| i.options.clone())
            .collect();
        assert_eq!(names.len(), 2);
        assert!(format!("{names:?}").contains("l0") && format!("{names:?}").contains("l1"));
    }
}
