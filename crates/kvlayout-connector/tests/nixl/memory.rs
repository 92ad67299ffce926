//! Memory the caller owns, registered with the NIXL engine: host memory given as a pointer
//! and a length (a direct pull lands in the caller's bytes, a staged one in the caller's
//! staging area after its cache, in one engine), and a CUDA cache's device memory where a GPU
//! is present.

use kvlayout::ops::{Backend, BufferShape};
use kvlayout_connector::engine::TransferEngine;
use kvlayout_connector::memory::{MemKind, Region};
use kvlayout_connector::nixl::{NixlEngine, NixlOptions};
use kvlayout_connector::plan::plan_pull;
use kvlayout_connector::staged::plan_pull_staged;
use kvlayout_connector::{execute, Plan, ReceiveError, StagedTransfer};

use crate::common::{
    d_layout, group, memcpy_read, nixl_ready, p_layout, pattern, report, seqs, zeros, XFER_TIMEOUT,
};

/// `bytes` as a raw host region.
fn raw(bytes: &mut [u8]) -> Region<'static> {
    // SAFETY: every caller keeps `bytes` alive, and does not touch it, until the engine it is
    // registered with is dropped; every transfer is waited for by `execute` before that.
    unsafe { Region::from_raw(bytes.as_mut_ptr(), bytes.len(), MemKind::Host) }
}

pub(crate) fn nixl_engine_registers_host_memory_the_caller_owns() {
    if !nixl_ready() {
        return;
    }
    let (p, d) = (p_layout(), d_layout());
    let prefill = NixlEngine::new("nixl-own-prefill", pattern(&p, 3)).unwrap();
    let p_group = group(&p, 1, 0, prefill.regions());
    let p_md = prefill.local_metadata().unwrap();
    let name = prefill.name().to_string();

    // Direct: decode rank 0's cache is the caller's vector; the engine registers it in place.
    let mut cache = zeros(&d).remove(0);
    let mine = group(&d, 2, 0, Vec::new());
    let plan = plan_pull(&mine, std::slice::from_ref(&p_group), &seqs()).unwrap();
    {
        let region = raw(&mut cache);
        let addr = region.addr();
        let opts = NixlOptions::default();
        let mut engine = NixlEngine::register("nixl-own-decode", vec![region], &opts).unwrap();
        assert_eq!(engine.regions()[0].base, addr, "registered in place");
        engine.add_peer(&name, &p_md, &p_group.regions).unwrap();
        execute(
            &mut engine,
            Plan::Direct(&plan),
            &[&name],
            b"",
            XFER_TIMEOUT,
        )
        .unwrap();
    }
    let want = memcpy_read("nixl-own", prefill.buffers().unwrap(), zeros(&d), &plan);
    assert!(cache == want[0], "the caller's bytes hold the pull");
    assert!(cache.iter().any(|&b| b != 0));

    // Staged, in one engine: the caller's cache (buffer 0, untouched by a staged plan) and
    // its staging area (buffer 1) registered together; the post-receive closure copies each
    // received staging cache out.
    let staged = plan_pull_staged(&mine, std::slice::from_ref(&p_group), &seqs())
        .unwrap()
        .stage_at(1)
        .unwrap();
    let extents = staged.staging_extents();
    assert_eq!(extents.len(), 1);
    let mut cache = zeros(&d).remove(0);
    let mut staging = vec![0u8; extents[0] as usize];
    let mut received: Vec<Vec<Vec<u8>>> = Vec::new();
    {
        let regions = vec![raw(&mut cache), raw(&mut staging)];
        let opts = NixlOptions::default();
        let mut engine = NixlEngine::register("nixl-own-staged", regions, &opts).unwrap();
        engine.add_peer(&name, &p_md, &p_group.regions).unwrap();
        let mut keep = |_: &StagedTransfer, bytes: &[Vec<u8>]| -> Result<(), ReceiveError> {
            received.push(bytes.to_vec());
            Ok(())
        };
        let plan = Plan::Staged(&staged, &mut keep);
        execute(&mut engine, plan, &[&name], b"", XFER_TIMEOUT).unwrap();
    }
    assert!(
        cache.iter().all(|&b| b == 0),
        "a staged plan leaves the cache"
    );
    // What the staging area received is what the memcpy engine puts there.
    let t = &staged.transfers[0];
    let wire = t.wire();
    let want = memcpy_read(
        "nixl-own-staged",
        prefill.buffers().unwrap(),
        vec![vec![0; extents[0] as usize]; 2],
        &wire,
    );
    assert_eq!(received.len(), 1);
    assert!(received[0][0] == want[1][..t.staging.extents()[0].end as usize]);
    assert!(staging[..received[0][0].len()] == received[0][0][..]);
    report(&format!(
        "nixl caller memory: direct {} runs, staged {} runs into buffer 1",
        plan.descriptors(),
        staged.descriptors()
    ));
}

pub(crate) fn nixl_engine_registers_device_memory() {
    if !nixl_ready() {
        return;
    }
    let be = match kvlayout_cuda::cuda(0) {
        Ok(be) => be,
        Err(e) => {
            let require = std::env::var("KVLAYOUT_REQUIRE_GPU").unwrap_or_default();
            assert!(
                require != "1" && require != "cuda",
                "KVLAYOUT_REQUIRE_GPU={require}, but {e}"
            );
            report(&format!("skipped: nixl device memory: no CUDA device: {e}"));
            return;
        }
    };
    let (p, d) = (p_layout(), d_layout());
    let bytes = pattern(&p, 9);
    // The prefill side's cache on the GPU, registered in place as device memory.
    let mut cache = be.alloc_cache(&p, &BufferShape::exact(&p)).unwrap();
    be.upload_cache(&mut cache, &bytes).unwrap();
    be.synchronize().unwrap();
    let regions = be
        .buffer_spans(&cache)
        .into_iter()
        .map(|(addr, len)| {
            // SAFETY: the cache's allocation lives until the end of this function, after the
            // engine registering it is dropped; nothing else touches it meanwhile.
            unsafe { Region::from_raw(addr as *mut u8, len as usize, MemKind::Device { id: 0 }) }
        })
        .collect();
    let opts = NixlOptions::default();
    let prefill = match NixlEngine::register("nixl-vram-prefill", regions, &opts) {
        Ok(e) => e,
        Err(e) => panic!("NIXL refused to register device memory: {e}"),
    };
    let p_group = group(&p, 1, 0, prefill.regions());
    assert!(p_group.regions.iter().all(|r| r.device == Some(0)));
    let mine = group(&d, 2, 1, Vec::new());
    let plan = plan_pull(&mine, std::slice::from_ref(&p_group), &seqs()).unwrap();
    let mut engine = NixlEngine::new("nixl-vram-decode", zeros(&d)).unwrap();
    let name = prefill.name().to_string();
    engine
        .add_peer(&name, &prefill.local_metadata().unwrap(), &p_group.regions)
        .unwrap();
    execute(
        &mut engine,
        Plan::Direct(&plan),
        &[&name],
        b"",
        XFER_TIMEOUT,
    )
    .unwrap();
    let want = memcpy_read("nixl-vram", bytes, zeros(&d), &plan);
    assert!(engine.buffers().unwrap() == want, "device to host pull");
    drop(engine);
    drop(prefill);
    report("nixl device memory: a CUDA cache pulled into host memory, as memcpy puts it");
}
