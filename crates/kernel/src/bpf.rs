//! Just enough eBPF to run a program in the kernel: instruction encoding, array maps,
//! program loading and `BPF_PROG_TEST_RUN`, through the `bpf(2)` system call.
//!
//! The program fibre runs is assembled here, instruction by instruction, so building
//! fibre needs cargo alone: no clang, no libbpf, no object file.
//!
//! The `bpf(2)` attribute structures carry pointers as 64-bit integers (keys, values,
//! instructions, logs, packets), which the kernel reads and writes through. So the one
//! function that makes the system call, `sys_bpf`, is `unsafe`: each caller says why
//! every pointer it put in the attributes is valid, for the size the kernel will use, for
//! the length of the call.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// One eBPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

/// eBPF registers: `R0` return value, `R1`-`R5` arguments, `R6`-`R9` callee-saved,
/// `R10` frame pointer.
pub type Reg = u8;
/// Return value / helper result.
pub const R0: Reg = 0;
/// First argument (the context on entry).
pub const R1: Reg = 1;
/// Second argument.
pub const R2: Reg = 2;
/// Third argument.
pub const R3: Reg = 3;
/// Fourth argument.
pub const R4: Reg = 4;
/// Fifth argument.
pub const R5: Reg = 5;
/// Callee-saved.
pub const R6: Reg = 6;
/// Callee-saved.
pub const R7: Reg = 7;
/// Callee-saved.
pub const R8: Reg = 8;
/// Callee-saved.
pub const R9: Reg = 9;
/// Read-only frame pointer.
pub const R10: Reg = 10;

/// Width of a memory access.
#[derive(Clone, Copy, Debug)]
pub enum Size {
    /// 1 byte.
    B = 0x10,
    /// 2 bytes.
    H = 0x08,
    /// 4 bytes.
    W = 0x00,
    /// 8 bytes.
    DW = 0x18,
}

const fn insn(code: u8, dst: Reg, src: Reg, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | (dst & 0x0f),
        off,
        imm,
    }
}

