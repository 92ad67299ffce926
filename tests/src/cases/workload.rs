//! The deterministic inputs of a case: its write and decode workload, and what the block
//! movers do.

use std::ops::Range;

use kvlayout::ops::DecodeParams;
use kvlayout::{AxisOrder, DType, KvCacheLayout, Paged, Placement};

use super::{widths, LayoutCase};
use crate::backend::HostTensor;
use kvlayout_cpu::Activations;

/// A small deterministic generator (xorshift64*), seeded per case by name.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded by a string (FNV-1a).
    pub fn new(seed: &str) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in seed.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        Rng(h | 1)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in `[-2, 2)`.
    pub fn value(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
    }

    /// `n` values in `[-2, 2)`.
    pub fn values(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.value()).collect()
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| (self.next_u64() >> 56) as u8).collect()
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

/// One decode step of a workload.
#[derive(Debug, Clone)]
pub struct DecodeCase {
    /// `mha`, `gqa4+window`, ...
    pub name: &'static str,
    /// `[seqs, num_q_heads, qk_width]`.
    pub query: HostTensor,
    /// Parameters.
    pub params: DecodeParams,
}

/// The write and decode inputs of a K/V or MLA case.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Layer written and read (the last one, so layer strides matter).
    pub layer: u64,
    /// `[tokens, heads, k_width]` (MLA: the latent).
    pub key: HostTensor,
    /// `[tokens, heads, v_width]`; `None` for MLA.
    pub value: Option<HostTensor>,
    /// Slot per token, shuffled, with padding tokens (negative slots) between real ones.
    pub slot_mapping: Vec<i64>,
    /// `(sequence, position)` of each token; `None` for padding.
    pub token_pos: Vec<Option<(usize, usize)>>,
    /// `[seqs, blocks_per_seq]`; entries past a sequence's blocks are -1 or huge (never read).
    pub block_table: Vec<i32>,
    /// Row length of the block table.
    pub blocks_per_seq: usize,
    /// Tokens per sequence: a partial last block, full blocks, and an empty sequence.
    pub seq_lens: Vec<u32>,
    /// Decode steps: MHA, GQA/MQA with a window, with a soft-cap, window 1 with both.
    pub decodes: Vec<DecodeCase>,
}

impl Workload {
    /// The host-side `paged_decode` arguments of decode step `dc` (the query on the host).
    pub fn decode_args<'a>(&'a self, dc: &'a DecodeCase) -> kvlayout_cpu::Decode<'a> {
        kvlayout_cpu::Decode {
            layer: self.layer,
            query: Activations::from(&dc.query),
            block_table: &self.block_table,
            blocks_per_seq: self.blocks_per_seq,
            seq_lens: &self.seq_lens,
            params: dc.params,
        }
    }
}

/// The deterministic workload of a case (`None` for movers-only content).
pub fn workload(case: &LayoutCase) -> Option<Workload> {
    let l = &case.layout;
    let (kw, vw, mla) = widths(l)?;
    let g = *l.geometry();
    let (nb, bs, heads) = (g.num_blocks as usize, g.block_size as usize, g.num_kv_heads);
    let mut rng = Rng::new(&case.name);
    let seqs = Sequences::new(&mut rng, nb, bs);
    let (token_pos, slot_mapping) = seqs.tokens(&mut rng, bs);
    let tokens = token_pos.len();
    let h = heads as usize;
    let act = case.activations;
    let key = activations(act, &rng.values(tokens * h * kw));
    let value = (!mla).then(|| activations(act, &rng.values(tokens * h * vw)));
    let decodes = decode_steps(&mut rng, act, heads, kw, bs as u64);
    Some(Workload {
        layer: g.num_layers - 1,
        key,
        value,
        slot_mapping,
        token_pos,
        block_table: seqs.table,
        blocks_per_seq: seqs.per,
        seq_lens: seqs.lens.to_vec(),
        decodes,
    })
}

/// Three sequences over shuffled blocks: a partial last block, full blocks, and an empty one.
struct Sequences {
    lens: [u32; 3],
    /// `[3, per]`.
    table: Vec<i32>,
    per: usize,
}

impl Sequences {
    fn new(rng: &mut Rng, nb: usize, bs: usize) -> Self {
        let mut blocks: Vec<i32> = (0..nb as i32).collect();
        rng.shuffle(&mut blocks);
        let n1 = if nb >= 2 { (nb / 3).max(1) } else { 0 };
        let n0 = nb - n1;
        let per = n0.max(n1);
        let lens = [
            (n0 * bs - bs / 3) as u32,
            (n1 * bs) as u32,
            0, // an empty sequence
        ];
        let mut table = vec![-1i32; 3 * per];
        table[..n0].copy_from_slice(&blocks[..n0]);
        table[per..per + n1].copy_from_slice(&blocks[n0..]);
        if per > n1 {
            table[per + n1] = i32::MAX; // past the sequence's blocks: never read
        }
        Sequences { lens, table, per }
    }

