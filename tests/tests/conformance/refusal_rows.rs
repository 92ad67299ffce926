//! The table of refusals: each row a call the contract refuses, described on the host, and
//! the typed error it must be refused with.

use std::ops::Range;

use kvlayout::ops::{DecodeParams, OpError};
use kvlayout::{KvCacheLayout, LayoutError};
use kvlayout_conformance::backend::BufferShape;
use kvlayout_conformance::cases::{DecodeCase, MoverPlan, Workload};

/// A cache of the fixture, by its index ([`MAIN`]: the case's own).
pub(crate) type CacheId = usize;

/// The case's own cache.
pub(crate) const MAIN: CacheId = 0;

/// The value tensor a `write_kv` row hands over.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Value {
    /// The workload's (none for MLA).
    Workload,
    /// The key tensor again.
    Key,
    /// A bf16 value for an f32 key.
    Bf16,
    /// None.
    Missing,
}

/// A `write_kv` of three tokens of 0.5.
#[derive(Debug, Clone)]
pub(crate) struct Write {
    pub(crate) cache: CacheId,
    pub(crate) slots: Vec<i64>,
    pub(crate) layer: u64,
    pub(crate) value: Value,
}

/// A `paged_decode` of the workload's second step, into an f32 output.
#[derive(Debug, Clone)]
pub(crate) struct Decode {
    pub(crate) cache: CacheId,
    pub(crate) layer: u64,
    pub(crate) table: Vec<i32>,
    pub(crate) blocks_per_seq: usize,
    pub(crate) lens: Vec<u32>,
    pub(crate) params: DecodeParams,
    /// A query one element short.
    pub(crate) short_query: bool,
    /// An output one element short.
    pub(crate) short_out: bool,
}

/// One op and its arguments.
#[derive(Debug, Clone)]
pub(crate) enum Call {
    Write(Write),
    Decode(Decode),
    /// `copy_blocks` within one cache.
    Copy {
        cache: CacheId,
        pairs: Vec<(u64, u64)>,
    },
    /// `swap_blocks` from `src` into `dst`.
    Swap {
        src: CacheId,
        dst: CacheId,
        pairs: Vec<(u64, u64)>,
    },
    /// `convert` of `src` into `dst`.
    Convert {
        src: CacheId,
        dst: CacheId,
    },
    /// `gather_blocks` of `blocks` x `heads` of `src` into the staging cache `dst`.
    Gather {
        src: CacheId,
        dst: CacheId,
        blocks: Vec<u64>,
        heads: Range<u64>,
    },
    /// `scatter_blocks` of the staging cache `src` into `blocks` x `heads` of `dst`.
    Scatter {
        src: CacheId,
        dst: CacheId,
        blocks: Vec<u64>,
        heads: Range<u64>,
    },
}

impl Call {
    /// `(source, destination)` of a call between two caches; `None` for a call on one.
    pub(crate) fn between(&self) -> Option<(CacheId, CacheId)> {
        match self {
            Call::Swap { src, dst, .. }
            | Call::Convert { src, dst }
            | Call::Gather { src, dst, .. }
            | Call::Scatter { src, dst, .. } => Some((*src, *dst)),
            Call::Write(_) | Call::Decode(_) | Call::Copy { .. } => None,
        }
    }

    /// The caches the call reads or writes (destination first): after a refusal, every
    /// byte of each must be as it was.
    pub(crate) fn caches(&self) -> Vec<CacheId> {
        match (self, self.between()) {
            (_, Some((src, dst))) => vec![dst, src],
            (Call::Write(w), None) => vec![w.cache],
            (Call::Decode(d), None) => vec![d.cache],
            (Call::Copy { cache, .. }, None) => vec![*cache],
            _ => unreachable!("a call between two caches has both"),
        }
    }
}

impl From<Write> for Call {
    fn from(w: Write) -> Self {
        Call::Write(w)
    }
}

impl From<Decode> for Call {
    fn from(d: Decode) -> Self {
        Call::Decode(d)
    }
}

/// One row of the table: a call and the error it must be refused with.
pub(crate) struct Refusal {
    pub(crate) name: String,
    pub(crate) call: Call,
    pub(crate) expect: Box<dyn Fn(&OpError) -> bool>,
}

/// A row refused with an error `expect` accepts.
fn row(
    name: impl Into<String>,
    call: impl Into<Call>,
    expect: impl Fn(&OpError) -> bool + 'static,
) -> Refusal {
    Refusal {
        name: name.into(),
        call: call.into(),
        expect: Box::new(expect),
    }
}

