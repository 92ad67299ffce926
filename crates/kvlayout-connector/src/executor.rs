//! Running a plan: [`execute`] carries a direct or a staged plan to completion on a
//! [`TransferEngine`], or returns an [`ExecuteError`] naming the local blocks and heads not
//! received.
//!
//! Peers are added beforehand ([`TransferEngine::add_peer`]), one engine id per remote TP
//! rank. Every peer is looked up before anything is posted. A direct plan posts one read per
//! remote rank, all at once, then waits for each in turn. A staged plan runs its transfers one
//! after another, because they share the engine's local memory: each reads into it (the
//! staging cache), then hands its bytes to the post-receive operation ([`PostReceive`], such
//! as [`Scatter`](crate::staged::Scatter) on a backend). One timeout bounds every wait of the
//! plan; the post-receive operation runs unbounded.

use std::fmt;
use std::ops::Range;
use std::time::{Duration, Instant};

use kvlayout::ops::{CopyRun, RunSet};

use crate::compact::{CompactPlan, CompactTransfer};

use crate::engine::{wait, EngineError, TransferEngine};
use crate::plan::{RankTransfer, TransferPlan};
use crate::staged::{PostReceive, ReceiveError, StagedPlan, StagedTransfer};

/// The plan [`execute`] runs.
pub enum Plan<'a> {
    /// Every byte into its place in the engine's local buffers, which hold the local cache.
    Direct(&'a TransferPlan),
    /// The same, held compactly ([`CompactPlan`]): the engine reads each [`RunSet`] directly
    /// ([`TransferEngine::post_read_set`]).
    Compact(&'a CompactPlan),
    /// Each transfer into the engine's local buffers from [`StagedPlan::staging_buffer`] on,
    /// which hold the staging cache (at least [`StagedPlan::staging_extents`] long), then into
    /// the local cache by the post-receive operation.
    Staged(&'a StagedPlan, &'a mut dyn PostReceive),
}

/// Why a plan did not complete.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Cause {
    /// A remote rank the plan reads has no engine id; nothing was posted.
    #[error("remote rank {rank} has no peer: {peers} engine ids given, one per remote TP rank")]
    NoPeer {
        /// The remote rank.
        rank: u64,
        /// Engine ids given.
        peers: usize,
    },
    /// The engine refused a read, failed it, or did not complete it in time; or its local
    /// memory is shorter than a staging buffer (`OutOfRegion` on the `local` side).
    #[error("remote rank {rank}: {error}")]
    Engine {
        /// The remote rank read.
        rank: u64,
        /// The engine's error.
        error: EngineError,
    },
    /// A staged plan was given a post-receive operation that receives nothing
    /// ([`crate::NoPostReceive`]); nothing was posted.
    #[error("a staged plan needs a post-receive operation (scatter_blocks on a backend); nothing was posted")]
    NoPostReceive,
    /// The post-receive operation failed.
    #[error("remote rank {rank}: post-receive: {error}")]
    PostReceive {
        /// The remote rank whose staging cache was being received.
        rank: u64,
        /// Its error.
        error: ReceiveError,
    },
}

/// A plan that did not complete: why, and the local blocks and heads not received. Their
/// bytes must not be used: a read that failed, timed out or was dropped in flight may have
/// written part of them, and so may a failed post-receive operation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "{cause}; {} local blocks not received in heads {}: {}",
    blocks.len(),
    Heads(heads),
    Blocks(blocks)
)]
pub struct ExecuteError {
    /// Why (boxed, so that a `Result` carrying the error stays small).
    pub cause: Box<Cause>,
    /// The local blocks not received in `heads`, ascending.
    pub blocks: Vec<u64>,
    /// The local heads not received, as ascending disjoint ranges.
    pub heads: Vec<Range<u64>>,
}

/// Runs of a read: a flat list or a [`RunSet`].
enum LegRuns<'p> {
    Flat(&'p [CopyRun]),
    Set(&'p RunSet),
}

/// One remote rank's read: its runs and the local heads they fill.
struct Leg<'p> {
    rank: u64,
    runs: LegRuns<'p>,
    heads: Range<u64>,
}

