//! Refusals: each bad input a typed `OpError` on every backend, and every cache byte
//! unchanged (see the suite's module doc). The calls and their errors are the table of
//! `refusal_rows.rs`; this module holds the caches and tensors the rows name, and runs them.

use std::collections::BTreeMap;

use kvlayout::ops::OpError;
use kvlayout::{DType, KvCacheLayout};
use kvlayout_conformance::backend::{
    Backend, Backends, BufferShape, DecodeArgs, Host, HostTensor, ScalarReference, WriteArgs,
};
use kvlayout_conformance::cases::{
    case_from_spec, mover_plan, widths, workload, LayoutCase, MoverPlan, Workload,
};

use crate::bytes::{byte_equal, random_bytes, random_bytes_of, sentinel, Bytes, Outcome};
use crate::report::{guarded, print_backend_reports, report_of, Report};
use crate::run::{done, upload};

#[path = "refusal_rows.rs"]
mod rows;

use rows::{CacheId, Call, Ctx, Others, Refusal, Value};

/// Runs an op that must be refused; checks the error and that the caches did not change.
fn refused<B: Backend>(
    be: &B,
    r: Result<B::Completion, OpError>,
    want: impl Fn(&OpError) -> bool,
    caches: &[(&B::Cache, &Bytes)],
) -> Outcome<()> {
    match r {
        Ok(c) => {
            be.wait(c)?;
            return Err("accepted".into());
        }
        Err(e) if !want(&e) => return Err(format!("refused with the wrong error: {e:?}")),
        Err(_) => {}
    }
    for (i, (c, before)) in caches.iter().enumerate() {
        byte_equal(&be.download_cache(c)?, before)
            .map_err(|e| format!("cache {i} changed: {e}"))?;
    }
    Ok(())
}

/// The caches and tensors the rows of one case name.
struct Fixture<B: Backend> {
    /// Each cache with the bytes it was given; the case's own ([`rows::MAIN`]) first.
    caches: Vec<(B::Cache, Bytes)>,
    mla: bool,
    /// Three tokens of 0.5 (f32).
    key: B::Tensor,
    value: B::Tensor,
    /// The value in bf16 (not for MLA).
    value_bf16: Option<B::Tensor>,
    query: B::Tensor,
    short_query: B::Tensor,
    out: B::Tensor,
    short_out: B::Tensor,
}

impl<B: Backend> Fixture<B> {
    /// The case's own cache of random bytes, and the tensors of the rows.
    fn new(be: &B, case: &LayoutCase, w: &Workload) -> Outcome<Self> {
        let l = &case.layout;
        let h = l.geometry().num_kv_heads as usize;
        let (kw, vw, mla) = widths(l).expect("K/V content");
        let bytes = random_bytes(l, &format!("{}/refusals", case.name));
        let main = upload(be, l, &bytes)?;
        let dc = &w.decodes[1];
        let n_out = w.seq_lens.len() * dc.params.num_q_heads as usize * vw;
        let half = |n: usize| HostTensor::F32(vec![0.5; 3 * h * n]);
        let value_bf16 =
            HostTensor::from_f32(DType::Bf16, &vec![0.5; 3 * h * vw]).map_err(|e| e.to_string())?;
        Ok(Fixture {
            caches: vec![(main, bytes)],
            mla,
            key: be.upload_tensor(&half(kw))?,
            value: be.upload_tensor(&half(vw))?,
            value_bf16: (!mla).then(|| be.upload_tensor(&value_bf16)).transpose()?,
            query: be.upload_tensor(&dc.query)?,
            short_query: be.upload_tensor(&HostTensor::F32(vec![0.0; dc.query.len() - 1]))?,
            out: be.alloc_tensor(DType::F32, n_out)?,
            short_out: be.alloc_tensor(DType::F32, n_out - 1)?,
        })
    }

    /// A cache of `l` in buffers of `shapes`, holding `bytes`.
    fn add(
        &mut self,
        be: &B,
        l: &KvCacheLayout,
        shapes: &[BufferShape],
        bytes: Bytes,
    ) -> Outcome<CacheId> {
        let mut c = be.alloc_cache(l, shapes)?;
        be.upload_cache(&mut c, &bytes)?;
        self.caches.push((c, bytes));
        Ok(self.caches.len() - 1)
    }

    /// A cache of `l` (exact buffers) of random bytes.
    fn add_random(&mut self, be: &B, l: &KvCacheLayout, seed: &str) -> Outcome<CacheId> {
        self.add(be, l, &BufferShape::exact(l), random_bytes(l, seed))
    }

