//! `kvlayout explain SPEC --svg FILE`: the picture parsed as XML (roxmltree) and checked
//! against the descriptor. Every element of the page of layer 0, block 0 is drawn exactly once
//! at the offset `layout.offset` gives it (runs are expanded and each element checked), the
//! padding is drawn, fields have distinct colours, the x-split key's cells and the block
//! tiling match the descriptor; every preset renders small; big pages say what they leave out.

use std::collections::{HashMap, HashSet};

use kvlayout::{Coord, Field, KvCacheLayout};

use super::svg_read::{attr, every_element, num, read_page, svg_of, Key, Page, MAX_SVG_BYTES};

/// Draws `spec`, checks that every element appears exactly once and the colours differ,
/// then hands the layout, the document and the page to `more`.
fn check_whole_page(spec: &str, more: impl FnOnce(&KvCacheLayout, &roxmltree::Document, &Page)) {
    let layout: KvCacheLayout = spec.parse().unwrap();
    let text = svg_of(spec);
    let doc = roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{spec}: {e}"));
    let page = read_page(&doc, &layout);
    let want = every_element(&layout);
    let got: HashSet<Key> = page.drawn.keys().copied().collect();
    assert_eq!(got.len(), want.len(), "{spec}: elements drawn");
    assert!(got == want, "{spec}: the drawn elements are not the page's");
    let twice: Vec<_> = page.drawn.iter().filter(|(_, &c)| c != 1).collect();
    assert!(twice.is_empty(), "{spec}: drawn more than once: {twice:?}");
    assert_eq!(
        (page.total, page.drawn_count),
        (want.len() as u64, want.len() as u64)
    );
    // One colour per field, different between fields and from the padding.
    let mut seen = HashSet::new();
    for (field, fills) in &page.fills {
        assert_eq!(fills.len(), 1, "{spec}: {field} has fills {fills:?}");
        let fill = fills.iter().next().unwrap();
        assert!(
            seen.insert(fill.clone()),
            "{spec}: {field} shares fill {fill}"
        );
        assert!(
            !fill.contains("padding"),
            "{spec}: {field} drawn as padding"
        );
    }
    let fields: HashSet<Field> = layout.stored_fields().iter().map(|m| m.field).collect();
    assert_eq!(page.fills.keys().copied().collect::<HashSet<_>>(), fields);
    more(&layout, &doc, &page);
}

#[test]
fn svg_draws_every_element_of_small_pages_once_at_its_offset() {
    for spec in [
        "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD",
        "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=HND",
        "kv L=2 B=3 N=16 H=4 D=8 Dv=4 dtype=bf16 order=BLNHC",
        "kv-scaled L=1 B=3 N=16 H=4 D=8 dtype=int8 order=NHD",
        "mla L=2 B=3 N=16 rank=8 rope=4 dtype=bf16 order=NHD",
        "bytes L=1 B=3 N=16 row=24 order=NHD",
        "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 tensor=flash-attn-hnd",
        "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 tensor=separate-nhd",
        "kv L=1 B=2 N=16 H=1 D=8 dtype=f16 order=HND",
        // 4096 elements: the most drawn one by one.
        "kv L=1 B=3 N=16 H=4 D=32 dtype=f16 tensor=vllm-paged-v1",
    ] {
        check_whole_page(spec, |layout, doc, page| {
            assert!(
                page.per_element,
                "{spec}: a small page is drawn element by element"
            );
            check_stride_table(layout, doc);
        });
    }
}

#[test]
fn svg_quantized_page_draws_scales_in_their_own_colours() {
    check_whole_page(
        "kv-scaled L=1 B=3 N=16 H=4 D=8 dtype=int8 order=NHD",
        |_, _, page| {
            let fields: Vec<Field> = page.fills.keys().copied().collect();
            assert_eq!(fields, [Field::K, Field::V, Field::KScale, Field::VScale]);
        },
    );
}

#[test]
fn svg_padded_page_draws_its_padding() {
    // HND page of 2048 B padded to 2304 B: 256 B of padding after the data of block 0.
    let spec = "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=HND page=2304";
    check_whole_page(spec, |layout, doc, page| {
        assert_eq!(layout.field_map(Field::K).unwrap().strides.block, 2304);
        assert_eq!(page.padding, [(2048, 256)]);
        // The tiling shows the padding after each pictured page.
        let tiles: Vec<(u64, u64)> = doc
            .descendants()
            .filter(|n| n.attribute("data-tile-kind") == Some("padding"))
            .map(|n| (num(&n, "data-tile-offset"), num(&n, "data-tile-bytes")))
            .collect();
        assert_eq!(tiles, [(2048, 256), (4352, 256), (6656, 256)]);
    });
    // An unpadded page has none.
    check_whole_page(
        "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=HND",
        |_, _, page| {
            assert!(page.padding.is_empty());
        },
    );
}

