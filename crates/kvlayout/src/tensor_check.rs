//! The check of a tensor a framework hands over: [`KvCacheLayout::check_tensor`] says yes or
//! names the first disagreement with the layout's view, the axis by what it indexes (`axis 0
//! (kv): stride 32768, expected 16384`), with a hint where the mistake has a known shape (two
//! axes swapped, the page padding ignored, a dense array where the view is not, vLLM's `x`,
//! an engine's tensor described with `order=`'s packed K|V rows).

use strum::IntoEnumIterator;

use crate::error::{LayoutError, Result};
use crate::layout::KvCacheLayout;
use crate::spec::{EngineTensor, LayoutSpec, Placement};
use crate::view::{Convention, TensorView, ViewTarget};
use crate::DType;

/// A tensor's storage offset from the buffer start, in the unit the framework knows it in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StorageOffset {
    /// In elements of the tensor's dtype (`tensor.storage_offset()` in PyTorch).
    Elements(u64),
    /// In bytes (a data pointer minus the buffer's start).
    Bytes(u64),
}

/// What a framework says about a tensor it hands over: checked, never trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorClaim<'a> {
    /// The convention the tensor follows.
    pub convention: Convention,
    /// Which field (or K and V together).
    pub target: ViewTarget,
    /// Layer slot the tensor is of.
    pub layer: u64,
    /// Its shape.
    pub shape: &'a [u64],
    /// Its strides in elements.
    pub strides: &'a [u64],
    /// Its element type.
    pub dtype: DType,
    /// Its storage offset from the buffer start, in elements or bytes, when known.
    pub storage_offset: Option<StorageOffset>,
}

