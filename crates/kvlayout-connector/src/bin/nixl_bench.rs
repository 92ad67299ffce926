//! `cargo run --release -p kvlayout-connector --bin nixl_bench [iterations]`, with NIXL's
//! libraries on the path (`LD_LIBRARY_PATH=$(scripts/nixl-path.sh) UCX_NET_DEVICES=lo`):
//! one planned transfer against one contiguous region of the same bytes, over the same NIXL
//! engine in the same run, between two processes on this host (this binary re-runs itself as
//! the prefill peer). Cases: NHD to NHD, NHD to HND (direct and staged), and TP 1 to TP 2 (rank
//! 0's head slice), 256 scattered blocks of an 8-layer, 8-head, 128-dim bf16 cache.
//!
//! Not a test: figures depend on the machine and on UCX's transport (`cma` by default between
//! processes of one host; `UCX_TLS=tcp` for the network path), which it names.

#![forbid(unsafe_code)]

#[path = "shared/mod.rs"]
mod shared;
use shared::scattered;

use std::error::Error;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kvlayout::ops::CopyRun;
use kvlayout::KvCacheLayout;
use kvlayout_connector::engine::TransferEngine;
use kvlayout_connector::handshake::{CacheGroup, Limits, MemRegion, PeerMetadata};
use kvlayout_connector::nixl::{self, Hello, NixlEngine};
use kvlayout_connector::plan::{plan_pull, SeqBlocks, TransferPlan};
use kvlayout_connector::staged::plan_pull_staged;
use kvlayout_connector::{execute, Plan};

type Res<T> = Result<T, Box<dyn Error>>;

const PREFILL: &str = "kv L=8 B=512 N=16 H=8 D=128 dtype=bf16 order=NHD";
/// `(name, decode layout, decode TP size, staged)`; the decode side is rank 0. A staged case
/// reads into the staging cache of `kvlayout_connector::staged` (the wire only; the
/// post-receive scatter is a local pass).
const CASES: [(&str, &str, u64, bool); 4] = [
    (
        "NHD -> NHD, TP 1 -> 1",
        "kv L=8 B=512 N=16 H=8 D=128 dtype=bf16 order=NHD",
        1,
        false,
    ),
    (
        "NHD -> HND, TP 1 -> 1",
        "kv L=8 B=512 N=16 H=8 D=128 dtype=bf16 order=HND",
        1,
        false,
    ),
    (
        "NHD -> HND, TP 1 -> 1, staged",
        "kv L=8 B=512 N=16 H=8 D=128 dtype=bf16 order=HND",
        1,
        true,
    ),
    (
        "NHD -> NHD, TP 1 -> 2",
        "kv L=8 B=512 N=16 H=4 D=128 dtype=bf16 order=NHD",
        2,
        false,
    ),
];
const BLOCKS: u64 = 256;
const HEADS: u64 = 8;
const TIMEOUT: Duration = Duration::from_secs(30);

fn layout(spec: &str) -> Res<KvCacheLayout> {
    Ok(spec.parse()?)
}

fn group(layout: &KvCacheLayout, tp: u64, regions: Vec<MemRegion>) -> CacheGroup {
    CacheGroup {
        name: "attn".into(),
        layout: layout.clone(),
        total_kv_heads: HEADS,
        tp_size: tp,
        tp_rank: 0,
        regions,
    }
}

fn pattern(layout: &KvCacheLayout) -> Vec<Vec<u8>> {
    layout
        .extents()
        .iter()
        .map(|x| {
            (0..x.end as usize)
                .map(|i| ((i * 31) ^ (i >> 9)) as u8)
                .collect()
        })
        .collect()
}

fn send_frame(s: &mut TcpStream, bytes: &[u8]) -> Res<()> {
    s.write_all(&(bytes.len() as u64).to_le_bytes())?;
    s.write_all(bytes)?;
    Ok(())
}

fn recv_frame(s: &mut TcpStream) -> Res<Vec<u8>> {
    let mut len = [0u8; 8];
    s.read_exact(&mut len)?;
    let len = u64::from_le_bytes(len);
    if len > 1 << 20 {
        return Err(format!("frame of {len} bytes").into());
    }
    let mut v = vec![0u8; len as usize];
    s.read_exact(&mut v)?;
    Ok(v)
}

/// The prefill peer: registers its cache, sends its `Hello`, waits for the parent to close.
fn peer(port: u16) -> Res<()> {
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(300));
        std::process::exit(9);
    });
    let p = layout(PREFILL)?;
    let engine = NixlEngine::new("nixl-bench-prefill", pattern(&p))?;
    let hello = Hello {
        peer: PeerMetadata {
            engine_id: engine.name().into(),
            groups: vec![group(&p, 1, engine.regions())],
        },
        agent_metadata: engine.local_metadata()?,
    };
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(300)))?;
    send_frame(&mut s, &hello.encode())?;
    let _ = recv_frame(&mut s);
    Ok(())
}

/// Kills and reaps the peer on drop.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Best and median of `iters` timed runs of `plan`.
fn time_reads(
    engine: &mut NixlEngine,
    peer: &str,
    plan: &TransferPlan,
    iters: usize,
) -> Res<(Duration, Duration)> {
    let mut times = Vec::with_capacity(iters);
    for _ in 0..=iters {
        let t = Instant::now();
        execute(engine, Plan::Direct(plan), &[peer], b"", TIMEOUT)?;
        times.push(t.elapsed());
    }
    times.remove(0); // the first one includes connecting
    times.sort();
    Ok((times[0], times[times.len() / 2]))
}

