//! `kvlayout explain SPEC --svg FILE`: an SVG picture of a layout. It draws (1) the page of
//! layer 0, block 0, every stored element of every field at the byte offset `layout.offset`
//! gives it, with the page padding and arrows for the strides; (2) the field strides the
//! descriptor reports; (3) a field stored x-split (the legacy vLLM key) the way vLLM's
//! paged-attention document draws it; (4) how the first blocks tile each buffer. Each page
//! element carries `data-*` attributes (field, layer, block, head, token, dim, count, along,
//! buffer, offset, bytes) a program can check. It owns the picture, not the numbers: nothing
//! here computes an offset or a stride from a shape.

mod annotate;
mod canvas;
mod items;
mod page;
mod tiling;
mod xsplit;

use kvlayout::{Explanation, KvCacheLayout};

use crate::CliError;
use canvas::{field_colour, Canvas, GAP_FILL, LEFT, PADDING_FILL, UNDRAWN_FILL};

/// The drawing rule, stated in the picture's `<desc>` (and in the same numbers in `--help`).
pub const RULE: &str = "pages of at most 4096 elements are drawn one rectangle per element; \
larger pages one rectangle per run of address-contiguous elements (a row, a piece of a row, or \
one dim across consecutive tokens); past 2048 rows or 3072 runs only the first two and the last \
head and token of each field, and if still past 3072 runs the first 3008 and the last 64 runs \
in address order, with what is left out counted";

/// Writes the picture of `layout` to `path`.
pub fn write(layout: &KvCacheLayout, ex: &Explanation, path: &str) -> Result<(), CliError> {
    if path.is_empty() {
        return Err(CliError::Usage("--svg needs a file name, got \"\"".into()));
    }
    let svg = render(layout, ex)?;
    std::fs::write(path, svg).map_err(|e| CliError::File {
        path: path.to_string(),
        detail: format!("cannot write the SVG picture: {e}"),
    })
}

/// The SVG document.
pub fn render(layout: &KvCacheLayout, ex: &Explanation) -> Result<String, CliError> {
    let mut page = items::page_items(layout)?;
    let mut c = Canvas::new();
    header(&mut c, layout, ex, page.elided_elements > 0);
    strides(&mut c, ex);
    c.y += 12.0;
    c.line(
        "h",
        &format!(
            "Page of layer 0, block 0: {} B of data, byte offsets in the buffer",
            ex.dense_page_bytes
        ),
    );
    c.line(
        "m",
        if page.per_element {
            "one rectangle per element"
        } else {
            "one rectangle per run of address-contiguous elements"
        },
    );
    let at = c.raw_len();
    page::draw(&mut c, layout, ex, &mut page);
    c.insert(
        at,
        &format!(
            "<g id=\"page\" data-total-elements=\"{}\" data-drawn-elements=\"{}\">\n",
            page.total_elements,
            page.total_elements.saturating_sub(page.elided_elements)
        ),
    );
    c.raw("</g>\n");
    if !page.note.is_empty() {
        c.line("m", &page.note);
    }
    xsplit::draw(&mut c, layout, ex);
    tiling::draw(&mut c, layout, ex);
    let title = format!("kvlayout explain {}", ex.spec);
    let desc = format!(
        "One page (layer 0, block 0) of {}: {} elements, {} drawn as {} rectangles ({}); \
         fields {}. Rule: {RULE}.{}",
        ex.spec,
        page.total_elements,
        page.total_elements.saturating_sub(page.elided_elements),
        page.items.len(),
        if page.per_element {
            "one per element"
        } else {
            "one per run"
        },
        ex.fields
            .iter()
            .map(|f| format!("{} {}", f.field, field_colour(f.field)))
            .collect::<Vec<_>>()
            .join(", "),
        if page.note.is_empty() {
            String::new()
        } else {
            format!(" {}.", page.note)
        }
    );
    Ok(c.finish(&title, &desc))
}

/// The spec, geometry, page size and the legend.
fn header(c: &mut Canvas, layout: &KvCacheLayout, ex: &Explanation, elided: bool) {
    let g = layout.geometry();
    c.line("h", &format!("kvlayout explain: {}", ex.spec));
    c.line(
        "",
        &format!(
            "L={} B={} N={} H={}, slots per block {}, buffers {}",
            g.num_layers,
            g.num_blocks,
            g.block_size,
            g.num_kv_heads,
            ex.num_slots,
            layout.num_buffers(),
        ),
    );
    c.line(
        "",
        &match ex.padded_page_bytes {
            Some(p) if p > ex.dense_page_bytes => format!(
                "page: {} B of data, padded to {p} B ({} B padding)",
                ex.dense_page_bytes,
                p - ex.dense_page_bytes
            ),
            Some(p) => format!("page: {p} B, no padding"),
            None => format!(
                "page: {} B of data, not contiguous in this placement",
                ex.dense_page_bytes
            ),
        },
    );
    c.y += 10.0;
    let y = c.y;
    let mut x = 12.0;
    let mut swatch = |c: &mut Canvas, fill: &str, name: &str, kind: &str| {
        c.rect(
            x,
            y,
            14.0,
            14.0,
            fill,
            &format!(" class=\"r\" data-legend=\"{kind}\""),
        );
        c.text(x + 18.0, y + 11.0, "", name);
        x += 30.0 + name.len() as f64 * 6.8;
    };
    for f in &ex.fields {
        let name = f.field.to_string();
        swatch(c, field_colour(f.field), &name, &name);
    }
    swatch(c, PADDING_FILL, "padding", "padding");
    if elided {
        swatch(c, UNDRAWN_FILL, "page bytes not drawn", "undrawn");
    }
    swatch(c, GAP_FILL, "not this page's bytes", "gap");
    c.y += 16.0;
}

