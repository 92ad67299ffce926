//! The NIXL engine: KV blocks between processes (and machines) over NIXL's UCX backend, from
//! host memory. This module owns [`NixlEngine`] (one NIXL agent, its UCX backend and the host
//! cache buffers it registered, one region per buffer), the descriptor lists it builds from a
//! plan's runs, asynchronous READ ([`TransferEngine::post_read`]) and WRITE
//! ([`NixlEngine::post_write`]) with a notification to the peer, completion by polling
//! ([`crate::engine::wait`] bounds it with a timeout), cancellation ([`NixlEngine::cancel`]),
//! and the mapping of NIXL's failures into [`EngineError`]. It also owns [`Hello`], the
//! message that carries a peer's handshake and its NIXL agent metadata together, and
//! [`blocks_written`], which names the blocks a failed transfer leaves undefined.
//!
//! The NIXL library is loaded at run time: `nixl-sys` (feature `stub-api`) is built against
//! stubs that `dlopen("libnixl_capi.so")` on first use, from the PyPI wheel `nixl-cu12`
//! (`scripts/setup.sh` unpacks it; `scripts/nixl-path.sh` prints the `LD_LIBRARY_PATH` entries).
//! Without the library every call but `nixl_sys::is_stub` aborts the process, so [`available`]
//! calls that first and says why the library did not load, and [`NixlEngine::new`] refuses
//! with an error instead of aborting. The library path is read once, when the process starts.
//!
//! What NIXL does not give, and this engine therefore documents rather than hides:
//! - Failures are coarse: NIXL's C API reports a dead peer, a cancelled or refused request
//!   alike as a backend error, and every refusal of a request as one error; the detail is in
//!   NIXL's log on stderr. Each [`EngineError::Transport`] names the call and the likely causes.
//! - There is no abort: [`NixlEngine::cancel`] releases the request, but data already handed
//!   to the transport may still land afterwards, and no notification is sent. The destination
//!   of a cancelled or failed transfer is undefined and must be treated as not received.
//! - With UCX's `cma` transport (processes on one host) a post copies synchronously, so
//!   [`TransferEngine::post_read`] may return a transfer that is already complete.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use kvlayout::ops::CopyRun;
use kvlayout::{KvCacheLayout, LayoutError};
use nixl_sys::{
    Agent, AgentConfig, Backend, MemType, MemoryRegion, NixlDescriptor, NixlError, NotificationMap,
    OptArgs, RegistrationHandle, ThreadSync, XferDescList, XferOp, XferRequest, XferStatus,
};

use crate::engine::{check_runs, EngineError, TransferEngine};
use crate::handshake::{HandshakeError, Limits, MemRegion, PeerMetadata};

/// The library the stubs load, by this exact name, through the ordinary library search.
const LIBRARY: &str = "libnixl_capi.so";

/// The NIXL backend plugin used.
const BACKEND: &str = "UCX";

/// Whether the NIXL library loaded; `Err` says why not. Calls `nixl_sys::is_stub` first (the
/// one NIXL call that does not abort without the library), and only where the library did not
/// load asks the dynamic loader again for its reason.
pub fn available() -> Result<(), String> {
    if !nixl_sys::is_stub() {
        return Ok(());
    }
    Err(format!(
        "{} (the folders scripts/nixl-path.sh prints belong on LD_LIBRARY_PATH when the process \
         starts; scripts/setup.sh unpacks them)",
        dlopen_error()
    ))
}

/// The dynamic loader's reason for not loading [`LIBRARY`] (NIXL's stubs keep theirs to
/// themselves).
fn dlopen_error() -> String {
    let Ok(name) = CString::new(LIBRARY) else {
        return format!("{LIBRARY} not loadable");
    };
    // SAFETY: `name` is a valid C string for the call. `dlopen` either fails, leaving a
    // message for `dlerror` in this thread, or loads the library, which is closed again
    // (the stubs hold their own handle if they ever got one). The message is copied before
    // any other loader call can replace it.
    unsafe {
        let handle = libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if !handle.is_null() {
            libc::dlclose(handle);
            return format!("{LIBRARY} loads now, but did not when NIXL first looked for it");
        }
        let why = libc::dlerror();
        if why.is_null() {
            format!("{LIBRARY} not loadable")
        } else {
            CStr::from_ptr(why).to_string_lossy().into_owned()
        }
    }
}

