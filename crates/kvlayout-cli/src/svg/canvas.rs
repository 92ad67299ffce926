//! The SVG text of a picture: an append-only body of shapes and labels, a vertical cursor,
//! the field colours, and the document wrapper (`<title>`, `<desc>`, style, hatch pattern).
//! It owns how things are written, not where they go or what they mean.

use std::fmt::Write as _;

use kvlayout::Field;

/// Width of the drawing in pixels.
pub const WIDTH: f64 = 1200.0;
/// Left edge of strips: the margin before it holds byte offsets.
pub const LEFT: f64 = 110.0;
/// Width of a strip of bytes.
pub const STRIP: f64 = 1024.0;

/// Fill of a field's elements: one distinct colour per field.
pub fn field_colour(field: Field) -> &'static str {
    match field {
        Field::K => "#4e79a7",
        Field::V => "#f28e2b",
        Field::KScale => "#59a14f",
        Field::VScale => "#e15759",
        Field::Latent => "#b07aa1",
        Field::Bytes => "#9c755f",
        Field::Conv => "#76b7b2",
        Field::Ssm => "#edc948",
    }
}

/// Fill of padding (a hatch pattern defined in the document).
pub const PADDING_FILL: &str = "url(#padding)";
/// Fill of the page's bytes whose elements the cap left out.
pub const UNDRAWN_FILL: &str = "#c8c8c8";
/// Fill of bytes inside a drawn range that belong to no element of the page.
pub const GAP_FILL: &str = "#f4f4f4";

/// Escapes text for an attribute value or element content.
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            c => o.push(c),
        }
    }
    o
}

/// A number with at most two decimals and no trailing zeros (compact coordinates).
pub fn num(v: f64) -> String {
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() || s == "-0" {
        "0".into()
    } else {
        s.into()
    }
}

/// The body being drawn and the next free y.
pub struct Canvas {
    body: String,
    /// The next free vertical position.
    pub y: f64,
}

impl Canvas {
    /// An empty canvas with the cursor below the top margin.
    pub fn new() -> Self {
        Canvas {
            body: String::new(),
            y: 24.0,
        }
    }

    /// Appends raw SVG.
    pub fn raw(&mut self, s: &str) {
        self.body.push_str(s);
    }

    /// Bytes of body written so far (a place for [`Canvas::insert`]).
    pub fn raw_len(&self) -> usize {
        self.body.len()
    }

    /// Inserts raw SVG at a place [`Canvas::raw_len`] gave.
    pub fn insert(&mut self, at: usize, s: &str) {
        self.body.insert_str(at, s);
    }

    /// A text at `(x, y)`; `class` picks the style (`""` for the default).
    pub fn text(&mut self, x: f64, y: f64, class: &str, s: &str) {
        let class = if class.is_empty() {
            String::new()
        } else {
            format!(" class=\"{class}\"")
        };
        let _ = writeln!(
            self.body,
            "<text x=\"{}\" y=\"{}\"{class}>{}</text>",
            num(x),
            num(y),
            esc(s)
        );
    }

    /// A text line at the left margin, moving the cursor down.
    pub fn line(&mut self, class: &str, s: &str) {
        let step = if class == "h" { 22.0 } else { 15.0 };
        self.y += step;
        let y = self.y;
        self.text(12.0, y, class, s);
    }

    /// A plain rectangle (no data attributes).
    pub fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: &str, extra: &str) {
        let _ = writeln!(
            self.body,
            "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{fill}\"{extra}/>",
            num(x),
            num(y),
            num(w),
            num(h)
        );
    }

    /// The whole document with its title and description.
    pub fn finish(self, title: &str, desc: &str) -> String {
        let height = (self.y + 24.0).ceil();
        let mut o = String::with_capacity(self.body.len() + 2048);
        let _ = writeln!(
            o,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
             <svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{height}\" \
             viewBox=\"0 0 {w} {height}\">",
            w = num(WIDTH)
        );
        let _ = writeln!(
            o,
            "<title>{}</title>\n<desc>{}</desc>",
            esc(title),
            esc(desc)
        );
        o.push_str(
            "<defs><pattern id=\"padding\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" \
             patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#d9d9d9\"/>\
             <line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#8c8c8c\" stroke-width=\"2\"/>\
             </pattern><marker id=\"arrow\" viewBox=\"0 0 8 8\" refX=\"7\" refY=\"4\" \
             markerWidth=\"7\" markerHeight=\"7\" orient=\"auto\"><path d=\"M0 0L8 4L0 8Z\" \
             fill=\"#111\"/></marker></defs>\n<style>text{font-family:monospace;font-size:11px;fill:#222}\
             text.h{font-size:15px;font-weight:bold}text.s{font-size:9px}\
             text.l{font-size:10px;fill:#fff}text.m{font-size:10px;fill:#555}\
             .e,[data-field],[data-x-field]{stroke:#fff;stroke-width:.6}.r{stroke:#333;stroke-width:.6}\
             .a{fill:none;stroke:#111;stroke-width:1.2}\
             text.al{font-size:10px;font-weight:bold;paint-order:stroke;stroke:#fff;stroke-width:3px}\
             text.ld{font-size:10px;fill:#222}</style>\n",
        );
        let _ = writeln!(
            o,
            "<rect width=\"{}\" height=\"{height}\" fill=\"#fff\"/>",
            num(WIDTH)
        );
        o.push_str(&self.body);
        o.push_str("</svg>\n");
        o
    }
}
