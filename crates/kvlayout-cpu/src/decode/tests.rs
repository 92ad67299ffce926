use super::*;
use crate::arch::{self, PrefetchLevel};
#[cfg(unix)]
use crate::guard::Guarded;
use crate::tolerance::decode_error;
use crate::{reference, Activations, DecodeParams, HostCache, HostExec, ScalarReference, WriteKv};
use half::{bf16, f16};
use kvlayout::KvCacheLayout;

fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(747796405).wrapping_add(2891336453);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 2001) as f32 / 500.0 - 2.0
        })
        .collect()
}

#[derive(Clone)]
struct Case {
    spec: String,
    q_heads: u64,
    lens: Vec<u32>,
    window: Option<u64>,
    cap: Option<f32>,
    layer: u64,
    /// Query activations: 0 f32, 1 f16, 2 bf16.
    query: u8,
    /// Also force this many partitions (besides none and one).
    parts: usize,
}

fn case(spec: &str, q_heads: u64, lens: &[u32]) -> Case {
    Case {
        spec: spec.into(),
        q_heads,
        lens: lens.to_vec(),
        window: None,
        cap: None,
        layer: 0,
        query: 0,
        parts: 3,
    }
}

/// The fast path on every instruction set of this machine, with and without forced
/// context partitions, against the scalar f64 reference on the same cache. The reference
/// reads the same stored values, so the only differences are f32 accumulation and, in the
/// bf16-operand kernels, the bf16 query and weights: see [`tolerance`] (both tighter than
/// a quantization step).
fn run_case(c: &Case) {
    let (cache, table, per_seq) = written_cache(c);
    let l = cache.layout().clone();
    let (kw, vw) = kvlayout::ops::decode_widths(&l).unwrap();
    let (kw, vw) = (kw as usize, vw as usize);
    let seqs = c.lens.len();
    let q = data(seqs * c.q_heads as usize * kw, 3);
    let q16: Vec<f16> = q.iter().map(|x| f16::from_f32(*x)).collect();
    let qb16: Vec<bf16> = q.iter().map(|x| bf16::from_f32(*x)).collect();
    let d = Decode {
        layer: c.layer,
        query: match c.query {
            0 => Activations::F32(&q),
            1 => Activations::F16(&q16),
            _ => Activations::Bf16(&qb16),
        },
        block_table: &table,
        blocks_per_seq: per_seq,
        seq_lens: &c.lens,
        params: DecodeParams {
            num_q_heads: c.q_heads,
            scale: 1.0 / (kw as f32).sqrt(),
            sliding_window: c.window,
            soft_cap: c.cap,
        },
    };
    let n = seqs * c.q_heads as usize * vw;
    let mut want = vec![0f32; n];
    let mags = reference::paged_decode_magnitudes(&cache.as_ref(), &d, &mut want).unwrap();
    // Tiles for rows prefetched to L1 and to L2, whichever this machine uses.
    let levels = [PrefetchLevel::L1, PrefetchLevel::L2]
        .map(|level| CpuBackend::new(Some(2)).with_prefetch_level(level));
    // Default partitions and thread; one partition and several, on the pool and on the
    // calling thread.
    let runs = [
        (None, None),
        (Some(1), Some(false)),
        (Some(c.parts), Some(false)),
        (Some(1), Some(true)),
        (Some(c.parts), Some(true)),
    ];
    for (be, isa, (parts, inline)) in levels.iter().flat_map(|be| {
        arch::available()
            .into_iter()
            .flat_map(move |isa| runs.map(|r| (be, isa, r)))
    }) {
        let mut got = vec![f32::NAN; n];
        let opts = Options {
            partitions: parts,
            isa: Some(isa),
            inline,
        };
        decode_with(be, &cache.as_ref(), &d, &mut got, opts).unwrap();
        let e = decode_error(&got, &want, &mags, isa.decode_tolerance(l.dtype()));
        assert!(
            e.passed(),
            "{} {isa:?} {:?} parts {parts:?} inline {inline:?}: {e:?}",
            c.spec,
            be.prefetch_level()
        );
    }
}

