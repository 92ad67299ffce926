//! Memory that ends right at an inaccessible page, so that a read or write of one byte past a
//! buffer faults (and fails the test run) instead of touching a neighbour; the decode's tests
//! read caches in it, and `no_write_past_the_buffers` here writes into it with every op.

/// Memory of `len` bytes that ends right at an inaccessible page.
pub(crate) struct Guarded {
    base: *mut libc::c_void,
    map_len: usize,
    len: usize,
}

impl Guarded {
    pub(crate) fn new(bytes: &[u8]) -> Guarded {
        // SAFETY: `sysconf` has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let len = bytes.len();
        let data = len.div_ceil(page) * page;
        let map_len = data + page;
        // SAFETY: an anonymous private mapping of `map_len` bytes, checked below; the last
        // page is then made inaccessible and the data copied to end right before it.
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(base, libc::MAP_FAILED, "mmap");
            let guard = base.cast::<u8>().add(data);
            assert_eq!(libc::mprotect(guard.cast(), page, libc::PROT_NONE), 0);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), guard.sub(len), len);
            Guarded { base, map_len, len }
        }
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `bytes`, and `&mut self` makes the access exclusive.
        unsafe {
            let end = self.base.cast::<u8>().add(self.map_len - self.page());
            std::slice::from_raw_parts_mut(end.sub(self.len), self.len)
        }
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the `len` bytes before the guard page are mapped, initialized and live
        // as long as `self`.
        unsafe {
            let end = self.base.cast::<u8>().add(self.map_len - self.page());
            std::slice::from_raw_parts(end.sub(self.len), self.len)
        }
    }

    fn page(&self) -> usize {
        // SAFETY: `sysconf` has no preconditions.
        unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.base, self.map_len) };
    }
}

