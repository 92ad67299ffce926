//! The code objects this build embedded: `kernels-hip/src/kvlayout.hip` compiled by
//! `scripts/kernels.sh` with clang-19 for each target (plain ELF, code object v5), with the
//! SHA-256 of each, so that a build can be compared with CI's. Empty when the build had no
//! clang-19 ([`why_not_embedded`] says so).

use std::fmt;

use kvlayout_device::kernels::GpuTarget;

/// One embedded code object.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct CodeObject {
    /// The target it was compiled for: `"gfx90a"`, `"gfx942"` or `"gfx1100"`.
    pub arch: &'static str,
    /// Wavefront width of its kernels: 64 (CDNA) or 32 (RDNA).
    pub wavefront_size: u32,
    /// The ELF image.
    pub bytes: &'static [u8],
    /// SHA-256 of `bytes`, lowercase hex.
    pub sha256: &'static str,
}

impl CodeObject {
    /// The launch limits of its kernels: [`GpuTarget::CDNA`] for wave64 objects,
    /// [`GpuTarget::RDNA`] for wave32 ones.
    pub fn target(&self) -> GpuTarget {
        if self.wavefront_size == 64 {
            GpuTarget::CDNA
        } else {
            GpuTarget::RDNA
        }
    }
}

impl fmt::Debug for CodeObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CodeObject")
            .field("arch", &self.arch)
            .field("wavefront_size", &self.wavefront_size)
            .field("bytes", &self.bytes.len())
            .field("sha256", &self.sha256)
            .finish()
    }
}

// `EMBEDDED: &[CodeObject]` and `NOT_EMBEDDED: Option<&str>`, written by build.rs.
include!(concat!(env!("OUT_DIR"), "/embedded.rs"));

/// The embedded code objects, in the order [`crate::HipDevice::open`] tries them (gfx90a,
/// gfx942, gfx1100); empty when the build had no clang-19.
pub fn code_objects() -> &'static [CodeObject] {
    EMBEDDED
}

/// Why no code object is embedded (`None` when they are).
pub fn why_not_embedded() -> Option<&'static str> {
    NOT_EMBEDDED
}

/// `EM_AMDGPU`.
const EM_AMDGPU: u16 = 224;
/// `SHT_NOBITS`: a section without file contents.
const SHT_NOBITS: u32 = 8;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// `Some(())` when `offset + count * size <= len`.
fn table_fits(len: usize, offset: u64, count: u64, size: u64) -> Option<()> {
    let end = count.checked_mul(size)?.checked_add(offset)?;
    (end <= len as u64).then_some(())
}

/// `Ok` when `image` is a little-endian ELF64 AMDGPU object whose header, program and
/// section header tables, and every section with file contents lie within it: the extent
/// the runtime reads, as it takes no length.
pub(crate) fn elf_extent(image: &[u8]) -> Result<(), &'static str> {
    const HEADER: usize = 64;
    if image.len() < HEADER || image[..4] != *b"\x7fELF" {
        return Err("no ELF header");
    }
    if image[4] != 2 || image[5] != 1 {
        return Err("not a little-endian ELF64 object");
    }
    let fields = || -> Option<(u16, u64, u64, u16, u16, u16, u16)> {
        Some((
            u16_at(image, 0x12)?,
            u64_at(image, 0x20)?,
            u64_at(image, 0x28)?,
            u16_at(image, 0x36)?,
            u16_at(image, 0x38)?,
            u16_at(image, 0x3a)?,
            u16_at(image, 0x3c)?,
        ))
    };
    let (machine, phoff, shoff, phentsize, phnum, shentsize, shnum) =
        fields().ok_or("truncated ELF header")?;
    if machine != EM_AMDGPU {
        return Err("not an AMDGPU object");
    }
    let len = image.len();
    table_fits(len, phoff, phnum.into(), phentsize.into()).ok_or("program headers past the end")?;
    table_fits(len, shoff, shnum.into(), shentsize.into()).ok_or("section headers past the end")?;
    if phnum > 0 && phentsize < 56 {
        return Err("program header entries too small");
    }
    if shnum > 0 && shentsize < 64 {
        return Err("section header entries too small");
    }
    for i in 0..u64::from(phnum) {
        let at = usize::try_from(phoff + i * u64::from(phentsize)).map_err(|_| "bad offset")?;
        let (offset, size) = (u64_at(image, at + 8), u64_at(image, at + 0x20));
        let (Some(offset), Some(size)) = (offset, size) else {
            return Err("truncated program header");
        };
        table_fits(len, offset, 1, size).ok_or("segment past the end")?;
    }
    for i in 0..u64::from(shnum) {
        let at = usize::try_from(shoff + i * u64::from(shentsize)).map_err(|_| "bad offset")?;
        let (kind, offset, size) = (
            u32_at(image, at + 4),
            u64_at(image, at + 0x18),
            u64_at(image, at + 0x20),
        );
        let (Some(kind), Some(offset), Some(size)) = (kind, offset, size) else {
            return Err("truncated section header");
        };
        if kind != SHT_NOBITS {
            table_fits(len, offset, 1, size).ok_or("section past the end")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_objects_are_complete_elf() {
        for o in code_objects() {
            assert_eq!(elf_extent(o.bytes), Ok(()), "{}", o.arch);
            assert_eq!(o.bytes.as_ptr() as usize % 64, 0, "{} alignment", o.arch);
        }
    }

    #[test]
    fn truncated_or_foreign_images_are_refused() {
        assert!(elf_extent(b"").is_err());
        assert!(elf_extent(&[0u8; 64]).is_err());
        if let Some(o) = code_objects().first() {
            assert!(elf_extent(&o.bytes[..o.bytes.len() - 1]).is_err());
            let mut foreign = o.bytes.to_vec();
            foreign[0x12] = 62; // EM_X86_64
            assert_eq!(elf_extent(&foreign), Err("not an AMDGPU object"));
        }
    }

    #[test]
    fn targets_follow_wavefront_width() {
        for o in code_objects() {
            let want = if o.arch.starts_with("gfx9") { 64 } else { 32 };
            assert_eq!(o.wavefront_size, want, "{}", o.arch);
            assert_eq!(o.target().warp, want);
        }
    }
}
