//! Prefill at TP 1 in one layout, decode at TP 2 in another layout and block size, in one
//! process with the memcpy engine: the prefill side writes KV for two sequences and publishes
//! its handshake; each decode rank decodes it, checks compatibility, plans its pull, reads
//! over the engine and runs `paged_decode` on its heads. Every output equals, bit for bit, the
//! scalar reference's output computed on the prefill side (the reference accumulates in f64
//! in token order, whatever the layout).

use std::time::Duration;

use kvlayout::ops::{Backend, BufferShape, DecodeArgs, DecodeParams, HostTensor, WriteArgs};
use kvlayout::{DType, KvCacheLayout};
use kvlayout_connector::engine::{wait, MemcpyEngine, TransferEngine};
use kvlayout_connector::handshake::{check_compatible, CacheGroup, Limits, PeerMetadata};
use kvlayout_connector::plan::{plan_pull, SeqBlocks, Side};
use kvlayout_cpu::Host;

const HEADS: u64 = 4;
const D: usize = 16;
const Q_PER_KV: usize = 2;
const LENS: [u32; 2] = [40, 23];

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 250.0 - 2.0)
        .collect()
}

fn params(q_heads: u64) -> DecodeParams {
    DecodeParams {
        num_q_heads: q_heads,
        scale: 0.25,
        sliding_window: None,
        soft_cap: None,
    }
}

/// The prefill instance: writes both sequences into layers 0 and 1, returns its cache bytes
/// and the reference decode of layer 1 for all query heads.
fn prefill(layout: &KvCacheLayout, tables: &[Vec<u64>]) -> (Vec<Vec<u8>>, Vec<f32>) {
    let be = Host::reference();
    let mut cache = be.alloc_cache(layout, &BufferShape::exact(layout)).unwrap();
    let zeros: Vec<Vec<u8>> = layout
        .extents()
        .iter()
        .map(|x| vec![0; x.end as usize])
        .collect();
    be.upload_cache(&mut cache, &zeros).unwrap();
    let n = layout.geometry().block_size;
    for layer in 0..2 {
        for (s, table) in tables.iter().enumerate() {
            let tokens = LENS[s] as usize;
            let slots: Vec<i64> = (0..tokens as u64)
                .map(|t| (table[(t / n) as usize] * n + t % n) as i64)
                .collect();
            let len = tokens * HEADS as usize * D;
            let k = be
                .upload_tensor(
                    &HostTensor::from_f32(DType::Bf16, &values(len, 7 + s as u32 + layer * 100))
                        .unwrap(),
                )
                .unwrap();
            let v = be
                .upload_tensor(
                    &HostTensor::from_f32(DType::Bf16, &values(len, 9 + s as u32 + layer * 100))
                        .unwrap(),
                )
                .unwrap();
            let w = WriteArgs {
                layer: layer as u64,
                key: &k,
                value: Some(&v),
                slot_mapping: &slots,
            };
            be.wait(be.write_kv(&mut cache, &w).unwrap()).unwrap();
        }
    }
    let q_heads = HEADS as usize * Q_PER_KV;
    let out = decode(&be, &cache, layout, tables, 0..q_heads);
    (be.download_cache(&cache).unwrap(), out)
}

/// The reference decode of layer 1 for query heads `q` (whose KV heads the cache holds).
fn decode(
    be: &Host<kvlayout_cpu::ScalarReference>,
    cache: &kvlayout_cpu::HostBuffers,
    layout: &KvCacheLayout,
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
    let _ = layout;
    let d = DecodeArgs {
        layer: 1,
        query: &query,
        block_table: &table,
        blocks_per_seq: width,
        seq_lens: &LENS,
        params: params(q.len() as u64),
    };
    be.wait(be.paged_decode(cache, &d, &mut out).unwrap())
        .unwrap();
    be.download_tensor(&out).unwrap().to_f32()
}

#[test]
fn prefill_tp1_to_decode_tp2_in_another_layout_and_block_size() {
    let p_layout: KvCacheLayout = "kv L=2 B=10 N=16 H=4 D=16 dtype=bf16 order=NHD"
        .parse()
        .unwrap();
    let d_layout: KvCacheLayout = "kv L=2 B=8 N=32 H=2 D=16 dtype=bf16 order=HND page=8192"
        .parse()
        .unwrap();
    let p_tables = vec![vec![3, 7, 1], vec![0, 9]];
    let d_tables = vec![vec![5, 2], vec![6]];
    let (p_bytes, p_out) = prefill(&p_layout, &p_tables);

    let p_engine = MemcpyEngine::new("e2e-prefill", p_bytes).unwrap();
    let published = PeerMetadata {
        engine_id: "e2e-prefill".into(),
        groups: vec![CacheGroup {
            name: "attn".into(),
            layout: p_layout.clone(),
            total_kv_heads: HEADS,
            tp_size: 1,
            tp_rank: 0,
            regions: p_engine.regions(),
        }],
    }
    .encode();

    let seqs: Vec<SeqBlocks> = (0..2)
        .map(|s| SeqBlocks {
            remote: p_tables[s].clone(),
            local: d_tables[s].clone(),
            tokens: u64::from(LENS[s]),
        })
        .collect();
    let q_per_rank = HEADS as usize * Q_PER_KV / 2;
    for rank in 0..2u64 {
        let peer = PeerMetadata::decode(&published, &Limits::default()).unwrap();
        let remote = &peer.groups[0];
        let name = format!("e2e-decode-{rank}");
        let zeros: Vec<Vec<u8>> = d_layout
            .extents()
            .iter()
            .map(|x| vec![0; x.end as usize])
            .collect();
        let mut engine = MemcpyEngine::new(&name, zeros).unwrap();
        let mine = CacheGroup {
            name: "attn".into(),
            layout: d_layout.clone(),
            total_kv_heads: HEADS,
            tp_size: 2,
            tp_rank: rank,
            regions: engine.regions(),
        };
        check_compatible(&mine, remote).unwrap();
        let plan = plan_pull(&Side::from(&mine), &[Side::from(remote)], &seqs).unwrap();
        engine
            .add_peer(&peer.engine_id, peer.engine_id.as_bytes(), &remote.regions)
            .unwrap();
        for t in &plan.transfers {
            let mut pending = engine.post_read(&peer.engine_id, &t.runs, b"done").unwrap();
            wait(&mut engine, &mut pending, Duration::from_secs(5)).unwrap();
        }
        // Decode this rank's query heads on the received cache.
        let be = Host::reference();
        let mut cache = be
            .alloc_cache(&d_layout, &BufferShape::exact(&d_layout))
            .unwrap();
        be.upload_cache(&mut cache, &engine.buffers()).unwrap();
        let q = rank as usize * q_per_rank..(rank as usize + 1) * q_per_rank;
        let out = decode(&be, &cache, &d_layout, &d_tables, q.clone());
        for s in 0..LENS.len() {
            let per = HEADS as usize * Q_PER_KV * D;
            let want = &p_out[s * per + q.start * D..s * per + q.end * D];
            let got = &out[s * q_per_rank * D..(s + 1) * q_per_rank * D];
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(got), bits(want), "rank {rank} sequence {s}");
        }
    }
    // The prefill side was told of both reads.
    let mut p_engine = p_engine;
    let notes = p_engine.notifications().unwrap();
    assert_eq!(notes.len(), 2);
    assert!(notes.iter().all(|(_, m)| m == b"done"));
}
