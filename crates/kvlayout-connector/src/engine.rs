//! Transfer engines: what moves a plan's runs between two instances' registered memory. An
//! engine registers its local buffers once ([`Region`]s: its own, or its caller's; the local
//! cache, a staging area, or both) and knows each peer by the regions the peer's handshake registered, so every run is checked
//! against both sides' registered memory before anything moves. Posting is asynchronous;
//! [`wait`] polls to completion or a timeout. [`crate::execute`] runs a whole plan.
//!
//! - [`MemcpyEngine`]: between instances in one process (the default).
//! - The NIXL engine, between processes and machines, implements the same trait.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::{Duration, Instant};

use kvlayout::ops::{run_bytes, CopyRun, RunSet};

use crate::handshake::MemRegion;
use crate::memory::{MemKind, Region};
use crate::stream_copy::STREAM_MIN_TRANSFER_BYTES;

mod memcpy_read;

/// An engine's refusal or failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// A peer the engine was not told about.
    #[error("unknown peer {0:?}")]
    UnknownPeer(String),
    /// A run outside what one side registered.
    #[error(
        "{side} buffer {buffer}: {len} bytes at {offset} outside its registered {registered} bytes"
    )]
    OutOfRegion {
        /// `local` or the peer's name.
        side: String,
        /// Buffer index.
        buffer: u32,
        /// Run offset.
        offset: u64,
        /// Run length.
        len: u64,
        /// Bytes registered for that buffer (0 when there is no such buffer).
        registered: u64,
    },
    /// Not complete within the timeout; the destination must not be used.
    #[error("transfer not complete after {0:?}")]
    Timeout(Duration),
    /// The engine's own failure (the peer died, the transport failed).
    #[error("{0}")]
    Transport(String),
}

/// What moves runs between this instance and its peers.
pub trait TransferEngine {
    /// A posted transfer.
    type Pending;

    /// The name peers know this engine by.
    fn name(&self) -> &str;
    /// What a peer needs to reach this engine (passed to its [`TransferEngine::add_peer`]).
    fn local_metadata(&self) -> Result<Vec<u8>, EngineError>;
    /// The regions a handshake publishes for this engine's local buffers, one per buffer.
    fn regions(&self) -> Vec<MemRegion>;
    /// Makes peer `name` reachable: its engine metadata and its registered regions (one per
    /// cache buffer, from its handshake).
    fn add_peer(
        &mut self,
        name: &str,
        metadata: &[u8],
        regions: &[MemRegion],
    ) -> Result<(), EngineError>;
    /// Posts reading `runs` (`src_*` in the peer's buffers, `dst_*` in the local ones); the
    /// peer receives `notify` when the data has moved.
    fn post_read(
        &mut self,
        peer: &str,
        runs: &[CopyRun],
        notify: &[u8],
    ) -> Result<Self::Pending, EngineError>;
    /// Posts reading the runs of `set` ([`RunSet`]), as [`TransferEngine::post_read`] of its
    /// expansion. By default it expands the set; the memcpy engine copies it directly.
    fn post_read_set(
        &mut self,
        peer: &str,
        set: &RunSet,
        notify: &[u8],
    ) -> Result<Self::Pending, EngineError> {
        self.post_read(peer, &set.expand(), notify)
    }
    /// Whether `pending` is complete; `Err` if it failed.
    fn poll(&mut self, pending: &mut Self::Pending) -> Result<bool, EngineError>;
    /// A copy of the local buffers, for a pass after the transfer (the post-receive operation
    /// of a staged plan). An engine may refuse while a transfer it posted is in flight.
    fn buffers(&self) -> Result<Vec<Vec<u8>>, EngineError>;
    /// A copy of the first `len` bytes of local buffer `buffer` (a staging cache's buffer, for
    /// the post-receive operation), refused where the buffer is shorter or missing. By
    /// default through [`TransferEngine::buffers`]; engines override it to copy only those
    /// bytes.
    fn read_local(&self, buffer: u32, len: u64) -> Result<Vec<u8>, EngineError> {
        let mut all = self.buffers()?;
        let lens: Vec<u64> = all.iter().map(|b| b.len() as u64).collect();
        check_local(buffer, len, &lens)?;
        let mut bytes = all.swap_remove(buffer as usize);
        bytes.truncate(len as usize);
        Ok(bytes)
    }
    /// Notifications received since the last call: `(peer, message)`.
    fn notifications(&mut self) -> Result<Vec<(String, Vec<u8>)>, EngineError>;
}

