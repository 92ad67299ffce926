//! Independent enumeration of a layout's domain, for reference checks.

use kvlayout::{Convention, Coord, Field, KvCacheLayout, ViewTarget};

/// Every coordinate of every readable field (stored fields first), in row-major order.
pub fn coords(l: &KvCacheLayout, stored_only: bool) -> Vec<Coord> {
    let fields = if stored_only {
        l.stored_fields().iter().map(|m| m.field).collect()
    } else {
        l.readable_fields()
    };
    let mut out = Vec::new();
    for field in fields {
        let m = l.field_map(field).expect("readable field");
        for layer in 0..m.num_layers {
            for block in 0..m.num_blocks {
                for head in 0..m.num_heads {
                    for slot in 0..m.num_slots {
                        for dim in 0..m.width {
                            out.push(Coord {
                                layer,
                                block,
                                head,
                                slot,
                                field,
                                dim,
                            });
                        }
                    }
                }
            }
        }
    }
    out
}

/// The reference address: `base + l*Ls + b*Bs + h*Hs + n*Ns + (d / x)*Xs + (d % x)*Ds`,
/// written out from the field's strides without calling the layout's offset function.
pub fn reference_offset(l: &KvCacheLayout, c: &Coord) -> (u32, u64) {
    // MLA's K and V are the latent's elements of the same index (V its first kv_lora_rank):
    // computed from the stored latent's map, not from the layout's derived maps.
    let stored = match c.field {
        Field::K | Field::V if l.content().shares_latent() => Field::Latent,
        field => field,
    };
    let m = l.field_map(stored).expect("readable field");
    let s = m.strides;
    let off = u128::from(s.base_offset)
        + u128::from(c.layer) * u128::from(s.layer)
        + u128::from(c.block) * u128::from(s.block)
        + u128::from(c.head) * u128::from(s.head)
        + u128::from(c.slot) * u128::from(s.slot)
        + u128::from(c.dim / s.dim_split) * u128::from(s.dim_chunk)
        + u128::from(c.dim % s.dim_split) * u128::from(s.dim);
    (
        s.buffer,
        u64::try_from(off).expect("validated layouts fit in 64 bits"),
    )
}

/// Maps a view multi-index back to the coordinate it must address (`x`: the vLLM key's
/// split, for that convention's key view).
pub fn coord_of(c: Convention, t: ViewTarget, layer: u64, x: u64, idx: &[u64]) -> Coord {
    let at = |field, b, h, n, d| Coord::new(field, layer, b, h, n, d);
    let kv = |i: u64| if i == 0 { Field::K } else { Field::V };
    match (c, t) {
        (Convention::Standard, ViewTarget::Field(f))
        | (Convention::FlashinferHnd, ViewTarget::Field(f)) => {
            at(f, idx[0], idx[1], idx[2], idx[3])
        }
        (Convention::VllmPagedV1, ViewTarget::Field(Field::K)) => {
            at(Field::K, idx[0], idx[1], idx[3], idx[2] * x + idx[4])
        }
        (Convention::VllmPagedV1, ViewTarget::Field(f)) => at(f, idx[0], idx[1], idx[3], idx[2]),
        (Convention::FlashAttn | Convention::Flashinfer, ViewTarget::Field(f)) => {
            at(f, idx[0], idx[2], idx[1], idx[3])
        }
        (Convention::FlashAttn, ViewTarget::Kv) => at(kv(idx[0]), idx[1], idx[3], idx[2], idx[4]),
        (Convention::Flashinfer, ViewTarget::Kv) => at(kv(idx[1]), idx[0], idx[3], idx[2], idx[4]),
        (Convention::FlashinferHnd, ViewTarget::Kv) => {
            at(kv(idx[1]), idx[0], idx[2], idx[3], idx[4])
        }
        other => panic!("no view expected for {other:?}"),
    }
}

pub fn for_each_index(shape: &[u64], mut f: impl FnMut(&[u64])) {
    let total: u64 = shape.iter().product();
    let mut idx = vec![0u64; shape.len()];
    for _ in 0..total {
        f(&idx);
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

pub const CONVENTIONS: [Convention; 5] = [
    Convention::Standard,
    Convention::VllmPagedV1,
    Convention::FlashAttn,
    Convention::Flashinfer,
    Convention::FlashinferHnd,
];
