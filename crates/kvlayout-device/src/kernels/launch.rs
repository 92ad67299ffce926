//! Launch configurations: grid, block and shared memory of each kernel, chosen by one
//! function per op from the op's validated shape and the target's warp width and limits.
//! Kernels read their extents from the field arguments; these functions only size the grid.

use kvlayout::ops::{DecodeShape, OpError, WriteShape};
use kvlayout::FieldMap;

use super::decode_paths::{decode_partition_tokens, DecodeRows};

/// What a launch needs to know of the machine it runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuTarget {
    /// Name in reports.
    pub name: &'static str,
    /// Warp (CUDA) or wavefront (AMD) width: 32 or 64.
    pub warp: u32,
    /// Shared memory a block may use without opting in, static and dynamic together.
    pub shared_bytes: u32,
    /// Streaming multiprocessors (CUDA) or compute units (AMD): the decode splits sequences
    /// into enough partitions to give each about `DECODE_BLOCKS_PER_SM` (4) blocks.
    pub sm_count: u32,
}

impl GpuTarget {
    /// NVIDIA sm_80 / sm_90: warps of 32, 48 KiB of shared memory per block by default;
    /// 132 SMs (H100 SXM and H200) unless the backend asks the device.
    pub const CUDA: GpuTarget = GpuTarget {
        name: "cuda",
        warp: 32,
        shared_bytes: 48 << 10,
        sm_count: 132,
    };
    /// AMD CDNA (gfx90a, gfx942): wavefronts of 64, 64 KiB of LDS per workgroup; 304 compute
    /// units (MI300X) unless the backend asks the device.
    pub const CDNA: GpuTarget = GpuTarget {
        name: "cdna",
        warp: 64,
        shared_bytes: 64 << 10,
        sm_count: 304,
    };
    /// AMD RDNA (gfx1100): wavefronts of 32, 64 KiB of LDS per workgroup; 96 compute units
    /// (Radeon RX 7900 XTX) unless the backend asks the device.
    pub const RDNA: GpuTarget = GpuTarget {
        name: "rdna",
        warp: 32,
        shared_bytes: 64 << 10,
        sm_count: 96,
    };

    /// This target with the device's own multiprocessor count (0 keeps the default).
    pub const fn with_sm_count(self, sm_count: u32) -> Self {
        if sm_count == 0 {
            return self;
        }
        GpuTarget { sm_count, ..self }
    }
}

/// Three launch dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Dim3 {
    /// x.
    pub x: u32,
    /// y.
    pub y: u32,
    /// z.
    pub z: u32,
}

impl Dim3 {
    /// `(x, y, z)`.
    pub const fn new(x: u32, y: u32, z: u32) -> Self {
        Dim3 { x, y, z }
    }
}

/// One kernel launch: grid, block (threads in x only) and dynamic shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct LaunchConfig {
    /// Blocks.
    pub grid: Dim3,
    /// Threads per block.
    pub block: Dim3,
    /// Dynamic shared memory per block, bytes.
    pub dyn_shared_bytes: u32,
}

/// Most tokens one decode block attends to (a partition); longer contexts are split and
/// reduced.
pub const PARTITION_TOKENS: u64 = 512;
/// Threads of a decode block.
pub const DECODE_THREADS: u32 = 128;
/// Most query heads a decode block serves (`KVL_MAX_GROUP_TILE` of the kernel).
pub const MAX_GROUP_TILE: u64 = 8;
/// Most threads of a write or move block.
pub const MAX_ROW_THREADS: u32 = 256;
/// Static shared memory of a kernel, at most: one float per warp of the largest block (1024
/// threads of warps of 32), or the decode's max and sum per head of a tile.
const STATIC_SHARED_BYTES: u32 = 1024 / 32 * 4;

const MAX_GRID_X: u64 = (1 << 31) - 1;
const MAX_GRID_YZ: u64 = 65_535;

fn grid_dim(what: &str, value: u64, limit: u64) -> Result<u32, OpError> {
    if value > limit {
        return Err(OpError::Unsupported {
            op: "launch",
            reason: format!("{what} {value} exceeds the grid limit {limit}"),
        });
    }
    Ok(value as u32)
}

/// Threads for rows of `width` elements: whole warps, at least one, at most
/// [`MAX_ROW_THREADS`].
fn row_threads(target: &GpuTarget, width: u64) -> u32 {
    let w = u64::from(target.warp);
    (width.div_ceil(w).max(1) * w).min(u64::from(MAX_ROW_THREADS.max(target.warp))) as u32
}

