//! What each stage of the packet path costs, in the manner of VPP's `show runtime`:
//! calls, packets, packets per call, and time and cycles per packet.
//!
//! A stage is timed once per vector it runs on, so the clock's own cost (a `clock_gettime`
//! through the vDSO, some 20 ns) is shared by the vector's packets. Cycles are the time
//! at the CPU's nominal frequency (`cpu MHz` of `/proc/cpuinfo`, read once), an estimate:
//! a core that runs faster or slower than that is not seen.

use std::time::{Duration, Instant};

/// One stage's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageCounters {
    /// Vectors the stage ran on.
    pub calls: u64,
    /// Packets in them.
    pub packets: u64,
    /// Time spent in the stage.
    pub time: Duration,
}

impl StageCounters {
    /// Counts one call on `packets` packets that started at `started`.
    #[inline]
    pub fn add(&mut self, packets: usize, started: Instant) {
        self.calls += 1;
        self.packets += packets as u64;
        self.time += started.elapsed();
    }

    /// Packets per call.
    pub fn per_call(&self) -> f64 {
        self.packets as f64 / self.calls.max(1) as f64
    }

    /// Nanoseconds per packet.
    pub fn ns_per_packet(&self) -> f64 {
        self.time.as_nanos() as f64 / self.packets.max(1) as f64
    }

    /// Cycles per packet at `mhz`.
    pub fn cycles_per_packet(&self, mhz: f64) -> f64 {
        self.ns_per_packet() * mhz / 1e3
    }
}

/// The CPU's nominal frequency in MHz, if the system says.
pub fn cpu_mhz() -> Option<f64> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("cpu MHz"))?;
    line.split(':').nth(1)?.trim().parse().ok()
}

/// A table of stages' counters as `show runtime` prints it.
pub fn table(stages: &[(&str, StageCounters)], mhz: Option<f64>) -> String {
    let mut out = format!(
        "{:<12} {:>10} {:>12} {:>10} {:>10} {:>12}\n",
        "stage", "calls", "packets", "per call", "ns/packet", "cycles/packet"
    );
    for (name, c) in stages {
        out += &format!(
            "{:<12} {:>10} {:>12} {:>10.1} {:>10.2} {:>12}\n",
            name,
            c.calls,
            c.packets,
            c.per_call(),
            c.ns_per_packet(),
            mhz.map_or("-".to_string(), |m| format!(
                "{:.1}",
                c.cycles_per_packet(m)
            ))
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_divide_as_they_say() {
        let mut c = StageCounters::default();
        assert_eq!((c.per_call(), c.ns_per_packet()), (0.0, 0.0), "nothing yet");
        c.calls = 4;
        c.packets = 1000;
        c.time = Duration::from_micros(5);
        assert_eq!(c.per_call(), 250.0);
        assert_eq!(c.ns_per_packet(), 5.0);
        assert_eq!(c.cycles_per_packet(2000.0), 10.0);
        let t = table(&[("input", c)], Some(2000.0));
        assert!(
            t.contains("input") && t.contains("250.0") && t.contains("10.0"),
            "{t}"
        );
    }
}
