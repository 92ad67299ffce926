//! The entry points `plan` and `Pull::execute`: `Auto` takes the plan with fewer descriptors
//! and says why, the modes that name a plan return it, refusals carry the planner's reason,
//! and executing a pull leaves what `execute` on the plan leaves.

#[path = "shared/scenario.rs"]
mod scenario;

use std::time::Duration;

use kvlayout_connector::{
    execute, plan, plan_pull, plan_pull_staged, MemcpyEngine, NoPostReceive, Plan, PlanError,
    PullMode, PullPlan, ReceiveError, SeqBlocks, StagedTransfer, TransferEngine,
};

use scenario::{d_layout, group, p_layout, pattern, seqs, zeros};

const TIMEOUT: Duration = Duration::from_secs(10);

#[test]
fn auto_takes_the_plan_with_fewer_descriptors_and_says_why() {
    let (p, d) = (p_layout(), d_layout());
    let remote = [group(&p, 1, 0, Vec::new())];
    // NHD 16-token pages into padded HND 32-token pages: row by row directly, page slices
    // staged.
    let mine = group(&d, 2, 0, Vec::new());
    let direct = plan_pull(&mine, &remote, &seqs()).unwrap();
    let staged = plan_pull_staged(&mine, &remote, &seqs()).unwrap();
    assert!(staged.descriptors() < direct.descriptors());
    let pull = plan(&mine, &remote, &seqs(), PullMode::Auto).unwrap();
    assert_eq!(pull.plan, PullPlan::Staged(staged.clone()));
    assert_eq!(pull.plan.kind(), "staged");
    assert_eq!(pull.plan.descriptors(), staged.descriptors());
    assert_eq!(pull.plan.bytes(), staged.bytes());
    assert_eq!(pull.plan.local_blocks(), vec![2, 5, 6]);
    assert!(
        pull.why.contains(&format!(
            "fewer descriptors than the direct plan's {}",
            direct.descriptors()
        )),
        "{}",
        pull.why
    );
    let other = pull.other.as_ref().unwrap();
    assert_eq!(
        (other.kind, &other.plan),
        ("direct", &Ok(PullPlan::Direct(direct.clone())))
    );
    assert_eq!(
        pull.to_string(),
        format!(
            "staged: {} descriptors, {} bytes; {}",
            staged.descriptors(),
            staged.bytes(),
            pull.why
        )
    );
    // Asked for by name: that plan, nothing else weighed.
    let asked = plan(&mine, &remote, &seqs(), PullMode::Direct).unwrap();
    assert_eq!((asked.plan, asked.other), (PullPlan::Direct(direct), None));
    let asked = plan(&mine, &remote, &seqs(), PullMode::Staged).unwrap();
    assert_eq!(asked.plan, PullPlan::Staged(staged));

    // The same layout on both sides: direct runs are whole page slices already; the tie goes
    // to the direct plan, which needs no post-receive pass.
    let same = [group(&p, 1, 0, Vec::new())];
    let p_seqs = [SeqBlocks {
        remote: vec![3, 7],
        local: vec![0, 1],
        tokens: 20,
    }];
    let pull = plan(&group(&p, 1, 0, Vec::new()), &same, &p_seqs, PullMode::Auto).unwrap();
    assert_eq!(pull.plan.kind(), "direct");
    assert!(
        pull.why
            .starts_with("no more descriptors than the staged plan's"),
        "{}",
        pull.why
    );
}

#[test]
fn a_refused_pull_carries_the_planners_reason() {
    let (p, d) = (p_layout(), d_layout());
    let remote = [group(&p, 1, 0, Vec::new())];
    let mine = group(&d, 2, 0, Vec::new());
    // Remote block 10 of a 10-block pool.
    let bad = [SeqBlocks {
        remote: vec![10],
        local: vec![0],
        tokens: 16,
    }];
    let want = plan_pull(&mine, &remote, &bad).unwrap_err();
    for mode in [PullMode::Auto, PullMode::Direct] {
        let err: PlanError = plan(&mine, &remote, &bad, mode).unwrap_err();
        assert_eq!(err, want, "{mode:?}");
    }
    assert!(want.to_string().contains("10"), "{want}");
}

