//! Block pairs at the paired block size: which sub-block of which remote block goes to which
//! sub-block of which local block, grouped by the sub-blocks' places in their blocks, with the
//! checks (blocks in range, enough blocks, no local sub-block written twice). Owns the
//! pairing only; runs are [`super::Pull`]'s.

use std::collections::{BTreeMap, HashSet};

use kvlayout::KvCacheLayout;

use super::{PlanError, SeqBlocks};

/// Token slots `j*g..(j+1)*g` of every block of `layout`, as a layout of `g`-token blocks
/// (the layout itself when that is the whole block).
pub(super) fn sub_view(layout: &KvCacheLayout, j: u64, g: u64) -> Result<KvCacheLayout, PlanError> {
    if j == 0 && g == layout.geometry().block_size {
        return Ok(layout.clone());
    }
    layout.slot_range(j * g..(j + 1) * g).map_err(|e| {
        PlanError::BlockSize(format!(
            "tokens {}..{} of {}-token blocks: {e}",
            j * g,
            (j + 1) * g,
            layout.geometry().block_size
        ))
    })
}

/// `(j, j') -> [(remote block, local block)]`.
pub(super) type SubBlockGroups = BTreeMap<(u64, u64), Vec<(u64, u64)>>;

/// Block pairs at `g` tokens per sub-block, grouped by the sub-blocks' places `(j, j')` in
/// their blocks: `(j, j') -> [(remote block, local block)]`. Validated: blocks in range,
/// enough blocks for the tokens, no local sub-block written twice.
pub(super) fn sub_block_pairs(
    seqs: &[SeqBlocks],
    (br, bl, g): (u64, u64, u64),
    (nr, nl): (u64, u64),
) -> Result<SubBlockGroups, PlanError> {
    let mut pairs = SubBlockGroups::new();
    // Every local sub-block written, in order; a duplicate is looked for after the loop (a
    // sort is cheaper than hashing each, and the error's slow path finds the first).
    let mut written: Vec<(u64, u64)> = Vec::new();
    for (seq, s) in seqs.iter().enumerate() {
        let fail = |reason: String| PlanError::Mapping { seq, reason };
        for (what, blocks, size, limit) in
            [("remote", &s.remote, br, nr), ("local", &s.local, bl, nl)]
        {
            let need = s.tokens.div_ceil(size);
            if (blocks.len() as u64) < need {
                return Err(fail(format!(
                    "{} {what} blocks for {} tokens of {size}-token blocks (needs {need})",
                    blocks.len(),
                    s.tokens
                )));
            }
            if let Some(&b) = blocks.iter().find(|&&b| b >= limit) {
                return Err(fail(format!("{what} block {b} not below {limit}")));
            }
        }
        for c in 0..s.tokens.div_ceil(g) {
            let t = c * g;
            let (remote, j) = (s.remote[(t / br) as usize], (t % br) / g);
            let (local, jl) = (s.local[(t / bl) as usize], (t % bl) / g);
            written.push((local, jl));
            pairs.entry((j, jl)).or_default().push((remote, local));
        }
    }
    written.sort_unstable();
    if written.windows(2).any(|w| w[0] == w[1]) {
        return Err(first_written_twice(seqs, (bl, g)));
    }
    Ok(pairs)
}

/// The error for the first local sub-block that `seqs` write twice (one is known to exist):
/// its sequence, its first token and its local block.
fn first_written_twice(seqs: &[SeqBlocks], (bl, g): (u64, u64)) -> PlanError {
    let mut seen = HashSet::new();
    for (seq, s) in seqs.iter().enumerate() {
        for c in 0..s.tokens.div_ceil(g) {
            let t = c * g;
            let (local, jl) = (s.local[(t / bl) as usize], (t % bl) / g);
            if !seen.insert((local, jl)) {
                return PlanError::Mapping {
                    seq,
                    reason: format!("tokens {t}.. go to local block {local} twice"),
                };
            }
        }
    }
    PlanError::Mapping {
        seq: 0,
        reason: "a local block is written twice".into(),
    }
}
