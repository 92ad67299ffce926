//! Refusals: each bad input a typed `OpError` on every backend, and every cache byte
//! unchanged (see the suite's module doc).

use super::*;
use kvlayout::LayoutError;
use kvlayout_conformance::cases::case_from_spec;

struct Refusals<'a> {
    reports: &'a mut BTreeMap<String, Report>,
}

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

fn refusals_for<B: Backend>(be: &B, rep: &mut Report, case: &LayoutCase) -> Outcome<()> {
    let l = &case.layout;
    let g = *l.geometry();
    let w = workload(case).expect("K/V content");
    let (kw, vw, mla) = widths(l).expect("K/V content");
    let h = g.num_kv_heads as usize;
    let name = &case.name;
    let bytes = random_bytes(l, &format!("{name}/refusals"));
    let mut cache = upload(be, l, &bytes)?;
    let limit = (g.num_blocks * g.block_size) as i64;

    // write_kv
    let key = be.upload_tensor(&HostTensor::F32(vec![0.5; 3 * h * kw]))?;
    let value = be.upload_tensor(&HostTensor::F32(vec![0.5; 3 * h * vw]))?;
    let value = (!mla).then_some(&value);
    let write = |cache: &mut B::Cache,
                 slots: &[i64],
                 layer: u64,
                 key: &B::Tensor,
                 value: Option<&B::Tensor>| {
        be.write_kv(
            cache,
            &WriteArgs {
                layer,
                key,
                value,
                slot_mapping: slots,
            },
        )
    };
    let check = |rep: &mut Report, what: &str, r: Outcome<()>| {
        rep.check("refusal", &format!("{name}: {what}"), r)
    };
    let r = write(&mut cache, &[0, limit, 3], w.layer, &key, value);
    check(
        rep,
        "slot out of range",
        refused(
            be,
            r,
            |e| matches!(e, OpError::SlotOutOfRange { token: 1, slot, limit: l } if *slot == limit && *l as i64 == limit),
            &[(&cache, &bytes)],
        ),
    );
    let r = write(&mut cache, &[4, -1, 4], w.layer, &key, value);
    check(
        rep,
        "duplicate slot",
        refused(
            be,
            r,
            |e| {
                matches!(
                    e,
                    OpError::DuplicateSlot {
                        token: 2,
                        slot: 4,
                        first: 0
                    }
                )
            },
            &[(&cache, &bytes)],
        ),
    );
    let r = write(&mut cache, &[0, 1, 2], g.num_layers, &key, value);
    check(
        rep,
        "layer out of range",
        refused(
            be,
            r,
            |e| {
                matches!(
                    e,
                    OpError::Layout(LayoutError::OutOfRange { axis: "layer", .. })
                )
            },
            &[(&cache, &bytes)],
        ),
    );
    let r = write(&mut cache, &[0, 1], w.layer, &key, value);
    check(
        rep,
        "key of the wrong shape (3 tokens, 2 slots)",
        refused(
            be,
            r,
            |e| matches!(e, OpError::Shape { .. }),
            &[(&cache, &bytes)],
        ),
    );
    if mla {
        let r = write(&mut cache, &[0, 1, 2], w.layer, &key, Some(&key));
        check(
            rep,
            "a value tensor for MLA",
            refused(
                be,
                r,
                |e| matches!(e, OpError::Shape { .. }),
                &[(&cache, &bytes)],
            ),
        );
    } else {
        let v16 = be.upload_tensor(&HostTensor::from_f32(DType::Bf16, &vec![0.5; 3 * h * vw]))?;
        let r = write(&mut cache, &[0, 1, 2], w.layer, &key, Some(&v16));
        check(
            rep,
            "value dtype differs from key dtype",
            refused(
                be,
                r,
                |e| matches!(e, OpError::Shape { .. }),
                &[(&cache, &bytes)],
            ),
        );
        let r = write(&mut cache, &[0, 1, 2], w.layer, &key, None);
        check(
            rep,
            "no value tensor",
            refused(
                be,
                r,
                |e| matches!(e, OpError::Shape { .. }),
                &[(&cache, &bytes)],
            ),
        );
    }

    // paged_decode
    let dc = &w.decodes[1];
    let q = be.upload_tensor(&dc.query)?;
    let n_out = w.seq_lens.len() * dc.params.num_q_heads as usize * vw;
    let mut out = be.alloc_tensor(DType::F32, n_out)?;
    let decode = |cache: &B::Cache,
                  out: &mut B::Tensor,
                  table: &[i32],
                  lens: &[u32],
                  params: DecodeParams,
                  query: &B::Tensor| {
        be.paged_decode(
            cache,
            &DecodeArgs {
                layer: w.layer,
                query,
                block_table: table,
                blocks_per_seq: w.blocks_per_seq,
                seq_lens: lens,
                params,
            },
            out,
        )
    };
    let mut table = w.block_table.clone();
    let last = (u64::from(w.seq_lens[0]).div_ceil(g.block_size) - 1) as usize;
    table[last] = g.num_blocks as i32;
    let r = decode(&cache, &mut out, &table, &w.seq_lens, dc.params, &q);
    check(
        rep,
        "block id out of range",
        refused(
            be,
            r,
            |e| {
                matches!(
                    e,
                    OpError::BlockOutOfRange { seq: 0, position, .. } if *position == last
                )
            },
            &[(&cache, &bytes)],
        ),
    );
    let mut table = w.block_table.clone();
    table[0] = -1;
    let r = decode(&cache, &mut out, &table, &w.seq_lens, dc.params, &q);
    check(
        rep,
        "negative block id",
        refused(
            be,
            r,
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
            &[(&cache, &bytes)],
        ),
    );
    let mut lens = w.seq_lens.clone();
    lens[1] = (w.blocks_per_seq as u64 * g.block_size + 1) as u32;
    let r = decode(&cache, &mut out, &w.block_table, &lens, dc.params, &q);
    check(
        rep,
        "sequence longer than its blocks",
        refused(
            be,
            r,
            |e| matches!(e, OpError::SequenceTooLong { seq: 1, .. }),
            &[(&cache, &bytes)],
        ),
    );
    let r = decode(
        &cache,
        &mut out,
        &w.block_table[1..],
        &w.seq_lens,
        dc.params,
        &q,
    );
    check(
        rep,
        "block table of the wrong size",
        refused(
            be,
            r,
            |e| matches!(e, OpError::Shape { .. }),
            &[(&cache, &bytes)],
        ),
    );
    let bad = DecodeParams {
        num_q_heads: g.num_kv_heads * 4 + 1,
        ..dc.params
    };
    let r = decode(&cache, &mut out, &w.block_table, &w.seq_lens, bad, &q);
    check(
        rep,
        "query heads not a multiple of KV heads",
        refused(
            be,
            r,
            |e| matches!(e, OpError::Shape { .. }),
            &[(&cache, &bytes)],
        ),
    );
    let bad = DecodeParams {
        soft_cap: Some(-1.0),
        ..dc.params
    };
    let r = decode(&cache, &mut out, &w.block_table, &w.seq_lens, bad, &q);
    check(
        rep,
        "negative soft-cap",
        refused(
            be,
            r,
            |e| matches!(e, OpError::Shape { .. }),
            &[(&cache, &bytes)],
        ),
    );
    let mut short_out = be.alloc_tensor(DType::F32, n_out - 1)?;
    let r = decode(
        &cache,
        &mut short_out,
        &w.block_table,
        &w.seq_lens,
        dc.params,
        &q,
    );
    check(
        rep,
        "output of the wrong size",
        refused(
            be,
            r,
            |e| matches!(e, OpError::Shape { .. }),
            &[(&cache, &bytes)],
        ),
    );
    let short_q = be.upload_tensor(&HostTensor::F32(vec![0.0; dc.query.len() - 1]))?;
    let r = decode(
        &cache,
        &mut out,
        &w.block_table,
        &w.seq_lens,
        dc.params,
        &short_q,
    );
    check(
        rep,
        "query of the wrong size",
        refused(
            be,
            r,
            |e| matches!(e, OpError::Shape { .. }),
            &[(&cache, &bytes)],
        ),
    );

    // Block movers.
    let nb = g.num_blocks;
    let r = be.copy_blocks(&mut cache, &[(nb, 0)]);
    check(
        rep,
        "copy: source block out of range",
        refused(
            be,
            r,
            |e| matches!(e, OpError::BadPair { index: 0, .. }),
            &[(&cache, &bytes)],
        ),
    );
    let r = be.copy_blocks(&mut cache, &[(0, 1), (2, 1)]);
    check(
        rep,
        "copy: destination twice",
        refused(
            be,
            r,
            |e| matches!(e, OpError::BadPair { dst: 1, .. }),
            &[(&cache, &bytes)],
        ),
    );
    let r = be.copy_blocks(&mut cache, &[(0, 1), (1, 2)]);
    check(
        rep,
        "copy: a source that is also a destination",
        refused(
            be,
            r,
            |e| matches!(e, OpError::BadPair { .. }),
            &[(&cache, &bytes)],
        ),
    );
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
    let other_bytes = random_bytes(&other, "other");
    let mut other_cache = upload(be, &other, &other_bytes)?;
    let r = be.swap_blocks(&other_cache, &mut cache, &[(0, 0)]);
    check(
        rep,
        "swap: different dtype",
        refused(
            be,
            r,
            |e| matches!(e, OpError::Incompatible(_)),
            &[(&cache, &bytes), (&other_cache, &other_bytes)],
        ),
    );
    let r = be.convert(&cache, &mut other_cache);
    check(
        rep,
        "convert: different dtype",
        refused(
            be,
            r,
            |e| matches!(e, OpError::Incompatible(_)),
            &[(&cache, &bytes), (&other_cache, &other_bytes)],
        ),
    );
    let mut spec = l.spec().clone();
    spec.geometry.num_blocks += 1;
    let more = KvCacheLayout::new(spec).expect("one block more");
    let more_bytes = random_bytes(&more, "more");
    let mut more_cache = upload(be, &more, &more_bytes)?;
    let r = be.convert(&cache, &mut more_cache);
    check(
        rep,
        "convert: different block count",
        refused(
            be,
            r,
            |e| matches!(e, OpError::Incompatible(_)),
            &[(&cache, &bytes), (&more_cache, &more_bytes)],
        ),
    );
    let r = be.swap_blocks(&more_cache, &mut cache, &[(0, nb)]);
    check(
        rep,
        "swap: destination block out of range",
        refused(
            be,
            r,
            |e| matches!(e, OpError::BadPair { index: 0, .. }),
            &[(&cache, &bytes), (&more_cache, &more_bytes)],
        ),
    );
    if g.num_kv_heads > 1 {
        let mut spec = l.spec().clone();
        spec.geometry.num_kv_heads -= 1;
        if let Ok(fewer) = KvCacheLayout::new(spec) {
            let fb = random_bytes(&fewer, "fewer");
            let fc = upload(be, &fewer, &fb)?;
            let r = be.swap_blocks(&fc, &mut cache, &[(0, 0)]);
            check(
                rep,
                "swap: different head count",
                refused(
                    be,
                    r,
                    |e| matches!(e, OpError::Incompatible(_)),
                    &[(&cache, &bytes), (&fc, &fb)],
                ),
            );
        }
    }
    let plan = mover_plan(case, 0);
    let sb = sentinel(&plan.staging);
    let mut staging = upload(be, &plan.staging, &sb)?;
    let r = be.gather_blocks(
        &cache,
        &plan.gather_blocks,
        0..g.num_kv_heads + 1,
        &mut staging,
    );
    check(
        rep,
        "gather: head range past the heads",
        refused(
            be,
            r,
            |e| matches!(e, OpError::Shape { .. }),
            &[(&cache, &bytes), (&staging, &sb)],
        ),
    );
    if plan.heads.end - plan.heads.start > 1 {
        let r = be.gather_blocks(
            &cache,
            &plan.gather_blocks,
            plan.heads.start..plan.heads.end - 1,
            &mut staging,
        );
        check(
            rep,
            "gather: staging holds other heads",
            refused(
                be,
                r,
                |e| matches!(e, OpError::Incompatible(_)),
                &[(&cache, &bytes), (&staging, &sb)],
            ),
        );
    }
    let r = be.gather_blocks(&cache, &[0, 1, 0, 1], plan.heads.clone(), &mut staging);
    check(
        rep,
        "gather: more blocks than the staging holds",
        refused(
            be,
            r,
            |e| matches!(e, OpError::Incompatible(_)),
            &[(&cache, &bytes), (&staging, &sb)],
        ),
    );
    let r = be.gather_blocks(&cache, &[nb], plan.heads.clone(), &mut staging);
    check(
        rep,
        "gather: block out of range",
        refused(
            be,
            r,
            |e| matches!(e, OpError::BadPair { .. }),
            &[(&cache, &bytes), (&staging, &sb)],
        ),
    );
    let r = be.scatter_blocks(&staging, &[1, 1], plan.heads.clone(), &mut cache);
    check(
        rep,
        "scatter: one block twice",
        refused(
            be,
            r,
            |e| matches!(e, OpError::BadPair { .. }),
            &[(&cache, &bytes), (&staging, &sb)],
        ),
    );

    // Buffers: shorter than the registered span (by one byte, and down to the last element
    // byte when the span is padded), misaligned.
    let data_end: Vec<u64> = (0..l.num_buffers())
        .map(|i| {
            l.stored_fields()
                .iter()
                .filter(|m| m.strides.buffer as usize == i)
                .map(|m| m.data_end())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for i in 0..l.num_buffers() {
        let exact = BufferShape::exact(l);
        let needed = exact[i].len;
        let mut lens = vec![needed - 1];
        if data_end[i] < needed - 1 {
            lens.push(data_end[i]);
        }
        for len in lens {
            let mut shapes = exact.clone();
            shapes[i].len = len;
            let mut bad = be.alloc_cache(l, &shapes)?;
            let bb = random_bytes_shaped(&shapes, "short");
            be.upload_cache(&mut bad, &bb)?;
            let is_short = |e: &OpError| matches!(e, OpError::BufferTooShort { buffer, len: got, needed: n } if *buffer == i && *got == len && *n == needed);
            let r = write(&mut bad, &[0, 1, 2], w.layer, &key, value);
            check(
                rep,
                &format!("write_kv: buffer {i} of {len} bytes (span {needed})"),
                refused(be, r, is_short, &[(&bad, &bb)]),
            );
            let r = decode(&bad, &mut out, &w.block_table, &w.seq_lens, dc.params, &q);
            check(
                rep,
                &format!("paged_decode: buffer {i} of {len} bytes (span {needed})"),
                refused(be, r, is_short, &[(&bad, &bb)]),
            );
            let r = be.copy_blocks(&mut bad, &[(0, 1)]);
            check(
                rep,
                &format!("copy_blocks: buffer {i} of {len} bytes (span {needed})"),
                refused(be, r, is_short, &[(&bad, &bb)]),
            );
            let r = be.convert(&cache, &mut bad);
            check(
                rep,
                &format!("convert: destination buffer {i} of {len} bytes (span {needed})"),
                refused(be, r, is_short, &[(&bad, &bb), (&cache, &bytes)]),
            );
        }
        let align = l
            .stored_fields()
            .iter()
            .filter(|m| m.strides.buffer as usize == i)
            .map(|m| m.elem_bytes())
            .max()
            .unwrap_or(1);
        let mut shapes = exact.clone();
        shapes[i].misalign = align / 2;
        let mut bad = be.alloc_cache(l, &shapes)?;
        let bb = random_bytes_shaped(&shapes, "misaligned");
        be.upload_cache(&mut bad, &bb)?;
        if align > 1 {
            let is_misaligned = |e: &OpError| matches!(e, OpError::Misaligned { buffer, align: a, .. } if *buffer == i && *a as u64 == align);
            let r = write(&mut bad, &[0, 1, 2], w.layer, &key, value);
            check(
                rep,
                &format!(
                    "write_kv: buffer {i} misaligned by {} for {align}-byte elements",
                    align / 2
                ),
                refused(be, r, is_misaligned, &[(&bad, &bb)]),
            );
            let r = decode(&bad, &mut out, &w.block_table, &w.seq_lens, dc.params, &q);
            check(
                rep,
                &format!("paged_decode: buffer {i} misaligned"),
                refused(be, r, is_misaligned, &[(&bad, &bb)]),
            );
            let r = be.swap_blocks(&cache, &mut bad, &[(0, 0)]);
            check(
                rep,
                &format!("swap_blocks: destination buffer {i} misaligned"),
                refused(be, r, is_misaligned, &[(&bad, &bb), (&cache, &bytes)]),
            );
        }
    }
    Ok(())
}

fn random_bytes_shaped(shapes: &[BufferShape], seed: &str) -> Bytes {
    let mut rng = Rng::new(seed);
    shapes.iter().map(|s| rng.bytes(s.len as usize)).collect()
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

impl BackendVisitor for Refusals<'_> {
    fn visit<B: Backend>(&mut self, be: &B) {
        let rep = self.reports.entry(be.name().to_string()).or_default();
        if let Err(why) = be.available() {
            rep.skipped = Some(why);
            return;
        }
        for (name, spec) in [
            (
                "padded-f16",
                "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=NHD page=4160",
            ),
            (
                "separate-f32",
                "kv L=1 B=3 N=16 H=2 D=8 dtype=f32 legacy=separate-hnd",
            ),
            (
                "vllm-x-split-f32",
                "kv L=1 B=3 N=16 H=2 D=32 dtype=f32 legacy=vllm-paged-v1",
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
                Ok(Err(e)) | Err(e) => rep.failures.push(format!("refusal: {name}: {e}")),
            }
        }
        if let Err(e) = odd_address_accepted(be, rep) {
            rep.failures.push(format!("refusal: odd address: {e}"));
        }
    }
}

#[test]
fn refusals_on_every_backend() {
    let backends = Backends::default();
    let mut reports = BTreeMap::new();
    backends.for_each(&mut Refusals {
        reports: &mut reports,
    });
    let names = backend_names(&backends);
    let order: Vec<&str> = names.iter().map(String::as_str).collect();
    let failures = print_reports("refusals", &reports, &order);
    assert_eq!(failures, 0, "refusal failures (listed above)");
}
