//! The elements of the pictured page (layer 0, block 0), each placed by `layout.offset`, and
//! the cap that keeps a picture small: at most [`ELEMENT_LIMIT`] elements are drawn one by
//! one; a larger page is drawn as runs of address-contiguous elements (a row, a piece of a
//! row, or one dim across consecutive tokens); past [`ROW_LIMIT`] rows or [`RUN_LIMIT`] runs
//! only the first two and the last head and token slot of each field are drawn, and if that
//! is still past [`RUN_LIMIT`] runs, the first and the last runs in address order. What is
//! left out is counted, never hidden.
//! It owns the choice of what is drawn, not the drawing.

use kvlayout::{Coord, Field, FieldMap, KvCacheLayout, LayoutError};

/// Pages of at most this many elements are drawn one rectangle per element.
pub const ELEMENT_LIMIT: u64 = 4096;
/// Pages of at most this many rows (field, head, token slot) are drawn whole.
pub const ROW_LIMIT: u64 = 2048;
/// Elements enumerated one by one (rows that are not one contiguous run), at most.
pub const ENUM_LIMIT: u64 = 1 << 18;
/// Rectangles of the page picture, at most.
pub const RUN_LIMIT: usize = 3072;
/// Pages of at most this many elements have their byte ranges enumerated
/// (`layout.block_regions`, at most one range per element); larger pages are pictured from
/// the drawn items' ranges alone, and their tiling is not drawn.
pub const REGION_LIMIT: u64 = 1 << 20;
/// Runs kept from the end of the page when [`RUN_LIMIT`] cuts it.
const TAIL_RUNS: usize = 64;

/// Along which index a run's elements follow each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Along {
    /// Consecutive dims of one token slot.
    Dim,
    /// One dim of consecutive token slots.
    Token,
}

impl Along {
    /// The name in `data-along`.
    pub fn name(self) -> &'static str {
        match self {
            Along::Dim => "dim",
            Along::Token => "token",
        }
    }
}

/// One drawn rectangle: `count` elements from `(head, slot, dim)` on, `bytes` long from
/// `offset` (what `layout.offset` answers for its first element).
#[derive(Debug, Clone, Copy)]
pub struct Item {
    /// The field.
    pub field: Field,
    /// Head slot.
    pub head: u64,
    /// First token slot.
    pub slot: u64,
    /// First dim.
    pub dim: u64,
    /// Elements in the run (1 for one element).
    pub count: u64,
    /// How the run's elements follow each other.
    pub along: Along,
    /// Buffer of the field.
    pub buffer: u32,
    /// Byte offset of the first element in its buffer.
    pub offset: u64,
    /// Bytes covered.
    pub bytes: u64,
    /// Elements in a row of the field.
    pub width: u64,
}

impl Item {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.offset + self.bytes
    }

    /// A short name, e.g. `k h0 t3 d0..7`.
    pub fn label(&self) -> String {
        let span = |a: u64, n: u64| {
            if n == 1 {
                format!("{a}")
            } else {
                format!("{a}..{}", a + n - 1)
            }
        };
        let (t, d) = match self.along {
            Along::Dim => (span(self.slot, 1), span(self.dim, self.count)),
            Along::Token => (span(self.slot, self.count), span(self.dim, 1)),
        };
        format!("{} h{} t{t} d{d}", self.field, self.head)
    }
}

/// What the page picture draws.
pub struct PageItems {
    /// The drawn items, by buffer and offset.
    pub items: Vec<Item>,
    /// Whether each item is one element (`false`: runs).
    pub per_element: bool,
    /// Elements in the page, all fields.
    pub total_elements: u64,
    /// Elements not drawn.
    pub elided_elements: u64,
    /// Where [`RUN_LIMIT`] cut the items: `(buffer, first byte, end byte)` of the bytes
    /// between the last run kept before the cut and the first after it, and the runs left out.
    pub cut: Option<((u32, u64, u64), u64)>,
    /// What was left out and why, in one sentence (empty when nothing was).
    pub note: String,
}

/// Indices `0..n`, or the first two and the last when `subset`.
fn pick(n: u64, subset: bool) -> Vec<u64> {
    if subset && n > 3 {
        vec![0, 1, n - 1]
    } else {
        (0..n).collect()
    }
}

