//! The kernel images: PTX compiled by clang-19 at build time and embedded, the one-file source
//! NVRTC compiles at run time, and the choice between them for a device.

use std::fmt;

use crate::error::CudaError;
use crate::nvrtc;

/// One PTX file of `scripts/kernels.sh`, embedded by the build script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbeddedPtx {
    /// Target: `"sm_80"` or `"sm_90"`.
    pub arch: &'static str,
    /// The file's bytes (PTX text, not NUL-terminated).
    pub ptx: &'static [u8],
    /// SHA-256 of `ptx`, lower-case hex, computed by the build script.
    pub sha256: &'static str,
}

include!(concat!(env!("OUT_DIR"), "/embedded.rs"));

/// The embedded PTX files; empty when the crate was built without clang-19.
pub fn embedded_ptx() -> &'static [EmbeddedPtx] {
    EMBEDDED
}

/// `kernels-cuda/src/kvlayout.cu` with its kernel headers inlined, for NVRTC.
pub fn nvrtc_source() -> &'static str {
    NVRTC_SOURCE
}

/// PTX of [`nvrtc_source`] for the virtual architecture `arch` (`"compute_90"`), compiled by
/// NVRTC with `-std=c++17` and otherwise its default options. A failed compile's error holds
/// NVRTC's log.
pub fn compile_nvrtc(arch: &str) -> Result<String, CudaError> {
    nvrtc::compile(NVRTC_SOURCE, "kvlayout.cu", arch)
}

/// The PTX ISA version of `ptx` (its `.version` directive), e.g. `"7.8"`.
pub fn ptx_version(ptx: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(ptx).ok()?;
    text.lines()
        .find_map(|l| l.trim_start().strip_prefix(".version"))
        .map(str::trim)
}

/// The environment variable that overrides the choice of kernels: `nvrtc` or `embedded`.
pub const KERNELS_ENV: &str = "KVLAYOUT_CUDA_KERNELS";

/// How [`choose_kernels`] may choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelPolicy {
    /// Embedded PTX when one fits the device, else NVRTC.
    Auto,
    /// Embedded PTX only.
    Embedded,
    /// NVRTC only.
    Nvrtc,
}

impl KernelPolicy {
    /// The policy a value of [`KERNELS_ENV`] names: unset or empty is [`KernelPolicy::Auto`].
    pub fn parse(value: Option<&str>) -> Result<KernelPolicy, CudaError> {
        match value.map(str::trim) {
            None | Some("") | Some("auto") => Ok(KernelPolicy::Auto),
            Some("embedded") => Ok(KernelPolicy::Embedded),
            Some("nvrtc") => Ok(KernelPolicy::Nvrtc),
            Some(other) => Err(CudaError::NoKernels {
                why: format!("{KERNELS_ENV}={other:?}: expected nvrtc, embedded or auto"),
            }),
        }
    }

    /// The policy [`KERNELS_ENV`] names in this process's environment.
    pub fn from_env() -> Result<KernelPolicy, CudaError> {
        let value = std::env::var(KERNELS_ENV).ok();
        KernelPolicy::parse(value.as_deref())
    }
}

/// The PTX a device loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelSource {
    /// Embedded at build time (clang-19).
    Embedded {
        /// `"sm_80"` or `"sm_90"`.
        arch: &'static str,
        /// SHA-256 of the PTX, hex.
        sha256: &'static str,
    },
    /// Compiled at open time by NVRTC.
    Nvrtc {
        /// `"compute_XY"` of the device.
        arch: String,
    },
}

impl fmt::Display for KernelSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelSource::Embedded { arch, sha256 } => {
                write!(f, "embedded {arch} PTX (sha256 {sha256})")
            }
            KernelSource::Nvrtc { arch } => write!(f, "NVRTC {arch} PTX"),
        }
    }
}

/// `(major, minor)` of a target `sm_XY` (`sm_90` is 9.0, `sm_100` is 10.0).
fn arch_capability(arch: &str) -> Option<(i32, i32)> {
    let n: i32 = arch.strip_prefix("sm_")?.parse().ok()?;
    Some((n / 10, n % 10))
}

