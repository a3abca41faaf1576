//! The kernel's route lookup, measured and checked from userspace: an XDP program that
//! calls `bpf_fib_lookup`, run by `BPF_PROG_TEST_RUN`.
//!
//! The addresses to look up sit in an array map. Each run of the program takes the next
//! one (a per-CPU cursor, so pinned threads do not share a counter), fills a
//! `struct bpf_fib_lookup` with it and the input interface, calls the helper, and stores
//! the return code, output interface and next hop in a results map. A second program,
//! identical but for the helper call, is the dry run whose time is subtracted. The kernel
//! times the repetitions itself and reports nanoseconds per run.
//!
//! The program, in the order of its instructions:
//!
//! ```text
//!   r6 = ctx
//!   i  = cursor[0]; cursor[0] = i + 1 < N ? i + 1 : 0
//!   a  = addrs[i]
//!   params = { family, ifindex: ctx->ingress_ifindex, dst: a }      (64 bytes on the stack)
//!   r7 = bpf_fib_lookup(ctx, &params, 64, 0)     -- the dry run: r7 = 0
//!   results[i] = { r7, params.ifindex, params.dst }
//!   return XDP_PASS
//! ```

use fibre_kernel::bpf::*;
use std::io;
use std::net::IpAddr;

/// Bytes of `struct bpf_fib_lookup`.
const PARAMS: i16 = 64;
/// Stack offset of the parameters (below the 4-byte map key at -4).
const P: i16 = -72;
/// Offset of `ifindex` in the parameters.
const P_IFINDEX: i16 = 8;
/// Offset of `ipv4_dst` / `ipv6_dst` in the parameters.
const P_DST: i16 = 32;
/// Bytes of a results map value: return code, ifindex, next hop (16 bytes).
const RESULT: u32 = 24;
const XDP_PASS: i32 = 2;

/// Return codes of `bpf_fib_lookup` used here.
pub mod ret {
    /// A route and a neighbour were found.
    pub const SUCCESS: u32 = 0;
    /// No route, or a route that does not forward (unreachable, blackhole, local...).
    pub const NOT_FWDED: u32 = 4;
    /// A route was found but not the neighbour.
    pub const NO_NEIGH: u32 = 7;
}

/// What the kernel answered for one address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FibAnswer {
    /// `bpf_fib_lookup`'s return code.
    pub code: u32,
    /// The output interface index.
    pub ifindex: u32,
    /// The next hop: the gateway of the route, or the address itself for a direct route.
    pub nexthop: IpAddr,
}

/// A loaded probe for one family and one list of addresses.
pub struct FibProbe {
    family: u8,
    count: u32,
    cursor: Map,
    results: Map,
    _addrs: Map,
    lookup: Program,
    dry: Program,
}

impl FibProbe {
    /// Loads the programs and the addresses (all of one family, at least one); the
    /// lookup passes no flags, so it resolves the neighbour as forwarding would.
    pub fn new(family: u8, addrs: &[IpAddr]) -> io::Result<FibProbe> {
        Self::with_flags(family, addrs, 0)
    }

