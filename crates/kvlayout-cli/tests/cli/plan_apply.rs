//! The reference `plan` is checked against: a plan's JSON runs applied as memcpys from
//! random SRC bytes (a staged plan's into its staging cache, then scattered element by
//! element through the staging and DST offsets), and every element of every sequence's
//! tokens compared with its SRC element, both found by the descriptor's offset function.

use kvlayout::{tp_head_range, Coord, KvCacheLayout};
use serde_json::Value;

use super::{json_runs, place, Case};
use crate::u64s;

/// Random bytes (xorshift seeded with `seed`) in every buffer of `layout`.
fn random_buffers(layout: &KvCacheLayout, seed: u64) -> Vec<Vec<u8>> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    layout
        .extents()
        .iter()
        .map(|e| {
            (0..e.end)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x >> 24) as u8
                })
                .collect()
        })
        .collect()
}

fn zeros(lens: impl Iterator<Item = u64>) -> Vec<Vec<u8>> {
    lens.map(|n| vec![0; n as usize]).collect()
}

/// Copies every run from `src` into `dst`.
fn memcpy(src: &[Vec<u8>], dst: &mut [Vec<u8>], runs: &[[u64; 5]]) {
    for &[sb, so, db, doff, len] in runs {
        let (so, doff, len) = (so as usize, doff as usize, len as usize);
        let from = &src[sb as usize][so..so + len];
        dst[db as usize][doff..doff + len].copy_from_slice(from);
    }
}

/// Each element of one (layer, block, head, slot) in `layout`: its place and size.
fn elements(l: &KvCacheLayout, layer: u64, block: u64, head: u64, slot: u64) -> Vec<Place> {
    let mut out = Vec::new();
    for m in l.stored_fields() {
        for dim in 0..m.width {
            let c = Coord::new(m.field, layer, block, head, slot, dim);
            let (buffer, offset) = place(l, &c);
            out.push(Place {
                buffer,
                offset,
                len: m.elem_bytes() as usize,
            });
        }
    }
    out
}

#[derive(Debug, Clone, Copy)]
struct Place {
    buffer: usize,
    offset: usize,
    len: usize,
}

impl Place {
    fn bytes(self, b: &[Vec<u8>]) -> &[u8] {
        &b[self.buffer][self.offset..self.offset + self.len]
    }
}

/// The staged transfer `t`'s post-receive: staging block `i`, head `j` to DST block
/// `dst_blocks[i]`, head `dst_heads[0] + j`, element by element.
fn scatter(
    t: &Value,
    staging: &KvCacheLayout,
    st: &[Vec<u8>],
    dst: &KvCacheLayout,
    out: &mut [Vec<u8>],
) {
    let blocks = u64s(&t["staging"]["dst_blocks"]);
    let h0 = t["dst_heads"][0].as_u64().unwrap();
    let g = staging.geometry();
    for layer in 0..g.num_layers {
        for (i, &block) in blocks.iter().enumerate() {
            for head in 0..g.num_kv_heads {
                for slot in 0..staging.num_slots() {
                    let from = elements(staging, layer, i as u64, head, slot);
                    let to = elements(dst, layer, block, h0 + head, slot);
                    for (f, t) in from.into_iter().zip(to) {
                        let bytes = f.bytes(st).to_vec();
                        out[t.buffer][t.offset..t.offset + t.len].copy_from_slice(&bytes);
                    }
                }
            }
        }
    }
}

/// Random bytes in every buffer of every SRC rank of case `c`.
pub(super) fn src_bytes(c: &Case) -> Vec<Vec<Vec<u8>>> {
    let src = c.layouts().0;
    (0..c.src_tp).map(|r| random_buffers(&src, 7 + r)).collect()
}

/// The DST buffers after the plan `v` of case `c` ran on `src_bytes` (zeros before): its runs
/// as memcpys, a staged transfer's scattered through the staging and DST offsets.
pub(super) fn apply(c: &Case, v: &Value, src_bytes: &[Vec<Vec<u8>>]) -> Vec<Vec<u8>> {
    let dst = c.layouts().1;
    let mut out = zeros(dst.extents().iter().map(|x| x.end));
    for t in v["transfers"].as_array().expect("transfers") {
        let rank = t["src_rank"].as_u64().unwrap() as usize;
        let runs = json_runs(t);
        match t["into"].as_str().unwrap() {
            "dst" => memcpy(&src_bytes[rank], &mut out, &runs),
            "staging" => {
                let staging: KvCacheLayout =
                    t["staging"]["layout"].as_str().unwrap().parse().unwrap();
                let lens = u64s(&t["staging"]["buffer_bytes"]);
                let ends: Vec<u64> = staging.extents().iter().map(|x| x.end).collect();
                assert_eq!(lens, ends);
                let mut st = zeros(lens.into_iter());
                memcpy(&src_bytes[rank], &mut st, &runs);
                scatter(t, &staging, &st, &dst, &mut out);
            }
            other => panic!("into {other}"),
        }
    }
    out
}

/// Applies the plan `v` of case `c` and checks every element of every sequence's tokens.
pub(super) fn check(c: &Case, v: &Value) {
    let (src, dst) = c.layouts();
    let src_bytes = src_bytes(c);
    let out = apply(c, v, &src_bytes);
    let total = c.model_heads();
    let mine = tp_head_range(total, c.dst_tp, c.dst_rank).unwrap();
    let (bs, bd) = (src.geometry().block_size, dst.geometry().block_size);
    let mut checked = 0u64;
    for (s_blocks, d_blocks, tokens) in &c.seqs {
        for t in 0..*tokens {
            for h in 0..dst.geometry().num_kv_heads {
                let model = mine.start + h;
                let (rank, held) = (0..c.src_tp)
                    .map(|r| (r, tp_head_range(total, c.src_tp, r).unwrap()))
                    .find(|(_, held)| held.contains(&model))
                    .expect("a SRC rank holds the head");
                for layer in 0..dst.geometry().num_layers {
                    let sb = s_blocks[(t / bs) as usize];
                    let db = d_blocks[(t / bd) as usize];
                    let from = elements(&src, layer, sb, model - held.start, t % bs);
                    let to = elements(&dst, layer, db, h, t % bd);
                    for (f, d) in from.into_iter().zip(to) {
                        assert_eq!(
                            d.bytes(&out),
                            f.bytes(&src_bytes[rank as usize]),
                            "{}: token {t} head {h} layer {layer}",
                            c.args().join(" ")
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 0);
}
