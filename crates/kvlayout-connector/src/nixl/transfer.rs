//! [`NixlEngine`] as a [`TransferEngine`]: agent metadata, peers, READs, polling and
//! notifications.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use kvlayout::ops::CopyRun;
use nixl_sys::{NotificationMap, XferStatus};

use crate::engine::{check_local, EngineError, TransferEngine};
use crate::handshake::MemRegion;
use crate::memory::MemKind;

use super::{nixl_error, NixlEngine, NixlPending, XferKind};

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

    /// Each buffer's host address and registered length.
    fn regions(&self) -> Vec<MemRegion> {
        self.memory
            .buffers
            .iter()
            .map(|b| MemRegion {
                base: b.addr(),
                len: b.len() as u64,
                device: match b.kind() {
                    MemKind::Host => None,
                    MemKind::Device { id } => Some(id),
                },
            })
            .collect()
    }

    /// Loads the peer's NIXL metadata (which must name agent `name`; loading it again
    /// replaces it, and releases the lists prepared for it) and keeps its regions. NIXL
    /// parses the metadata in C++; this engine checks the name it yields and the regions'
    /// arithmetic.
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
        // Lists prepared against the metadata this replaces are released first.
        self.prepared.remove(name);
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
        self.post(XferKind::Read, peer, runs, notify, true)
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

    /// A copy of the local buffers; refused while a transfer this engine posted is in flight.
    fn buffers(&self) -> Result<Vec<Vec<u8>>, EngineError> {
        self.idle("reading the buffers")?;
        self.memory.read()
    }

    /// The first `len` bytes of one host buffer; refused while a transfer is in flight.
    fn read_local(&self, buffer: u32, len: u64) -> Result<Vec<u8>, EngineError> {
        self.idle("reading a buffer")?;
        check_local(buffer, len, &self.memory.lens())?;
        self.memory.read_one(buffer as usize, len as usize)
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