/// `dst = imm` (64-bit).
pub const fn mov_imm(dst: Reg, imm: i32) -> Insn {
    insn(0xb7, dst, 0, 0, imm)
}
/// `dst = src` (64-bit).
pub const fn mov_reg(dst: Reg, src: Reg) -> Insn {
    insn(0xbf, dst, src, 0, 0)
}
/// `dst += imm` (64-bit).
pub const fn add_imm(dst: Reg, imm: i32) -> Insn {
    insn(0x07, dst, 0, 0, imm)
}
/// `dst += src` (64-bit).
pub const fn add_reg(dst: Reg, src: Reg) -> Insn {
    insn(0x0f, dst, src, 0, 0)
}
/// `dst <<= imm` (64-bit).
pub const fn lsh_imm(dst: Reg, imm: i32) -> Insn {
    insn(0x67, dst, 0, 0, imm)
}
/// `dst = *(size *)(src + off)`.
pub const fn load(size: Size, dst: Reg, src: Reg, off: i16) -> Insn {
    insn(0x61 | size as u8, dst, src, off, 0)
}
/// `*(size *)(dst + off) = src`.
pub const fn store_reg(size: Size, dst: Reg, off: i16, src: Reg) -> Insn {
    insn(0x63 | size as u8, dst, src, off, 0)
}
/// `*(size *)(dst + off) = imm`.
pub const fn store_imm(size: Size, dst: Reg, off: i16, imm: i32) -> Insn {
    insn(0x62 | size as u8, dst, 0, off, imm)
}
/// `if dst == imm goto +off`.
pub const fn jeq_imm(dst: Reg, imm: i32, off: i16) -> Insn {
    insn(0x15, dst, 0, off, imm)
}
/// `if dst < imm goto +off` (unsigned).
pub const fn jlt_imm(dst: Reg, imm: i32, off: i16) -> Insn {
    insn(0xa5, dst, 0, off, imm)
}
/// `if (u32)dst != (u32)imm goto +off`: the low 32 bits compared, unsigned.
pub const fn jne32_imm(dst: Reg, imm: i32, off: i16) -> Insn {
    insn(0x56, dst, 0, off, imm)
}
/// `if dst != imm goto +off`.
pub const fn jne_imm(dst: Reg, imm: i32, off: i16) -> Insn {
    insn(0x55, dst, 0, off, imm)
}
/// `if dst > imm goto +off` (unsigned).
pub const fn jgt_imm(dst: Reg, imm: i32, off: i16) -> Insn {
    insn(0x25, dst, 0, off, imm)
}
/// `if dst == src goto +off`.
pub const fn jeq_reg(dst: Reg, src: Reg, off: i16) -> Insn {
    insn(0x1d, dst, src, off, 0)
}
/// `if dst != src goto +off`.
pub const fn jne_reg(dst: Reg, src: Reg, off: i16) -> Insn {
    insn(0x5d, dst, src, off, 0)
}
/// `dst |= src` (64-bit).
pub const fn or_reg(dst: Reg, src: Reg) -> Insn {
    insn(0x4f, dst, src, 0, 0)
}
/// `dst = htobe16(dst)`: the low 16 bits byte-swapped on a little-endian machine (as
/// every machine fibre runs on is), the rest cleared; a big-endian field read as a
/// half-word becomes its value.
pub const fn be16(dst: Reg) -> Insn {
    insn(0xdc, dst, 0, 0, 16)
}
/// `if dst > src goto +off` (unsigned).
pub const fn jgt_reg(dst: Reg, src: Reg, off: i16) -> Insn {
    insn(0x2d, dst, src, off, 0)
}
/// `goto +off`.
pub const fn ja(off: i16) -> Insn {
    insn(0x05, 0, 0, off, 0)
}
/// `dst &= imm` (64-bit).
pub const fn and_imm(dst: Reg, imm: i32) -> Insn {
    insn(0x57, dst, 0, 0, imm)
}
/// `dst >>= imm` (64-bit, logical).
pub const fn rsh_imm(dst: Reg, imm: i32) -> Insn {
    insn(0x77, dst, 0, 0, imm)
}
/// Calls kernel helper number `helper`.
pub const fn call(helper: i32) -> Insn {
    insn(0x85, 0, 0, 0, helper)
}
/// Returns `R0`.
pub const fn exit() -> Insn {
    insn(0x95, 0, 0, 0, 0)
}
/// `dst = map` (two instructions: a 64-bit immediate holding a map file descriptor).
pub fn load_map(dst: Reg, map: &Map) -> [Insn; 2] {
    [
        insn(0x18, dst, 1, 0, map.fd.as_raw_fd()),
        insn(0, 0, 0, 0, 0),
    ]
}

