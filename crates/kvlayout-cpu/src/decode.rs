//! Fast path of `paged_decode` (to be specialized; currently the general path).

use kvlayout::ops::OpError;

use crate::args::Decode;
use crate::backend::CpuBackend;
use crate::cache::CacheRef;

pub(crate) fn paged_decode(
    _be: &CpuBackend,
    cache: &CacheRef<'_>,
    d: &Decode<'_>,
    out: &mut [f32],
) -> Result<(), OpError> {
    crate::reference::paged_decode(cache, d, out)
}
