//! Compiles `kernels-hip/src/kvlayout.hip` to one code object per target with clang-19
//! (`scripts/kernels.sh OUT hip`) and writes `$OUT_DIR/embedded.rs`, which embeds them with
//! their SHA-256. Without clang-19 the crate builds with no code object (a warning says so,
//! and opening a device returns a typed error), unless `KVLAYOUT_REQUIRE_CLANG=1`, which
//! makes the missing compiler a build failure. `KVLAYOUT_CLANG` names another clang (and
//! `KVLAYOUT_READELF` another llvm-readelf, with which the script checks its output). A
//! toolchain that is present but fails to compile the kernels fails the build.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use sha2::{Digest, Sha256};

/// The code objects `scripts/kernels.sh` writes: target and wavefront width, in the order
/// the device tries them.
const OBJECTS: [(&str, u32); 3] = [("gfx90a", 64), ("gfx942", 64), ("gfx1100", 32)];

fn main() -> ExitCode {
    for path in [
        "../../kernels-cuda",
        "../../kernels-hip",
        "../../scripts/kernels.sh",
    ] {
        println!("cargo:rerun-if-changed={path}");
    }
    for var in [
        "KVLAYOUT_CLANG",
        "KVLAYOUT_REQUIRE_CLANG",
        "KVLAYOUT_READELF",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => {
            eprintln!("kvlayout-hip build: {why}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let out = PathBuf::from(env::var_os("OUT_DIR").ok_or("cargo did not set OUT_DIR")?);
    let manifest = PathBuf::from(
        env::var_os("CARGO_MANIFEST_DIR").ok_or("cargo did not set CARGO_MANIFEST_DIR")?,
    );
    let require = env::var("KVLAYOUT_REQUIRE_CLANG").is_ok_and(|v| v == "1");
    let clang = env::var("KVLAYOUT_CLANG").unwrap_or_else(|_| "clang-19".to_string());

    let readelf = env::var("KVLAYOUT_READELF").unwrap_or_else(|_| "llvm-readelf-19".to_string());

    let generated = match toolchain(&clang, &readelf) {
        Ok(_) => embed(&manifest, &out.join("kernels"))?,
        Err(why) => {
            let why = format!("{why}; no HIP code objects are embedded");
            if require {
                return Err(format!("KVLAYOUT_REQUIRE_CLANG=1 and {why}"));
            }
            println!("cargo:warning=kvlayout-hip: {why} (opening a HIP device will say so)");
            absent(&why)
        }
    };
    let file = out.join("embedded.rs");
    fs::write(&file, generated).map_err(|e| format!("writing {}: {e}", file.display()))
}

/// `Ok` when `program --version` runs, else why not.
fn runs(program: &str, hint: &str) -> Result<(), String> {
    let out = Command::new(program)
        .arg("--version")
        .output()
        .map_err(|e| format!("{program} cannot be run ({e}); {hint}"))?;
    if !out.status.success() {
        return Err(format!("`{program} --version` failed ({})", out.status));
    }
    Ok(())
}

/// `Ok` when what `scripts/kernels.sh` needs for the HIP side is here: clang, the lld it
/// links AMDGPU code objects with, and llvm-readelf; else what is missing.
fn toolchain(clang: &str, readelf: &str) -> Result<(), String> {
    runs(clang, "install clang-19 or set KVLAYOUT_CLANG")?;
    let lld = Command::new(clang)
        .arg("-print-prog-name=ld.lld")
        .output()
        .map_err(|e| format!("{clang} -print-prog-name=ld.lld: {e}"))?;
    let lld = String::from_utf8_lossy(&lld.stdout).trim().to_string();
    if !Path::new(&lld).is_file() {
        return Err(format!(
            "{clang} finds no ld.lld to link AMDGPU code objects (install lld-19)"
        ));
    }
    runs(readelf, "install llvm-19 or set KVLAYOUT_READELF")
}

/// Runs `scripts/kernels.sh <dir> hip` and returns the `embedded.rs` of what it wrote.
fn embed(manifest: &Path, dir: &Path) -> Result<String, String> {
    let script = manifest.join("../../scripts/kernels.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(dir)
        .arg("hip")
        .output()
        .map_err(|e| format!("running bash {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} {} hip failed ({}):\n{}{}",
            script.display(),
            dir.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let mut statics = String::new();
    let mut entries = String::new();
    for (arch, wave) in OBJECTS {
        let path = dir.join(format!("kvlayout.{arch}.co"));
        let bytes = fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        let sha256 = Sha256::digest(&bytes)
            .iter()
            .fold(String::new(), |mut s, b| {
                let _ = write!(s, "{b:02x}");
                s
            });
        let name = format!("CODE_OBJECT_{}", arch.to_uppercase());
        let path = path.to_str().ok_or_else(|| {
            format!(
                "{} is not UTF-8, include_bytes! cannot name it",
                path.display()
            )
        })?;
        let _ = writeln!(
            statics,
            "static {name}: Aligned<[u8; {len}]> = Aligned(*include_bytes!({path:?}));",
            len = bytes.len()
        );
        let _ = writeln!(
            entries,
            "    CodeObject {{ arch: {arch:?}, wavefront_size: {wave}, bytes: &{name}.0, \
             sha256: {sha256:?} }},"
        );
    }
    Ok(format!(
        "// Generated by build.rs from scripts/kernels.sh's output.\n\
         /// Bytes at a 64-byte boundary: the runtime parses the ELF image in place.\n\
         #[repr(C, align(64))]\n\
         struct Aligned<T>(T);\n\n\
         {statics}\n\
         static EMBEDDED: &[CodeObject] = &[\n{entries}];\n\n\
         static NOT_EMBEDDED: Option<&str> = None;\n"
    ))
}

/// The `embedded.rs` of a build without code objects.
fn absent(why: &str) -> String {
    format!(
        "// Generated by build.rs: no code objects.\n\
         static EMBEDDED: &[CodeObject] = &[];\n\n\
         static NOT_EMBEDDED: Option<&str> = Some({why:?});\n"
    )
}