#[test]
fn svg_legacy_key_is_drawn_as_groups_of_tokens_by_x() {
    // f32: x = 16 B / 4 B = 4, so a head of 8 is 2 groups of 16 tokens x 4 elements.
    let spec = "kv L=1 B=3 N=16 H=4 D=8 dtype=f32 tensor=vllm-paged-v1";
    check_whole_page(spec, |layout, doc, _| {
        check_x_split_cells(layout, doc);
        check_stride_table(layout, doc);
    });
}

/// The stride table lists each stored field once with the strides the descriptor reports.
fn check_stride_table(layout: &KvCacheLayout, doc: &roxmltree::Document) {
    let mut listed = Vec::new();
    for n in doc
        .descendants()
        .filter(|n| n.has_attribute("data-stride-field"))
    {
        let field: Field = attr(&n, "data-stride-field").parse().unwrap();
        let names = [
            "buffer", "base", "layer", "block", "head", "token", "x", "chunk", "dim",
        ];
        let got: Vec<u64> = names
            .iter()
            .map(|a| num(&n, &format!("data-stride-{a}")))
            .collect();
        let want = layout.field_map(field).unwrap().strides.to_array();
        assert_eq!(got, want, "{field}");
        listed.push(field);
    }
    let stored: Vec<Field> = layout.stored_fields().iter().map(|m| m.field).collect();
    assert_eq!(listed, stored);
}

/// The key's cells of head 0: each (token, dim) once at its offset, arranged as vLLM draws it.
fn check_x_split_cells(layout: &KvCacheLayout, doc: &roxmltree::Document) {
    let k = layout.field_map(Field::K).unwrap();
    assert_eq!((k.strides.dim_split, k.width), (4, 8));
    let mut cells: HashMap<(u64, u64), (f64, f64)> = HashMap::new();
    for n in doc
        .descendants()
        .filter(|n| n.has_attribute("data-x-field"))
    {
        assert_eq!(
            attr(&n, "data-x-field"),
            "k",
            "only the key is stored x-split"
        );
        let (t, d) = (num(&n, "data-x-token"), num(&n, "data-x-dim"));
        let at = layout.offset(&Coord::new(Field::K, 0, 0, 0, t, d)).unwrap();
        assert_eq!(num(&n, "data-x-offset"), at.offset, "t{t} d{d}");
        let xy = (
            attr(&n, "x").parse::<f64>().unwrap(),
            attr(&n, "y").parse::<f64>().unwrap(),
        );
        assert!(cells.insert((t, d), xy).is_none(), "t{t} d{d} drawn twice");
    }
    assert_eq!(cells.len(), 16 * 8, "head 0: every token and dim once");
    // vLLM's picture: within a group, a token's x elements side by side, tokens one below
    // the other; the next group to the right.
    let (x0, y0) = cells[&(0, 0)];
    assert!(cells[&(0, 3)].0 > x0 && cells[&(0, 3)].1 == y0);
    assert!(cells[&(1, 0)].0 == x0 && cells[&(1, 0)].1 > y0);
    assert!(cells[&(0, 4)].0 > cells[&(0, 3)].0 && cells[&(0, 4)].1 == y0);
    assert!(cells[&(15, 4)].1 == cells[&(15, 0)].1);
}

#[test]
fn svg_kv_outermost_tiling_puts_every_key_block_first() {
    let spec = "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 tensor=flash-attn-hnd";
    check_whole_page(spec, |layout, doc, _| check_kv_outermost_tiles(layout, doc));
}

/// The tiles of blocks 0..3: the descriptor's block regions, all of K before any of V.
fn check_kv_outermost_tiles(layout: &KvCacheLayout, doc: &roxmltree::Document) {
    let tiles: Vec<(u64, u64, u64, String)> = doc
        .descendants()
        .filter(|n| n.has_attribute("data-tile-block"))
        .map(|n| {
            (
                num(&n, "data-tile-block"),
                num(&n, "data-tile-offset"),
                num(&n, "data-tile-bytes"),
                attr(&n, "data-tile-fields").to_string(),
            )
        })
        .collect();
    // Each block's ranges are the descriptor's block regions, coloured by the field in them.
    let mut want = Vec::new();
    for b in 0..3 {
        for r in layout.block_regions(b, 0..1, 0..4).unwrap() {
            let k = layout.offset(&Coord::new(Field::K, 0, b, 0, 0, 0)).unwrap();
            let field = if k.offset == r.offset { "k" } else { "v" };
            want.push((b, r.offset, r.len, field.to_string()));
        }
    }
    want.sort_by_key(|t| t.1);
    assert_eq!(tiles, want);
    let order: Vec<&str> = tiles.iter().map(|t| t.3.as_str()).collect();
    assert_eq!(order, ["k", "k", "k", "v", "v", "v"], "K/V outermost");
}