fn is_shape(e: &OpError) -> bool {
    matches!(e, OpError::Shape { .. })
}

fn is_incompatible(e: &OpError) -> bool {
    matches!(e, OpError::Incompatible(_))
}

fn is_bad_pair(e: &OpError) -> bool {
    matches!(e, OpError::BadPair { .. })
}

/// The caches besides the case's own that the mover rows take.
pub(crate) struct Others {
    /// The same geometry in another dtype.
    pub(crate) other_dtype: CacheId,
    /// One block more.
    pub(crate) more_blocks: CacheId,
    /// One head fewer (where the layout has more than one and can lose one).
    pub(crate) fewer_heads: Option<CacheId>,
    /// The staging cache of the case's mover plan.
    pub(crate) staging: CacheId,
}

/// What the rows of one case are written from.
pub(crate) struct Ctx<'a> {
    pub(crate) layout: &'a KvCacheLayout,
    pub(crate) work: &'a Workload,
    /// The decode step the decode rows take (the workload's second).
    pub(crate) step: &'a DecodeCase,
    pub(crate) mla: bool,
    pub(crate) plan: &'a MoverPlan,
}

impl Ctx<'_> {
    /// A `write_kv` of the workload's layer into `cache`.
    fn write(&self, cache: CacheId, slots: &[i64]) -> Write {
        Write {
            cache,
            slots: slots.to_vec(),
            layer: self.work.layer,
            value: Value::Workload,
        }
    }

    /// The workload's `paged_decode` step on `cache`.
    fn decode(&self, cache: CacheId) -> Decode {
        let w = self.work;
        Decode {
            cache,
            layer: w.layer,
            table: w.block_table.clone(),
            blocks_per_seq: w.blocks_per_seq,
            lens: w.seq_lens.clone(),
            params: self.step.params,
            short_query: false,
            short_out: false,
        }
    }

    /// Every row on the case's own cache and the caches of [`Others`].
    pub(crate) fn rows(&self, others: &Others) -> Vec<Refusal> {
        let mut rows = self.write_rows();
        rows.extend(self.decode_rows());
        rows.extend(self.mover_rows(others));
        rows
    }

    /// `write_kv`: slots, layer, and key / value shapes.
    fn write_rows(&self) -> Vec<Refusal> {
        let g = *self.layout.geometry();
        let limit = (g.num_blocks * g.block_size) as i64;
        let three = || self.write(MAIN, &[0, 1, 2]);
        let mut rows = vec![
            row(
                "slot out of range",
                self.write(MAIN, &[0, limit, 3]),
                move |e| matches!(e, OpError::SlotOutOfRange { token: 1, slot, limit: l } if *slot == limit && *l as i64 == limit),
            ),
            row("duplicate slot", self.write(MAIN, &[4, -1, 4]), |e| {
                matches!(
                    e,
                    OpError::DuplicateSlot {
                        token: 2,
                        slot: 4,
                        first: 0
                    }
                )
            }),
            row(
                "layer out of range",
                Write {
                    layer: g.num_layers,
                    ..three()
                },
                |e| {
                    matches!(
                        e,
                        OpError::Layout(LayoutError::OutOfRange { axis: "layer", .. })
                    )
                },
            ),
            row(
                "key of the wrong shape (3 tokens, 2 slots)",
                self.write(MAIN, &[0, 1]),
                is_shape,
            ),
        ];
        let value = |name, value| row(name, Write { value, ..three() }, is_shape);
        if self.mla {
            rows.push(value("a value tensor for MLA", Value::Key));
        } else {
            rows.push(value("value dtype differs from key dtype", Value::Bf16));
            rows.push(value("no value tensor", Value::Missing));
        }
        rows
    }

    /// `paged_decode`: block ids, lengths and the block table's size.
    fn decode_rows(&self) -> Vec<Refusal> {
        let (w, g) = (self.work, *self.layout.geometry());
        let d = || self.decode(MAIN);
        let mut past_the_cache = w.block_table.clone();
        let last = (u64::from(w.seq_lens[0]).div_ceil(g.block_size) - 1) as usize;
        past_the_cache[last] = g.num_blocks as i32;
        let mut negative = w.block_table.clone();
        negative[0] = -1;
        let mut too_long = w.seq_lens.clone();
        too_long[1] = (w.blocks_per_seq as u64 * g.block_size + 1) as u32;
        let mut rows = vec![
            row(
                "block id out of range",
                Decode {
                    table: past_the_cache,
                    ..d()
                },
                move |e| matches!(e, OpError::BlockOutOfRange { seq: 0, position, .. } if *position == last),
            ),
            row(
                "negative block id",
                Decode {
                    table: negative,
                    ..d()
                },
                |e| {
                    matches!(
                        e,
                        OpError::BlockOutOfRange {
                            seq: 0,
                            position: 0,
                            block: -1,
                            ..
                        }
                    )
                },
            ),
            row(
                "sequence longer than its blocks",
                Decode {
                    lens: too_long,
                    ..d()
                },
                |e| matches!(e, OpError::SequenceTooLong { seq: 1, .. }),
            ),
            row(
                "block table of the wrong size",
                Decode {
                    table: w.block_table[1..].to_vec(),
                    ..d()
                },
                is_shape,
            ),
        ];
        rows.extend(self.decode_shape_rows());
        rows
    }

    /// `paged_decode`: parameters, and the query's and the output's sizes.
    fn decode_shape_rows(&self) -> Vec<Refusal> {
        let d = || self.decode(MAIN);
        let params = self.step.params;
        let with = |params| Decode { params, ..d() };
        vec![
            row(
                "query heads not a multiple of KV heads",
                with(DecodeParams {
                    num_q_heads: self.layout.geometry().num_kv_heads * 4 + 1,
                    ..params
                }),
                is_shape,
            ),
            row(
                "negative soft-cap",
                with(DecodeParams {
                    soft_cap: Some(-1.0),
                    ..params
                }),
                is_shape,
            ),
            row(
                "output of the wrong size",
                Decode {
                    short_out: true,
                    ..d()
                },
                is_shape,
            ),
            row(
                "query of the wrong size",
                Decode {
                    short_query: true,
                    ..d()
                },
                is_shape,
            ),
        ]
    }

    /// The block movers: bad pairs, incompatible caches, head ranges.
    fn mover_rows(&self, o: &Others) -> Vec<Refusal> {
        let nb = self.layout.geometry().num_blocks;
        let copy = |pairs: &[(u64, u64)]| Call::Copy {
            cache: MAIN,
            pairs: pairs.to_vec(),
        };
        let swap = |src, pairs: &[(u64, u64)]| Call::Swap {
            src,
            dst: MAIN,
            pairs: pairs.to_vec(),
        };
        let convert = |dst| Call::Convert { src: MAIN, dst };
        let mut rows = vec![
            row("copy: source block out of range", copy(&[(nb, 0)]), |e| {
                matches!(e, OpError::BadPair { index: 0, .. })
            }),
            row("copy: destination twice", copy(&[(0, 1), (2, 1)]), |e| {
                matches!(e, OpError::BadPair { dst: 1, .. })
            }),
            row(
                "copy: a source that is also a destination",
                copy(&[(0, 1), (1, 2)]),
                is_bad_pair,
            ),
            row(
                "swap: different dtype",
                swap(o.other_dtype, &[(0, 0)]),
                is_incompatible,
            ),
            row(
                "convert: different dtype",
                convert(o.other_dtype),
                is_incompatible,
            ),
            row(
                "convert: different block count",
                convert(o.more_blocks),
                is_incompatible,
            ),
            row(
                "swap: destination block out of range",
                swap(o.more_blocks, &[(0, nb)]),
                |e| matches!(e, OpError::BadPair { index: 0, .. }),
            ),
        ];
        if let Some(fewer) = o.fewer_heads {
            rows.push(row(
                "swap: different head count",
                swap(fewer, &[(0, 0)]),
                is_incompatible,
            ));
        }
        rows.extend(self.staging_rows(o.staging));
        rows
    }

    /// `gather_blocks` into the staging cache and `scatter_blocks` out of it.
    fn staging_rows(&self, staging: CacheId) -> Vec<Refusal> {
        let (plan, nb) = (self.plan, self.layout.geometry().num_blocks);
        let heads = plan.heads.clone();
        let gather = |blocks: &[u64], heads: Range<u64>| Call::Gather {
            src: MAIN,
            dst: staging,
            blocks: blocks.to_vec(),
            heads,
        };
        let mut rows = vec![row(
            "gather: head range past the heads",
            gather(
                &plan.gather_blocks,
                0..self.layout.geometry().num_kv_heads + 1,
            ),
            is_shape,
        )];
        if heads.end - heads.start > 1 {
            rows.push(row(
                "gather: staging holds other heads",
                gather(&plan.gather_blocks, heads.start..heads.end - 1),
                is_incompatible,
            ));
        }
        rows.extend([
            row(
                "gather: more blocks than the staging holds",
                gather(&[0, 1, 0, 1], heads.clone()),
                is_incompatible,
            ),
            row(
                "gather: block out of range",
                gather(&[nb], heads.clone()),
                is_bad_pair,
            ),
            row(
                "scatter: one block twice",
                Call::Scatter {
                    src: staging,
                    dst: MAIN,
                    blocks: vec![1, 1],
                    heads,
                },
                is_bad_pair,
            ),
        ]);
        rows
    }

    /// Buffer `i` shorter than its registered span: by one byte, and down to its last element
    /// byte when the span is padded. The lengths, each with its [`BufferShape`]s.
    pub(crate) fn short_shapes(&self, i: usize) -> Vec<(u64, Vec<BufferShape>)> {
        let l = self.layout;
        let exact = BufferShape::exact(l);
        let needed = exact[i].len;
        let data_end = l
            .stored_fields()
            .iter()
            .filter(|m| m.strides.buffer as usize == i)
            .map(|m| m.data_end())
            .max()
            .unwrap_or(0);
        let mut lens = vec![needed - 1];
        if data_end < needed - 1 {
            lens.push(data_end);
        }
        lens.into_iter()
            .map(|len| {
                let mut shapes = exact.clone();
                shapes[i].len = len;
                (len, shapes)
            })
            .collect()
    }

    /// The rows on cache `bad`, whose buffer `i` is `len` bytes of a `needed`-byte span.
    pub(crate) fn short_rows(&self, bad: CacheId, i: usize, len: u64) -> Vec<Refusal> {
        let needed = BufferShape::exact(self.layout)[i].len;
        let is_short = move |e: &OpError| matches!(e, OpError::BufferTooShort { buffer, len: got, needed: n } if *buffer == i && *got == len && *n == needed);
        let what = |op: &str| format!("{op}: buffer {i} of {len} bytes (span {needed})");
        vec![
            row(what("write_kv"), self.write(bad, &[0, 1, 2]), is_short),
            row(what("paged_decode"), self.decode(bad), is_short),
            row(
                what("copy_blocks"),
                Call::Copy {
                    cache: bad,
                    pairs: vec![(0, 1)],
                },
                is_short,
            ),
            row(
                format!("convert: destination buffer {i} of {len} bytes (span {needed})"),
                Call::Convert {
                    src: MAIN,
                    dst: bad,
                },
                is_short,
            ),
        ]
    }

    /// The widest element of buffer `i`: the alignment its base must have.
    pub(crate) fn align(&self, i: usize) -> u64 {
        self.layout
            .stored_fields()
            .iter()
            .filter(|m| m.strides.buffer as usize == i)
            .map(|m| m.elem_bytes())
            .max()
            .unwrap_or(1)
    }

    /// Buffer `i` misaligned by half its alignment, as its [`BufferShape`]s.
    pub(crate) fn misaligned_shapes(&self, i: usize) -> Vec<BufferShape> {
        let mut shapes = BufferShape::exact(self.layout);
        shapes[i].misalign = self.align(i) / 2;
        shapes
    }

    /// The rows on cache `bad`, whose buffer `i` is misaligned (none when its elements are
    /// single bytes).
    pub(crate) fn misaligned_rows(&self, bad: CacheId, i: usize) -> Vec<Refusal> {
        let align = self.align(i);
        if align <= 1 {
            return Vec::new();
        }
        let is_misaligned = move |e: &OpError| matches!(e, OpError::Misaligned { buffer, align: a, .. } if *buffer == i && *a == align);
        vec![
            row(
                format!(
                    "write_kv: buffer {i} misaligned by {} for {align}-byte elements",
                    align / 2
                ),
                self.write(bad, &[0, 1, 2]),
                is_misaligned,
            ),
            row(
                format!("paged_decode: buffer {i} misaligned"),
                self.decode(bad),
                is_misaligned,
            ),
            row(
                format!("swap_blocks: destination buffer {i} misaligned"),
                Call::Swap {
                    src: MAIN,
                    dst: bad,
                    pairs: vec![(0, 0)],
                },
                is_misaligned,
            ),
        ]
    }
}