/// `write_kv` of `tokens` tokens: grid (tokens, heads), one block per row pair, threads for
/// `row_lanes` lanes (the longer row's elements, or its 16-byte pieces where
/// [`write_lane_bytes`] chose them); `None` when there is no token.
pub fn write_kv_launch(
    target: &GpuTarget,
    shape: &WriteShape,
    tokens: usize,
    row_lanes: u64,
) -> Result<Option<LaunchConfig>, OpError> {
    if tokens == 0 {
        return Ok(None);
    }
    Ok(Some(LaunchConfig {
        grid: Dim3::new(
            grid_dim("tokens", tokens as u64, MAX_GRID_X)?,
            grid_dim("heads", shape.heads as u64, MAX_GRID_YZ)?,
            1,
        ),
        block: Dim3::new(row_threads(target, row_lanes), 1, 1),
        dyn_shared_bytes: 0,
    }))
}

/// Bytes each `write_kv` lane stores of a row of `field` in a buffer at `base`: 16 or 8 when a
/// row is one run whose bytes and every start are multiples of it ([`row_unit_bytes`] of the
/// field with itself; inline-scaled rows, a scale after each, are 8-aligned at best), else 0
/// (one element per lane).
pub fn write_lane_bytes(field: &FieldMap, base: u64) -> u32 {
    match row_unit_bytes(field, field, base, base) {
        u @ (16 | 8) => u,
        _ => 0,
    }
}

/// Lanes a row of `width` elements of `elem_bytes` bytes takes at `lane_bytes` per lane (0:
/// one element per lane).
pub fn row_lanes(width: u64, elem_bytes: u64, lane_bytes: u32) -> u64 {
    match lane_bytes {
        0 => width,
        b => (width * elem_bytes).div_ceil(u64::from(b)),
    }
}

/// The launches of one `paged_decode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeLaunch {
    /// `kvl_paged_decode`: grid (seqs, kv_heads x group tiles, partitions).
    pub main: LaunchConfig,
    /// `kvl_paged_decode_reduce` (grid (seqs, q_heads)), when there is more than one partition.
    pub reduce: Option<LaunchConfig>,
    /// Partitions per sequence.
    pub partitions: u32,
    /// Tokens per partition (at most [`PARTITION_TOKENS`]; the longest attended length when
    /// there is one partition).
    pub partition_tokens: u64,
    /// Query heads of one KV head a block serves (each key and value read once for them).
    pub group_tile: u32,
    /// How the kernel reads key and value rows.
    pub rows: DecodeRows,
}

impl DecodeLaunch {
    /// f32 elements of the partials scratch (0 for a single pass).
    pub fn partials_len(&self, shape: &DecodeShape) -> usize {
        match self.reduce {
            None => 0,
            Some(_) => shape.seqs * shape.q_heads * self.partitions as usize * (2 + shape.v_width),
        }
    }
}

/// `paged_decode` of sequences attending to at most `max_attended` tokens (the window
/// applied), reading rows as `rows` says: partitions of [`decode_partition_tokens`] and a
/// reduction when there is more than one; each block serves up to [`MAX_GROUP_TILE`] query
/// heads of one KV head, fewer where their query rows and logits (and, for values read by
/// token, one row offset per token) would not fit the target's shared memory. `None` when
/// there is no sequence.
pub fn paged_decode_launch(
    target: &GpuTarget,
    shape: &DecodeShape,
    max_attended: u64,
    rows: &DecodeRows,
) -> Result<Option<DecodeLaunch>, OpError> {
    if shape.seqs == 0 || shape.q_heads == 0 {
        return Ok(None);
    }
    let group = shape.group.max(1) as u64;
    let kv_heads = (shape.q_heads / shape.group.max(1)) as u64;
    let row = shape.qk_width.max(shape.v_width) as u64;
    let bases = |tokens: u64| if rows.v_token_major { 8 * tokens } else { 0 };
    let shared = |tile: u64, tokens: u64| {
        ((4 * tile * (row + tokens)).next_multiple_of(8) + bases(tokens)).next_multiple_of(16)
    };
    let fits = |tile: u64, tokens: u64| {
        shared(tile, tokens) + u64::from(STATIC_SHARED_BYTES) <= u64::from(target.shared_bytes)
    };
    // The tile is sized for the largest partition, so splitting never needs a smaller one.
    let most = max_attended.clamp(1, PARTITION_TOKENS);
    let tile = (1..=group.min(MAX_GROUP_TILE))
        .rev()
        .find(|&t| fits(t, most));
    let blocks = (shape.seqs as u64) * kv_heads * group.div_ceil(tile.unwrap_or(1));
    let tokens = decode_partition_tokens(target, blocks, max_attended);
    let partitions = max_attended.div_ceil(tokens).max(1);
    let Some(tile) = tile else {
        return Err(OpError::Unsupported {
            op: "paged_decode",
            reason: format!(
                "{} bytes of shared memory per block (query row of {} and {most} logits) \
                 exceed the {} target's {}",
                shared(1, most),
                row,
                target.name,
                target.shared_bytes
            ),
        });
    };
    let seqs = grid_dim("sequences", shape.seqs as u64, MAX_GRID_X)?;
    let blocks_y = grid_dim(
        "KV heads x group tiles",
        kv_heads * group.div_ceil(tile),
        MAX_GRID_YZ,
    )?;
    let heads = grid_dim("query heads", shape.q_heads as u64, MAX_GRID_YZ)?;
    let parts = grid_dim("partitions", partitions, MAX_GRID_YZ)?;
    Ok(Some(DecodeLaunch {
        main: LaunchConfig {
            grid: Dim3::new(seqs, blocks_y, parts),
            block: Dim3::new(DECODE_THREADS.max(target.warp), 1, 1),
            dyn_shared_bytes: shared(tile, tokens) as u32,
        },
        reduce: (parts > 1).then_some(LaunchConfig {
            grid: Dim3::new(seqs, heads, 1),
            block: Dim3::new(row_threads(target, shape.v_width as u64), 1, 1),
            dyn_shared_bytes: 0,
        }),
        partitions: parts,
        partition_tokens: tokens,
        group_tile: tile as u32,
        rows: *rows,
    }))
}