/// A NIXL failure as an engine error: the call, NIXL's error and its likely causes.
fn nixl_error(call: &str, e: NixlError) -> EngineError {
    let causes = match e {
        NixlError::BackendError | NixlError::InvalidParam if call == "load_remote_md" => {
            ": metadata NIXL cannot read (NIXL's log on stderr has the detail)"
        }
        NixlError::BackendError => {
            ": the peer disconnected or died, the transport failed, or the request was refused \
             (NIXL's log on stderr has the detail)"
        }
        NixlError::FailedToCreateXferRequest => {
            ": an unknown peer, metadata not loaded, or a descriptor outside the memory the peer \
             registered (NIXL's log on stderr has the detail)"
        }
        NixlError::NotFound => ": the request or the peer is no longer known",
        _ => "",
    };
    EngineError::Transport(format!("nixl {call}: {e}{causes}"))
}

/// Options of a [`NixlEngine`]'s agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NixlOptions {
    /// Whether NIXL runs a progress thread (default). Without it, transfers progress only
    /// while this engine is called, and a passive peer must keep calling
    /// [`TransferEngine::notifications`] for connections to establish.
    pub progress_thread: bool,
    /// Pause of the progress thread between rounds, in microseconds. 0, NIXL's default,
    /// yields instead and keeps a core busy per agent (measured on a 2-CPU VM: 1.0 CPU-second
    /// per second idle, against 0.02 with 1000); transfers the initiator polls took the same
    /// time either way there (4 KiB to 64 MiB reads, cma and tcp).
    pub progress_delay_us: u64,
}

impl Default for NixlOptions {
    fn default() -> Self {
        NixlOptions {
            progress_thread: true,
            progress_delay_us: 0,
        }
    }
}

/// One registered host buffer: an allocation the engine owns and never lends out as a Rust
/// reference, because NIXL (a peer's WRITE, a READ in flight) may write it at any time.
#[derive(Debug)]
struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is a plain heap allocation owned by this value; nothing in it is tied to
// a thread. Access goes through raw-pointer copies only (`HostMemory`), never references.
unsafe impl Send for HostBuffer {}
// SAFETY: as above; shared use only reads the pointer and the length.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// Takes ownership of `bytes` without copying them.
    fn new(bytes: Vec<u8>) -> Self {
        let len = bytes.len();
        let ptr = NonNull::from(Box::leak(bytes.into_boxed_slice())).cast::<u8>();
        HostBuffer { ptr, len }
    }

    fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        let raw = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
        // SAFETY: `raw` is exactly the pointer and length `Box::leak` gave in `new`, and
        // it is freed once, here. The engine's drop order (registrations, then the agent,
        // then the memory) and the memory's `Arc` in every pending transfer ensure NIXL no
        // longer uses it.
        drop(unsafe { Box::from_raw(raw) });
    }
}

impl MemoryRegion for HostBuffer {
    // SAFETY (for callers, per the trait): the pointer is valid for `size()` bytes while the
    // buffer lives; NIXL registers it and moves bytes through it, never Rust references.
    unsafe fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    fn size(&self) -> usize {
        self.len
    }
}

impl NixlDescriptor for HostBuffer {
    fn mem_type(&self) -> MemType {
        MemType::Dram
    }

    fn device_id(&self) -> u64 {
        0
    }
}

/// The engine's cache buffers. Kept alive by every transfer posted from them, so no transfer
/// can outlive its memory.
#[derive(Debug)]
struct HostMemory {
    buffers: Vec<HostBuffer>,
}

impl HostMemory {
    fn lens(&self) -> Vec<u64> {
        self.buffers.iter().map(|b| b.len as u64).collect()
    }

    /// A copy of every buffer.
    fn read(&self) -> Vec<Vec<u8>> {
        self.buffers
            .iter()
            .map(|b| {
                let mut out = vec![0u8; b.len];
                // SAFETY: `b.ptr` is valid for `b.len` bytes while `self` lives and `out` has
                // `b.len` bytes; the two do not overlap. No reference to the registered memory
                // is made: a peer may write it concurrently (any byte value is a valid `u8`).
                unsafe { std::ptr::copy_nonoverlapping(b.ptr.as_ptr(), out.as_mut_ptr(), b.len) };
                out
            })
            .collect()
    }

