//! Fuzzes the MRT reader: any bytes give routes, skipped records or a break, never a
//! panic; the routes reported equal the routes passed on.
#![no_main]

use fibre_routefile::read_mrt;
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let mut seen = 0;
    let summary =
        read_mrt(data, Path::new("fuzz.mrt"), |_| seen += 1).expect("reading memory cannot fail");
    assert_eq!(summary.routes, seen);
    if let Some(e) = summary.broken {
        assert!(e.reason.contains("breaks off near byte"));
    }
});