/// The cache of a case, its sequences' keys and values written, with the block table (each
/// sequence owns blocks in a scrambled order) and the blocks per sequence.
fn written_cache(c: &Case) -> (HostCache, Vec<i32>, usize) {
    let l: KvCacheLayout = c.spec.parse().unwrap();
    let g = *l.geometry();
    let (kw, vw) = kvlayout::ops::decode_widths(&l).unwrap();
    let (kw, vw) = (kw as usize, vw as usize);
    let mla = l.content().shares_latent();
    let heads = g.num_kv_heads as usize;
    let bs = g.block_size as usize;
    let seqs = c.lens.len();
    let per_seq = c
        .lens
        .iter()
        .map(|l| (*l as usize).div_ceil(bs))
        .max()
        .unwrap_or(0)
        .max(1);
    assert!(
        seqs * per_seq <= g.num_blocks as usize,
        "case needs more blocks"
    );
    // Sequence s owns blocks in a scrambled order.
    let nb = seqs * per_seq;
    let table: Vec<i32> = (0..nb).map(|i| (nb - 1 - (i + 3) % nb) as i32).collect();
    let mut cache = HostCache::new(l).unwrap();
    cache.fill(0x3c); // other layers and unused slots: finite values
    let mut slots = Vec::new();
    for (s, len) in c.lens.iter().enumerate() {
        for t in 0..*len as usize {
            slots.push(i64::from(table[s * per_seq + t / bs]) * bs as i64 + (t % bs) as i64);
        }
    }
    let k = data(slots.len() * heads * kw, 1);
    let v = data(slots.len() * heads * vw, 2);
    let w = WriteKv {
        layer: c.layer,
        key: Activations::F32(&k),
        value: (!mla).then_some(Activations::F32(&v)),
        slot_mapping: &slots,
    };
    ScalarReference.write_kv(&mut cache.as_mut(), &w).unwrap();
    (cache, table, per_seq)
}

const DTYPES: [&str; 5] = ["f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2"];

#[test]
fn layouts_and_dtypes_match_reference() {
    let lens = [37, 0, 16, 70];
    for dtype in DTYPES {
        for placement in [
            "order=NHD",
            "order=HND",
            "order=BLNHC page=65536",
            "order=HLBNC", // heads outside the blocks: one head per item
            "order=NHD base=192",
            "tensor=vllm-paged-v1", // x-split keys, transposed values: gathered rows
            "tensor=flash-attn-hnd",
            "tensor=flashinfer-nhd",
            "tensor=separate-nhd",
        ] {
            run_case(&case(
                &format!("kv L=1 B=24 N=16 H=2 D=32 dtype={dtype} {placement}"),
                8,
                &lens,
            ));
        }
    }
}

/// x-split keys whose 16-byte pieces lie further apart than a block's tokens (a chunk stride
/// of `N * 16 + 64` bytes, as an explicit-stride layout may state): the split kernels must take
/// the layout's chunk stride, not `N * 16`.
#[test]
fn split_keys_with_pieces_further_apart() {
    let lens = [37, 0, 16, 70];
    for (dtype, e) in [("f32", 4u64), ("f16", 2), ("bf16", 2), ("fp8_e4m3", 1)] {
        let (n, d, heads, blocks) = (16u64, 32u64, 2u64, 24u64);
        let x = 16 / e;
        let chunk = n * 16 + 64;
        let k_head = d / x * chunk;
        let k_block = heads * k_head;
        let v_base = blocks * k_block;
        let (v_slot, v_head) = (d * e, n * d * e);
        let v_block = heads * v_head;
        let end = v_base + blocks * v_block;
        let spec = format!(
            "kv L=1 B={blocks} N={n} H={heads} D={d} dtype={dtype} \
             @k=0:0:0:{k_block}:{k_head}:16:{x}:{chunk}:{e} \
             @v=0:{v_base}:0:{v_block}:{v_head}:{v_slot}:{d}:{v_slot}:{e} @buf0=0..{end}"
        );
        let l: KvCacheLayout = spec.parse().unwrap();
        let k = l.field_map(kvlayout::Field::K).unwrap();
        assert!(k.is_dim_split() && k.strides.dim_chunk != n * 16, "{spec}");
        run_case(&case(&spec, 8, &lens));
    }
}

