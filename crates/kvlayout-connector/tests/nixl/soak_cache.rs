//! The soak test's caches: the prefill instances and their layouts, the value every element
//! holds (a function of instance, field, layer, block, model head, slot and dim), the prefill
//! fill and the decode-side check through each side's own `offset`, a seeded RNG and the
//! random requests.

use kvlayout::{Coord, Field, KvCacheLayout};
use kvlayout_connector::plan::SeqBlocks;

/// The model's KV heads.
pub(crate) const MODEL_HEADS: u64 = 4;
/// Decode TP size.
pub(crate) const DECODE_TP: u64 = 2;
/// Requests in flight per decode rank in a round; each owns [`SLOT_BLOCKS`] local blocks.
pub(crate) const IN_FLIGHT: u64 = 8;
/// Local blocks per in-flight request.
pub(crate) const SLOT_BLOCKS: u64 = 16;
/// Most tokens of one sequence (2 sequences of up to 6 local blocks each fit a slot).
pub(crate) const MAX_TOKENS: u64 = 96;
/// Every decode byte is set to this before a round: no value the prefill side writes has it.
pub(crate) const POISON: u8 = 0xff;

/// A prefill peer process: its engine id, its instance (peers of one instance are its TP
/// ranks), its TP size and rank, and its layout (its rank's heads).
#[derive(Debug, Clone)]
pub(crate) struct PeerSpec {
    pub(crate) engine_id: &'static str,
    pub(crate) instance: u64,
    pub(crate) tp_size: u64,
    pub(crate) tp_rank: u64,
    pub(crate) spec: &'static str,
}

/// The four prefill peers: NHD/16 at TP 1, HND/16 at TP 1, and a TP 2 pair of NHD/32 with
/// padded pages (dense page 4,096 bytes, padded to 6,144).
pub(crate) const PEERS: [PeerSpec; 4] = [
    PeerSpec {
        engine_id: "soak-nhd16",
        instance: 0,
        tp_size: 1,
        tp_rank: 0,
        spec: "kv L=2 B=64 N=16 H=4 D=16 dtype=bf16 order=NHD",
    },
    PeerSpec {
        engine_id: "soak-hnd16",
        instance: 1,
        tp_size: 1,
        tp_rank: 0,
        spec: "kv L=2 B=64 N=16 H=4 D=16 dtype=bf16 order=HND",
    },
    PeerSpec {
        engine_id: "soak-tp2-rank0",
        instance: 2,
        tp_size: 2,
        tp_rank: 0,
        spec: "kv L=2 B=32 N=32 H=2 D=16 dtype=bf16 order=NHD page=6144",
    },
    PeerSpec {
        engine_id: "soak-tp2-rank1",
        instance: 2,
        tp_size: 2,
        tp_rank: 1,
        spec: "kv L=2 B=32 N=32 H=2 D=16 dtype=bf16 order=NHD page=6144",
    },
];

/// The peer restarted with a changed layout: `soak-hnd16` again, now NHD.
pub(crate) const RESTARTED: PeerSpec = PeerSpec {
    engine_id: "soak-hnd16",
    instance: 1,
    tp_size: 1,
    tp_rank: 0,
    spec: "kv L=2 B=64 N=16 H=4 D=16 dtype=bf16 order=NHD",
};

/// Prefill instances (the TP 2 pair is one).
pub(crate) const INSTANCES: u64 = 3;

/// Each decode rank's layout: NHD/16, 2 of the 4 heads, `IN_FLIGHT * SLOT_BLOCKS` blocks.
pub(crate) fn decode_layout() -> KvCacheLayout {
    format!(
        "kv L=2 B={} N=16 H=2 D=16 dtype=bf16 order=NHD",
        IN_FLIGHT * SLOT_BLOCKS
    )
    .parse()
    .unwrap()
}

impl PeerSpec {
    pub(crate) fn layout(&self) -> KvCacheLayout {
        self.spec.parse().unwrap()
    }
}

/// The 16-bit element at `(instance, field, layer, block, model head, slot, dim)` of a prefill
/// cache: a mix of the coordinates, top bit clear (never the poison `0xffff`).
pub(crate) fn value(instance: u64, field: Field, c: [u64; 5]) -> u16 {
    let f = u64::from(field == Field::V);
    let [layer, block, head, slot, dim] = c;
    let mut x = (instance << 56) ^ (f << 52) ^ (layer << 44) ^ (block << 28) ^ (head << 20);
    x ^= (slot << 10) ^ dim;
    x = x.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 31;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    ((x >> 40) & 0x7fff) as u16
}

