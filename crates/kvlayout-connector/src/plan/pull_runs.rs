//! A pull's byte runs: the merged runs of its heads of the requested blocks into a cache, flat
//! ([`Pull::runs_into`]) or as a [`RunSet`] ([`Pull::run_set_into`]). Owns making the runs;
//! which remote rank serves which heads is [`super::pulls`]'.

use kvlayout::ops::{copy_run_set_into, copy_runs_into, merge_runs, CopyRun, Moves, RunSet};
use kvlayout::KvCacheLayout;

use super::{
    sub_block_pairs, sub_view, PlanError, Pull, SeqBlocks, SubBlockGroups, MAX_PLAN_UNITS,
};

impl Pull<'_> {
    /// The merged runs moving this pull's heads of `seqs` into `into` (a rank's cache or a
    /// staging cache), the first head landing on head `dst_head0` of `into`.
    pub(crate) fn runs(
        &self,
        into: &KvCacheLayout,
        dst_head0: u64,
        seqs: &[SeqBlocks],
    ) -> Result<Vec<CopyRun>, PlanError> {
        let mut runs = Vec::new();
        self.runs_into(into, dst_head0, seqs, &mut runs)?;
        Ok(runs)
    }

    /// This pull's block pairs of `seqs` into `into`, grouped by the sub-blocks' places.
    fn groups(
        &self,
        into: &KvCacheLayout,
        seqs: &[SeqBlocks],
    ) -> Result<SubBlockGroups, PlanError> {
        let remote = &self.remote.layout;
        sub_block_pairs(
            seqs,
            self.sizes,
            (remote.geometry().num_blocks, into.geometry().num_blocks),
        )
    }

    /// The refusal of a pull past [`MAX_PLAN_UNITS`] or without a byte-run form.
    fn too_large(&self) -> PlanError {
        PlanError::TooLarge {
            rank: self.remote.tp_rank,
            reason: format!(
                "more than {MAX_PLAN_UNITS} units, or no byte-run form between the layouts \
                 (two different element splits of an x-split key)"
            ),
        }
    }

    /// [`Pull::runs_into`] as a [`RunSet`] (its memory reused): repeated per layer where one
    /// sub-block group's runs repeat ([`copy_run_set_into`]), flat otherwise.
    pub(crate) fn run_set_into(
        &self,
        into: &KvCacheLayout,
        dst_head0: u64,
        seqs: &[SeqBlocks],
        out: &mut RunSet,
    ) -> Result<(), PlanError> {
        let mut groups = self.groups(into, seqs)?;
        if groups.len() != 1 {
            let mut runs = std::mem::take(&mut out.runs);
            self.runs_into(into, dst_head0, seqs, &mut runs)?;
            *out = RunSet::flat(runs);
            return Ok(());
        }
        let ((j, jl), pairs) = groups.pop_first().expect("one group");
        let g = self.sizes.2;
        let (rv, lv) = (sub_view(&self.remote.layout, j, g)?, sub_view(into, jl, g)?);
        let m = Moves {
            pairs,
            heads: self.heads.clone(),
            dst_head0,
        };
        if !copy_run_set_into(&rv, &lv, &m, MAX_PLAN_UNITS, out) {
            return Err(self.too_large());
        }
        Ok(())
    }

    /// [`Pull::runs`] written into `runs` (cleared first; its memory reused).
    pub(crate) fn runs_into(
        &self,
        into: &KvCacheLayout,
        dst_head0: u64,
        seqs: &[SeqBlocks],
        runs: &mut Vec<CopyRun>,
    ) -> Result<(), PlanError> {
        runs.clear();
        let groups = self.groups(into, seqs)?;
        let several = groups.len() > 1;
        let (remote, g) = (&self.remote.layout, self.sizes.2);
        for ((j, jl), pairs) in groups {
            let (rv, lv) = (sub_view(remote, j, g)?, sub_view(into, jl, g)?);
            let m = Moves {
                pairs,
                heads: self.heads.clone(),
                dst_head0,
            };
            let budget = MAX_PLAN_UNITS.saturating_sub(runs.len());
            if !copy_runs_into(&rv, &lv, &m, budget, runs) {
                return Err(self.too_large());
            }
        }
        if several {
            *runs = merge_runs(std::mem::take(runs));
        }
        Ok(())
    }
}
