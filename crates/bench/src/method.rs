//! The measurement method, that of `kbench_mod` (a kernel-module benchmark of the Linux
//! FIB), applied to every engine alike.
//!
//! N threads each run the same work; the run is repeated (12 times by default); the
//! highest and lowest repetitions are dropped; the rest give a mean and a mean absolute
//! deviation. A dry run that does everything but the measured operation is measured the
//! same way and subtracted. Two figures come out of every run:
//!
//! - *latency-style*: each thread's elapsed time divided by its own operations, averaged
//!   over threads (the time of one operation as a thread sees it);
//! - *throughput-style*: wall-clock time from the first thread's start to the last
//!   thread's end, divided by all operations of all threads.
//!
//! Thread `t` is pinned to CPU `t mod CPUs`, so threads do not migrate mid-run and, past
//! the CPU count, share CPUs in a known way.

use std::sync::Barrier;
use std::time::{Duration, Instant};

/// Repetitions and threads of a measurement.
#[derive(Clone, Copy, Debug)]
pub struct Method {
    /// Repetitions (the highest and lowest are dropped).
    pub repetitions: usize,
    /// Threads running the work at once.
    pub threads: usize,
}

impl Default for Method {
    fn default() -> Self {
        Method {
            repetitions: 12,
            threads: 1,
        }
    }
}

/// A mean and its mean absolute deviation, over the repetitions kept.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Stat {
    /// Mean.
    pub mean: f64,
    /// Mean absolute deviation from the mean.
    pub mean_dev: f64,
}

impl Stat {
    /// The mean and mean deviation of `samples` with the highest and lowest dropped
    /// (when there are at least three).
    pub fn trimmed(samples: &[f64]) -> Stat {
        let mut s: Vec<f64> = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let kept = if s.len() >= 3 {
            &s[1..s.len() - 1]
        } else {
            &s[..]
        };
        if kept.is_empty() {
            return Stat::default();
        }
        let mean = kept.iter().sum::<f64>() / kept.len() as f64;
        let mean_dev = kept.iter().map(|x| (x - mean).abs()).sum::<f64>() / kept.len() as f64;
        Stat { mean, mean_dev }
    }

    /// `self - other`: means subtract, deviations add.
    pub fn minus(self, other: Stat) -> Stat {
        Stat {
            mean: self.mean - other.mean,
            mean_dev: self.mean_dev + other.mean_dev,
        }
    }
}

/// The result of measuring one operation: ns per operation, both ways.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timing {
    /// Each thread's time per operation (averaged over threads).
    pub per_op: Stat,
    /// Wall time divided by all operations of all threads.
    pub throughput: Stat,
}

impl Timing {
    /// This timing with a dry run's subtracted.
    pub fn minus(self, dry: Timing) -> Timing {
        Timing {
            per_op: self.per_op.minus(dry.per_op),
            throughput: self.throughput.minus(dry.throughput),
        }
    }
}

/// Measures several variants of a measurement in turn, one repetition of each at a time,
/// so that the machine's drift during the run hits them alike (the figures of a study
/// across thread counts, say, are then comparable with each other). `once(variant)`
/// measures one repetition; each variant's repetitions are then trimmed as usual.
pub fn interleaved(
    repetitions: usize,
    variants: usize,
    mut once: impl FnMut(usize) -> Timing,
) -> Vec<Timing> {
    let mut per_op = vec![Vec::new(); variants];
    let mut throughput = vec![Vec::new(); variants];
    for _ in 0..repetitions.max(1) {
        for v in 0..variants {
            let t = once(v);
            per_op[v].push(t.per_op.mean);
            throughput[v].push(t.throughput.mean);
        }
    }
    (0..variants)
        .map(|v| Timing {
            per_op: Stat::trimmed(&per_op[v]),
            throughput: Stat::trimmed(&throughput[v]),
        })
        .collect()
}

