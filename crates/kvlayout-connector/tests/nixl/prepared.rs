//! Prepared descriptor lists, in one process: a plan whose runs are whole prepared entries
//! is made from indices and moves every element where both layouts put it; a plan that is
//! not (part of a page, a token-major head slice) falls back to fresh lists and says why;
//! preparing is once per peer and pairing, and removing or re-adding the peer releases it.

use kvlayout::ops::CopyRun;
use kvlayout::{Coord, Field, KvCacheLayout};
use kvlayout_connector::engine::{wait, EngineError, TransferEngine};
use kvlayout_connector::handshake::CacheGroup;
use kvlayout_connector::nixl::{NixlEngine, NixlPath, PreparedCount};
use kvlayout_connector::plan::{plan_pull, SeqBlocks};

use crate::common::{group, nixl_ready, pattern, report, zeros, XFER_TIMEOUT};

/// Bytes of one f16 element.
const ELEM: usize = 2;
/// Remote blocks read, and the local blocks they land in (out of order, one left alone).
const REMOTE_BLOCKS: [u64; 2] = [2, 0];
const LOCAL_BLOCKS: [u64; 2] = [1, 2];

fn layout(spec: &str) -> KvCacheLayout {
    spec.parse().unwrap()
}

/// A prefill engine holding `pattern` bytes of `remote` (TP 1) and a zeroed decode engine of
/// `local` at TP `tp`, rank `rank`, each knowing the other's groups; the decode engine has
/// the prefill engine as its peer.
fn engines(
    tag: &str,
    remote: &KvCacheLayout,
    local: &KvCacheLayout,
    tp: u64,
    rank: u64,
) -> (NixlEngine, CacheGroup, NixlEngine, CacheGroup) {
    let prefill = NixlEngine::new(&format!("{tag}-prefill"), pattern(remote, 7)).unwrap();
    let p_group = group(remote, 1, 0, prefill.regions());
    let mut decode = NixlEngine::new(&format!("{tag}-decode"), zeros(local)).unwrap();
    let d_group = group(local, tp, rank, decode.regions());
    let md = prefill.local_metadata().unwrap();
    decode
        .add_peer(prefill.name(), &md, &p_group.regions)
        .unwrap();
    (prefill, p_group, decode, d_group)
}

/// Every element of the mapped blocks, layers, fields, slots and dims of local heads
/// `0..heads` equals the remote element of head `remote_head0 + h`, each found through its
/// own layout's `offset`; the unmapped local block 0 stays zero.
fn assert_moved(
    remote: (&KvCacheLayout, &[Vec<u8>]),
    remote_head0: u64,
    local: (&KvCacheLayout, &[Vec<u8>]),
) {
    assert_same(remote, remote_head0, local);
    let at = |l: &KvCacheLayout, c: Coord| {
        let loc = l.offset(&c).unwrap();
        (loc.buffer as usize, loc.offset as usize)
    };
    for field in [Field::K, Field::V] {
        let (b, o) = at(local.0, Coord::new(field, 0, 0, 0, 0, 0));
        assert_eq!(
            local.1[b][o..o + ELEM],
            [0, 0],
            "block 0 was not to be written"
        );
    }
}