/// An instruction, or a jump to a label, or a label, resolved by [`assemble`].
pub enum Item {
    /// One instruction.
    Op(Insn),
    /// A two-instruction load (a map, a 64-bit immediate).
    Wide([Insn; 2]),
    /// A conditional jump made by the function, to the label.
    Jump(fn(u8, i32, i16) -> Insn, u8, i32, &'static str),
    /// A conditional jump comparing two registers, to the label.
    JumpReg(fn(u8, u8, i16) -> Insn, u8, u8, &'static str),
    /// An unconditional jump to the label.
    Goto(&'static str),
    /// Where jumps to this name land.
    Label(&'static str),
}

/// Lays the items out, each jump's offset counted to its label (a jump to a label not
/// among them panics: a program is fixed at build time, and its tests load it).
pub fn assemble(items: &[Item]) -> Vec<Insn> {
    let mut at = std::collections::HashMap::new();
    let mut n = 0usize;
    for item in items {
        match item {
            Item::Label(l) => {
                at.insert(*l, n);
            }
            Item::Wide(_) => n += 2,
            _ => n += 1,
        }
    }
    let off = |from: usize, label: &str| -> i16 {
        let to = *at.get(label).unwrap_or_else(|| panic!("no label {label}"));
        (to as i64 - from as i64 - 1) as i16
    };
    let mut out = Vec::with_capacity(n);
    for item in items {
        let here = out.len();
        match item {
            Item::Op(i) => out.push(*i),
            Item::Wide(w) => out.extend_from_slice(w),
            Item::Jump(f, r, imm, l) => out.push(f(*r, *imm, off(here, l))),
            Item::JumpReg(f, a, b, l) => out.push(f(*a, *b, off(here, l))),
            Item::Goto(l) => out.push(ja(off(here, l))),
            Item::Label(_) => {}
        }
    }
    out
}

/// Writes the IPv4 address at `from` in the frame (from `frame` on) to the stack at
/// `R10 + to`, v4-mapped: ten zero bytes, two 0xff, the address; `scratch` is used.
pub fn v4_mapped_to_stack(frame: Reg, scratch: Reg, from: i16, to: i16) -> [Item; 5] {
    [
        Item::Op(store_imm(Size::W, R10, to, 0)),
        Item::Op(store_imm(Size::W, R10, to + 4, 0)),
        Item::Op(store_imm(
            Size::W,
            R10,
            to + 8,
            i32::from_ne_bytes([0, 0, 0xff, 0xff]),
        )),
        Item::Op(load(Size::W, scratch, frame, from)),
        Item::Op(store_reg(Size::W, R10, to + 12, scratch)),
    ]
}

/// The IPv4 checksum of an Ethernet frame at register `frame` patched for a time to
/// live taken down by one (`ip_decrease_ttl`): the field, in network order, plus 0x0100
/// with its carry; `scratch` is used, `sum` names the label the sequence needs (unique
/// in its program).
pub fn ttl_checksum_patch(frame: Reg, scratch: Reg, sum: &'static str) -> [Item; 6] {
    [
        Item::Op(load(Size::H, scratch, frame, 24)),
        Item::Op(add_imm(scratch, 1)),
        Item::Jump(jlt_imm, scratch, 0xffff, sum),
        Item::Op(add_imm(scratch, 1)),
        Item::Label(sum),
        Item::Op(store_reg(Size::H, frame, 24, scratch)),
    ]
}

/// Helper `bpf_redirect`: the frame to a link's transmit path.
pub const HELPER_REDIRECT: i32 = 23;
/// `TCX_NEXT`: a traffic-control program's answer that sends the frame on to what else
/// is attached, then the kernel.
pub const TCX_NEXT: i32 = -1;
/// Offsets in `struct __sk_buff`, a traffic-control program's context: the packet
/// type, the first byte and the end of the frame.
pub const SKB_PKT_TYPE: i16 = 4;
/// See [`SKB_PKT_TYPE`].
pub const SKB_DATA: i16 = 76;
/// See [`SKB_PKT_TYPE`].
pub const SKB_DATA_END: i16 = 80;

/// Helper `bpf_map_lookup_elem`.
pub const HELPER_MAP_LOOKUP_ELEM: i32 = 1;
/// Helper `bpf_redirect_map`.
pub const HELPER_REDIRECT_MAP: i32 = 51;
/// Helper `bpf_fib_lookup`.
pub const HELPER_FIB_LOOKUP: i32 = 69;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_LINK_CREATE: libc::c_long = 28;

/// Makes the `bpf(2)` system call `cmd` with `attr`.
///
/// # Safety
/// `attr` must be the `#[repr(C)]` attribute structure of the layout `cmd` expects, with
/// no uninitialised bytes, and every pointer it carries as an integer must be valid for
/// the kernel to read (and, where `cmd` writes back through it, to write) as many bytes
/// as `cmd` uses, until the call returns.
unsafe fn sys_bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, initialised attribute structure of the layout `cmd`
    // expects (the caller's promise), and its size is passed with it, so the kernel reads
    // and writes only within it; the pointers inside are the caller's promise too.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Takes ownership of a descriptor a `bpf(2)` call returned.
///
/// # Safety
/// `r` must be a descriptor the kernel just returned to this caller, which nothing else
/// owns or will close.
unsafe fn take_fd(r: libc::c_long) -> OwnedFd {
    // SAFETY: the caller's promise: the descriptor is open and ours alone.
    unsafe { OwnedFd::from_raw_fd(r as RawFd) }
}

/// Kinds of map used here.
#[derive(Clone, Copy, Debug)]
pub enum MapType {
    /// `BPF_MAP_TYPE_HASH`: values found by an exact key.
    Hash = 1,
    /// `BPF_MAP_TYPE_ARRAY`.
    Array = 2,
    /// `BPF_MAP_TYPE_LRU_HASH`: a hash whose least recently used elements make room
    /// for new ones when it is full.
    LruHash = 9,
    /// `BPF_MAP_TYPE_PERCPU_ARRAY`.
    PerCpuArray = 6,
    /// `BPF_MAP_TYPE_LPM_TRIE`: keys are a prefix length (`u32`, host order) and an
    /// address, looked up by longest prefix.
    LpmTrie = 11,
    /// `BPF_MAP_TYPE_XSKMAP`: AF_XDP sockets by index (the receive queue's, as a rule).
    XskMap = 17,
}

/// A map.
#[derive(Debug)]
pub struct Map {
    fd: OwnedFd,
    key_size: u32,
    value_size: u32,
    entries: u32,
    map_type: MapType,
}

#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

#[repr(C)]
#[derive(Default)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// `BPF_F_NO_PREALLOC`, which an LPM trie requires.
const BPF_F_NO_PREALLOC: u32 = 1;

impl Map {
    /// A new map indexed by `u32` (an array or an XSKMAP) of `entries` values of
    /// `value_size` bytes.
    pub fn new(map_type: MapType, value_size: u32, entries: u32, name: &str) -> io::Result<Map> {
        Map::create(map_type, 4, value_size, entries, name)
    }

    /// A new map of `entries` elements with keys of `key_size` bytes.
    pub fn create(
        map_type: MapType,
        key_size: u32,
        value_size: u32,
        entries: u32,
        name: &str,
    ) -> io::Result<Map> {
        let mut attr = MapCreateAttr {
            map_type: map_type as u32,
            key_size,
            value_size,
            max_entries: entries,
            map_flags: match map_type {
                // Memory as elements come, not all of it at once.
                MapType::LpmTrie | MapType::Hash => BPF_F_NO_PREALLOC,
                _ => 0,
            },
            ..Default::default()
        };
        for (d, s) in attr.map_name.iter_mut().zip(name.bytes().take(15)) {
            *d = s;
        }
        // SAFETY: a map-create attribute carries no pointer; the descriptor it returns is
        // new and ours alone.
        let fd = unsafe { take_fd(sys_bpf(BPF_MAP_CREATE, &mut attr)?) };
        Ok(Map {
            fd,
            key_size,
            value_size,
            entries,
            map_type,
        })
    }

    /// Bytes of one element as the kernel exchanges it (per-CPU maps: one slot per
    /// possible CPU, each rounded up to 8 bytes).
    pub fn element_bytes(&self) -> io::Result<usize> {
        Ok(match self.map_type {
            MapType::Array
            | MapType::Hash
            | MapType::LruHash
            | MapType::LpmTrie
            | MapType::XskMap => self.value_size as usize,
            MapType::PerCpuArray => {
                possible_cpus()? * (self.value_size as usize).next_multiple_of(8)
            }
        })
    }

    /// Writes element `index` (`value` must be `element_bytes()` long).
    pub fn set(&self, index: u32, value: &[u8]) -> io::Result<()> {
        if index >= self.entries || value.len() != self.element_bytes()? {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "map index or value size out of range",
            ));
        }
        let mut attr = MapElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            key: &index as *const u32 as u64,
            value: value.as_ptr() as u64,
            ..Default::default()
        };
        // SAFETY: `key` points at `index` (4 bytes, the map's key size) and `value` at
        // `value`, whose length was checked to be the element size the kernel reads;
        // both live across the call.
        unsafe { sys_bpf(BPF_MAP_UPDATE_ELEM, &mut attr) }.map(|_| ())
    }

    /// Writes the element of `key` (`key_size` bytes) with `value` (`element_bytes()`).
    pub fn update(&self, key: &[u8], value: &[u8]) -> io::Result<()> {
        if key.len() != self.key_size as usize || value.len() != self.element_bytes()? {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "map key or value size wrong",
            ));
        }
        let mut attr = MapElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            key: key.as_ptr() as u64,
            value: value.as_ptr() as u64,
            ..Default::default()
        };
        // SAFETY: `key` and `value` were checked to be the key and element sizes the
        // kernel reads; both live across the call.
        unsafe { sys_bpf(BPF_MAP_UPDATE_ELEM, &mut attr) }.map(|_| ())
    }

    /// Deletes the element of `key` (`key_size` bytes).
    pub fn delete(&self, key: &[u8]) -> io::Result<()> {
        if key.len() != self.key_size as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "map key size wrong",
            ));
        }
        let mut attr = MapElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            key: key.as_ptr() as u64,
            ..Default::default()
        };
        // SAFETY: `key` was checked to be the key size the kernel reads; it lives across
        // the call, and a delete reads no value.
        unsafe { sys_bpf(BPF_MAP_DELETE_ELEM, &mut attr) }.map(|_| ())
    }

    /// Reads element `index`.
    pub fn get(&self, index: u32) -> io::Result<Vec<u8>> {
        let mut value = vec![0u8; self.element_bytes()?];
        let mut attr = MapElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            key: &index as *const u32 as u64,
            value: value.as_mut_ptr() as u64,
            ..Default::default()
        };
        // SAFETY: `key` points at `index` (4 bytes); `value` at a buffer of the element
        // size, which is what the kernel writes; both live across the call.
        unsafe { sys_bpf(BPF_MAP_LOOKUP_ELEM, &mut attr)? };
        Ok(value)
    }
}

