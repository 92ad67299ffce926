//! One decode rank, from the prefill side's handshakes to its decode output: decode and
//! check the handshakes (`PeerMetadata::decode` under `Limits`, `check_compatible`), plan the
//! pull (`plan_pull`, or `plan_pull_staged` through a staging cache), run it (`execute` on a
//! transfer engine), receive it into the cache on the backend (`scatter_blocks` for a staged
//! plan, an upload of the engine's buffers for a direct one), and run `paged_decode` on the
//! rank's query heads in every layer.
//!
//! It owns the timing of each of these steps on one rank; it does not own the engine (the
//! caller makes it: memcpy in process, NIXL across processes) or the verification.

use std::time::{Duration, Instant};

use kvlayout::ops::{
    AnyBackend, AnyCache, Backend, BufferShape, DecodeArgs, DecodeParams, HostTensor,
};
use kvlayout::DType;
use kvlayout_connector::engine::{EngineError, TransferEngine};
use kvlayout_connector::handshake::{check_compatible, CacheGroup, Limits, PeerMetadata};
use kvlayout_connector::plan::plan_pull;
use kvlayout_connector::staged::{
    plan_pull_staged, PostReceive, ReceiveError, Scatter, StagedTransfer,
};
use kvlayout_connector::{execute, Plan};
use serde::{Deserialize, Serialize};

use super::prefill::{failed, row_bytes, touched, zeros};
use super::scenario::Scenario;
use crate::CliError;

/// Bound on one rank's pull.
pub(crate) const PULL_TIMEOUT: Duration = Duration::from_secs(30);

/// What one prefill rank publishes: its handshake and its engine's metadata (what a peer's
/// `add_peer` takes).
#[derive(Debug, Clone)]
pub(crate) struct Published {
    pub handshake: Vec<u8>,
    pub engine: Vec<u8>,
}

/// The group a rank of `side` states: its layout, the side's model heads, its TP place.
pub(crate) fn group(
    side: &super::scenario::Side,
    rank: u64,
    regions: Vec<kvlayout_connector::handshake::MemRegion>,
) -> CacheGroup {
    CacheGroup {
        name: "attn".into(),
        layout: side.layout.clone(),
        total_kv_heads: side.total_kv_heads,
        tp_size: side.tp,
        tp_rank: rank,
        regions,
    }
}

/// What one decode rank did and measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct RankRun {
    pub rank: u64,
    /// Handshake bytes decoded (every prefill rank's) and the seconds decoding took.
    pub handshake_bytes: u64,
    pub handshake_s: f64,
    /// Compatibility text bytes compared, and the seconds.
    pub check_bytes: u64,
    pub check_s: f64,
    /// The compatibility hash both sides share.
    pub compat_hash: String,
    /// Descriptors (runs) and bytes the plan moves, and the seconds planning took.
    pub descriptors: u64,
    pub wire_bytes: u64,
    pub plan_s: f64,
    /// Remote ranks read.
    pub legs: u64,
    /// Seconds of `execute`, without the post-receive operation.
    pub transfer_s: f64,
    /// Bytes landed in the cache on the backend after the wire (the staging caches scattered,
    /// or the engine's buffers uploaded), and the seconds.
    pub receive_bytes: u64,
    pub receive_s: f64,
    /// K/V bytes `paged_decode` read (the prompts' tokens of this rank's heads, every layer),
    /// and the seconds of the calls and waits.
    pub decode_bytes: u64,
    pub decode_s: f64,
    /// The rank's cache after the pull, as host bytes (sent apart from the JSON).
    #[serde(skip)]
    pub cache: Vec<Vec<u8>>,
    /// The backend's decode output per layer: `[prompt, q_head, value_width]` (sent apart).
    #[serde(skip)]
    pub outputs: Vec<Vec<f32>>,
}

/// `scatter_blocks` on the backend, timed.
struct TimedScatter<'a> {
    inner: Scatter<'a, AnyBackend>,
    seconds: f64,
    bytes: u64,
}

impl PostReceive for TimedScatter<'_> {
    fn receive(&mut self, t: &StagedTransfer, staging: &[Vec<u8>]) -> Result<(), ReceiveError> {
        let start = Instant::now();
        self.inner.receive(t, staging)?;
        self.seconds += start.elapsed().as_secs_f64();
        self.bytes += staging.iter().map(|b| b.len() as u64).sum::<u64>();
        Ok(())
    }
}

/// A refusal of the scenario (exit 2): the handshake, the check or the plan.
fn refused(what: &str, rank: u64, e: impl std::fmt::Display) -> CliError {
    CliError::Usage(format!("decode rank {rank}: {what} refused: {e}"))
}

fn engine_failed(rank: u64, e: EngineError) -> CliError {
    CliError::Failed(format!("decode rank {rank}: transfer engine: {e}"))
}

