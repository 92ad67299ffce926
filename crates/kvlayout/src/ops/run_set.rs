//! Byte runs held compactly: a list of runs repeated at a fixed stride on both sides
//! ([`RunSet`]), as a cache with one page per layer repeats a block's runs in every layer.
//! [`copy_run_set_into`] makes one from validated moves without writing every run; an engine
//! that copies by itself walks it directly ([`RunSet::iter`]), one that needs a flat list
//! expands it ([`RunSet::expand_into`]). Owns the compact form only; the runs themselves are
//! [`super::runs`]'.

use crate::layout::KvCacheLayout;

use super::moves::{MoveDim, MovePlan, Moves};
use super::runs::{copy_runs_into, run_bytes, runs_in_source_order, CopyRun};

/// `runs`, then `runs` shifted by `src_step` / `dst_step` bytes, and so on, `repeat` times in
/// all: run `i` of repetition `k` copies `len` bytes from `src_offset + k * src_step` to
/// `dst_offset + k * dst_step` of the same buffers. A set made by [`copy_run_set_into`],
/// expanded in that order (repetition by repetition), is the flat list [`super::copy_runs`]
/// gives for the same moves: sorted by source position, maximal, destinations disjoint. The
/// fields are public: a set built by hand has only the properties its builder gives it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RunSet {
    /// The runs of repetition 0.
    pub runs: Vec<CopyRun>,
    /// Repetitions, at least 1 (an empty set has no runs).
    pub repeat: u64,
    /// Source bytes between repetitions.
    pub src_step: u64,
    /// Destination bytes between repetitions.
    pub dst_step: u64,
}

impl Default for RunSet {
    fn default() -> Self {
        RunSet::flat(Vec::new())
    }
}

impl RunSet {
    /// `runs` as they are (one repetition).
    pub fn flat(runs: Vec<CopyRun>) -> Self {
        RunSet {
            runs,
            repeat: 1,
            src_step: 0,
            dst_step: 0,
        }
    }

    /// Runs once expanded (the descriptors a flat list has).
    pub fn descriptors(&self) -> u64 {
        (self.runs.len() as u64).saturating_mul(self.repeat)
    }

    /// Bytes copied.
    pub fn bytes(&self) -> u64 {
        run_bytes(&self.runs).saturating_mul(self.repeat)
    }

    /// Every run, repetition by repetition.
    pub fn iter(&self) -> impl Iterator<Item = CopyRun> + '_ {
        (0..self.repeat).flat_map(move |k| {
            let (ds, dd) = (k * self.src_step, k * self.dst_step);
            self.runs.iter().map(move |r| CopyRun {
                src_offset: r.src_offset + ds,
                dst_offset: r.dst_offset + dd,
                ..*r
            })
        })
    }

    /// Every run appended to `out` (the flat list).
    pub fn expand_into(&self, out: &mut Vec<CopyRun>) {
        out.reserve(self.descriptors() as usize);
        out.extend(self.iter());
    }

    /// The flat list.
    pub fn expand(&self) -> Vec<CopyRun> {
        let mut out = Vec::new();
        self.expand_into(&mut out);
        out
    }

    /// Repetition 0 and the last one: every run of the set lies between them (offsets grow
    /// with the repetition), so checking these two against a buffer's bounds checks all.
    pub fn extremes(&self) -> impl Iterator<Item = CopyRun> + '_ {
        // Saturating: a set past the address space gives an offset no buffer holds, which
        // the bounds check then refuses.
        let last = self.repeat.saturating_sub(1);
        let (ds, dd) = (
            last.saturating_mul(self.src_step),
            last.saturating_mul(self.dst_step),
        );
        self.runs.iter().flat_map(move |r| {
            [
                *r,
                CopyRun {
                    src_offset: r.src_offset.saturating_add(ds),
                    dst_offset: r.dst_offset.saturating_add(dd),
                    ..*r
                },
            ]
        })
    }
}

/// The dim every piece of `plan` shares with the largest source stride, and `plan` without
/// it: the repetition of a [`RunSet`]. `None` when the pieces do not share one.
fn repeated_dim(plan: &MovePlan) -> Option<(MoveDim, MovePlan)> {
    let first = plan.pieces.first()?;
    let dim = *first.dims.iter().max_by_key(|d| d.src_stride)?;
    if dim.extent < 2 || dim.src_stride == 0 {
        return None;
    }
    let mut reduced = plan.clone();
    for p in &mut reduced.pieces {
        let at = p.dims.iter().position(|d| *d == dim)?;
        p.dims.remove(at);
    }
    Some((dim, reduced))
}

/// Whether `runs` (sorted by source, maximal) repeated at `dim`'s strides stays sorted by
/// source and maximal: one source buffer, spanning at most one step, and the last run not
/// continued by the first of the next repetition.
fn repeats_cleanly(runs: &[CopyRun], dim: &MoveDim) -> bool {
    let (Some(first), Some(last)) = (runs.first(), runs.last()) else {
        return false;
    };
    let one_buffer = runs.iter().all(|r| r.src_buffer == first.src_buffer);
    let span = last.src_offset + last.len - first.src_offset;
    let next = CopyRun {
        src_offset: first.src_offset + dim.src_stride,
        dst_offset: first.dst_offset + dim.dst_stride,
        ..*first
    };
    one_buffer && span <= dim.src_stride && !last.continued_by(&next)
}