/// Number of possible CPUs (the size of per-CPU map values), from sysfs.
pub fn possible_cpus() -> io::Result<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let mut n = 0;
    for range in text.trim().split(',') {
        let (a, b) = range.split_once('-').unwrap_or((range, range));
        let parse = |s: &str| {
            s.parse::<usize>()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
        };
        n = n.max(parse(b)? + 1);
        let _ = parse(a)?;
    }
    Ok(n)
}

#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
    /// The rest of the attribute's union, zero.
    _rest: [u64; 4],
}

/// `BPF_XDP`, the attach type of an XDP link.
const ATTACH_XDP: u32 = 37;
/// `BPF_TCX_INGRESS`, the attach type of a traffic-control ingress link.
const ATTACH_TCX_INGRESS: u32 = 46;
/// The program type of a traffic-control classifier (`BPF_PROG_TYPE_SCHED_CLS`).
pub const PROG_TYPE_SCHED_CLS: u32 = 3;

/// How an XDP program is attached to a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpMode {
    /// In the driver, before any socket buffer is made (`XDP_FLAGS_DRV_MODE`).
    Driver = 4,
    /// After the socket buffer is made, on any link (`XDP_FLAGS_SKB_MODE`).
    Generic = 2,
}

#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    /// Explicit, so that it is zero: the kernel rejects an attribute whose bytes past the
    /// last field it knows are not all zero, and implicit padding is uninitialised.
    _tail: u32,
}

