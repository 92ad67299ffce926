//! `cargo run --release -p kvlayout-connector --bin nixl_bench [iterations]`, with NIXL's
//! libraries on the path (`LD_LIBRARY_PATH=$(scripts/nixl-path.sh) UCX_NET_DEVICES=lo`):
//! each planned transfer against one contiguous region of the same bytes, over the same NIXL
//! engine in the same run, between two processes on this host (this binary re-runs itself as
//! the prefill peer). 256 scattered blocks of an 8-layer, 8-head, 128-dim bf16 cache; cases
//! NHD to NHD, HND TP 1 to 2, NHD TP 1 to 2 (rank 0's heads), NHD to HND direct and staged,
//! and NHD to HND as the cost model chooses. Each case prepares its peer's descriptor lists
//! ([`NixlEngine::prepare_groups`]) and says which path its reads took; a prepared case is
//! also timed from fresh lists. Before the cases, [`calibrate_nixl`] measures the engine's
//! constants; the post-receive scatter is timed as the memcpy engine moving the staging
//! cache into the local blocks in this process (this binary has no CPU backend: it is a
//! dev-dependency). `NIXL_BENCH_PROGRESS_DELAY_US` sets both agents' progress-thread pause
//! (NIXL's default, 0, yields in a loop and keeps a core busy per agent).
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
use kvlayout_connector::engine::{wait, MemcpyEngine, TransferEngine};
use kvlayout_connector::handshake::{CacheGroup, Limits, MemRegion, PeerMetadata};
use kvlayout_connector::nixl::{
    self, calibrate_nixl, choose_by_nixl_cost, Hello, NixlEngine, NixlOptions, NixlPath,
    PrepareSide,
};
use kvlayout_connector::plan::{plan_pull, SeqBlocks, TransferPlan};
use kvlayout_connector::pull::PullPlan;
use kvlayout_connector::staged::plan_pull_staged;
use kvlayout_connector::{execute, Plan};

type Res<T> = Result<T, Box<dyn Error>>;

const NHD: &str = "kv L=8 B=512 N=16 H=8 D=128 dtype=bf16 order=NHD";
const HND: &str = "kv L=8 B=512 N=16 H=8 D=128 dtype=bf16 order=HND";
const NHD_HALF: &str = "kv L=8 B=512 N=16 H=4 D=128 dtype=bf16 order=NHD";
const HND_HALF: &str = "kv L=8 B=512 N=16 H=4 D=128 dtype=bf16 order=HND";
/// `(name, prefill layout, decode layout, decode TP size, staged)`; the decode side is rank
/// 0. A staged case reads into the staging cache of `kvlayout_connector::staged`, then its
/// scatter is timed on its own.
const CASES: [(&str, &str, &str, u64, bool); 5] = [
    ("NHD -> NHD, TP 1 -> 1", NHD, NHD, 1, false),
    ("HND -> HND, TP 1 -> 2", HND, HND_HALF, 2, false),
    ("NHD -> NHD, TP 1 -> 2", NHD, NHD_HALF, 2, false),
    ("NHD -> HND, direct", NHD, HND, 1, false),
    ("NHD -> HND, staged", NHD, HND, 1, true),
];
const BLOCKS: u64 = 256;
const HEADS: u64 = 8;
const TIMEOUT: Duration = Duration::from_secs(30);

/// The agents' options: NIXL's defaults, or a progress thread pausing
/// `NIXL_BENCH_PROGRESS_DELAY_US` microseconds between rounds (the child inherits it).
fn options() -> NixlOptions {
    let delay = std::env::var("NIXL_BENCH_PROGRESS_DELAY_US").ok();
    NixlOptions {
        progress_delay_us: delay.and_then(|d| d.parse().ok()).unwrap_or(0),
        ..NixlOptions::default()
    }
}

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

fn zeros(layout: &KvCacheLayout) -> Vec<Vec<u8>> {
    layout
        .extents()
        .iter()
        .map(|x| vec![0; x.end as usize])
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

/// The prefill peer: registers a cache of layout `spec`, sends its `Hello`, waits for the
/// parent to close.
fn peer(port: u16, spec: &str) -> Res<()> {
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(300));
        std::process::exit(9);
    });
    let p = layout(spec)?;
    let engine = NixlEngine::with_options("nixl-bench-prefill", pattern(&p), &options())?;
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

/// Median of `iters` timed runs of `f` after one warm-up.
fn median(iters: usize, mut f: impl FnMut() -> Res<()>) -> Res<Duration> {
    Ok(medians(iters, 1, |_| f())?[0])
}

