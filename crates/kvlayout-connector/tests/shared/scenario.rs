//! The transfer scenario the end-to-end tests share (`tests/end_to_end.rs` with the memcpy
//! engine, `tests/nixl.rs` over NIXL): a prefill cache at TP 1 (NHD, blocks of 16) holding two
//! sequences in layers 0 and 1, a decode layout for TP 2 (HND, padded pages, blocks of 32),
//! their block tables, the scalar reference's decode of layer 1, and a decode rank's pull
//! (direct or staged, run by `execute`) and decode.

#![allow(dead_code)] // Each test binary uses a part.

use std::time::Duration;

use kvlayout::ops::{Backend, BufferShape, DecodeArgs, DecodeParams, HostTensor, WriteArgs};
use kvlayout::{DType, KvCacheLayout};
use kvlayout_connector::engine::TransferEngine;
use kvlayout_connector::handshake::{check_compatible, CacheGroup, MemRegion};
use kvlayout_connector::plan::{plan_pull, SeqBlocks};
use kvlayout_connector::staged::{plan_pull_staged, Scatter};
use kvlayout_connector::{execute, ExecuteError, Plan};
use kvlayout_cpu::Host;

pub(crate) const HEADS: u64 = 4;
pub(crate) const D: usize = 16;
pub(crate) const Q_PER_KV: usize = 2;
pub(crate) const LENS: [u32; 2] = [40, 23];

pub(crate) fn p_layout() -> KvCacheLayout {
    "kv L=2 B=10 N=16 H=4 D=16 dtype=bf16 order=NHD"
        .parse()
        .unwrap()
}

pub(crate) fn d_layout() -> KvCacheLayout {
    "kv L=2 B=8 N=32 H=2 D=16 dtype=bf16 order=HND page=8192"
        .parse()
        .unwrap()
}

pub(crate) fn p_tables() -> Vec<Vec<u64>> {
    vec![vec![3, 7, 1], vec![0, 9]]
}

pub(crate) fn d_tables() -> Vec<Vec<u64>> {
    vec![vec![5, 2], vec![6]]
}

pub(crate) fn seqs() -> Vec<SeqBlocks> {
    let (p, d) = (p_tables(), d_tables());
    (0..2)
        .map(|s| SeqBlocks {
            remote: p[s].clone(),
            local: d[s].clone(),
            tokens: u64::from(LENS[s]),
        })
        .collect()
}

pub(crate) fn zeros(layout: &KvCacheLayout) -> Vec<Vec<u8>> {
    layout
        .extents()
        .iter()
        .map(|x| vec![0; x.end as usize])
        .collect()
}

/// Distinct nonzero bytes in every buffer.
pub(crate) fn pattern(layout: &KvCacheLayout, seed: u8) -> Vec<Vec<u8>> {
    layout
        .extents()
        .iter()
        .enumerate()
        .map(|(b, x)| {
            (0..x.end as usize)
                .map(|i| ((i.wrapping_mul(31) ^ (i >> 9) ^ (b * 77)) as u8).wrapping_add(seed) | 1)
                .collect()
        })
        .collect()
}

pub(crate) fn group(
    layout: &KvCacheLayout,
    tp_size: u64,
    tp_rank: u64,
    regions: Vec<MemRegion>,
) -> CacheGroup {
    CacheGroup {
        name: "attn".into(),
        layout: layout.clone(),
        total_kv_heads: layout.geometry().num_kv_heads * tp_size,
        tp_size,
        tp_rank,
        regions,
    }
}

pub(crate) fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 250.0 - 2.0)
        .collect()
}

/// The prefill instance: writes both sequences into layers 0 and 1; its cache bytes and the
/// reference decode of layer 1 for all query heads.
pub(crate) fn prefill(layout: &KvCacheLayout, tables: &[Vec<u64>]) -> (Vec<Vec<u8>>, Vec<f32>) {
    let be = Host::reference();
    let mut cache = be.alloc_cache(layout, &BufferShape::exact(layout)).unwrap();
    be.upload_cache(&mut cache, &zeros(layout)).unwrap();
    let n = layout.geometry().block_size;
    for layer in 0..2u32 {
        for (s, table) in tables.iter().enumerate() {
            let tokens = LENS[s] as usize;
            let slots: Vec<i64> = (0..tokens as u64)
                .map(|t| (table[(t / n) as usize] * n + t % n) as i64)
                .collect();
            let len = tokens * HEADS as usize * D;
            let tensor = |seed| {
                be.upload_tensor(&HostTensor::from_f32(DType::Bf16, &values(len, seed)).unwrap())
                    .unwrap()
            };
            let (k, v) = (
                tensor(7 + s as u32 + layer * 100),
                tensor(9 + s as u32 + layer * 100),
            );
            let w = WriteArgs {
                layer: u64::from(layer),
                key: &k,
                value: Some(&v),
                slot_mapping: &slots,
            };
            be.wait(be.write_kv(&mut cache, &w).unwrap()).unwrap();
        }
    }
    let out = decode(&be, &cache, tables, 0..HEADS as usize * Q_PER_KV);
    (be.download_cache(&cache).unwrap(), out)
}

