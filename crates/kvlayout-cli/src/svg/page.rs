//! The page picture: the bytes of the page of layer 0, block 0 as lines of `bytes_per_line`
//! bytes, one band per contiguous byte range of the page (`layout.block_regions`; ranges a
//! line or less apart share a band, the bytes between them drawn as not the page's), each
//! item at the offset `layout.offset` gave it, and the page padding hatched. It does not
//! choose what is drawn ([`super::items`]), label it ([`super::annotate`]) or compute any
//! offset.

use std::fmt::Write as _;

use kvlayout::{merge_ranges, ByteRange, Explanation, KvCacheLayout};

use super::annotate;
use super::canvas::{
    esc, field_colour, num, Canvas, GAP_FILL, LEFT, PADDING_FILL, STRIP, UNDRAWN_FILL,
};
use super::items::{PageItems, REGION_LIMIT};

/// Vertical distance between lines of bytes.
pub(super) const LINE_H: f64 = 17.0;
/// Height of a drawn byte range.
const BOX_H: f64 = 14.0;
/// Lines the picture aims at: the bytes per line grow until the page fits in about this many.
const TARGET_LINES: u64 = 40;
/// Bands drawn at most; items of the bands past it are counted as not drawn.
const MAX_BANDS: usize = 24;

/// A contiguous range of one buffer drawn as consecutive lines from `y0`.
struct Band {
    buffer: u32,
    start: u64,
    end: u64,
    y0: f64,
}

/// Where bytes go on the canvas.
pub(super) struct Strip {
    bands: Vec<Band>,
    bytes_per_line: u64,
    px_per_byte: f64,
}

impl Strip {
    /// `(x, y, width)` of each line's part of `[offset, offset + bytes)`; empty when not drawn.
    pub(super) fn pieces(&self, buffer: u32, offset: u64, bytes: u64) -> Vec<(f64, f64, f64)> {
        let Some(band) = self
            .bands
            .iter()
            .find(|b| b.buffer == buffer && b.start <= offset && offset < b.end)
        else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let (mut at, end) = (
            offset - band.start,
            (offset + bytes).min(band.end) - band.start,
        );
        while at < end {
            let line = at / self.bytes_per_line;
            let line_end = ((line + 1) * self.bytes_per_line).min(end);
            let x = LEFT + (at % self.bytes_per_line) as f64 * self.px_per_byte;
            let y = band.y0 + line as f64 * LINE_H;
            out.push((x, y, (line_end - at) as f64 * self.px_per_byte));
            at = line_end;
        }
        out
    }
}

/// A rectangle, or a path of one rectangle per line when the range wraps.
fn shape(
    c: &mut Canvas,
    pieces: &[(f64, f64, f64)],
    fill: &str,
    class: &str,
    attrs: &str,
    title: &str,
) {
    let head = match pieces {
        [(x, y, w)] => format!(
            "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{BOX_H}\"",
            num(*x),
            num(*y),
            num(*w)
        ),
        _ => {
            let mut d = String::new();
            for (x, y, w) in pieces {
                let _ = write!(
                    d,
                    "M{} {}h{}v{BOX_H}h-{}Z",
                    num(*x),
                    num(*y),
                    num(*w),
                    num(*w)
                );
            }
            format!("<path d=\"{d}\"")
        }
    };
    let class = if class.is_empty() {
        String::new()
    } else {
        format!(" class=\"{class}\"")
    };
    c.raw(&format!(
        "{head} fill=\"{fill}\"{class}{attrs}><title>{}</title>{}\n",
        esc(title),
        if pieces.len() == 1 {
            "</rect>"
        } else {
            "</path>"
        }
    ));
}

/// The byte ranges of the page: the descriptor's block regions of layer 0, block 0 (or, for a
/// page past [`REGION_LIMIT`] elements or one it refuses to enumerate, the drawn items' ranges
/// merged).
fn page_ranges(layout: &KvCacheLayout, page: &PageItems) -> Vec<ByteRange> {
    let heads = layout.geometry().num_kv_heads;
    let of_items = || {
        let ranges = page.items.iter().map(|i| ByteRange {
            buffer: i.buffer,
            offset: i.offset,
            len: i.bytes,
        });
        merge_ranges(ranges.collect()).unwrap_or_default()
    };
    if page.total_elements > REGION_LIMIT {
        return of_items();
    }
    layout
        .block_regions(0, 0..1, 0..heads)
        .unwrap_or_else(|_| of_items())
}

/// The padding after the page's data when pages are contiguous and padded: `[end of data,
/// start + padded page)`.
fn padding(ex: &Explanation, ranges: &[ByteRange]) -> Option<ByteRange> {
    let padded = ex.padded_page_bytes?;
    let (first, last) = (ranges.first()?, ranges.last()?);
    let end = first.offset + padded;
    let data_end = last.offset + last.len;
    (first.buffer == last.buffer && end > data_end).then_some(ByteRange {
        buffer: first.buffer,
        offset: data_end,
        len: end - data_end,
    })
}

