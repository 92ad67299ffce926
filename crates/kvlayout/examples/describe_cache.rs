//! Describing two engines' caches with spec strings, reading them through each convention's
//! tensor view, checking a framework's tensor against them, and slicing them for TP.
//!
//! Run: `cargo run -p kvlayout --example describe_cache`. Exits non-zero on any failure.

use kvlayout::{
    Convention, DType, KvCacheLayout, LayoutError, StorageOffset, TensorClaim, ViewTarget,
};

fn main() -> Result<(), LayoutError> {
    // vLLM's FlashAttention backend: one (2, num_blocks, block_size, num_kv_heads, head_size)
    // tensor per layer, so L=1 and the tensor is addressed as layer 0.
    let vllm: KvCacheLayout =
        "kv L=1 B=1024 N=16 H=8 D=128 dtype=bf16 tensor=flash-attn-nhd".parse()?;
    let fa = vllm.view(Convention::FlashAttn, ViewTarget::Kv, 0)?;
    println!("vLLM flash-attn: {vllm}");
    println!(
        "  view {:?} strides {:?} ({})",
        fa.shape,
        fa.strides,
        fa.axes.join(", ")
    );

    // FlashInfer with kv_layout="HND": (num_blocks, 2, num_kv_heads, block_size, head_size).
    let fi: KvCacheLayout =
        "kv L=1 B=1024 N=16 H=8 D=128 dtype=bf16 tensor=flashinfer-hnd".parse()?;
    let fv = fi.view(Convention::FlashinferHnd, ViewTarget::Kv, 0)?;
    println!("FlashInfer HND:  {fi}");
    println!(
        "  view {:?} strides {:?} ({})",
        fv.shape,
        fv.strides,
        fv.axes.join(", ")
    );

    // The framework's tensor as torch reports it: accepted against the FlashAttention cache.
    let claim = TensorClaim {
        convention: Convention::FlashAttn,
        target: ViewTarget::Kv,
        layer: 0,
        shape: &[2, 1024, 16, 8, 128],
        strides: &[1024 * 16 * 8 * 128, 16 * 8 * 128, 8 * 128, 128, 1],
        dtype: DType::Bf16,
        storage_offset: Some(StorageOffset::Elements(0)),
    };
    vllm.check_tensor(&claim)?;
    println!("check: the (2, B, N, H, D) tensor matches");
    // A tensor laid out as FlashAttention's, claimed as FlashInfer's HND view of the
    // FlashInfer cache: refused, naming the axis.
    let wrong = TensorClaim {
        convention: Convention::FlashinferHnd,
        shape: &[1024, 2, 8, 16, 128],
        strides: &[2 * 8 * 16 * 128, 1024 * 16 * 8 * 128, 16 * 128, 128, 1],
        ..claim
    };
    match fi.check_tensor(&wrong) {
        Err(LayoutError::TensorMismatch(m)) if m.contains("axis 1 (kv): stride") => {
            println!("check refused: {m}");
        }
        other => {
            return Err(LayoutError::InvalidQuery(format!(
                "expected a refusal: {other:?}"
            )))
        }
    }

    // TP 4: rank 1's own dense cache of 2 heads vs its heads inside the full cache.
    let own = vllm.tp_rank_layout(4, 1)?;
    let slice = vllm.tp_slice(4, 1)?;
    let own_view = own.view(Convention::FlashAttn, ViewTarget::Kv, 0)?;
    let slice_view = slice.view(Convention::FlashAttn, ViewTarget::Kv, 0)?;
    println!(
        "TP 4 rank 1 own cache: {own} (contiguous: {})",
        own_view.is_contiguous()
    );
    println!(
        "TP 4 rank 1 in the full cache: strides {:?}, offset {} elements (contiguous: {})",
        slice_view.strides,
        slice_view.offset,
        slice_view.is_contiguous()
    );
    if !own_view.is_contiguous() || slice_view.is_contiguous() || slice_view.offset != 2 * 128 {
        return Err(LayoutError::InvalidQuery("unexpected TP views".into()));
    }
    Ok(())
}
