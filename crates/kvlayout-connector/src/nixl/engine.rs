//! [`NixlEngine`]'s own methods: creating the agent, its UCX backend and the registrations,
//! the local buffers, peers, and posting, cancelling and releasing transfers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use kvlayout::ops::CopyRun;
use nixl_sys::{Agent, AgentConfig, OptArgs, ThreadSync, XferDescList, XferOp, XferStatus};

use crate::engine::{check_runs, EngineError};

use crate::handshake::MemRegion;
use crate::memory::{MemKind, Region};

use super::memory::{mem_type, HostMemory, InFlight};
use super::{
    available, nixl_error, NixlEngine, NixlOptions, NixlPath, NixlPending, XferKind, BACKEND,
};

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
        let regions = buffers.into_iter().map(Region::owned).collect();
        Self::register(name, regions, options)
    }

    /// An engine named `name` registering `regions`, one per local buffer: owned ones
    /// ([`Region::owned`]) or the caller's host or device memory ([`Region::from_raw`]; device
    /// memory needs a NIXL built with GPU support, and the UCX transport to reach it), with
    /// `options`. Each region is registered once, here. Refused, never an abort, when the NIXL
    /// library is not loaded ([`available`]) or a region is empty.
    pub fn register(
        name: &str,
        regions: Vec<Region<'static>>,
        options: &NixlOptions,
    ) -> Result<Self, EngineError> {
        available().map_err(|why| EngineError::Transport(format!("nixl: {why}")))?;
        if let Some(i) = regions.iter().position(Region::is_empty) {
            return Err(EngineError::Transport(format!(
                "nixl: buffer {i} is empty; NIXL registers no empty region"
            )));
        }
        let memory = Arc::new(HostMemory { buffers: regions });
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
            prepared: HashMap::new(),
            in_flight: Arc::new(AtomicUsize::new(0)),
            _regs: regs,
            backend,
            agent,
            memory,
        })
    }

    /// Transfers this engine posted that have not finished.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    pub(super) fn idle(&self, what: &str) -> Result<(), EngineError> {
        match self.in_flight() {
            0 => Ok(()),
            n => Err(EngineError::Transport(format!(
                "nixl: {what} refused: {n} transfer(s) in flight (wait for, cancel or drop them)"
            ))),
        }
    }

    /// Replaces the local buffers' contents (each of the same length); refused while a
    /// transfer this engine posted is in flight.
    pub fn set_buffers(&mut self, bytes: &[Vec<u8>]) -> Result<(), EngineError> {
        self.idle("replacing the buffers")?;
        let bufs = &self.memory.buffers;
        if bytes.len() != bufs.len() || bytes.iter().zip(bufs).any(|(a, b)| a.len() != b.len()) {
            return Err(EngineError::Transport("buffer shapes differ".into()));
        }
        self.memory.write(bytes)
    }

    /// Posts writing `runs` (`src_*` in the local buffers, `dst_*` in the peer's); the peer
    /// receives `notify` once the data is in its memory.
    pub fn post_write(
        &mut self,
        peer: &str,
        runs: &[CopyRun],
        notify: &[u8],
    ) -> Result<NixlPending, EngineError> {
        self.post(XferKind::Write, peer, runs, notify, true)
    }

    /// Posts reading `runs` like [`crate::engine::TransferEngine::post_read`], from fresh
    /// descriptor lists even where prepared ones would serve: to compare the two paths.
    pub fn post_read_listed(
        &mut self,
        peer: &str,
        runs: &[CopyRun],
        notify: &[u8],
    ) -> Result<NixlPending, EngineError> {
        self.post(XferKind::Read, peer, runs, notify, false)
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

    /// Forgets peer `name`: its prepared lists are released, its metadata is invalidated (its
    /// connection closed) and its regions dropped. Needed after a peer died, before it can be
    /// added again.
    pub fn remove_peer(&mut self, name: &str) -> Result<(), EngineError> {
        self.prepared.remove(name);
        if self.peers.remove(name).is_none() {
            return Err(EngineError::UnknownPeer(name.to_string()));
        }
        self.agent
            .invalidate_remote_md(name)
            .map_err(|e| nixl_error("invalidate_remote_md", e))
    }

    pub(super) fn post(
        &mut self,
        kind: XferKind,
        peer: &str,
        runs: &[CopyRun],
        notify: &[u8],
        allow_prepared: bool,
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
        let local_kind = one_kind(
            "local",
            sides.iter().filter(|s| s.4 > 0).map(|s| {
                let b = self.memory.buffers.get(s.0 as usize);
                b.map_or(MemKind::Host, Region::kind)
            }),
        )?;
        let remote_kind = one_kind(
            peer,
            sides.iter().filter(|s| s.4 > 0).map(|s| {
                let r = regions.get(s.2 as usize).and_then(|r| r.device);
                r.map_or(MemKind::Host, |id| MemKind::Device { id })
            }),
        )?;
        let descriptors = sides.iter().filter(|s| s.4 > 0).count();
        let memory = Arc::clone(&self.memory);
        let mut pending = NixlPending {
            req: None,
            in_flight: None,
            outcome: None,
            memory,
            kind,
            peer: peer.to_string(),
            runs: runs.to_vec(),
            path: NixlPath::Listed {
                descriptors: 0,
                why: "nothing to move".into(),
            },
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
        let prepared = if allow_prepared {
            self.prepared_indices(peer, &sides)
        } else {
            Err("the prepared path is not allowed for this transfer".into())
        };
        let req = match prepared {
            Ok((p, local, remote)) => {
                pending.path = NixlPath::Prepared {
                    entries: local.len(),
                };
                self.agent
                    .make_xfer_req(op, &p.local.0, &local, &p.remote.0, &remote, Some(&opt))
                    .map_err(|e| nixl_error("make_xfer_req", e))?
            }
            Err(why) => {
                pending.path = NixlPath::Listed { descriptors, why };
                let (local, remote) =
                    self.descriptor_lists(peer, regions, &sides, local_kind, remote_kind)?;
                self.agent
                    .create_xfer_req(op, &local, &remote, peer, Some(&opt))
                    .map_err(|e| nixl_error("create_xfer_req", e))?
            }
        };
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

    /// Fresh local and remote descriptor lists of `sides` (runs already checked against both
    /// sides' registered lengths), one descriptor per run of bytes.
    fn descriptor_lists(
        &self,
        peer: &str,
        regions: &[MemRegion],
        sides: &[(u32, u64, u32, u64, u64)],
        local_kind: MemKind,
        remote_kind: MemKind,
    ) -> Result<(XferDescList<'static>, XferDescList<'static>), EngineError> {
        let dlist = |kind| XferDescList::new(mem_type(kind)).map_err(|e| nixl_error("dlist", e));
        let (mut local, mut remote) = (dlist(local_kind)?, dlist(remote_kind)?);
        let device = |kind| match kind {
            MemKind::Host => 0,
            MemKind::Device { id } => id,
        };
        let (local_dev, remote_dev) = (device(local_kind), device(remote_kind));
        for &(lb, lo, rb, ro, len) in sides.iter().filter(|s| s.4 > 0) {
            // Inside both registered regions (checked before), so the buffers exist and the
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
                    "nixl: run of {len} bytes at remote buffer {rb} offset {ro} of {peer:?} has \
                     no address on this machine"
                )));
            };
            local.add_desc(l, n, local_dev);
            remote.add_desc(r, n, remote_dev);
        }
        Ok((local, remote))
    }
}

/// The one memory kind of `kinds` (one transfer's runs on one side), refused where they mix:
/// NIXL's descriptor list has one memory type.
fn one_kind(side: &str, mut kinds: impl Iterator<Item = MemKind>) -> Result<MemKind, EngineError> {
    let Some(first) = kinds.next() else {
        return Ok(MemKind::Host);
    };
    match kinds.find(|k| *k != first) {
        None => Ok(first),
        Some(other) => Err(EngineError::Transport(format!(
            "nixl: one transfer's {side} runs span {first:?} and {other:?} memory; post one \
             transfer per memory kind"
        ))),
    }
}
