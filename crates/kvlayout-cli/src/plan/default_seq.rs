//! The one sequence `kvlayout plan` plans when no `--seq` is given, and `kvlayout diff` plans
//! to show what a transfer needs: from SRC blocks `0..` into DST blocks `0..`, as many tokens
//! as fill whole blocks on both sides (the block sizes' least common multiple), or fewer where
//! a block pool holds fewer, or where a side would list more than [`MAX_BLOCK_IDS`] blocks.
//!
//! It owns the token count, the block ids and why the count is what it is. It checks nothing
//! against the planner's rules: block sizes that do not nest, or a per-block state whose
//! block sizes differ, are the planner's refusals.

use kvlayout::KvCacheLayout;
use kvlayout_connector::plan::SeqBlocks;

use super::seqs::MAX_BLOCK_IDS;

/// What bounds the default sequence's token count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenBound {
    /// The block sizes' least common multiple: whole blocks on both sides.
    WholeBlocks,
    /// Every block of the SRC pool.
    SrcPool,
    /// Every block of the DST pool.
    DstPool,
    /// [`MAX_BLOCK_IDS`] blocks on the side of the smaller blocks.
    BlockIds,
}

/// The default sequence, and what bounds its tokens.
#[derive(Debug, Clone)]
pub(crate) struct DefaultSeq {
    pub(crate) seq: SeqBlocks,
    pub(crate) bound: TokenBound,
    /// Tokens per block: `[SRC, DST]`.
    block_sizes: [u64; 2],
    /// Blocks in each pool: `[SRC, DST]`.
    pools: [u64; 2],
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The least common multiple of two block sizes (at least 1 each), `u64::MAX` past it.
fn lcm(a: u64, b: u64) -> u64 {
    (a / gcd(a, b).max(1)).saturating_mul(b)
}

/// The default sequence from `src` into `dst`: the least of the block sizes' least common
/// multiple, what each pool holds, and [`MAX_BLOCK_IDS`] blocks of either size, in tokens.
pub(crate) fn default_seq(src: &KvCacheLayout, dst: &KvCacheLayout) -> DefaultSeq {
    let (gs, gd) = (src.geometry(), dst.geometry());
    // Block sizes and pools are at least 1 in a valid layout.
    let (bs, bd) = (gs.block_size.max(1), gd.block_size.max(1));
    let ids = MAX_BLOCK_IDS as u64;
    let candidates = [
        (lcm(bs, bd), TokenBound::WholeBlocks),
        (gs.num_blocks.saturating_mul(bs), TokenBound::SrcPool),
        (gd.num_blocks.saturating_mul(bd), TokenBound::DstPool),
        (ids.saturating_mul(bs.min(bd)), TokenBound::BlockIds),
    ];
    // The first of the least: whole blocks where they fit.
    let (tokens, bound) =
        candidates
            .into_iter()
            .fold(candidates[0], |min, c| if c.0 < min.0 { c } else { min });
    // At most MAX_BLOCK_IDS ids per side: tokens <= MAX_BLOCK_IDS x the smaller size.
    let blocks = |size: u64| (0..tokens.div_ceil(size)).collect();
    DefaultSeq {
        seq: SeqBlocks {
            remote: blocks(bs),
            local: blocks(bd),
            tokens,
        },
        bound,
        block_sizes: [bs, bd],
        pools: [gs.num_blocks, gd.num_blocks],
    }
}

impl DefaultSeq {
    /// Why the sequence has its tokens, the sides named `src` and `dst`: e.g. "whole blocks
    /// on both sides, of 32 and 16 tokens", "all that B's 1 block of 16 tokens holds; A's blocks
    /// hold 32".
    pub(crate) fn why(&self, src: &str, dst: &str) -> String {
        let [bs, bd] = self.block_sizes;
        let blocks = |n: u64, size: u64| {
            let s = |n: u64| if n == 1 { "" } else { "s" };
            format!("{n} block{} of {size} token{}", s(n), s(size))
        };
        let pool = |(side, n, size): (&str, u64, u64), (other, other_size): (&str, u64)| {
            let verb = if n == 1 { "holds" } else { "hold" };
            format!(
                "all that {side}'s {} {verb}; {other}'s blocks hold {other_size}",
                blocks(n, size)
            )
        };
        match self.bound {
            TokenBound::WholeBlocks if bs == bd => "one whole block on each side".into(),
            TokenBound::WholeBlocks => {
                format!("whole blocks on both sides, of {bs} and {bd} tokens")
            }
            TokenBound::SrcPool => pool((src, self.pools[0], bs), (dst, bd)),
            TokenBound::DstPool => pool((dst, self.pools[1], bd), (src, bs)),
            TokenBound::BlockIds => {
                let (side, size) = if bs <= bd { (src, bs) } else { (dst, bd) };
                let most = blocks(MAX_BLOCK_IDS as u64, size);
                format!("{side}'s first {most}, the most one side lists")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(blocks: u64, n: u64) -> KvCacheLayout {
        format!("kv L=1 B={blocks} N={n} H=4 D=8 dtype=f16 order=NHD")
            .parse()
            .unwrap()
    }

    fn parts(d: &DefaultSeq) -> (Vec<u64>, Vec<u64>, u64, TokenBound) {
        (
            d.seq.remote.clone(),
            d.seq.local.clone(),
            d.seq.tokens,
            d.bound,
        )
    }

    #[test]
    fn large_pools_fill_whole_blocks_on_both_sides() {
        let d = default_seq(&layout(8, 16), &layout(8, 32));
        assert_eq!(
            parts(&d),
            (vec![0, 1], vec![0], 32, TokenBound::WholeBlocks)
        );
        let d = default_seq(&layout(8, 32), &layout(8, 16));
        assert_eq!(
            parts(&d),
            (vec![0], vec![0, 1], 32, TokenBound::WholeBlocks)
        );
        assert_eq!(
            d.why("A", "B"),
            "whole blocks on both sides, of 32 and 16 tokens"
        );
        let d = default_seq(&layout(3, 16), &layout(3, 16));
        assert_eq!(parts(&d), (vec![0], vec![0], 16, TokenBound::WholeBlocks));
        assert_eq!(d.why("A", "B"), "one whole block on each side");
        // Block sizes that do not nest: 48 tokens, 3 blocks of 16 into 2 of 24.
        let d = default_seq(&layout(8, 16), &layout(8, 24));
        assert_eq!(
            parts(&d),
            (vec![0, 1, 2], vec![0, 1], 48, TokenBound::WholeBlocks)
        );
    }

    #[test]
    fn a_small_pool_bounds_the_tokens_and_is_named() {
        // One 16-token block holds half of a 32-token block.
        let d = default_seq(&layout(1, 16), &layout(1, 32));
        assert_eq!(parts(&d), (vec![0], vec![0], 16, TokenBound::SrcPool));
        assert_eq!(
            d.why("A", "B"),
            "all that A's 1 block of 16 tokens holds; B's blocks hold 32"
        );
        let d = default_seq(&layout(1, 32), &layout(1, 16));
        assert_eq!(parts(&d), (vec![0], vec![0], 16, TokenBound::DstPool));
        assert_eq!(
            d.why("SRC", "DST"),
            "all that DST's 1 block of 16 tokens holds; SRC's blocks hold 32"
        );
        // Two blocks of 16 into part of one block of 64.
        let d = default_seq(&layout(2, 16), &layout(4, 64));
        assert_eq!(parts(&d), (vec![0, 1], vec![0], 32, TokenBound::SrcPool));
        assert!(d
            .why("A", "B")
            .starts_with("all that A's 2 blocks of 16 tokens hold;"));
    }

    #[test]
    fn block_ids_per_side_stay_within_the_limit() {
        let d = default_seq(&layout(4096, 1), &layout(8, 2048));
        let max = MAX_BLOCK_IDS as u64;
        assert_eq!(d.seq.tokens, max);
        assert_eq!(d.seq.remote, (0..max).collect::<Vec<_>>());
        assert_eq!(d.seq.local, vec![0]);
        assert_eq!(d.bound, TokenBound::BlockIds);
        assert_eq!(
            d.why("A", "B"),
            "A's first 1024 blocks of 1 token, the most one side lists"
        );
        let d = default_seq(&layout(8, 2048), &layout(4096, 1));
        assert_eq!((d.seq.remote.len(), d.seq.local.len()), (1, MAX_BLOCK_IDS));
        assert!(d.why("A", "B").starts_with("B's first 1024 blocks"));
    }

    #[test]
    fn lcm_saturates() {
        assert_eq!(lcm(16, 24), 48);
        assert_eq!(lcm(1, 1), 1);
        assert_eq!(lcm(u64::MAX, u64::MAX - 1), u64::MAX);
    }
}