/// The kernels for a device of compute capability `capability`: the embedded PTX of the
/// highest target the device runs (`sm_90` from 9.0, `sm_80` from 8.0), else NVRTC for
/// `compute_<major><minor>`, as `policy` allows.
pub fn choose_kernels(
    capability: (i32, i32),
    embedded: &[EmbeddedPtx],
    policy: KernelPolicy,
) -> Result<KernelSource, CudaError> {
    let nvrtc = || KernelSource::Nvrtc {
        arch: format!("compute_{}{}", capability.0, capability.1),
    };
    if policy == KernelPolicy::Nvrtc {
        return Ok(nvrtc());
    }
    let best = embedded
        .iter()
        .filter_map(|e| arch_capability(e.arch).map(|c| (c, e)))
        .filter(|(c, _)| *c <= capability)
        .max_by_key(|(c, _)| *c);
    match (best, policy) {
        (Some((_, e)), _) => Ok(KernelSource::Embedded {
            arch: e.arch,
            sha256: e.sha256,
        }),
        (None, KernelPolicy::Embedded) => Err(CudaError::NoKernels {
            why: format!(
                "{KERNELS_ENV}=embedded, but no embedded PTX runs on compute capability {}.{} \
                 (embedded: {})",
                capability.0,
                capability.1,
                if embedded.is_empty() {
                    "none; built without clang-19".to_string()
                } else {
                    embedded
                        .iter()
                        .map(|e| e.arch)
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ),
        }),
        (None, _) => Ok(nvrtc()),
    }
}

/// The NUL-terminated PTX of `source` and its ISA version.
pub(crate) fn kernel_image(source: &KernelSource) -> Result<(Vec<u8>, String), CudaError> {
    let mut ptx = match source {
        KernelSource::Embedded { arch, .. } => EMBEDDED
            .iter()
            .find(|e| e.arch == *arch)
            .map(|e| e.ptx.to_vec())
            .ok_or_else(|| CudaError::NoKernels {
                why: format!("no embedded {arch} PTX"),
            })?,
        KernelSource::Nvrtc { arch } => compile_nvrtc(arch)?.into_bytes(),
    };
    let version = ptx_version(&ptx).unwrap_or("unknown").to_string();
    ptx.push(0);
    Ok((ptx, version))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SM80: EmbeddedPtx = EmbeddedPtx {
        arch: "sm_80",
        ptx: b".version 7.8\n",
        sha256: "80",
    };
    const SM90: EmbeddedPtx = EmbeddedPtx {
        arch: "sm_90",
        ptx: b".version 7.8\n",
        sha256: "90",
    };

    fn embedded(arch: &'static str, sha256: &'static str) -> KernelSource {
        KernelSource::Embedded { arch, sha256 }
    }

    fn nvrtc(arch: &str) -> KernelSource {
        KernelSource::Nvrtc { arch: arch.into() }
    }

    #[test]
    fn auto_takes_the_highest_embedded_target_the_device_runs() {
        let both = [SM80, SM90];
        let auto = KernelPolicy::Auto;
        assert_eq!(
            choose_kernels((9, 0), &both, auto),
            Ok(embedded("sm_90", "90"))
        );
        assert_eq!(
            choose_kernels((10, 0), &both, auto),
            Ok(embedded("sm_90", "90"))
        );
        assert_eq!(
            choose_kernels((8, 9), &both, auto),
            Ok(embedded("sm_80", "80"))
        );
        assert_eq!(
            choose_kernels((8, 0), &both, auto),
            Ok(embedded("sm_80", "80"))
        );
        assert_eq!(choose_kernels((7, 5), &both, auto), Ok(nvrtc("compute_75")));
        assert_eq!(choose_kernels((9, 0), &[], auto), Ok(nvrtc("compute_90")));
    }

    #[test]
    fn the_policy_forces_or_forbids_nvrtc() {
        let both = [SM80, SM90];
        let forced = choose_kernels((9, 0), &both, KernelPolicy::Nvrtc);
        assert_eq!(forced, Ok(nvrtc("compute_90")));
        let e = choose_kernels((9, 0), &[], KernelPolicy::Embedded).unwrap_err();
        assert!(e.to_string().contains("built without clang-19"), "{e}");
        let e = choose_kernels((7, 5), &both, KernelPolicy::Embedded).unwrap_err();
        assert!(e.to_string().contains("sm_80, sm_90"), "{e}");
    }

    #[test]
    fn policies_parse_from_the_variable() {
        assert_eq!(KernelPolicy::parse(None), Ok(KernelPolicy::Auto));
        assert_eq!(KernelPolicy::parse(Some("")), Ok(KernelPolicy::Auto));
        assert_eq!(KernelPolicy::parse(Some("nvrtc")), Ok(KernelPolicy::Nvrtc));
        assert_eq!(
            KernelPolicy::parse(Some("embedded")),
            Ok(KernelPolicy::Embedded)
        );
        assert!(KernelPolicy::parse(Some("cubin")).is_err());
    }

    #[test]
    fn ptx_versions_read_the_directive() {
        assert_eq!(
            ptx_version(b"//\n.version 8.8\n.target sm_90\n"),
            Some("8.8")
        );
        assert_eq!(ptx_version(b".target sm_90\n"), None);
        for e in embedded_ptx() {
            assert_eq!(ptx_version(e.ptx), Some("7.8"), "{}", e.arch);
        }
    }

    #[test]
    fn the_nvrtc_source_has_every_kernel_header_inlined_once() {
        let s = nvrtc_source();
        for header in [
            "kvl_port.h",
            "kvlayout.h",
            "kvl_dtype.h",
            "kvl_kernels.h",
            "common.cuh",
            "kvl_plant.cuh",
            "write_kv.cuh",
            "paged_decode.cuh",
            "move_blocks.cuh",
        ] {
            assert_eq!(
                s.matches(&format!("#line 1 \"{header}\"")).count(),
                1,
                "{header}"
            );
            assert!(!s.contains(&format!("#include \"{header}\"\n")), "{header}");
        }
        for k in kvlayout_device::kernels::Kernel::ALL {
            assert!(s.contains(k.name()), "{}", k.name());
        }
    }
}
