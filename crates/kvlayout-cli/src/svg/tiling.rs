//! The tiling overview: how the first blocks of layer 0 lie in each buffer. Each block's byte
//! ranges come from `layout.block_regions`; a range is coloured by the fields whose elements
//! of that block reach into it (ends from `layout.offset`); padding between pages is drawn to
//! scale, any other gap as a break with its size. A line per field says in which order heads,
//! tokens and dims follow each other (by the strides the descriptor reports) and whether
//! K/V are outermost. It computes no offset itself.

use kvlayout::{ByteRange, Coord, Explanation, Field, FieldMap, KvCacheLayout};

use super::canvas::{field_colour, num, Canvas, LEFT, PADDING_FILL, STRIP};
use super::items::REGION_LIMIT;

/// Blocks pictured per buffer, at most.
const BLOCKS: u64 = 4;
/// Ranges pictured per buffer, at most.
const MAX_RANGES: usize = 48;
/// Width of a break standing for bytes not of the pictured blocks, at most (breaks share at
/// most 40% of the strip).
const BREAK_W: f64 = 64.0;
/// Height of the strip.
const BAR_H: f64 = 26.0;

/// One piece of a buffer's strip.
enum Piece {
    /// A byte range of one block: `(block, range, fields in it)`.
    Block(u64, ByteRange, Vec<Field>),
    /// Page padding (to scale).
    Padding(ByteRange),
    /// Bytes of other pages or before the first page (a break).
    Break(u64, u64),
}

/// `[first, last]` byte of field `m`'s elements of `block` in layer 0.
fn field_extent(layout: &KvCacheLayout, m: &FieldMap, block: u64) -> Option<(u64, u64)> {
    let first = layout
        .offset(&Coord::new(m.field, 0, block, 0, 0, 0))
        .ok()?;
    let last = layout
        .offset(&Coord::new(
            m.field,
            0,
            block,
            m.num_heads.checked_sub(1)?,
            m.num_slots.checked_sub(1)?,
            m.width.checked_sub(1)?,
        ))
        .ok()?;
    Some((first.offset, last.offset + m.elem_bytes()))
}

/// The pieces of buffer `buffer`'s strip, in address order.
fn pieces(layout: &KvCacheLayout, ex: &Explanation, buffer: u32) -> Vec<Piece> {
    let heads = layout.geometry().num_kv_heads;
    let blocks = layout.geometry().num_blocks.min(BLOCKS);
    let mut ranges: Vec<(u64, ByteRange)> = Vec::new();
    for block in 0..blocks {
        if let Ok(rs) = layout.block_regions(block, 0..1, 0..heads) {
            ranges.extend(
                rs.into_iter()
                    .filter(|r| r.buffer == buffer)
                    .map(|r| (block, r)),
            );
        }
    }
    ranges.sort_by_key(|(_, r)| r.offset);
    ranges.truncate(MAX_RANGES);
    let padding = ex
        .padded_page_bytes
        .map(|p| p.saturating_sub(ex.dense_page_bytes));
    let mut out = Vec::new();
    let mut at = 0u64;
    for (block, r) in ranges {
        let gap = r.offset.saturating_sub(at);
        if gap > 0 && Some(gap) == padding && at > 0 {
            out.push(Piece::Padding(ByteRange {
                buffer,
                offset: at,
                len: gap,
            }));
        } else if gap > 0 {
            out.push(Piece::Break(at, r.offset));
        }
        let fields = layout
            .stored_fields()
            .iter()
            .filter(|m| m.strides.buffer == buffer)
            .filter(|m| {
                field_extent(layout, m, block)
                    .is_some_and(|(a, b)| a < r.offset + r.len && r.offset < b)
            })
            .map(|m| m.field)
            .collect();
        out.push(Piece::Block(block, r, fields));
        at = r.offset + r.len;
    }
    if let (Some(p), Some(Piece::Block(..))) = (padding.filter(|&p| p > 0), out.last()) {
        out.push(Piece::Padding(ByteRange {
            buffer,
            offset: at,
            len: p,
        }));
    }
    out
}

/// Elements of one page, all fields.
fn page_elements(layout: &KvCacheLayout) -> u64 {
    layout
        .stored_fields()
        .iter()
        .map(|m| {
            m.num_heads
                .saturating_mul(m.num_slots)
                .saturating_mul(m.width)
        })
        .fold(0, u64::saturating_add)
}

/// Draws the overview of every buffer and the order lines.
pub fn draw(c: &mut Canvas, layout: &KvCacheLayout, ex: &Explanation) {
    let g = layout.geometry();
    c.y += 12.0;
    c.line(
        "h",
        &format!(
            "How blocks tile the buffer{}: layer 0, blocks 0..{} of {}",
            if layout.num_buffers() > 1 { "s" } else { "" },
            g.num_blocks.min(BLOCKS) - 1,
            g.num_blocks
        ),
    );
    if page_elements(layout) > REGION_LIMIT {
        c.line(
            "m",
            &format!("more than {REGION_LIMIT} elements per page: too many ranges to picture"),
        );
        order_lines(c, layout, ex);
        return;
    }
    for buffer in 0..layout.num_buffers() as u32 {
        let ps = pieces(layout, ex, buffer);
        c.line("m", &format!("buffer {buffer}"));
        c.y += 16.0;
        draw_strip(c, &ps, buffer);
        c.y += BAR_H + 16.0;
    }
    let block_stride = ex.fields.first().map_or(0, |f| f.strides_bytes.block);
    if g.num_blocks > BLOCKS {
        c.line(
            "m",
            &format!(
                "blocks {BLOCKS}..{} follow, {block_stride} B apart (the block stride)",
                g.num_blocks - 1
            ),
        );
    }
    order_lines(c, layout, ex);
}