    /// Overwrites every buffer with `bytes` (the caller has checked the shapes).
    fn write(&self, bytes: &[Vec<u8>]) {
        for (b, src) in self.buffers.iter().zip(bytes) {
            let n = b.len.min(src.len());
            // SAFETY: `b.ptr` is valid for `b.len >= n` bytes and `src` holds `n` bytes; they
            // do not overlap (`src` is caller memory). Writing through the raw pointer from a
            // shared `HostMemory` is the buffer's design: it is never lent as a reference.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), b.ptr.as_ptr(), n) };
        }
    }
}

/// Counts transfers posted and not finished; each [`NixlPending`] holds one count until it
/// completes, fails, is cancelled or dropped.
#[derive(Debug)]
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        InFlight(Arc::clone(count))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What a transfer does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XferKind {
    /// Reads the peer's bytes into local buffers.
    Read,
    /// Writes local bytes into the peer's buffers.
    Write,
}

/// A posted NIXL transfer. Dropping it before it completes releases the request, like
/// [`NixlEngine::cancel`].
pub struct NixlPending {
    // Field order is drop order: the request is released before the memory it uses can be
    // freed.
    req: Option<XferRequest>,
    in_flight: Option<InFlight>,
    outcome: Option<Result<(), EngineError>>,
    memory: Arc<HostMemory>,
    kind: XferKind,
    peer: String,
    runs: Vec<CopyRun>,
}

impl std::fmt::Debug for NixlPending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NixlPending")
            .field("kind", &self.kind)
            .field("peer", &self.peer)
            .field("runs", &self.runs.len())
            .field("bytes", &self.bytes())
            .field("posted", &self.req.is_some())
            .field("outcome", &self.outcome)
            .finish()
    }
}

impl NixlPending {
    /// Read or write.
    pub fn kind(&self) -> XferKind {
        self.kind
    }

    /// The peer read or written.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// The runs posted (`src_*` where the bytes come from: the peer's buffers for a read, the
    /// local ones for a write). After a failure or a cancellation their destinations are
    /// undefined ([`blocks_written`] names the blocks).
    pub fn runs(&self) -> &[CopyRun] {
        &self.runs
    }

    /// Bytes posted.
    pub fn bytes(&self) -> u64 {
        self.runs.iter().map(|r| r.len).sum()
    }

    /// Releases the request and records how it ended.
    fn finish(&mut self, outcome: Result<(), EngineError>) {
        self.req = None;
        self.in_flight = None;
        self.outcome = Some(outcome);
    }
}

/// An engine over NIXL: one agent named after the engine, with the UCX backend, owning host
/// cache buffers registered once (one region per buffer). Peers are other [`NixlEngine`]s, in
/// this process or another, known by their agent metadata ([`TransferEngine::local_metadata`])
/// and their regions ([`NixlEngine::regions`], published in the handshake).
///
/// Local buffers are read and replaced only between transfers this engine posted
/// ([`NixlEngine::buffers`] and [`NixlEngine::set_buffers`] refuse while one is in flight).
/// Transfers a peer posts (its READs of, or WRITEs into, this engine's memory) are not seen
/// here; the two sides order them by notifications.
#[derive(Debug)]
pub struct NixlEngine {
    name: String,
    /// Each peer's regions, by buffer.
    peers: HashMap<String, Vec<MemRegion>>,
    in_flight: Arc<AtomicUsize>,
    // Field order is drop order: registrations (deregistered), then the agent (destroyed once
    // no request holds it), then the memory (freed once no pending transfer holds it).
    _regs: Vec<RegistrationHandle>,
    backend: Backend,
    agent: Agent,
    memory: Arc<HostMemory>,
}

impl NixlEngine {
    /// An engine named `name` (its NIXL agent name, unique among the peers) owning `buffers`
    /// as its registered cache, with the default [`NixlOptions`]. Refused with an error, never
    /// an abort, when the NIXL library is not loaded ([`available`]).
    pub fn new(name: &str, buffers: Vec<Vec<u8>>) -> Result<Self, EngineError> {
        Self::with_options(name, buffers, &NixlOptions::default())
    }

