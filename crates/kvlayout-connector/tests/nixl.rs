//! The NIXL engine against the NIXL library (PyPI wheel nixl-cu12, unpacked by
//! scripts/setup.sh; `LD_LIBRARY_PATH=$(scripts/nixl-path.sh)`, `UCX_NET_DEVICES=lo`).
//!
//! - In one process: READs and WRITEs of a plan's runs (prefill TP 1 NHD 16-token blocks to
//!   decode TP 2 HND 32-token padded blocks) land exactly where the memcpy engine puts them,
//!   with their notifications; runs outside either side's registered memory (a buffer too
//!   small for its layout included) are refused before anything is posted; hostile agent
//!   metadata is refused.
//! - Two processes on loopback: this binary re-runs itself as the prefill peer (the variable
//!   `KVLAYOUT_NIXL_ROLE` makes the same test act as the child); the handshake and the agent
//!   metadata travel over TCP on 127.0.0.1. The decode side pulls, decodes, and matches the
//!   prefill side's reference bit for bit. The peer killed mid-transfer: an error within the
//!   timeout, and the blocks not received are named. A hostile handshake is refused.
//!
//! Without the library each test that needs it reports `skipped: nixl: <why>`, unless
//! `KVLAYOUT_REQUIRE_NIXL=1` (scripts/test.sh), which fails it. Every test is named `nixl_*`:
//! scripts/test.sh skips them in the workspace run and runs this binary on its own, with
//! `--test-threads=1`. Every child process is killed and reaped, every wait bounded.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvlayout::ops::{
    Backend, BufferShape, CopyRun, DecodeArgs, DecodeParams, HostTensor, WriteArgs,
};
use kvlayout::{DType, KvCacheLayout};
use kvlayout_connector::engine::{wait, EngineError, MemcpyEngine, TransferEngine};
use kvlayout_connector::handshake::{
    check_compatible, CacheGroup, HandshakeError, Limits, MemRegion, PeerMetadata,
};
use kvlayout_connector::nixl::{self, blocks_written, Hello, NixlEngine, XferKind};
use kvlayout_connector::plan::{plan_pull, SeqBlocks, Side, TransferPlan};
use kvlayout_cpu::Host;

/// Selects a child role in a re-run of this binary.
const ROLE: &str = "KVLAYOUT_NIXL_ROLE";
/// The parent's TCP port, for a child.
const PORT: &str = "KVLAYOUT_NIXL_PORT";
/// Bound on every wait for a transfer.
const XFER_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on every socket read and on a child's start.
const IO_TIMEOUT: Duration = Duration::from_secs(60);
/// A child exits after this, whatever happens.
const CHILD_LIFETIME: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------
// Reporting
// ---------------------------------------------------------------------------------------

/// Writes `line` straight to stderr, past the harness's capture, in one write.
fn report(line: &str) {
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("{line}\n").as_bytes());
}

/// Whether the NIXL library loaded; if not, reports `skipped: nixl: <why>` (a failure when
/// `KVLAYOUT_REQUIRE_NIXL=1`). `nixl::available` calls `nixl_sys::is_stub` before anything.
fn nixl_ready() -> bool {
    match nixl::available() {
        Ok(()) => true,
        Err(why) => {
            assert!(
                std::env::var("KVLAYOUT_REQUIRE_NIXL").as_deref() != Ok("1"),
                "KVLAYOUT_REQUIRE_NIXL=1, but nixl: {why}"
            );
            report(&format!("skipped: nixl: {why}"));
            false
        }
    }
}

fn role() -> Option<String> {
    std::env::var(ROLE).ok()
}

// ---------------------------------------------------------------------------------------
// Layouts, caches, the reference decode (as in tests/end_to_end.rs)
// ---------------------------------------------------------------------------------------

const HEADS: u64 = 4;
const D: usize = 16;
const Q_PER_KV: usize = 2;
const LENS: [u32; 2] = [40, 23];

fn p_layout() -> KvCacheLayout {
    "kv L=2 B=10 N=16 H=4 D=16 dtype=bf16 order=NHD"
        .parse()
        .unwrap()
}

fn d_layout() -> KvCacheLayout {
    "kv L=2 B=8 N=32 H=2 D=16 dtype=bf16 order=HND page=8192"
        .parse()
        .unwrap()
}

fn p_tables() -> Vec<Vec<u64>> {
    vec![vec![3, 7, 1], vec![0, 9]]
}

fn d_tables() -> Vec<Vec<u64>> {
    vec![vec![5, 2], vec![6]]
}