/// Polls `pending` until it completes, fails, or `timeout` passes.
pub fn wait<E: TransferEngine>(
    engine: &mut E,
    pending: &mut E::Pending,
    timeout: Duration,
) -> Result<(), EngineError> {
    let start = Instant::now();
    loop {
        if engine.poll(pending)? {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            return Err(EngineError::Timeout(timeout));
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// Refuses reading `len` bytes of local buffer `buffer` beyond the buffers' lengths `lens`.
pub fn check_local(buffer: u32, len: u64, lens: &[u64]) -> Result<(), EngineError> {
    let registered = lens.get(buffer as usize).copied().unwrap_or(0);
    if (buffer as usize) < lens.len() && len <= registered {
        return Ok(());
    }
    Err(EngineError::OutOfRegion {
        side: "local".into(),
        buffer,
        offset: 0,
        len,
        registered,
    })
}

/// Checks every run against the registered lengths of both sides.
pub fn check_runs(
    runs: &[CopyRun],
    peer: &str,
    remote: &[u64],
    local: &[u64],
) -> Result<(), EngineError> {
    let inside = |side: &str, lens: &[u64], buffer: u32, offset: u64, len: u64| {
        let registered = lens.get(buffer as usize).copied().unwrap_or(0);
        match offset.checked_add(len) {
            Some(end) if (buffer as usize) < lens.len() && end <= registered => Ok(()),
            _ => Err(EngineError::OutOfRegion {
                side: side.to_string(),
                buffer,
                offset,
                len,
                registered,
            }),
        }
    };
    for r in runs {
        inside(peer, remote, r.src_buffer, r.src_offset, r.len)?;
        inside("local", local, r.dst_buffer, r.dst_offset, r.len)?;
    }
    Ok(())
}

/// An in-process engine's regions, shared with its peers. Emptied when the engine is dropped
/// or its scope ends, so that a peer never reaches memory no longer registered.
type Pool = Arc<RwLock<Vec<Region<'static>>>>;

/// Notifications received: `(peer, message)`.
type Inbox = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// Every in-process engine, by name, with its inbox of notifications.
type Registry = Mutex<HashMap<String, (Pool, Inbox)>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Registry::default)
}

/// An engine between instances in one process: its cache buffers are host regions
/// ([`Region`]: its own, or its caller's), and a read copies from the peer's regions under
/// their lock. Completes when posted.
#[derive(Debug)]
pub struct MemcpyEngine {
    name: String,
    local: Pool,
    inbox: Inbox,
    peers: HashMap<String, (Pool, Vec<u64>)>,
    stream_min_bytes: u64,
}

impl MemcpyEngine {
    /// An engine named `name` (unique in the process) owning `buffers` as its registered cache.
    pub fn new(name: &str, buffers: Vec<Vec<u8>>) -> Result<Self, EngineError> {
        Self::register(name, buffers.into_iter().map(Region::owned).collect())
    }

    /// An engine named `name` (unique in the process) registering `regions`, one per local
    /// buffer: owned ones ([`Region::owned`]) or the caller's ([`Region::from_raw`]). Host
    /// memory only.
    pub fn register(name: &str, regions: Vec<Region<'static>>) -> Result<Self, EngineError> {
        if let Some(i) = regions.iter().position(|r| r.kind() != MemKind::Host) {
            return Err(EngineError::Transport(format!(
                "memcpy engine {name:?}: region {i} is {:?} memory; this engine copies host \
                 memory only (the NIXL engine registers device memory)",
                regions[i].kind()
            )));
        }
        let local: Pool = Arc::new(RwLock::new(regions));
        let inbox = Arc::default();
        let mut reg = registry().lock().unwrap_or_else(PoisonError::into_inner);
        if reg.contains_key(name) {
            return Err(EngineError::Transport(format!(
                "an engine named {name:?} exists in this process"
            )));
        }
        reg.insert(name.to_string(), (Arc::clone(&local), Arc::clone(&inbox)));
        Ok(MemcpyEngine {
            name: name.to_string(),
            local,
            inbox,
            peers: HashMap::new(),
            stream_min_bytes: STREAM_MIN_TRANSFER_BYTES,
        })
    }

    /// Runs `f` with an engine named `name` registering `regions`, memory the caller lends
    /// for the scope ([`Region::host`] of its own byte slices, such as a CPU cache's
    /// buffers). When `f` returns (or unwinds), the regions are unregistered: the engine, and
    /// every peer reading from it, no longer reach them, even if `f` moved the engine out.
    /// The caller's slices hold what the transfers left in them.
    pub fn scope<'m, R>(
        name: &str,
        regions: Vec<Region<'m>>,
        f: impl FnOnce(&mut MemcpyEngine) -> R,
    ) -> Result<R, EngineError> {
        let mut engine = Self::register(name, regions.into_iter().map(Region::erase).collect())?;
        /// Empties the pool when the scope ends, however it ends.
        struct Unregister(Pool);
        impl Drop for Unregister {
            fn drop(&mut self) {
                self.0
                    .write()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clear();
            }
        }
        let _unregister = Unregister(Arc::clone(&engine.local));
        Ok(f(&mut engine))
    }

    /// Streams the stores of a read past the caches ([`crate::stream_copy`]) when it moves
    /// `min_bytes` or more ([`STREAM_MIN_TRANSFER_BYTES`] by default; `u64::MAX`: never).
    /// Cached stores suit a reader on this CPU that touches the bytes right away.
    pub fn set_stream_min_bytes(&mut self, min_bytes: u64) {
        self.stream_min_bytes = min_bytes;
    }

    /// Replaces the local buffers' contents (each of the same length).
    pub fn set_buffers(&mut self, bytes: &[Vec<u8>]) -> Result<(), EngineError> {
        // The write lock, as a peer's read takes the read lock.
        let local = self.local.write().unwrap_or_else(PoisonError::into_inner);
        if bytes.len() != local.len()
            || bytes
                .iter()
                .zip(local.iter())
                .any(|(a, b)| a.len() != b.len())
        {
            return Err(EngineError::Transport("buffer shapes differ".into()));
        }
        for (region, b) in local.iter().zip(bytes) {
            region.write(0, b);
        }
        Ok(())
    }
}

