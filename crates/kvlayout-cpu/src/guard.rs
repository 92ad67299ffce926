//! Memory that ends right at an inaccessible page, so that a read or write of one byte past a
//! buffer faults (and fails the test run) instead of touching a neighbour; the decode's tests
//! read caches in it, and `no_write_past_the_buffers` here writes into it with every op.

use kvlayout::KvCacheLayout;

use crate::{
    Activations, CacheMut, CacheRef, CpuBackend, HostCache, HostExec, ScalarReference, WriteKv,
};

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

/// Guarded buffers of lengths `lens`, buffer `i` filled with `fill(i)`.
fn guarded(lens: &[usize], fill: impl Fn(usize) -> Vec<u8>) -> Vec<Guarded> {
    (0..lens.len()).map(|i| Guarded::new(&fill(i))).collect()
}

/// The guarded buffers as a cache of `layout`, for an op to write.
fn as_cache<'a>(layout: &'a KvCacheLayout, g: &'a mut [Guarded]) -> CacheMut<'a> {
    let bufs: Vec<&mut [u8]> = g.iter_mut().map(Guarded::bytes_mut).collect();
    CacheMut::new(layout, bufs).unwrap()
}

/// Asserts the guarded buffers hold `want`'s bytes.
fn assert_holds(g: &[Guarded], want: &HostCache, what: &str) {
    for (i, gi) in g.iter().enumerate() {
        assert!(gi.bytes() == want.bytes(i), "{what}, buffer {i}");
    }
}

/// `write_kv` of every slot into guarded buffers; returns the reference's cache.
fn check_write(be: &CpuBackend, l: &KvCacheLayout, d: usize, spec: &str) -> HostCache {
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
    ScalarReference.write_kv(&mut want.as_mut(), &w).unwrap();
    let lens = buffer_lens(&want);
    let mut dst = guarded(&lens, |i| vec![0u8; lens[i]]);
    be.write_kv(&mut as_cache(l, &mut dst), &w).unwrap();
    assert_holds(&dst, &want, &format!("{spec}: write_kv"));
    want
}

fn buffer_lens(c: &HostCache) -> Vec<usize> {
    (0..c.layout().num_buffers())
        .map(|i| c.bytes(i).len())
        .collect()
}

/// `copy_blocks` onto the last block, `convert` and `swap_blocks` into guarded caches.
fn check_movers(be: &CpuBackend, want: &HostCache, spec: &str) {
    let l = want.layout();
    let lens = buffer_lens(want);
    let mut r = want.clone();
    ScalarReference
        .copy_blocks(&mut r.as_mut(), &[(0, 2)])
        .unwrap();
    let mut g = guarded(&lens, |i| want.bytes(i).to_vec());
    be.copy_blocks(&mut as_cache(l, &mut g), &[(0, 2)]).unwrap();
    assert_holds(&g, &r, &format!("{spec}: copy_blocks"));
    let mut conv = guarded(&lens, |i| vec![0u8; lens[i]]);
    be.convert(&want.as_ref(), &mut as_cache(l, &mut conv))
        .unwrap();
    assert_holds(&conv, want, &format!("{spec}: convert"));
    let mut swap = guarded(&lens, |i| vec![0u8; lens[i]]);
    let pairs = [(0, 0), (1, 1), (2, 2)];
    be.swap_blocks(&want.as_ref(), &mut as_cache(l, &mut swap), &pairs)
        .unwrap();
    assert_holds(&swap, want, &format!("{spec}: swap_blocks"));
}

/// Gathers the last block into a guarded staging cache of `staging`, scatters it back into
/// guarded zeros; the result matches the reference's.
fn check_gather_scatter(be: &CpuBackend, want: &HostCache, staging: &KvCacheLayout, spec: &str) {
    let l = want.layout();
    let st_lens = buffer_lens(&HostCache::new(staging.clone()).unwrap());
    let mut st = guarded(&st_lens, |i| vec![0u8; st_lens[i]]);
    be.gather_blocks(&want.as_ref(), &[2], 0..2, &mut as_cache(staging, &mut st))
        .unwrap();
    let lens = buffer_lens(want);
    let mut back = guarded(&lens, |i| vec![0u8; lens[i]]);
    let sb: Vec<&[u8]> = st.iter().map(Guarded::bytes).collect();
    let s = CacheRef::new(staging, sb).unwrap();
    be.scatter_blocks(&s, &[2], 0..2, &mut as_cache(l, &mut back))
        .unwrap();
    let mut r = HostCache::new(l.clone()).unwrap();
    let mut rs = HostCache::new(staging.clone()).unwrap();
    ScalarReference
        .gather_blocks(&want.as_ref(), &[2], 0..2, &mut rs.as_mut())
        .unwrap();
    ScalarReference
        .scatter_blocks(&rs.as_ref(), &[2], 0..2, &mut r.as_mut())
        .unwrap();
    assert_holds(&back, &r, &format!("{spec}: gather then scatter"));
}

/// `write_kv` and every mover write no byte past a buffer: each destination buffer ends right
/// at an inaccessible page, and the ops write the last block (every dtype the row encoders
/// take, widths that leave partial vectors, K and V separate or packed); the results match
/// the reference.
#[test]
fn no_write_past_the_buffers() {
    let be = CpuBackend::new(Some(2));
    for dtype in ["f32", "bf16", "fp8_e4m3", "fp8_e5m2", "int8"] {
        for (d, place) in [
            (36, "order=HND"),
            (76, "order=NHD"),
            (36, "tensor=separate-hnd"),
        ] {
            for kind in ["kv", "kv-scaled"] {
                let scaled_dtype = dtype == "int8" || dtype.starts_with("fp8");
                if kind == "kv-scaled" && (!scaled_dtype || place.starts_with("tensor")) {
                    continue;
                }
                let spec = format!("{kind} L=1 B=3 N=16 H=2 D={d} dtype={dtype} {place}");
                let l: KvCacheLayout = spec.parse().unwrap();
                let want = check_write(&be, &l, d, &spec);
                check_movers(&be, &want, &spec);
                let staging: KvCacheLayout =
                    format!("{kind} L=1 B=1 N=16 H=2 D={d} dtype={dtype} {place}")
                        .parse()
                        .unwrap();
                check_gather_scatter(&be, &want, &staging, &spec);
            }
        }
    }
}

/// A convert large enough for the streaming stores (10 MiB, 512-byte units) into a
/// destination that ends at the guard.
#[test]
fn no_streamed_write_past_the_buffer() {
    let be = CpuBackend::new(Some(2));
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
    ScalarReference
        .convert(&a.as_ref(), &mut want.as_mut())
        .unwrap();
    let mut g = Guarded::new(&vec![0u8; want.bytes(0).len()]);
    be.convert(
        &a.as_ref(),
        &mut CacheMut::new(&dst, vec![g.bytes_mut()]).unwrap(),
    )
    .unwrap();
    assert!(g.bytes() == want.bytes(0), "streamed convert");
}
