//! The demo's seeded data: streams of the commands' xorshift64 (the same on every machine) and each
//! prompt's block table drawn from a side's pool.
//!
//! It owns drawing the numbers; it does not own what they are written to (the prefill side)
//! or read back from (the verification).

use crate::CliError;

pub(crate) use crate::common::rng::Rng;

/// Stream `stream` of the demo's `--seed`: the keys and values of one prefill rank, the
/// queries of one layer, the block tables.
pub(crate) fn stream(seed: u64, stream: u64) -> Rng {
    Rng::seeded(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03))
}

/// Each prompt's blocks: distinct blocks of `0..pool` in a seeded order (blocks of
/// `block_size` tokens), or why they do not fit.
pub(crate) fn tables(
    side: &str,
    prompts: &[u32],
    block_size: u64,
    pool: u64,
    rng: &mut Rng,
) -> Result<Vec<Vec<u64>>, CliError> {
    let need: Vec<u64> = prompts
        .iter()
        .map(|&t| u64::from(t).div_ceil(block_size))
        .collect();
    let total: u64 = need.iter().sum();
    if total > pool {
        return Err(CliError::Usage(format!(
            "the prompts need {total} blocks of {block_size} tokens on the {side} side; its \
             pool has {pool} (raise --blocks or shorten --prompts)"
        )));
    }
    if i32::try_from(pool).is_err() {
        return Err(CliError::Usage(format!(
            "{side} side: B={pool} exceeds the block ids of a block table (i32)"
        )));
    }
    // The first `total` steps of a Fisher-Yates shuffle of `0..pool`, keeping only the moved
    // entries: memory for the blocks drawn, not the pool.
    let mut moved: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    let mut next = (0..total).map(|i| {
        let j = i + rng.next_u64() % (pool - i);
        let at_j = *moved.get(&j).unwrap_or(&j);
        let at_i = *moved.get(&i).unwrap_or(&i);
        moved.insert(j, at_i);
        at_j
    });
    Ok(need
        .iter()
        .map(|&n| next.by_ref().take(n as usize).collect())
        .collect())
}