/// The bytes of `plan`'s first transfer in contiguous runs: buffer by buffer from offset 0 on
/// both sides.
fn contiguous(plan: &TransferPlan, src: &[MemRegion], dst: &[MemRegion]) -> Res<TransferPlan> {
    let mut left = plan.bytes();
    let mut runs = Vec::new();
    for (i, (s, d)) in src.iter().zip(dst).enumerate() {
        let len = left.min(s.len).min(d.len);
        if len > 0 {
            runs.push(CopyRun {
                src_buffer: i as u32,
                src_offset: 0,
                dst_buffer: i as u32,
                dst_offset: 0,
                len,
            });
        }
        left -= len;
    }
    Ok(shared::with_runs(plan, runs)?)
}

fn run(iters: usize) -> Res<()> {
    let exe = std::env::current_exe()?;
    let cpu = shared::cpu_name();
    let tls = std::env::var("UCX_TLS").unwrap_or_else(|_| "default (cma between processes)".into());
    println!(
        "nixl_bench on {cpu}, {} CPUs; UCX_TLS {tls}; {BLOCKS} scattered blocks of {PREFILL}; \
         best / median of {iters} reads after one warm-up",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let p = layout(PREFILL)?;
    let p_bytes = pattern(&p);
    for (case, &(name, spec, tp, staged)) in CASES.iter().enumerate() {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let _child = Guard(
            Command::new(&exe)
                .args(["--peer", &port.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()?,
        );
        let (mut s, _) = listener.accept()?;
        s.set_read_timeout(Some(TIMEOUT))?;
        let hello = Hello::decode(&recv_frame(&mut s)?, &Limits::default())?;
        let remote = &hello.peer.groups[0];
        let d = layout(spec)?;
        let seqs = [SeqBlocks {
            remote: scattered(BLOCKS, p.geometry().num_blocks, 3),
            local: scattered(BLOCKS, d.geometry().num_blocks, 5),
            tokens: BLOCKS * p.geometry().block_size,
        }];
        // Plan against the decode layout, whose memory the engine gets once the plan says
        // how much; a staged case receives into the staging cache (the wire part alone).
        let (mine, remotes) = (group(&d, tp, Vec::new()), &hello.peer.groups[..1]);
        let t = Instant::now();
        let (plan, target) = if staged {
            let plan = plan_pull_staged(&mine, remotes, &seqs)?;
            let t = plan.transfers.first().ok_or("no transfer")?;
            (t.wire(), t.staging.clone())
        } else {
            (plan_pull(&mine, remotes, &seqs)?, d)
        };
        let planning = t.elapsed();
        let zeros: Vec<Vec<u8>> = target
            .extents()
            .iter()
            .map(|x| vec![0; x.end as usize])
            .collect();
        let mut engine = NixlEngine::new(&format!("nixl-bench-decode-{case}"), zeros)?;
        let bytes = plan.bytes();
        engine.add_peer(
            &hello.peer.engine_id,
            &hello.agent_metadata,
            &remote.regions,
        )?;
        let peer = hello.peer.engine_id.as_str();
        let (pb, pm) = time_reads(&mut engine, peer, &plan, iters)?;
        // Check the planned read's bytes once.
        let got = engine.buffers()?;
        let runs = plan.transfers.iter().flat_map(|t| &t.runs);
        let bad = runs.clone().filter(|r| {
            let (s, t, n) = (r.src_offset as usize, r.dst_offset as usize, r.len as usize);
            p_bytes[r.src_buffer as usize][s..s + n] != got[r.dst_buffer as usize][t..t + n]
        });
        if let Some(r) = bad.clone().next() {
            return Err(format!("{name}: {} runs differ, e.g. {r:?}", bad.count()).into());
        }
        let flat = contiguous(&plan, &remote.regions, &engine.regions())?;
        let (cb, cm) = time_reads(&mut engine, peer, &flat, iters)?;
        let gbs = |t: Duration| bytes as f64 / t.as_secs_f64() / 1e9;
        println!(
            "{name}: {} MiB; planned {} descriptors (planning {planning:.1?}): best {pb:.1?} \
             ({:.2} GB/s), median {pm:.1?} ({:.2} GB/s); contiguous {} descriptor(s): best \
             {cb:.1?} ({:.2} GB/s), median {cm:.1?} ({:.2} GB/s); planned/contiguous median {:.2}x",
            bytes >> 20,
            plan.descriptors(),
            gbs(pb),
            gbs(pm),
            flat.descriptors(),
            gbs(cb),
            gbs(cm),
            pm.as_secs_f64() / cm.as_secs_f64()
        );
        drop(s);
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Err(why) = nixl::available() {
        eprintln!("nixl_bench: nixl: {why}");
        std::process::exit(2);
    }
    let result = match args.get(1).map(String::as_str) {
        Some("--peer") => args
            .get(2)
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| "--peer PORT".into())
            .and_then(peer),
        other => run(other.and_then(|n| n.parse().ok()).unwrap_or(5)),
    };
    if let Err(e) = result {
        eprintln!("nixl_bench: {e}");
        std::process::exit(1);
    }
}
