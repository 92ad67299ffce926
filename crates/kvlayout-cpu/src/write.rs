//! Fast path of `write_kv` (to be specialized; currently the general path).

use kvlayout::ops::OpError;

use crate::args::WriteKv;
use crate::backend::CpuBackend;
use crate::cache::CacheMut;

pub(crate) fn write_kv(
    _be: &CpuBackend,
    cache: &mut CacheMut<'_>,
    w: &WriteKv<'_>,
) -> Result<(), OpError> {
    crate::reference::write_kv(cache, w)
}