/// The cache of `peer`: every element of its layout set to [`value`] of its model head,
/// placed through the layout's `offset`; padding zero.
pub(crate) fn prefill_cache(peer: &PeerSpec) -> Vec<Vec<u8>> {
    let layout = peer.layout();
    let mut bytes: Vec<Vec<u8>> = layout
        .extents()
        .iter()
        .map(|x| vec![0; x.end as usize])
        .collect();
    let g = layout.geometry();
    let h0 = peer.tp_rank * g.num_kv_heads;
    for field in [Field::K, Field::V] {
        for layer in 0..g.num_layers {
            for block in 0..g.num_blocks {
                for head in 0..g.num_kv_heads {
                    for slot in 0..layout.num_slots() {
                        for dim in 0..16 {
                            let c = Coord::new(field, layer, block, head, slot, dim);
                            let at = layout.offset(&c).unwrap();
                            let v =
                                value(peer.instance, field, [layer, block, h0 + head, slot, dim]);
                            let o = at.offset as usize;
                            bytes[at.buffer as usize][o..o + 2].copy_from_slice(&v.to_le_bytes());
                        }
                    }
                }
            }
        }
    }
    bytes
}

/// Checks what decode rank `rank` received for `seqs` from prefill `instance` (remote block
/// size `remote_block_size`): each token's elements, read through the decode layout's
/// `offset`, equal [`value`] at the remote block and slot the token has there. The number of
/// elements checked, or the first mismatch.
pub(crate) fn check_received(
    received: &[Vec<u8>],
    rank: u64,
    instance: u64,
    remote_block_size: u64,
    seqs: &[SeqBlocks],
) -> Result<u64, String> {
    let layout = decode_layout();
    let g = layout.geometry();
    let mut checked = 0;
    for (s, seq) in seqs.iter().enumerate() {
        for t in 0..seq.tokens {
            let (rb, rs) = (
                seq.remote[(t / remote_block_size) as usize],
                t % remote_block_size,
            );
            let (lb, ls) = (seq.local[(t / g.block_size) as usize], t % g.block_size);
            for field in [Field::K, Field::V] {
                for layer in 0..g.num_layers {
                    for head in 0..g.num_kv_heads {
                        let model_head = rank * g.num_kv_heads + head;
                        for dim in 0..16 {
                            let c = Coord::new(field, layer, lb, head, ls, dim);
                            let at = layout.offset(&c).map_err(|e| e.to_string())?;
                            let o = at.offset as usize;
                            let buf = &received[at.buffer as usize];
                            let got = u16::from_le_bytes([buf[o], buf[o + 1]]);
                            let want = value(instance, field, [layer, rb, model_head, rs, dim]);
                            if got != want {
                                return Err(format!(
                                    "seq {s} token {t} {field:?} layer {layer} model head \
                                     {model_head} dim {dim}: {got:#06x}, expected {want:#06x} \
                                     (remote block {rb} slot {rs}, local block {lb} slot {ls})"
                                ));
                            }
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    Ok(checked)
}

/// Whether every byte of local block `block` (all layers and heads) is still the poison.
pub(crate) fn untouched(received: &[Vec<u8>], block: u64) -> bool {
    let layout = decode_layout();
    let g = layout.geometry();
    layout
        .block_regions(block, 0..g.num_layers, 0..g.num_kv_heads)
        .unwrap()
        .iter()
        .all(|r| {
            let (o, n) = (r.offset as usize, r.len as usize);
            received[r.buffer as usize][o..o + n]
                .iter()
                .all(|&b| b == POISON)
        })
}

/// SplitMix64: a seeded generator, the same sequence on every machine.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// `k` distinct values of `0..n`, in random order.
    pub(crate) fn distinct(&mut self, n: u64, k: u64) -> Vec<u64> {
        let mut all: Vec<u64> = (0..n).collect();
        for i in 0..k as usize {
            let j = i + self.below(n - i as u64) as usize;
            all.swap(i, j);
        }
        all.truncate(k as usize);
        all
    }
}

/// A random request of 1 or 2 sequences of 1 to [`MAX_TOKENS`] tokens: distinct random remote
/// blocks of an instance with `remote_blocks` blocks of `remote_block_size` tokens, distinct
/// random local blocks of in-flight slot `slot`.
pub(crate) fn random_request(
    rng: &mut Rng,
    slot: u64,
    remote_blocks: u64,
    remote_block_size: u64,
) -> Vec<SeqBlocks> {
    let n_seqs = 1 + rng.below(2);
    let tokens: Vec<u64> = (0..n_seqs).map(|_| 1 + rng.below(MAX_TOKENS)).collect();
    let remote_need: Vec<u64> = tokens
        .iter()
        .map(|t| t.div_ceil(remote_block_size))
        .collect();
    let local_need: Vec<u64> = tokens.iter().map(|t| t.div_ceil(16)).collect();
    let mut remote = rng
        .distinct(remote_blocks, remote_need.iter().sum())
        .into_iter();
    let mut local = rng
        .distinct(SLOT_BLOCKS, local_need.iter().sum())
        .into_iter()
        .map(|b| slot * SLOT_BLOCKS + b);
    (0..n_seqs as usize)
        .map(|s| SeqBlocks {
            remote: remote.by_ref().take(remote_need[s] as usize).collect(),
            local: local.by_ref().take(local_need[s] as usize).collect(),
            tokens: tokens[s],
        })
        .collect()
}