impl KvCacheLayout {
    /// Verifies what a framework hands over against this layout's view. It never infers
    /// anything from the tensor: it only says yes, or names the first difference, each axis
    /// by what it indexes in the claim's convention and each offset with its unit. Strides of
    /// size-1 axes are not compared (they carry no information).
    ///
    /// ```
    /// use kvlayout::{Convention, DType, Field, LayoutError, StorageOffset, TensorClaim, ViewTarget};
    /// let l: kvlayout::KvCacheLayout = "kv B=3 N=16 H=1 D=8 dtype=f16 order=LBNHC".parse()?;
    /// let claim = TensorClaim {
    ///     convention: Convention::FlashAttn,
    ///     target: ViewTarget::Field(Field::K),
    ///     layer: 0,
    ///     shape: &[3, 16, 1, 8],
    ///     strides: &[256, 16, 99999, 1], // H = 1: its stride is irrelevant
    ///     dtype: DType::F16,
    ///     storage_offset: Some(StorageOffset::Bytes(0)),
    /// };
    /// l.check_tensor(&claim)?;
    /// let swapped = TensorClaim { strides: &[16, 256, 16, 1], ..claim };
    /// let Err(LayoutError::TensorMismatch(m)) = l.check_tensor(&swapped) else { panic!() };
    /// assert!(m.contains("axis 0 (block): stride 16, expected 256"), "{m}");
    /// assert!(m.contains("axes 0 (block) and 1 (slot) look swapped"), "{m}");
    /// let shifted = TensorClaim { storage_offset: Some(StorageOffset::Elements(8)), ..claim };
    /// let Err(LayoutError::TensorMismatch(m)) = l.check_tensor(&shifted) else { panic!() };
    /// assert!(m.ends_with("storage offset 8 elements (16 bytes), expected 0 elements (0 bytes)"));
    /// # Ok::<(), kvlayout::LayoutError>(())
    /// ```
    pub fn check_tensor(&self, claim: &TensorClaim<'_>) -> Result<()> {
        let TensorClaim {
            convention,
            target,
            layer,
            shape,
            strides,
            dtype,
            storage_offset,
        } = *claim;
        let v = self.view(convention, target, layer)?;
        let mismatch = |s: String| {
            Err(LayoutError::TensorMismatch(format!(
                "{convention} {target}: {s}"
            )))
        };
        if dtype != v.dtype {
            return mismatch(format!("dtype {dtype}, the layout stores {}", v.dtype));
        }
        let names = v.axes.join(", ");
        if shape.len() != v.shape.len() || strides.len() != v.shape.len() {
            return mismatch(format!(
                "{} dims with {} strides, expected {} dims {:?} ({names})",
                shape.len(),
                strides.len(),
                v.shape.len(),
                v.shape
            ));
        }
        if let Some(i) = (0..shape.len()).find(|&i| shape[i] != v.shape[i]) {
            let hint = swapped(&v, shape, &v.shape, |_| true).or_else(|| self.x_hint(&v, i, shape));
            return mismatch(format!(
                "axis {i} ({}): size {}, expected {} (shape {:?} = ({names})){}",
                v.axes[i],
                shape[i],
                v.shape[i],
                v.shape,
                hint.map(|h| format!("; {h}")).unwrap_or_default()
            ));
        }
        let big = |j: usize| v.shape[j] > 1;
        if let Some(i) = (0..shape.len()).find(|&i| big(i) && strides[i] != v.strides[i]) {
            let hint = self
                .packed_rows_hint(claim)
                .or_else(|| swapped(&v, strides, &v.strides, big))
                .or_else(|| kv_order_hint(&v, strides))
                .or_else(|| self.padding_hint(&v, i, strides[i]))
                .or_else(|| dense_hint(shape, strides));
            return mismatch(format!(
                "axis {i} ({}): stride {}, expected {} (strides {:?} = ({names})){}",
                v.axes[i],
                strides[i],
                v.strides[i],
                v.strides,
                hint.map(|h| format!("; {h}")).unwrap_or_default()
            ));
        }
        if let Some(off) = storage_offset {
            let e = v.dtype.size_bytes();
            let got = match off {
                StorageOffset::Elements(n) => u128::from(n) * u128::from(e),
                StorageOffset::Bytes(n) => u128::from(n),
            };
            if got != u128::from(v.offset_bytes) {
                let said = match off {
                    StorageOffset::Elements(n) => format!("{n} elements ({got} bytes)"),
                    StorageOffset::Bytes(n) if n % e == 0 => {
                        format!("{} elements ({n} bytes)", n / e)
                    }
                    StorageOffset::Bytes(n) => {
                        format!("{n} bytes (not a whole number of {e}-byte elements)")
                    }
                };
                return mismatch(format!(
                    "storage offset {said}, expected {} elements ({} bytes)",
                    v.offset, v.offset_bytes
                ));
            }
        }
        Ok(())
    }

    /// For a paged layout (`order=`: K and V packed in each row) whose strides the claim does
    /// not match: every engine tensor layout (`tensor=`) of the same geometry whose view has
    /// exactly the claimed shape and strides (and storage offset, where the claim states
    /// one), named as the spec keys to use.
    fn packed_rows_hint(&self, claim: &TensorClaim<'_>) -> Option<String> {
        let Placement::Paged(p) = self.placement() else {
            return None;
        };
        let matching: Vec<EngineTensor> = EngineTensor::iter()
            .filter(|&kind| {
                let spec = LayoutSpec {
                    placement: Placement::EngineTensor {
                        layout: kind,
                        base_offset: p.base_offset,
                    },
                    ..self.spec().clone()
                };
                let Some(v) = KvCacheLayout::new(spec)
                    .ok()
                    .and_then(|o| o.view(claim.convention, claim.target, claim.layer).ok())
                else {
                    return false;
                };
                let offset_bytes = claim.storage_offset.map(|o| match o {
                    StorageOffset::Elements(n) => n.checked_mul(v.dtype.size_bytes()),
                    StorageOffset::Bytes(n) => Some(n),
                });
                v.shape == claim.shape
                    && (0..v.shape.len())
                        .all(|i| v.shape[i] <= 1 || v.strides[i] == claim.strides[i])
                    && offset_bytes.is_none_or(|o| o == Some(v.offset_bytes))
            })
            .collect();
        let (first, rest) = matching.split_first()?;
        let keys: Vec<String> = matching.iter().map(|k| format!("tensor={k}")).collect();
        let what = match (claim.target, rest.is_empty()) {
            (ViewTarget::Kv, true) => format!("{} is", engine_tensor_words(*first)),
            (ViewTarget::Kv, false) => "this K and V tensor is".to_string(),
            (ViewTarget::Field(f), _) => format!("this {f} tensor is the {f} of"),
        };
        Some(format!(
            "{what} {}; this layout (order={}) packs K and V in each row",
            keys.join(" or "),
            p.order
        ))
    }

