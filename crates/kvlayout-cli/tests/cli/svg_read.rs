//! Reading a `kvlayout explain --svg` picture back: the SVG written for a spec, the page
//! group parsed with roxmltree (runs expanded, every element checked against `layout.offset`),
//! and the page's elements enumerated from the descriptor's domain, for the SVG tests.

use std::collections::{BTreeMap, HashMap, HashSet};

use kvlayout::{Coord, Field, KvCacheLayout};

use super::{ok, temp_path};

/// The largest picture any preset may give.
pub const MAX_SVG_BYTES: usize = 2 << 20;

/// `kvlayout explain SPEC --svg FILE` (checked as `ok` checks it): the SVG text.
pub fn svg_of(spec: &str) -> String {
    let path = temp_path("svg").with_extension("svg");
    let p = path.to_string_lossy().into_owned();
    ok(&["explain", spec, "--svg", &p]);
    let text = std::fs::read_to_string(&path).expect("the SVG file is written");
    let _ = std::fs::remove_file(&path);
    text
}

pub fn attr<'a>(n: &roxmltree::Node<'a, 'a>, name: &str) -> &'a str {
    n.attribute(name)
        .unwrap_or_else(|| panic!("<{}> has no {name}", n.tag_name().name()))
}

pub fn num(n: &roxmltree::Node, name: &str) -> u64 {
    attr(n, name)
        .parse()
        .unwrap_or_else(|e| panic!("{name}={:?}: {e}", attr(n, name)))
}

/// One drawn page element: `(field, head, token, dim)`.
pub type Key = (Field, u64, u64, u64);

/// What the page group of a picture holds.
pub struct Page {
    /// Each element drawn, with how many times.
    pub drawn: HashMap<Key, u32>,
    /// Fill colour of each field's shapes.
    pub fills: BTreeMap<Field, HashSet<String>>,
    /// Whether every shape is one element.
    pub per_element: bool,
    /// `(offset, bytes)` of each padding shape.
    pub padding: Vec<(u64, u64)>,
    /// The group's `data-total-elements` and `data-drawn-elements`.
    pub total: u64,
    pub drawn_count: u64,
}

/// Reads the page group, expanding runs, and checks every element's offset, buffer, layer and
/// block against the descriptor (a run's elements must lie one element apart).
pub fn read_page(doc: &roxmltree::Document, layout: &KvCacheLayout) -> Page {
    let group = doc
        .descendants()
        .find(|n| n.attribute("id") == Some("page"))
        .expect("a <g id=\"page\">");
    let mut page = Page {
        drawn: HashMap::new(),
        fills: BTreeMap::new(),
        per_element: true,
        padding: Vec::new(),
        total: num(&group, "data-total-elements"),
        drawn_count: num(&group, "data-drawn-elements"),
    };
    for n in group.descendants().filter(|n| n.is_element()) {
        if n.attribute("data-kind") == Some("padding") {
            page.padding
                .push((num(&n, "data-offset"), num(&n, "data-bytes")));
        }
        let Some(field) = n.attribute("data-field") else {
            continue;
        };
        let field: Field = field.parse().expect("a field name");
        assert_eq!(
            (num(&n, "data-layer"), num(&n, "data-block")),
            (0, 0),
            "the page is layer 0, block 0"
        );
        let (head, token, dim) = (
            num(&n, "data-head"),
            num(&n, "data-token"),
            num(&n, "data-dim"),
        );
        let count = num(&n, "data-count");
        let elem = layout.field_map(field).unwrap().elem_bytes();
        assert_eq!(
            num(&n, "data-bytes"),
            count * elem,
            "a run is count elements"
        );
        page.per_element &= count == 1;
        page.fills
            .entry(field)
            .or_default()
            .insert(attr(&n, "fill").to_string());
        for i in 0..count {
            let (t, d) = match attr(&n, "data-along") {
                "dim" => (token, dim + i),
                "token" => (token + i, dim),
                other => panic!("data-along={other}"),
            };
            let at = layout
                .offset(&Coord::new(field, 0, 0, head, t, d))
                .unwrap_or_else(|e| panic!("{field} h{head} t{t} d{d} is not in the page: {e}"));
            assert_eq!(
                (at.buffer, at.offset),
                (
                    num(&n, "data-buffer") as u32,
                    num(&n, "data-offset") + i * elem
                ),
                "{field} h{head} t{t} d{d}: where layout.offset puts it"
            );
            *page.drawn.entry((field, head, t, d)).or_default() += 1;
        }
    }
    page
}

/// Every element of the page of layer 0, block 0, from the descriptor's domain.
pub fn every_element(layout: &KvCacheLayout) -> HashSet<Key> {
    let mut all = HashSet::new();
    for m in layout.stored_fields() {
        for h in 0..m.num_heads {
            for n in 0..m.num_slots {
                for d in 0..m.width {
                    all.insert((m.field, h, n, d));
                }
            }
        }
    }
    all
}
