//! The NIXL engine: KV blocks between processes (and machines) over NIXL's UCX backend, from
//! host or device memory. This module owns [`NixlEngine`] (one NIXL agent, its UCX backend and
//! the cache regions it registered, one per buffer: its own or its caller's), the descriptor
//! lists it builds from a plan's runs or prepares once per peer (`prepared`: transfers made
//! from indices, [`NixlPath`]), its constants for the cost model (`calibrate`), asynchronous READ ([`TransferEngine::post_read`]) and WRITE
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

mod calibrate;
mod engine;
mod hello;
mod memory;
mod prepare;
mod prepared;
mod transfer;

pub use calibrate::{calibrate_nixl, choose_by_nixl_cost, NixlCalibration};
pub use hello::{blocks_written, Hello};
pub use prepared::{NixlPath, PrepareSide, PreparedCount};

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use kvlayout::ops::{run_bytes, CopyRun};
use nixl_sys::{Agent, Backend, NixlError, RegistrationHandle, XferRequest};

use crate::engine::EngineError;
#[cfg(doc)]
use crate::engine::TransferEngine;
use crate::handshake::MemRegion;

use memory::{HostMemory, InFlight};

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
    path: NixlPath,
}

impl std::fmt::Debug for NixlPending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NixlPending")
            .field("kind", &self.kind)
            .field("peer", &self.peer)
            .field("runs", &self.runs.len())
            .field("bytes", &self.bytes())
            .field("path", &self.path)
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

    /// How the transfer was made: from prepared lists or from fresh descriptor lists.
    pub fn path(&self) -> &NixlPath {
        &self.path
    }

    /// Bytes posted.
    pub fn bytes(&self) -> u64 {
        run_bytes(&self.runs)
    }

    /// Releases the request and records how it ended.
    fn finish(&mut self, outcome: Result<(), EngineError>) {
        self.req = None;
        self.in_flight = None;
        self.outcome = Some(outcome);
    }
}

/// An engine over NIXL: one agent named after the engine, with the UCX backend, and its cache
/// regions registered once, one per buffer ([`crate::Region`]: owned, or the caller's host or
/// device memory). Peers are other [`NixlEngine`]s, in
/// this process or another, known by their agent metadata ([`TransferEngine::local_metadata`])
/// and their regions ([`TransferEngine::regions`], published in the handshake).
///
/// Local buffers are read and replaced only between transfers this engine posted
/// ([`TransferEngine::buffers`] and [`NixlEngine::set_buffers`] refuse while one is in flight,
/// and for device memory, which its backend reads).
/// Transfers a peer posts (its READs of, or WRITEs into, this engine's memory) are not seen
/// here; the two sides order them by notifications.
#[derive(Debug)]
pub struct NixlEngine {
    name: String,
    /// Each peer's regions, by buffer.
    peers: HashMap<String, Vec<MemRegion>>,
    in_flight: Arc<AtomicUsize>,
    // Field order is drop order: prepared lists (released), registrations (deregistered),
    // then the agent (destroyed once no request holds it), then the memory (freed once no
    // pending transfer holds it).
    /// Each peer's prepared lists, one per pairing of layouts ([`NixlEngine::prepare_peer`]).
    prepared: HashMap<String, Vec<prepared::Prepared>>,
    _regs: Vec<RegistrationHandle>,
    backend: Backend,
    agent: Agent,
    memory: Arc<HostMemory>,
}