/// Medians of `iters` timed rounds of `f(0)`, .. `f(kinds - 1)`, interleaved (so that drift
/// of a shared machine hits each alike), after one warm-up of each.
fn medians(iters: usize, kinds: usize, mut f: impl FnMut(usize) -> Res<()>) -> Res<Vec<Duration>> {
    let mut times = vec![Vec::with_capacity(iters); kinds];
    for k in 0..kinds {
        f(k)?;
    }
    for _ in 0..iters {
        for (k, t) in times.iter_mut().enumerate() {
            let start = Instant::now();
            f(k)?;
            t.push(start.elapsed());
        }
    }
    Ok(times
        .into_iter()
        .map(|mut t| {
            t.sort();
            t[t.len() / 2]
        })
        .collect())
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

/// The post-receive scatter of a staged case, timed as the memcpy engine moving the staging
/// cache (`staging`, holding `bytes`) into `local`'s blocks `local_blocks` in this process.
fn time_scatter(
    staging: &KvCacheLayout,
    bytes: Vec<Vec<u8>>,
    local: &KvCacheLayout,
    local_blocks: &[u64],
    iters: usize,
) -> Res<Duration> {
    let src = MemcpyEngine::new("nixl-bench-staging", bytes)?;
    let mut dst = MemcpyEngine::new("nixl-bench-scatter", zeros(local))?;
    dst.add_peer(src.name(), src.name().as_bytes(), &src.regions())?;
    let n = local_blocks.len() as u64;
    let seqs = [SeqBlocks {
        remote: (0..n).collect(),
        local: local_blocks.to_vec(),
        tokens: n * local.geometry().block_size,
    }];
    let remote = group(staging, 1, src.regions());
    let plan = plan_pull(&group(local, 1, Vec::new()), &[remote], &seqs)?;
    median(iters, || {
        execute(&mut dst, Plan::Direct(&plan), &[src.name()], b"", TIMEOUT)?;
        Ok(())
    })
}

/// What one case measured.
struct Measured {
    path: NixlPath,
    planned: Duration,
    one_region: Duration,
    scatter: Option<Duration>,
    bytes: u64,
}

fn run_case(
    exe: &std::path::Path,
    case: usize,
    (name, p_spec, d_spec, tp, staged): (&str, &str, &str, u64, bool),
    iters: usize,
) -> Res<Measured> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let _child = Guard(
        Command::new(exe)
            .args(["--peer", &port.to_string(), p_spec])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()?,
    );
    let (mut s, _) = listener.accept()?;
    s.set_read_timeout(Some(TIMEOUT))?;
    let hello = Hello::decode(&recv_frame(&mut s)?, &Limits::default())?;
    let remote = &hello.peer.groups[0];
    let (p, d) = (layout(p_spec)?, layout(d_spec)?);
    let p_bytes = pattern(&p);
    let seqs = [SeqBlocks {
        remote: scattered(BLOCKS, p.geometry().num_blocks, 3),
        local: scattered(BLOCKS, d.geometry().num_blocks, 5),
        tokens: BLOCKS * p.geometry().block_size,
    }];
    let (mine, remotes) = (group(&d, tp, Vec::new()), &hello.peer.groups[..1]);
    let t = Instant::now();
    let (plan, target, stage) = if staged {
        let plan = plan_pull_staged(&mine, remotes, &seqs)?;
        let t = plan.transfers.first().ok_or("no transfer")?.clone();
        (t.wire(), t.staging.clone(), Some(t))
    } else {
        (plan_pull(&mine, remotes, &seqs)?, d.clone(), None)
    };
    let planning = t.elapsed();
    let agent = format!("nixl-bench-decode-{case}");
    let mut engine = NixlEngine::with_options(&agent, zeros(&target), &options())?;
    let peer = hello.peer.engine_id.as_str();
    engine.add_peer(peer, &hello.agent_metadata, &remote.regions)?;
    let t = Instant::now();
    let prepared = match &stage {
        Some(st) => engine.prepare_peer(
            peer,
            &PrepareSide {
                layout: &st.staging,
                first_buffer: 0,
                heads: 0..st.staging.geometry().num_kv_heads,
            },
            &PrepareSide {
                layout: &p,
                first_buffer: 0,
                heads: st.remote_heads.clone(),
            },
        ),
        None => engine.prepare_groups(peer, &mine, remote, 0),
    };
    let preparing = t.elapsed();
    let prepared = match prepared {
        Ok(n) => format!("{n} entries prepared in {preparing:.1?}"),
        Err(e) => format!("not prepared ({e})"),
    };
    let runs: Vec<CopyRun> = plan.transfers.iter().flat_map(|t| t.runs.clone()).collect();
    let path = engine.path_for(peer, &runs);
    // One read (connecting), its bytes checked.
    execute(&mut engine, Plan::Direct(&plan), &[peer], b"", TIMEOUT)?;
    let got = engine.buffers()?;
    let bad = runs.iter().filter(|r| {
        let (s, t, n) = (r.src_offset as usize, r.dst_offset as usize, r.len as usize);
        p_bytes[r.src_buffer as usize][s..s + n] != got[r.dst_buffer as usize][t..t + n]
    });
    if let Some(r) = bad.clone().next() {
        return Err(format!("{name}: {} runs differ, e.g. {r:?}", bad.count()).into());
    }
    let scatter = match &stage {
        Some(st) => Some(time_scatter(&st.staging, got, &d, &st.local_blocks, iters)?),
        None => None,
    };
    let flat = contiguous(&plan, &remote.regions, &engine.regions())?;
    // One region, the plan (prepared where it serves), and the plan from fresh lists where
    // that is another path.
    let kinds = if matches!(path, NixlPath::Prepared { .. }) {
        3
    } else {
        2
    };
    let times = medians(iters, kinds, |k| {
        match k {
            0 => execute(&mut engine, Plan::Direct(&flat), &[peer], b"", TIMEOUT).map(drop)?,
            1 => execute(&mut engine, Plan::Direct(&plan), &[peer], b"", TIMEOUT).map(drop)?,
            _ => {
                let mut p = engine.post_read_listed(peer, &runs, b"")?;
                wait(&mut engine, &mut p, TIMEOUT)?;
            }
        }
        Ok(())
    })?;
    let (one_region, planned, listed) = (times[0], times[1], times.get(2).copied());
    let bytes = plan.bytes();
    let gbs = |t: Duration| bytes as f64 / t.as_secs_f64() / 1e9;
    let of = |t: Duration| one_region.as_secs_f64() / t.as_secs_f64();
    println!(
        "{name}: {} MiB, {} descriptors planned (planning {planning:.1?}); {prepared}",
        bytes >> 20,
        plan.descriptors()
    );
    println!("  path: {}", path.describe());
    println!(
        "  one region: {one_region:.1?} ({:.2} GB/s)",
        gbs(one_region)
    );
    println!(
        "  planned:    {planned:.1?} ({:.2} GB/s), {:.2} of one region",
        gbs(planned),
        of(planned)
    );
    if let Some(l) = listed {
        println!(
            "  same runs from fresh lists: {l:.1?} ({:.2} GB/s), {:.2} of one region",
            gbs(l),
            of(l)
        );
    }
    if let Some(sc) = scatter {
        let total = planned + sc;
        println!(
            "  scatter (memcpy engine, this process): {sc:.1?} ({:.2} GB/s); wire + scatter \
             {total:.1?}, {:.2} of one region",
            gbs(sc),
            of(total)
        );
    }
    drop(s);
    Ok(Measured {
        path,
        planned,
        one_region,
        scatter,
        bytes,
    })
}