    /// [`NixlEngine::new`] with `options`.
    pub fn with_options(
        name: &str,
        buffers: Vec<Vec<u8>>,
        options: &NixlOptions,
    ) -> Result<Self, EngineError> {
        available().map_err(|why| EngineError::Transport(format!("nixl: {why}")))?;
        if let Some(i) = buffers.iter().position(Vec::is_empty) {
            return Err(EngineError::Transport(format!(
                "nixl: buffer {i} is empty; NIXL registers no empty region"
            )));
        }
        let memory = Arc::new(HostMemory {
            buffers: buffers.into_iter().map(HostBuffer::new).collect(),
        });
        let config = AgentConfig {
            enable_prog_thread: options.progress_thread,
            enable_listen_thread: false,
            pthr_delay_us: options.progress_delay_us,
            // Requests may be released (dropped) on another thread than the engine's.
            thread_sync: ThreadSync::Strict,
            ..AgentConfig::default()
        };
        let agent =
            Agent::new_configured(name, &config).map_err(|e| nixl_error("create agent", e))?;
        let (_, params) = agent
            .get_plugin_params(BACKEND)
            .map_err(|e| nixl_error("get_plugin_params(UCX)", e))?;
        let backend = agent
            .create_backend(BACKEND, &params)
            .map_err(|e| nixl_error("create_backend(UCX)", e))?;
        let mut regs = Vec::with_capacity(memory.buffers.len());
        for (i, buffer) in memory.buffers.iter().enumerate() {
            let mut opt = OptArgs::new().map_err(|e| nixl_error("opt args", e))?;
            opt.add_backend(&backend)
                .map_err(|e| nixl_error("opt args", e))?;
            let reg = agent
                .register_memory(buffer, Some(&opt))
                .map_err(|e| nixl_error(&format!("register_memory(buffer {i})"), e))?;
            regs.push(reg);
        }
        Ok(NixlEngine {
            name: name.to_string(),
            peers: HashMap::new(),
            in_flight: Arc::new(AtomicUsize::new(0)),
            _regs: regs,
            backend,
            agent,
            memory,
        })
    }

    /// The regions a handshake publishes for this engine's buffers: each buffer's host address
    /// and registered length.
    pub fn regions(&self) -> Vec<MemRegion> {
        self.memory
            .buffers
            .iter()
            .map(|b| MemRegion {
                base: b.addr(),
                len: b.len as u64,
            })
            .collect()
    }

