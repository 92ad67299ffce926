//! [`KvCacheLayout::tp_rank_layout`]: the dense cache a TP rank allocates for its own heads,
//! as opposed to [`KvCacheLayout::tp_slice`], a view of the parent's memory.

use crate::error::{LayoutError, Result};
use crate::layout::KvCacheLayout;
use crate::spec::{Geometry, LayoutSpec, Placement};

impl KvCacheLayout {
    /// The cache TP rank `tp_rank` of `tp_size` allocates for its own heads: this spec
    /// (placement, dtype, block size, base offset, alignment) with the rank's head count, in
    /// its own dense allocation. Not a view of this layout's memory; for that, see
    /// [`Self::tp_slice`].
    ///
    /// Post-conditions (checked as properties in the tests), with `heads = tp_heads(..)`:
    /// * the geometry is this one's with `num_kv_heads == heads.len()`; content, dtype,
    ///   scales and placement are this one's;
    /// * the rank's element `(l, b, h, n, f, d)` holds the parent's logical element
    ///   `(l, b, heads.start + h, n, f, d)`;
    /// * the cache is dense: its buffers hold exactly its elements, plus the page alignment
    ///   the spec states.
    ///
    /// A spec whose placement states byte sizes of the parent's heads (`page=`,
    /// `layer_stride=`, `block_stride=` or explicit `@` strides) has no one answer for fewer
    /// heads and is refused, unless the rank holds all of them.
    ///
    /// ```
    /// let l: kvlayout::KvCacheLayout = "kv B=3 N=16 H=4 D=8 dtype=f16 order=LBNHC".parse()?;
    /// let own = l.tp_rank_layout(2, 1)?; // heads 2..4, densely
    /// assert_eq!(own.to_string(), "kv L=1 B=3 N=16 H=2 D=8 Dv=8 dtype=f16 order=LBNHC");
    /// assert_eq!(own.extents()[0].end, 3 * 16 * 2 * 32);
    /// let view = l.tp_slice(2, 1)?; // the same heads inside the parent's memory
    /// assert_eq!(view.extents()[0].end, 3 * 16 * 4 * 32);
    /// # Ok::<(), kvlayout::LayoutError>(())
    /// ```
    pub fn tp_rank_layout(&self, tp_size: u64, tp_rank: u64) -> Result<KvCacheLayout> {
        let heads = self.tp_heads(tp_size, tp_rank)?;
        let n = heads.end - heads.start;
        let total = self.geometry().num_kv_heads;
        if n == total {
            return Ok(self.clone());
        }
        let refuse = |what: String| LayoutError::TransformRefused {
            transform: "tp_rank_layout",
            reason: format!(
                "{what} for the {total}-head cache; a rank's cache of {n} heads has no one \
                 answer: state the rank's own spec"
            ),
        };
        match self.placement() {
            Placement::Strided { .. } => {
                return Err(refuse(
                    "explicit @field= strides state byte positions".into(),
                ))
            }
            Placement::Paged(p) => {
                for (key, v) in [
                    ("page", p.page_size_padded),
                    ("layer_stride", p.layer_stride_bytes),
                    ("block_stride", p.block_stride_bytes),
                ] {
                    if let Some(v) = v {
                        return Err(refuse(format!("{key}={v} is a byte size")));
                    }
                }
            }
            Placement::EngineTensor { .. } => {}
        }
        KvCacheLayout::new(LayoutSpec {
            geometry: Geometry {
                num_kv_heads: n,
                ..*self.geometry()
            },
            ..self.spec().clone()
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use strum::IntoEnumIterator;

    use crate::{AxisOrder, Coord, EngineTensor, KvCacheLayout, LayoutError};

    /// A paged (any order) or engine-tensor spec with `h` heads.
    fn spec(h: u64, placement: &str, b: u64, n: u64, d: u64, dtype: &str, l: u64) -> String {
        format!("kv L={l} B={b} N={n} H={h} D={d} dtype={dtype} {placement}")
    }

    fn placements() -> Vec<String> {
        let mut out: Vec<String> = AxisOrder::iter().map(|o| format!("order={o}")).collect();
        out.extend(EngineTensor::iter().map(|t| format!("tensor={t}")));
        out.push("order=LBHNC base=128 align=128".into());
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn the_rank_layout_holds_its_post_conditions(
            h in prop::sample::select(vec![1u64, 2, 4, 8]),
            tp in prop::sample::select(vec![1u64, 2, 4, 8, 16]),
            rank_pick in 0u64..16,
            p in prop::sample::select(placements()),
            b in 1u64..4,
            n in prop::sample::select(vec![1u64, 2, 16]),
            d in prop::sample::select(vec![16u64, 32]),
            dtype in prop::sample::select(vec!["f16", "f32", "fp8_e4m3"]),
            l in 1u64..3,
        ) {
            let parent: KvCacheLayout = spec(h, &p, b, n, d, dtype, l).parse().unwrap();
            let rank = rank_pick % tp;
            let heads = parent.tp_heads(tp, rank).unwrap();
            let own = parent.tp_rank_layout(tp, rank).unwrap();
            let hr = heads.end - heads.start;
            // Same spec except the heads.
            let mut g = *parent.geometry();
            g.num_kv_heads = hr;
            prop_assert_eq!(own.geometry(), &g);
            prop_assert_eq!(own.content(), parent.content());
            prop_assert_eq!(own.dtype(), parent.dtype());
            prop_assert_eq!(own.placement(), parent.placement());
            prop_assert_eq!(own.to_string(), spec(hr, &p, b, n, d, dtype, l)
                .parse::<KvCacheLayout>().unwrap().to_string());
            // Dense: the buffers hold the elements and nothing else, past the base offset
            // and the stated page alignment.
            let bytes: u64 = own.stored_fields().iter()
                .map(|m| m.num_layers * m.num_blocks * m.num_heads * m.num_slots * m.width
                     * m.elem_bytes())
                .sum();
            let span: u64 = own.extents().iter().map(|x| x.end - x.start).sum();
            if p.contains("align=128") {
                let page = own.dense_page_bytes();
                let padded = page.div_ceil(128) * 128;
                prop_assert_eq!(span, l * b * padded);
            } else {
                prop_assert_eq!(span, bytes);
            }
            // The rank's heads of the parent's memory (`tp_slice`) convert into the rank's
            // own cache as byte runs, and each element lands where the rank's layout puts it:
            // the byte at the parent's (head + first head) is the byte at the rank's head.
            let slice = parent.tp_slice(tp, rank).unwrap();
            let m = crate::ops::BlockMove::Convert.plan(Some(&slice), &own).unwrap();
            let runs = crate::ops::copy_runs(&slice, &own, &m, 1 << 20);
            prop_assert!(runs.is_some(), "no byte runs from the slice to the rank's cache");
            let runs = runs.unwrap();
            prop_assert_eq!(crate::ops::run_bytes(&runs), bytes);
            let src: Vec<Vec<u8>> = parent.extents().iter()
                .map(|x| (0..x.end).map(|i| (i * 7 + i / 251) as u8).collect())
                .collect();
            let mut dst: Vec<Vec<u8>> = own.extents().iter().map(|x| vec![0; x.end as usize]).collect();
            for r in &runs {
                let (s0, d0, n) = (r.src_offset as usize, r.dst_offset as usize, r.len as usize);
                dst[r.dst_buffer as usize][d0..d0 + n]
                    .copy_from_slice(&src[r.src_buffer as usize][s0..s0 + n]);
            }
            for f in own.readable_fields() {
                let map = own.field_map(f).unwrap();
                let (w, e) = (map.width, map.elem_bytes() as usize);
                for c in [Coord::new(f, l - 1, b - 1, hr - 1, own.num_slots() - 1, w - 1),
                          Coord::new(f, 0, 0, 0, 0, 0),
                          Coord::new(f, l / 2, b / 2, hr / 2, own.num_slots() / 2, w / 2)] {
                    let at = own.offset(&c).unwrap();
                    let up = parent.offset(&Coord { head: c.head + heads.start, ..c }).unwrap();
                    let (a, u) = (at.offset as usize, up.offset as usize);
                    prop_assert_eq!(
                        &dst[at.buffer as usize][a..a + e],
                        &src[up.buffer as usize][u..u + e],
                        "{:?}", c
                    );
                }
            }
        }
    }

    /// Byte sizes of the parent's heads and explicit strides are refused with the reason; a
    /// rank that holds every head gets the layout itself.
    #[test]
    fn stated_byte_sizes_are_refused() {
        let padded: KvCacheLayout = "kv B=3 N=16 H=4 D=8 dtype=f16 order=LBNHC page=2560"
            .parse()
            .unwrap();
        assert_eq!(
            padded.tp_rank_layout(2, 0),
            Err(LayoutError::TransformRefused {
                transform: "tp_rank_layout",
                reason: "page=2560 is a byte size for the 4-head cache; a rank's cache of 2 \
                         heads has no one answer: state the rank's own spec"
                    .into()
            })
        );
        assert_eq!(padded.tp_rank_layout(1, 0).as_ref(), Ok(&padded));
        let strided = padded.tp_slice(1, 0).unwrap();
        let e = strided.tp_rank_layout(4, 3).unwrap_err().to_string();
        assert!(
            e.contains("explicit @field= strides state byte positions for the 4-head cache"),
            "{e}"
        );
        // TP wider than the heads: each rank's own cache holds one replicated head.
        let two: KvCacheLayout = "kv B=3 N=16 H=2 D=8 dtype=f16 tensor=flashinfer-hnd"
            .parse()
            .unwrap();
        let own = two.tp_rank_layout(4, 3).unwrap();
        assert_eq!(
            own.to_string(),
            "kv L=1 B=3 N=16 H=1 D=8 Dv=8 dtype=f16 tensor=flashinfer-hnd"
        );
        assert_eq!(own.extents()[0].end, 3 * 2 * 16 * 8 * 2);
    }
}
