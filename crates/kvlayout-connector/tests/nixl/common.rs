//! Shared by the NIXL tests: the constants and the child-role switch, reporting (and the
//! skip without the library), the layouts, caches, reference decode and decode-rank pull (as
//! in tests/end_to_end.rs), the memcpy reference and notification polling.

use std::io::Write;
use std::time::{Duration, Instant};

use kvlayout_connector::engine::{MemcpyEngine, TransferEngine};
use kvlayout_connector::handshake::{check_compatible, CacheGroup};
use kvlayout_connector::nixl::{self, NixlEngine};
use kvlayout_connector::plan::{plan_pull, SeqBlocks, TransferPlan};
use kvlayout_connector::{execute, Plan};

/// Selects a child role in a re-run of this binary.
pub(crate) const ROLE: &str = "KVLAYOUT_NIXL_ROLE";
/// The parent's TCP port, for a child.
pub(crate) const PORT: &str = "KVLAYOUT_NIXL_PORT";
/// Bound on every wait for a transfer.
pub(crate) const XFER_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on every socket read and on a child's start.
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(60);
/// A child exits after this, whatever happens.
pub(crate) const CHILD_LIFETIME: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------
// Reporting
// ---------------------------------------------------------------------------------------

/// Writes `line` straight to stderr, past the harness's capture, in one write.
pub(crate) fn report(line: &str) {
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("{line}\n").as_bytes());
}

/// Whether the NIXL library loaded; if not, reports `skipped: nixl: <why>` (a failure when
/// `KVLAYOUT_REQUIRE_NIXL=1`). `nixl::available` calls `nixl_sys::is_stub` before anything.
pub(crate) fn nixl_ready() -> bool {
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

pub(crate) fn role() -> Option<String> {
    std::env::var(ROLE).ok()
}

// The scenario's layouts, caches, reference decode and decode-rank pull (shared with
// tests/end_to_end.rs).
pub(crate) use crate::scenario::{
    assert_rank_matches, d_layout, group, p_layout, p_tables, pattern, prefill, pull_and_decode,
    seqs, zeros,
};

/// The plan for a decode rank (group `local`) to pull `seqs` from a TP 1 prefill group.
pub(crate) fn plan_for(
    local: &CacheGroup,
    remote: &CacheGroup,
    seqs: &[SeqBlocks],
) -> TransferPlan {
    check_compatible(local, remote).unwrap();
    plan_pull(local, std::slice::from_ref(remote), seqs).unwrap()
}

/// The memcpy engine's result of running `plan` from `src` into `dst`: the reference for
/// where NIXL must put the bytes.
pub(crate) fn memcpy_read(
    tag: &str,
    src: Vec<Vec<u8>>,
    dst: Vec<Vec<u8>>,
    plan: &TransferPlan,
) -> Vec<Vec<u8>> {
    let (p, d) = (format!("{tag}-memcpy-src"), format!("{tag}-memcpy-dst"));
    let from = MemcpyEngine::new(&p, src).unwrap();
    let mut to = MemcpyEngine::new(&d, dst).unwrap();
    to.add_peer(&p, p.as_bytes(), &from.regions()).unwrap();
    execute(&mut to, Plan::Direct(plan), &[&p], b"", XFER_TIMEOUT).unwrap();
    to.buffers().unwrap()
}

/// Notifications of `engine` until `want` arrived or `timeout` passed.
pub(crate) fn notifications(
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