#[test]
fn svg_every_preset_renders_whole_and_small() {
    for (name, _, _) in kvlayout::PRESETS {
        let text = svg_of(name);
        assert!(text.len() < MAX_SVG_BYTES, "{name}: {} bytes", text.len());
        let layout = kvlayout::preset(name).unwrap();
        let doc = roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        let title = doc
            .descendants()
            .find(|n| n.has_tag_name("title"))
            .and_then(|n| n.text())
            .unwrap_or_default();
        assert!(
            title.contains(&layout.to_string()),
            "{name}: title {title:?}"
        );
        let page = read_page(&doc, &layout);
        let want = every_element(&layout);
        assert_eq!(page.drawn.len(), want.len(), "{name}: every element drawn");
        assert!(page.drawn.values().all(|&c| c == 1), "{name}: drawn twice");
        assert!(page.drawn.keys().all(|k| want.contains(k)), "{name}");
        assert_eq!(page.total, want.len() as u64);
    }
}

/// How much of a big page is drawn.
#[derive(Debug, PartialEq)]
enum Cap {
    /// Every element, as runs.
    Whole,
    /// The first two and the last head and token slot of each field.
    Rows,
    /// Those rows, then the first and the last runs in address order.
    Runs,
}

#[test]
fn svg_of_a_big_page_is_capped_and_says_what_it_left_out() {
    for (spec, cap) in [
        (
            "kv L=1 B=1024 N=16 H=8 D=128 dtype=f16 tensor=vllm-paged-v1",
            Cap::Whole,
        ),
        (
            "kv L=1 B=2 N=256 H=32 D=64 dtype=f32 tensor=vllm-paged-v1",
            Cap::Rows,
        ),
        (
            "kv L=1 B=2 N=512 H=64 D=128 dtype=bf16 order=HND",
            Cap::Rows,
        ),
        (
            "kv L=1 B=4 N=16 H=8 D=128 dtype=f32 tensor=vllm-paged-v1",
            Cap::Rows,
        ),
        (
            "kv L=1 B=1 N=16 H=8 D=4096 dtype=f32 tensor=vllm-paged-v1",
            Cap::Runs,
        ),
    ] {
        let layout: KvCacheLayout = spec.parse().unwrap();
        let text = svg_of(spec);
        assert!(text.len() < MAX_SVG_BYTES, "{spec}: {} bytes", text.len());
        let doc = roxmltree::Document::parse(&text).unwrap();
        let page = read_page(&doc, &layout);
        let total = every_element(&layout).len() as u64;
        assert!(!page.per_element, "{spec}: runs");
        assert!(page.drawn.values().all(|&c| c == 1), "{spec}: drawn twice");
        let drawn = page.drawn.len() as u64;
        assert_eq!((page.total, page.drawn_count), (total, drawn), "{spec}");
        let desc = doc
            .descendants()
            .find(|n| n.has_tag_name("desc"))
            .and_then(|n| n.text())
            .unwrap();
        let said = format!("{} of {total} elements not drawn", total - drawn);
        assert_eq!(cap == Cap::Whole, drawn == total, "{spec}: {desc}");
        assert_eq!(cap != Cap::Whole, desc.contains(&said), "{spec}: {desc}");
        if cap != Cap::Whole {
            let said = "rows: only the first two and the last";
            assert!(desc.contains(said), "{desc}");
        }
        if cap == Cap::Rows {
            for m in layout.stored_fields() {
                for h in [0, 1, m.num_heads - 1] {
                    for n in [0, 1, m.num_slots - 1] {
                        for d in 0..m.width {
                            assert!(page.drawn.contains_key(&(m.field, h, n, d)), "{spec}");
                        }
                    }
                }
            }
        }
        if cap == Cap::Runs {
            let marker = doc
                .descendants()
                .find(|n| n.attribute("data-kind") == Some("elided"))
                .unwrap_or_else(|| panic!("{spec}: no marker where runs are left out"));
            assert!(num(&marker, "data-runs") > 0);
            // The first element in address order is drawn.
            assert!(page.drawn.contains_key(&(Field::K, 0, 0, 0)));
        }
    }
}