/// A block mover on one field: grid (pairs, layers x heads, capped at the grid limit; the
/// kernel loops over the rest); `None` when nothing moves.
pub fn move_launch(
    target: &GpuTarget,
    field: &FieldMap,
    heads: u64,
    pairs: usize,
) -> Result<Option<LaunchConfig>, OpError> {
    if pairs == 0 || heads == 0 {
        return Ok(None);
    }
    let units = field.num_layers.saturating_mul(heads).min(MAX_GRID_YZ);
    Ok(Some(LaunchConfig {
        grid: Dim3::new(
            grid_dim("block pairs", pairs as u64, MAX_GRID_X)?,
            units as u32,
            1,
        ),
        block: Dim3::new(
            row_threads(target, field.num_slots.saturating_mul(field.width)),
            1,
            1,
        ),
        dyn_shared_bytes: 0,
    }))
}

/// The unit a mover copies rows of `src` into `dst` in: 0 (element by element) unless a row
/// is one run of bytes on both sides; then the largest of 16, 8, 4, 2, 1 bytes that divides
/// the row and every row start on both sides (strides, base offsets and the buffers'
/// addresses `src_base` / `dst_base`).
pub fn row_unit_bytes(src: &FieldMap, dst: &FieldMap, src_base: u64, dst_base: u64) -> u32 {
    if !(src.row_contiguous() && dst.row_contiguous()) {
        return 0;
    }
    let bits = src.row_bytes() | row_start_bits(src) | row_start_bits(dst) | src_base | dst_base;
    [16u32, 8, 4, 2, 1]
        .into_iter()
        .find(|&u| bits.is_multiple_of(u64::from(u)))
        .unwrap_or(1)
}

