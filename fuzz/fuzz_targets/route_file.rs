//! Fuzzes the route-file reader: any bytes give routes or a precise error, never a panic,
//! and every route read prints back to text that reads as the same route.
#![no_main]

use fibre_routefile::{parse_line, read_routes, AnyPrefix, RouteOp};
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let strict = read_routes(data, Path::new("fuzz"), false);
    let lenient = read_routes(data, Path::new("fuzz"), true).expect("skip_bad only fails on I/O");
    match strict {
        Ok(f) => {
            assert_eq!(lenient.skipped, 0);
            assert_eq!(f.v4, lenient.v4);
            assert_eq!(f.v6, lenient.v6);
        }
        Err(e) => {
            assert!(lenient.skipped > 0);
            assert_eq!(Some(e.clone()), lenient.skipped_examples.first().cloned());
            assert!(e.to_string().starts_with("fuzz:"));
        }
    }
    for (op, p) in lenient
        .v4
        .iter()
        .map(|(o, p)| (*o, AnyPrefix::V4(*p)))
        .chain(lenient.v6.iter().map(|(o, p)| (*o, AnyPrefix::V6(*p))))
    {
        let text = match op {
            RouteOp::Announce => format!("A {p}"),
            RouteOp::Withdraw => format!("W {p}"),
        };
        assert_eq!(parse_line(&text), Ok(Some((op, p))));
    }
});
