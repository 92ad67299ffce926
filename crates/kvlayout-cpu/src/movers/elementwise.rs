//! The movers' path for layouts the move plan cannot express (a field's index split into
//! chunks of two different sizes on the two sides): each element copied through both field
//! maps, in parallel over block pairs.

use kvlayout::ops::Moves;
use kvlayout::{FieldMap, KvCacheLayout};
use rayon::prelude::*;

use super::Buffers;
use crate::backend::CpuBackend;

/// Copies every stored element of each move, byte for byte, from `src`'s address to `dst`'s
/// (see the soundness note of `super::run`). The layouts hold the same content (checked by
/// the moves' constructors).
pub(super) fn copy_elements(
    be: &CpuBackend,
    src: &KvCacheLayout,
    dst: &KvCacheLayout,
    m: &Moves,
    bufs: &Buffers,
) {
    let fields: Vec<(FieldMap, FieldMap)> = src
        .stored_fields()
        .iter()
        .map(|a| (*a, dst.field_map(a.field).expect("same content")))
        .collect();
    be.pool.install(|| {
        m.pairs.par_iter().for_each(|&pair| {
            for (a, b) in &fields {
                copy_field(a, b, m, pair, bufs);
            }
        });
    });
}

/// One field of one block pair.
fn copy_field(a: &FieldMap, b: &FieldMap, m: &Moves, (sb, db): (u64, u64), bufs: &Buffers) {
    let e = a.elem_bytes() as usize;
    let (sp, sl) = bufs.src[a.strides.buffer as usize];
    let (dp, dl) = bufs.dst[b.strides.buffer as usize];
    for l in 0..a.num_layers {
        for h in m.heads.clone() {
            let dh = h - m.heads.start + m.dst_head0;
            for n in 0..a.num_slots {
                for d in 0..a.width {
                    let so = a.offset_unchecked(l, sb, h, n, d) as usize;
                    let dof = b.offset_unchecked(l, db, dh, n, d) as usize;
                    assert!(so + e <= sl && dof + e <= dl, "element inside its buffer");
                    // SAFETY: in bounds (asserted), disjoint from other workers' writes and
                    // from the source (see `super::run`).
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            (sp as *const u8).add(so),
                            dp.get().add(dof),
                            e,
                        )
                    };
                }
            }
        }
    }
}