/// The base offset ORed with the stride of every axis that varies (layer, block, head,
/// slot): a unit divides every row start of the field exactly when it divides this.
pub(crate) fn row_start_bits(m: &FieldMap) -> u64 {
    let [layer, block, head, slot, _, _] = m.axes();
    [layer, block, head, slot]
        .into_iter()
        .filter(|&(extent, _)| extent > 1)
        .fold(m.strides.base_offset, |acc, (_, stride)| acc | stride)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvlayout::Field;
    use kvlayout::KvCacheLayout;

    #[test]
    fn decode_partitions_past_the_partition_size() {
        let shape = DecodeShape {
            seqs: 3,
            q_heads: 8,
            group: 2,
            qk_width: 128,
            v_width: 128,
        };
        let rows = DecodeRows::default();
        // A device of one SM wants 4 blocks: 3 sequences x 4 KV heads already are more.
        let one_sm = GpuTarget::CUDA.with_sm_count(1);
        let one = paged_decode_launch(&one_sm, &shape, 300, &rows)
            .unwrap()
            .unwrap();
        assert_eq!((one.partitions, one.reduce), (1, None));
        // 4 KV heads, each block serving both query heads of one.
        assert_eq!((one.main.grid, one.group_tile), (Dim3::new(3, 4, 1), 2));
        assert_eq!(one.main.dyn_shared_bytes, 2 * 4 * (128 + 300));
        assert_eq!(one.partition_tokens, 300);
        // 1025 tokens on one SM: 512 at most per partition.
        let long = paged_decode_launch(&GpuTarget::CDNA.with_sm_count(1), &shape, 1025, &rows)
            .unwrap()
            .unwrap();
        assert_eq!(
            (long.partitions, long.partition_tokens),
            (3, PARTITION_TOKENS)
        );
        assert_eq!(long.main.block.x % 64, 0);
        assert_eq!(long.partials_len(&shape), 3 * 8 * 3 * 130);
        assert!(paged_decode_launch(
            &GpuTarget::CUDA,
            &DecodeShape { seqs: 0, ..shape },
            5,
            &rows
        )
        .unwrap()
        .is_none());
    }

    #[test]
    fn group_tiles_shrink_to_fit_shared_memory() {
        // MLA: 128 query heads of one latent head, 576-wide rows.
        let mla = DecodeShape {
            seqs: 2,
            q_heads: 128,
            group: 128,
            qk_width: 576,
            v_width: 512,
        };
        let rows = DecodeRows::default();
        let l = paged_decode_launch(&GpuTarget::CUDA, &mla, 4096, &rows)
            .unwrap()
            .unwrap();
        // 8 heads x (576 + 512) floats = 34 KiB fit 48 KiB.
        assert_eq!((l.group_tile, l.main.grid.y), (8, 16));
        let small = GpuTarget {
            shared_bytes: 16 << 10,
            ..GpuTarget::CUDA
        };
        let l = paged_decode_launch(&small, &mla, 4096, &rows)
            .unwrap()
            .unwrap();
        assert_eq!((l.group_tile, l.main.grid.y), (3, 43));
        assert!(u64::from(l.main.dyn_shared_bytes) + 128 <= 16 << 10);
        let tiny = GpuTarget {
            shared_bytes: 4 << 10,
            ..GpuTarget::CUDA
        };
        let err = paged_decode_launch(&tiny, &mla, 4096, &rows).unwrap_err();
        assert!(
            err.to_string().contains("exceed the cuda target's 4096"),
            "{err}"
        );
    }

    #[test]
    fn blocks_are_whole_warps_and_grids_stay_in_limits() {
        let shape = WriteShape {
            heads: 4,
            k_width: 8,
            v_width: 40,
            mla: false,
        };
        for t in [GpuTarget::CUDA, GpuTarget::CDNA, GpuTarget::RDNA] {
            let l = write_kv_launch(&t, &shape, 7, 40).unwrap().unwrap();
            assert_eq!(l.block.x, 64, "40 elements: whole warps of {}", t.warp);
            let wide = write_kv_launch(&t, &shape, 7, row_lanes(40, 2, 16));
            assert_eq!(wide.unwrap().unwrap().block.x, t.warp, "5 lanes: one warp");
            assert_eq!(l.grid, Dim3::new(7, 4, 1));
        }
        let err = write_kv_launch(
            &GpuTarget::CUDA,
            &WriteShape {
                heads: 70_000,
                ..shape
            },
            1,
            8,
        );
        assert!(err.unwrap_err().to_string().contains("65535"));
    }

    #[test]
    fn row_units_follow_the_descriptor() {
        let nhd: KvCacheLayout = "kv B=3 N=16 H=4 D=8 dtype=f16 order=NHD".parse().unwrap();
        let k = nhd.field_map(Field::K).unwrap();
        assert_eq!(row_unit_bytes(&k, &k, 0, 64), 16);
        assert_eq!(row_unit_bytes(&k, &k, 0, 66), 2);
        let legacy: KvCacheLayout = "kv B=3 N=16 H=4 D=32 dtype=f16 tensor=vllm-paged-v1"
            .parse()
            .unwrap();
        let lk = legacy.field_map(Field::K).unwrap();
        assert_eq!(row_unit_bytes(&lk, &lk, 0, 0), 0);
        assert_eq!((write_lane_bytes(&k, 0), write_lane_bytes(&k, 8)), (16, 8));
        assert_eq!(write_lane_bytes(&k, 4), 0);
        assert_eq!(write_lane_bytes(&lk, 0), 0);
        // D=2 f16 rows are 4 bytes: one element per lane.
        let short: KvCacheLayout = "kv B=3 N=16 H=4 D=2 dtype=f16 order=NHD".parse().unwrap();
        assert_eq!(write_lane_bytes(&short.field_map(Field::K).unwrap(), 0), 0);
        assert_eq!((row_lanes(8, 2, 16), row_lanes(8, 2, 0)), (1, 8));
    }
}
