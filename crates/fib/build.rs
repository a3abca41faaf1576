//! Tells the tests whether the CPU building them lacks AVX2, so that the test of the
//! lookup passes' AVX2 form shows as ignored, with the reason, rather than as passed.
//!
//! The lookups choose their form at run time; this only labels a test (which runs where
//! it is built). `/proc/cpuinfo` changes when the machine boots, possibly on another CPU,
//! so the answer is asked again then.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(fibre_cpu_lacks_avx2)");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=/proc/cpuinfo");
    if !has_avx2() {
        println!("cargo::rustc-cfg=fibre_cpu_lacks_avx2");
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    std::is_x86_feature_detected!("avx2")
}

#[cfg(not(target_arch = "x86_64"))]
fn has_avx2() -> bool {
    false
}