    /// Transfers this engine posted that have not finished.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    fn idle(&self, what: &str) -> Result<(), EngineError> {
        match self.in_flight() {
            0 => Ok(()),
            n => Err(EngineError::Transport(format!(
                "nixl: {what} refused: {n} transfer(s) in flight (wait for, cancel or drop them)"
            ))),
        }
    }

    /// A copy of the local buffers; refused while a transfer this engine posted is in flight.
    pub fn buffers(&self) -> Result<Vec<Vec<u8>>, EngineError> {
        self.idle("reading the buffers")?;
        Ok(self.memory.read())
    }

    /// Replaces the local buffers' contents (each of the same length); refused while a
    /// transfer this engine posted is in flight.
    pub fn set_buffers(&self, bytes: &[Vec<u8>]) -> Result<(), EngineError> {
        self.idle("replacing the buffers")?;
        let bufs = &self.memory.buffers;
        if bytes.len() != bufs.len() || bytes.iter().zip(bufs).any(|(a, b)| a.len() != b.len) {
            return Err(EngineError::Transport("buffer shapes differ".into()));
        }
        self.memory.write(bytes);
        Ok(())
    }

    /// Posts writing `runs` (`src_*` in the local buffers, `dst_*` in the peer's); the peer
    /// receives `notify` once the data is in its memory.
    pub fn post_write(
        &mut self,
        peer: &str,
        runs: &[CopyRun],
        notify: &[u8],
    ) -> Result<NixlPending, EngineError> {
        self.post(XferKind::Write, peer, runs, notify)
    }

    /// Releases `pending` and returns the runs whose destination is now undefined: none if it
    /// had completed, all of them otherwise. NIXL has no abort: bytes already handed to the
    /// transport may still land after this returns (the memory stays allocated until the
    /// engine is dropped), and the peer gets no notification. Treat those destinations as not
    /// received, and do not make them the destination of a new transfer from the same peer
    /// until it is removed ([`NixlEngine::remove_peer`]).
    pub fn cancel(&mut self, mut pending: NixlPending) -> Vec<CopyRun> {
        // A transfer of another engine is released unasked (its request is not this agent's).
        if pending.outcome.is_none() && Arc::ptr_eq(&pending.memory, &self.memory) {
            if let Some(req) = &pending.req {
                if let Ok(XferStatus::Success) = self.agent.get_xfer_status(req) {
                    pending.finish(Ok(()));
                }
            }
        }
        match pending.outcome {
            Some(Ok(())) => Vec::new(),
            _ => std::mem::take(&mut pending.runs),
        }
    }

    /// Forgets peer `name`: its metadata is invalidated (its connection closed) and its regions
    /// dropped. Needed after a peer died, before it can be added again.
    pub fn remove_peer(&mut self, name: &str) -> Result<(), EngineError> {
        if self.peers.remove(name).is_none() {
            return Err(EngineError::UnknownPeer(name.to_string()));
        }
        self.agent
            .invalidate_remote_md(name)
            .map_err(|e| nixl_error("invalidate_remote_md", e))
    }

    fn post(
        &mut self,
        kind: XferKind,
        peer: &str,
        runs: &[CopyRun],
        notify: &[u8],
    ) -> Result<NixlPending, EngineError> {
        let regions = self
            .peers
            .get(peer)
            .ok_or_else(|| EngineError::UnknownPeer(peer.to_string()))?;
        let remote_lens: Vec<u64> = regions.iter().map(|r| r.len).collect();
        let local_lens = self.memory.lens();
        // (local buffer, local offset, remote buffer, remote offset, len) of each run.
        let sides: Vec<(u32, u64, u32, u64, u64)> = match kind {
            XferKind::Read => {
                check_runs(runs, peer, &remote_lens, &local_lens)?;
                runs.iter()
                    .map(|r| {
                        (
                            r.dst_buffer,
                            r.dst_offset,
                            r.src_buffer,
                            r.src_offset,
                            r.len,
                        )
                    })
                    .collect()
            }
            XferKind::Write => {
                // `check_runs` checks `src_*` against the peer: swap the sides.
                let swapped: Vec<CopyRun> = runs
                    .iter()
                    .map(|r| CopyRun {
                        src_buffer: r.dst_buffer,
                        src_offset: r.dst_offset,
                        dst_buffer: r.src_buffer,
                        dst_offset: r.src_offset,
                        len: r.len,
                    })
                    .collect();
                check_runs(&swapped, peer, &remote_lens, &local_lens)?;
                runs.iter()
                    .map(|r| {
                        (
                            r.src_buffer,
                            r.src_offset,
                            r.dst_buffer,
                            r.dst_offset,
                            r.len,
                        )
                    })
                    .collect()
            }
        };
        let mut local = XferDescList::new(MemType::Dram).map_err(|e| nixl_error("dlist", e))?;
        let mut remote = XferDescList::new(MemType::Dram).map_err(|e| nixl_error("dlist", e))?;
        let mut descriptors = 0usize;
        for &(lb, lo, rb, ro, len) in sides.iter().filter(|s| s.4 > 0) {
            // Inside both registered regions (checked above), so the buffers exist and the
            // sums do not overflow; still computed checked, as an address must also fit this
            // machine's usize.
            let l = self.memory.buffers.get(lb as usize);
            let l = l.and_then(|b| b.addr().checked_add(lo));
            let r = regions
                .get(rb as usize)
                .and_then(|g| g.base.checked_add(ro));
            let (Some(l), Some(r), Ok(n)) = (
                l.and_then(|a| usize::try_from(a).ok()),
                r.and_then(|a| usize::try_from(a).ok()),
                usize::try_from(len),
            ) else {
                return Err(EngineError::Transport(format!(
                    "nixl: run of {len} bytes at remote buffer {rb} offset {ro} has no address \
                     on this machine"
                )));
            };
            local.add_desc(l, n, 0);
            remote.add_desc(r, n, 0);
            descriptors += 1;
        }
        let memory = Arc::clone(&self.memory);
        let mut pending = NixlPending {
            req: None,
            in_flight: None,
            outcome: None,
            memory,
            kind,
            peer: peer.to_string(),
            runs: runs.to_vec(),
        };
        if descriptors == 0 {
            // Nothing to move: the notification alone.
            self.agent
                .send_notification(peer, notify, Some(&self.backend))
                .map_err(|e| nixl_error("send_notification", e))?;
            pending.finish(Ok(()));
            return Ok(pending);
        }
        let mut opt = OptArgs::new().map_err(|e| nixl_error("opt args", e))?;
        opt.add_backend(&self.backend)
            .and_then(|()| opt.set_notification_message(notify))
            .and_then(|()| opt.set_has_notification(true))
            .map_err(|e| nixl_error("opt args", e))?;
        let op = match kind {
            XferKind::Read => XferOp::Read,
            XferKind::Write => XferOp::Write,
        };
        let req = self
            .agent
            .create_xfer_req(op, &local, &remote, peer, Some(&opt))
            .map_err(|e| nixl_error("create_xfer_req", e))?;
        pending.in_flight = Some(InFlight::new(&self.in_flight));
        let posted = self.agent.post_xfer_req(&req, None);
        pending.req = Some(req);
        match posted {
            // Posted and in flight.
            Ok(true) => {}
            // Complete already (a synchronous transport); the notification is sent.
            Ok(false) => pending.finish(Ok(())),
            Err(e) => {
                // Released here; the destination is undefined.
                let err = nixl_error("post_xfer_req", e);
                pending.finish(Err(err.clone()));
                return Err(err);
            }
        }
        Ok(pending)
    }
}

