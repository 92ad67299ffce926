//! The NVRTC calls, and the `unsafe` blocks that make them: one source compiled to PTX for
//! one virtual architecture.

use std::ffi::{c_char, CString};

use cudarc::nvrtc::result;
use cudarc::nvrtc::sys;

use crate::error::{nvrtc, CudaError};

/// Whether the NVRTC library (libnvrtc) loads.
pub(crate) fn nvrtc_present() -> bool {
    // SAFETY: only tries to open each candidate library name; calls no NVRTC function.
    unsafe { sys::is_culib_present() }
}

/// A created program and the strings it points into; destroyed on drop.
struct Program {
    prog: sys::nvrtcProgram,
    /// Read by NVRTC until the program is destroyed.
    _source: CString,
    _name: CString,
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by `create_program` and destroyed once, here. A failure leaks the
        // program; nothing is left to report it to.
        let _ = unsafe { result::destroy_program(self.prog) };
    }
}

/// Text of a NUL-terminated buffer NVRTC wrote.
fn text(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// PTX of `source` (named `name` in diagnostics) for `arch` (`compute_XY`), compiled with
/// `-std=c++17` and otherwise NVRTC's defaults.
pub(crate) fn compile(source: &str, name: &str, arch: &str) -> Result<String, CudaError> {
    if !nvrtc_present() {
        return Err(CudaError::NoNvrtc {
            why: "libnvrtc (NVRTC 12) not found on the library path".into(),
        });
    }
    let valid = arch.starts_with("compute_")
        && arch.len() > "compute_".len()
        && arch.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !valid {
        return Err(CudaError::NoKernels {
            why: format!("{arch:?} is not a virtual architecture (compute_XY)"),
        });
    }
    let no_nul = |what: &str| CudaError::NoKernels {
        why: format!("{what} holds a NUL byte"),
    };
    let source = CString::new(source).map_err(|_| no_nul("the NVRTC source"))?;
    let cname = CString::new(name).map_err(|_| no_nul("the program name"))?;
    let prog = result::create_program(&source, Some(&cname)).map_err(nvrtc(
        "nvrtcCreateProgram",
        arch,
        String::new(),
    ))?;
    let prog = Program {
        prog,
        _source: source,
        _name: cname,
    };
    // `arch` is checked above, so neither option holds a NUL byte.
    let options = [
        "-std=c++17".to_string(),
        format!("--gpu-architecture={arch}"),
    ];
    // SAFETY: the program is live until `prog` drops.
    if let Err(e) = unsafe { result::compile_program(prog.prog, &options) } {
        // SAFETY: as above.
        let log = unsafe { result::get_program_log(prog.prog) }
            .map(|l| text(&l).trim_end().to_string())
            .unwrap_or_default();
        return Err(nvrtc("nvrtcCompileProgram", arch, log)(e));
    }
    // SAFETY: as above; the program compiled.
    let ptx =
        unsafe { result::get_ptx(prog.prog) }.map_err(nvrtc("nvrtcGetPTX", arch, String::new()))?;
    Ok(text(&ptx))
}