/// The XDP program type.
pub const PROG_TYPE_XDP: u32 = 6;
/// The attach type an XDP program attached by a BPF link is loaded for.
pub const ATTACH_TYPE_XDP: u32 = ATTACH_XDP;

/// A loaded program.
#[derive(Debug)]
pub struct Program {
    fd: OwnedFd,
}

/// The result of one `BPF_PROG_TEST_RUN`.
#[derive(Clone, Copy, Debug)]
pub struct TestRun {
    /// The program's return value on the last run.
    pub retval: u32,
    /// Mean nanoseconds per run, as the kernel timed it.
    pub duration_ns: u32,
}

impl Program {
    /// Loads `insns` as a program of `prog_type` under the GPL (which `bpf_fib_lookup`
    /// requires). On rejection, the error carries the verifier's log.
    pub fn load(prog_type: u32, insns: &[Insn], name: &str) -> io::Result<Program> {
        Program::load_for(prog_type, 0, insns, name)
    }

    /// As [`Program::load`], for `expected_attach_type` (`BPF_XDP` for an XDP program
    /// attached by a BPF link).
    pub fn load_for(
        prog_type: u32,
        expected_attach_type: u32,
        insns: &[Insn],
        name: &str,
    ) -> io::Result<Program> {
        let license = CString::new("GPL").expect("no NUL");
        let mut log = vec![0u8; 1 << 16];
        let mut attr = ProgLoadAttr {
            prog_type,
            insn_cnt: insns.len() as u32,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level: 1,
            log_size: log.len() as u32,
            log_buf: log.as_mut_ptr() as u64,
            expected_attach_type,
            ..Default::default()
        };
        for (d, s) in attr.prog_name.iter_mut().zip(name.bytes().take(15)) {
            *d = s;
        }
        // SAFETY: `insns` points at `insns.len()` instructions (the count given), `license`
        // at a NUL-terminated string, `log_buf` at a buffer of `log_size` bytes the kernel
        // may write; all live across the call.
        match unsafe { sys_bpf(BPF_PROG_LOAD, &mut attr) } {
            Ok(fd) => Ok(Program {
                // SAFETY: the descriptor the kernel just returned is new and ours alone.
                fd: unsafe { take_fd(fd) },
            }),
            Err(e) => {
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                let text = String::from_utf8_lossy(&log[..end]);
                Err(io::Error::new(
                    e.kind(),
                    format!("program rejected ({e}): {text}"),
                ))
            }
        }
    }