impl TransferEngine for NixlEngine {
    type Pending = NixlPending;

    fn name(&self) -> &str {
        &self.name
    }

    /// The agent's NIXL metadata (its connection details and registrations).
    fn local_metadata(&self) -> Result<Vec<u8>, EngineError> {
        self.agent
            .get_local_md()
            .map_err(|e| nixl_error("get_local_md", e))
    }

    /// Loads the peer's NIXL metadata (which must name agent `name`; loading it again
    /// replaces it) and keeps its regions. NIXL parses the metadata in C++; this engine checks
    /// the name it yields and the regions' arithmetic.
    fn add_peer(
        &mut self,
        name: &str,
        metadata: &[u8],
        regions: &[MemRegion],
    ) -> Result<(), EngineError> {
        if name == self.name {
            return Err(EngineError::Transport(format!(
                "nixl: engine {name:?} cannot be its own peer"
            )));
        }
        if let Some((i, r)) = regions
            .iter()
            .enumerate()
            .find(|(_, r)| r.base.checked_add(r.len).is_none())
        {
            return Err(EngineError::Transport(format!(
                "nixl: peer {name:?} region {i} ({} bytes at {:#x}) wraps the address space",
                r.len, r.base
            )));
        }
        // nixl-sys unwraps the agent name as UTF-8: a hostile name would panic; caught here.
        let loaded = catch_unwind(AssertUnwindSafe(|| self.agent.load_remote_md(metadata)))
            .map_err(|_| {
                EngineError::Transport(format!(
                    "nixl load_remote_md: peer {name:?} metadata names an agent that is not UTF-8"
                ))
            })?
            .map_err(|e| nixl_error("load_remote_md", e))?;
        if loaded != name {
            // Forget what was loaded, unless it is a peer this engine already knows.
            if !self.peers.contains_key(&loaded) && loaded != self.name {
                let _ = self.agent.invalidate_remote_md(&loaded);
            }
            return Err(EngineError::Transport(format!(
                "nixl: metadata of peer {name:?} names agent {loaded:?}"
            )));
        }
        self.peers.insert(name.to_string(), regions.to_vec());
        Ok(())
    }

