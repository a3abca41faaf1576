//! Instruction-set forms: the lookups compiled once per level of x86-64, and the fastest
//! one this CPU runs chosen at run time, when a table is made.
//!
//! fibre is built for baseline x86-64, so one binary runs on every x86-64 CPU. The code
//! that lookups spend their time in is compiled three times, as DPDK compiles its
//! lookup functions and picks one when a table is created:
//!
//! - [`Form::Avx512`]: the range tree's node and leaf steps as AVX-512 compares (two a
//!   node, one a leaf), everything else as in the AVX2 form;
//! - [`Form::Avx2`]: AVX2 compares (four a node), and `POPCNT`, `TZCNT` and the BMI
//!   instructions for the trie's bitmaps (x86-64-v3);
//! - [`Form::Portable`]: plain Rust, no instruction beyond baseline x86-64 (the
//!   popcounts become a dozen shifts and adds each).
//!
//! A table holds a [`Runnable`] form: a form together with the proof that this CPU has
//! its instructions. Only [`Runnable::new`] makes a proof, after asking the CPU (and
//! [`Avx512::avx2`] one from another, the AVX-512 form's features including AVX2's), so code
//! compiled for a form runs only where that form can run; everything that calls into a
//! form's code goes through a `Runnable` (the `unsafe` blocks that do so say why they are
//! sound by pointing here). A test run forces each form this CPU has on the same tables
//! and checks them against each other ([`crate::Table::set_form`]).

use std::fmt;
use std::str::FromStr;

/// A compiled form of the lookups: which instructions they use.
///
/// Ordered from the most widely available to the fastest: a CPU that runs a form runs
/// every form before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Form {
    /// Baseline x86-64 (or any other architecture): no vector compares, software
    /// popcounts.
    Portable,
    /// x86-64-v3: AVX2 compares, `POPCNT`, `BMI1`, `BMI2`, `LZCNT`.
    Avx2,
    /// The AVX2 form plus AVX-512F and AVX-512VL compares.
    Avx512,
}

impl Form {
    /// Every form, from the most widely available to the fastest.
    pub const ALL: [Form; 3] = [Form::Portable, Form::Avx2, Form::Avx512];

    /// The fastest form this CPU runs.
    pub fn best() -> Form {
        Runnable::best().form()
    }

    /// True if this CPU has the instructions of this form.
    pub fn is_supported(self) -> bool {
        Runnable::new(self).is_some()
    }

    /// The form's name in reports and on the command line: `portable`, `avx2`, `avx512`.
    pub fn name(self) -> &'static str {
        match self {
            Form::Portable => "portable",
            Form::Avx2 => "avx2",
            Form::Avx512 => "avx512",
        }
    }

    /// The CPU features the form needs, as `/proc/cpuinfo` names them.
    pub fn features(self) -> &'static str {
        match self {
            Form::Portable => "none",
            Form::Avx2 => "avx2, bmi1, bmi2, abm (lzcnt), popcnt",
            Form::Avx512 => "avx512f, avx512vl and those of avx2",
        }
    }
}

impl fmt::Display for Form {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Form {
    type Err = String;
    fn from_str(s: &str) -> Result<Form, String> {
        Form::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| format!("unknown form {s:?} (expected portable, avx2 or avx512)"))
    }
}

/// The environment variable that caps the form tables take when they are made: with
/// `FIBRE_FORM=avx2` on an AVX-512 machine, every table in the process runs the AVX2
/// form, as on a machine without AVX-512 (to measure one form against another, or to
/// stay off instructions that slow a core's clock). Unset: the fastest this CPU runs.
pub const FORM_CAP_VARIABLE: &str = "FIBRE_FORM";

/// The cap read from [`FORM_CAP_VARIABLE`], once a process.
static FORM_CAP: std::sync::OnceLock<Form> = std::sync::OnceLock::new();

/// The cap `value` (the variable's, if set) gives: the form it names; none (the fastest
/// form) if unset, and, said on standard error, if it names no form.
fn form_cap(value: Option<String>) -> Form {
    let fastest = Form::Avx512;
    match value.as_deref().map(str::parse::<Form>) {
        None => fastest,
        Some(Ok(form)) => form,
        Some(Err(e)) => {
            eprintln!("fibre: {FORM_CAP_VARIABLE}: {e}; taking the fastest form this CPU runs");
            fastest
        }
    }
}

