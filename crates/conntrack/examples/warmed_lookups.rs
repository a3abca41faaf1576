//! What warming a vector's lookups ([`Conntrack::warm`]) saves tracking, against the
//! number of connections: a table of that many UDP connections, then vectors of 256
//! packets of connections drawn at random, tracked with and without the vector warmed
//! first, in turn in the same run. Prints ns a packet (the least of 40 repetitions and
//! their median) and the ratio, with the CPU it ran on.
//!
//! `cargo run --release -p fibre-conntrack --example warmed_lookups -- 1000 100000 1000000`
//!
//! The packets are buffers of their own, drawn from all of them: a packet's own bytes
//! miss the caches too, which a vector just received would not. The figures are of
//! tracking alone, not of the pipeline (`fibre bench pipeline` times that).

use fibre_conntrack::{Conntrack, Settings};
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::time::Instant;

/// A UDP packet from `src`:`sp` to `dst`:`dp`.
fn udp(src: [u8; 4], dst: [u8; 4], sp: u16, dp: u16) -> Vec<u8> {
    let mut ip = vec![0x45, 0, 0, 28, 0, 0, 0x40, 0, 64, 17, 0, 0];
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    ip.extend_from_slice(&sp.to_be_bytes());
    ip.extend_from_slice(&dp.to_be_bytes());
    ip.extend_from_slice(&[0, 8, 0, 0]);
    ip
}

/// The CPU's model name.
fn cpu() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "an unknown CPU".into())
}

/// ns a packet tracked (least, median) without and with the vectors warmed, over `n`
/// connections.
fn measure(n: usize) -> [(f64, f64); 2] {
    let mut settings = Settings::kernel_defaults();
    settings.max = 0;
    let mut table = Conntrack::new(settings);
    let mut rng = StdRng::seed_from_u64(1);
    let packets: Vec<Vec<u8>> = (0..n)
        .map(|_| udp(rng.gen(), rng.gen(), rng.gen(), rng.gen()))
        .collect();
    for p in &packets {
        let t = table.track(p, 1, true);
        table.confirm(&t);
    }
    let mut times = [Vec::new(), Vec::new()];
    for _ in 0..40 {
        for warmed in [false, true] {
            let vectors: Vec<Vec<&[u8]>> = (0..200)
                .map(|_| {
                    (0..256)
                        .map(|_| packets[rng.gen_range(0..n)].as_slice())
                        .collect()
                })
                .collect();
            let start = Instant::now();
            for vector in &vectors {
                table.settle();
                if warmed {
                    table.warm(vector.iter().copied());
                }
                for p in vector {
                    std::hint::black_box(table.track_in_vector(p, 2, true));
                }
            }
            let ns = start.elapsed().as_nanos() as f64 / (200.0 * 256.0);
            times[usize::from(warmed)].push(ns);
        }
    }
    times.map(|mut t| {
        t.sort_by(f64::total_cmp);
        (t[0], t[t.len() / 2])
    })
}

fn main() {
    let counts: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numbers of connections"))
        .collect();
    let counts = if counts.is_empty() {
        vec![1_000, 100_000, 1_000_000]
    } else {
        counts
    };
    println!("{}, one core", cpu());
    println!("| connections | tracked, ns a packet (least, median) | warmed first | ratio |");
    println!("|---:|---:|---:|---:|");
    for n in counts {
        let [plain, warmed] = measure(n);
        println!(
            "| {n} | {:.1}, {:.1} | {:.1}, {:.1} | {:.2} |",
            plain.0,
            plain.1,
            warmed.0,
            warmed.1,
            plain.1 / warmed.1
        );
    }
}