    /// Attaches the program (an XDP one) to interface `ifindex` in `mode`, through a BPF
    /// link: it stays attached while the returned descriptor is open, and is detached
    /// when it closes, however the process ends.
    pub fn attach_xdp(&self, ifindex: u32, mode: XdpMode) -> io::Result<OwnedFd> {
        let mut attr = LinkCreateAttr {
            prog_fd: self.fd.as_raw_fd() as u32,
            target_ifindex: ifindex,
            attach_type: ATTACH_XDP,
            flags: mode as u32,
            ..Default::default()
        };
        // SAFETY: a link-create attribute for XDP carries no pointer; the descriptor it
        // returns is new and ours alone.
        Ok(unsafe { take_fd(sys_bpf(BPF_LINK_CREATE, &mut attr)?) })
    }

    /// Attaches the program (a `BPF_PROG_TYPE_SCHED_CLS` one) to the traffic-control
    /// ingress of interface `ifindex` (tcx), through a BPF link: attached while the
    /// returned descriptor is open.
    pub fn attach_tc_ingress(&self, ifindex: u32) -> io::Result<OwnedFd> {
        let mut attr = LinkCreateAttr {
            prog_fd: self.fd.as_raw_fd() as u32,
            target_ifindex: ifindex,
            attach_type: ATTACH_TCX_INGRESS,
            ..Default::default()
        };
        // SAFETY: a tcx link-create attribute with no relative program carries no
        // pointer; the descriptor it returns is new and ours alone.
        Ok(unsafe { take_fd(sys_bpf(BPF_LINK_CREATE, &mut attr)?) })
    }

    /// Runs the program once on `data` with context `ctx` (in the calling thread's
    /// network namespace), and returns its return value with the frame as the program
    /// left it.
    pub fn test_run_frame(&self, data: &[u8], ctx: &[u8]) -> io::Result<(u32, Vec<u8>)> {
        // Room for what a program may grow the frame by.
        let mut out = vec![0u8; data.len() + 256];
        let mut attr = TestRunAttr {
            prog_fd: self.fd.as_raw_fd() as u32,
            data_size_in: data.len() as u32,
            data_in: data.as_ptr() as u64,
            data_size_out: out.len() as u32,
            data_out: out.as_mut_ptr() as u64,
            repeat: 1,
            ctx_size_in: ctx.len() as u32,
            ctx_in: if ctx.is_empty() {
                0
            } else {
                ctx.as_ptr() as u64
            },
            ..Default::default()
        };
        // SAFETY: `data_in` points at `data` and `ctx_in` at `ctx` (or is null), each of
        // the length given; `data_out` points at `out`, of `data_size_out` bytes, which
        // the kernel writes at most (it reports a longer frame as an error). All live
        // across the call.
        unsafe { sys_bpf(BPF_PROG_TEST_RUN, &mut attr)? };
        out.truncate(attr.data_size_out as usize);
        Ok((attr.retval, out))
    }