    /// The caches the mover rows take besides the case's own.
    fn add_others(&mut self, be: &B, l: &KvCacheLayout, plan: &MoverPlan) -> Outcome<Others> {
        // Another dtype (of the same size where there is one, so padded pages still fit).
        let other_dtype = match l.dtype() {
            DType::F32 => "bf16",
            DType::F16 => "bf16",
            DType::Bf16 => "f16",
            DType::Fp8E4m3 => "fp8_e5m2",
            _ => "fp8_e4m3",
        };
        let mut spec = l.spec().clone();
        spec.dtype = other_dtype.parse().expect("dtype");
        let other = KvCacheLayout::new(spec).expect("same geometry, other dtype");
        let mut spec = l.spec().clone();
        spec.geometry.num_blocks += 1;
        let more = KvCacheLayout::new(spec).expect("one block more");
        let mut spec = l.spec().clone();
        spec.geometry.num_kv_heads -= 1;
        let fewer = (l.geometry().num_kv_heads > 1)
            .then(|| KvCacheLayout::new(spec).ok())
            .flatten();
        let staging = &plan.staging;
        Ok(Others {
            other_dtype: self.add_random(be, &other, "other")?,
            more_blocks: self.add_random(be, &more, "more")?,
            fewer_heads: fewer
                .map(|f| self.add_random(be, &f, "fewer"))
                .transpose()?,
            staging: self.add(be, staging, &BufferShape::exact(staging), sentinel(staging))?,
        })
    }

    /// Makes the call of a row.
    fn call(&mut self, be: &B, call: &Call) -> Result<B::Completion, OpError> {
        if let Some((src, dst)) = call.between() {
            let (s, d) = src_and_dst(&mut self.caches, src, dst);
            return between(be, call, &s.0, &mut d.0);
        }
        let caches = &mut self.caches;
        match call {
            Call::Write(w) => {
                let value = match w.value {
                    Value::Workload => (!self.mla).then_some(&self.value),
                    Value::Key => Some(&self.key),
                    Value::Bf16 => self.value_bf16.as_ref(),
                    Value::Missing => None,
                };
                let args = WriteArgs {
                    layer: w.layer,
                    key: &self.key,
                    value,
                    slot_mapping: &w.slots,
                };
                be.write_kv(&mut caches[w.cache].0, &args)
            }
            Call::Decode(d) => {
                let args = DecodeArgs {
                    layer: d.layer,
                    query: if d.short_query {
                        &self.short_query
                    } else {
                        &self.query
                    },
                    block_table: &d.table,
                    blocks_per_seq: d.blocks_per_seq,
                    seq_lens: &d.lens,
                    params: d.params,
                };
                let out = if d.short_out {
                    &mut self.short_out
                } else {
                    &mut self.out
                };
                be.paged_decode(&caches[d.cache].0, &args, out)
            }
            Call::Copy { cache, pairs } => be.copy_blocks(&mut caches[*cache].0, pairs),
            _ => unreachable!("a call between two caches"),
        }
    }

    /// Runs a row: refused with its error, and every cache it names unchanged.
    fn run(&mut self, be: &B, row: &Refusal) -> Outcome<()> {
        let r = self.call(be, &row.call);
        let caches: Vec<(&B::Cache, &Bytes)> = row
            .call
            .caches()
            .into_iter()
            .map(|i| (&self.caches[i].0, &self.caches[i].1))
            .collect();
        refused(be, r, &row.expect, &caches)
    }
}

/// A call between two caches, on `src` and `dst`.
fn between<B: Backend>(
    be: &B,
    call: &Call,
    src: &B::Cache,
    dst: &mut B::Cache,
) -> Result<B::Completion, OpError> {
    match call {
        Call::Swap { pairs, .. } => be.swap_blocks(src, dst, pairs),
        Call::Convert { .. } => be.convert(src, dst),
        Call::Gather { blocks, heads, .. } => be.gather_blocks(src, blocks, heads.clone(), dst),
        Call::Scatter { blocks, heads, .. } => be.scatter_blocks(src, blocks, heads.clone(), dst),
        _ => unreachable!("a call on one cache"),
    }
}

/// `(&v[src], &mut v[dst])` of two different indices.
fn src_and_dst<T>(v: &mut [T], src: usize, dst: usize) -> (&T, &mut T) {
    assert_ne!(src, dst, "a call between two different caches");
    if src < dst {
        let (a, b) = v.split_at_mut(dst);
        (&a[src], &mut b[0])
    } else {
        let (a, b) = v.split_at_mut(src);
        (&b[0], &mut a[dst])
    }
}

