//! The memcpy engine on memory its caller owns: a scope lends the caller's slices and takes
//! them back (even from an engine moved out of the scope, and from its peers), device memory
//! is refused, local reads past a buffer are refused, and a staged plan placed after the
//! cache (`stage_at`) receives into the caller's staging area in the same engine.

#[path = "shared/scenario.rs"]
mod scenario;

use std::time::Duration;

use kvlayout_connector::engine::{EngineError, MemcpyEngine, TransferEngine};
use kvlayout_connector::memory::{MemKind, Region};
use kvlayout_connector::plan::plan_pull;
use kvlayout_connector::staged::plan_pull_staged;
use kvlayout_connector::{execute, Plan, ReceiveError, StagedTransfer};

use scenario::{d_layout, group, p_layout, pattern, seqs, zeros};

const TIMEOUT: Duration = Duration::from_secs(10);

/// The reference: `plan` run by engines owning their buffers.
fn owned_pull(tag: &str, src: Vec<Vec<u8>>, dst: Vec<Vec<u8>>, plan: Plan<'_>) -> Vec<Vec<u8>> {
    let (p, d) = (format!("{tag}-ref-src"), format!("{tag}-ref-dst"));
    let from = MemcpyEngine::new(&p, src).unwrap();
    let mut to = MemcpyEngine::new(&d, dst).unwrap();
    to.add_peer(&p, p.as_bytes(), &from.regions()).unwrap();
    execute(&mut to, plan, &[&p], b"", TIMEOUT).unwrap();
    to.buffers().unwrap()
}

#[test]
fn a_scope_lends_the_callers_bytes_and_they_hold_the_pull_after_it() {
    let (p, d) = (p_layout(), d_layout());
    let prefill_bytes = pattern(&p, 7);
    let prefill = MemcpyEngine::new("cm-direct-prefill", prefill_bytes.clone()).unwrap();
    let p_group = group(&p, 1, 0, prefill.regions());
    for rank in 0..2 {
        let mine = group(&d, 2, rank, Vec::new());
        let plan = plan_pull(&mine, std::slice::from_ref(&p_group), &seqs()).unwrap();
        let mut cache = zeros(&d).remove(0);
        let name = format!("cm-direct-decode-{rank}");
        MemcpyEngine::scope(&name, vec![Region::host(&mut cache)], |e| {
            e.add_peer(
                "cm-direct-prefill",
                b"cm-direct-prefill",
                &prefill.regions(),
            )?;
            execute(e, Plan::Direct(&plan), &["cm-direct-prefill"], b"", TIMEOUT)
                .map_err(|e| EngineError::Transport(e.to_string()))
        })
        .unwrap()
        .unwrap();
        let want = owned_pull(
            &format!("cm-direct-{rank}"),
            prefill_bytes.clone(),
            zeros(&d),
            Plan::Direct(&plan),
        );
        assert!(
            cache == want[0],
            "rank {rank}: the caller's bytes hold the pull"
        );
        assert!(cache.iter().any(|&b| b != 0), "rank {rank}");
    }
}

#[test]
fn memory_lent_to_a_scope_is_unreachable_after_it_ends() {
    let mut lent = vec![5u8; 64];
    let mut reader = MemcpyEngine::new("cm-after-reader", vec![vec![0; 64]]).unwrap();
    // The closure moves the scoped engine out, a peer keeps reading from it: neither reaches
    // the caller's bytes once the scope has ended.
    let escaped = MemcpyEngine::scope("cm-after-lender", vec![Region::host(&mut lent)], |e| {
        reader
            .add_peer("cm-after-lender", b"cm-after-lender", &e.regions())
            .unwrap();
        let run = kvlayout::ops::CopyRun {
            src_buffer: 0,
            src_offset: 0,
            dst_buffer: 0,
            dst_offset: 0,
            len: 64,
        };
        reader.post_read("cm-after-lender", &[run], b"").unwrap();
        let stand_in = MemcpyEngine::new("cm-after-stand-in", Vec::new()).unwrap();
        std::mem::replace(e, stand_in)
    })
    .unwrap();
    assert_eq!(
        reader.buffers().unwrap(),
        vec![vec![5u8; 64]],
        "read inside"
    );
    assert_eq!(escaped.buffers().unwrap(), Vec::<Vec<u8>>::new());
    assert!(escaped.regions().is_empty());
    let run = kvlayout::ops::CopyRun {
        src_buffer: 0,
        src_offset: 0,
        dst_buffer: 0,
        dst_offset: 0,
        len: 8,
    };
    let err = reader
        .post_read("cm-after-lender", &[run], b"")
        .unwrap_err();
    assert!(
        err.to_string().contains("no longer registers its memory"),
        "{err}"
    );
    lent[0] = 6; // the borrow ended: the caller's bytes are its own again
    assert_eq!(lent[..2], [6, 5]);
}

#[test]
fn device_memory_is_refused_by_the_memcpy_engine() {
    let mut bytes = vec![0u8; 16];
    // SAFETY: the region is refused before anything reads it; `bytes` outlives the call.
    let region = unsafe { Region::from_raw(bytes.as_mut_ptr(), 16, MemKind::Device { id: 1 }) };
    let err = MemcpyEngine::register("cm-device", vec![region]).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("region 0 is Device { id: 1 } memory") && text.contains("host memory only"),
        "{text}"
    );
}