/// `write_kv` and every mover write no byte past a buffer: each destination buffer ends right
/// at an inaccessible page, and the ops write the last block (every dtype the row encoders
/// take, widths that leave partial vectors, K and V separate or packed); the results match
/// the reference.
#[test]
fn no_write_past_the_buffers() {
    use crate::{reference, Activations, CacheMut, CacheRef, CpuBackend, HostCache, WriteKv};
    use kvlayout::KvCacheLayout;
    let be = CpuBackend::new(Some(2));
    for dtype in ["f32", "bf16", "fp8_e4m3", "fp8_e5m2", "int8"] {
        for (d, place) in [
            (36, "order=HND"),
            (76, "order=NHD"),
            (36, "legacy=separate-hnd"),
        ] {
            for kind in ["kv", "kv-scaled"] {
                if kind == "kv-scaled" && !(dtype == "int8" || dtype.starts_with("fp8")) {
                    continue;
                }
                if kind == "kv-scaled" && place.starts_with("legacy") {
                    continue;
                }
                let spec = format!("{kind} L=1 B=3 N=16 H=2 D={d} dtype={dtype} {place}");
                let l: KvCacheLayout = spec.parse().unwrap();
                // Every slot written: the last block's last rows end at the buffers' ends.
                let slots: Vec<i64> = (0..48).collect();
                let k: Vec<f32> = (0..48 * 2 * d)
                    .map(|i| (i % 97) as f32 * 0.03 - 1.4)
                    .collect();
                let w = WriteKv {
                    layer: 0,
                    key: Activations::F32(&k),
                    value: Some(Activations::F32(&k)),
                    slot_mapping: &slots,
                };
                let mut want = HostCache::new(l.clone()).unwrap();
                reference::write_kv(&mut want.as_mut(), &w).unwrap();
                let want = want;
                let zeros: Vec<Vec<u8>> = (0..l.num_buffers())
                    .map(|i| vec![0u8; want.bytes(i).len()])
                    .collect();
                let mut dst: Vec<Guarded> = zeros.iter().map(|z| Guarded::new(z)).collect();
                let same = |dst: &[Guarded], what: &str| {
                    for (i, g) in dst.iter().enumerate() {
                        assert!(g.bytes() == want.bytes(i), "{spec}: {what}, buffer {i}");
                    }
                };
                {
                    let bufs: Vec<&mut [u8]> = dst.iter_mut().map(Guarded::bytes_mut).collect();
                    be.write_kv(&mut CacheMut::new(&l, bufs).unwrap(), &w)
                        .unwrap();
                }
                same(&dst, "write_kv");
                // copy_blocks onto the last block, convert and swap into guarded caches.
                {
                    let mut c = want.clone();
                    be.copy_blocks(&mut c.as_mut(), &[(0, 2)]).unwrap();
                    let mut r = want.clone();
                    reference::copy_blocks(&mut r.as_mut(), &[(0, 2)]).unwrap();
                    let mut g: Vec<Guarded> = (0..l.num_buffers())
                        .map(|i| Guarded::new(want.bytes(i)))
                        .collect();
                    let bufs: Vec<&mut [u8]> = g.iter_mut().map(Guarded::bytes_mut).collect();
                    be.copy_blocks(&mut CacheMut::new(&l, bufs).unwrap(), &[(0, 2)])
                        .unwrap();
                    for (i, gi) in g.iter().enumerate() {
                        assert!(gi.bytes() == r.bytes(i), "{spec}: copy_blocks, buffer {i}");
                    }
                }
                let mut conv: Vec<Guarded> = zeros.iter().map(|z| Guarded::new(z)).collect();
                {
                    let bufs: Vec<&mut [u8]> = conv.iter_mut().map(Guarded::bytes_mut).collect();
                    be.convert(&want.as_ref(), &mut CacheMut::new(&l, bufs).unwrap())
                        .unwrap();
                }
                same(&conv, "convert");
                let mut swap: Vec<Guarded> = zeros.iter().map(|z| Guarded::new(z)).collect();
                {
                    let bufs: Vec<&mut [u8]> = swap.iter_mut().map(Guarded::bytes_mut).collect();
                    let pairs = [(0, 0), (1, 1), (2, 2)];
                    be.swap_blocks(
                        &want.as_ref(),
                        &mut CacheMut::new(&l, bufs).unwrap(),
                        &pairs,
                    )
                    .unwrap();
                }
                same(&swap, "swap_blocks");
                // gather the last block into a guarded staging cache, scatter it back.
                let staging: KvCacheLayout =
                    format!("{kind} L=1 B=1 N=16 H=2 D={d} dtype={dtype} {place}")
                        .parse()
                        .unwrap();
                let sz: Vec<Vec<u8>> = (0..staging.num_buffers())
                    .map(|i| vec![0u8; HostCache::new(staging.clone()).unwrap().bytes(i).len()])
                    .collect();
                let mut st: Vec<Guarded> = sz.iter().map(|z| Guarded::new(z)).collect();
                {
                    let bufs: Vec<&mut [u8]> = st.iter_mut().map(Guarded::bytes_mut).collect();
                    let mut s = CacheMut::new(&staging, bufs).unwrap();
                    be.gather_blocks(&want.as_ref(), &[2], 0..2, &mut s)
                        .unwrap();
                }
                let mut back: Vec<Guarded> = zeros.iter().map(|z| Guarded::new(z)).collect();
                {
                    let sb: Vec<&[u8]> = st.iter().map(Guarded::bytes).collect();
                    let s = CacheRef::new(&staging, sb).unwrap();
                    let bufs: Vec<&mut [u8]> = back.iter_mut().map(Guarded::bytes_mut).collect();
                    be.scatter_blocks(&s, &[2], 0..2, &mut CacheMut::new(&l, bufs).unwrap())
                        .unwrap();
                }
                let mut r = HostCache::new(l.clone()).unwrap();
                let mut rs = HostCache::new(staging.clone()).unwrap();
                reference::gather_blocks(&want.as_ref(), &[2], 0..2, &mut rs.as_mut()).unwrap();
                reference::scatter_blocks(&rs.as_ref(), &[2], 0..2, &mut r.as_mut()).unwrap();
                for (i, gi) in back.iter().enumerate() {
                    assert!(
                        gi.bytes() == r.bytes(i),
                        "{spec}: gather then scatter, buffer {i}"
                    );
                }
            }
        }
    }
    // A convert large enough for the streaming stores (10 MiB, 512-byte units) into a
    // destination that ends at the guard.
    let src: KvCacheLayout = "kv L=1 B=160 N=16 H=8 D=128 dtype=f16 order=NHD"
        .parse()
        .unwrap();
    let dst: KvCacheLayout = "kv L=1 B=160 N=16 H=8 D=128 dtype=f16 order=HND"
        .parse()
        .unwrap();
    let mut a = HostCache::new(src).unwrap();
    for (i, b) in a.bytes_mut(0).iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let mut want = HostCache::new(dst.clone()).unwrap();
    reference::convert(&a.as_ref(), &mut want.as_mut()).unwrap();
    let mut g = Guarded::new(&vec![0u8; want.bytes(0).len()]);
    be.convert(
        &a.as_ref(),
        &mut CacheMut::new(&dst, vec![g.bytes_mut()]).unwrap(),
    )
    .unwrap();
    assert!(g.bytes() == want.bytes(0), "streamed convert");
}
