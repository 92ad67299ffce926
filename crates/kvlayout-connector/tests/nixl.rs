//! The NIXL engine against the NIXL library (PyPI wheel nixl-cu12, unpacked by
//! scripts/setup.sh; `LD_LIBRARY_PATH=$(scripts/nixl-path.sh)`, `UCX_NET_DEVICES=lo`).
//!
//! - In one process: READs and WRITEs of a plan's runs (prefill TP 1 NHD 16-token blocks to
//!   decode TP 2 HND 32-token padded blocks) land exactly where the memcpy engine puts them,
//!   with their notifications; runs outside either side's registered memory (a buffer too
//!   small for its layout included) are refused before anything is posted; hostile agent
//!   metadata is refused. Memory the caller owns (a pointer and a length) is registered in
//!   place, for a direct pull and for a staged one whose staging area follows the cache in
//!   the same engine; a CUDA cache's device memory where a GPU is present (else
//!   `skipped: nixl device memory: no CUDA device`). Prepared descriptor lists: a plan of whole
//!   entries is made from indices and lands where both layouts put each element, one that is
//!   not falls back to fresh lists and says why, and the lists go with the peer.
//! - Two processes on loopback: this binary re-runs itself as the prefill peer (the variable
//!   `KVLAYOUT_NIXL_ROLE` makes the same test act as the child); the handshake and the agent
//!   metadata travel over TCP on 127.0.0.1. The decode side pulls with `execute` (rank 0
//!   directly, rank 1 staged), decodes, and matches the prefill side's reference bit for bit.
//!   The peer killed mid-transfer: an error within the timeout, and the blocks not received
//!   are named, by `blocks_written` and by `execute`'s error. A hostile handshake is refused.
//! - Under load: four prefill peer processes (NHD/16, HND/16, a TP 2 pair of padded NHD/32
//!   pages) and two decode ranks pull random requests, several in flight, each checked element
//!   by element, for `KVLAYOUT_SOAK_SECS` (3 s by default); one peer is killed midway and its
//!   pulls name their blocks; restarted with another order, its connect is refused.
//!
//! Without the library each test that needs it reports `skipped: nixl: <why>`, unless
//! `KVLAYOUT_REQUIRE_NIXL=1` (scripts/test.sh), which fails it. Every test is named `nixl_*`:
//! scripts/test.sh skips them in the workspace run and runs this binary on its own, with
//! `--test-threads=1`. Every child process is killed and reaped, every wait bounded.

#[path = "nixl/common.rs"]
mod common;
#[path = "nixl/memory.rs"]
mod memory;
#[path = "nixl/one_process.rs"]
mod one_process;
#[path = "nixl/prepared.rs"]
mod prepared;
#[path = "nixl/process.rs"]
mod process;
#[path = "shared/scenario.rs"]
mod scenario;
#[path = "nixl/soak.rs"]
mod soak;
#[path = "nixl/soak_cache.rs"]
mod soak_cache;
#[path = "nixl/soak_peers.rs"]
mod soak_peers;
#[path = "nixl/socket.rs"]
mod socket;
#[path = "nixl/two_processes.rs"]
mod two_processes;

// The tests are declared here, at the root, so that their names carry no module path: the
// two-process tests re-run this binary with `--exact <test name>`. Their bodies live in the
// modules, under the same names.

#[test]
fn nixl_engine_registers_host_memory_the_caller_owns() {
    memory::nixl_engine_registers_host_memory_the_caller_owns();
}

#[test]
fn nixl_engine_registers_device_memory() {
    memory::nixl_engine_registers_device_memory();
}

#[test]
fn nixl_read_of_a_plan_lands_where_memcpy_puts_it_with_notifications() {
    one_process::nixl_read_of_a_plan_lands_where_memcpy_puts_it_with_notifications();
}

#[test]
fn nixl_write_of_a_plan_lands_where_memcpy_puts_it_with_a_notification() {
    one_process::nixl_write_of_a_plan_lands_where_memcpy_puts_it_with_a_notification();
}

#[test]
fn nixl_runs_outside_registered_memory_are_refused_before_posting() {
    one_process::nixl_runs_outside_registered_memory_are_refused_before_posting();
}

#[test]
fn nixl_hostile_agent_metadata_is_refused() {
    one_process::nixl_hostile_agent_metadata_is_refused();
}

#[test]
fn nixl_prepared_path_moves_every_element_where_both_layouts_put_it() {
    prepared::nixl_prepared_path_moves_every_element_where_both_layouts_put_it();
}

#[test]
fn nixl_runs_not_expressible_as_entries_fall_back_and_say_so() {
    prepared::nixl_runs_not_expressible_as_entries_fall_back_and_say_so();
}

#[test]
fn nixl_prepared_lists_are_released_with_the_peer() {
    prepared::nixl_prepared_lists_are_released_with_the_peer();
}

#[test]
fn nixl_two_processes_prefill_tp1_to_decode_tp2_match_the_reference() {
    two_processes::nixl_two_processes_prefill_tp1_to_decode_tp2_match_the_reference();
}

#[test]
fn nixl_peer_killed_mid_transfer_is_an_error_within_the_timeout() {
    two_processes::nixl_peer_killed_mid_transfer_is_an_error_within_the_timeout();
}

#[test]
fn nixl_hostile_handshakes_over_a_socket_are_refused() {
    socket::nixl_hostile_handshakes_over_a_socket_are_refused();
}

#[test]
fn nixl_soak_four_prefill_peers_two_decode_ranks_under_load() {
    soak::nixl_soak_four_prefill_peers_two_decode_ranks_under_load();
}

/// Without the library (the workspace run of scripts/test.sh, whose `LD_LIBRARY_PATH` lacks
/// NIXL's folders): `available` names the library and the loader's reason, and an engine is
/// refused with a typed error, never an abort. Not named `nixl_*`, so it runs there and not in
/// the NIXL run; where the library loads, a visible skip.
#[test]
fn without_the_library_an_engine_is_refused_with_the_reason() {
    use kvlayout_connector::engine::EngineError;
    use kvlayout_connector::nixl::{self, NixlEngine};
    let Err(why) = nixl::available() else {
        common::report("skipped: nixl absent: the library loads in this process");
        return;
    };
    assert!(why.contains("libnixl_capi.so"), "{why}");
    assert!(why.contains("scripts/nixl-path.sh"), "{why}");
    match NixlEngine::new("absent", vec![vec![0u8; 64]]) {
        Err(EngineError::Transport(e)) => assert!(e.contains(&why), "{e}"),
        Err(e) => panic!("another error than the library's absence: {e}"),
        Ok(_) => panic!("an engine without the library"),
    }
}