#[test]
fn local_reads_past_a_buffer_are_refused_with_its_length() {
    let e = MemcpyEngine::new("cm-read-local", vec![vec![1, 2, 3], vec![4; 10]]).unwrap();
    assert_eq!(e.read_local(1, 4).unwrap(), vec![4; 4]);
    assert_eq!(e.read_local(0, 3).unwrap(), vec![1, 2, 3]);
    let too_long = e.read_local(0, 4).unwrap_err();
    assert_eq!(
        too_long,
        EngineError::OutOfRegion {
            side: "local".into(),
            buffer: 0,
            offset: 0,
            len: 4,
            registered: 3
        }
    );
    let missing = e.read_local(2, 1).unwrap_err();
    assert!(matches!(
        missing,
        EngineError::OutOfRegion {
            buffer: 2,
            registered: 0,
            ..
        }
    ));
}

#[test]
fn a_staged_plan_placed_after_the_cache_receives_into_the_callers_staging_area() {
    let (p, d) = (p_layout(), d_layout());
    let prefill_bytes = pattern(&p, 11);
    let prefill = MemcpyEngine::new("cm-staged-prefill", prefill_bytes.clone()).unwrap();
    let p_group = group(&p, 1, 0, prefill.regions());
    let mine = group(&d, 2, 1, Vec::new());
    let at_zero = plan_pull_staged(&mine, std::slice::from_ref(&p_group), &seqs()).unwrap();
    let staged = at_zero.clone().stage_at(1).unwrap();
    assert_eq!(staged.staging_buffer, 1);
    assert_eq!(staged.descriptors(), at_zero.descriptors());
    for (a, b) in at_zero.transfers.iter().zip(&staged.transfers) {
        for (x, y) in a.runs.iter().zip(&b.runs) {
            assert_eq!(
                (y.dst_buffer, y.dst_offset),
                (x.dst_buffer + 1, x.dst_offset)
            );
            assert_eq!(
                (y.src_buffer, y.src_offset, y.len),
                (x.src_buffer, x.src_offset, x.len)
            );
        }
    }
    // Back to 0 is the plan at 0.
    assert_eq!(staged.clone().stage_at(0).unwrap(), at_zero);
    // One staging buffer: the last index fits.
    assert_eq!(
        at_zero.clone().stage_at(u32::MAX).unwrap().staging_buffer,
        u32::MAX
    );

    let extents = staged.staging_extents();
    let mut cache = zeros(&d).remove(0);
    let mut staging = vec![0u8; extents[0] as usize];
    let mut received = Vec::new();
    let regions = vec![Region::host(&mut cache), Region::host(&mut staging)];
    MemcpyEngine::scope("cm-staged-decode", regions, |e| {
        e.add_peer(
            "cm-staged-prefill",
            b"cm-staged-prefill",
            &prefill.regions(),
        )
        .unwrap();
        let mut keep = |_: &StagedTransfer, bytes: &[Vec<u8>]| -> Result<(), ReceiveError> {
            received.push(bytes.to_vec());
            Ok(())
        };
        let plan = Plan::Staged(&staged, &mut keep);
        execute(e, plan, &["cm-staged-prefill"], b"", TIMEOUT).unwrap();
    })
    .unwrap();
    assert!(
        cache.iter().all(|&b| b == 0),
        "the cache is not a staging buffer"
    );
    // The reference: the plan at buffer 0, received by an engine owning its staging buffer.
    let mut want = Vec::new();
    let mut keep = |_: &StagedTransfer, bytes: &[Vec<u8>]| -> Result<(), ReceiveError> {
        want.push(bytes.to_vec());
        Ok(())
    };
    owned_pull(
        "cm-staged",
        prefill_bytes,
        vec![vec![0; extents[0] as usize]],
        Plan::Staged(&at_zero, &mut keep),
    );
    assert_eq!(received, want);
    assert!(received[0][0].iter().any(|&b| b != 0));
    assert!(staging[..received[0][0].len()] == received[0][0][..]);
}

#[test]
fn a_staging_area_too_short_is_refused_with_its_length() {
    let (p, d) = (p_layout(), d_layout());
    let prefill = MemcpyEngine::new("cm-short-prefill", pattern(&p, 1)).unwrap();
    let p_group = group(&p, 1, 0, prefill.regions());
    let mine = group(&d, 2, 0, Vec::new());
    let staged = plan_pull_staged(&mine, std::slice::from_ref(&p_group), &seqs())
        .unwrap()
        .stage_at(1)
        .unwrap();
    let need = staged.staging_extents()[0];
    let mut e = MemcpyEngine::new(
        "cm-short-decode",
        vec![vec![0; 8], vec![0; need as usize - 1]],
    )
    .unwrap();
    e.add_peer("cm-short-prefill", b"cm-short-prefill", &prefill.regions())
        .unwrap();
    let mut never = |_: &StagedTransfer, _: &[Vec<u8>]| -> Result<(), ReceiveError> {
        panic!("nothing is received")
    };
    let err = execute(
        &mut e,
        Plan::Staged(&staged, &mut never),
        &["cm-short-prefill"],
        b"",
        TIMEOUT,
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&format!("registered {}", need - 1)) && text.contains("local buffer 1"),
        "{text}"
    );
}