    /// Like [`FibProbe::new`] with `bpf_fib_lookup` flags (for example
    /// [`SKIP_NEIGH`]: the route only, no neighbour resolution).
    pub fn with_flags(family: u8, addrs: &[IpAddr], flags: i32) -> io::Result<FibProbe> {
        let count = u32::try_from(addrs.len())
            .ok()
            .filter(|&n| n > 0 && n < i32::MAX as u32)
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "need 1 to 2^31 addresses")
            })?;
        let cursor = Map::new(MapType::PerCpuArray, 4, 1, "fibre_cursor")?;
        let addr_map = Map::new(MapType::Array, 16, count, "fibre_addrs")?;
        let results = Map::new(MapType::Array, RESULT, count, "fibre_results")?;
        for (i, a) in addrs.iter().enumerate() {
            let mut v = [0u8; 16];
            match (family, a) {
                (4, IpAddr::V4(a)) => v[..4].copy_from_slice(&a.octets()),
                (6, IpAddr::V6(a)) => v.copy_from_slice(&a.octets()),
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{a} is not IPv{family}"),
                    ))
                }
            }
            addr_map.set(i as u32, &v)?;
        }
        let lookup = Program::load(
            PROG_TYPE_XDP,
            &program(family, &cursor, &addr_map, &results, count, Some(flags)),
            "fibre_fib",
        )?;
        let dry = Program::load(
            PROG_TYPE_XDP,
            &program(family, &cursor, &addr_map, &results, count, None),
            "fibre_fib_dry",
        )?;
        Ok(FibProbe {
            family,
            count,
            cursor,
            results,
            _addrs: addr_map,
            lookup,
            dry,
        })
    }

    /// Number of addresses.
    pub fn len(&self) -> u32 {
        self.count
    }

    /// Always false: a probe holds at least one address.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Sets every CPU's cursor: CPU `c` starts at address `c * N / CPUs`.
    pub fn spread_cursors(&self) -> io::Result<()> {
        let cpus = possible_cpus()?;
        let mut v = vec![0u8; self.cursor.element_bytes()?];
        for c in 0..cpus {
            let start = (c as u64 * u64::from(self.count) / cpus as u64) as u32;
            v[c * 8..c * 8 + 4].copy_from_slice(&start.to_ne_bytes());
        }
        self.cursor.set(0, &v)
    }

    /// Runs the lookup program (or, with `lookup == false`, the dry run) `repeat` times as
    /// if packets arrived on interface `ifindex`. The calling thread must be in the
    /// namespace that owns `ifindex`. Returns the kernel's ns per run.
    pub fn run(&self, lookup: bool, ifindex: u32, repeat: u32) -> io::Result<u32> {
        let packet = [0u8; 64];
        let mut ctx = [0u8; 24];
        ctx[4..8].copy_from_slice(&(packet.len() as u32).to_ne_bytes()); // data_end
        ctx[12..16].copy_from_slice(&ifindex.to_ne_bytes()); // ingress_ifindex
        let ctx: &[u8] = if ifindex == 0 { &[] } else { &ctx };
        let prog = if lookup { &self.lookup } else { &self.dry };
        let r = prog.test_run(&packet, ctx, repeat)?;
        if r.retval != XDP_PASS as u32 {
            return Err(io::Error::other(format!(
                "probe returned {} instead of XDP_PASS",
                r.retval
            )));
        }
        Ok(r.duration_ns)
    }

    /// The answer recorded for address `i` by the last lookup run that reached it.
    pub fn answer(&self, i: u32) -> io::Result<FibAnswer> {
        let v = self.results.get(i)?;
        let word = |o: usize| u32::from_ne_bytes(v[o..o + 4].try_into().expect("4 bytes"));
        let nexthop = if self.family == 4 {
            IpAddr::from(<[u8; 4]>::try_from(&v[8..12]).expect("4 bytes"))
        } else {
            IpAddr::from(<[u8; 16]>::try_from(&v[8..24]).expect("16 bytes"))
        };
        Ok(FibAnswer {
            code: word(0),
            ifindex: word(4),
            nexthop,
        })
    }
}

/// `bpf_fib_lookup` flag: find the route only, without resolving the neighbour.
pub const SKIP_NEIGH: i32 = 1 << 2;