#[test]
fn inline_and_tensor_scales() {
    let lens = [37, 0, 16, 70];
    for spec in [
        "kv-scaled L=1 B=24 N=16 H=2 D=32 dtype=int8 order=NHD",
        "kv-scaled L=1 B=24 N=16 H=2 D=96 dtype=int8 order=HND",
        "kv-scaled L=1 B=24 N=16 H=2 D=32 dtype=fp8_e4m3 order=HND",
        "kv-scaled L=1 B=24 N=16 H=2 D=80 dtype=fp8_e5m2 order=NHD",
        "kv L=1 B=24 N=16 H=2 D=32 dtype=fp8_e4m3 order=NHD k_scale=0.5 v_scale=2.0",
        "kv L=1 B=24 N=16 H=2 D=48 dtype=fp8_e5m2 order=HND k_scale=4 v_scale=0.25",
        "kv L=1 B=24 N=16 H=2 D=32 dtype=bf16 order=NHD k_scale=0.5 v_scale=3.0",
        "kv L=1 B=24 N=16 H=2 D=32 dtype=int8 order=NHD",
    ] {
        run_case(&case(spec, 4, &lens));
    }
}

#[test]
fn head_sizes_groups_and_mla() {
    for dtype in DTYPES {
        for d in [32, 64, 80, 96, 112, 120, 128, 192, 256] {
            run_case(&case(
                &format!("kv L=1 B=8 N=16 H=2 D={d} dtype={dtype} order=NHD"),
                8,
                &[40, 9],
            ));
        }
        run_case(&case(
            &format!("kv L=1 B=8 N=16 H=2 D=192 Dv=128 dtype={dtype} order=HND"),
            4,
            &[40, 9],
        ));
        for (h, q) in [(1, 8), (4, 4), (2, 6), (2, 16), (3, 6), (1, 1)] {
            // MQA, MHA, group 3, group 8, group 2 x 3 heads, a single head
            run_case(&case(
                &format!("kv L=1 B=8 N=16 H={h} D=64 dtype={dtype} order=NHD"),
                q,
                &[50, 3],
            ));
        }
        run_case(&case(
            &format!("mla L=1 B=8 N=16 rank=512 rope=64 dtype={dtype} order=NHD"),
            16,
            &[33, 20],
        ));
    }
}

#[test]
fn window_soft_cap_and_empty_sequences() {
    for dtype in ["f32", "bf16", "fp8_e4m3"] {
        let mut c = case(
            &format!("kv L=1 B=28 N=16 H=2 D=64 dtype={dtype} order=NHD"),
            4,
            &[100, 7, 64, 0],
        );
        c.window = Some(20);
        run_case(&c);
        c.window = None;
        c.cap = Some(5.0);
        run_case(&c);
        c.window = Some(1);
        run_case(&c);
        c.window = Some(1000);
        c.cap = Some(0.5);
        run_case(&c);
    }
    // Only empty sequences: zeros.
    run_case(&case(
        "kv L=1 B=4 N=16 H=2 D=64 dtype=f32 order=NHD",
        4,
        &[0, 0],
    ));
}

/// The legacy vLLM layout, read in place on AVX-512 and AVX2 (x-split keys, transposed values):
/// blocks of 32 tokens (runs split at 16), blocks of 8 (runs cut by the block table),
/// windows that start a tile inside a block, groups of 1, 3 and 6 (head blocks of 4 with a
/// remainder), widths that are not a multiple of a kernel block (keys' last blocks of one
/// to three 16-byte pieces); int8, and fp8 with per-tensor scales (raw fp8 values, the
/// power of two folded).
#[test]
fn transposed_values() {
    for spec in [
        "kv L=1 B=24 N=16 H=2 D=32 dtype=int8 tensor=vllm-paged-v1",
        "kv L=1 B=24 N=16 H=2 D=32 dtype=fp8_e4m3 tensor=vllm-paged-v1 k_scale=0.5 v_scale=2",
        "kv L=1 B=24 N=16 H=2 D=48 dtype=fp8_e5m2 tensor=vllm-paged-v1 k_scale=4 v_scale=0.25",
    ] {
        run_case(&case(spec, 4, &[37, 0, 16, 70]));
    }
    for dtype in DTYPES {
        for (n, d, h, q) in [
            (32, 80, 2, 6),
            (8, 48, 3, 3),
            (16, 112, 1, 1),
            (32, 16, 2, 2),
        ] {
            let mut c = case(
                &format!("kv L=1 B=40 N={n} H={h} D={d} dtype={dtype} tensor=vllm-paged-v1"),
                q,
                &[75, 1, 33],
            );
            run_case(&c);
            c.window = Some(21);
            run_case(&c);
        }
    }
    // f32 keys whose last kernel block (16 elements) is one or three pieces of 4.
    for d in [36, 44] {
        run_case(&case(
            &format!("kv L=1 B=40 N=16 H=2 D={d} dtype=f32 tensor=vllm-paged-v1"),
            4,
            &[75, 1, 33],
        ));
    }
}