/// The elements of [`assert_moved`], without the untouched block.
fn assert_same(
    remote: (&KvCacheLayout, &[Vec<u8>]),
    remote_head0: u64,
    local: (&KvCacheLayout, &[Vec<u8>]),
) {
    let g = local.0.geometry();
    let at = |l: &KvCacheLayout, c: Coord| {
        let loc = l.offset(&c).unwrap();
        (loc.buffer as usize, loc.offset as usize)
    };
    let mut compared = 0usize;
    for (&rb, &lb) in REMOTE_BLOCKS.iter().zip(&LOCAL_BLOCKS) {
        for field in [Field::K, Field::V] {
            for layer in 0..g.num_layers {
                for head in 0..g.num_kv_heads {
                    for slot in 0..g.block_size {
                        for dim in 0..8 {
                            let (sb, so) = at(
                                remote.0,
                                Coord::new(field, layer, rb, remote_head0 + head, slot, dim),
                            );
                            let (db, d_o) =
                                at(local.0, Coord::new(field, layer, lb, head, slot, dim));
                            assert_eq!(
                                remote.1[sb][so..so + ELEM],
                                local.1[db][d_o..d_o + ELEM],
                                "{field:?} layer {layer} remote block {rb} head {} slot {slot} \
                                 dim {dim}",
                                remote_head0 + head
                            );
                            compared += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(compared > 0);
}

fn seqs(tokens: u64) -> Vec<SeqBlocks> {
    vec![SeqBlocks {
        remote: REMOTE_BLOCKS.to_vec(),
        local: LOCAL_BLOCKS.to_vec(),
        tokens,
    }]
}

/// Reads `runs` from the prefill engine and returns the path taken.
fn read(decode: &mut NixlEngine, peer: &str, runs: &[CopyRun]) -> NixlPath {
    let mut pending = decode.post_read(peer, runs, b"prepared").unwrap();
    let path = pending.path().clone();
    wait(decode, &mut pending, XFER_TIMEOUT).unwrap();
    path
}

/// Same layout (NHD, TP 1 to 1): per (block, layer) pages, made from indices; HND TP 1 to 2
/// (rank 1, heads 2..4): a head slice of each page, made from indices; READs and WRITEs.
pub(crate) fn nixl_prepared_path_moves_every_element_where_both_layouts_put_it() {
    if !nixl_ready() {
        return;
    }
    let cases = [
        (
            "nixl-prep-nhd",
            "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=NHD",
            "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=NHD",
            1,
            0,
        ),
        (
            "nixl-prep-hnd-tp2",
            "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=HND",
            "kv L=2 B=3 N=16 H=2 D=8 dtype=f16 order=HND",
            2,
            1,
        ),
    ];
    for (tag, r_spec, l_spec, tp, rank) in cases {
        let (r, l) = (layout(r_spec), layout(l_spec));
        let (prefill, p_group, mut decode, d_group) = engines(tag, &r, &l, tp, rank);
        let peer = prefill.name().to_string();
        let entries = decode.prepare_groups(&peer, &d_group, &p_group, 0).unwrap();
        assert!(entries > 0, "{tag}: nothing prepared");
        let plan = plan_pull(&d_group, std::slice::from_ref(&p_group), &seqs(32)).unwrap();
        let runs = &plan.transfers[0].runs;
        let predicted = decode.path_for(&peer, runs);
        let path = read(&mut decode, &peer, runs);
        assert_eq!(
            predicted, path,
            "{tag}: path_for and the posted path differ"
        );
        let NixlPath::Prepared { entries: used } = path else {
            panic!("{tag}: the plan's runs are whole entries, yet {path:?}");
        };
        assert!(
            used >= runs.len(),
            "{tag}: {used} entries for {} runs",
            runs.len()
        );
        let got = decode.buffers().unwrap();
        assert_moved((&r, &prefill.buffers().unwrap()), rank * 2, (&l, &got));
        // A WRITE of the same runs back (local to remote) from other bytes: prepared too, and
        // the remote blocks now hold the local elements.
        decode.set_buffers(&pattern(&l, 11)).unwrap();
        let back: Vec<CopyRun> = runs
            .iter()
            .map(|r| CopyRun {
                src_buffer: r.dst_buffer,
                src_offset: r.dst_offset,
                dst_buffer: r.src_buffer,
                dst_offset: r.src_offset,
                len: r.len,
            })
            .collect();
        let mut pending = decode.post_write(&peer, &back, b"back").unwrap();
        assert!(
            matches!(pending.path(), NixlPath::Prepared { .. }),
            "{:?}",
            pending.path()
        );
        wait(&mut decode, &mut pending, XFER_TIMEOUT).unwrap();
        let mine = decode.buffers().unwrap();
        assert_same((&r, &prefill.buffers().unwrap()), rank * 2, (&l, &mine));
        report(&format!(
            "nixl prepared {tag}: {} runs as {used} entries of {entries} prepared",
            runs.len()
        ));
    }
}

/// Runs that are part of a prepared entry fall back to fresh lists and say which run; a
/// pairing that a page's head slice cannot express (NHD TP 1 to 2: one range per token) is
/// refused by `prepare_groups` and its plan is listed; both move the right bytes.
pub(crate) fn nixl_runs_not_expressible_as_entries_fall_back_and_say_so() {
    if !nixl_ready() {
        return;
    }
    let spec = "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=NHD";
    let r = layout(spec);
    let (prefill, p_group, mut decode, d_group) = engines("nixl-prep-part", &r, &r, 1, 0);
    let peer = prefill.name().to_string();
    decode.prepare_groups(&peer, &d_group, &p_group, 0).unwrap();
    let plan = plan_pull(&d_group, std::slice::from_ref(&p_group), &seqs(32)).unwrap();
    // Each run cut in two halves: none is a whole entry.
    let halves: Vec<CopyRun> = plan.transfers[0]
        .runs
        .iter()
        .flat_map(|run| {
            let half = run.len / 2;
            [
                CopyRun { len: half, ..*run },
                CopyRun {
                    src_offset: run.src_offset + half,
                    dst_offset: run.dst_offset + half,
                    len: run.len - half,
                    ..*run
                },
            ]
        })
        .collect();
    let path = read(&mut decode, &peer, &halves);
    match &path {
        NixlPath::Listed { descriptors, why } => {
            assert_eq!(*descriptors, halves.len());
            assert!(
                why.contains("run 0") && why.contains("not a prepared"),
                "{why}"
            );
        }
        other => panic!("half pages taken as prepared: {other:?}"),
    }
    let got = decode.buffers().unwrap();
    assert_moved((&r, &prefill.buffers().unwrap()), 0, (&r, &got));
    report(&format!("nixl prepared fallback: {}", path.describe()));

    // NHD TP 1 to 2: a rank's heads are one range per token of each page.
    let l = layout("kv L=2 B=3 N=16 H=2 D=8 dtype=f16 order=NHD");
    let (prefill, p_group, mut decode, d_group) = engines("nixl-prep-nhd-tp2", &r, &l, 2, 1);
    let peer = prefill.name().to_string();
    match decode.prepare_groups(&peer, &d_group, &p_group, 0) {
        Err(EngineError::Transport(why)) => {
            assert!(why.contains("16 ranges"), "{why}");
        }
        other => panic!("a token-major head slice prepared: {other:?}"),
    }
    assert_eq!(decode.prepared(), PreparedCount::default());
    let plan = plan_pull(&d_group, std::slice::from_ref(&p_group), &seqs(32)).unwrap();
    let path = read(&mut decode, &peer, &plan.transfers[0].runs);
    match &path {
        NixlPath::Listed { why, .. } => assert!(why.contains("no prepared lists"), "{why}"),
        other => panic!("{other:?}"),
    }
    let got = decode.buffers().unwrap();
    assert_moved((&r, &prefill.buffers().unwrap()), 2, (&l, &got));
}

/// Preparing is once per peer and pairing; removing the peer releases its lists, and adding
/// it again starts with none.
pub(crate) fn nixl_prepared_lists_are_released_with_the_peer() {
    if !nixl_ready() {
        return;
    }
    let spec = "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=HND";
    let r = layout(spec);
    let (prefill, p_group, mut decode, d_group) = engines("nixl-prep-release", &r, &r, 1, 0);
    let peer = prefill.name().to_string();
    assert_eq!(decode.prepared(), PreparedCount::default());
    let entries = decode.prepare_groups(&peer, &d_group, &p_group, 0).unwrap();
    // 3 blocks x 2 layers, K and V of each (block, layer) one range per side, or each block
    // one range where its layers are contiguous on both sides.
    let once = decode.prepared();
    assert_eq!(once.handles, 2);
    assert_eq!(once.entries, entries);
    assert!(
        [2 * 3, 2 * 3 * 2].contains(&entries),
        "{entries} entries for 3 blocks of 2 layers"
    );
    for _ in 0..3 {
        assert_eq!(
            decode.prepare_groups(&peer, &d_group, &p_group, 0).unwrap(),
            entries
        );
    }
    assert_eq!(decode.prepared(), once, "preparing again grew the lists");
    decode.remove_peer(&peer).unwrap();
    assert_eq!(decode.prepared(), PreparedCount::default());
    let md = prefill.local_metadata().unwrap();
    decode.add_peer(&peer, &md, &p_group.regions).unwrap();
    decode.prepare_groups(&peer, &d_group, &p_group, 0).unwrap();
    assert_eq!(decode.prepared(), once);
    // Adding the peer again (new metadata) releases the lists prepared against the old.
    decode.add_peer(&peer, &md, &p_group.regions).unwrap();
    assert_eq!(decode.prepared(), PreparedCount::default());
    // An unknown peer prepares nothing.
    assert!(matches!(
        decode.prepare_groups("nobody", &d_group, &p_group, 0),
        Err(EngineError::UnknownPeer(_))
    ));
    assert_eq!(decode.prepared(), PreparedCount::default());
}
