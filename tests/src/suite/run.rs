//! Running one case's ops, and the ops of a pair of same-content cases, through the
//! `Backend` trait: the same code runs the backend under test and the scalar reference.

use std::collections::BTreeSet;

use crate::backend::{Backend, BufferShape, DecodeArgs, HostTensor, WriteArgs};
use crate::cases::{mover_plan, widths, workload, LayoutCase, MoverPlan, Ops, Workload};
use kvlayout::ops::{DecodeParams, OpError};
use kvlayout::{DType, KvCacheLayout};

use super::bytes::{
    all_elements, blocks_mask, byte_equal, mask, random_bytes, sentinel, Bytes, Mask, Outcome,
};

/// A cache of `l` (exact buffers) holding `bytes`.
pub fn upload<B: Backend>(be: &B, l: &KvCacheLayout, bytes: &Bytes) -> Outcome<B::Cache> {
    let mut c = be.alloc_cache(l, &BufferShape::exact(l))?;
    be.upload_cache(&mut c, bytes)?;
    Ok(c)
}

/// An op's result, waited for: `Err` when it was refused or failed.
pub fn done<B: Backend>(be: &B, r: Result<B::Completion, OpError>) -> Outcome<()> {
    let c = r.map_err(|e| format!("refused: {e}"))?;
    be.wait(c)
}

/// A backend's results on one case.
pub struct CaseOutcome {
    pub write: Outcome<Bytes>,
    pub write_padding: Outcome<Bytes>,
    pub decodes: Vec<Outcome<Vec<f32>>>,
    pub unsupported: Outcome<()>,
    pub copy: Outcome<Bytes>,
    pub gather: Outcome<Bytes>,
    pub scatter_back: Outcome<Bytes>,
    pub scatter_fresh: Outcome<Bytes>,
}

/// Everything a case needs, computed once.
pub struct Prepared {
    pub case: LayoutCase,
    pub work: Option<Workload>,
    pub plan: MoverPlan,
    pub src: Bytes,
    pub written: Mask,
    pub copy_dst: Mask,
    pub staging_used: Mask,
    pub scattered: Mask,
    pub every: Mask,
    pub swap_dst: Mask,
}

/// The workload, mover plan, source bytes and byte sets of case number `index`.
pub fn prepare(case: LayoutCase, index: usize) -> Prepared {
    let l = case.layout.clone();
    let work = if case.ops == Ops::All {
        workload(&case)
    } else {
        None
    };
    let plan = mover_plan(&case, index);
    let written = match &work {
        Some(w) => {
            let bs = l.geometry().block_size;
            let slots: BTreeSet<u64> = w
                .slot_mapping
                .iter()
                .filter(|s| **s >= 0)
                .map(|s| *s as u64)
                .collect();
            mask(&l, |layer, b, _, n| {
                layer == w.layer && slots.contains(&(b * bs + n))
            })
        }
        None => mask(&l, |_, _, _, _| false),
    };
    let h = l.geometry().num_kv_heads;
    let copy_dsts: Vec<u64> = plan.copy_pairs.iter().map(|p| p.1).collect();
    let swap_dsts: Vec<u64> = plan.swap_pairs.iter().map(|p| p.1).collect();
    let staged: Vec<u64> = (0..plan.gather_blocks.len() as u64).collect();
    let sh = plan.staging.geometry().num_kv_heads;
    Prepared {
        src: random_bytes(&l, &format!("{}/bytes", case.name)),
        copy_dst: blocks_mask(&l, &copy_dsts, 0..h),
        staging_used: blocks_mask(&plan.staging, &staged, 0..sh),
        scattered: blocks_mask(&l, &plan.gather_blocks, plan.heads.clone()),
        every: all_elements(&l),
        swap_dst: blocks_mask(&l, &swap_dsts, 0..h),
        written,
        case,
        work,
        plan,
    }
}

/// `write_kv` of the workload (or of padding slots only) into a sentinel cache.
fn run_write<B: Backend>(be: &B, p: &Prepared, w: &Workload, padding_only: bool) -> Outcome<Bytes> {
    let l = &p.case.layout;
    let mut cache = upload(be, l, &sentinel(l))?;
    let key = be.upload_tensor(&w.key)?;
    let value = w.value.as_ref().map(|v| be.upload_tensor(v)).transpose()?;
    let pads = vec![-1i64; w.slot_mapping.len()];
    let args = WriteArgs {
        layer: w.layer,
        key: &key,
        value: value.as_ref(),
        slot_mapping: if padding_only { &pads } else { &w.slot_mapping },
    };
    done(be, be.write_kv(&mut cache, &args))?;
    be.download_cache(&cache)
}

/// Decode step `i` of the workload on the backend's own written cache.
fn run_decode<B: Backend>(
    be: &B,
    l: &KvCacheLayout,
    cache: &Outcome<B::Cache>,
    w: &Workload,
    i: usize,
) -> Outcome<Vec<f32>> {
    let cache = cache.as_ref().map_err(|e| format!("no cache: {e}"))?;
    let dc = &w.decodes[i];
    let (_, vw, _) = widths(l).expect("K/V content");
    let q = be.upload_tensor(&dc.query)?;
    let n = w.seq_lens.len() * dc.params.num_q_heads as usize * vw;
    let mut out = be.alloc_tensor(DType::F32, n)?;
    let args = DecodeArgs {
        layer: w.layer,
        query: &q,
        block_table: &w.block_table,
        blocks_per_seq: w.blocks_per_seq,
        seq_lens: &w.seq_lens,
        params: dc.params,
    };
    done(be, be.paged_decode(cache, &args, &mut out))?;
    Ok(be.download_tensor(&out)?.to_f32())
}

