//! A capture forwarded offline: the frames one link received, through the pipeline in
//! vectors, and what it sends written out as a capture on each output link would show
//! it. This is `fibre forward`'s work, and the way the pipeline is compared with the
//! kernel packet by packet. Copying a frame into its buffer is counted as the
//! `receive` stage, copying what is sent out of it as the `output` stage.

use crate::capture::{Frame, SentCapture};
use crate::pipeline::{Arrival, Fate, Neighbours, Pipeline};
use crate::pool::Pool;
use fibre_fib::Snapshot;
use std::io::Write;
use std::time::Instant;

/// Packets in a vector at most.
pub const VECTOR: usize = 256;

/// The seed of the hash that gives the workers their connections offline (the daemon
/// draws one at random): fixed, so that a run gives the same each time.
pub const OWNERS_SEED: u64 = 0x5eed;

/// A frame the pipeline sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    /// Which received frame it came of (its index in the capture).
    pub of: usize,
    /// The link it left by.
    pub link: fibre_fib::LinkIndex,
    /// The frame as sent.
    pub data: Vec<u8>,
}

/// Forwards `frames`, each received on the link `arrival` gives it, with the routes of
/// `snap` and the neighbours of `neighbours`, in vectors of `vector` packets (at most
/// [`VECTOR`]; a vector holds one link's frames, and ends where the next frame arrived on
/// another link); returns each frame's fate and the frames sent, in order. The
/// `pipelines` are the workers (each with its own connection table, if any): the
/// vectors are read by each in turn, and a packet one hands to another
/// ([`Fate::Handoff`]) goes through that one's pipeline alone, once the vector it was
/// read in is through (with vectors of one packet, each keeps its place). Each pipeline counts what it did. The limits on errors
/// read the frames' capture times, so that a run gives the same whatever its vectors.
pub fn forward(
    pipelines: &mut [Pipeline],
    snap: &Snapshot,
    neighbours: &impl Neighbours,
    arrival: impl Fn(&Frame) -> Arrival,
    frames: &[Frame],
    vector: usize,
) -> (Vec<Fate>, Vec<Sent>) {
    let vector = vector.clamp(1, VECTOR);
    // Room for the longest frame, and for an error made of it (a frame is cut to its
    // buffer, as a receive ring cuts it to the link's MTU).
    let size = frames
        .iter()
        .map(|f| f.data.len())
        .max()
        .unwrap_or(0)
        .max(2048);
    // And room for the later fragments of packets cut for an MTU: eight a packet, and
    // at least enough for any one packet cut for the least MTU a link may have (68
    // bytes: pieces of 48), within 64 MiB. A vector whose packets need more has those
    // it cannot serve dropped and counted.
    let spare = (vector * 8)
        .max(u16::MAX as usize / 48 + 1)
        .min((64 << 20) / size)
        .max(vector);
    let mut pool = Pool::new(vector + spare, size);
    let mut fates = Vec::with_capacity(frames.len());
    let mut sent = Vec::new();
    let mut ids = Vec::with_capacity(vector);
    let mut first = 0;
    let mut turn = 0;
    while first < frames.len() {
        let w = turn % pipelines.len().max(1);
        turn += 1;
        let link = arrival(&frames[first]);
        let len = frames[first..]
            .iter()
            .take(vector)
            .take_while(|f| arrival(f) == link)
            .count();
        let chunk = &frames[first..first + len];
        let n = first;
        first += len;
        ids.clear();
        let t = Instant::now();
        pool.alloc(chunk.len(), &mut ids);
        for (&id, frame) in ids.iter().zip(chunk) {
            pool.fill(id, &frame.data);
        }
        let start = fates.len();
        let pipeline = &mut pipelines[w];
        pipeline.receive.add(ids.len(), t);
        pipeline.times.clear();
        pipeline
            .times
            .extend(chunk.iter().map(|f| f.timestamp.as_nanos() as u64));
        pipeline.run(snap, neighbours, link, &mut pool, &ids, &mut fates);
        // Handed over: through its owner's pipeline, alone. (A packet it would hand on
        // again is dropped: its owners disagree.) The reader's fragments are kept
        // aside meanwhile: a packet may come back to it.
        let mut fragments = std::mem::take(&mut pipelines[w].fragments);
        for k in 0..ids.len() {
            let mut hops = 0;
            while let Fate::Handoff(to) = fates[start + k] {
                hops += 1;
                let Some(owner) = pipelines
                    .get_mut(usize::from(to))
                    .filter(|_| hops <= usize::from(crate::handoff::HOPS))
                else {
                    fates[start + k] = Fate::Drop(crate::pipeline::Dropped::Filtered);
                    break;
                };
                let mut one = Vec::with_capacity(1);
                owner.times.clear();
                owner.times.push(chunk[k].timestamp.as_nanos() as u64);
                owner.run(snap, neighbours, link, &mut pool, &ids[k..=k], &mut one);
                fates[start + k] = one[0];
                // Its fragments, if it was cut: the owner's, for the one packet.
                fragments.extend(owner.fragments.drain(..).map(|(_, f)| (k, f)));
            }
        }
        let pipeline = &mut pipelines[w];
        // (In the packets' order, as the sending below reads them.)
        fragments.sort_by_key(|&(k, _)| k);
        pipeline.fragments = fragments;
        let t = Instant::now();
        let before = sent.len();
        let mut later = pipeline.fragments.iter().peekable();
        for (k, (&id, fate)) in ids.iter().zip(&fates[start..]).enumerate() {
            if let Some(link) = fate.output() {
                sent.push(Sent {
                    of: n + k,
                    link,
                    data: pool.frame(id).to_vec(),
                });
                // A packet cut into fragments: the others after its first.
                while let Some(&(_, f)) = later.next_if(|f| f.0 == k) {
                    sent.push(Sent {
                        of: n + k,
                        link,
                        data: pool.frame(f).to_vec(),
                    });
                }
            }
        }
        pool.free(&ids);
        for &(_, f) in &pipeline.fragments {
            pool.free(&[f]);
        }
        pipeline.output.add(sent.len() - before, t);
    }
    (fates, sent)
}