/// Like [`measure`], for work that also times itself: `work` returns its operations and
/// the nanoseconds per operation its own clock measured (the kernel times its
/// `BPF_PROG_TEST_RUN` loop itself). The per-operation figure is that clock's, averaged
/// over threads; the throughput figure is measured exactly as [`measure`] measures it:
/// the threads start each repetition together behind a barrier, and the wall time from
/// the first one's start to the last one's end is divided by all their operations.
pub fn measure_self_timed<S, Setup, Work>(method: Method, setup: Setup, work: Work) -> Timing
where
    Setup: Fn(usize) -> S + Sync,
    Work: Fn(&mut S, usize) -> (u64, f64) + Sync,
{
    let runs = run_threads(method, setup, work);
    let (_, throughput) = wall_figures(&runs, |r| r.0);
    let threads = runs.len().max(1);
    let reps = method.repetitions.max(1);
    let per_op: Vec<f64> = (0..reps)
        .map(|rep| runs.iter().map(|r| r[rep].2 .1).sum::<f64>() / threads as f64)
        .collect();
    Timing {
        per_op: Stat::trimmed(&per_op),
        throughput: Stat::trimmed(&throughput),
    }
}

/// Runs `work(state, repetition)` on pinned threads, each repetition started together
/// behind a barrier; per thread, per repetition: start, end and what `work` returned.
fn run_threads<S, R, Setup, Work>(
    method: Method,
    setup: Setup,
    work: Work,
) -> Vec<Vec<(Instant, Instant, R)>>
where
    Setup: Fn(usize) -> S + Sync,
    Work: Fn(&mut S, usize) -> R + Sync,
    R: Send,
{
    let threads = method.threads.max(1);
    let reps = method.repetitions.max(1);
    let barrier = Barrier::new(threads);
    let cpus = core_affinity::get_core_ids().unwrap_or_default();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, setup, work, cpus) = (&barrier, &setup, &work, &cpus);
                scope.spawn(move || {
                    if !cpus.is_empty() {
                        core_affinity::set_for_current(cpus[t % cpus.len()]);
                    }
                    let mut state = setup(t);
                    (0..reps)
                        .map(|rep| {
                            barrier.wait();
                            let start = Instant::now();
                            let r = work(&mut state, rep);
                            (start, Instant::now(), r)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("benchmark thread panicked"))
            .collect()
    })
}

/// Per repetition, from what [`run_threads`] returned (`ops` reads the operations out of
/// what the work returned): each thread's wall time per operation averaged over threads,
/// and the wall time from the first thread's start to the last one's end over all
/// operations of all threads.
fn wall_figures<R>(
    runs: &[Vec<(Instant, Instant, R)>],
    ops: impl Fn(&R) -> u64,
) -> (Vec<f64>, Vec<f64>) {
    let ns = |d: Duration| d.as_secs_f64() * 1e9;
    let threads = runs.len().max(1);
    let reps = runs.first().map_or(0, Vec::len);
    let mut per_op = Vec::with_capacity(reps);
    let mut throughput = Vec::with_capacity(reps);
    for rep in 0..reps {
        let this: Vec<_> = runs.iter().map(|r| &r[rep]).collect();
        let per_thread: f64 = this
            .iter()
            .map(|(s, e, r)| ns(*e - *s) / ops(r).max(1) as f64)
            .sum::<f64>()
            / threads as f64;
        let first = this.iter().map(|r| r.0).min().expect("one thread at least");
        let last = this.iter().map(|r| r.1).max().expect("one thread at least");
        let all_ops: u64 = this.iter().map(|r| ops(&r.2)).sum();
        per_op.push(per_thread);
        throughput.push(ns(last - first) / all_ops.max(1) as f64);
    }
    (per_op, throughput)
}