impl<'p> Leg<'p> {
    /// The read of a direct plan's transfer.
    fn direct(t: &'p RankTransfer) -> Self {
        let (rank, runs, heads) = (t.remote_rank, LegRuns::Flat(&t.runs), t.local_heads());
        Leg { rank, runs, heads }
    }

    /// The read of a compact plan's transfer.
    fn compact(t: &'p CompactTransfer) -> Self {
        let heads = t.local_head0..t.local_head0 + (t.remote_heads.end - t.remote_heads.start);
        let (rank, runs) = (t.remote_rank, LegRuns::Set(&t.runs));
        Leg { rank, runs, heads }
    }

    /// The read of a staged plan's transfer (into the staging cache).
    fn staged(t: &'p StagedTransfer) -> Self {
        let (rank, runs, heads) = (t.remote_rank, LegRuns::Flat(&t.runs), t.local_heads.clone());
        Leg { rank, runs, heads }
    }
}

/// A timeout for the whole plan.
struct Deadline {
    start: Instant,
    timeout: Duration,
}

impl Deadline {
    /// The time left.
    fn left(&self) -> Duration {
        self.timeout.saturating_sub(self.start.elapsed())
    }

    /// `e`, its timeout stated as the plan's.
    fn restate(&self, e: EngineError) -> EngineError {
        match e {
            EngineError::Timeout(_) => EngineError::Timeout(self.timeout),
            e => e,
        }
    }
}

/// Runs `plan` on `engine` to completion: reads from `peers[r]`, the engine id of remote TP
/// rank `r`, each read notifying its peer with `notify`, every wait within `timeout` in all.
/// A staged plan's post-receive operation runs after each transfer's read.
pub fn execute<E: TransferEngine>(
    engine: &mut E,
    plan: Plan<'_>,
    peers: &[&str],
    notify: &[u8],
    timeout: Duration,
) -> Result<(), ExecuteError> {
    let deadline = Deadline {
        start: Instant::now(),
        timeout,
    };
    let (legs, blocks): (Vec<Leg>, Vec<u64>) = match plan {
        Plan::Direct(p) => (
            p.transfers.iter().map(Leg::direct).collect(),
            p.local_blocks.clone(),
        ),
        Plan::Compact(p) => (
            p.transfers.iter().map(Leg::compact).collect(),
            p.local_blocks.clone(),
        ),
        Plan::Staged(p, _) => (
            p.transfers.iter().map(Leg::staged).collect(),
            p.local_blocks(),
        ),
    };
    check_peers(&legs, peers).map_err(|cause| not_received(cause, &blocks, &legs))?;
    if matches!(&plan, Plan::Staged(_, post) if !post.receives()) {
        return Err(not_received(Cause::NoPostReceive, &blocks, &legs));
    }
    let Plan::Staged(p, post) = plan else {
        return read(engine, &legs, peers, notify, &deadline)
            .map_err(|(from, cause)| not_received(cause, &blocks, &legs[from..]));
    };
    for (i, t) in p.transfers.iter().enumerate() {
        let fail = |cause| not_received(cause, &blocks, &legs[i..]);
        read(engine, &legs[i..=i], peers, notify, &deadline).map_err(|(_, c)| fail(c))?;
        let staging = staging_bytes(engine, t, p.staging_buffer).map_err(fail)?;
        post.receive(t, &staging).map_err(|error| {
            fail(Cause::PostReceive {
                rank: t.remote_rank,
                error,
            })
        })?;
    }
    Ok(())
}

/// The error for `cause` when `legs` did not complete: the plan's `blocks` in their heads.
fn not_received(cause: Cause, blocks: &[u64], legs: &[Leg]) -> ExecuteError {
    let mut heads: Vec<Range<u64>> = legs.iter().map(|l| l.heads.clone()).collect();
    heads.sort_by_key(|h| h.start);
    let mut merged: Vec<Range<u64>> = Vec::with_capacity(heads.len());
    for h in heads {
        match merged.last_mut() {
            Some(last) if h.start <= last.end => last.end = last.end.max(h.end),
            _ => merged.push(h),
        }
    }
    ExecuteError {
        cause: Box::new(cause),
        blocks: blocks.to_vec(),
        heads: merged,
    }
}