/// Every row of the table on one case: the case's own cache and the mover rows' caches, then
/// each buffer shorter than its registered span (by one byte, and down to the last element
/// byte when the span is padded) and misaligned.
fn refusals_for<B: Backend>(be: &B, rep: &mut Report, case: &LayoutCase) -> Outcome<()> {
    let l = &case.layout;
    let w = workload(case).expect("K/V content");
    let (_, _, mla) = widths(l).expect("K/V content");
    let plan = mover_plan(case, 0);
    let mut fx = Fixture::new(be, case, &w)?;
    let others = fx.add_others(be, l, &plan)?;
    let cx = Ctx {
        layout: l,
        work: &w,
        step: &w.decodes[1],
        mla,
        plan: &plan,
    };
    let mut rows = cx.rows(&others);
    for i in 0..l.num_buffers() {
        for (len, shapes) in cx.short_shapes(i) {
            let bad = fx.add(be, l, &shapes, random_bytes_shaped(&shapes, "short"))?;
            rows.extend(cx.short_rows(bad, i, len));
        }
        let shapes = cx.misaligned_shapes(i);
        let bad = fx.add(be, l, &shapes, random_bytes_shaped(&shapes, "misaligned"))?;
        rows.extend(cx.misaligned_rows(bad, i));
    }
    for row in &rows {
        let r = fx.run(be, row);
        rep.check("refusal", &format!("{}: {}", case.name, row.name), r);
    }
    Ok(())
}

/// Random bytes for buffers of `shapes`, seeded by `seed`.
fn random_bytes_shaped(shapes: &[BufferShape], seed: &str) -> Bytes {
    let lens: Vec<u64> = shapes.iter().map(|s| s.len).collect();
    random_bytes_of(&lens, seed)
}

/// One-byte elements need no alignment: a buffer at an odd address works, and the result
/// equals the reference's.
fn odd_address_accepted<B: Backend>(be: &B, rep: &mut Report) -> Outcome<()> {
    let case = case_from_spec(
        "odd-address",
        "kv L=1 B=3 N=16 H=2 D=8 dtype=fp8_e4m3 order=NHD",
        DType::F32,
    );
    let l = &case.layout;
    let w = workload(&case).expect("workload");
    let mut shapes = BufferShape::exact(l);
    shapes[0].misalign = 3;
    let mut c = be.alloc_cache(l, &shapes)?;
    be.upload_cache(&mut c, &sentinel(l))?;
    let key = be.upload_tensor(&w.key)?;
    let value = be.upload_tensor(w.value.as_ref().expect("value"))?;
    let args = WriteArgs {
        layer: 0,
        key: &key,
        value: Some(&value),
        slot_mapping: &w.slot_mapping,
    };
    let r = done(be, be.write_kv(&mut c, &args)).and_then(|()| {
        let got = be.download_cache(&c)?;
        let oracle = Host::<ScalarReference>::reference();
        let mut want = upload(&oracle, l, &sentinel(l))?;
        let (k, v) = (
            oracle.upload_tensor(&w.key)?,
            oracle.upload_tensor(w.value.as_ref().expect("value"))?,
        );
        done(
            &oracle,
            oracle.write_kv(
                &mut want,
                &WriteArgs {
                    layer: 0,
                    key: &k,
                    value: Some(&v),
                    slot_mapping: &w.slot_mapping,
                },
            ),
        )?;
        byte_equal(&got, &oracle.download_cache(&want)?)
    });
    rep.check("refusal", "fp8 cache at an odd address is accepted", r);
    Ok(())
}

/// Every refusal case on `be`, tallied in `rep`.
fn refusals<B: Backend>(be: &B, rep: &mut Report) {
    for (name, spec) in [
        (
            "padded-f16",
            "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=NHD page=4160",
        ),
        (
            "separate-f32",
            "kv L=1 B=3 N=16 H=2 D=8 dtype=f32 tensor=separate-hnd",
        ),
        (
            "vllm-x-split-f32",
            "kv L=1 B=3 N=16 H=2 D=32 dtype=f32 tensor=vllm-paged-v1",
        ),
        (
            "inline-int8",
            "kv-scaled L=2 B=3 N=16 H=4 D=8 dtype=int8 order=HND base=64",
        ),
        (
            "mla-bf16",
            "mla L=1 B=3 N=16 rank=32 rope=8 dtype=bf16 order=BLNHC page=1344",
        ),
        (
            "h1-fp8",
            "kv L=2 B=2 N=16 H=1 D=16 dtype=fp8_e5m2 order=HND",
        ),
    ] {
        let case = case_from_spec(name, spec, DType::F32);
        match guarded(name, || refusals_for(be, rep, &case)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) | Err(e) => rep.fail("refusal", format!("refusal: {name}: {e}")),
        }
    }
    if let Err(e) = odd_address_accepted(be, rep) {
        rep.fail("refusal", format!("refusal: odd address: {e}"));
    }
}

#[test]
fn refusals_on_every_backend() {
    let backends = Backends::default();
    let mut reports = BTreeMap::new();
    for b in backends.selected() {
        if let Some((rep, be)) = report_of(&mut reports, b) {
            refusals(be, rep);
        }
    }
    let failures = print_backend_reports("refusals", &reports, &backends);
    assert_eq!(failures, 0, "refusal failures (listed above)");
}
