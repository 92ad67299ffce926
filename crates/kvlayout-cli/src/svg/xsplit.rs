//! The legacy vLLM x-split key drawn as vLLM's paged-attention document draws it: the key of
//! one head of one block as `head_size / x` groups, each `block_size` tokens by `x` elements,
//! every cell carrying the offset `layout.offset` gives it. Only fields stored x-split are
//! drawn; the group count, x and the strides come from the descriptor's field map.

use kvlayout::{Coord, Explanation, FieldMap, KvCacheLayout};

use super::canvas::{field_colour, num, Canvas, LEFT, STRIP};

/// Cells drawn per field, at most: past it, the first groups and the last one.
const MAX_CELLS: u64 = 2048;
/// Side of a cell in pixels.
const CELL: f64 = 10.0;
/// Tokens drawn per group, at most: past it, the first ones and the last.
const MAX_TOKENS: u64 = 64;
/// Space between groups.
const GROUP_GAP: f64 = 14.0;

/// Draws every x-split field.
pub fn draw(c: &mut Canvas, layout: &KvCacheLayout, ex: &Explanation) {
    for (m, info) in layout.stored_fields().iter().zip(&ex.fields) {
        if m.is_dim_split() {
            draw_field(c, layout, m, info.strides_bytes);
        }
    }
}

/// One field's groups of head 0, block 0, layer 0.
fn draw_field(c: &mut Canvas, layout: &KvCacheLayout, m: &FieldMap, s: kvlayout::FieldStrides) {
    let x = s.dim_split.max(1);
    let groups = m.width / x;
    if x > MAX_TOKENS {
        c.line(
            "m",
            &format!(
                "{} stored x-split with x = {x}: too wide to draw cell by cell",
                m.field
            ),
        );
        return;
    }
    let slots = m.num_slots;
    let tokens: Vec<u64> = if slots <= MAX_TOKENS {
        (0..slots).collect()
    } else {
        (0..MAX_TOKENS - 1)
            .chain(std::iter::once(slots - 1))
            .collect()
    };
    let per_group = (tokens.len() as u64).saturating_mul(x).max(1);
    let shown: Vec<u64> = if groups.saturating_mul(per_group) <= MAX_CELLS {
        (0..groups).collect()
    } else {
        let first = (MAX_CELLS / per_group).saturating_sub(1).max(1).min(groups);
        (0..first).chain(std::iter::once(groups - 1)).collect()
    };
    c.y += 12.0;
    c.line(
        "h",
        &format!(
            "{} stored x-split (vLLM's paged-attention picture): head 0 of block 0 as {groups} \
             groups of {slots} tokens x {x} elements",
            m.field
        ),
    );
    c.line(
        "",
        &format!(
            "x = {x} elements ({} B) per token in a group; tokens +{} B apart, groups +{} B \
             apart, heads +{} B apart",
            x * m.elem_bytes(),
            s.slot,
            s.dim_chunk,
            s.head
        ),
    );
    if (tokens.len() as u64) < slots {
        c.line(
            "m",
            &format!("tokens {}..{} not drawn", MAX_TOKENS - 1, slots - 2),
        );
    }
    if (shown.len() as u64) < groups {
        c.line(
            "m",
            &format!(
                "groups {}..{} not drawn (at most {MAX_CELLS} cells)",
                shown[shown.len() - 2] + 1,
                groups - 2
            ),
        );
    }
    let group_w = x as f64 * CELL + GROUP_GAP;
    let per_row = ((STRIP / group_w).floor() as usize).max(1);
    let colour = field_colour(m.field);
    for chunk in shown.chunks(per_row) {
        c.y += 18.0;
        let y0 = c.y;
        for (row, &n) in tokens.iter().enumerate() {
            if row % 4 == 0 || row + 1 == tokens.len() {
                let y = y0 + row as f64 * CELL + 8.0;
                c.text(LEFT - 30.0, y, "s", &format!("t{n}"));
            }
        }
        for (k, &g) in chunk.iter().enumerate() {
            let gx = LEFT + k as f64 * group_w;
            c.text(gx, y0 - 3.0, "s", &format!("d{}..{}", g * x, g * x + x - 1));
            for (row, &n) in tokens.iter().enumerate() {
                for i in 0..x {
                    let dim = g * x + i;
                    let Ok(at) = layout.offset(&Coord::new(m.field, 0, 0, 0, n, dim)) else {
                        continue;
                    };
                    c.raw(&format!(
                        "<rect x=\"{}\" y=\"{}\" width=\"{CELL}\" height=\"{CELL}\" fill=\"{colour}\" \
                         data-x-field=\"{}\" data-x-token=\"{n}\" data-x-dim=\"{dim}\" \
                         data-x-offset=\"{}\"/>\n",
                        num(gx + i as f64 * CELL),
                        num(y0 + row as f64 * CELL),
                        m.field,
                        at.offset
                    ));
                }
            }
        }
        c.y = y0 + tokens.len() as f64 * CELL + 6.0;
    }
}