/// The engine id of remote rank `rank`.
fn peer<'a>(rank: u64, peers: &[&'a str]) -> Result<&'a str, Cause> {
    usize::try_from(rank)
        .ok()
        .and_then(|r| peers.get(r).copied())
        .ok_or(Cause::NoPeer {
            rank,
            peers: peers.len(),
        })
}

/// Every leg's remote rank has an engine id.
fn check_peers(legs: &[Leg], peers: &[&str]) -> Result<(), Cause> {
    legs.iter().try_for_each(|l| peer(l.rank, peers).map(drop))
}

/// Posts every leg's read, then waits for each in turn. On failure: the index of the first leg
/// not complete (none after it is either), and why.
fn read<E: TransferEngine>(
    engine: &mut E,
    legs: &[Leg],
    peers: &[&str],
    notify: &[u8],
    deadline: &Deadline,
) -> Result<(), (usize, Cause)> {
    let names = legs
        .iter()
        .map(|l| peer(l.rank, peers))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|c| (0, c))?;
    let mut posted = Vec::with_capacity(legs.len());
    for (leg, from) in legs.iter().zip(names) {
        let post = match leg.runs {
            LegRuns::Flat(runs) => engine.post_read(from, runs, notify),
            LegRuns::Set(set) => engine.post_read_set(from, set, notify),
        };
        let pending = post.map_err(|error| {
            let rank = leg.rank;
            (0, Cause::Engine { rank, error })
        })?;
        posted.push(pending);
    }
    // Pendings not waited for are dropped on return: for the engine, cancelled.
    for (i, (leg, mut pending)) in legs.iter().zip(posted).enumerate() {
        wait(engine, &mut pending, deadline.left()).map_err(|e| {
            let error = deadline.restate(e);
            (
                i,
                Cause::Engine {
                    rank: leg.rank,
                    error,
                },
            )
        })?;
    }
    Ok(())
}

/// The staging bytes of `t`, read from the engine's local buffers `first..` (each cut to its
/// staging span), refused where one is shorter or missing.
fn staging_bytes<E: TransferEngine>(
    engine: &E,
    t: &StagedTransfer,
    first: u32,
) -> Result<Vec<Vec<u8>>, Cause> {
    let rank = t.remote_rank;
    let engine_error = |error| Cause::Engine { rank, error };
    let mut out = Vec::new();
    for (i, x) in t.staging.extents().iter().enumerate() {
        let buffer = u32::try_from(i)
            .ok()
            .and_then(|i| i.checked_add(first))
            .unwrap_or(u32::MAX);
        out.push(engine.read_local(buffer, x.end).map_err(engine_error)?);
    }
    Ok(out)
}

/// Heads as `0..2, 3..4`.
struct Heads<'a>(&'a [Range<u64>]);

impl fmt::Display for Heads<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text: Vec<String> = self.0.iter().map(|h| format!("{h:?}")).collect();
        f.write_str(&text.join(", "))
    }
}

/// Ascending block ids as ranges of consecutive ids (`2, 5..7`), the first [`Blocks::SHOWN`]
/// of them.
struct Blocks<'a>(&'a [u64]);

impl Blocks<'_> {
    /// Ranges shown.
    const SHOWN: usize = 8;
}

impl fmt::Display for Blocks<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ranges: Vec<Range<u64>> = Vec::new();
        for &b in self.0 {
            match ranges.last_mut() {
                Some(last) if last.end == b => last.end = b.saturating_add(1),
                _ => ranges.push(b..b.saturating_add(1)),
            }
        }
        if ranges.is_empty() {
            return f.write_str("none");
        }
        let text: Vec<String> = ranges
            .iter()
            .take(Self::SHOWN)
            .map(|r| match r.end - r.start {
                1 => r.start.to_string(),
                _ => format!("{r:?}"),
            })
            .collect();
        f.write_str(&text.join(", "))?;
        if ranges.len() > Self::SHOWN {
            write!(f, ", ... ({} ranges)", ranges.len())?;
        }
        Ok(())
    }
}