    /// The tokens of the sequences, shuffled, with padding tokens between them: each token's
    /// `(sequence, position)` and slot.
    fn tokens(&self, rng: &mut Rng, bs: usize) -> (Vec<Option<(usize, usize)>>, Vec<i64>) {
        let (lens, table, per) = (&self.lens, &self.table, self.per);
        let mut positions: Vec<(usize, usize)> = (0..2)
            .flat_map(|s| (0..lens[s] as usize).map(move |t| (s, t)))
            .collect();
        rng.shuffle(&mut positions);
        let mut token_pos = Vec::new();
        for (i, p) in positions.into_iter().enumerate() {
            if i % 5 == 2 {
                token_pos.push(None); // padding token
            }
            token_pos.push(Some(p));
        }
        token_pos.push(None);
        // Padding is any negative slot: mostly vLLM's -1, sometimes -2 or i64::MIN.
        let pads = [-1, -1, -2, i64::MIN];
        let slot_mapping: Vec<i64> = token_pos
            .iter()
            .enumerate()
            .map(|(i, p)| match *p {
                Some((s, t)) => i64::from(table[s * per + t / bs]) * bs as i64 + (t % bs) as i64,
                None => pads[i % pads.len()],
            })
            .collect();
        (token_pos, slot_mapping)
    }
}

/// MHA, GQA/MQA with a window, with a soft-cap, window 1 with both; groups 12 and 20 where
/// there are at most two KV heads.
fn decode_steps(rng: &mut Rng, act: DType, heads: u64, kw: usize, bs: u64) -> Vec<DecodeCase> {
    let scale = 1.0 / (kw as f32).sqrt();
    // (name, query heads per KV head, scale, window, soft-cap)
    let mut step = |name, group: u64, scale, sliding_window, soft_cap| {
        let num_q_heads = group * heads;
        DecodeCase {
            name,
            query: activations(act, &rng.values(3 * num_q_heads as usize * kw)),
            params: DecodeParams {
                num_q_heads,
                scale,
                sliding_window,
                soft_cap,
            },
        }
    };
    let mut steps = vec![
        step("mha", 1, scale, None, None),
        step("gqa4+window", 4, scale, Some(bs + 3), None),
        step("gqa2+softcap", 2, 2.0 * scale, None, Some(1.0)),
        step("gqa8+window1+softcap", 8, scale, Some(1), Some(0.5)),
    ];
    // Groups above the GPU kernels' group tile (8) that are not a multiple of it: 12 (Command
    // R+'s 96 query heads over 8 KV heads) and 20; on layouts of one or two KV heads, so the
    // query stays small.
    if heads <= 2 {
        steps.push(step("gqa12", 12, scale, None, None));
        steps.push(step("gqa20+softcap", 20, scale, None, Some(2.0)));
    }
    steps
}

/// What the block movers do in a case.
#[derive(Debug, Clone)]
pub struct MoverPlan {
    /// `copy_blocks` pairs (a self-pair included: a no-op).
    pub copy_pairs: Vec<(u64, u64)>,
    /// `swap_blocks` pairs, between two layouts of one group.
    pub swap_pairs: Vec<(u64, u64)>,
    /// Blocks to gather, in staging order.
    pub gather_blocks: Vec<u64>,
    /// Head range gathered.
    pub heads: Range<u64>,
    /// The staging layout: same content, `heads.len()` heads, one block more than gathered.
    pub staging: KvCacheLayout,
}

/// The movers of a case.
pub fn mover_plan(case: &LayoutCase, index: usize) -> MoverPlan {
    let l = &case.layout;
    let g = *l.geometry();
    let last = g.num_blocks - 1;
    let mut copy_pairs = vec![(0, last)];
    if g.num_blocks >= 3 {
        copy_pairs.push((1, 1));
    }
    if g.num_blocks >= 5 {
        copy_pairs.push((2, last - 2));
    }
    let h = g.num_kv_heads;
    let heads = match h {
        1 => 0..1,
        2 | 3 => 1..h,
        _ => 1..3,
    };
    let gather_blocks = vec![last, 0];
    let mut spec = l.spec().clone();
    spec.geometry.num_kv_heads = heads.end - heads.start;
    spec.geometry.num_blocks = gather_blocks.len() as u64 + 1;
    let order = if index.is_multiple_of(2) {
        AxisOrder::LBHNC
    } else {
        AxisOrder::BHLNC
    };
    spec.placement = Placement::Paged(Paged::new(order));
    let staging_spec = spec.to_string();
    let staging: KvCacheLayout = staging_spec
        .parse()
        .unwrap_or_else(|e| panic!("{}: staging {staging_spec}: {e}", case.name));
    MoverPlan {
        copy_pairs,
        swap_pairs: vec![(0, last), (last, 0)],
        gather_blocks,
        heads,
        staging,
    }
}

/// `values` as an activation tensor of `dtype` (cases hold f32, f16 or bf16 activations).
fn activations(dtype: DType, values: &[f32]) -> HostTensor {
    HostTensor::from_f32(dtype, values).expect("cases hold activation dtypes")
}