/// Runs `work(thread, repetition)` on `method.threads` threads, each repetition started
/// together behind a barrier; `work` returns how many operations it did. Returns ns per
/// operation. `setup(thread)` builds each thread's state once, outside the timing.
pub fn measure<S, Setup, Work>(method: Method, setup: Setup, work: Work) -> Timing
where
    Setup: Fn(usize) -> S + Sync,
    Work: Fn(&mut S, usize) -> u64 + Sync,
{
    let runs = run_threads(method, setup, work);
    let (per_op, throughput) = wall_figures(&runs, |&ops| ops);
    Timing {
        per_op: Stat::trimmed(&per_op),
        throughput: Stat::trimmed(&throughput),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaved_variants_take_turns_and_are_trimmed_apart() {
        let mut calls = Vec::new();
        let mut rep = [0.0f64; 2];
        let t = interleaved(4, 2, |v| {
            calls.push(v);
            rep[v] += 1.0;
            // Variant 1 has one outlier, which trimming drops.
            let x = if v == 1 && rep[v] == 2.0 {
                1000.0
            } else {
                10.0 * v as f64 + rep[v]
            };
            Timing {
                per_op: Stat {
                    mean: x,
                    mean_dev: 0.0,
                },
                throughput: Stat {
                    mean: x / 2.0,
                    mean_dev: 0.0,
                },
            }
        });
        assert_eq!(
            calls,
            [0, 1, 0, 1, 0, 1, 0, 1],
            "one repetition of each in turn"
        );
        assert_eq!(t[0].per_op.mean, 2.5, "1..4 without 1 and 4");
        assert_eq!(
            t[1].per_op.mean, 13.5,
            "11, 1000, 13, 14 without 11 and 1000"
        );
        assert_eq!(t[1].throughput.mean, 6.75);
    }

    #[test]
    fn trimmed_drops_the_extremes() {
        let s = Stat::trimmed(&[100.0, 1.0, 2.0, 3.0, -50.0]);
        assert_eq!(s.mean, 2.0);
        assert!((s.mean_dev - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(Stat::trimmed(&[4.0]).mean, 4.0);
        let d = Stat {
            mean: 10.0,
            mean_dev: 1.0,
        }
        .minus(Stat {
            mean: 3.0,
            mean_dev: 0.5,
        });
        assert_eq!(
            d,
            Stat {
                mean: 7.0,
                mean_dev: 1.5
            }
        );
    }

    #[test]
    fn measure_runs_every_thread_every_repetition() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let calls = AtomicU64::new(0);
        let t = measure(
            Method {
                repetitions: 5,
                threads: 2,
            },
            |thread| thread as u64,
            |_, _| {
                calls.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
                1000
            },
        );
        assert_eq!(calls.load(Ordering::Relaxed), 10);
        // 2 ms for 1000 operations is at least 2,000 ns each.
        assert!(t.per_op.mean >= 2000.0, "{t:?}");
        assert!(
            t.throughput.mean >= 1000.0 && t.throughput.mean < t.per_op.mean,
            "{t:?}"
        );
    }

    #[test]
    fn self_timed_throughput_is_wall_time_not_the_clock_over_threads() {
        // Each call claims 1 ns per operation by its own clock but takes 4 ms of wall
        // time for 1000 operations: the per-operation figure is the claim, the
        // throughput is what the wall clock saw, 2 threads at once or not.
        for threads in [1, 2] {
            let t = measure_self_timed(
                Method {
                    repetitions: 3,
                    threads,
                },
                |_| (),
                |_, _| {
                    std::thread::sleep(Duration::from_millis(4));
                    (1000, 1.0)
                },
            );
            assert_eq!(t.per_op.mean, 1.0, "{t:?}");
            // Sleeping threads overlap whatever the CPUs: at least 4 ms for all
            // `threads * 1000` operations.
            let floor = 4e6 / (1000 * threads) as f64;
            assert!(
                t.throughput.mean >= floor && t.throughput.mean < 2.0 * 4e6 / 1000.0,
                "{threads} thread(s): {t:?}"
            );
        }
    }
}
