//! [`TensorView::is_contiguous`]: whether a view is a dense row-major array, and the tests of
//! the convention names.

use super::TensorView;

impl TensorView {
    /// Whether the strides are the row-major (C-contiguous) strides of the shape: the last
    /// axis has stride 1 and each other axis the product of the extents inside it. Strides of
    /// extent-1 axes are ignored (they carry no information); a view with an extent 0 is
    /// contiguous.
    ///
    /// ```
    /// use kvlayout::{Convention, Field, KvCacheLayout, ViewTarget};
    /// let k = ViewTarget::Field(Field::K);
    /// let fi: KvCacheLayout = "kv B=3 N=16 H=4 D=8 dtype=f16 tensor=flashinfer-hnd".parse()?;
    /// assert!(fi.view(Convention::FlashinferHnd, ViewTarget::Kv, 0)?.is_contiguous());
    /// // K and V packed in each row: K alone skips V's half of every row.
    /// let packed: KvCacheLayout = "kv B=3 N=16 H=4 D=8 dtype=f16 order=LBHNC".parse()?;
    /// assert!(!packed.view(Convention::FlashinferHnd, k, 0)?.is_contiguous());
    /// # Ok::<(), kvlayout::LayoutError>(())
    /// ```
    pub fn is_contiguous(&self) -> bool {
        if self.shape.contains(&0) {
            return true;
        }
        let mut step: u128 = 1;
        for (&n, &s) in self.shape.iter().zip(&self.strides).rev() {
            if n > 1 && u128::from(s) != step {
                return false;
            }
            step *= u128::from(n);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use crate::{Convention, Field, KvCacheLayout, LayoutError, ViewTarget, CONVENTION_NAMES};

    fn layout(s: &str) -> KvCacheLayout {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    /// Dense views are contiguous; a padded page, an HND view of NHD memory and a TP slice
    /// are not; extent-1 axes' strides are ignored.
    #[test]
    fn contiguous_views_and_views_that_are_not() {
        let k = ViewTarget::Field(Field::K);
        let separate = layout("kv L=2 B=3 N=16 H=4 D=8 dtype=f16 tensor=separate-nhd");
        let v = separate.view(Convention::FlashAttn, k, 1).unwrap();
        assert_eq!(v.strides, [512, 32, 8, 1]);
        assert!(v.is_contiguous());
        let fa = layout("kv B=3 N=16 H=4 D=8 dtype=f16 tensor=flash-attn-nhd");
        assert!(fa
            .view(Convention::FlashAttn, ViewTarget::Kv, 0)
            .unwrap()
            .is_contiguous());
        // The same memory read head-major: strides (H N D) permuted, not row-major.
        let hnd = separate.view(Convention::FlashinferHnd, k, 0).unwrap();
        assert_eq!(hnd.strides, [512, 8, 32, 1]);
        assert!(!hnd.is_contiguous());
        // An MLA latent of 8 f16 per slot: dense pages of 256 B are contiguous; pages padded
        // to 288 B put blocks 144 elements apart, not 128.
        let lat = ViewTarget::Field(Field::Latent);
        let mla = "mla B=3 N=16 rank=4 rope=4 dtype=f16 order=LBNHC";
        let dense = layout(mla).view(Convention::Standard, lat, 0).unwrap();
        assert_eq!(
            (dense.shape.clone(), dense.strides[0]),
            (vec![3, 1, 16, 8], 128)
        );
        assert!(dense.is_contiguous());
        let padded = layout(&format!("{mla} page=288"));
        let pv = padded.view(Convention::Standard, lat, 0).unwrap();
        assert_eq!(pv.strides[0], 144);
        assert!(!pv.is_contiguous());
        // Rank 1 of TP 2 over 4 heads: 2 heads of a 4-head row.
        let slice = separate.tp_slice(2, 1).unwrap();
        let sv = slice.view(Convention::FlashAttn, k, 0).unwrap();
        assert_eq!(
            (sv.shape.clone(), sv.strides.clone()),
            (vec![3, 16, 2, 8], vec![512, 32, 8, 1])
        );
        assert!(!sv.is_contiguous());
        // One head: its stride is ignored, but a per-head slice of HND memory still has its
        // blocks 4 heads apart, so it is not dense.
        let one = layout("kv B=3 N=16 H=4 D=8 dtype=f16 tensor=separate-hnd")
            .tp_slice(4, 2)
            .unwrap();
        let ov = one.view(Convention::FlashinferHnd, k, 0).unwrap();
        assert_eq!(ov.shape, [3, 1, 16, 8]);
        assert_eq!(ov.strides, [512, 128, 8, 1]);
        assert!(!ov.is_contiguous()); // blocks are 4 heads apart
        let mut hand = ov.clone();
        hand.strides = vec![128, 99999, 8, 1];
        assert!(hand.is_contiguous());
    }

    /// Every name in `CONVENTION_NAMES` parses, `flash-attn-nhd`/`-hnd` as FlashAttention,
    /// and an unknown name lists them.
    #[test]
    fn convention_names() {
        for name in CONVENTION_NAMES {
            assert!(Convention::from_name(name).is_ok(), "{name}");
        }
        for name in [
            "flash-attn",
            "flash-attn-nhd",
            "flash-attn-hnd",
            "FLASH-ATTN-HND",
        ] {
            assert_eq!(
                Convention::from_name(name),
                Ok(Convention::FlashAttn),
                "{name}"
            );
        }
        assert_eq!(Convention::FlashAttn.to_string(), "flash-attn");
        assert_eq!(
            Convention::from_name("flash_attn"),
            Err(LayoutError::UnknownName {
                what: "convention",
                name: "flash_attn".into(),
                known: "standard, vllm-paged-v1, flash-attn, flash-attn-nhd, flash-attn-hnd, \
                        flashinfer, flashinfer-nhd, flashinfer-hnd"
                    .into(),
            })
        );
    }
}