    /// Where the stride of a `block` axis is the dense page of the view's buffer (or that
    /// times the layers inside a block) and the layout's pages are further apart: the hint
    /// that the stride ignores the page padding.
    fn padding_hint(&self, v: &TensorView, axis: usize, got: u64) -> Option<String> {
        if v.axes[axis] != "block" {
            return None;
        }
        let e = u128::from(v.dtype.size_bytes());
        let dense: u128 = self
            .stored_fields()
            .iter()
            .filter(|m| m.strides.buffer == v.buffer)
            .map(|m| u128::from(m.num_heads * m.num_slots * m.width * m.elem_bytes()))
            .sum();
        let (got, want) = (u128::from(got) * e, u128::from(v.strides_bytes[axis]));
        let layers = u128::from(self.geometry().num_layers);
        (want > got && (got == dense || got == dense * layers)).then(|| {
            format!(
                "the block stride ignores the page padding: {got} B is the dense page, \
                 the layout's blocks are {want} B apart"
            )
        })
    }

    /// On a size mismatch of vLLM's key: what `x` is (16 bytes over the element size, never
    /// the block size).
    fn x_hint(&self, v: &TensorView, axis: usize, shape: &[u64]) -> Option<String> {
        if !matches!(v.axes[axis], "x" | "dim / x") {
            return None;
        }
        let (e, x) = (v.dtype.size_bytes(), v.dtype.vllm_x());
        let n = self.geometry().block_size;
        let got_x = shape.last().copied().unwrap_or(0);
        let from_block = if got_x == n && n != x {
            format!(", not the block size {n}")
        } else {
            String::new()
        };
        Some(format!(
            "x is 16 bytes / {e}-byte {} elements = {x}{from_block}",
            v.dtype
        ))
    }
}

/// What an engine tensor layout is, in the engine's own words.
fn engine_tensor_words(kind: EngineTensor) -> &'static str {
    match kind {
        EngineTensor::VllmPagedV1 => "vLLM's paged-attention v1 cache",
        EngineTensor::FlashAttnNhd => "FlashAttention's (2, B, N, H, D) tensor",
        EngineTensor::FlashAttnHnd => {
            "FlashAttention's (2, B, N, H, D) tensor in head-major (HND) memory"
        }
        EngineTensor::FlashinferNhd => "FlashInfer's (B, 2, N, H, D) tensor",
        EngineTensor::FlashinferHnd => "FlashInfer's (B, 2, H, N, D) tensor",
        EngineTensor::SeparateNhd => "A pair of separate K and V [B, N, H, D] tensors",
        EngineTensor::SeparateHnd => "A pair of separate K and V [B, H, N, D] tensors",
    }
}

/// Two axes `i`, `j` (both passing `keep`) whose values are exactly exchanged between `got`
/// and `want`: the hint naming them and both axis orders.
fn swapped(
    v: &TensorView,
    got: &[u64],
    want: &[u64],
    keep: impl Fn(usize) -> bool,
) -> Option<String> {
    let n = got.len();
    let (i, j) = (0..n)
        .flat_map(|i| (i + 1..n).map(move |j| (i, j)))
        .find(|&(i, j)| {
            keep(i) && keep(j) && want[i] != want[j] && got[i] == want[j] && got[j] == want[i]
        })?;
    let mut read = v.axes.clone();
    read.swap(i, j);
    Some(format!(
        "axes {i} ({}) and {j} ({}) look swapped: the layout's view is ({}), the tensor reads \
         as ({})",
        v.axes[i],
        v.axes[j],
        v.axes.join(", "),
        read.join(", ")
    ))
}

