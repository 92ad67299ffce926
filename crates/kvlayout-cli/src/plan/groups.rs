//! The two sides of a transfer as the connector sees them: one handshake [`CacheGroup`] per
//! rank, with registered regions at synthetic addresses, checked as a peer's handshake is
//! checked ([`PeerMetadata::validate`]) and against each other ([`check_compatible`]).
//!
//! It owns the synthetic addresses and the model's head count (each side's heads per rank
//! times its TP size, unless stated). It does not plan: [`super::pick`] does, through the
//! connector.

use kvlayout::KvCacheLayout;
use kvlayout_connector::handshake::{
    check_compatible, CacheGroup, HandshakeError, Limits, MemRegion, PeerMetadata,
};

use crate::CliError;

/// Synthetic address of the first SRC (remote) region of every rank. Regions are only
/// checked (each covers its buffer's registered span, none overlap); nothing is read there.
pub(crate) const SRC_BASE: u64 = 0x1000_0000_0000;

/// Synthetic address of the first DST (local) region.
pub(crate) const DST_BASE: u64 = 0x2000_0000_0000;

/// Alignment of each synthetic region after the first (2 MiB, a huge page).
const REGION_ALIGN: u64 = 1 << 21;

/// One side's TP placement, as given.
#[derive(Debug, Clone)]
pub(crate) struct SideTp {
    /// TP size.
    pub tp_size: u64,
    /// The ranks planned: the DST rank, or the SRC ranks offered.
    pub ranks: Vec<u64>,
    /// The model's KV heads, stated (`--model-heads`), or `None` for heads per rank x TP.
    pub model_heads: Option<u64>,
}

/// Both sides as handshake groups: the DST (local) rank and the SRC (remote) ranks offered.
#[derive(Debug, Clone)]
pub(crate) struct Sides {
    /// The local group.
    pub dst: CacheGroup,
    /// The remote groups, by rank.
    pub src: Vec<CacheGroup>,
}

/// One region per buffer of `layout`, each as long as the buffer's registered span, laid
/// one after another from `base` at [`REGION_ALIGN`].
pub(crate) fn synthetic_regions(
    layout: &KvCacheLayout,
    base: u64,
) -> Result<Vec<MemRegion>, CliError> {
    let mut next = base;
    let overflow = || {
        CliError::Usage(format!(
            "the synthetic regions of {} buffers spanning {:?} do not fit in 64-bit addresses",
            layout.num_buffers(),
            layout.extents()
        ))
    };
    let mut out = Vec::with_capacity(layout.num_buffers());
    for x in layout.extents() {
        let region = MemRegion::host(next, x.end);
        let end = next.checked_add(x.end).ok_or_else(overflow)?;
        next = end
            .checked_next_multiple_of(REGION_ALIGN)
            .ok_or_else(overflow)?;
        out.push(region);
    }
    Ok(out)
}

/// The model's KV heads for a side: stated, or its layout's heads per rank times TP.
pub(crate) fn model_heads(layout: &KvCacheLayout, tp: &SideTp) -> Result<u64, CliError> {
    let per_rank = layout.geometry().num_kv_heads;
    match tp.model_heads {
        Some(h) => Ok(h),
        None => per_rank.checked_mul(tp.tp_size).ok_or_else(|| {
            CliError::Usage(format!(
                "{per_rank} heads per rank x TP {} overflows: give --model-heads",
                tp.tp_size
            ))
        }),
    }
}

/// The group of rank `rank`, checked as a published handshake group is checked.
fn group(
    side: &str,
    layout: &KvCacheLayout,
    tp: &SideTp,
    rank: u64,
    base: u64,
) -> Result<CacheGroup, CliError> {
    let g = CacheGroup {
        name: side.to_ascii_lowercase(),
        layout: layout.clone(),
        total_kv_heads: model_heads(layout, tp)?,
        tp_size: tp.tp_size,
        tp_rank: rank,
        regions: synthetic_regions(layout, base)?,
    };
    let peer = PeerMetadata {
        engine_id: side.to_ascii_lowercase(),
        groups: vec![g.clone()],
    };
    peer.validate(&Limits::default())
        .map_err(|e| handshake_refused(&format!("{side} rank {rank}"), &e))?;
    Ok(g)
}

/// A handshake refusal as the one error line.
pub(crate) fn handshake_refused(whose: &str, e: &HandshakeError) -> CliError {
    CliError::Usage(format!("handshake refused: {whose}: {e}"))
}

/// Both sides' groups, each validated, the DST group checked compatible with every SRC group
/// (the compatibility hash's fields: content, dtype, scales, layers, model heads).
pub(crate) fn sides(
    (src, src_tp): (&KvCacheLayout, &SideTp),
    (dst, dst_tp): (&KvCacheLayout, &SideTp),
) -> Result<Sides, CliError> {
    let dst_rank = dst_tp.ranks.first().copied().unwrap_or(0);
    let dst = group("DST", dst, dst_tp, dst_rank, DST_BASE)?;
    let mut remotes = Vec::with_capacity(src_tp.ranks.len());
    for &rank in &src_tp.ranks {
        let g = group("SRC", src, src_tp, rank, SRC_BASE)?;
        check_compatible(&dst, &g).map_err(|e| {
            handshake_refused(&format!("DST rank {dst_rank} against SRC rank {rank}"), &e)
        })?;
        remotes.push(g);
    }
    Ok(Sides { dst, src: remotes })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_regions_cover_each_span_and_do_not_overlap() {
        let l: KvCacheLayout = "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 tensor=separate-nhd"
            .parse()
            .unwrap();
        let r = synthetic_regions(&l, SRC_BASE).unwrap();
        assert_eq!(r.len(), l.num_buffers());
        for (region, x) in r.iter().zip(l.extents()) {
            assert_eq!(region.len, x.end);
        }
        assert_eq!(r[0].base, SRC_BASE);
        assert!(r[1].base >= r[0].base + r[0].len);
        assert_eq!(r[1].base % REGION_ALIGN, 0);
    }

    #[test]
    fn model_heads_are_per_rank_times_tp_unless_stated() {
        let l: KvCacheLayout = "kv L=1 B=3 N=16 H=2 D=8 dtype=f16 order=NHD"
            .parse()
            .unwrap();
        let tp = |model_heads| SideTp {
            tp_size: 2,
            ranks: vec![0],
            model_heads,
        };
        assert_eq!(model_heads(&l, &tp(None)).unwrap(), 4);
        assert_eq!(model_heads(&l, &tp(Some(8))).unwrap(), 8);
    }
}