/// Runs decode rank `rank`: `engine` makes its engine from its local buffers.
pub(crate) fn run<E: TransferEngine>(
    be: &AnyBackend,
    sc: &Scenario,
    rank: u64,
    published: &[Published],
    engine: impl FnOnce(Vec<Vec<u8>>) -> Result<E, EngineError>,
) -> Result<RankRun, CliError> {
    let d = &sc.decode;
    let mut run = RankRun {
        rank,
        ..RankRun::default()
    };
    // Handshake: every prefill rank's metadata, decoded as an untrusted peer's.
    let t = Instant::now();
    let peers = published
        .iter()
        .map(|p| PeerMetadata::decode(&p.handshake, &Limits::default()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| refused("handshake", rank, e))?;
    run.handshake_s = t.elapsed().as_secs_f64();
    run.handshake_bytes = published.iter().map(|p| p.handshake.len() as u64).sum();
    let remotes: Vec<CacheGroup> = peers.iter().map(|p| p.groups[0].clone()).collect();
    let ids: Vec<&str> = peers.iter().map(|p| p.engine_id.as_str()).collect();

    // Compatibility: the fields the two sides must share, against every prefill rank.
    let planning = group(d, rank, Vec::new());
    let t = Instant::now();
    for r in &remotes {
        check_compatible(&planning, r)
            .map_err(|e| refused("compatibility check (--decode against --prefill)", rank, e))?;
    }
    run.check_s = t.elapsed().as_secs_f64();
    run.check_bytes = remotes
        .iter()
        .map(|r| (r.compat_text().len() + planning.compat_text().len()) as u64)
        .sum();
    run.compat_hash = planning.compat_hash();

    let mut cache = be
        .alloc_cache(&d.layout, &BufferShape::exact(&d.layout))
        .map_err(failed)?;
    be.upload_cache(&mut cache, &zeros(&d.layout))
        .map_err(failed)?;
    let seqs = sc.seqs();
    let add_peers = |e: &mut E| -> Result<(), CliError> {
        for (p, r) in published.iter().zip(&remotes) {
            let id = ids[r.tp_rank as usize];
            e.add_peer(id, &p.engine, &r.regions)
                .map_err(|e| engine_failed(rank, e))?;
        }
        Ok(())
    };
    if sc.plan == "staged" {
        let t = Instant::now();
        let plan =
            plan_pull_staged(&planning, &remotes, &seqs).map_err(|e| refused("plan", rank, e))?;
        run.plan_s = t.elapsed().as_secs_f64();
        run.descriptors = plan.descriptors() as u64;
        run.wire_bytes = plan.bytes();
        run.legs = plan.transfers.len() as u64;
        let staging = plan.staging_extents().into_iter();
        let mut engine =
            engine(staging.map(touched).collect()).map_err(|e| engine_failed(rank, e))?;
        add_peers(&mut engine)?;
        let mut scatter = TimedScatter {
            inner: Scatter::new(be, &mut cache),
            seconds: 0.0,
            bytes: 0,
        };
        let t = Instant::now();
        execute(
            &mut engine,
            Plan::Staged(&plan, &mut scatter),
            &ids,
            b"demo",
            PULL_TIMEOUT,
        )
        .map_err(|e| CliError::Failed(format!("decode rank {rank}: {e}")))?;
        run.transfer_s = t.elapsed().as_secs_f64() - scatter.seconds;
        run.receive_s = scatter.seconds;
        run.receive_bytes = scatter.bytes;
    } else {
        let mut engine = engine(zeros(&d.layout)).map_err(|e| engine_failed(rank, e))?;
        add_peers(&mut engine)?;
        let mine = group(d, rank, engine.regions());
        let t = Instant::now();
        let plan = plan_pull(&mine, &remotes, &seqs).map_err(|e| refused("plan", rank, e))?;
        run.plan_s = t.elapsed().as_secs_f64();
        run.descriptors = plan.descriptors() as u64;
        run.wire_bytes = plan.bytes();
        run.legs = plan.transfers.len() as u64;
        let t = Instant::now();
        execute(
            &mut engine,
            Plan::Direct(&plan),
            &ids,
            b"demo",
            PULL_TIMEOUT,
        )
        .map_err(|e| CliError::Failed(format!("decode rank {rank}: {e}")))?;
        run.transfer_s = t.elapsed().as_secs_f64();
        let received = engine.buffers().map_err(|e| engine_failed(rank, e))?;
        let t = Instant::now();
        be.upload_cache(&mut cache, &received).map_err(failed)?;
        run.receive_s = t.elapsed().as_secs_f64();
        run.receive_bytes = received.iter().map(|b| b.len() as u64).sum();
    }
    decode(be, sc, rank, &cache, &mut run)?;
    run.cache = be.download_cache(&cache).map_err(failed)?;
    Ok(run)
}

/// `paged_decode` of the rank's query heads in every layer, on the backend.
fn decode(
    be: &AnyBackend,
    sc: &Scenario,
    rank: u64,
    cache: &AnyCache,
    run: &mut RankRun,
) -> Result<(), CliError> {
    let d = &sc.decode;
    let q = sc.q_range(d.tp, rank);
    let (table, width) = d.decode_table();
    let heads = kvlayout::tp_head_range(sc.kv_heads, d.tp, rank)?;
    let tokens: u64 = sc.prompts.iter().map(|&t| u64::from(t)).sum();
    let params = DecodeParams {
        num_q_heads: q.end - q.start,
        scale: 1.0 / (sc.key_width as f32).sqrt(),
        sliding_window: None,
        soft_cap: None,
    };
    let out_len = sc.prompts.len() * (params.num_q_heads * sc.value_width) as usize;
    for layer in 0..sc.layers {
        let query = be
            .upload_tensor(&HostTensor::F32(sc.query_heads(layer, &q)))
            .map_err(failed)?;
        let mut out = be.alloc_tensor(DType::F32, out_len).map_err(failed)?;
        let args = DecodeArgs {
            layer,
            query: &query,
            block_table: &table,
            blocks_per_seq: width,
            seq_lens: &sc.prompts,
            params,
        };
        let t = Instant::now();
        let done = be.paged_decode(cache, &args, &mut out)?;
        be.wait(done).map_err(failed)?;
        run.decode_s += t.elapsed().as_secs_f64();
        run.decode_bytes += tokens * (heads.end - heads.start) * row_bytes(&d.layout);
        run.outputs
            .push(be.download_tensor(&out).map_err(failed)?.to_f32());
    }
    Ok(())
}