impl Drop for MemcpyEngine {
    fn drop(&mut self) {
        let mut reg = registry().lock().unwrap_or_else(PoisonError::into_inner);
        // Only this engine's entry (an engine of the same name may have replaced it).
        if reg
            .get(&self.name)
            .is_some_and(|(pool, _)| Arc::ptr_eq(pool, &self.local))
        {
            reg.remove(&self.name);
        }
        drop(reg);
        // Peers holding the pool see no regions from now on.
        self.local
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

/// A read of the memcpy engine: complete when posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copied {
    /// Bytes copied.
    pub bytes: u64,
}

impl TransferEngine for MemcpyEngine {
    type Pending = Copied;

    fn name(&self) -> &str {
        &self.name
    }

    fn local_metadata(&self) -> Result<Vec<u8>, EngineError> {
        Ok(self.name.as_bytes().to_vec())
    }

    /// Each buffer's length; the base is the buffer index (`i << 48`), as in-process peers
    /// address buffers by index.
    fn regions(&self) -> Vec<MemRegion> {
        let local = self.local.read().unwrap_or_else(PoisonError::into_inner);
        local
            .iter()
            .enumerate()
            .map(|(i, b)| MemRegion::host((i as u64) << 48, b.len() as u64))
            .collect()
    }

    fn add_peer(
        &mut self,
        name: &str,
        metadata: &[u8],
        regions: &[MemRegion],
    ) -> Result<(), EngineError> {
        if metadata != name.as_bytes() {
            return Err(EngineError::Transport(format!(
                "metadata of peer {name:?} names another engine"
            )));
        }
        let reg = registry().lock().unwrap_or_else(PoisonError::into_inner);
        let (pool, _) = reg
            .get(name)
            .ok_or_else(|| EngineError::UnknownPeer(name.to_string()))?;
        let lens = regions.iter().map(|r| r.len).collect();
        self.peers
            .insert(name.to_string(), (Arc::clone(pool), lens));
        Ok(())
    }

    fn post_read(
        &mut self,
        peer: &str,
        runs: &[CopyRun],
        notify: &[u8],
    ) -> Result<Copied, EngineError> {
        self.copy_runs(peer, runs, (runs.iter().copied(), run_bytes(runs)), notify)
    }

    /// Checks the first and the last repetition of the set (offsets grow with the
    /// repetition, so every run lies between them), then copies every run.
    fn post_read_set(
        &mut self,
        peer: &str,
        set: &RunSet,
        notify: &[u8],
    ) -> Result<Copied, EngineError> {
        let ends: Vec<CopyRun> = set.extremes().collect();
        self.copy_runs(peer, &ends, (set.iter(), set.bytes()), notify)
    }

    fn poll(&mut self, _: &mut Copied) -> Result<bool, EngineError> {
        Ok(true)
    }

    fn buffers(&self) -> Result<Vec<Vec<u8>>, EngineError> {
        let local = self.local.read().unwrap_or_else(PoisonError::into_inner);
        Ok(local.iter().map(|r| r.read(0, r.len())).collect())
    }

    fn read_local(&self, buffer: u32, len: u64) -> Result<Vec<u8>, EngineError> {
        let local = self.local.read().unwrap_or_else(PoisonError::into_inner);
        let lens: Vec<u64> = local.iter().map(|r| r.len() as u64).collect();
        check_local(buffer, len, &lens)?;
        Ok(local[buffer as usize].read(0, len as usize))
    }

    fn notifications(&mut self) -> Result<Vec<(String, Vec<u8>)>, EngineError> {
        let mut inbox = self.inbox.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(std::mem::take(&mut *inbox))
    }
}