/// The runs [`super::copy_runs`] gives for validated moves `m` from `src` to `dst`, written
/// into `out` (its memory reused) as a [`RunSet`]: repeated along the dim of largest source
/// stride (the layers of a cache with one page per layer) where the runs of one point of it,
/// shifted, are those of the next; flat otherwise. `false`, `out` empty, where `copy_runs`
/// is `None` (no byte-run form, or more than `max_units` units before merging).
pub fn copy_run_set_into(
    src: &KvCacheLayout,
    dst: &KvCacheLayout,
    m: &Moves,
    max_units: usize,
    out: &mut RunSet,
) -> bool {
    out.runs.clear();
    (out.repeat, out.src_step, out.dst_step) = (1, 0, 0);
    let Some(plan) = m.plan(src, dst) else {
        return false;
    };
    if let Some((dim, reduced)) = repeated_dim(&plan) {
        let max = max_units / dim.extent as usize;
        if runs_in_source_order(&reduced, &m.pairs, max, &mut out.runs)
            && repeats_cleanly(&out.runs, &dim)
        {
            (out.repeat, out.src_step, out.dst_step) = (dim.extent, dim.src_stride, dim.dst_stride);
            return true;
        }
        out.runs.clear();
    }
    copy_runs_into(src, dst, m, max_units, &mut out.runs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{copy_runs, BlockMove};

    fn set_and_flat(src: &str, dst: &str, pairs: &[(u64, u64)]) -> (RunSet, Vec<CopyRun>) {
        let (a, b): (KvCacheLayout, KvCacheLayout) = (src.parse().unwrap(), dst.parse().unwrap());
        let m = BlockMove::Swap(pairs).plan(Some(&a), &b).unwrap();
        let mut set = RunSet::default();
        assert!(copy_run_set_into(&a, &b, &m, 1 << 20, &mut set));
        (set, copy_runs(&a, &b, &m, 1 << 20).unwrap())
    }

    #[test]
    fn per_layer_pages_repeat_a_block_list_per_layer() {
        // L=3 B=5 N=16 H=4 D=8 f16, layer-major pages of 4*16*16*2 = 2048 bytes.
        let spec = "kv L=3 B=5 N=16 H=4 D=8 dtype=f16 order=NHD";
        let (set, flat) = set_and_flat(spec, spec, &[(3, 0), (1, 2), (0, 4)]);
        let page = 2048u64;
        assert_eq!(
            (set.repeat, set.src_step, set.dst_step),
            (3, 5 * page, 5 * page)
        );
        // Remote blocks 0 and 1 are not consecutive locally (4, 2): three runs per layer.
        assert_eq!(set.runs.len(), 3);
        assert_eq!(set.descriptors(), 9);
        assert_eq!(set.expand(), flat);
        assert_eq!(set.bytes(), run_bytes(&flat));
    }

    #[test]
    fn all_blocks_of_every_layer_merge_into_one_flat_run() {
        // Both blocks of every layer, in place: one run over the whole buffer, not one per
        // layer (a repetition would leave layer k's end and layer k+1's start unmerged).
        let spec = "kv L=3 B=2 N=16 H=1 D=8 dtype=f16 order=NHD";
        let (set, flat) = set_and_flat(spec, spec, &[(0, 0), (1, 1)]);
        assert_eq!(flat.len(), 1);
        assert_eq!((set.repeat, set.expand()), (1, flat));
    }

    #[test]
    fn a_plan_past_the_unit_budget_is_refused_like_copy_runs() {
        let spec = "kv L=3 B=5 N=16 H=4 D=8 dtype=f16 order=NHD";
        let a: KvCacheLayout = spec.parse().unwrap();
        let m = BlockMove::Swap(&[(3, 0), (1, 2), (0, 4)])
            .plan(Some(&a), &a)
            .unwrap();
        // 9 units (3 blocks x 3 layers): 8 refused, 9 taken.
        let mut set = RunSet::default();
        assert!(!copy_run_set_into(&a, &a, &m, 8, &mut set));
        assert!(set.runs.is_empty() && copy_runs(&a, &a, &m, 8).is_none());
        assert!(copy_run_set_into(&a, &a, &m, 9, &mut set));
        assert_eq!(set.descriptors(), 9);
    }

    #[test]
    fn all_layers_per_block_stays_flat() {
        let spec = "kv L=3 B=4 N=16 H=1 D=8 dtype=f16 order=BLHNC";
        let (set, flat) = set_and_flat(spec, spec, &[(1, 1), (2, 2), (0, 3)]);
        assert_eq!(set.repeat, 1);
        assert_eq!(set.expand(), flat);
        assert_eq!(flat.len(), 2);
    }
}