/// The items of the page of layer 0, block 0.
pub fn page_items(layout: &KvCacheLayout) -> Result<PageItems, LayoutError> {
    let fields = layout.stored_fields();
    let total_elements: u64 = fields
        .iter()
        .map(|m| {
            m.num_heads
                .saturating_mul(m.num_slots)
                .saturating_mul(m.width)
        })
        .fold(0, u64::saturating_add);
    let per_element = total_elements <= ELEMENT_LIMIT;
    let rows: u64 = fields
        .iter()
        .map(|m| m.num_heads.saturating_mul(m.num_slots))
        .fold(0, u64::saturating_add);
    // Elements enumerated one by one: every element of rows that are not one run.
    let scattered: u64 = fields
        .iter()
        .filter(|m| m.row_run().is_none())
        .map(|m| {
            m.num_heads
                .saturating_mul(m.num_slots)
                .saturating_mul(m.width)
        })
        .fold(0, u64::saturating_add);
    let mut subset = !per_element && (rows > ROW_LIMIT || scattered > ENUM_LIMIT);
    let (mut items, mut notes) = collect(layout, per_element, subset)?;
    if !per_element && !subset && items.len() > RUN_LIMIT {
        subset = true;
        (items, notes) = collect(layout, per_element, subset)?;
    }
    if subset {
        notes.insert(
            0,
            format!(
                "{rows} rows: only the first two and the last head and token slot of each field \
                 are drawn"
            ),
        );
    }
    let mut cut = None;
    if !per_element && items.len() > RUN_LIMIT {
        let head = RUN_LIMIT - TAIL_RUNS;
        let left_out = items.len() - RUN_LIMIT;
        items.drain(head..items.len() - TAIL_RUNS);
        notes.push(format!(
            "{left_out} runs between the first {head} and the last {TAIL_RUNS} in address order"
        ));
        let (before, after) = (&items[head - 1], &items[head]);
        let end = if after.buffer == before.buffer {
            after.offset
        } else {
            before.end()
        };
        cut = Some(((before.buffer, before.end(), end), left_out as u64));
    }
    let drawn: u64 = items.iter().map(|i| i.count).sum();
    let elided_elements = total_elements.saturating_sub(drawn);
    let note = if elided_elements == 0 {
        String::new()
    } else {
        format!(
            "{elided_elements} of {total_elements} elements not drawn ({})",
            notes.join("; ")
        )
    };
    Ok(PageItems {
        items,
        per_element,
        total_elements,
        elided_elements,
        cut,
        note,
    })
}

/// The items of every row (of the first two and the last heads and token slots when
/// `subset`), by buffer and offset, merged into runs unless `per_element`; and what was left
/// out of the rows.
fn collect(
    layout: &KvCacheLayout,
    per_element: bool,
    subset: bool,
) -> Result<(Vec<Item>, Vec<String>), LayoutError> {
    let mut items = Vec::new();
    let mut notes = Vec::new();
    for m in layout.stored_fields() {
        let heads = pick(m.num_heads, subset);
        let slots = pick(m.num_slots, subset);
        let scattered = heads.len() as u64 * slots.len() as u64 * m.width;
        let dims = if per_element || m.row_run().is_none() {
            let cut = scattered > ENUM_LIMIT && m.width > 20;
            if cut {
                notes.push(format!(
                    "field {}: only dims 0..16 and the last 4 of each row",
                    m.field
                ));
            }
            Some(if cut {
                (0..16).chain(m.width - 4..m.width).collect()
            } else {
                (0..m.width).collect::<Vec<u64>>()
            })
        } else {
            None
        };
        for &h in &heads {
            for &n in &slots {
                push_row(layout, m, h, n, dims.as_deref(), &mut items)?;
            }
        }
    }
    items.sort_unstable_by_key(|i| (i.buffer, i.offset));
    if !per_element {
        items = merge_runs(items);
    }
    Ok((items, notes))
}

/// The items of one row: one item per listed dim, else one run when the row is one
/// contiguous run, else one item per dim.
fn push_row(
    layout: &KvCacheLayout,
    m: &FieldMap,
    head: u64,
    slot: u64,
    dims: Option<&[u64]>,
    out: &mut Vec<Item>,
) -> Result<(), LayoutError> {
    let at = |dim: u64| layout.offset(&Coord::new(m.field, 0, 0, head, slot, dim));
    let item = |dim: u64, count: u64, bytes: u64, loc: kvlayout::Location| Item {
        field: m.field,
        head,
        slot,
        dim,
        count,
        along: Along::Dim,
        buffer: loc.buffer,
        offset: loc.offset,
        bytes,
        width: m.width,
    };
    if let (None, Some(run)) = (dims, m.row_run()) {
        out.push(item(0, m.width, run, at(0)?));
        return Ok(());
    }
    let all: Vec<u64>;
    let dims = match dims {
        Some(d) => d,
        None => {
            all = (0..m.width).collect();
            &all
        }
    };
    for &d in dims {
        out.push(item(d, 1, m.elem_bytes(), at(d)?));
    }
    Ok(())
}

/// Merges items in address order: an element joins the run before it when it is the next
/// byte of the same field and head, and the next dim of the same token slot or the next token
/// slot of the same dim.
fn merge_runs(items: Vec<Item>) -> Vec<Item> {
    let mut out: Vec<Item> = Vec::with_capacity(items.len());
    for e in items {
        if let Some(r) = out.last_mut() {
            let joins = e.count == 1
                && r.buffer == e.buffer
                && r.end() == e.offset
                && r.field == e.field
                && r.head == e.head;
            let along_dim = (r.count == 1 || r.along == Along::Dim)
                && r.slot == e.slot
                && r.dim + r.count == e.dim;
            let along_token = (r.count == 1 || r.along == Along::Token)
                && r.dim == e.dim
                && r.slot + r.count == e.slot;
            if joins && (along_dim || along_token) {
                r.along = if along_dim { Along::Dim } else { Along::Token };
                r.count += 1;
                r.bytes += e.bytes;
                continue;
            }
        }
        out.push(e);
    }
    out
}
