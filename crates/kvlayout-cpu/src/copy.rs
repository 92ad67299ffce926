//! Fast paths of the block movers (to be specialized; currently the general path).

use std::ops::Range;

use kvlayout::ops::OpError;

use crate::backend::CpuBackend;
use crate::cache::{CacheMut, CacheRef};
use crate::reference;

pub(crate) fn copy_blocks(
    _be: &CpuBackend,
    cache: &mut CacheMut<'_>,
    pairs: &[(u64, u64)],
) -> Result<(), OpError> {
    reference::copy_blocks(cache, pairs)
}

pub(crate) fn swap_blocks(
    _be: &CpuBackend,
    src: &CacheRef<'_>,
    dst: &mut CacheMut<'_>,
    pairs: &[(u64, u64)],
) -> Result<(), OpError> {
    reference::swap_blocks(src, dst, pairs)
}

pub(crate) fn gather_blocks(
    _be: &CpuBackend,
    cache: &CacheRef<'_>,
    blocks: &[u64],
    heads: Range<u64>,
    staging: &mut CacheMut<'_>,
) -> Result<(), OpError> {
    reference::gather_blocks(cache, blocks, heads, staging)
}

pub(crate) fn scatter_blocks(
    _be: &CpuBackend,
    staging: &CacheRef<'_>,
    blocks: &[u64],
    heads: Range<u64>,
    cache: &mut CacheMut<'_>,
) -> Result<(), OpError> {
    reference::scatter_blocks(staging, blocks, heads, cache)
}

pub(crate) fn convert(
    _be: &CpuBackend,
    src: &CacheRef<'_>,
    dst: &mut CacheMut<'_>,
) -> Result<(), OpError> {
    reference::convert(src, dst)
}
