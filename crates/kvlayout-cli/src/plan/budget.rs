//! A bound on a plan's size before the planner runs: the planner holds every unit of a plan
//! in memory (up to the connector's `MAX_PLAN_UNITS`, 64 Mi units of 32 bytes), so a layout
//! with huge pages, or many blocks of one, is refused here first, with the estimate.
//!
//! The estimate is the library's own move plan ([`MovePlan`]) of one block pair at the
//! paired block size, as the planner builds it, times the pairs and the SRC ranks read. It
//! counts the direct plan's units; it is applied to both plans, the staged one reading the
//! same rows into a dense staging cache in the SRC order, where they merge at least as well.

use kvlayout::ops::MovePlan;
use kvlayout::KvCacheLayout;
use kvlayout_connector::plan::SeqBlocks;

use crate::CliError;

/// Most units the CLI lets the planner enumerate: 16 Mi (512 MiB of runs).
pub(crate) const MAX_UNITS: u64 = 16 << 20;

/// The first `g` token slots of every block of `layout`, as the planner pairs them.
fn sub_block(layout: &KvCacheLayout, g: u64) -> Option<KvCacheLayout> {
    if g == layout.geometry().block_size {
        Some(layout.clone())
    } else {
        layout.slot_range(0..g).ok()
    }
}

/// Units a direct pull of `seqs` from `src` ranks into a `dst` rank enumerates, or `None`
/// where the planner refuses before enumerating (block sizes that do not nest, layouts
/// without a byte-run form).
pub(crate) fn estimate(
    src: &KvCacheLayout,
    dst: &KvCacheLayout,
    seqs: &[SeqBlocks],
) -> Option<u64> {
    let (bs, bd) = (src.geometry().block_size, dst.geometry().block_size);
    let g = bs.min(bd);
    if g == 0 || bs % g != 0 || bd % g != 0 {
        return None;
    }
    let (hs, hd) = (src.geometry().num_kv_heads, dst.geometry().num_kv_heads);
    let heads = hs.min(hd);
    let plan = MovePlan::new(&sub_block(src, g)?, &sub_block(dst, g)?, &(0..heads), 0)?;
    let per_pair: u64 = plan.pieces.iter().map(|p| p.units()).sum();
    let pairs: u64 = seqs
        .iter()
        .map(|s| {
            let held = |blocks: &[u64], size: u64| (blocks.len() as u64).saturating_mul(size);
            let tokens = s.tokens.min(held(&s.remote, bs)).min(held(&s.local, bd));
            tokens.div_ceil(g)
        })
        .fold(0u64, u64::saturating_add);
    let pulls = hd.div_ceil(heads.max(1));
    Some(per_pair.saturating_mul(pairs).saturating_mul(pulls))
}

/// Refuses a plan whose estimate is over [`MAX_UNITS`].
pub(crate) fn check(
    src: &KvCacheLayout,
    dst: &KvCacheLayout,
    seqs: &[SeqBlocks],
) -> Result<(), CliError> {
    match estimate(src, dst, seqs) {
        Some(units) if units > MAX_UNITS => Err(CliError::Usage(format!(
            "the plan would enumerate about {units} units (the move plan's units per block \
             pair x pairs x SRC ranks), over the limit of {MAX_UNITS}: plan fewer blocks"
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(s: &str) -> KvCacheLayout {
        s.parse().unwrap()
    }

    fn seq(remote: Vec<u64>, local: Vec<u64>, tokens: u64) -> SeqBlocks {
        SeqBlocks {
            remote,
            local,
            tokens,
        }
    }

    #[test]
    fn nhd_to_hnd_is_one_unit_per_token_and_head_row() {
        let (a, b) = (
            l("kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=NHD"),
            l("kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=HND"),
        );
        // Two blocks of 16 tokens, 4 heads, 2 layers: one K|V row per (layer, token, head).
        assert_eq!(
            estimate(&a, &b, &[seq(vec![0, 1], vec![2, 0], 32)]),
            Some(2 * 32 * 4)
        );
        assert!(check(&a, &b, &[seq(vec![0, 1], vec![2, 0], 32)]).is_ok());
    }

    #[test]
    fn a_huge_page_is_refused_before_planning() {
        let (a, b) = (
            l("kv L=4096 B=2 N=256 H=64 D=8 dtype=f16 order=NHD"),
            l("kv L=4096 B=2 N=256 H=64 D=8 dtype=f16 order=HND"),
        );
        let Err(CliError::Usage(m)) = check(&a, &b, &[seq(vec![0], vec![0], 256)]) else {
            panic!("accepted");
        };
        assert!(m.contains("about 67108864 units"), "{m}");
    }
}