#[test]
fn executing_a_pull_leaves_what_execute_on_its_plan_leaves() {
    let (p, d) = (p_layout(), d_layout());
    let bytes = pattern(&p, 21);
    let prefill = MemcpyEngine::new("pull-prefill", bytes).unwrap();
    let remote = [group(&p, 1, 0, prefill.regions())];
    let mine = group(&d, 2, 1, Vec::new());
    let pull = plan(&mine, &remote, &seqs(), PullMode::Direct).unwrap();
    let PullPlan::Direct(direct) = &pull.plan else {
        panic!("asked for direct")
    };
    let run = |name: &str, via_pull: bool| {
        let mut e = MemcpyEngine::new(name, zeros(&d)).unwrap();
        e.add_peer("pull-prefill", b"pull-prefill", &prefill.regions())
            .unwrap();
        if via_pull {
            pull.execute(&mut e, &["pull-prefill"], &mut NoPostReceive, b"", TIMEOUT)
                .unwrap();
        } else {
            execute(
                &mut e,
                Plan::Direct(direct),
                &["pull-prefill"],
                b"",
                TIMEOUT,
            )
            .unwrap();
        }
        e.buffers().unwrap()
    };
    let got = run("pull-decode-a", true);
    assert_eq!(got, run("pull-decode-b", false));
    assert!(got[0].iter().any(|&b| b != 0));

    // A staged pull without a post-receive operation is refused before anything is read.
    let staged = plan(&mine, &remote, &seqs(), PullMode::Staged).unwrap();
    let extents = match &staged.plan {
        PullPlan::Staged(s) => s.staging_extents(),
        PullPlan::Direct(_) => panic!("asked for staged"),
    };
    let staging: Vec<Vec<u8>> = extents.iter().map(|&n| vec![0; n as usize]).collect();
    let mut e = MemcpyEngine::new("pull-decode-c", staging.clone()).unwrap();
    e.add_peer("pull-prefill", b"pull-prefill", &prefill.regions())
        .unwrap();
    let err = staged
        .execute(&mut e, &["pull-prefill"], &mut NoPostReceive, b"", TIMEOUT)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("a staged plan needs a post-receive operation (scatter_blocks on a backend); nothing was posted"),
        "{err}"
    );
    assert_eq!(e.buffers().unwrap(), staging, "nothing was read");
    assert_eq!(err.blocks, vec![2, 5, 6]);
}

#[test]
fn calibration_measures_the_memcpy_engine_and_the_backend_here() {
    let cpu = kvlayout_cpu::Host::cpu("cpu", Some(1));
    let t = std::time::Instant::now();
    let model = kvlayout_connector::calibrate_memcpy(&cpu).unwrap();
    let took = t.elapsed();
    model.check().unwrap();
    assert!(model.wire_bytes_per_s > 1e7, "{model}");
    assert!(model.scatter_bytes_per_s > 1e6, "{model}");
    // A descriptor costs something, but less than a millisecond, on any machine of this kind.
    assert!(model.per_descriptor_s < 1e-3, "{model}");
    assert!(
        model.source.contains("memcpy engine, cpu backend"),
        "{model}"
    );
    eprintln!("calibration in {took:?}: {model}");
    // The model's choice for NHD into HND, with the figures in the reason.
    let (p, d) = (p_layout(), d_layout());
    let remote = [group(&p, 1, 0, Vec::new())];
    let mine = group(&d, 2, 0, Vec::new());
    let pull = kvlayout_connector::plan_by_cost(&mine, &remote, &seqs(), &model).unwrap();
    assert!(
        pull.why.contains("direct ") && pull.why.contains("staged "),
        "{}",
        pull.why
    );
}

