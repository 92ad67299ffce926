//! Which element a byte of a cache belongs to: for the harnesses' reports of a byte that
//! differs from the reference's.

use pyo3::prelude::*;

use crate::layout::Layout;

/// Most elements `element_at` visits before it answers `None`.
const MAX_ELEMENTS: u64 = 1 << 24;

/// The module's function.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(element_at, m)?)?;
    Ok(())
}

/// The stored element holding byte ``offset`` of buffer ``buffer``: ``(field, layer,
/// block, head, slot, dim)``, or ``None`` for a byte no element holds (padding, or outside
/// the layout). Visits the elements one by one, so layouts of more than 2**24 stored elements
/// answer ``None``.
#[pyfunction]
fn element_at(
    layout: &Layout,
    buffer: u32,
    offset: u64,
) -> Option<(String, u64, u64, u64, u64, u64)> {
    let fields = layout.inner.stored_fields();
    let total: u64 = fields
        .iter()
        .map(|m| m.num_layers * m.num_blocks * m.num_heads * m.num_slots * m.width)
        .sum();
    if total > MAX_ELEMENTS {
        return None;
    }
    for m in fields.iter().filter(|m| m.strides.buffer == buffer) {
        let e = m.elem_bytes();
        for l in 0..m.num_layers {
            for b in 0..m.num_blocks {
                for h in 0..m.num_heads {
                    for n in 0..m.num_slots {
                        for d in 0..m.width {
                            let at = m.offset_unchecked(l, b, h, n, d);
                            if (at..at + e).contains(&offset) {
                                return Some((m.field.to_string(), l, b, h, n, d));
                            }
                        }
                    }
                }
            }
        }
    }
    None
}