/// One buffer's strip: ranges and padding to scale, breaks of fixed width.
fn draw_strip(c: &mut Canvas, ps: &[Piece], buffer: u32) {
    let breaks = ps.iter().filter(|p| matches!(p, Piece::Break(..))).count() as f64;
    let scaled: u64 = ps
        .iter()
        .map(|p| match p {
            Piece::Block(_, r, _) | Piece::Padding(r) => r.len,
            Piece::Break(..) => 0,
        })
        .sum();
    let break_w = BREAK_W.min(STRIP * 0.4 / breaks.max(1.0));
    // Ranges get at least 3 px each; the rest of the strip is shared by their bytes.
    let ranges = ps.len() as f64 - breaks;
    let px = (STRIP - breaks * break_w - 3.0 * ranges).max(64.0) / scaled.max(1) as f64;
    let y = c.y;
    let mut x = LEFT;
    let mut label_end = 0.0;
    for p in ps {
        let (w, start) = match p {
            Piece::Block(block, r, fields) => {
                let w = r.len as f64 * px + 3.0;
                let stripe = BAR_H / fields.len().max(1) as f64;
                let names: Vec<String> = fields.iter().map(|f| f.to_string()).collect();
                let attrs = format!(
                    " class=\"r\" data-tile-buffer=\"{buffer}\" data-tile-block=\"{block}\" \
                     data-tile-offset=\"{}\" data-tile-bytes=\"{}\" data-tile-fields=\"{}\"",
                    r.offset,
                    r.len,
                    names.join(" ")
                );
                c.raw(&format!("<g{attrs}>"));
                for (k, f) in fields.iter().enumerate() {
                    c.rect(x, y + k as f64 * stripe, w, stripe, field_colour(*f), "");
                }
                c.raw(&format!(
                    "<title>block {block}: bytes {}..{} ({})</title></g>\n",
                    r.offset,
                    r.offset + r.len,
                    names.join(", ")
                ));
                let text = format!("b{block} {}", names.join("+"));
                if w >= text.len() as f64 * 6.1 + 4.0 {
                    c.text(x + 3.0, y - 4.0, "s", &text);
                } else if w >= 14.0 {
                    c.text(x + 1.0, y - 4.0, "s", &format!("b{block}"));
                }
                (w, r.offset)
            }
            Piece::Padding(r) => {
                let w = r.len as f64 * px;
                let attrs = format!(
                    " class=\"r\" data-tile-kind=\"padding\" data-tile-offset=\"{}\" \
                     data-tile-bytes=\"{}\"",
                    r.offset, r.len
                );
                c.rect(x, y, w, BAR_H, PADDING_FILL, &attrs);
                (w, r.offset)
            }
            Piece::Break(a, b) => {
                let text = format!("… {} B …", b - a);
                if break_w >= text.chars().count() as f64 * 5.6 {
                    c.raw(&format!(
                        "<text x=\"{}\" y=\"{}\" class=\"s\" text-anchor=\"middle\">{text}</text>\n",
                        num(x + break_w / 2.0),
                        num(y + BAR_H / 2.0 + 3.0),
                    ));
                } else {
                    c.raw(&format!(
                        "<text x=\"{}\" y=\"{}\" class=\"s\" text-anchor=\"middle\">…</text>\n",
                        num(x + break_w / 2.0),
                        num(y + BAR_H / 2.0 + 3.0),
                    ));
                }
                (break_w, *a)
            }
        };
        if x >= label_end {
            c.text(x, y + BAR_H + 11.0, "s", &start.to_string());
            label_end = x + start.to_string().len() as f64 * 5.6 + 6.0;
        }
        x += w;
    }
}

/// Per field: heads, tokens and dims by decreasing stride (the strides the descriptor
/// reports), and whether the field's blocks all lie before another field's first block.
fn order_lines(c: &mut Canvas, layout: &KvCacheLayout, ex: &Explanation) {
    for (m, info) in layout.stored_fields().iter().zip(&ex.fields) {
        let s = info.strides_bytes;
        let mut axes: Vec<(&str, u64, u64)> = vec![
            ("head", s.head, m.num_heads),
            ("token", s.slot, m.num_slots),
            ("dim", s.dim, s.dim_split),
        ];
        if m.is_dim_split() {
            axes.push(("x-chunk", s.dim_chunk, m.width / s.dim_split.max(1)));
        }
        axes.retain(|a| a.2 > 1);
        axes.sort_by_key(|a| std::cmp::Reverse(a.1));
        let order: Vec<String> = axes
            .iter()
            .map(|(name, stride, _)| format!("{name} (+{stride} B)"))
            .collect();
        c.line(
            "",
            &format!(
                "{}: block +{} B, layer +{} B; within a page, outermost first: {}",
                m.field,
                s.block,
                s.layer,
                if order.is_empty() {
                    "one element".to_string()
                } else {
                    order.join(" > ")
                }
            ),
        );
    }
    let b = layout.geometry().num_blocks;
    let fields = layout.stored_fields();
    for w in fields.windows(2) {
        let (a, z) = (&w[0], &w[1]);
        let (Some((_, a_end)), Some((z_start, _))) =
            (field_extent(layout, a, b - 1), field_extent(layout, z, 0))
        else {
            continue;
        };
        if a.strides.buffer == z.strides.buffer && b > 1 && a_end <= z_start {
            c.line(
                "",
                &format!(
                    "{} and {} outermost: {} of every block lies before {} of block 0 (byte {})",
                    a.field, z.field, a.field, z.field, z_start
                ),
            );
        }
    }
}