/// The field strides in bytes, as the descriptor reports them.
fn strides(c: &mut Canvas, ex: &Explanation) {
    c.y += 8.0;
    c.line("h", "Field strides (bytes)");
    let row = |cells: [String; 11]| {
        format!(
            "{:<8} {:<9} {:>6} {:>3} {:>10} {:>12} {:>10} {:>8} {:>8} {:>5} {:>6}",
            cells[0],
            cells[1],
            cells[2],
            cells[3],
            cells[4],
            cells[5],
            cells[6],
            cells[7],
            cells[8],
            cells[9],
            cells[10]
        )
    };
    let head = [
        "field", "dtype", "width", "buf", "base", "layer", "block", "head", "token", "x", "chunk",
    ]
    .map(String::from);
    c.raw("<g class=\"strides\">");
    let y = c.y + 15.0;
    let head = format!("{}  {:>4}", row(head), "dim");
    c.text(LEFT - 98.0, y, "", &head.replace(' ', "\u{a0}"));
    c.y = y;
    for f in &ex.fields {
        let s = f.strides_bytes;
        let split = s.dim_split != f.width;
        let cells = [
            f.field.to_string(),
            f.dtype.to_string(),
            f.width.to_string(),
            s.buffer.to_string(),
            s.base_offset.to_string(),
            s.layer.to_string(),
            s.block.to_string(),
            s.head.to_string(),
            s.slot.to_string(),
            if split {
                s.dim_split.to_string()
            } else {
                "-".into()
            },
            if split {
                s.dim_chunk.to_string()
            } else {
                "-".into()
            },
        ];
        let text = format!("{}  {:>4}", row(cells), s.dim).replace(' ', "\u{a0}");
        c.y += 15.0;
        c.raw(&format!(
            "<text x=\"12\" y=\"{}\" data-stride-field=\"{}\" data-stride-buffer=\"{}\" \
             data-stride-base=\"{}\" data-stride-layer=\"{}\" data-stride-block=\"{}\" \
             data-stride-head=\"{}\" data-stride-token=\"{}\" data-stride-x=\"{}\" \
             data-stride-chunk=\"{}\" data-stride-dim=\"{}\">{}</text>\n",
            canvas::num(c.y),
            f.field,
            s.buffer,
            s.base_offset,
            s.layer,
            s.block,
            s.head,
            s.slot,
            s.dim_split,
            s.dim_chunk,
            s.dim,
            canvas::esc(&text)
        ));
    }
    c.raw("</g>\n");
}

#[cfg(test)]
mod tests {
    use super::items::{ELEMENT_LIMIT, ROW_LIMIT, RUN_LIMIT};
    use super::RULE;

    /// The rule stated in the picture's description names the limits the code applies.
    #[test]
    fn the_stated_rule_names_the_limits() {
        for (limit, words) in [
            (ELEMENT_LIMIT, "at most {} elements"),
            (ROW_LIMIT, "past {} rows"),
            (RUN_LIMIT as u64, "or {} runs"),
            (RUN_LIMIT as u64, "still past {} runs"),
        ] {
            let phrase = words.replace("{}", &limit.to_string());
            assert!(RULE.contains(&phrase), "{phrase:?} not in {RULE:?}");
        }
    }

    /// `explain --help` states the same limits for `--svg`.
    #[test]
    fn the_help_names_the_limits() {
        use clap::CommandFactory;
        let cli = crate::Cli::command();
        let explain = cli.find_subcommand("explain").expect("explain");
        let svg = explain
            .get_arguments()
            .find(|a| a.get_id() == "svg")
            .expect("--svg");
        let help = svg.get_help().map(|h| h.to_string()).unwrap_or_default();
        for phrase in [
            format!("at most {ELEMENT_LIMIT} elements"),
            format!("past {ROW_LIMIT} rows or {RUN_LIMIT} runs"),
            format!("still past {RUN_LIMIT} runs"),
        ] {
            assert!(help.contains(&phrase), "{phrase:?} not in {help:?}");
        }
    }
}