    /// Posts reading `runs` (`src_*` in the peer's buffers, `dst_*` in the local ones) after
    /// checking every run against both sides' registered lengths; the peer receives `notify`
    /// once the data has moved. An `Err` here or from [`TransferEngine::poll`] leaves the
    /// destinations undefined.
    fn post_read(
        &mut self,
        peer: &str,
        runs: &[CopyRun],
        notify: &[u8],
    ) -> Result<NixlPending, EngineError> {
        self.post(XferKind::Read, peer, runs, notify)
    }

    fn poll(&mut self, pending: &mut NixlPending) -> Result<bool, EngineError> {
        if !Arc::ptr_eq(&pending.memory, &self.memory) {
            return Err(EngineError::Transport(format!(
                "nixl: a transfer of another engine polled on {:?}",
                self.name
            )));
        }
        if let Some(outcome) = &pending.outcome {
            return outcome.clone().map(|()| true);
        }
        let Some(req) = &pending.req else {
            return Err(EngineError::Transport(
                "nixl: transfer without request".into(),
            ));
        };
        match self.agent.get_xfer_status(req) {
            Ok(XferStatus::InProgress) => Ok(false),
            Ok(XferStatus::Success) => {
                pending.finish(Ok(()));
                Ok(true)
            }
            Err(e) => {
                let err = nixl_error("get_xfer_status", e);
                pending.finish(Err(err.clone()));
                Err(err)
            }
        }
    }

    /// Notifications received since the last call. Messages are bytes; a sender whose agent
    /// name is not UTF-8 (no [`NixlEngine`] can be one) is passed over.
    fn notifications(&mut self) -> Result<Vec<(String, Vec<u8>)>, EngineError> {
        // A fresh map per call: nixl-sys's map cannot be cleared when a message is not UTF-8.
        let mut map = NotificationMap::new().map_err(|e| nixl_error("notification map", e))?;
        self.agent
            .get_notifications(&mut map, None)
            .map_err(|e| nixl_error("get_notifications", e))?;
        let agents: Vec<String> = map
            .agents()
            .filter_map(|a| a.ok().map(str::to_string))
            .collect();
        let mut out = Vec::new();
        for agent in agents {
            for message in map
                .get_notifications(&agent)
                .map_err(|e| nixl_error("notifications", e))?
            {
                out.push((
                    agent.clone(),
                    message.map_err(|e| nixl_error("notification", e))?,
                ));
            }
        }
        Ok(out)
    }
}

/// The blocks of `layout` whose bytes (any layer, head or field) some run's destination
/// touches, ascending: after a failed or cancelled transfer into a cache of this layout, the
/// blocks not received.
pub fn blocks_written(layout: &KvCacheLayout, runs: &[CopyRun]) -> Result<Vec<u64>, LayoutError> {
    // Destination ranges per buffer, sorted and merged.
    let mut dst: HashMap<u32, Vec<(u64, u64)>> = HashMap::new();
    for r in runs.iter().filter(|r| r.len > 0) {
        let end = r.dst_offset.saturating_add(r.len);
        dst.entry(r.dst_buffer)
            .or_default()
            .push((r.dst_offset, end));
    }
    for ranges in dst.values_mut() {
        ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for &(s, e) in ranges.iter() {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        *ranges = merged;
    }
    let hits = |buffer: u32, start: u64, end: u64| {
        dst.get(&buffer).is_some_and(|ranges| {
            // The first range ending after `start` is the only candidate.
            let i = ranges.partition_point(|&(_, e)| e <= start);
            ranges.get(i).is_some_and(|&(s, _)| s < end)
        })
    };
    let g = layout.geometry();
    let mut out = Vec::new();
    for block in 0..g.num_blocks {
        let touched = layout
            .block_regions(block, 0..g.num_layers, 0..g.num_kv_heads)?
            .iter()
            .any(|b| hits(b.buffer, b.offset, b.offset.saturating_add(b.len)));
        if touched {
            out.push(block);
        }
    }
    Ok(out)
}

/// What a peer sends to connect: its handshake ([`PeerMetadata::encode`]) and its NIXL agent
/// metadata ([`TransferEngine::local_metadata`]), in one message.
///
/// | bytes | field |
/// |---|---|
/// | 0..4 | magic `b"KVNX"` |
/// | 4..8 | handshake length `h`, u32 little-endian |
/// | 8..8+h | the handshake |
/// | 8+h..12+h | agent metadata length `m`, u32 little-endian |
/// | 12+h.. | the agent metadata, `m` bytes, nothing after |
///
/// ```
/// use kvlayout_connector::handshake::{CacheGroup, Limits, MemRegion, PeerMetadata};
/// use kvlayout_connector::nixl::Hello;
/// let layout: kvlayout::KvCacheLayout = "kv B=4 N=16 H=2 D=8 dtype=f16 order=NHD".parse()?;
/// let regions = layout.extents().iter().map(|x| MemRegion { base: 1 << 40, len: x.end });
/// let group = CacheGroup {
///     name: "attn".into(),
///     layout: layout.clone(),
///     total_kv_heads: 2,
///     tp_size: 1,
///     tp_rank: 0,
///     regions: regions.collect(),
/// };
/// let peer = PeerMetadata { engine_id: "prefill".into(), groups: vec![group] };
/// let bytes = Hello { peer: peer.clone(), agent_metadata: b"md".to_vec() }.encode();
/// let back = Hello::decode(&bytes, &Limits::default())?;
/// assert_eq!((back.peer, back.agent_metadata), (peer, b"md".to_vec()));
/// // Cut short: refused with the lengths.
/// assert!(Hello::decode(&bytes[..bytes.len() - 1], &Limits::default()).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Hello {
    /// The peer's handshake.
    pub peer: PeerMetadata,
    /// Its NIXL agent metadata, for [`TransferEngine::add_peer`].
    pub agent_metadata: Vec<u8>,
}