/// Assembles the probe program (see the module documentation): with `lookup` the
/// helper's flags, without it the dry run.
fn program(
    family: u8,
    cursor: &Map,
    addrs: &Map,
    results: &Map,
    count: u32,
    lookup: Option<i32>,
) -> Vec<Insn> {
    let mut p: Vec<Insn> = Vec::new();
    let mut to_out: Vec<usize> = Vec::new();
    let key = -4i16;
    // r0 = map[key] with the key 0 or in a register; on a miss, jump out (patched below).
    let mut lookup_elem = |p: &mut Vec<Insn>, map: &Map, key_reg: Option<Reg>| {
        p.push(match key_reg {
            Some(r) => store_reg(Size::W, R10, key, r),
            None => store_imm(Size::W, R10, key, 0),
        });
        p.extend(load_map(R1, map));
        p.push(mov_reg(R2, R10));
        p.push(add_imm(R2, key.into()));
        p.push(call(HELPER_MAP_LOOKUP_ELEM));
        to_out.push(p.len());
        p.push(jeq_imm(R0, 0, 0));
    };
    // i = cursor[0]
    p.push(mov_reg(R6, R1));
    lookup_elem(&mut p, cursor, None);
    p.push(mov_reg(R7, R0));
    p.push(load(Size::W, R8, R7, 0));
    // cursor[0] = i + 1 < N ? i + 1 : 0
    p.push(mov_reg(R1, R8));
    p.push(add_imm(R1, 1));
    p.push(jlt_imm(R1, count as i32, 1));
    p.push(mov_imm(R1, 0));
    p.push(store_reg(Size::W, R7, 0, R1));
    // a = addrs[i]
    lookup_elem(&mut p, addrs, Some(R8));
    p.push(mov_reg(R9, R0));
    // params = { family, ifindex, dst }
    for off in (0..PARAMS).step_by(8) {
        p.push(store_imm(Size::DW, R10, P + off, 0));
    }
    let af = if family == 4 {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    p.push(store_imm(Size::B, R10, P, af));
    p.push(load(Size::W, R1, R6, 12)); // xdp_md.ingress_ifindex
    p.push(store_reg(Size::W, R10, P + P_IFINDEX, R1));
    let words = if family == 4 { 1 } else { 4 };
    for w in 0..words {
        p.push(load(Size::W, R1, R9, 4 * w));
        p.push(store_reg(Size::W, R10, P + P_DST + 4 * w, R1));
    }
    // r7 = bpf_fib_lookup(ctx, &params, 64, 0), or 0 in the dry run
    // The arguments are set up in the dry run too; only the call itself differs.
    p.push(mov_reg(R1, R6));
    p.push(mov_reg(R2, R10));
    p.push(add_imm(R2, P.into()));
    p.push(mov_imm(R3, PARAMS.into()));
    p.push(mov_imm(R4, lookup.unwrap_or(0)));
    p.push(match lookup {
        Some(_) => call(HELPER_FIB_LOOKUP),
        None => mov_imm(R0, 0),
    });
    p.push(mov_reg(R7, R0));
    // results[i] = { r7, ifindex, dst }
    lookup_elem(&mut p, results, Some(R8));
    p.push(store_reg(Size::W, R0, 0, R7));
    p.push(load(Size::W, R1, R10, P + P_IFINDEX));
    p.push(store_reg(Size::W, R0, 4, R1));
    for w in 0..4 {
        p.push(load(Size::W, R1, R10, P + P_DST + 4 * w));
        p.push(store_reg(Size::W, R0, 8 + 4 * w, R1));
    }
    // out: return XDP_PASS
    let out = p.len();
    for j in to_out {
        p[j] = jeq_imm(R0, 0, (out - j - 1) as i16);
    }
    p.push(mov_imm(R0, XDP_PASS));
    p.push(exit());
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[ignore = "needs root: creates BPF maps (for their descriptors)"]
    fn dry_run_differs_from_the_lookup_only_in_the_helper_call() {
        let m = Map::new(MapType::Array, 16, 4, "t").expect("BPF maps can be made (as root)");
        for family in [4, 6] {
            let a = program(family, &m, &m, &m, 4, Some(0));
            let b = program(family, &m, &m, &m, 4, None);
            assert_eq!(a.len(), b.len());
            let diff: Vec<_> = a
                .iter()
                .zip(&b)
                .enumerate()
                .filter(|(_, (x, y))| x != y)
                .collect();
            assert_eq!(diff.len(), 1, "{diff:?}");
            assert_eq!(*diff[0].1 .0, call(HELPER_FIB_LOOKUP));
        }
    }
}
