//! Tells the tests which instruction-set forms the CPU building them lacks, so that the
//! tests of those forms show as ignored, with the reason, rather than as passed.
//!
//! The lookups themselves choose their form at run time; this only labels tests (which
//! run where they are built). `/proc/cpuinfo` changes when the machine boots, possibly on
//! another CPU, so the answer is asked again then.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(fibre_cpu_lacks_avx2)");
    println!("cargo::rustc-check-cfg=cfg(fibre_cpu_lacks_avx512)");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=/proc/cpuinfo");
    let (avx2, avx512) = detect();
    if !avx2 {
        println!("cargo::rustc-cfg=fibre_cpu_lacks_avx2");
    }
    if !avx512 {
        println!("cargo::rustc-cfg=fibre_cpu_lacks_avx512");
    }
}

#[cfg(target_arch = "x86_64")]
fn detect() -> (bool, bool) {
    use std::is_x86_feature_detected as has;
    let avx2 = has!("avx2") && has!("bmi1") && has!("bmi2") && has!("lzcnt") && has!("popcnt");
    (avx2, avx2 && has!("avx512f") && has!("avx512vl"))
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> (bool, bool) {
    (false, false)
}
