//! The kernel builds (instruction sets) this crate compiles, which of them this machine runs
//! (from the features [`CpuFeatures`] says this process uses), and each build's decode
//! tolerance. Which one a backend runs is chosen in `decode::calibrate`.

use super::features::{CpuFeatures, Missing, HIDE_VAR};
use crate::decode::kernels::RowKind;
use crate::tolerance::Tolerance;

/// The selected instruction set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    /// [`Isa::Avx512`] plus BF16 and VBMI: bf16 and fp8 rows go through the kernels of
    /// `avx512bf16` (bf16 operands, f32 accumulation); every other kind as on `Avx512`.
    #[cfg(target_arch = "x86_64")]
    Avx512Bf16,
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    Scalar,
}

/// The builds this machine runs, in [`Isa::ALL`]'s order. CPUID settles every pair but one:
/// whether the bf16-operand build outruns the plain AVX-512 one depends on the core (faster
/// on Zen 4, where it was written; slower on Zen 5 and on Intel's Emerald Rapids), so
/// [`CpuBackend::new`](crate::CpuBackend::new) times the two (`decode::calibrate`).
pub(crate) fn available() -> Vec<Isa> {
    Isa::ALL.iter().copied().filter(|i| i.runs()).collect()
}

/// Whether this machine runs the AVX-512 kernels (the safe wrappers check it before every
/// call into them).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx512() -> bool {
    Isa::Avx512.runs()
}

/// Whether this machine runs the bf16-operand kernels.
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx512_bf16() -> bool {
    Isa::Avx512Bf16.runs()
}

/// Whether this machine runs the AVX2 + FMA builds.
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx2() -> bool {
    Isa::Avx2.runs()
}

impl Isa {
    /// Every build of the kernels this target compiles, best first.
    pub(crate) const ALL: &'static [Isa] = &[
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Bf16,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2,
        Isa::Scalar,
    ];

    /// The CPU features the build needs.
    fn features(self) -> &'static [&'static str] {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Bf16 => &[
                "avx512f",
                "avx512bw",
                "avx512vl",
                "avx512bf16",
                "avx512vbmi",
            ],
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => &["avx512f", "avx512bw", "avx512vl"],
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => &["avx2", "fma", "f16c"],
            Isa::Scalar => &[],
        }
    }

    /// Whether this machine runs the build (detected once for every build).
    pub(crate) fn runs(self) -> bool {
        static RUNS: std::sync::OnceLock<Vec<bool>> = std::sync::OnceLock::new();
        let runs = RUNS.get_or_init(|| Isa::ALL.iter().map(|i| i.runs_here().is_ok()).collect());
        Isa::ALL
            .iter()
            .position(|&i| i == self)
            .is_some_and(|k| runs[k])
    }

    /// The build's name, as reports print it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Bf16 => "avx512-bf16",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => "avx512",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => "avx2",
            Isa::Scalar => "scalar",
        }
    }

    /// The build named `name` (as [`Isa::name`] prints it).
    pub(crate) fn named(name: &str) -> Result<Isa, String> {
        Isa::ALL
            .iter()
            .copied()
            .find(|i| i.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = Isa::ALL.iter().map(|i| i.name()).collect();
                format!("no kernel build {name:?} (builds: {})", names.join(", "))
            })
    }

    /// Whether this machine runs the build; if not, the CPU features it lacks and those
    /// `KVLAYOUT_CPU_HIDE` hides ([`CpuFeatures`]).
    pub(crate) fn runs_here(self) -> Result<(), String> {
        let cpu = CpuFeatures::get();
        let (mut absent, mut hidden) = (Vec::new(), Vec::new());
        for &f in self.features() {
            match cpu.missing(f) {
                Some(Missing::Absent) => absent.push(f),
                Some(Missing::Hidden) => hidden.push(f),
                None => {}
            }
        }
        let mut why = Vec::new();
        if !absent.is_empty() {
            why.push(format!("this machine lacks {}", absent.join(", ")));
        }
        if !hidden.is_empty() {
            why.push(format!("{HIDE_VAR} hides {}", hidden.join(", ")));
        }
        if why.is_empty() {
            Ok(())
        } else {
            Err(why.join("; "))
        }
    }

    /// Whether this is one of the AVX-512 builds.
    pub(crate) fn avx512(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 | Isa::Avx512Bf16 => true,
            _ => false,
        }
    }

    /// How far this build's decode of rows of `dtype` may lie from the reference: bf16
    /// products where rows go through the bf16-operand kernels, f32 products otherwise.
    pub(crate) fn decode_tolerance(self, dtype: kvlayout::DType) -> Tolerance {
        match RowKind::of(dtype) {
            Ok(kind) if self.bf16_operands(kind) => Tolerance::BF16_PRODUCTS,
            _ => Tolerance::F32_PRODUCTS,
        }
    }

    /// Whether rows of `kind` go through the bf16-operand kernels.
    pub(crate) fn bf16_operands(self, kind: RowKind) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Bf16 => {
                matches!(kind, RowKind::Bf16 | RowKind::Fp8E4m3 | RowKind::Fp8E5m2)
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The backend runs one of the builds this machine runs, listed first and once among them;
    /// where both AVX-512 builds run, the choice between them was timed; elsewhere it is the
    /// first build, and the reason names each build not run, with why.
    #[test]
    fn the_chosen_build_comes_first() {
        let builds = crate::CpuBackend::kernel_builds();
        let mut sorted: Vec<&str> = builds.clone();
        sorted.sort_by_key(|b| Isa::ALL.iter().position(|i| i.name() == *b));
        let names: Vec<&str> = available().iter().map(|i| i.name()).collect();
        assert_eq!(sorted, names);
        let be = crate::CpuBackend::new(Some(1));
        assert_eq!(builds[0], be.kernel_build());
        assert_eq!(crate::CpuBackend::kernels(), be.kernel_build());
        let why = be.kernel_choice();
        let timed = names.contains(&"avx512-bf16") && names.contains(&"avx512");
        if std::env::var(crate::decode::calibrate::OVERRIDE).is_err() {
            if timed {
                assert!(why.starts_with("timed at start-up"), "{why}");
            } else {
                assert_eq!(builds[0], names[0]);
                for isa in Isa::ALL {
                    if let Err(not_run) = isa.runs_here() {
                        let named = format!("{}: {not_run}", isa.name());
                        assert!(why.contains(&named), "{why}");
                    }
                }
            }
        }
        assert!(!why.is_empty());
    }
}