#[test]
fn a_staged_pull_moved_past_the_cache_leaves_the_cache_alone() {
    let (p, d) = (p_layout(), d_layout());
    let prefill = MemcpyEngine::new("pull-past-prefill", pattern(&p, 5)).unwrap();
    let remote = [group(&p, 1, 0, prefill.regions())];
    let mine = group(&d, 2, 0, Vec::new());
    let pull = plan(&mine, &remote, &seqs(), PullMode::Auto).unwrap();
    assert_eq!(pull.plan.kind(), "staged");
    // One engine: the cache in buffer 0, the staging area in buffer 1.
    let moved = pull.clone().stage_at(1).unwrap();
    let PullPlan::Staged(s) = &moved.plan else {
        panic!("staged")
    };
    assert_eq!(s.staging_buffer, 1);
    let cache = zeros(&d).remove(0);
    let staging = vec![0u8; s.staging_extents()[0] as usize];
    let mut e = MemcpyEngine::new("pull-past-decode", vec![cache.clone(), staging]).unwrap();
    e.add_peer(
        "pull-past-prefill",
        b"pull-past-prefill",
        &prefill.regions(),
    )
    .unwrap();
    let mut seen = 0;
    let mut count = |_: &StagedTransfer, bytes: &[Vec<u8>]| -> Result<(), ReceiveError> {
        seen += bytes[0].iter().filter(|&&b| b != 0).count();
        Ok(())
    };
    moved
        .execute(&mut e, &["pull-past-prefill"], &mut count, b"", TIMEOUT)
        .unwrap();
    assert!(seen > 0, "the staging area received the bytes");
    assert_eq!(e.buffers().unwrap()[0], cache, "the cache is untouched");
    // A direct pull is the same after stage_at; a run below the staging buffer is refused.
    let direct = plan(&mine, &remote, &seqs(), PullMode::Direct).unwrap();
    assert_eq!(direct.clone().stage_at(3).unwrap(), direct);
    let mut bad = s.clone();
    bad.staging_buffer = 2;
    assert!(bad.stage_at(0).is_none());
}

#[test]
fn auto_takes_the_direct_plan_where_the_staged_one_is_refused_and_says_why() {
    // A remote tensor= layout has no paged order to stage in.
    let remote_layout: kvlayout::KvCacheLayout =
        "kv L=2 B=10 N=16 H=4 D=16 dtype=bf16 tensor=flash-attn-nhd"
            .parse()
            .unwrap();
    let remote = [group(&remote_layout, 1, 0, Vec::new())];
    let mine = group(&d_layout(), 2, 0, Vec::new());
    let staged_err = plan_pull_staged(&mine, &remote, &seqs()).unwrap_err();
    let pull = plan(&mine, &remote, &seqs(), PullMode::Auto).unwrap();
    assert_eq!(pull.plan.kind(), "direct");
    assert_eq!(
        pull.why,
        format!("the staged plan is refused: {staged_err}")
    );
    let other = pull.other.unwrap();
    assert_eq!((other.kind, other.plan), ("staged", Err(staged_err)));
}

#[test]
fn planning_into_a_reused_plan_equals_planning_afresh() {
    let (p, d) = (p_layout(), d_layout());
    let remote = [group(&p, 1, 0, Vec::new())];
    let mut reused = kvlayout_connector::TransferPlan {
        transfers: Vec::new(),
        local_blocks: vec![99],
    };
    // Ranks 0 and 1 of TP 2, then TP 1 into the prefill layout: the transfers and runs of the
    // plan before are replaced, whatever their count.
    let cases = [
        (group(&d, 2, 0, Vec::new()), seqs()),
        (group(&d, 2, 1, Vec::new()), seqs()[..1].to_vec()),
        (
            group(&p, 1, 0, Vec::new()),
            vec![SeqBlocks {
                remote: vec![4, 2],
                local: vec![8, 0],
                tokens: 20,
            }],
        ),
    ];
    for (mine, s) in &cases {
        kvlayout_connector::plan_pull_into(mine, &remote, s, &mut reused).unwrap();
        assert_eq!(reused, plan_pull(mine, &remote, s).unwrap());
    }
    // A refusal leaves no transfer behind.
    let bad = [SeqBlocks {
        remote: vec![10],
        local: vec![0],
        tokens: 16,
    }];
    let err = kvlayout_connector::plan_pull_into(&cases[0].0, &remote, &bad, &mut reused);
    assert_eq!(err, Err(plan_pull(&cases[0].0, &remote, &bad).unwrap_err()));
    assert!(reused.transfers.is_empty() && reused.local_blocks.is_empty());
    // Two sequences writing one local block: the first place it happens is named.
    let twice = [
        SeqBlocks {
            remote: vec![1],
            local: vec![3],
            tokens: 16,
        },
        SeqBlocks {
            remote: vec![2, 6, 7],
            local: vec![5, 3],
            tokens: 40,
        },
    ];
    let e = plan_pull(&cases[0].0, &remote, &twice).unwrap_err();
    assert_eq!(
        e,
        PlanError::Mapping {
            seq: 1,
            reason: "tokens 32.. go to local block 3 twice".into()
        }
    );
}