#[test]
fn block_sizes_layers_and_query_dtypes() {
    for (n, lens) in [(1, vec![40, 9]), (8, vec![70, 33]), (64, vec![130, 65])] {
        for order in ["NHD", "HND"] {
            let nb = lens.iter().map(|l: &u32| l.div_ceil(n)).max().unwrap_or(1) * 2;
            run_case(&case(
                &format!("kv L=1 B={nb} N={n} H=2 D=64 dtype=bf16 order={order}"),
                8,
                &lens,
            ));
        }
    }
    let mut c = case("kv L=3 B=8 N=16 H=2 D=64 dtype=f16 order=NHD", 4, &[50, 3]);
    c.layer = 2;
    run_case(&c);
    c.query = 1;
    run_case(&c);
    c.query = 2;
    run_case(&c);
}

/// One long sequence: split-context on its own (default partitions), and many forced
/// partitions, some of them empty.
#[test]
fn split_context() {
    for dtype in ["f32", "bf16", "fp8_e4m3"] {
        for order in ["NHD", "HND"] {
            let mut c = case(
                &format!("kv L=1 B=80 N=16 H=2 D=128 dtype={dtype} order={order}"),
                8,
                &[1200],
            );
            c.parts = 7;
            run_case(&c);
            c.lens = vec![5];
            c.parts = 9; // more partitions than tokens
            run_case(&c);
        }
    }
    let be = CpuBackend::new(Some(2));
    let l: KvCacheLayout = "kv L=1 B=80 N=16 H=2 D=64 dtype=f32 order=NHD"
        .parse()
        .unwrap();
    let cache = HostCache::new(l).unwrap();
    let table: Vec<i32> = (0..80).collect();
    let q = vec![0f32; 8 * 64];
    let d = Decode {
        layer: 0,
        query: Activations::F32(&q),
        block_table: &table,
        blocks_per_seq: 80,
        seq_lens: &[1200],
        params: DecodeParams {
            num_q_heads: 8,
            scale: 1.0,
            sliding_window: None,
            soft_cap: None,
        },
    };
    let mut out = vec![1f32; 8 * 64];
    be.paged_decode(&cache.as_ref(), &d, &mut out).unwrap();
    assert!(out.iter().all(|x| *x == 0.0), "zero cache: zero output");
}

#[test]
fn refuses_bad_tables_before_writing() {
    let l: KvCacheLayout = "kv L=1 B=4 N=16 H=2 D=32 dtype=f32 order=NHD"
        .parse()
        .unwrap();
    let cache = HostCache::new(l).unwrap();
    let q = vec![0f32; 2 * 32];
    let table = [0, 9];
    let d = Decode {
        layer: 0,
        query: Activations::F32(&q),
        block_table: &table,
        blocks_per_seq: 2,
        seq_lens: &[20],
        params: DecodeParams {
            num_q_heads: 2,
            scale: 1.0,
            sliding_window: None,
            soft_cap: None,
        },
    };
    let mut out = vec![7f32; 2 * 32];
    let be = CpuBackend::new(Some(2));
    let e = be.paged_decode(&cache.as_ref(), &d, &mut out).unwrap_err();
    assert!(
        matches!(
            e,
            OpError::BlockOutOfRange {
                seq: 0,
                position: 1,
                block: 9,
                limit: 4
            }
        ),
        "{e}"
    );
    assert!(out.iter().all(|x| *x == 7.0), "nothing written on error");
    let long = Decode {
        seq_lens: &[33],
        ..d
    };
    assert!(matches!(
        be.paged_decode(&cache.as_ref(), &long, &mut out),
        Err(OpError::SequenceTooLong { .. })
    ));
    let mut short = vec![7f32; 2 * 32 - 1];
    assert!(matches!(
        be.paged_decode(&cache.as_ref(), &d, &mut short),
        Err(OpError::Shape { .. })
    ));
    assert!(short.iter().all(|x| *x == 7.0), "nothing written on error");
}