fn seqs() -> Vec<SeqBlocks> {
    let (p, d) = (p_tables(), d_tables());
    (0..2)
        .map(|s| SeqBlocks {
            remote: p[s].clone(),
            local: d[s].clone(),
            tokens: u64::from(LENS[s]),
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

/// Distinct nonzero bytes in every buffer.
fn pattern(layout: &KvCacheLayout, seed: u8) -> Vec<Vec<u8>> {
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

fn group(
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

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 250.0 - 2.0)
        .collect()
}

/// The prefill instance: writes both sequences into layers 0 and 1; its cache bytes and the
/// reference decode of layer 1 for all query heads.
fn prefill(layout: &KvCacheLayout, tables: &[Vec<u64>]) -> (Vec<Vec<u8>>, Vec<f32>) {
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
fn decode(
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

/// The plan for decode rank `rank` of 2 to pull `seqs` from a TP 1 prefill group.
fn plan_for(local: &CacheGroup, remote: &CacheGroup, seqs: &[SeqBlocks]) -> TransferPlan {
    check_compatible(local, remote).unwrap();
    plan_pull(&Side::from(local), &[Side::from(remote)], seqs).unwrap()
}

/// The memcpy engine's result of reading `runs` from `src` into `dst`: the reference for
/// where NIXL must put the bytes.
fn memcpy_read(tag: &str, src: Vec<Vec<u8>>, dst: Vec<Vec<u8>>, runs: &[CopyRun]) -> Vec<Vec<u8>> {
    let (p, d) = (format!("{tag}-memcpy-src"), format!("{tag}-memcpy-dst"));
    let from = MemcpyEngine::new(&p, src).unwrap();
    let mut to = MemcpyEngine::new(&d, dst).unwrap();
    to.add_peer(&p, p.as_bytes(), &from.regions()).unwrap();
    let mut done = to.post_read(&p, runs, b"").unwrap();
    wait(&mut to, &mut done, XFER_TIMEOUT).unwrap();
    to.buffers()
}

/// Notifications of `engine` until `want` arrived or `timeout` passed.
fn notifications(
    engine: &mut NixlEngine,
    want: usize,
    timeout: Duration,
) -> Vec<(String, Vec<u8>)> {
    let start = Instant::now();
    let mut got = Vec::new();
    while got.len() < want && start.elapsed() < timeout {
        got.extend(engine.notifications().unwrap());
        std::thread::sleep(Duration::from_millis(1));
    }
    got
}

// ---------------------------------------------------------------------------------------
// Processes and sockets
// ---------------------------------------------------------------------------------------

/// A child run of this binary: killed and reaped on drop; its output kept for messages.
struct Peer {
    child: Child,
    output: Arc<Mutex<Vec<u8>>>,
    reader: Option<JoinHandle<()>>,
}

impl Peer {
    /// Runs test `test` of this binary as `role`, told the parent's `port`, with `env`.
    fn spawn(test: &str, role: &str, port: u16, env: &[(&str, &str)]) -> Peer {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", test, "--test-threads=1", "--nocapture"])
            .env(ROLE, role)
            .env(PORT, port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let output = Arc::new(Mutex::new(Vec::new()));
        // Both streams into one buffer (the child's harness prints `test result:` lines,
        // which must not reach this process's output).
        let mut streams: Vec<Box<dyn Read + Send>> = vec![
            Box::new(child.stdout.take().unwrap()),
            Box::new(child.stderr.take().unwrap()),
        ];
        let sink = Arc::clone(&output);
        let reader = std::thread::spawn(move || {
            let handles: Vec<JoinHandle<()>> = streams
                .drain(..)
                .map(|mut s| {
                    let sink = Arc::clone(&sink);
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 4096];
                        while let Ok(n) = s.read(&mut buf) {
                            if n == 0 {
                                break;
                            }
                            sink.lock().unwrap().extend_from_slice(&buf[..n]);
                        }
                    })
                })
                .collect();
            for h in handles {
                let _ = h.join();
            }
        });
        Peer {
            child,
            output,
            reader: Some(reader),
        }
    }

    /// The child's output so far (its last 4000 bytes).
    fn output(&self) -> String {
        let out = self.output.lock().unwrap();
        let from = out.len().saturating_sub(4000);
        String::from_utf8_lossy(&out[from..]).into_owned()
    }

    /// Accepts the child's connection on `listener`, failing early if the child exits.
    fn accept(&mut self, listener: &TcpListener) -> TcpStream {
        listener.set_nonblocking(true).unwrap();
        let start = Instant::now();
        loop {
            match listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false).unwrap();
                    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
                    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
                    return s;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if let Ok(Some(status)) = self.child.try_wait() {
                        panic!(
                            "child exited ({status}) before connecting:\n{}",
                            self.finish()
                        );
                    }
                    assert!(
                        start.elapsed() < IO_TIMEOUT,
                        "child did not connect within {IO_TIMEOUT:?}:\n{}",
                        self.output()
                    );
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("accept: {e}"),
            }
        }
    }

    /// Waits (bounded) for the child to exit: its status, or `None` past the bound (the drop
    /// kills it).
    fn wait(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    /// Kills and reaps the child, joins the output reader; the output.
    fn finish(&mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        self.output()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Listens on an ephemeral port of 127.0.0.1.
fn listen() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

/// The child side: connects to the parent's port.
fn connect_parent() -> TcpStream {
    let port: u16 = std::env::var(PORT).unwrap().parse().unwrap();
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    s
}

/// A child never outlives [`CHILD_LIFETIME`].
fn child_watchdog() {
    std::thread::spawn(|| {
        std::thread::sleep(CHILD_LIFETIME);
        report("nixl test child: watchdog exit");
        std::process::exit(9);
    });
}

fn send_frame(s: &mut TcpStream, bytes: &[u8]) {
    s.write_all(&(bytes.len() as u64).to_le_bytes()).unwrap();
    s.write_all(bytes).unwrap();
    s.flush().unwrap();
}

/// One length-prefixed frame of at most `max` bytes.
fn recv_frame(s: &mut TcpStream, max: u64) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 8];
    s.read_exact(&mut len)?;
    let len = u64::from_le_bytes(len);
    if len > max {
        return Err(std::io::Error::other(format!(
            "frame of {len} bytes over {max}"
        )));
    }
    let mut v = vec![0u8; len as usize];
    s.read_exact(&mut v)?;
    Ok(v)
}

// ---------------------------------------------------------------------------------------
// In one process
// ---------------------------------------------------------------------------------------

/// A prefill engine (TP 1, NHD) holding `pattern` bytes, its handshake group, and the two
/// decode ranks' groups with zeroed engines.
struct Pair {
    prefill: NixlEngine,
    p_group: CacheGroup,
    decode: Vec<(NixlEngine, CacheGroup)>,
}

fn pair(tag: &str) -> Pair {
    let (p, d) = (p_layout(), d_layout());
    let prefill = NixlEngine::new(&format!("{tag}-prefill"), pattern(&p, 5)).unwrap();
    let p_group = group(&p, 1, 0, prefill.regions());
    let decode = (0..2)
        .map(|rank| {
            let e = NixlEngine::new(&format!("{tag}-decode-{rank}"), zeros(&d)).unwrap();
            let g = group(&d, 2, rank, e.regions());
            (e, g)
        })
        .collect();
    Pair {
        prefill,
        p_group,
        decode,
    }
}

#[test]
fn nixl_read_of_a_plan_lands_where_memcpy_puts_it_with_notifications() {
    if !nixl_ready() {
        return;
    }
    let Pair {
        mut prefill,
        p_group,
        decode,
    } = pair("nixl-read");
    let p_md = prefill.local_metadata().unwrap();
    for (rank, (mut engine, mine)) in decode.into_iter().enumerate() {
        let plan = plan_for(&mine, &p_group, &seqs());
        assert_eq!(plan.transfers.len(), 1);
        let runs = &plan.transfers[0].runs;
        assert!(runs.len() > 1, "a plan of several runs");
        let name = prefill.name().to_string();
        engine.add_peer(&name, &p_md, &p_group.regions).unwrap();
        let mut pending = engine
            .post_read(&name, runs, format!("read-{rank}").as_bytes())
            .unwrap();
        assert_eq!(pending.kind(), XferKind::Read);
        assert_eq!(pending.bytes(), plan.bytes());
        let start = Instant::now();
        wait(&mut engine, &mut pending, XFER_TIMEOUT).unwrap();
        let took = start.elapsed();
        let want = memcpy_read(
            &format!("nixl-read-{rank}"),
            prefill.buffers().unwrap(),
            zeros(&d_layout()),
            runs,
        );
        let got = engine.buffers().unwrap();
        assert!(got == want, "rank {rank}: NIXL and memcpy differ");
        assert!(got.iter().flatten().any(|&b| b != 0));
        // The blocks a failure would leave undefined: the sequences' local blocks.
        assert_eq!(blocks_written(&d_layout(), runs).unwrap(), vec![2, 5, 6]);
        let notes = notifications(&mut prefill, 1, XFER_TIMEOUT);
        assert_eq!(
            notes,
            vec![(
                engine.name().to_string(),
                format!("read-{rank}").into_bytes()
            )]
        );
        report(&format!(
            "nixl read rank {rank}: {} runs, {} bytes in {took:?}",
            runs.len(),
            plan.bytes()
        ));
    }
}

#[test]
fn nixl_write_of_a_plan_lands_where_memcpy_puts_it_with_a_notification() {
    if !nixl_ready() {
        return;
    }
    let Pair {
        mut prefill,
        p_group,
        decode,
    } = pair("nixl-write");
    for (rank, (mut engine, mine)) in decode.into_iter().enumerate() {
        // The decode rank's pull plan, pushed by the prefill side: `src_*` are the prefill's
        // (local to the writer), `dst_*` the decode rank's.
        let plan = plan_for(&mine, &p_group, &seqs());
        let runs = &plan.transfers[0].runs;
        let name = engine.name().to_string();
        prefill
            .add_peer(&name, &engine.local_metadata().unwrap(), &mine.regions)
            .unwrap();
        let mut pending = prefill.post_write(&name, runs, b"kv-ready").unwrap();
        assert_eq!(pending.kind(), XferKind::Write);
        wait(&mut prefill, &mut pending, XFER_TIMEOUT).unwrap();
        // The notification says the data is in place.
        let notes = notifications(&mut engine, 1, XFER_TIMEOUT);
        assert_eq!(
            notes,
            vec![(prefill.name().to_string(), b"kv-ready".to_vec())]
        );
        let want = memcpy_read(
            &format!("nixl-write-{rank}"),
            prefill.buffers().unwrap(),
            zeros(&d_layout()),
            runs,
        );
        assert!(engine.buffers().unwrap() == want, "rank {rank}");
        // Nothing to move: the notification alone.
        let mut empty = prefill.post_write(&name, &[], b"nothing").unwrap();
        assert!(prefill.poll(&mut empty).unwrap());
        let notes = notifications(&mut engine, 1, XFER_TIMEOUT);
        assert_eq!(
            notes,
            vec![(prefill.name().to_string(), b"nothing".to_vec())]
        );
    }
}

#[test]
fn nixl_runs_outside_registered_memory_are_refused_before_posting() {
    if !nixl_ready() {
        return;
    }
    let Pair {
        prefill,
        p_group,
        mut decode,
    } = pair("nixl-bounds");
    let (mut engine, mine) = decode.remove(0);
    let peer = prefill.name().to_string();
    let run = CopyRun {
        src_buffer: 0,
        src_offset: 0,
        dst_buffer: 0,
        dst_offset: 0,
        len: 64,
    };
    // Not yet a peer.
    assert_eq!(
        engine.post_read(&peer, &[run], b"").unwrap_err(),
        EngineError::UnknownPeer(peer.clone())
    );
    engine
        .add_peer(&peer, &prefill.local_metadata().unwrap(), &p_group.regions)
        .unwrap();
    let (p_len, d_len) = (p_group.regions[0].len, mine.regions[0].len);
    // Past the source's region, past the destination's, no such buffer on either side, an
    // overflowing end; `src_len`/`dst_len` are the registered lengths of each side.
    let bad = |src_len: u64, dst_len: u64| {
        [
            CopyRun {
                src_offset: src_len - 8,
                ..run
            },
            CopyRun {
                dst_offset: dst_len - 8,
                ..run
            },
            CopyRun {
                src_buffer: 9,
                ..run
            },
            CopyRun {
                dst_buffer: 9,
                ..run
            },
            CopyRun {
                src_offset: u64::MAX - 8,
                ..run
            },
        ]
    };
    // A read's source is the peer; a write's source is local.
    for (r, side) in bad(p_len, d_len)
        .into_iter()
        .zip([&*peer, "local", &*peer, "local", &*peer])
    {
        match engine.post_read(&peer, &[run, r], b"") {
            Err(EngineError::OutOfRegion { side: s, .. }) => assert_eq!(s, side, "{r:?}"),
            other => panic!("read {r:?}: {other:?}"),
        }
    }
    for (r, side) in bad(d_len, p_len)
        .into_iter()
        .zip(["local", &*peer, "local", &*peer, "local"])
    {
        match engine.post_write(&peer, &[run, r], b"") {
            Err(EngineError::OutOfRegion { side: s, .. }) => assert_eq!(s, side, "{r:?}"),
            other => panic!("write {r:?}: {other:?}"),
        }
    }
    assert_eq!(engine.in_flight(), 0);

    // A decode rank that registered buffers too small for its layout: the plan's runs are
    // refused on the local side before posting.
    let d = d_layout();
    let small: Vec<Vec<u8>> = d
        .extents()
        .iter()
        .map(|x| vec![0; x.end as usize / 2])
        .collect();
    let mut short = NixlEngine::new("nixl-bounds-short", small).unwrap();
    let plan = plan_for(&mine, &p_group, &seqs());
    short
        .add_peer(&peer, &prefill.local_metadata().unwrap(), &p_group.regions)
        .unwrap();
    match short.post_read(&peer, &plan.transfers[0].runs, b"") {
        Err(EngineError::OutOfRegion { side, .. }) => assert_eq!(side, "local"),
        other => panic!("{other:?}"),
    }
    // And its handshake, published with those regions, does not decode.
    let published = PeerMetadata {
        engine_id: "nixl-bounds-short".into(),
        groups: vec![group(&d, 2, 0, short.regions())],
    }
    .encode();
    assert!(matches!(
        PeerMetadata::decode(&published, &Limits::default()),
        Err(HandshakeError::RegionTooSmall { .. })
    ));
}

#[test]
fn nixl_hostile_agent_metadata_is_refused() {
    if !nixl_ready() {
        return;
    }
    let mut a = NixlEngine::new("nixl-md-a", vec![vec![1; 4096]]).unwrap();
    let b = NixlEngine::new("nixl-md-b", vec![vec![2; 4096]]).unwrap();
    let md = b.local_metadata().unwrap();
    let regions = b.regions();
    let refused = |a: &mut NixlEngine, name: &str, md: &[u8], what: &str| match a
        .add_peer(name, md, &regions)
    {
        Err(EngineError::Transport(why)) => report(&format!("nixl md {what}: {why}")),
        other => panic!("{what}: {other:?}"),
    };
    refused(&mut a, "nixl-md-b", &[], "empty");
    refused(&mut a, "nixl-md-b", &md[..md.len() / 2], "truncated");
    refused(
        &mut a,
        "nixl-md-b",
        &md[..16.min(md.len())],
        "truncated to 16 bytes",
    );
    refused(&mut a, "nixl-md-b", &[0xA5; 300], "garbage");
    // Metadata of another agent than the name given, and an engine's own.
    refused(&mut a, "nixl-md-c", &md, "another agent's");
    let own = a.local_metadata().unwrap();
    refused(&mut a, "nixl-md-a", &own, "its own");
    // A region that wraps the address space.
    let wrap = [MemRegion {
        base: u64::MAX - 10,
        len: 100,
    }];
    assert!(matches!(
        a.add_peer("nixl-md-b", &md, &wrap),
        Err(EngineError::Transport(_))
    ));
    // The real metadata still loads, and a transfer works after all that.
    a.add_peer("nixl-md-b", &md, &regions).unwrap();
    let run = CopyRun {
        src_buffer: 0,
        src_offset: 100,
        dst_buffer: 0,
        dst_offset: 200,
        len: 1000,
    };
    let mut p = a.post_read("nixl-md-b", &[run], b"").unwrap();
    wait(&mut a, &mut p, XFER_TIMEOUT).unwrap();
    let got = a.buffers().unwrap();
    assert!(got[0][200..1200].iter().all(|&x| x == 2));
    assert!(got[0][..200].iter().chain(&got[0][1200..]).all(|&x| x == 1));
    // A peer claiming more than it registered: a run inside the claim but past the
    // registration passes the handshake's bounds, and NIXL refuses it against what the
    // peer's agent metadata registered. So does a claim at another address.
    let past = CopyRun {
        src_offset: 4096,
        len: 64,
        ..run
    };
    for (what, claim) in [
        ("longer", regions[0].len * 2, regions[0].base),
        ("elsewhere", regions[0].len, regions[0].base + (1 << 30)),
    ]
    .map(|(w, len, base)| (w, [MemRegion { base, len }]))
    {
        a.add_peer("nixl-md-b", &md, &claim).unwrap();
        let r = if what == "longer" { past } else { run };
        match a.post_read("nixl-md-b", &[r], b"") {
            Err(EngineError::Transport(why)) => {
                assert!(why.contains("create_xfer_req"), "{why}");
                report(&format!(
                    "nixl region claimed {what} than registered: {why}"
                ));
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    assert_eq!(a.in_flight(), 0);
}

// ---------------------------------------------------------------------------------------
// Two processes
// ---------------------------------------------------------------------------------------

const E2E: &str = "nixl_two_processes_prefill_tp1_to_decode_tp2_match_the_reference";

/// The prefill process: writes its cache, registers it, sends its `Hello` and reference
/// output, and stays until the parent is done, then reports the notifications it got.
fn e2e_prefill_child() {
    child_watchdog();
    let layout = p_layout();
    let (bytes, out) = prefill(&layout, &p_tables());
    let mut engine = NixlEngine::new("nixl-e2e-prefill", bytes).unwrap();
    let hello = Hello {
        peer: PeerMetadata {
            engine_id: engine.name().into(),
            groups: vec![group(&layout, 1, 0, engine.regions())],
        },
        agent_metadata: engine.local_metadata().unwrap(),
    };
    let mut s = connect_parent();
    send_frame(&mut s, &hello.encode());
    let out: Vec<u8> = out.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
    send_frame(&mut s, &out);
    let bye = recv_frame(&mut s, 16).unwrap();
    assert_eq!(bye, b"bye");
    let notes = notifications(&mut engine, 2, XFER_TIMEOUT);
    let mut names: Vec<String> = notes
        .iter()
        .map(|(from, m)| format!("{from}:{}", String::from_utf8_lossy(m)))
        .collect();
    names.sort();
    send_frame(&mut s, names.join(",").as_bytes());
}

#[test]
fn nixl_two_processes_prefill_tp1_to_decode_tp2_match_the_reference() {
    if role().as_deref() == Some("e2e-prefill") {
        return e2e_prefill_child();
    }
    if !nixl_ready() {
        return;
    }
    let start = Instant::now();
    let (listener, port) = listen();
    let mut child = Peer::spawn(E2E, "e2e-prefill", port, &[]);
    let mut s = child.accept(&listener);
    let hello = recv_frame(&mut s, 1 << 20).unwrap();
    let hello = Hello::decode(&hello, &Limits::default()).unwrap();
    let p_out: Vec<f32> = recv_frame(&mut s, 1 << 20)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_bits(u32::from_le_bytes(b.try_into().unwrap())))
        .collect();
    let remote = &hello.peer.groups[0];
    let peer = hello.peer.engine_id.clone();
    let d = d_layout();
    let q_per_rank = HEADS as usize * Q_PER_KV / 2;
    for rank in 0..2u64 {
        let mut engine = NixlEngine::new(&format!("nixl-e2e-decode-{rank}"), zeros(&d)).unwrap();
        let mine = group(&d, 2, rank, engine.regions());
        let plan = plan_for(&mine, remote, &seqs());
        engine
            .add_peer(&peer, &hello.agent_metadata, &remote.regions)
            .unwrap();
        for t in &plan.transfers {
            let mut pending = engine
                .post_read(&peer, &t.runs, format!("done-{rank}").as_bytes())
                .unwrap();
            wait(&mut engine, &mut pending, XFER_TIMEOUT)
                .unwrap_or_else(|e| panic!("rank {rank}: {e}\n{}", child.output()));
        }
        // No post-receive operation: the plan placed every byte; decode this rank's heads.
        let be = Host::reference();
        let mut cache = be.alloc_cache(&d, &BufferShape::exact(&d)).unwrap();
        be.upload_cache(&mut cache, &engine.buffers().unwrap())
            .unwrap();
        let q = rank as usize * q_per_rank..(rank as usize + 1) * q_per_rank;
        let out = decode(&be, &cache, &d_tables(), q.clone());
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for s in 0..LENS.len() {
            let per = HEADS as usize * Q_PER_KV * D;
            let want = &p_out[s * per + q.start * D..s * per + q.end * D];
            let got = &out[s * q_per_rank * D..(s + 1) * q_per_rank * D];
            assert_eq!(bits(got), bits(want), "rank {rank} sequence {s}");
        }
    }
    send_frame(&mut s, b"bye");
    let notes = recv_frame(&mut s, 4096).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&notes),
        "nixl-e2e-decode-0:done-0,nixl-e2e-decode-1:done-1",
        "{}",
        child.output()
    );
    let status = child.wait(XFER_TIMEOUT);
    assert!(
        status.is_some_and(|s| s.success()),
        "prefill child: {status:?}\n{}",
        child.output()
    );
    report(&format!(
        "nixl two processes: TP1 NHD/16 -> TP2 HND/32 padded, 2 ranks bit-equal, {:?} in all",
        start.elapsed()
    ));
}

const FAULT: &str = "nixl_peer_killed_mid_transfer_is_an_error_within_the_timeout";

/// The fault test's layouts: large enough that a transfer over UCX's tcp transport takes
/// tens of milliseconds. HND on both sides, TP 1 to TP 2: 8 KiB runs.
fn big_layouts() -> (KvCacheLayout, KvCacheLayout) {
    let p = "kv L=2 B=4096 N=16 H=4 D=128 dtype=bf16 order=HND"
        .parse()
        .unwrap();
    let d = "kv L=2 B=4096 N=16 H=2 D=128 dtype=bf16 order=HND"
        .parse()
        .unwrap();
    (p, d)
}

/// Four sequences of 768 blocks each, mapped to local blocks in reverse order; the local
/// blocks `i % 4 == 1` (a quarter) receive nothing.
fn big_seqs() -> Vec<SeqBlocks> {
    let local: Vec<u64> = (0..4096u64).rev().filter(|b| b % 4 != 1).collect();
    (0..4u64)
        .map(|s| SeqBlocks {
            remote: (s * 1024..s * 1024 + 768).collect(),
            local: local[s as usize * 768..(s as usize + 1) * 768].to_vec(),
            tokens: 768 * 16,
        })
        .collect()
}

/// The prefill peer of the fault test: registers its large cache, sends its `Hello`, and
/// waits (bounded) to be killed.
fn fault_prefill_child() {
    child_watchdog();
    let (p, _) = big_layouts();
    let engine = NixlEngine::new("nixl-fault-prefill", pattern(&p, 9)).unwrap();
    let hello = Hello {
        peer: PeerMetadata {
            engine_id: engine.name().into(),
            groups: vec![group(&p, 1, 0, engine.regions())],
        },
        agent_metadata: engine.local_metadata().unwrap(),
    };
    let mut s = connect_parent();
    send_frame(&mut s, &hello.encode());
    // Until the parent closes the socket or kills this process.
    let _ = recv_frame(&mut s, 16);
}

#[test]
fn nixl_peer_killed_mid_transfer_is_an_error_within_the_timeout() {
    if role().as_deref() == Some("fault-prefill") {
        return fault_prefill_child();
    }
    if !nixl_ready() {
        return;
    }
    let (listener, port) = listen();
    // UCX's tcp transport on the peer: posts to it are asynchronous (with cma, the default
    // between processes of one host, a post copies before returning).
    let mut child = Peer::spawn(FAULT, "fault-prefill", port, &[("UCX_TLS", "tcp")]);
    let mut s = child.accept(&listener);
    let hello = Hello::decode(&recv_frame(&mut s, 1 << 20).unwrap(), &Limits::default()).unwrap();
    let remote = &hello.peer.groups[0];
    let peer = hello.peer.engine_id.clone();
    let (_, d) = big_layouts();
    let mut engine = NixlEngine::new("nixl-fault-decode-0", zeros(&d)).unwrap();
    let mine = group(&d, 2, 0, engine.regions());
    let plan = plan_for(&mine, remote, &big_seqs());
    let runs = &plan.transfers[0].runs;
    engine
        .add_peer(&peer, &hello.agent_metadata, &remote.regions)
        .unwrap();
    let mapped: Vec<u64> = {
        let mut v: Vec<u64> = big_seqs().iter().flat_map(|s| s.local.clone()).collect();
        v.sort_unstable();
        v
    };

    // A warm-up transfer completes (the connection is up).
    let mut pending = engine.post_read(&peer, runs, b"warm-up").unwrap();
    let start = Instant::now();
    wait(&mut engine, &mut pending, XFER_TIMEOUT)
        .unwrap_or_else(|e| panic!("warm-up: {e}\n{}", child.output()));
    report(&format!(
        "nixl fault test: {} runs, {} MiB over tcp in {:?}",
        runs.len(),
        plan.bytes() >> 20,
        start.elapsed()
    ));

    // Timeout: a zero timeout on a transfer in flight; the buffers are locked meanwhile;
    // cancelling it leaves every destination undefined.
    let mut pending = engine.post_read(&peer, runs, b"cancelled").unwrap();
    assert_eq!(
        wait(&mut engine, &mut pending, Duration::ZERO),
        Err(EngineError::Timeout(Duration::ZERO))
    );
    assert_eq!(engine.in_flight(), 1);
    assert!(engine.buffers().is_err());
    assert!(engine.set_buffers(&zeros(&d)).is_err());
    let undefined = engine.cancel(pending);
    assert_eq!(undefined, *runs);
    assert_eq!(engine.in_flight(), 0);

    // The peer killed mid-transfer.
    let mut pending = engine.post_read(&peer, runs, b"killed").unwrap();
    assert!(!engine.poll(&mut pending).unwrap(), "still in flight");
    child.child.kill().unwrap();
    let killed = Instant::now();
    let err = wait(&mut engine, &mut pending, XFER_TIMEOUT).unwrap_err();
    let after = killed.elapsed();
    assert!(matches!(err, EngineError::Transport(_)), "{err}");
    assert!(after < XFER_TIMEOUT);
    // The blocks not received: every local block the transfer was to write.
    let lost = blocks_written(&d, pending.runs()).unwrap();
    assert_eq!(lost, mapped);
    assert_eq!(
        lost.len(),
        3072,
        "a quarter of the local blocks is not mapped"
    );
    assert_eq!(engine.in_flight(), 0);
    // Blocks outside the transfer are intact (never written: zero).
    let received = engine.buffers().unwrap();
    for b in (0..d.geometry().num_blocks).filter(|b| lost.binary_search(b).is_err()) {
        for r in d.block_regions(b, 0..2, 0..2).unwrap() {
            let (o, n) = (r.offset as usize, r.len as usize);
            assert!(
                received[r.buffer as usize][o..o + n]
                    .iter()
                    .all(|&x| x == 0),
                "block {b}"
            );
        }
    }
    // Later posts to the dead peer fail too, without hanging; the peer can be removed.
    let again = Instant::now();
    let second = engine
        .post_read(&peer, runs, b"")
        .and_then(|mut p| wait(&mut engine, &mut p, XFER_TIMEOUT));
    assert!(second.is_err(), "a transfer from a dead peer succeeded");
    let again = again.elapsed();
    engine.remove_peer(&peer).unwrap();
    assert!(matches!(
        engine.post_read(&peer, runs, b""),
        Err(EngineError::UnknownPeer(_))
    ));
    let status = child.wait(XFER_TIMEOUT);
    assert!(status.is_some(), "killed child not reaped");
    report(&format!(
        "nixl fault test: peer killed mid-transfer -> error after {after:?}: {err}; \
         {} of {} local blocks not received; a new transfer failed after {again:?}",
        lost.len(),
        d.geometry().num_blocks
    ));
}

#[test]
fn nixl_hostile_handshakes_over_a_socket_are_refused() {
    // No NIXL call: the framing and the handshake are checked before any metadata is loaded.
    let layout = p_layout();
    let regions: Vec<MemRegion> = layout
        .extents()
        .iter()
        .enumerate()
        .map(|(i, x)| MemRegion {
            base: 0x7f00_0000_0000 + ((i as u64) << 32),
            len: x.end,
        })
        .collect();
    let good = Hello {
        peer: PeerMetadata {
            engine_id: "nixl-hostile".into(),
            groups: vec![group(&layout, 1, 0, regions.clone())],
        },
        agent_metadata: vec![7; 400],
    };
    let bytes = good.encode();
    let hlen = u32::from_le_bytes(bytes[4..8].try_into().unwrap()) as usize;
    let mut small = good.clone();
    small.peer.groups[0].regions[0].len -= 1;
    let mut variants: Vec<(&str, Vec<u8>)> = vec![
        ("good", bytes.clone()),
        ("empty", Vec::new()),
        ("truncated header", bytes[..6].to_vec()),
        ("truncated handshake", bytes[..8 + hlen / 2].to_vec()),
        ("truncated metadata", bytes[..bytes.len() - 1].to_vec()),
        ("trailing bytes", [&bytes[..], b"x"].concat()),
        ("region smaller than the layout's span", small.encode()),
    ];
    let mut bad_magic = bytes.clone();
    bad_magic[0] ^= 0xff;
    variants.push(("magic", bad_magic));
    let mut huge = bytes.clone();
    huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    variants.push(("huge length", huge));
    let mut flipped = bytes.clone();
    flipped[8 + 2] ^= 0x01; // the handshake's version
    variants.push(("handshake version", flipped));
    let mut json = bytes.clone();
    json[8 + 20] = b'}'; // inside the handshake's JSON body
    variants.push(("handshake body", json));
    // Every byte of the handshake flipped in turn, each refused or decoded to an equal-or-
    // different value, never a panic.
    let mutants: Vec<Vec<u8>> = (8..8 + hlen)
        .step_by(7)
        .map(|i| {
            let mut m = bytes.clone();
            m[i] = m[i].wrapping_add(0x55);
            m
        })
        .collect();

    // Over a real socket: a sender thread writes each variant as one frame.
    let (listener, port) = listen();
    let all: Vec<Vec<u8>> = variants
        .iter()
        .map(|(_, v)| v.clone())
        .chain(mutants.iter().cloned())
        .collect();
    let count = all.len();
    let sender = std::thread::spawn(move || {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        for v in all {
            send_frame(&mut s, &v);
        }
    });
    listener.set_nonblocking(false).unwrap();
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let mut refused = 0;
    for i in 0..count {
        let frame = recv_frame(&mut s, 1 << 20).unwrap();
        let got = Hello::decode(&frame, &Limits::default());
        if let Some((what, _)) = variants.get(i) {
            match (*what, got) {
                ("good", Ok(h)) => assert_eq!(h, good),
                ("region smaller than the layout's span", Err(e)) => {
                    assert!(matches!(e, HandshakeError::RegionTooSmall { .. }), "{e}")
                }
                ("magic", Err(e)) => assert!(matches!(e, HandshakeError::BadMagic { .. }), "{e}"),
                ("huge length", Err(e)) => {
                    assert!(matches!(e, HandshakeError::BodyTooLarge { .. }), "{e}")
                }
                (_, Err(_)) => refused += 1,
                (what, Ok(h)) => panic!("{what}: accepted {h:?}"),
            }
        } else if got.is_err() {
            refused += 1;
        }
    }
    sender.join().unwrap();
    report(&format!(
        "nixl hostile handshakes: {refused} of {} malformed or mutated messages refused",
        count - 4
    ));
    assert!(refused >= variants.len() - 4);
}
