//! Build script of fibre-bench: the DPDK peer's C shim (`src/dpdk/shim.c`), compiled and
//! linked against DPDK's `rte_fib` and EAL only where `pkg-config` finds `libdpdk`
//! (Debian's `dpdk-dev`). Then `cfg(fibre_dpdk)` is set and the peer is built; otherwise
//! the bench runs without it and its reports say why. `FIBRE_NO_DPDK=1` leaves it out
//! where DPDK is installed.

use std::process::Command;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(fibre_dpdk)");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=src/dpdk/shim.c");
    println!("cargo::rerun-if-env-changed=FIBRE_NO_DPDK");
    println!("cargo::rerun-if-env-changed=PKG_CONFIG_PATH");
    // Installing or removing dpdk-dev changes a folder pkg-config searches: build again.
    if let Some(path) = pkg_config(&["--variable", "pc_path", "pkg-config"]) {
        for dir in path.split(':').filter(|d| std::path::Path::new(d).is_dir()) {
            println!("cargo::rerun-if-changed={dir}");
        }
    }
    if std::env::var_os("FIBRE_NO_DPDK").is_some_and(|v| v != "0") {
        println!("cargo::rustc-env=FIBRE_DPDK_MISSING=left out of this build (FIBRE_NO_DPDK)");
        return;
    }
    let (Some(cflags), Some(libdirs)) = (
        pkg_config(&["--cflags", "libdpdk"]),
        pkg_config(&["--libs-only-L", "libdpdk"]),
    ) else {
        println!(
            "cargo::rustc-env=FIBRE_DPDK_MISSING=libdpdk not found by pkg-config (install dpdk-dev)"
        );
        return;
    };
    let mut build = cc::Build::new();
    build.file("src/dpdk/shim.c").warnings(false);
    // `-include rte_config.h` is two words; the rest are single flags.
    let mut words = cflags.split_whitespace();
    while let Some(w) = words.next() {
        match w {
            "-include" => {
                if let Some(file) = words.next() {
                    build.flag("-include").flag(file);
                }
            }
            _ => {
                build.flag(w);
            }
        }
    }
    build.compile("fibre_dpdk_shim");
    if let Some(v) = pkg_config(&["--modversion", "libdpdk"]) {
        println!("cargo::rustc-env=FIBRE_DPDK_VERSION={v}");
    }
    for dir in libdirs
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("-L"))
    {
        println!("cargo::rustc-link-search=native={dir}");
    }
    // The FIB library and the environment; the libraries they need come with them.
    println!("cargo::rustc-link-lib=dylib=rte_fib");
    println!("cargo::rustc-link-lib=dylib=rte_eal");
    println!("cargo::rustc-cfg=fibre_dpdk");
}

/// `pkg-config ARGS`'s output, if it ran and succeeded.
fn pkg_config(args: &[&str]) -> Option<String> {
    let out = Command::new("pkg-config").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}