/// A form this CPU cannot run was asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnsupportedForm(pub Form);

impl fmt::Display for UnsupportedForm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "this CPU cannot run the {} form (it needs {}); the best it runs is {}",
            self.0,
            self.0.features(),
            Form::best()
        )
    }
}

impl std::error::Error for UnsupportedForm {}

/// Proof that this CPU has the features of the AVX2 form. Its field is private to this
/// module, and [`Runnable::new`] makes one only after detecting the features.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Avx2 {
    _detected: (),
}

/// Proof that this CPU has the features of the AVX-512 form (and so of the AVX2 one).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Avx512 {
    _detected: (),
}

#[cfg(target_arch = "x86_64")]
impl Avx512 {
    /// The AVX2 form's proof: the AVX-512 form's features include it.
    pub fn avx2(self) -> Avx2 {
        Avx2 { _detected: () }
    }
}

/// The portable form: runs anywhere, needs no proof.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Portable;

/// How code counts the bits of a word: the CPU's `POPCNT` instruction where a form proves
/// it is there, else plain Rust (a dozen shifts and adds on baseline x86-64).
///
/// Unlike a function compiled for a form, code using this stays inlinable into any
/// caller: the trie's single lookups use it, so that a caller's loop of them is compiled
/// as one piece, as in a build for the CPU (a call per lookup measured twice as slow on
/// the full IPv4 table, the calls' instructions crowding the lookups' memory reads out
/// of the core's window).
pub(crate) trait Popcount: Copy {
    /// The number of bits set in `x`.
    fn count(self, x: u64) -> u32;
}

impl Popcount for Portable {
    #[inline(always)]
    fn count(self, x: u64) -> u32 {
        x.count_ones()
    }
}

#[cfg(target_arch = "x86_64")]
impl Popcount for Avx2 {
    #[inline(always)]
    fn count(self, x: u64) -> u32 {
        #[cfg(miri)]
        return x.count_ones();
        #[cfg(not(miri))]
        {
            let n: u64;
            // SAFETY: `self` proves that this CPU has POPCNT (`Runnable::new` detects it
            // for the AVX2 form). The instruction reads and writes only the two registers
            // named, and the flags.
            unsafe {
                std::arch::asm!(
                    "popcnt {n}, {x}",
                    x = in(reg) x,
                    n = lateout(reg) n,
                    options(pure, nomem, nostack)
                );
            }
            n as u32
        }
    }
}

/// A form this CPU runs, with the proof of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Runnable {
    /// Baseline instructions.
    Portable,
    /// x86-64-v3.
    #[cfg(target_arch = "x86_64")]
    Avx2(Avx2),
    /// x86-64-v3 with AVX-512F and VL.
    #[cfg(target_arch = "x86_64")]
    Avx512(Avx512),
}

/// Marks the functions given as compiled for the AVX2 form. Calling one is sound only
/// with an [`Avx2`] in hand (or an [`Avx512`]): the features here are the ones
/// [`Runnable::new`] detects for it.
macro_rules! avx2_form {
    ($($item:item)*) => {$(
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
        $item
    )*};
}

/// Marks the functions given as compiled for the AVX-512 form, as [`avx2_form!`] does.
macro_rules! avx512_form {
    ($($item:item)*) => {$(
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx512f,avx512vl,avx2,bmi1,bmi2,lzcnt,popcnt")]
        $item
    )*};
}

pub(crate) use {avx2_form, avx512_form};

impl Runnable {
    /// `form`, if this CPU has its instructions.
    pub fn new(form: Form) -> Option<Runnable> {
        match form {
            Form::Portable => Some(Runnable::Portable),
            #[cfg(target_arch = "x86_64")]
            Form::Avx2 => has_avx2().then_some(Runnable::Avx2(Avx2 { _detected: () })),
            #[cfg(target_arch = "x86_64")]
            Form::Avx512 => has_avx512().then_some(Runnable::Avx512(Avx512 { _detected: () })),
            #[cfg(not(target_arch = "x86_64"))]
            _ => None,
        }
    }

