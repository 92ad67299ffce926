//! The printed runs move what the connector's `execute` moves: each case's plan run by
//! `execute` on memcpy engines (a staged plan's post-receive by `scatter_blocks` on the
//! reference backend) leaves the DST cache byte for byte as the JSON runs applied as
//! memcpys do.

use std::time::Duration;

use kvlayout::ops::{Backend, BufferShape};
use kvlayout_connector::engine::{MemcpyEngine, TransferEngine};
use kvlayout_connector::handshake::CacheGroup;
use kvlayout_connector::plan::plan_pull;
use kvlayout_connector::staged::{plan_pull_staged, Scatter};
use kvlayout_connector::{execute, Plan};
use kvlayout_cpu::Host;

use super::{apply, cases, group, seq_blocks};

const TIMEOUT: Duration = Duration::from_secs(10);

/// The first byte where `a` and `b` differ: `(buffer, offset)`.
fn first_difference(a: &[Vec<u8>], b: &[Vec<u8>]) -> Option<(usize, usize)> {
    if a.len() != b.len() {
        return Some((a.len().min(b.len()), 0));
    }
    a.iter().zip(b).enumerate().find_map(|(i, (x, y))| {
        let at = x.iter().zip(y).position(|(p, q)| p != q);
        at.or((x.len() != y.len()).then_some(x.len().min(y.len())))
            .map(|o| (i, o))
    })
}

#[test]
fn plan_runs_move_what_execute_moves() {
    for (i, c) in cases().into_iter().enumerate() {
        let v = c.json();
        let src_bytes = apply::src_bytes(&c);
        let printed = apply::apply(&c, &v, &src_bytes);
        let (src, dst) = c.layouts();
        let total = c.model_heads();
        let names: Vec<String> = (0..c.src_tp)
            .map(|r| format!("cli-plan-exec-{i}-src-{r}"))
            .collect();
        let src_engines: Vec<MemcpyEngine> = src_bytes
            .iter()
            .zip(&names)
            .map(|(b, n)| MemcpyEngine::new(n, b.clone()).unwrap())
            .collect();
        let remotes: Vec<CacheGroup> = src_engines
            .iter()
            .enumerate()
            .map(|(r, e)| CacheGroup {
                regions: e.regions(),
                ..group(&src, total, c.src_tp, r as u64)
            })
            .collect();
        let peers: Vec<&str> = names.iter().map(String::as_str).collect();
        let engine = |buffers| {
            let mut e = MemcpyEngine::new(&format!("cli-plan-exec-{i}-dst"), buffers).unwrap();
            for (n, g) in names.iter().zip(&remotes) {
                e.add_peer(n, n.as_bytes(), &g.regions).unwrap();
            }
            e
        };
        let local = group(&dst, total, c.dst_tp, c.dst_rank);
        let seqs = seq_blocks(&c);
        let zeros: Vec<Vec<u8>> = dst
            .extents()
            .iter()
            .map(|x| vec![0; x.end as usize])
            .collect();
        let executed = if v["plan"] == "direct" {
            let plan = plan_pull(&local, &remotes, &seqs).unwrap();
            let mut e = engine(zeros);
            execute(&mut e, Plan::Direct(&plan), &peers, b"plan", TIMEOUT).unwrap();
            e.buffers().unwrap()
        } else {
            let plan = plan_pull_staged(&local, &remotes, &seqs).unwrap();
            let staging = plan.staging_extents().into_iter();
            let mut e = engine(staging.map(|n| vec![0; n as usize]).collect());
            let be = Host::reference();
            let mut cache = be.alloc_cache(&dst, &BufferShape::exact(&dst)).unwrap();
            be.upload_cache(&mut cache, &zeros).unwrap();
            let mut scatter = Scatter::new(&be, &mut cache);
            let plan = Plan::Staged(&plan, &mut scatter);
            execute(&mut e, plan, &peers, b"plan", TIMEOUT).unwrap();
            be.download_cache(&cache).unwrap()
        };
        assert_eq!(
            first_difference(&executed, &printed),
            None,
            "{}",
            c.args().join(" ")
        );
    }
}