/// For a stacked K/V view: where the tensor nests its K/V and block axes the other way round
/// from the layout (`(2, B, ...)`: all K, then all V; `(B, 2, ...)`: K and V inside each
/// block), the hint saying so.
fn kv_order_hint(v: &TensorView, strides: &[u64]) -> Option<String> {
    let at = |name| v.axes.iter().position(|a| *a == name);
    let (kv, block) = (at("kv")?, at("block")?);
    if v.shape[kv] < 2 || v.shape[block] < 2 {
        return None;
    }
    let outside = |s: &[u64]| s[kv] > s[block];
    let nesting = |o: bool| {
        if o {
            "K and V outside the blocks ((2, B, ...): all K, then all V)"
        } else {
            "K and V inside each block ((B, 2, ...))"
        }
    };
    let (got, want) = (outside(strides), outside(&v.strides));
    (got != want).then(|| {
        format!(
            "the tensor puts {}, the layout puts {}",
            nesting(got),
            nesting(want)
        )
    })
}

/// Where the strides are a dense (C-contiguous) array's for `shape`: the hint that the view
/// is not dense. Axes of extent 1 are skipped.
fn dense_hint(shape: &[u64], strides: &[u64]) -> Option<String> {
    let mut step: u128 = 1;
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n > 1 && u128::from(s) != step {
            return None;
        }
        step *= u128::from(n);
    }
    Some(
        "the tensor's strides are a dense (C-contiguous) array's; the layout's view is not \
         dense (its fields or pages interleave)"
            .to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Field;

    /// The message of a refused claim.
    fn refused(l: &str, claim: TensorClaim<'_>) -> String {
        let l: KvCacheLayout = l.parse().unwrap_or_else(|e| panic!("{l}: {e}"));
        match l.check_tensor(&claim) {
            Err(LayoutError::TensorMismatch(m)) => m,
            other => panic!("{l}: accepted or other error: {other:?}"),
        }
    }

    fn claim<'a>(
        c: Convention,
        t: ViewTarget,
        shape: &'a [u64],
        strides: &'a [u64],
    ) -> TensorClaim<'a> {
        TensorClaim {
            convention: c,
            target: t,
            layer: 0,
            shape,
            strides,
            dtype: DType::F16,
            storage_offset: None,
        }
    }

    /// Pages padded to 4160 B (dense 4096 B = 16 tokens x 8 heads x (8 + 8) f16): a block
    /// stride of the dense page is named as such.
    #[test]
    fn a_block_stride_of_the_dense_page_ignores_the_padding() {
        let l = "kv L=2 B=3 N=16 H=8 D=8 dtype=f16 order=NHD page=4160";
        let k = ViewTarget::Field(Field::K);
        let m = refused(
            l,
            claim(
                Convention::FlashAttn,
                k,
                &[3, 16, 8, 8],
                &[2048, 128, 16, 1],
            ),
        );
        assert!(
            m.starts_with("flash-attn k: axis 0 (block): stride 2048, expected 2080"),
            "{m}"
        );
        assert!(
            m.contains("ignores the page padding: 4096 B is the dense page"),
            "{m}"
        );
        assert!(m.contains("blocks are 4160 B apart"), "{m}");
    }

    /// FlashInfer's `(B, 2, N, H, D)` memory reshaped to FlashAttention's `(2, B, N, H, D)`:
    /// the K/V axis nested outside the blocks is named.
    #[test]
    fn a_kv_axis_outside_the_blocks_is_named() {
        let l = "kv B=5 N=16 H=2 D=8 dtype=f16 tensor=flashinfer-nhd";
        let shape = [2, 5, 16, 2, 8];
        let strides = [1280, 256, 16, 8, 1];
        let m = refused(
            l,
            claim(Convention::FlashAttn, ViewTarget::Kv, &shape, &strides),
        );
        assert!(m.contains("axis 0 (kv): stride 1280, expected 256"), "{m}");
        assert!(
            m.contains("the tensor puts K and V outside the blocks ((2, B, ...): all K, then all V), the layout puts K and V inside each block ((B, 2, ...))"),
            "{m}"
        );
    }

    /// FlashInfer's `(B, 2, H, N, D)` tensor claimed against `order=LBHNC` (packed K|V rows,
    /// whose stacked view has K/V stride D): the axis is named by the convention's meaning and
    /// the hint names `tensor=flashinfer-hnd`, whose view is exactly the claim.
    #[test]
    fn an_engine_tensor_against_packed_rows_names_the_tensor_key() {
        let packed = "kv B=3 N=16 H=4 D=8 dtype=f16 order=HND";
        let shape = [3, 2, 4, 16, 8];
        let strides = [2 * 4 * 16 * 8, 4 * 16 * 8, 16 * 8, 8, 1];
        let c = claim(Convention::FlashinferHnd, ViewTarget::Kv, &shape, &strides);
        let m = refused(packed, c);
        assert!(
            m.starts_with("flashinfer-hnd kv: axis 0 (block): stride 1024, expected 1024")
                || m.starts_with("flashinfer-hnd kv: axis 1 (kv): stride 512, expected 8"),
            "{m}"
        );
        assert!(
            m.ends_with(
                "; FlashInfer's (B, 2, H, N, D) tensor is tensor=flashinfer-hnd; this layout \
                 (order=LBHNC) packs K and V in each row"
            ),
            "{m}"
        );
        let named: KvCacheLayout = "kv B=3 N=16 H=4 D=8 dtype=f16 tensor=flashinfer-hnd"
            .parse()
            .unwrap();
        assert_eq!(named.check_tensor(&c), Ok(()));
        // FlashAttention's (2, B, N, H, D) against token-major packed rows.
        let shape = [2, 3, 16, 4, 8];
        let strides = [3 * 16 * 4 * 8, 16 * 4 * 8, 4 * 8, 8, 1];
        let c = claim(Convention::FlashAttn, ViewTarget::Kv, &shape, &strides);
        let m = refused("kv B=3 N=16 H=4 D=8 dtype=f16 order=LBNHC", c);
        assert!(
            m.starts_with("flash-attn kv: axis 0 (kv): stride 1536, expected 8"),
            "{m}"
        );
        assert!(
            m.contains("FlashAttention's (2, B, N, H, D) tensor is tensor=flash-attn-nhd"),
            "{m}"
        );
        // A claim no engine tensor matches gets no such hint.
        let odd = [3 * 1024, 512, 128, 8, 1];
        let m = refused(
            packed,
            claim(
                Convention::FlashinferHnd,
                ViewTarget::Kv,
                &[3, 2, 4, 16, 8],
                &odd,
            ),
        );
        assert!(!m.contains("tensor="), "{m}");
    }

    /// A dense array's strides where the view interleaves K and V; vLLM's x from the block
    /// size; a shape with two sizes exchanged; a storage offset in elements and bytes.
    #[test]
    fn hints_name_dense_arrays_x_and_swapped_sizes() {
        let l = "kv B=3 N=16 H=2 D=8 dtype=f16 order=NHD";
        let k = ViewTarget::Field(Field::K);
        let m = refused(
            l,
            claim(Convention::FlashAttn, k, &[3, 16, 2, 8], &[256, 16, 8, 1]),
        );
        assert!(
            m.contains("axis 0 (block): stride 256, expected 512"),
            "{m}"
        );
        // Both engines' K is this dense [B, N, H, D] at some offset: both are named.
        assert!(
            m.ends_with(
                "; this k tensor is the k of tensor=flash-attn-nhd or tensor=separate-nhd; this \
                 layout (order=LBNHC) packs K and V in each row"
            ),
            "{m}"
        );
        // A stated storage offset narrows it: V at offset 0 of its own buffer is only
        // separate-nhd's (flash-attn-nhd's V follows its K).
        let v_at_0 = TensorClaim {
            storage_offset: Some(StorageOffset::Elements(0)),
            ..claim(
                Convention::FlashAttn,
                ViewTarget::Field(Field::V),
                &[3, 16, 2, 8],
                &[256, 16, 8, 1],
            )
        };
        let m = refused(l, v_at_0);
        assert!(
            m.ends_with(
                "; this v tensor is the v of tensor=separate-nhd; this layout (order=LBNHC) \
                 packs K and V in each row"
            ),
            "{m}"
        );
        let separate: KvCacheLayout = "kv B=3 N=16 H=2 D=8 dtype=f16 tensor=separate-nhd"
            .parse()
            .unwrap();
        assert_eq!(separate.check_tensor(&v_at_0), Ok(()));
        // Strides of no engine's tensor that are a dense array's: the dense hint.
        let m = refused(
            l,
            claim(Convention::FlashAttn, k, &[3, 16, 2, 8], &[256, 16, 8, 2]),
        );
        assert!(
            m.contains("axis 0 (block): stride 256, expected 512"),
            "{m}"
        );
        assert!(!m.contains("tensor="), "{m}");
        let strided = "kv L=1 B=3 N=4 H=2 D=8 dtype=f16 @k=0:0:0:256:64:16:8:16:2 \
                       @v=0:128:0:256:16:32:8:16:2 @buf0=0..768";
        let m = refused(
            strided,
            claim(Convention::FlashAttn, k, &[3, 4, 2, 8], &[64, 16, 8, 1]),
        );
        assert!(m.contains("axis 0 (block): stride 64, expected 128"), "{m}");
        assert!(m.contains("dense (C-contiguous)"), "{m}");
        let m = refused(
            l,
            claim(Convention::FlashAttn, k, &[3, 2, 16, 8], &[512, 16, 32, 1]),
        );
        assert!(m.contains("axis 1 (slot): size 2, expected 16"), "{m}");
        assert!(m.contains("axes 1 (slot) and 2 (head) look swapped"), "{m}");
        let vllm = "kv B=3 N=16 H=2 D=16 dtype=f16 tensor=vllm-paged-v1";
        let shape = [3, 2, 1, 16, 16];
        let m = refused(
            vllm,
            claim(Convention::VllmPagedV1, k, &shape, &[1, 1, 1, 1, 1]),
        );
        assert!(m.contains("axis 2 (dim / x): size 1, expected 2"), "{m}");
        assert!(
            m.contains("x is 16 bytes / 2-byte f16 elements = 8, not the block size 16"),
            "{m}"
        );
        let based = "kv L=2 B=3 N=16 H=2 D=8 dtype=f16 order=NHD";
        let strides = [512, 32, 16, 1];
        let c = TensorClaim {
            layer: 1,
            storage_offset: Some(StorageOffset::Elements(0)),
            ..claim(Convention::FlashAttn, k, &[3, 16, 2, 8], &strides)
        };
        let m = refused(based, c);
        assert!(
            m.ends_with("storage offset 0 elements (0 bytes), expected 1536 elements (3072 bytes)"),
            "{m}"
        );
        // The same offset in bytes: accepted at 3072, named in both units at 3074, and a byte
        // offset inside an element is said to be one.
        let at = |b| TensorClaim {
            storage_offset: Some(StorageOffset::Bytes(b)),
            ..c
        };
        let l: KvCacheLayout = based.parse().unwrap();
        assert_eq!(l.check_tensor(&at(3072)), Ok(()));
        assert!(refused(based, at(3076)).ends_with(
            "storage offset 1538 elements (3076 bytes), expected 1536 elements (3072 bytes)"
        ));
        assert!(refused(based, at(3073)).ends_with(
            "storage offset 3073 bytes (not a whole number of 2-byte elements), expected 1536 \
             elements (3072 bytes)"
        ));
    }
}
