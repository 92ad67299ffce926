//! Transfer engines: what moves a plan's runs between two instances' registered memory. An
//! engine owns its local buffers (the local cache, or a staging cache; registered once) and
//! knows each peer by the regions the peer's handshake registered, so every run is checked
//! against both sides' registered memory before anything moves. Posting is asynchronous;
//! [`wait`] polls to completion or a timeout. [`crate::execute`] runs a whole plan.
//!
//! - [`MemcpyEngine`]: between instances in one process (the default).
//! - The NIXL engine, between processes and machines, implements the same trait.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::{Duration, Instant};

use kvlayout::ops::{run_bytes, CopyRun};

use crate::handshake::MemRegion;

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
    /// Whether `pending` is complete; `Err` if it failed.
    fn poll(&mut self, pending: &mut Self::Pending) -> Result<bool, EngineError>;
    /// A copy of the local buffers, for a pass after the transfer (the post-receive operation
    /// of a staged plan). An engine may refuse while a transfer it posted is in flight.
    fn buffers(&self) -> Result<Vec<Vec<u8>>, EngineError>;
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

/// Host buffers shared between in-process engines.
type Pool = Arc<RwLock<Vec<Vec<u8>>>>;

/// Notifications received: `(peer, message)`.
type Inbox = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// Every in-process engine, by name, with its inbox of notifications.
type Registry = Mutex<HashMap<String, (Pool, Inbox)>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Registry::default)
}

/// An engine between instances in one process: its cache buffers live on the host, a read
/// copies from the peer's buffers under their lock. Completes when posted.
#[derive(Debug)]
pub struct MemcpyEngine {
    name: String,
    local: Pool,
    inbox: Inbox,
    peers: HashMap<String, (Pool, Vec<u64>)>,
}

impl MemcpyEngine {
    /// An engine named `name` (unique in the process) owning `buffers` as its registered cache.
    pub fn new(name: &str, buffers: Vec<Vec<u8>>) -> Result<Self, EngineError> {
        let local: Pool = Arc::new(RwLock::new(buffers));
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
        })
    }

    /// Replaces the local buffers' contents (each of the same length).
    pub fn set_buffers(&self, bytes: &[Vec<u8>]) -> Result<(), EngineError> {
        let mut local = self.local.write().unwrap_or_else(PoisonError::into_inner);
        if bytes.len() != local.len()
            || bytes
                .iter()
                .zip(local.iter())
                .any(|(a, b)| a.len() != b.len())
        {
            return Err(EngineError::Transport("buffer shapes differ".into()));
        }
        local.clone_from_slice(bytes);
        Ok(())
    }
}

impl Drop for MemcpyEngine {
    fn drop(&mut self) {
        let mut reg = registry().lock().unwrap_or_else(PoisonError::into_inner);
        reg.remove(&self.name);
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
            .map(|(i, b)| MemRegion {
                base: (i as u64) << 48,
                len: b.len() as u64,
            })
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
        let (pool, remote_lens) = self
            .peers
            .get(peer)
            .ok_or_else(|| EngineError::UnknownPeer(peer.to_string()))?;
        if Arc::ptr_eq(pool, &self.local) {
            return Err(EngineError::Transport(
                "an engine reading from itself".into(),
            ));
        }
        // Two engines may read from each other: take the two locks in address order.
        let (src, mut dst) = if Arc::as_ptr(pool) < Arc::as_ptr(&self.local) {
            let src = pool.read().unwrap_or_else(PoisonError::into_inner);
            (
                src,
                self.local.write().unwrap_or_else(PoisonError::into_inner),
            )
        } else {
            let dst = self.local.write().unwrap_or_else(PoisonError::into_inner);
            (pool.read().unwrap_or_else(PoisonError::into_inner), dst)
        };
        // The peer's registered lengths bound the runs, and so do its actual buffers.
        let bound: Vec<u64> = remote_lens
            .iter()
            .zip(src.iter())
            .map(|(a, b)| (*a).min(b.len() as u64))
            .collect();
        let local_lens: Vec<u64> = dst.iter().map(|b| b.len() as u64).collect();
        check_runs(runs, peer, &bound, &local_lens)?;
        for r in runs {
            let (s, d, n) = (r.src_offset as usize, r.dst_offset as usize, r.len as usize);
            dst[r.dst_buffer as usize][d..d + n]
                .copy_from_slice(&src[r.src_buffer as usize][s..s + n]);
        }
        drop((src, dst));
        let reg = registry().lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, inbox)) = reg.get(peer) {
            inbox
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((self.name.clone(), notify.to_vec()));
        }
        Ok(Copied {
            bytes: run_bytes(runs),
        })
    }

    fn poll(&mut self, _: &mut Copied) -> Result<bool, EngineError> {
        Ok(true)
    }

    fn buffers(&self) -> Result<Vec<Vec<u8>>, EngineError> {
        Ok(self
            .local
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone())
    }

    fn notifications(&mut self) -> Result<Vec<(String, Vec<u8>)>, EngineError> {
        let mut inbox = self.inbox.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(std::mem::take(&mut *inbox))
    }
}
