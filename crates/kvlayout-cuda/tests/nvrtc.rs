//! NVRTC compiles the one-file kernel source for sm_80 and sm_90 with every entry's
//! parameters at the slots of `kvlayout_device::kernels::arg_slots`, as clang-19's PTX has them.
//! Skipped, visibly, where libnvrtc is not on the library path (scripts/setup.sh unpacks it
//! into the folder `scripts/nvrtc-path.sh` prints), unless `KVLAYOUT_REQUIRE_NVRTC=1`.

mod common;

use common::{check_entries, report, skip};
use kvlayout_cuda::{compile_nvrtc, kernels::ptx_version, CudaError};

/// PTX of the source for `arch`, or `None` after a visible skip when NVRTC is absent.
fn compile(arch: &str) -> Option<String> {
    match compile_nvrtc(arch) {
        Ok(ptx) => Some(ptx),
        Err(CudaError::NoNvrtc { why }) => {
            let why = format!("{why} (LD_LIBRARY_PATH=$(bash scripts/nvrtc-path.sh))");
            skip("nvrtc", &why, "KVLAYOUT_REQUIRE_NVRTC");
            None
        }
        Err(e) => panic!("{arch}: {e}"),
    }
}

#[test]
fn nvrtc_compiles_every_kernel_with_the_argument_slots() {
    for (arch, target) in [("compute_80", "sm_80"), ("compute_90", "sm_90")] {
        let Some(ptx) = compile(arch) else {
            return;
        };
        assert!(
            ptx.lines().any(|l| l.trim() == format!(".target {target}")),
            "{arch}: no .target {target}"
        );
        check_entries(&ptx, arch);
        let version = ptx_version(ptx.as_bytes()).unwrap_or("?");
        report(&format!(
            "nvrtc {arch}: PTX ISA {version}, {} bytes",
            ptx.len()
        ));
    }
}

#[test]
fn nvrtc_failures_are_typed_errors_with_the_log() {
    match compile_nvrtc("sm_90") {
        Err(CudaError::NoNvrtc { .. } | CudaError::NoKernels { .. }) => {}
        other => panic!("sm_90 is no virtual architecture: {other:?}"),
    }
    // An architecture NVRTC does not know: its log says so.
    match compile_nvrtc("compute_10") {
        Err(CudaError::NoNvrtc { why }) => skip("nvrtc errors", &why, "KVLAYOUT_REQUIRE_NVRTC"),
        Err(CudaError::Nvrtc {
            call, result, log, ..
        }) => {
            assert_eq!(call, "nvrtcCompileProgram");
            assert!(result.starts_with("NVRTC_ERROR"), "{result}");
            assert!(!log.is_empty() || result == "NVRTC_ERROR_INVALID_OPTION");
        }
        other => panic!("compute_10: {other:?}"),
    }
}