/// Draws the page picture and returns nothing; items past [`MAX_BANDS`] are counted in
/// `page` as not drawn.
pub fn draw(c: &mut Canvas, layout: &KvCacheLayout, ex: &Explanation, page: &mut PageItems) {
    let mut ranges = page_ranges(layout, page);
    let pad = padding(ex, &ranges);
    ranges.extend(pad);
    let total: u64 = ranges.iter().map(|r| r.len).sum();
    let bytes_per_line = total
        .div_ceil(TARGET_LINES)
        .checked_next_power_of_two()
        .unwrap_or(1 << 62)
        .max(64);
    // Ranges a line or less apart share a band.
    let mut merged: Vec<(u32, u64, u64)> = Vec::new();
    for r in &ranges {
        match merged.last_mut() {
            Some(m) if m.0 == r.buffer && r.offset >= m.2 && r.offset - m.2 <= bytes_per_line => {
                m.2 = m.2.max(r.offset + r.len)
            }
            _ => merged.push((r.buffer, r.offset, r.offset + r.len)),
        }
    }
    let dropped = merged.len().saturating_sub(MAX_BANDS);
    merged.truncate(MAX_BANDS);
    let several = merged.len() > 1;
    let mut strip = Strip {
        bands: Vec::new(),
        bytes_per_line,
        px_per_byte: STRIP / bytes_per_line as f64,
    };
    let mut prev: Option<(u32, u64)> = None;
    for (buffer, start, end) in merged {
        if several {
            let before = match prev {
                Some((b, e)) if b == buffer => {
                    format!(" ({} B of other pages before it)", start - e)
                }
                _ => String::new(),
            };
            c.y += 8.0;
            c.line(
                "m",
                &format!("buffer {buffer}, bytes {start}..{end}{before}"),
            );
        }
        if prev.is_none() {
            // Room for the stride arrows above the first line.
            c.y += 46.0;
        }
        c.y += 6.0;
        let y0 = c.y;
        let lines = (end - start).div_ceil(bytes_per_line);
        for i in 0..lines {
            let line_start = start + i * bytes_per_line;
            let y = y0 + i as f64 * LINE_H;
            let w = (end - line_start).min(bytes_per_line) as f64 * strip.px_per_byte;
            c.rect(LEFT, y, w, BOX_H, GAP_FILL, "");
            c.raw(&format!(
                "<text x=\"{}\" y=\"{}\" class=\"m\" text-anchor=\"end\">{line_start}</text>\n",
                num(LEFT - 6.0),
                num(y + 11.0)
            ));
        }
        c.y = y0 + lines as f64 * LINE_H;
        strip.bands.push(Band {
            buffer,
            start,
            end,
            y0,
        });
        prev = Some((buffer, end));
    }
    if page.elided_elements > 0 {
        for r in ranges.iter().filter(|r| Some(**r) != pad) {
            let pieces = strip.pieces(r.buffer, r.offset, r.len);
            if !pieces.is_empty() {
                let attrs = format!(
                    " data-kind=\"undrawn\" data-buffer=\"{}\" data-offset=\"{}\"",
                    r.buffer, r.offset
                );
                shape(c, &pieces, UNDRAWN_FILL, "", &attrs, "page bytes not drawn");
            }
        }
    }
    if let Some(p) = pad {
        let pieces = strip.pieces(p.buffer, p.offset, p.len);
        let attrs = format!(
            " data-kind=\"padding\" data-buffer=\"{}\" data-offset=\"{}\" data-bytes=\"{}\"",
            p.buffer, p.offset, p.len
        );
        let title = format!("page padding: {} B from byte {}", p.len, p.offset);
        shape(c, &pieces, PADDING_FILL, "r", &attrs, &title);
    }
    let mut hidden = 0u64;
    page.items.retain(|i| {
        let drawn = !strip.pieces(i.buffer, i.offset, i.bytes).is_empty();
        hidden += u64::from(!drawn) * i.count;
        drawn
    });
    if dropped > 0 || hidden > 0 {
        page.elided_elements += hidden;
        let sep = if page.note.is_empty() { "" } else { "; " };
        page.note = format!(
            "{}{sep}{hidden} elements in the {dropped} byte ranges of the page past the first \
             {MAX_BANDS} not drawn",
            page.note
        );
    }
    draw_items(c, &strip, page);
    draw_cut(c, &strip, page);
    annotate::labels(c, &strip, &page.items);
    annotate::arrows(c, &strip, layout, ex);
}

/// One shape per item, with its coordinates and offset as data attributes.
fn draw_items(c: &mut Canvas, strip: &Strip, page: &PageItems) {
    for i in &page.items {
        let pieces = strip.pieces(i.buffer, i.offset, i.bytes);
        let attrs = format!(
            " data-field=\"{}\" data-layer=\"0\" data-block=\"0\" data-head=\"{}\" \
             data-token=\"{}\" data-dim=\"{}\" data-count=\"{}\" data-along=\"{}\" \
             data-buffer=\"{}\" data-offset=\"{}\" data-bytes=\"{}\"",
            i.field,
            i.head,
            i.slot,
            i.dim,
            i.count,
            i.along.name(),
            i.buffer,
            i.offset,
            i.bytes
        );
        let title = format!("{} @{}, {} B", i.label(), i.offset, i.bytes);
        shape(c, &pieces, field_colour(i.field), "", &attrs, &title);
    }
}

/// The marker where runs were left out: a dashed outline over the bytes between the runs
/// kept (where they are drawn) and a line saying how many runs are not drawn.
fn draw_cut(c: &mut Canvas, strip: &Strip, page: &PageItems) {
    let Some(((buffer, start, end), runs)) = page.cut else {
        return;
    };
    let title = format!("… {runs} more runs not drawn …");
    let pieces = strip.pieces(buffer, start, end.saturating_sub(start));
    if !pieces.is_empty() {
        shape(c, &pieces, "none", "r", " stroke-dasharray=\"3 2\"", &title);
    }
    c.y += 15.0;
    let y = c.y;
    c.raw(&format!(
        "<text x=\"{}\" y=\"{}\" data-kind=\"elided\" data-runs=\"{runs}\" \
         data-buffer=\"{buffer}\" data-offset=\"{start}\">{} (bytes {start}..{end})</text>\n",
        num(LEFT),
        num(y),
        esc(&title)
    ));
}