/// Writes the frames `sent` to `out`, each on its link's interface block, at the time
/// its received frame was captured.
pub fn write_sent<W: Write>(
    snap: &Snapshot,
    frames: &[Frame],
    sent: &[Sent],
    out: &mut SentCapture<W>,
) -> Result<(), String> {
    for s in sent {
        let name = snap.link(s.link).map_or("?", |l| l.name.as_str());
        out.write(s.link, name, frames[s.of].timestamp, &s.data)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::read_capture;
    use crate::neighbour::StaticNeighbours;
    use etherparse::PacketBuilder;
    use fibre_fib::{config, State};
    use std::time::Duration;

    /// A capture forwarded in vectors of any size sends the same frames, in the same
    /// order, as one packet at a time; and the capture written holds them on their links.
    #[test]
    fn vectors_of_any_size_forward_alike() {
        let text = "\
link add a0 type veth peer name a1
link add b0 type veth peer name b1
link set a0 up
link set b0 up
addr add 10.0.0.1/24 dev a0
addr add 10.0.1.1/24 dev b0
route add 10.1.0.0/16 via 10.0.1.2
route add 192.0.2.0/24 via 10.0.0.2
neigh add 10.0.1.2 lladdr 02:aa:00:00:00:02 dev b0
neigh add 10.0.0.2 lladdr 02:bb:00:00:00:02 dev a0
";
        let (rest, lines) = StaticNeighbours::split(text);
        let mut state = State::new();
        config::apply_text(&mut state, "config", &rest).unwrap();
        let snap = state.snapshot();
        let index = |name: &str| snap.links().find(|l| l.name == name).map(|l| l.index);
        let neighbours = StaticNeighbours::parse(&lines, index).unwrap();
        let a0 = snap.link(index("a0").unwrap()).unwrap().clone();
        let frames: Vec<Frame> = (0..700u32)
            .map(|i| {
                let dst = [10, 1 + (i % 3 == 0) as u8, (i >> 8) as u8, i as u8];
                let b = PacketBuilder::ethernet2([2, 9, 9, 9, 9, 9], a0.mac)
                    .ipv4([192, 0, 2, (i % 200) as u8], dst, (i % 4) as u8 + 1)
                    .udp(4000, 53);
                let mut data = Vec::new();
                b.write(&mut data, &[0; 8]).unwrap();
                Frame {
                    timestamp: Duration::from_micros(i as u64),
                    data,
                    interface: 0,
                }
            })
            .collect();
        let arrival = Arrival {
            link: a0.index,
            mac: a0.mac,
        };
        let mut one = Pipeline::new();
        let (fates, sent) = forward(
            std::slice::from_mut(&mut one),
            &snap,
            &neighbours,
            |_| arrival,
            &frames,
            1,
        );
        assert!(sent.len() > 200 && fates.len() == 700);
        assert!(
            sent.iter().any(|s| s.link == a0.index),
            "errors go back out of a0"
        );
        for vector in [7, 64, 256, 1000] {
            let mut p = Pipeline::new();
            let (f, s) = forward(
                std::slice::from_mut(&mut p),
                &snap,
                &neighbours,
                |_| arrival,
                &frames,
                vector,
            );
            let first = |a: &[Fate], b: &[Fate]| a.iter().zip(b).position(|(x, y)| x != y);
            assert_eq!(
                first(&f, &fates),
                None,
                "vectors of {vector}: the first fate apart"
            );
            assert_eq!(f.len(), fates.len());
            let apart = s.iter().zip(&sent).position(|(x, y)| x != y);
            assert_eq!(
                apart, None,
                "vectors of {vector}: the first frame sent apart"
            );
            assert_eq!(s.len(), sent.len());
        }
        // Frames of two links, taken in runs of one link's: each run forwarded as it
        // arrived, in the order they came.
        let b0 = snap.link(index("b0").unwrap()).unwrap().clone();
        let both = Arrival {
            link: b0.index,
            mac: b0.mac,
        };
        let mixed: Vec<Frame> = frames
            .iter()
            .enumerate()
            .map(|(i, f)| Frame {
                interface: (i / 5 + i / 17) % 2,
                ..f.clone()
            })
            .collect();
        let on = |f: &Frame| if f.interface == 0 { arrival } else { both };
        let mut p = Pipeline::new();
        let (f, s) = forward(
            std::slice::from_mut(&mut p),
            &snap,
            &neighbours,
            on,
            &mixed,
            64,
        );
        let mut q = Pipeline::new();
        let (mut by_run, mut sent_by_run) = (Vec::new(), Vec::new());
        for (i, frame) in mixed.iter().enumerate() {
            let (f1, s1) = forward(
                std::slice::from_mut(&mut q),
                &snap,
                &neighbours,
                |_| on(frame),
                &mixed[i..=i],
                1,
            );
            by_run.extend(f1);
            sent_by_run.extend(s1.into_iter().map(|s| Sent { of: i, ..s }));
        }
        assert_eq!(f, by_run);
        assert_eq!(s, sent_by_run);
        assert!(
            f.iter().zip(&fates).any(|(x, y)| x != y),
            "frames arriving on b0 meet other fates"
        );

        let mut out = SentCapture::new(Vec::new()).unwrap();
        write_sent(&snap, &frames, &sent, &mut out).unwrap();
        let back = read_capture(&out.finish().unwrap()).unwrap();
        assert_eq!(back.frames.len(), sent.len());
        for (f, s) in back.frames.iter().zip(&sent) {
            assert_eq!((&f.data, f.timestamp), (&s.data, frames[s.of].timestamp));
            let link = snap.link(s.link).unwrap().name.clone();
            assert_eq!(
                back.interfaces[f.interface],
                Some(link),
                "on its link's block"
            );
        }
    }
}