impl Hello {
    /// The first four bytes.
    pub const MAGIC: [u8; 4] = *b"KVNX";

    /// The encoding (a part longer than `u32::MAX` bytes gets that length, which decoding
    /// refuses).
    pub fn encode(&self) -> Vec<u8> {
        let handshake = self.peer.encode();
        let md = &self.agent_metadata;
        let len32 = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes();
        let mut out = Vec::with_capacity(12 + handshake.len() + md.len());
        out.extend_from_slice(&Self::MAGIC);
        out.extend_from_slice(&len32(handshake.len()));
        out.extend_from_slice(&handshake);
        out.extend_from_slice(&len32(md.len()));
        out.extend_from_slice(md);
        out
    }

    /// Decodes and checks a peer's message: the framing (magic, each length within
    /// `limits.max_body_bytes` and equal to what follows), then the handshake with
    /// [`PeerMetadata::decode`]. The agent metadata is opaque here; NIXL checks it when loaded.
    pub fn decode(bytes: &[u8], limits: &Limits) -> Result<Hello, HandshakeError> {
        let too_short = |needed: usize| HandshakeError::TooShort {
            len: bytes.len(),
            needed,
        };
        let magic: [u8; 4] = bytes
            .get(..4)
            .and_then(|m| m.try_into().ok())
            .ok_or(too_short(4))?;
        if magic != Self::MAGIC {
            return Err(HandshakeError::BadMagic {
                got: magic,
                expected: Self::MAGIC,
            });
        }
        // A length at `at`, bounded, and the `at + 4 + len` it ends at.
        let part = |at: usize| -> Result<(usize, usize), HandshakeError> {
            let len = bytes
                .get(at..at + 4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_le_bytes)
                .ok_or(too_short(at + 4))?;
            if u64::from(len) > limits.max_body_bytes {
                return Err(HandshakeError::BodyTooLarge {
                    len: len.into(),
                    limit: limits.max_body_bytes,
                });
            }
            let start = at + 4;
            let end = start.saturating_add(len as usize);
            if bytes.len() < end {
                return Err(HandshakeError::LengthMismatch {
                    declared: len.into(),
                    actual: (bytes.len() - start) as u64,
                });
            }
            Ok((start, end))
        };
        let (h0, h1) = part(4)?;
        let (m0, m1) = part(h1)?;
        if bytes.len() != m1 {
            return Err(HandshakeError::LengthMismatch {
                declared: (m1 - m0) as u64,
                actual: (bytes.len() - m0) as u64,
            });
        }
        Ok(Hello {
            peer: PeerMetadata::decode(&bytes[h0..h1], limits)?,
            agent_metadata: bytes[m0..m1].to_vec(),
        })
    }
}