/// Every op of one case on `be`.
pub fn case_outcome<B: Backend>(be: &B, p: &Prepared) -> CaseOutcome {
    let l = &p.case.layout;
    let skipped = || Err("not run".to_string());
    let (mut write, mut write_padding, mut decodes) = (skipped(), skipped(), Vec::new());
    let mut unsupported: Outcome<()> = Err("not run".to_string());
    if let Some(w) = &p.work {
        write = run_write(be, p, w, false);
        write_padding = run_write(be, p, w, true);
        let cache = write.clone().and_then(|b| upload(be, l, &b));
        decodes = (0..w.decodes.len())
            .map(|i| run_decode(be, l, &cache, w, i))
            .collect();
    } else if p.case.ops == Ops::NoKeys {
        unsupported = movers_only_refusals(be, l);
    }
    let plan = &p.plan;
    let copy = (|| {
        let mut c = upload(be, l, &p.src)?;
        done(be, be.copy_blocks(&mut c, &plan.copy_pairs))?;
        be.download_cache(&c)
    })();
    let mut staging_bytes = skipped();
    let gather = (|| {
        let c = upload(be, l, &p.src)?;
        let mut s = upload(be, &plan.staging, &sentinel(&plan.staging))?;
        done(
            be,
            be.gather_blocks(&c, &plan.gather_blocks, plan.heads.clone(), &mut s),
        )?;
        let b = be.download_cache(&s)?;
        staging_bytes = Ok(b.clone());
        Ok(b)
    })();
    let scatter_into = |bytes: &Bytes| -> Outcome<Bytes> {
        let staged = staging_bytes
            .as_ref()
            .map_err(|e| format!("no staging: {e}"))?;
        let s = upload(be, &plan.staging, staged)?;
        let mut c = upload(be, l, bytes)?;
        done(
            be,
            be.scatter_blocks(&s, &plan.gather_blocks, plan.heads.clone(), &mut c),
        )?;
        be.download_cache(&c)
    };
    CaseOutcome {
        scatter_back: scatter_into(&p.src),
        scatter_fresh: scatter_into(&sentinel(l)),
        write,
        write_padding,
        decodes,
        unsupported,
        copy,
        gather,
    }
}

/// `write_kv` and `paged_decode` on content without keys and values: `Unsupported`.
fn movers_only_refusals<B: Backend>(be: &B, l: &KvCacheLayout) -> Outcome<()> {
    let mut c = upload(be, l, &sentinel(l))?;
    let key = be.upload_tensor(&HostTensor::F32(vec![0.0; 8]))?;
    let w = WriteArgs {
        layer: 0,
        key: &key,
        value: None,
        slot_mapping: &[0],
    };
    match be.write_kv(&mut c, &w) {
        Err(OpError::Unsupported { op: "write_kv", .. }) => {}
        Err(e) => return Err(format!("write_kv: {e}, expected Unsupported")),
        Ok(_) => return Err("write_kv accepted content without keys".into()),
    }
    let mut out = be.alloc_tensor(DType::F32, 8)?;
    let d = DecodeArgs {
        layer: 0,
        query: &key,
        block_table: &[0],
        blocks_per_seq: 1,
        seq_lens: &[1],
        params: DecodeParams {
            num_q_heads: 1,
            scale: 1.0,
            sliding_window: None,
            soft_cap: None,
        },
    };
    match be.paged_decode(&c, &d, &mut out) {
        Err(OpError::Unsupported {
            op: "paged_decode", ..
        }) => {}
        Err(e) => return Err(format!("paged_decode: {e}, expected Unsupported")),
        Ok(_) => return Err("paged_decode accepted content without keys".into()),
    }
    byte_equal(&be.download_cache(&c)?, &sentinel(l))
}

/// A backend's results on an ordered pair of same-content cases.
pub struct PairOutcome {
    pub convert: Outcome<Bytes>,
    pub back: Outcome<Bytes>,
    pub swap: Outcome<Bytes>,
}

/// `convert` A -> B and back, and `swap_blocks` A -> B, on `be`.
pub fn pair_outcome<B: Backend>(be: &B, a: &Prepared, b: &Prepared) -> PairOutcome {
    let (la, lb) = (&a.case.layout, &b.case.layout);
    let mut converted = Err("not run".to_string());
    let convert = (|| {
        let src = upload(be, la, &a.src)?;
        let mut dst = upload(be, lb, &sentinel(lb))?;
        done(be, be.convert(&src, &mut dst))?;
        let bytes = be.download_cache(&dst)?;
        converted = Ok(bytes.clone());
        Ok(bytes)
    })();
    let back = (|| {
        let mid = upload(be, lb, converted.as_ref().map_err(|e| e.clone())?)?;
        let mut dst = upload(be, la, &sentinel(la))?;
        done(be, be.convert(&mid, &mut dst))?;
        be.download_cache(&dst)
    })();
    let swap = (|| {
        let src = upload(be, la, &a.src)?;
        let mut dst = upload(be, lb, &sentinel(lb))?;
        done(be, be.swap_blocks(&src, &mut dst, &a.plan.swap_pairs))?;
        be.download_cache(&dst)
    })();
    PairOutcome {
        convert,
        back,
        swap,
    }
}
