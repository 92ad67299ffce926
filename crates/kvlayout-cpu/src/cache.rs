//! A cache in host memory: a layout plus one byte buffer per allocation, checked once.

use kvlayout::ops::OpError;
use kvlayout::KvCacheLayout;

use crate::hostbuf::HostBuffer;

fn check(layout: &KvCacheLayout, lens_addrs: &[(usize, usize)]) -> Result<(), OpError> {
    let buffers: Vec<(u64, u64)> = lens_addrs
        .iter()
        .map(|&(len, addr)| (len as u64, addr as u64))
        .collect();
    kvlayout::ops::check_buffers(layout, &buffers)
}

/// A cache to read: its layout and buffers, checked by [`CacheRef::new`] (one per buffer of the
/// layout, each covering its extent and aligned for its elements). The fields are private, so
/// every `CacheRef` an op receives has passed that check:
///
/// ```compile_fail
/// let l: kvlayout::KvCacheLayout = "kv B=2 N=16 H=1 D=8 dtype=f16 order=NHD".parse().unwrap();
/// let short = kvlayout_cpu::CacheRef { layout: &l, buffers: vec![&[0u8; 4][..]] };
/// ```
///
/// ```
/// let l: kvlayout::KvCacheLayout = "kv B=2 N=16 H=1 D=8 dtype=f16 order=NHD".parse()?;
/// assert!(kvlayout_cpu::CacheRef::new(&l, vec![&[0u8; 4][..]]).is_err()); // 1024 bytes needed
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct CacheRef<'a> {
    /// The layout every access goes through.
    pub(crate) layout: &'a KvCacheLayout,
    /// One byte slice per buffer.
    pub(crate) buffers: Vec<&'a [u8]>,
}

/// A cache to write, checked as [`CacheRef`] is.
#[derive(Debug)]
pub struct CacheMut<'a> {
    /// The layout every access goes through.
    pub(crate) layout: &'a KvCacheLayout,
    /// One byte slice per buffer.
    pub(crate) buffers: Vec<&'a mut [u8]>,
}

impl<'a> CacheRef<'a> {
    /// Checks that each buffer covers its extent and is aligned for its elements.
    pub fn new(layout: &'a KvCacheLayout, buffers: Vec<&'a [u8]>) -> Result<Self, OpError> {
        let la: Vec<(usize, usize)> = buffers
            .iter()
            .map(|b| (b.len(), b.as_ptr() as usize))
            .collect();
        check(layout, &la)?;
        Ok(CacheRef { layout, buffers })
    }

    /// The layout every access goes through.
    pub fn layout(&self) -> &'a KvCacheLayout {
        self.layout
    }

    /// The buffers, one per buffer of the layout.
    pub fn buffers(&self) -> &[&'a [u8]] {
        &self.buffers
    }
}

impl<'a> CacheMut<'a> {
    /// Checks that each buffer covers its extent and is aligned for its elements.
    pub fn new(layout: &'a KvCacheLayout, buffers: Vec<&'a mut [u8]>) -> Result<Self, OpError> {
        let la: Vec<(usize, usize)> = buffers
            .iter()
            .map(|b| (b.len(), b.as_ptr() as usize))
            .collect();
        check(layout, &la)?;
        Ok(CacheMut { layout, buffers })
    }

    /// The layout every access goes through.
    pub fn layout(&self) -> &'a KvCacheLayout {
        self.layout
    }

    /// The buffers, one per buffer of the layout, to write (another backend's kernels on
    /// host memory: the emulator's).
    pub fn buffers_mut(&mut self) -> &mut [&'a mut [u8]] {
        &mut self.buffers
    }

    /// A read-only view of the same cache.
    pub fn as_ref(&self) -> CacheRef<'_> {
        CacheRef {
            layout: self.layout,
            buffers: self.buffers.iter().map(|b| &**b).collect(),
        }
    }
}