fn run(iters: usize) -> Res<()> {
    let exe = std::env::current_exe()?;
    let cpu = shared::cpu_name();
    let tls = std::env::var("UCX_TLS").unwrap_or_else(|_| "default (cma between processes)".into());
    println!(
        "nixl_bench on {cpu}, {} CPUs; UCX_TLS {tls}; {BLOCKS} scattered blocks of {NHD} \
         (or its HND / TP 2 counterpart); medians of {iters} reads after one warm-up",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let calibration = calibrate_nixl()?;
    println!("calibration (two engines in this process): {calibration}");
    let mut measured = Vec::new();
    for (case, &c) in CASES.iter().enumerate() {
        measured.push(run_case(&exe, case, c, iters)?);
    }
    // NHD -> HND by cost: the two plans priced on the paths their cases took, the scatter at
    // the speed the staged case measured.
    let (direct, staged) = (&measured[3], &measured[4]);
    let scatter = staged.scatter.ok_or("the staged case has no scatter")?;
    let scatter_bps = staged.bytes as f64 / scatter.as_secs_f64();
    let (p, d) = (layout(NHD)?, layout(HND)?);
    let seqs = [SeqBlocks {
        remote: scattered(BLOCKS, p.geometry().num_blocks, 3),
        local: scattered(BLOCKS, d.geometry().num_blocks, 5),
        tokens: BLOCKS * p.geometry().block_size,
    }];
    let (mine, remote) = (group(&d, 1, Vec::new()), [group(&p, 1, Vec::new())]);
    let pull = choose_by_nixl_cost(
        plan_pull(&mine, &remote, &seqs),
        plan_pull_staged(&mine, &remote, &seqs),
        &calibration,
        (&direct.path, &staged.path),
        scatter_bps,
        "memcpy engine, measured above",
    )?;
    let (kind, time, one) = match pull.plan {
        PullPlan::Direct(_) => ("direct", direct.planned, direct.one_region),
        PullPlan::Staged(_) => ("staged", staged.planned + scatter, staged.one_region),
    };
    println!(
        "NHD -> HND, cost-chosen: {kind} ({} descriptors): {time:.1?}, {:.2} of one region; why: {}",
        pull.plan.descriptors(),
        one.as_secs_f64() / time.as_secs_f64(),
        pull.why
    );
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Err(why) = nixl::available() {
        eprintln!("nixl_bench: nixl: {why}");
        std::process::exit(2);
    }
    let result = match args.get(1).map(String::as_str) {
        Some("--peer") => match (args.get(2).and_then(|p| p.parse().ok()), args.get(3)) {
            (Some(port), Some(spec)) => peer(port, spec),
            _ => Err("--peer PORT LAYOUT".into()),
        },
        other => run(other.and_then(|n| n.parse().ok()).unwrap_or(5)),
    };
    if let Err(e) = result {
        eprintln!("nixl_bench: {e}");
        std::process::exit(1);
    }
}