    /// Runs the program `repeat` times on `data` with context `ctx` (in the calling
    /// thread's network namespace).
    pub fn test_run(&self, data: &[u8], ctx: &[u8], repeat: u32) -> io::Result<TestRun> {
        let mut attr = TestRunAttr {
            prog_fd: self.fd.as_raw_fd() as u32,
            data_size_in: data.len() as u32,
            data_in: data.as_ptr() as u64,
            repeat,
            ctx_size_in: ctx.len() as u32,
            // An empty context must be a null pointer, not a dangling one.
            ctx_in: if ctx.is_empty() {
                0
            } else {
                ctx.as_ptr() as u64
            },
            ..Default::default()
        };
        // SAFETY: `data_in` points at `data` (its length given) and `ctx_in` at `ctx` (its
        // length given, or null when empty); no output buffer is given, so the kernel
        // writes only into `attr`. Both live across the call.
        unsafe { sys_bpf(BPF_PROG_TEST_RUN, &mut attr)? };
        Ok(TestRun {
            retval: attr.retval,
            duration_ns: attr.duration,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_encode_as_the_kernel_expects() {
        // Reference encodings from the kernel's filter.h macros.
        let bytes = |i: Insn| -> [u8; 8] {
            let mut b = [0u8; 8];
            b[0] = i.code;
            b[1] = i.regs;
            b[2..4].copy_from_slice(&i.off.to_le_bytes());
            b[4..8].copy_from_slice(&i.imm.to_le_bytes());
            b
        };
        assert_eq!(bytes(mov_imm(R0, 2)), [0xb7, 0x00, 0, 0, 2, 0, 0, 0]);
        assert_eq!(bytes(mov_reg(R6, R1)), [0xbf, 0x16, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            bytes(load(Size::W, R1, R6, 12)),
            [0x61, 0x61, 12, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            bytes(store_imm(Size::DW, R10, -8, 0)),
            [0x7a, 0x0a, 0xf8, 0xff, 0, 0, 0, 0]
        );
        assert_eq!(
            bytes(store_reg(Size::W, R10, -4, R8)),
            [0x63, 0x8a, 0xfc, 0xff, 0, 0, 0, 0]
        );
        assert_eq!(bytes(jeq_imm(R0, 0, 3)), [0x15, 0x00, 3, 0, 0, 0, 0, 0]);
        assert_eq!(bytes(call(HELPER_FIB_LOOKUP)), [0x85, 0, 0, 0, 69, 0, 0, 0]);
        assert_eq!(bytes(exit()), [0x95, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(std::mem::size_of::<Insn>(), 8);
        // No implicit padding anywhere: every byte the kernel reads is one we set.
        assert_eq!(std::mem::size_of::<TestRunAttr>(), 80);
        assert_eq!(std::mem::size_of::<MapCreateAttr>(), 7 * 4 + 16);
        assert_eq!(std::mem::size_of::<MapElemAttr>(), 32);
        assert_eq!(std::mem::size_of::<ProgLoadAttr>(), 72);
        assert_eq!(std::mem::size_of::<LinkCreateAttr>(), 4 * 4 + 32);
        assert_eq!(
            bytes(jne_imm(R5, 0x40, -2)),
            [0x55, 0x05, 0xfe, 0xff, 0x40, 0, 0, 0]
        );
        assert_eq!(bytes(jgt_reg(R4, R3, 7)), [0x2d, 0x34, 7, 0, 0, 0, 0, 0]);
        assert_eq!(bytes(rsh_imm(R0, 32)), [0x77, 0x00, 0, 0, 32, 0, 0, 0]);
        // BPF_LDX | BPF_MEM | BPF_H; BPF_ALU64 | BPF_ADD | BPF_X; BPF_LSH | BPF_K;
        // BPF_JEQ | BPF_X.
        assert_eq!(
            bytes(load(Size::H, R5, R2, 40)),
            [0x69, 0x25, 40, 0, 0, 0, 0, 0]
        );
        assert_eq!(bytes(add_reg(R7, R5)), [0x0f, 0x57, 0, 0, 0, 0, 0, 0]);
        assert_eq!(bytes(lsh_imm(R5, 8)), [0x67, 0x05, 0, 0, 8, 0, 0, 0]);
        assert_eq!(bytes(jeq_reg(R5, R7, 4)), [0x1d, 0x75, 4, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn possible_cpus_is_at_least_the_online_count() {
        assert!(possible_cpus().unwrap() >= std::thread::available_parallelism().unwrap().get());
    }
}