/// The reference decode of layer 1 for query heads `q` (whose KV heads the cache holds).
pub(crate) fn decode(
    be: &Host<kvlayout_cpu::ScalarReference>,
    cache: &kvlayout_cpu::HostBuffers,
    tables: &[Vec<u64>],
    q: std::ops::Range<usize>,
) -> Vec<f32> {
    let all = values(LENS.len() * HEADS as usize * Q_PER_KV * D, 3);
    let per_seq = HEADS as usize * Q_PER_KV * D;
    let query: Vec<f32> = (0..LENS.len())
        .flat_map(|s| all[s * per_seq + q.start * D..s * per_seq + q.end * D].to_vec())
        .collect();
    let query = be
        .upload_tensor(&HostTensor::from_f32(DType::Bf16, &query).unwrap())
        .unwrap();
    let width = tables.iter().map(Vec::len).max().unwrap();
    let table: Vec<i32> = tables
        .iter()
        .flat_map(|t| (0..width).map(|i| t.get(i).map_or(0, |&b| b as i32)))
        .collect();
    let mut out = be
        .alloc_tensor(DType::F32, LENS.len() * q.len() * D)
        .unwrap();
    let d = DecodeArgs {
        layer: 1,
        query: &query,
        block_table: &table,
        blocks_per_seq: width,
        seq_lens: &LENS,
        params: DecodeParams {
            num_q_heads: q.len() as u64,
            scale: 0.25,
            sliding_window: None,
            soft_cap: None,
        },
    };
    be.wait(be.paged_decode(cache, &d, &mut out).unwrap())
        .unwrap();
    be.download_tensor(&out).unwrap().to_f32()
}

/// Bound on a decode rank's pull.
pub(crate) const PULL_TIMEOUT: Duration = Duration::from_secs(10);

/// Decode rank `rank` of 2 pulls `seqs()` from the prefill group `remote` (engine id `peer`),
/// notifying it with `notify`, and decodes its query heads of layer 1 on the reference
/// backend. `engine` makes the rank's engine from its local buffers and adds the peer. Direct:
/// the engine holds the local cache. Staged: the engine holds the staging cache, and
/// `scatter_blocks` fills the local cache on the backend.
pub(crate) fn pull_and_decode<E: TransferEngine>(
    engine: impl FnOnce(Vec<Vec<u8>>) -> E,
    (remote, peer): (&CacheGroup, &str),
    rank: u64,
    staged: bool,
    notify: &[u8],
) -> Result<Vec<f32>, ExecuteError> {
    let d = d_layout();
    let be = Host::reference();
    let mut cache = be.alloc_cache(&d, &BufferShape::exact(&d)).unwrap();
    be.upload_cache(&mut cache, &zeros(&d)).unwrap();
    let remotes = std::slice::from_ref(remote);
    if staged {
        // The local cache's memory is on the backend, not the engine's: not in the group.
        let mine = group(&d, 2, rank, Vec::new());
        check_compatible(&mine, remote).unwrap();
        let plan = plan_pull_staged(&mine, remotes, &seqs()).unwrap();
        let staging = plan.staging_extents().into_iter();
        let mut engine = engine(staging.map(|n| vec![0; n as usize]).collect());
        let mut scatter = Scatter::new(&be, &mut cache);
        let plan = Plan::Staged(&plan, &mut scatter);
        execute(&mut engine, plan, &[peer], notify, PULL_TIMEOUT)?;
    } else {
        let mut engine = engine(zeros(&d));
        let mine = group(&d, 2, rank, engine.regions());
        check_compatible(&mine, remote).unwrap();
        let plan = plan_pull(&mine, remotes, &seqs()).unwrap();
        execute(
            &mut engine,
            Plan::Direct(&plan),
            &[peer],
            notify,
            PULL_TIMEOUT,
        )?;
        be.upload_cache(&mut cache, &engine.buffers().unwrap())
            .unwrap();
    }
    Ok(decode(&be, &cache, &d_tables(), rank_heads(rank)))
}

/// The query heads of decode rank `rank` of 2.
pub(crate) fn rank_heads(rank: u64) -> std::ops::Range<usize> {
    let per = HEADS as usize * Q_PER_KV / 2;
    rank as usize * per..(rank as usize + 1) * per
}

/// Asserts `out`, decode rank `rank`'s output, equals its heads of the prefill side's
/// reference `p_out`, bit for bit.
pub(crate) fn assert_rank_matches(p_out: &[f32], out: &[f32], rank: u64, what: &str) {
    let q = rank_heads(rank);
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for s in 0..LENS.len() {
        let per = HEADS as usize * Q_PER_KV * D;
        let want = &p_out[s * per + q.start * D..s * per + q.end * D];
        let got = &out[s * q.len() * D..(s + 1) * q.len() * D];
        assert_eq!(bits(got), bits(want), "{what}: rank {rank} sequence {s}");
    }
}
