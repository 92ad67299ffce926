//! Annotations over the page picture: labels over the runs of one token's row or of one dim
//! across tokens where they fit, and arrows from the first element of the first field to the
//! next token, head and x-chunk, labelled with the strides the descriptor reports. It places
//! text by the page's [`Strip`]; it draws no element and computes no offset.

use kvlayout::{Coord, Explanation, Field, KvCacheLayout};

use super::canvas::{num, Canvas};
use super::items::{Along, Item};
use super::page::Strip;

/// Labels over groups of touching items of one field and head on one line: the elements of
/// one token (`k h0 t3`) or one dim across tokens (`v h0 t0..15 d3`), where they fit.
pub fn labels(c: &mut Canvas, strip: &Strip, items: &[Item]) {
    let mut i = 0;
    while i < items.len() {
        let first = &items[i];
        let next = |j: usize| {
            let (p, n) = (&items[j - 1], items.get(j)?);
            let touching = n.field == first.field
                && n.head == first.head
                && n.buffer == p.buffer
                && n.offset == p.end();
            Some((touching, n))
        };
        let mut j = i + 1;
        // A token's row: items of the same slot; else one dim across consecutive slots.
        let by_token =
            first.along == Along::Dim && next(j).is_some_and(|(t, n)| t && n.slot == first.slot);
        let by_dim = first.count == 1
            && next(j).is_some_and(|(t, n)| t && n.dim == first.dim && n.count == 1);
        while let Some((true, n)) = next(j) {
            let same = if by_token {
                n.slot == first.slot && n.along == Along::Dim
            } else {
                by_dim && n.dim == first.dim && n.count == 1 && n.slot == items[j - 1].slot + 1
            };
            if !same {
                break;
            }
            j += 1;
        }
        let last = &items[j - 1];
        let text = if by_dim {
            format!(
                "{} h{} t{}..{} d{}",
                first.field, first.head, first.slot, last.slot, first.dim
            )
        } else if by_token || first.along == Along::Dim && first.count > 1 {
            let (a, b) = (first.dim, last.dim + last.count - 1);
            let dims = if (a, b) == (0, first.width - 1) {
                String::new()
            } else {
                format!(" d{a}..{b}")
            };
            format!("{} h{} t{}{dims}", first.field, first.head, first.slot)
        } else if first.count > 1 {
            first.label()
        } else {
            String::new()
        };
        let class = if matches!(first.field, Field::Ssm | Field::Conv) {
            "ld"
        } else {
            "l"
        };
        let pieces = strip.pieces(first.buffer, first.offset, last.end() - first.offset);
        if let Some(&(x, y, w)) = pieces.first() {
            if !text.is_empty() && w >= text.len() as f64 * 6.1 + 4.0 {
                c.text(x + 3.0, y + 10.5, class, &text);
            }
        }
        i = j;
    }
}

/// Arrows from the first element of the first field to the next token, head and x-chunk.
pub fn arrows(c: &mut Canvas, strip: &Strip, layout: &KvCacheLayout, ex: &Explanation) {
    let (Some(m), Some(info)) = (layout.stored_fields().first(), ex.fields.first()) else {
        return;
    };
    let s = info.strides_bytes;
    let at = |head: u64, slot: u64, dim: u64| {
        layout
            .offset(&Coord::new(m.field, 0, 0, head, slot, dim))
            .ok()
            .and_then(|l| {
                strip
                    .pieces(l.buffer, l.offset, m.elem_bytes())
                    .first()
                    .copied()
            })
    };
    let mut arrows = Vec::new();
    if m.num_slots > 1 {
        arrows.push((at(0, 1, 0), format!("token +{} B", s.slot)));
    }
    if m.num_heads > 1 {
        arrows.push((at(1, 0, 0), format!("head +{} B", s.head)));
    }
    if m.is_dim_split() {
        arrows.push((at(0, 0, s.dim_split), format!("x-chunk +{} B", s.dim_chunk)));
    }
    let Some((xa, ya, wa)) = at(0, 0, 0) else {
        return;
    };
    let xa = xa + wa / 2.0;
    for (k, (to, label)) in arrows.into_iter().enumerate() {
        let Some((xb, yb, wb)) = to else { continue };
        let xb = xb + wb / 2.0;
        let lift = 12.0 + 12.0 * k as f64;
        let top = ya.min(yb) - lift;
        c.raw(&format!(
            "<path class=\"a\" marker-end=\"url(#arrow)\" d=\"M{} {}C{} {} {} {} {} {}\"/>\n",
            num(xa),
            num(ya + 2.0),
            num(xa),
            num(top),
            num(xb),
            num(top),
            num(xb),
            num(yb + 1.0)
        ));
        let x = ((xa + xb) / 2.0 - label.len() as f64 * 3.0).max(4.0);
        c.text(x, top - 1.0, "al", &label);
    }
}