/// A cache that owns its buffers (zero-filled, each as long as its extent, 64-byte aligned;
/// buffers of 2 MiB or more on huge pages where the system offers them), for running
/// [`CpuBackend`](crate::CpuBackend) or [`ScalarReference`](crate::ScalarReference) directly.
/// (The `Host` backend's cache is [`HostBuffers`](crate::HostBuffers).)
///
/// ```
/// use kvlayout_cpu::{Activations, CpuBackend, HostCache, HostExec, WriteKv};
/// let layout: kvlayout::KvCacheLayout = "kv L=1 B=2 N=16 H=1 D=8 dtype=f32 order=LBNHC".parse()?;
/// let mut cache = HostCache::new(layout)?;
/// let (k, v): (Vec<f32>, Vec<f32>) = ((0..8).map(|d| d as f32).collect(), vec![-1.0; 8]);
/// let w = WriteKv {
///     layer: 0,
///     key: Activations::F32(&k),
///     value: Some(Activations::F32(&v)),
///     slot_mapping: &[17], // block 1, token 1
/// };
/// CpuBackend::new(Some(1)).write_kv(&mut cache.as_mut(), &w)?;
/// let at = cache.layout().offset(&kvlayout::Coord::new(kvlayout::Field::K, 0, 1, 0, 1, 5))?;
/// let bytes = &cache.bytes(at.buffer as usize)[at.offset as usize..][..4];
/// assert_eq!(f32::from_le_bytes(bytes.try_into()?), 5.0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct HostCache {
    layout: KvCacheLayout,
    buffers: Vec<HostBuffer>,
}

impl std::fmt::Debug for HostCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let lens: Vec<usize> = self.buffers.iter().map(|b| b.as_slice().len()).collect();
        write!(f, "HostCache({}, {lens:?} bytes)", self.layout)
    }
}

impl HostCache {
    /// Allocates zeroed buffers for a layout. Buffers of 2 MiB or more are mapped on Linux:
    /// their pages read as zero and are backed when first written, so a large cache costs
    /// nothing up front. More memory than the machine can map is an `OutOfMemory` error.
    pub fn new(layout: KvCacheLayout) -> Result<Self, OpError> {
        let mut buffers = Vec::new();
        for x in layout.extents() {
            let len = usize::try_from(x.end).map_err(|_| OpError::BufferTooShort {
                buffer: buffers.len(),
                len: usize::MAX as u64,
                needed: x.end,
            })?;
            let b = HostBuffer::try_zeroed(len).map_err(|()| OpError::OutOfMemory {
                buffer: buffers.len(),
                bytes: x.end,
            })?;
            buffers.push(b);
        }
        Ok(HostCache { layout, buffers })
    }

    /// The layout.
    pub fn layout(&self) -> &KvCacheLayout {
        &self.layout
    }

    /// Buffer `i` as bytes.
    pub fn bytes(&self, i: usize) -> &[u8] {
        self.buffers[i].as_slice()
    }

    /// Buffer `i` as mutable bytes.
    pub fn bytes_mut(&mut self, i: usize) -> &mut [u8] {
        self.buffers[i].as_mut_slice()
    }

    /// Fills every byte of every buffer with `v` (sentinels for tests).
    pub fn fill(&mut self, v: u8) {
        for b in &mut self.buffers {
            b.as_mut_slice().fill(v);
        }
    }

    /// Read access for ops.
    pub fn as_ref(&self) -> CacheRef<'_> {
        CacheRef {
            layout: &self.layout,
            buffers: self.buffers.iter().map(HostBuffer::as_slice).collect(),
        }
    }

    /// Write access for ops.
    pub fn as_mut(&mut self) -> CacheMut<'_> {
        CacheMut {
            layout: &self.layout,
            buffers: self
                .buffers
                .iter_mut()
                .map(HostBuffer::as_mut_slice)
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache of 1 PiB (2^33 blocks of 128 KiB): a typed error naming the buffer and its
    /// size, not an abort. A cache of 3 GiB reads as zero and, on Linux, occupies no memory
    /// until written (resident set before and after, with room for other tests running).
    #[test]
    fn allocation() {
        let huge: KvCacheLayout = "kv B=8589934592 N=16 H=8 D=128 dtype=f32 order=NHD"
            .parse()
            .unwrap();
        assert_eq!(
            HostCache::new(huge).unwrap_err(),
            OpError::OutOfMemory {
                buffer: 0,
                bytes: 1 << 50
            }
        );
        let big: KvCacheLayout = "kv B=24576 N=16 H=8 D=128 dtype=f32 order=NHD"
            .parse()
            .unwrap();
        let before = resident_bytes();
        let mut c = HostCache::new(big).unwrap();
        let after = resident_bytes();
        let n = c.bytes(0).len();
        assert_eq!(n, 3 << 30);
        c.bytes_mut(0)[n - 1] = 1;
        assert_eq!(
            (c.bytes(0)[0], c.bytes(0)[n / 2], c.bytes(0)[n - 1]),
            (0, 0, 1)
        );
        if let (Some(b), Some(a)) = (before, after) {
            assert!(
                a < b + (256 << 20),
                "3 GiB cache made {} MiB resident",
                (a - b) >> 20
            );
        }
    }

    /// This process's resident set in bytes (Linux), from `/proc/self/statm`.
    fn resident_bytes() -> Option<u64> {
        let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
        let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
        Some(pages * 4096)
    }
}
