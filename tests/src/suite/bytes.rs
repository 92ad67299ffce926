//! Byte sets of a cache's elements, computed from the field strides, and the comparisons of
//! downloaded bytes the suite makes.

use std::ops::Range;

use crate::cases::Rng;
use kvlayout::KvCacheLayout;
use kvlayout_cpu::HostCache;

/// What a fresh cache holds before an op writes into it.
pub const SENTINEL: u8 = 0xA5;

/// A cache's bytes, one vector per buffer.
pub type Bytes = Vec<Vec<u8>>;
/// A set of a cache's bytes, one flag per byte of each buffer.
pub type Mask = Vec<Vec<bool>>;
/// A check's outcome: `Err` says what failed.
pub type Outcome<T> = Result<T, String>;

/// One `x` per byte of each of a layout's buffers.
fn per_byte<T: Clone>(l: &KvCacheLayout, x: T) -> Vec<Vec<T>> {
    l.extents()
        .iter()
        .map(|e| vec![x.clone(); e.end as usize])
        .collect()
}

/// Every byte of a layout's buffers the sentinel.
pub fn sentinel(l: &KvCacheLayout) -> Bytes {
    per_byte(l, SENTINEL)
}

/// Random bytes for a layout's buffers, seeded by `seed`.
pub fn random_bytes(l: &KvCacheLayout, seed: &str) -> Bytes {
    let lens: Vec<u64> = l.extents().iter().map(|x| x.end).collect();
    random_bytes_of(&lens, seed)
}

/// Random bytes for buffers of `lens` bytes, seeded by `seed`.
pub fn random_bytes_of(lens: &[u64], seed: &str) -> Bytes {
    let mut rng = Rng::new(seed);
    lens.iter().map(|&n| rng.bytes(n as usize)).collect()
}

/// The bytes of every stored element whose `(layer, block, head, slot)` is selected, from
/// the field strides written out (not the layout's offset function).
pub fn mask(l: &KvCacheLayout, sel: impl Fn(u64, u64, u64, u64) -> bool) -> Mask {
    let mut m = per_byte(l, false);
    for f in l.stored_fields() {
        let s = f.strides;
        let e = f.elem_bytes();
        let buf = &mut m[s.buffer as usize];
        for layer in 0..f.num_layers {
            for block in 0..f.num_blocks {
                for head in 0..f.num_heads {
                    for slot in 0..f.num_slots {
                        if !sel(layer, block, head, slot) {
                            continue;
                        }
                        let row = s.base_offset
                            + layer * s.layer
                            + block * s.block
                            + head * s.head
                            + slot * s.slot;
                        for d in 0..f.width {
                            let at =
                                row + (d / s.dim_split) * s.dim_chunk + (d % s.dim_split) * s.dim;
                            for b in at..at + e {
                                buf[b as usize] = true;
                            }
                        }
                    }
                }
            }
        }
    }
    m
}

/// The bytes of every stored element.
pub fn all_elements(l: &KvCacheLayout) -> Mask {
    mask(l, |_, _, _, _| true)
}

/// The bytes of the elements of `blocks` x `heads` (all layers, all slots).
pub fn blocks_mask(l: &KvCacheLayout, blocks: &[u64], heads: Range<u64>) -> Mask {
    mask(l, |_, b, h, _| blocks.contains(&b) && heads.contains(&h))
}

/// The union of `block_regions` of `blocks` x `heads` (all layers), as a mask.
pub fn regions_mask(l: &KvCacheLayout, blocks: &[u64], heads: Range<u64>) -> Outcome<Mask> {
    let mut m = per_byte(l, false);
    for &b in blocks {
        let regions = l
            .block_regions(b, 0..l.geometry().num_layers, heads.clone())
            .map_err(|e| format!("block_regions({b}): {e}"))?;
        for r in regions {
            let buf = m
                .get_mut(r.buffer as usize)
                .ok_or_else(|| format!("region in buffer {} of {}", r.buffer, l.num_buffers()))?;
            for x in r.offset..r.offset + r.len {
                *buf.get_mut(x as usize)
                    .ok_or_else(|| format!("region {r:?} past the extent"))? = true;
            }
        }
    }
    Ok(m)
}

/// Every byte outside `mask` equals `before` (or the sentinel when `before` is `None`).
pub fn untouched_outside(after: &Bytes, before: Option<&Bytes>, mask: &Mask) -> Outcome<()> {
    for (i, buf) in after.iter().enumerate() {
        for (o, &byte) in buf.iter().enumerate() {
            if mask[i][o] {
                continue;
            }
            let want = before.map_or(SENTINEL, |b| b[i][o]);
            if byte != want {
                return Err(format!(
                    "byte {o} of buffer {i} outside the written elements changed: {byte:#04x}, was {want:#04x}"
                ));
            }
        }
    }
    Ok(())
}

/// Equal on the bytes of `mask`.
pub fn equal_on(got: &Bytes, want: &Bytes, mask: &Mask) -> Outcome<()> {
    for (i, m) in mask.iter().enumerate() {
        for (o, &inside) in m.iter().enumerate() {
            if inside && got[i][o] != want[i][o] {
                return Err(format!(
                    "buffer {i} byte {o}: {:#04x}, expected {:#04x}",
                    got[i][o], want[i][o]
                ));
            }
        }
    }
    Ok(())
}

/// Equal, buffer for buffer and byte for byte.
pub fn byte_equal(got: &Bytes, want: &Bytes) -> Outcome<()> {
    if got.len() != want.len() {
        return Err(format!("{} buffers, expected {}", got.len(), want.len()));
    }
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if g.len() != w.len() {
            return Err(format!(
                "buffer {i}: {} bytes, expected {}",
                g.len(),
                w.len()
            ));
        }
        if let Some(o) = g.iter().zip(w).position(|(a, b)| a != b) {
            let n = g.iter().zip(w).filter(|(a, b)| a != b).count();
            return Err(format!(
                "buffer {i} differs from the reference at byte {o} ({:#04x} vs {:#04x}; {n} bytes differ)",
                g[o], w[o]
            ));
        }
    }
    Ok(())
}

/// A host copy of downloaded bytes, aligned, to read values through the reference.
pub fn host_cache(l: &KvCacheLayout, bytes: &Bytes) -> HostCache {
    let mut c = HostCache::new(l.clone()).expect("host cache");
    for (i, b) in bytes.iter().enumerate() {
        c.bytes_mut(i).copy_from_slice(b);
    }
    c
}

/// `|got - want| <= bound`, false for NaN.
pub fn within(got: f64, want: f64, bound: f64) -> bool {
    (got - want).abs() <= bound
}
