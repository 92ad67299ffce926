//! The kernel builds (instruction sets) this crate compiles, which of them this machine runs
//! (runtime-detected once), and the order they are preferred in.

use super::RowKind;

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

/// The build [`CpuBackend::new`](crate::CpuBackend::new) picks: the first of [`ranked`].
pub(crate) fn detect() -> Isa {
    ranked().first().copied().unwrap_or(Isa::Scalar)
}

/// The builds this machine runs, in the order they are preferred: [`Isa::ALL`]'s, except
/// where [`widening_before_bf16_dot`] puts the plain AVX-512 build ahead of the bf16-operand
/// one.
pub(crate) fn ranked() -> Vec<Isa> {
    let builds: Vec<Isa> = Isa::ALL.iter().copied().filter(|i| i.runs()).collect();
    #[cfg(target_arch = "x86_64")]
    let builds = preferred(builds, widening_before_bf16_dot(&cpu_vendor()));
    builds
}

/// `builds` (in [`Isa::ALL`]'s order) in the order preferred: with `widening_first`, the
/// plain AVX-512 build and the bf16-operand one trade places; every other build keeps its
/// place (the bf16-operand build stays ahead of AVX2 and scalar, which it outruns).
#[cfg(target_arch = "x86_64")]
pub(crate) fn preferred(mut builds: Vec<Isa>, widening_first: bool) -> Vec<Isa> {
    let at = |builds: &[Isa], isa| builds.iter().position(|&i| i == isa);
    if let (true, Some(dot), Some(plain)) = (
        widening_first,
        at(&builds, Isa::Avx512Bf16),
        at(&builds, Isa::Avx512),
    ) {
        builds.swap(dot, plain);
    }
    builds
}

/// Whether CPUs of `vendor` (CPUID leaf 0) run bf16 and fp8 rows faster widened to f32 than
/// through `vdpbf16ps`: Intel's do.
///
/// On Intel's cores `vdpbf16ps` (32 bf16 products) costs 4.4 FMAs (16 f32 products each):
/// 0.74 against 0.17 ns, independent chains, on an Emerald Rapids (family 6, model 207) whose
/// hypervisor hides BF16 from CPUID but runs its instructions. There the bf16-operand kernels,
/// with rows in L2, took 51 ns per token x KV head for bf16 rows and 58 for fp8 e4m3, against
/// 33 and 40 for the AVX-512 kernels that widen rows. AMD's Zen 4, where the bf16-operand
/// kernels were written and measured, keeps them first.
pub(crate) fn widening_before_bf16_dot(vendor: &[u8; 12]) -> bool {
    vendor == b"GenuineIntel"
}

/// The CPU's vendor string (CPUID leaf 0), read once.
#[cfg(target_arch = "x86_64")]
pub(crate) fn cpu_vendor() -> [u8; 12] {
    static VENDOR: std::sync::OnceLock<[u8; 12]> = std::sync::OnceLock::new();
    *VENDOR.get_or_init(|| {
        // SAFETY (on toolchains where `__cpuid` is unsafe): leaf 0 exists on every x86_64
        // CPU and only reads identification registers.
        #[allow(unused_unsafe)]
        let id = unsafe { std::arch::x86_64::__cpuid(0) };
        let mut vendor = [0u8; 12];
        for (chunk, reg) in vendor.chunks_mut(4).zip([id.ebx, id.edx, id.ecx]) {
            chunk.copy_from_slice(&reg.to_le_bytes());
        }
        vendor
    })
}

/// Whether this machine runs the AVX-512 kernels (the safe wrappers check it before every
/// call into them).
#[cfg(target_arch = "x86_64")]
pub(super) fn has_avx512() -> bool {
    Isa::Avx512.runs()
}

/// Whether this machine runs the bf16-operand kernels.
#[cfg(target_arch = "x86_64")]
pub(super) fn has_avx512_bf16() -> bool {
    Isa::Avx512Bf16.runs()
}

/// Whether this machine runs the AVX2 + FMA builds.
#[cfg(target_arch = "x86_64")]
pub(super) fn has_avx2() -> bool {
    Isa::Avx2.runs()
}

/// Whether this machine has the CPU feature `name` (one of those [`Isa::features`] lists).
#[cfg(target_arch = "x86_64")]
fn feature_detected(name: &str) -> bool {
    use std::arch::is_x86_feature_detected as has;
    match name {
        "avx512f" => has!("avx512f"),
        "avx512bw" => has!("avx512bw"),
        "avx512vl" => has!("avx512vl"),
        "avx512bf16" => has!("avx512bf16"),
        "avx512vbmi" => has!("avx512vbmi"),
        "avx2" => has!("avx2"),
        "fma" => has!("fma"),
        "f16c" => has!("f16c"),
        _ => false,
    }
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

    /// Whether this machine runs the build; if not, the CPU features it lacks.
    pub(crate) fn runs_here(self) -> Result<(), String> {
        #[cfg(target_arch = "x86_64")]
        let missing: Vec<&str> = self
            .features()
            .iter()
            .copied()
            .filter(|f| !feature_detected(f))
            .collect();
        #[cfg(not(target_arch = "x86_64"))]
        let missing: Vec<&str> = self.features().to_vec();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("this machine lacks {}", missing.join(", ")))
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

/// Every instruction set this machine can run, in [`Isa::ALL`]'s order (tests run each).
#[cfg(test)]
pub(crate) fn available() -> Vec<Isa> {
    Isa::ALL.iter().copied().filter(|i| i.runs()).collect()
}