/// Tile lengths: into L1, at most 8 rows of a step per L1 set; into L2, rows spanning at
/// most 256 KiB, in multiples of 8 tokens.
#[test]
fn tile_lengths() {
    use PrefetchLevel::{L1, L2};
    // Head-major bf16 rows (512 B), token-major bf16 and f32 pages of 8 heads x [K|V].
    assert_eq!(plan::tile_len(512, L1), 64);
    assert_eq!(plan::tile_len(4096, L1), 8);
    assert_eq!(plan::tile_len(2048, L1), 16);
    assert_eq!(plan::tile_len(512, L2), 64);
    assert_eq!(plan::tile_len(4096, L2), 64);
    assert_eq!(plan::tile_len(8192, L2), 32);
    assert_eq!(plan::tile_len(16384, L2), 16);
    assert_eq!(plan::tile_len(4160 * 2, L2), 24);
    assert_eq!(plan::tile_len(1 << 20, L2), 8);
    assert_eq!(plan::tile_len(16, L2), 64);
}

/// Every kernel build reads no byte past a buffer: each buffer of the cache ends right at an
/// inaccessible page, and the last rows of the last block (K and V in separate buffers,
/// packed [K|V] rows, and the legacy vLLM transposed value) are attended, in widths that
/// leave partial vectors of every build (36, 76) and every dtype; the result still matches
/// the reference.
#[cfg(unix)]
#[test]
fn no_read_past_the_buffers() {
    for dtype in ["f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8"] {
        for (d, place) in [
            (36, "order=HND"),
            (76, "order=NHD"),
            (36, "tensor=separate-hnd"),
            (76, "tensor=separate-nhd"),
            (48, "tensor=vllm-paged-v1"),
        ] {
            let spec = format!("kv L=1 B=3 N=16 H=2 D={d} dtype={dtype} {place}");
            let l: KvCacheLayout = spec.parse().unwrap();
            let mut cache = HostCache::new(l.clone()).unwrap();
            let slots: Vec<i64> = (0..48).collect();
            let k = data(48 * 2 * d, 5);
            let v = data(48 * 2 * d, 6);
            let w = WriteKv {
                layer: 0,
                key: Activations::F32(&k),
                value: Some(Activations::F32(&v)),
                slot_mapping: &slots,
            };
            ScalarReference.write_kv(&mut cache.as_mut(), &w).unwrap();
            let guarded: Vec<Guarded> = (0..l.num_buffers())
                .map(|i| Guarded::new(cache.bytes(i)))
                .collect();
            let bufs: Vec<&[u8]> = guarded.iter().map(Guarded::bytes).collect();
            let edge = CacheRef::new(&l, bufs).unwrap();
            let q = data(8 * d, 7);
            let dec = Decode {
                layer: 0,
                query: Activations::F32(&q),
                block_table: &[0, 1, 2],
                blocks_per_seq: 3,
                seq_lens: &[48],
                params: DecodeParams {
                    num_q_heads: 8,
                    scale: 0.1,
                    sliding_window: None,
                    soft_cap: None,
                },
            };
            let mut want = vec![0f32; 8 * d];
            let mags =
                reference::paged_decode_magnitudes(&cache.as_ref(), &dec, &mut want).unwrap();
            let be = CpuBackend::new(Some(2));
            for isa in arch::available() {
                let mut got = vec![f32::NAN; 8 * d];
                let opts = Options {
                    partitions: Some(2),
                    isa: Some(isa),
                    inline: Some(true),
                };
                decode_with(&be, &edge, &dec, &mut got, opts).unwrap();
                let e = decode_error(&got, &want, &mags, isa.decode_tolerance(l.dtype()));
                assert!(e.passed(), "{spec} {isa:?}: {e:?}");
            }
        }
    }
}