    /// The fastest form this CPU runs, within the cap [`FORM_CAP_VARIABLE`] sets.
    pub fn best() -> Runnable {
        let cap = *FORM_CAP.get_or_init(|| form_cap(std::env::var(FORM_CAP_VARIABLE).ok()));
        Form::ALL
            .into_iter()
            .rev()
            .filter(|&f| f <= cap)
            .find_map(Runnable::new)
            .unwrap_or(Runnable::Portable)
    }

    /// Which form this is.
    pub fn form(self) -> Form {
        match self {
            Runnable::Portable => Form::Portable,
            #[cfg(target_arch = "x86_64")]
            Runnable::Avx2(_) => Form::Avx2,
            #[cfg(target_arch = "x86_64")]
            Runnable::Avx512(_) => Form::Avx512,
        }
    }

    /// The AVX2 form's proof, if this form includes it (AVX2 or AVX-512).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub fn avx2(self) -> Option<Avx2> {
        match self {
            Runnable::Portable => None,
            Runnable::Avx2(cpu) => Some(cpu),
            Runnable::Avx512(cpu) => Some(cpu.avx2()),
        }
    }

    /// Every form this CPU runs, from the most widely available.
    #[cfg(test)]
    pub fn all() -> Vec<Runnable> {
        Form::ALL.into_iter().filter_map(Runnable::new).collect()
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("bmi1")
        && std::is_x86_feature_detected!("bmi2")
        && std::is_x86_feature_detected!("lzcnt")
        && std::is_x86_feature_detected!("popcnt")
}

#[cfg(target_arch = "x86_64")]
fn has_avx512() -> bool {
    has_avx2()
        && std::is_x86_feature_detected!("avx512f")
        && std::is_x86_feature_detected!("avx512vl")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_are_ordered_and_parse_by_name() {
        for f in Form::ALL {
            assert_eq!(f.name().parse::<Form>(), Ok(f));
            assert_eq!(f.to_string(), f.name());
        }
        assert!(Form::Portable < Form::Avx2 && Form::Avx2 < Form::Avx512);
        assert!("avx".parse::<Form>().is_err());
    }

    #[test]
    fn a_cpu_runs_every_form_below_its_best() {
        let best = Form::best();
        assert!(Form::Portable.is_supported());
        for f in Form::ALL {
            assert_eq!(f.is_supported(), f <= best, "{f}");
            if let Some(r) = Runnable::new(f) {
                assert_eq!(r.form(), f);
            }
        }
        assert_eq!(Runnable::best().form(), best);
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "under Miri, detection sees only the features the build enables"
    )]
    fn detection_agrees_with_the_cpu_flags_linux_reports() {
        // /proc/cpuinfo is the kernel's own reading of the CPU: the two must agree.
        let info = std::fs::read_to_string("/proc/cpuinfo").expect("Linux has /proc/cpuinfo");
        let flags: Vec<&str> = info
            .lines()
            .find_map(|l| l.strip_prefix("flags"))
            .map(|l| l.trim_start_matches([' ', '\t', ':']).split(' ').collect())
            .unwrap_or_default();
        let has = |f: &str| flags.contains(&f);
        let avx2 = ["avx2", "bmi1", "bmi2", "abm", "popcnt"]
            .iter()
            .all(|f| has(f));
        assert_eq!(Form::Avx2.is_supported(), avx2, "flags: {flags:?}");
        assert_eq!(
            Form::Avx512.is_supported(),
            avx2 && has("avx512f") && has("avx512vl"),
            "flags: {flags:?}"
        );
    }

    #[test]
    fn an_unsupported_form_says_what_it_needs() {
        let e = UnsupportedForm(Form::Avx512).to_string();
        assert!(e.contains("avx512f, avx512vl"), "{e}");
        assert!(e.contains(Form::best().name()), "{e}");
    }

    /// The cap names a form, and is no cap when unset or when it names none.
    #[test]
    fn the_form_cap_names_a_form_or_is_none() {
        assert_eq!(form_cap(None), Form::Avx512);
        assert_eq!(form_cap(Some("avx2".into())), Form::Avx2);
        assert_eq!(form_cap(Some("portable".into())), Form::Portable);
        assert_eq!(form_cap(Some("sse9".into())), Form::Avx512);
        assert!(Runnable::best().form() <= form_cap(std::env::var(FORM_CAP_VARIABLE).ok()));
    }
}
